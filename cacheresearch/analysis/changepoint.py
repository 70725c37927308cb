"""Change points of a trace's hit rate: when it collapses, and which first-block keys changed there.

"Why did my hit rate drop?" has a few usual answers, and each leaves its mark on the block keys:

* a **deploy** (a new system prompt, a new model or version): from time T on, requests start with a
  first-block key never seen before, shared by many requests (:func:`~cacheresearch.workload.keys.rekey_after`
  injects one);
* a **volatile token at the top** (a timestamp, a request id): the first-block key is new and unique
  to each request;
* **reordered or changed content after the head** (tool definitions, documents): the first-block key
  is old, and the keys diverge at a later block.

Procedure (plain NumPy, exact, no model):

1. Per-request hits: by default the *potential* hits, :func:`potential_hits` (one unbounded cache:
   the leading keys already seen in an earlier request), which isolates content changes from cache
   pressure; any per-request hit tokens (an engine run) can be given instead.
2. Windows of ``window_s`` seconds; a window's token hit rate is its hit tokens / input tokens.
3. A window is *collapsed* when its hit rate is more than ``drop`` below the baseline: the median of
   the last ``baseline_windows`` non-collapsed windows with requests (no verdict before there are any).
   Consecutive collapsed windows form an *episode*.
4. For each episode, over its requests: ``new_first_share`` (first-block key unseen before the episode),
   ``unique_first_share`` (first-block key that occurs in no other request of the trace),
   ``top_new_first_share`` (the most common new first-block key's share), ``new_first_keys`` (distinct
   new first-block keys, up to 5 listed), and, for requests whose first block is old, the median
   ``divergence_block`` (first block whose key was unseen before the episode). The ``cause`` label
   follows from them (module list above). ``recovery_windows``: windows after the episode until the hit
   rate is back within ``drop`` of the baseline (null if never).
"""

from __future__ import annotations

import numpy as np

from cacheresearch.metrics.core import hit_tokens

__all__ = ["potential_hits", "window_hit_rates", "change_points", "format_report"]


def potential_hits(w) -> np.ndarray:
    """Hit tokens per request in one unbounded cache: the leading run of the request's keys that
    occur in an earlier request (exact; int64 [N], capped at the input tokens)."""
    n = w.n_requests
    nb = w.n_blocks
    if w.total_blocks == 0:
        return np.zeros(n, np.int64)
    dense = w.dense_ids()
    req = np.repeat(np.arange(n), nb)
    first = np.full(int(dense.max()) + 1, n, np.int64)
    np.minimum.at(first, dense, req)
    seen = first[dense] < req
    pos = np.arange(w.total_blocks) - np.repeat(w.offsets[:-1], nb)
    unseen_pos = np.where(seen, np.iinfo(np.int64).max, pos)
    lead = np.full(n, 0, np.int64)
    has = nb > 0
    starts = w.offsets[:-1][has]
    lead_has = np.minimum.reduceat(unseen_pos, starts)
    lead[has] = np.minimum(lead_has, nb[has])
    return hit_tokens(np.asarray(lead, np.int64), w.block_tokens, w.input_tokens, np).astype(np.int64)


def window_hit_rates(w, hit_tokens, window_s: float):
    """``(start_s [W], hit_rate [W], requests [W], window index per request [N])`` over windows of
    ``window_s`` seconds from the first arrival (hit rate NaN where a window has no input)."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    hit = np.asarray(hit_tokens, np.float64)
    if hit.shape != (w.n_requests,):
        raise ValueError(f"hit_tokens must have shape ({w.n_requests},), got {hit.shape}")
    t = (w.arrival_ms - (w.arrival_ms[0] if w.n_requests else 0)) / 1000.0
    win = (t // window_s).astype(np.int64)
    W = int(win.max()) + 1 if w.n_requests else 0
    h = np.bincount(win, weights=hit, minlength=W)
    inp = np.bincount(win, weights=w.input_tokens.astype(np.float64), minlength=W)
    cnt = np.bincount(win, minlength=W)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(inp > 0, h / inp, np.nan)
    start = np.arange(W) * window_s + (w.arrival_ms[0] / 1000.0 if w.n_requests else 0.0)
    return start, rate, cnt, win


def change_points(w, hit_tokens=None, *, window_s: float = 60.0, drop: float = 0.2, baseline_windows: int = 5) -> dict:
    """The change-point report (module docstring) as a JSON-ready dict."""
    if not 0 < drop < 1:
        raise ValueError(f"drop must be in (0, 1), got {drop}")
    if baseline_windows < 1:
        raise ValueError(f"baseline_windows must be >= 1, got {baseline_windows}")
    hit = potential_hits(w) if hit_tokens is None else np.asarray(hit_tokens)
    start, rate, cnt, win = window_hit_rates(w, hit, window_s)
    W = start.shape[0]
    base = np.full(W, np.nan)
    flag = np.zeros(W, dtype=bool)
    good: list[float] = []
    for k in range(W):
        if not np.isfinite(rate[k]):
            continue
        if good:
            base[k] = float(np.median(good[-baseline_windows:]))
            flag[k] = rate[k] < base[k] - drop
        if not flag[k]:
            good.append(float(rate[k]))
    # episodes: runs of flagged windows (empty windows in between do not break a run)
    episodes = []
    k = 0
    while k < W:
        if not flag[k]:
            k += 1
            continue
        a = k
        b = k
        while b + 1 < W and (flag[b + 1] or not np.isfinite(rate[b + 1])):
            b += 1
        while not flag[b]:
            b -= 1
        episodes.append((a, b))
        k = b + 1
    n = w.n_requests
    nb = w.n_blocks
    dense = w.dense_ids() if w.total_blocks else np.zeros(0, np.int64)
    req_of = np.repeat(np.arange(n), nb)
    first_req = np.full(int(dense.max()) + 1 if dense.size else 0, n, np.int64)
    if dense.size:
        np.minimum.at(first_req, dense, req_of)
    occurrences = np.bincount(dense[w.offsets[:-1][nb > 0]], minlength=first_req.shape[0]) if dense.size else None
    out_eps = []
    for a, b in episodes:
        reqs = np.nonzero((win >= a) & (win <= b) & (nb > 0))[0]
        r0 = int(reqs.min()) if reqs.size else 0
        e = dict(start_s=float(start[a]), end_s=float(start[b] + window_s), windows=int(b - a + 1),
                 requests=int(reqs.size), baseline_hit_rate=float(base[a]),
                 hit_rate=float(np.nansum(np.bincount(win, weights=hit.astype(np.float64), minlength=W)[a:b + 1])
                                / max(np.bincount(win, weights=w.input_tokens.astype(np.float64),
                                                  minlength=W)[a:b + 1].sum(), 1.0)))
        if reqs.size:
            fk = dense[w.offsets[reqs]]  # first-block key of each request
            new = first_req[fk] >= r0
            e["new_first_share"] = float(new.mean())
            e["unique_first_share"] = float(np.mean(occurrences[fk] == 1))
            nk, nc = np.unique(fk[new], return_counts=True)
            e["new_first_keys"] = int(nk.size)
            e["top_new_first_share"] = float(nc.max() / reqs.size) if nk.size else 0.0
            keys = w.keys[w.offsets[reqs]]
            top = nk[np.argsort(-nc)][:5]
            key_of = {int(d): int(k) for d, k in zip(fk, keys)}
            e["top_new_first_block_keys"] = [f"{key_of[int(d)]:016x}" for d in top]
            depth = []
            for i in reqs[~new][:2000]:
                ks = dense[w.offsets[i]: w.offsets[i + 1]]
                u = np.nonzero(first_req[ks] >= r0)[0]
                if u.size:
                    depth.append(int(u[0]))
            e["divergence_block"] = float(np.median(depth)) if depth else None
            if e["new_first_share"] >= 0.5 and e["unique_first_share"] >= 0.5:
                e["cause"] = ("volatile first block: a new, unique first-block key per request "
                              "(timestamp or id at the top)")
            elif e["new_first_share"] >= 0.5:
                e["cause"] = ("deploy: new first-block keys shared across requests (new system prompt, model or "
                              "version)")
            elif e["divergence_block"] is not None:
                e["cause"] = (f"first block unchanged; keys diverge at block {e['divergence_block']:g} (content "
                              "reordered or changed after the head, e.g. tools or documents)")
            else:
                e["cause"] = "no new keys: the drop comes from cache pressure or routing, not content"
        rec = None
        for k2 in range(b + 1, W):
            if np.isfinite(rate[k2]) and rate[k2] >= base[a] - drop:
                rec = k2 - b
                break
        e["recovery_windows"] = rec
        out_eps.append(e)
    return dict(window_s=float(window_s), drop=float(drop), baseline_windows=int(baseline_windows),
                n_requests=int(n), overall_hit_rate=float(hit.sum() / max(w.input_tokens.sum(), 1)),
                windows=dict(start_s=start.tolist(), hit_rate=[None if not np.isfinite(x) else float(x) for x in rate],
                             requests=cnt.tolist(), collapsed=flag.tolist()),
                episodes=out_eps)


def format_report(rep: dict) -> str:
    """The report as text."""
    lines = [f"{rep['n_requests']} requests, overall token hit rate {100 * rep['overall_hit_rate']:.1f}%; windows of "
             f"{rep['window_s']:g} s; a window collapses when its hit rate falls {100 * rep['drop']:.0f} points below "
             f"the median of the last {rep['baseline_windows']} normal windows"]
    if not rep["episodes"]:
        lines.append("no collapse found")
    for i, e in enumerate(rep["episodes"]):
        lines.append(f"episode {i}: {e['start_s']:.0f}-{e['end_s']:.0f} s ({e['windows']} windows, {e['requests']} "
                     f"requests): hit rate {100 * e['hit_rate']:.1f}% vs baseline {100 * e['baseline_hit_rate']:.1f}%")
        if "cause" in e:
            lines.append(f"  new first-block key: {100 * e['new_first_share']:.0f}% of requests ({e['new_first_keys']} "
                         f"distinct, the commonest on {100 * e['top_new_first_share']:.0f}%); unique per request: "
                         f"{100 * e['unique_first_share']:.0f}%"
                         + (f"; old heads diverge at block {e['divergence_block']:g}"
                            if e["divergence_block"] is not None else ""))
            if e["top_new_first_block_keys"]:
                lines.append(f"  new first-block keys: {', '.join(e['top_new_first_block_keys'])}")
            lines.append(f"  cause: {e['cause']}")
        lines.append("  recovery: " + (f"{e['recovery_windows']} windows after" if e["recovery_windows"] is not None
                                       else "not within the trace"))
    return "\n".join(lines)

"""Agent session structure read off the prefix tree of a trace that carries no session ids.

A coding agent resends its whole growing context on every request (system prompt and tools, then each
turn, tool call and tool result appended), so the requests of one *context* form one path-like tree
under their first block. :func:`agent_structure` reads, from :func:`cacheresearch.fit.structure.request_structure`
and the arrival times alone:

* **growth**: the net blocks each step that is not a compaction adds to its parent's context (a
  trace whose partial last block has an id of its own drops that block and appends more), with a
  fitted count law of the positive ones and the mean;
* **compactions**: a step that keeps at most half of its parent's blocks (the context was rewritten:
  the old blocks stop matching); the rate per step and the share of the parent's blocks kept;
* **subagents**: a context whose whole life (first to last request) lies inside one gap of another
  context that started earlier (the parent waits on its tool call while the subagent runs), starting
  at most the median gap between consecutive requests of a context (a tool round trip) after the
  parent's request; several subagents started in one gap run in parallel, interleaved, and the
  parent's next request comes at most that median after the *last* of them ends; the parent is the
  candidate with the latest request before the subagent's first. Sessions are the contexts joined
  to their parents (transitively). A subagent that runs beside a parent which keeps sending
  requests is not nested in one gap, and timing alone cannot tell it from an independent session
  running at the same time: it is read as a session of its own;
* **think / tool gaps**: the gaps between consecutive requests of a context, a lognormal mixture
  whose number of components is chosen by AIC (short tool round trips beside long think or idle
  times), and the sessions' durations, context lengths and requests.

The rules are stated, not tuned: "at most half kept" for a compaction, "nested in one gap" for a
subagent (a subagent that outlives its parent's next request is read as a session of its own).
:func:`generate_agent_sessions` draws a workload with known growth law, compaction rate and
subagent share, on which the recovery tests check these rules. Plain NumPy; no I/O.
"""

from __future__ import annotations

import numpy as np

from cacheresearch.fit import laws as L
from cacheresearch.fit.structure import Structure, request_structure
from cacheresearch.workload import Workload

__all__ = ["agent_structure", "generate_agent_sessions", "COMPACTION_KEEP"]

COMPACTION_KEEP = 0.5  # a step that keeps at most this share of its parent's blocks is a compaction


def _context_times(t: np.ndarray, ctx: np.ndarray):
    """Per context its sorted request times, as one array sorted by (context, time) and its offsets."""
    n_ctx = int(ctx.max()) + 1 if ctx.size else 0
    o = np.lexsort((t, ctx))
    ts = t[o].astype(np.float64)
    start = np.searchsorted(ctx[o], np.arange(n_ctx + 1))
    return ts, start, n_ctx


def _subagent_parents(t: np.ndarray, ctx: np.ndarray, slack_s: float, *, chunk_pairs: int = 4_000_000,
                      max_pairs: int = 200_000_000) -> np.ndarray:
    """Parent context of each context (-1: none) by the nesting rule (module docstring); the same
    decisions as :func:`_subagent_parents_reference`, in time linear in the (gap, context) candidate
    pairs (each gap of a context is an interval between two of its requests; a context is a candidate
    child of the gaps that start at most ``slack_s`` before its first request and end after its last).

    A context ``B`` is a candidate child of an earlier context ``A`` at ``A``'s request ``j`` when it
    starts at most ``slack_s`` after that request and ends before ``A``'s next one (it lives inside
    one gap of ``A``). The children of one gap may run in parallel (an agent that starts several
    subagents at once waits for all of them): the gap's wait is checked on the group, so the last of
    its candidate children must end at most ``slack_s`` before ``A``'s next request. Of several
    parents the one with the latest request before ``B``'s first wins (ties: the parent whose gap was
    first a candidate of a lower-numbered context, then the lower-numbered parent)."""
    ts, start, n_ctx = _context_times(t, ctx)
    par = np.full(n_ctx, -1, np.int64)
    if n_ctx < 2:
        return par
    first, last = ts[start[:-1]], ts[start[1:] - 1]
    cnt = np.diff(start)
    owner = np.repeat(np.arange(n_ctx), cnt)
    g = np.nonzero(np.r_[owner[1:] == owner[:-1], False])[0]  # gap g: from request g to g + 1
    gs, ge, ga = ts[g], ts[g + 1], owner[g]
    o = np.argsort(gs, kind="stable")
    gs, ge, ga, gid = gs[o], ge[o], ga[o], np.arange(g.size)[o]
    lo = np.searchsorted(gs, first - slack_s, side="left")
    hi = np.searchsorted(gs, first, side="right")
    k_all = hi - lo
    if int(k_all.sum()) > max_pairs:
        raise ValueError(f"subagent search: {int(k_all.sum()):,} candidate (gap, context) pairs (contexts overlap "
                         f"too densely for the nesting rule; more than {max_pairs:,})")
    if int(k_all.sum()) == 0:
        return par
    step = max(1, int(chunk_pairs))
    cuts = np.searchsorted(np.cumsum(k_all), np.arange(step, int(k_all.sum()) + step, step))
    pa, pb = [], []
    for b0, b1 in zip(np.r_[0, cuts[:-1] + 1], np.minimum(cuts + 1, n_ctx)):  # chunks of about chunk_pairs pairs
        b = np.arange(b0, b1)
        k = k_all[b]
        bb = np.repeat(b, k)
        gg = np.repeat(lo[b], k) + (np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k))
        ok = (first[ga[gg]] < first[bb]) & (last[bb] < ge[gg])
        pa.append(gg[ok])
        pb.append(bb[ok])
    pg, pb = np.concatenate(pa), np.concatenate(pb)
    if pg.size == 0:
        return par
    # a gap's group waits: its last candidate child ends at most slack_s before the gap's end
    kid_last = np.full(gs.size, -np.inf)
    np.maximum.at(kid_last, pg, last[pb])
    keep = ge[pg] - kid_last[pg] <= slack_s
    pg, pb = pg[keep], pb[keep]
    if pg.size == 0:
        return par
    first_b = np.full(gs.size, n_ctx)
    np.minimum.at(first_b, pg, pb)  # the reference's insertion order of a gap: its lowest candidate child
    # per child: the latest gap start wins; ties: lowest (first child, parent, gap index)
    sel = np.lexsort((-gid[pg], -ga[pg], -first_b[pg], gs[pg], pb))
    pb_s = pb[sel]
    lastof = np.r_[pb_s[1:] != pb_s[:-1], True]
    par[pb_s[lastof]] = ga[pg[sel][lastof]]
    return par


def _subagent_parents_reference(t: np.ndarray, ctx: np.ndarray, slack_s: float) -> np.ndarray:
    """The plain-Python statement of :func:`_subagent_parents` (O(contexts^2)): the oracle its test
    compares with. Parent context of each context (-1: none) by the nesting rule (module docstring).

    A context ``B`` is a candidate child of an earlier context ``A`` at ``A``'s request ``j`` when it
    starts at most ``slack_s`` after that request and ends before ``A``'s next one (it lives inside
    one gap of ``A``). The children of one gap may run in parallel (an agent that starts several
    subagents at once waits for all of them): the gap's wait is checked on the group, so the last of
    its candidate children must end at most ``slack_s`` before ``A``'s next request. Of several
    parents the one with the latest request before ``B``'s first wins."""
    n_ctx = int(ctx.max()) + 1 if ctx.size else 0
    times = [np.sort(t[ctx == c]) for c in range(n_ctx)]
    first = np.array([x[0] for x in times]) if n_ctx else np.zeros(0)
    last = np.array([x[-1] for x in times]) if n_ctx else np.zeros(0)
    cand: dict[tuple[int, int], list[int]] = {}  # (parent, its request j) -> children starting in gap j
    for b in range(n_ctx):
        for a in np.nonzero(first < first[b])[0]:
            ta = times[a]
            j = int(np.searchsorted(ta, first[b], side="right")) - 1  # A's latest request at or before B's start
            if 0 <= j < ta.size - 1 and first[b] - ta[j] <= slack_s and last[b] < ta[j + 1]:
                cand.setdefault((int(a), j), []).append(b)
    par = np.full(n_ctx, -1, np.int64)
    best_t = np.full(n_ctx, -np.inf)
    for (a, j), kids in cand.items():
        ta = times[a]
        if ta[j + 1] - max(last[k] for k in kids) > slack_s:
            continue  # the parent did not wait on these children
        for b in kids:
            if ta[j] > best_t[b]:
                par[b], best_t[b] = a, ta[j]
    return par


def _session_durations(t: np.ndarray, sess: np.ndarray) -> list:
    """10th / 50th / 90th percentiles of the sessions' spans (first to last request), in seconds."""
    _, s = np.unique(sess, return_inverse=True)
    s = s.reshape(-1)
    hi = np.full(int(s.max()) + 1, -np.inf)
    lo = np.full(hi.size, np.inf)
    np.maximum.at(hi, s, t)
    np.minimum.at(lo, s, t)
    return [float(x) for x in np.quantile(hi - lo, [0.1, 0.5, 0.9])]


def agent_structure(w: Workload, st: Structure | None = None) -> dict:
    """The agent structure of a trace (module docstring) as a plain dict of figures and laws."""
    st = request_structure(w) if st is None else st
    t = w.arrival_ms / 1000.0
    ctx = st.session
    n_ctx = int(ctx.max()) + 1 if ctx.size else 0
    nb = w.n_blocks.astype(np.int64)
    stp = st.parent >= 0
    pb = nb[np.maximum(st.parent, 0)]
    kept = np.where(stp, st.shared / np.maximum(pb, 1), 1.0)
    compaction = stp & (kept <= COMPACTION_KEEP)
    growth = (nb - pb)[stp & ~compaction]  # net blocks added by a step that is not a compaction
    ts_c, start_c, _ = _context_times(t, ctx)
    same = np.zeros(max(ts_c.size - 1, 0), bool)
    if ts_c.size > 1:
        same[:] = True
        same[start_c[1:-1] - 1] = False  # a context's last request to the next context's first: no gap
    g = np.diff(ts_c)[same] if ts_c.size > 1 else np.zeros(0)
    slack = float(np.median(g)) if g.size else 0.0
    par = _subagent_parents(t, ctx, slack)
    # sessions: contexts joined to their parents
    top = np.arange(n_ctx)
    for _ in range(n_ctx):
        nxt = np.where(par[top] >= 0, par[top], top)
        if np.array_equal(nxt, top):
            break
        top = nxt
    gpos = np.maximum(g, 1e-3)
    out = {
        "contexts": n_ctx,
        "sessions": int(np.unique(top).size),
        "subagent_share": float(np.mean(par >= 0)) if n_ctx else 0.0,
        "subagent_parent": par.tolist(),
        "steps": int(stp.sum()),
        "compaction_rate": float(compaction.sum() / max(int(stp.sum()), 1)),
        "compactions": int(compaction.sum()),
        "compaction_kept_share_median": float(np.median(kept[compaction])) if compaction.any() else None,
        "subagent_slack_s": slack,
        "growing_step_share": float(np.mean(growth > 0)) if growth.size else 0.0,
        "growth_blocks_mean": float(growth.mean()) if growth.size else 0.0,
        "growth_blocks_p50": float(np.median(growth)) if growth.size else 0.0,
        "growth": L.fit_count(growth[growth > 0]).to_dict() if np.sum(growth > 0) >= 2 else None,
        "context_blocks_p50": float(np.median(nb)) if nb.size else 0.0,
        "context_blocks_max": int(nb.max()) if nb.size else 0,
        "requests_per_session_median": float(np.median(np.bincount(top[ctx]))) if n_ctx else 0.0,
        "session_duration_s": _session_durations(t, top[ctx]) if n_ctx else [],
        "gap_mixture": L.fit_lognorm_mix(gpos, 3).to_dict() if gpos.size >= 2 else None,
    }
    return out


def generate_agent_sessions(n_sessions: int, *, seed: int = 0, block_tokens: int = 64, system_blocks: int = 40,
                            growth_p: float = 0.05, compaction_rate: float = 0.03, summary_blocks: int = 20,
                            subagent_share: float = 0.3, requests_mean: float = 40.0, tool_s: float = 3.0,
                            think_s: float = 60.0, think_share: float = 0.3, start_every_s: float = 120.0,
                            parallel: int = 1) -> Workload:
    """Agent sessions with known laws: each context starts with ``system_blocks`` of its own, then each
    step appends a geometric(``growth_p``) number of blocks (mean ``1 / growth_p``); with probability
    ``compaction_rate`` a step is a compaction instead (keeps the first ``system_blocks // 2`` blocks,
    then ``summary_blocks`` new ones); gaps are exponential, ``tool_s`` or, with ``think_share``,
    ``think_s``. A session is a main context (geometric number of requests, mean ``requests_mean``)
    and, after a uniformly chosen request, with probability ``subagent_share / (parallel (1 -
    subagent_share))`` (at most 1), ``parallel`` subagent contexts (each a geometric number of
    requests, mean 10) that start 0.5 s (plus 0.1 s per sibling) after that request and run at once,
    their requests interleaved; the main context's next request comes 0.5 s after the last of them
    ends (so a share ``subagent_share`` of all contexts are subagents on average)."""
    rng = np.random.default_rng(seed)
    nxt = [1]

    def fresh(k):
        ids = np.arange(nxt[0], nxt[0] + k, dtype=np.uint64)
        nxt[0] += k
        return ids

    rows = []

    def run_context(t0, n_req):
        ks = fresh(system_blocks)
        tt = t0
        times = []
        for j in range(n_req):
            if j > 0:
                if rng.random() < compaction_rate:
                    ks = np.concatenate([ks[: system_blocks // 2], fresh(summary_blocks)])
                else:
                    ks = np.concatenate([ks, fresh(int(rng.geometric(growth_p)))])
                g = rng.exponential(think_s if rng.random() < think_share else tool_s)
                tt += g
            rows.append((tt, ks.copy()))
            times.append(tt)
        return times

    k_par = max(int(parallel), 1)
    p_sub = min(subagent_share / (k_par * (1.0 - subagent_share)), 1.0) if subagent_share < 1 else 1.0
    for s in range(n_sessions):
        t0 = s * start_every_s
        n_main = max(int(rng.geometric(1.0 / requests_mean)), 2)
        has_sub = rng.random() < p_sub
        at = int(rng.integers(0, n_main - 1))
        # main context, with a pause after request `at` that holds the subagent
        ks = fresh(system_blocks)
        tt = t0
        waited = False
        for j in range(n_main):
            if j > 0:
                if rng.random() < compaction_rate:
                    ks = np.concatenate([ks[: system_blocks // 2], fresh(summary_blocks)])
                else:
                    ks = np.concatenate([ks, fresh(int(rng.geometric(growth_p)))])
                if not waited:
                    tt += rng.exponential(think_s if rng.random() < think_share else tool_s)
                waited = False
            rows.append((tt, ks.copy()))
            if j == at and has_sub:  # the main context waits on its subagents (0.5 s each way)
                ends = [run_context(tt + 0.5 + 0.1 * c, max(int(rng.geometric(0.1)), 2))[-1] for c in range(k_par)]
                tt = max(ends) + 0.5
                waited = True
    rows.sort(key=lambda r: r[0])
    ms = np.round(np.array([r[0] for r in rows]) * 1000).astype(np.int64)
    keys = [r[1] for r in rows]
    inp = np.array([k.size * block_tokens for k in keys], dtype=np.int64)
    return Workload.from_lists(keys, block_tokens=block_tokens, arrival_ms=np.maximum.accumulate(ms),
                               input_tokens=inp, name="agent_sessions")

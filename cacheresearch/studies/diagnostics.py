"""Why did my hit rate drop? Studies of prompt layout, cache events and block granularity.

Shell-side (xarray, matplotlib); the engine (:func:`~cacheresearch.core.run.simulate_cells`) and the
workload generators do the simulation. ``python -m cacheresearch.sweep experiment=NAME``:

``volatile``     hit rate and cost against the position of a volatile token (a timestamp unique to
                 each request) in the seed's fleet prompt (system prompt, tenant document, user
                 suffix): at the top, after the system prompt, after the documents, at the end, or
                 none (:func:`~cacheresearch.workload.synthetic.fleet_workload` ``layout``). Under a
                 pricing preset, hit tokens are billed at the read price and missed tokens at the
                 write price.
``events``       hit-rate recovery after a cache event at ``event_s``: a model / version upgrade
                 (every later request keyed as the new version,
                 :func:`~cacheresearch.workload.keys.rekey_after`) or a replica restart (replica 0's
                 cache flushed: the ``restart_replica`` / ``restart_ms`` knobs), against no event; the
                 token hit rate per time window (``window_s``) is the recovery curve, and
                 ``recovery_s`` the time from the event to the first window whose hit rate is back
                 within ``tolerance`` of the same window without the event.
``granularity``  the hit tokens lost to block hashing against token-granular (radix, SGLang
                 ``page_size=1``) matching, by block size. Both use one unbounded cache, so only
                 the granularity differs: a request's token-granular hit is its longest common
                 prefix with any earlier prompt (computed exactly from prefix hashes of every token
                 position, 64-bit), its block hit that prefix rounded down to whole blocks; both are
                 capped at ``input - 1`` tokens (vLLM and SGLang recompute the last prompt token).
                 Synthetic workloads (their token ids are known) at every block size; a Mooncake
                 trace only has 512-token ``hash_ids``, so there the block hit is measured at 512
                 and coarser multiples (merging ids), token-granular matching and finer blocks are
                 not measurable (NaN), and ``lost_upper_bound`` bounds what token matching could add
                 (at most ``block - 1`` tokens per request, and never past ``input - 1``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import xarray as xr

from cacheresearch.analysis.pricing import preset
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.studies import base as SB
from cacheresearch.studies.base import Cells, Study, StudyError
from cacheresearch.workload.keys import rekey_after
from cacheresearch.workload.synthetic import fleet_parts, fleet_workload

__all__ = ["VOLATILE_DEFAULTS", "EVENTS_DEFAULTS", "GRANULARITY_DEFAULTS", "volatile_study", "events_study",
           "granularity_study", "token_lcp", "block_hits", "STUDIES"]

DAY = 86_400.0
POSITIONS = {"none": "stable", "top": "timestamp_top", "after_system": "timestamp_after_system",
             "after_documents": "timestamp_after_docs", "end": "timestamp_end"}


def _err(msg):
    return StudyError(msg)


def _run(streams, idx, params, seeds, R):
    return (yield Cells(streams, idx, params, seeds, max_replicas=R))


def _fleet_args(c: dict) -> dict:
    keys = ("n_tenants", "system_tokens", "doc_tokens", "user_tokens", "n_requests", "block_tokens", "rate_per_s",
            "output_tokens")
    bad = sorted(set(c) - set(keys))
    if bad:
        raise _err(f"study.fleet: unknown keys {bad}; known: {list(keys)}")
    return dict(c)


# ------------------------------------------------------------------------------ volatile
VOLATILE_DEFAULTS = dict(
    fleet=dict(n_tenants=8, system_tokens=1200, doc_tokens=800, user_tokens=60, n_requests=2000, block_tokens=16,
               rate_per_s=4.0, output_tokens=100),
    positions=["none", "top", "after_system", "after_documents", "end"],
    routers=["random", "prefix_hash"],
    replicas=4,
    capacity_blocks=2000,
    latency="h100_8b",
    pricing="anthropic_5m",
)


def volatile_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = SB.study_cfg(cfg, VOLATILE_DEFAULTS)
    fl = _fleet_args(c["fleet"])
    pos = list(c["positions"])
    bad = [p for p in pos if p not in POSITIONS]
    if bad or not pos:
        raise _err(f"study.positions: unknown {bad}; choose from {list(POSITIONS)}")
    routers = list(c["routers"])
    seeds = SB.seeds(cfg)
    try:
        pr = preset(str(c["pricing"]))
    except ValueError as e:
        raise _err(f"study.pricing: {e}") from None
    R = int(c["replicas"])
    bt = int(fl["block_tokens"])
    streams, meta = [], []
    for p in pos:
        for sd in seeds:
            try:
                w = fleet_workload(**fl, layout=POSITIONS[p], seed=sd)
            except ValueError as e:
                raise _err(f"study.fleet: {e}") from None
            streams.append(compile_stream(w))
            span = max((w.arrival_ms[-1] - w.arrival_ms[0]) / 1000.0, 1.0)
            meta.append(dict(n=w.n_requests, inp=float(w.input_tokens.sum()), span=span))
    try:
        params = [make_params("lru", capacity_blocks=int(c["capacity_blocks"]), replicas=R, router=rt,
                              prefix_blocks=(int(fl["system_tokens"]) + int(fl["doc_tokens"])) // bt,
                              latency=str(c["latency"])) for rt in routers]
    except ValueError as e:
        raise _err(f"study: {e}") from None
    cells = [(k, j) for k in range(len(streams)) for j in range(len(routers))]
    ts = time.perf_counter()
    m = yield from _run(streams, [k for k, _ in cells], [params[j] for _, j in cells], [seeds[k % len(seeds)] for k,
                                                                                        _ in cells], R)
    t_sim = time.perf_counter() - ts
    shape = (len(pos), len(seeds), len(routers))
    names = ("token_hit_rate", "cost_multiplier", "usd_per_day", "ttft_p50_s", "ttft_p99_s")
    out = {v: np.zeros(shape) for v in names}
    for g, (k, j) in enumerate(cells):
        ip, isd = divmod(k, len(seeds))
        mt = meta[k]
        hit = float(np.asarray(m.hit_tokens[g][: mt["n"]], np.int64).sum())
        h = hit / mt["inp"]
        ix = (ip, isd, j)
        out["token_hit_rate"][ix] = h
        out["cost_multiplier"][ix] = h * pr.read_multiplier + (1 - h) * pr.write_multiplier
        out["usd_per_day"][ix] = (pr.base_per_mtok / 1e6 * (hit * pr.read_multiplier + (mt["inp"] - hit)
                                  * pr.write_multiplier) * DAY / mt["span"])
        out["ttft_p50_s"][ix] = float(np.asarray(m.ttft_p50_ms[g])) / 1000.0
        out["ttft_p99_s"][ix] = float(np.asarray(m.ttft_p99_ms[g])) / 1000.0
    ds = xr.Dataset({v: (("position", "seed", "router"), a) for v, a in out.items()},
                    coords={"position": pos, "seed": seeds, "router": routers})
    SB.doc(ds, {
        "token_hit_rate": ("token hit rate", "1"),
        "cost_multiplier": (f"input cost relative to uncached under {pr.name}: h r + (1 - h) w", "1"),
        "usd_per_day": (f"input cost per day under {pr.name} (hits at the read price, misses at the write price)",
                        "USD/day"),
        "ttft_p50_s": ("time to first token, median", "s"), "ttft_p99_s": ("time to first token, p99", "s"),
    })
    ds["position"].attrs["long_name"] = "where the volatile token sits (none: no volatile token)"
    ds.attrs.update(SB.common_attrs(cfg, "volatile", t0, dict(
        fleet=json.dumps(fl), replicas=R, capacity_blocks=int(c["capacity_blocks"]), pricing=pr.name,
        pricing_source=pr.source, simulate_time_s=t_sim)))
    return ds


def summarize_volatile(ds) -> str:
    out = SB.header(ds)
    f = json.loads(ds.attrs["fleet"])
    out.append(f"fleet prompt: {f['system_tokens']}-token system prompt + {f['doc_tokens']}-token tenant document + "
               f"{f['user_tokens']} user tokens ({f['n_tenants']} tenants, {f['block_tokens']}-token blocks); "
               f"{ds.attrs['replicas']} replicas x {ds.attrs['capacity_blocks']} blocks; {ds.attrs['pricing']}")
    m = ds.mean("seed")
    rows = [["position", "router", "token hit rate", "x uncached", "$/day", "TTFT p50", "TTFT p99"]]
    for p in ds.position.values:
        for r in ds.router.values:
            x = m.sel(position=p, router=r)
            rows.append([str(p), str(r), SB.pct(float(x.token_hit_rate)), f"{float(x.cost_multiplier):.3f}",
                         SB.usd(float(x.usd_per_day)), f"{float(x.ttft_p50_s):.3f} s", f"{float(x.ttft_p99_s):.3f} s"])
    out += ["", SB.table(rows)]
    return "\n".join(out)


def plot_volatile(ds):
    fig = SB.fig(11, 4.2)
    ax1, ax2 = fig.subplots(1, 2)
    m = ds.mean("seed")
    xs = np.arange(ds.sizes["position"])
    for j, r in enumerate(ds.router.values):
        ax1.plot(xs, 100 * m.token_hit_rate.sel(router=r).values, "o-", color=f"C{j}", label=str(r))
        ax2.plot(xs, m.usd_per_day.sel(router=r).values, "o-", color=f"C{j}", label=str(r))
    for ax, lab in ((ax1, "token hit rate (%)"), (ax2, f"$ per day ({ds.attrs['pricing']})")):
        ax.set_xticks(xs, [str(p) for p in ds.position.values])
        ax.set_xlabel("position of the volatile token")
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax1.set_title("a timestamp in the prompt: everything after it misses")
    return fig


# ------------------------------------------------------------------------------ events
EVENTS_DEFAULTS = dict(
    fleet=dict(n_tenants=16, system_tokens=1200, doc_tokens=800, user_tokens=60, n_requests=4800, block_tokens=16,
               rate_per_s=4.0, output_tokens=100),
    events=["none", "version_upgrade", "replica_restart"],
    event_s=600.0,
    window_s=30.0,
    tolerance=0.02,
    routers=["random", "prefix_hash"],
    replicas=4,
    capacity_blocks=4000,
    latency="h100_8b",
)
EVENTS = ("none", "version_upgrade", "replica_restart")


def events_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = SB.study_cfg(cfg, EVENTS_DEFAULTS)
    fl = _fleet_args(c["fleet"])
    evs = list(c["events"])
    bad = [e for e in evs if e not in EVENTS]
    if bad or not evs:
        raise _err(f"study.events: unknown {bad}; choose from {list(EVENTS)}")
    if "none" not in evs:
        evs = ["none"] + evs  # the baseline of the recovery time
    routers = list(c["routers"])
    seeds = SB.seeds(cfg)
    R = int(c["replicas"])
    T = float(c["event_s"])
    win = float(c["window_s"])
    if win <= 0 or T <= 0:
        raise _err("study.window_s and study.event_s must be > 0")
    bt = int(fl["block_tokens"])
    streams, works = [], []
    for e in evs:
        for sd in seeds:
            try:
                w = fleet_workload(**fl, seed=sd)
            except ValueError as err:
                raise _err(f"study.fleet: {err}") from None
            if e == "version_upgrade":
                w = rekey_after(w, int(T * 1000))
            streams.append(compile_stream(w))
            works.append(w)
    horizon = max(float(w.arrival_ms[-1]) for w in works) / 1000.0
    if T >= horizon:
        raise _err(f"study.event_s={T} lies after the last arrival ({horizon:.0f} s): raise fleet.n_requests")
    cells, params = [], []
    for k, e in enumerate(k_e for k_e in evs for _ in seeds):
        for j, rt in enumerate(routers):
            ev = dict(restart_replica=0, restart_ms=int(T * 1000)) if e == "replica_restart" else {}
            try:
                params.append(make_params("lru", capacity_blocks=int(c["capacity_blocks"]), replicas=R, router=rt,
                                          prefix_blocks=(int(fl["system_tokens"]) + int(fl["doc_tokens"])) // bt,
                                          latency=str(c["latency"]), **ev))
            except ValueError as err:
                raise _err(f"study: {err}") from None
            cells.append((k, j))
    ts = time.perf_counter()
    m = yield from _run(streams, [k for k, _ in cells], params, [seeds[k % len(seeds)] for k, _ in cells], R)
    t_sim = time.perf_counter() - ts
    W = int(np.ceil(horizon / win))
    tw = (np.arange(W) + 0.5) * win
    curve = np.full((len(evs), len(seeds), len(routers), W), np.nan)
    for g, (k, j) in enumerate(cells):
        w = works[k]
        ie, isd = divmod(k, len(seeds))
        b = np.minimum((w.arrival_ms / 1000.0 // win).astype(np.int64), W - 1)
        hit = np.bincount(b, weights=np.asarray(m.hit_tokens[g][: w.n_requests], np.float64), minlength=W)
        inp = np.bincount(b, weights=w.input_tokens.astype(np.float64), minlength=W)
        with np.errstate(invalid="ignore", divide="ignore"):
            curve[ie, isd, j] = np.where(inp > 0, hit / inp, np.nan)
    mean = np.nanmean(curve, axis=1)  # [events, routers, W]
    rec = np.full((len(evs), len(routers)), np.nan)
    first_after = int(T // win)
    tol = float(c["tolerance"])
    for ie in range(len(evs)):
        for j in range(len(routers)):
            for k in range(first_after, W):
                if np.isfinite(mean[ie, j, k]) and mean[ie, j, k] >= mean[0, j, k] - tol:
                    rec[ie, j] = max((k + 1) * win - T, 0.0)
                    break
    rec[0] = 0.0  # the no-event run is the baseline
    ds = xr.Dataset(
        {"hit_rate_window": (("event", "seed", "router", "time_s"), curve),
         "hit_rate_window_mean": (("event", "router", "time_s"), mean),
         "recovery_s": (("event", "router"), rec),
         "hit_rate_after_event": (("event", "router"), np.nanmean(mean[:, :, first_after:], axis=-1)),
         "hit_rate_before_event": (("event", "router"), np.nanmean(mean[:, :, :first_after], axis=-1))},
        coords={"event": evs, "seed": seeds, "router": routers, "time_s": tw})
    SB.doc(ds, {
        "hit_rate_window": ("token hit rate of the requests arriving in the window (the recovery curve)", "1"),
        "hit_rate_window_mean": ("token hit rate per window, mean over seeds", "1"),
        "recovery_s": (f"time from the event to the end of the first window whose hit rate is within {tol:g} of the "
                       "no-event run's (NaN: not within the run)", "s"),
        "hit_rate_after_event": ("token hit rate of the windows from the event on (mean over windows)", "1"),
        "hit_rate_before_event": ("token hit rate of the windows before the event (mean over windows)", "1"),
    })
    ds["time_s"].attrs.update(long_name="window centre", units="s")
    ds.attrs.update(SB.common_attrs(cfg, "events", t0, dict(
        fleet=json.dumps(fl), event_s=T, window_s=win, tolerance=tol, replicas=R,
        capacity_blocks=int(c["capacity_blocks"]), restart_replica=0, simulate_time_s=t_sim)))
    return ds


def summarize_events(ds) -> str:
    out = SB.header(ds)
    out.append(f"cache events at {ds.attrs['event_s']:g} s: a version upgrade re-keys every later request; a replica "
               f"restart flushes replica 0 ({ds.attrs['replicas']} replicas x {ds.attrs['capacity_blocks']} blocks); "
               f"windows of {ds.attrs['window_s']:g} s")
    rows = [["event", "router", "hit rate before", "after", "lowest window after", "recovery"]]
    k0 = int(ds.attrs["event_s"] // ds.attrs["window_s"])
    for e in ds.event.values:
        for r in ds.router.values:
            x = ds.sel(event=e, router=r)
            low = float(np.nanmin(x.hit_rate_window_mean.values[k0:]))
            rv = float(x.recovery_s)
            rows.append([str(e), str(r), SB.pct(float(x.hit_rate_before_event)), SB.pct(float(x.hit_rate_after_event)),
                         SB.pct(low), "n/a" if not np.isfinite(rv) else f"{rv:.0f} s"])
    out += ["", SB.table(rows)]
    return "\n".join(out)


def plot_events(ds):
    fig = SB.fig(11, 4.2)
    axes = fig.subplots(1, ds.sizes["router"], squeeze=False)[0]
    for j, r in enumerate(ds.router.values):
        ax = axes[j]
        for i, e in enumerate(ds.event.values):
            ax.plot(ds.time_s.values, 100 * ds.hit_rate_window_mean.sel(event=e, router=r).values, "-",
                    color=f"C{i}", label=str(e))
        ax.axvline(float(ds.attrs["event_s"]), color="k", ls=":", lw=0.8)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("token hit rate per window (%)")
        ax.set_title(f"recovery after a cache event, {r}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return fig


# ------------------------------------------------------------------------------ granularity
GRANULARITY_DEFAULTS = dict(
    block_sizes=[16, 32, 64, 256, 512],
    workloads=dict(
        fleet=dict(kind="fleet", n_tenants=8, system_tokens=1200, doc_tokens=800, user_tokens=60, n_requests=2000),
        fleet_odd=dict(kind="fleet", n_tenants=8, system_tokens=1000, doc_tokens=700, user_tokens=60,
                       n_requests=2000),
        chat=dict(kind="fleet", n_tenants=50, system_tokens=300, doc_tokens=450, user_tokens=120, n_requests=2000),
    ),
    trace_path=None,  # a Mooncake JSONL trace (512-token hash ids): measured at 512 and coarser
    trace_max_requests=None,
)


def token_lcp(prompts: list[np.ndarray]) -> np.ndarray:
    """Longest common prefix (tokens) of each prompt with any earlier prompt (exact up to 64-bit prefix-hash
    collisions): int64 [N]."""
    n = len(prompts)
    lens = np.asarray([len(p) for p in prompts], np.int64)
    L = int(lens.max(initial=0))
    if n == 0 or L == 0:
        return np.zeros(n, np.int64)
    tok = np.zeros((n, L), np.uint64)
    for i, p in enumerate(prompts):
        tok[i, : len(p)] = np.asarray(p, np.int64).astype(np.uint64)
    h = np.zeros((n, L), np.uint64)
    acc = np.full(n, 0x9E3779B97F4A7C15, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(L):
            acc = (acc ^ (tok[:, j] + np.uint64(0x632BE59BD9B4E019))) * np.uint64(0x100000001B3)
            acc = acc ^ (acc >> np.uint64(29))
            h[:, j] = acc
    valid = np.arange(L)[None, :] < lens[:, None]
    hv = h[valid]
    req = np.repeat(np.arange(n), lens)
    uniq, inv = np.unique(hv, return_inverse=True)
    first = np.full(uniq.shape[0], n, np.int64)
    np.minimum.at(first, inv, req)
    seen = first[inv] < req
    return np.bincount(req, weights=seen, minlength=n).astype(np.int64)  # prefix-closed: a count is the length


def block_hits(lcp_tokens, input_tokens, block: int) -> np.ndarray:
    """The block-granular hit of a token LCP: whole blocks, at most ``input - 1`` tokens (int64)."""
    lcp = np.minimum(np.asarray(lcp_tokens, np.int64), np.maximum(np.asarray(input_tokens, np.int64) - 1, 0))
    return (lcp // block) * block


def _fleet_prompts(spec: dict, seed: int):
    a = dict(spec)
    a.pop("kind")
    parts = fleet_parts(n_tenants=a["n_tenants"], system_tokens=a["system_tokens"], doc_tokens=a["doc_tokens"],
                         user_tokens=a["user_tokens"], n_requests=a["n_requests"], tenant_law="uniform", zipf_s=1.0,
                         layout="stable", rate_per_s=None, seed=seed, vocab_size=128_256)
    prompts = [np.concatenate([parts["system"], parts["docs"][t], parts["user"][i]])
               for i, t in enumerate(parts["tenant"])]
    return prompts


def _trace_rows(path: str, max_requests, blocks: list[int]):
    """Per block size: (hit tokens, token-level upper bound) on a Mooncake trace (512-token ids)."""
    from cacheresearch.workload.trace import load_mooncake  # noqa: PLC0415

    w = load_mooncake(path, block_tokens=512, max_requests=max_requests)
    inp = w.input_tokens.astype(np.int64)
    # leading hash ids already seen (ids name a block and its whole prefix): the 512-block LCP
    nb = w.n_blocks
    dense = w.dense_ids()
    req = np.repeat(np.arange(w.n_requests), nb)
    first = np.full(int(dense.max()) + 1, w.n_requests, np.int64)
    np.minimum.at(first, dense, req)
    seen = first[dense] < req
    pos = np.arange(w.total_blocks) - np.repeat(w.offsets[:-1], nb)
    unseen = np.where(seen, np.iinfo(np.int64).max, pos)
    lead = np.zeros(w.n_requests, np.int64)
    has = nb > 0
    lead[has] = np.minimum(np.minimum.reduceat(unseen, w.offsets[:-1][has]), nb[has])
    lcp512 = np.minimum(lead * 512, inp)  # the last id may stand for a partial block
    out = {}
    for B in blocks:
        if B % 512:
            out[B] = (np.nan, np.nan)
            continue
        hb = block_hits(lcp512, inp, B)
        ub = np.minimum(lcp512 + 511, np.maximum(inp - 1, 0))  # token matching can reach into the next id's block
        out[B] = (float(hb.sum()), float(ub.sum()))
    return out, float(inp.sum()), int(w.n_requests)


def granularity_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = SB.study_cfg(cfg, {**GRANULARITY_DEFAULTS, "workloads": {}})
    if not c["workloads"]:
        c["workloads"] = dict(GRANULARITY_DEFAULTS["workloads"])
    blocks = SB.positive_list("study.block_sizes", c["block_sizes"], integer=True)
    seeds = SB.seeds(cfg)
    names = list(c["workloads"])
    if c["trace_path"]:
        names.append("mooncake_trace")
    shape = (len(names), len(blocks))
    token_hit = np.full(len(names), np.nan)
    block_hit = np.full(shape, np.nan)
    upper = np.full(shape, np.nan)
    inputs = np.zeros(len(names))
    trace = None
    if c["trace_path"]:  # the trace read (and checked) before the synthetic workloads run
        p = Path(str(c["trace_path"]))
        if not p.is_file():
            raise _err(f"study.trace_path: file not found: {p}")
        try:
            trace = _trace_rows(str(p), c["trace_max_requests"], blocks)
        except ValueError as e:  # TraceError: file, line, field
            raise _err(f"study.trace_path: {e}") from None
    for i, nm in enumerate(names):
        if nm == "mooncake_trace":
            rows, inp, _ = trace
            inputs[i] = inp
            for j, B in enumerate(blocks):
                block_hit[i, j], upper[i, j] = rows[B]
            continue
        spec = dict(c["workloads"][nm])
        if spec.get("kind") != "fleet":
            raise _err(f"study.workloads.{nm}.kind must be 'fleet' (prompts built from the fleet scenario's parts)")
        th, bh, tot = 0.0, np.zeros(len(blocks)), 0.0
        for sd in seeds:
            try:
                prompts = _fleet_prompts(spec, sd)
            except (KeyError, TypeError, ValueError) as e:
                raise _err(f"study.workloads.{nm}: {e}") from None
            inp = np.asarray([len(q) for q in prompts], np.int64)
            lcp = token_lcp(prompts)
            tok = np.minimum(lcp, np.maximum(inp - 1, 0))
            th += float(tok.sum())
            tot += float(inp.sum())
            for j, B in enumerate(blocks):
                bh[j] += float(block_hits(lcp, inp, B).sum())
        token_hit[i], block_hit[i], inputs[i] = th, bh, tot
        upper[i] = th
    with np.errstate(invalid="ignore", divide="ignore"):
        lost = token_hit[:, None] - block_hit
        ds = xr.Dataset(
            {"token_hit_rate_radix": (("workload",), token_hit / inputs),
             "token_hit_rate_blocks": (("workload", "block_tokens"), block_hit / inputs[:, None]),
             "lost_tokens_share": (("workload", "block_tokens"), lost / token_hit[:, None]),
             "lost_upper_bound_share": (("workload", "block_tokens"), (upper - block_hit) / upper),
             "hit_tokens_blocks": (("workload", "block_tokens"), block_hit),
             "hit_tokens_radix": (("workload",), token_hit),
             "input_tokens": (("workload",), inputs)},
            coords={"workload": names, "block_tokens": blocks})
    SB.doc(ds, {
        "token_hit_rate_radix": ("token hit rate with token-granular (radix) matching, one unbounded cache", "1"),
        "token_hit_rate_blocks": ("token hit rate with block hashing (whole blocks only), one unbounded cache", "1"),
        "lost_tokens_share": ("share of the radix hit tokens that block hashing loses (NaN: not measurable)", "1"),
        "lost_upper_bound_share": ("trace: upper bound of that share (token matching adds < one block per request); "
                                   "synthetic: equal to lost_tokens_share", "1"),
        "hit_tokens_blocks": ("hit tokens with block hashing", "tokens"),
        "hit_tokens_radix": ("hit tokens with token-granular matching", "tokens"),
        "input_tokens": ("input tokens", "tokens"),
    })
    ds.attrs.update(SB.common_attrs(cfg, "granularity", t0, dict(
        workloads=json.dumps(c["workloads"]), trace_path=str(c["trace_path"]) if c["trace_path"] else "",
        seeds=len(seeds))))
    return ds


def summarize_granularity(ds) -> str:
    out = SB.header(ds)
    out.append("hit tokens lost to block hashing vs token-granular (radix) matching; one unbounded cache; both capped "
               "at input - 1 tokens")
    rows = [["workload", "radix"] + [f"B={int(b)}" for b in ds.block_tokens.values]]
    for w in ds.workload.values:
        x = ds.sel(workload=w)
        cells = []
        for b in ds.block_tokens.values:
            h = float(x.token_hit_rate_blocks.sel(block_tokens=b))
            lo = float(x.lost_tokens_share.sel(block_tokens=b))
            ub = float(x.lost_upper_bound_share.sel(block_tokens=b))
            if not np.isfinite(h):
                cells.append("n/m")
            elif np.isfinite(lo):
                cells.append(f"{SB.pct(h)} (-{SB.pct(lo)})")
            else:
                cells.append(f"{SB.pct(h)} (<= -{SB.pct(ub)})")
        rows.append([str(w), SB.pct(float(x.token_hit_rate_radix))] + cells)
    out += ["", SB.table(rows), "",
            "cells: block-hashed token hit rate (share of the radix hit lost); n/m = not measurable (a Mooncake trace "
            "has 512-token hash ids only: no tokens, no finer blocks); <= = upper bound"]
    return "\n".join(out)


def plot_granularity(ds):
    fig = SB.fig(7.5, 4.5)
    ax = fig.subplots()
    for i, w in enumerate(ds.workload.values):
        x = ds.sel(workload=w)
        y = 100 * x.lost_tokens_share.values
        if np.all(~np.isfinite(y)):
            y = 100 * x.lost_upper_bound_share.values
            ax.plot(ds.block_tokens.values, y, "v--", color=f"C{i}", label=f"{w} (upper bound)")
        else:
            ax.plot(ds.block_tokens.values, y, "o-", color=f"C{i}", label=str(w))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("radix hit tokens lost to block hashing (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


# ------------------------------------------------------------------------------ capacity
CAPACITY_DEFAULTS = dict(models=None, gpus=None, tps=[1, 2, 4, 8], kv_dtypes=["bf16", "fp8"],
                         gpu_memory_utilization=0.9, block_tokens=16)


def capacity_study(cfg) -> xr.Dataset:
    """KV blocks per replica for every (model, GPU, TP, KV dtype) preset (:mod:`cacheresearch.replica.hardware`)."""
    from cacheresearch.replica import hardware as hw  # noqa: PLC0415
    t0 = time.perf_counter()
    c = SB.study_cfg(cfg, CAPACITY_DEFAULTS)
    models = list(c["models"] or hw.MODELS)
    gpus = list(c["gpus"] or hw.GPUS)
    tps = SB.positive_list("study.tps", c["tps"], integer=True)
    dts = list(c["kv_dtypes"])
    bt = int(c["block_tokens"])
    shape = (len(models), len(gpus), len(tps), len(dts))
    blocks = np.full(shape, np.nan)
    per_tok = np.full((len(models), len(tps), len(dts)), np.nan)
    for i, mn in enumerate(models):
        for k, tp in enumerate(tps):
            for m_, dt in enumerate(dts):
                try:
                    per_tok[i, k, m_] = hw.kv_bytes_per_token(mn, kv_dtype=dt, tp=tp)
                except ValueError as e:
                    raise _err(f"study: {e}") from None
                for j, gn in enumerate(gpus):
                    try:
                        blocks[i, j, k, m_] = hw.kv_blocks(mn, gn, tp=tp, kv_dtype=dt, block_tokens=bt,
                                                           gpu_memory_utilization=float(c["gpu_memory_utilization"]))
                    except ValueError as e:
                        if "does not fit" not in str(e):
                            raise _err(f"study: {e}") from None
    ds = xr.Dataset({"kv_blocks": (("model", "gpu", "tp", "kv_dtype"), blocks),
                     "kv_tokens": (("model", "gpu", "tp", "kv_dtype"), blocks * bt),
                     "kv_bytes_per_token": (("model", "tp", "kv_dtype"), per_tok)},
                    coords={"model": models, "gpu": gpus, "tp": tps, "kv_dtype": dts})
    SB.doc(ds, {"kv_blocks": (f"KV blocks of {bt} tokens per replica (NaN: the weights do not fit)", "blocks"),
                "kv_tokens": ("KV tokens per replica", "tokens"),
                "kv_bytes_per_token": ("KV bytes per token on each GPU of the replica", "bytes")})
    ds.attrs.update(SB.common_attrs(cfg, "capacity", t0, dict(
        block_tokens=bt, gpu_memory_utilization=float(c["gpu_memory_utilization"]),
        model_sources=json.dumps({m: hw.MODELS[m].source for m in models if m in hw.MODELS}),
        gpu_sources=json.dumps({g: hw.GPUS[g].source for g in gpus if g in hw.GPUS}))))
    return ds


def summarize_capacity(ds) -> str:
    out = SB.header(ds)
    out.append(f"KV blocks of {ds.attrs['block_tokens']} tokens per replica at gpu_memory_utilization "
               f"{ds.attrs['gpu_memory_utilization']:g} (budget = utilisation x memory - weights / tp); '-' = the "
               "weights do not fit")
    rows = [["model", "gpu", "kv_dtype"] + [f"tp={int(t)}" for t in ds.tp.values]]
    for m in ds.model.values:
        for g in ds.gpu.values:
            for d in ds.kv_dtype.values:
                v = ds.kv_blocks.sel(model=m, gpu=g, kv_dtype=d).values
                rows.append([str(m), str(g), str(d)] + ["-" if not np.isfinite(x) else f"{int(x):,}" for x in v])
    out += ["", SB.table(rows)]
    return "\n".join(out)


def plot_capacity(ds):
    fig = SB.fig(8, 4.5)
    ax = fig.subplots()
    x = ds.kv_tokens.sel(tp=ds.tp.values[0])
    labels, vals = [], []
    for m in ds.model.values:
        for g in ds.gpu.values:
            for d in ds.kv_dtype.values:
                v = float(x.sel(model=m, gpu=g, kv_dtype=d))
                if np.isfinite(v):
                    labels.append(f"{m} {g} {d}")
                    vals.append(v / 1e3)
    ax.barh(np.arange(len(vals)), vals)
    ax.set_yticks(np.arange(len(vals)), labels, fontsize=5)
    ax.set_xlabel(f"KV tokens per replica (thousands), tp={int(ds.tp.values[0])}")
    return fig


STUDIES = [
    Study("volatile", volatile_study, summarize_volatile, plot_volatile, SB.defaults_class("VolatileDefaults",
                                                                                           VOLATILE_DEFAULTS)),
    Study("events", events_study, summarize_events, plot_events, SB.defaults_class("EventsDefaults", EVENTS_DEFAULTS)),
    Study("granularity", granularity_study, summarize_granularity, plot_granularity,
          SB.defaults_class("GranularityDefaults", GRANULARITY_DEFAULTS)),
    Study("capacity", capacity_study, summarize_capacity, plot_capacity, SB.defaults_class("CapacityDefaults",
                                                                                           CAPACITY_DEFAULTS)),
]

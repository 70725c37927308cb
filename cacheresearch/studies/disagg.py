"""``experiment=disagg``: aggregated serving vs prefill/decode disaggregation on the design scenario.

The design scenario (:func:`~cacheresearch.workload.synthetic.design_workload`: 200 tenants x 10,000-token
prefixes, 200 fresh and 200 output tokens a request, one hot tenant taking half) at Poisson rates
(``grid.rate_per_s``), served by a fleet of vllm replicas (:mod:`cacheresearch.fleet.disagg`, the numba vllm
backend: BLIS's step preset, the model preset's KV bytes per token) of ``replicas`` GPUs: aggregated (``agg``) or
split ``P:D`` (``grid.pd``) x the prefill router (``grid.router``; the decode pool routes by load) x prefix caching
on / off (off: every request's blocks salted with its index, so no block is shared and every prompt is computed,
as with vLLM's ``enable_prefix_caching=False``) x the KV link's bandwidth (``grid.link_gbps``). Per cell: TTFT
p50 / p99, ITL (mean and p99 of the per-request mean), SLO attainment and goodput (requests meeting both the TTFT
and the ITL SLO per second, and per GPU), GPUs used, the prefill side's token hit rate, the KV link's wait and
transfer time, preemptions, drops.
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr

from cacheresearch.fleet.disagg import DisaggCell, DisaggError, KvLink, pd_shape, simulate_disagg
from cacheresearch.studies import base as B
from cacheresearch.studies.base import Study, StudyError
from cacheresearch.workload import Workload
from cacheresearch.workload.synthetic import design_workload

__all__ = ["DISAGG_DEFAULTS", "disagg_study", "summarize_disagg", "plot_disagg", "salted", "STUDIES"]

DISAGG_DEFAULTS = dict(
    workload=dict(n_tenants=200, prefix_tokens=10_000, suffix_tokens=200, n_requests=2_000, hot_share=0.5,
                  output_tokens=200, block_tokens=16),
    replicas=8,
    decode_router="least_loaded",
    prefix_cache=["on", "off"],
    link_latency_us=10.0,
    link="prefill",
    model="llama3_8b",
    kv_dtype="bf16",
    vllm=dict(step_model="llama31_8b_h100_tp1", capacity_blocks=29_205, max_num_seqs=256,
              max_num_batched_tokens=8192, queue_slots=4096),
    slo=dict(ttft_ms=2_000, itl_ms=25),
    # a real trace in place of the design scenario (Mooncake or Bailian JSONL; None: the design scenario); each
    # rate_per_s replays it with its arrival times scaled to that mean rate (its burst shape kept)
    trace=dict(path=None, max_requests=2_000, block_tokens=None),
)

#: The study's grid (``grid.KEY=[...]`` on the command line): P:D splits ("agg": aggregated), the prefill
#: router (agg: the fleet's), the KV link's GB/s (agg ignores it), the arrival rate.
GRID = dict(pd=["agg", "1:7", "2:6", "4:4", "6:2"], router=["llmd_precise", "least_loaded"],
            link_gbps=[10.0, 50.0, 200.0], rate_per_s=[10.0, 20.0, 40.0])

_VARS = {
    "ttft_p50_ms": ("TTFT p50 (nearest rank, served requests)", "ms"),
    "ttft_p99_ms": ("TTFT p99", "ms"),
    "itl_mean_ms": ("ITL: mean over requests of (end - first token) / (output - 1)", "ms"),
    "itl_p99_ms": ("ITL: p99 over requests of the per-request mean", "ms"),
    "slo_attainment": ("share of requests with TTFT <= slo.ttft_ms and ITL <= slo.itl_ms", "1"),
    "goodput_rps": ("requests meeting both SLOs per second of the arrival span", "1/s"),
    "goodput_per_gpu": ("goodput per GPU", "1/s"),
    "gpus": ("GPUs (replicas) in the fleet", "1"),
    "prefill_hit_rate": ("token hit rate where prompts are computed (the prefill pool; agg: the fleet)", "1"),
    "link_wait_ms": ("mean time from prefill done to the KV landing (queue + transfer + latency)", "ms"),
    "preemptions": ("preemptions, both pools", "1"),
    "dropped": ("requests dropped, both pools", "1"),
}


def at_rate(wl: Workload, rate_per_s: float) -> Workload:
    """``wl`` with its arrival times scaled about its first so that its mean rate is ``rate_per_s``
    (requests - 1 over the span; gaps rounded to whole milliseconds, order kept)."""
    arr = wl.arrival_ms.astype(np.int64)
    span = int(arr[-1] - arr[0]) if arr.size > 1 else 0
    if span <= 0:
        raise StudyError("study.trace: the trace's requests all arrive at once; it has no rate to scale")
    f = (arr.size - 1) * 1000.0 / span / float(rate_per_s)
    new = arr[0] + np.round((arr - arr[0]) * f).astype(np.int64)
    return Workload(new, wl.input_tokens, wl.output_tokens, wl.tenant, wl.keys, wl.offsets, wl.block_tokens,
                    name=f"{wl.name}@{rate_per_s:g}/s", meta=dict(wl.meta))


def _workloads(c, rates, seed) -> list[Workload]:
    """The design scenario at each rate, or the trace (``study.trace.path``) scaled to each rate."""
    t = c.get("trace") or {}
    if not t.get("path"):
        return [design_workload(**c["workload"], rate_per_s=r, seed=seed) for r in rates]
    from cacheresearch.workload.trace import load_trace  # noqa: PLC0415

    bt = t.get("block_tokens")
    mx = t.get("max_requests")
    try:
        w0 = load_trace(str(t["path"]), block_tokens=None if bt is None else int(bt),
                        max_requests=None if mx is None else int(mx))
    except FileNotFoundError:
        raise StudyError(f"study.trace.path: no such trace file {t['path']!r}") from None
    except ValueError as e:
        raise StudyError(f"study.trace.path: {e}; set study.trace.block_tokens=N") from None
    return [at_rate(w0, r) for r in rates]


def salted(wl: Workload) -> Workload:
    """``wl`` with every request's block keys salted by its index (splitmix64): no block is shared."""
    n = wl.n_blocks
    req = np.repeat(np.arange(wl.n_requests, dtype=np.uint64), n)
    with np.errstate(over="ignore"):
        z = wl.keys + (req + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return Workload(wl.arrival_ms, wl.input_tokens, wl.output_tokens, wl.tenant, z, wl.offsets, wl.block_tokens,
                    name=wl.name + "/salted", meta=dict(wl.meta))


def _grid(cfg) -> dict:
    """:data:`GRID` with the ``grid.*`` lists given (one-line errors)."""
    return B.grid_lists(cfg, GRID, "disagg")


def _check(c) -> list:
    """The P:D shapes (None: agg), with one-line errors for the rest of the study's keys."""
    if not isinstance(c["pd"], (list, tuple)) or not c["pd"]:
        raise StudyError("grid.pd: a non-empty list of 'agg' and 'P:D' strings")
    R = c["replicas"]
    if isinstance(R, bool) or not isinstance(R, int) or R < 1:
        raise StudyError(f"study.replicas: must be an integer >= 1, got {R!r}")
    try:
        shapes = [pd_shape(x, "grid.pd") for x in c["pd"]]
        for gb in c["link_gbps"]:
            KvLink(float(gb), float(c["link_latency_us"]), str(c["link"]))
    except DisaggError as e:
        raise StudyError(str(e)) from None
    for sh, x in zip(shapes, c["pd"]):
        if sh is not None and sum(sh) != R:
            raise StudyError(f"grid.pd: {x!r} uses {sum(sh)} GPUs; every P:D must sum to study.replicas = {R}")
    bad = [x for x in c["prefix_cache"] if x not in ("on", "off")]
    if bad or not c["prefix_cache"]:
        raise StudyError(f"study.prefix_cache: {bad or 'empty'}; a list of 'on' and 'off'")
    B.positive_list("grid.link_gbps", c["link_gbps"])
    B.positive_list("grid.rate_per_s", c["rates_per_s"])
    if len(set(map(str, c["pd"]))) != len(c["pd"]) or len(set(c["routers"])) != len(c["routers"]):
        raise StudyError(f"grid.pd / grid.router: repeated values in {c['pd']} / {c['routers']}")
    return shapes


def _cells(c, shapes, bb):
    from cacheresearch.core.params import make_params  # noqa: PLC0415

    v = c["vllm"]
    kn = dict(capacity_blocks=int(v["capacity_blocks"]), step_model=str(v["step_model"]),
              max_num_seqs=int(v["max_num_seqs"]), max_num_batched_tokens=int(v["max_num_batched_tokens"]))
    cells, where = [], []
    try:
        for i, sh in enumerate(shapes):
            for j, rt in enumerate(c["routers"]):
                for k, gb in enumerate(c["link_gbps"]):
                    if sh is None:
                        cells.append(DisaggCell(None, make_params("lru", replicas=c["replicas"], router=rt, **kn)))
                    else:
                        cells.append(DisaggCell(make_params("lru", replicas=sh[0], router=rt, **kn),
                                                make_params("lru", replicas=sh[1], router=c["decode_router"], **kn),
                                                KvLink(float(gb), float(c["link_latency_us"]), str(c["link"])), bb))
                    where.append((i, j, k))
    except ValueError as e:
        raise StudyError(f"grid.router: {e}") from None
    return cells, where


def _metrics(wl, res, g, slo) -> dict:
    t, e = res.ttft_ms[g], res.e2e_ms[g]
    ok = (t >= 0) & (e >= 0)
    out = wl.output_tokens
    multi = ok & (out >= 2)
    itl = np.where(multi, (e - t) / np.maximum(out - 1, 1), 0.0)
    good = ok & (t <= slo["ttft_ms"]) & (~multi | (itl <= slo["itl_ms"]))
    span = max((int(wl.arrival_ms[-1]) - int(wl.arrival_ms[0])) / 1000.0, 1e-3)
    bt = wl.block_tokens
    ht = np.minimum(res.prefill_hit_blocks[g] * bt, wl.input_tokens)
    sent = res.kv_arrival_ms[g] >= 0
    return dict(ttft_p50_ms=_pct(t[ok], 50), ttft_p99_ms=_pct(t[ok], 99),
                itl_mean_ms=float(itl[multi].mean()) if multi.any() else np.nan,
                itl_p99_ms=_pct(itl[multi], 99), slo_attainment=float(good.mean()), goodput_rps=good.sum() / span,
                goodput_per_gpu=good.sum() / span / int(res.gpus[g]), gpus=int(res.gpus[g]),
                prefill_hit_rate=ht.sum() / max(int(wl.input_tokens.sum()), 1),
                link_wait_ms=float((res.kv_arrival_ms[g] - res.prefill_done_ms[g])[sent].mean()) if sent.any() else 0.0,
                preemptions=int(res.preemptions[g]), dropped=int(res.dropped[g]))


def _pct(x: np.ndarray, p: int) -> float:
    """Nearest-rank percentile (docs/fleet_semantics.md), NaN when empty."""
    if x.size == 0:
        return float("nan")
    s = np.sort(x)
    return float(s[min(max((p * s.size + 99) // 100 - 1, 0), s.size - 1)])


def disagg_study(cfg) -> xr.Dataset:
    from cacheresearch.replica.hardware import block_bytes  # noqa: PLC0415

    t0 = time.perf_counter()
    c = B.study_cfg(cfg, DISAGG_DEFAULTS)
    eng = cfg.get("engine") if hasattr(cfg, "get") else None
    backend = str(eng.get("backend", "auto")) if eng is not None and hasattr(eng, "get") else "auto"
    if backend == "jax":
        raise StudyError("engine.backend=jax: experiment=disagg imports KV into the decode pool, which only the numba "
                         "vllm backend models; use engine.backend=numba or auto")
    g = _grid(cfg)
    c.update(pd=g["pd"], routers=g["router"], link_gbps=g["link_gbps"], rates_per_s=g["rate_per_s"])
    shapes = _check(c)
    seed = B.seeds(cfg)[0]
    rates = [float(x) for x in c["rates_per_s"]]
    try:
        wls = _workloads(c, rates, seed)
        bb = block_bytes(str(c["model"]), kv_dtype=str(c["kv_dtype"]), block_tokens=int(wls[0].block_tokens))
    except (TypeError, ValueError) as e:
        raise StudyError(f"study.workload: {e}") from None
    cells, where = _cells(c, shapes, bb)
    shape = (len(rates), len(shapes), len(c["routers"]), len(c["prefix_cache"]), len(c["link_gbps"]))
    data = {k: np.full(shape, np.nan) for k in _VARS}
    tb = time.perf_counter()
    for ri, wl in enumerate(wls):
        for pi, pc in enumerate(c["prefix_cache"]):
            w = wl if pc == "on" else salted(wl)
            B.progress(f"disagg: {rates[ri]:g} requests/s, prefix cache {pc}, {len(cells)} configurations")
            res = simulate_disagg(w, cells, queue_slots=int(c["vllm"]["queue_slots"]),
                                  max_running=int(c["vllm"]["max_num_seqs"]))
            for g, (i, j, k) in enumerate(where):
                for name, val in _metrics(w, res, g, c["slo"]).items():
                    data[name][ri, i, j, pi, k] = val
    ts = time.perf_counter() - tb
    dims = ("rate_per_s", "pd", "router", "prefix_cache", "link_gbps")
    ds = xr.Dataset({k: (dims, v) for k, v in data.items()},
                    coords=dict(rate_per_s=rates, pd=[str(x) for x in c["pd"]], router=list(c["routers"]),
                                prefix_cache=list(c["prefix_cache"]), link_gbps=[float(x) for x in c["link_gbps"]]))
    B.doc(ds, _VARS)
    ds["pd"].attrs.update(long_name="prefill:decode workers ('agg': one aggregated fleet)")
    ds["prefix_cache"].attrs.update(long_name="prefix caching on the replicas (off: every request's keys salted)")
    ds["link_gbps"].attrs.update(long_name="KV link bandwidth, prefill to decode (agg: unused)", units="GB/s")
    ds["router"].attrs.update(long_name="prefill pool's router (agg: the fleet's)")
    ds.attrs.update(B.common_attrs(cfg, "disagg", t0, dict(
        simulate_time_s=ts, build_time_s=tb - t0, n_requests=wls[0].n_requests,
        configurations=len(rates) * len(c["prefix_cache"]) * len(cells),
        block_bytes=bb, slo_ttft_ms=int(c["slo"]["ttft_ms"]), slo_itl_ms=int(c["slo"]["itl_ms"]),
        decode_router=str(c["decode_router"]),
        kv_gb_per_request=float((-(-wls[0].input_tokens // wls[0].block_tokens)).mean() * bb / 1e9),
        link=str(c["link"]), model=str(c["model"]), step_model=str(c["vllm"]["step_model"]),
        workload=str(wls[0].name).split("@")[0] if (c.get("trace") or {}).get("path") else "design scenario")))
    return ds


def _best(sub):
    """(pd, router, link, cell) of the most goodput in ``sub`` (dims pd, router, link_gbps), ties to the lowest
    TTFT p99."""
    best = None
    for p in sub.pd.values:
        for r in sub.router.values:
            for gb in sub.link_gbps.values:
                v = sub.sel(pd=p, router=r, link_gbps=gb)
                k = (-float(v.goodput_rps), float(v.ttft_p99_ms))
                if np.isfinite(k[0]) and (best is None or k < best[0]):
                    best = (k, str(p), str(r), float(gb), v)
    return best[1:] if best else None


def _cell_words(v) -> str:
    return (f"goodput {float(v.goodput_rps):.2f} req/s ({B.pct(float(v.slo_attainment))} in SLO), TTFT p50 "
            f"{float(v.ttft_p50_ms):.0f} ms / p99 {float(v.ttft_p99_ms):.0f} ms, ITL {float(v.itl_mean_ms):.1f} ms")


def _answers(ds) -> list[str]:
    a = ds.attrs
    out = [f"Answers ({a.get('n_requests')} requests per rate on {int(ds.gpus.max())} GPUs; SLO TTFT <= "
           f"{a.get('slo_ttft_ms')} ms and ITL <= {a.get('slo_itl_ms')} ms; the decode pool routes by "
           f"{a.get('decode_router')}):"]
    dis_pd = [p for p in ds.pd.values if p != "agg"]
    for pc in ds.prefix_cache.values:
        for rate in ds.rate_per_s.values:
            sub = ds.sel(prefix_cache=pc, rate_per_s=rate)
            line = f"- prefix cache {pc}, {rate:g} req/s:"
            if "agg" in ds.pd.values:
                _, r, _, v = _best(sub.sel(pd=["agg"]))
                line += f" aggregated ({r}) {_cell_words(v)};"
            if dis_pd:
                p, r, gb, v = _best(sub.sel(pd=dis_pd))
                line += f" the best split is {p} ({r}, {gb:g} GB/s): {_cell_words(v)}."
            out.append(line)
    gbs = ds.link_gbps.values
    if gbs.size > 1 and dis_pd:
        d = ds.sel(pd=dis_pd)
        lo, hi = d.sel(link_gbps=gbs.min()), d.sel(link_gbps=gbs.max())
        out.append(f"- the KV link ({a.get('link')} mode, {a.get('block_bytes', 0) / 2**20:.0f} MiB a block, "
                   f"{a.get('kv_gb_per_request', 0):.2f} GB a request on average): at {gbs.min():g} GB/s "
                   f"the mean wait from prefill done to KV landed is {float(lo.link_wait_ms.median()):.0f} ms (median "
                   f"over split cells; worst {float(lo.link_wait_ms.max()) / 1000:.1f} s), at {gbs.max():g} GB/s "
                   f"{float(hi.link_wait_ms.median()):.0f} ms.")
    if ds.router.size > 1 and dis_pd and gbs.size and a.get("link") == "prefill":
        r0, r1 = (str(x) for x in ds.router.values[:2])
        w = ds.link_wait_ms.sel(link_gbps=gbs.min(), prefix_cache=ds.prefix_cache.values[0]).sel(pd=dis_pd)
        out.append(f"- routing and the per-worker links (prefix cache {ds.prefix_cache.values[0]}, {gbs.min():g} GB/s, "
                   f"mean link wait by P:D over rates): {r0} "
                   + ", ".join(f"{p} {float(w.sel(pd=p, router=r0).mean()):.0f} ms" for p in dis_pd)
                   + f"; {r1} " + ", ".join(f"{p} {float(w.sel(pd=p, router=r1).mean()):.0f} ms" for p in dis_pd)
                   + " (an affinity router sends a hot prefix's transfers down one worker's link).")
    return out


def summarize_disagg(ds) -> str:
    out = B.header(ds) + [""] + _answers(ds) + [""]
    head = ["rate/s", "pd", "router", "cache", "GB/s", "TTFT p50", "TTFT p99", "ITL ms", "ITL p99", "SLO",
            "goodput/s", "per GPU", "hit", "link ms", "preempt", "dropped"]
    rows = [head]
    for rate in ds.rate_per_s.values:
        for p in ds.pd.values:
            for r in ds.router.values:
                for pc in ds.prefix_cache.values:
                    for gb in (ds.link_gbps.values[:1] if p == "agg" else ds.link_gbps.values):
                        v = ds.sel(rate_per_s=rate, pd=p, router=r, prefix_cache=pc, link_gbps=gb)
                        rows.append([f"{rate:g}", p, r, pc, "-" if p == "agg" else f"{gb:g}",
                                     f"{float(v.ttft_p50_ms):.0f}", f"{float(v.ttft_p99_ms):.0f}",
                                     f"{float(v.itl_mean_ms):.2f}", f"{float(v.itl_p99_ms):.2f}",
                                     B.pct(float(v.slo_attainment)), f"{float(v.goodput_rps):.2f}",
                                     f"{float(v.goodput_per_gpu):.2f}", B.pct(float(v.prefill_hit_rate)),
                                     f"{float(v.link_wait_ms):.0f}", int(v.preemptions), int(v.dropped)])
    out += ["Every cell (agg does not use the link; hit: where prompts are computed):", B.table(rows)]
    return "\n".join(out)


def plot_disagg(ds):
    nr, nc = ds.rate_per_s.size, ds.prefix_cache.size
    f = B.fig(5.5 * nc, 3.2 * nr)
    axs = f.subplots(nr, nc, squeeze=False, sharex=True)
    x = np.arange(ds.pd.size)
    styles = ["-", "--", ":", "-."]
    for row, rate in enumerate(ds.rate_per_s.values):
        for col, pc in enumerate(ds.prefix_cache.values):
            ax = axs[row, col]
            for ri, r in enumerate(ds.router.values):
                for gb in ds.link_gbps.values:
                    y = ds.ttft_p99_ms.sel(rate_per_s=rate, prefix_cache=pc, router=r, link_gbps=gb).values / 1000
                    ax.plot(x, y, styles[ri % 4], marker="o", ms=3, label=f"{r}, {gb:g} GB/s")
            ax.axhline(ds.attrs.get("slo_ttft_ms", 0) / 1000, color="grey", lw=0.8, ls=":")
            ax.set_yscale("log")
            ax.set_title(f"{rate:g} req/s, prefix cache {pc}: TTFT p99", fontsize=9)
            ax.set_ylabel("TTFT p99 (s)")
            ax.set_xticks(x, [str(p) for p in ds.pd.values])
            if row == nr - 1:
                ax.set_xlabel("prefill:decode GPUs (agg: aggregated)")
            if row == 0 and col == 0:
                ax.legend(fontsize=6)
    return f


STUDIES = [Study("disagg", disagg_study, summarize_disagg, plot_disagg,
                 B.defaults_class("DisaggDefaults", DISAGG_DEFAULTS))]

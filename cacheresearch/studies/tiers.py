"""experiment=tiers: what a CPU tier per replica buys, at what bandwidth it stops paying, and whether a pool
shared by the fleet beats local tiers or affinity routing.

The tiered fleet (:mod:`cacheresearch.tiers`: gpu + cpu per replica + a shared pool + disk, offload on
eviction, promotion on a hit, load = bytes / bandwidth + latency) on two workloads:

* ``design``: the design scenario with load (``configs/workload/design_tenants.yaml``: 200 tenants x
  10,000-token prefixes, 200 fresh and 200 output tokens, a hot tenant with half the traffic), 16-token
  blocks, ``replicas`` replicas;
* ``agent``: the shared coding-agent trace (Mooncake JSONL, 64-token blocks; ``study.trace.path``).

The gpu tier of a replica is what the model preset leaves on the GPU preset (vLLM's accounting:
:func:`cacheresearch.replica.hardware.kv_blocks`), the block's bytes the model's KV bytes per token x
block tokens. Grid: ``grid.cpu_capacity_blocks`` (per replica) x ``grid.cpu_gbps`` (its read bandwidth; write
the same) x ``grid.router``. Per cell: ``token_hit_rate``, ``hit_rate_by_tier`` (tokens served by each tier
over all input tokens), ``ttft_p50_s`` / ``ttft_p99_s`` and the dollars: GPU hours of prefill saved
against the gpu-only cell of the same router, less the DRAM they take, per day.

The global-pool question (``pool_*`` variables, one figure panel): at the same DRAM per replica, the gpu
alone, a local cpu tier, or one pool holding ``replicas`` x that (at the pool's bandwidth), each under
random routing and under the tier-aware scorer.

``study.replica=vllm`` runs the grid's cells on the vllm replica instead (:mod:`cacheresearch.studies.tiers_vllm`,
``experiments/tiers_vllm.md``): the numba vllm backend with a cpu tier per replica, the same variables, no pool
question.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import xarray as xr

from cacheresearch.replica.hardware import kv_blocks
from cacheresearch.studies import base as B
from cacheresearch.studies.base import Study, StudyError
from cacheresearch.studies.tiers_vllm import VLLM_DEFAULTS, check_vllm, engine_backend, run_vllm_cells
from cacheresearch.tiers import (
    TIER_NAMES,
    TIER_VIEWS,
    TierError,
    make_config,
    run_tiers,
    tier_block_bytes,
    tier_policies,
)
from cacheresearch.tiers.engine import dense_keys
from cacheresearch.tiers.fleet import tokens_by_tier
from cacheresearch.workload.synthetic import tenant_workload
from cacheresearch.workload.trace import BlockSizeError, load_mooncake

__all__ = ["tiers_study", "tier_workload", "summarize", "plot", "STUDIES", "DEFAULTS"]

DEFAULTS = dict(
    workloads=["design", "agent"],
    replica="fcfs",  # fcfs (the tiered engine) | vllm (the numba vllm backend with a cpu tier: studies/tiers_vllm.py)
    vllm=dict(VLLM_DEFAULTS),  # study.replica=vllm: step-time preset, scheduler limits, waiting slots, cpu latency (us)
    model="llama3_8b",
    gpu="h100_80gb",
    gpu_memory_utilization=0.9,
    gpu_blocks=None,  # None: kv_blocks(model, gpu); an integer overrides (per workload block size)
    prefill_tps=20_000,  # the h100_8b latency preset (an assumption, labelled there)
    decode_us_per_token=250,
    offload="evict",
    load_mode="serial",
    gpu_policy="lru",  # the gpu tier's policy: lru (vLLM's, SGLang's) or a per-block one (fifo sieve s3fifo lfu arc)
    cpu_policy="lru",  # the cpu tiers' policy (the same choices)
    view="precise",  # what the tier routers read: precise | stale (every stale_lag_ms) | approximate (own index)
    stale_lag_ms=1000,
    index_capacity=2**31 - 1,  # approximate view: blocks per replica in the router's index
    tier_weights_pct=[100, 80, 60, 40],
    lower={},  # extra lower tiers in every grid cell: {pool: {capacity_blocks: ..}, disk: {..}} (tiers.* keys)
    design=dict(n_tenants=200, prefix_tokens=10_000, query_tokens=200, output_tokens=200, hot_share=0.5,
                n_requests=2500, rate_per_s=12.0, block_tokens=16, replicas=8),
    agent=dict(replicas=4, block_tokens=64),
    trace=dict(path="../shared/traces/agentic_coding_sessions.jsonl", max_requests=None),
    pool=dict(read_gbps=40.0, latency_us=50.0, dram_blocks_per_replica=None),  # None: the largest cpu capacity
    gpu_usd_per_hour=2.50,  # assumption: an H100 hour, on-demand class
    dram_usd_per_gb_hour=0.0005,  # assumption: server DRAM amortised (about $4/GB over 3 years + power, hosting)
)
#: How to get the agent workload's trace (it is not bundled: 30 MB), or run without it.
AGENT_TRACE_HINT = ("the agent workload reads the coding-agent trace, not bundled (WEKA kv-cache-tester's sessions, "
                    "github.com/callanjfox/kv-cache-tester traces/, as Mooncake JSONL with 64-token blocks: "
                    "docs/experiments/tiers.md): set study.trace.path=FILE, or run without it: "
                    "'study.workloads=[design]'")
GRID = dict(cpu_capacity_blocks=[0, 1.0, 2.0, 4.0], cpu_gbps=[1.0, 5.0, 25.0, 50.0],
            router=["random", "prefix_hash", "chwbl", "least_loaded", "tier_scorer", "tier_kv_cost", "tier_cache_aware",
                    "tier_preble"])


def _grid(cfg) -> dict:
    g = B.grid_lists(cfg, GRID, "tiers")
    caps = g["cpu_capacity_blocks"]
    for x in caps:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
            raise StudyError(f"grid.cpu_capacity_blocks: elements must be >= 0 (an integer: blocks; a float: "
                             f"multiples of the gpu tier), got {x!r}")
    B.positive_list("grid.cpu_gbps", g["cpu_gbps"])
    return g


def tier_workload(name: str, c: dict):
    if name == "design":
        d = dict(c["design"])
        R = int(d.pop("replicas"))
        n = int(d.pop("n_requests"))
        rate = float(d.pop("rate_per_s"))
        w = tenant_workload(duration_s=n / rate, rate_per_s=rate, seed=0, **d)
        return w, R
    if name == "agent":
        p = c["trace"]["path"]
        if not p or not Path(p).is_file():
            raise StudyError(f"study.trace.path: no such trace file {p!r}; {AGENT_TRACE_HINT}")
        try:
            bt = c["agent"]["block_tokens"]  # None: inferred from the trace
            w = load_mooncake(p, block_tokens=None if bt is None else int(bt), max_requests=c["trace"]["max_requests"])
        except BlockSizeError as e:
            raise StudyError(f"study.trace.path: {e}; set study.agent.block_tokens=N (or null: inferred)") from None
        except ValueError as e:
            raise StudyError(f"study.trace.path: {e}") from None
        return w, int(c["agent"]["replicas"])
    raise StudyError(f"study.workloads: unknown workload {name!r}; choose design or agent")


def _pct(sorted_ms, p) -> float:
    n = len(sorted_ms)
    if n == 0:
        return float("nan")
    return float(sorted_ms[max(-(-(p * n) // 100) - 1, 0)]) / 1000.0


def _prefill_ms(unc, tps):
    return (unc // tps) * 1000 + ((unc % tps) * 1000 + tps - 1) // tps


LAYOUTS = ["gpu_only", "local_cpu", "shared_pool"]
POOL_ROUTERS = ["random", "tier_scorer"]
DOCS = {
    "token_hit_rate": ("prompt tokens served from any tier over all prompt tokens", "1"),
    "hit_rate_by_tier": ("prompt tokens served from each tier over all prompt tokens", "1"),
    "ttft_p50_s": ("median time to first token (nearest rank)", "s"),
    "ttft_p99_s": ("99th percentile time to first token (nearest rank)", "s"),
    "replica_busy_hours": ("replica hours of prefill and (serial) KV loading", "h"),
    "cpu_write_utilisation": ("bytes offloaded to the cpu tiers / (write bandwidth x replicas x span): above 1 "
                              "the offload cannot keep up", "1"),
    "net_usd_per_day": ("GPU dollars of prefill saved against the smallest cpu tier, less its DRAM, per day",
                        "USD/day"),
    "cpu_capacity_blocks": ("cpu tier capacity per replica (grid.cpu_capacity_blocks)", "blocks"),
    "gpu_blocks": ("gpu tier capacity per replica (kv_blocks of the model and GPU presets)", "blocks"),
    "block_bytes": ("bytes of one KV block in a lower tier", "bytes"),
    "n_requests": ("requests in the workload", "1"),
    "span_hours": ("first to last arrival", "h"),
    "pool_token_hit_rate": ("token hit rate: gpu only, a local cpu tier, or a shared pool of the same DRAM", "1"),
    "pool_ttft_p50_s": ("median TTFT: gpu only, a local cpu tier, or a shared pool of the same DRAM", "s"),
    "pool_hit_rate_by_tier": ("prompt tokens served from each tier, pool question", "1"),
}


def _configs(c, caps, gbps, routers, common, R):
    """The grid's configurations (and their (capacity, bandwidth, router) cells), then the pool question's."""
    cells, cfgs, pool_cfgs = [], [], []
    lower = {k: dict(v) for k, v in (c["lower"] or {}).items()}  # pool / disk in every grid cell
    if "cpu" in lower:
        raise StudyError("study.lower.cpu: the cpu tier is the grid's (grid.cpu_capacity_blocks, grid.cpu_gbps)")
    try:
        for ci, cap in enumerate(caps):
            for gi, bw in enumerate(gbps):
                for ri, rt in enumerate(routers):
                    tiers = dict(cpu=dict(capacity_blocks=cap, read_gbps=bw, write_gbps=bw, policy=c["cpu_policy"]),
                                 **lower)
                    cfgs.append(make_config(router=rt, tiers=tiers, **common))
                    cells.append((ci, gi, ri))
        dram = c["pool"]["dram_blocks_per_replica"]
        dram = max(caps) if dram is None else int(dram)
        pbw = float(c["pool"]["read_gbps"])
        for lay in LAYOUTS:
            for rt in POOL_ROUTERS:
                tiers = {}
                if lay == "local_cpu":
                    tiers = dict(cpu=dict(capacity_blocks=dram, read_gbps=max(gbps), write_gbps=max(gbps),
                                          policy=c["cpu_policy"]))
                elif lay == "shared_pool":
                    tiers = dict(pool=dict(capacity_blocks=dram * R, read_gbps=pbw, write_gbps=pbw,
                                           latency_us=float(c["pool"]["latency_us"])))
                pool_cfgs.append(make_config(router=rt, tiers=tiers, **common))
    except TierError as e:
        raise StudyError(str(e)) from None
    return cells, cfgs, pool_cfgs


def _tier_tokens(r, bt, inp):
    """Hit tokens by tier over all input tokens (:func:`cacheresearch.tiers.fleet.tokens_by_tier`)."""
    return tokens_by_tier(r, bt) / inp


def _net_usd(busy_h, caps, span_h, bb, R, c):
    """Per cell [C, B, Rt]: GPU dollars of busy time saved against the smallest cpu tier, less its DRAM, per day."""
    out = np.full(busy_h.shape, np.nan)
    for ci, cap in enumerate(caps):
        saved_gpu_h_day = (busy_h[int(np.argmin(caps))] - busy_h[ci]) / span_h * 24
        dram_gb = cap * bb * R / 1e9
        out[ci] = saved_gpu_h_day * float(c["gpu_usd_per_hour"]) - dram_gb * float(c["dram_usd_per_gb_hour"]) * 24
    return out


def _settings(cfg):
    """The study's settings and grid, checked: ``(c, grid, routers, cpu_gbps, replica)``."""
    c = B.study_cfg(cfg, DEFAULTS)
    g = _grid(cfg)
    if not c["workloads"]:
        raise StudyError("study.workloads must name at least one workload")
    for k, allowed in (("gpu_policy", tier_policies()), ("cpu_policy", tier_policies()), ("view", TIER_VIEWS)):
        if c[k] not in allowed:
            raise StudyError(f"study.{k}: {c[k]!r} cannot run on the tiered engine; choose one of {', '.join(allowed)}")
    routers, gbps = list(g["router"]), [float(x) for x in g["cpu_gbps"]]
    replica = str(c["replica"])
    if replica not in ("fcfs", "vllm"):
        raise StudyError(f"study.replica: {replica!r}; choose fcfs or vllm")
    if replica == "vllm":
        check_vllm(c, routers, engine_backend(cfg))
    return c, g, routers, gbps, replica


def tiers_study(cfg):
    t0 = time.perf_counter()
    c, g, routers, gbps, replica = _settings(cfg)
    not_served = 0
    caps_spec = g["cpu_capacity_blocks"]
    W, Cn, Gn, Rn, T = len(c["workloads"]), len(caps_spec), len(gbps), len(routers), len(TIER_NAMES)
    shape = (W, Cn, Gn, Rn)
    thr, p50, p99, busy_h, wutil = (np.full(shape, np.nan) for _ in range(5))
    by_tier = np.full(shape + (T,), np.nan)
    usd_day = np.full(shape, np.nan)
    cap_blocks = np.zeros((W, Cn), np.int64)
    gpu_of, bb_of, nreq, hours = [], [], [], []
    layouts, prouters = LAYOUTS, POOL_ROUTERS
    pool_thr, pool_p50 = (np.full((W, 3, 2), np.nan) for _ in range(2))
    pool_tier = np.full((W, 3, 2, T), np.nan)
    timing = {}
    # every workload read (the trace checked) before the first one runs
    loaded = [tier_workload(name, c) for name in c["workloads"]]
    for wi, name in enumerate(c["workloads"]):
        tw = time.perf_counter()
        w, R = loaded[wi]
        loaded[wi] = None  # its arrays go when it is done
        n_cells = Cn * Gn * Rn + (0 if replica == "vllm" else len(LAYOUTS) * len(POOL_ROUTERS))
        B.progress(f"tiers: workload {wi + 1} of {W}, {name} ({w.n_requests:,} requests, {R} replicas): "
                   f"{n_cells} configurations on the {'numba vllm backend' if replica == 'vllm' else 'tiered engine'}"
                   " ...")
        bt = int(w.block_tokens)
        bb = tier_block_bytes(c["model"], bt)
        gpu_blocks = (int(c["gpu_blocks"]) if c["gpu_blocks"] is not None else
                      kv_blocks(c["model"], c["gpu"], block_tokens=bt,
                                gpu_memory_utilization=float(c["gpu_memory_utilization"])))
        caps = [int(x) if isinstance(x, int) else int(round(float(x) * gpu_blocks)) for x in caps_spec]
        cap_blocks[wi] = caps
        gpu_of.append(gpu_blocks)
        bb_of.append(bb)
        nreq.append(w.n_requests)
        dense = dense_keys(w)
        common = dict(gpu_blocks=gpu_blocks, replicas=R, block_bytes=bb, offload=c["offload"],
                      load_mode=c["load_mode"], prefill_tps=int(c["prefill_tps"]),
                      decode_us_per_token=int(c["decode_us_per_token"]), tier_weights_pct=tuple(c["tier_weights_pct"]),
                      gpu_policy=str(c["gpu_policy"]), view=str(c["view"]), stale_lag_ms=c["stale_lag_ms"],
                      index_capacity=c["index_capacity"],
                      # prefix_hash keys: the tenant prefix (design), the session's first block (agent)
                      prefix_blocks=max(int(c["design"]["prefix_tokens"]) // bt, 1) if name == "design" else 1)
        if replica == "vllm":  # the grid on the vllm replica; no global-pool question (pool_* stay NaN)
            span_h = max(float(w.arrival_ms[-1] - w.arrival_ms[0]) / 3.6e6, 1e-9) if w.n_requests else 1e-9
            hours.append(span_h)
            vo = run_vllm_cells(w, R, caps, gbps, routers, c, gpu_blocks=gpu_blocks, block_bytes=bb,
                                prefix_blocks=common["prefix_blocks"])
            thr[wi], by_tier[wi], p50[wi], p99[wi], busy_h[wi] = (vo[k] for k in ("thr", "by_tier", "p50", "p99",
                                                                                  "busy_h"))
            wutil[wi] = vo["offloaded"] * bb / (np.asarray(gbps)[None, :, None] * 1e9 * R * span_h * 3600)
            usd_day[wi] = _net_usd(busy_h[wi], caps, span_h, bb, R, c)
            not_served = max(not_served, int(vo["dropped"].max()))
            timing[name] = time.perf_counter() - tw
            B.progress(f"tiers: {name} done in {timing[name]:.0f} s")
            continue
        cells, cfgs, pool_cfgs = _configs(c, caps, gbps, routers, common, R)
        res = run_tiers(w, cfgs + pool_cfgs, [0] * (len(cfgs) + len(pool_cfgs)), dense=dense)
        inp = max(int(w.input_tokens.sum()), 1)
        span_h = max(float(w.arrival_ms[-1] - w.arrival_ms[0]) / 3.6e6, 1e-9) if w.n_requests else 1e-9
        hours.append(span_h)

        for (ci, gi, ri), r in zip(cells, res[: len(cells)]):
            s = np.sort(r.ttft_ms)
            thr[wi, ci, gi, ri] = r.hit_tokens.sum() / inp
            by_tier[wi, ci, gi, ri] = _tier_tokens(r, bt, inp)
            p50[wi, ci, gi, ri], p99[wi, ci, gi, ri] = _pct(s, 50), _pct(s, 99)
            unc = w.input_tokens - r.hit_tokens
            busy = _prefill_ms(unc, int(c["prefill_tps"])).sum()
            busy += r.load_ms.sum() if c["load_mode"] == "serial" else 0
            busy_h[wi, ci, gi, ri] = busy / 3.6e6
            wutil[wi, ci, gi, ri] = r.written_blocks[1] * bb / (gbps[gi] * 1e9 * R * span_h * 3600)
        usd_day[wi] = _net_usd(busy_h[wi], caps, span_h, bb, R, c)
        for k, r in enumerate(res[len(cells):]):
            li, pi = divmod(k, 2)
            pool_thr[wi, li, pi] = r.hit_tokens.sum() / inp
            pool_p50[wi, li, pi] = _pct(np.sort(r.ttft_ms), 50)
            pool_tier[wi, li, pi] = _tier_tokens(r, bt, inp)
        timing[name] = time.perf_counter() - tw
        B.progress(f"tiers: {name} done in {timing[name]:.0f} s")
    dims = ("workload", "cpu_capacity", "cpu_gbps", "router")
    ds = xr.Dataset(
        {
            "token_hit_rate": (dims, thr),
            "hit_rate_by_tier": (dims + ("tier",), by_tier),
            "ttft_p50_s": (dims, p50),
            "ttft_p99_s": (dims, p99),
            "replica_busy_hours": (dims, busy_h),
            "cpu_write_utilisation": (dims, wutil),
            "net_usd_per_day": (dims, usd_day),
            "cpu_capacity_blocks": (("workload", "cpu_capacity"), cap_blocks),
            "gpu_blocks": (("workload",), np.asarray(gpu_of, np.int64)),
            "block_bytes": (("workload",), np.asarray(bb_of, np.int64)),
            "n_requests": (("workload",), np.asarray(nreq, np.int64)),
            "span_hours": (("workload",), np.asarray(hours)),
            "pool_token_hit_rate": (("workload", "layout", "pool_router"), pool_thr),
            "pool_ttft_p50_s": (("workload", "layout", "pool_router"), pool_p50),
            "pool_hit_rate_by_tier": (("workload", "layout", "pool_router", "tier"), pool_tier),
        },
        coords={"workload": list(c["workloads"]), "cpu_capacity": [str(x) for x in caps_spec], "cpu_gbps": gbps,
                "router": routers, "tier": list(TIER_NAMES), "layout": layouts, "pool_router": prouters},
    )
    B.doc(ds, DOCS)
    ds["cpu_gbps"].attrs.update(long_name="cpu tier read and write bandwidth", units="GB/s")
    ds.attrs.update(B.common_attrs(cfg, "tiers", t0, dict(
        model=str(c["model"]), gpu=str(c["gpu"]), offload=str(c["offload"]), load_mode=str(c["load_mode"]),
        replica=replica, requests_not_served_max=int(not_served),
        vllm=str(c["vllm"]) if replica == "vllm" else "",
        gpu_policy=str(c["gpu_policy"]), cpu_policy=str(c["cpu_policy"]), view=str(c["view"]),
        replicas=str({"design": c["design"]["replicas"], "agent": c["agent"]["replicas"]}),
        gpu_usd_per_hour=float(c["gpu_usd_per_hour"]), dram_usd_per_gb_hour=float(c["dram_usd_per_gb_hour"]),
        pool_read_gbps=float(c["pool"]["read_gbps"]),
        workload_seconds=str({k: round(v, 2) for k, v in timing.items()}))))
    return ds


def _replicas_words(attr) -> str:
    """``design 8, agent 4`` from the ``replicas`` attribute (a dict written as text)."""
    import ast  # noqa: PLC0415

    try:
        d = ast.literal_eval(str(attr))
    except (ValueError, SyntaxError):
        return str(attr)
    return ", ".join(f"{k} {v}" for k, v in d.items()) if isinstance(d, dict) else str(attr)


def summarize(ds) -> str:
    lines = B.header(ds) + [f"{ds.attrs.get('replica', 'fcfs')} replica; model {ds.attrs.get('model')} on "
                            f"{ds.attrs.get('gpu')}; offload "
                            f"{ds.attrs.get('offload')}, load {ds.attrs.get('load_mode')}; replicas: "
                            f"{_replicas_words(ds.attrs.get('replicas'))}; "
                            f"${ds.attrs.get('gpu_usd_per_hour')}/GPU-hour, "
                            f"${ds.attrs.get('dram_usd_per_gb_hour')}/GB-hour of DRAM (assumptions)"]
    bw = float(ds.cpu_gbps.values.max())
    for w in ds.workload.values:
        d = ds.sel(workload=w)
        lines += ["", f"{w}: {int(d.n_requests)} requests over {float(d.span_hours):.1f} h; gpu tier "
                      f"{int(d.gpu_blocks)} blocks of {int(d.block_bytes) / 2**20:.1f} MiB per replica; "
                      f"cpu at {bw:g} GB/s"]
        rows = [["router", "cpu blocks", "hit rate", "gpu", "cpu", "TTFT p50", "TTFT p99", "net $/day",
                 "cpu write util"]]
        for rt in d.router.values:
            for k in d.cpu_capacity.values:
                x = d.sel(router=rt, cpu_capacity=k, cpu_gbps=bw)
                rows.append([rt, int(d.cpu_capacity_blocks.sel(cpu_capacity=k)), B.pct(float(x.token_hit_rate)),
                             B.pct(float(x.hit_rate_by_tier.sel(tier="gpu"))),
                             B.pct(float(x.hit_rate_by_tier.sel(tier="cpu"))), f"{float(x.ttft_p50_s):.3f} s",
                             f"{float(x.ttft_p99_s):.3f} s", B.usd(float(x.net_usd_per_day)),
                             B.pct(float(x.cpu_write_utilisation))])
        lines.append(B.table(rows))
        big = d.cpu_capacity.values[-1]
        rows = [["cpu GB/s"] + [f"{rt} p50" for rt in d.router.values]]
        for g in d.cpu_gbps.values:
            rows.append([f"{g:g}"] + [f"{float(d.ttft_p50_s.sel(router=rt, cpu_capacity=big, cpu_gbps=g)):.3f} s"
                                      for rt in d.router.values])
        base = [f"{float(d.ttft_p50_s.sel(router=rt, cpu_capacity=d.cpu_capacity.values[0]).max()):.3f} s"
                for rt in d.router.values]
        rows.append(["no cpu tier"] + base)
        lines += ["", f"{w}: TTFT p50 by cpu bandwidth at the largest cpu tier", B.table(rows)]
        if np.isnan(d.pool_token_hit_rate.values).all():
            lines += ["", f"{w}: the global-pool question is not run on the {ds.attrs.get('replica')} replica (cpu "
                          "tier only)"]
            continue
        rows = [["layout", "random hit", "random p50", "tier_scorer hit", "tier_scorer p50"]]
        for lay in d.layout.values:
            x = d.sel(layout=lay)
            rows.append([lay] + [v for pr in d.pool_router.values for v in (
                B.pct(float(x.pool_token_hit_rate.sel(pool_router=pr))),
                f"{float(x.pool_ttft_p50_s.sel(pool_router=pr)):.3f} s")])
        lines += ["", f"{w}: the global-pool question (same DRAM per replica; pool at "
                      f"{ds.attrs.get('pool_read_gbps')} GB/s)", B.table(rows)]
    return "\n".join(lines)


#: series closer than this share of a panel's range are drawn as one line (they would hide each other)
OVERLAP = 0.015
#: legends under their panel, clear of the data
_BELOW = dict(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=6, title_fontsize=6, frameon=False)


def _label(names: list, width: int = 38) -> str:
    """A legend label for routers drawn as one line (their curves overlap), wrapped at ``width`` characters."""
    out, line = [], ""
    for n in names:
        add = n if not line else f"{line} = {n}"
        if line and len(add) > width:
            out.append(line + " =")
            line = n
        else:
            line = add
    return "\n".join(out + [line])


def _plot_hit_rate(a, d, bw: float, colour: dict) -> None:
    """Token hit rate (%) against the cpu tier, one line per group of routers whose curves overlap."""
    x = d.cpu_capacity_blocks.values
    curves = {rt: 100 * d.token_hit_rate.sel(router=rt, cpu_gbps=bw).values for rt in d.router.values}
    for names, y in B.overlapping_groups(curves, OVERLAP):
        a.plot(x, y, "o-", color=colour[names[0]], label=_label(names))
    a.set(xlabel="cpu tier per replica (blocks)", ylabel="token hit rate (%)")
    a.legend(title="router (a = b: their curves overlap)", **_BELOW)


def _plot_ttft(a, d, colour: dict) -> None:
    """TTFT p50 (s, log) against the cpu tier: colour the router (routers with the same curves at every
    bandwidth drawn once), line style the cpu bandwidth (one solid line where every bandwidth gives the same)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    x = d.cpu_capacity_blocks.values
    gbps = list(d.cpu_gbps.values)
    styles = dict(zip(gbps, (":", "--", "-.", "-", (0, (1, 3)), (0, (5, 1)))))
    curves = {rt: d.ttft_p50_s.sel(router=rt).transpose("cpu_gbps", "cpu_capacity").values for rt in d.router.values}
    handles, used = [], set()
    for names, y in B.overlapping_groups(curves, OVERLAP, log=True):
        by_bw = B.overlapping_groups({g: y[i] for i, g in enumerate(gbps)}, OVERLAP, log=True)
        lab = _label(names)
        if len(by_bw) == 1:
            a.plot(x, y[-1], "-", color=colour[names[0]], marker=".")
            lab += " (every bandwidth)"
        for gs, yy in (by_bw if len(by_bw) > 1 else []):
            a.plot(x, yy, linestyle=styles.get(gs[-1], "-"), color=colour[names[0]], marker=".")
            used.add(gs[-1])
        handles.append(Line2D([], [], color=colour[names[0]], marker=".", label=lab))
    handles += [Line2D([], [], color="k", linestyle=styles.get(g, "-"), label=f"cpu at {g:g} GB/s")
                for g in gbps if g in used]
    a.set(xlabel="cpu tier per replica (blocks)", ylabel="TTFT p50 (s, log scale)", yscale="log")
    a.legend(handles=handles, title="router (a = b: their curves overlap); cpu bandwidth", **_BELOW)


def _plot_pool(a, d) -> None:
    """The global-pool question: stacked hit rate (%) by tier per layout, random (light) and tier_scorer (dark)
    side by side, TTFT p50 on top; the legend names the tiers that serve a visible share."""
    from matplotlib.patches import Patch  # noqa: PLC0415

    lay = list(d.layout.values)
    xs = np.arange(len(lay))
    cols = dict(zip(d.tier.values, ("tab:green", "tab:blue", "tab:purple", "tab:gray")))
    shown = []
    for j, pr in enumerate(d.pool_router.values):
        bottom = np.zeros(len(lay))
        for t in d.tier.values:
            v = 100 * d.pool_hit_rate_by_tier.sel(pool_router=pr, tier=t).values
            a.bar(xs + (j - 0.5) * 0.38, v, 0.36, bottom=bottom, color=cols[t], alpha=0.45 + 0.55 * j)
            if v.max() >= 0.5 and t not in shown:  # half a point: a visible bar
                shown.append(t)
            bottom += v
        for k in range(len(lay)):
            a.annotate(f"{float(d.pool_ttft_p50_s.sel(pool_router=pr).values[k]):.2f} s",
                       (xs[k] + (j - 0.5) * 0.38, bottom[k]), ha="center", va="bottom", fontsize=7)
    a.set_xticks(xs, [str(v).replace("_", " ") for v in lay])
    a.set(xlabel="where the DRAM is (same bytes per replica)", ylabel="token hit rate by tier (%)", ylim=(0, 112))
    a.legend(handles=[Patch(color=cols[t], label=f"served by {t}") for t in shown], **_BELOW)


def plot(ds):
    W = ds.sizes["workload"]
    f = B.fig(15, 5.6 * W)
    axs = f.subplots(W, 3, squeeze=False)
    bw = float(ds.cpu_gbps.values.max())
    routers = [str(r) for r in ds.router.values]
    colour = dict(zip(routers, B.distinct_colours(len(routers))))
    for i, w in enumerate(ds.workload.values):
        d = ds.sel(workload=w)
        _plot_hit_rate(axs[i, 0], d, bw, colour)
        axs[i, 0].set_title(f"{w}: token hit rate (cpu at {bw:g} GB/s)", fontsize="small")
        _plot_ttft(axs[i, 1], d, colour)
        axs[i, 1].set_title(f"{w}: TTFT p50 by cpu bandwidth", fontsize="small")
        if np.isnan(d.pool_token_hit_rate.values).all():
            axs[i, 2].set_axis_off()
            axs[i, 2].text(0.5, 0.5, f"{w}: no pool question on this replica", ha="center", fontsize="small")
            continue
        _plot_pool(axs[i, 2], d)
        axs[i, 2].set_title(f"{w}: pool vs local tiers vs affinity\n(left bars random, light; right tier_scorer, "
                            "dark; labels: TTFT p50)", fontsize="small")
    return f


STUDIES = [Study("tiers", tiers_study, summarize, plot, B.defaults_class("TiersDefaults", DEFAULTS),
                 doc="KV tiers: cpu tier per replica x bandwidth x router, and the global-pool question")]

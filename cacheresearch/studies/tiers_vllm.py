"""experiment=tiers with ``study.replica=vllm``: the grid's cells on the vllm replica with a cpu tier per replica
(:mod:`cacheresearch.tiers.vllm`, the numba vllm backend: continuous batching, chunked prefill, one KV pool per
replica with vLLM's free-queue LRU, preemption by recompute; the step that admits a request waits for its cpu
loads). ``experiments/tiers_vllm.md`` describes the model and the numbers.

The cells are the fcfs grid's (``grid.cpu_capacity_blocks`` x ``grid.cpu_gbps`` x ``grid.router``), with:

* the routers the numba vllm backend runs; a ``tier_*`` router runs as its untiered twin (``tier_scorer`` ->
  ``weighted_scorers``, ``tier_kv_cost`` -> ``kv_cost``, ``tier_cache_aware`` -> ``cache_aware``, ``tier_preble`` ->
  ``preble_e2``) because the vllm routers read the GPU pool only; the routers' knobs are the fcfs tiered
  engine's (:class:`cacheresearch.tiers.TieredConfig`'s defaults);
* the replica's speed from a step-time preset (``study.vllm.step_model``, default ``llama31_8b_h100_tp1``: BLIS's
  llama-3.1-8b on one H100) and vLLM's scheduler limits (``max_num_seqs`` 256, ``max_num_batched_tokens`` 8192);
  the pool per replica is the fcfs cells' gpu tier (``kv_blocks(model, gpu)``);
* only the cpu tier: ``study.lower`` (pool, disk) is refused, and so is the global-pool question (its
  ``pool_*`` variables are NaN); ``offload`` is ``evict``, ``gpu_policy`` / ``cpu_policy`` ``lru`` and ``view``
  ``precise``; ``load_mode`` ``serial`` runs the ``sync`` overlap model (the admitting step waits for the load),
  ``overlap`` the ``async`` one (the request waits for its load in the queue while the others step).
"""

from __future__ import annotations

import numpy as np

from cacheresearch.studies.base import StudyError
from cacheresearch.tiers import TieredConfig, TierError

__all__ = ["VLLM_DEFAULTS", "VLLM_ROUTER", "check_vllm", "run_vllm_cells", "engine_backend"]

#: study.vllm: the replica's step-time preset, vLLM's scheduler limits, the waiting slots per replica
VLLM_DEFAULTS = dict(step_model="llama31_8b_h100_tp1", max_num_seqs=256, max_num_batched_tokens=8192,
                     queue_slots=4096, latency_us=10.0)
#: the grid's router -> the numba vllm backend's rule (tier routers: their untiered twins, reading the GPU pool)
VLLM_ROUTER = {"random": "random", "round_robin": "round_robin", "prefix_hash": "prefix_hash",
               "least_loaded": "least_loaded", "chwbl": "chwbl", "power_of_two": "power_of_two",
               "tier_scorer": "weighted_scorers", "weighted_scorers": "weighted_scorers",
               "tier_kv_cost": "kv_cost", "kv_cost": "kv_cost", "tier_cache_aware": "cache_aware",
               "cache_aware": "cache_aware", "tier_preble": "preble_e2", "preble_e2": "preble_e2"}
#: study.load_mode -> the vllm replica's overlap model (cacheresearch/tiers/vllm.py)
OVERLAP_OF = {"serial": "sync", "overlap": "async"}
_KNOBS = ("prefix_weight_pct", "load_weight_pct", "queue_threshold", "overlap_weight_pct", "cache_threshold_pm",
          "balance_abs", "balance_rel_pct", "preble_rel_pct", "preble_abs", "chwbl_c_pct", "vnodes")


def check_vllm(c: dict, routers: list, backend: str) -> None:
    """One-line errors for what the vllm replica's cpu tier does not model here."""
    if c["lower"]:
        names = ", ".join(sorted(c["lower"]))
        raise StudyError(f"study.lower: {names} on study.replica=vllm; the vllm replica models a cpu tier only "
                         "(grid.cpu_capacity_blocks); use study.replica=fcfs for pool and disk tiers")
    if str(c["load_mode"]) not in ("serial", "overlap"):
        raise StudyError(f"study.load_mode: {c['load_mode']!r}; choose serial (the vllm replica's sync overlap) or "
                         "overlap (async)")
    fixed = dict(offload="evict", gpu_policy="lru", cpu_policy="lru", view="precise")
    for k, v in fixed.items():
        if str(c[k]) != v:
            raise StudyError(f"study.{k}: {c[k]!r} on study.replica=vllm; the vllm replica's cpu tier runs "
                             f"{k}={v} only")
    for rt in routers:
        if rt not in VLLM_ROUTER:
            raise StudyError(f"grid.router: {rt!r} is not run on study.replica=vllm; choose one of "
                             f"{', '.join(VLLM_ROUTER)}")
    if backend == "jax":
        raise StudyError("engine.backend=jax: study.replica=vllm runs the cpu tier (grid.cpu_capacity_blocks) on the "
                         "numba vllm backend only; the JAX replica does not model it; use engine.backend=numba or auto")
    if backend not in ("auto", "numba"):
        raise StudyError(f"engine.backend={backend!r}: choose one of auto, jax, numba")
    v = c["vllm"]
    from cacheresearch.core.params import STEP_PRESETS  # noqa: PLC0415

    if v["step_model"] not in STEP_PRESETS:
        raise StudyError(f"study.vllm.step_model: {v['step_model']!r}; choose one of {', '.join(STEP_PRESETS)}")
    for k in ("max_num_seqs", "max_num_batched_tokens", "queue_slots"):
        if isinstance(v[k], bool) or not isinstance(v[k], int) or v[k] < 1:
            raise StudyError(f"study.vllm.{k}: must be an integer >= 1, got {v[k]!r}")


def run_vllm_cells(w, R: int, caps: list, gbps: list, routers: list, c: dict, *, gpu_blocks: int, block_bytes: int,
                   prefix_blocks: int) -> dict:
    """Every (capacity, bandwidth, router) cell of one workload in one call of the numba vllm backend; per cell
    (arrays [C, B, Rt]): token hit rate, hit rate by tier [.., 4], TTFT p50 / p99 (s, nearest rank over the served
    requests), replica busy hours (every engine step: prefill, decode and the loads), blocks offloaded, requests
    dropped."""
    import jax  # noqa: PLC0415

    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.simulate import static_options  # noqa: PLC0415
    from cacheresearch.core.stream import compile_stream  # noqa: PLC0415
    from cacheresearch.tiers.vllm import cpu_tier, run_stream_tiered  # noqa: PLC0415

    v = c["vllm"]
    d = TieredConfig(gpu_blocks=0)
    knobs = {k: getattr(d, k) for k in _KNOBS}
    s = compile_stream(w, stateful_singletons=True)
    cells, params, tiers = [], [], []
    try:
        for ci, cap in enumerate(caps):
            for gi, bw in enumerate(gbps):
                t = cpu_tier(capacity_blocks=cap, read_gbps=bw, latency_us=float(v["latency_us"]),
                             block_bytes=block_bytes, overlap=OVERLAP_OF[str(c["load_mode"])])
                for ri, rt in enumerate(routers):
                    cells.append((ci, gi, ri))
                    tiers.append(t)
                    params.append(make_params("lru", capacity_blocks=gpu_blocks, replicas=R, router=VLLM_ROUTER[rt],
                                              prefix_blocks=prefix_blocks, step_model=str(v["step_model"]),
                                              max_num_seqs=int(v["max_num_seqs"]),
                                              max_num_batched_tokens=int(v["max_num_batched_tokens"]), **knobs))
    except TierError as e:
        raise StudyError(str(e)) from None
    st_ = static_options(params[0], max_replicas=R, per_request=True, scheduler="vllm",
                         max_running=int(v["max_num_seqs"]), queue_slots=int(v["queue_slots"]),
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    res = run_stream_tiered(s, params, [jax.random.key(0)] * len(params), st_, tiers)
    m = res.metrics
    bt = int(w.block_tokens)
    inp = max(int(np.asarray(w.input_tokens).sum()), 1)
    shape = (len(caps), len(gbps), len(routers))
    out = {k: np.full(shape, np.nan) for k in ("thr", "p50", "p99", "busy_h")}
    out["by_tier"] = np.zeros(shape + (4,))
    out["offloaded"] = np.zeros(shape, np.int64)
    out["dropped"] = np.zeros(shape, np.int64)
    n = int(w.n_requests)
    for g, (ci, gi, ri) in enumerate(cells):
        ttft = np.asarray(m.ttft_ms[g])[:n].astype(np.int64)
        served = ttft >= 0
        hit_tok = np.asarray(m.hit_tokens[g])[:n].astype(np.int64)
        cpu_tok = np.where(served, res.cpu_hit_blocks[g] * bt, 0)
        out["thr"][ci, gi, ri] = hit_tok.sum() / inp
        out["by_tier"][ci, gi, ri, 0] = (hit_tok.sum() - cpu_tok.sum()) / inp
        out["by_tier"][ci, gi, ri, 1] = cpu_tok.sum() / inp
        srt = np.sort(ttft[served])
        for key, p in (("p50", 50), ("p99", 99)):
            out[key][ci, gi, ri] = float(srt[max(-(-(p * len(srt)) // 100) - 1, 0)]) / 1000 if len(srt) else np.nan
        out["busy_h"][ci, gi, ri] = float(np.asarray(m.busy_ms[g])[:R].astype(np.int64).sum()) / 3.6e6
        out["offloaded"][ci, gi, ri] = int(res.offloaded_blocks[g])
        out["dropped"][ci, gi, ri] = int(n - served.sum())  # dropped, rejected or never finished
    return out


def engine_backend(cfg) -> str:
    """``engine.backend`` of the run's config (default auto)."""
    node = cfg
    for part in ("engine", "backend"):
        if node is None or not hasattr(node, "get"):
            return "auto"
        node = node.get(part)
    return "auto" if node is None else str(node)

"""Tiers in the fleet's own grid: a cell of the main engine (its :class:`~cacheresearch.core.params.Params`) with
lower tiers behind its gpu cache, run by the tiered engine, its results as the main engine's
:class:`~cacheresearch.metrics.core.Metrics`.

:func:`tier_config_of` maps a cell to a :class:`~cacheresearch.tiers.spec.TieredConfig`: the cell's policy and
capacity are the gpu tier's, its router rule the tiered engine's twin (``weighted_scorers`` ->
``tier_scorer``, ``kv_cost`` -> ``tier_kv_cost``, ``cache_aware`` -> ``tier_cache_aware``, ``preble_e2`` ->
``tier_preble``; the others as they are) with the cell's knobs, view and replica speed. What the tiered engine
does not model is refused in one line naming the knob (:func:`refusal`).

:func:`run_cells` runs cells on their workloads and returns the fcfs engine's metrics, computed on the host
by the fcfs engine's definitions (nearest-rank TTFT percentiles, busy time = prefill + decode (+ the load when
``load_mode="serial"``), horizon = the last finish or arrival after the first arrival), and the tokens served
by each tier. With every lower tier empty the metrics equal :func:`~cacheresearch.core.run.simulate_cells`'
field for field (``tests/test_tiers_fleet.py``), except the two the tiered engine does not track: prefix
copies and overflow share (NaN) and the occupancy (-1).
"""

from __future__ import annotations

import numpy as np

from cacheresearch.cache.policies import POLICIES
from cacheresearch.metrics.core import LIMB, Metrics, finalize
from cacheresearch.routers import REGISTRY
from cacheresearch.routers.views import VIEWS
from cacheresearch.tiers.engine import dense_keys, run_tiers
from cacheresearch.tiers.spec import TieredConfig, TierError, make_config, tier_policies, why_not

__all__ = ["TWIN", "UNTRACKED", "refusal", "tier_config_of", "run_cells", "tokens_by_tier"]

#: the fleet's router rule -> the tiered engine's router (the cache-reading rules count the match per tier)
TWIN = {"random": "random", "round_robin": "round_robin", "prefix_hash": "prefix_hash",
        "least_loaded": "least_loaded", "chwbl": "chwbl", "power_of_two": "power_of_two",
        "weighted_scorers": "tier_scorer", "kv_cost": "tier_kv_cost", "cache_aware": "tier_cache_aware",
        "preble_e2": "tier_preble"}
#: Metrics fields the tiered engine does not track (prefix copies and overflow, occupancy, router matches)
UNTRACKED = frozenset({"prefix_copies", "overflow_share", "max_occupancy", "occupancy", "match", "copies_sum",
                       "copies_n", "over_n", "over_q"})
#: knobs copied from the cell onto the tiered configuration
_KNOBS = ("prefix_blocks", "prefill_tps", "decode_us_per_token", "prefix_weight_pct", "load_weight_pct",
          "queue_threshold", "overlap_weight_pct", "cache_threshold_pm", "balance_abs", "balance_rel_pct",
          "preble_rel_pct", "preble_abs", "chwbl_c_pct", "vnodes", "stale_lag_ms", "index_capacity")
_RULE_OF = {r.id: r.name for r in REGISTRY.routers()}
_POLICY_OF = {s.id: n for n, s in POLICIES.items()}
_VIEW_OF = {v: k for k, v in VIEWS.items()}
_WHY = {"gie": "the tiered engine has no GIE scorer set (queue, kv-cache, prefix and load-aware scores); "
               "weighted_scorers is llm-d's prefix + load pair"}


def _val(p, name):
    return np.asarray(getattr(p, name)).item()


def refusal(p, scheduler: str = "fcfs") -> str | None:
    """Why cell ``p`` cannot run with a lower tier (a knob's name and the reason, one line), or None. On the fcfs
    replica: the tiered engine's limits; on the vllm replica: its cpu tier's (``tiers/vllm.py``: the pool's lru;
    the numba vllm backend's coverage decides the routers and views)."""
    pol = _POLICY_OF.get(_val(p, "policy"), "?")
    if scheduler == "vllm":  # the numba vllm backend's cpu tier (tiers/vllm.py); its coverage decides the rest
        if pol != "lru":
            return (f"cache.policy: {pol!r}; the vllm replica's cpu tier runs behind the pool's lru (vLLM's free "
                    "queue) only")
        return None
    if scheduler != "fcfs":
        return f"replica.scheduler: {scheduler!r}; tiers run on the fcfs and vllm replicas"
    if pol not in tier_policies():
        return (f"cache.policy: {pol!r} cannot run as the gpu tier ({why_not(pol)}); choose one of "
                f"{', '.join(tier_policies())}")
    rule = _RULE_OF.get(_val(p, "router"), "?")
    if rule not in TWIN:
        why = _WHY.get(rule, "the tiered engine does not model it")
        return f"fleet.router: {rule!r} does not run with tiers ({why}); choose one of {', '.join(TWIN)}"
    view = _VIEW_OF.get(_val(p, "view"), "?")
    if view not in ("precise", "stale", "approximate"):
        return (f"fleet.knobs.view: {view!r} does not run with tiers (GIE's own index of prompt bytes; the tier "
                "routers read every tier now, as of the last sync, or their own index); choose precise, stale or "
                "approximate")
    checks = (("instances", 1, "one router instance"), ("local_load", False, "the fleet's shared load"),
              ("kv_pressure", False, "no KV-pressure model"), ("restart_replica", -1, "no cache event"),
              ("load_refresh_ms", 0, "loads read as they are"), ("miss_smallest_tree", False, "SGLang's current rule"))
    for k, want, what in checks:
        if k in p._fields and _val(p, k) != want:
            return f"fleet.knobs.{k}: the tiered engine models {what} ({k}={want!r})"
    if rule == "kv_cost" and float(_val(p, "temperature")) != 0.0:
        return "fleet.knobs.temperature: tier_kv_cost is Dynamo's cost at temperature 0"
    return None


def tier_config_of(p, *, tiers: dict | None = None, block_bytes: int, offload: str = "evict",
                   load_mode: str = "serial", tier_weights_pct=(100, 80, 60, 40), scheduler: str = "fcfs",
                   where: str = "tiers.") -> TieredConfig:
    """The tiered configuration of fleet cell ``p`` (one configuration's :class:`Params`) with ``tiers``
    (``{cpu: {capacity_blocks, read_gbps, ...}, pool: ..., disk: ...}``) behind its gpu cache."""
    why = refusal(p, scheduler) if scheduler == "fcfs" else "replica.scheduler: the tiered engine runs the fcfs " \
        "replica (the vllm replica's cpu tier: tiers/vllm.py)"
    if why:
        raise TierError(why)
    view = _VIEW_OF[_val(p, "view")]
    kn = {k: int(_val(p, k)) for k in _KNOBS}
    return make_config(gpu_blocks=int(_val(p, "capacity")), tiers=tiers, replicas=int(_val(p, "replicas")),
                       router=TWIN[_RULE_OF[_val(p, "router")]], block_bytes=int(block_bytes), offload=offload,
                       load_mode=load_mode, tier_weights_pct=tuple(int(x) for x in tier_weights_pct),
                       gpu_policy=_POLICY_OF[_val(p, "policy")], view=view, where=where, **kn)


def _cdiv(a, b):
    return -(-a // b)


def _limbs(total: int):
    return np.int32(total >> LIMB), np.int32(total & ((1 << LIMB) - 1))


def _pct(srt, n, p):
    """The engine's nearest-rank percentile (:func:`cacheresearch.metrics.core.percentile`)."""
    if n == 0:
        return 0
    return int(srt[min(max((p * n + 99) // 100 - 1, 0), n - 1)])


def _metrics(w, cfg: TieredConfig, r, max_replicas: int, n_out: int) -> Metrics:
    """The fcfs engine's unfinalized metrics of one tiered run (integers and exact sums)."""
    n, R = int(w.n_requests), int(max_replicas)
    inp = w.input_tokens[:n].astype(np.int64)
    out = w.output_tokens[:n].astype(np.int64)
    arr = w.arrival_ms[:n].astype(np.int64)
    rep = r.replica.astype(np.int64)
    ht = r.hit_tokens.astype(np.int64)
    pre = _cdiv((inp - ht) * 1000, int(cfg.prefill_tps))
    dec = _cdiv(out * int(cfg.decode_us_per_token), 1000)
    svc = pre + dec + (r.load_ms if cfg.load_mode == "serial" else 0)
    ttft = r.ttft_ms.astype(np.int64)
    fin = arr + ttft + dec
    busy_ms = np.bincount(rep, weights=svc, minlength=R)[:R].astype(np.int64) if n else np.zeros(R, np.int64)
    last = np.zeros(R, np.int64)
    if n:
        np.maximum.at(last, rep, fin)
    horizon = max(max(int(last.max()), int(arr[-1])) - int(arr[0]), 1) if n else 1
    srt = np.sort(ttft)
    tover = bool(n and (int(fin.max()) >= 2**31 - 1 or int(busy_ms.max()) >= 2**31 - 1))

    def pad(a, dtype, fill=0):
        o = np.full(n_out, fill, dtype)
        o[:n] = a
        return o

    z, zf, nan = np.int32(0), np.zeros(R, np.float32), np.float32(np.nan)
    hit_hi, hit_lo = _limbs(int(ht.sum()))
    inp_hi, inp_lo = _limbs(int(inp.sum()))
    t_hi, t_lo = _limbs(int(ttft.sum()))
    return Metrics(
        token_hit_rate=nan, request_hit_rate=nan, hit_tokens_hi=hit_hi, hit_tokens_lo=hit_lo,
        requests_hit=np.int32((r.hit_blocks > 0).sum()),
        max_occupancy=np.full(R, -1, np.int32), occupancy=np.full(R, -1, np.int32),
        requests_per_replica=np.bincount(rep, minlength=R)[:R].astype(np.int32),
        ttft_p50_ms=np.int32(_pct(srt, n, 50)), ttft_p90_ms=np.int32(_pct(srt, n, 90)),
        ttft_p99_ms=np.int32(_pct(srt, n, 99)), ttft_mean_ms=nan,
        busy_ms=busy_ms.astype(np.int32), utilisation=np.full(R, np.nan, np.float32), load_imbalance=nan,
        prefix_copies=nan, overflow_share=nan, queue_overflow=z, time_overflow=np.bool_(tover),
        hit_blocks=pad(r.hit_blocks, np.int32), hit_tokens=pad(ht, np.int32), replica=pad(rep, np.int32),
        ttft_ms=pad(ttft, np.int32), match=np.zeros((n_out, R), np.int32),
        replicas_over_bound=np.bool_(cfg.replicas > R),
        tpot_mean_ms=nan, e2e_p50_ms=np.int32(-1), e2e_p90_ms=np.int32(-1), e2e_p99_ms=np.int32(-1),
        preemptions=z, kv_util_mean=nan, kv_util_max=nan, queue_len_mean=nan, throughput_tps=nan,
        dropped=z, steps=z, events=z, e2e_ms=np.zeros(0, np.int32), preempted=np.zeros(0, np.int32),
        client_wait_ms=np.zeros(0, np.int32), kv_acc_at=np.zeros(0, np.float32), q_acc_at=np.zeros(0, np.float32),
        n_requests=np.int32(n), input_tokens_hi=inp_hi, input_tokens_lo=inp_lo, ttft_sum_hi=t_hi, ttft_sum_lo=t_lo,
        ttft_n=np.int32(n), busy_time=busy_ms.astype(np.int32), horizon_time=np.int32(horizon),
        replicas_active=np.int32(min(max(cfg.replicas, 1), R)), copies_sum=z, copies_n=z, over_n=z, over_q=z,
        tpot_ms_hi=z, tpot_ms_lo=z, tpot_ns_hi=z, tpot_ns_lo=z, tpot_n=z, output_tokens_hi=z, output_tokens_lo=z,
        kv_capacity=np.int32(cfg.gpu_blocks), kv_acc=zf, q_acc=zf,
        requests_ok=np.int32(n), requests_timed_out=z, requests_failed=z, status=np.zeros(0, np.int32),
        vllm_counters_hi=np.zeros(4, np.int32), vllm_counters_lo=np.zeros(4, np.int32),
    )


def tokens_by_tier(r, block_tokens: int) -> np.ndarray:
    """Input tokens served by each tier (gpu, cpu, pool, disk; int64 [4]): each tier's hit blocks x block tokens,
    the cut at the input length (a last partial block) taken from the deepest tier of the hit (disk, pool, cpu,
    then gpu)."""
    ht = r.hit_tier.astype(np.int64) * int(block_tokens)
    over = ht.sum(axis=1) - r.hit_tokens.astype(np.int64)
    for t in range(ht.shape[1] - 1, -1, -1):
        cut = np.minimum(over, ht[:, t])
        ht[:, t] -= cut
        over -= cut
    return ht.sum(axis=0)


class _St:
    queue, match, scheduler = True, False, "fcfs"


def run_cells(workloads: list, stream_of, params: list, seeds, configs: list[TieredConfig], *, max_replicas: int,
              n_out: int | None = None, threads: int = 2):
    """Cells ``g`` = (``workloads[stream_of[g]]``, ``configs[g]``, PRNG ``seeds[g]``) on the tiered engine:
    (finalized :class:`Metrics` stacked over the cells [G], tokens served by tier [G, 4], blocks written into
    each tier [G, 4]). Per-request arrays have ``n_out`` entries (default: the most requests of a workload)."""
    stream_of = np.asarray(stream_of, np.int64)
    G = len(configs)
    if not (len(stream_of) == len(params) == len(seeds) == G):
        raise ValueError("run_cells: as many stream indices, params, seeds and configurations as cells")
    n_out = max((int(w.n_requests) for w in workloads), default=0) if n_out is None else int(n_out)
    ms: list = [None] * G
    by_tier = np.zeros((G, 4), np.int64)
    written = np.zeros((G, 4), np.int64)
    for s, w in enumerate(workloads):
        ix = np.flatnonzero(stream_of == s)
        if not ix.size:
            continue
        dense = dense_keys(w)
        res = run_tiers(w, [configs[g] for g in ix], [int(seeds[g]) for g in ix], threads=threads, dense=dense)
        for g, r in zip(ix, res):
            ms[g] = _metrics(w, configs[g], r, max_replicas, n_out)
            by_tier[g] = tokens_by_tier(r, w.block_tokens)
            written[g] = r.written_blocks
    m = Metrics(*(np.stack([np.asarray(getattr(x, f)) for x in ms]) for f in Metrics._fields)) if G else None
    return (finalize(m, _St) if m is not None else None), by_tier, written


"""Autoscaling an fcfs fleet with per-replica prefix caches: cold starts, prewarming, drains, routers.

The semantics are ``docs/autoscale_semantics.md``; the plain-Python reference is
``tests/reference_autoscale.py`` and the compiled kernel :mod:`cacheresearch.backends.numba_autoscale`
(equal to it request by request). :class:`ScalerConfig` is one configuration (validated, one-line
``ValueError`` naming the key); :func:`simulate_autoscale` runs many over one workload in one call and
returns :class:`AutoscaleResult` (per request, the timeline of replicas, totals) with
:func:`day_metrics` (hit rate, TTFT percentiles, replicas per time bin; GPU-hours, SLO attainment and the
dollars of cold-cache recomputation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np

from cacheresearch.backends.numba_autoscale import PCOLS, run_autoscale
from cacheresearch.core.stream import compile_stream
from cacheresearch.routers.common import prefix_hash_u64
from cacheresearch.routers.fixed import prefix_keys
from cacheresearch.workload import Workload

__all__ = ["ScalerConfig", "SCALER_POLICIES", "AUTOSCALE_ROUTERS", "AutoscaleResult", "simulate_autoscale",
           "day_metrics", "ring_nodes", "GPU_USD_PER_HOUR"]

SCALER_POLICIES = ("schedule", "queue", "utilisation", "kv", "slo")
AUTOSCALE_ROUTERS = ("least_loaded", "ring", "chwbl", "cache_aware", "prefix_hash")
#: on-demand H100-class price, the same assumption as experiments/tiers.md (a preset, overridable)
GPU_USD_PER_HOUR = 2.50


@dataclass(frozen=True)
class ScalerConfig:
    """One autoscaled fleet. Times in integer ms; ``target`` is per policy: ``queue`` requests in
    flight per replica, ``utilisation`` busy percent, ``kv`` percent of capacity pinned by requests in
    flight; ``slo`` reads ``slo_ms`` (the planner's TTFT target); ``schedule`` reads ``schedule`` (replicas
    per ``schedule_period_ms``, cycling)."""

    policy: str = "queue"
    router: str = "ring"
    min_replicas: int = 1
    max_replicas: int = 8
    initial_replicas: int = 1
    delay_ms: int = 60_000
    cooldown_ms: int = 300_000
    interval_ms: int = 60_000
    target: int = 2
    slo_ms: int = 2_000
    prewarm_pct: int = 0
    capacity: int = 19_208
    prefill_tps: int = 10_000
    decode_us_per_token: int = 500
    chwbl_c_pct: int = 125
    balance_abs: int = 64
    prefix_blocks: int = 625
    schedule: tuple = (1,)
    schedule_period_ms: int = 3_600_000
    ring_vnodes: int = 16
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        def need(key, ok, what):
            if not ok:
                raise ValueError(f"autoscale.{key}: {what}, got {getattr(self, key)!r}")

        need("policy", self.policy in SCALER_POLICIES, f"one of {SCALER_POLICIES}")
        need("router", self.router in AUTOSCALE_ROUTERS, f"one of {AUTOSCALE_ROUTERS}")
        for k in ("min_replicas", "max_replicas", "interval_ms", "target", "slo_ms", "prefill_tps", "ring_vnodes",
                  "schedule_period_ms", "prefix_blocks"):
            need(k, int(getattr(self, k)) >= 1, "must be >= 1")
        for k in ("delay_ms", "cooldown_ms", "capacity", "decode_us_per_token", "balance_abs"):
            need(k, int(getattr(self, k)) >= 0, "must be >= 0")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscale.min_replicas: {self.min_replicas} > max_replicas {self.max_replicas}")
        need("max_replicas", self.max_replicas <= 256, "at most 256 slots")
        need("initial_replicas", self.min_replicas <= self.initial_replicas <= self.max_replicas,
             "within [min_replicas, max_replicas]")
        need("prewarm_pct", 0 <= self.prewarm_pct <= 100, "a percent in [0, 100]")
        need("chwbl_c_pct", self.chwbl_c_pct >= 100, "must be >= 100 (some replica is always below the cap)")
        need("schedule", len(self.schedule) >= 1 and all(int(x) >= 0 for x in self.schedule),
             "a non-empty list of replica counts >= 0")

    @property
    def prewarm_blocks(self) -> int:
        return self.capacity * self.prewarm_pct // 100

    def as_reference(self) -> dict:
        """The plain-Python reference's configuration dict (codes for policy and router)."""
        d = asdict(self)
        d.pop("extra")
        d.update(policy=SCALER_POLICIES.index(self.policy), router=AUTOSCALE_ROUTERS.index(self.router),
                 prewarm_blocks=self.prewarm_blocks, schedule=[int(x) for x in self.schedule])
        return d


def ring_nodes(R: int, vnodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The consistent-hash ring of slots ``r < R`` (``vnodes`` points each at ``mix32(r, v)``, the chwbl
    router's positions), sorted by (position, slot, v): (positions, slots)."""
    nodes = sorted((prefix_hash_u64((r << 32) | v), r, v) for r in range(R) for v in range(vnodes))
    return np.array([p for p, _, _ in nodes], np.int64), np.array([r for _, r, _ in nodes], np.int64)


class AutoscaleResult(NamedTuple):
    configs: list
    replica: np.ndarray  # int32 [G, N] the slot that served each request
    hit_blocks: np.ndarray  # int32 [G, N]
    ttft_ms: np.ndarray  # int64 [G, N]
    best_match: np.ndarray  # int32 [G, N] the longest match over the active replicas at routing
    timeline: np.ndarray  # int32 [G, ticks, 2] active and provisioning replicas after each tick
    gpu_ms: np.ndarray  # int64 [G] replica lifetimes (provisioning, serving, draining)
    scale_ups: np.ndarray
    scale_downs: np.ndarray
    prewarmed_blocks: np.ndarray
    end_ms: np.ndarray


def _host(stream) -> dict:
    return {k: np.asarray(getattr(stream, k)).astype(np.int64)[: int(stream.n_requests)] for k in
            ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs", "entry0")}


def simulate_autoscale(wl: Workload, configs: list[ScalerConfig], *, stream=None) -> AutoscaleResult:
    """Every configuration over ``wl`` in one compiled call (configurations in parallel threads)."""
    if not configs:
        raise ValueError("autoscale: no configurations")
    for c in configs:
        if not isinstance(c, ScalerConfig):
            raise ValueError(f"autoscale: a ScalerConfig, got {type(c).__name__}")
    s = compile_stream(wl) if stream is None else stream
    host = _host(s)
    N = wl.n_requests
    G = len(configs)
    P = np.array([[getattr(c, k) if k not in ("policy", "router", "prewarm_blocks", "n_schedule") else 0
                   for k in PCOLS] for c in configs], np.int64)
    P[:, PCOLS.index("policy")] = [SCALER_POLICIES.index(c.policy) for c in configs]
    P[:, PCOLS.index("router")] = [AUTOSCALE_ROUTERS.index(c.router) for c in configs]
    P[:, PCOLS.index("prewarm_blocks")] = [c.prewarm_blocks for c in configs]
    P[:, PCOLS.index("n_schedule")] = [len(c.schedule) for c in configs]
    S = max(len(c.schedule) for c in configs)
    sched = np.zeros((G, S), np.int64)
    for g, c in enumerate(configs):
        sched[g, : len(c.schedule)] = c.schedule
    ph = np.zeros((G, N), np.int64)
    by_pb: dict[int, np.ndarray] = {}
    kh, kl = (wl.keys >> np.uint64(32)).astype(np.uint32), (wl.keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    for g, c in enumerate(configs):
        if c.prefix_blocks not in by_pb:
            hi, lo = prefix_keys(wl.offsets[:-1], wl.n_blocks, kh, kl, c.prefix_blocks)
            keys = (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
            h = np.array([prefix_hash_u64(int(k)) for k in keys], np.int64)
            by_pb[c.prefix_blocks] = np.where(wl.n_blocks > 0, h, 0)
        ph[g] = by_pb[c.prefix_blocks]
    V = max(c.max_replicas * c.ring_vnodes for c in configs)
    rpos, rslot = np.full((G, V), 2**40, np.int64), np.zeros((G, V), np.int64)
    for g, c in enumerate(configs):
        p, r = ring_nodes(c.max_replicas, c.ring_vnodes)
        rpos[g, : p.size], rslot[g, : p.size] = p, r
        # padding nodes sit past every real position and carry the first node's slot: a walk that reaches
        # them visits that slot, the first one clockwise after the wrap anyway, so the order is unchanged
        rslot[g, p.size:] = r[0] if p.size else 0
    last = int(wl.arrival_ms[-1]) if N else 0
    n_ticks = max(last // min(c.interval_ms for c in configs), 0)
    out, tl, tot = run_autoscale(P, sched, host, np.asarray(s.log[0]).astype(np.int64), s.n_keys,
                                 int(s.block_tokens), ph, rpos, rslot, n_ticks)
    return AutoscaleResult(list(configs), out[:, 0].astype(np.int32), out[:, 1].astype(np.int32), out[:, 2],
                           out[:, 3].astype(np.int32), tl, tot[:, 0], tot[:, 1], tot[:, 2], tot[:, 3], tot[:, 4])


def _pct(x: np.ndarray, p: int) -> float:
    """Nearest-rank percentile (docs/fleet_semantics.md), NaN when empty."""
    if x.size == 0:
        return float("nan")
    s = np.sort(x)
    return float(s[min(max((p * s.size + 99) // 100 - 1, 0), s.size - 1)])


def day_metrics(wl: Workload, res: AutoscaleResult, *, bin_s: float = 3600.0, slo_ms: int | None = None,
                usd_per_gpu_hour: float = GPU_USD_PER_HOUR) -> dict:
    """Per configuration: totals (hit rate, TTFT p50/p90/p99, SLO attainment, GPU-hours, dollars, the
    cold-cache recomputation: tokens a request prefilled although an active replica held them, and
    their GPU-seconds and dollars) and per ``bin_s`` series (replicas, hit rate, TTFT p90)."""
    bt, inp = wl.block_tokens, wl.input_tokens
    b = (wl.arrival_ms // int(bin_s * 1000)).astype(np.int64)
    nbins = int(b.max()) + 1 if b.size else 0
    G = len(res.configs)
    out = {k: np.zeros(G) for k in ("token_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "slo_attainment",
                                    "gpu_hours", "usd", "recompute_tokens", "cold_usd", "replicas_mean")}
    series = {k: np.full((G, nbins), np.nan) for k in ("replicas", "hit_rate", "ttft_p90_ms")}
    for g, c in enumerate(res.configs):
        ht = np.minimum(res.hit_blocks[g].astype(np.int64) * bt, inp)
        best = np.minimum(res.best_match[g].astype(np.int64) * bt, inp)
        t = res.ttft_ms[g]
        slo = c.slo_ms if slo_ms is None else slo_ms
        out["token_hit_rate"][g] = ht.sum() / max(int(inp.sum()), 1)
        for p in (50, 90, 99):
            out[f"ttft_p{p}_ms"][g] = _pct(t, p)
        out["slo_attainment"][g] = float(np.mean(t <= slo)) if t.size else float("nan")
        out["gpu_hours"][g] = res.gpu_ms[g] / 3.6e6
        out["usd"][g] = out["gpu_hours"][g] * usd_per_gpu_hour
        rec = int((best - ht).sum())
        out["recompute_tokens"][g] = rec
        out["cold_usd"][g] = rec / c.prefill_tps / 3600.0 * usd_per_gpu_hour
        tl = res.timeline[g, :, 0]
        out["replicas_mean"][g] = float(tl.mean()) if tl.size else float(c.initial_replicas)
        for k in range(nbins):
            m = b == k
            series["hit_rate"][g, k] = ht[m].sum() / max(int(inp[m].sum()), 1)
            series["ttft_p90_ms"][g, k] = _pct(t[m], 90)
        if tl.size:
            tb = (np.arange(1, tl.size + 1) * c.interval_ms) // int(bin_s * 1000)
            for k in range(nbins):
                sel = tl[tb == k]
                series["replicas"][g, k] = sel.mean() if sel.size else np.nan
    return dict(totals=out, series=series, bin_s=bin_s)

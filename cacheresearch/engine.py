"""The engine's public face: parameters, the run-compressed stream and the scan.

The pieces live in :mod:`cacheresearch.core`: :mod:`~cacheresearch.core.stream` (workload ->
run-compressed device stream), :mod:`~cacheresearch.core.simulate` (the scan composed of the
components: :mod:`~cacheresearch.core.store` cache rows, :mod:`~cacheresearch.core.views` router
views, :mod:`~cacheresearch.core.queue` replica queue, metrics) and
:mod:`~cacheresearch.core.run` (grids of cells grouped by stream and state shape, with a memory
estimate). This module keeps the parameters (``Params``, ``make_params``) and re-exports the rest.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .core.simulate import (  # noqa: F401  (re-exported)
    Metrics, Static, check_bounds, combine_limbs, default_window, request_bits, simulate, simulate_grid,
    static_options,
)
from .core.stream import Stream, StreamShape, compile_stream, pad_stream, stack_streams, stream_shape  # noqa: F401
from .policies import INF, policy_spec
from .routers import PRESETS, ROUTER_DEFAULTS, router_id, view_id

__all__ = [
    "Stream",
    "Params",
    "Metrics",
    "compile_stream",
    "stack_streams",
    "pad_stream",
    "make_params",
    "stack_params",
    "simulate",
    "simulate_grid",
    "combine_limbs",
    "check_bounds",
    "default_window",
    "request_bits",
    "resolve_router",
    "static_options",
    "LATENCY_PRESETS",
    "KNOBS",
]

class Params(NamedTuple):
    """Dynamic parameters of one configuration (every field a scalar, or [G] for a grid).

    Router knobs are documented in :mod:`cacheresearch.routers`; the queue model in
    ``docs/fleet_semantics.md``.
    """

    policy: jax.Array  # int32 policy id (metadata; behaviour comes from the fields below)
    capacity: jax.Array  # int32 blocks per replica (INF = unbounded)
    ttl_ms: jax.Array  # int32 (INF = no expiry)
    leaf_first: jax.Array  # bool
    refresh: jax.Array  # bool: hits refresh the TTL clock
    replicas: jax.Array  # int32 active replicas
    router: jax.Array  # int32 router id
    prefix_blocks: jax.Array  # int32 K for prefix_hash / chwbl and the prefix-copies metric
    # what the router knows
    view: jax.Array  # int32: 0 precise, 1 approximate, 2 stale
    stale_lag_ms: jax.Array  # int32
    instances: jax.Array  # int32 router instances (request i -> instance i mod instances)
    local_load: jax.Array  # bool: an instance counts only its own in-flight requests
    index_capacity: jax.Array  # int32 blocks per (instance, replica) approximate index
    # router knobs
    vnodes: jax.Array  # int32
    chwbl_c_pct: jax.Array  # int32
    cache_threshold_pm: jax.Array  # int32
    balance_abs: jax.Array  # int32
    balance_rel_pct: jax.Array  # int32
    miss_smallest_tree: jax.Array  # bool
    overlap_weight_pct: jax.Array  # int32
    temperature: jax.Array  # float32
    prefix_weight_pct: jax.Array  # int32
    load_weight_pct: jax.Array  # int32
    queue_threshold: jax.Array  # int32
    preble_rel_pct: jax.Array  # int32
    preble_abs: jax.Array  # int32
    # replica speed (the latency model)
    prefill_tps: jax.Array  # int32 prefill tokens per second (uncached tokens only)
    decode_us_per_token: jax.Array  # int32 replica time per output token (amortised over the batch)
    kv_pressure: jax.Array  # bool: in-flight requests' blocks count against the replica's capacity




#: Replica speed presets (assumptions, every number overridable): prefill throughput on uncached
#: tokens and each output token's share of the replica's time under continuous batching.
LATENCY_PRESETS: dict[str, dict] = {
    "h100_8b": dict(
        prefill_tps=20_000, decode_us_per_token=250,
        source="assumption: Llama-3.1-8B-class model on one H100, vLLM; prefill about 20k tokens/s, "
        "decode about 4,000 tokens/s aggregate at moderate batch (0.25 ms of replica time per output token)",
    ),
    "h100_32b_tp2": dict(
        prefill_tps=10_000, decode_us_per_token=500,
        source="assumption: 32B-class model on two H100 (TP=2); prefill about 10k tokens/s, decode about "
        "2,000 tokens/s aggregate",
    ),
}

_KNOB_RANGES = dict(
    prefix_blocks=(1, 2**31 - 2), stale_lag_ms=(0, 2**31 - 2), instances=(1, 2**16), index_capacity=(0, INF),
    vnodes=(1, 2**16), chwbl_c_pct=(100, 10**6), cache_threshold_pm=(0, 1000), balance_abs=(0, 2**30),
    balance_rel_pct=(0, 10**6), overlap_weight_pct=(0, 10**4), prefix_weight_pct=(0, 10**4),
    load_weight_pct=(0, 10**4), queue_threshold=(1, 2**20), preble_rel_pct=(0, 10**6), preble_abs=(0, 2**30),
    prefill_tps=(1, 2_000_000), decode_us_per_token=(0, 2_000_000),
)
KNOBS = tuple(ROUTER_DEFAULTS) + ("prefill_tps", "decode_us_per_token")


def resolve_router(router: str, **overrides) -> dict:
    """The router rule and every knob for ``router`` (a rule or a preset name) with ``overrides``."""
    knobs = dict(ROUTER_DEFAULTS)
    knobs.update(prefill_tps=LATENCY_PRESETS["h100_8b"]["prefill_tps"],
                 decode_us_per_token=LATENCY_PRESETS["h100_8b"]["decode_us_per_token"])
    if router in PRESETS:
        pre = dict(PRESETS[router])
        rule = pre.pop("router")
        pre.pop("source", None)
        knobs.update(pre)
    else:
        router_id(router)
        rule = router
    for k, v in overrides.items():
        if k not in knobs:
            raise ValueError(f"unknown router or latency knob {k!r}; known: {sorted(knobs)}")
        if v is not None:
            knobs[k] = v
    knobs["router"] = rule
    return knobs


def make_params(
    policy: str = "lru",
    capacity_blocks: int | None = None,
    ttl_s: float | None = None,
    replicas: int = 1,
    router: str = "round_robin",
    prefix_blocks: int | None = None,
    latency: str | None = None,
    **knobs,
) -> Params:
    """One configuration. Capacity is required for LRU policies, TTL for TTL policies.

    ``router`` is a rule (:data:`cacheresearch.routers.ROUTERS`) or a preset
    (:data:`cacheresearch.routers.PRESETS`); ``knobs`` override any router knob
    (:data:`cacheresearch.routers.ROUTER_DEFAULTS`; ``view`` by name) or the replica speed
    (``prefill_tps``, ``decode_us_per_token``; ``latency`` names a :data:`LATENCY_PRESETS` entry).
    """
    spec = policy_spec(policy)
    if spec.uses_capacity:
        if capacity_blocks is None:
            raise ValueError(f"policy {policy!r} needs capacity_blocks")
        if not 0 <= int(capacity_blocks) < INF:
            raise ValueError(f"capacity_blocks must be in [0, {INF}), got {capacity_blocks}")
        cap = int(capacity_blocks)
    else:
        cap = INF
    if spec.uses_ttl:
        if ttl_s is None:
            raise ValueError(f"policy {policy!r} needs ttl_s")
        ttl = int(round(float(ttl_s) * 1000))
        if not 0 <= ttl < INF:
            raise ValueError(f"ttl_s must be in [0, {INF / 1000:.0f}] seconds, got {ttl_s}")
    else:
        ttl = INF
    if int(replicas) < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if latency is not None:
        if latency not in LATENCY_PRESETS:
            raise ValueError(f"unknown latency preset {latency!r}; choose one of {sorted(LATENCY_PRESETS)}")
        for k in ("prefill_tps", "decode_us_per_token"):
            knobs.setdefault(k, LATENCY_PRESETS[latency][k])
    k = resolve_router(router, prefix_blocks=prefix_blocks, **knobs)
    for name, (lo, hi) in _KNOB_RANGES.items():
        v = k[name]
        if isinstance(v, bool) or int(v) != v or not lo <= int(v) <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    if not (np.isfinite(float(k["temperature"])) and float(k["temperature"]) >= 0):
        raise ValueError(f"temperature must be >= 0, got {k['temperature']!r}")
    return Params(
        policy=np.int32(spec.id),
        capacity=np.int32(cap),
        ttl_ms=np.int32(ttl),
        leaf_first=np.bool_(spec.leaf_first),
        refresh=np.bool_(spec.refresh_on_hit),
        replicas=np.int32(replicas),
        router=np.int32(router_id(k["router"])),
        **{f: _knob_value(f, k[f]) for f in Params._fields if f in k and f != "router"},
    )


_BOOL_KNOBS = ("local_load", "miss_smallest_tree", "kv_pressure")


def _knob_value(name: str, v):
    """A knob as its Params dtype (view by name or id; booleans; float temperature; int32 otherwise)."""
    if name == "view":
        return np.int32(view_id(v) if isinstance(v, str) else int(v))
    if name in _BOOL_KNOBS:
        return np.bool_(bool(v))
    if name == "temperature":
        return np.float32(v)
    return np.int32(v)


def stack_params(params: list[Params]) -> Params:
    """A grid [G] of configurations."""
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *params)


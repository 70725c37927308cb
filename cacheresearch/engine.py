"""The exact, vectorized prefix-cache engine.

``simulate(stream, params, key) -> Metrics`` is a pure, jit-compiled function; ``simulate_grid`` vmaps
it over configurations (and seeds). Everything a user sweeps (policy, capacity, TTL, replicas, router,
router knobs) is a dynamic field of :class:`Params`, so one compile serves a whole grid. Static shapes
come from the :class:`Stream` (number of distinct keys, chunks) and the ``max_replicas`` bound.

Data structures (why this is exact and fast)
--------------------------------------------
* Keys are made dense on the host (``np.unique``): each replica holds one ``(stamp, time)`` pair per
  key in a single ``[R, K, 2]`` array: the recency stamp (-1 never stored) and the last access (or
  write time for ``ttl_fixed``) in ms. One array, so each step does one gather and one in-place
  scatter (with two arrays XLA copied the whole state on every step).
* Recency stamps are *global positions in the block stream*: block ``j`` of request ``i`` gets
  ``offsets[i] + (n_i - 1 - j)`` under leaf-first order and ``offsets[i] + j`` under prompt order. So
  the log of stamp assignments ``log[s]`` (the key stamped ``s``) is known before the run, is sorted by
  time, and the least recent stored block of a replica is the first of its log entries at or after its
  pointer whose key still carries that stamp on that replica. Each replica keeps the list of requests
  routed to it and a pointer into their log segments that only moves forward, skipping stale entries
  in vectorized windows: eviction is exact LRU in amortized O(1) per block, and a replica never scans
  another replica's entries.
* The scan runs over *chunks* of at most ``chunk_blocks`` blocks of one request, not over padded
  requests, so work follows real blocks. Lookup of every chunk of a request happens before any
  eviction for that request (restamping the request's own blocks never changes their presence, since
  keys are distinct within a request), which keeps the request-level semantics exact.
* Token totals are carried as two int32 limbs, so aggregate hit-token counts are exact without x64.

* Routing happens at a request's first chunk (:mod:`cacheresearch.routers`); the random router's bits
  are drawn once before the scan.

Overflow of a static bound (too many replicas, a stream longer than int32 stamps, token counts beyond
int32) raises before the run; nothing is truncated.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .policies import INF, policy_spec
from .routers import (
    CACHE_ROUTERS, PRESETS, ROUTER_DEFAULTS, ROUTERS, VIEWS, FleetView, RequestView, ring_positions, route,
    router_id, view_id,
)
from .workload import Workload

__all__ = [
    "Stream",
    "Params",
    "Metrics",
    "compile_stream",
    "stack_streams",
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

_LIMB = 20  # token counters: value = hi * 2**20 + lo


class Stream(NamedTuple):
    """Device arrays of one workload, ready for the scan (see :func:`compile_stream`).

    Dense key ids: ``0 .. K-1`` for keys that occur in more than one request (they carry state);
    ``K`` marks padding; ``K + 1`` marks a *singleton* key (in exactly one request, once: it can never
    hit, so it needs no state; it still occupies a slot until evicted). Traces with unique user
    suffixes are mostly singletons, so this keeps the state small.
    """

    # per chunk [T, W] / [T]
    chunk_ids: jax.Array  # int32 [T, W] dense key id, K for padding, K + 1 for a singleton
    chunk_pos: jax.Array  # int32 [T, W] block index within its request
    chunk_req: jax.Array  # int32 [T] request index (N for padding chunks)
    chunk_first: jax.Array  # bool [T]
    chunk_last: jax.Array  # bool [T]
    # per request [N + 1] (last row is a dummy for padding)
    arrival_ms: jax.Array  # int32
    input_tokens: jax.Array  # int32
    output_tokens: jax.Array  # int32
    n_blocks: jax.Array  # int32
    offset: jax.Array  # int32: first stamp of the request
    # per block position [S] (flat, prompt order)
    key_hi: jax.Array  # uint32
    key_lo: jax.Array  # uint32
    log_leaf: jax.Array  # int32 [S + 1]: key stamped s under leaf-first order (K at the end)
    log_plain: jax.Array  # int32 [S + 1]: same under prompt order (= the dense id of flat position s)
    # scalars
    block_tokens: jax.Array  # int32
    input_total: jax.Array  # float32: total input tokens
    n_requests: jax.Array  # int32: real requests (excludes padding)
    # per stateful key [K]: the 64-bit key of each dense id (its length fixes the state's shape)
    uniq_hi: jax.Array  # uint32
    uniq_lo: jax.Array  # uint32

    @property
    def n_keys(self) -> int:
        return int(self.uniq_hi.shape[-1])


# ---------------------------------------------------------------------------------------------
# Host side: workload -> stream
# ---------------------------------------------------------------------------------------------


def compile_stream(workload: Workload, *, chunk_blocks: int = 32) -> Stream:
    """Dense, chunked device arrays for ``workload`` (host-side NumPy work, done once)."""
    if chunk_blocks < 1:
        raise ValueError("chunk_blocks must be >= 1")
    w = workload
    w.check_distinct_keys()
    n = w.n_requests
    nb = w.n_blocks.astype(np.int64)
    S = w.total_blocks
    if S >= 2**31 - 2:
        raise ValueError(f"stream has {S} blocks; the int32 stamp bound is {2**31 - 3}")
    if w.input_tokens.max(initial=0) >= 2**31 - 1:
        raise ValueError("an input length exceeds the int32 token bound")
    if w.output_tokens.max(initial=0) >= 2**31 - 1:
        raise ValueError("an output length exceeds the int32 token bound")
    raw = w.dense_ids().astype(np.int64)
    uniq_all = np.unique(w.keys)
    counts = np.bincount(raw, minlength=uniq_all.shape[0]) if S else np.zeros(0, np.int64)
    shared = counts > 1  # keys are distinct within a request, so count > 1 means several requests
    K = max(int(shared.sum()), 1)  # at least one id keeps the state's shapes valid
    remap = np.where(shared, np.cumsum(shared) - 1, K + 1).astype(np.int32)
    ids = remap[raw] if S else np.zeros(0, np.int32)
    uniq = uniq_all[shared] if S else np.zeros(0, np.uint64)
    if uniq.shape[0] == 0:
        uniq = np.zeros(1, np.uint64)
    req_of_pos = np.repeat(np.arange(n, dtype=np.int64), nb)
    pos_in_req = np.arange(S, dtype=np.int64) - w.offsets[:-1][req_of_pos]
    # leaf-first stamp of flat position p: offset + (n - 1 - j)
    leaf_stamp = w.offsets[:-1][req_of_pos] + (nb[req_of_pos] - 1 - pos_in_req)
    log_leaf = np.full(S + 1, K, dtype=np.int32)
    log_leaf[leaf_stamp] = ids
    log_plain = np.full(S + 1, K, dtype=np.int32)
    log_plain[:S] = ids

    # chunks: every request gets at least one chunk (so block-less requests are still counted)
    W = int(chunk_blocks)
    nch = np.maximum(1, -(-nb // W))
    T = int(nch.sum())
    chunk_req = np.repeat(np.arange(n, dtype=np.int64), nch)
    first_chunk = np.concatenate([[0], np.cumsum(nch)[:-1]]).astype(np.int64)
    k_in_req = np.arange(T, dtype=np.int64) - first_chunk[chunk_req]
    start = w.offsets[:-1][chunk_req] + k_in_req * W  # flat position of the chunk's first block
    lane = np.arange(W, dtype=np.int64)
    pos = k_in_req[:, None] * W + lane[None, :]
    valid = pos < nb[chunk_req][:, None]
    flat = np.where(valid, start[:, None] + lane[None, :], 0)
    chunk_ids = np.where(valid, ids[flat] if S else 0, K).astype(np.int32)
    chunk_pos = np.where(valid, pos, 0).astype(np.int32)
    chunk_first = k_in_req == 0
    chunk_last = k_in_req == nch[chunk_req] - 1

    keys = w.keys
    pad1 = lambda a, v=0: np.concatenate([a, [v]])  # noqa: E731
    return Stream(
        chunk_ids=jnp.asarray(chunk_ids),
        chunk_pos=jnp.asarray(chunk_pos),
        chunk_req=jnp.asarray(chunk_req.astype(np.int32)),
        chunk_first=jnp.asarray(chunk_first),
        chunk_last=jnp.asarray(chunk_last),
        arrival_ms=jnp.asarray(pad1(w.arrival_ms).astype(np.int32)),
        input_tokens=jnp.asarray(pad1(w.input_tokens).astype(np.int32)),
        output_tokens=jnp.asarray(pad1(w.output_tokens).astype(np.int32)),
        n_blocks=jnp.asarray(pad1(nb).astype(np.int32)),
        offset=jnp.asarray(pad1(w.offsets[:-1]).astype(np.int32)),
        key_hi=jnp.asarray(pad1((keys >> np.uint64(32)).astype(np.uint32))),
        key_lo=jnp.asarray(pad1((keys & np.uint64(0xFFFFFFFF)).astype(np.uint32))),
        log_leaf=jnp.asarray(log_leaf),
        log_plain=jnp.asarray(log_plain),
        block_tokens=jnp.asarray(np.int32(w.block_tokens)),
        input_total=jnp.asarray(np.float32(w.input_tokens.sum())),
        n_requests=jnp.asarray(np.int32(n)),
        uniq_hi=jnp.asarray((uniq >> np.uint64(32)).astype(np.uint32)),
        uniq_lo=jnp.asarray((uniq & np.uint64(0xFFFFFFFF)).astype(np.uint32)),
    )


def stack_streams(streams: list[Stream]) -> Stream:
    """Pad streams to common shapes and stack them on a leading axis (for vmapping workloads)."""
    Ks = [s.n_keys for s in streams]
    K = max(Ks)
    T = max(s.chunk_ids.shape[0] for s in streams)
    N1 = max(s.arrival_ms.shape[0] for s in streams)
    S1 = max(s.log_leaf.shape[0] for s in streams)
    Wd = {s.chunk_ids.shape[1] for s in streams}
    if len(Wd) != 1:
        raise ValueError("streams must share chunk_blocks")
    out = []
    for s, k in zip(streams, Ks):
        def padv(a, size, v):
            a = np.asarray(a)
            return np.concatenate([a, np.full((size - a.shape[0],) + a.shape[1:], v, a.dtype)])

        def reid(a):  # padding k -> K, singleton k + 1 -> K + 1
            a = np.asarray(a)
            return np.where(a == k, K, np.where(a == k + 1, K + 1, a))

        n1 = s.arrival_ms.shape[0]
        req = np.asarray(s.chunk_req)
        req = np.where(req == n1 - 1, N1 - 1, req)  # padding chunks point at the new dummy row
        out.append(
            Stream(
                chunk_ids=padv(reid(s.chunk_ids), T, K),
                chunk_pos=padv(s.chunk_pos, T, 0),
                chunk_req=padv(req, T, N1 - 1),
                chunk_first=padv(s.chunk_first, T, False),
                chunk_last=padv(s.chunk_last, T, False),
                arrival_ms=padv(s.arrival_ms, N1, 0),
                input_tokens=padv(s.input_tokens, N1, 0),
                output_tokens=padv(s.output_tokens, N1, 0),
                n_blocks=padv(s.n_blocks, N1, 0),
                offset=padv(s.offset, N1, 0),
                key_hi=padv(s.key_hi, S1, 0),
                key_lo=padv(s.key_lo, S1, 0),
                log_leaf=padv(reid(s.log_leaf), S1, K),
                log_plain=padv(reid(s.log_plain), S1, K),
                block_tokens=np.asarray(s.block_tokens),
                input_total=np.asarray(s.input_total),
                n_requests=np.asarray(s.n_requests),
                uniq_hi=padv(s.uniq_hi, K, 0),
                uniq_lo=padv(s.uniq_lo, K, 0),
            )
        )
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *out)


# ---------------------------------------------------------------------------------------------
# Parameters and metrics
# ---------------------------------------------------------------------------------------------


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


class Metrics(NamedTuple):
    token_hit_rate: jax.Array  # float32
    request_hit_rate: jax.Array  # float32
    hit_tokens_hi: jax.Array  # int32 limbs of total hit tokens (see combine_limbs)
    hit_tokens_lo: jax.Array
    requests_hit: jax.Array  # int32
    # Occupancy counts stored blocks. LRU policies evict down to the capacity; TTL policies and
    # ``unbounded`` never evict, so there an expired block stays stored (invisible to lookups)
    # until it is rewritten: for them these count every distinct block ever written.
    max_occupancy: jax.Array  # int32 [R_max]: most blocks stored at once after a request
    occupancy: jax.Array  # int32 [R_max]: blocks stored at the end
    requests_per_replica: jax.Array  # int32 [R_max]
    # load and latency (docs/fleet_semantics.md)
    ttft_p50_ms: jax.Array  # int32 nearest-rank percentiles of time to first token (-1 with queue=False)
    ttft_p90_ms: jax.Array
    ttft_p99_ms: jax.Array
    ttft_mean_ms: jax.Array  # float32
    busy_ms: jax.Array  # int32 [R_max]: prefill + decode time served
    utilisation: jax.Array  # float32 [R_max]: busy_ms / horizon
    load_imbalance: jax.Array  # float32: max / mean busy_ms over active replicas
    prefix_copies: jax.Array  # float32: mean replicas holding a request's whole routing prefix at arrival (NaN unless match)
    overflow_share: jax.Array  # float32: requests sent away from the replica holding most of their prefix (NaN unless match)
    queue_overflow: jax.Array  # int32: dispatches that found every queue slot in flight (loads undercount)
    time_overflow: jax.Array  # bool: a finish time saturated at 2**31 - 1 ms
    # per request (empty arrays unless per_request=True)
    hit_blocks: jax.Array  # int32 [N]
    hit_tokens: jax.Array  # int32 [N]
    replica: jax.Array  # int32 [N]
    ttft_ms: jax.Array  # int32 [N]
    match: jax.Array  # int32 [N, R_max]: the router's view of the prefix match (0 unless match)
    replicas_over_bound: jax.Array  # bool: params asked for more replicas than max_replicas (a bug)


def combine_limbs(hi, lo) -> np.ndarray:
    """Exact int64 totals from the engine's two-limb counters."""
    return (np.asarray(hi).astype(np.int64) << _LIMB) + np.asarray(lo).astype(np.int64)


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


def request_bits(key: jax.Array, n: int) -> jax.Array:
    """uint32 [n, 4]: each request's random words (column 0: the ``random`` router's draw and the
    tie-breaking offset; 1-2: ``power_of_two``; 3: ``kv_cost`` sampling). Pass them to the reference."""
    b0 = jax.random.bits(key, (n,), jnp.uint32)
    rest = jax.random.bits(jax.random.fold_in(key, 1), (n, 3), jnp.uint32)
    return jnp.concatenate([b0[:, None], rest], axis=1)


# ---------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------


class _Carry(NamedTuple):
    # Rows 0..R-1 of the per-replica arrays are the replicas; with approximate indexes, rows
    # R + u * R + r are the index of router instance u for replica r (an LRU on the same lazy
    # machinery: one state array, so each step does one gather and one in-place scatter).
    kv: jax.Array  # int32 [R (+ V), K, F]: (stamp, time[, stamp, time as of the last stale sync])
    occ: jax.Array  # int32 [R]
    ptr: jax.Array  # int32 [R]: stamp threshold (stored iff stamp >= ptr)
    rq: jax.Array  # int32 [R, N + 1]: requests routed to each replica, in order
    cnt: jax.Array  # int32 [R]: how many
    pq: jax.Array  # int32 [R]: eviction pointer: position in rq ...
    poff: jax.Array  # int32 [R]: ... and block within that request
    max_occ: jax.Array  # int32 [R]
    nreq: jax.Array  # int32 [R]
    rep: jax.Array  # int32 current replica
    inst: jax.Array  # int32 current router instance
    hit: jax.Array  # int32 hit blocks so far in the current request
    alive: jax.Array  # bool: leading run still unbroken
    tok_hi: jax.Array
    tok_lo: jax.Array
    req_hit: jax.Array
    # queue model: a ring of the last Q dispatches per replica
    qfin: jax.Array  # int32 [R, Q] finish times
    qblk: jax.Array  # int32 [R, Q] blocks
    qins: jax.Array  # int32 [R, Q] router instance
    qhead: jax.Array  # int32 [R] next slot
    busy: jax.Array  # int32 [R] busy-until time
    busy_ms: jax.Array  # int32 [R]
    qover: jax.Array  # int32
    tover: jax.Array  # bool
    # stale view: sync point
    s_sync: jax.Array  # int32 stamp frontier at the last sync
    ptr_sync: jax.Array  # int32 [R]
    t_sync: jax.Array  # int32
    synced: jax.Array  # bool
    # metrics of routing
    copies: jax.Array  # int32 sum of prefix copies
    copies_n: jax.Array  # int32 sampled requests
    over_n: jax.Array  # int32 requests sent away from their best replica
    over_q: jax.Array  # int32 requests with a cached prefix somewhere
    match_r: jax.Array  # int32 [R] the current request's view match (for per-request output)


_SEGMENTS = 8  # request segments one eviction window may span
_LIM = 2**31 - 1


def _evict(kv, occ, pq, poff, r, cap, leaf_first, stream, rq, cnt, window, do):
    """Evict replica ``r``'s least recent blocks until ``occ <= cap`` (when ``do``).

    Eviction is lazy: a key is stored on a replica iff its stamp is >= the replica's threshold, so
    evicting the least recent block is moving the threshold past its log entry. Each replica walks
    only its own part of the log: ``rq[r]`` lists the requests routed to it, in order (their stamp
    ranges ascend), and the pointer is (``pq``: position in that list, ``poff``: block within the
    request). A window examines ``window`` entries at once across up to ``_SEGMENTS`` requests; the
    first window runs unconditionally (it covers nearly every request), a while loop takes the
    remainder. The state is only read, so under vmap only scalars ride in the loop. A singleton key
    (id K + 1) is live until the pointer passes it (it is written once and never restamped).

    Returns (occ, pq, poff, threshold stamp).
    """
    lane = jnp.arange(window, dtype=jnp.int32)
    seg = jnp.arange(_SEGMENTS, dtype=jnp.int32)
    K = kv.shape[1]
    nq = rq.shape[1]

    def segments(pq, poff):
        q = pq + seg
        ok = q < cnt
        reqs = rq[r, jnp.minimum(q, nq - 1)]
        lens = jnp.where(ok, stream.n_blocks[reqs], 0)
        ends = jnp.cumsum(lens) - poff  # exclusive end of each segment, in lanes from the pointer
        starts = ends - lens
        return reqs, ends, starts

    def one_window(occ, pq, poff):
        reqs, ends, starts = segments(pq, poff)
        sidx = jnp.sum(ends[None, :] <= lane[:, None], axis=1)  # segment of each lane
        valid = sidx < _SEGMENTS
        sc = jnp.minimum(sidx, _SEGMENTS - 1)
        idx = stream.offset[reqs[sc]] + lane - starts[sc]
        safe = jnp.clip(idx, 0, stream.log_leaf.shape[0] - 1)
        k = jnp.where(leaf_first, stream.log_leaf[safe], stream.log_plain[safe])
        k = jnp.where(valid, k, K)
        stamp = kv.at[r, k, 0] if kv.ndim == 3 else kv.at[r, k]
        live = valid & ((stamp.get(mode="fill", fill_value=-1) == idx) | (k == K + 1))
        cum = jnp.cumsum(live.astype(jnp.int32))
        need = jnp.maximum(occ - cap, 0)
        got = cum[-1]
        span = jnp.clip(ends[-1], 0, window)  # entries this window could see
        adv = jnp.where(got >= need, jnp.argmax(cum >= need).astype(jnp.int32) + 1, span)
        adv = jnp.where(need > 0, adv, 0)
        # the pointer moves ``adv`` entries: find its segment (skipping empty ones)
        s_new = jnp.sum(ends <= adv)
        poff_new = jnp.where(s_new < _SEGMENTS, adv - starts[jnp.minimum(s_new, _SEGMENTS - 1)], 0)
        # (segments past the list's end have length 0: never step beyond it)
        return occ - jnp.minimum(need, got), jnp.minimum(pq + s_new, cnt), poff_new

    o2, q2, f2 = one_window(occ, pq, poff)
    occ, pq, poff = jnp.where(do, o2, occ), jnp.where(do, q2, pq), jnp.where(do, f2, poff)

    def cond(c):
        occ, pq, _ = c
        return do & (occ > cap) & (pq < cnt)

    occ, pq, poff = jax.lax.while_loop(cond, lambda c: one_window(*c), (occ, pq, poff))
    last = rq[r, jnp.clip(cnt - 1, 0, nq - 1)]
    frontier = stream.offset[last] + stream.n_blocks[last]
    at = rq[r, jnp.minimum(pq, nq - 1)]
    thr = jnp.where(pq < cnt, stream.offset[at] + poff, frontier)
    return occ, pq, poff, thr


def _sat_add(a, b):
    """a + b for non-negative int32, saturating at 2**31 - 1; returns (sum, saturated)."""
    over = a > _LIM - b
    return jnp.where(over, _LIM, a + b), over


def _ms_of(units, per, scale):
    """``ceil(units * scale / per)`` exactly in int32 (``per`` >= 1; ``units``, result saturate).

    Used as ``prefill_ms = ceil(tokens * 1000 / tps)`` and ``decode_ms = ceil(out * us / 1000)``."""
    q, rem = units // per, units % per
    big = q > (_LIM - scale) // jnp.maximum(scale, 1)
    head = jnp.where(big, _LIM - scale, q * scale)
    return head + (rem * scale + per - 1) // per, big


class _Static(NamedTuple):
    max_replicas: int
    max_instances: int
    queue_slots: int
    match: bool  # compute per-replica prefix matches (cache-reading routers, overflow_share)
    index: bool  # keep approximate indexes
    stale: bool  # keep the as-of-sync fields
    max_vnodes: int
    per_request: bool
    window: int
    routers: tuple  # router ids compiled into the program (a grid may only use these)
    queue: bool = True  # model the replicas' queues (loads, TTFT); off: hit rates only, faster


def _simulate(stream: Stream, params: Params, key, st: _Static):
    Kn = stream.n_keys
    PAD, SINGLE = Kn, Kn + 1
    R = st.max_replicas
    Q = st.queue_slots
    F = 4 if st.stale else 2
    V = st.max_instances * R if st.index else 0
    RV = R + V
    N1 = stream.arrival_ms.shape[0]
    kv0 = jnp.stack([jnp.full((RV, Kn), -1, jnp.int32), jnp.zeros((RV, Kn), jnp.int32)]
                    + ([jnp.full((RV, Kn), -1, jnp.int32), jnp.zeros((RV, Kn), jnp.int32)] if st.stale else []), axis=-1)
    zR = jnp.zeros(R, jnp.int32)
    zV = jnp.zeros(RV, jnp.int32)
    carry = _Carry(
        kv=kv0, occ=zV, ptr=zV, rq=jnp.zeros((RV, N1), jnp.int32), cnt=zV, pq=zV, poff=zV, max_occ=zR, nreq=zR,
        rep=jnp.int32(0), inst=jnp.int32(0), hit=jnp.int32(0), alive=jnp.bool_(True),
        tok_hi=jnp.int32(0), tok_lo=jnp.int32(0), req_hit=jnp.int32(0),
        qfin=jnp.zeros((R, Q), jnp.int32), qblk=jnp.zeros((R, Q), jnp.int32), qins=jnp.zeros((R, Q), jnp.int32),
        qhead=zR, busy=zR, busy_ms=zR, qover=jnp.int32(0), tover=jnp.bool_(False),
        s_sync=jnp.int32(0), ptr_sync=zR, t_sync=jnp.int32(0), synced=jnp.bool_(False),
        copies=jnp.int32(0), copies_n=jnp.int32(0), over_n=jnp.int32(0), over_q=jnp.int32(0), match_r=zR,
    )
    replicas = jnp.clip(params.replicas, 1, R).astype(jnp.int32)
    instances = jnp.clip(params.instances, 1, st.max_instances).astype(jnp.int32)
    ridx = jnp.arange(R, dtype=jnp.int32)
    active = ridx < replicas
    bt = stream.block_tokens
    bits = request_bits(key, N1)  # per-request random words, drawn once outside the scan
    ring = ring_positions(R, st.max_vnodes)
    ttl = params.ttl_ms
    Wp = stream.chunk_ids.shape[1]
    plane = jnp.arange(Wp, dtype=jnp.int32)

    def present_true(kv, ptr, ids, now):
        g = kv.at[ridx[:, None], ids[None, :]].get(mode="fill", fill_value=-1)  # [R, W, F]
        return (g[..., 0] >= ptr[:R, None]) & ((now - g[..., 1]) <= ttl), g

    def probe(c: _Carry, req, n, now, u):
        """Leading-run matches over all replicas: (precise [R], view [R])."""
        base = stream.offset[req]
        vbase = R + u * R

        def cond(s):
            j, mt, mv, at, av = s
            return (j < n) & (jnp.any(at) | jnp.any(av))

        def body(s):
            j, mt, mv, at, av = s
            pos = j + plane
            okl = pos < n
            ids = jnp.where(okl, stream.log_plain[jnp.minimum(base + pos, stream.log_plain.shape[0] - 1)], PAD)
            pt, g = present_true(c.kv, c.ptr, ids, now)  # rows 0..R-1
            pv = pt
            if st.stale:
                cur = g[..., 0] < c.s_sync
                s_st = jnp.where(cur, g[..., 0], g[..., 2])
                s_t = jnp.where(cur, g[..., 1], g[..., 3])
                ps = (s_st >= c.ptr_sync[:, None]) & ((now - s_t) <= ttl)
                pv = jnp.where(params.view == 2, ps, pv)
            if st.index:
                gi = c.kv.at[vbase + ridx[:, None], ids[None, :], 0].get(mode="fill", fill_value=-1)
                pi = gi >= c.ptr[vbase + ridx][:, None]
                pv = jnp.where(params.view == 1, pi, pv)
            okr = okl[None, :]

            def adv(m, a, p):
                run = jnp.cumprod((p | ~okr).astype(jnp.int32), axis=1) * a[:, None].astype(jnp.int32)
                return m + jnp.sum(run * okr.astype(jnp.int32), axis=1), a & jnp.all(p | ~okr, axis=1)

            mt, at = adv(mt, at, pt)
            mv, av = adv(mv, av, pv)
            return j + Wp, mt, mv, at, av

        zero = jnp.zeros(R, jnp.int32)
        init = (jnp.int32(0), zero, zero, active, active)
        _, mt, mv, _, _ = jax.lax.while_loop(cond, body, init)
        return mt, mv

    def step(c: _Carry, x):
        ids, pos, req, first, last = x
        n = stream.n_blocks[req]
        now = stream.arrival_ms[req]
        base = stream.offset[req]
        u = jnp.where(first, jnp.mod(req, instances), c.inst)
        # ---- stale sync (before routing)
        if st.stale:
            sync = first & ((~c.synced) | (now - c.t_sync >= params.stale_lag_ms))
            s_sync = jnp.where(sync, base, c.s_sync)
            ptr_sync = jnp.where(sync, c.ptr[:R], c.ptr_sync)
            t_sync = jnp.where(sync, now, c.t_sync)
            synced = c.synced | sync
        else:
            s_sync, ptr_sync, t_sync, synced = c.s_sync, c.ptr_sync, c.t_sync, c.synced
        c = c._replace(s_sync=s_sync, ptr_sync=ptr_sync, t_sync=t_sync, synced=synced)
        # ---- loads at arrival
        if st.queue:
            infl = (c.qfin > now) & ((~params.local_load) | (c.qins == u))
            queue = jnp.sum(infl.astype(jnp.int32), axis=1)
            act_blocks = jnp.sum(jnp.where(infl, c.qblk, 0), axis=1)
        else:
            queue = act_blocks = jnp.zeros(R, jnp.int32)
        # ---- prefix matches (first chunk; a while loop that stops when every run has ended)
        if st.match:
            mt, mv = probe(c, req, jnp.where(first, n, 0), now, u)
        else:
            mt = mv = jnp.zeros(R, jnp.int32)
        tree = c.occ[:R]
        if st.index:
            tree = jnp.where(params.view == 1, c.occ[R + u * R + ridx], tree)
        # ---- prefix copies: replicas whose leading run covers the routing prefix (no extra gather:
        # a second read of the state before its scatter makes XLA copy the whole state every step)
        kpos = base + jnp.clip(jnp.minimum(params.prefix_blocks, n) - 1, 0, None)
        copies_i = jnp.sum((active & (mt >= jnp.minimum(params.prefix_blocks, n))).astype(jnp.int32))
        sample = first & (n > 0) & (req < stream.n_requests)
        # ---- route
        rv = RequestView(
            index=req, arrival_ms=now, n_blocks=n,
            prefix_hi=jnp.where(n > 0, stream.key_hi[kpos], jnp.uint32(0)),
            prefix_lo=jnp.where(n > 0, stream.key_lo[kpos], jnp.uint32(0)),
            bits=bits[req], instance=u,
        )
        fv = FleetView(replicas=replicas, match=mv, queue=queue, active_blocks=act_blocks, tree_size=tree)
        chosen = route(params.router, rv, fv, params, ring, compiled=st.routers)
        r = jnp.where(first, chosen, c.rep)
        mbest = jnp.max(jnp.where(active, mt, 0))
        qual = first & (req < stream.n_requests) & (mbest > 0) & jnp.bool_(st.match)
        over_q = c.over_q + qual.astype(jnp.int32)
        over_n = c.over_n + (qual & (mt[jnp.clip(chosen, 0, R - 1)] < mbest)).astype(jnp.int32)
        copies = c.copies + jnp.where(sample, copies_i, 0)
        copies_n = c.copies_n + sample.astype(jnp.int32)
        match_r = jnp.where(first, mv, c.match_r)
        # ---- lookup (row r) and the approximate index of (instance u, replica r) (row R + u R + r)
        valid = ids != PAD
        rows = jnp.stack([r, R + u * R + r]) if st.index else r[None]
        # one gather and one scatter of every per-key field of both rows: with separate arrays XLA
        # copies the whole state on every step (the writes of one depend on reads of the other)
        if st.index:
            gall = c.kv.at[rows[:, None], ids[None, :]].get(mode="fill", fill_value=-1)  # [2, W, F]
        else:  # scalar row: a plain dynamic gather (an index-array gather is slower under vmap)
            gall = c.kv.at[r, ids].get(mode="fill", fill_value=-1)[None]
        got = gall[0]
        stt, tt = got[:, 0], got[:, 1]
        stored = stt >= c.ptr[r]  # lazy eviction: stamps below the pointer are gone
        present = valid & stored & ((now - tt) <= ttl)
        alive0 = jnp.where(first, True, c.alive)
        ok = present | ~valid
        run = jnp.cumprod(ok.astype(jnp.int32)) * alive0.astype(jnp.int32)
        hit = jnp.where(first, 0, c.hit) + jnp.sum(run * valid.astype(jnp.int32))
        alive = alive0 & jnp.all(ok)
        # ---- restamp and write
        leaf_st = base + n - 1 - pos
        new_st = jnp.where(params.leaf_first, leaf_st, base + pos)
        new_t = jnp.where(params.refresh | ~present, now, tt)
        fields = [new_st, new_t]
        if st.stale:
            keep = stt < s_sync  # the old value is the as-of-sync value
            fields += [jnp.where(keep, stt, got[:, 2]), jnp.where(keep, tt, got[:, 3])]
        vals = jnp.stack(fields, axis=-1)[None]
        if st.index:  # the index row: leaf-first stamps, no clock
            vals = jnp.concatenate([vals, jnp.stack([leaf_st] + [jnp.zeros_like(leaf_st)] * (F - 1), axis=-1)[None]])
        tgt = jnp.where(ids < Kn, ids, Kn)
        nq = c.rq.shape[1]
        if st.index:
            kv = c.kv.at[rows[:, None], tgt[None, :]].set(vals, mode="drop")
            new_blocks = jnp.sum((valid[None, :] & ~(gall[..., 0] >= c.ptr[rows][:, None])).astype(jnp.int32), axis=1)
            # ---- the rows' request lists (first chunk), then eviction (last chunk)
            rq = c.rq.at[rows, jnp.where(first, c.cnt[rows], nq)].set(req, mode="drop")
            cnt = c.cnt.at[rows].add(first.astype(jnp.int32))
            occ = c.occ.at[rows].add(new_blocks)
        else:
            kv = c.kv.at[r, tgt].set(vals[0], mode="drop")
            rq = c.rq.at[r, jnp.where(first, c.cnt[r], nq)].set(req, mode="drop")
            cnt = c.cnt.at[r].add(first.astype(jnp.int32))
            occ = c.occ.at[r].add(jnp.sum((valid & ~stored).astype(jnp.int32)))
        ptr, pq, poff = c.ptr, c.pq, c.poff
        occ_r = occ[r]
        pinned = jnp.sum(jnp.where(c.qfin[r] > now, c.qblk[r], 0)) if st.queue else 0  # r's in-flight blocks
        cap_r = jnp.where(params.kv_pressure, jnp.maximum(params.capacity - pinned, 0), params.capacity)
        for k in range(rows.shape[0]):
            row = rows[k]
            cap_k = cap_r if k == 0 else params.index_capacity
            lf_k = params.leaf_first if k == 0 else jnp.bool_(True)
            o_k, pq_k, poff_k, ptr_k = _evict(kv, occ[row], pq[row], poff[row], row, cap_k, lf_k, stream, rq,
                                              cnt[row], st.window, last)
            occ, pq, poff, ptr = occ.at[row].set(o_k), pq.at[row].set(pq_k), poff.at[row].set(poff_k), ptr.at[row].set(ptr_k)
            if k == 0:
                occ_r = o_k
        # ---- metrics
        real = last & (req < stream.n_requests)
        inp = stream.input_tokens[req]
        # min(hit * bt, input) without overflowing int32: past input // bt full blocks it is input
        hit_tok = jnp.where(hit > inp // bt, inp, hit * bt)
        add = jnp.where(real, hit_tok, 0)
        mask = (1 << _LIMB) - 1
        lo = c.tok_lo + (add & mask)  # < 2**21: no overflow
        tok_hi = c.tok_hi + (add >> _LIMB) + (lo >> _LIMB)
        lo = lo & mask
        max_occ = c.max_occ.at[r].max(jnp.where(last, occ_r, 0))
        nreq = c.nreq.at[r].add(real.astype(jnp.int32))
        req_hit = c.req_hit + (real & (hit > 0)).astype(jnp.int32)
        # ---- the queue (last chunk): FCFS, prefill of the uncached tokens, decode share
        if st.queue:
            pre_ms, o1 = _ms_of(inp - hit_tok, params.prefill_tps, jnp.int32(1000))
            dec_ms, o2 = _ms_of(stream.output_tokens[req], jnp.int32(1000), params.decode_us_per_token)
            start = jnp.maximum(now, c.busy[r])
            svc, o3 = _sat_add(pre_ms, dec_ms)
            fin, o4 = _sat_add(start, svc)
            ttft, o5 = _sat_add(start - now, pre_ms)
            head = c.qhead[r]
            qover = c.qover + (real & (c.qfin[r, head] > now)).astype(jnp.int32)
            slot = jnp.where(real, head, Q)
            qfin = c.qfin.at[r, slot].set(fin, mode="drop")
            qblk = c.qblk.at[r, slot].set(n, mode="drop")
            qins = c.qins.at[r, slot].set(u, mode="drop")
            qhead = c.qhead.at[r].set(jnp.where(real, jnp.mod(head + 1, Q), head))
            busy = c.busy.at[r].set(jnp.where(real, fin, c.busy[r]))
            bms, o6 = _sat_add(c.busy_ms[r], svc)
            busy_ms = c.busy_ms.at[r].set(jnp.where(real, bms, c.busy_ms[r]))
            tover = c.tover | (real & (o1 | o2 | o3 | o4 | o5 | o6))
        else:
            qfin, qblk, qins, qhead, busy, busy_ms, qover, tover = (c.qfin, c.qblk, c.qins, c.qhead, c.busy,
                                                                   c.busy_ms, c.qover, c.tover)
            ttft = jnp.int32(0)
        c = _Carry(
            kv, occ, ptr, rq, cnt, pq, poff, max_occ, nreq, r, u, hit, alive, tok_hi, lo, req_hit,
            qfin, qblk, qins, qhead, busy, busy_ms, qover, tover,
            s_sync, ptr_sync, t_sync, synced, copies, copies_n, over_n, over_q, match_r,
        )
        out = (ttft,) + ((hit, hit_tok, r, match_r) if st.per_request else ())
        return c, out

    xs = (stream.chunk_ids, stream.chunk_pos, stream.chunk_req, stream.chunk_first, stream.chunk_last)
    c, out = jax.lax.scan(step, carry, xs)
    nreal = stream.n_requests
    nr = jnp.maximum(nreal, 1).astype(jnp.float32)
    tot = c.tok_hi.astype(jnp.float32) * float(1 << _LIMB) + c.tok_lo.astype(jnp.float32)
    last_idx = _last_chunk_index(stream)
    ttft_req = out[0][last_idx]
    is_real = jnp.arange(N1 - 1) < nreal
    srt = jnp.sort(jnp.where(is_real, ttft_req, _LIM))

    def pct(p):
        if not st.queue:
            return jnp.int32(-1)
        k = jnp.clip((p * nreal + 99) // 100 - 1, 0, max(N1 - 2, 0))
        return jnp.where(nreal > 0, srt[k] if N1 > 1 else 0, 0).astype(jnp.int32)

    ttft_mean = jnp.sum(jnp.where(is_real, ttft_req, 0).astype(jnp.float32)) / nr
    first_arr = stream.arrival_ms[0]
    last_arr = stream.arrival_ms[jnp.maximum(nreal - 1, 0)]
    horizon = jnp.maximum(jnp.maximum(jnp.max(c.busy), last_arr) - first_arr, 1).astype(jnp.float32)
    bms = c.busy_ms.astype(jnp.float32)
    mean_b = jnp.sum(jnp.where(active, bms, 0.0)) / replicas.astype(jnp.float32)
    imb = jnp.where(mean_b > 0, jnp.max(jnp.where(active, bms, 0.0)) / jnp.maximum(mean_b, 1e-30), 1.0)
    if st.per_request:
        hit_blocks, hit_tokens, rep, mreq = (o[last_idx] for o in out[1:])
        ttft_ms = ttft_req
    else:
        hit_blocks = hit_tokens = rep = ttft_ms = jnp.zeros((0,), jnp.int32)
        mreq = jnp.zeros((0, R), jnp.int32)
    return Metrics(
        token_hit_rate=jnp.where(stream.input_total > 0, tot / jnp.maximum(stream.input_total, 1.0), 0.0),
        request_hit_rate=c.req_hit.astype(jnp.float32) / nr,
        hit_tokens_hi=c.tok_hi,
        hit_tokens_lo=c.tok_lo,
        requests_hit=c.req_hit,
        max_occupancy=c.max_occ,
        occupancy=c.occ[:R],
        requests_per_replica=c.nreq,
        ttft_p50_ms=pct(50),
        ttft_p90_ms=pct(90),
        ttft_p99_ms=pct(99),
        ttft_mean_ms=ttft_mean if st.queue else jnp.float32(jnp.nan),
        busy_ms=c.busy_ms,
        utilisation=bms / horizon,
        load_imbalance=imb.astype(jnp.float32) if st.queue else jnp.float32(jnp.nan),
        prefix_copies=(c.copies.astype(jnp.float32) / jnp.maximum(c.copies_n, 1).astype(jnp.float32)
                       if st.match else jnp.float32(jnp.nan)),
        overflow_share=(c.over_n.astype(jnp.float32) / jnp.maximum(c.over_q, 1).astype(jnp.float32)
                        if st.match else jnp.float32(jnp.nan)),
        queue_overflow=c.qover,
        time_overflow=c.tover,
        hit_blocks=hit_blocks,
        hit_tokens=hit_tokens,
        replica=rep,
        ttft_ms=ttft_ms,
        match=mreq,
        replicas_over_bound=(params.replicas > R) | (params.replicas < 1),
    )


def _last_chunk_index(stream: Stream):
    # index of the last chunk of each real request: chunks are grouped by request in order
    last = stream.chunk_last
    idx = jnp.nonzero(last, size=stream.arrival_ms.shape[0] - 1, fill_value=0)[0]
    return idx


@partial(jax.jit, static_argnames=("st",))
def _simulate_jit(stream, params, key, *, st):
    return _simulate(stream, params, key, st)


@partial(jax.jit, static_argnames=("st", "stream_axis"))
def _simulate_grid_jit(stream, params, keys, *, st, stream_axis):
    fn = partial(_simulate, st=st)
    return jax.vmap(fn, in_axes=(0 if stream_axis else None, 0, 0))(stream, params, keys)


def static_options(
    params: Params,
    *,
    max_replicas: int = 1,
    max_instances: int | None = None,
    queue_slots: int = 64,
    match: bool | None = None,
    index: bool | None = None,
    stale: bool | None = None,
    max_vnodes: int = 128,
    per_request: bool = False,
    window: int | None = None,
    routers_compiled=None,
    queue: bool = True,
) -> _Static:
    """The static shape options of a run, with ``None`` resolved from the (concrete) params.

    ``match``: compute every replica's prefix match per request (needed by the cache-reading
    routers and for ``overflow_share``; default: when a cache-reading router is in the grid);
    ``index``: keep the approximate indexes (default: when a cache router uses view ``approximate``);
    ``stale``: keep the as-of-sync fields (default: when view ``stale`` is used); ``max_instances``:
    router instances bound (default: the largest in the grid); ``queue_slots``: in-flight requests
    tracked per replica; ``max_vnodes``: the chwbl ring's bound; ``routers_compiled``: the router
    rules built into the program (default: those in the grid; fewer rules compile faster); ``queue``:
    model the replicas' queues (loads and TTFT); ``False`` gives hit rates only, faster per step
    (TTFT percentiles -1, TTFT mean and load imbalance NaN; routers that read load are refused).
    """
    concrete = not isinstance(params.router, jax.core.Tracer)
    if concrete:
        routers = np.asarray(params.router).reshape(-1)
        views = np.asarray(params.view).reshape(-1)
        cache = np.isin(routers, [ROUTERS[n] for n in CACHE_ROUTERS])
        if match is None:
            match = bool(cache.any())
        if index is None:
            index = bool(match and (cache & (views == VIEWS["approximate"])).any())
        if stale is None:
            stale = bool(match and (cache & (views == VIEWS["stale"])).any())
        if max_instances is None:
            max_instances = int(np.max(np.asarray(params.instances)))
        compiled = tuple(sorted({int(x) for x in routers}))
    else:
        compiled = tuple(ROUTERS.values())
        match = bool(match) if match is not None else True
        index = bool(index) if index is not None else False
        stale = bool(stale) if stale is not None else False
        max_instances = 1 if max_instances is None else max_instances
    if queue_slots < 1 or max_vnodes < 1 or max_instances < 1:
        raise ValueError("queue_slots, max_vnodes and max_instances must be >= 1")
    window = default_window() if window is None else int(window)
    if routers_compiled is not None:
        compiled = tuple(sorted({router_id(r) if isinstance(r, str) else int(r) for r in routers_compiled}))
    return _Static(int(max_replicas), int(max_instances), int(queue_slots), bool(match), bool(index), bool(stale),
                   int(max_vnodes), bool(per_request), window, compiled, bool(queue))


def simulate(
    stream: Stream,
    params: Params,
    key: jax.Array,
    *,
    max_replicas: int = 1,
    per_request: bool = True,
    window: int | None = None,
    **options,
) -> Metrics:
    """Run one configuration over the stream (jit-compiled). ``key``: a PRNG key (random words per
    request, :func:`request_bits`).

    ``max_replicas`` is the static bound on replicas; ``per_request`` adds per-request arrays;
    ``window`` is how many log entries one eviction step examines (a speed knob, never a result);
    ``options``: the other static options of :func:`static_options`.
    """
    st = static_options(params, max_replicas=max_replicas, per_request=per_request, window=window, **options)
    check_bounds(params, max_replicas, st)
    return _simulate_jit(stream, params, key, st=st)


def simulate_grid(
    stream: Stream,
    params: Params,
    keys: jax.Array,
    *,
    max_replicas: int = 1,
    per_request: bool = False,
    window: int | None = None,
    stream_axis: bool = False,
    **options,
) -> Metrics:
    """Vmapped :func:`simulate` over a grid: ``params`` fields [G], ``keys`` [G] PRNG keys.

    With ``stream_axis=True`` the stream is stacked too (:func:`stack_streams`, leading axis [G]),
    so several workloads (seeds, layouts) run in the same program.
    """
    st = static_options(params, max_replicas=max_replicas, per_request=per_request, window=window, **options)
    check_bounds(params, max_replicas, st)
    return _simulate_grid_jit(stream, params, keys, st=st, stream_axis=stream_axis)


def default_window() -> int:
    """Log entries one eviction step examines: small on CPUs (work is serial), wide on accelerators
    (each while-loop iteration costs a device round trip; a wide window needs fewer). Never a result."""
    return 64 if jax.default_backend() == "cpu" else 1024


def check_bounds(params: Params, max_replicas: int, st: _Static | None = None) -> None:
    """Raise if a configuration does not fit the static bounds (never clip silently): more replicas
    than ``max_replicas``; with the static options ``st``, more router instances or vnodes than their
    bounds, or a router/view whose state the options leave out (``match``, ``index``, ``stale``).

    Under an outer trace (params are tracers) the check moves into the metrics: ``replicas_over_bound``.
    """
    if max_replicas < 1:
        raise ValueError("max_replicas must be >= 1")
    if isinstance(params.replicas, jax.core.Tracer):
        return
    r = np.asarray(params.replicas)
    if np.any(r > max_replicas) or np.any(r < 1):
        raise ValueError(f"replicas {np.unique(r).tolist()} outside [1, max_replicas={max_replicas}]")
    if st is None:
        return
    if np.any(np.asarray(params.instances) > st.max_instances):
        raise ValueError(f"instances {np.unique(np.asarray(params.instances)).tolist()} above max_instances={st.max_instances}")
    if np.any(np.asarray(params.vnodes) > st.max_vnodes):
        raise ValueError(f"vnodes above max_vnodes={st.max_vnodes}")
    routers = np.asarray(params.router).reshape(-1)
    missing = sorted(set(int(x) for x in routers) - set(st.routers))
    if missing:
        names = [n for n, i in ROUTERS.items() if i in missing]
        raise ValueError(f"routers {names} are not compiled into this program (routers_compiled)")
    load_free = {ROUTERS[n] for n in ("random", "round_robin", "prefix_hash")}
    if not st.queue and (set(int(x) for x in routers) - load_free or np.any(np.asarray(params.kv_pressure))):
        raise ValueError("routers that read load and kv_pressure need queue=True")
    views = np.broadcast_to(np.asarray(params.view), np.shape(np.asarray(params.router))).reshape(-1)
    cache = np.isin(routers, [ROUTERS[n] for n in CACHE_ROUTERS])
    if cache.any() and not st.match:
        raise ValueError("a cache-reading router needs match=True")
    if (cache & (views == VIEWS["approximate"])).any() and not st.index:
        raise ValueError("view 'approximate' needs index=True")
    if (cache & (views == VIEWS["stale"])).any() and not st.stale:
        raise ValueError("view 'stale' needs stale=True")

"""Routers: which replica serves a request, from what the router knows.

A router is a pure function ``route(router_id, req, fleet, params) -> replica`` evaluated inside the
engine's ``lax.scan`` once per request (at its first chunk). Everything it reads is integer, so every
decision is reproduced exactly by the plain-Python reference (``tests/reference.py``).

What a router sees
------------------
``req`` (:class:`RequestView`): request index ``i``, arrival time, ``n`` = number of blocks, the 64-bit
key of block ``min(prefix_blocks, n) - 1`` (chained keys: it names the first ``prefix_blocks``
blocks), four uint32 random words drawn before the scan (``bits``; ``request_bits`` in the engine), and
the router *instance* ``u = i mod instances`` that handles it.

``fleet`` (:class:`FleetView`), per replica ``r < R`` (``R`` = active replicas):

``match[r]``         blocks of the request's leading run found in the router's *view* of replica
                     ``r`` (``params.view``):
                     ``precise`` (0): the replica's true cache at arrival (KV events, no delay);
                     ``approximate`` (1): instance ``u``'s own index of replica ``r``, built only from
                     its own routing decisions: every block of each request it sends to ``r`` is
                     touched leaf-first, LRU-evicted beyond ``index_capacity`` blocks (llm-d's
                     approximate prefix index; SGLang's radix tree of routed text);
                     ``stale`` (2): the true cache as it was at the last *sync*; a sync happens before
                     routing request ``i`` when ``i == 0`` or ``arrival - last_sync >= stale_lag_ms``
                     (KV events delivered in batches every ``stale_lag_ms``), TTL checked at arrival
                     against the block's time as of the sync.
``queue[r]``         requests in flight on ``r`` at arrival (dispatched earlier, finish time > arrival;
                     see the queue model in :mod:`cacheresearch.engine`); with ``local_load`` only
                     those dispatched by instance ``u`` (router instances that do not share load).
``active_blocks[r]`` sum of the block counts of those in-flight requests.
``tree_size[r]``     blocks in the view: the index's occupancy (approximate) or the replica's
                     true occupancy (precise, stale).

Tie-breaking: ``off = floor(bits[0] * R / 2**32)``; ``argmin_rot(v)`` is the ``r`` minimising
``(v[r], (r - off) mod R)`` and ``argmax_rot(v)`` the one maximising ``v[r]``, ties the same way
(a uniformly random replica among the tied ones, reproducible).

The routers (``params`` fields in brackets; the projects' published defaults in :data:`PRESETS`)
-----------------------------------------------------------------------------------------------
``random``            ``floor(bits[0] * R / 2**32)``.
``round_robin``       ``i mod R``.
``prefix_hash``       ``mix32(prefix key) mod R`` [``prefix_blocks``].
``least_loaded``      ``argmin_rot(queue)``.
``power_of_two``      ``a = floor(bits[1] R / 2**32)``, ``b = (a + 1 + floor(bits[2] (R-1) / 2**32)) mod R``
                      (``b = a`` when ``R = 1``); ``b`` if ``queue[b] < queue[a]`` else ``a``.
``chwbl``             consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018; KubeAI,
                      HAProxy) [``vnodes``, ``chwbl_c_pct``]: ring nodes ``(r, v)`` for ``r < R``,
                      ``v < vnodes`` at ``mix32(r, v)``; the key's point is ``mix32(prefix key)``;
                      ``cap = ceil(c_pct * (sum(queue) + 1) / (100 R))``; the node reached first walking
                      clockwise (smallest ``(node - point) mod 2**32``, ties by ``(r, v)``) among replicas
                      with ``queue[r] < cap``. After assignment no replica holds more than ``cap``.
``cache_aware``       SGLang router [``balance_abs``, ``balance_rel_pct``, ``cache_threshold_pm``,
                      ``miss_smallest_tree``]: if ``max(queue) - min(queue) > balance_abs`` and
                      ``100 max(queue) > balance_rel_pct min(queue)``: ``argmin_rot(queue)``; else
                      ``b = argmax_rot(match)``; if ``1000 match[b] > cache_threshold_pm * n``: ``b``;
                      else ``argmin_rot(tree_size)`` when ``miss_smallest_tree`` (older releases: the
                      "death spiral" of sglang PR 14305), otherwise ``argmin_rot(queue)``.
``kv_cost``           NVIDIA Dynamo KV router [``overlap_weight_pct``, ``temperature``]:
                      ``cost[r] = overlap_weight_pct * (n - match[r]) + 100 * active_blocks[r]`` (integers,
                      each term clamped to ``2**30``); temperature 0: ``argmin_rot(cost)``; temperature
                      ``t > 0``: sample ``softmax(-(cost - min) / max(max - min, 1) / t)`` (float32) with
                      ``u = (bits[3] >> 8) / 2**24``: the first ``r`` whose cumulative probability exceeds
                      ``u`` (the last active replica if rounding leaves none).
``weighted_scorers``  llm-d / Gateway API Inference Extension [``prefix_weight_pct``, ``load_weight_pct``,
                      ``queue_threshold``]: ``prefix = floor(1024 match[r] / n)`` (0 when ``n = 0``),
                      ``load = floor(512 (T - min(queue[r], T)) / T)`` (0.5 at an empty queue falling to 0
                      at ``T``), score ``prefix_weight_pct * prefix + load_weight_pct * load``;
                      ``argmax_rot(score)`` (max wins, ties random). Scores are quantised to 1/1024.
``preble_e2``         Preble E2 (arXiv 2407.00023) [``preble_rel_pct``, ``preble_abs``]: if ``100 max(queue) >
                      preble_rel_pct min(queue)`` and ``max(queue) - min(queue) > preble_abs``:
                      ``argmin_rot(queue)`` (rebalance); else with ``m* = max(match)``: if ``m* > 0`` and
                      ``n - m* < m*`` exploit: ``argmin_rot(active_blocks)`` over replicas with
                      ``match[r] = m*``; else explore: ``argmin_rot(active_blocks + n - match)`` (load plus
                      this request's prefill, both in blocks).

The router id and every knob are dynamic parameters, so a grid over routers and knobs is one compiled
program. All routers are evaluated and the chosen one selected: each is O(R) integer work (``chwbl``
O(R x vnodes)), cheaper than a conditional per step and identical under vmap.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "ROUTERS",
    "VIEWS",
    "PRESETS",
    "CACHE_ROUTERS",
    "router_id",
    "view_id",
    "route",
    "prefix_hash_u64",
    "mix32",
    "RequestView",
    "FleetView",
    "ring_positions",
]

ROUTERS: dict[str, int] = {
    "random": 0,
    "round_robin": 1,
    "prefix_hash": 2,
    "least_loaded": 3,
    "power_of_two": 4,
    "chwbl": 5,
    "cache_aware": 6,
    "kv_cost": 7,
    "weighted_scorers": 8,
    "preble_e2": 9,
}
#: routers that read ``match`` (need the engine's per-replica prefix match)
CACHE_ROUTERS = ("cache_aware", "kv_cost", "weighted_scorers", "preble_e2")
VIEWS: dict[str, int] = {"precise": 0, "approximate": 1, "stale": 2}

#: Router knobs and their defaults (the values ``make_params`` uses unless a preset or the caller
#: overrides them). Units are integers so that decisions are exact: ``_pct`` = hundredths,
#: ``_pm`` = thousandths.
ROUTER_DEFAULTS: dict = dict(
    prefix_blocks=80,
    view="precise",
    stale_lag_ms=1000,
    instances=1,
    local_load=False,
    index_capacity=2**31 - 1,
    vnodes=100,
    chwbl_c_pct=125,
    cache_threshold_pm=300,
    balance_abs=64,
    balance_rel_pct=150,
    miss_smallest_tree=False,
    overlap_weight_pct=100,
    temperature=0.0,
    prefix_weight_pct=200,
    load_weight_pct=100,
    queue_threshold=128,
    preble_rel_pct=150,
    preble_abs=8,
    # not a router knob: in-flight requests pin their blocks (vLLM never evicts blocks in use), so a
    # replica's cache keeps at most capacity - (blocks of its in-flight requests); see the engine
    kv_pressure=False,
)

#: Named presets: the projects' published defaults (source in ``source``). ``router`` names the rule;
#: every other key overrides :data:`ROUTER_DEFAULTS`. A preset name can be used wherever a router
#: name is accepted.
PRESETS: dict[str, dict] = {
    "sglang_cache_aware": dict(
        router="cache_aware", view="approximate", cache_threshold_pm=300, balance_abs=64, balance_rel_pct=150,
        # max_tree_size 2**26 characters (~16.7M tokens at 4 characters per token): unbounded here
        index_capacity=2**31 - 1,
        source="sgl-model-gateway src/policies/cache_aware.rs CLI defaults: cache_threshold 0.3, "
        "balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2^26",
    ),
    "sglang_cache_aware_old": dict(
        router="cache_aware", view="approximate", miss_smallest_tree=True,
        source="older sglang router: a miss goes to the smallest tree regardless of load (sglang PR 14305)",
    ),
    "llmd_precise": dict(
        router="weighted_scorers", view="precise", prefix_weight_pct=200, load_weight_pct=100, queue_threshold=128,
        source="llm-d inference scheduler sample weights prefix 2.0, load 1.0; queue threshold 128; KV events",
    ),
    "llmd_approximate": dict(
        router="weighted_scorers", view="approximate", index_capacity=31_250, prefix_weight_pct=200,
        load_weight_pct=100, queue_threshold=128,
        source="llm-d approximate prefix scorer: LRU of 31,250 block hashes per pod, from routing decisions",
    ),
    "llmd_load": dict(
        router="weighted_scorers", prefix_weight_pct=0, load_weight_pct=100, queue_threshold=128,
        source="llm-d with the load (queue) scorer only",
    ),
    "dynamo_kv": dict(
        router="kv_cost", view="precise", overlap_weight_pct=100, temperature=0.0,
        source="NVIDIA Dynamo docs/router/kv_cache_routing.md: overlap weight 1, temperature 0",
    ),
    "kubeai_chwbl": dict(
        router="chwbl", chwbl_c_pct=125, vnodes=100,
        source="KubeAI PrefixHash: consistent hashing with bounded loads, load factor 1.25",
    ),
    "preble": dict(
        router="preble_e2", view="precise", preble_rel_pct=150, preble_abs=8,
        source="Preble (arXiv 2407.00023) E2: rebalance when max load > 1.5 x min (absolute guard 8: ours)",
    ),
}

_M = 0xFFFFFFFF


def router_id(name: str) -> int:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)} or a preset {sorted(PRESETS)}") from None


def view_id(name: str) -> int:
    try:
        return VIEWS[name]
    except KeyError:
        raise ValueError(f"unknown router view {name!r}; choose one of {sorted(VIEWS)}") from None


class RequestView(NamedTuple):
    index: jax.Array  # int32 scalar
    arrival_ms: jax.Array  # int32
    n_blocks: jax.Array  # int32
    prefix_hi: jax.Array  # uint32: key of block min(K, n) - 1
    prefix_lo: jax.Array  # uint32
    bits: jax.Array  # uint32 [4]: this request's random words (drawn before the scan)
    instance: jax.Array  # int32: the router instance handling it


class FleetView(NamedTuple):
    replicas: jax.Array  # int32: active replicas R <= R_max
    match: jax.Array  # int32 [R_max]: leading-run blocks found in the view of each replica
    queue: jax.Array  # int32 [R_max]: in-flight requests
    active_blocks: jax.Array  # int32 [R_max]: blocks of the in-flight requests
    tree_size: jax.Array  # int32 [R_max]: blocks in the view


def prefix_hash_u64(key: int) -> int:
    """Pure-Python twin of :func:`mix32` on a 64-bit key (for references and tests)."""
    hi, lo = (int(key) >> 32) & _M, int(key) & _M
    h = (lo ^ ((hi * 0x9E3779B1) & _M)) & _M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M
    h ^= h >> 16
    return h


def mix32(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """uint32 finaliser of a 64-bit key given as two lanes (murmur3 fmix32 of a folded key)."""
    hi = jnp.asarray(hi).astype(jnp.uint32)
    lo = jnp.asarray(lo).astype(jnp.uint32)
    h = lo ^ (hi * jnp.uint32(0x9E3779B1))
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return h


def ring_positions(max_replicas: int, max_vnodes: int) -> jax.Array:
    """uint32 [R_max, V_max]: ring position of node (r, v) = ``mix32(r, v)`` (``prefix_hash_u64((r << 32) | v)``)."""
    r = jnp.arange(max_replicas, dtype=jnp.uint32)[:, None]
    v = jnp.arange(max_vnodes, dtype=jnp.uint32)[None, :]
    return mix32(jnp.broadcast_to(r, (max_replicas, max_vnodes)), jnp.broadcast_to(v, (max_replicas, max_vnodes)))


def _mul32(a, b):
    """High and low 32 bits of the 64-bit product of two uint32 values (no x64 needed)."""
    a = jnp.asarray(a).astype(jnp.uint32)
    b = jnp.asarray(b).astype(jnp.uint32)
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    lo = (mid << 16) | (p00 & 0xFFFF)
    return hi, lo


def _scale(bits, n):
    """``floor(bits * n / 2**32)`` for uint32 bits and 0 <= n < 2**32 (int32)."""
    return _mul32(bits, n)[0].astype(jnp.int32)


_BIG = jnp.int32(2**31 - 1)


def _argmin_rot(v, active, R, off):
    """Index minimising (v, (r - off) mod R) over active replicas (int32 values)."""
    idx = jnp.arange(v.shape[0], dtype=jnp.int32)
    rot = jnp.mod(idx - off, jnp.maximum(R, 1))
    vmin = jnp.min(jnp.where(active, v, _BIG))
    cand = active & (v == vmin)
    return jnp.argmin(jnp.where(cand, rot, _BIG)).astype(jnp.int32)


def _argmax_rot(v, active, R, off):
    """Index maximising (v, then the same rotation order) over active replicas (v >= 0)."""
    return _argmin_rot(-v, active, R, off)


def _clamp30(x):
    return jnp.minimum(x, jnp.int32(2**30))


def route(router, req: RequestView, fleet: FleetView, params, ring=None, compiled=None):
    """Replica index (int32) chosen by router id ``router`` (dynamic); see the module docstring.

    ``ring``: :func:`ring_positions` (needed by ``chwbl``; computed here when omitted).
    ``compiled``: the router ids to build into the program (default all; an id outside it routes to 0,
    so callers must include every id they pass: the engine's static options check it).
    """
    compiled = tuple(ROUTERS.values()) if compiled is None else tuple(compiled)
    want = {name for name, i in ROUTERS.items() if i in compiled}
    R = fleet.replicas.astype(jnp.int32)
    Rmax = fleet.queue.shape[0]
    ridx = jnp.arange(Rmax, dtype=jnp.int32)
    active = ridx < R
    Ru = R.astype(jnp.uint32)
    off = _scale(req.bits[0], Ru)
    n = req.n_blocks
    q = jnp.where(active, fleet.queue, 0)
    a = jnp.where(active, fleet.active_blocks, 0)
    m = jnp.where(active, fleet.match, 0)
    qmax = jnp.max(q)
    qmin = jnp.min(jnp.where(active, q, _BIG))
    out = {}
    out["random"] = off
    out["round_robin"] = jnp.mod(req.index, R).astype(jnp.int32)
    h = mix32(req.prefix_hi, req.prefix_lo)
    out["prefix_hash"] = (h % Ru).astype(jnp.int32)
    ll = _argmin_rot(q, active, R, off)
    out["least_loaded"] = ll
    if "power_of_two" in want:
        out["power_of_two"] = _power_of_two(req, q, R, Ru)
    if "chwbl" in want:
        out["chwbl"] = _chwbl(h, q, active, R, Rmax, params, ring)
    if "cache_aware" in want:
        out["cache_aware"] = _cache_aware(m, q, n, qmax, qmin, ll, active, R, off, fleet, params)
    if "kv_cost" in want:
        out["kv_cost"] = _kv_cost(m, a, n, active, R, off, req, params)
    if "weighted_scorers" in want:
        out["weighted_scorers"] = _weighted(m, q, n, active, R, off, params)
    if "preble_e2" in want:
        out["preble_e2"] = _preble(m, q, a, n, qmax, qmin, ll, active, R, off, params)
    res = jnp.int32(0)
    for name, i in ROUTERS.items():
        if name in out and i in compiled:
            res = jnp.where(router == i, out[name], res)
    return res


def _power_of_two(req, q, R, Ru):
    pa = _scale(req.bits[1], Ru)
    pb = jnp.where(R > 1, jnp.mod(pa + 1 + _scale(req.bits[2], jnp.maximum(R - 1, 0).astype(jnp.uint32)), R), pa)
    return jnp.where(q[pb] < q[pa], pb, pa).astype(jnp.int32)


def _chwbl(h, q, active, R, Rmax, params, ring):
    """Consistent hashing with bounded loads."""
    if ring is None:
        ring = ring_positions(Rmax, 128)
    V = ring.shape[1]
    total = jnp.sum(q)
    denom = 100 * R
    cap = (params.chwbl_c_pct * (total + 1) + denom - 1) // denom
    dist = ring - h  # uint32 wrap = clockwise distance
    node_ok = active[:, None] & (jnp.arange(V, dtype=jnp.int32)[None, :] < params.vnodes) & (q < cap)[:, None]
    # order (distance, r, v): compare distance first, then the flat index r * V + v
    dmin = jnp.min(jnp.where(node_ok, dist, jnp.uint32(_M)))
    flat = jnp.arange(Rmax * V, dtype=jnp.int32).reshape(Rmax, V)
    best = jnp.min(jnp.where(node_ok & (dist == dmin), flat, _BIG))
    return jnp.minimum(best // V, Rmax - 1).astype(jnp.int32)


def _cache_aware(m, q, n, qmax, qmin, ll, active, R, off, fleet, params):
    """SGLang cache_aware."""
    imbalanced = ((qmax - qmin) > params.balance_abs) & (qmax * 100 > params.balance_rel_pct * qmin)
    b = _argmax_rot(m, active, R, off)
    hit = (m[b] * 1000 > params.cache_threshold_pm * n) & (n > 0)
    miss = jnp.where(params.miss_smallest_tree, _argmin_rot(jnp.where(active, fleet.tree_size, 0), active, R, off), ll)
    return jnp.where(imbalanced, ll, jnp.where(hit, b, miss))


def _kv_cost(m, a, n, active, R, off, req, params):
    """NVIDIA Dynamo KV router cost."""
    cost = _clamp30(params.overlap_weight_pct * _clamp30(n - m)) + _clamp30(100 * _clamp30(a))
    greedy = _argmin_rot(cost, active, R, off)
    cmin = jnp.min(jnp.where(active, cost, _BIG)).astype(jnp.float32)
    cmax = jnp.max(jnp.where(active, cost, 0)).astype(jnp.float32)
    temp = jnp.maximum(params.temperature.astype(jnp.float32), jnp.float32(1e-6))
    z = -(cost.astype(jnp.float32) - cmin) / jnp.maximum(cmax - cmin, jnp.float32(1.0)) / temp
    e = jnp.where(active, jnp.exp(z), jnp.float32(0.0))
    p = e / jnp.sum(e)
    u = (req.bits[3] >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
    c = jnp.cumsum(p)
    over = active & (c > u)
    sampled = jnp.where(jnp.any(over), jnp.argmax(over).astype(jnp.int32), R - 1)
    return jnp.where(params.temperature > 0, sampled, greedy)


def _weighted(m, q, n, active, R, off, params):
    """llm-d weighted scorers."""
    T = jnp.maximum(params.queue_threshold, 1)
    pscore = jnp.where(n > 0, (m * 1024) // jnp.maximum(n, 1), 0)
    lscore = (512 * (T - jnp.minimum(q, T))) // T
    score = params.prefix_weight_pct * pscore + params.load_weight_pct * lscore
    return _argmax_rot(score, active, R, off)


def _preble(m, q, a, n, qmax, qmin, ll, active, R, off, params):
    """Preble E2."""
    reb = (qmax * 100 > params.preble_rel_pct * qmin) & ((qmax - qmin) > params.preble_abs)
    mstar = jnp.max(m)
    exploit = (mstar > 0) & (n - mstar < mstar)
    ex = _argmin_rot(jnp.where(m == mstar, a, _BIG), active & (m == mstar), R, off)
    explore = _argmin_rot(_clamp30(a) + _clamp30(n - m), active, R, off)
    return jnp.where(reb, ll, jnp.where(exploit, ex, explore))

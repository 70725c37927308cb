"""Plain-Python reference fleet simulator: routers, router views, instances, queue and latency.

The oracle the vectorized engine must match exactly. Deliberately simple: one loop over requests,
plain ``OrderedDict`` caches and indexes, Python integers everywhere (no overflow, no JAX). NumPy is
used only to build the output arrays and for the float32 steps of the ``kv_cost`` sampler.

Contracts followed to the letter:

* ``docs/fleet_semantics.md``: order of events per request, queue model, metrics;
* the docstrings of :mod:`cacheresearch.routers` (``argmin_rot``/``argmax_rot``, views) and of its
  router files (one rule each; ``docs/routers.md``), integer details taken from their JAX code
  (``common.scale_bits``, ``ring_positions``, ``2**30`` clamps, the float32 temperature sampler);
  ``tests/test_conformance.py`` fails for a registered router that has no branch in :func:`route_one`;
* ``tests/reference.py``: cache policies (``lru`` leaf-first, ``lru_plain``, ``ttl_refresh``,
  ``ttl_fixed``, ``unbounded``), copied below.

Per request ``i`` (arrival ``now``, ``n`` blocks), in arrival order:

1. instance ``u = i mod instances``;
2. ``stale`` view: sync the snapshot (copy of every replica's true cache, contents and times) when no
   sync happened yet or ``now - last_sync >= stale_lag_ms``;
3. loads: ``queue[r]`` / ``active_blocks[r]`` over earlier requests on ``r`` with ``finish > now``
   (``local_load``: only those dispatched by instance ``u``);
4. ``match[r]`` in the view, ``tree_size[r]``, and the precise match ``M[r]``;
5. prefix-copies sample (requests with ``n > 0``);
6. route;
7. lookup / update / evict on the true cache of ``r`` (``tests/reference.py``);
8. index ``(u, r)`` update (leaf-first LRU over keys, capacity ``index_capacity``), every view;
9. FCFS queue on ``r``.

Not modelled (engine bounds that the engine reports rather than truncating): ``queue_slots`` (the
reference tracks every in-flight request) and time saturation at ``2**31 - 1`` ms.

``tree_size`` for ``precise``/``stale`` is the engine's occupancy count: for ``lru``, ``lru_plain``
and ``unbounded`` the blocks stored on ``r``; for the TTL policies (which never evict) the number of
distinct keys ever written on ``r``, expired or not (the contract's note: routers that read
``tree_size`` are only tested with LRU policies). ``max_occupancy`` keeps ``tests/reference.py``'s
meaning (TTL policies: live blocks after each request).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
from reference import drop_expired, policy_limits, touch
from reference_blocks import BLOCK_ORACLES

__all__ = ["reference_fleet", "POLICIES", "ROUTERS", "VIEWS", "route_one", "ring_nodes", "ORACLES", "register_oracle",
           "router_oracle", "LeastRecent", "Gie"]

POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
ROUTERS = (
    "random",
    "round_robin",
    "prefix_hash",
    "least_loaded",
    "power_of_two",
    "chwbl",
    "cache_aware",
    "kv_cost",
    "weighted_scorers",
    "preble_e2",
    "gie",
    "least_recent",
)
VIEWS = ("precise", "approximate", "stale")

_M32 = 0xFFFFFFFF
_C30 = 2**30


def _mix(key: int) -> int:
    from cacheresearch.routers import prefix_hash_u64  # the one function shared with the engine

    return int(prefix_hash_u64(int(key)))


# ------------------------------------------------------------------------------ router helpers
def _scale(bits: int, n: int) -> int:
    """``floor(bits * n / 2**32)`` (the routers' ``scale_bits``: high word of the 64-bit product)."""
    return (int(bits) * int(n)) >> 32


def _argmin_rot(v, R: int, off: int, eligible=None) -> int:
    """``r`` minimising ``(v[r], (r - off) mod R)`` over ``r < R`` (and ``eligible[r]`` if given)."""
    cand = [r for r in range(R) if eligible is None or eligible[r]]
    return min(cand, key=lambda r: (v[r], (r - off) % R))


def _argmax_rot(v, R: int, off: int) -> int:
    """``r`` maximising ``v[r]``, ties by the smallest ``(r - off) mod R``."""
    return min(range(R), key=lambda r: (-v[r], (r - off) % R))


def _clamp30(x: int) -> int:
    return min(int(x), _C30)


def ring_nodes(R: int, vnodes: int) -> list[tuple[int, int, int]]:
    """``(position, r, v)`` of the chwbl ring nodes ``r < R``, ``v < vnodes``: ``mix32(r, v)``."""
    return [(_mix((r << 32) | v), r, v) for r in range(R) for v in range(vnodes)]


def _kv_cost_sample(cost, R: int, temperature: float, bits3: int) -> int:
    """The float32 softmax sampler of the engine's ``kv_cost`` (temperature > 0), step by step."""
    f32 = np.float32
    c = [f32(x) for x in cost[:R]]
    cmin = f32(min(cost[:R]))
    cmax = f32(max(cost[:R]))
    temp = max(f32(temperature), f32(1e-6))
    den = max(f32(cmax - cmin), f32(1.0))
    e = []
    for x in c:
        z = f32(f32(-f32(x - cmin)) / den) / temp
        e.append(f32(np.exp(f32(z))))
    s = f32(0.0)
    for x in e:
        s = f32(s + x)
    p = [f32(x / s) for x in e]
    u = f32(f32(int(bits3) >> 8) * f32(2.0**-24))
    acc = f32(0.0)
    for r in range(R):
        acc = f32(acc + p[r])
        if acc > u:
            return r
    return R - 1


def _ratio16(a: int, b: int) -> int:
    """``floor(65536 a / b)`` with both shifted right by ``max(0, bitlen(b) - 15)`` (``gie``)."""
    b = max(int(b), 1)
    s = max(0, b.bit_length() - 15)
    return ((int(a) >> s) * 65536) // max(b >> s, 1)


def _gie(n, R, m, q, kv_used, capacity, bits1, kn, match_total=None, active_req=None, match_cpu=None,
         nohit=None) -> int:
    """GIE v0.5.1 scorers, llm-d's load-aware and active-request scorers, llm-d's CPU-tier prefix scorer (a
    second prefix-cache-scorer: matched / total in its own index, ``match_cpu``) and the max-score picker, in the
    engine's fixed point (1/65536). ``active_req``: the EPP's in-flight counts (``queue`` when None); ``nohit``:
    the no-hit-lru-scorer's scores (:class:`Gie`; None: weight 0)."""
    Sc = 65536
    qmax, qmin = max(q), min(q)
    qs = [((qmax - x) * Sc) // (qmax - qmin) if qmax > qmin else Sc for x in q]
    cap = max(int(capacity), 1)
    ks = [_ratio16(cap - min(max(int(u), 0), cap), cap) for u in kv_used]
    mode, W = kn["gie_prefix_mode"], kn["gie_window_blocks"]
    if mode == 1:
        total = (min(n, W) if W > 0 else n) if match_total is None else match_total  # view gie_estimate
        ps = [_ratio16(min(x, total), total) if total > 0 else 0 for x in m]
    elif mode == 2:
        hits = [x for x in m if x > 0]
        lo, hi = (min(hits), max(hits)) if hits else (0, 0)
        ps = [0 if x <= 0 else (Sc if hi == lo else _ratio16(x - lo, hi - lo)) for x in m]
    else:
        ps = [0] * R
    T = max(kn["gie_load_threshold"], 1)
    ls = [_ratio16(T - min(x, T), T) // 2 for x in q]
    c = list(q) if active_req is None else list(active_req)
    cmax = max(c)
    acs = [Sc if cmax == 0 else _ratio16(cmax - x, cmax) for x in c]  # active-request: (cmax - c) / cmax
    wc = kn.get("gie_cpu_w_pct", 0)
    tc = match_total if match_total is not None else 0
    cs = [_ratio16(min(x, tc), tc) if wc > 0 and tc > 0 else 0 for x in (match_cpu or [0] * R)]
    score = [kn["gie_prefix_w_pct"] * ps[r] + kn["gie_kv_w_pct"] * ks[r] + kn["gie_queue_w_pct"] * qs[r]
             + kn["gie_load_w_pct"] * ls[r] + kn.get("gie_active_w_pct", 0) * acs[r] + wc * cs[r] for r in range(R)]
    if nohit is not None:
        score = [score[r] + kn["gie_nohit_w_pct"] * nohit[r] for r in range(R)]
    best = max(score)
    tied = [r for r in range(R) if score[r] == best]
    return tied[_scale(bits1, len(tied))]


class LeastRecent:
    """``least_recent`` (cacheresearch/routers/least_recent.py): the replica whose last request is the oldest
    (never served first), ties to the lowest index."""

    def __init__(self, R: int):
        self.last = [None] * R  # the index of the last request sent to each replica

    def route(self, *, i: int, R: int, **_) -> int:
        r = min(range(R), key=lambda x: (-1 if self.last[x] is None else self.last[x], x))
        self.last[r] = i
        return r


class Gie:
    """``gie`` (cacheresearch/routers/gie.py) with llm-d's ``no-hit-lru-scorer`` (``gie_nohit_w_pct > 0``): a request
    is cold when no pod has a hit in the router's view (on gie_estimate: more than h0, the model's hash); then the
    pods never given a cold request score ``1 - i / (R - 1)`` in index order (``i``: their rank among themselves),
    the others ``1 - (never + pos) / (R - 1)`` clipped at 0 (``pos``: 0 for the least recently given one), a single
    pod 1; not cold: 0.5 each; after the pick of a cold request the chosen pod moves to the LRU's recent end (the
    oldest leaves past ``gie_nohit_lru_size``). Scores in 1/65536, floored. With weight 0: the stateless rule."""

    def __init__(self, R: int):
        self.lru = []  # pods given a cold request, least recently first

    def route(self, *, n, R, match, queue, active_blocks, bits, kn, kv_used=None, capacity=2**31 - 1,
              match_total=None, active_req=None, match_cpu=None, **_) -> int:
        wn = kn.get("gie_nohit_w_pct", 0)
        cold = all(x <= (0 if match_total is None else 1) for x in match)  # gie_estimate: h0 alone is no hit
        ns = None
        if wn > 0:
            ns = [32768] * R
            if cold and R == 1:
                ns = [65536]
            elif cold:
                never = [r for r in range(R) if r not in self.lru]
                rank = {r: k for k, r in enumerate(never)}
                rank.update({r: len(never) + k for k, r in enumerate(self.lru)})
                ns = [max(0, (65536 * (R - 1 - rank[r])) // (R - 1)) for r in range(R)]
        r = _gie(n, R, match, queue, active_blocks if kv_used is None else kv_used, capacity, bits[1], kn,
                 match_total, active_req, match_cpu, ns)
        if wn > 0 and cold:  # PreRequest: lruCache.Add(pod)
            if r in self.lru:
                self.lru.remove(r)
            self.lru.append(r)
            if len(self.lru) > kn.get("gie_nohit_lru_size", 1024):
                self.lru.pop(0)
        return r


#: Routers with state: name -> a class whose instance (made per run with ``R``) holds the router's memory and
#: routes by ``.route(**route_one's keywords)``. A plug-in registers its own with :func:`register_oracle`.
ORACLES: dict = {"least_recent": LeastRecent, "gie": Gie}


def register_oracle(name: str, oracle) -> None:
    """Register the oracle of router ``name`` (a class as in :data:`ORACLES`; a plug-in's, at run time)."""
    ORACLES[name] = oracle


def router_oracle(router: str, R: int):
    """One run's router: ``f(**route_one's keywords but the name) -> replica``, with its state when it has one."""
    if router in ORACLES:
        return ORACLES[router](R).route
    return lambda **kw: route_one(router, **kw)


def route_one(router: str, *, i: int, n: int, prefix_key: int, bits, R: int, match, queue, active_blocks,
              tree_size, ring, kn: dict, kv_used=None, capacity=2**31 - 1, match_total=None, active_req=None,
              match_cpu=None) -> int:
    """One routing decision (see :mod:`cacheresearch.routers`). All vectors have length ``R``.
    ``kv_used``: pool blocks in use per replica (``active_blocks`` when None); ``capacity``: pool blocks;
    ``match_cpu``: ``gie``'s CPU-tier scorer's counts (None: no such index).
    A router with state (:data:`ORACLES`) decides from a fresh state (its first decision of a run)."""
    if router in ORACLES:
        return ORACLES[router](R).route(i=i, n=n, prefix_key=prefix_key, bits=bits, R=R, match=match, queue=queue,
                                        active_blocks=active_blocks, tree_size=tree_size, ring=ring, kn=kn,
                                        kv_used=kv_used, capacity=capacity, match_total=match_total,
                                        active_req=active_req, match_cpu=match_cpu)
    off = _scale(bits[0], R)
    if router == "random":
        return off
    if router == "round_robin":
        return i % R
    h = _mix(prefix_key)
    if router == "prefix_hash":
        return h % R
    q, a, m = queue, active_blocks, match
    qmax, qmin = max(q), min(q)
    if router == "least_loaded":
        return _argmin_rot(q, R, off)
    if router == "power_of_two":
        pa = _scale(bits[1], R)
        pb = (pa + 1 + _scale(bits[2], R - 1)) % R if R > 1 else pa
        return pb if q[pb] < q[pa] else pa
    if router == "chwbl":
        total = sum(q)
        denom = 100 * R
        cap = (kn["chwbl_c_pct"] * (total + 1) + denom - 1) // denom
        best = None
        for pos, r, v in ring:
            if q[r] < cap:
                k = ((pos - h) & _M32, r, v)
                if best is None or k < best:
                    best = k
        if best is None:
            raise ValueError(f"chwbl: no replica below the load cap {cap} (chwbl_c_pct={kn['chwbl_c_pct']} < 100?)")
        return best[1]
    if router == "cache_aware":
        if qmax - qmin > kn["balance_abs"] and 100 * qmax > kn["balance_rel_pct"] * qmin:
            return _argmin_rot(q, R, off)
        b = _argmax_rot(m, R, off)
        if n > 0 and 1000 * m[b] > kn["cache_threshold_pm"] * n:
            return b
        if kn["miss_smallest_tree"]:
            return _argmin_rot(tree_size, R, off)
        return _argmin_rot(q, R, off)
    if router == "kv_cost":
        cost = [_clamp30(kn["overlap_weight_pct"] * _clamp30(n - m[r])) + _clamp30(100 * _clamp30(a[r]))
                for r in range(R)]
        if np.float32(kn["temperature"]) > 0:
            return _kv_cost_sample(cost, R, kn["temperature"], bits[3])
        return _argmin_rot(cost, R, off)
    if router == "weighted_scorers":
        T = max(kn["queue_threshold"], 1)
        score = []
        for r in range(R):
            ps = (m[r] * 1024) // n if n > 0 else 0
            ls = (512 * (T - min(q[r], T))) // T
            score.append(kn["prefix_weight_pct"] * ps + kn["load_weight_pct"] * ls)
        return _argmax_rot(score, R, off)
    if router == "preble_e2":
        if 100 * qmax > kn["preble_rel_pct"] * qmin and qmax - qmin > kn["preble_abs"]:
            return _argmin_rot(q, R, off)
        mstar = max(m)
        if mstar > 0 and n - mstar < mstar:
            return _argmin_rot(a, R, off, eligible=[m[r] == mstar for r in range(R)])
        return _argmin_rot([_clamp30(a[r]) + _clamp30(n - m[r]) for r in range(R)], R, off)
    if router == "gie":
        return _gie(n, R, m, q, a if kv_used is None else kv_used, capacity, bits[1], kn, match_total, active_req,
                    match_cpu)
    raise ValueError(f"unknown router {router!r}; expected one of {ROUTERS}")


# ------------------------------------------------------------------------------ the simulator
def _leading_run(keys, present) -> int:
    h = 0
    for k in keys:
        if not present(k):
            break
        h += 1
    return h


def _nearest_rank(sorted_vals, pct: int) -> int:
    N = len(sorted_vals)
    if N == 0:
        return 0
    idx = -(-(pct * N) // 100) - 1  # ceil(pct * N / 100) - 1
    return int(sorted_vals[max(idx, 0)])


def reference_fleet(workload, *, policy, capacity_blocks=None, ttl_s=None, replicas=1, router="round_robin",
                    bits=None, prefix_blocks=80, view="precise", stale_lag_ms=1000, instances=1, local_load=False,
                    index_capacity=2**31 - 1, vnodes=100, chwbl_c_pct=125, cache_threshold_pm=300, balance_abs=64,
                    balance_rel_pct=150, miss_smallest_tree=False, overlap_weight_pct=100, temperature=0.0,
                    prefix_weight_pct=200, load_weight_pct=100, queue_threshold=128, preble_rel_pct=150,
                    preble_abs=8, prefill_tps=10_000, decode_us_per_token=0, kv_pressure=False,
                    restart_replica=-1, restart_ms=0, gie_prefix_mode=0, gie_prefix_w_pct=100, gie_kv_w_pct=100,
                    gie_queue_w_pct=100, gie_window_blocks=0, gie_load_w_pct=0, gie_load_threshold=128,
                    gie_active_w_pct=0, gie_nohit_w_pct=0, gie_nohit_lru_size=1024, block_knobs=None) -> dict:
    """Simulate ``workload`` on a fleet request by request; see the module docstring.

    ``bits``: uint32 array-like ``[n_requests, 4]`` (request ``i``'s random words; zeros by default).

    Returns per-request int64 arrays ``hit_blocks``, ``hit_tokens``, ``replica``, ``ttft_ms``,
    ``match`` / ``precise_match`` / ``loads`` ([N, R]: the view's match, the precise match and the
    ``queue`` vector the request saw), and the metrics of ``docs/fleet_semantics.md``. Extras for
    debugging: ``active_blocks`` and ``tree_size`` ([N, R]), ``instance``, ``start_ms``,
    ``finish_ms``, ``prefill_ms``, ``decode_ms`` (per request).
    """
    block = policy in BLOCK_ORACLES  # libCacheSim's per-block policies: one get per block, leaf-first
    if policy not in POLICIES and not block:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES + tuple(BLOCK_ORACLES)}")
    if block and (kv_pressure or restart_replica >= 0):
        raise ValueError("the per-block oracles run at a fixed capacity with no restart")
    if router not in ROUTERS and router not in ORACLES:
        raise ValueError(f"unknown router {router!r}; expected one of {ROUTERS + tuple(ORACLES)}")
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")
    R = int(replicas)
    if R < 1:
        raise ValueError("replicas must be >= 1")
    I = int(instances)  # noqa: E741
    if I < 1:
        raise ValueError("instances must be >= 1")
    if int(prefix_blocks) < 1:
        raise ValueError("prefix_blocks must be >= 1")
    if int(prefill_tps) < 1:
        raise ValueError("prefill_tps must be >= 1")
    if int(decode_us_per_token) < 0:
        raise ValueError("decode_us_per_token must be >= 0")
    if int(index_capacity) < 0:
        raise ValueError("index_capacity must be >= 0")
    if int(stale_lag_ms) < 0:
        raise ValueError("stale_lag_ms must be >= 0")
    if router == "chwbl" and int(vnodes) < 1:
        raise ValueError("chwbl needs vnodes >= 1")
    N = workload.n_requests

    capacity, ttl_ms = (int(capacity_blocks), None) if block else policy_limits(policy, capacity_blocks, ttl_s)

    if bits is None:
        bits_l = [[0, 0, 0, 0] for _ in range(N)]
    else:
        b = np.asarray(bits)
        if b.shape != (N, 4):
            raise ValueError(f"bits must have shape ({N}, 4), got {b.shape}")
        bits_l = [[int(x) for x in row] for row in b.tolist()]
        if any(not 0 <= x <= _M32 for row in bits_l for x in row):
            raise ValueError("bits must be uint32 values in [0, 2**32)")

    kn = dict(
        chwbl_c_pct=int(chwbl_c_pct), cache_threshold_pm=int(cache_threshold_pm), balance_abs=int(balance_abs),
        balance_rel_pct=int(balance_rel_pct), miss_smallest_tree=bool(miss_smallest_tree),
        overlap_weight_pct=int(overlap_weight_pct), temperature=float(temperature),
        prefix_weight_pct=int(prefix_weight_pct), load_weight_pct=int(load_weight_pct),
        queue_threshold=int(queue_threshold), preble_rel_pct=int(preble_rel_pct), preble_abs=int(preble_abs),
        gie_prefix_mode=int(gie_prefix_mode), gie_prefix_w_pct=int(gie_prefix_w_pct), gie_kv_w_pct=int(gie_kv_w_pct),
        gie_queue_w_pct=int(gie_queue_w_pct), gie_window_blocks=int(gie_window_blocks),
        gie_load_w_pct=int(gie_load_w_pct), gie_load_threshold=int(gie_load_threshold),
        gie_active_w_pct=int(gie_active_w_pct),  # the fcfs engine: its in-flight queue, no expiry
        gie_nohit_w_pct=int(gie_nohit_w_pct), gie_nohit_lru_size=int(gie_nohit_lru_size),
    )
    ring = ring_nodes(R, int(vnodes)) if router == "chwbl" else None
    route = router_oracle(router, R)
    K = int(prefix_blocks)
    icap = int(index_capacity)
    tps = int(prefill_tps)
    dus = int(decode_us_per_token)
    lag = int(stale_lag_ms)

    caches = ([BLOCK_ORACLES[policy](capacity, **(block_knobs or {})) for _ in range(R)] if block
              else [OrderedDict() for _ in range(R)])  # key -> time, as tests/reference.py
    written = [set() for _ in range(R)]  # TTL policies: keys ever written (the engine's occupancy)
    index = [[OrderedDict() for _ in range(R)] for _ in range(I)]  # (u, r) -> LRU of keys
    snapshot = None
    last_sync = None
    inflight = [[] for _ in range(R)]  # (finish, instance, n_blocks)
    busy = [0] * R  # time the replica's server is free
    busy_ms = [0] * R
    max_occ = [0] * R
    copies = []

    out = {k: np.zeros(N, dtype=np.int64) for k in (
        "hit_blocks", "hit_tokens", "replica", "ttft_ms", "instance", "start_ms", "finish_ms", "prefill_ms",
        "decode_ms")}
    mat = {k: np.zeros((N, R), dtype=np.int64) for k in (
        "match", "precise_match", "loads", "active_blocks", "tree_size")}

    def live(entry_time, now):
        return ttl_ms is None or now - entry_time <= ttl_ms


    bt = int(workload.block_tokens)
    for i in range(N):
        keys = [int(k) for k in workload.request_keys(i)]
        n = len(keys)
        now = int(workload.arrival_ms[i])
        inp = int(workload.input_tokens[i])
        outp = int(workload.output_tokens[i])
        prefix_key = keys[min(K, n) - 1] if n > 0 else 0

        # 0. cache event: replica restart_replica restarts at restart_ms (its cache is flushed before the
        # first request arriving at or after it)
        if restart_replica >= 0 and now >= restart_ms and (i == 0 or int(workload.arrival_ms[i - 1]) < restart_ms):
            caches[restart_replica].clear()
            written[restart_replica].clear()
        # 1. instance
        u = i % I
        out["instance"][i] = u
        # 2. stale sync
        if view == "stale" and (last_sync is None or now - last_sync >= lag):
            snapshot = [copy.deepcopy(c) if block else OrderedDict(c) for c in caches]
            last_sync = now
        # 3. loads at now
        queue, active = [0] * R, [0] * R
        for r in range(R):
            inflight[r] = [f for f in inflight[r] if f[0] > now]  # arrivals never go back in time
            for fin, inst, nb in inflight[r]:
                if local_load and inst != u:
                    continue
                queue[r] += 1
                active[r] += nb
        # 4. match views, tree sizes, precise match
        precise = []
        for r in range(R):
            c = caches[r]
            precise.append(_leading_run(keys, lambda k, c=c: k in c and (block or live(c[k], now))))
        if view == "precise":
            match = list(precise)
        elif view == "approximate":
            match = [_leading_run(keys, lambda k, x=index[u][r]: k in x) for r in range(R)]
        elif block:
            match = [_leading_run(keys, lambda k, c=snapshot[r]: k in c) for r in range(R)]
        else:
            match = [_leading_run(keys, lambda k, c=snapshot[r]: k in c and live(c[k], now)) for r in range(R)]
        if view == "approximate":
            tree = [len(index[u][r]) for r in range(R)]
        elif ttl_ms is None:
            tree = [len(caches[r]) for r in range(R)]
        else:
            tree = [len(written[r]) for r in range(R)]
        mat["match"][i] = match
        mat["precise_match"][i] = precise
        mat["loads"][i] = queue
        mat["active_blocks"][i] = active
        mat["tree_size"][i] = tree
        # 5. prefix copies: replicas whose precise leading run covers the routing prefix
        if n > 0:
            copies.append(sum(1 for r in range(R) if precise[r] >= min(int(prefix_blocks), n)))
        # 6. route
        r = route(i=i, n=n, prefix_key=prefix_key, bits=bits_l[i], R=R, match=match, queue=queue,
                  active_blocks=active, tree_size=tree, ring=ring, kn=kn,
                  capacity=2**31 - 1 if capacity is None else capacity)
        assert 0 <= r < R, (router, r)
        out["replica"][i] = r
        # 7. lookup, update, evict (tests/reference.py)
        cache = caches[r]
        if ttl_ms is not None:
            drop_expired(cache, now, ttl_ms)
        h = _leading_run(keys, lambda k: k in cache)
        assert h == precise[r]
        hit_tok = min(h * bt, inp)
        out["hit_blocks"][i] = h
        out["hit_tokens"][i] = hit_tok
        if block:
            for key in reversed(keys):
                cache.get(key)
        else:
            touch(cache, keys, policy, now)
        if capacity is not None and not block:
            # kv_pressure: blocks of r's in-flight requests (all instances) are pinned and shrink the cache
            pinned = sum(nb for fin, inst, nb in inflight[r] if fin > now) if kv_pressure else 0
            while len(cache) > max(capacity - pinned, 0):
                cache.popitem(last=False)
        if ttl_ms is not None:
            written[r].update(keys)
        max_occ[r] = max(max_occ[r], len(cache))
        # 8. index (u, r): leaf-first LRU over keys
        idx = index[u][r]
        for key in reversed(keys):
            idx[key] = True
            idx.move_to_end(key)
        while len(idx) > icap:
            idx.popitem(last=False)
        # 9. queue
        unc = inp - hit_tok
        prefill = (unc // tps) * 1000 + -(-((unc % tps) * 1000) // tps)
        decode = (outp // 1000) * dus + -(-((outp % 1000) * dus) // 1000)
        start = max(now, busy[r])
        finish = start + prefill + decode
        out["ttft_ms"][i] = start - now + prefill
        out["start_ms"][i] = start
        out["finish_ms"][i] = finish
        out["prefill_ms"][i] = prefill
        out["decode_ms"][i] = decode
        busy[r] = finish
        busy_ms[r] += prefill + decode
        inflight[r].append((finish, u, n))

    # ---- metrics
    ttft = out["ttft_ms"]
    srt = sorted(int(x) for x in ttft)
    if N:
        horizon = max(max(max(busy), int(workload.arrival_ms[-1])) - int(workload.arrival_ms[0]), 1)
    else:
        horizon = 1
    mean_busy = sum(busy_ms) / R
    M = mat["precise_match"]
    mmax = M.max(axis=1) if N else np.zeros(0, dtype=np.int64)
    qual = mmax > 0
    left = M[np.arange(N), out["replica"]] < mmax
    total_in = int(np.sum(workload.input_tokens))
    res = dict(out)
    res.update(mat)
    res.update(
        token_hit_rate=float(out["hit_tokens"].sum() / total_in) if total_in > 0 else 0.0,
        request_hit_rate=float(np.mean(out["hit_blocks"] > 0)) if N else 0.0,
        ttft_p50_ms=_nearest_rank(srt, 50),
        ttft_p90_ms=_nearest_rank(srt, 90),
        ttft_p99_ms=_nearest_rank(srt, 99),
        ttft_mean_ms=float(sum(srt) / N) if N else 0.0,
        busy_ms=np.asarray(busy_ms, dtype=np.int64),
        horizon_ms=int(horizon),
        utilisation=np.asarray(busy_ms, dtype=np.float64) / horizon,
        load_imbalance=float(max(busy_ms) / mean_busy) if mean_busy > 0 else 1.0,
        prefix_copies=float(sum(copies) / len(copies)) if copies else 0.0,
        overflow_share=float(np.sum(left & qual) / np.sum(qual)) if np.any(qual) else 0.0,
        max_occupancy=np.asarray(max_occ, dtype=np.int64),
    )
    return res

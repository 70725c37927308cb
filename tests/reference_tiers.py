"""Plain-Python reference of the tiered fleet (cacheresearch.tiers): the oracle the numba engine must equal.

Deliberately simple: one loop over requests, one ``OrderedDict`` per (tier, owner), Python integers.
Semantics (the contract, ``experiments/tiers.md``), per request ``i`` at ``now`` with keys ``k_0..k_{n-1}``:

0. ``stale`` view: a copy of every store when no sync happened yet or ``now - last_sync >= stale_lag_ms``;
1. loads: ``queue[r]`` = requests dispatched to ``r`` whose finish is after ``now``;
2. matches (the tier routers): on every replica the leading run over the union of its tiers (its
   gpu, its cpu, the shared pool, its disk), each block counted in the first tier holding it: in the
   stores now (``precise``), in the copy (``stale``), or the leading run of the router's index
   (``approximate``: a leaf-first LRU of ``index_capacity`` keys per replica, touched with every request
   routed there, counted at the gpu weight);
3. route: ``random`` / ``round_robin`` / ``prefix_hash`` from the given fixed routes; ``least_loaded`` the
   fleet reference's rule; ``tier_scorer`` the fleet reference's ``weighted_scorers`` with the match
   ``sum_t w_t h_t // 100``; ``tier_kv_cost`` its ``kv_cost`` (temperature 0) with that match (and
   ``active_blocks[r]`` = blocks of the requests in flight on ``r``); ``tier_cache_aware`` its
   ``cache_aware`` (miss to the least loaded) with that match; ``tier_preble`` its ``preble_e2``;
   ``chwbl`` its ``chwbl`` (no cache read); ``power_of_two`` its ``power_of_two`` (the request's words 1 and 2);
4. lookup on ``r``: ``h`` = that leading run, ``h_t`` its blocks by tier; ``hit_tokens = min(h * B, input)``;
5. read refresh: the blocks hit in a lower tier are read there (reverse prompt order): ``lru`` moves them
   to the front, a per-block policy takes each as a ``get`` (a hit);
6. gpu: ``lru``: the request's blocks touched leaf-first (reverse order) and LRU evicted down to capacity:
   the fleet reference's ``lru`` exactly; a per-block policy (``BLOCK_ORACLES``): one ``get`` per block,
   leaf-first, as the fleet reference runs it (a lower-tier hit is promoted: it becomes GPU-resident);
7. ``evict`` offload: the gpu's victims (in eviction order) are written to the first present lower tier
   (``lru``: touch every one, LRU moves to the front, then evict down to capacity; a per-block policy:
   one ``get`` each, its victim named by the difference of the stored sets), its victims go to the next
   present tier, and so on; the last tier's victims are dropped. ``write_through``: every computed block
   (``k_h..k_{n-1}``, reverse order) is written to every present lower tier, and victims (of gpu and
   lower tiers) are dropped;
8. the pool is one store: a block written by two replicas is held once (the second write a hit there);
9. time (integer ns, then ms): a lower tier ``t`` with ``h_t > 0`` costs
   ``ceil(h_t * block_bytes * 1000 / read_MBps_t) + latency_ns_t``; ``load_ms = ceil(sum / 1e6)``.
   ``serial``: ``start = max(now, busy)``, TTFT ``= start - now + load + prefill``, finish adds decode;
   ``overlap``: ``start = max(now + load, busy)``, TTFT ``= start - now + prefill``.
   prefill and decode are the fleet reference's integer formulas.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
from reference_blocks import BLOCK_ORACLES
from reference_fleet import ring_nodes, route_one

LOWER = ("cpu", "pool", "disk")


def _mbps(gbps: float) -> int:
    return int(round(float(gbps) * 1000))


def held(c) -> list:
    """The keys a store holds (stored, not ghosts), least recent / oldest first where the store has an order."""
    if isinstance(c, OrderedDict):
        return list(c.keys())
    if hasattr(c, "held"):  # an oracle that says what it holds (clock; a plug-in's)
        return c.held()
    if isinstance(c, BLOCK_ORACLES["fifo"]):
        return list(c.q)
    if isinstance(c, BLOCK_ORACLES["arc"]):
        return list(c.t1) + list(c.t2)
    return list(c.freq if hasattr(c, "freq") else c.visited)


def get(c, k) -> list:
    """One libCacheSim ``get`` of ``k`` on a per-block oracle; returns its victims (at most one)."""
    before = set(held(c))
    c.get(k)
    vic = sorted(before - set(held(c)))
    assert len(vic) <= 1, vic
    return vic


def write(c, keys, policy, cap) -> list:
    """Write ``keys`` in order into store ``c``; returns the victims in eviction order."""
    if policy != "lru":
        return [v for k in keys for v in get(c, k)]
    for k in keys:
        c[k] = True
        c.move_to_end(k)
    vic = []
    while len(c) > cap:
        vic.append(c.popitem(last=False)[0])
    return vic


def _new(policy, cap):
    return OrderedDict() if policy == "lru" else BLOCK_ORACLES[policy](int(cap))


def reference_tiers(workload, cfg, *, fixed_route=None, bits0=None, bits=None) -> dict:
    """Run ``workload`` on the tiered fleet ``cfg`` (a :class:`cacheresearch.tiers.TieredConfig`).
    ``fixed_route``: int [N] replicas for the load-free routers; ``bits0``: uint32 [N], the requests'
    first random words (tie-breaking offset of the load- and cache-reading routers; zeros by default);
    ``bits``: uint32 [N, 4], every random word of a request (``power_of_two`` reads columns 1 and 2)."""
    R = cfg.replicas
    N = workload.n_requests
    bt = int(workload.block_tokens)
    tiers = [cfg.tier(n) for n in LOWER]
    present = [t.capacity_blocks > 0 for t in tiers]
    gpu = [_new(cfg.gpu_policy, cfg.gpu_blocks) for _ in range(R)]
    low = [[_new(t.policy, t.capacity_blocks) for _ in range(1 if t.shared else R)] for t in tiers]
    index = [OrderedDict() for _ in range(R)]
    snap, last_sync = None, None

    def lookup(r, keys, stores):
        g_, lo_ = stores
        where = []
        for k in keys:
            if k in g_[r]:
                where.append(0)
                continue
            for ti in range(3):
                if present[ti] and k in lo_[ti][0 if tiers[ti].shared else r]:
                    where.append(ti + 1)
                    break
            else:
                break
        return where

    def match(rr, keys):
        if cfg.view == "approximate":
            h = 0
            while h < len(keys) and keys[h] in index[rr]:
                h += 1
            return w[0] * h // 100
        return sum(w[t] for t in lookup(rr, keys, snap if cfg.view == "stale" else (gpu, low))) // 100

    bits0 = np.zeros(N, np.int64) if bits0 is None else np.asarray(bits0, np.int64)
    finishes = [[] for _ in range(R)]
    busy = [0] * R
    out = {k: np.zeros(N, np.int64) for k in ("replica", "hit_blocks", "hit_tokens", "ttft_ms", "load_ms")}
    out["hit_tier"] = np.zeros((N, 4), np.int64)
    written = np.zeros(4, np.int64)
    w = list(cfg.tier_weights_pct)
    kn = dict(prefix_weight_pct=cfg.prefix_weight_pct, load_weight_pct=cfg.load_weight_pct,
              queue_threshold=cfg.queue_threshold, overlap_weight_pct=cfg.overlap_weight_pct, temperature=0.0,
              cache_threshold_pm=cfg.cache_threshold_pm, balance_abs=cfg.balance_abs,
              balance_rel_pct=cfg.balance_rel_pct, miss_smallest_tree=False, preble_rel_pct=cfg.preble_rel_pct,
              preble_abs=cfg.preble_abs, chwbl_c_pct=cfg.chwbl_c_pct)
    ring = ring_nodes(R, cfg.vnodes) if cfg.router == "chwbl" else None
    for i in range(N):
        keys = [int(k) for k in workload.request_keys(i)]
        n = len(keys)
        now = int(workload.arrival_ms[i])
        inp, outp = int(workload.input_tokens[i]), int(workload.output_tokens[i])
        if cfg.view == "stale" and (last_sync is None or now - last_sync >= cfg.stale_lag_ms):
            snap, last_sync = copy.deepcopy((gpu, low)), now
        queue = [sum(1 for f, _ in finishes[r] if f > now) for r in range(R)]
        active = [sum(nb for f, nb in finishes[r] if f > now) for r in range(R)]
        if cfg.router in ("random", "round_robin", "prefix_hash"):
            r = int(fixed_route[i]) if fixed_route is not None else 0
        else:
            if cfg.router in ("tier_scorer", "tier_kv_cost", "tier_cache_aware", "tier_preble"):
                m = [min(match(rr, keys), n) if cfg.router == "tier_kv_cost" else match(rr, keys) for rr in range(R)]
                rule = {"tier_scorer": "weighted_scorers", "tier_kv_cost": "kv_cost",
                        "tier_cache_aware": "cache_aware", "tier_preble": "preble_e2"}[cfg.router]
            else:
                m, rule = [0] * R, cfg.router
            pk = keys[min(cfg.prefix_blocks, n) - 1] if n > 0 else 0
            bi = [int(bits0[i]), 0, 0, 0] if bits is None else [int(bits0[i])] + [int(x) for x in bits[i, 1:]]
            r = route_one(rule, i=i, n=n, prefix_key=pk, bits=bi, R=R, match=m, queue=queue,
                          active_blocks=active, tree_size=[0] * R, ring=ring, kn=kn)
        out["replica"][i] = r
        where = lookup(r, keys, (gpu, low))
        h = len(where)
        ht = [where.count(t) for t in range(4)]
        out["hit_blocks"][i] = h
        out["hit_tokens"][i] = min(h * bt, inp)
        out["hit_tier"][i] = ht
        # 5. read refresh in the lower tiers
        for j in reversed(range(h)):
            t = where[j]
            if t >= 1:
                s = low[t - 1][0 if tiers[t - 1].shared else r]
                if tiers[t - 1].policy == "lru":
                    s.move_to_end(keys[j])
                else:
                    assert get(s, keys[j]) == []
        # 6. gpu, leaf-first
        vic = write(gpu[r], list(reversed(keys)), cfg.gpu_policy, cfg.gpu_blocks)
        # 7. offload
        if cfg.offload == "evict":
            for ti in range(3):
                if present[ti] and vic:
                    written[ti + 1] += len(vic)
                    vic = write(low[ti][0 if tiers[ti].shared else r], vic, tiers[ti].policy, tiers[ti].capacity_blocks)
        else:
            comp = list(reversed(keys[h:]))
            for ti in range(3):
                if present[ti] and comp:
                    written[ti + 1] += len(comp)
                    write(low[ti][0 if tiers[ti].shared else r], comp, tiers[ti].policy, tiers[ti].capacity_blocks)
        # 8. the router's index (approximate view): leaf-first LRU
        write(index[r], list(reversed(keys)), "lru", cfg.index_capacity)
        # 9. time
        load_ns = 0
        for t in range(1, 4):
            if ht[t] > 0:
                spec = tiers[t - 1]
                x = ht[t] * cfg.block_bytes * 1000
                load_ns += -(-x // _mbps(spec.read_gbps)) + int(round(spec.latency_us * 1000))
        load = -(-load_ns // 1_000_000)
        tps, dus = cfg.prefill_tps, cfg.decode_us_per_token
        unc = inp - out["hit_tokens"][i]
        prefill = (unc // tps) * 1000 + -(-((unc % tps) * 1000) // tps)
        decode = (outp // 1000) * dus + -(-((outp % 1000) * dus) // 1000)
        if cfg.load_mode == "serial":
            start = max(now, busy[r])
            ttft = start - now + load + prefill
            finish = start + load + prefill + decode
        else:
            start = max(now + load, busy[r])
            ttft = start - now + prefill
            finish = start + prefill + decode
        out["ttft_ms"][i] = ttft
        out["load_ms"][i] = load
        busy[r] = finish
        finishes[r].append((finish, n))
    out["written_blocks"] = written
    out["final_gpu"] = [held(g) for g in gpu]
    out["final_lower"] = {LOWER[ti]: [held(s) for s in low[ti]] for ti in range(3)}
    return out

"""Plain-Python reference of the tiered fleet (cacheresearch.tiers): the oracle the numba engine must equal.

Deliberately simple: one loop over requests, one ``OrderedDict`` per (tier, owner), Python integers.
Semantics (the contract, ``experiments/tiers.md``), per request ``i`` at ``now`` with keys ``k_0..k_{n-1}``:

1. loads: ``queue[r]`` = requests dispatched to ``r`` whose finish is after ``now``;
2. matches (``tier_scorer`` only): on every replica the leading run over the union of its tiers (its
   gpu, its cpu, the shared pool, its disk), each block counted in the first tier holding it;
3. route: ``random`` / ``round_robin`` / ``prefix_hash`` from the given fixed routes; ``least_loaded`` the
   fleet reference's rule; ``tier_scorer`` the fleet reference's ``weighted_scorers`` with the match
   ``sum_t w_t h_t // 100``; ``tier_kv_cost`` its ``kv_cost`` (temperature 0) with that match (and
   ``active_blocks[r]`` = blocks of the requests in flight on ``r``); ``tier_cache_aware`` its
   ``cache_aware`` (miss to the least loaded) with that match; ``tier_preble`` its ``preble_e2``;
   ``chwbl`` its ``chwbl`` (no cache read);
4. lookup on ``r``: ``h`` = that leading run, ``h_t`` its blocks by tier; ``hit_tokens = min(h * B, input)``;
5. read refresh: the blocks hit in a lower LRU tier are touched there (reverse prompt order);
6. gpu: the request's blocks touched leaf-first (reverse order) and LRU evicted down to capacity: the
   fleet reference's ``lru`` exactly (a lower-tier hit is promoted: it becomes GPU-resident);
7. ``evict`` offload: the gpu's victims (in eviction order) are written to the first present lower tier
   (touch: LRU moves to the front, FIFO keeps an existing block where it is), which then evicts down to
   its capacity; its victims go to the next present tier, and so on; the last tier's victims are dropped.
   ``write_through``: every computed block (``k_h..k_{n-1}``, reverse order) is written to every present
   lower tier, each then evicts down to capacity, and victims (of gpu and lower tiers) are dropped;
8. the pool is one store: a block written by two replicas is held once (the second write touches it);
9. time (integer ns, then ms): a lower tier ``t`` with ``h_t > 0`` costs
   ``ceil(h_t * block_bytes * 1000 / read_MBps_t) + latency_ns_t``; ``load_ms = ceil(sum / 1e6)``.
   ``serial``: ``start = max(now, busy)``, TTFT ``= start - now + load + prefill``, finish adds decode;
   ``overlap``: ``start = max(now + load, busy)``, TTFT ``= start - now + prefill``.
   prefill and decode are the fleet reference's integer formulas.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from reference_fleet import ring_nodes, route_one

LOWER = ("cpu", "pool", "disk")


def _mbps(gbps: float) -> int:
    return int(round(float(gbps) * 1000))


def reference_tiers(workload, cfg, *, fixed_route=None, bits0=None) -> dict:
    """Run ``workload`` on the tiered fleet ``cfg`` (a :class:`cacheresearch.tiers.TieredConfig`).
    ``fixed_route``: int [N] replicas for the load-free routers; ``bits0``: uint32 [N], the requests'
    first random words (tie-breaking offset of ``least_loaded`` / ``tier_scorer``; zeros by default)."""
    R = cfg.replicas
    N = workload.n_requests
    bt = int(workload.block_tokens)
    tiers = [cfg.tier(n) for n in LOWER]
    present = [t.capacity_blocks > 0 for t in tiers]
    gpu = [OrderedDict() for _ in range(R)]
    low = [[OrderedDict() for _ in range(1 if t.shared else R)] for t in tiers]

    def store(ti, r):
        return low[ti][0 if tiers[ti].shared else r]

    def write(ti, r, keys):
        """Write ``keys`` in order into lower tier ``ti`` of replica ``r``, evict; returns the victims."""
        s, t = store(ti, r), tiers[ti]
        for k in keys:
            if k in s:
                if t.policy == "lru":
                    s.move_to_end(k)
            else:
                s[k] = True
        vic = []
        while len(s) > t.capacity_blocks:
            vic.append(s.popitem(last=False)[0])
        return vic

    def lookup(r, keys):
        where = []
        for k in keys:
            if k in gpu[r]:
                where.append(0)
                continue
            for ti in range(3):
                if present[ti] and k in store(ti, r):
                    where.append(ti + 1)
                    break
            else:
                break
        return where

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
        queue = [sum(1 for f, _ in finishes[r] if f > now) for r in range(R)]
        active = [sum(nb for f, nb in finishes[r] if f > now) for r in range(R)]
        if cfg.router in ("random", "round_robin", "prefix_hash"):
            r = int(fixed_route[i]) if fixed_route is not None else 0
        else:
            if cfg.router in ("tier_scorer", "tier_kv_cost", "tier_cache_aware", "tier_preble"):
                m = []
                for rr in range(R):
                    wh = lookup(rr, keys)
                    m.append(min(sum(w[t] for t in wh) // 100, n) if cfg.router == "tier_kv_cost"
                             else sum(w[t] for t in wh) // 100)
                rule = {"tier_scorer": "weighted_scorers", "tier_kv_cost": "kv_cost",
                        "tier_cache_aware": "cache_aware", "tier_preble": "preble_e2"}[cfg.router]
            else:
                m, rule = [0] * R, cfg.router
            pk = keys[min(cfg.prefix_blocks, n) - 1] if n > 0 else 0
            r = route_one(rule, i=i, n=n, prefix_key=pk, bits=[int(bits0[i]), 0, 0, 0], R=R, match=m, queue=queue,
                          active_blocks=active, tree_size=[0] * R, ring=ring, kn=kn)
        out["replica"][i] = r
        where = lookup(r, keys)
        h = len(where)
        ht = [where.count(t) for t in range(4)]
        out["hit_blocks"][i] = h
        out["hit_tokens"][i] = min(h * bt, inp)
        out["hit_tier"][i] = ht
        # 5. read refresh in lower LRU tiers
        for j in reversed(range(h)):
            t = where[j]
            if t >= 1 and tiers[t - 1].policy == "lru":
                store(t - 1, r).move_to_end(keys[j])
        # 6. gpu, leaf-first LRU
        g = gpu[r]
        for k in reversed(keys):
            g[k] = True
            g.move_to_end(k)
        vic = []
        while len(g) > cfg.gpu_blocks:
            vic.append(g.popitem(last=False)[0])
        # 7. offload
        if cfg.offload == "evict":
            for ti in range(3):
                if present[ti] and vic:
                    written[ti + 1] += len(vic)
                    vic = write(ti, r, vic)
        else:
            comp = list(reversed(keys[h:]))
            for ti in range(3):
                if present[ti] and comp:
                    written[ti + 1] += len(comp)
                    write(ti, r, comp)
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
    out["final_gpu"] = [list(g.keys()) for g in gpu]
    out["final_lower"] = {LOWER[ti]: [list(s.keys()) for s in low[ti]] for ti in range(3)}
    return out

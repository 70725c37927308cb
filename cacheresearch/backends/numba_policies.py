"""The per-block policies (``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``) as compiled loops (numba).

These are libCacheSim's policies (:mod:`cacheresearch.cache.block`), equal to libCacheSim 0.3.5
access for access on object streams and to their plain-Python oracles (``tests/reference_blocks.py``)
request by request on prefix streams. Their state is per block: a partly evicted run is readmitted
block by block into different queues (or frequency buckets), so runs do not compress them.

Structures, per replica, all O(1) per access (amortised):

* one doubly linked list per queue over block ids (``older`` / ``newer`` arrays of the id space, a
  head, a tail and a count per list); ``where[k]`` names the list a block is in (0 absent; 1 and 2
  data lists; 3 and 4 ghost lists);
* ``fifo``: list 1; ``sieve``: list 1, the visited bit in ``freq`` and the hand (each visited bit
  is cleared once per setting, so the hand's walk is amortised O(1)); ``s3fifo``: small 1, main 2,
  ghost 3; ``arc``: T1 1, T2 2, B1 3, B2 4 and the target ``p`` (float64, as libCacheSim's double);
* ``lfu``: one list per frequency (bucket ``f`` is list ``f``) and the lowest non-empty frequency,
  kept as libCacheSim keeps it (reset to 1 on an insertion, raised by a scan at an eviction).

Routing is fixed before the run (routers that read neither load nor cache, decisions from
:func:`cacheresearch.analysis.mrc.route_requests_many`, as the LRU numba backend); configurations run
in parallel threads. The cache-reading routers (and their views) and the queue model are not
available here: they read a run store, and these policies keep block queues instead.
"""

from __future__ import annotations

import numpy as np

from cacheresearch.analysis.mrc import route_requests_many
from cacheresearch.backends.numba_cache import ReplayMetrics
from cacheresearch.cache.block import BLOCK_POLICY_IDS, block_sizes
from cacheresearch.cache.policies import POLICIES
from cacheresearch.routers import LOAD_FREE_ROUTERS, ROUTERS
from cacheresearch.workload import Workload

__all__ = ["block_replay_grid", "block_replay"]

_KERNEL = None
FIFO, SIEVE, S3FIFO, LFU, ARC = range(5)  # kernel codes


def _build():
    import numba  # noqa: PLC0415

    nj = numba.njit(cache=True, inline="always")

    @nj
    def push(older, newer, head, tail, cnt, where, q, k):  # at the head (newest)
        h = head[q]
        older[k] = h
        newer[k] = -1
        if h >= 0:
            newer[h] = k
        else:
            tail[q] = k
        head[q] = k
        cnt[q] += 1
        where[k] = q

    @nj
    def unlink(older, newer, head, tail, cnt, where, k):
        q = where[k]
        o, n = older[k], newer[k]
        if n >= 0:
            older[n] = o
        else:
            head[q] = o
        if o >= 0:
            newer[o] = n
        else:
            tail[q] = n
        cnt[q] -= 1
        where[k] = 0

    @numba.njit(parallel=True, cache=True)
    def run(code, ids, off, nb, inp, bt, rep, cap, cS, cG, thr, R, U, L):
        G, N = rep.shape
        hit_blocks = np.zeros((G, N), np.int32)
        hit_tok = np.zeros(G, np.int64)
        req_hit = np.zeros(G, np.int64)
        occ_out = np.zeros((G, R), np.int32)
        max_occ = np.zeros((G, R), np.int32)
        nreq = np.zeros((G, R), np.int32)
        for g in numba.prange(G):
            C = cap[g]
            cs = cS[g]
            cm = C - cs
            cg = cG[g]
            th = thr[g]
            older = np.full((R, U), -1, np.int64)
            newer = np.full((R, U), -1, np.int64)
            where = np.zeros((R, U), np.int64)
            freq = np.zeros((R, U), np.int64)
            head = np.full((R, L), -1, np.int64)
            tail = np.full((R, L), -1, np.int64)
            cnt = np.zeros((R, L), np.int64)
            hand = np.full(R, -1, np.int64)
            evicted = np.zeros(R, np.bool_)
            minf = np.ones(R, np.int64)
            p = np.zeros(R, np.float64)
            for i in range(N):
                r = rep[g, i]
                o_, n_, w_, f_ = older[r], newer[r], where[r], freq[r]
                hd, tl, ct = head[r], tail[r], cnt[r]
                n = nb[i]
                h = 0
                while h < n:  # lookup: the leading run of stored blocks (lfu: any bucket; else lists 1, 2)
                    wk = w_[ids[off[i] + h]]
                    if not (wk > 0 if code == LFU else (wk == 1 or wk == 2)):
                        break
                    h += 1
                for j in range(n - 1, -1, -1):
                    k = ids[off[i] + j]
                    w = w_[k]
                    if code == FIFO:
                        if w == 1 or C < 1:
                            continue
                        while ct[1] + 1 > C:
                            unlink(o_, n_, hd, tl, ct, w_, tl[1])
                        push(o_, n_, hd, tl, ct, w_, 1, k)
                    elif code == SIEVE:
                        if w == 1:
                            f_[k] = 1
                            continue
                        if C < 1:
                            continue
                        while ct[1] + 1 > C:
                            o = tl[1] if hand[r] < 0 else hand[r]
                            while f_[o] > 0:
                                f_[o] = 0
                                o = tl[1] if n_[o] < 0 else n_[o]
                            hand[r] = n_[o]
                            unlink(o_, n_, hd, tl, ct, w_, o)
                        f_[k] = 0
                        push(o_, n_, hd, tl, ct, w_, 1, k)
                    elif code == S3FIFO:
                        if w == 1 or w == 2:
                            f_[k] += 1
                            continue
                        ghost = w == 3
                        if ghost:
                            unlink(o_, n_, hd, tl, ct, w_, k)
                        if C < 1:
                            continue
                        while ct[1] + ct[2] + 1 > C:
                            evicted[r] = True
                            if ct[2] > cm or ct[1] == 0:
                                while ct[2] > 0:
                                    t = tl[2]
                                    f = f_[t]
                                    unlink(o_, n_, hd, tl, ct, w_, t)
                                    if f >= 1:
                                        push(o_, n_, hd, tl, ct, w_, 2, t)
                                        f_[t] = min(f, 3) - 1
                                    else:
                                        break
                            else:
                                while ct[1] > 0:
                                    t = tl[1]
                                    unlink(o_, n_, hd, tl, ct, w_, t)
                                    if f_[t] >= th:
                                        push(o_, n_, hd, tl, ct, w_, 2, t)
                                        f_[t] = 0
                                    else:
                                        if cg > 0:
                                            while ct[3] + 1 > cg:
                                                unlink(o_, n_, hd, tl, ct, w_, tl[3])
                                            push(o_, n_, hd, tl, ct, w_, 3, t)
                                        break
                        if ghost:
                            push(o_, n_, hd, tl, ct, w_, 2, k)
                        elif 1 >= cs:
                            continue
                        elif not evicted[r] and ct[1] >= cs:
                            push(o_, n_, hd, tl, ct, w_, 2, k)
                        else:
                            push(o_, n_, hd, tl, ct, w_, 1, k)
                        f_[k] = 0
                    elif code == LFU:
                        if w > 0:
                            unlink(o_, n_, hd, tl, ct, w_, k)
                            push(o_, n_, hd, tl, ct, w_, w + 1, k)
                            continue
                        if C < 1:
                            continue
                        if ct[0] + 1 > C:  # ct[0]: stored blocks (bucket 0 is never used)
                            m = minf[r]
                            while ct[m] == 0:
                                m += 1
                            minf[r] = m
                            unlink(o_, n_, hd, tl, ct, w_, tl[m])
                            ct[0] -= 1
                        push(o_, n_, hd, tl, ct, w_, 1, k)
                        ct[0] += 1
                        minf[r] = 1
                    else:  # ARC
                        if w == 1:
                            unlink(o_, n_, hd, tl, ct, w_, k)
                            push(o_, n_, hd, tl, ct, w_, 2, k)
                            continue
                        if w == 2:
                            unlink(o_, n_, hd, tl, ct, w_, k)
                            push(o_, n_, hd, tl, ct, w_, 2, k)
                            continue
                        in1, in2 = w == 3, w == 4
                        if in1:
                            p[r] = min(p[r] + max(ct[4] / ct[3], 1.0), C)
                            unlink(o_, n_, hd, tl, ct, w_, k)
                        elif in2:
                            p[r] = max(p[r] - max(ct[3] / ct[4], 1.0), 0.0)
                            unlink(o_, n_, hd, tl, ct, w_, k)
                        if C < 1:
                            continue
                        while ct[1] + ct[2] + 1 > C:
                            rep_ = True
                            b2 = in2
                            if not (in1 or in2):
                                b2 = False
                                if ct[1] + ct[3] + 1 > C:
                                    if ct[3] > 0:
                                        unlink(o_, n_, hd, tl, ct, w_, tl[3])
                                    else:
                                        unlink(o_, n_, hd, tl, ct, w_, tl[1])
                                        rep_ = False
                                elif ct[1] + ct[3] + ct[2] + ct[4] >= 2 * C and ct[4] > 0:
                                    unlink(o_, n_, hd, tl, ct, w_, tl[4])
                            if rep_:
                                n1 = ct[1]
                                if (n1 > 0 and (n1 > p[r] or (n1 == p[r] and b2))) or ct[2] == 0:
                                    t = tl[1]
                                    unlink(o_, n_, hd, tl, ct, w_, t)
                                    push(o_, n_, hd, tl, ct, w_, 3, t)
                                else:
                                    t = tl[2]
                                    unlink(o_, n_, hd, tl, ct, w_, t)
                                    push(o_, n_, hd, tl, ct, w_, 4, t)
                        push(o_, n_, hd, tl, ct, w_, 2 if (in1 or in2) else 1, k)
                occ = ct[0] if code == LFU else ct[1] + ct[2]
                if occ > max_occ[g, r]:
                    max_occ[g, r] = occ
                nreq[g, r] += 1
                hit_blocks[g, i] = h
                ht = inp[i] if h > inp[i] // bt else h * bt
                hit_tok[g] += ht
                if h > 0:
                    req_hit[g] += 1
            for r in range(R):
                occ_out[g, r] = cnt[r, 0] if code == LFU else cnt[r, 1] + cnt[r, 2]
        return hit_blocks, hit_tok, req_hit, occ_out, max_occ, nreq

    return run


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build()
    return _KERNEL


def block_replay_grid(workload: Workload, params, keys=None, *, max_replicas: int = 1) -> ReplayMetrics:
    """Run configurations ``params`` (a list of :class:`~cacheresearch.core.params.Params` or stacked
    fields [G]) whose policies are per-block ones over ``workload``; ``keys`` [G]: PRNG keys (the
    ``random`` router's draws, as the engine's). Configurations of several policies are grouped by
    policy (one compiled loop each)."""
    if isinstance(params, (list, tuple)):
        from cacheresearch.core.params import stack_params  # noqa: PLC0415

        params = stack_params(list(params))
    P = {f: np.asarray(getattr(params, f)).reshape(-1) for f in params._fields}
    G = P["policy"].shape[0]
    names = {v.id: k for k, v in POLICIES.items()}
    pol = [names[int(x)] for x in P["policy"]]
    bad = sorted(set(pol) - set(BLOCK_POLICY_IDS))
    if bad:
        raise ValueError(f"policies {bad} are not per-block policies ({', '.join(BLOCK_POLICY_IDS)}): use the "
                         "JAX engine or the LRU numba backend (backends.numba_cache)")
    rnames = {v: k for k, v in ROUTERS.items()}
    rt = [rnames[int(x)] for x in P["router"]]
    if set(rt) - set(LOAD_FREE_ROUTERS):
        raise ValueError(f"routers {sorted(set(rt) - set(LOAD_FREE_ROUTERS))} read load or cache state; the "
                         "per-block policies keep block queues, not the run store those routers' views read, and "
                         f"have no queue model: use {', '.join(LOAD_FREE_ROUTERS)}")
    if P["kv_pressure"].any():
        raise ValueError("kv_pressure needs the queue model, which the per-block policies do not run")
    if np.any(P["replicas"] > max_replicas) or np.any(P["replicas"] < 1):
        raise ValueError(f"replicas outside [1, max_replicas={max_replicas}]")
    if keys is None:
        if "random" in rt:
            raise ValueError("router 'random' needs PRNG keys")
        keys = [None] * G
    keys = list(keys) if not hasattr(keys, "shape") or keys.shape else [keys]
    N = workload.n_requests
    rep = np.zeros((G, N), np.int64)
    groups: dict[tuple, list[int]] = {}
    for g in range(G):
        groups.setdefault((rt[g], int(P["replicas"][g]), int(P["prefix_blocks"][g])), []).append(g)
    for (router, R, pb), gs in groups.items():
        rep[gs] = route_requests_many(workload, router, R, prefix_blocks=pb,
                                      keys=[keys[g] for g in gs] if router == "random" else None)
    ids = workload.dense_ids().astype(np.int64) if workload.total_blocks else np.zeros(1, np.int64)
    U = int(ids.max()) + 1 if workload.total_blocks else 1
    off = workload.offsets[:-1].astype(np.int64)
    nb = workload.n_blocks.astype(np.int64)
    inp = workload.input_tokens.astype(np.int64)
    cap = P["capacity"].astype(np.int64)
    sizes = [block_sizes(pol[g], int(cap[g]), {k: P[k][g] for k in P}) for g in range(G)]
    cS = np.asarray([s[0] for s in sizes], np.int64)
    cG = np.asarray([s[1] for s in sizes], np.int64)
    th = np.asarray([s[2] for s in sizes], np.int64)
    out = [np.zeros((G, N), np.int32), np.zeros(G, np.int64), np.zeros(G, np.int64),
           np.zeros((G, max_replicas), np.int32), np.zeros((G, max_replicas), np.int32),
           np.zeros((G, max_replicas), np.int32)]
    hot = int(np.bincount(ids).max(initial=0)) if workload.total_blocks else 0
    for name in dict.fromkeys(pol):
        gs = np.asarray([g for g in range(G) if pol[g] == name])
        code = BLOCK_POLICY_IDS.index(name)
        L = hot + 2 if code == LFU else 5  # lfu: a list per frequency (at most a block's accesses)
        got = _kernel()(code, ids, off, nb, inp, int(workload.block_tokens), rep[gs], cap[gs], cS[gs], cG[gs],
                        th[gs], int(max_replicas), U, L)
        for o, v in zip(out, got):
            o[gs] = v
    hb, ht, rh, occ, mocc, nreq = out
    total = float(workload.input_tokens.sum())
    rate = ht / total if total > 0 else np.zeros(G)
    return ReplayMetrics(rate, ht, rh, occ, mocc, nreq, hb, rep.astype(np.int32))


def block_replay(workload: Workload, policy: str, capacity_blocks: int, *, replicas: int = 1,
                 router: str = "round_robin", key=None, **knobs) -> ReplayMetrics:
    """One configuration (:func:`block_replay_grid` of ``make_params(policy, capacity_blocks, ...)``)."""
    from cacheresearch.core.params import make_params  # noqa: PLC0415

    p = make_params(policy, capacity_blocks=capacity_blocks, replicas=replicas, router=router, **knobs)
    return block_replay_grid(workload, [p], None if key is None else [key], max_replicas=int(replicas))

"""The per-block policies on fixed routes (numba): every registered per-block policy, one kernel each.

These are libCacheSim's policies, equal to libCacheSim 0.3.5 access for access on object streams and to
their plain-Python oracles (``tests/reference_blocks.py``) request by request on prefix streams. Each runs
its one kernel file (:mod:`cacheresearch.cache.kernels`) through the dispatch generated from the registry
(:mod:`cacheresearch.cache.kernels.dispatch`): the same code the fcfs fleet, the vllm pool and the KV tiers
run. Their state is per block (a partly evicted run is readmitted block by block into different queues or
frequency buckets), so runs do not compress them; every structure is O(1) per access (amortised).

Routing is fixed before the run (routers that read neither load nor cache, decisions from
:func:`cacheresearch.analysis.mrc.route_requests_many`, as the LRU numba backend); configurations run
in parallel threads. The cache-reading routers, their views and the queue model are the fleet backend's
(:mod:`cacheresearch.backends.numba_blocks`).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np

from cacheresearch.analysis.mrc import route_requests_many
from cacheresearch.cache.block import block_sizes
from cacheresearch.cache.kernels import dispatch
from cacheresearch.cache.kernels.lists import clear, lead, rows
from cacheresearch.cache.policies import POLICIES, block_policies
from cacheresearch.routers import LOAD_FREE_ROUTERS, ROUTERS
from cacheresearch.workload import Workload

__all__ = ["block_replay_grid", "block_replay", "BlockMetrics"]


class BlockMetrics(NamedTuple):
    """:class:`~cacheresearch.backends.numba_cache.ReplayMetrics`' fields, plus ``block_hits`` [G]: the
    accesses (``get`` calls, one per block) that hit: libCacheSim's hit count on the same block stream."""

    token_hit_rate: np.ndarray
    hit_tokens: np.ndarray
    requests_hit: np.ndarray
    max_occupancy: np.ndarray
    occupancy: np.ndarray
    requests_per_replica: np.ndarray
    hit_blocks: np.ndarray
    replica: np.ndarray
    block_hits: np.ndarray

NS = 16  # a row's scalars (cacheresearch.cache.kernels)
D = None  # the dispatch on a policy code (cacheresearch.cache.kernels.dispatch.bind)


@numba.njit(cache=True)
def _config(g, c, C, x1, x2, x3, ids, off, nb, inp, bt, rep, R, L, hb, ht, rh, occ_out, mocc, nreq, bh, o_, n_, w_,
            a_):
    """Configuration ``g`` (policy ``c``, capacity ``C``) over the stream on its fixed routes ``rep[g]``, on the
    thread's empty rows (``o_``, ``n_``, ``w_``, ``a_``: :func:`~cacheresearch.cache.kernels.lists.rows`)."""
    N = rep.shape[1]
    top = D.top(c)
    Lb = L if D.BUCKETS[c] else 1
    s = np.zeros((R, NS), np.int64)
    pr = np.zeros((R, 1), np.float64)
    hd, tl, ct = np.full((R, Lb), -1, np.int32), np.full((R, Lb), -1, np.int32), np.zeros((R, Lb), np.int32)
    for r in range(R):
        D.init(c, s[r])
    for i in range(N):
        r = rep[g, i]
        a, n = off[i], nb[i]
        h = lead(w_[r], ids, a, n, top)
        hits = D.gets(c, o_[r], n_[r], w_[r], a_[r], s[r], pr[r], hd[r], tl[r], ct[r], ids, a, a + n, C, x1, x2, x3)
        o = D.occ(c, s[r])
        if o > mocc[g, r]:
            mocc[g, r] = o
        nreq[g, r] += 1
        hb[g, i] = h
        ht[g] += inp[i] if h > inp[i] // bt else h * bt
        rh[g] += 1 if h > 0 else 0
        bh[g] += hits
    for r in range(R):
        occ_out[g, r] = D.occ(c, s[r])


@numba.njit(parallel=True, cache=True)
def _run(code, ids, off, nb, inp, bt, rep, cap, x1, x2, x3, R, U, L, T):
    """Configurations ``g`` (policy ``code[g]``) over the stream on fixed routes ``rep``: one ``get`` per block,
    leaf-first, after the lookup; returns (hit_blocks [G, N], hit_tokens, requests_hit, occupancy [G, R],
    max_occupancy, requests per replica, block hits)."""
    G, N = rep.shape
    hb, ht, rh = np.zeros((G, N), np.int32), np.zeros(G, np.int64), np.zeros(G, np.int64)
    occ_out, mocc, nreq = np.zeros((G, R), np.int32), np.zeros((G, R), np.int32), np.zeros((G, R), np.int32)
    bh = np.zeros(G, np.int64)
    T = max(min(T, G), 1)
    for t in numba.prange(T):  # a thread's rows serve its configurations t, t + T, ... (cleared between them)
        o_, n_, w_, a_ = rows(R, U)
        for g in range(t, G, T):
            _config(np.int64(g), code[g], cap[g], x1[g], x2[g], x3[g], ids, off, nb, inp, bt, rep, R, L, hb, ht, rh,
                    occ_out, mocc, nreq, bh, o_, n_, w_, a_)
            clear(rep[g], off, nb, ids, o_, n_, w_, a_)
    return hb, ht, rh, occ_out, mocc, nreq, bh


def block_replay_grid(workload: Workload, params, keys=None, *, max_replicas: int = 1) -> BlockMetrics:
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
    bad = sorted(set(pol) - set(block_policies()))
    if bad:
        raise ValueError(f"policies {bad} are not per-block policies ({', '.join(block_policies())}): use the "
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
    ids, U = _ids(workload)
    off = workload.offsets[:-1].astype(np.int64)
    nb = workload.n_blocks.astype(np.int64)
    inp = workload.input_tokens.astype(np.int64)
    cap = P["capacity"].astype(np.int64)
    D = dispatch.bind(sys.modules[__name__])
    codes = dispatch.codes()
    code = np.asarray([codes[p] for p in pol], np.int64)
    sizes = np.asarray([block_sizes(pol[g], int(cap[g]), {k: P[k][g] for k in P}) for g in range(G)],
                       np.int64).reshape(G, 3)
    L = _hot(workload, ids) + 2 if any(D.BUCKETS[c] for c in code) else 1  # a bucket per frequency, +1, 0 unused
    out = _run(code, ids, off, nb, inp, int(workload.block_tokens), rep, cap, sizes[:, 0].copy(),
               sizes[:, 1].copy(), sizes[:, 2].copy(), int(max_replicas), U, L, numba.get_num_threads())
    hb, ht, rh, occ, mocc, nreq, bh = out
    total = float(workload.input_tokens.sum())
    rate = ht / total if total > 0 else np.zeros(G)
    return BlockMetrics(rate, ht, rh, occ, mocc, nreq, hb, rep.astype(np.int32), bh)


def _ids(workload: Workload) -> tuple[np.ndarray, int]:
    """Dense block ids (int32, cached on the workload) and the id space's size."""
    got = workload.__dict__.get("_block_ids32")
    if got is None:
        ids = workload.dense_ids() if workload.total_blocks else np.zeros(1, np.int64)
        U = int(ids.max()) + 1 if workload.total_blocks else 1
        got = (ids.astype(np.int32 if U < 2**31 else np.int64), U)
        object.__setattr__(workload, "_block_ids32", got)
    return got


def _hot(workload: Workload, ids: np.ndarray) -> int:
    """The most accesses of any one block (cached on the workload)."""
    got = workload.__dict__.get("_block_hot")
    if got is None:
        got = int(np.bincount(ids).max(initial=0)) if workload.total_blocks else 0
        object.__setattr__(workload, "_block_hot", got)
    return got


def block_replay(workload: Workload, policy: str, capacity_blocks: int, *, replicas: int = 1,
                 router: str = "round_robin", key=None, **knobs) -> BlockMetrics:
    """One configuration (:func:`block_replay_grid` of ``make_params(policy, capacity_blocks, ...)``)."""
    from cacheresearch.core.params import make_params  # noqa: PLC0415

    p = make_params(policy, capacity_blocks=capacity_blocks, replicas=replicas, router=router, **knobs)
    return block_replay_grid(workload, [p], None if key is None else [key], max_replicas=int(replicas))


dispatch.bind(sys.modules[__name__])

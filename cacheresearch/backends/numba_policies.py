"""The per-block policies (``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``) as compiled loops (numba).

These are libCacheSim's policies (:mod:`cacheresearch.cache.block`), equal to libCacheSim 0.3.5
access for access on object streams and to their plain-Python oracles (``tests/reference_blocks.py``)
request by request on prefix streams. Their state is per block: a partly evicted run is readmitted
block by block into different queues (or frequency buckets), so runs do not compress them.

Structures, per replica, all O(1) per access (amortised), one compiled loop per policy
(:mod:`cacheresearch.backends._block_kernels`):

* ``fifo``: a ring of ``min(C, U)`` slots and a presence array (a hit changes nothing);
* ``sieve``: one doubly linked list over block ids (int32 ``older`` / ``newer``), the visited bit and
  the hand (each visited bit is cleared once per setting, so the hand's walk is amortised O(1));
* ``s3fifo``: small, main and ghost lists, ``where[k]`` naming a block's list (0 absent, 1 small, 2
  main, 3 ghost), a frequency per block; ``arc``: T1, T2, B1, B2 and the target ``p`` (float64, as
  libCacheSim's double);
* ``lfu``: one list per frequency (bucket ``f`` is list ``f``) and the lowest non-empty frequency,
  kept as libCacheSim keeps it (reset to 1 on an insertion, raised by a scan at an eviction).

The lists' heads, tails and counts are the replica's scalars, held in locals while one request is
processed (a kernel that dispatched on the policy per block and kept the heads in arrays spent
about 60 ns per access on the agentic trace; these, end to end, 25 to 66 ns: within 3x of the LRU
numba backend on the same stream, ``bench.policies.cost_per_access``).

Routing is fixed before the run (routers that read neither load nor cache, decisions from
:func:`cacheresearch.analysis.mrc.route_requests_many`, as the LRU numba backend); configurations run
in parallel threads. The cache-reading routers (and their views) and the queue model are not
available here: they read a run store, and these policies keep block queues instead.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cacheresearch.analysis.mrc import route_requests_many
from cacheresearch.cache.block import BLOCK_POLICY_IDS, block_sizes
from cacheresearch.cache.policies import POLICIES
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

_KERNELS: dict = {}


def _kernel(name: str):
    if not _KERNELS:
        from cacheresearch.backends import _block_kernels as k  # noqa: PLC0415 (numba compiles on first use)

        _KERNELS.update(fifo=k.run_fifo, sieve=k.run_sieve, s3fifo=k.run_s3fifo, lfu=k.run_lfu, arc=k.run_arc)
    return _KERNELS[name]


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
    ids, U = _ids(workload)
    off = workload.offsets[:-1].astype(np.int64)
    nb = workload.n_blocks.astype(np.int64)
    inp = workload.input_tokens.astype(np.int64)
    cap = P["capacity"].astype(np.int64)
    out = [np.zeros((G, N), np.int32), np.zeros(G, np.int64), np.zeros(G, np.int64),
           np.zeros((G, max_replicas), np.int32), np.zeros((G, max_replicas), np.int32),
           np.zeros((G, max_replicas), np.int32), np.zeros(G, np.int64)]
    for name in dict.fromkeys(pol):
        gs = np.asarray([g for g in range(G) if pol[g] == name])
        args = (ids, off, nb, inp, int(workload.block_tokens), rep[gs], cap[gs], int(max_replicas), U)
        if name == "s3fifo":
            sizes = np.asarray([block_sizes(name, int(cap[g]), {k: P[k][g] for k in P}) for g in gs], np.int64)
            args += (sizes[:, 0].copy(), sizes[:, 1].copy(), sizes[:, 2].copy())
        elif name == "lfu":  # a list per frequency: at most a block's accesses, +1, and bucket 0 unused
            args += (_hot(workload, ids) + 2,)
        got = _kernel(name)(*args)
        for o, v in zip(out, got):
            o[gs] = v
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

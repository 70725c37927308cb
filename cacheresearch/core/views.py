"""What the router knows: each replica's leading-run match in the router's view.

``precise`` (0): the replica rows of the store at arrival. ``approximate`` (1): router instance
``u``'s own index of each replica (extra store rows ``R + u R + r``, leaf-first LRU of
``index_capacity`` blocks, no clock). ``stale`` (2): the replica rows as of the last sync (each run
keeps its as-of-sync stamp and time; a stamp at or above the sync frontier was written after it).

A run of ``m`` blocks contributes to the leading run: all ``m`` blocks when it is wholly stored and
live, else its stored head under leaf-first order (its stored tail under prompt order never extends
the leading run) and the run ends there.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cacheresearch.cache.priority import STORED
from cacheresearch.cache.store import stored_len
from cacheresearch.routers import RequestView

__all__ = ["SyncState", "init_sync", "sync", "leading", "probe", "request_view", "routing_counts"]


def request_view(stream, req, now, bits, u, prefix_blocks):
    """What a router knows of request ``req``: (:class:`~cacheresearch.routers.RequestView`, the routing
    prefix's blocks ``min(prefix_blocks, n)``; its key is the key of that prefix's last block)."""
    n = stream.n_blocks[req]
    pb = jnp.minimum(prefix_blocks, n)
    kpos = stream.offset[req] + jnp.clip(pb - 1, 0, None)
    rv = RequestView(index=req, arrival_ms=now, n_blocks=n,
                     prefix_hi=jnp.where(n > 0, stream.key_hi[kpos], jnp.uint32(0)),
                     prefix_lo=jnp.where(n > 0, stream.key_lo[kpos], jnp.uint32(0)),
                     bits=bits, instance=u)
    return rv, pb


def routing_counts(mt, m_chosen, pb, n, active, real, match: bool):
    """The routing metrics' counts of one request from the precise matches ``mt [R]`` at arrival:
    (prefix copies: replicas whose leading run covers the routing prefix ``pb``, sampled (has blocks),
    qualifies for the overflow share (a cached prefix somewhere), sent away from the best replica)."""
    copies = jnp.sum((active & (mt >= pb)).astype(jnp.int32))
    mbest = jnp.max(jnp.where(active, mt, 0))
    qual = real & (mbest > 0) & jnp.bool_(match)
    return copies, real & (n > 0), qual, qual & (m_chosen < mbest)


class SyncState(NamedTuple):
    frontier: jax.Array  # int32 stamp frontier at the last sync
    thr: jax.Array  # int32 [R] replica thresholds at the last sync
    t: jax.Array  # int32 time of the last sync
    synced: jax.Array  # bool


def init_sync(R: int) -> SyncState:
    return SyncState(jnp.int32(0), jnp.zeros(R, jnp.int32), jnp.int32(0), jnp.bool_(False))


def sync(s: SyncState, first, now, base, thr, lag_ms) -> SyncState:
    """A sync before routing request ``i`` when it is the first or ``lag_ms`` passed since the last."""
    do = first & ((~s.synced) | (now - s.t >= lag_ms))
    return SyncState(jnp.where(do, base, s.frontier), jnp.where(do, thr, s.thr), jnp.where(do, now, s.t),
                     s.synced | do)


def leading(acc, alive, m, ok, full, part):
    """Advance leading-run matches over lanes: ``acc``/``alive`` [..], lanes on the last axis."""
    f = full | ~ok
    inc = jnp.cumprod(f.astype(jnp.int32), axis=-1)
    before = jnp.concatenate([jnp.ones_like(inc[..., :1]), inc[..., :-1]], axis=-1) * alive[..., None].astype(jnp.int32)
    contrib = jnp.where(ok, jnp.where(full, m, part), 0)
    return acc + jnp.sum(before * contrib, axis=-1), alive & jnp.all(f, axis=-1)


def presence(g, m, thr, now, ttl, leaf, sl=None):
    """(wholly present, leading part) of runs from their gathered (stamp, time); ``sl``: stored
    lengths when the policy keeps them explicitly (priority policies), else from the threshold."""
    sl = stored_len(g[..., 0], m, thr) if sl is None else sl
    live = (now - g[..., 1]) <= ttl
    return (sl == m) & live, jnp.where(live & leaf, sl, 0)


def probe(store, sy: SyncState, stream, e0, p, now, u, params, *, R: int, stale: bool, index: bool, active,
          prio=None):
    """Leading-run matches of a request's ``p`` runs (entries ``e0 ..``) on every replica:
    (precise [R], view [R]). A while loop over windows of runs stops when every run has ended."""
    W = stream.step_run.shape[-1]
    plane = jnp.arange(W, dtype=jnp.int32)
    ridx = jnp.arange(R, dtype=jnp.int32)
    E1 = stream.log.shape[-2]
    ttl = params.ttl_ms
    vrows = R + u * R + ridx

    def cond(st):
        j, _, _, at, av = st
        return (j < p) & (jnp.any(at) | jnp.any(av))

    def body(st):
        j, mt, mv, at, av = st
        jj = j + plane
        ok = jj < p
        e = jnp.where(ok, e0 + jj, E1 - 1)
        v = stream.log[0, e]  # prompt order: the request's runs as they appear
        run = v[:, 0]
        m = v[:, 1][None, :]
        g = store.kv.at[ridx[:, None], run[None, :]].get(mode="fill", fill_value=-1)  # [R, W, F]
        sl = None
        if prio is not None:  # priority policies keep stored lengths explicitly
            sl = jnp.where(prio, g[..., STORED], stored_len(g[..., 0], m, store.thr[:R, None]))
        full_t, part_t = presence(g, m, store.thr[:R, None], now, ttl, params.leaf_first, sl)
        full_v, part_v = full_t, part_t
        if stale:
            cur = g[..., 0] < sy.frontier
            gs = jnp.stack([jnp.where(cur, g[..., 0], g[..., 2]), jnp.where(cur, g[..., 1], g[..., 3])], axis=-1)
            fs, ps = presence(gs, m, sy.thr[:, None], now, ttl, params.leaf_first)
            full_v, part_v = jnp.where(params.view == 2, fs, full_v), jnp.where(params.view == 2, ps, part_v)
        if index:
            gi = store.kv.at[vrows[:, None], run[None, :], 0].get(mode="fill", fill_value=-1)
            sli = stored_len(gi, m, store.thr[vrows][:, None])
            full_v = jnp.where(params.view == 1, sli == m, full_v)
            part_v = jnp.where(params.view == 1, sli, part_v)
        okr = jnp.broadcast_to(ok[None, :], (R, W))
        mt, at = leading(mt, at, m, okr, full_t, part_t)
        mv, av = leading(mv, av, m, okr, full_v, part_v)
        return j + W, mt, mv, at, av

    zero = jnp.zeros(R, jnp.int32)
    _, mt, mv, _, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), zero, zero, active, active))
    return mt, mv

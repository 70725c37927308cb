"""The run store: per-row cache state over runs, with lazy, exact LRU eviction.

Rows are replicas (and, for approximate router views, router indexes: the same machinery on extra
rows of the same array, so each scan step does one gather and one in-place scatter).

State of row ``r`` and stateful run ``k``: ``kv[r, k] = (stamp, time[, stamp, time as of the last
stale sync])``. ``stamp`` is the base stamp of the run's latest entry on that row (-1: never
stored); its blocks cover stamps ``[stamp, stamp + m)``. A row stores exactly the stamps at or above
its threshold ``thr``, so the run has ``stored_len = clip(stamp + m - thr, 0, m)`` blocks stored:
the head of the run under leaf-first order, its tail under prompt order (:mod:`cacheresearch.core.stream`).

Eviction moves the threshold: each row lists the entries written to it in stamp order (``rq``)
and keeps a pointer (``pq``: position in that list, ``poff``: blocks of that entry already
evicted). An entry is *live* when its run still carries that entry's stamp on the row (a later
touch restamps it) or when it is a singleton run; evicting ``need`` blocks walks live entries in
windows. Each entry is passed once: eviction is exact LRU in amortised O(1) per entry.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["StoreState", "init_store", "stored_len", "evict", "threshold", "flush", "leaf_stamp"]


def leaf_stamp(base, n, j0, m):
    """A run's leaf-first stamp: blocks ``j0 .. j0 + m - 1`` of a request of ``n`` blocks at log offset
    ``base`` get ``base + n - j0 - m`` (deeper runs lower: leaves are evicted before their ancestors).
    The vllm pool's free-queue order is the same rule (tail block first) from a release counter."""
    return base + n - j0 - m


class StoreState(NamedTuple):
    kv: jax.Array  # int32 [rows, K, F]
    occ: jax.Array  # int32 [rows] stored blocks
    thr: jax.Array  # int32 [rows] stamp threshold (stored iff stamp >= thr)
    rq: jax.Array  # int32 [rows, E + 1] entries written to the row, in stamp order
    cnt: jax.Array  # int32 [rows] entries in rq
    pq: jax.Array  # int32 [rows] eviction pointer: position in rq ...
    poff: jax.Array  # int32 [rows] ... and blocks of that entry already evicted


def init_store(rows: int, keys: int, entries: int, init: tuple) -> StoreState:
    """Empty rows; ``init`` gives each per-run field's initial value (stamps -1, the rest 0)."""
    kv = jnp.stack([jnp.full((rows, keys), v, jnp.int32) for v in init], axis=-1)
    z = jnp.zeros(rows, jnp.int32)
    return StoreState(kv, z, z, jnp.zeros((rows, entries), jnp.int32), z, z, z)


def stored_len(stamp, m, thr):
    """Blocks of a run of ``m`` blocks with base ``stamp`` stored under threshold ``thr``."""
    return jnp.where(stamp < 0, 0, jnp.clip(stamp + m - thr, 0, m))


def _entry(stream, ent, leaf):
    """(run, length, base) of log entries ``ent`` under the recency order ``leaf`` (dynamic)."""
    E1 = stream.log.shape[-2]
    v = stream.log.reshape(-1, 3)[jnp.where(leaf, E1, 0) + ent]  # one gather: (run, blocks, base)
    return v[..., 0], v[..., 1], v[..., 2]


def threshold(s: StoreState, row, leaf, stream):
    """The row's stamp threshold from its pointer (the frontier of its list once all is evicted)."""
    E1 = s.rq.shape[1]
    cnt = s.cnt[row]
    _, m_l, b_l = _entry(stream, s.rq[row, jnp.clip(cnt - 1, 0, E1 - 1)], leaf)
    _, _, b_at = _entry(stream, s.rq[row, jnp.minimum(s.pq[row], E1 - 1)], leaf)
    thr = jnp.where(s.pq[row] < cnt, b_at + s.poff[row], b_l + m_l)
    return jnp.where(cnt > 0, thr, 0)


def evict(s: StoreState, row, cap, leaf, stream, window: int, do) -> StoreState:
    """Evict row ``row``'s least recent blocks until ``occ <= cap`` (when ``do``); returns the state
    with the row's ``occ``, pointer and threshold updated (``kv`` is only read)."""
    lane = jnp.arange(window, dtype=jnp.int32)
    K = s.kv.shape[1]
    E1 = s.rq.shape[1]
    cnt = s.cnt[row]

    def one_window(occ, pq, poff):
        q = pq + lane
        ok = q < cnt
        run, m, b = _entry(stream, s.rq[row, jnp.minimum(q, E1 - 1)], leaf)
        stamp = s.kv.at[row, run, 0].get(mode="fill", fill_value=-1)
        live = ok & ((stamp == b) | (run == K + 1))
        avail = jnp.where(live, m - jnp.where(lane == 0, poff, 0), 0)
        cum = jnp.cumsum(avail)
        need = jnp.maximum(occ - cap, 0)
        got = cum[-1]
        at = jnp.argmax(cum >= need).astype(jnp.int32)
        enough = got >= need
        ev = avail[at] - (cum[at] - need)  # blocks evicted from the entry where the walk stops
        pq2 = jnp.where(enough, pq + at, pq + jnp.sum(ok.astype(jnp.int32)))
        poff2 = jnp.where(enough, jnp.where(at == 0, poff, 0) + ev, 0)
        move = need > 0
        return occ - jnp.minimum(need, got), jnp.where(move, pq2, pq), jnp.where(move, poff2, poff)

    occ, pq, poff = s.occ[row], s.pq[row], s.poff[row]
    o2, q2, f2 = one_window(occ, pq, poff)
    occ, pq, poff = jnp.where(do, o2, occ), jnp.where(do, q2, pq), jnp.where(do, f2, poff)

    def cond(c):
        occ, pq, _ = c
        return do & (occ > cap) & (pq < cnt)

    occ, pq, poff = jax.lax.while_loop(cond, lambda c: one_window(*c), (occ, pq, poff))
    s = s._replace(occ=s.occ.at[row].set(occ), pq=s.pq.at[row].set(pq), poff=s.poff.at[row].set(poff))
    return s._replace(thr=s.thr.at[row].set(threshold(s, row, leaf, stream)))


def flush(s: StoreState, row, frontier, do) -> StoreState:
    """Empty row ``row`` when ``do`` (a replica restart: its cache is flushed).

    ``frontier`` is the base stamp of the request about to be handled: every stamp written so far lies
    below it, so raising the threshold to it leaves no block stored, and the eviction pointer moves past
    every entry of the row (later writes append after it, with stamps at or above the frontier)."""
    do = jnp.asarray(do)
    return s._replace(
        occ=s.occ.at[row].set(jnp.where(do, 0, s.occ[row])),
        thr=s.thr.at[row].set(jnp.where(do, frontier, s.thr[row])),
        pq=s.pq.at[row].set(jnp.where(do, s.cnt[row], s.pq[row])),
        poff=s.poff.at[row].set(jnp.where(do, 0, s.poff[row])),
    )

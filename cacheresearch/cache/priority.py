"""Priority eviction over runs: ``lfu`` and ``length_aware`` (the policies beyond recency).

LRU needs no ranking (a pointer over the stamp log, :mod:`.store`). These policies rank stored
blocks by something else, so each row keeps, per run, explicit fields next to its stamp and time in
the same state array: ``COUNT`` (requests on this row that contained the run, over the whole
history: *perfect* LFU), ``STORED`` (blocks of the run stored, a head of the run: both policies keep
the cache prefix-closed) and ``DEPTH0`` (the run's first block position in the request that last
touched it). Every run needs state: the engine derives it from any stream
(``core.simulate.serve_stream``: ``core.stream.with_stateful_singletons``).

``lfu``: evict the stored block with the lowest (count, recency). All blocks of a run share their
count, and the blocks of different runs never interleave in recency (their stamp ranges are
disjoint), so eviction takes whole runs in (count, base stamp) order, tail first, the last one
partly: a loop of argmins, one per run it touches.

``length_aware`` (Mooncake's LengthAwareCache): evict the stored block deepest in its prompt
(largest position), ties by least recent. The cut is found exactly without a per-block loop: the
largest depth ``D`` with at least ``need`` stored blocks at depth ``>= D`` (binary search), all
blocks deeper than ``D`` go, then the least recent of the blocks at depth ``D`` (one per run, the
block ``D - depth0`` of the run, stamp ``base + m - 1 - (D - depth0)``) go until ``need`` is met.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["COUNT", "STORED", "DEPTH0", "PRIORITY_FIELDS", "evict_priority"]

COUNT, STORED, DEPTH0 = 2, 3, 4  # field indices after (stamp, time)
PRIORITY_FIELDS = 3
_BIG = jnp.int32(2**31 - 1)


def _lfu(count, stamp, L, need):
    """Stored lengths after evicting ``need`` blocks in (count, stamp) order (whole runs, tail first)."""

    def cond(c):
        L, need = c
        return need > 0

    def body(c):
        L, need = c
        cand = L > 0
        cmin = jnp.min(jnp.where(cand, count, _BIG))
        at = cand & (count == cmin)
        smin = jnp.min(jnp.where(at, stamp, _BIG))
        k = jnp.argmax(at & (stamp == smin))
        e = jnp.minimum(need, L[k])
        return L.at[k].add(-e), need - jnp.where(jnp.any(cand), e, need)

    L, _ = jax.lax.while_loop(cond, body, (L, need))
    return L


def _length_aware(depth0, stamp, m, L, need, max_depth: int):
    """Stored lengths after evicting ``need`` blocks, deepest first, ties by least recent."""
    top = depth0 + L  # one past the deepest stored block of each run

    def ge(D):  # stored blocks at depth >= D
        return jnp.sum(jnp.clip(top - jnp.maximum(D, depth0), 0, L))

    def bisect(_, lh):
        lo, hi = lh  # invariant: ge(lo) >= need, ge(hi) < need
        mid = (lo + hi) // 2
        ok = ge(mid) >= need
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    steps = max(1, int(max_depth + 1).bit_length() + 1)
    D, _ = jax.lax.fori_loop(0, steps, bisect, (jnp.int32(0), jnp.int32(max_depth + 1)))
    deeper = ge(D + 1)
    L1 = jnp.clip(D + 1 - depth0, 0, L)  # keep depth <= D
    need2 = need - deeper
    cand = (L1 > 0) & (depth0 + L1 - 1 == D)  # runs with a stored block at depth D
    st = jnp.where(cand, stamp + m - 1 - (D - depth0), _BIG)
    kth = jnp.sort(st)[jnp.clip(need2 - 1, 0, st.shape[0] - 1)]
    drop = cand & (st <= kth) & (need2 > 0)
    return jnp.where(drop, L1 - 1, L1)


def evict_priority(kv, occ, row, cap, run_len, is_lfu, max_depth: int, do):
    """Evict row ``row`` down to ``cap`` under ``lfu`` (``is_lfu``) or ``length_aware``; returns
    (kv, occ of the row). ``run_len`` [K]: each run's length."""
    need = jnp.where(do, jnp.maximum(occ - cap, 0), 0)
    L = kv[row, :, STORED]
    stamp = kv[row, :, 0]
    L_f = _lfu(kv[row, :, COUNT], stamp, L, jnp.where(is_lfu, need, 0))
    L_l = _length_aware(kv[row, :, DEPTH0], stamp, run_len, L, jnp.where(is_lfu, 0, need), max_depth)
    L2 = jnp.where(is_lfu, L_f, L_l)
    L2 = jnp.where(need > 0, L2, L)
    return kv.at[row, :, STORED].set(L2), occ - (jnp.sum(L) - jnp.sum(L2))

"""libCacheSim's per-block policies as single ``get`` calls that name their victim (numba), for the tiered engine.

A tier that runs ``fifo``, ``sieve``, ``s3fifo``, ``lfu`` or ``arc`` sees every access (a read hit, a write)
as one libCacheSim ``get`` of unit-size objects: a hit updates the policy's metadata; a miss evicts until
one more object fits, then inserts (``tests/reference_blocks.py`` states each rule; its oracles are this
module's reference). Offload needs each get's victim, which the fleet kernels of
:mod:`cacheresearch.backends._block_kernels` do not report, so the gets here return it: every get of a
unit-size object evicts at most one object at a fixed capacity (ARC's and S3-FIFO's moves into a ghost
list count as the eviction; a move from S3-FIFO's small queue to main does not).

One row's state: ``o_`` / ``n_`` link each list toward its tail / head (int32 [K]), ``w_`` the list a block
is in (int32 [K]: 0 absent; 1-2 data lists, 3-4 ghost lists; ``lfu``: its frequency), ``a_`` the
per-block extra (``sieve``: visited; ``s3fifo``: frequency), ``s`` the row's scalars (int64 [12]),
``pr`` ARC's target ``p`` (float64 [1]), and ``lfu``'s buckets (head, tail, count per frequency [L]).
The list moves are :mod:`~cacheresearch.backends._block_kernels`' ``push`` / ``unlink``; ARC is its
``arc_get`` itself (its victim is the pre-call tail of T1 or T2 that is no longer stored).
"""

from __future__ import annotations

import numba
import numpy as np

from cacheresearch.backends._block_kernels import arc_get, push, unlink

__all__ = ["BLOCK_CODES", "block_get", "block_stored", "init_scalars", "s3fifo_sizes"]

#: Tier policy codes: 0 ``lru`` (the engine's leaf-first LRU: a batch of touches, then evict to capacity)
#: and 1 ``fifo`` run on the engine's own lists; 2-5 here.
BLOCK_CODES = {"sieve": 2, "s3fifo": 3, "lfu": 4, "arc": 5}
_J = numba.njit(cache=True, inline="always")
_JF = numba.njit(cache=True)  # block_get: one function, called (not IR-inlined) from each site of the engine


def s3fifo_sizes(capacity: int) -> tuple[int, int]:
    """S3-FIFO's small queue and ghost sizes at libCacheSim's defaults: ``int(0.1 C)``, ``int(0.9 C)`` (doubles)."""
    return int(capacity * 0.1), int(capacity * 0.9)


def init_scalars(code: int) -> np.ndarray:
    """A row's scalars before its first get: every head / tail -1, every count 0 (``lfu``: 0 stored, lowest
    frequency 1)."""
    s = np.full(12, -1, np.int64)
    if code == 2:
        s[2] = 0  # head, tail, count, hand
    elif code == 3:
        s[[2, 5, 8, 9]] = 0  # small, main, ghost (head, tail, count); something evicted
    elif code == 4:
        s[:2] = (0, 1)  # stored, lowest frequency
    elif code == 5:
        s[[2, 5, 8, 11]] = 0  # T1, T2, B1, B2 (head, tail, count)
    return s


@_J
def _sieve_get(o_, n_, w_, v_, s, k, C):
    if w_[k] == 1:
        v_[k] = 1
        return -1
    if C < 1:
        return -1
    head, tail, cnt, hand = s[0], s[1], s[2], s[3]
    vic = -1
    while cnt + 1 > C:
        o = tail if hand < 0 else hand
        while v_[o] > 0:
            v_[o] = 0
            o = tail if n_[o] < 0 else n_[o]
        hand = n_[o]
        head, tail = unlink(o_, n_, w_, head, tail, o)
        cnt -= 1
        vic = o
    v_[k] = 0
    head, tail = push(o_, n_, w_, head, tail, 1, k)
    s[0], s[1], s[2], s[3] = head, tail, cnt + 1, hand
    return vic


@_J
def _s3_get(o_, n_, w_, f_, s, k, C, cs, cg):
    """S3-FIFO (move to main at frequency 2): the fleet kernel's ``s3_miss`` with its victim named."""
    w = w_[k]
    if w == 1 or w == 2:
        f_[k] += 1
        return -1
    cm = C - cs
    h1, t1, c1, h2, t2, c2, h3, t3, c3, ev = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]
    vic = -1
    ghost = w == 3
    if ghost:
        h3, t3 = unlink(o_, n_, w_, h3, t3, k)
        c3 -= 1
    if C >= 1:
        while c1 + c2 + 1 > C:
            ev = 1
            if c2 > cm or c1 == 0:
                while c2 > 0:
                    t = t2
                    f = f_[t]
                    h2, t2 = unlink(o_, n_, w_, h2, t2, t)
                    if f >= 1:
                        h2, t2 = push(o_, n_, w_, h2, t2, 2, t)
                        f_[t] = min(f, 3) - 1
                    else:
                        c2 -= 1
                        vic = t
                        break
            else:
                while c1 > 0:
                    t = t1
                    h1, t1 = unlink(o_, n_, w_, h1, t1, t)
                    c1 -= 1
                    if f_[t] >= 2:
                        h2, t2 = push(o_, n_, w_, h2, t2, 2, t)
                        c2 += 1
                        f_[t] = 0
                    else:
                        vic = t
                        if cg > 0:
                            while c3 + 1 > cg:
                                h3, t3 = unlink(o_, n_, w_, h3, t3, t3)
                                c3 -= 1
                            h3, t3 = push(o_, n_, w_, h3, t3, 3, t)
                            c3 += 1
                        break
        if ghost:
            h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
            c2 += 1
            f_[k] = 0
        elif cs > 1:
            if ev == 0 and c1 >= cs:
                h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
                c2 += 1
            else:
                h1, t1 = push(o_, n_, w_, h1, t1, 1, k)
                c1 += 1
            f_[k] = 0
    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9] = h1, t1, c1, h2, t2, c2, h3, t3, c3, ev
    return vic


@_J
def _lfu_get(o_, n_, w_, hd, tl, ct, s, k, C):
    f = w_[k]
    if f > 0:
        hd[f], tl[f] = unlink(o_, n_, w_, hd[f], tl[f], k)
        ct[f] -= 1
        hd[f + 1], tl[f + 1] = push(o_, n_, w_, hd[f + 1], tl[f + 1], f + 1, k)
        ct[f + 1] += 1
        return -1
    if C < 1:
        return -1
    tot, m = s[0], s[1]
    vic = -1
    if tot + 1 > C:
        while ct[m] == 0:
            m += 1
        vic = tl[m]
        hd[m], tl[m] = unlink(o_, n_, w_, hd[m], tl[m], vic)
        ct[m] -= 1
        tot -= 1
    hd[1], tl[1] = push(o_, n_, w_, hd[1], tl[1], 1, k)
    ct[1] += 1
    s[0], s[1] = tot + 1, 1
    return vic


@_J
def _arc_get(o_, n_, w_, s, pr, k, C):
    a, b = s[1], s[4]  # T1's and T2's oldest before the get: the only candidates to leave
    arc_get(o_, n_, w_, s, pr, k, C)
    if a >= 0 and w_[a] != 1 and w_[a] != 2:
        return a
    if b >= 0 and w_[b] != 1 and w_[b] != 2:
        return b
    return -1


@_JF
def block_get(code, o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, cs, cg):
    """One libCacheSim ``get`` of ``k`` on a row of policy ``code`` (:data:`BLOCK_CODES`) of capacity ``C``
    (``cs``, ``cg``: S3-FIFO's small and ghost sizes); returns the evicted block or -1."""
    if code == 2:
        return _sieve_get(o_, n_, w_, a_, s, k, C)
    if code == 3:
        return _s3_get(o_, n_, w_, a_, s, k, C, cs, cg)
    if code == 4:
        return _lfu_get(o_, n_, w_, hd, tl, ct, s, k, C)
    return _arc_get(o_, n_, w_, s, pr, k, C)


@_J
def block_stored(code, w):
    """Whether a block in list ``w`` is stored (not absent, not a ghost)."""
    if code == 4:
        return w > 0
    if code == 2:
        return w == 1
    return w == 1 or w == 2

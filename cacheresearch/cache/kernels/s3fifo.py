"""libCacheSim S3FIFO (SOSP'23, with libCacheSim's warm-up and lazy main trim).

Lists: small (``w_`` 1), main (2), ghost keys (3); ``a_`` a block's frequency. Sizes: ``x1`` the small
queue (``int(C x small_size_ratio)``), ``x2`` the ghost (``int(C x ghost_size_ratio)``), ``x3`` the hits that
move a small block to main. Scalars: small, main, ghost as (head, tail, count) at 0-2, 3-5, 6-8; 9: something
was evicted. A hit adds 1 to the frequency. To make room: while main holds more than ``C - x1`` (or small is
empty) main's tail leaves at frequency 0, else is reinserted at ``min(f, 3) - 1``; otherwise small's tail
moves to main when hit ``x3`` times, else leaves, its key to the ghost. A miss whose key is a ghost enters
main; otherwise, while nothing was evicted yet and small holds ``x1``, main; else small (libCacheSim admits
nothing when ``x1 <= 1``: no block fits a small queue that size). In a pool (vllm) a pinned block counts as
hit (small's tail moves to main; main's tail is reinserted with its frequency kept) and a computed block
always enters (``tests/reference_vllm.py``, ``S3FifoPool``; the pool refuses ``x1 < 2``).
"""

from __future__ import annotations

from cacheresearch.cache.kernels.lists import J, push, unlink

TOP = 2
BUCKETS = False


@J
def init(s):
    for x in range(9):
        s[x] = -1 if x % 3 != 2 else 0
    s[9] = 0


@J
def occ(s):
    return s[2] + s[5]


@J
def _evict(o_, n_, w_, f_, s, C, cs, cg, th, pin):
    """One block leaves (main's at frequency 0, or small's to the ghost), unlinked; ``pin`` None: none pinned."""
    s[9] = 1
    while True:
        if s[5] > C - cs or s[2] == 0:
            run_pinned = 0
            while s[5] > 0 and run_pinned < s[5]:
                t = s[4]
                s[3], s[4] = unlink(o_, n_, w_, s[3], s[4], t)
                if pin is not None and pin[t] > 0:
                    s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, t)
                    run_pinned += 1
                elif f_[t] >= 1:
                    s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, t)
                    f_[t] = min(f_[t], 3) - 1
                    run_pinned = 0
                else:
                    s[5] -= 1
                    return t
        while s[2] > 0:
            t = s[1]
            s[0], s[1] = unlink(o_, n_, w_, s[0], s[1], t)
            s[2] -= 1
            if (pin is not None and pin[t] > 0) or f_[t] >= th:
                s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, t)
                s[5] += 1
                f_[t] = 0
            else:
                if cg > 0:
                    while s[8] + 1 > cg:
                        s[6], s[7] = unlink(o_, n_, w_, s[6], s[7], s[7])
                        s[8] -= 1
                    s[6], s[7] = push(o_, n_, w_, s[6], s[7], 3, t)
                    s[8] += 1
                return t


@J
def _enter(o_, n_, w_, f_, s, k, cs, ghost):
    f_[k] = 0
    if ghost:
        s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, k)
        s[5] += 1
    elif s[9] == 0 and s[2] >= cs:  # warm-up: nothing evicted yet and small full
        s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, k)
        s[5] += 1
    else:
        s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
        s[2] += 1


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    w = w_[k]
    if w == 1 or w == 2:
        a_[k] += 1
        return -1
    ghost = w == 3
    if ghost:
        s[6], s[7] = unlink(o_, n_, w_, s[6], s[7], k)
        s[8] -= 1
    if C < 1:
        return -1
    v = -1
    while s[2] + s[5] + 1 > C:
        v = _evict(o_, n_, w_, a_, s, C, x1, x2, x3, None)
    if ghost or x1 > 1:
        _enter(o_, n_, w_, a_, s, k, x1, ghost)
    return v


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    a_[k] += 1


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    ghost = w_[k] == 3
    if ghost:
        s[6], s[7] = unlink(o_, n_, w_, s[6], s[7], k)
        s[8] -= 1
    _enter(o_, n_, w_, a_, s, k, x1, ghost)


@J
def victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, pin):
    return _evict(o_, n_, w_, a_, s, C, x1, x2, x3, pin)

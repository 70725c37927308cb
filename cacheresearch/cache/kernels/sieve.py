"""libCacheSim Sieve (NSDI'24): one list, a visited bit per block, a hand from the tail toward the head.

A newcomer enters at the head unvisited, a hit sets its bit. To evict, the hand starts where it stopped
(else at the tail), clears visited bits walking toward the head (wrapping to the tail), evicts the first
unvisited block and stops at its newer neighbour. Scalars: head, tail, count, hand. In a pool (vllm) the
hand passes a pinned block and keeps its bit (``tests/reference_vllm.py``, ``SievePool``).
"""

from __future__ import annotations

from cacheresearch.cache.kernels.lists import J, push, unlink

TOP = 1
BUCKETS = False


@J
def init(s):
    s[0], s[1], s[2], s[3] = -1, -1, 0, -1


@J
def occ(s):
    return s[2]


@J
def _evict(o_, n_, w_, v_, s, pin):
    """The hand's victim, unlinked (``pin`` None: nothing is pinned)."""
    tail, hand = s[1], s[3]
    o = tail if hand < 0 else hand
    if pin is None:
        while v_[o] > 0:
            v_[o] = 0
            o = tail if n_[o] < 0 else n_[o]
    else:
        while pin[o] > 0 or v_[o] > 0:
            if pin[o] == 0:
                v_[o] = 0
            o = tail if n_[o] < 0 else n_[o]
    s[3] = n_[o]
    s[0], s[1] = unlink(o_, n_, w_, s[0], tail, o)
    s[2] -= 1
    return o


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    if w_[k] == 1:
        a_[k] = 1
        return -1
    if C < 1:
        return -1
    v = -1
    while s[2] + 1 > C:
        v = _evict(o_, n_, w_, a_, s, None)
    a_[k] = 0
    s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
    s[2] += 1
    return v


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    a_[k] = 1


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    a_[k] = 0
    s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
    s[2] += 1


@J
def victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, pin):
    return _evict(o_, n_, w_, a_, s, pin)

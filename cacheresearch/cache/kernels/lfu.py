"""libCacheSim LFU (in-cache): counts are forgotten at eviction; ties leave in bucket-arrival order.

``w_[k]`` is a stored block's frequency (its bucket; 0 absent), one list per frequency (``hd``, ``tl``,
``ct``: head, tail, count of bucket ``f``), in last-access order. Scalars: blocks stored, the lowest
frequency as libCacheSim keeps it (1 after an insertion, raised by a scan at an eviction). A hit moves
the block to the head of the next bucket; a miss at capacity evicts the lowest bucket's tail, then the
newcomer enters bucket 1. In a pool (vllm) the victim is the least frequent, least recent block that no
running request holds (``tests/reference_vllm.py``, ``LfuPool``).
"""

from __future__ import annotations

from cacheresearch.cache.kernels.lists import J, push, unlink

TOP = 2**30
BUCKETS = True


@J
def init(s):
    s[0], s[1] = 0, 1


@J
def occ(s):
    return s[0]


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    f = w_[k]
    hd[f], tl[f] = unlink(o_, n_, w_, hd[f], tl[f], k)
    ct[f] -= 1
    hd[f + 1], tl[f + 1] = push(o_, n_, w_, hd[f + 1], tl[f + 1], f + 1, k)
    ct[f + 1] += 1


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    hd[1], tl[1] = push(o_, n_, w_, hd[1], tl[1], 1, k)
    ct[1] += 1
    s[0] += 1
    s[1] = 1


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    if w_[k] > 0:
        touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k)
        return -1
    if C < 1:
        return -1
    v = -1
    if s[0] + 1 > C:
        m = s[1]
        while ct[m] == 0:
            m += 1
        v = tl[m]
        hd[m], tl[m] = unlink(o_, n_, w_, hd[m], tl[m], v)
        ct[m] -= 1
        s[0] -= 1
    admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3)
    return v


@J
def victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, pin):
    m = s[1]
    while ct[m] == 0:
        m += 1
    s[1] = m
    f = m
    while True:
        t = tl[f]
        while t >= 0 and pin[t] > 0:
            t = n_[t]
        if t >= 0:
            hd[f], tl[f] = unlink(o_, n_, w_, hd[f], tl[f], t)
            ct[f] -= 1
            s[0] -= 1
            return t
        f += 1

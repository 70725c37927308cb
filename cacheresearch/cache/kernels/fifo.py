"""libCacheSim FIFO: one list, a newcomer at the head, the tail leaves; a hit changes nothing.

Scalars: head, tail, count. In a pool (vllm): a block a running request holds cannot leave: the oldest
pinned block moves to the head and the next oldest is tried (``tests/reference_vllm.py``, ``FifoPool``).
"""

from __future__ import annotations

from cacheresearch.cache.kernels.lists import J, push, unlink

TOP = 1
BUCKETS = False


@J
def init(s):
    s[0], s[1], s[2] = -1, -1, 0


@J
def occ(s):
    return s[2]


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    if w_[k] == 1 or C < 1:
        return -1
    head, tail, cnt = s[0], s[1], s[2]
    v = -1
    if cnt >= C:
        v = tail
        head, tail = unlink(o_, n_, w_, head, tail, v)
        cnt -= 1
    head, tail = push(o_, n_, w_, head, tail, 1, k)
    s[0], s[1], s[2] = head, tail, cnt + 1
    return v


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    pass


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
    s[2] += 1


@J
def victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, pin):
    head, tail = s[0], s[1]
    while True:
        t = tail
        head, tail = unlink(o_, n_, w_, head, tail, t)
        if pin[t] == 0:
            s[0], s[1] = head, tail
            s[2] -= 1
            return t
        head, tail = push(o_, n_, w_, head, tail, 1, t)

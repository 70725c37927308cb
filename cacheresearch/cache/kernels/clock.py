"""libCacheSim Clock (second chance; ``Clock.c`` with its defaults: a 1-bit counter, newcomers at 0).

One list, ``a_`` a block's frequency (0 or 1). A newcomer enters at the head with 0, a hit sets 1. To evict,
while the oldest block has frequency 1 it moves to the head with 0; then the oldest leaves. Scalars: head,
tail, count. In a pool (vllm) a pinned oldest block moves to the head with its frequency kept.
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
def victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, pin):
    head, tail = s[0], s[1]
    while True:
        t = tail
        head, tail = unlink(o_, n_, w_, head, tail, t)
        if (pin is None or pin[t] == 0) and a_[t] == 0:
            s[0], s[1] = head, tail
            s[2] -= 1
            return t
        if pin is None or pin[t] == 0:
            a_[t] = 0
        head, tail = push(o_, n_, w_, head, tail, 1, t)


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    a_[k] = 0
    s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
    s[2] += 1


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    a_[k] = 1


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    if w_[k] == 1:
        a_[k] = 1
        return -1
    if C < 1:
        return -1
    v = -1
    while s[2] + 1 > C:
        v = victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, None)
    admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3)
    return v

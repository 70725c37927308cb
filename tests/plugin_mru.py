"""A user's plug-in policy, as a contributor would write one outside the package: MRU (the newest block leaves).

Its numba kernel (the functions :mod:`cacheresearch.cache.kernels` asks for, a pool's rules included) and its
plain-Python oracles (a per-block cache for ``tests/reference_blocks.py``'s contract, a pool for
``tests/reference_vllm.py``'s). ``tests/test_plugins.py`` registers it at run time.

``mru``  one list; a hit changes nothing; a miss at capacity evicts the newest block, then the newcomer
         enters as the newest. In a pool the victim is the newest block no running request holds.
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
    t = s[0]
    while pin is not None and pin[t] > 0:
        t = o_[t]
    s[0], s[1] = unlink(o_, n_, w_, s[0], s[1], t)
    s[2] -= 1
    return t


@J
def admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
    s[2] += 1


@J
def touch(o_, n_, w_, a_, s, pr, hd, tl, ct, k):
    pass


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    if w_[k] == 1 or C < 1:
        return -1
    v = -1
    if s[2] >= C:
        v = victim(o_, n_, w_, a_, s, pr, hd, tl, ct, C, x1, x2, x3, None)
    admit(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3)
    return v


class MRUCache:
    """The oracle: ``get(key) -> bool`` (libCacheSim's contract), ``__contains__``, ``__len__``, ``held``."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.q: list = []  # oldest first

    def __contains__(self, k):
        return k in self.q

    def __len__(self):
        return len(self.q)

    def held(self) -> list:
        return list(self.q)

    def get(self, k) -> bool:
        if k in self.q:
            return True
        if self.capacity < 1:
            return False
        if len(self.q) >= self.capacity:
            self.q.pop()
        self.q.append(k)
        return False


class MRUPool:
    """The pool oracle: ``insert``, ``hit``, ``victim(pinned)``."""

    def __init__(self, capacity, **_):
        self.q: list = []

    def insert(self, k):
        self.q.append(k)

    def hit(self, k):
        pass

    def victim(self, pinned):
        for i in range(len(self.q) - 1, -1, -1):
            if not pinned(self.q[i]):
                return self.q.pop(i)
        raise AssertionError("no unpinned block")

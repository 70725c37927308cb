"""Plain-Python oracles of the vllm pool's free-block order under every policy the pool takes
(``tests/reference_batch.py`` runs the replica; ``cacheresearch/backends/numba_vllm.py`` is the engine).

vLLM frees blocks LRU: its free queue. Here the order in which cached, unpinned blocks are reused is a
policy's (``reference_batch(..., policy=...)``):

``lru``          vLLM's free queue (reference_batch's stamps: a released request's blocks tail first).
``ttl_refresh``  the same queue, and a free block released more than the TTL before ``now`` leaves the pool:
                 at every engine step's start (its clock) and at every arrival. A pinned block never expires.
Per-block policies (libCacheSim's rules, ``tests/reference_blocks.py``), every cached block in the policy's
lists whether pinned or not. A block enters the policy when a step computes it (a step's new blocks of one
request deepest first); an admitted request's cached blocks are hits of the policy (deepest first). The
pool evicts while the blocks held exceed the capacity, one victim at a time; a pinned block cannot be freed:
``fifo``    the oldest block leaves; a pinned oldest block moves to the newest end.
``sieve``   the hand walks from where it stopped (else the tail) toward the head, wrapping; it clears the
            visited bit of an unpinned block and passes it, passes a pinned block (its bit kept), evicts the
            first unpinned unvisited block and stops at its newer neighbour.
``s3fifo``  small / main / ghost as libCacheSim's S3FIFO (sizes from the capacity); a newcomer whose key is a
            ghost goes to main (the key leaves the ghost), before anything was evicted a newcomer goes to main
            once small holds its share, else to small, with frequency 0; a hit adds 1. Eviction from main when
            it holds more than ``C - small`` or small is empty, else from small: small's oldest moves to main
            (frequency 0) when pinned or hit ``promote`` times and the pass goes on, else it leaves, its key to
            the ghost (the ghost's oldest key leaves past its size); main's oldest is reinserted when pinned
            (frequency kept) or hit (``min(f, 3) - 1``), else it leaves; when every block in main is pinned the
            eviction goes to small.
``lfu``     libCacheSim's in-cache LFU: a newcomer at frequency 1 (the newest of its bucket), a hit moves the block
            to the newest end of the next frequency; the victim is the least frequent block no running request
            holds, the oldest of its frequency (pinned blocks keep their place).
``clock``   libCacheSim's Clock: a newcomer at the newest end with frequency 0, a hit sets 1; the oldest block
            moves to the newest end when pinned (frequency kept) or at frequency 1 (cleared to 0), else leaves.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["POOL_ORACLES", "FifoPool", "SievePool", "S3FifoPool", "LfuPool", "ClockPool"]


class FifoPool:
    def __init__(self, capacity, **_):
        self.q: OrderedDict = OrderedDict()  # oldest first

    def insert(self, k):
        self.q[k] = None

    def hit(self, k):
        pass

    def victim(self, pinned):
        while True:
            k, _ = self.q.popitem(last=False)
            if not pinned(k):
                return k
            self.q[k] = None


class SievePool:
    def __init__(self, capacity, **_):
        self.order: list = []  # oldest (tail) first
        self.vis: dict = {}
        self.hand = None  # the block the hand points at (None: the tail)

    def insert(self, k):
        self.order.append(k)
        self.vis[k] = 0

    def hit(self, k):
        self.vis[k] = 1

    def victim(self, pinned):
        i = 0 if self.hand is None else self.order.index(self.hand)
        while True:
            k = self.order[i]
            if not pinned(k) and self.vis[k] == 0:
                break
            if not pinned(k):
                self.vis[k] = 0
            i = (i + 1) % len(self.order)
        self.hand = self.order[i + 1] if i + 1 < len(self.order) else None
        del self.order[i], self.vis[k]
        return k


class S3FifoPool:
    def __init__(self, capacity, small=0, ghost=0, promote=2):
        self.C, self.cs, self.cg, self.th = int(capacity), int(small), int(ghost), int(promote)
        self.small: OrderedDict = OrderedDict()  # oldest first
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.evicted = False

    def insert(self, k):
        if k in self.ghost:
            del self.ghost[k]
            self.main[k] = None
        elif not self.evicted and len(self.small) >= self.cs:
            self.main[k] = None
        else:
            self.small[k] = None
        self.freq[k] = 0

    def hit(self, k):
        self.freq[k] += 1

    def victim(self, pinned):
        self.evicted = True
        while True:
            if len(self.main) > self.C - self.cs or not self.small:
                run = 0
                while self.main and run < len(self.main):
                    t = next(iter(self.main))
                    self.main.move_to_end(t)
                    if pinned(t):
                        run += 1
                    elif self.freq[t] >= 1:
                        self.freq[t] = min(self.freq[t], 3) - 1
                        run = 0
                    else:
                        del self.main[t], self.freq[t]
                        return t
            while self.small:
                t, _ = self.small.popitem(last=False)
                if pinned(t) or self.freq[t] >= self.th:
                    self.main[t] = None
                    self.freq[t] = 0
                else:
                    del self.freq[t]
                    if self.cg > 0:
                        while len(self.ghost) + 1 > self.cg:
                            self.ghost.popitem(last=False)
                        self.ghost[t] = None
                    return t


class LfuPool:
    def __init__(self, capacity, **_):
        self.freq: dict = {}
        self.order: dict = {}  # block -> when it entered its frequency (oldest first within a frequency)
        self.clock = 0

    def _stamp(self, k):
        self.clock += 1
        self.order[k] = self.clock

    def insert(self, k):
        self.freq[k] = 1
        self._stamp(k)

    def hit(self, k):
        self.freq[k] += 1
        self._stamp(k)

    def victim(self, pinned):
        k = min((b for b in self.freq if not pinned(b)), key=lambda b: (self.freq[b], self.order[b]))
        del self.freq[k], self.order[k]
        return k


class ClockPool:
    def __init__(self, capacity, **_):
        self.q: OrderedDict = OrderedDict()  # block -> frequency, oldest first

    def insert(self, k):
        self.q[k] = 0

    def hit(self, k):
        self.q[k] = 1

    def victim(self, pinned):
        while True:
            k, f = self.q.popitem(last=False)
            if not pinned(k) and f == 0:
                return k
            self.q[k] = f if pinned(k) else 0


POOL_ORACLES = {"fifo": FifoPool, "sieve": SievePool, "s3fifo": S3FifoPool, "lfu": LfuPool, "clock": ClockPool}

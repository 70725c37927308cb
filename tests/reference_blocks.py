"""Plain-Python oracles of the per-block policies, as libCacheSim 0.3.5 implements them.

Each class is one replica's cache of unit-size objects with libCacheSim's ``get`` contract
(``cache.c``, ``cache_get_base``): look the object up (a hit updates the policy's metadata); on a
miss, if the object fits at all (size 1 <= capacity), evict until one more object fits, *then*
insert it, so a newcomer is never its own victim. The rules below are read from libCacheSim's
sources (``cache/eviction/FIFO.c``, ``Sieve.c``, ``S3FIFO.c``, ``LFU.c``, ``ARC.c``) with their
default parameters; ``tests/test_libcachesim_parity.py`` checks every class against libCacheSim
itself, access for access.

``fifo``    one queue; a hit changes nothing; evict the oldest object.
``sieve``   (Zhang et al., NSDI'24) one queue, newcomers at the head with ``visited = 0``, a hit sets
            ``visited = 1``; a hand starts at the tail (or where it stopped), clears visited bits
            while it walks toward the head (wrapping to the tail), evicts the first unvisited object
            and stops at that object's newer neighbour.
``s3fifo``  (Yang et al., SOSP'23) as libCacheSim's S3FIFO.c (FACTS.md, "Eviction policies as the
            field's reference implements them"): small ``int(0.1 C)``, main ``C - small``, ghost
            ``int(0.9 C)`` keys; a hit adds 1 to the frequency (uncapped); a newcomer goes to main if
            its key was in the ghost (the key leaves the ghost), else to small, except that while
            nothing has been evicted yet a newcomer goes to main once small holds its share; and a
            newcomer that is not a ghost hit is not admitted at all when small holds a single
            object (``obj_size >= small size``: C below 20). Eviction: from main when main is over
            its size or small is empty, else from small. Small's oldest object moves to main with
            frequency 0 when its frequency is >= 2 (and the pass goes on), else it leaves, its key
            entering the ghost (the ghost's oldest key leaves past its size). Main's oldest object
            with frequency >= 1 is reinserted with ``min(freq, 3) - 1``, one at 0 leaves.
``lfu``     in-cache LFU (LFU.c): a newcomer has frequency 1, a hit adds 1; evict the object with
            the lowest frequency, ties by the earliest arrival in that frequency (each frequency
            bucket appends on arrival and evicts its first). An evicted object's count is forgotten.
``arc``     ARC (Megiddo and Modha, FAST'03) as ARC.c: data lists T1 (seen once) and T2, ghost
            lists B1 and B2, the target ``p`` (a double, starting at 0). A hit in T1 moves to T2's
            head, a hit in T2 to its head. A ghost hit in B1 raises ``p`` by ``max(|B2| / |B1|, 1)``
            (capped at C), in B2 lowers it by ``max(|B1| / |B2|, 1)`` (floored at 0), removes the key
            from its ghost list and, after the eviction below, inserts at T2's head; other misses
            insert at T1's head. Eviction on a ghost hit is REPLACE; on other misses: when
            ``|T1| + |B1| + 1 > C``, drop B1's oldest and REPLACE if B1 is not empty, else drop T1's
            oldest outright; otherwise drop B2's oldest first if ``|T1| + |B1| + |T2| + |B2| >= 2C``
            (and B2 is not empty), then REPLACE. REPLACE moves T1's oldest to B1's head when T1 is
            not empty and (``|T1| > p`` or ``|T1| == p`` on a B2 hit), or when T2 is empty; else T2's
            oldest to B2's head.
``clock``   CLOCK (second chance, Clock.c with its defaults: a 1-bit counter, newcomers at 0): one queue,
            newcomers at the head with frequency 0, a hit sets it to 1; to evict, while the oldest object has
            frequency 1 it is moved to the head with frequency 0; then the oldest leaves.

On prefix streams (:func:`block_simulate`) a request's hit is the longest leading run of its blocks
present (stored, not a ghost) on the chosen replica at lookup; then its blocks are accessed one by
one, leaf-first (last block first), each a ``get``: the engine's touch order, the order the bench
feeds libCacheSim. A block evicted while its own request is being stored is simply gone.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["FIFOCache", "SieveCache", "S3FIFOCache", "LFUCache", "ARCCache", "ClockCache", "BLOCK_ORACLES",
           "block_simulate", "object_hits"]


class FIFOCache:
    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.q: OrderedDict = OrderedDict()  # oldest first

    def __contains__(self, key) -> bool:
        return key in self.q

    def __len__(self) -> int:
        return len(self.q)

    def get(self, key) -> bool:
        if key in self.q:
            return True
        if self.capacity < 1:
            return False
        while len(self.q) + 1 > self.capacity:
            self.q.popitem(last=False)
        self.q[key] = None
        return False


class SieveCache:
    """The queue as a doubly linked list: ``newer[k]`` toward the head, ``older[k]`` toward the tail."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.visited: dict = {}
        self.newer: dict = {}
        self.older: dict = {}
        self.head = self.tail = self.hand = None

    def __contains__(self, key) -> bool:
        return key in self.visited

    def __len__(self) -> int:
        return len(self.visited)

    def get(self, key) -> bool:
        if key in self.visited:
            self.visited[key] = 1
            return True
        if self.capacity < 1:
            return False
        while len(self.visited) + 1 > self.capacity:
            self._evict()
        self.visited[key] = 0
        self.newer[key], self.older[key] = None, self.head
        if self.head is not None:
            self.newer[self.head] = key
        self.head = key
        if self.tail is None:
            self.tail = key
        return False

    def _evict(self) -> None:
        o = self.tail if self.hand is None else self.hand
        while self.visited[o] > 0:
            self.visited[o] = 0
            o = self.tail if self.newer[o] is None else self.newer[o]
        self.hand = self.newer[o]
        n, d = self.newer.pop(o), self.older.pop(o)
        if n is None:
            self.head = d
        else:
            self.older[n] = d
        if d is None:
            self.tail = n
        else:
            self.newer[d] = n
        del self.visited[o]


class S3FIFOCache:
    def __init__(self, capacity: int, small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9,
                 move_to_main_threshold: int = 2):
        C = int(capacity)
        self.capacity = C
        self.small_capacity = int(C * small_size_ratio)
        self.main_capacity = C - self.small_capacity
        self.ghost_capacity = int(C * ghost_size_ratio)
        self.threshold = int(move_to_main_threshold)
        self.small: OrderedDict = OrderedDict()
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.has_evicted = False

    def __contains__(self, key) -> bool:
        return key in self.freq

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def get(self, key) -> bool:
        if key in self.small:
            self.freq[key] += 1
            return True
        from_ghost = self.ghost_capacity > 0 and self.ghost.pop(key, 0) is None
        if key in self.main:
            self.freq[key] += 1
            return True
        if self.capacity < 1:
            return False
        while len(self) + 1 > self.capacity:
            self._evict()
        if from_ghost:
            self.main[key] = None
        elif 1 >= self.small_capacity:
            return False  # libCacheSim: an object as large as small is not admitted
        elif not self.has_evicted and len(self.small) >= self.small_capacity:
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0
        return False

    def _evict(self) -> None:
        self.has_evicted = True
        if len(self.main) > self.main_capacity or not self.small:
            while self.main:
                t = next(iter(self.main))
                f = self.freq[t]
                if f >= 1:
                    self.main.move_to_end(t)
                    self.freq[t] = min(f, 3) - 1
                else:
                    del self.main[t], self.freq[t]
                    return
        else:
            while self.small:
                t, _ = self.small.popitem(last=False)
                if self.freq[t] >= self.threshold:
                    self.main[t] = None
                    self.freq[t] = 0
                else:
                    del self.freq[t]
                    if self.ghost_capacity > 0 and t not in self.ghost:
                        while len(self.ghost) + 1 > self.ghost_capacity:
                            self.ghost.popitem(last=False)
                        self.ghost[t] = None
                    return


class LFUCache:
    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.freq: dict = {}
        self.bucket: dict[int, OrderedDict] = {}

    def __contains__(self, key) -> bool:
        return key in self.freq

    def __len__(self) -> int:
        return len(self.freq)

    def get(self, key) -> bool:
        f = self.freq.get(key)
        if f is not None:
            del self.bucket[f][key]
            self.freq[key] = f + 1
            self.bucket.setdefault(f + 1, OrderedDict())[key] = None
            return True
        if self.capacity < 1:
            return False
        while len(self.freq) + 1 > self.capacity:
            m = min(g for g, b in self.bucket.items() if b)
            victim, _ = self.bucket[m].popitem(last=False)
            del self.freq[victim]
        self.freq[key] = 1
        self.bucket.setdefault(1, OrderedDict())[key] = None
        return False


class ARCCache:
    """Lists are ``OrderedDict``s with the oldest (LRU end) first."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()
        self.p = 0.0

    def __contains__(self, key) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def get(self, key) -> bool:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
            return True
        if key in self.t2:
            self.t2.move_to_end(key)
            return True
        C = self.capacity
        in_b1, in_b2 = key in self.b1, key in self.b2
        if in_b1:
            self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), C)
            del self.b1[key]
        elif in_b2:
            self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
            del self.b2[key]
        if C < 1:
            return False
        while len(self) + 1 > C:
            if in_b1 or in_b2:
                self._replace(in_b2)
            elif len(self.t1) + len(self.b1) + 1 > C:
                if self.b1:
                    self.b1.popitem(last=False)
                    self._replace(False)
                else:
                    self.t1.popitem(last=False)
            else:
                if len(self.t1) + len(self.b1) + len(self.t2) + len(self.b2) >= 2 * C and self.b2:
                    self.b2.popitem(last=False)
                self._replace(False)
        (self.t2 if in_b1 or in_b2 else self.t1)[key] = None
        return False

    def _replace(self, in_b2: bool) -> None:
        n1 = len(self.t1)
        if (n1 > 0 and (n1 > self.p or (n1 == self.p and in_b2))) or not self.t2:
            k, _ = self.t1.popitem(last=False)
            self.b1[k] = None
        else:
            k, _ = self.t2.popitem(last=False)
            self.b2[k] = None


class ClockCache:
    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.q: OrderedDict = OrderedDict()  # key -> frequency, oldest first

    def __contains__(self, k):
        return k in self.q

    def __len__(self):
        return len(self.q)

    def held(self) -> list:
        return list(self.q)

    def get(self, k) -> bool:
        if k in self.q:
            self.q[k] = 1
            return True
        if self.capacity < 1:
            return False
        while len(self.q) + 1 > self.capacity:
            while True:
                t, f = next(iter(self.q.items()))
                if f < 1:
                    break
                del self.q[t]
                self.q[t] = 0
            del self.q[t]
        self.q[k] = 0
        return False


BLOCK_ORACLES = {"fifo": FIFOCache, "sieve": SieveCache, "s3fifo": S3FIFOCache, "lfu": LFUCache, "arc": ARCCache,
                 "clock": ClockCache}


def object_hits(policy: str, seq, capacity: int, **knobs) -> list[int]:
    """Hit (1) or miss (0) of every access of an object stream ``seq`` on one cache."""
    c = BLOCK_ORACLES[policy](capacity, **knobs)
    return [int(c.get(int(k))) for k in seq]


def block_simulate(workload, *, policy: str, capacity_blocks: int, replicas: int = 1, router: str = "round_robin",
                   prefix_blocks: int = 80, replica_choices=None, knobs: dict | None = None) -> dict:
    """A prefix workload through per-block ``policy`` (module docstring): per-request ``hit_blocks``,
    ``hit_tokens``, ``replica``, per replica ``max_occupancy`` and the final ``occupancy``."""
    from cacheresearch.routers import prefix_hash_u64  # noqa: PLC0415

    if policy not in BLOCK_ORACLES:
        raise ValueError(f"unknown block policy {policy!r}; one of {sorted(BLOCK_ORACLES)}")
    R, N = int(replicas), workload.n_requests
    caches = [BLOCK_ORACLES[policy](int(capacity_blocks), **(knobs or {})) for _ in range(R)]
    hit_blocks = np.zeros(N, np.int64)
    replica = np.zeros(N, np.int64)
    max_occ = np.zeros(R, np.int64)
    choices = None if replica_choices is None else [int(c) for c in np.asarray(replica_choices).reshape(-1)]
    for i in range(N):
        keys = [int(k) for k in workload.request_keys(i)]
        n = len(keys)
        if router == "round_robin":
            r = i % R
        elif router == "random":
            r = choices[i]
        elif router == "prefix_hash":
            k = min(int(prefix_blocks), n)
            r = int(prefix_hash_u64(int(keys[k - 1] if n > 0 else 0))) % R
        else:
            raise ValueError(f"router {router!r}: the oracle routes round_robin, random or prefix_hash")
        replica[i] = r
        c = caches[r]
        h = 0
        for key in keys:
            if key not in c:
                break
            h += 1
        hit_blocks[i] = h
        for key in reversed(keys):
            c.get(key)
        max_occ[r] = max(max_occ[r], len(c))
    bt = int(workload.block_tokens)
    hit_tokens = np.minimum(hit_blocks * bt, np.asarray(workload.input_tokens, np.int64))
    total = int(np.sum(workload.input_tokens))
    return {"hit_blocks": hit_blocks, "hit_tokens": hit_tokens, "replica": replica, "max_occupancy": max_occ,
            "occupancy": np.asarray([len(c) for c in caches], np.int64),
            "token_hit_rate": float(hit_tokens.sum() / total) if total else 0.0}

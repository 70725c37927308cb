"""Plain-Python reference simulator: the oracle the JAX engine must match exactly.

Deliberately simple: one loop over requests, one ``OrderedDict`` per replica, no vectorization.

Semantics
---------
A fleet of ``replicas`` replicas, each with its own cache. For each request, in order:

1. The router picks a replica ``r``.
2. Lookup (before any insertion or eviction for this request, at ``now = arrival_ms[i]``):
   ``hit_blocks`` is the length of the longest leading run of the request's block keys present
   on ``r`` (the first miss stops reuse); ``hit_tokens = min(hit_blocks * block_tokens,
   input_tokens)``.
3. Update: every block of the request becomes present and refreshed, then eviction down to
   capacity.

Policies
    ``lru``         leaf-first LRU (vLLM / SGLang): the request's blocks are touched in *reverse*
                    prompt order, so its first block ends most recent and its last block least
                    recent; then the least recent blocks are evicted while more than
                    ``capacity_blocks`` are stored. A request with ``n > C`` blocks leaves its
                    first ``C`` blocks cached.
    ``lru_plain``   textbook LRU: blocks touched in prompt order (first block least recent), then
                    the same eviction. A request with ``n > C`` blocks leaves its *last* ``C``.
    ``ttl_refresh`` a block is present iff stored and ``now - last_access <= ttl_ms``; every access
                    (hit or write) sets ``last_access = now``. No capacity limit.
    ``ttl_fixed``   present iff stored and ``now - write_time <= ttl_ms``; missing (absent or
                    expired) blocks get ``write_time = now``, present blocks keep theirs. No
                    capacity limit.
    ``unbounded``   never evicts (blocks touched leaf-first, as ``lru``, for the recency order
                    reported in ``final_contents``).

    ``ttl_ms = round(ttl_s * 1000)`` (Python's ``round``).

Bounded policies beyond LRU
    Each needs ``capacity_blocks = C >= 0`` and uses the same request semantics: lookup first (the
    hit is the longest leading run of the request's keys present on the replica), then every block
    of the request is stored or refreshed, and only then, once per request, does the policy evict
    down to ``C``. *Leaf-first recency*: a replica keeps a clock; the request's blocks are touched
    in reverse prompt order, each touch taking the next clock value, so its first block ends most
    recent (as ``lru``). A key repeated inside one request (not possible with chained keys) is
    counted once per request by ``lfu`` and takes its first occurrence's position and recency.

    ``lfu``          "perfect-history" LFU (Breslau, Cao, Fan, Phillips, Shenker, INFOCOM 1999,
                     "perfect LFU", as opposed to in-cache LFU). ``count[r][key]`` = number of
                     requests routed to replica ``r`` that contained ``key``, over the whole
                     history, including the current request, and *not* reset when the key is
                     evicted. Eviction removes, one at a time while more than ``C`` are stored,
                     the stored block with the smallest ``(count, recency)``: lowest count
                     first, ties by least recent (leaf-first clock). Prefix-closed with chained
                     keys: every request that contains a key contains its parent, so
                     ``count(child) <= count(parent)``, and on equal counts the child is less
                     recent (the parent was touched after it in the child's last request, and
                     maybe later), so a child always goes before its parent.
                     On a workload that repeats a fixed list of requests with pairwise disjoint
                     keys, ``(count, recency)`` orders keys as recency alone does and ``lfu`` is
                     ``lru``; a key shared by two requests of the list (a common prefix) breaks it.
                     ``final_contents[r]``: dict ``key -> count`` in eviction order (first = next
                     to go). Run-compressed engine: exact with one count and one recency stamp
                     per run, plus the run's stored length: every request holding one block of a
                     run holds all of it and touches it contiguously, so its blocks share the
                     count and have consecutive stamps no other block falls between; eviction
                     then takes whole runs in ``(count, stamp)`` order, each from its deep end,
                     the last one maybe in part (a stored prefix remains).
    ``length_aware`` Mooncake's LengthAwareCache (Qin et al., arXiv 2407.00079, Table 1): eviction
                     removes first the stored block that sits deepest in its prompt, i.e. with
                     the largest *position* (0-based index of the block in the request that last
                     touched it; with chained keys a key has the same position in every
                     request), ties by least recent (leaf-first clock). Prefix-closed with
                     chained keys: a child's position is its parent's plus one, so the child
                     always goes first. With one block per request every position is 0 and the
                     policy is ``lru``. ``final_contents[r]``: dict ``key -> position`` in eviction
                     order. Run-compressed engine: exact with one recency stamp, a first position
                     and a stored length per run (positions inside a run are consecutive and the
                     run is evicted from its deep end), but the eviction order interleaves runs by
                     depth, so the engine must pick, block by block, the run whose deepest stored
                     block is deepest (then least recent), not whole runs.
    ``s3fifo_sosp`` S3-FIFO (Yang, Zhang, Qiu, Yue, Vinayak, SOSP 2023, "FIFO queues are all you
                     need for cache eviction", Algorithm 1) at block granularity, per replica:
                     a small FIFO ``S`` of capacity ``cS = min(C, max(1, C // 10))`` blocks (floor
                     of 10% in integer arithmetic, at least one), a main FIFO ``M`` of capacity
                     ``cM = C - cS`` and a ghost FIFO ``G`` of keys only (no blocks) holding at most
                     ``cG = cM`` keys (the paper's default: as many entries as ``M``; libCacheSim's
                     ``ghost_size_ratio=0.9`` of ``C`` is the same for C a multiple of 10). Each
                     stored block has ``freq`` in 0..3.

                     Update, the request's blocks in leaf-first order (last block first): a block
                     present in ``S`` or ``M`` when touched gets ``freq = min(freq + 1, 3)``
                     (Algorithm 1, READ); a missing block is inserted at the head of ``M`` if its
                     key is in ``G`` (the key leaves ``G``), else at the head of ``S``, with
                     ``freq = 0``. Blocks never move on a hit.

                     Eviction, after the whole request is stored: ``while |S| + |M| > C: EVICT``.
                     ``EVICT``: ``EVICT_S`` if ``|S| > cS`` or ``M`` is empty, else ``EVICT_M``.
                     ``EVICT_S`` (Algorithm 1, EVICTS): repeat until one block has left the cache
                     or ``S`` is empty: take ``S``'s tail ``t``; if ``t.freq > 1`` (the test in
                     Algorithm 1's EVICTS, and libCacheSim's default ``move_to_main_threshold=2``;
                     the S3-FIFO blog's figure and some ports use ``> 0``) move ``t`` to
                     ``M``'s head with ``freq = 0`` and, if ``M`` now holds more than ``cM``
                     blocks, run ``EVICT_M`` at once (Algorithm 1: "if M is full then EVICTM");
                     else drop ``t`` and append its key to ``G`` (dropping ``G``'s oldest key past
                     ``cG``; nothing is kept when ``cG = 0``). ``EVICT_M`` (EVICTM): repeat until one
                     block has left: take ``M``'s tail ``t``; if ``t.freq > 0`` reinsert it at
                     ``M``'s head with ``freq - 1``, else drop it (its key does not enter ``G``).

                     Choices, each forced by the store-then-evict rule or written down here:
                     (1) Algorithm 1 evicts *before* inserting a missed object, testing
                     ``|S| >= 10% of C``; here the test runs after the request is stored, as
                     ``|S| > cS``. For C a multiple of 10 and a one-block request inserted into
                     ``S`` the two pick the same queue; for one inserted into ``M`` from ``G``
                     while ``|S| = cS``, Algorithm 1 evicts from ``S`` and this rule from ``M``
                     (the queue that is over its share). (2) The request's own new blocks can be
                     evicted by the same request (a request longer than ``C``, or ``S``'s older
                     blocks all promoted).
                     (3) Like Algorithm 1, one ``EVICT`` can remove two blocks (an ``M`` block
                     pushed out by a promotion, then an ``S`` block), so a replica can end a
                     request below ``C``. (4) No warm-up rule: before the first eviction every
                     new block goes to ``S`` even past ``cS`` (libCacheSim's S3FIFO.c, as shipped in
                     libcachesim 0.3.5, instead sends new objects to ``M`` while ``S`` is full and
                     nothing was evicted yet, and evicts an ``M`` overflow lazily, at the next
                     eviction; tests/test_reference_policies.py reproduces it exactly on top of
                     this implementation and bounds the difference in hit ratio).
                     Not prefix-closed in general: ``M`` and ``G`` keep or readmit blocks by their
                     own history, so a child can outlive its parent. ``final_contents[r]``: dict
                     ``key -> (queue, freq)`` with ``S`` from tail (oldest) to head, then ``M``
                     from tail to head; the result also has ``s3fifo_ghost`` (per replica, ``G``'s
                     keys from oldest to newest). Run-compressed engine: not exact with one state
                     per run: a partly evicted run is readmitted block by block, so one run's
                     blocks end up with different frequencies and split across ``S``, ``M`` and
                     ``G``; the engine would need per-segment state, up to one per block.

Routers
    ``round_robin``  request ``i`` goes to ``i mod R``.
    ``random``       the caller supplies the choices (``replica_choices``, one per request); the
                     engine's PRNG draws cannot be reproduced in pure Python.
    ``prefix_hash``  ``prefix_hash_u64(key of block min(K, n) - 1) mod R`` with ``K =
                     prefix_blocks``; a request with no blocks hashes key 0.
                     ``prefix_hash_u64`` comes from :mod:`cacheresearch.routers`.

Occupancy and final contents
    ``max_occupancy[r]`` is the maximum, over the requests served by ``r``, of the number of blocks
    stored on ``r`` after that request's update and eviction (``s3fifo``: ``|S| + |M|``). For the
    TTL policies expired entries are dropped before each lookup, so the stored count after a
    request equals the number of blocks live at that request's time. ``final_contents[r]`` is, for
    ``lru``, ``lru_plain`` and ``unbounded``, the list of keys from least to most recent; for the
    TTL policies a dict ``key -> time`` (last access for ``ttl_refresh``, write time for
    ``ttl_fixed``) of the blocks still live at the last request's arrival time; for ``lfu``,
    ``length_aware`` and ``s3fifo`` the dicts described with each policy above.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

import numpy as np

__all__ = [
    "reference_simulate", "check_prefix_closed", "policy_limits", "drop_expired", "touch",
    "POLICIES", "ROUTERS", "PREFIX_CLOSED_POLICIES", "ScoredCache", "LFUCache", "LengthAwareCache", "S3FIFOCache",
]

POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded", "lfu_perfect", "length_aware", "s3fifo_sosp")
BOUNDED_POLICIES = ("lru", "lru_plain", "lfu_perfect", "length_aware", "s3fifo_sosp")  # capacity_blocks required
# Policies whose cache stays prefix-closed on chained keys (checked after every request with debug=True).
PREFIX_CLOSED_POLICIES = ("lru", "lfu_perfect", "length_aware")
ROUTERS = ("random", "round_robin", "prefix_hash")


def _prefix_hash_u64(key: int) -> int:
    from cacheresearch.routers import prefix_hash_u64  # defined by the engine's router module

    return int(prefix_hash_u64(int(key)))


def _predecessor_pairs(workload) -> set[tuple[int, int]]:
    """All ``(block j key, block j-1 key)`` pairs of the workload."""
    pairs = set()
    for i in range(workload.n_requests):
        ks = [int(k) for k in workload.request_keys(i)]
        for j in range(1, len(ks)):
            pairs.add((ks[j], ks[j - 1]))
    return pairs


def check_prefix_closed(workload, contents, _pairs=None) -> None:
    """Assert that ``contents`` is prefix-closed with respect to ``workload``.

    Whenever block ``j`` of any request is in ``contents`` (an iterable or dict of keys), block
    ``j - 1`` of that request must be too. Holds for leaf-first ``lru`` on chained keys (every
    key has one fixed predecessor). Raises ``AssertionError`` naming the first violation.
    """
    present = {int(k) for k in contents}
    pairs = _predecessor_pairs(workload) if _pairs is None else _pairs
    for key, prev in pairs:
        if key in present and prev not in present:
            raise AssertionError(
                f"cache is not prefix-closed: block {key} is cached but its predecessor {prev} is not"
            )


def policy_limits(policy: str, capacity_blocks, ttl_s) -> tuple[int | None, int | None]:
    """(capacity or None, ttl_ms or None) of a policy, validated."""
    capacity = None
    if policy in BOUNDED_POLICIES:
        if capacity_blocks is None or int(capacity_blocks) < 0:
            raise ValueError(f"policy {policy!r} needs capacity_blocks >= 0")
        capacity = int(capacity_blocks)
    ttl_ms = None
    if policy in ("ttl_refresh", "ttl_fixed"):
        if ttl_s is None or ttl_s < 0:
            raise ValueError(f"policy {policy!r} needs ttl_s >= 0")
        ttl_ms = int(round(ttl_s * 1000))
    return capacity, ttl_ms


def drop_expired(cache: OrderedDict, now: int, ttl_ms: int) -> None:
    """Drop expired entries. TTL caches are ordered by their time field (times are non-decreasing
    and updated entries move to the end), so expired entries form a prefix of the order."""
    while cache:
        _, t = next(iter(cache.items()))
        if now - t > ttl_ms:
            cache.popitem(last=False)
        else:
            break


def touch(cache: OrderedDict, keys: list[int], policy: str, now: int) -> None:
    """Store and refresh a request's blocks (before eviction) in the policy's recency order."""
    if policy in ("lru", "unbounded"):
        for key in reversed(keys):  # leaf first: the request's first block ends most recent
            cache[key] = now
            cache.move_to_end(key)
    elif policy in ("lru_plain", "ttl_refresh"):
        for key in keys:  # prompt order: the request's last block ends most recent
            cache[key] = now
            cache.move_to_end(key)
    elif policy == "ttl_fixed":
        for key in keys:
            if key not in cache:  # expired blocks were dropped before: write them afresh
                cache[key] = now


class ScoredCache:
    """Stored keys, each with a score; ``evict_to(C)`` removes the smallest scores until ``C`` remain.

    Scores are tuples that end in a clock value unique per replica, so no two stored keys tie. A heap
    with lazy deletion: an entry is live iff its key is stored with exactly that score.
    """

    def __init__(self):
        self.score: dict[int, tuple] = {}
        self._heap: list[tuple] = []

    def __contains__(self, key) -> bool:
        return key in self.score

    def __len__(self) -> int:
        return len(self.score)

    def __iter__(self):
        return iter(self.score)

    def set(self, key: int, score: tuple) -> None:
        self.score[key] = score
        heapq.heappush(self._heap, (score, key))
        if len(self._heap) > 4 * len(self.score) + 64:  # drop stale entries now and then
            self._heap = [(sc, k) for k, sc in self.score.items()]
            heapq.heapify(self._heap)

    def evict_to(self, capacity: int) -> None:
        while len(self.score) > capacity:
            sc, key = heapq.heappop(self._heap)
            if self.score.get(key) == sc:
                del self.score[key]

    def ordered(self) -> list[int]:
        """Stored keys in eviction order (first = the next to go)."""
        return sorted(self.score, key=self.score.__getitem__)


class LFUCache(ScoredCache):
    """``lfu``: score ``(count, clock)``; ``count`` over the replica's whole history (perfect LFU)."""

    def __init__(self):
        super().__init__()
        self.count: dict[int, int] = {}
        self.clock = 0

    def access(self, keys: list[int]) -> None:
        for key in dict.fromkeys(keys):  # once per request, even if a key repeats inside it
            self.count[key] = self.count.get(key, 0) + 1
        for key in reversed(keys):  # leaf first: the first block ends most recent
            self.clock += 1
            self.set(key, (self.count[key], self.clock))

    def contents(self) -> dict:
        return {k: self.score[k][0] for k in self.ordered()}


class LengthAwareCache(ScoredCache):
    """``length_aware``: score ``(-position, clock)``: deepest first, then least recent."""

    def __init__(self):
        super().__init__()
        self.clock = 0

    def access(self, keys: list[int]) -> None:
        for j in range(len(keys) - 1, -1, -1):  # leaf first; a repeated key keeps its first position
            self.clock += 1
            self.set(keys[j], (-j, self.clock))

    def contents(self) -> dict:
        return {k: -self.score[k][0] for k in self.ordered()}


class S3FIFOCache:
    """``s3fifo`` on one replica (module docstring). Queues are ``OrderedDict``s, tail first, head last.

    ``move_to_main_threshold`` (default 2: promote from ``S`` when ``freq > 1``, Algorithm 1) is
    libCacheSim's parameter of the same name; tests vary it. The small methods (``insert``,
    ``evict_small_next``, ``after_promotion``) are the points where published variants differ.
    """

    FREQ_CAP = 3

    def __init__(self, capacity: int, move_to_main_threshold: int = 2):
        C = int(capacity)
        if C < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = C
        self.small_capacity = min(C, max(1, C // 10))
        self.main_capacity = C - self.small_capacity
        self.ghost_capacity = self.main_capacity
        self.move_to_main_threshold = int(move_to_main_threshold)
        self.small: OrderedDict = OrderedDict()
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.freq: dict[int, int] = {}  # stored keys (S and M) -> frequency

    def __contains__(self, key) -> bool:
        return key in self.freq

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def __iter__(self):
        return iter(self.freq)

    # ---- update
    def access(self, keys: list[int]) -> None:
        for key in reversed(keys):  # leaf first: the last block is inserted first (nearest S's tail)
            if key in self.freq:
                self.freq[key] = min(self.freq[key] + 1, self.FREQ_CAP)
            else:
                self.insert(key)

    def insert(self, key: int) -> None:
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0

    # ---- eviction
    def evict(self) -> None:
        while len(self) > self.capacity:
            if self.evict_small_next():
                self.evict_small()
            else:
                self.evict_main()

    def evict_small_next(self) -> bool:
        return len(self.small) > self.small_capacity or not self.main

    def evict_small(self) -> None:
        while self.small:
            t, _ = self.small.popitem(last=False)
            if self.freq[t] >= self.move_to_main_threshold:
                self.main[t] = None
                self.freq[t] = 0
                self.after_promotion()
            else:
                del self.freq[t]
                self.remember(t)
                return

    def after_promotion(self) -> None:
        if len(self.main) > self.main_capacity:  # Algorithm 1: "if M is full then EVICTM"
            self.evict_main()

    def evict_main(self) -> None:
        while self.main:
            t = next(iter(self.main))
            if self.freq[t] > 0:
                self.main.move_to_end(t)
                self.freq[t] -= 1
            else:
                del self.main[t]
                del self.freq[t]
                return

    def remember(self, key: int) -> None:
        if self.ghost_capacity > 0:
            self.ghost[key] = None
            if len(self.ghost) > self.ghost_capacity:
                self.ghost.popitem(last=False)

    # ---- inspection
    def contents(self) -> dict:
        out = {k: ("S", self.freq[k]) for k in self.small}
        out.update({k: ("M", self.freq[k]) for k in self.main})
        return out


_STATEFUL = {"lfu_perfect": LFUCache, "length_aware": LengthAwareCache}


def reference_simulate(
    workload,
    *,
    policy: str,
    capacity_blocks: int | None = None,
    ttl_s: float | None = None,
    replicas: int = 1,
    router: str = "round_robin",
    prefix_blocks: int = 80,
    replica_choices=None,
    debug: bool = False,
) -> dict:
    """Simulate ``workload`` request by request; see the module docstring for the semantics.

    Returns a dict with per-request numpy arrays ``hit_blocks``, ``hit_tokens``, ``replica``
    (int64), the scalars ``token_hit_rate`` and ``request_hit_rate``, ``max_occupancy`` (int64,
    one per replica) and ``final_contents`` (one entry per replica); for ``s3fifo`` also
    ``s3fifo_ghost`` (one list per replica). With ``debug=True`` and a policy in
    ``PREFIX_CLOSED_POLICIES`` (``lru``, ``lfu``, ``length_aware``) the serving replica's cache is
    checked to be prefix-closed after every request.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    if router not in ROUTERS:
        raise ValueError(f"unknown router {router!r}; expected one of {ROUTERS}")
    if int(replicas) < 1:
        raise ValueError("replicas must be >= 1")
    R = int(replicas)
    N = workload.n_requests

    capacity, ttl_ms = policy_limits(policy, capacity_blocks, ttl_s)

    if router == "random":
        if replica_choices is None:
            raise ValueError("router 'random' needs replica_choices (one replica per request)")
        choices = [int(c) for c in np.asarray(replica_choices).reshape(-1)]
        if len(choices) != N or any(not 0 <= c < R for c in choices):
            raise ValueError(f"replica_choices must hold {N} values in [0, {R})")
    if router == "prefix_hash" and int(prefix_blocks) < 1:
        raise ValueError("prefix_blocks must be >= 1")

    # Per replica: OrderedDict key -> time (recency order for LRU; time order for TTL); for lfu,
    # length_aware and s3fifo the policy's own state object (same `in` and `len`).
    if policy in _STATEFUL:
        caches = [_STATEFUL[policy]() for _ in range(R)]
    elif policy == "s3fifo_sosp":
        caches = [S3FIFOCache(capacity) for _ in range(R)]
    else:
        caches = [OrderedDict() for _ in range(R)]
    max_occ = [0] * R
    hit_blocks = np.zeros(N, dtype=np.int64)
    hit_tokens = np.zeros(N, dtype=np.int64)
    replica = np.zeros(N, dtype=np.int64)
    pairs = _predecessor_pairs(workload) if (debug and policy in PREFIX_CLOSED_POLICIES) else None


    bt = int(workload.block_tokens)
    for i in range(N):
        keys = [int(k) for k in workload.request_keys(i)]
        n = len(keys)
        now = int(workload.arrival_ms[i])

        # 1. route
        if router == "round_robin":
            r = i % R
        elif router == "random":
            r = choices[i]
        else:
            k = min(int(prefix_blocks), n)
            r = _prefix_hash_u64(keys[k - 1] if n > 0 else 0) % R
        replica[i] = r
        cache = caches[r]

        # 2. lookup
        if ttl_ms is not None:
            drop_expired(cache, now, ttl_ms)
        h = 0
        for key in keys:
            if key not in cache:
                break
            if ttl_ms is not None:
                assert now - cache[key] <= ttl_ms
            h += 1
        hit_blocks[i] = h
        hit_tokens[i] = min(h * bt, int(workload.input_tokens[i]))

        # 3. update and evict
        if policy in _STATEFUL:
            cache.access(keys)
            cache.evict_to(capacity)
        elif policy == "s3fifo_sosp":
            cache.access(keys)
            cache.evict()
        else:
            touch(cache, keys, policy, now)
            if capacity is not None:
                while len(cache) > capacity:
                    cache.popitem(last=False)  # least recent first
        max_occ[r] = max(max_occ[r], len(cache))

        if pairs is not None:
            check_prefix_closed(workload, cache, _pairs=pairs)

    final = []
    last_now = int(workload.arrival_ms[-1]) if N else 0
    for cache in caches:
        if policy in _STATEFUL or policy == "s3fifo_sosp":
            final.append(cache.contents())
        elif ttl_ms is None:
            final.append(list(cache.keys()))
        else:
            drop_expired(cache, last_now, ttl_ms)
            final.append(dict(cache))

    total_in = int(np.sum(workload.input_tokens))
    extra = {"s3fifo_ghost": [list(c.ghost) for c in caches]} if policy == "s3fifo_sosp" else {}
    return {
        "hit_blocks": hit_blocks,
        "hit_tokens": hit_tokens,
        "replica": replica,
        "token_hit_rate": float(hit_tokens.sum() / total_in) if total_in > 0 else 0.0,
        "request_hit_rate": float(np.mean(hit_blocks > 0)) if N else 0.0,
        "max_occupancy": np.asarray(max_occ, dtype=np.int64),
        "final_contents": final,
        **extra,
    }

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

Routers
    ``round_robin``  request ``i`` goes to ``i mod R``.
    ``random``       the caller supplies the choices (``replica_choices``, one per request); the
                     engine's PRNG draws cannot be reproduced in pure Python.
    ``prefix_hash``  ``prefix_hash_u64(key of block min(K, n) - 1) mod R`` with ``K =
                     prefix_blocks``; a request with no blocks hashes key 0.
                     ``prefix_hash_u64`` comes from :mod:`cacheresearch.routers`.

Occupancy and final contents
    ``max_occupancy[r]`` is the maximum, over the requests served by ``r``, of the number of blocks
    stored on ``r`` after that request's update and eviction. For the TTL policies expired
    entries are dropped before each lookup, so the stored count after a request equals the
    number of blocks live at that request's time. ``final_contents[r]`` is, for ``lru``,
    ``lru_plain`` and ``unbounded``, the list of keys from least to most recent; for the TTL
    policies a dict ``key -> time`` (last access for ``ttl_refresh``, write time for
    ``ttl_fixed``) of the blocks still live at the last request's arrival time.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["reference_simulate", "check_prefix_closed", "policy_limits", "drop_expired", "touch", "POLICIES", "ROUTERS"]

POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
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
    if policy in ("lru", "lru_plain"):
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
    one per replica) and ``final_contents`` (one entry per replica). With ``debug=True`` and
    ``policy="lru"`` the serving replica's cache is checked to be prefix-closed after every
    request.
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

    # Per replica: OrderedDict key -> time (recency order for LRU; time order for TTL).
    caches = [OrderedDict() for _ in range(R)]
    max_occ = [0] * R
    hit_blocks = np.zeros(N, dtype=np.int64)
    hit_tokens = np.zeros(N, dtype=np.int64)
    replica = np.zeros(N, dtype=np.int64)
    pairs = _predecessor_pairs(workload) if (debug and policy == "lru") else None


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
        if ttl_ms is None:
            final.append(list(cache.keys()))
        else:
            drop_expired(cache, last_now, ttl_ms)
            final.append(dict(cache))

    total_in = int(np.sum(workload.input_tokens))
    return {
        "hit_blocks": hit_blocks,
        "hit_tokens": hit_tokens,
        "replica": replica,
        "token_hit_rate": float(hit_tokens.sum() / total_in) if total_in > 0 else 0.0,
        "request_hit_rate": float(np.mean(hit_blocks > 0)) if N else 0.0,
        "max_occupancy": np.asarray(max_occ, dtype=np.int64),
        "final_contents": final,
    }

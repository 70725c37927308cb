"""Cache policies: names, and the dynamic parameters each one sets.

Every policy is the same engine (:mod:`cacheresearch.engine`) driven by four dynamic numbers, so a
grid over policies is one compiled program:

============  ==========  ===========  ================  ==========================================
policy        capacity    TTL          recency order     meaning
============  ==========  ===========  ================  ==========================================
lru           C blocks    none         leaf-first        vLLM / SGLang: after a request its first
                                                         block is the most recent, its last block the
                                                         least recent; the cache stays prefix-closed
lru_plain     C blocks    none         prompt order      blocks touched first to last (the seed's
                                                         snippet, libCacheSim on a forward stream)
ttl_refresh   unbounded   TTL          (unused)          present while now - last access <= TTL;
                                                         every access refreshes
ttl_fixed     unbounded   TTL          (unused)          expiry set at write; hits do not extend it
unbounded     unbounded   none         (unused)          never evicts: the ideal hit rate
lfu           C blocks    none         leaf-first        perfect-history LFU: evict the block with
                                                         the fewest requests (on this replica, ever)
                                                         that contained it, ties least recent first
length_aware  C blocks    none         leaf-first        Mooncake's LengthAwareCache: evict the block
                                                         deepest in its prompt first, ties least
                                                         recent first
s3fifo        C blocks    none         leaf-first touch  S3-FIFO (SOSP'23): small, main and ghost FIFO
                                                         queues, per block (cacheresearch.cache.s3fifo)
============  ==========  ===========  ================  ==========================================

``lfu`` and ``length_aware`` are *priority* policies (:mod:`cacheresearch.cache.priority`): they rank
stored runs by more than recency, so every run needs state (``compile_stream(...,
stateful_singletons=True)``) and the router's ``stale`` view is not available with them. Both keep
the cache prefix-closed on chained keys (a child's count never exceeds its parent's and on a tie it
is less recent; a child is deeper than its parent).

Common semantics: the hit of a request is the longest leading run of its block keys present on the
chosen replica at lookup (before any insertion or eviction for that request); afterwards every block of
the request is stored and refreshed (``ttl_fixed``: only missing blocks are written), then the LRU
policies evict least-recent blocks down to the capacity.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["POLICIES", "PolicySpec", "policy_spec", "is_priority", "PRIORITY_IDS", "S3FIFO_ID", "INF"]

INF = 2**31 - 1  # "no limit" for capacity and TTL (int32)


class PolicySpec(NamedTuple):
    id: int
    uses_capacity: bool
    uses_ttl: bool
    leaf_first: bool
    refresh_on_hit: bool
    priority: bool = False  # ranks runs beyond recency (cache.priority)
    block_state: bool = False  # keeps per-block state (cache.s3fifo)


POLICIES: dict[str, PolicySpec] = {
    "lru": PolicySpec(0, True, False, True, True),
    "lru_plain": PolicySpec(1, True, False, False, True),
    "ttl_refresh": PolicySpec(2, False, True, True, True),
    "ttl_fixed": PolicySpec(3, False, True, True, False),
    "unbounded": PolicySpec(4, False, False, True, True),
    "lfu": PolicySpec(5, True, False, True, True, priority=True),
    "length_aware": PolicySpec(6, True, False, True, True, priority=True),
    "s3fifo": PolicySpec(7, True, False, True, True, block_state=True),
}
S3FIFO_ID = POLICIES["s3fifo"].id
PRIORITY_IDS = tuple(p.id for p in POLICIES.values() if p.priority)


def is_priority(policy_id):
    """Whether policy ids (array or tracer) name a priority policy."""
    import jax.numpy as jnp

    return jnp.isin(policy_id, jnp.asarray(PRIORITY_IDS, jnp.int32))


def policy_spec(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None

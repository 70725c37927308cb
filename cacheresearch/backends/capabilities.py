"""What each numba backend models, registered in :mod:`cacheresearch.core.registry` (imports no numba).

The tables the backends themselves read (the fcfs backend's policies, the vllm pool's orders) are declared
here once, with the reason the vllm pool refuses each other policy, so that the engine's checks
(:func:`cacheresearch.core.simulate.check_bounds`) and refusals read them on any host, numba installed or not.
:mod:`cacheresearch.backends` imports this module, which registers the three backends by module name: a
backend's module (numba, its kernels) is imported when a run needs it.
"""

from __future__ import annotations

from cacheresearch.cache.block import BLOCK_POLICY_IDS
from cacheresearch.core.registry import NumbaBackend, register_numba

__all__ = ["REPLAY_POLICIES", "POOL_POLICIES", "POOL_REFUSED"]

#: The policies of the fcfs backend (:mod:`cacheresearch.backends.numba_cache`): the run store's.
REPLAY_POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
#: The vllm pool's free-block orders on the numba vllm backend (:mod:`cacheresearch.backends.numba_vllm`).
POOL_POLICIES = ("lru", "unbounded", "ttl_refresh", "fifo", "sieve", "s3fifo")
#: Why the vllm pool refuses the other policies (one line each).
POOL_REFUSED = {
    "lru_plain": "vLLM frees a request's blocks tail first, so its LRU is leaf-first (lru)",
    "ttl_fixed": "a fixed expiry counts from a block's write, and chunked prefill writes one run's blocks over "
                 "several steps while the pool keeps one time per run (ttl_refresh counts from the release)",
    "lfu": "its frequency buckets are not kept in the vllm pool (fifo, sieve, s3fifo are)",
    "arc": "its ghost lists and adaptive target are not kept in the vllm pool (fifo, sieve, s3fifo are)",
    "lfu_perfect": "its counts survive eviction, which needs the fcfs replica's whole-request store",
    "length_aware": "it ranks whole stored requests by depth, which needs the fcfs replica's store",
    "s3fifo_sosp": "its queues follow whole stored requests (fcfs); libCacheSim's per-block s3fifo runs on the pool",
}

register_numba("fcfs", NumbaBackend(
    "cacheresearch.backends.numba_cache",
    f"with the policies {list(REPLAY_POLICIES)} and the routers that read neither load nor cache",
    REPLAY_POLICIES))
register_numba("blocks", NumbaBackend(
    "cacheresearch.backends.numba_blocks",
    f"with the per-block policies {list(BLOCK_POLICY_IDS)} and every router (kv_cost at "
    "temperature 0) on the precise, approximate and stale views",
    BLOCK_POLICY_IDS))
register_numba("vllm", NumbaBackend(
    "cacheresearch.backends.numba_vllm",
    f"with the policies {list(POOL_POLICIES)} and every router (gie included; kv_cost at "
    "temperature 0) on every view, with the load scrape",
    POOL_POLICIES, POOL_REFUSED))

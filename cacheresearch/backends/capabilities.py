"""What each numba backend models, registered in :mod:`cacheresearch.core.registry` (imports no numba).

The tables the backends read (the fcfs backend's policies, the per-block policies, the vllm pool's orders and
why it refuses each other policy) are declared here once, the per-block ones read from the policy registry
(:mod:`cacheresearch.cache.policies`: a plug-in policy counts as soon as it is registered), so that the
engine's checks (:func:`cacheresearch.core.simulate.check_bounds`) and refusals read them on any host.
:mod:`cacheresearch.backends` imports this module, which registers the three backends by module name: a
backend's module (numba, its kernels) is imported when a run needs it. Whether the vllm pool runs a per-block
policy is its kernel's to say (:func:`cacheresearch.cache.kernels.dispatch.pool_refusal`: it imports the
kernel file, so numba, when the question is asked).
"""

from __future__ import annotations

from cacheresearch.cache.policies import block_policies
from cacheresearch.core.registry import NumbaBackend, register_numba

__all__ = ["REPLAY_POLICIES", "RUN_STORE_REFUSED", "pool_policies", "pool_refused", "pool_refusal"]

#: The policies of the fcfs backend (:mod:`cacheresearch.backends.numba_cache`): the run store's.
REPLAY_POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
#: The vllm pool's free-queue orders (vLLM's free queue and its TTL variant); every per-block policy whose kernel
#: has a pool's rules joins them (:func:`pool_policies`).
POOL_QUEUE_POLICIES = ("lru", "unbounded", "ttl_refresh")
#: Why the vllm pool refuses the run store's other policies (one line each).
RUN_STORE_REFUSED = {
    "lru_plain": "vLLM frees a request's blocks tail first, so its LRU is leaf-first (lru)",
    "ttl_fixed": "a fixed expiry counts from a block's write, and chunked prefill writes one run's blocks over "
                 "several steps while the pool keeps one time per run (ttl_refresh counts from the release)",
    "lfu_perfect": "its counts survive eviction, which needs the fcfs replica's whole-request store",
    "length_aware": "it ranks whole stored requests by depth, which needs the fcfs replica's store",
    "s3fifo_sosp": "its queues follow whole stored requests (fcfs); libCacheSim's per-block s3fifo runs on the pool",
}


def pool_refusal(name: str) -> str | None:
    """Why the vllm pool cannot run policy ``name`` (None: it can)."""
    if name in POOL_QUEUE_POLICIES:
        return None
    if name in block_policies():
        from cacheresearch.cache.kernels.dispatch import pool_refusal as kernel_refusal  # noqa: PLC0415

        return kernel_refusal(name)
    return RUN_STORE_REFUSED.get(name, "not a pool order")


def pool_policies() -> tuple[str, ...]:
    """The vllm pool's orders now: the free queue's and every per-block policy whose kernel has a pool's rules."""
    return POOL_QUEUE_POLICIES + tuple(n for n in block_policies() if pool_refusal(n) is None)


def pool_refused() -> dict[str, str]:
    """Policy -> why the vllm pool refuses it (one line), for every registered policy it refuses."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    return {n: w for n in POLICIES if (w := pool_refusal(n)) is not None}


register_numba("fcfs", NumbaBackend(
    "cacheresearch.backends.numba_cache",
    lambda: f"with the policies {list(REPLAY_POLICIES)} and the routers that read neither load nor cache",
    REPLAY_POLICIES))
register_numba("blocks", NumbaBackend(
    "cacheresearch.backends.numba_blocks",
    lambda: f"with the per-block policies {list(block_policies())} and every router (kv_cost at "
    "temperature 0) on the precise, approximate and stale views",
    block_policies))
register_numba("vllm", NumbaBackend(
    "cacheresearch.backends.numba_vllm",
    lambda: f"with the policies {list(pool_policies())} and every router (gie included; kv_cost at "
    "temperature 0) on every view, with the load scrape",
    pool_policies, pool_refused))

"""KV tiers and offloading: a replica's cache as GPU, CPU memory, a pool shared by the fleet, and disk.

Each lower tier (:mod:`~cacheresearch.tiers.spec`) has a capacity in blocks, a policy (``lru``, or any
registered per-block policy: ``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``, :mod:`cacheresearch.cache.kernels`),
read and write bandwidth and a latency; the gpu tier runs any of the same policies (``gpu_policy``).
Per request (arrival order), on its replica ``r``:

* the hit is the leading run of the request's blocks held in *any* of ``r``'s tiers (its gpu, its cpu,
  the shared pool, its disk), each block counted in the first tier that holds it (``hit_by_tier``);
* hit blocks of a lower tier are read there (lru: refreshed; a per-block policy: a ``get`` that hits);
  every block of the request is then touched in the gpu tier leaf-first (lru: touches, then evict down to
  capacity; a per-block policy: one ``get`` each): a lower-tier hit is *promoted* (it becomes GPU-resident;
  its lower copy stays: the lower tiers are inclusive on a read);
* ``offload="evict"`` (default): the gpu's victims go to the first present lower tier, whose victims go
  to the next, and so on (disk's are dropped). ``"write_through"``: every computed (missed) block is
  written to every present lower tier at once, and victims are dropped;
* the pool is one store for the fleet: a block written by two replicas is held once, the second write
  a hit there (lru: refreshing it);
* the tier routers read the ``precise``, ``stale`` or ``approximate`` view
  (:data:`~cacheresearch.tiers.spec.TIER_VIEWS`);
* time: a hit of ``h_t`` blocks in lower tier ``t`` costs ``h_t x block_bytes / read bandwidth +
  latency``; the tiers' loads add up (sequential transfers), and the load is either part of the
  request's service (``load_mode="serial"``) or overlapped with its wait (``"overlap"``). Misses pay
  prefill as the fcfs replica does (:mod:`cacheresearch.replica.fcfs`); writes are asynchronous (off the
  critical path), and their volume is reported per tier (``written_blocks``) to check against the write
  bandwidth.

With every lower tier at capacity 0 the engine is today's fcfs fleet, bit for bit. The engine:
:mod:`~cacheresearch.tiers.engine` (numba); its oracle: ``tests/reference_tiers.py``.
"""

from cacheresearch.tiers.engine import TierResult, dense_keys, run_tiers
from cacheresearch.tiers.spec import (
    DEFAULT_TIERS,
    LOAD_MODES,
    LOWER_TIERS,
    OFFLOAD_MODES,
    TIER_NAMES,
    TIER_POLICIES,
    TIER_ROUTERS,
    TIER_VIEWS,
    TieredConfig,
    TierError,
    TierSpec,
    make_config,
    tier_block_bytes,
    tier_policies,
)

__all__ = ["TierResult", "run_tiers", "dense_keys", "TieredConfig", "TierSpec", "TierError", "make_config",
           "tier_block_bytes", "DEFAULT_TIERS", "LOAD_MODES", "LOWER_TIERS", "OFFLOAD_MODES", "TIER_NAMES",
           "TIER_POLICIES", "TIER_ROUTERS", "TIER_VIEWS", "tier_policies"]

"""The per-block policies, as libCacheSim implements them: ``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``.

Their definitions (read from libCacheSim 0.3.5's sources; FACTS.md, "Eviction policies as the field's
reference implements them") are the plain-Python oracles' docstring, ``tests/reference_blocks.py``;
the engine for them is :mod:`cacheresearch.backends.numba_policies` (O(1) lists per replica, numba).
Every access is libCacheSim's ``get``: a hit updates the policy's metadata, a miss evicts until the
newcomer fits and then inserts it (a newcomer is never its own victim). On prefix streams a request's
blocks are accessed one by one, leaf-first, after its lookup.

They keep per-block state (a partly evicted run is readmitted block by block into different queues or
frequency buckets), so the run store of the JAX scan does not serve them; the JAX engine refuses them
with that reason. Their knobs are libCacheSim's parameters with its defaults, declared once here
(:data:`BLOCK_KNOBS`), in integer units so that the sizes are computed exactly as libCacheSim does
(``int(C * ratio)`` in double precision).
"""

from __future__ import annotations

from cacheresearch.cache.knob import Knob

__all__ = ["BLOCK_KNOBS", "block_sizes"]

#: libCacheSim's S3FIFO parameters (small_size_ratio 0.1, ghost_size_ratio 0.9, move_to_main_threshold 2).
BLOCK_KNOBS: tuple[Knob, ...] = (
    Knob("s3fifo_small_pm", 100, 0, 1000, doc="s3fifo: small queue size, thousandths of the capacity "
         "(libCacheSim small_size_ratio x 1000; int(C * ratio))", unit="1/1000"),
    Knob("s3fifo_ghost_pm", 900, 0, 10_000, doc="s3fifo: ghost size in keys, thousandths of the capacity "
         "(libCacheSim ghost_size_ratio x 1000)", unit="1/1000"),
    Knob("s3fifo_promote", 2, 1, 1_000_000, doc="s3fifo: small-queue hits that move an object to main "
         "(libCacheSim move_to_main_threshold)", unit="hits"),
)


def block_sizes(policy: str, capacity: int, knobs: dict) -> tuple[int, int, int]:
    """(small size, ghost size, promotion threshold) of ``s3fifo`` at ``capacity`` (zeros otherwise),
    computed as libCacheSim's S3FIFO_init does (a double product, truncated)."""
    if policy != "s3fifo":
        return 0, 0, 0
    small = int(capacity * (int(knobs["s3fifo_small_pm"]) / 1000))
    ghost = int(capacity * (int(knobs["s3fifo_ghost_pm"]) / 1000))
    return small, ghost, int(knobs["s3fifo_promote"])

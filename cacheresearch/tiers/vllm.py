"""A cpu tier (KV offloading) on the vllm replica: the numba vllm backend with a host-memory LRU per replica.

The vllm replica (:mod:`cacheresearch.backends.numba_vllm`, ``docs/fleet_semantics.md``) keeps one KV pool per
replica. With a cpu tier (``capacity_blocks > 0``) every configuration runs in the backend's per-block mode (every
block a run of its own, :func:`~cacheresearch.backends.numba_vllm._block_log`), so a block's identity is its id
and the tier is an LRU list over block ids per replica:

* **offload on eviction** (vLLM's OffloadingConnector and LMCache as this project models them, the fcfs tiers'
  ``offload=evict``): a block the pool evicts (vLLM's free-queue LRU, lowest stamp first) goes to its replica's
  cpu tier as the most recent; a copy the tier already holds is refreshed, not written again (counted once in
  ``offloaded_blocks``); beyond its capacity the tier drops its least recent block;
* **lookup at admission**: the hit is the pool's leading cached blocks, continued by the leading blocks the cpu
  tier holds, capped as ever at ``floor((input - 1) / block_tokens)``. The cpu-hit blocks are allocated in the
  pool like computed blocks (they count in the scheduler's pool check and become cached blocks of the pool),
  are touched in the tier deepest first (the leading one ends most recent, as vLLM's ``LRUOffloadingManager.touch``
  walks a request's hashes in reverse) and stay there (inclusive);
* **time, overlap model ``sync``** (LMCache's vLLM v1 connector: ``start_load_kv`` loads the KV of the requests
  a step scheduled before that step's forward pass, layer by layer but waited for): the engine step that admits
  a request lasts longer by the load of its cpu-hit blocks, ``ceil(blocks x block_bytes x 1e6 / read MB/s)`` ps
  plus the tier's latency, summed over the requests that step admits (one host-to-device link, transfers in
  series). Nothing else overlaps it: the other requests of the step wait for the load too. Writes (offloads)
  are asynchronous and not charged; their volume is returned. Decode-only stretches admit nothing and are
  unchanged;
* **time, overlap model ``async``** (vLLM's OffloadingConnector: the scheduler allocates the blocks of a request
  with external hits and parks it in WAITING_FOR_REMOTE_KVS while the others step): when the admission scan
  reaches a request with cpu hits, its hit blocks are allocated and pinned (the pool check counts them, no token
  is computed, no budget or ``max_num_seqs`` slot taken), its load goes on the replica's one link after the loads
  before it (``link = max(link, step start) + load``), and it stays in its place in the waiting queue, skipped,
  until a step starting at or after the load lands; then it is admitted FCFS with that hit. A replica with
  nothing to run waits for the first landing (or the next arrival). A request that fits nowhere while nothing
  runs and no load is in flight is rejected (its pins released);
* the routers read the GPU pool only (every view), as they do without a tier, except ``gie`` on the ``precise`` view
  with ``gie_cpu_tier_w_pct > 0`` (llm-d-router's precise producer indexing the offloaded blocks too: the prefix a
  pod holds in either tier, its cpu-only blocks weighed ``gie_cpu_tier_w_pct / 100``; :mod:`cacheresearch.routers.gie`).
  ``gie``'s approximate CPU-tier scorer (``gie_cpu_w_pct``) never reads the tier: it is an index of routed prompts.

With every capacity 0 the results are the backend's (and the JAX replica's) bit for bit
(``tests/test_tiers_vllm.py``, which also checks this engine against ``tests/reference_batch.py``). The JAX
replica has no tier: :func:`run_stream_tiered` with ``backend="jax"`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cacheresearch.core.stream import Stream
from cacheresearch.metrics.core import Metrics
from cacheresearch.tiers.spec import TierError, tier_spec

__all__ = ["VllmCpuTier", "VllmTierResult", "cpu_tier", "check_backend", "run_stream_tiered", "OVERLAP_MODES"]

#: How a load overlaps the engine's steps (``sync``: the admitting step waits for it; see the module docstring).
OVERLAP_MODES = ("sync", "async")


@dataclass(frozen=True)
class VllmCpuTier:
    """A replica's cpu tier: capacity in blocks (0: absent), read bandwidth (MB/s), latency per load (ps),
    bytes per block, overlap model (:data:`OVERLAP_MODES`)."""

    capacity_blocks: int = 0
    read_mbps: int = 0
    latency_ps: int = 0
    block_bytes: int = 0
    overlap: str = "sync"


class VllmTierResult(NamedTuple):
    metrics: Metrics  # the backend's unfinalized Metrics, leading axis [G]
    cpu_hit_blocks: np.ndarray  # int64 [G, N]: per request, the hit blocks its (last) admission read from the cpu tier
    offloaded_blocks: np.ndarray  # int64 [G]: blocks written to the cpu tiers (all replicas)


def cpu_tier(*, capacity_blocks=0, read_gbps=50.0, write_gbps=None, latency_us=10.0, block_bytes: int,
             policy="lru", memory_gib=2048.0, overlap="sync", where="tiers.") -> VllmCpuTier:
    """A checked cpu tier (the fcfs tiers' checks: :func:`cacheresearch.tiers.spec.make_config`); ``read_gbps`` in
    GB/s (1e9 bytes/s), ``latency_us`` in microseconds. Errors are one line naming the key (``where`` + cpu.*)."""
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, (int, np.integer)) or block_bytes < 1:
        raise TierError(f"{where}block_bytes: must be an integer >= 1, got {block_bytes!r}")
    spec = tier_spec("cpu", dict(capacity_blocks=capacity_blocks, read_gbps=read_gbps,
                             write_gbps=read_gbps if write_gbps is None else write_gbps, latency_us=latency_us,
                             policy=policy, memory_gib=memory_gib), int(block_bytes), where)
    if overlap not in OVERLAP_MODES:
        raise TierError(f"{where}cpu.overlap: {overlap!r}; choose one of {', '.join(OVERLAP_MODES)}")
    if spec.policy != "lru":
        raise TierError(f"{where}cpu.policy: {spec.policy!r}; the vllm replica's cpu tier runs lru only")
    if spec.capacity_blocks == 0:
        return VllmCpuTier(0, 0, 0, int(block_bytes), overlap)
    return VllmCpuTier(spec.capacity_blocks, int(round(spec.read_gbps * 1000)), int(round(spec.latency_us * 1e6)),
                       int(block_bytes), overlap)


def check_backend(backend: str, tiers, where: str = "tiers.cpu.capacity_blocks") -> None:
    """Refuse a cpu tier on the JAX replica (one line, naming the key)."""
    big = [t.capacity_blocks for t in tiers if t.capacity_blocks > 0]
    if big and backend == "jax":
        raise TierError(f"engine.backend=jax: {where} = {big[0]} asks for a cpu tier on the vllm replica, which the "
                        "JAX replica does not model; use engine.backend=numba or auto")
    if backend not in ("auto", "jax", "numba"):
        raise TierError(f"engine.backend={backend!r}: choose one of auto, jax, numba")


def run_stream_tiered(stream: Stream, params: list, keys: list, st, tiers: list, *, n_out: int | None = None,
                      backend: str = "numba") -> VllmTierResult:
    """Configurations ``params`` (PRNG ``keys``, pool policy ``lru``) each with its cpu tier ``tiers[g]``
    (:func:`cpu_tier`) over one stream under static options ``st`` (``scheduler="vllm"``), every configuration
    in the backend's per-block mode; the backend's :class:`Metrics` (``hit_blocks`` counts gpu and cpu hits), the
    per-request cpu-hit blocks and the blocks offloaded per configuration."""
    from cacheresearch.backends import numba_vllm as nv  # noqa: PLC0415 - imports numba itself
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    tiers = list(tiers)
    if len(tiers) != len(params):
        raise ValueError(f"tiers: one cpu tier per configuration ({len(params)}), got {len(tiers)}")
    check_backend(backend, tiers)
    P = nv._fields(params)
    G = P["policy"].shape[0]
    names = {v.id: k for k, v in POLICIES.items()}
    for g in range(G):
        pol = names[int(P["policy"][g])]
        if pol != "lru":
            raise TierError(f"cache.policy: {pol!r}; the cpu tier on the vllm replica runs behind the pool's lru "
                            "(vLLM's free queue) only")
    missing = nv.coverage([type("P", (), {f: P[f][g] for f in P})() for g in range(G)], st)
    if missing:
        raise ValueError(f"the numba vllm backend does not model {'; '.join(missing)}")
    pc = nv._pool_config(P)
    for g, t in enumerate(tiers):
        if t.capacity_blocks < 0:
            raise TierError(f"tiers.cpu.capacity_blocks: must be an integer >= 0, got {t.capacity_blocks}")
        if t.capacity_blocks > 0 and (t.read_mbps < 1 or t.block_bytes < 1 or t.latency_ps < 0):
            raise TierError(f"tiers.cpu.read_gbps: the cpu tier holds {t.capacity_blocks} blocks but has no read "
                            "bandwidth; give a positive GB/s")
        if t.overlap not in OVERLAP_MODES:
            raise TierError(f"tiers.cpu.overlap: {t.overlap!r}; choose one of {', '.join(OVERLAP_MODES)}")
        pc[g, nv.PC_CPU:nv.PC_ASYNC + 1] = (t.capacity_blocks, t.read_mbps, t.latency_ps, t.block_bytes,
                                            t.overlap == "async" and t.capacity_blocks > 0)
    extra: list = []
    m = nv._run_part(stream, P, pc, list(keys), st, n_out, True, extra)
    return VllmTierResult(m, extra[0], extra[1])

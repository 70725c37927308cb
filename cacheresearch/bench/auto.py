"""The bench's default-path cases (issue 19): what the sweep runs by default, ``engine.backend=auto``.

``single_engine`` and ``sweep{N}_engine`` time :func:`cacheresearch.core.run.simulate_cells` with the
sweep's defaults (``backend="auto"``, the queue model on, per-request outputs, which the sweep always asks
for (``shell/sweep.py`` ``grid_cells``), and :data:`SWEEP_QUEUE_SLOTS` queue slots): on
a CPU host the runner takes the numba backend for the configurations it covers (the bench's random
routing with LRU is covered), the JAX engine elsewhere. The JAX engine alone stays as
``single_engine_jax`` / ``sweep{N}_engine_jax`` (``simulate`` / ``simulate_grid``, ``queue=False``).
"""

from __future__ import annotations

import numpy as np

from cacheresearch.core.run import simulate_cells
from cacheresearch.engine import combine_limbs, make_params

__all__ = ["auto_call", "auto_method", "SWEEP_QUEUE_SLOTS"]

#: ``engine.queue_slots``' default in the sweep's schema (shell/schema.py ``EngineConf``; tests/test_bench.py
#: checks they agree): the bench's default-path cases run with it, as a user's sweep does
SWEEP_QUEUE_SLOTS = 256


def auto_call(stream, cells, max_replicas: int, *, per_request: bool = True, queue_slots: int = SWEEP_QUEUE_SLOTS):
    """A callable that runs ``cells`` = ``(capacity, replicas, seed)`` on one stream through the runner's
    default path; it returns ``(hit tokens per cell, hit blocks per request of cell 0, backends)``."""
    params = [make_params("lru", int(c), replicas=int(r), router="random") for c, r, _ in cells]
    seeds = np.asarray([int(s) for _, _, s in cells], np.uint32)
    stream_of = np.zeros(len(cells), np.int64)

    def call():
        m, plan = simulate_cells([stream], stream_of, params, seeds, max_replicas=max_replicas,
                                 per_request=per_request, backend="auto", queue_slots=queue_slots)
        blocks = np.asarray(m.hit_blocks[0]) if per_request else None
        return combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo), blocks, sorted({g.backend for g in plan.groups})

    return call


def auto_method(n: int, backends: list) -> str:
    return (f"engine: the default path, simulate_cells(backend=auto, queue model on, per_request=True, "
            f"queue_slots={SWEEP_QUEUE_SLOTS}: the sweep's defaults) over {n} configuration"
            f"{'s' if n > 1 else ''}; backend chosen: {', '.join(backends)}; results checked equal to the JAX "
            "engine's; first call = compile + run")

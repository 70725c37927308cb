"""Compiles the numba backends' kernels into numba's on-disk cache (``cache=True``) on tiny workloads, so the
test workers load them instead of each compiling the same kernel at once. Run by conftest.py in the xdist
controller before the workers start, one process per part: ``python tests/_warm_numba.py vllm|cache``."""

from __future__ import annotations

import sys

import jax
import numpy as np

from cacheresearch.core.params import make_params
from cacheresearch.core.simulate import static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.workload.synthetic import tenant_workload


def _workload():
    return tenant_workload(n_tenants=2, prefix_tokens=64, query_tokens=16, users_per_tenant=1, rate_per_s=20,
                           duration_s=1, output_tokens=4, block_tokens=16, seed=0)


def vllm() -> None:
    from cacheresearch.backends import numba_vllm as nv  # noqa: PLC0415

    w = _workload()
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", capacity_blocks=32, replicas=2, router="random")
    st = static_options(p, max_replicas=2, per_request=True, scheduler="vllm", max_running=4, queue_slots=16,
                        max_runs=int(np.max(np.asarray(s.n_runs))), index=False, stale=False)
    nv.run_stream(s, [p], [jax.random.key(0)], st)
    from cacheresearch.tiers import make_config, run_tiers  # noqa: PLC0415 - the tiered engine's kernel

    run_tiers(w, [make_config(gpu_blocks=8, tiers=dict(cpu=dict(capacity_blocks=8)), replicas=2, router="random",
                              block_bytes=1024)], [0])


def cache() -> None:
    from cacheresearch.backends import numba_cache as nc  # noqa: PLC0415
    from cacheresearch.backends import numba_policies as npol  # noqa: PLC0415

    w = _workload()
    p = make_params("lru", capacity_blocks=32, replicas=2, router="random")
    s = compile_stream(w)
    for queue in (False, True):  # the queue model off (replay_grid's kernel, the same signature) and on
        st = static_options(p, max_replicas=2, per_request=True, queue=queue)
        nc.run_stream(s, [p], [jax.random.key(0)], st)
    for policy in ("fifo", "sieve", "s3fifo", "lfu", "arc"):
        npol.block_replay(w, policy, 8, replicas=2, router="random", key=jax.random.key(0))
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415 - backends/numba_blocks.py's kernel

    simulate_cells([compile_stream(w, block_ids=True)], np.zeros(1, np.int64),
                   [make_params("sieve", capacity_blocks=8, replicas=2, router="cache_aware")], np.zeros(1),
                   max_replicas=2, backend="numba", per_request=True)


if __name__ == "__main__":
    {"vllm": vllm, "cache": cache}[sys.argv[1]]()

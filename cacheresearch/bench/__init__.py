"""Benchmark: the project's engine, hit curves and replay against libCacheSim and the pure-Python reference.

Usage (from the repository root)::

    python -m cacheresearch.bench --quick --json bench.json
    python -m cacheresearch.bench --workloads seed_fleet,mooncake --configs 4096 --lcs-max-runs 64
    python -m cacheresearch.bench --memory-check --workloads none
    bash benchmarks/gpu.sh      # the prepared GPU run (4,096 and 1,000 configurations)

``--quick`` (under about 5 minutes on 2 cores) reduces the design scenario to 2,000 requests (case
names say ``@2000req``) and repeats each measurement at most 3 times.

Everything runs in ONE process (libCacheSim's parallel figure in a pool of worker processes started
once), on the IDENTICAL block stream for every simulator: the project with leaf-first LRU (policy
``lru``); libCacheSim (``libcachesim``, ``LRU``) on each replica's block ids in leaf-first order (last
block of a request first), requests routed by :func:`~cacheresearch.analysis.mrc.route_requests` with the same
PRNG keys as the engine's random router, one cache per replica, dense ids, one oracleGeneral file per
replica; the pure-Python reference when one is given (``--reference tests/reference.py`` in a checkout of
the repository: the package never reaches into its tests on its own), timed on one configuration, on a prefix
of the workload when the workload is large.

The cases (per workload; each project path is its own case with its own ratio, none is "the fastest")
-----------------------------------------------------------------------------------------------------
``single_engine``    one configuration (the workload's capacity and replicas, random routing) on
                     the path a sweep takes by default (:mod:`cacheresearch.bench.auto`):
                     ``simulate_cells(..., backend="auto")`` with the sweep's options (queue model
                     on, per-request outputs, ``engine.queue_slots``' default): the numba backend
                     on a CPU host, the JAX engine on an accelerator; the JSON's ``method`` names it.
``single_engine_jax``  the same configuration through the JAX engine's public call
                     ``simulate(stream, params, key, per_request=True, queue=False)``.
``single_curve``     the same configuration from :func:`~cacheresearch.analysis.mrc.hit_curve`
                     (``max_capacity`` = that capacity): routing, the stack-distance pass and the curve.
``single_replay``    the same configuration from :func:`~cacheresearch.analysis.mrc.route_requests` +
                     :func:`~cacheresearch.analysis.mrc.lru_replay` (numba, one capacity).
                     libCacheSim for the single cases: one LRU cache per replica at that capacity,
                     the replicas one after another on one core.
``sweep{N}_engine``  N configurations (N/4 log-spaced capacities x 2 replica counts x 2 seeds, random
                     routing) in one ``simulate_cells(..., backend="auto")`` call with the sweep's
                     options, as ``single_engine``.
``sweep{N}_engine_jax``  the same N configurations in one JAX call ``simulate_grid(...,
                     per_request=False, queue=False)`` (vmapped; ``queue=False``: hit rates only).
``sweep{N}_curve``   the same N configurations from one :func:`~cacheresearch.analysis.mrc.hit_curve` per
                     (replica count, seed) routing group, every capacity read off.
                     libCacheSim for the sweeps: the N configurations x their replicas' caches.
``sweep{N}_cache_aware``  the same N cells with the SGLang-style ``cache_aware`` router on the
                     ``precise`` view (its default knobs, :mod:`cacheresearch.routers`) in one
                     ``simulate_grid(..., queue=True)`` call: that router reads the replicas' loads, so
                     the engine needs the queue model. ``cost_vs_random`` = its seconds / the seconds of
                     the same grid with the ``random`` router, also with ``queue=True``
                     (``baseline_*`` fields; the baseline's hit tokens are checked equal to
                     ``sweep{N}_engine``'s, since the queue does not change random routing).
                     libCacheSim has no router that reads cache state: no libCacheSim figure, no ratio.
``mrc_curve``        one :func:`~cacheresearch.analysis.mrc.hit_curve` (1 replica) gives every capacity 0..working
                     set; libCacheSim runs 64 log-spaced capacities (1 replica, 1 cache each).

What is timed
-------------
``time.perf_counter`` around calls that end in ``jax.block_until_ready``. The engine is timed through
its public calls, exactly as a user runs them: the first call (compile + one run) is a warm-up, kept as
``project_first_call_s``; ``project_compile_s`` = first call - best steady call (an estimate). The hit
curve and the replay likewise compile on their first call (about 0 when an earlier case compiled the
same shapes or numba's on-disk cache holds the kernel). The curve's backend is ``--curve-backend``
(default ``auto``: numba when JAX runs on the CPU, the JAX scan on an accelerator; the JSON's
``settings.curve_backend``). Each measurement is repeated (``--repeats``) within a time budget
(``--budget``); ``*_s`` is the best run and ``*_s_median`` the median.

Preparation is outside every timer: the engine's :func:`~cacheresearch.engine.compile_stream`
(``project_prep_s``), and libCacheSim's trace files, readers and cache construction
(``libcachesim_prep_s`` = writing the files). Each libCacheSim cache is built before its timer starts,
with ``hashpower`` sized from the number of distinct ids its replica's trace holds (:func:`hashpower`);
only ``process_trace`` is timed. The hit curve's host work (routing, the distance pass, the curve) is
inside its timer, except the dense key ids, which the workload caches after ``compile_stream``.

libCacheSim's figures:

* ``libcachesim_s``: one core, sequential: the sum of the ``process_trace`` times of every cache of
  every configuration (each cache built fresh, untimed, just before its call).
* ``libcachesim_parallel_s`` (cases with several configurations: sweeps and ``mrc_curve``): the same
  runs spread over a pool of ``libcachesim_workers`` processes (``--lcs-workers``, default every
  usable core; longest traces first to the least-loaded worker), all running at once. The pool is
  started and warmed up once, before its first batch, and the trace files are written before. In a
  batch every worker opens its readers, then all workers and the bench meet at a barrier, and from
  there each worker does what the one-core run does: build a fresh cache (untimed), time
  ``process_trace``, free the cache (untimed). The batch's time is the largest of the workers' timed
  sums: its wall time on the critical path, cache construction and freeing left out as on one core
  (on the design workload freeing the caches took about 45% as long as their ``process_trace``
  calls, and building them all first and keeping them alive nearly doubled those calls through page
  faults). ``libcachesim_parallel_wall_s`` is the plain wall time from the barrier to the last
  result, construction and freeing included; ``libcachesim_parallel_cores_used`` (the workers' CPU
  seconds / that wall time) and ``libcachesim_parallel_balance`` (mean / max of the workers' timed
  sums) show how parallel the batch really was. Its miss counts are checked equal to the one-core
  run's. (The workers are started with ``spawn``: a script that calls :func:`run_bench` needs the
  usual ``if __name__ == "__main__":`` guard.)

With ``--lcs-max-runs M`` only M evenly spaced configurations of a sweep (or capacities of
``mrc_curve``) are run, both ways, and the times are scaled by (configurations / M)
(``libcachesim_note``).

``ratio`` = libCacheSim seconds / project seconds for the same total work. For the cases with several
configurations (sweeps, ``mrc_curve``) libCacheSim's seconds are ``libcachesim_parallel_s``, all of
this host's cores (``ratio`` is None when there is no parallel figure: ``--lcs-workers 0`` or a
failed pool, ``libcachesim_parallel_note``); for the single cases, which have one configuration,
they are ``libcachesim_s``, one core. ``ratio_basis`` names the field used.
``ratio_sequential`` = ``libcachesim_s`` / project seconds (one core) in every case;
``ratio_with_compile`` adds ``project_compile_s`` to the project's side of ``ratio``.

Hit rates: libCacheSim only approximates leaf-first LRU: it looks up and inserts block by block (a
request's own tail can evict its head, and a block after a miss still counts as a hit), while the
engine looks up the whole request first and counts the leading run only. Both block hit rates are
reported (libCacheSim: ``1 - miss ratio``; project: per-request hit blocks / total blocks), with the
project's token hit rate; ``libcachesim_accesses`` is the number of requests libCacheSim's readers
report per configuration (equal to ``accesses``, the engine's block count).

``peak_rss_mb`` is the bench process's peak resident set (``resource.getrusage``) after the case, so it
only grows along the run (the libCacheSim workers are not included). ``--memory-check`` replays a
generated 1,000,000-request workload through the engine (one configuration) and the hit curve in a
child process, and reports that process's peak.

The JSON file is rewritten after every case, so an interrupted run still leaves its results.

The modules: ``base`` (constants), ``timing``, ``workloads``, ``lcs`` (libCacheSim's side), ``core`` (the
:class:`Bench`), one mixin per case group (``single``, ``sweep``, ``mrc``), ``report``, ``memory``, ``cli``;
``auto`` (the default backend's call) and ``policies`` (``python -m cacheresearch.bench.policies``).
"""

from cacheresearch.bench.base import CASE_KEYS, CASES, PATHS, SHARED_TRACE, WORKLOADS
from cacheresearch.bench.cli import load_reference, main, run_bench
from cacheresearch.bench.core import Bench
from cacheresearch.bench.lcs import (
    LcsPool,
    LcsStreams,
    assign_units,
    hashpower,
    lcs_sequential,
    leaf_first_ids,
)
from cacheresearch.bench.memory import memory_check, memory_workload
from cacheresearch.bench.report import format_table, machine_info
from cacheresearch.bench.workloads import WorkloadSpec, capacity_grid, lcs_capacities, make_workload, subset_index

__all__ = [
    "Bench", "LcsPool", "LcsStreams", "WorkloadSpec", "make_workload", "run_bench", "machine_info", "memory_check",
    "memory_workload", "main", "load_reference", "format_table", "CASE_KEYS", "CASES", "PATHS", "WORKLOADS",
    "SHARED_TRACE", "assign_units", "hashpower", "lcs_sequential", "leaf_first_ids", "capacity_grid",
    "lcs_capacities", "subset_index",
]

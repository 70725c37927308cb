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
replica; the pure-Python reference (``tests/reference.py``, when the repository's tests are present),
timed on one configuration, on a prefix of the workload when the workload is large.

The cases (per workload; each project path is its own case with its own ratio, none is "the fastest")
-----------------------------------------------------------------------------------------------------
``single_engine``    one configuration (the workload's capacity and replicas, random routing):
                     the engine's public call ``simulate(stream, params, key, per_request=True,
                     queue=False)`` until its result is ready.
``single_curve``     the same configuration from :func:`~cacheresearch.analysis.mrc.hit_curve`
                     (``max_capacity`` = that capacity): routing, the stack-distance pass and the curve.
``single_replay``    the same configuration from :func:`~cacheresearch.analysis.mrc.route_requests` +
                     :func:`~cacheresearch.analysis.mrc.lru_replay` (numba, one capacity).
                     libCacheSim for the single cases: one LRU cache per replica at that capacity,
                     the replicas one after another on one core.
``sweep{N}_engine``  N configurations (N/4 log-spaced capacities x 2 replica counts x 2 seeds, random
                     routing) in one public call ``simulate_grid(..., per_request=False, queue=False)``
                     (vmapped; ``queue=False``: hit rates only).
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
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch import __version__
from cacheresearch.analysis import mrc
from cacheresearch.bench.auto import auto_call, auto_method
from cacheresearch.engine import combine_limbs, compile_stream, make_params, simulate, simulate_grid, stack_params
from cacheresearch.workload import Workload, synthetic, trace

__all__ = [
    "Bench",
    "LcsPool",
    "LcsStreams",
    "WorkloadSpec",
    "make_workload",
    "run_bench",
    "machine_info",
    "memory_check",
    "main",
    "CASE_KEYS",
    "CASES",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_TRACE = Path("..") / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"  # relative to the repo root
FIXTURE_TRACE = Path("tests") / "fixtures" / "mini_mooncake.jsonl"

WORKLOADS = ("seed_fleet", "mooncake", "design")
QUICK_DESIGN_REQUESTS = 2_000
FULL_DESIGN_REQUESTS = 50_000

#: case groups of ``--cases`` (``sweep`` gives ``sweep{N}_engine`` and ``sweep{N}_curve``)
CASES = ("single", "sweep", "cache_aware", "mrc")
#: project paths a case can time (every case names one in ``path``)
PATHS = ("engine", "engine_jax", "curve", "replay")

#: keys every case carries (tests check them); figures that a case does not have are None
CASE_KEYS = (
    "name", "workload", "path", "accesses", "configs", "project_s", "project_compile_s",
    "libcachesim_s", "libcachesim_parallel_s", "libcachesim_workers", "libcachesim_accesses",
    "ratio", "ratio_basis", "ratio_sequential", "ratio_with_compile",
    "project_hit_rate", "libcachesim_hit_rate", "method", "peak_rss_mb",
)


# ------------------------------------------------------------------------------------- helpers
def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(r / 1024.0 if sys.platform != "darwin" else r / 2**20, 1)


def _ready(x):
    return jax.block_until_ready(x)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def curve_backend(requested: str = "auto") -> str:
    """The stack-distance backend :func:`~cacheresearch.analysis.mrc.hit_curve` uses for ``requested``."""
    if requested != "auto":
        return requested
    if jax.default_backend() != "cpu":
        return "jax"
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        return "jax"
    return "numba"


@dataclass
class Timing:
    best: float
    median: float
    runs: int
    first: float | None = None  # warm-up call (compile included), when there was one
    value: object = None

    @property
    def compile_estimate(self) -> float:
        return max(0.0, (self.first or 0.0) - self.best) if self.first is not None else 0.0


def measure(fn: Callable[[], object], *, repeats: int, budget_s: float, warmup: bool) -> Timing:
    """Time ``fn`` (which must block until its result is ready).

    With ``warmup`` the first call is run untimed-as-steady (its time is kept as ``first``). Then up to
    ``repeats`` timed calls, stopping early once their total passes ``budget_s``; when a single call
    is slower than ``budget_s / 2`` only one timed call is made. Without ``warmup`` the first call is
    the first timed call.
    """
    first = None
    value = None
    if warmup:
        t = time.perf_counter()
        value = fn()
        first = time.perf_counter() - t
    times: list[float] = []
    while len(times) < max(1, repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
        if sum(times) > budget_s or times[0] > budget_s / 2:
            break
    return Timing(min(times), statistics.median(times), len(times), first, value)


def measure_timed(fn: Callable[[], tuple[float, object]], *, repeats: int, budget_s: float) -> Timing:
    """Like :func:`measure` for an ``fn`` that times itself: it returns ``(seconds, value)`` (for runs
    whose preparation, such as building caches, must stay outside the timer)."""
    times: list[float] = []
    value = None
    while len(times) < max(1, repeats):
        s, value = fn()
        times.append(s)
        if sum(times) > budget_s or times[0] > budget_s / 2:
            break
    return Timing(min(times), statistics.median(times), len(times), None, value)


def _ratio(a, b):
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _r(x, nd=6):
    """``x`` to ``nd`` significant digits (None stays None)."""
    return None if x is None else float(f"{float(x):.{nd}g}")


def slice_requests(w: Workload, n: int) -> Workload:
    """The first ``n`` requests of ``w``."""
    return w.slice(0, int(min(n, w.n_requests)))


def capacity_grid(c0: int, n: int) -> np.ndarray:
    """``n`` distinct capacities, log-spaced around ``c0`` (from ``c0 / 16`` to ``4 c0``)."""
    lo = max(1, c0 // 16)
    hi = max(4 * c0, lo + n)
    caps = np.unique(np.round(np.geomspace(lo, hi, n)).astype(np.int64))
    if caps.size < n:  # rounding merged small values: fill from the unused integers, evenly
        rest = np.setdiff1d(np.arange(lo, hi + 1), caps)
        extra = rest[np.linspace(0, rest.size - 1, n - caps.size).round().astype(np.int64)]
        caps = np.unique(np.concatenate([caps, extra]))
    return caps[:n]


def lcs_capacities(working_set: int, n: int) -> np.ndarray:
    """Up to ``n`` distinct log-spaced capacities from 1 to ``working_set``."""
    ws = max(1, int(working_set))
    caps = np.unique(np.round(np.geomspace(1, ws, n)).astype(np.int64))
    if caps.size < n and ws >= n:
        rest = np.setdiff1d(np.arange(1, ws + 1), caps)
        extra = rest[np.linspace(0, rest.size - 1, n - caps.size).round().astype(np.int64)]
        caps = np.unique(np.concatenate([caps, extra]))
    return caps


def subset_index(n: int, max_runs: int | None) -> np.ndarray:
    """All of ``0..n-1``, or ``max_runs`` evenly spaced of them when ``max_runs`` is smaller."""
    if max_runs and n > max_runs:
        return np.unique(np.linspace(0, n - 1, max_runs).round().astype(np.int64))
    return np.arange(n)


def _load_reference():
    """``reference_simulate`` from the checkout's ``tests/reference.py`` (None outside a checkout)."""
    import importlib.util  # noqa: PLC0415

    path = REPO_ROOT / "tests" / "reference.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("_cacheresearch_bench_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.reference_simulate


# ------------------------------------------------------------------------------------ workloads
@dataclass
class WorkloadSpec:
    name: str  # the bench's name for it (seed_fleet, mooncake, design, tiny)
    workload: Workload
    replicas: int  # for the single case
    capacity: int  # blocks per replica, for the single case
    source: str  # where it came from
    note: str = ""
    case_suffix: str = ""  # appended to case names (reduced sizes say so)

    @property
    def label(self) -> str:
        return self.workload.name


def _mooncake(quiet: bool) -> tuple[Workload, str, str]:
    override = os.environ.get("CACHERESEARCH_TRACE")  # e.g. a copy carried to a device machine
    if override and Path(override).exists():
        return trace.load_mooncake(override, block_tokens=512, name="mooncake"), "trace " + Path(override).name, ""
    shared = REPO_ROOT / SHARED_TRACE
    if shared.exists():
        return trace.load_mooncake(shared, block_tokens=512,
            name="mooncake"), "shared trace " + SHARED_TRACE.as_posix(), ""
    fixture = REPO_ROOT / FIXTURE_TRACE
    note = f"{SHARED_TRACE.as_posix()} is absent"
    if fixture.exists():
        if not quiet:
            print(f"[bench] {note}: using the bundled fixture {FIXTURE_TRACE.as_posix()}", flush=True)
        return trace.load_mooncake(fixture, block_tokens=512,
            name="mooncake-fixture"), "fixture " + FIXTURE_TRACE.as_posix(), note
    if not quiet:
        print(f"[bench] {note} and so is the fixture: using a synthetic Mooncake-like workload", flush=True)
    w = synthetic.fleet_workload(
        n_tenants=200, system_tokens=2048, doc_tokens=8192, user_tokens=2048, n_requests=4000, block_tokens=512,
        tenant_law="zipf", name="mooncake-synthetic",
    )
    return w, "synthetic (fleet_workload, zipf, 512-token blocks)", note + "; fixture absent too"


def make_workload(name: str, *, quick: bool, design_requests: int | None = None, quiet: bool = False) -> WorkloadSpec:
    """The bench's workloads (see the module docstring)."""
    if name == "seed_fleet":
        w = synthetic.fleet_workload(name="seed_fleet")
        return WorkloadSpec("seed_fleet", w, replicas=4, capacity=400, source="synthetic.fleet_workload() defaults")
    if name == "mooncake":
        w, src, note = _mooncake(quiet)
        K = int(np.unique(w.keys).size)
        return WorkloadSpec("mooncake", w, replicas=1, capacity=max(16, int(round(0.2 * K))), source=src, note=note)
    if name == "design":
        n = design_requests or (QUICK_DESIGN_REQUESTS if quick else FULL_DESIGN_REQUESTS)
        label = "design" if n == FULL_DESIGN_REQUESTS else f"design-{n}req"
        w = synthetic.design_workload(n_requests=n, name=label)
        note = "" if n == FULL_DESIGN_REQUESTS else f"reduced from {FULL_DESIGN_REQUESTS} to {n} requests"
        return WorkloadSpec("design", w, replicas=8, capacity=65_536,
            source=f"synthetic.design_workload(n_requests={n})",
                            note=note, case_suffix="" if n == FULL_DESIGN_REQUESTS else f"@{n}req")
    if name == "tiny":  # for tests and smoke runs
        w = synthetic.fleet_workload(
            n_tenants=3, system_tokens=48, doc_tokens=64, user_tokens=16, n_requests=80, block_tokens=16, name="tiny"
        )
        return WorkloadSpec("tiny", w, replicas=2, capacity=12, source="synthetic.fleet_workload (tiny)")
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS} (or tiny)")


# ------------------------------------------------------------------------------ libCacheSim side
def _import_lcs():
    try:
        import libcachesim as lcs  # noqa: PLC0415

        return lcs
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None


def hashpower(distinct_ids: int) -> int:
    """libCacheSim's ``hashpower`` (log2 of the hash table's buckets) for a trace holding
    ``distinct_ids`` distinct objects: at least two buckets per object, so the table never grows
    during ``process_trace``, whatever the capacity; at least 2**10 buckets."""
    return max(10, int(math.ceil(math.log2(max(2, int(distinct_ids))))) + 1)


def leaf_first_ids(w: Workload) -> np.ndarray:
    """Dense ids (1-based) of every block, each request's blocks in leaf-first order."""
    _, ids = np.unique(w.keys, return_inverse=True)
    nb = w.n_blocks
    req = np.repeat(np.arange(w.n_requests, dtype=np.int64), nb)
    pos = np.arange(w.total_blocks, dtype=np.int64) - w.offsets[:-1][req]
    leaf = w.offsets[:-1][req] + (nb[req] - 1 - pos)
    return ids.reshape(-1)[leaf].astype(np.uint64) + np.uint64(1)


@dataclass(frozen=True)
class LcsUnit:
    """One libCacheSim run: one replica's trace through one fresh LRU cache."""

    config: int  # index of the configuration it belongs to
    path: str
    capacity: int
    hashpower: int
    length: int  # requests in the trace (as written)


class LcsStreams:
    """One oracleGeneral file (and reader) per replica for one routing, written once."""

    def __init__(self, lcs, w: Workload, ids_leaf: np.ndarray, replica: np.ndarray, n_replicas: int, tmp: Path,
        tag: str):
        self.lcs = lcs
        block_rep = np.repeat(np.asarray(replica, dtype=np.int64), w.n_blocks)
        self.lengths: list[int] = []
        self.distinct: list[int] = []
        self.readers = []
        self.paths: list[str | None] = []
        for r in range(n_replicas):
            s = ids_leaf[block_rep == r]
            self.lengths.append(int(s.size))
            self.distinct.append(int(np.unique(s).size))
            if s.size == 0:
                self.readers.append(None)
                self.paths.append(None)
                continue
            p = tmp / f"{tag}_r{r}.oracleGeneral"
            trace.write_oracle_general(s, p)
            self.paths.append(str(p))
            self.readers.append(lcs.TraceReader(str(p), lcs.TraceType.ORACLE_GENERAL_TRACE))
        self.total = int(sum(self.lengths))
        #: requests libCacheSim's own readers hold, summed over the replicas (checked == total)
        self.accesses = int(sum(int(rd.get_num_of_req()) for rd in self.readers if rd is not None))

    def units(self, capacity: int, config: int = 0) -> list[LcsUnit]:
        return [LcsUnit(config, p, int(capacity), hashpower(d), n)
                for p, d, n in zip(self.paths, self.distinct, self.lengths) if p is not None]

    def run_timed(self, capacity: int) -> tuple[float, int]:
        """``(seconds, misses)`` of one configuration (one LRU cache per replica, one after another):
        each cache is built before its timer starts; only ``process_trace`` is timed."""
        busy = 0.0
        misses = 0
        for n, reader, d in zip(self.lengths, self.readers, self.distinct):
            if reader is None:
                continue
            cache = self.lcs.LRU(cache_size=int(capacity), hashpower=hashpower(d))
            t = time.perf_counter()
            miss_ratio, _ = cache.process_trace(reader)
            busy += time.perf_counter() - t
            misses += round(float(miss_ratio) * n)
            del cache  # freed outside the timer
        return busy, misses

    def run(self, capacity: int) -> int:
        """Block miss count of one configuration."""
        return self.run_timed(capacity)[1]


def lcs_sequential(configs: list[tuple[LcsStreams, int]]) -> tuple[float, list[int]]:
    """One core: every configuration ``(streams, capacity)`` in turn; ``(process_trace seconds, misses)``."""
    busy = 0.0
    misses = []
    for st, cap in configs:
        s, m = st.run_timed(cap)
        busy += s
        misses.append(m)
    return busy, misses


def assign_units(lengths: list[int], workers: int) -> list[list[int]]:
    """Indices of the units per worker: longest trace first, each to the least-loaded worker (load =
    requests)."""
    out: list[list[int]] = [[] for _ in range(max(1, workers))]
    load = [0] * len(out)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(len(out)), key=lambda j: (load[j], j))
        out[k].append(i)
        load[k] += lengths[i]
    return out


# The worker side of the pool (module level, so that spawned processes can unpickle it).
_W: dict = {"barrier": None, "readers": {}}


def _lcs_worker_init(barrier) -> None:
    _W["barrier"] = barrier


def _lcs_worker_batch(units: list[tuple[str, int, int]], timeout_s: float, forget: bool = False):
    """One worker's share of a batch: units ``(path, capacity, hashpower)``.

    Opens the readers (untimed), meets the other workers and the bench at the barrier, then for each
    unit, exactly as :meth:`LcsStreams.run_timed` does on one core: builds a fresh LRU cache (untimed),
    times ``process_trace``, frees the cache (untimed). Returns ``(pid, timed seconds, span seconds,
    CPU seconds, [(miss_ratio, requests the reader holds)])``; span and CPU run from the barrier to
    the end, untimed work included. ``forget`` closes the readers first."""
    lcs = _import_lcs()
    if forget:
        _W["readers"].clear()
    readers = _W["readers"]
    if units and lcs is None:
        raise RuntimeError("libcachesim is not importable in the worker")
    for path, _, _ in units:
        if path not in readers:
            readers[path] = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    _W["barrier"].wait(timeout_s)
    w0, c0 = time.perf_counter(), time.process_time()
    busy = 0.0
    out = []
    for path, cap, hp in units:
        cache = lcs.LRU(cache_size=int(cap), hashpower=int(hp))
        t = time.perf_counter()
        miss_ratio, _ = cache.process_trace(readers[path])
        busy += time.perf_counter() - t
        out.append((float(miss_ratio), int(readers[path].get_num_of_req())))
        del cache
    return os.getpid(), busy, time.perf_counter() - w0, time.process_time() - c0, out


class LcsPool:
    """``workers`` processes that run libCacheSim batches in parallel (see the module docstring).

    Started with the ``spawn`` method (JAX in the bench process is multithreaded) and with
    ``JAX_PLATFORMS=cpu`` in their environment (importing the package must not claim an accelerator);
    warmed up at construction by one empty batch, which starts every worker and imports libCacheSim
    there. In a batch every worker gets one task (they all meet at one barrier, so no worker can take
    two): all start together once every worker has opened its readers."""

    def __init__(self, workers: int, timeout_s: float = 600.0):
        self.workers = int(workers)
        self.timeout_s = float(timeout_s)
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(self.workers + 1)
        saved = {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")}
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        t = time.perf_counter()
        try:
            self.ex = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_lcs_worker_init,
                                          initargs=(self.barrier,))
            _, res = self.batch([[] for _ in range(self.workers)])  # every worker started and warm
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.pids = sorted({r[0] for r in res})
        self.start_s = time.perf_counter() - t
        if len(self.pids) != self.workers:
            self.close()
            raise RuntimeError(f"expected {self.workers} worker processes, saw {len(self.pids)}")

    def batch(self, per_worker: list[list[tuple[str, int, int]]], forget: bool = False) -> tuple[float, list]:
        """Run one batch (one list of units per worker); returns ``(wall seconds from the barrier to the
        last result, results per worker)``."""
        if self.ex is None:
            raise RuntimeError("the libCacheSim pool is closed")
        if len(per_worker) != self.workers:
            raise ValueError(f"need one unit list per worker ({self.workers})")
        futs = [self.ex.submit(_lcs_worker_batch, u, self.timeout_s, forget) for u in per_worker]
        # wait (untimed) until every worker has opened its readers and waits at the barrier; a worker
        # that failed (or could not start) ends the wait at once instead of at the timeout
        deadline = time.monotonic() + self.timeout_s
        while self.barrier.n_waiting < self.workers:
            failed = [f for f in futs if f.done()]
            if failed or time.monotonic() > deadline:
                self.barrier.abort()
                errors = [repr(f.exception()) for f in failed if f.exception() is not None]
                self.close()
                raise RuntimeError("libCacheSim workers did not reach the barrier"
                                   + (f": {errors[0][:400]}" if errors else f" within {self.timeout_s:.0f} s"))
            time.sleep(0.002)
        try:
            self.barrier.wait(self.timeout_s)
        except threading.BrokenBarrierError:
            self.close()
            raise RuntimeError("the libCacheSim barrier broke") from None
        t = time.perf_counter()
        res = [f.result() for f in futs]
        return time.perf_counter() - t, res

    def run(self, units: list[LcsUnit]) -> dict:
        """One batch of ``units``. Returns ``seconds`` (the batch's time: the largest of the workers'
        timed ``process_trace`` sums, since they ran together), ``wall`` (barrier to last result,
        untimed cache construction and freeing included), ``results`` ([(miss ratio, requests the
        worker's reader holds)] in the order of ``units``), ``workers`` (those that got work),
        ``cpu`` (the workers' CPU seconds) and ``busy`` (each worker's timed sum)."""
        plan = assign_units([u.length for u in units], self.workers)
        wall, res = self.batch([[(units[i].path, units[i].capacity, units[i].hashpower) for i in idx] for idx in plan])
        out: list = [None] * len(units)
        for idx, r in zip(plan, res):
            got = r[4]
            if len(got) != len(idx):
                raise RuntimeError("a libCacheSim worker returned the wrong number of results")
            for i, o in zip(idx, got):
                out[i] = o
        busy = [float(r[1]) for idx, r in zip(plan, res) if idx]
        return {"seconds": max(busy, default=0.0), "wall": wall, "results": out, "workers": len(busy),
                "cpu": float(sum(r[3] for r in res)), "busy": busy}

    def release(self) -> None:
        """Close every worker's readers (an empty batch)."""
        self.batch([[] for _ in range(self.workers)], forget=True)

    def close(self) -> None:
        ex, self.ex = getattr(self, "ex", None), None
        if ex is not None:
            self.barrier.abort()  # a worker still waiting at the barrier returns at once
            ex.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------- the bench
@dataclass
class LcsResult:
    """libCacheSim's figures for one list of configurations (each ``(streams, capacity)``)."""

    sequential: Timing  # value: misses per configuration
    parallel: Timing | None = None  # value: misses per configuration
    workers: int | None = None  # worker processes that got work
    parallel_accesses: list[int] | None = None  # requests the workers' readers held, per configuration
    parallel_wall: Timing | None = None  # barrier to last result, untimed construction and freeing included
    parallel_cores_used: float | None = None  # the workers' CPU seconds / wall seconds, last parallel batch
    parallel_balance: float | None = None  # mean / max of the workers' timed sums, last parallel batch
    note: str | None = None

    @property
    def sequential_misses(self) -> np.ndarray:
        return np.asarray(self.sequential.value, dtype=np.int64)

    @property
    def parallel_misses(self) -> np.ndarray | None:
        return None if self.parallel is None else np.asarray(self.parallel.value, dtype=np.int64)


@dataclass
class Bench:
    quick: bool = True
    configs: int = 64
    repeats: int = 3
    budget_s: float = 6.0
    lcs_max_runs: int | None = None  # run at most this many libCacheSim configurations of a case, scale the rest
    lcs_workers: int | None = None  # processes of libCacheSim's parallel figure (None: every usable core; 0: none)
    reference_max_blocks: int = 250_000
    json_path: str | None = None
    quiet: bool = False
    curve_backend: str = "auto"  # hit_curve's backend (auto: numba on a CPU JAX backend, else jax)
    report: dict = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory | None = None

    def __post_init__(self):
        if self.configs < 4 or self.configs % 4:
            raise ValueError("--configs must be a positive multiple of 4 (capacities x 2 replica counts x 2 seeds)")
        if self.lcs_workers is None:
            self.lcs_workers = usable_cores()
        if self.lcs_workers < 0:
            raise ValueError("--lcs-workers must be >= 0")
        self.lcs = _import_lcs()
        self._tmp = tempfile.TemporaryDirectory(prefix="cacheresearch-bench-")
        self.tmp = Path(self._tmp.name)
        self._pool: LcsPool | None = None
        self._pool_error: str | None = None
        self.report = {
            "machine": machine_info(self.lcs),
            "settings": {
                "quick": self.quick, "configs": self.configs, "repeats": self.repeats, "budget_s": self.budget_s,
                "lcs_max_runs": self.lcs_max_runs, "lcs_workers": self.lcs_workers,
                "reference_max_blocks": self.reference_max_blocks,
                "policy": "lru (leaf-first)", "router": "random (sweep*_cache_aware: cache_aware, precise view)",
                "engine_calls": "public simulate / simulate_grid calls; first call = compile + one run (warm-up)",
                "curve_backend": curve_backend(self.curve_backend),
            },
            "workloads": {},
            "cases": [],
            "scaling": [],
            "shards": [],
        }
        self._exact_curves: dict[str, tuple[mrc.HitCurve, float]] = {}
        self._sweep: dict[str, dict] = {}
        self._single: dict[str, dict] = {}
        self.stream_prep_s: dict[str, float] = {}  # compile_stream seconds per workload (host work, untimed)

    def curve(self, w: Workload, **kw) -> mrc.HitCurve:
        return mrc.hit_curve(w, backend=self.curve_backend, **kw)

    # ---------------------------------------------------------------- output
    def log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    def save(self) -> None:
        if self.json_path:
            p = Path(self.json_path)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(json.dumps(self.report, indent=1))
            os.replace(tmp, p)

    def add_case(self, case: dict, spec: WorkloadSpec | None = None) -> dict:
        if spec is not None and spec.case_suffix:
            case["name"] += spec.case_suffix
            case["reduced"] = spec.note
        case["peak_rss_mb"] = peak_rss_mb()
        missing = [k for k in CASE_KEYS if k not in case]
        if missing:
            raise KeyError(f"case {case.get('name')!r} lacks {missing}")
        self.report["cases"].append(case)
        self.log("  " + format_row(case))
        self.save()
        return case

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ---------------------------------------------------------------- libCacheSim
    def pool(self) -> LcsPool | None:
        """The worker pool of libCacheSim's parallel figure, started (and warmed up) on first use."""
        if self.lcs is None or not self.lcs_workers or self._pool_error is not None:
            return self._pool
        if self._pool is None:
            self.log(f"[bench] starting {self.lcs_workers} libCacheSim worker processes ...")
            try:
                self._pool = LcsPool(self.lcs_workers)
            except Exception as e:  # noqa: BLE001 - the parallel figure is then missing, and says why
                self._pool_error = f"{type(e).__name__}: {e}"[:500]
                self.report["settings"]["libcachesim_pool_error"] = self._pool_error
                self.log(f"[bench] libCacheSim pool failed: {self._pool_error}")
            else:
                self.report["settings"]["libcachesim_pool_start_s"] = _r(self._pool.start_s)
                self.log(f"[bench] libCacheSim pool ready in {self._pool.start_s:.1f} s (pids {self._pool.pids})")
            self.save()
        return self._pool

    def lcs_run(self, configs: list[tuple[LcsStreams, int]], *, parallel: bool) -> LcsResult:
        """libCacheSim on ``configs``: one core (always), and the parallel batch when ``parallel``."""
        seq = measure_timed(lambda: lcs_sequential(configs), repeats=self.repeats, budget_s=self.budget_s)
        res = LcsResult(seq)
        if not parallel:
            return res
        pool = self.pool()
        if pool is None:
            res.note = ("no parallel figure: " + (self._pool_error or "--lcs-workers 0"))
            return res
        units = [u for i, (st, cap) in enumerate(configs) for u in st.units(cap, i)]
        walls: list[float] = []

        def once():
            r = pool.run(units)
            walls.append(r["wall"])
            return r["seconds"], r

        try:
            par = measure_timed(once, repeats=self.repeats, budget_s=self.budget_s)
            pool.release()
        except Exception as e:  # noqa: BLE001 - keep the sequential figure, say why the parallel one is missing
            self._pool_error = f"{type(e).__name__}: {e}"[:500]
            pool.close()
            self._pool = None
            self.report["settings"]["libcachesim_pool_error"] = self._pool_error
            res.note = "parallel run failed: " + self._pool_error
            return res
        last = par.value
        out, used = last["results"], last["workers"]
        res.parallel_wall = Timing(min(walls), statistics.median(walls), len(walls))
        res.parallel_cores_used = _ratio(last["cpu"], last["wall"])
        res.parallel_balance = _ratio(statistics.mean(last["busy"]), max(last["busy"])) if last["busy"] else None
        misses = np.zeros(len(configs), np.int64)
        reqs = np.zeros(len(configs), np.int64)
        for u, (miss_ratio, n_req) in zip(units, out):
            misses[u.config] += round(miss_ratio * u.length)
            reqs[u.config] += n_req
        par.value = misses.tolist()
        res.parallel, res.workers, res.parallel_accesses = par, used, reqs.tolist()
        if not np.array_equal(misses, res.sequential_misses):
            bad = int(np.argmax(misses != res.sequential_misses))
            raise AssertionError(f"libCacheSim in parallel: configuration {bad} misses {misses[bad]} != "
                                 f"sequential {res.sequential_misses[bad]}")
        return res

    def lcs_fields(self, lr: LcsResult | None, proj_s: float, proj_compile: float, *, scale: float = 1.0,
                   multi: bool) -> dict:
        """libCacheSim's figures and the ratios for a case whose project time is ``proj_s``.

        ``multi``: the case has several configurations, so ``ratio`` uses the parallel figure (None
        without one); otherwise (one configuration) the one-core figure."""
        out = {"libcachesim_s": None, "libcachesim_s_median": None, "libcachesim_parallel_s": None,
               "libcachesim_parallel_s_median": None, "libcachesim_workers": None, "ratio": None,
               "ratio_basis": None, "ratio_sequential": None, "ratio_with_compile": None}
        if lr is None:
            return out
        seq_s, seq_med = lr.sequential.best * scale, lr.sequential.median * scale
        out.update({"libcachesim_s": _r(seq_s), "libcachesim_s_median": _r(seq_med),
                    "libcachesim_repeats": lr.sequential.runs,
                    "ratio_sequential": _r(_ratio(seq_s, proj_s), 4)})
        if lr.parallel is not None:
            par_s, par_med = lr.parallel.best * scale, lr.parallel.median * scale
            out.update({"libcachesim_parallel_s": _r(par_s), "libcachesim_parallel_s_median": _r(par_med),
                        "libcachesim_workers": lr.workers, "libcachesim_parallel_repeats": lr.parallel.runs,
                        "libcachesim_parallel_speedup": _r(_ratio(seq_s, par_s), 4),
                        "libcachesim_parallel_wall_s": _r(lr.parallel_wall.best * scale),
                        # the workers' CPU seconds / the batch's wall seconds: the cores they really got
                        "libcachesim_parallel_cores_used": _r(lr.parallel_cores_used, 3),
                        # mean / max of the workers' timed seconds: 1 when the work was spread evenly
                        "libcachesim_parallel_balance": _r(lr.parallel_balance, 3)})
        if lr.note:
            out["libcachesim_parallel_note"] = lr.note
        if multi:
            basis, ref = ("libcachesim_parallel_s", par_s) if lr.parallel is not None else (None, None)
        else:
            basis, ref = "libcachesim_s", seq_s
        if ref is not None:
            out.update({"ratio": _r(_ratio(ref, proj_s), 4), "ratio_basis": basis,
                        "ratio_with_compile": _r(_ratio(ref, proj_s + proj_compile), 4)})
        return out

    # ---------------------------------------------------------------- one workload
    def add_workload(self, spec: WorkloadSpec) -> dict:
        w = spec.workload
        info = {
            "label": spec.label, "source": spec.source, "requests": w.n_requests, "blocks": w.total_blocks,
            "distinct_blocks": int(np.unique(w.keys).size), "block_tokens": w.block_tokens,
            "input_tokens": int(w.input_tokens.sum()), "replicas": spec.replicas, "capacity_blocks": spec.capacity,
        }
        if spec.note:
            info["note"] = spec.note
        self.report["workloads"][spec.name] = info
        self.save()
        return info

    def routing(self, spec: WorkloadSpec, replicas: int, seed: int) -> np.ndarray:
        return mrc.route_requests(spec.workload, "random", replicas, key=jax.random.PRNGKey(seed))

    def engine_single(self, stream, params, key, max_replicas: int) -> Timing:
        """The public ``simulate`` call (per-request output, no queue model); first call = warm-up."""
        def call():
            return _ready(simulate(stream, params, key, max_replicas=max_replicas, per_request=True, queue=False))

        return measure(call, repeats=self.repeats, budget_s=self.budget_s, warmup=True)

    def engine_grid(self, stream, cells, max_replicas: int, *, router: str = "random", queue: bool = False, **knobs):
        """The public ``simulate_grid`` call over ``cells`` = ``(capacity, replicas, seed)``; first call =
        warm-up. Returns ``(timing, hit tokens per cell, params)``."""
        params = stack_params([make_params("lru", int(c), replicas=int(r), router=router, **knobs) for c, r,
            _ in cells])
        keys = jnp.stack([jax.random.PRNGKey(int(s)) for _, _, s in cells])
        def call():
            return _ready(simulate_grid(stream, params, keys, max_replicas=max_replicas, per_request=False,
                queue=queue))

        tm = measure(call, repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        m = tm.value
        return tm, combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo), params

    # single ---------------------------------------------------------------------------------------
    def case_single(self, spec: WorkloadSpec, stream=None) -> list[dict]:
        w, R, C = spec.workload, spec.replicas, spec.capacity
        key = jax.random.PRNGKey(0)
        if stream is None:
            t = time.perf_counter()
            stream = _ready(compile_stream(w))
            self.stream_prep_s[spec.name] = time.perf_counter() - t
        prep = self.stream_prep_s.get(spec.name)
        params = make_params("lru", C, replicas=R, router="random")
        eng = self.engine_single(stream, params, key, R)
        m = eng.value
        eng_tokens = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
        eng_blocks = np.asarray(m.hit_blocks).astype(np.int64)

        cur = measure(
            lambda: self.curve(w, replicas=R, router="random", key=key, max_capacity=C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        hc = cur.value
        cur_blocks = hc.hit_blocks_at(C)
        curve_exact = bool(int(hc.hit_tokens[C]) == eng_tokens and np.array_equal(cur_blocks, eng_blocks))
        if not curve_exact:
            raise AssertionError(f"{spec.name}: hit curve at C={C} ({int(hc.hit_tokens[C])} tokens) != engine "
                                 f"({eng_tokens})")

        # the one-capacity compiled replay (routing included, as in the curve)
        rpl = measure(
            lambda: mrc.lru_replay(w, mrc.route_requests(w, "random", R, key=key), C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        replay_exact = bool(np.array_equal(rpl.value, eng_blocks))
        if not replay_exact:
            raise AssertionError(f"{spec.name}: lru_replay at C={C} != engine")

        # the default path (engine.backend=auto, bench/auto.py), one configuration
        nbs = measure(auto_call(stream, [(C, R, 0)], R, per_request=True),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        if not np.array_equal(nbs.value[1][:w.n_requests], eng_blocks[:w.n_requests]):
            raise AssertionError(f"{spec.name}: the default backend != the JAX engine")

        # libCacheSim: one configuration, one cache per replica, one core
        lr = lcs_prep = lcs_hit = lcs_acc = None
        rep = np.asarray(m.replica)
        if self.lcs is not None:
            t = time.perf_counter()
            streams = LcsStreams(self.lcs, w, leaf_first_ids(w), rep, R, self.tmp, f"{spec.name}_single")
            lcs_prep = time.perf_counter() - t
            lr = self.lcs_run([(streams, C)], parallel=False)
            lcs_hit = 1.0 - int(lr.sequential_misses[0]) / max(streams.total, 1)
            lcs_acc = streams.accesses

        # reference (one config, on a prefix when large)
        ref = self.reference(spec, rep, eng_blocks)
        total_blocks = max(w.total_blocks, 1)
        common = {
            "workload": spec.name, "accesses": w.total_blocks, "configs": 1,
            "libcachesim_prep_s": _r(lcs_prep), "libcachesim_accesses": lcs_acc,
            "project_hit_rate": _r(eng_blocks.sum() / total_blocks),
            "project_token_hit_rate": _r(eng_tokens / max(int(w.input_tokens.sum()), 1)),
            "project_hit_tokens": eng_tokens, "project_hit_blocks": int(eng_blocks.sum()),
            "libcachesim_hit_rate": _r(lcs_hit),
            "capacity": C, "replicas": R,
            "curve_equals_engine": curve_exact, "replay_equals_engine": replay_exact,
            **ref,
        }
        backend = curve_backend(self.curve_backend)
        paths = (
            ("engine_jax", eng, _r(prep),
             "engine_jax: the JAX engine, simulate(per_request=True, queue=False), one configuration; first call = "
             "compile + run"),
            ("curve", cur, None,
             f"curve: hit_curve(max_capacity=C, backend={backend}), routing included; first call = compile + run"),
            ("replay", rpl, None,
             "replay: route_requests + lru_replay (numba, one capacity); first call = compile + run"),
            ("engine", nbs, _r(prep), auto_method(1, nbs.value[2])),
        )
        out = []
        for path, tm, path_prep, method in paths:
            case = {
                "name": f"single_{path}", "path": path, **common,
                "project_s": _r(tm.best), "project_s_median": _r(tm.median),
                "project_compile_s": _r(tm.compile_estimate), "project_first_call_s": _r(tm.first),
                "project_prep_s": path_prep,
                **self.lcs_fields(lr, tm.best, tm.compile_estimate, multi=False),
                "method": method, "repeats": tm.runs,
            }
            if ref.get("reference_s_per_access"):
                case["reference_slowdown_vs_project"] = _r(ref["reference_s_per_access"] / (tm.best / total_blocks), 4)
            out.append(self.add_case(case, spec))
        self._single[spec.name] = {"engine": eng, "curve": cur}
        return out

    def reference(self, spec: WorkloadSpec, rep: np.ndarray, eng_blocks: np.ndarray) -> dict:
        reference_simulate = _load_reference()
        if reference_simulate is None:
            return {"reference_s": None, "reference_note": "tests/reference.py not found"}
        w = spec.workload
        n = int(np.searchsorted(w.offsets, self.reference_max_blocks, side="right")) - 1
        n = max(1, min(n, w.n_requests))
        sub = w if n == w.n_requests else slice_requests(w, n)
        t = time.perf_counter()
        out = reference_simulate(sub, policy="lru", capacity_blocks=spec.capacity, replicas=spec.replicas,
                                 router="random", replica_choices=rep[:n])
        ref_s = time.perf_counter() - t
        res = {
            "reference_s": _r(ref_s), "reference_accesses": sub.total_blocks, "reference_requests": n,
            "reference_s_per_access": _r(ref_s / max(sub.total_blocks, 1)),
        }
        if n == w.n_requests:
            res["reference_equals_engine"] = bool(np.array_equal(out["hit_blocks"], eng_blocks))
            if not res["reference_equals_engine"]:
                raise AssertionError(f"{spec.name}: reference != engine")
        return res

    # sweep ----------------------------------------------------------------------------------------
    def sweep_grid(self, spec: WorkloadSpec, n_configs: int):
        R = spec.replicas
        reps = (1, 2) if R == 1 else (R // 2, R)
        seeds = (0, 1)
        caps = capacity_grid(spec.capacity, n_configs // 4)
        cells = [(c, r, s) for s in seeds for r in reps for c in caps]
        return caps, reps, seeds, cells

    def sweep_lcs(self, spec: WorkloadSpec, cells, groups):
        """libCacheSim on the sweep's configurations (all, or ``--lcs-max-runs`` of them), one cache per
        replica: (result, prep seconds, hit rates sequential / parallel per configuration, accesses, the
        time scale of a subset, a note)."""
        w = spec.workload
        # libCacheSim: the configurations (all, or --lcs-max-runs of them), one cache per replica
        lr = lcs_prep = None
        lcs_hit = np.full(len(cells), np.nan)
        lcs_par_hit = np.full(len(cells), np.nan)
        lcs_acc = None
        scale = 1.0
        lcs_note = None
        if self.lcs is not None:
            t = time.perf_counter()
            ids_leaf = leaf_first_ids(w)
            streams = {
                (r, s): LcsStreams(self.lcs, w, ids_leaf, self.routing(spec, r, s), r, self.tmp,
                    f"{spec.name}_sw_r{r}_s{s}")
                for r, s in groups
            }
            lcs_prep = time.perf_counter() - t
            run_idx = subset_index(len(cells), self.lcs_max_runs)
            scale = len(cells) / run_idx.size
            if run_idx.size < len(cells):
                lcs_note = (f"ran {run_idx.size} of {len(cells)} configurations (evenly spaced), sequentially and "
                            f"in parallel; times scaled by {scale:.2f}")
            lr = self.lcs_run([(streams[(cells[i][1], cells[i][2])], int(cells[i][0])) for i in run_idx], parallel=True)
            totals = {g: max(st.total, 1) for g, st in streams.items()}
            for j, i in enumerate(run_idx):
                g = (cells[i][1], cells[i][2])
                lcs_hit[i] = 1.0 - lr.sequential_misses[j] / totals[g]
                if lr.parallel is not None:
                    lcs_par_hit[i] = 1.0 - lr.parallel_misses[j] / totals[g]
            acc = sorted({st.accesses for st in streams.values()})
            lcs_acc = acc[0] if len(acc) == 1 else acc

        return lr, lcs_prep, lcs_hit, lcs_par_hit, lcs_acc, scale, lcs_note

    def case_sweep(self, spec: WorkloadSpec, stream) -> list[dict]:
        w = spec.workload
        N = self.configs
        caps, reps, seeds, cells = self.sweep_grid(spec, N)
        groups = [(r, s) for s in seeds for r in reps]

        # (a) the engine: every configuration in one vmapped call
        eng, eng_tokens, _ = self.engine_grid(stream, cells, max(reps))
        # logged at once, so that a time-limited run keeps the engine's figure
        self.log(f"[bench] {spec.name}: engine, {len(cells)} configurations in one call: {eng.best:.4f} s "
                 f"(first call {eng.first:.2f} s)")
        # (a') the engine's numba backend (core.replay): the same configurations, configurations in threads
        nba = measure(auto_call(stream, cells, max(reps), per_request=False),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        if not np.array_equal(nba.value[0], eng_tokens):
            raise AssertionError(f"{spec.name}: sweep: the default backend != the JAX engine")
        # (b) one-pass curves: one per (replicas, seed) routing group, all capacities read off
        def curves():
            return {
                (r, s): self.curve(w, replicas=r, router="random", key=jax.random.PRNGKey(s),
                    max_capacity=int(caps.max()))
                for r, s in groups
            }

        cur = measure(curves, repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        hc = cur.value
        curve_tokens = np.array([int(hc[(r, s)].hit_tokens[c]) for c, r, s in cells], dtype=np.int64)
        thr_sorted = {g: np.sort(hc[g].thresholds) for g in groups}
        proj_block = np.array([np.searchsorted(thr_sorted[(r, s)], c, side="left") for c, r,
            s in cells]) / max(w.total_blocks, 1)
        proj_token = curve_tokens / max(int(w.input_tokens.sum()), 1)

        exact = bool(np.array_equal(eng_tokens, curve_tokens))
        if not exact:
            bad = int(np.argmax(eng_tokens != curve_tokens))
            raise AssertionError(f"{spec.name}: sweep config {cells[bad]}: engine {eng_tokens[bad]} != curve "
                                 f"{curve_tokens[bad]}")

        lr, lcs_prep, lcs_hit, lcs_par_hit, lcs_acc, scale, lcs_note = self.sweep_lcs(spec, cells, groups)

        def opt(x):
            return None if np.isnan(x) else _r(x)

        per_config = [
            {"capacity": int(c), "replicas": int(r), "seed": int(s), "project_hit_tokens": int(curve_tokens[i]),
             "project_hit_rate": _r(proj_block[i]), "project_token_hit_rate": _r(proj_token[i]),
             "libcachesim_hit_rate": opt(lcs_hit[i]), "libcachesim_parallel_hit_rate": opt(lcs_par_hit[i])}
            for i, (c, r, s) in enumerate(cells)
        ]
        have = ~np.isnan(lcs_hit)
        lcs_mean = float(lcs_hit[have].mean()) if have.any() else None
        max_diff = float(np.abs(lcs_hit[have] - proj_block[have]).max()) if have.any() else None
        common = {
            "workload": spec.name, "accesses": w.total_blocks, "configs": len(cells),
            "total_accesses": w.total_blocks * len(cells),
            "libcachesim_prep_s": _r(lcs_prep), "libcachesim_accesses": lcs_acc,
            "libcachesim_parallel_accesses": None if lr is None else lr.parallel_accesses,
            # means over the configurations libCacheSim ran (all, unless --lcs-max-runs)
            "project_hit_rate": _r(proj_block[have].mean() if have.any() else proj_block.mean()),
            "project_token_hit_rate": _r(proj_token[have].mean() if have.any() else proj_token.mean()),
            "libcachesim_hit_rate": _r(lcs_mean), "max_abs_hit_rate_diff": _r(max_diff),
            "libcachesim_parallel_equals_sequential": None if lr is None or lr.parallel is None else True,
            "grid": {"capacities": [int(c) for c in caps], "replicas": list(reps), "seeds": list(seeds)},
            "engine_equals_curve": exact,
            "per_config": per_config,
        }
        if lcs_note:
            common["libcachesim_note"] = lcs_note
        out = []
        e = {
            "name": f"sweep{N}_engine_jax", "path": "engine_jax", **common,
            "project_s": _r(eng.best), "project_s_median": _r(eng.median),
                "project_compile_s": _r(eng.compile_estimate),
            "project_first_call_s": _r(eng.first), "project_prep_s": _r(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(lr, eng.best, eng.compile_estimate, scale=scale, multi=True),
            "method": (f"engine_jax: the JAX engine, simulate_grid over {len(cells)} configs in one call (vmap, "
                       f"per_request=False, "
                       "queue=False: hit rates only); first call = compile + run"),
            "repeats": eng.runs,
        }
        out.append(self.add_case(e, spec))
        en = {
            "name": f"sweep{N}_engine", "path": "engine", **common,
            "project_s": _r(nba.best), "project_s_median": _r(nba.median),
                "project_compile_s": _r(nba.compile_estimate),
            "project_first_call_s": _r(nba.first), "project_prep_s": _r(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(lr, nba.best, nba.compile_estimate, scale=scale, multi=True),
            "method": auto_method(len(cells), nba.value[2]),
            "repeats": nba.runs,
        }
        out.append(self.add_case(en, spec))
        c = {
            "name": f"sweep{N}_curve", "path": "curve", **common,
            "project_s": _r(cur.best), "project_s_median": _r(cur.median),
                "project_compile_s": _r(cur.compile_estimate),
            "project_first_call_s": _r(cur.first), "project_prep_s": None,
            **self.lcs_fields(lr, cur.best, cur.compile_estimate, scale=scale, multi=True),
            "method": (f"curve: hit_curve (backend={curve_backend(self.curve_backend)}) per (replicas, seed) group "
                       f"({len(groups)} groups), all capacities read off; first call = compile + run"),
            "repeats": cur.runs,
        }
        out.append(self.add_case(c, spec))
        self._sweep[spec.name] = {"engine": eng, "configs": len(cells), "cells": cells, "tokens": eng_tokens}
        return out

    # cache-aware sweep ----------------------------------------------------------------------------
    def case_cache_aware(self, spec: WorkloadSpec, stream) -> dict:
        w = spec.workload
        N = self.configs
        caps, reps, seeds, cells = self.sweep_grid(spec, N)
        # the baseline first: the same grid, random router, with the queue model as well
        base, base_tokens, _ = self.engine_grid(stream, cells, max(reps), router="random", queue=True)
        self.log(f"[bench] {spec.name}: random router, queue=True, {len(cells)} configurations: {base.best:.4f} s")
        ca, ca_tokens, params = self.engine_grid(stream, cells, max(reps), router="cache_aware", queue=True,
            view="precise")
        prev = self._sweep.get(spec.name)
        base_equal = None
        if prev is not None and prev["cells"] == cells:
            base_equal = bool(np.array_equal(prev["tokens"], base_tokens))
            if not base_equal:
                raise AssertionError(f"{spec.name}: random router with queue=True != queue=False (hit tokens)")
        total_in = max(int(w.input_tokens.sum()), 1)
        knobs = {k: np.asarray(getattr(params, k)).reshape(-1)[0].item()
                 for k in ("cache_threshold_pm", "balance_abs", "balance_rel_pct", "miss_smallest_tree")
                 if hasattr(params, k)}
        case = {
            "name": f"sweep{N}_cache_aware", "path": "engine_jax",
            "workload": spec.name, "accesses": w.total_blocks, "configs": len(cells),
            "total_accesses": w.total_blocks * len(cells),
            "project_s": _r(ca.best), "project_s_median": _r(ca.median), "project_compile_s": _r(ca.compile_estimate),
            "project_first_call_s": _r(ca.first), "project_prep_s": _r(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(None, ca.best, ca.compile_estimate, multi=True),
            "libcachesim_accesses": None, "libcachesim_hit_rate": None,
            "libcachesim_note": "libCacheSim has no router that reads cache state or load: no libCacheSim "
                                "figure, no ratio",
            "router": "cache_aware", "view": "precise", "queue": True, "router_knobs": knobs,
            "baseline_router": "random", "baseline_queue": True,
            "baseline_s": _r(base.best), "baseline_s_median": _r(base.median),
            "baseline_compile_s": _r(base.compile_estimate), "baseline_first_call_s": _r(base.first),
            "cost_vs_random": _r(_ratio(ca.best, base.best), 4),
            "baseline_equals_sweep_engine": base_equal,
            # the engine's block hit rate needs per-request output, which this timed call leaves out
            "project_hit_rate": None,
            "project_token_hit_rate": _r(ca_tokens.mean() / total_in),
            "baseline_token_hit_rate": _r(base_tokens.mean() / total_in),
            "grid": {"capacities": [int(c) for c in caps], "replicas": list(reps), "seeds": list(seeds)},
            "per_config": [
                {"capacity": int(c), "replicas": int(r), "seed": int(s), "project_hit_tokens": int(ca_tokens[i]),
                 "baseline_hit_tokens": int(base_tokens[i]), "project_token_hit_rate": _r(ca_tokens[i] / total_in)}
                for i, (c, r, s) in enumerate(cells)
            ],
            "method": (f"engine_jax: the JAX engine, simulate_grid over {len(cells)} configs in one call, "
                       f"router cache_aware (view precise, "
                       "default knobs), queue=True (the router reads loads); cost_vs_random = its time / the same "
                       "grid with router random and queue=True; first call = compile + run"),
            "repeats": ca.runs, "baseline_repeats": base.runs,
        }
        return self.add_case(case, spec)

    # mrc ------------------------------------------------------------------------------------------
    def case_mrc(self, spec: WorkloadSpec, stream) -> dict:
        w = spec.workload
        key = jax.random.PRNGKey(0)
        cur = measure(lambda: self.curve(w, replicas=1, router="random", key=key),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        hc = cur.value
        ws = int(hc.capacities[-1])
        self._exact_curves[spec.name] = (hc, cur.best)
        caps = lcs_capacities(ws, 64)
        thr = np.sort(hc.thresholds)
        proj_block = np.searchsorted(thr, caps, side="left") / max(w.total_blocks, 1)
        # the exact engine at three of the capacities (untimed)
        pick = caps[[len(caps) // 4, len(caps) // 2, (3 * len(caps)) // 4]]
        cells = [(int(c), 1, 0) for c in pick]
        params = stack_params([make_params("lru", c, replicas=1, router="random") for c, _, _ in cells])
        keys = jnp.stack([key] * len(cells))
        m = _ready(simulate_grid(stream, params, keys, max_replicas=1, per_request=False, queue=False))
        eng_tokens = combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)
        cur_tokens = hc.hit_tokens[pick]
        exact = bool(np.array_equal(eng_tokens, cur_tokens))
        if not exact:
            raise AssertionError(f"{spec.name}: mrc curve {cur_tokens.tolist()} != engine {eng_tokens.tolist()} "
                                 f"at {pick.tolist()}")
        lr = lcs_prep = lcs_note = lcs_acc = None
        lcs_hit = lcs_par_hit = None
        max_diff = None
        scale = 1.0
        if self.lcs is not None:
            t = time.perf_counter()
            streams = LcsStreams(self.lcs, w, leaf_first_ids(w), np.zeros(w.n_requests, np.int64), 1, self.tmp,
                f"{spec.name}_mrc")
            lcs_prep = time.perf_counter() - t
            run_idx = subset_index(caps.size, self.lcs_max_runs)
            scale = caps.size / run_idx.size
            if run_idx.size < caps.size:
                lcs_note = (f"ran {run_idx.size} of {caps.size} capacities (evenly spaced), sequentially and in "
                            f"parallel; times scaled by {scale:.2f}")
            lr = self.lcs_run([(streams, int(caps[i])) for i in run_idx], parallel=True)
            lcs_hit = np.full(caps.size, np.nan)
            lcs_hit[run_idx] = 1.0 - lr.sequential_misses / max(streams.total, 1)
            if lr.parallel is not None:
                lcs_par_hit = np.full(caps.size, np.nan)
                lcs_par_hit[run_idx] = 1.0 - lr.parallel_misses / max(streams.total, 1)
            max_diff = float(np.nanmax(np.abs(lcs_hit - proj_block)))
            lcs_acc = streams.accesses

        def opt_list(a):
            return None if a is None else [None if np.isnan(x) else _r(x) for x in a]

        case = {
            "name": "mrc_curve", "path": "curve",
            "workload": spec.name,
            "accesses": w.total_blocks,
            "configs": int(caps.size),
            "project_s": _r(cur.best), "project_s_median": _r(cur.median),
                "project_compile_s": _r(cur.compile_estimate),
            "project_first_call_s": _r(cur.first), "project_prep_s": None,
            "libcachesim_prep_s": _r(lcs_prep), "libcachesim_accesses": lcs_acc,
            "libcachesim_parallel_accesses": None if lr is None else lr.parallel_accesses,
            **self.lcs_fields(lr, cur.best, cur.compile_estimate, scale=scale, multi=True),
            "project_hit_rate": _r(proj_block[~np.isnan(lcs_hit)].mean() if lcs_hit is not None else proj_block.mean()),
            "libcachesim_hit_rate": _r(None if lcs_hit is None else np.nanmean(lcs_hit)),
            "libcachesim_parallel_equals_sequential": None if lr is None or lr.parallel is None else True,
            "max_abs_hit_rate_diff": _r(max_diff),
            "method": (f"curve: one hit_curve (1 replica, backend={curve_backend(self.curve_backend)}) gives "
                       f"all {ws + 1} "
                       f"capacities 0..working set; libCacheSim: {caps.size} log-spaced capacities; hit rates "
                       f"are means "
                       "over those capacities"),
            "working_set_blocks": ws,
            "engine_checked_capacities": [int(c) for c in pick],
            "engine_checked_hit_tokens": [int(x) for x in eng_tokens],
            "curve_equals_engine": exact,
            "curve": {
                "capacities": [int(c) for c in caps],
                "project_block_hit_rate": [_r(x) for x in proj_block],
                "project_token_hit_rate": [_r(x) for x in hc.token_hit_rate[caps]],
                "libcachesim_hit_rate": opt_list(lcs_hit),
                "libcachesim_parallel_hit_rate": opt_list(lcs_par_hit),
            },
            "repeats": cur.runs,
        }
        if lcs_note:
            case["libcachesim_note"] = lcs_note
        return self.add_case(case, spec)

    # scaling --------------------------------------------------------------------------------------
    def scaling(self, spec: WorkloadSpec, stream) -> list[dict]:
        w = spec.workload
        R, C = spec.replicas, spec.capacity
        key = jax.random.PRNGKey(0)
        out = []
        half = slice_requests(w, max(1, w.n_requests // 2))
        for sub, label in ((half, "half"), (w, "full")):
            if sub is w and spec.name in self._single:  # measured by the single cases
                eng, cur = self._single[spec.name]["engine"], self._single[spec.name]["curve"]
            else:
                s = stream if sub is w else _ready(compile_stream(sub))
                params = make_params("lru", C, replicas=R, router="random")
                eng = self.engine_single(s, params, key, R)
                cur = measure(lambda: self.curve(sub, replicas=R, router="random", key=key, max_capacity=C),
                              repeats=self.repeats, budget_s=self.budget_s, warmup=True)
            for method, tm in (("engine single", eng), ("curve single", cur)):
                out.append({
                    "workload": spec.name, "axis": "requests", "size": label, "requests": sub.n_requests,
                    "accesses": sub.total_blocks, "configs": 1, "method": method, "project_s": _r(tm.best),
                    "project_s_median": _r(tm.median),
                        "us_per_access_config": _r(1e6 * tm.best / max(sub.total_blocks, 1), 4),
                })
        # configs: a quarter of the sweep vs the whole sweep (same stream, one vmapped call each)
        N = self.configs
        for n in (N // 4, N):
            if n < 4:
                continue
            _, reps, _, cells = self.sweep_grid(spec, n)
            prev = self._sweep.get(spec.name)
            if prev is not None and prev["configs"] == len(cells) and n == N:
                tm = prev["engine"]
            else:
                tm, _, _ = self.engine_grid(stream, cells, max(reps))
            out.append({
                "workload": spec.name, "axis": "configs", "size": str(len(cells)), "requests": w.n_requests,
                "accesses": w.total_blocks, "configs": len(cells), "method": "engine grid (simulate_grid)",
                "project_s": _r(tm.best), "project_s_median": _r(tm.median),
                "us_per_access_config": _r(1e6 * tm.best / max(w.total_blocks * len(cells), 1), 4),
            })
        self.report["scaling"].extend(out)
        for row in out:
            self.log(f"  scaling {row['axis']:<8} {row['size']:>5} {row['method']:<28} {row['project_s']:>9.4f}s "
                     f"{row['us_per_access_config']:>9.4f} us/access/config")
        self.save()
        return out

    # SHARDS ---------------------------------------------------------------------------------------
    def shards(self, spec: WorkloadSpec, rates=(0.1, 0.01)) -> list[dict]:
        w = spec.workload
        key = jax.random.PRNGKey(0)
        if spec.name in self._exact_curves:
            exact, exact_s = self._exact_curves[spec.name]
        else:
            tm = measure(lambda: self.curve(w, replicas=1, router="random", key=key), repeats=1, budget_s=0,
                warmup=True)
            exact, exact_s = tm.value, tm.best
        ex = exact.token_hit_rate
        out = []
        for rate in rates:
            t = time.perf_counter()
            sub, factor = mrc.shards_sample(w, rate)
            sample_s = time.perf_counter() - t
            row = {"workload": spec.name, "rate": rate, "sampled_requests": sub.n_requests,
                "sampled_accesses": sub.total_blocks,
                   "sample_s": _r(sample_s), "exact_curve_s": _r(exact_s)}
            if sub.n_requests == 0 or sub.total_blocks == 0:
                row.update({"curve_s": None, "max_abs_error": None, "note": "the sample is empty"})
            else:
                tm = measure(lambda: self.curve(sub, replicas=1, router="random", key=key), repeats=self.repeats,
                             budget_s=self.budget_s, warmup=True)
                sc = tm.value
                c = sc.capacities[1:]
                full_c = np.minimum(np.round(c / factor).astype(np.int64), exact.capacities[-1])
                err = np.abs(sc.token_hit_rate[1:] - ex[full_c])
                # also at the exact curve's own capacities (sampled curve read at C * rate)
                C = exact.capacities[1:]
                sc_c = np.minimum(np.round(C * factor).astype(np.int64), sc.capacities[-1])
                err2 = np.abs(sc.token_hit_rate[sc_c] - ex[1:])
                row.update({
                    "curve_s": _r(tm.best), "curve_first_call_s": _r(tm.first), "total_s": _r(sample_s + tm.best),
                    "speedup_vs_exact": _r(_ratio(exact_s, sample_s + tm.best), 3),
                    "max_abs_error": _r(float(err.max()) if err.size else None),
                    "mean_abs_error": _r(float(err.mean()) if err.size else None),
                    "max_abs_error_at_exact_capacities": _r(float(err2.max()) if err2.size else None),
                    "sampled_working_set": int(sc.capacities[-1]),
                })
            out.append(row)
            self.log(f"  shards rate={rate}: {row}")
        self.report["shards"].extend(out)
        self.save()
        return out


def format_row(c: dict) -> str:
    def f(x, spec):
        if x is None:
            width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
            return "-".rjust(int(width or 1))
        return format(x, spec)

    note = c.get("path", "")
    if c.get("cost_vs_random") is not None:
        note += f"; {c['cost_vs_random']:.2f}x random (both queue=True)"
    elif c.get("ratio") is None and c.get("libcachesim_s") is not None:
        note += "; no parallel figure"
    return (f"{c['workload']:<11} {c['name']:<28} {c['accesses']:>9} {c['configs']:>5} "
            f"{f(c['project_s'], '10.4f')} {f(c['project_compile_s'], '7.2f')} {f(c['libcachesim_s'], '9.4f')} "
            f"{f(c.get('libcachesim_parallel_s'), '9.4f')} {f(c.get('libcachesim_workers'), '3d')} "
            f"{f(c['ratio'], '8.3f')} {f(c.get('ratio_sequential'), '8.3f')} {f(c['ratio_with_compile'], '8.3f')} "
            f"{f(c['project_hit_rate'], '6.4f')} {f(c['libcachesim_hit_rate'], '6.4f')} "
            f"{f(c.get('peak_rss_mb'), '6.0f')}  {note}")


HEADER = (f"{'workload':<11} {'case':<28} {'accesses':>9} {'cfgs':>5} {'project_s':>10} {'compile':>7} "
          f"{'lcs_1core':>9} {'lcs_par':>9} {'wk':>3} {'ratio':>8} {'r_1core':>8} {'r+comp':>8} "
          f"{'p_hit':>6} {'l_hit':>6} {'rss_mb':>6}  path")
LEGEND = ("ratio = libCacheSim s / project s: lcs_par (libCacheSim on wk worker processes) for cases with several "
          "configurations, lcs_1core for single_*; r_1core = lcs_1core / project s; r+comp adds the compile")


def format_table(report: dict) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [format_row(c) for c in report["cases"]]
    lines.append(LEGEND)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- machine info
def machine_info(lcs=None) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None

    def ver(mod):
        try:
            return __import__(mod).__version__
        except Exception:  # noqa: BLE001
            return None

    lcs_ver = None
    if lcs is not None:
        lcs_ver = getattr(lcs, "__version__", None)
        if lcs_ver is None:
            try:
                from importlib.metadata import version  # noqa: PLC0415

                lcs_ver = version("libcachesim")
            except Exception:  # noqa: BLE001
                lcs_ver = "unknown"
    return {
        "cpu": cpu, "cores": os.cpu_count(), "cores_usable": affinity, "memory_gb": mem_gb, "loadavg_at_start": load,
        "platform": platform.platform(), "python": platform.python_version(),
        "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
        "versions": {"cacheresearch": __version__, "jax": jax.__version__, "jaxlib": ver("jaxlib"),
            "numpy": np.__version__,
                     "libcachesim": lcs_ver},
    }


# ---------------------------------------------------------------------------------- memory check
def memory_workload(n_requests: int = 1_000_000, *, seed: int = 0, prefixes: int = 10_000) -> Workload:
    """A cheap synthetic key stream: 4 blocks per request, 2 shared (one of ``prefixes`` prefixes,
    Zipf-like popularity) and 2 unique, 16-token blocks, one request per ms (numpy only)."""
    rng = np.random.default_rng(seed)
    n = int(n_requests)
    p = np.minimum(rng.zipf(1.2, n) - 1, prefixes - 1).astype(np.uint64)
    keys = np.empty((n, 4), np.uint64)
    keys[:, 0] = 2 * p + 1
    keys[:, 1] = 2 * p + 2
    u = np.uint64(1 << 40) + 2 * np.arange(n, dtype=np.uint64)
    keys[:, 2] = u
    keys[:, 3] = u + np.uint64(1)
    return Workload(
        arrival_ms=np.arange(n, dtype=np.int64), input_tokens=np.full(n, 64), output_tokens=np.zeros(n, np.int64),
        tenant=np.zeros(n, np.int32), keys=keys.reshape(-1), offsets=np.arange(n + 1, dtype=np.int64) * 4,
        block_tokens=16, name=f"memory-{n}",
    )


def memory_check(n_requests: int = 1_000_000, *, capacity: int = 20_000, curve_chunk_blocks: int = 64,
                 backend: str = "auto") -> dict:
    """Replay ``n_requests`` through the engine (one config) and the hit curve; peak RSS after each.

    The engine's stream uses :func:`~cacheresearch.engine.compile_stream`'s own defaults; the curve's
    chunk defaults to its own (64 blocks, which pads these 4-block requests 16 times over; smaller
    chunks lower the peak)."""
    out = {"requests": n_requests, "rss_mb_at_start": peak_rss_mb()}
    t = time.perf_counter()
    w = memory_workload(n_requests)
    out["accesses"] = w.total_blocks
    out["build_s"] = _r(time.perf_counter() - t)
    out["peak_rss_mb_after_build"] = peak_rss_mb()
    t = time.perf_counter()
    stream = compile_stream(w)
    _ready(stream)
    out["compile_stream_s"] = _r(time.perf_counter() - t)
    out["peak_rss_mb_after_compile_stream"] = peak_rss_mb()
    params = make_params("lru", capacity, replicas=1)
    t = time.perf_counter()
    m = _ready(simulate(stream, params, jax.random.PRNGKey(0), max_replicas=1, per_request=True, queue=False))
    out["engine_s_with_compile"] = _r(time.perf_counter() - t)
    out["engine_token_hit_rate"] = _r(float(m.token_hit_rate))
    eng_tokens = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
    out["peak_rss_mb_after_engine"] = peak_rss_mb()
    del stream, m
    t = time.perf_counter()
    hc = mrc.hit_curve(w, replicas=1, max_capacity=capacity, chunk_blocks=curve_chunk_blocks, backend=backend)
    out["curve_s_with_compile"] = _r(time.perf_counter() - t)
    out["curve_chunk_blocks"] = curve_chunk_blocks
    out["curve_backend"] = curve_backend(backend)
    out["curve_equals_engine"] = bool(int(hc.hit_tokens[capacity]) == eng_tokens)
    out["peak_rss_mb_after_curve"] = peak_rss_mb()
    out["peak_rss_mb"] = peak_rss_mb()
    out["target_mb"] = 4096
    out["within_target"] = out["peak_rss_mb"] < 4096
    out["method"] = (f"engine: compile_stream defaults, simulate(per_request=True, queue=False), capacity "
                     f"{capacity}; curve: hit_curve(max_capacity={capacity}, chunk_blocks={curve_chunk_blocks})")
    return out


def _memory_check_child(n_requests: int, timeout: float = 1800) -> dict:
    cmd = [sys.executable, "-m", "cacheresearch.bench", "--memory-check-child", str(n_requests)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT))
    if p.returncode != 0:
        return {"requests": n_requests, "error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ driver
def run_bench(
    workloads=("seed_fleet", "mooncake", "design"),
    *,
    quick: bool = True,
    configs: int = 64,
    repeats: int | None = None,
    budget_s: float | None = None,
    json_path: str | None = None,
    design_requests: int | None = None,
    lcs_max_runs: int | None = None,
    lcs_workers: int | None = None,
    curve_backend: str = "auto",
    cases=CASES,
    scaling_workload: str | None = "auto",
    shards_workload: str | None = "auto",
    memory_requests: int | None = None,
    quiet: bool = False,
) -> dict:
    """Run the bench; returns the report (also written to ``json_path`` after every case)."""
    t0 = time.perf_counter()
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; choose from {CASES}")
    b = Bench(
        quick=quick, configs=configs, repeats=repeats or (3 if quick else 5),
            budget_s=budget_s or (6.0 if quick else 20.0),
        lcs_max_runs=lcs_max_runs, lcs_workers=lcs_workers, curve_backend=curve_backend,
            reference_max_blocks=300_000 if quick else 1_000_000, json_path=json_path, quiet=quiet,
    )
    try:
        lcs_ver = "missing: its columns stay empty" if b.lcs is None else b.report["machine"]["versions"]["libcachesim"]
        b.log(f"[bench] jax {jax.__version__} on {jax.default_backend()} {jax.devices()}; libcachesim {lcs_ver}")
        specs = {}
        streams = {}
        for name in workloads:
            t = time.perf_counter()
            spec = make_workload(name, quick=quick, design_requests=design_requests, quiet=quiet)
            info = b.add_workload(spec)
            info["build_s"] = _r(time.perf_counter() - t)
            b.log(f"[bench] workload {name}: {info}")
            specs[name] = spec
        b.log(HEADER)
        for name, spec in specs.items():
            t = time.perf_counter()
            stream = _ready(compile_stream(spec.workload))
            b.stream_prep_s[name] = time.perf_counter() - t
            b.report["workloads"][name]["compile_stream_s"] = _r(b.stream_prep_s[name])
            streams[name] = stream
            if "single" in cases:
                b.case_single(spec, stream)
            if "sweep" in cases:
                b.case_sweep(spec, stream)
            if "cache_aware" in cases:
                b.case_cache_aware(spec, stream)
            if "mrc" in cases:
                b.case_mrc(spec, stream)
        if scaling_workload == "auto":
            scaling_workload = "seed_fleet" if "seed_fleet" in specs else (next(iter(specs)) if specs else None)
        if scaling_workload:
            b.scaling(specs[scaling_workload], streams[scaling_workload])
        if shards_workload == "auto":
            shards_workload = max(specs, key=lambda k: specs[k].workload.total_blocks) if specs else None
        if shards_workload:
            b.shards(specs[shards_workload])
        if memory_requests:
            b.log(f"[bench] memory check: {memory_requests} requests in a child process ...")
            b.report["memory_check"] = _memory_check_child(memory_requests)
            b.log(f"  memory check: {b.report['memory_check']}")
        b.report["total_s"] = round(time.perf_counter() - t0, 2)
        b.report["peak_rss_mb"] = peak_rss_mb()
        b.save()
        return b.report
    finally:
        b.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
        help=f"fewer repeats, design reduced to {QUICK_DESIGN_REQUESTS} requests")
    ap.add_argument("--json", metavar="FILE", help="write the report here (rewritten after every case)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
        help="comma-separated: seed_fleet,mooncake,design (or none)")
    ap.add_argument("--configs", type=int, default=64, help="configurations of the sweep (multiple of 4; default 64)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--budget", type=float, default=None, help="seconds of repeats per measurement")
    ap.add_argument("--design-requests", type=int, default=None, help="requests of the design workload")
    ap.add_argument("--lcs-max-runs", type=int, default=None,
                    help="run at most this many libCacheSim configurations of a case and scale the times "
                         "(default: all)")
    ap.add_argument("--lcs-workers", type=int, default=None,
                    help="processes for libCacheSim's parallel figure (default: every usable core; 0: no "
                         "parallel figure)")
    ap.add_argument("--curve-backend", default="auto", choices=("auto", "jax", "numba"),
                    help="hit_curve backend (auto: numba when JAX runs on the CPU, else the JAX scan)")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-shards", action="store_true")
    ap.add_argument("--scaling-workload", default="auto")
    ap.add_argument("--memory-check", action="store_true",
        help="also replay a 1,000,000-request workload (child process)")
    ap.add_argument("--memory-requests", type=int, default=1_000_000)
    ap.add_argument("--memory-check-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_check_child is not None:
        print(json.dumps(memory_check(args.memory_check_child)))
        return 0
    workloads = [] if args.workloads.strip() in ("",
        "none") else [s.strip() for s in args.workloads.split(",") if s.strip()]
    for wname in workloads:
        if wname not in WORKLOADS + ("tiny",):
            ap.error(f"unknown workload {wname!r}")
    cases = tuple(s.strip() for s in args.cases.split(",") if s.strip())
    for cname in cases:
        if cname not in CASES:
            ap.error(f"unknown case {cname!r}; choose from {','.join(CASES)}")
    report = run_bench(
        workloads, quick=args.quick, configs=args.configs, repeats=args.repeats, budget_s=args.budget,
        json_path=args.json, design_requests=args.design_requests, lcs_max_runs=args.lcs_max_runs,
        lcs_workers=args.lcs_workers,
        curve_backend=args.curve_backend,
        cases=cases,
        scaling_workload=None if args.no_scaling else args.scaling_workload,
        shards_workload=None if args.no_shards else "auto",
        memory_requests=args.memory_requests if args.memory_check else None,
    )
    print()
    print(format_table(report))
    if report["scaling"]:
        print("\nscaling:")
        for row in report["scaling"]:
            print(f"  {row['workload']:<11} {row['axis']:<8} {row['size']:>5} {row['method']:<28} "
                  f"{row['project_s']:>9.4f}s  {row['us_per_access_config']:>9.4f} us/access/config")
    if report["shards"]:
        print("\nSHARDS:")
        for row in report["shards"]:
            print(f"  {row['workload']:<11} rate {row['rate']:<5} requests {row['sampled_requests']:>7} "
                  f"sample+curve {row.get('total_s')}s (exact {row['exact_curve_s']}s) max|err| {row['max_abs_error']}")
    if "memory_check" in report:
        print("\nmemory check:", json.dumps(report["memory_check"]))
    print(f"\ntotal {report['total_s']} s, peak RSS {report['peak_rss_mb']} MB"
          + (f"; JSON in {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

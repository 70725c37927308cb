"""Benchmark: the project's engine and hit curves against libCacheSim and the pure-Python reference.

Usage (from the repository root)::

    python -m cacheresearch.bench --quick --json bench.json
    python -m cacheresearch.bench --workloads seed_fleet,mooncake --configs 4096 --lcs-max-runs 64
    python -m cacheresearch.bench --memory-check --workloads none
    bash benchmarks/gpu.sh      # the prepared GPU run (4,096 and 1,000 configurations)

``--quick`` (under 5 minutes on 2 cores) reduces the design scenario to 2,000 requests (case names
say ``@2000req``) and repeats each measurement at most 3 times.

Everything runs in ONE process, on the IDENTICAL block stream for every simulator:

* the project: the exact engine (:func:`~cacheresearch.engine.simulate`, vmapped
  :func:`~cacheresearch.engine.simulate_grid`) and the one-pass exact hit curve
  (:func:`~cacheresearch.mrc.hit_curve`), leaf-first LRU (policy ``lru``), random routing;
* libCacheSim (``libcachesim``, ``LRU``): each replica's block ids in leaf-first order (last block
  of a request first), requests routed by :func:`~cacheresearch.mrc.route_requests` with the same
  PRNG keys as the engine, one cache per replica, dense ids, one oracleGeneral file per replica
  written once outside the timer;
* the pure-Python reference (``tests/reference.py``, when the repository's tests are present),
  timed on one configuration, on a prefix of the workload when the workload is large.

libCacheSim only approximates leaf-first LRU: it looks up and inserts block by block (a request's
own tail can evict its head, and a block after a miss still counts as a hit), while the engine looks
up the whole request first and counts the leading run only. Both hit rates are reported: the block
hit rate (libCacheSim: ``1 - miss ratio``; project: per-request hit blocks / total blocks) and the
project's token hit rate.

Timing: ``time.perf_counter`` around calls that end in ``jax.block_until_ready``. Engine programs are
compiled ahead of time (``jit(...).lower(...).compile()``: that time is ``project_compile_s``);
hit curves compile on their first call (warm-up; compile time = first call minus the best steady
call, about 0 when an earlier case compiled the same shapes or numba's on-disk cache holds the
kernel). The hit curve's backend is ``--curve-backend`` (default ``auto``: numba's compiled loop when
JAX runs on the CPU, the JAX scan on an accelerator); the JSON's ``settings.curve_backend`` names it.
Each measurement is repeated (``--repeats``) within a time budget; ``*_s`` is the best run and
``*_s_median`` the median. ``ratio`` = libCacheSim seconds / project seconds for the same total work;
``ratio_with_compile`` adds the project's compile time. Host preparation (the engine's
:func:`~cacheresearch.engine.compile_stream`, libCacheSim's trace files) is outside both timers and
reported as ``project_prep_s`` / ``libcachesim_prep_s``; the hit curve's host work (routing, the
distance pass, the curve) is inside its timer, except the dense key ids, which the workload caches
after :func:`~cacheresearch.engine.compile_stream` computed them.

``peak_rss_mb`` is the process's peak resident set (``resource.getrusage``) after the case, so it
only grows along the run. ``--memory-check`` replays a generated 1,000,000-request workload through
the engine (one configuration) and the hit curve in a child process, and reports that process's peak.

The JSON file is rewritten after every case, so an interrupted run still leaves its results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import __version__, mrc, synthetic, trace
from .engine import combine_limbs, compile_stream, make_params, simulate, simulate_grid, stack_params
from .workload import Workload

__all__ = [
    "Bench",
    "WorkloadSpec",
    "make_workload",
    "run_bench",
    "machine_info",
    "memory_check",
    "main",
    "CASE_KEYS",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: blocks per engine scan step (a speed knob: wide chunks suit accelerators and long prompts)
ENGINE_CHUNK_BLOCKS = int(os.environ.get("CACHERESEARCH_CHUNK_BLOCKS", "32"))
SHARED_TRACE = Path("..") / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"  # relative to the repo root
FIXTURE_TRACE = Path("tests") / "fixtures" / "mini_mooncake.jsonl"

WORKLOADS = ("seed_fleet", "mooncake", "design")
QUICK_DESIGN_REQUESTS = 2_000
FULL_DESIGN_REQUESTS = 50_000

#: keys every case carries (tests check them)
CASE_KEYS = (
    "name", "workload", "accesses", "configs", "project_s", "project_compile_s", "libcachesim_s",
    "ratio", "ratio_with_compile", "project_hit_rate", "libcachesim_hit_rate", "method", "peak_rss_mb",
)


# ------------------------------------------------------------------------------------- helpers
def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(r / 1024.0 if sys.platform != "darwin" else r / 2**20, 1)


def _ready(x):
    return jax.block_until_ready(x)


def aot(fn, *args, **static):
    """Compile ``fn(*args, **static)`` ahead of time (``static`` are static arguments); returns
    ``(compiled, seconds)``; call ``compiled(*args)``."""
    t = time.perf_counter()
    try:
        exe = jax.jit(fn, static_argnames=tuple(static)).lower(*args, **static).compile()
    except Exception:  # noqa: BLE001 - fall back to a warm-up call (its time then includes one run)
        def exe(*a):
            return fn(*a, **static)

        _ready(exe(*args))
    return exe, time.perf_counter() - t


def curve_backend(requested: str = "auto") -> str:
    """The stack-distance backend :func:`~cacheresearch.mrc.hit_curve` uses for ``requested``."""
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
    the first timed call (for programs compiled ahead of time).
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
        return trace.load_mooncake(shared, block_tokens=512, name="mooncake"), "shared trace " + SHARED_TRACE.as_posix(), ""
    fixture = REPO_ROOT / FIXTURE_TRACE
    note = f"{SHARED_TRACE.as_posix()} is absent"
    if fixture.exists():
        if not quiet:
            print(f"[bench] {note}: using the bundled fixture {FIXTURE_TRACE.as_posix()}", flush=True)
        return trace.load_mooncake(fixture, block_tokens=512, name="mooncake-fixture"), "fixture " + FIXTURE_TRACE.as_posix(), note
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
        return WorkloadSpec("design", w, replicas=8, capacity=65_536, source=f"synthetic.design_workload(n_requests={n})",
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


def hashpower(capacity: int) -> int:
    return max(10, int(math.ceil(math.log2(max(2, int(capacity))))) + 2)


def leaf_first_ids(w: Workload) -> np.ndarray:
    """Dense ids (1-based) of every block, each request's blocks in leaf-first order."""
    _, ids = np.unique(w.keys, return_inverse=True)
    nb = w.n_blocks
    req = np.repeat(np.arange(w.n_requests, dtype=np.int64), nb)
    pos = np.arange(w.total_blocks, dtype=np.int64) - w.offsets[:-1][req]
    leaf = w.offsets[:-1][req] + (nb[req] - 1 - pos)
    return ids.reshape(-1)[leaf].astype(np.uint64) + np.uint64(1)


class LcsStreams:
    """One oracleGeneral file (and reader) per replica for one routing, written once."""

    def __init__(self, lcs, w: Workload, ids_leaf: np.ndarray, replica: np.ndarray, n_replicas: int, tmp: Path, tag: str):
        self.lcs = lcs
        block_rep = np.repeat(np.asarray(replica, dtype=np.int64), w.n_blocks)
        self.lengths: list[int] = []
        self.readers = []
        self.paths = []
        for r in range(n_replicas):
            s = ids_leaf[block_rep == r]
            self.lengths.append(int(s.size))
            if s.size == 0:
                self.readers.append(None)
                continue
            p = tmp / f"{tag}_r{r}.oracleGeneral"
            trace.write_oracle_general(s, p)
            self.paths.append(p)
            self.readers.append(lcs.TraceReader(str(p), lcs.TraceType.ORACLE_GENERAL_TRACE))
        self.total = int(sum(self.lengths))

    def run(self, capacity: int) -> float:
        """Block miss count of one configuration (one LRU cache per replica)."""
        misses = 0.0
        for n, reader in zip(self.lengths, self.readers):
            if reader is None:
                continue
            cache = self.lcs.LRU(cache_size=int(capacity), hashpower=hashpower(capacity))
            miss_ratio, _ = cache.process_trace(reader)
            misses += round(float(miss_ratio) * n)
        return misses


# ------------------------------------------------------------------------------------- the bench
@dataclass
class Bench:
    quick: bool = True
    configs: int = 64
    repeats: int = 3
    budget_s: float = 6.0
    lcs_max_runs: int | None = None  # time at most this many libCacheSim runs of a sweep, scale the rest
    reference_max_blocks: int = 250_000
    json_path: str | None = None
    quiet: bool = False
    curve_backend: str = "auto"  # hit_curve's backend (auto: numba on a CPU JAX backend, else jax)
    report: dict = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory | None = None

    def __post_init__(self):
        if self.configs < 4 or self.configs % 4:
            raise ValueError("--configs must be a positive multiple of 4 (capacities x 2 replica counts x 2 seeds)")
        self.lcs = _import_lcs()
        self._tmp = tempfile.TemporaryDirectory(prefix="cacheresearch-bench-")
        self.tmp = Path(self._tmp.name)
        self.report = {
            "machine": machine_info(self.lcs),
            "settings": {
                "quick": self.quick, "configs": self.configs, "repeats": self.repeats, "budget_s": self.budget_s,
                "lcs_max_runs": self.lcs_max_runs, "reference_max_blocks": self.reference_max_blocks,
                "policy": "lru (leaf-first)", "router": "random",
                "curve_backend": curve_backend(self.curve_backend),
            },
            "workloads": {},
            "cases": [],
            "scaling": [],
            "shards": [],
        }
        self._exact_curves: dict[str, tuple[mrc.HitCurve, float]] = {}
        self._sweep64: dict[str, dict] = {}
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
        self.report["cases"].append(case)
        self.log("  " + format_row(case))
        self.save()
        return case

    def close(self):
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

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

    # single ---------------------------------------------------------------------------------------
    def case_single(self, spec: WorkloadSpec, stream=None) -> dict:
        w, R, C = spec.workload, spec.replicas, spec.capacity
        key = jax.random.PRNGKey(0)
        if stream is None:
            t = time.perf_counter()
            stream = _ready(compile_stream(w, chunk_blocks=ENGINE_CHUNK_BLOCKS))
            self.stream_prep_s[spec.name] = time.perf_counter() - t
        prep = self.stream_prep_s.get(spec.name)
        params = make_params("lru", C, replicas=R, router="random")
        exe, eng_compile = aot(simulate, stream, params, key, max_replicas=R, per_request=True, queue=False)
        eng = measure(lambda: _ready(exe(stream, params, key)), repeats=self.repeats, budget_s=self.budget_s, warmup=False)
        m = eng.value
        eng_tokens = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
        eng_blocks = np.asarray(m.hit_blocks).astype(np.int64)

        cur = measure(
            lambda: self.curve(w, replicas=R, router="random", key=key, max_capacity=C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        hc = cur.value
        cur_blocks = hc.hit_blocks_at(C)
        exact = bool(int(hc.hit_tokens[C]) == eng_tokens and np.array_equal(cur_blocks, eng_blocks))
        if not exact:
            raise AssertionError(f"{spec.name}: hit curve at C={C} ({int(hc.hit_tokens[C])} tokens) != engine ({eng_tokens})")

        # the one-capacity compiled replay (routing included, as in the curve)
        rpl = measure(
            lambda: mrc.lru_replay(w, mrc.route_requests(w, "random", R, key=key), C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        if not np.array_equal(rpl.value, eng_blocks):
            raise AssertionError(f"{spec.name}: lru_replay at C={C} != engine")

        # libCacheSim
        lcs_s = lcs_med = lcs_hit = lcs_prep = None
        rep = np.asarray(m.replica)
        if self.lcs is not None:
            t = time.perf_counter()
            ids_leaf = leaf_first_ids(w)
            streams = LcsStreams(self.lcs, w, ids_leaf, rep, R, self.tmp, f"{spec.name}_single")
            lcs_prep = time.perf_counter() - t
            lt = measure(lambda: streams.run(C), repeats=self.repeats, budget_s=self.budget_s, warmup=False)
            lcs_s, lcs_med = lt.best, lt.median
            lcs_hit = 1.0 - lt.value / max(streams.total, 1)

        # reference (one config, on a prefix when large)
        ref = self.reference(spec, rep, eng_blocks)
        if ref.get("reference_s_per_access"):
            per = ref["reference_s_per_access"]
            ref["reference_slowdown_vs_engine"] = _r(per / (eng.best / max(w.total_blocks, 1)), 4)
            ref["reference_slowdown_vs_curve"] = _r(per / (cur.best / max(w.total_blocks, 1)), 4)
            if lcs_s:
                ref["reference_slowdown_vs_libcachesim"] = _r(per / (lcs_s / max(w.total_blocks, 1)), 4)

        best = min(("engine", eng), ("curve", cur), ("replay", rpl), key=lambda kv: kv[1].best)[0]
        use_engine = best == "engine"
        chosen = {"engine": eng, "curve": cur, "replay": rpl}[best]
        proj_s, proj_med = chosen.best, chosen.median
        proj_compile = eng_compile if use_engine else chosen.compile_estimate
        total_blocks = max(w.total_blocks, 1)
        case = {
            "name": "single",
            "workload": spec.name,
            "accesses": w.total_blocks,
            "configs": 1,
            "project_s": _r(proj_s),
            "project_s_median": _r(proj_med),
            "project_compile_s": _r(proj_compile),
            "project_prep_s": _r(prep) if use_engine else None,
            "libcachesim_s": _r(lcs_s),
            "libcachesim_s_median": _r(lcs_med),
            "libcachesim_prep_s": _r(lcs_prep),
            "ratio": _r(_ratio(lcs_s, proj_s), 4),
            "ratio_with_compile": _r(_ratio(lcs_s, proj_s + proj_compile), 4),
            "project_hit_rate": _r(eng_blocks.sum() / total_blocks),
            "project_token_hit_rate": _r(eng_tokens / max(int(w.input_tokens.sum()), 1)),
            "project_hit_tokens": eng_tokens, "project_hit_blocks": int(eng_blocks.sum()),
            "libcachesim_hit_rate": _r(lcs_hit),
            "method": {"engine": "engine: simulate (per_request=True), AOT-compiled",
                       "curve": f"curve: hit_curve(max_capacity=C, backend={curve_backend(self.curve_backend)}), first call = compile",
                       "replay": "replay: mrc.lru_replay (numba, one capacity), routing included, first call = compile"}[best],
            "replay_s": _r(rpl.best), "replay_ratio": _r(_ratio(lcs_s, rpl.best), 4),
            "engine_s": _r(eng.best), "engine_s_median": _r(eng.median), "engine_compile_s": _r(eng_compile),
            "engine_ratio": _r(_ratio(lcs_s, eng.best), 4), "engine_prep_s": _r(prep),
            "curve_ratio": _r(_ratio(lcs_s, cur.best), 4),
            "curve_s": _r(cur.best), "curve_s_median": _r(cur.median), "curve_compile_s": _r(cur.compile_estimate),
            "curve_first_call_s": _r(cur.first),
            "capacity": C, "replicas": R, "repeats": max(eng.runs, cur.runs),
            "curve_equals_engine": exact,
            **ref,
        }
        self._single[spec.name] = {"engine": eng, "curve": cur}
        return self.add_case(case, spec)

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

    def engine_grid(self, stream, cells, max_replicas: int):
        params = stack_params([make_params("lru", int(c), replicas=int(r), router="random") for c, r, _ in cells])
        keys = jnp.stack([jax.random.PRNGKey(int(s)) for _, _, s in cells])
        exe, comp = aot(simulate_grid, stream, params, keys, max_replicas=max_replicas, per_request=False, queue=False)
        tm = measure(lambda: _ready(exe(stream, params, keys)), repeats=self.repeats, budget_s=self.budget_s, warmup=False)
        m = tm.value
        return tm, comp, combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)

    def case_sweep(self, spec: WorkloadSpec, stream) -> list[dict]:
        w = spec.workload
        N = self.configs
        caps, reps, seeds, cells = self.sweep_grid(spec, N)
        groups = [(r, s) for s in seeds for r in reps]

        # (a) the engine: every configuration in one vmapped call
        eng, eng_comp, eng_tokens = self.engine_grid(stream, cells, max(reps))
        # logged at once, so that a time-limited run keeps the engine's figure
        self.log(f"[bench] {spec.name}: engine, {len(cells)} configurations in one call: {eng.best:.4f} s "
                 f"(compile {eng_comp:.2f} s)")
        # (b) one-pass curves: one per (replicas, seed) routing group, all capacities read off
        def curves():
            return {
                (r, s): self.curve(w, replicas=r, router="random", key=jax.random.PRNGKey(s), max_capacity=int(caps.max()))
                for r, s in groups
            }

        cur = measure(curves, repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        hc = cur.value
        curve_tokens = np.array([int(hc[(r, s)].hit_tokens[c]) for c, r, s in cells], dtype=np.int64)
        thr_sorted = {g: np.sort(hc[g].thresholds) for g in groups}
        proj_block = np.array([np.searchsorted(thr_sorted[(r, s)], c, side="left") for c, r, s in cells]) / max(w.total_blocks, 1)
        proj_token = curve_tokens / max(int(w.input_tokens.sum()), 1)

        exact = bool(np.array_equal(eng_tokens, curve_tokens))
        if not exact:
            bad = int(np.argmax(eng_tokens != curve_tokens))
            raise AssertionError(f"{spec.name}: sweep config {cells[bad]}: engine {eng_tokens[bad]} != curve {curve_tokens[bad]}")

        # libCacheSim: every configuration, one cache per replica
        lcs_s = lcs_med = None
        lcs_hit = np.full(len(cells), np.nan)
        lcs_note = None
        lcs_prep = None
        if self.lcs is not None:
            t = time.perf_counter()
            ids_leaf = leaf_first_ids(w)
            streams = {
                (r, s): LcsStreams(self.lcs, w, ids_leaf, self.routing(spec, r, s), r, self.tmp, f"{spec.name}_sw_r{r}_s{s}")
                for r, s in groups
            }
            lcs_prep = time.perf_counter() - t
            run_idx = np.arange(len(cells))
            if self.lcs_max_runs and len(cells) > self.lcs_max_runs:
                run_idx = np.unique(np.linspace(0, len(cells) - 1, self.lcs_max_runs).round().astype(np.int64))
                lcs_note = f"timed {run_idx.size} of {len(cells)} runs (evenly spaced), time scaled by {len(cells) / run_idx.size:.2f}"

            def lcs_all():
                return [streams[(cells[i][1], cells[i][2])].run(int(cells[i][0])) for i in run_idx]

            lt = measure(lcs_all, repeats=self.repeats, budget_s=self.budget_s, warmup=False)
            scale = len(cells) / run_idx.size
            lcs_s, lcs_med = lt.best * scale, lt.median * scale
            for i, miss in zip(run_idx, lt.value):
                c, r, s = cells[i]
                lcs_hit[i] = 1.0 - miss / max(streams[(r, s)].total, 1)

        per_config = [
            {"capacity": int(c), "replicas": int(r), "seed": int(s), "project_hit_tokens": int(curve_tokens[i]),
             "project_hit_rate": _r(proj_block[i]),
             "project_token_hit_rate": _r(proj_token[i]), "libcachesim_hit_rate": _r(None if np.isnan(lcs_hit[i]) else lcs_hit[i])}
            for i, (c, r, s) in enumerate(cells)
        ]
        have = ~np.isnan(lcs_hit)
        lcs_mean = float(lcs_hit[have].mean()) if have.any() else None
        max_diff = float(np.abs(lcs_hit[have] - proj_block[have]).max()) if have.any() else None
        common = {
            "workload": spec.name, "accesses": w.total_blocks, "configs": len(cells),
            "total_accesses": w.total_blocks * len(cells),
            "libcachesim_s": _r(lcs_s), "libcachesim_s_median": _r(lcs_med), "libcachesim_prep_s": _r(lcs_prep),
            # means over the configurations libCacheSim ran (all, unless --lcs-max-runs)
            "project_hit_rate": _r(proj_block[have].mean() if have.any() else proj_block.mean()),
            "project_token_hit_rate": _r(proj_token[have].mean() if have.any() else proj_token.mean()),
            "libcachesim_hit_rate": _r(lcs_mean), "max_abs_hit_rate_diff": _r(max_diff),
            "grid": {"capacities": [int(c) for c in caps], "replicas": list(reps), "seeds": list(seeds)},
            "engine_equals_curve": exact,
            "per_config": per_config,
        }
        if lcs_note:
            common["libcachesim_note"] = lcs_note
        out = []
        e = {
            "name": f"sweep{N}_engine", **common,
            "project_s": _r(eng.best), "project_s_median": _r(eng.median), "project_compile_s": _r(eng_comp),
            "project_prep_s": _r(self.stream_prep_s.get(spec.name)),
            "ratio": _r(_ratio(lcs_s, eng.best), 4), "ratio_with_compile": _r(_ratio(lcs_s, eng.best + eng_comp), 4),
            "method": f"engine: simulate_grid over {len(cells)} configs in one call (vmap, per_request=False, queue=False: hit rates only), AOT-compiled",
            "repeats": eng.runs,
        }
        out.append(self.add_case(e, spec))
        c = {
            "name": f"sweep{N}_curve", **common,
            "project_s": _r(cur.best), "project_s_median": _r(cur.median), "project_compile_s": _r(cur.compile_estimate),
            "ratio": _r(_ratio(lcs_s, cur.best), 4),
            "ratio_with_compile": _r(_ratio(lcs_s, cur.best + cur.compile_estimate), 4),
            "method": (f"curve: hit_curve (backend={curve_backend(self.curve_backend)}) per (replicas, seed) group "
                       f"({len(groups)} groups), all capacities read off"),
            "repeats": cur.runs, "curve_first_call_s": _r(cur.first),
        }
        out.append(self.add_case(c, spec))
        self._sweep64[spec.name] = {"engine_s": eng.best, "configs": len(cells), "cells": cells, "tokens": eng_tokens}
        return out

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
        # the exact engine at three of the capacities
        pick = caps[[len(caps) // 4, len(caps) // 2, (3 * len(caps)) // 4]]
        cells = [(int(c), 1, 0) for c in pick]
        params = stack_params([make_params("lru", c, replicas=1, router="random") for c, _, _ in cells])
        keys = jnp.stack([key] * len(cells))
        m = _ready(simulate_grid(stream, params, keys, max_replicas=1, per_request=False, queue=False))
        eng_tokens = combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)
        cur_tokens = hc.hit_tokens[pick]
        exact = bool(np.array_equal(eng_tokens, cur_tokens))
        if not exact:
            raise AssertionError(f"{spec.name}: mrc curve {cur_tokens.tolist()} != engine {eng_tokens.tolist()} at {pick.tolist()}")
        lcs_s = lcs_med = lcs_prep = lcs_note = None
        lcs_hit = None
        max_diff = None
        if self.lcs is not None:
            t = time.perf_counter()
            streams = LcsStreams(self.lcs, w, leaf_first_ids(w), np.zeros(w.n_requests, np.int64), 1, self.tmp, f"{spec.name}_mrc")
            lcs_prep = time.perf_counter() - t
            run_idx = np.arange(caps.size)
            if self.lcs_max_runs and caps.size > self.lcs_max_runs:
                run_idx = np.unique(np.linspace(0, caps.size - 1, self.lcs_max_runs).round().astype(np.int64))
                lcs_note = f"timed {run_idx.size} of {caps.size} capacities (evenly spaced), time scaled by {caps.size / run_idx.size:.2f}"
            lt = measure(lambda: [streams.run(int(caps[i])) for i in run_idx], repeats=self.repeats, budget_s=self.budget_s, warmup=False)
            scale = caps.size / run_idx.size
            lcs_s, lcs_med = lt.best * scale, lt.median * scale
            lcs_hit = np.full(caps.size, np.nan)
            lcs_hit[run_idx] = 1.0 - np.asarray(lt.value) / max(streams.total, 1)
            max_diff = float(np.nanmax(np.abs(lcs_hit - proj_block)))
        case = {
            "name": "mrc",
            "workload": spec.name,
            "accesses": w.total_blocks,
            "configs": int(caps.size),
            "project_s": _r(cur.best), "project_s_median": _r(cur.median), "project_compile_s": _r(cur.compile_estimate),
            "curve_first_call_s": _r(cur.first),
            "libcachesim_s": _r(lcs_s), "libcachesim_s_median": _r(lcs_med), "libcachesim_prep_s": _r(lcs_prep),
            "ratio": _r(_ratio(lcs_s, cur.best), 4),
            "ratio_with_compile": _r(_ratio(lcs_s, cur.best + cur.compile_estimate), 4),
            "project_hit_rate": _r(proj_block[~np.isnan(lcs_hit)].mean() if lcs_hit is not None else proj_block.mean()),
            "libcachesim_hit_rate": _r(None if lcs_hit is None else np.nanmean(lcs_hit)),
            "max_abs_hit_rate_diff": _r(max_diff),
            "method": (f"curve: one hit_curve (1 replica, backend={curve_backend(self.curve_backend)}) gives all {ws + 1} capacities 0..working set; "
                       f"libCacheSim: {caps.size} log-spaced capacities; hit rates are means over those capacities"),
            "working_set_blocks": ws,
            "engine_checked_capacities": [int(c) for c in pick],
            "engine_checked_hit_tokens": [int(x) for x in eng_tokens],
            "curve_equals_engine": exact,
            "curve": {
                "capacities": [int(c) for c in caps],
                "project_block_hit_rate": [_r(x) for x in proj_block],
                "project_token_hit_rate": [_r(x) for x in hc.token_hit_rate[caps]],
                "libcachesim_hit_rate": None if lcs_hit is None else [None if np.isnan(x) else _r(x) for x in lcs_hit],
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
            if sub is w and spec.name in self._single:  # measured by the single case
                eng, cur = self._single[spec.name]["engine"], self._single[spec.name]["curve"]
            else:
                s = stream if sub is w else compile_stream(sub, chunk_blocks=ENGINE_CHUNK_BLOCKS)
                params = make_params("lru", C, replicas=R, router="random")
                exe, _ = aot(simulate, s, params, key, max_replicas=R, per_request=True, queue=False)
                eng = measure(lambda: _ready(exe(s, params, key)), repeats=self.repeats, budget_s=self.budget_s, warmup=False)
                cur = measure(lambda: self.curve(sub, replicas=R, router="random", key=key, max_capacity=C),
                              repeats=self.repeats, budget_s=self.budget_s, warmup=True)
            for method, tm in (("engine single", eng), ("curve single", cur)):
                out.append({
                    "workload": spec.name, "axis": "requests", "size": label, "requests": sub.n_requests,
                    "accesses": sub.total_blocks, "configs": 1, "method": method, "project_s": _r(tm.best),
                    "project_s_median": _r(tm.median), "us_per_access_config": _r(1e6 * tm.best / max(sub.total_blocks, 1), 4),
                })
        # configs: a quarter of the sweep vs the whole sweep (same stream, one vmapped call each)
        N = self.configs
        for n in (N // 4, N):
            if n < 4:
                continue
            _, reps, _, cells = self.sweep_grid(spec, n)
            prev = self._sweep64.get(spec.name)
            if prev is not None and prev["configs"] == len(cells) and n == N:
                t_best, t_med = prev["engine_s"], None
            else:
                tm, _, _ = self.engine_grid(stream, cells, max(reps))
                t_best, t_med = tm.best, tm.median
            out.append({
                "workload": spec.name, "axis": "configs", "size": str(len(cells)), "requests": w.n_requests,
                "accesses": w.total_blocks, "configs": len(cells), "method": "engine grid (simulate_grid)",
                "project_s": _r(t_best), "project_s_median": _r(t_med),
                "us_per_access_config": _r(1e6 * t_best / max(w.total_blocks * len(cells), 1), 4),
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
            tm = measure(lambda: self.curve(w, replicas=1, router="random", key=key), repeats=1, budget_s=0, warmup=True)
            exact, exact_s = tm.value, tm.best
        ex = exact.token_hit_rate
        out = []
        for rate in rates:
            t = time.perf_counter()
            sub, factor = mrc.shards_sample(w, rate)
            sample_s = time.perf_counter() - t
            row = {"workload": spec.name, "rate": rate, "sampled_requests": sub.n_requests, "sampled_accesses": sub.total_blocks,
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
        return "-" if x is None else format(x, spec)

    return (f"{c['workload']:<11} {c['name']:<24} {c['accesses']:>10} {c['configs']:>5} "
            f"{f(c['project_s'], '10.4f')} {f(c['project_compile_s'], '8.2f')} {f(c['libcachesim_s'], '10.4f')} "
            f"{f(c['ratio'], '8.3f')} {f(c['ratio_with_compile'], '8.3f')} {f(c['project_hit_rate'], '7.4f')} "
            f"{f(c['libcachesim_hit_rate'], '7.4f')} {f(c.get('peak_rss_mb'), '8.0f')}  {c['method'].split(':')[0]}")


HEADER = (f"{'workload':<11} {'case':<24} {'accesses':>10} {'cfgs':>5} {'project_s':>10} {'compile':>8} "
          f"{'lcs_s':>10} {'ratio':>8} {'r+comp':>8} {'p_hit':>7} {'lcs_hit':>7} {'rss_mb':>8}  method")


def format_table(report: dict) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [format_row(c) for c in report["cases"]]
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
        "versions": {"cacheresearch": __version__, "jax": jax.__version__, "jaxlib": ver("jaxlib"), "numpy": np.__version__,
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


def memory_check(n_requests: int = 1_000_000, *, capacity: int = 20_000, engine_chunk_blocks: int = 32,
                 curve_chunk_blocks: int = 64, backend: str = "auto") -> dict:
    """Replay ``n_requests`` through the engine (one config) and the hit curve; peak RSS after each.

    The chunk sizes default to the engine's and the curve's own defaults (32 and 64 blocks), which pad
    these 4-block requests 8 and 16 times over; smaller chunks lower the peak."""
    out = {"requests": n_requests, "rss_mb_at_start": peak_rss_mb()}
    t = time.perf_counter()
    w = memory_workload(n_requests)
    out["accesses"] = w.total_blocks
    out["build_s"] = _r(time.perf_counter() - t)
    out["peak_rss_mb_after_build"] = peak_rss_mb()
    t = time.perf_counter()
    stream = compile_stream(w, chunk_blocks=engine_chunk_blocks)
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
    out["method"] = (f"engine: simulate(per_request=True), chunk_blocks={engine_chunk_blocks}, capacity "
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
    curve_backend: str = "auto",
    cases=("single", "sweep", "mrc"),
    scaling_workload: str | None = "auto",
    shards_workload: str | None = "auto",
    memory_requests: int | None = None,
    quiet: bool = False,
) -> dict:
    """Run the bench; returns the report (also written to ``json_path`` after every case)."""
    t0 = time.perf_counter()
    b = Bench(
        quick=quick, configs=configs, repeats=repeats or (3 if quick else 5), budget_s=budget_s or (6.0 if quick else 20.0),
        lcs_max_runs=lcs_max_runs, curve_backend=curve_backend, reference_max_blocks=300_000 if quick else 1_000_000, json_path=json_path, quiet=quiet,
    )
    try:
        b.log(f"[bench] jax {jax.__version__} on {jax.default_backend()} {jax.devices()}; libcachesim "
              f"{'missing: its columns stay empty' if b.lcs is None else b.report['machine']['versions']['libcachesim']}")
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
            stream = _ready(compile_stream(spec.workload, chunk_blocks=ENGINE_CHUNK_BLOCKS))
            b.stream_prep_s[name] = time.perf_counter() - t
            b.report["workloads"][name]["compile_stream_s"] = _r(b.stream_prep_s[name])
            streams[name] = stream
            if "single" in cases:
                b.case_single(spec, stream)
            if "sweep" in cases:
                b.case_sweep(spec, stream)
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
    ap.add_argument("--quick", action="store_true", help=f"fewer repeats, design reduced to {QUICK_DESIGN_REQUESTS} requests")
    ap.add_argument("--json", metavar="FILE", help="write the report here (rewritten after every case)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: seed_fleet,mooncake,design (or none)")
    ap.add_argument("--configs", type=int, default=64, help="configurations of the sweep (multiple of 4; default 64)")
    ap.add_argument("--cases", default="single,sweep,mrc", help="comma-separated subset of single,sweep,mrc")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--budget", type=float, default=None, help="seconds of repeats per measurement")
    ap.add_argument("--design-requests", type=int, default=None, help="requests of the design workload")
    ap.add_argument("--lcs-max-runs", type=int, default=None,
                    help="time at most this many libCacheSim runs of a sweep and scale the time (default: all)")
    ap.add_argument("--curve-backend", default="auto", choices=("auto", "jax", "numba"),
                    help="hit_curve backend (auto: numba when JAX runs on the CPU, else the JAX scan)")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-shards", action="store_true")
    ap.add_argument("--scaling-workload", default="auto")
    ap.add_argument("--memory-check", action="store_true", help="also replay a 1,000,000-request workload (child process)")
    ap.add_argument("--memory-requests", type=int, default=1_000_000)
    ap.add_argument("--memory-check-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_check_child is not None:
        print(json.dumps(memory_check(args.memory_check_child)))
        return 0
    workloads = [] if args.workloads.strip() in ("", "none") else [s.strip() for s in args.workloads.split(",") if s.strip()]
    for wname in workloads:
        if wname not in WORKLOADS + ("tiny",):
            ap.error(f"unknown workload {wname!r}")
    report = run_bench(
        workloads, quick=args.quick, configs=args.configs, repeats=args.repeats, budget_s=args.budget,
        json_path=args.json, design_requests=args.design_requests, lcs_max_runs=args.lcs_max_runs,
        curve_backend=args.curve_backend,
        cases=tuple(s.strip() for s in args.cases.split(",") if s.strip()),
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

"""The Bench: settings, the report, libCacheSim's runs and the engine's calls; each case group is a mixin
in its own module."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.analysis import mrc
from cacheresearch.bench.base import CASE_KEYS
from cacheresearch.bench.lcs import LcsPool, LcsResult, LcsStreams, import_lcs, lcs_sequential
from cacheresearch.bench.mrc import CurveCase
from cacheresearch.bench.report import format_row, machine_info
from cacheresearch.bench.single import SingleCase
from cacheresearch.bench.sweep import SweepCase
from cacheresearch.bench.timing import (
    Timing,
    curve_backend,
    measure,
    measure_timed,
    peak_rss_mb,
    ratio_of,
    ready,
    rounded,
    usable_cores,
)
from cacheresearch.bench.workloads import WorkloadSpec
from cacheresearch.core.simulate import simulate, simulate_grid  # the JAX scan
from cacheresearch.engine import combine_limbs, make_params, stack_params
from cacheresearch.workload import Workload


@dataclass
class Bench(SingleCase, SweepCase, CurveCase):
    """One bench run: its settings, its report and libCacheSim's worker pool; the cases come from the mixins."""

    quick: bool = True
    configs: int = 64
    repeats: int = 3
    budget_s: float = 6.0
    lcs_max_runs: int | None = None  # run at most this many libCacheSim configurations of a case, scale the rest
    lcs_workers: int | None = None  # processes of libCacheSim's parallel figure (None: every usable core; 0: none)
    reference_max_blocks: int = 250_000
    #: the plain-Python oracle to time and check on one configuration (``reference_simulate`` of the
    #: repository's ``tests/reference.py``; the CLI's ``--reference FILE``); None: no reference figure
    reference_fn: Callable | None = None
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
        self.lcs = import_lcs()
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
                self.report["settings"]["libcachesim_pool_start_s"] = rounded(self._pool.start_s)
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
        res.parallel_cores_used = ratio_of(last["cpu"], last["wall"])
        res.parallel_balance = ratio_of(statistics.mean(last["busy"]), max(last["busy"])) if last["busy"] else None
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
        out.update({"libcachesim_s": rounded(seq_s), "libcachesim_s_median": rounded(seq_med),
                    "libcachesim_repeats": lr.sequential.runs,
                    "ratio_sequential": rounded(ratio_of(seq_s, proj_s), 4)})
        if lr.parallel is not None:
            par_s, par_med = lr.parallel.best * scale, lr.parallel.median * scale
            out.update({"libcachesim_parallel_s": rounded(par_s), "libcachesim_parallel_s_median": rounded(par_med),
                        "libcachesim_workers": lr.workers, "libcachesim_parallel_repeats": lr.parallel.runs,
                        "libcachesim_parallel_speedup": rounded(ratio_of(seq_s, par_s), 4),
                        "libcachesim_parallel_wall_s": rounded(lr.parallel_wall.best * scale),
                        # the workers' CPU seconds / the batch's wall seconds: the cores they really got
                        "libcachesim_parallel_cores_used": rounded(lr.parallel_cores_used, 3),
                        # mean / max of the workers' timed seconds: 1 when the work was spread evenly
                        "libcachesim_parallel_balance": rounded(lr.parallel_balance, 3)})
        if lr.note:
            out["libcachesim_parallel_note"] = lr.note
        if multi:
            basis, ref = ("libcachesim_parallel_s", par_s) if lr.parallel is not None else (None, None)
        else:
            basis, ref = "libcachesim_s", seq_s
        if ref is not None:
            out.update({"ratio": rounded(ratio_of(ref, proj_s), 4), "ratio_basis": basis,
                        "ratio_with_compile": rounded(ratio_of(ref, proj_s + proj_compile), 4)})
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
            return ready(simulate(stream, params, key, max_replicas=max_replicas, per_request=True, queue=False))

        return measure(call, repeats=self.repeats, budget_s=self.budget_s, warmup=True)

    def engine_grid(self, stream, cells, max_replicas: int, *, router: str = "random", queue: bool = False, **knobs):
        """The public ``simulate_grid`` call over ``cells`` = ``(capacity, replicas, seed)``; first call =
        warm-up. Returns ``(timing, hit tokens per cell, params)``."""
        params = stack_params([make_params("lru", int(c), replicas=int(r), router=router, **knobs) for c, r,
            _ in cells])
        keys = jnp.stack([jax.random.PRNGKey(int(s)) for _, _, s in cells])
        def call():
            return ready(simulate_grid(stream, params, keys, max_replicas=max_replicas, per_request=False,
                queue=queue))

        tm = measure(call, repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        m = tm.value
        return tm, combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo), params

    # single ---------------------------------------------------------------------------------------

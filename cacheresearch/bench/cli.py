"""Benchmark the project against libCacheSim on the same block stream: ``run_bench`` and the command line of
``python -m cacheresearch.bench``."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

import jax

from cacheresearch.bench.base import CASES, QUICK_DESIGN_REQUESTS, WORKLOADS
from cacheresearch.bench.core import Bench
from cacheresearch.bench.memory import memory_check, memory_check_child
from cacheresearch.bench.report import HEADER, format_table
from cacheresearch.bench.timing import peak_rss_mb, ready, rounded
from cacheresearch.bench.workloads import make_workload
from cacheresearch.engine import compile_stream


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
    reference=None,
) -> dict:
    """Run the bench; returns the report (also written to ``json_path`` after every case).

    ``reference``: the plain-Python oracle (``reference_simulate(workload, policy=, capacity_blocks=, replicas=,
    router=, replica_choices=)``) timed and checked on one configuration; None leaves the reference fields empty.
    """
    t0 = time.perf_counter()
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; choose from {CASES}")
    b = Bench(
        quick=quick, configs=configs, repeats=repeats or (3 if quick else 5),
            budget_s=budget_s or (6.0 if quick else 20.0),
        lcs_max_runs=lcs_max_runs, lcs_workers=lcs_workers, curve_backend=curve_backend,
            reference_max_blocks=300_000 if quick else 1_000_000, json_path=json_path, quiet=quiet,
        reference_fn=reference,
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
            info["build_s"] = rounded(time.perf_counter() - t)
            b.log(f"[bench] workload {name}: {info}")
            specs[name] = spec
        b.log(HEADER)
        for name, spec in specs.items():
            t = time.perf_counter()
            stream = ready(compile_stream(spec.workload))
            b.stream_prep_s[name] = time.perf_counter() - t
            b.report["workloads"][name]["compile_stream_s"] = rounded(b.stream_prep_s[name])
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
            b.report["memory_check"] = memory_check_child(memory_requests)
            b.log(f"  memory check: {b.report['memory_check']}")
        b.report["total_s"] = round(time.perf_counter() - t0, 2)
        b.report["peak_rss_mb"] = peak_rss_mb()
        b.save()
        return b.report
    finally:
        b.close()


def load_reference(path: str):
    """``reference_simulate`` from the Python file at ``path`` (a file the user names; the package never
    reaches into the repository's tests on its own)."""
    if not Path(path).is_file():
        raise SystemExit(f"--reference {path}: no such file")
    names = runpy.run_path(path)
    if "reference_simulate" not in names:
        raise SystemExit(f"--reference {path}: the file defines no reference_simulate")
    return names["reference_simulate"]


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
    ap.add_argument("--reference", metavar="FILE", default=None,
                    help="a Python file defining reference_simulate (the repository's tests/reference.py) to time "
                         "and check on one configuration; default: none")
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
        reference=load_reference(args.reference) if args.reference else None,
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

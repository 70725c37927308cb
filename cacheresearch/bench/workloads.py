"""The bench's workloads (seed fleet, Mooncake, design, tiny) and its capacity grids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cacheresearch.bench.base import (
    FIXTURE_TRACE,
    FULL_DESIGN_REQUESTS,
    QUICK_DESIGN_REQUESTS,
    REPO_ROOT,
    SHARED_TRACE,
    WORKLOADS,
)
from cacheresearch.workload import Workload, synthetic, trace


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

"""The bench's constants: workloads, case groups, project paths and the keys every case carries."""

from __future__ import annotations

from pathlib import Path

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

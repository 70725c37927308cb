"""Shared test settings.

Each test module's compiled JAX programs are released when the module ends: a whole-suite process
otherwise keeps every executable it ever compiled (memory grew past 4.5 GB, and XLA's compiler
crashed late in the session once it held that many)."""

from __future__ import annotations

import gc
import getpass
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest

# JAX's persistent compilation cache, shared by the xdist workers and kept between runs: a module's programs are
# released when it ends (below), and a later module or the other worker that compiles the same program (same HLO,
# same flags, same jax version) loads it instead of compiling it again. Tracing still runs, so tests that count
# traces or programs see what they saw before. CACHERESEARCH_TEST_JAX_CACHE names another folder; "off" disables it.
_JAX_CACHE = os.environ.get("CACHERESEARCH_TEST_JAX_CACHE") or os.path.join(
    tempfile.gettempdir(), f"cacheresearch-test-jax-cache-{getpass.getuser()}")
# XLA's LLVM backend at optimisation level 0 for the tests (set before the backend starts, so the test processes
# and the sweeps they start inherit it): compiling, not running, is most of a JAX test's time on a fresh checkout
# (a vllm replica program: 51 -> 39 s for one test, cache off), and the level changes no result (no fast-math:
# integers and IEEE floats come out the same). CACHERESEARCH_TEST_XLA_OPT=default keeps XLA's own level.
if os.environ.get("CACHERESEARCH_TEST_XLA_OPT") != "default" and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
if _JAX_CACHE != "off":
    jax.config.update("jax_compilation_cache_dir", _JAX_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

#: parametrized cases that run only under ``-m slow`` (their cheaper siblings stay in the default suite)
SLOW_CASES = {
    "test_routing_experiments.py::test_dataset_has_the_routing_metrics_and_a_figure[llmd_blog]",
    "test_routing_experiments.py::test_dataset_has_the_routing_metrics_and_a_figure[hot_tenant]",
    "test_launchers.py::test_two_part_multirun_equals_single_process[joblib]",
    "test_gie_scorers.py::test_vllm_replica_with_gie_equals_reference[2-precise]",
    "test_notebooks.py::test_notebook_runs[routing.py]",
    "test_engine.py::test_grid_equals_single_runs[False]",
    "test_routing_experiments.py::test_latency_grows_with_load_and_copies_follow_the_router[hot_tenant]",
    "test_routing_experiments.py::test_latency_grows_with_load_and_copies_follow_the_router[llmd_blog]",
    "test_launchers.py::test_two_part_multirun_equals_single_process[submitit_local]",
    "test_notebooks.py::test_notebook_runs[seed_fleet.py]",
    "test_chunks.py::test_study_kill_and_resume_is_identical",
    # a JAX per-block program (test_grid_equals_the_numba_kernels stays)
    "test_blocks_jax.py::test_cache_routers_and_views_equal_the_numba_backend",
    # the fit's longest checks (their siblings in test_fit_shapes.py stay)
    "test_fit_shapes.py::test_predictive_check_falls_back_and_says_why",
    "test_fit_shapes.py::test_bailian_format_service_holds",
}


#: the longest test files (seconds of their longest tests, a 2-core run of the default suite from a fresh checkout),
#: sent to the two xdist workers first
#: (``--dist loadfile --no-loadscope-reorder``): longest-first keeps one long file from running alone at the end.
#: A scheduling hint only: a file missing here runs after these, in collection order.
LONG_FILES = {
    "test_blocks_jax.py": 50,
    "test_engine.py": 97, "test_fit_shapes.py": 40, "test_fleet.py": 78, "test_bench.py": 73, "test_ttl_trace.py": 66,
    "test_batch.py": 63, "test_routing_experiments.py": 57, "test_replay.py": 41, "test_chunks.py": 41,
    "test_fit_hard.py": 40, "test_fit.py": 34, "test_sweep.py": 27, "test_libcachesim_parity.py": 25,
    "test_numba_vllm.py": 23, "test_analytic.py": 23, "test_keys.py": 8, "test_compatibility.py": 45,
    "test_tiers.py": 20, "test_numba_blocks.py": 25, "test_tiers_vllm.py": 30, "test_tiers_fleet.py": 30,
}


def pytest_configure(config):
    """Before the xdist workers start, compile the numba kernels into numba's on-disk cache, the two parts in
    two processes at once (about 90 s each on a fresh checkout, a few seconds when the cache is warm). Without it
    both workers compile the same kernels at once when their first files need them, and the compile (not the
    tests) is most of a fresh checkout's suite. CACHERESEARCH_TEST_WARM_NUMBA=0 skips it."""
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    if os.environ.get("CACHERESEARCH_TEST_WARM_NUMBA") == "0":
        return
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        return
    script = Path(__file__).with_name("_warm_numba.py")
    procs = [subprocess.Popen([sys.executable, str(script), part], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for part in ("vllm", "cache")]
    for part, proc in zip(("vllm", "cache"), procs, strict=True):
        out, _ = proc.communicate()
        if proc.returncode:  # the tests that need the kernel then compile it themselves and report any error
            sys.stderr.write(f"warming numba's {part} kernels failed (rc {proc.returncode}):\n{out[-2000:]}\n")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("/")[-1] in SLOW_CASES:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: -LONG_FILES.get(item.path.name, 0))  # stable: a file's tests keep their order


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    jax.clear_caches()
    gc.collect()

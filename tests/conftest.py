"""Shared test settings.

Each test module's compiled JAX programs are released when the module ends: a whole-suite process
otherwise keeps every executable it ever compiled (memory grew past 4.5 GB, and XLA's compiler
crashed late in the session once it held that many)."""

from __future__ import annotations

import gc
import getpass
import os
import tempfile

import jax
import pytest

# JAX's persistent compilation cache, shared by the xdist workers and kept between runs: a module's programs are
# released when it ends (below), and a later module or the other worker that compiles the same program (same HLO,
# same flags, same jax version) loads it instead of compiling it again. Tracing still runs, so tests that count
# traces or programs see what they saw before. CACHERESEARCH_TEST_JAX_CACHE names another folder; "off" disables it.
_JAX_CACHE = os.environ.get("CACHERESEARCH_TEST_JAX_CACHE") or os.path.join(
    tempfile.gettempdir(), f"cacheresearch-test-jax-cache-{getpass.getuser()}")
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
}


#: the longest test files (seconds, a 2-core run of the default suite), sent to the two xdist workers first
#: (``--dist loadfile --no-loadscope-reorder``): longest-first keeps one long file from running alone at the end.
#: A scheduling hint only: a file missing here runs after these, in collection order.
LONG_FILES = {
    "test_engine.py": 112, "test_chunks.py": 104, "test_numba_vllm.py": 75, "test_libcachesim_parity.py": 61,
    "test_bench.py": 58, "test_routing_experiments.py": 55, "test_batch.py": 55, "test_sweep.py": 53,
    "test_ttl_trace.py": 49, "test_fleet.py": 43, "test_fit.py": 43, "test_replay.py": 36, "test_keys.py": 19,
    "test_synthetic.py": 21, "test_analytic.py": 18,
}


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

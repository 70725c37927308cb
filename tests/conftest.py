"""Shared test settings.

Each test module's compiled JAX programs are released when the module ends: a whole-suite process
otherwise keeps every executable it ever compiled (memory grew past 4.5 GB, and XLA's compiler
crashed late in the session once it held that many)."""

from __future__ import annotations

import gc

import jax
import pytest

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
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("/")[-1] in SLOW_CASES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    jax.clear_caches()
    gc.collect()

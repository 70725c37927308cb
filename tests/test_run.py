"""``simulate_cells``: grids grouped by stream and state shape, chunked to fit memory, never copied.

Results equal one ``simulate`` call per cell (in cell order), whatever the grouping and chunking; a
grid that cannot fit is refused before it runs, with the estimate in the message.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_engine import assert_same_metrics

import cacheresearch.core.run as run_mod
from cacheresearch.core.run import MemoryError_, simulate_cells
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.workload.synthetic import tenant_workload

FIELDS_PER_CELL = ("hit_tokens_hi", "hit_tokens_lo", "requests_hit", "occupancy", "max_occupancy",
                   "ttft_p50_ms", "ttft_p99_ms", "busy_ms", "queue_overflow")
FLOATS = ("token_hit_rate", "prefix_copies", "overflow_share", "ttft_mean_ms", "utilisation", "load_imbalance")


def same(a, b):
    for f in FIELDS_PER_CELL:
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    for f in FLOATS:  # divided on the host from exact sums (core.simulate.finalize): bitwise too
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)


@pytest.fixture(scope="module")
def cells():
    ws = [tenant_workload(n_tenants=6, prefix_tokens=64, users_per_tenant=2, user_tokens=16, query_tokens=8,
                          rate_per_s=r, duration_s=4.0, block_tokens=4, output_tokens=8, seed=s)
          for r, s in ((5, 0), (9, 1), (3, 2))]
    streams = [compile_stream(w, stateful_singletons=True) for w in ws]
    configs = [
        dict(policy="lru", capacity_blocks=40, replicas=3, router="random"),
        dict(policy="lru_plain", capacity_blocks=25, replicas=2, router="cache_aware", view="approximate",
             index_capacity=30),
        dict(policy="lfu_perfect", capacity_blocks=30, replicas=3, router="kv_cost"),
        dict(policy="length_aware", capacity_blocks=20, replicas=2, router="least_loaded"),
        dict(policy="ttl_refresh", ttl_s=0.5, replicas=3, router="weighted_scorers", view="precise"),
    ]
    # every stream with every config, in a scrambled cell order, plus a repeated cell
    order = [(s, c) for c in range(len(configs)) for s in range(len(streams))]
    rng = np.random.default_rng(0)
    order = [order[i] for i in rng.permutation(len(order))] + [order[0]]
    params = [make_params(prefix_blocks=16, **configs[c]) for _, c in order]
    stream_of = np.asarray([s for s, _ in order])
    seeds = np.arange(len(order), dtype=np.uint32) % 3
    return streams, stream_of, params, seeds


# the JAX runner's grouping and chunking (backend="jax"; the numba backend's equality is tests/test_replay.py)
OPTS = dict(max_replicas=3, match=True, max_instances=1, queue_slots=64)


def single(streams, stream_of, params, seeds, g):
    return simulate(streams[stream_of[g]], params[g], jax.random.key(int(seeds[g])), per_request=False,
                    routers_compiled=None, **OPTS)


@pytest.fixture(scope="module")
def full_run(cells):
    streams, stream_of, params, seeds = cells
    return simulate_cells(streams, stream_of, params, seeds, backend="jax", **OPTS)


@pytest.mark.slow  # long; see README's slow checks
def test_cells_equal_single_runs_in_cell_order(cells, full_run):
    streams, stream_of, params, seeds = cells
    m, plan = full_run
    assert plan.n_cells == len(params) and plan.n_streams == 3
    # one program per needed state shape: approximate-index rows and priority fields only where needed
    shapes = sorted((g.index, g.stale) for g in plan.groups)
    assert (True, False) in shapes and len(plan.groups) == 3
    # one cell of each configuration (each on some stream, scrambled order) plus the repeated cell
    picked = {}
    for g, p in enumerate(params):
        picked.setdefault((int(p.policy), int(p.router)), g)
    for g in sorted(picked.values()) + [len(params) - 1]:
        want = single(streams, stream_of, params, seeds, g)
        got = jax.tree.map(lambda x: x[g], m)
        assert_same_metrics(got, want, f"cell {g}")


@pytest.mark.slow  # long; see README's slow checks
def test_cells_chunk_to_fit_memory_and_refuse_what_cannot(cells, full_run, monkeypatch):
    streams, stream_of, params, seeds = cells
    full, plan = full_run
    biggest = max(plan.groups, key=lambda g: g.memory_bytes)
    assert biggest.memory_bytes > 0 and biggest.calls == 1
    # a machine with 70% of that program's memory (the budget is 80% of what is available)
    monkeypatch.setattr(run_mod, "available_memory_bytes", lambda: int(biggest.memory_bytes * 0.7 / 0.8))
    lines = []
    small, plan2 = simulate_cells(streams, stream_of, params, seeds, log=lines.append, backend="jax", **OPTS)
    assert plan2.calls > plan.calls
    assert all(g.memory_bytes <= int(biggest.memory_bytes * 0.7) or g.per_stream == 1 for g in plan2.groups)
    assert lines[0].startswith("plan: ") and "memory estimate" in lines[0]
    same(small, full)
    monkeypatch.setattr(run_mod, "available_memory_bytes", lambda: 1)
    with pytest.raises(MemoryError_, match="MiB"):
        simulate_cells(streams, stream_of, params, seeds, backend="jax", **OPTS)


@pytest.mark.slow  # long; see README's slow checks
def test_max_batch_bounds_configurations_per_call(cells, full_run):
    streams, stream_of, params, seeds = cells
    full, _ = full_run
    m, plan = simulate_cells(streams, stream_of, params, seeds, max_batch=3, backend="jax", **OPTS)
    assert all(len(g.streams) * g.per_stream <= max(3, len(g.streams)) for g in plan.groups)
    same(m, full)

"""The numba backend of libCacheSim's per-block policies on the fcfs replica (backends/numba_blocks.py): every router
it compiles, on the precise, stale and approximate views, against ``tests/reference_fleet.py`` (whose caches are
``tests/reference_blocks.py``'s oracles) request by request; and against the JAX scan field by field on a tenant
grid; ``backend=auto`` picks it on a CPU host and ``backend=numba`` refuses what it does not model in one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fleet import reference_fleet
from test_engine import HYP, N_MAX, R_MAX, tree_workloads
from test_fleet import assert_fleet_equal, knob_sets, with_outputs

from cacheresearch.cache.policies import BLOCK_POLICY_IDS
from cacheresearch.core.run import BackendError, simulate_cells
from cacheresearch.engine import compile_stream, make_params, request_bits
from cacheresearch.routers import CACHE_ROUTERS
from cacheresearch.routers import dispatch as rdispatch
from cacheresearch.workload.synthetic import tenant_workload

ROUTERS = sorted(rdispatch.codes())  # every router with a numba rule


def numba_and_reference(w, policy, kw, replicas, router, seed):
    cap = kw.pop("capacity")
    kw.pop("ttl_ms", None)
    kw["kv_pressure"] = False  # the oracles hold a fixed capacity
    kw["temperature"] = 0.0  # kv_cost sampling at a temperature is the JAX engine's (float32 softmax)
    p = make_params(policy, capacity_blocks=cap, replicas=replicas, router=router, **kw)
    m, _ = simulate_cells([compile_stream(w, block_ids=True)], np.zeros(1, np.int64), [p], np.asarray([seed]),
                          max_replicas=R_MAX, per_request=True, backend="numba", max_instances=3,
                          match=True, queue_slots=N_MAX + 1)
    m = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], m)
    n = w.n_requests
    bits = np.asarray(request_bits(jax.random.key(seed), n + 1))[:n]
    ref = reference_fleet(w, policy=policy, replicas=replicas, router=router, bits=bits, capacity_blocks=cap, **kw)
    return m, ref


@settings(HYP, max_examples=40)
@given(w=tree_workloads(), data=st.data(), router=st.sampled_from(ROUTERS), knobs=knob_sets,
       replicas=st.integers(1, R_MAX), seed=st.integers(0, 3))
def test_every_router_and_view_matches_reference(w, data, router, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(BLOCK_POLICY_IDS))
    kw = dict(knobs, capacity=data.draw(st.one_of(st.integers(0, 12), st.integers(10, 40))))
    if router not in CACHE_ROUTERS:  # a view is what a cache-reading router sees: the others keep no index
        kw["view"] = "precise"
    m, ref = numba_and_reference(w, policy, kw, replicas, router, seed)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))


@settings(HYP, max_examples=30)
@given(w=tree_workloads(), data=st.data(), router=st.sampled_from(["cache_aware", "preble_e2", "weighted_scorers",
                                                                 "kv_cost", "gie"]),
       knobs=knob_sets, replicas=st.integers(2, R_MAX))
def test_stale_and_approximate_views(w, data, router, knobs, replicas):
    """Small lags and indexes: syncs (the as-of-sync copy) and index evictions happen often."""
    w = with_outputs(w, [0] * w.n_requests, data.draw(st.sampled_from([1, 3])))
    knobs = dict(knobs, view=data.draw(st.sampled_from(["stale", "approximate"])),
                 stale_lag_ms=data.draw(st.integers(0, 8)), index_capacity=data.draw(st.integers(0, 10)))
    policy = data.draw(st.sampled_from(BLOCK_POLICY_IDS))
    m, ref = numba_and_reference(w, policy, dict(knobs, capacity=data.draw(st.integers(0, 20))), replicas, router, 0)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))


@settings(HYP, max_examples=15)
@given(w=tree_workloads(), data=st.data(), router=st.sampled_from(ROUTERS), knobs=knob_sets,
       replicas=st.integers(1, R_MAX))
def test_configurations_sharing_a_thread_match_reference(w, data, router, knobs, replicas):
    """Many configurations in one call: a thread reuses its block lists from one configuration to the next
    (cleared between them), so a policy's state left behind (a frequency, a visited bit) would change the
    next one's hits. Each equals its own reference."""
    w = with_outputs(w, [0] * w.n_requests, 1)
    pols = data.draw(st.lists(st.sampled_from(BLOCK_POLICY_IDS), min_size=6, max_size=8))
    caps = data.draw(st.lists(st.integers(1, 12), min_size=len(pols), max_size=len(pols)))
    kw = dict(knobs, kv_pressure=False, temperature=0.0)
    kw.pop("ttl_ms", None)
    if router not in CACHE_ROUTERS:
        kw["view"] = "precise"
    ps = [make_params(p, capacity_blocks=c, replicas=replicas, router=router, **kw) for p, c in zip(pols, caps)]
    m, _ = simulate_cells([compile_stream(w, block_ids=True)], np.zeros(len(ps), np.int64), ps,
                          np.zeros(len(ps), np.int64), max_replicas=R_MAX, per_request=True, backend="numba",
                          match=True, queue_slots=N_MAX + 1)
    bits = np.asarray(request_bits(jax.random.key(0), w.n_requests + 1))[:w.n_requests]
    for g, (p, c) in enumerate(zip(pols, caps)):
        ref = reference_fleet(w, policy=p, replicas=replicas, router=router, bits=bits, capacity_blocks=c, **kw)
        assert_fleet_equal(w, jax.tree_util.tree_map(lambda x, g=g: np.asarray(x)[g], m), ref, (router, p, c, g))


@pytest.fixture(scope="module")
def tenants():
    return tenant_workload(n_tenants=6, prefix_tokens=160, users_per_tenant=3, user_tokens=64, query_tokens=32,
                           output_tokens=8, rate_per_s=5, duration_s=20, block_tokens=16, seed=1, tenant_law="zipf")


@pytest.mark.slow  # about a minute (five JAX programs); both backends equal the reference in the default suite
def test_equals_the_jax_scan_on_a_grid(tenants):
    """Every per-block policy x cache-reading router x view in one call per backend: every Metrics field equal."""
    ps = [make_params(pol, capacity_blocks=20, replicas=3, router=rt, view=vw, stale_lag_ms=500, index_capacity=30,
                      prefill_tps=2000, decode_us_per_token=250)
          for pol in BLOCK_POLICY_IDS for rt, vw in (("cache_aware", "precise"), ("preble_e2", "stale"),
                                                     ("kv_cost", "approximate"), ("least_loaded", "precise"))]
    s = [compile_stream(tenants, block_ids=True)]
    args = (s, np.zeros(len(ps), np.int64), ps, np.arange(len(ps)))
    a, _ = simulate_cells(*args, max_replicas=3, per_request=True, backend="numba")
    b, _ = simulate_cells(*args, max_replicas=3, per_request=True, backend="jax")
    for f in a._fields:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, f
            continue
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f)
    assert int(np.asarray(a.hit_blocks).sum()) > 0


def test_auto_picks_numba_and_numba_refuses_in_one_line(tenants):
    s = [compile_stream(tenants, block_ids=True)]
    p = make_params("sieve", capacity_blocks=20, replicas=2, router="cache_aware")
    _, plan = simulate_cells(s, np.zeros(1, np.int64), [p], np.zeros(1), max_replicas=2, backend="auto")
    assert "numba" in str(plan)
    bad = make_params("arc", capacity_blocks=20, replicas=2, router="kv_cost", temperature=0.5)
    with pytest.raises(BackendError) as e:
        simulate_cells(s, np.zeros(1, np.int64), [bad], np.zeros(1), max_replicas=2, backend="numba")
    assert "\n" not in str(e.value) and "temperature" in str(e.value)

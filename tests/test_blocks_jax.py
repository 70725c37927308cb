"""libCacheSim's per-block policies in the JAX scan (cacheresearch/cache/blocks.py) composed with every router,
view, router-instance setting and the fcfs queue: the engine against ``tests/reference_fleet.py`` (whose caches
are then ``tests/reference_blocks.py``'s oracles, one ``get`` per block, leaf-first), request by request; and
against the numba kernels (backends/numba_policies.py, equal to libCacheSim access for access) on a tenant
workload."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fleet import reference_fleet
from test_engine import HYP, N_MAX, R_MAX, padded_stream, tree_workloads
from test_fleet import assert_fleet_equal, knob_sets, with_outputs

from cacheresearch.backends.numba_policies import block_replay_grid
from cacheresearch.cache.blocks import JAX_RULES
from cacheresearch.cache.policies import BLOCK_POLICY_IDS
from cacheresearch.core.run import simulate_cells
from cacheresearch.core.simulate import simulate, simulate_grid  # the JAX scan
from cacheresearch.engine import compile_stream, make_params, request_bits, stack_params
from cacheresearch.routers import CACHE_ROUTERS, REGISTRY
from cacheresearch.workload.synthetic import tenant_workload

JAXED = tuple(p for p in BLOCK_POLICY_IDS if p in JAX_RULES)  # the per-block policies with a JAX rule
ROUTERS = tuple(r.name for r in REGISTRY.routers() if r.rule is not None)  # the routers with a JAX rule
OPTS = dict(max_replicas=R_MAX, max_instances=3, queue_slots=N_MAX + 1, match=True, index=True, stale=True,
            routers_compiled=tuple(ROUTERS))  # one program per policy: every router and view

def engine_and_reference(w, policy, kw, replicas, router, seed):
    stream = padded_stream(w, 4)
    cap = kw.pop("capacity")
    kw.pop("ttl_ms", None)
    kw["kv_pressure"] = False  # the oracles hold a fixed capacity
    p = make_params(policy, capacity_blocks=cap, replicas=replicas, router=router, **kw)
    key = jax.random.key(seed)
    m = simulate(stream, p, key, per_request=True, blocks=(policy,), **OPTS)
    bits = np.asarray(request_bits(key, stream.arrival_ms.shape[0]))[: w.n_requests]
    ref = reference_fleet(w, policy=policy, replicas=replicas, router=router, bits=bits, capacity_blocks=cap, **kw)
    return m, ref


@pytest.mark.slow  # the numba backend runs the same check against the same reference (test_numba_blocks.py)
@settings(HYP, max_examples=25)
@given(w=tree_workloads(), data=st.data(), router=st.sampled_from(sorted(ROUTERS)), knobs=knob_sets,
       replicas=st.integers(1, R_MAX), seed=st.integers(0, 3))
def test_every_router_and_view_on_block_policies_matches_reference(w, data, router, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(JAXED))
    kw = dict(knobs, capacity=data.draw(st.one_of(st.integers(0, 12), st.integers(10, 40))))
    m, ref = engine_and_reference(w, policy, kw, replicas, router, seed)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))
    np.testing.assert_array_equal(np.asarray(m.max_occupancy)[:replicas], ref["max_occupancy"])


@pytest.mark.slow  # likewise (test_numba_blocks.py's views test)
@settings(HYP, max_examples=15)
@given(w=tree_workloads(), data=st.data(), router=st.sampled_from(list(CACHE_ROUTERS)), knobs=knob_sets,
       replicas=st.integers(2, R_MAX))
def test_stale_and_approximate_views_on_block_policies(w, data, router, knobs, replicas):
    """Small lags and indexes: syncs (the as-of-sync copy) and index evictions happen often."""
    w = with_outputs(w, [0] * w.n_requests, data.draw(st.sampled_from([1, 3])))
    knobs = dict(knobs, view=data.draw(st.sampled_from(["stale", "approximate"])),
                 stale_lag_ms=data.draw(st.integers(0, 8)), index_capacity=data.draw(st.integers(0, 10)),
                 temperature=0.0)
    policy = data.draw(st.sampled_from(JAXED))
    m, ref = engine_and_reference(w, policy, dict(knobs, capacity=data.draw(st.integers(0, 20))), replicas, router, 0)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))


@pytest.fixture(scope="module")
def tenants():
    return tenant_workload(n_tenants=6, prefix_tokens=160, users_per_tenant=3, user_tokens=64, query_tokens=32,
                           output_tokens=8, rate_per_s=5, duration_s=30, block_tokens=16, seed=1, tenant_law="zipf")


def test_grid_equals_the_numba_kernels(tenants):
    """A grid of every per-block policy x capacity x replicas in one call equals libCacheSim's kernels."""
    w = tenants
    ps = [make_params(pol, capacity_blocks=c, replicas=r, router=rt, s3fifo_small_pm=pm)
          for pol in JAXED for c in (5, 20, 60) for r in (1, 3) for rt in ("round_robin", "prefix_hash")
          for pm in ((100, 250) if pol == "s3fifo" else (100,))]
    keys = jax.vmap(jax.random.key)(np.arange(len(ps)))
    m = simulate_grid(compile_stream(w), stack_params(ps), keys, max_replicas=4, per_request=True, queue=False)
    ref = block_replay_grid(w, ps, keys, max_replicas=4)
    np.testing.assert_array_equal(np.asarray(m.hit_blocks), ref.hit_blocks)
    np.testing.assert_array_equal(np.asarray(m.occupancy), ref.occupancy)
    np.testing.assert_array_equal(np.asarray(m.max_occupancy), ref.max_occupancy)
    np.testing.assert_array_equal(np.asarray(m.requests_per_replica), ref.requests_per_replica)
    assert int(ref.hit_blocks.sum()) > 0


def test_s3fifo_sizes_follow_the_double_rule(tenants):
    """libCacheSim sizes S3FIFO's queues as int(C * ratio), a double product: at C=100 and a small ratio of 0.29
    that is 28, not 29 (floor(C * 290 / 1000)); the scan reads the sizes make_params derived on the host and
    equals the kernels where the integer rule would not."""
    assert (100 * (290 / 1000), int(100 * (290 / 1000))) == (28.999999999999996, 28)
    ps = [make_params("s3fifo", capacity_blocks=c, s3fifo_small_pm=pm, s3fifo_ghost_pm=g)
          for c, pm, g in ((100, 290, 580), (50, 580, 900), (180, 350, 700))]
    assert [(int(p.s3fifo_small), int(p.s3fifo_ghost)) for p in ps] == [(28, 57), (28, 45), (62, 125)]
    keys = jax.vmap(jax.random.key)(np.arange(len(ps)))
    m = simulate_grid(compile_stream(tenants), stack_params(ps), keys, max_replicas=1, per_request=True, queue=False)
    ref = block_replay_grid(tenants, ps, keys, max_replicas=1)
    np.testing.assert_array_equal(np.asarray(m.hit_blocks), ref.hit_blocks)


def test_cache_routers_and_views_equal_the_numba_backend(tenants):
    """The scan with the load- and cache-reading routers on every view (one JAX program, ``-m slow`` with the
    hypothesis runs): s3fifo x four router / view pairs, every Metrics field equal to the numba backend, which
    equals the fleet reference under hypothesis in the default suite (test_numba_blocks.py)."""
    ps = [make_params("s3fifo", capacity_blocks=20, replicas=3, router=rt, view=vw, stale_lag_ms=500,
                      index_capacity=30, prefill_tps=2000, decode_us_per_token=250)
          for rt, vw in (("cache_aware", "precise"), ("preble_e2", "stale"), ("kv_cost", "approximate"),
                         ("least_loaded", "precise"))]
    s = [compile_stream(tenants, block_ids=True)]
    args = (s, np.zeros(len(ps), np.int64), ps, np.arange(len(ps)))
    a, _ = simulate_cells(*args, max_replicas=3, per_request=True, backend="numba")
    b, _ = simulate_cells(*args, max_replicas=3, per_request=True, backend="jax")
    for f in a._fields:
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    assert int(np.asarray(a.hit_blocks).sum()) > 0

"""The numba backend (``cacheresearch.backends.numba_cache``) equals the JAX engine, request by request: directly
(``replay_grid``) and as a backend of the grid runner (``core/run.py`` ``backend=``), every metric field."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import FIXTURE, HYP, L_MAX, N_MAX, R_MAX, padded_stream, tree_workloads
from test_stream import long_run_workloads

from cacheresearch.backends.numba_cache import replay_grid
from cacheresearch.core import run
from cacheresearch.core.run import BackendError, simulate_cells
from cacheresearch.core.simulate import simulate_grid  # the JAX scan
from cacheresearch.engine import combine_limbs, compile_stream, make_params, stack_params
from cacheresearch.metrics.core import Metrics
from cacheresearch.workload.trace import load_mooncake

CONFIGS = st.lists(st.tuples(st.sampled_from(["lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded"]),
                             st.integers(0, 300), st.integers(0, 40), st.integers(1, R_MAX),
                             st.sampled_from(["random", "round_robin", "prefix_hash"]), st.integers(1, 6)),
                   min_size=1, max_size=4)


def params_of(c):
    policy, cap, ttl_ms, R, router, pb = c
    kw = {}
    if policy in ("lru", "lru_plain"):
        kw["capacity_blocks"] = cap
    if policy.startswith("ttl"):
        kw["ttl_s"] = ttl_ms / 1000
    return make_params(policy, replicas=R, router=router, prefix_blocks=pb, **kw)


def assert_equal_to_engine(w, configs, seed=0):
    P = [params_of(c) for c in configs]
    keys = jax.vmap(jax.random.key)(np.arange(len(P)) + seed)
    got = replay_grid(w, P, keys, max_replicas=R_MAX)
    want = simulate_grid(compile_stream(w), stack_params(P), keys, max_replicas=R_MAX, per_request=True, queue=False)
    n = w.n_requests
    np.testing.assert_array_equal(got.replica, np.asarray(want.replica)[:, :n])
    np.testing.assert_array_equal(got.hit_blocks, np.asarray(want.hit_blocks)[:, :n])
    np.testing.assert_array_equal(got.hit_tokens, combine_limbs(want.hit_tokens_hi, want.hit_tokens_lo))
    np.testing.assert_array_equal(got.requests_hit, np.asarray(want.requests_hit))
    for f in ("occupancy", "max_occupancy", "requests_per_replica"):
        np.testing.assert_array_equal(getattr(got, f), np.asarray(getattr(want, f)), err_msg=f)
    np.testing.assert_allclose(got.token_hit_rate, np.asarray(want.token_hit_rate), rtol=1e-6)


@settings(HYP, max_examples=6)
@given(w=st.one_of(tree_workloads(), long_run_workloads()), configs=CONFIGS, seed=st.integers(0, 3))
@pytest.mark.slow  # long; see README's slow checks
def test_replay_equals_engine(w, configs, seed):
    assert_equal_to_engine(w, configs, seed)


@pytest.mark.slow
@settings(HYP, max_examples=60)
@given(w=st.one_of(tree_workloads(), long_run_workloads()), configs=CONFIGS, seed=st.integers(0, 3))
def test_replay_equals_engine_many(w, configs, seed):
    assert_equal_to_engine(w, configs, seed)


def test_replay_equals_engine_on_mini_mooncake():
    w = load_mooncake(FIXTURE, block_tokens=512)
    assert_equal_to_engine(w, [("lru", 40, 0, 1, "round_robin", 1), ("lru_plain", 15, 0, 3, "random", 1),
                               ("ttl_fixed", 0, 30, 2, "prefix_hash", 2), ("lru", 0, 0, 4, "prefix_hash", 3)])


def test_replay_refuses_what_it_does_not_model():
    w = load_mooncake(FIXTURE, block_tokens=512)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="JAX engine"):
        replay_grid(w, [make_params("lfu_perfect", capacity_blocks=10)], [key])
    with pytest.raises(ValueError, match="JAX engine"):
        replay_grid(w, [make_params("lru", capacity_blocks=10, replicas=2, router="least_loaded")], [key],
                    max_replicas=2)


# ---- the runner's backends (core/run.py backend=): numba and JAX give the same metrics, field by field

FLEET = st.lists(st.tuples(st.sampled_from(["lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded"]),
                           st.integers(0, 300), st.integers(0, 40), st.integers(1, R_MAX),
                           st.sampled_from(["random", "round_robin", "prefix_hash"]), st.integers(1, 6),
                           st.sampled_from([1, 50, 2000, 2_000_000]), st.sampled_from([0, 7, 250, 2_000_000])),
                 min_size=1, max_size=4)


def fleet_params(c):
    policy, cap, ttl_ms, R, router, pb, tps, dus = c
    kw = {}
    if policy in ("lru", "lru_plain"):
        kw["capacity_blocks"] = cap
    if policy.startswith("ttl"):
        kw["ttl_s"] = ttl_ms / 1000
    return make_params(policy, replicas=R, router=router, prefix_blocks=pb, prefill_tps=tps, decode_us_per_token=dus,
                       **kw)


def with_outputs(w, out):
    return dataclasses.replace(w, output_tokens=np.resize(np.asarray(out, np.int64), w.n_requests))


def template(w):
    """One of two template shapes (tree workloads; long-run workloads of up to 16 x 240 blocks)."""
    if w.n_requests <= N_MAX and w.n_blocks.max(initial=0) <= L_MAX:
        return padded_stream(w, 8)
    return padded_stream(w, 8, 16, 240)


def assert_backends_equal(streams, stream_of, P, seeds, **opts):
    """Every Metrics field (per-request arrays on each stream's real requests; dtypes included)."""
    got, gplan = simulate_cells(streams, stream_of, P, seeds, max_replicas=R_MAX, backend="numba", **opts)
    want, jplan = simulate_cells(streams, stream_of, P, seeds, max_replicas=R_MAX, backend="jax", **opts)
    assert {g.backend for g in gplan.groups} == {"numba"} and {g.backend for g in jplan.groups} == {"jax"}
    n = np.asarray([int(streams[s].n_requests) for s in stream_of])
    for f in Metrics._fields:
        a, b = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
        assert a.dtype == b.dtype and a.shape == b.shape, (f, a.dtype, b.dtype, a.shape, b.shape)
        if f in ("hit_blocks", "hit_tokens", "replica", "ttft_ms", "match") and a.size:  # past n: padding
            for g in range(len(P)):
                np.testing.assert_array_equal(a[g, :n[g]], b[g, :n[g]], err_msg=f)
        else:
            np.testing.assert_array_equal(a, b, err_msg=f)


@settings(HYP, max_examples=3)  # 50 in the -m slow sibling below
@given(w=st.one_of(tree_workloads(), long_run_workloads()), out=st.lists(st.integers(0, 300), min_size=1, max_size=5),
       configs=FLEET, seed=st.integers(0, 3), match=st.booleans(), queue=st.booleans(), slots=st.sampled_from([1, 3]))
def test_numba_backend_equals_jax_with_queue(w, out, configs, seed, match, queue, slots):
    w = with_outputs(w, out)
    P = [fleet_params(c) for c in configs]
    # one template shape (test_engine.padded_stream): one JAX compile per option set; numba reads the real requests
    assert_backends_equal([template(w)], np.zeros(len(P), np.int64), P, np.arange(len(P)) + seed,
                          per_request=True, match=match, queue=queue, queue_slots=slots)


@pytest.mark.slow
@settings(HYP, max_examples=50)
@given(w=st.one_of(tree_workloads(), long_run_workloads()), out=st.lists(st.integers(0, 300), min_size=1, max_size=5),
       configs=FLEET, seed=st.integers(0, 3), match=st.booleans(), queue=st.booleans(), slots=st.sampled_from([1, 3]))
def test_numba_backend_equals_jax_with_queue_many(w, out, configs, seed, match, queue, slots):
    w = with_outputs(w, out)
    P = [fleet_params(c) for c in configs]
    # one template shape (test_engine.padded_stream): one JAX compile per option set; numba reads the real requests
    assert_backends_equal([template(w)], np.zeros(len(P), np.int64), P, np.arange(len(P)) + seed,
                          per_request=True, match=match, queue=queue, queue_slots=slots)


@pytest.mark.slow  # long; see README's slow checks
def test_backends_equal_on_two_streams_and_auto_splits_programs():
    w = load_mooncake(FIXTURE, block_tokens=512)
    streams = [compile_stream(w), compile_stream(w.slice(0, w.n_requests // 2))]
    P = [fleet_params(("lru", 40, 0, 1, "round_robin", 1, 2000, 250)),
         fleet_params(("lru_plain", 15, 0, 3, "random", 1, 300, 20000)),
         fleet_params(("ttl_fixed", 0, 30, 2, "prefix_hash", 2, 50, 7)),
         fleet_params(("lru", 5, 0, 4, "prefix_hash", 3, 1, 2_000_000))] * 2
    stream_of = np.asarray([0, 0, 0, 0, 1, 1, 1, 1])
    assert_backends_equal(streams, stream_of, P, np.arange(8), per_request=True, match=True, queue_slots=2)
    # auto: the approximate view's program goes to the JAX engine, the covered one to numba (a CPU host); the
    # plan says which
    mixed = P + [make_params("lru", capacity_blocks=15, replicas=3, router="cache_aware", view="approximate")]
    lines = []
    auto, plan = simulate_cells(streams, np.append(stream_of, 0), mixed, np.arange(9), max_replicas=R_MAX,
                                per_request=True, log=lines.append)
    jax_m, _ = simulate_cells(streams, np.append(stream_of, 0), mixed, np.arange(9), max_replicas=R_MAX,
                              per_request=True, backend="jax")
    assert sorted(g.backend for g in plan.groups) == ["jax", "numba"]
    assert "(1 jax, 1 numba)" in lines[0]
    assert any("(numba)" in x for x in lines[1:]) and any("(jax)" in x for x in lines[1:])
    for f in ("hit_tokens_lo", "hit_tokens_hi", "ttft_p99_ms", "busy_ms", "occupancy", "ttft_mean_ms", "utilisation"):
        np.testing.assert_array_equal(np.asarray(getattr(auto, f)), np.asarray(getattr(jax_m, f)), err_msg=f)


def test_auto_runs_each_fcfs_program_on_one_backend():
    """auto: numba takes an fcfs program only when it covers all of its configurations (else the JAX program,
    compiled for the rest anyway, takes them all); a program with its own state shape decides alone; on the
    vllm replica the covered configurations still go to numba."""
    free = [make_params("lru", capacity_blocks=15, replicas=2, router=r) for r in ("random", "prefix_hash")]
    load = make_params("lru", capacity_blocks=15, replicas=2, router="least_loaded")
    approx = make_params("lru", capacity_blocks=15, replicas=2, router="cache_aware", view="approximate")

    def backends(params, scheduler="fcfs"):
        groups = run._group_cells(params, np.zeros(len(params), np.int64), "auto", True, scheduler)
        return sorted((k[-1], sorted(g for cs in v.values() for g in cs)) for k, v in groups.items())

    assert backends(free) == [("numba", [0, 1])]
    assert backends(free + [load]) == [("jax", [0, 1, 2])]
    assert backends(free + [approx]) == [("jax", [2]), ("numba", [0, 1])]
    assert backends(free + [load], "vllm") == [("numba", [0, 1, 2])]  # least_loaded is covered there
    hot = make_params("lru", capacity_blocks=15, replicas=2, router="kv_cost", temperature=0.5)  # JAX only
    assert backends(free + [hot], "vllm") == [("jax", [2]), ("numba", [0, 1])]
    groups = run._group_cells(free, np.zeros(2, np.int64), "jax", True, "fcfs")
    assert [k[-1] for k in groups] == ["jax"]


def test_numba_backend_refuses_what_it_does_not_cover():
    w = load_mooncake(FIXTURE, block_tokens=512)
    s = compile_stream(w, stateful_singletons=True)
    for p, what in ((make_params("lru", capacity_blocks=15, replicas=2, router="least_loaded"), "least_loaded"),
                    (make_params("lfu_perfect", capacity_blocks=15), "lfu_perfect"),
                    (make_params("sieve", capacity_blocks=15, kv_pressure=True), "kv_pressure"),
                    (make_params("lru", capacity_blocks=15, kv_pressure=True), "kv_pressure"),
                    (make_params("lru", capacity_blocks=15, replicas=2, restart_replica=1), "restart")):
        with pytest.raises(BackendError, match=what):
            simulate_cells([s], [0], [p], [0], max_replicas=2, backend="numba")
    with pytest.raises(BackendError, match="temperature"):  # the vllm replica's numba backend: kv_cost sampling
        simulate_cells([s], [0], [make_params("lru", capacity_blocks=15, router="kv_cost", temperature=0.5)], [0],
                       max_replicas=1, backend="numba", scheduler="vllm")
    with pytest.raises(ValueError, match="backend"):
        simulate_cells([s], [0], [make_params("lru", capacity_blocks=15)], [0], max_replicas=1, backend="gpu")

"""The numba replay backend (``cacheresearch.backends.numba_cache``) equals the JAX engine, request by request."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import FIXTURE, HYP, R_MAX, tree_workloads
from test_stream import long_run_workloads

from cacheresearch.backends.numba_cache import replay_grid
from cacheresearch.engine import combine_limbs, compile_stream, make_params, simulate_grid, stack_params
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

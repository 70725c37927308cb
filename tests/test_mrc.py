"""The one-pass hit curves (``cacheresearch.analysis.mrc``) against the exact engine.

A curve is exact at every capacity: per-request hit blocks, total hit tokens and requests hit equal
the engine's at each capacity checked, for both LRU policies, routers that do not read cache state,
both backends (numba, JAX scan) and several chunk widths.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import FIXTURE, R_MAX, padded_stream, tree_workloads

from cacheresearch.analysis import mrc
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import combine_limbs, make_params
from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake

CURVE_SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def engine_at(stream, w, policy, capacity, replicas, router, prefix_blocks, seed):
    p = make_params(policy, capacity, replicas=replicas, router=router, prefix_blocks=prefix_blocks)
    m = simulate(stream, p, jax.random.key(seed), max_replicas=R_MAX)
    n = w.n_requests
    return (
        np.asarray(m.hit_blocks)[:n],
        int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)),
        int(m.requests_hit),
        np.asarray(m.replica)[:n],
    )


@CURVE_SETTINGS
@given(
    w=tree_workloads(),
    policy=st.sampled_from(["lru", "lru_plain"]),
    replicas=st.integers(1, R_MAX),
    router=st.sampled_from(["round_robin", "prefix_hash", "random"]),
    prefix_blocks=st.integers(1, 5),
    seed=st.integers(0, 3),
    backend=st.sampled_from(["numba", "jax"]),
)
@pytest.mark.slow  # long; see README's slow checks
def test_curve_equals_engine_on_random_workloads(w, policy, replicas, router, prefix_blocks, seed, backend):
    stream = padded_stream(w, 8)
    key = jax.random.key(seed)
    curve = mrc.hit_curve(
        w, policy=policy, replicas=replicas, router=router, prefix_blocks=prefix_blocks, key=key,
        max_capacity=w.total_blocks + 9, chunk_blocks=3, backend=backend,
    )
    for cap in sorted({0, 1, 2, 3, 5, 8, w.total_blocks // 3, w.total_blocks}):
        hb, tok, rh, rep = engine_at(stream, w, policy, cap, replicas, router, prefix_blocks, seed)
        ctx = f"capacity {cap}"
        np.testing.assert_array_equal(rep, mrc.route_requests(w, router, replicas, prefix_blocks=prefix_blocks,
                                                              key=key))
        np.testing.assert_array_equal(curve.hit_blocks_at(cap), hb, err_msg=ctx)
        assert curve.hit_tokens[cap] == tok, ctx
        assert curve.requests_hit[cap] == rh, ctx
        if backend == "numba":  # the one-capacity replay as well
            np.testing.assert_array_equal(mrc.lru_replay(w, rep, cap, policy=policy), hb, err_msg=ctx)


@pytest.mark.parametrize("policy", ["lru", "lru_plain"])
def test_backends_agree_and_curve_matches_engine_on_fixture(policy):
    w = load_mooncake(FIXTURE, block_tokens=512)
    rep = mrc.route_requests(w, "round_robin", 2)
    d_numba = mrc.stack_distances(w, rep, policy=policy, backend="numba")
    d_jax = mrc.stack_distances(w, rep, policy=policy, backend="jax", chunk_blocks=8)
    np.testing.assert_array_equal(d_numba, d_jax)
    curve = mrc.curve_from_distances(w, d_numba)
    from cacheresearch.engine import compile_stream

    s = compile_stream(w, chunk_runs=4)
    for cap in (10, 100, 400, int(curve.capacities[-1])):
        m = simulate(s, make_params(policy, cap, replicas=2), jax.random.key(0), max_replicas=2)
        assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == curve.hit_tokens[cap]
        np.testing.assert_array_equal(np.asarray(m.hit_blocks), curve.hit_blocks_at(cap))


def test_curve_is_monotone_and_reaches_unbounded():
    w = load_mooncake(FIXTURE, block_tokens=512)
    curve = mrc.hit_curve(w, replicas=1)
    assert np.all(np.diff(curve.hit_tokens) >= 0)
    assert curve.hit_tokens[0] == 0
    from cacheresearch.engine import compile_stream

    m = simulate(compile_stream(w), make_params("unbounded"), jax.random.key(0))
    assert curve.hit_tokens[-1] == int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))


def test_bad_arguments():
    w = Workload.from_lists([[1, 2], [1, 3]], block_tokens=4)
    with pytest.raises(ValueError, match="stack policies"):
        mrc.stack_distances(w, np.zeros(2, np.int32), policy="ttl_refresh")
    with pytest.raises(ValueError, match="one replica per request"):
        mrc.stack_distances(w, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="reads cache state or is unknown"):
        mrc.hit_curve(w, router="cache_aware")
    with pytest.raises(ValueError, match="PRNG key"):
        mrc.hit_curve(w, router="random", replicas=2)
    with pytest.raises(ValueError, match="backend"):
        mrc.stack_distances(w, np.zeros(2, np.int32), backend="cuda")


def test_shards_keeps_whole_prefix_trees():
    keys = [[1, 2, 3], [1, 2, 4], [7, 8], [7, 9], [11]]
    w = Workload.from_lists(keys, block_tokens=4)
    sub, rate = mrc.shards_sample(w, 0.5, seed=3, unit="root")
    roots = {int(sub.request_keys(i)[0]) for i in range(sub.n_requests)}
    for r in roots:  # every request of a kept root is kept
        n_sub = sum(1 for i in range(sub.n_requests) if int(sub.request_keys(i)[0]) == r)
        assert sum(1 for k in keys if k[0] == r) == n_sub
    full, _ = mrc.shards_sample(w, 1.0, unit="root")
    assert full.n_requests == w.n_requests and rate == 0.5


def test_shards_block_sampling_estimates_the_exact_curve():
    from cacheresearch.workload.synthetic import design_workload

    w = design_workload(n_tenants=40, prefix_tokens=2_000, suffix_tokens=64, n_requests=600, seed=1)
    sub, rate = mrc.shards_sample(w, 0.2, seed=0)
    # the sample keeps whole requests' order, a subset of every request's blocks
    assert sub.n_requests == w.n_requests
    assert 0.1 < sub.total_blocks / w.total_blocks < 0.3
    kept = set(sub.keys.tolist())
    for i in (0, 17, 599):
        assert sub.request_keys(i).tolist() == [k for k in w.request_keys(i).tolist() if k in kept]
    exact = mrc.hit_curve(w, replicas=1)
    est = mrc.hit_curve(sub, replicas=1)
    caps = exact.capacities[1:]
    at = np.minimum(np.round(caps * rate).astype(int), est.capacities[-1])
    err = np.abs(est.token_hit_rate[at] - exact.token_hit_rate[1:])
    assert err.max() < 0.05, err.max()
    with pytest.raises(ValueError, match="unit"):
        mrc.shards_sample(w, 0.5, unit="tenant")

"""``compile_stream(w)`` serves every policy: what a policy needs beyond the compact stream (every run
stateful for ``lfu_perfect`` / ``length_aware`` and the vllm replica, block ids for ``s3fifo_sosp``) is
derived inside (``core.simulate.serve_stream``), and equals compiling with the flags: the derived arrays
(block ids exactly, run lengths as a multiset) and every request's results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import HYP, L_MAX, N_MAX, R_MAX, padded_stream, tree_workloads

from cacheresearch.core.simulate import (
    serve_stream,
    simulate,  # the JAX scan
    static_options,
)
from cacheresearch.core.stream import pad_stream, stream_shape, with_block_ids, with_stateful_singletons
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.workload import Workload

NEEDS = {"lfu_perfect": dict(stateful_singletons=True), "length_aware": dict(stateful_singletons=True),
         "s3fifo_sosp": dict(block_ids=True)}


def same(a, b, n, R):
    for f in ("hit_blocks", "replica"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f))[:n], np.asarray(getattr(b, f))[:n], err_msg=f)
    for f in ("occupancy", "max_occupancy"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f))[:R], np.asarray(getattr(b, f))[:R], err_msg=f)


def test_derived_arrays_equal_the_flagged_compile():
    w = Workload.from_lists([[1, 2, 3, 9], [1, 2, 4], [7], [1, 2, 3, 5, 6], [8, 1]], block_tokens=2)
    plain = compile_stream(w)
    assert plain.has_singletons and plain.n_distinct == 0
    flagged = compile_stream(w, stateful_singletons=True, block_ids=True)
    got = with_block_ids(with_stateful_singletons(plain))
    assert not got.has_singletons and got.n_keys == flagged.n_keys
    np.testing.assert_array_equal(np.asarray(got.block_id), np.asarray(flagged.block_id))
    assert got.n_distinct == flagged.n_distinct
    assert sorted(np.asarray(got.run_len).tolist()) == sorted(np.asarray(flagged.run_len).tolist())
    # each entry's run has the length the log gives it, in both orders
    for lg in np.asarray(got.log):
        real = lg[:-1]
        np.testing.assert_array_equal(np.asarray(got.run_len)[real[:, 0]], real[:, 1])
    assert with_stateful_singletons(flagged) is flagged and with_block_ids(flagged) is flagged


@settings(HYP, max_examples=6)
@given(w=tree_workloads(), policy=st.sampled_from(sorted(NEEDS)), capacity=st.integers(0, 30),
       replicas=st.integers(1, R_MAX), router=st.sampled_from(["round_robin", "prefix_hash"]))
@pytest.mark.slow  # long; see README's slow checks
def test_derived_then_padded_gives_the_flagged_results(w, policy, capacity, replicas, router):
    # the grid runner's path: derive what the program needs (serve_stream), then pad to the program's shape
    p = make_params(policy, capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    flagged = padded_stream(w, 2, N_MAX, L_MAX, **NEEDS[policy])
    st_ = static_options(p, max_replicas=R_MAX, priority=policy != "s3fifo_sosp", s3=policy == "s3fifo_sosp")
    served = pad_stream(serve_stream(compile_stream(w, chunk_runs=2), st_), stream_shape(flagged))
    a = simulate(flagged, p, jax.random.key(0), max_replicas=R_MAX)
    b = simulate(jax.tree.map(jnp.asarray, served), p, jax.random.key(0), max_replicas=R_MAX)
    same(a, b, w.n_requests, replicas)


@pytest.mark.parametrize("policy", sorted(NEEDS))
def test_compile_stream_without_flags_serves(policy):
    w = Workload.from_lists([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8], [1, 9]], block_tokens=1)
    p = make_params(policy, capacity_blocks=4)
    same(simulate(compile_stream(w), p, jax.random.key(0)),
         simulate(compile_stream(w, **NEEDS[policy]), p, jax.random.key(0)), w.n_requests, 1)


@pytest.mark.slow
def test_vllm_replica_on_an_unflagged_stream():
    w = Workload.from_lists([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7]], block_tokens=16)
    p = make_params("lru", capacity_blocks=8)
    a = simulate(compile_stream(w), p, jax.random.key(0), scheduler="vllm")
    b = simulate(compile_stream(w, stateful_singletons=True), p, jax.random.key(0), scheduler="vllm")
    same(a, b, w.n_requests, 1)
    np.testing.assert_array_equal(np.asarray(a.ttft_ms), np.asarray(b.ttft_ms))

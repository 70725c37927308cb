"""The engine's ``s3fifo`` (``cacheresearch.cache.s3fifo``) against the plain-Python oracle
(``tests/reference.py``, ``S3FIFOCache``): every request's hit blocks and replica, every replica's
occupancy after every request (its maximum) and at the end."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_simulate
from test_engine import HYP, L_MAX, N_MAX, R_MAX, padded_stream, tree_workloads
from test_stream import unchained_workloads

from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.workload import Workload


def check(w, stream, capacity, replicas, router, seed=0):
    p = make_params("s3fifo_sosp", capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    m = simulate(stream, p, jax.random.key(seed), max_replicas=R_MAX)
    n = w.n_requests
    rep = np.asarray(m.replica)[:n]
    kw = dict(policy="s3fifo_sosp", capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    if router == "random":
        kw["replica_choices"] = rep
    ref = reference_simulate(w, **kw)
    ctx = f"s3fifo C={capacity} R={replicas} {router}"
    np.testing.assert_array_equal(rep, ref["replica"], err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.hit_blocks)[:n], ref["hit_blocks"], err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.occupancy)[:replicas], [len(c) for c in ref["final_contents"]],
                                  err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.max_occupancy)[:replicas], ref["max_occupancy"], err_msg=ctx)


@settings(HYP, max_examples=15)
@given(w=tree_workloads(), capacity=st.one_of(st.integers(0, 12), st.integers(0, 80)), replicas=st.integers(1, R_MAX),
       router=st.sampled_from(["round_robin", "random", "prefix_hash"]), seed=st.integers(0, 3))
@pytest.mark.slow  # long; see README's slow checks
def test_s3fifo_matches_reference_on_trees(w, capacity, replicas, router, seed):
    check(w, padded_stream(w, 2, N_MAX, L_MAX, block_ids=True), capacity, replicas, router, seed)


@settings(HYP, max_examples=10)
@given(w=unchained_workloads(max_requests=12, pool=6, max_len=5), capacity=st.integers(0, 8),
       replicas=st.integers(1, 2))
def test_s3fifo_matches_reference_on_repeated_small_pools(w, capacity, replicas):
    """Few keys, many requests: promotions, ghost readmissions and main-queue reinsertion."""
    check(w, padded_stream(w, 2, 12, 5, block_ids=True), capacity, replicas, "round_robin")


def test_s3fifo_needs_a_router_that_reads_no_cache():
    w = Workload.from_lists([[1, 2], [1, 3]], block_tokens=1)
    with pytest.raises(ValueError, match="cache-reading"):
        simulate(compile_stream(w), make_params("s3fifo_sosp", capacity_blocks=2, replicas=2,
                                                                 router="cache_aware"), jax.random.key(0),
                 max_replicas=2)

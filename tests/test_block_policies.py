"""The per-block policies on prefix streams: the numba engine (backends/numba_policies.py) against the
oracles (tests/reference_blocks.py), request by request (hit blocks, replica, maximum and final
occupancy), on hypothesis prefix trees and unchained pools, every load-free router, several replicas;
and the refusals, each with its reason."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_blocks import BLOCK_ORACLES, block_simulate
from test_engine import HYP, R_MAX, tree_workloads
from test_stream import long_run_workloads, unchained_workloads

from cacheresearch.backends.numba_policies import block_replay_grid
from cacheresearch.core.params import make_params
from cacheresearch.workload import Workload

POLICIES = tuple(BLOCK_ORACLES)


def check(w, policy, capacity, replicas, router, seed=0):
    p = make_params(policy, capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    m = block_replay_grid(w, [p], [jax.random.key(seed)], max_replicas=R_MAX)
    rep = np.asarray(m.replica[0])
    ref = block_simulate(w, policy=policy, capacity_blocks=capacity, replicas=replicas, router=router,
                         prefix_blocks=2, replica_choices=rep if router == "random" else None)
    ctx = f"{policy} C={capacity} R={replicas} {router}"
    np.testing.assert_array_equal(rep, ref["replica"], err_msg=ctx)
    np.testing.assert_array_equal(m.hit_blocks[0], ref["hit_blocks"], err_msg=ctx)
    np.testing.assert_array_equal(m.max_occupancy[0][:replicas], ref["max_occupancy"], err_msg=ctx)
    np.testing.assert_array_equal(m.occupancy[0][:replicas], ref["occupancy"], err_msg=ctx)
    assert int(m.hit_tokens[0]) == int(ref["hit_tokens"].sum())


routers = st.sampled_from(["round_robin", "random", "prefix_hash"])


@settings(HYP, max_examples=10)
@given(w=tree_workloads(), policy=st.sampled_from(POLICIES), capacity=st.one_of(st.integers(0, 12),
       st.integers(10, 80)), replicas=st.integers(1, R_MAX), router=routers, seed=st.integers(0, 3))
def test_engine_equals_oracle_on_prefix_trees(w, policy, capacity, replicas, router, seed):
    check(w, policy, capacity, replicas, router, seed)


@settings(HYP, max_examples=8)
@given(w=st.one_of(unchained_workloads(), long_run_workloads()), policy=st.sampled_from(POLICIES),
       capacity=st.integers(0, 40), replicas=st.integers(1, 2))
def test_engine_equals_oracle_on_pools_and_long_runs(w, policy, capacity, replicas):
    check(w, policy, capacity, replicas, "round_robin")


@pytest.mark.parametrize("policy", POLICIES)
def test_request_longer_than_the_capacity(policy):
    # one 30-block request then its prefix again at capacity 8: each block is a get, leaf-first, so the
    # request's own deep blocks go first and what stays is policy-specific; the oracle decides
    w = Workload.from_lists([list(range(1, 31)), list(range(1, 11)), list(range(1, 31))], block_tokens=4)
    check(w, policy, 8, 1, "round_robin")


def test_refusals_name_their_reason():
    w = Workload.from_lists([[1, 2], [1, 3]], block_tokens=2)
    with pytest.raises(ValueError, match="per-block policies keep block queues"):
        block_replay_grid(w, [make_params("sieve", capacity_blocks=2, replicas=2, router="cache_aware")],
                          max_replicas=2)
    with pytest.raises(ValueError, match="not per-block policies"):
        block_replay_grid(w, [make_params("lru", capacity_blocks=2)])
    with pytest.raises(ValueError, match="queue model"):
        block_replay_grid(w, [make_params("fifo", capacity_blocks=2, kv_pressure=True)])

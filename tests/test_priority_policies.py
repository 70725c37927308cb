"""The engine's priority policies (``lfu``, ``length_aware``) against the plain-Python oracle.

Hypothesis workloads with branching prefix trees and with long shared runs that capacities cut in
the middle (partial runs), several replicas and routers; every request's hit blocks and replica,
and every replica's occupancy, equal ``tests/reference.py`` exactly.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_simulate
from test_engine import HYP, L_MAX, N_MAX, R_MAX, padded_stream, tree_workloads
from test_stream import L_R, N_R, long_run_workloads

from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.core.stream import compile_stream
from cacheresearch.engine import make_params
from cacheresearch.workload import Workload

PRIORITY = ("lfu_perfect", "length_aware")


def padded(w: Workload, n_requests: int, n_blocks: int, chunk_runs: int = 2):
    return padded_stream(w, chunk_runs, n_requests, n_blocks, stateful_singletons=True)


def check(w, stream, policy, capacity, replicas, router, seed=0):
    p = make_params(policy, capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    m = simulate(stream, p, jax.random.key(seed), max_replicas=R_MAX)
    n = w.n_requests
    rep = np.asarray(m.replica)[:n]
    kw = dict(policy=policy, capacity_blocks=capacity, replicas=replicas, router=router, prefix_blocks=2)
    if router == "random":
        kw["replica_choices"] = rep
    ref = reference_simulate(w, debug=True, **kw)
    ctx = f"{policy} C={capacity} R={replicas} {router}"
    np.testing.assert_array_equal(rep, ref["replica"], err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.hit_blocks)[:n], ref["hit_blocks"], err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.hit_tokens)[:n], ref["hit_tokens"], err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.occupancy)[:replicas], [len(c) for c in ref["final_contents"]],
                                  err_msg=ctx)
    np.testing.assert_array_equal(np.asarray(m.max_occupancy)[:replicas], ref["max_occupancy"], err_msg=ctx)
    assert np.all(np.asarray(m.max_occupancy) <= capacity), ctx


@settings(HYP, max_examples=10)
@given(w=tree_workloads(), capacity=st.integers(0, 60), replicas=st.integers(1, R_MAX),
       router=st.sampled_from(["round_robin", "random", "prefix_hash"]), seed=st.integers(0, 3))
@pytest.mark.slow  # long; see README's slow checks
def test_priority_policies_match_reference_on_trees(w, capacity, replicas, router, seed):
    stream = padded(w, N_MAX, L_MAX)
    for policy in PRIORITY:
        check(w, stream, policy, capacity, replicas, router, seed)


@settings(HYP, max_examples=5)
@given(w=long_run_workloads(), capacity=st.integers(0, 400), replicas=st.integers(1, 3))
@pytest.mark.slow  # long; see README's slow checks
def test_priority_policies_match_reference_on_long_runs(w, capacity, replicas):
    stream = padded(w, N_R, L_R)
    for policy in PRIORITY:
        check(w, stream, policy, capacity, replicas, "round_robin")


@pytest.mark.slow
@settings(HYP, max_examples=30)
@given(w=long_run_workloads(), capacity=st.integers(0, 400), replicas=st.integers(1, 3))
def test_priority_policies_match_reference_on_long_runs_many(w, capacity, replicas):
    stream = padded(w, N_R, L_R)
    for policy in PRIORITY:
        check(w, stream, policy, capacity, replicas, "round_robin")


def test_lfu_keeps_the_popular_prefix_and_length_aware_the_shallow_blocks():
    """Hand case (capacity 4, one replica): a prefix [1, 2] used 3 times, then two one-off requests.

    lfu: [1, 2] has count 3 and stays; the one-off blocks (count 1) go, least recent first.
    length_aware: the deepest blocks go first, whatever their popularity."""
    keys = [[1, 2], [1, 2], [1, 2], [10, 11, 12], [20, 21, 22], [1, 2]]
    w = Workload.from_lists(keys, block_tokens=1)
    s = compile_stream(w, stateful_singletons=True)
    lfu = simulate(s, make_params("lfu_perfect", capacity_blocks=4), jax.random.key(0))
    assert np.asarray(lfu.hit_blocks).tolist() == [0, 2, 2, 0, 0, 2]
    la = simulate(s, make_params("length_aware", capacity_blocks=4), jax.random.key(0))
    # after [10,11,12]: depths 0,1 of [1,2] and 0,1,2 of the new one: evict depth 2 (12) -> {1,2,10,11}
    # after [20,21,22]: 5 over by 3 at depths {0:1,10,20; 1:2,11,21; 2:22}: 22, then the least
    # recent depth-1 blocks 2 and 11 -> {1,10,20,21}; the last request hits block 1 only
    assert np.asarray(la.hit_blocks).tolist() == [0, 2, 2, 0, 0, 1]


def test_priority_policies_refuse_the_stale_view():
    w = Workload.from_lists([[1, 2], [1, 3]], block_tokens=1)
    s = compile_stream(w)  # every run made stateful inside (tests/test_serve_stream.py)
    with pytest.raises(ValueError, match="stale"):
        simulate(s, make_params("lfu_perfect", capacity_blocks=2, replicas=2, router="cache_aware", view="stale"),
                 jax.random.key(0), max_replicas=2)

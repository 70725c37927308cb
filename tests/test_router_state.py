"""A router with state: ``least_recent`` (one package file, ``cacheresearch/routers/least_recent.py``, and its oracle,
``tests/reference_fleet.py``'s ``LeastRecent``) equals its oracle request by request on the numba fcfs fleet (the
per-block policies) and on the numba vllm replica; the JAX engine, whose scan carries no router state, refuses it
in one line; ``auto`` takes numba for it, and refuses it in that line where no numba backend covers the rest."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import HYP, R_MAX, tree_workloads
from test_fleet import assert_fleet_equal, knob_sets, with_outputs
from test_numba_blocks import numba_and_reference
from test_numba_vllm import _compare, _workload

from cacheresearch.cache.policies import BLOCK_POLICY_IDS
from cacheresearch.core.run import simulate
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.routers import LOAD_FREE_ROUTERS, REGISTRY
from cacheresearch.routers import dispatch as rdispatch


def test_it_is_declared_with_state_and_a_numba_rule_only():
    r = REGISTRY["least_recent"]
    assert r.stateful and r.rule is None and r.numba is not None and "least_recent" in rdispatch.codes()
    assert "least_recent" not in LOAD_FREE_ROUTERS  # its sequence is its memory's, not fixed before the run


@settings(HYP, max_examples=20)
@given(w=tree_workloads(), data=st.data(), knobs=knob_sets, replicas=st.integers(1, R_MAX), seed=st.integers(0, 3))
def test_on_the_fcfs_fleet_equals_its_oracle(w, data, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(BLOCK_POLICY_IDS))
    kw = dict(knobs, view="precise", capacity=data.draw(st.integers(0, 20)))
    m, ref = numba_and_reference(w, policy, kw, replicas, "least_recent", seed)
    assert_fleet_equal(w, m, ref, ("least_recent", policy, replicas))
    # the oracle's memory: on a fleet of fixed size the least recently served replica is i mod R
    np.testing.assert_array_equal(ref["replica"], np.arange(w.n_requests) % replicas)


@pytest.mark.parametrize("R", [1, 3])
def test_on_the_vllm_replica_equals_its_oracle(R):
    ref = _compare(_workload(R, 20), R=R, router="least_recent", jax_too=False, capacity_blocks=40,
                   max_num_batched_tokens=48, max_num_seqs=4)
    assert sorted(set(ref["replica"].tolist())) == list(range(R))


def test_the_jax_engine_refuses_it_in_one_line():
    w = _workload(1, 4)
    s = compile_stream(w, block_ids=True)
    p = make_params("fifo", capacity_blocks=20, replicas=2, router="least_recent")
    with pytest.raises(ValueError) as e:
        simulate(s, p, jax.random.key(0), backend="jax", max_replicas=2)
    msg = str(e.value)
    assert "\n" not in msg and "'least_recent'" in msg and "JAX engine" in msg and "keeps state" in msg
    # auto: numba, on any host (the JAX engine cannot run it)
    m = simulate(s, p, jax.random.key(0), backend="auto", max_replicas=2, per_request=True)
    assert np.asarray(m.replica)[: w.n_requests].tolist() == [i % 2 for i in range(w.n_requests)]
    # the run store's policies have no numba fleet that routes by state: the JAX engine's line, naming the router
    with pytest.raises(ValueError) as e:
        simulate(s, make_params("lru", capacity_blocks=20, replicas=2, router="least_recent"), jax.random.key(0),
                 max_replicas=2)
    assert "\n" not in str(e.value) and "'least_recent'" in str(e.value)

"""A contributor's router, registered at run time from outside the package the way a user's plug-in is:
``register(Router(...))`` with its numba rule in this test module, its oracle with
``reference_fleet.register_oracle``. On every engine it either equals its oracle request by request or is refused
in one line that names it: the numba fcfs fleet (per-block policies) and the numba vllm replica run it; the JAX
engine (fcfs and vllm replicas), the fcfs run store's numba backend and the tiered engine refuse it.

The toy router keeps state for the whole fleet (``state_global=2``): a counter of its decisions and its last pick;
every third decision (counter 0, 3, 6, ...) goes to the least loaded replica (``argmin_rot(queue)``), the others
follow the last pick."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import reference_fleet
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import HYP, R_MAX, tree_workloads
from test_fleet import assert_fleet_equal, knob_sets, with_outputs
from test_numba_blocks import numba_and_reference
from test_numba_vllm import _compare, _workload

from cacheresearch.cache.policies import BLOCK_POLICY_IDS
from cacheresearch.core.run import simulate
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.routers import REGISTRY, Router, register
from cacheresearch.routers import dispatch as rdispatch
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.tiers.spec import make_config

NAME = "toy_sticky"


def toy_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    if sg[0] % 3 == 0:
        nb_all(elig, nrep)
        sg[1] = nb_argmin_rot(q, elig, nrep, nb_offset(bits, nrep))
    sg[0] += 1
    return sg[1]


class ToyOracle:
    """The toy rule in plain Python."""

    def __init__(self, R: int):
        self.count, self.last = 0, 0

    def route(self, *, R, bits, queue, **_):
        if self.count % 3 == 0:
            off = (bits[0] * R) >> 32
            self.last = min(range(R), key=lambda r: (queue[r], (r - off) % R))
        self.count += 1
        return self.last


@pytest.fixture(scope="module", autouse=True)
def toy():
    r = register(Router(name=NAME, id=90, numba=toy_rule, state_global=2, reads_load=True,
                        summary="every third decision the least loaded replica, else the last pick", doc=__doc__))
    reference_fleet.register_oracle(NAME, ToyOracle)
    yield r
    REGISTRY.unregister(NAME)
    reference_fleet.ORACLES.pop(NAME)


def test_the_dispatch_takes_it_and_rebuilds_for_it():
    assert NAME in rdispatch.codes() and not rdispatch.current().BUILTIN


@settings(HYP, max_examples=15)
@given(w=tree_workloads(), data=st.data(), knobs=knob_sets, replicas=st.integers(1, R_MAX), seed=st.integers(0, 3))
def test_numba_fcfs_fleet_equals_its_oracle(w, data, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(BLOCK_POLICY_IDS))
    kw = dict(knobs, view="precise", capacity=data.draw(st.integers(0, 20)))
    m, ref = numba_and_reference(w, policy, kw, replicas, NAME, seed)
    assert_fleet_equal(w, m, ref, (NAME, policy, replicas))


@pytest.mark.parametrize("R", [1, 3])
def test_numba_vllm_replica_equals_its_oracle(R):
    _compare(_workload(R + 4, 20, rate=60), R=R, router=NAME, jax_too=False, capacity_blocks=40,
             max_num_batched_tokens=48, max_num_seqs=4)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and repr(NAME) in msg, msg
    return msg


def test_every_other_engine_refuses_it_in_one_line():
    w = _workload(1, 4)
    key = jax.random.key(0)
    s = compile_stream(w, block_ids=True)
    with pytest.raises(ValueError) as e:  # the JAX engine, fcfs replica
        simulate(s, make_params("fifo", capacity_blocks=20, replicas=2, router=NAME), key, backend="jax",
                 max_replicas=2)
    assert "JAX engine" in _one_line(e)
    sv = compile_stream(w, stateful_singletons=True)
    with pytest.raises(ValueError) as e:  # the JAX engine, vllm replica
        simulate(sv, make_params("lru", capacity_blocks=40, replicas=2, router=NAME), key, backend="jax",
                 max_replicas=2, scheduler="vllm", max_running=4, queue_slots=64)
    assert "JAX engine" in _one_line(e)
    with pytest.raises(ValueError) as e:  # the run store's numba backend (lru): decisions fixed before the run
        simulate(s, make_params("lru", capacity_blocks=20, replicas=2, router=NAME), key, max_replicas=2)
    _one_line(e)
    with pytest.raises(ValueError) as e:  # the tiered engine
        make_config(gpu_blocks=20, replicas=2, router=NAME)
    _one_line(e)


def test_a_rule_that_reads_its_module_is_refused_in_one_line():
    """A numba rule reads only its arguments, np and the helpers (the dispatch copies its source)."""
    bad = Router(name="toy_bad", id=91, numba=_reads_a_global)
    with pytest.raises(ValueError) as e:
        rdispatch.source_of(bad, "_r")
    assert "\n" not in str(e.value) and "SPAN" in str(e.value)
    assert np.all(ToyOracle(2).route(R=2, bits=[0] * 4, queue=[1, 0]) == 1)


SPAN = 3


def _reads_a_global(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    return i % SPAN

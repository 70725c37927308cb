"""The run-compressed stream (``cacheresearch.core.stream``) and the engine on run-heavy workloads.

Runs must partition every request, every occurrence of a run must be the same key sequence, and
runs must be maximal. The engine must equal the plain-Python references request by request on
workloads made of long shared runs (partial eviction inside a run), on workloads where every block
is distinct, and on workloads whose keys are not chained at all (a key after different keys).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fleet import reference_fleet
from test_engine import (
    HYP,
    LRU,
    R_MAX,
    assert_matches_reference,
    config_kwargs,
    key_of,
    padded_stream,
    run_engine,
    tree_workloads,
)
from test_fleet import OPTS, assert_fleet_equal

from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.core.stream import compile_stream, default_chunk_runs, run_structure
from cacheresearch.engine import make_params, request_bits
from cacheresearch.workload import Workload

N_R, L_R = 16, 240  # long-run workloads: up to 16 requests of up to 240 blocks


@st.composite
def long_run_workloads(draw, max_requests=N_R, max_len=L_R):
    """A few long chains (system prompts, documents) that requests take whole or cut, then a tail."""
    salt = draw(st.integers(0, 2**64 - 1))
    n_heads = draw(st.integers(1, 3))
    heads = [[key_of(1000 * h + j, salt) for j in range(draw(st.integers(min(20, max_len), min(150, max_len))))]
             for h in range(n_heads)]
    keys, arrivals, now = [], [], 0
    for i in range(draw(st.integers(2, max_requests))):
        h = heads[draw(st.integers(0, n_heads - 1))]
        cut = draw(st.sampled_from([len(h), len(h), draw(st.integers(0, len(h)))]))
        tail = [key_of(10**7 + 1000 * i + j, salt) for j in range(draw(st.integers(0, max(0, max_len - cut))))]
        keys.append((h[:cut] + tail)[:max_len])
        arrivals.append(now)
        now += draw(st.integers(0, 9))
    return Workload.from_lists(keys, block_tokens=draw(st.sampled_from([1, 16])), arrival_ms=np.array(arrivals))


@st.composite
def unchained_workloads(draw, max_requests=12, pool=10, max_len=8):
    """Keys drawn from a small pool in any order (distinct within a request): no prefix tree."""
    keys = [draw(st.lists(st.integers(0, pool - 1), unique=True, max_size=max_len))
            for _ in range(draw(st.integers(1, max_requests)))]
    return Workload.from_lists(keys, block_tokens=2)


def distinct_workload(n=10, length=12):
    return Workload.from_lists([[100 * i + j for j in range(length)] for i in range(n)], block_tokens=4)


def check_runs(w: Workload):
    rs = run_structure(w)
    keys = w.keys
    # runs partition every request, in order
    assert rs.length.sum() == w.total_blocks and np.all(rs.length >= 1)
    np.testing.assert_array_equal(np.bincount(rs.req, minlength=w.n_requests), rs.n_runs)
    for i in range(w.n_requests):
        sel = rs.req == i
        starts = rs.start[sel]
        if starts.size:
            assert starts[0] == w.offsets[i]
            np.testing.assert_array_equal(np.append(starts[1:], w.offsets[i + 1]), starts + rs.length[sel])
    # every occurrence of a run is the same key sequence
    seq: dict[int, tuple] = {}
    for s, m, h in zip(rs.start, rs.length, rs.head):
        t = tuple(keys[s : s + m].tolist())
        assert seq.setdefault(int(h), t) == t
    # no key is in two different runs (runs are disjoint), and runs are maximal: at each junction
    # inside a request, the left key is sometimes followed by something else (or ends a request) or
    # the right key is sometimes preceded by something else (or starts one)
    owner: dict[int, int] = {}
    for h, t in seq.items():
        for k in t:
            assert owner.setdefault(k, h) == h
    after: dict[int, set] = {}
    before: dict[int, set] = {}
    for i in range(w.n_requests):
        ks = w.request_keys(i).tolist()
        for j, k in enumerate(ks):
            after.setdefault(k, set()).add(ks[j + 1] if j + 1 < len(ks) else None)
            before.setdefault(k, set()).add(ks[j - 1] if j else None)
    for i in range(w.n_requests):
        sel = np.nonzero(rs.req == i)[0]
        for a, b in zip(sel[:-1], sel[1:]):
            left, right = int(keys[rs.start[b] - 1]), int(keys[rs.start[b]])
            assert after[left] != {right} or before[right] != {left}


@settings(HYP, max_examples=60)
@given(w=st.one_of(tree_workloads(), long_run_workloads(), unchained_workloads()))
def test_runs_partition_requests_and_are_maximal(w):
    check_runs(w)


def test_runs_of_a_shared_prompt_and_distinct_blocks():
    head = list(range(50))
    w = Workload.from_lists([head + [1000 + i] for i in range(4)] + [head[:20]], block_tokens=1)
    rs = run_structure(w)
    # the head splits where one request stops (block 20); each unique last block is its own run
    assert rs.n_runs.tolist() == [3, 3, 3, 3, 1]
    assert rs.length[:3].tolist() == [20, 30, 1]
    s = compile_stream(w)
    assert s.n_keys == 2 and sorted(np.asarray(s.run_len).tolist()) == [20, 30]
    d = run_structure(distinct_workload())
    assert d.n_runs.tolist() == [1] * 10 and d.length.tolist() == [12] * 10


def test_default_chunk_runs_prefers_one_step_per_request():
    assert default_chunk_runs(np.array([2, 2, 1, 2])) == 2
    assert default_chunk_runs(np.array([1] * 100)) == 1
    assert default_chunk_runs(np.array([300])) == 64


def test_chunk_runs_must_be_positive():
    with pytest.raises(ValueError, match="chunk_runs"):
        compile_stream(distinct_workload(), chunk_runs=0)


_LONG = dict(w=long_run_workloads(), capacity=st.integers(0, 400), replicas=st.integers(1, R_MAX),
             chunk_runs=st.sampled_from([1, 2, 4]), seed=st.integers(0, 3))


def _check_long_runs(w, capacity, replicas, chunk_runs, seed):
    """Capacities that cut runs: partial runs are evicted tail first (leaf-first) or head first."""
    stream = padded_stream(w, chunk_runs, N_R, L_R)
    for policy in LRU:
        for router in ("round_robin", "random"):
            kw = config_kwargs(policy, capacity=capacity, replicas=replicas, router=router)
            assert_matches_reference(w, kw, run_engine(stream, kw, seed))


@settings(HYP, max_examples=10)
@given(**_LONG)
@pytest.mark.slow  # long; see README's slow checks
def test_long_runs_match_reference(**case):
    _check_long_runs(**case)


@pytest.mark.slow
@settings(HYP, max_examples=60)
@given(**_LONG)
def test_long_runs_match_reference_many(**case):
    _check_long_runs(**case)


@settings(HYP, max_examples=40)
@given(w=unchained_workloads(), capacity=st.integers(0, 12), replicas=st.integers(1, R_MAX),
       seed=st.integers(0, 3))
def test_unchained_keys_match_reference(w, capacity, replicas, seed):
    stream = padded_stream(w, 2, 12, 8)
    for policy in LRU:
        kw = config_kwargs(policy, capacity=capacity, replicas=replicas, router="random")
        # (no prefix-closure check: unchained keys have no prefix tree)
        assert_matches_reference(w, kw, run_engine(stream, kw, seed), debug=False)


@pytest.mark.parametrize("capacity", [0, 5, 12, 13, 40, 200])
def test_every_block_distinct_matches_reference(capacity):
    w = distinct_workload()
    stream = padded_stream(w, 1, 10, 12)
    for policy in LRU:
        kw = config_kwargs(policy, capacity=capacity, replicas=2, router="round_robin")
        assert_matches_reference(w, kw, run_engine(stream, kw))


@settings(HYP, max_examples=30)
@given(w=long_run_workloads(max_requests=10, max_len=60), data=st.data(),
       router=st.sampled_from(["cache_aware", "kv_cost", "weighted_scorers", "preble_e2", "chwbl"]),
       view=st.sampled_from(["precise", "approximate", "stale"]), replicas=st.integers(2, R_MAX))
@pytest.mark.slow  # long; see README's slow checks
def test_long_runs_routers_and_views_match_reference(w, data, router, view, replicas):
    """Cache-reading routers see partial runs in every view (index capacity cuts runs too)."""
    cap = data.draw(st.integers(0, 120))
    kw = dict(capacity=cap, view=view, index_capacity=data.draw(st.integers(0, 80)),
              stale_lag_ms=data.draw(st.integers(0, 20)),
              prefill_tps=1000, decode_us_per_token=100)
    policy = data.draw(st.sampled_from(LRU))
    stream = padded_stream(w, 2, N_R, L_R)
    p = make_params(policy, capacity_blocks=cap, replicas=replicas, router=router,
                    **{k: v for k, v in kw.items() if k != "capacity"})
    key = jax.random.key(0)
    m = simulate(stream, p, key, per_request=True, **OPTS)
    bits = np.asarray(request_bits(key, stream.arrival_ms.shape[0]))[: w.n_requests]
    ref = reference_fleet(w, policy=policy, capacity_blocks=cap, replicas=replicas, router=router, bits=bits,
                          **{k: v for k, v in kw.items() if k != "capacity"})
    assert_fleet_equal(w, m, ref, f"{policy} {router} {view} {kw}")

"""Cache events: a replica restart flushes that replica's cache (engine hook, equal to the reference),
and a model or version upgrade re-keys every later request."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import HYP, R_MAX, padded_stream, tree_workloads
from test_fleet import OPTS, assert_fleet_equal, engine_and_reference, tenant_prefix_workload, with_outputs

from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import make_params
from cacheresearch.workload.keys import rekey_after


@settings(HYP, max_examples=60)
@given(w=tree_workloads(), data=st.data(),
       router=st.sampled_from(["random", "round_robin", "prefix_hash", "cache_aware", "kv_cost", "least_loaded"]),
       view=st.sampled_from(["precise", "approximate", "stale"]), replicas=st.integers(1, R_MAX),
       seed=st.integers(0, 3))
def test_restart_matches_reference(w, data, router, view, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 300), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(["lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded"]))
    at = int(data.draw(st.sampled_from(list(np.asarray(w.arrival_ms)) + [0, int(w.arrival_ms[-1]) + 1])))
    kw = dict(capacity=data.draw(st.integers(0, 40)), ttl_ms=data.draw(st.integers(0, 80)), view=view,
              stale_lag_ms=data.draw(st.integers(0, 60)), prefill_tps=300, decode_us_per_token=100, prefix_blocks=3,
              restart_replica=data.draw(st.integers(0, replicas - 1)), restart_ms=at)
    m, ref = engine_and_reference(w, policy, kw, replicas, router, seed)
    assert_fleet_equal(w, m, ref, (router, policy, view, replicas, at))


def test_restart_empties_the_replica():
    """One replica, every request the same prefix: the first request at or after the restart misses."""
    w = tenant_prefix_workload()
    T = int(w.arrival_ms[12])
    base = dict(capacity=10_000, prefill_tps=2000, decode_us_per_token=0)
    m0, _ = engine_and_reference(w, "lru", dict(base), 1, "round_robin", 0)
    m1, ref = engine_and_reference(w, "lru", dict(base, restart_replica=0, restart_ms=T), 1, "round_robin", 0)
    h0, h1 = np.asarray(m0.hit_blocks)[: w.n_requests], np.asarray(m1.hit_blocks)[: w.n_requests]
    assert np.array_equal(h0[:12], h1[:12]) and h1[12] == 0 and h0[12] > 0
    assert np.array_equal(h1, ref["hit_blocks"])
    with pytest.raises(ValueError, match="LRU and TTL policies only"):
        simulate(padded_stream(w, 4), make_params("lfu_perfect", 10, restart_replica=0, restart_ms=T),
                 jax.random.key(0), **dict(OPTS, stale=False), priority=True)


def test_version_upgrade_rekeys_later_requests():
    w = tenant_prefix_workload()
    T = int(w.arrival_ms[12])
    v = rekey_after(w, T)
    after = np.repeat(w.arrival_ms >= T, w.n_blocks)
    assert np.array_equal(v.keys[~after], w.keys[~after])
    assert not set(v.keys[after].tolist()) & set(w.keys.tolist())  # no new key equals an old one
    # sharing within the new version is unchanged: equal keys stay equal, different stay different
    a, b = w.keys[after], v.keys[after]
    assert np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :])
    with pytest.raises(ValueError, match="version"):
        rekey_after(w, T, version=0)


def test_restart_is_refused_with_the_vllm_replica():
    w = tenant_prefix_workload()
    with pytest.raises(ValueError, match="fcfs replica only"):
        simulate(padded_stream(w, 4), make_params("lru", 10, restart_replica=0, restart_ms=5), jax.random.key(0),
                 max_replicas=2, scheduler="vllm")

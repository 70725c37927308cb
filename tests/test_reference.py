"""Hand-worked examples pinning the semantics of the plain-Python reference simulator."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
from reference import check_prefix_closed, reference_simulate

from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mini_mooncake.jsonl"
SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"

A, B, C, D, E, X = 1, 2, 3, 4, 5, 99


def wl(keys, *, arrival_ms=None, block_tokens=4, input_tokens=None):
    return Workload.from_lists(keys, block_tokens=block_tokens, arrival_ms=arrival_ms, input_tokens=input_tokens)


def hits(w, **kw):
    return reference_simulate(w, **kw)["hit_blocks"].tolist()


@pytest.fixture(scope="module")
def mini():
    return load_mooncake(FIXTURE, block_tokens=512)


# ------------------------------------------------------------------------------------ LRU
def test_brief_example_both_lrus_evict_c():
    # C=3, [a,b,c] then [a,b,d]: both hit a,b; adding d evicts c (the least recent) in both.
    w = wl([[A, B, C], [A, B, D]])
    leaf = reference_simulate(w, policy="lru", capacity_blocks=3)
    plain = reference_simulate(w, policy="lru_plain", capacity_blocks=3)
    assert leaf["hit_blocks"].tolist() == [0, 2] == plain["hit_blocks"].tolist()
    # leaf-first: touches d, b, a -> order (LRU..MRU) c, d, b, a -> evict c
    assert leaf["final_contents"] == [[D, B, A]]
    # plain: touches a, b, d -> order c, a, b, d -> evict c
    assert plain["final_contents"] == [[A, B, D]]


def test_leaf_first_evicts_leaf_plain_evicts_root():
    # After [a,b,c], [a,b,d], one unrelated block e forces one eviction:
    # leaf-first drops the leaf d (LRU order d,b,a), plain drops the root a (order a,b,d).
    w = wl([[A, B, C], [A, B, D], [E], [A, B, D]])
    leaf = reference_simulate(w, policy="lru", capacity_blocks=3)
    plain = reference_simulate(w, policy="lru_plain", capacity_blocks=3)
    assert leaf["hit_blocks"].tolist() == [0, 2, 0, 2]
    assert plain["hit_blocks"].tolist() == [0, 2, 0, 0]  # root a gone: the first miss stops reuse
    # after request 3 (e): leaf b,a,e ; plain b,d,e.  Request 4 touches a,b,d again.
    assert leaf["final_contents"] == [[D, B, A]]  # e evicted (least recent)
    assert plain["final_contents"] == [[A, B, D]]


def test_one_unrelated_request_between_repeats():
    w = wl([[A, B, C], [X], [A, B, C]])
    assert hits(w, policy="lru", capacity_blocks=3) == [0, 0, 2]  # c (the leaf) was evicted
    assert hits(w, policy="lru_plain", capacity_blocks=3) == [0, 0, 0]  # a (the root) was evicted
    assert hits(w, policy="lru", capacity_blocks=4) == [0, 0, 3]
    assert hits(w, policy="lru_plain", capacity_blocks=4) == [0, 0, 3]
    assert hits(w, policy="unbounded") == [0, 0, 3]


def test_request_longer_than_capacity():
    w = wl([[A, B, C, D, E], [A, B, C, D, E], [A, B, C]])
    leaf = reference_simulate(w, policy="lru", capacity_blocks=3)
    plain = reference_simulate(w, policy="lru_plain", capacity_blocks=3)
    # leaf-first keeps the request's FIRST C blocks, most recent first block
    assert leaf["hit_blocks"].tolist() == [0, 3, 3]
    assert leaf["final_contents"] == [[C, B, A]]
    # plain keeps the LAST C blocks, which are useless without their prefix
    assert plain["hit_blocks"].tolist() == [0, 0, 0]
    assert plain["final_contents"] == [[A, B, C]]
    assert leaf["max_occupancy"].tolist() == [3] == plain["max_occupancy"].tolist()
    with pytest.raises(AssertionError):
        check_prefix_closed(w, [C, D, E])  # plain LRU's cache after request 1 is not prefix-closed
    check_prefix_closed(w, [A, B, C])


def test_capacity_zero_caches_nothing():
    w = wl([[A, B], [A, B]])
    for policy in ("lru", "lru_plain"):
        r = reference_simulate(w, policy=policy, capacity_blocks=0)
        assert r["hit_blocks"].tolist() == [0, 0]
        assert r["final_contents"] == [[]] and r["max_occupancy"].tolist() == [0]


def test_lookup_happens_before_insertion():
    # a request never hits its own blocks, even with room to spare
    w = wl([[A, B, C]])
    for policy in ("lru", "lru_plain", "unbounded"):
        assert hits(w, policy=policy, capacity_blocks=10) == [0]
    assert hits(w, policy="ttl_refresh", ttl_s=5) == [0]


def test_unbounded_order_and_occupancy():
    w = wl([[A, B, C], [X], [A, B, C]])
    r = reference_simulate(w, policy="unbounded")
    assert r["final_contents"] == [[X, C, B, A]]
    assert r["max_occupancy"].tolist() == [4]


def test_hit_tokens_and_rates():
    # block 4 tokens, 3 blocks cover 10 input tokens; a full hit counts 10 tokens, not 12
    w = wl([[A, B, C], [A, B, C], [A, B, D], [X]], input_tokens=[10, 10, 9, 4])
    r = reference_simulate(w, policy="unbounded")
    assert r["hit_blocks"].tolist() == [0, 3, 2, 0]
    assert r["hit_tokens"].tolist() == [0, 10, 8, 0]
    assert r["token_hit_rate"] == pytest.approx(18 / 33)
    assert r["request_hit_rate"] == pytest.approx(0.5)
    assert r["replica"].tolist() == [0, 0, 0, 0]


def test_empty_requests_and_empty_input():
    w = wl([[], []], input_tokens=[0, 0])
    r = reference_simulate(w, policy="lru", capacity_blocks=2)
    assert r["hit_blocks"].tolist() == [0, 0]
    assert r["token_hit_rate"] == 0.0 and r["request_hit_rate"] == 0.0


# ------------------------------------------------------------------------------------ TTL
def test_ttl_boundary_refresh():
    w = wl([[A, B]] * 4, arrival_ms=[0, 1000, 2000, 3001])
    # 1000 - 0 == ttl: hit; each access refreshes; 3001 - 2000 = 1001 > ttl: miss
    assert hits(w, policy="ttl_refresh", ttl_s=1.0) == [0, 2, 2, 0]


def test_ttl_boundary_fixed():
    w = wl([[A, B]] * 4, arrival_ms=[0, 1000, 2000, 3000])
    # written at 0; hit at 1000 (== ttl) without refresh; expired at 2000; rewritten at 2000
    assert hits(w, policy="ttl_fixed", ttl_s=1.0) == [0, 2, 0, 2]
    assert hits(w, policy="ttl_refresh", ttl_s=1.0) == [0, 2, 2, 2]


def test_ttl_one_ms_past_is_a_miss():
    w = wl([[A, B], [A, B]], arrival_ms=[0, 1001])
    assert hits(w, policy="ttl_refresh", ttl_s=1.0) == [0, 0]
    assert hits(w, policy="ttl_fixed", ttl_s=1.0) == [0, 0]
    w = wl([[A, B], [A, B]], arrival_ms=[0, 1000])
    assert hits(w, policy="ttl_refresh", ttl_s=1.0) == [0, 2]
    assert hits(w, policy="ttl_fixed", ttl_s=1.0) == [0, 2]


def test_ttl_zero_and_rounding():
    w = wl([[A], [A], [A]], arrival_ms=[5, 5, 6])
    assert hits(w, policy="ttl_refresh", ttl_s=0) == [0, 1, 0]
    assert hits(w, policy="ttl_fixed", ttl_s=0) == [0, 1, 0]
    w = wl([[A], [A]], arrival_ms=[0, 2])
    assert hits(w, policy="ttl_refresh", ttl_s=0.0019) == [0, 1]  # round(1.9) = 2 ms
    assert hits(w, policy="ttl_refresh", ttl_s=0.0012) == [0, 0]  # round(1.2) = 1 ms


def test_ttl_fixed_partial_expiry():
    w = wl([[A], [A, B], [A, B, C], [A, B]], arrival_ms=[0, 500, 1200, 1600])
    r = reference_simulate(w, policy="ttl_fixed", ttl_s=1.0)
    # t=1200: a (written 0) expired -> 0 hits although b (written 500) is live;
    # a and c written at 1200, b keeps 500. t=1600: a live, b expired (1100 > 1000) -> 1 hit.
    assert r["hit_blocks"].tolist() == [0, 1, 0, 1]
    assert r["final_contents"] == [{A: 1200, B: 1600, C: 1200}]
    r = reference_simulate(w, policy="ttl_refresh", ttl_s=1.0)
    assert r["hit_blocks"].tolist() == [0, 1, 2, 2]
    assert r["final_contents"] == [{A: 1600, B: 1600, C: 1200}]


def test_ttl_occupancy_counts_live_blocks():
    w = wl([[A, B], [C], [D]], arrival_ms=[0, 500, 1400])
    r = reference_simulate(w, policy="ttl_refresh", ttl_s=1.0)
    assert r["max_occupancy"].tolist() == [3]  # after t=500: a, b, c
    assert r["final_contents"] == [{C: 500, D: 1400}]  # a, b expired by t=1400


def test_ttl_final_contents_at_last_arrival_on_every_replica():
    # replica 0 is last served at t=0; by the last arrival (t=5000) its block has expired
    w = wl([[A], [B], [C]], arrival_ms=[0, 4500, 5000])
    r = reference_simulate(w, policy="ttl_refresh", ttl_s=1.0, replicas=3)
    assert r["final_contents"] == [{}, {B: 4500}, {C: 5000}]


# -------------------------------------------------------------------------------- routing
def test_round_robin():
    w = wl([[A]] * 5)
    r = reference_simulate(w, policy="unbounded", replicas=2)
    assert r["replica"].tolist() == [0, 1, 0, 1, 0]
    assert r["hit_blocks"].tolist() == [0, 0, 1, 1, 1]
    assert r["final_contents"] == [[A], [A]]
    r = reference_simulate(w, policy="lru", capacity_blocks=1, replicas=3)
    assert r["replica"].tolist() == [0, 1, 2, 0, 1]
    assert r["hit_blocks"].tolist() == [0, 0, 0, 1, 1]
    assert r["max_occupancy"].tolist() == [1, 1, 1]


def test_random_router_uses_supplied_choices():
    w = wl([[A], [A], [A], [A]])
    r = reference_simulate(w, policy="unbounded", replicas=3, router="random", replica_choices=[2, 0, 2, 0])
    assert r["replica"].tolist() == [2, 0, 2, 0]
    assert r["hit_blocks"].tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError):
        reference_simulate(w, policy="unbounded", replicas=3, router="random")
    with pytest.raises(ValueError):
        reference_simulate(w, policy="unbounded", replicas=3, router="random", replica_choices=[0, 1, 2, 3])
    with pytest.raises(ValueError):
        reference_simulate(w, policy="unbounded", replicas=3, router="random", replica_choices=[0, 1])


@pytest.fixture
def identity_hash(monkeypatch):
    """Stand-in for cacheresearch.routers with prefix_hash_u64(key) = key."""
    mod = types.ModuleType("cacheresearch.routers")
    mod.prefix_hash_u64 = lambda key: key
    monkeypatch.setitem(sys.modules, "cacheresearch.routers", mod)


def test_prefix_hash_routing_picks_block_min_k_n(identity_hash):
    w = wl([[10, 11, 12], [13], [], [10, 11, 14], [10, 15]])
    r = reference_simulate(w, policy="unbounded", replicas=4, router="prefix_hash", prefix_blocks=2)
    # K=2: key of block 2 (11 -> 3), n=1 < K: block 1 (13 -> 1), n=0: key 0, same 2-block prefix,
    # block 2 of [10, 15] is 15 -> 3
    assert r["replica"].tolist() == [3, 1, 0, 3, 3]
    assert r["hit_blocks"].tolist() == [0, 0, 0, 2, 1]
    r = reference_simulate(w, policy="unbounded", replicas=4, router="prefix_hash", prefix_blocks=1)
    assert r["replica"].tolist() == [2, 1, 0, 2, 2]
    with pytest.raises(ValueError):
        reference_simulate(w, policy="unbounded", replicas=4, router="prefix_hash", prefix_blocks=0)


def test_prefix_hash_routing_with_real_hash(mini):
    routers = pytest.importorskip("cacheresearch.routers")
    R, K = 4, 3
    a = reference_simulate(mini, policy="lru", capacity_blocks=200, replicas=R, router="prefix_hash", prefix_blocks=K)
    b = reference_simulate(mini, policy="lru", capacity_blocks=200, replicas=R, router="prefix_hash", prefix_blocks=K)
    assert np.array_equal(a["replica"], b["replica"]) and np.array_equal(a["hit_blocks"], b["hit_blocks"])
    expect = []
    for i in range(mini.n_requests):
        ks = mini.request_keys(i).tolist()
        key = ks[min(K, len(ks)) - 1] if ks else 0
        expect.append(routers.prefix_hash_u64(key) % R)
    assert a["replica"].tolist() == expect


# ------------------------------------------------------------------- properties on a trace
@pytest.mark.parametrize("capacity", [0, 1, 7, 50, 300])
@pytest.mark.parametrize("replicas", [1, 3])
def test_leaf_first_lru_stays_prefix_closed(mini, capacity, replicas):
    r = reference_simulate(mini, policy="lru", capacity_blocks=capacity, replicas=replicas, debug=True)
    for contents in r["final_contents"]:
        assert len(contents) <= capacity
        check_prefix_closed(mini, contents)


def test_large_capacity_and_ttl_equal_unbounded(mini):
    unb = reference_simulate(mini, policy="unbounded")
    n_unique = len(np.unique(mini.keys))
    for policy in ("lru", "lru_plain"):
        r = reference_simulate(mini, policy=policy, capacity_blocks=n_unique)
        assert np.array_equal(r["hit_blocks"], unb["hit_blocks"])
    for policy in ("ttl_refresh", "ttl_fixed"):
        r = reference_simulate(mini, policy=policy, ttl_s=1e6)
        assert np.array_equal(r["hit_blocks"], unb["hit_blocks"])
    assert unb["max_occupancy"].tolist() == [n_unique]
    assert 0 < unb["token_hit_rate"] < 1


@pytest.mark.parametrize("policy", ["lru", "lru_plain"])
def test_lru_hits_monotone_in_capacity(mini, policy):
    # LRU inclusion: every block is touched whatever the capacity, so a bigger cache holds a superset
    prev = None
    for cap in (0, 5, 20, 80, 320, 2000):
        h = reference_simulate(mini, policy=policy, capacity_blocks=cap)["hit_blocks"]
        if prev is not None:
            assert np.all(h >= prev)
        prev = h


def test_ttl_refresh_hits_monotone_in_ttl(mini):
    prev = None
    for ttl in (0, 0.05, 0.5, 5, 50):
        h = reference_simulate(mini, policy="ttl_refresh", ttl_s=ttl)["hit_blocks"]
        if prev is not None:
            assert np.all(h >= prev)
        prev = h


def test_leaf_first_beats_plain_when_requests_exceed_capacity(mini):
    cap = 20  # below the longest request (31 blocks)
    leaf = reference_simulate(mini, policy="lru", capacity_blocks=cap)
    plain = reference_simulate(mini, policy="lru_plain", capacity_blocks=cap)
    assert leaf["hit_blocks"].sum() > plain["hit_blocks"].sum()


def test_argument_errors():
    w = wl([[A]])
    with pytest.raises(ValueError):
        reference_simulate(w, policy="lfu_perfect")
    with pytest.raises(ValueError):
        reference_simulate(w, policy="lru")  # no capacity
    with pytest.raises(ValueError):
        reference_simulate(w, policy="ttl_fixed")  # no ttl
    with pytest.raises(ValueError):
        reference_simulate(w, policy="lru", capacity_blocks=1, router="least_loaded")
    with pytest.raises(ValueError):
        reference_simulate(w, policy="lru", capacity_blocks=1, replicas=0)


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared Mooncake trace not present")
def test_shared_trace_runs_and_stays_prefix_closed():
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    r = reference_simulate(w, policy="lru", capacity_blocks=10_000, replicas=2)
    assert r["hit_blocks"].shape == (3993,)
    assert np.all(r["hit_tokens"] <= w.input_tokens)
    for contents in r["final_contents"]:
        check_prefix_closed(w, contents)

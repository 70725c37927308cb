"""Hand-worked examples pinning the plain-Python fleet reference (``tests/reference_fleet.py``).

These test the reference itself against hand computations of ``docs/fleet_semantics.md`` and the
router rules of :mod:`cacheresearch.routers`, never against the engine.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference import reference_simulate
from reference_fleet import reference_fleet, ring_nodes, route_one

from cacheresearch.routers import prefix_hash_u64
from cacheresearch.workload import Workload

A, B, C, D, E, X = 1, 2, 3, 4, 5, 99


def wl(keys, *, arrival_ms=None, block_tokens=4, input_tokens=None, output_tokens=None):
    return Workload.from_lists(keys, block_tokens=block_tokens, arrival_ms=arrival_ms, input_tokens=input_tokens,
                               output_tokens=output_tokens)


def random_workload(seed, n_req=40, pool=6, max_len=6, spread=3000):
    rng = np.random.default_rng(seed)
    keys = []
    for _ in range(n_req):
        root = int(rng.integers(pool))
        n = int(rng.integers(0, max_len + 1))
        keys.append([root * 1000 + j + 1 for j in range(n)])
    arr = np.sort(rng.integers(0, spread, n_req))
    return wl(keys, arrival_ms=arr, block_tokens=100, output_tokens=rng.integers(0, 300, n_req))


# ------------------------------------------------------------------------------ validation
def test_validation_errors():
    w = wl([[A], [B]])
    with pytest.raises(ValueError, match="router"):
        reference_fleet(w, policy="lru", capacity_blocks=4, router="nope")
    with pytest.raises(ValueError, match="view"):
        reference_fleet(w, policy="lru", capacity_blocks=4, view="psychic")
    with pytest.raises(ValueError, match="policy"):
        reference_fleet(w, policy="nosuch", capacity_blocks=4)
    with pytest.raises(ValueError, match="bits"):
        reference_fleet(w, policy="lru", capacity_blocks=4, router="random", bits=np.zeros((2, 3), np.uint32))
    with pytest.raises(ValueError, match="bits"):
        reference_fleet(w, policy="lru", capacity_blocks=4, router="random", bits=np.zeros((3, 4), np.uint32))
    with pytest.raises(ValueError, match="capacity"):
        reference_fleet(w, policy="lru")
    with pytest.raises(ValueError, match="replicas"):
        reference_fleet(w, policy="unbounded", replicas=0)


# ------------------------------------------------------------------------------ cache semantics
@pytest.mark.parametrize("policy,kw", [("lru", dict(capacity_blocks=5)), ("lru_plain", dict(capacity_blocks=5)),
                                       ("ttl_refresh", dict(ttl_s=0.5)), ("ttl_fixed", dict(ttl_s=0.5)),
                                       ("unbounded", {})])
@pytest.mark.parametrize("router", ["round_robin", "prefix_hash"])
def test_cache_semantics_equal_reference_py(policy, kw, router):
    w = random_workload(1)
    a = reference_fleet(w, policy=policy, replicas=3, router=router, prefix_blocks=2, **kw)
    b = reference_simulate(w, policy=policy, replicas=3, router=router, prefix_blocks=2, **kw)
    for k in ("hit_blocks", "hit_tokens", "replica", "max_occupancy"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["token_hit_rate"] == b["token_hit_rate"]
    assert a["request_hit_rate"] == b["request_hit_rate"]
    # hits on the chosen replica are its precise match; the precise view's match is the precise one
    np.testing.assert_array_equal(a["hit_blocks"], a["precise_match"][np.arange(w.n_requests), a["replica"]])
    np.testing.assert_array_equal(a["match"], a["precise_match"])


# ------------------------------------------------------------------------------ queue model
def test_fcfs_ttft_three_requests_together():
    # one replica, 1000 tokens/s prefill, three 500-token requests at t=0, no shared keys:
    # prefill 500 ms each; starts 0, 500, 1000; TTFT 500, 1000, 1500
    w = wl([[A], [B], [C]], arrival_ms=[0, 0, 0], input_tokens=[500, 500, 500])
    r = reference_fleet(w, policy="unbounded", prefill_tps=1000)
    assert r["ttft_ms"].tolist() == [500, 1000, 1500]
    assert r["start_ms"].tolist() == [0, 500, 1000]
    assert r["loads"][:, 0].tolist() == [0, 1, 2]  # finish > now for the earlier ones
    assert r["busy_ms"].tolist() == [1500]
    assert r["utilisation"].tolist() == [1.0]
    assert r["ttft_p50_ms"] == 1000 and r["ttft_p90_ms"] == 1500 and r["ttft_p99_ms"] == 1500
    assert r["ttft_mean_ms"] == pytest.approx(1000.0)


def test_fcfs_hits_shorten_prefill_and_idle_gaps():
    # block 100 tokens; request 1 hits 2 blocks (200 tokens) of request 0's 300
    w = wl([[A, B, C], [A, B, D], [X]], arrival_ms=[0, 100, 5000], block_tokens=100, input_tokens=[300, 300, 50])
    r = reference_fleet(w, policy="unbounded", prefill_tps=1000)
    assert r["hit_tokens"].tolist() == [0, 200, 0]
    # r0: start 0, prefill 300, finish 300. r1 at 100: waits to 300, prefill 100 -> ttft 300
    # r2 at 5000: idle server, prefill 50
    assert r["ttft_ms"].tolist() == [300, 300, 50]
    assert r["finish_ms"].tolist() == [300, 400, 5050]
    assert r["loads"][:, 0].tolist() == [0, 1, 0]
    assert r["busy_ms"].tolist() == [450]
    # horizon = max(busy end 5050, last arrival 5000) - first arrival 0
    assert r["horizon_ms"] == 5050
    assert r["utilisation"][0] == pytest.approx(450 / 5050)


def test_prefill_and_decode_rounding():
    # uncached 1001 tokens at 3 tok/s: 333 * 1000 + ceil(2 * 1000 / 3) = 333000 + 667
    # decode 1500 tokens at 7 us: 1 * 7 + ceil(500 * 7 / 1000) = 7 + 4
    w = wl([[A], [B]], arrival_ms=[0, 0], input_tokens=[1001, 0], output_tokens=[1500, 0])
    r = reference_fleet(w, policy="unbounded", prefill_tps=3, decode_us_per_token=7)
    assert r["prefill_ms"].tolist() == [333667, 0]
    assert r["decode_ms"].tolist() == [11, 0]
    # TTFT excludes own decode, the next request waits for it; finish is exclusive
    assert r["ttft_ms"].tolist() == [333667, 333678]
    assert r["finish_ms"].tolist() == [333678, 333678]
    assert r["busy_ms"].tolist() == [333678]


def test_finish_is_exclusive():
    w = wl([[A], [B], [C]], arrival_ms=[0, 500, 501], input_tokens=[500, 1, 1])
    r = reference_fleet(w, policy="unbounded", prefill_tps=1000)
    # request 0 finishes at 500: not in flight at 500; request 1 finishes at 501: not in flight at 501
    assert r["loads"][:, 0].tolist() == [0, 0, 0]
    assert r["ttft_ms"].tolist() == [500, 1, 1]


def test_nearest_rank_percentiles():
    # ten 100-token requests at t=0 on one replica at 1000 tok/s: TTFT 100, 200, ..., 1000
    w = wl([[k] for k in range(1, 11)], arrival_ms=[0] * 10, input_tokens=[100] * 10)
    r = reference_fleet(w, policy="unbounded", prefill_tps=1000)
    assert r["ttft_ms"].tolist() == list(range(100, 1001, 100))
    # indices ceil(50*10/100)-1 = 4, ceil(90*10/100)-1 = 8, ceil(99*10/100)-1 = 9
    assert (r["ttft_p50_ms"], r["ttft_p90_ms"], r["ttft_p99_ms"]) == (500, 900, 1000)
    assert r["ttft_mean_ms"] == pytest.approx(550.0)
    # N = 3: p50 index ceil(1.5)-1 = 1, p90 index ceil(2.7)-1 = 2
    w3 = wl([[1], [2], [3]], arrival_ms=[0] * 3, input_tokens=[100] * 3)
    r3 = reference_fleet(w3, policy="unbounded", prefill_tps=1000)
    assert (r3["ttft_p50_ms"], r3["ttft_p90_ms"], r3["ttft_p99_ms"]) == (200, 300, 300)


# ------------------------------------------------------------------------------ routers
def test_least_loaded_alternates_between_two_replicas():
    w = wl([[k] for k in range(1, 7)], arrival_ms=[0] * 6, input_tokens=[1000] * 6)
    r = reference_fleet(w, policy="unbounded", replicas=2, router="least_loaded", prefill_tps=1000)
    assert r["replica"].tolist() == [0, 1, 0, 1, 0, 1]
    assert r["loads"].tolist() == [[0, 0], [1, 0], [1, 1], [2, 1], [2, 2], [3, 2]]
    assert r["ttft_ms"].tolist() == [1000, 1000, 2000, 2000, 3000, 3000]
    assert r["load_imbalance"] == pytest.approx(1.0)
    # tie-break rotation: bits[0] = 2**31 -> off = 1 with R = 2: replica 1 wins ties
    bits = np.zeros((6, 4), np.uint32)
    bits[:, 0] = 2**31
    r = reference_fleet(w, policy="unbounded", replicas=2, router="least_loaded", prefill_tps=1000, bits=bits)
    assert r["replica"].tolist() == [1, 0, 1, 0, 1, 0]


def test_random_round_robin_prefix_hash():
    w = wl([[A, B, C], [A, B, D], [X], []])
    bits = np.zeros((4, 4), np.uint32)
    bits[:, 0] = [0, 2**32 - 1, 2**31, 3 * 2**30]
    r = reference_fleet(w, policy="unbounded", replicas=4, router="random", bits=bits)
    assert r["replica"].tolist() == [0, 3, 2, 3]
    r = reference_fleet(w, policy="unbounded", replicas=3, router="round_robin")
    assert r["replica"].tolist() == [0, 1, 2, 0]
    r = reference_fleet(w, policy="unbounded", replicas=5, router="prefix_hash", prefix_blocks=2)
    assert r["replica"].tolist() == [prefix_hash_u64(B) % 5, prefix_hash_u64(B) % 5, prefix_hash_u64(X) % 5,
                                     prefix_hash_u64(0) % 5]


def test_power_of_two():
    # R = 4: a = floor(bits1 * 4 / 2**32) = 2; b = (2 + 1 + floor(bits2 * 3 / 2**32)) mod 4
    w = wl([[A], [B], [C]], arrival_ms=[0, 0, 0], input_tokens=[1000] * 3)
    bits = np.zeros((3, 4), np.uint32)
    bits[:, 1] = 2**31
    bits[:, 2] = [0, 0, 2**32 - 1]  # b = 3, 3, (3 + 2) mod 4 = 1
    r = reference_fleet(w, policy="unbounded", replicas=4, router="power_of_two", bits=bits, prefill_tps=1000)
    # req 0: q all 0 -> a = 2 (b not strictly less). req 1: q[2] = 1 > q[3] = 0 -> 3. req 2: q[1] = 0 < 1 -> 1
    assert r["replica"].tolist() == [2, 3, 1]
    r1 = reference_fleet(w, policy="unbounded", replicas=1, router="power_of_two", bits=bits)
    assert r1["replica"].tolist() == [0, 0, 0]


def test_chwbl_first_node_clockwise_and_bounded_loads():
    R, V = 3, 5
    nodes = ring_nodes(R, V)
    assert nodes[0] == (prefix_hash_u64(0), 0, 0) and nodes[V + 2] == (prefix_hash_u64((1 << 32) | 2), 1, 2)
    # empty fleet: the first node clockwise from the key's point
    w = wl([[A, B]])
    h = prefix_hash_u64(B)
    want = min(nodes, key=lambda t: ((t[0] - h) % 2**32, t[1], t[2]))[1]
    r = reference_fleet(w, policy="unbounded", replicas=R, router="chwbl", vnodes=V)
    assert r["replica"].tolist() == [want]
    # many requests of one prefix at once: the bound spreads them; never more than cap after assignment
    n_req = 30
    w = wl([[A, B]] * n_req, arrival_ms=[0] * n_req, input_tokens=[1000] * n_req)
    for c_pct in (100, 125, 200):
        r = reference_fleet(w, policy="unbounded", replicas=R, router="chwbl", vnodes=V, chwbl_c_pct=c_pct,
                            prefill_tps=1000)
        for i in range(n_req):
            q = r["loads"][i]
            cap = -(-(c_pct * (int(q.sum()) + 1)) // (100 * R))
            assert q[r["replica"][i]] + 1 <= cap
        assert r["replica"][0] == want
        counts = np.bincount(r["replica"], minlength=R)
        assert counts.max() <= -(-(c_pct * n_req) // (100 * R))
    # c = 100%: perfectly balanced
    assert np.bincount(r["replica"], minlength=R).tolist() != [n_req, 0, 0]
    r = reference_fleet(w, policy="unbounded", replicas=R, router="chwbl", vnodes=V, chwbl_c_pct=100,
                        prefill_tps=1000)
    assert np.bincount(r["replica"], minlength=R).tolist() == [10, 10, 10]


def test_cache_aware_imbalance_branch():
    # every request shares [A, B]; arrivals together so queues grow; balance_abs = 1
    w = wl([[A, B]] * 5, arrival_ms=[0] * 5, input_tokens=[1000] * 5)
    kw = dict(policy="unbounded", replicas=2, router="cache_aware", prefill_tps=1000, balance_rel_pct=150)
    r = reference_fleet(w, balance_abs=1, **kw)
    # 0: q [0,0], no match -> miss -> least loaded 0
    # 1: q [1,0], diff 1 not > 1; match [2,0] -> 2000 > 300*2 -> cache hit 0
    # 2: q [2,0], diff 2 > 1 and 200 > 0 -> imbalanced -> least loaded 1
    # 3: q [2,1], diff 1; match [2,2] tie -> off 0 -> 0
    # 4: q [3,1], imbalanced -> 1
    assert r["replica"].tolist() == [0, 0, 1, 0, 1]
    assert r["loads"].tolist() == [[0, 0], [1, 0], [2, 0], [2, 1], [3, 1]]
    r = reference_fleet(w, balance_abs=64, **kw)
    assert r["replica"].tolist() == [0] * 5  # never imbalanced enough: always the cache hit
    # overflow_share: requests 1..4 have max M = 2; only request 2 went where M = 0
    r = reference_fleet(w, balance_abs=1, **kw)
    assert r["overflow_share"] == pytest.approx(1 / 4)  # qualifying: requests 1..4; left: request 2


def test_cache_aware_threshold_and_smallest_tree():
    # replica 0 holds a 4-block chain; request [A, X, X2, X3] matches 1 of 4 blocks: 1000 > 300 * 4 false
    w = wl([[A, B, C, D], [E], [A, 11, 12, 13]], arrival_ms=[0, 10_000, 20_000])
    kw = dict(policy="unbounded", replicas=2, prefill_tps=1000)
    r = reference_fleet(w, router="cache_aware", **kw)
    # 0 -> miss -> ll 0; 1 -> miss, queues empty -> 0; 2 -> match [1, 0], miss -> least loaded (tie) -> 0
    assert r["replica"].tolist() == [0, 0, 0]
    r = reference_fleet(w, router="cache_aware", miss_smallest_tree=True, **kw)
    # 1: tree sizes [4, 0] -> 1; 2: tree sizes [4, 1] -> 1
    assert r["replica"].tolist() == [0, 1, 1]
    assert r["tree_size"].tolist() == [[0, 0], [4, 0], [4, 1]]
    # threshold 200 pm: 1000 * 1 > 200 * 4: hit on replica 0
    r = reference_fleet(w, router="cache_aware", miss_smallest_tree=True, cache_threshold_pm=200, **kw)
    assert r["replica"].tolist() == [0, 1, 0]


def test_kv_cost_greedy_and_sampled():
    # replica 0 holds [A, B, C]; request 1 [A, B, D] arrives while request 0 (3 blocks) is in flight
    w = wl([[A, B, C], [A, B, D], [A, B, D]], arrival_ms=[0, 0, 0], input_tokens=[1000] * 3)
    kw = dict(policy="unbounded", replicas=2, router="kv_cost", prefill_tps=1000)
    r = reference_fleet(w, **kw)
    # 0: cost [300, 300] -> tie off 0 -> 0. 1: cost [100*1 + 100*3, 100*3 + 0] = [400, 300] -> 1
    # 2: match [2, 3], active [3, 3]: cost [100 + 300, 0 + 300] -> 1
    assert r["replica"].tolist() == [0, 1, 1]
    assert r["active_blocks"].tolist() == [[0, 0], [3, 0], [3, 3]]
    r = reference_fleet(w, overlap_weight_pct=1000, **kw)
    # 1: cost [1000 + 300, 3000] -> 0; 2: active [6, 0], match [2, 0]: [1000 + 600, 3000] -> 0
    assert r["replica"].tolist() == [0, 0, 0]
    # temperature: equal costs give p = [0.5, 0.5]; u = (bits3 >> 8) / 2**24; first r with cumsum > u
    w1 = wl([[A]])
    for b3, want in [(0, 0), ((2**23 - 1) << 8, 0), (2**31, 1), (2**32 - 1, 1)]:
        bits = np.array([[0, 0, 0, b3]], np.uint32)
        r = reference_fleet(w1, policy="unbounded", replicas=2, router="kv_cost", temperature=1.0, bits=bits)
        assert r["replica"].tolist() == [want], b3
    # costs [0, 100] at t = 1: z = [0, -1]; p0 = 1 / (1 + e^-1) = 0.7311
    fleet = dict(i=0, n=1, prefix_key=A, R=2, match=[1, 0], queue=[0, 0], active_blocks=[0, 0], tree_size=[0, 0],
                 ring=None)
    kn = dict(overlap_weight_pct=100, temperature=1.0)
    assert route_one("kv_cost", bits=[0, 0, 0, int(0.73 * 2**24) << 8], kn=kn, **fleet) == 0
    assert route_one("kv_cost", bits=[0, 0, 0, int(0.74 * 2**24) << 8], kn=kn, **fleet) == 1
    # temperature 0 (and tiny temperatures that are 0 in float32): greedy
    assert route_one("kv_cost", bits=[0, 0, 0, 2**32 - 1], kn=dict(kn, temperature=1e-50), **fleet) == 0


def test_weighted_scorers():
    fleet = dict(i=0, n=4, prefix_key=A, R=3, tree_size=[0] * 3, ring=None, active_blocks=[0] * 3)
    kn = dict(prefix_weight_pct=200, load_weight_pct=100, queue_threshold=128)
    # prefix floor(1024 m / 4); load floor(512 (128 - min(q, 128)) / 128)
    # r0: m 4 q 100 -> 200*1024 + 100*112 ; r1: m 2 q 0 -> 200*512 + 100*512 ; r2: m 0 q 0 -> 100*512
    assert route_one("weighted_scorers", bits=[0] * 4, match=[4, 2, 0], queue=[100, 0, 0], kn=kn, **fleet) == 0
    # prefix weight 0: load only; tie r1/r2 broken by rotation off = floor(bits0 * 3 / 2**32)
    kn0 = dict(kn, prefix_weight_pct=0)
    assert route_one("weighted_scorers", bits=[0] * 4, match=[4, 2, 0], queue=[100, 0, 0], kn=kn0, **fleet) == 1
    # off = floor(2**31 * 3 / 2**32) = 1: rotation order 1, 2, 0 -> r1; off = floor(3 * 2**30 * 3 / 2**32) = 2 -> r2
    assert route_one("weighted_scorers", bits=[2**31, 0, 0, 0], match=[4, 2, 0], queue=[100, 0, 0], kn=kn0,
                     **fleet) == 1
    assert route_one("weighted_scorers", bits=[3 * 2**30, 0, 0, 0], match=[4, 2, 0], queue=[100, 0, 0], kn=kn0,
                     **fleet) == 2
    # queue beyond T saturates at 0 load score; n = 0 gives prefix score 0
    assert route_one("weighted_scorers", bits=[0] * 4, match=[0, 0, 0], queue=[500, 128, 127], kn=kn,
                     **dict(fleet, n=0)) == 2


def test_preble_e2():
    fleet = dict(i=0, prefix_key=A, R=3, tree_size=[0] * 3, ring=None)
    kn = dict(preble_rel_pct=150, preble_abs=8)
    # exploit: m* = 3 > 0 and n - m* = 1 < 3: least active_blocks among r with m = m*
    assert route_one("preble_e2", bits=[0] * 4, n=4, match=[3, 3, 0], queue=[1, 1, 0], active_blocks=[9, 5, 0],
                     kn=kn, **fleet) == 1
    # explore: m* = 2, n - m* = 2 not < 2: argmin(active + n - match) = [9+2, 5+2, 0+4] -> 2
    assert route_one("preble_e2", bits=[0] * 4, n=4, match=[2, 2, 0], queue=[1, 1, 0], active_blocks=[9, 5, 0],
                     kn=kn, **fleet) == 2
    # rebalance: queues [20, 10, 11]: 2000 > 1500 and 10 > 8 -> least loaded 1
    assert route_one("preble_e2", bits=[0] * 4, n=4, match=[3, 3, 0], queue=[20, 10, 11], active_blocks=[9, 5, 0],
                     kn=kn, **fleet) == 1
    # absolute guard: queues [9, 1, 1]: 900 > 150 but 8 not > 8 -> exploit 1
    assert route_one("preble_e2", bits=[0] * 4, n=4, match=[3, 3, 0], queue=[9, 1, 1], active_blocks=[9, 5, 0],
                     kn=kn, **fleet) == 1


# ------------------------------------------------------------------------------ views and instances
def test_stale_view_lags_true_cache():
    w = wl([[A, B]] * 4, arrival_ms=[0, 500, 1000, 1999])
    r = reference_fleet(w, policy="unbounded", view="stale", stale_lag_ms=1000)
    # syncs at 0 (empty) and 1000 (after requests 0, 1); 1999 - 1000 < 1000: no sync
    assert r["match"][:, 0].tolist() == [0, 0, 2, 2]
    assert r["precise_match"][:, 0].tolist() == [0, 2, 2, 2]
    assert r["hit_blocks"].tolist() == [0, 2, 2, 2]  # hits always use the true cache
    # lag 0: a sync before every request = precise
    r = reference_fleet(w, policy="unbounded", view="stale", stale_lag_ms=0)
    np.testing.assert_array_equal(r["match"], r["precise_match"])


def test_stale_view_ttl_uses_snapshot_times():
    # ttl 300 ms, refresh. Syncs at 0 (empty) and 200 (A stamped 0, before request 1 refreshes it).
    # At 350: no sync (150 < 200); snapshot time 0 -> 350 > 300: expired in the view;
    # the true cache has A refreshed at 200 -> live.
    w = wl([[A], [A], [A]], arrival_ms=[0, 200, 350])
    r = reference_fleet(w, policy="ttl_refresh", ttl_s=0.3, view="stale", stale_lag_ms=200)
    assert r["match"][:, 0].tolist() == [0, 1, 0]
    assert r["precise_match"][:, 0].tolist() == [0, 1, 1]


def test_approximate_index_small_capacity_forgets():
    w = wl([[A, B, C], [A, B, C], [D], [A, B, C]])
    r = reference_fleet(w, policy="lru", capacity_blocks=100, view="approximate", index_capacity=2)
    # index after 0: touch C, B, A -> evict C -> {B, A}; request 1 matches 2 of 3
    # after 1: [B, A] + C, B, A -> [C, B, A] -> {B, A}; after 2: [B, A, D] -> {A, D}; request 3 matches 1
    assert r["match"][:, 0].tolist() == [0, 2, 0, 1]
    assert r["precise_match"][:, 0].tolist() == [0, 3, 0, 3]
    assert r["tree_size"][:, 0].tolist() == [0, 2, 2, 2]
    r = reference_fleet(w, policy="lru", capacity_blocks=100, view="approximate")
    assert r["match"][:, 0].tolist() == [0, 3, 0, 3]
    assert r["tree_size"][:, 0].tolist() == [0, 3, 3, 4]


def test_approximate_index_is_per_instance():
    w = wl([[A, B], [A, B], [A, B], [A, B]])
    r = reference_fleet(w, policy="unbounded", view="approximate", instances=2)
    # instance 0 routes requests 0, 2; instance 1 routes 1, 3
    assert r["instance"].tolist() == [0, 1, 0, 1]
    assert r["match"][:, 0].tolist() == [0, 0, 2, 2]
    assert r["precise_match"][:, 0].tolist() == [0, 2, 2, 2]


def test_local_load_counts_own_instance_only():
    w = wl([[k] for k in range(1, 5)], arrival_ms=[0] * 4, input_tokens=[1000] * 4)
    kw = dict(policy="unbounded", replicas=2, router="least_loaded", instances=2, prefill_tps=1000)
    r = reference_fleet(w, **kw)
    assert r["replica"].tolist() == [0, 1, 0, 1]
    r = reference_fleet(w, local_load=True, **kw)
    # instance 0 sees only requests 0, 2; instance 1 only 1, 3: both start at replica 0
    assert r["loads"].tolist() == [[0, 0], [0, 0], [1, 0], [1, 0]]
    assert r["replica"].tolist() == [0, 0, 1, 1]


# ------------------------------------------------------------------------------ metrics
def test_prefix_copies_overflow_share_imbalance():
    w = wl([[A, B]] * 4 + [[]], arrival_ms=[0, 1000, 2000, 3000, 4000], input_tokens=[100] * 4 + [0])
    r = reference_fleet(w, policy="unbounded", replicas=2, router="round_robin", prefill_tps=1000, prefix_blocks=5)
    # copies of key B at arrival: 0, 1, 2, 2 (the empty request is not sampled)
    assert r["prefix_copies"] == pytest.approx(5 / 4)
    # qualifying (max M > 0): requests 1, 2, 3; request 1 went to replica 1 with M = 0
    assert r["overflow_share"] == pytest.approx(1 / 3)
    # busy: replica 0 serves 0, 2, 4 (100 + 92 + 0), replica 1 serves 1, 3 (100 + 92): a hit is 2 blocks = 8 tokens
    assert r["hit_tokens"].tolist() == [0, 0, 8, 8, 0]
    assert r["busy_ms"].tolist() == [100 + 92, 100 + 92]
    assert r["load_imbalance"] == pytest.approx(1.0)
    z = reference_fleet(wl([[], []], input_tokens=[0, 0]), policy="unbounded", replicas=3)
    assert z["load_imbalance"] == 1.0 and z["prefix_copies"] == 0.0 and z["overflow_share"] == 0.0


def test_load_imbalance_ratio():
    w = wl([[A], [B], [C]], arrival_ms=[0, 0, 0], input_tokens=[300, 100, 200])
    r = reference_fleet(w, policy="unbounded", replicas=3, router="round_robin", prefill_tps=1000)
    assert r["busy_ms"].tolist() == [300, 100, 200]
    assert r["load_imbalance"] == pytest.approx(300 / 200)
    assert r["utilisation"].tolist() == pytest.approx([1.0, 1 / 3, 2 / 3])


# ------------------------------------------------------------------------------ routers.route twin
def test_route_one_matches_routers_route_on_random_fleets():
    """The reference's router rules equal :func:`cacheresearch.routers.route` (the JAX rule itself, not
    the engine) on random fleet states, for every router."""
    from typing import NamedTuple

    import jax
    import jax.numpy as jnp

    from cacheresearch import routers as rt

    class P(NamedTuple):
        chwbl_c_pct: jax.Array
        vnodes: jax.Array
        balance_abs: jax.Array
        balance_rel_pct: jax.Array
        cache_threshold_pm: jax.Array
        miss_smallest_tree: jax.Array
        overlap_weight_pct: jax.Array
        temperature: jax.Array
        queue_threshold: jax.Array
        prefix_weight_pct: jax.Array
        load_weight_pct: jax.Array
        preble_rel_pct: jax.Array
        preble_abs: jax.Array
        gie_prefix_mode: jax.Array
        gie_prefix_w_pct: jax.Array
        gie_kv_w_pct: jax.Array
        gie_queue_w_pct: jax.Array
        gie_window_blocks: jax.Array
        gie_load_w_pct: jax.Array
        gie_load_threshold: jax.Array
        gie_active_w_pct: jax.Array
        capacity: jax.Array

    rng = np.random.default_rng(7)
    Rmax, V, S = 6, 16, 200
    cases = []
    for s in range(S):
        R = int(rng.integers(1, Rmax + 1))
        n = int(rng.integers(0, 12))
        qhi = int(rng.choice([3, 12, 100]))
        kn = dict(
            chwbl_c_pct=int(rng.choice([100, 125, 200])), vnodes=int(rng.integers(1, V + 1)),
            balance_abs=int(rng.choice([0, 2, 64])), balance_rel_pct=int(rng.choice([100, 150])),
            cache_threshold_pm=int(rng.choice([0, 300, 700])), miss_smallest_tree=bool(rng.integers(2)),
            overlap_weight_pct=int(rng.choice([0, 100, 250])), temperature=float(rng.choice([0.0, 0.3, 2.0])),
            queue_threshold=int(rng.choice([1, 5, 128])), prefix_weight_pct=int(rng.choice([0, 200])),
            load_weight_pct=int(rng.choice([0, 100])), preble_rel_pct=int(rng.choice([100, 150])),
            preble_abs=int(rng.choice([0, 2, 8])), gie_prefix_mode=int(rng.integers(0, 3)),
            gie_prefix_w_pct=int(rng.choice([0, 100, 300])), gie_kv_w_pct=int(rng.choice([0, 100, 200])),
            gie_queue_w_pct=int(rng.choice([0, 100, 200])), gie_window_blocks=int(rng.choice([0, 2, 5])),
            gie_load_w_pct=int(rng.choice([0, 100])), gie_load_threshold=int(rng.choice([1, 4, 128])),
            capacity=int(rng.choice([60, 40_000, 2**31 - 1])),
            gie_active_w_pct=int(rng.choice([0, 100, 300])),  # no active_req in the fleet: the queue is counted
        )
        m = [int(rng.integers(0, n + 1)) for _ in range(R)]
        q = [int(rng.integers(0, qhi)) for _ in range(R)]
        a = [int(rng.integers(0, 5 * qhi)) for _ in range(R)]
        t = [int(rng.integers(0, 50)) for _ in range(R)]
        bits = [int(x) for x in rng.integers(0, 2**32, 4, dtype=np.uint64)]
        key = int(rng.integers(0, 2**63))
        cases.append((R, n, kn, m, q, a, t, bits, key, s))

    def pad(v):
        return v + [0] * (Rmax - len(v))

    ring = rt.ring_positions(Rmax, V)
    names = list(rt.ROUTERS)
    rows = [(name, c) for name in names for c in cases]
    req = rt.RequestView(
        index=jnp.array([c[9] for _, c in rows], jnp.int32),
        arrival_ms=jnp.zeros(len(rows), jnp.int32),
        n_blocks=jnp.array([c[1] for _, c in rows], jnp.int32),
        prefix_hi=jnp.array([c[8] >> 32 for _, c in rows], jnp.uint32),
        prefix_lo=jnp.array([c[8] & 0xFFFFFFFF for _, c in rows], jnp.uint32),
        bits=jnp.array([c[7] for _, c in rows], jnp.uint32),
        instance=jnp.zeros(len(rows), jnp.int32),
    )
    fleet = rt.FleetView(
        replicas=jnp.array([c[0] for _, c in rows], jnp.int32),
        match=jnp.array([pad(c[3]) for _, c in rows], jnp.int32),
        queue=jnp.array([pad(c[4]) for _, c in rows], jnp.int32),
        active_blocks=jnp.array([pad(c[5]) for _, c in rows], jnp.int32),
        tree_size=jnp.array([pad(c[6]) for _, c in rows], jnp.int32),
    )
    params = P(**{
        f: jnp.array([c[2][f] for _, c in rows], jnp.float32 if f == "temperature" else
                     (jnp.bool_ if f == "miss_smallest_tree" else jnp.int32))
        for f in P._fields
    })
    rid = jnp.array([rt.ROUTERS[name] for name, _ in rows], jnp.int32)
    got = np.asarray(jax.jit(jax.vmap(lambda r, q, f, p: rt.route(r, q, f, p, ring)))(rid, req, fleet, params))
    bad = []
    for j, (name, (R, n, kn, m, q, a, t, bits, key, s)) in enumerate(rows):
        nodes = ring_nodes(R, kn["vnodes"]) if name == "chwbl" else None
        want = route_one(name, i=s, n=n, prefix_key=key, bits=bits, R=R, match=m, queue=q, active_blocks=a,
                         tree_size=t, ring=nodes, kn=kn, capacity=kn["capacity"])
        if want != got[j]:
            bad.append((name, s, want, int(got[j])))
    assert not bad, bad[:10]


@pytest.mark.parametrize("view", ["precise", "approximate", "stale"])
@pytest.mark.parametrize("router", ["random", "round_robin", "prefix_hash", "least_loaded", "power_of_two", "chwbl",
                                    "cache_aware", "kv_cost", "weighted_scorers", "preble_e2", "gie"])
def test_invariants_every_router_and_view(router, view):
    w = random_workload(3, n_req=30, spread=400)
    bits = np.random.default_rng(5).integers(0, 2**32, (w.n_requests, 4), dtype=np.uint64).astype(np.uint32)
    for policy, kw in (("lru", dict(capacity_blocks=8)), ("ttl_fixed", dict(ttl_s=0.2))):
        r = reference_fleet(w, policy=policy, replicas=3, router=router, view=view, bits=bits, instances=2,
                            local_load=router == "least_loaded", index_capacity=6, stale_lag_ms=100,
                            prefill_tps=2000, decode_us_per_token=300, prefix_blocks=3, **kw)
        N = w.n_requests
        assert r["replica"].min() >= 0 and r["replica"].max() < 3
        np.testing.assert_array_equal(r["hit_blocks"], r["precise_match"][np.arange(N), r["replica"]])
        assert np.all(r["match"] <= w.n_blocks[:, None]) and np.all(r["loads"] >= 0)
        assert np.all(r["ttft_ms"] >= r["prefill_ms"])
        assert np.all(r["finish_ms"] == r["start_ms"] + r["prefill_ms"] + r["decode_ms"])
        assert r["busy_ms"].sum() == (r["prefill_ms"] + r["decode_ms"]).sum()
        assert r["ttft_p50_ms"] <= r["ttft_p90_ms"] <= r["ttft_p99_ms"] <= r["ttft_ms"].max()
        if view == "precise":
            np.testing.assert_array_equal(r["match"], r["precise_match"])
        if view == "approximate":
            assert np.all(r["tree_size"] <= 6)
        if policy == "lru":
            assert np.all(r["max_occupancy"] <= 8)


def test_empty_workload():
    w = Workload.from_lists([], block_tokens=4)
    r = reference_fleet(w, policy="unbounded", replicas=2, router="least_loaded", bits=np.zeros((0, 4), np.uint32))
    assert r["ttft_p50_ms"] == 0 and r["match"].shape == (0, 2) and r["token_hit_rate"] == 0.0
    assert r["load_imbalance"] == 1.0 and r["overflow_share"] == 0.0

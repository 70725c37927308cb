"""The plain-Python oracles of ``lfu``, ``length_aware`` and ``s3fifo`` (tests/reference.py).

Hand-worked examples (expected hits and contents derived from the definitions in reference.py's
docstring, step by step in the comments), properties on random workloads (hypothesis), and
cross-checks against libCacheSim on plain object streams (one block per request, where request
semantics coincide with per-object caching).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import S3FIFOCache, check_prefix_closed, reference_simulate

from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake

A, B, C, D, E, F, X, Y, Z = 1, 2, 3, 4, 5, 6, 90, 91, 92
P, Q, K = 10, 11, 12
NEW = ("lfu_perfect", "length_aware", "s3fifo_sosp")
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mini_mooncake.jsonl"


def wl(keys, *, block_tokens=4):
    return Workload.from_lists(keys, block_tokens=block_tokens)


def run(keys, policy, capacity, **kw):
    return reference_simulate(wl(keys), policy=policy, capacity_blocks=capacity, **kw)


def objects(seq):
    """A plain object stream: request i is the one block ``seq[i]``."""
    return Workload.from_lists([[int(k)] for k in seq], block_tokens=1)


# ------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("policy", NEW)
def test_new_policies_need_capacity(policy):
    with pytest.raises(ValueError):
        reference_simulate(wl([[A]]), policy=policy)
    with pytest.raises(ValueError):
        reference_simulate(wl([[A]]), policy=policy, capacity_blocks=-1)


@pytest.mark.parametrize("policy", NEW)
def test_capacity_zero_caches_nothing(policy):
    r = run([[A, B], [A, B]], policy, 0)
    assert r["hit_blocks"].tolist() == [0, 0]
    assert len(r["final_contents"][0]) == 0 and r["max_occupancy"].tolist() == [0]


@pytest.mark.parametrize("policy", NEW)
def test_lookup_happens_before_insertion(policy):
    assert run([[A, B, C]], policy, 10)["hit_blocks"].tolist() == [0]


# ------------------------------------------------------------------------------------ LFU
def test_lfu_hand_example_prefixes():
    # C=3. Scores (count, clock); the clock ticks per touch, leaf first.
    # r1 [A,B,C]: 0 hits; C(1,1) B(1,2) A(1,3).
    # r2 [A,B,D]: A, B present, D absent -> 2 hits; D(1,4) B(2,5) A(2,6); 4 > 3: evict C(1,1).
    # r3 [E]:     0 hits; E(1,7); evict the smallest of D(1,4), E(1,7), B, A -> D.
    # r4 [A,B,C]: A, B present, C absent -> 2 hits; counts A3 B3 C2 (C's count survived its
    #             eviction: perfect LFU); C(2,8) B(3,9) A(3,10); evict E(1,7).
    r = run([[A, B, C], [A, B, D], [E], [A, B, C]], "lfu_perfect", 3, debug=True)
    assert r["hit_blocks"].tolist() == [0, 2, 0, 2]
    assert r["final_contents"] == [{C: 2, B: 3, A: 3}]
    assert list(r["final_contents"][0]) == [C, B, A]  # eviction order: C, then B (less recent), A
    assert r["max_occupancy"].tolist() == [3]


def test_lfu_keeps_the_frequent_prefix_where_lru_drops_it():
    # C=4. r1-r3 [A,B]: hits 0, 2, 2; counts A3 B3; clocks B1 A2, B3 A4, B5 A6.
    # r4 [C,D]: 0 hits, D(1,7) C(1,8); 4 stored.
    # r5 [E,F]: 0 hits, F(1,9) E(1,10); 6 > 4: evict D(1,7), C(1,8) (count 1 before count 3).
    # r6 [A,B]: 2 hits. LRU instead evicted the least recent B, A at r5 and misses at r6.
    keys = [[A, B]] * 3 + [[C, D], [E, F], [A, B]]
    r = run(keys, "lfu_perfect", 4, debug=True)
    assert r["hit_blocks"].tolist() == [0, 2, 2, 0, 0, 2]
    assert r["final_contents"] == [{F: 1, E: 1, B: 4, A: 4}]
    assert list(r["final_contents"][0]) == [F, E, B, A]
    assert run(keys, "lru", 4)["hit_blocks"].tolist() == [0, 2, 2, 0, 0, 0]


def test_lfu_counts_survive_eviction_unlike_in_cache_lfu():
    # C=2, one block per request.
    # r1 A: miss, A1.  r2 A: hit, A2.  r3 B: miss, B1, stored {A, B}.
    # r4 C: miss, C1; evict the smallest of A(2), B(1, older), C(1) -> B.
    # r5 B: miss, B's count becomes 2 (history kept); evict C(1).  Stored A(2, r2), B(2, r5).
    # r6 C: miss, C2; all counts 2: evict the least recent, A.  (In-cache LFU would have C at 1
    #       and evict B.)
    # r7 A: miss here; a hit for in-cache LFU.  A3; evict B(2, r5) -> {C: 2, A: 3}.
    seq = [A, A, B, C, B, C, A]
    r = reference_simulate(objects(seq), policy="lfu_perfect", capacity_blocks=2)
    assert r["hit_blocks"].tolist() == [0, 1, 0, 0, 0, 0, 0]
    assert r["final_contents"] == [{C: 2, A: 3}]
    lcs = pytest.importorskip("libcachesim")
    cache = lcs.LFU(cache_size=2, hashpower=4)
    in_cache = [int(cache.get(lcs.Request(obj_id=k, obj_size=1))) for k in seq]
    assert in_cache == [0, 1, 0, 0, 0, 0, 1]  # libCacheSim's LFU is in-cache LFU: a different policy


def test_lfu_request_longer_than_capacity_keeps_its_head():
    # All five blocks count 1; the clock makes E the least recent, then D: both evicted.
    r = run([[A, B, C, D, E], [A, B, C, D, E]], "lfu_perfect", 3, debug=True)
    assert r["hit_blocks"].tolist() == [0, 3]
    assert r["final_contents"] == [{C: 2, B: 2, A: 2}]


# --------------------------------------------------------------------------- length_aware
def test_length_aware_hand_example():
    # C=3. r1 [A,B,C]: A0 B1 C2 (positions).  r2 [A,B,D]: 2 hits; D at position 2 is new, so 4 > 3:
    # evict the deepest, C (position 2, older than D).  r3 [E]: E0; evict D (position 2).
    # r4 [A,B,C]: 2 hits; C re-enters at position 2 and is itself the deepest: evicted.
    # Final, in eviction order: B (position 1), then position 0 by recency: E (r3), A (r4).
    r = run([[A, B, C], [A, B, D], [E], [A, B, C]], "length_aware", 3, debug=True)
    assert r["hit_blocks"].tolist() == [0, 2, 0, 2]
    assert r["final_contents"] == [{B: 1, E: 0, A: 0}]
    assert list(r["final_contents"][0]) == [B, E, A]


def test_length_aware_evicts_deep_blocks_that_lru_keeps():
    # C=3. r1 [A,B]: A0 B1.  r2 [X], r3 [Y]: at r3 4 > 3, evict B (deepest).
    # r4 [A,B]: 1 hit (A); B re-enters at position 1 and is evicted again (X, Y, A are at 0).
    # r5 [A,B]: 1 hit again.  LRU keeps B from r4 on (it evicts X at r4, Y at r5): 2 hits at r5.
    keys = [[A, B], [X], [Y], [A, B], [A, B]]
    r = run(keys, "length_aware", 3, debug=True)
    assert r["hit_blocks"].tolist() == [0, 0, 0, 1, 1]
    assert r["final_contents"] == [{X: 0, Y: 0, A: 0}]
    assert run(keys, "lru", 3)["hit_blocks"].tolist() == [0, 0, 0, 1, 2]


def test_length_aware_position_from_the_most_recent_request():
    # Not chained: K sits at position 2 in r1 and at position 0 in r2.  C=3.
    # r1 [P,Q,K]: P0 Q1 K2.  r2 [K]: 1 hit; K now has position 0.  r3 [Z]: 4 > 3: the deepest is Q
    # (position 1); had K kept position 2, K would go.  Final by recency at position 0: P, K, Z.
    r = run([[P, Q, K], [K], [Z]], "length_aware", 3)
    assert r["hit_blocks"].tolist() == [0, 1, 0]
    assert r["final_contents"] == [{P: 0, K: 0, Z: 0}]


# --------------------------------------------------------------------------------- S3-FIFO
def test_s3fifo_sizes():
    for cap, (s, m) in {0: (0, 0), 1: (1, 0), 3: (1, 2), 9: (1, 8), 10: (1, 9), 19: (1, 18), 20: (2, 18),
                        105: (10, 95)}.items():
        c = S3FIFOCache(cap)
        assert (c.small_capacity, c.main_capacity, c.ghost_capacity) == (s, m, m)


def test_s3fifo_hand_example_ghost_and_promotion():
    # C=3: cS=1, cM=2, cG=2.  Queues written tail (oldest) -> head.
    # r1 A, r2 B, r3 C: misses, S=[A,B,C] (no warm-up rule: S may exceed cS while nothing is evicted).
    # r4 D: S=[A,B,C,D], 4 > 3, |S| > cS: EVICT_S drops A (freq 0), G=[A].
    # r5 A: miss; A is in G -> head of M, G=[]; S=[B,C,D] M=[A]; 4 > 3, |S|=3 > 1: drop B, G=[B].
    # r6 C, r7 C: hits, C.freq 1 then 2.
    # r8 E: S=[C,D,E] M=[A]; EVICT_S: C.freq 2 > 1 -> head of M with freq 0, M=[A,C] (2 <= cM);
    #       the loop goes on: D.freq 0 -> dropped, G=[B,D].  S=[E], 3 stored.
    # r9 B: miss; B in G -> M=[A,C,B], G=[D]; 4 > 3, |S|=1 = cS: EVICT_M: A.freq 0 -> dropped
    #       (a block leaving M does not enter G).
    # r10 A: miss, A not in G -> S=[E,A]; |S|=2 > 1: E dropped, G=[D,E].
    seq = [A, B, C, D, A, C, C, E, B, A]
    r = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=3)
    assert r["hit_blocks"].tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert r["final_contents"] == [{A: ("S", 0), C: ("M", 0), B: ("M", 0)}]
    assert list(r["final_contents"][0]) == [A, C, B]
    assert r["s3fifo_ghost"] == [[D, E]]
    assert r["max_occupancy"].tolist() == [3]


def test_s3fifo_promotion_needs_two_hits():
    # C=3. r1 A; r2 A (hit, freq 1); r3 B; r4 C: S=[A,B,C]; r5 D: EVICT_S at A: freq 1 is not > 1
    # (Algorithm 1), so A is dropped into G.  With move_to_main_threshold=1 (promote when freq > 0)
    # A moves to M instead and B (freq 0) is dropped.
    seq = [A, A, B, C, D]
    r = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=3)
    assert r["hit_blocks"].tolist() == [0, 1, 0, 0, 0]
    assert r["final_contents"] == [{B: ("S", 0), C: ("S", 0), D: ("S", 0)}] and r["s3fifo_ghost"] == [[A]]
    c = S3FIFOCache(3, move_to_main_threshold=1)
    for k in seq:
        c.access([k])
        c.evict()
    assert c.contents() == {C: ("S", 0), D: ("S", 0), A: ("M", 0)} and list(c.ghost) == [B]


def test_s3fifo_main_reinsertion_and_ghost_hit_into_main():
    # C=3 (cS=1, cM=2, cG=2).
    # r1-r4 A,B,C,D: A dropped at r4, G=[A], S=[B,C,D].
    # r5 A: G hit -> M=[A]; drop B, G=[B].  r6 A: hit, A.freq 1.
    # r7 E: S=[C,D,E]; drop C, G=[B,C].  r8 B: G hit -> M=[A,B], G=[C]; |S|=2 > 1: drop D, G=[C,D].
    # r9 F: S=[E,F]; drop E, G=[D,E] (C falls off G: cG=2).  r10 C: C not in G -> S=[F,C]; drop F,
    # G=[E,F].  r11 E: G hit -> M=[A,B,E], G=[F]; |S|=1 = cS, so EVICT_M: A.freq 1 > 0 -> reinserted
    # at the head with freq 0, M=[B,E,A]; B.freq 0 -> dropped.  (Algorithm 1, evicting before the
    # insertion, would test |S| = 1 >= 10% of 3 and drop C from S instead: choice (1) of the spec.)
    seq = [A, B, C, D, A, A, E, B, F, C, E]
    r = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=3)
    assert r["hit_blocks"].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert r["final_contents"] == [{C: ("S", 0), E: ("M", 0), A: ("M", 0)}]
    assert r["s3fifo_ghost"] == [[F]]


def test_s3fifo_frequency_caps_at_three_and_buys_three_passes():
    # C=2: cS=1, cM=1, cG=1.
    # r1 A, r2 B: S=[A,B].  r3 C: S=[A,B,C], drop A, G=[A].  r4 A: G hit -> M=[A]; |S|=2 > 1: drop B,
    # G=[B].  r5-r7 A: hits, A.freq 1, 2, 3.  State: S=[C], M=[A(3)], G=[B].
    # r8 B: G hit -> M=[A,B]; |S|=1 = cS: EVICT_M: A.freq 3 -> reinserted with 2; B (freq 0) dropped.
    # r9 D: S=[C,D]: drop C, G=[C].  r10 C: G hit -> M=[A,C]: A 2 -> 1, C dropped.
    # r11 E: drop D, G=[D].  r12 D: G hit -> M=[A,D]: A 1 -> 0, D dropped.
    # r13 A: still cached (a cap of 2 would have dropped it at r12): a hit, A.freq 1.
    seq = [A, B, C, A, A, A, A, B, D, C, E, D, A]
    r = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=2)
    assert r["hit_blocks"].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1]
    assert r["final_contents"] == [{E: ("S", 0), A: ("M", 1)}]
    assert r["s3fifo_ghost"] == [[]]


def test_s3fifo_promotion_overflow_evicts_main_at_once():
    # C=3 (cS=1, cM=2, cG=2).
    # r1-r4 A,B,C,D: drop A, G=[A], S=[B,C,D].  r5 A: G hit -> M=[A]; drop B, G=[B].
    # r6 B: G hit -> M=[A,B], G=[]; drop C, G=[C]; S=[D].  r7, r8 D: hits, D.freq 2.
    # r9 E: S=[D,E], 4 > 3: EVICT_S: D.freq 2 > 1 -> M=[A,B,D], over cM, so EVICT_M at once drops A;
    #   EVICT_S goes on until an S block leaves: E (the request's own new block, freq 0) -> G=[C,E].
    #   The replica ends r9 with 2 blocks, below C (choices (2) and (3) of the spec).
    # r10 A: a miss (libCacheSim's lazy rule would have kept A in M until the next eviction).
    seq = [A, B, C, D, A, B, D, D, E, A]
    r = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=3)
    assert r["hit_blocks"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert r["final_contents"] == [{A: ("S", 0), B: ("M", 0), D: ("M", 0)}]
    assert r["s3fifo_ghost"] == [[C, E]]
    c = S3FIFOCache(3)
    for k in seq[:9]:
        c.access([k])
        c.evict()
    assert len(c) == 2 and c.contents() == {B: ("M", 0), D: ("M", 0)}


def test_s3fifo_multi_block_promotion_pushes_main_over():
    # C=3 (cS=1, cM=2, cG=2).  Blocks are inserted leaf first (last block first, nearest S's tail).
    # r1 [A,B,C]: S=[C,B,A].
    # r2 [A,B,D]: 2 hits; D new -> S=[C,B,A,D]; B, A freq 1.  4 > 3: drop C, G=[C].
    # r3 [E]: S=[B,A,D,E]; B.freq 1 -> dropped, G=[C,B].
    # r4 [A,B,C]: A present, B absent -> 1 hit.  Leaf first: C in G -> M=[C]; B in G -> M=[C,B],
    #   G=[]; A hit, freq 2.  S=[A,D,E], 5 > 3: EVICT_S: A.freq 2 > 1 -> M=[C,B,A], over cM=2, so
    #   EVICT_M at once: C.freq 0 dropped; EVICT_S goes on: D dropped, G=[D].  S=[E], M=[B,A].
    r = run([[A, B, C], [A, B, D], [E], [A, B, C]], "s3fifo_sosp", 3)
    assert r["hit_blocks"].tolist() == [0, 2, 0, 1]
    assert r["final_contents"] == [{E: ("S", 0), B: ("M", 0), A: ("M", 0)}]
    assert r["s3fifo_ghost"] == [[D]]


def test_s3fifo_is_not_prefix_closed():
    # C=3. r1 [A..E]: inserted E,D,C,B,A -> S=[E,D,C,B,A]; drop E, D: G=[E,D], S=[C,B,A].
    # r2 [A..E]: 3 hits (A,B,C; D absent).  E, D come back from G into M=[E,D]; C, B, A freq 1.
    #   5 > 3: drop C (freq 1 is not > 1), G=[C]; drop B, G=[C,B].  Stored: A in S; E, D in M:
    #   D and E are cached without their predecessors B, C.
    # r3 [A..E]: 1 hit (A).  E, D hits (freq 1); C, B from G into M=[E,D,C,B]; A freq 2.
    #   5 > 3, |S|=1 = cS: EVICT_M: E, D reinserted (freq 1 -> 0), C dropped; then B dropped.
    keys = [[A, B, C, D, E]] * 3
    r = run(keys, "s3fifo_sosp", 3)
    assert r["hit_blocks"].tolist() == [0, 3, 1]
    assert r["final_contents"] == [{A: ("S", 2), E: ("M", 0), D: ("M", 0)}]
    assert r["s3fifo_ghost"] == [[]]
    with pytest.raises(AssertionError):
        check_prefix_closed(wl(keys), r["final_contents"][0])
    with pytest.raises(AssertionError):
        check_prefix_closed(wl(keys), run(keys[:2], "s3fifo_sosp", 3)["final_contents"][0])


# ------------------------------------------------------------------------------ properties
@st.composite
def tree_workloads(draw, max_requests=20, max_len=8):
    """Requests as root paths of a random prefix tree (chained keys: one node, one key)."""
    nodes: list[tuple[int, ...]] = []
    keys = []
    for _ in range(draw(st.integers(1, max_requests))):
        base = draw(st.integers(-1, len(nodes) - 1))
        path = nodes[base] if base >= 0 else ()
        if draw(st.booleans()):
            path = path[: draw(st.integers(0, len(path)))]
        for _ in range(draw(st.integers(0, max_len - len(path)))):
            path = path + (len(nodes) + 1,)
            nodes.append(path)
        keys.append(list(path))
    return Workload.from_lists(keys, block_tokens=2)


HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYP
@given(w=tree_workloads(), capacity=st.integers(0, 12), replicas=st.integers(1, 2))
def test_capacity_respected_and_prefix_closed(w, capacity, replicas):
    for policy in NEW:
        # debug=True asserts prefix-closure after every request for lfu and length_aware
        r = reference_simulate(w, policy=policy, capacity_blocks=capacity, replicas=replicas, debug=True)
        assert np.all(r["max_occupancy"] <= capacity)  # the maximum over requests: every request
        assert np.all(r["hit_blocks"] <= w.n_blocks)
        for contents in r["final_contents"]:
            assert len(contents) <= capacity
            if policy != "s3fifo_sosp":
                check_prefix_closed(w, contents)


@HYP
@given(w=tree_workloads())
def test_capacity_holding_everything_equals_unbounded(w):
    unb = reference_simulate(w, policy="unbounded")["hit_blocks"]
    n_keys = len(np.unique(w.keys))
    for policy in NEW:
        assert np.array_equal(reference_simulate(w, policy=policy, capacity_blocks=n_keys)["hit_blocks"], unb)


@HYP
@given(w=tree_workloads(), capacity=st.integers(0, 10))
def test_replicas_are_independent(w, capacity):
    # Round robin over 2 replicas equals each replica simulated alone on its own requests
    # (lfu counts only the requests routed to the replica).
    ks = [w.request_keys(i).tolist() for i in range(w.n_requests)]
    for policy in NEW:
        both = reference_simulate(w, policy=policy, capacity_blocks=capacity, replicas=2)
        for r in (0, 1):
            alone = reference_simulate(wl(ks[r::2]), policy=policy, capacity_blocks=capacity)
            assert both["hit_blocks"][r::2].tolist() == alone["hit_blocks"].tolist()
            assert both["final_contents"][r] == alone["final_contents"][0]


@HYP
@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    cycles=st.integers(1, 4),
    cut=st.integers(0, 5),
    capacity=st.integers(0, 20),
)
def test_lfu_equals_lru_when_each_key_is_seen_once_per_cycle(sizes, cycles, cut, capacity):
    # A fixed list of requests with pairwise disjoint keys, repeated (the last cycle maybe cut short).
    # Then every key seen c times was touched in the current cycle and every key seen c - 1 times
    # only in an earlier one, so (count, recency) orders keys exactly as recency does: lfu == lru,
    # hit for hit and in the final eviction order.  (With a key shared by two requests of a cycle,
    # e.g. a common prefix, this fails: the shared key is counted twice per cycle.)
    reqs, nxt = [], 1
    for n in sizes:
        reqs.append(list(range(nxt, nxt + n)))
        nxt += n
    keys = (reqs * (cycles + 1))[: len(reqs) * cycles + min(cut, len(reqs))]
    lfu = run(keys, "lfu_perfect", capacity)
    lru = run(keys, "lru", capacity)
    assert lfu["hit_blocks"].tolist() == lru["hit_blocks"].tolist()
    assert list(lfu["final_contents"][0]) == lru["final_contents"][0]


def test_lfu_differs_from_lru_with_a_shared_prefix_in_the_cycle():
    # The caveat above, by hand: cycle [A,B], [A,C], [D], [E] with C=2; A is counted twice a cycle.
    # lfu, scores (count, clock): r1 B(1,1) A(1,2).  r2: 1 hit; C(1,3) A(2,4); evict B.
    #   r3 [D]: D(1,5); evict C.  r4 [E]: E(1,6); the smallest of D(1,5), E(1,6), A(2,4) is D.
    #   r5 [A,B]: A present -> 1 hit.
    # lru: r2 leaves C, A; r3 evicts C -> A, D; r4 evicts A (least recent) -> D, E; r5: 0 hits.
    # From r6 on both hit 1, 0, 0 (lfu: r6 evicts B(2,7), r7 C(2,9), r8 D(2,11); A stays).
    keys = [[A, B], [A, C], [D], [E]] * 2
    assert run(keys, "lfu_perfect", 2)["hit_blocks"].tolist() == [0, 1, 0, 0, 1, 1, 0, 0]
    assert run(keys, "lru", 2)["hit_blocks"].tolist() == [0, 1, 0, 0, 0, 1, 0, 0]


@HYP
@given(seq=st.lists(st.integers(1, 12), max_size=60), capacity=st.integers(0, 8))
def test_length_aware_equals_lru_on_one_block_requests(seq, capacity):
    la = reference_simulate(objects(seq), policy="length_aware", capacity_blocks=capacity)
    lru = reference_simulate(objects(seq), policy="lru", capacity_blocks=capacity)
    assert la["hit_blocks"].tolist() == lru["hit_blocks"].tolist()
    assert list(la["final_contents"][0]) == lru["final_contents"][0]


@HYP
@given(w=tree_workloads(), capacity=st.integers(0, 15), threshold=st.integers(1, 3))
def test_s3fifo_invariants(w, capacity, threshold):
    c = S3FIFOCache(capacity, move_to_main_threshold=threshold)
    for i in range(w.n_requests):
        c.access(w.request_keys(i).tolist())
        c.evict()
        stored = set(c.small) | set(c.main)
        assert len(c) <= capacity and len(c.small) + len(c.main) == len(stored) == len(c.freq)
        assert set(c.freq) == stored and not stored & set(c.ghost)
        assert len(c.ghost) <= c.ghost_capacity
        assert all(0 <= f <= S3FIFOCache.FREQ_CAP for f in c.freq.values())


# --------------------------------------------------------------------- libCacheSim, S3-FIFO
class LibCacheSimS3FIFO(S3FIFOCache):
    """libCacheSim's S3FIFO.c (libcachesim 0.3.5) as overrides of the reference's queue machinery.

    Only the documented differences are overridden; the queues, ghost, frequency cap, the
    promotion (freq reset to 0) and both eviction loops are the reference's own code:

    * evict *before* inserting a missed object (per-object caching), with libCacheSim's test
      "evict from M if M holds more than cM or S is empty" (at a full cache this is Algorithm 1's
      "S holds at least cS");
    * the ghost is checked (and the key removed from it) before evicting;
    * warm-up: while nothing has been evicted yet, a new object goes to M once S holds cS;
    * an M overflow caused by a promotion is evicted lazily, at the next eviction.
    """

    def __init__(self, capacity, move_to_main_threshold):
        super().__init__(capacity, move_to_main_threshold)
        self.has_evicted = False

    def after_promotion(self):
        pass

    def access(self, keys):
        (key,) = keys
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, self.FREQ_CAP)
            return
        from_ghost = key in self.ghost
        if from_ghost:
            del self.ghost[key]
        while len(self) + 1 > self.capacity:
            self.has_evicted = True
            if len(self.main) > self.main_capacity or not self.small:
                self.evict_main()
            else:
                self.evict_small()
        if from_ghost or (not self.has_evicted and len(self.small) >= self.small_capacity):
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0

    def evict(self):
        pass  # done inside access


def zipf_stream(n, universe, alpha, seed):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, universe + 1) ** alpha
    return (rng.choice(universe, size=n, p=p / p.sum()) + 1).tolist()


def lcs_s3fifo_hits(seq, capacity, threshold):
    lcs = pytest.importorskip("libcachesim")
    # libCacheSim's sizes: S = (int)C * 0.1, M = C - S, G = (int)(C * 0.9); equal to ours here
    assert int(capacity * 0.1) == capacity // 10 and int(capacity * 0.9) == capacity - capacity // 10
    cache = lcs.S3FIFO(cache_size=capacity, hashpower=12, small_size_ratio=0.1, ghost_size_ratio=0.9,
                       move_to_main_threshold=threshold)
    return [int(cache.get(lcs.Request(obj_id=k, obj_size=1))) for k in seq]


@pytest.mark.parametrize("capacity", [20, 50, 100])  # S must hold >= 2 objects in libCacheSim
@pytest.mark.parametrize("threshold", [1, 2])
def test_s3fifo_machinery_equals_libcachesim_exactly(capacity, threshold):
    seq = zipf_stream(3000, 300, 0.9, seed=capacity + threshold)
    expect = lcs_s3fifo_hits(seq, capacity, threshold)
    c = LibCacheSimS3FIFO(capacity, threshold)
    got = []
    for k in seq:
        got.append(int(k in c))
        c.access([k])
    assert got == expect


@pytest.mark.parametrize("capacity", [20, 50, 100])
def test_s3fifo_reference_close_to_libcachesim(capacity):
    # The reference (store then evict, no warm-up rule, an M overflow evicted at once) and
    # libCacheSim differ in the details listed in LibCacheSimS3FIFO, so they are not equal request
    # by request; on Zipf streams of 5,000 objects their hit ratios agree within 1 point (measured
    # when this test was written: at most 0.5 points apart).
    differ = False
    for seed in range(2):
        seq = zipf_stream(5000, 400, 0.9, seed=seed)
        expect = lcs_s3fifo_hits(seq, capacity, 2)
        got = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=capacity)["hit_blocks"]
        assert abs(got.mean() - np.mean(expect)) <= 0.01
        differ |= got.tolist() != expect
    assert differ  # ...and they do differ: the tolerance covers a documented detail, not an accident


def test_s3fifo_warm_up_differs_from_libcachesim():
    # C=20: cS=2, cM=18.  Objects 1..23, then 3 again.
    # Reference: r1..r20 all go to S (no warm-up rule); r21, r22, r23 each drop S's tail (1, 2, 3,
    # freq 0) into G; r24 (object 3) misses.
    # libCacheSim 0.3.5: 1, 2 go to S; S then holds cS and nothing was evicted yet, so 3..20 go to M.
    # r21..r23 drop 1, 2, 21 from S; 3 is still in M at r24: a hit.
    seq = list(range(1, 24)) + [3]
    got = reference_simulate(objects(seq), policy="s3fifo_sosp", capacity_blocks=20)["hit_blocks"]
    assert got.tolist() == [0] * 24
    assert lcs_s3fifo_hits(seq, 20, 2) == [0] * 23 + [1]


# ------------------------------------------------------------------------- libCacheSim, LFU
def lfu_stream(rng, n_hot=6, n_warm=16, n=400):
    """Hot objects, 16 'warm' objects that each come back once within 11 requests, one-time objects."""
    seq = [1000, 1001]
    hot = list(range(1, n_hot + 1))
    warm = list(range(100, 100 + n_warm))
    due: dict[int, int] = {}
    fresh = 2000
    for i in range(n):
        if i in due:
            seq.append(due.pop(i))
            continue
        u = rng.random()
        if u < 0.35:
            seq.append(int(rng.choice(hot)))
        elif u < 0.45 and warm:
            k = warm.pop()
            seq.append(k)
            t = i + int(rng.integers(1, 12))
            while t in due:
                t += 1
            due[t] = k
        else:
            fresh += 1
            seq.append(fresh)
    return seq


def test_lfu_equals_libcachesim_lfu_when_no_key_is_evicted_and_readmitted():
    # Perfect and in-cache LFU coincide on a stream where no evicted key ever comes back: every
    # count then equals libCacheSim's in-cache frequency.  Random streams are kept when the
    # reference shows that property (each miss is a key's first request); libCacheSim must then
    # give the same hit on every request, which checks the victim choice (lowest count, ties
    # least recent) against libCacheSim's.
    lcs = pytest.importorskip("libcachesim")
    rng = np.random.default_rng(0)
    kept = 0
    for _ in range(60):
        seq = lfu_stream(rng)
        hits = reference_simulate(objects(seq), policy="lfu_perfect", capacity_blocks=32)["hit_blocks"]
        seen, readmitted = set(), False
        for k, h in zip(seq, hits):
            readmitted |= h == 0 and k in seen
            seen.add(k)
        if readmitted:
            continue
        kept += 1
        cache = lcs.LFU(cache_size=32, hashpower=10)
        assert [int(cache.get(lcs.Request(obj_id=k, obj_size=1))) for k in seq] == hits.tolist()
    assert kept >= 10  # measured: 24 of 60


@pytest.mark.parametrize("capacity", [7, 50, 300])
def test_prefix_closed_on_the_mini_mooncake_fixture(capacity):
    # debug=True: lfu and length_aware are checked prefix-closed after every request
    w = load_mooncake(FIXTURE, block_tokens=512)
    for policy in NEW:
        r = reference_simulate(w, policy=policy, capacity_blocks=capacity, replicas=2, debug=True)
        assert np.all(r["max_occupancy"] <= capacity) and np.all(r["hit_tokens"] <= w.input_tokens)
        assert r["hit_blocks"].sum() > 0

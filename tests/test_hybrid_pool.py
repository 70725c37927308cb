"""vLLM's hybrid prefix-hit and free rules (cacheresearch.replica.hybrid_pool) against the plain-Python
transcription of vLLM's manager (tests/reference_hybrid.py): the rules on random cached patterns, the pool
request by request on random shared-prefix workloads, and hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
import reference_hybrid as R
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheresearch.replica.hybrid_pool import (
    find_state,
    find_window,
    group_keys,
    hit_blocks,
    simulate_hybrid,
    spec_groups,
    window_free_upto,
)
from cacheresearch.replica.kv_layout import KVGroup, Unified, preset_layout, unify
from cacheresearch.workload.synthetic import design_workload
from cacheresearch.workload.table import Workload

LAYOUTS = {
    "dense": [("full", 0)],
    "window": [("sliding_window", 9), ("full", 0)],
    "mamba": [("mamba", 0), ("full", 0)],
    "gemma": [("sliding_window", 13), ("sliding_window", 13), ("full", 0)],
    "three": [("sliding_window", 7), ("mamba", 0), ("mamba", 0), ("full", 0)],
    "no_full": [("sliding_window", 20), ("mamba", 0)],
    "mla": [("mla", 0)],
}


def unified(groups, B) -> Unified:
    return Unified("t", B, B, "", 1, 1, tuple(KVGroup(k, 1, w) for k, w in groups), 1)


def ref_hit(groups, cached, P, B):
    pool = R.BlockPool(1 + sum(int(c.sum()) for c in cached))
    for g, c in enumerate(cached):
        for j in np.flatnonzero(c):
            pool.cache(pool.get_new_blocks(1)[0], int(j), g)
    blocks, hit = R.find_longest_cache_hit(pool, list(range(len(cached[0]))), max(P - 1, 0), groups, B)
    return blocks, hit


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), st.sampled_from([1, 4, 8]), st.integers(0, 14), st.data())
def test_hit_rule_equals_vllm_scans(name, B, nblocks, data):
    groups = LAYOUTS[name]
    P = data.draw(st.integers(max(nblocks * B, 1), nblocks * B + B))
    # mostly cached (a full-attention group's leading run must be long for the other groups to matter)
    bit = st.sampled_from([True, True, True, False])
    cached = [np.array(data.draw(st.lists(bit, min_size=nblocks, max_size=nblocks)), dtype=bool) for _ in groups]
    got = hit_blocks(unified(groups, B), cached, P)
    blocks, hit = ref_hit(groups, cached, P, B)
    assert got * B == hit
    for g, (kind, w) in enumerate(groups):  # the blocks the hit needs per group (vLLM's non-null hit blocks)
        real = [j for j, b in enumerate(blocks[g]) if not b.is_null]
        if kind == "sliding_window":
            want = list(range(window_free_upto(w, hit, B), got))
        elif kind == "mamba":
            want = [got - 1] if got else []
        else:
            want = list(range(got))
        assert real == want


def test_hand_worked_rules():
    # window 128, 16-token blocks: a hit needs the 8 blocks before its end (ceil(127 / 16) = 8)
    full = np.ones(20, bool)
    sw = np.zeros(20, bool)
    sw[12:20] = True  # blocks 12..19 cached; the bound is (320 - 1) // 16 = 19 blocks: [11, 19) misses 11
    u = unified([("sliding_window", 128), ("full", 0)], 16)
    assert hit_blocks(u, [sw, full], 320) == 0
    sw[11] = True
    assert hit_blocks(u, [sw, full], 320) == 19
    assert find_window(sw, 19, 8) == 19 and find_window(sw, 18, 8) == 0 and find_window(sw, 20, 8) == 20
    assert find_state(np.array([0, 1, 0, 1, 0], bool), 3) == 2
    # three specs, the fixed point: full 10; window (W=33: 2 blocks) 10; state 6 -> window 4 -> state 4 -> 4
    f = np.zeros(12, bool)
    f[:10] = True
    w = np.array([1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0], bool)
    m = np.zeros(12, bool)
    m[[3, 5]] = True
    g3 = [("sliding_window", 33), ("mamba", 0), ("full", 0)]
    u3 = unified(g3, 16)
    assert [s[0] for s in spec_groups(u3)] == ["full", "sliding_window", "mamba"]
    assert hit_blocks(u3, [w, m, f], 12 * 16) == 4
    assert ref_hit(g3, [w, m, f], 12 * 16, 16)[1] == 4 * 16
    assert window_free_upto(128, 319, 16) == 12 and window_free_upto(128, 100, 16) == 0


def _workload(reqs, fine) -> Workload:
    """``reqs``: [(arrival_ms, tenant, shared blocks, own blocks, tail tokens, output)] -> chained-style keys."""
    keys, offs, P, outs, arr, ten = [], [0], [], [], [], []
    for i, (a, t, s, own, tail, out) in enumerate(reqs):
        k = [(t + 1) << 32 | j for j in range(s)] + [(1 << 60) | (i << 20) | j for j in range(own)]
        keys += k
        offs.append(len(keys))
        P.append((s + own) * fine + tail % fine)
        outs.append(out)
        arr.append(a)
        ten.append(t)
    order = np.argsort(arr, kind="stable")
    assert (order == np.arange(len(arr))).all()
    return Workload(np.array(arr), np.array(P), np.array(outs), np.array(ten), np.array(keys, np.uint64),
                    np.array(offs), fine)


def _compare(w, u, n_blocks, seqs, pre, dec):
    got = simulate_hybrid(w, u, n_blocks, max_num_seqs=seqs, prefill_us_per_token=pre, decode_us_per_token=dec)
    reqs = [(int(w.arrival_ms[i]) * 1000, int(w.input_tokens[i]), int(w.output_tokens[i]),
             [int(k) for k in group_keys(w.request_keys(i), w.block_tokens, u.block_tokens)])
            for i in range(w.n_requests)]
    out, ev = R.simulate(reqs, [(g.kind, g.sliding_window) for g in u.groups], u.block_tokens, n_blocks,
                         max_num_seqs=seqs, pre_us=pre, dec_us=dec)
    want = np.array(out, np.int64).reshape(-1, 3)
    np.testing.assert_array_equal(got.admit_us, want[:, 0])
    np.testing.assert_array_equal(got.finish_us, want[:, 1])
    np.testing.assert_array_equal(got.hit_tokens, want[:, 2])
    assert got.evictions == ev
    return got


request = st.tuples(st.integers(0, 40), st.integers(0, 2), st.integers(0, 12), st.sampled_from([0, 0, 1, 3]),
                    st.integers(0, 7), st.integers(0, 30))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), st.sampled_from([(4, 4), (4, 8), (2, 8)]),
       st.lists(request, min_size=1, max_size=25), st.integers(8, 120), st.integers(1, 6), st.integers(0, 3),
       st.integers(0, 400))
def test_pool_equals_reference_request_by_request(name, bs, reqs, n_blocks, seqs, pre, dec):
    fine, B = bs
    reqs = sorted(reqs, key=lambda r: r[0])
    w = _workload(reqs, fine)
    u = unified(LAYOUTS[name], B)
    _compare(w, u, n_blocks, seqs, pre, dec)


def test_pool_equals_reference_seeded_linear_groups():
    # many small cases on the layouts with a linear group: the order in which the hit's state and the
    # prompt's checkpoint go back to the free queue shows only when one of the two is evicted (rare)
    import random
    rng = random.Random(1)
    for _ in range(200):
        name = rng.choice(["mamba", "three", "no_full"])
        fine, B = rng.choice([(4, 4), (4, 8), (2, 8)])
        reqs = sorted((rng.randint(0, 40), rng.randint(0, 1), rng.randint(0, 12), rng.choice([0, 0, 1, 3]),
                       rng.randint(0, 7), rng.randint(0, 30)) for _ in range(rng.randint(1, 25)))
        _compare(_workload(reqs, fine), unified(LAYOUTS[name], B), rng.randint(8, 60), rng.randint(1, 6),
                 rng.randint(0, 3), rng.randint(0, 400))


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-next-80b-a3b", "gemma-3-27b", "llama-3.1-8b"])
def test_pool_equals_reference_on_a_design_workload(name):
    u = unify(preset_layout(name), 16)
    w = design_workload(n_tenants=4, prefix_tokens=1200, suffix_tokens=100, n_requests=60, duration_s=30,
                        output_tokens=50, seed=3)
    per = sum(3 if g.kind == "mamba" else -(-1349 // u.block_tokens) for g in u.groups)
    got = _compare(w, u, 3 * per, 8, 20, 300)
    assert (got.admit_us >= 0).all() and got.evictions > 0


def test_shared_prompt_shorter_than_the_forced_block_never_hits():
    # the case: a 240-token shared prompt on a 784-token block (a linear-attention hybrid)
    u = unified([("mamba", 0), ("full", 0)], 784)
    w = _workload([(i, 0, 15, 2, 8, 10) for i in range(5)], 16)  # 240 shared + 40 own tokens
    run = simulate_hybrid(w, u, 100)
    assert run.token_hit_rate == 0.0 and (run.hit_tokens == 0).all()
    # with 900 shared tokens (56 blocks of 16 + 4), the second request on hits one 784-token block
    w = _workload([(i, 0, 56, 6, 4, 10) for i in range(3)], 16)
    run = simulate_hybrid(w, u, 100)
    assert run.hit_tokens.tolist() == [0, 784, 784]
    # the dense model of the same heads, 16-token blocks: 56 of the 62 blocks; the prompt's last shared one
    d = simulate_hybrid(w, unified([("full", 0)], 16), 400)
    assert d.hit_tokens.tolist() == [0, 56 * 16, 56 * 16]


def test_window_blocks_left_free_are_lost_first():
    # window 32 on 16-token blocks (a hit needs the 2 blocks before its end). Each 1000-token request holds
    # 63 full + 63 window blocks in its step, then frees window blocks 0..59 (cached) and, at its end, the rest
    # tail first. Tenant 1's request (126 blocks) takes the never-used blocks and then exactly tenant 0's 60
    # early-freed window blocks: tenant 0's full blocks survive, its window at the shared prefix's end does not.
    u = unified([("sliding_window", 32), ("full", 0)], 16)
    w = _workload([(0, 0, 60, 2, 8, 1), (1, 1, 60, 2, 8, 1), (2, 0, 60, 2, 8, 1)], 16)
    assert simulate_hybrid(w, u, 1 + 192).hit_tokens.tolist() == [0, 0, 0]
    assert simulate_hybrid(w, u, 400).hit_tokens.tolist() == [0, 0, 60 * 16]
    # the dense pool of the same bytes (96 blocks of both groups' layers): tenant 1 evicts tenant 0's last 30
    # blocks (freed tail first), tenant 0 hits the first 33
    dense = simulate_hybrid(w, unified([("full", 0)], 16), 1 + 96)
    assert dense.hit_tokens.tolist() == [0, 0, 33 * 16]


def test_bad_inputs_refused():
    u = unified([("full", 0)], 8)
    w = _workload([(0, 0, 2, 0, 0, 1)], 16)
    with pytest.raises(ValueError, match="multiple"):
        simulate_hybrid(w, u, 10)
    w = _workload([(0, 0, 2, 0, 0, 1)], 4)
    for kw, match in (({"max_num_seqs": 0}, "max_num_seqs"), ({"prefill_us_per_token": -1}, "prefill_us")):
        with pytest.raises(ValueError, match=match):
            simulate_hybrid(w, u, 10, **kw)
    with pytest.raises(ValueError, match="num_blocks"):
        simulate_hybrid(w, u, 1)
    bad = Workload(w.arrival_ms, w.input_tokens + 4, w.output_tokens, w.tenant, w.keys, w.offsets, 4)
    with pytest.raises(ValueError, match="block keys"):
        simulate_hybrid(bad, u, 10)
    # a request larger than the pool is left unserved, not waited for forever
    big = _workload([(0, 0, 4, 0, 0, 1)], 4)
    assert simulate_hybrid(big, u, 2).admit_us.tolist() == [-1]

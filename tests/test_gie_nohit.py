"""llm-d's ``no-hit-lru-scorer`` in the ``gie`` router (``gie_nohit_w_pct``, ``gie_nohit_lru_size``): a request no pod
has a prefix hit for ("cold") goes to the pods never, or least recently, given a cold request; the LRU of pods is
router state, kept by the numba rule (``sr``), so the JAX engine refuses a weight above 0 and runs weight 0 as before.

A hand-worked sequence on 3 pods (the rule itself and the oracle), the numba fcfs fleet and the numba vllm replica
equal to the plain-Python oracles (``reference_fleet.Gie``) request by request (hypothesis), weight 0 unchanged, the
JAX engine's one-line refusal, and the tiered guide's EPP file read into the knobs."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_fleet import Gie
from test_engine import HYP, R_MAX, tree_workloads
from test_fleet import assert_fleet_equal, knob_sets, with_outputs
from test_numba_blocks import numba_and_reference
from test_numba_vllm import _compare, _numba, _workload

from cacheresearch.cache.policies import BLOCK_POLICY_IDS
from cacheresearch.core.run import simulate
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.routers import REGISTRY
from cacheresearch.routers.epp import epp_knobs, read_epp
from cacheresearch.routers.gie import numba_rule
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys
from cacheresearch.workload.table import Workload

FIXTURE = "tests/fixtures/llmd_tiered/single-host-tiered-prefix-cache-cpu.values.yaml"
# 3 pods, only the no-hit scorer (weight 1) and, for request 6, the precise prefix scorer (mode 2); bits[1] = 0: ties
# go to the first tied pod. match per request: cold (all 0) or a hit somewhere.
_HAND = [([0, 0, 0], 0), ([0, 0, 0], 1), ([0, 3, 0], 1), ([0, 0, 0], 2), ([0, 0, 0], 0), ([0, 0, 0], 1),
         ([0, 0, 5], 2), ([0, 0, 0], 2)]
# worked by hand: r0 cold, all never used: scores 1, .5, 0 -> 0, LRU [0]; r1 cold: never used 1, 2 score 1, .5,
# pod 0 rank 2 -> 0 -> 1, LRU [0, 1]; r2 has a hit on 1: 0.5 each, the prefix scorer -> 1, LRU kept; r3 cold: 2
# (never used) 1, 0 .5, 1 0 -> 2, LRU [0, 1, 2]; r4 cold: 0 is the oldest -> 0, LRU [1, 2, 0]; r5 -> 1, LRU
# [2, 0, 1]; r6 a hit on 2: the prefix scorer picks 2, LRU kept; r7 cold: 2 is the oldest -> 2.
_KN = dict(gie_prefix_mode=2, gie_prefix_w_pct=100, gie_kv_w_pct=0, gie_queue_w_pct=0, gie_window_blocks=0,
           gie_load_w_pct=0, gie_load_threshold=128, gie_active_w_pct=0, gie_active_timeout_ms=0,
           gie_lru_capacity=1, gie_cpu_w_pct=0, gie_cpu_lru_capacity=1, gie_cpu_tier_w_pct=0, gie_nohit_w_pct=100,
           gie_nohit_lru_size=1024)


def _rule_picks(seq, kn, R=3):
    """The numba rule run as plain Python over a sequence of matches (its state ``sr`` kept across them)."""
    kv = np.array([kn[k.name] for k in REGISTRY["gie"].knobs], np.int64)
    sr, tmpv = np.zeros((R, 1), np.int64), np.zeros(R, np.int64)
    z = np.zeros(R, np.int64)
    picks, scores = [], []
    for i, (m, _) in enumerate(seq):
        r = numba_rule(i, 4, 0, 0, np.zeros(4, np.int64), R, z, np.array(m, np.int64), z, z, z, z, -1, 100, kv,
                       None, None, tmpv, sr, None)
        picks.append(int(r))
        scores.append(tmpv.tolist())
    return picks, scores


def _oracle_picks(seq, kn, R=3):
    g = Gie(R)
    return [g.route(n=4, R=R, match=m, queue=[0] * R, active_blocks=[0] * R, bits=[0, 0, 0, 0], kn=kn,
                    capacity=100) for m, _ in seq]


def test_hand_worked_sequence_on_three_pods():
    want = [p for _, p in _HAND]
    picks, scores = _rule_picks(_HAND, _KN)
    assert picks == want
    assert _oracle_picks(_HAND, _KN) == want
    # the first cold request's scores: 1, 0.5, 0 (x 100 for the weight); a request with a hit: 0.5 each (+ prefix)
    assert scores[0] == [100 * 65536, 100 * 32768, 0]
    assert scores[2] == [100 * 32768, 100 * (32768 + 65536), 100 * 32768]
    assert scores[1] == [0, 100 * 65536, 100 * 32768]
    # lruSize 1: only the last pod given a cold request is remembered; r3: 0 and 2 never used -> 0
    picks1, _ = _rule_picks(_HAND, dict(_KN, gie_nohit_lru_size=1))
    assert picks1 == _oracle_picks(_HAND, dict(_KN, gie_nohit_lru_size=1)) == [0, 1, 1, 0, 1, 0, 2, 1]
    # one pod: it scores 1
    _, s1 = _rule_picks([([0], 0)], _KN, R=1)
    assert s1 == [[100 * 65536]]


@settings(HYP, max_examples=25)
@given(w=tree_workloads(), data=st.data(), knobs=knob_sets, replicas=st.integers(1, R_MAX), seed=st.integers(0, 3))
def test_on_the_fcfs_fleet_equals_its_oracle(w, data, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(BLOCK_POLICY_IDS))
    gk = dict(gie_prefix_mode=data.draw(st.integers(0, 2)), gie_prefix_w_pct=data.draw(st.sampled_from([0, 100, 300])),
              gie_kv_w_pct=data.draw(st.sampled_from([0, 100])), gie_queue_w_pct=data.draw(st.sampled_from([0, 100])),
              gie_nohit_w_pct=data.draw(st.sampled_from([100, 200, 2000])),
              gie_nohit_lru_size=data.draw(st.sampled_from([1, 2, 1024])))
    kw = dict(knobs, **gk, capacity=data.draw(st.integers(0, 20)))
    m, ref = numba_and_reference(w, policy, kw, replicas, "gie", seed)
    assert_fleet_equal(w, m, ref, ("gie", policy, gk, replicas))


_VLLM = dict(seed=st.integers(0, 10_000), cap=st.integers(40, 160), budget=st.sampled_from([48, 4096]),
             seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(1, 30), mode=st.integers(0, 2),
             weights=st.tuples(*[st.sampled_from([0, 100, 200]) for _ in range(3)]),
             wn=st.sampled_from([100, 300, 2000]), size=st.sampled_from([1, 2, 1024]),
             est=st.booleans(), wc=st.sampled_from([0, 100]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_VLLM)
def test_on_the_vllm_replica_equals_its_oracle(seed, cap, budget, seqs, R, out, mode, weights, wn, size, est, wc):
    """numba == oracle request by request, on the precise view and GIE's own index (gie_estimate, with or without the
    CPU-tier scorer, whose count must not make a request warm)."""
    w = _workload(seed, out, rate=40)
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs, gie_prefix_mode=mode,
              gie_prefix_w_pct=weights[0], gie_kv_w_pct=weights[1], gie_queue_w_pct=weights[2], gie_nohit_w_pct=wn,
              gie_nohit_lru_size=size)
    g = None
    if est:
        g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=11)
        kn.update(view="gie_estimate", gie_lru_capacity=12, gie_cpu_w_pct=wc, gie_cpu_lru_capacity=40)
    _compare(w, R=R, router="gie", gie_hashes=g, jax_too=False, **kn)


def test_new_prompts_on_gie_estimate_are_cold_and_cycle_the_pods():
    """Nine prompts nobody repeats on GIE's own index: each matches only h0 (the model's hash, every prompt's), which
    is no hit, so every request is cold and the no-hit scorer sends them round the pods in LRU order (the prefix
    scorer sees the same 1 / total on every pod once each has h0). Counting h0 as a hit would leave every request
    after the third warm: 0.5 on every pod, ties broken at random."""
    bt, rng, n = 16, np.random.default_rng(3), 9
    keys = [int(x) for x in rng.integers(1, 2**62, 6 * n)]
    w = Workload(arrival_ms=np.arange(n, dtype=np.int64) * 10_000, input_tokens=np.full(n, 6 * bt, np.int64),
                 output_tokens=np.ones(n, np.int64), tenant=np.zeros(n, np.int32), keys=np.array(keys, np.uint64),
                 offsets=np.arange(n + 1, dtype=np.int64) * 6, block_tokens=bt)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=6)
    kn = dict(view="gie_estimate", gie_prefix_mode=1, gie_prefix_w_pct=100, gie_kv_w_pct=0, gie_queue_w_pct=0,
              gie_nohit_w_pct=100, gie_lru_capacity=1000, capacity_blocks=200, max_num_batched_tokens=4096,
              max_num_seqs=4)
    ref = _compare(w, R=3, router="gie", gie_hashes=g, jax_too=False, seed=2, **kn)
    assert np.asarray(ref["replica"]).tolist() == [i % 3 for i in range(n)]


def test_it_changes_picks_and_weight_zero_is_unchanged():
    """Weight 0: the LRU's size changes nothing and the JAX engine runs it, equal to numba; weight 1: other picks."""
    w = _workload(5, 10, n_tenants=12, rate=40)
    s = compile_stream(w, stateful_singletons=True)
    base = dict(capacity_blocks=200, replicas=3, router="gie", max_num_batched_tokens=64, max_num_seqs=4,
                gie_prefix_mode=2, gie_kv_w_pct=0, gie_queue_w_pct=0)
    key = jax.random.key(1)
    out = [_numba(s, make_params("lru", **base, gie_nohit_w_pct=wn, gie_nohit_lru_size=z), key, R=3, S=6, Q=64)
           for wn, z in ((0, 1024), (0, 1), (100, 1024))]
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "replica"):
        np.testing.assert_array_equal(np.asarray(getattr(out[0], f)), np.asarray(getattr(out[1], f)), err_msg=f)
    assert not np.array_equal(np.asarray(out[0].replica), np.asarray(out[2].replica))
    # the fcfs fleet: weight 0 on the JAX engine (not refused) equals the numba engine
    sb = compile_stream(w, block_ids=True)
    p0 = make_params("fifo", capacity_blocks=40, replicas=3, router="gie", gie_prefix_mode=2)
    mj = simulate(sb, p0, key, backend="jax", max_replicas=3, per_request=True)
    mn = simulate(sb, p0, key, backend="numba", max_replicas=3, per_request=True)
    np.testing.assert_array_equal(np.asarray(mj.replica), np.asarray(mn.replica))


def test_the_jax_engine_refuses_a_weight_in_one_line():
    w = _workload(1, 4)
    s = compile_stream(w, block_ids=True)
    p = make_params("fifo", capacity_blocks=20, replicas=2, router="gie", gie_nohit_w_pct=100)
    with pytest.raises(ValueError) as e:
        simulate(s, p, jax.random.key(0), backend="jax", max_replicas=2)
    msg = str(e.value)
    assert "\n" not in msg and "'gie'" in msg and "gie_nohit_w_pct" in msg and "JAX engine" in msg
    m = simulate(s, p, jax.random.key(0), backend="auto", max_replicas=2, per_request=True)  # auto: numba
    assert np.asarray(m.replica).shape[0] >= w.n_requests


def test_the_tiered_guides_epp_file_reads_into_the_knobs(tmp_path):
    kn = epp_knobs(read_epp(FIXTURE), block_tokens=16)
    assert kn["gie_nohit_w_pct"] == 100 and kn["gie_nohit_lru_size"] == 1024 and kn["view"] == "gie_estimate"
    make_params("lru", capacity_blocks=100, **kn)
    text = open(FIXTURE, encoding="utf-8").read()
    f = tmp_path / "v.yaml"
    f.write_text(text.replace("- type: no-hit-lru-scorer", "- type: no-hit-lru-scorer\n          parameters:\n"
                              "            lruSize: 4"), encoding="utf-8")
    assert epp_knobs(read_epp(f), block_tokens=16)["gie_nohit_lru_size"] == 4
    f.write_text(text.replace("- type: no-hit-lru-scorer", "- type: no-hit-lru-scorer\n          parameters:\n"
                              "            prefixMatchInfoProducerName: cpu-prefix-cache-producer"), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        epp_knobs(read_epp(f), block_tokens=16)
    assert "\n" not in str(e.value) and "prefixMatchInfoProducerName" in str(e.value)

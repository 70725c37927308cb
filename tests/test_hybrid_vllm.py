"""vLLM's hybrid KV cache manager in the vllm replica (numba backend, per-block mode): full-attention and
sliding-window groups of one pool (``kv_groups``, ``kv_window_groups``, ``kv_window``) equal the plain-Python
reference (``tests/reference_batch.py``, whose hit rule is ``hybrid_pool.hit_blocks``) request by request."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch

from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import finalize
from cacheresearch.workload.synthetic import tenant_workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

_PER_REQUEST = ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica")
#: layouts as (kv_groups, kv_window_groups): gpt-oss (window, full), full first, Gemma 3's shape (windows then full),
#: windows only, two full groups
LAYOUTS = [(2, 0b01), (2, 0b10), (4, 0b0111), (1, 0b1), (2, 0b11), (2, 0b00)]


def _workload(seed, out, n_tenants=4, rate=30, dur=2, prefix=200, query=40):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=prefix, query_tokens=query, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _run(w, *, R, router, S=6, Q=64, seed=0, imported=None, **kn):
    """(the numba backend's Metrics of one configuration, the reference's dict); ``imported``: prompt tokens per
    request whose KV arrives with it (a P/D decode pool)."""
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    st_ = static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))), index=int(p.view) == 1,
                         stale=int(p.view) == 2)
    m = finalize(nv.run_stream(s, [p], [key], st_, imported=imported), st_)
    m = type(m)(*(np.asarray(x)[0] for x in m))
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    ref = reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, imported=imported,
                          **k)
    return m, ref


def _compare(w, **kw):
    m, ref = _run(w, **kw)
    for f in _PER_REQUEST:
        a, b = np.asarray(getattr(m, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped"):
        assert int(getattr(m, f)) == ref[f], (f, int(getattr(m, f)), ref[f])
    R = kw["R"]
    assert list(np.asarray(m.max_occupancy)[:R]) == ref["kv_max"]  # the pool's peak blocks in use
    assert list(np.asarray(m.occupancy)[:R]) == ref["cached"]  # cached block ids at the end, every group's
    return m, ref


_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(40, 260), budget=st.sampled_from([16, 48, 200, 4096]),
              seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40), layout=st.sampled_from(LAYOUTS),
              window=st.sampled_from([2, 5, 16, 17, 40, 128]),
              router=st.sampled_from(["round_robin", "random", "llmd_precise", "cache_aware", "least_loaded"]),
              view=st.sampled_from(["precise", "precise", "stale"]), imp=st.sampled_from([0, 0, 0, 70, 230]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_hybrid_equals_reference_hypothesis(seed, cap, budget, seqs, R, out, layout, window, router, view, imp):
    """Shared prefixes, pools small enough to evict and preempt, windows below, at and above a block, 1-3 replicas,
    the precise and stale views (they read the first full-attention group), imported KV (P/D: a window group starts
    from window_free_upto(W, imported))."""
    ng, wm = layout
    w = _workload(seed, out)
    kn = dict(view=view, stale_lag_ms=150) if view == "stale" else {}
    _compare(w, R=R, router=router, capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs,
             kv_groups=ng, kv_window_groups=wm, kv_window=window if wm else 0,
             imported=np.full(w.n_requests, imp, np.int64) if imp else None, **kn)


def test_hand_worked_window_blocks_go_first_and_limit_the_hit():
    """gpt-oss's order (group 0 a window of 16 tokens, group 1 full attention), 16-token blocks, one replica, a pool
    of 15 block ids, a step of 1 ms, a token budget of 16 (one block per step: a long prefill).

    A [1..6] at 0 ms: 6 steps; the window group frees its block j at the start of step j + 3 (blocks wholly before
    computed - 16 + 1), so blocks 0-3 (keys 1-4) enter the free queue during the prefill; at its end the window
    group releases 5, 4 (keys 6, 5), then the full group 5..0: the queue is W1 W2 W3 W4 W6 W5 F6 .. F1 (12 cached).
    B [7..10] at 100 ms: 2 ids per block; the pool evicts 1, 2, 2 ids at its steps 2-4: W1, W2, W3, W4, W6, so
    A's full-attention blocks all survive and its window keeps only W5.
    C [1..6, 11] at 200 ms (hit bound 6): the full group holds 6 leading blocks, the window group needs the block
    before the hit's end (ceil(15 / 16) = 1): its rightmost cached one is block 4 (W5), so the hit is 5 blocks.
    The dense pool (one full group) of the same 15 ids evicts nothing and hits 6."""
    from cacheresearch.workload.table import Workload

    w = Workload.from_lists([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 11]], block_tokens=16,
                            arrival_ms=np.array([0, 100, 200]), output_tokens=np.ones(3, np.int64))
    kn = dict(capacity_blocks=15, step_base_ns=1_000_000, step_prefill_ns=0, step_decode_ns=0,
              max_num_batched_tokens=16, max_num_seqs=4)
    m, ref = _compare(w, R=1, router="round_robin", kv_groups=2, kv_window_groups=0b01, kv_window=16, **kn)
    assert np.asarray(m.hit_blocks).tolist() == [0, 0, 5]
    assert np.asarray(m.ttft_ms).tolist() == [6, 4, 2]  # C computes blocks 5 and 6: two steps
    # the peak: C's last step pins the 7 full blocks and the window's last 2 (block 4 freed at that step's start)
    assert int(np.asarray(m.max_occupancy)[0]) == 9
    dense, _ = _compare(w, R=1, router="round_robin", **kn)
    assert np.asarray(dense.hit_blocks).tolist() == [0, 0, 6]


def test_one_full_group_is_todays_replica_bit_for_bit():
    """kv_groups 1, no window group: every Metrics field equals the defaults' (the run mode, today's results)."""
    w = _workload(5, 20)
    kn = dict(capacity_blocks=60, max_num_batched_tokens=48, max_num_seqs=4)
    m0, _ = _compare(w, R=2, router="llmd_precise", **kn)
    m1, _ = _compare(w, R=2, router="llmd_precise", kv_groups=1, kv_window_groups=0, kv_window=0, **kn)
    for f in m0._fields:
        np.testing.assert_array_equal(np.asarray(getattr(m1, f)), np.asarray(getattr(m0, f)), err_msg=f)


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gemma-3-27b"])
def test_preset_layouts_equal_reference(model):
    """The knobs of a preset's layout (kv_layout.engine_knobs) on a workload whose prompts pass the window; the
    pool holds 1.5 requests' blocks, so it evicts and preempts."""
    from cacheresearch.replica.kv_layout import engine_knobs, preset_layout, unify

    kv = engine_knobs(unify(preset_layout(model)))
    w = _workload(9, 30, prefix=1500 if model == "gemma-3-27b" else 300, query=60, rate=20)
    per = kv["kv_groups"] * -(-int(np.max(w.input_tokens)) // 16)
    _, ref = _compare(w, R=2, router="cache_aware", capacity_blocks=per * 3 // 2, max_num_batched_tokens=256,
                      max_num_seqs=4, **kv)
    assert ref["preemptions"] > 0 and int(np.sum(ref["hit_blocks"])) > 0


def test_refusals_name_the_key():
    w = _workload(1, 4)
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(make_params("lru", capacity_blocks=50), max_replicas=1, per_request=True, scheduler="vllm",
                         max_running=4, queue_slots=16, max_runs=int(np.max(np.asarray(s.n_runs))))
    key = jax.random.key(0)
    for kn, match in ((dict(kv_groups=2, kv_window_groups=0b100, kv_window=16), "kv_window_groups"),
                      (dict(kv_groups=2, kv_window_groups=1, kv_window=1), "kv_window must be"),
                      (dict(kv_groups=2, policy="fifo"), "cache.policy 'fifo'"),
                      (dict(kv_groups=2, policy="ttl_refresh", ttl_s=5.0), "cache.policy 'ttl_refresh'")):
        kn = dict(kn)
        pol = kn.pop("policy", "lru")
        ttl = kn.pop("ttl_s", None)
        p = make_params(pol, capacity_blocks=50, ttl_s=ttl, **kn)
        with pytest.raises(ValueError, match=match):
            nv.run_stream(s, [p], [key], st_)
    from cacheresearch.core.simulate import simulate

    with pytest.raises(ValueError, match="kv_groups > 1 or kv_window_groups"):
        simulate(s, make_params("lru", capacity_blocks=50, kv_groups=2), key, scheduler="vllm")


def test_cpu_tier_with_a_hybrid_layout_is_refused():
    tv = pytest.importorskip("cacheresearch.tiers.vllm")
    w = _workload(1, 4)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", capacity_blocks=50, kv_groups=2, kv_window_groups=1, kv_window=32)
    st_ = static_options(p, max_replicas=1, per_request=True, scheduler="vllm", max_running=4, queue_slots=16,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    tier = tv.cpu_tier(capacity_blocks=10, read_gbps=4.0, latency_us=1.0, block_bytes=1_000_000)
    with pytest.raises(ValueError, match="tiers.cpu with a hybrid KV layout"):
        tv.run_stream_tiered(s, [p], [jax.random.key(0)], st_, [tier])


def test_simulate_cells_sends_a_hybrid_layout_to_numba():
    """core.run: a grid mixing a hybrid layout with today's runs both (auto: numba), each cell as run alone;
    engine.backend=jax and the fcfs replica refuse it in one line."""
    from cacheresearch.core.run import BackendError, simulate_cells

    w = _workload(1, 20)
    s = compile_stream(w, stateful_singletons=True)
    kv = dict(kv_groups=2, kv_window_groups=1, kv_window=32)
    ps = [make_params("lru", capacity_blocks=80, replicas=2, router="llmd_precise"),
          make_params("lru", capacity_blocks=80, replicas=2, router="llmd_precise", **kv)]
    m, _ = simulate_cells([s], np.zeros(2, np.int64), ps, np.zeros(2, np.int64), max_replicas=2, scheduler="vllm",
                          per_request=True)
    for g, kn in enumerate(({}, kv)):
        alone, _ = _run(w, R=2, router="llmd_precise", capacity_blocks=80, **kn)
        assert np.asarray(m.hit_blocks)[g].tolist() == np.asarray(alone.hit_blocks).tolist()
    assert np.asarray(m.hit_blocks)[0].tolist() != np.asarray(m.hit_blocks)[1].tolist()  # the window loses hits
    with pytest.raises(BackendError, match="kv_groups > 1"):
        simulate_cells([s], np.zeros(1, np.int64), ps[1:], np.zeros(1, np.int64), max_replicas=2, scheduler="vllm",
                       backend="jax")
    with pytest.raises(ValueError, match="vllm replica only"):
        simulate_cells([s], np.zeros(1, np.int64), ps[1:], np.zeros(1, np.int64), max_replicas=2)


@pytest.mark.parametrize("window", [2, 17])
def test_decode_stretches_end_where_the_window_frees(window):
    """Long decodes: the engine's closed-form decode stretches stop at the step after which a window frees a block
    (that release starts the next event), and still equal the reference's step-by-step count."""
    w = _workload(4, 120, rate=5, dur=3)
    kn = dict(capacity_blocks=200, max_num_batched_tokens=4096, max_num_seqs=6)
    m, ref = _compare(w, R=1, router="round_robin", kv_groups=2, kv_window_groups=1, kv_window=window, **kn)
    _, dense = _compare(w, R=1, router="round_robin", **kn)
    assert ref["steps"] == dense["steps"] and dense["events"] < ref["events"] < ref["steps"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(40, 200), layout=st.sampled_from(LAYOUTS[:3]),
       window=st.sampled_from([5, 17, 40]), timeout=st.sampled_from([20, 60, 200]), permits=st.sampled_from([0, 3]),
       out=st.integers(0, 40), R=st.integers(1, 2))
def test_hybrid_with_timeouts_equals_reference(seed, cap, layout, window, timeout, permits, out, R):
    """The hybrid layout and the client's timeouts together: an abort comes before the step's window release (vLLM
    aborts between steps, frees out-of-window blocks in schedule), in the engine's steps and its decode stretches."""
    ng, wm = layout
    w = _workload(seed, out)
    _compare(w, R=R, router="round_robin", capacity_blocks=cap, max_num_batched_tokens=48, max_num_seqs=4,
             kv_groups=ng, kv_window_groups=wm, kv_window=window, client_timeout_ms=timeout, client_permits=permits)

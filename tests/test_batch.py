"""The vllm replica (replica/vllm.py, replica/pool.py) equals its plain-Python reference request by request."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch

from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, simulate
from cacheresearch.core.stream import StreamShape, compile_stream, pad_stream, stream_shape
from cacheresearch.workload.synthetic import tenant_workload

#: One compiled program serves every default test of this file (compiles dominate its cost): streams are
#: padded to one static shape and every test runs under the same static options (replica, slot, run and
#: instance bounds, every router rule, the match / index / stale flags); what a test varies is dynamic.
SHAPE = StreamShape(steps=160, width=2, requests=160, entries=320, positions=2560, keys=160)
STATIC = dict(max_replicas=3, max_running=8, queue_slots=64, max_runs=4, max_instances=3, match=True,
              index=True, stale=True, scheduler="vllm",
              routers_compiled=("round_robin", "random", "weighted_scorers", "cache_aware", "least_loaded", "gie"))
S_BOUND = STATIC["max_running"]


def _run(w, *, R, router="round_robin", seed=0, **kn):
    """The engine on ``w`` under the shared program; per-request arrays cut to ``w``'s requests."""
    s = compile_stream(w, stateful_singletons=True)
    own = stream_shape(s)
    s = pad_stream(s, SHAPE.union(own))  # a larger workload pads to its own shape (one more compile)
    p = make_params("lru", capacity_blocks=kn.pop("capacity_blocks"), replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    m = simulate(s, p, key, **STATIC)
    n = w.n_requests
    bits = np.asarray(request_bits(key, int(s.arrival_ms.shape[-1])))[:n]  # the padded stream's draws
    cut = {f: getattr(m, f)[:n] for f in ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica")}
    return m._replace(**cut), bits


def _ref(w, *, R, router="round_robin", bits, S, Q, **kn):
    """The reference with the router's rule and every knob resolved as the engine resolves them."""
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    return reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, **k)


def _check(w, m, ref):
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica"):
        a, b = np.asarray(getattr(m, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    assert int(m.preemptions) == ref["preemptions"]
    assert int(m.steps) == ref["steps"]
    assert int(m.events) == ref["events"]
    assert int(m.dropped) == ref["dropped"]


def _workload(seed, n_tenants, prefix, query, rate, dur, out):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=prefix, query_tokens=query, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def test_small_fleet_equals_reference():
    w = _workload(0, 6, 320, 64, 20, 4, 8)
    kn = dict(capacity_blocks=60, max_num_batched_tokens=128, max_num_seqs=8)
    m, bits = _run(w, R=2, **kn)
    ref = _ref(w, R=2, bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)


_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(30, 200), budget=st.sampled_from([16, 48, 200, 4096]),
              seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40),
              router=st.sampled_from(["round_robin", "random", "llmd_precise", "llmd_approximate", "cache_aware",
                                      "least_loaded"]))


def _check_case(seed, cap, budget, seqs, R, out, router):
    """Chunked prefill (small budgets), preemption and pool exhaustion (small pools)."""
    w = _workload(seed, 4, 200, 40, 30, 2, out)
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs)
    if router == "llmd_approximate":
        kn["index_capacity"] = cap // 2 + 20  # an index that forgets: the approximate view diverges
    m, bits = _run(w, R=R, router=router, **kn)
    ref = _ref(w, R=R, router=router, bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_equals_reference_hypothesis(**case):
    _check_case(**case)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_equals_reference_hypothesis_many(**case):
    _check_case(**case)


def test_metrics_from_per_request_arrays_and_warmup():
    """Percentiles, TPOT and the warm-up cut follow from the per-request arrays (nearest rank)."""
    w = _workload(2, 4, 200, 40, 20, 3, 12)
    kn = dict(capacity_blocks=80, max_num_batched_tokens=64, max_num_seqs=4)
    warm = 1000
    m, _ = _run(w, R=2, warmup_ms=warm, **kn)
    ttft, e2e = np.asarray(m.ttft_ms), np.asarray(m.e2e_ms)
    arr = np.asarray(w.arrival_ms)
    keep = (arr - arr[0] >= warm) & (e2e >= 0)
    assert 0 < keep.sum() < len(arr)

    def rank(v, p):
        v = np.sort(v)
        return int(v[max(-(-p * len(v) // 100) - 1, 0)])

    assert int(m.ttft_p90_ms) == rank(ttft[keep], 90)
    assert int(m.e2e_p50_ms) == rank(e2e[keep], 50)
    assert np.all(e2e[e2e >= 0] >= ttft[e2e >= 0])
    assert float(m.tpot_mean_ms) > 0
    assert 0 <= float(m.kv_util_mean) <= float(m.kv_util_max) <= 1.0
    assert int(m.dropped) == 0 and not bool(m.time_overflow)


def test_refused_with_a_message():
    w = _workload(0, 2, 64, 16, 10, 1, 2)
    s = compile_stream(w, stateful_singletons=True)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="leaf-first LRU"):
        simulate(s, make_params("ttl_refresh", ttl_s=60), key, scheduler="vllm")
    with pytest.raises(ValueError, match="max_running"):
        simulate(s, make_params("lru", capacity_blocks=50, max_num_seqs=300), key, scheduler="vllm",
                 max_running=256)
    with pytest.raises(ValueError, match="scheduler"):
        simulate(s, make_params("lru", capacity_blocks=50), key, scheduler="sglang")
    with pytest.raises(ValueError, match="step-time preset"):
        make_params("lru", capacity_blocks=50, step_model="tpu_v9")


def test_step_time_is_exact_integer_arithmetic():
    """The engine's step time (int32 lanes) equals the reference's Python-int picoseconds, past int32."""
    from reference_batch import step_time_ps

    from cacheresearch.replica.clock import MS_LIM, PS_PER_MS
    from cacheresearch.replica.vllm import _count, _pairs, step_time

    rng = np.random.default_rng(0)
    cases = [(5_752_705, 17_251, 5_999, 0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
             (2_000_000_000, 10_000_000, 10_000_000, 100_000_000, 1_000_000_000, 131_072, 65_536, 2**31 - 1,
              8192, 2**31 - 8193)]
    for _ in range(40):
        cases.append((int(rng.integers(0, 2_000_000_001)), int(rng.integers(0, 10_000_001)),
                      int(rng.integers(0, 10_000_001)), int(rng.integers(0, 100_000_001)),
                      int(rng.integers(0, 1_000_000_001)), int(rng.integers(0, 131_073)), int(rng.integers(0, 65_537)),
                      int(rng.integers(0, 2**31)), int(rng.integers(0, 8193)), int(rng.integers(0, 2**28))))
    for base, pre, dec, ctx, pctx, pt, dt, sctx, tok, c in cases:
        p = make_params("lru", capacity_blocks=10, step_base_ns=base, step_prefill_ns=pre, step_decode_ns=dec,
                        step_ctx_ps=ctx, step_prefill_ctx_fs=pctx)
        got = step_time(p, np.int32(pt), np.int32(dt), _count(np.int32(sctx)), _pairs(np.int32(tok), np.int32(c)))
        want = step_time_ps(base_ns=base, prefill_ns=pre, decode_ns=dec, ctx_ps=ctx, prefill_ctx_fs=pctx,
                            prefill_tokens=pt, decode_reqs=dt, ctx_tokens=sctx, pairs=tok * c + tok * (tok + 1) // 2)
        if want >= MS_LIM * PS_PER_MS:  # past the clock's span: saturated (the replica reports time_overflow)
            assert int(got.ms) == MS_LIM
        else:
            assert int(got.ms) * PS_PER_MS + int(got.ps) == want, (base, pre, dec, ctx, pctx, pt, dt, sctx, tok, c)


@pytest.mark.slow  # the sweep's vllm path end to end (88 s on 2 cores); test_llmd_benchmark_inputs covers the pipeline
def test_sweep_with_vllm_replicas(tmp_path):
    """``replica.scheduler=vllm`` through the sweep: the serving variables, one cell equal to a direct run."""
    from cacheresearch.shell.sweep import SweepError, run_experiment

    over = ["experiment=llmd_blog", "workload.tenant.n_tenants=6", "workload.tenant.prefix_tokens=320",
            "workload.tenant.query_tokens=64", "workload.tenant.output_tokens=8", "workload.tenant.duration_s=4",
            "fleet.replicas=2", "fleet.prefix_blocks=20", "cache.capacity_blocks=120", "engine.queue_slots=64",
            "fleet.knobs.max_num_seqs=8", "grid.router=[precise,random]", "grid.rate_per_s=[20]",
            "output.figure=false"]
    ds = run_experiment(over, tmp_path)
    for v in ("tpot_mean_s", "e2e_p90_s", "preemptions", "kv_util_mean", "queue_len_mean", "throughput_tps",
              "dropped", "engine_steps", "engine_events"):
        assert v in ds, v
    assert ds.attrs["replica_scheduler"] == "vllm"
    w = tenant_workload(n_tenants=6, prefix_tokens=320, users_per_tenant=5, user_tokens=0, query_tokens=64,
                        rate_per_s=20, duration_s=4, output_tokens=8, block_tokens=16, seed=0)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", capacity_blocks=120, replicas=2, router="random", max_num_seqs=8,
                    step_model="qwen3_32b_h100_tp2")
    m = simulate(s, p, jax.random.key(0), max_replicas=2, scheduler="vllm", max_running=8, queue_slots=64)
    got = ds["ttft_p90_s"].sel(router="random").values.reshape(-1)[0]
    assert got == pytest.approx(int(m.ttft_p90_ms) / 1000.0)
    with pytest.raises(SweepError, match="replica.scheduler"):
        run_experiment(over + ["replica.scheduler=sglang"], tmp_path / "bad")


@pytest.mark.parametrize("router,cap", [pytest.param("llmd_approximate", 60, marks=pytest.mark.slow),
                                        ("llmd_approximate", 30),
                                        pytest.param("llmd_precise", 30, marks=pytest.mark.slow)])
def test_cache_routers_equal_reference(router, cap):
    """The precise and approximate views (an index that forgets) under chunking and preemption."""
    w = _workload(3, 4, 200, 40, 30, 2, 20)
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=48, max_num_seqs=4, index_capacity=cap // 2 + 20)
    m, bits = _run(w, R=3, router=router, **kn)
    ref = _ref(w, R=3, router=router, bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)


@pytest.mark.slow
def test_context_terms_equal_reference():
    """The per-context-token decode term and the prefill-attention term, under chunking and preemption."""
    w = _workload(5, 4, 200, 40, 30, 2, 20)
    kn = dict(capacity_blocks=40, max_num_batched_tokens=48, max_num_seqs=4, step_ctx_ps=37_500,
              step_prefill_ctx_fs=1_750, step_decode_ns=1_000)
    m, bits = _run(w, R=2, router="llmd_precise", **kn)
    ref = _ref(w, R=2, router="llmd_precise", bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)
    assert ref["preemptions"] > 0
    tp = [t for t in ref["tpot_ns"] if t >= 0]
    assert float(m.tpot_mean_ms) == pytest.approx(sum(tp) / len(tp) / 1e6, rel=1e-12)


def test_clock_past_six_hours_equals_reference():
    """The int32 10-us clock ended at 5.9 hours; the picosecond clock runs on (here 9 hours, exact)."""
    w = tenant_workload(n_tenants=3, prefix_tokens=200, query_tokens=40, users_per_tenant=2, rate_per_s=0.004,
                        duration_s=9 * 3600, output_tokens=30, block_tokens=16, seed=1)
    assert int(w.arrival_ms[-1]) > 6 * 3600 * 1000
    kn = dict(capacity_blocks=60, max_num_batched_tokens=64, max_num_seqs=4, step_ctx_ps=40_000)
    m, bits = _run(w, R=2, router="llmd_precise", **kn)
    ref = _ref(w, R=2, router="llmd_precise", bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)
    assert not bool(m.time_overflow)
    assert int(np.max(np.asarray(m.e2e_ms))) > 0


@pytest.mark.parametrize("router,kn", [
    pytest.param("cache_aware", dict(view="stale", stale_lag_ms=150), marks=pytest.mark.slow),
    ("llmd_precise", dict(view="stale", stale_lag_ms=400, instances=2, local_load=True)),
    pytest.param("least_loaded", dict(instances=3, local_load=True), marks=pytest.mark.slow),
])
def test_stale_view_and_local_load_equal_reference(router, kn):
    """The stale view (the pools as of the last sync) and instance-local loads on the vllm replica."""
    w = _workload(4, 4, 200, 40, 30, 2, 20)
    kn = dict(capacity_blocks=50, max_num_batched_tokens=48, max_num_seqs=4, **kn)
    m, bits = _run(w, R=3, router=router, **kn)
    ref = _ref(w, R=3, router=router, bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)


@pytest.mark.slow
def test_kv_pressure_is_what_the_pool_does():
    """kv_pressure (fcfs: in-flight requests pin their blocks) is the vllm pool's own rule: same results."""
    w = _workload(6, 4, 200, 40, 30, 2, 10)
    kn = dict(capacity_blocks=50, max_num_batched_tokens=48, max_num_seqs=4)
    a, _ = _run(w, R=2, router="llmd_precise", **kn)
    b, _ = _run(w, R=2, router="llmd_precise", kv_pressure=True, **kn)
    assert np.array_equal(a.ttft_ms, b.ttft_ms) and np.array_equal(a.replica, b.replica)


def test_gie_scorers_equal_reference():
    """GIE's scorer chain (estimated prefix mode, approximate view) on the vllm replica; the other modes are
    test_gie_scorers.py's slow cases. Here it shares this file's compiled program."""
    w = _workload(3, 4, 200, 40, 30, 2, 12)
    kn = dict(capacity_blocks=70, max_num_batched_tokens=64, max_num_seqs=4, gie_prefix_mode=1,
              gie_window_blocks=5, gie_prefix_w_pct=300, gie_kv_w_pct=200, gie_queue_w_pct=200, view="approximate",
              index_capacity=40)
    m, bits = _run(w, R=3, router="gie", **kn)
    ref = _ref(w, R=3, router="gie", bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)

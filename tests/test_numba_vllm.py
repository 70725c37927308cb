"""The numba backend of the vllm replica (backends/numba_vllm.py) equals the plain-Python reference and the
JAX replica request by request, on test_batch's hypothesis workloads."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch

from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, simulate, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import combine_limbs, finalize
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys
from cacheresearch.workload.synthetic import tenant_workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

_PER_REQUEST = ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica", "client_wait_ms")
_FLOAT32_GAUGES = ("kv_acc", "q_acc", "kv_util_mean", "queue_len_mean", "kv_acc_at", "q_acc_at")
_NUMBA_ONLY = ("vllm_counters_hi", "vllm_counters_lo")  # vLLM's own counters: the JAX replica leaves them 0


def _workload(seed, out, n_tenants=4, rate=30, dur=2):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=200, query_tokens=40, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _numba(s, p, key, *, R, S, Q):
    st_ = static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))), index=int(p.view) == 1, stale=int(p.view) == 2)
    m = finalize(nv.run_stream(s, [p], [key], st_), st_)
    return type(m)(*(np.asarray(x)[0] for x in m))


def _compare(w, *, R, router, S=6, Q=64, seed=0, jax_too=True, gie_hashes=None, **kn):
    s = compile_stream(w, stateful_singletons=True, gie_hashes=gie_hashes)
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    mn = _numba(s, p, key, R=R, S=S, Q=Q)
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    ref = reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, gie_hashes=gie_hashes,
                          **k)
    for f in _PER_REQUEST:
        a, b = np.asarray(getattr(mn, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped"):
        assert int(getattr(mn, f)) == ref[f], f
    mode = "admission" if kn.get("counter_mode") == "per_admission" else "attempt"
    assert combine_limbs(mn.vllm_counters_hi, mn.vllm_counters_lo).tolist() == ref["vllm_counters"][mode]
    if not jax_too:
        return ref
    mj = simulate(s, p, key, max_replicas=R, scheduler="vllm", max_running=S, queue_slots=Q)
    for f in mj._fields:
        if f in _NUMBA_ONLY:
            continue
        a, b = np.asarray(getattr(mj, f)), np.asarray(getattr(mn, f))
        assert a.shape == b.shape, (f, a.shape, b.shape)
        if f in _FLOAT32_GAUGES:  # float32 integrals: the same sums, rounding aside
            np.testing.assert_allclose(b, a, rtol=1e-5, err_msg=f)
        else:
            np.testing.assert_array_equal(b, a, err_msg=f)
    return ref


_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(30, 200), budget=st.sampled_from([16, 48, 200, 4096]),
              seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40),
              mode=st.sampled_from(["per_attempt", "per_admission"]),
              router=st.sampled_from(["round_robin", "random", "llmd_precise", "llmd_approximate", "cache_aware",
                                      "least_loaded", "kubeai_chwbl", "preble", "dynamo_kv", "power_of_two"]))


def _case(seed, cap, budget, seqs, R, out, router, jax_too, mode="per_attempt"):
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs, counter_mode=mode)
    if router == "llmd_approximate":
        kn["index_capacity"] = cap // 2 + 20  # an index that forgets
    _compare(_workload(seed, out), R=R, router=router, jax_too=jax_too, **kn)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_equals_reference_hypothesis(**case):
    """Against the plain-Python reference (the JAX replica: the slow test and test_equals_jax_every_field)."""
    _case(**case, jax_too=False)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_equals_reference_and_jax_hypothesis_many(**case):
    _case(**case, jax_too=True)


@pytest.mark.slow  # long; see README's slow checks
def test_equals_jax_every_field():
    """Every Metrics field against the JAX replica (chunked prefill, preemption, the approximate view)."""
    ref = _compare(_workload(3, 20), R=3, router="llmd_approximate", capacity_blocks=30, max_num_batched_tokens=48,
                   max_num_seqs=4, index_capacity=35)
    assert ref["preemptions"] > 0


@pytest.mark.parametrize("router,kn", [
    pytest.param("cache_aware", dict(view="stale", stale_lag_ms=150), marks=pytest.mark.slow),
    ("llmd_precise", dict(view="stale", stale_lag_ms=400, instances=2, local_load=True)),
    pytest.param("least_loaded", dict(instances=3, local_load=True), marks=pytest.mark.slow),
    pytest.param("llmd_precise", dict(step_ctx_ps=37_500, step_prefill_ctx_fs=1_750, step_decode_ns=1_000),
                 marks=pytest.mark.slow),
])
def test_views_loads_and_step_model_equal_reference(router, kn):
    """The stale view, instance-local loads and the context terms of the step model."""
    _compare(_workload(4, 20), R=3, router=router, jax_too=False, capacity_blocks=50, max_num_batched_tokens=48,
             max_num_seqs=4, **kn)


def test_clock_past_six_hours_and_the_lazy_free_queue():
    """Nine hours of simulated time (int64 ps), and a pool small enough that the free queue compacts."""
    w = tenant_workload(n_tenants=3, prefix_tokens=200, query_tokens=40, users_per_tenant=2, rate_per_s=0.004,
                        duration_s=9 * 3600, output_tokens=30, block_tokens=16, seed=1)
    _compare(w, R=2, router="llmd_precise", S=8, jax_too=False, capacity_blocks=60, max_num_batched_tokens=64,
             max_num_seqs=4, step_ctx_ps=40_000)
    ref = _compare(_workload(7, 30, n_tenants=8, rate=60, dur=3), R=1, router="round_robin", jax_too=False,
                   capacity_blocks=25, max_num_batched_tokens=48, max_num_seqs=6)
    assert ref["preemptions"] > 0


_GIE_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(40, 160), budget=st.sampled_from([48, 200, 4096]),
                  seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(1, 30), mode=st.integers(0, 2),
                  view=st.sampled_from(["precise", "approximate", "stale", "gie_estimate"]),
                  weights=st.tuples(*[st.sampled_from([0, 100, 200, 300]) for _ in range(4)]),
                  window=st.sampled_from([0, 3, 12]), refresh=st.sampled_from([0, 7, 50]),
                  lru=st.sampled_from([12, 20, 31_250]), gauges=st.sampled_from([0, 1]),
                  active=st.sampled_from([0, 100, 300]), timeout=st.sampled_from([0, 40, 150, 120_000]),
                  permits=st.sampled_from([0, 0, 1, 3, 8]))


def _gie_case(seed, cap, budget, seqs, R, out, mode, view, weights, window, refresh, lru, jax_too, gauges=0,
              active=0, timeout=120_000, permits=0):
    """The gie router (every scorer and weight, the tie rule) on every view, GIE's own index on view
    gie_estimate (an LRU small enough to forget), the load scrape every ``refresh`` ms, the loads as the
    replicas' state or as vLLM's gauges (``gauges``: as of the last completed step), llm-d's active-request
    scorer (weight ``active``) with its tracker's expiry every ``timeout`` ms (0: none; the 2-second
    workloads see 40 and 150 ms entries expire), and the client's permits (``permits``; 0: open loop; the JAX
    replica sends every request at its arrival, so it is compared in the open loop only)."""
    w = _workload(seed, out, rate=40)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=11) if view == "gie_estimate" \
        else None
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs, gie_prefix_mode=mode,
              gie_prefix_w_pct=weights[0], gie_kv_w_pct=weights[1], gie_queue_w_pct=weights[2],
              gie_load_w_pct=weights[3], gie_load_threshold=3, gie_window_blocks=window, view=view,
              load_refresh_ms=refresh, gie_lru_capacity=lru, index_capacity=cap // 2 + 20, stale_lag_ms=150,
              load_gauges=gauges, gie_active_w_pct=active, gie_active_timeout_ms=timeout, client_permits=permits)
    return _compare(w, R=R, router="gie", gie_hashes=g, jax_too=jax_too and permits == 0, **kn)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_GIE_CASES)
def test_gie_equals_reference_hypothesis(**case):
    """gie on the numba backend against the plain-Python reference, request by request."""
    _gie_case(**case, jax_too=False)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_GIE_CASES)
def test_gie_equals_reference_and_jax_hypothesis_many(**case):
    _gie_case(**case, jax_too=True)


@pytest.mark.slow  # two JAX compiles (about a minute); test_gie_equals_reference_hypothesis is the default sibling
def test_gie_estimate_and_scrape_equal_jax_every_field():
    """The benchmark's approximate arm in small (estimate mode 1/1/1 on GIE's index, 7 ms scrapes) and its
    precise arm (3/2/2, live loads): every Metrics field against the JAX replica, and the reference."""
    for mode, view, wts, refresh in ((1, "gie_estimate", (100, 100, 100, 0), 7), (2, "precise", (300, 200, 200, 0), 0)):
        for gauges in (0, 1):
            ref = _gie_case(5, 60, 64, 4, 3, 20, mode, view, wts, 0, refresh, 20, jax_too=True, gauges=gauges)
            assert len(set(ref["replica"].tolist())) == 3


@pytest.mark.parametrize("timeout,jax_too", [
    (0, False), (60, False), (120_000, False),
    pytest.param(60, True, marks=pytest.mark.slow),  # the JAX replica's compile: about a minute on 2 cores
])
def test_active_request_scorer_alone_equals_reference_and_jax(timeout, jax_too):
    """The 37-capacity load arm in small (active-request 1 + kv-cache 1) and the active-request scorer alone:
    numba, the reference and (``-m slow``) the JAX replica pick the same pod for every request, with the
    tracker's TTL expiring entries (60 ms) or not (0, 2 min). Alone, the scorer spreads requests over every pod."""
    for wts in ((0, 100, 0, 0), (0, 0, 0, 0)):
        ref = _gie_case(13, 80, 64, 4, 3, 25, 0, "precise", wts, 0, 0, 31_250, jax_too=jax_too, active=100,
                        timeout=timeout)
        assert len(set(ref["replica"].tolist())) == 3


def test_active_request_tracker_expiry_changes_the_picks():
    """With a TTL shorter than the requests' lifetimes, expired entries stop counting and the active-request
    scorer decides differently than with no expiry (numba and the reference agree on both)."""
    picks = []
    for timeout in (0, 30):
        ref = _gie_case(21, 60, 48, 3, 3, 30, 0, "precise", (0, 0, 0, 0), 0, 0, 31_250, jax_too=False, active=100,
                        timeout=timeout)
        picks.append(ref["replica"])
    assert np.any(picks[0] != picks[1])


@pytest.mark.parametrize("refresh,jax_too", [
    (0, False), (7, False), (50, False),
    pytest.param(7, True, marks=pytest.mark.slow),  # the JAX replica's compile: about a minute on 2 cores
])
def test_vllm_gauges_never_count_a_request_admitted_at_its_next_step(refresh, jax_too):
    """load_gauges=1 (vLLM V1's num_requests_waiting as of the end of the last completed step): with a pool and
    a token budget that admit every request at the first step after its arrival, no request is ever counted
    waiting, so the queue scorer alone sees every pod equal and every pick is the tie rule over all pods
    (``floor(bits[1] R / 2**32)``); the replica's own state (load_gauges=0) counts a request from its arrival
    to its next step, and the picks differ. Numba, the reference and (refresh 7, ``-m slow``) the JAX replica
    agree."""
    R = 3
    w = _workload(11, 12, rate=60)
    kn = dict(capacity_blocks=4000, max_num_batched_tokens=100_000, max_num_seqs=64, gie_prefix_mode=0,
              gie_prefix_w_pct=0, gie_kv_w_pct=0, gie_queue_w_pct=100, load_refresh_ms=refresh)
    bits = np.asarray(request_bits(jax.random.key(0), w.n_requests + 1))[: w.n_requests]
    tie = (bits[:, 1].astype(np.uint64) * np.uint64(R)) >> np.uint64(32)
    ref1 = _compare(w, R=R, router="gie", S=64, Q=64, jax_too=jax_too, load_gauges=1, **kn)
    np.testing.assert_array_equal(ref1["replica"], tie.astype(np.int64))
    ref0 = _compare(w, R=R, router="gie", S=64, Q=64, jax_too=False, load_gauges=0, **kn)
    assert np.any(ref0["replica"] != ref1["replica"])


def test_coverage_names_what_is_left_to_jax():
    p = [make_params("lru", capacity_blocks=50, router="gie"), make_params("lru", capacity_blocks=50,
                                                                           router="kv_cost", temperature=0.5)]
    st_ = static_options(p[0], max_replicas=2, scheduler="vllm", max_running=8)
    missing = nv.coverage(p, st_)
    assert not any("gie" in x for x in missing) and any("temperature" in x for x in missing)
    assert nv.coverage([make_params("lru", capacity_blocks=50, router="preble")], st_) == []
    assert nv.coverage(p[:1], static_options(p[0], max_replicas=2)) != []


def test_runner_takes_numba_for_the_vllm_replica_on_cpu():
    """backend=auto sends covered vllm configurations to this backend on a CPU host (same metrics as the
    direct call); backend=numba refuses what it does not cover, naming it."""
    from cacheresearch.core.run import BackendError, simulate_cells

    w = _workload(3, 20)
    s = compile_stream(w, stateful_singletons=True)
    kn = dict(capacity_blocks=30, max_num_batched_tokens=48, max_num_seqs=4)
    ps = [make_params("lru", replicas=3, router=r, **kn) for r in ("llmd_precise", "round_robin")]
    opts = dict(max_replicas=3, scheduler="vllm", max_running=6, queue_slots=64, per_request=True)
    if jax.default_backend() == "cpu":
        m, plan = simulate_cells([s], np.zeros(2, np.int64), ps, np.zeros(2, np.int64), **opts)
        assert [g.backend for g in plan.groups] == ["numba"]
        one = _numba(s, ps[0], jax.random.key(0), R=3, S=6, Q=64)
        np.testing.assert_array_equal(m.ttft_ms[0], one.ttft_ms)
        assert int(m.steps[0]) == int(one.steps)
    with pytest.raises(BackendError, match="temperature"):
        simulate_cells([s], np.zeros(1, np.int64), [make_params("lru", replicas=3, router="kv_cost", temperature=0.5,
                                                                **kn)], np.zeros(1, np.int64), backend="numba", **opts)


@pytest.mark.parametrize("permits", [1, 2, 5])
def test_client_permits_hold_at_most_that_many_requests_in_flight(permits):
    """client_permits (inference-perf's worker semaphores): checked from the outputs alone, independently of
    both implementations. Sends never precede arrivals and keep arrival order; after every send at most
    ``permits`` requests are in flight (sent, last token not yet out); a request that waited went at the first
    whole ms after a finish that freed a permit, and just before it every permit was held. Numba and the
    reference agree request by request (``_compare``); with more permits than requests it is the open loop."""
    w = _workload(7, 25, rate=40)
    kn = dict(capacity_blocks=80, max_num_batched_tokens=64, max_num_seqs=4, load_refresh_ms=7, load_gauges=1)
    ref = _compare(w, R=2, router="llmd_precise", jax_too=False, client_permits=permits, **kn)
    arr = np.asarray(w.arrival_ms, np.int64)
    send = arr + ref["client_wait_ms"]
    fin = send + ref["e2e_ms"]  # the last token's whole ms (ceil of its ps)
    assert np.all(ref["e2e_ms"] >= 0) and np.all(send >= arr) and np.all(np.diff(send) >= 0)
    waited = np.nonzero(ref["client_wait_ms"] > 0)[0]
    assert waited.size > 0
    for i in range(len(send)):
        t = send[i]
        assert np.sum((send[: i + 1] <= t) & (fin[: i + 1] > t)) <= permits, i
    for i in waited:
        t = send[i]
        assert np.any(fin[:i] == t), i  # a finish in the ms before freed the permit
        if t - 1 >= max(arr[i], send[i - 1]):  # it could have gone a ms earlier: every permit was held then
            assert np.sum((send[:i] <= t - 1) & (fin[:i] > t - 1)) >= permits, i
    wide = _compare(w, R=2, router="llmd_precise", jax_too=False, client_permits=len(send), **kn)
    open_ = _compare(w, R=2, router="llmd_precise", jax_too=False, **kn)
    for f in ("ttft_ms", "e2e_ms", "replica", "hit_blocks"):
        np.testing.assert_array_equal(wide[f], open_[f])


def test_client_permits_are_refused_where_they_are_not_modelled():
    """The JAX engine sends every request at its arrival: a closed-loop configuration is refused there, and
    backend=auto takes numba for it."""
    from cacheresearch.core.run import BackendError, simulate_cells

    w = _workload(3, 10)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", replicas=2, router="round_robin", capacity_blocks=40, max_num_seqs=4, client_permits=2)
    opts = dict(max_replicas=2, scheduler="vllm", max_running=6, queue_slots=64, per_request=True)
    with pytest.raises(ValueError, match="client_permits"):
        simulate(s, p, jax.random.key(0), max_replicas=2, scheduler="vllm", max_running=6, queue_slots=64)
    with pytest.raises(BackendError, match="client_permits"):
        simulate_cells([s], np.zeros(1, np.int64), [p], np.zeros(1, np.int64), backend="jax", **opts)
    m, plan = simulate_cells([s], np.zeros(1, np.int64), [p], np.zeros(1, np.int64), **opts)
    assert [g.backend for g in plan.groups] == ["numba"] and int(np.max(m.client_wait_ms)) > 0
    with pytest.raises(ValueError, match="vllm replica only"):
        simulate(s, p, jax.random.key(0), max_replicas=2)

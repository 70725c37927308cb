"""vLLM's own prefix-cache counters, the client's timeouts and the client's permits with async cpu loads on the vllm
replica (numba backend, tests/reference_batch.py): hand-worked cases; the hypothesis equality tests of the counters
live beside the engine's (tests/test_numba_vllm.py, tests/test_tiers_vllm.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch

from cacheresearch.core.params import make_params
from cacheresearch.core.simulate import static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import combine_limbs, finalize
from cacheresearch.workload.table import Workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

#: one replica, a pool of 4 blocks of 16 tokens, every step 1 ms
HAND = dict(capacity_blocks=4, step_base_ns=1_000_000, step_prefill_ns=0, step_decode_ns=0,
            max_num_batched_tokens=8192, max_num_seqs=4)


def _run(w, params, R=1, S=4, Q=64):
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(params[0], max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    m = finalize(nv.run_stream(s, params, [jax.random.key(0)] * len(params), st_), st_)
    return [type(m)(*(np.asarray(x)[g] for x in m)) for g in range(len(params))]


def _counters(m):
    return combine_limbs(m.vllm_counters_hi, m.vllm_counters_lo).tolist()


def test_hand_worked_counters_count_every_failed_attempt_per_attempt():
    """A [1 2 3] (48 tokens, 5 output tokens) at 0 ms; B [1 5 6] (48 tokens, 1 output token) at 1 ms.

    A prefills 0-1 ms and decodes one token a step; from its third token (the step at 2 ms) its KV needs a fourth
    block, so the pool (4) is full. B arrives as the step at 1 ms starts (that step runs first, without it). The
    steps at 2, 3 and 4 ms look B up (hit: block 1, A's, 16 tokens) and fail its allocation (3 + 1 in use + 2 new
    > 4); A's fifth token ends at 5 ms; the step at 5 ms releases A and admits B (hit 16 tokens again). vLLM before
    PR #48860 (``per_attempt``) counts every lookup: queries 48 (A) + 4 x 48 = 240, hits 4 x 16 = 64; after it
    (``per_admission``) once: 96 and 16. No cpu tier: no external counters. B: TTFT 6 - 1 = 5 ms.
    """
    w = Workload.from_lists([[1, 2, 3], [1, 5, 6]], block_tokens=16, arrival_ms=np.array([0, 1]),
                            output_tokens=np.array([5, 1]))
    ps = [make_params("lru", replicas=1, router="round_robin", counter_mode=mode, **HAND)
          for mode in ("per_attempt", "per_admission")]
    att, adm = _run(w, ps)
    assert _counters(att) == [240, 64, 0, 0]
    assert _counters(adm) == [96, 16, 0, 0]
    assert att.ttft_ms.tolist() == adm.ttft_ms.tolist() == [1, 5]
    ref = reference_batch(w, replicas=1, router="round_robin", max_running=4, **HAND)
    assert ref["vllm_counters"] == {"attempt": [240, 64, 0, 0], "admission": [96, 16, 0, 0]}


# ------------------------------------------------------------------------------ the client's timeouts
def _reference(w, router, key, R, tier=None, S=6, Q=64, **kn):
    from cacheresearch.core.params import resolve_router  # noqa: PLC0415
    from cacheresearch.core.simulate import request_bits  # noqa: PLC0415

    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    if tier is not None:
        k.update(cpu_blocks=tier.capacity_blocks, cpu_mbps=tier.read_mbps, cpu_latency_ps=tier.latency_ps,
                 block_bytes=tier.block_bytes, overlap=tier.overlap)
    return reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, **k)


def _engine(w, p, key, R, tier=None, S=6, Q=64):
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    if tier is None:
        m = nv.run_stream(s, [p], [key], st_)
    else:
        from cacheresearch.tiers import vllm as tv  # noqa: PLC0415

        m = tv.run_stream_tiered(s, [p], [key], st_, [tier]).metrics
    m = finalize(m, st_)
    return type(m)(*(np.asarray(x)[0] for x in m))


def _compare(w, *, R, router, tier=None, seed=0, **kn):
    """The engine equals the reference request by request: TTFT, end, hit, preemptions, replica, the client's wait
    and outcome; the steps, events, drops, outcome counts and vLLM's counters."""
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    m = _engine(w, p, key, R, tier)
    ref = _reference(w, router, key, R, tier, **kn)
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica", "client_wait_ms", "status"):
        a, b = np.asarray(getattr(m, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped", "requests_ok", "requests_timed_out", "requests_failed"):
        assert int(getattr(m, f)) == ref[f], f
    mode = "admission" if kn.get("counter_mode") == "per_admission" else "attempt"
    assert _counters(m) == ref["vllm_counters"][mode]
    assert np.asarray(m.busy_ms)[:R].tolist() == [-(-b // 10**9) for b in ref["busy_ps"]]
    assert int(m.requests_ok + m.requests_timed_out + m.requests_failed) == w.n_requests
    assert not bool(m.time_overflow)
    return m, ref


def _workload(seed, out, n_tenants=4, rate=40, dur=2):
    from cacheresearch.workload.synthetic import tenant_workload  # noqa: PLC0415

    return tenant_workload(n_tenants=n_tenants, prefix_tokens=200, query_tokens=40, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _tier(kind, cpu):
    if kind == "none":
        return None
    from cacheresearch.tiers import vllm as tv  # noqa: PLC0415

    return tv.cpu_tier(capacity_blocks=cpu, read_gbps=1.0, latency_us=300.0, block_bytes=2**21, overlap=kind)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(30, 150), budget=st.sampled_from([16, 48, 200, 4096]),
       seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40), timeout=st.sampled_from([0, 20, 60, 200,
                                                                                                         800]),
       permits=st.sampled_from([0, 1, 3, 8]), tier=st.sampled_from(["none", "sync", "async"]), cpu=st.integers(5, 120),
       router=st.sampled_from(["round_robin", "random", "llmd_precise", "least_loaded", "preble"]),
       mode=st.sampled_from(["per_attempt", "per_admission"]))
def test_timeouts_equal_reference_hypothesis(seed, cap, budget, seqs, R, out, timeout, permits, tier, cpu, router,
                                             mode):
    """client_timeout_ms (with the client's permits, a cpu tier of either overlap model, both counter modes):
    the engine equals the reference request by request."""
    _compare(_workload(seed, out), R=R, router=router, tier=_tier(tier, cpu), capacity_blocks=cap,
             max_num_batched_tokens=budget, max_num_seqs=seqs, client_timeout_ms=timeout, client_permits=permits,
             counter_mode=mode)


def test_hand_worked_timeouts():
    """The counters' case with ``client_timeout_ms = 4``: A (sent at 0) must end by 4 ms, B (sent at 1) by 5 ms.

    A's fifth token would end at 5 ms; the steps at 2 and 3 ms fail B's allocation. At the step boundary at 4 ms
    vLLM aborts A (its deadline passed): its blocks are freed, still cached, and the same step admits B (hit:
    block 1, 16 tokens) and prefills its 32 other tokens; B's one token ends at 5 ms, at its deadline: a success,
    TTFT and end-to-end 4 ms. A times out (its first token at 1 ms does not count). Latency and throughput count
    B only: TTFT p50 4 ms, 1 output token over the run's span (0 to B's end, 5 ms): 200 tokens/s, 200 requests/s.
    vLLM's counters (per_attempt): A 48 / 0, B's three lookups (2, 3, 4 ms) 3 x 48 / 3 x 16.
    """
    w = Workload.from_lists([[1, 2, 3], [1, 5, 6]], block_tokens=16, arrival_ms=np.array([0, 1]),
                            output_tokens=np.array([5, 1]))
    p = make_params("lru", replicas=1, router="round_robin", client_timeout_ms=4, **HAND)
    (m,) = _run(w, [p])
    assert m.status.tolist() == [1, 0]
    assert (int(m.requests_ok), int(m.requests_timed_out), int(m.requests_failed)) == (1, 1, 0)
    assert m.ttft_ms.tolist() == [-1, 4] and m.e2e_ms.tolist() == [-1, 4]
    assert int(m.ttft_p50_ms) == 4 and int(m.horizon_time) == 5 and float(m.throughput_tps) == 200.0
    assert _counters(m) == [192, 48, 0, 0]
    assert m.hit_blocks.tolist() == [0, 1]
    ref = reference_batch(w, replicas=1, router="round_robin", max_running=4, client_timeout_ms=4, **HAND)
    assert ref["status"].tolist() == [1, 0] and ref["fin_ps"] == [-2, 5 * 10**9]
    (m0,) = _run(w, [make_params("lru", replicas=1, router="round_robin", **HAND)])  # no timeout: both succeed
    assert m0.status.tolist() == [0, 0] and m0.ttft_ms.tolist() == [1, 5]


def test_timeouts_are_refused_where_they_are_not_modelled():
    from cacheresearch.core.run import BackendError, simulate_cells  # noqa: PLC0415
    from cacheresearch.core.simulate import simulate  # noqa: PLC0415

    w = _workload(3, 10)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", replicas=1, router="round_robin", capacity_blocks=40, max_num_seqs=4, client_timeout_ms=50)
    with pytest.raises(ValueError, match=r"^client_timeout_ms > 0"):
        simulate(s, p, jax.random.key(0), max_replicas=1, scheduler="vllm", max_running=6, queue_slots=64)
    opts = dict(max_replicas=1, scheduler="vllm", max_running=6, queue_slots=64, per_request=True)
    with pytest.raises(BackendError, match="client_timeout_ms"):
        simulate_cells([s], np.zeros(1, np.int64), [p], np.zeros(1, np.int64), backend="jax", **opts)
    with pytest.raises(ValueError, match="client_timeout_ms must be an integer"):
        make_params("lru", capacity_blocks=40, client_timeout_ms=-1)


# ------------------------------------------------------------------------------ permits + async cpu loads
def hang_case(engine: bool):
    """The tiers' hand-worked requests, all scheduled at 0 ms, one permit, the async overlap: A, then B (evicting A's
    blocks 3 and 2 to the cpu tier), then C, whose admission starts a 1 ms load of 2 cpu blocks while nothing else
    runs and D waits for C's permit. The client's loop used to take the idle replica's clock (the send time itself)
    as its next step and never moved: the run never ended. Returns the ends (ps) and the sends (ms)."""
    from cacheresearch.tiers import vllm as tv  # noqa: PLC0415

    w = Workload.from_lists([[1, 2, 3], [4, 5, 6], [1, 2, 3, 7], [8, 9]], block_tokens=16,
                            arrival_ms=np.zeros(4, np.int64), output_tokens=np.ones(4, np.int64))
    kn = dict(HAND, client_permits=1)
    tier = tv.cpu_tier(capacity_blocks=2, read_gbps=4.0, latency_us=500.0, block_bytes=1_000_000, overlap="async")
    if not engine:
        ref = _reference(w, "round_robin", jax.random.key(0), 1, tier, **kn)
        return ref["fin_ps"], (np.asarray(w.arrival_ms) + ref["client_wait_ms"]).tolist()
    p = make_params("lru", replicas=1, router="round_robin", **kn)
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(p, max_replicas=1, per_request=True, scheduler="vllm", max_running=6, queue_slots=64,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    m = finalize(tv.run_stream_tiered(s, [p], [jax.random.key(0)], st_, [tier]).metrics, st_)
    send = (np.asarray(w.arrival_ms) + np.asarray(m.client_wait_ms)[0]).tolist()
    return [int(x) * 10**9 for x in (send + np.asarray(m.e2e_ms)[0])], send


def test_permits_with_async_loads_end():
    """The reported hang (client_permits, a cpu tier, tiers.load_mode=overlap): the case runs to its end within a
    time limit (a subprocess: a spinning numba loop cannot be interrupted), every request ends, and the engine
    equals the reference. By hand (every step 1 ms): A 0-1 ms; B sent at 1 ms, ends at 2 ms; C sent at 2 ms: its
    step allocates the hit and starts the load (2 x 1 MB at 4 GB/s + 0.5 ms = 1 ms); the replica waits for it and D
    for a permit; at 3 ms C is admitted (hit 3 blocks), ends at 4 ms; D is sent at 4 ms and ends at 5 ms. Before
    the fix both the engine and the reference spun at 2 ms forever."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    code = "from test_vllm_client import hang_case; print(hang_case(True))"
    out = subprocess.run([sys.executable, "-c", code], cwd=here.parent, env=env, capture_output=True, text=True,
                         timeout=900)  # a cold numba cache compiles the tiered kernel first (about 2 min)
    assert out.returncode == 0, out.stderr[-2000:]
    fin, send = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr of two lists of ints
    assert send == [0, 1, 2, 4] and fin == [1 * 10**9, 2 * 10**9, 4 * 10**9, 5 * 10**9]
    rfin, rsend = hang_case(False)
    assert rsend == send and rfin == fin


def test_sweep_dataset_has_the_counters_and_the_outcome(tmp_path):
    """``experiment=replay replica=vllm`` with ``grid.counter_mode`` and ``fleet.knobs.client_timeout_ms``: the
    dataset's vLLM counters and outcome counts, self-describing (CF attributes), consistent with each other."""
    import json  # noqa: PLC0415

    import xarray as xr  # noqa: PLC0415

    from cacheresearch.shell import cf  # noqa: PLC0415
    from cacheresearch.shell.sweep import run_experiment  # noqa: PLC0415

    rng = np.random.default_rng(0)
    lines = []
    for i in range(40):  # four shared prefixes of 6 blocks, a private tail each, 16-token blocks
        g = int(rng.integers(0, 4))
        ids = [100 * g + k for k in range(6)] + [1000 + 10 * i + k for k in range(int(rng.integers(1, 4)))]
        lines.append(json.dumps(dict(timestamp=5 * i, input_length=16 * len(ids), output_length=20, hash_ids=ids)))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    run_experiment(["experiment=replay", "replica=vllm", f"trace.path={trace}", "trace.block_tokens=16",
                    "cache.capacity_blocks=24", "fleet.knobs.client_timeout_ms=150",
                    "grid.counter_mode=[per_attempt,per_admission]", "output.figure=false", "launch.progress=false"],
                   tmp_path / "out")
    with xr.open_dataset(tmp_path / "out" / "results.nc", engine="h5netcdf") as ds:
        assert cf.missing(ds) == []
        q, h = ds.vllm_prefix_cache_queries_tokens, ds.vllm_prefix_cache_hits_tokens
        assert float(q.sel(counter_mode="per_attempt")) > float(q.sel(counter_mode="per_admission")) > 0
        assert float(h.sel(counter_mode="per_admission")) > 0
        assert float(ds.vllm_prefix_cache_hit_rate.sel(counter_mode="per_admission")) == pytest.approx(
            float(h.sel(counter_mode="per_admission") / q.sel(counter_mode="per_admission")))
        assert (ds.vllm_external_queries_tokens == 0).all()  # no cpu tier
        total = ds.requests_ok + ds.requests_timed_out + ds.requests_failed
        assert (total == 40).all() and int(ds.requests_timed_out.max()) > 0 and int(ds.requests_ok.min()) > 0
        assert "units" in ds.requests_per_s.attrs and float(ds.requests_per_s.max()) > 0

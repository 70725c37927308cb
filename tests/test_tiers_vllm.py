"""A cpu tier on the vllm replica (cacheresearch/tiers/vllm.py, the numba vllm backend in per-block mode): the engine
equals the plain-Python reference (tests/reference_batch.py's cpu tier) request by request; with capacity 0 it is
today's numba and JAX replica; a hand-worked case; one-line errors."""

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
from cacheresearch.tiers import TierError
from cacheresearch.workload.synthetic import tenant_workload
from cacheresearch.workload.table import Workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")
tv = pytest.importorskip("cacheresearch.tiers.vllm")

def _workload(seed, out, n_tenants=6, rate=40, dur=2):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=200, query_tokens=40, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _st(s, p, R, S=6, Q=64):
    return static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                          max_runs=int(np.max(np.asarray(s.n_runs))), index=int(p.view) == 1, stale=int(p.view) == 2)


def _tiered(w, p, key, tier, R, S=6, Q=64):
    s = compile_stream(w, stateful_singletons=True)
    st_ = _st(s, p, R, S, Q)
    res = tv.run_stream_tiered(s, [p], [key], st_, [tier])
    m = finalize(res.metrics, st_)
    return type(m)(*(np.asarray(x)[0] for x in m)), res.cpu_hit_blocks[0], int(res.offloaded_blocks[0])


def _reference(w, router, key, R, tier, S=6, Q=64, **kn):
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    return reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q,
                           cpu_blocks=tier.capacity_blocks, cpu_mbps=tier.read_mbps, cpu_latency_ps=tier.latency_ps,
                           block_bytes=tier.block_bytes, overlap=tier.overlap, **k)


def _compare(w, *, R, router, tier, seed=0, **kn):
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    m, cpu, off = _tiered(w, p, key, tier, R)
    ref = _reference(w, router, key, R, tier, **kn)
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica"):
        a, b = np.asarray(getattr(m, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    bad = np.nonzero(cpu != ref["cpu_hit_blocks"])[0]
    assert bad.size == 0, ("cpu_hit_blocks", bad[:10], cpu[bad[:10]], ref["cpu_hit_blocks"][bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped"):
        assert int(getattr(m, f)) == ref[f], f
    assert off == ref["offloaded"]
    mode = "admission" if kn.get("counter_mode") == "per_admission" else "attempt"
    assert combine_limbs(m.vllm_counters_hi, m.vllm_counters_lo).tolist() == ref["vllm_counters"][mode]
    # every request is served or dropped (none left waiting on a load), and no replica stalled
    assert int((np.asarray(m.e2e_ms) >= 0).sum()) + int(m.dropped) == w.n_requests
    assert not bool(m.time_overflow)
    # the replicas' busy time (steps and loads) to the ps, rounded up to a ms as the metric is
    assert np.asarray(m.busy_ms)[:R].tolist() == [-(-b // 10**9) for b in ref["busy_ps"]]
    assert np.asarray(m.occupancy)[:R].tolist() == ref["cached"]
    return m, cpu, off, ref


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(30, 150), cpu=st.integers(1, 120),
       budget=st.sampled_from([16, 48, 200, 4096]), seqs=st.integers(1, 6), R=st.integers(1, 3),
       out=st.integers(0, 30), gbps=st.sampled_from([0.5, 4.0, 50.0]), lat=st.sampled_from([0.0, 10.0, 700.0]),
       router=st.sampled_from(["round_robin", "random", "llmd_precise", "cache_aware", "least_loaded", "preble",
                               "dynamo_kv", "kubeai_chwbl"]), overlap=st.sampled_from(tv.OVERLAP_MODES),
       mode=st.sampled_from(["per_attempt", "per_admission"]))
def test_equals_reference_hypothesis(seed, cap, cpu, budget, seqs, R, out, gbps, lat, router, overlap, mode):
    """Request by request against the reference (both overlap models): TTFT, end, hit and cpu-hit blocks,
    preemptions, steps, events, busy time to the ps, blocks offloaded, vLLM's prefix-cache counters (both modes)."""
    tier = tv.cpu_tier(capacity_blocks=cpu, read_gbps=gbps, latency_us=lat, block_bytes=2**21, overlap=overlap)
    _compare(_workload(seed, out), R=R, router=router, tier=tier, capacity_blocks=cap, max_num_batched_tokens=budget,
             max_num_seqs=seqs, counter_mode=mode)


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_reference_case_reloads_and_preempts(overlap):
    """A fixed case where the tier serves blocks, preemption happens, and the load shows in the TTFTs."""
    w = _workload(7, 30, n_tenants=8, rate=60, dur=3)
    tier = tv.cpu_tier(capacity_blocks=80, read_gbps=1.0, latency_us=100.0, block_bytes=2**21, overlap=overlap)
    m, cpu, off, ref = _compare(w, R=1, router="round_robin", tier=tier, capacity_blocks=40,
                                max_num_batched_tokens=48, max_num_seqs=6)
    assert ref["preemptions"] > 0 and cpu.sum() > 0 and off > 0
    m0, cpu0, off0, _ = _compare(w, R=1, router="round_robin", tier=tv.cpu_tier(block_bytes=2**21),
                                 capacity_blocks=40, max_num_batched_tokens=48, max_num_seqs=6)
    assert cpu0.sum() == 0 and off0 == 0
    assert int(np.asarray(m.hit_blocks).sum()) > int(np.asarray(m0.hit_blocks).sum())


ZERO_CASES = [
    ("llmd_precise", 3, dict(capacity_blocks=40, max_num_batched_tokens=48, max_num_seqs=4)),
    ("kubeai_chwbl", 2, dict(capacity_blocks=60, max_num_batched_tokens=200, max_num_seqs=3, view="stale",
                             stale_lag_ms=150)),
]


@pytest.mark.parametrize("router,R,kn", ZERO_CASES)
def test_capacity_zero_is_todays_numba(router, R, kn):
    """cpu capacity 0 (per-block mode, lru) gives every Metrics field of today's numba backend (run mode) bit for
    bit (which equals the JAX replica: test_numba_vllm.py; here directly under -m slow)."""
    _capacity_zero(router, R, kn, jax_too=False)


@pytest.mark.slow  # one JAX vllm program a case (about 30 s each on 2 cores)
@pytest.mark.parametrize("router,R,kn", ZERO_CASES)
def test_capacity_zero_is_todays_numba_and_jax(router, R, kn):
    """... and of the JAX replica bit for bit (the float32 KV and queue integrals included, on these cases)."""
    _capacity_zero(router, R, kn, jax_too=True)


def _capacity_zero(router, R, kn, *, jax_too: bool):
    w = _workload(3, 20)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(1)
    st_ = _st(s, p, R)
    res = tv.run_stream_tiered(s, [p], [key], st_, [tv.cpu_tier(capacity_blocks=0, block_bytes=2**21)])
    mt = finalize(res.metrics, st_)
    mn = finalize(nv.run_stream(s, [p], [key], st_), st_)
    assert int(np.asarray(mn.preemptions)[0]) > 0 or int(np.asarray(mn.hit_tokens_lo)[0]) > 0
    for f in mn._fields:
        np.testing.assert_array_equal(np.asarray(getattr(mt, f)), np.asarray(getattr(mn, f)), err_msg=f)
    assert res.cpu_hit_blocks.sum() == 0 and int(res.offloaded_blocks[0]) == 0
    if not jax_too:
        return
    mj = simulate(s, p, key, max_replicas=R, scheduler="vllm", max_running=6, queue_slots=64)
    for f in mj._fields:
        if f in ("vllm_counters_hi", "vllm_counters_lo"):  # vLLM's own counters: the JAX replica leaves them 0
            continue
        a, b = np.asarray(getattr(mj, f)), np.asarray(getattr(mt, f))[0]
        np.testing.assert_array_equal(b, a, err_msg=f)


def test_hand_worked_offload_and_reload():
    """One replica, a pool of 4 blocks, a cpu tier of 2 blocks; step = 1 ms + 62.5 us per prefill token; a load =
    blocks x 1e6 bytes at 4 GB/s + 0.5 ms.

    A [1 2 3] at 0 ms: 1 + 3 = 4 ms. B [4 5 6] at 100 ms evicts A's blocks 3 then 2 (lowest stamps): cpu = (3, 2).
    C [1 2 3 7] at 200 ms: pool hit 1, cpu hit 2 (2, 3): 3 blocks hit, 16 tokens computed; blocks 2, 3, 7 take
    pool space (1 pinned + 3 new = 4 = the pool); B's 6, 5, 4 are evicted to the cpu tier, which keeps (5, 4). Its
    step: 1 + 1 + load(2 blocks) = 0.5 + 0.5 ms = 3 ms (without the tier: 1 + 3 = 4 ms).
    D [1 2 3 8] at 300 ms: the reloaded blocks are pool blocks now: pool hit 3, cpu hit 0; 7 goes down: cpu (4, 7).
    E [4 5 9] at 400 ms: pool hit 0, cpu hit 1 (4; 5 was dropped): 1 + 2 + 0.25 + 0.5 = 3.75 ms; evicts 8, 3, 2.
    """
    w = Workload.from_lists([[1, 2, 3], [4, 5, 6], [1, 2, 3, 7], [1, 2, 3, 8], [4, 5, 9]], block_tokens=16,
                            arrival_ms=np.array([0, 100, 200, 300, 400]), output_tokens=np.ones(5, np.int64))
    kn = dict(capacity_blocks=4, step_base_ns=1_000_000, step_prefill_ns=62_500, step_decode_ns=0,
              max_num_batched_tokens=8192, max_num_seqs=4)
    p = make_params("lru", replicas=1, router="round_robin", **kn)
    tier = tv.cpu_tier(capacity_blocks=2, read_gbps=4.0, latency_us=500.0, block_bytes=1_000_000)
    assert (tier.read_mbps, tier.latency_ps) == (4000, 500_000_000)
    m, cpu, off = _tiered(w, p, jax.random.key(0), tier, R=1)
    assert np.asarray(m.ttft_ms).tolist() == [4, 4, 3, 2, 4]
    assert np.asarray(m.hit_blocks).tolist() == [0, 0, 3, 3, 1]
    assert cpu.tolist() == [0, 0, 2, 0, 1]
    assert off == 2 + 3 + 1 + 3
    # vLLM's counters (tokens): queries 48 + 48 + 64 + 64 + 48, local hits C 16 and D 48; the connector's queries
    # are the tokens past the local hit (48 + 48 + 48 + 16 + 48), its hits C's 2 and E's 1 cpu blocks
    assert combine_limbs(m.vllm_counters_hi, m.vllm_counters_lo).tolist() == [272, 64, 208, 48]
    assert int(np.asarray(m.busy_ms)[0]) == 17  # 4 + 4 + 3 + 2 + 3.75 ms, rounded up
    assert int(np.asarray(m.max_occupancy)[0]) == 4  # C's 3 hit blocks and 1 computed fill the pool
    m0, cpu0, off0 = _tiered(w, p, jax.random.key(0), tv.cpu_tier(block_bytes=1_000_000), R=1)
    assert np.asarray(m0.ttft_ms).tolist() == [4, 4, 4, 2, 4]
    assert np.asarray(m0.hit_blocks).tolist() == [0, 0, 1, 3, 0]
    assert (cpu0.sum(), off0, int(np.asarray(m0.busy_ms)[0])) == (0, 0, 18)
    ref = _reference(w, "round_robin", jax.random.key(0), 1, tier, **kn)
    assert ref["cpu_hit_blocks"].tolist() == [0, 0, 2, 0, 1] and ref["offloaded"] == 9
    assert ref["busy_ps"] == [16_750_000_000]


def test_hand_worked_async():
    """The same case under ``overlap="async"`` (vLLM's OffloadingConnector): the loads no longer lengthen a step.

    C at 200 ms: its step allocates the hit (1 pinned + blocks 2, 3; B's 6 and 5 go down, cpu = (6, 5)), starts the
    1 ms load and runs nothing; the replica waits for the load (201 ms), then admits C with 3 hit blocks: 1 + 1 = 2
    ms (7 is computed, 4 goes down: cpu (5, 4)); TTFT 3 ms. D as before (2 ms; 7 down: cpu (4, 7)). E at 400 ms:
    block 4 is allocated and loaded (8 down: cpu (4, 8)) until 400.75 ms, then 1 + 2 = 3 ms: TTFT 3.75 ms (4 ms
    rounded up); 3 and 2 go down. Busy: 4 + 4 + 2 + 2 + 3 = 15 ms (the sync case's 16.75 ms less the loads).
    """
    w = Workload.from_lists([[1, 2, 3], [4, 5, 6], [1, 2, 3, 7], [1, 2, 3, 8], [4, 5, 9]], block_tokens=16,
                            arrival_ms=np.array([0, 100, 200, 300, 400]), output_tokens=np.ones(5, np.int64))
    kn = dict(capacity_blocks=4, step_base_ns=1_000_000, step_prefill_ns=62_500, step_decode_ns=0,
              max_num_batched_tokens=8192, max_num_seqs=4)
    p = make_params("lru", replicas=1, router="round_robin", **kn)
    tier = tv.cpu_tier(capacity_blocks=2, read_gbps=4.0, latency_us=500.0, block_bytes=1_000_000, overlap="async")
    m, cpu, off = _tiered(w, p, jax.random.key(0), tier, R=1)
    assert np.asarray(m.ttft_ms).tolist() == [4, 4, 3, 2, 4]
    assert np.asarray(m.hit_blocks).tolist() == [0, 0, 3, 3, 1]
    assert cpu.tolist() == [0, 0, 2, 0, 1]
    assert off == 2 + 3 + 1 + 3
    assert (int(m.busy_ms[0]), int(m.steps)) == (15, 5)
    ref = _reference(w, "round_robin", jax.random.key(0), 1, tier, **kn)
    assert ref["busy_ps"] == [15_000_000_000] and ref["ttft_ps"][4] == 403_750_000_000


def test_one_line_errors():
    with pytest.raises(TierError, match=r"^tiers\.cpu\.read_gbps: the cpu tier holds 10 blocks but has no read "
                                        r"bandwidth; give a positive GB/s$"):
        tv.cpu_tier(capacity_blocks=10, read_gbps=0.0, block_bytes=2**21)
    with pytest.raises(TierError, match=r"^tiers\.cpu\.capacity_blocks: must be a integer >= 0, got -3$"):
        tv.cpu_tier(capacity_blocks=-3, block_bytes=2**21)
    with pytest.raises(TierError, match=r"^tiers\.cpu\.policy: 'fifo'; the vllm replica's cpu tier runs lru only$"):
        tv.cpu_tier(capacity_blocks=10, policy="fifo", block_bytes=2**21)
    with pytest.raises(TierError, match=r"^tiers\.cpu\.overlap: 'layerwise'; choose one of sync, async$"):
        tv.cpu_tier(capacity_blocks=10, overlap="layerwise", block_bytes=2**21)
    w = _workload(0, 2, dur=0.2)
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", capacity_blocks=50)
    st_ = _st(s, p, 1)
    tier = tv.cpu_tier(capacity_blocks=10, block_bytes=2**21)
    with pytest.raises(TierError, match=r"^engine\.backend=jax: tiers\.cpu\.capacity_blocks = 10 asks for a cpu tier "
                                        r"on the vllm replica, which the JAX replica does not model; use "
                                        r"engine\.backend=numba or auto$"):
        tv.run_stream_tiered(s, [p], [jax.random.key(0)], st_, [tier], backend="jax")
    pf = make_params("fifo", capacity_blocks=50)
    with pytest.raises(TierError, match=r"^cache\.policy: 'fifo'; the cpu tier on the vllm replica runs behind"):
        tv.run_stream_tiered(s, [pf], [jax.random.key(0)], st_, [tier])
    with pytest.raises(TierError, match=r"^tiers\.cpu\.capacity_blocks: must be an integer >= 0, got -1$"):
        tv.run_stream_tiered(s, [p], [jax.random.key(0)], st_, [tv.VllmCpuTier(-1, 1000, 0, 2**21)])


# ------------------------------------------------------------------------------ experiment=tiers study.replica=vllm
SMALL = ["experiment=tiers", "study.replica=vllm", "study.workloads=[design]", "study.gpu_blocks=150",
         "study.design.n_tenants=12", "study.design.prefix_tokens=640", "study.design.n_requests=150",
         "study.design.rate_per_s=4.0", "study.design.replicas=3", "grid.cpu_capacity_blocks=[0,1.0,400]",
         "grid.cpu_gbps=[2.0,50.0]", "grid.router=[random,tier_scorer]"]


def test_tiers_study_on_the_vllm_replica():
    """The grid on the vllm replica: the fcfs study's variables, pool and disk 0, one cell recomputed by the
    reference (its hits by tier and TTFT p50 / p99), and tier_scorer run as weighted_scorers."""
    from cacheresearch.core.params import STEP_PRESETS  # noqa: PLC0415
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study, summarize  # noqa: PLC0415
    from cacheresearch.studies.base import study_cfg  # noqa: PLC0415
    from cacheresearch.studies.tiers import DEFAULTS, tier_workload  # noqa: PLC0415
    from cacheresearch.studies.tiers_vllm import _KNOBS  # noqa: PLC0415
    from cacheresearch.tiers import TieredConfig, tier_block_bytes  # noqa: PLC0415

    cfg = compose_config(SMALL)
    ds = run_study(cfg)
    assert ds.attrs["replica"] == "vllm"
    for v in ("token_hit_rate", "hit_rate_by_tier", "ttft_p50_s", "ttft_p99_s", "cpu_write_utilisation"):
        assert v in ds
    np.testing.assert_allclose(ds.hit_rate_by_tier.sum("tier"), ds.token_hit_rate, rtol=1e-12)
    assert float(abs(ds.hit_rate_by_tier.sel(tier=["pool", "disk"])).max()) == 0.0
    assert float(ds.hit_rate_by_tier.sel(cpu_capacity="0", tier="cpu").max()) == 0.0
    assert float(ds.hit_rate_by_tier.sel(cpu_capacity="400", tier="cpu").max()) > 0
    assert "not run on the vllm replica" in summarize(ds)
    c = study_cfg(cfg, DEFAULTS)
    w, R = tier_workload("design", c)
    d = TieredConfig(gpu_blocks=0)
    kn = dict(capacity_blocks=150, max_num_seqs=256, max_num_batched_tokens=8192, prefix_blocks=640 // 16,
              **{k: getattr(d, k) for k in _KNOBS},
              **{k: v for k, v in STEP_PRESETS["llama31_8b_h100_tp1"].items() if k.startswith("step_")})
    tier = tv.cpu_tier(capacity_blocks=400, read_gbps=2.0, block_bytes=tier_block_bytes("llama3_8b", 16))
    inp = w.input_tokens.sum()
    for router, rule in (("random", "random"), ("tier_scorer", "weighted_scorers")):
        ref = _reference(w, rule, jax.random.key(0), R, tier, S=256, Q=4096, **kn)
        got = ds.sel(workload="design", router=router, cpu_capacity="400", cpu_gbps=2.0)
        hit_tok = np.minimum(ref["hit_blocks"] * 16, w.input_tokens).sum()
        assert float(got.token_hit_rate) == pytest.approx(hit_tok / inp, rel=1e-12)
        assert float(got.hit_rate_by_tier.sel(tier="cpu")) == pytest.approx(ref["cpu_hit_blocks"].sum() * 16 / inp,
                                                                            rel=1e-12)
        s = np.sort(ref["ttft_ms"])
        assert float(got.ttft_p50_s) == s[-(-50 * len(s) // 100) - 1] / 1000
        assert float(got.ttft_p99_s) == s[-(-99 * len(s) // 100) - 1] / 1000
    # study.load_mode=overlap: the async model, one cell against the reference
    da = run_study(compose_config(SMALL + ["study.load_mode=overlap", "grid.router=[random]", "grid.cpu_gbps=[2.0]"]))
    ta = tv.cpu_tier(capacity_blocks=400, read_gbps=2.0, block_bytes=tier_block_bytes("llama3_8b", 16), overlap="async")
    ref = _reference(w, "random", jax.random.key(0), R, ta, S=256, Q=4096, **kn)
    got = da.sel(workload="design", router="random", cpu_capacity="400", cpu_gbps=2.0)
    s = np.sort(ref["ttft_ms"])
    assert float(got.ttft_p99_s) == s[-(-99 * len(s) // 100) - 1] / 1000
    cpu_rate = ref["cpu_hit_blocks"].sum() * 16 / inp
    assert cpu_rate > 0 and float(got.hit_rate_by_tier.sel(tier="cpu")) == pytest.approx(cpu_rate, rel=1e-12)
    assert da.attrs["load_mode"] == "overlap"


@pytest.mark.parametrize("override,key", [
    ("study.lower={disk: {capacity_blocks: 100}}", "study.lower"),
    ("engine.backend=jax", "engine.backend=jax"),
    ("study.load_mode=lazy", "study.load_mode"),
    ("study.offload=write_through", "study.offload"),
    ("study.cpu_policy=sieve", "study.cpu_policy"),
    ("grid.router=[gie]", "grid.router"),
    ("study.replica=sglang", "study.replica"),
    ("grid.cpu_gbps=[0.0]", "grid.cpu_gbps"),
])
def test_tiers_study_vllm_bad_input_names_the_key(override, key):
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415
    from cacheresearch.studies.base import StudyError  # noqa: PLC0415

    with pytest.raises(StudyError) as e:
        run_study(compose_config(SMALL + [override]))
    assert str(e.value).startswith(key) and "\n" not in str(e.value), str(e.value)

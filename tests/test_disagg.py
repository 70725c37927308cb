"""P/D disaggregation (cacheresearch/fleet/disagg.py) equals its plain-Python reference (tests/reference_disagg.py)
request by request; the vllm backend's imported KV equals tests/reference_batch.py's; one-line errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch
from reference_disagg import reference_disagg, reference_link

from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.fleet.disagg import DisaggCell, DisaggError, KvLink, link_arrivals, pd_shape, simulate_disagg
from cacheresearch.workload.synthetic import tenant_workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")
KEY = 7


def _workload(seed, out, rate=30, dur=2):
    return tenant_workload(n_tenants=4, prefix_tokens=200, query_tokens=40, users_per_tenant=2, rate_per_s=rate,
                           duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _bits(n):
    return np.asarray(request_bits(jax.random.key(KEY), n + 1))[:n]


def _ref_kwargs(router, kn):
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    return k


def _check(wl, *, pd, prouter, drouter, link, block_bytes, kn, S=6, Q=64):
    R = sum(pd) if pd else 3
    if pd is None:
        cell = DisaggCell(None, make_params("lru", replicas=R, router=drouter, **kn))
    else:
        cell = DisaggCell(make_params("lru", replicas=pd[0], router=prouter, **kn),
                          make_params("lru", replicas=pd[1], router=drouter, **kn), link, block_bytes)
    res = simulate_disagg(wl, [cell], key=jax.random.key(KEY), max_running=S, queue_slots=Q)
    dec = _ref_kwargs(drouter, kn)
    if pd is None:
        dec["replicas"] = R
    pre = {} if pd is None else dict(_ref_kwargs(prouter, kn), max_running=S, queue_slots=Q)
    ref = reference_disagg(wl, pd=pd, prefill=pre,
                           decode=dict(dec, max_running=S, queue_slots=Q), mbps=link.mbps if link else 1,
                           latency_ns=link.latency_ns if link else 0, mode=link.mode if link else "prefill",
                           block_bytes=block_bytes, bits=_bits)
    for f in ("ttft_ms", "e2e_ms", "prefill_hit_blocks", "prefill_replica", "decode_replica"):
        a, b = np.asarray(getattr(res, f)[0]), np.asarray(ref[f], np.int64)
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    if pd is not None:
        for f in ("prefill_done_ms", "kv_arrival_ms"):
            np.testing.assert_array_equal(getattr(res, f)[0], np.asarray(ref[f], np.int64), err_msg=f)
        # causality: arrival <= prefill done <= KV landed <= first token <= last token, for every served request
        ok = res.ttft_ms[0] >= 0
        arr, done, land = wl.arrival_ms[ok], res.prefill_done_ms[0][ok], res.kv_arrival_ms[0][ok]
        assert np.all(done >= arr) and np.all(land >= done)
        assert np.all(arr + res.ttft_ms[0][ok] > land) and np.all(res.e2e_ms[0][ok] >= res.ttft_ms[0][ok])
        assert np.all(res.decode_replica[0][ok] < pd[1]) and np.all(res.prefill_replica[0] < pd[0])
    assert int(res.preemptions[0]) == ref["preemptions"] and int(res.dropped[0]) == ref["dropped"]
    return res, ref


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), P=st.integers(1, 3), D=st.integers(1, 3), out=st.integers(0, 30),
       cap=st.integers(40, 200), budget=st.sampled_from([48, 200, 4096]), seqs=st.integers(1, 6),
       prouter=st.sampled_from(["llmd_precise", "round_robin", "cache_aware", "random", "least_loaded"]),
       drouter=st.sampled_from(["least_loaded", "round_robin", "power_of_two"]),
       mbps=st.sampled_from([1, 50, 5_000, 50_000]), lat_us=st.sampled_from([0.0, 10.0, 3000.0]),
       mode=st.sampled_from(["prefill", "shared"]))
def test_disagg_equals_reference_hypothesis(seed, P, D, out, cap, budget, seqs, prouter, drouter, mbps, lat_us,
                                            mode):
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs)
    _check(_workload(seed, out), pd=(P, D), prouter=prouter, drouter=drouter,
           link=KvLink(mbps / 1000, lat_us, mode), block_bytes=16 * 2048, kn=kn)


def test_aggregated_equals_reference():
    _check(_workload(1, 12), pd=None, prouter=None, drouter="llmd_precise", link=None, block_bytes=0,
           kn=dict(capacity_blocks=120, max_num_batched_tokens=200, max_num_seqs=4))


def test_disagg_contention_and_preemption():
    """A slow shared link queues transfers (landings spread past the prefill finishes); a small decode pool
    preempts; still equal to the reference."""
    kn = dict(capacity_blocks=60, max_num_batched_tokens=200, max_num_seqs=6)
    res, ref = _check(_workload(3, 40, rate=40), pd=(2, 1), prouter="llmd_precise", drouter="least_loaded",
                      link=KvLink(0.05, 5.0, "shared"), block_bytes=16 * 4096, kn=kn)
    wait = res.kv_arrival_ms[0] - res.prefill_done_ms[0]
    assert wait.max() > wait.min() + 10  # the link queued
    assert ref["preemptions"] > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(30, 200), budget=st.sampled_from([16, 48, 4096]),
       seqs=st.integers(1, 6), out=st.integers(0, 30), frac=st.integers(0, 100))
def test_imported_kv_equals_reference(seed, cap, budget, seqs, out, frac):
    """The backend's ``imported`` tokens (any subset of requests, any count) against reference_batch's."""
    w = _workload(seed, out)
    rng = np.random.default_rng(seed)
    imp = np.where(rng.integers(0, 100, w.n_requests) < frac, rng.integers(0, 400, w.n_requests), 0)
    p = make_params("lru", replicas=2, router="llmd_precise", capacity_blocks=cap, max_num_batched_tokens=budget,
                    max_num_seqs=seqs)
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(p, max_replicas=2, per_request=True, scheduler="vllm", max_running=6, queue_slots=64,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    m = nv.run_stream(s, [p], [jax.random.key(KEY)], st_, imported=imp)
    ref = reference_batch(w, replicas=2, max_running=6, queue_slots=64, imported=imp, bits=_bits(w.n_requests),
                          **_ref_kwargs("llmd_precise", dict(capacity_blocks=cap, max_num_batched_tokens=budget,
                                                             max_num_seqs=seqs)))
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "replica", "preempted"):
        np.testing.assert_array_equal(np.asarray(getattr(m, f))[0], np.asarray(ref[f]), err_msg=f)


def test_imported_shortens_the_prefill():
    """With the whole prompt imported only its last token is computed: TTFT drops to about one step."""
    w = _workload(0, 4, rate=5)
    a = reference_batch(w, replicas=1, capacity_blocks=4000, router="round_robin")
    b = reference_batch(w, replicas=1, capacity_blocks=4000, router="round_robin", imported=w.input_tokens)
    assert b["ttft_ms"][0] < a["ttft_ms"][0] and b["ttft_ms"].mean() < a["ttft_ms"].mean()


def test_link_arrivals_equal_reference():
    rng = np.random.default_rng(1)
    n = 200
    done = np.sort(rng.integers(-5, 500, n))
    done[rng.integers(0, n, 20)] = -1
    worker, nbytes = rng.integers(0, 3, n), rng.integers(1, 10**8, n)
    for mode in ("prefill", "shared"):
        link = KvLink(2.5, 7.5, mode)
        a = link_arrivals(done, worker, nbytes, link)
        b = reference_link(done, worker, nbytes, mbps=link.mbps, latency_ns=link.latency_ns, mode=mode)
        np.testing.assert_array_equal(a, np.asarray(b, np.int64))


@pytest.mark.parametrize("spec,msg", [("4:0", "0 decode workers"), ("0:4", "0 prefill workers"),
                                      ("2-6", "is not 'agg' or 'P:D'"), ("x:y", "is not 'agg'")])
def test_pd_shape_errors(spec, msg):
    with pytest.raises(DisaggError, match=msg) as e:
        pd_shape(spec)
    assert "\n" not in str(e.value) and str(e.value).startswith("grid.pd:")


def test_pd_shape_and_link_checks():
    assert pd_shape("agg") is None and pd_shape(" 2:6 ") == (2, 6)
    for kw, msg in ((dict(gbps=0.0), "moves no KV"), (dict(gbps=-1.0), "moves no KV"),
                    (dict(latency_us=-1.0), "link_latency_us"), (dict(mode="bus"), "disagg.link:")):
        with pytest.raises(DisaggError, match=msg) as e:
            KvLink(**kw)
        assert "\n" not in str(e.value)


_SMALL = dict(workload=dict(n_tenants=6, prefix_tokens=160, suffix_tokens=40, n_requests=120, hot_share=0.3,
                            output_tokens=8, block_tokens=16),
              replicas=3, prefix_cache=["on", "off"],
              vllm=dict(step_model="llama31_8b_h100_tp1", capacity_blocks=200, max_num_seqs=8,
                        max_num_batched_tokens=256, queue_slots=64))


_GRID = dict(pd=["agg", "1:2", "2:1"], router=["llmd_precise"], link_gbps=[0.05, 50.0], rate_per_s=[20.0])


def test_study_cells_equal_the_reference():
    """experiment=disagg on a small fleet: a split cell's TTFT percentiles and ITL from the reference."""
    from cacheresearch.replica.hardware import block_bytes
    from cacheresearch.studies import disagg as S
    from cacheresearch.studies.base import run_in_memory
    from cacheresearch.workload.synthetic import design_workload

    ds = run_in_memory(S.STUDIES[0], dict(kind="disagg", seed=1, seeds=1, study=_SMALL, grid=_GRID))
    assert "the best split is" in S.summarize_disagg(ds)
    w = S.salted(design_workload(**_SMALL["workload"], rate_per_s=20.0, seed=1))
    kn = dict(capacity_blocks=200, max_num_batched_tokens=256, max_num_seqs=8, step_base_ns=5_752_705,
              step_prefill_ns=17_251, step_decode_ns=5_999)
    link = KvLink(0.05, 10.0, "prefill")
    ref = reference_disagg(w, pd=(2, 1), prefill=dict(_ref_kwargs("llmd_precise", kn), max_running=8, queue_slots=64),
                           decode=dict(_ref_kwargs("least_loaded", kn), max_running=8, queue_slots=64),
                           mbps=link.mbps, latency_ns=link.latency_ns, block_bytes=block_bytes("llama3_8b"),
                           bits=lambda n: np.asarray(request_bits(jax.random.key(0), n + 1))[:n])
    t, e = np.asarray(ref["ttft_ms"]), np.asarray(ref["e2e_ms"])
    cell = ds.sel(rate_per_s=20.0, pd="2:1", router="llmd_precise", prefix_cache="off", link_gbps=0.05)
    ok = t >= 0
    assert float(cell.ttft_p99_ms) == float(np.sort(t[ok])[(99 * ok.sum() + 99) // 100 - 1])
    assert float(cell.itl_mean_ms) == pytest.approx(((e - t)[ok] / 7).mean())
    assert int(cell.gpus) == 3 and float(ds.link_wait_ms.sel(pd="agg").max()) == 0.0


@pytest.mark.parametrize("over,grid,msg", [
    ({}, dict(pd=["4:0"]), "grid.pd: '4:0' has 0 decode workers"),
    ({}, dict(pd=["1:1"]), "uses 2 GPUs; every P:D must sum"),
    ({}, dict(link_gbps=[0.0]), "disagg.link_gbps: a link of 0.0 GB/s"),
    ({}, dict(policy=["lru"]), "grid.policy: unknown key"),
    (dict(engine=dict(backend="jax")), {}, "engine.backend=jax: experiment=disagg"),
    (dict(prefix_cache=["maybe"]), {}, "study.prefix_cache")])
def test_study_errors_are_one_line(over, grid, msg):
    from cacheresearch.studies import disagg as S
    from cacheresearch.studies.base import StudyError, run_in_memory

    with pytest.raises(StudyError, match=msg) as e:
        eng = over.pop("engine", None)
        cfg = dict(kind="disagg", study=dict(_SMALL, **over), grid=dict(_GRID, **grid))
        run_in_memory(S.STUDIES[0], dict(cfg, engine=eng) if eng else cfg)
    assert "\n" not in str(e.value)


def test_study_on_a_trace_equals_the_reference():
    """study.trace.path: a Mooncake trace (512-token blocks) replayed at each rate_per_s (arrivals scaled about the
    first to that mean rate); a split cell equals the reference on the scaled trace; a missing file is one line."""
    from pathlib import Path

    from cacheresearch.replica.hardware import block_bytes
    from cacheresearch.studies import disagg as S
    from cacheresearch.studies.base import StudyError, run_in_memory
    from cacheresearch.workload.trace import load_trace

    path = str(Path(__file__).parent / "fixtures" / "mini_mooncake.jsonl")
    study = dict(_SMALL, prefix_cache=["on"], trace=dict(path=path, max_requests=40, block_tokens=None))
    ds = run_in_memory(S.STUDIES[0], dict(kind="disagg", seed=1, seeds=1, study=study, grid=_GRID))
    assert ds.attrs["workload"] != "design scenario"
    w = S.at_rate(load_trace(path, max_requests=40), 20.0)
    arr = w.arrival_ms.astype(np.int64)
    assert (np.diff(arr) >= 0).all() and abs(39 * 1000.0 / (arr[-1] - arr[0]) - 20.0) < 0.5
    kn = dict(capacity_blocks=200, max_num_batched_tokens=256, max_num_seqs=8, step_base_ns=5_752_705,
              step_prefill_ns=17_251, step_decode_ns=5_999)
    link = KvLink(0.05, 10.0, "prefill")
    ref = reference_disagg(w, pd=(1, 2), prefill=dict(_ref_kwargs("llmd_precise", kn), max_running=8, queue_slots=64),
                           decode=dict(_ref_kwargs("least_loaded", kn), max_running=8, queue_slots=64),
                           mbps=link.mbps, latency_ns=link.latency_ns,
                           block_bytes=block_bytes("llama3_8b", block_tokens=int(w.block_tokens)),
                           bits=lambda n: np.asarray(request_bits(jax.random.key(0), n + 1))[:n])
    t = np.asarray(ref["ttft_ms"])
    ok = t >= 0
    cell = ds.sel(rate_per_s=20.0, pd="1:2", router="llmd_precise", prefix_cache="on", link_gbps=0.05)
    assert float(cell.ttft_p99_ms) == float(np.sort(t[ok])[(99 * ok.sum() + 99) // 100 - 1])
    with pytest.raises(StudyError, match="study.trace.path: no such trace file") as e:
        run_in_memory(S.STUDIES[0], dict(kind="disagg", study=dict(study, trace=dict(path="nope.jsonl")), grid=_GRID))
    assert "\n" not in str(e.value)

"""Autoscaled fleet (issue 46): the compiled kernel equals the block-level reference request by request,
time-varying rates follow their shape, impossible shapes are one-line errors naming the key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_autoscale import reference_autoscale

from cacheresearch.fleet.autoscale import (
    AUTOSCALE_ROUTERS,
    SCALER_POLICIES,
    ScalerConfig,
    day_metrics,
    simulate_autoscale,
)
from cacheresearch.workload.rate import rate_per_bin, shape_from, sine_shape, step_shape, thin_arrivals, warp_arrivals
from cacheresearch.workload.synthetic import design_workload


def _wl(seed=1, n=300, tenants=10, duration=1500.0):
    return design_workload(n_tenants=tenants, prefix_tokens=160, suffix_tokens=40, n_requests=n, duration_s=duration,
                           block_tokens=16, output_tokens=50, hot_share=0.3, seed=seed)


def _check_equal(wl, cfgs):
    res = simulate_autoscale(wl, cfgs)
    for g, c in enumerate(cfgs):
        out, tl, tot = reference_autoscale(wl, c.as_reference(), ring_vnodes=c.ring_vnodes)
        o = np.array(out, np.int64).reshape(-1, 4)
        got = np.stack([res.replica[g], res.hit_blocks[g], res.ttft_ms[g], res.best_match[g]], 1)
        assert np.array_equal(o, got), (c, np.nonzero((o != got).any(1))[0][:3])
        tla = np.array(tl, np.int64).reshape(-1, 2)
        assert np.array_equal(tla, res.timeline[g][: len(tla)]) and len(tla) == res.timeline.shape[1]
        assert (tot["gpu_ms"], tot["ups"], tot["downs"], tot["prewarmed"], tot["end_ms"]) == (
            res.gpu_ms[g], res.scale_ups[g], res.scale_downs[g], res.prewarmed_blocks[g], res.end_ms[g]), c
    return res


def _cfg(pol, rt, **kw):
    base = dict(policy=pol, router=rt, max_replicas=5, capacity=40, prefill_tps=120, decode_us_per_token=2000,
                interval_ms=20_000, cooldown_ms=30_000, delay_ms=15_000,
                target=60 if pol in ("utilisation", "kv") else 2,
                slo_ms=1500, prewarm_pct=50, prefix_blocks=8, schedule=(1, 3, 2), schedule_period_ms=300_000,
                balance_abs=3)
    base.update(kw)
    return ScalerConfig(**base)


def test_every_policy_and_router_equals_reference_and_scales():
    wl = _wl()
    cfgs = [_cfg(p, r) for p in SCALER_POLICIES for r in AUTOSCALE_ROUTERS]
    res = _check_equal(wl, cfgs)
    assert (res.scale_ups > 0).all() and (res.scale_downs > 0).any() and (res.prewarmed_blocks > 0).any()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 50), pol=st.sampled_from(SCALER_POLICIES), rt=st.sampled_from(AUTOSCALE_ROUTERS),
       delay=st.sampled_from([0, 7_000, 40_000]), cool=st.sampled_from([0, 25_000]), pw=st.sampled_from([0, 30, 100]),
       cap=st.integers(0, 80), mx=st.integers(1, 6), tps=st.sampled_from([60, 150, 2_000]),
       interval=st.sampled_from([5_000, 20_000]), pb=st.integers(1, 12))
def test_kernel_equals_reference_hypothesis(seed, pol, rt, delay, cool, pw, cap, mx, tps, interval, pb):
    wl = _wl(seed=seed, n=120, tenants=6, duration=600.0)
    mn = 1 + seed % mx
    c = _cfg(pol, rt, delay_ms=delay, cooldown_ms=cool, prewarm_pct=pw, capacity=cap, max_replicas=mx,
             min_replicas=mn, initial_replicas=mn, prefill_tps=tps, interval_ms=interval, prefix_blocks=pb,
             ring_vnodes=1 + seed % 5, target=1 + seed % 3 if pol == "queue" else 50,
             schedule=tuple(1 + (seed + k) % mx for k in range(3)), schedule_period_ms=60_000)
    _check_equal(wl, [c])


def test_ring_moves_only_the_removed_share():
    """Consistent hashing: with a fixed schedule 4 -> 3 replicas, only requests whose ring owner left move;
    the modulo rule (prefix_hash) remaps most of them."""
    wl = _wl(n=400, tenants=40, duration=2000.0)
    cfgs = [_cfg("schedule", r, max_replicas=4, min_replicas=3, initial_replicas=4, schedule=(4, 3),
                 schedule_period_ms=1_000_000, delay_ms=0, cooldown_ms=0, capacity=10_000, prefill_tps=100_000)
            for r in ("ring", "prefix_hash")]
    res = _check_equal(wl, cfgs)
    early, late = wl.arrival_ms < 1_000_000, wl.arrival_ms >= 1_020_000
    moved = {}
    for g, name in enumerate(("ring", "prefix_hash")):
        owner = {}
        for t, r in zip(wl.tenant[early], res.replica[g][early]):
            owner[int(t)] = int(r)
        lt = [(int(t), int(r)) for t, r in zip(wl.tenant[late], res.replica[g][late]) if int(t) in owner]
        moved[name] = np.mean([owner[t] != r for t, r in lt])
        if name == "ring":  # a tenant moves only if its owner was slot 3 (the one removed)
            assert all(owner[t] == 3 for t, r in lt if owner[t] != r)
    assert moved["ring"] < moved["prefix_hash"]


def test_cold_and_prewarmed_starts():
    """A replica added at a tick starts empty (no hit on its first request) unless prewarmed, which copies
    the lowest active sibling's most recent blocks."""
    wl = _wl(n=300, tenants=3)
    cfgs = [_cfg("schedule", "least_loaded", schedule=(1, 2), schedule_period_ms=500_000, delay_ms=0,
                 prewarm_pct=p, capacity=200, prefill_tps=100_000) for p in (0, 100)]
    res = _check_equal(wl, cfgs)
    first = int(np.argmax(res.replica[0] == 1))
    assert res.hit_blocks[0, first] == 0 and res.hit_blocks[1, int(np.argmax(res.replica[1] == 1))] > 0
    assert res.prewarmed_blocks[0] == 0 and res.prewarmed_blocks[1] > 0


def test_day_metrics_from_the_per_request_outputs():
    wl = _wl()
    res = simulate_autoscale(wl, [_cfg("queue", "ring")])
    m = day_metrics(wl, res, bin_s=300.0)
    ht = np.minimum(res.hit_blocks[0].astype(np.int64) * 16, wl.input_tokens)
    assert m["totals"]["token_hit_rate"][0] == ht.sum() / wl.input_tokens.sum()
    assert m["totals"]["gpu_hours"][0] == res.gpu_ms[0] / 3.6e6
    srt = np.sort(res.ttft_ms[0])
    assert m["totals"]["ttft_p90_ms"][0] == srt[int(np.ceil(0.9 * srt.size)) - 1]
    assert m["totals"]["recompute_tokens"][0] >= 0
    assert m["series"]["replicas"].shape[1] == m["series"]["hit_rate"].shape[1]


@pytest.mark.parametrize("kw, key", [
    (dict(min_replicas=3, max_replicas=2, initial_replicas=2), "min_replicas"),
    (dict(delay_ms=-1), "delay_ms"),
    (dict(cooldown_ms=-5), "cooldown_ms"),
    (dict(policy="magic"), "policy"),
    (dict(router="nope"), "router"),
    (dict(initial_replicas=9), "initial_replicas"),
    (dict(chwbl_c_pct=90), "chwbl_c_pct"),
    (dict(prewarm_pct=101), "prewarm_pct"),
    (dict(schedule=()), "schedule"),
    (dict(interval_ms=0), "interval_ms"),
])
def test_impossible_shapes_are_one_line_errors(kw, key):
    with pytest.raises(ValueError, match=f"autoscale.{key}") as e:
        ScalerConfig(**kw)
    assert "\n" not in str(e.value)


def test_warp_follows_a_sine_and_keeps_every_request():
    wl = design_workload(n_tenants=5, prefix_tokens=32, suffix_tokens=16, n_requests=40_000, duration_s=86_400.0,
                         seed=3)
    span = (wl.arrival_ms[-1] - wl.arrival_ms[0]) / 1000.0
    w = warp_arrivals(wl, sine_shape(span, amplitude=0.8, peak_s=50_400.0))
    assert w.n_requests == wl.n_requests and np.array_equal(w.keys, wl.keys)
    assert np.all(np.diff(w.arrival_ms) >= 0) and abs(int(w.arrival_ms[-1]) - int(wl.arrival_ms[-1])) <= 1
    _, r = rate_per_bin(w.arrival_ms - w.arrival_ms[0], 3600.0)
    mean = wl.n_requests / span
    t = np.arange(r.size) * 3600.0 + 1800.0
    want = mean * (1 + 0.8 * np.cos(2 * np.pi * (t - 50_400.0) / 86_400.0))
    assert np.max(np.abs(r[:-1] - want[:-1]) / mean) < 0.12  # Poisson noise: ~1,700 per hour, sd ~2.5%


def test_steps_and_thinning():
    wl = design_workload(n_tenants=5, prefix_tokens=32, suffix_tokens=16, n_requests=20_000, duration_s=10_000.0,
                         seed=4)
    span = (wl.arrival_ms[-1] - wl.arrival_ms[0]) / 1000.0
    sh = step_shape(span, [[0, 1], [4000, 5], [5000, 1]])
    w = warp_arrivals(wl, sh)
    rel = (w.arrival_ms - w.arrival_ms[0]) / 1000.0
    inb = np.mean((rel >= 4000) & (rel < 5000))
    assert abs(inb - 5000 / (span - 1000 + 5000)) < 0.02  # 1,000 s at 5x: 5,000 of span + 4,000 rate-seconds
    th = thin_arrivals(wl, sh, seed=0)
    rel = (th.arrival_ms - th.arrival_ms[0]) / 1000.0
    assert 0.15 < th.n_requests / wl.n_requests < 0.35
    assert np.mean((rel >= 4000) & (rel < 5000)) > 0.3


@pytest.mark.parametrize("conf, key", [
    (dict(kind="sine", amplitude=1.5), "rate.amplitude"),
    (dict(kind="sine", period_s=0), "rate.period_s"),
    (dict(kind="steps", steps=[[10, 1]]), "rate.steps"),
    (dict(kind="steps", steps=[[0, -1]]), "rate.mult"),
    (dict(kind="wave"), "rate.kind"),
    (dict(kind="sine", colour=1), "rate.colour"),
])
def test_bad_rate_shapes(conf, key):
    with pytest.raises(ValueError, match=key) as e:
        shape_from(conf, 1000.0)
    assert "\n" not in str(e.value)


def test_study_cells_equal_the_reference():
    """experiment=autoscale on a small day: a cell's hit rate and GPU-hours from the block-level reference."""
    from cacheresearch.studies import autoscale as A
    from cacheresearch.studies.base import StudyError, run_in_memory

    study = dict(workload=dict(n_tenants=6, prefix_tokens=160, suffix_tokens=40, n_requests=200, duration_s=3600.0,
                               hot_share=0.3, output_tokens=50, block_tokens=16),
                 policies=["queue", "slo"], delays_s=[0, 120], prewarm_pct=[0, 50], routers=["ring"],
                 static_replicas=[1, 3], bin_s=900.0,
                 scaler=dict(A.AUTOSCALE_DEFAULTS["scaler"], capacity=30, prefill_tps=100, prefix_blocks=10,
                             max_replicas=4, interval_s=30, cooldown_s=60))
    ds = run_in_memory(A.STUDIES[0], dict(kind="autoscale", seed=2, seeds=1, study=study))
    wl = A._workload(A.AUTOSCALE_DEFAULTS | study, 2)
    cells, static = A._configs(A.AUTOSCALE_DEFAULTS | study)
    c = cells[-1]  # slo, delay 120 s, prewarm 50%, ring
    out, _, tot = reference_autoscale(wl, c.as_reference(), ring_vnodes=c.ring_vnodes)
    ht = sum(min(h * 16, int(x)) for (_, h, _, _), x in zip(out, wl.input_tokens))
    cell = dict(policy="slo", delay_s=120.0, prewarm_pct=50, router="ring")
    assert float(ds.token_hit_rate.sel(cell)) == ht / wl.input_tokens.sum()
    assert float(ds.gpu_hours.sel(cell)) == tot["gpu_ms"] / 3.6e6
    assert "static fleet of 3" in A.summarize_autoscale(ds)
    for target in (99.0, 0.0):  # the answer: the cheapest cell at or above the attainment target, its cost
        ds.attrs["attainment_pct"] = target
        costs = [float(u) for u, a in zip(np.ravel(ds.usd), np.ravel(ds.slo_attainment)) if 100 * a >= target]
        costs += [float(u) for u, a in zip(np.ravel(ds.static_usd), np.ravel(ds.static_slo_attainment))
                  if 100 * a >= target]
        first = A.summarize_autoscale(ds).split("Answers", 1)[1].splitlines()[1]
        assert (f"${min(costs):.0f} a day" in first and first.startswith("* Use ")) if costs else \
            first.startswith("* No cell meets it")
    with pytest.raises(StudyError, match="study.policies"):
        run_in_memory(A.STUDIES[0], dict(kind="autoscale", study=dict(study, policies=["psychic"])))

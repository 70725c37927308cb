"""Isolation and the timing audit: workload assembly, the statistics, and small studies end to end."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from cacheresearch.shell.sweep import run
from cacheresearch.studies.audit import audit_statistics, merge_workloads, probe_workload
from cacheresearch.workload.synthetic import tenant_workload

PROBE = dict(n_trials=6, prompt_tokens=64, prefix_fraction=0.5, victim_requests=2, start_ms=1000,
             trial_gap_ms=1000, victim_gap_ms=50, probe_delay_ms=100, output_tokens=4, block_tokens=16, seed=3)


def _rows(w):
    return [w.keys[w.offsets[i]: w.offsets[i + 1]].tolist() for i in range(w.n_requests)]


@pytest.mark.parametrize("salt", ["none", "per_user"])
def test_probe_workload_procedures(salt):
    v, a, is_hit = probe_workload(salt=salt, **PROBE)
    assert is_hit.sum() == 6 and a.n_requests == 12 and v.n_requests == 24
    assert np.all(a.n_blocks == (64 + 16) // 16) and np.all(v.n_blocks == 4)
    vk, ak = _rows(v), _rows(a)
    for t in range(12):
        victim = vk[2 * t]
        assert vk[2 * t + 1] == victim  # the victim repeats its prompt
        shared = len(set(victim) & set(ak[t]))
        if salt == "none" and is_hit[t]:
            assert ak[t][:2] == victim[:2] and shared == 2  # half of 64 tokens: 2 blocks
        else:
            assert shared == 0
        assert a.arrival_ms[t] == v.arrival_ms[2 * t + 1] + 100
    with pytest.raises(ValueError, match="half a trial gap"):
        probe_workload(salt="none", **{**PROBE, "probe_delay_ms": 600})


def test_merge_workloads_keeps_every_request():
    bg = tenant_workload(n_tenants=2, prefix_tokens=32, query_tokens=16, rate_per_s=5.0, duration_s=10.0, seed=1)
    v, a, _ = probe_workload(salt="none", **PROBE)
    w, pos = merge_workloads([bg, v, a])
    assert w.n_requests == bg.n_requests + v.n_requests + a.n_requests
    assert np.all(np.diff(w.arrival_ms) >= 0)
    rows = _rows(w)
    for part, p in zip([bg, v, a], pos):
        pr = _rows(part)
        for i in range(part.n_requests):
            assert rows[p[i]] == pr[i] and w.arrival_ms[p[i]] == part.arrival_ms[i]
            assert w.input_tokens[p[i]] == part.input_tokens[i]


def test_audit_statistics():
    rng = np.random.default_rng(0)
    same = rng.integers(0, 50, 400)
    s = audit_statistics(same, same.copy(), trials=100, resamples=20)
    assert s["audit_auc"] == pytest.approx(0.5) and s["audit_ks_p"] == pytest.approx(1.0) and s["audit_power"] == 0
    s = audit_statistics(np.arange(300), np.arange(300) + 1000, trials=100, resamples=20)
    assert s["audit_auc"] == 1.0 and s["audit_power"] == 1.0 and s["audit_ks_stat"] == 1.0
    # AUC: P(miss > hit) + P(=)/2, by counting
    h, m = np.array([1, 2, 3, 3]), np.array([3, 4, 0, 5])
    want = np.mean([(mm > hh) + 0.5 * (mm == hh) for hh in h for mm in m])
    assert audit_statistics(h, m, trials=2, resamples=2)["audit_auc"] == pytest.approx(want)
    with pytest.raises(ValueError, match="at least"):
        audit_statistics(h, m, trials=5)


@pytest.mark.slow  # long; see README's slow checks
def test_audit_study_salt_brings_auc_to_chance():
    cfg = OmegaConf.create(dict(name="audit_small", kind="audit", seed=0, seeds=1, study=dict(
        background=dict(n_tenants=4, prefix_tokens=256, users_per_tenant=2, user_tokens=0, query_tokens=64,
                        output_tokens=32, block_tokens=16),
        salts=["none", "per_user"], routers=["prefix_hash"], rates=[3.0], prefix_fractions=[1.0],
        victim_requests=[2], replicas=2, capacity_blocks=2000, prompt_tokens=512, trials=60, experiments=2,
        resamples=40, trial_gap_s=0.6, victim_gap_ms=20, probe_delay_ms=50)))
    ds = run(cfg, write=False)
    none, salted = ds.sel(salt="none").squeeze(), ds.sel(salt="per_user").squeeze()
    assert float(salted.probe_hit_share_hit) == 0.0 and float(salted.probe_hit_share_miss) == 0.0
    assert float(none.probe_hit_share_hit) == 1.0 and float(none.probe_hit_share_miss) == 0.0
    assert float(none.audit_auc) > 0.9 and float(none.audit_power) > 0.9
    assert float(salted.audit_auc_ci_low) <= 0.5 <= float(salted.audit_auc_ci_high)
    assert float(salted.audit_power) <= 0.2


def test_isolation_study_orders_the_salts(tmp_path):
    cfg = OmegaConf.create(dict(name="isolation_small", kind="isolation", seed=0, seeds=1, study=dict(
        scenario=dict(n_tenants=4, system_tokens=128, prefix_tokens=128, users_per_tenant=3, user_tokens=64,
                      query_tokens=32, output_tokens=16, block_tokens=16, n_requests=150),
        rates=[2.0], routers=["random"], replicas=2, capacity_blocks=4000)))
    from cacheresearch.shell.sweep import write_outputs

    ds = run(cfg, write=False)
    h = ds.token_hit_rate.squeeze()
    assert float(h.sel(salt="none")) > float(h.sel(salt="per_tenant")) > float(h.sel(salt="per_user")) > 0
    c = ds.usd_per_day.squeeze()
    assert float(c.sel(salt="none")) < float(c.sel(salt="per_tenant")) < float(c.sel(salt="per_user"))
    text = write_outputs(ds, tmp_path)
    assert "per_user" in text and (tmp_path / "figure.png").exists()

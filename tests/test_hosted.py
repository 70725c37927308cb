"""The hosted-cache model: replay equals its plain-Python reference; the estimate tracks the replay."""

import numpy as np
import pytest

from cacheresearch.analysis.hosted import (
    HostedConfig,
    cached_reported,
    erlang_b,
    estimate,
    replay,
    ttl_only,
    usage_cost_usd,
)
from cacheresearch.workload.synthetic import prefix_poisson_workload
from tests.reference_hosted import reference_replay


def _workload(rpm, n_prefixes=3, duration_s=900, seed=1, block_tokens=128, shared=0):
    return prefix_poisson_workload(n_prefixes=n_prefixes, prefix_tokens=1536, suffix_tokens=200, shared_tokens=shared,
                                   rate_per_hour=rpm * 60, duration_s=duration_s, block_tokens=block_tokens,
                                   seed=seed)


@pytest.mark.parametrize("rpm,machines,keys,bs", [(4, 4, None, 128), (30, 6, None, 64), (30, 5, 3, 128),
                                                 (20, 1, None, 256)])
def test_replay_equals_reference(rpm, machines, keys, bs):
    w = _workload(rpm, duration_s=150, block_tokens=bs, shared=256)
    cfg = HostedConfig(machines=machines, ttl_s=120.0, overflow_per_min=6)
    ck = None if keys is None else (np.arange(w.n_requests) * 7) % keys
    r = replay(w, cfg, cache_key=ck, seed=3)
    u = np.random.default_rng(3).random(w.n_requests)
    reqs = [(w.arrival_ms[i] / 1000.0, int(w.input_tokens[i]), [int(k) for k in w.request_keys(i)],
             None if ck is None else int(ck[i])) for i in range(w.n_requests)]
    ref = reference_replay(reqs, block_tokens=bs, machines=machines, route_tokens=cfg.route_tokens,
                           per_min=cfg.overflow_per_min, window_s=cfg.window_s, ttl_s=cfg.ttl_s,
                           min_tokens=cfg.min_tokens, increment=cfg.increment_tokens, u=u)
    assert [int(x) for x in r.machine] == [m for m, _, _ in ref]
    assert [bool(x) for x in r.overflowed] == [o for _, o, _ in ref]
    assert [int(x) for x in r.cached_tokens] == [c for _, _, c in ref]
    if machines > 1 and rpm > cfg.overflow_per_min:
        assert r.overflowed.any()


def test_reported_increments_and_erlang():
    cfg = HostedConfig()
    assert cached_reported([0, 1023, 1024, 1151, 1152, 5000], [9999] * 6, cfg).tolist() == [0, 0, 1024, 1024, 1152,
                                                                                            4992]
    assert cached_reported([5000], [2000], cfg).tolist() == [1920]
    assert float(erlang_b(1, 1.0)) == pytest.approx(0.5)  # B(1, A) = A / (1 + A)
    assert float(erlang_b(2, 1.0)) == pytest.approx(0.2)  # (A^2/2) / (1 + A + A^2/2)
    # Poisson arrivals through a sliding-window limiter: blocked share = Erlang B (insensitivity)
    w = _workload(40, n_prefixes=1, duration_s=3600, block_tokens=512)
    r = replay(w, HostedConfig(machines=8), seed=0)
    assert r.overflow_share == pytest.approx(float(erlang_b(15, 40.0)), abs=0.03)


def test_cost_under_presets():
    inp, c = np.array([2000, 2000]), np.array([1920, 0])
    assert usage_cost_usd(inp, c, "openai_auto") == pytest.approx(3e-6 * (80 + 0.1 * 1920 + 2000))
    assert usage_cost_usd(inp, c, "anthropic_5m") == pytest.approx(3e-6 * (80 * 1.25 + 0.1 * 1920 + 2000 * 1.25))


@pytest.mark.parametrize("rpm", [3, 15, 40])
@pytest.mark.parametrize("machines,keys", [(16, None), (64, None), (16, 6)])
def test_estimate_within_two_points_of_replay(rpm, machines, keys):
    w = _workload(rpm, n_prefixes=3, duration_s=1800, seed=rpm)
    ck = None if keys is None else np.random.default_rng(0).integers(0, keys, w.n_requests)
    cfg = HostedConfig(machines=machines)
    r = replay(w, cfg, cache_key=ck, seed=0)
    e = estimate(w, cfg, cache_key=ck)
    assert abs(r.cached_share - e["cached_share"]) <= 0.02, (r.cached_share, e["cached_share"])
    assert abs(r.overflow_share - e["overflow_share"]) <= 0.03


def test_overflow_effect():
    """Past the per-prefix threshold, overflow lowers the cached share below the TTL-only estimate (many
    machines); prompt_cache_key per user spreads a hot prefix and recovers part of it."""
    cfg = HostedConfig(machines=256)
    lo, hi = _workload(5, n_prefixes=2, duration_s=1200), _workload(60, n_prefixes=2, duration_s=1200)
    r_lo, r_hi = replay(lo, cfg), replay(hi, cfg)
    assert r_lo.overflow_share < 0.01 and r_hi.overflow_share > 0.5
    assert ttl_only(hi, cfg) - r_hi.cached_share > 0.1 and ttl_only(lo, cfg) - r_lo.cached_share < 0.03
    ck = np.arange(hi.n_requests) % 8
    assert replay(hi, cfg, cache_key=ck).cached_share > r_hi.cached_share + 0.05


def test_hosted_study_small():
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study

    cfg = OmegaConf.create(dict(name="hosted_small", kind="hosted", seed=0, seeds=1, study=dict(
        workload=dict(n_prefixes=2, prefix_tokens=1536, suffix_tokens=128, duration_s=600.0, block_tokens=256),
        rates_per_min=[4, 40], machines=[64], cache_keys=[0, 4], pricing=["openai_auto", "anthropic_5m"])))
    ds = run_study(cfg)
    assert ds.attrs["study_kind"] == "hosted" and ds.cached_share_replay.dims == ("rate_per_min", "machines",
                                                                                  "cache_keys", "seed")
    x = ds.isel(machines=0, seed=0)
    assert float(x.overflow_share_replay.sel(rate_per_min=40, cache_keys=0)) > 0.4
    assert float(x.cached_share_replay.sel(rate_per_min=40, cache_keys=0)) < float(
        x.cached_share_ttl.sel(rate_per_min=40, cache_keys=0)) - 0.1
    assert (ds.usd_per_day <= ds.usd_per_day_uncached.broadcast_like(ds.usd_per_day) * 1.25 + 1e-9).all()
    from cacheresearch.studies import plot, summarize

    assert "largest |replay - estimate|" in summarize(ds)
    plot(ds)

"""Studies (:mod:`cacheresearch.studies`) at reduced size: datasets, the seed's printed numbers, the
simulation inside the intervals of the closed forms, and the estimators' unbiasedness (why they exist).

Runs are deterministic (seeded NumPy draws, CPU JAX), so a statistical check that passes here passes on
every rerun; the sizes keep each interval informative (thousands of estimator units per cell).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from cacheresearch.analysis import analytic as an
from cacheresearch.shell.sweep import SweepError, run_experiment
from cacheresearch.studies import fixed_units, ratio_interval, refresh_units

ROOT = Path(__file__).resolve().parents[1]

ECON_SMALL = ["experiment=economics", "seeds=2", "study.requests_per_hour=[1,60]", "study.sim.target_requests=6000",
              "study.sim.prefixes=40", "study.sim.arrivals=[poisson,bursty]"]


@pytest.fixture(scope="module")
def econ(tmp_path_factory):
    out = tmp_path_factory.mktemp("economics")
    return run_experiment(ECON_SMALL, out), out


def test_economics_dataset(econ):
    ds, out = econ
    assert {"results.nc", "summary.txt", "figure.png"} <= {p.name for p in out.iterdir()}
    assert list(ds.pricing.values) == ["anthropic_5m", "anthropic_1h", "no_write_premium"]
    assert ds.requests_per_hour.values.tolist() == pytest.approx([1, 50_000 / 200 / 24, 60])
    for v in ["break_even_hit_rate", "hit_rate_analytic", "hit_rate_sim", "cost_multiplier_analytic",
              "cost_multiplier_sim", "daily_cost_usd", "daily_cost_uncached_usd", "hit_rate_sim_ci_low",
              "hit_rate_sim_ci_high", "cost_multiplier_sim_ci_low", "cost_multiplier_sim_ci_high"]:
        assert v in ds, v
    assert ds.break_even_hit_rate.dims == ("pricing",)
    assert ds.hit_rate_sim.dims == ("pricing", "requests_per_hour")
    assert "policy" not in ds.dims
    back = xr.load_dataset(out / "results.nc", engine="h5netcdf")
    np.testing.assert_allclose(back.hit_rate_sim.values, ds.hit_rate_sim.values)
    assert back.attrs["study_kind"] == "economics"
    # intervals are ordered and the multiplier interval follows the hit-rate interval
    assert np.all(ds.hit_rate_sim_ci_low <= ds.hit_rate_sim) and np.all(ds.hit_rate_sim <= ds.hit_rate_sim_ci_high)
    assert np.all(ds.cost_multiplier_sim_ci_low <= ds.cost_multiplier_sim + 1e-12)
    assert np.all(ds.cost_multiplier_sim <= ds.cost_multiplier_sim_ci_high + 1e-12)


def test_economics_prints_the_seed_numbers_exactly(econ):
    ds, out = econ
    text = (out / "summary.txt").read_text()
    assert "anthropic_5m 21.7%, anthropic_1h 52.6%, no_write_premium 0.0%" in text
    assert "uncached $1500/day" in text
    for name, usd in [("anthropic_5m", "$874/day"), ("anthropic_1h", "$150/day"), ("no_write_premium", "$717/day")]:
        assert f"  {name}: {usd}" in text, name
    w = ds.sel(requests_per_hour=50_000 / 200 / 24, method="nearest")
    assert [f"{x:.0f}" for x in w.daily_cost_usd.values] == ["874", "150", "717"]
    assert f"{float(w.daily_cost_uncached_usd):.0f}" == "1500"


def test_economics_simulation_agrees_with_the_analytic_values(econ):
    ds, _ = econ
    # every cell: the analytic hit rate inside the simulated 95% interval (deterministic run; the refresh
    # estimator's outcomes are exactly Bernoulli(1 - exp(-lambda TTL)), so this is a sharp check)
    assert int(ds.analytic_within_ci.sum()) == ds.analytic_within_ci.size, ds.analytic_within_ci.values
    err = np.abs(ds.hit_rate_sim - ds.hit_rate_analytic)
    assert float(err.max()) < 0.03
    # 5-minute and no-write-premium share the TTL, so they share the simulation
    np.testing.assert_array_equal(ds.hit_rate_sim.sel(pricing="anthropic_5m"),
                                  ds.hit_rate_sim.sel(pricing="no_write_premium"))
    # bursty arrivals at the same mean rate hit more often with a 5-minute TTL than Poisson ones
    wa = ds.worked_hit_rate_sim.sel(pricing="anthropic_5m")
    assert float(wa.sel(arrival="bursty")) > float(wa.sel(arrival="poisson")) + 0.1


TTL_SMALL = ["experiment=ttl", "seeds=2", "study.rates_per_hour=[6,30]", "study.ttl_s=[300,1800]",
             "study.arrivals=[poisson,bursty]", "study.target_requests=6000", "study.duration_s=21600"]


@pytest.fixture(scope="module")
def ttl(tmp_path_factory):
    out = tmp_path_factory.mktemp("ttl")
    return run_experiment(TTL_SMALL, out), out


def test_ttl_dataset_and_poisson_cells_inside_intervals(ttl):
    ds, out = ttl
    assert dict(ds.sizes) == {"arrival": 2, "policy": 2, "rate_per_hour": 2, "ttl_s": 2}
    assert (out / "figure.png").stat().st_size > 10_000
    p = ds.sel(arrival="poisson")
    assert int(p.analytic_within_ci.sum()) == p.analytic_within_ci.size, p.z_vs_analytic.values
    assert np.all(np.abs(p.z_vs_analytic.fillna(0)) < 3)
    assert int(p.sim_units.min()) > 2000
    # the Poisson formula fails for bursty arrivals, the exact renewal model does not
    b = ds.sel(arrival="bursty")
    assert int(b.analytic_within_ci.sum()) == 0
    assert int(b.model_within_ci.sum()) >= b.model_within_ci.size - 1
    assert "flagged" not in (out / "summary.txt").read_text().split("bursty:")[0]


@pytest.mark.slow
def test_ttl_default_experiment_poisson_cells(tmp_path):
    """The full default grid (about 30 s): Poisson cells inside their intervals up to chance."""
    ds = run_experiment(["experiment=ttl"], tmp_path)
    p = ds.sel(arrival="poisson")
    n = p.analytic_within_ci.size
    assert int(n - p.analytic_within_ci.sum()) <= 4  # 5% of 40 = 2 expected by chance
    d = ds.sel(arrival="diurnal", policy="ttl_refresh")
    assert int(d.model_within_ci.sum()) >= d.model_within_ci.size - 2


def test_che_small_within_two_points(tmp_path):
    ds = run_experiment(["experiment=che", "seeds=2", "study.n_prefixes=300", "study.n_requests=8000",
                         "study.capacity_blocks=[60,240,600]", "study.routers=[single,prefix_hash]",
                         "study.replicas=2"], tmp_path)
    assert dict(ds.sizes) == {"router": 2, "capacity_blocks": 3, "seed": 2}
    assert float(np.abs(ds.error_vs_che).max()) <= 0.02
    assert int(ds.within_tolerance.sum()) == 6
    # prefix-hash routing beats one cache of the same size per replica
    assert np.all(ds.hit_rate_che_mean.sel(router="prefix_hash") > ds.hit_rate_che_mean.sel(router="single"))
    assert "max |sim - Che|" in (tmp_path / "summary.txt").read_text()


def test_ttl_advisor_small(tmp_path):
    ds = run_experiment(["experiment=ttl_advisor", "seeds=1", "study.design.n_tenants=40",
                         "study.design.n_requests=3000", "study.scenarios.zipf_low_traffic.n_requests=600"], tmp_path)
    assert list(ds.option.values) == ["anthropic_5m", "anthropic_1h", "none", "advised"]
    a = ds.daily_cost_analytic_usd
    # the advised mix is never worse than any single option (analytic, by construction)
    assert np.all(a.sel(option="advised") <= a.sel(option=["anthropic_5m", "anthropic_1h", "none"]).min("option")
                  + 1e-9)
    low = ds.sel(scenario="zipf_low_traffic")
    assert set(np.unique(low.choice.values)) == {1, 2}  # some prefixes on 1 h, some uncached
    s = ds.daily_cost_sim_mean_usd
    assert float(s.sel(scenario="zipf_low_traffic", option="advised")) < float(
        s.sel(scenario="zipf_low_traffic", option="anthropic_1h"))


def test_study_errors_are_sweep_errors(tmp_path):
    with pytest.raises(SweepError, match="study.bogus"):
        run_experiment(["experiment=economics", "+study.bogus=1"], tmp_path)
    with pytest.raises(SweepError, match="unknown preset"):
        run_experiment(["experiment=economics", "study.pricings=[nope]"], tmp_path)
    with pytest.raises(SweepError, match="unknown study"):
        run_experiment(["experiment=economics", "kind=nope"], tmp_path)


@pytest.mark.slow  # long; see README's slow checks
def test_economics_command_line(tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    env.setdefault("JAX_PLATFORMS", "cpu")
    p = subprocess.run([sys.executable, "-m", "cacheresearch.sweep", "experiment=economics", "study.sim.enabled=false",
                        f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "$874/day" in p.stdout and "52.6%" in p.stdout
    assert {"results.nc", "summary.txt", "figure.png"} <= {x.name for x in tmp_path.iterdir()}


# ----------------------------------------------------------------------------- the estimators
def _poisson_hits(lam, D, ttl, n_prefixes, rng, refresh=True):
    """Engine-free TTL semantics (a request hits iff present; refresh restarts the clock)."""
    counts = rng.poisson(lam * D, n_prefixes)
    pref = np.repeat(np.arange(n_prefixes), counts)
    t = rng.uniform(0, D, pref.size)
    o = np.lexsort((t, pref))
    t, pref = t[o], pref[o]
    hit = np.zeros(t.size, dtype=bool)
    last_write = -np.inf
    last_access = -np.inf
    for i in range(t.size):
        if i == 0 or pref[i] != pref[i - 1]:
            last_write = last_access = -np.inf
        ref = last_access if refresh else last_write
        hit[i] = t[i] - ref <= ttl
        if not hit[i]:
            last_write = t[i]
        last_access = t[i]
    return t, pref, hit


@pytest.mark.parametrize("refresh", [True, False])
def test_units_estimators_are_unbiased_where_naive_ones_are_not(refresh):
    """A short horizon (D = 4 TTL, lambda TTL = 1) exposes the end effects the units estimators avoid."""
    rng = np.random.default_rng(11)
    lam, ttl, D, P = 1.0, 1.0, 4.0, 40_000
    t, pref, hit = _poisson_hits(lam, D, ttl, P, rng, refresh)
    f = refresh_units if refresh else fixed_units
    units, hits = f(t, pref, hit, D, ttl, P)
    est, lo, hi, se = ratio_interval(hits, units)
    truth = float(an.ttl_hit(lam, ttl, refresh))
    assert lo <= truth <= hi and abs(est - truth) < 4 * se
    # naive: every request but each prefix's first (refresh: bias lambda TTL e^-lambda TTL / (lambda D - 1))
    first = np.ones(t.size, dtype=bool)
    first[1:] = pref[1:] != pref[:-1]
    naive = hit[~first].mean()
    assert abs(naive - truth) > 10 * se
    if refresh:
        assert naive - truth == pytest.approx(math.exp(-1) / (lam * D - 1), rel=0.15)


def test_ratio_interval_boundaries_and_coverage():
    est, lo, hi, se = ratio_interval([50, 50], [50, 50])
    assert est == 1.0 and hi == 1.0 and 0.9 < lo < 1.0  # Wilson keeps it informative when all hit
    est, lo, hi, se = ratio_interval([0, 0, 0], [10, 10, 10])
    assert est == 0.0 and lo == 0.0 and 0 < hi < 0.2
    assert all(math.isnan(x) for x in ratio_interval([], []))
    # coverage of Bernoulli clusters at 95%: about 95 of 100 intervals hold p
    rng = np.random.default_rng(3)
    p = 0.3
    cover = 0
    for _ in range(200):
        n = rng.integers(5, 40, 100)
        h = rng.binomial(n, p)
        _, lo, hi, _ = ratio_interval(h, n)
        cover += lo <= p <= hi
    assert 180 <= cover <= 200


def test_adding_a_study_example_runs():
    """docs/adding_a_study.md's example study runs as written (driven in memory) and its hit rate grows
    with capacity (LRU's inclusion property on one stream)."""
    import re

    from omegaconf import OmegaConf

    from cacheresearch.studies.base import run_in_memory

    src = (Path(__file__).resolve().parents[1] / "docs" / "adding_a_study.md").read_text()
    ns: dict = {}
    exec(re.search(r"```python\n(.*?)```", src, re.S).group(1), ns)  # noqa: S102 - the doc's own code
    cfg = OmegaConf.create({"name": "doc", "seeds": 1, "seed": 0,
                            "study": {"capacity_blocks": [50, 400], "n_prefixes": 50, "duration_s": 1800.0}})
    ds = run_in_memory(ns["STUDIES"][0], cfg)
    h = ds.token_hit_rate.values[:, 0]
    assert 0 < h[0] < h[1] <= 1
    assert "hit rate" in ns["summarize"](ds)

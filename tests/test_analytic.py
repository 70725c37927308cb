"""Closed forms of :mod:`cacheresearch.analysis.analytic`: properties (hypothesis), the seed's numbers, Che's root,
the beyond-Poisson models' limits, and the per-router predictions against the engine's routing."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheresearch.analysis import analytic as an
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.routers import prefix_hash_u64
from cacheresearch.workload import Workload
from cacheresearch.workload.synthetic import prefix_poisson_workload
from cacheresearch.workload.trace import load_mooncake

rates = st.floats(1e-6, 10.0, allow_nan=False)
ttls = st.floats(1e-3, 1e4, allow_nan=False)
FAST = settings(max_examples=60, deadline=None)


# ----------------------------------------------------------------------------- seed numbers
def test_seed_break_even_numbers_exactly():
    assert f"{100 * an.break_even_hit_rate(1.25, 0.1):.1f}%" == "21.7%"
    assert f"{100 * an.break_even_hit_rate(2.0, 0.1):.1f}%" == "52.6%"
    assert f"{100 * an.break_even_hit_rate(1.0, 0.1):.1f}%" == "0.0%"
    assert an.break_even_hit_rate(1.25, 0.1) == pytest.approx(0.25 / 1.15, rel=1e-15)


def test_seed_worked_example_exactly():
    """200 prefixes x 10,000 tokens, 50,000 requests/day, $3/Mtok: $1500, $874, $150, $717 per day."""
    lam = 50_000 / 200 / 86_400  # per prefix per second (10.42 per hour)
    uncached = 50_000 * 10_000 * 3e-6
    costs = {name: uncached * float(an.cost_multiplier(an.ttl_refresh_hit(lam, ttl), w, 0.1))
             for name, w, ttl in [("5m", 1.25, 300), ("1h", 2.0, 3600), ("nwp", 1.0, 300)]}
    assert f"{uncached:.0f}" == "1500"
    assert [f"{costs[k]:.0f}" for k in ("5m", "1h", "nwp")] == ["874", "150", "717"]
    # the interpretation: 5-minute TTL refreshed on hit at lambda = 10.42/h: h = 1 - exp(-0.868) = 58.0%
    assert an.ttl_refresh_hit(lam, 300) == pytest.approx(0.58023, abs=1e-5)
    # a fixed (not refreshed) 1-hour TTL would not give $150: the seed's numbers use refresh on hit
    assert f"{uncached * float(an.cost_multiplier(an.ttl_fixed_hit(lam, 3600), 2.0, 0.1)):.0f}" != "150"


def test_seed_requests_per_hour_table():
    rph = np.array([1, 6, 12, 60, 600])
    h5 = an.ttl_refresh_hit(rph / 3600, 300)
    h1 = an.ttl_refresh_hit(rph / 3600, 3600)
    assert [f"{100 * x:.1f}" for x in h5] == ["8.0", "39.3", "63.2", "99.3", "100.0"]
    assert [f"{100 * x:.1f}" for x in h1] == ["63.2", "99.8", "100.0", "100.0", "100.0"]
    m5 = an.cost_multiplier(h5, 1.25, 0.1)
    assert [f"{x:.2f}" for x in m5] == ["1.16", "0.80", "0.52", "0.11", "0.10"]


# ----------------------------------------------------------------------------- properties
@FAST
@given(w=st.floats(0.0, 10.0), r=st.floats(0.0, 0.999))
def test_break_even_solves_cost_equation(w, r):
    be = float(an.break_even_hit_rate(w, r))
    if w <= 1.0:
        assert be == 0.0
        # caching never costs more than not caching
        for h in (0.0, 0.3, 1.0):
            assert float(an.cost_multiplier(h, w, r)) <= 1.0 + 1e-12
    else:
        assert 0.0 < be < 1.0
        assert float(an.cost_multiplier(be, w, r)) == pytest.approx(1.0, abs=1e-12)
        # below break-even caching costs more, above it less
        if be > 1e-6:
            assert float(an.cost_multiplier(be * (1 - 1e-3), w, r)) > 1.0
        assert float(an.cost_multiplier(min(1.0, be + 1e-3), w, r)) < 1.0


def test_break_even_never_when_reads_are_not_cheaper():
    assert math.isinf(float(an.break_even_hit_rate(1.5, 1.0)))
    assert math.isinf(float(an.break_even_hit_rate(1.5, 1.2)))


@FAST
@given(l1=rates, l2=rates, t=ttls)
def test_ttl_hit_monotone_in_rate(l1, l2, t):
    lo, hi = sorted((l1, l2))
    for f in (an.ttl_refresh_hit, an.ttl_fixed_hit):
        a, b = float(f(lo, t)), float(f(hi, t))
        assert 0.0 <= a <= b <= 1.0


@FAST
@given(lam=rates, t1=ttls, t2=ttls)
def test_ttl_hit_monotone_in_ttl(lam, t1, t2):
    lo, hi = sorted((t1, t2))
    for f in (an.ttl_refresh_hit, an.ttl_fixed_hit):
        assert float(f(lam, lo)) <= float(f(lam, hi))


@FAST
@given(lam=rates, t=ttls)
def test_refresh_dominates_fixed_and_both_depend_on_lambda_ttl(lam, t):
    r, f = float(an.ttl_refresh_hit(lam, t)), float(an.ttl_fixed_hit(lam, t))
    assert f <= r + 1e-15  # x/(1+x) <= 1 - exp(-x)
    assert r == pytest.approx(float(an.ttl_refresh_hit(lam * t, 1.0)), rel=1e-9, abs=1e-300)
    assert f == pytest.approx(float(an.ttl_fixed_hit(lam * t, 1.0)), rel=1e-9, abs=1e-300)


@FAST
@given(h1=st.floats(0, 1), h2=st.floats(0, 1), w=st.floats(0.0, 3.0), r=st.floats(0.0, 0.99))
def test_cost_multiplier_decreasing_in_hit_rate_when_writes_cost_more(h1, h2, w, r):
    lo, hi = sorted((h1, h2))
    a, b = float(an.cost_multiplier(lo, w, r)), float(an.cost_multiplier(hi, w, r))
    if w >= r:
        assert b <= a + 1e-12
    assert min(w, r) - 1e-12 <= a <= max(w, r) + 1e-12


def test_formulas_run_in_jax_and_under_jit():
    f = jax.jit(lambda lam, t: (an.ttl_refresh_hit(lam, t), an.ttl_fixed_hit(lam, t),
                                an.cost_multiplier(an.ttl_refresh_hit(lam, t), 1.25, 0.1),
                                an.break_even_hit_rate(jnp.asarray(1.25), 0.1)))
    r, x, m, be = f(jnp.float32(0.01), jnp.float32(100.0))
    assert isinstance(r, jax.Array)
    assert float(r) == pytest.approx(1 - math.exp(-1), rel=1e-6)
    assert float(x) == pytest.approx(0.5, rel=1e-6)
    assert float(m) == pytest.approx(1.25 - 1.15 * (1 - math.exp(-1)), rel=1e-6)
    assert float(be) == pytest.approx(0.25 / 1.15, rel=1e-6)


# ----------------------------------------------------------------------------- beyond Poisson
@pytest.mark.parametrize("lam_t", [0.05, 0.7, 3.0, 12.0])
def test_gamma_renewal_with_cv_one_is_poisson(lam_t):
    lam = 1 / 300
    t = lam_t / lam
    assert an.ttl_refresh_hit_gamma(lam, t, 1.0) == pytest.approx(float(an.ttl_refresh_hit(lam, t)), rel=1e-10)
    assert an.gamma_renewal_function(lam, t, 1.0) == pytest.approx(lam_t, rel=1e-9)
    assert an.ttl_fixed_hit_gamma(lam, t, 1.0) == pytest.approx(float(an.ttl_fixed_hit(lam, t)), rel=1e-9)


def test_gamma_renewal_function_large_t_slope():
    # elementary renewal theorem: m(t) ~ t / mean + (cv^2 - 1) / 2
    lam, cv = 2.0, 3.0
    t = 200.0
    assert an.gamma_renewal_function(lam, t, cv) == pytest.approx(lam * t + (cv**2 - 1) / 2, rel=1e-3)


def test_diurnal_without_amplitude_is_poisson():
    lam = 10 / 3600
    for ttl in (60.0, 300.0, 3600.0):
        exact = an.ttl_refresh_hit_diurnal(lam, ttl, 0.0, 86_400.0)
        assert exact == pytest.approx(float(an.ttl_refresh_hit(lam, ttl)), rel=1e-9)
        for refresh in (True, False):
            assert an.quasi_static_hit(lam, ttl, 0.0, refresh) == pytest.approx(float(an.ttl_hit(lam, ttl, refresh)))
    # with a cycle, requests concentrate where the rate is high: more hits than at the mean rate
    assert an.ttl_refresh_hit_diurnal(lam, 300.0, 0.8, 86_400.0) > float(an.ttl_refresh_hit(lam, 300.0)) + 0.05
    assert an.diurnal_cumulative(0.0, 86_400.0, lam, 0.8) == pytest.approx(lam * 86_400.0)


# ----------------------------------------------------------------------------- Che
@FAST
@given(
    lam=st.lists(st.floats(1e-4, 100.0), min_size=2, max_size=60),
    frac=st.floats(0.01, 0.99),
)
def test_che_root_satisfies_the_equation(lam, frac):
    lam = np.asarray(lam)
    C = frac * lam.size
    T = an.che_characteristic_time(lam, C)
    assert np.isfinite(T) and T > 0
    assert float(np.sum(-np.expm1(-lam * T))) == pytest.approx(C, rel=1e-9, abs=1e-9)
    res = an.che_hit_ratios(lam, C)
    assert 0.0 <= res.overall <= 1.0
    assert np.all(np.diff(res.per_key[np.argsort(lam)]) >= -1e-12)  # hotter keys hit more
    # more capacity, more hits
    assert an.che_hit_ratios(lam, min(lam.size * 0.999, C * 1.2)).overall >= res.overall - 1e-12


def test_che_edge_cases_and_weights():
    lam = np.array([1.0, 2.0, 0.0])
    assert an.che_characteristic_time(lam, 0) == 0.0
    assert math.isinf(an.che_characteristic_time(lam, 2))  # both keys of positive rate fit
    assert an.che_hit_ratios(lam, 5).overall == 1.0
    # weights: a key of weight 3 behaves like three keys of the same rate
    w = an.che_hit_ratios([1.0, 0.5], 2.0, weights=[3, 1])
    u = an.che_hit_ratios([1.0, 1.0, 1.0, 0.5], 2.0)
    assert w.characteristic_time == pytest.approx(u.characteristic_time, rel=1e-10)
    assert w.overall == pytest.approx(u.overall, rel=1e-10)
    with pytest.raises(ValueError):
        an.che_hit_ratios([-1.0], 1)


def test_che_random_routing_is_scale_invariant_and_partition_matches_single():
    rng = np.random.default_rng(0)
    lam = rng.pareto(1.5, 300) + 0.01
    single = an.che_hit_ratios(lam, 50)
    assert an.che_random_routing(lam, 50, 4).overall == pytest.approx(single.overall, rel=1e-9)
    assert an.che_random_routing(lam, 50, 4).characteristic_time == pytest.approx(4 * single.characteristic_time)
    one = an.che_partitioned(lam, 50, np.zeros(300, dtype=int), 4)
    assert one.overall == pytest.approx(single.overall, rel=1e-12)
    # partitioning the keys over 4 caches of the same size can only help
    part = an.che_partitioned(lam, 50, rng.integers(0, 4, 300), 4)
    assert part.overall > single.overall


def test_block_key_rates_respect_the_prefix_tree():
    w = prefix_poisson_workload(n_prefixes=5, prefix_tokens=32, shared_tokens=32, block_tokens=16,
                                rate_per_hour=120, duration_s=3600, seed=3)
    keys, rates, counts = an.block_key_rates(w)
    assert counts.sum() == w.total_blocks
    # the two shared head blocks appear in every request: their rate is the total rate
    head = w.keys[w.offsets[0]: w.offsets[0] + 2]
    for k in head:
        assert rates[np.searchsorted(keys, k)] == pytest.approx(w.n_requests / 3600)
    # each prefix's own blocks carry that prefix's rate
    own = w.keys[w.offsets[0] + 2]
    assert counts[np.searchsorted(keys, own)] == int(np.sum(w.tenant == w.tenant[0]))
    assert an.workload_duration_s(w) == 3600.0


def test_prefix_hash_replicas_match_the_router_and_the_engine():
    w = prefix_poisson_workload(n_prefixes=40, prefix_tokens=48, block_tokens=16, rate_per_hour=30,
                                duration_s=3600, seed=5)
    R, K = 3, 2
    rep = an.prefix_hash_replicas(w, R, K)
    py = [prefix_hash_u64(int(w.keys[o + min(K, n) - 1])) % R for o, n in zip(w.offsets[:-1], w.n_blocks)]
    np.testing.assert_array_equal(rep, py)
    m = simulate(compile_stream(w, chunk_runs=4), make_params("unbounded", replicas=R, router="prefix_hash",
                                                                prefix_blocks=K), jax.random.key(0), max_replicas=R)
    np.testing.assert_array_equal(rep, np.asarray(m.replica))


def test_che_fleet_prefix_hash_splits_keys_by_replica():
    w = prefix_poisson_workload(n_prefixes=200, prefix_tokens=32, block_tokens=16, rate_per_hour=20,
                                duration_s=3600, popularity="zipf", zipf_s=0.8, seed=2)
    single = an.che_fleet(w, 60, replicas=1)
    rnd = an.che_fleet(w, 60, replicas=4, router="random")
    ph = an.che_fleet(w, 60, replicas=4, router="prefix_hash", prefix_blocks=80)
    assert rnd.overall == pytest.approx(single.overall, rel=1e-9)
    assert ph.overall > single.overall
    assert an.ttl_fleet_hit(0.01, 100, 4, "random") == pytest.approx(float(an.ttl_refresh_hit(0.0025, 100)))
    assert an.ttl_fleet_hit(0.01, 100, 4, "prefix_hash") == pytest.approx(float(an.ttl_refresh_hit(0.01, 100)))


@pytest.mark.parametrize("router", ["random", "prefix_hash"])
def test_che_first_miss_is_the_reuse_ratio_when_everything_fits(router):
    """With a cache that holds every block Che says 1; with first_miss it is the engine's exact hit ratio on
    one replica (every block after its first request hits) and, on four prefix-hash replicas, each
    replica's own reuse; under random routing the expected share of first sights, within a few points."""
    w = prefix_poisson_workload(n_prefixes=40, prefix_tokens=64, block_tokens=16, rate_per_hour=30,
                                duration_s=3600, popularity="zipf", zipf_s=0.8, seed=3)
    R = 1 if router == "random" else 4
    assert an.che_fleet(w, 10**9, R, router).overall == 1.0
    got = an.che_fleet(w, 10**9, R, router, prefix_blocks=2, first_miss=True).overall
    m = simulate(compile_stream(w, chunk_runs=4), make_params("unbounded", replicas=R, router=router, prefix_blocks=2),
                 jax.random.key(0), max_replicas=R)
    exact = int(np.asarray(m.hit_blocks).sum()) / int(w.n_blocks.sum())
    assert got == pytest.approx(exact, rel=1e-12)
    rnd = an.che_fleet(w, 10**9, 4, "random", first_miss=True).overall
    m4 = simulate(compile_stream(w, chunk_runs=4), make_params("unbounded", replicas=4, router="random"),
                  jax.random.key(0), max_replicas=4)
    assert rnd == pytest.approx(int(np.asarray(m4.hit_blocks).sum()) / int(w.n_blocks.sum()), abs=0.03)
    assert rnd < got or router == "prefix_hash"


def test_workload_duration_needs_two_arrivals():
    w = Workload.from_lists([[1], [2]], block_tokens=16, arrival_ms=[0, 0])
    with pytest.raises(ValueError, match="duration"):
        an.workload_duration_s(w)


@pytest.mark.parametrize("router", ["random", "prefix_hash"])
def test_ttl_fleet_prediction_matches_the_engine(router):
    """Random routing thins each prefix's Poisson stream to lambda / R per replica; prefix-hash keeps it whole.

    Requests after the first TTL see a fully observed past, so under Poisson arrivals their hit probability
    is the stationary one exactly (Palm / PASTA)."""
    R, ttl, lam_h = 4, 300.0, 12.0
    w = prefix_poisson_workload(n_prefixes=100, prefix_tokens=16, block_tokens=16, rate_per_hour=lam_h,
                                duration_s=6 * 3600, seed=9)
    m = simulate(compile_stream(w, chunk_runs=1), make_params("ttl_refresh", ttl_s=ttl, replicas=R, router=router),
                 jax.random.key(1), max_replicas=R)
    hit = np.asarray(m.hit_blocks) > 0
    late = w.arrival_ms >= ttl * 1000
    p = float(an.ttl_fleet_hit(lam_h / 3600, ttl, R, router))
    se = math.sqrt(p * (1 - p) / late.sum())
    assert abs(hit[late].mean() - p) < 4 * se
    if router == "random":
        assert p == pytest.approx(1 - math.exp(-lam_h / 12 / R))


def test_che_from_a_loaded_trace():
    w = load_mooncake(Path(__file__).parent / "fixtures" / "mini_mooncake.jsonl", block_tokens=512)
    keys, lam, counts = an.block_key_rates(w)
    assert counts.sum() == w.total_blocks and keys.size == np.unique(w.keys).size
    C = keys.size // 3
    res = an.che_workload(w, C)
    assert float(np.sum(-np.expm1(-lam * res.characteristic_time))) == pytest.approx(C, rel=1e-9)
    assert 0 < res.overall < 1

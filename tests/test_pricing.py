"""Provider economics (:mod:`cacheresearch.analysis.pricing`): presets, token splits, breakpoints with the 20-block
lookback and the minimum prefix, TTL replay, storage, daily costs and the TTL advisor."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheresearch.analysis import analytic as an
from cacheresearch.analysis.pricing import (
    PRESETS,
    ProviderCache,
    advise_ttl,
    breakpoint_lookup,
    cacheable_tokens,
    daily_cost_uncached_usd,
    daily_cost_usd,
    preset,
    request_cost_usd,
    split_tokens,
)

WORKED = dict(n_prefixes=200, prefix_tokens=10_000, requests_per_day=50_000)


def test_presets_are_frozen_documented_and_configurable():
    assert {"anthropic_5m", "anthropic_1h", "no_write_premium", "openai_auto", "gemini_explicit"} <= set(PRESETS)
    for name, p in PRESETS.items():
        assert p.name == name and len(p.source) > 40, name
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.write_multiplier = 3.0  # type: ignore[misc]
    a5 = preset("anthropic_5m")
    assert (a5.write_multiplier, a5.read_multiplier, a5.ttl_s, a5.refresh_on_hit) == (1.25, 0.1, 300.0, True)
    assert (a5.max_breakpoints, a5.lookback_blocks, a5.min_cacheable_tokens) == (4, 20, 1024)
    assert preset("anthropic_1h").write_multiplier == 2.0 and preset("anthropic_1h").ttl_s == 3600.0
    assert preset("openai_auto").increment_tokens == 128 and preset("openai_auto").max_breakpoints is None
    g = preset("gemini_explicit")
    assert g.storage_per_mtok_hour > 0 and not g.refresh_on_hit
    assert preset("anthropic_5m", base_per_mtok=15.0).base_per_mtok == 15.0
    assert PRESETS["anthropic_5m"].base_per_mtok == 3.0  # the preset itself is unchanged
    with pytest.raises(ValueError, match="unknown pricing preset"):
        preset("nope")
    with pytest.raises(ValueError, match="write_multiplier"):
        preset("anthropic_5m", write_multiplier=-1.0)


def test_break_even_of_presets():
    assert [f"{100 * preset(n).break_even_hit_rate:.1f}%" for n in ("anthropic_5m", "anthropic_1h",
                                                                  "no_write_premium")] == ["21.7%", "52.6%", "0.0%"]


def test_worked_example_daily_costs_exactly():
    assert f"{float(daily_cost_uncached_usd(50_000, 10_000, 3.0)):.0f}" == "1500"
    assert f"{float(daily_cost_usd(None, **WORKED)):.0f}" == "1500"
    got = [f"{float(daily_cost_usd(preset(n), **WORKED)):.0f}" for n in ("anthropic_5m", "anthropic_1h",
                                                                           "no_write_premium")]
    assert got == ["874", "150", "717"]


def test_cacheable_tokens_minimum_and_increments():
    oa = preset("openai_auto")
    assert cacheable_tokens([0, 1023, 1024, 1151, 1152, 2000], oa).tolist() == [0, 0, 1024, 1024, 1152, 1920]
    a5 = preset("anthropic_5m")
    assert cacheable_tokens([1023, 1024, 1500], a5).tolist() == [0, 1024, 1500]


@settings(max_examples=80, deadline=None)
@given(inp=st.integers(0, 50_000), pre=st.integers(0, 50_000), hit=st.integers(0, 50_000),
       name=st.sampled_from(sorted(PRESETS)))
def test_split_tokens_accounts_for_every_token(inp, pre, hit, name):
    p = preset(name)
    s = split_tokens(inp, hit, pre, p)
    u, w, r = int(s.uncached), int(s.written), int(s.read)
    assert min(u, w, r) >= 0 and u + w + r == inp
    assert r <= min(hit, pre, inp)
    assert w + r == int(cacheable_tokens(min(pre, inp), p))
    if min(pre, inp) < p.min_cacheable_tokens:
        assert w == r == 0
    cost = float(request_cost_usd(s, p))
    assert cost == pytest.approx(p.base_per_mtok / 1e6 * (u + p.write_multiplier * w + p.read_multiplier * r))


def _blocks(n, tokens_each=100, tag="a"):
    ids = [f"{tag}{j}" for j in range(n)]  # stands for a chained hash of blocks 0..j
    toks = [tokens_each * (j + 1) for j in range(n)]
    return ids, toks


def test_breakpoint_lookback_window_of_20_blocks():
    p = preset("anthropic_5m")
    ids, toks = _blocks(40)
    cached = {ids[12]}  # an earlier request wrote a breakpoint at block 12 (1,300 tokens)
    # a breakpoint at block 31 checks blocks 31..12 (20 positions): finds block 12
    hit, writes, s = breakpoint_lookup(ids[:32], toks[:32], [31], cached, p)
    assert hit == 12 and writes == [31]
    assert (int(s.read), int(s.written), int(s.uncached)) == (1300, 3200 - 1300, 0)
    # at block 32 the window is 32..13: the entry at 12 is out of reach, everything is written again
    hit, writes, s = breakpoint_lookup(ids[:33], toks[:33], [32], cached, p)
    assert hit == -1 and writes == [32] and int(s.read) == 0 and int(s.written) == 3300
    # a second breakpoint near the old one brings it back (why several breakpoints help)
    hit, writes, s = breakpoint_lookup(ids[:33], toks[:33], [12, 32], cached, p)
    assert hit == 12 and writes == [32] and int(s.read) == 1300
    # a wider lookback is a parameter
    hit, _, _ = breakpoint_lookup(ids[:33], toks[:33], [32], cached, p.replace(lookback_blocks=21))
    assert hit == 12


def test_breakpoint_limits_and_minimum_prefix():
    p = preset("anthropic_5m")
    ids, toks = _blocks(30)
    with pytest.raises(ValueError, match="at most 4"):
        breakpoint_lookup(ids, toks, [1, 5, 10, 15, 20], set(), p)
    with pytest.raises(ValueError, match="content blocks"):
        breakpoint_lookup(ids, toks, [30], set(), p)
    # a breakpoint whose prefix is below 1,024 tokens is never written or read
    hit, writes, s = breakpoint_lookup(ids[:12], toks[:12], [8, 11], {ids[8]}, p)
    assert hit == -1 and writes == [11]  # block 8 = 900 tokens: not cacheable
    assert (int(s.read), int(s.written), int(s.uncached)) == (0, 1200, 0)
    hit, writes, s = breakpoint_lookup(ids[:12], toks[:12], [8], set(), p)
    assert writes == [] and int(s.uncached) == 1200


def test_automatic_caching_reads_in_128_token_increments():
    p = preset("openai_auto")
    ids, toks = _blocks(25, tokens_each=128)  # boundaries every 128 tokens
    cache = ProviderCache(p)
    _, s1, _ = cache.request(0.0, ids[:20], toks[:20])  # 2,560 tokens: cached at every boundary >= 1,024
    assert int(s1.read) == 0 and int(s1.written) == 2560
    _, s2, _ = cache.request(10.0, ids[:25], toks[:25])  # shares 20 blocks
    assert int(s2.read) == 2560 and int(s2.written) == 3200 - 2560
    other = ["b" + x for x in ids]
    _, s3, _ = cache.request(20.0, ids[:9] + other[9:20], toks[:20])  # shares only 9 blocks = 1,152 tokens
    assert int(s3.read) == 1152


def test_provider_cache_ttl_refresh_vs_fixed():
    ids, toks = _blocks(12)
    for name, expect in [("anthropic_5m", [-1, 11, 11, 11]), ("anthropic_5m_fixed", [-1, 11, -1, 11])]:
        p = preset("anthropic_5m") if name == "anthropic_5m" else preset("anthropic_5m", refresh_on_hit=False)
        cache = ProviderCache(p)
        hits = [cache.request(t, ids, toks, [11])[0] for t in (0.0, 200.0, 400.0, 650.0)]
        # refresh: 200 and 400 refresh the entry (expiry 700); fixed: written at 0, gone after 300, rewritten at 400
        assert hits == expect, name
    cache = ProviderCache(preset("anthropic_5m"))
    assert [cache.request(t, ids, toks, [11])[0] for t in (0.0, 301.0)] == [-1, -1]  # expired after 300 s


def test_explicit_cache_storage_charge():
    g = preset("gemini_explicit")
    ids, toks = _blocks(50)  # 5,000 tokens >= 4,096 minimum
    cache = ProviderCache(g)
    _, s, cost = cache.request(0.0, ids, toks, [49])
    assert int(s.written) == 5000 and cost == pytest.approx(5000 * 1.25e-6)
    hit, s, _ = cache.request(1800.0, ids, toks, [49])
    assert hit == 49 and int(s.read) == 5000
    storage = cache.close(7200.0)  # the entry lived one hour (TTL 3600 s, not extended by the hit)
    assert storage == pytest.approx(4.5 * 5000 / 1e6 * 1.0)


def test_multiplier_with_storage_matches_replay():
    """The analytic storage share h * s / (base * lambda) against a replay of Poisson requests."""
    g = preset("gemini_explicit", ttl_s=600.0)
    lam = 6 / 3600
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / lam, 20_000))
    ids, toks = _blocks(50)
    cache = ProviderCache(g)
    cost = sum(cache.request(x, ids, toks, [49])[2] for x in t)
    total = cost + cache.close(float(t[-1]))
    sim_mult = total / (len(t) * 5000 * g.base_per_mtok / 1e6)
    assert sim_mult == pytest.approx(float(g.multiplier(lam)), rel=0.02)


def test_advisor_picks_the_cheapest_option_per_prefix():
    rates_h = np.array([0.1, 0.5, 1.0, 3.0, 10.0, 100.0])
    adv = advise_ttl(rates_h / 3600, 10_000)
    assert adv.options == ("anthropic_5m", "anthropic_1h", "none")
    costs = adv.cost_usd_per_day
    assert np.all(costs[np.arange(6), adv.choice] <= costs.min(axis=1) + 1e-12)
    assert [adv.options[i] for i in adv.choice] == ["none", "none", "anthropic_1h", "anthropic_1h", "anthropic_1h",
                                                    "anthropic_1h"]
    assert adv.saving_usd_per_day >= 0 and adv.best_uniform == "anthropic_1h"
    assert adv.advised_usd_per_day == pytest.approx(costs.min(axis=1).sum())
    assert adv.counts() == {"anthropic_5m": 0, "anthropic_1h": 4, "none": 2}
    # "none" switches to 1 h where 2 - 1.9 (1 - exp(-lambda * 1 h)) = 1: lambda = -ln(1 - 1/1.9) per hour
    cross = -np.log(1 - 1 / 1.9)
    assert [adv2 for adv2 in advise_ttl(np.array([cross * 0.99, cross * 1.01]) / 3600, 10_000).choice] == [2, 1]


@settings(max_examples=100, deadline=None)
@given(rate_h=st.floats(1e-3, 1e4))
def test_five_minute_ttl_is_never_strictly_cheapest_with_these_presets(rate_h):
    """With refresh on hit for both TTLs, m_5m - m_1h = 1.15 e^(-lambda/12) - 1.9 e^(-lambda) (lambda per
    hour) is negative only below 0.55/h, where the 5-minute multiplier is above 1 (no caching wins)."""
    lam = rate_h / 3600
    m5 = float(preset("anthropic_5m").multiplier(lam))
    m1 = float(preset("anthropic_1h").multiplier(lam))
    assert m5 >= min(m1, 1.0) - 1e-12
    assert m5 - m1 == pytest.approx(1.15 * np.exp(-rate_h / 12) - 1.9 * np.exp(-rate_h), abs=1e-12)


def test_advisor_accepts_pricing_objects_and_min_tokens():
    small = advise_ttl([10 / 3600], 500, options=("anthropic_5m", "none"))
    # a 500-token prefix is below the 1,024-token minimum: caching changes nothing
    assert small.cost_usd_per_day[0, 0] == pytest.approx(small.cost_usd_per_day[0, 1])
    custom = preset("anthropic_1h").replace(name="cheap_1h", write_multiplier=1.1)
    adv = advise_ttl([1 / 3600], 10_000, options=(custom, "none"))
    assert adv.options == ("cheap_1h", "none") and adv.choice[0] == 0
    assert float(custom.multiplier(1 / 3600)) == pytest.approx(float(an.cost_multiplier(1 - np.exp(-1), 1.1, 0.1)))

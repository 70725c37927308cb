"""Breakpoint placement on rendered content: the closed-form advisor against a brute-force search of
simulated placements (ProviderCache: lookback, minimum, writes, refresh) on a small case."""

import numpy as np
import pytest

from cacheresearch.analysis.breakpoints import (
    Sample,
    advise,
    baselines,
    brute_force,
    content_blocks,
    expected_cost,
    simulate_cost,
)
from cacheresearch.workload.prompt.scenario import tenant_requests


@pytest.fixture(scope="module")
def small():
    reqs, arr, _, _ = tenant_requests(n_tenants=4, prefix_tokens=2600, suffix_tokens=60, n_requests=160,
                                      duration_s=3600.0, tools_per_tenant=5, documents_per_tenant=1,
                                      shared_head=True, seed=4)
    return Sample.from_requests(reqs, arr / 1000.0, tokenizer="word", duration_s=3600.0)


def test_content_blocks_real_counts(small):
    assert small.n_blocks == 8  # system, 5 tools, 1 document, the question
    t = small.tokens
    assert np.all(np.diff(t, axis=1) > 0) and np.all(t[:, 5] == t[0, 5])  # the shared head: same length
    assert len({r[5] for r in small.ids}) == 1 and len({r[6] for r in small.ids}) == 4  # head shared, docs by tenant
    assert len({r[7] for r in small.ids}) == len(small.ids)  # every question is new
    ids, toks = content_blocks(tenant_requests(n_tenants=1, n_requests=1, prefix_tokens=500, seed=0)[0][0])
    assert len(ids) == len(toks) and toks == sorted(toks)


def test_advisor_matches_brute_force_and_beats_baselines(small):
    adv = advise(small)
    bf = brute_force(small)
    sim_adv = simulate_cost(small, adv["placement"])
    assert sim_adv <= bf["usd_per_request"] * 1.02, (adv["placement"], bf["placement"])
    base = baselines(small)
    assert base == dict(end=(7,), static_end=(6,))
    assert sim_adv < simulate_cost(small, base["end"]) * 0.5
    assert sim_adv < simulate_cost(small, base["static_end"])  # two levels: the shared head and the tenant
    assert len(adv["placement"]) >= 2 and 5 in adv["placement"]
    for pl in (adv["placement"], base["end"], base["static_end"], (5,)):  # closed form tracks the replay
        assert expected_cost(small, pl) == pytest.approx(simulate_cost(small, pl), rel=0.15)


def test_no_eligible_block_is_uncached():
    reqs, arr, _, _ = tenant_requests(n_tenants=1, prefix_tokens=300, suffix_tokens=20, n_requests=5,
                                      duration_s=60.0, tools_per_tenant=1, documents_per_tenant=1, seed=0)
    s = Sample.from_requests(reqs, arr / 1000.0, duration_s=60.0)
    a = advise(s)
    assert a["placement"] == () and a["candidates"] == 0
    assert a["usd_per_request"] == pytest.approx(float(s.tokens[:, -1].mean()) * 3.0 / 1e6)

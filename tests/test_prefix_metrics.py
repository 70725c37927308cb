"""Per-prefix economics in the sweep's dataset: groups, exact totals, pricing, the TTL formula beside."""

from pathlib import Path

import numpy as np
import pytest

from cacheresearch.analysis.pricing import preset
from cacheresearch.metrics.prefix import prefix_groups
from cacheresearch.shell.sweep import run_experiment
from cacheresearch.workload.synthetic import tenant_workload
from cacheresearch.workload.trace import load_trace

FIX = Path(__file__).parent / "fixtures"
SMALL = ["workload.fleet.n_requests=1200", "workload.fleet.rate_per_s=0.5", "fleet.replicas=2", "output.figure=false"]


def test_groups_top_n_and_other():
    w = tenant_workload(n_tenants=6, prefix_tokens=32, query_tokens=16, rate_per_s=4.0, duration_s=30.0,
                        hot_share=0.5, seed=2)
    g = prefix_groups(w, "tenant", top_n=3)
    assert g["labels"][0] == "tenant 0" and g["labels"][-1] == "other" and len(g["labels"]) == 4
    assert g["requests"].sum() == w.n_requests and g["prefix_tokens"][0] == 32
    assert np.all(g["group"][w.tenant == 0] == 0)
    t = load_trace(FIX / "mini_mooncake.jsonl")
    g = prefix_groups(t, "trace", top_n=2)
    roots = t.keys[t.offsets[:-1]]
    top = g["labels"][0].split()[1]
    assert np.sum(roots == np.uint64(int(top, 16))) == g["requests"][0] == np.bincount(
        np.unique(roots, return_inverse=True)[1]).max()


@pytest.mark.parametrize("policy", ["lru", "ttl_refresh"])
def test_prefix_columns_in_the_dataset(tmp_path, policy):
    ttl = ["cache.ttl_s=60"] if policy == "ttl_refresh" else []  # a TTL with no TTL policy is refused
    over = ["experiment=seed_fleet", *SMALL, f"cache.policy={policy}", *ttl, "grid.layout=null",
            "grid.policy=null", "grid.router=[random,prefix_hash]", "seeds=1"]
    ds = run_experiment(over, tmp_path)
    assert list(ds.prefix.values) == [f"tenant {k}" for k in range(8)]
    assert ds.prefix_token_hit_rate.dims[-1] == "prefix"
    # the groups' hit tokens add up to the run's exact total
    inp = prefix_groups_input(ds)
    tot = (ds.prefix_token_hit_rate * inp).sum("prefix")
    np.testing.assert_allclose(tot.values, ds.hit_tokens.values, rtol=1e-9)
    pr = preset("anthropic_5m")
    h = ds.prefix_token_hit_rate
    np.testing.assert_allclose(ds.prefix_cost_multiplier, h * pr.read_multiplier + (1 - h) * pr.write_multiplier)
    assert np.all(ds.prefix_rate_per_s > 0) and np.all(ds.prefix_usd_per_day > 0)
    f = ds.prefix_hit_rate_ttl_formula
    if policy == "lru":
        assert np.all(np.isnan(f))
    else:  # the TTL formula per block with its own rate: close to the simulated (unbounded TTL cache) value
        assert np.all(np.isfinite(f))
        np.testing.assert_allclose(f.values, h.values, atol=0.03)
    assert "prefix=" not in (tmp_path / "summary.txt").read_text()


def prefix_groups_input(ds):
    """Input tokens per (cell, prefix) recomputed from the dataset's own columns: hit rates x inputs must
    add up, so take the inputs from the workload (one stream here)."""
    import json

    from cacheresearch.workload.synthetic import fleet_workload

    d = json.loads(ds.attrs["workload"])[0]["meta"]
    w = fleet_workload(**{k: d[k] for k in ("n_tenants", "system_tokens", "doc_tokens", "user_tokens", "n_requests",
                                           "block_tokens", "rate_per_s", "seed")})
    g = prefix_groups(w, "fleet", top_n=8)
    return g["input_tokens"]

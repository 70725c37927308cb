"""Figures legible (issue 47): every legend entry of the tiers figure is a series a reader can see (curves that
would hide each other are drawn once, labelled with every router they stand for), no two routers share a colour,
every y axis carries its unit, and the layouts axis is categorical. Built on a synthetic dataset of the tiers
study's shape (the study itself takes minutes)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from cacheresearch.studies import base as B
from cacheresearch.studies.tiers import plot

ROUTERS = ["random", "prefix_hash", "chwbl", "least_loaded", "tier_scorer", "tier_kv_cost", "tier_cache_aware",
           "tier_preble"]


def tiers_like() -> xr.Dataset:
    caps, gbps, lay, prs, tiers = ["0", "1.0", "2.0"], [1.0, 50.0], ["gpu_only", "local_cpu", "shared_pool"], \
        ["random", "tier_scorer"], ["gpu", "cpu", "pool", "disk"]
    hit = np.zeros((1, 3, 2, 8))
    hit[..., :] = np.array([0.50, 0.74, 0.65, 0.50, 0.74, 0.66, 0.74, 0.74])  # 4 distinct curves, 3 groups + one
    hit[0, :, :, 0] += np.array([0.0, 0.05, 0.08])[:, None]  # random gains from the cpu tier
    ttft = np.full((1, 3, 2, 8), 0.01)
    ttft[0, :, 0, 0] = [0.5, 0.6, 0.6]  # random: 1 GB/s slower than 50
    ttft[0, :, 1, 0] = [0.5, 0.3, 0.3]
    by_tier = np.zeros((1, 3, 2, 4))
    by_tier[0, :, :, 0] = 0.5
    by_tier[0, 1, 0, 1] = 0.1  # the cpu tier serves 10% under random routing, local cpu
    by_tier[0, 2, 0, 2] = 1e-4  # the pool: an invisible sliver
    return xr.Dataset(
        {"token_hit_rate": (("workload", "cpu_capacity", "cpu_gbps", "router"), hit),
         "ttft_p50_s": (("workload", "cpu_capacity", "cpu_gbps", "router"), ttft),
         "cpu_capacity_blocks": (("workload", "cpu_capacity"), np.array([[0, 1000, 2000]])),
         "pool_token_hit_rate": (("workload", "layout", "pool_router"), by_tier.sum(-1)),
         "pool_hit_rate_by_tier": (("workload", "layout", "pool_router", "tier"), by_tier),
         "pool_ttft_p50_s": (("workload", "layout", "pool_router"), np.full((1, 3, 2), 0.2))},
        coords={"workload": ["design"], "cpu_capacity": caps, "cpu_gbps": gbps, "router": ROUTERS, "tier": tiers,
                "layout": lay, "pool_router": prs})


def test_overlapping_groups_and_distinct_colours():
    g = B.overlapping_groups({"a": [1.0, 2.0], "b": [1.0, 2.001], "c": [1.5, 2.5], "d": [np.nan, 1.0],
                              "e": [np.nan, 1.0]})
    assert [names for names, _ in g] == [["a", "b"], ["c"], ["d", "e"]]
    for n in (8, 12, 25):
        cols = B.distinct_colours(n)
        assert len({tuple(np.round(c, 3)) for c in cols}) == n


def test_tiers_figure_legends_list_only_visible_series():
    f = plot(tiers_like())
    hit, ttft, pool = f.axes[:3]
    labels = [t.get_text() for t in hit.get_legend().get_texts()]
    # every router named once, in as many entries as lines drawn
    named = [r for lab in labels for r in lab.replace("=\n", "= ").split(" = ")]
    assert sorted(named) == sorted(ROUTERS) and len(labels) == len(hit.get_lines())
    assert "prefix_hash = tier_scorer = tier_cache_aware = tier_preble" in " ".join(labels).replace("=\n", "= ")
    colours = [tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
               for line in hit.get_lines()]
    assert len(set(colours)) == len(colours)
    tl = [t.get_text() for t in ttft.get_legend().get_texts()]
    assert any("(every bandwidth)" in t for t in tl) and "cpu at 1 GB/s" in tl and "cpu at 50 GB/s" in tl
    assert [t.get_text() for t in pool.get_legend().get_texts()] == ["served by gpu", "served by cpu"]
    assert [t.get_text() for t in pool.get_xticklabels()] == ["gpu only", "local cpu", "shared pool"]
    for ax in (hit, ttft, pool):
        assert "(" in ax.get_ylabel() and ax.get_ylabel().strip() not in ("s", "token hit rate"), ax.get_ylabel()
    assert "(%)" in hit.get_ylabel() and "(s" in ttft.get_ylabel()

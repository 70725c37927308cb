"""The routing experiments (``experiment=routing|llmd_blog|hot_tenant``) at reduced size.

Each writes a dataset with the routing metrics and a figure, its summary answers its question, and a
cell of the dataset equals a direct ``simulate`` call on the same workload (the shell adds nothing).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.shell.sweep import SweepError, build_workload, compose_config, make_plan, run_experiment

VARS = ("token_hit_rate", "request_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "load_imbalance",
        "prefix_copies", "overflow_share")

SMALL = {
    "routing": ["experiment=routing", "workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640",
                "workload.tenant.n_requests=150", "grid.rate_per_s=[4,40]", "grid.capacity_blocks=[200,800]",
                "grid.router=[random,prefix_hash,kubeai_chwbl,chwbl_c2,sglang_cache_aware,llmd_precise]",
                "fleet.prefix_blocks=40", "fleet.replicas=4", "engine.chunk_runs=4"],
    "llmd_blog": ["experiment=llmd_blog", "workload.tenant.n_tenants=10", "workload.tenant.prefix_tokens=480",
                  "workload.tenant.query_tokens=96", "workload.tenant.duration_s=6", "grid.rate_per_s=[3,30]",
                  "cache.capacity_blocks=300", "fleet.prefix_blocks=30", "fleet.replicas=4", "engine.chunk_runs=4",
                  "engine.max_batch=null"],
    "hot_tenant": ["experiment=hot_tenant", "workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640",
                   "workload.tenant.n_requests=150", "grid.rate_per_s=[4,20,60]", "fleet.prefix_blocks=40",
                   "fleet.replicas=4", "cache.capacity_blocks=800", "engine.chunk_runs=4",
                   "grid.router=[prefix_hash,kubeai_chwbl,sglang_cache_aware]"],
}


@pytest.fixture(scope="module", params=sorted(SMALL))
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    return request.param, run_experiment(SMALL[request.param], out), out


def test_dataset_has_the_routing_metrics_and_a_figure(run):
    name, ds, out = run
    for v in VARS:
        assert v in ds and ds[v].dims == ds["token_hit_rate"].dims, v
        assert ds[v].attrs.get("long_name"), v
    assert "router" in ds.dims and "rate_per_s" in ds.dims
    assert np.all(ds["queue_overflow"].values == 0)
    assert np.all(np.isfinite(ds["overflow_share"].values)) and np.all(np.isfinite(ds["prefix_copies"].values))
    assert (out / "results.nc").stat().st_size > 0 and (out / "figure.png").stat().st_size > 10_000
    text = (out / "summary.txt").read_text()
    assert "TTFT" in text
    if name == "routing":
        assert "Router to use:" in text and "Cap to set:" in text and "* Layout:" in text and "report.slo_s" in text
        assert text.index("Answers (SLO") < text.index("Routers at")  # the answers open the summary
    if name == "hot_tenant":
        assert "SLO" in text and ("crosses at" in text or "stays below" in text or "already above" in text)
    if name == "llmd_blog":
        assert "published" in text and "ordering at the top rate" in text


def test_latency_grows_with_load_and_copies_follow_the_router(run):
    name, ds, _ = run
    p99 = ds["ttft_p99_s"]
    lo, hi = ds["rate_per_s"].values[0], ds["rate_per_s"].values[-1]
    assert float(p99.sel(rate_per_s=hi).max()) > float(p99.sel(rate_per_s=lo).max())
    if "random" in ds["router"].values and "prefix_hash" in ds["router"].values:
        c = ds["prefix_copies"].sel(layout="stable") if "layout" in ds.dims else ds["prefix_copies"]
        # random routing spreads every prefix over the replicas; affinity keeps about one copy
        assert bool((c.sel(router="random") > c.sel(router="prefix_hash")).all())
        if "layout" in ds.dims:  # a timestamp at the top leaves nothing to share
            assert float(ds["token_hit_rate"].sel(layout="timestamp_top").max()) == 0.0


def test_a_cell_equals_a_direct_call():
    over = SMALL["hot_tenant"]
    cfg = compose_config(over)
    plan = make_plan(cfg)
    cell = next(c for c in plan.cells() if c["router"] == "kubeai_chwbl" and c["rate_per_s"] == 20
                and c["hot_share"] == 0.5)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ds = run_experiment(over, d)
    from cacheresearch.shell.sweep import _workload_key

    w = build_workload(cfg, plan, _workload_key(plan, cell))
    p = make_params("lru", 800, replicas=4, router="kubeai_chwbl", prefix_blocks=40, latency="h100_8b")
    m = simulate(compile_stream(w, chunk_runs=16), p, jax.random.key(cell["seed"]), max_replicas=4, match=True,
                 queue_slots=512)
    got = ds.sel(router="kubeai_chwbl", rate_per_s=20, hot_share=0.5)
    assert float(got["ttft_p99_s"]) == int(m.ttft_p99_ms) / 1000
    assert float(got["token_hit_rate"]) == pytest.approx(float(m.token_hit_rate), rel=1e-6)


def test_bad_router_and_knob_are_reported(tmp_path):
    with pytest.raises(SweepError, match="unknown router"):
        run_experiment(SMALL["hot_tenant"] + ["grid.router=[prefix_hash,telepathic]"], tmp_path)
    with pytest.raises(SweepError, match="chwbl_c_pct"):
        run_experiment(SMALL["hot_tenant"] + ["grid.chwbl_c_pct=[50]"], tmp_path)
    with pytest.raises(SweepError, match="workload.source=tenant"):
        run_experiment(["experiment=seed_fleet", "grid.rate_per_s=[1,2]"], tmp_path)

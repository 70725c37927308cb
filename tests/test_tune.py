"""experiment=tune (:mod:`cacheresearch.studies.tune`) on a small tenant workload: the exhaustive grid checked
against the sweep's own grid study (another code path from config to engine), the best's overrides, the
holdout, resume after a kill, CF attributes, the cost formula, and one-line errors naming the key."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr

from cacheresearch.shell.sweep import SweepError, compose_config, run, run_experiment
from cacheresearch.studies import tune as T

SMALL = ["experiment=tune", "workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640",
         "workload.tenant.query_tokens=64", "workload.tenant.output_tokens=16", "workload.tenant.n_requests=240",
         "workload.tenant.rate_per_s=40", "fleet.replicas=4", "fleet.prefix_blocks=40", "cache.capacity_blocks=200",
         "engine.queue_slots=64", "tune.holdout_seeds=2", "tune.progress=false", "~tune.slo.token_hit_rate",
         "~tune.knobs.chwbl_c_pct", "tune.knobs.router.values=[random,least_loaded,prefix_hash]",
         "tune.knobs.capacity_blocks={low:40,high:400,grid:[40,120,400]}"]


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune_grid")
    ds = run_experiment(SMALL + ["tune.method=grid", "tune.population=4"], out)
    return ds, out


def test_grid_is_exhaustive_and_matches_the_grid_study(grid_run, tmp_path):
    ds, out = grid_run
    assert int(ds.evaluations) == 9 and ds.attrs["grid_points_total"] == 9
    assert ds.sizes["generation"] == 3 and int(ds.evaluated.sum()) == 9
    # the sweep's own grid study (shell/sweep.py builds workloads and params its own way) over the same points
    ref = run_experiment([o for o in SMALL if "tune." not in o] + [
        "kind=grid", "grid.router=[random,least_loaded,prefix_hash]", "grid.capacity_blocks=[40,120,400]"],
        tmp_path / "ref")
    p99 = ref.ttft_p99_s.values.reshape(-1)
    ours = {}
    for g in range(ds.sizes["generation"]):
        for c in range(ds.sizes["candidate"]):
            if bool(ds.evaluated[g, c]):
                r, cap = ds.knob_value[g, c].values
                ours[(["random", "least_loaded", "prefix_hash"][int(r)], int(cap))] = float(ds.objective[g, c])
    want = {(r, c): float(ref.ttft_p99_s.sel(router=r, capacity_blocks=c)) for r in ref.router.values
            for c in ref.capacity_blocks.values}
    assert ours == pytest.approx(want, rel=0, abs=1e-12)
    assert float(ds.best_objective) == pytest.approx(p99.min(), abs=1e-12)
    # the printed overrides reproduce the best through the grid study
    ovr = ds.attrs["best_overrides"].split()
    again = run_experiment([o for o in SMALL if "tune." not in o] + ["kind=grid"] + ovr, tmp_path / "again")
    assert float(again.ttft_p99_s) == pytest.approx(float(ds.best_objective), abs=1e-12)
    assert "as command-line overrides: " + ds.attrs["best_overrides"] in (out / "summary.txt").read_text()


def test_holdout_is_fresh_seeds_of_the_winner(grid_run):
    ds, _ = grid_run
    assert ds.holdout_seed.values.tolist() == [1000, 1001]
    assert float(ds.holdout_objective) == pytest.approx(float(ds.holdout_objective_seed.mean()))
    assert float(ds.holdout_gap) == pytest.approx(float(ds.holdout_objective) - float(ds.best_objective))


def test_every_variable_has_cf_attributes(grid_run):
    _, out = grid_run
    back = xr.load_dataset(out / "results.nc", engine="h5netcdf")
    for name in list(back.data_vars) + list(back.coords):
        assert back[name].attrs.get("long_name"), name
        assert "units" in back[name].attrs, name
    for v in ("best_objective", "evaluations", "objective", "knob_value", "constraint_value", "best_so_far"):
        assert v in back, v
    assert (out / "figure.png").stat().st_size > 1000


def test_cma_resumes_after_a_kill_with_the_same_answer(tmp_path):
    ov = SMALL + ["tune.method=cma", "tune.population=4", "tune.generations=3", "tune.holdout_seeds=0",
                  "+tune.slo.token_hit_rate.min=0.3", "launch.progress=false"]
    cfg = compose_config(ov)
    first = run(cfg, tmp_path, chunks=True)
    # a kill after generation 2: its chunks stay, generation 3 and the outputs are gone
    shutil.rmtree(tmp_path / "chunks" / "call-2")
    (tmp_path / "results.nc").unlink()
    again = run(compose_config(ov), tmp_path, chunks=True)
    assert again.attrs["chunks_resumed"] >= 2
    for v in ("knob_value", "objective", "violation", "best_objective", "best_so_far"):
        np.testing.assert_array_equal(again[v].values, first[v].values)
    assert again.attrs["best_overrides"] == first.attrs["best_overrides"]
    assert int(first.evaluations) == 12
    # the search moved: generation 3's candidates are not generation 1's
    assert not np.array_equal(first.unit_value[0].values, first.unit_value[2].values)


@pytest.mark.parametrize("override, key", [
    ("+tune.knobs.nosuch={low:1,high:2}", "tune.knobs.nosuch"),
    ("+tune.knobs.rate_per_s={low:1,high:2}", "tune.knobs.rate_per_s"),
    ("+tune.knobs.chwbl_c_pct={low:300,high:200}", "tune.knobs.chwbl_c_pct"),
    ("+tune.knobs.chwbl_c_pct={low:50,high:200}", "tune.knobs.chwbl_c_pct"),
    ("+tune.knobs.view={values:[]}", "tune.knobs.view.values"),
    ("+tune.slo.tpot_mean_s.max=0.1", "tune.slo.tpot_mean_s"),
    ("+tune.slo.nosuch.max=0.1", "tune.slo.nosuch"),
    ("tune.objective=e2e_p99_s", "tune.objective"),
    ("tune.method=bayes", "tune.method"),
    ("+tune.nosuch=1", "tune.nosuch"),
])
def test_bad_input_is_one_line_naming_the_key(override, key, tmp_path):
    with pytest.raises(SweepError) as e:
        run(compose_config(SMALL + [override]), tmp_path, write=False)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_usd_per_day_by_hand():
    tot, gpu, tok = T.usd_per_day([8], [600_000], [1_000_000], [3600.0],
                                  dict(gpu_usd_per_hour=2.0, gpus_per_replica=2, pricing="anthropic_5m"))
    assert gpu[0] == pytest.approx(8 * 2 * 2.0 * 24)
    # 400k missed tokens written at 1.25 x $3/Mtok, 600k read at 0.1 x, per hour -> 24 hours
    assert tok[0] == pytest.approx((0.4 * 1.25 * 3 + 0.6 * 0.1 * 3) * 24)
    assert tot[0] == pytest.approx(gpu[0] + tok[0])


def test_knob_coordinates():
    k = T.Knob("capacity_blocks", "int", 100, 1000)
    assert k.decode(0.0) == 100 and k.decode(1.0) == 1000 and k.decode(7) == 1000
    assert k.decode(k.encode(550)) == 550
    c = T.Knob("router", "cat", values=("a", "b", "c"))
    assert [c.decode(u) for u in (0.0, 0.34, 0.99, 1.0)] == ["a", "b", "c", "c"]
    assert all(c.decode(c.encode(v)) == v for v in c.values)
    g = T.Knob("x", "float", 1.0, 100.0, log=True)
    assert g.decode(0.5) == pytest.approx(10.0)

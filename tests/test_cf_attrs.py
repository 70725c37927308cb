"""CF attributes: every variable of every experiment's ``results.nc`` carries ``long_name``, and ``units``
unless it is a label (a router's name, a policy). A representative set of experiments runs small through
the command line's pipeline here and its ``results.nc`` is opened and checked, and checked against the
record (``docs/experiments/variables.json``, written by ``cacheresearch docs --record`` from small runs of
every experiment); the record itself is checked for every experiment; the slow test reruns every record run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from cacheresearch.shell import cf, guide
from cacheresearch.shell.record import RECORD_RUNS, variables_of
from cacheresearch.shell.sweep import run_experiment

FAST = ["seed_fleet", "economics", "capacity", "mooncake_table1", "policy_curves", "ttl_trace", "che"]
RECORD = json.loads(guide.VARIABLES_FILE.read_text(encoding="utf-8"))


def _check(name, tmp_path):
    run_experiment([f"experiment={name}", *RECORD_RUNS[name], "output.figure=false", "launch.progress=false"],
                   tmp_path)
    with xr.open_dataset(tmp_path / "results.nc", engine="h5netcdf") as ds:
        assert cf.missing(ds) == [], (name, cf.missing(ds))
        got = variables_of(ds)
    want = RECORD[name]
    assert sorted(got) == sorted(want), (name, "regenerate: cacheresearch docs --record")
    for v, a in got.items():
        assert {k: a.get(k) for k in ("long_name", "units")} == {k: want[v].get(k) for k in ("long_name", "units")}, v


@pytest.mark.parametrize("name", FAST)
def test_results_nc_is_self_describing(name, tmp_path):
    _check(name, tmp_path)


@pytest.mark.slow  # long; see README's slow checks
@pytest.mark.parametrize("name", [n for n, o in RECORD_RUNS.items() if o is not None and n not in FAST])
def test_every_record_run_is_self_describing(name, tmp_path):
    _check(name, tmp_path)


def test_the_record_covers_every_experiment_it_runs_and_every_variable_has_attributes():
    assert set(RECORD) >= {n for n, o in RECORD_RUNS.items() if o is not None}
    bad = [f"{n}.{v}" for n, vs in RECORD.items() for v, a in vs.items()
           if "long_name" not in a or ("units" not in a and not a["label"])]
    assert not bad, bad


def test_missing_names_what_is_missing_and_complete_fills_by_rule():
    ds = xr.Dataset({"hit_rate": ("x", np.ones(2)), "hit_rate_ci_low": ("x", np.ones(2)),
                     "published_ttft_p90_s_all": ("x", np.ones(2)), "mystery": ("x", np.ones(2))},
                    coords={"x": [1, 2], "router": ["a", "b"]})
    ds.hit_rate.attrs.update(long_name="hit rate", units="1")
    cf.complete(ds)
    assert ds.hit_rate_ci_low.attrs == {"long_name": "lower end of the 95% interval: hit rate", "units": "1"}
    assert ds.published_ttft_p90_s_all.attrs["units"] == "s"
    assert "units" not in ds.router.attrs and "long_name" in ds.router.attrs  # a label
    assert cf.missing(ds) == ["mystery: long_name", "mystery: units", "x: long_name", "x: units"]
    ds.hit_rate.attrs["long_name"] = "kept"
    cf.complete(ds)
    assert ds.hit_rate.attrs["long_name"] == "kept"  # never overwritten

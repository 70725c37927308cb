"""Hydra launchers over chunks: a 2-part sweep (``launch.part=0,1 launch.parts=2``, one chunk each) run as
a multirun through joblib, submitit's local executor and a local Ray instance (the launcher's local
mode starts it) equals the single-process result. Each test is skipped when its plugin is not
installed (``pip install -e '.[test]'`` installs all three)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import xarray as xr
from test_chunks import ROOT, SMALL, assert_same_results, env

from cacheresearch.shell.sweep import compose_config, run

LAUNCHERS = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", ["hydra.launcher.n_jobs=2"]),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", ["hydra.launcher.timeout_min=10",
                                                                 "hydra.launcher.cpus_per_task=1"]),
    "ray_local": ("hydra_plugins.hydra_ray_launcher", ["hydra.launcher.ray.init.num_cpus=2"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(compose_config(SMALL), tmp_path_factory.mktemp("ref"), write=False)


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """One compilation cache for every job of these tests: the first compiles, the others load."""
    return tmp_path_factory.mktemp("jax_cache")


@pytest.mark.parametrize("launcher", [pytest.param(k, marks=pytest.mark.slow) if k == "ray_local" else k
                                      for k in LAUNCHERS])
def test_two_part_multirun_equals_single_process(launcher, tmp_path, reference, jax_cache):
    plugin, extra = LAUNCHERS[launcher]
    if importlib.util.find_spec(plugin) is None:
        pytest.skip(f"{plugin} is not installed (pip install -e '.[test]')")
    if launcher == "ray_local" and importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    out = tmp_path / "multirun"
    cmd = [sys.executable, "-m", "cacheresearch.sweep", "-m", f"hydra/launcher={launcher}", *extra,
           "launch.part=0,1", "launch.parts=2", "launch.progress=false", *SMALL, f"hydra.sweep.dir={out}"]
    p = subprocess.run(cmd, cwd=ROOT, env=env(jax_cache), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    files = sorted((out / "chunks").glob("chunk-*.nc"))
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as ds:
        ds = ds.load()
    # both parts' chunks in one directory (a part's chunks are its programs' calls: numba runs a stream per call)
    assert len(files) == ds.attrs["chunks"] >= 2
    assert_same_results(ds, reference)

"""Every ``notebooks/*.py`` (jupytext percent format) parses as a notebook and runs to completion.

Each notebook runs as a script in a subprocess (``MPLBACKEND=Agg``). A notebook named after an
experiment reads ``CACHERESEARCH_RESULTS``: the test points it at a small dataset made here with
:func:`cacheresearch.shell.sweep.run_experiment` (sizes in ``SMALL``), so no notebook can rot silently.
Notebooks without an entry in ``SMALL`` run with the variable unset (their own reduced path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

from cacheresearch.shell.sweep import run_experiment

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))

#: experiment name -> overrides for a small dataset the notebook of the same name can read
SMALL = {
    "seed_fleet": ["experiment=seed_fleet", "workload.fleet.n_requests=64", "seeds=2"],
    "routing": ["experiment=routing", "workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640",
                "workload.tenant.n_requests=120", "fleet.prefix_blocks=40", "fleet.replicas=4",
                "grid.capacity_blocks=[800]", "grid.rate_per_s=[4,40]", "engine.chunk_runs=4",
                "grid.router=[random,prefix_hash,kubeai_chwbl,llmd_precise]"],
    "economics": ["experiment=economics", "seeds=1", "study.requests_per_hour=[6,60]", "study.sim.target_requests=2000",
                  "study.sim.prefixes=20", "study.sim.arrivals=[poisson]"],
}


def _env(**extra):
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("CACHERESEARCH_RESULTS", None)
    env.update(extra)
    return env


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/*.py not found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_jupytext_percent(path):
    nb = jupytext.read(path)
    assert nb.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("code") >= 2 and "markdown" in kinds


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    env = _env()
    if path.stem in SMALL:
        out = tmp_path / "data"
        run_experiment(SMALL[path.stem], out)
        env["CACHERESEARCH_RESULTS"] = str(out / "results.nc")
    p = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    if path.stem in SMALL:
        pngs = list((tmp_path / "data").glob("*.png"))
        assert len(pngs) >= 2, pngs  # the sweep's figure.png and the notebook's own figure
    assert not list(path.parent.glob("*.png")), "notebooks must not write into the repository"


@pytest.mark.slow  # long; see README's slow checks
def test_seed_fleet_notebook_without_data(tmp_path):
    """With CACHERESEARCH_RESULTS unset the notebook runs its own reduced sweep."""
    path = ROOT / "notebooks" / "seed_fleet.py"
    p = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_env(TMPDIR=str(tmp_path)),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "reduced run" in p.stdout and "83.7%" in p.stdout
    assert list(tmp_path.glob("seed_fleet_*/seed_fleet_bars.png"))

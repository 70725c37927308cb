"""Chunked, resumable sweeps (:mod:`cacheresearch.shell.chunks`): chunk sizes give identical results, a rerun
takes the finished chunks, a changed configuration is refused (or started afresh), parts of a grid
combine into the single-process result, and a run killed with SIGKILL leaves no ``results.nc`` and
resumes to the uninterrupted result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from cacheresearch.shell import chunks
from cacheresearch.shell.sweep import SweepError, compose_config, run

ROOT = Path(__file__).resolve().parent.parent
# a small grid: 2 policies x 2 routers x 2 layouts x 2 seeds = 16 configurations over 4 streams
SMALL = ["experiment=seed_fleet", "workload.fleet.n_requests=120", "seeds=2", "output.figure=false"]


def env(cache=None):
    """The environment of a sweep subprocess; ``cache``: a JAX compilation cache shared by the processes
    of one test (the second process loads the compiled programs instead of compiling them again)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("MPLBACKEND", "Agg")
    e["RAY_USAGE_STATS_ENABLED"] = "0"  # a local Ray instance (the launcher tests) reports nothing outside
    if cache is not None:
        e.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return e


def assert_same_results(a: xr.Dataset, b: xr.Dataset):
    """Every data variable and coordinate bitwise equal (attributes such as timings may differ)."""
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)  # NaN == NaN here
    for c in a.coords:
        np.testing.assert_array_equal(a[c].values, b[c].values, err_msg=c)


def run_small(out, *extra, chunked=True):
    return run(compose_config(SMALL + list(extra)), out, chunks=chunked)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The grid in one process, without chunk files (the default plan)."""
    return run_small(tmp_path_factory.mktemp("ref"), chunked=False)


@pytest.mark.parametrize("size", [1, 7, None])
def test_chunk_sizes_give_identical_results(tmp_path, reference, size):
    extra = [] if size is None else [f"engine.max_batch={size}"]
    ds = run_small(tmp_path, *extra)
    assert_same_results(ds, reference)
    files = sorted((tmp_path / chunks.CHUNK_DIR).glob("chunk-*.nc"))
    assert ds.attrs["chunks"] == len(files) and ds.attrs["chunks_resumed"] == 0 and ds.attrs["devices"] >= 1
    if size is not None:  # every chunk holds at most `size` configurations (at least one per stream slot)
        for f in files:
            with xr.open_dataset(f, engine="h5netcdf") as c:
                assert c.sizes["cell"] <= size
        assert len(files) >= -(-16 // size)
    # the saved file is the returned dataset
    with xr.open_dataset(tmp_path / "results.nc", engine="h5netcdf") as saved:
        assert_same_results(saved.load(), ds)


def test_rerun_takes_finished_chunks(tmp_path, reference):
    run_small(tmp_path, "engine.max_batch=4")
    files = sorted((tmp_path / chunks.CHUNK_DIR).glob("chunk-*.nc"))
    assert len(files) == 4
    files[1].unlink()  # as if the run had been killed before this chunk
    files[3].unlink()
    again = run_small(tmp_path, "engine.max_batch=4")
    assert again.attrs["chunks_resumed"] == 2 and again.attrs["chunks"] == 4
    assert again.attrs["n_compiled_calls"] == 2  # only the missing chunks ran
    assert_same_results(again, reference)
    # a rerun with another chunk size still takes every finished configuration (results do not depend on it)
    third = run_small(tmp_path, "engine.max_batch=2")
    assert third.attrs["chunks_resumed"] == 4 and third.attrs["n_compiled_calls"] == 0
    assert_same_results(third, reference)


def test_changed_config_is_refused_or_started_afresh(tmp_path, capsys):
    run_small(tmp_path, "engine.max_batch=8")
    n_files = len(list((tmp_path / chunks.CHUNK_DIR).glob("chunk-*.nc")))  # per the backends' calls
    assert n_files >= 2
    with pytest.raises(SweepError,
                       match=r"another configuration \(cache.capacity_blocks: 400 -> 300\).*launch.resume=fresh"):
        run_small(tmp_path, "engine.max_batch=8", "cache.capacity_blocks=300")
    ds = run_small(tmp_path, "engine.max_batch=8", "cache.capacity_blocks=300", "launch.resume=fresh")
    assert ds.attrs["chunks_resumed"] == 0
    assert f"discarding {n_files} chunks of another configuration" in capsys.readouterr().err
    with pytest.raises(SweepError, match="launch.resume must be"):
        run_small(tmp_path, "launch.resume=sometimes")


def test_edited_input_file_is_another_configuration(tmp_path):
    """The chunk store checks the input files a configuration names (size and sha256), not only their path."""
    from cacheresearch.shell.pipeline import PipelineError
    from cacheresearch.shell.sweep import _chunk_stores

    def _chunk_store(cfg, root):
        return _chunk_stores(cfg, root)(0)

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n')
    over = ["experiment=replay", f"trace.path={trace}", "cache.capacity_blocks=10"]
    _chunk_store(compose_config(over), tmp_path / "run")
    _chunk_store(compose_config(over), tmp_path / "run")  # unchanged: accepted
    with trace.open("a") as f:
        f.write('{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(PipelineError, match="input_files"):
        _chunk_store(compose_config(over), tmp_path / "run")
    with pytest.raises(SweepError, match="fresh with launch.parts > 1"):
        _chunk_store(compose_config(over + ["launch.resume=fresh", "launch.parts=2"]), tmp_path / "run")


def test_parts_combine_into_the_single_process_result(tmp_path, reference):
    assert run_small(tmp_path, "launch.part=0", "launch.parts=2") is None  # the other half is still missing
    assert not (tmp_path / "results.nc").exists()
    ds = run_small(tmp_path, "launch.part=1", "launch.parts=2")
    assert_same_results(ds, reference)
    with pytest.raises(SweepError, match="launch.part=2 must be below launch.parts=2"):
        run_small(tmp_path / "x", "launch.part=2", "launch.parts=2")


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "results.nc"
    path.write_text("old")

    def broken(p):
        Path(p).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        chunks.write_atomic(path, broken)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.nc"]


def test_plan_line_and_quiet_progress(tmp_path, capsys):
    ds = run_small(tmp_path, "engine.max_batch=8", "launch.progress=false")
    n = int(ds.attrs["chunks"])  # the calls of the programs' backends (numba: one stream per call)
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("plan: "))
    assert f"16 configurations, {n} chunks to run, 4 streams, memory estimate" in line and "devices " in line
    assert n == len(list((tmp_path / chunks.CHUNK_DIR).glob("chunk-*.nc")))
    assert "config/s" not in err and "sweep:" not in err  # no bar when told so
    run_small(tmp_path, "engine.max_batch=8", "launch.progress=true")
    err = capsys.readouterr().err
    assert f"0 chunks to run, 16 done in {n} earlier chunks" in err
    run_small(tmp_path / "bar", "engine.max_batch=8", "launch.progress=true")
    err = capsys.readouterr().err
    assert "sweep: 100%" in err and "16/16" in err  # the bar, on stderr, over configurations


@pytest.mark.slow  # long; see README's slow checks
def test_kill_and_resume_is_identical(tmp_path, reference):
    """A real sweep process killed with SIGKILL once a chunk file exists; the rerun finishes the rest."""
    out = tmp_path / "OUT"
    cmd = [sys.executable, "-m", "cacheresearch.sweep", *SMALL, "engine.max_batch=1", "launch.progress=false",
           f"hydra.run.dir={out}"]
    cache = tmp_path / "jax_cache"
    p = subprocess.Popen(cmd, cwd=ROOT, env=env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not list((out / chunks.CHUNK_DIR).glob("chunk-*.nc")) and p.poll() is None:
            assert time.monotonic() < deadline, "no chunk file within 240 s"
            time.sleep(0.005)
        assert p.poll() is None, "the sweep finished before it could be killed: " + p.stderr.read().decode()[-500:]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    done = sorted((out / chunks.CHUNK_DIR).glob("chunk-*.nc"))
    assert 1 <= len(done) < 16 and not (out / "results.nc").exists()
    for f in done:  # every chunk file there is complete
        with xr.open_dataset(f, engine="h5netcdf") as c:
            assert c.sizes["cell"] == 1
    r = subprocess.run(cmd, cwd=ROOT, env=env(cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as ds:
        ds = ds.load()
    assert ds.attrs["chunks_resumed"] >= len(done) and ds.attrs["chunks"] == 16
    assert_same_results(ds, reference)


# a small study (kind: economics): 2 TTL policies x 10 runs (3 rates and 2 arrival processes x 2 seeds) = 20 cells
STUDY = ["experiment=economics", "seeds=2", "study.requests_per_hour=[6,60]", "study.sim.target_requests=1500",
         "study.sim.prefixes=20", "study.sim.max_duration_s=86400", "output.figure=false"]


def test_study_kill_and_resume_is_identical(tmp_path):
    """Every study runs through the chunked pipeline: a study process killed with SIGKILL once a chunk file
    exists leaves no results.nc; the rerun resumes the finished chunks and equals an uninterrupted run."""
    reference = run(compose_config(STUDY), tmp_path / "ref", chunks=False)
    out = tmp_path / "OUT"
    cmd = [sys.executable, "-m", "cacheresearch.sweep", *STUDY, "engine.max_batch=1", "launch.progress=false",
           f"hydra.run.dir={out}"]
    cache = tmp_path / "jax_cache"
    p = subprocess.Popen(cmd, cwd=ROOT, env=env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not list((out / chunks.CHUNK_DIR).glob("chunk-*.nc")) and p.poll() is None:
            assert time.monotonic() < deadline, "no chunk file within 240 s"
            time.sleep(0.005)
        assert p.poll() is None, "the study finished before it could be killed: " + p.stderr.read().decode()[-500:]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    done = sorted((out / chunks.CHUNK_DIR).glob("chunk-*.nc"))
    assert 1 <= len(done) < 20 and not (out / "results.nc").exists()
    r = subprocess.run(cmd, cwd=ROOT, env=env(cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as ds:
        ds = ds.load()
    assert ds.attrs["study_kind"] == "economics"
    assert ds.attrs["chunks_resumed"] >= len(done) and ds.attrs["chunks"] == 20
    assert_same_results(ds, reference)


def test_study_refuses_a_changed_configuration(tmp_path):
    """A study's chunk files belong to its configuration: another one is refused, naming the key."""
    run(compose_config(STUDY + ["study.sim.enabled=true"]), tmp_path, chunks=True)
    with pytest.raises(SweepError, match="requests_per_hour"):
        run(compose_config([o for o in STUDY if "requests_per_hour" not in o] + ["study.requests_per_hour=[6]"]),
            tmp_path, chunks=True)

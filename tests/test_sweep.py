"""The sweep shell (``python -m cacheresearch.sweep``): configs, grid layout, outputs, errors.

* The three documented commands (replay with an LRU x capacity x replicas grid, replay with a TTL
  grid, the seed fleet table at reduced size) produce datasets with the right dims, coordinates,
  variables and attributes, plus ``summary.txt`` and ``figure.png``.
* Values are checked against independent computations, never against stored numbers: the
  plain-Python oracle (``tests/reference.py``) and direct single-configuration ``simulate`` calls.
* Replay runs on a freshly generated Mooncake-format trace (different block size, 40-bit ids,
  branching conversations) that no other test sees.
* Bad inputs give a :class:`SweepError` with a readable message (and exit status 2 on the command line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import xarray as xr
import yaml
from reference import reference_simulate

from cacheresearch import __version__
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import combine_limbs, compile_stream, make_params
from cacheresearch.shell import report
from cacheresearch.shell.sweep import SweepError, compose_config, make_plan, run_experiment
from cacheresearch.workload.synthetic import fleet_workload
from cacheresearch.workload.trace import load_mooncake

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mini_mooncake.jsonl"
SHARED_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"

CMD1 = ["grid.policy=[lru,lru_plain,unbounded]", "grid.capacity_blocks=[1000,10000,30000]",
        "grid.replicas=[1,2,4,8]", "fleet.router=round_robin"]
CMD2 = ["grid.policy=[ttl_refresh,ttl_fixed]", "grid.ttl_s=[60,300,3600]"]
FLEET_SMALL = ["experiment=seed_fleet", "workload.fleet.n_requests=96", "seeds=2"]


def _env():
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def make_fresh_trace(path: Path, *, n: int = 300, block_tokens: int = 128, seed: int = 7) -> Path:
    """A random Mooncake-format trace unlike the fixture: 128-token blocks, ids above 2**40, a few
    Zipf-popular system prompts, growing conversations, truncated branches and one-off prompts;
    Poisson-like arrivals about 20 s apart (so 60 s / 300 s / 3600 s TTLs differ)."""
    rng = np.random.default_rng(seed)
    nxt = [2**40 + 12345]

    def fresh(k: int) -> list[int]:
        ids = list(range(nxt[0], nxt[0] + k))
        nxt[0] += k
        return ids

    roots = [fresh(int(rng.integers(3, 40))) for _ in range(6)]
    pop = 1.0 / np.arange(1, 7) ** 1.2
    pop /= pop.sum()
    history: list[list[int]] = []
    t = 0
    lines = []
    for _ in range(n):
        t += int(rng.exponential(20_000))
        u = rng.random()
        if history and u < 0.35:  # next turn of an earlier conversation
            base = history[int(rng.integers(len(history)))]
        elif history and u < 0.55:  # branch off a truncated earlier prompt
            h = history[int(rng.integers(len(history)))]
            base = h[: int(rng.integers(1, len(h) + 1))]
        elif u < 0.9:
            base = roots[int(rng.choice(6, p=pop))]
        else:
            base = []
        ids = (base + fresh(int(rng.integers(1, 40))))[:300]
        history.append(ids)
        n_in = (len(ids) - 1) * block_tokens + int(rng.integers(1, block_tokens + 1))
        lines.append(json.dumps({"timestamp": t, "input_length": n_in, "output_length": int(rng.integers(1, 400)),
                                 "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _check_common(ds: xr.Dataset, out: Path, dims: list[str], experiment: str):
    assert list(ds["token_hit_rate"].dims) == dims
    for v in ("token_hit_rate", "request_hit_rate", "hit_tokens", "input_tokens"):
        assert list(ds[v].dims) == dims, v
    assert ds["token_hit_rate"].dtype.kind == "f" and ds["request_hit_rate"].dtype.kind == "f"
    assert ds["hit_tokens"].dtype == np.int64 and ds["input_tokens"].dtype == np.int64
    for v in ("token_hit_rate", "request_hit_rate"):
        assert ds[v].attrs["units"] == "1" and ds[v].attrs["long_name"]
    a = ds.attrs
    assert a["experiment"] == experiment
    cfg = yaml.safe_load(a["config"])
    assert cfg["name"] == experiment
    assert a["cacheresearch_version"] == __version__
    assert a["wall_time_s"] > 0 and a["compile_time_s"] >= 0 and a["simulate_time_s"] > 0
    desc = json.loads(a["workload"])
    assert desc and all({"n_requests", "total_blocks", "distinct_keys"} <= set(d) for d in desc)
    # exact totals agree with the rates
    np.testing.assert_allclose(ds.hit_tokens / ds.input_tokens, ds.token_hit_rate, rtol=1e-5, atol=1e-7)
    assert np.all(ds.hit_tokens <= ds.input_tokens)
    # files: the netCDF round-trips, the summary and the figure exist
    back = report.load(out / "results.nc")
    xr.testing.assert_equal(back, ds)
    assert back.attrs["config"] == a["config"]
    text = (out / "summary.txt").read_text()
    assert "token_hit_rate" in text and experiment in text
    png = (out / "figure.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    return cfg, desc


def _ref_hit_tokens(w, **kw) -> int:
    return int(reference_simulate(w, **kw)["hit_tokens"].sum())


# ------------------------------------------------------------------------------ replay
@pytest.fixture(scope="module")
def fixture_cmd1(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixture_cmd1")
    ds = run_experiment(["experiment=replay", f"trace.path={FIXTURE}", "trace.block_tokens=512", *CMD1], out)
    return ds, out


@pytest.mark.slow  # long; see README's slow checks
def test_replay_cmd1_layout(fixture_cmd1):
    ds, out = fixture_cmd1
    _, desc = _check_common(ds, out, ["policy", "capacity_blocks", "replicas"], "replay")
    assert list(ds.policy.values) == ["lru", "lru_plain", "unbounded"]
    assert list(ds.capacity_blocks.values) == [1000, 10000, 30000]
    assert list(ds.replicas.values) == [1, 2, 4, 8]
    w = load_mooncake(FIXTURE, block_tokens=512)
    assert desc == [dict(desc[0], n_requests=w.n_requests, total_blocks=w.total_blocks,
                         distinct_keys=int(np.unique(w.keys).size), input_tokens=int(w.input_tokens.sum()))]
    assert np.all(ds.input_tokens == int(w.input_tokens.sum()))
    # capacity is ignored by the unbounded policy: constant along that axis
    u = ds.hit_tokens.sel(policy="unbounded")
    assert np.all(u == u.isel(capacity_blocks=0))
    assert ds.attrs["max_replicas"] == 8


@pytest.mark.slow  # long; see README's slow checks
def test_replay_cmd1_values_match_reference(fixture_cmd1):
    ds, _ = fixture_cmd1
    w = load_mooncake(FIXTURE, block_tokens=512)
    for pol, cap, rep in [("lru_plain", 1000, 4), ("unbounded", 30000, 2), ("lru", 10000, 8)]:
        ref = reference_simulate(w, policy=pol, capacity_blocks=cap, replicas=rep, router="round_robin")
        cell = ds.sel(policy=pol, capacity_blocks=cap, replicas=rep)
        assert int(cell.hit_tokens) == int(ref["hit_tokens"].sum())
        np.testing.assert_allclose(float(cell.request_hit_rate), ref["request_hit_rate"], rtol=1e-6)


@pytest.fixture(scope="module")
def fresh_trace(tmp_path_factory):
    return make_fresh_trace(tmp_path_factory.mktemp("fresh") / "fresh_trace.jsonl")


def test_replay_fresh_trace_lru_grid(fresh_trace, tmp_path):
    ds = run_experiment(["experiment=replay", f"trace.path={fresh_trace}", "trace.block_tokens=128", *CMD1], tmp_path)
    _check_common(ds, tmp_path, ["policy", "capacity_blocks", "replicas"], "replay")
    w = load_mooncake(fresh_trace, block_tokens=128)
    assert w.keys.max() > 2**40  # ids beyond 32 bits survive the whole pipeline
    # capacity matters on this trace (otherwise the check below would be vacuous)
    lru = ds.hit_tokens.sel(policy="lru", replicas=1)
    assert lru.sel(capacity_blocks=1000) < lru.sel(capacity_blocks=30000)
    for pol, cap, rep in [("lru", 1000, 1), ("lru_plain", 1000, 2), ("lru", 10000, 4), ("unbounded", 1000, 8)]:
        want = _ref_hit_tokens(w, policy=pol, capacity_blocks=cap, replicas=rep, router="round_robin")
        assert int(ds.hit_tokens.sel(policy=pol, capacity_blocks=cap, replicas=rep)) == want, (pol, cap, rep)
    # a direct single-configuration engine call agrees too
    m = simulate(compile_stream(w), make_params("lru_plain", 1000, None, 2, "round_robin"), jax.random.key(0),
                 max_replicas=8, per_request=False)
    assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == int(
        ds.hit_tokens.sel(policy="lru_plain", capacity_blocks=1000, replicas=2))
    assert float(m.token_hit_rate) == pytest.approx(float(ds.token_hit_rate.sel(
        policy="lru_plain", capacity_blocks=1000, replicas=2)), rel=1e-6)


def test_replay_fresh_trace_ttl_grid(fresh_trace, tmp_path):
    ds = run_experiment(["experiment=replay", f"trace.path={fresh_trace}", "trace.block_tokens=128", *CMD2], tmp_path)
    _check_common(ds, tmp_path, ["policy", "ttl_s"], "replay")
    assert list(ds.ttl_s.values) == [60, 300, 3600]
    w = load_mooncake(fresh_trace, block_tokens=128)
    got = ds.hit_tokens
    assert got.sel(policy="ttl_refresh", ttl_s=60) < got.sel(policy="ttl_refresh", ttl_s=3600)
    for pol in ("ttl_refresh", "ttl_fixed"):
        for ttl in (60, 300, 3600):
            assert int(got.sel(policy=pol, ttl_s=ttl)) == _ref_hit_tokens(w, policy=pol, ttl_s=ttl), (pol, ttl)


def test_max_batch_gives_the_same_numbers(tmp_path):
    base = ["experiment=replay", f"trace.path={FIXTURE}", "trace.block_tokens=512", *CMD2]
    a = run_experiment(base, tmp_path / "a")
    b = run_experiment(base + ["engine.max_batch=4"], tmp_path / "b")  # 6 cells: two calls, last one padded
    assert b.attrs["n_compiled_calls"] == 2 and a.attrs["n_compiled_calls"] == 1
    for v in ("token_hit_rate", "request_hit_rate", "hit_tokens"):
        xr.testing.assert_equal(a[v], b[v])


@pytest.mark.slow  # long; see README's slow checks
def test_command_line_cmd2(tmp_path):
    out = tmp_path / "OUT"
    cmd = [sys.executable, "-m", "cacheresearch.sweep", "experiment=replay", f"trace.path={FIXTURE}",
           "trace.block_tokens=512", *CMD2, f"hydra.run.dir={out}"]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    ds = report.load(out)
    _check_common(ds, out, ["policy", "ttl_s"], "replay")
    assert "ttl_refresh" in p.stdout and "results.nc" in p.stdout
    assert (out / "summary.txt").read_text().strip() in p.stdout
    w = load_mooncake(FIXTURE, block_tokens=512)
    assert int(ds.hit_tokens.sel(policy="ttl_fixed", ttl_s=300)) == _ref_hit_tokens(w, policy="ttl_fixed", ttl_s=300)


def test_command_line_error_is_clean(tmp_path):
    cmd = [sys.executable, "-m", "cacheresearch.sweep", "experiment=replay", "trace.path=no/such/trace.jsonl",
           f"hydra.run.dir={tmp_path / 'OUT'}"]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "error: trace.path: file not found: no/such/trace.jsonl" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "OUT" / "results.nc").exists()


# ------------------------------------------------------------------------------ seed fleet
@pytest.fixture(scope="module")
def fleet_small(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet")
    return run_experiment(FLEET_SMALL, out), out


def test_seed_fleet_layout(fleet_small):
    ds, out = fleet_small
    cfg, desc = _check_common(ds, out, ["policy", "router", "layout", "seed"], "seed_fleet")
    assert list(ds.policy.values) == ["lru_plain", "lru"]
    assert list(ds.router.values) == ["random", "prefix_hash"]
    assert list(ds.layout.values) == ["stable", "timestamp_top"]
    assert list(ds.seed.values) == [0, 1]
    assert {k: cfg["fleet"][k] for k in ("router", "replicas", "prefix_blocks", "max_replicas")} == {
        "router": "random", "replicas": 4, "prefix_blocks": 80, "max_replicas": None}
    assert cfg["cache"]["capacity_blocks"] == 400
    # one stream per (layout, seed), described in the attrs
    assert ds.attrs["n_streams"] == 4 and len(desc) == 4
    assert {(d["layout"], d["seed"]) for d in desc} == {(lay, s) for lay in ("stable", "timestamp_top") for s in (0, 1)}
    stable = [d for d in desc if d["layout"] == "stable"]
    assert all(d["n_requests"] == 96 and d["total_blocks"] == 96 * 128 for d in stable)
    stamped = [d for d in desc if d["layout"] == "timestamp_top"]
    assert all(d["distinct_keys"] == d["total_blocks"] for d in stamped)
    # a timestamp at the top shares nothing: zero hits everywhere
    assert int(ds.hit_tokens.sel(layout="timestamp_top").max()) == 0
    assert int(ds.hit_tokens.sel(layout="stable").min()) > 0


def test_seed_fleet_values_match_direct_calls(fleet_small):
    ds, _ = fleet_small
    streams = {s: compile_stream(fleet_workload(n_requests=96, layout="stable", seed=s)) for s in (0, 1)}
    for pol, router, seed in [("lru_plain", "random", 1), ("lru", "prefix_hash", 0), ("lru", "random", 0)]:
        m = simulate(streams[seed], make_params(pol, 400, None, 4, router, 80), jax.random.key(seed),
                     max_replicas=4, per_request=False)
        cell = ds.sel(policy=pol, router=router, layout="stable", seed=seed)
        assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == int(cell.hit_tokens), (pol, router, seed)
        assert float(m.token_hit_rate) == pytest.approx(float(cell.token_hit_rate), rel=1e-6)
        assert float(m.request_hit_rate) == pytest.approx(float(cell.request_hit_rate), rel=1e-6)
    # prefix_hash routing is reproducible in pure Python: the oracle agrees as well
    w = fleet_workload(n_requests=96, layout="stable", seed=1)
    want = _ref_hit_tokens(w, policy="lru_plain", capacity_blocks=400, replicas=4, router="prefix_hash",
                           prefix_blocks=80)
    assert int(ds.hit_tokens.sel(policy="lru_plain", router="prefix_hash", layout="stable", seed=1)) == want


def test_seed_fleet_summary_states_the_comparison(fleet_small):
    ds, out = fleet_small
    text = (out / "summary.txt").read_text()
    for s in ("83.7%", "96.8%", "0.0%", "published", "leaf-first", "paired over 2 seeds"):
        assert s in text, s
    ours = float(ds.token_hit_rate.sel(policy="lru_plain", router="random", layout="stable").mean())
    assert f"{100 * ours:.1f} ±" in text
    assert text.rstrip("\n") == report.summarize(ds)


def test_seed_changes_workload_and_router(tmp_path):
    """grid.seed as a list: explicit seeds; the trace source has no workload seed (one stream)."""
    ds = run_experiment(["experiment=replay", f"trace.path={FIXTURE}", "trace.block_tokens=512",
                         "fleet.router=random", "grid.seed=[3,5]", "grid.replicas=[2,4]"], tmp_path)
    assert list(ds.token_hit_rate.dims) == ["replicas", "seed"] and list(ds.seed.values) == [3, 5]
    assert ds.attrs["n_streams"] == 1
    assert ds.hit_tokens.sel(replicas=4, seed=3) != ds.hit_tokens.sel(replicas=4, seed=5)


# ------------------------------------------------------------------------------ plans and errors
def test_plan_scalars_override_the_base():
    cfg = compose_config(["experiment=seed_fleet", "grid.policy=lru", "grid.router=prefix_hash", "seeds=1",
                          "grid.replicas=[2,8]"])
    plan = make_plan(cfg)
    assert plan.dims == ["replicas", "layout"]
    assert plan.base["policy"] == "lru" and plan.base["router"] == "prefix_hash"
    assert plan.max_replicas == 8 and plan.workload_dims == ["layout"]
    assert len(list(plan.cells())) == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grid.policy=[lru,belady]"], "unknown policy 'belady'"),  # fifo, arc are policies now (issue 21)
        (["cache.policy=mru"], "unknown policy 'mru'"),
        (["fleet.router=bogus"], "unknown router 'bogus'"),
        (["grid.router=[random,sticky]"], "unknown router 'sticky'"),
        (["cache.capacity_blocks=null"], "policy 'lru' needs a capacity"),
        (["cache.policy=ttl_fixed", "cache.ttl_s=null"], "policy 'ttl_fixed' needs a TTL"),
        (["grid.replicas=[1,4]", "fleet.max_replicas=2"], "exceed fleet.max_replicas=2"),
        (["grid.layout=[stable]"], "grid.layout applies to workload.source=fleet or tenant"),
        (["grid.capacity_blocks=[100,100]"], "repeated values"),
        (["grid.capacity_blocks=[]"], "empty list"),
        (["grid.ttl_s=[-1]", "cache.policy=ttl_refresh"], "grid.ttl_s must be >= 0"),
        (["trace.block_tokens=100"], "trace: "),
    ],
)
def test_bad_replay_inputs(overrides, message, tmp_path):
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run_experiment(["experiment=replay", f"trace.path={FIXTURE}", *overrides], tmp_path)
    assert not (tmp_path / "results.nc").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["experiment=replay"], "needs trace.path=FILE"),
        (["experiment=replay", "trace.path=does/not/exist.jsonl"], "file not found: does/not/exist.jsonl"),
        (["grid.layout=[stable,sideways]"], "unknown layout 'sideways'"),
        (["experiment=seed_fleet", "workload.fleet.n_requests=-3"], "workload.fleet: n_requests must be >= 0"),
        (["workload.source=csv"], "unknown source 'csv'"),
        (["seeds=0"], "seeds must be >= 1"),
    ],
)
def test_bad_inputs(overrides, message, tmp_path):
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run_experiment(overrides, tmp_path)


def test_unknown_grid_key_is_rejected_by_the_schema(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="grid.polcy"):
        run_experiment(["grid.polcy=[lru]"], tmp_path)
    with pytest.raises(SweepError, match="hydra"):
        run_experiment(["hydra.run.dir=x"], tmp_path)


# ------------------------------------------------------------------------------ the shared trace
@pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="shared Mooncake trace not present")
def test_shared_trace_ttl_grid_prefix(tmp_path):
    """The documented TTL command on the first 600 requests of the shared trace, against the oracle."""
    ds = run_experiment(["experiment=replay", f"trace.path={SHARED_TRACE}", "trace.block_tokens=512",
                         "trace.max_requests=600", *CMD2], tmp_path)
    w = load_mooncake(SHARED_TRACE, block_tokens=512, max_requests=600)
    assert json.loads(ds.attrs["workload"])[0]["n_requests"] == 600
    for pol, ttl in [("ttl_refresh", 60), ("ttl_fixed", 300)]:
        assert int(ds.hit_tokens.sel(policy=pol, ttl_s=ttl)) == _ref_hit_tokens(w, policy=pol, ttl_s=ttl)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="shared Mooncake trace not present")
def test_shared_trace_cmd1_full(tmp_path):
    ds = run_experiment(["experiment=replay", f"trace.path={SHARED_TRACE}", "trace.block_tokens=512", *CMD1], tmp_path)
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    h = ds.hit_tokens
    assert np.all(h.sel(policy="unbounded") >= h.sel(policy="lru"))
    assert np.all(h.sel(policy="lru").diff("capacity_blocks") >= 0)  # LRU stack property, per replica count
    for pol, cap, rep in [("lru", 1000, 1), ("lru_plain", 10000, 4)]:
        assert int(h.sel(policy=pol, capacity_blocks=cap, replicas=rep)) == _ref_hit_tokens(
            w, policy=pol, capacity_blocks=cap, replicas=rep, router="round_robin")

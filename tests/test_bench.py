"""The benchmark at tiny size: JSON schema, and the project's numbers equal the exact engine's.

No wall-clock assertions: timings depend on the machine.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import jax
import numpy as np
import pytest

from cacheresearch import bench
from cacheresearch.engine import combine_limbs, compile_stream, make_params, simulate
from cacheresearch.mrc import route_requests
from cacheresearch.workload import Workload


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    report = bench.run_bench(["tiny"], quick=True, configs=8, repeats=1, budget_s=0.5, json_path=str(path), quiet=True)
    return report, path


@pytest.fixture(scope="module")
def tiny_spec():
    return bench.make_workload("tiny", quick=True, quiet=True)


def _engine_tokens(spec, capacity, replicas, seed):
    stream = compile_stream(spec.workload)
    m = simulate(stream, make_params("lru", int(capacity), replicas=int(replicas), router="random"),
                 jax.random.PRNGKey(int(seed)), max_replicas=int(replicas))
    return int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)), np.asarray(m.hit_blocks)


def test_json_schema(tiny_report):
    report, path = tiny_report
    on_disk = json.loads(path.read_text())
    assert on_disk["cases"] == json.loads(json.dumps(report["cases"]))
    for key in ("machine", "settings", "workloads", "cases", "scaling", "shards", "total_s"):
        assert key in on_disk
    m = on_disk["machine"]
    for key in ("cpu", "cores", "jax_backend", "jax_devices", "versions"):
        assert key in m
    assert {"jax", "numpy", "cacheresearch", "libcachesim"} <= set(m["versions"])
    names = [c["name"] for c in on_disk["cases"]]
    assert names == ["single", "sweep8_engine", "sweep8_curve", "mrc"]
    for c in on_disk["cases"]:
        for key in bench.CASE_KEYS:
            assert key in c, (c["name"], key)
        assert c["workload"] == "tiny"
        assert c["project_s"] > 0 and c["project_compile_s"] >= 0
        assert c["peak_rss_mb"] > 0
        assert 0 <= c["project_hit_rate"] <= 1
        if m["versions"]["libcachesim"] is None:
            assert c["libcachesim_s"] is None and c["ratio"] is None
        else:
            assert c["libcachesim_s"] > 0 and 0 <= c["libcachesim_hit_rate"] <= 1
            assert c["ratio"] == pytest.approx(c["libcachesim_s"] / c["project_s"], rel=1e-3)
    axes = {(row["axis"], row["method"]) for row in on_disk["scaling"]}
    assert ("requests", "engine single") in axes and ("requests", "curve single") in axes
    assert ("configs", "engine grid (simulate_grid)") in axes
    assert [row["rate"] for row in on_disk["shards"]] == [0.1, 0.01]
    assert bench.format_table(on_disk).count("\n") == len(names) + 1


def test_single_equals_engine(tiny_report, tiny_spec):
    report, _ = tiny_report
    single = report["cases"][0]
    assert single["curve_equals_engine"] is True
    assert single.get("reference_equals_engine") is True  # the whole tiny workload fits the reference
    tokens, blocks = _engine_tokens(tiny_spec, single["capacity"], single["replicas"], 0)
    assert single["project_hit_tokens"] == tokens
    assert single["project_hit_blocks"] == int(blocks.sum())
    assert single["project_hit_rate"] == pytest.approx(blocks.sum() / tiny_spec.workload.total_blocks, abs=1e-6)


def test_sweep_equals_engine(tiny_report, tiny_spec):
    report, _ = tiny_report
    eng, cur = report["cases"][1], report["cases"][2]
    assert eng["engine_equals_curve"] is True and cur["engine_equals_curve"] is True
    assert eng["configs"] == 8 == len(eng["per_config"])
    cells = {(p["capacity"], p["replicas"], p["seed"]) for p in eng["per_config"]}
    assert len(cells) == 8
    assert {p["seed"] for p in eng["per_config"]} == {0, 1}
    assert len({p["replicas"] for p in eng["per_config"]}) == 2
    for p in eng["per_config"][::3]:  # a few configurations, each against its own engine run
        tokens, _ = _engine_tokens(tiny_spec, p["capacity"], p["replicas"], p["seed"])
        assert p["project_hit_tokens"] == tokens


def test_mrc_equals_engine(tiny_report, tiny_spec):
    report, _ = tiny_report
    c = report["cases"][3]
    assert c["curve_equals_engine"] is True
    for cap, tok in zip(c["engine_checked_capacities"], c["engine_checked_hit_tokens"]):
        assert _engine_tokens(tiny_spec, cap, 1, 0)[0] == tok
    caps = c["curve"]["capacities"]
    assert caps == sorted(set(caps)) and caps[0] == 1 and caps[-1] == c["working_set_blocks"]


def test_leaf_first_stream_and_lcs(tmp_path, tiny_spec):
    """libCacheSim's input: each replica's blocks, leaf first, dense ids; its miss count is plain LRU's."""
    w = tiny_spec.workload
    ids = bench.leaf_first_ids(w)
    _, dense = np.unique(w.keys, return_inverse=True)
    for i in (0, 7, w.n_requests - 1):
        a, b = w.offsets[i], w.offsets[i + 1]
        assert ids[a:b].tolist() == (dense.reshape(-1)[a:b][::-1] + 1).tolist()
    lcs = pytest.importorskip("libcachesim")
    rep = route_requests(w, "random", 2, key=jax.random.PRNGKey(0))
    streams = bench.LcsStreams(lcs, w, ids, rep, 2, tmp_path, "t")
    assert streams.total == w.total_blocks
    block_rep = np.repeat(rep, w.n_blocks)

    def lru_misses(seq, cap):
        od, miss = OrderedDict(), 0
        for k in seq:
            if k in od:
                od.move_to_end(k)
            else:
                miss += 1
                od[k] = None
                if len(od) > cap:
                    od.popitem(last=False)
        return miss

    for cap in (5, 12, 40):
        expect = sum(lru_misses(ids[block_rep == r].tolist(), cap) for r in range(2))
        assert streams.run(cap) == expect


def test_capacity_grids():
    caps = bench.capacity_grid(400, 1024)
    assert caps.size == 1024 and np.all(np.diff(caps) > 0) and caps[0] >= 1
    assert bench.capacity_grid(400, 16).size == 16
    lc = bench.lcs_capacities(5000, 64)
    assert lc.size == 64 and lc[0] == 1 and lc[-1] == 5000
    assert bench.lcs_capacities(10, 64).tolist() == list(range(1, 11))
    assert bench.hashpower(1) == 10 and bench.hashpower(100_000) == 19


def test_memory_workload_and_check():
    w = bench.memory_workload(3000)
    assert isinstance(w, Workload) and w.n_requests == 3000 and w.total_blocks == 12000
    w.check_distinct_keys()
    out = bench.memory_check(3000, capacity=500)
    assert out["curve_equals_engine"] is True
    assert out["peak_rss_mb"] > 0 and out["accesses"] == 12000


def test_mooncake_falls_back_to_fixture(monkeypatch):
    monkeypatch.setattr(bench, "SHARED_TRACE", bench.SHARED_TRACE.with_name("no_such_trace.jsonl"))
    spec = bench.make_workload("mooncake", quick=True, quiet=True)
    assert spec.source.startswith("fixture") and "absent" in spec.note
    assert spec.workload.n_requests == 200 and spec.workload.block_tokens == 512

"""The benchmark at tiny size: JSON schema, case names, and every figure compares equal work.

No wall-clock assertions: timings depend on the machine. What is checked: each project path is its
own case with its own ratio; libCacheSim's parallel batch gives the same miss counts as its sequential
run; libCacheSim reads as many accesses as the engine; the project's numbers equal the exact engine's.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path

import jax
import numpy as np
import pytest
from reference import reference_simulate

from cacheresearch import bench
from cacheresearch.analysis.mrc import route_requests
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import combine_limbs, compile_stream, make_params
from cacheresearch.workload import Workload

REPO = Path(__file__).resolve().parent.parent
NAMES = ["single_engine_jax", "single_curve", "single_replay", "single_engine", "sweep8_engine_jax",
         "sweep8_engine", "sweep8_curve", "sweep8_cache_aware", "mrc_curve"]
LCS_WORKERS = 2


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    report = bench.run_bench(["tiny"], quick=True, configs=8, repeats=1, budget_s=0.5, json_path=str(path), quiet=True,
                             lcs_workers=LCS_WORKERS, reference=reference_simulate)
    return report, path


@pytest.fixture(scope="module")
def tiny_spec():
    return bench.make_workload("tiny", quick=True, quiet=True)


@pytest.fixture(scope="module")
def cases(tiny_report):
    return {c["name"]: c for c in tiny_report[0]["cases"]}


@pytest.fixture(scope="module")
def have_lcs(tiny_report):
    return tiny_report[0]["machine"]["versions"]["libcachesim"] is not None


def _engine(spec, capacity, replicas, seed, router="random", queue=False, **knobs):
    stream = compile_stream(spec.workload)
    m = simulate(stream, make_params("lru", int(capacity), replicas=int(replicas), router=router, **knobs),
                 jax.random.PRNGKey(int(seed)), max_replicas=int(replicas), queue=queue)
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
    assert on_disk["settings"]["lcs_workers"] == LCS_WORKERS
    names = [c["name"] for c in on_disk["cases"]]
    assert names == NAMES
    for c in on_disk["cases"]:
        for key in bench.CASE_KEYS:
            assert key in c, (c["name"], key)
        assert c["workload"] == "tiny"
        assert c["path"] in bench.PATHS
        assert c["project_s"] > 0 and c["project_compile_s"] >= 0
        assert c["peak_rss_mb"] > 0
        if c["project_hit_rate"] is not None:
            assert 0 <= c["project_hit_rate"] <= 1
    axes = {(row["axis"], row["method"]) for row in on_disk["scaling"]}
    assert ("requests", "engine single") in axes and ("requests", "curve single") in axes
    assert ("configs", "engine grid (simulate_grid)") in axes
    assert [row["rate"] for row in on_disk["shards"]] == [0.1, 0.01]
    table = bench.format_table(on_disk)
    assert table.count("\n") == len(names) + 2  # header, rule, one row per case, legend
    for name in names:
        assert f" {name} " in table


def test_case_names_are_distinct_and_name_their_path(tiny_report):
    cases = tiny_report[0]["cases"]
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names)
    for c in cases:
        text = (c["name"] + " " + c["method"]).lower()
        assert "fastest" not in text and "best path" not in text, c["name"]
        assert c["name"] not in ("single", "sweep8", "mrc")  # every case says which path it times
        assert c["method"].split(":")[0] == c["path"], (c["name"], c["method"])
    by_path = {c["name"]: c["path"] for c in cases}
    assert by_path["single_engine"] == by_path["sweep8_engine"] == "engine"  # the default path (backend=auto)
    assert by_path["single_engine_jax"] == by_path["sweep8_engine_jax"] == by_path["sweep8_cache_aware"] == "engine_jax"
    assert by_path["single_curve"] == by_path["sweep8_curve"] == by_path["mrc_curve"] == "curve"
    assert by_path["single_replay"] == "replay"


def test_ratios(cases, have_lcs):
    """``ratio`` is libCacheSim's seconds (parallel where the case has several configurations, one core
    for the single cases) over the case's own project seconds; ``ratio_sequential`` always one core."""
    for name, c in cases.items():
        if name.endswith("cache_aware"):
            continue
        if not have_lcs:
            assert c["libcachesim_s"] is None and c["ratio"] is None
            continue
        assert c["libcachesim_s"] > 0 and 0 <= c["libcachesim_hit_rate"] <= 1
        assert c["ratio_sequential"] == pytest.approx(c["libcachesim_s"] / c["project_s"], rel=1e-3)
        if name.startswith("single_"):
            assert c["configs"] == 1
            assert c["ratio_basis"] == "libcachesim_s" and c["libcachesim_parallel_s"] is None
            assert c["ratio"] == pytest.approx(c["libcachesim_s"] / c["project_s"], rel=1e-3)
        else:
            assert c["configs"] > 1
            assert c["ratio_basis"] == "libcachesim_parallel_s"
            assert c["libcachesim_parallel_s"] > 0
            assert 1 <= c["libcachesim_workers"] <= LCS_WORKERS
            assert c["libcachesim_parallel_wall_s"] > 0 and 0 < c["libcachesim_parallel_balance"] <= 1
            assert c["ratio"] == pytest.approx(c["libcachesim_parallel_s"] / c["project_s"], rel=1e-3)
        assert c["ratio_with_compile"] <= c["ratio"] * (1 + 1e-3)
    # the three single cases share libCacheSim's run but each has its own project time
    singles = [cases[f"single_{p}"] for p in bench.PATHS]
    assert len({c["libcachesim_s"] for c in singles}) == 1
    assert len({c["project_hit_tokens"] for c in singles}) == 1
    # the sweep's engine and curve cases share libCacheSim's runs
    assert cases["sweep8_engine"]["libcachesim_parallel_s"] == cases["sweep8_curve"]["libcachesim_parallel_s"]


def test_parallel_libcachesim_equals_sequential(cases, have_lcs):
    if not have_lcs:
        pytest.skip("libcachesim is not installed")
    for name in ("sweep8_engine", "sweep8_curve"):
        c = cases[name]
        assert c["libcachesim_parallel_equals_sequential"] is True
        seq = [p["libcachesim_hit_rate"] for p in c["per_config"]]
        par = [p["libcachesim_parallel_hit_rate"] for p in c["per_config"]]
        assert None not in seq and seq == par
    m = cases["mrc_curve"]
    assert m["libcachesim_parallel_equals_sequential"] is True
    assert None not in m["curve"]["libcachesim_hit_rate"]
    assert m["curve"]["libcachesim_parallel_hit_rate"] == m["curve"]["libcachesim_hit_rate"]


def test_engine_and_libcachesim_see_the_same_accesses(cases, tiny_spec, have_lcs):
    if not have_lcs:
        pytest.skip("libcachesim is not installed")
    n = tiny_spec.workload.total_blocks
    for name, c in cases.items():
        assert c["accesses"] == n
        if name.endswith("cache_aware"):
            assert c["libcachesim_accesses"] is None
            continue
        assert c["libcachesim_accesses"] == n, name
        if c.get("libcachesim_parallel_accesses") is not None:
            assert c["libcachesim_parallel_accesses"] == [n] * len(c["libcachesim_parallel_accesses"])
            assert len(c["libcachesim_parallel_accesses"]) == (c["configs"] if name != "mrc_curve" else len(
                c["curve"]["capacities"]))


def test_single_equals_engine(cases, tiny_spec):
    for path in bench.PATHS:
        single = cases[f"single_{path}"]
        assert single["curve_equals_engine"] is True and single["replay_equals_engine"] is True
        assert single.get("reference_equals_engine") is True  # the whole tiny workload fits the reference
    single = cases["single_engine"]
    tokens, blocks = _engine(tiny_spec, single["capacity"], single["replicas"], 0)
    assert single["project_hit_tokens"] == tokens
    assert single["project_hit_blocks"] == int(blocks.sum())
    assert single["project_hit_rate"] == pytest.approx(blocks.sum() / tiny_spec.workload.total_blocks, abs=1e-6)


def test_sweep_equals_engine(cases, tiny_spec):
    eng, cur = cases["sweep8_engine"], cases["sweep8_curve"]
    assert eng["engine_equals_curve"] is True and cur["engine_equals_curve"] is True
    assert eng["configs"] == 8 == len(eng["per_config"])
    cells = {(p["capacity"], p["replicas"], p["seed"]) for p in eng["per_config"]}
    assert len(cells) == 8
    assert {p["seed"] for p in eng["per_config"]} == {0, 1}
    assert len({p["replicas"] for p in eng["per_config"]}) == 2
    for p in eng["per_config"][::3]:  # a few configurations, each against its own engine run
        tokens, _ = _engine(tiny_spec, p["capacity"], p["replicas"], p["seed"])
        assert p["project_hit_tokens"] == tokens


def test_cache_aware_sweep(cases, tiny_spec):
    ca, eng = cases["sweep8_cache_aware"], cases["sweep8_engine"]
    assert ca["router"] == "cache_aware" and ca["view"] == "precise" and ca["queue"] is True
    assert ca["baseline_router"] == "random" and ca["baseline_queue"] is True
    assert ca["cost_vs_random"] == pytest.approx(ca["project_s"] / ca["baseline_s"], rel=1e-3)
    assert ca["libcachesim_s"] is None and ca["ratio"] is None and ca["ratio_basis"] is None
    assert ca["configs"] == eng["configs"]
    # the baseline ran the same cells as the random sweep; the queue does not change random routing
    assert ca["baseline_equals_sweep_engine"] is True
    assert [(p["capacity"], p["replicas"], p["seed"]) for p in ca["per_config"]] == \
           [(p["capacity"], p["replicas"], p["seed"]) for p in eng["per_config"]]
    assert [p["baseline_hit_tokens"] for p in ca["per_config"]] == [p["project_hit_tokens"] for p in eng["per_config"]]
    for p in ca["per_config"][::3]:
        tokens, _ = _engine(tiny_spec, p["capacity"], p["replicas"], p["seed"], router="cache_aware", queue=True,
                            view="precise")
        assert p["project_hit_tokens"] == tokens
    assert 0 <= ca["project_token_hit_rate"] <= 1


def test_mrc_equals_engine(cases, tiny_spec):
    c = cases["mrc_curve"]
    assert c["curve_equals_engine"] is True
    for cap, tok in zip(c["engine_checked_capacities"], c["engine_checked_hit_tokens"]):
        assert _engine(tiny_spec, cap, 1, 0)[0] == tok
    caps = c["curve"]["capacities"]
    assert caps == sorted(set(caps)) and caps[0] == 1 and caps[-1] == c["working_set_blocks"]


def _lru_misses(seq, cap):
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


@pytest.fixture(scope="module")
def tiny_streams(tmp_path_factory, tiny_spec):
    lcs = pytest.importorskip("libcachesim")
    w = tiny_spec.workload
    ids = bench.leaf_first_ids(w)
    rep = route_requests(w, "random", 2, key=jax.random.PRNGKey(0))
    streams = bench.LcsStreams(lcs, w, ids, rep, 2, tmp_path_factory.mktemp("lcs"), "t")
    return streams, ids, rep


def test_leaf_first_stream_and_lcs(tiny_spec, tiny_streams):
    """libCacheSim's input: each replica's blocks, leaf first, dense ids; its miss count is plain LRU's."""
    w = tiny_spec.workload
    ids = bench.leaf_first_ids(w)
    _, dense = np.unique(w.keys, return_inverse=True)
    for i in (0, 7, w.n_requests - 1):
        a, b = w.offsets[i], w.offsets[i + 1]
        assert ids[a:b].tolist() == (dense.reshape(-1)[a:b][::-1] + 1).tolist()
    streams, ids, rep = tiny_streams
    assert streams.total == w.total_blocks == streams.accesses
    block_rep = np.repeat(rep, w.n_blocks)
    assert streams.distinct == [int(np.unique(ids[block_rep == r]).size) for r in range(2)]
    assert [u.hashpower for u in streams.units(5)] == [bench.hashpower(d) for d in streams.distinct]
    for cap in (5, 12, 40):
        expect = sum(_lru_misses(ids[block_rep == r].tolist(), cap) for r in range(2))
        assert streams.run(cap) == expect
        seconds, misses = streams.run_timed(cap)
        assert misses == expect and seconds >= 0


def test_pool_equals_sequential(tiny_streams):
    streams, _, _ = tiny_streams
    configs = [(streams, c) for c in (1, 5, 12, 40, 300)]
    _, seq = bench.lcs_sequential(configs)
    units = [u for i, (st, cap) in enumerate(configs) for u in st.units(cap, i)]
    pool = bench.LcsPool(2, timeout_s=120)
    try:
        assert len(pool.pids) == 2
        for _ in range(2):  # fresh caches every batch: the second batch gives the same counts
            r = pool.run(units)
            assert r["workers"] == 2 and len(r["busy"]) == 2 and r["seconds"] == max(r["busy"])
            assert r["wall"] >= 0 and r["cpu"] >= 0
            misses = np.zeros(len(configs), np.int64)
            for u, (miss_ratio, n_req) in zip(units, r["results"]):
                assert n_req == u.length
                misses[u.config] += round(miss_ratio * u.length)
            assert misses.tolist() == seq
        pool.release()
    finally:
        pool.close()
    with pytest.raises(RuntimeError):
        pool.run(units)  # closed


def test_assign_units():
    lengths = [50, 10, 40, 40, 5, 5, 30, 1]
    plan = bench.assign_units(lengths, 3)
    assert len(plan) == 3
    assert sorted(i for idx in plan for i in idx) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in idx) for idx in plan]
    assert max(loads) - min(loads) <= max(lengths)
    assert bench.assign_units([3, 3], 4)[2:] == [[], []]  # more workers than units: some get none


def test_capacity_grids_and_hashpower():
    caps = bench.capacity_grid(400, 1024)
    assert caps.size == 1024 and np.all(np.diff(caps) > 0) and caps[0] >= 1
    assert bench.capacity_grid(400, 16).size == 16
    lc = bench.lcs_capacities(5000, 64)
    assert lc.size == 64 and lc[0] == 1 and lc[-1] == 5000
    assert bench.lcs_capacities(10, 64).tolist() == list(range(1, 11))
    assert bench.subset_index(10, None).tolist() == list(range(10))
    assert bench.subset_index(100, 5).tolist() == [0, 25, 50, 74, 99]
    # sized from the distinct ids a replica sees (two buckets per id at least), not from capacity
    assert bench.hashpower(1) == 10 and bench.hashpower(100_000) == 18 and bench.hashpower(2**20) == 21
    for n in (1000, 6475, 149_000, 3_000_000):
        assert 2 ** bench.hashpower(n) >= 2 * n


def test_no_chunk_knob():
    """compile_stream chooses its own chunking: the bench neither passes nor exposes a chunk width."""
    src = "\n".join(p.read_text() for p in sorted((REPO / "cacheresearch" / "bench").glob("*.py")))
    assert not hasattr(bench, "ENGINE_CHUNK_BLOCKS")
    assert "CHUNK_BLOCKS" not in src and "engine_chunk" not in src
    assert "compile_stream(" in src and not re.search(r"compile_stream\([^)]*chunk", src)
    gpu = (REPO / "benchmarks" / "gpu.sh").read_text()
    assert "CHUNK_BLOCKS" not in gpu
    assert "libcachesim_parallel_s" in gpu


def test_memory_workload_and_check():
    w = bench.memory_workload(3000)
    assert isinstance(w, Workload) and w.n_requests == 3000 and w.total_blocks == 12000
    w.check_distinct_keys()
    out = bench.memory_check(3000, capacity=500)
    assert out["curve_equals_engine"] is True
    assert out["peak_rss_mb"] > 0 and out["accesses"] == 12000


def test_unknown_case_is_refused():
    with pytest.raises(ValueError, match="unknown cases"):
        bench.run_bench([], cases=("single", "fastest"), quiet=True)


def test_mooncake_falls_back_to_fixture(monkeypatch):
    from cacheresearch.bench import workloads  # noqa: PLC0415 - the module that reads the path

    monkeypatch.setattr(workloads, "SHARED_TRACE", workloads.SHARED_TRACE.with_name("no_such_trace.jsonl"))
    spec = bench.make_workload("mooncake", quick=True, quiet=True)
    assert spec.source.startswith("fixture") and "absent" in spec.note
    assert spec.workload.n_requests == 200 and spec.workload.block_tokens == 512


def test_default_path_cases_run_the_sweeps_defaults(cases):
    """single_engine / sweep8_engine time what a sweep runs by default (backend=auto, its queue slots and
    per-request outputs); the *_jax cases the JAX engine."""
    from cacheresearch.bench.auto import SWEEP_QUEUE_SLOTS
    from cacheresearch.shell.schema import EngineConf

    assert SWEEP_QUEUE_SLOTS == EngineConf().queue_slots and EngineConf().backend == "auto"
    want = "numba" if jax.default_backend() == "cpu" else "jax"
    for name in ("single_engine", "sweep8_engine"):
        assert "backend=auto" in cases[name]["method"] and f"backend chosen: {want}" in cases[name]["method"]
    for name in ("single_engine_jax", "sweep8_engine_jax"):
        assert cases[name]["method"].startswith("engine_jax: the JAX engine")


def test_sweep_vllm_counts_events():
    """sweep{n}_vllm's rows: steps and events as the runner's metrics give them; decode stretches merge
    steps (100 output tokens per request), so events < steps; mean <= max events per configuration."""
    from cacheresearch.bench.vllm import sweep_vllm

    rep = sweep_vllm(n=2, requests=40, backends=("numba",))
    (row,) = rep["rows"]
    assert rep["case"] == "sweep2_vllm" and row["programs"] == ["numba"] and row["configurations"] == 2
    assert 0 < row["events"] < row["engine_steps"]
    assert row["events_per_config_mean"] <= row["events_per_config_max"] <= row["events"]
    assert row["events_per_config_mean"] == pytest.approx(row["events"] / 2, abs=0.05)
    assert row["events_per_s"] > 0 and row["equal_to_first_backend"] is None

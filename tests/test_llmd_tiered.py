"""experiment=llmd_tiered: the published tiered runs' files, the run-length rule, per-arm layouts, a reduced run."""

import shutil

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from cacheresearch.studies import StudyError, get, run_in_memory
from cacheresearch.studies.llmd_tiered import RUNS, _run_seconds, hybrid_manager, read_run


def test_bundled_runs_read():
    for name, d in RUNS.items():
        folder, r, pub = read_run(name)
        assert folder == d and set(r["arms"]) == {"baseline", "offload"}
        assert r["arms"]["offload"]["cpu_tier"] and not r["arms"]["baseline"]["cpu_tier"]
        assert pub is not None and (d / "SOURCE.txt").is_file()
        for v, tab in pub["per_stage"].items():
            assert all(len(x) == len(pub["stage_rates"]) for x in tab.values()), v


def test_run_seconds_lays_stages_end_to_end():
    # stage 0: sends at 0 and 1,000 ms, last finish 5,000; stage 1 (simulated after a long gap): sends at
    # 100,000 and 100,500, last finish 102,000. inference-perf: 5 s + (interval 60 + 1) s + 2 s.
    arr = np.array([0.0, 1000.0, 100000.0, 100500.0])
    fin = np.array([5000.0, 3000.0, 101000.0, 102000.0])
    stage = np.array([0, 0, 1, 1])
    assert _run_seconds(arr, fin, stage, 2, 60.0) == pytest.approx(5.0 + 61.0 + 2.0)
    # a request that never finished (fin < arrival) does not end its stage before its own send
    fin2 = fin.copy()
    fin2[3] = -1.0
    assert _run_seconds(arr, fin2, stage, 2, 60.0) == pytest.approx(5.0 + 61.0 + 1.0)


def test_hybrid_manager_follows_the_connector():
    r = {"arms": {"baseline": {"cpu_tier": False}, "offload": {"cpu_tier": True}}}
    assert hybrid_manager(r, "baseline") and not hybrid_manager(r, "offload")
    assert hybrid_manager(dict(r, connector_supports_hma=True), "offload")
    r["arms"]["baseline"]["hybrid_manager"] = False  # a what-if: --disable-hybrid-kv-cache-manager
    assert not hybrid_manager(r, "baseline")


def test_bad_run_folders_fail_in_one_line(tmp_path):
    with pytest.raises(StudyError, match="neither a bundled run"):
        read_run(tmp_path / "nowhere")
    shutil.copytree(RUNS["qwen3-32b"], tmp_path / "q")
    f = tmp_path / "q" / "run.yaml"
    r = yaml.safe_load(f.read_text())
    f.write_text(yaml.safe_dump(dict(r, gpu_typo=1)))
    with pytest.raises(StudyError, match="unknown key 'gpu_typo'"):
        read_run(tmp_path / "q")
    r["arms"]["offload"]["epp"] = "missing.yaml"
    f.write_text(yaml.safe_dump(r))
    with pytest.raises(StudyError, match="arm 'offload': its epp file missing.yaml"):
        read_run(tmp_path / "q")


def _reduced(run, n=3):
    cfg = OmegaConf.create({"kind": "llmd_tiered", "seed": 0, "engine": {"backend": "auto"},
                            "llmd_tiered": {"run": str(run), "max_requests_per_stage": n}})
    return run_in_memory(get("llmd_tiered"), cfg)


def test_reduced_run_offloads_only_where_the_arm_has_a_tier(tmp_path):
    d = tmp_path / "q"
    shutil.copytree(RUNS["qwen3-32b"], d)
    r = yaml.safe_load((d / "run.yaml").read_text())
    r["arms"]["offload"]["epp"] = "epp-baseline.yaml"  # the same router in both arms: only the tier differs
    r["gpu_cache_tokens"] = 16 * 2000  # a pool that cannot hold the 250 groups' prefixes
    (d / "run.yaml").write_text(yaml.safe_dump(r))
    ds = _reduced(d, n=6)
    assert float(ds.cpu_hit_rate_run.sel(arm="baseline")) == 0
    assert int(ds.cpu_blocks.sel(arm="baseline")) == 0 and int(ds.cpu_blocks.sel(arm="offload")) == 82000
    assert ds.gpu_blocks.values.tolist() == [2000, 2000]
    # the report's 5-QPS row sits on stage 0, its 15-QPS stage has no published figure
    assert float(ds.published_ttft_mean_s.sel(arm="offload", stage=0)) == 1.17
    assert np.isnan(float(ds.published_ttft_mean_s.sel(arm="offload", stage=2)))
    ok = np.isfinite(ds.ttft_mean_s.values)
    assert ok.all() and (ds.ttft_mean_s.values > 0.25).all()  # the 250 ms outside the pods, plus the prefill


def test_cpu_index_at_the_gpu_blocks_keeps_its_tokens():
    """gpt-oss's run: the router file's GPU producer hashes at the pods' 128-token blocks, its CPU producer at 64;
    refused as two hash configurations, or (run.yaml cpu_index_at_gpu_blocks) the CPU index at 128-token blocks
    with the same tokens of capacity: 41,000 x 64 = 20,500 x 128."""
    from cacheresearch.routers.epp import EppConfigError, epp_knobs, read_epp

    sp = read_epp(RUNS["gpt-oss-120b"] / "epp-offload.yaml")
    with pytest.raises(EppConfigError, match="hash differently"):
        epp_knobs(sp, block_tokens=128, capacity_blocks=1306)
    k = epp_knobs(sp, block_tokens=128, capacity_blocks=1306, second_index_at_first_blocks=True)
    assert (k["gie_cpu_lru_capacity"], k["gie_lru_capacity"], k["gie_cpu_w_pct"]) == (20_500, 1306, 100)
    assert read_run("gpt-oss-120b")[1]["cpu_index_at_gpu_blocks"] is True

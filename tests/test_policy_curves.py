"""experiment=policy_curves: a registered study (the pipeline's files), its miss ratios against the
object-stream oracles (tests/reference_blocks.py: libCacheSim's rules) fed each request's blocks
leaf-first, and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference_blocks import object_hits

from cacheresearch.shell.sweep import SweepError, run_experiment
from cacheresearch.workload.trace import load_mooncake

FIXTURE = Path(__file__).parent / "fixtures" / "mini_mooncake.jsonl"


def test_study_equals_the_oracles_and_writes_its_files(tmp_path):
    ds = run_experiment(["experiment=policy_curves", f"study.traces=[{FIXTURE}:512]", "study.points=3",
                         "study.max_requests=60"], tmp_path)
    assert (tmp_path / "results.nc").exists() and (tmp_path / "summary.txt").exists()
    w = load_mooncake(FIXTURE, block_tokens=512, max_requests=60)
    seq = [int(k) for r in range(w.n_requests) for k in w.keys[w.offsets[r]:w.offsets[r + 1]][::-1]]
    assert int(ds.block_accesses[0]) == len(seq)
    d = ds.isel(trace=0)
    for p in ds.policy.values:
        for k in range(ds.sizes["point"]):
            c = d.capacity[k]
            if np.isnan(c):
                continue
            miss = 1.0 - sum(object_hits(str(p), seq, int(c))) / len(seq)
            assert float(d.miss_ratio.sel(policy=p)[k]) == pytest.approx(miss, abs=1e-12), (p, int(c))
    fifo = d.miss_ratio.sel(policy="fifo")
    np.testing.assert_allclose(d.reduction_from_fifo.sel(policy="arc"), (fifo - d.miss_ratio.sel(policy="arc")) / fifo)
    assert "block accesses" in (tmp_path / "summary.txt").read_text()


def test_errors_name_the_key(tmp_path):
    with pytest.raises(SweepError, match="study.traces is required"):
        run_experiment(["experiment=policy_curves"], tmp_path)
    with pytest.raises(SweepError, match="study.policies"):
        run_experiment(["experiment=policy_curves", f"study.traces=[{FIXTURE}]", "study.policies=[lru2]"], tmp_path)
    with pytest.raises(SweepError, match="not found"):
        run_experiment(["experiment=policy_curves", "study.traces=[nowhere.jsonl:64]"], tmp_path)

"""Diagnostic studies: volatile-token position, cache-event recovery, block granularity (small runs)."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from cacheresearch.shell.sweep import run, write_outputs
from cacheresearch.studies.diagnostics import block_hits, token_lcp

FIX = Path(__file__).parent / "fixtures"
TINY = dict(n_tenants=3, system_tokens=64, doc_tokens=48, user_tokens=16, n_requests=120, block_tokens=16,
            rate_per_s=2.0, output_tokens=8)


def _cfg(kind, **study):
    return OmegaConf.create(dict(name=f"{kind}_small", kind=kind, seed=0, seeds=1, study=study))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=12))
def test_token_lcp_is_the_longest_common_prefix_with_an_earlier_prompt(prompts):
    got = token_lcp([np.asarray(p) for p in prompts])
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            k = 0
            while k < min(len(p), len(q)) and p[k] == q[k]:
                k += 1
            best = max(best, k)
        assert got[i] == best


def test_block_hits_round_down_and_cap():
    assert block_hits([0, 15, 16, 40, 40], [10, 40, 40, 40, 41], 16).tolist() == [0, 0, 16, 32, 32]
    assert block_hits([33], [34], 16).tolist() == [32] and block_hits([32], [32], 16).tolist() == [16]


def test_volatile_positions(tmp_path):
    ds = run(_cfg("volatile", fleet=TINY, routers=["round_robin"], replicas=1, capacity_blocks=10_000), write=False)
    h = ds.token_hit_rate.squeeze()
    assert float(h.sel(position="top")) == 0.0
    # after the system prompt only its 4 blocks can hit; at the end nothing is lost (the stamp is past the last
    # full block)
    assert 0 < float(h.sel(position="after_system")) < float(h.sel(position="after_documents"))
    assert float(h.sel(position="end")) == pytest.approx(float(h.sel(position="none")), abs=0.01)
    assert float(ds.usd_per_day.sel(position="top").squeeze()) > float(ds.usd_per_day.sel(position="none").squeeze())
    assert "after_system" in write_outputs(ds, tmp_path)


def test_event_recovery_curves():
    ds = run(_cfg("events", fleet=dict(TINY, n_requests=400), event_s=100.0, window_s=20.0, routers=["round_robin"],
                  replicas=2, capacity_blocks=10_000), write=False)
    m = ds.hit_rate_window_mean.squeeze()
    k = int(100 // 20)
    for e in ("version_upgrade", "replica_restart"):
        assert float(m.sel(event=e)[k]) < float(m.sel(event="none")[k])  # the window of the event drops
        assert np.allclose(m.sel(event=e)[:k], m.sel(event="none")[:k])  # nothing changes before it
        assert np.isfinite(float(ds.recovery_s.sel(event=e).squeeze()))
    assert float(ds.recovery_s.sel(event="none").squeeze()) == 0.0


def test_granularity_table():
    ds = run(_cfg("granularity", block_sizes=[16, 32, 512], trace_path=str(FIX / "mini_mooncake.jsonl"),
                  workloads=dict(f=dict(kind="fleet", n_tenants=3, system_tokens=40, doc_tokens=24, user_tokens=8,
                                        n_requests=60))), write=False)
    f = ds.sel(workload="f")
    assert float(f.token_hit_rate_radix) >= float(f.token_hit_rate_blocks.sel(block_tokens=16)) >= float(
        f.token_hit_rate_blocks.sel(block_tokens=32)) >= float(f.token_hit_rate_blocks.sel(block_tokens=512)) == 0
    t = ds.sel(workload="mooncake_trace")
    assert np.isnan(float(t.token_hit_rate_radix)) and np.isnan(float(t.token_hit_rate_blocks.sel(block_tokens=16)))
    assert 0 <= float(t.lost_upper_bound_share.sel(block_tokens=512)) < 1
    # the trace's 512-block hit equals the potential hits of an unbounded cache (capped at input - 1)
    from cacheresearch.analysis.changepoint import potential_hits
    from cacheresearch.workload.trace import load_trace

    w = load_trace(FIX / "mini_mooncake.jsonl")
    want = block_hits(potential_hits(w), w.input_tokens, 512).sum() / w.input_tokens.sum()
    assert float(t.token_hit_rate_blocks.sel(block_tokens=512)) == pytest.approx(want)

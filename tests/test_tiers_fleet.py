"""Tiers in the fleet's own grid (cacheresearch/tiers/fleet.py, the sweep's ``tiers.*`` and
``grid.cpu_capacity_blocks``): a cell with no lower tier run on the tiered engine gives the fcfs engine's metrics
field for field; a tiered cell's metrics are its per-request results summed the engine's way (and equal to the
reference's); the main grid with a cpu tier runs and says what each tier served; bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest
from reference_tiers import reference_tiers

from cacheresearch.core.run import simulate_cells
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.metrics.core import Metrics, combine_limbs
from cacheresearch.shell.sweep import SweepError, run_experiment
from cacheresearch.tiers import TierError
from cacheresearch.tiers.engine import _fixed, dense_keys, seed_bits
from cacheresearch.tiers.fleet import refusal, run_cells, tier_config_of
from cacheresearch.workload.synthetic import tenant_workload

#: the tiered engine does not track these (NaN / -1 / 0): prefix copies, overflow share, occupancy
UNTRACKED = {"prefix_copies", "overflow_share", "max_occupancy", "occupancy", "match", "copies_sum", "copies_n",
             "over_n", "over_q"}
ROUTERS = ["random", "least_loaded", "prefix_hash", "kubeai_chwbl", "sglang_cache_aware", "dynamo_kv",
           "llmd_precise", "preble", "llmd_approximate", "power_of_two"]


@pytest.fixture(scope="module")
def small():
    ws = [tenant_workload(n_tenants=12, prefix_tokens=800, query_tokens=100, output_tokens=30, hot_share=0.5,
                          rate_per_s=r, duration_s=60 / r * 4, block_tokens=16, seed=3) for r in (2.0, 20.0)]
    P, of = [], []
    for s in range(len(ws)):
        for cap, pol in ((60, "lru"), (400, "sieve"), (150, "s3fifo")):
            for r in ROUTERS:
                P.append(make_params(pol, capacity_blocks=cap, replicas=3, router=r, prefix_blocks=40,
                                     latency="h100_8b"))
                of.append(s)
    return ws, np.asarray(of), P, np.arange(len(P)) % 4


def test_untiered_cells_equal_the_fcfs_engine(small):
    ws, of, P, seeds = small
    m, _ = simulate_cells([compile_stream(w, block_ids=True) for w in ws], of, P, seeds, max_replicas=3,
                          per_request=True, queue_slots=512)
    C = [tier_config_of(p, block_bytes=2**21) for p in P]
    mt, by_tier, written = run_cells(ws, of, P, seeds, C, max_replicas=3)
    assert int(np.asarray(m.queue_overflow).max()) == 0  # the tiered engine's queues are unbounded
    for f in Metrics._fields:
        if f in UNTRACKED:
            continue
        a, b = np.asarray(getattr(m, f)), np.asarray(getattr(mt, f))
        assert a.shape == b.shape, f
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f
    assert np.array_equal(by_tier[:, 0], combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
    assert not by_tier[:, 1:].any() and not written.any()


def test_tiered_cells_sum_their_requests_and_equal_the_reference(small):
    ws, of, P, seeds = small
    tiers = {"cpu": {"capacity_blocks": 300, "read_gbps": 2.0}, "pool": {"capacity_blocks": 500}}
    C = [tier_config_of(p, tiers=tiers, block_bytes=2**21) for p in P]
    mt, by_tier, written = run_cells(ws, of, P, seeds, C, max_replicas=3)
    w = ws[1]
    n, inp = w.n_requests, w.input_tokens.astype(np.int64)
    for g in np.flatnonzero(of == 1)[::5]:
        b0 = seed_bits(int(seeds[g]), n).astype(np.int64)
        fixed = _fixed(w, C[g], b0) if C[g].router in ("random", "prefix_hash") else None
        ref = reference_tiers(w, C[g], fixed_route=fixed, bits0=b0)
        assert np.array_equal(np.asarray(mt.replica[g, :n]), ref["replica"])
        assert np.array_equal(np.asarray(mt.ttft_ms[g, :n]), ref["ttft_ms"])
        assert np.array_equal(np.asarray(mt.hit_tokens[g, :n]), ref["hit_tokens"])
        assert mt.token_hit_rate[g] == ref["hit_tokens"].sum() / inp.sum()
        assert by_tier[g].sum() == ref["hit_tokens"].sum()
        srt = np.sort(ref["ttft_ms"])
        assert int(mt.ttft_p99_ms[g]) == int(srt[(99 * n + 99) // 100 - 1])
    assert by_tier[:, 1].sum() > 0 and by_tier[:, 2].sum() > 0 and written[:, 1].sum() > 0
    # the lower tiers only add hits, cell by cell
    m0, _, _ = run_cells(ws, of, P, seeds, [tier_config_of(p, block_bytes=2**21) for p in P], max_replicas=3)
    assert (np.asarray(mt.token_hit_rate) >= np.asarray(m0.token_hit_rate) - 1e-12).all()


@pytest.mark.parametrize("router, policy, knobs, key", [
    ("gie", "lru", {}, "fleet.router"),
    ("random", "ttl_refresh", {}, "cache.policy"),
    ("llmd_precise", "lru", {"instances": 2}, "fleet.knobs.instances"),
    ("dynamo_kv", "lru", {"temperature": 0.5}, "fleet.knobs.temperature"),
])
def test_refusals_are_one_line(router, policy, knobs, key):
    p = make_params(policy, capacity_blocks=10, ttl_s=1.0, replicas=2, router=router, **knobs)
    why = refusal(p)
    assert why is not None and why.startswith(key) and "\n" not in why
    with pytest.raises(TierError, match=key):
        tier_config_of(p, block_bytes=1)
    assert refusal(make_params("lru", capacity_blocks=10, replicas=2, router="random"), "vllm") is None
    assert refusal(make_params("sieve", capacity_blocks=10, replicas=2, router="random"), "vllm").startswith(
        "cache.policy")


SMALL_GRID = ["workload.tenant.n_tenants=10", "workload.tenant.prefix_tokens=800", "workload.tenant.n_requests=120",
              "grid.rate_per_s=[8]", "grid.capacity_blocks=[100]", "grid.layout=[stable]",
              "grid.router=[random,prefix_hash,llmd_precise]"]


def test_main_grid_with_a_cpu_tier(tmp_path):
    ds = run_experiment(SMALL_GRID + ["grid.cpu_capacity_blocks=[0,400]", "tiers.cpu.read_gbps=10"], tmp_path)
    assert "cpu_capacity_blocks" in ds.dims and list(ds.tier.values) == ["gpu", "cpu", "pool", "disk"]
    by = ds.hit_rate_by_tier
    assert np.allclose(by.sum("tier"), ds.token_hit_rate)
    assert (by.sel(cpu_capacity_blocks=0, tier="cpu") == 0).all()
    assert float(by.sel(cpu_capacity_blocks=400, tier="cpu", router="random").max()) > 0
    assert (ds.token_hit_rate.sel(cpu_capacity_blocks=400) >= ds.token_hit_rate.sel(cpu_capacity_blocks=0)).all()
    # the untiered cells are the main engine's own run
    base = run_experiment(SMALL_GRID, tmp_path / "base")
    for v in ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "load_imbalance"):
        assert np.array_equal(ds[v].sel(cpu_capacity_blocks=0).values, base[v].values), v
    assert (tmp_path / "summary.txt").read_text()


@pytest.mark.parametrize("overrides, key", [
    (["tiers.cpu.capacity_blocks=100", "tiers.cpu.read_gbps=0"], "tiers.cpu.read_gbps"),
    (["tiers.cpu.capacity_blocks=100", "tiers.cpu.policy=ttl_refresh"], "tiers.cpu.policy"),
    (["tiers.pool.capacity_blocks=100000000000"], "tiers.pool.capacity_blocks"),
    (["tiers.cpu.capacity_blocks=100", "grid.router=[gie]"], "fleet.router"),
    (["tiers.pool.capacity_blocks=100", "replica=vllm"], "tiers.pool.capacity_blocks"),
    (["tiers.cpu.capacity_blocks=100", "replica=vllm", "engine.backend=jax"], "engine.backend=jax"),
    (["tiers.cpu.capacity_blocks=100", "replica=vllm", "cache.policy=sieve"], "cache.policy"),
    (["grid.cpu_capacity_blocks=[0,-5]"], "grid.cpu_capacity_blocks"),
    (["tiers.cpu.capacity_blocks=100", "tiers.offload=sideways"], "tiers.offload"),
])
def test_bad_tier_input_is_one_line(overrides, key, tmp_path):
    with pytest.raises(SweepError) as e:
        run_experiment(SMALL_GRID + overrides, tmp_path)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_dense_keys_number_blocks_by_first_appearance():
    w = tenant_workload(n_tenants=3, prefix_tokens=64, query_tokens=16, output_tokens=1, rate_per_s=5.0,
                        duration_s=2.0, block_tokens=16, seed=0)
    ids, K = dense_keys(w)
    first = np.unique(ids, return_index=True)[1]
    assert K == np.unique(w.keys).size and np.all(np.diff(first) > 0)
    # the same blocks share an id, different blocks do not
    assert np.array_equal(ids[:, None] == ids[None, :], w.keys.reshape(-1)[:, None] == w.keys.reshape(-1)[None, :])


def test_main_grid_with_a_cpu_tier_on_the_vllm_replica(tmp_path):
    """replica=vllm: the tiered cells run on the numba vllm backend (tiers/vllm.py, equal to the reference in
    test_tiers_vllm.py); the cpu tier only adds hits and says what it served."""
    ds = run_experiment(SMALL_GRID + ["replica=vllm", "grid.cpu_capacity_blocks=[0,400]"], tmp_path)
    by = ds.hit_rate_by_tier
    assert np.allclose(by.sum("tier"), ds.token_hit_rate)
    assert (by.sel(tier=["pool", "disk"]) == 0).all() and (by.sel(cpu_capacity_blocks=0, tier="cpu") == 0).all()
    assert float(by.sel(cpu_capacity_blocks=400, tier="cpu").min()) > 0
    assert (ds.tier_written_blocks.sel(cpu_capacity_blocks=400, tier="cpu") > 0).all()
    assert (ds.token_hit_rate.sel(cpu_capacity_blocks=400) > ds.token_hit_rate.sel(cpu_capacity_blocks=0)).all()
    assert "KV tiers: input tokens served by each tier" in (tmp_path / "summary.txt").read_text()

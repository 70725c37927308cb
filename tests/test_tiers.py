"""KV tiers (cacheresearch.tiers): the numba engine equals the plain-Python reference request by request;
with every lower tier at capacity 0 it is the existing engine bit for bit; hand-worked cases; bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_tiers import reference_tiers
from test_engine import HYP, tree_workloads

from cacheresearch.core.run import simulate_cells
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.tiers import TIER_POLICIES, TIER_VIEWS, TierError, make_config, run_tiers, tier_block_bytes
from cacheresearch.tiers.engine import _fixed, all_bits, seed_bits
from cacheresearch.workload import Workload
from cacheresearch.workload.synthetic import tenant_workload

FIXED = ("random", "round_robin", "prefix_hash")
FIELDS = ("replica", "hit_blocks", "hit_tokens", "hit_tier", "ttft_ms", "load_ms")


def reference(w, cfg, seed):
    b0 = seed_bits(seed, w.n_requests).astype(np.int64) if cfg.replicas > 1 else np.zeros(w.n_requests, np.int64)
    fixed = _fixed(w, cfg, b0) if cfg.router in FIXED else None
    bits = all_bits(seed, w.n_requests) if cfg.router == "power_of_two" and cfg.replicas > 1 else None
    return reference_tiers(w, cfg, fixed_route=fixed, bits0=b0, bits=bits)


def assert_equal_to_reference(w, cfgs, seeds):
    got = run_tiers(w, cfgs, seeds)
    for g, cfg in enumerate(cfgs):
        ref = reference(w, cfg, seeds[g])
        for f in FIELDS:
            np.testing.assert_array_equal(getattr(got[g], f), ref[f], err_msg=f"{f} of {cfg}")
        np.testing.assert_array_equal(got[g].written_blocks, ref["written_blocks"])


TIER = st.fixed_dictionaries(dict(capacity_blocks=st.sampled_from([0, 0, 1, 3, 8, 30]),
                                  policy=st.sampled_from(list(TIER_POLICIES)),
                                  read_gbps=st.sampled_from([0.5, 3.0, 50.0]),
                                  latency_us=st.sampled_from([0.0, 10.0, 2000.0])))
CONFIG = st.fixed_dictionaries(dict(
    gpu_blocks=st.integers(0, 40), cpu=TIER, pool=TIER, disk=TIER, replicas=st.integers(1, 3),
    router=st.sampled_from(["random", "round_robin", "prefix_hash", "least_loaded", "tier_scorer", "tier_kv_cost",
                            "tier_cache_aware", "tier_preble", "chwbl", "power_of_two"]),
    preble_abs=st.sampled_from([0, 8]), vnodes=st.sampled_from([1, 3, 100]),
    balance_abs=st.sampled_from([0, 1, 64]),
    offload=st.sampled_from(["evict", "write_through"]), load_mode=st.sampled_from(["serial", "overlap"]),
    prefill_tps=st.sampled_from([500, 20_000]), prefix_blocks=st.integers(1, 4),
    tier_weights_pct=st.tuples(*[st.integers(0, 150)] * 4), gpu_policy=st.sampled_from(list(TIER_POLICIES)),
    view=st.sampled_from(list(TIER_VIEWS)), stale_lag_ms=st.sampled_from([0, 300, 5000]),
    index_capacity=st.sampled_from([1, 4, 2**31 - 1])))


def build(c):
    c = dict(c)
    tiers = {k: c.pop(k) for k in ("cpu", "pool", "disk")}
    return make_config(tiers=tiers, block_bytes=131_072 * 16, decode_us_per_token=250, **c)


@settings(HYP, max_examples=40)
@given(w=tree_workloads(), cfgs=st.lists(CONFIG, min_size=1, max_size=3), seed=st.integers(0, 3))
def test_engine_equals_reference(w, cfgs, seed):
    cfgs = [build(c) for c in cfgs]
    assert_equal_to_reference(w, cfgs, [seed + g for g in range(len(cfgs))])


def tenants(seed=1, **kw):
    args = dict(n_tenants=6, prefix_tokens=160, query_tokens=40, rate_per_s=5.0, duration_s=8.0, block_tokens=16,
                output_tokens=20, seed=seed)
    args.update(kw)
    return tenant_workload(**args)


def test_engine_equals_reference_on_tenants():
    """A denser workload than hypothesis draws: every router, both offload modes, lower tiers full."""
    w = tenants()
    cfgs = [make_config(gpu_blocks=20, tiers=dict(cpu=dict(capacity_blocks=15),
                                                  pool=dict(capacity_blocks=30, policy="fifo"),
                                                  disk=dict(capacity_blocks=25)),
                        replicas=3, router=r, offload=o, load_mode=m, block_bytes=131_072 * 16, prefill_tps=2000)
            for r in ("random", "prefix_hash", "least_loaded", "tier_scorer", "tier_kv_cost", "tier_cache_aware",
                      "tier_preble", "chwbl", "power_of_two")
            for o, m in (("evict", "serial"), ("write_through", "overlap"))]
    assert_equal_to_reference(w, cfgs, [3] * len(cfgs))


@pytest.mark.parametrize("router", ["random", "round_robin", "prefix_hash", "least_loaded", "weighted_scorers",
                                    "kv_cost", "cache_aware", "preble_e2", "chwbl", "power_of_two"])
def test_untiered_is_the_existing_engine_bitwise(router):
    """Every lower tier at capacity 0: replica, hit blocks and TTFT are the fcfs engine's, request by request
    (tier_scorer / tier_kv_cost with weights (100, x, x, x) are weighted_scorers / kv_cost on the precise view)."""
    w = tenants(seed=2, rate_per_s=8.0)
    extra = dict(prefix_weight_pct=200, load_weight_pct=100) if router == "weighted_scorers" else {}
    if router == "kv_cost":
        extra = dict(overlap_weight_pct=150)
    if router == "cache_aware":
        extra = dict(balance_abs=1, cache_threshold_pm=200)
    if router == "preble_e2":
        extra = dict(preble_abs=1)
    if router == "chwbl":
        extra = dict(chwbl_c_pct=110, vnodes=7)
    P, C = [], []
    for cap, R in ((20, 3), (0, 2), (500, 1)):
        P.append(make_params("lru", capacity_blocks=cap, replicas=R, router=router, prefix_blocks=5, prefill_tps=2000,
                             decode_us_per_token=250, **extra))
        tr = {"weighted_scorers": "tier_scorer", "kv_cost": "tier_kv_cost", "cache_aware": "tier_cache_aware",
              "preble_e2": "tier_preble"}.get(router, router)
        C.append(make_config(gpu_blocks=cap, replicas=R, router=tr,
                             prefix_blocks=5, prefill_tps=2000, decode_us_per_token=250,
                             tier_weights_pct=(100, 7, 9, 11), **extra))
    m, _ = simulate_cells([compile_stream(w)], np.zeros(len(P), np.int64), P, np.full(len(P), 3), max_replicas=3,
                          per_request=True)
    got = run_tiers(w, C, [3] * len(C))
    n = w.n_requests
    for g in range(len(P)):
        for f in ("replica", "hit_blocks", "ttft_ms"):
            np.testing.assert_array_equal(getattr(got[g], f), np.asarray(getattr(m, f))[g, :n], err_msg=f)


def tiny(requests, arrivals, bt=16, out=0):
    """A workload of explicit key lists (input tokens = blocks x bt)."""
    keys = np.concatenate([np.asarray(r, np.uint64) for r in requests]) if requests else np.zeros(0, np.uint64)
    off = np.concatenate([[0], np.cumsum([len(r) for r in requests])])
    n = len(requests)
    return Workload(arrival_ms=np.asarray(arrivals), input_tokens=np.asarray([len(r) * bt for r in requests]),
                    output_tokens=np.full(n, out), tenant=np.zeros(n), keys=keys, offsets=off, block_tokens=bt)


def test_hand_worked_offload_promotion_and_timing():
    """gpu 2 blocks, cpu 4. A = [1, 2, 3] leaves gpu {1, 2} (3 offloaded to cpu); B = [7, 8] evicts 2, 1 to cpu;
    A again: gpu misses, cpu holds 1, 2, 3: 3 blocks hit in cpu, promoted; time by hand."""
    w = tiny([[1, 2, 3], [7, 8], [1, 2, 3]], [0, 10_000, 20_000])
    bb = 1_000_000  # bytes per block: 3 blocks at 1 GB/s = 3 ms, + 500 us latency -> 3.5 ms -> 4 ms
    cfg = make_config(gpu_blocks=2, tiers=dict(cpu=dict(capacity_blocks=4, read_gbps=1.0, latency_us=500.0)),
                      block_bytes=bb, prefill_tps=1000, decode_us_per_token=0)
    r = run_tiers(w, [cfg])[0]
    assert r.hit_tier.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 3, 0, 0]]
    assert r.load_ms.tolist() == [0, 0, 4]
    # hit tokens = min(3 x 16, 48) = 48: no prefill left; TTFT = the load
    assert r.ttft_ms.tolist() == [48, 32, 4]
    # offloads: 3 (after A), 2 and 1 (after B), 8, 7 and 3 (after the promotion), cpu then drops 2
    assert r.written_blocks.tolist() == [0, 6, 0, 0]
    ref = reference_tiers(w, cfg)
    assert ref["final_gpu"] == [[2, 1]] and ref["final_lower"]["cpu"] == [[1, 8, 7, 3]]  # least recent first
    # overlap: the load runs while the request would wait; idle replica -> TTFT is the same here
    r2 = run_tiers(w, [cfg.with_(load_mode="overlap")])[0]
    assert r2.ttft_ms.tolist() == [48, 32, 4]


def test_pool_holds_one_copy_of_a_block_two_replicas_write():
    """Two replicas (round robin) compute the same prefix under write-through: the pool holds each block once;
    a third request on replica 0 finds it in its gpu, a fourth on replica 1 in its gpu; with a gpu of 0 blocks
    both find the pool."""
    w = tiny([[1, 2], [1, 2], [1, 2], [1, 2]], [0, 1, 1000, 1001])
    cfg = make_config(gpu_blocks=0, replicas=2, router="round_robin", offload="write_through",
                      tiers=dict(pool=dict(capacity_blocks=2)), block_bytes=1000)
    r = run_tiers(w, [cfg])[0]
    ref = reference_tiers(w, cfg, fixed_route=np.array([0, 1, 0, 1]))
    assert ref["final_lower"]["pool"] == [[2, 1]]  # one store, two blocks (capacity 2 suffices for both replicas)
    assert r.hit_tier[:, 2].tolist() == [0, 2, 2, 2]  # replica 1 reads what replica 0 wrote
    assert r.written_blocks.tolist() == [0, 0, 2, 0]  # only the first request computed anything


def test_lower_tiers_only_add_hits():
    """Leading-run hits with a cpu tier are at least the gpu-only hits, request by request on one replica."""
    w = tenants(seed=4)
    base = make_config(gpu_blocks=30, block_bytes=1000)
    cfgs = [base] + [make_config(gpu_blocks=30, tiers=dict(cpu=dict(capacity_blocks=c)), block_bytes=1000)
                     for c in (10, 100, 1000)]
    res = run_tiers(w, cfgs)
    tot = [int(r.hit_blocks.sum()) for r in res]
    assert tot == sorted(tot) and tot[-1] > tot[0]
    np.testing.assert_array_equal(res[0].hit_tier[:, 0], res[0].hit_blocks)


def test_block_bytes_from_the_model_preset():
    assert tier_block_bytes("llama3_8b", 16) == 2 * 32 * 8 * 128 * 2 * 16
    assert tier_block_bytes("llama3_70b", 64, "fp8") == 2 * 80 * 8 * 128 * 64


@pytest.mark.parametrize("tiers,key", [
    (dict(cpu=dict(capacity_blocks=10, read_gbps=0.0)), "tiers.cpu.read_gbps"),
    (dict(disk=dict(capacity_blocks=10, write_gbps=0)), "tiers.disk.write_gbps"),
    (dict(cpu=dict(capacity_blocks=10, policy="ttl_refresh")), "tiers.cpu.policy"),
    (dict(pool=dict(capacity_blocks=10**9)), "tiers.pool.capacity_blocks"),
    (dict(cpu=dict(capacity_blocks=10, speed=3)), "tiers.cpu.speed"),
    (dict(ssd=dict(capacity_blocks=10)), "tiers.ssd"),
    (dict(cpu=dict(capacity_blocks=-1)), "tiers.cpu.capacity_blocks"),
])
def test_bad_input_is_one_line_naming_the_key(tiers, key):
    with pytest.raises(TierError) as e:
        make_config(gpu_blocks=10, tiers=tiers, model="llama3_8b", block_tokens=16)
    msg = str(e.value)
    assert msg.startswith(key) and "\n" not in msg, msg


def test_bad_modes_and_router():
    with pytest.raises(TierError, match=r"^tiers\.offload"):
        make_config(gpu_blocks=1, offload="lazy")
    with pytest.raises(TierError, match=r"^tiers\.load_mode"):
        make_config(gpu_blocks=1, load_mode="never")
    with pytest.raises(TierError, match=r"^router"):
        make_config(gpu_blocks=1, router="kv_cost")


# ------------------------------------------------------------------------------ experiment=tiers
FIXTURE_AGENT = Path(__file__).resolve().parent / "fixtures" / "mini_agent.jsonl"
SMALL = ["experiment=tiers", f"study.trace.path={FIXTURE_AGENT}", "study.gpu_blocks=60",
         "study.design.n_tenants=12", "study.design.prefix_tokens=640", "study.design.n_requests=150",
         "study.design.rate_per_s=4.0", "study.design.replicas=3", "study.agent.replicas=2",
         "grid.cpu_capacity_blocks=[0,1.0,200]", "grid.cpu_gbps=[2.0,50.0]", "grid.router=[random,tier_scorer]"]


@pytest.fixture(scope="module")
def small_tiers():
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415

    cfg = compose_config(SMALL)
    return cfg, run_study(cfg)


def test_tiers_study_dataset(small_tiers):
    from cacheresearch.studies import plot, summarize  # noqa: PLC0415

    _, ds = small_tiers
    for v in ("token_hit_rate", "hit_rate_by_tier", "ttft_p50_s", "ttft_p99_s"):
        assert v in ds
    assert ds.hit_rate_by_tier.dims[-1] == "tier" and list(ds.tier.values) == ["gpu", "cpu", "pool", "disk"]
    for v in ds.data_vars:
        assert ds[v].attrs.get("units") and ds[v].attrs.get("long_name"), v
    assert ds.cpu_capacity_blocks.sel(workload="design").values.tolist() == [0, 60, 200]
    np.testing.assert_allclose(ds.hit_rate_by_tier.sum("tier"), ds.token_hit_rate, rtol=1e-12)
    # no cpu tier: nothing from it; bandwidth does not change hits under a load-free router
    assert float(ds.hit_rate_by_tier.sel(cpu_capacity="0", tier="cpu").max()) == 0.0
    r = ds.token_hit_rate.sel(router="random")
    np.testing.assert_array_equal(r.sel(cpu_gbps=2.0), r.sel(cpu_gbps=50.0))
    assert "net $/day" in summarize(ds) and "global-pool" in summarize(ds)
    assert plot(ds) is not None


def test_tiers_study_cell_equals_reference(small_tiers):
    """One cell of the dataset recomputed by the plain-Python reference on the same workload and tiers."""
    from cacheresearch.studies.base import study_cfg  # noqa: PLC0415
    from cacheresearch.studies.tiers import DEFAULTS, tier_workload  # noqa: PLC0415

    cfg, ds = small_tiers
    c = study_cfg(cfg, DEFAULTS)
    for name, router in (("agent", "random"), ("design", "tier_scorer")):
        w, R = tier_workload(name, c)
        bt = int(w.block_tokens)
        cell = make_config(gpu_blocks=60, replicas=R, router=router, block_bytes=tier_block_bytes("llama3_8b", bt),
                           tiers=dict(cpu=dict(capacity_blocks=200, read_gbps=2.0, write_gbps=2.0)),
                           prefix_blocks=640 // 16 if name == "design" else 1)
        ref = reference(w, cell, 0)
        got = ds.sel(workload=name, router=router, cpu_capacity="200", cpu_gbps=2.0)
        assert float(got.token_hit_rate) == pytest.approx(ref["hit_tokens"].sum() / w.input_tokens.sum(), rel=1e-12)
        s = np.sort(ref["ttft_ms"])
        assert float(got.ttft_p50_s) == s[-(-50 * len(s) // 100) - 1] / 1000


@pytest.mark.parametrize("override,key", [
    ("grid.cpu_gbps=[0.0]", "grid.cpu_gbps"),
    ("grid.cpu_capacity_blocks=[-1]", "grid.cpu_capacity_blocks"),
    ("study.trace.path=/nonexistent/trace.jsonl", "study.trace.path"),
    ("grid.cpu_capacity_blocks=[100000000]", "tiers.cpu.capacity_blocks"),
    ("study.gpu_policy=ttl_refresh", "study.gpu_policy"),
    ("study.cpu_policy=lfu_perfect", "study.cpu_policy"),
    ("study.view=gie_estimate", "study.view"),
])
def test_tiers_study_bad_input_names_the_key(override, key):
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415
    from cacheresearch.studies.base import StudyError  # noqa: PLC0415

    cfg = compose_config(SMALL + ["study.workloads=[design]" if "trace" not in override else "study.workloads=[agent]",
                                  override])
    with pytest.raises(StudyError) as e:
        run_study(cfg)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_tiers_study_policies_and_views(small_tiers):
    """study.gpu_policy / cpu_policy / view reach every cell: one cell recomputed by the reference with s3fifo
    on the gpu, sieve on the cpu and the approximate view; a different policy changes the results."""
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415
    from cacheresearch.studies.base import study_cfg  # noqa: PLC0415
    from cacheresearch.studies.tiers import DEFAULTS, tier_workload  # noqa: PLC0415

    over = SMALL + ["study.workloads=[design]", "study.gpu_policy=s3fifo", "study.cpu_policy=sieve",
                    "study.view=approximate", "study.index_capacity=300"]
    cfg = compose_config(over)
    ds = run_study(cfg)
    c = study_cfg(cfg, DEFAULTS)
    w, R = tier_workload("design", c)
    cell = make_config(gpu_blocks=60, replicas=R, router="tier_scorer", block_bytes=tier_block_bytes("llama3_8b", 16),
                       tiers=dict(cpu=dict(capacity_blocks=200, read_gbps=2.0, write_gbps=2.0, policy="sieve")),
                       prefix_blocks=640 // 16, gpu_policy="s3fifo", view="approximate", index_capacity=300)
    ref = reference(w, cell, 0)
    got = ds.sel(workload="design", router="tier_scorer", cpu_capacity="200", cpu_gbps=2.0)
    assert float(got.token_hit_rate) == pytest.approx(ref["hit_tokens"].sum() / w.input_tokens.sum(), rel=1e-12)
    base = small_tiers[1].sel(workload="design")
    assert not np.array_equal(ds.sel(workload="design").hit_rate_by_tier.values, base.hit_rate_by_tier.values)
    assert ds.attrs["gpu_policy"] == "s3fifo" and ds.attrs["view"] == "approximate"


def test_tiers_study_extra_lower_tiers(small_tiers):
    """study.lower puts a disk tier behind every grid cell: hits only grow, the disk serves some, and the
    offloaded bytes are reported against the cpu write bandwidth."""
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415

    _, base = small_tiers
    ds = run_study(compose_config(SMALL + ["study.workloads=[agent]", "study.lower={disk: {capacity_blocks: 5000}}"]))
    a = base.sel(workload="agent")
    d = ds.sel(workload="agent")
    assert (d.token_hit_rate.values >= a.token_hit_rate.values - 1e-12).all()
    assert float(d.hit_rate_by_tier.sel(tier="disk").max()) > 0
    assert float(a.cpu_write_utilisation.sel(cpu_capacity="0").max()) == 0.0
    assert float(a.cpu_write_utilisation.max()) > 0

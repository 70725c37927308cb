"""The engine's routers, router views, instances and queue model against the plain-Python reference.

Every router (with randomised knobs), every view and router-instance setting, on random prefix-tree
workloads with random arrival gaps and output lengths: the engine and ``tests/reference_fleet.py``
make the same routing decision for every request, see the same per-replica matches, and give the same
hits and TTFTs (integers, exactly).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fleet import reference_fleet
from test_engine import HYP, L_MAX, N_MAX, R_MAX, padded_stream, tree_workloads

from cacheresearch.core.simulate import simulate, simulate_grid  # the JAX scan
from cacheresearch.engine import compile_stream, make_params, request_bits, stack_params
from cacheresearch.routers import CACHE_ROUTERS, PRESETS, REGISTRY
from cacheresearch.workload import Workload

#: the routers with a JAX rule (a router with state has a numba rule only: tests/test_router_state.py)
JAX_ROUTERS = tuple(r.name for r in REGISTRY.routers() if r.rule is not None)
OPTS = dict(max_replicas=R_MAX, max_instances=3, queue_slots=N_MAX + 1, match=True, index=True, stale=True,
            routers_compiled=JAX_ROUTERS)  # one program for every test here


def with_outputs(w: Workload, outputs, spread: int) -> Workload:
    """The same requests with output lengths and arrivals stretched by ``spread`` (queues vary)."""
    return Workload(
        arrival_ms=w.arrival_ms * spread, input_tokens=w.input_tokens, output_tokens=np.asarray(outputs, np.int64),
        tenant=w.tenant, keys=w.keys, offsets=w.offsets, block_tokens=w.block_tokens, name=w.name, meta=w.meta,
    )


knob_sets = st.fixed_dictionaries(
    dict(
        view=st.sampled_from(["precise", "approximate", "stale"]),
        stale_lag_ms=st.integers(0, 60),
        instances=st.integers(1, 3),
        local_load=st.booleans(),
        index_capacity=st.one_of(st.integers(0, 12), st.just(2**31 - 1)),
        vnodes=st.integers(1, 8),
        chwbl_c_pct=st.integers(100, 200),
        cache_threshold_pm=st.integers(0, 1000),
        balance_abs=st.integers(0, 4),
        balance_rel_pct=st.integers(0, 300),
        miss_smallest_tree=st.booleans(),
        overlap_weight_pct=st.integers(0, 300),
        temperature=st.sampled_from([0.0, 0.0, 0.3, 2.0]),
        prefix_weight_pct=st.integers(0, 300),
        load_weight_pct=st.integers(0, 300),
        queue_threshold=st.integers(1, 6),
        preble_rel_pct=st.integers(0, 300),
        preble_abs=st.integers(0, 3),
        prefill_tps=st.sampled_from([50, 300, 1000, 100_000]),
        decode_us_per_token=st.sampled_from([0, 100, 3000]),
        prefix_blocks=st.integers(1, 6),
        kv_pressure=st.booleans(),
    )
)


def engine_and_reference(w, policy, kw, replicas, router, seed, chunk_runs=4):
    stream = padded_stream(w, chunk_runs)
    cap = dict(capacity_blocks=kw.pop("capacity")) if policy in ("lru", "lru_plain") else {}
    ttl = dict(ttl_s=kw.pop("ttl_ms") / 1000) if policy in ("ttl_refresh", "ttl_fixed") else {}
    kw.pop("capacity", None), kw.pop("ttl_ms", None)
    p = make_params(policy, replicas=replicas, router=router, **cap, **ttl, **kw)
    key = jax.random.key(seed)
    m = simulate(stream, p, key, per_request=True, **OPTS)
    bits = np.asarray(request_bits(key, stream.arrival_ms.shape[0]))[: w.n_requests]
    ref = reference_fleet(w, policy=policy, replicas=replicas, router=router, bits=bits, **cap, **ttl, **kw)
    return m, ref


def assert_fleet_equal(w, m, ref, ctx):
    n = w.n_requests
    R = ref["match"].shape[1] if ref["match"].ndim == 2 else 1
    for name in ("replica", "hit_blocks", "hit_tokens", "ttft_ms"):
        np.testing.assert_array_equal(np.asarray(getattr(m, name))[:n], ref[name], err_msg=f"{name} {ctx}")
    np.testing.assert_array_equal(np.asarray(m.match)[:n, :R], ref["match"], err_msg=f"match {ctx}")
    for name in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"):
        assert int(getattr(m, name)) == int(ref[name]), (name, ctx)
    np.testing.assert_array_equal(np.asarray(m.busy_ms)[:R], ref["busy_ms"], err_msg=f"busy_ms {ctx}")
    for name in ("prefix_copies", "overflow_share", "load_imbalance", "ttft_mean_ms"):
        assert math.isclose(float(getattr(m, name)), float(ref[name]), rel_tol=1e-5, abs_tol=1e-6), (name, ctx)
    np.testing.assert_allclose(np.asarray(m.utilisation)[:R], ref["utilisation"], rtol=1e-5, err_msg=ctx)
    assert int(m.queue_overflow) == 0 and not bool(m.time_overflow)


@settings(HYP, max_examples=60)
@given(
    w=tree_workloads(),
    data=st.data(),
    router=st.sampled_from(sorted(JAX_ROUTERS)),
    knobs=knob_sets,
    replicas=st.integers(1, R_MAX),
    seed=st.integers(0, 3),
)
def test_routers_match_reference(w, data, router, knobs, replicas, seed):
    outs = data.draw(st.lists(st.integers(0, 400), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, data.draw(st.sampled_from([1, 5, 40])))
    policy = data.draw(st.sampled_from(["lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded"]))
    kw = dict(knobs, capacity=data.draw(st.integers(0, 40)), ttl_ms=data.draw(st.integers(0, 80)))
    m, ref = engine_and_reference(w, policy, kw, replicas, router, seed)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))


def tenant_prefix_workload() -> Workload:
    """Four tenants' shared prefixes plus unique suffixes, arrivals 3 ms apart, outputs up to 200 tokens."""
    rng = np.random.default_rng(7)
    keys = []
    for i in range(N_MAX):
        t = int(rng.integers(0, 4))
        n = int(rng.integers(1, L_MAX // 2))
        keys.append([1000 * t + j + 1 for j in range(n // 2)] + [10**6 + 100 * i + j for j in range(n - n // 2)])
    return Workload.from_lists(keys, block_tokens=16, arrival_ms=np.arange(N_MAX) * 3,
                               output_tokens=rng.integers(0, 200, N_MAX))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_match_reference(preset):
    """Each named preset runs with its published defaults and agrees with the reference."""
    w = tenant_prefix_workload()
    pre = {k: v for k, v in PRESETS[preset].items() if k not in ("router", "source")}
    kw = dict(pre, prefill_tps=2000, decode_us_per_token=200, capacity=30)
    m, ref = engine_and_reference(w, "lru", dict(kw), 3, PRESETS[preset]["router"], 1)
    assert_fleet_equal(w, m, ref, preset)
    # the preset name itself resolves to the same parameters
    p = make_params("lru", 30, replicas=3, router=preset, prefill_tps=2000, decode_us_per_token=200)
    q = make_params("lru", 30, replicas=3, router=PRESETS[preset]["router"], **kw_without_capacity(kw))
    assert all(np.asarray(a) == np.asarray(b) for a, b in zip(p, q))


def kw_without_capacity(kw):
    return {k: v for k, v in kw.items() if k != "capacity"}


@HYP
@given(
    w=tree_workloads(),
    data=st.data(),
    c_pct=st.integers(100, 300),
    replicas=st.integers(1, R_MAX),
)
@pytest.mark.slow  # long; see README's slow checks
def test_chwbl_never_exceeds_bounded_load(w, data, c_pct, replicas):
    """Property (Mirrokni et al.): after every assignment no replica holds more than
    ceil(c * (in-flight + 1) / R) requests, where in-flight counts the requests before it."""
    outs = data.draw(st.lists(st.integers(0, 2000), min_size=w.n_requests, max_size=w.n_requests))
    w = with_outputs(w, outs, 1)
    stream = padded_stream(w, 8)
    p = make_params("lru", 10, replicas=replicas, router="chwbl", chwbl_c_pct=c_pct, vnodes=5, prefill_tps=100,
                    decode_us_per_token=1000)
    m = simulate(stream, p, jax.random.key(0), per_request=True, **OPTS)
    rep = np.asarray(m.replica)[: w.n_requests]
    ttft = np.asarray(m.ttft_ms)[: w.n_requests]
    # replay the FCFS queue from the engine's own decisions to get finish times
    busy = [0] * replicas
    fins: list[list[int]] = [[] for _ in range(replicas)]
    for i in range(w.n_requests):
        now = int(w.arrival_ms[i])
        loads = [sum(f > now for f in fins[r]) for r in range(replicas)]
        cap = -(-c_pct * (sum(loads) + 1) // (100 * replicas))
        r = int(rep[i])
        assert loads[r] + 1 <= cap, (i, loads, r, cap)
        # finish = start + prefill + decode; recover from the engine's TTFT and the decode share
        start = max(now, busy[r])
        pre = int(ttft[i]) - (start - now)
        dec = -(-int(w.output_tokens[i]) * 1000 // 1000)
        busy[r] = start + pre + dec
        fins[r].append(busy[r])


def test_grid_of_routers_is_one_program_and_equals_single_runs():
    rng = np.random.default_rng(3)
    keys = [[t * 100 + j for j in range(int(rng.integers(1, 12)))] for t in rng.integers(0, 5, 20)]
    keys = [k + [10**6 + 50 * i + j for j in range(3)] for i, k in enumerate(keys)]
    w = Workload.from_lists(keys, block_tokens=16, arrival_ms=np.arange(20) * 4,
                            output_tokens=rng.integers(0, 100, 20))
    stream = compile_stream(w, chunk_runs=4)
    names = sorted(JAX_ROUTERS) + ["llmd_approximate", "sglang_cache_aware"]
    ps = [make_params("lru", 20, replicas=3, router=r, prefill_tps=3000, decode_us_per_token=100) for r in names]
    keys_ = jax.random.split(jax.random.key(5), len(ps))
    g = simulate_grid(stream, stack_params(ps), keys_, per_request=True, **OPTS)
    for i, p in enumerate(ps):
        one = simulate(stream, p, keys_[i], per_request=True, **OPTS)
        for f in ("replica", "hit_blocks", "ttft_ms", "busy_ms", "ttft_p99_ms"):
            np.testing.assert_array_equal(np.asarray(getattr(g, f))[i], np.asarray(getattr(one, f)),
                                          err_msg=f"{names[i]} {f}")


def test_static_options_are_checked():
    w = Workload.from_lists([[1, 2], [1, 3]], block_tokens=4)
    s = compile_stream(w)
    with pytest.raises(ValueError, match="match=True"):
        simulate(s, make_params("lru", 4, router="kv_cost"), jax.random.key(0), match=False)
    with pytest.raises(ValueError, match="index=True"):
        simulate(s, make_params("lru", 4, router="llmd_approximate"), jax.random.key(0), index=False)
    with pytest.raises(ValueError, match="stale=True"):
        simulate(s, make_params("lru", 4, router="kv_cost", view="stale"), jax.random.key(0), stale=False)
    with pytest.raises(ValueError, match="max_instances"):
        simulate(s, make_params("lru", 4, router="least_loaded", instances=3), jax.random.key(0), max_instances=2)
    with pytest.raises(ValueError, match="chwbl_c_pct"):
        make_params("lru", 4, router="chwbl", chwbl_c_pct=90)
    with pytest.raises(ValueError, match="unknown router or latency knob"):
        make_params("lru", 4, router="chwbl", c=1.25)
    with pytest.raises(ValueError, match="prefill_tps"):
        make_params("lru", 4, prefill_tps=0)
    with pytest.raises(ValueError, match="unknown router view"):
        make_params("lru", 4, router="kv_cost", view="psychic")


def test_queue_overflow_is_reported():
    """More in-flight requests than queue slots: counted, never silent."""
    w = Workload.from_lists([[i + 1] for i in range(10)], block_tokens=16, arrival_ms=np.zeros(10, np.int64))
    s = compile_stream(w)
    p = make_params("lru", 4, router="least_loaded", prefill_tps=16)
    m = simulate(s, p, jax.random.key(0), queue_slots=4)
    assert int(m.queue_overflow) > 0
    m = simulate(s, p, jax.random.key(0), queue_slots=16)
    assert int(m.queue_overflow) == 0
    assert list(np.asarray(m.ttft_ms)) == [1000 * (i + 1) for i in range(10)]


def test_singleton_keys_need_no_state():
    """Keys that occur once carry no state (the stream is small) yet occupy capacity exactly; blocks
    that always travel together are one run (the shared head is one stateful run of 3 blocks, each
    request's unique tail one singleton run of 5)."""
    shared = [1, 2, 3]
    keys = [shared + [100 + 10 * i + j for j in range(5)] for i in range(30)]
    w = Workload.from_lists(keys, block_tokens=4)
    s = compile_stream(w)
    assert s.n_keys == 1 and np.asarray(s.run_len).tolist() == [3]
    assert np.asarray(s.n_runs)[:30].tolist() == [2] * 30
    for cap in (0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 20):
        m = simulate(s, make_params("lru", cap), jax.random.key(0))
        from reference import reference_simulate

        ref = reference_simulate(w, policy="lru", capacity_blocks=cap)
        np.testing.assert_array_equal(np.asarray(m.hit_blocks), ref["hit_blocks"])
        assert int(m.occupancy[0]) == len(ref["final_contents"][0])


@settings(HYP, max_examples=40)
@given(
    w=tree_workloads(),
    data=st.data(),
    router=st.sampled_from(list(CACHE_ROUTERS)),
    knobs=knob_sets,
    replicas=st.integers(2, R_MAX),
)
def test_stale_and_approximate_views_match_reference(w, data, router, knobs, replicas):
    """The views, on their own: small lags and small indexes, so syncs and index evictions happen often."""
    w = with_outputs(w, [0] * w.n_requests, data.draw(st.sampled_from([1, 3])))
    knobs = dict(knobs, view=data.draw(st.sampled_from(["stale", "approximate"])),
                 stale_lag_ms=data.draw(st.integers(0, 8)),
                 index_capacity=data.draw(st.integers(0, 10)), temperature=0.0)
    policy = data.draw(st.sampled_from(["lru", "lru_plain", "ttl_refresh"]))
    kw = dict(knobs, capacity=data.draw(st.integers(0, 20)), ttl_ms=data.draw(st.integers(0, 20)))
    m, ref = engine_and_reference(w, policy, kw, replicas, router, 0)
    assert_fleet_equal(w, m, ref, (router, policy, knobs, replicas))


@pytest.mark.parametrize("router", ["least_loaded", "power_of_two", "chwbl", "preble_e2", "kv_cost"])
def test_a_request_finishing_at_an_arrival_is_no_longer_in_flight(router):
    """Finish times are exclusive: arrivals placed exactly on finish times (16 ms of prefill each)."""
    rng = np.random.default_rng(11)
    for trial in range(4):
        n = 20
        arrivals = np.cumsum(rng.choice([0, 16, 32], size=n)) - 0
        keys = [[int(k)] for k in rng.integers(1, 6, size=n)]
        w = Workload.from_lists(keys, block_tokens=16, arrival_ms=arrivals, output_tokens=np.zeros(n, np.int64))
        kw = dict(prefill_tps=1000, decode_us_per_token=0, capacity=0)
        m, ref = engine_and_reference(w, "lru", kw, 3, router, trial)
        assert_fleet_equal(w, m, ref, (router, trial))


@pytest.mark.slow  # long; see README's slow checks
def test_queue_off_gives_the_same_hits_and_refuses_load_routers():
    rng = np.random.default_rng(2)
    keys = [[t * 100 + j for j in range(int(rng.integers(1, 9)))] for t in rng.integers(0, 4, 30)]
    w = Workload.from_lists(keys, block_tokens=16, arrival_ms=np.arange(30) * 2)
    s = compile_stream(w, chunk_runs=4)
    for router in ("random", "prefix_hash", "round_robin"):
        p = make_params("lru", 12, replicas=3, router=router)
        on = simulate(s, p, jax.random.key(1), max_replicas=3)
        off = simulate(s, p, jax.random.key(1), max_replicas=3, queue=False)
        for f in ("hit_blocks", "replica", "occupancy", "max_occupancy"):
            np.testing.assert_array_equal(np.asarray(getattr(on, f)), np.asarray(getattr(off, f)))
        assert int(off.ttft_p99_ms) == -1 and np.isnan(float(off.ttft_mean_ms))
    with pytest.raises(ValueError, match="queue=True"):
        simulate(s, make_params("lru", 12, replicas=3, router="least_loaded"), jax.random.key(0), max_replicas=3,
                 queue=False)

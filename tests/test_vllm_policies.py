"""The vllm pool's free-block order under every policy it takes (backends/numba_vllm.py): the numba engine
equals the plain-Python reference (tests/reference_batch.py with tests/reference_vllm.py's pools) request
by request on hypothesis workloads; lru on the per-block path equals the run path bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch
from reference_vllm import POOL_ORACLES

from cacheresearch.backends.capabilities import pool_policies
from cacheresearch.cache.policies import block_policies
from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import finalize
from cacheresearch.workload.synthetic import tenant_workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

_PER_REQUEST = ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica")
#: every per-block policy the pool takes (from the registry and each kernel's pool rules): each needs a pool oracle
BLOCK = tuple(p for p in pool_policies() if p in block_policies())
POLICIES = ("lru", "ttl_refresh", *BLOCK)


def test_every_pool_policy_has_an_oracle():
    assert set(BLOCK) <= set(POOL_ORACLES), sorted(set(BLOCK) - set(POOL_ORACLES))


def _workload(seed, out, n_tenants=4, rate=30, dur=2):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=200, query_tokens=40, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _params(policy, cap, ttl_ms=200, **kn):
    if policy == "ttl_refresh":  # a TTL on the vllm pool keeps the pool's capacity (GPU memory)
        return make_params(policy, ttl_s=ttl_ms / 1000, **kn)._replace(capacity=np.int32(cap))
    return make_params(policy, capacity_blocks=cap, **kn)


def _run(s, ps, keys, *, R, S=6, Q=64, blocks=()):
    p0 = ps[0]
    st_ = static_options(p0, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))), index=int(p0.view) == 1,
                         stale=int(p0.view) == 2, blocks=blocks)
    return finalize(nv.run_stream(s, ps, keys, st_), st_)


def _pool_knobs(p):
    return dict(small=int(p.s3fifo_small), ghost=int(p.s3fifo_ghost), promote=int(p.s3fifo_promote))


def _compare(w, policy, *, R, router, cap, ttl_ms=200, S=6, Q=64, seed=0, **kn):
    s = compile_stream(w, stateful_singletons=True)
    p = _params(policy, cap, ttl_ms, replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    m = _run(s, [p], [key], R=R, S=S, Q=Q, blocks=(policy,) if policy in BLOCK else ())
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    ref = reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, capacity_blocks=cap,
                          policy=policy, ttl_ms=ttl_ms, pool_knobs=_pool_knobs(p), **k)
    for f in _PER_REQUEST:
        a, b = np.asarray(getattr(m, f))[0], np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (policy, f, bad[:10], a[bad[:10]], b[bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped"):
        assert int(np.asarray(getattr(m, f))[0]) == ref[f], (policy, f)
    assert np.asarray(m.occupancy)[0][:R].tolist() == ref["cached"], (policy, "occupancy")
    assert not bool(np.asarray(m.time_overflow)[0])
    return m, ref


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(40, 200), budget=st.sampled_from([16, 48, 200, 4096]),
       seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40), policy=st.sampled_from(POLICIES),
       ttl=st.sampled_from([0, 30, 150, 2000]),
       router=st.sampled_from(["round_robin", "random", "llmd_precise", "cache_aware", "least_loaded", "preble"]))
def test_pool_policies_equal_reference(seed, cap, budget, seqs, R, out, policy, ttl, router):
    _compare(_workload(seed, out), policy, R=R, router=router, cap=cap, ttl_ms=ttl, max_num_batched_tokens=budget,
             max_num_seqs=seqs)


@pytest.mark.parametrize("policy", BLOCK)
@pytest.mark.parametrize("view", ["approximate", "stale"])
def test_per_block_policies_with_views(policy, view):
    kn = dict(index_capacity=60) if view == "approximate" else dict(stale_lag_ms=300)
    _compare(_workload(7, 12, rate=60), policy, R=3, router="llmd_precise" if view == "stale" else "llmd_approximate",
             cap=70, view=view, max_num_batched_tokens=64, **kn)


def test_policies_differ_and_evict_under_pressure():
    """A pool under pressure: the policies evict different blocks, so the hits differ (the test can fail)."""
    w = _workload(3, 8, n_tenants=8, rate=60)
    hits = {p: int(_compare(w, p, R=1, router="round_robin", cap=60, ttl_ms=50)[1]["hit_blocks"].sum())
            for p in POLICIES}
    assert len(set(hits.values())) >= 3, hits


def test_lru_on_blocks_equals_lru_on_runs():
    """The per-block path with vLLM's own order would give the run path's results: fifo's and lru's agree
    with the reference, and a mixed call returns each configuration's own metrics in order."""
    w = _workload(11, 10, rate=50)
    s = compile_stream(w, stateful_singletons=True)
    ps = [_params(p, 80, replicas=2, router="cache_aware") for p in ("lru", "s3fifo", "ttl_refresh", "fifo")]
    keys = [jax.random.key(1)] * 4
    mixed = _run(s, ps, keys, R=2, blocks=("s3fifo",))
    for g, p in enumerate(ps):
        one = _run(s, [p], [keys[g]], R=2)
        for f in one._fields:
            np.testing.assert_array_equal(np.asarray(getattr(mixed, f))[g], np.asarray(getattr(one, f))[0], err_msg=f)


def test_small_s3fifo_queue_is_refused():
    w = _workload(1, 4)
    s = compile_stream(w, stateful_singletons=True)
    with pytest.raises(ValueError, match="s3fifo on the vllm pool needs a small queue"):
        _run(s, [_params("s3fifo", 15, router="round_robin")], [jax.random.key(0)], R=1, blocks=("s3fifo",))


def test_jax_vllm_replica_refuses_the_numba_pool_orders():
    from cacheresearch.core.simulate import simulate

    w = _workload(2, 4)
    s = compile_stream(w, stateful_singletons=True)
    for policy in ("s3fifo", "ttl_refresh"):
        with pytest.raises(ValueError, match=r"on the JAX vllm replica: .*engine.backend=numba") as e:
            simulate(s, _params(policy, 80), jax.random.key(0), scheduler="vllm")
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("policy, why", [("arc", "ARC picks its victim"), ("ttl_fixed", "chunked prefill"),
                                         ("lru_plain", "tail first")])
def test_refused_pool_orders_name_the_reason(policy, why):
    from cacheresearch.core.simulate import check_bounds

    p = _params(policy, 80) if policy != "ttl_fixed" else make_params(policy, ttl_s=1)
    st_ = static_options(p, scheduler="vllm", max_running=6)
    with pytest.raises(ValueError, match=why) as e:
        check_bounds(p, 1, st_, backend="numba")
    assert "\n" not in str(e.value) and f"policy {policy!r} on the vllm replica" in str(e.value)


def test_sweep_keeps_the_pool_capacity_for_a_ttl_policy():
    from cacheresearch.shell.sweep import _params_of, compose_config

    cfg = compose_config(["experiment=routing", "replica=vllm"])
    cell = dict(policy="ttl_refresh", capacity_blocks=1234, ttl_s=300, replicas=8, router="least_loaded",
                prefix_blocks=None)
    assert int(_params_of(cell, cfg).capacity) == 1234
    assert int(_params_of(dict(cell, policy="unbounded"), cfg).capacity) == 2**31 - 1


def test_pool_policies_bench_takes_one_policy_without_a_grid(tmp_path, capsys):
    """benchmarks/vllm_pool_policies.py with cache.policy=NAME and no grid.policy (no policy axis in the
    dataset) prints that policy's row instead of failing on the missing axis."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("vllm_pool_policies", root / "benchmarks" / "vllm_pool_policies.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    trace = root / "tests" / "fixtures" / "mini_agent.jsonl"
    bench.main(str(tmp_path / "out"), ["experiment=replay", "replica=vllm", f"trace.path={trace}",
                                       "trace.block_tokens=64", "cache.policy=s3fifo", "cache.capacity_blocks=400",
                                       "launch=memory", "output.figure=false"])
    out = capsys.readouterr().out
    assert "0 of 1 configurations" in out
    assert any(line.startswith("| s3fifo |") for line in out.splitlines()), out

"""vLLM's hybrid KV cache manager in the vllm replica (numba backend, per-block mode): full-attention and
sliding-window groups of one pool (``kv_groups``, ``kv_window_groups``, ``kv_window``) equal the plain-Python
reference (``tests/reference_batch.py``, whose hit rule is ``hybrid_pool.hit_blocks``) request by request."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_batch import reference_batch

from cacheresearch.core.params import make_params, resolve_router
from cacheresearch.core.simulate import request_bits, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import finalize
from cacheresearch.workload.synthetic import tenant_workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

_PER_REQUEST = ("ttft_ms", "e2e_ms", "hit_blocks", "preempted", "replica")
#: layouts as (kv_groups, kv_window_groups): gpt-oss (window, full), full first, Gemma 3's shape (windows then full),
#: windows only, two full groups
LAYOUTS = [(2, 0b01), (2, 0b10), (4, 0b0111), (1, 0b1), (2, 0b11), (2, 0b00)]


def _workload(seed, out, n_tenants=4, rate=30, dur=2, prefix=200, query=40):
    return tenant_workload(n_tenants=n_tenants, prefix_tokens=prefix, query_tokens=query, users_per_tenant=2,
                           rate_per_s=rate, duration_s=dur, output_tokens=out, block_tokens=16, seed=seed)


def _run(w, *, R, router, S=6, Q=64, seed=0, **kn):
    """(the numba backend's Metrics of one configuration, the reference's dict)."""
    s = compile_stream(w, stateful_singletons=True)
    p = make_params("lru", replicas=R, router=router, **kn)
    key = jax.random.key(seed)
    st_ = static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    m = finalize(nv.run_stream(s, [p], [key], st_), st_)
    m = type(m)(*(np.asarray(x)[0] for x in m))
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    k = resolve_router(router, **{n: v for n, v in kn.items() if n in ("index_capacity", "view", "instances")})
    k.update(kn)
    rule = k.pop("router")
    ref = reference_batch(w, replicas=R, router=rule, bits=bits, max_running=S, queue_slots=Q, **k)
    return m, ref


def _compare(w, **kw):
    m, ref = _run(w, **kw)
    for f in _PER_REQUEST:
        a, b = np.asarray(getattr(m, f)), np.asarray(ref[f])
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (f, bad[:10], a[bad[:10]], b[bad[:10]])
    for f in ("preemptions", "steps", "events", "dropped"):
        assert int(getattr(m, f)) == ref[f], (f, int(getattr(m, f)), ref[f])
    R = kw["R"]
    assert list(np.asarray(m.max_occupancy)[:R]) == ref["kv_max"]  # the pool's peak blocks in use
    assert list(np.asarray(m.occupancy)[:R]) == ref["cached"]  # cached block ids at the end, every group's
    return m, ref


_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(40, 260), budget=st.sampled_from([16, 48, 200, 4096]),
              seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(0, 40), layout=st.sampled_from(LAYOUTS),
              window=st.sampled_from([2, 5, 16, 17, 40, 128]),
              router=st.sampled_from(["round_robin", "random", "llmd_precise", "cache_aware", "least_loaded"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_hybrid_equals_reference_hypothesis(seed, cap, budget, seqs, R, out, layout, window, router):
    """Shared prefixes, pools small enough to evict and preempt, windows below, at and above a block, 1-3 replicas."""
    ng, wm = layout
    _compare(_workload(seed, out), R=R, router=router, capacity_blocks=cap, max_num_batched_tokens=budget,
             max_num_seqs=seqs, kv_groups=ng, kv_window_groups=wm, kv_window=window if wm else 0)

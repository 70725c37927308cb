"""The ``gie`` router against GIE's own formulas on hand-made pod states, and on the vllm replica
against its plain-Python reference request by request.

GIE's formulas are written here in floating point, from the GIE v0.5.1 / llm-d v0.2 sources as quoted in
the llm-d benchmark notes (queue: ``(max - q) / (max - min)``, all equal -> 1; kv-cache: ``1 - usage``;
estimated prefix: ``matched / total`` over the truncated prompt; precise: longest prefix, min-max over the
pods with a hit), not from the engine's fixed point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_fleet import route_one
from test_batch import S_BOUND, _check, _ref, _run, _workload

from cacheresearch import routers as rt
from cacheresearch.core.params import make_params


def gie_float_scores(*, m, q, used, cap, n, mode, W, w_prefix, w_kv, w_queue):
    """GIE's weighted total per pod, in float64."""
    qmax, qmin = max(q), min(q)
    qs = [1.0 if qmax == qmin else (qmax - x) / (qmax - qmin) for x in q]
    ks = [1.0 - u / cap for u in used]
    if mode == 1:
        total = min(n, W) if W else n
        ps = [min(x, total) / total if total else 0.0 for x in m]
    elif mode == 2:
        hits = {r: x for r, x in enumerate(m) if x > 0}
        lo, hi = (min(hits.values()), max(hits.values())) if hits else (0, 0)
        ps = [0.0 if r not in hits else (1.0 if hi == lo else (hits[r] - lo) / (hi - lo)) for r in range(len(m))]
    else:
        ps = [0.0] * len(m)
    return [w_prefix * p + w_kv * k + w_queue * s for p, k, s in zip(ps, ks, qs)]


RMAX = 8
_route = jax.jit(lambda req, fleet, p: rt.route(jnp.int32(rt.ROUTERS["gie"]), req, fleet, p))


def engine_pick(*, m, q, used, cap, n, mode, W, w_prefix, w_kv, w_queue, bits1=0):
    R = len(m)
    p = make_params("lru", capacity_blocks=cap, replicas=R, router="gie", gie_prefix_mode=mode, gie_window_blocks=W,
                    gie_prefix_w_pct=int(round(100 * w_prefix)), gie_kv_w_pct=int(round(100 * w_kv)),
                    gie_queue_w_pct=int(round(100 * w_queue)))
    req = rt.RequestView(index=jnp.int32(0), arrival_ms=jnp.int32(0), n_blocks=jnp.int32(n),
                         prefix_hi=jnp.uint32(0), prefix_lo=jnp.uint32(0),
                         bits=jnp.array([0, bits1, 0, 0], jnp.uint32), instance=jnp.int32(0))
    i32 = lambda v: jnp.array(list(v) + [0] * (RMAX - len(v)), jnp.int32)  # noqa: E731
    fleet = rt.FleetView(replicas=jnp.int32(R), match=i32(m), queue=i32(q), active_blocks=i32([]),
                         tree_size=i32([]), kv_used=i32(used))
    return int(_route(req, fleet, p))


# the benchmark's three arms: approximate 1/1/1 (estimate), precise 3/2/2, load queue 1 + kv 1
ARMS = {"approximate": dict(mode=1, W=40, w_prefix=1.0, w_kv=1.0, w_queue=1.0),
        "precise": dict(mode=2, W=0, w_prefix=3.0, w_kv=2.0, w_queue=2.0),
        "load": dict(mode=0, W=0, w_prefix=0.0, w_kv=1.0, w_queue=1.0)}


@pytest.mark.parametrize("arm", list(ARMS))
def test_pick_is_gies_argmax_on_random_pod_states(arm):
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(120):
        R = int(rng.integers(1, 9))
        n = int(rng.integers(0, 120))
        cap = int(rng.choice([4802, 19208, 100_000]))
        m = [int(rng.integers(0, n + 1)) if rng.random() < 0.6 else 0 for _ in range(R)]
        q = [int(rng.integers(0, rng.choice([1, 3, 60]))) for _ in range(R)]
        used = [int(rng.integers(0, cap + 1)) for _ in range(R)]
        kw = dict(m=m, q=q, used=used, cap=cap, n=n, **ARMS[arm])
        f = gie_float_scores(**kw)
        best = max(f)
        top = {r for r in range(R) if f[r] >= best - 1e-9}
        gap = min([best - x for x in f if best - x > 1e-9], default=1.0)
        if gap < 1e-3:  # the engine's 1/65536 fixed point may order near-ties differently
            continue
        got = engine_pick(**kw, bits1=int(rng.integers(0, 2**32)))
        assert got in top, (kw, f, got)
        checked += 1
    assert checked > 80


def test_queue_scorer_min_max_and_all_equal():
    # all queues equal: every pod scores 1 on the queue, so the kv scorer alone decides
    kw = dict(m=[0, 0, 0], cap=100, n=10, mode=0, W=0, w_prefix=0, w_kv=1.0, w_queue=1.0)
    assert engine_pick(q=[5, 5, 5], used=[50, 40, 60], **kw) == 1
    # a 0-vs-1 waiting difference is a full swing: it outweighs a 0.9 KV difference
    assert engine_pick(q=[1, 0, 1], used=[0, 90, 0], **kw) == 1
    # the precise arm (3/2/2): the full-hit pod keeps the request against a full queue and KV swing of 0.49
    kwp = dict(cap=100, n=10, **ARMS["precise"])
    assert engine_pick(m=[10, 0, 0], q=[1, 0, 0], used=[49, 0, 0], **kwp) == 0
    # ... and loses it when the KV swing passes 0.5 as well (3 < 2 + 2 * 0.51)
    assert engine_pick(m=[10, 0, 0], q=[1, 0, 0], used=[51, 0, 0], **kwp) in (1, 2)


def test_precise_min_max_over_hit_pods_and_estimate_window():
    kwp = dict(q=[0, 0, 0, 0], used=[0, 0, 0, 0], cap=100, n=20, mode=2, W=0, w_prefix=1.0, w_kv=0, w_queue=0)
    # hits 5 and 9: the 9-block pod scores 1, the 5-block pod 0 like the pods without a hit
    assert engine_pick(m=[5, 9, 0, 0], **kwp) == 1
    picks = {engine_pick(m=[5, 5, 0, 0], **kwp, bits1=b) for b in (0, 2**31 + 1)}
    assert picks == {0, 1}  # equal hits: both score 1, tie broken at random
    # estimate: a 4-block window makes a 4-block and a 15-block match equal
    kwe = dict(q=[0, 0, 0], used=[0, 0, 0], cap=100, n=20, mode=1, W=4, w_prefix=1.0, w_kv=0, w_queue=0)
    assert {engine_pick(m=[4, 15, 1], **kwe, bits1=b) for b in (0, 2**31 + 1)} == {0, 1}


def test_load_aware_scorer():
    kn = dict(gie_prefix_mode=0, gie_prefix_w_pct=0, gie_kv_w_pct=0, gie_queue_w_pct=0, gie_window_blocks=0,
              gie_load_w_pct=100, gie_load_threshold=128)
    kw = dict(i=0, n=4, prefix_key=0, bits=[0] * 4, R=3, match=[0] * 3, active_blocks=[0] * 3, tree_size=[0] * 3,
              ring=None, kn=kn)
    assert route_one("gie", queue=[3, 1, 200], **kw) == 1
    assert engine_pick_load(q=[3, 1, 200]) == 1
    # beyond the threshold every pod scores 0: a tie
    assert {engine_pick_load(q=[300, 200, 129], bits1=b) for b in (0, 2**31, 2**32 - 1)} == {0, 1, 2}


def engine_pick_load(q, bits1=0):
    R = len(q)
    p = make_params("lru", capacity_blocks=100, replicas=R, router="gie", gie_kv_w_pct=0, gie_queue_w_pct=0,
                    gie_prefix_w_pct=0, gie_load_w_pct=100, gie_load_threshold=128)
    req = rt.RequestView(index=jnp.int32(0), arrival_ms=jnp.int32(0), n_blocks=jnp.int32(4),
                         prefix_hi=jnp.uint32(0), prefix_lo=jnp.uint32(0),
                         bits=jnp.array([0, bits1, 0, 0], jnp.uint32), instance=jnp.int32(0))
    z = jnp.zeros(RMAX, jnp.int32)
    fleet = rt.FleetView(replicas=jnp.int32(R), match=z, queue=jnp.array(list(q) + [0] * (RMAX - R), jnp.int32),
                         active_blocks=z, tree_size=z, kv_used=z)
    return int(_route(req, fleet, p))


def test_ties_are_uniform_among_the_tied_pods():
    kw = dict(m=[0] * 5, q=[0, 3, 0, 0, 3], used=[0] * 5, cap=100, n=4, mode=0, W=0, w_prefix=0, w_kv=1.0,
              w_queue=1.0)
    counts = np.zeros(5, int)
    for b in range(0, 2**32, 2**32 // 300):
        counts[engine_pick(**kw, bits1=b)] += 1
    assert counts[1] == counts[4] == 0
    assert counts[[0, 2, 3]].min() >= 95  # 300 draws over three tied pods: each about a third


def test_oracle_agrees_with_float_formulas_on_hand_states():
    kn = dict(gie_prefix_mode=2, gie_prefix_w_pct=300, gie_kv_w_pct=200, gie_queue_w_pct=200, gie_window_blocks=0,
              gie_load_w_pct=0, gie_load_threshold=128)
    r = route_one("gie", i=0, n=12, prefix_key=0, bits=[0] * 4, R=3, match=[12, 6, 0], queue=[2, 0, 1],
                  active_blocks=[0, 0, 0], tree_size=[0] * 3, ring=None, kn=kn, kv_used=[10, 50, 0], capacity=100)
    f = gie_float_scores(m=[12, 6, 0], q=[2, 0, 1], used=[10, 50, 0], cap=100, n=12, **ARMS["precise"])
    assert r == int(np.argmax(f))


@pytest.mark.slow  # one case runs in the default suite inside test_batch.py, which shares its compiled program
@pytest.mark.parametrize("mode,view", [(2, "precise"), (1, "approximate"), (0, "precise")])
def test_vllm_replica_with_gie_equals_reference(mode, view):
    w = _workload(3, 4, 200, 40, 30, 2, 12)
    kn = dict(capacity_blocks=70, max_num_batched_tokens=64, max_num_seqs=4, gie_prefix_mode=mode,
              gie_window_blocks=5, gie_prefix_w_pct=300, gie_kv_w_pct=200, gie_queue_w_pct=200, view=view,
              index_capacity=40)
    m, bits = _run(w, R=3, router="gie", **kn)
    ref = _ref(w, R=3, router="gie", bits=bits, S=S_BOUND, Q=64, **kn)
    _check(w, m, ref)


def active_float_scores(c):
    """llm-d's active-request scorer (``pkg/plugins/scorer/active_request.go``) in float64: a pod with no
    request in flight scores 1, else ``(cmax - c) / cmax``."""
    cmax = max(c)
    return [1.0 if x == 0 or cmax == 0 else (cmax - x) / cmax for x in c]


def engine_pick_active(c, *, used=None, cap=100, w_active=1.0, w_kv=0.0, bits1=0):
    R = len(c)
    used = [0] * R if used is None else used
    p = make_params("lru", capacity_blocks=cap, replicas=R, router="gie", gie_prefix_w_pct=0, gie_queue_w_pct=0,
                    gie_kv_w_pct=int(round(100 * w_kv)), gie_active_w_pct=int(round(100 * w_active)))
    req = rt.RequestView(index=jnp.int32(0), arrival_ms=jnp.int32(0), n_blocks=jnp.int32(4),
                         prefix_hi=jnp.uint32(0), prefix_lo=jnp.uint32(0),
                         bits=jnp.array([0, bits1, 0, 0], jnp.uint32), instance=jnp.int32(0))
    i32 = lambda v: jnp.array(list(v) + [0] * (RMAX - len(v)), jnp.int32)  # noqa: E731
    # the queue (waiting requests) is set against the counts: the scorer must read active_req, not queue
    fleet = rt.FleetView(replicas=jnp.int32(R), match=i32([0] * R), queue=i32([max(c) - x for x in c]),
                         active_blocks=i32([]), tree_size=i32([]), kv_used=i32(used), active_req=i32(c))
    return int(_route(req, fleet, p))


def test_active_request_scorer_formula_on_hand_made_counts():
    # the fewest in flight wins; equal counts (also all zero: cmax = 0 -> every pod 1) are a uniform tie
    assert engine_pick_active([3, 1, 2]) == 1
    assert {engine_pick_active([0, 0, 0], bits1=b) for b in (0, 2**31, 2**32 - 1)} == {0, 1, 2}
    assert {engine_pick_active([4, 4, 9], bits1=b) for b in (0, 2**32 - 1)} == {0, 1}
    # the 37-capacity load arm, active 1 + kv-cache 1, against the float formulas on random states
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(150):
        R = int(rng.integers(1, 9))
        c = [int(rng.integers(0, rng.choice([2, 8, 300]))) for _ in range(R)]
        used = [int(rng.integers(0, 7210)) for _ in range(R)]
        f = [a + (1 - u / 7209) for a, u in zip(active_float_scores(c), used)]
        best = max(f)
        gap = min([best - x for x in f if best - x > 1e-9], default=1.0)
        if gap < 1e-3:
            continue
        got = engine_pick_active(c, used=used, cap=7209, w_kv=1.0, bits1=int(rng.integers(0, 2**32)))
        assert f[got] >= best - 1e-9, (c, used, f, got)
        # the plain-Python oracle picks the same pod
        kn = dict(gie_prefix_mode=0, gie_prefix_w_pct=0, gie_kv_w_pct=100, gie_queue_w_pct=0, gie_window_blocks=0,
                  gie_load_w_pct=0, gie_load_threshold=128, gie_active_w_pct=100)
        r = route_one("gie", i=0, n=4, prefix_key=0, bits=[0] * 4, R=R, match=[0] * R, queue=[0] * R,
                      active_blocks=[0] * R, tree_size=[0] * R, ring=None, kn=kn, kv_used=used, capacity=7209,
                      active_req=c)
        assert f[r] >= best - 1e-9
        checked += 1
    assert checked > 100

"""llm-d's CPU-tier prefix scorer in the ``gie`` router (``gie_cpu_w_pct``, ``gie_cpu_lru_capacity``): the
tiered-prefix-cache guide's second ``approx-prefix-cache-producer`` (its own LRU per pod, fed with the routed
request's hashes as the GPU one) read by a second ``prefix-cache-scorer`` (matched / total).

The numba vllm backend equals the plain-Python oracle (``reference_batch.py`` with a second
``reference_gie_index.GieIndexer``) request by request, and the JAX replica where it runs; weight 0 is today's
router bit for bit; the CPU index decides picks the GPU index has forgotten (so a kernel that does not feed it
fails here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_fleet import route_one
from reference_gie_index import GieIndexer
from test_numba_vllm import _compare, _numba, _workload
from test_tiers_vllm import _compare as tiers_compare
from test_tiers_vllm import _workload as tiers_workload

from cacheresearch import routers as rt
from cacheresearch.core.params import make_params
from cacheresearch.core.stream import compile_stream
from cacheresearch.tiers.vllm import cpu_tier
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys
from cacheresearch.workload.table import Workload

RMAX = 8
_route = jax.jit(lambda req, fleet, p: rt.route(jnp.int32(rt.ROUTERS["gie"]), req, fleet, p))


def _pick(*, m, mc, total, wp, wc, q=None, bits1=0):
    R = len(m)
    q = [0] * R if q is None else q
    p = make_params("lru", capacity_blocks=100, replicas=R, router="gie", view="gie_estimate", gie_prefix_mode=1,
                    gie_prefix_w_pct=wp, gie_kv_w_pct=0, gie_queue_w_pct=100, gie_cpu_w_pct=wc)
    req = rt.RequestView(index=jnp.int32(0), arrival_ms=jnp.int32(0), n_blocks=jnp.int32(4),
                         prefix_hi=jnp.uint32(0), prefix_lo=jnp.uint32(0),
                         bits=jnp.array([0, bits1, 0, 0], jnp.uint32), instance=jnp.int32(0))
    i32 = lambda v: jnp.array(list(v) + [0] * (RMAX - len(v)), jnp.int32)  # noqa: E731
    fleet = rt.FleetView(replicas=jnp.int32(R), match=i32(m), queue=i32(q), active_blocks=i32([]),
                         tree_size=i32([]), kv_used=i32([0] * R), match_total=jnp.int32(total), match_cpu=i32(mc))
    return int(_route(req, fleet, p))


def test_jax_rule_and_oracle_equal_the_float_formula():
    """``wp m / total + wc mc / total + queue`` on random pod states: the JAX rule and the oracle pick a pod of
    the float argmax (near-ties, which the 1/65536 fixed point may order differently, skipped)."""
    rng = np.random.default_rng(4)
    checked = 0
    for _ in range(80):
        R = int(rng.integers(1, 7))
        total = int(rng.integers(1, 40))
        m = [int(rng.integers(0, total + 1)) if rng.random() < 0.5 else 0 for _ in range(R)]
        mc = [max(x, int(rng.integers(0, total + 1))) if rng.random() < 0.7 else x for x in m]
        q = [int(rng.integers(0, 4)) for _ in range(R)]
        wp, wc = int(rng.choice([0, 100, 300])), int(rng.choice([100, 200]))
        qs = [1.0 if max(q) == min(q) else (max(q) - x) / (max(q) - min(q)) for x in q]
        f = [wp * a / total + wc * b / total + 100 * s for a, b, s in zip(m, mc, qs)]
        best = max(f)
        gap = min([best - x for x in f if best - x > 1e-9], default=1.0)
        if gap < 0.5:
            continue
        b1 = int(rng.integers(0, 2**32))
        got = _pick(m=m, mc=mc, total=total, wp=wp, wc=wc, q=q, bits1=b1)
        assert f[got] >= best - 1e-9, (m, mc, q, f, got)
        kn = dict(gie_prefix_mode=1, gie_prefix_w_pct=wp, gie_kv_w_pct=0, gie_queue_w_pct=100, gie_window_blocks=0,
                  gie_load_w_pct=0, gie_load_threshold=128, gie_cpu_w_pct=wc)
        ref = route_one("gie", i=0, n=4, prefix_key=0, bits=[0, b1, 0, 0], R=R, match=m, queue=q,
                        active_blocks=[0] * R, tree_size=[0] * R, ring=None, kn=kn, kv_used=[0] * R, capacity=100,
                        match_total=total, match_cpu=mc)
        assert ref == got
        checked += 1
    assert checked > 40


def test_cpu_weight_needs_the_gie_estimate_view_and_an_lru_of_a_request():
    with pytest.raises(ValueError, match="gie_cpu_w_pct"):
        make_params("lru", capacity_blocks=10, router="gie", view="precise", gie_cpu_w_pct=100)
    make_params("lru", capacity_blocks=10, router="gie", view="precise", gie_cpu_lru_capacity=5)  # weight 0: fine
    # an LRU smaller than one request's hashes is refused before the run (GIE's map would keep dropped hashes)
    from cacheresearch.core.simulate import simulate

    w = _workload(1, 5, rate=10)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=11)
    s = compile_stream(w, stateful_singletons=True, gie_hashes=g)
    p = make_params("lru", capacity_blocks=60, replicas=2, router="gie", view="gie_estimate", gie_cpu_w_pct=100,
                    gie_cpu_lru_capacity=3, max_num_seqs=4)
    with pytest.raises(ValueError, match="gie_cpu_lru_capacity below a request's"):
        simulate(s, p, jax.random.key(0), max_replicas=2, scheduler="vllm", max_running=6, queue_slots=64)


_CPU_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(40, 160), budget=st.sampled_from([48, 200, 4096]),
                  seqs=st.integers(1, 6), R=st.integers(1, 3), out=st.integers(1, 30), mode=st.integers(0, 1),
                  weights=st.tuples(*[st.sampled_from([0, 100, 200, 300]) for _ in range(3)]),
                  wc=st.sampled_from([100, 200, 300]), lru=st.sampled_from([12, 20, 40]),
                  clru=st.sampled_from([12, 30, 31_250]), refresh=st.sampled_from([0, 7]))


def _cpu_case(seed, cap, budget, seqs, R, out, mode, weights, wc, lru, clru, refresh, jax_too):
    w = _workload(seed, out, rate=40)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=11)
    kn = dict(capacity_blocks=cap, max_num_batched_tokens=budget, max_num_seqs=seqs, gie_prefix_mode=mode,
              gie_prefix_w_pct=weights[0], gie_kv_w_pct=weights[1], gie_queue_w_pct=weights[2], view="gie_estimate",
              gie_lru_capacity=lru, gie_cpu_w_pct=wc, gie_cpu_lru_capacity=clru, load_refresh_ms=refresh)
    return _compare(w, R=R, router="gie", gie_hashes=g, jax_too=jax_too, **kn)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CPU_CASES)
def test_cpu_scorer_equals_reference_hypothesis(**case):
    """numba == oracle request by request with the CPU-tier scorer on (every weight, both LRUs small enough to
    forget, or the CPU one larger than the GPU one). Each LRU holds at least one request's hashes (12 here): below
    that GIE's Go code leaves evicted hashes of the request being added in its hash -> pods map, which the engine's
    index (and the oracle's, tests/reference_gie_index.py) does not model."""
    _cpu_case(**case, jax_too=False)


def test_cpu_scorer_equals_reference_and_jax():
    """numba == oracle == JAX on one case (the JAX replica's compile: about a minute)."""
    _cpu_case(3, 80, 64, 4, 3, 20, 1, (100, 100, 100), 200, 12, 60, 0, jax_too=True)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CPU_CASES)
def test_cpu_scorer_equals_reference_and_jax_hypothesis_many(**case):
    _cpu_case(**case, jax_too=True)


def test_cpu_weight_zero_is_todays_router_bit_for_bit():
    """Weight 0: the CPU index's capacity changes nothing (its index is not even built)."""
    w = _workload(9, 20, rate=40)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=11)
    s = compile_stream(w, stateful_singletons=True, gie_hashes=g)
    out = []
    for clru in (31_250, 3):
        p = make_params("lru", capacity_blocks=70, replicas=3, router="gie", view="gie_estimate", gie_prefix_mode=1,
                        gie_lru_capacity=12, gie_cpu_lru_capacity=clru, max_num_batched_tokens=64, max_num_seqs=4)
        out.append(_numba(s, p, jax.random.key(0), R=3, S=6, Q=64))
    for f in ("ttft_ms", "e2e_ms", "hit_blocks", "replica"):
        np.testing.assert_array_equal(np.asarray(getattr(out[0], f)), np.asarray(getattr(out[1], f)), err_msg=f)


def _probe_workload(R_probe: int):
    """Prompt A first, then ``R_probe`` rounds of four prompts nobody repeats, then A again after each round:
    the GPU index (one prompt's hashes) has forgotten A by then, a large CPU index has not."""
    bt, rng = 16, np.random.default_rng(0)
    prompts = [[int(x) for x in rng.integers(1, 2**62, 6)] for _ in range(1 + 4 * R_probe)]
    order = [0]
    for k in range(R_probe):
        order += [1 + 4 * k + j for j in range(4)] + [0]
    keys, offs = [], [0]
    for j in order:
        keys += prompts[j]
        offs.append(len(keys))
    n = len(order)
    return Workload(arrival_ms=np.arange(n, dtype=np.int64) * 10_000, input_tokens=np.full(n, 6 * bt, np.int64),
                    output_tokens=np.ones(n, np.int64), tenant=np.zeros(n, np.int32),
                    keys=np.array(keys, np.uint64), offsets=np.array(offs, np.int64), block_tokens=bt), order


def test_the_cpu_index_routes_what_the_gpu_index_forgot():
    """Only the CPU scorer weighs (prefix, kv and queue weights 0): every repeat of prompt A goes to the pod that
    served A first, by the CPU index alone (its LRU holds every prompt; the GPU one a single prompt). Without
    the CPU index fed the repeats would be ties broken at random over four pods."""
    w, order = _probe_workload(6)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=6)
    s = compile_stream(w, stateful_singletons=True, gie_hashes=g)
    kn = dict(view="gie_estimate", gie_prefix_mode=1, gie_prefix_w_pct=0, gie_kv_w_pct=0, gie_queue_w_pct=0,
              gie_lru_capacity=int(max(g.n)), gie_cpu_w_pct=100, gie_cpu_lru_capacity=10_000,
              max_num_batched_tokens=4096, max_num_seqs=4)
    m = _numba(s, make_params("lru", capacity_blocks=200, replicas=4, router="gie", **kn), jax.random.key(1), R=4,
               S=6, Q=64)
    rep = np.asarray(m.replica)
    first = rep[0]
    repeats = [i for i, j in enumerate(order) if j == 0][1:]
    assert all(rep[i] == first for i in repeats), rep
    # the oracle's indexes: the GPU one has forgotten A at every repeat, the CPU one holds it
    gpu, cpu = GieIndexer(int(max(g.n))), GieIndexer(10_000)
    for i in range(len(order)):
        ids = [int(x) for x in g.ids[i][: g.n[i]]]
        if i in repeats:
            # h0 (the model's hash) is every prompt's: the GPU index holds no more of A than that anywhere
            assert max(gpu.match_longest_prefix(ids).values(), default=0) <= 1
            assert cpu.match_longest_prefix(ids).get(int(first)) == len(ids) > 1
        gpu.add(ids, int(rep[i]))
        cpu.add(ids, int(rep[i]))


# ------------------------------------------------------------------------------ the precise view over both tiers
_TIER_CASES = dict(seed=st.integers(0, 10_000), cap=st.integers(30, 120), cpu=st.integers(1, 120),
                   budget=st.sampled_from([48, 200, 4096]), seqs=st.integers(1, 6), R=st.integers(1, 3),
                   out=st.integers(1, 30), mode=st.integers(1, 2), tw=st.sampled_from([30, 80, 100, 150]),
                   overlap=st.sampled_from(["sync", "async"]))


def _tier_case(seed, cap, cpu, budget, seqs, R, out, mode, tw, overlap):
    tier = cpu_tier(capacity_blocks=cpu, read_gbps=4.0, latency_us=10.0, block_bytes=2**21, overlap=overlap)
    return tiers_compare(tiers_workload(seed, out), R=R, router="gie", tier=tier, capacity_blocks=cap,
                         max_num_batched_tokens=budget, max_num_seqs=seqs, view="precise", gie_prefix_mode=mode,
                         gie_prefix_w_pct=300, gie_kv_w_pct=100, gie_queue_w_pct=100, gie_cpu_tier_w_pct=tw)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_TIER_CASES)
def test_precise_view_over_both_tiers_equals_reference_hypothesis(**case):
    """llm-d's precise producer with the offloading tier's blocks (tier weight ``tw`` / 100, a block in both tiers
    weighing the larger): the numba vllm backend with a cpu tier equals the oracle request by request."""
    _tier_case(**case)


def test_precise_view_over_both_tiers_changes_the_picks():
    """The same run with the tier weight 80 and 0 (the cpu tier unseen, today's view) routes differently, each
    equal to the oracle: the weighted view is read."""
    a = _tier_case(11, 40, 100, 200, 4, 3, 20, 1, 80, "async")[3]
    b = _tier_case(11, 40, 100, 200, 4, 3, 20, 1, 0, "async")[3]
    assert np.asarray(a["replica"]).tolist() != np.asarray(b["replica"]).tolist()

"""The JAX engine against the plain-Python oracle (``tests/reference.py``), plus its own invariants.

* Hypothesis: random prefix-tree workloads x every policy / capacity / TTL / router / chunk width:
  per-request hits, replicas, totals and occupancy equal the reference exactly.
* Mooncake: the committed fixture (every policy, several configurations) and the shared synthetic
  trace (a quick check by default, the full sweep under ``-m slow``).
* jit vs ``jax.disable_jit``; ``simulate_grid`` (configurations, and stacked workloads) vs ``simulate``.
* Invariants: occupancy <= capacity, hit tokens <= input tokens, the LRU stack property in the
  capacity, unbounded >= every other policy; argument and workload errors.

Compiles are the expensive part: the hypothesis tests pad every stream to one template shape per chunk
width (via ``stack_streams``) and always use ``max_replicas=4``, so each test compiles a handful of
programs and then only runs them.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference_simulate

from cacheresearch.core.simulate import simulate, simulate_grid  # the JAX scan
from cacheresearch.core.stream import StreamShape, pad_stream
from cacheresearch.engine import combine_limbs, compile_stream, make_params, stack_params, stack_streams
from cacheresearch.workload import Workload, WorkloadError
from cacheresearch.workload.trace import load_mooncake

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mini_mooncake.jsonl"
SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
needs_shared = pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared Mooncake trace not present")

POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
LRU = ("lru", "lru_plain")
R_MAX = 4  # one static replica bound for the whole file: fewer compiles
N_MAX = 24  # hypothesis workloads: at most this many requests ...
L_MAX = 40  # ... of at most this many blocks


# ------------------------------------------------------------------------------------- helpers
def config_kwargs(policy, *, capacity=None, ttl_ms=None, replicas=1, router="round_robin", prefix_blocks=80):
    """Keyword arguments shared by ``make_params`` and ``reference_simulate``."""
    kw = dict(policy=policy, replicas=replicas, router=router, prefix_blocks=prefix_blocks)
    if policy in LRU:
        kw["capacity_blocks"] = capacity
    if policy in ("ttl_refresh", "ttl_fixed"):
        kw["ttl_s"] = ttl_ms / 1000
    return kw


def params_of(kw):
    return make_params(**kw)


def run_engine(stream, kw, seed=0, **opts):
    return simulate(stream, params_of(kw), jax.random.key(seed), max_replicas=R_MAX, **opts)


def run_reference(w, kw, metrics, debug=True):
    """The reference on the same configuration; a ``random`` router replays the engine's draws."""
    kw = dict(kw)
    if kw["router"] == "random":
        kw["replica_choices"] = np.asarray(metrics.replica)[: w.n_requests]
    return reference_simulate(w, debug=debug and kw["policy"] == "lru", **kw)


def assert_matches_reference(w, kw, m, ref=None, *, debug=True):
    """Every engine output that the reference defines equals it (rates to float tolerance)."""
    ref = run_reference(w, kw, m, debug=debug) if ref is None else ref
    N, R, policy = w.n_requests, kw["replicas"], kw["policy"]
    ctx = f"config {kw}"
    hb = np.asarray(m.hit_blocks)[:N]
    ht = np.asarray(m.hit_tokens)[:N]
    rep = np.asarray(m.replica)[:N]
    np.testing.assert_array_equal(rep, ref["replica"], err_msg=f"replica, {ctx}")
    np.testing.assert_array_equal(hb, ref["hit_blocks"], err_msg=f"hit_blocks, {ctx}")
    np.testing.assert_array_equal(ht, ref["hit_tokens"], err_msg=f"hit_tokens, {ctx}")
    assert np.all((rep >= 0) & (rep < R)), ctx
    assert np.all(ht <= w.input_tokens), ctx
    total = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
    assert total == int(ref["hit_tokens"].sum()), ctx
    assert float(m.token_hit_rate) == pytest.approx(ref["token_hit_rate"], abs=1e-6), ctx
    assert float(m.request_hit_rate) == pytest.approx(ref["request_hit_rate"], abs=1e-6), ctx
    assert int(m.requests_hit) == int(np.sum(ref["hit_blocks"] > 0)), ctx
    per_rep = np.asarray(m.requests_per_replica)
    np.testing.assert_array_equal(per_rep[:R], np.bincount(ref["replica"], minlength=R), err_msg=ctx)
    assert not per_rep[R:].any(), ctx
    max_occ, occ = np.asarray(m.max_occupancy), np.asarray(m.occupancy)
    assert not max_occ[R:].any() and not occ[R:].any(), ctx
    if policy in LRU:
        assert np.all(max_occ <= kw["capacity_blocks"]), ctx
        assert np.all(occ <= kw["capacity_blocks"]), ctx
    if policy in LRU + ("unbounded",):
        np.testing.assert_array_equal(max_occ[:R], ref["max_occupancy"], err_msg=f"max_occupancy, {ctx}")
        final = [len(c) for c in ref["final_contents"]]
        np.testing.assert_array_equal(occ[:R], final, err_msg=f"occupancy, {ctx}")
    else:
        # TTL policies: the engine keeps expired blocks stored (invisible to lookups), so its
        # occupancy is at least the reference's live count (see test_ttl_occupancy_counts_live_blocks)
        assert np.all(max_occ[:R] >= ref["max_occupancy"]), ctx
    return ref


RATES = ("token_hit_rate", "request_hit_rate", "ttft_mean_ms", "utilisation", "load_imbalance", "prefix_copies",
         "overflow_share")
PER_REQUEST = ("hit_blocks", "hit_tokens", "replica", "ttft_ms", "match")


def assert_same_metrics(got, want, ctx, n=None):
    """Two engine results agree: integers exactly, the float rates to float32 rounding.

    (A vmapped program may round a division differently from the scalar one: 1 ulp was seen.)
    """
    for name in want._fields:
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        if n is not None and name in PER_REQUEST:
            a, b = a[:n], b[:n]  # padded streams: only the first n rows are real requests
        if name in RATES:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=0, equal_nan=True, err_msg=f"{name}, {ctx}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{name}, {ctx}")


def key_of(node: int, salt: int) -> int:
    # an odd multiplier is a bijection mod 2**64: distinct nodes get distinct 64-bit keys
    return (node * 0x9E3779B97F4A7C15 + salt) & ((1 << 64) - 1)


# --------------------------------------------------------------------- hypothesis workloads
@st.composite
def tree_workloads(draw, max_requests=N_MAX, max_len=L_MAX):
    """Requests as walks in a random prefix tree: an existing node's path, cut, then fresh nodes.

    Keys are chained (each node has one parent and one 64-bit key), distinct within a request;
    arrivals are non-decreasing integers with ties; ``input_tokens`` lies in ``((n-1)*bt, n*bt]``,
    or ``[0, bt)`` for block-less requests.
    """
    bt = draw(st.sampled_from([1, 3, 16]))
    salt = draw(st.integers(0, (1 << 64) - 1))
    n_req = draw(st.integers(1, max_requests))
    nodes: list[tuple[int, ...]] = []  # path (root..node) of every node made so far
    keys, tokens, arrivals = [], [], []
    now = draw(st.integers(0, 5))
    for _ in range(n_req):
        base = draw(st.integers(-1, len(nodes) - 1))  # -1: start a fresh root (or an empty request)
        path = nodes[base] if base >= 0 else ()
        path = path[: draw(st.integers(0, len(path)))] if draw(st.booleans()) else path
        room = max_len - len(path)
        ext = draw(st.one_of(st.integers(0, min(3, room)), st.integers(0, room)))
        for _ in range(ext):
            path = path + (len(nodes),)
            nodes.append(path)
        n = len(path)
        keys.append([key_of(v, salt) for v in path])
        tokens.append(draw(st.integers(0, bt - 1)) if n == 0 else draw(st.integers((n - 1) * bt + 1, n * bt)))
        arrivals.append(now)
        now += draw(st.one_of(st.just(0), st.integers(0, 12)))
    return Workload.from_lists(
        keys, block_tokens=bt, arrival_ms=np.array(arrivals), input_tokens=np.array(tokens)
    )


def padded_stream(w: Workload, chunk_runs: int, n_requests: int = N_MAX, n_blocks: int = L_MAX, *,
                  stateful_singletons: bool = False, block_ids: bool = False):
    """``compile_stream`` padded to one template shape, so that many workloads reuse one program.

    The shape bounds every workload of ``n_requests`` requests of at most ``n_blocks`` blocks: each
    block its own run at worst, and at most half of them stateful (a stateful run occurs twice).
    Per-request outputs then have the template's length; the first ``w.n_requests`` are real.
    """
    assert w.n_requests <= n_requests and w.n_blocks.max(initial=0) <= n_blocks
    s = compile_stream(w, chunk_runs=chunk_runs, stateful_singletons=stateful_singletons, block_ids=block_ids)
    total = n_requests * n_blocks
    keys = total if stateful_singletons else max(total // 2, 1)  # singletons with state: every run at worst
    shape = StreamShape(steps=n_requests * -(-n_blocks // chunk_runs), width=chunk_runs, requests=n_requests + 1,
                        entries=total + 1, positions=total + 1, keys=keys, distinct=total if block_ids else 0)
    return jax.tree.map(jnp.asarray, pad_stream(s, shape))


def small_stream(w: Workload, chunk_runs: int = 32):
    """Hand-made cases: at most 8 requests of at most 8 blocks."""
    return padded_stream(w, chunk_runs, 8, 8)


routers = st.one_of(
    st.tuples(st.just("round_robin"), st.just(80)),
    st.tuples(st.just("random"), st.just(80)),
    st.tuples(st.just("prefix_hash"), st.integers(1, 5)),
)
chunk_widths = st.sampled_from([1, 3, 8, 32])
HYP = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@HYP
@given(
    w=tree_workloads(),
    capacity=st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, 12), st.integers(0, 80)),
    replicas=st.integers(1, R_MAX),
    router=routers,
    chunk_runs=chunk_widths,
    seed=st.integers(0, 3),
)
def test_hypothesis_lru_matches_reference(w, capacity, replicas, router, chunk_runs, seed):
    stream = padded_stream(w, chunk_runs)
    for policy in LRU:
        kw = config_kwargs(policy, capacity=capacity, replicas=replicas, router=router[0], prefix_blocks=router[1])
        assert_matches_reference(w, kw, run_engine(stream, kw, seed))


@HYP
@given(
    w=tree_workloads(),
    ttl_ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 30)),
    replicas=st.integers(1, R_MAX),
    router=routers,
    chunk_runs=chunk_widths,
    seed=st.integers(0, 3),
)
def test_hypothesis_ttl_and_unbounded_match_reference(w, ttl_ms, replicas, router, chunk_runs, seed):
    stream = padded_stream(w, chunk_runs)
    for policy in ("ttl_refresh", "ttl_fixed", "unbounded"):
        kw = config_kwargs(policy, ttl_ms=ttl_ms, replicas=replicas, router=router[0], prefix_blocks=router[1])
        assert_matches_reference(w, kw, run_engine(stream, kw, seed))


# ------------------------------------------------------------------- hand-made small cases
def wl(keys, *, block_tokens=4, arrival_ms=None, input_tokens=None):
    return Workload.from_lists(
        keys,
        block_tokens=block_tokens,
        arrival_ms=None if arrival_ms is None else np.array(arrival_ms),
        input_tokens=None if input_tokens is None else np.array(input_tokens),
    )


A, B, C, D, E, X = 1, 2, 3, 4, 5, 99


@pytest.mark.parametrize("chunk_runs", [1, 2, 32])
def test_small_lru_examples(chunk_runs):
    cases = [
        (wl([[A, B, C], [A, B, D]]), "lru", 3, [0, 2]),
        (wl([[A, B, C], [A, B, D], [E], [A, B, D]]), "lru", 3, [0, 2, 0, 2]),
        (wl([[A, B, C], [A, B, D], [E], [A, B, D]]), "lru_plain", 3, [0, 2, 0, 0]),
        (wl([[A, B, C, D, E], [A, B, C, D, E], [A, B, C]]), "lru", 3, [0, 3, 3]),
        (wl([[A, B, C, D, E], [A, B, C, D, E], [A, B, C]]), "lru_plain", 3, [0, 0, 0]),
        (wl([[A, B], [A, B], [A]]), "lru", 0, [0, 0, 0]),
        (wl([[A, B], [A, B], [A]]), "lru", 1, [0, 1, 1]),
    ]
    for w, policy, cap, expect in cases:
        kw = config_kwargs(policy, capacity=cap)
        m = run_engine(small_stream(w, chunk_runs), kw)
        assert np.asarray(m.hit_blocks)[: len(expect)].tolist() == expect, (policy, cap)
        assert_matches_reference(w, kw, m)


@pytest.mark.parametrize("policy", ["ttl_refresh", "ttl_fixed"])
def test_ttl_exact_boundary(policy):
    # ttl 10 ms: present while now - t <= 10. t=0 write; t=10 exactly at the boundary (hit, and
    # ttl_refresh refreshes to 10); t=20: refresh -> 10 ms old (hit), fixed -> 20 ms old (miss).
    # fixed rewrites at 20; t=30 is again exactly on the boundary for both; t=41 is past it.
    w = wl([[A, B], [A, B], [A, B], [A], [A], [A]], arrival_ms=[0, 10, 20, 30, 41, 41])
    kw = config_kwargs(policy, ttl_ms=10)
    m = run_engine(small_stream(w), kw)
    expect = {"ttl_refresh": [0, 2, 2, 1, 0, 1], "ttl_fixed": [0, 2, 0, 1, 0, 1]}[policy]
    assert np.asarray(m.hit_blocks)[: len(expect)].tolist() == expect
    assert_matches_reference(w, kw, m)
    # ttl 0: only same-millisecond reuse hits
    kw0 = config_kwargs(policy, ttl_ms=0)
    m0 = run_engine(small_stream(w), kw0)
    assert np.asarray(m0.hit_blocks)[:6].tolist() == [0, 0, 0, 0, 0, 1]
    assert_matches_reference(w, kw0, m0)


def test_partial_last_block_and_blockless_requests():
    # hit tokens are min(hit_blocks * bt, input_tokens); a 0-block request never hits
    w = wl([[A, B], [A, B], [], [A]], block_tokens=4, input_tokens=[6, 5, 3, 2])
    kw = config_kwargs("unbounded")
    m = run_engine(small_stream(w), kw)
    assert np.asarray(m.hit_tokens)[:4].tolist() == [0, 5, 0, 2]
    assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == 7
    assert float(m.token_hit_rate) == pytest.approx(7 / 16)
    assert float(m.request_hit_rate) == pytest.approx(2 / 4)
    assert_matches_reference(w, kw, m)


def test_ttl_occupancy_counts_stored_blocks():
    """TTL policies never evict: occupancy counts distinct blocks written on the replica, expired or
    not (lookups ignore expired ones). The reference reports live blocks instead, which is at most that.
    """
    w = wl([[A], [B], [C], [A]], arrival_ms=[0, 10, 20, 30])
    kw = config_kwargs("ttl_refresh", ttl_ms=5)
    m = run_engine(small_stream(w), kw)
    ref = reference_simulate(w, **kw)
    assert ref["max_occupancy"].tolist() == [1]
    assert np.asarray(m.max_occupancy)[0] == 3  # A, B, C stored; A rewritten, not added
    assert np.asarray(m.occupancy)[0] == 3
    assert np.asarray(m.hit_blocks)[:4].tolist() == [0, 0, 0, 0]  # padded stream: first 4 are real


# --------------------------------------------------------------------------------- Mooncake
@pytest.fixture(scope="module")
def mini():
    return load_mooncake(FIXTURE, block_tokens=512)


@pytest.fixture(scope="module")
def mini_stream(mini):
    return compile_stream(mini)


@pytest.fixture(scope="module")
def shared():
    if not SHARED_TRACE.exists():
        pytest.skip("shared Mooncake trace not present")
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    return w, compile_stream(w)


def policy_configs(policy, capacities, ttls_ms):
    caps = capacities if policy in LRU else [None]
    ttls = ttls_ms if policy in ("ttl_refresh", "ttl_fixed") else [None]
    routing = [
        (1, "round_robin", 80),
        (3, "round_robin", 80),
        (4, "prefix_hash", 1),
        (3, "prefix_hash", 4),
        (2, "random", 80),
    ]
    for cap in caps:
        for ttl in ttls:
            for replicas, router, k in routing:
                yield config_kwargs(policy, capacity=cap, ttl_ms=ttl, replicas=replicas, router=router, prefix_blocks=k)


@pytest.mark.parametrize("policy", POLICIES)
def test_mini_mooncake_matches_reference(mini, mini_stream, policy):
    for kw in policy_configs(policy, [0, 1, 16, 100, 1000], [0, 1000, 5000, 60000]):
        assert_matches_reference(mini, kw, run_engine(mini_stream, kw))


@pytest.mark.parametrize("chunk_runs", [1, 5])
def test_mini_mooncake_chunk_width_does_not_matter(mini, mini_stream, chunk_runs):
    s = compile_stream(mini, chunk_runs=chunk_runs)
    for kw in [config_kwargs("lru", capacity=64, replicas=2), config_kwargs("ttl_fixed", ttl_ms=3000)]:
        a, b = run_engine(s, kw), run_engine(mini_stream, kw)
        assert_same_metrics(a, b, f"chunk_runs={chunk_runs}, {kw}")
        assert_matches_reference(mini, kw, a)


@needs_shared
@pytest.mark.parametrize(
    "kw", [config_kwargs("lru", capacity=1000), config_kwargs("ttl_refresh", ttl_ms=60000)], ids=["lru1000", "ttl60s"]
)
def test_shared_trace_quick(shared, kw):
    w, s = shared
    ref = assert_matches_reference(w, kw, run_engine(s, kw), debug=False)
    assert 0 < ref["token_hit_rate"] < 1


@needs_shared
@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_shared_trace_matches_reference(shared, policy):
    w, s = shared
    for kw in policy_configs(policy, [0, 100, 2000, 20000], [0, 10000, 600000]):
        assert_matches_reference(w, kw, run_engine(s, kw), debug=False)


@needs_shared
@pytest.mark.slow
def test_shared_trace_lru_prefix_closed(shared):
    w, s = shared
    kw = config_kwargs("lru", capacity=3000, replicas=2, router="prefix_hash", prefix_blocks=4)
    assert_matches_reference(w, kw, run_engine(s, kw), debug=True)


# ----------------------------------------------------------------------------- jit / no jit
@pytest.mark.slow  # long; see README's slow checks
def test_jit_and_disable_jit_agree(mini):
    # op-by-op execution is slow: keep the scan short. Every policy and router runs the same ops
    # (they are dynamic parameters), so one evicting configuration covers the program.
    w = mini.slice(0, 3)  # 16, 17 and 10 blocks: 4 chunks, a hit, an eviction
    s = compile_stream(w, chunk_runs=16)
    for kw in [config_kwargs("lru", capacity=20, replicas=2, router="random")]:
        jitted = run_engine(s, kw, seed=7)
        with jax.disable_jit():
            plain = run_engine(s, kw, seed=7)
        assert_same_metrics(plain, jitted, f"disable_jit, {kw}")
        assert_matches_reference(w, kw, jitted)


# --------------------------------------------------------------------------------------- grid
def grid_configs():
    out = []
    for policy in POLICIES:
        for cap in ([0, 7, 60] if policy in LRU else [None]):
            for ttl in ([0, 2000] if policy in ("ttl_refresh", "ttl_fixed") else [None]):
                for replicas in (1, 3):
                    for router, k in (("round_robin", 80), ("prefix_hash", 2), ("random", 80)):
                        out.append(config_kwargs(policy, capacity=cap, ttl_ms=ttl, replicas=replicas, router=router,
                                                 prefix_blocks=k))
    return out


@pytest.mark.parametrize("per_request", [True, False])
def test_grid_equals_single_runs(mini, mini_stream, per_request):
    cfgs = grid_configs()
    keys = jax.random.split(jax.random.key(3), len(cfgs))
    grid = simulate_grid(
        mini_stream, stack_params([params_of(kw) for kw in cfgs]), keys, max_replicas=R_MAX, per_request=per_request
    )
    for g, kw in enumerate(cfgs):
        alone = simulate(mini_stream, params_of(kw), keys[g], max_replicas=R_MAX, per_request=per_request)
        assert_same_metrics(jax.tree.map(lambda x: x[g], grid), alone, f"grid entry {g}, {kw}")
        if per_request:
            assert_matches_reference(mini, kw, alone, debug=False)


@pytest.mark.slow  # long; see README's slow checks
def test_stacked_streams_equal_single_runs(mini, mini_stream):
    w2 = Workload.from_lists(  # a different block size, key set and length
        [[7, 8, 9], [7, 8], [], [7, 8, 9, 10], [11], [7, 8, 9, 10]],
        block_tokens=16,
        arrival_ms=np.array([0, 0, 3, 5, 5, 9]),
        input_tokens=np.array([40, 17, 3, 64, 1, 50]),
    )
    ws = [mini, w2, w2, mini]
    # each alone on its own (reused) program: the fixture's natural shape, the hand-made template
    alone_streams = [mini_stream, small_stream(w2), small_stream(w2), mini_stream]
    cfgs = [
        config_kwargs("lru", capacity=30, replicas=2),
        config_kwargs("lru_plain", capacity=2, replicas=1),
        config_kwargs("ttl_refresh", ttl_ms=3, replicas=3, router="random"),
        config_kwargs("unbounded", replicas=4, router="prefix_hash", prefix_blocks=3),
    ]
    keys = jax.random.split(jax.random.key(11), len(cfgs))
    stacked = stack_streams([compile_stream(w) for w in ws])
    grid = simulate_grid(
        stacked, stack_params([params_of(kw) for kw in cfgs]), keys, max_replicas=R_MAX, per_request=True,
        stream_axis=True,
    )
    for g, (w, s, kw) in enumerate(zip(ws, alone_streams, cfgs)):
        alone = simulate(s, params_of(kw), keys[g], max_replicas=R_MAX, per_request=True)
        # per-request arrays are padded (to the longest workload, or to the template): the real rows
        assert_same_metrics(jax.tree.map(lambda x: x[g], grid), alone, f"stream {g}, {kw}", n=w.n_requests)
        assert_matches_reference(w, kw, alone)


# --------------------------------------------------------------------------------- routers
def test_random_router_is_uniform_and_keyed():
    w = Workload.from_lists([[i] for i in range(2000)], block_tokens=4)
    s = compile_stream(w)
    kw = config_kwargs("unbounded", replicas=R_MAX, router="random")
    reps = [np.asarray(run_engine(s, kw, seed=seed).replica) for seed in (0, 1)]
    for rep in reps:
        counts = np.bincount(rep, minlength=R_MAX)
        assert counts.shape == (R_MAX,)
        chi2 = float(((counts - 500.0) ** 2 / 500.0).sum())
        assert chi2 < 25, counts  # 3 degrees of freedom: p < 1e-4
    assert (reps[0] != reps[1]).mean() > 0.5  # a different key draws differently
    np.testing.assert_array_equal(reps[0], np.asarray(run_engine(s, kw, seed=0).replica))  # same key, same draws
    # fewer active replicas than the static bound: draws stay below `replicas`
    rep3 = np.asarray(run_engine(s, config_kwargs("unbounded", replicas=3, router="random")).replica)
    assert set(np.unique(rep3).tolist()) == {0, 1, 2}


def test_prefix_hash_depends_only_on_first_k_blocks():
    # same first K blocks -> same replica, whatever follows
    w = wl([[A, B, C], [A, B, D], [A, B], [A, X], [A]])
    m = run_engine(small_stream(w), config_kwargs("unbounded", replicas=4, router="prefix_hash", prefix_blocks=2))
    rep = np.asarray(m.replica)[:5]
    assert rep[0] == rep[1] == rep[2]
    assert_matches_reference(w, config_kwargs("unbounded", replicas=4, router="prefix_hash", prefix_blocks=2), m)


# ------------------------------------------------------------------------------ invariants
@pytest.mark.parametrize("replicas,router", [(1, "round_robin"), (3, "round_robin"), (3, "random")])
def test_lru_stack_property_and_unbounded_dominates(mini, mini_stream, replicas, router):
    caps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
    key = jax.random.key(5)
    unb = simulate(
        mini_stream, params_of(config_kwargs("unbounded", replicas=replicas, router=router)), key, max_replicas=R_MAX
    )
    unb_hits = np.asarray(unb.hit_tokens)
    for policy in LRU:
        cfgs = [config_kwargs(policy, capacity=c, replicas=replicas, router=router) for c in caps]
        g = simulate_grid(
            mini_stream, stack_params([params_of(kw) for kw in cfgs]), jnp.stack([key] * len(caps)),
            max_replicas=R_MAX, per_request=True,
        )
        hits = np.asarray(g.hit_tokens)  # [G, N]
        assert np.all(np.diff(hits, axis=0) >= 0), f"{policy}: per-request hits not monotone in capacity"
        totals = combine_limbs(g.hit_tokens_hi, g.hit_tokens_lo)
        assert np.all(np.diff(totals) >= 0)
        assert np.all(hits <= unb_hits[None]), policy
        assert np.all(hits <= mini.input_tokens[None])
        assert np.all(np.asarray(g.max_occupancy) <= np.asarray(caps)[:, None])
        # capacity above the working set: LRU is the unbounded cache
        np.testing.assert_array_equal(hits[-1], unb_hits)
    for ttl_ms in (0, 1000, 60000):
        m = run_engine(mini_stream, config_kwargs("ttl_fixed", ttl_ms=ttl_ms, replicas=replicas, router=router), seed=5)
        assert np.all(np.asarray(m.hit_tokens) <= unb_hits)
        m = run_engine(mini_stream, config_kwargs("ttl_refresh", ttl_ms=ttl_ms, replicas=replicas, router=router),
                       seed=5)
        assert np.all(np.asarray(m.hit_tokens) <= unb_hits)


def test_ttl_refresh_dominates_ttl_fixed_and_grows_with_ttl(mini, mini_stream):
    prev = None
    for ttl_ms in (0, 100, 1000, 5000, 60000, 10**7):
        fixed = np.asarray(run_engine(mini_stream, config_kwargs("ttl_fixed", ttl_ms=ttl_ms)).hit_tokens)
        refresh = np.asarray(run_engine(mini_stream, config_kwargs("ttl_refresh", ttl_ms=ttl_ms)).hit_tokens)
        assert np.all(fixed <= refresh)
        if prev is not None:
            assert np.all(refresh >= prev)
        prev = refresh


# ------------------------------------------------------------------------------------ errors
def test_make_params_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown policy"):
        make_params("no_such_policy", capacity_blocks=3)  # fifo is registered now (issue 21)
    with pytest.raises(ValueError, match="unknown router"):
        make_params("lru", capacity_blocks=3, router="least_busy")
    with pytest.raises(ValueError, match="capacity_blocks"):
        make_params("lru", capacity_blocks=-1)
    for policy in LRU:
        with pytest.raises(ValueError, match="needs capacity_blocks"):
            make_params(policy)
    for policy in ("ttl_refresh", "ttl_fixed"):
        with pytest.raises(ValueError, match="needs ttl_s"):
            make_params(policy)
        with pytest.raises(ValueError, match="ttl_s"):
            make_params(policy, ttl_s=-1)
    with pytest.raises(ValueError, match="replicas"):
        make_params("unbounded", replicas=0)
    with pytest.raises(ValueError, match="prefix_blocks"):
        make_params("unbounded", router="prefix_hash", prefix_blocks=0)


def test_compile_stream_rejects_repeated_key_in_request():
    w = wl([[A, B], [A, B, A]])
    with pytest.raises(WorkloadError, match="request 1 repeats a block key"):
        compile_stream(w)
    with pytest.raises(ValueError, match="chunk_runs"):
        compile_stream(wl([[A]]), chunk_runs=0)


def test_replicas_above_bound_are_rejected():
    s = small_stream(wl([[A], [B], [C], [D], [E], [X]]))
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="max_replicas"):
        simulate(s, make_params("unbounded", replicas=R_MAX + 2), key, max_replicas=R_MAX)
    p = stack_params([make_params("unbounded", replicas=1), make_params("unbounded", replicas=R_MAX + 1)])
    with pytest.raises(ValueError, match="max_replicas"):
        simulate_grid(s, p, jax.random.split(key, 2), max_replicas=R_MAX)
    with pytest.raises(ValueError, match="max_replicas"):
        simulate(s, make_params("unbounded"), key, max_replicas=0)
    # under an outer trace the host check cannot see the value: the metrics flag it instead
    ok = simulate(s, make_params("unbounded", replicas=R_MAX), key, max_replicas=R_MAX)
    assert not bool(ok.replicas_over_bound)
    traced = jax.jit(lambda p: simulate(s, p, key, max_replicas=R_MAX))
    assert bool(traced(make_params("unbounded", replicas=R_MAX + 1)).replicas_over_bound)
    assert not bool(traced(make_params("unbounded", replicas=2)).replicas_over_bound)


# ------------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("keys", [[], [[]], [[], []]], ids=["no-requests", "one-blockless", "two-blockless"])
def test_workload_without_keys(keys):
    w = wl(keys, input_tokens=[1] * len(keys))
    for policy in POLICIES:
        kw = config_kwargs(policy, capacity=2, ttl_ms=10)
        m = run_engine(compile_stream(w), kw)
        assert float(m.token_hit_rate) == 0.0 and int(m.requests_hit) == 0
        assert np.asarray(m.hit_blocks).shape == (len(keys),)


def test_blockless_requests_next_to_keyed_ones():
    w = wl([[], [A], [], [A]], input_tokens=[1, 4, 0, 3])
    for policy in POLICIES:
        kw = config_kwargs(policy, capacity=1, ttl_ms=10, replicas=2, router="prefix_hash", prefix_blocks=1)
        assert_matches_reference(w, kw, run_engine(small_stream(w), kw))


def test_hit_tokens_do_not_overflow():
    # hit_tokens = min(hit * bt, input): 2 blocks of 2**30 tokens overflow int32 although the
    # input (2**30 + 1 tokens) fits
    bt = 2**30
    w = wl([[A, B], [A, B]], block_tokens=bt, input_tokens=[bt + 1, bt + 1])
    m = run_engine(small_stream(w), config_kwargs("unbounded"))
    assert np.asarray(m.hit_tokens)[:2].tolist() == [0, bt + 1]
    assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == bt + 1


def test_token_limbs_exact_near_int32_bound():
    # the low limb (< 2**20) plus a hit of 2**31 - 3 tokens exceeds int32
    bt = 2**31 - 3
    w = wl([[A], [A], [B], [B]], block_tokens=bt, input_tokens=[7, 7, bt, bt])
    m = run_engine(small_stream(w), config_kwargs("unbounded"))
    assert np.asarray(m.hit_tokens)[:4].tolist() == [0, 7, 0, bt]
    assert int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)) == 7 + bt


# ------------------------------------------------------------------ the public face's backend= (issue 48)
def _tiny_tenants():
    from cacheresearch.workload.synthetic import tenant_workload

    return tenant_workload(n_tenants=6, prefix_tokens=160, users_per_tenant=3, user_tokens=64, query_tokens=32,
                           rate_per_s=20, duration_s=8, seed=3)


def _same_fields(got, want):
    for f in want._fields:
        a, b = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
        assert a.shape == b.shape and a.dtype == b.dtype, (f, a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b, err_msg=f)


def test_public_simulate_auto_runs_a_per_block_policy_on_numba_equal_to_jax(monkeypatch):
    """engine.simulate / simulate_grid with a per-block policy: ``auto`` (the default) runs numba on a CPU host
    (the JAX scan is not called), ``numba`` too, and both equal ``backend="jax"`` field by field."""
    from cacheresearch import engine
    from cacheresearch.core import run

    s = compile_stream(_tiny_tenants())
    p = make_params("s3fifo", capacity_blocks=20, replicas=2, router="cache_aware")
    key = jax.random.key(7)
    want = engine.simulate(s, p, key, max_replicas=2, backend="jax")
    grid = stack_params([make_params("fifo", capacity_blocks=c, replicas=2, router="cache_aware") for c in (10, 30)])
    keys = jax.vmap(jax.random.key)(np.arange(2, dtype=np.uint32))
    want_grid = engine.simulate_grid(s, grid, keys, max_replicas=2, backend="jax")

    def no_jax(*a, **k):
        raise AssertionError("the JAX scan ran where numba covers the configurations")

    monkeypatch.setattr(run, "simulate_jax", no_jax)
    monkeypatch.setattr(run, "simulate_grid_jax", no_jax)
    assert jax.local_devices()[0].platform == "cpu"
    _same_fields(engine.simulate(s, p, key, max_replicas=2), want)
    _same_fields(engine.simulate(s, p, key, max_replicas=2, backend="numba"), want)
    _same_fields(engine.simulate_grid(s, grid, keys, max_replicas=2), want_grid)
    assert 0 < float(want.token_hit_rate) < 1


def test_public_simulate_refuses_in_one_line(mini_stream):
    from cacheresearch import engine

    key = jax.random.key(0)
    with pytest.raises(engine.BackendError) as e:  # numba models no lfu_perfect
        engine.simulate(mini_stream, make_params("lfu_perfect", capacity_blocks=20), key, backend="numba",
                        priority=True)
    assert "\n" not in str(e.value) and "lfu_perfect" in str(e.value)
    with pytest.raises(engine.BackendError) as e:  # kv_cost sampling at a temperature is JAX's (float32 softmax)
        engine.simulate_grid(mini_stream, stack_params([make_params("fifo", capacity_blocks=20, replicas=2,
                                                                    router="kv_cost", temperature=0.5)]),
                             jax.random.key(0)[None], max_replicas=2, backend="numba")
    assert "\n" not in str(e.value) and "temperature" in str(e.value)
    with pytest.raises(ValueError, match=r"^backend='gpu': one of \['auto', 'jax', 'numba'\]$"):
        engine.simulate(mini_stream, make_params("lru", capacity_blocks=20), key, backend="gpu")
    with pytest.raises(ValueError, match=r"^backend='Numba'"):
        engine.simulate_grid(mini_stream, stack_params([make_params("lru", capacity_blocks=20)]), key[None],
                             backend="Numba")
    with pytest.raises(engine.BackendError, match="traced") as e:  # under jit only the JAX scan traces
        jax.jit(lambda k: engine.simulate(mini_stream, make_params("lru", capacity_blocks=20), k, backend="numba"))(key)
    assert "\n" not in str(e.value)

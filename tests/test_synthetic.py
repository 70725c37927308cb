"""Synthetic workload generators: block counts, sharing structure, determinism, tenant laws."""

import time

import numpy as np
import pytest

from cacheresearch.workload import Workload
from cacheresearch.workload.keys import reference_block_keys
from cacheresearch.workload.synthetic import (
    _design_parts,
    design_workload,
    fleet_parts,
    fleet_workload,
    tenant_probabilities,
)

FLEET_N = 160


def _matrix(w: Workload) -> np.ndarray:
    nb = w.n_blocks
    assert np.all(nb == nb[0])
    return w.keys.reshape(w.n_requests, nb[0])


def _common_prefix_blocks(k: np.ndarray) -> np.ndarray:
    """[N, N] number of leading equal keys of every pair of requests."""
    eq = k[:, None, :] == k[None, :, :]
    return np.cumprod(eq, axis=2).sum(axis=2)


@pytest.fixture(scope="module")
def stable():
    return fleet_workload(n_requests=FLEET_N, seed=1)


@pytest.fixture(scope="module")
def stamped():
    return fleet_workload(n_requests=FLEET_N, seed=1, layout="timestamp_top")


# ------------------------------------------------------------------------------------ fleet
def test_fleet_stable_block_counts(stable):
    w = stable
    assert w.n_requests == FLEET_N and w.block_tokens == 16
    assert np.all(w.n_blocks == 128)  # 75 system + 50 doc + 3 user; 12 tokens left partial
    assert np.all(w.input_tokens == 2060) and np.all(w.output_tokens == 0)
    np.testing.assert_array_equal(w.arrival_ms, np.arange(FLEET_N))
    assert set(np.unique(w.tenant)) == set(range(8))
    w.check_distinct_keys()


def test_fleet_stable_sharing_structure(stable):
    w = stable
    common = _common_prefix_blocks(_matrix(w))
    same = w.tenant[:, None] == w.tenant[None, :]
    off_diag = ~np.eye(w.n_requests, dtype=bool)
    assert np.all(np.diag(common) == 128)
    assert np.all(common[same & off_diag] == 125)
    assert np.all(common[~same] == 75)
    # Beyond the shared prefix nothing is shared: distinct keys = 75 + 50 per tenant + 3 per request.
    assert np.unique(w.keys).size == 75 + 50 * 8 + 3 * w.n_requests


def test_fleet_stable_keys_match_reference_of_the_full_prompt(stable):
    parts = fleet_parts(
        n_tenants=8, system_tokens=1200, doc_tokens=800, user_tokens=60, n_requests=FLEET_N,
        tenant_law="uniform", zipf_s=1.0, layout="stable", rate_per_s=None, seed=1, vocab_size=128_256,
    )
    np.testing.assert_array_equal(parts["tenant"], stable.tenant)
    for i in (0, FLEET_N - 1):
        prompt = np.concatenate([parts["system"], parts["docs"][parts["tenant"][i]], parts["user"][i]])
        assert prompt.size == 2060
        assert stable.request_keys(i).tolist() == reference_block_keys(prompt.tolist(), block_size=16)


def test_fleet_timestamp_top_shares_nothing(stamped, stable):
    w = stamped
    assert np.all(w.n_blocks == 128) and np.all(w.input_tokens == 2061)
    assert np.unique(w.keys).size == w.total_blocks
    assert not np.isin(w.keys, stable.keys).any()
    np.testing.assert_array_equal(w.tenant, stable.tenant)  # same draws, only the layout differs
    parts = fleet_parts(
        n_tenants=8, system_tokens=1200, doc_tokens=800, user_tokens=60, n_requests=FLEET_N,
        tenant_law="uniform", zipf_s=1.0, layout="timestamp_top", rate_per_s=None, seed=1, vocab_size=128_256,
    )
    i = 7
    prompt = np.concatenate(
        [parts["stamp"][i : i + 1], parts["system"], parts["docs"][parts["tenant"][i]], parts["user"][i]]
    )
    assert w.request_keys(i).tolist() == reference_block_keys(prompt.tolist())


def test_fleet_determinism_per_seed(stable):
    again = fleet_workload(n_requests=FLEET_N, seed=1)
    for name in ("keys", "offsets", "tenant", "arrival_ms", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(again, name), getattr(stable, name))
    other = fleet_workload(n_requests=FLEET_N, seed=2)
    assert not np.isin(other.keys, stable.keys).any()
    assert not np.array_equal(other.tenant, stable.tenant)


def test_fleet_other_block_size_and_leftover_prefix_tokens():
    # 40 + 30 = 70 prefix tokens: 2 full 32-token blocks, 6 leftover tokens shared per tenant.
    w = fleet_workload(n_tenants=3, system_tokens=40, doc_tokens=30, user_tokens=50, n_requests=60, block_tokens=32,
                       seed=3)
    assert np.all(w.n_blocks == 120 // 32) and w.block_tokens == 32
    common = _common_prefix_blocks(_matrix(w))
    same = w.tenant[:, None] == w.tenant[None, :]
    off = ~np.eye(60, dtype=bool)
    assert np.all(common[same & off] == 2)  # block 2 mixes prefix leftovers and user tokens
    assert np.all(common[~same] == 1)  # block 1 = system tokens 32..39 + tenant doc tokens
    parts = fleet_parts(
        n_tenants=3, system_tokens=40, doc_tokens=30, user_tokens=50, n_requests=60, tenant_law="uniform",
        zipf_s=1.0, layout="stable", rate_per_s=None, seed=3, vocab_size=128_256,
    )
    prompt = np.concatenate([parts["system"], parts["docs"][parts["tenant"][5]], parts["user"][5]])
    assert w.request_keys(5).tolist() == reference_block_keys(prompt.tolist(), block_size=32)


def test_fleet_zipf_skew_and_uniform_flatness():
    kw = dict(system_tokens=16, doc_tokens=16, user_tokens=16, n_requests=8000, seed=4)
    z = fleet_workload(tenant_law="zipf", zipf_s=1.0, **kw)
    u = fleet_workload(tenant_law="uniform", **kw)
    zc = np.bincount(z.tenant, minlength=8) / 8000
    uc = np.bincount(u.tenant, minlength=8) / 8000
    p = 1.0 / np.arange(1, 9)
    p /= p.sum()
    np.testing.assert_allclose(zc, p, atol=0.02)
    assert zc[0] > 4 * zc[7]
    np.testing.assert_allclose(uc, 1 / 8, atol=0.02)
    assert z.meta["tenant_law"] == "zipf" and z.meta["zipf_s"] == 1.0


def test_fleet_poisson_arrivals_and_output_tokens():
    n = 3000
    w = fleet_workload(system_tokens=16, doc_tokens=16, user_tokens=16, n_requests=n, rate_per_s=100.0,
                       output_tokens=7, seed=5)
    gaps = np.diff(w.arrival_ms)
    assert np.all(gaps >= 0)
    assert abs(w.arrival_ms[-1] / n - 10.0) < 0.6  # mean gap 10 ms
    assert np.all(w.output_tokens == 7)
    out = np.arange(n)
    w2 = fleet_workload(system_tokens=16, doc_tokens=16, user_tokens=16, n_requests=n, output_tokens=out, seed=5)
    np.testing.assert_array_equal(w2.output_tokens, out)


def test_fleet_meta_records_parameters(stable):
    m = stable.meta
    assert m["generator"] == "fleet_workload"
    assert (m["n_tenants"], m["system_tokens"], m["doc_tokens"], m["user_tokens"]) == (8, 1200, 800, 60)
    assert (m["n_requests"], m["block_tokens"], m["layout"], m["seed"]) == (FLEET_N, 16, "stable", 1)
    assert m["rate_per_s"] is None and m["tenant_law"] == "uniform"


@pytest.mark.parametrize(
    "kw",
    [
        dict(n_tenants=0),
        dict(n_tenants=2.5),
        dict(n_tenants=True),
        dict(system_tokens=-1),
        dict(n_requests=-3),
        dict(block_tokens=0),
        dict(tenant_law="pareto"),
        dict(zipf_s=-0.5),
        dict(zipf_s=float("nan")),
        dict(layout="bottom"),
        dict(rate_per_s=0.0),
        dict(rate_per_s=-1.0),
        dict(output_tokens=-1),
        dict(output_tokens=np.zeros(3, np.int64)),
        dict(seed=-1),
        dict(vocab_size=0),
    ],
)
def test_fleet_argument_errors(kw):
    with pytest.raises(ValueError):
        fleet_workload(**{"n_requests": 10, **kw})


def test_fleet_arrivals_beyond_engine_range_are_rejected():
    with pytest.raises(ValueError, match="rate_per_s"):
        fleet_workload(system_tokens=16, doc_tokens=0, user_tokens=0, n_requests=100, rate_per_s=1e-6)


def test_empty_fleet():
    w = fleet_workload(n_requests=0)
    assert w.n_requests == 0 and w.total_blocks == 0


# ----------------------------------------------------------------------------------- design
DESIGN = dict(n_tenants=5, prefix_tokens=330, suffix_tokens=40, n_requests=300, seed=6)


@pytest.fixture(scope="module")
def design():
    return design_workload(**DESIGN)


def test_design_shapes(design):
    w = design
    assert w.n_requests == 300 and np.all(w.n_blocks == 370 // 16)
    assert np.all(w.input_tokens == 370)
    assert set(np.unique(w.tenant)) == set(range(5))
    w.check_distinct_keys()
    # Poisson arrivals at n / day: the last arrival is about one day in.
    assert np.all(np.diff(w.arrival_ms) >= 0)
    assert 0.75 * 86_400_000 < w.arrival_ms[-1] < 1.25 * 86_400_000
    assert w.meta["rate_per_s"] == pytest.approx(300 / 86_400)
    assert w.meta["generator"] == "design_workload" and w.meta["prefix_tokens"] == 330


def test_design_sharing_structure_and_reference(design):
    w = design
    common = _common_prefix_blocks(_matrix(w))
    same = w.tenant[:, None] == w.tenant[None, :]
    off = ~np.eye(w.n_requests, dtype=bool)
    assert np.all(common[same & off] == 330 // 16)
    assert np.all(common[~same] == 0)
    assert np.unique(w.keys).size == 5 * 20 + 3 * w.n_requests
    rate = 300 / 86_400
    parts = _design_parts(n_tenants=5, prefix_tokens=330, suffix_tokens=40, n_requests=300, rate_per_s=rate,
                          hot_share=0.0, tenant_law="uniform", zipf_s=1.0, seed=6, vocab_size=128_256)
    np.testing.assert_array_equal(parts["arrival"], w.arrival_ms)
    for i in (0, 299):
        prompt = np.concatenate([parts["prefix"][parts["tenant"][i]], parts["suffix"][i]])
        assert w.request_keys(i).tolist() == reference_block_keys(prompt.tolist())


def test_design_hot_tenant_and_zipf():
    kw = dict(n_tenants=10, prefix_tokens=16, suffix_tokens=16, n_requests=6000, seed=7)
    hot = design_workload(hot_share=0.5, **kw)
    share = np.bincount(hot.tenant, minlength=10) / 6000
    assert share[0] == pytest.approx(0.5 + 0.5 / 10, abs=0.03)
    np.testing.assert_allclose(share[1:], 0.05, atol=0.015)
    assert hot.meta["tenant0_share"] == pytest.approx(0.55)
    all_hot = design_workload(hot_share=1.0, **kw)
    assert np.all(all_hot.tenant == 0)
    z = design_workload(tenant_law="zipf", zipf_s=1.2, **kw)
    np.testing.assert_allclose(
        np.bincount(z.tenant, minlength=10) / 6000, tenant_probabilities(10, "zipf", 1.2), atol=0.02
    )


def test_design_determinism():
    kw = dict(n_tenants=3, prefix_tokens=64, suffix_tokens=20, n_requests=50)
    a, b, c = design_workload(seed=1, **kw), design_workload(seed=1, **kw), design_workload(seed=2, **kw)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.arrival_ms, b.arrival_ms)
    assert not np.isin(c.keys, a.keys).any()


@pytest.mark.parametrize(
    "kw", [dict(hot_share=1.5), dict(hot_share=-0.1), dict(duration_s=0), dict(rate_per_s=-2.0),
           dict(prefix_tokens=-1), dict(tenant_law="zipfian"), dict(n_tenants=0)]
)
def test_design_argument_errors(kw):
    with pytest.raises(ValueError):
        design_workload(**{"n_tenants": 3, "prefix_tokens": 32, "suffix_tokens": 16, "n_requests": 10, **kw})


def test_tenant_probabilities():
    np.testing.assert_allclose(tenant_probabilities(4), 0.25)
    p = tenant_probabilities(4, "zipf", 0.0)
    np.testing.assert_allclose(p, 0.25)
    p = tenant_probabilities(3, "zipf", 1.0, hot_share=0.4)
    q = np.array([1, 1 / 2, 1 / 3]) / (11 / 6)
    np.testing.assert_allclose(p, 0.6 * q + np.array([0.4, 0, 0]))


@pytest.mark.slow
def test_design_default_size_is_fast():
    t = time.perf_counter()
    w = design_workload()
    elapsed = time.perf_counter() - t
    assert w.n_requests == 50_000 and np.all(w.n_blocks == 10_200 // 16)
    assert np.unique(w.tenant).size == 200
    assert elapsed < 30.0, elapsed


# ------------------------------------------------------------------------- prefix processes
def test_prefix_poisson_workload_structure_and_determinism():
    from cacheresearch.workload.synthetic import prefix_poisson_workload

    w = prefix_poisson_workload(n_prefixes=6, prefix_tokens=40, shared_tokens=32, suffix_tokens=20, block_tokens=16,
                                rate_per_hour=60, duration_s=3600, seed=4)
    assert np.all(w.n_blocks == (32 + 40 + 20) // 16) and np.all(w.input_tokens == 92)
    k = _matrix(w)
    assert np.all(k[:, :2] == k[0, :2])  # the shared head (2 blocks) is common to every prefix
    same = w.tenant[:, None] == w.tenant[None, :]
    common = _common_prefix_blocks(k)
    # own prefix: 72 tokens = 4 full blocks shared within a prefix; the 5th block mixes in the suffix
    assert np.all(common[same & ~np.eye(w.n_requests, dtype=bool)] == 4)
    assert np.all(common[~same] == 2)
    assert np.all(np.diff(w.arrival_ms) >= 0) and w.arrival_ms[-1] < 3_600_000
    w2 = prefix_poisson_workload(n_prefixes=6, prefix_tokens=40, shared_tokens=32, suffix_tokens=20,
                                 block_tokens=16, rate_per_hour=60, duration_s=3600, seed=4)
    np.testing.assert_array_equal(w.keys, w2.keys)
    np.testing.assert_array_equal(w.arrival_ms, w2.arrival_ms)
    assert w.meta["duration_s"] == 3600 and w.meta["prefix_rate_per_s"].shape == (6,)


@pytest.mark.parametrize("arrival", ["poisson", "diurnal", "bursty"])
def test_prefix_arrival_processes_have_the_stated_rates(arrival):
    from cacheresearch.analysis.analytic import diurnal_cumulative
    from cacheresearch.workload.synthetic import prefix_arrival_times

    rng = np.random.default_rng(0)
    lam = np.full(200, 30 / 3600)
    D = 86_400.0
    t, p = prefix_arrival_times(lam, D, rng, arrival=arrival, diurnal_amplitude=0.8, burst_cv=3.0)
    n = t.size
    expect = lam.sum() * D
    assert abs(n - expect) < 5 * np.sqrt(expect * (9 if arrival == "bursty" else 1))
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < D
    if arrival == "diurnal":  # requests per 6 hours follow the profile
        edges = np.arange(0, D + 1, 6 * 3600)
        got = np.histogram(t, edges)[0]
        want = np.array([diurnal_cumulative(a, b, lam.sum(), 0.8) for a, b in zip(edges[:-1], edges[1:])])
        assert np.all(np.abs(got - want) < 5 * np.sqrt(want))
    gaps = np.concatenate([np.diff(t[p == k]) for k in range(200)])
    cv = gaps.std() / gaps.mean()
    if arrival == "poisson":
        assert cv == pytest.approx(1.0, abs=0.03)
    if arrival == "bursty":
        assert cv == pytest.approx(3.0, rel=0.15)


def test_prefix_poisson_workload_validation_and_zipf():
    from cacheresearch.workload.synthetic import prefix_poisson_workload

    w = prefix_poisson_workload(n_prefixes=50, prefix_tokens=16, block_tokens=16, rate_per_hour=100,
                                duration_s=3600, popularity="zipf", zipf_s=1.0, seed=1)
    counts = np.bincount(w.tenant, minlength=50)
    assert counts[0] > 5 * counts[-1]
    assert w.meta["prefix_rate_per_s"].sum() * 3600 == pytest.approx(50 * 100)
    explicit = prefix_poisson_workload(n_prefixes=3, prefix_tokens=16, block_tokens=16,
                                       rate_per_hour=np.array([0.0, 10.0, 1000.0]), duration_s=3600, seed=1)
    assert np.sum(explicit.tenant == 0) == 0 and np.sum(explicit.tenant == 2) > 500
    with pytest.raises(ValueError, match="arrival"):
        prefix_poisson_workload(arrival="weekly")
    with pytest.raises(ValueError, match="duration_s"):
        prefix_poisson_workload(duration_s=30 * 86_400.0)
    with pytest.raises(ValueError, match="rate_per_hour"):
        prefix_poisson_workload(n_prefixes=2, rate_per_hour=np.array([1.0]))


@pytest.mark.parametrize("n", [1, 63, 65, 200])
def test_hash_rows_padding_changes_no_key(n):
    """hash_rows pads each call's rows to a power of two (fewer compiled programs): every row's keys
    equal an unpadded call's, with a parent chain and salts too."""
    from cacheresearch.workload.keys import block_keys_jit, to_uint64  # noqa: PLC0415
    from cacheresearch.workload.synthetic import _rows_bucket, hash_rows  # noqa: PLC0415

    rng = np.random.default_rng(n)
    tok = rng.integers(0, 50_000, size=(n, 48), dtype=np.int32)
    par = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
           rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32))
    salt = rng.integers(0, 3, n).astype(np.uint32)
    for kw in (dict(), dict(parent=par, start_token=16), dict(salt=salt)):
        got = hash_rows(tok, 16, **kw)
        call = {("cache_salt" if k == "salt" else k): v for k, v in kw.items()}
        hi, lo, _ = block_keys_jit(tok, np.full(n, 48, np.int32), block_size=16, **call)
        assert np.array_equal(got, to_uint64(hi, lo))
    assert _rows_bucket(n) >= n and _rows_bucket(n) & (_rows_bucket(n) - 1) == 0


def test_dense_ids_and_repeat_check_from_one_sort():
    """Workload.dense_ids equals np.unique's inverse; the repeat check names the first request that
    repeats a key (keys shared across requests are fine)."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        nb = rng.integers(0, 6, size=12)
        keys = rng.integers(0, 9, size=int(nb.sum())).astype(np.uint64)
        off = np.concatenate([[0], np.cumsum(nb)])
        w = Workload(arrival_ms=np.arange(12), input_tokens=nb * 16, output_tokens=np.ones(12, np.int64),
                     tenant=np.zeros(12, np.int32), keys=keys, offsets=off, block_tokens=16)
        if keys.size:
            assert np.array_equal(w.dense_ids(), np.unique(keys, return_inverse=True)[1].reshape(-1))
        rep = [i for i in range(12) if len(set(keys[off[i]:off[i + 1]].tolist())) < nb[i]]
        if rep:
            with pytest.raises(ValueError, match=f"request {rep[0]} repeats a block key"):
                w.check_distinct_keys()
        else:
            w.check_distinct_keys()

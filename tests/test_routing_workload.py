"""Routing workloads (tenant_workload, llmd_workload): reproducibility, sharing, chaining, arrival laws."""

import inspect

import numpy as np
import pytest

from cacheresearch.workload import MAX_ARRIVAL_MS
from cacheresearch.workload.keys import reference_block_keys
from cacheresearch.workload.synthetic import (
    _tenant_parts,
    llmd_workload,
    mmpp_parameters,
    tenant_probabilities,
    tenant_workload,
)

# Arrival tests: one 16-token prefix block per request and no query, so nothing per request is hashed.
CHEAP = dict(n_tenants=4, prefix_tokens=16, query_tokens=0)
# Sharing tests: leftovers at every boundary (37 = 2 * 16 + 5; 37 + 21 = 58 = 3 * 16 + 10; 98 = 6 * 16 + 2).
SHARE = dict(n_tenants=4, prefix_tokens=37, users_per_tenant=3, user_tokens=21, query_tokens=40,
             rate_per_s=2.0, duration_s=60.0, seed=5)


from test_synthetic import _common_prefix_blocks, _matrix  # noqa: E402  (shared helpers)


def _parts(**kw):
    """_tenant_parts with tenant_workload's defaults filled in (the prompts' token ids)."""
    sig = inspect.signature(tenant_workload).parameters
    a = {k: p.default for k, p in sig.items()}
    a.update(kw)
    low, high, m_low = mmpp_parameters(a["burst_ratio"], a["burst_high_share"], a["burst_mean_high_s"])
    return _tenant_parts(
        n_tenants=a["n_tenants"], prefix_tokens=a["prefix_tokens"], users_per_tenant=a["users_per_tenant"],
        user_tokens=a["user_tokens"], query_tokens=a["query_tokens"], duration_s=a["duration_s"],
        rate_per_s=a["rate_per_s"], arrival=a["arrival"], hot_share=a["hot_share"], tenant_law=a["tenant_law"],
        zipf_s=a["zipf_s"], burst=(low, high, m_low, a["burst_mean_high_s"]),
        diurnal_amplitude=a["diurnal_amplitude"], diurnal_period_s=a["diurnal_period_s"], seed=a["seed"],
        vocab_size=a["vocab_size"],
    )


def _prompt(parts, i):
    return np.concatenate([parts["prefix"][parts["tenant"][i]], parts["user_ctx"][parts["user"][i]], parts["query"][i]])


def _dispersion(arrival_ms, duration_s, window_s):
    counts = np.bincount(arrival_ms // int(window_s * 1000), minlength=int(duration_s // window_s))
    counts = counts[: int(duration_s // window_s)]
    return counts.var(ddof=1) / counts.mean()


@pytest.fixture(scope="module")
def shared():
    return tenant_workload(**SHARE)


# ------------------------------------------------------------------------- shapes and meta
def test_shapes_and_meta(shared):
    w = shared
    n = w.n_requests
    assert 60 < n < 190  # Poisson(120)
    assert np.all(w.n_blocks == (37 + 21 + 40) // 16)
    assert np.all(w.input_tokens == 98) and np.all(w.output_tokens == 0)
    assert w.arrival_ms.dtype == np.int64 and np.all(np.diff(w.arrival_ms) >= 0)
    assert w.arrival_ms[0] >= 0 and w.arrival_ms[-1] < 60_000
    assert w.tenant.dtype == np.int32 and set(np.unique(w.tenant)) <= set(range(4))
    assert w.name == "tenant-poisson" and w.block_tokens == 16
    w.check_distinct_keys()
    for k in inspect.signature(tenant_workload).parameters:
        if k != "name":
            assert k in w.meta, k
    for k, v in SHARE.items():
        assert w.meta[k] == v
    assert w.meta["generator"] == "tenant_workload" and w.meta["n_requests"] == n
    assert w.meta["mean_rate_per_s"] == pytest.approx(n / 60.0)
    assert w.meta["tenant0_share"] == pytest.approx(0.25)
    assert w.meta["tenant0_share_realised"] == pytest.approx(np.mean(w.tenant == 0))
    assert w.meta["burst_low"] * 1.9 == pytest.approx(1.0) and w.meta["burst_mean_low_s"] == pytest.approx(540.0)


def test_output_tokens_int_and_array(shared):
    w = tenant_workload(**SHARE, output_tokens=7, name="x")
    assert np.all(w.output_tokens == 7) and w.name == "x" and w.meta["output_tokens"] == 7
    per = np.arange(shared.n_requests)
    w = tenant_workload(**SHARE, output_tokens=per)
    np.testing.assert_array_equal(w.output_tokens, per)
    assert w.meta["output_tokens"] == "per-request array"
    with pytest.raises(ValueError, match="output_tokens"):
        tenant_workload(**SHARE, output_tokens=per[:-1])


def test_reproducible_with_seed(shared):
    again = tenant_workload(**SHARE)
    for f in ("arrival_ms", "tenant", "keys", "offsets", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(again, f), getattr(shared, f))
    other = tenant_workload(**{**SHARE, "seed": 6})
    assert other.n_requests != shared.n_requests or not np.array_equal(other.arrival_ms, shared.arrival_ms)
    assert not np.isin(other.keys, shared.keys).any()  # fresh prefixes: nothing in common
    for arrival in ("bursty", "diurnal"):
        a = tenant_workload(**CHEAP, arrival=arrival, rate_per_s=5.0, duration_s=100.0, seed=2)
        b = tenant_workload(**CHEAP, arrival=arrival, rate_per_s=5.0, duration_s=100.0, seed=2)
        np.testing.assert_array_equal(a.arrival_ms, b.arrival_ms)
        np.testing.assert_array_equal(a.keys, b.keys)


def test_empty_workload():
    w = tenant_workload(**CHEAP, rate_per_s=1e-9, duration_s=1.0)
    assert w.n_requests == 0 and w.total_blocks == 0 and w.meta["mean_rate_per_s"] == 0.0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(n_tenants=0), "n_tenants"),
        (dict(n_tenants=1.5), "n_tenants"),
        (dict(prefix_tokens=-1), "prefix_tokens"),
        (dict(users_per_tenant=0), "users_per_tenant"),
        (dict(user_tokens=-1), "user_tokens"),
        (dict(query_tokens=-1), "query_tokens"),
        (dict(rate_per_s=0.0), "rate_per_s"),
        (dict(rate_per_s=float("nan")), "rate_per_s"),
        (dict(duration_s=0.0), "duration_s"),
        (dict(duration_s=MAX_ARRIVAL_MS / 1000 + 1), "duration_s"),
        (dict(arrival="gamma"), "arrival"),
        (dict(tenant_law="pareto"), "tenant_law"),
        (dict(zipf_s=-1.0), "zipf_s"),
        (dict(hot_share=1.5), "hot_share"),
        (dict(burst_ratio=0.5), "burst_ratio"),
        (dict(burst_high_share=0.0), "burst_high_share"),
        (dict(burst_high_share=1.0), "burst_high_share"),
        (dict(burst_mean_high_s=0.0), "burst_mean_high_s"),
        (dict(diurnal_amplitude=1.5), "diurnal_amplitude"),
        (dict(diurnal_period_s=0.0), "diurnal_period_s"),
        (dict(block_tokens=0), "block_tokens"),
        (dict(seed=-1), "seed"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(output_tokens=-1), "output_tokens"),
        (dict(output_tokens=1.5), "output_tokens"),
    ],
)
def test_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        tenant_workload(**{**CHEAP, **kw})


def test_llmd_validation():
    with pytest.raises(ValueError, match="qps"):
        llmd_workload(4.0, rate_per_s=3.0)
    with pytest.raises(ValueError, match="qps"):
        llmd_workload(0.0)


# ------------------------------------------------------------------------- keys and sharing
@pytest.mark.parametrize(
    "kw",
    [
        SHARE,
        dict(n_tenants=3, prefix_tokens=32, users_per_tenant=5, user_tokens=0, query_tokens=20,
             rate_per_s=1.0, duration_s=20.0, seed=1),
        # prefix leftover 4 + 3 user tokens = 7 < 16 carried into the query
        dict(n_tenants=2, prefix_tokens=20, users_per_tenant=2, user_tokens=3, query_tokens=30,
             rate_per_s=1.0, duration_s=20.0, seed=2, block_tokens=16),
    ],
)
def test_keys_are_the_chained_keys_of_the_whole_prompt(kw):
    w = tenant_workload(**kw)
    parts = _parts(**kw)
    np.testing.assert_array_equal(parts["tenant"], w.tenant)
    assert w.n_requests >= 2
    bs = w.block_tokens
    for i in (0, 1, w.n_requests - 1):
        prompt = _prompt(parts, i)
        assert prompt.size == w.input_tokens[i]
        assert w.request_keys(i).tolist() == reference_block_keys(prompt.tolist(), block_size=bs)


def test_sharing_structure(shared):
    w = shared
    parts = _parts(**SHARE)
    k = _matrix(w)
    common = _common_prefix_blocks(k)
    off = ~np.eye(w.n_requests, dtype=bool)
    same_tenant = w.tenant[:, None] == w.tenant[None, :]
    same_user = parts["user"][:, None] == parts["user"][None, :]
    assert np.all(parts["user"] // 3 == w.tenant)
    assert (same_user & off).any() and (same_tenant & ~same_user).any()
    # tenant prefix = 2 full blocks; prefix + user context = 3 full blocks; block 3 holds query tokens
    assert np.all(common[same_user & off] == 3)
    assert np.all(common[same_tenant & ~same_user] == 2)
    assert np.all(common[~same_tenant] == 0)
    # the first block identifies the tenant
    first = k[:, 0]
    assert np.all((first[:, None] == first[None, :]) == same_tenant)
    # every block holding a query token is unique to its request
    assert np.unique(k[:, 3:]).size == k[:, 3:].size
    assert not np.isin(k[:, 3:], k[:, :3]).any()


def test_users_without_context_share_the_tenant_prefix():
    kw = dict(n_tenants=3, prefix_tokens=32, users_per_tenant=5, user_tokens=0, query_tokens=20,
              rate_per_s=1.0, duration_s=20.0, seed=1)
    w = tenant_workload(**kw)
    k = _matrix(w)
    same = w.tenant[:, None] == w.tenant[None, :]
    common = _common_prefix_blocks(k)
    off = ~np.eye(w.n_requests, dtype=bool)
    assert np.all(common[same & off] == 2) and np.all(common[~same] == 0)
    assert np.unique(k[:, 2:]).size == k[:, 2:].size


def test_keys_are_chained():
    """Block j's key changes when any token before or inside block j changes, never otherwise."""
    parts = _parts(**SHARE)
    prompt = _prompt(parts, 0)
    base = np.array(reference_block_keys(prompt.tolist(), block_size=16), dtype=np.uint64)
    nb = base.size
    for pos in (0, 5, 15, 16, 40, 57, 63, 95):  # tenant prefix, user context and query tokens
        alt = prompt.copy()
        alt[pos] = (alt[pos] + 1) % 128_256
        keys = np.array(reference_block_keys(alt.tolist(), block_size=16), dtype=np.uint64)
        j = pos // 16
        np.testing.assert_array_equal(keys[:j], base[:j])
        assert np.all(keys[j:] != base[j:]), pos
    alt = prompt.copy()
    alt[nb * 16 :] += 1  # the partial last block is never keyed
    assert reference_block_keys(alt.tolist(), block_size=16) == base.tolist()


# -------------------------------------------------------------------------------- arrivals
def test_poisson_rate_and_dispersion():
    rate, dur = 20.0, 1000.0
    w = tenant_workload(**CHEAP, rate_per_s=rate, duration_s=dur, seed=11)
    mu = rate * dur
    assert abs(w.n_requests - mu) < 5 * np.sqrt(mu)
    assert w.meta["mean_rate_per_s"] == pytest.approx(w.n_requests / dur)
    assert 0.75 < _dispersion(w.arrival_ms, dur, 1.0) < 1.25  # K = 1000 windows: sd ~ 0.045
    # uniform in time: first and second half within 5 sigma of each other
    half = np.sum(w.arrival_ms < dur * 500)
    assert abs(half - w.n_requests / 2) < 5 * np.sqrt(w.n_requests / 4)


def test_mmpp_parameters_derivation():
    for rho, h, m_high in ((10.0, 0.1, 60.0), (4.0, 0.3, 2.0), (1.0, 0.5, 1.0)):
        low, high, m_low = mmpp_parameters(rho, h, m_high)
        assert high / low == pytest.approx(rho)
        assert h * high + (1 - h) * low == pytest.approx(1.0)  # long-run mean = rate_per_s
        assert m_high / (m_high + m_low) == pytest.approx(h)  # fraction of time in the high state


def _mmpp_idc(rate, rho, h, m_high, window_s):
    """Index of dispersion of the counts of a stationary two-state MMPP over a window."""
    low, high, m_low = mmpp_parameters(rho, h, m_high)
    gamma = 1.0 / m_low + 1.0 / m_high
    d = rate * (high - low)
    x = gamma * window_s
    return 1.0 + 2.0 * h * (1 - h) * d * d / (rate * gamma) * (1.0 - (1.0 - np.exp(-x)) / x)


def test_mmpp_mean_rate():
    rate, dur, m_high = 2.0, 20_000.0, 2.0  # short sojourns: many cycles, so the mean is sharp
    w = tenant_workload(**CHEAP, arrival="bursty", rate_per_s=rate, duration_s=dur, burst_mean_high_s=m_high,
                        seed=12)
    mu = rate * dur
    sd = np.sqrt(mu * _mmpp_idc(rate, 10.0, 0.1, m_high, dur))
    assert abs(w.n_requests - mu) < 5 * sd
    idc = _dispersion(w.arrival_ms, dur, 10.0)
    expect = _mmpp_idc(rate, 10.0, 0.1, m_high, 10.0)  # about 12.9
    assert 1.5 < idc and 0.6 * expect < idc < 1.6 * expect
    assert w.name == "tenant-bursty"


def test_mmpp_defaults_are_overdispersed_and_ratio_one_is_poisson():
    dur = 6000.0
    w = tenant_workload(**CHEAP, arrival="bursty", rate_per_s=1.0, duration_s=dur, seed=13)
    assert _dispersion(w.arrival_ms, dur, 10.0) > 1.5  # theory: about 20
    w = tenant_workload(**CHEAP, arrival="bursty", burst_ratio=1.0, rate_per_s=5.0, duration_s=dur,
                        burst_mean_high_s=1.0, seed=13)
    assert abs(w.n_requests - 5 * dur) < 5 * np.sqrt(5 * dur)
    assert 0.8 < _dispersion(w.arrival_ms, dur, 10.0) < 1.25


def test_diurnal_profile():
    rate, period, a = 5.0, 2000.0, 0.8
    w = tenant_workload(**CHEAP, arrival="diurnal", rate_per_s=rate, duration_s=period, diurnal_period_s=period,
                        diurnal_amplitude=a, seed=14)
    assert abs(w.n_requests - rate * period) < 5 * np.sqrt(rate * period)
    t = w.arrival_ms / 1000.0
    # mean of 1 - a cos(2 pi t / P) over |phase| < 0.05 P (trough) and |phase - P / 2| < 0.05 P (peak)
    dev = a * np.sin(0.1 * np.pi) / (0.1 * np.pi)
    trough_mu, peak_mu = rate * 0.1 * period * (1 - dev), rate * 0.1 * period * (1 + dev)
    trough = np.sum((t < 0.05 * period) | (t >= 0.95 * period))
    peak = np.sum(np.abs(t - 0.5 * period) < 0.05 * period)
    assert abs(trough - trough_mu) < 5 * np.sqrt(trough_mu)
    assert abs(peak - peak_mu) < 5 * np.sqrt(peak_mu)
    assert trough / peak < 0.25  # theory: 0.12; (1 - a) / (1 + a) = 0.11 at the extremes


# ---------------------------------------------------------------------------------- tenants
def test_hot_tenant_share():
    w = tenant_workload(**{**CHEAP, "n_tenants": 10}, hot_share=0.5, rate_per_s=20.0, duration_s=1000.0, seed=15)
    n = w.n_requests
    assert w.meta["tenant0_share"] == pytest.approx(0.55)
    share = np.mean(w.tenant == 0)
    assert abs(share - 0.55) < 5 * np.sqrt(0.55 * 0.45 / n)
    rest = np.bincount(w.tenant, minlength=10)[1:] / n  # 0.05 each
    assert np.all(np.abs(rest - 0.05) < 5 * np.sqrt(0.05 * 0.95 / n))


def test_zipf_tenants():
    w = tenant_workload(**{**CHEAP, "n_tenants": 8}, tenant_law="zipf", zipf_s=1.2, rate_per_s=20.0,
                        duration_s=1000.0, seed=16)
    p = tenant_probabilities(8, "zipf", 1.2)
    freq = np.bincount(w.tenant, minlength=8) / w.n_requests
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / w.n_requests))


# ------------------------------------------------------------------------------------ llm-d
def test_llmd_workload():
    w = llmd_workload(4.0, duration_s=5.0, seed=3)
    assert 2 <= w.n_requests <= 60  # Poisson(20)
    assert np.all(w.input_tokens == 7200) and np.all(w.n_blocks == 450) and w.block_tokens == 16
    assert np.all(w.output_tokens == 256)
    assert w.arrival_ms[-1] < 5000 and np.all(w.tenant < 150)
    m = w.meta
    assert (m["n_tenants"], m["prefix_tokens"], m["users_per_tenant"], m["user_tokens"], m["query_tokens"]) == (
        150, 6000, 5, 0, 1200)
    assert m["arrival"] == "poisson" and m["rate_per_s"] == 4.0 and m["duration_s"] == 5.0
    assert "llm-d" in m["scenario"] and w.name == "llmd-4qps"
    k = _matrix(w)
    same = w.tenant[:, None] == w.tenant[None, :]
    assert np.all((k[:, 0][:, None] == k[:, 0][None, :]) == same)
    assert np.unique(k[:, 375:]).size == k[:, 375:].size  # 6000 / 16 = 375 prefix blocks, then queries
    # overrides
    w2 = llmd_workload(4.0, duration_s=5.0, seed=3, user_tokens=100, output_tokens=0)
    assert np.all(w2.n_blocks == 7300 // 16) and np.all(w2.output_tokens == 0)
    np.testing.assert_array_equal(w2.arrival_ms, w.arrival_ms)

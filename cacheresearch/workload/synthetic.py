"""Synthetic workloads with real chained block keys.

Token ids are drawn with NumPy from a seed; block keys come from :mod:`cacheresearch.workload.keys`
(JAX). Shared prefixes are hashed once (per tenant) and each request's own tail is hashed as a
continuation of the prefix's chain, which gives exactly the keys of hashing the whole prompt.

Generators
----------
:func:`fleet_workload`
    Prompt = [timestamp token, with ``layout="timestamp_top"``] + system prompt (same token ids
    for every request) + tenant document (per-tenant token ids) + user suffix (fresh tokens per
    request). With the defaults and ``layout="stable"`` a 2060-token prompt has 128 full blocks
    (75 system + 50 document + 3 user; the last 12 tokens are a partial block, never hashed):
    requests of one tenant share their first 125 keys, requests of different tenants their first
    75. With ``"timestamp_top"`` a volatile token unique to each request comes first, so no block
    is shared between requests at all.
:func:`design_workload`
    ``n_tenants`` tenants, each with its own ``prefix_tokens``-token prefix, plus a unique
    ``suffix_tokens``-token suffix per request; Poisson arrivals over ``duration_s``; tenants
    drawn uniformly or Zipf, optionally with a hot tenant 0.
:func:`tenant_workload`
    The routing experiments: ``n_tenants`` tenants with their own ``prefix_tokens``-token prefix,
    ``users_per_tenant`` users per tenant with their own ``user_tokens``-token context after it,
    and a fresh ``query_tokens``-token query per request; arrivals over ``duration_s`` at a total
    rate ``rate_per_s``: Poisson, bursty (a two-state Markov-modulated Poisson process) or diurnal.
    :func:`llmd_workload` is its llm-d benchmark setting (150 customers x 6,000-token prefix).
:func:`prefix_poisson_workload`
    ``n_prefixes`` prefixes (optionally after a ``shared_tokens``-token head common to all), each
    requested by its own arrival process over ``duration_s``: Poisson at a per-prefix rate
    (``arrival="poisson"``), a diurnal inhomogeneous Poisson rate (``"diurnal"``) or a bursty
    renewal process with gamma gaps (``"bursty"``); prefix popularity uniform or Zipf. Built for
    comparing the engine with closed-form models (:mod:`cacheresearch.analysis.analytic`).

All record their parameters in ``Workload.meta``. Token ids lie in ``[0, vocab_size)``;
timestamp tokens are ``vocab_size + i`` for request ``i`` (a reserved range, unique per request).
"""

from __future__ import annotations

import numpy as np

from cacheresearch.workload.keys import SALT_MODES, block_keys_jit, salt_values, split_uint64, to_uint64
from cacheresearch.workload.table import MAX_ARRIVAL_MS, Workload

__all__ = [
    "fleet_workload",
    "design_workload",
    "tenant_workload",
    "llmd_workload",
    "mmpp_parameters",
    "prefix_poisson_workload",
    "prefix_arrival_times",
    "tenant_probabilities",
    "poisson_arrivals_ms",
]

_TENANT_LAWS = ("uniform", "zipf")
#: Where a volatile token (a timestamp, unique per request) sits in the fleet scenario's prompt.
_LAYOUTS = ("stable", "timestamp_top", "timestamp_after_system", "timestamp_after_docs", "timestamp_end")
_ARRIVALS = ("poisson", "diurnal", "bursty")
_CHUNK = 8192  # requests hashed per JAX call (bounds host and device memory)


# ------------------------------------------------------------------------------- validation
def _int(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {v}")
    return v


def _float(name: str, v, lo: float, hi: float | None = None, *, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    v = float(v)
    bad = not np.isfinite(v) or (v <= lo if lo_open else v < lo) or (hi is not None and v > hi)
    if bad:
        rng = f"{'>' if lo_open else '>='} {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be finite and {rng}, got {v}")
    return v


def _choice(name: str, v, options) -> str:
    if v not in options:
        raise ValueError(f"{name} must be one of {options}, got {v!r}")
    return v


def _output_tokens(v, n: int) -> np.ndarray:
    a = np.asarray(v)
    if a.ndim == 0:
        a = np.full(n, a)
    if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or np.any(a < 0):
        raise ValueError(f"output_tokens must be a non-negative integer or an integer array of shape ({n},)")
    return a.astype(np.int64)


# ---------------------------------------------------------------------------------- pieces
def tenant_probabilities(n_tenants: int, law: str = "uniform", zipf_s: float = 1.0,
                         hot_share: float = 0.0) -> np.ndarray:
    """Probability of each tenant: ``uniform`` or ``zipf`` (``p_k ∝ (k + 1) ** -zipf_s``, tenant 0
    hottest), mixed with a point mass on tenant 0: ``p = hot_share * e_0 + (1 - hot_share) * p_law``.
    """
    n_tenants = _int("n_tenants", n_tenants, 1)
    _choice("tenant_law", law, _TENANT_LAWS)
    zipf_s = _float("zipf_s", zipf_s, 0.0)
    hot_share = _float("hot_share", hot_share, 0.0, 1.0)
    if law == "uniform":
        p = np.full(n_tenants, 1.0 / n_tenants)
    else:
        p = np.arange(1, n_tenants + 1, dtype=np.float64) ** -zipf_s
        p /= p.sum()
    p = (1.0 - hot_share) * p
    p[0] += hot_share
    return p / p.sum()


def poisson_arrivals_ms(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` Poisson-process arrival times (integer ms, floor), first gap included."""
    gaps_ms = rng.exponential(1000.0 / rate_per_s, size=n)
    t = np.floor(np.cumsum(gaps_ms)).astype(np.int64)
    if n and t[-1] > MAX_ARRIVAL_MS:
        raise ValueError(
            f"{n} requests at {rate_per_s}/s span about {t[-1] / 3.6e6:.1f} h, beyond the "
            f"{MAX_ARRIVAL_MS} ms the engine supports; raise rate_per_s or lower n_requests"
        )
    return t


def hash_rows(tokens: np.ndarray, bs: int, parent=None, start_token: int = 0, salt=None) -> np.ndarray:
    """uint64 ``[N, L // bs]`` keys of full-length rows ``tokens [N, L]``, chunked over rows.

    ``salt``: optional uint32 ``[N]`` cache salts (0 = none; vLLM's ``cache_salt``: it enters the
    extra keys of absolute block 0 only, so it matters only when ``start_token == 0``)."""
    n, length = tokens.shape
    out = np.empty((n, length // bs), dtype=np.uint64)
    if out.size == 0:
        return out
    for a in range(0, n, _CHUNK):
        b = min(n, a + _CHUNK)
        m = _rows_bucket(b - a)  # padded to a power of two: one compiled program per bucket, not per size
        par = None if parent is None else (_pad_rows(parent[0][a:b], m), _pad_rows(parent[1][a:b], m))
        sa = None if salt is None else _pad_rows(np.asarray(salt[a:b], dtype=np.uint32), m)
        hi, lo, _ = block_keys_jit(
            _pad_rows(tokens[a:b], m), np.full(m, length, dtype=np.int32), block_size=bs, parent=par,
            start_token=start_token, cache_salt=sa,
        )
        out[a:b] = to_uint64(np.asarray(hi)[: b - a], np.asarray(lo)[: b - a])
    return out


def _rows_bucket(n: int) -> int:
    """The row count a hashing call is padded to: the next power of two (at least 64, at most ``_CHUNK``).
    Rows are hashed independently, so padding rows change no key; it bounds the distinct programs
    compiled over a sweep's streams to a few instead of one per stream size."""
    return min(_CHUNK, max(64, 1 << max(int(n) - 1, 0).bit_length()))


def _pad_rows(x: np.ndarray, m: int) -> np.ndarray:
    x = np.asarray(x)
    if x.shape[0] == m:
        return x
    return np.concatenate([x, np.zeros((m - x.shape[0],) + x.shape[1:], dtype=x.dtype)])


def _prefix_suffix_keys(prefix: np.ndarray, which: np.ndarray, tail: np.ndarray, bs: int, salt=None) -> np.ndarray:
    """Keys ``[N, nb]`` of prompts ``prefix[which[i]] ++ tail[i]``, hashing each prefix once.

    The prefix's full blocks are hashed per row of ``prefix`` (one per tenant); its leftover
    tokens (``P % bs``) are prepended to each tail, which is hashed as a continuation of the
    chain from the prefix's last key. ``salt``: optional cache salt per row of ``prefix``.
    """
    p_full = (prefix.shape[1] // bs) * bs
    pre = hash_rows(prefix[:, :p_full], bs, salt=salt)  # [T, p_full // bs]
    return extend_keys(pre, prefix[:, p_full:], which, tail, bs, salt=salt)


def extend_keys(pre: np.ndarray, rest: np.ndarray, which: np.ndarray, tail: np.ndarray, bs: int,
                 salt=None) -> np.ndarray:
    """Keys ``[N, n_pre + n_tail]`` of prompts ``head[which[i]] ++ tail[i]`` for already keyed heads.

    Head ``r`` is given by ``pre[r]`` (uint64 keys of its ``n_pre`` full blocks) and ``rest[r]`` (its
    ``len(head) - n_pre * bs < bs`` leftover tokens); the leftover is prepended to each tail, which
    is hashed as a continuation of the chain from the head's last key.
    """
    n_pre = pre.shape[1]
    if rest.shape[1]:
        tail = np.concatenate([rest[which], tail], axis=1)
    n = which.shape[0]
    n_tail = tail.shape[1] // bs
    keys = np.empty((n, n_pre + n_tail), dtype=np.uint64)
    keys[:, :n_pre] = pre[which]
    if n_tail:
        parent = None
        if n_pre:
            hi, lo = split_uint64(pre[:, -1])
            parent = (hi[which], lo[which])
        sa = None if (salt is None or n_pre) else np.asarray(salt)[which]  # block 0 lies in the tail
        keys[:, n_pre:] = hash_rows(tail, bs, parent=parent, start_token=n_pre * bs, salt=sa)
    return keys


def _csr_workload(keys_2d, *, arrival_ms, input_tokens, output_tokens, tenant, bs, name, meta) -> Workload:
    n, nb = keys_2d.shape
    return Workload(
        arrival_ms=arrival_ms,
        input_tokens=np.full(n, input_tokens, dtype=np.int64),
        output_tokens=output_tokens,
        tenant=tenant,
        keys=keys_2d.reshape(-1),
        offsets=np.arange(n + 1, dtype=np.int64) * nb,
        block_tokens=bs,
        name=name,
        meta=meta,
    )


def _output_meta(v):
    return int(v) if np.ndim(v) == 0 else "per-request array"


def random_tokens(rng: np.random.Generator, shape, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=shape, dtype=np.int32)


# ------------------------------------------------------------------------------------ fleet
def fleet_parts(
    *, n_tenants, system_tokens, doc_tokens, user_tokens, n_requests, tenant_law, zipf_s, layout,
    rate_per_s, seed, vocab_size,
):
    """Token pieces and per-request draws of :func:`fleet_workload` (shared with the tests)."""
    spawn = np.random.SeedSequence(seed).spawn(5)
    r_sys, r_doc, r_user, r_ten, r_arr = (np.random.default_rng(s) for s in spawn)
    system = random_tokens(r_sys, (system_tokens,), vocab_size)
    docs = random_tokens(r_doc, (n_tenants, doc_tokens), vocab_size)
    user = random_tokens(r_user, (n_requests, user_tokens), vocab_size)
    tenant = r_ten.choice(n_tenants, size=n_requests, p=tenant_probabilities(n_tenants, tenant_law, zipf_s))
    if rate_per_s is None:
        arrival = np.arange(n_requests, dtype=np.int64)
    else:
        arrival = poisson_arrivals_ms(n_requests, rate_per_s, r_arr)
    stamp = None
    if layout != "stable":
        stamp = (vocab_size + np.arange(n_requests, dtype=np.int64)).astype(np.int32)
    return dict(system=system, docs=docs, user=user, tenant=tenant.astype(np.int32), arrival=arrival, stamp=stamp)


def fleet_workload(
    *,
    n_tenants: int = 8,
    system_tokens: int = 1200,
    doc_tokens: int = 800,
    user_tokens: int = 60,
    n_requests: int = 2000,
    block_tokens: int = 16,
    tenant_law: str = "uniform",
    zipf_s: float = 1.0,
    layout: str = "stable",
    rate_per_s: float | None = None,
    output_tokens=0,
    seed: int = 0,
    vocab_size: int = 128_256,
    salt: str = "none",
    name: str = "",
) -> Workload:
    """The fleet scenario: shared system prompt + tenant document + unique user suffix.

    Args:
      n_tenants: number of tenants (each with its own ``doc_tokens``-token document).
      system_tokens, doc_tokens, user_tokens: lengths of the three prompt parts.
      n_requests: number of requests.
      block_tokens: tokens per cache block.
      tenant_law: ``"uniform"`` or ``"zipf"`` (tenant 0 hottest, exponent ``zipf_s``).
      layout: ``"stable"``, or a volatile token unique to each request: ``"timestamp_top"`` (before
        everything), ``"timestamp_after_system"`` (between the system prompt and the document),
        ``"timestamp_after_docs"`` (before the user suffix) or ``"timestamp_end"`` (after it).
      rate_per_s: Poisson arrival rate; ``None`` = one request per ms (``arrival_ms = arange``).
      output_tokens: non-negative int, or int array ``[n_requests]``.
      seed: seeds every draw (tokens, tenants, arrivals).
      vocab_size: token ids are drawn from ``[0, vocab_size)``.
      salt: ``"none"`` or ``"per_tenant"``: a vLLM ``cache_salt`` per tenant
        (:func:`~cacheresearch.workload.keys.salt_values`) in the first block's extra keys, so
        tenants share no block at all (not even the system prompt).
    """
    salt = _choice("salt", salt, ("none", "per_tenant"))
    n_tenants = _int("n_tenants", n_tenants, 1)
    system_tokens = _int("system_tokens", system_tokens, 0)
    doc_tokens = _int("doc_tokens", doc_tokens, 0)
    user_tokens = _int("user_tokens", user_tokens, 0)
    n_requests = _int("n_requests", n_requests, 0)
    block_tokens = _int("block_tokens", block_tokens, 1)
    tenant_law = _choice("tenant_law", tenant_law, _TENANT_LAWS)
    zipf_s = _float("zipf_s", zipf_s, 0.0)
    layout = _choice("layout", layout, _LAYOUTS)
    if rate_per_s is not None:
        rate_per_s = _float("rate_per_s", rate_per_s, 0.0, lo_open=True)
    seed = _int("seed", seed, 0)
    vocab_size = _int("vocab_size", vocab_size, 1, np.iinfo(np.int32).max - n_requests)
    out = _output_tokens(output_tokens, n_requests)

    parts = fleet_parts(
        n_tenants=n_tenants, system_tokens=system_tokens, doc_tokens=doc_tokens, user_tokens=user_tokens,
        n_requests=n_requests, tenant_law=tenant_law, zipf_s=zipf_s, layout=layout,
        rate_per_s=rate_per_s, seed=seed, vocab_size=vocab_size,
    )
    prefix = np.concatenate([np.broadcast_to(parts["system"], (n_tenants, system_tokens)), parts["docs"]], axis=1)
    tenant = parts["tenant"]
    tsalt = salt_values("tenant", np.arange(n_tenants)) if salt == "per_tenant" else None
    if layout == "stable":
        keys = _prefix_suffix_keys(prefix, tenant, parts["user"], block_tokens, salt=tsalt)
    else:  # a token unique to each request: hash whole prompts
        prompt_len = 1 + system_tokens + doc_tokens + user_tokens
        keys = np.empty((n_requests, prompt_len // block_tokens), dtype=np.uint64)
        at = {"timestamp_top": 0, "timestamp_after_system": system_tokens,
              "timestamp_after_docs": system_tokens + doc_tokens}.get(layout, system_tokens + doc_tokens + user_tokens)
        for a in range(0, n_requests, _CHUNK):
            b = min(n_requests, a + _CHUNK)
            body = np.concatenate([prefix[tenant[a:b]], parts["user"][a:b]], axis=1)
            full = np.concatenate([body[:, :at], parts["stamp"][a:b, None], body[:, at:]], axis=1)
            keys[a:b] = hash_rows(full, block_tokens, salt=None if tsalt is None else tsalt[tenant[a:b]])
    input_tokens = system_tokens + doc_tokens + user_tokens + (layout != "stable")
    meta = dict(
        generator="fleet_workload",
        n_tenants=n_tenants,
        system_tokens=system_tokens,
        doc_tokens=doc_tokens,
        user_tokens=user_tokens,
        n_requests=n_requests,
        block_tokens=block_tokens,
        tenant_law=tenant_law,
        zipf_s=zipf_s,
        layout=layout,
        rate_per_s=rate_per_s,
        output_tokens=_output_meta(output_tokens),
        seed=seed,
        vocab_size=vocab_size,
        salt=salt,
    )
    return _csr_workload(
        keys, arrival_ms=parts["arrival"], input_tokens=input_tokens, output_tokens=out, tenant=tenant,
        bs=block_tokens, name=name or f"fleet-{layout}-{tenant_law}", meta=meta,
    )


# ----------------------------------------------------------------------------------- design
def _design_parts(*, n_tenants, prefix_tokens, suffix_tokens, n_requests, rate_per_s, hot_share, tenant_law, zipf_s,
                  seed, vocab_size):
    """Token pieces and per-request draws of :func:`design_workload` (shared with the tests)."""
    r_pre, r_suf, r_ten, r_arr = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    prefix = random_tokens(r_pre, (n_tenants, prefix_tokens), vocab_size)
    suffix = random_tokens(r_suf, (n_requests, suffix_tokens), vocab_size)
    p = tenant_probabilities(n_tenants, tenant_law, zipf_s, hot_share)
    tenant = r_ten.choice(n_tenants, size=n_requests, p=p).astype(np.int32)
    arrival = poisson_arrivals_ms(n_requests, rate_per_s, r_arr)
    return dict(prefix=prefix, suffix=suffix, tenant=tenant, arrival=arrival, p=p)


def design_workload(
    *,
    n_tenants: int = 200,
    prefix_tokens: int = 10_000,
    suffix_tokens: int = 200,
    n_requests: int = 50_000,
    duration_s: float = 86_400.0,
    rate_per_s: float | None = None,
    hot_share: float = 0.0,
    tenant_law: str = "uniform",
    zipf_s: float = 1.0,
    block_tokens: int = 16,
    output_tokens=0,
    seed: int = 0,
    vocab_size: int = 128_256,
    name: str = "",
) -> Workload:
    """The design scenario: per-tenant long prefixes, unique suffixes, Poisson arrivals over a day.

    Args:
      n_tenants: tenants, each with its own ``prefix_tokens``-token prefix.
      suffix_tokens: fresh tokens appended per request.
      n_requests: number of requests.
      duration_s: the arrival rate defaults to ``n_requests / duration_s`` per second.
      rate_per_s: explicit Poisson rate (overrides ``duration_s``).
      hot_share: extra share of traffic sent to tenant 0: ``P(tenant 0) = hot_share +
        (1 - hot_share) * p_law(0)``; 0 = no hot tenant, 1 = every request to tenant 0.
      tenant_law, zipf_s: ``"uniform"`` or ``"zipf"`` (tenant 0 hottest).
      block_tokens, output_tokens, seed, vocab_size: as in :func:`fleet_workload`.
    """
    n_tenants = _int("n_tenants", n_tenants, 1)
    prefix_tokens = _int("prefix_tokens", prefix_tokens, 0)
    suffix_tokens = _int("suffix_tokens", suffix_tokens, 0)
    n_requests = _int("n_requests", n_requests, 0)
    duration_s = _float("duration_s", duration_s, 0.0, lo_open=True)
    if rate_per_s is None:
        if n_requests == 0:
            rate_per_s = 1.0
        else:
            rate_per_s = n_requests / duration_s
    rate_per_s = _float("rate_per_s", rate_per_s, 0.0, lo_open=True)
    hot_share = _float("hot_share", hot_share, 0.0, 1.0)
    tenant_law = _choice("tenant_law", tenant_law, _TENANT_LAWS)
    zipf_s = _float("zipf_s", zipf_s, 0.0)
    block_tokens = _int("block_tokens", block_tokens, 1)
    seed = _int("seed", seed, 0)
    vocab_size = _int("vocab_size", vocab_size, 1, np.iinfo(np.int32).max)
    out = _output_tokens(output_tokens, n_requests)

    parts = _design_parts(
        n_tenants=n_tenants, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, n_requests=n_requests,
        rate_per_s=rate_per_s, hot_share=hot_share, tenant_law=tenant_law, zipf_s=zipf_s, seed=seed,
        vocab_size=vocab_size,
    )
    keys = _prefix_suffix_keys(parts["prefix"], parts["tenant"], parts["suffix"], block_tokens)
    meta = dict(
        generator="design_workload",
        n_tenants=n_tenants,
        prefix_tokens=prefix_tokens,
        suffix_tokens=suffix_tokens,
        n_requests=n_requests,
        duration_s=duration_s,
        rate_per_s=rate_per_s,
        hot_share=hot_share,
        tenant_law=tenant_law,
        zipf_s=zipf_s,
        block_tokens=block_tokens,
        output_tokens=_output_meta(output_tokens),
        seed=seed,
        vocab_size=vocab_size,
        tenant0_share=float(parts["p"][0]),
    )
    return _csr_workload(
        keys, arrival_ms=parts["arrival"], input_tokens=prefix_tokens + suffix_tokens, output_tokens=out,
        tenant=parts["tenant"], bs=block_tokens, name=name or f"design-{tenant_law}", meta=meta,
    )


# ---------------------------------------------------------------------------------- routing
def mmpp_parameters(burst_ratio: float = 10.0, burst_high_share: float = 0.1, burst_mean_high_s: float = 60.0):
    """``(burst_low, burst_high, burst_mean_low_s)`` of the two-state MMPP of :func:`tenant_workload`
    (``arrival="bursty"``); the long-run mean rate is 1 (in units of ``rate_per_s``).

    Two-state Markov-modulated Poisson process (MMPP), *not* the gamma renewal process that
    ``"bursty"`` means in :func:`prefix_poisson_workload`. A low and a high state with Poisson
    rates ``rate_per_s * burst_low`` and ``rate_per_s * burst_high``; the state is held for an
    exponential time of mean ``burst_mean_low_s`` / ``burst_mean_high_s``, then switches; the
    initial state is drawn from the stationary law. The free arguments are ``burst_ratio`` =
    ``rho`` = ``burst_high / burst_low``, ``burst_high_share`` = ``h``, the long-run fraction of
    time spent in the high state, and ``burst_mean_high_s``; the rest follows:

    - the stationary probability of the high state of an alternating process is
      ``m_high / (m_high + m_low)``; setting it to ``h`` gives
      ``burst_mean_low_s = burst_mean_high_s * (1 - h) / h``;
    - the long-run mean rate is ``rate_per_s * (h * burst_high + (1 - h) * burst_low)``; setting
      it to ``rate_per_s`` with ``burst_high = rho * burst_low`` gives
      ``burst_low = 1 / (1 + h * (rho - 1))`` and ``burst_high = rho * burst_low``.

    Defaults (``rho = 10``, ``h = 0.1``, 60 s): ``burst_low = 1 / 1.9 ~ 0.526``,
    ``burst_high ~ 5.26``, ``burst_mean_low_s = 540``: a 1-minute burst at 10x the quiet rate
    about every 10 minutes. ``burst_ratio = 1`` is a Poisson process.
    """
    rho = _float("burst_ratio", burst_ratio, 1.0)
    h = _float("burst_high_share", burst_high_share, 0.0, 1.0, lo_open=True)
    if h >= 1.0:
        raise ValueError(f"burst_high_share must be in (0, 1) (the process must visit the low state), got {h}")
    m_high = _float("burst_mean_high_s", burst_mean_high_s, 0.0, lo_open=True)
    low = 1.0 / (1.0 + h * (rho - 1.0))
    return low, rho * low, m_high * (1.0 - h) / h


def _mmpp_times(rate_low, rate_high, mean_low_s, mean_high_s, duration_s, rng) -> np.ndarray:
    """Arrival times (float s, unsorted) of a two-state MMPP on ``[0, duration_s)``, started stationary."""
    p_high = mean_high_s / (mean_low_s + mean_high_s)
    high = bool(rng.random() < p_high)
    starts, stops, highs = [], [], []
    t0 = 0.0
    while t0 < duration_s:
        k = 2 * (int((duration_s - t0) / (mean_low_s + mean_high_s)) + 32)  # sojourns, states alternate
        is_high = (np.arange(k) % 2 == 0) == high
        dur = rng.exponential(np.where(is_high, mean_high_s, mean_low_s))
        stop = t0 + np.cumsum(dur)
        start = stop - dur
        keep = start < duration_s
        starts.append(start[keep])
        stops.append(np.minimum(stop[keep], duration_s))
        highs.append(is_high[keep])
        t0, high = float(stop[-1]), not bool(is_high[-1])
    start, stop, is_high = (np.concatenate(x) for x in (starts, stops, highs))
    lam = np.where(is_high, rate_high, rate_low)
    counts = rng.poisson(lam * (stop - start))
    seg = np.repeat(np.arange(start.shape[0]), counts)
    return start[seg] + rng.uniform(size=seg.shape[0]) * (stop - start)[seg]


def _tenant_parts(*, n_tenants, prefix_tokens, users_per_tenant, user_tokens, query_tokens, duration_s, rate_per_s,
                  arrival, hot_share, tenant_law, zipf_s, burst, diurnal_amplitude, diurnal_period_s, seed,
                  vocab_size, system_tokens=0):
    """Token pieces and per-request draws of :func:`tenant_workload` (shared with the tests).

    ``burst`` is ``(burst_low, burst_high, burst_mean_low_s, burst_mean_high_s)``. Returns ``prefix``
    ``[T, S + P]`` (the shared ``system_tokens``-token system prompt, then the tenant's own tokens),
    ``user_ctx`` ``[T * U, Ut]`` (row ``t * U + u`` = user ``u`` of tenant ``t``), ``query``
    ``[N, Q]``, ``tenant`` and ``user`` (``[N]``, the user's row in ``user_ctx``), ``t`` (arrival
    times, float s, sorted) and ``p`` (tenant probabilities).
    """
    r_arr, r_pre, r_usr, r_qry, r_ten, r_pick = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)
    )
    if arrival == "bursty":
        low, high, m_low, m_high = burst
        t = _mmpp_times(rate_per_s * low, rate_per_s * high, m_low, m_high, duration_s, r_arr)
    else:
        t, _ = prefix_arrival_times(
            np.array([rate_per_s]), duration_s, r_arr, arrival=arrival, diurnal_amplitude=diurnal_amplitude,
            diurnal_period_s=diurnal_period_s,
        )
    t = np.sort(t)
    n = int(t.shape[0])
    prefix = random_tokens(r_pre, (n_tenants, prefix_tokens), vocab_size)
    if system_tokens:  # its own stream (the 7th child), so the other draws do not move
        r_sys = np.random.default_rng(np.random.SeedSequence(seed).spawn(7)[6])
        system = random_tokens(r_sys, (system_tokens,), vocab_size)
        prefix = np.concatenate([np.broadcast_to(system, (n_tenants, system_tokens)), prefix], axis=1)
    user_ctx = random_tokens(r_usr, (n_tenants * users_per_tenant, user_tokens), vocab_size)
    query = random_tokens(r_qry, (n, query_tokens), vocab_size)
    p = tenant_probabilities(n_tenants, tenant_law, zipf_s, hot_share)
    tenant = r_ten.choice(n_tenants, size=n, p=p).astype(np.int32)
    user = tenant.astype(np.int64) * users_per_tenant + r_pick.integers(0, users_per_tenant, size=n)
    return dict(prefix=prefix, user_ctx=user_ctx, query=query, tenant=tenant, user=user, t=t, p=p)


def _tenant_keys(prefix, user_ctx, users_per_tenant, user, query, bs, salt: str = "none") -> np.ndarray:
    """Keys ``[N, (P + Ut + Q) // bs]`` of ``prefix[tenant] ++ user_ctx[user] ++ query``: each tenant
    prefix hashed once, each user context once (as its continuation), each query as a continuation.
    ``salt``: ``per_tenant`` salts each tenant's prefix, ``per_user`` each user's (the prefix is then
    hashed once per user: salted chains share nothing)."""
    n_tenants, p_len = prefix.shape
    u_len = user_ctx.shape[1]
    owner = np.repeat(np.arange(n_tenants), users_per_tenant)
    if salt == "per_user":
        rows = np.arange(owner.shape[0])
        head = _prefix_suffix_keys(prefix[owner], rows, user_ctx, bs, salt=salt_values("user", rows))
    else:
        tsalt = salt_values("tenant", np.arange(n_tenants)) if salt == "per_tenant" else None
        head = _prefix_suffix_keys(prefix, owner, user_ctx, bs, salt=tsalt)  # [T * U, (P + Ut) // bs]
    r = (p_len + u_len) % bs  # leftover tokens of prefix ++ user context, carried into the query
    if r:
        last = prefix[:, p_len - min(r, p_len):]
        rest = np.concatenate([last[owner], user_ctx], axis=1)[:, -r:]
    else:
        rest = np.zeros((owner.shape[0], 0), dtype=prefix.dtype)
    return extend_keys(head, rest, user, query, bs)


def tenant_workload(
    *,
    n_tenants: int = 150,
    prefix_tokens: int = 6000,
    users_per_tenant: int = 1,
    user_tokens: int = 0,
    query_tokens: int = 1200,
    rate_per_s: float = 10.0,
    duration_s: float = 180.0,
    arrival: str = "poisson",
    tenant_law: str = "uniform",
    zipf_s: float = 1.0,
    hot_share: float = 0.0,
    burst_ratio: float = 10.0,
    burst_high_share: float = 0.1,
    burst_mean_high_s: float = 60.0,
    diurnal_amplitude: float = 0.8,
    diurnal_period_s: float = 86_400.0,
    block_tokens: int = 16,
    output_tokens=0,
    seed: int = 0,
    vocab_size: int = 128_256,
    system_tokens: int = 0,
    salt: str = "none",
    name: str = "",
) -> Workload:
    """The routing experiments: tenant prefixes, per-user contexts, fresh queries, time-varying arrivals.

    Prompt of a request = its tenant's ``prefix_tokens``-token prefix + the ``user_tokens``-token
    context of one of the tenant's ``users_per_tenant`` users (drawn uniformly) + ``query_tokens``
    fresh tokens. Block keys are chained over the whole prompt (only full blocks are keyed), so
    requests of one tenant share the prefix's blocks, requests of one user also the blocks of the
    user context, and nothing after the first block that holds a query token is shared.
    ``tenant`` is the tenant index. Arrivals lie in ``[0, duration_s)`` with long-run mean rate
    ``rate_per_s`` (all tenants together); each request's tenant is drawn independently of its time.

    ``arrival="poisson"``
        Homogeneous Poisson process of rate ``rate_per_s``.
    ``arrival="diurnal"``
        Inhomogeneous Poisson of rate ``rate_per_s * (1 - diurnal_amplitude * cos(2 pi t / diurnal_period_s))``
        (thinning; :func:`prefix_arrival_times`' profile, from its trough; mean ``rate_per_s`` over periods).
    ``arrival="bursty"``
        Two-state Markov-modulated Poisson process (MMPP), *not* the gamma renewal process that
        ``"bursty"`` means in :func:`prefix_poisson_workload`: its states, rates and the derivation of
        its parameters are :func:`mmpp_parameters`'s.

    Args:
      n_tenants: tenants, each with its own ``prefix_tokens``-token prefix (random tokens).
      users_per_tenant, user_tokens: users per tenant, each with its own ``user_tokens``-token
        context after the tenant prefix (``user_tokens=0``: users add nothing to the prompt).
      query_tokens: fresh tokens appended per request.
      rate_per_s, duration_s, arrival: the arrival process (above); ``duration_s * 1000`` must stay
        within the engine's int32 millisecond bound (``MAX_ARRIVAL_MS``).
      tenant_law, zipf_s, hot_share: tenant popularity, as :func:`tenant_probabilities`.
      burst_ratio, burst_high_share, burst_mean_high_s: the MMPP of ``arrival="bursty"``.
      diurnal_amplitude, diurnal_period_s: the profile of ``arrival="diurnal"``.
      block_tokens, seed, vocab_size: as in :func:`fleet_workload`; ``seed`` fixes everything (the count too).
      output_tokens: non-negative int, or int array ``[n_requests]`` (generate once to learn the count).
      system_tokens: a system prompt of this many tokens, the same for every tenant, before each
        tenant's prefix (0 = none; its tokens come from their own random stream, so the other draws
        are those of ``system_tokens=0``).
      salt: who may share a cached block (:data:`~cacheresearch.workload.keys.SALT_MODES`): ``none``,
        ``per_tenant`` (a vLLM ``cache_salt`` per organisation) or ``per_user`` (one per user); the
        salt enters the first block's extra keys (every later key differs); name: default ``tenant-{arrival}``.

    ``arrival_ms = floor(t * 1000)`` (int64, sorted). ``meta``: every argument, the derived MMPP values,
    ``n_requests``, ``tenant0_share`` (probability and ``_realised``), ``mean_rate_per_s`` (realised).
    """
    n_tenants, users_per_tenant, block_tokens = (_int(k, v, 1) for k, v in (
        ("n_tenants", n_tenants), ("users_per_tenant", users_per_tenant), ("block_tokens", block_tokens)))
    prefix_tokens, system_tokens, user_tokens, query_tokens, seed = (_int(k, v, 0) for k, v in (
        ("prefix_tokens", prefix_tokens), ("system_tokens", system_tokens), ("user_tokens", user_tokens),
        ("query_tokens", query_tokens), ("seed", seed)))
    salt = _choice("salt", salt, SALT_MODES)
    rate_per_s, duration_s = (_float(k, v, 0.0, lo_open=True) for k, v in (("rate_per_s", rate_per_s),
                                                                          ("duration_s", duration_s)))
    if duration_s * 1000.0 > MAX_ARRIVAL_MS:
        raise ValueError(f"duration_s must be at most {MAX_ARRIVAL_MS / 1000:.0f} s (the engine's int32 ms bound)")
    arrival = _choice("arrival", arrival, _ARRIVALS)
    tenant_law = _choice("tenant_law", tenant_law, _TENANT_LAWS)
    zipf_s = _float("zipf_s", zipf_s, 0.0)
    hot_share = _float("hot_share", hot_share, 0.0, 1.0)
    burst_low, burst_high, burst_mean_low_s = mmpp_parameters(burst_ratio, burst_high_share, burst_mean_high_s)
    burst_ratio, burst_high_share, burst_mean_high_s = map(float, (burst_ratio, burst_high_share, burst_mean_high_s))
    diurnal_amplitude = _float("diurnal_amplitude", diurnal_amplitude, 0.0, 1.0)
    diurnal_period_s = _float("diurnal_period_s", diurnal_period_s, 0.0, lo_open=True)
    vocab_size = _int("vocab_size", vocab_size, 1, np.iinfo(np.int32).max)
    if np.ndim(output_tokens) == 0:
        _output_tokens(output_tokens, 1)  # fail before the work (arrays are checked once N is known)

    parts = _tenant_parts(
        n_tenants=n_tenants, prefix_tokens=prefix_tokens, users_per_tenant=users_per_tenant,
        user_tokens=user_tokens, query_tokens=query_tokens, duration_s=duration_s, rate_per_s=rate_per_s,
        arrival=arrival, hot_share=hot_share, tenant_law=tenant_law, zipf_s=zipf_s,
        burst=(burst_low, burst_high, burst_mean_low_s, burst_mean_high_s),
        diurnal_amplitude=diurnal_amplitude, diurnal_period_s=diurnal_period_s, seed=seed, vocab_size=vocab_size,
        system_tokens=system_tokens,
    )
    n = int(parts["t"].shape[0])
    out = _output_tokens(output_tokens, n)
    keys = _tenant_keys(parts["prefix"], parts["user_ctx"], users_per_tenant, parts["user"], parts["query"],
                        block_tokens, salt=salt)
    arrival_ms = np.floor(parts["t"] * 1000.0).astype(np.int64)
    tenant = parts["tenant"]
    meta = dict(
        generator="tenant_workload", n_tenants=n_tenants, prefix_tokens=prefix_tokens, system_tokens=system_tokens,
        salt=salt, users_per_tenant=users_per_tenant, user_tokens=user_tokens, query_tokens=query_tokens,
        rate_per_s=rate_per_s, duration_s=duration_s, arrival=arrival, tenant_law=tenant_law, zipf_s=zipf_s,
        hot_share=hot_share, burst_ratio=burst_ratio, burst_high_share=burst_high_share,
        burst_mean_high_s=burst_mean_high_s, burst_low=burst_low, burst_high=burst_high,
        burst_mean_low_s=burst_mean_low_s, diurnal_amplitude=diurnal_amplitude, diurnal_period_s=diurnal_period_s,
        block_tokens=block_tokens, output_tokens=_output_meta(output_tokens), seed=seed, vocab_size=vocab_size,
        n_requests=n, tenant0_share=float(parts["p"][0]),
        tenant0_share_realised=float(np.mean(tenant == 0)) if n else 0.0, mean_rate_per_s=n / duration_s,
    )
    return _csr_workload(
        keys, arrival_ms=arrival_ms, input_tokens=system_tokens + prefix_tokens + user_tokens + query_tokens,
        output_tokens=out,
        tenant=tenant, bs=block_tokens, name=name or f"tenant-{arrival}", meta=meta,
    )


LLMD_BLOG = "llm-d blog 2025-09-24, 'KV-Cache Wins You Can See' (precise prefix-cache aware scheduling)"


def llmd_workload(qps: float, duration_s: float = 180.0, seed: int = 0, **kw) -> Workload:
    """The llm-d benchmark workload (:data:`LLMD_BLOG`): 150 customers, 6,000-token prefixes.

    From the blog: 150 customers (tenants), each with a 6,000-token shared prefix; 5 users per
    customer; 1,200-token queries; the load given as ``qps``. vLLM's 16-token blocks.

    Assumptions of this model (not given by the blog): arrivals are Poisson at ``qps``; customers
    are equally popular (``tenant_law="uniform"``); users have no context of their own
    (``user_tokens=0``, so the 5 users of a customer send identical prefixes and differ only in
    their queries); queries are fresh random tokens, shared with no other request; every request
    asks for 256 output tokens; the run lasts ``duration_s`` (180 s by default).

    ``**kw`` overrides any other argument of :func:`tenant_workload` (e.g. ``user_tokens``,
    ``arrival``, ``output_tokens``, ``hot_share``); the rate is ``qps``, not ``rate_per_s``.
    ``meta["scenario"]`` names the source.
    """
    if "rate_per_s" in kw:
        raise ValueError("llmd_workload takes the rate as qps, not rate_per_s")
    qps = _float("qps", qps, 0.0, lo_open=True)
    args = dict(
        n_tenants=150, prefix_tokens=6000, users_per_tenant=5, user_tokens=0, query_tokens=1200,
        arrival="poisson", tenant_law="uniform", block_tokens=16, output_tokens=256, name=f"llmd-{qps:g}qps",
    )
    args.update(kw)
    w = tenant_workload(rate_per_s=qps, duration_s=duration_s, seed=seed, **args)
    w.meta["scenario"] = LLMD_BLOG
    return w


# ------------------------------------------------------------------------- prefix processes
def _prefix_rates_per_s(n_prefixes, rate_per_hour, popularity, zipf_s) -> np.ndarray:
    r = np.asarray(rate_per_hour, dtype=np.float64)
    if r.ndim == 0:
        r = _float("rate_per_hour", float(r), 0.0, lo_open=True)
        p = tenant_probabilities(n_prefixes, popularity, zipf_s)
        return n_prefixes * r * p / 3600.0
    if r.shape != (n_prefixes,) or np.any(~np.isfinite(r)) or np.any(r < 0):
        raise ValueError(f"rate_per_hour must be a positive number or a non-negative array of shape ({n_prefixes},)")
    return r / 3600.0


def prefix_arrival_times(
    rates_per_s: np.ndarray,
    duration_s: float,
    rng: np.random.Generator,
    *,
    arrival: str = "poisson",
    diurnal_amplitude: float = 0.8,
    diurnal_period_s: float = 86_400.0,
    burst_cv: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (float seconds, sorted) and prefix index of every request on ``[0, duration_s)``.

    ``poisson``: prefix ``k`` is a Poisson process of rate ``rates_per_s[k]`` (a Poisson count, then
    uniform times). ``diurnal``: an inhomogeneous Poisson process of rate
    ``rates_per_s[k] * (1 - diurnal_amplitude * cos(2 pi t / diurnal_period_s))`` (by thinning; the
    day starts at its trough; :func:`cacheresearch.analysis.analytic.diurnal_rate` is the same profile).
    ``bursty``: a renewal process with gamma gaps of mean ``1 / rate`` and coefficient of variation
    ``burst_cv`` (> 1 is burstier than Poisson), started at time 0 (first arrival after one gap).
    """
    _choice("arrival", arrival, _ARRIVALS)
    lam = np.asarray(rates_per_s, dtype=np.float64)
    D = float(duration_s)
    P = lam.shape[0]
    if arrival in ("poisson", "diurnal"):
        a = _float("diurnal_amplitude", diurnal_amplitude, 0.0, 1.0) if arrival == "diurnal" else 0.0
        counts = rng.poisson(lam * (1.0 + a) * D)
        pref = np.repeat(np.arange(P, dtype=np.int64), counts)
        t = rng.uniform(0.0, D, size=pref.shape[0])
        if arrival == "diurnal":
            _float("diurnal_period_s", diurnal_period_s, 0.0, lo_open=True)
            keep = rng.uniform(size=t.shape[0]) * (1.0 + a) < 1.0 - a * np.cos(2.0 * np.pi * t / diurnal_period_s)
            t, pref = t[keep], pref[keep]
    else:
        cv = _float("burst_cv", burst_cv, 0.0, lo_open=True)
        shape = 1.0 / cv**2
        ts, ps = [], []
        for k in range(P):
            if lam[k] <= 0:
                continue
            scale = 1.0 / (lam[k] * shape)
            m = int(lam[k] * D + 6.0 * cv * np.sqrt(lam[k] * D) + 16)
            cum = np.cumsum(rng.gamma(shape, scale, size=m))
            while cum[-1] < D:
                cum = np.concatenate([cum, cum[-1] + np.cumsum(rng.gamma(shape, scale, size=m))])
            cum = cum[cum < D]
            ts.append(cum)
            ps.append(np.full(cum.shape[0], k, dtype=np.int64))
        t = np.concatenate(ts) if ts else np.zeros(0)
        pref = np.concatenate(ps) if ps else np.zeros(0, dtype=np.int64)
    order = np.lexsort((pref, t))
    return t[order], pref[order]


def prefix_poisson_workload(
    *,
    n_prefixes: int = 200,
    prefix_tokens: int = 10_000,
    rate_per_hour=50_000 / 200 / 24,
    duration_s: float = 86_400.0,
    suffix_tokens: int = 0,
    shared_tokens: int = 0,
    block_tokens: int = 16,
    arrival: str = "poisson",
    popularity: str = "uniform",
    zipf_s: float = 1.0,
    diurnal_amplitude: float = 0.8,
    diurnal_period_s: float = 86_400.0,
    burst_cv: float = 3.0,
    output_tokens: int = 0,
    seed: int = 0,
    vocab_size: int = 128_256,
    name: str = "",
) -> Workload:
    """Prefixes requested by independent arrival processes: the setting of the closed-form models.

    Prompt of a request for prefix ``k`` = [``shared_tokens`` common to every prefix] + prefix ``k``'s
    own ``prefix_tokens`` tokens + ``suffix_tokens`` fresh tokens. ``tenant`` is the prefix index.

    Args:
      n_prefixes: number of prefixes.
      prefix_tokens: tokens of each prefix (after the shared head).
      rate_per_hour: mean requests per hour *per prefix* (the average over prefixes; with
        ``popularity="zipf"`` prefix ``k`` gets ``n_prefixes * rate_per_hour * p_k``), or an array of
        per-prefix rates (requests per hour), which overrides ``popularity``. Default: the seed's
        50,000 requests/day over 200 prefixes.
      duration_s: arrivals lie in ``[0, duration_s)``.
      arrival: ``"poisson"``, ``"diurnal"`` or ``"bursty"`` (see :func:`prefix_arrival_times`).
      popularity, zipf_s: ``"uniform"`` or ``"zipf"`` (prefix 0 hottest, ``p_k ∝ (k + 1) ** -zipf_s``).
      diurnal_amplitude, diurnal_period_s, burst_cv: shape of the diurnal and bursty processes.
      block_tokens, output_tokens, seed, vocab_size: as in :func:`fleet_workload`.

    ``meta`` records the arguments, ``duration_s`` and ``prefix_rate_per_s`` (the per-prefix mean rates).
    """
    n_prefixes = _int("n_prefixes", n_prefixes, 1)
    prefix_tokens = _int("prefix_tokens", prefix_tokens, 0)
    suffix_tokens = _int("suffix_tokens", suffix_tokens, 0)
    shared_tokens = _int("shared_tokens", shared_tokens, 0)
    block_tokens = _int("block_tokens", block_tokens, 1)
    duration_s = _float("duration_s", duration_s, 0.0, lo_open=True)
    if duration_s * 1000.0 > MAX_ARRIVAL_MS:
        raise ValueError(f"duration_s must be at most {MAX_ARRIVAL_MS / 1000:.0f} s (the engine's int32 ms bound)")
    arrival = _choice("arrival", arrival, _ARRIVALS)
    popularity = _choice("popularity", popularity, _TENANT_LAWS)
    zipf_s = _float("zipf_s", zipf_s, 0.0)
    seed = _int("seed", seed, 0)
    vocab_size = _int("vocab_size", vocab_size, 1, np.iinfo(np.int32).max)
    rates = _prefix_rates_per_s(n_prefixes, rate_per_hour, popularity, zipf_s)

    r_sh, r_pre, r_suf, r_arr = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    t, which = prefix_arrival_times(
        rates, duration_s, r_arr, arrival=arrival, diurnal_amplitude=diurnal_amplitude,
        diurnal_period_s=diurnal_period_s, burst_cv=burst_cv,
    )
    n = int(t.shape[0])
    out = _output_tokens(output_tokens, n)
    shared = random_tokens(r_sh, (shared_tokens,), vocab_size)
    own = random_tokens(r_pre, (n_prefixes, prefix_tokens), vocab_size)
    prefix = np.concatenate([np.broadcast_to(shared, (n_prefixes, shared_tokens)), own], axis=1)
    suffix = random_tokens(r_suf, (n, suffix_tokens), vocab_size)
    keys = _prefix_suffix_keys(prefix, which, suffix, block_tokens)
    arrival_ms = np.floor(t * 1000.0).astype(np.int64)
    meta = dict(
        generator="prefix_poisson_workload",
        n_prefixes=n_prefixes,
        prefix_tokens=prefix_tokens,
        suffix_tokens=suffix_tokens,
        shared_tokens=shared_tokens,
        rate_per_hour=float(np.mean(rates) * 3600.0),
        duration_s=duration_s,
        block_tokens=block_tokens,
        arrival=arrival,
        popularity=popularity if np.ndim(rate_per_hour) == 0 else "explicit",
        zipf_s=zipf_s,
        diurnal_amplitude=float(diurnal_amplitude),
        diurnal_period_s=float(diurnal_period_s),
        burst_cv=float(burst_cv),
        output_tokens=_output_meta(output_tokens),
        seed=seed,
        vocab_size=vocab_size,
        prefix_rate_per_s=rates,
    )
    return _csr_workload(
        keys, arrival_ms=arrival_ms, input_tokens=shared_tokens + prefix_tokens + suffix_tokens,
        output_tokens=out, tenant=which.astype(np.int32), bs=block_tokens,
        name=name or f"prefixes-{arrival}-{popularity}", meta=meta,
    )

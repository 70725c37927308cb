"""The provider's side of prompt caching: what cached share will a hosted API's usage report?

The model (OpenAI-style automatic caching, FACTS.md "Provider-side caching"; every number a knob of
:class:`HostedConfig`, with its source):

* A request is routed to one of ``machines`` machines by a hash of its first ``route_tokens`` (256)
  tokens, combined with ``prompt_cache_key`` when the request has one.
* Overflow: a machine takes at most ``overflow_per_min`` (15) requests of one route key in any
  ``window_s`` (60 s) window; a request beyond that goes to another machine, drawn uniformly from the
  other ``machines - 1``. (FACTS: "when one prefix and key sends more than about 15 requests per
  minute, some overflow to other machines"; the sliding-window admission is this model's assumption.)
* Each machine caches the prompts it served: every full block, refreshed on use, kept ``ttl_s`` (300 s:
  "cleared after 5-10 minutes of inactivity") after its last use. A request's hit is the longest prefix
  of its blocks cached on the machine it reached.
* Usage reports ``cached_tokens``: the hit, 0 below ``min_tokens`` (1,024) and otherwise rounded down to
  ``min_tokens + k * increment_tokens`` (128), never more than the prompt.

:func:`replay` is the Monte Carlo replay of a :class:`~cacheresearch.workload.Workload` (a synthetic
workload or a loaded trace) through this model, request by request (``tests/reference_hosted.py`` is its
plain-Python reference, checked equal request by request). :func:`estimate` is the closed form: per route
key the home machine admits the arrivals an Erlang loss system with ``R = overflow_per_min * window_s / 60``
servers and holding time ``window_s`` admits (a sliding-window limiter is exactly such a system; Erlang's
formula is insensitive to the holding-time distribution, so the admitted share ``1 - B(R, lambda * W)``
holds for Poisson arrivals), the rest spreads evenly over the other machines, and a request reaching
machine ``m`` finds its prefix there with the TTL formula ``1 - exp(-Lambda_m * TTL)`` (``Lambda_m``: the
prefix's total rate into ``m``, treated as Poisson), counted over a run of ``D`` seconds that starts cold
and, on a home machine, conditioned on the run's own request counts (:func:`_run_hits`: ``nu = Lambda_m D``
arrivals uniform over the run); a machine reached only by overflow gets a Poisson count
(``Lambda (D - T) (1 - exp(-Lambda TTL)) + Lambda T - (1 - exp(-Lambda T))`` hits, ``T = min(TTL, D)``).
:func:`ttl_only` is the analytic TTL estimate that ignores routing and overflow (``1 - exp(-lambda * TTL)``
per prefix), shown beside both.
:func:`usage_cost_usd` prices the reported split under a :mod:`cacheresearch.analysis.pricing` preset.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from cacheresearch.analysis.pricing import MTOK, preset

__all__ = ["HostedConfig", "HOSTED_SOURCE", "route_ids", "home_machine", "replay", "ReplayResult", "erlang_b",
           "estimate", "ttl_only", "group_requests", "cached_reported", "usage_cost_usd"]

HOSTED_SOURCE = ("FACTS.md 'Provider-side caching' (OpenAI prompt caching guide): automatic from 1,024 prompt "
                 "tokens in 128-token increments; routed by a hash of about the first 256 tokens combined with "
                 "prompt_cache_key; more than about 15 requests per minute for one prefix and key overflow to "
                 "other machines; caches cleared after 5-10 minutes of inactivity. Machine count, the 60 s sliding "
                 "window and the uniform choice of the overflow machine are this model's assumptions.")

_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit words."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class HostedConfig:
    machines: int = 16
    route_tokens: int = 256
    overflow_per_min: float = 15.0
    window_s: float = 60.0
    ttl_s: float = 300.0
    min_tokens: int = 1024
    increment_tokens: int = 128
    source: str = HOSTED_SOURCE

    def __post_init__(self):
        if self.machines < 1 or self.route_tokens < 1 or self.min_tokens < 0 or self.increment_tokens < 1:
            raise ValueError("machines, route_tokens, increment_tokens must be >= 1 and min_tokens >= 0")
        if not (self.overflow_per_min > 0 and self.window_s > 0 and self.ttl_s >= 0):
            raise ValueError("overflow_per_min and window_s must be > 0, ttl_s >= 0")

    @property
    def slots(self) -> int:
        """Requests of one route key a machine admits per window: ``floor(per_min * window / 60)`` (>= 1)."""
        return max(int(math.floor(self.overflow_per_min * self.window_s / 60.0 + 1e-9)), 1)


def cached_reported(hit_tokens, input_tokens, cfg: HostedConfig):
    """``cached_tokens`` as usage reports it: 0 below the minimum, else ``min + k * increment``."""
    h = np.minimum(np.asarray(hit_tokens, np.int64), np.asarray(input_tokens, np.int64))
    m, inc = int(cfg.min_tokens), int(cfg.increment_tokens)
    return np.where(h >= max(m, 1), m + ((h - m) // inc) * inc, 0).astype(np.int64)


def route_ids(w, cfg: HostedConfig) -> np.ndarray:
    """Per request, the chained key of the block covering token ``route_tokens - 1`` (it identifies the
    first ``route_tokens`` tokens); the last full block for shorter prompts; for blocks longer than
    ``route_tokens`` the first block (an approximation: the route then covers the whole first block).
    A request without a full block gets a unique id (``2**63 + i``): it is never cacheable anyway."""
    bs = int(w.block_tokens)
    rb = max(-(-cfg.route_tokens // bs) - 1, 0)
    nb = np.diff(w.offsets)
    out = np.empty(w.n_requests, dtype=np.uint64)
    for i in range(w.n_requests):
        if nb[i] == 0:
            out[i] = np.uint64((1 << 63) + i)
        else:
            out[i] = w.keys[w.offsets[i] + min(rb, nb[i] - 1)]
    return out


def home_machine(route_id: int, cache_key: int | None, machines: int) -> int:
    """The machine a route key hashes to (``cache_key`` None: no ``prompt_cache_key``)."""
    k = _mix(int(route_id)) if cache_key is None else _mix(int(route_id) ^ _mix(int(cache_key) + 0x9E3779B97F4A7C15))
    return int(k % machines)


@dataclass
class ReplayResult:
    machine: np.ndarray  # [N] the machine that served each request
    overflowed: np.ndarray  # [N] bool
    hit_tokens: np.ndarray  # [N] longest cached prefix found (tokens, whole blocks)
    cached_tokens: np.ndarray  # [N] as usage reports it
    input_tokens: np.ndarray

    @property
    def cached_share(self) -> float:
        t = float(self.input_tokens.sum())
        return float(self.cached_tokens.sum()) / t if t else 0.0

    @property
    def overflow_share(self) -> float:
        return float(self.overflowed.mean()) if self.overflowed.size else 0.0


def _cache_keys(cache_key, n):
    if cache_key is None:
        return [None] * n
    ck = np.broadcast_to(np.asarray(cache_key), (n,))
    return [None if (isinstance(c, float) and math.isnan(c)) or int(c) < 0 else int(c) for c in ck]


def replay(w, cfg: HostedConfig = HostedConfig(), *, cache_key=None, seed: int = 0) -> ReplayResult:
    """Monte Carlo replay of ``w`` through the hosted model (module docstring).

    ``cache_key``: None (no request sends ``prompt_cache_key``), or an integer per request (negative = none).
    The overflow machine of request ``i`` is ``(home + 1 + floor(u_i * (machines - 1))) % machines`` with
    ``u = default_rng(seed).random(N)`` drawn up front.
    """
    n, bs, M = w.n_requests, int(w.block_tokens), int(cfg.machines)
    u = np.random.default_rng(seed).random(n)
    rid = route_ids(w, cfg)
    ck = _cache_keys(cache_key, n)
    t_s = np.asarray(w.arrival_ms, np.float64) / 1000.0
    caches = [dict() for _ in range(M)]
    windows: dict = {}
    R, W, ttl = cfg.slots, float(cfg.window_s), float(cfg.ttl_s)
    machine = np.empty(n, np.int64)
    over = np.zeros(n, bool)
    hit = np.zeros(n, np.int64)
    keys, offs = w.keys.tolist(), w.offsets
    for i in range(n):
        t = t_s[i]
        rk = (int(rid[i]), ck[i])
        home = home_machine(rk[0], rk[1], M)
        q = windows.get(rk)
        if q is None:
            q = windows[rk] = deque()
        while q and q[0] <= t - W:
            q.popleft()
        if len(q) < R:
            q.append(t)
            m = home
        else:
            m = (home + 1 + int(u[i] * (M - 1))) % M if M > 1 else home
            over[i] = True
        machine[i] = m
        c = caches[m]
        ks = keys[offs[i]:offs[i + 1]]
        j = 0
        while j < len(ks) and c.get(ks[j], -1.0) >= t:
            j += 1
        hit[i] = j * bs
        exp = t + ttl
        for k in ks:
            c[k] = exp
    inp = np.asarray(w.input_tokens, np.int64)
    return ReplayResult(machine, over, hit, cached_reported(hit, inp, cfg), inp)


def erlang_b(servers: int, load):
    """Erlang's loss formula ``B(c, A)`` (the recursion ``B_k = A B_{k-1} / (k + A B_{k-1})``), vectorized in A."""
    a = np.asarray(load, np.float64)
    b = np.ones_like(a)
    for k in range(1, int(servers) + 1):
        b = a * b / (k + a * b)
    return b


def group_requests(w, cfg: HostedConfig, cache_key=None):
    """Route keys of ``w``'s requests: per request its group (a shared first ``route_tokens``) and route key
    (group x cache key), and per group the tokens all its requests share (whole blocks)."""
    rid = route_ids(w, cfg)
    groups, gi = np.unique(rid, return_inverse=True)
    ck = np.asarray([-1 if c is None else c for c in _cache_keys(cache_key, w.n_requests)], np.int64)
    shared = np.zeros(groups.size, np.int64)
    for g in range(groups.size):
        idx = np.nonzero(gi == g)[0]
        first = w.request_keys(int(idx[0]))
        n = first.size
        for i in idx[1:]:
            k = w.request_keys(int(i))
            m = min(n, k.size)
            neq = np.nonzero(first[:m] != k[:m])[0]
            n = int(neq[0]) if neq.size else m
            if n == 0:
                break
        shared[g] = n * w.block_tokens
    return rid, gi, ck, shared


def _run_hits(nu, ttl: float, d: float):
    """Expected hits among ``nu`` arrivals spread uniformly over a run of ``d`` seconds that starts cold (the
    Poisson process conditioned on its count): an arrival at ``t`` hits iff another came in ``[t - TTL, t)``,
    probability ``1 - (1 - min(t, TTL) / d) ** (nu - 1)``, integrated over ``t``. For many arrivals this is
    the TTL formula ``1 - exp(-lambda TTL)`` per arrival; ``nu`` may be fractional (an expected count)."""
    nu = np.asarray(nu, np.float64)
    k = np.maximum(nu - 1.0, 0.0)
    T = min(ttl, d)
    x = min(ttl / d, 1.0)
    stationary = (d - T) / d * (1.0 - (1.0 - x) ** k)
    cold = (T - d / (k + 1.0) * (1.0 - (1.0 - T / d) ** (k + 1.0))) / d
    return np.where(nu > 1.0, nu * (stationary + cold), 0.0)


def estimate(w, cfg: HostedConfig = HostedConfig(), *, cache_key=None, duration_s: float | None = None) -> dict:
    """The closed-form cached share of ``w`` under the hosted model (module docstring), from the rates.

    Rates are counts over ``duration_s`` (default: the span of the arrivals). A hit is credited with the
    tokens every request of its group shares (:func:`group_requests`), as usage would report them.
    Returns ``cached_share``, ``overflow_share`` and per-group arrays.
    """
    rid, gi, ck, shared = group_requests(w, cfg, cache_key)
    n = w.n_requests
    if duration_s is None:
        span = (float(w.arrival_ms[-1]) - float(w.arrival_ms[0])) / 1000.0 if n > 1 else 1.0
        duration_s = span * n / max(n - 1, 1)
    M, R, W, ttl = int(cfg.machines), cfg.slots, float(cfg.window_s), float(cfg.ttl_s)
    inp = np.asarray(w.input_tokens, np.int64)
    cached_sum, over_sum = 0.0, 0.0
    per_group = np.zeros(shared.size)
    for g in range(shared.size):
        idx = np.nonzero(gi == g)[0]
        keys, counts = np.unique(ck[idx], return_counts=True)
        Lam = np.zeros(M)
        is_home = np.zeros(M, bool)
        over_g = 0.0
        for k, c in zip(keys, counts):
            lam = c / duration_s
            b = float(erlang_b(R, lam * W))
            home = home_machine(int(rid[idx[0]]), None if k < 0 else int(k), M)
            is_home[home] = True
            if M == 1:
                Lam[home] += lam
                continue
            spill = lam * b / (M - 1)
            Lam += spill
            Lam[home] += lam * (1 - b) - spill
            over_g += lam * b
        # a home machine's count is the route key's own (known) count: conditioned on it; a machine reached only
        # by overflow gets a random (Poisson) count: the finite-run Poisson formula
        T = min(ttl, duration_s)
        poisson = Lam * (duration_s - T) * (1.0 - np.exp(-Lam * ttl)) + Lam * T - (1.0 - np.exp(-Lam * T))
        hits = np.where(is_home, _run_hits(Lam * duration_s, ttl, duration_s), poisson)
        share = float(np.sum(np.maximum(hits, 0.0)) / idx.size)  # of this group's requests, the share that hits
        per_group[g] = share
        tok = cached_reported(np.minimum(shared[g], inp[idx]), inp[idx], cfg)
        cached_sum += share * float(tok.sum())
        over_sum += over_g * duration_s
    return dict(cached_share=cached_sum / float(inp.sum()), overflow_share=over_sum / n, group_hit=per_group,
                group_shared_tokens=shared, duration_s=duration_s)


def ttl_only(w, cfg: HostedConfig = HostedConfig(), *, duration_s: float | None = None) -> float:
    """The analytic TTL estimate without routing or overflow: each group's requests hit with
    ``1 - exp(-lambda_g * TTL)`` (one cache for the whole group), credited with the group's shared tokens."""
    rid, gi, _, shared = group_requests(w, cfg)
    n = w.n_requests
    if duration_s is None:
        span = (float(w.arrival_ms[-1]) - float(w.arrival_ms[0])) / 1000.0 if n > 1 else 1.0
        duration_s = span * n / max(n - 1, 1)
    inp = np.asarray(w.input_tokens, np.int64)
    tot = 0.0
    for g in range(shared.size):
        idx = np.nonzero(gi == g)[0]
        h = 1.0 - math.exp(-idx.size / duration_s * cfg.ttl_s)
        tot += h * float(cached_reported(np.minimum(shared[g], inp[idx]), inp[idx], cfg).sum())
    return tot / float(inp.sum())


def usage_cost_usd(input_tokens, cached_tokens, pricing="openai_auto") -> float:
    """Input cost of requests whose usage reports ``cached_tokens``: cached tokens at the read price, the
    rest at the base price; with a write premium (``write_multiplier > 1``, e.g. Anthropic presets) the
    uncached part of a cacheable prompt (1,024+ tokens, rounded like usage) is billed as a write."""
    p = preset(pricing) if isinstance(pricing, str) else pricing
    inp = np.asarray(input_tokens, np.int64)
    c = np.asarray(cached_tokens, np.int64)
    unc = inp - c
    written = np.zeros_like(unc)
    if p.write_multiplier != 1.0:
        cap = np.where(inp >= max(p.min_cacheable_tokens, 1), inp, 0)
        written = np.maximum(cap - c, 0)
    per = p.base_per_mtok / MTOK
    return float(per * ((unc - written).sum() + p.write_multiplier * written.sum() + p.read_multiplier * c.sum()))

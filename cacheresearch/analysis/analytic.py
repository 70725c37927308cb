"""Closed-form and numerical models of prefix caching, to set beside every simulated number.

Pure functions (NumPy / SciPy; the elementwise formulas also accept ``jax.numpy`` arrays and then
compute in JAX, so they can sit inside a jitted function). Rates are per second and TTLs in seconds
unless a name says otherwise. Sources are the lines of ``shared/reference/FACTS.md``, section
"Analytic models" (quoted as FACTS), and the papers they name.

TTL caches, one prefix, requests a Poisson process of rate ``lambda``
------------------------------------------------------------------------
* :func:`ttl_refresh_hit`: every access refreshes the TTL, so a request hits iff the previous one
  came at most TTL earlier: ``P(hit) = 1 - exp(-lambda * TTL)`` (FACTS: "TTL refreshed on hit").
* :func:`ttl_fixed_hit`: the expiry is set at the write. A write opens an ON period of length TTL
  holding Poisson(lambda * TTL) hits; the next request after it is the next write. Renewal-reward:
  ``P(hit) = lambda*TTL / (1 + lambda*TTL)`` (FACTS: "TTL fixed at write").
* Beyond Poisson (where the formulas above fail, quantified by ``experiment=ttl``):
  renewal arrivals with gamma gaps (:func:`ttl_refresh_hit_gamma`, :func:`ttl_fixed_hit_gamma`:
  ``F(TTL)`` and ``m(TTL) / (1 + m(TTL))`` with ``m`` the renewal function), and a diurnal
  (inhomogeneous Poisson) rate (:func:`ttl_refresh_hit_diurnal`, exact for refresh;
  :func:`quasi_static_hit`, the local-rate approximation for either policy).

Costs (FACTS: "Cost multiplier of a prefix")
--------------------------------------------
* :func:`cost_multiplier`: ``h * r + (1 - h) * w`` times the base input price, for hit rate ``h``,
  read multiplier ``r`` and write multiplier ``w``.
* :func:`break_even_hit_rate`: ``(w - 1) / (w - r)`` solves ``h*r + (1-h)*w = 1``; 0 when
  ``w <= 1`` (caching never costs more than not caching).

LRU: Che's approximation (FACTS: "Che approximation for LRU"; Che, Tung, Wang 2002; Fricker,
Robert, Roberts 2012)
--------------------------------------------------------------------------------------------------
Under independent (IRM) requests, key ``i`` of rate ``lambda_i`` is in an LRU cache of ``C`` slots
iff it was requested within the characteristic time ``T_C``, which solves
``sum_i (1 - exp(-lambda_i T_C)) = C`` (:func:`che_characteristic_time`, SciPy ``brentq``).
``h_i = 1 - exp(-lambda_i T_C)``; the overall hit ratio is ``sum lambda_i h_i / sum lambda_i``
(:func:`che_hit_ratios`). For a prefix cache the keys are *block* keys and a block's rate is the
sum of the rates of the requests that contain it (:func:`block_key_rates` counts occurrences of
every chained block key in a :class:`~cacheresearch.workload.Workload` or a loaded trace), so a
shared system prompt's blocks carry the whole fleet's rate and the prefix tree is respected.

Fleets (per-router predictions)
-------------------------------
* ``random`` routing sends each request to one of ``R`` replicas uniformly, so each replica sees
  every key at rate ``lambda_i / R`` and must hold every prefix: Che per replica with rates
  ``lambda / R`` (:func:`che_random_routing`), TTL hit ``1 - exp(-lambda TTL / R)``.
* ``prefix_hash`` routing sends all requests of a prefix to one replica, which sees the prefix's
  whole rate: Che solved separately on each replica's share of the keys (:func:`che_partitioned`,
  with the replica of every request from :func:`prefix_hash_replicas`, a NumPy twin of the engine's
  hash), TTL hit ``1 - exp(-lambda TTL)``.
:func:`che_fleet` and :func:`ttl_fleet_hit` wrap both.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import integrate, optimize, special, stats

__all__ = [
    "ttl_refresh_hit",
    "ttl_fixed_hit",
    "ttl_hit",
    "cost_multiplier",
    "break_even_hit_rate",
    "ttl_refresh_hit_gamma",
    "ttl_fixed_hit_gamma",
    "gamma_renewal_function",
    "diurnal_rate",
    "diurnal_cumulative",
    "ttl_refresh_hit_diurnal",
    "quasi_static_hit",
    "CheResult",
    "che_characteristic_time",
    "che_hit_ratios",
    "block_key_rates",
    "workload_duration_s",
    "che_workload",
    "che_random_routing",
    "che_partitioned",
    "prefix_hash_replicas",
    "che_fleet",
    "ttl_fleet_hit",
]


def _xp(*args):
    """``jax.numpy`` if any argument is a JAX array (or tracer), else NumPy."""
    return jnp if any(isinstance(a, jax.Array) for a in args) else np


def _asarray(xp, a):
    return xp.asarray(a, dtype=xp.float64 if xp is np else None)


# ----------------------------------------------------------------------------- TTL, Poisson
def ttl_refresh_hit(rate, ttl):
    """``1 - exp(-rate * ttl)``: hit probability of a TTL cache refreshed on every hit, Poisson arrivals.

    FACTS line "TTL refreshed on hit, Poisson rate lambda: P(hit) = 1 - exp(-lambda * TTL)".
    ``rate`` (per second) and ``ttl`` (seconds) broadcast; NumPy or JAX arrays.
    """
    xp = _xp(rate, ttl)
    x = _asarray(xp, rate) * _asarray(xp, ttl)
    return -xp.expm1(-x)


def ttl_fixed_hit(rate, ttl):
    """``x / (1 + x)`` with ``x = rate * ttl``: TTL fixed at write (hits do not extend it), Poisson arrivals.

    FACTS line "TTL fixed at write (no refresh): P(hit) = lambda*TTL / (1 + lambda*TTL) (renewal argument)":
    each write starts an ON period of length TTL with Poisson(x) hits, then the next request is a
    write, so hits per request = x / (1 + x).
    """
    xp = _xp(rate, ttl)
    x = _asarray(xp, rate) * _asarray(xp, ttl)
    return x / (1.0 + x)


def ttl_hit(rate, ttl, refresh: bool = True):
    """:func:`ttl_refresh_hit` or :func:`ttl_fixed_hit`."""
    return ttl_refresh_hit(rate, ttl) if refresh else ttl_fixed_hit(rate, ttl)


# ----------------------------------------------------------------------------- costs
def cost_multiplier(hit_rate, write, read):
    """``h * read + (1 - h) * write``: cost of a cached prefix relative to sending it uncached.

    FACTS line "Cost multiplier of a prefix: h*r + (1-h)*w". A hit pays the read multiplier, a
    miss pays the write multiplier (the prefix is written again). 1.0 = the uncached price.
    """
    xp = _xp(hit_rate, write, read)
    h = _asarray(xp, hit_rate)
    return h * _asarray(xp, read) + (1.0 - h) * _asarray(xp, write)


def break_even_hit_rate(write, read):
    """``(w - 1) / (w - r)``: the hit rate at which caching costs the same as not caching.

    FACTS line "break-even hit rate (w - 1) / (w - r)". It solves ``h*r + (1-h)*w = 1``. When
    ``w <= 1`` caching never costs more than not caching and the break-even is 0. When ``r >= 1 < w``
    caching never pays and the result is ``inf``. Examples: 5-minute writes (1.25, 0.1) -> 21.7%,
    1-hour writes (2.0, 0.1) -> 52.6%, no write premium (1.0, 0.1) -> 0.
    """
    xp = _xp(write, read)
    w, r = _asarray(xp, write), _asarray(xp, read)
    safe = xp.where(w > r, w - r, 1.0)
    be = xp.where(w > r, (w - 1.0) / safe, xp.inf)
    return xp.where(w <= 1.0, 0.0, xp.where(r >= 1.0, xp.inf, be))


# ----------------------------------------------------------------------------- TTL, beyond Poisson
def _gamma_shape_scale(rate, cv):
    k = 1.0 / float(cv) ** 2
    return k, 1.0 / (float(rate) * k)


def ttl_refresh_hit_gamma(rate: float, ttl: float, cv: float) -> float:
    """Refresh-on-hit TTL, renewal arrivals with gamma gaps (mean ``1/rate``, coefficient of variation ``cv``).

    A request hits iff its gap to the previous one is at most TTL: ``P(hit) = F_gap(TTL)``. ``cv = 1``
    is Poisson (:func:`ttl_refresh_hit`); ``cv > 1`` is burstier.
    """
    k, theta = _gamma_shape_scale(rate, cv)
    return float(stats.gamma.cdf(ttl, k, scale=theta))


def gamma_renewal_function(rate: float, t: float, cv: float, tol: float = 1e-13) -> float:
    """``m(t) = E[N(t)] = sum_n P(S_n <= t)``: expected renewals in ``(0, t]`` after a renewal, gamma gaps."""
    k, theta = _gamma_shape_scale(rate, cv)
    total, n0, step = 0.0, 1, 256
    while True:
        n = np.arange(n0, n0 + step, dtype=np.float64)
        p = special.gammainc(n * k, t / theta)  # regularized lower incomplete gamma = P(S_n <= t)
        total += float(p.sum())
        if p[-1] < tol:
            return total
        n0 += step


def ttl_fixed_hit_gamma(rate: float, ttl: float, cv: float) -> float:
    """Fixed TTL, renewal arrivals with gamma gaps: ``m(TTL) / (1 + m(TTL))``.

    A write happens at an arrival (a renewal epoch); the hits of its ON period are the renewals
    within TTL after it, ``m(TTL)`` in expectation (:func:`gamma_renewal_function`); each cycle has
    one write. ``cv = 1`` gives ``lambda TTL / (1 + lambda TTL)``.
    """
    m = gamma_renewal_function(rate, ttl, cv)
    return m / (1.0 + m)


def diurnal_rate(t, mean_rate, amplitude, period_s=86_400.0):
    """``mean_rate * (1 - amplitude * cos(2 pi t / period))``: a day that starts at its trough.

    The same profile :func:`cacheresearch.workload.synthetic.prefix_poisson_workload` draws with
    ``arrival="diurnal"`` (its mean over whole periods is ``mean_rate``).
    """
    xp = _xp(t)
    return mean_rate * (1.0 - amplitude * xp.cos(2.0 * xp.pi * _asarray(xp, t) / period_s))


def diurnal_cumulative(t0, t1, mean_rate, amplitude, period_s=86_400.0):
    """``int_{t0}^{t1} diurnal_rate(t) dt`` (closed form)."""
    w = 2.0 * np.pi / period_s
    t0, t1 = np.asarray(t0, np.float64), np.asarray(t1, np.float64)
    return mean_rate * ((t1 - t0) - amplitude * (np.sin(w * t1) - np.sin(w * t0)) / w)


def ttl_refresh_hit_diurnal(mean_rate: float, ttl: float, amplitude: float, duration_s: float,
                            period_s: float = 86_400.0, *, forward: bool = True) -> float:
    """Refresh-on-hit TTL under a diurnal Poisson rate: exact for the inhomogeneous process.

    With ``forward=True`` (the estimator of :mod:`cacheresearch.studies`): the share of requests
    arriving in ``[0, D - TTL]`` whose *next* request of the prefix comes within TTL,
    ``int lambda(t) (1 - exp(-Lambda(t, t + TTL))) dt / int lambda(t) dt`` over ``[0, D - TTL]``.
    With ``forward=False``: the share of requests in ``[TTL, D]`` with a request in the TTL before
    them, ``int lambda(t) (1 - exp(-Lambda(t - TTL, t))) dt / int lambda(t) dt`` over ``[TTL, D]``.
    Both differ from the Poisson formula at the mean rate because ``1 - exp(-x)`` is concave and
    requests come more often when the rate is high.
    """
    if duration_s <= ttl:
        raise ValueError("duration_s must exceed ttl")

    def f(t):
        lam = diurnal_rate(t, mean_rate, amplitude, period_s)
        lo, hi = (t, t + ttl) if forward else (t - ttl, t)
        return lam * -np.expm1(-diurnal_cumulative(lo, hi, mean_rate, amplitude, period_s))

    a, b = (0.0, duration_s - ttl) if forward else (ttl, duration_s)
    n_per = max(8, int(np.ceil((b - a) / period_s * 4)))
    num = integrate.quad(f, a, b, limit=200 + 50 * n_per, epsabs=0.0, epsrel=1e-10)[0]
    den = float(diurnal_cumulative(a, b, mean_rate, amplitude, period_s))
    return num / den


def quasi_static_hit(mean_rate: float, ttl: float, amplitude: float, refresh: bool = True,
                     period_s: float = 86_400.0, n: int = 4096) -> float:
    """Local-rate approximation under a diurnal rate: ``int lambda(t) h(lambda(t)) dt / int lambda(t) dt``.

    ``h`` is the Poisson formula of the policy evaluated at the instantaneous rate (valid when TTL
    and the time between requests are short against the period); over one whole period.
    """
    t = (np.arange(n) + 0.5) * (period_s / n)
    lam = diurnal_rate(t, mean_rate, amplitude, period_s)
    h = ttl_hit(lam, ttl, refresh)
    return float(np.sum(lam * h) / np.sum(lam))


# ----------------------------------------------------------------------------- Che / LRU
class CheResult(NamedTuple):
    """Che's approximation: characteristic time (s), per-key hit probabilities, overall hit ratio."""

    characteristic_time: float
    per_key: np.ndarray
    overall: float


def _rates_weights(rates, weights):
    lam = np.asarray(rates, dtype=np.float64).reshape(-1)
    if np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError("rates must be finite and >= 0")
    w = np.ones_like(lam) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != lam.shape or np.any(w < 0):
        raise ValueError("weights must be >= 0 and match rates")
    return lam, w


def che_characteristic_time(rates, capacity: float, weights=None) -> float:
    """``T_C`` solving ``sum_i w_i (1 - exp(-lambda_i T_C)) = C`` (FACTS: "T_C solves ...").

    ``weights`` (default 1) counts how many cache slots a key stands for (e.g. blocks of a prefix
    whose blocks always travel together). Root by ``scipy.optimize.brentq`` on a bracket found by
    doubling. Returns 0 for ``C <= 0`` and ``inf`` when everything requested fits (``C >= sum w_i``
    over keys of positive rate).
    """
    lam, w = _rates_weights(rates, weights)
    pos = (lam > 0) & (w > 0)
    lam, w = lam[pos], w[pos]
    C = float(capacity)
    if C <= 0:
        return 0.0
    if lam.size == 0 or C >= w.sum():
        return float("inf")

    def g(T):
        return float(np.sum(w * -np.expm1(-lam * T))) - C

    hi = 1.0 / lam.max()
    while g(hi) < 0:
        hi *= 2.0
    lo = 0.0
    return float(optimize.brentq(g, lo, hi, xtol=1e-14 * hi, rtol=4 * np.finfo(float).eps, maxiter=500))


def che_hit_ratios(rates, capacity: float, weights=None) -> CheResult:
    """Per-key ``h_i = 1 - exp(-lambda_i T_C)`` and overall ``sum w lambda h / sum w lambda`` (FACTS)."""
    lam, w = _rates_weights(rates, weights)
    T = che_characteristic_time(lam, capacity, w)
    h = np.ones_like(lam) if np.isinf(T) else -np.expm1(-lam * T)
    h = np.where(lam > 0, h, 0.0)
    tot = float(np.sum(w * lam))
    overall = float(np.sum(w * lam * h) / tot) if tot > 0 else 0.0
    return CheResult(T, h, overall)


def workload_duration_s(workload) -> float:
    """The observation window of a workload: ``meta["duration_s"]`` if the generator recorded it,
    else the span of arrival times (seconds)."""
    d = workload.meta.get("duration_s") if isinstance(workload.meta, dict) else None
    if d:
        return float(d)
    if workload.n_requests < 2:
        raise ValueError("cannot infer a duration from fewer than two requests; pass duration_s")
    span = (int(workload.arrival_ms[-1]) - int(workload.arrival_ms[0])) / 1000.0
    if span <= 0:
        raise ValueError("all requests arrive at the same time; pass duration_s")
    return span


def block_key_rates(workload, duration_s: float | None = None, requests=None):
    """Distinct block keys and their request rates (occurrences per second).

    A chained key stands for its whole prefix, so a block shared by many prompts (a system prompt)
    gets the sum of their rates: the prefix tree is respected. ``requests`` (bool mask or indices)
    restricts the count to some requests (e.g. one replica's share), over the same duration.
    Returns ``(keys uint64 [K], rates float64 [K], counts int64 [K])``.
    """
    D = workload_duration_s(workload) if duration_s is None else float(duration_s)
    keys = workload.keys
    if requests is not None:
        sel = np.zeros(workload.n_requests, dtype=bool)
        sel[requests] = True
        keys = keys[np.repeat(sel, workload.n_blocks)]
    uniq, counts = np.unique(keys, return_counts=True)
    return uniq, counts / D, counts.astype(np.int64)


def che_workload(workload, capacity: float, duration_s: float | None = None) -> CheResult:
    """Che's prediction for one LRU cache of ``capacity`` blocks fed ``workload`` (block-key rates)."""
    _, rates, _ = block_key_rates(workload, duration_s)
    return che_hit_ratios(rates, capacity)


def che_random_routing(rates, capacity: float, replicas: int, weights=None) -> CheResult:
    """Random routing over ``R`` replicas of ``capacity`` each: every replica sees ``lambda_i / R``
    for every key and must hold every prefix; the overall ratio equals one replica's."""
    lam, w = _rates_weights(rates, weights)
    res = che_hit_ratios(lam / int(replicas), capacity, w)
    return res


def che_partitioned(rates, capacity: float, assignment, replicas: int, weights=None) -> CheResult:
    """Keys partitioned over replicas (``assignment[i]`` = the replica that serves key ``i`` with its
    whole rate, as prefix-hash routing does); Che solved per replica. ``characteristic_time`` is
    the largest of the replicas' (the per-key hit ratios carry the detail)."""
    lam, w = _rates_weights(rates, weights)
    a = np.asarray(assignment).reshape(-1)
    if a.shape != lam.shape:
        raise ValueError("assignment must have one replica per key")
    h = np.zeros_like(lam)
    Ts = []
    for r in range(int(replicas)):
        m = a == r
        if not m.any():
            continue
        res = che_hit_ratios(lam[m], capacity, w[m])
        h[m] = res.per_key
        Ts.append(res.characteristic_time)
    tot = float(np.sum(w * lam))
    overall = float(np.sum(w * lam * h) / tot) if tot > 0 else 0.0
    return CheResult(max(Ts) if Ts else 0.0, h, overall)


def prefix_hash_replicas(workload, replicas: int, prefix_blocks: int = 80) -> np.ndarray:
    """Replica of every request under the engine's ``prefix_hash`` router (int64 [N]).

    The router hashes the key of block ``min(K, n) - 1`` (key 0 for a request without blocks) and
    takes it modulo ``R``, as :mod:`cacheresearch.routers` documents.
    """
    from cacheresearch.analysis.mrc import route_requests  # noqa: PLC0415 - the one implementation of the routing rule

    return route_requests(workload, "prefix_hash", int(replicas), prefix_blocks=int(prefix_blocks)).astype(np.int64)


def che_fleet(workload, capacity: float, replicas: int = 1, router: str = "random",
              prefix_blocks: int = 80, duration_s: float | None = None, first_miss: bool = False) -> CheResult:
    """Che's prediction for a fleet of ``replicas`` LRU caches of ``capacity`` blocks each.

    ``random``: :func:`che_random_routing`. ``prefix_hash``: requests are assigned with
    :func:`prefix_hash_replicas` and each replica's block-key rates counted from its own requests,
    then Che per replica (a block shared across replicas is counted on each, with the rate it gets
    there). ``round_robin`` is treated like ``random`` (each replica sees ``1/R`` of every key).
    ``per_key`` is returned for the distinct keys of the whole workload (sorted), rate-weighted over
    replicas.

    ``first_miss``: a finite trace's correction (IRM has none): a replica's first request of a block is a
    miss whatever the capacity, so a block requested ``n`` times hits at most ``n - 1`` times there. Under
    ``random`` routing a block of ``n`` requests is first seen by ``R (1 - (1 - 1/R)^n)`` replicas on
    average; under ``prefix_hash`` each replica's own count ``c`` leaves ``c - 1`` chances. Each key's Che
    ratio is scaled by its share of such requests; with a cache that holds everything the prediction is
    then the trace's reuse ratio, not 1.
    """
    D = workload_duration_s(workload) if duration_s is None else float(duration_s)
    keys, rates, counts = block_key_rates(workload, D)
    R = int(replicas)
    if R == 1 or router in ("random", "round_robin"):
        res = che_random_routing(rates, capacity, R)
        if not first_miss:
            return res
        n = counts.astype(np.float64)
        seen = R * -np.expm1(n * np.log1p(-1.0 / R)) if R > 1 else np.ones_like(n)
        per_key = res.per_key * (n - seen) / n
        overall = float(np.sum(rates * per_key) / rates.sum()) if rates.sum() > 0 else 0.0
        return CheResult(res.characteristic_time, per_key, overall)
    if router != "prefix_hash":
        raise ValueError(f"no Che prediction for router {router!r}")
    rep = prefix_hash_replicas(workload, R, prefix_blocks)
    hits = np.zeros_like(rates)
    Ts = []
    for r in range(R):
        k_r, lam_r, c_r = block_key_rates(workload, D, requests=np.nonzero(rep == r)[0])
        if k_r.size == 0:
            continue
        res = che_hit_ratios(lam_r, capacity)
        Ts.append(res.characteristic_time)
        pos = np.searchsorted(keys, k_r)
        hits[pos] += lam_r * res.per_key * ((c_r - 1) / c_r if first_miss else 1.0)
    per_key = np.where(rates > 0, hits / np.where(rates > 0, rates, 1.0), 0.0)
    overall = float(hits.sum() / rates.sum()) if rates.sum() > 0 else 0.0
    return CheResult(max(Ts) if Ts else 0.0, per_key, overall)


def ttl_fleet_hit(rate, ttl, replicas: int = 1, router: str = "random", refresh: bool = True):
    """TTL hit probability of a prefix of rate ``rate`` on a fleet: ``random`` (and ``round_robin``,
    as a rate split) gives each replica ``rate / R``; ``prefix_hash`` sends the whole rate to one."""
    R = int(replicas)
    if router == "prefix_hash" or R == 1:
        return ttl_hit(rate, ttl, refresh)
    if router in ("random", "round_robin"):
        xp = _xp(rate)
        return ttl_hit(_asarray(xp, rate) / R, ttl, refresh)
    raise ValueError(f"no TTL prediction for router {router!r}")

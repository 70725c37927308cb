"""Studies: closed-form models side by side with Monte Carlo runs of the engine.

Shell-side (xarray, matplotlib): each study builds workloads with
:func:`~cacheresearch.workload.synthetic.prefix_poisson_workload` (or ``design_workload``), runs them through the
exact engine (:func:`~cacheresearch.core.run.simulate_cells`, the runner the sweeps use: vmapped over
streams and configurations, per-request outputs), computes the matching predictions of
:mod:`cacheresearch.analysis.analytic` and :mod:`cacheresearch.analysis.pricing`, and returns one xarray
Dataset. ``python -m cacheresearch.sweep experiment=NAME`` reaches them through the experiment config's
``kind`` key:

``economics``    the seed's economics printout (break-even hit rates, the requests-per-hour table, the
                 worked example) with the simulated hit rate and cost, with 95% intervals, beside each
                 analytic value; the worked example also under diurnal and bursty arrivals
``ttl``          a rate x TTL grid, refresh and fixed TTL, Poisson / diurnal / bursty arrivals:
                 simulated vs the Poisson formulas and vs the exact model of each arrival process
``che``          Zipf popularity over prefixes, an LRU capacity grid, one cache and fleets with random
                 and prefix-hash routing: simulated vs Che's approximation
``ttl_advisor``  the cheapest TTL option per prefix (5 min, 1 h, none) on the seed's design scenario,
                 its saving over one-size-fits-all, analytic and simulated

How simulated TTL hit rates are estimated (and why they can be compared with a steady-state formula)
------------------------------------------------------------------------------------------------------
The engine starts empty and a run ends at a horizon ``D``; the closed forms are long-run (stationary)
values. Counting every request biases the estimate at both ends: the first request of each prefix is
a forced miss, and the requests in ``[0, TTL)`` look back into an empty past. Dropping only the
first request of each prefix over-corrects (a non-first request before TTL is *always* a hit) and
leaves a bias of ``(TTL / D) exp(-lambda TTL)`` (0.5 points at lambda TTL = 2 with TTL = 1 h, D =
24 h), so the estimators here use units whose outcome is fully observed and whose selection depends
only on the past (optional stopping), which makes them unbiased, not merely consistent:

* refresh on hit: every request at ``t <= D - TTL`` is a unit; its outcome is whether the *next*
  request of the same prefix hits (arrives within TTL; the engine's hit flag of that request). Under
  Poisson (and any renewal) arrivals the outcomes are i.i.d. Bernoulli(``1 - exp(-lambda TTL)``)
  (resp. ``F_gap(TTL)``), exactly.
* fixed at write: every miss (write) at ``t <= D - TTL`` opens a unit: the write plus the hits that
  follow it until the next miss (its ON window lies inside the horizon). Under Poisson arrivals the
  number of hits of a unit is Poisson(``lambda TTL``) independent of the selection, so hits /
  requests over units estimates ``lambda TTL / (1 + lambda TTL)`` without bias (renewal-reward).

The hit rate is ``sum hits / sum requests`` over units. Its 95% interval treats each prefix of each
seed as an independent cluster (prefixes do not interact in a TTL cache): the linearized (delta
method) standard error of a ratio estimator over clusters with a t quantile (clusters - 1 degrees of
freedom), widened to the Wilson score interval of the pooled counts where that is wider (it
stays informative when every unit hits). A cell is flagged when the analytic value lies outside.
At 95% about one cell in twenty is flagged by chance; the summaries count flags against that.

For LRU (``che``) the warm-up (``warmup_fraction`` of each run) is discarded and the hit ratio is
the block hit ratio of the remaining requests; the interval is a t interval over seeds (the cache
couples all prefixes, so prefixes are not independent clusters there).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
import xarray as xr
from scipy import stats

from cacheresearch.analysis.analytic import (
    che_fleet,
    cost_multiplier,
    quasi_static_hit,
    ttl_fixed_hit_gamma,
    ttl_hit,
    ttl_refresh_hit_diurnal,
    ttl_refresh_hit_gamma,
)
from cacheresearch.analysis.pricing import PRESETS, Pricing, advise_ttl, daily_cost_uncached_usd, daily_cost_usd, preset
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.studies.base import DAY, HOUR, Study, StudyError, defaults_class, engine_hits
from cacheresearch.studies.base import common_attrs as _common_attrs
from cacheresearch.studies.base import doc as _doc
from cacheresearch.studies.base import errbar as _errbar
from cacheresearch.studies.base import fig as _fig
from cacheresearch.studies.base import header as _header
from cacheresearch.studies.base import pct as _pct
from cacheresearch.studies.base import positive_list as _positive_list
from cacheresearch.studies.base import seeds as _seeds
from cacheresearch.studies.base import study_cfg as _study_cfg
from cacheresearch.studies.base import table as _table
from cacheresearch.studies.base import usd as _usd
from cacheresearch.workload.synthetic import design_workload, prefix_poisson_workload

__all__ = ["STUDIES", "refresh_units", "fixed_units", "ratio_interval", "economics_study", "ttl_study",
           "che_study", "ttl_advisor_study"]


WORKED_EXAMPLE = dict(n_prefixes=200, prefix_tokens=10_000, requests_per_day=50_000, base_per_mtok=3.0)


# ------------------------------------------------------------------------------ config helpers
def _pricing(name: str, overrides: dict, base: float | None) -> Pricing:
    try:
        p = preset(name, **(overrides or {}).get(name, {}))
    except (ValueError, TypeError) as e:
        raise StudyError(f"study.pricings: {e}") from None
    if base is not None and "base_per_mtok" not in (overrides or {}).get(name, {}):
        p = p.replace(base_per_mtok=float(base))
    return p


# ------------------------------------------------------------------------------ engine runs
# ------------------------------------------------------------------------------ estimators
def refresh_units(arrival_s: np.ndarray, prefix: np.ndarray, hit: np.ndarray, duration_s: float, ttl_s: float,
                  n_prefixes: int):
    """Per-prefix ``(units, hits)`` of the refresh-on-hit estimator (see the module docstring).

    A unit is a request at ``t <= D - TTL``; it succeeds when the next request of its prefix hits.
    """
    order = np.lexsort((arrival_s, prefix))
    p, t, h = prefix[order], arrival_s[order], hit[order].astype(bool)
    same_next = np.zeros(p.shape[0], dtype=bool)
    same_next[:-1] = p[1:] == p[:-1]
    nxt_hit = np.zeros(p.shape[0], dtype=bool)
    nxt_hit[:-1] = h[1:]
    unit = t <= duration_s - ttl_s
    ok = unit & same_next & nxt_hit
    units = np.bincount(p[unit], minlength=n_prefixes)
    hits = np.bincount(p[ok], minlength=n_prefixes)
    return units.astype(np.int64), hits.astype(np.int64)


def fixed_units(arrival_s: np.ndarray, prefix: np.ndarray, hit: np.ndarray, duration_s: float, ttl_s: float,
                n_prefixes: int):
    """Per-prefix ``(requests, hits)`` of the fixed-TTL estimator: every miss at ``t <= D - TTL`` and
    the hits that follow it until the next miss of its prefix (a whole ON period)."""
    order = np.lexsort((arrival_s, prefix))
    p, t, h = prefix[order], arrival_s[order], hit[order].astype(bool)
    miss = ~h
    # cycle id: index of the latest miss at or before each request, within its prefix
    new_prefix = np.ones(p.shape[0], dtype=bool)
    new_prefix[1:] = p[1:] != p[:-1]
    start = miss | new_prefix  # a prefix's first request is always a miss; guard anyway
    cyc = np.cumsum(start) - 1
    cyc_t = t[start]
    cyc_ok = (cyc_t <= duration_s - ttl_s) & miss[start]
    keep = cyc_ok[cyc]
    req = np.bincount(p[keep], minlength=n_prefixes)
    hits = np.bincount(p[keep & h], minlength=n_prefixes)
    return req.astype(np.int64), hits.astype(np.int64)


def _wilson(k: float, n: float, z: float):
    if n <= 0:
        return (np.nan, np.nan)
    ph = k / n
    den = 1 + z * z / n
    c = (ph + z * z / (2 * n)) / den
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, c - half), min(1.0, c + half)


def ratio_interval(hits, units, level: float = 0.95):
    """``(estimate, low, high, se)`` of ``sum hits / sum units`` over independent clusters.

    The linearized standard error ``sqrt(m / (m - 1) * sum (h_i - R n_i)^2) / sum n_i`` (clusters with
    ``n_i > 0``), a t quantile with ``m - 1`` degrees of freedom, widened to the Wilson score interval
    of the pooled counts where that is wider.
    """
    h = np.asarray(hits, dtype=np.float64).reshape(-1)
    n = np.asarray(units, dtype=np.float64).reshape(-1)
    sel = n > 0
    h, n = h[sel], n[sel]
    N = n.sum()
    if N <= 0:
        return (np.nan, np.nan, np.nan, np.nan)
    R = h.sum() / N
    m = h.size
    z = float(stats.norm.ppf(0.5 + level / 2))
    if m > 1:
        se = math.sqrt(m / (m - 1) * float(np.sum((h - R * n) ** 2))) / N
        q = float(stats.t.ppf(0.5 + level / 2, m - 1))
    else:
        se, q = float("nan"), z
    lo, hi = (R - q * se, R + q * se) if math.isfinite(se) else (np.nan, np.nan)
    wl, wh = _wilson(h.sum(), N, z)
    lo = wl if not math.isfinite(lo) else min(lo, wl)
    hi = wh if not math.isfinite(hi) else max(hi, wh)
    return float(R), float(max(lo, 0.0)), float(min(hi, 1.0)), float(se)


def _within(value, lo, hi, tol: float = 1e-12) -> bool:
    return bool(lo - tol <= value <= hi + tol)


def _prefix_hit_flags(hit_blocks: np.ndarray, w) -> np.ndarray:
    """A request hit its prefix when every full block of the prefix (shared head included) hit."""
    pb = (int(w.meta.get("shared_tokens", 0)) + int(w.meta["prefix_tokens"])) // w.block_tokens
    return hit_blocks >= max(pb, 1)


# ------------------------------------------------------------------------------ economics
ECONOMICS_DEFAULTS: dict[str, Any] = dict(
    n_prefixes=200,
    prefix_tokens=10_000,
    requests_per_day=50_000,
    base_per_mtok=3.0,
    pricings=["anthropic_5m", "anthropic_1h", "no_write_premium"],
    pricing_overrides={},
    requests_per_hour=[1, 6, 12, 60, 600],
    include_worked_example=True,
    sim=dict(
        enabled=True,
        target_requests=50_000,  # requests per (rate, seed) run
        prefixes=200,  # preferred prefixes per run (more when the duration hits max_duration_s)
        min_prefixes=20,
        min_duration_ttls=4.0,  # the horizon is at least this many of the longest TTL
        max_duration_s=7 * DAY,
        block_tokens=1000,
        arrivals=["poisson", "diurnal", "bursty"],  # the worked example under each arrival process
        diurnal_amplitude=0.8,
        burst_cv=3.0,
    ),
)


def _sim_layout(rate_per_s: float, s: dict, max_ttl: float) -> tuple[int, float]:
    """(prefixes, duration) of a run with about ``target_requests`` requests at ``rate_per_s`` per prefix."""
    target = float(s["target_requests"])
    D = target / (float(s["prefixes"]) * rate_per_s)
    D = min(max(D, float(s["min_duration_ttls"]) * max_ttl), float(s["max_duration_s"]))
    n_pref = max(int(s["min_prefixes"]), int(round(target / (rate_per_s * D))))
    return n_pref, D


def _ttl_cell(wl, hits_blocks, ttl_s: float, refresh: bool):
    t = wl.arrival_ms / 1000.0
    hit = _prefix_hit_flags(hits_blocks, wl)
    D = float(wl.meta["duration_s"])
    f = refresh_units if refresh else fixed_units
    units, h = f(t, wl.tenant.astype(np.int64), hit, D, ttl_s, int(wl.meta["n_prefixes"]))
    return units, h, hit


def _economics_runs(lam, s: dict, seeds, T: int, bt: int, max_ttl: float, worked_rph: float, arrivals: list):
    """(kind, index, seed, workload) of every simulated run: each rate per seed, and the worked example
    under the other arrival processes."""
    runs = []  # (kind, index, seed, workload)
    for i, x in enumerate(lam):
        n_pref, D = _sim_layout(x, s, max_ttl)
        for sd in seeds:
            runs.append(("rate", i, sd, prefix_poisson_workload(
                n_prefixes=n_pref, prefix_tokens=T, rate_per_hour=x * HOUR, duration_s=D, block_tokens=bt,
                seed=sd * 1000 + i)))  # independent draws per rate (equal lambda*D would repeat them)
    # the worked example under other arrival processes: whole days (the diurnal cycle), prefixes as many
    # as target_requests allows (the seed's 200 at the default 50,000)
    n_arr = max(int(s["min_prefixes"]), int(round(float(s["target_requests"]) / (worked_rph / HOUR * DAY))))
    for a in arrivals[1:]:
        for sd in seeds:
            runs.append((a, 0, sd, prefix_poisson_workload(
                n_prefixes=n_arr, prefix_tokens=T, rate_per_hour=worked_rph, duration_s=DAY, block_tokens=bt,
                arrival=a, diurnal_amplitude=s["diurnal_amplitude"], burst_cv=s["burst_cv"],
                seed=sd * 1000 + 500 + arrivals.index(a))))
    return runs


def _economics_estimates(pricings, pols, runs, hits, rph, worked_rph: float, arrivals: list):
    """Per pricing and rate: the simulated hit rate with its interval and units; the worked example per
    arrival process."""
    shape = (len(pricings), len(rph))
    h_sim, h_lo, h_hi, h_se = (np.full(shape, np.nan) for _ in range(4))
    h_all = np.full(shape, np.nan)
    n_units = np.zeros(shape, dtype=np.int64)
    sim_req = np.zeros(len(rph), dtype=np.int64)
    sim_pref = np.zeros(len(rph), dtype=np.int64)
    sim_dur = np.zeros(len(rph))
    worked = {a: {} for a in arrivals}
    for j, p in enumerate(pricings):
        k = pols.index((p.ttl_s, p.refresh_on_hit))
        per_rate: dict[int, list] = {}
        per_arr: dict[str, list] = {}
        for (kind, i, sd, wl), hb in zip(runs, hits[k]):
            units, hh, hit = _ttl_cell(wl, hb, p.ttl_s, p.refresh_on_hit)
            rec = (units, hh, int(hit.sum()), hit.size)
            if kind == "rate":
                per_rate.setdefault(i, []).append(rec)
                if j == 0:
                    sim_req[i] += wl.n_requests
                    sim_pref[i] = int(wl.meta["n_prefixes"])
                    sim_dur[i] = float(wl.meta["duration_s"])
            else:
                per_arr.setdefault(kind, []).append(rec)
        for i, recs in per_rate.items():
            u = np.concatenate([r[0] for r in recs])
            hh = np.concatenate([r[1] for r in recs])
            h_sim[j, i], h_lo[j, i], h_hi[j, i], h_se[j, i] = ratio_interval(hh, u)
            n_units[j, i] = int(u.sum())
            h_all[j, i] = sum(r[2] for r in recs) / max(1, sum(r[3] for r in recs))
            if abs(rph[i] - worked_rph) < 1e-9 and "poisson" in worked:
                worked["poisson"][p.name] = (h_sim[j, i], h_lo[j, i], h_hi[j, i], h_all[j, i])
        for a, recs in per_arr.items():
            u = np.concatenate([r[0] for r in recs])
            hh = np.concatenate([r[1] for r in recs])
            est, lo, hi, _ = ratio_interval(hh, u)
            worked[a][p.name] = (est, lo, hi, sum(r[2] for r in recs) / max(1, sum(r[3] for r in recs)))
    return h_sim, h_lo, h_hi, h_se, h_all, n_units, sim_req, sim_pref, sim_dur, worked


def _document_economics(ds: xr.Dataset) -> None:
    _doc(ds, {
        "break_even_hit_rate": ("hit rate at which caching costs as much as not caching: (w - 1) / (w - r)", "1"),
        "hit_rate_analytic": ("steady-state hit rate, Poisson arrivals per prefix (refresh: 1 - exp(-lambda TTL))",
                              "1"),
        "cost_multiplier_analytic": ("cost of the prefix relative to uncached: h r + (1 - h) w", "1x"),
        "daily_cost_usd": ("expected daily cost of the prefix tokens, n_prefixes prefixes at this rate", "USD/day"),
        "daily_cost_uncached_usd": ("daily cost of the prefix tokens without caching", "USD/day"),
        "requests_per_day": ("requests per day over all prefixes", "requests/day"),
        "hit_rate_sim": ("simulated hit rate (engine; unbiased units estimator, see attrs)", "1"),
        "hit_rate_sim_all_requests": ("simulated hit rate over every request (cold start included)", "1"),
        "cost_multiplier_sim": ("simulated cost multiplier h_sim r + (1 - h_sim) w", "1x"),
        "daily_cost_sim_usd": ("daily cost at the simulated hit rate", "USD/day"),
        "sim_units": ("units of the hit-rate estimator (requests or write cycles), all seeds", "units"),
        "analytic_within_ci": ("1 if the analytic hit rate lies inside the simulated 95% interval", "bool"),
        "worked_hit_rate_sim": ("worked example (200 x 10,000 tokens, 50,000 requests/day): simulated hit rate "
                                "by arrival process", "1"),
        "worked_daily_cost_sim_usd": ("worked example: daily cost at the simulated hit rate by arrival process",
                                      "USD/day"),
    })
    for v in list(ds.data_vars):
        for suf in ("_ci_low", "_ci_high"):
            if v.endswith(suf) and v[: -len(suf)] in ds:
                ds[v].attrs.update(long_name=f"{suf[1:].replace('_', ' ')} end of the 95% interval of "
                                             f"{v[: -len(suf)]}", units=ds[v[: -len(suf)]].attrs.get("units", ""))


def _economics_analytic(pricings, lam, rph, P: int, T: int):
    """The closed forms per pricing and rate: (data variables, coordinates, analytic hit rates,
    requests per day)."""
    be = np.array([p.break_even_hit_rate for p in pricings])
    h_an = np.array([[float(p.hit_rate(x)) for x in lam] for p in pricings])
    m_an = np.array([[float(p.multiplier(x)) for x in lam] for p in pricings])
    req_day_r = np.asarray(rph) * 24.0 * P
    cost_an = np.array([[float(daily_cost_usd(p, n_prefixes=P, prefix_tokens=T, requests_per_day=r))
                         for r in req_day_r] for p in pricings])
    cost_unc = np.asarray(daily_cost_uncached_usd(req_day_r, T, pricings[0].base_per_mtok))

    data = {
        "break_even_hit_rate": (("pricing",), be),
        "hit_rate_analytic": (("pricing", "requests_per_hour"), h_an),
        "cost_multiplier_analytic": (("pricing", "requests_per_hour"), m_an),
        "daily_cost_usd": (("pricing", "requests_per_hour"), cost_an),
        "daily_cost_uncached_usd": (("requests_per_hour",), cost_unc),
        "requests_per_day": (("requests_per_hour",), req_day_r),
    }
    coords = {
        "pricing": [p.name for p in pricings],
        "requests_per_hour": np.asarray(rph),
        "write_multiplier": ("pricing", [p.write_multiplier for p in pricings]),
        "read_multiplier": ("pricing", [p.read_multiplier for p in pricings]),
        "ttl_s": ("pricing", [p.ttl_s for p in pricings]),
        "refresh_on_hit": ("pricing", np.array([p.refresh_on_hit for p in pricings], dtype=np.int8)),
        "base_per_mtok": ("pricing", [p.base_per_mtok for p in pricings]),
    }
    return data, coords, h_an, req_day_r


def economics_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _study_cfg(cfg, ECONOMICS_DEFAULTS)
    s = c["sim"]
    names = list(c["pricings"])
    if not names:
        raise StudyError("study.pricings must name at least one preset")
    for n in names:
        if n not in PRESETS:
            raise StudyError(f"study.pricings: unknown preset {n!r}; choose from {sorted(PRESETS)}")
    pricings = [_pricing(n, c["pricing_overrides"], c["base_per_mtok"]) for n in names]
    P, T = int(c["n_prefixes"]), int(c["prefix_tokens"])
    req_day = float(c["requests_per_day"])
    worked_rph = req_day / P / 24.0
    rph = _positive_list("study.requests_per_hour", c["requests_per_hour"])
    if c["include_worked_example"] and not any(abs(r - worked_rph) < 1e-9 for r in rph):
        rph = rph + [worked_rph]
    rph = sorted(rph)
    lam = np.asarray(rph) / HOUR  # per prefix, per second
    seeds = _seeds(cfg)

    data, coords, h_an, req_day_r = _economics_analytic(pricings, lam, rph, P, T)
    extra = {}
    if s["enabled"]:
        pols = sorted({(p.ttl_s, p.refresh_on_hit) for p in pricings})
        max_ttl = max(tt for tt, _ in pols)
        bt = int(s["block_tokens"])
        if T % bt:
            raise StudyError(f"study.sim.block_tokens={bt} must divide prefix_tokens={T}")
        arrivals = list(s["arrivals"]) if c["include_worked_example"] else []
        if arrivals and arrivals[0] != "poisson":
            arrivals = ["poisson"] + [a for a in arrivals if a != "poisson"]
        t_b = time.perf_counter()
        runs = _economics_runs(lam, s, seeds, T, bt, max_ttl, worked_rph, arrivals)
        streams = [compile_stream(r[3]) for r in runs]
        t_build = time.perf_counter() - t_b
        params = [make_params("ttl_refresh" if rf else "ttl_fixed", ttl_s=tt) for tt, rf in pols]
        t_s = time.perf_counter()
        hits = yield from engine_hits(streams, params, seeds=[r[2] for r in runs])
        t_sim = time.perf_counter() - t_s

        h_sim, h_lo, h_hi, h_se, h_all, n_units, sim_req, sim_pref, sim_dur, worked = _economics_estimates(
            pricings, pols, runs, hits, rph, worked_rph, arrivals)
        w_ = np.array([p.write_multiplier for p in pricings])[:, None]
        r_ = np.array([p.read_multiplier for p in pricings])[:, None]
        mult = lambda h: np.asarray(cost_multiplier(h, w_, r_))  # noqa: E731 - decreasing in h when w > r
        m_sim, m_a, m_b = mult(h_sim), mult(h_lo), mult(h_hi)
        m_lo, m_hi = np.minimum(m_a, m_b), np.maximum(m_a, m_b)

        def dcost(h):
            return np.array([[float(daily_cost_usd(p, n_prefixes=P, prefix_tokens=T, requests_per_day=r,
                                                   hit_rate=h[j, i]))
                              for i, r in enumerate(req_day_r)] for j, p in enumerate(pricings)])

        c_sim, c_a, c_b = dcost(h_sim), dcost(h_lo), dcost(h_hi)
        within = np.array([[_within(h_an[j, i], h_lo[j, i], h_hi[j, i]) for i in range(len(rph))]
                           for j in range(len(pricings))])
        dd = ("pricing", "requests_per_hour")
        data.update({
            "hit_rate_sim": (dd, h_sim),
            "hit_rate_sim_ci_low": (dd, h_lo),
            "hit_rate_sim_ci_high": (dd, h_hi),
            "hit_rate_sim_se": (dd, h_se),
            "hit_rate_sim_all_requests": (dd, h_all),
            "cost_multiplier_sim": (dd, m_sim),
            "cost_multiplier_sim_ci_low": (dd, m_lo),
            "cost_multiplier_sim_ci_high": (dd, m_hi),
            "daily_cost_sim_usd": (dd, c_sim),
            "daily_cost_sim_usd_ci_low": (dd, np.minimum(c_a, c_b)),
            "daily_cost_sim_usd_ci_high": (dd, np.maximum(c_a, c_b)),
            "sim_units": (dd, n_units),
            "analytic_within_ci": (dd, within.astype(np.int8)),
            "sim_requests": (("requests_per_hour",), sim_req),
            "sim_prefixes": (("requests_per_hour",), sim_pref),
            "sim_duration_s": (("requests_per_hour",), sim_dur),
        })
        if arrivals:
            wa = ("pricing", "arrival")
            arr_h = np.array([[worked[a].get(p.name, (np.nan,) * 4)[0] for a in arrivals] for p in pricings])
            arr_lo = np.array([[worked[a].get(p.name, (np.nan,) * 4)[1] for a in arrivals] for p in pricings])
            arr_hi = np.array([[worked[a].get(p.name, (np.nan,) * 4)[2] for a in arrivals] for p in pricings])
            arr_cost = np.array([[float(daily_cost_usd(p, n_prefixes=P, prefix_tokens=T, requests_per_day=req_day,
                                                       hit_rate=arr_h[j, k]))
                                  for k in range(len(arrivals))] for j, p in enumerate(pricings)])
            data.update({
                "worked_hit_rate_sim": (wa, arr_h),
                "worked_hit_rate_sim_ci_low": (wa, arr_lo),
                "worked_hit_rate_sim_ci_high": (wa, arr_hi),
                "worked_daily_cost_sim_usd": (wa, arr_cost),
            })
            coords["arrival"] = arrivals
        extra.update(build_time_s=t_build, simulate_time_s=t_sim, seeds=len(seeds), sim_block_tokens=bt,
                     n_streams=len(streams), n_compiled_calls=min(len(streams), len(params)))
    ds = xr.Dataset(data, coords=coords)
    _document_economics(ds)
    ds["requests_per_hour"].attrs.update(long_name="requests per hour per prefix", units="1/h")
    ds.attrs.update(_common_attrs(cfg, "economics", t0, dict(
        n_prefixes=P, prefix_tokens=T, requests_per_day_worked=req_day, worked_example_requests_per_hour=worked_rph,
        base_per_mtok_worked=float(pricings[0].base_per_mtok),
        pricing_sources=json.dumps({p.name: p.source for p in pricings}),
        estimator="refresh: requests at t <= D - TTL, success = the next request of the prefix hits; fixed: writes "
                  "at t <= D - TTL with the hits of their ON period; 95% interval over (seed, prefix) clusters",
        **extra,
    )))
    return ds


# ------------------------------------------------------------------------------ ttl
TTL_DEFAULTS: dict[str, Any] = dict(
    rates_per_hour=[2, 6, 12, 30, 60],
    ttl_s=[60, 300, 900, 3600],
    policies=["ttl_refresh", "ttl_fixed"],
    arrivals=["poisson", "diurnal", "bursty"],
    duration_s=DAY,
    target_requests=20_000,  # per (arrival, rate, seed) run
    min_prefixes=10,
    diurnal_amplitude=0.8,
    diurnal_period_s=DAY,
    burst_cv=3.0,
)


def _model_hit(arrival, refresh, lam, ttl, c, D):
    """(value, exact?) of the hit rate under the arrival model (see :func:`ttl_study`)."""
    if arrival == "poisson":
        return float(ttl_hit(lam, ttl, refresh)), True
    if arrival == "bursty":
        f = ttl_refresh_hit_gamma if refresh else ttl_fixed_hit_gamma
        return f(lam, ttl, c["burst_cv"]), True
    if refresh:
        return ttl_refresh_hit_diurnal(lam, ttl, c["diurnal_amplitude"], D, c["diurnal_period_s"], forward=True), True
    return quasi_static_hit(lam, ttl, c["diurnal_amplitude"], refresh=False, period_s=c["diurnal_period_s"]), False


def ttl_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _study_cfg(cfg, TTL_DEFAULTS)
    rates = _positive_list("study.rates_per_hour", c["rates_per_hour"])
    ttls = _positive_list("study.ttl_s", c["ttl_s"])
    pols = list(c["policies"])
    for p in pols:
        if p not in ("ttl_refresh", "ttl_fixed"):
            raise StudyError(f"study.policies: {p!r} is not a TTL policy (ttl_refresh, ttl_fixed)")
    arrivals = list(c["arrivals"])
    for a in arrivals:
        if a not in ("poisson", "diurnal", "bursty"):
            raise StudyError(f"study.arrivals: unknown arrival process {a!r}")
    D = float(c["duration_s"])
    if D <= 2 * max(ttls):
        raise StudyError("study.duration_s must exceed twice the longest TTL")
    seeds = _seeds(cfg)

    runs = []
    t_b = time.perf_counter()
    for ia, a in enumerate(arrivals):
        for ir, r in enumerate(rates):
            n_pref = max(int(c["min_prefixes"]), int(round(c["target_requests"] / (r / HOUR * D))))
            for sd in seeds:
                runs.append((ia, ir, sd, prefix_poisson_workload(
                    n_prefixes=n_pref, prefix_tokens=16, rate_per_hour=r, duration_s=D, block_tokens=16, arrival=a,
                    diurnal_amplitude=c["diurnal_amplitude"], diurnal_period_s=c["diurnal_period_s"],
                    burst_cv=c["burst_cv"], seed=sd * 1000 + ia * 100 + ir)))
    streams = [compile_stream(r[3]) for r in runs]
    t_build = time.perf_counter() - t_b
    cfgs = [(p, tt) for p in pols for tt in ttls]
    params = [make_params(p, ttl_s=tt) for p, tt in cfgs]
    t_s = time.perf_counter()
    hits = yield from engine_hits(streams, params, seeds=[r[2] for r in runs])
    t_sim = time.perf_counter() - t_s

    shape = (len(arrivals), len(pols), len(rates), len(ttls))
    est, lo, hi, se = (np.full(shape, np.nan) for _ in range(4))
    units = np.zeros(shape, dtype=np.int64)
    model = np.full(shape, np.nan)
    exact = np.zeros(shape, dtype=np.int8)
    for k, (p, tt) in enumerate(cfgs):
        ip, it = pols.index(p), ttls.index(tt)
        refresh = p == "ttl_refresh"
        acc: dict[tuple, list] = {}
        for (ia, ir, sd, wl), hb in zip(runs, hits[k]):
            u, h, _ = _ttl_cell(wl, hb, tt, refresh)
            acc.setdefault((ia, ir), []).append((u, h))
        for (ia, ir), recs in acc.items():
            u = np.concatenate([x[0] for x in recs])
            h = np.concatenate([x[1] for x in recs])
            est[ia, ip, ir, it], lo[ia, ip, ir, it], hi[ia, ip, ir, it], se[ia, ip, ir, it] = ratio_interval(h, u)
            units[ia, ip, ir, it] = int(u.sum())
            mv, ex = _model_hit(arrivals[ia], refresh, rates[ir] / HOUR, tt, c, D)
            model[ia, ip, ir, it], exact[ia, ip, ir, it] = mv, ex
    lam = np.asarray(rates) / HOUR
    an = np.stack([np.asarray(ttl_hit(lam[:, None], np.asarray(ttls)[None, :], p == "ttl_refresh")) for p in pols])
    an = np.broadcast_to(an, shape).copy()
    within_an = ((an >= lo - 1e-12) & (an <= hi + 1e-12)).astype(np.int8)
    within_model = ((model >= lo - 1e-12) & (model <= hi + 1e-12)).astype(np.int8)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (est - an) / se, np.where(est == an, 0.0, np.nan))
    dims = ("arrival", "policy", "rate_per_hour", "ttl_s")
    ds = xr.Dataset(
        {
            "hit_rate_analytic": (dims, an),
            "hit_rate_model": (dims, model),
            "model_exact": (dims, exact),
            "hit_rate_sim": (dims, est),
            "hit_rate_sim_ci_low": (dims, lo),
            "hit_rate_sim_ci_high": (dims, hi),
            "hit_rate_sim_se": (dims, se),
            "sim_units": (dims, units),
            "error_vs_analytic": (dims, est - an),
            "z_vs_analytic": (dims, z),
            "analytic_within_ci": (dims, within_an),
            "model_within_ci": (dims, within_model),
            "lambda_ttl": (("rate_per_hour", "ttl_s"), lam[:, None] * np.asarray(ttls)[None, :]),
        },
        coords={"arrival": arrivals, "policy": pols, "rate_per_hour": np.asarray(rates), "ttl_s": np.asarray(ttls)},
    )
    _doc(ds, {
        "hit_rate_analytic": ("Poisson steady-state hit rate at the mean rate (FACTS formulas)", "1"),
        "hit_rate_model": ("hit rate under the arrival model: Poisson formula, gamma renewal (bursty), "
                           "inhomogeneous Poisson (diurnal refresh, exact) or quasi-static (diurnal fixed)", "1"),
        "model_exact": ("1 if hit_rate_model is exact for the arrival process (0: quasi-static approximation)",
                        "bool"),
        "hit_rate_sim": ("simulated hit rate (engine; unbiased units estimator)", "1"),
        "hit_rate_sim_ci_low": ("low end of the 95% interval of hit_rate_sim", "1"),
        "hit_rate_sim_ci_high": ("high end of the 95% interval of hit_rate_sim", "1"),
        "hit_rate_sim_se": ("cluster-robust standard error of hit_rate_sim", "1"),
        "sim_units": ("estimator units (requests or write cycles), all seeds", "units"),
        "error_vs_analytic": ("hit_rate_sim - hit_rate_analytic", "1"),
        "z_vs_analytic": ("(hit_rate_sim - hit_rate_analytic) / se", "1"),
        "analytic_within_ci": ("1 if the Poisson formula lies inside the 95% interval", "bool"),
        "model_within_ci": ("1 if hit_rate_model lies inside the 95% interval", "bool"),
        "lambda_ttl": ("lambda * TTL (expected requests per TTL)", "1"),
    })
    ds["rate_per_hour"].attrs.update(long_name="mean requests per hour per prefix", units="1/h")
    ds["ttl_s"].attrs.update(long_name="time to live", units="s")
    ds.attrs.update(_common_attrs(cfg, "ttl", t0, dict(
        duration_s=D, diurnal_amplitude=float(c["diurnal_amplitude"]), diurnal_period_s=float(c["diurnal_period_s"]),
        burst_cv=float(c["burst_cv"]), seeds=len(seeds), build_time_s=t_build, simulate_time_s=t_sim,
        n_streams=len(streams), n_compiled_calls=min(len(streams), len(params)),
        estimator="refresh: requests at t <= D - TTL, success = the next request of the prefix hits; fixed: writes "
                  "at t <= D - TTL with the hits of their ON period; 95% interval over (seed, prefix) clusters",
    )))
    return ds


# ------------------------------------------------------------------------------ che
CHE_DEFAULTS: dict[str, Any] = dict(
    n_prefixes=1000,
    prefix_tokens=64,
    shared_tokens=0,
    block_tokens=16,
    zipf_s=0.8,
    n_requests=40_000,  # expected requests per seed
    duration_s=HOUR,
    capacity_blocks=[100, 200, 400, 800, 1600, 2400, 3200],
    routers=["single", "random", "prefix_hash"],
    replicas=4,
    prefix_blocks=80,
    warmup_fraction=0.25,
    tolerance=0.02,
)


def che_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _study_cfg(cfg, CHE_DEFAULTS)
    caps = _positive_list("study.capacity_blocks", c["capacity_blocks"], integer=True)
    routers = list(c["routers"])
    for r in routers:
        if r not in ("single", "random", "prefix_hash"):
            raise StudyError(f"study.routers: {r!r}; choose from single, random, prefix_hash")
    R = int(c["replicas"])
    if R < 1:
        raise StudyError("study.replicas must be >= 1")
    wf = float(c["warmup_fraction"])
    if not 0 <= wf < 1:
        raise StudyError("study.warmup_fraction must lie in [0, 1)")
    seeds = _seeds(cfg)
    D = float(c["duration_s"])
    rate_h = float(c["n_requests"]) / int(c["n_prefixes"]) / (D / HOUR)
    t_b = time.perf_counter()
    wls = [prefix_poisson_workload(
        n_prefixes=int(c["n_prefixes"]), prefix_tokens=int(c["prefix_tokens"]), shared_tokens=int(c["shared_tokens"]),
        rate_per_hour=rate_h, duration_s=D, block_tokens=int(c["block_tokens"]), popularity="zipf",
        zipf_s=float(c["zipf_s"]), seed=sd) for sd in seeds]
    streams = [compile_stream(w) for w in wls]
    t_build = time.perf_counter() - t_b
    cells = [(r, cap) for r in routers for cap in caps]
    params = [make_params("lru", capacity_blocks=cap, replicas=1 if r == "single" else R,
                          router="round_robin" if r == "single" else r, prefix_blocks=int(c["prefix_blocks"]))
              for r, cap in cells]
    t_s = time.perf_counter()
    hits = yield from engine_hits(streams, params, max_replicas=R if any(r != "single" for r in routers) else 1,
                                  seeds=seeds)
    t_sim = time.perf_counter() - t_s

    shape = (len(routers), len(caps), len(seeds))
    sim = np.full(shape, np.nan)
    che = np.full(shape, np.nan)
    tc = np.full(shape, np.nan)
    for k, (r, cap) in enumerate(cells):
        ir, ic = routers.index(r), caps.index(cap)
        for js, w in enumerate(wls):
            hb = hits[k][js].astype(np.int64)
            start = int(math.floor(wf * w.n_requests))
            sim[ir, ic, js] = hb[start:].sum() / max(1, int(w.n_blocks[start:].sum()))
            res = che_fleet(w, cap, replicas=1 if r == "single" else R, router="random" if r == "single" else r,
                            prefix_blocks=int(c["prefix_blocks"]), duration_s=D)
            che[ir, ic, js], tc[ir, ic, js] = res.overall, res.characteristic_time
    S = len(seeds)
    mean_sim, mean_che = sim.mean(-1), che.mean(-1)
    if S > 1:
        sd = sim.std(-1, ddof=1)
        q = float(stats.t.ppf(0.975, S - 1))
        lo, hi = mean_sim - q * sd / math.sqrt(S), mean_sim + q * sd / math.sqrt(S)
    else:
        lo = hi = np.full(mean_sim.shape, np.nan)
    err = mean_sim - mean_che
    tol = float(c["tolerance"])
    dd = ("router", "capacity_blocks")
    ds = xr.Dataset(
        {
            "hit_rate_sim": (dd + ("seed",), sim),
            "hit_rate_che": (dd + ("seed",), che),
            "characteristic_time_s": (dd + ("seed",), tc),
            "hit_rate_sim_mean": (dd, mean_sim),
            "hit_rate_sim_ci_low": (dd, lo),
            "hit_rate_sim_ci_high": (dd, hi),
            "hit_rate_che_mean": (dd, mean_che),
            "error_vs_che": (dd, err),
            "within_tolerance": (dd, (np.abs(err) <= tol).astype(np.int8)),
        },
        coords={"router": routers, "capacity_blocks": np.asarray(caps), "seed": np.asarray(seeds)},
    )
    _doc(ds, {
        "hit_rate_sim": ("simulated block hit ratio after the warm-up (leaf-first LRU)", "1"),
        "hit_rate_che": ("Che's approximation from the workload's block-key rates", "1"),
        "characteristic_time_s": ("Che characteristic time (largest over replicas)", "s"),
        "hit_rate_sim_mean": ("simulated block hit ratio, mean over seeds", "1"),
        "hit_rate_sim_ci_low": ("low end of the 95% t interval over seeds", "1"),
        "hit_rate_sim_ci_high": ("high end of the 95% t interval over seeds", "1"),
        "hit_rate_che_mean": ("Che's prediction, mean over seeds", "1"),
        "error_vs_che": ("hit_rate_sim_mean - hit_rate_che_mean", "1"),
        "within_tolerance": (f"1 if |error_vs_che| <= {tol}", "bool"),
    })
    ds["capacity_blocks"].attrs.update(long_name="cache capacity per replica", units="blocks")
    w0 = wls[0]
    ds.attrs.update(_common_attrs(cfg, "che", t0, dict(
        n_prefixes=int(c["n_prefixes"]), prefix_tokens=int(c["prefix_tokens"]), shared_tokens=int(c["shared_tokens"]),
        block_tokens=int(c["block_tokens"]), zipf_s=float(c["zipf_s"]), replicas=R, warmup_fraction=wf,
        tolerance=tol, distinct_blocks=int(np.unique(w0.keys).size), n_requests_mean=float(np.mean(
            [w.n_requests for w in wls])), seeds=S, build_time_s=t_build, simulate_time_s=t_sim,
        max_abs_error=float(np.nanmax(np.abs(err))),
    )))
    return ds


# ------------------------------------------------------------------------------ ttl advisor
ADVISOR_DEFAULTS: dict[str, Any] = dict(
    options=["anthropic_5m", "anthropic_1h", "none"],
    pricing_overrides={},
    base_per_mtok=3.0,
    design=dict(n_tenants=200, prefix_tokens=10_000, suffix_tokens=200, n_requests=50_000, duration_s=DAY,
                hot_share=0.0, tenant_law="uniform", zipf_s=1.0),
    scenarios={
        "seed_design": {},
        "zipf": {"tenant_law": "zipf", "zipf_s": 1.0},
        "zipf_low_traffic": {"tenant_law": "zipf", "zipf_s": 1.0, "n_requests": 5_000},
    },
    sim=dict(enabled=True, block_tokens=1000),
)


def ttl_advisor_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _study_cfg(cfg, {**ADVISOR_DEFAULTS, "scenarios": {}})
    if not c["scenarios"]:
        c["scenarios"] = dict(ADVISOR_DEFAULTS["scenarios"])
    options = list(c["options"])
    pr = {o: _pricing(o, c["pricing_overrides"], c["base_per_mtok"]) for o in options if o != "none"}
    base = float(c["base_per_mtok"])
    seeds = _seeds(cfg)
    scen = list(c["scenarios"])
    design = dict(c["design"])
    for k, v in c["scenarios"].items():
        bad = set(v or {}) - set(design)
        if bad:
            raise StudyError(f"study.scenarios.{k}: unknown keys {sorted(bad)}; known: {sorted(design)}")
    P = int(design["n_tenants"])
    T = int(design["prefix_tokens"])
    bt = int(c["sim"]["block_tokens"])
    if T % bt:
        raise StudyError(f"study.sim.block_tokens={bt} must divide prefix_tokens={T}")
    opt_all = options + ["advised"]
    an = np.zeros((len(scen), len(opt_all)))
    sim = np.full((len(scen), len(opt_all), len(seeds)), np.nan)
    oracle = np.full((len(scen), len(seeds)), np.nan)
    rate_h = np.zeros((len(scen), P))
    choice = np.zeros((len(scen), P), dtype=np.int64)
    best_uniform = []
    ttl_pols = sorted({(p.ttl_s, p.refresh_on_hit) for p in pr.values()})
    t_sim = 0.0
    for i, name in enumerate(scen):
        args = {**design, **(c["scenarios"][name] or {})}
        wls = [design_workload(**args, block_tokens=bt, seed=sd) for sd in seeds]
        D = float(args["duration_s"])
        # per-prefix rates as seen in the data (first seed): requests / duration
        rates = np.bincount(wls[0].tenant, minlength=P) / D
        adv = advise_ttl(rates, T, options, pricings=pr)
        rate_h[i] = rates * HOUR
        choice[i] = adv.choice
        an[i, : len(options)] = [adv.uniform_usd_per_day[o] for o in options]
        an[i, -1] = adv.advised_usd_per_day
        best_uniform.append(adv.best_uniform)
        if not c["sim"]["enabled"]:
            continue
        streams = [compile_stream(w) for w in wls]
        params = [make_params("ttl_refresh" if rf else "ttl_fixed", ttl_s=tt) for tt, rf in ttl_pols]
        ts = time.perf_counter()
        hits = yield from engine_hits(streams, params, seeds=seeds)
        t_sim += time.perf_counter() - ts
        for js, w in enumerate(wls):
            pcost = np.zeros((P, len(options)))  # simulated daily cost per prefix and option
            cnt = np.bincount(w.tenant, minlength=P).astype(np.float64)
            for jo, o in enumerate(options):
                if o == "none":
                    pcost[:, jo] = cnt * T * base / 1e6
                    continue
                p = pr[o]
                hb = hits[ttl_pols.index((p.ttl_s, p.refresh_on_hit))][js]
                hit = hb >= T // bt
                nh = np.bincount(w.tenant[hit], minlength=P).astype(np.float64)
                pcost[:, jo] = p.base_per_mtok / 1e6 * T * (nh * p.read_multiplier + (cnt - nh) * p.write_multiplier)
            sim[i, : len(options), js] = pcost.sum(0)
            sim[i, -1, js] = pcost[np.arange(P), adv.choice].sum()
            oracle[i, js] = pcost.min(1).sum()
    dims = ("scenario", "option")
    mean = np.nanmean(sim, -1) if c["sim"]["enabled"] else np.full(an.shape, np.nan)
    ds = xr.Dataset(
        {
            "daily_cost_analytic_usd": (dims, an),
            "daily_cost_sim_usd": (dims + ("seed",), sim),
            "daily_cost_sim_mean_usd": (dims, mean),
            "daily_cost_sim_oracle_usd": (("scenario", "seed"), oracle),
            "rate_per_hour": (("scenario", "prefix"), rate_h),
            "choice": (("scenario", "prefix"), choice),
            "best_uniform": (("scenario",), np.asarray(best_uniform, dtype=object).astype(str)),
        },
        coords={"scenario": scen, "option": opt_all, "seed": np.asarray(seeds), "prefix": np.arange(P)},
    )
    _doc(ds, {
        "daily_cost_analytic_usd": ("expected daily cost of the prefix tokens (steady state); 'advised' = each "
                                    "prefix on its cheapest option", "USD/day"),
        "daily_cost_sim_usd": ("simulated daily cost of the prefix tokens (engine, every request)", "USD/day"),
        "daily_cost_sim_mean_usd": ("simulated daily cost, mean over seeds", "USD/day"),
        "daily_cost_sim_oracle_usd": ("simulated cost with each prefix on its ex-post cheapest option", "USD/day"),
        "rate_per_hour": ("requests per hour of each prefix (counted in the first seed's workload)", "1/h"),
        "choice": ("index into option of the advised option per prefix", "1"),
    })
    ds.attrs.update(_common_attrs(cfg, "ttl_advisor", t0, dict(
        options=json.dumps(options), n_prefixes=P, prefix_tokens=T, seeds=len(seeds), simulate_time_s=t_sim,
        scenarios=json.dumps({k: {**design, **(v or {})} for k, v in c["scenarios"].items()}),
        pricing_sources=json.dumps({k: p.source for k, p in pr.items()}),
    )))
    return ds




# ------------------------------------------------------------------------------ summaries
def _fmt_rph(x) -> str:
    return f"{x:g}" if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def summarize_economics(ds) -> str:
    a = ds.attrs
    out = _header(ds)
    names = [str(p) for p in ds.pricing.values]
    out.append("")
    out.append("Break-even hit rate (h*r + (1-h)*w = 1, i.e. (w - 1)/(w - r)): "
               + ", ".join(f"{n} {_pct(ds.break_even_hit_rate.sel(pricing=n))}" for n in names))
    has_sim = "hit_rate_sim" in ds
    out.append("")
    out.append("Hit rate and cost multiplier by requests per hour per prefix (analytic"
               + (" | simulated [95% interval]" if has_sim else "") + "):")
    rows = [["req/h"] + [f"{n} {k}" for n in names for k in ("hit", "mult")]]
    for r in ds.requests_per_hour.values:
        row = [_fmt_rph(r)]
        for n in names:
            s = ds.sel(pricing=n, requests_per_hour=r)
            h = _pct(s.hit_rate_analytic)
            m = f"{float(s.cost_multiplier_analytic):.3f}x"
            if has_sim:
                h += f" | {_pct(s.hit_rate_sim)} [{_pct(s.hit_rate_sim_ci_low)}, {_pct(s.hit_rate_sim_ci_high)}]"
                if not int(s.analytic_within_ci):
                    h += " *"
                m += f" | {float(s.cost_multiplier_sim):.3f}x"
            row += [h, m]
        rows.append(row)
    out.append(_table(rows))
    wr = float(a.get("worked_example_requests_per_hour", np.nan))
    sel = [r for r in ds.requests_per_hour.values if abs(r - wr) < 1e-9]
    if sel:
        s = ds.sel(requests_per_hour=sel[0])
        out.append("")
        out.append(f"Worked example: {a['n_prefixes']} prefixes x {a['prefix_tokens']:,} tokens, "
                   f"{a['requests_per_day_worked']:,.0f} requests/day, ${a['base_per_mtok_worked']:g} per million "
                   f"input tokens ({wr:.2f} requests/hour per prefix):")
        out.append(f"  uncached {_usd(s.daily_cost_uncached_usd)}/day")
        for n in names:
            x = s.sel(pricing=n)
            line = f"  {n}: {_usd(x.daily_cost_usd)}/day (hit rate {_pct(x.hit_rate_analytic, 2)})"
            if has_sim:
                line += (f"; simulated {_usd(x.daily_cost_sim_usd)} [{_usd(x.daily_cost_sim_usd_ci_low)}, "
                         f"{_usd(x.daily_cost_sim_usd_ci_high)}], hit rate {_pct(x.hit_rate_sim, 2)}")
            out.append(line)
        out.append("  (seed: $1500 uncached, $874, $150, $717)")
    if "worked_hit_rate_sim" in ds:
        out.append("")
        out.append("Worked example under other arrival processes with the same mean rate (simulated hit rate and "
                   "daily cost; diurnal: rate x (1 - a cos(2 pi t / day)), bursty: gamma gaps):")
        rows = [["pricing", "Poisson formula"] + [str(x) for x in ds.arrival.values]]
        for n in names:
            x0 = ds.sel(pricing=n, requests_per_hour=sel[0]) if sel else None
            row = [n, "n/a" if x0 is None else f"{_pct(x0.hit_rate_analytic)} {_usd(x0.daily_cost_usd)}/day"]
            for arr in ds.arrival.values:
                x = ds.sel(pricing=n, arrival=arr)
                row.append(f"{_pct(x.worked_hit_rate_sim)} {_usd(x.worked_daily_cost_sim_usd)}/day")
            rows.append(row)
        out.append(_table(rows))
    if has_sim:
        flags = int((ds.analytic_within_ci == 0).sum())
        cells = int(ds.analytic_within_ci.size)
        # pricings with the same TTL policy share their simulation: count distinct comparisons too
        pol = {(float(t), int(r)) for t, r in zip(ds.ttl_s.values, ds.refresh_on_hit.values)}
        firsts = [list(zip(ds.ttl_s.values, ds.refresh_on_hit.values)).index(p) for p in
                  sorted(pol, key=lambda p: list(zip(ds.ttl_s.values.astype(float),
                                                     ds.refresh_on_hit.values.astype(int))).index(p))]
        distinct = ds.analytic_within_ci.isel(pricing=firsts)
        d_cells, d_flags = int(distinct.size), int((distinct == 0).sum())
        out.append("")
        out.append(f"Simulated vs analytic: {cells - flags}/{cells} cells have the analytic hit rate inside the 95% "
                   f"interval (* = outside); pricings with the same TTL share a simulation, so {d_cells - d_flags}/"
                   f"{d_cells} distinct comparisons (about {0.05 * d_cells:.1f} outside expected by chance). "
                   f"Estimator: {a['estimator']}; "
                   f"{a.get('seeds', '?')} seed(s), {a.get('n_streams', '?')} runs, block size "
                   f"{a.get('sim_block_tokens', '?')} tokens.")
    return "\n".join(out)


def summarize_ttl(ds) -> str:
    out = _header(ds)
    a = ds.attrs
    out.append("")
    out.append(f"lambda x TTL grid over {a['duration_s'] / HOUR:g} h, {a.get('seeds')} seed(s); simulated hit rate "
               "[95% interval] vs the Poisson formula (refresh 1 - exp(-lambda TTL), "
               "fixed lambda TTL / (1 + lambda TTL))")
    for arr in ds.arrival.values:
        for pol in ds.policy.values:
            s = ds.sel(arrival=arr, policy=pol)
            out.append("")
            out.append(f"{arr}, {pol}:")
            rows = [["req/h \\ TTL"] + [f"{t:g} s" for t in ds.ttl_s.values]]
            for r in ds.rate_per_hour.values:
                row = [f"{r:g}"]
                for t in ds.ttl_s.values:
                    x = s.sel(rate_per_hour=r, ttl_s=t)
                    cell = f"{_pct(x.hit_rate_sim)} vs {_pct(x.hit_rate_analytic)}"
                    if arr != "poisson":
                        cell += f" (model {_pct(x.hit_rate_model)}{'' if int(x.model_exact) else '~'})"
                    if not int(x.analytic_within_ci):
                        cell += " *"
                    row.append(cell)
                rows.append(row)
            out.append(_table(rows))
    out.append("")
    p = ds.sel(arrival="poisson") if "poisson" in ds.arrival.values else None
    if p is not None:
        n = int(p.analytic_within_ci.size)
        bad = int((p.analytic_within_ci == 0).sum())
        pv = float(stats.binom.sf(bad - 1, n, 0.05)) if bad else 1.0
        out.append(f"Poisson arrivals: {n - bad}/{n} cells have the analytic value inside the 95% interval; "
                   f"{bad} outside (expected {0.05 * n:.1f} by chance; P(>= {bad} | all correct) = {pv:.2f}).")
        zs = np.asarray(p.z_vs_analytic.values).reshape(-1)
        zs = zs[np.isfinite(zs)]
        if zs.size:
            chi = float(np.sum(zs**2))
            out.append(f"  z-scores: mean {zs.mean():+.2f}, sd {zs.std(ddof=1) if zs.size > 1 else 0:.2f}, "
                       f"sum z^2 = {chi:.1f} on {zs.size} df (p = {float(stats.chi2.sf(chi, zs.size)):.2f}); "
                       f"max |error| {float(np.nanmax(np.abs(p.error_vs_analytic))) * 100:.2f} points")
        for pol in p.policy.values:
            for r in p.rate_per_hour.values:
                for t in p.ttl_s.values:
                    x = p.sel(policy=pol, rate_per_hour=r, ttl_s=t)
                    if not int(x.analytic_within_ci):
                        out.append(f"  flagged: {pol}, {r:g}/h, TTL {t:g} s: sim {_pct(x.hit_rate_sim, 2)} "
                                   f"[{_pct(x.hit_rate_sim_ci_low, 2)}, {_pct(x.hit_rate_sim_ci_high, 2)}] vs "
                                   f"{_pct(x.hit_rate_analytic, 2)} (z = {float(x.z_vs_analytic):+.2f})")
    for arr in [x for x in ds.arrival.values if x != "poisson"]:
        s = ds.sel(arrival=arr)
        err = s.error_vs_analytic
        ok = s.where(s.model_exact == 1).model_within_ci
        n_ex = int((s.model_exact == 1).sum())
        out.append(f"{arr}: the Poisson formula is off by up to {float(np.nanmax(np.abs(err))) * 100:.1f} points "
                   f"(mean {float(err.mean()) * 100:+.1f}); {int((s.analytic_within_ci == 0).sum())}/"
                   f"{int(s.analytic_within_ci.size)} cells outside the interval; the exact model of the process is "
                   f"inside in {int(np.nansum(ok))}/{n_ex} exact cells" + (
                       "; diurnal fixed-TTL uses the quasi-static approximation (~)" if arr == "diurnal" else ""))
    return "\n".join(out)


def summarize_che(ds) -> str:
    out = _header(ds)
    a = ds.attrs
    out.append("")
    out.append(f"Zipf(s={a['zipf_s']:g}) over {a['n_prefixes']} prefixes of {a['prefix_tokens']} tokens "
               f"({a['distinct_blocks']} distinct blocks of {a['block_tokens']} tokens), about "
               f"{a['n_requests_mean']:,.0f} requests per seed, {a['seeds']} seed(s), warm-up "
               f"{100 * a['warmup_fraction']:.0f}% discarded; fleets of {a['replicas']} replicas for random and "
               "prefix_hash (capacity per replica). Block hit ratio, simulated [95% t interval over seeds] vs Che:")
    rows = [["capacity"] + [str(r) for r in ds.router.values]]
    for cap in ds.capacity_blocks.values:
        row = [str(int(cap))]
        for r in ds.router.values:
            x = ds.sel(router=r, capacity_blocks=cap)
            row.append(f"{_pct(x.hit_rate_sim_mean)} [{_pct(x.hit_rate_sim_ci_low)}, {_pct(x.hit_rate_sim_ci_high)}] "
                       f"vs {_pct(x.hit_rate_che_mean)} ({100 * float(x.error_vs_che):+.2f})")
        rows.append(row)
    out.append(_table(rows))
    out.append("")
    out.append(f"max |sim - Che| = {100 * a['max_abs_error']:.2f} points (tolerance {100 * a['tolerance']:.0f}); "
               f"{int(ds.within_tolerance.sum())}/{int(ds.within_tolerance.size)} cells within tolerance")
    return "\n".join(out)


def summarize_advisor(ds) -> str:
    out = _header(ds)
    a = ds.attrs
    opts = [str(o) for o in ds.option.values]
    out.append("")
    out.append(f"TTL advisor: for each prefix the cheapest of {', '.join(json.loads(a['options']))} from its request "
               f"rate; daily cost of the {a['prefix_tokens']:,}-token prefixes (analytic | simulated, mean over "
               f"{a['seeds']} seed(s)):")
    rows = [["scenario"] + opts + ["advised choice", "saving vs best uniform", "saving vs all-" + opts[0]]]
    for s in ds.scenario.values:
        x = ds.sel(scenario=s)
        row = [str(s)]
        for o in opts:
            y = x.sel(option=o)
            row.append(f"{_usd(y.daily_cost_analytic_usd)} | {_usd(y.daily_cost_sim_mean_usd)}")
        ch = np.asarray(x.choice.values)
        row.append(", ".join(f"{opts[i]} x{int(np.sum(ch == i))}" for i in range(len(opts) - 1) if np.sum(ch == i)))
        bu = str(x.best_uniform.values)
        sav = float(x.daily_cost_analytic_usd.sel(option=bu) - x.daily_cost_analytic_usd.sel(option="advised"))
        sav_sim = float(x.daily_cost_sim_mean_usd.sel(option=bu) - x.daily_cost_sim_mean_usd.sel(option="advised"))
        row.append(f"{_usd(sav)} | {_usd(sav_sim)} vs all-{bu}")
        d_an, d_sim = (x[v].sel(option=opts[0]) - x[v].sel(option="advised")
                       for v in ("daily_cost_analytic_usd", "daily_cost_sim_mean_usd"))
        row.append(f"{_usd(d_an)} | {_usd(d_sim)}")
        rows.append(row)
    out.append(_table(rows))
    out.append("(simulated costs count every request of the day, so the first write of each prefix is included; the "
               "analytic ones are steady state)")
    for s in ds.scenario.values:
        r = ds.sel(scenario=s).rate_per_hour.values
        out.append(f"  {s}: prefix rates {r.min():.2f}-{r.max():.1f} requests/hour")
    return "\n".join(out)




# ------------------------------------------------------------------------------ figures
def plot_economics(ds):
    fig = _fig(11, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    x = ds.requests_per_hour.values
    xs = np.geomspace(x.min() / 2, x.max() * 2, 200)
    for n in ds.pricing.values:
        s = ds.sel(pricing=n)
        p = _pricing(str(n), {}, None).replace(ttl_s=float(s.ttl_s), write_multiplier=float(s.write_multiplier),
                                                read_multiplier=float(s.read_multiplier),
                                                refresh_on_hit=bool(int(s.refresh_on_hit)))
        ls = ("-", "--", ":", "-.")[list(ds.pricing.values).index(n) % 4]
        line = ax1.plot(xs, 100 * np.asarray(p.hit_rate(xs / HOUR)), ls=ls, label=str(n))[0]
        ax2.plot(xs, np.asarray(p.multiplier(xs / HOUR)), ls=ls, color=line.get_color(), label=str(n))
        if "hit_rate_sim" in ds:
            _errbar(ax1, x, 100 * s.hit_rate_sim, 100 * s.hit_rate_sim_ci_low, 100 * s.hit_rate_sim_ci_high,
                    color=line.get_color())
            _errbar(ax2, x, s.cost_multiplier_sim, s.cost_multiplier_sim_ci_low, s.cost_multiplier_sim_ci_high,
                    color=line.get_color())
        ax2.axhline(1.0, color="k", lw=0.8, ls=":")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("requests per hour per prefix")
        ax.grid(True, alpha=0.3)
    ax1.set_ylabel("hit rate (%)")
    ax2.set_ylabel("cost multiplier (x uncached)")
    ax1.set_title("lines: analytic; points: simulated, 95% interval")
    ax2.set_title(f"{ds.attrs.get('experiment', '')}: cost relative to uncached")
    ax2.legend(fontsize="small")
    return fig


def plot_ttl(ds):
    arrs = list(ds.arrival.values)
    pols = list(ds.policy.values)
    fig = _fig(5 * len(pols), 4 * (1 + (len(arrs) > 1)))
    axes = fig.subplots(1 + (len(arrs) > 1), len(pols), squeeze=False)
    lt = np.geomspace(float(ds.lambda_ttl.min()) / 2, float(ds.lambda_ttl.max()) * 2, 300)
    colors = {"poisson": "C0", "diurnal": "C1", "bursty": "C2"}
    for j, pol in enumerate(pols):
        ax = axes[0, j]
        ax.plot(lt, 100 * np.asarray(ttl_hit(lt, 1.0, pol == "ttl_refresh")), "k-", lw=1, label="Poisson formula")
        for arr in arrs:
            s = ds.sel(arrival=arr, policy=pol)
            xv = np.asarray(s.lambda_ttl.values).reshape(-1)
            o = np.argsort(xv)
            _errbar(ax, xv[o], 100 * np.asarray(s.hit_rate_sim.values).reshape(-1)[o],
                    100 * np.asarray(s.hit_rate_sim_ci_low.values).reshape(-1)[o],
                    100 * np.asarray(s.hit_rate_sim_ci_high.values).reshape(-1)[o],
                    color=colors.get(str(arr), None), label=f"simulated, {arr}")
        ax.set_xscale("log")
        ax.set_xlabel("lambda x TTL")
        ax.set_ylabel("hit rate (%)")
        ax.set_title(str(pol))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
        if len(arrs) > 1:
            ax = axes[1, j]
            for arr in arrs:
                s = ds.sel(arrival=arr, policy=pol)
                xv = np.asarray(s.lambda_ttl.values).reshape(-1)
                e = 100 * np.asarray(s.error_vs_analytic.values).reshape(-1)
                lo = 100 * (np.asarray(s.hit_rate_sim_ci_low.values) - np.asarray(s.hit_rate_analytic.values))
                hi = 100 * (np.asarray(s.hit_rate_sim_ci_high.values) - np.asarray(s.hit_rate_analytic.values))
                o = np.argsort(xv)
                _errbar(ax, xv[o], e[o], lo.reshape(-1)[o], hi.reshape(-1)[o], color=colors.get(str(arr)),
                        label=str(arr))
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel("lambda x TTL (mean rate)")
            ax.set_ylabel("simulated - Poisson formula (points)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="x-small")
    return fig


def plot_che(ds):
    fig = _fig(7.5, 4.5)
    ax = fig.subplots()
    x = ds.capacity_blocks.values
    for i, r in enumerate(ds.router.values):
        s = ds.sel(router=r)
        ax.plot(x, 100 * s.hit_rate_che_mean, "-", color=f"C{i}", label=f"Che, {r}")
        _errbar(ax, x, 100 * s.hit_rate_sim_mean, 100 * s.hit_rate_sim_ci_low.fillna(s.hit_rate_sim_mean),
                100 * s.hit_rate_sim_ci_high.fillna(s.hit_rate_sim_mean), color=f"C{i}", label=f"simulated, {r}")
    ax.set_xscale("log")
    ax.set_xlabel("capacity per replica (blocks)")
    ax.set_ylabel("block hit ratio (%)")
    ax.set_title(f"LRU under Zipf(s={ds.attrs.get('zipf_s', '?')}): simulated vs Che")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_advisor(ds):
    fig = _fig(11, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    opts = [str(o) for o in ds.option.values]
    xs = np.arange(ds.sizes["scenario"])
    wdt = 0.8 / len(opts)
    for j, o in enumerate(opts):
        y = ds.daily_cost_analytic_usd.sel(option=o).values
        ax1.bar(xs - 0.4 + wdt * (j + 0.5), y, wdt, label=o)
        if np.all(np.isfinite(ds.daily_cost_sim_mean_usd.sel(option=o).values)):
            ax1.plot(xs - 0.4 + wdt * (j + 0.5), ds.daily_cost_sim_mean_usd.sel(option=o).values, "k.", ms=6)
    ax1.set_xticks(xs, [str(s) for s in ds.scenario.values])
    ax1.set_ylabel("daily cost of prefix tokens (USD); dots: simulated")
    ax1.legend(fontsize="small")
    ax1.grid(True, axis="y", alpha=0.3)
    r = np.geomspace(0.05, 1000, 400)
    for o in opts[:-1]:
        if o == "none":
            ax2.plot(r, np.ones_like(r), label=o)
        else:
            ax2.plot(r, np.asarray(_pricing(o, {}, None).multiplier(r / HOUR)), label=o)
    for i, s in enumerate(ds.scenario.values):
        rr = ds.rate_per_hour.sel(scenario=s).values
        ax2.plot(rr, np.full(rr.shape, 2.05 + 0.07 * i), "|", ms=8, label=f"prefix rates: {s}")
    ax2.set_xscale("log")
    ax2.set_xlabel("requests per hour per prefix")
    ax2.set_ylabel("cost multiplier")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize="x-small")
    return fig


STUDIES = [
    Study("economics", economics_study, summarize_economics, plot_economics,
          defaults_class("EconomicsDefaults", ECONOMICS_DEFAULTS),
          "break-even hit rates, requests-per-hour table, worked example; simulated beside analytic"),
    Study("ttl", ttl_study, summarize_ttl, plot_ttl, defaults_class("TTLDefaults", TTL_DEFAULTS),
          "rate x TTL grid, refresh / fixed, Poisson / diurnal / bursty: simulated vs the formulas"),
    Study("che", che_study, summarize_che, plot_che, defaults_class("CheDefaults", CHE_DEFAULTS),
          "Zipf prefixes, LRU capacity grid, fleets: simulated vs Che's approximation"),
    Study("ttl_advisor", ttl_advisor_study, summarize_advisor, plot_advisor,
          defaults_class("TTLAdvisorDefaults", ADVISOR_DEFAULTS),
          "cheapest TTL option per prefix on the design scenario, analytic and simulated"),
]


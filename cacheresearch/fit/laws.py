"""Candidate laws fitted by maximum likelihood and chosen by AIC (scipy.stats).

Every fit returns a :class:`Law`: the chosen family, its parameters, its log-likelihood and the AIC
of every candidate (so a report can show the margin). Families:

* positive continuous values (lengths in tokens, gaps in seconds): ``expon``, ``gamma``,
  ``weibull`` (``weibull_min``), ``lognorm`` (:func:`fit_positive`; location fixed at 0, MLE by
  ``scipy.stats.<family>.fit``);
* counts ``k >= 1`` (requests per session, blocks dropped or appended): ``geom``, ``zeta``
  (``scipy.stats.zipf``: ``P(k) ~ k^-a``), ``nbinom1`` (negative binomial shifted by one)
  (:func:`fit_count`); zero-inflated counts ``k >= 0`` add ``P(0)`` (:func:`fit_count0`);
* renewal arrivals on a rescaled clock (unit mean): ``expon`` (Poisson), ``gamma``, ``weibull``
  (:func:`fit_arrivals`, with a piecewise-constant rate whose number of pieces is chosen by AIC too);
* a finite Zipf law over ranked popularities (:func:`fit_zipf_ranks`);
* a mixture of lognormals with the number of components chosen by AIC (:func:`fit_lognorm_mix`),
  for multi-modal lengths (short chat prompts beside long documents).

Laws serialize to plain dicts (:meth:`Law.to_dict`) and sample with NumPy generators
(:func:`sample`), so a fitted model is data, not code.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import optimize, special, stats

__all__ = ["empirical", "is_empirical", "ks_distance", "law_mean", "Law", "fit_positive", "fit_lognorm_mix",
           "mix_components", "mix_responsibilities", "fit_count", "fit_count0", "fit_arrivals", "fit_zipf_ranks",
           "sample", "logpdf", "logsf", "count_logpmf", "count_logsf", "Arrivals", "POSITIVE", "COUNTS", "RENEWAL"]

POSITIVE = ("expon", "gamma", "weibull", "lognorm")
COUNTS = ("geom", "zeta", "nbinom1")
RENEWAL = ("expon", "gamma", "weibull")
_TINY = 1e-300


class Law(NamedTuple):
    family: str
    params: dict
    loglik: float
    n: int
    aic: dict  # candidate -> AIC (inf when the fit failed)

    def to_dict(self) -> dict:
        return {"family": self.family, "params": {k: float(v) for k, v in self.params.items()},
                "loglik": float(self.loglik), "n": int(self.n),
                "aic": {k: (float(v) if math.isfinite(v) else None) for k, v in self.aic.items()}}

    @staticmethod
    def from_dict(d: dict) -> "Law":
        return Law(str(d["family"]), {k: float(v) for k, v in dict(d["params"]).items()}, float(d.get("loglik", 0.0)),
                   int(d.get("n", 0)), {k: (float("inf") if v is None else float(v)) for k, v in
                                        dict(d.get("aic", {})).items()})

    @property
    def mean(self) -> float:
        return float(_frozen(self).mean()) + (1.0 if self.family == "nbinom1" else 0.0)


class _Bound:
    """A scipy distribution with its parameters bound, without building a frozen ``rv_frozen`` (whose
    construction re-instantiates the distribution and formats its docstring: milliseconds per call,
    which dominated the likelihood loops of the session fit)."""

    __slots__ = ("dist", "args", "kw")

    def __init__(self, dist, *args, **kw):
        self.dist, self.args, self.kw = dist, args, kw

    def __getattr__(self, name):
        f = getattr(self.dist, name)
        return lambda *a: f(*a, *self.args, **self.kw)

    def mean(self):
        return self.dist.mean(*self.args, **self.kw)


def _frozen(law: Law):
    p = law.params
    f = law.family
    if f == "expon":
        return _Bound(stats.expon, scale=p["scale"])
    if f == "gamma":
        return _Bound(stats.gamma, p["shape"], scale=p["scale"])
    if f == "weibull":
        return _Bound(stats.weibull_min, p["shape"], scale=p["scale"])
    if f == "lognorm":
        return _Bound(stats.lognorm, p["sigma"], scale=math.exp(p["mu"]))
    if f == "geom":
        return _Bound(stats.geom, p["p"])
    if f == "zeta":
        return _Bound(stats.zipf, p["a"])
    if f == "nbinom1":
        return _Bound(stats.nbinom, p["n"], p["p"])  # k - 1 ~ NB(n, p)
    raise ValueError(f"unknown law family {f!r}")


def _fit_one_positive(family: str, x: np.ndarray) -> tuple[dict, float]:
    if family == "expon":
        p = {"scale": float(x.mean())}
    elif family == "gamma":
        a, _, s = stats.gamma.fit(x, floc=0)
        p = {"shape": float(a), "scale": float(s)}
    elif family == "weibull":
        c, _, s = stats.weibull_min.fit(x, floc=0)
        p = {"shape": float(c), "scale": float(s)}
    elif family == "lognorm":
        lx = np.log(x)
        p = {"mu": float(lx.mean()), "sigma": float(max(lx.std(), 1e-9))}
    else:
        raise ValueError(family)
    ll = float(np.sum(logpdf(Law(family, p, 0.0, 0, {}), x)))
    return p, ll


def logpdf(law: Law, x) -> np.ndarray:
    return _frozen(law).logpdf(np.asarray(x, dtype=np.float64))


def logsf(law: Law, x) -> np.ndarray:
    return _frozen(law).logsf(np.asarray(x, dtype=np.float64))


def fit_positive(x, candidates=POSITIVE, floor: float = 0.0) -> Law:
    """MLE of each candidate on positive values ``x`` (values below ``floor`` are raised to it; a
    positive floor keeps exact zeros, such as tied timestamps, from making a density infinite)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if floor > 0:
        x = np.maximum(x, floor)
    if x.size < 2 or np.any(~np.isfinite(x)) or np.any(x <= 0):
        raise ValueError("fit_positive needs at least two finite positive values")
    best, aic = None, {}
    for fam in candidates:
        try:
            p, ll = _fit_one_positive(fam, x)
        except (ValueError, RuntimeError, FloatingPointError):
            aic[fam] = float("inf")
            continue
        k = len(p)
        aic[fam] = 2 * k - 2 * ll if math.isfinite(ll) else float("inf")
        if math.isfinite(aic[fam]) and (best is None or aic[fam] < aic[best[0]]):
            best = (fam, p, ll)
    if best is None:
        raise ValueError("no candidate law could be fitted")
    return Law(best[0], best[1], best[2], int(x.size), aic)


# ------------------------------------------------------------------------------ counts
def count_logpmf(law: Law, k) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    if law.family == "nbinom1":
        return stats.nbinom.logpmf(k - 1, law.params["n"], law.params["p"])
    return _frozen(law).logpmf(k)


def _zeta_logsf(a: float, k: np.ndarray) -> np.ndarray:
    """``log P(K > k)`` of a zeta law, by the Hurwitz zeta ``zeta(a, k + 1) / zeta(a)`` (scipy's generic
    survival function sums the pmf term by term: most of the session fit's time on large traces)."""
    kk = np.floor(np.asarray(k, dtype=np.float64))
    with np.errstate(divide="ignore"):
        v = np.log(special.zeta(a, np.maximum(kk, 0.0) + 1.0)) - math.log(special.zeta(a, 1.0))
    return np.where(kk < 1, 0.0, v)


def count_logsf(law: Law, k) -> np.ndarray:
    """``log P(K > k)``."""
    k = np.asarray(k, dtype=np.float64)
    if law.family == "nbinom1":
        return stats.nbinom.logsf(k - 1, law.params["n"], law.params["p"])
    if law.family == "zeta":
        return _zeta_logsf(float(law.params["a"]), k)
    return _frozen(law).logsf(k)


def _count_params(family: str, theta):
    if family == "geom":
        return {"p": float(special.expit(theta[0]))}
    if family == "zeta":
        return {"a": float(1.0 + math.exp(theta[0]))}
    if family == "nbinom1":  # bounded so that numpy can draw it (mean excess n (1 - p) / p <= 1e12)
        return {"n": float(min(max(math.exp(min(theta[0], 700.0)), 1e-8), 1e6)),
                "p": float(min(max(special.expit(theta[1]), 1e-6), 1.0 - 1e-12))}
    raise ValueError(family)


def _count_start(family: str, k: np.ndarray):
    m = max(float(k.mean()), 1.0 + 1e-6)
    if family == "geom":
        return [float(special.logit(min(max(1.0 / m, 1e-6), 1 - 1e-6)))]
    if family == "zeta":
        return [math.log(max(1.0 / max(np.log(k).mean(), 1e-3), 1e-3))]  # continuous power-law MLE, a - 1
    v = max(float(k.var()), (m - 1) * 1.01 + 1e-6)
    p = min(max((m - 1) / v, 1e-4), 1 - 1e-4)
    return [math.log(max((m - 1) * p / (1 - p), 1e-3)), float(special.logit(p))]


def fit_count(k, candidates=COUNTS, *, censored_window=None, gap_law: Law | None = None, at_least=None) -> Law:
    """MLE of each candidate count law on integers ``k >= 1``.

    With ``censored_window`` (one number per observation) and a ``gap_law``, observation ``i`` is a
    session whose requests after the ``k_i``-th are not seen if they fall beyond the window: the
    likelihood of the count is ``P(K = k) + P(K > k) * S_gap(window)`` (the next request, if any,
    came after the end of the trace). Without them the counts are taken as complete. ``at_least``
    (bool per observation) marks values that are lower bounds (``P(K >= k)``: a branch that dropped
    all it could of its parent).
    """
    k = np.asarray(k, dtype=np.float64).reshape(-1)
    if k.size < 2 or np.any(k < 1) or np.any(k != np.round(k)):
        raise ValueError("fit_count needs at least two integers >= 1")
    log_s = None
    if censored_window is not None:
        if gap_law is None:
            raise ValueError("censored counts need the gap law")
        log_s = logsf(gap_law, np.maximum(np.asarray(censored_window, dtype=np.float64), 0.0))
    cens = None if at_least is None else np.asarray(at_least, dtype=bool).reshape(-1)
    if cens is not None and cens.shape != k.shape:
        raise ValueError("at_least must mark every observation")
    best, aic = None, {}
    for fam in candidates:
        def nll(theta, fam=fam):
            try:
                law = Law(fam, _count_params(fam, theta), 0.0, 0, {})
            except (OverflowError, ValueError):
                return 1e300
            lp = count_logpmf(law, k)
            if cens is not None:
                lp = np.where(cens, count_logsf(law, k - 1), lp)
            if log_s is not None:
                lp = np.logaddexp(lp, count_logsf(law, k) + log_s)
            v = -float(np.sum(lp))
            return v if math.isfinite(v) else 1e300

        th0 = _count_start(fam, k)
        res = optimize.minimize(nll, th0, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 4000})
        ll = -float(res.fun)
        if ll <= -1e299:
            aic[fam] = float("inf")
            continue
        aic[fam] = 2 * len(th0) - 2 * ll
        if best is None or aic[fam] < aic[best[0]]:
            best = (fam, _count_params(fam, res.x), ll)
    if best is None:
        raise ValueError("no count law could be fitted")
    return Law(best[0], best[1], best[2], int(k.size), aic)


def fit_count0(k, candidates=COUNTS) -> dict:
    """Zero-inflated counts ``k >= 0``: ``{"p0": P(0), "positive": Law of k given k >= 1 or None}``."""
    k = np.asarray(k, dtype=np.int64).reshape(-1)
    if k.size == 0 or np.any(k < 0):
        raise ValueError("fit_count0 needs non-negative integers")
    pos = k[k > 0]
    out = {"p0": float(np.mean(k == 0)), "positive": None}
    if pos.size >= 2:
        out["positive"] = fit_count(pos, candidates).to_dict()
    elif pos.size == 1:
        out["positive"] = Law("geom", {"p": 1.0 / float(pos[0])}, 0.0, 1, {}).to_dict()
    return out


# ------------------------------------------------------------------------------ arrivals
class Arrivals(NamedTuple):
    """A renewal process on the clock ``Lambda(t)`` of a piecewise-constant rate: ``rates`` per
    second on ``len(rates)`` equal bins of ``[0, duration_s)``; gaps on that clock follow ``renewal``
    (unit mean: ``expon`` is an inhomogeneous Poisson process)."""

    rates: list
    duration_s: float
    renewal: Law
    aic: dict  # "bins=B/law" -> AIC

    def to_dict(self) -> dict:
        return {"rates_per_s": [float(r) for r in self.rates], "duration_s": float(self.duration_s),
                "renewal": self.renewal.to_dict(),
                "aic": {k: (float(v) if math.isfinite(v) else None) for k, v in self.aic.items()}}

    @staticmethod
    def from_dict(d: dict) -> "Arrivals":
        return Arrivals([float(r) for r in d["rates_per_s"]], float(d["duration_s"]), Law.from_dict(d["renewal"]),
                        {k: (float("inf") if v is None else float(v)) for k, v in dict(d.get("aic", {})).items()})

    @property
    def mean_rate(self) -> float:
        return float(np.mean(self.rates))


def _cum_rate(t, rates, D):
    rates = np.asarray(rates, dtype=np.float64)
    B = rates.size
    w = D / B
    edges = np.concatenate([[0.0], np.cumsum(rates * w)])
    b = np.clip((np.asarray(t, dtype=np.float64) // w).astype(np.int64), 0, B - 1)
    return edges[b] + rates[b] * (np.asarray(t, dtype=np.float64) - b * w)


def _inv_cum_rate(u, rates, D):
    rates = np.asarray(rates, dtype=np.float64)
    B = rates.size
    w = D / B
    edges = np.concatenate([[0.0], np.cumsum(rates * w)])
    u = np.asarray(u, dtype=np.float64)
    b = np.clip(np.searchsorted(edges, u, side="right") - 1, 0, B - 1)
    r = np.where(rates[b] > 0, rates[b], np.inf)
    return b * w + (u - edges[b]) / r


def _unit_renewal(family: str, theta) -> Law:
    if family == "expon":
        return Law("expon", {"scale": 1.0}, 0.0, 0, {})
    c = float(math.exp(theta[0]))
    if family == "gamma":
        return Law("gamma", {"shape": c, "scale": 1.0 / c}, 0.0, 0, {})
    if family == "weibull":
        return Law("weibull", {"shape": c, "scale": 1.0 / math.gamma(1.0 + 1.0 / c)}, 0.0, 0, {})
    raise ValueError(family)


def fit_arrivals(times_s, duration_s: float, *, candidates=RENEWAL, bins=(1, 2, 4, 8, 16, 32),
                 min_per_bin: int = 20, resolution_s: float = 1e-3) -> Arrivals:
    """Fit event times in ``[0, duration_s]``: for each number of rate bins (at least ``min_per_bin``
    events per bin on average) the rates are the bin counts over the bin widths, the gaps on the
    rescaled clock are fitted by each renewal law (unit mean; ties are floored at half the time
    resolution), and the pair with the lowest AIC (bins + law parameters) wins. The log-likelihood
    is that of the time-changed renewal process: ``sum log lambda(t_i) + sum log f(u_i)`` with the
    last gap censored at the end of the window."""
    t = np.sort(np.asarray(times_s, dtype=np.float64).reshape(-1))
    D = float(duration_s)
    if t.size < 3 or D <= 0 or t[0] < 0 or t[-1] > D * (1 + 1e-12):
        raise ValueError("fit_arrivals needs at least three times within [0, duration_s]")
    best, aic = None, {}
    for B in bins:
        if B > 1 and t.size / B < min_per_bin:
            continue
        cnt = np.bincount(np.clip((t / (D / B)).astype(np.int64), 0, B - 1), minlength=B).astype(np.float64)
        rates = cnt / (D / B)
        if np.any(rates <= 0):
            continue
        lam_t = rates[np.clip((t / (D / B)).astype(np.int64), 0, B - 1)]
        u = _cum_rate(t, rates, D)
        gaps = np.diff(np.concatenate([[0.0], u]))
        floor = 0.5 * resolution_s * float(np.min(rates))
        gaps = np.maximum(gaps, floor)
        tail = float(_cum_rate(D, rates, D) - u[-1])
        base = float(np.sum(np.log(lam_t)))
        for fam in candidates:
            def nll(theta, fam=fam):
                law = _unit_renewal(fam, theta)
                v = -(float(np.sum(logpdf(law, gaps))) + float(logsf(law, max(tail, 0.0))))
                return v if math.isfinite(v) else 1e300
            if fam == "expon":
                th, v = [], nll([])
            else:
                r = optimize.minimize_scalar(lambda z: nll([z]), bounds=(-5.0, 5.0), method="bounded",
                                             options={"xatol": 1e-8})
                th, v = [float(r.x)], float(r.fun)
            ll = base - v
            a = 2 * (B + len(th)) - 2 * ll
            aic[f"bins={B}/{fam}"] = a
            if best is None or a < best[0]:
                best = (a, rates, _unit_renewal(fam, th)._replace(loglik=ll, n=int(t.size)))
    if best is None:
        raise ValueError("no arrival model could be fitted")
    return Arrivals(list(map(float, best[1])), D, best[2], aic)


def sample_arrivals(arr: Arrivals, rng: np.random.Generator, duration_s: float | None = None) -> np.ndarray:
    """Event times on ``[0, duration_s)`` (default the fitted window; a longer window repeats the
    rate profile periodically)."""
    D = arr.duration_s if duration_s is None else float(duration_s)
    periods = max(1, int(math.ceil(D / arr.duration_s)))
    rates = list(arr.rates) * periods
    Dp = arr.duration_s * periods
    total = float(np.sum(rates) * (Dp / len(rates)))
    out = []
    # stationary start: the first gap is a forward recurrence time, approximated by a uniform share of one gap
    u = float(sample(arr.renewal, rng, 1)[0]) * rng.random()
    while u < total:
        out.append(u)
        u += float(sample(arr.renewal, rng, 1)[0])
    t = _inv_cum_rate(np.asarray(out), rates, Dp)
    return t[t < D]


def fit_zipf_ranks(counts, max_s: float = 5.0) -> Law:
    """MLE of a finite Zipf law over ``R = len(counts)`` items: item of popularity rank ``r`` is chosen
    with probability ``r^-s / H(R, s)``; ``counts`` are the observed choices per item (any order)."""
    c = np.sort(np.asarray(counts, dtype=np.float64).reshape(-1))[::-1]
    if c.size < 2 or c.sum() <= 0:
        raise ValueError("fit_zipf_ranks needs at least two items with choices")
    lr = np.log(np.arange(1, c.size + 1, dtype=np.float64))
    N = c.sum()

    def nll(s):
        return float(s * np.sum(c * lr) + N * special.logsumexp(-s * lr))

    r = optimize.minimize_scalar(nll, bounds=(0.0, max_s), method="bounded", options={"xatol": 1e-9})
    ll = -float(r.fun)
    a0 = 2 * nll(0.0)
    return Law("zipf_ranks", {"s": float(r.x), "items": float(c.size)}, ll, int(N), {"zipf_ranks": 2 - 2 * ll,
                                                                                   "uniform": a0})


# ------------------------------------------------------------------------------ mixtures
def _mix_params(w, mu, sg) -> dict:
    d = {}
    for j in range(len(w)):
        d[f"w{j}"], d[f"mu{j}"], d[f"sigma{j}"] = float(w[j]), float(mu[j]), float(sg[j])
    return d


def mix_components(law: Law) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, log-means and log-sds of a ``lognorm_mix`` law."""
    K = sum(1 for k in law.params if k.startswith("w"))
    g = law.params
    return (np.array([g[f"w{j}"] for j in range(K)]), np.array([g[f"mu{j}"] for j in range(K)]),
            np.array([g[f"sigma{j}"] for j in range(K)]))


def mix_responsibilities(law: Law, x) -> np.ndarray:
    """Posterior component probabilities [n, K] of positive values under a ``lognorm_mix`` law."""
    w, mu, sg = mix_components(law)
    lx = np.log(np.asarray(x, dtype=np.float64).reshape(-1, 1))
    lp = np.log(w) + stats.norm.logpdf(lx, mu, sg)
    return np.exp(lp - special.logsumexp(lp, axis=1, keepdims=True))


def fit_lognorm_mix(x, max_components: int = 4, *, iters: int = 500, min_sigma: float = 0.05) -> Law:
    """A mixture of lognormals by EM for ``K = 1..max_components`` (quantile starts), the ``K`` of
    lowest AIC (``3K - 1`` parameters). Components are sorted by log-mean."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size < 2 or np.any(x <= 0):
        raise ValueError("fit_lognorm_mix needs at least two positive values")
    lx = np.log(x)
    best, aic = None, {}
    for K in range(1, max_components + 1):
        if K > 1 and x.size < 10 * K:
            break
        q = np.quantile(lx, (np.arange(K) + 0.5) / K)
        mu, sg, w = q.copy(), np.full(K, max(lx.std() / K, min_sigma)), np.full(K, 1.0 / K)
        prev = -np.inf
        for _ in range(iters):
            lp = np.log(w) + stats.norm.logpdf(lx[:, None], mu, sg)
            tot = special.logsumexp(lp, axis=1)
            r = np.exp(lp - tot[:, None])
            nk = r.sum(0) + 1e-12
            w = nk / nk.sum()
            mu = (r * lx[:, None]).sum(0) / nk
            sg = np.maximum(np.sqrt((r * (lx[:, None] - mu) ** 2).sum(0) / nk), min_sigma)
            ll = float(tot.sum())
            if ll - prev < 1e-9 * abs(ll):
                break
            prev = ll
        ll = float(special.logsumexp(np.log(w) + stats.norm.logpdf(lx[:, None], mu, sg), axis=1).sum()
                   - lx.sum())  # density of x, not of log x
        aic[f"lognorm_mix{K}"] = 2 * (3 * K - 1) - 2 * ll
        o = np.argsort(mu)
        if best is None or aic[f"lognorm_mix{K}"] < best[0]:
            best = (aic[f"lognorm_mix{K}"], _mix_params(w[o], mu[o], sg[o]), ll)
    return Law("lognorm_mix", best[1], best[2], int(x.size), aic)


# ------------------------------------------------------------------------------ sampling
def sample(law: Law | dict, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` draws of a law (continuous families as floats, count families as integers >= 1,
    ``zipf_ranks`` as 0-based ranks, ``empirical`` laws as resampled values)."""
    if isinstance(law, dict) and law.get("family") == "empirical":
        vals = law["values"]
        idx = rng.integers(0, len(vals), size)
        if size <= 64:  # a few draws: index the list (converting a long list per call dominated sampling)
            return np.asarray([vals[i] for i in idx.tolist()])
        return np.asarray(vals)[idx]
    if isinstance(law, dict):
        law = Law.from_dict(law)
    p = law.params
    f = law.family
    if f == "expon":
        return rng.exponential(p["scale"], size)
    if f == "gamma":
        return rng.gamma(p["shape"], p["scale"], size)
    if f == "weibull":
        return p["scale"] * rng.weibull(p["shape"], size)
    if f == "lognorm":
        return rng.lognormal(p["mu"], p["sigma"], size)
    if f == "geom":
        return rng.geometric(p["p"], size).astype(np.int64)
    if f == "zeta":
        return rng.zipf(p["a"], size).astype(np.int64)
    if f == "nbinom1":
        return rng.negative_binomial(p["n"], p["p"], size).astype(np.int64) + 1
    if f == "lognorm_mix":
        w, mu, sg = mix_components(law)
        j = rng.choice(w.size, size=size, p=w / w.sum())
        return rng.lognormal(mu[j], sg[j])
    if f == "zipf_ranks":
        R = int(p["items"])
        w = np.arange(1, R + 1, dtype=np.float64) ** -p["s"]
        return rng.choice(R, size=size, p=w / w.sum())
    raise ValueError(f"unknown law family {f!r}")


def sample_count0(d: dict, rng: np.random.Generator, size: int) -> np.ndarray:
    """Draws of a zero-inflated count (:func:`fit_count0`)."""
    z = rng.random(size) < d["p0"]
    out = np.zeros(size, np.int64)
    if d.get("positive") is not None and (~z).any():
        out[~z] = sample(d["positive"], rng, int((~z).sum()))
    return out


# ------------------------------------------------------------------------------ empirical laws and fit checks
EMPIRICAL_CAP = 20_000  # most values an empirical law keeps (an evenly spaced subset of the sorted values)


def empirical(x, *, integer: bool = False, why: str = "") -> dict:
    """The empirical law of ``x`` (resampling its values), as a plain dict like a fitted law's:
    ``{"family": "empirical", "values": [...], "n": ..., "why": ...}``. Beyond ``EMPIRICAL_CAP``
    values it keeps evenly spaced order statistics (the quantile function on a grid)."""
    x = np.sort(np.asarray(x, dtype=np.float64).reshape(-1))
    if x.size == 0:
        raise ValueError("an empirical law needs at least one value")
    n = int(x.size)
    if x.size > EMPIRICAL_CAP:
        x = x[np.round(np.linspace(0, x.size - 1, EMPIRICAL_CAP)).astype(np.int64)]
    vals = [int(v) for v in np.round(x)] if integer else [float(v) for v in x]
    return {"family": "empirical", "values": vals, "n": n, "integer": bool(integer), "why": str(why)}


def is_empirical(law) -> bool:
    return isinstance(law, dict) and law.get("family") == "empirical"


def _cdf(law: Law, x: np.ndarray) -> np.ndarray:
    if law.family == "lognorm_mix":
        w, mu, sg = mix_components(law)
        lx = np.log(np.maximum(x, 1e-300))[:, None]
        return np.sum(w * stats.norm.cdf((lx - mu) / sg), axis=1) / np.sum(w)
    if law.family == "nbinom1":
        return stats.nbinom.cdf(x - 1, law.params["n"], law.params["p"])
    if law.family == "zeta":
        return -np.expm1(_zeta_logsf(float(law.params["a"]), x))
    return _frozen(law).cdf(x)


def law_mean(law) -> float:
    """The mean of a fitted law (``inf`` when it has none, e.g. a zeta law with ``a <= 2``)."""
    if is_empirical(law):
        return float(np.mean(law["values"]))
    law = Law.from_dict(law) if isinstance(law, dict) else law
    if law.family == "lognorm_mix":
        w, mu, sg = mix_components(law)
        return float(np.sum(w * np.exp(mu + sg * sg / 2)) / np.sum(w))
    m = float(_frozen(law).mean()) + (1.0 if law.family == "nbinom1" else 0.0)
    return m if math.isfinite(m) else float("inf")


def ks_distance(law, x, *, discrete: bool = False) -> tuple[float, float]:
    """``(D, p)``: the Kolmogorov-Smirnov distance between the sample ``x`` and a fitted law, and its
    asymptotic p-value (for a law fitted to ``x`` the p-value is optimistic; a count law is compared at
    its integer support points, where the statistic is exact)."""
    law = Law.from_dict(law) if isinstance(law, dict) else law
    x = np.sort(np.asarray(x, dtype=np.float64).reshape(-1))
    n = x.size
    if n == 0:
        return 0.0, 1.0
    if discrete:
        u = np.unique(x)
        ecdf = np.searchsorted(x, u, side="right") / n
        ecdf_lo = np.concatenate([[0.0], ecdf[:-1]])
        F = _cdf(law, u)
        Fm = _cdf(law, u - 1)
        d = float(max(np.max(np.abs(ecdf - F)), np.max(np.abs(ecdf_lo - Fm))))
    else:
        F = _cdf(law, x)
        i = np.arange(1, n + 1)
        d = float(max(np.max(i / n - F), np.max(F - (i - 1) / n)))
    p = float(stats.kstwo.sf(d, n)) if n > 0 else 1.0
    return d, p

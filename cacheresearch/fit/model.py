"""Fit a session model to a trace and sample whole sessions from it.

The model (one component per request type; Mooncake traces have one, Bailian traces one per
``type``), every law chosen by likelihood (:mod:`.laws`):

``arrivals``       session starts: a renewal process (Poisson / Gamma / Weibull gaps) on the clock of
                   a piecewise-constant rate (the time-varying rate; pieces chosen by AIC)
``session``        requests per session (geometric / zeta / shifted negative binomial) jointly with
                   the gaps between consecutive requests of a session (the reuse times of its context:
                   exponential / gamma / Weibull / lognormal), censored at the end of the trace (a
                   session seen with ``k`` requests whose next one would fall after the end)
``roots``          shared roots (system prompts shared by several sessions): a finite Zipf law over
                   the roots' popularity in sessions, trunk lengths; ``private_share`` of sessions
                   start a tree of their own. Traces without session ids define sessions as root
                   trees, so there every session is private and the zeta law of requests per
                   session is the roots' popularity
``first``          a session's first request: its length in tokens, a mixture of lognormals whose
                   components (chosen by AIC) are session *kinds* (short chat prompts, long
                   documents), each with its own session law (requests and reuse times) and a
                   Gaussian copula between the first request's length and the session's request count
                   (within a kind, longer documents can be reused more; rho by likelihood with the
                   margins fixed, kept when it lowers the AIC); a shared session starts with its
                   root's trunk
``step``           each later request: its parent (lag back in the session: the empirical law),
                   a class among ``repeat`` (same prompt), ``extend`` (multi-turn growth: keeps the
                   parent's whole context and appends), ``branch`` (drops the parent's last ``d``
                   blocks and appends ``d + delta``), ``truncate`` (a prefix of the parent),
                   ``compact`` (an agent's context rewrite: keeps at most half of the parent's blocks
                   and appends a summary; (kept, appended) pairs drawn jointly from the trace), with
                   count laws of the dropped and appended blocks and a two-sided law of ``delta``
                   (drawn jointly from the trace unless a chi-square test finds them independent)
``output``         output lengths in tokens

**Checks and empirical fallbacks.** Every law is checked against its data (:func:`fit_workload`:
too few values, a KS rejection with a material distance, a mean or an implied request volume more
than 5% off); a law that fails, or cannot be fitted, is replaced by its empirical law (values
resampled; session starts resampled with a kernel; sessions resampled whole: their gaps and first
lengths), and the model's ``goodness_of_fit`` and ``notes`` say which and why. So any well-formed
trace yields a model that samples. Session sizes are drawn stratified (a one-dimensional Latin
hypercube), so a sample's volume follows the law with less seed-to-seed variance.

:func:`fit_workload` returns the model as a plain dict (what ``experiment=fit`` writes and
``workload.source=fitted`` reads); :func:`sample_workload` draws a workload of whole sessions from
it. :func:`naive_workload` is the baseline the model is compared with: Poisson arrivals at the
trace's mean rate, each request a uniform resample of a trace request (its path in the prefix tree
and its lengths; blocks seen once in the trace get fresh ids, as Dynamo's synthesizer prunes
leaves seen once).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

from cacheresearch.fit import laws as L
from cacheresearch.fit.structure import chain_content_hashes, request_structure, split_conversations
from cacheresearch.workload import Workload
from cacheresearch.workload.table import MAX_TRACE_MS

__all__ = ["fit_workload", "sample_workload", "naive_workload", "ablate", "ablation_effect", "MODEL_VERSION",
           "STEP_CLASSES", "COMPONENTS", "count_ppf", "fit_length_count_copula"]

MODEL_VERSION = 2
STEP_CLASSES = ("repeat", "extend", "branch", "truncate", "compact")
COMPACT_KEEP = 0.5  # a step that keeps at most this share of its parent's blocks (and appends) is a compaction
_MAX_LAG = 32


def _groups(values: np.ndarray, group: np.ndarray, n: int) -> list:
    """``[values[group == i] for i in range(n)]`` by one stable sort (rows in their order within a
    group): O(rows log rows), not O(groups x rows)."""
    group = np.asarray(group, np.int64).reshape(-1)
    o = np.argsort(group, kind="stable")
    cuts = np.searchsorted(group[o], np.arange(1, n))
    return np.split(np.asarray(values)[o], cuts)


def _step_class(d: np.ndarray, a: np.ndarray, shared=None) -> np.ndarray:
    c = np.where(d == 0, np.where(a == 0, 0, 1), np.where(a > 0, 2, 3))
    if shared is not None:  # a rewrite of the context: keeps at most half its parent's blocks, appends new ones
        c = np.where((c == 2) & (shared <= COMPACT_KEEP * (shared + d)), 4, c)
    return c


#: Sessions the joint (count, gap) likelihood is evaluated on at most (a fixed random subsample above it).
SESSION_FIT_MAX = 20_000


def _fit_session(counts: np.ndarray, gaps: np.ndarray, gap_sess: np.ndarray, window: np.ndarray,
                 gap_families=L.POSITIVE) -> dict:
    """Joint censored MLE of (count law, gap law): session ``i`` shows ``counts[i]`` requests, its
    gaps ``gaps[gap_sess == i]``, and ``window[i]`` seconds from its last request to the end. Over
    ``SESSION_FIT_MAX`` sessions the likelihood is that of a fixed random subsample of them, with their
    own gaps (a law of 2-4 parameters is set to well under a percent by that many; each likelihood
    evaluation is O(sessions + gaps) and the optimiser takes hundreds): ``out["subsample"]`` says so."""
    out = {"candidates": {}}
    if counts.size > SESSION_FIT_MAX:
        keep = np.sort(np.random.default_rng(0).choice(counts.size, SESSION_FIT_MAX, replace=False))
        on = np.zeros(counts.size, bool)
        on[keep] = True
        gm = on[np.asarray(gap_sess, np.int64)]
        out["subsample"] = {"sessions": int(SESSION_FIT_MAX), "of": int(counts.size)}
        counts, window, gaps = counts[keep], window[keep], gaps[gm]
    gpos = np.maximum(gaps, 1e-3)
    if gaps.size < 2:  # too few reuses for a gap law: sessions of one request, counts complete
        out["count"] = (L.fit_count(counts).to_dict() if counts.size >= 2 and np.any(counts > 1) else
                        L.Law("geom", {"p": 1.0}, 0.0, int(counts.size), {}).to_dict())
        out["gap"] = L.Law("expon", {"scale": float(np.mean(gpos)) if gaps.size else 1.0}, 0.0, int(gaps.size),
                           {}).to_dict()
        return out
    best = None
    for gfam in gap_families:
        try:
            g0 = L.fit_positive(gpos, (gfam,))
        except ValueError:
            continue
        gkeys = list(g0.params)
        for cfam in L.COUNTS:
            th_c = L._count_start(cfam, counts.astype(np.float64))
            th_g = [math.log(g0.params[k]) if k != "mu" else g0.params[k] for k in gkeys]

            def unpack(th, cfam=cfam, gfam=gfam, gkeys=gkeys, nc=len(th_c)):
                cp = L._count_params(cfam, th[:nc])
                gp = {k: (float(math.exp(v)) if k != "mu" else float(v)) for k, v in zip(gkeys, th[nc:])}
                return L.Law(cfam, cp, 0.0, 0, {}), L.Law(gfam, gp, 0.0, 0, {})

            def nll(th, unpack=unpack):
                try:
                    cl, gl = unpack(th)
                except (OverflowError, ValueError):
                    return 1e300
                lg = float(np.sum(L.logpdf(gl, gpos)))
                lc = np.logaddexp(L.count_logpmf(cl, counts), L.count_logsf(cl, counts) + L.logsf(gl, window))
                v = -(lg + float(np.sum(lc)))
                return v if math.isfinite(v) else 1e300

            th0 = np.asarray(th_c + th_g, dtype=np.float64)
            res = optimize.minimize(nll, th0, method="Nelder-Mead",
                                    options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 1500})
            ll = -float(res.fun)
            aic = 2 * th0.size - 2 * ll
            out["candidates"][f"{cfam}/{gfam}"] = aic if math.isfinite(aic) else None
            if ll > -1e299 and (best is None or aic < best[0]):
                cl, gl = unpack(res.x)
                best = (aic, cl._replace(loglik=ll, n=int(counts.size)), gl._replace(n=int(gaps.size)))
    if best is None:
        raise ValueError("no session law could be fitted")
    out["count"] = best[1].to_dict()
    out["gap"] = best[2].to_dict()
    return out


def _bisect_count(cdf, u: np.ndarray) -> np.ndarray:
    """The smallest integer ``k >= 1`` with ``cdf(k) >= u``, by doubling then bisection (capped at 2^63)."""
    lo = np.zeros_like(u)
    hi = np.ones_like(u)
    for _ in range(64):  # grow hi until it covers u
        need = cdf(hi) < u
        if not need.any():
            break
        hi = np.where(need, hi * 2.0, hi)
    for _ in range(64):
        mid = np.floor((lo + hi) / 2.0)
        done = hi - lo <= 1.0
        if done.all():
            break
        up = cdf(mid) >= u
        hi = np.where(~done & up, mid, hi)
        lo = np.where(~done & ~up, mid, lo)
    return hi


def count_ppf(law, u) -> np.ndarray:
    """Quantiles of a count law (integers >= 1) at ``u`` in (0, 1). The shifted negative binomial and
    the zeta law by bisection on their cdf (the regularized incomplete beta, the Hurwitz zeta tail):
    scipy's negative binomial ppf can loop for minutes at the small ``n`` some fits find."""
    law = L.Law.from_dict(law) if isinstance(law, dict) else law
    u = np.clip(np.asarray(u, dtype=np.float64), 1e-12, 1.0 - 1e-12)
    p = law.params
    if law.family == "geom":  # closed form
        q = np.ceil(np.log1p(-u) / math.log1p(-min(p["p"], 1.0 - 1e-15)))
    elif law.family == "nbinom1":  # K = 1 + X, P(X <= x) = I_p(n, x + 1)
        n_, p_ = float(p["n"]), float(p["p"])
        q = _bisect_count(lambda k: special.betainc(n_, k, p_), u)
    elif law.family == "zeta":
        a = p["a"]
        z0 = special.zeta(a, 1.0)
        q = _bisect_count(lambda k: 1.0 - special.zeta(a, k + 1.0) / z0, u)
    else:
        raise ValueError(f"count_ppf: {law.family!r} is not a count law")
    return np.clip(np.nan_to_num(q, nan=1.0, posinf=1e9), 1, 1e9).astype(np.int64)


def fit_length_count_copula(z: np.ndarray, counts: np.ndarray, window: np.ndarray, count_law: dict,
                            gap_law: dict) -> dict:
    """The dependence of a session's request count on its first request's length: a Gaussian copula.

    ``z`` are the first lengths as normal scores (``(log tokens - mu) / sigma`` of the session kind's
    lognormal), ``counts`` the requests seen per session, ``window`` the seconds from each session's
    last request to the end. The count's margin is the kind's fitted law; given ``z`` the count is
    ``F^-1(Phi(rho z + sqrt(1 - rho^2) e))``. ``rho`` by maximum likelihood with the margins fixed
    (inference functions for margins), censored like :func:`_fit_session` (a session seen with ``c``
    requests either has ``c`` or more, its next gap beyond the window); kept when it lowers the AIC
    (one parameter), else 0. Returns ``{"rho", "loglik_gain", "n"}``.
    """
    from scipy.special import ndtr, ndtri  # noqa: PLC0415

    cl = L.Law.from_dict(count_law)
    gl = L.Law.from_dict(gap_law)
    c = np.asarray(counts, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    lo = ndtri(np.clip(-np.expm1(L.count_logsf(cl, c - 1.0)), 0.0, 1.0))  # Phi^-1 F(c - 1)
    hi = ndtri(np.clip(-np.expm1(L.count_logsf(cl, c)), 0.0, 1.0))  # Phi^-1 F(c)
    log_cens = L.logsf(gl, np.maximum(np.asarray(window, dtype=np.float64), 1e-9))

    def ll(rho):
        sd = math.sqrt(1.0 - rho * rho)
        a, b = (lo - rho * z) / sd, (hi - rho * z) / sd
        p_eq = np.maximum(ndtr(b) - ndtr(a), 1e-300)
        p_gt = np.maximum(1.0 - ndtr(b), 1e-300)
        return float(np.sum(np.logaddexp(np.log(p_eq), np.log(p_gt) + log_cens)))

    if c.size < 5 or np.all(c == c[0]):
        return {"rho": 0.0, "loglik_gain": 0.0, "n": int(c.size)}
    res = optimize.minimize_scalar(lambda r: -ll(r), bounds=(-0.95, 0.95), method="bounded",
                                   options={"xatol": 1e-4})
    gain = -float(res.fun) - ll(0.0)
    keep = 2.0 * 1 - 2.0 * gain < 0.0
    return {"rho": float(res.x) if keep else 0.0, "loglik_gain": float(gain), "n": int(c.size)}


def _fit_delta(x: np.ndarray) -> dict:
    """A two-sided integer law: ``P(0)``, the share of positive values among the others, and a count
    law of ``|x|`` given ``x != 0`` (how a branch's new blocks differ in number from those it drops)."""
    x = np.asarray(x, dtype=np.int64)
    nz = x[x != 0]
    out = {"p0": float(np.mean(x == 0)), "p_positive": float(np.mean(nz > 0)) if nz.size else 0.5, "abs": None}
    if nz.size >= 2:
        out["abs"] = L.fit_count(np.abs(nz)).to_dict()
    return out


def _draw_delta(law, rng) -> int:
    if law is None or rng.random() < law["p0"] or law["abs"] is None:
        return 0
    v = int(L.sample(law["abs"], rng, 1)[0])
    return v if rng.random() < law["p_positive"] else -v


def _pmf(x: np.ndarray, lo: int, hi: int) -> list:
    c = np.bincount(np.clip(x, lo, hi) - lo, minlength=hi - lo + 1).astype(np.float64)
    return (c / max(c.sum(), 1.0)).tolist()


COMPONENTS = ("arrivals", "session", "first", "step", "output")
MIN_PARAMETRIC = 30  # fewer values than this: the component's law is its empirical law
KS_MAX = 0.05  # a parametric law rejected at 1% by KS *and* farther than this from its data is replaced
MEAN_TOL = 0.05  # a law whose mean is off the data's by more (and by 3 standard errors), or whose implied
# request volume is, is replaced


class _Checks:
    """Records, per component and law, which law is used and why (the model's ``goodness_of_fit``)."""

    def __init__(self):
        self.rows: dict = {}

    def add(self, key: str, used: str, why: str = "", **fig):
        self.rows[key] = {"used": used, "why": why, **{k: (float(v) if isinstance(v, (int, float, np.floating))
                                                           else v) for k, v in fig.items()}}


def _choose(key: str, x, fit, checks: _Checks, *, discrete: bool, force: bool, mean_matters: bool = True):
    """A fitted law of ``x`` when it passes the checks (module constants), else the empirical law."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size == 0:
        checks.add(key, "none", "no values")
        return None
    if force:
        checks.add(key, "empirical", "replaced by its empirical law (ablation)")
        return L.empirical(x, integer=discrete, why="ablation")
    why, fig = "", {}
    if x.size < MIN_PARAMETRIC:
        why = f"{x.size} values (< {MIN_PARAMETRIC})"
    else:
        try:
            law = fit(x)
        except (ValueError, RuntimeError, FloatingPointError) as e:
            why = f"no parametric fit ({e})"
        else:
            d, p = L.ks_distance(law, x, discrete=discrete)
            m = L.law_mean(law)
            rel = abs(m - float(x.mean())) / max(abs(float(x.mean())), 1e-12) if math.isfinite(m) else float("inf")
            fig = {"family": law.family, "ks": d, "ks_p": p, "mean_rel_error": rel}
            if p < 0.01 and d > KS_MAX:
                why = f"KS distance {d:.3f} > {KS_MAX} (p {p:.2g})"
            elif mean_matters and rel > MEAN_TOL and abs(m - float(x.mean())) > 3 * float(x.std()) / math.sqrt(x.size):
                why = f"mean off by {rel:.1%} (> {MEAN_TOL:.0%})" if math.isfinite(rel) else "infinite mean"
            else:
                checks.add(key, "parametric", "", **fig)
                return law.to_dict()
    checks.add(key, "empirical", why, **fig)
    return L.empirical(x, integer=discrete, why=why)


def _independence_p(x: np.ndarray, y: np.ndarray) -> float:
    """p-value of a chi-square independence test of two integer samples on their quartile bins."""
    def bins(v):
        e = np.unique(np.quantile(v, [0.25, 0.5, 0.75]))
        return np.searchsorted(e, v, side="left")

    if x.size < 8:
        return 1.0
    bx, by = bins(x), bins(y)
    tab = np.zeros((bx.max() + 1, by.max() + 1))
    np.add.at(tab, (bx, by), 1)
    tab = tab[tab.sum(1) > 0][:, tab.sum(0) > 0]
    if min(tab.shape) < 2:
        return 1.0
    return float(stats.chi2_contingency(tab).pvalue)


def _empirical_times(starts: np.ndarray, D: float) -> dict:
    """Session starts resampled: the trace's starts, each moved by a Gaussian kernel and reflected into
    the window; the count is the trace's. The bandwidth maximises the leave-one-out likelihood of the
    starts (:func:`_cv_bandwidth`) over a grid below Silverman's robust rule, which is made for one
    smooth bump and blurs a rate that changes within the window (a day's profile, bursts)."""
    s = np.sort(np.asarray(starts, dtype=np.float64))
    sd = float(s.std()) if s.size > 1 else 0.0
    iqr = float(np.subtract(*np.percentile(s, [75, 25]))) / 1.34 if s.size > 1 else 0.0
    spread = min(sd, iqr) if iqr > 0 else sd
    h0 = 0.9 * spread * s.size ** -0.2 if s.size > 1 else 0.0
    h = _cv_bandwidth(s, h0) if h0 > 0 else 0.0
    return {"family": "empirical_times", "times": [round(float(x), 3) for x in s], "bandwidth_s": float(h),
            "bandwidth_silverman_s": float(h0), "duration_s": float(D)}


CV_POINTS = 2000  # starts the bandwidth's cross-validation uses at most (evenly spaced order statistics)


def _cv_bandwidth(s: np.ndarray, h0: float) -> float:
    """The Gaussian kernel's bandwidth from ``h0 / 32`` to ``h0`` (13 steps, geometric) that maximises the
    leave-one-out log-likelihood of the sorted starts ``s`` (at most :data:`CV_POINTS` of them); tied
    starts (several sessions in one second) would drive it to zero, so the grid stops at ``h0 / 32``."""
    x = s[np.round(np.linspace(0, s.size - 1, min(s.size, CV_POINTS))).astype(np.int64)]
    n = x.size
    if n < 3:
        return h0
    d2 = (x[:, None] - x[None, :]) ** 2
    best, score = h0, -np.inf
    for h in h0 * np.geomspace(1.0 / 32.0, 1.0, 13):
        k = np.exp(-0.5 * d2 / (h * h))
        np.fill_diagonal(k, 0.0)
        ll = float(np.sum(np.log(np.maximum(k.sum(axis=1), 1e-300) / ((n - 1) * h))))
        if ll > score:
            best, score = float(h), ll
    return best


def _sample_empirical_times(arr: dict, rng, D: float) -> np.ndarray:
    D0 = float(arr["duration_s"])
    base = np.asarray(arr["times"], dtype=np.float64)
    periods = max(1, int(math.ceil(D / D0)))
    t = np.concatenate([base + k * D0 for k in range(periods)])
    h = float(arr["bandwidth_s"])
    if h > 0:
        t = t + rng.normal(0.0, h, t.size)
        hiD = D0 * periods
        t = np.abs(t)
        t = np.where(t >= hiD, 2 * hiD - t, t)
        t = np.clip(t, 0.0, np.nextafter(hiD, 0))
    t = np.sort(t)
    return t[t < D]


def _observed_volume(count_law: dict, gap_law: dict, windows: np.ndarray, rng, reps: int = 20,
                     cap: int = 1000) -> float:
    """Expected requests seen in the trace's windows (one per session, from its start to the end) under
    a count law and a gap law: the model's implied request volume."""
    n = windows.size
    reps = max(1, min(reps, int(2e7 // max(n * cap, 1))))
    k = np.minimum(L.sample(count_law, rng, n * reps).reshape(reps, n), cap)
    # the gaps in the order of one (reps, n, cap - 1) draw, taken a block of sessions at a time: memory
    # ~2e6 gaps whatever the number of sessions (one draw of all of them held 5-10 arrays of n x cap)
    chunk = max(1, int(2_000_000 // max(cap - 1, 1)))
    tot = 0
    for r in range(reps):
        for s0 in range(0, n, chunk):
            s1 = min(n, s0 + chunk)
            if cap > 1:
                g = L.sample(gap_law, rng, (s1 - s0) * (cap - 1)).reshape(s1 - s0, cap - 1)
                fits = 1 + np.sum(np.cumsum(g, axis=1) < windows[s0:s1, None], axis=1)
            else:
                fits = np.ones(s1 - s0, np.int64)
            tot += int(np.minimum(k[r, s0:s1], fits).sum())
    return float(tot / reps)


def _empirical_sessions(gap_lists: list, first_tokens: np.ndarray, why: str, heads=None) -> dict:
    out = {"family": "empirical_sessions", "gaps": [[round(float(g), 3) for g in gl] for gl in gap_lists],
           "first_tokens": [int(x) for x in first_tokens], "n": len(gap_lists), "why": why}
    if heads is not None and any(len(h) for h in heads):
        out["heads"] = heads
    return out


def _session_heads(w: Workload, st, first_req: np.ndarray) -> list:
    """Per session (its first request ``first_req``), the leading blocks of its first request that other
    sessions hold too (a shared system or tool prompt), as ids relabelled ``0..k-1`` over the
    type: a session drawn whole opens with the same shared head as in the trace (the ids map to
    fresh ones per sample), so sessions that shared a head in the trace share it in the sample."""
    nb = w.n_blocks.astype(np.int64)
    req = np.repeat(np.arange(w.n_requests, dtype=np.int64), nb)
    sb = st.session[req]
    o = np.lexsort((sb, w.keys))
    k, s = w.keys[o], sb[o]
    new_key = np.concatenate([[True], k[1:] != k[:-1]]) if k.size else np.zeros(0, bool)
    new_pair = new_key | np.concatenate([[True], s[1:] != s[:-1]]) if k.size else new_key
    n_sess = np.add.reduceat(new_pair.astype(np.int64), np.nonzero(new_key)[0]) if k.size else np.zeros(0, np.int64)
    multi = np.zeros(w.total_blocks, bool)
    multi[o] = np.repeat(n_sess > 1, np.diff(np.append(np.nonzero(new_key)[0], k.size)))
    heads, flat = [], []
    for r in first_req.tolist():
        f = multi[w.offsets[r]: w.offsets[r + 1]]
        m = int(np.argmin(f)) if not f.all() else f.size
        heads.append(w.keys[w.offsets[r]: w.offsets[r] + m])
        flat.append(heads[-1])
    if not flat or not sum(h.size for h in heads):
        return [[] for _ in heads]
    _, inv = np.unique(np.concatenate(flat), return_inverse=True)
    cuts = np.cumsum([h.size for h in heads])[:-1]
    return [x.tolist() for x in np.split(inv.reshape(-1).astype(np.int64), cuts)]


MIN_REWRITES = 10  # fewer rewrites than this (and not length-triggered): they stay branches


def _kept_growth_p(parent_blocks: np.ndarray, kept: np.ndarray) -> float:
    """p-value that what rewrites keep grows with their parent's length (one-sided Spearman); 0.0 with fewer
    than :data:`MIN_REWRITES` rewrites (no test: they are read as branches)."""
    if kept.size < MIN_REWRITES or np.ptp(kept) == 0 or np.ptp(parent_blocks) == 0:
        return 0.0 if kept.size < MIN_REWRITES else 1.0
    return float(stats.spearmanr(parent_blocks, kept, alternative="greater").pvalue)


def _fit_steps(ck, comp, emp, force, nb, s_of, sel, st, uniq, tokens):
    """The step classes of a type's requests (their laws, or the empirical law), into ``comp`` and ``emp``."""
    stp = sel & (st.parent >= 0)
    comp["step"] = None
    emp["step"] = None
    if stp.sum() >= 1:
        d, a = st.dropped[stp], st.appended[stp]
        cls = _step_class(d, a, st.shared[stp])
        # rewrites (steps keeping at most half of their parent) are compactions, a class of their own
        # whose kept blocks carry over to a context of any length, when they are length-triggered
        # (their parents longer than the other steps', one-sided Mann-Whitney p < 0.01: an agent
        # compacting near a limit) or when what they keep (more than the root block) does not grow
        # with the parent (at least MIN_REWRITES of them, one-sided Spearman p >= 0.01: a rewrite to a
        # fixed head, drawn at random at its observed rate); else they are long branches (what they
        # drop carries over; one that keeps only the root is a branch censored at its parent's length)
        pbl = nb[st.parent[stp]]
        cp = cls == 4
        mw_p = 1.0
        if cp.sum() >= 2 and (~cp).sum() >= 2:
            mw_p = float(stats.mannwhitneyu(pbl[cp], pbl[~cp], alternative="greater").pvalue)
        head = cp & (st.shared[stp] > 1)  # a rewrite keeping only the root block is a branch that dropped all
        kept_p = _kept_growth_p(pbl[head], st.shared[stp][head]) if mw_p >= 0.01 else 0.0
        if cp.any():
            ck.add("step.compaction_trigger", "empirical" if mw_p < 0.01 else "none",
                   f"rewrites at longer contexts (Mann-Whitney p {mw_p:.2g})" if mw_p < 0.01 else
                   f"rewrites not at longer contexts (p {mw_p:.2g}), keeping a head that does not grow with "
                   f"the parent (Spearman p {kept_p:.2g}): at random, {float(cp.mean()):.3g} of steps"
                   if kept_p >= 0.01 else f"rewrites not at longer contexts (p {mw_p:.2g}): branches",
                   mannwhitney_p=mw_p, kept_growth_p=kept_p)
        if mw_p >= 0.01:  # not length-triggered: rewrites to a fixed head stay, the rest are branches
            cls = np.where(cp & ~(head & (kept_p >= 0.01)), 2, cls)
        # whole empirical sessions keep their own steps (drawn at random within the session): a
        # session's growth and compaction rates stay its own
        sstep = np.searchsorted(uniq, st.session[stp])
        trip = np.stack([cls, d, a, st.shared[stp]], axis=1)
        own = [x.tolist() for x in _groups(trip, sstep, uniq.size)]
        # ... and in their order: (lag to the parent, dropped, appended, input tokens) of each later
        # request, so a session drawn whole replays its own growth, compactions and branches
        seq = np.stack([st.lag[stp], d, a, tokens[stp]], axis=1)
        ordered = [x.tolist() for x in _groups(seq, sstep, uniq.size)]
        pbl_all = nb[st.parent[stp]]
        c4 = cls == 4  # (parent blocks, kept, appended) of each own compaction
        own_at = [x.tolist() for x in _groups(np.stack([pbl_all, st.shared[stp], a], axis=1)[c4], sstep[c4],
                                              uniq.size)]
        smax = np.zeros(uniq.size, np.int64)
        np.maximum.at(smax, np.searchsorted(uniq, s_of), nb[sel])
        for target in (emp["session"], comp["session"]):
            if target.get("family") == "empirical_sessions":
                target.update(steps=own, compact_at=own_at, max_blocks=smax.tolist(), ordered_steps=ordered)
        cp = cls == 4
        compact = ({"family": "empirical_pairs", "kept": [int(x) for x in st.shared[stp][cp]],
                    "appended": [int(x) for x in a[cp]], "n": int(cp.sum())} if cp.any() else None)
        # length-triggered: the sampler compacts a context once it reaches a limit drawn from the
        # parents' lengths at compaction (the empirical law), and never at random; else at class_p's rate
        trigger = (L.empirical(pbl[cp], integer=True, why="length-triggered compactions")
                   if cp.any() and mw_p < 0.01 else None)
        steps = {}
        for fe in (False, True):
            sub = _Checks() if fe else ck
            frc = fe or "step" in force
            br = cls == 2
            delta = a[br] - d[br]
            nz = delta[delta != 0]
            bdrop = None
            if br.sum() >= 1:
                # censored at the parent's length (at_least) and clamped to it when sampled: the
                # law's mean is not the data's, so only its shape is checked
                bdrop = _choose("step.branch_dropped", d[br],
                                lambda x, c=(st.shared[stp] <= 1)[br]: L.fit_count(x, at_least=c), sub,
                                discrete=True, force=frc, mean_matters=False)
            # a branch's appended blocks may depend on its dropped ones (a compaction drops many
            # and appends a summary): unless a chi-square test on their quartile bins finds them
            # independent (p >= 0.01), the pairs are drawn jointly from the trace
            pairs = None
            if br.sum() >= 1:
                pv = _independence_p(d[br], delta)
                if frc or br.sum() < MIN_PARAMETRIC or pv < 0.01:
                    sub.add("step.branch_pairs", "empirical", "ablation" if frc else
                            f"dropped blocks and length change dependent (chi-square p {pv:.2g})" if br.sum() >=
                            MIN_PARAMETRIC else f"{int(br.sum())} branches (< {MIN_PARAMETRIC})", independence_p=pv)
                    pairs = {"family": "empirical_pairs", "dropped": [int(x) for x in d[br]],
                             "appended": [int(x) for x in a[br]], "n": int(br.sum())}
                else:
                    sub.add("step.branch_pairs", "parametric", "", independence_p=pv)
            steps[fe] = {
                "branch_pairs": pairs,
                "compact_pairs": compact,
                "compact_trigger": trigger,
                "lag_pmf": _pmf(st.lag[stp], 1, _MAX_LAG),
                "class_p": [float(np.mean(cls == c)) for c in range(len(STEP_CLASSES))],
                "branch_dropped": bdrop,
                "branch_length_change": {
                    "p0": float(np.mean(delta == 0)) if delta.size else 1.0,
                    "p_positive": float(np.mean(nz > 0)) if nz.size else 0.5,
                    "abs": _choose("step.branch_length_change", np.abs(nz), L.fit_count, sub, discrete=True,
                                   force=frc)},
                "extend_appended": _choose("step.extend_appended", a[cls == 1], L.fit_count, sub, discrete=True,
                                           force=frc),
                "truncate_dropped": _choose("step.truncate_dropped", d[cls == 3], L.fit_count, sub,
                                            discrete=True, force=frc),
            }
        comp["step"], emp["step"] = steps[False], steps[True]


def _fit_sessions(D, ck, comp, emp, force, gap_families, rng, sel, st, t, w):
    """A type's sessions: request counts, reuse gaps and censoring windows, their law (or the empirical one)."""
    s_of = st.session[sel]
    uniq, cnt = np.unique(s_of, return_counts=True)
    last_t = np.full(uniq.size, -np.inf)
    np.maximum.at(last_t, np.searchsorted(uniq, s_of), t[sel])
    first_t = np.full(uniq.size, np.inf)
    np.minimum.at(first_t, np.searchsorted(uniq, s_of), t[sel])
    req_idx = np.nonzero(sel)[0]
    order = np.lexsort((t[req_idx], s_of))
    ss, tt = s_of[order], t[req_idx][order]
    same = ss[1:] == ss[:-1]
    gaps = (tt[1:] - tt[:-1])[same]
    win = np.maximum(D - last_t, 0.0)
    gs = ss[1:][same]
    gap_idx = np.searchsorted(uniq, gs)
    gap_lists = _groups(gaps, gap_idx, uniq.size)
    ftok_sess = np.zeros(uniq.size, np.int64)
    fr = req_idx[order][np.concatenate([[True], ~same])]
    ftok_sess[np.searchsorted(uniq, st.session[fr])] = w.input_tokens[fr]
    fr_sorted = np.empty(uniq.size, np.int64)
    fr_sorted[np.searchsorted(uniq, st.session[fr])] = fr
    emp["session"] = _empirical_sessions(gap_lists, ftok_sess, "", _session_heads(w, st, fr_sorted))
    sess, why = None, ""
    if "session" in force:
        why = "replaced by its empirical law (ablation)"
    elif uniq.size < 3:
        why = f"{uniq.size} session(s) (< 3)"
    else:
        try:
            sess = _fit_session(cnt.astype(np.float64), gaps, gap_idx, win, gap_families=tuple(gap_families))
        except ValueError as e:
            why = f"no session law ({e})"
        if sess is not None:
            vol = _observed_volume(sess["count"], sess["gap"], np.maximum(D - first_t, 0.0), rng,
                                   cap=int(max(4 * cnt.max(), 50)))
            rel = abs(vol - float(cnt.sum())) / float(cnt.sum())
            fig = {"family": f"{sess['count']['family']}/{sess['gap']['family']}", "volume_rel_error": rel}
            if gaps.size >= 2:
                d, p = L.ks_distance(sess["gap"], np.maximum(gaps, 1e-3))
                fig.update(ks=d, ks_p=p)
            else:
                d, p = 0.0, 1.0
            if rel > MEAN_TOL:
                why = f"implied request volume off by {rel:.1%} (> {MEAN_TOL:.0%})"
            elif p < 0.01 and d > KS_MAX:
                why = f"gap law KS distance {d:.3f} > {KS_MAX} (p {p:.2g})"
            if why:
                ck.add("session", "empirical", why, **fig)
                sess = None
            else:
                ck.add("session", "parametric", "", **fig)
                sess["count_cap"] = int(max(4 * cnt.max(), 50))
    if sess is None:
        if "session" not in ck.rows:
            ck.add("session", "empirical", why)
        sess = dict(emp["session"], why=why)
    comp["session"] = sess
    return cnt, gaps, gs, s_of, sess, uniq, win


def _fit_type(ti: int, tname: str, *, w, st, t, D, nb, typ, force, rng, notes: list, comps: dict, gof: dict,
              gap_families, max_kinds, names) -> None:
    """Fit the components of requests of type ``ti`` into ``comps[tname]`` (goodness of fit into ``gof``)."""
    sel = typ == ti
    if not sel.any():
        return
    ck = _Checks()
    first = sel & (st.position == 0)
    if not first.any():  # a type whose sessions all start in another type: its first request starts one
        first = sel & (np.arange(w.n_requests) == np.argmax(sel))
    sids = st.session[first]
    starts = t[first]
    comp = {"requests": int(sel.sum()), "sessions": int(sids.size)}
    emp = {}
    # ---- arrivals
    emp["arrivals"] = _empirical_times(starts, D)
    arr, why = None, ""
    if "arrivals" in force:
        why = "replaced by its empirical law (ablation)"
    elif starts.size < MIN_PARAMETRIC:
        why = f"{starts.size} session start(s) (< {MIN_PARAMETRIC})"
    else:
        try:
            a = L.fit_arrivals(starts, D)
        except ValueError as e:
            why = f"no renewal fit ({e})"
        else:
            u = L._cum_rate(starts, a.rates, D) / max(float(L._cum_rate(D, a.rates, D)), 1e-300)
            ks = stats.kstest(u, "uniform")
            fig = {"family": f"{len(a.rates)} rate bins, {a.renewal.family}", "ks": float(ks.statistic),
                   "ks_p": float(ks.pvalue)}
            if ks.pvalue < 0.01 and ks.statistic > KS_MAX:
                why = f"rate profile rejected (KS {ks.statistic:.3f}, p {ks.pvalue:.2g})"
                ck.add("arrivals", "empirical", why, **fig)
            else:
                arr = a.to_dict()
                ck.add("arrivals", "parametric", "", **fig)
    if arr is None:
        if "arrivals" not in ck.rows:
            ck.add("arrivals", "empirical", why)
        arr = emp["arrivals"]
    comp["arrivals"] = arr
    # ---- sessions: counts, gaps, censoring windows
    cnt, gaps, gs, s_of, sess, uniq, win = _fit_sessions(D, ck, comp, emp, force, gap_families, rng, sel, st, t, w)
    if sess.get("family") == "empirical_sessions" and arr.get("family") != "empirical_times":
        # sessions drawn whole keep their rank's trace start (a session's length and its place among the
        # long ones depend on when it starts); a renewal law of the starts would move them, so the starts
        # are the trace's, kernel-jittered (the ablation found the parametric starts the weakest component
        # of whole-session models: a day of API traffic, the Mooncake trace)
        fig = {k: v for k, v in ck.rows.get("arrivals", {}).items() if k not in ("used", "why")}
        ck.add("arrivals", "empirical", "sessions are drawn whole: their trace starts, kernel-jittered", **fig)
        comp["arrivals"] = arr = emp["arrivals"]
    # ---- first requests' lengths; session kinds (parametric sessions only)
    first_tok = np.maximum(w.input_tokens[first], 1).astype(np.float64)
    emp["first"] = L.empirical(first_tok, integer=True)
    comp["first_input_tokens"] = _choose("first", first_tok, lambda x: L.fit_lognorm_mix(x, max_kinds), ck,
                                         discrete=False, force="first" in force)
    kinds = [sess]
    fl = comp["first_input_tokens"]
    if sess.get("family") != "empirical_sessions" and not L.is_empirical(fl):
        mix = L.Law.from_dict(fl)
        kind = np.argmax(L.mix_responsibilities(mix, first_tok), axis=1)
        _, mus, sgs = L.mix_components(mix)
        kinds = []
        for j in range(mus.size):
            ks = np.nonzero(kind == j)[0]
            pos = np.searchsorted(uniq, sids[ks])
            m = np.isin(gs, sids[ks])
            ksess = None
            if ks.size >= 5 and m.sum() >= 2:
                try:
                    ksess = _fit_session(cnt[pos].astype(np.float64), gaps[m], np.searchsorted(uniq[pos], gs[m]),
                                         win[pos], gap_families=(sess["gap"]["family"],))
                    zk = (np.log(first_tok[ks]) - float(mus[j])) / float(sgs[j])
                    ksess["length_count"] = fit_length_count_copula(zk, cnt[pos], win[pos], ksess["count"],
                                                                    ksess["gap"])
                except ValueError:
                    ksess = None
            if ksess is not None:
                ksess["count_cap"] = sess.get("count_cap")
            kinds.append(ksess if ksess is not None else sess)
    comp["session_by_kind"] = kinds
    # ---- roots: sessions per first block among first requests
    rg = st.root_group[first]
    _, per_root = np.unique(rg, return_counts=True)
    shared_sess = per_root[per_root > 1]
    fm = first & (st.root_match > 0)
    comp["roots"] = {"private_share": 1.0, "n_shared": 0, "popularity": None, "trunk_blocks": []}
    if shared_sess.size >= 1 and fm.any():
        trunk = {}
        for r, m in zip(st.root_group[fm], st.root_match[fm]):
            trunk[int(r)] = max(trunk.get(int(r), 0), int(m))
        tl = np.asarray(list(trunk.values()), dtype=np.float64)
        try:
            pop = (L.fit_zipf_ranks(shared_sess).to_dict() if shared_sess.size >= 2 else
                   L.Law("zipf_ranks", {"s": 0.0, "items": 1.0}, 0.0, int(shared_sess.sum()), {}).to_dict())
            comp["roots"] = {
                "private_share": float(np.mean(np.isin(rg, np.unique(rg)[per_root == 1]))),
                "n_shared": int(shared_sess.size), "popularity": pop,
                "trunk_blocks": sorted(int(x) for x in tl),
            }
            comp["first_shared_extra_blocks"] = L.fit_count0((nb[fm] - st.root_match[fm]).astype(np.int64))
        except ValueError as e:
            notes.append(f"[{tname}] shared roots not modelled ({e})")
    # ---- steps
    _fit_steps(ck, comp, emp, force, nb, s_of, sel, st, uniq, w.input_tokens.astype(np.int64))
    # ---- outputs
    out_tok = np.maximum(w.output_tokens[sel], 0) + 0.5
    emp["output"] = L.empirical(out_tok)
    comp["output_tokens"] = _choose("output", out_tok, L.fit_positive, ck, discrete=False,
                                    force="output" in force, mean_matters=False)
    comp["empirical"] = emp
    for k, r in ck.rows.items():
        if r["used"] == "empirical":
            notes.append(f"[{tname}] {k}: empirical law ({r['why']})")
    gof[tname] = ck.rows
    comps[tname] = comp


def fit_workload(w: Workload, *, session=None, parent=None, types=None, type_names=None,
                 duration_s: float | None = None, max_kinds: int = 6, gap_families=L.POSITIVE,
                 empirical=(), conversations="auto", check: bool = True) -> dict:
    """Fit the model (module docstring) to a trace; ``session`` / ``parent`` / ``types`` come from a
    Bailian trace (:class:`~cacheresearch.workload.trace.BailianTrace`) when it has them.
    ``max_kinds``: most session kinds (length-mixture components); ``gap_families``: the candidate
    laws of the reuse gaps (each is fitted jointly with every count law); ``empirical``: components
    (of :data:`COMPONENTS`) forced to their empirical laws.

    Never fails on a well-formed trace with at least one request: a component whose parametric law
    cannot be fitted, or fails its check (fewer than ``MIN_PARAMETRIC`` values; KS rejection at 1%
    with distance above ``KS_MAX``; a mean, or for sessions the implied request volume, more than
    ``MEAN_TOL`` off), uses its empirical law, and ``goodness_of_fit`` / ``notes`` say which and why.
    Ids that are per-block content hashes are chained first (:func:`~.structure.chain_content_hashes`).
    The empirical version of every component is stored too (``components[t]["empirical"]``), so
    :func:`ablate` swaps one in without refitting. ``conversations`` (traces without session ids):
    ``auto`` splits root trees whose conversations interleave in time into those conversations
    (:func:`~.structure.split_conversations`), ``all`` splits every root tree, ``False`` keeps root
    trees as sessions. ``check``: the predictive check (:func:`_predictive_check`): parametric
    sessions whose samples miss the trace's volumes or curves fall back to whole trace sessions."""
    force = set(empirical)
    bad = force - set(COMPONENTS)
    if bad:
        raise ValueError(f"empirical: unknown components {sorted(bad)}; choose among {COMPONENTS}")
    if w.n_requests < 1:
        raise ValueError("fitting needs at least one request")
    notes = []
    w, chain = chain_content_hashes(w)
    if chain["chained"]:
        notes.append(f"ids are per-block content hashes ({chain['inconsistent_ids']:,} of {chain['ids']:,} ids follow "
                     "two or more different blocks): chained into prefix ids before fitting")
    rng = np.random.default_rng(12345)
    st = request_structure(w, session, parent)
    split = None
    if session is None and conversations:
        conv, split = split_conversations(w, st, interleaved_min=None if conversations == "all" else 0.5)
        split["used"] = split["split_roots"] > 0
        if split["used"]:
            st = request_structure(w, conv)
            notes.append(f"sessions: {split['conversations']:,} sessions from {split['roots']:,} root trees "
                         f"({split['split_roots']:,} roots split into their conversations, which interleave in time: "
                         "structure.split_conversations)")
    t = w.arrival_ms / 1000.0
    D = float(duration_s) if duration_s is not None else max(float(t[-1]) + 1e-3, 1e-3)
    bt = int(w.block_tokens)
    nb = w.n_blocks.astype(np.int64)
    typ = np.zeros(w.n_requests, np.int64) if types is None else np.asarray(types, dtype=np.int64)
    names = list(type_names) if type_names is not None else [f"type{i}" for i in range(int(typ.max()) + 1)]
    if types is None and type_names is None:
        names = ["all"]
    comps, gof = {}, {}
    for ti, tname in enumerate(names):
        _fit_type(ti, tname, w=w, st=st, t=t, D=D, nb=nb, typ=typ, force=force, rng=rng, notes=notes, comps=comps,
                  gof=gof, gap_families=gap_families, max_kinds=max_kinds, names=names)
    model = {"version": MODEL_VERSION, "kind": "session_model", "block_tokens": bt, "duration_s": D,
             "source": {"name": w.name, "requests": int(w.n_requests), "format": str(w.meta.get("format", "")),
                        "key_chaining": chain, "conversations": split},
             "components": comps, "goodness_of_fit": gof, "notes": notes}
    if check:
        _predictive_check(model, w, typ, names)
    return model


GAP_MAX = 0.03  # the predictive check: a sampled model farther than this from the trace's curves (hit rate)
CHECK_SEEDS = (0, 1)


def _predictive_check(model: dict, w: Workload, typ: np.ndarray, names: list) -> None:
    """Sample the fitted model (:data:`CHECK_SEEDS`) and compare it with the trace it was fitted to: per
    type, requests and input tokens (within ``MEAN_TOL``), and the token hit rate on a 6-point LRU
    capacity grid and TTLs of 60 / 300 / 900 / 3600 s (within ``GAP_MAX``). Where parametric sessions
    fail it (the laws each passed their own checks, but not jointly: a length law and a trunk law
    that add up, a step law that drifts along a session), those types' sessions are replaced by
    whole trace sessions (with their shared heads and their starts, kernel-jittered), and the check is
    run again (when only the curves miss, every type still parametric falls back); the model's
    ``predictive_check``, ``goodness_of_fit`` and ``notes`` say what was measured and done."""
    from cacheresearch.fit.validate import capacity_grid, capacity_hit_rates, ttl_hit_rates  # noqa: PLC0415

    caps = capacity_grid(w, 6)
    ttls = [60.0, 300.0, 900.0, 3600.0]
    tr_cap, tr_ttl = capacity_hit_rates(w, caps), ttl_hit_rates(w, ttls)
    rounds = []
    for _ in range(len(names) + 1):
        param = [t for t, c in model["components"].items() if c["session"].get("family") != "empirical_sessions"]
        if not param:
            break
        xs = [sample_workload(model, s) for s in CHECK_SEEDS]
        cap = float(np.max(np.abs(np.mean([capacity_hit_rates(x, caps) for x in xs], 0) - tr_cap)))
        ttl = float(np.max(np.abs(np.mean([ttl_hit_rates(x, ttls) for x in xs], 0) - tr_ttl)))
        rec = {"capacity_gap": cap, "ttl_gap": ttl, "types": {}}
        rounds.append(rec)
        fails = {}
        for ti, t in enumerate(names):
            if t not in param:
                continue
            sel = typ == ti
            req = float(np.mean([np.sum(x.tenant == ti) for x in xs])) / max(float(sel.sum()), 1.0)
            tok = (float(np.mean([x.input_tokens[x.tenant == ti].sum() for x in xs]))
                   / max(float(w.input_tokens[sel].sum()), 1.0))
            rec["types"][t] = {"requests_ratio": req, "tokens_ratio": tok}
            if abs(req - 1) > MEAN_TOL or abs(tok - 1) > MEAN_TOL:
                fails[t] = f"sampled requests x{req:.3f}, input tokens x{tok:.3f} (> {MEAN_TOL:.0%} off)"
        if not fails and (cap > GAP_MAX or ttl > GAP_MAX):
            fails = {t: (f"sampled model {100 * cap:.2f} / {100 * ttl:.2f} points off the capacity / TTL curve "
                         f"(> {100 * GAP_MAX:g})") for t in param}
        if not fails:
            break
        for t, why in fails.items():
            c = model["components"][t]
            c["session"] = dict(c["empirical"]["session"], why=f"predictive check: {why}")
            c["session_by_kind"] = [c["session"]]
            c["arrivals"] = c["empirical"]["arrivals"]
            model["goodness_of_fit"][t]["session"] = {"used": "empirical", "why": f"predictive check: {why}"}
            model["goodness_of_fit"][t]["arrivals"] = {"used": "empirical", "why": "sessions are drawn whole: their "
                                                       "trace starts, kernel-jittered"}
            model["notes"].append(f"[{t}] session: empirical law (predictive check: {why}): whole trace sessions")
            rec["types"][t]["fallback"] = why
    model["predictive_check"] = rounds


def ablate(model: dict, component: str) -> dict:
    """The model with one component (of :data:`COMPONENTS`) replaced by its empirical law in every
    type (the fit stored both)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; choose among {COMPONENTS}")
    key = {"arrivals": "arrivals", "session": "session", "first": "first_input_tokens", "step": "step",
           "output": "output_tokens"}[component]
    m = dict(model, components={})
    for t, c in model["components"].items():
        c = dict(c)
        c[key] = c["empirical"][component]
        if component == "session":
            c["session_by_kind"] = [c["session"]]
        if component == "first" and c["session"].get("family") != "empirical_sessions":
            c["session_by_kind"] = [c["session"]]
        m["components"][t] = c
    return m


def _drop_why(x):
    if isinstance(x, dict):
        return {k: _drop_why(v) for k, v in x.items() if k != "why"}
    if isinstance(x, list):
        return [_drop_why(v) for v in x]
    return x


def ablation_effect(model: dict, component: str) -> str:
    """Why ablating ``component`` cannot change what :func:`sample_workload` draws (``""`` when it
    can): the component is already its empirical law in every type, or the sampler does not read it
    because every type's sessions are drawn whole from the trace (their first lengths and their
    ordered steps come with them)."""
    whole = all(c["session"].get("family") == "empirical_sessions" and c["session"].get("ordered_steps") is not None
                for c in model["components"].values())
    if whole and component in ("first", "step"):
        return "not used: sessions are drawn whole (their first lengths and ordered steps)"
    a = _drop_why(ablate(model, component)["components"])
    if a == _drop_why(model["components"]):
        return "already empirical"
    return ""


# ------------------------------------------------------------------------------ sampling
def _check_model(model: dict) -> None:
    if not isinstance(model, dict) or model.get("kind") != "session_model":
        raise ValueError("not a fitted session model (kind: session_model)")
    if int(model.get("version", -1)) not in (1, MODEL_VERSION):
        raise ValueError(f"fitted model version {model.get('version')!r}; this code reads 1 and {MODEL_VERSION}")
    for k in ("block_tokens", "duration_s", "components"):
        if k not in model:
            raise ValueError(f"fitted model: missing key {k!r}")
    if not model["components"]:
        raise ValueError("fitted model: no components")


def _draw_count(law, rng, size=1):
    if law is None:
        return np.ones(size, np.int64)
    return np.maximum(np.asarray(L.sample(law, rng, size)).astype(np.int64), 0)


def _stratified(rng, n: int) -> np.ndarray:
    """``n`` stratified uniforms: one in each of ``n`` equal strata, in random order (a Latin
    hypercube in one dimension: the sample's session sizes follow the law with less variance)."""
    return (rng.permutation(n) + rng.random(n)) / max(n, 1)


def _sample_session(si: int, s0, *, D, bt, comp, emp_first, emp_sess, fl, fresh, heads, kinds, muk, pick, rng, roots,
                    rows, sess0, sgk, starts, step, ti, trunks, u_all, wk) -> None:
    """One sampled session (its requests appended to ``rows``)."""
    z1 = float(rng.standard_normal())
    if emp_first:
        kind = 0
        n_first = int(L.sample(fl, rng, 1)[0])
    else:
        kind = int(rng.choice(wk.size, p=wk / wk.sum()))
        n_first = max(int(math.ceil(math.exp(muk[kind] + sgk[kind] * z1))), 1)
    if emp_sess:
        j = int(pick[si])
        times = np.concatenate([[s0], s0 + np.cumsum(sess0["gaps"][j])])
        # the session's own first length: a session drawn whole keeps its joint law with its
        # first request (a separately fitted length law would lose the length-count dependence)
        # (a first request without blocks stays one: input_length 0 in the trace)
        n_first = int(sess0["first_tokens"][j])
    else:
        sess = kinds[min(kind, len(kinds) - 1)]
        rho = float((sess.get("length_count") or {}).get("rho", 0.0)) if not emp_first else 0.0
        u = (special.ndtr(rho * z1 + math.sqrt(1.0 - rho * rho) * float(rng.standard_normal())) if rho != 0.0
             else u_all[si])
        k = int(count_ppf(sess["count"], u)) if not L.is_empirical(sess["count"]) else int(
            _draw_count(sess["count"], rng)[0])
        k = min(k, int(sess.get("count_cap") or k))  # the volume check's cap (4 x the trace's largest session)
        times = [np.array([s0])]
        left, last = k - 1, s0
        while left > 0 and last < D:  # gaps in chunks: a heavy-tailed count never allocates past the window
            g = np.cumsum(L.sample(sess["gap"], rng, min(left, 64))) + last
            times.append(g)
            left -= g.size
            last = float(g[-1])
        times = np.concatenate(times)
    times = times[times < D]
    if step is None:
        times = times[:1]
    if emp_sess and sess0.get("ordered_steps") is not None:
        head = heads[np.asarray(sess0["heads"][pick[si]], np.int64)] if heads is not None else None
        _replay_session(times, sess0["ordered_steps"][pick[si]], n_first, bt=bt, comp=comp, fresh=fresh, rng=rng,
                        rows=rows, ti=ti, head=head)
        return
    hist = []  # (keys, input tokens) of this session's requests
    trig = step.get("compact_trigger") if step else None
    # compaction limits: an empirical session's own (in order), then the pooled law, but past
    # the longest context the session reached in the trace
    own_at = list(sess0["compact_at"][pick[si]]) if emp_sess and "compact_at" in sess0 else None
    floor = int(sess0["max_blocks"][pick[si]]) if own_at is not None else 0

    def next_limit(own_at=own_at, floor=floor, trig=trig):
        if own_at:
            x = own_at.pop(0)
            return int(x[0]), int(x[1]), int(x[2])
        return max(int(L.sample(trig, rng, 1)[0]), floor + 1), None, None

    limit = next_limit() if trig is not None else (0, None, None)
    for j, tj in enumerate(times):
        if j == 0:
            n_in = max(n_first, 1)
            nbk = -(-n_in // bt)
            if trunks and rng.random() >= roots["private_share"]:
                r = int(L.sample(roots["popularity"], rng, 1)[0])
                tr = trunks[r % len(trunks)]
                if nbk <= tr.size:
                    extra = max(int(L.sample_count0(comp["first_shared_extra_blocks"], rng, 1)[0]), 1)
                    ks = np.concatenate([tr, fresh(extra)])
                    n_in = (ks.size - 1) * bt + int(rng.integers(1, bt + 1))
                else:
                    ks = np.concatenate([tr, fresh(nbk - tr.size)])
            else:
                ks = fresh(nbk)
        else:
            lag = 1 + int(rng.choice(len(step["lag_pmf"]), p=np.asarray(step["lag_pmf"]) /
                                     np.sum(step["lag_pmf"])))
            pk, p_in = hist[max(j - lag, 0)]
            own = sess0["steps"][pick[si]] if emp_sess and sess0.get("steps") else None
            if own and trig is not None:
                own = [x for x in own if x[0] != 4]
            done = False
            if trig is not None and pk.size >= limit[0]:  # a length-triggered compaction
                c = 4
                if limit[1] is not None:  # the session's own rewrite
                    d, a, done = max(pk.size - limit[1], 0), max(limit[2], 1), True
                limit = next_limit()
            elif own:  # the session's own steps
                c, d, a, kept = own[int(rng.integers(0, len(own)))]
                d = max(pk.size - kept, 0) if c == 4 else d
                done = True
            else:
                cp = np.asarray(step["class_p"], dtype=np.float64)
                if trig is not None and cp.size > 4:
                    cp[4] = 0.0
                c = int(rng.choice(cp.size, p=cp / cp.sum()))
            if done:
                pass
            elif c == 0:
                d, a = 0, 0
            elif c == 1:
                d, a = 0, max(int(_draw_count(step["extend_appended"], rng)[0]), 1)
            elif c == 4:  # a compaction: keeps the parent's first blocks, appends a rewrite
                bp = step["compact_pairs"]
                r = int(rng.integers(0, int(bp["n"])))
                d, a = max(pk.size - int(bp["kept"][r]), 0), max(int(bp["appended"][r]), 1)
            elif c == 2 and step.get("branch_pairs"):
                d, a = _branch_pair(step["branch_pairs"], pk.size, rng)
            elif c == 2:
                d = max(int(_draw_count(step["branch_dropped"], rng)[0]), 1)
                a = max(d + _draw_delta(step["branch_length_change"], rng), 1)
            else:
                d, a = max(int(_draw_count(step["truncate_dropped"], rng)[0]), 1), 0
            m = max(pk.size - d, min(pk.size, 1))  # a session keeps its root block
            if m + a == 0:
                a = 1
            ks = np.concatenate([pk[:m], fresh(a)]) if a else pk[:m]
            n_in = p_in if (a == 0 and m == pk.size) else (ks.size - 1) * bt + int(rng.integers(1, bt + 1))
        out = max(int(float(L.sample(comp["output_tokens"], rng, 1)[0])), 0)
        hist.append((ks, n_in))
        rows.append((float(tj), ti, ks, n_in, out))


def _branch_pair(bp: dict, parent_blocks: int, rng, tries: int = 32) -> tuple:
    """A branch's (dropped, appended) pair drawn from the trace's pairs, among those that keep a block of
    this parent (drawn again while the pair drops the whole parent, up to ``tries`` times): a pair drawn
    for a longer parent would have its dropped count clamped and its appended count not, so sampled
    contexts would grow faster than the trace's."""
    n = int(bp["n"])
    for _ in range(tries):
        r = int(rng.integers(0, n))
        d, a = int(bp["dropped"][r]), int(bp["appended"][r])
        if d < parent_blocks:
            break
    return d, a


def _replay_session(times, ordered, n_first: int, *, bt, comp, fresh, rng, rows, ti, head=None) -> None:
    """A session drawn whole from the trace: its first request's length (opening with its shared
    ``head``, ids of this sample, when it had one), then each later request's own step in order (its
    parent ``lag`` requests back, the blocks it drops from and appends to the parent, its input
    tokens) on fresh ids, at the sampled times (``times``, cut at the window)."""
    n_in = max(int(n_first), 0)  # 0: a request without blocks, as in the trace
    nbk = -(-n_in // bt)
    if head is not None and head.size:
        head = head[:nbk]
        hist = [(np.concatenate([head, fresh(nbk - head.size)]), n_in)]
    else:
        hist = [(fresh(nbk), n_in)]
    for j in range(1, len(times)):
        lag, d, a, tok = (int(x) for x in ordered[j - 1])
        pk, _ = hist[max(j - max(lag, 1), 0)]
        m = max(pk.size - d, 0)
        ks = np.concatenate([pk[:m], fresh(a)]) if a else pk[:m]
        hist.append((ks, tok))  # the trace's tokens; made consistent with the blocks in sample_workload
    outs = np.maximum(np.asarray(L.sample(comp["output_tokens"], rng, len(times)), dtype=np.float64), 0)
    for (ks, n_in), tj, out in zip(hist, times, outs):
        rows.append((float(tj), ti, ks, n_in, int(out)))


def _sample_type(ti: int, tname: str, comp: dict, *, model: dict, D: float, bt: int, rng, fresh, rows: list) -> None:
    """Sample the sessions of one request type into ``rows`` ((time, type, keys, input, output) per request)."""
    arr = comp["arrivals"]
    if arr.get("family") == "empirical_times":
        starts = _sample_empirical_times(arr, rng, D)
    else:
        starts = L.sample_arrivals(L.Arrivals.from_dict(arr), rng, D)
    N = starts.size
    sess0 = comp["session"]
    emp_sess = sess0.get("family") == "empirical_sessions"
    pick = wk = muk = sgk = None  # set where the session and length laws need them
    if emp_sess:
        # each sampled start takes the trace session at the same rank among the trace's starts
        # (stratified: start k of N takes a session from the k-th of N equal strata of the ns
        # sessions, in start order), so a session keeps its place in the window: which sessions fit
        # in it whole depends on when they start (censoring at the trace's end)
        ns = int(sess0["n"])
        pick = np.minimum(((np.arange(N) + rng.random(N)) * ns / max(N, 1)).astype(np.int64), ns - 1) if N else []
    u_all = _stratified(rng, N)
    roots = comp["roots"]
    trunks = []
    if roots.get("popularity") and roots["n_shared"] > 0:
        tb = roots["trunk_blocks"]
        n_sh = int(roots["n_shared"])
        trunks = [fresh(int(tb[rng.integers(len(tb))]) if tb else 1) for _ in range(n_sh)]
    step = comp["step"]
    fl = comp["first_input_tokens"]
    emp_first = L.is_empirical(fl)
    if not emp_first:
        mix = L.Law.from_dict(fl)
        wk, muk, sgk = L.mix_components(mix)
    kinds = comp.get("session_by_kind") or [sess0]
    heads = None  # the shared heads of sessions drawn whole: one fresh id per trace head id, in this sample
    if emp_sess and sess0.get("heads"):
        heads = fresh(1 + max((max(h) for h in sess0["heads"] if h), default=0))
    for si, s0 in enumerate(starts):
        _sample_session(si, s0, D=D, bt=bt, comp=comp, emp_first=emp_first, emp_sess=emp_sess, fl=fl, fresh=fresh,
                        heads=heads,
                        kinds=kinds, muk=muk, pick=pick, rng=rng, roots=roots, rows=rows, sess0=sess0, sgk=sgk,
                        starts=starts, step=step, ti=ti, trunks=trunks, u_all=u_all, wk=wk)


def sample_workload(model: dict, seed: int = 0, *, duration_s: float | None = None, name: str = "fitted") -> Workload:
    """A workload of whole sessions drawn from a fitted model over ``[0, duration_s)`` (default: the
    fitted trace's window); requests after the end are dropped, as the trace's were. Session sizes
    are stratified draws (:func:`_stratified`); empirical sessions are drawn without replacement
    (each trace session once per round)."""
    _check_model(model)
    rng = np.random.default_rng(seed)
    bt = int(model["block_tokens"])
    D = float(model["duration_s"] if duration_s is None else duration_s)
    nxt = [0]

    def fresh(k):
        ids = np.arange(nxt[0], nxt[0] + k, dtype=np.uint64)
        nxt[0] += k
        return ids

    rows = []  # (time, type, keys, input tokens, output tokens)
    for ti, (tname, comp) in enumerate(model["components"].items()):
        _sample_type(ti, tname, comp, model=model, D=D, bt=bt, rng=rng, fresh=fresh, rows=rows)
    if not rows:
        raise ValueError("the fitted model produced no requests in the window")
    rows.sort(key=lambda r: r[0])
    lens = np.array([r[2].size for r in rows], dtype=np.int64)
    # input tokens within the blocks' range (ceil(tokens / bt) = blocks; 0 tokens for no blocks): a step
    # replayed on a parent of another length keeps its own token count only where that stays consistent
    inp = np.clip(np.array([r[3] for r in rows], dtype=np.int64), np.where(lens > 0, (lens - 1) * bt + 1, 0), lens * bt)
    ms = np.minimum(np.round(np.array([r[0] for r in rows]) * 1000).astype(np.int64), MAX_TRACE_MS)
    return Workload(
        arrival_ms=np.maximum.accumulate(ms),
        input_tokens=inp,
        output_tokens=np.array([r[4] for r in rows], dtype=np.int64),
        tenant=np.array([r[1] for r in rows], dtype=np.int32),
        keys=np.concatenate([r[2] for r in rows]).astype(np.uint64),
        offsets=np.concatenate([[0], np.cumsum(lens)]),
        block_tokens=bt,
        name=name,
        meta={"source": "fitted", "seed": int(seed), "duration_s": D,
              "types": ",".join(model["components"])},
    )


def naive_workload(trace: Workload, seed: int = 0, *, duration_s: float | None = None) -> Workload:
    """The baseline: Poisson arrivals at the trace's mean rate; every request a uniform resample of a
    trace request (its ids, input and output lengths), with the ids seen once in the trace replaced
    by fresh ones (leaves seen once are pruned)."""
    rng = np.random.default_rng(seed)
    t = trace.arrival_ms / 1000.0
    D = float(duration_s) if duration_s is not None else max(float(t[-1]) + 1e-3, 1e-3)
    rate = trace.n_requests / max(float(t[-1]) + 1e-3, 1e-3)
    n = rng.poisson(rate * D)
    times = np.sort(rng.uniform(0.0, D, n))
    pick = rng.integers(0, trace.n_requests, n)
    _, inv, cnt = np.unique(trace.keys, return_inverse=True, return_counts=True)
    once = cnt[inv.reshape(-1)] == 1
    nb = trace.n_blocks
    lens = nb[pick]
    idx = np.concatenate([np.arange(trace.offsets[i], trace.offsets[i + 1]) for i in pick]) if n else np.zeros(0, int)
    keys = trace.keys[idx].copy()
    repl = once[idx]
    base = np.uint64(int(trace.keys.max(initial=0)) + 1)
    keys[repl] = base + np.arange(int(repl.sum()), dtype=np.uint64)
    return Workload(
        arrival_ms=np.round(times * 1000).astype(np.int64), input_tokens=trace.input_tokens[pick],
        output_tokens=trace.output_tokens[pick], tenant=trace.tenant[pick], keys=keys,
        offsets=np.concatenate([[0], np.cumsum(lens)]), block_tokens=trace.block_tokens, name="naive",
        meta={"source": "naive", "seed": int(seed), "duration_s": D},
    )

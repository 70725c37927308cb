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
                   blocks and appends ``d + delta``), ``truncate`` (a prefix of the parent), with
                   count laws of the dropped and appended blocks and a two-sided law of ``delta``
``output``         output lengths in tokens

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
from scipy import optimize, special

from cacheresearch.fit import laws as L
from cacheresearch.fit.structure import request_structure
from cacheresearch.workload import Workload

__all__ = ["fit_workload", "sample_workload", "naive_workload", "MODEL_VERSION", "STEP_CLASSES", "count_ppf",
           "fit_length_count_copula"]

MODEL_VERSION = 1
STEP_CLASSES = ("repeat", "extend", "branch", "truncate")
_MAX_LAG = 32


def _step_class(d: np.ndarray, a: np.ndarray) -> np.ndarray:
    return np.where(d == 0, np.where(a == 0, 0, 1), np.where(a > 0, 2, 3))


def _fit_session(counts: np.ndarray, gaps: np.ndarray, gap_sess: np.ndarray, window: np.ndarray,
                 gap_families=L.POSITIVE) -> dict:
    """Joint censored MLE of (count law, gap law): session ``i`` shows ``counts[i]`` requests, its
    gaps ``gaps[gap_sess == i]``, and ``window[i]`` seconds from its last request to the end."""
    out = {"candidates": {}}
    gpos = np.maximum(gaps, 1e-3)
    if gaps.size < 2:  # too few reuses for a gap law: sessions of one request, counts complete
        out["count"] = L.fit_count(counts).to_dict() if counts.size >= 2 else L.Law("geom", {"p": 1.0}, 0.0, int(counts.size), {}).to_dict()
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


def count_ppf(law, u) -> np.ndarray:
    """Quantiles of a count law (integers >= 1) at ``u`` in (0, 1)."""
    law = L.Law.from_dict(law) if isinstance(law, dict) else law
    u = np.clip(np.asarray(u, dtype=np.float64), 1e-12, 1.0 - 1e-12)
    p = law.params
    if law.family == "geom":  # closed form
        q = np.ceil(np.log1p(-u) / math.log1p(-min(p["p"], 1.0 - 1e-15)))
    elif law.family == "nbinom1":
        q = L._frozen(law).ppf(u) + 1.0
    elif law.family == "zeta":  # smallest k with P(K <= k) >= u, by bisection on the Hurwitz zeta tail
        a = p["a"]
        z0 = special.zeta(a, 1.0)

        def cdf(k):
            return 1.0 - special.zeta(a, k + 1.0) / z0

        lo = np.zeros_like(u)
        hi = np.ones_like(u)
        for _ in range(64):  # grow hi until it covers u (capped at 2^63)
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
        q = hi
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


def fit_workload(w: Workload, *, session=None, parent=None, types=None, type_names=None,
                 duration_s: float | None = None, max_kinds: int = 6, gap_families=L.POSITIVE) -> dict:
    """Fit the model (module docstring) to a trace; ``session`` / ``parent`` / ``types`` come from a
    Bailian trace (:class:`~cacheresearch.workload.trace.BailianTrace`) when it has them.
    ``max_kinds``: most session kinds (length-mixture components); ``gap_families``: the candidate
    laws of the reuse gaps (each is fitted jointly with every count law)."""
    if w.n_requests < 10:
        raise ValueError("fitting needs at least 10 requests")
    st = request_structure(w, session, parent)
    t = w.arrival_ms / 1000.0
    D = float(duration_s) if duration_s is not None else max(float(t[-1]) + 1e-3, 1e-3)
    bt = int(w.block_tokens)
    nb = w.n_blocks.astype(np.int64)
    typ = np.zeros(w.n_requests, np.int64) if types is None else np.asarray(types, dtype=np.int64)
    names = list(type_names) if type_names is not None else [f"type{i}" for i in range(int(typ.max()) + 1)]
    if types is None and type_names is None:
        names = ["all"]
    comps = {}
    for ti, tname in enumerate(names):
        sel = typ == ti
        if not sel.any():
            continue
        first = sel & (st.position == 0)
        sids = st.session[first]
        if sids.size < 3:
            continue
        starts = t[first]
        comp = {"requests": int(sel.sum()), "sessions": int(sids.size)}
        comp["arrivals"] = L.fit_arrivals(starts, D).to_dict()
        # sessions: counts, gaps, censoring windows
        s_of = st.session[sel]
        uniq, cnt = np.unique(s_of, return_counts=True)
        last_t = np.full(uniq.size, -np.inf)
        np.maximum.at(last_t, np.searchsorted(uniq, s_of), t[sel])
        req_idx = np.nonzero(sel)[0]
        order = np.lexsort((t[req_idx], s_of))
        ss, tt = s_of[order], t[req_idx][order]
        same = ss[1:] == ss[:-1]
        gaps = (tt[1:] - tt[:-1])[same]
        win = np.maximum(D - last_t, 0.0)
        gs = ss[1:][same]
        comp["session"] = _fit_session(cnt.astype(np.float64), gaps, np.searchsorted(uniq, gs), win,
                                       gap_families=tuple(gap_families))
        # session kinds: the components of the first requests' length mixture, each with its own session law
        first_tok = np.maximum(w.input_tokens[first], 1).astype(np.float64)
        mix = L.fit_lognorm_mix(first_tok, max_kinds)
        comp["first_input_tokens"] = mix.to_dict()
        kind = np.argmax(L.mix_responsibilities(mix, first_tok), axis=1)  # per session (sessions sorted = sids)
        kinds = []
        _, mus, sgs = L.mix_components(mix)
        for j in range(mus.size):
            ks = np.nonzero(kind == j)[0]  # session indices (session ids are 0.. in order of first request)
            pos = np.searchsorted(uniq, sids[ks])
            m = np.isin(gs, sids[ks])
            if ks.size >= 5 and m.sum() >= 2:
                ksess = _fit_session(cnt[pos].astype(np.float64), gaps[m], np.searchsorted(uniq[pos], gs[m]),
                                     win[pos], gap_families=(comp["session"]["gap"]["family"],))
                # longer first requests may start longer sessions: the length-count copula of the kind
                zk = (np.log(first_tok[ks]) - float(mus[j])) / float(sgs[j])
                ksess["length_count"] = fit_length_count_copula(zk, cnt[pos], win[pos], ksess["count"], ksess["gap"])
                kinds.append(ksess)
            else:
                kinds.append(comp["session"])
        comp["session_by_kind"] = kinds
        # roots: sessions per first block among first requests
        rg = st.root_group[first]
        _, per_root = np.unique(rg, return_counts=True)
        shared_sess = per_root[per_root > 1]
        fm = first & (st.root_match > 0)
        if shared_sess.size >= 1 and fm.any():
            trunk = {}
            for r, m in zip(st.root_group[fm], st.root_match[fm]):
                trunk[int(r)] = max(trunk.get(int(r), 0), int(m))
            tl = np.asarray(list(trunk.values()), dtype=np.float64)
            comp["roots"] = {
                "private_share": float(np.mean(np.isin(rg, np.unique(rg)[per_root == 1]))),
                "n_shared": int(shared_sess.size),
                "popularity": L.fit_zipf_ranks(shared_sess).to_dict() if shared_sess.size >= 2 else
                L.Law("zipf_ranks", {"s": 0.0, "items": 1.0}, 0.0, int(shared_sess.sum()), {}).to_dict(),
                "trunk_blocks": sorted(int(x) for x in tl),
            }
            extra = (nb[fm] - st.root_match[fm]).astype(np.float64)
            comp["first_shared_extra_blocks"] = L.fit_count0(extra.astype(np.int64))
        else:
            comp["roots"] = {"private_share": 1.0, "n_shared": 0, "popularity": None, "trunk_blocks": []}
        # steps
        stp = sel & (st.parent >= 0)
        if stp.sum() >= 1:
            d, a = st.dropped[stp], st.appended[stp]
            cls = _step_class(d, a)
            comp["step"] = {
                "lag_pmf": _pmf(st.lag[stp], 1, _MAX_LAG),
                "class_p": [float(np.mean(cls == c)) for c in range(4)],
                # a branch keeps at least its session's root block: dropping all but one is a lower bound
                "branch_dropped": L.fit_count(d[cls == 2], at_least=(st.shared[stp] <= 1)[cls == 2]).to_dict()
                if np.sum(cls == 2) >= 2 else None,
                "branch_length_change": _fit_delta(a[cls == 2] - d[cls == 2]) if np.sum(cls == 2) >= 2 else None,
                "extend_appended": L.fit_count(a[cls == 1]).to_dict() if np.sum(cls == 1) >= 2 else None,
                "truncate_dropped": L.fit_count(d[cls == 3]).to_dict() if np.sum(cls == 3) >= 2 else None,
            }
        else:
            comp["step"] = None
        comp["output_tokens"] = L.fit_positive(np.maximum(w.output_tokens[sel], 0) + 0.5).to_dict()
        comps[tname] = comp
    return {"version": MODEL_VERSION, "kind": "session_model", "block_tokens": bt, "duration_s": D,
            "source": {"name": w.name, "requests": int(w.n_requests), "format": str(w.meta.get("format", ""))},
            "components": comps}


# ------------------------------------------------------------------------------ sampling
def _check_model(model: dict) -> None:
    if not isinstance(model, dict) or model.get("kind") != "session_model":
        raise ValueError("not a fitted session model (kind: session_model)")
    if int(model.get("version", -1)) != MODEL_VERSION:
        raise ValueError(f"fitted model version {model.get('version')!r}; this code reads version {MODEL_VERSION}")
    for k in ("block_tokens", "duration_s", "components"):
        if k not in model:
            raise ValueError(f"fitted model: missing key {k!r}")
    if not model["components"]:
        raise ValueError("fitted model: no components")


def _draw_count(law, rng, size=1):
    if law is None:
        return np.ones(size, np.int64)
    return L.sample(law, rng, size)


def sample_workload(model: dict, seed: int = 0, *, duration_s: float | None = None, name: str = "fitted") -> Workload:
    """A workload of whole sessions drawn from a fitted model over ``[0, duration_s)`` (default: the
    fitted trace's window); requests after the end are dropped, as the trace's were."""
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
        arr = L.Arrivals.from_dict(comp["arrivals"])
        starts = L.sample_arrivals(arr, rng, D)
        sess = comp["session"]
        roots = comp["roots"]
        trunks = []
        if roots.get("popularity") and roots["n_shared"] > 0:
            tb = roots["trunk_blocks"]
            n_sh = int(roots["n_shared"])
            trunks = [fresh(int(tb[rng.integers(len(tb))]) if tb else 1) for _ in range(n_sh)]
        step = comp["step"]
        mix = L.Law.from_dict(comp["first_input_tokens"])
        wk, muk, sgk = L.mix_components(mix)
        for s0 in starts:
            kind = int(rng.choice(wk.size, p=wk / wk.sum()))
            sess = comp["session_by_kind"][kind]
            z1 = float(rng.standard_normal())  # the first request's length as a normal score of its kind
            rho = float((sess.get("length_count") or {}).get("rho", 0.0))
            if rho != 0.0:
                u = special.ndtr(rho * z1 + math.sqrt(1.0 - rho * rho) * float(rng.standard_normal()))
                k = int(count_ppf(sess["count"], u))
            else:
                k = int(_draw_count(sess["count"], rng)[0])
            times = [np.array([s0])]
            left, last = k - 1, s0
            while left > 0 and last < D:  # gaps in chunks: a heavy-tailed count never allocates past the window
                g = np.cumsum(L.sample(sess["gap"], rng, min(left, 64))) + last
                times.append(g)
                left -= g.size
                last = float(g[-1])
            times = np.concatenate(times)
            times = times[times < D]
            hist = []  # (keys, input tokens) of this session's requests
            for j, tj in enumerate(times):
                if j == 0:
                    n_in = max(int(math.ceil(math.exp(muk[kind] + sgk[kind] * z1))), 1)
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
                    c = int(rng.choice(4, p=np.asarray(step["class_p"]) / np.sum(step["class_p"])))
                    if c == 0:
                        d, a = 0, 0
                    elif c == 1:
                        d, a = 0, int(_draw_count(step["extend_appended"], rng)[0])
                    elif c == 2:
                        d = int(_draw_count(step["branch_dropped"], rng)[0])
                        a = max(d + _draw_delta(step["branch_length_change"], rng), 1)
                    else:
                        d, a = int(_draw_count(step["truncate_dropped"], rng)[0]), 0
                    m = max(pk.size - d, min(pk.size, 1))  # a session keeps its root block
                    if m + a == 0:
                        a = 1
                    ks = np.concatenate([pk[:m], fresh(a)]) if a else pk[:m]
                    n_in = p_in if (a == 0 and m == pk.size) else (ks.size - 1) * bt + int(rng.integers(1, bt + 1))
                out = max(int(float(L.sample(comp["output_tokens"], rng, 1)[0])), 0)
                hist.append((ks, n_in))
                rows.append((float(tj), ti, ks, n_in, out))
    if not rows:
        raise ValueError("the fitted model produced no requests in the window")
    rows.sort(key=lambda r: r[0])
    lens = np.array([r[2].size for r in rows], dtype=np.int64)
    ms = np.minimum(np.round(np.array([r[0] for r in rows]) * 1000).astype(np.int64), np.iinfo(np.int32).max // 2)
    return Workload(
        arrival_ms=np.maximum.accumulate(ms),
        input_tokens=np.array([r[3] for r in rows], dtype=np.int64),
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

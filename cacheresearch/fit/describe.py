"""A fitted session model (:func:`cacheresearch.fit.fit_workload`) in words: per component and request type,
whether the sampler draws it from a parametric law (which law, its parameters with units) or resamples it
from the trace (and why the law fell back), and what a ``workload.source=fitted`` sample can extrapolate.

:func:`component_rows` gives the facts as records (what tests check); :func:`describe_model` the lines of
``experiment=fit``'s summary. A status is one of :data:`STATUSES`:

``parametric``   drawn from a fitted law (it can produce values the trace never showed)
``resampled``    drawn from the trace's own values (an empirical law): the fit fell back, ``why`` says why
``partly``       some of its laws are parametric, some resampled (the step component's sub-laws)
``not used``     the sampler does not read it: sessions drawn whole bring their own lengths and steps
``none``         no data for it (no shared roots, no session with a second request)

Plain Python over the model's dict; no I/O.
"""

from __future__ import annotations

import math

__all__ = ["STATUSES", "COMPONENT_NAMES", "law_words", "component_rows", "whole_sessions", "model_sessions",
           "extrapolation_lines", "describe_model", "rate_words"]

STATUSES = ("parametric", "resampled", "partly", "not used", "none")
#: the components a summary describes, in the sampler's order, with the words it uses for them
COMPONENT_NAMES = {
    "arrivals": "session starts",
    "session": "sessions (requests per session, reuse gaps)",
    "first": "first-request lengths",
    "roots": "shared roots",
    "step": "later requests (step classes)",
    "output": "output lengths",
}
_STEP_CLASSES = ("repeats its parent", "extends it", "branches off it", "truncates it", "compacts it")


def _q(x: float) -> str:
    """A number to 3 significant digits, with thousands separators from 1,000 up."""
    x = float(x)
    if not math.isfinite(x):
        return "inf" if x > 0 else "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _dur(s: float) -> str:
    """Seconds in words: ``40 s``, ``2,400 s (40 min)``, ``86,400 s (24 h)``."""
    s = float(s)
    if not math.isfinite(s):
        return "n/a"
    if s < 1:
        return f"{_q(1000 * s)} ms"
    if s < 120:
        return f"{_q(s)} s"
    if s < 7200:
        return f"{_q(s)} s ({_q(s / 60)} min)"
    return f"{_q(s)} s ({_q(s / 3600)} h)"


def rate_words(per_s: float, what: str, hourly: bool | None = None) -> str:
    """A rate per second in words, per hour below 0.1 a second (or as ``hourly`` says): ``2.17 sessions/s``,
    ``20.8 requests an hour``."""
    per_s = float(per_s)
    hourly = per_s < 0.1 if hourly is None else hourly
    return f"{_q(3600 * per_s)} {what} an hour" if hourly else f"{_q(per_s)} {what}/s"


def _n(k: int, word: str) -> str:
    """``1 session``, ``2 sessions`` (``word`` singular; its plural adds an s)."""
    return f"{int(k):,} {word}" + ("" if int(k) == 1 else "s")


def _amount(x: float, unit: str) -> str:
    return _dur(x) if unit == "s" else f"{_q(x)} {unit}".rstrip()


def _median(values) -> float:
    v = sorted(float(x) for x in values)
    n = len(v)
    return float("nan") if n == 0 else (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2]))


def _lognorm_mix_words(p: dict, unit: str) -> str:
    k = sum(1 for key in p if key.startswith("w"))
    parts = [(p[f"w{j}"], math.exp(p[f"mu{j}"]), p[f"sigma{j}"]) for j in range(k)]
    if k == 1:
        return f"lognormal, median {_amount(parts[0][1], unit)}, log-s.d. {parts[0][2]:.3g}"
    tot = sum(w for w, _, _ in parts) or 1.0
    return f"mixture of {k} lognormals (session kinds): " + ", ".join(
        f"{100 * w / tot:.0f}% with median {_amount(m, unit)}" for w, m, _ in parts)


def law_words(law, unit: str = "") -> str:
    """One fitted law (a dict of :mod:`cacheresearch.fit.laws`) in words with its parameters in ``unit``
    (``s`` reads as a duration); an empirical law as what is resampled."""
    if law is None:
        return "none"
    fam = law.get("family")
    if fam == "empirical":
        vals = law.get("values") or []
        return (f"the trace's {_n(law.get('n', len(vals)), 'value')} resampled (median "
                f"{_amount(_median(vals), unit)})")
    if fam == "empirical_pairs":
        return f"the trace's {_n(law.get('n', 0), 'observed pair')} resampled"
    p = law.get("params", {})
    if fam == "expon":
        return f"exponential, mean {_amount(p['scale'], unit)}"
    if fam == "gamma":
        return f"gamma, shape {p['shape']:.3g}, mean {_amount(p['shape'] * p['scale'], unit)}"
    if fam == "weibull":
        mean = p["scale"] * math.gamma(1.0 + 1.0 / p["shape"])
        return f"Weibull, shape {p['shape']:.3g}, scale {_amount(p['scale'], unit)} (mean {_amount(mean, unit)})"
    if fam == "lognorm":
        return f"lognormal, median {_amount(math.exp(p['mu']), unit)}, log-s.d. {p['sigma']:.3g}"
    if fam == "geom":
        return f"geometric, mean {_amount(1.0 / max(p['p'], 1e-300), unit)}"
    if fam == "zeta":
        a = p["a"]
        if a > 2:
            mean = _zeta_mean(a)
            return f"zeta (power law, P(k) ~ k^-{a:.3g}), mean {_amount(mean, unit)}"
        return f"zeta (power law, P(k) ~ k^-{a:.3g}; no finite mean: a heavy tail)"
    if fam == "nbinom1":
        n, pp = p["n"], p["p"]
        return f"1 + negative binomial (n {n:.3g}, p {pp:.3g}), mean {_amount(1.0 + n * (1 - pp) / pp, unit)}"
    if fam == "lognorm_mix":
        return _lognorm_mix_words(p, unit)
    if fam == "zipf_ranks":
        return f"Zipf over {int(p['items']):,} ranks, exponent {p['s']:.3g}"
    return str(fam)


def _zeta_mean(a: float) -> float:
    """Mean of the zeta law ``P(k) = k^-a / zeta(a)``: ``zeta(a - 1) / zeta(a)`` (a > 2), by partial sums
    with an integral tail (no scipy here)."""
    def z(s, n=2000):
        return sum(k ** -s for k in range(1, n)) + n ** (1 - s) / (s - 1) + 0.5 * n ** -s
    return z(a - 1) / z(a)


def _replayed(comp: dict) -> bool:
    """Sessions drawn whole that replay their own steps (the sampler reads no step or roots law then)."""
    s = comp.get("session") or {}
    return s.get("family") == "empirical_sessions" and s.get("ordered_steps") is not None


def whole_sessions(comp: dict) -> bool:
    """Whether a type's sample is its trace sessions drawn whole: sessions resampled with their own first
    lengths and their own steps in order (or no later request at all)."""
    s = comp.get("session") or {}
    return s.get("family") == "empirical_sessions" and (s.get("ordered_steps") is not None or not comp.get("step"))


def model_sessions(model: dict) -> int:
    """The number of sessions the model was fitted on (all types): the one session count a summary gives."""
    return int(sum(int(c.get("sessions", 0)) for c in model["components"].values()))


def _gof_why(gof: dict, key: str, law=None) -> str:
    why = (gof.get(key) or {}).get("why") or ""
    if not why and isinstance(law, dict):
        why = law.get("why") or ""
    return why


def _check_words(row: dict) -> str:
    """The figures a law was checked on, in words (KS distance and p, mean error, volume error)."""
    parts = []
    if isinstance(row.get("ks"), float):
        parts.append(f"KS distance {row['ks']:.3g} (p {row.get('ks_p', float('nan')):.2g})")
    if isinstance(row.get("mean_rel_error"), float):
        parts.append(f"mean {100 * row['mean_rel_error']:.2g}% off")
    if isinstance(row.get("volume_rel_error"), float):
        parts.append(f"implied requests {100 * row['volume_rel_error']:.2g}% off")
    return ", ".join(parts)


def _arrivals_row(comp: dict, gof: dict) -> dict:
    a = comp["arrivals"]
    if a.get("family") == "empirical_times":
        h = float(a.get("bandwidth_s", 0.0))
        moved = (f"each moved by a Gaussian kernel of bandwidth {_dur(h)}" if h > 0 else
                 "not moved (too few starts for a kernel)")
        return dict(status="resampled", law=f"the trace's {_n(len(a.get('times', [])), 'session start')}, {moved}",
                    why=_gof_why(gof, "arrivals"))
    rates = [float(r) for r in a["rates_per_s"]]
    D = float(a["duration_s"])
    mean = sum(rates) / len(rates)
    ren = a["renewal"]
    if ren["family"] == "expon":
        gaps = "exponential gaps (a Poisson process)"
    else:
        c = float(ren["params"]["shape"])
        cv = 1.0 / math.sqrt(c) if ren["family"] == "gamma" else math.sqrt(
            math.gamma(1 + 2 / c) / math.gamma(1 + 1 / c) ** 2 - 1)
        gaps = (f"{'gamma' if ren['family'] == 'gamma' else 'Weibull'} gaps of shape {c:.3g} on the rate's clock "
                f"(coefficient of variation {cv:.2f}: {'burstier' if cv > 1 else 'more regular'} than Poisson)")
    prof = ("a constant rate" if len(rates) == 1 else
            f"a rate in {len(rates)} equal pieces of {_dur(D / len(rates))}, {rate_words(min(rates), 'sessions')} "
            f"to {rate_words(max(rates), 'sessions')}")
    return dict(status="parametric", law=f"renewal process: {prof}, mean {rate_words(mean, 'sessions')}; {gaps}",
                why="", check=_check_words(gof.get("arrivals") or {}))


def _session_law_words(s: dict) -> str:
    out = (f"requests per session {law_words(s['count'], 'requests')}; gap between a session's consecutive "
           f"requests (its reuse time) {law_words(s['gap'], 's')}")
    if s.get("subsample"):
        out += f" (fitted on {s['subsample']['sessions']:,} of {s['subsample']['of']:,} sessions)"
    return out


def _session_row(comp: dict, gof: dict) -> dict:
    s = comp["session"]
    if s.get("family") == "empirical_sessions":
        keeps = ["its request count", "the gaps between its requests", "its first request's length"]
        if s.get("ordered_steps") is not None:
            keeps.append("its steps in order")
        if s.get("heads"):
            keeps.append("its shared head")
        return dict(status="resampled", law=f"the trace's {_n(s.get('n', 0), 'session')} drawn whole (each keeps "
                    + ", ".join(keeps) + ")", why=_gof_why(gof, "session", s))
    law = _session_law_words(s)
    kinds = [k for k in comp.get("session_by_kind") or [] if k is not s]
    if len(kinds) > 1:
        law += "; per session kind (shortest first): " + "; ".join(
            f"kind {j + 1}: {_session_law_words(k)}"
            + (f", length-count correlation {k['length_count']['rho']:.2f}"
               if (k.get("length_count") or {}).get("rho") else "") for j, k in enumerate(kinds))
    return dict(status="parametric", law=law, why="", check=_check_words(gof.get("session") or {}))


def _first_row(comp: dict, gof: dict) -> dict:
    f = comp["first_input_tokens"]
    if (comp.get("session") or {}).get("family") == "empirical_sessions":
        return dict(status="not used", law="each session drawn whole keeps its own first length", why="")
    st = "resampled" if (f or {}).get("family") == "empirical" else "parametric"
    return dict(status=st, law=law_words(f, "tokens"), why=_gof_why(gof, "first", f) if st == "resampled" else "",
                check=_check_words(gof.get("first") or {}))


def _roots_row(comp: dict, whole: bool) -> dict:
    r = comp.get("roots") or {}
    if whole:
        return dict(status="not used", law="the shared heads come with the sessions drawn whole", why="")
    if not r.get("popularity") or not r.get("n_shared"):
        return dict(status="none", law="every session starts a prefix tree of its own", why="")
    tb = r.get("trunk_blocks") or [0]
    return dict(status="parametric", law=f"{100 * r['private_share']:.0f}% of sessions start a private tree; the "
                f"others share {int(r['n_shared']):,} roots (system prompts), popularity "
                f"{law_words(r['popularity'])}, trunks of {min(tb):,}-{max(tb):,} blocks (the trace's)", why="")


def _step_row(comp: dict, gof: dict, whole: bool, bt: int) -> dict:
    st = comp.get("step")
    if whole:
        return dict(status="not used", law="each session drawn whole replays its own steps", why="")
    if not st:
        return dict(status="none", law="no session has a second request", why="")
    cp = st.get("class_p") or []
    shares = [(name, p) for name, p in zip(_STEP_CLASSES, cp) if p > 0]
    law = "each later request " + ", ".join(f"{name} {100 * p:.0f}%" for name, p in shares)
    unit = f"blocks of {bt} tokens"
    subs = [("blocks an extension appends", st.get("extend_appended"), "step.extend_appended"),
            ("blocks a truncation drops", st.get("truncate_dropped"), "step.truncate_dropped")]
    if st.get("branch_pairs"):
        subs.append(("a branch's (dropped, appended) blocks", st["branch_pairs"], "step.branch_pairs"))
    else:
        subs.append(("blocks a branch drops", st.get("branch_dropped"), "step.branch_dropped"))
        subs.append(("a branch's change in length (blocks)", (st.get("branch_length_change") or {}).get("abs"),
                     "step.branch_length_change"))
    if st.get("compact_pairs"):
        subs.append(("a compaction's (kept, appended) blocks", st["compact_pairs"], "step.compaction"))
    if st.get("compact_trigger"):
        subs.append(("the context length that triggers a compaction", st["compact_trigger"],
                     "step.compaction_trigger"))
    parts, kinds, whys = [], set(), []
    for what, sub, key in subs:
        if sub is None:
            continue
        emp = sub.get("family", "").startswith("empirical")
        kinds.add(emp)
        parts.append(f"{what}: {law_words(sub, unit if 'pairs' not in key else '')}")
        why = _gof_why(gof, key, sub) or ("always the trace's own pairs" if key == "step.compaction" else "")
        if emp and why:
            whys.append(f"{what}: {why}")
    status = "parametric" if kinds <= {False} else "resampled" if kinds == {True} else "partly"
    return dict(status=status, law=law + ("; " + "; ".join(parts) if parts else ""), why="; ".join(whys))


def component_rows(model: dict) -> dict:
    """``{type: {component: {status, law, why[, check]}}}`` for every request type of the model; the
    components are the keys of :data:`COMPONENT_NAMES`, ``status`` one of :data:`STATUSES`."""
    out = {}
    bt = int(model.get("block_tokens", 0))
    for t, comp in model["components"].items():
        gof = (model.get("goodness_of_fit") or {}).get(t, {})
        whole = _replayed(comp)
        out_law = comp.get("output_tokens")
        out_emp = (out_law or {}).get("family") == "empirical"
        out[t] = {
            "arrivals": _arrivals_row(comp, gof),
            "session": _session_row(comp, gof),
            "first": _first_row(comp, gof),
            "roots": _roots_row(comp, whole),
            "step": _step_row(comp, gof, whole, bt),
            "output": dict(status="none" if out_law is None else "resampled" if out_emp else "parametric",
                           law=law_words(out_law, "tokens"), why=_gof_why(gof, "output", out_law) if out_emp else "",
                           check=_check_words(gof.get("output") or {})),
        }
    return out


def extrapolation_lines(model: dict) -> list:
    """What a ``workload.source=fitted`` sample can and cannot change from the trace: duration, rate,
    tenants, and values beyond the trace's (session sizes, lengths)."""
    comps = model["components"]
    D = float(model["duration_s"])
    param_starts = [t for t, c in comps.items() if c["arrivals"].get("family") != "empirical_times"]
    whole = [t for t, c in comps.items() if c["session"].get("family") == "empirical_sessions"]
    req = int((model.get("source") or {}).get("requests") or sum(int(c.get("requests", 0)) for c in comps.values()))
    n = model_sessions(model)
    out = ["What the model can extrapolate (workload.source=fitted workload.fitted.path=OUT/results.nc):"]
    how = []
    if param_starts:
        how.append("parametric session starts continue the fitted rate profile, repeated period after period")
    if len(param_starts) < len(comps):
        how.append("resampled session starts repeat the trace's starts each period")
    if whole:
        how.append("sessions drawn whole are drawn again in each period, on fresh block ids (a copy shares only "
                   "the shared heads with the first)")
    out.append(f"  duration: yes, workload.fitted.duration_s=S (the trace covers {_dur(D)}): " + "; ".join(how))
    hourly = n / max(D, 1e-9) < 0.1
    rate = (f"  rate: no knob; a sample has the trace's rate ({rate_words(n / max(D, 1e-9), 'sessions', hourly)}, "
            f"{rate_words(req / max(D, 1e-9), 'requests', hourly)} on average)")
    if param_starts:
        rate += ("; the parametric starts' rate is data: scale components.TYPE.arrivals.rates_per_s in the model "
                 "written by study.write_model=FILE and sample that file (workload.fitted.path=FILE)")
    if len(param_starts) < len(comps):
        rate += "; resampled starts cannot be scaled"
    out.append(rate)
    out.append(f"  tenants: no; a sampled request's tenant is its request type ({len(comps)}: "
               f"{', '.join(comps)}); no knob adds tenants or shared prompts")
    if whole and len(whole) == len(comps):
        out.append("  values beyond the trace's: no; every session is one of the trace's (its size, gaps, lengths "
                   "and steps), only its start moves")
    else:
        out.append("  values beyond the trace's: the parametric laws above draw session sizes, gaps and lengths the "
                   "trace never showed (requests per session capped at 4 x the trace's largest session); the "
                   "resampled ones draw only the trace's own values")
    return out


def describe_model(model: dict) -> list:
    """The summary lines of a fitted model: per type one line per component (status, law in words, why
    it fell back), what it can extrapolate, and, when every type's sessions are drawn whole, that a sample
    reproduces the trace's own requests."""
    rows = component_rows(model)
    out = []
    for t, comps in rows.items():
        c = model["components"][t]
        out.append(f"The fitted model{'' if len(rows) == 1 else f', type {t}'}: {_n(c.get('sessions', 0), 'session')}, "
                   f"{_n(c.get('requests', 0), 'request')}")
        for k, r in comps.items():
            line = f"  {COMPONENT_NAMES[k]}: {r['status']}: {r['law']}"
            if r.get("why"):
                line += f" (fell back: {r['why']})"
            elif r.get("check") and r["status"] == "parametric":
                line += f" (checked: {r['check']})"
            out.append(line)
    out += extrapolation_lines(model)
    if all(whole_sessions(c) for c in model["components"].values()):
        still = sorted({COMPONENT_NAMES[k] for comps in rows.values() for k, r in comps.items()
                        if r["status"] == "parametric"})
        out.append("THIS MODEL IS THE TRACE RESAMPLED: every component fell back to drawing the trace's own sessions "
                   "whole, so a workload.source=fitted sample reproduces the trace's own requests (their sizes, "
                   "gaps, prompt lengths and prefix structure, on fresh block ids, each session's start moved by "
                   "the kernel)" + (f"; only the {' and '.join(still)} are drawn from a law" if still else "")
                   + ". It replays the trace with new seeds; it does not extrapolate it.")
    return out

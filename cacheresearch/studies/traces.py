"""Studies of traces: fitting a workload model and validating it by replay (``experiment=fit``).

Shell-side (files, xarray, matplotlib) around :mod:`cacheresearch.fit`; registered as study kinds in
:mod:`cacheresearch.studies` (``kind: fit`` in the experiment config).

``fit``  reads a Mooncake or Bailian trace (``trace.path``, ``trace.format``), fits the session model
         (:func:`cacheresearch.fit.fit_workload`), samples it with ``seeds`` seeds, and puts the trace's
         replay beside the samples' and beside the closed forms: token hit rate of one leaf-first LRU
         cache over a log grid of capacities (1% to 100% of the trace's working set; exact one-pass
         curves) and of one TTL cache refreshed on hit over ``study.ttl_s``; the naive baseline
         (:func:`cacheresearch.fit.naive_workload`) the same way. The fitted model is stored in the
         dataset (``attrs["fitted_model"]``, JSON), so ``workload.source=fitted
         workload.fitted.path=OUT/results.nc`` samples it; ``study.write_model=FILE`` also writes it
         as YAML.

``mooncake_fig9``    Mooncake FAST'25 Fig. 9 on a trace: token hit rate of one leaf-first LRU cache vs
                     its capacity in tokens (every capacity, one stack-distance pass), the 3M-token mark
                     and the smallest capacity that reaches 99% of the maximum
``mooncake_fig10``   Fig. 10: a global pool over ``nodes`` x ``node_tokens`` vs ``nodes`` local caches of
                     ``node_tokens`` each, as a hit-rate ratio, with the local caches reached by
                     round-robin (one-pass curves), longest-prefix match (the ``cache_aware`` router with
                     no load cap and no match threshold) and a load-capped cache-aware router (SGLang's
                     defaults; the JAX engine with the queue model)
``mooncake_table1``  arXiv 2407.00079 Table 1: LRU vs both LFUs vs LengthAwareCache (``lfu_perfect``, ``lfu``,
                     ``length_aware``)
                     at capacities in blocks (``inf`` = unbounded), one pool, the JAX engine

``ttl_trace``  TTL advice on a trace: per root (the requests that share a first block) the predicted
               daily cost of each option (``study.options``: refreshed-TTL pricing presets and ``none``),
               the cheapest per root, and the replay of the trace with those options (predicted vs
               replayed cost per root and per plan; :mod:`cacheresearch.fit.ttl_advice`)
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import xarray as xr
from scipy import stats

from cacheresearch.fit import fit_workload, naive_workload, sample_workload, tree_stats
from cacheresearch.fit.validate import analytic_hit_rates, capacity_grid, capacity_hit_rates, ttl_hit_rates, working_set
from cacheresearch.metrics.core import hit_tokens
from cacheresearch.studies import base as S
from cacheresearch.studies.base import Study
from cacheresearch.workload.trace import TRACE_FORMATS, BlockSizeError, detect_format, load_mooncake, read_bailian

__all__ = ["fit_study", "mooncake_fig9_study", "mooncake_fig10_study", "mooncake_table1_study", "ttl_trace_study",
           "load_fit_trace", "check_trace_memory", "model_from_file", "STUDIES"]

FIT_DEFAULTS = dict(
    trace=dict(path=None, format="auto", block_tokens=None, max_requests=None, sort=False),
    capacity_points=16,
    ttl_s=[60, 300, 900, 3600],
    baseline=True,
    write_model=None,
    max_kinds=6,
    ablation=True,  # one component at a time replaced by its empirical law (fit/model.ablate)
    ablation_seeds=2,  # sample seeds per ablated model (the first seeds of the run)
    volume_bins=8,  # equal time bins of the arrival-rate profile compared between trace and samples
)


def _resolve(p: str) -> Path:
    try:
        from hydra.utils import to_absolute_path

        return Path(to_absolute_path(p))
    except Exception:  # noqa: BLE001 - outside a Hydra run
        return Path(p).resolve()


#: Memory of a trace study (fit, ttl_trace) per block and per request of the trace and fixed (bytes), fitted
#: to the measured peaks of ``experiment=fit`` (``/usr/bin/time -v``): 0.50 GB on Mooncake (4.0 k requests,
#: 0.12 M blocks), 1.03 GB on the shared agent trace (2.5 k, 3.9 M), 3.83 GB on a 6x agent trace (15.3 k, 23.2 M),
#: 1.58 GB on a Bailian-format stand-in (19.5 k requests, 4.4 M blocks of 16 tokens): about 0.4 GB + 150 bytes a
#: block + 28 KB a request, within 9% of each; rounded up here.
TRACE_STUDY_BYTES_PER_BLOCK = 170
TRACE_STUDY_BYTES_PER_REQUEST = 32 << 10
TRACE_STUDY_FIXED_BYTES = 600 << 20


def check_trace_memory(path, max_requests=None, *, per_block: float = TRACE_STUDY_BYTES_PER_BLOCK,
                       per_request: float = TRACE_STUDY_BYTES_PER_REQUEST, fixed: float = TRACE_STUDY_FIXED_BYTES,
                       available: int | None = None) -> dict:
    """Estimate a trace study's peak memory before the trace is read (its size from the first lines,
    :func:`cacheresearch.workload.trace.estimate_trace_size`) and refuse a run that would not fit the
    memory available now, with the ``trace.max_requests`` that would. Returns the estimate."""
    from cacheresearch.core.run import available_memory_bytes
    from cacheresearch.studies.base import StudyError
    from cacheresearch.workload.trace import estimate_trace_size

    est = estimate_trace_size(path)
    req, blocks = est.requests, est.blocks
    if max_requests is not None and req > int(max_requests):
        blocks, req = int(blocks * int(max_requests) / max(req, 1)), int(max_requests)
    need = fixed + per_block * blocks + per_request * req
    avail = available_memory_bytes() if available is None else int(available)
    out = dict(requests=req, blocks=blocks, exact=est.exact, need_bytes=int(need), available_bytes=int(avail))
    if need > 0.9 * avail:
        fit = max(0, int(req * (0.8 * avail - fixed) / max(need - fixed, 1)))
        how = (f"set trace.max_requests={fit} (about the first requests that fit)" if fit >= 1
               else "free memory or use a larger machine")
        raise StudyError(
            f"trace {Path(path).name}: about {req:,} requests and {blocks:,} blocks "
            f"({'counted' if est.exact else 'estimated from its first lines and its size'}); this study needs "
            f"about {need / 2**30:.1f} GB ({per_block:g} bytes a block + {per_request / 1024:g} KB a request + "
            f"{fixed / 2**30:.1f} GB, measured), "
            f"{avail / 2**30:.1f} GB are available: {how}")
    return out


def load_fit_trace(tc: dict, *, check_memory: bool = True, key: str = "trace.block_tokens"):
    """``(workload, fit keyword arguments)`` of a trace setting ``{path, format, block_tokens,
    max_requests}``: Bailian traces bring their sessions, parents and types; a Mooncake trace's block size,
    when not given, is inferred from every line (:func:`cacheresearch.workload.trace.load_mooncake`), and a line
    it does not fit is named, with ``key`` (where the block size is set). ``check_memory``: refuse a trace whose
    study would not fit the memory available (:func:`check_trace_memory`) before reading it."""
    from cacheresearch.studies.base import StudyError

    if not tc.get("path"):
        raise StudyError("study.trace.path (or trace.path) is required: a Mooncake or Bailian JSONL trace")
    p = _resolve(str(tc["path"]))
    if not p.is_file():
        raise StudyError(f"trace.path: file not found: {tc['path']} (looked at {p})")
    fmt = tc.get("format") or "auto"
    if fmt == "auto":
        try:
            fmt = detect_format(p)
        except ValueError as e:  # an empty file, invalid JSON on its first line
            raise StudyError(f"trace: {e}") from None
    if fmt not in TRACE_FORMATS:
        raise StudyError(f"trace.format: unknown format {fmt!r}; choose auto or one of {sorted(TRACE_FORMATS)}")
    bt = tc.get("block_tokens") or (TRACE_FORMATS[fmt] if fmt == "bailian" else None)  # None: inferred
    mr = tc.get("max_requests")
    if check_memory:
        check_trace_memory(p, mr)
    try:  # a malformed file: its file-line-field message, not a traceback (TraceError is a ValueError)
        if fmt == "bailian":
            if tc.get("sort"):
                raise StudyError("trace.sort=true is for Mooncake traces; a Bailian trace's parents come before "
                                 "their children, in timestamp order")
            tr = read_bailian(p, block_tokens=int(bt), max_requests=mr)
            return tr.workload, dict(session=tr.session, parent=tr.parent, types=tr.type, type_names=tr.type_names)
        w = load_mooncake(p, block_tokens=None if bt is None else int(bt), max_requests=mr, sort=bool(tc.get("sort")))
        S.progress(f"trace {p.name}: {w.n_requests:,} requests, {w.block_tokens}-token blocks"
                   + (f" (inferred; sizes that fit every line: {w.meta['block_tokens_inferred']}; {key}=N sets it)"
                      if "block_tokens_inferred" in w.meta else ""))
        return w, {}
    except BlockSizeError as e:
        raise StudyError(f"trace: {e}; the block size is {key}") from None
    except ValueError as e:
        raise StudyError(f"trace: {e}") from None


def model_from_file(path) -> dict:
    """A fitted model from a YAML / JSON file or from a ``results.nc`` of ``experiment=fit``."""
    p = Path(path)
    if p.suffix == ".nc":
        with xr.open_dataset(p, engine="h5netcdf") as ds:
            if "fitted_model" not in ds.attrs:
                raise ValueError(f"{p}: not a dataset of experiment=fit (no fitted_model attribute)")
            return json.loads(ds.attrs["fitted_model"])
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(p), resolve=True)


def _mean_ci(x: np.ndarray, level: float = 0.95):
    """Mean over axis 0 and a t interval (NaN with one seed)."""
    m = x.mean(0)
    n = x.shape[0]
    if n < 2:
        return m, np.full_like(m, np.nan), np.full_like(m, np.nan)
    h = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(0, ddof=1) / math.sqrt(n)
    return m, m - h, m + h


def _trace_cfg(cfg, c: dict) -> dict:
    tc = dict(c["trace"])
    top = cfg.get("trace") if hasattr(cfg, "get") else None
    if top is not None:
        for k in ("path", "format", "block_tokens", "max_requests", "sort"):
            v = top.get(k) if hasattr(top, "get") else None
            if tc.get(k) in (None, "auto", False) and v is not None:
                tc[k] = v
    return tc


def _volume(x, D: float, bins: int, types: int) -> dict:
    """Requests, input tokens and the arrival-rate profile (requests per equal time bin) of a workload,
    per type (``tenant``) and in all."""
    edges = np.linspace(0.0, D, bins + 1)
    t = x.arrival_ms / 1000.0
    out = {}
    for ti in [-1] + list(range(types if types > 1 else 0)):
        m = np.ones(x.n_requests, bool) if ti < 0 else x.tenant == ti
        out["all" if ti < 0 else int(ti)] = {
            "requests": float(m.sum()), "tokens": float(x.input_tokens[m].sum()),
            "profile": np.histogram(np.clip(t[m], 0, np.nextafter(D, 0)), edges)[0].astype(float).tolist()}
    return out


def _volume_ratios(trace_v: dict, sample_vs: list) -> dict:
    """Per type: sample mean / trace for requests and tokens, and the largest relative deviation of
    the rate profile over the bins holding at least 5% of the trace's requests."""
    out = {}
    for k, tv in trace_v.items():
        sv = [v[k] for v in sample_vs if k in v]
        req = np.mean([v["requests"] for v in sv]) / max(tv["requests"], 1e-12)
        tok = np.mean([v["tokens"] for v in sv]) / max(tv["tokens"], 1e-12)
        tp = np.asarray(tv["profile"])
        sp = np.mean([v["profile"] for v in sv], axis=0)
        big = tp >= 0.05 * max(tp.sum(), 1)
        dev = float(np.max(np.abs(sp[big] / tp[big] - 1.0))) if big.any() else float("nan")
        out[str(k)] = {"requests_ratio": float(req), "tokens_ratio": float(tok), "profile_max_rel_dev": dev,
                       "profile_trace": tp.tolist(), "profile_sample": sp.tolist()}
    return out


def _curves(ws, caps, ttls):
    """Capacity and TTL curves of samples (an iterable: each drawn, replayed and dropped in turn)."""
    cap, ttl = [], []
    for x in ws:
        cap.append(capacity_hit_rates(x, caps))
        ttl.append(ttl_hit_rates(x, ttls))
    return np.stack(cap), np.stack(ttl)


def _sample_stats(draw, seeds, caps, ttls, vol_args) -> dict:
    """Every figure the fit study reports of one model's samples, each sample drawn, measured and dropped
    before the next (memory: one sample at a time, not one per seed); the first sample is kept."""
    from cacheresearch.fit.structure import session_hit_rates

    out = dict(cap=[], ttl=[], requests=[], volume=[], session_median=[], session_mean=[], first=None)
    for s in seeds:
        x = draw(s)
        out["cap"].append(capacity_hit_rates(x, caps))
        out["ttl"].append(ttl_hit_rates(x, ttls))
        out["requests"].append(x.n_requests)
        out["volume"].append(_volume(x, *vol_args))
        h = session_hit_rates(x)
        out["session_median"].append(float(np.median(h)) if h.size else float("nan"))
        out["session_mean"].append(float(np.mean(h)) if h.size else float("nan"))
        if out["first"] is None:
            out["first"] = x
        del x
    out["cap"], out["ttl"] = np.stack(out["cap"]), np.stack(out["ttl"])
    return out


def _fitted_laws(model: dict) -> dict:
    """Per request type and component of the fitted model: parametric or resampled, the law in words and why
    it fell back (:func:`cacheresearch.fit.describe.component_rows`)."""
    from cacheresearch.fit.describe import component_rows

    return component_rows(model)


def fit_study(cfg) -> xr.Dataset:
    from cacheresearch.fit.agent import agent_structure
    from cacheresearch.fit.model import COMPONENTS, ablate, ablation_effect
    from cacheresearch.fit.structure import chain_content_hashes, request_structure, session_hit_rates

    t0 = time.perf_counter()
    c = S.study_cfg(cfg, FIT_DEFAULTS)
    seeds = S.seeds(cfg)
    ttls = S.positive_list("study.ttl_s", c["ttl_s"])
    tc = _trace_cfg(cfg, c)
    w, extra = load_fit_trace(tc)
    w, chain = chain_content_hashes(w)  # a content-hash trace is replayed as a prefix cache sees it
    tf = time.perf_counter()
    S.progress(f"fit: fitting the session model, then {len(seeds)} sample(s) replayed against the trace ...")
    try:
        model = fit_workload(w, max_kinds=int(c["max_kinds"]), **extra)
    except ValueError as e:
        raise S.StudyError(f"fit: {e}") from None
    fit_s = time.perf_counter() - tf
    if c["write_model"]:
        from omegaconf import OmegaConf

        OmegaConf.save(OmegaConf.create(model), _resolve(str(c["write_model"])))
    caps = capacity_grid(w, int(c["capacity_points"]))
    tr_cap = capacity_hit_rates(w, caps)
    tr_ttl = ttl_hit_rates(w, ttls)
    D = float(model["duration_s"])
    n_types = len(model["components"])
    bins = int(c["volume_bins"])
    draws = {"fitted": lambda s: sample_workload(model, s)}
    if c["baseline"]:
        draws["naive"] = lambda s: naive_workload(w, s)
    # sessions as the samples define them (root trees: a sample carries no session ids), so trace and samples
    # are compared alike; a trace's own sessions (Bailian) are reported beside them
    sess_tr = session_hit_rates(w)
    sess_given = session_hit_rates(w, extra["session"]) if extra.get("session") is not None else None
    data, attrs = {}, {}
    tr_vol = _volume(w, D, bins, n_types)
    fitted_curves, first_fitted = None, None
    for name, draw in draws.items():
        st_ = _sample_stats(draw, seeds, caps, ttls, (D, bins, n_types))
        cap, ttl = st_["cap"], st_["ttl"]
        if name == "fitted":
            fitted_curves, first_fitted = (cap, ttl), st_["first"]
        for var, arr, dim in ((f"hit_rate_{name}", cap, "capacity_blocks"), (f"hit_rate_{name}_ttl", ttl, "ttl_s")):
            m, lo, hi = _mean_ci(arr)
            data[var] = ((dim,), m)
            data[var + "_ci_low"] = ((dim,), lo)
            data[var + "_ci_high"] = ((dim,), hi)
            data[var + "_seeds"] = (("seed", dim), arr)
        pre = "" if name == "fitted" else f"{name}_"
        attrs[f"{pre}max_abs_gap_capacity"] = float(np.max(np.abs(cap.mean(0) - tr_cap)))
        attrs[f"{pre}max_abs_gap_ttl"] = float(np.max(np.abs(ttl.mean(0) - tr_ttl)))
        attrs[f"{pre}tree_stats"] = json.dumps(tree_stats(st_["first"]))
        attrs[f"{pre}requests_mean"] = float(np.mean(st_["requests"]))
        attrs[f"{pre}volume"] = json.dumps(_volume_ratios(tr_vol, st_["volume"]))
        attrs[f"{pre}session_hit_rate_median"] = float(np.mean(st_["session_median"]))
        attrs[f"{pre}session_hit_rate_mean"] = float(np.mean(st_["session_mean"]))
        del st_
    # ablation: one component at a time replaced by its empirical law
    abl = {}
    if c["ablation"]:
        aseeds = seeds[: max(1, int(c["ablation_seeds"]))]
        k = len(aseeds)
        fc, ft = fitted_curves
        abl["fitted"] = {"capacity": float(np.max(np.abs(fc[:k].mean(0) - tr_cap))),
                         "ttl": float(np.max(np.abs(ft[:k].mean(0) - tr_ttl))), "changed": True}
        for comp in COMPONENTS:
            same = ablation_effect(model, comp)
            if same:  # already empirical, or not read by the sampler: the same model
                abl[comp] = dict(abl["fitted"], changed=False, why=same)
                continue
            am = ablate(model, comp)
            cap, ttl = _curves((sample_workload(am, s) for s in aseeds), caps, ttls)
            abl[comp] = {"capacity": float(np.max(np.abs(cap.mean(0) - tr_cap))),
                         "ttl": float(np.max(np.abs(ttl.mean(0) - tr_ttl))), "changed": True}
    st = request_structure(w, extra.get("session"), extra.get("parent"))
    try:
        agent = agent_structure(w, st)
        agent.pop("subagent_parent", None)
    except ValueError as e:  # pragma: no cover - a trace without steps
        agent = {"error": str(e)}
    che, ttl_an = analytic_hit_rates(first_fitted, caps, ttls)
    data["hit_rate_trace"] = (("capacity_blocks",), tr_cap)
    data["hit_rate_trace_ttl"] = (("ttl_s",), tr_ttl)
    data["hit_rate_analytic"] = (("capacity_blocks",), che)
    data["hit_rate_analytic_ttl"] = (("ttl_s",), ttl_an)
    ds = xr.Dataset(data, coords={"capacity_blocks": caps, "ttl_s": np.asarray(ttls), "seed": np.asarray(seeds)})
    ds = ds.assign_coords(capacity_share=("capacity_blocks", caps / working_set(w)))
    S.doc(ds, {
        "hit_rate_trace": ("token hit rate of the trace's replay, one leaf-first LRU cache", "1"),
        "hit_rate_trace_ttl": ("token hit rate of the trace's replay, one TTL cache refreshed on hit", "1"),
        "hit_rate_fitted": ("token hit rate of samples of the fitted model, mean over seeds", "1"),
        "hit_rate_fitted_ttl": ("token hit rate of samples of the fitted model (TTL), mean over seeds", "1"),
        "hit_rate_naive": ("token hit rate of the naive baseline (Poisson, resampled requests)", "1"),
        "hit_rate_naive_ttl": ("token hit rate of the naive baseline (TTL)", "1"),
        "hit_rate_analytic": ("Che's approximation from the fitted sample's block rates (finite window)", "1"),
        "hit_rate_analytic_ttl": ("1 - exp(-lambda TTL) from the fitted sample's block rates (finite window)", "1"),
    })
    laws = _fitted_laws(model)
    ds.attrs.update(S.common_attrs(cfg, "fit", t0, dict(
        trace=str(w.name), trace_format=str(w.meta.get("format", "")), trace_requests=int(w.n_requests),
        working_set_blocks=working_set(w), block_tokens=int(w.block_tokens), fit_time_s=fit_s,
        fitted_model=json.dumps(model), fitted_laws=json.dumps(laws), trace_tree_stats=json.dumps(tree_stats(w)),
        trace_session_hit_rate_median=float(np.median(sess_tr)) if sess_tr.size else float("nan"),
        trace_session_hit_rate_mean=float(np.mean(sess_tr)) if sess_tr.size else float("nan"),
        trace_sessions=int(sess_tr.size), key_chaining=json.dumps(chain),
        trace_given_session_hit_rate=json.dumps(None if sess_given is None else {
            "sessions": int(sess_given.size), "median": float(np.median(sess_given)),
            "mean": float(np.mean(sess_given))}),
        goodness_of_fit=json.dumps(model.get("goodness_of_fit", {})), notes=json.dumps(model.get("notes", [])),
        ablation=json.dumps(abl), agent_structure=json.dumps(agent), wall_time_s=time.perf_counter() - t0,
        seeds=len(seeds), **attrs)))
    return ds


def L_is_emp(law) -> bool:
    return isinstance(law, dict) and law.get("family") in ("empirical", "empirical_sessions", "empirical_times")


def _fit_sessions_words(model: dict, a) -> str:
    """The one session count of the summary and what a session is on this trace."""
    from cacheresearch.fit.describe import model_sessions

    n = model_sessions(model)
    conv = (model.get("source") or {}).get("conversations") or {}
    given = json.loads(a.get("trace_given_session_hit_rate", "null"))
    if given:
        how = "the trace's session ids"
    elif conv.get("used"):
        how = (f"the trace has no session ids: its {conv['roots']:,} prefix trees (the requests under one first "
               f"block), {conv['split_roots']:,} of them split into the conversations that interleave in time")
    else:
        how = "the trace has no session ids: a session is a prefix tree (the requests under one first block)"
    return f"{n:,} sessions: {how}"


def summarize_fit(ds) -> str:
    from cacheresearch.fit.describe import describe_model

    a = ds.attrs
    model = json.loads(a["fitted_model"])
    out = S.header(ds)
    out.append(f"trace {a['trace']} ({a['trace_format']}, {a['trace_requests']:,} requests, working set "
               f"{a['working_set_blocks']:,} blocks of {a['block_tokens']} tokens); fit {a['fit_time_s']:.1f} s; "
               f"{a['seeds']} sample seed(s)")
    out.append(_fit_sessions_words(model, a))
    out += ["", *describe_model(model), ""]
    has_naive = "hit_rate_naive" in ds
    hdr = (["capacity (blocks)", "share", "trace", "fitted [95% CI]", "analytic (Che)"]
           + (["naive"] if has_naive else []))
    rows = [hdr]
    for i, cb in enumerate(ds.capacity_blocks.values):
        x = ds.isel(capacity_blocks=i)
        r = [f"{int(cb):,}", f"{float(x.capacity_share):.2f}", S.pct(x.hit_rate_trace),
             f"{S.pct(x.hit_rate_fitted)} [{S.pct(x.hit_rate_fitted_ci_low)}, {S.pct(x.hit_rate_fitted_ci_high)}]",
             S.pct(x.hit_rate_analytic)]
        if has_naive:
            r.append(S.pct(x.hit_rate_naive))
        rows.append(r)
    out += ["LRU (leaf-first, one replica): token hit rate", S.table(rows), ""]
    rows = [["TTL (s, refresh)", "trace", "fitted [95% CI]", "analytic"] + (["naive"] if has_naive else [])]
    for i, tt in enumerate(ds.ttl_s.values):
        x = ds.isel(ttl_s=i)
        r = [f"{float(tt):g}", S.pct(x.hit_rate_trace_ttl),
             f"{S.pct(x.hit_rate_fitted_ttl)} [{S.pct(x.hit_rate_fitted_ttl_ci_low)}, "
             f"{S.pct(x.hit_rate_fitted_ttl_ci_high)}]",
             S.pct(x.hit_rate_analytic_ttl)]
        if has_naive:
            r.append(S.pct(x.hit_rate_naive_ttl))
        rows.append(r)
    out += [S.table(rows), ""]
    line = (f"max |fitted - trace|: capacity {100 * a['max_abs_gap_capacity']:.2f} points, TTL "
            f"{100 * a['max_abs_gap_ttl']:.2f} points (target 3)")
    if has_naive:
        line += (f"; naive baseline: capacity {100 * a['naive_max_abs_gap_capacity']:.2f}, TTL "
                 f"{100 * a['naive_max_abs_gap_ttl']:.2f}")
    out.append(line)
    for i, r in enumerate(model.get("predictive_check") or []):
        fell = [t for t, v in r["types"].items() if "fallback" in v]
        out.append(f"predictive check at fit time, round {i + 1} (2 samples, 6 capacities, 4 TTLs): capacity "
                   f"{100 * r['capacity_gap']:.2f}, TTL {100 * r['ttl_gap']:.2f} points; "
                   + (f"whole trace sessions for {', '.join(fell)}" if fell else "parametric sessions kept"))
    out += _fit_fidelity_lines(a, has_naive)
    out += ["", "radix tree of the trace and of the first fitted sample", _tree_table(a)]
    return "\n".join(out)


#: rows of the radix-tree table: (tree_stats key, words, format)
_TREE_ROWS = (("requests", "requests", "{:,.0f}"), ("nodes", "tree nodes (distinct blocks)", "{:,.0f}"),
              ("roots", "roots (distinct first blocks)", "{:,.0f}"),
              ("branching_nodes_share", "nodes with more than one child", "pct"),
              ("leaf_depth_mean", "mean depth of a leaf (blocks)", "{:,.1f}"),
              ("block_reuse_share_top10pct", "share of block reuses on the 10% most reused blocks", "pct"),
              ("reuse_time_p50_s", "median reuse time of a block (s)", "{:,.3g}"))


def _tree_table(a) -> str:
    ts, fs = json.loads(a["trace_tree_stats"]), json.loads(a["tree_stats"])

    def fmt(x, f):
        if x is None or not np.isfinite(float(x)):
            return "n/a"
        return f"{100 * float(x):.1f}%" if f == "pct" else f.format(float(x))

    rows = [["", "trace", "fitted sample"]]
    rows += [[w, fmt(ts.get(k), f), fmt(fs.get(k), f)] for k, w, f in _TREE_ROWS if k in ts]
    return S.table(rows)


#: the ablation's components (:data:`cacheresearch.fit.model.COMPONENTS`) in the summary's words
COMPONENT_WORDS = {"fitted": "the fitted model", "arrivals": "session starts", "session": "sessions",
                   "first": "first-request lengths", "step": "later requests", "output": "output lengths"}


def _fit_fidelity_lines(a, has_naive: bool) -> list:
    """Summary lines: key chaining, notes (empirical fallbacks), volume, per-session hit rates, the
    goodness of fit per component, the ablation, and the verdict against the naive baseline."""
    out = []
    ch = json.loads(a.get("key_chaining", "{}"))
    if ch.get("chained"):
        out.append(f"ids: per-block content hashes detected ({ch['inconsistent_ids']:,} of {ch['ids']:,} ids follow "
                   "different blocks); chained into prefix ids before replay and fit")
    for n in json.loads(a.get("notes", "[]")):  # the fallbacks are in the model's lines; the other notes here
        if not re.match(r"\[[^\]]*\] [\w.]+: empirical law|sessions: ", n):
            out.append(f"note: {n}")
    vol = json.loads(a.get("volume", "{}"))
    for t, v in vol.items():
        out.append(f"volume [{t}] sample mean / trace: requests {v['requests_ratio']:.3f}, input tokens "
                   f"{v['tokens_ratio']:.3f}, arrival-rate profile max deviation {_pct_or(v['profile_max_rel_dev'])} "
                   f"(bins with >= 5% of the requests; target 5%)")
    if has_naive and "naive_volume" in a:
        v = json.loads(a["naive_volume"]).get("all", {})
        if v:
            out.append(f"volume, naive: requests {v['requests_ratio']:.3f}, input tokens {v['tokens_ratio']:.3f}")
    line = (f"token hit rate per prefix tree, unbounded cache (median / mean over the {a.get('trace_sessions', 0):,} "
            "prefix trees of the trace; the samples carry no session ids): "
            f"trace {_pct_or(a['trace_session_hit_rate_median'])} / {_pct_or(a['trace_session_hit_rate_mean'])}, "
            f"fitted {_pct_or(a['session_hit_rate_median'])} / {_pct_or(a['session_hit_rate_mean'])}")
    if has_naive:
        line += (f", naive {_pct_or(a['naive_session_hit_rate_median'])} / "
                 f"{_pct_or(a['naive_session_hit_rate_mean'])}")
    out.append(line)
    given = json.loads(a.get("trace_given_session_hit_rate", "null"))
    if given:
        out.append(f"token hit rate per session of the trace (its session ids): median "
                   f"{_pct_or(given['median'])} / mean {_pct_or(given['mean'])}")
    abl = json.loads(a.get("ablation", "{}"))
    if abl:
        out.append("ablation (each component replaced by its empirical law; max gap in points, capacity / TTL):")
        base = abl["fitted"]
        best = None
        for k, v in abl.items():
            tag = "" if v.get("changed", True) else f" ({v.get('why', 'already empirical')})"
            out.append(f"  {COMPONENT_WORDS.get(k, k):24s} {100 * v['capacity']:6.2f} / {100 * v['ttl']:6.2f}{tag}")
            if k != "fitted" and v.get("changed", True):
                gain = max(base["capacity"] - v["capacity"], base["ttl"] - v["ttl"])
                if best is None or gain > best[1]:
                    best = (k, gain)
        if best is not None and best[1] > 0.005:
            out.append(f"weakest component: {COMPONENT_WORDS.get(best[0], best[0])} (its empirical law closes "
                       f"{100 * best[1]:.2f} points of the largest gap)")
        elif best is not None:
            out.append("no single component's empirical law closes more than 0.5 points: the gap is in their joint law")
            best = None
    if has_naive:
        worse = [n for n, f, b in (("capacity", a["max_abs_gap_capacity"], a["naive_max_abs_gap_capacity"]),
                                   ("TTL", a["max_abs_gap_ttl"], a["naive_max_abs_gap_ttl"])) if f > b]
        if worse:
            why = (f"the ablation names the {COMPONENT_WORDS.get(best[0], best[0])} as the weakest component"
                   if abl and best is not None else
                   "no single component's law is the cause (the ablation)" if abl else
                   "run with study.ablation=true to find the weak component")
            out.append(f"WORSE than the naive baseline on the {' and '.join(worse)} curve: {why}; the naive baseline "
                       "resamples the trace's own requests (it copies their prefix paths), so on a trace whose reuse "
                       "is dominated by few long contexts it is close to a replay")
        else:
            out.append("the fitted model is at least as close as the naive baseline on both curves")
    ag = json.loads(a.get("agent_structure", "{}"))
    if ag and "error" not in ag:
        out.append(f"agent structure (prefix tree, no session ids): {ag['contexts']:,} contexts in "
                   f"{ag['sessions']:,} agent groups (a context with the subagents nested in it; subagent share "
                   f"{ag['subagent_share']:.2f}), compactions {ag['compaction_rate']:.3f} per step, "
                   f"growth {ag['growth_blocks_mean']:.1f} blocks per step (median {ag['growth_blocks_p50']:.0f}), "
                   f"context p50 {ag['context_blocks_p50']:.0f} / max {ag['context_blocks_max']} blocks")
    return out


def _pct_or(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * float(x):.1f}%"


def plot_fit(ds):

    fig = S.fig(11, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    x = ds.capacity_blocks.values
    for ax, dim, suf, xl in ((ax1, "capacity_blocks", "", "LRU capacity (blocks)"), (ax2, "ttl_s", "_ttl", "TTL (s)")):
        xv = ds[dim].values
        ax.plot(xv, 100 * ds[f"hit_rate_trace{suf}"], "k-o", ms=4, label="trace replay")
        ax.plot(xv, 100 * ds[f"hit_rate_fitted{suf}"], "C0-s", ms=4, label="fitted model (mean)")
        lo, hi = ds[f"hit_rate_fitted{suf}_ci_low"], ds[f"hit_rate_fitted{suf}_ci_high"]
        if np.all(np.isfinite(lo)):
            ax.fill_between(xv, 100 * lo, 100 * hi, color="C0", alpha=0.25, label="fitted 95% CI")
        ax.plot(xv, 100 * ds[f"hit_rate_analytic{suf}"], "C2--", label="analytic (Che / TTL formula)")
        if f"hit_rate_naive{suf}" in ds:
            ax.plot(xv, 100 * ds[f"hit_rate_naive{suf}"], "C3:", label="naive baseline")
        ax.set_xscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("token hit rate (%)")
        ax.grid(True, alpha=0.3)
    del x
    a = ds.attrs
    ax1.set_title(f"{a['trace']}: max gap {100 * a['max_abs_gap_capacity']:.1f} pts")
    ax2.set_title(f"TTL refresh: max gap {100 * a['max_abs_gap_ttl']:.1f} pts")
    ax1.legend(fontsize="small")
    return fig


# ------------------------------------------------------------------------------ Mooncake figures
MOONCAKE_DEFAULTS = dict(
    trace=dict(path=None, format="auto", block_tokens=None, max_requests=None, sort=False),
    mark_tokens=3_000_000,
    nodes=10,
    node_tokens=[3_000_000],
    capacities=["inf", 100_000, 50_000, 30_000, 10_000, 1_000],
    policies=["lru", "lfu_perfect", "lfu", "length_aware"],
)


def _trace_only(cfg, defaults):

    c = S.study_cfg(cfg, defaults)
    w, _ = load_fit_trace(_trace_cfg(cfg, c))
    return S, c, w


def _token_rate(w, hit_blocks) -> float:
    hb = np.asarray(hit_blocks, dtype=np.int64)
    return float(hit_tokens(np.asarray(hb, np.int64), w.block_tokens, w.input_tokens, np).sum()
                 / max(int(w.input_tokens.sum()), 1))


def mooncake_fig9_study(cfg) -> xr.Dataset:
    from cacheresearch.analysis.mrc import hit_curve

    t0 = time.perf_counter()
    S, c, w = _trace_only(cfg, MOONCAKE_DEFAULTS)
    hc = hit_curve(w)
    rate = np.asarray(hc.token_hit_rate, dtype=np.float64)
    bt = int(w.block_tokens)
    ws = working_set(w)
    pts = np.unique(np.concatenate([np.round(np.geomspace(1, ws, 200)).astype(np.int64), [ws]]))
    pts = pts[pts < rate.size]
    mx = float(rate[-1])
    c99 = int(np.argmax(rate >= 0.99 * mx))
    mark = int(c["mark_tokens"]) // bt
    at_mark = float(rate[min(mark, rate.size - 1)])
    ds = xr.Dataset({"hit_rate": (("capacity_blocks",), rate[pts])},
                    coords={"capacity_blocks": pts, "capacity_tokens": ("capacity_blocks", pts * bt)})
    S.doc(ds, {"hit_rate": ("token hit rate, one leaf-first LRU cache (exact, every capacity)", "1")})
    ds.attrs.update(S.common_attrs(cfg, "mooncake_fig9", t0, dict(
        trace=str(w.name), trace_requests=int(w.n_requests), block_tokens=bt, working_set_blocks=ws,
        max_hit_rate=mx, mark_tokens=int(c["mark_tokens"]), hit_rate_at_mark=at_mark,
        share_of_max_at_mark=at_mark / mx if mx > 0 else float("nan"), capacity_99pct_blocks=c99,
        capacity_99pct_tokens=c99 * bt)))
    return ds


def summarize_fig9(ds) -> str:

    a = ds.attrs
    out = S.header(ds)
    out.append(f"trace {a['trace']} ({a['trace_requests']:,} requests, {a['working_set_blocks']:,} distinct blocks of "
               f"{a['block_tokens']} tokens = {a['working_set_blocks'] * a['block_tokens'] / 1e6:.1f}M tokens)")
    out.append(f"maximum (unbounded) token hit rate {S.pct(a['max_hit_rate'])}; at {a['mark_tokens'] / 1e6:g}M tokens "
               f"{S.pct(a['hit_rate_at_mark'])} = {S.pct(a['share_of_max_at_mark'])} of the maximum; 99% of the "
               "maximum "
               f"from {a['capacity_99pct_tokens'] / 1e6:.1f}M tokens ({a['capacity_99pct_blocks']:,} blocks)")
    out.append("published (FAST'25 Fig. 9): a 3M-token cache reaches under half the maximum in most workloads; "
               "about 50M tokens nearly reaches it")
    return "\n".join(out)


def plot_fig9(ds):

    fig = S.fig(7.5, 4.5)
    ax = fig.subplots()
    a = ds.attrs
    ax.plot(ds.capacity_tokens / 1e6, 100 * ds.hit_rate, "C0-")
    ax.axvline(a["mark_tokens"] / 1e6, color="C3", ls="--", label=f"{a['mark_tokens'] / 1e6:g}M tokens")
    ax.axvline(a["capacity_99pct_tokens"] / 1e6, color="C2", ls=":", label="99% of the maximum")
    ax.axhline(100 * a["max_hit_rate"], color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (M tokens)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(f"Mooncake Fig. 9 on {a['trace']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


FIG10_ROUTERS = {
    "round_robin": dict(router="round_robin"),
    "longest_prefix": dict(router="cache_aware", cache_threshold_pm=0, balance_abs=2**30),
    "cache_aware_capped": dict(router="cache_aware"),
}


def _engine_rates(w, params, *, max_replicas, stateful=False):
    from cacheresearch.engine import compile_stream

    hits = yield from S.engine_hits([compile_stream(w, stateful_singletons=stateful)], params,
                                   max_replicas=max_replicas)
    return [_token_rate(w, h[0]) for h in hits]


def mooncake_fig10_study(cfg) -> xr.Dataset:
    from cacheresearch.analysis.mrc import hit_curve
    from cacheresearch.engine import make_params

    t0 = time.perf_counter()
    S, c, w = _trace_only(cfg, MOONCAKE_DEFAULTS)
    bt = int(w.block_tokens)
    R = int(c["nodes"])
    toks = S.positive_list("study.node_tokens", c["node_tokens"], integer=True)
    routers = list(FIG10_ROUTERS)
    local = np.zeros((len(routers), len(toks)))
    glob = np.zeros(len(toks))
    ts = time.perf_counter()
    for j, nt in enumerate(toks):
        cap = nt // bt
        glob[j] = float(hit_curve(w, max_capacity=cap * R).token_hit_rate[cap * R])
        local[0, j] = float(hit_curve(w, replicas=R, router="round_robin", max_capacity=cap).token_hit_rate[cap])
        ps = [make_params("lru", capacity_blocks=cap, replicas=R, **FIG10_ROUTERS[r]) for r in routers[1:]]
        local[1:, j] = yield from _engine_rates(w, ps, max_replicas=R)
    t_sim = time.perf_counter() - ts
    ds = xr.Dataset({"hit_rate_local": (("router", "node_tokens"), local), "hit_rate_global": (("node_tokens",), glob),
                     "global_over_local": (("router", "node_tokens"),
                                           glob[None, :] / np.where(local > 0, local, np.nan))},
                    coords={"router": routers, "node_tokens": np.asarray(toks)})
    S.doc(ds, {"hit_rate_local": (f"token hit rate of {R} local LRU caches, by the router that reaches them", "1"),
                "hit_rate_global": (f"token hit rate of one global pool of {R} x node_tokens", "1"),
                "global_over_local": ("hit-rate ratio global pool / local caches", "1")})
    ds.attrs.update(S.common_attrs(cfg, "mooncake_fig10", t0, dict(
        trace=str(w.name), trace_requests=int(w.n_requests), block_tokens=bt, nodes=R, simulate_time_s=t_sim,
        routers=json.dumps(FIG10_ROUTERS))))
    return ds


def summarize_fig10(ds) -> str:

    a = ds.attrs
    out = S.header(ds)
    out.append(f"trace {a['trace']} ({a['trace_requests']:,} requests); {a['nodes']} nodes")
    rows = [["node capacity", "global pool"] + [f"local, {r}" for r in ds.router.values] +
            [f"ratio, {r}" for r in ds.router.values]]
    for nt in ds.node_tokens.values:
        x = ds.sel(node_tokens=nt)
        rows.append([f"{nt / 1e6:g}M tokens", S.pct(x.hit_rate_global)] + [S.pct(v) for v in x.hit_rate_local.values]
                    + [f"{float(v):.2f}x" for v in x.global_over_local.values])
    out.append(S.table(rows))
    out.append("published (FAST'25 Fig. 10): the global pool raises hit rates 1.38x-2.36x over local caches")
    return "\n".join(out)


def plot_fig10(ds):

    fig = S.fig(7.5, 4.5)
    ax = fig.subplots()
    xs = np.arange(ds.sizes["router"])
    for j, nt in enumerate(ds.node_tokens.values):
        ax.bar(xs + 0.8 * j / ds.sizes["node_tokens"], ds.global_over_local.sel(node_tokens=nt),
               0.8 / ds.sizes["node_tokens"], label=f"{nt / 1e6:g}M tokens per node")
    ax.axhspan(1.38, 2.36, color="C3", alpha=0.15, label="published 1.38x-2.36x")
    ax.set_xticks(xs, [str(r) for r in ds.router.values])
    ax.set_ylabel("hit rate: global pool / local caches")
    ax.set_title(f"Mooncake Fig. 10 on {ds.attrs['trace']} ({ds.attrs['nodes']} nodes)")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def _table1_rates(w, params):
    """Token hit rates: libCacheSim's per-block policies (``lfu``, ...) on the numba engine, the rest on the
    JAX engine (one call each)."""
    from cacheresearch.backends.numba_policies import block_replay_grid
    from cacheresearch.cache.policies import BLOCK_IDS, PRIORITY_IDS

    blk = [i for i, p in enumerate(params) if int(p.policy) in BLOCK_IDS]
    jx = [i for i, p in enumerate(params) if int(p.policy) not in BLOCK_IDS]
    out = [0.0] * len(params)
    if jx:
        stateful = any(int(params[i].policy) in PRIORITY_IDS for i in jx)
        rates = yield from _engine_rates(w, [params[i] for i in jx], max_replicas=1, stateful=stateful)
        for i, r in zip(jx, rates):
            out[i] = r
    if blk:
        m = block_replay_grid(w, [params[i] for i in blk])
        for i, r in zip(blk, m.token_hit_rate):
            out[i] = float(r)
    return out


def mooncake_table1_study(cfg) -> xr.Dataset:
    from cacheresearch.engine import make_params

    t0 = time.perf_counter()
    S, c, w = _trace_only(cfg, MOONCAKE_DEFAULTS)
    caps = [str(x) for x in c["capacities"]]
    pols = list(c["policies"])
    params, cells = [], []
    for pi, p in enumerate(pols):
        for ci, cap in enumerate(caps):
            if cap == "inf":
                params.append(make_params("unbounded"))
            else:
                params.append(make_params(p, capacity_blocks=int(float(cap))))
            cells.append((pi, ci))
    ts = time.perf_counter()
    rates = yield from _table1_rates(w, params)
    t_sim = time.perf_counter() - ts
    out = np.zeros((len(pols), len(caps)))
    for (pi, ci), r in zip(cells, rates):
        out[pi, ci] = r
    ds = xr.Dataset({"hit_rate": (("policy", "capacity"), out)}, coords={"policy": pols, "capacity": caps})
    S.doc(ds, {"hit_rate": ("token hit rate, one pool (capacity in blocks; inf = unbounded)", "1")})
    ds.attrs.update(S.common_attrs(cfg, "mooncake_table1", t0, dict(
        trace=str(w.name), trace_requests=int(w.n_requests), block_tokens=int(w.block_tokens),
        working_set_blocks=working_set(w), simulate_time_s=t_sim)))
    return ds


TABLE1_PUBLISHED = {"lru": [.51, .51, .50, .48, .40, .30], "lfu": [.51, .51, .49, .43, .35, .30],
                    "length_aware": [.51, .50, .48, .42, .35, .30]}


def summarize_table1(ds) -> str:

    a = ds.attrs
    out = S.header(ds)
    out.append(f"trace {a['trace']} ({a['trace_requests']:,} requests, working set {a['working_set_blocks']:,} blocks)")
    caps = [str(x) for x in ds.capacity.values]
    rows = [["policy"] + caps]
    for p in ds.policy.values:
        rows.append([str(p)] + [f"{float(v):.2f}" for v in ds.hit_rate.sel(policy=p).values])
    out.append(S.table(rows))
    if caps == ["inf", "100000", "50000", "30000", "10000", "1000"]:
        rows = [["published (tool&agent trace)"] + caps]
        for p, v in TABLE1_PUBLISHED.items():
            rows.append([p] + [f"{x:.2f}" for x in v])
        out += ["", S.table(rows)]
    return "\n".join(out)


def plot_table1(ds):

    fig = S.fig(7.5, 4.5)
    ax = fig.subplots()
    xs = np.arange(ds.sizes["capacity"])
    for i, p in enumerate(ds.policy.values):
        ax.plot(xs, 100 * ds.hit_rate.sel(policy=p), "o-", label=str(p))
    ax.set_xticks(xs, [str(c) for c in ds.capacity.values])
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(f"Mooncake arXiv Table 1 on {ds.attrs['trace']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


# ------------------------------------------------------------------------------ TTL advice on a trace
TTL_TRACE_DEFAULTS = dict(
    trace=dict(path=None, format="auto", block_tokens=None, max_requests=None, sort=False),
    options=["anthropic_5m", "anthropic_1h", "none"],
    pricing_overrides={},
    base_per_mtok=None,  # null: each preset's own base price
    duration_s=None,  # the observation window; null: the span of the trace's arrival times
    top_roots=12,  # roots listed in the summary
    reuse="fitted",  # fitted: each root's reuse-time law; poisson: Poisson keys
)


#: the ttl_trace dataset's variables: (description, unit)
TTL_TRACE_DOC = {
    "cost_predicted_usd_per_day": ("predicted daily cost of the root's requests (study.reuse: fitted = its own "
                                   "reuse gaps blended with its fitted law; poisson = Poisson keys)",
                                   "USD/day"),
    "cost_predicted_poisson_usd_per_day": ("predicted daily cost with Poisson keys (for comparison)", "USD/day"),
    "cost_simulated_usd_per_day": ("daily cost of the root's requests in the replay of the trace", "USD/day"),
    "cost_steady_usd_per_day": ("predicted long-run daily cost (no compulsory first miss)", "USD/day"),
    "cost_uncached_usd_per_day": ("daily cost of the root's requests without caching", "USD/day"),
    "advised": ("cheapest option by the prediction (ties: none)", ""),
    "oracle": ("cheapest option in the replay (ex post)", ""),
    "advised_steady": ("cheapest option by the long-run prediction", ""),
    "saving_predicted_usd_per_day": ("uncached minus advised, predicted", "USD/day"),
    "saving_simulated_usd_per_day": ("uncached minus advised, replayed", "USD/day"),
    "requests_per_day": ("requests of the root, scaled to a day", "1/day"),
    "trunk_blocks": ("blocks every request of the root shares with its first request", "1"),
    "first_request": ("index of the root's first request in the trace", "1"),
    "total_predicted_usd_per_day": ("total predicted daily cost of a plan (uniform option, advised, oracle)",
                                    "USD/day"),
    "total_simulated_usd_per_day": ("total daily cost of a plan in the replay", "USD/day"),
    "total_steady_usd_per_day": ("total long-run predicted daily cost of a plan", "USD/day"),
    "cost_typical_usd_per_day": ("typical (median) daily cost of the root under the predicted hit probabilities "
                                 "(fit.ttl_advice.typical_root_costs: the point prediction of one root)", "USD/day"),
}


def ttl_trace_study(cfg) -> xr.Dataset:
    """TTL advice per shared root on a trace, predicted and replayed (:mod:`cacheresearch.fit.ttl_advice`)."""
    from cacheresearch.analysis.pricing import Pricing, preset
    from cacheresearch.fit.ttl_advice import advise_trace, root_cost_errors

    t0 = time.perf_counter()
    S, c, w = _trace_only(cfg, TTL_TRACE_DEFAULTS)
    opts = c["options"]
    if not isinstance(opts, (list, tuple)) or not opts:
        raise S.StudyError("study.options must be a non-empty list of pricing presets or 'none'")
    ov = c["pricing_overrides"] or {}
    if not isinstance(ov, dict):
        raise S.StudyError("study.pricing_overrides must map option names to fields, e.g. {anthropic_5m: {ttl_s: 600}}")
    bad = sorted(set(ov) - {str(o) for o in opts})
    if bad:
        raise S.StudyError(f"study.pricing_overrides: {bad} are not among study.options {list(opts)}")
    base = c["base_per_mtok"]
    if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0):
        raise S.StudyError(f"study.base_per_mtok must be a positive number or null, got {base!r}")
    pricings: dict[str, Pricing] = {}
    for name in (str(o) for o in opts if str(o) != "none"):
        fields = dict(ov.get(name) or {})
        if base is not None:
            fields.setdefault("base_per_mtok", float(base))
        try:
            pricings[name] = preset(name, **fields)
        except (ValueError, TypeError) as e:
            where = f"study.pricing_overrides.{name}" if name in ov else "study.options"
            raise S.StudyError(f"{where}: {e}") from None
    D = c["duration_s"]
    if D is not None and (isinstance(D, bool) or not isinstance(D, (int, float))):
        raise S.StudyError(f"study.duration_s must be a number of seconds or null, got {D!r}")
    try:
        a = advise_trace(w, [str(o) for o in opts], pricings=pricings, duration_s=None if D is None else float(D),
                         reuse=str(c["reuse"]))
    except ValueError as e:
        raise S.StudyError(f"ttl_trace: {e}") from None
    names = list(a.options)
    G = a.requests.size
    plans = {o: np.full(G, j) for j, o in enumerate(names)}
    plans.update(advised=a.choice, oracle=a.oracle, advised_steady=a.choice_steady)
    tot = {k: np.asarray([a.plan_cost(k, ch) for ch in plans.values()]) for k in ("predicted", "simulated", "steady")}
    rows = np.arange(G)
    ds = xr.Dataset(
        {
            "cost_predicted_usd_per_day": (("root", "option"), a.predicted),
            "cost_predicted_poisson_usd_per_day": (("root", "option"), a.predicted_poisson),
            "cost_typical_usd_per_day": (("root", "option"), a.typical if a.typical is not None else a.predicted),
            "cost_simulated_usd_per_day": (("root", "option"), a.simulated),
            "cost_steady_usd_per_day": (("root", "option"), a.steady),
            "cost_uncached_usd_per_day": (("root",), a.uncached),
            "advised": (("root",), np.asarray(names, dtype=object)[a.choice].astype(str)),
            "oracle": (("root",), np.asarray(names, dtype=object)[a.oracle].astype(str)),
            "advised_steady": (("root",), np.asarray(names, dtype=object)[a.choice_steady].astype(str)),
            "saving_predicted_usd_per_day": (("root",), a.uncached - a.predicted[rows, a.choice]),
            "saving_simulated_usd_per_day": (("root",), a.uncached - a.simulated[rows, a.choice]),
            "requests": (("root",), a.requests),
            "requests_per_day": (("root",), a.requests * a.per_day),
            "input_tokens": (("root",), a.input_tokens),
            "trunk_blocks": (("root",), a.trunk_blocks),
            "first_request": (("root",), a.first_request),
            "total_predicted_usd_per_day": (("plan",), tot["predicted"]),
            "total_simulated_usd_per_day": (("plan",), tot["simulated"]),
            "total_steady_usd_per_day": (("plan",), tot["steady"]),
        },
        coords={"root": rows, "option": names, "plan": list(plans)},
    )
    S.doc(ds, TTL_TRACE_DOC)
    sh = a.shared
    uni = {o: (float(tot["predicted"][j]), float(tot["simulated"][j])) for j, o in enumerate(names)}
    bu_p = min(uni, key=lambda o: uni[o][0])
    bu_s = min(uni, key=lambda o: uni[o][1])
    ia = list(plans).index("advised")
    io = list(plans).index("oracle")
    adv_p, adv_s = float(tot["predicted"][ia]), float(tot["simulated"][ia])
    wts = a.requests[sh].astype(np.float64)
    ds.attrs.update(S.common_attrs(cfg, "ttl_trace", t0, dict(
        trace=str(w.name), trace_requests=int(w.n_requests), block_tokens=int(w.block_tokens),
        duration_s=a.duration_s, per_day=a.per_day, roots=int(G), shared_roots=int(sh.sum()),
        shared_root_requests=int(a.requests[sh].sum()), options=json.dumps(names),
        pricings=json.dumps({o: (None if p is None else {f: getattr(p, f) for f in (
            "base_per_mtok", "write_multiplier", "read_multiplier", "ttl_s", "min_cacheable_tokens",
            "increment_tokens")}) for o, p in zip(names, a.pricings)}),
        pricing_sources=json.dumps({o: p.source for o, p in zip(names, a.pricings) if p is not None}),
        best_uniform_predicted=bu_p, best_uniform_simulated=bu_s,
        saving_predicted_usd_per_day=uni[bu_p][0] - adv_p,
        saving_simulated_usd_per_day=uni[bu_p][1] - adv_s,
        advised_rel_error=(adv_p - adv_s) / adv_s if adv_s > 0 else float("nan"),
        regret_usd_per_day=adv_s - float(tot["simulated"][io]),
        choice_agreement_shared=float(np.mean(a.choice[sh] == a.oracle[sh])) if sh.any() else float("nan"),
        choice_agreement_shared_requests=(float(np.sum(wts * (a.choice[sh] == a.oracle[sh])) / wts.sum())
                                          if sh.any() else float("nan")),
        top_roots=int(c["top_roots"]), reuse=a.reuse, empty_requests=int(a.empty_requests),
        root_cost_error=json.dumps(root_cost_errors(a, "predicted")),
        root_cost_error_poisson=json.dumps(root_cost_errors(a, "predicted_poisson")),
        root_cost_error_typical=json.dumps(root_cost_errors(a, "typical" if a.typical is not None else "predicted")),
        reuse_laws_used=json.dumps({k: int(sum(1 for d in a.reuse_laws if d.get("used") == k and not d.get("pooled")))
                                    for k in ("parametric", "empirical")}
                                   | {"pooled": int(sum(1 for d in a.reuse_laws if d.get("pooled")))}),
        prior_weight=json.dumps((a.reuse_laws[0].get("prior_weight") or {}) if a.reuse_laws else {}))))
    return ds


def summarize_ttl_trace(ds) -> str:

    a = ds.attrs
    out = S.header(ds)
    opts = json.loads(a["options"])
    out.append(f"trace {a['trace']} ({a['trace_requests']:,} requests over {a['duration_s']:,.0f} s, scaled x"
               f"{a['per_day']:.1f} to a day); {a['roots']:,} roots, {a['shared_roots']:,} shared (2+ requests, "
               f"{a['shared_root_requests']:,} requests); options {', '.join(opts)}")
    if int(a.get("empty_requests", 0)):
        out.append(f"{int(a['empty_requests']):,} requests without blocks (input_length 0) left out of the roots: they "
                   "carry no tokens and hold nothing to cache (the window counts them)")

    def usd(x):
        return f"${float(x):,.2f}"

    rows = [["plan", "predicted $/day", "replayed $/day", "rel. error", "long-run predicted $/day"]]
    for p in ds.plan.values:
        x = ds.sel(plan=p)
        pr, si = float(x.total_predicted_usd_per_day), float(x.total_simulated_usd_per_day)
        rows.append([str(p), usd(pr), usd(si), S.pct((pr - si) / si, 2) if si > 0 else "n/a",
                     usd(x.total_steady_usd_per_day)])
    out += ["", "Daily cost by plan (uniform: every root on one option; advised: each root on its predicted cheapest; "
            "oracle: each root on its replayed cheapest; advised_steady: the long-run advice):", S.table(rows)]
    out.append(f"advice saves {usd(a['saving_predicted_usd_per_day'])}/day predicted, "
               f"{usd(a['saving_simulated_usd_per_day'])}/day replayed, over the best uniform option "
               f"({a['best_uniform_predicted']}; replay's best uniform: {a['best_uniform_simulated']}); predicted vs "
               f"replayed cost of the advice {S.pct(a['advised_rel_error'], 2)}; regret vs the oracle "
               f"{usd(a['regret_usd_per_day'])}/day; advice = oracle on {S.pct(a['choice_agreement_shared'])} of the "
               f"shared roots ({S.pct(a['choice_agreement_shared_requests'])} of their requests)")
    if "root_cost_error" in a:
        fe, pe = json.loads(a["root_cost_error"]), json.loads(a["root_cost_error_poisson"])
        out.append(f"per shared root, |predicted - replayed| / replayed, median (p90), {a.get('reuse', 'fitted')} "
                   "reuse laws vs Poisson keys: " + "; ".join(
                       f"{o} {S.pct(fe[o]['median'])} ({S.pct(fe[o]['p90'])}) vs {S.pct(pe[o]['median'])} "
                       f"({S.pct(pe[o]['p90'])})" for o in fe)
                   + f"; reuse laws per root: {a.get('reuse_laws_used', '{}')}"
                   + ("" if "root_cost_error_typical" not in a else "; the typical (median) cost per root, the point "
                      "prediction of one root's cost (totals and advice use the expected): " + "; ".join(
                          f"{o} {S.pct(v['median'])} ({S.pct(v['p90'])})"
                          for o, v in json.loads(a["root_cost_error_typical"]).items()))
                   + (f"; prior weight per TTL (reusing requests, cross-validated): {a['prior_weight']}"
                      if a.get("prior_weight", "{}") != "{}" else ""))
    counts = {k: {o: int(np.sum(ds[k].values[ds.requests.values >= 2] == o)) for o in opts}
              for k in ("advised", "oracle", "advised_steady")}
    out.append("choices on shared roots: " + "; ".join(f"{k} " + ", ".join(f"{o} x{n}" for o, n in v.items())
                                                      for k, v in counts.items()))
    n = min(int(a.get("top_roots", 12)), int((ds.requests >= 2).sum()))
    rows = [["root", "requests/day", "trunk blocks"] + [f"{o} pred | replay" for o in opts]
            + ["advised", "oracle", "saved $/day pred | replay"]]
    for g in range(n):
        x = ds.isel(root=g)
        rows.append([f"#{g} (request {int(x.first_request)})", f"{float(x.requests_per_day):,.0f}",
                     str(int(x.trunk_blocks))]
                    + [f"{usd(x.cost_predicted_usd_per_day.sel(option=o))} | "
                       f"{usd(x.cost_simulated_usd_per_day.sel(option=o))}" for o in opts]
                    + [str(x.advised.values), str(x.oracle.values),
                       f"{usd(x.saving_predicted_usd_per_day)} | {usd(x.saving_simulated_usd_per_day)}"])
    out += ["", f"The {n} busiest shared roots (daily cost per option):", S.table(rows)]
    return "\n".join(out)


def plot_ttl_trace(ds):

    fig = S.fig(11, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    sh = ds.requests.values >= 2
    opts = [str(o) for o in ds.option.values]
    for j, o in enumerate(opts):
        x = ds.cost_simulated_usd_per_day.sel(option=o).values[sh]
        y = ds.cost_predicted_usd_per_day.sel(option=o).values[sh]
        ax1.loglog(x, y, ".", ms=4, color=f"C{j}", label=o, alpha=0.7)
    lo = max(float(np.min(ds.cost_simulated_usd_per_day.values[sh])) if sh.any() else 1e-3, 1e-6)
    hi = float(np.max(ds.cost_simulated_usd_per_day.values[sh])) if sh.any() else 1.0
    ax1.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax1.set_xlabel("replayed cost per shared root (USD/day)")
    ax1.set_ylabel("predicted cost (USD/day)")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize="small")
    plans = [str(p) for p in ds.plan.values]
    xs = np.arange(len(plans))
    ax2.bar(xs - 0.2, ds.total_predicted_usd_per_day.values, 0.4, label="predicted")
    ax2.bar(xs + 0.2, ds.total_simulated_usd_per_day.values, 0.4, label="replayed")
    ax2.set_xticks(xs, plans, rotation=20, fontsize="small")
    ax2.set_ylabel("total daily cost (USD/day)")
    ax2.set_title(f"TTL advice on {ds.attrs['trace']}")
    ax2.grid(True, axis="y", alpha=0.3)
    ax2.legend(fontsize="small")
    return fig


STUDIES = [
    Study("fit", fit_study, summarize_fit, plot_fit, S.defaults_class("FitDefaults", FIT_DEFAULTS)),
    Study("mooncake_fig9", mooncake_fig9_study, summarize_fig9, plot_fig9),
    Study("mooncake_fig10", mooncake_fig10_study, summarize_fig10, plot_fig10),
    Study("mooncake_table1", mooncake_table1_study, summarize_table1, plot_table1),
    Study("ttl_trace", ttl_trace_study, summarize_ttl_trace, plot_ttl_trace),
]

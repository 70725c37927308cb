"""``experiment=autoscale``: a day of the design scenario under a daily sine, with the scaler in the loop.

The design scenario (:func:`~cacheresearch.workload.synthetic.design_workload`: 200 tenants x 10,000-token
prefixes, 200 fresh tokens and 200 output tokens a request, one hot tenant taking half, 50,000 requests over a
day) time-warped onto a daily sine (:mod:`cacheresearch.workload.rate`), served by an autoscaled fcfs fleet
with per-replica leaf-first LRU caches (:mod:`cacheresearch.fleet.autoscale`): scaler policy x provisioning
delay x prewarm x router, beside static fleets. Per cell: hit rate, TTFT percentiles, SLO attainment,
GPU-hours and dollars, the tokens recomputed although an active replica held them (and their dollars),
and hourly replicas, hit rate and TTFT p90.
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr

from cacheresearch.core.stream import compile_stream
from cacheresearch.fleet.autoscale import (
    AUTOSCALE_ROUTERS,
    SCALER_POLICIES,
    ScalerConfig,
    day_metrics,
    simulate_autoscale,
)
from cacheresearch.studies import base as B
from cacheresearch.studies.base import Study, StudyError
from cacheresearch.workload.rate import shape_from, warp_arrivals
from cacheresearch.workload.synthetic import design_workload

__all__ = ["AUTOSCALE_DEFAULTS", "autoscale_study", "summarize_autoscale", "plot_autoscale", "STUDIES"]

AUTOSCALE_DEFAULTS = dict(
    workload=dict(n_tenants=200, prefix_tokens=10_000, suffix_tokens=200, n_requests=50_000, duration_s=86_400.0,
                  hot_share=0.5, output_tokens=200, block_tokens=16),
    rate=dict(kind="sine", amplitude=0.8, period_s=86_400.0, peak_s=50_400.0, bin_s=60.0),
    policies=["queue", "utilisation", "slo", "schedule"],
    targets=dict(queue=1, utilisation=60, kv=50, slo=1, schedule=1),
    delays_s=[0, 60, 300, 900],
    prewarm_pct=[0, 50],
    routers=["ring", "cache_aware"],
    static_replicas=[1, 2, 4, 8],
    scaler=dict(min_replicas=1, max_replicas=8, interval_s=60, cooldown_s=300, slo_ms=2_000, capacity=19_208,
                prefill_tps=10_000, decode_us_per_token=500, prefix_blocks=625, chwbl_c_pct=125, balance_abs=64,
                schedule=[1] * 9 + [2] * 9 + [1] * 6, schedule_period_s=3_600),
    usd_per_gpu_hour=2.5,
    bin_s=3_600.0,
    attainment_pct=99.0,  # the summary's objective: the cheapest cell with this share of requests within the SLO
)

_TOTALS = ("token_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "slo_attainment", "gpu_hours", "usd",
           "recompute_tokens", "cold_usd", "replicas_mean")


def _workload(c, seed):
    try:
        wl = design_workload(**c["workload"], seed=seed)
        span = (int(wl.arrival_ms[-1]) - int(wl.arrival_ms[0])) / 1000.0
        return warp_arrivals(wl, shape_from(c["rate"], span))
    except (TypeError, ValueError) as e:
        raise StudyError(f"study.{'rate' if 'rate.' in str(e) else 'workload'}: {e}") from None


def _configs(c):
    sc = dict(c["scaler"])
    base = dict(min_replicas=sc["min_replicas"], max_replicas=sc["max_replicas"],
                interval_ms=int(sc["interval_s"] * 1000),
                cooldown_ms=int(sc["cooldown_s"] * 1000), slo_ms=sc["slo_ms"], capacity=sc["capacity"],
                prefill_tps=sc["prefill_tps"], decode_us_per_token=sc["decode_us_per_token"],
                prefix_blocks=sc["prefix_blocks"], chwbl_c_pct=sc["chwbl_c_pct"], balance_abs=sc["balance_abs"],
                schedule=tuple(sc["schedule"]), schedule_period_ms=int(sc["schedule_period_s"] * 1000))
    for k, v in (("policies", SCALER_POLICIES), ("routers", AUTOSCALE_ROUTERS)):
        bad = [x for x in c[k] if x not in v]
        if bad or not c[k]:
            raise StudyError(f"study.{k}: {bad or 'empty'} not in {list(v)}")
    try:
        cells = [ScalerConfig(policy=p, router=r, delay_ms=int(d * 1000), prewarm_pct=int(w),
                              initial_replicas=base["min_replicas"], target=int(c["targets"][p]), **base)
                 for p in c["policies"] for d in c["delays_s"] for w in c["prewarm_pct"] for r in c["routers"]]
        static = [ScalerConfig(**{**base, "policy": "schedule", "router": r, "min_replicas": k, "max_replicas": k,
                                  "initial_replicas": k, "schedule": (k,)})
                  for k in c["static_replicas"] for r in c["routers"]]
    except ValueError as e:
        raise StudyError(f"study.scaler: {e}") from None
    return cells, static


def autoscale_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = B.study_cfg(cfg, AUTOSCALE_DEFAULTS)
    delays = [float(x) for x in c["delays_s"]]
    if not delays or any(x < 0 for x in delays):
        raise StudyError(f"study.delays_s: a non-empty list of delays >= 0 s, got {c['delays_s']}")
    pws = [int(x) for x in c["prewarm_pct"]]
    statics = B.positive_list("study.static_replicas", c["static_replicas"], integer=True)
    cells, static = _configs(c)
    seed = B.seeds(cfg)[0]
    B.progress(f"autoscale: building the day ({c['workload']['n_requests']} requests)")
    wl = _workload(c, seed)
    stream = compile_stream(wl)
    tb = time.perf_counter()
    B.progress(f"autoscale: {len(cells) + len(static)} configurations in one call")
    res = simulate_autoscale(wl, cells + static, stream=stream)
    ts = time.perf_counter() - tb
    m = day_metrics(wl, res, bin_s=float(c["bin_s"]), usd_per_gpu_hour=float(c["usd_per_gpu_hour"]))
    P, D, W, R = len(c["policies"]), len(delays), len(pws), len(c["routers"])
    nb = m["series"]["replicas"].shape[1]
    dims, sdims = ("policy", "delay_s", "prewarm_pct", "router"), ("static_replicas", "router")
    data = {}
    for k in _TOTALS:
        data[k] = (dims, m["totals"][k][: len(cells)].reshape(P, D, W, R))
        data[f"static_{k}"] = (sdims, m["totals"][k][len(cells):].reshape(len(statics), R))
    for k in ("replicas", "hit_rate", "ttft_p90_ms"):
        data[f"{k}_by_hour"] = (dims + ("hour",), m["series"][k][: len(cells)].reshape(P, D, W, R, nb))
        data[f"static_{k}_by_hour"] = (sdims + ("hour",), m["series"][k][len(cells):].reshape(len(statics), R, nb))
    from cacheresearch.workload.rate import rate_per_bin  # noqa: PLC0415

    _, rate = rate_per_bin(wl.arrival_ms - wl.arrival_ms[0], float(c["bin_s"]))
    data["arrival_rate_per_s"] = (("hour",), np.pad(rate, (0, max(nb - rate.size, 0)))[:nb])
    ds = xr.Dataset(data, coords=dict(policy=list(c["policies"]), delay_s=delays, prewarm_pct=pws,
                                      router=list(c["routers"]), static_replicas=statics,
                                      hour=np.arange(nb) * float(c["bin_s"]) / 3600.0))
    ds.attrs.update(B.common_attrs(cfg, "autoscale", t0, dict(
        simulate_time_s=ts, build_time_s=tb - t0, n_requests=wl.n_requests, configurations=len(cells) + len(static),
        usd_per_gpu_hour=float(c["usd_per_gpu_hour"]), slo_ms=int(c["scaler"]["slo_ms"]),
        attainment_pct=float(c["attainment_pct"]))))
    return ds


def _row(ds, sel, label):
    v = {k: float(ds[k].sel(sel)) for k in _TOTALS}
    return [label, B.pct(v["token_hit_rate"]), f"{v['ttft_p50_ms'] / 1000:.2f}", f"{v['ttft_p90_ms'] / 1000:.2f}",
            f"{v['ttft_p99_ms'] / 1000:.2f}", B.pct(v["slo_attainment"]), f"{v['replicas_mean']:.2f}",
            f"{v['gpu_hours']:.1f}", f"${v['usd']:.0f}", f"{v['recompute_tokens'] / 1e6:.1f}M", f"${v['cold_usd']:.2f}"]


def _cells(ds) -> list[tuple[str, dict]]:
    """(label, totals) of every cell: the static fleets, then the autoscaled ones."""
    out = []
    for r in ds.router.values:
        for k in ds.static_replicas.values:
            out.append((f"static fleet of {k}, router {r}",
                        {x: float(ds[f"static_{x}"].sel(static_replicas=k, router=r)) for x in _TOTALS}))
        for p in ds.policy.values:
            for d in ds.delay_s.values:
                for w in ds.prewarm_pct.values:
                    sel = dict(policy=p, delay_s=d, prewarm_pct=w, router=r)
                    out.append((f"scaler {p}, delay {d:g} s, prewarm {w}%, router {r}",
                                {x: float(ds[x].sel(sel)) for x in _TOTALS}))
    return out


def _answers(ds) -> list[str]:
    """The summary's opening: the cheapest cell that meets the objective (ties named), the static fleet it
    replaces, and what cold caches and the provisioning delay cost."""
    slo, target = ds.attrs.get("slo_ms", 0), float(ds.attrs.get("attainment_pct", 99.0))
    cells = _cells(ds)
    out = [f"Answers (objective: the lowest cost with at least {target:g}% of requests at TTFT <= {slo} ms; change "
           f"it with study.attainment_pct=P and study.scaler.slo_ms=MS):"]
    ok = [(v["usd"], lab, v) for lab, v in cells if 100 * v["slo_attainment"] >= target]
    if not ok:
        lab, v = max(cells, key=lambda x: x[1]["slo_attainment"])
        out.append(f"* No cell meets it: the highest attainment is {B.pct(v['slo_attainment'])} ({lab}, "
                   f"${v['usd']:.0f} a day). Raise study.scaler.max_replicas or relax the objective.")
    else:
        ok.sort(key=lambda x: x[0])
        usd, lab, v = ok[0]
        ties = [x[1] for x in ok[1:] if abs(x[0] - usd) < 0.5]
        tie = f"; tied within $0.50: {len(ties)} more ({ties[0]}{', ...' if len(ties) > 1 else ''})" if ties else ""
        out.append(f"* Use {lab}: ${usd:.0f} a day ({v['gpu_hours']:.1f} GPU-hours, {v['replicas_mean']:.2f} replicas "
                   f"on average), {B.pct(v['slo_attainment'])} within the SLO, token hit rate "
                   f"{B.pct(v['token_hit_rate'])}{tie}.")
        stat = [x for x in ok if x[1].startswith("static")]
        if stat and not lab.startswith("static"):
            out.append(f"* The cheapest static fleet that meets it, {stat[0][1]}, costs ${stat[0][0]:.0f} a day: "
                       f"autoscaling saves ${stat[0][0] - usd:.0f} ({100 * (1 - usd / stat[0][0]):.0f}%).")
        elif not stat:
            out.append("* No static fleet in the grid meets it.")
        if lab.startswith("static"):
            al, av = max(((la, va) for la, va in cells if not la.startswith("static")),
                         key=lambda x: (x[1]["slo_attainment"], -x[1]["usd"]))
            if 100 * av["slo_attainment"] < target:
                out.append(f"* No autoscaled cell meets it: the best, {al}, keeps {B.pct(av['slo_attainment'])} "
                           f"within the SLO at ${av['usd']:.0f} a day (its scaler's target, study.targets, sets how "
                           "many replicas it keeps at the peak).")
    auto = [(lab, v) for lab, v in cells if not lab.startswith("static")]
    lab, v = max(auto, key=lambda x: x[1]["cold_usd"])
    if v["cold_usd"] > 0:
        out.append(f"* Cold caches cost at most ${v['cold_usd']:.2f} a day ({v['recompute_tokens'] / 1e6:.1f}M prompt "
                   f"tokens recomputed after scale-ups: {lab}); prewarming and fewer scale-ups cut it.")
    else:
        out.append("* Cold caches cost nothing here: no scaled-up replica recomputed a prefix another replica held.")
    d0, d1 = ds.delay_s.values[0], ds.delay_s.values[-1]
    if d1 != d0:
        att = ds["slo_attainment"].max(dim=("policy", "prewarm_pct", "router"))
        out.append(f"* Provisioning delay: the best autoscaled attainment goes from {B.pct(float(att.sel(delay_s=d0)))}"
                   f" at {d0:g} s to {B.pct(float(att.sel(delay_s=d1)))} at {d1:g} s.")
    return out + [""]


def summarize_autoscale(ds) -> str:
    head = ["cell", "hit", "p50 s", "p90 s", "p99 s", "SLO", "replicas", "GPU-h", "cost", "recomputed", "cold $"]
    slo = ds.attrs.get("slo_ms", 0)
    out = B.header(ds) + [""] + _answers(ds) + [
        f"{ds.attrs.get('n_requests')} requests over the day; SLO = TTFT <= {slo} ms; "
        f"${ds.attrs.get('usd_per_gpu_hour')}/GPU-hour", ""]
    for r in ds.router.values:
        rows = [head]
        for k in ds.static_replicas.values:
            sub = ds[[f"static_{x}" for x in _TOTALS]].rename({f"static_{x}": x for x in _TOTALS})
            rows.append(_row(sub, dict(static_replicas=k, router=r), f"static {k}"))
        for p in ds.policy.values:
            for d in ds.delay_s.values:
                for w in ds.prewarm_pct.values:
                    rows.append(_row(ds, dict(policy=p, delay_s=d, prewarm_pct=w, router=r),
                                     f"{p} delay {d:g}s prewarm {w}%"))
        out += [f"router {r}:", B.table(rows), ""]
    return "\n".join(out)


def plot_autoscale(ds):
    f = B.fig(12, 7)
    axs = f.subplots(2, 2, sharex=True)
    h = ds.hour.values
    d1 = ds.delay_s.values[min(1, ds.delay_s.size - 1)]
    for j, r in enumerate(ds.router.values[:2]):
        a0, a1 = axs[0, j], axs[1, j]
        for p in ds.policy.values:
            sel = dict(policy=p, delay_s=d1, prewarm_pct=ds.prewarm_pct.values[0], router=r)
            a0.step(h, ds.replicas_by_hour.sel(sel), where="post", label=p)
            a1.plot(h, ds.hit_rate_by_hour.sel(sel), label=p)
        k = ds.static_replicas.values[-1]
        a1.plot(h, ds.static_hit_rate_by_hour.sel(static_replicas=k, router=r), "k--", label=f"static {k}")
        rate = ds.arrival_rate_per_s.values
        a0.plot(h, rate / max(rate.max(), 1e-9) * float(ds.replicas_by_hour.max()), ":", color="grey",
                label="arrival rate (scaled)")
        a0.set_title(f"router {r}: replicas (delay {d1:g} s, prewarm {ds.prewarm_pct.values[0]}%)")
        a1.set_title(f"router {r}: token hit rate by hour")
        a1.set_xlabel("hour of day")
        a0.legend(fontsize=7)
        a1.legend(fontsize=7)
    return f


STUDIES = [Study("autoscale", autoscale_study, summarize_autoscale, plot_autoscale,
                 B.defaults_class("AutoscaleDefaults", AUTOSCALE_DEFAULTS))]

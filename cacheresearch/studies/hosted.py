"""``experiment=hosted``: what cached share will a hosted API's usage report, and what does it cost?

The hosted-cache model (:mod:`cacheresearch.analysis.hosted`: routing by a hash of the first 256 tokens and
an optional ``prompt_cache_key``, overflow past about 15 requests per minute per route key, per-machine TTL
caches, usage's 1,024 + 128k reporting) on a workload of ``n_prefixes`` prefixes, each requested at
``rates_per_min`` (Poisson; :func:`~cacheresearch.workload.synthetic.prefix_poisson_workload`), for each
machine count and each number of ``prompt_cache_key`` values per prefix (0 = none sent; ``k`` = each
request carries one of ``k`` keys, e.g. its user). Per cell: the cached share of the Monte Carlo replay,
of the closed-form estimate and of the TTL-only estimate, the overflow share, and dollars per day under
each pricing preset (from the replay's reported cached tokens).
"""

from __future__ import annotations

import json
import time

import numpy as np
import xarray as xr

from cacheresearch.analysis.hosted import HostedConfig, estimate, replay, ttl_only, usage_cost_usd
from cacheresearch.analysis.pricing import preset
from cacheresearch.studies import base as SB
from cacheresearch.studies.base import Study, StudyError
from cacheresearch.workload.synthetic import prefix_poisson_workload

__all__ = ["HOSTED_DEFAULTS", "hosted_study", "summarize_hosted", "plot_hosted", "STUDIES"]

DAY = 86_400.0
HOSTED_DEFAULTS = dict(
    workload=dict(n_prefixes=4, prefix_tokens=4096, suffix_tokens=256, duration_s=3600.0, block_tokens=128),
    rates_per_min=[1, 3, 8, 12, 15, 20, 30, 60, 90],
    machines=[16, 256],
    cache_keys=[0, 8],
    hosted=dict(route_tokens=256, overflow_per_min=15.0, window_s=60.0, ttl_s=300.0, min_tokens=1024,
                increment_tokens=128),
    pricing=["openai_auto", "anthropic_5m"],
)


def hosted_study(cfg) -> xr.Dataset:
    s = SB
    t0 = time.perf_counter()
    c = s.study_cfg(cfg, HOSTED_DEFAULTS)
    wl, hc = dict(c["workload"]), dict(c["hosted"])
    rates = [float(r) for r in c["rates_per_min"]]
    machines = [int(m) for m in c["machines"]]
    keys = [int(k) for k in c["cache_keys"]]
    seeds = s.seeds(cfg)
    try:
        prices = [preset(str(p)) for p in c["pricing"]]
        cfgs = {m: HostedConfig(machines=m, **hc) for m in machines}
    except (ValueError, TypeError) as e:
        raise StudyError(f"study: {e}") from None
    if not rates or any(r <= 0 for r in rates) or any(k < 0 for k in keys):
        raise StudyError("study.rates_per_min must be > 0 and study.cache_keys >= 0")
    shape = (len(rates), len(machines), len(keys), len(seeds))
    names = ("cached_share_replay", "cached_share_estimate", "cached_share_ttl", "overflow_share_replay",
             "overflow_share_estimate")
    out = {v: np.zeros(shape) for v in names}
    usd = np.zeros(shape + (len(prices),))
    usd_none = np.zeros((len(rates), len(seeds), len(prices)))
    t_sim = 0.0
    for ir, rpm in enumerate(rates):
        for isd, sd in enumerate(seeds):
            try:
                w = prefix_poisson_workload(n_prefixes=int(wl["n_prefixes"]), prefix_tokens=int(wl["prefix_tokens"]),
                                            suffix_tokens=int(wl["suffix_tokens"]), rate_per_hour=rpm * 60.0,
                                            duration_s=float(wl["duration_s"]), block_tokens=int(wl["block_tokens"]),
                                            seed=sd)
            except ValueError as e:
                raise StudyError(f"study.workload: {e}") from None
            scale = DAY / float(wl["duration_s"])
            for ip, p in enumerate(prices):
                usd_none[ir, isd, ip] = p.base_per_mtok / 1e6 * float(w.input_tokens.sum()) * scale
            rng = np.random.default_rng(sd + 7919)
            for ik, k in enumerate(keys):
                ck = None if k == 0 else rng.integers(0, k, w.n_requests)
                for im, m in enumerate(machines):
                    ts = time.perf_counter()
                    r = replay(w, cfgs[m], cache_key=ck, seed=sd)
                    t_sim += time.perf_counter() - ts
                    e = estimate(w, cfgs[m], cache_key=ck, duration_s=float(wl["duration_s"]))
                    ix = (ir, im, ik, isd)
                    out["cached_share_replay"][ix] = r.cached_share
                    out["cached_share_estimate"][ix] = e["cached_share"]
                    out["cached_share_ttl"][ix] = ttl_only(w, cfgs[m], duration_s=float(wl["duration_s"]))
                    out["overflow_share_replay"][ix] = r.overflow_share
                    out["overflow_share_estimate"][ix] = e["overflow_share"]
                    for ip, p in enumerate(prices):
                        usd[ix + (ip,)] = usage_cost_usd(r.input_tokens, r.cached_tokens, p) * scale
    dims = ("rate_per_min", "machines", "cache_keys", "seed")
    ds = xr.Dataset({v: (dims, a) for v, a in out.items()},
                    coords={"rate_per_min": rates, "machines": machines, "cache_keys": keys, "seed": seeds,
                            "pricing": [p.name for p in prices]})
    ds["usd_per_day"] = (dims + ("pricing",), usd)
    ds["usd_per_day_uncached"] = (("rate_per_min", "seed", "pricing"), usd_none)
    s.doc(ds, {
        "cached_share_replay": ("share of input tokens usage reports as cached (Monte Carlo replay)", "1"),
        "cached_share_estimate": ("cached share, closed form (Erlang loss overflow, TTL hit per machine)", "1"),
        "cached_share_ttl": ("cached share, TTL-only estimate (one cache per prefix, no overflow)", "1"),
        "overflow_share_replay": ("share of requests sent past their home machine (replay)", "1"),
        "overflow_share_estimate": ("share of requests overflowing (Erlang B)", "1"),
        "usd_per_day": ("input cost per day from the replay's reported cached tokens", "USD/day"),
        "usd_per_day_uncached": ("input cost per day with no caching", "USD/day"),
    })
    ds["cache_keys"].attrs["long_name"] = "prompt_cache_key values per prefix (0: none sent)"
    ds["rate_per_min"].attrs["long_name"] = "requests per minute per prefix"
    ds.attrs.update(s.common_attrs(cfg, "hosted", t0, dict(
        workload=json.dumps(wl), hosted=json.dumps(hc), hosted_source=next(iter(cfgs.values())).source,
        pricing_sources=json.dumps({p.name: p.source for p in prices}), simulate_time_s=t_sim)))
    return ds


def summarize_hosted(ds) -> str:
    s = SB
    out = s.header(ds)
    wl, hc = json.loads(ds.attrs["workload"]), json.loads(ds.attrs["hosted"])
    out.append(f"workload: {wl['n_prefixes']} prefixes x {wl['prefix_tokens']} tokens + {wl['suffix_tokens']} fresh, "
               f"{wl['duration_s']:.0f} s; overflow past {hc['overflow_per_min']:g}/min per route key, TTL "
               f"{hc['ttl_s']:g} s, cached from {hc['min_tokens']} tokens in {hc['increment_tokens']}-token steps")
    m = ds.mean("seed")
    p0 = str(ds.pricing.values[0])
    rows = [["rate/min", "machines", "cache keys", "replay", "estimate", "TTL only", "|diff|", "overflow",
             f"$/day {p0}"]]
    for r in ds.rate_per_min.values:
        for mc in ds.machines.values:
            for k in ds.cache_keys.values:
                x = m.sel(rate_per_min=r, machines=mc, cache_keys=k)
                rows.append([f"{float(r):g}", str(int(mc)), str(int(k)) if k else "none",
                             s.pct(float(x.cached_share_replay)), s.pct(float(x.cached_share_estimate)),
                             s.pct(float(x.cached_share_ttl)),
                             f"{100 * abs(float(x.cached_share_replay - x.cached_share_estimate)):.2f} pt",
                             s.pct(float(x.overflow_share_replay)), s.usd(float(x.usd_per_day.sel(pricing=p0)))])
    gap = float(np.abs(ds.cached_share_replay - ds.cached_share_estimate).max())
    gap_mean = float(np.abs(m.cached_share_replay - m.cached_share_estimate).max())
    out += ["", s.table(rows), "",
            f"largest |replay - estimate|: {100 * gap_mean:.2f} points on the mean over {ds.sizes['seed']} seeds, "
            f"{100 * gap:.2f} points in a single seed (the estimate uses each run's own request counts)"]
    return "\n".join(out)


def plot_hosted(ds):
    fig = SB.fig(11, 4.2)
    ax1, ax2 = fig.subplots(1, 2)
    m = ds.mean("seed")
    x = ds.rate_per_min.values
    j = 0
    for mc in ds.machines.values:
        for k in ds.cache_keys.values:
            sel = m.sel(machines=mc, cache_keys=k)
            lab = f"{int(mc)} machines, " + (f"{int(k)} keys" if k else "no key")
            ax1.plot(x, 100 * sel.cached_share_replay, "o-", color=f"C{j}", label=lab + " (replay)")
            ax1.plot(x, 100 * sel.cached_share_estimate, "--", color=f"C{j}")
            ax2.plot(x, 100 * sel.overflow_share_replay, "o-", color=f"C{j}", label=lab)
            j += 1
    ax1.plot(x, 100 * m.cached_share_ttl.isel(machines=0, cache_keys=0), "k:", label="TTL only")
    thr = json.loads(ds.attrs["hosted"])["overflow_per_min"]
    for ax, lab in ((ax1, "cached share reported (%)"), (ax2, "requests overflowed (%)")):
        ax.axvline(thr, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("requests per minute per prefix")
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    ax1.set_title("hosted cache: replay (dots) and closed form (dashed)")
    return fig


STUDIES = [Study("hosted", hosted_study, summarize_hosted, plot_hosted,
                 SB.defaults_class("HostedDefaults", HOSTED_DEFAULTS))]

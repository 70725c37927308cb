"""``experiment=layouts``: the seed's prompt-layout mistakes on real tokens, each beside its fix.

The design scenario's tenants as chat requests (:mod:`cacheresearch.workload.prompt.scenario`: a system
prompt, JSON-schema tools and documents per tenant, about 10,000 tokens, then a fresh question), rendered by
a chat template and tokenized by each real tokenizer (``cl100k_base``, ``tekken``), hashed into block keys
with the project's key spec, and replayed through the engine: a provider-like cache (``ttl_refresh``, the
pricing preset's TTL, one machine, no capacity limit) with the replica's latency model for TTFT. Per
(tokenizer, layout, seed): token hit rate, TTFT p50 / p99, and dollars per day at the design scenario's
request rate under the pricing preset (hits at the read price, misses at the write price: everything is
offered for caching, as automatic caching does). Two hit rates: the engine's (every full 16-token block
counts, as a self-hosted vLLM counts) and the provider's billed one (:func:`~cacheresearch.analysis.pricing.
cacheable_tokens`: nothing below the preset's minimum cacheable length, 1,024 tokens, else rounded to its
increments); the dollars use the billed one. A timestamp at the top leaves the engine the first block
(the template's preamble and the static part of the date) and the provider nothing: the seed's 0.0%.

The per-tenant request rate is the design scenario's (50,000 requests a day over 200 tenants = 250 per
tenant per day); the run covers ``n_tenants`` tenants over ``duration_s`` at that rate (fewer tenants than
200, so the run stays small: hit rates depend on the per-tenant rate, not on the tenant count).
"""

from __future__ import annotations

import json
import time

import numpy as np
import xarray as xr

from cacheresearch.analysis.pricing import cacheable_tokens, preset
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.studies import base as SB
from cacheresearch.studies.base import Cells, Study, StudyError
from cacheresearch.workload.prompt.scenario import FIXES, LAYOUTS, apply_layout, layout_template, requests_to_workload
from cacheresearch.workload.prompt.scenario import tenant_requests as _tenant_requests

__all__ = ["LAYOUTS_DEFAULTS", "layouts_study", "summarize_layouts", "plot_layouts", "STUDIES"]

LAYOUTS_DEFAULTS = dict(
    scenario=dict(n_tenants=16, prefix_tokens=10_000, suffix_tokens=200, tenant_requests_per_day=250.0,
                  duration_s=28_800.0, users_per_tenant=50, tools_per_tenant=6),
    requests_per_day=50_000.0,
    tokenizers=["cl100k_base", "tekken"],
    template="chatml",
    layouts=list(LAYOUTS),
    block_tokens=16,
    latency="h100_8b",
    pricing="anthropic_5m",
    output_tokens=100,
)


def layouts_study(cfg) -> xr.Dataset:
    s = SB
    t0 = time.perf_counter()
    c = s.study_cfg(cfg, LAYOUTS_DEFAULTS)
    sc = dict(c["scenario"])
    lays = list(c["layouts"])
    bad = [x for x in lays if x not in LAYOUTS]
    if bad or not lays:
        raise StudyError(f"study.layouts: unknown {bad}; choose from {list(LAYOUTS)}")
    toks = list(c["tokenizers"])
    seeds = s.seeds(cfg)
    try:
        pr = preset(str(c["pricing"]))
    except ValueError as e:
        raise StudyError(f"study.pricing: {e}") from None
    n_req = int(round(float(sc["n_tenants"]) * float(sc["tenant_requests_per_day"]) * float(sc["duration_s"])
                      / 86_400.0))
    if n_req < 1:
        raise StudyError("study.scenario: fewer than one request")
    bt = int(c["block_tokens"])
    streams, meta = [], []
    tb = time.perf_counter()
    for tok in toks:
        for sd in seeds:
            reqs, arr, ten, usr = _tenant_requests(
                n_tenants=int(sc["n_tenants"]), prefix_tokens=int(sc["prefix_tokens"]),
                suffix_tokens=int(sc["suffix_tokens"]), n_requests=n_req, duration_s=float(sc["duration_s"]),
                users_per_tenant=int(sc["users_per_tenant"]), tools_per_tenant=int(sc["tools_per_tenant"]), seed=sd)
            for lay in lays:
                rng = np.random.default_rng([sd, LAYOUTS.index(lay)])
                rq = [apply_layout(r, lay, i=i, arrival_ms=int(arr[i]), user=int(usr[i]), rng=rng)
                      for i, r in enumerate(reqs)]
                tpls = [layout_template(lay, i, n_req, str(c["template"])) for i in range(n_req)]
                try:
                    w = requests_to_workload(rq, arr, tokenizer=tok, templates=tpls, block_tokens=bt, tenant=ten,
                                             output_tokens=int(c["output_tokens"]), name=f"{tok}/{lay}")
                except (ValueError, RuntimeError) as e:
                    raise StudyError(f"study.tokenizers: {tok}: {e}") from None
                streams.append(compile_stream(w))
                meta.append(dict(n=w.n_requests, inp=float(w.input_tokens.sum()),
                                 mean_tokens=float(w.input_tokens.mean())))
    t_build = time.perf_counter() - tb
    params = make_params("ttl_refresh", ttl_s=pr.ttl_s, replicas=1, router="round_robin", latency=str(c["latency"]))
    ts = time.perf_counter()
    m = yield Cells(streams, np.arange(len(streams)), [params] * len(streams),
                    [seeds[(k // len(lays)) % len(seeds)] for k in range(len(streams))], max_replicas=1)
    t_sim = time.perf_counter() - ts
    shape = (len(toks), len(lays), len(seeds))
    names = ("token_hit_rate", "provider_hit_rate", "ttft_p50_s", "ttft_p99_s", "usd_per_day", "prompt_tokens")
    out = {v: np.zeros(shape) for v in names}
    rpd = float(c["requests_per_day"])
    for k, mt in enumerate(meta):
        it, rest = divmod(k, len(seeds) * len(lays))
        isd, il = divmod(rest, len(lays))
        hits = np.asarray(m.hit_tokens[k][: mt["n"]], np.int64)
        ix = (it, il, isd)
        out["token_hit_rate"][ix] = float(hits.sum()) / mt["inp"]
        hit = float(cacheable_tokens(hits, pr).sum())  # what the provider bills as read: its minimum, increments
        out["provider_hit_rate"][ix] = hit / mt["inp"]
        out["ttft_p50_s"][ix] = float(np.asarray(m.ttft_p50_ms[k])) / 1000.0
        out["ttft_p99_s"][ix] = float(np.asarray(m.ttft_p99_ms[k])) / 1000.0
        billed = hit * pr.read_multiplier + (mt["inp"] - hit) * pr.write_multiplier
        per_req = pr.base_per_mtok / 1e6 * billed / mt["n"]
        out["usd_per_day"][ix] = per_req * rpd
        out["prompt_tokens"][ix] = mt["mean_tokens"]
    ds = xr.Dataset({v: (("tokenizer", "layout", "seed"), a) for v, a in out.items()},
                    coords={"tokenizer": toks, "layout": lays, "seed": seeds})
    s.doc(ds, {
        "token_hit_rate": ("token hit rate of the engine (TTL cache, one machine, every full block counts)", "1"),
        "provider_hit_rate": ("the hit as the provider bills it: below its minimum cacheable length nothing, else "
                              "rounded to its increments", "1"),
        "ttft_p50_s": ("time to first token, median", "s"), "ttft_p99_s": ("time to first token, p99", "s"),
        "usd_per_day": (f"input cost per day at {rpd:g} requests/day under {pr.name} (hits read, misses written)",
                        "USD/day"),
        "prompt_tokens": ("mean rendered prompt length", "tokens"),
    })
    ds.attrs.update(s.common_attrs(cfg, "layouts", t0, dict(
        scenario=json.dumps(sc), n_requests=n_req, template=str(c["template"]), block_tokens=bt,
        requests_per_day=rpd, pricing=pr.name, pricing_source=pr.source, fixes=json.dumps(FIXES),
        simulate_time_s=t_sim, build_time_s=t_build)))
    return ds


def summarize_layouts(ds) -> str:
    s = SB
    out = s.header(ds)
    sc = json.loads(ds.attrs["scenario"])
    out.append(f"{sc['n_tenants']} tenants x ~{sc['prefix_tokens']} tokens (system, {sc['tools_per_tenant']} tools, "
               f"documents) + ~{sc['suffix_tokens']}-token question, {ds.attrs['n_requests']} requests over "
               f"{sc['duration_s'] / 3600:g} h ({sc['tenant_requests_per_day']:g}/tenant/day); template "
               f"{ds.attrs['template']}, {ds.attrs['block_tokens']}-token blocks; {ds.attrs['pricing']}, $ at "
               f"{ds.attrs['requests_per_day']:g} requests/day")
    m = ds.mean("seed")
    fixes = json.loads(ds.attrs["fixes"])
    lays = [str(x) for x in ds.layout.values]
    rows = [["tokenizer", "layout", "fix", "engine hit", "-> fixed", "billed hit", "-> fixed", "TTFT p50", "-> fixed",
             "$/day", "-> fixed"]]
    for t in ds.tokenizer.values:
        x = m.sel(tokenizer=t)
        for lay in lays:
            if lay in fixes or lay == "stable":
                f = fixes.get(lay, "stable")
                a = x.sel(layout=lay)
                b = x.sel(layout=f) if f in lays else None
                na = "n/a"
                rows.append([str(t), lay, f if lay != "stable" else "-", s.pct(float(a.token_hit_rate)),
                             s.pct(float(b.token_hit_rate)) if b is not None else na,
                             s.pct(float(a.provider_hit_rate)), s.pct(float(b.provider_hit_rate)) if b is not None
                             else na,
                             f"{float(a.ttft_p50_s):.3f} s", f"{float(b.ttft_p50_s):.3f} s" if b is not None else "n/a",
                             s.usd(float(a.usd_per_day)), s.usd(float(b.usd_per_day)) if b is not None else "n/a"])
    out += ["", s.table(rows)]
    return "\n".join(out)


def plot_layouts(ds):
    fig = SB.fig(11, 4.2)
    ax1, ax2 = fig.subplots(1, 2)
    m = ds.mean("seed")
    xs = np.arange(ds.sizes["layout"])
    wdt = 0.8 / ds.sizes["tokenizer"]
    for j, t in enumerate(ds.tokenizer.values):
        ax1.bar(xs + j * wdt, 100 * m.token_hit_rate.sel(tokenizer=t).values, wdt, color=f"C{j}", label=str(t))
        ax2.bar(xs + j * wdt, m.usd_per_day.sel(tokenizer=t).values, wdt, color=f"C{j}", label=str(t))
    for ax, lab in ((ax1, "token hit rate (%)"), (ax2, f"$ per day ({ds.attrs['pricing']})")):
        ax.set_xticks(xs + 0.4 - wdt / 2, [str(x) for x in ds.layout.values], rotation=40, ha="right",
                      fontsize="small")
        ax.set_ylabel(lab)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    ax1.set_title("layout mistakes and their fixes on real tokens")
    return fig


STUDIES = [Study("layouts", layouts_study, summarize_layouts, plot_layouts,
                 SB.defaults_class("LayoutsDefaults", LAYOUTS_DEFAULTS))]

"""Summaries and figures of sweep results (xarray Datasets written by :mod:`cacheresearch.shell.sweep`).

Shell-side helpers shared by the sweep command and the notebooks::

    ds = report.load("outputs/seed_fleet/.../results.nc")
    print(report.summarize(ds))                      # table (mean ± std over seeds) + published + comparisons
    report.save_figure(report.plot(ds), "fig.png")    # generic: lines over the first numeric axis, else bars
    report.save_figure(report.bar_chart(ds, hue="policy"), "bars.png")

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot, no global
backend change), so they render the same headless, in tests and in notebooks. ``std`` is the sample
standard deviation over the ``seed`` dimension (``ddof=1``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import matplotlib
import numpy as np
import xarray as xr
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cacheresearch.shell import answers as A

__all__ = [
    "load",
    "config_of",
    "seed_stats",
    "format_table",
    "published_comparison",
    "paired_comparison",
    "summarize",
    "plot",
    "line_chart",
    "bar_chart",
    "save_figure",
]

SEED = "seed"


# ------------------------------------------------------------------------------ data
def load(path) -> xr.Dataset:
    """Read a ``results.nc`` (or the run directory that holds one) fully into memory."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.nc"
    return xr.load_dataset(p, engine="h5netcdf")


def config_of(ds: xr.Dataset) -> dict:
    """The resolved configuration stored in the dataset (``attrs["config"]``, YAML) as a dict."""
    text = ds.attrs.get("config")
    return yaml.safe_load(text) if text else {}


def _base_of(ds: xr.Dataset) -> dict:
    try:
        return json.loads(ds.attrs.get("base", "{}"))
    except ValueError:
        return {}


def _is_rate(da: xr.DataArray) -> bool:
    return da.attrs.get("units") == "1"


def _other_dims(da: xr.DataArray) -> list[str]:
    return [d for d in da.dims if d != SEED]


def seed_stats(da: xr.DataArray):
    """``(mean, std, n)`` over the seed dimension (std is None without several seeds)."""
    if SEED in da.dims and da.sizes[SEED] > 1:
        return da.mean(SEED), da.std(SEED, ddof=1), int(da.sizes[SEED])
    if SEED in da.dims:
        return da.isel({SEED: 0}, drop=True), None, 1
    return da, None, 1


def _fmt(mean, std=None, rate=True, digits=1) -> str:
    if rate:
        s = f"{100 * float(mean):.{digits}f}"
        return f"{s} ± {100 * float(std):.{digits}f}%" if std is not None else f"{s}%"
    s = f"{float(mean):.6g}"
    return f"{s} ± {float(std):.3g}" if std is not None else s


def _label(d: str, v) -> str:
    return f"{d}={v}"


# ------------------------------------------------------------------------------ text
def _render(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i < len(r) - 1 else c.ljust(w).rstrip() for i, (c, w) in
                               enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(ds: xr.Dataset, var: str = "token_hit_rate") -> str:
    """A text table of ``var``: rows are the combinations of all dims but the last, columns the last."""
    da = ds[var]
    mean, std, n = seed_stats(da)
    rate = _is_rate(da)
    dims = _other_dims(da)
    cell = lambda sel: _fmt(mean.sel(sel), None if std is None else std.sel(sel), rate)  # noqa: E731
    if not dims:
        return f"{var}: {cell({})}"
    col, rows_d = dims[-1], dims[:-1]
    header = rows_d + [str(v) for v in da[col].values] if rows_d else [col] + [var]
    rows = [header]
    if rows_d:
        for combo in itertools.product(*(da[d].values for d in rows_d)):
            sel = dict(zip(rows_d, combo))
            rows.append([str(v) for v in combo] + [cell({**sel, col: c}) for c in da[col].values])
    else:
        for c in da[col].values:
            rows.append([str(c), cell({col: c})])
    title = f"{var} ({da.attrs.get('long_name', var)})"
    if rows_d:
        title += f"; columns: {col}"
    if n > 1:
        title += f"; mean ± std over {n} seeds"
    return title + "\n" + _render(rows)


def _select(ds: xr.Dataset, select: dict):
    """``ds`` at ``select``; keys that are not dims must equal the run's base value. None if absent."""
    base = _base_of(ds)
    sel = {}
    for k, v in (select or {}).items():
        if k in ds.dims:
            if v not in list(ds[k].values):
                return None
            sel[k] = v
        elif base.get(k) != v:
            return None
    return ds.sel(sel)


def published_comparison(ds: xr.Dataset, published: list[dict], var: str = "token_hit_rate", source: str = "") -> str:
    """Published numbers next to ours; each entry ``{label, select: {dim: value}, <var>: number}``."""
    lines = [f"Published vs ours, {var}" + (f" (source: {source})" if source else "") + ":"]
    rows = [["", "published", "ours", "cell"]]
    for item in published or []:
        if var not in item:
            continue
        label = item.get("label", "")
        where = ", ".join(_label(k, v) for k, v in (item.get("select") or {}).items())
        sub = _select(ds, item.get("select") or {})
        if sub is None:
            rows.append([label, _fmt(item[var], rate=_is_rate(ds[var])), "(not in this grid)", where])
            continue
        da = sub[var]
        mean, std, n = seed_stats(da)
        rest = _other_dims(mean if std is None else da)
        rest = [d for d in rest if d in mean.dims]
        if not rest:
            ours = _fmt(mean, std, _is_rate(da))
            if n > 1:
                lo, hi = float(da.min()), float(da.max())
                ours += f" ({n} seeds, range {_fmt(lo, rate=_is_rate(da))}-{_fmt(hi, rate=_is_rate(da))})"
            rows.append([label, _fmt(item[var], rate=_is_rate(da)), ours, where])
        else:  # unselected dims: one row per remaining combination
            for combo in itertools.product(*(mean[d].values for d in rest)):
                s = dict(zip(rest, combo))
                ours = _fmt(mean.sel(s), None if std is None else std.sel(s), _is_rate(da))
                extra = ", ".join(_label(k, v) for k, v in s.items())
                rows.append([label, _fmt(item[var], rate=_is_rate(da)), ours, f"{where}, {extra}"])
    return "\n".join(lines + ["  " + line for line in _render(rows).splitlines()])


def paired_comparison(ds: xr.Dataset, dim: str, baseline, variant, var: str = "token_hit_rate", label: str = "") -> str:
    """``variant - baseline`` along ``dim`` for every combination of the other dims, paired per seed.

    Both sides of a pair see the same workload and the same router PRNG key, so the per-seed
    difference isolates the effect of ``dim``.
    """
    if dim not in ds.dims or baseline not in ds[dim].values or variant not in ds[dim].values:
        return f"{label or f'{variant} vs {baseline}'}: (not in this grid)"
    da = ds[var]
    a, b = da.sel({dim: baseline}), da.sel({dim: variant})
    diff = b - a
    rate = _is_rate(da)
    unit = " pts" if rate else ""
    scale = 100.0 if rate else 1.0
    n = da.sizes.get(SEED, 1)
    head = f"{label or f'{variant} vs {baseline}'}: {var}, {dim}={variant} minus {dim}={baseline}"
    head += f", paired over {n} seeds (mean ± std)" if n > 1 else ""
    rows = [["cell", str(baseline), str(variant), "change", ""]]
    rest = [d for d in diff.dims if d != SEED]
    for combo in itertools.product(*(diff[d].values for d in rest)) if rest else [()]:
        s = dict(zip(rest, combo))
        ma, sa, _ = seed_stats(a.sel(s))
        mb, sb, _ = seed_stats(b.sel(s))
        md, sd, _ = seed_stats(diff.sel(s))
        dvals = np.asarray(diff.sel(s).values).reshape(-1)
        if np.all(dvals == 0):
            note = "identical on every seed" if n > 1 else "identical"
        else:
            note = f"changed on {int(np.sum(dvals != 0))}/{dvals.size} seeds" if n > 1 else "changed"
        ch = f"{scale * float(md):+.{2 if rate else 4}f}"
        if sd is not None:
            ch += f" ± {scale * float(sd):.{2 if rate else 4}f}"
        rows.append([", ".join(_label(k, v) for k, v in s.items()) or "(all)", _fmt(ma, sa, rate), _fmt(mb, sb, rate),
                     ch + unit, note])
    return head + "\n" + "\n".join("  " + line for line in _render(rows).splitlines())


def summarize(ds: xr.Dataset, var: str = "token_hit_rate") -> str:
    """The run's header, the table of ``var``, and the ``report`` section of its config (if any)."""
    a = ds.attrs
    parts = []
    name = a.get("experiment", "?")
    parts.append(f"experiment: {name}" + (f" — {a['description']}" if a.get("description") else ""))
    try:
        desc = json.loads(a.get("workload", "[]"))
    except ValueError:
        desc = []
    if desc:
        rng = lambda k: (f"{min(d[k] for d in desc):,}" if len({d[k] for d in desc}) == 1  # noqa: E731
                         else f"{min(d[k] for d in desc):,}-{max(d[k] for d in desc):,}")
        parts.append(
            f"workload: {a.get('workload_source', '?')} ({desc[0]['name']}{', ...' if len(desc) > 1 else ''}); "
            f"{len(desc)} stream(s): {rng('n_requests')} requests, {rng('total_blocks')} blocks, "
            f"{rng('distinct_keys')} distinct keys, {desc[0]['block_tokens']} tokens/block"
        )
    dims = " x ".join(f"{d}({ds.sizes[d]})" for d in ds[var].dims)
    grid = f"{dims} = {a.get('n_configs', '?')} configurations" if dims else "a single configuration"
    fixed = ", ".join(f"{k}={v}" for k, v in _base_of(ds).items() if k not in ds.dims and v is not None)
    parts.append(f"grid: {grid}, max_replicas {a.get('max_replicas', '?')}" + (f"; fixed: {fixed}" if fixed else ""))
    if "wall_time_s" in a:
        parts.append(
            f"time: {a['wall_time_s']:.1f} s wall (workloads {a.get('build_time_s', 0):.1f} s, simulate "
            f"{a.get('simulate_time_s', 0):.1f} s incl. compile {a.get('compile_time_s', 0):.1f} s, "
            f"{a.get('n_compiled_calls', 1)} call(s)); jax {a.get('jax_version', '?')} on {a.get('jax_backend', '?')}, "
            f"cacheresearch {a.get('cacheresearch_version', '?')}"
        )
    parts.append("")
    parts.append(format_table(ds, var))
    rep = config_of(ds).get("report") or {}
    if rep.get("published"):
        parts.append("")
        parts.append(published_comparison(ds, rep["published"], var, rep.get("source", "")))
    for c in rep.get("compare") or []:
        parts.append("")
        parts.append(paired_comparison(ds, c["dim"], c["baseline"], c["variant"], var, c.get("label", "")))
    if rep.get("kind") in ("routing", "hot_tenant", "llmd_blog"):
        parts.append("")
        parts.append(routing_summary(ds, rep))
    if rep.get("kind") == "routing" and "router" in ds.dims:  # the answers open the summary, after its header
        i = parts.index("")
        parts[i:i] = ["", routing_answers(ds, rep)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------ figures
def _new_figure(width=7.0, height=4.5) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _ylabel(da: xr.DataArray, var: str) -> str:
    ln = da.attrs.get("long_name", var).split(":")[0]
    return f"{ln} (%)" if _is_rate(da) else f"{ln} ({da.attrs['units']})" if da.attrs.get("units") else ln


def _title(ds: xr.Dataset, n: int) -> str:
    t = str(ds.attrs.get("experiment", ""))
    return t + (f"  (mean ± std over {n} seeds)" if n > 1 else "")


def line_chart(ds: xr.Dataset, var: str = "token_hit_rate", x: str | None = None) -> Figure:
    """``var`` against dimension ``x`` (default: the first numeric dim), one line per other combination."""
    da = ds[var]
    dims = _other_dims(da)
    if x is None:
        x = next(d for d in dims if np.asarray(da[d].values).dtype.kind in "iuf")
    mean, std, n = seed_stats(da)
    scale = 100.0 if _is_rate(da) else 1.0
    rest = [d for d in dims if d != x]
    fig = _new_figure()
    ax = fig.add_subplot()
    xs = np.asarray(da[x].values, dtype=float)
    combos = list(itertools.product(*(da[d].values for d in rest))) if rest else [()]
    colors = matplotlib.colormaps["tab10" if len(combos) <= 10 else "tab20"]
    styles = ("-", "--", ":", "-.")
    for i, combo in enumerate(combos):
        s = dict(zip(rest, combo))
        ls = styles[list(da[rest[0]].values).index(combo[0]) % len(styles)] if rest else "-"
        style = dict(color=colors(i % colors.N), ls=ls)
        y = scale * np.asarray(mean.sel(s).transpose(x).values, dtype=float)
        lab = ", ".join(f"{v}" if k in ("policy", "router", "layout") else _label(k, v) for k, v in s.items()) or var
        if std is not None:
            e = scale * np.asarray(std.sel(s).transpose(x).values, dtype=float)
            ax.errorbar(xs, y, yerr=e, marker="o", ms=4, capsize=3, label=lab, **style)
        else:
            ax.plot(xs, y, marker="o", ms=4, label=lab, **style)
    if xs.size > 1 and xs.min() > 0 and xs.max() / xs.min() >= 50:
        ax.set_xscale("log")
        ax.minorticks_off()
    if xs.size <= 12:
        ax.set_xticks(xs, [str(v) for v in da[x].values])
    units = da[x].attrs.get("units")
    ax.set_xlabel(f"{x} ({units})" if units else x)
    ax.set_ylabel(_ylabel(da, var))
    ax.set_title(_title(ds, n))
    ax.grid(True, alpha=0.3)
    if rest:
        fig.legend(fontsize="small" if len(combos) <= 12 else "x-small", ncols=1 if len(combos) <= 16 else 2,
                   title=" / ".join(rest), loc="outside right upper")
    return fig


def bar_chart(ds: xr.Dataset, var: str = "token_hit_rate", hue: str | None = None, published=None) -> Figure:
    """Grouped bars: one group per combination of the dims other than ``hue`` (default: the last dim),
    one bar per ``hue`` value, error bars = std over seeds.

    ``published`` (default: ``report.published`` of the run's config) marks published values on
    the bars they refer to (entries ``{label, select: {dim: value}, <var>: number}`` naming one bar).
    """
    if published is None:
        published = (config_of(ds).get("report") or {}).get("published") or []
    da = ds[var]
    dims = _other_dims(da)
    mean, std, n = seed_stats(da)
    scale = 100.0 if _is_rate(da) else 1.0
    fig = _new_figure(max(5.0, 1.2 + 0.9 * int(np.prod([da.sizes[d] for d in dims], dtype=int))), 4.5)
    ax = fig.add_subplot()
    if not dims:
        ax.bar([0], [scale * float(mean)], yerr=None if std is None else [scale * float(std)], capsize=4)
        ax.set_xticks([0], [var])
    else:
        hue = hue or dims[-1]
        groups = [d for d in dims if d != hue]
        combos = list(itertools.product(*(da[d].values for d in groups))) if groups else [()]
        hv = list(da[hue].values)
        width = 0.8 / len(hv)
        xs = np.arange(len(combos))
        for j, h in enumerate(hv):
            y, e = [], []
            for combo in combos:
                s = {**dict(zip(groups, combo)), hue: h}
                y.append(scale * float(mean.sel(s)))
                e.append(0.0 if std is None else scale * float(std.sel(s)))
            pos = xs - 0.4 + width * (j + 0.5)
            bars = ax.bar(pos, y, width, yerr=e if std is not None else None, capsize=3, label=str(h))
            ax.bar_label(bars, labels=[f"{v:.1f}" for v in y], fontsize="x-small", padding=2)
        marked = False
        for item in published:
            sel = item.get("select") or {}
            if var not in item or set(sel) != set(dims) or any(sel[d] not in list(da[d].values) for d in dims):
                continue
            g = combos.index(tuple(sel[d] for d in groups)) if groups else 0
            x = xs[g] - 0.4 + width * (hv.index(sel[hue]) + 0.5)
            ax.hlines(scale * float(item[var]), x - width / 2, x + width / 2, colors="k", lw=2.5,
                      label=None if marked else "published")
            marked = True
        ax.set_xticks(xs, ["\n".join(str(v) for v in c) for c in combos] if groups else [""])
        if groups:
            ax.set_xlabel(" / ".join(groups))
        fig.legend(title=hue, fontsize="small", loc="outside right upper")
    ax.set_ylabel(_ylabel(da, var))
    if _is_rate(da):
        ax.set_ylim(0, 105)
    ax.set_title(_title(ds, n))
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def plot(ds: xr.Dataset, var: str = "token_hit_rate") -> Figure:
    """The generic figure: :func:`line_chart` over the first numeric dim, else :func:`bar_chart`
    (routing experiments: :func:`routing_figure`)."""
    rep = config_of(ds).get("report") or {}
    if rep.get("kind") in ("routing", "hot_tenant", "llmd_blog") and "router" in ds.dims and "rate_per_s" in ds.dims:
        return routing_figure(ds, rep, var)
    da = ds[var]
    numeric = [d for d in _other_dims(da) if np.asarray(da[d].values).dtype.kind in "iuf" and da.sizes[d] > 1]
    if numeric:
        return line_chart(ds, var, numeric[0])
    return bar_chart(ds, var)


def save_figure(fig: Figure, path, dpi: int = 120) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=dpi)
    return p


# ------------------------------------------------------------------------------ routing experiments
ROUTING_VARS = ("token_hit_rate", "request_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "load_imbalance",
                "prefix_copies", "overflow_share")


def _fix(ds: xr.Dataset, keep: tuple[str, ...], prefer: dict | None = None) -> tuple[xr.Dataset, dict]:
    """Select one value of every dim not in ``keep`` (``prefer`` names it; default: the last value)."""
    prefer = prefer or {}
    sel = {}
    for d in ds.dims:
        if d in keep or d in ("prefix", "tier"):  # dims of a few variables only (per prefix; hit_rate_by_tier)
            continue
        vals = list(ds[d].values)
        sel[d] = prefer[d] if d in prefer and prefer[d] in vals else vals[-1]
    return ds.sel(sel), sel


def _sel_text(sel: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items()) or "all cells"


def routing_table(ds: xr.Dataset, sel: dict) -> str:
    """Every router's metrics in one cell of the other dims."""
    sub = ds.sel(sel)
    util = "utilisation_max" in sub
    rows = [["router", "hit rate", "req hit", "TTFT p50", "p90", "p99", "imbalance", "copies", "overflow"]
            + (["util"] if util else [])]
    for r in sub["router"].values:
        c = sub.sel(router=r)
        f = lambda v, pct=False: "-" if not np.isfinite(float(c[v])) else (  # noqa: E731
            f"{100 * float(c[v]):.1f}%" if pct else f"{float(c[v]):.2f}")
        u = float(c["utilisation_max"]) if util else None
        rows.append([str(r), f("token_hit_rate", True), f("request_hit_rate", True), f("ttft_p50_s") + " s",
                     f("ttft_p90_s") + " s", "overloaded" if u is not None and u >= A.OVERLOAD_UTIL
                     else f("ttft_p99_s") + " s", f("load_imbalance"), f("prefix_copies"),
                     f("overflow_share", True)] + ([f("utilisation_max")] if util else []))
    return _render(rows)


def tier_summary(ds: xr.Dataset, pref: dict, x: str, top) -> str:
    """KV tiers (``hit_rate_by_tier``): per router, the share of input tokens each tier served, at every cpu tier
    size of the grid, with TTFT p50 / p99 (the other dims at ``pref``)."""
    keep = ("router", "cpu_capacity_blocks") if "cpu_capacity_blocks" in ds.dims else ("router",)
    sub, sel = _fix(ds, keep, dict(pref, **({x: top} if top is not None else {})))
    caps = list(sub["cpu_capacity_blocks"].values) if "cpu_capacity_blocks" in sub.dims else [None]
    rows = [["router", "cpu tier (blocks)", "hit rate", "gpu", "cpu", "pool", "disk", "TTFT p50", "p99"]]
    for r in sub["router"].values:
        for c in caps:
            cell = sub.sel(router=r, **({"cpu_capacity_blocks": c} if c is not None else {}))
            by = cell["hit_rate_by_tier"]
            rows.append([str(r), "-" if c is None else f"{int(c):,}", f"{100 * float(cell['token_hit_rate']):.1f}%"]
                        + [f"{100 * float(by.sel(tier=t)):.1f}%" for t in ("gpu", "cpu", "pool", "disk")]
                        + [f"{float(cell['ttft_p50_s']):.3f} s", f"{float(cell['ttft_p99_s']):.3f} s"])
    return f"KV tiers: input tokens served by each tier ({_sel_text(sel)}):\n" + _render(rows)


def _crossings(ds: xr.Dataset, pref: dict, x: str, slo: float) -> tuple[dict, dict]:
    """{router: where its TTFT p99 crosses the SLO over ``x``} at ``pref`` (the other dims), and that selection."""
    sub, sel = _fix(ds, ("router", x), pref)
    util = sub["utilisation_max"] if "utilisation_max" in sub else None
    return {str(r): A.slo_crossing(sub["ttft_p99_s"].sel(router=r), x, slo,
                                   None if util is None else util.sel(router=r))
            for r in sub["router"].values}, sel


def _layout_answer(ds: xr.Dataset, pref: dict, best: str) -> str:
    s2, _ = _fix(ds, ("router", "layout"), pref)
    h, t = s2["token_hit_rate"].sel(router=best), s2["ttft_p99_s"].sel(router=best)
    u = s2["utilisation_max"].sel(router=best) if "utilisation_max" in s2 else None
    p = {lay: A.p99_text(float(t.sel(layout=lay)), None if u is None else float(u.sel(layout=lay)))
         for lay in ("stable", "timestamp_top")}
    return (f"* Layout: keep the prompt stable and put dynamic content last. A timestamp at the top takes {best}'s "
            f"token hit rate from {100 * float(h.sel(layout='stable')):.1f}% to "
            f"{100 * float(h.sel(layout='timestamp_top')):.1f}% and its TTFT p99 from {p['stable']} to "
            f"{p['timestamp_top']}.")


def _busy_means_overloaded(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` for the overload rule: on the fcfs replica busy time is serialised work (utilisation 1: a queue that
    never drains); the vllm replica is busy whenever it holds a sequence, however many it batches, so its
    utilisation says nothing of overload and is left out of the answers."""
    if str((config_of(ds).get("replica") or {}).get("scheduler", "fcfs")) == "vllm":
        return ds.drop_vars("utilisation_max", errors="ignore")
    return ds


def routing_answers(ds: xr.Dataset, rep: dict) -> str:
    """``report.kind: routing``: the answers in words with numbers, judged against the SLO
    (:mod:`cacheresearch.shell.answers`), at the top load of the grid and the largest capacity, stable layout."""
    slo = float(rep.get("slo_s", 2.0))
    x = "rate_per_s"
    if "router" not in ds.dims:
        return ""
    ds = _busy_means_overloaded(ds)
    top = ds[x].values[-1] if x in ds.dims else None
    pref = {"layout": "stable", "capacity_blocks": max(ds["capacity_blocks"].values) if "capacity_blocks" in ds.dims
            else None, "policy": _base_policy(ds)}
    at_top = dict(pref, **({x: top} if top is not None else {}))
    cell, sel = _fix(ds, ("router",), at_top)
    cross = _crossings(ds, pref, x, slo)[0] if x in ds.dims else None
    out = ["Answers (" + A.slo_line(slo) + "):"]
    out += A.routing_answers(cell, slo, _sel_text(sel), config_of(ds), cross, rate=top)
    if "capacity_blocks" in ds.dims and ds.sizes["capacity_blocks"] > 1:
        small = min(ds["capacity_blocks"].values)
        c2, sel2 = _fix(ds, ("router",), dict(at_top, capacity_blocks=small))
        out += [line.replace("* Router to use:", f"* At the small capacity ({int(small):,} blocks): router")
                for line in A.routing_answers(c2, slo, _sel_text(sel2), config_of(ds))[:1]]
    if "layout" in ds.dims and {"stable", "timestamp_top"} <= set(ds["layout"].values):
        out.append(_layout_answer(ds, at_top, A.best_routers(cell, slo)[0]))
    return "\n".join(out)


def routing_summary(ds: xr.Dataset, rep: dict) -> str:
    """The tables of the routing experiments (``report.kind``: routing, hot_tenant, llmd_blog); routing's answers
    come first in the summary (:func:`routing_answers`)."""
    kind = rep.get("kind")
    slo = float(rep.get("slo_s", 2.0))
    x = "rate_per_s"
    out = []
    ds = _busy_means_overloaded(ds)
    top = ds[x].values[-1] if x in ds.dims else None
    pref = {"layout": "stable", "capacity_blocks": max(ds["capacity_blocks"].values) if "capacity_blocks" in ds.dims
            else None, "policy": _base_policy(ds)}
    if "router" not in ds.dims:
        return ""
    if kind in ("routing", "hot_tenant"):
        sub, sel = _fix(ds, ("router",), dict(pref, **({x: top} if top is not None else {})))
        out.append(f"Routers at {_sel_text(sel)} (TTFT in seconds; copies = replicas holding a request's prefix; "
                   "overflow = requests sent away from the replica holding most of their prefix; util = the busiest "
                   f"replica's busy time / run horizon, overloaded at {A.OVERLOAD_UTIL}):")
        out.append(routing_table(ds, sel))
        if x in ds.dims:
            hots = list(ds["hot_share"].values) if "hot_share" in ds.dims else [None]
            for hv in hots:
                cross, sel2 = _crossings(ds, dict(pref, **({"hot_share": hv} if hv is not None else {})), x, slo)
                out.append("")
                out.append(f"TTFT p99 against the SLO of {slo:g} s (report.slo_s) ({_sel_text(sel2)}):")
                out += [f"  {r:24s} {c}" for r, c in cross.items()]
    if kind in ("routing", "hot_tenant") and "policy" in ds.dims and ds.sizes["policy"] > 1:
        out.append("")
        out.append(policy_summary(ds, pref, x, top, slo))
    if kind in ("routing", "hot_tenant") and "hit_rate_by_tier" in ds:
        out.append("")
        out.append(tier_summary(ds, pref, x, top))
    if kind == "llmd_blog":
        var = "ttft_p90_s"
        sub, sel = _fix(ds, ("router", x), {})
        rows = [["scheduler"] + [f"{v:g} QPS" for v in sub[x].values] + ["published (top rate)"]]
        pub = {p["router"]: p["ttft_p90_s"] for p in rep.get("published", [])}
        for r in sub["router"].values:
            rows.append([str(r)] + [f"{float(v):.2f} s" for v in sub[var].sel(router=r).values]
                        + [f"{pub[str(r)]:g} s" if str(r) in pub else "-"])
        out.append(f"TTFT p90 by scheduler and load ({_sel_text(sel)}), published: {rep.get('source', '')}")
        out.append(_render(rows))
        ours = sub[var].sel({x: sub[x].values[-1]}).to_series()
        order_ours = list(ours.sort_values().index)
        order_pub = sorted(pub, key=pub.get)
        same = [r for r in order_pub if r in ours.index]
        out.append(f"ordering at the top rate: ours {' < '.join(order_ours)}; published {' < '.join(order_pub)}"
                   f" -> {'same ordering' if [r for r in order_ours if r in pub] == same else 'DIFFERENT ordering'}")
        for r in sub["router"].values:
            h = float(sub["token_hit_rate"].sel(router=r, **{x: sub[x].values[-1]}))
            out.append(f"  {str(r):12s} token hit rate {100 * h:.1f}% at the top rate")
    return "\n".join(out)


def _base_policy(ds: xr.Dataset):
    """The policy the router tables read when policy is a dimension: lru where the grid has it."""
    if "policy" not in ds.dims:
        return None
    vals = [str(v) for v in ds["policy"].values]
    return "lru" if "lru" in vals else vals[0]


def policy_summary(ds: xr.Dataset, pref: dict, x: str, top, slo: float = 2.0) -> str:
    """Which eviction policy wins where: token hit rate (and TTFT p99) of every router x policy at each
    capacity, with Che's LRU prediction beside it (``che_lru_hit_rate``: random and prefix_hash only)."""
    out = []
    caps = list(ds["capacity_blocks"].values) if "capacity_blocks" in ds.dims else [None]
    pols = [str(p) for p in ds["policy"].values]
    for cap in caps:
        p = dict(pref, policy=None, **({"capacity_blocks": cap} if cap is not None else {}),
                 **({x: top} if top is not None else {}))
        sub, sel = _fix(ds, ("router", "policy"), {k: v for k, v in p.items() if v is not None})
        out.append(f"Token hit rate by eviction policy ({_sel_text(sel)}); Che = Che's LRU prediction:")
        base = _base_policy(ds)
        rows = [["router"] + pols + ["Che (LRU)", "best policy", f"TTFT p99 {base} -> best"]]
        counts, gains = {}, {}
        for r in sub["router"].values:
            c = sub.sel(router=r)
            h = {q: float(c["token_hit_rate"].sel(policy=q)) for q in pols}
            t = {q: float(c["ttft_p99_s"].sel(policy=q)) for q in pols}
            u = {q: float(c["utilisation_max"].sel(policy=q)) for q in pols} if "utilisation_max" in c else None
            bests = A.best_policy(h, t, slo, u)
            best = bests[0]
            label = " = ".join(bests) + (" (tie)" if len(bests) > 1 else "")
            counts[label] = counts.get(label, 0) + 1
            gains[str(r)] = 100 * (h[best] - h[base])
            che = float(c["che_lru_hit_rate"].isel(policy=0)) if "che_lru_hit_rate" in c else float("nan")
            rows.append([str(r)] + [f"{100 * h[q]:.1f}%" for q in pols]
                        + ["-" if not np.isfinite(che) else f"{100 * che:.1f}%", label,
                           f"{A.p99_text(t[base], u and u[base])} -> {A.p99_text(t[best], u and u[best])}"])
        out.append(_render(rows))
        hi, lo = max(gains, key=gains.get), min(gains, key=gains.get)
        out.append(f"  best policy by router (the highest token hit rate among the policies whose TTFT p99 meets the "
                   f"SLO of {slo:g} s; without one, the lowest p99; exact ties named together): "
                   f"{', '.join(f'{k} x{v}' for k, v in counts.items())}; gain over {base} in token hit rate: largest "
                   f"{gains[hi]:.1f} points ({hi}), smallest {gains[lo]:.1f} ({lo})")
        out.append("")
    return "\n".join(out).rstrip()


def policy_panels(ds: xr.Dataset, axes, pref: dict) -> None:
    """Token hit rate by policy (x) for each router (lines), one panel per capacity (at most ``len(axes)``),
    Che's LRU prediction dotted for the routers that have one."""
    caps = list(ds["capacity_blocks"].values) if "capacity_blocks" in ds.dims else [None]
    pols = [str(p) for p in ds["policy"].values]
    colors = matplotlib.colormaps["tab10"]
    for ax, cap in zip(axes, caps[-len(axes):]):
        p = {k: v for k, v in dict(pref, policy=None, **({"capacity_blocks": cap} if cap is not None else {})).items()
             if v is not None}
        sub, sel = _fix(ds, ("router", "policy"), p)
        for i, r in enumerate(sub["router"].values):
            ax.plot(range(len(pols)), 100 * np.asarray(sub["token_hit_rate"].sel(router=r).values, float), marker="o",
                    ms=3, color=colors(i % 10), ls="-" if i < 10 else "--", label=str(r))
            if "che_lru_hit_rate" in sub:
                che = float(sub["che_lru_hit_rate"].sel(router=r).isel(policy=0))
                if np.isfinite(che):
                    ax.axhline(100 * che, color=colors(i % 10), ls=":", lw=1)
        ax.set_xticks(range(len(pols)), pols, fontsize="small")
        ax.set_xlabel("eviction policy")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(f"by policy: {_sel_text(sel)} (dotted: Che LRU)", fontsize="small")
        ax.grid(True, alpha=0.3)


_PANEL_LABELS = {"ttft_p99_s": "TTFT p99 (s, log)", "ttft_p90_s": "TTFT p90 (s, log)",
                 "ttft_p50_s": "TTFT p50 (s, log)",
                 "token_hit_rate": "token hit rate (%)", "request_hit_rate": "request hit rate (%)",
                 "load_imbalance": "load imbalance (max / mean busy time, ratio)",
                 "prefix_copies": "replicas holding a request's prefix (replicas)",
                 "kv_util_mean": "KV utilisation (blocks in use / pool, %)", "preemptions": "preemptions (requests)"}
_MARKERS = "osD^v<>ph*"


def _routing_panel(ax, sub: xr.Dataset, v: str, x: str, rep: dict, title: str) -> None:
    """One panel: ``v`` against the load, one line per router (distinct colour, marker and a small horizontal
    offset each, so routers with equal values stay visible), rates in %, TTFT on a log axis with the SLO."""
    colors = matplotlib.colormaps["tab10"]
    routers = list(sub["router"].values)
    xs = np.asarray(sub[x].values, dtype=float)
    da = sub[v]
    pct = da.attrs.get("units") == "1" and v not in ("load_imbalance",)
    for i, r in enumerate(routers):
        y = np.asarray(da.sel(router=r).values, dtype=float) * (100.0 if pct else 1.0)
        off = 1.0 + 0.015 * (i - (len(routers) - 1) / 2)  # a few percent apart on the load axis
        ax.plot(xs * off, y, marker=_MARKERS[i % len(_MARKERS)], ms=4, color=colors(i % 10), label=str(r),
                ls="-" if i < 10 else "--", lw=1.2, alpha=0.9)
    if v.startswith("ttft") and "utilisation_max" in sub:  # an overloaded cell's p99 is the run's length
        over = np.asarray(sub["utilisation_max"].transpose("router", x).values, float) >= A.OVERLOAD_UTIL
        y = np.asarray(da.transpose("router", x).values, float)
        if over.any():
            ax.plot(np.broadcast_to(xs, over.shape)[over], y[over], marker="x", ms=9, color="k", ls="none",
                    label=f"overloaded (utilisation >= {A.OVERLOAD_UTIL})")
    if v.startswith("ttft"):
        ax.set_yscale("log")
        if rep.get("kind") != "llmd_blog":
            ax.axhline(float(rep.get("slo_s", 2.0)), color="k", ls=":", lw=1, label=f"SLO {rep.get('slo_s', 2.0):g} s")
        for p in rep.get("published", []) if rep.get("kind") == "llmd_blog" else []:
            if p.get("router") in routers:
                ax.plot([xs[-1]], [p["ttft_p90_s"]], marker="*", ms=10, ls="none",
                        color=colors(routers.index(p["router"]) % 10))
    if pct:
        ax.set_ylim(-2, 102)
    if xs.min() > 0 and xs.max() / xs.min() >= 4:  # the offsets above are equal on a log axis
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.set_xlabel("load (requests/s)")
    ax.set_ylabel(_PANEL_LABELS.get(v, f"{v} ({da.attrs.get('units', '')})"), fontsize="small")
    ax.set_title(title, fontsize="small")
    ax.grid(True, alpha=0.3)


def routing_figure(ds: xr.Dataset, rep: dict, var: str | None = None) -> Figure:
    """Small multiples over the load level, one line per router: ``var`` (``output.variable``; TTFT p99 by default,
    p90 for llmd_blog) for every capacity x layout of the grid, then the token hit rate, load imbalance and prefix
    copies (the vllm replica: KV utilisation, preemptions) for every capacity at the stable layout; the policy
    panels where policy is an axis."""
    x = "rate_per_s"
    kind = rep.get("kind")
    ds = _busy_means_overloaded(ds)
    tvar = "ttft_p90_s" if kind == "llmd_blog" else "ttft_p99_s"
    var = var if var in ds and var in _PANEL_LABELS else tvar
    pols = "policy" in ds.dims and ds.sizes["policy"] > 1
    base = {"policy": _base_policy(ds)} if pols else {}
    caps = [int(c) for c in ds["capacity_blocks"].values] if "capacity_blocks" in ds.dims else [None]
    lays = [str(v) for v in ds["layout"].values] if "layout" in ds.dims else [None]
    others = [tvar if var != tvar else "token_hit_rate", "load_imbalance", "prefix_copies"]
    if "kv_util_mean" in ds:
        others[1:] = ["kv_util_mean", "preemptions"]
    others = [v for v in dict.fromkeys(others) if v != var and v in ds]
    rows = [(var, lay) for lay in lays] + [(v, "stable" if "stable" in lays else lays[0]) for v in others]
    fig = _new_figure(1.0 + 4.2 * len(caps) + 2.0, 2.9 * (len(rows) + (1 if pols else 0)))
    axes = np.atleast_2d(fig.subplots(len(rows) + (1 if pols else 0), len(caps), squeeze=False))
    sel_last = {}
    for j, cap in enumerate(caps):
        for i, (v, lay) in enumerate(rows):
            pref = dict(base, **({"capacity_blocks": cap} if cap is not None else {}),
                        **({"layout": lay} if lay is not None else {}))
            sub, sel_last = _fix(ds, ("router", x), pref)
            title = ", ".join(f"{k}={val}" for k, val in sel_last.items() if k in ("capacity_blocks", "layout"))
            _routing_panel(axes[i, j], sub, v, x, rep, title or _sel_text(sel_last))
    if pols:
        top = {"rate_per_s": ds[x].values[-1]} if x in ds.dims else {}
        pref = {k: v for k, v in dict({"layout": "stable"}, **base, **top).items()}
        policy_panels(ds, axes[-1], pref)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize="small", loc="outside right upper", title="router")
    fixed = {k: v for k, v in sel_last.items() if k not in ("capacity_blocks", "layout")}
    fig.suptitle(f"{ds.attrs.get('experiment', '')}: {var} and the routing metrics against load"
                 + (f" ({_sel_text(fixed)})" if fixed else "") + (" (stars: published)" if kind == "llmd_blog" else ""),
                 fontsize="medium")
    return fig

"""The routing experiments' answers in words with numbers (``report.kind: routing``): the router to use, the load
cap to set (or that none meets the SLO), the layout; each judged against the SLO on TTFT p99 (``report.slo_s``).

Rules, each stated in the text it produces:

* a cell whose busiest replica's utilisation reaches 1 (:data:`OVERLOAD_UTIL`, ``utilisation_max``: busy time /
  run horizon; a queue that never drains within the run) is called *overloaded*, not given a p99: its p99 grows
  with the run's length, not with anything the grid varies;
* a router meets the SLO where it is not overloaded and its TTFT p99 is at most ``slo_s``; the router to use is the
  lowest p99 among those (exact ties are named together), the cap to set is the one that keeps the highest token
  hit rate among the affinity routers that meet it (``prefix_hash`` = no cap, ``chwbl`` with its load bound ``c``);
* an SLO crossing between two grid points is linearly interpolated and says so, with the two points.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["OVERLOAD_UTIL", "slo_line", "p99_text", "slo_crossing", "cap_labels", "ties", "best_routers",
           "routing_answers",
           "best_policy"]

#: ``utilisation_max`` at or above which a cell is overloaded (1.00 when printed to two decimals)
OVERLOAD_UTIL = 0.995


def slo_line(slo: float) -> str:
    return (f"SLO: TTFT p99 <= {slo:g} s, report.slo_s; change it with report.slo_s=S on the command line (a rerun in "
            "the same hydra.run.dir redoes only the summary and figure)")


def _overloaded(util) -> bool:
    return util is not None and np.isfinite(util) and util >= OVERLOAD_UTIL


def p99_text(p99: float, util=None) -> str:
    """``1.27 s``, or ``overloaded (utilisation 1.00)``."""
    return f"overloaded (utilisation {util:.2f})" if _overloaded(util) else f"{p99:.2f} s"


def _p99(p99: float, util) -> str:
    return p99_text(p99, util) if _overloaded(util) else f"p99 {p99:.2f} s"


def _meets(p99: float, util, slo: float) -> bool:
    return bool(np.isfinite(p99) and p99 <= slo and not _overloaded(util))


def slo_crossing(da: xr.DataArray, x: str, slo: float, util: xr.DataArray | None = None) -> str:
    """Where ``da`` (1-D over ``x``) first exceeds ``slo`` (an overloaded point counts as above): the grid point, or
    the linear interpolation between the two points around it, said to be one."""
    xs = np.asarray(da[x].values, dtype=float)
    ys = np.asarray(da.values, dtype=float)
    us = np.asarray(util.values, dtype=float) if util is not None else np.full(len(xs), np.nan)
    above = [not _meets(y, u, slo) for y, u in zip(ys, us)]
    unit = "req/s" if x == "rate_per_s" else x
    if above[0]:
        return f"already above at {xs[0]:g} {unit}" + (" (overloaded)" if _overloaded(us[0]) else "")
    for i in range(1, len(xs)):
        if above[i]:
            if _overloaded(us[i]) or not np.isfinite(ys[i]) or ys[i] <= ys[i - 1]:
                return (f"crosses between {xs[i - 1]:g} and {xs[i]:g} {unit} (p99 {ys[i - 1]:.2f} s at {xs[i - 1]:g}, "
                        f"{p99_text(ys[i], us[i])} at {xs[i]:g}; not interpolated)")
            t = (slo - ys[i - 1]) / (ys[i] - ys[i - 1])
            return (f"crosses at ~{xs[i - 1] + t * (xs[i] - xs[i - 1]):.3g} {unit}, interpolated between {xs[i - 1]:g} "
                    f"and {xs[i]:g} (the grid's points)")
    return f"stays below up to {xs[-1]:g} {unit} (the grid's top)"


def cap_labels(routers, config: dict) -> dict:
    """{router: its load cap in words} for the affinity routers of the grid: ``prefix_hash`` (no cap) and every
    ``chwbl`` one (a preset or a ``fleet.variants`` entry), with ``c`` from its ``chwbl_c_pct``."""
    from cacheresearch.routers.presets import PRESETS  # noqa: PLC0415

    fleet = config.get("fleet") or {}
    variants = fleet.get("variants") or {}
    out = {}
    for r in map(str, routers):
        v = dict(variants.get(r) or {})
        name = v.pop("router", r)
        spec = dict(PRESETS.get(name, {"router": name}), **v)
        if spec["router"] == "prefix_hash":
            out[r] = "no cap"
        elif spec["router"] == "chwbl":  # the knob's default: 125 (routers/chwbl.py)
            pct = int(spec.get("chwbl_c_pct") or fleet.get("chwbl_c_pct") or 125)
            out[r] = f"c = {pct / 100:g}"
    return out


def ties(values: dict, best) -> list:
    """The keys whose value equals ``values[best]`` exactly (``best`` first)."""
    return [best] + [k for k, v in values.items() if k != best and v == values[best]]


def _names(keys) -> str:
    keys = [str(k) for k in keys]
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1] + " (tied)"


def _cell(cell: xr.Dataset) -> tuple[list, dict, dict, dict]:
    routers = [str(r) for r in cell["router"].values]
    p99 = {r: float(cell["ttft_p99_s"].sel(router=r)) for r in routers}
    hit = {r: float(cell["token_hit_rate"].sel(router=r)) for r in routers}
    util = ({r: float(cell["utilisation_max"].sel(router=r)) for r in routers} if "utilisation_max" in cell
            else dict.fromkeys(routers))
    return routers, p99, hit, util


def best_routers(cell: xr.Dataset, slo: float) -> list[str]:
    """The router(s) to use in one cell: the lowest TTFT p99 among those meeting the SLO (exact ties together), or
    without one, the lowest p99 of those not overloaded (else of all)."""
    routers, p99, hit, util = _cell(cell)
    ok = [r for r in routers if _meets(p99[r], util[r], slo)]
    pool = ok or routers
    best = min(pool, key=lambda r: (_overloaded(util[r]), p99[r]))
    return ties({r: p99[r] for r in pool}, best)


def routing_answers(cell: xr.Dataset, slo: float, where: str, config: dict, crossings: dict | None = None,
                    rate=None) -> list[str]:
    """The router and cap answers for one cell of the other dims (``cell`` indexed by router only)."""
    routers, p99, hit, util = _cell(cell)
    ok = [r for r in routers if _meets(p99[r], util[r], slo)]
    desc = lambda r: f"{r}: TTFT p99 {p99_text(p99[r], util[r])}, token hit rate {100 * hit[r]:.1f}%"  # noqa: E731
    out = []
    if ok:
        tied = best_routers(cell, slo)
        others = [r for r in ok if r not in tied]
        out.append(f"* Router to use: {_names(tied)}, the lowest TTFT p99 that meets the SLO at {where} ("
                   + "; ".join(desc(r) for r in tied) + ")"
                   + (f"; also within the SLO: {', '.join(f'{r} {p99[r]:.2f} s' for r in others)}" if others else "")
                   + (f"; {len(routers) - len(ok)} of {len(routers)} routers miss it" if len(ok) < len(routers) else "")
                   + ".")
    else:
        best = best_routers(cell, slo)[0]
        out.append(f"* Router to use: no router meets the SLO at {where}; the lowest TTFT p99 is {desc(best)}"
                   + (f" (it {crossings[best]})" if crossings and best in crossings else "") + ".")
    caps = cap_labels(routers, config)
    if len(caps) > 1:
        listing = "; ".join(f"{r} ({caps[r]}): {_p99(p99[r], util[r])}, hit {100 * hit[r]:.1f}%" for r in caps)
        meet = [r for r in caps if r in ok]
        if meet:
            top = max(meet, key=lambda r: (hit[r], caps[r] == "no cap"))
            if caps[top] == "no cap":
                out.append(f"* Cap to set: none needed at {where}: uncapped {top} meets the SLO with the highest hit "
                           f"rate ({listing}).")
            else:
                out.append(f"* Cap to set: {caps[top]} ({top}), the cap that meets the SLO with the highest token hit "
                           f"rate at {where} ({listing}).")
        else:
            low = min(caps, key=lambda r: (_overloaded(util[r]), p99[r]))
            out.append("* Cap to set: no cap meets the SLO"
                       + (f" at {float(rate):g} req/s" if rate is not None else f" at {where}")
                       + f" ({listing}); the lowest p99 is {low} ({caps[low]})"
                       + (f", which {crossings[low]}" if crossings and low in crossings else "")
                       + ". Lower the load per replica (more replicas) or relax the SLO. (c: chwbl's load bound, "
                       "no replica above c x the mean load; fleet.chwbl_c_pct = 100 c.)")
    return out


def best_policy(hit: dict, p99: dict, slo: float, util: dict | None = None) -> list:
    """The policies that best serve the routing objective: among those meeting the SLO, the highest token hit rate;
    without one, the lowest TTFT p99. Exact ties are all returned (the first is the grid's first)."""
    util = util or dict.fromkeys(hit)
    ok = [p for p in hit if _meets(p99[p], util[p], slo)]
    if ok:
        b = max(ok, key=lambda p: hit[p])
        return [b] + [p for p in ok if p != b and hit[p] == hit[b]]
    b = min(hit, key=lambda p: p99[p])
    return [b] + [p for p in hit if p != b and p99[p] == p99[b]]

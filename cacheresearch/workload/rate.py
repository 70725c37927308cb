"""Time-varying arrival rates for any workload: a diurnal sine, step bursts, or the rate of a trace.

A *rate shape* is a relative rate ``m(t) >= 0`` over ``[0, T)`` (seconds from the workload's first
arrival), held piecewise constant over bins: :func:`sine_shape` (each bin holds the sine's exact mean
over it), :func:`step_shape` (multipliers from given start times) and :func:`trace_shape` (a trace's
arrivals counted per bin). Two ways to impose it on a workload, keeping every request's blocks:

* :func:`warp_arrivals` (time-warping, every request kept): arrival ``t`` moves to ``M^-1(M(T) t / T)``
  with ``M`` the integral of ``m``; a homogeneous Poisson stream of rate ``r`` becomes an inhomogeneous
  one of rate ``r m(t) T / M(T)`` (the time-change theorem), so the count and the span stay and the
  rate follows the shape. ``M`` is piecewise linear, so its inverse (``np.interp``) is exact up to the
  final rounding to whole milliseconds.
* :func:`thin_arrivals` (Lewis-Shedler thinning, times kept): request ``i`` stays with probability
  ``m(t_i) / max m`` (seeded), so the workload's rate is multiplied by the shape.

Bad shapes are one-line ``ValueError`` naming the key (``rate.amplitude``, ``rate.steps``, ...).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cacheresearch.workload.table import Workload

__all__ = ["RateShape", "sine_shape", "step_shape", "trace_shape", "shape_from", "warp_arrivals",
           "thin_arrivals", "subset", "rate_per_bin"]


class RateShape(NamedTuple):
    """Relative rate ``mult[b]`` over bin ``[edges[b], edges[b + 1])`` seconds (``edges[0] == 0``)."""

    edges: np.ndarray  # float64 [B + 1], increasing
    mult: np.ndarray  # float64 [B], >= 0, some > 0
    kind: str


def _check(name: str, ok: bool, got) -> None:
    if not ok:
        raise ValueError(f"rate.{name}: got {got!r}")


def _finish(edges, mult, kind) -> RateShape:
    edges, mult = np.asarray(edges, np.float64), np.asarray(mult, np.float64)
    _check("mult (every multiplier finite and >= 0, one > 0)",
           mult.size > 0 and bool(np.all(np.isfinite(mult))) and bool(np.all(mult >= 0)) and mult.max() > 0,
           mult.tolist()[:8])
    return RateShape(edges, mult, kind)


def sine_shape(span_s: float, *, amplitude: float = 0.8, period_s: float = 86_400.0, peak_s: float = 50_400.0,
               bin_s: float = 60.0) -> RateShape:
    """``m(t) = 1 + amplitude * cos(2 pi (t - peak_s) / period_s)``: a daily cycle peaking at ``peak_s``
    (default 14:00 when the workload starts at midnight), its trough ``(1 - a) / (1 + a)`` of the peak.
    Each ``bin_s`` bin holds the exact mean of the curve over it."""
    _check("amplitude (in [0, 1])", 0.0 <= float(amplitude) <= 1.0, amplitude)
    _check("period_s (> 0)", float(period_s) > 0, period_s)
    _check("bin_s (> 0)", float(bin_s) > 0, bin_s)
    _check("span_s (> 0)", float(span_s) > 0, span_s)
    edges = np.append(np.arange(0.0, float(span_s), float(bin_s)), float(span_s))
    w = 2 * np.pi / float(period_s)
    s = np.sin(w * (edges - float(peak_s)))
    mult = 1.0 + float(amplitude) * (s[1:] - s[:-1]) / (w * np.diff(edges))
    return _finish(edges, np.maximum(mult, 0.0), "sine")


def step_shape(span_s: float, steps) -> RateShape:
    """Multipliers from start times: ``steps = [[start_s, mult], ...]`` (first start 0, increasing);
    e.g. ``[[0, 1], [3600, 5], [3900, 1]]`` is a five-fold burst of five minutes after an hour."""
    _check("span_s (> 0)", float(span_s) > 0, span_s)
    try:
        st = np.asarray(steps, np.float64).reshape(-1, 2)
    except (TypeError, ValueError):
        raise ValueError(f"rate.steps: a list of [start_s, multiplier] pairs, got {steps!r}") from None
    _check("steps (first start 0, starts increasing and < span_s)",
           st.shape[0] > 0 and st[0, 0] == 0 and bool(np.all(np.diff(st[:, 0]) > 0)) and st[-1, 0] < float(span_s),
           st.tolist())
    return _finish(np.append(st[:, 0], float(span_s)), st[:, 1], "steps")


def trace_shape(arrival_ms, span_s: float, *, bin_s: float = 300.0) -> RateShape:
    """The rate of a trace: its arrivals (ms, any origin) counted per ``bin_s`` bin from its first one,
    the bins stretched onto ``[0, span_s)``."""
    a = np.asarray(arrival_ms, np.float64)
    _check("trace (at least two arrivals)", a.size >= 2, int(a.size))
    _check("bin_s (> 0)", float(bin_s) > 0, bin_s)
    _check("span_s (> 0)", float(span_s) > 0, span_s)
    t = (a - a.min()) / 1000.0
    nb = max(int(np.ceil(max(t.max(), 1e-9) / float(bin_s))), 1)
    counts = np.bincount(np.minimum((t // float(bin_s)).astype(np.int64), nb - 1), minlength=nb)
    return _finish(np.linspace(0.0, float(span_s), nb + 1), counts.astype(np.float64), "trace")


def shape_from(conf: dict, span_s: float, trace_arrival_ms=None) -> RateShape:
    """A shape from a ``rate:`` mapping: ``{kind: sine, amplitude, period_s, peak_s, bin_s}``,
    ``{kind: steps, steps}`` or ``{kind: trace, bin_s}`` (with the trace's arrivals)."""
    c = dict(conf)
    kind = c.pop("kind", "sine")
    if kind == "sine":
        allowed = {"amplitude", "period_s", "peak_s", "bin_s"}
    elif kind == "steps":
        allowed = {"steps"}
    elif kind == "trace":
        allowed = {"bin_s"}
    else:
        raise ValueError(f"rate.kind: one of sine, steps, trace; got {kind!r}")
    extra = sorted(set(c) - allowed)
    if extra:
        raise ValueError(f"rate.{extra[0]}: not a key of a {kind} shape (keys: {sorted(allowed)})")
    if kind == "sine":
        return sine_shape(span_s, **c)
    if kind == "steps":
        return step_shape(span_s, c.get("steps"))
    if trace_arrival_ms is None:
        raise ValueError("rate.kind: trace needs the trace's arrivals")
    return trace_shape(trace_arrival_ms, span_s, **c)


def _cumulative(shape: RateShape) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(shape.mult * np.diff(shape.edges))])


def subset(wl: Workload, keep: np.ndarray, arrival_ms=None, suffix: str = "") -> Workload:
    """The requests ``keep`` (bool [N]) of ``wl`` with their blocks (and new ``arrival_ms`` for them)."""
    keep = np.asarray(keep, bool)
    nb = wl.n_blocks
    arr = wl.arrival_ms[keep] if arrival_ms is None else np.asarray(arrival_ms, np.int64)
    whole = bool(keep.all())  # every request kept: share the key and offset arrays (no copy of the blocks)
    return Workload(arrival_ms=arr, input_tokens=wl.input_tokens[keep], output_tokens=wl.output_tokens[keep],
                    tenant=wl.tenant[keep], keys=wl.keys if whole else wl.keys[np.repeat(keep, nb)],
                    offsets=wl.offsets if whole else np.concatenate([[0], np.cumsum(nb[keep])]).astype(np.int64),
                    block_tokens=wl.block_tokens, name=wl.name + suffix, meta=dict(wl.meta))


def warp_arrivals(wl: Workload, shape: RateShape) -> Workload:
    """Every request of ``wl`` kept, its arrival time-warped so the rate follows ``shape`` over the
    workload's span (see the module docstring); ``shape``'s span should be the workload's."""
    if wl.n_requests == 0:
        return wl
    t0 = int(wl.arrival_ms[0])
    rel = (wl.arrival_ms - t0) / 1000.0
    span = float(shape.edges[-1])
    cum = _cumulative(shape)
    target = np.clip(rel / span, 0.0, 1.0) * cum[-1]
    # M is flat over empty bins: interp over its strictly increasing points only (their first occurrence)
    keep = np.concatenate([[True], np.diff(cum) > 0])
    new = np.interp(target, cum[keep], shape.edges[keep])
    arr = t0 + np.rint(new * 1000.0).astype(np.int64)
    out = subset(wl, np.ones(wl.n_requests, bool), np.maximum.accumulate(arr), suffix=f"-{shape.kind}")
    out.meta["rate"] = dict(kind=shape.kind, mode="warp", bins=int(shape.mult.size), span_s=span)
    return out


def thin_arrivals(wl: Workload, shape: RateShape, seed: int = 0) -> Workload:
    """Requests of ``wl`` kept with probability ``m(t_i) / max m`` (Lewis-Shedler thinning, seeded);
    arrival times unchanged."""
    if wl.n_requests == 0:
        return wl
    rel = (wl.arrival_ms - int(wl.arrival_ms[0])) / 1000.0
    b = np.clip(np.searchsorted(shape.edges, rel, side="right") - 1, 0, shape.mult.size - 1)
    p = shape.mult[b] / shape.mult.max()
    keep = np.random.default_rng(seed).random(wl.n_requests) < p
    out = subset(wl, keep, suffix=f"-thin-{shape.kind}")
    out.meta["rate"] = dict(kind=shape.kind, mode="thin", bins=int(shape.mult.size), seed=int(seed))
    return out


def rate_per_bin(arrival_ms, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bin start s, arrivals per second) of ``arrival_ms`` counted per ``bin_s`` from 0."""
    a = np.asarray(arrival_ms, np.int64)
    if a.size == 0:
        return np.zeros(0), np.zeros(0)
    b = (a // int(round(bin_s * 1000))).astype(np.int64)
    c = np.bincount(b)
    return np.arange(c.size) * float(bin_s), c / float(bin_s)

"""The study protocol and what every study shares: errors, configuration, attributes, formatting, figures.

A study is a :class:`Study`: a name, a typed defaults dataclass (``study:`` keys of the experiment
config are checked against it), a ``run`` function, ``summarize`` and ``plot``. ``run(cfg)`` is a
generator: it builds its workloads and *yields* the cells it needs the engine to run (a :class:`Cells`:
streams, the stream of each cell, its parameters and seed), receives their metrics, and *returns*
its dataset. :meth:`Study.plan` starts it (``plan(cfg) -> StudyRun`` whose ``cells`` are the first
batch to run) and :meth:`StudyRun.assemble` hands the metrics back (``assemble(metrics)`` -> the next
batch, or the dataset). Whoever drives it decides how the cells run: in memory
(:func:`run_in_memory`, the core's runner) or as chunk files with resume, parts and a progress bar
(:mod:`cacheresearch.shell.pipeline`, what ``python -m cacheresearch.sweep`` uses for every experiment).
A study whose ``run`` returns a dataset directly (no engine cells) is driven the same way.

The core never imports this module; studies import the core, never each other's private names.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np
import xarray as xr
from omegaconf import OmegaConf

from cacheresearch import __version__

__all__ = ["StudyError", "Cells", "Study", "StudyRun", "engine_hits", "run_in_memory", "defaults_class",
           "study_cfg", "seeds", "grid_lists", "positive_list", "common_attrs", "doc", "pct", "usd", "table",
           "header", "fig", "errbar", "progress", "HOUR", "DAY", "distinct_colours", "overlapping_groups"]

HOUR = 3600.0
DAY = 86_400.0


class StudyError(ValueError):
    """A study configuration is invalid (the message names the key)."""


def progress(msg: str) -> None:
    """A progress line of a study's own work (what runs outside the pipeline's chunks) on stderr, whatever
    stdout is redirected to (stdout carries the summary)."""
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the protocol
@dataclass(frozen=True)
class Cells:
    """Engine cells a study asks for: cell ``g`` runs ``streams[stream_of[g]]`` with ``params[g]`` and the
    PRNG key of ``seeds[g]`` (:func:`cacheresearch.core.run.simulate_cells`' arguments)."""

    streams: list
    stream_of: np.ndarray
    params: list
    seeds: np.ndarray
    max_replicas: int = 1
    options: dict = field(default_factory=lambda: {"per_request": True})

    def __post_init__(self):
        object.__setattr__(self, "stream_of", np.asarray(self.stream_of, np.int64))
        object.__setattr__(self, "seeds", np.asarray(self.seeds, np.uint32))
        if not (len(self.stream_of) == len(self.params) == len(self.seeds)):
            raise ValueError(f"Cells: {len(self.stream_of)} stream indices, {len(self.params)} parameter sets and "
                             f"{len(self.seeds)} seeds; they must be as many")


@dataclass(frozen=True)
class Study:
    """A registered study: ``experiment=NAME`` (config ``kind: NAME``) runs it."""

    name: str
    run: Callable  # cfg -> generator yielding Cells, receiving Metrics, returning a Dataset (or a Dataset)
    summarize: Callable[[xr.Dataset], str]
    plot: Callable[[xr.Dataset], Any]
    defaults: type | None = None  # a dataclass: the ``study:`` keys and their default values
    doc: str = ""

    def plan(self, cfg) -> StudyRun:
        """Start the study: its first cells to run (``.cells``), or its dataset when it needs none."""
        return StudyRun(self, cfg)


class StudyRun:
    """One run of a study: ``cells`` (the next batch to run, None when done), ``assemble(metrics)`` and
    ``dataset`` (set when the study has returned)."""

    def __init__(self, study: Study, cfg):
        self.study, self.calls = study, 0
        self.cells: Cells | None = None
        self.dataset: xr.Dataset | None = None
        out = study.run(cfg)
        if isinstance(out, xr.Dataset):
            self.dataset = out
            return
        self._gen = out
        self._advance(None, first=True)

    def _advance(self, value, first=False):
        try:
            nxt = next(self._gen) if first else self._gen.send(value)
        except StopIteration as stop:
            self.cells, self.dataset = None, stop.value
            if not isinstance(self.dataset, xr.Dataset):
                raise TypeError(f"study {self.study.name!r} returned {type(stop.value).__name__}, not a Dataset")
            return
        if not isinstance(nxt, Cells):
            raise TypeError(f"study {self.study.name!r} yielded {type(nxt).__name__}, not Cells")
        self.cells = nxt

    def assemble(self, metrics):
        """Hand the metrics of ``cells`` back; returns the next cells (or None: ``dataset`` is ready)."""
        if self.cells is None:
            raise RuntimeError("assemble() called with no cells outstanding")
        self.calls += 1
        self._advance(metrics)
        return self.cells


def run_in_memory(study: Study, cfg, **runner_options) -> xr.Dataset:
    """Drive a study with the core's runner, nothing written (no chunk files)."""
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415

    r = study.plan(cfg)
    while r.cells is not None:
        c = r.cells
        m, _ = simulate_cells(c.streams, c.stream_of, c.params, c.seeds, max_replicas=c.max_replicas,
                              **runner_options, **c.options)
        r.assemble(m)
    return r.dataset


def engine_hits(streams, params_list, *, max_replicas: int = 1, seeds=None):
    """Generator: ``hits = yield from engine_hits(streams, params)`` gives ``hits[p][s]``, the per-request hit
    blocks of configuration ``p`` on stream ``s`` (int32 [n_s]). Every (configuration, stream) pair is a
    cell; stream ``s`` uses PRNG seed ``seeds[s]`` (default ``s``)."""
    S, P = len(streams), len(params_list)
    n = [int(s.n_requests) for s in streams]
    seeds = list(range(S)) if seeds is None else list(seeds)
    cells = [(p, s) for p in range(P) for s in range(S)]
    m = yield Cells(streams, [s for _, s in cells], [params_list[p] for p, _ in cells],
                    [seeds[s] for _, s in cells], max_replicas=max_replicas)
    hb = np.asarray(m.hit_blocks)
    out = [[None] * S for _ in range(P)]
    for g, (p, s) in enumerate(cells):
        out[p][s] = hb[g, : n[s]]
    return out


# ------------------------------------------------------------------------------ configuration
def defaults_class(name: str, defaults: dict) -> type:
    """A frozen dataclass of ``defaults`` (nested dicts become nested dataclasses): the study's typed
    defaults, the schema :func:`study_cfg` checks ``study:`` against."""
    fields = []
    for k, v in defaults.items():
        if isinstance(v, dict) and v:
            sub = defaults_class(f"{name}_{k}", v)
            fields.append((k, sub, field(default_factory=sub)))
        elif isinstance(v, (dict, list)):
            fields.append((k, type(v), field(default_factory=lambda v=v: json.loads(json.dumps(v)))))
        else:
            fields.append((k, Any if v is None else type(v), field(default=v)))
    return dataclasses.make_dataclass(name, fields, frozen=True)


def _as_dict(defaults) -> dict:
    if dataclasses.is_dataclass(defaults):
        return {f.name: _as_dict(getattr(defaults, f.name)) if dataclasses.is_dataclass(getattr(defaults, f.name))
                else getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    return dict(defaults)


def study_cfg(cfg, defaults) -> dict:
    """``cfg.study`` merged over ``defaults`` (a dict or a dataclass from :func:`defaults_class`; nested
    dicts merge; an unknown key is an error naming it; the study checks the values)."""
    defaults = _as_dict(defaults() if isinstance(defaults, type) else defaults)
    given = cfg.get("study") if hasattr(cfg, "get") else None
    given = OmegaConf.to_container(given, resolve=True) if given is not None and not isinstance(given, dict) else (
        given or {})

    def merge(d, g, where):
        out = dict(d)
        for k, v in g.items():
            if k not in d:
                raise StudyError(f"{where}{k}: unknown key; known keys are {sorted(d)}")
            if isinstance(d[k], dict) and isinstance(v, dict) and d[k]:
                out[k] = merge(d[k], v, f"{where}{k}.")
            else:
                out[k] = v  # values are checked by the study, with its own messages
        return out

    return merge(defaults, given, "study.")


def seeds(cfg) -> list[int]:
    """The run's seeds: ``seed`` .. ``seed + seeds - 1``."""
    s0 = int(cfg.get("seed", 0) if hasattr(cfg, "get") else 0)
    n = int(cfg.get("seeds", 1) if hasattr(cfg, "get") else 1)
    if n < 1:
        raise StudyError("seeds must be >= 1")
    return [s0 + i for i in range(n)]


def grid_lists(cfg, defaults: dict, study: str) -> dict:
    """A study's own grid: ``defaults`` with the ``grid.*`` lists the run gives (a key set to None, one of the
    sweep's own grid keys left unset, is skipped); an unknown key or an empty or non-list value is a one-line
    :class:`StudyError` naming the key and the ``study``'s grid."""
    g = dict(defaults)
    given = cfg.get("grid") if hasattr(cfg, "get") else None
    if given is None:
        return g
    given = OmegaConf.to_container(given, resolve=True) if not isinstance(given, dict) else given
    for k, v in given.items():
        if v is None:
            continue
        if k not in g:
            raise StudyError(f"grid.{k}: unknown key; the {study} grid has {sorted(g)}")
        if not isinstance(v, (list, tuple)) or not v:
            raise StudyError(f"grid.{k}: must be a non-empty list")
        g[k] = list(v)
    return g


def positive_list(name, v, *, integer=False) -> list:
    """A non-empty list of distinct positive numbers (the message names ``name``)."""
    if not isinstance(v, (list, tuple)) or not v:
        raise StudyError(f"{name} must be a non-empty list")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise StudyError(f"{name}: elements must be positive numbers, got {x!r}")
        out.append(int(x) if integer else float(x))
    if len(set(out)) != len(out):
        raise StudyError(f"{name} has repeated values: {v}")
    return out


# ------------------------------------------------------------------------------ dataset attributes
def common_attrs(cfg, kind: str, t0: float, extra: dict | None = None) -> dict:
    """The attributes every study dataset carries (kind, config, versions, wall time)."""
    a = dict(
        title=f"cacheresearch study: {cfg.get('name', kind)}",
        experiment=str(cfg.get("name", kind)),
        description=str(cfg.get("description", "") or ""),
        study_kind=kind,
        config=OmegaConf.to_yaml(cfg, resolve=True) if not isinstance(cfg, dict) else json.dumps(cfg),
        cacheresearch_version=__version__,
        jax_version=jax.__version__,
        jax_backend=jax.default_backend(),
        wall_time_s=float(time.perf_counter() - t0),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    a.update(extra or {})
    return a


def doc(ds: xr.Dataset, docs: dict):
    """``long_name`` and ``units`` of the variables named in ``docs`` ({var: (long name, units)})."""
    for v, (ln, u) in docs.items():
        if v in ds:
            ds[v].attrs.update(long_name=ln, units=u)


# ------------------------------------------------------------------------------ text
def pct(x, d=1) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * float(x):.{d}f}%"


def usd(x) -> str:
    if not np.isfinite(x):
        return "n/a"
    v = round(float(x))
    return f"-${-v}" if v < 0 else f"${v}"


def table(rows):
    """Rows (the first is the header) as aligned text."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def header(ds) -> list[str]:
    """The first lines of a summary: experiment, description, timings, versions."""
    a = ds.attrs
    lines = [f"experiment: {a.get('experiment', '?')}" + (f" — {a['description']}" if a.get("description") else "")]
    t = f"time: {a.get('wall_time_s', 0):.1f} s wall"
    if "simulate_time_s" in a:
        t += f" (simulate {a['simulate_time_s']:.1f} s"
        t += f", workloads {a['build_time_s']:.1f} s)" if "build_time_s" in a else ")"
    lines.append(t + f"; jax {a.get('jax_version', '?')} on {a.get('jax_backend', '?')}, cacheresearch "
                     f"{a.get('cacheresearch_version', '?')}")
    return lines


# ------------------------------------------------------------------------------ figures
def fig(w=10.0, h=4.5):
    """A matplotlib figure on the Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    f = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(f)
    return f


def errbar(ax, x, y, lo, hi, **kw):
    y, lo, hi = (np.asarray(v, dtype=float) for v in (y, lo, hi))
    ax.errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], fmt="o", ms=4, capsize=3, **kw)


def distinct_colours(n: int) -> list:
    """``n`` colours no two alike: matplotlib's tab10 up to 10, tab20 up to 20, then evenly spaced hues."""
    from matplotlib import colormaps  # noqa: PLC0415

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["hsv"](i / n) for i in range(n)]


def overlapping_groups(curves: dict, rel_tol: float = 0.005, log: bool = False) -> list:
    """Series that would hide each other on a figure, grouped: ``[(names, values), ...]`` in first-seen order,
    a series joining the first group whose values all lie within ``rel_tol`` of the panel's range (of log10
    values with ``log``) of its own; NaNs match NaNs. One line per group, labelled with all its names, keeps
    the legend to the series a reader can see."""
    vals = {k: np.asarray(v, dtype=float) for k, v in curves.items()}
    tr = {k: (np.log10(np.where(v > 0, v, np.nan)) if log else v) for k, v in vals.items()}
    fin = np.concatenate([v[np.isfinite(v)].ravel() for v in tr.values()] or [np.zeros(1)])
    span = float(fin.max() - fin.min()) if fin.size else 0.0
    tol = rel_tol * (span if span > 0 else 1.0)
    groups: list = []
    for k, v in tr.items():
        for g in groups:
            ref = tr[g[0][0]]
            if ref.shape == v.shape and np.allclose(ref, v, rtol=0.0, atol=tol, equal_nan=True):
                g[0].append(k)
                break
        else:
            groups.append(([k], vals[k]))
    return groups

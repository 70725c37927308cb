"""A composed configuration checked before any engine is imported or any work starts: names, files, traces.

:func:`precheck` returns one line naming the key and what is wrong (or None). It reads the configuration
(OmegaConf) and the name lists of :mod:`cacheresearch.shell.names`, never a registry, so the command line
refuses a bad input in well under 2 s (``python -m cacheresearch.bench.refusals`` measures it): the entry
points (``python -m cacheresearch.sweep``, ``cacheresearch sweep``) call it through
:func:`cacheresearch.shell.overrides.check_overrides` before they import the shell, and
:func:`cacheresearch.shell.sweep.run` calls it again first thing (a multirun's jobs, ``run_experiment``).

What it checks:

* ``kind`` names a study; for the grid: ``workload.source``, every policy (``cache.policy``, ``grid.policy``)
  and router (``fleet.router``, ``grid.router``: a rule, a preset or a ``fleet.variants`` name), layout;
  everywhere: ``replica.scheduler`` / ``step_model``, ``engine.backend``, ``fleet.latency``;
* every input file the run will read exists: ``trace.path`` (and that a run that needs a trace has one),
  a study's ``study.trace.path``, ``study.trace_path``, each of ``study.traces``, ``workload.fitted.path``,
  ``llmd.inference_perf``, each of ``llmd.epp``, a ``replica.model`` that is a ``config.json``; a missing
  file is named with the key to set and, for the traces the project's experiments use, where to get them;
* every trace's first :data:`HEAD_REQUESTS` requests load (format, fields, and the block size: given, or
  inferred): a wrong block size or a malformed line is one line naming the file, the line and the key to set,
  before the first chunk runs. The whole trace is read when the run loads it, still before any work.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from cacheresearch.shell import names as N

__all__ = ["precheck", "trace_inputs", "HEAD_REQUESTS", "TRACE_STUDIES", "KNOWN_TRACES"]

#: Requests of each trace read by the check (its format, fields and block size); the run reads them all.
HEAD_REQUESTS = 200
#: Studies that read one trace (``study.trace.*``, else the top-level ``trace.*`` keys).
TRACE_STUDIES = ("fit", "ttl_trace", "mooncake_fig9", "mooncake_fig10", "mooncake_table1")
SOURCES = ("fleet", "design", "trace", "tenant", "fitted")
LAYOUTS = ("stable", "timestamp_top")
#: Where the traces the experiments' pages name come from (none is bundled: 1 MB and 30 MB; tests/fixtures holds
#: small ones), by file name: a missing one is named with its source.
KNOWN_TRACES = {
    "mooncake_synthetic_trace.jsonl": "Mooncake's FAST'25 synthetic trace, github.com/kvcache-ai/Mooncake "
                                      "FAST25-release/traces (Mooncake JSONL, 512-token blocks)",
    "agentic_coding_sessions.jsonl": "the coding-agent trace: WEKA kv-cache-tester's sessions, github.com/callanjfox/"
                                     "kv-cache-tester traces/, as Mooncake JSONL with 64-token blocks "
                                     "(docs/experiments/tiers.md)",
}
TRACE_HINT = "a Mooncake or Bailian JSONL file; e.g. tests/fixtures/mini_mooncake.jsonl"


def _get(cfg, key: str, default=None):
    v = OmegaConf.select(cfg, key, default=default)
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def _values(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [] if v is None else [v]


def _names(cfg) -> str | None:
    """The names a run is configured with, against :mod:`cacheresearch.shell.names`."""
    kind = str(_get(cfg, "kind", "grid") or "grid")
    if kind not in N.STUDY_NAMES:
        return f"kind: unknown study {kind!r}; choose one of {sorted(N.STUDY_NAMES)}"
    for key, allowed in (("replica.scheduler", N.SCHEDULER_NAMES), ("engine.backend", N.BACKEND_NAMES),
                         ("fleet.latency", N.LATENCY_PRESET_NAMES), ("replica.step_model", N.STEP_PRESET_NAMES)):
        v = _get(cfg, key)
        if v is not None and str(v) not in allowed:
            return f"{key}={v!r}: choose one of {list(allowed)}"
    if kind != "grid":
        return None  # a study checks its own grid (its routers may be its own: experiment=tiers)
    source = _get(cfg, "workload.source", "fleet")
    if source not in SOURCES:
        return f"workload.source: unknown source {source!r}; choose one of {list(SOURCES)}"
    for key in ("cache.policy", "grid.policy"):
        for v in _values(_get(cfg, key)):
            if v not in N.policy_names():
                return f"{key}: unknown policy {v!r}; choose one of {sorted(N.policy_names())}"
    variants = _get(cfg, "fleet.variants") or {}
    for key in ("fleet.router", "grid.router"):
        for v in _values(_get(cfg, key)):
            if v not in N.ROUTER_NAMES and v not in N.PRESET_NAMES and v not in variants:
                return (f"{key}: unknown router {v!r}: choose a rule {sorted(N.ROUTER_NAMES)}, a preset "
                        f"{sorted(N.PRESET_NAMES)} or a name under fleet.variants {sorted(variants)}")
    for v in _values(_get(cfg, "grid.layout")):
        if v not in LAYOUTS:
            return f"grid.layout: unknown layout {v!r}; choose one of {list(LAYOUTS)}"
    return None


def _path(v) -> Path:
    """A path of the configuration: relative to the directory the command runs in."""
    p = Path(str(v)).expanduser()
    return p if p.is_absolute() else Path(os.path.normpath(Path(os.getcwd()) / p))


def _trace_spec(cfg, key: str) -> dict:
    """``{path, format, block_tokens, max_requests}`` of the trace at ``key`` (``trace``, ``study.trace``), the
    top-level ``trace.*`` keys filling what a study's leaves unset (as the trace studies read them)."""
    spec = dict(_get(cfg, key) or {})
    top = _get(cfg, "trace") or {}
    if key != "trace":
        for k in ("path", "format", "block_tokens", "max_requests", "sort"):
            if spec.get(k) in (None, "auto", False) and top.get(k) is not None:
                spec[k] = top[k]
    return spec


def trace_inputs(cfg) -> list[tuple[str, dict, str, str]]:
    """The traces a run will read: ``(key, {path, format, block_tokens, max_requests}, how to set its block size,
    what to do without it)``; ``path`` None where the run needs a trace and none is set."""
    kind = str(_get(cfg, "kind", "grid") or "grid")
    if kind == "grid" and _get(cfg, "workload.source") == "trace":
        return [("trace.path", _trace_spec(cfg, "trace"), "set trace.block_tokens=N",
                 f"workload.source=trace needs trace.path=FILE ({TRACE_HINT})")]
    if kind in TRACE_STUDIES:
        key = "study.trace.path" if (_get(cfg, "study.trace") or {}).get("path") else "trace.path"
        how = f"set {key.replace('.path', '.block_tokens')}=N"
        return [(key, _trace_spec(cfg, "study.trace"), how,
                 f"experiment={_get(cfg, 'name', kind)} needs trace.path=FILE ({TRACE_HINT})")]
    if kind == "tiers" and "agent" in (_get(cfg, "study.workloads") or ["design", "agent"]):
        t = dict(_get(cfg, "study.trace") or {})
        t.update(format="mooncake", block_tokens=(_get(cfg, "study.agent") or {}).get("block_tokens", 64))
        return [("study.trace.path", t, "set study.agent.block_tokens=N",
                 "set study.trace.path=FILE, or run without the agent workload: 'study.workloads=[design]'")]
    if kind == "disagg" and (_get(cfg, "study.trace") or {}).get("path"):
        return [("study.trace.path", dict(_get(cfg, "study.trace")), "set study.trace.block_tokens=N", "")]
    if kind == "granularity" and _get(cfg, "study.trace_path"):
        return [("study.trace_path", dict(path=_get(cfg, "study.trace_path"), format="mooncake", block_tokens=512),
                 "study.trace_path takes a Mooncake trace of 512-token blocks", "")]
    if kind == "policy_curves":
        specs = [str(s) for s in _values(_get(cfg, "study.traces"))]
        top = _get(cfg, "trace") or {}
        if not specs and top.get("path"):
            return [("trace.path", dict(top), "set trace.block_tokens=N", "")]
        if not specs:
            return [("study.traces", dict(path=None), "",
                     f"study.traces is required: 'study.traces=[PATH[:BLOCK_TOKENS],...]', or trace.path=FILE for one "
                     f"({TRACE_HINT})")]
        out = []
        for s in specs:
            path, sep, bt = s.rpartition(":") if s.rpartition(":")[2].isdigit() else (s, "", "")
            out.append((f"study.traces ({s})", dict(path=path, block_tokens=int(bt) if sep else None),
                        f"give it in study.traces as {path}:BLOCK_TOKENS", ""))
        return out
    return []


def _missing(key: str, v, hint: str) -> str:
    """A missing input file: the key, the path looked at, where a known trace comes from, what to do."""
    name = Path(str(v)).name
    src = f"; it is {KNOWN_TRACES[name]}, not bundled" if name in KNOWN_TRACES else ""
    return f"{key}: file not found: {v} (looked at {_path(v)}){src}" + (f"; {hint}" if hint else "")


def _files(cfg) -> list[tuple[str, object, str, str]]:
    """Input files other than traces: ``(key, value, what to do without it, what to do when it is missing)``."""
    kind = str(_get(cfg, "kind", "grid") or "grid")
    out = []
    if kind == "grid" and _get(cfg, "workload.source") == "fitted":
        out.append(("workload.fitted.path", _get(cfg, "workload.fitted.path"),
                    "workload.source=fitted needs workload.fitted.path=FILE (the results.nc of experiment=fit, or a "
                    "YAML / JSON model)", ""))
    llmd = _get(cfg, "llmd") or {}
    if isinstance(llmd, dict):
        bundled = "null takes the bundled benchmark's"
        if llmd.get("inference_perf") is not None:
            out.append(("llmd.inference_perf", llmd["inference_perf"], "", f"llmd.inference_perf={bundled}"))
        epp = llmd.get("epp")
        if isinstance(epp, dict):
            out += [(f"llmd.epp.{arm}", f, "", f"llmd.epp={bundled}") for arm, f in epp.items()]
    model = _get(cfg, "replica.model")
    if model is not None and str(model).endswith(".json"):
        out.append(("replica.model", model, "", "replica.model is a preset name or the path of a config.json"))
    return out


def _check_trace(key: str, spec: dict, how: str) -> str | None:
    """The trace's first requests load with its format and block size (given, or inferred from them)."""
    from cacheresearch.workload.trace import BlockSizeError, load_trace  # noqa: PLC0415 - numpy, no engine

    bt = spec.get("block_tokens")
    where = "trace" if key == "trace.path" else key
    mr = spec.get("max_requests")
    try:  # the lines the run reads, with its settings (trace.sort orders an out-of-order log)
        load_trace(_path(spec["path"]), format=str(spec.get("format") or "auto"),
                   block_tokens=None if bt is None else int(bt), sort=bool(spec.get("sort")),
                   max_requests=HEAD_REQUESTS if mr is None else max(1, min(int(mr), HEAD_REQUESTS)))
    except BlockSizeError as e:
        return f"{where}: {e}; {how}" + (" (or null: inferred)" if bt is not None and "=N" in how else "")
    except (ValueError, OSError) as e:  # TraceError: file, line, field
        return f"{where}: {e}"
    return None


def precheck(cfg) -> str | None:
    """One line naming the key and what is wrong with ``cfg`` (names, input files, traces), or None."""
    msg = _names(cfg)
    if msg:
        return msg
    for key, v, need, hint in _files(cfg):
        if v is None:
            return need
        if not _path(v).is_file():
            return _missing(key, v, hint)
    traces = trace_inputs(cfg)
    for key, spec, _, hint in traces:
        if spec.get("path") is None:
            return hint
        if not _path(spec["path"]).is_file():
            return _missing(key, spec["path"], hint if hint.startswith("set ") else "")
    for key, spec, how, _ in traces:
        msg = _check_trace(key, spec, how)
        if msg:
            return msg
    return None

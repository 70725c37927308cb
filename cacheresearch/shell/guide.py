"""What each experiment is, read from its config: the question, the command, the knobs and their defaults,
the output variables with units, the figure and the published result it is checked against.

The source of every field is a file of the repository, never a copy: ``configs/experiment/NAME.yaml`` (its
header comment, ``description``, ``grid``, ``study`` and the other keys it sets), the registered study's
typed defaults (:mod:`cacheresearch.studies`) and ``docs/experiments/variables.json`` (the variables of
each experiment's ``results.nc`` with their ``long_name`` and ``units``, recorded from small runs by
``cacheresearch docs --record``; ``tests/test_cf_attrs.py`` checks the record against fresh runs).
``cacheresearch list`` / ``show NAME`` print it; :func:`experiment_page` writes ``docs/experiments/NAME.md``
(``cacheresearch docs``; ``tests/test_docs_guide.py`` fails when a page is out of date).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from cacheresearch.shell.schema import CONFIG_DIR

__all__ = ["Experiment", "experiments", "experiment", "experiment_page", "index_page", "write_pages",
           "DOCS_DIR", "VARIABLES_FILE", "UnknownExperiment"]

REPO = CONFIG_DIR.parent
DOCS_DIR = REPO / "docs" / "experiments"
VARIABLES_FILE = DOCS_DIR / "variables.json"
#: keys of an experiment config that describe it rather than set a knob
_META = {"defaults", "name", "description", "kind", "report", "study", "grid"}


class UnknownExperiment(KeyError):
    """``NAME`` is not an experiment (the message lists the ones there are)."""

    def __str__(self):
        return str(self.args[0])


@dataclass
class Experiment:
    """One ``configs/experiment/NAME.yaml``, read without composing it."""

    name: str
    kind: str
    description: str
    question: str
    command: str
    groups: dict = field(default_factory=dict)  # config groups it picks: {"workload": "design_tenants", ...}
    grid: dict = field(default_factory=dict)  # grid axes: {key: [values]}
    settings: dict = field(default_factory=dict)  # other keys it sets, flattened: {"cache.capacity_blocks": ...}
    study: dict = field(default_factory=dict)  # study.* knobs, flattened, the study's defaults under the config's
    report: dict = field(default_factory=dict)
    variables: dict = field(default_factory=dict)  # {var: {"long_name", "units", "dims"}}, from the record


def _header(path: Path) -> tuple[str, str]:
    """The header comment of a config: (question text, the Regenerate command or '')."""
    lines, cmd, more = [], "", False
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.startswith("#"):
            break
        t = raw[1:].strip()
        if t.startswith("@package"):
            continue
        if t.startswith("Regenerate:"):
            cmd = t.split(":", 1)[1].strip()
        elif more:  # a continuation of the command: only after a line ending in a backslash
            cmd += " " + t
        else:  # a note after the command belongs to the text
            lines.append(t)
            continue
        more = cmd.endswith("\\")
        cmd = cmd.rstrip("\\").rstrip()
    return " ".join(x for x in lines if x), cmd


def _flat(d, prefix="") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _study_defaults(kind: str) -> dict:
    if kind == "grid":
        return {}
    import dataclasses  # noqa: PLC0415

    from cacheresearch import studies  # noqa: PLC0415

    st = studies.REGISTRY.get(kind)
    if st is None or st.defaults is None:
        return {}

    def as_dict(obj):
        return {f.name: as_dict(getattr(obj, f.name)) if dataclasses.is_dataclass(getattr(obj, f.name))
                else getattr(obj, f.name) for f in dataclasses.fields(obj)}

    return as_dict(st.defaults())


def _variables() -> dict:
    return json.loads(VARIABLES_FILE.read_text(encoding="utf-8")) if VARIABLES_FILE.is_file() else {}


def experiment(name: str, *, variables: dict | None = None, defaults: bool = True) -> Experiment:
    """The experiment ``name`` (an :class:`UnknownExperiment` error lists the others); ``defaults=False``
    leaves out the study's typed defaults (no import of the studies: what ``cacheresearch list`` needs)."""
    path = CONFIG_DIR / "experiment" / f"{name}.yaml"
    if not path.is_file():
        raise UnknownExperiment(f"unknown experiment {name!r}; choose one of {names()}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    question, cmd = _header(path)
    kind = str(raw.get("kind") or "grid")
    groups = {}
    for d in raw.get("defaults") or []:
        if isinstance(d, dict):
            for k, v in d.items():
                groups[k.replace("override ", "").strip().lstrip("/")] = v
    study = _flat(_study_defaults(kind)) if defaults else {}
    study.update(_flat(raw.get("study") or {}))
    settings = {k: v for k, v in _flat({k: v for k, v in raw.items() if k not in _META}).items()}
    var = (_variables() if variables is None else variables).get(name, {})
    return Experiment(name=name, kind=kind, description=str(raw.get("description") or ""), question=question,
                      command=cmd or f"python -m cacheresearch.sweep experiment={name} hydra.run.dir=OUT",
                      groups=groups, grid=dict(raw.get("grid") or {}), settings=settings, study=study,
                      report=dict(raw.get("report") or {}), variables=var)


def names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def experiments(*, defaults: bool = True) -> list[Experiment]:
    v = _variables()
    return [experiment(n, variables=v, defaults=defaults) for n in names()]


# ------------------------------------------------------------------------------ text
def _val(v) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)
    return s.replace("|", "\\|")


#: report keys shown with the knobs (they change the summary, not the results)
_REPORT_KNOBS = {"slo_s": "s: the SLO on TTFT p99 the summary's answers judge by"}


def _inputs(e: Experiment) -> list[str]:
    """The input files the command needs that are not bundled, each with where it comes from."""
    from cacheresearch.shell.precheck import KNOWN_TRACES  # noqa: PLC0415 - the standard library and OmegaConf

    text = " ".join([e.command] + [str(v) for v in e.study.values()] + [str(v) for v in e.settings.values()])
    sample = {"agentic_coding_sessions.jsonl": "tests/fixtures/mini_agent.jsonl"}
    return [f"{n}: {src}; not bundled: download it, or point the key at your own trace (a small sample ships as "
            f"{sample.get(n, 'tests/fixtures/mini_mooncake.jsonl')})" for n, src in KNOWN_TRACES.items() if n in text]


def _knob_rows(e: Experiment) -> list[tuple[str, str]]:
    rows = [(f"grid.{k}", _val(v)) for k, v in e.grid.items()]
    rows += [(f"report.{k}", f"{_val(e.report[k])} ({_REPORT_KNOBS[k]})") for k in _REPORT_KNOBS if k in e.report]
    rows += [(f"study.{k}", _val(v)) for k, v in e.study.items()]
    rows += [(k, _val(v)) for k, v in e.settings.items()]
    rows += [(g, _val(v)) for g, v in e.groups.items()]
    return rows


def _published(e: Experiment) -> str:
    src = e.report.get("source")
    pub = e.report.get("published")
    if not (src or pub):
        return ""
    out = [f"Source: {src}." if src else ""]
    for p in pub or []:
        vals = ", ".join(f"{k} = {v}" for k, v in p.items() if k not in ("label", "select"))
        sel = ", ".join(f"{k}={v}" for k, v in (p.get("select") or {}).items())
        out.append(f"- {p.get('label', sel)}" + (f" ({sel})" if sel else "") + (f": {vals}" if vals else ""))
    return "\n".join(x for x in out if x)


def show_text(e: Experiment) -> str:
    """``cacheresearch show NAME``: the plain-text form of the page."""
    out = [f"{e.name}: {e.description}", "", e.question, "", f"command: {e.command}"]
    out += [f"needs: {x}" for x in _inputs(e)]
    out += [f"study kind: {e.kind}", "",
           "knobs (defaults; any can be set on the command line, a grid.* key given as a list is an axis):"]
    rows = _knob_rows(e)
    w = max((len(k) for k, _ in rows), default=0)
    out += [f"  {k.ljust(w)}  {v}" for k, v in rows] or ["  (none)"]
    out += ["", "output variables (results.nc):"]
    if e.variables:
        w = max(len(v) for v in e.variables)
        out += [f"  {v.ljust(w)}  [{a.get('units', '')}] {a.get('long_name', '')}" for v, a in e.variables.items()]
    else:
        out.append("  (not recorded: cacheresearch docs --record)")
    pub = _published(e)
    if pub:
        out += ["", "checked against:", pub]
    return "\n".join(out)


def _page_link(e: Experiment) -> str:
    p = REPO / "experiments" / f"{e.name}.md"
    return f"[experiments/{e.name}.md](../../experiments/{e.name}.md)" if p.is_file() else ""


def experiment_page(e: Experiment) -> str:
    """``docs/experiments/NAME.md``, generated (``cacheresearch docs``)."""
    needs = [f"Needs {x}." for x in _inputs(e)]
    out = [f"# `experiment={e.name}`", "", "<!-- generated by `cacheresearch docs` from "
           f"configs/experiment/{e.name}.yaml; edit the config, then regenerate -->", "",
           f"**{e.description}**", "", "## The question", "", e.question or e.description, "",
           "## The command", "", "```bash", e.command, "```", ""] + needs + ([""] if needs else []) + [
           f"Study kind: `{e.kind}`" + (" (a product grid over the `grid.*` axes)" if e.kind == "grid" else "")
           + f". Inspect it with `cacheresearch show {e.name}`.", "",
           "## Knobs and their defaults", "",
           "Any key can be set on the command line (`KEY=VALUE`); a `grid.*` key given as a list is an axis "
           "of the dataset.", "", "| key | default |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in _knob_rows(e)] or ["| (none) | |"]
    out += ["", "## Output variables", "",
            "`results.nc` (netCDF, open with `xarray.open_dataset`); every variable carries `long_name` and "
            "`units` (CF).", ""]
    if e.variables:
        out += ["| variable | dimensions | units | long name |", "|---|---|---|---|"]
        for v, a in e.variables.items():
            dims = ", ".join(a.get("dims", [])) or "-"
            ln = str(a.get("long_name", "")).replace("|", "\\|")
            out.append(f"| `{v}` | {dims} | `{a.get('units', '')}` | {ln} |")
    else:
        out.append("Not recorded (the experiment needs inputs the record run does not have).")
    out += ["", "## Reading the figure", "",
            "`figure.png` in the run directory draws the summary's variables against the first axis; "
            "`summary.txt` states the answer in words. "
            + (f"Report: `{e.report.get('kind')}`. " if e.report.get("kind") else ""), ""]
    pub, link = _published(e), _page_link(e)
    out += ["## Checked against", ""]
    out.append(pub if pub else "No published number is attached to this config.")
    if link:
        out += ["", f"Results page (published figure, ours, the mechanism of any difference): {link}."]
    return "\n".join(out).rstrip() + "\n"


def index_page(exps: list[Experiment]) -> str:
    out = ["# Experiments", "", "<!-- generated by `cacheresearch docs`; edit configs/experiment/*.yaml -->", "",
           "| experiment | kind | the question, in one line |", "|---|---|---|"]
    out += [f"| [`{e.name}`]({e.name}.md) | `{e.kind}` | {e.description.replace('|', '/')} |" for e in exps]
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    """Every generated page: {file name under docs/experiments/: text}."""
    exps = experiments()
    out = {f"{e.name}.md": experiment_page(e) for e in exps}
    out["README.md"] = index_page(exps)
    return out


def write_pages(directory: Path = DOCS_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, text in pages().items():
        p = directory / fname
        p.write_text(text, encoding="utf-8")
        written.append(p)
    return written

"""Docs that run: every shell command of README.md, docs/*.md and the ``cacheresearch show`` pages (the commands of
``docs/experiments/*.md``) is executed as a new user would, from a fresh directory with no ``../shared`` beside it,
and every Python snippet of the docs runs against the outputs it describes (issue 47).

How each command is run is decided by :func:`plan` from the command's text, and the test fails on a command no rule
covers, so a new command in the docs is either run or named here with the reason it is not:

* ``run``: executed as written (placeholders: ``OUT`` a fresh directory, ``TRACE`` the bundled
  ``tests/fixtures/mini_mooncake.jsonl``, ``A`` / ``B`` the bundled diff prompts), in the default suite where it
  takes seconds; the sweeps of the default suite add small sizes (:data:`SMALL`; the pages allow any key on the
  command line), the same commands at their documented sizes run under ``-m slow``;
* ``refused``: it needs an input that is not bundled (a ``../shared`` trace, ``experiment=tiers``' agent trace, a
  trace for ``replay``): it must fail at once, exit status 2, with one line naming the key and, for a known trace,
  where to get it;
* ``skip``: the test suite itself, a cluster launcher (Slurm, a Ray cluster), a template (``ARGS``,
  ``experiment=NAME``, ``[--quick]``): listed with the reason.

``python -m pytest tests/test_docs_run.py -n 0 -rA`` prints the list. The default part took 1 min 4 s on 2 quiet cores
with a warm compile cache, against 3 min 2 s when each ``cacheresearch show`` page and the getting-started routing
run had a process of their own (2026-12-07; about twice that on busy cores). The slow part (``-m slow``) runs every
experiment at its documented size: 51 min 47 s on 2 busy cores (2026-12-07), 36 min of it the benchmarks
(``bench.vllm`` 695 s of the 900 s a command may take).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cacheresearch.shell import guide

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
#: the pages whose commands run (the experiment pages are generated from the configs: their commands are the
#: ``cacheresearch show`` pages')
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT_S = 900
#: small sizes a test adds to a documented sweep in the default suite (any key can be set on the command line)
SMALL_ROUTING = ["workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640", "workload.tenant.n_requests=150",
                 "fleet.prefix_blocks=40", "fleet.replicas=4", "engine.chunk_runs=4"]
SMALL = {
    "python -m cacheresearch.sweep": SMALL_ROUTING + ["grid.router=[random,prefix_hash,kubeai_chwbl,preble]"],
    "cacheresearch sweep": SMALL_ROUTING + ["grid.router=[random,preble]", "grid.capacity_blocks=[800]"],
    "python -m cacheresearch.sweep experiment=routing 'grid.router=[random,llmd_precise]' 'grid.rate_per_s=[8,32]' "
    "hydra.run.dir=OUT": SMALL_ROUTING,
    "python -m cacheresearch.sweep experiment=seed_fleet seeds=2 cache.capacity_blocks=800 "
    "hydra.run.dir=out/seed_fleet": [],
    "python -m cacheresearch.sweep experiment=replay trace.path=TRACE.jsonl 'grid.capacity_blocks=[1000,10000]' "
    "hydra.run.dir=OUT": [],
}

#: what the slow part adds to a documented benchmark whose full form is a measurement (``benchmarks/``), not a docs
#: check: ``bench.policies`` in full ran past :data:`TIMEOUT_S` on 2 busy cores, its ``--quick`` form (documented in
#: its docstring) took 6 min 22 s (2026-12-07)
SLOW_SIZES = {"python -m cacheresearch.bench.policies": ["--quick"]}


# ------------------------------------------------------------------------------ the commands
def _fenced(text: str) -> list[str]:
    out = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        buf = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                buf += line.rstrip()[:-1] + " "
                continue
            out.append(buf + line)
            buf = ""
    return out


def _inline(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [m for m in re.findall(r"`([^`\n]+)`", text)
            if re.match(r"(python -m cacheresearch|cacheresearch (list|show|sweep|bench|diff|docs)\b)", m)]


def _clean(cmd: str) -> str:
    """One command: the install step and a trailing comment dropped, spaces collapsed."""
    cmd = re.sub(r"^pip install -e \S+ && ", "", cmd.strip())
    cmd = re.sub(r"\s+#\s.*$", "", cmd)
    return " ".join(cmd.split())


def doc_commands() -> dict[str, str]:
    """{command: where it is written} for README, docs/*.md and every ``cacheresearch show`` page."""
    out: dict[str, str] = {}
    for f in DOC_FILES:
        text = f.read_text(encoding="utf-8")
        for c in _fenced(text) + _inline(text):
            c = _clean(c)
            if c and not c.startswith("#"):
                out.setdefault(c, f.relative_to(REPO).as_posix())
    for e in guide.experiments(defaults=False):
        out.setdefault(_clean(e.command), f"cacheresearch show {e.name}")
        out.setdefault(f"cacheresearch show {e.name}", "README.md (cacheresearch show NAME)")
    return out


SKIP = [  # (pattern, reason)
    (r"pytest", "the test suite itself"),
    (r"^srun |hydra/launcher=(slurm|ray_cluster)", "needs a cluster (Slurm, a running Ray cluster)"),
    (r"\bARGS\b|experiment=NAME\b|\[--|show NAME\b", "a template (its instances are run)"),
    (r"^cacheresearch docs\b", "regenerates the repository's own pages (test_docs_guide, test_compatibility, "
                                "test_cf_attrs keep them current)"),
    (r"^python -m cacheresearch\.bench$", "the whole benchmark (hours on 2 cores); its --quick form runs"),
]
REFUSED = [r"\.\./shared/", r"^python -m cacheresearch\.sweep experiment=tiers hydra\.run\.dir=OUT$",
           r"^python -m cacheresearch\.sweep experiment=replay hydra\.run\.dir=OUT$"]
FAST = [r"^cacheresearch (list|show \w+)$", r"^python -m cacheresearch\.diff ", r"^python -m cacheresearch\.routers ",
        r"^python -m cacheresearch\.studies\.policy_curves TRACE"]
#: the ``cacheresearch show NAME`` pages run in one process (:func:`test_every_show_page_runs`): each page costs the
#: imports of every study (3-6 s on 2 busy cores), 30 pages two minutes apart
SHOW = re.compile(r"^cacheresearch show (\w+)$")
#: the command whose outputs the getting-started snippet reads: run once, by the snippet's test, not twice
SNIPPET_RUN = ("python -m cacheresearch.sweep experiment=routing 'grid.router=[random,llmd_precise]' "
               "'grid.rate_per_s=[8,32]' hydra.run.dir=OUT")


def plan(cmd: str) -> tuple[str, str]:
    """(``run`` | ``slow`` | ``refused`` | ``skip``, why)."""
    for pat, why in SKIP:
        if re.search(pat, cmd):
            return "skip", why
    if any(re.search(p, cmd) for p in REFUSED):
        return "refused", "needs an input that is not bundled: must fail at once, naming the key and the source"
    if any(re.search(p, cmd) for p in FAST):
        return "run", "seconds"
    if cmd in SMALL:
        return "run", "small sizes added" if SMALL[cmd] else "as written"
    if cmd.startswith(("python -m cacheresearch", "cacheresearch ")):
        return "slow", "as written, at its documented size"
    raise AssertionError(f"no rule for the documented command {cmd!r}: add one to tests/test_docs_run.py")


COMMANDS = doc_commands()


def _cases(kinds: tuple[str, ...], slow_too: bool = False):
    out = []
    for c, where in sorted(COMMANDS.items()):
        k, why = plan(c)
        if k in kinds:
            out.append(pytest.param(c, id=c[:90]))
        if slow_too and c in SMALL and SMALL[c]:
            out.append(pytest.param(c, id="full: " + c[:84], marks=pytest.mark.slow))
    return out


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    return env


def _argv(cmd: str, tmp: Path, extra: list[str]) -> list[str]:
    subs = {"OUT": str(tmp / "out"), "TRACE.jsonl": str(FIXTURES / "mini_mooncake.jsonl"),
            "TRACE": str(FIXTURES / "mini_mooncake.jsonl"), "A.json": str(FIXTURES / "diff_prompt_a.json"),
            "B.json": str(FIXTURES / "diff_prompt_b.json"), "A": str(FIXTURES / "diff_prompt_a.json"),
            "B": str(FIXTURES / "diff_prompt_b.json")}
    argv = []
    for tok in shlex.split(cmd):
        k, eq, v = tok.partition("=")
        if eq and v in subs:
            tok = f"{k}={subs[v]}"
        elif tok in subs and not eq:
            tok = subs[tok]
        elif k == "hydra.run.dir":  # the run directory a page names (OUT, out/NAME): a fresh one
            tok = f"{k}={tmp / 'out'}"
        elif eq and v.startswith("OUT/"):
            tok = f"{k}={tmp / 'out' / v[4:]}"
        argv.append(tok)
    if argv[:1] == ["cacheresearch"]:
        argv = [sys.executable, "-m", "cacheresearch.shell.cli"] + argv[1:]
    elif argv[:2] == ["python", "-m"]:
        argv[0] = sys.executable
    is_sweep = "cacheresearch.sweep" in argv or argv[3:4] == ["sweep"]
    if is_sweep and not any(a.startswith("hydra.run.dir=") for a in argv):
        argv.append(f"hydra.run.dir={tmp / 'out'}")
    return argv + extra


def _fresh(tmp_path: Path) -> Path:
    """A working directory with no ``../shared`` beside it."""
    cwd = tmp_path / "clone"
    cwd.mkdir()
    assert not (cwd.parent / "shared").exists()
    return cwd


def run_doc(cmd: str, tmp_path: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    cwd = _fresh(tmp_path)
    if "docs/" in cmd:  # a command that writes a page: into a docs/ of its own
        (cwd / "docs").mkdir()
    return subprocess.run(_argv(cmd, tmp_path, list(extra)), cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)


# ------------------------------------------------------------------------------ tests
def test_every_documented_command_has_a_rule():
    kinds = {c: plan(c)[0] for c in COMMANDS}
    assert {"run", "slow", "refused", "skip"} == set(kinds.values())
    print("\n".join(f"{k:8s} {c}   [{COMMANDS[c]}]" for c, k in sorted(kinds.items(), key=lambda t: (t[1], t[0]))))
    names = guide.names()
    assert {f"cacheresearch show {n}" for n in names} <= set(kinds)  # every show page, run
    assert all(kinds[f"cacheresearch show {n}"] == "run" for n in names)


@pytest.mark.parametrize("cmd", _cases(("refused",)))
def test_a_command_needing_a_missing_input_fails_at_once_saying_how_to_get_it(cmd, tmp_path):
    r = run_doc(cmd, tmp_path)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert re.search(r"[\w.]+(path|traces?)\b", line) and ("=FILE" in line or "not bundled" in line), line
    if "../shared/" in cmd:  # a known trace: where it comes from
        assert "not bundled" in line and "github.com/" in line, line
    assert not (tmp_path / "out" / "results.nc").exists()


@pytest.mark.parametrize("cmd", [c for c in _cases(("run",)) if not SHOW.match(c.values[0])
                                 and c.values[0] != SNIPPET_RUN])
def test_a_documented_command_runs(cmd, tmp_path):
    r = run_doc(cmd, tmp_path, SMALL.get(cmd, []))
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    if "cacheresearch.sweep" in cmd or cmd.startswith("cacheresearch sweep"):
        out = tmp_path / "out"
        assert (out / "results.nc").is_file() and (out / "summary.txt").is_file(), r.stderr[-2000:]
    if cmd.startswith("python -m cacheresearch.routers "):  # the page it writes is the page in the repository
        page = cmd.split()[-1]
        assert (tmp_path / "clone" / page).read_text() == (REPO / page).read_text()


_SHOW_DRIVER = """
import contextlib, io, json, sys
from cacheresearch.shell import cli
out = {}
for name in sys.argv[1:]:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(["show", name])
        except SystemExit as e:
            rc = e.code
    out[name] = [rc, buf.getvalue(), err.getvalue()]
print(json.dumps(out))
"""


def test_every_show_page_runs(tmp_path):
    """Every ``cacheresearch show NAME`` of the docs, through the command's own entry point
    (``cacheresearch.shell.cli.main``), in one fresh process from a directory with no ``../shared``."""
    import json

    names = [SHOW.match(c).group(1) for c in COMMANDS if SHOW.match(c) and plan(c)[0] == "run"]
    assert set(names) == set(guide.names())
    r = subprocess.run([sys.executable, "-c", _SHOW_DRIVER, *names], cwd=_fresh(tmp_path), env=_env(),
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    pages = json.loads(r.stdout.strip().splitlines()[-1])
    for name in names:
        rc, out, err = pages[name]
        assert rc == 0, (name, err[-2000:])
        assert out.startswith(f"{name}: ") and "command: " in out, (name, out[:300])
        assert "../shared/" not in out.split("command: ")[1].splitlines()[0] or "not bundled" in out, name


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _cases(("slow",), slow_too=True))
def test_a_documented_command_runs_at_its_size(cmd, tmp_path):
    r = run_doc(cmd, tmp_path, SLOW_SIZES.get(cmd, []))
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])


# ------------------------------------------------------------------------------ snippets
def _snippets(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def _run_snippet(code: str, out: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    f = tmp_path / "snippet.py"
    f.write_text(code.replace('"OUT/', f'"{out}/'))
    return subprocess.run([sys.executable, str(f)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)


def test_every_python_snippet_of_the_docs_is_run_here():
    """Each snippet that reads a run's outputs is covered by a test below (a new one fails until it is); the others
    are code to add to the package (a router, a study: adding_a_router.md, adding_a_study.md), checked by their
    pages' own tests."""
    pages = {f.relative_to(REPO).as_posix(): sum("results.nc" in c or "open_dataset" in c for c in _snippets(f))
             for f in DOC_FILES}
    assert {k: v for k, v in pages.items() if v} == {"docs/getting-started.md": 1}, pages


def test_getting_started_snippet_reads_the_run_it_describes(tmp_path):
    """The xarray snippet against the routing run of the same page (its knob example, small sizes), then the
    page's claim that ``output.variable=token_hit_rate`` redraws the figure, on the same run directory."""
    cmd = SNIPPET_RUN
    assert cmd in COMMANDS and plan(cmd)[0] == "run"
    r = run_doc(cmd, tmp_path, SMALL[cmd])
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / "results.nc").is_file() and (out / "summary.txt").is_file(), r.stderr[-2000:]
    (code,) = _snippets(REPO / "docs" / "getting-started.md")
    s = _run_snippet(code, out, tmp_path)
    assert s.returncode == 0, s.stderr[-3000:]
    assert "llmd_precise" in s.stdout and "ttft_p99_s" not in s.stderr
    before = (out / "figure.png").read_bytes()
    r2 = subprocess.run(_argv(cmd, tmp_path, SMALL[cmd] + ["output.variable=token_hit_rate"]),
                        cwd=tmp_path / "clone", env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert (out / "figure.png").read_bytes() != before
    assert "token_hit_rate" in (out / "summary.txt").read_text().split("Answers")[1]

"""The user guide stays true: the generated experiment pages (docs/experiments/) are up to date with the configs,
the studies' defaults and the variables record; README's experiments table names every experiment with its
one line; README stays the front page (at most 150 lines, the two set-up commands first, the test and slow
commands CI and contributors use); the docs carry dates and commits, never internal step labels."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from cacheresearch.shell import guide

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# "stop 31", "this stop", and the same label inside a name ("...-stop32-quick.json", "stop_31")
STEP_LABEL = re.compile(r"\bstop[ _-]?\d+|\bthis stop\b", re.IGNORECASE)
DOC_SUFFIXES = {".md", ".rst", ".txt", ".ipynb"}
SKIP_DIRS = {".git", "outputs", "multirun", "__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "venv"}


def _repo_files() -> list[Path]:
    """The repository's files: git's tracked files where git answers, else every file outside build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [ROOT / f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if p.is_file()]
    return [p for p in files if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)]


def _labels_in_docs(root: Path, files: list[Path]) -> list[str]:
    """Every step label in a doc file's text (README, CHANGELOG, docs/, experiments/, any .md) or in any file's
    path (benchmarks/results/cpu-...-stop32-quick.json), as 'path:line: label' / 'path: label'."""
    bad = [f"{p.relative_to(root)}: {m.group(0)!r}" for p in files
           for m in STEP_LABEL.finditer(p.relative_to(root).as_posix())]
    for p in files:
        if p.suffix in DOC_SUFFIXES and p.is_file():
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines()):
                bad += [f"{p.relative_to(root)}:{i + 1}: {m.group(0)!r}" for m in STEP_LABEL.finditer(line)]
    return bad


def test_generated_pages_are_up_to_date():
    stale = [f for f, text in guide.pages().items()
             if not (guide.DOCS_DIR / f).is_file() or (guide.DOCS_DIR / f).read_text(encoding="utf-8") != text]
    assert not stale, f"regenerate: cacheresearch docs ({stale})"


def test_every_experiment_has_a_page_with_its_command_and_knobs():
    for e in guide.experiments():
        page = (guide.DOCS_DIR / f"{e.name}.md").read_text(encoding="utf-8")
        assert f"experiment={e.name}" in page and "## Knobs and their defaults" in page
        for k in e.grid:
            assert f"`grid.{k}`" in page


def test_readme_experiments_table_matches_the_configs():
    section = README.split("## Experiments\n", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.+) \|$", section, re.MULTILINE))
    want = {e.name: e.description for e in guide.experiments()}
    assert rows == want, "README's experiments table: one row per configs/experiment/*.yaml, its description"


def test_readme_is_the_front_page():
    lines = README.splitlines()
    assert len(lines) <= 150
    assert lines[2] == "```bash" and lines[3].startswith("pip install -e . && python -m cacheresearch.sweep")
    assert lines[4].startswith("pip install -e '.[test]' && python -m pytest ")
    assert "python -m pytest -m slow" in README
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert (ROOT / link).exists(), link


def test_no_internal_step_labels_in_the_docs():
    files = [p for p in _repo_files() if p.relative_to(ROOT) != Path("tests") / "test_docs_guide.py"]
    assert any(p.name == "README.md" for p in files) and any(p.parts[-2:-1] == ("results",) for p in files)
    bad = _labels_in_docs(ROOT, files)
    assert not bad, bad


def test_the_step_label_check_can_fail(tmp_path):
    assert STEP_LABEL.search("measured at stop 31") and STEP_LABEL.search("This stop, idle")
    assert STEP_LABEL.search("cpu-2core-2026-12-03-stop32-quick.json") and STEP_LABEL.search("round stop_31")
    assert not STEP_LABEL.search("a stop sign") and not STEP_LABEL.search("why a prompt stopped hitting the cache")
    assert not STEP_LABEL.search("cpu-2core-2026-12-03-quick-15c3978.json") and not STEP_LABEL.search("bus stops")
    (tmp_path / "results").mkdir()
    named = tmp_path / "results" / "cpu-2core-2026-12-03-stop32-quick.json"
    named.write_text("{}")
    page = tmp_path / "page.md"
    page.write_text("# ttl\n\nMeasured this stop on 2 cores.\n")
    clean = tmp_path / "clean.md"
    clean.write_text("Measured on 2026-12-05 at 3ea47db.\n")
    bad = _labels_in_docs(tmp_path, [named, page, clean])
    assert bad == ["results/cpu-2core-2026-12-03-stop32-quick.json: 'stop32'", "page.md:3: 'this stop'"], bad


BENCH_FILE = re.compile(r"`(?:benchmarks/results/)?((?:\.\.\.)?[\w.-]*?(?:cpu-2core|h200|policies-cpu)?[\w.-]*\.json)`")


def test_bench_files_named_in_the_docs_exist():
    """Every bench file README, CHANGELOG and docs/ name is in benchmarks/results/ (a `...-NAME.json` shorthand
    names the file ending so), so a rename cannot leave a stale name behind."""
    have = [p.name for p in (ROOT / "benchmarks" / "results").glob("*.json")]
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]
    named = {m.group(1) for p in files for m in BENCH_FILE.finditer(p.read_text(encoding="utf-8"))
             if re.search(r"(cpu-2core|h200|policies-cpu|quick|sweep64|vllm)", m.group(1))}
    assert named, "no bench file named in README / CHANGELOG / docs"
    missing = sorted(n for n in named if not any(h == n or (n.startswith("...") and h.endswith(n[3:]))
                                                 for h in have))
    assert not missing, missing

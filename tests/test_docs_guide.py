"""The user guide stays true: the generated experiment pages (docs/experiments/) are up to date with the configs,
the studies' defaults and the variables record; README's experiments table names every experiment with its
one line; README stays the front page (at most 150 lines, the two set-up commands first, the test and slow
commands CI and contributors use); the docs carry dates and commits, never internal step labels."""

from __future__ import annotations

import re
from pathlib import Path

from cacheresearch.shell import guide

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
STEP_LABEL = re.compile(r"\bstop \d+|\bthis stop\b", re.IGNORECASE)


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
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md"),
             *(ROOT / "experiments").glob("*.md")]
    bad = [f"{p.relative_to(ROOT)}:{i + 1}: {m.group(0)!r}" for p in files if p.is_file()
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()) for m in STEP_LABEL.finditer(line)]
    assert not bad, bad


def test_the_step_label_check_can_fail():
    assert STEP_LABEL.search("measured at stop 31") and STEP_LABEL.search("This stop, idle")
    assert not STEP_LABEL.search("cpu-2core-2026-12-03-stop32-quick.json") and not STEP_LABEL.search("a stop sign")

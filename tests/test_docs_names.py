"""Module names in the docs are real (issue 48): every path of a package file (``cacheresearch/core/run.py``, the
package-relative ``core/run.py``, ``tests/reference_vllm.py``) and every dotted name (``cacheresearch.core.run``,
``cacheresearch.core.run.simulate_cells``) that README.md, docs/ (generated pages included), experiments/ or the
package's own docstrings and comments name exists: the file on disk, the module's file, and a dotted name's first
attribute defined at its module's top level (read with ``ast``: nothing is imported). CHANGELOG.md is history and
keeps the names of its day. Paths into other projects (``vllm/v1/core/...``) and placeholders (``NAME.py``) are not
ours to check."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG_NAME = "cacheresearch"
#: a path of a Python file with at least one folder: ``core/run.py``, ``cacheresearch/core/run.py``
PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.py)(?![\w/])")
#: a dotted name in the package: ``cacheresearch.core.run``, ``~cacheresearch.core.run.simulate_cells``
DOTTED = re.compile(rf"(?<![\w.]){PKG_NAME}(?:\.\w+)+")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*|x|xxx|yyy|foo|my_\w+)$")


def _doc_files(root: Path) -> list[Path]:
    """README.md, docs/**/*.md, experiments/**/*.md and the package's .py files (their docstrings and comments)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "experiments").rglob("*.md")),
            *sorted((root / PKG_NAME).rglob("*.py"))]


def _subpackages(root: Path) -> set[str]:
    return {p.name for p in (root / PKG_NAME).iterdir() if (p / "__init__.py").is_file()}


def _top_dirs(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}


def path_is_real(root: Path, path: str) -> bool | None:
    """True / False: a path of this repository (from the root, or from the package for a package-relative one)
    that exists / does not; None: not ours (another project's path, a placeholder)."""
    parts = path.split("/")
    if any(PLACEHOLDER.match(p.removesuffix(".py")) for p in parts):
        return None
    if parts[0] == PKG_NAME or parts[0] in _top_dirs(root) - _subpackages(root):
        return (root / path).is_file()
    if parts[0] in _subpackages(root):
        return (root / PKG_NAME / path).is_file()
    return None


@functools.cache
def _top_names(path: Path) -> frozenset:
    """The names a module defines or imports at its top level."""
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    # a module that loads names on first use (PEP 562 __getattr__) declares them in __all__ or a tuple / dict of
    # string constants at its top level (cacheresearch/__init__.py's _LAZY, cacheresearch/sweep.py's _SHELL)
    if "__getattr__" in out:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                out |= {c.value for c in ast.walk(node.value)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.isidentifier()}
    return frozenset(out)


def dotted_is_real(root: Path, name: str) -> bool:
    """``cacheresearch.a.b[.attr...]``: its longest module prefix is a module on disk, and the next part (if any) a
    name that module defines at its top level or a module of its package."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        init = base / "__init__.py"
        found = base.with_suffix(".py") if base.with_suffix(".py").is_file() else init if init.is_file() else None
        if found is None:
            continue
        return i == len(parts) or parts[i] in _top_names(found)
    return False


def unreal_names(root: Path, files: list[Path]) -> list[str]:
    """'file:line: name' for every path or dotted name in ``files`` that names nothing of the repository."""
    bad = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            bad += [f"{f.relative_to(root)}:{n}: {m.group(1)}" for m in PATH.finditer(line)
                    if path_is_real(root, m.group(1)) is False]
            bad += [f"{f.relative_to(root)}:{n}: {m.group(0)}" for m in DOTTED.finditer(line)
                    if not dotted_is_real(root, m.group(0))]
    return bad


def test_module_names_in_the_docs_exist():
    files = _doc_files(ROOT)
    assert ROOT / "README.md" in files and any(f.parent.name == "experiments" for f in files)
    assert ROOT / "CHANGELOG.md" not in files
    bad = unreal_names(ROOT, files)
    assert not bad, f"docs name modules that do not exist: {bad}"


def test_the_name_check_can_fail(tmp_path):
    pkg = tmp_path / PKG_NAME / "core"
    pkg.mkdir(parents=True)
    (tmp_path / PKG_NAME / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "run.py").write_text("from x import y as simulate\n\ndef simulate_cells():\n    pass\n\nBACKENDS = ()\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "reference.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("`core/run.py`, `cacheresearch/core/run.py` and `tests/reference.py` exist; `core/queue.py`\n"
                    "and `cacheresearch/core/batch.py` do not. `cacheresearch.core.run.simulate_cells`,\n"
                    ":mod:`~cacheresearch.core.run`, `cacheresearch.core.run.BACKENDS` and `cacheresearch.core` are\n"
                    "real; `cacheresearch.core.queue`, `cacheresearch.report`, `cacheresearch.core.run.nothing` not.\n"
                    "Not ours: `vllm/v1/core/kv_cache_utils.py`, `notebooks/NAME.py`, `cacheresearch/routers/NAME.py`\n"
                    "`tests/missing.py` is missing.\n")
    assert unreal_names(tmp_path, [page]) == [
        "page.md:1: core/queue.py", "page.md:2: cacheresearch/core/batch.py", "page.md:4: cacheresearch.core.queue",
        "page.md:4: cacheresearch.report", "page.md:4: cacheresearch.core.run.nothing", "page.md:6: tests/missing.py"]

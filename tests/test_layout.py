"""The package's shape: no import circles, no private names imported across modules, no function over 120
lines, the top level kept to the entry points (issue 17). Read from the source with ``ast``, so a
regression fails here before anyone reads the code."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "cacheresearch"
MAX_FUNCTION_LINES = 120
TOP_LEVEL = {"__init__.py", "engine.py", "sweep.py"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(PKG.rglob("*.py"))}


def _imports(tree: ast.Module, known: set[str]):
    """(module imported, names imported) for every import in ``tree`` (functions' bodies included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = tuple(a.name for a in node.names)
            # `from pkg import submodule` is an import of the submodule
            subs = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in known]
            for s in subs:
                yield s, ()
            rest = tuple(n for n in names if f"{node.module}.{n}" not in known)
            if rest:
                yield node.module, rest


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, tree in mods.items():
        for target, _ in _imports(tree, known):
            # importing a.b.c imports a.b's __init__ too, but that is the package's business, not an arrow
            if target in known and target != m:
                graph[m].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, f"import circles: {found}"


def test_no_private_names_across_modules():
    mods = _modules()
    known = set(mods)
    bad = []
    for m, tree in mods.items():
        for target, names in _imports(tree, known):
            if target.startswith("cacheresearch") and target != m:
                bad += [f"{m} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_functions_at_most_120_lines():
    long = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(PKG.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_top_level_holds_only_the_entry_points():
    files = {p.name for p in PKG.glob("*.py")}
    assert files <= TOP_LEVEL, sorted(files - TOP_LEVEL)


def _core_imports_of_backends(tree: ast.Module, package: str) -> list[str]:
    """The imports of ``cacheresearch.backends`` in ``tree`` (a module of ``package``), functions' bodies included;
    relative imports resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out += [f"line {node.lineno}: {n}" for n in names
                if n == "cacheresearch.backends" or n.startswith("cacheresearch.backends.")][:1]
    return out


def test_core_imports_no_backend():
    """core/ names no backend module (issue 48): the backends register themselves in core/registry.py."""
    bad = []
    for p in sorted((PKG / "core").rglob("*.py")):
        found = _core_imports_of_backends(ast.parse(p.read_text(encoding="utf-8")), "cacheresearch.core")
        bad += [f"{p.relative_to(PKG.parent)} {f}" for f in found]
    assert not bad, bad


def test_backend_import_finder_sees_every_form():
    src = ("def f():\n    from cacheresearch.backends import numba_vllm\n"
           "import cacheresearch.backends.numba_cache\nfrom ..backends import numba_blocks\nimport numpy\n")
    assert len(_core_imports_of_backends(ast.parse(src), "cacheresearch.core")) == 3

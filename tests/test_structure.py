"""The package's shape (issue 17's rules), read from the source: no function over 120 lines, no import
circle among the package's modules (module-level imports; a lazy import inside a function is the way
out of one), and the core rooms import none of the shell's libraries (Hydra, OmegaConf, xarray,
matplotlib)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

PKG = Path(__file__).resolve().parents[1] / "cacheresearch"
MAX_LINES = 120
CORE_ROOMS = ("analysis", "backends", "cache", "core", "fit", "metrics", "replica", "routers", "workload")
SHELL_LIBS = ("hydra", "omegaconf", "xarray", "matplotlib")


def _modules() -> dict[str, ast.Module]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(f.read_text(), filename=str(f))
    return out


def _imports(tree: ast.Module, names) -> set[str]:
    """The package modules ``tree`` imports at module level (``from pkg import sub`` names ``pkg.sub``)."""
    deps = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(names)
            deps |= subs if len(subs) == len(node.names) else subs | {node.module}
    return deps & set(names)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (scipy's strong components)."""
    names = sorted(set(graph) | {w for ws in graph.values() for w in ws})
    at = {n: i for i, n in enumerate(names)}
    rows = [at[v] for v, ws in graph.items() for _ in ws]
    cols = [at[w] for ws in graph.values() for w in ws]
    adj = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, label = connected_components(adj, directed=True, connection="strong")
    comps = [sorted(n for n, lab in zip(names, label) if lab == k) for k in np.unique(label)]
    return sorted(c for c in comps if len(c) > 1)


def test_no_function_over_120_lines():
    long = [(f"{name}.{node.name}", node.end_lineno - node.lineno + 1)
            for name, tree in _modules().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= MAX_LINES]
    assert not long, f"functions over {MAX_LINES} lines: {sorted(long, key=lambda x: -x[1])}"


def test_no_import_circles():
    mods = _modules()
    graph = {name: _imports(tree, mods) - {name} for name, tree in mods.items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_cycle_finder_finds_a_circle():
    """The check above can fail: a three-module circle and a self-contained pair are found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_core_rooms_import_no_shell_library():
    bad = []
    for name, tree in _modules().items():
        room = name.split(".")[1] if "." in name else ""
        if room not in CORE_ROOMS:
            continue
        for node in tree.body:
            top = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            bad += [(name, t) for t in top if t.split(".")[0] in SHELL_LIBS]
    assert not bad, f"core modules importing the shell's libraries: {bad}"

"""The compatibility matrix (``docs/compatibility.md``): router x view x policy x replica model x backend.

Every cell is one configuration of the fleet (2 replicas, the registry's default knobs) on a tiny tenant
workload (:func:`tiny_workload`). A cell either runs or is refused by the engine with a one-line error that
says why; :func:`check_matrix` asks the engine itself (:func:`cacheresearch.core.run.check_cells`: every check
a run makes, nothing compiled) cell by cell on each backend, and :func:`run_matrix` runs the cells that pass,
batched into a few :func:`~cacheresearch.core.run.simulate_cells` calls per replica model and backend (a call
that fails is split in halves until the failing cells stand alone). ``tests/test_compatibility.py`` keeps the
page equal to :func:`markdown` and runs the cells (the JAX engine's every cell under ``-m slow``).

A router that reads no cache reads no view: its cells have one row (view ``-``). :func:`auto_rule`: the
backend ``engine.backend=auto`` should give a lone cell on a CPU host and on an accelerator host (the test
holds :func:`~cacheresearch.core.run.check_cells` to it). The tier column (:func:`tier_column`): whether the cell
runs in a grid with a CPU tier (``tiers.cpu.capacity_blocks``: the tiered engine, :mod:`cacheresearch.tiers.fleet`),
or the one-line reason it does not; :func:`run_tier_column` runs those that do. The tiered engine's own routers
(``tier_scorer`` ...) have a table of their own (:func:`tier_matrix`).

``python -m cacheresearch.shell.compat [FILE]`` (or ``cacheresearch docs --compat``) writes the page.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.params import make_params
from cacheresearch.core.run import check_cells, simulate_cells
from cacheresearch.core.simulate import SCHEDULERS
from cacheresearch.core.stream import compile_stream
from cacheresearch.routers import CACHE_ROUTERS, ROUTERS, VIEWS
from cacheresearch.tiers import TIER_POLICIES, TIER_ROUTERS, TIER_VIEWS, make_config, run_tiers
from cacheresearch.tiers.fleet import refusal as tier_refusal
from cacheresearch.tiers.fleet import run_cells as run_tier_cells
from cacheresearch.tiers.fleet import tier_config_of
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys
from cacheresearch.workload.synthetic import tenant_workload

__all__ = ["Cell", "Outcome", "cells", "tiny_workload", "cell_params", "check_matrix", "run_matrix", "auto_rule",
           "numba_gaps", "tier_matrix", "tier_column", "run_tier_column",
           "markdown", "summary", "page", "DOC", "RUN_BACKENDS", "REPLICA_MODELS"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
#: the backends a cell can run on (``engine.backend=auto`` picks one of them per program)
RUN_BACKENDS = ("jax", "numba")
REPLICA_MODELS = SCHEDULERS
REPLICAS = 2  # replicas per cell (and the static bound)
CAPACITY = 20  # KV blocks per replica: a few requests' worth, so every policy evicts
TTL_S = 2.0  # the TTL policies' TTL
ANY_VIEW = "-"  # the view column of a router that reads no cache


@dataclass(frozen=True, order=True)
class Cell:
    """One cell of the matrix (the backend is the other axis of :func:`check_matrix`)."""

    replica: str
    router: str
    view: str  # ANY_VIEW for a router that reads no cache
    policy: str


@dataclass(frozen=True)
class Outcome:
    """A cell on one backend: ``ok`` (runs) or ``error`` (the exception's class name) and ``message``."""

    ok: bool
    error: str = ""
    message: str = ""
    missing: tuple = ()  # a BackendError's: what the numba backend does not cover of the cell

    @staticmethod
    def of(e: BaseException) -> Outcome:
        return Outcome(False, type(e).__name__, str(e), tuple(getattr(e, "missing", ())))


def cells() -> list[Cell]:
    """Every cell: replica model x router x view (one for a router that reads no cache) x policy."""
    out = []
    for replica in REPLICA_MODELS:
        for router in ROUTERS:
            for view in (VIEWS if router in CACHE_ROUTERS else (ANY_VIEW,)):
                out += [Cell(replica, router, view, policy) for policy in POLICIES]
    return out


@functools.lru_cache(maxsize=1)
def tiny_workload():
    """(workload, stream): 3 tenants, 64-token prefixes, 32-token queries, 8 output tokens, about 30 requests,
    with GIE's prompt-byte hashes (the ``gie_estimate`` view reads them)."""
    w = tenant_workload(n_tenants=3, prefix_tokens=64, query_tokens=32, rate_per_s=5.0, duration_s=5.0,
                        output_tokens=8, seed=0)
    return w, compile_stream(w, gie_hashes=gie_hashes_from_keys(w, max_blocks=16))


def cell_params(cell: Cell):
    """The cell's configuration (the registry's default knobs)."""
    view = "precise" if cell.view == ANY_VIEW else cell.view
    return make_params(cell.policy, capacity_blocks=CAPACITY, ttl_s=TTL_S, replicas=REPLICAS, router=cell.router,
                       view=view)


def _one(cell: Cell, backend: str, cpu: bool = True) -> str:
    """The backend the engine gives the lone cell under ``backend=`` (raises its refusal)."""
    _, stream = tiny_workload()
    return check_cells([stream], np.zeros(1, np.int64), [cell_params(cell)], max_replicas=REPLICAS,
                       backend=backend, cpu=cpu, scheduler=cell.replica)[0]


def check_matrix(cs: list[Cell] | None = None) -> dict[tuple[Cell, str], Outcome]:
    """{(cell, backend): outcome} from the engine's checks (every check a run makes; nothing compiled)."""
    out = {}
    for cell in cells() if cs is None else cs:
        for b in RUN_BACKENDS:
            try:
                _one(cell, b)
                out[cell, b] = Outcome(True)
            except Exception as e:  # noqa: BLE001 - every refusal is recorded (the test checks its class and text)
                out[cell, b] = Outcome.of(e)
    return out


def _finite(m, k: int) -> bool:
    """Cell ``k``'s metrics are numbers: a token hit rate in [0, 1], a TTFT mean that is finite."""
    hit = float(np.asarray(m.token_hit_rate)[k])
    ttft = float(np.asarray(m.ttft_mean_ms)[k])
    return 0.0 <= hit <= 1.0 and np.isfinite(ttft)


def _run(cs: list[Cell], backend: str, out: dict, log) -> None:
    """Run cells of one replica model on ``backend`` in one call; a call that raises is split in halves."""
    _, stream = tiny_workload()
    try:
        m, plan = simulate_cells([stream], np.zeros(len(cs), np.int64), [cell_params(c) for c in cs],
                                 np.arange(len(cs)), max_replicas=REPLICAS, backend=backend, scheduler=cs[0].replica)
    except Exception as e:  # noqa: BLE001 - isolate the failing cells
        if len(cs) == 1:
            out[cs[0], backend] = Outcome.of(e)
            return
        _run(cs[: len(cs) // 2], backend, out, log)
        _run(cs[len(cs) // 2:], backend, out, log)
        return
    if log is not None:
        log(f"{cs[0].replica} on {backend}: {plan.line()}")
    for k, c in enumerate(cs):
        out[c, backend] = Outcome(True) if _finite(m, k) else Outcome(False, "NonFinite", "metrics not finite")


def run_matrix(checks: dict, *, backends=RUN_BACKENDS, replicas=REPLICA_MODELS,
               keep: Callable[[Cell], bool] | None = None, log=None) -> dict[tuple[Cell, str], Outcome]:
    """Run the cells that pass the checks (``checks`` from :func:`check_matrix`; ``keep`` selects among them):
    one :func:`~cacheresearch.core.run.simulate_cells` call per replica model and backend, the engine grouping
    the cells into its programs. {(cell, backend): outcome}: runs with finite metrics, or the exception."""
    out: dict = {}
    for replica in replicas:
        for b in backends:
            cs = [c for (c, bb), o in checks.items() if bb == b and o.ok and c.replica == replica
                  and (keep is None or keep(c))]
            if cs:
                _run(sorted(cs), b, out, log)
    return out


# ---------------------------------------------------------------------------------------------- tiers
def _tier_cache_routers() -> list[str]:
    return [r for r in TIER_ROUTERS if r not in ROUTERS or r in CACHE_ROUTERS]


def _tier_config(router: str, view: str, policy: str):
    return make_config(gpu_blocks=CAPACITY, tiers={"cpu": {"capacity_blocks": 2 * CAPACITY, "policy": policy}},
                       replicas=REPLICAS, router=router, view="precise" if view == ANY_VIEW else view,
                       gpu_policy=policy, block_bytes=131_072 * 16, prefill_tps=2000)


def tier_matrix() -> tuple[dict[tuple[str, str, str], Outcome], dict[str, str]]:
    """The tiered engine with a CPU tier (both tiers under one policy): ({(router, view, policy): outcome} over
    its routers, views and policies, run on the tiny workload), {what: the refusal} for one policy outside
    its policies of each kind, the fleet routers it does not run and a view outside its views."""
    w, _ = tiny_workload()
    grid = [(r, v, p) for r in TIER_ROUTERS for v in (TIER_VIEWS if r in _tier_cache_routers() else (ANY_VIEW,))
            for p in TIER_POLICIES]
    res = run_tiers(w, [_tier_config(*g) for g in grid], seeds=list(range(len(grid))))
    out = {}
    for g, r in zip(grid, res, strict=True):
        ok = bool(np.all(r.hit_blocks >= 0) and np.all(r.ttft_ms >= 0))
        out[g] = Outcome(True) if ok else Outcome(False, "NonFinite", "negative hits or TTFT")
    refused = {}
    asks = [(f"policy `{p}`", (TIER_ROUTERS[0], ANY_VIEW, p)) for p in POLICIES if p not in TIER_POLICIES]
    asks += [(f"router `{r}`", (r, ANY_VIEW, "lru")) for r in ROUTERS if r not in TIER_ROUTERS]
    asks += [(f"view `{v}`", (_tier_cache_routers()[0], v, "lru")) for v in VIEWS if v not in TIER_VIEWS]
    for what, g in asks:
        try:
            _tier_config(*g)
            refused[what] = ""  # accepted: the test fails on it (a listed refusal must be one)
        except Exception as e:  # noqa: BLE001 - the refusal's text
            refused[what] = str(e)
    return out, refused


def tier_column(checks: dict, cs: list[Cell] | None = None) -> dict[Cell, Outcome]:
    """{cell: outcome} of the cell with a CPU tier in the grid (:func:`cacheresearch.tiers.fleet.refusal`; a vllm
    cell's tier runs on the numba vllm backend, so a cell that backend does not cover (``checks``) has none)."""
    out = {}
    for c in cells() if cs is None else cs:
        why = tier_refusal(cell_params(c), c.replica)
        if why is None and c.replica == "vllm" and not checks[c, "numba"].ok:
            why = ("engine.backend: the vllm replica's cpu tier runs on the numba vllm backend (tiers/vllm.py), "
                   "which does not cover this cell (its N column)")
        out[c] = Outcome(True) if why is None else Outcome(False, "TierError", why)
    return out


def run_tier_column(col: dict) -> dict[Cell, Outcome]:
    """Run the cells the tier column accepts, with a CPU tier of twice the gpu's blocks, in one call of the
    tiered engine: {cell: outcome} (finite metrics, or the exception)."""
    w, stream = tiny_workload()
    out = {}
    for replica in REPLICA_MODELS:
        cs = sorted(c for c, o in col.items() if o.ok and c.replica == replica)
        if not cs:
            continue
        ps = [cell_params(c) for c in cs]
        try:
            if replica == "vllm":
                from cacheresearch.core.params import stack_params  # noqa: PLC0415
                from cacheresearch.core.simulate import static_options  # noqa: PLC0415
                from cacheresearch.metrics.core import finalize  # noqa: PLC0415
                from cacheresearch.tiers.vllm import cpu_tier, run_stream_tiered  # noqa: PLC0415

                st = static_options(stack_params(ps), max_replicas=REPLICAS, per_request=True, scheduler="vllm",
                                    max_running=int(max(int(p.max_num_seqs) for p in ps)))
                keys = jax.vmap(jax.random.key)(np.arange(len(cs), dtype=np.uint32))
                r = run_stream_tiered(stream, ps, keys, st, [cpu_tier(capacity_blocks=2 * CAPACITY,
                                                                      block_bytes=2**21)] * len(cs))
                m = finalize(r.metrics, st)
            else:
                cfgs = [tier_config_of(p, tiers={"cpu": {"capacity_blocks": 2 * CAPACITY}}, block_bytes=2**21)
                        for p in ps]
                m, _, _ = run_tier_cells([w], [0] * len(cs), ps, list(range(len(cs))), cfgs, max_replicas=REPLICAS)
        except Exception as e:  # noqa: BLE001 - recorded: the test fails on it
            out.update({c: Outcome.of(e) for c in cs})
            continue
        out.update({c: Outcome(True) if _finite(m, k) else Outcome(False, "NotFinite", "metrics not finite")
                    for k, c in enumerate(cs)})
    return out


# ---------------------------------------------------------------------------------------------- the page
def _table_order(cell: Cell) -> tuple:
    """The tables' order: replica model, router (registry id), view, policy (registry id)."""
    return (REPLICA_MODELS.index(cell.replica), ROUTERS[cell.router], VIEWS.get(cell.view, -1),
            POLICIES[cell.policy].id)


def _reasons(checks: dict) -> dict[str, int]:
    """The JAX engine's distinct refusals, numbered in the order of the tables (row by row)."""
    out: dict[str, int] = {}
    for c in sorted({c for c, _ in checks}, key=_table_order):
        o = checks[c, "jax"]
        if not o.ok and o.message not in out:
            out[o.message] = len(out) + 1
    return out


def _entry(cell: Cell, checks: dict, reasons: dict, col: dict, treasons: dict) -> str:
    j, n, t = checks[cell, "jax"], checks[cell, "numba"], col[cell]
    return (("J" if j.ok else f"-{reasons[j.message]}") + " " + ("N" if n.ok else "-") + " "
            + ("T" if t.ok else f"-t{treasons[t.message]}"))


def _tier_reasons(col: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in sorted(col, key=_table_order):
        if not col[c].ok and col[c].message not in out:
            out[col[c].message] = len(out) + 1
    return out


def auto_rule(cell: Cell, checks: dict, cpu: bool) -> str | None:
    """The backend ``auto`` should give the lone cell: numba where it runs the cell on a CPU host, else JAX; a
    cell only numba runs on numba on any host; None where neither runs it."""
    j, n = checks[cell, "jax"].ok, checks[cell, "numba"].ok
    if n and (cpu or not j):
        return "numba"
    return "jax" if j else None


def numba_gaps(checks: dict, replica: str) -> tuple[list[str], str]:
    """(what the numba backend does not cover among ``replica``'s cells, in its own words (``BackendError.missing``
    with the router or policy it names), one of its refusals word for word)."""
    items: dict[str, None] = {}
    example = ""
    for c in sorted({c for c, _ in checks if c.replica == replica}, key=_table_order):
        o = checks[c, "numba"]
        if not o.ok and o.error == "BackendError":
            example = example or o.message
            for m in o.missing:
                items[m] = None
    return list(items), example


def summary(checks: dict) -> dict:
    """Counts: cells, cell x backend pairs that run and that are refused, cells no backend runs, JAX refusals."""
    cs = sorted({c for c, _ in checks})
    return {
        "cells": len(cs),
        "runs": sum(o.ok for o in checks.values()),
        "refused": sum(not o.ok for o in checks.values()),
        "cells_some_backend": sum(any(checks[c, b].ok for b in RUN_BACKENDS) for c in cs),
        "cells_no_backend": sum(not any(checks[c, b].ok for b in RUN_BACKENDS) for c in cs),
        "jax_reasons": len(_reasons(checks)),
    }


def _md(text: str) -> str:
    return text.replace("|", "/")


def markdown(checks: dict, tiers: tuple[dict, dict], col: dict) -> str:
    """``docs/compatibility.md`` from :func:`check_matrix`, :func:`tier_matrix` and :func:`tier_column`."""
    reasons = _reasons(checks)
    treasons = _tier_reasons(col)
    s = summary(checks)
    w, _ = tiny_workload()
    lines = [
        "# Compatibility",
        "",
        "Generated by `python -m cacheresearch.shell.compat docs/compatibility.md` (or `cacheresearch docs "
        "--compat`)",
        "from the engine's own checks; `tests/test_compatibility.py` fails when this page and the engine differ",
        "and runs the cells (every cell on the numba backend and a JAX program of the fcfs replica; every JAX cell",
        "under `-m slow`).",
        "",
        f"A cell is a router, the view it reads, a policy and a replica model: {REPLICAS} replicas, {CAPACITY} KV "
        f"blocks each (TTL {TTL_S:g} s for the TTL policies), the registry's default knobs, on a tenant workload of "
        f"{w.n_requests} requests. An entry is the JAX engine (`J`: runs, `engine.backend=jax`, any device; `-k`: "
        "refused with reason `k` below) then the numba CPU backend (`N`: runs, `engine.backend=numba`; `-`: not "
        "covered, listed under the table), then the cell with a CPU tier in the grid (`T`: runs, "
        "`tiers.cpu.capacity_blocks=N` or `grid.cpu_capacity_blocks=[...]`, on the tiered engine whatever the "
        "backend; `-tk`: refused with reason `tk` below). A router that reads no cache reads no view (view `-`).",
        "",
        "`engine.backend=auto` gives a cell the numba backend on a CPU host where `N` runs it (the faster one "
        "there), the JAX engine elsewhere, and the numba backend on any host to a cell only `N` runs (the test "
        "checks this for every cell). In a grid, `auto` on the fcfs replica gives a whole program (one state "
        "shape) to one backend, so a cell numba covers runs on JAX beside cells it does not.",
        "",
        f"{s['cells']} cells x {len(RUN_BACKENDS)} backends: {s['runs']} run, {s['refused']} refused; "
        f"{s['cells_some_backend']} cells run on some backend, {s['cells_no_backend']} on none, for "
        f"{s['jax_reasons']} distinct reasons of the JAX engine.",
    ]
    policies = list(POLICIES)
    for replica in REPLICA_MODELS:
        lines += ["", f"## The {replica} replica", "", "| router | view | " + " | ".join(f"`{p}`" for p in policies)
                  + " |", "|---|---|" + "---|" * len(policies)]
        rows = {(c.router, c.view) for c, _ in checks if c.replica == replica}
        for router, view in sorted(rows, key=lambda rv: (ROUTERS[rv[0]], VIEWS.get(rv[1], -1))):
            row = [_entry(Cell(replica, router, view, p), checks, reasons, col, treasons) for p in policies]
            lines.append(f"| `{router}` | {view if view == ANY_VIEW else f'`{view}`'} | " + " | ".join(row) + " |")
        items, example = numba_gaps(checks, replica)
        if items:
            lines += ["", "The numba backend (`-` in the second place) does not cover, in its words: "
                      + "; ".join(_md(m) for m in items) + ". One of its refusals in full:", "", f"> {_md(example)}"]
    lines += ["", "## Why the JAX engine refuses a cell", "", "The engine's message, word for word (`-k` above).", ""]
    lines += [f"{k}. {_md(m)}" for m, k in reasons.items()]
    nt = sum(o.ok for o in col.values())
    lines += ["", "## Why a cell does not run with a tier", "",
              f"{nt} of {len(col)} cells run with a CPU tier in the grid (`tiers/fleet.py`: the cell's router on the "
              "tiered engine, its cache routers counting the match in every tier). The refusal, word for word "
              "(`-tk` above):", ""]
    lines += [f"t{k}. {_md(m)}" for m, k in treasons.items()]
    out, refused = tiers
    cache = _tier_cache_routers()
    lines += ["", "## The tiered engine's own routers", "",
              "The tiered engine (`cacheresearch/tiers/`, `experiment=tiers`): the fcfs replica with a GPU and a CPU "
              f"tier ({CAPACITY} and {2 * CAPACITY} blocks, both under the column's policy), on its own numba engine "
              f"(no JAX program, no vllm replica). `R`: runs; its cache routers ({', '.join(f'`{r}`' for r in cache)})"
              " count the match per tier.", "",
              "| router | view | " + " | ".join(f"`{p}`" for p in TIER_POLICIES) + " |",
              "|---|---|" + "---|" * len(TIER_POLICIES)]
    for r in TIER_ROUTERS:
        for v in (TIER_VIEWS if r in cache else (ANY_VIEW,)):
            row = ["R" if out[r, v, p].ok else "-" for p in TIER_POLICIES]
            lines.append(f"| `{r}` | {v if v == ANY_VIEW else f'`{v}`'} | " + " | ".join(row) + " |")
    lines += ["", "What the tiered engine refuses (`tiers.make_config`, its message word for word), one of each:", ""]
    lines += [f"- {what}: {_md(msg)}" for what, msg in refused.items()]
    lines += ["", "## Fleet shapes", "",
              "- **P/D disaggregation** (`fleet/disagg.py`, `experiment=disagg`, axes `grid.pd` and `grid.link_gbps`):"
              " the prefill and the decode pool are each a vllm replica cell on the numba backend, so a pool's router"
              " runs where the vllm table above has `N`; the decode pool imports the prompt's KV, which the JAX engine"
              " does not model (`engine.backend=jax` is refused in one line); the fcfs replica is not split; the grid"
              " study refuses `grid.pd` and `grid.link_gbps` in one line.",
              "- **Autoscaling** (`fleet/autoscale.py`, `experiment=autoscale`): the fcfs replica with a leaf-first"
              " LRU per slot and its own five routers on its own numba kernel (`backends/numba_autoscale.py`); no JAX"
              " program, no vllm replica."]
    return "\n".join(lines) + "\n"


def page() -> str:
    """The page as the engine has it now (its checks; nothing compiled)."""
    checks = check_matrix()
    return markdown(checks, tier_matrix(), tier_column(checks))


if __name__ == "__main__":
    text = page()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)

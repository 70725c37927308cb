"""One compatibility matrix (``cacheresearch/shell/compat.py``, ``docs/compatibility.md``): router x view x policy
x replica model x backend, on a tiny workload.

* every cell runs on some backend, or is refused by a one-line error that names what it refuses and why (never
  "not implemented"); a cell no backend runs is refused by the model itself, not by a backend's coverage;
* ``docs/compatibility.md`` is the generator's page (``python -m cacheresearch.shell.compat docs/compatibility.md``);
* ``engine.backend=auto`` gives a lone cell numba where numba runs it on a CPU host (the faster one there), JAX
  elsewhere, and numba on any host to a cell only numba runs;
* the cells the checks pass run with finite metrics: every numba cell and one JAX program of the fcfs replica
  here, every JAX cell under ``-m slow`` (about 24 programs: minutes of compiling on 2 cores);
* the tier column: every cell it accepts runs with a CPU tier on the tiered engine (finite metrics); the fcfs
  cells every backend runs with the tiered engine's routers and policies are accepted; a refusal is one line
  that names the knob;
* the tiered engine's table: every router, view and policy it lists runs, and its refusals are one line.
"""

from __future__ import annotations

import pytest

from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.run import check_cells
from cacheresearch.shell import cli, compat
from cacheresearch.tiers import TIER_POLICIES

#: words that say a refusal has no reason
NO_REASON = ("not implemented", "not supported", "unsupported", "todo")


@pytest.fixture(scope="module")
def checks():
    return compat.check_matrix()


@pytest.fixture(scope="module")
def tiers():
    return compat.tier_matrix()


@pytest.fixture(scope="module")
def col(checks):
    return compat.tier_column(checks)


def refusal_problem(cell: compat.Cell, o: compat.Outcome) -> str:
    """'' when ``o`` is a refusal as the matrix wants it: a ValueError (BackendError included) whose message is
    one line, names one of the cell's router, view, policy, replica model or the backend, gives a reason (a clause
    after ':' or in parentheses) and never says "not implemented"."""
    msg = o.message
    if o.error not in ("ValueError", "BackendError"):
        return f"{o.error} (a crash, not a refusal): {msg}"
    if "\n" in msg or not msg.strip():
        return f"not one line: {msg!r}"
    if any(w in msg.lower() for w in NO_REASON):
        return f"no reason: {msg}"
    names = {cell.router, cell.policy, cell.replica, "numba", "JAX"} | ({cell.view} - {compat.ANY_VIEW})
    if not any(n in msg for n in names):
        return f"names none of {sorted(names)}: {msg}"
    if ":" not in msg and "(" not in msg:
        return f"no reason given: {msg}"
    return ""


def test_the_refusal_check_can_fail():
    c = compat.Cell("fcfs", "random", compat.ANY_VIEW, "lru")
    assert refusal_problem(c, compat.Outcome(False, "ValueError", "policy lru: not implemented"))
    assert refusal_problem(c, compat.Outcome(False, "ValueError", "lru on two\nlines: why"))
    assert refusal_problem(c, compat.Outcome(False, "IndexError", "index 3 is out of bounds: lru"))
    assert refusal_problem(c, compat.Outcome(False, "ValueError", "something else is wrong: no name"))
    assert not refusal_problem(c, compat.Outcome(False, "ValueError", "policy lru: its clock runs backwards"))


def test_every_cell_runs_somewhere_or_is_refused_for_a_reason(checks):
    cells = sorted({c for c, _ in checks})
    assert len(cells) == len(compat.cells()) and len(checks) == 2 * len(cells)
    bad = [f"{c} {b}: {p}" for (c, b), o in checks.items() if not o.ok and (p := refusal_problem(c, o))]
    assert not bad, bad
    # a cell no backend runs: the model refuses it (the JAX engine's message is no backend's coverage)
    none = [c for c in cells if not checks[c, "jax"].ok and not checks[c, "numba"].ok]
    assert none and all(checks[c, "jax"].error == "ValueError" for c in none)
    # a numba coverage refusal names what it leaves out (listed on the page)
    assert all(o.missing for (c, b), o in checks.items() if o.error == "BackendError")
    # every policy, router and view runs somewhere
    ran = [c for c in cells if checks[c, "jax"].ok or checks[c, "numba"].ok]
    assert {c.policy for c in ran} == set(POLICIES)
    assert {c.view for c in ran if c.view != compat.ANY_VIEW} == {"precise", "approximate", "stale", "gie_estimate"}


def test_page_is_up_to_date(checks, tiers, col):
    assert compat.DOC.read_text(encoding="utf-8") == compat.markdown(checks, tiers, col), \
        "regenerate: python -m cacheresearch.shell.compat docs/compatibility.md"


def test_docs_command_checks_the_page(capsys):
    assert cli.main(["docs", "--compat", "--check"]) == 0
    assert "docs/compatibility.md is up to date" in capsys.readouterr().out


def test_auto_picks_numba_where_it_covers_a_cell(checks):
    _, stream = compat.tiny_workload()
    wrong = []
    for c in sorted({c for c, _ in checks}):
        for cpu in (True, False):
            want = compat.auto_rule(c, checks, cpu)
            try:
                got = check_cells([stream], [0], [compat.cell_params(c)], max_replicas=compat.REPLICAS,
                                  backend="auto", cpu=cpu, scheduler=c.replica)[0]
            except ValueError as e:
                got = None
                if want is None and str(e) != checks[c, "jax"].message:
                    wrong.append(f"{c}: auto refuses with {e}, not the model's refusal")
            if got != want:
                wrong.append(f"{c} cpu={cpu}: auto gives {got}, want {want}")
    assert not wrong, wrong[:20]
    assert any(compat.auto_rule(c, checks, False) == "numba" for c, _ in checks)  # numba-only cells exist


def _assert_ran(checks, ran, backend, keep=lambda c: True):
    want = {c for (c, b), o in checks.items() if b == backend and o.ok and keep(c)}
    assert want and set(c for c, _ in ran) == want
    bad = {k: o for k, o in ran.items() if not o.ok}
    assert not bad, list(bad.items())[:10]


def test_every_numba_cell_runs(checks):
    ran = compat.run_matrix(checks, backends=("numba",))
    _assert_ran(checks, ran, "numba")


def _one_fcfs_program(c: compat.Cell) -> bool:
    """The fcfs replica's run-store policies with every router on the precise view: one JAX program."""
    return (c.replica == "fcfs" and POLICIES[c.policy].engine == "run_store"
            and c.view in (compat.ANY_VIEW, "precise"))


def test_a_jax_program_runs(checks):
    ran = compat.run_matrix(checks, backends=("jax",), replicas=("fcfs",), keep=_one_fcfs_program)
    _assert_ran(checks, ran, "jax", _one_fcfs_program)


@pytest.mark.slow  # every JAX program of the matrix (about 24): minutes of compiling on 2 cores
def test_every_jax_cell_runs(checks):
    ran = compat.run_matrix(checks, backends=("jax",))
    _assert_ran(checks, ran, "jax")


def test_tier_table_runs_and_its_refusals_are_one_line(tiers):
    out, refused = tiers
    assert out and all(o.ok for o in out.values())
    assert {p for _, _, p in out} == set(TIER_POLICIES)
    assert refused and all(m and "\n" not in m and "not implemented" not in m for m in refused.values()), refused


def test_tier_column_cells_run_and_refusals_name_the_knob(checks, col):
    ran = compat.run_tier_column(col)
    assert ran and all(o.ok for o in ran.values()), {c: o.message for c, o in ran.items() if not o.ok}
    keys = ("engine.backend", "cache.policy", "fleet.router", "fleet.knobs.")
    for c, o in col.items():
        if not o.ok:
            assert "\n" not in o.message and o.message.startswith(keys), (c, o.message)
    # every fcfs cell of a tiered router and policy on a view the tiered engine reads is accepted
    from cacheresearch.tiers.fleet import TWIN  # noqa: PLC0415

    want = [c for c in col if c.replica == "fcfs" and c.router in TWIN and c.policy in TIER_POLICIES
            and c.view in ("-", "precise", "stale", "approximate")]
    assert want and all(col[c].ok for c in want), [c for c in want if not col[c].ok]
    # every vllm cell the numba vllm backend runs under the pool's lru runs with its cpu tier
    vl = [c for c in col if c.replica == "vllm" and c.policy == "lru" and checks[c, "numba"].ok]
    assert vl and all(col[c].ok for c in vl) and all(ran[c].ok for c in vl)

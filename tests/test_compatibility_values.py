"""The compatibility matrix checks values: every cell of ``docs/compatibility.md`` that runs on a backend is compared
request by request with the plain-Python reference (``tests/reference_fleet.py`` for the fcfs replica,
``tests/reference_batch.py`` for the vllm replica) on the matrix's own workload, on every backend that runs it.

The default suite checks one cell per engine x policy x router family (load-free, load-reading, cache-reading)
on the numba backends and the fcfs replica's one JAX program of the run-store policies; ``-m slow`` checks every
cell on every backend. A kernel that ran one policy as another (the guide's CLOCK that ran as ARC) fails here."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest
from reference_batch import reference_batch
from reference_fleet import reference_fleet

from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.params import resolve_router
from cacheresearch.core.run import simulate_cells
from cacheresearch.core.simulate import request_bits
from cacheresearch.routers import ROUTERS, VIEWS
from cacheresearch.shell import compat
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys

FAMILY = {"random": "load-free", "round_robin": "load-free", "prefix_hash": "load-free", "least_loaded": "load",
          "power_of_two": "load", "chwbl": "load"}  # every other router reads the cache
_RULE = {v: k for k, v in ROUTERS.items()}
_VIEW = {v: k for k, v in VIEWS.items()}
S, Q = 256, 64  # the vllm replica's running slots (max_num_seqs' default) and waiting ring, engine and reference alike
FLEET_FIELDS = ("replica", "hit_blocks", "ttft_ms")
BATCH_FIELDS = ("replica", "hit_blocks", "ttft_ms", "e2e_ms", "preempted")


@pytest.fixture(scope="module")
def checks():
    return compat.check_matrix()


def _kwargs(p, fn) -> dict:
    """The reference's keyword arguments from the cell's :class:`Params` (the same knob values)."""
    names = set(inspect.signature(fn).parameters)
    kw = {f: np.asarray(getattr(p, f)).item() for f in p._fields
          if f in names and f not in ("policy", "router", "view", "replicas")}
    pol = POLICIES[next(n for n, s in POLICIES.items() if s.id == int(p.policy))]
    name = next(n for n, s in POLICIES.items() if s is pol)
    kw.update(policy=name, router=_RULE[int(p.router)], view=_VIEW[int(p.view)], replicas=int(p.replicas))
    if pol.uses_capacity:
        kw["capacity_blocks"] = int(p.capacity)
    if fn is reference_fleet:
        kw["ttl_s"] = int(p.ttl_ms) / 1000 if pol.uses_ttl else None
        if not pol.uses_capacity:
            kw["capacity_blocks"] = None
    else:  # the router's knobs go to the reference's **kn (resolve_router names them), with the cell's values
        kw.update({n: np.asarray(getattr(p, n)).item() for n in resolve_router(kw["router"], view=kw["view"])
                   if n in p._fields and n not in ("router", "view", "replicas", "policy")})
        kw["capacity_blocks"] = int(p.capacity)
        kw["ttl_ms"] = int(p.ttl_ms) if pol.uses_ttl else None
        kw["pool_knobs"] = dict(small=int(p.s3fifo_small), ghost=int(p.s3fifo_ghost), promote=int(p.s3fifo_promote))
    return kw


def reference_of(cell: compat.Cell, seed: int) -> dict:
    w, _ = compat.tiny_workload()
    p = compat.cell_params(cell)
    bits = np.asarray(request_bits(jax.random.key(seed), w.n_requests + 1))[: w.n_requests]
    if cell.replica == "fcfs":
        return reference_fleet(w, bits=bits, **_kwargs(p, reference_fleet))
    return reference_batch(w, bits=bits, max_running=S, queue_slots=Q,
                           gie_hashes=gie_hashes_from_keys(w, max_blocks=16), **_kwargs(p, reference_batch))


def run_cells(cells: list, backend: str) -> dict:
    """{cell: per-request arrays} of the engine on ``backend``, every cell of one replica model in one call."""
    w, stream = compat.tiny_workload()
    n = w.n_requests
    out = {}
    for replica in sorted({c.replica for c in cells}):
        cs = [c for c in cells if c.replica == replica]
        opts = dict(max_running=S, queue_slots=Q) if replica == "vllm" else dict(queue_slots=n + 1)
        m, _ = simulate_cells([stream], np.zeros(len(cs), np.int64), [compat.cell_params(c) for c in cs],
                              np.arange(len(cs)), max_replicas=compat.REPLICAS, backend=backend, scheduler=replica,
                              per_request=True, **opts)
        for k, c in enumerate(cs):
            out[c] = {f: np.asarray(getattr(m, f))[k][:n] for f in BATCH_FIELDS if hasattr(m, f)}
            out[c]["seed"] = k
    return out


def mismatches(got: dict, cells: list) -> list[str]:
    """Every cell whose engine output differs from the reference: ``cell field: first requests``."""
    bad = []
    for c in cells:
        ref = reference_of(c, got[c]["seed"])
        for f in FLEET_FIELDS if c.replica == "fcfs" else BATCH_FIELDS:
            a, b = got[c][f], np.asarray(ref[f])[: len(got[c][f])]
            if not np.array_equal(a, b):
                i = np.nonzero(a != b)[0][:5]
                bad.append(f"{c} {f}: requests {i.tolist()} engine {a[i].tolist()} reference {b[i].tolist()}")
                break
    return bad


def sample(cells: list) -> list:
    """One cell per replica model x policy x router family (the first in the matrix's order)."""
    seen, out = set(), []
    for c in sorted(cells):
        key = (c.replica, c.policy, FAMILY.get(c.router, "cache"))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _runs(checks, backend, replica=None):
    return [c for (c, b), o in checks.items() if b == backend and o.ok and (replica is None or c.replica == replica)]


@pytest.mark.parametrize("replica", compat.REPLICA_MODELS)
def test_numba_cells_equal_the_reference(checks, replica):
    cells = sample(_runs(checks, "numba", replica))
    assert cells
    bad = mismatches(run_cells(cells, "numba"), cells)
    assert not bad, bad[:10]


def test_the_jax_run_store_program_equals_the_reference(checks):
    cells = [c for c in _runs(checks, "jax", "fcfs") if POLICIES[c.policy].engine == "run_store"
             and c.view in (compat.ANY_VIEW, "precise")]
    cells = sample(cells)
    bad = mismatches(run_cells(cells, "jax"), cells)
    assert not bad, bad[:10]


def test_a_wrong_engine_output_is_reported(checks):
    cells = sample(_runs(checks, "numba", "fcfs"))[:1]
    got = run_cells(cells, "numba")
    got[cells[0]]["hit_blocks"] = got[cells[0]]["hit_blocks"] + 1
    assert mismatches(got, cells)


@pytest.mark.slow  # every cell on every backend: the JAX programs take minutes to compile on 2 cores
@pytest.mark.parametrize("backend", compat.RUN_BACKENDS)
def test_every_cell_equals_the_reference(checks, backend):
    cells = _runs(checks, backend)
    bad = mismatches(run_cells(cells, backend), cells)
    assert not bad, bad[:10]

"""Conformance of the policy registry (:data:`cacheresearch.cache.policies.POLICIES`).

Whatever is registered must

* have a plain-Python oracle (:data:`ORACLES`: ``tests/reference.py`` for the JAX scan's rule families,
  ``tests/reference_blocks.py`` for the per-block ones): :func:`missing_oracles` lists those that do not;
* make its engine equal the oracle request by request on a set of probe workloads (hit blocks,
  replicas, maximum occupancy);
* be declared with a rule its engine implements: :func:`cacheresearch.cache.policies.register_policy`
  refuses the others, and :func:`disagreements` (the engine run from the declaration's own fields)
  shows what would happen otherwise: FIFO declared on the run store with ``refresh_on_hit=False``, as an
  older guide suggested, runs as LRU (hits 0 0 1 0 1 where FIFO gives 0 0 1 0 0);
* keep ``docs/policies.md`` and the ``Params`` knob fields in step with the declarations.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from reference import POLICIES as REF_POLICIES
from reference import reference_simulate
from reference_blocks import BLOCK_ORACLES, block_simulate
from test_engine import padded_stream

from cacheresearch.backends.numba_policies import block_replay_grid
from cacheresearch.cache.block import BLOCK_KNOBS
from cacheresearch.cache.policies import POLICIES, PolicySpec, policies_markdown, register_policy
from cacheresearch.core.params import Params, make_params
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake

DOCS = Path(__file__).resolve().parents[1] / "docs" / "policies.md"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mini_mooncake.jsonl"
R = 3


def _ref(name):
    def oracle(w, capacity, ttl_s, replicas, router):
        return reference_simulate(w, policy=name, capacity_blocks=capacity, ttl_s=ttl_s, replicas=replicas,
                                  router=router, prefix_blocks=2)
    return oracle


def _blk(name):
    def oracle(w, capacity, ttl_s, replicas, router):
        return block_simulate(w, policy=name, capacity_blocks=capacity, replicas=replicas, router=router,
                              prefix_blocks=2)
    return oracle


#: policy name -> oracle(workload, capacity, ttl_s, replicas, router) -> dict (hit_blocks, replica, max_occupancy)
ORACLES = {**{n: _ref(n) for n in REF_POLICIES}, **{n: _blk(n) for n in BLOCK_ORACLES}}


def missing_oracles() -> list[str]:
    return sorted(set(POLICIES) - set(ORACLES))


FIFO_VS_LRU = [[11], [12], [11], [13], [11]]
PREFIXES = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3], [6, 7], [1, 2, 4, 8], [5], [1, 2]]


def probes(jax_scan: bool = False) -> list[Workload]:
    """Probe workloads; for the JAX scan one workload of both (one compiled shape and depth)."""
    if jax_scan:
        return [Workload.from_lists(PREFIXES + FIFO_VS_LRU, block_tokens=2, arrival_ms=np.arange(13) * 400)]
    fifo_vs_lru = Workload.from_lists(FIFO_VS_LRU, block_tokens=1)
    prefixes = Workload.from_lists(PREFIXES, block_tokens=2, arrival_ms=np.arange(8) * 400)
    w = load_mooncake(FIXTURE, block_tokens=512)
    return [fifo_vs_lru, prefixes, w.slice(0, 24)]


def run_engine(spec: PolicySpec, w, capacity, ttl_s, replicas, router):
    """The engine a declaration names, driven by the declaration's own fields (not by its name)."""
    p = make_params("lru", capacity_blocks=1, replicas=replicas, router=router, prefix_blocks=2)
    cap = int(capacity) if spec.uses_capacity else 2**31 - 1
    ttl = int(round(ttl_s * 1000)) if spec.uses_ttl else 2**31 - 1
    p = p._replace(policy=np.int32(spec.id), capacity=np.int32(cap), ttl_ms=np.int32(ttl),
                   leaf_first=np.bool_(spec.leaf_first), refresh=np.bool_(spec.refresh_on_hit))
    if spec.engine == "blocks":
        m = block_replay_grid(w, [p], max_replicas=R)
        return dict(hit_blocks=m.hit_blocks[0], replica=m.replica[0], max_occupancy=m.max_occupancy[0][:replicas])
    s = padded_stream(w, 8, 16, 8, stateful_singletons=spec.priority, block_ids=spec.block_state)
    m = simulate(s, p, jax.random.key(0), max_replicas=R, queue=False, routers_compiled=("round_robin", "prefix_hash"))
    n = w.n_requests
    return dict(hit_blocks=np.asarray(m.hit_blocks)[:n], replica=np.asarray(m.replica)[:n],
                max_occupancy=np.asarray(m.max_occupancy)[:replicas])


def disagreements(name: str, spec: PolicySpec) -> list[str]:
    """Where the engine run from ``spec`` differs from the oracle of ``name`` on the probes."""
    out = []
    # the JAX scan's families on one hand-sized probe (one small compiled program; tests/test_engine.py,
    # test_priority_policies.py and test_s3fifo.py run them on hypothesis workloads), per-block ones on all
    for k, w in enumerate(probes(jax_scan=spec.engine != "blocks")):
        for capacity, replicas, router in ((2, 1, "round_robin"), (9, 3, "prefix_hash")):
            ref = ORACLES[name](w, capacity if spec.uses_capacity else None, 1.0 if spec.uses_ttl else None,
                                replicas, router)
            got = run_engine(spec, w, capacity, 1.0, replicas, router)
            # TTL policies: the engine counts expired blocks until its lazy expiry, the oracle drops them
            # before each lookup (tests/test_engine.py compares their hits and contents)
            for f in ("replica", "hit_blocks") + (("max_occupancy",) if spec.uses_capacity else ()):
                if not np.array_equal(np.asarray(got[f]), np.asarray(ref[f])):
                    out.append(f"{name}: probe {k} C={capacity} R={replicas} {router}: {f} "
                               f"{np.asarray(got[f])[:8].tolist()} != oracle {np.asarray(ref[f])[:8].tolist()}")
                    break
    return out


def test_every_registered_policy_has_an_oracle():
    assert missing_oracles() == []


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_registered_policy_equals_its_oracle(name):
    assert disagreements(name, POLICIES[name]) == []


def test_fifo_declared_on_the_run_store_is_refused_and_would_run_as_lru():
    fifo_as_lru = PolicySpec(99, True, False, True, False)  # capacity, no TTL, leaf-first, no refresh
    with pytest.raises(ValueError, match="LRU"):
        register_policy("fifo_run_store", fifo_as_lru)
    assert "fifo_run_store" not in POLICIES
    # what the refusal prevents: the run store runs it as LRU, which the conformance check catches
    w = probes()[0]
    assert disagreements("fifo", fifo_as_lru)
    got = run_engine(fifo_as_lru, w, 2, 1.0, 1, "round_robin")["hit_blocks"].tolist()
    assert got == [0, 0, 1, 0, 1]  # LRU
    assert ORACLES["fifo"](w, 2, None, 1, "round_robin")["hit_blocks"].tolist() == [0, 0, 1, 0, 0]


@pytest.mark.parametrize("bad,match", [
    (PolicySpec(98, True, False, True, True, engine="blocks"), "needs kernel="),  # no kernel module
    (PolicySpec(98, True, False, True, True, engine="blocks", kernel="no.such.module"), "needs kernel="),
    (PolicySpec(98, True, False, True, True, priority=True, engine="priority"), "implements"),
    (PolicySpec(98, True, True, True, True), "capacity or a TTL"),
    (PolicySpec(98, True, False, True, True, engine="nowhere"), "engine"),
    (PolicySpec(98, True, False, True, True, knobs=("undeclared_knob",)), "not declared"),
    (PolicySpec(0, True, False, True, True), "already registered"),
])
def test_declarations_the_engines_do_not_implement_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        register_policy("new_policy", bad)
    assert "new_policy" not in POLICIES


def test_policy_knobs_are_params_fields_with_libcachesim_defaults():
    for k in BLOCK_KNOBS:
        assert k.name in Params._fields
    p = make_params("s3fifo", capacity_blocks=100)
    assert (int(p.s3fifo_small_pm), int(p.s3fifo_ghost_pm), int(p.s3fifo_promote)) == (100, 900, 2)
    for spec in POLICIES.values():
        assert set(spec.knobs) <= {k.name for k in BLOCK_KNOBS}


def test_docs_policies_md_is_up_to_date():
    assert DOCS.read_text() == policies_markdown(), "regenerate docs/policies.md from policies_markdown()"

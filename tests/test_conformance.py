"""Conformance of the router registry: every registered router has a plain-Python oracle and agrees with it.

Whatever is registered in :data:`cacheresearch.routers.REGISTRY` (one file per rule) must

* have an oracle in ``tests/reference_fleet.py`` (``route_one`` knows its name, ``reference_fleet``
  accepts it): :func:`missing_oracles` lists the routers that do not, and the first test fails on any;
* make the engine's decisions equal the oracle's, request by request, on a small fixed workload, in
  every view it can read;
* keep the declarations in step with what is derived from them: the ``Params`` fields and dtypes, the
  sweep schema's knob keys, ``docs/routers.md``.

``docs/adding_a_router.md`` is the guide for the one file and the one oracle a new router needs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import reference_fleet
from test_fleet import assert_fleet_equal, engine_and_reference, tenant_prefix_workload

from cacheresearch.core.params import KNOB_DECLS, KNOBS, PARAM_DTYPES, Params, make_params
from cacheresearch.routers import (
    CACHE_ROUTERS,
    LOAD_FREE_ROUTERS,
    PRESETS,
    REGISTRY,
    ROUTER_DEFAULTS,
    ROUTERS,
    Knob,
    Registry,
    Router,
    markdown_table,
)
from cacheresearch.workload import Workload

DOCS = Path(__file__).resolve().parents[1] / "docs" / "routers.md"


def missing_oracles(registry: Registry = REGISTRY, reference=reference_fleet) -> list[str]:
    """Registered routers that ``reference`` (the ``tests/reference_fleet.py`` module) has no oracle for:
    its ``route_one`` raises "unknown router" on a small fleet, or ``reference_fleet`` would refuse
    the name (its ``ROUTERS``)."""
    kn = {k.name: k.default for k in registry.router_knobs()}
    missing = []
    for r in registry.routers():
        try:
            reference.route_one(r.name, i=3, n=4, prefix_key=0x1234_5678_9ABC, bits=[7, 2**31, 2**30, 5], R=3,
                                match=[2, 4, 0], queue=[1, 0, 2], active_blocks=[4, 0, 9], tree_size=[5, 4, 0],
                                ring=reference.ring_nodes(3, 4), kn=kn)
        except ValueError as e:
            if "unknown router" not in str(e):
                raise
            missing.append(r.name)
            continue
        if r.name not in reference.ROUTERS:
            missing.append(r.name)
    return missing


# ------------------------------------------------------------------------------ every router has an oracle
def test_every_registered_router_has_an_oracle():
    assert missing_oracles() == [], ("registered routers without an oracle in tests/reference_fleet.py "
                                     "(docs/adding_a_router.md)")


def test_a_router_registered_without_an_oracle_is_reported():
    """The check above really fails: a fresh registry with every real router plus one new rule."""
    reg = Registry()
    for r in REGISTRY.routers():
        reg.register(r)
    assert missing_oracles(reg) == []
    reg.register(Router(name="sticky_dummy", id=len(ROUTERS), rule=lambda ctx: ctx.off,
                        knobs=(Knob("sticky_dummy_span", 4, 1, 64, doc="a knob of the dummy"),), reads_load=True))
    assert missing_oracles(reg) == ["sticky_dummy"]
    # its knob joins the derived views of that registry only
    assert reg.defaults()["sticky_dummy_span"] == 4 and "sticky_dummy_span" not in ROUTER_DEFAULTS
    assert "sticky_dummy" not in reg.load_free() and "sticky_dummy" in reg.ids()


def test_registration_rejects_duplicates():
    reg = Registry()
    reg.register(REGISTRY["chwbl"])
    with pytest.raises(ValueError, match="already registered"):
        reg.register(REGISTRY["chwbl"])
    with pytest.raises(ValueError, match="id 5 is taken"):
        reg.register(dataclasses.replace(REGISTRY["chwbl"], name="chwbl2", knobs=()))
    with pytest.raises(ValueError, match="declared already"):
        reg.register(dataclasses.replace(REGISTRY["chwbl"], name="chwbl3", id=50))
    with pytest.raises(ValueError, match="name of a preset"):
        reg.register(dataclasses.replace(REGISTRY["random"], name="kubeai_chwbl", id=51))
    with pytest.raises(ValueError, match="needs lo and hi"):
        Knob("k", 1)
    with pytest.raises(ValueError, match="must be an integer in"):
        Knob("k", 5, 0, 3)


# ------------------------------------------------------------------------------ the engine equals the oracle
def _workload() -> Workload:
    return tenant_prefix_workload()


#: small thresholds, so that the load branches of the rules are taken too
_TIGHT = dict(balance_abs=1, balance_rel_pct=120, queue_threshold=4, preble_abs=1, preble_rel_pct=120,
              cache_threshold_pm=200, chwbl_c_pct=110, vnodes=8, gie_prefix_mode=1, gie_window_blocks=2,
              gie_kv_w_pct=200, gie_load_w_pct=150, gie_load_threshold=3)


@pytest.mark.parametrize("knobs", ["defaults", "tight"])
@pytest.mark.parametrize("router", list(ROUTERS))
def test_engine_equals_oracle_for_every_registered_router(router, knobs):
    """The JAX engine for a router with a JAX rule; one with a numba rule only (state) is refused by the JAX engine
    in one line, and its numba engines are checked against the oracle in tests/test_router_state.py."""
    if REGISTRY[router].rule is None:
        with pytest.raises(ValueError, match=f"router '{router}' on the JAX engine") as e:
            engine_and_reference(_workload(), "lru", dict(capacity=30), 3, router, 1)
        assert "\n" not in str(e.value)
        return
    w = _workload()
    views = ("precise", "approximate", "stale") if router in CACHE_ROUTERS else ("precise",)
    for view in views:
        kw = dict(prefill_tps=2000, decode_us_per_token=200, capacity=30, view=view, stale_lag_ms=10,
                  index_capacity=40)
        if knobs == "tight":
            kw.update({k: v for k, v in _TIGHT.items() if k in KNOB_DECLS})
        m, ref = engine_and_reference(w, "lru", dict(kw), 3, router, 1)
        assert_fleet_equal(w, m, ref, (router, knobs, view))


# ------------------------------------------------------------------------------ what follows from the declarations
def test_categories_follow_the_registrations():
    assert ROUTERS == {r.name: r.id for r in REGISTRY.routers()}
    assert CACHE_ROUTERS == tuple(r.name for r in REGISTRY.routers() if r.reads_cache)
    assert LOAD_FREE_ROUTERS == ("random", "round_robin", "prefix_hash")
    assert set(CACHE_ROUTERS).isdisjoint(LOAD_FREE_ROUTERS)
    assert ROUTER_DEFAULTS == {k.name: k.default for k in REGISTRY.knobs()}
    for name, p in PRESETS.items():
        assert p["router"] in ROUTERS, name
        assert set(p) - {"router", "source"} <= set(ROUTER_DEFAULTS), name


def test_params_fields_and_dtypes_are_pinned():
    """The engine reads Params by name: a new router adds its knobs' fields (after ``preble_abs``), but
    these keep their names, relative order and dtypes."""
    pinned = (
        "policy", "capacity", "ttl_ms", "leaf_first", "refresh", "replicas", "router", "prefix_blocks", "view",
        "stale_lag_ms", "instances", "local_load", "index_capacity", "vnodes", "chwbl_c_pct", "cache_threshold_pm",
        "balance_abs", "balance_rel_pct", "miss_smallest_tree", "overlap_weight_pct", "temperature",
        "prefix_weight_pct", "load_weight_pct", "queue_threshold", "preble_rel_pct", "preble_abs", "prefill_tps",
        "decode_us_per_token", "kv_pressure",
    )
    assert tuple(f for f in Params._fields if f in pinned) == pinned
    from cacheresearch.cache.block import BLOCK_KNOBS
    from cacheresearch.core.params import STEP_KNOBS

    extra = {k.name for k in REGISTRY.router_knobs() + REGISTRY.shared_knobs("replica") + STEP_KNOBS + BLOCK_KNOBS}
    derived = {"s3fifo_small", "s3fifo_ghost"}  # S3-FIFO's queue sizes, derived on the host by libCacheSim's rule
    assert set(Params._fields) - set(pinned) <= extra | derived
    bools = {"leaf_first", "refresh", "local_load", "miss_smallest_tree", "kv_pressure"}
    p = make_params("lru", 10, router="kv_cost")
    for f in pinned:
        want = np.bool_ if f in bools else np.float32 if f == "temperature" else np.int32
        assert np.asarray(getattr(p, f)).dtype == want == PARAM_DTYPES[f], f
    assert KNOBS == (tuple(ROUTER_DEFAULTS) + ("prefill_tps", "decode_us_per_token") + tuple(k.name for k in STEP_KNOBS)
                     + tuple(k.name for k in BLOCK_KNOBS))


def test_every_declared_range_is_enforced():
    for name, k in KNOB_DECLS.items():
        if k.kind == "int":
            for bad in (k.lo - 1, k.hi + 1):
                with pytest.raises(ValueError, match=f"{name} must be an integer in"):
                    make_params("lru", 10, **{name: bad})
            make_params("lru", 10, **{name: k.lo})
        elif k.kind == "float":
            with pytest.raises(ValueError, match=f"{name} must be >= {k.lo}"):
                make_params("lru", 10, **{name: k.lo - 1})


def test_sweep_schema_keys_come_from_the_declarations():
    from cacheresearch.shell import sweep
    from cacheresearch.shell.schema import STUDY_GRID_KEYS

    grid = [f.name for f in dataclasses.fields(sweep.GridConf)]
    assert grid == list(sweep.GRID_KEYS) + list(STUDY_GRID_KEYS)
    assert set(sweep.KNOB_KEYS) == set(KNOBS) - {"prefix_blocks"} and set(sweep.KNOB_KEYS) <= set(grid)
    assert [f.name for f in dataclasses.fields(sweep.KnobsConf)] == list(sweep.KNOB_KEYS)


def test_docs_table_is_up_to_date():
    from cacheresearch.core.params import LATENCY_KNOBS

    assert DOCS.read_text() == markdown_table(extra_knobs=LATENCY_KNOBS), \
        "regenerate: python -m cacheresearch.routers docs/routers.md"

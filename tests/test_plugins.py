"""A contributor's plug-in: a toy policy (MRU, ``tests/plugin_mru.py``) registered at run time, from outside the
package, the way a user's plug-in is. On every engine it equals its oracle request by request or is refused in
one line: the fixed-route engine and the JAX refusal in the default suite; the fcfs fleet with a cache router,
the KV tiers and the vllm pool (each compiled in the process for the plug-in: minutes on 2 cores) under
``-m slow``."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest
import reference_blocks
import reference_vllm
from plugin_mru import MRUCache, MRUPool
from reference_blocks import block_simulate

from cacheresearch.cache.kernels import dispatch
from cacheresearch.cache.policies import POLICIES, PolicySpec, block_policies, register_policy, unregister_policy
from cacheresearch.core.params import make_params
from cacheresearch.core.simulate import check_bounds, static_options
from cacheresearch.workload import Workload

PREFIXES = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3], [6, 7], [1, 2, 4, 8], [5], [1, 2], [9, 10, 11], [1, 2, 3]]


@pytest.fixture
def mru(monkeypatch):
    """``mru`` registered as a plug-in (its kernel module named by ``kernel=``), its oracles beside the package's."""
    register_policy("mru", PolicySpec(90, True, False, True, False, engine="blocks", kernel="plugin_mru",
                                      doc="a plug-in: the newest block leaves"))
    monkeypatch.setitem(reference_blocks.BLOCK_ORACLES, "mru", MRUCache)
    monkeypatch.setitem(reference_vllm.POOL_ORACLES, "mru", MRUPool)
    yield "mru"
    unregister_policy("mru")
    for name in ("cacheresearch.backends.numba_policies", "cacheresearch.backends.numba_blocks",
                 "cacheresearch.tiers.engine", "cacheresearch.backends.numba_vllm"):
        if name in sys.modules:
            dispatch.bind(sys.modules[name])  # back to the package's own dispatch (cached on disk)


def test_registered_plugin_gets_a_code_and_the_shell_accepts_it(mru):
    from cacheresearch.shell import names

    assert mru in block_policies() and mru in POLICIES and mru in names.policy_names()
    assert dispatch.codes()[mru] == len(block_policies()) - 1
    assert not dispatch.current().BUILTIN


def test_plugin_on_fixed_routes_equals_its_oracle(mru):
    from cacheresearch.backends.numba_policies import block_replay_grid

    w = Workload.from_lists(PREFIXES, block_tokens=2, arrival_ms=np.arange(len(PREFIXES)) * 100)
    for cap, R, router in ((3, 1, "round_robin"), (5, 2, "prefix_hash"), (0, 1, "round_robin"), (40, 2, "random")):
        p = make_params(mru, capacity_blocks=cap, replicas=R, router=router, prefix_blocks=1)
        m = block_replay_grid(w, [p], [jax.random.key(1)], max_replicas=R)
        rep = np.asarray(m.replica[0])
        ref = block_simulate(w, policy=mru, capacity_blocks=cap, replicas=R, router=router, prefix_blocks=1,
                             replica_choices=rep if router == "random" else None)
        np.testing.assert_array_equal(m.hit_blocks[0], ref["hit_blocks"], err_msg=f"{cap} {R} {router}")
        np.testing.assert_array_equal(m.occupancy[0][:R], ref["occupancy"])


def test_the_jax_engine_refuses_the_plugin_in_one_line(mru):
    p = make_params(mru, capacity_blocks=4)
    st = static_options(p, blocks=(mru,))
    with pytest.raises(ValueError, match="no JAX rule") as e:
        check_bounds(p, 1, st, backend="jax")
    assert "\n" not in str(e.value) and repr(mru) in str(e.value)


def test_a_kernel_missing_a_function_is_refused_in_one_line(monkeypatch):
    import plugin_mru

    monkeypatch.delattr(plugin_mru, "occ")
    register_policy("mru_broken", PolicySpec(91, True, False, True, False, engine="blocks", kernel="plugin_mru"))
    try:
        with pytest.raises(ValueError, match=r"'mru_broken'.*defines no occ\(\)") as e:
            dispatch.current()
        assert "\n" not in str(e.value)
    finally:
        unregister_policy("mru_broken")


@pytest.mark.slow  # compiles the fcfs fleet, the tiered engine and the vllm backend for the plug-in
def test_plugin_on_every_numba_engine_equals_its_oracles(mru):
    from test_fleet import assert_fleet_equal
    from test_numba_blocks import numba_and_reference
    from test_tiers import assert_equal_to_reference
    from test_vllm_policies import _compare, _workload

    from cacheresearch.tiers import make_config

    w = Workload.from_lists(PREFIXES * 2, block_tokens=2, arrival_ms=np.arange(2 * len(PREFIXES)) * 50,
                            output_tokens=np.full(2 * len(PREFIXES), 40))
    for router in ("cache_aware", "round_robin"):
        m, ref = numba_and_reference(w, mru, dict(capacity=6, prefill_tps=2000, decode_us_per_token=250), 2, router, 0)
        assert_fleet_equal(w, m, ref, (router, mru))
    cfgs = [make_config(gpu_blocks=4, tiers={"cpu": {"capacity_blocks": 6, "policy": mru}}, replicas=2,
                        router=r, gpu_policy=mru, block_bytes=131_072 * 16) for r in ("tier_scorer", "prefix_hash")]
    assert_equal_to_reference(w, cfgs, [0, 1])
    _compare(_workload(3, 20), mru, R=2, router="cache_aware", cap=60)

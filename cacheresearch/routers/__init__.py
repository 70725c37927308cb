"""Routers: which replica serves a request, from what the router knows.

A router is a pure function ``route(router_id, req, fleet, params) -> replica`` evaluated inside the
engine's ``lax.scan`` once per request (at its first chunk). Everything it reads is integer, so every
decision is reproduced exactly by the plain-Python reference (``tests/reference_fleet.py``).

One file per rule (``random.py``, ``round_robin.py``, ``prefix_hash.py``, ``least_loaded.py``,
``power_of_two.py``, ``chwbl.py``, ``cache_aware.py``, ``kv_cost.py``, ``weighted_scorers.py``,
``preble_e2.py``, ``gie.py``, ``least_recent.py``): each declares its knobs and registers its rule, in JAX and in
numba (:mod:`.registry`; a router with state in numba only), and its docstring states the rule in full. Every
module of this package but the helpers is imported here, so a new router is its one file. The numba engines'
dispatch is generated from the registry (:mod:`.dispatch`, the rules' helpers :mod:`.numba_rules`).
The views and the shared knobs are :mod:`.views`, the helpers
:mod:`.common`, the named presets :mod:`.presets`. ``docs/routers.md`` is the table of all of them,
generated from the registry; ``docs/adding_a_router.md`` says how to add one.

What a router sees
------------------
``req`` (:class:`RequestView`): request index ``i``, arrival time, ``n`` = number of blocks, the 64-bit
key of block ``min(prefix_blocks, n) - 1`` (chained keys: it names the first ``prefix_blocks``
blocks), four uint32 random words drawn before the scan (``bits``; ``request_bits`` in the engine), and
the router *instance* ``u = i mod instances`` that handles it.

``fleet`` (:class:`FleetView`), per replica ``r < R`` (``R`` = active replicas):

``match[r]``         blocks of the request's leading run found in the router's *view* of replica
                     ``r`` (``params.view``: ``precise``, ``approximate`` or ``stale``, defined in
                     :mod:`.views`).
``queue[r]``         requests in flight on ``r`` at arrival (dispatched earlier, finish time > arrival;
                     see the queue model in :mod:`cacheresearch.engine`); with ``local_load`` only
                     those dispatched by instance ``u`` (router instances that do not share load).
``active_blocks[r]`` sum of the block counts of those in-flight requests.
``kv_used[r]``       pool blocks in use by running requests (the vllm replica: pinned + working
                     blocks, what vLLM's ``gpu_cache_usage_perc`` counts); ``active_blocks`` elsewhere.
``tree_size[r]``     blocks in the view: the index's occupancy (approximate) or the replica's
                     true occupancy (precise, stale).

Tie-breaking: ``off = floor(bits[0] * R / 2**32)``; ``argmin_rot(v)`` is the ``r`` minimising
``(v[r], (r - off) mod R)`` and ``argmax_rot(v)`` the one maximising ``v[r]``, ties the same way
(a uniformly random replica among the tied ones, reproducible).

Categories (from the registrations): :data:`CACHE_ROUTERS` read ``match`` (the engine computes every
replica's prefix match for them); :data:`LOAD_FREE_ROUTERS` read neither load nor cache (the routed
sequence is fixed before the run: one-pass hit curves and ``queue=False`` accept only these).

The router id and every knob are dynamic parameters, so a grid over routers and knobs is one compiled
program. The compiled rules are all evaluated and the chosen one selected: each is O(R) integer work
(``chwbl`` O(R x vnodes)), cheaper than a conditional per step and identical under vmap.
"""

from __future__ import annotations

import importlib
import pkgutil

from cacheresearch.routers.common import (
    Context,
    FleetView,
    RequestView,
    argmax_rot,
    argmin_rot,
    clamp30,
    mix32,
    mul32,
    prefix_hash_u64,
    ring_positions,
    scale_bits,
)
from cacheresearch.routers.presets import PRESETS
from cacheresearch.routers.registry import (
    REGISTRY,
    Knob,
    Registry,
    Router,
    markdown_table,
    register,
    register_knobs,
    route,
    router_id,
)
from cacheresearch.routers.views import REPLICA_KNOBS, VIEW_KNOBS, VIEWS, view_id

# every rule registers itself on import (ids fix the order, not the import order): each module of this package
# but the helpers below is a router file and is imported here, so a new router is its one file
_HELPERS = {"common", "registry", "presets", "views", "numba_rules", "dispatch", "fixed", "epp", "gie_index",
            "__main__"}
for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _HELPERS):
    importlib.import_module(f"{__name__}.{_m}")

__all__ = [
    "ROUTERS",
    "VIEWS",
    "PRESETS",
    "CACHE_ROUTERS",
    "LOAD_FREE_ROUTERS",
    "ROUTER_DEFAULTS",
    "REGISTRY",
    "Registry",
    "Router",
    "Knob",
    "register",
    "register_knobs",
    "router_id",
    "view_id",
    "route",
    "prefix_hash_u64",
    "mix32",
    "mul32",
    "scale_bits",
    "argmin_rot",
    "argmax_rot",
    "clamp30",
    "Context",
    "RequestView",
    "FleetView",
    "ring_positions",
    "markdown_table",
    "VIEW_KNOBS",
    "REPLICA_KNOBS",
]

#: name -> router id (the dynamic ``params.router`` value), in id order
ROUTERS: dict[str, int] = REGISTRY.ids()
#: routers that read ``match`` (need the engine's per-replica prefix match)
CACHE_ROUTERS: tuple[str, ...] = REGISTRY.cache_routers()
#: routers that read neither load nor cache
LOAD_FREE_ROUTERS: tuple[str, ...] = REGISTRY.load_free()
#: Router knobs and their defaults (the values ``make_params`` uses unless a preset or the caller
#: overrides them), from the declarations. Units are integers so that decisions are exact: ``_pct`` =
#: hundredths, ``_pm`` = thousandths.
ROUTER_DEFAULTS: dict = REGISTRY.defaults()

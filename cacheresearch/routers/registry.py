"""The router registry: each rule declares itself once, with its knobs.

A router is one file of :mod:`cacheresearch.routers` that calls :func:`register` with a
:class:`Router`: its name and id (the dynamic ``params.router`` value), what it reads
(``reads_cache``: the per-replica prefix ``match`` / ``tree_size``; ``reads_load``: ``queue`` /
``active_blocks``), its own knobs (:class:`Knob`: default, range, kind, doc, unit), the shared knobs its
rule reads (``uses``), the rule itself (``rule(ctx) -> replica``, a pure JAX function of a
:class:`~cacheresearch.routers.common.Context`; ``numba=``: the same rule for the numba engines, over
:data:`cacheresearch.routers.numba_rules.ARGS`), the int64 state slots a rule with memory keeps
(``state_replica``, ``state_global``: numba only; ``state_knob``: only where that knob of its own is > 0), a
one-line summary, its source, and the rule in full (the file's docstring). Knobs that are not one router's own
(the view, router instances, the prefix length, ``kv_pressure``) are declared once with :func:`register_knobs`
(``views.py``).

Everything else follows from the registrations:

* :data:`cacheresearch.routers.ROUTERS` (name -> id), ``CACHE_ROUTERS``, ``LOAD_FREE_ROUTERS`` and
  ``ROUTER_DEFAULTS`` (:meth:`Registry.ids`, :meth:`Registry.cache_routers`,
  :meth:`Registry.load_free`, :meth:`Registry.defaults`);
* the knob fields of :class:`cacheresearch.core.params.Params`, their ranges, dtypes and conversion
  (:meth:`Knob.check`, :meth:`Knob.value`);
* the knob keys of the Hydra schema (:mod:`cacheresearch.shell.sweep`);
* ``docs/routers.md`` (:func:`markdown_table`; ``python -m cacheresearch.routers docs/routers.md``);
* the conformance test ``tests/test_conformance.py``, which fails for a registered router that has no
  plain-Python oracle in ``tests/reference_fleet.py`` or disagrees with it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import jax.numpy as jnp

from cacheresearch.cache.knob import KINDS, Knob, num_text  # noqa: F401 (Knob: declared once, for routers and policies)
from cacheresearch.routers.common import Context
from cacheresearch.routers.presets import PRESETS

__all__ = [
    "Knob",
    "Router",
    "Registry",
    "REGISTRY",
    "KNOB_GROUPS",
    "register",
    "register_knobs",
    "route",
    "router_id",
    "markdown_table",
]

#: Knob groups in the order of :attr:`Registry.knobs`: shared knobs of what the router knows (``view``),
#: the routers' own knobs (``router``, in router-id order), the replica model (``replica``).
KNOB_GROUPS = ("view", "router", "replica")


@dataclass(frozen=True)
class Router:
    """One routing rule. ``rule(ctx)`` returns the chosen replica (int32) from a
    :class:`~cacheresearch.routers.common.Context`; it must be a pure function of integers (float32
    only where the reference replays the same float32 steps) so that a plain-Python oracle reproduces
    every decision."""

    name: str
    id: int
    rule: Callable[[Context], Any] | None = None  # the JAX rule (None: the JAX engine refuses the router)
    knobs: tuple[Knob, ...] = ()
    uses: tuple[str, ...] = ()  # shared knobs the rule reads (besides its own)
    reads_cache: bool = False  # reads match / tree_size: needs the engine's per-replica prefix match
    reads_load: bool = False  # reads queue / active_blocks: needs the queue model
    summary: str = ""  # the rule in one line (the docs table)
    source: str = ""
    doc: str = ""  # the rule in full (the router file's docstring)
    numba: Callable | None = None  # the numba rule (routers/numba_rules.py's ARGS; None: the numba engines refuse)
    numba_refusal: Callable[[Any], str | None] | None = None  # a configuration its numba rule cannot model: why
    state_replica: int = 0  # int64 slots per replica the numba rule keeps across requests (sr)
    state_global: int = 0  # int64 slots for the whole fleet (sg)
    state_knob: str = ""  # one of its knobs: the rule keeps state only where it is > 0 (at 0 its JAX rule runs)

    @property
    def module(self) -> str:
        return getattr(self.rule if self.rule is not None else self.numba, "__module__", "") or ""

    @property
    def stateful(self) -> bool:
        """Keeps state across requests (its numba rule's ``sr`` / ``sg``): run by the numba engines only (with a
        ``state_knob``: only where that knob is > 0)."""
        return self.state_replica > 0 or self.state_global > 0

    def numba_only(self, p) -> bool:
        """Configuration ``p`` (one ``Params``) of this router runs on the numba engines only: it has no JAX rule,
        or it keeps state there (its ``state_knob`` > 0, or it has none)."""
        if self.rule is None:
            return True
        return self.stateful and (not self.state_knob or int(getattr(p, self.state_knob)) > 0)

    @property
    def load_free(self) -> bool:
        """Reads neither load nor cache and keeps no state: the routed sequence is fixed before the run
        (:mod:`cacheresearch.routers.fixed`)."""
        return not (self.reads_cache or self.reads_load or self.stateful)


@dataclass
class Registry:
    """Routers by name and the knobs declared for them, in declaration order."""

    _routers: dict[str, Router] = field(default_factory=dict)
    _shared: dict[str, list[Knob]] = field(default_factory=lambda: {"view": [], "replica": []})

    # -------------------------------------------------------------------- registration
    def register(self, router: Router) -> Router:
        if not isinstance(router, Router):
            raise TypeError(f"register() takes a Router, got {type(router).__name__}")
        if router.name in self._routers:
            raise ValueError(f"router {router.name!r} is already registered")
        if router.name in PRESETS:
            raise ValueError(f"router {router.name!r} has the name of a preset")
        if not isinstance(router.id, int) or router.id < 0:
            raise ValueError(f"router {router.name!r}: id must be an int >= 0, got {router.id!r}")
        taken = {r.id: r.name for r in self._routers.values()}
        if router.id in taken:
            raise ValueError(f"router {router.name!r}: id {router.id} is taken by {taken[router.id]!r}")
        if router.rule is None and router.numba is None:
            raise ValueError(f"router {router.name!r}: give its JAX rule (rule=), its numba rule (numba=) or both")
        if min(router.state_replica, router.state_global) < 0:
            raise ValueError(f"router {router.name!r}: state_replica and state_global are slot counts (>= 0)")
        if router.stateful and (router.numba is None or (router.rule is not None and not router.state_knob)):
            raise ValueError(f"router {router.name!r}: a router with state has a numba rule and no JAX rule (the JAX "
                             "scan carries no router state), unless a knob of its own (state_knob) turns the state "
                             "on: then its JAX rule models that knob at 0 only")
        if router.state_knob and router.state_knob not in {k.name for k in router.knobs}:
            raise ValueError(f"router {router.name!r}: state_knob {router.state_knob!r} is not one of its knobs")
        self._check_new_knobs(router.knobs, f"router {router.name!r}")
        self._routers[router.name] = router
        return router

    def unregister(self, name: str) -> Router:
        """Remove router ``name`` (a plug-in registered for a while, a test's); returns it."""
        if name not in self._routers:
            raise ValueError(f"router {name!r} is not registered")
        return self._routers.pop(name)

    def register_knobs(self, group: str, *knobs: Knob) -> tuple[Knob, ...]:
        """Declare knobs that are no single router's own: group ``view`` or ``replica``."""
        if group not in self._shared:
            raise ValueError(f"knob group must be one of {sorted(self._shared)}, got {group!r}")
        self._check_new_knobs(knobs, f"knob group {group!r}")
        self._shared[group].extend(knobs)
        return knobs

    def _check_new_knobs(self, knobs, who):
        known = {k.name for k in self.knobs()}
        names = [k.name for k in knobs]
        for k in knobs:
            if not isinstance(k, Knob):
                raise TypeError(f"{who}: knobs must be Knob declarations, got {k!r}")
        dup = sorted({n for n in names if n in known or names.count(n) > 1})
        if dup:
            raise ValueError(f"{who}: knobs {dup} are declared already (declare each knob once)")

    # -------------------------------------------------------------------- derived views
    def routers(self) -> tuple[Router, ...]:
        """Every registered router, by id."""
        return tuple(sorted(self._routers.values(), key=lambda r: r.id))

    def __getitem__(self, name: str) -> Router:
        return self._routers[name]

    def __contains__(self, name) -> bool:
        return name in self._routers

    def ids(self) -> dict[str, int]:
        """name -> id, in id order (``ROUTERS``)."""
        return {r.name: r.id for r in self.routers()}

    def cache_routers(self) -> tuple[str, ...]:
        """Routers that read ``match`` (need the engine's per-replica prefix match)."""
        return tuple(r.name for r in self.routers() if r.reads_cache)

    def load_free(self) -> tuple[str, ...]:
        """Routers that read neither load nor cache (hit curves and ``queue=False`` accept only these)."""
        return tuple(r.name for r in self.routers() if r.load_free)

    def shared_knobs(self, group: str) -> tuple[Knob, ...]:
        return tuple(self._shared[group])

    def router_knobs(self) -> tuple[Knob, ...]:
        """The routers' own knobs, in router-id order."""
        return tuple(k for r in self.routers() for k in r.knobs)

    def knobs(self) -> tuple[Knob, ...]:
        """Every knob: the ``view`` group, the routers' own, the ``replica`` group."""
        return self.shared_knobs("view") + self.router_knobs() + self.shared_knobs("replica")

    def knob(self, name: str) -> Knob:
        for k in self.knobs():
            if k.name == name:
                return k
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        """knob -> default (``ROUTER_DEFAULTS``)."""
        return {k.name: k.default for k in self.knobs()}

    def knob_readers(self, knob: str) -> tuple[str, ...]:
        """Routers whose rule reads ``knob`` (their own knobs and ``uses``)."""
        return tuple(r.name for r in self.routers() if knob in r.uses or any(k.name == knob for k in r.knobs))

    def group(self, knob: str) -> str:
        """``view``, ``replica`` or ``router`` (a router's own knob)."""
        for g, ks in self._shared.items():
            if any(k.name == knob for k in ks):
                return g
        self.knob(knob)
        return "router"

    def owner(self, knob: str) -> str | None:
        """The router declaring ``knob`` (None for shared knobs)."""
        for r in self.routers():
            if any(k.name == knob for k in r.knobs):
                return r.name
        return None

    def router_id(self, name: str) -> int:
        try:
            return self._routers[name].id
        except KeyError:
            raise ValueError(f"unknown router {name!r}; choose one of {sorted(self._routers)} or a preset "
                             f"{sorted(PRESETS)}") from None

    # -------------------------------------------------------------------- routing
    def route(self, router, req, fleet, params, ring=None, compiled=None):
        """Replica index (int32) chosen by router id ``router`` (dynamic).

        ``ring``: :func:`~cacheresearch.routers.common.ring_positions` (read by ``chwbl``; computed
        with 128 vnodes when omitted). ``compiled``: the router ids to build into the program (default
        all; an id outside it routes to 0, so callers must include every id they pass: the engine's
        static options check it). Only the compiled rules are evaluated, and the chosen one selected:
        each is O(R) integer work (``chwbl`` O(R x vnodes)), cheaper than a conditional per step and
        identical under vmap.
        """
        rs = self.routers()
        compiled = tuple(r.id for r in rs) if compiled is None else tuple(compiled)
        ctx = Context(req, fleet, params, ring)
        res = jnp.int32(0)
        for r in rs:
            if r.id in compiled and r.rule is not None:  # the engine's checks refuse a router without one
                res = jnp.where(router == r.id, r.rule(ctx), res)
        return res


#: The registry every router file of :mod:`cacheresearch.routers` registers into.
REGISTRY = Registry()


def register(router: Router) -> Router:
    """Register ``router`` in :data:`REGISTRY` (returns it)."""
    return REGISTRY.register(router)


def register_knobs(group: str, *knobs: Knob) -> tuple[Knob, ...]:
    """Declare shared knobs in :data:`REGISTRY` (group ``view`` or ``replica``)."""
    return REGISTRY.register_knobs(group, *knobs)


def route(router, req, fleet, params, ring=None, compiled=None):
    """:meth:`Registry.route` of :data:`REGISTRY` (the signature and results of the engine's router)."""
    return REGISTRY.route(router, req, fleet, params, ring=ring, compiled=compiled)


def router_id(name: str) -> int:
    return REGISTRY.router_id(name)


# ------------------------------------------------------------------------ the docs table
def _md(text: str) -> str:
    """reStructuredText inline literals as Markdown; table cells keep to one line."""
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def _md_block(text: str) -> str:
    return inspect.cleandoc(text).replace("``", "`").replace(":func:", "").replace(":mod:", "") \
        .replace(":data:", "").replace(":class:", "")


def _default_text(k: Knob) -> str:
    if k.kind == "bool":
        return "true" if k.default else "false"
    return num_text(k.default) if isinstance(k.default, int) else str(k.default)


def _path(module: str) -> str:
    return module.replace(".", "/") + ".py" if module else ""


def markdown_table(registry: Registry | None = None, presets: dict | None = None, extra_knobs=None) -> str:
    """``docs/routers.md``: the routers, their knobs, the presets and each rule in full, from the registry.

    ``extra_knobs``: knobs declared outside the registry, listed after its own (for :data:`REGISTRY`:
    the replica speed, :data:`cacheresearch.core.params.LATENCY_KNOBS`, which the caller passes: the
    registry does not import the core that builds on it).
    """
    reg = REGISTRY if registry is None else registry
    presets = PRESETS if presets is None else presets
    extra_knobs = tuple(extra_knobs or ())
    yes = lambda b: "yes" if b else ""  # noqa: E731
    out = [
        "# Routers",
        "",
        "Generated from the router registry (`cacheresearch/routers/`) by",
        "`python -m cacheresearch.routers docs/routers.md`; `tests/test_conformance.py` fails when this file",
        "and the registry differ. How to add a router: `docs/adding_a_router.md`. What a router sees (`match`,",
        "`queue`, `active_blocks`, `tree_size`, `bits`, `off`) and the tie-breaking of `argmin_rot` /",
        "`argmax_rot`: the docstring of `cacheresearch/routers/__init__.py`; the order of events of a fleet",
        "run: `docs/fleet_semantics.md`.",
        "",
        "## Rules",
        "",
        "| router | id | reads cache | reads load | knobs | rule | source | file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reg.routers():
        kn = ", ".join(f"`{n}`" for n in (*r.uses, *(k.name for k in r.knobs)))
        out.append(f"| `{r.name}` | {r.id} | {yes(r.reads_cache)} | {yes(r.reads_load)} | {kn} | {_md(r.summary)} "
                   f"| {_md(r.source)} | `{_path(r.module)}` |")
    out += [
        "",
        "Cache routers (`CACHE_ROUTERS`, read the prefix match in their view): "
        + ", ".join(f"`{n}`" for n in reg.cache_routers()) + ".",
        "Load-free routers (`LOAD_FREE_ROUTERS`, read neither load nor cache; one-pass hit curves and",
        "`queue=False` accept only these): " + ", ".join(f"`{n}`" for n in reg.load_free()) + ".",
        "",
        "## Knobs",
        "",
        "Every knob is a dynamic field of `Params` (a grid over knobs is one compiled program), a keyword of",
        "`make_params` and a key of the sweep's `fleet.knobs` and `grid.` (`prefix_blocks`: `fleet.prefix_blocks`).",
        "",
        "| knob | declared by | default | range | type | unit | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    own = {k.name for k in reg.knobs()}
    shared = {"view": "`views.py` (shared)", "replica": "`views.py` (replica)"}
    for k in reg.knobs() + extra_knobs:
        if k.name not in own:
            group = "`core/params.py` (replica speed)"
        elif reg.owner(k.name):
            group = f"`{reg.owner(k.name)}`"
        else:
            group = shared[reg.group(k.name)]
        out.append(f"| `{k.name}` | {group} | {_default_text(k)} | {k.range_text()} | {k.kind} | {k.unit or ''} "
                   f"| {_md(k.doc)} |")
    out += [
        "",
        "## Presets",
        "",
        "A preset name can be used wherever a router name is accepted; its keys override the defaults above.",
        "",
        "| preset | router | knobs | source |",
        "|---|---|---|---|",
    ]
    for name, p in presets.items():
        kn = ", ".join(f"`{k}={v}`" for k, v in p.items() if k not in ("router", "source"))
        out.append(f"| `{name}` | `{p['router']}` | {kn} | {_md(p.get('source', ''))} |")
    out += ["", "## The rules in full", ""]  # the router files' docstrings
    for r in reg.routers():
        out += [f"### `{r.name}` (id {r.id}, `{_path(r.module)}`)", "", _md_block(r.doc or r.summary), ""]
    return "\n".join(out).rstrip() + "\n"

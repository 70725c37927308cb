"""Cache policies: the registry. Each policy is declared once (:func:`register_policy`): its id, what it
takes (capacity, TTL), the rule family that implements it, its knobs; from the declarations follow the
``policy`` ids of ``Params``, the knob fields (``core/params.py``), the sweep's schema and
``docs/policies.md`` (:func:`policies_markdown`, tested up to date).

Families (``engine``) and what implements them:

* ``run_store`` (:mod:`.store`): recency over runs: LRU in leaf-first or prompt order under a capacity,
  or a TTL clock without one (``lru``, ``lru_plain``, ``ttl_refresh``, ``ttl_fixed``, ``unbounded``).
  Every access restamps a run, so a capacity policy here is LRU: a declaration with a capacity and
  ``refresh_on_hit=False`` (a FIFO, say) is refused, since the store would run it as LRU;
* ``priority`` (:mod:`.priority`): ranks runs beyond recency (``lfu_perfect``, ``length_aware``);
* ``s3fifo_sosp`` (:mod:`.s3fifo`): S3-FIFO with the paper's Algorithm 1 rules after a whole request
  is stored (the project's earlier ``s3fifo``), per block in the JAX scan;
* ``blocks``: libCacheSim's own policies, per block (``fifo``, ``sieve``, ``s3fifo``, ``lfu`` = in-cache
  LFU, ``arc``), each one numba kernel file (``kernel=``, :mod:`cacheresearch.cache.kernels`) that every
  numba engine runs through the dispatch generated from this registry (the fcfs fleet, the vllm pool, the
  KV tiers); the JAX scan runs those with a rule in :mod:`.blocks` and refuses the others in one line.

Common semantics: the hit of a request is the longest leading run of its block keys present on the
chosen replica at lookup (before any insertion or eviction for that request); then the request's
blocks are stored (the run store and priority rules: all of them, then eviction down to the
capacity; the per-block rules: one ``get`` per block, leaf-first, eviction before each insertion).
Each policy's oracle is in ``tests/reference.py`` (run-store, priority, s3fifo_sosp) or
``tests/reference_blocks.py`` (per block); ``tests/test_policy_conformance.py`` enumerates the registry.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["POLICIES", "PolicySpec", "policy_spec", "is_priority", "PRIORITY_IDS", "S3FIFO_ID", "BLOCK_IDS", "INF",
           "register_policy", "policies_markdown", "ENGINES", "block_policies", "BLOCK_POLICY_IDS", "BUILTIN_POLICIES",
           "unregister_policy"]

INF = 2**31 - 1  # "no limit" for capacity and TTL (int32)


ENGINES = ("run_store", "priority", "s3fifo_sosp", "blocks")
_PRIORITY_RULES = ("lfu_perfect", "length_aware")  # the rules cache.priority implements


class PolicySpec(NamedTuple):
    id: int
    uses_capacity: bool
    uses_ttl: bool
    leaf_first: bool
    refresh_on_hit: bool
    priority: bool = False  # ranks runs beyond recency (cache.priority)
    block_state: bool = False  # keeps per-block state in the JAX scan (cache.s3fifo)
    engine: str = "run_store"  # the rule family that implements it (module docstring)
    knobs: tuple = ()  # names of the knobs it reads (declared in cache.block.BLOCK_KNOBS)
    doc: str = ""
    kernel: str = ""  # engine "blocks": the module of its numba kernel (cacheresearch.cache.kernels)


POLICIES: dict[str, PolicySpec] = {}


def register_policy(name: str, spec: PolicySpec) -> PolicySpec:
    """Declare a policy; refuse a declaration its rule family does not implement."""
    import importlib.util  # noqa: PLC0415

    from cacheresearch.cache.block import BLOCK_KNOBS  # noqa: PLC0415

    if name in POLICIES or spec.id in {p.id for p in POLICIES.values()}:
        raise ValueError(f"policy {name!r} or id {spec.id} is already registered")
    if spec.engine not in ENGINES:
        raise ValueError(f"policy {name!r}: engine must be one of {ENGINES}, got {spec.engine!r}")
    if spec.engine == "run_store":
        if spec.uses_capacity and not spec.refresh_on_hit:
            raise ValueError(f"policy {name!r}: the run store restamps every access, so under a capacity it is "
                             "LRU whatever refresh_on_hit says (refresh_on_hit=False only keeps a TTL's write "
                             "time); a policy whose hits do not reorder (FIFO) is a per-block policy: "
                             "engine='blocks' with its kernel (cacheresearch/cache/kernels/)")
        if spec.uses_capacity and spec.uses_ttl:
            raise ValueError(f"policy {name!r}: the run store's policies take a capacity or a TTL, not both")
        if spec.priority or spec.block_state:
            raise ValueError(f"policy {name!r}: priority / block_state belong to other engines")
    if spec.engine == "priority" and (name not in _PRIORITY_RULES or not spec.priority):
        raise ValueError(f"policy {name!r}: cache.priority implements {_PRIORITY_RULES} only")
    if spec.engine == "s3fifo_sosp" and not spec.block_state:
        raise ValueError(f"policy {name!r}: the s3fifo_sosp rule keeps per-block state (block_state=True)")
    if spec.engine == "blocks":
        try:
            found = bool(spec.kernel) and importlib.util.find_spec(spec.kernel) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise ValueError(f"policy {name!r}: engine 'blocks' needs kernel= the module of its numba kernel "
                             f"(cacheresearch/cache/kernels/fifo.py is one), got {spec.kernel!r}")
        if not spec.uses_capacity or spec.uses_ttl:
            raise ValueError(f"policy {name!r}: the per-block policies take a capacity and no TTL")
    unknown = set(spec.knobs) - {k.name for k in BLOCK_KNOBS}
    if unknown:
        raise ValueError(f"policy {name!r}: knobs {sorted(unknown)} are not declared (cache.block.BLOCK_KNOBS)")
    POLICIES[name] = spec
    return spec


def unregister_policy(name: str) -> None:
    """Remove a policy registered at run time (a plug-in's); the package's own cannot be removed."""
    if name in BUILTIN_POLICIES:
        raise ValueError(f"policy {name!r} is one of the package's own")
    POLICIES.pop(name, None)


def block_policies() -> tuple[str, ...]:
    """The per-block policies registered now (the package's and any plug-in's), in their code order."""
    return tuple(n for n, p in POLICIES.items() if p.engine == "blocks")


_S3K = ("s3fifo_small_pm", "s3fifo_ghost_pm", "s3fifo_promote")
_K = "cacheresearch.cache.kernels."
for _name, _spec in (
    ("lru", PolicySpec(0, True, False, True, True, doc="leaf-first LRU (vLLM / SGLang): a request's first "
                       "block ends most recent; prefix-closed")),
    ("lru_plain", PolicySpec(1, True, False, False, True, doc="LRU in prompt order (blocks touched first to last)")),
    ("ttl_refresh", PolicySpec(2, False, True, True, True, doc="present while now - last access <= TTL; "
                               "every access refreshes")),
    ("ttl_fixed", PolicySpec(3, False, True, True, False, doc="expiry set at write; hits do not extend it")),
    ("unbounded", PolicySpec(4, False, False, True, True, doc="never evicts: the ideal hit rate")),
    ("lfu_perfect", PolicySpec(5, True, False, True, True, priority=True, engine="priority",
                               doc="perfect-history LFU: counts of requests containing the block survive "
                               "eviction; ties least recent first")),
    ("length_aware", PolicySpec(6, True, False, True, True, priority=True, engine="priority",
                                doc="Mooncake's LengthAwareCache: deepest block first, ties least recent")),
    ("s3fifo_sosp", PolicySpec(7, True, False, True, True, block_state=True, engine="s3fifo_sosp",
                               doc="S3-FIFO, SOSP'23 Algorithm 1 after the whole request is stored, no "
                               "warm-up rule, M overflow evicted at once (not libCacheSim's)")),
    ("fifo", PolicySpec(8, True, False, True, False, engine="blocks", kernel=_K + "fifo", doc="libCacheSim FIFO")),
    ("sieve", PolicySpec(9, True, False, True, False, engine="blocks", kernel=_K + "sieve",
                         doc="libCacheSim Sieve (NSDI'24)")),
    ("s3fifo", PolicySpec(10, True, False, True, False, engine="blocks", kernel=_K + "s3fifo", knobs=_S3K,
                          doc="libCacheSim S3FIFO (SOSP'23; its warm-up and lazy main trim)")),
    ("lfu", PolicySpec(11, True, False, True, False, engine="blocks", kernel=_K + "lfu",
                       doc="libCacheSim LFU: in-cache (counts forgotten at eviction), ties by bucket arrival")),
    ("arc", PolicySpec(12, True, False, True, False, engine="blocks", kernel=_K + "arc",
                       doc="libCacheSim ARC (FAST'03)")),
    ("clock", PolicySpec(13, True, False, True, False, engine="blocks", kernel=_K + "clock",
                         doc="libCacheSim Clock (second chance, a 1-bit counter)")),
):
    register_policy(_name, _spec)
#: the package's own policies (a plug-in registered later is not one)
BUILTIN_POLICIES = tuple(POLICIES)
#: the package's own per-block policies (:func:`block_policies`: with any plug-in's)
BLOCK_POLICY_IDS = block_policies()
BLOCK_IDS = tuple(p.id for p in POLICIES.values() if p.engine == "blocks")


def policies_markdown() -> str:
    """``docs/policies.md``: the registry as a table (tests/test_policy_conformance.py keeps it current)."""
    from cacheresearch.cache.block import BLOCK_KNOBS  # noqa: PLC0415

    kd = {k.name: k for k in BLOCK_KNOBS}
    lines = ["# Cache policies", "", "Generated from `cacheresearch/cache/policies.py` "
             "(`python -c \"from cacheresearch.cache.policies import policies_markdown as m; print(m())\"`).", "",
             "| policy | id | capacity | TTL | engine | knobs | rule |", "|---|---|---|---|---|---|---|"]
    for n, p in POLICIES.items():
        kn = ", ".join(f"`{k}`={kd[k].default}" for k in p.knobs) or "-"
        lines.append(f"| `{n}` | {p.id} | {'yes' if p.uses_capacity else '-'} | {'yes' if p.uses_ttl else '-'} "
                     f"| {p.engine} | {kn} | {p.doc} |")
    lines += ["", "Knobs:", ""] + [f"* `{k.name}` (default {k.default}, {k.lo}..{k.hi} {k.unit}): {k.doc}"
                                    for k in BLOCK_KNOBS]
    lines += ["", "Engines: `run_store`, `priority`, `s3fifo_sosp`: the JAX scan (every router and view; "
              "`priority` refuses the stale view, `s3fifo_sosp` the cache-reading routers); `blocks`: its numba kernel "
              "(`cacheresearch/cache/kernels/`) on every numba engine (the fcfs fleet with every router and view, "
              "the KV tiers, the vllm pool where the kernel has a pool's rules) and the JAX scan where it has a JAX "
              "rule (`cacheresearch/cache/blocks.py`).", ""]
    return "\n".join(lines)


S3FIFO_ID = POLICIES["s3fifo_sosp"].id
PRIORITY_IDS = tuple(p.id for p in POLICIES.values() if p.priority)


def is_priority(policy_id):
    """Whether policy ids (array or tracer) name a priority policy."""
    import jax.numpy as jnp

    return jnp.isin(policy_id, jnp.asarray(PRIORITY_IDS, jnp.int32))


def policy_spec(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None

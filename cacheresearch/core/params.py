"""The dynamic parameters of one configuration: :class:`Params`, built and validated from the declarations.

Every field is a scalar (or ``[G]`` for a grid), so one compile serves a whole grid. The fields, in
order:

* the cache policy (:func:`cacheresearch.cache.policies.policy_spec`): ``policy``, ``capacity``, ``ttl_ms``,
  ``leaf_first``, ``refresh``;
* ``replicas`` and ``router`` (the rule's id);
* the routers' knobs as the registry declares them (:mod:`cacheresearch.routers.registry`): the view
  group (``prefix_blocks``, ``view``, ``stale_lag_ms``, ``instances``, ``local_load``,
  ``index_capacity``), then each router's own knobs in router-id order;
* the replica model: its speed (:data:`LATENCY_KNOBS`: ``prefill_tps``, ``decode_us_per_token``), then
  the registry's replica group (``kv_pressure``) and the vllm replica's knobs;
* the per-block policies' knobs (:data:`cacheresearch.cache.block.BLOCK_KNOBS`: libCacheSim's S3FIFO
  parameters).

A knob's dtype, range and conversion come from its :class:`~cacheresearch.routers.registry.Knob`
declaration (:data:`KNOB_DECLS`), so a router added to the registry adds its fields here, its checks to
:func:`make_params` and its keys to the sweep's schema. Router knobs are documented in
``docs/routers.md``; the queue model in ``docs/fleet_semantics.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.cache.block import BLOCK_KNOBS, block_sizes
from cacheresearch.cache.policies import INF, policy_spec
from cacheresearch.routers import PRESETS, REGISTRY, Knob, router_id

__all__ = [
    "Params",
    "PARAM_DTYPES",
    "LATENCY_PRESETS",
    "LATENCY_KNOBS",
    "STEP_PRESETS",
    "STEP_KNOBS",
    "DEFAULT_STEP_PRESET",
    "STEP_TIME_KNOBS",
    "KNOBS",
    "KNOB_DECLS",
    "resolve_router",
    "make_params",
    "stack_params",
]

#: Replica speed presets (assumptions, every number overridable): prefill throughput on uncached
#: tokens and each output token's share of the replica's time under continuous batching.
LATENCY_PRESETS: dict[str, dict] = {
    "h100_8b": dict(
        prefill_tps=20_000, decode_us_per_token=250,
        source="assumption: Llama-3.1-8B-class model on one H100, vLLM; prefill about 20k tokens/s, "
        "decode about 4,000 tokens/s aggregate at moderate batch (0.25 ms of replica time per output token)",
    ),
    "h100_32b_tp2": dict(
        prefill_tps=10_000, decode_us_per_token=500,
        source="assumption: 32B-class model on two H100 (TP=2); prefill about 10k tokens/s, decode about "
        "2,000 tokens/s aggregate",
    ),
}

#: Replica speed knobs (the latency model); defaults from the ``h100_8b`` preset.
LATENCY_KNOBS: tuple[Knob, ...] = (
    Knob("prefill_tps", LATENCY_PRESETS["h100_8b"]["prefill_tps"], 1, 2_000_000,
         doc="prefill throughput per replica (uncached tokens only)", unit="tokens/s"),
    Knob("decode_us_per_token", LATENCY_PRESETS["h100_8b"]["decode_us_per_token"], 0, 2_000_000,
         doc="replica time per output token (amortised over the batch)", unit="us"),
)

#: Step-time presets of the vllm replica (replica/vllm.py, :func:`~cacheresearch.replica.vllm.step_time`): a step
#: of the running batch takes ``step_base_ns + step_prefill_ns * prefill tokens + step_decode_ns * decode
#: requests + step_ctx_ps * (context tokens of the decoding requests) + step_prefill_ctx_fs * (prefill
#: token x context token pairs)``, exactly, in picoseconds. The BLIS presets are linear (the last two 0). The
#: coefficients are BLIS's (llm-d's inference simulator, inference-sim/inference-sim ``defaults.yaml``,
#: ``beta_coeffs`` in microseconds, trained on vLLM v0.8.4), rounded to nanoseconds. They are
#: assumptions about a deployment, not measurements of one; every number is a knob.
STEP_PRESETS: dict[str, dict] = {
    "llama31_8b_h100_tp1": dict(
        step_base_ns=5_752_705, step_prefill_ns=17_251, step_decode_ns=5_999, kv_blocks=29_205,
        source="BLIS defaults.yaml, meta-llama/llama-3.1-8b-instruct, H100, TP=1, vLLM v0.8.4: "
        "beta = [5752.705, 17.2509, 5.9991] us; total_kv_blocks 29,205 (assumption for other versions)",
    ),
    "llama31_8b_a100_tp1": dict(
        step_base_ns=16_441_532, step_prefill_ns=47_837, step_decode_ns=18_206, kv_blocks=29_205,
        source="BLIS defaults.yaml, meta-llama/llama-3.1-8b-instruct, A100-80GB, TP=1, vLLM v0.8.4: "
        "beta = [16441.53, 47.8374, 18.2056] us",
    ),
    "codellama34b_h100_tp1": dict(
        step_base_ns=26_595_278, step_prefill_ns=96_284, step_decode_ns=56_586, kv_blocks=2_537,
        source="BLIS defaults.yaml, codellama/codellama-34b-instruct-hf, H100, TP=1, vLLM v0.8.4: "
        "beta = [26595.28, 96.2844, 56.5863] us; total_kv_blocks 2,537",
    ),
    "qwen3_32b_h100_tp2": dict(
        step_base_ns=13_297_639, step_prefill_ns=48_142, step_decode_ns=28_293, kv_blocks=19_208,
        source="assumption (BLIS publishes no Qwen3-32B): the codellama-34b H100 TP=1 coefficients above, "
        "all three halved for TP=2 (weights and compute split over two GPUs; communication ignored); "
        "kv_blocks: the llm-d blog's 307,328 KV tokens per pod / 16",
    ),
    "llama33_70b_h100_tp4": dict(
        step_base_ns=12_601_271, step_prefill_ns=76_423, step_decode_ns=66_844, kv_blocks=128_273,
        source="BLIS defaults.yaml, meta-llama/llama-3.3-70b-instruct, H100, TP=4, vLLM v0.8.4: "
        "beta = [12601.27, 76.4228, 66.8440] us; total_kv_blocks 128,273",
    ),
}
DEFAULT_STEP_PRESET = "llama31_8b_h100_tp1"
#: The step-time model's coefficients (a preset sets each; absent ones are 0).
STEP_TIME_KNOBS = ("step_base_ns", "step_prefill_ns", "step_decode_ns", "step_ctx_ps", "step_prefill_ctx_fs")

#: The vllm replica's knobs (replica/vllm.py): scheduler limits (vLLM's ``max_num_seqs`` and
#: ``max_num_batched_tokens``; its defaults vary by version and GPU: 256 / 2,048-8,192 on most
#: GPUs, 1,024 / 8,192 for the API server on GPUs with 70 GB or more), the step-time model, and the
#: latency metrics' warm-up.
STEP_KNOBS: tuple[Knob, ...] = (
    Knob("max_num_seqs", 256, 1, 65_536, doc="vllm replica: most requests in the running batch", unit="requests"),
    Knob("max_num_batched_tokens", 8192, 1, 131_072, doc="vllm replica: token budget of one step "
         "(prefill chunks + one token per decoding request)", unit="tokens"),
    Knob("step_base_ns", STEP_PRESETS[DEFAULT_STEP_PRESET]["step_base_ns"], 0, 2_000_000_000,
         doc="vllm replica: fixed time of a step (beta0)", unit="ns"),
    Knob("step_prefill_ns", STEP_PRESETS[DEFAULT_STEP_PRESET]["step_prefill_ns"], 0, 10_000_000,
         doc="vllm replica: step time per prefill token computed (beta1)", unit="ns"),
    Knob("step_decode_ns", STEP_PRESETS[DEFAULT_STEP_PRESET]["step_decode_ns"], 0, 10_000_000,
         doc="vllm replica: step time per decoding request (beta2)", unit="ns"),
    Knob("step_ctx_ps", 0, 0, 100_000_000, doc="vllm replica: step time per context token of each decoding "
         "request (its input + the tokens it generated: reading its KV)", unit="ps"),
    Knob("step_prefill_ctx_fs", 0, 0, 1_000_000_000, doc="vllm replica: step time per (prefill token, context "
         "token) pair of causal attention (a chunk of t tokens after c computed ones: t c + t (t + 1) / 2 pairs); "
         "the step's total is rounded up to a picosecond", unit="fs"),
    Knob("warmup_ms", 0, 0, 2**31 - 1, doc="latency metrics leave out requests arriving this long after the "
         "first arrival (warm-up)", unit="ms"),
)

#: The fields that are no knob: (name, dtype, meaning).
_FIXED_FIELDS = (
    ("policy", np.int32, "policy id (metadata; behaviour comes from the fields below)"),
    ("capacity", np.int32, "blocks per replica (INF = unbounded)"),
    ("ttl_ms", np.int32, "time to live (INF = no expiry)"),
    ("leaf_first", np.bool_, "recency order leaf-first"),
    ("refresh", np.bool_, "hits refresh the TTL clock"),
    ("replicas", np.int32, "active replicas"),
    ("router", np.int32, "router id (cacheresearch.routers.ROUTERS)"),
    ("s3fifo_small", np.int32, "s3fifo: small queue size in blocks, derived from capacity and s3fifo_small_pm as "
     "libCacheSim does (a double product, truncated; 0 for other policies)"),
    ("s3fifo_ghost", np.int32, "s3fifo: ghost size in keys, derived from capacity and s3fifo_ghost_pm likewise"),
)

#: Every knob declaration by name, in the order of :data:`KNOBS`.
KNOB_DECLS: dict[str, Knob] = {k.name: k for k in REGISTRY.knobs() + LATENCY_KNOBS + STEP_KNOBS + BLOCK_KNOBS}
#: Router and replica knobs (``ROUTER_DEFAULTS``' keys), then the replica speed.
KNOBS: tuple[str, ...] = tuple(KNOB_DECLS)

_PARAM_KNOBS = (REGISTRY.shared_knobs("view") + REGISTRY.router_knobs() + LATENCY_KNOBS
                + REGISTRY.shared_knobs("replica") + STEP_KNOBS + BLOCK_KNOBS)
_clash = sorted({n for n, _, _ in _FIXED_FIELDS} & set(KNOBS))
if _clash or len(KNOB_DECLS) != len(REGISTRY.knobs()) + len(LATENCY_KNOBS) + len(STEP_KNOBS) + len(BLOCK_KNOBS):
    raise ValueError(f"knob names collide with Params fields or each other: {_clash or sorted(KNOBS)}")

#: Params field -> NumPy dtype of its values.
PARAM_DTYPES: dict[str, np.dtype] = {
    **{n: np.dtype(d) for n, d, _ in _FIXED_FIELDS},
    **{k.name: k.dtype for k in _PARAM_KNOBS},
}

Params = NamedTuple("Params", [(name, jax.Array) for name in PARAM_DTYPES])
Params.__module__ = __name__
Params.__doc__ = (
    "Dynamic parameters of one configuration (every field a scalar, or [G] for a grid).\n\n"
    "Fields (dtype: meaning); router knobs in ``docs/routers.md``, the queue model in "
    "``docs/fleet_semantics.md``:\n\n"
    + "\n".join(f"* ``{n}`` ({np.dtype(d).name}): {doc}" for n, d, doc in _FIXED_FIELDS)
    + "\n"
    + "\n".join(f"* ``{k.name}`` ({k.dtype.name}): {k.doc}" for k in _PARAM_KNOBS)
    + "\n"
)


def resolve_router(router: str, **overrides) -> dict:
    """The router rule and every knob for ``router`` (a rule or a preset name) with ``overrides``."""
    knobs = {name: k.default for name, k in KNOB_DECLS.items()}
    if router in PRESETS:
        pre = dict(PRESETS[router])
        rule = pre.pop("router")
        pre.pop("source", None)
        knobs.update(pre)
    else:
        router_id(router)
        rule = router
    for k, v in overrides.items():
        if k not in knobs:
            raise ValueError(f"unknown router or latency knob {k!r}; known: {sorted(knobs)}")
        if v is not None:
            knobs[k] = v
    knobs["router"] = rule
    return knobs


def make_params(
    policy: str = "lru",
    capacity_blocks: int | None = None,
    ttl_s: float | None = None,
    replicas: int = 1,
    router: str = "round_robin",
    prefix_blocks: int | None = None,
    latency: str | None = None,
    step_model: str | None = None,
    **knobs,
) -> Params:
    """One configuration. Capacity is required for LRU policies, TTL for TTL policies.

    ``router`` is a rule (:data:`cacheresearch.routers.ROUTERS`) or a preset
    (:data:`cacheresearch.routers.PRESETS`); ``knobs`` override any router knob
    (:data:`cacheresearch.routers.ROUTER_DEFAULTS`; ``view`` by name) or the replica speed
    (``prefill_tps``, ``decode_us_per_token``; ``latency`` names a :data:`LATENCY_PRESETS` entry) and the
    vllm replica's knobs (:data:`STEP_KNOBS`; ``step_model`` names a :data:`STEP_PRESETS` entry).
    Every knob is checked against its declared range (:data:`KNOB_DECLS`).
    """
    spec = policy_spec(policy)
    if spec.uses_capacity:
        if capacity_blocks is None:
            raise ValueError(f"policy {policy!r} needs capacity_blocks")
        if not 0 <= int(capacity_blocks) < INF:
            raise ValueError(f"capacity_blocks must be in [0, {INF}), got {capacity_blocks}")
        cap = int(capacity_blocks)
    else:
        cap = INF
    if spec.uses_ttl:
        if ttl_s is None:
            raise ValueError(f"policy {policy!r} needs ttl_s")
        ttl = int(round(float(ttl_s) * 1000))
        if not 0 <= ttl < INF:
            raise ValueError(f"ttl_s must be in [0, {INF / 1000:.0f}] seconds, got {ttl_s}")
    else:
        ttl = INF
    if int(replicas) < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if latency is not None:
        if latency not in LATENCY_PRESETS:
            raise ValueError(f"unknown latency preset {latency!r}; choose one of {sorted(LATENCY_PRESETS)}")
        for k in LATENCY_KNOBS:
            knobs.setdefault(k.name, LATENCY_PRESETS[latency][k.name])
    if step_model is not None:
        if step_model not in STEP_PRESETS:
            raise ValueError(f"unknown step-time preset {step_model!r}; choose one of {sorted(STEP_PRESETS)}")
        for name in STEP_TIME_KNOBS:
            knobs.setdefault(name, STEP_PRESETS[step_model].get(name, 0))
    k = resolve_router(router, prefix_blocks=prefix_blocks, **knobs)
    # integer ranges first, then the float knobs (views are checked when converted)
    for kind in ("int", "float"):
        for decl in KNOB_DECLS.values():
            if decl.kind == kind:
                decl.check(k[decl.name])
    if int(k["gie_cpu_w_pct"]) > 0 and KNOB_DECLS["view"].value(k["view"]) != KNOB_DECLS["view"].value("gie_estimate"):
        raise ValueError(f"gie_cpu_w_pct: {k['gie_cpu_w_pct']} asks for llm-d's CPU-tier prefix scorer, an approximate "
                         f"index of GIE's prompt hashes: it needs view 'gie_estimate', not {k['view']!r}")
    small, ghost, _ = block_sizes(policy, cap, k)
    return Params(
        policy=np.int32(spec.id),
        capacity=np.int32(cap),
        ttl_ms=np.int32(ttl),
        leaf_first=np.bool_(spec.leaf_first),
        refresh=np.bool_(spec.refresh_on_hit),
        replicas=np.int32(replicas),
        router=np.int32(router_id(k["router"])),
        s3fifo_small=np.int32(small),
        s3fifo_ghost=np.int32(ghost),
        **{f: KNOB_DECLS[f].value(k[f]) for f in Params._fields if f in KNOB_DECLS},
    )


def stack_params(params: list[Params]) -> Params:
    """A grid [G] of configurations."""
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *params)

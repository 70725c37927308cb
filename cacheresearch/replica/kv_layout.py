"""A model's KV layout as vLLM's hybrid KV cache manager lays it out: groups per layer type, one page size.

Sources (vllm-project/vllm; the rules, not the code, are reproduced here):

* layer types and their specs: ``vllm/v1/kv_cache_interface.py`` (``FullAttentionSpec``: a page of
  ``block_size x 2 x kv_heads x head_dim x bytes`` per layer; ``MLAAttentionSpec``: no factor 2, one latent
  "head" of ``kv_lora_rank + qk_rope_head_dim``; ``SlidingWindowSpec``: a full-attention page with a window;
  ``MambaSpec``: the recurrent state, a fixed number of bytes per layer whatever the block size);
* state sizes: ``vllm/model_executor/layers/mamba/mamba_utils.py`` (``gated_delta_net_state_shape``: a
  convolution state ``(kernel - 1) x (2 x key heads x key dim + value heads x value dim) / tp`` and a
  recurrent state ``value heads / tp x key dim x value dim``, both in the model dtype by default);
* the block size a Mamba / linear-attention layer forces: ``HybridAttentionMambaModelConfig``
  (``vllm/model_executor/models/config.py``): the attention block is raised to
  ``16 x ceil(state bytes / (16 x attention bytes per token))`` tokens so an attention page holds a state,
  the state page is padded to the attention page, and in ``mamba_cache_mode="align"`` (the prefix-caching
  mode of these models) the Mamba block size is that block size; MLA's kernels force 64-token blocks on
  FlashMLA (``vllm/platforms/cuda.py``: "Forcing kv cache block size to 64 for FlashMLA backend");
* the groups: ``_get_kv_cache_groups_uniform_page_size`` (``vllm/v1/core/kv_cache_utils.py``): layers of one
  spec are split into groups of ``group_size`` layers (the fewest layers of any type, or the most when
  max < 1.5 x min), the last padded; every group's block has the same bytes, and the pool holds
  ``available // (page x group_size)`` blocks, each block serving one group at a time.

A model comes from a Hugging Face ``config.json`` (:func:`layout_from_config`: ``layer_types``,
``sliding_window`` / ``sliding_window_pattern``, ``full_attention_interval`` with the ``linear_*`` fields,
``kv_lora_rank`` / ``qk_rope_head_dim``; a ``text_config`` is read as the language model) or from
:data:`PRESETS` (the same fields, with their sources). Anything else is refused in one line naming the
field. :mod:`cacheresearch.replica.hardware` lays out its models with these rules (``kv_cache_layout``:
capacity with and without vLLM's hybrid manager). Plain Python; reads a config.json and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cacheresearch.replica.gpus import GIB, GPUS, GpuSpec

__all__ = ["LayerType", "KVLayout", "KVGroup", "Unified", "layout_from_config", "unify", "dense_counterpart",
           "pool_blocks", "held_blocks", "sequences_that_fit", "PRESETS", "preset_layout", "WEIGHT_BYTES",
           "runtime_layout", "engine_knobs", "UNIFY_ERROR"]

KINDS = ("full", "sliding_window", "mamba", "mla")
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "auto": 0, "fp8": 1,
                "fp8_e4m3": 1, "fp8_e5m2": 1}
_LAYER_NAMES = {"full_attention": "full", "sliding_attention": "sliding_window", "linear_attention": "mamba"}


@dataclass(frozen=True)
class LayerType:
    """One attention type of a model (vLLM's KV cache spec less its block size), bytes on one GPU."""

    kind: str  # full | sliding_window | mamba | mla
    layers: int
    token_bytes: int = 0  # attention: bytes of one token of one layer (0 for mamba)
    state_bytes: int = 0  # mamba: bytes of one layer's state (0 for attention)
    sliding_window: int = 0


@dataclass(frozen=True)
class KVLayout:
    name: str
    types: tuple[LayerType, ...]  # in order of first appearance in the layer stack
    tp: int
    source: str


@dataclass(frozen=True)
class KVGroup:
    kind: str
    layers: int  # real layers (the group's padding layers excluded)
    sliding_window: int = 0


@dataclass(frozen=True)
class Unified:
    """The layout vLLM runs: one block size, one page, ``groups`` sharing one pool of ``block_bytes`` blocks."""

    name: str
    block_tokens: int
    requested_block_tokens: int
    forced: str  # why the block size differs from the requested one ("" when it does not)
    page_bytes: int  # one block of one layer
    group_size: int  # layers per group (padding included)
    groups: tuple[KVGroup, ...]
    block_bytes: int  # page_bytes x group_size: the memory one block id stands for

    @property
    def hybrid(self) -> bool:
        return len({(g.kind, g.sliding_window) for g in self.groups}) > 1


def _int(c: dict, where: str, key: str, default=None, lo: int = 1) -> int:
    v = c.get(key, default)
    if v is None:
        raise ValueError(f"{where}: missing key {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < lo:
        raise ValueError(f"{where}: key {key!r} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _read(config, where: str) -> dict:
    if isinstance(config, dict):
        c = dict(config)
    else:
        try:
            c = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: cannot read a config.json: {e}") from None
    if not isinstance(c, dict):
        raise ValueError(f"{where}: a config.json is a JSON object")
    if isinstance(c.get("text_config"), dict):
        c = {**c["text_config"], "torch_dtype": c["text_config"].get("torch_dtype", c.get("torch_dtype"))}
    return c


def _layer_kinds(c: dict, where: str, L: int) -> list[str]:
    """The kind of every layer (module docstring: which field decides it)."""
    if c.get("layers_block_type") is not None or c.get("hybrid_override_pattern") is not None:
        key = "layers_block_type" if c.get("layers_block_type") is not None else "hybrid_override_pattern"
        raise ValueError(f"{where}: key {key!r}: Mamba2 hybrids (Jamba, Nemotron-H, Granite 4) are not modelled")
    if c.get("use_sliding_window"):
        raise ValueError(f"{where}: key 'use_sliding_window': max_window_layers windows are not modelled")
    lt = c.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != L:
            raise ValueError(f"{where}: key 'layer_types' must list {L} layer types, got {lt!r:.60}")
        bad = sorted({t for t in lt if t not in _LAYER_NAMES})
        if bad:
            raise ValueError(f"{where}: key 'layer_types': unsupported {bad}; known {sorted(_LAYER_NAMES)}")
        return [_LAYER_NAMES[t] for t in lt]
    if c.get("full_attention_interval") is not None:
        n = _int(c, where, "full_attention_interval")
        return ["full" if (i + 1) % n == 0 else "mamba" for i in range(L)]
    if c.get("sliding_window_pattern") is not None:
        n = _int(c, where, "sliding_window_pattern")
        return ["full" if (i + 1) % n == 0 else "sliding_window" for i in range(L)]
    if c.get("sliding_window") is not None:
        return ["sliding_window"] * L  # Mistral-style: every layer windowed
    return ["full"] * L


def _gdn_state_bytes(c: dict, where: str, tp: int, nbytes: int) -> int:
    """Gated DeltaNet state bytes per layer on one GPU (module docstring, ``gated_delta_net_state_shape``)."""
    nk, nv = _int(c, where, "linear_num_key_heads"), _int(c, where, "linear_num_value_heads")
    dk, dv = _int(c, where, "linear_key_head_dim"), _int(c, where, "linear_value_head_dim")
    kernel = _int(c, where, "linear_conv_kernel_dim", lo=2)
    conv_dim = 2 * nk * dk + nv * dv
    if conv_dim % tp or nv % tp:
        raise ValueError(f"{where}: key 'linear_num_value_heads': {nv} value heads / conv dim {conv_dim} "
                         f"do not split over tp={tp}")
    return (kernel - 1) * (conv_dim // tp) * nbytes + (nv // tp) * dk * dv * nbytes


def layout_from_config(config, *, tp: int = 1, kv_dtype: str = "auto", name: str | None = None) -> KVLayout:
    """The :class:`KVLayout` of a Hugging Face ``config.json`` (a path or its dict) on ``tp`` GPUs.

    ``kv_dtype``: ``auto`` (the model's ``torch_dtype``) or ``bf16`` / ``fp16`` / ``fp8``; it sets the
    attention bytes; linear-attention states keep the model dtype (vLLM's ``mamba_cache_dtype=auto``).
    """
    where = name or (str(config) if not isinstance(config, dict) else "config")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    c = _read(config, where)
    dt = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    if dt not in _DTYPE_BYTES or dt == "auto":
        raise ValueError(f"{where}: key 'torch_dtype': unknown dtype {dt!r}")
    model_bytes = _DTYPE_BYTES[dt]
    if kv_dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; choose one of {sorted(_DTYPE_BYTES)}")
    kvb = _DTYPE_BYTES[kv_dtype] or model_bytes
    L = _int(c, where, "num_hidden_layers")
    label = name or c.get("_name_or_path") or (Path(config).parent.name if not isinstance(config, dict) else "model")
    if c.get("kv_lora_rank"):
        width = _int(c, where, "kv_lora_rank") + _int(c, where, "qk_rope_head_dim")
        return KVLayout(str(label), (LayerType("mla", L, token_bytes=width * kvb),), tp,
                        f"{where}: MLA, {L} layers x one latent of {width} x {kvb} bytes per token (not split by tp)")
    qh = _int(c, where, "num_attention_heads")
    kvh = _int(c, where, "num_key_value_heads", default=qh)
    hd = _int(c, where, "head_dim", default=_int(c, where, "hidden_size") // qh)
    tok = 2 * max(1, kvh // tp) * hd * kvb
    kinds = _layer_kinds(c, where, L)
    window = _int(c, where, "sliding_window", lo=2) if "sliding_window" in kinds else 0
    state = _gdn_state_bytes(c, where, tp, model_bytes) if "mamba" in kinds else 0
    types = []
    for k in dict.fromkeys(kinds):
        n = kinds.count(k)
        types.append(LayerType(k, n, token_bytes=0 if k == "mamba" else tok, state_bytes=state if k == "mamba" else 0,
                               sliding_window=window if k == "sliding_window" else 0))
    desc = ", ".join(f"{t.layers} {t.kind}" + (f" (window {t.sliding_window})" if t.sliding_window else "")
                     for t in types)
    return KVLayout(str(label), tuple(types), tp,
                    f"{where}: {desc}; {kvh} KV heads x {hd} on tp={tp}: {tok} bytes per token per attention layer"
                    + (f"; linear state {state} bytes per layer" if state else ""))


def unify(layout: KVLayout, block_tokens: int = 16, *, kernel_alignment: int = 16, mla_block: int = 64) -> Unified:
    """vLLM's unified layout (module docstring): the block size (raised by a linear-attention state, or to
    ``mla_block`` for MLA), the page, the groups and the bytes of one block id."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    att = [t for t in layout.types if t.kind != "mamba"]
    if not att:
        raise ValueError(f"{layout.name}: no attention layer: attention-free models are not modelled")
    if len({t.token_bytes for t in att}) > 1:
        raise ValueError(f"{layout.name}: attention layers of different bytes per token are not modelled")
    per_tok = att[0].token_bytes
    bs, forced = block_tokens, ""
    if any(t.kind == "mla" for t in att) and block_tokens % mla_block:
        bs, forced = mla_block, f"MLA on FlashMLA: {mla_block}-token blocks"
    state = max((t.state_bytes for t in layout.types if t.kind == "mamba"), default=0)
    if state:
        need = kernel_alignment * -(-state // (kernel_alignment * per_tok))
        if bs < need:
            bs, forced = need, (f"a linear-attention state of {state} bytes per layer: attention block raised to "
                                f"{need} tokens ({per_tok} bytes per token per layer)")
    counts = [t.layers for t in layout.types]
    gsize = min(counts) if max(counts) >= 1.5 * min(counts) else max(counts)
    groups = []
    for t in layout.types:
        n = -(-t.layers // gsize)
        for i in range(n):
            groups.append(KVGroup(t.kind, len(range(i, t.layers, n)), t.sliding_window))
    page = bs * per_tok
    return Unified(layout.name, bs, block_tokens, forced, page, gsize, tuple(groups), page * gsize)


def dense_counterpart(layout: KVLayout) -> KVLayout:
    """The same model with every layer full attention (same heads, same weights): the dense model of its size."""
    att = [t for t in layout.types if t.kind != "mamba"]
    if not att:
        raise ValueError(f"{layout.name}: no attention layer to make dense")
    n = sum(t.layers for t in layout.types)
    kind = "mla" if att[0].kind == "mla" else "full"
    return KVLayout(f"{layout.name} (all full attention)", (LayerType(kind, n, token_bytes=att[0].token_bytes),),
                    layout.tp, f"{layout.name} with all {n} layers {kind}")


def pool_blocks(u: Unified, gpu, *, weight_bytes: int, tp: int = 1, gpu_memory_utilization: float = 0.9,
                overhead_bytes: int = 0) -> int:
    """vLLM's ``num_gpu_blocks``: ``(memory x utilisation - weights / tp - overhead) // block_bytes`` (one of
    them is vLLM's null block). Raises ``ValueError`` when the weights leave no room."""
    g = gpu if isinstance(gpu, GpuSpec) else GPUS.get(gpu)
    if g is None:
        raise ValueError(f"unknown gpu {gpu!r}; choose one of {sorted(GPUS)}")
    util = gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < float(util) <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    budget = int(g.memory_bytes * float(util)) - -(-int(weight_bytes) // tp) - int(overhead_bytes)
    if budget < 2 * u.block_bytes:
        raise ValueError(f"{u.name}: weights of {weight_bytes / GIB:.1f} GiB leave no KV room on tp={tp} x {g.name}")
    return budget // u.block_bytes


#: vLLM's error where its hybrid KV cache manager is off and the layers cannot take one type
#: (``unify_hybrid_kv_cache_specs``, ``vllm/v1/core/kv_cache_utils.py``)
UNIFY_ERROR = "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type"


def runtime_layout(layout, *, connector: bool, connector_supports_hma: bool):
    """The layout vLLM runs for ``layout`` (a :class:`KVLayout` or a :class:`Unified`; the same type comes back).

    vLLM turns its hybrid KV cache manager off when a KV connector is configured (``--kv-transfer-config``) that is
    not ``SupportsHMA`` (``vllm/config/vllm.py``: "Turning off hybrid kv cache manager because
    `--kv-transfer-config` is set"; the OffloadingConnector is ``SupportsHMA`` from vLLM 0.21.0 on, LMCache's
    connector is not). Then ``unify_hybrid_kv_cache_specs`` (``vllm/v1/core/kv_cache_utils.py``) leaves a layout of
    one type as it is, promotes sliding-window layers to full attention where full-attention layers exist (every
    layer keeps every token: no window freeing, one group of all the layers, so a block id stands for every layer's
    page and fewer blocks fit), and refuses linear-attention (Mamba) layers beside attention with ``UNIFY_ERROR``
    (a one-line ``ValueError``). With the manager on (no connector, or a ``SupportsHMA`` one) ``layout`` comes back.
    """
    if not isinstance(layout, (KVLayout, Unified)):
        raise ValueError(f"layout must be a KVLayout or a Unified, got {type(layout).__name__}")
    if not connector or connector_supports_hma:
        return layout
    parts = layout.types if isinstance(layout, KVLayout) else layout.groups
    kinds = [t.kind for t in parts]
    if len({(t.kind, t.sliding_window) for t in parts}) <= 1:
        return layout  # one type: nothing to unify
    if "mamba" in kinds:
        raise ValueError(f"{layout.name}: {UNIFY_ERROR} (a KV connector that is not SupportsHMA, with "
                         "linear-attention layers)")
    if "sliding_window" in kinds and not {"full", "mla"} & set(kinds):
        return layout
    full = "mla" if "mla" in kinds else "full"
    if isinstance(layout, KVLayout):
        n = sum(t.layers for t in layout.types)
        tok = next(t.token_bytes for t in layout.types if t.kind == full)
        return KVLayout(layout.name, (LayerType(full, n, token_bytes=tok),), layout.tp,
                        f"{layout.source}; run unified (hybrid KV cache manager off): all {n} layers {full}")
    n = sum(g.layers for g in layout.groups)
    return Unified(layout.name, layout.block_tokens, layout.requested_block_tokens, layout.forced, layout.page_bytes,
                   n, (KVGroup(full, n),), layout.page_bytes * n)


def engine_knobs(u: Unified) -> dict:
    """The vllm replica's knobs for layout ``u`` (``kv_groups``, ``kv_window_groups``, ``kv_window``): its groups in
    order, a bit per sliding-window group, their window. The pool's size in block ids is the ``capacity`` knob
    (``pool_blocks`` less vLLM's null block). Linear-attention (Mamba) groups, and window groups of different
    windows, are refused in one line."""
    if any(g.kind == "mamba" for g in u.groups):
        raise ValueError(f"{u.name}: linear-attention (Mamba) KV groups are not modelled by the vllm replica's engine "
                         "(kv_layout.engine_knobs); the hybrid_kv study's simulate_hybrid models them")
    wins = {g.sliding_window for g in u.groups if g.kind == "sliding_window"}
    if len(wins) > 1:
        raise ValueError(f"{u.name}: sliding windows of different sizes {sorted(wins)} are not modelled by the vllm "
                         "replica's engine (kv_window is one window)")
    if len(u.groups) > 30:
        raise ValueError(f"{u.name}: {len(u.groups)} KV groups; kv_groups is at most 30")
    mask = sum(1 << g for g, grp in enumerate(u.groups) if grp.kind == "sliding_window")
    return {"kv_groups": len(u.groups), "kv_window_groups": mask, "kv_window": wins.pop() if wins else 0}


def held_blocks(group: KVGroup, tokens: int, block_tokens: int) -> int:
    """Blocks one running request holds in ``group`` when its next step has ``tokens`` slots (``tokens - 1``
    computed): full / MLA every block; a window ``W`` frees the blocks wholly before ``tokens - W``
    (``get_num_skipped_tokens``); a linear-attention group one running-state block."""
    n = -(-tokens // block_tokens)
    if group.kind == "sliding_window":
        return n - max(0, tokens - group.sliding_window) // block_tokens
    if group.kind == "mamba":
        return 1
    return n


def sequences_that_fit(u: Unified, blocks: int, tokens: int) -> int:
    """Requests of ``tokens`` tokens that the pool holds at once (the null block excluded)."""
    per = sum(held_blocks(g, tokens, u.block_tokens) for g in u.groups)
    return max(blocks - 1, 0) // per


#: Weight bytes the presets' capacity uses (sources in the text).
WEIGHT_BYTES: dict[str, tuple[int, str]] = {
    "gpt-oss-120b": (int(60.8 * GIB), "openai/gpt-oss-120b model card (arXiv 2508.10925) Table 1: checkpoint 60.8 GiB "
                                      "(MXFP4 experts, BF16 attention)"),
    "gpt-oss-20b": (int(12.8 * GIB), "openai/gpt-oss-20b model card (arXiv 2508.10925) Table 1: checkpoint 12.8 GiB"),
    "qwen3-next-80b-a3b": (int(80e9 * 2), "Qwen/Qwen3-Next-80B-A3B-Instruct: 80 B parameters (model card), BF16"),
    "gemma-3-27b": (int(27e9 * 2), "google/gemma-3-27b-it: 27 B parameters (model card), BF16"),
    "llama-3.1-8b": (int(8.03e9 * 2), "meta-llama/Llama-3.1-8B-Instruct: 8.03 B parameters (model card), BF16"),
    "llama-3.1-70b": (int(70.6e9 * 2), "meta-llama/Llama-3.1-70B-Instruct: 70.6 B parameters (model card), BF16"),
    "deepseek-v3": (int(671e9), "deepseek-ai/DeepSeek-V3: 671 B parameters (model card), FP8 weights"),
}

#: The fields of each model's published config.json the layout reads (the test fixtures under
#: ``tests/fixtures/hf_configs/hybrid/`` carry the same values with their sources).
PRESETS: dict[str, dict] = {
    "gpt-oss-120b": dict(num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                         hidden_size=2880, sliding_window=128, torch_dtype="bfloat16",
                         layer_types=["sliding_attention", "full_attention"] * 18),
    "gpt-oss-20b": dict(num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                        hidden_size=2880, sliding_window=128, torch_dtype="bfloat16",
                        layer_types=["sliding_attention", "full_attention"] * 12),
    "gemma-3-27b": dict(num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                        hidden_size=5376, sliding_window=1024, sliding_window_pattern=6, torch_dtype="bfloat16"),
    "qwen3-next-80b-a3b": dict(num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                               hidden_size=2048, full_attention_interval=4, linear_num_key_heads=16,
                               linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                               linear_conv_kernel_dim=4, torch_dtype="bfloat16"),
    "llama-3.1-8b": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                         torch_dtype="bfloat16"),
    "llama-3.1-70b": dict(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, hidden_size=8192,
                          torch_dtype="bfloat16"),
    "deepseek-v3": dict(num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, hidden_size=7168,
                        kv_lora_rank=512, qk_rope_head_dim=64, torch_dtype="bfloat16"),
}


def preset_layout(name: str, *, tp: int = 1, kv_dtype: str = "auto") -> KVLayout:
    """The :class:`KVLayout` of a preset of :data:`PRESETS`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return layout_from_config(PRESETS[name], tp=tp, kv_dtype=kv_dtype, name=name)

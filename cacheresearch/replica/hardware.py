"""KV-cache capacity from hardware: how many cache blocks fit on a replica.

A replica is one model served on ``tp`` GPUs (tensor parallel). Following vLLM's accounting
(``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory`` and
``vllm/v1/core/kv_cache_utils.py``), each GPU of the replica may use ``gpu_memory_utilization``
of its memory; from that budget it subtracts its share of the weights (``weight_bytes / tp``) and
any other reserved memory (activations, CUDA graphs: ``overhead_bytes``, 0 unless given, since it
depends on batch settings and is profiled at start-up), and the rest holds KV blocks. A block of
``block_tokens`` tokens costs, per GPU,

    block_bytes = block_tokens * 2 (K and V) * layers * kv_heads_per_gpu * head_dim * bytes_per_element

with ``kv_heads_per_gpu = max(1, kv_heads // tp)`` (a KV head is replicated when ``tp`` exceeds the
model's KV heads) and ``bytes_per_element`` 2 for ``bf16`` / ``fp16``, 1 for ``fp8`` (FP8 halves
the KV bytes; the weights keep their own size). Every GPU of the replica holds the same blocks
(each a slice of the heads), so the replica's capacity is the per-GPU count::

    blocks = floor((mem * gpu_memory_utilization - weight_bytes / tp - overhead_bytes) / block_bytes)

(``weight_bytes`` plus ``resident_extra_bytes``: what a backend holds besides the weights, MXFP4 below.)

This is an upper-bound style estimate: vLLM's profiled activation peak and non-torch memory lower it
(set ``overhead_bytes``). Presets carry their ``source``; the memory figures are the bytes that
``torch.cuda.mem_get_info`` / ``nvidia-smi`` report as the device total (not the marketing GB).

Plain Python; no JAX. :func:`kv_blocks` is the API the sweeps (``replica.gpu=... replica.model=...``)
and the batching replica use.

**Any model by its ``config.json``.** ``replica.model`` is a preset name of :data:`MODELS` or the path of
a Hugging Face ``config.json`` (:func:`model_from_config`): layers, attention and KV heads, head
dimension, and the parameter count computed from the shapes (embeddings, attention projections, a
gated MLP or a mixture of experts: all experts' weights are held, only ``num_experts_per_tok`` of them
compute per token, so the roofline's FLOPs use the active count, while its weight read per step counts
every expert: a batch of any size touches most of them, so small batches are charged too much).
Weights take ``torch_dtype``'s bytes (or 1 per parameter under an ``fp8`` ``quantization_config``).
Attention biases count when ``attention_bias`` is true; gpt-oss (``model_type`` ``gpt_oss``, vLLM's
``GptOssModel``) also carries expert biases (``2 x intermediate + hidden`` per expert), a router bias and one
attention sink per query head. Norms are left out (a few hundred thousand parameters).

**MXFP4** (``quantization_config.quant_method = "mxfp4"``, gpt-oss): vLLM's ``Mxfp4Config``
(``vllm/model_executor/layers/quantization/mxfp4.py``) quantises only the experts of the fused MoE layers;
every linear layer (attention, router), the embeddings and the LM head stay in ``torch_dtype`` (the config's
``modules_to_not_convert`` lists exactly these). An expert matrix holds 4-bit values (two per byte) and one
e8m0 byte of scale per 32 values along its input: 4.25 bits per weight, in the shapes of
``Mxfp4MoEMethod.create_weights`` on the Triton backend (vLLM's default on H100 / H200 with
``triton_kernels``): ``w13`` ``experts x 2 I x (H / 2 + H / 32)`` and ``w2`` ``experts x H x (I / 2 + I / 32)``
bytes with ``I`` rounded up to 64; the expert biases stay BF16. gpt-oss-120b: 116.83 B parameters,
65,248,395,264 bytes = 60.77 GiB (model card, arXiv 2508.10925: 116.83 B, checkpoint 60.8 GiB): the
``weight_bytes`` a step reads. After loading, the Triton backend (``process_weights_after_loading``) holds
more (``ModelSpec.resident_extra_bytes``, taken out of the KV budget): it swizzles the expert scales into a
new tensor for the kernel and keeps the checkpoint's ``w13_weight_scale`` / ``w2_weight_scale`` parameters
(one byte per 32 expert weights a second time), and casts the expert biases to FP32. gpt-oss-120b: 3.41 GiB
more, 64.18 GiB in all; vLLM logs "Model loading took 64.38 GiB memory" for it on one H100 with the Triton
backend (vllm-project/vllm issue 33155, v0.14.1): 0.3% apart (the rest, 0.2 GiB, is not modelled:
buffers such as the rotary cache, any tile padding of the Hopper swizzle). Other backends are **not
modelled**: Marlin (GPUs below SM90, older vLLM on H100, ``VLLM_MXFP4_USE_MARLIN``) pads ``H`` to 256 and
``I`` to 128 (about 65.9 GiB at 4.25 bits per weight; vLLM v0.10 logged 65.97 GiB with Marlin on an H100,
issue 23278), FlashInfer's SM90 backend (``VLLM_USE_FLASHINFER_MOE_MXFP4_BF16``) pads both to 128. Other
quantisation methods are refused.

**Sliding-window layers** (``layer_types`` with ``sliding_attention``, or Gemma's ``sliding_window_pattern``)
are read by :func:`cacheresearch.replica.kv_layout.layout_from_config` (``ModelSpec.kv_types``). Their KV
capacity comes from vLLM's unified layout (:func:`kv_cache_layout`, by :mod:`cacheresearch.replica.kv_layout`'s rules):
with the hybrid KV cache manager (vLLM's default) the window and full layers are separate groups of one page
size and a block id stands for ``page x group_size`` bytes (``kv_layout.pool_blocks``); with it disabled
(``hybrid_manager=False``: vLLM disables it for a KV connector that is not ``SupportsHMA``, e.g. the
OffloadingConnector before v0.21.0, ``vllm/config/vllm.py``) ``unify_hybrid_kv_cache_specs``
(``vllm/v1/core/kv_cache_utils.py``) promotes every window layer to full attention and a block holds all
layers (this module's formula above). :func:`kv_bytes_per_token` and :func:`block_bytes` are the bytes of a
token / block across every layer (what the manager without the hybrid groups stores, and what a KV
connector moves); ``kind="full"`` / ``"sliding_window"`` restricts them to one layer type.
Still refused with the reason: multi-head latent attention (``kv_lora_rank``), linear attention,
``use_sliding_window`` (Qwen2's ``max_window_layers``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from os import PathLike
from pathlib import Path

from cacheresearch.replica.gpus import GIB, GPUS, MIB, GpuSpec
from cacheresearch.replica.kv_layout import (
    KVLayout,
    LayerType,
    Unified,
    dense_counterpart,
    layout_from_config,
    pool_blocks,
    unify,
)

__all__ = ["ModelSpec", "GpuSpec", "MODELS", "GPUS", "KV_DTYPE_BYTES", "kv_bytes_per_token", "block_bytes",
           "kv_blocks", "kv_tokens", "capacity_table", "model_from_config", "resolve_model", "HF_MODEL_IDS",
           "preset_for_hf_id", "MXFP4_BLOCK", "MIB", "GIB", "kv_layout_of", "kv_cache_layout"]



@dataclass(frozen=True)
class ModelSpec:
    """The numbers of a model config that set its KV footprint (``config.json`` of the model)."""

    name: str
    layers: int  # num_hidden_layers
    kv_heads: int  # num_key_value_heads (GQA)
    head_dim: int  # head_dim, or hidden_size / num_attention_heads
    params: float  # parameter count
    weight_bytes: int  # bytes of the weights as served (bf16: 2 per parameter)
    source: str
    q_heads: int = 0  # num_attention_heads (0: the roofline's table of presets)
    active_params: float = 0.0  # parameters that compute per token (mixtures of experts; 0: all of them)
    hidden: int = 0  # hidden_size (0: q_heads x head_dim, which it is for every preset but Qwen3-32B)
    #: attention layer types as ``(kind, layers, sliding_window)`` in order of first appearance (kv_layout's
    #: kinds ``full`` / ``sliding_window``); empty: every layer full attention
    kv_types: tuple = ()
    #: bytes vLLM holds after loading besides ``weight_bytes`` (in the KV budget, not in the weight read per
    #: step): the MXFP4 Triton backend's second copy of the expert scales and its FP32 expert biases
    resident_extra_bytes: int = 0

    @property
    def window_layers(self) -> int:
        """Sliding-window layers (0 for a model of full attention only)."""
        return sum(n for k, n, _ in self.kv_types if k == "sliding_window")

    @property
    def full_layers(self) -> int:
        """Full-attention layers."""
        return self.layers - self.window_layers

    @property
    def sliding_window(self) -> int:
        """Tokens of the window (0 without window layers)."""
        return max((w for k, _, w in self.kv_types if k == "sliding_window"), default=0)


def _bf16(params: float) -> int:
    return int(round(params * 2))


#: Model presets: config.json fields of the published checkpoints; weights in BF16 (2 bytes per parameter).
MODELS: dict[str, ModelSpec] = {
    "llama3_8b": ModelSpec(
        "llama3_8b", 32, 8, 128, 8.03e9, _bf16(8.03e9),
        "meta-llama/Llama-3.1-8B-Instruct config.json: num_hidden_layers 32, num_key_value_heads 8, hidden_size "
        "4096 / 32 heads = head_dim 128; 8.03 B parameters (model card), BF16 weights"),
    "llama3_70b": ModelSpec(
        "llama3_70b", 80, 8, 128, 70.6e9, _bf16(70.6e9),
        "meta-llama/Llama-3.1-70B-Instruct config.json: num_hidden_layers 80, num_key_value_heads 8, hidden_size "
        "8192 / 64 heads = head_dim 128; 70.6 B parameters (model card), BF16 weights"),
    "qwen2.5_32b": ModelSpec(
        "qwen2.5_32b", 64, 8, 128, 32.8e9, _bf16(32.8e9),
        "Qwen/Qwen2.5-32B-Instruct config.json: num_hidden_layers 64, num_key_value_heads 8, hidden_size 5120 / "
        "40 heads = head_dim 128; 32.8 B parameters (model card), BF16 weights"),
    "qwen3_8b": ModelSpec(
        "qwen3_8b", 36, 8, 128, 8.2e9, _bf16(8.2e9),
        "Qwen/Qwen3-8B config.json: num_hidden_layers 36, num_key_value_heads 8, head_dim 128; 8.2 B parameters "
        "(model card), BF16 weights"),
    "qwen3_32b": ModelSpec(
        "qwen3_32b", 64, 8, 128, 32.8e9, _bf16(32.8e9),
        "Qwen/Qwen3-32B config.json: num_hidden_layers 64, num_key_value_heads 8, num_attention_heads 64, head_dim "
        "128, hidden_size 5120; 32.8 B parameters (model card), BF16 weights", hidden=5120),
    "codellama_34b": ModelSpec(
        "codellama_34b", 48, 8, 128, 33.7e9, _bf16(33.7e9),
        "codellama/CodeLlama-34b-Instruct-hf config.json: num_hidden_layers 48, num_key_value_heads 8, hidden_size "
        "8192 / 64 heads = head_dim 128; 33.7 B parameters (model card), BF16 weights"),
    "mistral_7b": ModelSpec(
        "mistral_7b", 32, 8, 128, 7.25e9, _bf16(7.25e9),
        "mistralai/Mistral-7B-Instruct-v0.3 config.json: num_hidden_layers 32, num_key_value_heads 8, head_dim "
        "128; 7.25 B parameters (model card), BF16 weights"),
}

#: Hugging Face model ids (as inference-perf's ``server.model_name`` / ``tokenizer`` name them) of the presets.
HF_MODEL_IDS: dict[str, str] = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama3_8b", "meta-llama/Llama-3.1-8B": "llama3_8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama3_8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama3_70b", "meta-llama/Llama-3.3-70B-Instruct": "llama3_70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama3_70b",
    "Qwen/Qwen2.5-32B-Instruct": "qwen2.5_32b", "Qwen/Qwen2.5-32B": "qwen2.5_32b",
    "Qwen/Qwen3-8B": "qwen3_8b", "Qwen/Qwen3-32B": "qwen3_32b",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama_34b",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral_7b",
}


def preset_for_hf_id(model_id: str) -> str | None:
    """The preset of a Hugging Face model id (:data:`HF_MODEL_IDS`, case-insensitive), or ``None``."""
    low = {k.lower(): v for k, v in HF_MODEL_IDS.items()}
    return low.get(str(model_id).strip().lower())


#: Bytes per KV element by ``kv_dtype`` (vLLM's ``--kv-cache-dtype``: auto = the model dtype, fp8 = 1 byte).
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def lookup(table: dict, name, what: str):
    if isinstance(name, (ModelSpec, GpuSpec)):
        return name
    if table is MODELS:
        return resolve_model(name)
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(table)}") from None


def resolve_model(model) -> ModelSpec:
    """A :class:`ModelSpec`, a preset name of :data:`MODELS`, or the path of a model's ``config.json``."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str) and model in MODELS:
        return MODELS[model]
    if isinstance(model, (str, PathLike)) and (str(model).endswith(".json") or Path(model).is_file()):
        p = Path(model).expanduser().resolve()
        if not p.is_file():
            raise ValueError(f"replica.model: no such config.json: {model}")
        return _config_spec(str(p), p.stat().st_mtime_ns)
    raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)} or give the path of its config.json")


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2, "bf16": 2, "fp16": 2}


def _cfg_int(c: dict, path: str, *keys, default=None) -> int:
    for k in keys:
        v = c.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
                raise ValueError(f"{path}: key {k!r} must be a non-negative integer, got {v!r}")
            return int(v)
    if default is not None:
        return default
    raise ValueError(f"{path}: missing key {' / '.join(map(repr, keys))}")


#: Values per e8m0 scale byte of an MXFP4 matrix (OCP microscaling block): 4 bits a value + 8 bits per 32.
MXFP4_BLOCK = 32


def _kv_types(c: dict, p: Path, L: int) -> tuple:
    """The attention layer types of a config with sliding-window layers (kv_layout reads them); ``()`` when
    every layer is full attention. Linear attention and Qwen2's ``use_sliding_window`` are refused."""
    lt = c.get("layer_types") or []
    if c.get("use_sliding_window"):
        raise ValueError(f"{p}: key 'use_sliding_window': sliding-window layers chosen by max_window_layers are "
                         "not modelled")
    if "linear_attention" in lt or c.get("full_attention_interval") is not None:
        raise ValueError(f"{p}: key 'layer_types': linear-attention layers are not modelled here "
                         "(replica/kv_layout.py lays them out)")
    if "sliding_attention" not in lt and c.get("sliding_window_pattern") is None:
        return ()
    lay = layout_from_config(dict(c, num_hidden_layers=L), name=str(p))
    return tuple((t.kind, t.layers, t.sliding_window) for t in lay.types)


def _mxfp4_expert_bytes(p: Path, H: int, e_ffn: int) -> int:
    """Bytes of one expert's three matrices in vLLM's MXFP4 layout (module docstring), Triton backend."""
    if H % MXFP4_BLOCK:
        raise ValueError(f"{p}: key 'hidden_size' must be a multiple of {MXFP4_BLOCK} for mxfp4 experts, got {H}")
    ip = -(-e_ffn // 64) * 64
    return 2 * ip * (H // 2 + H // MXFP4_BLOCK) + H * (ip // 2 + ip // MXFP4_BLOCK)


def _weight_bytes(c: dict, p: Path, total: float, expert_params: float, expert_bytes: int) -> tuple[int, str]:
    """Weight bytes and their description: ``torch_dtype`` bytes, 1 per parameter under fp8, MXFP4 experts."""
    dt = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    q = c.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower() if q else ""
    if method == "fp8":
        return int(round(total * 1)), "1 bytes per weight"
    if method and method != "mxfp4":
        raise ValueError(f"{p}: quantization_config.quant_method {method!r}: only fp8 and mxfp4 weights are modelled")
    if dt not in _DTYPE_BYTES:
        raise ValueError(f"{p}: key 'torch_dtype': unknown dtype {dt!r}; known: {sorted(_DTYPE_BYTES)}")
    wb = _DTYPE_BYTES[dt]
    if not method:
        return int(round(total * wb)), f"{wb} bytes per weight"
    if not expert_params:
        raise ValueError(f"{p}: quantization_config.quant_method 'mxfp4' without experts: vLLM quantises only "
                         "fused-MoE experts; not modelled")
    return (int(round((total - expert_params) * wb)) + expert_bytes,
            f"mxfp4 experts ({expert_bytes / 2**30:.2f} GiB, 4.25 bits per weight), other weights {wb} bytes")


def model_from_config(path, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face ``config.json`` (module docstring). A nested
    ``text_config`` (multimodal checkpoints) is read as the language model. Raises ``ValueError``
    naming the file and key for a missing or malformed field and for architectures it does not model."""
    p = Path(path)
    try:
        c = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: cannot read a config.json: {e}") from None
    if not isinstance(c, dict):
        raise ValueError(f"{p}: a config.json is a JSON object")
    if isinstance(c.get("text_config"), dict):  # the language model of a multimodal checkpoint
        tc = c["text_config"]
        c = {**tc, "torch_dtype": tc.get("torch_dtype", c.get("torch_dtype")),
             "quantization_config": tc.get("quantization_config", c.get("quantization_config"))}
    if c.get("kv_lora_rank"):
        raise ValueError(f"{p}: multi-head latent attention (kv_lora_rank) caches a latent per token, not "
                         "kv_heads x head_dim: not modelled")
    L = _cfg_int(c, str(p), "num_hidden_layers", "n_layer", "num_layers")
    H = _cfg_int(c, str(p), "hidden_size", "n_embd", "d_model")
    qh = _cfg_int(c, str(p), "num_attention_heads", "n_head")
    if qh == 0 or H == 0 or L == 0:
        raise ValueError(f"{p}: num_hidden_layers, hidden_size and num_attention_heads must be positive")
    kv_types = _kv_types(c, p, L)
    kvh = _cfg_int(c, str(p), "num_key_value_heads", default=qh)
    hd = _cfg_int(c, str(p), "head_dim", default=H // qh)
    V = _cfg_int(c, str(p), "vocab_size")
    ffn = _cfg_int(c, str(p), "intermediate_size", "ffn_dim", "n_inner", default=4 * H)
    n_exp = _cfg_int(c, str(p), "num_experts", "num_local_experts", "n_routed_experts", default=0)
    top_k = _cfg_int(c, str(p), "num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk",
                     default=0)
    if n_exp and not top_k:
        raise ValueError(f"{p}: {n_exp} experts but no num_experts_per_tok")
    e_ffn = _cfg_int(c, str(p), "moe_intermediate_size", default=ffn)
    sh_ffn = _cfg_int(c, str(p), "shared_expert_intermediate_size", default=0)
    sparse = set(c.get("mlp_only_layers") or [])
    step = _cfg_int(c, str(p), "decoder_sparse_step", default=1) or 1
    attn = H * qh * hd + 2 * H * kvh * hd + qh * hd * H
    if c.get("attention_bias") is True:
        attn += qh * hd + 2 * kvh * hd + H
    oss = c.get("model_type") == "gpt_oss"  # expert and router biases, one sink per query head (vLLM GptOssModel)
    attn += qh if oss else 0
    e_bias, r_bias = (2 * e_ffn + H, n_exp) if oss else (0, 0)
    dense = 3 * H * ffn
    total = active = experts = 0.0
    n_moe = 0
    for layer in range(L):
        moe = n_exp > 0 and layer not in sparse and (layer + 1) % step == 0
        if moe:
            n_moe += 1
            shared = 3 * H * sh_ffn + (H if sh_ffn else 0)
            total += attn + n_exp * (3 * H * e_ffn + e_bias) + H * n_exp + r_bias + shared
            active += attn + top_k * (3 * H * e_ffn + e_bias) + H * n_exp + r_bias + shared
            experts += n_exp * 3 * H * e_ffn
        else:
            total += attn + dense
            active += attn + dense
    emb = V * H * (1 if c.get("tie_word_embeddings", False) else 2)
    total, active = total + emb, active + emb
    q = c.get("quantization_config") or {}
    mx = bool(q) and str(q.get("quant_method", "")).lower() == "mxfp4" and experts > 0
    wbytes, wdesc = _weight_bytes(c, p, total, experts, n_moe * n_exp * _mxfp4_expert_bytes(p, H, e_ffn) if mx else 0)
    # the Triton backend keeps the checkpoint's scales beside their swizzled copy, and casts the biases to FP32
    extra = int(experts) // MXFP4_BLOCK + n_moe * n_exp * e_bias * 2 if mx else 0
    if extra:
        wdesc += f"; {extra / 2**30:.2f} GiB more held after loading (scales twice, FP32 expert biases)"
    arch = ",".join(c.get("architectures") or []) or "?"
    label = name or (p.parent.name if p.stem == "config" and p.parent.name else p.stem)
    win = "".join(f", {n} {k}" + (f" (window {w})" if w else "") for k, n, w in kv_types)
    return ModelSpec(label, L, kvh, hd, total, wbytes,
                     f"{p.name} ({arch}): {L} layers{win}, {qh} heads / {kvh} KV heads x {hd}, parameters from the "
                     f"shapes {total / 1e9:.2f} B" + (f" ({active / 1e9:.2f} B active)" if n_exp else "")
                     + f", {wdesc}", q_heads=qh, active_params=active if n_exp else 0.0, hidden=H,
                     kv_types=kv_types, resident_extra_bytes=extra)


@lru_cache(maxsize=64)
def _config_spec(path: str, mtime_ns: int) -> ModelSpec:
    return model_from_config(path)


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return v


def _dtype_bytes(kv_dtype: str) -> int:
    try:
        return KV_DTYPE_BYTES[kv_dtype]
    except (KeyError, TypeError):
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; choose one of {sorted(KV_DTYPE_BYTES)}") from None


def kv_bytes_per_token(model, *, kv_dtype: str = "bf16", tp: int = 1, kind: str | None = None) -> int:
    """KV bytes one token costs on each GPU of a ``tp``-way replica: 2 x layers x heads per GPU x head dim x bytes.

    ``kind``: ``None`` counts every layer (a sliding-window layer as if it held the token: vLLM without the
    hybrid manager, and what a KV connector moves); ``"full"`` / ``"sliding_window"`` the layers of that type.
    """
    m = lookup(MODELS, model, "model")
    tp = _check_int("tp", tp, 1)
    heads = max(1, m.kv_heads // tp)
    if kind is None:
        layers = m.layers
    elif kind == "full":
        layers = m.full_layers
    elif kind == "sliding_window":
        layers = m.window_layers
    else:
        raise ValueError(f"kind must be None, 'full' or 'sliding_window', got {kind!r}")
    return 2 * layers * heads * m.head_dim * _dtype_bytes(kv_dtype)


def block_bytes(model, *, kv_dtype: str = "bf16", tp: int = 1, block_tokens: int = 16) -> int:
    """Bytes of one KV block (``block_tokens`` tokens, every layer) on each GPU of the replica. A hybrid
    model's block id under vLLM's hybrid manager stands for fewer bytes: :func:`kv_cache_layout`."""
    return _check_int("block_tokens", block_tokens, 1) * kv_bytes_per_token(model, kv_dtype=kv_dtype, tp=tp)


def kv_layout_of(model, *, tp: int = 1, kv_dtype: str = "bf16") -> KVLayout:
    """The :class:`~cacheresearch.replica.kv_layout.KVLayout` of a model (a preset, a :class:`ModelSpec` or a
    ``config.json`` path): its ``kv_types`` (every layer full attention when empty), each layer's token bytes
    ``kv_bytes_per_token / layers`` (``kv_dtype`` as this module reads it: ``auto`` is 2 bytes)."""
    m = lookup(MODELS, model, "model")
    tok = kv_bytes_per_token(m, kv_dtype=kv_dtype, tp=tp) // m.layers
    kinds = m.kv_types or (("full", m.layers, 0),)
    types = tuple(LayerType(k, n, token_bytes=tok, sliding_window=w) for k, n, w in kinds)
    desc = ", ".join(f"{n} {k}" + (f" (window {w})" if w else "") for k, n, w in kinds)
    return KVLayout(m.name, types, tp, f"{m.name}: {desc}; {tok} bytes per token per layer on tp={tp}")


def kv_cache_layout(model, *, tp: int = 1, kv_dtype: str = "bf16", block_tokens: int = 16,
                    hybrid_manager: bool = True) -> Unified:
    """vLLM's unified KV layout of a model (:func:`kv_layout_of`, ``kv_layout.unify``): groups, page, the bytes
    of one block id. Without the hybrid manager (``hybrid_manager=False``: vLLM's
    ``disable_hybrid_kv_cache_manager``, set for a KV connector that is not ``SupportsHMA``)
    ``unify_hybrid_kv_cache_specs`` (``vllm/v1/core/kv_cache_utils.py``) promotes sliding-window layers to full
    attention: ``kv_layout.dense_counterpart``, one group of every layer."""
    if not isinstance(hybrid_manager, bool):
        raise ValueError(f"hybrid_manager must be True or False, got {hybrid_manager!r}")
    lay = kv_layout_of(model, tp=tp, kv_dtype=kv_dtype)
    return unify(lay if hybrid_manager else dense_counterpart(lay), block_tokens)


def _kv_budget(model, gpu, tp, gpu_memory_utilization, overhead_bytes) -> int:
    m, g = lookup(MODELS, model, "model"), lookup(GPUS, gpu, "gpu")
    tp = _check_int("tp", tp, 1)
    u = gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < float(u) <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
    if isinstance(overhead_bytes, bool) or not isinstance(overhead_bytes, int) or overhead_bytes < 0:
        raise ValueError(f"overhead_bytes must be an integer >= 0, got {overhead_bytes!r}")
    held = m.weight_bytes + m.resident_extra_bytes
    budget = int(g.memory_bytes * float(u)) - -(-held // tp) - overhead_bytes
    if budget <= 0:
        raise ValueError(
            f"{m.name} does not fit on {tp} x {g.name} at gpu_memory_utilization={u}: weights need "
            f"{held / tp / GIB:.1f} GiB per GPU of {g.memory_bytes * float(u) / GIB:.1f} GiB usable "
            f"(raise tp or gpu_memory_utilization)")
    return budget


def kv_blocks(model, gpu, *, tp: int = 1, kv_dtype: str = "bf16", gpu_memory_utilization: float = 0.9,
              block_tokens: int = 16, overhead_bytes: int = 0, hybrid_manager: bool = True) -> int:
    """KV blocks one replica holds: ``floor(budget per GPU / block bytes per GPU)`` (module docstring).

    ``model`` / ``gpu``: a preset name of :data:`MODELS` / :data:`GPUS` or a :class:`ModelSpec` /
    :class:`GpuSpec`. A model with sliding-window layers: with ``hybrid_manager`` (vLLM's default) the block
    ids of vLLM's hybrid layout (``kv_layout.pool_blocks`` of :func:`kv_cache_layout`: a block id is one
    group's block); without it every layer holds every block (vLLM's ``unify_hybrid_kv_cache_specs``, as with
    a KV connector that is not ``SupportsHMA``). Models of full attention: the same either way. Raises
    ``ValueError`` (naming the argument) for unknown presets, bad values, or weights that do not fit.
    """
    if not isinstance(hybrid_manager, bool):
        raise ValueError(f"hybrid_manager must be True or False, got {hybrid_manager!r}")
    budget = _kv_budget(model, gpu, tp, gpu_memory_utilization, overhead_bytes)
    m = lookup(MODELS, model, "model")
    if m.kv_types and hybrid_manager:
        u = kv_cache_layout(m, tp=tp, kv_dtype=kv_dtype, block_tokens=block_tokens)
        return pool_blocks(u, lookup(GPUS, gpu, "gpu"), weight_bytes=m.weight_bytes + m.resident_extra_bytes, tp=tp,
                           gpu_memory_utilization=gpu_memory_utilization, overhead_bytes=overhead_bytes)
    return budget // block_bytes(model, kv_dtype=kv_dtype, tp=tp, block_tokens=block_tokens)


def kv_tokens(model, gpu, **kw) -> int:
    """KV tokens one replica holds (whole blocks of ``block_tokens``, default 16)."""
    return kv_blocks(model, gpu, **kw) * int(kw.get("block_tokens", 16))


def capacity_table(models=None, gpus=None, *, tps=(1,), kv_dtypes=("bf16", "fp8"),
                   gpu_memory_utilization: float = 0.9, block_tokens: int = 16) -> list[dict]:
    """Rows ``{model, gpu, tp, kv_dtype, kv_bytes_per_token, blocks, tokens}`` for every combination that fits."""
    rows = []
    for mn in models or MODELS:
        for gn in gpus or GPUS:
            for tp in tps:
                for dt in kv_dtypes:
                    try:
                        b = kv_blocks(mn, gn, tp=tp, kv_dtype=dt, gpu_memory_utilization=gpu_memory_utilization,
                                      block_tokens=block_tokens)
                    except ValueError:
                        continue
                    rows.append(dict(model=mn, gpu=gn, tp=tp, kv_dtype=dt,
                                     kv_bytes_per_token=kv_bytes_per_token(mn, kv_dtype=dt, tp=tp),
                                     blocks=b, tokens=b * block_tokens))
    return rows

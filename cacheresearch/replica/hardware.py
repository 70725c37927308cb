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
Models whose KV is not ``layers x kv_heads x head_dim`` per token are refused with the reason:
multi-head latent attention (``kv_lora_rank``), sliding-window layers, other quantisation methods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from os import PathLike
from pathlib import Path

__all__ = ["ModelSpec", "GpuSpec", "MODELS", "GPUS", "KV_DTYPE_BYTES", "kv_bytes_per_token", "block_bytes",
           "kv_blocks", "kv_tokens", "capacity_table", "model_from_config", "resolve_model", "HF_MODEL_IDS",
           "preset_for_hf_id"]

MIB = 1 << 20
GIB = 1 << 30


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


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # device total as torch.cuda.mem_get_info / nvidia-smi report it
    source: str


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


#: GPU presets: device totals as reported by nvidia-smi (MiB), which is what vLLM's budget multiplies.
GPUS: dict[str, GpuSpec] = {
    "h100_80gb": GpuSpec("h100_80gb", 81_559 * MIB,
                         "NVIDIA H100 SXM5 80GB (HBM3): nvidia-smi reports 81,559 MiB total"),
    "h200_141gb": GpuSpec("h200_141gb", 143_771 * MIB,
                          "NVIDIA H200 SXM 141GB (HBM3e): nvidia-smi reports 143,771 MiB total"),
    "a100_80gb": GpuSpec("a100_80gb", 81_920 * MIB,
                         "NVIDIA A100-SXM4-80GB (HBM2e): nvidia-smi reports 81,920 MiB total"),
    "a100_40gb": GpuSpec("a100_40gb", 40_960 * MIB,
                         "NVIDIA A100-SXM4-40GB (HBM2): nvidia-smi reports 40,960 MiB total"),
    "l40s_48gb": GpuSpec("l40s_48gb", 46_068 * MIB,
                         "NVIDIA L40S 48GB (GDDR6, ECC on): nvidia-smi reports 46,068 MiB total"),
    "l4_24gb": GpuSpec("l4_24gb", 23_034 * MIB,
                       "NVIDIA L4 24GB (GDDR6, ECC on): nvidia-smi reports 23,034 MiB total"),
}

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
    if c.get("use_sliding_window") or "sliding_attention" in (c.get("layer_types") or []):
        raise ValueError(f"{p}: sliding-window layers hold a window of KV, not the whole context: not modelled")
    L = _cfg_int(c, str(p), "num_hidden_layers", "n_layer", "num_layers")
    H = _cfg_int(c, str(p), "hidden_size", "n_embd", "d_model")
    qh = _cfg_int(c, str(p), "num_attention_heads", "n_head")
    if qh == 0 or H == 0 or L == 0:
        raise ValueError(f"{p}: num_hidden_layers, hidden_size and num_attention_heads must be positive")
    kvh = _cfg_int(c, str(p), "num_key_value_heads", default=qh)
    hd = _cfg_int(c, str(p), "head_dim", default=H // qh)
    V = _cfg_int(c, str(p), "vocab_size")
    ffn = _cfg_int(c, str(p), "intermediate_size", "ffn_dim", "n_inner", default=4 * H)
    n_exp = _cfg_int(c, str(p), "num_experts", "num_local_experts", "n_routed_experts", default=0)
    top_k = _cfg_int(c, str(p), "num_experts_per_tok", "num_experts_per_token", "moe_topk", default=0)
    if n_exp and not top_k:
        raise ValueError(f"{p}: {n_exp} experts but no num_experts_per_tok")
    e_ffn = _cfg_int(c, str(p), "moe_intermediate_size", default=ffn)
    sh_ffn = _cfg_int(c, str(p), "shared_expert_intermediate_size", default=0)
    sparse = set(c.get("mlp_only_layers") or [])
    step = _cfg_int(c, str(p), "decoder_sparse_step", default=1) or 1
    attn = H * qh * hd + 2 * H * kvh * hd + qh * hd * H
    dense = 3 * H * ffn
    total = active = 0.0
    for layer in range(L):
        moe = n_exp > 0 and layer not in sparse and (layer + 1) % step == 0
        if moe:
            shared = 3 * H * sh_ffn + (H if sh_ffn else 0)
            total += attn + n_exp * 3 * H * e_ffn + H * n_exp + shared
            active += attn + top_k * 3 * H * e_ffn + H * n_exp + shared
        else:
            total += attn + dense
            active += attn + dense
    emb = V * H * (1 if c.get("tie_word_embeddings", False) else 2)
    total, active = total + emb, active + emb
    q = c.get("quantization_config") or {}
    if q:
        method = str(q.get("quant_method", "")).lower()
        if method != "fp8":
            raise ValueError(f"{p}: quantization_config.quant_method {method!r}: only fp8 weights are modelled")
        wb = 1
    else:
        dt = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
        if dt not in _DTYPE_BYTES:
            raise ValueError(f"{p}: key 'torch_dtype': unknown dtype {dt!r}; known: {sorted(_DTYPE_BYTES)}")
        wb = _DTYPE_BYTES[dt]
    arch = ",".join(c.get("architectures") or []) or "?"
    label = name or (p.parent.name if p.stem == "config" and p.parent.name else p.stem)
    return ModelSpec(label, L, kvh, hd, total, int(round(total * wb)),
                     f"{p.name} ({arch}): {L} layers, {qh} heads / {kvh} KV heads x {hd}, parameters from the shapes "
                     f"{total / 1e9:.2f} B" + (f" ({active / 1e9:.2f} B active)" if n_exp else "")
                     + f", {wb} bytes per weight", q_heads=qh, active_params=active if n_exp else 0.0, hidden=H)


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


def kv_bytes_per_token(model, *, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """KV bytes one token costs on each GPU of a ``tp``-way replica: 2 x layers x heads per GPU x head dim x bytes."""
    m = lookup(MODELS, model, "model")
    tp = _check_int("tp", tp, 1)
    heads = max(1, m.kv_heads // tp)
    return 2 * m.layers * heads * m.head_dim * _dtype_bytes(kv_dtype)


def block_bytes(model, *, kv_dtype: str = "bf16", tp: int = 1, block_tokens: int = 16) -> int:
    """Bytes of one KV block (``block_tokens`` tokens) on each GPU of the replica."""
    return _check_int("block_tokens", block_tokens, 1) * kv_bytes_per_token(model, kv_dtype=kv_dtype, tp=tp)


def _kv_budget(model, gpu, tp, gpu_memory_utilization, overhead_bytes) -> int:
    m, g = lookup(MODELS, model, "model"), lookup(GPUS, gpu, "gpu")
    tp = _check_int("tp", tp, 1)
    u = gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < float(u) <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
    if isinstance(overhead_bytes, bool) or not isinstance(overhead_bytes, int) or overhead_bytes < 0:
        raise ValueError(f"overhead_bytes must be an integer >= 0, got {overhead_bytes!r}")
    budget = int(g.memory_bytes * float(u)) - -(-m.weight_bytes // tp) - overhead_bytes
    if budget <= 0:
        raise ValueError(
            f"{m.name} does not fit on {tp} x {g.name} at gpu_memory_utilization={u}: weights need "
            f"{m.weight_bytes / tp / GIB:.1f} GiB per GPU of {g.memory_bytes * float(u) / GIB:.1f} GiB usable "
            f"(raise tp or gpu_memory_utilization)")
    return budget


def kv_blocks(model, gpu, *, tp: int = 1, kv_dtype: str = "bf16", gpu_memory_utilization: float = 0.9,
              block_tokens: int = 16, overhead_bytes: int = 0) -> int:
    """KV blocks one replica holds: ``floor(budget per GPU / block bytes per GPU)`` (module docstring).

    ``model`` / ``gpu``: a preset name of :data:`MODELS` / :data:`GPUS` or a :class:`ModelSpec` /
    :class:`GpuSpec`. Raises ``ValueError`` (naming the argument) for unknown presets, bad values, or
    weights that do not fit.
    """
    budget = _kv_budget(model, gpu, tp, gpu_memory_utilization, overhead_bytes)
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

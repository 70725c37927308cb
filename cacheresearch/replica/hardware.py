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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec", "GpuSpec", "MODELS", "GPUS", "KV_DTYPE_BYTES", "kv_bytes_per_token", "block_bytes",
           "kv_blocks", "kv_tokens", "capacity_table"]

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
        "128; 32.8 B parameters (model card), BF16 weights"),
    "codellama_34b": ModelSpec(
        "codellama_34b", 48, 8, 128, 33.7e9, _bf16(33.7e9),
        "codellama/CodeLlama-34b-Instruct-hf config.json: num_hidden_layers 48, num_key_value_heads 8, hidden_size "
        "8192 / 64 heads = head_dim 128; 33.7 B parameters (model card), BF16 weights"),
    "mistral_7b": ModelSpec(
        "mistral_7b", 32, 8, 128, 7.25e9, _bf16(7.25e9),
        "mistralai/Mistral-7B-Instruct-v0.3 config.json: num_hidden_layers 32, num_key_value_heads 8, head_dim "
        "128; 7.25 B parameters (model card), BF16 weights"),
}

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
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(table)}") from None


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

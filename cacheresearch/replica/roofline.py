"""A step-time model of a vLLM replica from its hardware: a roofline with two efficiency factors.

One engine step of a ``tp``-way replica (all numbers per GPU; every GPU holds ``1 / tp`` of the weights
and of each KV head group):

* it reads the weights once: ``base = weight_bytes / tp / (bandwidth * eff_bw)``;
* a prefill token costs its matmuls and its attention over the ``c`` tokens before it:
  ``(2 params + 4 layers q_heads head_dim c) / tp / (peak_flops * eff_flops)``;
* a decoding request reads its whole KV once per step: ``kv_bytes_per_token(tp) / (bandwidth * eff_bw)``
  per context token (decode matmuls are hidden under the weight read: memory-bound);
* with ``tp > 1`` every token of a step (prefill or decode) goes through the two all-reduces of each layer
  (after the attention output and the MLP down projection; Megatron-style tensor parallelism, which is
  vLLM's): ``2 layers hidden 2 bytes`` of activations, of which a ring all-reduce sends ``2 (tp - 1) / tp``
  over each GPU's link, at ``link_bw * eff_bw`` (the datasheet's per-direction NVLink or PCIe bandwidth
  times the calibrated bandwidth efficiency: the HBM's efficiency for the link is an **assumption**). vLLM
  runs them between the matmuls, not overlapped, so they add. Small decode-only steps are latency-bound
  rather than bandwidth-bound there; that part is left in the weight-read term BLIS's beta0 calibrates;
* a fixed per-request overhead (gateway, tokenizer, HTTP; ``overhead_ms``) is an **assumption**, not a
  roofline term, and is added to TTFT by the study, not to the step.

**Mixtures of experts.** The FLOPs count the active parameters (``ModelSpec.active_params``: the embedding
lookup included, as every model's count includes it); the weight read counts **every expert**
(``weight_bytes``, e.g. gpt-oss-120b's 60.77 GiB with MXFP4 experts, each step). This is the existing rule,
kept: no better-sourced one was found, and the step model's constant base cannot follow the batch. It is exact
for large batches and charges small ones too much: under uniform routing a step of ``B`` tokens touches
``E (1 - (1 - k / E)^B)`` of ``E`` experts per layer (gpt-oss-120b, ``E`` 128, ``k`` 4: 4 at ``B = 1``, 82 at
32, 126 at 128, all at 512).

**Sliding-window layers** (``ModelSpec.kv_types``; the compute of window layers is saved whether or not vLLM's
hybrid KV cache manager holds their blocks: ``unify_hybrid_kv_cache_specs``). A decoding request's KV read is
``full-attention bytes x context + window bytes x min(context, W)``, a prefill token's attention
``4 q_heads head_dim (full layers x c + window layers x min(c, W))``. The vllm replica's step model is linear in
the context (``step_ctx_ps`` per context token, ``step_prefill_ctx_fs`` per pair), so :func:`step_coefficients`
puts the full-attention layers alone in those, and charges the window layers a **full window** as constants:
``W x window bytes`` per decoding request in ``step_decode_ns`` (:meth:`Roofline.window_decode_s`) and
``4 window layers q_heads head_dim W`` FLOPs per prefill token in ``step_prefill_ns``
(:meth:`Roofline.window_prefill_token_s`). A request or prefill token with less than ``W`` tokens before it
is charged too much (at most ``W`` tokens' worth: 128 for gpt-oss). :meth:`Roofline.prefill_token_s` itself
takes the minimum.

:func:`step_coefficients` maps the roofline onto the vllm replica's step knobs: ``step_base_ns`` (weights),
``step_prefill_ns`` (a prefill token's matmuls and its share of the all-reduces), ``step_ctx_ps`` (KV read per
context token of each decoding request), ``step_prefill_ctx_fs`` (attention per pair of a prefill token and a
token before it) and ``step_decode_ns`` (a decode token's share of the all-reduces, 0 at ``tp = 1``, plus its
window layers' KV read). The
replica adds the terms; a roofline takes their maximum (compute and memory overlap), so a step that mixes a
large prefill chunk with decodes is charged up to the weight read too much.

**Calibration** (:func:`calibrate`, run once): ``eff_bw`` is the geometric mean over BLIS's published
coefficients (llm-d's inference simulator ``defaults.yaml``, vLLM v0.8.4; the step presets of
:mod:`cacheresearch.core.params`) of ``roofline base / beta0``, ``eff_flops`` that of
``roofline prefill / (beta1 - all-reduce)``: the part of BLIS's per-prefill-token time left to the matmuls
once the all-reduce at the calibrated ``eff_bw`` is taken out (0 at ``tp = 1``; attention left out: BLIS
does not publish its prompt lengths).
:func:`blis_check` lists, for every model and GPU BLIS covers here, beta0 and beta1 against the
calibrated roofline and the relative error; BLIS's beta2 (per decode token) is a regression term with
no context attached, so it is reported as the context length at which the roofline's KV read equals it.

vLLM's scheduler limits (:func:`vllm_scheduler_defaults`) follow vLLM V1's rule
(``vllm/engine/arg_utils.py``, ``EngineArgs._set_default_args_v1``, v0.10.x, the OpenAI API server):
GPUs with at least 70 GiB that are not A100: ``max_num_seqs`` 1024, ``max_num_batched_tokens`` 8192;
other GPUs: 256 and 2048.

Plain Python; no JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cacheresearch.replica.hardware import GIB, GPUS, MODELS, kv_bytes_per_token, lookup

__all__ = ["GpuPeak", "GPU_PEAK", "Q_HEADS", "BLIS", "Roofline", "calibrate", "blis_check", "step_coefficients",
           "vllm_scheduler_defaults", "EFF"]


@dataclass(frozen=True)
class GpuPeak:
    flops: float  # dense BF16 FLOP/s
    bandwidth: float  # HBM bytes/s
    source: str
    link_bw: float = 0.0  # GPU-to-GPU bytes/s per direction (NVLink, else PCIe): tensor-parallel all-reduces


#: Datasheet peaks (dense BF16 tensor FLOP/s, memory bandwidth, GPU-to-GPU link per direction) per GPU preset
#: of :mod:`.hardware`.
GPU_PEAK: dict[str, GpuPeak] = {
    "h100_80gb": GpuPeak(989.4e12, 3.35e12, "NVIDIA H100 SXM5 datasheet: 989 TFLOPS BF16 dense, 3.35 TB/s, NVLink "
                         "900 GB/s (450 per direction)", 450e9),
    "h200_141gb": GpuPeak(989.4e12, 4.8e12, "NVIDIA H200 SXM datasheet: 989 TFLOPS BF16 dense, 4.8 TB/s, NVLink "
                          "900 GB/s (450 per direction)", 450e9),
    "a100_80gb": GpuPeak(312e12, 2.039e12, "NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS BF16, 2.039 TB/s, NVLink "
                         "600 GB/s (300 per direction)", 300e9),
    "a100_40gb": GpuPeak(312e12, 1.555e12, "NVIDIA A100 SXM4 40GB datasheet: 312 TFLOPS BF16, 1.555 TB/s, NVLink "
                         "600 GB/s (300 per direction)", 300e9),
    "l40s_48gb": GpuPeak(362.05e12, 0.864e12, "NVIDIA L40S datasheet: 362 TFLOPS BF16 dense, 864 GB/s; no NVLink: "
                         "PCIe Gen4 x16, 64 GB/s (32 per direction)", 32e9),
    "l4_24gb": GpuPeak(121e12, 0.3e12, "NVIDIA L4 datasheet: 121 TFLOPS BF16 dense, 300 GB/s; no NVLink: PCIe Gen4 "
                       "x16, 64 GB/s (32 per direction)", 32e9),
}

#: Bytes of one activation element in the all-reduces (BF16 activations, whatever the weights' dtype).
ACT_BYTES = 2

#: Query heads (num_attention_heads of config.json) of the model presets: attention FLOPs.
Q_HEADS: dict[str, int] = {"llama3_8b": 32, "llama3_70b": 64, "qwen2.5_32b": 40, "qwen3_8b": 32, "mistral_7b": 32,
                           "qwen3_32b": 64, "codellama_34b": 64}

#: BLIS's published coefficients (beta0 us per step, beta1 us per prefill token, beta2 us per decode token)
#: for the models and GPUs it covers, as (model preset, gpu preset, tp).
BLIS: dict[str, tuple[str, str, int, tuple[float, float, float]]] = {
    "llama31_8b_h100_tp1": ("llama3_8b", "h100_80gb", 1, (5752.705, 17.2509, 5.9991)),
    "llama31_8b_a100_tp1": ("llama3_8b", "a100_80gb", 1, (16441.53, 47.8374, 18.2056)),
    "codellama34b_h100_tp1": ("codellama_34b", "h100_80gb", 1, (26595.28, 96.2844, 56.5863)),
    "llama33_70b_h100_tp4": ("llama3_70b", "h100_80gb", 4, (12601.27, 76.4228, 66.8440)),
}


def _q_heads(m) -> int:
    """Query heads of a model: its own field (a config.json) or the presets' table."""
    if m.q_heads:
        return m.q_heads
    try:
        return Q_HEADS[m.name]
    except KeyError:
        raise ValueError(f"model {m.name!r}: no num_attention_heads (set ModelSpec.q_heads)") from None


@dataclass(frozen=True)
class Roofline:
    model: str
    gpu: str
    tp: int
    eff_bw: float
    eff_flops: float

    def _spec(self):
        return lookup(MODELS, self.model, "model"), self._peak()

    def _peak(self) -> GpuPeak:
        lookup(GPUS, self.gpu, "gpu")
        try:
            return GPU_PEAK[self.gpu]
        except KeyError:
            raise ValueError(f"no roofline peaks for gpu {self.gpu!r}; known: {sorted(GPU_PEAK)}") from None

    def base_s(self) -> float:
        """Weights read once per step (seconds)."""
        m, g = self._spec()
        return m.weight_bytes / self.tp / (g.bandwidth * self.eff_bw)

    def prefill_token_s(self, ctx_tokens: float = 0.0) -> float:
        """One prefill token at ``ctx_tokens`` of context before it (seconds): a full-attention layer attends
        to the whole context, a sliding-window layer to ``min(ctx_tokens, W)`` tokens."""
        m, g = self._spec()
        att = 4.0 * m.full_layers * _q_heads(m) * m.head_dim * float(ctx_tokens)
        if m.window_layers:
            att += 4.0 * m.window_layers * _q_heads(m) * m.head_dim * min(float(ctx_tokens), float(m.sliding_window))
        return (2.0 * (m.active_params or m.params) + att) / self.tp / (g.flops * self.eff_flops)

    def window_prefill_token_s(self) -> float:
        """A prefill token's attention in the sliding-window layers at a full window (``W`` tokens before it;
        0 without window layers; seconds)."""
        m, g = self._spec()
        att = 4.0 * m.window_layers * _q_heads(m) * m.head_dim * float(m.sliding_window)
        return att / self.tp / (g.flops * self.eff_flops)

    def allreduce_token_s(self) -> float:
        """One token's share of a step's tensor-parallel all-reduces (seconds; 0 at ``tp = 1``)."""
        if self.tp <= 1:
            return 0.0
        m, g = self._spec()
        if g.link_bw <= 0:
            raise ValueError(f"gpu {self.gpu!r}: no GPU-to-GPU link bandwidth for tp={self.tp}")
        hidden = m.hidden or _q_heads(m) * m.head_dim
        ring = 2.0 * (self.tp - 1) / self.tp
        return 2.0 * m.layers * hidden * ACT_BYTES * ring / (g.link_bw * self.eff_bw)

    def ctx_token_s(self, kv_dtype: str = "bf16") -> float:
        """KV read per context token of a decoding request, per step, in the full-attention layers (every
        layer of a model without sliding windows; seconds)."""
        _, g = self._spec()
        return kv_bytes_per_token(self.model, kv_dtype=kv_dtype, tp=self.tp, kind="full") / (g.bandwidth * self.eff_bw)

    def window_decode_s(self, kv_dtype: str = "bf16") -> float:
        """KV read of the sliding-window layers per decoding request, per step, at a full window (``W`` tokens;
        0 without window layers; seconds)."""
        m, g = self._spec()
        per_tok = kv_bytes_per_token(self.model, kv_dtype=kv_dtype, tp=self.tp, kind="sliding_window")
        return m.sliding_window * per_tok / (g.bandwidth * self.eff_bw)


def calibrate() -> dict:
    """``eff_bw`` and ``eff_flops``: geometric means of roofline / BLIS over :data:`BLIS` (beta0, beta1)."""
    def gmean(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs))

    eff_bw = gmean([Roofline(model, gpu, tp, 1.0, 1.0).base_s() / (b0 * 1e-6)
                    for model, gpu, tp, (b0, _, _) in BLIS.values()])
    rf = []
    for name, (model, gpu, tp, (_, b1, _)) in BLIS.items():
        r = Roofline(model, gpu, tp, eff_bw, 1.0)
        left = b1 * 1e-6 - r.allreduce_token_s()
        if left <= 0:
            raise ValueError(f"BLIS case {name}: the all-reduce alone exceeds beta1")
        rf.append(r.prefill_token_s(0.0) / left)
    return dict(eff_bw=eff_bw, eff_flops=gmean(rf))


#: The calibrated efficiency factors (computed once at import from :data:`BLIS`).
EFF = calibrate()


def roofline(model: str, gpu: str, tp: int = 1) -> Roofline:
    return Roofline(model, gpu, int(tp), EFF["eff_bw"], EFF["eff_flops"])


def blis_check() -> list[dict]:
    """Per BLIS case: beta0 / beta1 published vs the calibrated roofline and the relative error; the
    context at which the roofline's per-token KV read equals beta2."""
    rows = []
    for name, (model, gpu, tp, (b0, b1, b2)) in BLIS.items():
        r = roofline(model, gpu, tp)
        base_us, pre_us = r.base_s() * 1e6, (r.prefill_token_s(0.0) + r.allreduce_token_s()) * 1e6
        rows.append(dict(case=name, model=model, gpu=gpu, tp=tp, beta0_us=b0, roofline_base_us=base_us,
                         base_err=base_us / b0 - 1, beta1_us=b1, roofline_prefill_us=pre_us,
                         allreduce_us=r.allreduce_token_s() * 1e6,
                         prefill_err=pre_us / b1 - 1,
                         beta2_us=b2, beta2_ctx_tokens=b2 * 1e-6 / r.ctx_token_s()))
    return rows


def step_coefficients(model: str, gpu: str, tp: int = 1, *, kv_dtype: str = "bf16") -> dict:
    """The vllm replica's step knobs from the roofline: ``step_base_ns`` (the weight read),
    ``step_prefill_ns`` (a prefill token's matmuls and its share of the all-reduces), ``step_decode_ns`` (a
    decode token's share of the all-reduces; its matmuls are hidden under the memory reads), ``step_ctx_ps``
    (the KV read per context token of a decoding request) and ``step_prefill_ctx_fs`` (attention per
    (prefill token, earlier token) pair). Sliding-window layers (module docstring) enter as constants at a
    full window: their KV read in ``step_decode_ns``, their attention in ``step_prefill_ns``."""
    r = roofline(model, gpu, tp)
    m = lookup(MODELS, model, "model")
    pair_flops = 4.0 * m.full_layers * _q_heads(m) * m.head_dim / r.tp
    ar = r.allreduce_token_s()
    win_pre, win_dec = r.window_prefill_token_s(), r.window_decode_s(kv_dtype)
    src = (f"roofline {model} on {tp} x {gpu}: eff_bw {r.eff_bw:.3f}, eff_flops {r.eff_flops:.3f} "
           "(calibrated once on BLIS's coefficients)")
    if m.active_params:
        src += (f"; mixture of experts: FLOPs of {m.active_params / 1e9:.2f} B active parameters, every step reads "
                f"all {m.weight_bytes / GIB:.2f} GiB of weights (every expert)")
    if m.window_layers:
        src += (f"; {m.window_layers} sliding-window layers (W {m.sliding_window}) charged a full window: "
                f"{win_dec * 1e9:.0f} ns of KV read per decoding request (in step_decode_ns) and "
                f"{win_pre * 1e9:.1f} ns of attention per prefill token (in step_prefill_ns); the {m.full_layers} "
                "full-attention layers alone in step_ctx_ps and step_prefill_ctx_fs")
    return dict(step_base_ns=int(round(r.base_s() * 1e9)),
                step_prefill_ns=int(round((r.prefill_token_s(0.0) + ar + win_pre) * 1e9)),
                step_decode_ns=int(round((ar + win_dec) * 1e9)),
                step_ctx_ps=int(round(r.ctx_token_s(kv_dtype) * 1e12)),
                step_prefill_ctx_fs=int(round(pair_flops / (r._peak().flops * r.eff_flops) * 1e15)),
                source=src)


def vllm_scheduler_defaults(gpu: str) -> dict:
    """vLLM V1's defaults for the OpenAI API server (v0.10.x ``_set_default_args_v1``): by GPU memory."""
    g = lookup(GPUS, gpu, "gpu")
    big = g.memory_bytes >= 70 * GIB and "a100" not in g.name
    return dict(max_num_seqs=1024 if big else 256, max_num_batched_tokens=8192 if big else 2048,
                source="vLLM V1 (v0.10.x) EngineArgs._set_default_args_v1, OpenAI API server: GPUs of >= 70 GiB "
                "other than A100: 1024 / 8192; others: 256 / 2048")

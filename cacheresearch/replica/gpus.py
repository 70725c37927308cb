"""GPU presets: device memory as vLLM's budget sees it, with sources (``replica.gpu=NAME``).

:mod:`cacheresearch.replica.hardware` (KV capacity, re-exporting these names) and
:mod:`cacheresearch.replica.kv_layout` (vLLM's hybrid layouts) both read them. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuSpec", "GPUS", "MIB", "GIB"]

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # device total as torch.cuda.mem_get_info / nvidia-smi report it
    source: str


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

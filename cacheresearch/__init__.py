"""cacheresearch: JAX-vectorized Monte Carlo research toolkit for LLM prefix and prompt caching.

The names below are loaded on first use (PEP 562), so that ``import cacheresearch`` and a command line that
refuses a bad input (``python -m cacheresearch.sweep experiment=nope``) do not import JAX and the engines."""

from __future__ import annotations

import importlib

#: name -> (module, attribute): the package's public names, each imported when first read
_LAZY = {
    "POLICIES": ("cacheresearch.cache.policies", "POLICIES"),
    **{n: ("cacheresearch.engine", n) for n in (
        "LATENCY_PRESETS", "Metrics", "Params", "Stream", "combine_limbs", "compile_stream", "make_params",
        "request_bits", "simulate", "simulate_grid", "stack_params", "stack_streams")},
    "ROUTER_PRESETS": ("cacheresearch.routers", "PRESETS"),
    "ROUTERS": ("cacheresearch.routers", "ROUTERS"),
    "VIEWS": ("cacheresearch.routers", "VIEWS"),
    "Workload": ("cacheresearch.workload", "Workload"),
    "WorkloadError": ("cacheresearch.workload", "WorkloadError"),
    "llmd_workload": ("cacheresearch.workload.synthetic", "llmd_workload"),
    "tenant_workload": ("cacheresearch.workload.synthetic", "tenant_workload"),
}

__all__ = [
    "Metrics",
    "Params",
    "Stream",
    "Workload",
    "WorkloadError",
    "POLICIES",
    "ROUTERS",
    "ROUTER_PRESETS",
    "VIEWS",
    "LATENCY_PRESETS",
    "request_bits",
    "tenant_workload",
    "llmd_workload",
    "combine_limbs",
    "compile_stream",
    "make_params",
    "simulate",
    "simulate_grid",
    "stack_params",
    "stack_streams",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value  # the next read is a plain attribute
        return value
    raise AttributeError(f"module 'cacheresearch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

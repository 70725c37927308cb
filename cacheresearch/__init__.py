"""cacheresearch: JAX-vectorized Monte Carlo research toolkit for LLM prefix and prompt caching."""

from cacheresearch.cache.policies import POLICIES
from cacheresearch.engine import (
    LATENCY_PRESETS,
    Metrics,
    Params,
    Stream,
    combine_limbs,
    compile_stream,
    make_params,
    request_bits,
    simulate,
    simulate_grid,
    stack_params,
    stack_streams,
)
from cacheresearch.routers import PRESETS as ROUTER_PRESETS
from cacheresearch.routers import ROUTERS, VIEWS
from cacheresearch.workload import Workload, WorkloadError
from cacheresearch.workload.synthetic import llmd_workload, tenant_workload

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

"""cacheresearch: JAX-vectorized Monte Carlo research toolkit for LLM prefix and prompt caching."""

from .engine import (
    Metrics,
    Params,
    Stream,
    combine_limbs,
    compile_stream,
    make_params,
    simulate,
    simulate_grid,
    stack_params,
    stack_streams,
)
from .policies import POLICIES
from .routers import ROUTERS
from .workload import Workload, WorkloadError

__all__ = [
    "Metrics",
    "Params",
    "Stream",
    "Workload",
    "WorkloadError",
    "POLICIES",
    "ROUTERS",
    "combine_limbs",
    "compile_stream",
    "make_params",
    "simulate",
    "simulate_grid",
    "stack_params",
    "stack_streams",
]
__version__ = "0.1.0"

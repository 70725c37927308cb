"""The engine's public face: parameters, the run-compressed stream and the scan.

The pieces live in :mod:`cacheresearch.core`: :mod:`~cacheresearch.core.stream` (workload ->
run-compressed device stream), :mod:`~cacheresearch.core.simulate` (the scan composed of the
components: :mod:`~cacheresearch.cache.store` cache rows, :mod:`~cacheresearch.core.views` router
views, :mod:`~cacheresearch.replica.fcfs` replica queue, metrics) and
:mod:`~cacheresearch.core.run` (grids of cells grouped by stream and state shape, with a memory
estimate). The parameters (``Params``, ``make_params``) are
:mod:`~cacheresearch.core.params`, declared from the routers' registry. This module re-exports them all.

``simulate`` and ``simulate_grid`` take ``backend=`` as the sweep's ``engine.backend`` does (``auto`` by default: a
numba CPU backend where the numba backends cover the configurations, the JAX scan elsewhere; ``jax``; ``numba``,
which refuses in one line what it does not cover): :func:`cacheresearch.core.run.simulate`. The JAX scan itself is
:func:`cacheresearch.core.simulate.simulate` / :func:`~cacheresearch.core.simulate.simulate_grid`.
"""

from __future__ import annotations

from cacheresearch.core.params import KNOBS, LATENCY_PRESETS, Params, make_params, resolve_router, stack_params  # noqa: F401
from cacheresearch.core.run import BACKENDS, BackendError, simulate, simulate_grid  # noqa: F401 - backend= as the sweep
from cacheresearch.core.simulate import (  # noqa: F401  (re-exported)
    Metrics,
    Static,
    check_bounds,
    combine_limbs,
    default_window,
    request_bits,
    static_options,
)
from cacheresearch.core.stream import Stream, StreamShape, compile_stream, pad_stream, stack_streams, stream_shape  # noqa: F401

__all__ = [
    "Stream",
    "Params",
    "Metrics",
    "compile_stream",
    "stack_streams",
    "pad_stream",
    "make_params",
    "stack_params",
    "simulate",
    "simulate_grid",
    "BACKENDS",
    "BackendError",
    "combine_limbs",
    "check_bounds",
    "default_window",
    "request_bits",
    "resolve_router",
    "static_options",
    "LATENCY_PRESETS",
    "KNOBS",
]

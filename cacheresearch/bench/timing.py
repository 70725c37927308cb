"""Timing helpers of the bench: repeated measurements, peak RSS, usable cores, rounding."""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import jax


def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(r / 1024.0 if sys.platform != "darwin" else r / 2**20, 1)


def ready(x):
    return jax.block_until_ready(x)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def curve_backend(requested: str = "auto") -> str:
    """The stack-distance backend :func:`~cacheresearch.analysis.mrc.hit_curve` uses for ``requested``."""
    if requested != "auto":
        return requested
    if jax.default_backend() != "cpu":
        return "jax"
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        return "jax"
    return "numba"


@dataclass
class Timing:
    best: float
    median: float
    runs: int
    first: float | None = None  # warm-up call (compile included), when there was one
    value: object = None

    @property
    def compile_estimate(self) -> float:
        return max(0.0, (self.first or 0.0) - self.best) if self.first is not None else 0.0

    def fields(self, prep_s: float | None) -> dict:
        """The project's timing fields of a case (``prep_s``: its host preparation, or None)."""
        return {"project_s": rounded(self.best), "project_s_median": rounded(self.median),
                "project_compile_s": rounded(self.compile_estimate), "project_first_call_s": rounded(self.first),
                "project_prep_s": rounded(prep_s)}


def measure(fn: Callable[[], object], *, repeats: int, budget_s: float, warmup: bool) -> Timing:
    """Time ``fn`` (which must block until its result is ready).

    With ``warmup`` the first call is run untimed-as-steady (its time is kept as ``first``). Then up to
    ``repeats`` timed calls, stopping early once their total passes ``budget_s``; when a single call
    is slower than ``budget_s / 2`` only one timed call is made. Without ``warmup`` the first call is
    the first timed call.
    """
    first = None
    value = None
    if warmup:
        t = time.perf_counter()
        value = fn()
        first = time.perf_counter() - t
    times: list[float] = []
    while len(times) < max(1, repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
        if sum(times) > budget_s or times[0] > budget_s / 2:
            break
    return Timing(min(times), statistics.median(times), len(times), first, value)


def measure_timed(fn: Callable[[], tuple[float, object]], *, repeats: int, budget_s: float) -> Timing:
    """Like :func:`measure` for an ``fn`` that times itself: it returns ``(seconds, value)`` (for runs
    whose preparation, such as building caches, must stay outside the timer)."""
    times: list[float] = []
    value = None
    while len(times) < max(1, repeats):
        s, value = fn()
        times.append(s)
        if sum(times) > budget_s or times[0] > budget_s / 2:
            break
    return Timing(min(times), statistics.median(times), len(times), None, value)


def ratio_of(a, b):
    if a is None or b is None or b <= 0:
        return None
    return a / b


def rounded(x, nd=6):
    """``x`` to ``nd`` significant digits (None stays None)."""
    return None if x is None else float(f"{float(x):.{nd}g}")

"""The memory check: a 1,000,000-request workload through the engine and the hit curve in a child."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import jax
import numpy as np

from cacheresearch.analysis import mrc
from cacheresearch.bench.base import REPO_ROOT
from cacheresearch.bench.timing import curve_backend, peak_rss_mb, ready, rounded
from cacheresearch.core.simulate import simulate  # the JAX scan
from cacheresearch.engine import combine_limbs, compile_stream, make_params
from cacheresearch.workload import Workload


def memory_workload(n_requests: int = 1_000_000, *, seed: int = 0, prefixes: int = 10_000) -> Workload:
    """A cheap synthetic key stream: 4 blocks per request, 2 shared (one of ``prefixes`` prefixes,
    Zipf-like popularity) and 2 unique, 16-token blocks, one request per ms (numpy only)."""
    rng = np.random.default_rng(seed)
    n = int(n_requests)
    p = np.minimum(rng.zipf(1.2, n) - 1, prefixes - 1).astype(np.uint64)
    keys = np.empty((n, 4), np.uint64)
    keys[:, 0] = 2 * p + 1
    keys[:, 1] = 2 * p + 2
    u = np.uint64(1 << 40) + 2 * np.arange(n, dtype=np.uint64)
    keys[:, 2] = u
    keys[:, 3] = u + np.uint64(1)
    return Workload(
        arrival_ms=np.arange(n, dtype=np.int64), input_tokens=np.full(n, 64), output_tokens=np.zeros(n, np.int64),
        tenant=np.zeros(n, np.int32), keys=keys.reshape(-1), offsets=np.arange(n + 1, dtype=np.int64) * 4,
        block_tokens=16, name=f"memory-{n}",
    )


def memory_check(n_requests: int = 1_000_000, *, capacity: int = 20_000, curve_chunk_blocks: int = 64,
                 backend: str = "auto") -> dict:
    """Replay ``n_requests`` through the engine (one config) and the hit curve; peak RSS after each.

    The engine's stream uses :func:`~cacheresearch.engine.compile_stream`'s own defaults; the curve's
    chunk defaults to its own (64 blocks, which pads these 4-block requests 16 times over; smaller
    chunks lower the peak)."""
    out = {"requests": n_requests, "rss_mb_at_start": peak_rss_mb()}
    t = time.perf_counter()
    w = memory_workload(n_requests)
    out["accesses"] = w.total_blocks
    out["build_s"] = rounded(time.perf_counter() - t)
    out["peak_rss_mb_after_build"] = peak_rss_mb()
    t = time.perf_counter()
    stream = compile_stream(w)
    ready(stream)
    out["compile_stream_s"] = rounded(time.perf_counter() - t)
    out["peak_rss_mb_after_compile_stream"] = peak_rss_mb()
    params = make_params("lru", capacity, replicas=1)
    t = time.perf_counter()
    m = ready(simulate(stream, params, jax.random.PRNGKey(0), max_replicas=1, per_request=True, queue=False))
    out["engine_s_with_compile"] = rounded(time.perf_counter() - t)
    out["engine_token_hit_rate"] = rounded(float(m.token_hit_rate))
    eng_tokens = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
    out["peak_rss_mb_after_engine"] = peak_rss_mb()
    del stream, m
    t = time.perf_counter()
    hc = mrc.hit_curve(w, replicas=1, max_capacity=capacity, chunk_blocks=curve_chunk_blocks, backend=backend)
    out["curve_s_with_compile"] = rounded(time.perf_counter() - t)
    out["curve_chunk_blocks"] = curve_chunk_blocks
    out["curve_backend"] = curve_backend(backend)
    out["curve_equals_engine"] = bool(int(hc.hit_tokens[capacity]) == eng_tokens)
    out["peak_rss_mb_after_curve"] = peak_rss_mb()
    out["peak_rss_mb"] = peak_rss_mb()
    out["target_mb"] = 4096
    out["within_target"] = out["peak_rss_mb"] < 4096
    out["method"] = (f"engine: compile_stream defaults, simulate(per_request=True, queue=False), capacity "
                     f"{capacity}; curve: hit_curve(max_capacity={capacity}, chunk_blocks={curve_chunk_blocks})")
    return out


def memory_check_child(n_requests: int, timeout: float = 1800) -> dict:
    cmd = [sys.executable, "-m", "cacheresearch.bench", "--memory-check-child", str(n_requests)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT))
    if p.returncode != 0:
        return {"requests": n_requests, "error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])

"""A batch of N vllm-replica configurations in one call vs the same N as single calls (issue 19, point 3).

Run: ``python benchmarks/vllm_lockstep.py [--n 64] [--requests 400] [--numba]``. Prints one JSON line per
backend: the single calls' summed time, the batch's, their ratio (wall and process CPU seconds; compile
left out, each program runs once first), and per configuration the engine steps, the replica events
(decode stretches and engine steps, summed over replicas: the numba backend's work) and the JAX loop's
iterations, beside the iterations the vmapped batch runs. A single call runs ``N + sum_i e_i`` iterations
(``e_i`` its event-loop iterations before arrival ``i``, ``c.iters`` of replica/vllm.py), the batch
``N + sum_i max_g e_gi`` (lockstep per arrival); ``flat_bound`` is ``max_g (N + sum_i e_gi)``, what one
loop of events and arrivals per configuration would run vmapped (the slowest configuration's total):
the lockstep per arrival costs little beyond it when the same configurations are the slowest at every
arrival. Every configuration's metrics are checked equal across single calls, the batch and the backends.
Timings depend on the machine and its load: report them with both; process CPU times are less
sensitive to other processes on a shared host than wall times.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import jax
import numpy as np

from cacheresearch.core.params import make_params, stack_params
from cacheresearch.core.simulate import (
    _finish_vllm,
    _max_depth,
    _with_runs,
    check_bounds,
    check_stream,
    finalize,
    request_bits,
    serve_stream,
    static_options,
)
from cacheresearch.core.stream import compile_stream
from cacheresearch.replica.vllm import simulate_vllm
from cacheresearch.workload.synthetic import tenant_workload

ROUTERS = ["random", "least_loaded", "llmd_precise", "round_robin"]
FIELDS = ("steps", "events", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "e2e_p90_ms", "preemptions", "hit_tokens_lo",
          "dropped", "busy_ms", "tpot_ns_lo")


def workload(n: int, requests: int, replicas: int):
    """bench.vllm's llm-d-like workload and grid (capacity x router x max_num_seqs)."""
    w = tenant_workload(n_tenants=16, prefix_tokens=2000, query_tokens=200, users_per_tenant=4, rate_per_s=20,
                        duration_s=requests / 20, output_tokens=100, block_tokens=16, seed=0)
    s = compile_stream(w, stateful_singletons=True)
    cfg = [(c, r, q) for c in (300, 600, 1200, 2400) for r in ROUTERS for q in (4, 8, 16, 32)]
    cfg = [cfg[(k * 17) % len(cfg)] for k in range(len(cfg))][:n]  # n < 64: a spread over the grid
    ps = [make_params("lru", capacity_blocks=c, replicas=replicas, router=r, max_num_seqs=q,
                      max_num_batched_tokens=2048, step_model="qwen3_32b_h100_tp2") for c, r, q in cfg]
    return w, s, ps


def _one(stream, params, key, *, st):
    def fin(stream, params, c, st, active, replicas):
        return _finish_vllm(stream, params, c, st, active, replicas), c.iters

    return simulate_vllm(stream, params, key, st, request_bits, fin)


def _timed(f):
    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(f())
    return out, time.perf_counter() - t0, time.process_time() - c0


def _fields(m) -> np.ndarray:
    return np.stack([np.asarray(getattr(m, f)).reshape(np.asarray(m.steps).shape[0], -1).sum(axis=1)
                     for f in FIELDS], axis=1)


def _static(s, grid, opts):
    rest = {k: v for k, v in opts.items() if k != "max_replicas"}
    return static_options(grid, max_replicas=opts["max_replicas"], per_request=False, window=None,
                          max_depth=_max_depth(s), **_with_runs(s, rest))


def jax_row(s, ps, keys, opts) -> tuple[dict, np.ndarray]:
    grid = stack_params(ps)
    st = _static(s, grid, opts)
    check_bounds(grid, opts["max_replicas"], st)
    s = serve_stream(s, st)
    check_stream(s, st, grid)
    single = jax.jit(partial(_one, st=st))
    batch = jax.jit(jax.vmap(partial(_one, st=st), in_axes=(None, 0, 0)))
    jax.block_until_ready(single(s, ps[0], keys[0]))  # compile
    outs, t_s, c_s = _timed(lambda: [single(s, p, k) for p, k in zip(ps, keys)])
    jax.block_until_ready(batch(s, grid, keys))  # compile
    (mb, it_b), t_b, c_b = _timed(lambda: batch(s, grid, keys))
    ms = finalize(jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *[o[0] for o in outs]), st)
    fb = _fields(finalize(jax.tree.map(np.asarray, mb), st))
    fs = _fields(ms)
    assert np.array_equal(fb, fs), "batch and single calls differ"
    it = np.stack([np.asarray(o[1]) for o in outs])  # [G, N + 1] event iterations before each arrival
    assert np.array_equal(it, np.asarray(it_b))
    ev = np.asarray(ms.events)  # Metrics.events: decode stretches and engine steps, summed over replicas
    N = it.shape[1] - 1
    per_cfg = N + it.sum(axis=1)  # a single call's loop iterations
    batch_iters = int(N + it.max(axis=0).sum())
    steps = np.asarray(ms.steps)
    return dict(backend="jax", configurations=len(ps), requests=int(s.n_requests),
                single_calls_s=round(t_s, 3), batch_s=round(t_b, 3), ratio=round(t_b / t_s, 3),
                single_calls_cpu_s=round(c_s, 3), batch_cpu_s=round(c_b, 3), cpu_ratio=round(c_b / c_s, 3),
                steps_mean=float(steps.mean()), steps_max=int(steps.max()),
                events_mean=float(ev.mean()), events_max=int(ev.max()),
                iterations_mean=float(per_cfg.mean()), iterations_max=int(per_cfg.max()),
                batch_iterations=batch_iters, batch_iterations_over_mean=round(batch_iters / per_cfg.mean(), 3),
                flat_bound=int(per_cfg.max()),
                device=jax.default_backend()), fs


def numba_row(s, ps, keys, opts) -> tuple[dict, np.ndarray]:
    from cacheresearch.backends import numba_vllm  # noqa: PLC0415

    grid = stack_params(ps)
    st = _static(s, grid, opts)
    s = serve_stream(s, st)
    numba_vllm.run_stream(s, ps[:2], list(keys[:2]), st)  # compile (or load the cache)
    ms, t_s, c_s = _timed(lambda: [numba_vllm.run_stream(s, [p], [k], st) for p, k in zip(ps, keys)])
    mb, t_b, c_b = _timed(lambda: numba_vllm.run_stream(s, ps, list(keys), st))
    fb = _fields(finalize(mb, st))
    fs = np.concatenate([_fields(finalize(m, st)) for m in ms])
    assert np.array_equal(fb, fs), "numba batch and single calls differ"
    return dict(backend="numba", configurations=len(ps), requests=int(s.n_requests), single_calls_s=round(t_s, 3),
                batch_s=round(t_b, 3), ratio=round(t_b / t_s, 3), single_calls_cpu_s=round(c_s, 3),
                batch_cpu_s=round(c_b, 3), cpu_ratio=round(c_b / c_s, 3)), fb


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--numba", action="store_true", help="also the numba backend (threads over the batch)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    _, s, ps = workload(a.n, a.requests, a.replicas)
    opts = dict(max_replicas=a.replicas, scheduler="vllm", max_running=32, queue_slots=256, match=True)
    keys = jax.random.split(jax.random.key(0), len(ps))
    row, ref = jax_row(s, ps, keys, opts)
    rows = [row]
    print(json.dumps(row), flush=True)
    if a.numba:
        row, f = numba_row(s, ps, keys, opts)
        assert np.array_equal(f, ref), "numba differs from JAX"
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(case="vllm_lockstep", rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()

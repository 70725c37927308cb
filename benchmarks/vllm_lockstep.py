"""A batch of 64 vllm-replica configurations in one call vs the same 64 as single calls (issue 19, point 3).

Run: ``python benchmarks/vllm_lockstep.py [--n 64] [--requests 400]``. Prints one JSON line: the single
calls' summed wall time, the batch's, their ratio, and the engine steps of the configurations (the
work a step-by-step replica would do) beside the loop iterations' bound. Compile time is left out
(each program is run once first). Timings depend on the machine and its load: report them with both;
the process CPU times beside the wall times are less sensitive to other processes on a shared host.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from cacheresearch.core.params import make_params, stack_params
from cacheresearch.core.simulate import simulate, simulate_grid
from cacheresearch.core.stream import compile_stream
from cacheresearch.workload.synthetic import tenant_workload


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--replicas", type=int, default=4)
    a = ap.parse_args(argv)
    # llm-d-like: shared 2,000-token group prefixes, 200 fresh tokens, 100 output tokens (small, for 2 cores)
    w = tenant_workload(n_tenants=16, prefix_tokens=2000, query_tokens=200, users_per_tenant=4, rate_per_s=20,
                        duration_s=a.requests / 20, output_tokens=100, block_tokens=16, seed=0)
    s = compile_stream(w, stateful_singletons=True)
    R, S = a.replicas, 32
    caps = [300, 600, 1200, 2400]
    routers = ["random", "least_loaded", "llmd_precise", "round_robin"]
    seqs = [4, 8, 16, 32]
    cfg = [(c, r, q) for c in caps for r in routers for q in seqs][: a.n]
    ps = [make_params("lru", capacity_blocks=c, replicas=R, router=r, max_num_seqs=q, max_num_batched_tokens=2048,
                      step_model="qwen3_32b_h100_tp2") for c, r, q in cfg]
    opts = dict(max_replicas=R, scheduler="vllm", max_running=S, queue_slots=256, match=True,
                routers_compiled=routers)
    keys = jax.random.split(jax.random.key(0), len(ps))
    simulate(s, ps[0], keys[0], per_request=False, **opts)  # compile
    t0, c0 = time.perf_counter(), time.process_time()
    singles = [simulate(s, p, k, per_request=False, **opts) for p, k in zip(ps, keys)]
    t_single, c_single = time.perf_counter() - t0, time.process_time() - c0
    grid = stack_params(ps)
    simulate_grid(s, grid, keys, **opts)  # compile
    t0, c0 = time.perf_counter(), time.process_time()
    m = simulate_grid(s, grid, keys, **opts)
    t_batch, c_batch = time.perf_counter() - t0, time.process_time() - c0
    steps = np.asarray(m.steps)
    assert np.array_equal(steps, [int(x.steps) for x in singles])
    print(json.dumps(dict(configurations=len(ps), requests=int(w.n_requests), single_calls_s=round(t_single, 3),
                          batch_s=round(t_batch, 3), ratio=round(t_batch / t_single, 3),
                          single_calls_cpu_s=round(c_single, 3), batch_cpu_s=round(c_batch, 3),
                          cpu_ratio=round(c_batch / c_single, 3),
                          steps_mean=float(steps.mean()), steps_max=int(steps.max()),
                          backend=jax.default_backend())))


if __name__ == "__main__":
    main()

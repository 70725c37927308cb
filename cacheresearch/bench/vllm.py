"""``sweep64_vllm``: 64 configurations of an llm-d-like workload on vllm replicas, per backend (issue 19).

Run: ``python -m cacheresearch.bench.vllm [--n 64] [--requests 400] [--backends numba,jax] [--json FILE]``.
The workload is ``benchmarks/vllm_lockstep.py``'s (16 groups sharing 2,000-token prefixes, 200 fresh and
100 output tokens, 4 replicas); the grid crosses KV capacity (``ceil(n / 16)`` log-spaced from 300 to
2,400 blocks: 300, 600, 1,200, 2,400 for 64), router (random, least_loaded, llmd_precise, round_robin)
and ``max_num_seqs`` (4, 8, 16, 32), the first ``n`` of them, configuration ``g`` seeded ``g``. Each
backend runs the whole grid through the runner (:func:`cacheresearch.core.run.simulate_cells`,
``backend=``) twice: the first call includes compilation (``first_call_s``), the second is timed; ``calls``
is the runner's calls (1: one call for the whole grid). Reported per backend: wall and process CPU
seconds, simulated requests per second
(configurations x requests / wall), engine steps and replica events per second (``Metrics.events``: a
decode-only stretch taken at once or one other engine step), events per configuration (mean and max: a
vmapped JAX batch loops as often as its busiest configuration, so ``events_max / events_mean`` is the
lockstep's cost bound), and whether every configuration's steps, events and TTFT p90 equal the first
backend's. Timings depend on the machine and its load: report them with it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from cacheresearch.core.params import make_params
from cacheresearch.core.run import simulate_cells
from cacheresearch.core.stream import compile_stream
from cacheresearch.workload.synthetic import tenant_workload

__all__ = ["sweep_vllm", "main"]

ROUTERS = ("random", "least_loaded", "llmd_precise", "round_robin")


def _grid(n: int, replicas: int) -> list:
    caps = np.unique(np.round(np.geomspace(300, 2400, max(-(-n // 16), 2))).astype(int))
    cfg = [(int(c), r, q) for c in caps for r in ROUTERS for q in (4, 8, 16, 32)]
    return [make_params("lru", capacity_blocks=c, replicas=replicas, router=r, max_num_seqs=q,
                        max_num_batched_tokens=2048, step_model="qwen3_32b_h100_tp2") for c, r, q in cfg[:n]]


def sweep_vllm(n: int = 64, requests: int = 400, backends=("numba", "jax"), replicas: int = 4, on_row=None) -> dict:
    """The ``sweep{n}_vllm`` case: one row per backend (see the module docstring); ``on_row(report)``
    is called after each backend's first call and after its row (a run cut short keeps what it has)."""
    w = tenant_workload(n_tenants=16, prefix_tokens=2000, query_tokens=200, users_per_tenant=4, rate_per_s=20,
                        duration_s=requests / 20, output_tokens=100, block_tokens=16, seed=0)
    s = compile_stream(w, stateful_singletons=True)
    ps = _grid(n, replicas)
    seeds = np.arange(len(ps), dtype=np.uint32)
    opts = dict(max_replicas=replicas, scheduler="vllm", max_running=32, queue_slots=256, match=True,
                per_request=False)
    rows, ref = [], None
    name = f"sweep{len(ps)}_vllm"
    for b in backends:
        t0 = time.perf_counter()
        simulate_cells([s], np.zeros(len(ps), np.int64), ps, seeds, backend=b, **opts)  # compile (and run)
        first = time.perf_counter() - t0
        if on_row is not None:
            on_row(dict(case=name, rows=rows + [dict(name=name, backend=b, first_call_s=round(first, 3))]))
        t0, c0 = time.perf_counter(), time.process_time()
        m, plan = simulate_cells([s], np.zeros(len(ps), np.int64), ps, seeds, backend=b, **opts)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        got = (np.asarray(m.steps), np.asarray(m.events), np.asarray(m.ttft_p90_ms))
        same = None if ref is None else all(np.array_equal(a, b) for a, b in zip(got, ref))
        ref = got if ref is None else ref
        steps, ev = int(got[0].sum()), got[1].astype(np.int64)
        rows.append(dict(name=name, backend=b, programs=[g.backend for g in plan.groups], calls=plan.calls,
                         configurations=len(ps), requests=int(w.n_requests), first_call_s=round(first, 3),
                         wall_s=round(wall, 3),
                         cpu_s=round(cpu, 3), requests_per_s=round(len(ps) * int(w.n_requests) / wall, 1),
                         engine_steps=steps, engine_steps_per_s=round(steps / wall, 1),
                         events=int(ev.sum()), events_per_s=round(int(ev.sum()) / wall, 1),
                         events_per_config_mean=round(float(ev.mean()), 1), events_per_config_max=int(ev.max()),
                         equal_to_first_backend=same))
        if on_row is not None:
            on_row(dict(case=name, rows=rows))
    return dict(case=name, rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench.vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--backends", default="numba,jax")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    def write(rep):
        print(json.dumps(rep["rows"][-1]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rep, f, indent=1)

    sweep_vllm(a.n, a.requests, tuple(x for x in a.backends.split(",") if x), on_row=write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m cacheresearch.bench.policies [--quick] [--json FILE]``: the per-block policies against
libCacheSim, and their cost against the engine's LRU.

``sweep64_policies``: for each of ``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``, 64 configurations
(16 capacities x replicas 1, 2, 4, 8, round-robin routing) on one workload's block stream (each
request's blocks leaf-first, per replica), through the project's numba engine
(:func:`cacheresearch.backends.numba_policies.block_replay_grid`, configurations in parallel threads)
and through libCacheSim's same policy with its defaults (``process_trace`` over one oracleGeneral file
per replica, every (configuration, replica) a task of a process pool over all cores). Trace files,
readers and cache construction are outside libCacheSim's timer, the compile outside the project's
(a warm-up call of the same configurations: numba's kernel and the routers' JAX rules compile for its
shapes). The block hit counts are checked equal (``equal``). ``ratio`` = libCacheSim's parallel wall time
/ the project's time.

``cost_per_access``: one configuration of every policy, the JAX engine's ``lru`` and the LRU numba
backend on the same stream, seconds per block access (``vs_engine_lru``: the policy's time / the JAX
engine's LRU time, compile excluded).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cacheresearch.cache.block import BLOCK_POLICY_IDS
from cacheresearch.workload import Workload

__all__ = ["sweep64_policies", "cost_per_access", "main"]

_LCS_NAMES = {"fifo": "FIFO", "sieve": "Sieve", "s3fifo": "S3FIFO", "lfu": "LFU", "arc": "ARC"}


def _lcs_task(args):
    policy, path, capacity, hp = args
    import libcachesim as lcs  # noqa: PLC0415

    reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(lcs, _LCS_NAMES[policy])(cache_size=int(capacity), hashpower=int(hp))
    t = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    dt = time.perf_counter() - t
    n = int(reader.get_num_of_req())
    return dt, n - round(float(miss_ratio) * n)


def _workload(quick: bool) -> tuple[Workload, str]:
    from cacheresearch.workload.trace import load_mooncake  # noqa: PLC0415

    shared = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
    fixture = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "mini_mooncake.jsonl"
    path = shared if shared.exists() else fixture
    w = load_mooncake(path, block_tokens=512)
    if quick:
        w = w.slice(0, min(w.n_requests, 1000))
    return w, path.name


def _replica_streams(w: Workload, R: int, tmp: Path, tag: str):
    from cacheresearch.bench import hashpower, leaf_first_ids  # noqa: PLC0415
    from cacheresearch.workload import trace  # noqa: PLC0415

    ids = leaf_first_ids(w)
    rep = np.repeat(np.arange(w.n_requests) % R, w.n_blocks)
    out = []
    for r in range(R):
        s = ids[rep == r]
        if s.size == 0:
            continue
        p = tmp / f"{tag}_R{R}_r{r}.oracleGeneral"
        trace.write_oracle_general(s, p)
        out.append((str(p), hashpower(int(np.unique(s).size))))
    return out


def sweep64_policies(w: Workload, *, workers: int | None = None, policies=BLOCK_POLICY_IDS) -> list[dict]:
    from cacheresearch.backends.numba_policies import block_replay_grid  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415

    U = int(np.unique(w.keys).size)
    caps = np.unique(np.geomspace(max(U // 200, 20), max(U // 2, 40), 16).astype(int))
    configs = [(int(c), R) for R in (1, 2, 4, 8) for c in caps]
    workers = workers or os.cpu_count() or 1
    ctx = multiprocessing.get_context("spawn")
    out = []
    with tempfile.TemporaryDirectory() as tmpd, ctx.Pool(workers) as pool:
        tmp = Path(tmpd)
        streams = {R: _replica_streams(w, R, tmp, "s") for R in (1, 2, 4, 8)}
        pool.map(_lcs_task, [("fifo", streams[1][0][0], 10, streams[1][0][1])] * workers)  # warm workers
        for policy in policies:
            params = [make_params(policy, capacity_blocks=c, replicas=R) for c, R in configs]
            block_replay_grid(w, params, max_replicas=8)  # compile (the kernel and the routers' JAX rules)
            t = time.perf_counter()
            m = block_replay_grid(w, params, max_replicas=8)
            proj = time.perf_counter() - t
            tasks = [(policy, p, c, hp) for c, R in configs for p, hp in streams[R]]
            t = time.perf_counter()
            res = pool.map(_lcs_task, tasks, chunksize=1)
            wall = time.perf_counter() - t
            hits, k = [], 0
            for c, R in configs:
                n = len(streams[R])
                hits.append(sum(h for _, h in res[k:k + n]))
                k += n
            out.append(dict(case="sweep64_policies", policy=policy, configs=len(configs), project_s=proj,
                            libcachesim_parallel_s=wall, libcachesim_sequential_s=float(sum(d for d, _ in res)),
                            workers=workers, ratio=wall / proj, ratio_sequential=float(sum(d for d, _ in res)) / proj,
                            equal=bool(np.array_equal(np.asarray(hits), np.asarray(m.block_hits))),
                            accesses=int(w.total_blocks)))
    return out


def cost_per_access(w: Workload, capacity: int | None = None, repeats: int = 3) -> list[dict]:
    import jax  # noqa: PLC0415

    from cacheresearch.backends.numba_cache import replay_grid  # noqa: PLC0415
    from cacheresearch.backends.numba_policies import block_replay_grid  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.stream import compile_stream  # noqa: PLC0415
    from cacheresearch.engine import simulate  # noqa: PLC0415

    U = int(np.unique(w.keys).size)
    C = int(capacity or max(U // 10, 1))
    S = int(w.total_blocks)

    def best(fn):
        fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return min(ts)

    s = compile_stream(w)
    p = make_params("lru", capacity_blocks=C)
    key = jax.random.key(0)
    lru_jax = best(lambda: simulate(s, p, key, per_request=False, queue=False))
    lru_numba = best(lambda: replay_grid(w, [p], [key], stream=s))
    rows = [dict(case="cost_per_access", policy="lru (JAX engine)", seconds=lru_jax, capacity=C, accesses=S),
            dict(case="cost_per_access", policy="lru (numba backend)", seconds=lru_numba, capacity=C, accesses=S)]
    for policy in BLOCK_POLICY_IDS:
        pp = [make_params(policy, capacity_blocks=C)]
        rows.append(dict(case="cost_per_access", policy=policy, capacity=C, accesses=S,
                         seconds=best(lambda pp=pp: block_replay_grid(w, pp))))
    for r in rows:
        r["us_per_access"] = 1e6 * r["seconds"] / S
        r["vs_engine_lru"] = r["seconds"] / lru_jax
        r["vs_numba_lru"] = r["seconds"] / lru_numba
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench.policies", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 1,000 requests of the workload")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--cases", default="sweep64_policies,cost_per_access")
    a = ap.parse_args(argv)
    w, name = _workload(a.quick)
    rows = []
    if "cost_per_access" in a.cases:
        rows += cost_per_access(w)
    if "sweep64_policies" in a.cases:
        rows += sweep64_policies(w)
    for r in rows:
        r["workload"] = name
        r["requests"] = int(w.n_requests)
        print(json.dumps(r), file=sys.stdout)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(cores=os.cpu_count(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

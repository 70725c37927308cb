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

``cost_per_access``: one configuration of ``lru`` and every per-block policy through the public engine on
each backend (``jax``, ``numba``), seconds per block access (``vs_lru``: the policy's time / ``lru``'s on the
same backend, compile excluded), each per-block policy's hits checked equal to libCacheSim's on the same
object stream (``equal_libcachesim``).

``sweep64_policies_jax``: ``sweep64_policies``' configurations on the JAX backend (what a GPU runs), checked
equal to the numba kernels.
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

from cacheresearch.cache.blocks import JAX_RULES
from cacheresearch.cache.policies import block_policies
from cacheresearch.workload import Workload

__all__ = ["sweep64_policies", "cost_per_access", "main"]

_LCS_NAMES = {"lru": "LRU", "fifo": "FIFO", "sieve": "Sieve", "s3fifo": "S3FIFO", "lfu": "LFU", "arc": "ARC"}


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


def sweep64_policies(w: Workload, *, workers: int | None = None, policies=None) -> list[dict]:
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
        for policy in policies or block_policies():
            if policy not in _LCS_NAMES:  # a policy libCacheSim does not have: nothing to time it against
                out.append(dict(case="sweep64_policies", policy=policy, skipped="no libCacheSim counterpart"))
                continue
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


def _lcs_hits(policy: str, ids: np.ndarray, capacity: int) -> int:
    """libCacheSim's hits of ``policy`` (its defaults) on one object stream of block ids."""
    from cacheresearch.bench import hashpower  # noqa: PLC0415
    from cacheresearch.workload import trace  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmpd:
        p = Path(tmpd) / "objects.oracleGeneral"
        trace.write_oracle_general(ids, p)
        return _lcs_task((policy, str(p), capacity, hashpower(int(np.unique(ids).size))))[1]


def object_stream(ids: np.ndarray, block_tokens: int) -> Workload:
    """Block ids as an object stream: one request of one block per access, 1 ms apart (no two blocks share
    a request, so the prefix cache's leading-run hit is libCacheSim's per-object hit)."""
    S = int(ids.size)
    return Workload(arrival_ms=np.arange(S, dtype=np.int64), input_tokens=np.full(S, block_tokens, np.int64),
                    output_tokens=np.zeros(S, np.int64), tenant=np.zeros(S, np.int32),
                    keys=np.asarray(ids, np.uint64), offsets=np.arange(S + 1, dtype=np.int64),
                    block_tokens=block_tokens, name="objects")


def cost_per_access(w: Workload, capacity: int | None = None, repeats: int = 3) -> list[dict]:
    """One configuration (one replica) of ``lru`` and every per-block policy through the public engine
    (:func:`cacheresearch.core.run.simulate_cells`) on :func:`object_stream` of ``w``'s blocks, leaf-first, on
    each backend (``jax``: the scan;
    ``numba``: :mod:`cacheresearch.backends.numba_cache` for lru, :mod:`cacheresearch.backends.numba_blocks`
    for the rest), seconds per block access after a warm-up call; ``vs_lru`` = the policy's time / lru's on
    the same backend; ``equal_libcachesim``: the engine's block hits equal libCacheSim's on the same object
    stream, hit for hit (``lru`` against libCacheSim's LRU too)."""
    from cacheresearch.bench import leaf_first_ids  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415
    from cacheresearch.core.stream import compile_stream  # noqa: PLC0415

    ids = leaf_first_ids(w)
    U = int(np.unique(ids).size)
    C = int(capacity or max(U // 10, 1))
    S = int(ids.size)
    obj = object_stream(ids, int(w.block_tokens))
    streams = [compile_stream(obj, block_ids=True)]

    def best(fn):
        out = fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return min(ts), out

    rows = []
    for backend in ("numba", "jax"):
        base = None
        for policy in ("lru", *block_policies()):
            if backend == "jax" and policy != "lru" and policy not in JAX_RULES:
                rows.append(dict(case="cost_per_access", policy=policy, backend=backend, skipped="no JAX rule"))
                continue
            p = [make_params(policy, capacity_blocks=C)]
            sec, m = best(lambda p=p, b=backend: simulate_cells(streams, np.zeros(1, np.int64), p, np.zeros(1),
                                                                max_replicas=1, backend=b, queue=False,
                                                                per_request=True)[0])
            base = sec if policy == "lru" else base
            hits = int(np.asarray(m.hit_blocks)[0, :S].astype(np.int64).sum())
            row = dict(case="cost_per_access", policy=policy, backend=backend, seconds=sec, capacity=C, accesses=S,
                       us_per_access=1e6 * sec / S, vs_lru=sec / base, block_hits=hits)
            row["equal_libcachesim"] = hits == _lcs_hits(policy, ids, C) if policy in _LCS_NAMES else None
            rows.append(row)
    return rows


def sweep64_policies_jax(w: Workload, policies=None) -> list[dict]:
    """``sweep64_policies``' 64 configurations per policy on the JAX backend (the scan a GPU runs; one
    compiled program per policy, the configurations vmapped), compile excluded (a warm-up call), checked
    equal to the numba kernels request by request (each request's leading hit blocks)."""
    import jax  # noqa: PLC0415

    from cacheresearch.backends.numba_policies import block_replay_grid  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.simulate import simulate_grid  # noqa: PLC0415 - the JAX scan
    from cacheresearch.core.stream import compile_stream  # noqa: PLC0415
    from cacheresearch.engine import stack_params  # noqa: PLC0415

    U = int(np.unique(w.keys).size)
    caps = np.unique(np.geomspace(max(U // 200, 20), max(U // 2, 40), 16).astype(int))
    configs = [(int(c), R) for R in (1, 2, 4, 8) for c in caps]
    s = compile_stream(w, block_ids=True)
    out = []
    for policy in policies or [p for p in block_policies() if p in JAX_RULES]:
        params = [make_params(policy, capacity_blocks=c, replicas=R) for c, R in configs]
        keys = jax.vmap(jax.random.key)(np.zeros(len(params), np.uint32))

        def run(params=params, keys=keys):
            m = simulate_grid(s, stack_params(params), keys, max_replicas=8, per_request=True, queue=False)
            return jax.block_until_ready(m)

        t = time.perf_counter()
        run()
        first = time.perf_counter() - t
        t = time.perf_counter()
        m = run()
        sec = time.perf_counter() - t
        ref = block_replay_grid(w, params, max_replicas=8)
        out.append(dict(case="sweep64_policies_jax", policy=policy, backend="jax", device=jax.devices()[0].platform,
                        configs=len(configs), seconds=sec, compile_and_first_s=first, accesses=int(w.total_blocks),
                        equal=bool(np.array_equal(np.asarray(m.hit_blocks)[:, :w.n_requests],
                                                  np.asarray(ref.hit_blocks)[:, :w.n_requests]))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench.policies", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 1,000 requests of the workload")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--cases", default="sweep64_policies,cost_per_access,sweep64_policies_jax")
    ap.add_argument("--jax-requests", type=int, default=60,
                    help="sweep64_policies_jax on the workload's first N requests (the JAX scan runs each block as "
                         "a loop step: minutes per policy on a CPU; 0: all)")
    a = ap.parse_args(argv)
    w, name = _workload(a.quick)
    rows = []
    cases = a.cases.split(",")

    def emit(new):  # each case's rows as soon as it ends (a long case does not hide the others')
        for r in new:
            r["workload"] = name
            r.setdefault("requests", int(w.n_requests))
            print(json.dumps(r), file=sys.stdout, flush=True)
        rows.extend(new)

    if "cost_per_access" in cases:
        emit(cost_per_access(w))
    if "sweep64_policies" in cases:
        emit(sweep64_policies(w))
    if "sweep64_policies_jax" in cases:
        wj = w.slice(0, min(w.n_requests, a.jax_requests)) if a.jax_requests > 0 else w
        emit([dict(r, requests=int(wj.n_requests)) for r in sweep64_policies_jax(wj)])
    if a.json:
        Path(a.json).write_text(json.dumps(dict(cores=os.cpu_count(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""libCacheSim's side of the bench: per-replica trace files, one-core runs and a pool of workers."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cacheresearch.bench.timing import Timing
from cacheresearch.workload import Workload, trace


def import_lcs():
    try:
        import libcachesim as lcs  # noqa: PLC0415

        return lcs
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None


def hashpower(distinct_ids: int) -> int:
    """libCacheSim's ``hashpower`` (log2 of the hash table's buckets) for a trace holding
    ``distinct_ids`` distinct objects: at least two buckets per object, so the table never grows
    during ``process_trace``, whatever the capacity; at least 2**10 buckets."""
    return max(10, int(math.ceil(math.log2(max(2, int(distinct_ids))))) + 1)


def leaf_first_ids(w: Workload) -> np.ndarray:
    """Dense ids (1-based) of every block, each request's blocks in leaf-first order."""
    _, ids = np.unique(w.keys, return_inverse=True)
    nb = w.n_blocks
    req = np.repeat(np.arange(w.n_requests, dtype=np.int64), nb)
    pos = np.arange(w.total_blocks, dtype=np.int64) - w.offsets[:-1][req]
    leaf = w.offsets[:-1][req] + (nb[req] - 1 - pos)
    return ids.reshape(-1)[leaf].astype(np.uint64) + np.uint64(1)


@dataclass(frozen=True)
class LcsUnit:
    """One libCacheSim run: one replica's trace through one fresh LRU cache."""

    config: int  # index of the configuration it belongs to
    path: str
    capacity: int
    hashpower: int
    length: int  # requests in the trace (as written)


class LcsStreams:
    """One oracleGeneral file (and reader) per replica for one routing, written once."""

    def __init__(self, lcs, w: Workload, ids_leaf: np.ndarray, replica: np.ndarray, n_replicas: int, tmp: Path,
        tag: str):
        self.lcs = lcs
        block_rep = np.repeat(np.asarray(replica, dtype=np.int64), w.n_blocks)
        self.lengths: list[int] = []
        self.distinct: list[int] = []
        self.readers = []
        self.paths: list[str | None] = []
        for r in range(n_replicas):
            s = ids_leaf[block_rep == r]
            self.lengths.append(int(s.size))
            self.distinct.append(int(np.unique(s).size))
            if s.size == 0:
                self.readers.append(None)
                self.paths.append(None)
                continue
            p = tmp / f"{tag}_r{r}.oracleGeneral"
            trace.write_oracle_general(s, p)
            self.paths.append(str(p))
            self.readers.append(lcs.TraceReader(str(p), lcs.TraceType.ORACLE_GENERAL_TRACE))
        self.total = int(sum(self.lengths))
        #: requests libCacheSim's own readers hold, summed over the replicas (checked == total)
        self.accesses = int(sum(int(rd.get_num_of_req()) for rd in self.readers if rd is not None))

    def units(self, capacity: int, config: int = 0) -> list[LcsUnit]:
        return [LcsUnit(config, p, int(capacity), hashpower(d), n)
                for p, d, n in zip(self.paths, self.distinct, self.lengths) if p is not None]

    def run_timed(self, capacity: int) -> tuple[float, int]:
        """``(seconds, misses)`` of one configuration (one LRU cache per replica, one after another):
        each cache is built before its timer starts; only ``process_trace`` is timed."""
        busy = 0.0
        misses = 0
        for n, reader, d in zip(self.lengths, self.readers, self.distinct):
            if reader is None:
                continue
            cache = self.lcs.LRU(cache_size=int(capacity), hashpower=hashpower(d))
            t = time.perf_counter()
            miss_ratio, _ = cache.process_trace(reader)
            busy += time.perf_counter() - t
            misses += round(float(miss_ratio) * n)
            del cache  # freed outside the timer
        return busy, misses

    def run(self, capacity: int) -> int:
        """Block miss count of one configuration."""
        return self.run_timed(capacity)[1]


def lcs_sequential(configs: list[tuple[LcsStreams, int]]) -> tuple[float, list[int]]:
    """One core: every configuration ``(streams, capacity)`` in turn; ``(process_trace seconds, misses)``."""
    busy = 0.0
    misses = []
    for st, cap in configs:
        s, m = st.run_timed(cap)
        busy += s
        misses.append(m)
    return busy, misses


def assign_units(lengths: list[int], workers: int) -> list[list[int]]:
    """Indices of the units per worker: longest trace first, each to the least-loaded worker (load =
    requests)."""
    out: list[list[int]] = [[] for _ in range(max(1, workers))]
    load = [0] * len(out)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(len(out)), key=lambda j: (load[j], j))
        out[k].append(i)
        load[k] += lengths[i]
    return out


# The worker side of the pool (module level, so that spawned processes can unpickle it).
_W: dict = {"barrier": None, "readers": {}}


def lcs_worker_init(barrier) -> None:
    _W["barrier"] = barrier


def lcs_worker_batch(units: list[tuple[str, int, int]], timeout_s: float, forget: bool = False):
    """One worker's share of a batch: units ``(path, capacity, hashpower)``.

    Opens the readers (untimed), meets the other workers and the bench at the barrier, then for each
    unit, exactly as :meth:`LcsStreams.run_timed` does on one core: builds a fresh LRU cache (untimed),
    times ``process_trace``, frees the cache (untimed). Returns ``(pid, timed seconds, span seconds,
    CPU seconds, [(miss_ratio, requests the reader holds)])``; span and CPU run from the barrier to
    the end, untimed work included. ``forget`` closes the readers first."""
    lcs = import_lcs()
    if forget:
        _W["readers"].clear()
    readers = _W["readers"]
    if units and lcs is None:
        raise RuntimeError("libcachesim is not importable in the worker")
    for path, _, _ in units:
        if path not in readers:
            readers[path] = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    _W["barrier"].wait(timeout_s)
    w0, c0 = time.perf_counter(), time.process_time()
    busy = 0.0
    out = []
    for path, cap, hp in units:
        cache = lcs.LRU(cache_size=int(cap), hashpower=int(hp))
        t = time.perf_counter()
        miss_ratio, _ = cache.process_trace(readers[path])
        busy += time.perf_counter() - t
        out.append((float(miss_ratio), int(readers[path].get_num_of_req())))
        del cache
    return os.getpid(), busy, time.perf_counter() - w0, time.process_time() - c0, out


class LcsPool:
    """``workers`` processes that run libCacheSim batches in parallel (see the module docstring).

    Started with the ``spawn`` method (JAX in the bench process is multithreaded) and with
    ``JAX_PLATFORMS=cpu`` in their environment (importing the package must not claim an accelerator);
    warmed up at construction by one empty batch, which starts every worker and imports libCacheSim
    there. In a batch every worker gets one task (they all meet at one barrier, so no worker can take
    two): all start together once every worker has opened its readers."""

    def __init__(self, workers: int, timeout_s: float = 600.0):
        self.workers = int(workers)
        self.timeout_s = float(timeout_s)
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(self.workers + 1)
        saved = {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")}
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        t = time.perf_counter()
        try:
            self.ex = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=lcs_worker_init,
                                          initargs=(self.barrier,))
            _, res = self.batch([[] for _ in range(self.workers)])  # every worker started and warm
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.pids = sorted({r[0] for r in res})
        self.start_s = time.perf_counter() - t
        if len(self.pids) != self.workers:
            self.close()
            raise RuntimeError(f"expected {self.workers} worker processes, saw {len(self.pids)}")

    def batch(self, per_worker: list[list[tuple[str, int, int]]], forget: bool = False) -> tuple[float, list]:
        """Run one batch (one list of units per worker); returns ``(wall seconds from the barrier to the
        last result, results per worker)``."""
        if self.ex is None:
            raise RuntimeError("the libCacheSim pool is closed")
        if len(per_worker) != self.workers:
            raise ValueError(f"need one unit list per worker ({self.workers})")
        futs = [self.ex.submit(lcs_worker_batch, u, self.timeout_s, forget) for u in per_worker]
        # wait (untimed) until every worker has opened its readers and waits at the barrier; a worker
        # that failed (or could not start) ends the wait at once instead of at the timeout
        deadline = time.monotonic() + self.timeout_s
        while self.barrier.n_waiting < self.workers:
            failed = [f for f in futs if f.done()]
            if failed or time.monotonic() > deadline:
                self.barrier.abort()
                errors = [repr(f.exception()) for f in failed if f.exception() is not None]
                self.close()
                raise RuntimeError("libCacheSim workers did not reach the barrier"
                                   + (f": {errors[0][:400]}" if errors else f" within {self.timeout_s:.0f} s"))
            time.sleep(0.002)
        try:
            self.barrier.wait(self.timeout_s)
        except threading.BrokenBarrierError:
            self.close()
            raise RuntimeError("the libCacheSim barrier broke") from None
        t = time.perf_counter()
        res = [f.result() for f in futs]
        return time.perf_counter() - t, res

    def run(self, units: list[LcsUnit]) -> dict:
        """One batch of ``units``. Returns ``seconds`` (the batch's time: the largest of the workers'
        timed ``process_trace`` sums, since they ran together), ``wall`` (barrier to last result,
        untimed cache construction and freeing included), ``results`` ([(miss ratio, requests the
        worker's reader holds)] in the order of ``units``), ``workers`` (those that got work),
        ``cpu`` (the workers' CPU seconds) and ``busy`` (each worker's timed sum)."""
        plan = assign_units([u.length for u in units], self.workers)
        wall, res = self.batch([[(units[i].path, units[i].capacity, units[i].hashpower) for i in idx] for idx in plan])
        out: list = [None] * len(units)
        for idx, r in zip(plan, res):
            got = r[4]
            if len(got) != len(idx):
                raise RuntimeError("a libCacheSim worker returned the wrong number of results")
            for i, o in zip(idx, got):
                out[i] = o
        busy = [float(r[1]) for idx, r in zip(plan, res) if idx]
        return {"seconds": max(busy, default=0.0), "wall": wall, "results": out, "workers": len(busy),
                "cpu": float(sum(r[3] for r in res)), "busy": busy}

    def release(self) -> None:
        """Close every worker's readers (an empty batch)."""
        self.batch([[] for _ in range(self.workers)], forget=True)

    def close(self) -> None:
        ex, self.ex = getattr(self, "ex", None), None
        if ex is not None:
            self.barrier.abort()  # a worker still waiting at the barrier returns at once
            ex.shutdown(wait=True, cancel_futures=True)



@dataclass
class LcsResult:
    """libCacheSim's figures for one list of configurations (each ``(streams, capacity)``)."""

    sequential: Timing  # value: misses per configuration
    parallel: Timing | None = None  # value: misses per configuration
    workers: int | None = None  # worker processes that got work
    parallel_accesses: list[int] | None = None  # requests the workers' readers held, per configuration
    parallel_wall: Timing | None = None  # barrier to last result, untimed construction and freeing included
    parallel_cores_used: float | None = None  # the workers' CPU seconds / wall seconds, last parallel batch
    parallel_balance: float | None = None  # mean / max of the workers' timed sums, last parallel batch
    note: str | None = None

    @property
    def sequential_misses(self) -> np.ndarray:
        return np.asarray(self.sequential.value, dtype=np.int64)

    @property
    def parallel_misses(self) -> np.ndarray | None:
        return None if self.parallel is None else np.asarray(self.parallel.value, dtype=np.int64)

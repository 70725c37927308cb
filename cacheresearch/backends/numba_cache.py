"""A second CPU backend: the run-compressed engine as a compiled sequential loop (numba).

The JAX engine (:mod:`.simulate`) is the engine: every policy, router, view and the queue, on CPU,
GPU and TPU, vmapped over configurations. On a CPU an XLA scan step has a fixed cost (about two
microseconds), which dominates when requests have few runs. This backend runs the same algorithm
as plain loops compiled by numba, configurations in parallel threads (``prange``), for the part of
the engine whose routing is fixed before the run:

* policies ``lru``, ``lru_plain``, ``ttl_refresh``, ``ttl_fixed``, ``unbounded``;
* routers that read neither load nor cache (``random``, ``round_robin``, ``prefix_hash``; decisions
  from :func:`cacheresearch.analysis.mrc.route_requests`, the registered rules themselves, so
  ``random`` makes the engine's draws);
* hit rates and occupancy only (no queue model, no ``kv_pressure``).

Same runs, same stamps, same lazy threshold and eviction pointer as :mod:`cacheresearch.cache.store`,
so the results are the engine's, request by request (``tests/test_replay.py``). Anything outside
that scope is refused with a message naming the JAX engine.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cacheresearch.analysis.mrc import route_requests_many
from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.stream import compile_stream
from cacheresearch.routers import LOAD_FREE_ROUTERS, ROUTERS
from cacheresearch.workload import Workload

__all__ = ["ReplayMetrics", "replay_grid", "REPLAY_POLICIES"]

REPLAY_POLICIES = ("lru", "lru_plain", "ttl_refresh", "ttl_fixed", "unbounded")
_KERNEL = None


class ReplayMetrics(NamedTuple):
    """The engine's hit and occupancy metrics (:class:`cacheresearch.core.simulate.Metrics` fields
    of the same names), per configuration [G]."""

    token_hit_rate: np.ndarray  # float64 [G]
    hit_tokens: np.ndarray  # int64 [G] (the engine's combine_limbs(hit_tokens_hi, hit_tokens_lo))
    requests_hit: np.ndarray  # int64 [G]
    max_occupancy: np.ndarray  # int32 [G, R_max]
    occupancy: np.ndarray  # int32 [G, R_max]
    requests_per_replica: np.ndarray  # int32 [G, R_max]
    hit_blocks: np.ndarray  # int32 [G, N]
    replica: np.ndarray  # int32 [G, N]


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import numba  # noqa: PLC0415

        @numba.njit(parallel=True, cache=True)
        def run(arrival, nb, inp, off, nruns, e0, log0, K, bt, rep, cap, ttl, leaf, refresh, R):
            G, N = rep.shape
            E = log0.shape[0]
            hit_blocks = np.zeros((G, N), np.int32)
            hit_tok = np.zeros(G, np.int64)
            req_hit = np.zeros(G, np.int64)
            occ_out = np.zeros((G, R), np.int32)
            max_occ = np.zeros((G, R), np.int32)
            nreq = np.zeros((G, R), np.int32)
            for g in numba.prange(G):
                stamp = np.full((R, K), -1, np.int64)
                tim = np.zeros((R, K), np.int64)
                lr = np.zeros((R, E), np.int64)
                lm = np.zeros((R, E), np.int64)
                lb = np.zeros((R, E), np.int64)
                cnt = np.zeros(R, np.int64)
                pq = np.zeros(R, np.int64)
                poff = np.zeros(R, np.int64)
                thr = np.zeros(R, np.int64)
                occ = np.zeros(R, np.int64)
                C, T, lf, rf = cap[g], ttl[g], leaf[g], refresh[g]
                for i in range(N):
                    r = rep[g, i]
                    now = arrival[i]
                    n = nb[i]
                    hit = 0
                    alive = True
                    new = 0
                    for q in range(nruns[i]):
                        e = e0[i] + q
                        run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
                        sl = 0
                        t_old = 0
                        if run < K:
                            s = stamp[r, run]
                            t_old = tim[r, run]
                            if s >= 0:
                                sl = min(max(s + m - thr[r], 0), m)
                        live = now - t_old <= T
                        if alive:
                            if sl == m and live:
                                hit += m
                            else:
                                if live and lf:
                                    hit += sl
                                alive = False
                        new += m - sl
                        if run < K:
                            stamp[r, run] = (off[i] + n - (bp - off[i]) - m) if lf else bp
                            if rf or not (sl > 0 and live):
                                tim[r, run] = now
                    # the request's entries, base stamps ascending (leaf-first: last run first)
                    p = nruns[i]
                    for k in range(p):
                        e = e0[i] + ((p - 1 - k) if lf else k)
                        run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
                        c = cnt[r]
                        lr[r, c] = run
                        lm[r, c] = m
                        lb[r, c] = (off[i] + n - (bp - off[i]) - m) if lf else bp
                        cnt[r] = c + 1
                    occ[r] += new
                    while occ[r] > C and pq[r] < cnt[r]:
                        j = pq[r]
                        run, m, b = lr[r, j], lm[r, j], lb[r, j]
                        ok = run == K + 1 or (run < K and stamp[r, run] == b)
                        avail = m - poff[r] if ok else 0
                        need = occ[r] - C
                        if avail > need:
                            poff[r] += need
                            occ[r] -= need
                        else:
                            occ[r] -= avail
                            pq[r] = j + 1
                            poff[r] = 0
                    if pq[r] < cnt[r]:
                        thr[r] = lb[r, pq[r]] + poff[r]
                    elif cnt[r] > 0:
                        thr[r] = lb[r, cnt[r] - 1] + lm[r, cnt[r] - 1]
                    if occ[r] > max_occ[g, r]:
                        max_occ[g, r] = occ[r]
                    nreq[g, r] += 1
                    hb = hit
                    hit_blocks[g, i] = hb
                    ht = inp[i] if hb > inp[i] // bt else hb * bt
                    hit_tok[g] += ht
                    if hb > 0:
                        req_hit[g] += 1
                for r in range(R):
                    occ_out[g, r] = occ[r]
            return hit_blocks, hit_tok, req_hit, occ_out, max_occ, nreq

        _KERNEL = run
    return _KERNEL


def replay_grid(workload: Workload, params, keys, *, max_replicas: int = 1, stream=None) -> ReplayMetrics:
    """Run configurations ``params`` (a list of :class:`~cacheresearch.core.params.Params`, or
    stacked fields [G]) over ``workload``; ``keys`` [G] PRNG keys (the ``random`` router's draws).
    The results equal the JAX engine's on the same stream (:func:`compile_stream` of the workload;
    pass it as ``stream`` to keep that host work out of a timed call)."""
    if isinstance(params, (list, tuple)):
        from cacheresearch.core.params import stack_params  # noqa: PLC0415

        params = stack_params(list(params))
    P = {f: np.asarray(getattr(params, f)).reshape(-1) for f in params._fields}
    G = P["policy"].shape[0]
    names = {v.id: k for k, v in POLICIES.items()}
    bad = sorted({names[int(x)] for x in P["policy"]} - set(REPLAY_POLICIES))
    if bad:
        raise ValueError(f"policies {bad} are not in the replay backend ({', '.join(REPLAY_POLICIES)}): use the "
                         "JAX engine (simulate, simulate_grid)")
    rnames = {v: k for k, v in ROUTERS.items()}
    rt = [rnames[int(x)] for x in P["router"]]
    if set(rt) - set(LOAD_FREE_ROUTERS):
        raise ValueError(f"routers {sorted(set(rt) - set(LOAD_FREE_ROUTERS))} read load or cache: use the JAX engine")
    if P["kv_pressure"].any():
        raise ValueError("kv_pressure needs the queue model: use the JAX engine")
    if np.any(P["replicas"] > max_replicas) or np.any(P["replicas"] < 1):
        raise ValueError(f"replicas outside [1, max_replicas={max_replicas}]")
    s = compile_stream(workload) if stream is None else stream
    N = workload.n_requests
    if int(s.n_requests) != N or s.arrival_ms.shape[-1] != N + 1:
        raise ValueError("stream must be compile_stream(workload), unpadded")
    keys = list(keys) if not hasattr(keys, "shape") or keys.shape else [keys]
    rep = np.zeros((G, N), np.int64)
    groups: dict[tuple, list[int]] = {}  # one routing call per (router, replicas, prefix_blocks)
    for g in range(G):
        groups.setdefault((rt[g], int(P["replicas"][g]), int(P["prefix_blocks"][g])), []).append(g)
    for (router, R, pb), gs in groups.items():
        got = route_requests_many(workload, router, R, prefix_blocks=pb,
                                  keys=[keys[g] for g in gs] if router == "random" else None)
        rep[gs] = got
    host = {k: np.asarray(getattr(s, k)).astype(np.int64) for k in
            ("arrival_ms", "n_blocks", "input_tokens", "offset", "n_runs", "entry0")}
    log0 = np.asarray(s.log[0]).astype(np.int64)
    out = _kernel()(host["arrival_ms"], host["n_blocks"], host["input_tokens"], host["offset"], host["n_runs"],
                    host["entry0"], log0, s.n_keys, int(workload.block_tokens), rep,
                    P["capacity"].astype(np.int64), P["ttl_ms"].astype(np.int64), P["leaf_first"].astype(np.bool_),
                    P["refresh"].astype(np.bool_), int(max_replicas))
    hb, ht, rh, occ, mocc, nreq = out
    total = float(workload.input_tokens.sum())
    rate = ht / total if total > 0 else np.zeros(G)
    return ReplayMetrics(rate, ht, rh, occ, mocc, nreq, hb, rep.astype(np.int32))

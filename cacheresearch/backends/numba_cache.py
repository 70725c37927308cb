"""The engine's numba CPU backend for the fcfs replica: the run-compressed algorithm as compiled loops.

The JAX engine (:mod:`cacheresearch.core.simulate`) is the engine: every policy, router, view and
both replica models, on CPU, GPU and TPU, vmapped over configurations. On a CPU an XLA scan step has
a fixed cost (about two microseconds), which dominates when requests have few runs. This backend
runs the same algorithm as plain loops compiled by numba, configurations in parallel threads
(``prange``), for the configurations :func:`coverage` accepts:

* policies ``lru``, ``lru_plain``, ``ttl_refresh``, ``ttl_fixed``, ``unbounded``;
* routers that read neither load nor cache (``random``, ``round_robin``, ``prefix_hash``): their
  decisions are fixed before the run (:func:`cacheresearch.routers.fixed.fixed_routes`, the
  registered rules themselves, so ``random`` makes the engine's draws);
* the fcfs replica's queue model (:mod:`cacheresearch.replica.fcfs`: TTFT, busy time, queue-slot
  overflow, saturation), or none (``queue=False``);
* the per-replica precise prefix matches (``match``: prefix copies, overflow share, the per-request
  ``match``), and per-request outputs.

Same runs, same stamps, same lazy threshold and eviction pointer as :mod:`cacheresearch.cache.store`,
same integer formulas as :mod:`cacheresearch.replica.fcfs`, so the metrics are the engine's, field by
field and request by request (``tests/test_replay.py``). What it does not cover (the vllm replica,
cache- or load-reading routers, the priority and S3-FIFO policies, ``kv_pressure``, a replica
restart) :func:`coverage` names; the runner (:mod:`cacheresearch.core.run`, ``backend=``) sends
those configurations to the JAX engine, or refuses them under ``backend="numba"``.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from cacheresearch.backends.capabilities import REPLAY_POLICIES
from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.stream import Stream, compile_stream
from cacheresearch.metrics.core import LIMB, Metrics
from cacheresearch.routers import REGISTRY, ROUTERS
from cacheresearch.routers.fixed import first_bits, fixed_routes, prefix_keys
from cacheresearch.workload import Workload

__all__ = ["ReplayMetrics", "replay_grid", "REPLAY_POLICIES", "coverage", "available", "run_stream"]

_LIM = 2**31 - 1


def available() -> bool:
    """numba importable (the backend's only requirement)."""
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def coverage(params: list, st) -> list[str]:
    """What this backend does not model among configurations ``params`` (a list of
    :class:`~cacheresearch.core.params.Params`) under the static options ``st``; empty: covered.
    The static bounds themselves are :func:`cacheresearch.core.simulate.check_bounds`, shared with
    the JAX engine (the runner checks them for every program)."""
    out = []
    if st.scheduler != "fcfs":
        out.append(f"the {st.scheduler} replica")
    pol_names = {v.id: k for k, v in POLICIES.items()}
    pols = sorted({pol_names[int(p.policy)] for p in params} - set(REPLAY_POLICIES))
    if pols:
        out.append(f"policies {pols}")
    rnames = {r.id: r.name for r in REGISTRY.routers()}  # a plug-in's too
    rts = sorted({rnames[int(p.router)] for p in params} - set(REGISTRY.load_free()))
    if rts:
        out.append(f"routers {rts} (they read load or cache state)")
    if any(bool(p.kv_pressure) for p in params):
        out.append("kv_pressure")
    if any(int(p.restart_replica) >= 0 for p in params):
        out.append("a replica restart (restart_replica)")
    if st.index or st.stale or st.priority or st.s3:
        out.append("approximate / stale view state, priority or s3fifo fields")
    return out


class ReplayMetrics(NamedTuple):
    """The engine's hit and occupancy metrics (:class:`cacheresearch.metrics.core.Metrics` fields
    of the same names), per configuration [G]."""

    token_hit_rate: np.ndarray  # float64 [G]
    hit_tokens: np.ndarray  # int64 [G] (the engine's combine_limbs(hit_tokens_hi, hit_tokens_lo))
    requests_hit: np.ndarray  # int64 [G]
    max_occupancy: np.ndarray  # int32 [G, R_max]
    occupancy: np.ndarray  # int32 [G, R_max]
    requests_per_replica: np.ndarray  # int32 [G, R_max]
    hit_blocks: np.ndarray  # int32 [G, N]
    replica: np.ndarray  # int32 [G, N]


# the kernel's parts, module-level so that cache=True finds them again in a new process (a closure's
# compiled code is keyed on its captured dispatchers and was compiled afresh by every process)
_JIT = numba.njit(cache=True, inline="always")


@_JIT
def leading(stamp, tim, thr, log0, e0, p, K, now, T, lf):
    """The leading-run match of entries e0..e0+p-1 on one row (cacheresearch.core.views.leading)."""
    hit = 0
    for q in range(p):
        run, m = log0[e0 + q, 0], log0[e0 + q, 1]
        sl = 0
        t_old = 0
        if run < K:
            s = stamp[run]
            t_old = tim[run]
            if s >= 0:
                sl = min(max(s + m - thr, 0), m)
        live = now - t_old <= T
        if sl == m and live:
            hit += m
        else:
            if live and lf:
                hit += sl
            break
    return hit

@_JIT
def evict(stamp, lr, lm, lb, cnt, pq, poff, thr, occ, r, C, K):
    """Lazy-pointer LRU down to C blocks, then the new threshold (cacheresearch.cache.store.evict)."""
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

@_JIT
def ms_of(units, per, scale):
    """cacheresearch.replica.fcfs.ms_of: ceil(units * scale / per), saturating; (value, saturated)."""
    q, rem = units // per, units % per
    big = q > (_LIM - scale) // max(scale, 1)
    head = _LIM - scale if big else q * scale
    return head + (rem * scale + per - 1) // per, big

@_JIT
def sat_add(a, b):
    if a > _LIM - b:
        return _LIM, True
    return a + b, False


@numba.njit(parallel=True, cache=True)
def _run(arrival, nb, inp, outp, off, nruns, e0, log0, K, bt, rep, cap, ttl, leaf, refresh, pb, nrep,
        ptps, dus, R, Q, queue, match, per_req):
    G, N = rep.shape
    E = log0.shape[0]
    hit_blocks = np.zeros((G, N), np.int32)
    ttft_out = np.zeros((G, N), np.int32)
    mreq = np.zeros((G, N if per_req else 0, R), np.int32)
    ints = np.zeros((G, 8), np.int64)  # hit tokens, requests hit, qover, tover, copies, copies_n, over_n, over_q
    per_r = np.zeros((G, 5, R), np.int64)  # occupancy, max occupancy, requests, busy, busy_ms
    for g in numba.prange(G):
        stamp = np.full((R, K), -1, np.int64)
        tim = np.zeros((R, K), np.int64)
        lr, lm, lb = np.zeros((R, E), np.int64), np.zeros((R, E), np.int64), np.zeros((R, E), np.int64)
        cnt, pq, poff = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
        thr, occ = np.zeros(R, np.int64), np.zeros(R, np.int64)
        fin = np.zeros((R, Q), np.int64)
        head = np.zeros(R, np.int64)
        busy = np.zeros(R, np.int64)
        bms = np.zeros(R, np.int64)
        mt = np.zeros(R, np.int64)
        C, T, lf, rf, nr = cap[g], ttl[g], leaf[g], refresh[g], nrep[g]
        for i in range(N):
            r = rep[g, i]
            now = arrival[i]
            n = nb[i]
            p = nruns[i]
            # ---- probe: every active replica's precise match (copies, overflow share)
            mbest = 0
            if match:
                for x in range(nr):
                    mt[x] = leading(stamp[x], tim[x], thr[x], log0, e0[i], p, K, now, T, lf)
                    mbest = max(mbest, mt[x])
                if per_req:
                    for x in range(nr):
                        mreq[g, i, x] = mt[x]
            pbi = min(pb[g], n)
            if n > 0:
                c = 0
                for x in range(nr):
                    if (mt[x] if match else 0) >= pbi:
                        c += 1
                ints[g, 4] += c
                ints[g, 5] += 1
            if match and mbest > 0:
                ints[g, 7] += 1
                if mt[r] < mbest:
                    ints[g, 6] += 1
            # ---- lookup on the chosen replica, then restamp and log the request's runs
            hit = leading(stamp[r], tim[r], thr[r], log0, e0[i], p, K, now, T, lf)
            new = 0
            for q in range(p):
                e = e0[i] + q
                run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
                sl = 0
                t_old = 0
                if run < K:
                    s = stamp[r, run]
                    t_old = tim[r, run]
                    if s >= 0:
                        sl = min(max(s + m - thr[r], 0), m)
                new += m - sl
                if run < K:
                    stamp[r, run] = (off[i] + n - (bp - off[i]) - m) if lf else bp
                    if rf or not (sl > 0 and now - t_old <= T):
                        tim[r, run] = now
            for k in range(p):  # the request's entries, base stamps ascending (leaf-first: last run first)
                e = e0[i] + ((p - 1 - k) if lf else k)
                run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
                c = cnt[r]
                lr[r, c] = run
                lm[r, c] = m
                lb[r, c] = (off[i] + n - (bp - off[i]) - m) if lf else bp
                cnt[r] = c + 1
            occ[r] += new
            evict(stamp, lr, lm, lb, cnt, pq, poff, thr, occ, r, C, K)
            if occ[r] > per_r[g, 1, r]:
                per_r[g, 1, r] = occ[r]
            per_r[g, 2, r] += 1
            hit_blocks[g, i] = hit
            ht = inp[i] if hit > inp[i] // bt else hit * bt
            ints[g, 0] += ht
            if hit > 0:
                ints[g, 1] += 1
            # ---- the fcfs queue (cacheresearch.replica.fcfs.dispatch)
            if queue:
                pre, o1 = ms_of(inp[i] - ht, ptps[g], 1000)
                dec, o2 = ms_of(outp[i], 1000, dus[g])
                start = max(now, busy[r])
                svc, o3 = sat_add(pre, dec)
                f, o4 = sat_add(start, svc)
                tt, o5 = sat_add(start - now, pre)
                b2, o6 = sat_add(bms[r], svc)
                if fin[r, head[r]] > now:
                    ints[g, 2] += 1
                fin[r, head[r]] = f
                head[r] = (head[r] + 1) % Q
                busy[r] = f
                bms[r] = b2
                if o1 or o2 or o3 or o4 or o5 or o6:
                    ints[g, 3] = 1
                ttft_out[g, i] = tt
        for x in range(R):
            per_r[g, 0, x] = occ[x]
            per_r[g, 3, x] = busy[x]
            per_r[g, 4, x] = bms[x]
    return hit_blocks, ttft_out, mreq, ints, per_r


def _kernel():
    """The compiled kernel (module-level functions: numba's on-disk cache serves every later process)."""
    return _run


def _limbs(total) -> tuple[np.ndarray, np.ndarray]:
    """Exact int64 totals as the engine's two int32 limbs (``lo < 2**20``; metrics.core.combine_limbs)."""
    t = np.asarray(total, np.int64)
    return (t >> LIMB).astype(np.int32), (t & ((1 << LIMB) - 1)).astype(np.int32)


def _routes(stream: Stream, P: dict, keys: list, n: int) -> np.ndarray:
    """The fixed replica of every request of every configuration [G, n] (one call per routing group of
    several replicas: on one replica every rule routes to it; ``random``'s draws for every configuration
    in one call)."""
    G = P["router"].shape[0]
    rnames = {v: k for k, v in ROUTERS.items()}
    rep = np.zeros((G, n), np.int64)
    groups: dict[tuple, list[int]] = {}
    for g in range(G):
        groups.setdefault((rnames[int(P["router"][g])], int(P["replicas"][g]), int(P["prefix_blocks"][g])),
                          []).append(g)
    off = np.asarray(stream.offset)[:n]
    nb = np.asarray(stream.n_blocks)[:n]
    bits = None
    for (router, R, pb), gs in groups.items():
        if R == 1:  # a rule's replica is in [0, R): 0
            continue
        hi, lo = prefix_keys(off, nb, np.asarray(stream.key_hi), np.asarray(stream.key_lo), pb)
        if router == "random" and bits is None:
            bits = first_bits(keys, n)
        rep[gs] = fixed_routes(router, R, n, prefix_hi=hi, prefix_lo=lo,
                               bits0=bits[np.asarray(gs)] if router == "random" else None)
    return rep


def _run_kernel(stream: Stream, P: dict, keys: list, st):
    """The kernel's raw outputs for configurations ``P`` (fields [G]) over one unpadded stream."""
    n = int(stream.n_requests)
    host = {k: np.asarray(getattr(stream, k)).astype(np.int64) for k in
            ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs", "entry0")}
    rep = _routes(stream, P, keys, n)
    i64 = {f: P[f].astype(np.int64) for f in ("capacity", "ttl_ms", "prefix_blocks", "prefill_tps",
                                             "decode_us_per_token")}
    nrep = np.clip(P["replicas"].astype(np.int64), 1, st.max_replicas)
    out = _kernel()(host["arrival_ms"], host["n_blocks"], host["input_tokens"], host["output_tokens"],
                    host["offset"], host["n_runs"], host["entry0"], np.asarray(stream.log[0]).astype(np.int64),
                    int(stream.n_keys), int(stream.block_tokens), rep, i64["capacity"], i64["ttl_ms"],
                    P["leaf_first"].astype(np.bool_), P["refresh"].astype(np.bool_), i64["prefix_blocks"], nrep,
                    i64["prefill_tps"], i64["decode_us_per_token"], int(st.max_replicas), int(st.queue_slots),
                    bool(st.queue), bool(st.match), bool(st.per_request))
    return rep, nrep, out


def _fields(params) -> dict:
    """{field: [G] NumPy array} of a list of configurations (or of a stacked grid)."""
    if isinstance(params, (list, tuple)):
        return {f: np.asarray([getattr(p, f) for p in params]).reshape(-1) for f in params[0]._fields}
    return {f: np.asarray(getattr(params, f)).reshape(-1) for f in params._fields}


def run_stream(stream: Stream, params: list, keys: list, st, *, n_out: int | None = None) -> Metrics:
    """Configurations ``params`` (PRNG ``keys``) over one unpadded stream under the static options
    ``st``: the JAX program's unfinalized :class:`Metrics` (ratio fields NaN; pass them to
    :func:`~cacheresearch.metrics.core.finalize`), leading axis [G]. Per-request arrays have
    ``n_out`` entries (default: the stream's requests; entries past them are 0)."""
    P = _fields(params)
    rep, nrep, out = _run_kernel(stream, P, keys, st)
    return assemble(stream, P, st, rep, nrep, out, n_out)


def assemble(stream: Stream, P: dict, st, rep, nrep, out, n_out: int | None = None) -> Metrics:
    """:func:`run_stream`'s Metrics from a kernel's outputs (this backend's and
    :mod:`cacheresearch.backends.numba_blocks`'): replicas ``rep`` [G, N], active replicas ``nrep`` [G],
    ``out`` = (hit blocks [G, N], TTFT [G, N], per-request view matches [G, N, R], totals [G, 8],
    per-replica [G, 5, R])."""
    hb, ttft, mreq, ints, per_r = out
    G = P["policy"].shape[0]
    R = st.max_replicas
    n = int(stream.n_requests)
    inp = np.asarray(stream.input_tokens)[:n].astype(np.int64)
    arr = np.asarray(stream.arrival_ms)[:n].astype(np.int64)
    bt = int(stream.block_tokens)
    nan32 = np.full(G, np.nan, np.float32)
    if st.queue:
        def rank(p):  # the nearest rank (metrics.core.percentile's rule)
            return min(max((p * n + 99) // 100 - 1, 0), max(n - 1, 0))

        # only the three ranks are needed: a partition places each exactly, without sorting the rest
        srt = np.partition(ttft, sorted({rank(50), rank(90), rank(99)}), axis=1) if n > 0 else ttft

        def pct(p):
            return srt[:, rank(p)].astype(np.int32) if n > 0 else np.zeros(G, np.int32)
    else:
        def pct(p):
            return np.full(G, -1, np.int32)
    busy = per_r[:, 3]
    horizon = (np.maximum(np.maximum(busy.max(axis=1), arr[n - 1] if n else 0) - (arr[0] if n else 0), 1)
               if n else np.ones(G, np.int64))
    no = n if n_out is None else int(n_out)

    def per_req(a, fill=0):
        if not st.per_request:
            return np.zeros((G, 0) + a.shape[2:], np.int32)
        if no == n:  # no padding: the kernel's own array (fresh per call), as int32
            return np.asarray(a).astype(np.int32, copy=False)
        out = np.full((G, no) + a.shape[2:], fill, np.int32)
        out[:, :n] = a
        return out

    hit_tok = np.where(hb > (inp // bt)[None, :], inp[None, :], hb.astype(np.int64) * bt)
    z, zf = np.zeros(G, np.int32), np.zeros((G, R), np.float32)
    th, tl = _limbs(ints[:, 0])
    ih, il = _limbs(np.full(G, inp.sum()))
    sh, sl = _limbs(ttft.astype(np.int64).sum(axis=1))
    empty = np.zeros((G, 0), np.int32)
    return Metrics(
        token_hit_rate=nan32, request_hit_rate=nan32, hit_tokens_hi=th, hit_tokens_lo=tl,
        requests_hit=ints[:, 1].astype(np.int32), max_occupancy=per_r[:, 1].astype(np.int32),
        occupancy=per_r[:, 0].astype(np.int32), requests_per_replica=per_r[:, 2].astype(np.int32),
        ttft_p50_ms=pct(50), ttft_p90_ms=pct(90), ttft_p99_ms=pct(99), ttft_mean_ms=nan32,
        busy_ms=per_r[:, 4].astype(np.int32), utilisation=np.full((G, R), np.nan, np.float32),
        load_imbalance=nan32, prefix_copies=nan32, overflow_share=nan32,
        queue_overflow=ints[:, 2].astype(np.int32), time_overflow=ints[:, 3].astype(np.bool_),
        hit_blocks=per_req(hb), hit_tokens=per_req(hit_tok), replica=per_req(rep), ttft_ms=per_req(ttft),
        match=per_req(mreq) if st.match else np.zeros((G, no if st.per_request else 0, R), np.int32),
        replicas_over_bound=(P["replicas"] > R) | (P["replicas"] < 1),
        tpot_mean_ms=nan32, e2e_p50_ms=z - 1, e2e_p90_ms=z - 1, e2e_p99_ms=z - 1, preemptions=z,
        kv_util_mean=nan32, kv_util_max=nan32, queue_len_mean=nan32, throughput_tps=nan32, dropped=z, steps=z, events=z,
        e2e_ms=empty, preempted=empty, client_wait_ms=empty, kv_acc_at=empty.astype(np.float32),
        q_acc_at=empty.astype(np.float32),
        n_requests=np.full(G, n, np.int32), input_tokens_hi=ih, input_tokens_lo=il, ttft_sum_hi=sh, ttft_sum_lo=sl,
        ttft_n=np.full(G, n, np.int32), busy_time=per_r[:, 4].astype(np.int32), horizon_time=horizon.astype(np.int32),
        replicas_active=nrep.astype(np.int32), copies_sum=ints[:, 4].astype(np.int32),
        copies_n=ints[:, 5].astype(np.int32), over_n=ints[:, 6].astype(np.int32), over_q=ints[:, 7].astype(np.int32),
        tpot_ms_hi=z, tpot_ms_lo=z, tpot_ns_hi=z, tpot_ns_lo=z, tpot_n=z, output_tokens_hi=z,
        output_tokens_lo=z, kv_capacity=P["capacity"].astype(np.int32), kv_acc=zf, q_acc=zf.copy(),
        requests_ok=np.full(G, n, np.int32), requests_timed_out=z, requests_failed=z, status=empty,
        vllm_counters_hi=np.zeros((G, 4), np.int32), vllm_counters_lo=np.zeros((G, 4), np.int32),
    )


def replay_grid(workload: Workload, params, keys, *, max_replicas: int = 1, stream=None) -> ReplayMetrics:
    """Hit rates and occupancy of configurations ``params`` (a list of
    :class:`~cacheresearch.core.params.Params`, or stacked fields [G]) over ``workload``, no queue
    model; ``keys`` [G] PRNG keys (the ``random`` router's draws). The results equal the JAX engine's
    on the same stream (:func:`compile_stream` of the workload; pass it as ``stream`` to keep that host
    work out of a timed call). Configurations outside :func:`coverage` are refused (use the JAX engine)."""
    from cacheresearch.core.params import Params  # noqa: PLC0415
    from cacheresearch.core.simulate import check_bounds, static_options  # noqa: PLC0415

    P = _fields(params)
    plist = [Params(**{f: P[f][g] for f in P}) for g in range(P["policy"].shape[0])]
    grid = Params(**P)
    st = static_options(grid, max_replicas=max_replicas, queue=False, match=False, per_request=True)
    missing = coverage(plist, st)
    if missing:
        raise ValueError(f"the numba backend does not model {'; '.join(missing)}: use the JAX engine "
                         "(simulate, simulate_grid)")
    if np.any(P["replicas"] > max_replicas) or np.any(P["replicas"] < 1):
        raise ValueError(f"replicas outside [1, max_replicas={max_replicas}]")
    check_bounds(grid, max_replicas)
    s = compile_stream(workload) if stream is None else stream
    N = workload.n_requests
    if int(s.n_requests) != N or s.arrival_ms.shape[-1] != N + 1:
        raise ValueError("stream must be compile_stream(workload), unpadded")
    keys = list(keys) if not hasattr(keys, "shape") or keys.shape else [keys]
    m = run_stream(s, plist, keys, st)
    ht = (m.hit_tokens_hi.astype(np.int64) << LIMB) + m.hit_tokens_lo
    total = float(workload.input_tokens.sum())
    rate = ht / total if total > 0 else np.zeros(len(plist))
    return ReplayMetrics(rate, ht, m.requests_hit.astype(np.int64), m.occupancy, m.max_occupancy,
                         m.requests_per_replica, m.hit_blocks, m.replica)

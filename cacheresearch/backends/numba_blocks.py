"""The numba CPU backend of libCacheSim's per-block policies (every registered one: ``fifo``, ``sieve``, ``s3fifo``,
``lfu``, ``arc``, ...) on the fcfs replica, with every router and view the engine routes by.

The JAX engine runs these policies in its scan (:mod:`cacheresearch.cache.blocks`): every block a loop
iteration of a traced program, which on a CPU costs microseconds per block. This backend runs the same
fleet as compiled loops, one configuration per thread (``prange``), per request in arrival order
(``docs/fleet_semantics.md``; ``tests/reference_fleet.py``):

1. the stale view's sync (a copy of every replica's block lists when ``now - last sync >= stale_lag_ms``);
2. the loads from the fcfs ring of the last ``queue_slots`` dispatches (``local_load``: instance ``u``'s);
3. every replica's precise match (leading blocks stored: :func:`~cacheresearch.cache.kernels.lists.lead`),
   the router's view (precise, stale, or the approximate index of ``(instance, replica)``: a leaf-first
   LRU over the runs the router sent, the run-compressed store of :mod:`cacheresearch.backends.numba_cache`),
   the tree sizes (blocks stored; the approximate view: the index's);
4. the route (the router's numba rule in its file of :mod:`cacheresearch.routers`, through the dispatch
   generated from the router registry, :mod:`cacheresearch.routers.dispatch`; a router's state kept per run);
5. one ``get`` per block, leaf-first, in the chosen replica's policy (its kernel file in
   :mod:`cacheresearch.cache.kernels`, through the dispatch generated from the registry; equal to libCacheSim
   access for access);
6. the fcfs dispatch (:mod:`cacheresearch.replica.fcfs`'s integer formulas).

The outputs are :mod:`cacheresearch.backends.numba_cache`'s, so the metrics are assembled by the same code
and equal the JAX engine's field by field (``tests/test_numba_blocks.py``). Not covered (:func:`coverage`):
the vllm replica (its pool frees blocks in vLLM's order), ``kv_cost`` sampling at a temperature (float32
softmax: JAX), the ``gie_estimate`` view, ``kv_pressure`` and a replica restart (the oracles hold a fixed
capacity).
"""

from __future__ import annotations

import sys

import numba
import numpy as np

from cacheresearch.backends import numba_cache as nc
from cacheresearch.backends import numba_vllm as nv
from cacheresearch.cache.kernels import dispatch
from cacheresearch.cache.kernels.lists import clear, lead, rows
from cacheresearch.cache.policies import POLICIES, block_policies
from cacheresearch.core.stream import Stream
from cacheresearch.metrics.core import Metrics
from cacheresearch.routers import VIEWS, ring_positions
from cacheresearch.routers import dispatch as rdispatch

__all__ = ["coverage", "run_stream", "state_bytes"]

NS = 16  # a row's scalars (cacheresearch.cache.kernels)
D = None  # the dispatch on a policy code (cacheresearch.cache.kernels.dispatch)
RD = None  # the dispatch on a router code (cacheresearch.routers.dispatch.bind binds both)
_T_BIG = 2**62
_JIT = numba.njit(cache=True)


def coverage(params: list, st) -> list[str]:
    """What this backend does not model among configurations ``params`` under the static options ``st``."""
    out = []
    if st.scheduler != "fcfs":
        out.append(f"the {st.scheduler} replica with a per-block policy")
    pol_names = {v.id: k for k, v in POLICIES.items()}
    pols = sorted({pol_names[int(p.policy)] for p in params} - set(block_policies()))
    if pols:
        out.append(f"policies {pols} (not per-block policies)")
    rnames = rdispatch.names()
    out += rdispatch.refusals(rnames[int(p.router)] for p in params)
    out += sorted({w for p in params for w in rdispatch.config_refusals(rnames[int(p.router)], p)})
    if any(int(p.view) == VIEWS["gie_estimate"] for p in params):
        out.append("the gie_estimate view")
    if any(bool(p.kv_pressure) for p in params):
        out.append("kv_pressure")
    if any(int(p.restart_replica) >= 0 for p in params):
        out.append("a replica restart (restart_replica)")
    if st.priority or st.s3:
        out.append("priority or s3fifo_sosp fields")
    return out


def state_bytes(stream: Stream, st) -> int:
    """One thread's state: the block lists ``[R, U]`` (where, older, newer, the per-block extra, and the stale
    copy), the lfu buckets, the approximate index rows and the fcfs ring."""
    U = max(int(stream.n_distinct), 1)
    R = st.max_replicas
    K, E = int(stream.n_keys), int(stream.log.shape[-2])
    rows = st.max_instances * R if st.index else 0
    return (R * U * 4 * (4 + (1 if st.stale else 0)) + R * (3 * max(st.block_q, 2) + U) * 4
            + rows * (2 * K + 3 * E) * 8 + R * st.queue_slots * 3 * 8)


# ------------------------------------------------------------------------------ the kernel
@_JIT
def _learn(row, rq, i, log0, K, ist, lr, lm, lb, cnt, pq, poff, thr, iocc, icap):
    """The approximate index of row ``(u, r)`` learns request ``i``: its runs restamped leaf-first, logged
    tail first, then the lazy-pointer LRU down to ``icap`` blocks (cacheresearch.cache.store's rules)."""
    off, n, p, e0 = rq[i, nv.QOFF], rq[i, nv.QNB], rq[i, nv.QNR], rq[i, nv.QE0]
    new = 0
    for q in range(p):
        run, m, bp = log0[e0 + q, 0], log0[e0 + q, 1], log0[e0 + q, 2]
        sl = 0
        if run < K:
            s = ist[row, run]
            if s >= 0:
                sl = min(max(s + m - thr[row], 0), m)
            ist[row, run] = off + n - (bp - off) - m
        new += m - sl
    for k in range(p):
        e = e0 + p - 1 - k
        run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
        c = cnt[row]
        lr[row, c], lm[row, c], lb[row, c] = run, m, off + n - (bp - off) - m
        cnt[row] = c + 1
    iocc[row] += new
    nc.evict(ist, lr, lm, lb, cnt, pq, poff, thr, iocc, row, icap, K)


@_JIT
def _views(i, u, nrep, R, pi, rq, log0, K, ids, top, where, snap, sync, stale, index, ist, itim, ithr, code, st,
           iocc, mt, mv, tree):
    """Every replica's precise match ``mt``, the router's view ``mv`` and the tree sizes."""
    now, a, n = rq[i, nv.QARR], rq[i, nv.QOFF], rq[i, nv.QNB]
    if stale and pi[nv.VIEW] == 2 and (sync[1] == 0 or now - sync[0] >= pi[nv.LAG]):
        snap[:nrep] = where[:nrep]  # the router's copy of every replica's lists
        sync[0], sync[1] = now, 1
    for r in range(nrep):
        mt[r] = lead(where[r], ids, a, n, top)
        mv[r] = mt[r]
        tree[r] = D.occ(code, st[r])
        if stale and pi[nv.VIEW] == 2:
            mv[r] = lead(snap[r], ids, a, n, top)
        if index and pi[nv.VIEW] == 1:
            row = u * R + r
            mv[r] = nc.leading(ist[row], itim, ithr[row], log0, rq[i, nv.QE0], rq[i, nv.QNR], K, now, _T_BIG, True)
            tree[r] = iocc[row]


@_JIT
def _dispatch(r, i, u, now, inp, ht, rq, ptps, dus, Q, fin, fblk, fins, head, busy, bms, ints):
    """The fcfs queue (cacheresearch.replica.fcfs.dispatch): TTFT of request ``i`` on ``r``."""
    pre, o1 = nc.ms_of(inp - ht, ptps, 1000)
    dec, o2 = nc.ms_of(rq[i, nv.QOUT], 1000, dus)
    start = max(now, busy[r])
    svc, o3 = nc.sat_add(pre, dec)
    f, o4 = nc.sat_add(start, svc)
    tt, o5 = nc.sat_add(start - now, pre)
    b2, o6 = nc.sat_add(bms[r], svc)
    h = head[r]
    if fin[r, h] > now:
        ints[2] += 1
    fin[r, h], fblk[r, h], fins[r, h] = f, rq[i, nv.QNB], u
    head[r] = (h + 1) % Q
    busy[r] = f
    bms[r] = b2
    if o1 or o2 or o3 or o4 or o5 or o6:
        ints[3] = 1
    return tt


@_JIT
def _one(g, code, rq, log0, K, ids, U, L, bt, pkey, bits, ring, pi, rk, C, cs, cg, th, ptps, dus, R, Q, NI, queue,
         match, stale, index, per_req, hit_blocks, ttft_out, mreq, rep_out, ints, per_r, where, older, newer, aux,
         snap):
    """One configuration: the fleet over the stream, request by request, on the thread's block lists (empty:
    :func:`~cacheresearch.cache.kernels.lists.rows`; then :func:`~cacheresearch.cache.kernels.lists.clear`)."""
    N = rq.shape[0]
    E = log0.shape[0]
    Lb = L if D.BUCKETS[code] else 1
    bh, bt_, bc = np.full((R, Lb), -1, np.int32), np.full((R, Lb), -1, np.int32), np.zeros((R, Lb), np.int32)
    st = np.zeros((R, NS), np.int64)
    for x in range(R):
        D.init(code, st[x])
    pr = np.zeros((R, 1), np.float64)
    top = D.top(code)
    sync = np.zeros(2, np.int64)
    rows = NI * R if index else 1
    ist = np.full((rows, K if index else 1), -1, np.int64)
    itim = np.zeros(K if index else 1, np.int64)  # the index has no expiry
    Ei = E if index else 1
    lr, lm, lb = np.zeros((rows, Ei), np.int64), np.zeros((rows, Ei), np.int64), np.zeros((rows, Ei), np.int64)
    cnt, pq, poff = np.zeros(rows, np.int64), np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    ithr, iocc = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    fin, fblk, fins = np.zeros((R, Q), np.int64), np.zeros((R, Q), np.int64), np.zeros((R, Q), np.int64)
    head, busy, bms = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
    mt, mv, q, a_ = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
    tree, tmpv = np.zeros(R, np.int64), np.zeros(R, np.int64)
    elig = np.zeros(R, np.bool_)
    sr, sg = np.zeros((R, RD.NSR), np.int64), np.zeros(RD.NSG, np.int64)  # the router's state
    nrep = min(max(pi[nv.NREP], 1), R)
    ninst = min(max(pi[nv.NINST], 1), NI)
    local = pi[nv.LOCAL] != 0
    rcode = pi[nv.ROUTER]
    for i in range(N):
        u = i % ninst
        now, a, n, inp = rq[i, nv.QARR], rq[i, nv.QOFF], rq[i, nv.QNB], rq[i, nv.QIN]
        if match:
            _views(i, u, nrep, R, pi, rq, log0, K, ids, top, where, snap, sync, stale, index, ist, itim, ithr, code,
                   st, iocc, mt, mv, tree)
        else:
            for x in range(nrep):
                tree[x] = D.occ(code, st[x])
        for x in range(R):
            q[x], a_[x] = 0, 0
            if queue:
                for k in range(Q):
                    if fin[x, k] > now and (not local or fins[x, k] == u):
                        q[x] += 1
                        a_[x] += fblk[x, k]
        pb = min(pi[nv.PB], n)
        kpos = a + max(pb - 1, 0)
        r = RD.route(rcode, i, n, pkey[kpos, 0] if n > 0 else 0, pkey[kpos, 1] if n > 0 else 0, bits[g, i], nrep,
                     q, mv, a_, tree, a_, q, -1, C, rk, ring, elig, tmpv, sr, sg)
        mbest, cp = 0, 0
        for x in range(nrep):
            mbest = max(mbest, mt[x])
            cp += 1 if mt[x] >= pb else 0
        if n > 0:
            ints[g, 4] += cp
            ints[g, 5] += 1
        if match and mbest > 0:
            ints[g, 7] += 1
            ints[g, 6] += 1 if mt[r] < mbest else 0
        if per_req:
            for x in range(nrep):
                mreq[g, i, x] = mv[x]
        h = lead(where[r], ids, a, n, top)
        D.gets(code, older[r], newer[r], where[r], aux[r], st[r], pr[r], bh[r], bt_[r], bc[r], ids, a, a + n, C, cs, cg,
               th)
        o = D.occ(code, st[r])
        per_r[g, 1, r] = max(per_r[g, 1, r], o)
        per_r[g, 2, r] += 1
        hit_blocks[g, i] = h
        rep_out[g, i] = r
        ht = inp if h > inp // bt else h * bt
        ints[g, 0] += ht
        ints[g, 1] += 1 if h > 0 else 0
        if index:
            _learn(u * R + r, rq, i, log0, K, ist, lr, lm, lb, cnt, pq, poff, ithr, iocc, pi[nv.ICAP])
        if queue:
            ttft_out[g, i] = _dispatch(r, i, u, now, inp, ht, rq, ptps, dus, Q, fin, fblk, fins, head,
                                       busy, bms, ints[g])
    for x in range(R):
        per_r[g, 0, x] = D.occ(code, st[x])
        per_r[g, 3, x] = busy[x]
        per_r[g, 4, x] = bms[x]


@numba.njit(parallel=True, cache=True)
def _kernel(code, rq, log0, K, ids, U, L, bt, pkey, bits, ring, pi, rk, cap, cS, cG, thr, ptps, dus, R, Q, NI, queue,
            match, stale, index, per_req, T):
    G, N = pi.shape[0], rq.shape[0]
    hit_blocks = np.zeros((G, N), np.int32)
    ttft_out = np.zeros((G, N), np.int32)
    mreq = np.zeros((G, N if per_req else 0, R), np.int32)
    rep = np.zeros((G, N), np.int64)
    ints = np.zeros((G, 8), np.int64)  # hit tokens, requests hit, qover, tover, copies, copies_n, over_n, over_q
    per_r = np.zeros((G, 5, R), np.int64)  # occupancy, max occupancy, requests, busy, busy_ms
    T = max(min(T, G), 1)
    for t in numba.prange(T):  # a thread's lists serve its configurations t, t + T, ...
        older, newer, where, aux = rows(R, U)
        snap = np.zeros((R if stale else 1, U if stale else 1), np.int32)
        for g in range(t, G, T):
            _one(np.int64(g), code[g], rq, log0, K, ids, U, L, bt, pkey, bits, ring, pi[g], rk[g], cap[g], cS[g],
                 cG[g], thr[g], ptps[g], dus[g], R, Q, NI, queue, match, stale, index, per_req, hit_blocks, ttft_out,
                 mreq, rep, ints, per_r, where, older, newer, aux, snap)
            clear(rep[g], rq[:, nv.QOFF], rq[:, nv.QNB], ids, older, newer, where, aux)
            snap[:] = 0
    return rep, hit_blocks, ttft_out, mreq, ints, per_r


# ------------------------------------------------------------------------------ the host side
def run_stream(stream: Stream, params: list, keys: list, st, *, n_out: int | None = None) -> Metrics:
    """Configurations ``params`` (PRNG ``keys``) over one unpadded stream with block ids under the static options
    ``st``: the JAX program's unfinalized :class:`Metrics` (:func:`cacheresearch.backends.numba_cache.run_stream`'s
    contract)."""
    from cacheresearch.core.simulate import request_bits  # noqa: PLC0415

    P = nc._fields(params)
    G = P["policy"].shape[0]
    missing = coverage([type("P", (), {f: P[f][g] for f in P})() for g in range(G)], st)
    if missing:
        raise ValueError(f"the numba per-block backend does not model {'; '.join(missing)}")
    if not stream.n_distinct:
        raise ValueError("the per-block policies need the stream's block ids (compile_stream(..., block_ids=True))")
    n = int(stream.n_requests)
    host = {k: np.asarray(getattr(stream, k))[:n].astype(np.int64) for k in
            ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs", "entry0")}
    rq = np.stack([host[k] for k in ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs",
                                     "entry0")], axis=1)
    log0 = np.ascontiguousarray(np.asarray(stream.log[0]).astype(np.int64))
    ids = np.ascontiguousarray(np.asarray(stream.block_id).astype(np.int32))
    pkey = np.stack([np.asarray(stream.key_hi), np.asarray(stream.key_lo)], axis=1).astype(np.int64)
    bits = np.stack([np.asarray(request_bits(k, n + 1))[:n] for k in keys]).astype(np.int64)
    R = st.max_replicas
    ring = np.asarray(ring_positions(R, st.max_vnodes)).astype(np.int64)
    RD = rdispatch.bind(sys.modules[__name__])
    names, codes = {v.id: k for k, v in POLICIES.items()}, dispatch.codes()
    code = np.asarray([codes[names[int(x)]] for x in P["policy"]], np.int64)
    i64 = {f: P[f].astype(np.int64) for f in ("capacity", "s3fifo_small", "s3fifo_ghost", "s3fifo_promote",
                                             "prefill_tps", "decode_us_per_token")}
    nrep = np.clip(P["replicas"].astype(np.int64), 1, R)
    rep, hb, ttft, mreq, ints, per_r = _kernel(
        code, rq, log0, int(stream.n_keys), ids, int(stream.n_distinct), max(int(st.block_q), 3),
        int(stream.block_tokens), pkey, bits, ring, nv._config_matrix(P), rdispatch.knob_matrix(P, RD),
        i64["capacity"], i64["s3fifo_small"],
        i64["s3fifo_ghost"], i64["s3fifo_promote"], i64["prefill_tps"], i64["decode_us_per_token"], R,
        int(st.queue_slots), int(st.max_instances), bool(st.queue), bool(st.match), bool(st.stale), bool(st.index),
        bool(st.per_request), numba.get_num_threads())
    return nc.assemble(stream, P, st, rep, nrep, (hb, ttft, mreq, ints, per_r), n_out)



rdispatch.bind(sys.modules[__name__])

"""The autoscaled fcfs fleet as compiled loops: many configurations in one call, in parallel threads.

Semantics: ``docs/autoscale_semantics.md`` (the plain-Python reference is ``tests/reference_autoscale.py``,
block by block). This kernel runs the run-compressed leaf-first LRU of :mod:`cacheresearch.backends.numba_cache`
(same stamps, same lazy eviction pointer: its ``leading`` and ``evict``) per replica slot, FCFS queues
whose finish times are non-decreasing per slot (so the requests in flight are a window of each slot's
dispatch list: exact loads, no ring bound), the scaler's ticks and ready events between arrivals, and
the routers over the active slots. Every configuration is one ``prange`` iteration; nothing is shared.
"""

from __future__ import annotations

import numba
import numpy as np

from cacheresearch.backends.numba_cache import evict, leading

__all__ = ["run_autoscale", "PCOLS", "OFF", "PROV", "ACTIVE", "T_HUGE"]

OFF, PROV, ACTIVE = 0, 1, 2
T_HUGE = 2**62
#: columns of the per-configuration integer parameter table
PCOLS = ("policy", "router", "min_replicas", "max_replicas", "initial_replicas", "delay_ms", "cooldown_ms",
         "interval_ms", "target", "slo_ms", "prewarm_blocks", "capacity", "prefill_tps", "decode_us_per_token",
         "chwbl_c_pct", "balance_abs", "prefix_blocks", "schedule_period_ms", "n_schedule")
_C = {k: i for i, k in enumerate(PCOLS)}
(_POL, _RT, _MIN, _MAX, _INIT, _DELAY, _COOL, _INT, _TGT, _SLO, _PW, _CAP, _TPS, _DUS, _CHW, _BAL, _PB, _SPER,
 _NS) = range(len(PCOLS))
_JIT = numba.njit(cache=True)


def _cdiv(a, b):
    return -(-a // b)


_cdiv = _JIT(_cdiv)


@_JIT
def _flush(r, stamp, cnt, pq, poff, thr, occ):
    stamp[r, :] = -1
    cnt[r] = 0
    pq[r] = 0
    poff[r] = 0
    thr[r] = 0
    occ[r] = 0


@_JIT
def _drain_to(r, t, jf, jb, jlo, jhi, jblk):
    """Slot ``r``'s requests finished by ``t`` leave its in-flight window."""
    while jlo[r] < jhi[r] and jf[r, jlo[r]] <= t:
        jblk[r] -= jb[r, jlo[r]]
        jlo[r] += 1


@_JIT
def _desired(pr, sched, t, state, jf, jb, jlo, jhi, jblk, win_a, win_s):
    pol = pr[_POL]
    R = state.shape[0]
    if pol == 0:
        return sched[(t // pr[_SPER]) % pr[_NS]]
    if pol == 1 or pol == 3:
        qn, bl = 0, 0
        for r in range(R):
            if state[r] == ACTIVE:
                _drain_to(r, t, jf, jb, jlo, jhi, jblk)
                qn += jhi[r] - jlo[r]
                bl += jblk[r]
        if pol == 1:
            return _cdiv(qn, pr[_TGT])
        return _cdiv(bl * 100, max(pr[_CAP], 1) * pr[_TGT])
    if pol == 2:
        return _cdiv(win_s * 100, pr[_INT] * pr[_TGT])
    if win_a == 0:
        return 0
    if win_a * pr[_SLO] <= win_s:
        return pr[_MAX]
    return _cdiv(win_s * win_a * pr[_SLO], pr[_INT] * (win_a * pr[_SLO] - win_s))


@_JIT
def _tick(pr, sched, t, sc, state, ready, born, busy, jf, jb, jlo, jhi, jblk, win_a, win_s, cache):
    """One scaler decision at ``t``; ``sc`` = [last change (-1 none), ups, downs, gpu_ms, prewarmed]."""
    stamp, cnt, pq, poff, thr, occ = cache
    R = state.shape[0]
    want = min(max(_desired(pr, sched, t, state, jf, jb, jlo, jhi, jblk, win_a, win_s), pr[_MIN]), pr[_MAX])
    cur = 0
    for r in range(R):
        if state[r] != OFF:
            cur += 1
    if want == cur or (sc[0] >= 0 and t - sc[0] < pr[_COOL]):
        return
    sc[0] = t
    if want > cur:
        sc[1] += 1
        need = want - cur
        for r in range(R):
            if need > 0 and state[r] == OFF and busy[r] <= t:
                state[r] = PROV
                ready[r] = t + pr[_DELAY]
                born[r] = t
                _flush(r, stamp, cnt, pq, poff, thr, occ)
                jlo[r] = 0
                jhi[r] = 0
                jblk[r] = 0
                need -= 1
        return
    sc[2] += 1
    extra = cur - want
    for s in (PROV, ACTIVE):
        for r in range(R - 1, -1, -1):
            if extra > 0 and state[r] == s:
                sc[3] += (t if s == PROV else max(t, busy[r])) - born[r]
                state[r] = OFF
                _flush(r, stamp, cnt, pq, poff, thr, occ)
                extra -= 1


@_JIT
def _activate(r, pw, state, sc, cache, lr, lm, lb, K):
    """Slot ``r`` joins the active set, prewarmed from the lowest active slot's ``pw`` hottest blocks."""
    stamp, cnt, pq, poff, thr, occ = cache
    sib = -1
    for x in range(state.shape[0]):
        if sib < 0 and state[x] == ACTIVE:
            sib = x
    state[r] = ACTIVE
    if pw <= 0 or sib < 0:
        return
    stamp[r, :] = stamp[sib, :]
    n = cnt[sib] - pq[sib]
    lr[r, :n] = lr[sib, pq[sib]:cnt[sib]]
    lm[r, :n] = lm[sib, pq[sib]:cnt[sib]]
    lb[r, :n] = lb[sib, pq[sib]:cnt[sib]]
    cnt[r] = n
    pq[r] = 0
    poff[r] = poff[sib]
    thr[r] = thr[sib]
    occ[r] = occ[sib]
    evict(stamp, lr, lm, lb, cnt, pq, poff, thr, occ, r, pw, K)
    sc[4] += occ[r]


@_JIT
def _route(pr, now, h, state, q, mt, ring_pos, ring_slot):
    R = state.shape[0]
    rt = pr[_RT]
    ll, nact, tot, qmax, qmin = -1, 0, 0, -1, 2**62
    for r in range(R):
        if state[r] == ACTIVE:
            nact += 1
            tot += q[r]
            qmax = max(qmax, q[r])
            qmin = min(qmin, q[r])
            if ll < 0 or q[r] < q[ll]:
                ll = r
    if rt == 0:
        return ll
    if rt == 4:
        k = h % nact
        for r in range(R):
            if state[r] == ACTIVE:
                if k == 0:
                    return r
                k -= 1
    if rt == 1 or rt == 2:
        cap = _cdiv(pr[_CHW] * (tot + 1), 100 * nact) if rt == 2 else 2**62
        V = ring_pos.shape[0]
        j0 = np.searchsorted(ring_pos, h)
        for j in range(V):
            r = ring_slot[(j0 + j) % V]
            if state[r] == ACTIVE and q[r] < cap:
                return r
        return ll
    if qmax - qmin > pr[_BAL]:
        return ll
    best = -1
    for r in range(R):
        if state[r] == ACTIVE and (best < 0 or mt[r] > mt[best] or (mt[r] == mt[best] and q[r] < q[best])):
            best = r
    return best if mt[best] > 0 else ll


@_JIT
def _store(r, i, stamp, lr, lm, lb, cnt, pq, poff, thr, occ, log0, e0, p, off, n, C, K):
    """Restamp and log request ``i``'s runs on slot ``r`` (leaf-first), then evict down to ``C``."""
    new = 0
    for q in range(p):
        run, m, bp = log0[e0 + q, 0], log0[e0 + q, 1], log0[e0 + q, 2]
        sl = 0
        if run < K:
            s = stamp[r, run]
            if s >= 0:
                sl = min(max(s + m - thr[r], 0), m)
            stamp[r, run] = off + n - (bp - off) - m
        new += m - sl
    for k in range(p):
        e = e0 + p - 1 - k
        run, m, bp = log0[e, 0], log0[e, 1], log0[e, 2]
        c = cnt[r]
        lr[r, c] = run
        lm[r, c] = m
        lb[r, c] = off + n - (bp - off) - m
        cnt[r] = c + 1
    occ[r] += new
    evict(stamp, lr, lm, lb, cnt, pq, poff, thr, occ, r, C, K)


@_JIT
def _one(g, P, SCH, arrival, nb, inp, outp, off, nruns, e0, log0, K, bt, ph, RPOS, RSLOT, out, tl, tot):
    pr, sched, ring_pos, ring_slot = P[g], SCH[g], RPOS[g], RSLOT[g]
    N = arrival.shape[0]
    R = pr[_MAX]
    E = log0.shape[0]
    stamp = np.full((R, max(K, 1)), -1, np.int64)
    tim = np.zeros((R, max(K, 1)), np.int64)
    lr, lm, lb = np.zeros((R, E), np.int64), np.zeros((R, E), np.int64), np.zeros((R, E), np.int64)
    cnt, pq, poff, thr, occ = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), \
        np.zeros(R, np.int64), np.zeros(R, np.int64)
    cache = (stamp, cnt, pq, poff, thr, occ)
    state, ready, born, busy = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), \
        np.zeros(R, np.int64)
    jf, jb = np.zeros((R, N), np.int64), np.zeros((R, N), np.int64)
    jlo, jhi, jblk, q, mt = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), \
        np.zeros(R, np.int64), np.zeros(R, np.int64)
    state[: pr[_INIT]] = ACTIVE
    sc = np.zeros(5, np.int64)
    sc[0] = -1
    k, win_a, win_s = 1, 0, 0
    for i in range(N):
        now = arrival[i]
        while True:  # ready events and ticks up to now, in time order (a ready event first on a tie)
            tt = k * pr[_INT]
            rb = -1
            for r in range(R):
                if state[r] == PROV and ready[r] <= now and (rb < 0 or ready[r] < ready[rb]):
                    rb = r
            if rb >= 0 and ready[rb] <= tt:
                _activate(rb, pr[_PW], state, sc, cache, lr, lm, lb, K)
                continue
            if tt > now:
                break
            _tick(pr, sched, tt, sc, state, ready, born, busy, jf, jb, jlo, jhi, jblk, win_a, win_s, cache)
            if k - 1 < tl.shape[1]:
                for r in range(R):
                    if state[r] == ACTIVE:
                        tl[g, k - 1, 0] += 1
                    elif state[r] == PROV:
                        tl[g, k - 1, 1] += 1
            win_a, win_s = 0, 0
            k += 1
        mbest = 0
        for r in range(R):
            mt[r] = 0
            if state[r] == ACTIVE:
                _drain_to(r, now, jf, jb, jlo, jhi, jblk)
                q[r] = jhi[r] - jlo[r]
                mt[r] = leading(stamp[r], tim[r], thr[r], log0, e0[i], nruns[i], K, now, T_HUGE, True)
                mbest = max(mbest, mt[r])
        r = _route(pr, now, ph[g, i], state, q, mt, ring_pos, ring_slot)
        hit = mt[r]
        _store(r, i, stamp, lr, lm, lb, cnt, pq, poff, thr, occ, log0, e0[i], nruns[i], off[i], nb[i], pr[_CAP], K)
        ht = min(hit * bt, inp[i])
        pre = _cdiv((inp[i] - ht) * 1000, pr[_TPS])
        dec = _cdiv(outp[i] * pr[_DUS], 1000)
        start = max(now, busy[r])
        busy[r] = start + pre + dec
        jf[r, jhi[r]] = busy[r]
        jb[r, jhi[r]] = nb[i]
        jblk[r] += nb[i]
        jhi[r] += 1
        win_a += 1
        win_s += pre + dec
        out[g, 0, i], out[g, 1, i], out[g, 2, i], out[g, 3, i] = r, hit, start - now + pre, mbest
    end = arrival[N - 1] if N else 0
    for r in range(R):
        end = max(end, busy[r])
    for r in range(R):
        if state[r] != OFF:
            sc[3] += end - born[r]
    tot[g, 0], tot[g, 1], tot[g, 2], tot[g, 3], tot[g, 4] = sc[3], sc[1], sc[2], sc[4], end


@numba.njit(parallel=True, cache=True)
def _grid(P, SCH, arrival, nb, inp, outp, off, nruns, e0, log0, K, bt, ph, RPOS, RSLOT, n_ticks):
    G, N = P.shape[0], arrival.shape[0]
    out = np.zeros((G, 4, N), np.int64)
    tl = np.zeros((G, n_ticks, 2), np.int32)
    tot = np.zeros((G, 5), np.int64)
    for g in numba.prange(G):
        _one(g, P, SCH, arrival, nb, inp, outp, off, nruns, e0, log0, K, bt, ph, RPOS, RSLOT, out, tl, tot)
    return out, tl, tot


def run_autoscale(P: np.ndarray, sched: np.ndarray, host: dict, log0: np.ndarray, K: int, bt: int, ph: np.ndarray,
                  ring_pos: np.ndarray, ring_slot: np.ndarray, n_ticks: int):
    """Configurations ``P`` (int64 [G, len(PCOLS)]) over one stream: per request [G, 4, N] (slot, hit
    blocks, TTFT ms, best match over the active slots), the timeline [G, n_ticks, 2] (active,
    provisioning after each tick) and the totals [G, 5] (GPU ms, scale-ups, scale-downs, prewarmed
    blocks, end ms)."""
    return _grid(np.ascontiguousarray(P, np.int64), np.ascontiguousarray(sched, np.int64), host["arrival_ms"],
                 host["n_blocks"], host["input_tokens"], host["output_tokens"], host["offset"], host["n_runs"],
                 host["entry0"], log0, int(K), int(bt), ph, ring_pos, ring_slot, int(n_ticks))

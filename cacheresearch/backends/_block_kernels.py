"""The compiled loops of :mod:`cacheresearch.backends.numba_policies` (module-level, so numba caches them).

``run(code, ...)``: every configuration of one per-block policy (``code``: 0 fifo, 1 sieve, 2 s3fifo,
3 lfu, 4 arc), configurations in parallel threads; the structures are described in
:mod:`cacheresearch.backends.numba_policies`.
"""

from __future__ import annotations

import numba
import numpy as np

FIFO, SIEVE, S3FIFO, LFU, ARC = range(5)


@numba.njit(cache=True, inline="always")
def push(older, newer, head, tail, cnt, where, q, k):  # at the head (newest)
    h = head[q]
    older[k] = h
    newer[k] = -1
    if h >= 0:
        newer[h] = k
    else:
        tail[q] = k
    head[q] = k
    cnt[q] += 1
    where[k] = q


@numba.njit(cache=True, inline="always")
def unlink(older, newer, head, tail, cnt, where, k):
    q = where[k]
    o, n = older[k], newer[k]
    if n >= 0:
        older[n] = o
    else:
        head[q] = o
    if o >= 0:
        newer[o] = n
    else:
        tail[q] = n
    cnt[q] -= 1
    where[k] = 0


@numba.njit(cache=True, inline="always")
def _fifo(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    w = w_[k]
    if w == 1 or C < 1:
        return
    while ct[1] + 1 > C:
        unlink(o_, n_, hd, tl, ct, w_, tl[1])
    push(o_, n_, hd, tl, ct, w_, 1, k)


@numba.njit(cache=True, inline="always")
def _sieve(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    w = w_[k]
    if w == 1:
        f_[k] = 1
        return
    if C < 1:
        return
    while ct[1] + 1 > C:
        o = tl[1] if sc[0] < 0 else sc[0]
        while f_[o] > 0:
            f_[o] = 0
            o = tl[1] if n_[o] < 0 else n_[o]
        sc[0] = n_[o]
        unlink(o_, n_, hd, tl, ct, w_, o)
    f_[k] = 0
    push(o_, n_, hd, tl, ct, w_, 1, k)


@numba.njit(cache=True, inline="always")
def _s3fifo(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    w = w_[k]
    if w == 1 or w == 2:
        f_[k] += 1
        return
    ghost = w == 3
    if ghost:
        unlink(o_, n_, hd, tl, ct, w_, k)
    if C < 1:
        return
    while ct[1] + ct[2] + 1 > C:
        sc[1] = 1
        if ct[2] > cm or ct[1] == 0:
            while ct[2] > 0:
                t = tl[2]
                f = f_[t]
                unlink(o_, n_, hd, tl, ct, w_, t)
                if f >= 1:
                    push(o_, n_, hd, tl, ct, w_, 2, t)
                    f_[t] = min(f, 3) - 1
                else:
                    break
        else:
            while ct[1] > 0:
                t = tl[1]
                unlink(o_, n_, hd, tl, ct, w_, t)
                if f_[t] >= th:
                    push(o_, n_, hd, tl, ct, w_, 2, t)
                    f_[t] = 0
                else:
                    if cg > 0:
                        while ct[3] + 1 > cg:
                            unlink(o_, n_, hd, tl, ct, w_, tl[3])
                        push(o_, n_, hd, tl, ct, w_, 3, t)
                    break
    if ghost:
        push(o_, n_, hd, tl, ct, w_, 2, k)
    elif 1 >= cs:
        return
    elif sc[1] == 0 and ct[1] >= cs:
        push(o_, n_, hd, tl, ct, w_, 2, k)
    else:
        push(o_, n_, hd, tl, ct, w_, 1, k)
    f_[k] = 0


@numba.njit(cache=True, inline="always")
def _lfu(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    w = w_[k]
    if w > 0:
        unlink(o_, n_, hd, tl, ct, w_, k)
        push(o_, n_, hd, tl, ct, w_, w + 1, k)
        return
    if C < 1:
        return
    if ct[0] + 1 > C:  # ct[0]: stored blocks (bucket 0 is never used)
        m = sc[2]
        while ct[m] == 0:
            m += 1
        sc[2] = m
        unlink(o_, n_, hd, tl, ct, w_, tl[m])
        ct[0] -= 1
    push(o_, n_, hd, tl, ct, w_, 1, k)
    ct[0] += 1
    sc[2] = 1


@numba.njit(cache=True, inline="always")
def _arc(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    w = w_[k]
    if w == 1:
        unlink(o_, n_, hd, tl, ct, w_, k)
        push(o_, n_, hd, tl, ct, w_, 2, k)
        return
    if w == 2:
        unlink(o_, n_, hd, tl, ct, w_, k)
        push(o_, n_, hd, tl, ct, w_, 2, k)
        return
    in1, in2 = w == 3, w == 4
    if in1:
        pr[0] = min(pr[0] + max(ct[4] / ct[3], 1.0), C)
        unlink(o_, n_, hd, tl, ct, w_, k)
    elif in2:
        pr[0] = max(pr[0] - max(ct[3] / ct[4], 1.0), 0.0)
        unlink(o_, n_, hd, tl, ct, w_, k)
    if C < 1:
        return
    while ct[1] + ct[2] + 1 > C:
        rep_ = True
        b2 = in2
        if not (in1 or in2):
            b2 = False
            if ct[1] + ct[3] + 1 > C:
                if ct[3] > 0:
                    unlink(o_, n_, hd, tl, ct, w_, tl[3])
                else:
                    unlink(o_, n_, hd, tl, ct, w_, tl[1])
                    rep_ = False
            elif ct[1] + ct[3] + ct[2] + ct[4] >= 2 * C and ct[4] > 0:
                unlink(o_, n_, hd, tl, ct, w_, tl[4])
        if rep_:
            n1 = ct[1]
            if (n1 > 0 and (n1 > pr[0] or (n1 == pr[0] and b2))) or ct[2] == 0:
                t = tl[1]
                unlink(o_, n_, hd, tl, ct, w_, t)
                push(o_, n_, hd, tl, ct, w_, 3, t)
            else:
                t = tl[2]
                unlink(o_, n_, hd, tl, ct, w_, t)
                push(o_, n_, hd, tl, ct, w_, 4, t)
    push(o_, n_, hd, tl, ct, w_, 2 if (in1 or in2) else 1, k)


@numba.njit(cache=True, inline="always")
def _access(code, o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th):
    """One ``get`` of block ``k`` on one replica under policy ``code``."""
    if code == FIFO:
        _fifo(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th)
    elif code == SIEVE:
        _sieve(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th)
    elif code == S3FIFO:
        _s3fifo(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th)
    elif code == LFU:
        _lfu(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th)
    else:
        _arc(o_, n_, w_, f_, hd, tl, ct, sc, pr, k, C, cs, cm, cg, th)


@numba.njit(parallel=True, cache=True)
def run(code, ids, off, nb, inp, bt, rep, cap, cS, cG, thr, R, U, L):
    G, N = rep.shape
    hit_blocks = np.zeros((G, N), np.int32)
    hit_tok = np.zeros(G, np.int64)
    req_hit = np.zeros(G, np.int64)
    occ_out = np.zeros((G, R), np.int32)
    max_occ = np.zeros((G, R), np.int32)
    nreq = np.zeros((G, R), np.int32)
    block_hits = np.zeros(G, np.int64)
    for g in numba.prange(G):
        C = cap[g]
        cs = cS[g]
        cm = C - cs
        cg = cG[g]
        th = thr[g]
        older = np.full((R, U), -1, np.int64)
        newer = np.full((R, U), -1, np.int64)
        where = np.zeros((R, U), np.int64)
        freq = np.zeros((R, U), np.int64)
        head = np.full((R, L), -1, np.int64)
        tail = np.full((R, L), -1, np.int64)
        cnt = np.zeros((R, L), np.int64)
        sc = np.zeros((R, 3), np.int64)  # per replica: sieve's hand, s3fifo's has-evicted, lfu's lowest frequency
        sc[:, 0] = -1
        sc[:, 2] = 1
        p = np.zeros(R, np.float64)
        for i in range(N):
            r = rep[g, i]
            o_, n_, w_, f_ = older[r], newer[r], where[r], freq[r]
            hd, tl, ct = head[r], tail[r], cnt[r]
            n = nb[i]
            h = 0
            while h < n:  # lookup: the leading run of stored blocks (lfu: any bucket; else lists 1, 2)
                wk = w_[ids[off[i] + h]]
                if not (wk > 0 if code == LFU else (wk == 1 or wk == 2)):
                    break
                h += 1
            for j in range(n - 1, -1, -1):
                k = ids[off[i] + j]
                w = w_[k]
                if (w > 0) if code == LFU else (w == 1 or w == 2):
                    block_hits[g] += 1
                _access(code, o_, n_, w_, f_, hd, tl, ct, sc[r], p[r:r + 1], k, C, cs, cm, cg, th)
            occ = ct[0] if code == LFU else ct[1] + ct[2]
            if occ > max_occ[g, r]:
                max_occ[g, r] = occ
            nreq[g, r] += 1
            hit_blocks[g, i] = h
            ht = inp[i] if h > inp[i] // bt else h * bt
            hit_tok[g] += ht
            if h > 0:
                req_hit[g] += 1
        for r in range(R):
            occ_out[g, r] = cnt[r, 0] if code == LFU else cnt[r, 1] + cnt[r, 2]
    return hit_blocks, hit_tok, req_hit, occ_out, max_occ, nreq, block_hits

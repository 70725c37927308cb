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
        hand = np.full(R, -1, np.int64)
        evicted = np.zeros(R, np.bool_)
        minf = np.ones(R, np.int64)
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
                if code == FIFO:
                    if w == 1 or C < 1:
                        continue
                    while ct[1] + 1 > C:
                        unlink(o_, n_, hd, tl, ct, w_, tl[1])
                    push(o_, n_, hd, tl, ct, w_, 1, k)
                elif code == SIEVE:
                    if w == 1:
                        f_[k] = 1
                        continue
                    if C < 1:
                        continue
                    while ct[1] + 1 > C:
                        o = tl[1] if hand[r] < 0 else hand[r]
                        while f_[o] > 0:
                            f_[o] = 0
                            o = tl[1] if n_[o] < 0 else n_[o]
                        hand[r] = n_[o]
                        unlink(o_, n_, hd, tl, ct, w_, o)
                    f_[k] = 0
                    push(o_, n_, hd, tl, ct, w_, 1, k)
                elif code == S3FIFO:
                    if w == 1 or w == 2:
                        f_[k] += 1
                        continue
                    ghost = w == 3
                    if ghost:
                        unlink(o_, n_, hd, tl, ct, w_, k)
                    if C < 1:
                        continue
                    while ct[1] + ct[2] + 1 > C:
                        evicted[r] = True
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
                        continue
                    elif not evicted[r] and ct[1] >= cs:
                        push(o_, n_, hd, tl, ct, w_, 2, k)
                    else:
                        push(o_, n_, hd, tl, ct, w_, 1, k)
                    f_[k] = 0
                elif code == LFU:
                    if w > 0:
                        unlink(o_, n_, hd, tl, ct, w_, k)
                        push(o_, n_, hd, tl, ct, w_, w + 1, k)
                        continue
                    if C < 1:
                        continue
                    if ct[0] + 1 > C:  # ct[0]: stored blocks (bucket 0 is never used)
                        m = minf[r]
                        while ct[m] == 0:
                            m += 1
                        minf[r] = m
                        unlink(o_, n_, hd, tl, ct, w_, tl[m])
                        ct[0] -= 1
                    push(o_, n_, hd, tl, ct, w_, 1, k)
                    ct[0] += 1
                    minf[r] = 1
                else:  # ARC
                    if w == 1:
                        unlink(o_, n_, hd, tl, ct, w_, k)
                        push(o_, n_, hd, tl, ct, w_, 2, k)
                        continue
                    if w == 2:
                        unlink(o_, n_, hd, tl, ct, w_, k)
                        push(o_, n_, hd, tl, ct, w_, 2, k)
                        continue
                    in1, in2 = w == 3, w == 4
                    if in1:
                        p[r] = min(p[r] + max(ct[4] / ct[3], 1.0), C)
                        unlink(o_, n_, hd, tl, ct, w_, k)
                    elif in2:
                        p[r] = max(p[r] - max(ct[3] / ct[4], 1.0), 0.0)
                        unlink(o_, n_, hd, tl, ct, w_, k)
                    if C < 1:
                        continue
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
                            if (n1 > 0 and (n1 > p[r] or (n1 == p[r] and b2))) or ct[2] == 0:
                                t = tl[1]
                                unlink(o_, n_, hd, tl, ct, w_, t)
                                push(o_, n_, hd, tl, ct, w_, 3, t)
                            else:
                                t = tl[2]
                                unlink(o_, n_, hd, tl, ct, w_, t)
                                push(o_, n_, hd, tl, ct, w_, 4, t)
                    push(o_, n_, hd, tl, ct, w_, 2 if (in1 or in2) else 1, k)
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

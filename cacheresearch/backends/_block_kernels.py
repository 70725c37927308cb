"""The compiled loops of :mod:`cacheresearch.backends.numba_policies` (module-level, so numba caches them).

One kernel per policy (``KERNELS[name]``), each specialised to its own structures, configurations in
parallel threads (``prange``). Per replica: ``where[k]`` names the list block ``k`` is in (0 absent;
1 and 2 data lists; 3 and 4 ghost lists; ``lfu``: its frequency bucket), ``older`` / ``newer`` link
a list's blocks (int32 over the id space), and the lists' heads, tails and counts are the replica's
scalars, loaded into locals for one request and stored back after it (kept in arrays, the per-block
code would reload them from memory after every link write: ten times slower). ``fifo`` is a ring.

Every kernel takes ``(ids, off, nb, inp, bt, rep, cap, R, U)`` (plus its own sizes) and returns
``(hit_blocks [G, N], hit_tokens [G], requests_hit [G], occupancy [G, R], max_occupancy [G, R],
requests [G, R], block_hits [G])``.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = dict(cache=True, inline="always")


@numba.njit(**_JIT)
def push(older, newer, where, head, tail, q, k):
    """Put ``k`` at the head (newest) of the list (head, tail); return the new (head, tail)."""
    older[k] = head
    newer[k] = -1
    if head >= 0:
        newer[head] = k
    else:
        tail = k
    where[k] = q
    return k, tail


@numba.njit(**_JIT)
def unlink(older, newer, where, head, tail, k):
    """Take ``k`` out of its list (head, tail); return the new (head, tail)."""
    o, n = older[k], newer[k]
    if n >= 0:
        older[n] = o
    else:
        head = o
    if o >= 0:
        newer[o] = n
    else:
        tail = n
    where[k] = 0
    return head, tail


@numba.njit(**_JIT)
def lead(where, ids, a, n, top):
    """The lookup: leading blocks of ``ids[a:a+n]`` stored (``1 <= where <= top``)."""
    h = 0
    while h < n:
        w = where[ids[a + h]]
        if w < 1 or w > top:
            break
        h += 1
    return h


@numba.njit(**_JIT)
def account(g, i, r, h, hits, occ, inp, bt, hit_blocks, hit_tok, req_hit, max_occ, nreq, block_hits):
    """One request's metrics: its hit ``h`` (leading blocks), ``hits`` block ``get`` hits, occupancy after it."""
    if occ > max_occ[g, r]:
        max_occ[g, r] = occ
    nreq[g, r] += 1
    hit_blocks[g, i] = h
    hit_tok[g] += inp[i] if h > inp[i] // bt else h * bt
    if h > 0:
        req_hit[g] += 1
    block_hits[g] += hits


@numba.njit(cache=True)
def outputs(G, N, R):
    return (np.zeros((G, N), np.int32), np.zeros(G, np.int64), np.zeros(G, np.int64), np.zeros((G, R), np.int32),
            np.zeros((G, R), np.int32), np.zeros((G, R), np.int32), np.zeros(G, np.int64))


@numba.njit(**_JIT)
def serve_fifo(w_, ring_, s, ids, a, n, C, M):
    """One request's gets (leaf-first) on a FIFO replica: ring ``ring_`` of ``M`` slots, scalars ``s`` (next
    slot, count); a hit changes nothing, a miss evicts the oldest if full. Returns the gets that hit."""
    pos, cnt = s[0], s[1]
    hits = 0
    for j in range(a + n - 1, a - 1, -1):
        k = ids[j]
        if w_[k] == 1:
            hits += 1
            continue
        if C < 1:
            continue
        if cnt >= C:  # cnt == C <= U: the ring is full and pos is the oldest slot
            w_[ring_[pos]] = 0
            cnt -= 1
        ring_[pos] = k
        w_[k] = 1
        pos = pos + 1 if pos + 1 < M else 0
        cnt += 1
    s[0], s[1] = pos, cnt
    return hits


@numba.njit(parallel=True, cache=True)
def run_fifo(ids, off, nb, inp, bt, rep, cap, R, U):
    """libCacheSim FIFO: a ring per replica; a hit changes nothing; a miss evicts the oldest if full."""
    G, N = rep.shape
    hb, ht, rh, occ_out, mocc, nreq, bh = outputs(G, N, R)
    for g in numba.prange(G):
        C = cap[g]
        M = max(min(C, U), 1)
        ring = np.zeros((R, M), np.int32)
        where = np.zeros((R, U), np.int32)
        st = np.zeros((R, 2), np.int64)  # next slot, count
        for i in range(N):
            r = rep[g, i]
            a, n = off[i], nb[i]
            h = lead(where[r], ids, a, n, 1)
            hits = serve_fifo(where[r], ring[r], st[r], ids, a, n, C, M)
            account(g, i, r, h, hits, st[r, 1], inp, bt, hb, ht, rh, mocc, nreq, bh)
        for r in range(R):
            occ_out[g, r] = st[r, 1]
    return hb, ht, rh, occ_out, mocc, nreq, bh


@numba.njit(**_JIT)
def serve_sieve(o_, n_, w_, v_, s, ids, a, n, C):
    """One request's gets on a Sieve replica (scalars ``s``: head, tail, count, hand); the gets that hit."""
    head, tail, cnt, hand = s[0], s[1], s[2], s[3]
    hits = 0
    for j in range(a + n - 1, a - 1, -1):
        k = ids[j]
        if w_[k] == 1:
            v_[k] = 1
            hits += 1
            continue
        if C < 1:
            continue
        while cnt + 1 > C:
            o = tail if hand < 0 else hand
            while v_[o] > 0:
                v_[o] = 0
                o = tail if n_[o] < 0 else n_[o]
            hand = n_[o]
            head, tail = unlink(o_, n_, w_, head, tail, o)
            cnt -= 1
        v_[k] = 0
        head, tail = push(o_, n_, w_, head, tail, 1, k)
        cnt += 1
    s[0], s[1], s[2], s[3] = head, tail, cnt, hand
    return hits


@numba.njit(parallel=True, cache=True)
def run_sieve(ids, off, nb, inp, bt, rep, cap, R, U):
    """libCacheSim Sieve: one list, a visited bit, a hand from the tail toward the head (wrapping)."""
    G, N = rep.shape
    hb, ht, rh, occ_out, mocc, nreq, bh = outputs(G, N, R)
    for g in numba.prange(G):
        C = cap[g]
        older = np.full((R, U), -1, np.int32)
        newer = np.full((R, U), -1, np.int32)
        where = np.zeros((R, U), np.int32)
        vis = np.zeros((R, U), np.int8)
        st = np.full((R, 4), -1, np.int64)  # head, tail, count, hand
        st[:, 2] = 0
        for i in range(N):
            r = rep[g, i]
            a, n = off[i], nb[i]
            h = lead(where[r], ids, a, n, 1)
            hits = serve_sieve(older[r], newer[r], where[r], vis[r], st[r], ids, a, n, C)
            account(g, i, r, h, hits, st[r, 2], inp, bt, hb, ht, rh, mocc, nreq, bh)
        for r in range(R):
            occ_out[g, r] = st[r, 2]
    return hb, ht, rh, occ_out, mocc, nreq, bh


@numba.njit(**_JIT)
def s3_miss(o_, n_, w_, f_, s, k, C, cs, cm, cg, th):
    """libCacheSim S3FIFO's miss of ``k`` (``where[k]`` 0 or 3, ghost) on the replica's scalars ``s``
    (small 0-2, main 3-5, ghost 6-8 as head, tail, count; 9: something was evicted)."""
    h1, t1, c1, h2, t2, c2, h3, t3, c3, ev = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]
    ghost = w_[k] == 3
    if ghost:
        h3, t3 = unlink(o_, n_, w_, h3, t3, k)
        c3 -= 1
    if C >= 1:
        while c1 + c2 + 1 > C:
            ev = 1
            if c2 > cm or c1 == 0:  # main: reinsert visited tails (frequency min(f, 3) - 1), evict one at 0
                while c2 > 0:
                    t = t2
                    f = f_[t]
                    h2, t2 = unlink(o_, n_, w_, h2, t2, t)
                    if f >= 1:
                        h2, t2 = push(o_, n_, w_, h2, t2, 2, t)
                        f_[t] = min(f, 3) - 1
                    else:
                        c2 -= 1
                        break
            else:  # small: a tail hit th times moves to main, else leaves for the ghost
                while c1 > 0:
                    t = t1
                    h1, t1 = unlink(o_, n_, w_, h1, t1, t)
                    c1 -= 1
                    if f_[t] >= th:
                        h2, t2 = push(o_, n_, w_, h2, t2, 2, t)
                        c2 += 1
                        f_[t] = 0
                    else:
                        if cg > 0:
                            while c3 + 1 > cg:
                                h3, t3 = unlink(o_, n_, w_, h3, t3, t3)
                                c3 -= 1
                            h3, t3 = push(o_, n_, w_, h3, t3, 3, t)
                            c3 += 1
                        break
        if ghost:
            h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
            c2 += 1
            f_[k] = 0
        elif cs > 1:
            if ev == 0 and c1 >= cs:  # warm-up: nothing evicted yet and small full
                h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
                c2 += 1
            else:
                h1, t1 = push(o_, n_, w_, h1, t1, 1, k)
                c1 += 1
            f_[k] = 0
    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9] = h1, t1, c1, h2, t2, c2, h3, t3, c3, ev


@numba.njit(**_JIT)
def serve_s3fifo(o_, n_, w_, f_, s, ids, a, n, C, cs, cm, cg, th):
    """One request's gets on an S3FIFO replica (:func:`s3_miss`'s scalars ``s``); the gets that hit."""
    hits = 0
    for j in range(a + n - 1, a - 1, -1):
        k = ids[j]
        w = w_[k]
        if w == 1 or w == 2:
            f_[k] += 1
            hits += 1
        else:
            s3_miss(o_, n_, w_, f_, s, k, C, cs, cm, cg, th)
    return hits


@numba.njit(parallel=True, cache=True)
def run_s3fifo(ids, off, nb, inp, bt, rep, cap, R, U, cS, cG, thr):
    """libCacheSim S3FIFO: small, main and ghost FIFOs; a hit adds 1 to the block's frequency."""
    G, N = rep.shape
    hb, ht, rh, occ_out, mocc, nreq, bh = outputs(G, N, R)
    for g in numba.prange(G):
        C, cs, cg, th = cap[g], cS[g], cG[g], thr[g]
        cm = C - cs
        older = np.full((R, U), -1, np.int32)
        newer = np.full((R, U), -1, np.int32)
        where = np.zeros((R, U), np.int32)
        freq = np.zeros((R, U), np.int32)
        st = np.full((R, 10), -1, np.int64)
        for x in (2, 5, 8, 9):
            st[:, x] = 0
        for i in range(N):
            r = rep[g, i]
            a, n = off[i], nb[i]
            h = lead(where[r], ids, a, n, 2)
            hits = serve_s3fifo(older[r], newer[r], where[r], freq[r], st[r], ids, a, n, C, cs, cm, cg, th)
            account(g, i, r, h, hits, st[r, 2] + st[r, 5], inp, bt, hb, ht, rh, mocc, nreq, bh)
        for r in range(R):
            occ_out[g, r] = st[r, 2] + st[r, 5]
    return hb, ht, rh, occ_out, mocc, nreq, bh


@numba.njit(**_JIT)
def serve_lfu(o_, n_, w_, hd, tl, ct, s, ids, a, n, C):
    """One request's gets on an LFU replica (buckets ``hd``, ``tl``, ``ct``; scalars ``s``: stored blocks,
    lowest frequency); the gets that hit."""
    tot, m = s[0], s[1]
    hits = 0
    for j in range(a + n - 1, a - 1, -1):
        k = ids[j]
        f = w_[k]
        if f > 0:
            hd[f], tl[f] = unlink(o_, n_, w_, hd[f], tl[f], k)
            ct[f] -= 1
            hd[f + 1], tl[f + 1] = push(o_, n_, w_, hd[f + 1], tl[f + 1], f + 1, k)
            ct[f + 1] += 1
            hits += 1
            continue
        if C < 1:
            continue
        if tot + 1 > C:
            while ct[m] == 0:
                m += 1
            hd[m], tl[m] = unlink(o_, n_, w_, hd[m], tl[m], tl[m])
            ct[m] -= 1
            tot -= 1
        hd[1], tl[1] = push(o_, n_, w_, hd[1], tl[1], 1, k)
        ct[1] += 1
        tot += 1
        m = 1
    s[0], s[1] = tot, m
    return hits


@numba.njit(parallel=True, cache=True)
def run_lfu(ids, off, nb, inp, bt, rep, cap, R, U, L):
    """libCacheSim LFU (in-cache): a list per frequency in last-access order, the lowest non-empty
    frequency kept as libCacheSim keeps it (1 after an insertion, raised by a scan at an eviction)."""
    G, N = rep.shape
    hb, ht, rh, occ_out, mocc, nreq, bh = outputs(G, N, R)
    for g in numba.prange(G):
        C = cap[g]
        older = np.full((R, U), -1, np.int32)
        newer = np.full((R, U), -1, np.int32)
        where = np.zeros((R, U), np.int32)  # the block's frequency (its bucket), 0 absent
        bhead = np.full((R, L), -1, np.int32)
        btail = np.full((R, L), -1, np.int32)
        bcnt = np.zeros((R, L), np.int32)
        st = np.zeros((R, 2), np.int64)  # stored blocks, lowest frequency
        st[:, 1] = 1
        for i in range(N):
            r = rep[g, i]
            a, n = off[i], nb[i]
            h = lead(where[r], ids, a, n, L)
            hits = serve_lfu(older[r], newer[r], where[r], bhead[r], btail[r], bcnt[r], st[r], ids, a, n, C)
            account(g, i, r, h, hits, st[r, 0], inp, bt, hb, ht, rh, mocc, nreq, bh)
        for r in range(R):
            occ_out[g, r] = st[r, 0]
    return hb, ht, rh, occ_out, mocc, nreq, bh


@numba.njit(**_JIT)
def arc_get(o_, n_, w_, s, pr, k, C):
    """libCacheSim ARC's ``get`` of ``k`` on the replica's scalars ``s`` (T1, T2, B1, B2 as head, tail,
    count at 0-2, 3-5, 6-8, 9-11) and target ``pr[0]``."""
    h1, t1, c1, h2, t2, c2, h3, t3, c3, h4, t4, c4 = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], \
        s[10], s[11]
    p = pr[0]
    w = w_[k]
    if w == 1:
        h1, t1 = unlink(o_, n_, w_, h1, t1, k)
        c1 -= 1
        h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
        c2 += 1
    elif w == 2:
        h2, t2 = unlink(o_, n_, w_, h2, t2, k)
        h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
    else:
        in1, in2 = w == 3, w == 4
        if in1:
            p = min(p + max(c4 / c3, 1.0), float(C))
            h3, t3 = unlink(o_, n_, w_, h3, t3, k)
            c3 -= 1
        elif in2:
            p = max(p - max(c3 / c4, 1.0), 0.0)
            h4, t4 = unlink(o_, n_, w_, h4, t4, k)
            c4 -= 1
        if C >= 1:
            while c1 + c2 + 1 > C:
                rep_ = True
                b2 = in2
                if not (in1 or in2):
                    b2 = False
                    if c1 + c3 + 1 > C:
                        if c3 > 0:
                            h3, t3 = unlink(o_, n_, w_, h3, t3, t3)
                            c3 -= 1
                        else:
                            h1, t1 = unlink(o_, n_, w_, h1, t1, t1)
                            c1 -= 1
                            rep_ = False
                    elif c1 + c3 + c2 + c4 >= 2 * C and c4 > 0:
                        h4, t4 = unlink(o_, n_, w_, h4, t4, t4)
                        c4 -= 1
                if rep_:
                    if (c1 > 0 and (c1 > p or (c1 == p and b2))) or c2 == 0:
                        t = t1
                        h1, t1 = unlink(o_, n_, w_, h1, t1, t)
                        c1 -= 1
                        h3, t3 = push(o_, n_, w_, h3, t3, 3, t)
                        c3 += 1
                    else:
                        t = t2
                        h2, t2 = unlink(o_, n_, w_, h2, t2, t)
                        c2 -= 1
                        h4, t4 = push(o_, n_, w_, h4, t4, 4, t)
                        c4 += 1
            if in1 or in2:
                h2, t2 = push(o_, n_, w_, h2, t2, 2, k)
                c2 += 1
            else:
                h1, t1 = push(o_, n_, w_, h1, t1, 1, k)
                c1 += 1
    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11] = h1, t1, c1, h2, t2, c2, h3, t3, c3, \
        h4, t4, c4
    pr[0] = p


@numba.njit(**_JIT)
def serve_arc(o_, n_, w_, s, pr, ids, a, n, C):
    """One request's gets on an ARC replica (:func:`arc_get`'s scalars); the gets that hit."""
    hits = 0
    for j in range(a + n - 1, a - 1, -1):
        k = ids[j]
        w = w_[k]
        if w == 1 or w == 2:
            hits += 1
        arc_get(o_, n_, w_, s, pr, k, C)
    return hits


@numba.njit(parallel=True, cache=True)
def run_arc(ids, off, nb, inp, bt, rep, cap, R, U):
    """libCacheSim ARC: T1, T2, ghosts B1, B2 and the adaptive target ``p`` (float64, as its double)."""
    G, N = rep.shape
    hb, ht, rh, occ_out, mocc, nreq, bh = outputs(G, N, R)
    for g in numba.prange(G):
        C = cap[g]
        older = np.full((R, U), -1, np.int32)
        newer = np.full((R, U), -1, np.int32)
        where = np.zeros((R, U), np.int32)
        st = np.full((R, 12), -1, np.int64)
        for x in (2, 5, 8, 11):
            st[:, x] = 0
        p = np.zeros((R, 1), np.float64)
        for i in range(N):
            r = rep[g, i]
            a, n = off[i], nb[i]
            h = lead(where[r], ids, a, n, 2)
            hits = serve_arc(older[r], newer[r], where[r], st[r], p[r], ids, a, n, C)
            account(g, i, r, h, hits, st[r, 2] + st[r, 5], inp, bt, hb, ht, rh, mocc, nreq, bh)
        for r in range(R):
            occ_out[g, r] = st[r, 2] + st[r, 5]
    return hb, ht, rh, occ_out, mocc, nreq, bh

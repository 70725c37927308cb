"""The tiered fleet as compiled loops (numba): per-block linked-list stores, one row per (tier, owner).

Semantics: :mod:`cacheresearch.tiers` (and ``tests/reference_tiers.py``, the plain-Python oracle this
kernel equals request by request). Every row is a doubly linked list over dense key ids (``nxt`` /
``prv`` / ``pres`` rows of ``K`` entries, head = most recent) run by the row's policy: ``lru`` (the
engine's leaf-first LRU: touches, then evict to capacity) on the lists themselves, every per-block policy
(``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``, ...: libCacheSim's ``get`` naming its victim) through its
one kernel (:mod:`cacheresearch.cache.kernels`, the dispatch generated from the registry) on the row's
links and its own per-block arrays; ``pres`` (stored, not a ghost)
is kept for every row and is what lookups and routers read. A touch, an insert and an eviction are O(1),
a request O(blocks x tiers) (plus O(replicas x matched blocks) for the tier routers).

Router views: ``precise`` reads ``pres``; ``stale`` reads it as of the last sync (copy on write: the
first change of a ``(row, key)`` after a sync saves the as-of-sync value, so a sync is O(1));
``approximate`` reads the router's own index (one more LRU row per replica, ``index_capacity``, touched
with every routed request). With every lower tier at capacity 0 the gpu rows are the fleet's cache of
the same policy and the timing is the fcfs replica's integer formulas, so the results are the existing
engine's bit for bit (``tests/test_tiers.py``). Configurations run in threads (the kernel releases the GIL).
"""

from __future__ import annotations

import sys
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np

from cacheresearch.cache.block import BLOCK_KNOBS, block_sizes
from cacheresearch.cache.kernels import dispatch
from cacheresearch.core.stream import first_seen
from cacheresearch.routers.fixed import first_bits, fixed_routes, prefix_keys
from cacheresearch.tiers.spec import LOWER_TIERS, TieredConfig

__all__ = ["TierResult", "run_tiers", "dense_keys", "ROUTER_CODE", "policy_code", "VIEW_CODE"]

ROUTER_CODE = {"random": 0, "round_robin": 0, "prefix_hash": 0, "least_loaded": 3, "tier_scorer": 4,
               "tier_kv_cost": 5, "tier_cache_aware": 6, "tier_preble": 7, "chwbl": 8, "power_of_two": 9}
D = None  # the dispatch on a per-block policy code (cacheresearch.cache.kernels.dispatch.bind)
NS = 16  # a per-block row's scalars
VIEW_CODE = {"precise": 0, "stale": 1, "approximate": 2}
_C30 = 2**30
_J = numba.njit(cache=True, inline="always")
# The larger helpers are compiled as functions of their own, not inlined into numba's IR: IR inlining of every
# call site made the kernel's first compile take about 4 minutes (35 s-1 min this way); the small ones stay
# inlined (a call per block that passes the store's arrays costs their reference counts).
_JF = numba.njit(cache=True)

#: One configuration's stores. Rows: ``nxt``, ``prv`` (int32), ``pres`` (int8) [rows, K]; ``head``, ``tail``,
#: ``size``, ``code`` (:func:`policy_code`), ``cap``, ``prow`` (its row in the per-block arrays, -1 for lru), ``cs``,
#: ``cg``, ``cp`` (the policy's sizes: S3-FIFO's small, ghost, promotion) [rows]. Per-block rows: ``wh``, ``ax``
#: (int32 [P, K]), ``st`` (int64 [P, NS]), ``pp`` (float64 [P, 1]), ``bh``, ``bt``, ``bc`` (buckets, int32 [P, L]).
#: Stale view:
#: ``se`` (the epoch of the saved value, int32), ``sv`` (the value as of the sync, int8) [rows, K], ``ep``
#: (current epoch, stale on) [2].
Stores = namedtuple("Stores", "nxt prv pres head tail size code cap prow cs cg cp wh ax st pp bh bt bc se sv ep")


class TierResult(NamedTuple):
    """Per-request outputs of one configuration."""

    replica: np.ndarray  # int64 [N]
    hit_blocks: np.ndarray  # int64 [N]
    hit_tokens: np.ndarray  # int64 [N]
    hit_tier: np.ndarray  # int64 [N, 4] hit blocks by tier (gpu, cpu, pool, disk)
    ttft_ms: np.ndarray  # int64 [N]
    load_ms: np.ndarray  # int64 [N]
    written_blocks: np.ndarray  # int64 [4] blocks written into each tier (gpu: 0)


# The hot loops below take the store's arrays one by one: passing the whole ``Stores`` tuple into an inlined
# helper costs a reference count of each of its arrays per call (about 100 ns a block), the arrays a few ns.
@_J
def _sp(pres, se, sv, ep, row, k, v):
    """Set ``pres[row, k]``; under the stale view, first save the as-of-sync value (once per epoch)."""
    if ep[1] != 0 and se[row, k] != ep[0]:
        sv[row, k] = pres[row, k]
        se[row, k] = ep[0]
    pres[row, k] = v


@_J
def _hd(pres, se, sv, ep, row, k, snap):
    if snap and se[row, k] == ep[0]:
        return sv[row, k] != 0
    return pres[row, k] != 0


@_J
def _ul(nxt, prv, head, tail, row, k):
    p = prv[row, k]
    q = nxt[row, k]
    if p >= 0:
        nxt[row, p] = q
    else:
        head[row] = q
    if q >= 0:
        prv[row, q] = p
    else:
        tail[row] = p


@_J
def _fr(nxt, prv, head, tail, row, k):
    h = head[row]
    prv[row, k] = -1
    nxt[row, k] = h
    if h >= 0:
        prv[row, h] = k
    else:
        tail[row] = k
    head[row] = k


@_J
def _setp(S, row, k, v):
    _sp(S.pres, S.se, S.sv, S.ep, row, k, v)


@_J
def _unlink(S, row, k):
    _ul(S.nxt, S.prv, S.head, S.tail, row, k)


@_J
def _front(S, row, k):
    _fr(S.nxt, S.prv, S.head, S.tail, row, k)


@_JF
def _touch_seq(S, row, keys, e0, n, step, lru):
    """Touch ``keys[e0 + j]`` for ``j`` = 0 .. n-1 (``step`` 1) or n-1 .. 0 (``step`` -1): a held block moves to
    the front (``lru``), a new one is linked there."""
    nxt, prv, pres, head, tail, size, se, sv, ep = S.nxt, S.prv, S.pres, S.head, S.tail, S.size, S.se, S.sv, S.ep
    for x in range(n):
        k = keys[e0 + (x if step > 0 else n - 1 - x)]
        if pres[row, k]:
            if lru:
                _ul(nxt, prv, head, tail, row, k)
                _fr(nxt, prv, head, tail, row, k)
        else:
            _sp(pres, se, sv, ep, row, k, 1)
            size[row] += 1
            _fr(nxt, prv, head, tail, row, k)


@_J
def _pop_tail(S, row):
    k = S.tail[row]
    _unlink(S, row, k)
    _setp(S, row, k, 0)
    S.size[row] -= 1
    return k


@_JF
def _evict(S, row, cap, vic):
    """Evict from the LRU end down to ``cap``; victims into ``vic`` in eviction order; returns how many."""
    nxt, prv, pres, head, tail, size, se, sv, ep = S.nxt, S.prv, S.pres, S.head, S.tail, S.size, S.se, S.sv, S.ep
    nv = 0
    while size[row] > cap:
        k = tail[row]
        _ul(nxt, prv, head, tail, row, k)
        _sp(pres, se, sv, ep, row, k, 0)
        size[row] -= 1
        vic[nv] = k
        nv += 1
    return nv


#: libCacheSim's default sizes for a tier's policy (a tier has no knobs of its own)
_S3_DEFAULTS = {k.name: k.default for k in BLOCK_KNOBS}


def policy_code(name: str) -> int:
    """A row's policy code: 0 the engine's lru, ``1 + c`` per-block policy ``c`` of the registry's dispatch."""
    return 0 if name == "lru" else 1 + dispatch.codes()[name]


@_J
def _get(S, row, k):
    """libCacheSim's ``get`` of ``k`` on a per-block row; returns the evicted block or -1."""
    code = S.code[row] - 1
    p = S.prow[row]
    w_ = S.wh[p]
    v = D.get(code, S.nxt[row], S.prv[row], w_, S.ax[p], S.st[p], S.pp[p], S.bh[p], S.bt[p], S.bc[p], k, S.cap[row],
              S.cs[row], S.cg[row], S.cp[row])
    if v >= 0:
        _setp(S, row, v, 0)
    w = w_[k]
    st = 1 if w >= 1 and w <= D.top(code) else 0
    if st != S.pres[row, k]:
        _setp(S, row, k, st)
    return v


@_JF
def _get_seq(S, row, keys, e0, n, step, vic):
    """One ``get`` of each of ``keys[e0 + j]``, ``j`` = 0 .. n-1 (``step`` 1) or n-1 .. 0 (``step`` -1), on a
    ``fifo`` or per-block row; the victims into ``vic`` in eviction order; returns how many. The gets run in the
    dispatch's loop (the policy code tested once, not once a block); the presence bits follow after, as
    :func:`_get` sets them one get at a time: every victim absent, then each key as its row now holds it (a
    block's first change in an epoch saves the same as-of-sync value either way)."""
    code = S.code[row] - 1
    p = S.prow[row]
    w_ = S.wh[p]
    nv = D.gets_seq(code, S.nxt[row], S.prv[row], w_, S.ax[p], S.st[p], S.pp[p], S.bh[p], S.bt[p], S.bc[p], keys, e0,
                    n, step, S.cap[row], S.cs[row], S.cg[row], S.cp[row], vic)
    for x in range(nv):
        _setp(S, row, vic[x], 0)
    top = D.top(code)
    for x in range(n):
        k = keys[e0 + x]
        w = w_[k]
        st = 1 if w >= 1 and w <= top else 0
        if st != S.pres[row, k]:
            _setp(S, row, k, st)
    return nv


@_JF
def _write(S, row, buf, m, vic):
    """Write ``buf[:m]`` in order into ``row`` (lru: touches, then evict to capacity; else one get each);
    the victims into ``vic`` in eviction order; returns how many."""
    if S.code[row] == 0:
        _touch_seq(S, row, buf, 0, m, 1, True)
        return _evict(S, row, S.cap[row], vic)
    return _get_seq(S, row, buf, 0, m, 1, vic)


@_JF
def _refresh_hits(S, rowof, r, keys, e0, h, where):
    """The hit blocks read in a lower tier (reverse prompt order): lru moves each to the front, the per-block
    policies take each as a get (a hit: no eviction)."""
    nxt, prv, head, tail = S.nxt, S.prv, S.head, S.tail
    for j in range(h - 1, -1, -1):
        if where[j] >= 1:
            row = rowof[where[j], r]
            c = S.code[row]
            if c == 0:
                _ul(nxt, prv, head, tail, row, keys[e0 + j])
                _fr(nxt, prv, head, tail, row, keys[e0 + j])
            else:
                _get(S, row, keys[e0 + j])


@_J
def _tier_of(pres, se, sv, ep, rowof, r, k, snap):
    """The first tier holding ``k`` for replica ``r`` (-1: none); ``snap``: as of the last sync."""
    for t in range(4):
        row = rowof[t, r]
        if row >= 0 and _hd(pres, se, sv, ep, row, k, snap):
            return t
    return -1


@_JF
def _match(S, rowof, keys, e0, n, rr, w, vw):
    """The router's tier-weighted leading-run match on replica ``rr``: ``sum_t w_t h_t // 100`` in view
    ``vw[0]`` (precise, stale); ``approximate``: the index row ``vw[1] + rr``'s run at the gpu weight."""
    pres, se, sv, ep = S.pres, S.se, S.sv, S.ep
    if vw[0] == 2:
        row = vw[1] + rr
        h = 0
        while h < n and pres[row, keys[e0 + h]]:
            h += 1
        return (w[0] * h) // 100
    m = 0
    snap = vw[0] == 1
    for j in range(n):
        t = _tier_of(pres, se, sv, ep, rowof, rr, keys[e0 + j], snap)
        if t < 0:
            break
        m += w[t]
    return m // 100


@_JF
def _argmin_q(q, R, o):
    best = -1
    for d in range(R):
        rr = (o + d) % R
        if best < 0 or q[rr] < q[best]:
            best = rr
    return best


@_JF
def _chwbl(q, R, h, ring_pos, ring_r, c_pct):
    """Consistent hashing with bounded loads: the first ring node at or after ``h`` (wrapping; ring sorted by
    position, replica, node) whose replica's queue is below ``ceil(c (total + 1) / R)``."""
    denom = 100 * R
    cap = (c_pct * (q[:R].sum() + 1) + denom - 1) // denom
    L = ring_pos.shape[0]
    start = np.searchsorted(ring_pos, h)
    for k in range(L):
        rr = ring_r[(start + k) % L]
        if q[rr] < cap:
            return rr
    return -1


@_JF
def _preble(q, act, score, R, o, n, ca):
    """Preble E2 on the matches in ``score``: rebalance, exploit (longest match, fewest active blocks), explore."""
    qmax, qmin = q[:R].max(), q[:R].min()
    if 100 * qmax > ca[3] * qmin and qmax - qmin > ca[4]:
        return _argmin_q(q, R, o)
    mstar = score[:R].max()
    best = -1
    if mstar > 0 and n - mstar < mstar:
        for d in range(R):
            rr = (o + d) % R
            if score[rr] == mstar and (best < 0 or act[rr] < act[best]):
                best = rr
        return best
    bc = 0
    for d in range(R):
        rr = (o + d) % R
        c = min(act[rr], _C30) + min(n - score[rr], _C30)
        if best < 0 or c < bc:
            best, bc = rr, c
    return best


@_JF
def _route(S, rowof, vw, keys, e0, n, q, act, score, b0, R, rcode, w, pw, lw, T, ow, ca):
    """``least_loaded`` (3), ``tier_scorer`` (4), ``tier_kv_cost`` (5), ``tier_cache_aware`` (6) or ``tier_preble``
    (7): the fleet's rules (ties by rotation from ``b0``) on the tier-weighted match in the view ``vw``.
    ``ca``: cache_aware's threshold_pm, balance_abs, rel_pct, then preble's rel_pct, abs."""
    o = (b0 * R) >> 32
    if rcode == 7:
        for rr in range(R):
            score[rr] = _match(S, rowof, keys, e0, n, rr, w, vw)
        return _preble(q, act, score, R, o, n, ca)
    if rcode == 6:
        qmax, qmin = q[:R].max(), q[:R].min()
        if qmax - qmin > ca[1] and 100 * qmax > ca[2] * qmin:
            return _argmin_q(q, R, o)
        best = -1
        bm = 0
        for d in range(R):
            rr = (o + d) % R
            m = _match(S, rowof, keys, e0, n, rr, w, vw)
            if best < 0 or m > bm:
                best, bm = rr, m
        if n > 0 and 1000 * bm > ca[0] * n:
            return best
        return _argmin_q(q, R, o)
    if rcode == 3:
        best = -1
        for d in range(R):
            rr = (o + d) % R
            if best < 0 or q[rr] < q[best]:
                best = rr
        return best
    for rr in range(R):
        m = _match(S, rowof, keys, e0, n, rr, w, vw)
        if rcode == 4:
            ps = (m * 1024) // n if n > 0 else 0
            ls = (512 * (T - min(q[rr], T))) // T
            score[rr] = pw * ps + lw * ls
        else:  # lowest cost wins: store its negation
            left = min(max(n - m, 0), _C30)
            score[rr] = -(min(ow * left, _C30) + min(100 * min(act[rr], _C30), _C30))
    best = -1
    for d in range(R):
        rr = (o + d) % R
        if best < 0 or score[rr] > score[best]:
            best = rr
    return best


@_JF
def _load_ms(ht_row, bbytes, mbps, lat_ns):
    """ceil(sum over lower tiers with hits of (ceil(bytes * 1000 / MB/s) + latency ns) / 1e6)."""
    load_ns = 0
    for t in range(1, 4):
        ht = ht_row[t]
        if ht > 0:
            x = ht * bbytes * 1000
            load_ns += (x + mbps[t - 1] - 1) // mbps[t - 1] + lat_ns[t - 1]
    return (load_ns + 999_999) // 1_000_000


@_JF
def _gpu_touch(S, g, keys, e0, n, h, where):
    """Touch the request's blocks leaf-first (reverse order) in lru gpu row ``g``: the list then starts
    ``k_0 .. k_{n-1}``. Fast path, same result: when the blocks held on the gpu are exactly a leading segment
    ``k_0 .. k_{s-1}`` linked in that order, splice the segment to the front in O(1) and link the new blocks
    after it, instead of moving each block."""
    nxt, prv, head, tail, pres, size, se, sv, ep = S.nxt, S.prv, S.head, S.tail, S.pres, S.size, S.se, S.sv, S.ep
    s = 0
    while s < h and where[s] == 0:
        s += 1
    ok = s > 0
    for j in range(s - 1):
        if nxt[g, keys[e0 + j]] != keys[e0 + j + 1]:
            ok = False
            break
    if ok:
        for j in range(s, n):
            if pres[g, keys[e0 + j]]:
                ok = False
                break
    if not ok:
        _touch_seq(S, g, keys, e0, n, -1, True)
        return
    a, b = keys[e0], keys[e0 + s - 1]
    if prv[g, a] >= 0:  # splice [a .. b] to the front
        p, q = prv[g, a], nxt[g, b]
        nxt[g, p] = q
        if q >= 0:
            prv[g, q] = p
        else:
            tail[g] = p
        nxt[g, b] = head[g]
        prv[g, head[g]] = b
        prv[g, a] = -1
        head[g] = a
    last = b
    for j in range(s, n):  # the new blocks, in order, after the segment
        k = keys[e0 + j]
        q = nxt[g, last]
        nxt[g, last] = k
        prv[g, k] = last
        nxt[g, k] = q
        if q >= 0:
            prv[g, q] = k
        else:
            tail[g] = k
        _sp(pres, se, sv, ep, g, k, 1)
        size[g] += 1
        last = k


@_JF
def _gpu(S, g, keys, e0, n, h, where, vic):
    """The request's blocks into gpu row ``g`` leaf-first; its victims into ``vic`` (eviction order)."""
    if S.code[g] == 0:
        _gpu_touch(S, g, keys, e0, n, h, where)
        return _evict(S, g, S.cap[g], vic)
    return _get_seq(S, g, keys, e0, n, -1, vic)


@_JF
def _offload(S, rowof, r, keys, e0, n, h, nv, vic, vic2, written, write_through):
    """``evict``: the gpu's victims down the present lower tiers (each tier's victims to the next, the last
    tier's dropped); ``write_through``: the computed blocks (reverse order) into every present lower tier."""
    if write_through:
        m = n - h
        for x in range(m):
            vic[x] = keys[e0 + n - 1 - x]
        for t in range(1, 4):
            row = rowof[t, r]
            if row >= 0 and m > 0:
                written[t] += m
                _write(S, row, vic, m, vic2)
        return
    for t in range(1, 4):
        row = rowof[t, r]
        if row < 0 or nv == 0:
            continue
        written[t] += nv
        nv2 = _write(S, row, vic, nv, vic2)
        for x in range(nv2):
            vic[x] = vic2[x]
        nv = nv2


@_JF
def _lookup(S, rowof, r, keys, e0, n, where, ht):
    """The hit on ``r``: the leading run held in any of its tiers, each block in the first that holds it."""
    pres, se, sv, ep = S.pres, S.se, S.sv, S.ep
    h = 0
    for j in range(n):
        t = _tier_of(pres, se, sv, ep, rowof, r, keys[e0 + j], False)
        if t < 0:
            break
        where[j] = t
        ht[t] += 1
        h += 1
    return h


@_JF
def _two_choices(q, R, b1, b2):
    """``power_of_two`` (:mod:`cacheresearch.routers.power_of_two`): replicas ``a = floor(b1 R / 2**32)`` and
    ``b = (a + 1 + floor(b2 (R - 1) / 2**32)) mod R`` (``a`` when R = 1); ``b`` if its queue is shorter, else ``a``."""
    a = (b1 * R) >> 32
    b = (a + 1 + ((b2 * (R - 1)) >> 32)) % R if R > 1 else a
    return b if q[b] < q[a] else a


@numba.njit(cache=True, nogil=True)
def _kernel(S, rowof, arrival, off, keys, inp, outp, route, bits0, kn, mbps, lat_ns, ca, w, hpref, ring_pos,
            ring_r, bits12):
    """``kn``: R, block tokens, block bytes, write_through, overlap, router code, prefix / load weights, queue
    threshold, overlap weight, prefill tokens/s, decode us/token, max blocks, chwbl c, view, index row 0,
    stale lag ms, index capacity."""
    R, bt, bbytes, write_through, overlap, rcode, pw, lw, T, ow = kn[0], kn[1], kn[2], kn[3], kn[4], kn[5], kn[6], \
        kn[7], kn[8], kn[9]
    tps, dus, maxn, c_pct, lag, icap = kn[10], kn[11], kn[12], kn[13], kn[16], kn[17]
    vw = kn[14:16]
    N = arrival.shape[0]
    vic = np.zeros(maxn + 1, np.int64)
    vic2 = np.zeros(maxn + 1, np.int64)
    where = np.zeros(maxn + 1, np.int64)
    fin = np.zeros((R, N + 1), np.int64)
    blk = np.zeros((R, N + 1), np.int64)
    act = np.zeros(R, np.int64)
    cnt = np.zeros(R, np.int64)
    ptr = np.zeros(R, np.int64)
    busy = np.zeros(R, np.int64)
    q = np.zeros(R, np.int64)
    score = np.zeros(R, np.int64)
    o_rep = np.zeros(N, np.int64)
    o_hit = np.zeros(N, np.int64)
    o_tok = np.zeros(N, np.int64)
    o_ttft = np.zeros(N, np.int64)
    o_load = np.zeros(N, np.int64)
    o_ht = np.zeros((N, 4), np.int64)
    written = np.zeros(4, np.int64)
    last_sync = 0
    for i in range(N):
        now = arrival[i]
        e0 = off[i]
        n = off[i + 1] - e0
        if vw[0] == 1 and (i == 0 or now - last_sync >= lag):  # stale view: sync (O(1): a new epoch)
            S.ep[0] += 1
            last_sync = now
        # loads: finish times on a replica are non-decreasing (FCFS), so a pointer counts the finished
        for r in range(R):
            while ptr[r] < cnt[r] and fin[r, ptr[r]] <= now:
                act[r] -= blk[r, ptr[r]]
                ptr[r] += 1
            q[r] = cnt[r] - ptr[r]
        if rcode == 0:
            r = route[i]
        elif rcode == 9:
            r = _two_choices(q, R, bits12[i, 0], bits12[i, 1])
        elif rcode == 8:
            r = _chwbl(q, R, hpref[i], ring_pos, ring_r, c_pct)
        else:
            r = _route(S, rowof, vw, keys, e0, n, q, act, score, bits0[i], R, rcode, w, pw, lw, T, ow, ca)
        o_rep[i] = r
        h = _lookup(S, rowof, r, keys, e0, n, where, o_ht[i])
        o_hit[i] = h
        o_tok[i] = min(h * bt, inp[i])
        _refresh_hits(S, rowof, r, keys, e0, h, where)  # read refresh in the lower tiers
        nv = _gpu(S, rowof[0, r], keys, e0, n, h, where, vic)
        _offload(S, rowof, r, keys, e0, n, h, nv, vic, vic2, written, write_through)
        if vw[0] == 2:  # the router's index of what it routed: leaf-first LRU
            _touch_seq(S, vw[1] + r, keys, e0, n, -1, True)
            _evict(S, vw[1] + r, icap, vic2)
        load = _load_ms(o_ht[i], bbytes, mbps, lat_ns)
        unc = inp[i] - o_tok[i]
        prefill = (unc // tps) * 1000 + ((unc % tps) * 1000 + tps - 1) // tps
        decode = (outp[i] // 1000) * dus + ((outp[i] % 1000) * dus + 999) // 1000
        if overlap:
            start = max(now + load, busy[r])
            o_ttft[i] = start - now + prefill
            busy[r] = start + prefill + decode
        else:
            start = max(now, busy[r])
            o_ttft[i] = start - now + load + prefill
            busy[r] = start + load + prefill + decode
        o_load[i] = load
        fin[r, cnt[r]] = busy[r]
        blk[r, cnt[r]] = n
        act[r] += n
        cnt[r] += 1
    return o_rep, o_hit, o_tok, o_ht, o_ttft, o_load, written


def dense_keys(workload) -> tuple[np.ndarray, int]:
    """The workload's block keys as dense ids ``0..K-1`` (int32) and ``K``, numbered in order of first
    appearance (:func:`cacheresearch.core.stream.first_seen`): the blocks a request brings in get neighbouring
    ids, so the tiers' per-block lists are walked in nearly sequential memory. No result depends on the
    numbering."""
    if workload.keys.size == 0:
        return np.zeros(0, np.int32), 1
    uniq, inv = np.unique(workload.keys, return_inverse=True)
    return first_seen(inv.reshape(-1)).astype(np.int32), int(uniq.size)


def _fixed(workload, cfg: TieredConfig, bits0):
    n = workload.n_requests
    if cfg.replicas == 1 or n == 0:
        return np.zeros(n, np.int64)
    k = workload.keys
    hi, lo = prefix_keys(workload.offsets[:-1], workload.n_blocks, (k >> np.uint64(32)).astype(np.uint32),
                         (k & np.uint64(0xFFFFFFFF)).astype(np.uint32), cfg.prefix_blocks)
    b = None if cfg.router != "random" else np.asarray(bits0, np.uint32)[None, :]
    return fixed_routes(cfg.router, cfg.replicas, n, prefix_hi=hi, prefix_lo=lo, bits0=b)[0].astype(np.int64)


def _ring(workload, cfg: TieredConfig):
    """chwbl's inputs: each request's point ``mix32(prefix key)`` and the ring (positions ``mix32(r, v)``
    sorted by (position, replica, node), and their replicas), from the routers' own hash."""
    from cacheresearch.routers import prefix_hash_u64  # noqa: PLC0415

    nb = workload.n_blocks
    pos = workload.offsets[:-1] + np.clip(np.minimum(cfg.prefix_blocks, nb) - 1, 0, None)
    h = np.asarray([prefix_hash_u64(int(workload.keys[p])) if b > 0 else prefix_hash_u64(0)
                    for p, b in zip(pos, nb)], np.int64)
    nodes = sorted((prefix_hash_u64((r << 32) | v), r, v) for r in range(cfg.replicas) for v in range(cfg.vnodes))
    return h, np.asarray([x[0] for x in nodes], np.int64), np.asarray([x[1] for x in nodes], np.int64)


def all_bits(seed: int, n: int) -> np.ndarray:
    """The engine's per-request random words under PRNG seed ``seed`` (``request_bits``: uint32 [n, 4])."""
    import jax  # noqa: PLC0415

    from cacheresearch.core.simulate import request_bits  # noqa: PLC0415

    return np.asarray(request_bits(jax.random.key(seed), n + 1))[:n] if n else np.zeros((0, 4), np.uint32)


def seed_bits(seed: int, n: int) -> np.ndarray:
    """Column 0 of the engine's per-request random words under PRNG seed ``seed`` (uint32 [n])."""
    import jax  # noqa: PLC0415

    return first_bits(jax.vmap(jax.random.key)(np.asarray([seed], np.uint32)), n)[0] if n else np.zeros(0, np.uint32)


def _layout(cfg: TieredConfig, K: int, L: int):
    """The rows of ``cfg`` (gpu per replica; each present lower tier, the pool one row for the fleet; the
    approximate view's index per replica) and their empty :data:`Stores`; ``rowof`` [4, R]; the index's
    first row (-1: none)."""
    R = int(cfg.replicas)
    rowof = np.full((4, R), -1, np.int64)
    spec = [(cfg.gpu_policy, int(cfg.gpu_blocks))] * R
    rowof[0] = np.arange(R)
    for t, name in enumerate(LOWER_TIERS, start=1):
        tier = cfg.tier(name)
        if tier.capacity_blocks > 0:
            n = 1 if tier.shared else R
            rowof[t] = len(spec) + (np.zeros(R, np.int64) if tier.shared else np.arange(R))
            spec += [(tier.policy, int(tier.capacity_blocks))] * n
    irow0 = -1
    if cfg.view == "approximate":
        irow0 = len(spec)
        spec += [("lru", min(int(cfg.index_capacity), K))] * R
    code = np.asarray([policy_code(c) for c, _ in spec], np.int64)
    cap = np.asarray([c for _, c in spec], np.int64)
    P = int((code >= 1).sum())
    prow = np.full(len(spec), -1, np.int64)
    prow[code >= 1] = np.arange(P)
    sizes = np.asarray([block_sizes(n, c, _S3_DEFAULTS) if n != "lru" else (0, 0, 0) for n, c in spec],
                       np.int64).reshape(-1, 3)
    nr, Pk = len(spec), max(P, 1)
    st = np.zeros((Pk, NS), np.int64)
    for x, c in enumerate(code[code >= 1]):
        D.init(int(c) - 1, st[x])
    Lb = L if any(D.BUCKETS[c - 1] for c in code[code >= 1]) else 1
    stale = cfg.view == "stale"
    S = Stores(np.full((nr, K), -1, np.int32), np.full((nr, K), -1, np.int32), np.zeros((nr, K), np.int8),
               np.full(nr, -1, np.int64), np.full(nr, -1, np.int64), np.zeros(nr, np.int64), code, cap, prow,
               np.ascontiguousarray(sizes[:, 0]), np.ascontiguousarray(sizes[:, 1]), np.ascontiguousarray(sizes[:, 2]),
               np.zeros((Pk, K if P else 1), np.int32), np.zeros((Pk, K if P else 1), np.int32), st,
               np.zeros((Pk, 1), np.float64), np.full((Pk, Lb), -1, np.int32), np.full((Pk, Lb), -1, np.int32),
               np.zeros((Pk, Lb), np.int32), np.full((nr, K) if stale else (1, 1), -1, np.int32),
               np.zeros((nr, K) if stale else (1, 1), np.int8), np.asarray([0, int(stale)], np.int64))
    return S, rowof, irow0


def _knobs(workload, cfg: TieredConfig, maxn: int, irow0: int) -> np.ndarray:
    return np.asarray([cfg.replicas, workload.block_tokens, cfg.block_bytes, cfg.offload == "write_through",
                       cfg.load_mode == "overlap", ROUTER_CODE[cfg.router], cfg.prefix_weight_pct, cfg.load_weight_pct,
                       cfg.queue_threshold, cfg.overlap_weight_pct, cfg.prefill_tps, cfg.decode_us_per_token, maxn,
                       cfg.chwbl_c_pct, VIEW_CODE[cfg.view], irow0, cfg.stale_lag_ms,
                       min(int(cfg.index_capacity), 2**62)], np.int64)


def run_tiers(workload, configs: list[TieredConfig], seeds=None, *, threads: int = 2, dense=None) -> list[TierResult]:
    """Run every configuration on ``workload`` (configuration ``g`` with PRNG seed ``seeds[g]``, default 0)."""
    dispatch.bind(sys.modules[__name__])
    n = workload.n_requests
    keys, K = dense if dense is not None else dense_keys(workload)
    seeds = [0] * len(configs) if seeds is None else list(seeds)
    bits_of: dict[int, np.ndarray] = {}
    arrays = (workload.arrival_ms.astype(np.int64), workload.offsets.astype(np.int64), keys,
              workload.input_tokens.astype(np.int64), workload.output_tokens.astype(np.int64))
    maxn = int(workload.n_blocks.max()) if n else 0
    # lfu's buckets: a block is accessed at most twice per request in a row (a read and a write)
    L = 2 * int(np.bincount(keys).max() if keys.size else 0) + 3

    def needs_bits(cfg):
        return cfg.router != "round_robin" and cfg.router != "prefix_hash" and cfg.replicas > 1

    # JAX work (PRNG draws, fixed routes) first, in this thread; then the kernels run in threads
    pre = []
    for g, cfg in enumerate(configs):
        s = int(seeds[g])
        if needs_bits(cfg) and s not in bits_of:
            bits_of[s] = seed_bits(s, n)
        b0 = bits_of[s].astype(np.int64) if needs_bits(cfg) else np.zeros(n, np.int64)
        route = _fixed(workload, cfg, b0) if ROUTER_CODE[cfg.router] == 0 else np.zeros(n, np.int64)
        ring = _ring(workload, cfg) if cfg.router == "chwbl" else (np.zeros(n, np.int64), np.zeros(1, np.int64),
                                                                   np.zeros(1, np.int64))
        b12 = (all_bits(s, n)[:, 1:3].astype(np.int64) if cfg.router == "power_of_two" and cfg.replicas > 1
               else np.zeros((n, 2), np.int64))
        pre.append((b0, route, ring, b12))

    def one(g):
        cfg = configs[g]
        b0, route, ring, b12 = pre[g]
        tiers = [cfg.tier(t) for t in LOWER_TIERS]
        S, rowof, irow0 = _layout(cfg, int(K), L)
        out = _kernel(S, rowof, *arrays, route, b0, _knobs(workload, cfg, maxn, irow0),
                      np.asarray([max(int(round(t.read_gbps * 1000)), 1) for t in tiers], np.int64),
                      np.asarray([int(round(t.latency_us * 1000)) for t in tiers], np.int64),
                      np.asarray([cfg.cache_threshold_pm, cfg.balance_abs, cfg.balance_rel_pct, cfg.preble_rel_pct,
                                  cfg.preble_abs], np.int64),
                      np.asarray(cfg.tier_weights_pct, np.int64), *ring, np.ascontiguousarray(b12))
        return TierResult(*out)

    if threads <= 1 or len(configs) <= 1:
        return [one(g) for g in range(len(configs))]
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(one, range(len(configs))))


dispatch.bind(sys.modules[__name__])

"""The tiered fleet as compiled loops (numba): per-block linked-list stores, one per (tier, owner).

Semantics: :mod:`cacheresearch.tiers` (and ``tests/reference_tiers.py``, the plain-Python oracle this
kernel equals request by request). Every store is a doubly linked list over dense key ids (``nxt`` /
``prv`` / ``pres`` rows of ``K`` entries, head = most recent), so a touch, an insert and an eviction are
O(1) and a request costs O(blocks x tiers) (plus O(replicas x matched blocks) for ``tier_scorer``).
With every lower tier at capacity 0 the gpu rows are the fleet's leaf-first LRU and the timing is the
fcfs replica's integer formulas, so the results are the existing engine's bit for bit
(``tests/test_tiers.py``). Configurations run in threads (the kernel releases the GIL).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np

from cacheresearch.routers.fixed import first_bits, fixed_routes, prefix_keys
from cacheresearch.tiers.spec import LOWER_TIERS, TieredConfig

__all__ = ["TierResult", "run_tiers", "dense_keys", "ROUTER_CODE"]

ROUTER_CODE = {"random": 0, "round_robin": 0, "prefix_hash": 0, "least_loaded": 3, "tier_scorer": 4,
               "tier_kv_cost": 5, "tier_cache_aware": 6, "tier_preble": 7, "chwbl": 8}
_C30 = 2**30
_J = numba.njit(cache=True, inline="always")


class TierResult(NamedTuple):
    """Per-request outputs of one configuration."""

    replica: np.ndarray  # int64 [N]
    hit_blocks: np.ndarray  # int64 [N]
    hit_tokens: np.ndarray  # int64 [N]
    hit_tier: np.ndarray  # int64 [N, 4] hit blocks by tier (gpu, cpu, pool, disk)
    ttft_ms: np.ndarray  # int64 [N]
    load_ms: np.ndarray  # int64 [N]
    written_blocks: np.ndarray  # int64 [4] blocks written into each tier (gpu: 0)


@_J
def _unlink(nxt, prv, head, tail, row, k):
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
def _front(nxt, prv, head, tail, row, k):
    h = head[row]
    prv[row, k] = -1
    nxt[row, k] = h
    if h >= 0:
        prv[row, h] = k
    else:
        tail[row] = k
    head[row] = k


@_J
def _touch(nxt, prv, pres, head, tail, size, row, k, lru):
    if pres[row, k]:
        if lru:
            _unlink(nxt, prv, head, tail, row, k)
            _front(nxt, prv, head, tail, row, k)
    else:
        pres[row, k] = 1
        size[row] += 1
        _front(nxt, prv, head, tail, row, k)


@_J
def _evict(nxt, prv, pres, head, tail, size, row, cap, vic):
    """Evict from the LRU end down to ``cap``; victims into ``vic`` in eviction order; returns how many."""
    nv = 0
    while size[row] > cap:
        k = tail[row]
        _unlink(nxt, prv, head, tail, row, k)
        pres[row, k] = 0
        size[row] -= 1
        vic[nv] = k
        nv += 1
    return nv


@_J
def _tier_of(pres, rowof, r, k):
    """The first tier holding ``k`` for replica ``r`` (-1: none)."""
    for t in range(4):
        row = rowof[t, r]
        if row >= 0 and pres[row, k]:
            return t
    return -1


@_J
def _match(pres, rowof, keys, e0, n, rr, w):
    """The tier-weighted leading-run match on replica ``rr``: ``sum_t w_t h_t // 100``."""
    m = 0
    for j in range(n):
        t = _tier_of(pres, rowof, rr, keys[e0 + j])
        if t < 0:
            break
        m += w[t]
    return m // 100


@_J
def _argmin_q(q, R, o):
    best = -1
    for d in range(R):
        rr = (o + d) % R
        if best < 0 or q[rr] < q[best]:
            best = rr
    return best


@_J
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


@_J
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


@_J
def _route(pres, rowof, keys, e0, n, q, act, score, b0, R, rcode, w, pw, lw, T, ow, ca):
    """``least_loaded`` (3), ``tier_scorer`` (4), ``tier_kv_cost`` (5), ``tier_cache_aware`` (6) or ``tier_preble``
    (7): the fleet's rules (ties by rotation from ``b0``) on the tier-weighted match. ``ca``: cache_aware's
    threshold_pm, balance_abs, rel_pct, then preble's rel_pct, abs."""
    o = (b0 * R) >> 32
    if rcode == 7:
        for rr in range(R):
            score[rr] = _match(pres, rowof, keys, e0, n, rr, w)
        return _preble(q, act, score, R, o, n, ca)
    if rcode == 6:
        qmax, qmin = q[:R].max(), q[:R].min()
        if qmax - qmin > ca[1] and 100 * qmax > ca[2] * qmin:
            return _argmin_q(q, R, o)
        best = -1
        bm = 0
        for d in range(R):
            rr = (o + d) % R
            m = _match(pres, rowof, keys, e0, n, rr, w)
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
        m = _match(pres, rowof, keys, e0, n, rr, w)
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


@_J
def _load_ms(ht_row, bbytes, mbps, lat_ns):
    """ceil(sum over lower tiers with hits of (ceil(bytes * 1000 / MB/s) + latency ns) / 1e6)."""
    load_ns = 0
    for t in range(1, 4):
        ht = ht_row[t]
        if ht > 0:
            x = ht * bbytes * 1000
            load_ns += (x + mbps[t - 1] - 1) // mbps[t - 1] + lat_ns[t - 1]
    return (load_ns + 999_999) // 1_000_000


@_J
def _stores(nrows, K):
    """Empty linked-list stores: next, previous, present [rows, K]; head, tail, size [rows]."""
    return (np.full((nrows, K), -1, np.int32), np.full((nrows, K), -1, np.int32), np.zeros((nrows, K), np.int8),
            np.full(nrows, -1, np.int64), np.full(nrows, -1, np.int64), np.zeros(nrows, np.int64))


@_J
def _gpu_touch(nxt, prv, pres, head, tail, size, g, keys, e0, n, h, where):
    """Touch the request's blocks leaf-first (reverse order) in gpu row ``g``: the list then starts
    ``k_0 .. k_{n-1}``. Fast path, same result: when the blocks held on the gpu are exactly a leading segment
    ``k_0 .. k_{s-1}`` linked in that order, splice the segment to the front in O(1) and link the new blocks
    after it, instead of moving each block."""
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
        for j in range(n - 1, -1, -1):
            _touch(nxt, prv, pres, head, tail, size, g, keys[e0 + j], True)
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
        pres[g, k] = 1
        size[g] += 1
        last = k


@numba.njit(cache=True, nogil=True)
def _kernel(arrival, off, keys, inp, outp, route, bits0, R, K, bt, gpu_cap, caps, lru, mbps, lat_ns, bbytes,
            write_through, overlap, rcode, pw, lw, T, ow, ca, w, tps, dus, maxn, hpref, ring_pos, ring_r, c_pct):
    N = arrival.shape[0]
    # rows: gpu r -> r; then each present lower tier (pool: one row shared by every replica)
    rowof = np.full((4, R), -1, np.int64)
    rowof[0] = np.arange(R)
    nrows = R
    for t in range(1, 4):
        if caps[t - 1] > 0:
            shared = t == 2
            for r in range(R):
                rowof[t, r] = nrows if shared else nrows + r
            nrows += 1 if shared else R
    nxt, prv, pres, head, tail, size = _stores(nrows, K)
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
    o_ht = np.zeros((N, 4), np.int64)
    o_ttft = np.zeros(N, np.int64)
    o_load = np.zeros(N, np.int64)
    written = np.zeros(4, np.int64)
    for i in range(N):
        now = arrival[i]
        e0 = off[i]
        n = off[i + 1] - e0
        # 1. loads: finish times on a replica are non-decreasing (FCFS), so a pointer counts the finished
        for r in range(R):
            while ptr[r] < cnt[r] and fin[r, ptr[r]] <= now:
                act[r] -= blk[r, ptr[r]]
                ptr[r] += 1
            q[r] = cnt[r] - ptr[r]
        # 2-3. route
        if rcode == 0:
            r = route[i]
        elif rcode == 8:
            r = _chwbl(q, R, hpref[i], ring_pos, ring_r, c_pct)
        else:
            r = _route(pres, rowof, keys, e0, n, q, act, score, bits0[i], R, rcode, w, pw, lw, T, ow, ca)
        o_rep[i] = r
        # 4. lookup
        h = 0
        for j in range(n):
            t = _tier_of(pres, rowof, r, keys[e0 + j])
            if t < 0:
                break
            where[j] = t
            o_ht[i, t] += 1
            h += 1
        o_hit[i] = h
        tok = h * bt
        o_tok[i] = tok if tok < inp[i] else inp[i]
        # 5. read refresh in the lower LRU tiers
        for j in range(h - 1, -1, -1):
            t = where[j]
            if t >= 1 and lru[t - 1]:
                row = rowof[t, r]
                k = keys[e0 + j]
                _unlink(nxt, prv, head, tail, row, k)
                _front(nxt, prv, head, tail, row, k)
        # 6. gpu: leaf-first LRU
        g = rowof[0, r]
        _gpu_touch(nxt, prv, pres, head, tail, size, g, keys, e0, n, h, where)
        nv = _evict(nxt, prv, pres, head, tail, size, g, gpu_cap, vic)
        # 7. offload
        if write_through:
            for t in range(1, 4):
                row = rowof[t, r]
                if row < 0 or h >= n:
                    continue
                written[t] += n - h
                for j in range(n - 1, h - 1, -1):
                    _touch(nxt, prv, pres, head, tail, size, row, keys[e0 + j], lru[t - 1])
                _evict(nxt, prv, pres, head, tail, size, row, caps[t - 1], vic2)
        else:
            for t in range(1, 4):
                row = rowof[t, r]
                if row < 0 or nv == 0:
                    continue
                written[t] += nv
                for x in range(nv):
                    _touch(nxt, prv, pres, head, tail, size, row, vic[x], lru[t - 1])
                nv2 = _evict(nxt, prv, pres, head, tail, size, row, caps[t - 1], vic2)
                for x in range(nv2):
                    vic[x] = vic2[x]
                nv = nv2
        # 9. time
        load = _load_ms(o_ht[i], bbytes, mbps, lat_ns)
        unc = inp[i] - o_tok[i]
        prefill = (unc // tps) * 1000 + ((unc % tps) * 1000 + tps - 1) // tps
        decode = (outp[i] // 1000) * dus + ((outp[i] % 1000) * dus + 999) // 1000
        if overlap:
            start = max(now + load, busy[r])
            ttft = start - now + prefill
            finish = start + prefill + decode
        else:
            start = max(now, busy[r])
            ttft = start - now + load + prefill
            finish = start + load + prefill + decode
        o_ttft[i] = ttft
        o_load[i] = load
        busy[r] = finish
        fin[r, cnt[r]] = finish
        blk[r, cnt[r]] = n
        act[r] += n
        cnt[r] += 1
    return o_rep, o_hit, o_tok, o_ht, o_ttft, o_load, written


def dense_keys(workload) -> tuple[np.ndarray, int]:
    """The workload's block keys as dense ids ``0..K-1`` (int32) and ``K``."""
    if workload.keys.size == 0:
        return np.zeros(0, np.int32), 1
    uniq, inv = np.unique(workload.keys, return_inverse=True)
    return inv.astype(np.int32).reshape(-1), int(uniq.size)


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


def seed_bits(seed: int, n: int) -> np.ndarray:
    """Column 0 of the engine's per-request random words under PRNG seed ``seed`` (uint32 [n])."""
    import jax  # noqa: PLC0415

    return first_bits(jax.vmap(jax.random.key)(np.asarray([seed], np.uint32)), n)[0] if n else np.zeros(0, np.uint32)


def run_tiers(workload, configs: list[TieredConfig], seeds=None, *, threads: int = 2, dense=None) -> list[TierResult]:
    """Run every configuration on ``workload`` (configuration ``g`` with PRNG seed ``seeds[g]``, default 0)."""
    n = workload.n_requests
    keys, K = dense if dense is not None else dense_keys(workload)
    seeds = [0] * len(configs) if seeds is None else list(seeds)
    bits_of: dict[int, np.ndarray] = {}
    arrays = dict(arrival=workload.arrival_ms.astype(np.int64), off=workload.offsets.astype(np.int64),
                  inp=workload.input_tokens.astype(np.int64), outp=workload.output_tokens.astype(np.int64))
    maxn = int(workload.n_blocks.max()) if n else 0

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
        pre.append((b0, route, ring))

    def one(g):
        cfg = configs[g]
        b0, route, ring = pre[g]
        tiers = [cfg.tier(t) for t in LOWER_TIERS]
        out = _kernel(arrays["arrival"], arrays["off"], keys, arrays["inp"], arrays["outp"], route, b0,
                      int(cfg.replicas), int(K), int(workload.block_tokens), int(cfg.gpu_blocks),
                      np.asarray([t.capacity_blocks for t in tiers], np.int64),
                      np.asarray([t.policy == "lru" for t in tiers], np.bool_),
                      np.asarray([max(int(round(t.read_gbps * 1000)), 1) for t in tiers], np.int64),
                      np.asarray([int(round(t.latency_us * 1000)) for t in tiers], np.int64), int(cfg.block_bytes),
                      cfg.offload == "write_through", cfg.load_mode == "overlap", ROUTER_CODE[cfg.router],
                      int(cfg.prefix_weight_pct), int(cfg.load_weight_pct), int(cfg.queue_threshold),
                      int(cfg.overlap_weight_pct),
                      np.asarray([cfg.cache_threshold_pm, cfg.balance_abs, cfg.balance_rel_pct, cfg.preble_rel_pct,
                                  cfg.preble_abs], np.int64),
                      np.asarray(cfg.tier_weights_pct, np.int64), int(cfg.prefill_tps),
                      int(cfg.decode_us_per_token), maxn, *ring, int(cfg.chwbl_c_pct))
        return TierResult(*out)

    if threads <= 1 or len(configs) <= 1:
        return [one(g) for g in range(len(configs))]
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(one, range(len(configs))))

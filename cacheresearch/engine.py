"""The exact, vectorized prefix-cache engine.

``simulate(stream, params, key) -> Metrics`` is a pure, jit-compiled function; ``simulate_grid`` vmaps
it over configurations (and seeds). Everything a user sweeps (policy, capacity, TTL, replicas, router,
router knobs) is a dynamic field of :class:`Params`, so one compile serves a whole grid. Static shapes
come from the :class:`Stream` (number of distinct keys, chunks) and the ``max_replicas`` bound.

Data structures (why this is exact and fast)
--------------------------------------------
* Keys are made dense on the host (``np.unique``): each replica holds one ``(stamp, time)`` pair per
  key in a single ``[R, K, 2]`` array: the recency stamp (-1 never stored) and the last access (or
  write time for ``ttl_fixed``) in ms. One array, so each step does one gather and one in-place
  scatter (with two arrays XLA copied the whole state on every step).
* Recency stamps are *global positions in the block stream*: block ``j`` of request ``i`` gets
  ``offsets[i] + (n_i - 1 - j)`` under leaf-first order and ``offsets[i] + j`` under prompt order. So
  the log of stamp assignments ``log[s]`` (the key stamped ``s``) is known before the run, is sorted by
  time, and the least recent stored block of a replica is the first of its log entries at or after its
  pointer whose key still carries that stamp on that replica. Each replica keeps the list of requests
  routed to it and a pointer into their log segments that only moves forward, skipping stale entries
  in vectorized windows: eviction is exact LRU in amortized O(1) per block, and a replica never scans
  another replica's entries.
* The scan runs over *chunks* of at most ``chunk_blocks`` blocks of one request, not over padded
  requests, so work follows real blocks. Lookup of every chunk of a request happens before any
  eviction for that request (restamping the request's own blocks never changes their presence, since
  keys are distinct within a request), which keeps the request-level semantics exact.
* Token totals are carried as two int32 limbs, so aggregate hit-token counts are exact without x64.

* Routing happens at a request's first chunk (:mod:`cacheresearch.routers`); the random router's bits
  are drawn once before the scan.

Overflow of a static bound (too many replicas, a stream longer than int32 stamps, token counts beyond
int32) raises before the run; nothing is truncated.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .policies import INF, policy_spec
from .routers import FleetView, RequestView, route, router_id
from .workload import Workload

__all__ = [
    "Stream",
    "Params",
    "Metrics",
    "compile_stream",
    "stack_streams",
    "make_params",
    "stack_params",
    "simulate",
    "simulate_grid",
    "combine_limbs",
    "check_bounds",
    "default_window",
]

_LIMB = 20  # token counters: value = hi * 2**20 + lo


class Stream(NamedTuple):
    """Device arrays of one workload, ready for the scan (see :func:`compile_stream`)."""

    # per chunk [T, W] / [T]
    chunk_ids: jax.Array  # int32 [T, W] dense key id, K (out of range) for padding
    chunk_pos: jax.Array  # int32 [T, W] block index within its request
    chunk_req: jax.Array  # int32 [T] request index (N for padding chunks)
    chunk_first: jax.Array  # bool [T]
    chunk_last: jax.Array  # bool [T]
    # per request [N + 1] (last row is a dummy for padding)
    arrival_ms: jax.Array  # int32
    input_tokens: jax.Array  # int32
    n_blocks: jax.Array  # int32
    offset: jax.Array  # int32: first stamp of the request
    # per block position [S] (flat, prompt order)
    key_hi: jax.Array  # uint32
    key_lo: jax.Array  # uint32
    log_leaf: jax.Array  # int32 [S + 1]: key stamped s under leaf-first order (K at the end)
    log_plain: jax.Array  # int32 [S + 1]: same under prompt order
    # scalars
    block_tokens: jax.Array  # int32
    input_total: jax.Array  # float32: total input tokens
    n_requests: jax.Array  # int32: real requests (excludes padding)
    # per distinct key [K]: the 64-bit key of each dense id (its length fixes the state's shape)
    uniq_hi: jax.Array  # uint32
    uniq_lo: jax.Array  # uint32

    @property
    def n_keys(self) -> int:
        return int(self.uniq_hi.shape[-1])


class Params(NamedTuple):
    """Dynamic parameters of one configuration (every field a scalar, or [G] for a grid)."""

    policy: jax.Array  # int32 policy id (metadata; behaviour comes from the fields below)
    capacity: jax.Array  # int32 blocks per replica (INF = unbounded)
    ttl_ms: jax.Array  # int32 (INF = no expiry)
    leaf_first: jax.Array  # bool
    refresh: jax.Array  # bool: hits refresh the TTL clock
    replicas: jax.Array  # int32 active replicas
    router: jax.Array  # int32 router id
    prefix_blocks: jax.Array  # int32 K for prefix_hash


class Metrics(NamedTuple):
    token_hit_rate: jax.Array  # float32
    request_hit_rate: jax.Array  # float32
    hit_tokens_hi: jax.Array  # int32 limbs of total hit tokens (see combine_limbs)
    hit_tokens_lo: jax.Array
    requests_hit: jax.Array  # int32
    # Occupancy counts stored blocks. LRU policies evict down to the capacity; TTL policies and
    # ``unbounded`` never evict, so there an expired block stays stored (invisible to lookups)
    # until it is rewritten: for them these count every distinct block ever written.
    max_occupancy: jax.Array  # int32 [R_max]: most blocks stored at once after a request
    occupancy: jax.Array  # int32 [R_max]: blocks stored at the end
    requests_per_replica: jax.Array  # int32 [R_max]
    # per request (empty arrays unless per_request=True)
    hit_blocks: jax.Array  # int32 [N]
    hit_tokens: jax.Array  # int32 [N]
    replica: jax.Array  # int32 [N]
    replicas_over_bound: jax.Array  # bool: params asked for more replicas than max_replicas (a bug)


def combine_limbs(hi, lo) -> np.ndarray:
    """Exact int64 totals from the engine's two-limb counters."""
    return (np.asarray(hi).astype(np.int64) << _LIMB) + np.asarray(lo).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Host side: workload -> stream
# ---------------------------------------------------------------------------------------------


def compile_stream(workload: Workload, *, chunk_blocks: int = 32) -> Stream:
    """Dense, chunked device arrays for ``workload`` (host-side NumPy work, done once)."""
    if chunk_blocks < 1:
        raise ValueError("chunk_blocks must be >= 1")
    w = workload
    w.check_distinct_keys()
    n = w.n_requests
    nb = w.n_blocks.astype(np.int64)
    S = w.total_blocks
    if S >= 2**31 - 2:
        raise ValueError(f"stream has {S} blocks; the int32 stamp bound is {2**31 - 3}")
    if w.input_tokens.max(initial=0) >= 2**31 - 1:
        raise ValueError("an input length exceeds the int32 token bound")
    ids = w.dense_ids().astype(np.int32)
    uniq = np.unique(w.keys)
    if uniq.shape[0] == 0:  # no block keys at all: one dummy key keeps the state's shapes valid
        uniq = np.zeros(1, np.uint64)
    K = int(uniq.shape[0])
    req_of_pos = np.repeat(np.arange(n, dtype=np.int64), nb)
    pos_in_req = np.arange(S, dtype=np.int64) - w.offsets[:-1][req_of_pos]
    # leaf-first stamp of flat position p: offset + (n - 1 - j)
    leaf_stamp = w.offsets[:-1][req_of_pos] + (nb[req_of_pos] - 1 - pos_in_req)
    log_leaf = np.full(S + 1, K, dtype=np.int32)
    log_leaf[leaf_stamp] = ids
    log_plain = np.full(S + 1, K, dtype=np.int32)
    log_plain[:S] = ids

    # chunks: every request gets at least one chunk (so block-less requests are still counted)
    W = int(chunk_blocks)
    nch = np.maximum(1, -(-nb // W))
    T = int(nch.sum())
    chunk_req = np.repeat(np.arange(n, dtype=np.int64), nch)
    first_chunk = np.concatenate([[0], np.cumsum(nch)[:-1]]).astype(np.int64)
    k_in_req = np.arange(T, dtype=np.int64) - first_chunk[chunk_req]
    start = w.offsets[:-1][chunk_req] + k_in_req * W  # flat position of the chunk's first block
    lane = np.arange(W, dtype=np.int64)
    pos = k_in_req[:, None] * W + lane[None, :]
    valid = pos < nb[chunk_req][:, None]
    flat = np.where(valid, start[:, None] + lane[None, :], 0)
    chunk_ids = np.where(valid, ids[flat] if S else 0, K).astype(np.int32)
    chunk_pos = np.where(valid, pos, 0).astype(np.int32)
    chunk_first = k_in_req == 0
    chunk_last = k_in_req == nch[chunk_req] - 1

    keys = w.keys
    pad1 = lambda a, v=0: np.concatenate([a, [v]])  # noqa: E731
    return Stream(
        chunk_ids=jnp.asarray(chunk_ids),
        chunk_pos=jnp.asarray(chunk_pos),
        chunk_req=jnp.asarray(chunk_req.astype(np.int32)),
        chunk_first=jnp.asarray(chunk_first),
        chunk_last=jnp.asarray(chunk_last),
        arrival_ms=jnp.asarray(pad1(w.arrival_ms).astype(np.int32)),
        input_tokens=jnp.asarray(pad1(w.input_tokens).astype(np.int32)),
        n_blocks=jnp.asarray(pad1(nb).astype(np.int32)),
        offset=jnp.asarray(pad1(w.offsets[:-1]).astype(np.int32)),
        key_hi=jnp.asarray(pad1((keys >> np.uint64(32)).astype(np.uint32))),
        key_lo=jnp.asarray(pad1((keys & np.uint64(0xFFFFFFFF)).astype(np.uint32))),
        log_leaf=jnp.asarray(log_leaf),
        log_plain=jnp.asarray(log_plain),
        block_tokens=jnp.asarray(np.int32(w.block_tokens)),
        input_total=jnp.asarray(np.float32(w.input_tokens.sum())),
        n_requests=jnp.asarray(np.int32(n)),
        uniq_hi=jnp.asarray((uniq >> np.uint64(32)).astype(np.uint32)),
        uniq_lo=jnp.asarray((uniq & np.uint64(0xFFFFFFFF)).astype(np.uint32)),
    )


def stack_streams(streams: list[Stream]) -> Stream:
    """Pad streams to common shapes and stack them on a leading axis (for vmapping workloads)."""
    Ks = [s.n_keys for s in streams]
    K = max(Ks)
    T = max(s.chunk_ids.shape[0] for s in streams)
    N1 = max(s.arrival_ms.shape[0] for s in streams)
    S1 = max(s.log_leaf.shape[0] for s in streams)
    Wd = {s.chunk_ids.shape[1] for s in streams}
    if len(Wd) != 1:
        raise ValueError("streams must share chunk_blocks")
    out = []
    for s, k in zip(streams, Ks):
        def padv(a, size, v):
            a = np.asarray(a)
            return np.concatenate([a, np.full((size - a.shape[0],) + a.shape[1:], v, a.dtype)])

        n1 = s.arrival_ms.shape[0]
        req = np.asarray(s.chunk_req)
        req = np.where(req == n1 - 1, N1 - 1, req)  # padding chunks point at the new dummy row
        ids = np.asarray(s.chunk_ids)
        ids = np.where(ids == k, K, ids)
        log_leaf = np.where(np.asarray(s.log_leaf) == k, K, np.asarray(s.log_leaf))
        log_plain = np.where(np.asarray(s.log_plain) == k, K, np.asarray(s.log_plain))
        out.append(
            Stream(
                chunk_ids=padv(ids, T, K),
                chunk_pos=padv(s.chunk_pos, T, 0),
                chunk_req=padv(req, T, N1 - 1),
                chunk_first=padv(s.chunk_first, T, False),
                chunk_last=padv(s.chunk_last, T, False),
                arrival_ms=padv(s.arrival_ms, N1, 0),
                input_tokens=padv(s.input_tokens, N1, 0),
                n_blocks=padv(s.n_blocks, N1, 0),
                offset=padv(s.offset, N1, 0),
                key_hi=padv(s.key_hi, S1, 0),
                key_lo=padv(s.key_lo, S1, 0),
                log_leaf=padv(log_leaf, S1, K),
                log_plain=padv(log_plain, S1, K),
                block_tokens=np.asarray(s.block_tokens),
                input_total=np.asarray(s.input_total),
                n_requests=np.asarray(s.n_requests),
                uniq_hi=padv(s.uniq_hi, K, 0),
                uniq_lo=padv(s.uniq_lo, K, 0),
            )
        )
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *out)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


def make_params(
    policy: str = "lru",
    capacity_blocks: int | None = None,
    ttl_s: float | None = None,
    replicas: int = 1,
    router: str = "round_robin",
    prefix_blocks: int = 80,
) -> Params:
    """One configuration. Capacity is required for LRU policies, TTL for TTL policies."""
    spec = policy_spec(policy)
    if spec.uses_capacity:
        if capacity_blocks is None:
            raise ValueError(f"policy {policy!r} needs capacity_blocks")
        if not 0 <= int(capacity_blocks) < INF:
            raise ValueError(f"capacity_blocks must be in [0, {INF}), got {capacity_blocks}")
        cap = int(capacity_blocks)
    else:
        cap = INF
    if spec.uses_ttl:
        if ttl_s is None:
            raise ValueError(f"policy {policy!r} needs ttl_s")
        ttl = int(round(float(ttl_s) * 1000))
        if not 0 <= ttl < INF:
            raise ValueError(f"ttl_s must be in [0, {INF / 1000:.0f}] seconds, got {ttl_s}")
    else:
        ttl = INF
    if int(replicas) < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if int(prefix_blocks) < 1:
        raise ValueError(f"prefix_blocks must be >= 1, got {prefix_blocks}")
    return Params(
        policy=np.int32(spec.id),
        capacity=np.int32(cap),
        ttl_ms=np.int32(ttl),
        leaf_first=np.bool_(spec.leaf_first),
        refresh=np.bool_(spec.refresh_on_hit),
        replicas=np.int32(replicas),
        router=np.int32(router_id(router)),
        prefix_blocks=np.int32(prefix_blocks),
    )


def stack_params(params: list[Params]) -> Params:
    """A grid [G] of configurations."""
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *params)


# ---------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------


class _Carry(NamedTuple):
    kv: jax.Array  # int32 [R, K, 2]: (recency stamp, time); stored iff stamp >= ptr[replica]
    occ: jax.Array  # int32 [R]
    ptr: jax.Array  # int32 [R]: stamp threshold (stored iff stamp >= ptr)
    rq: jax.Array  # int32 [R, N + 1]: requests routed to each replica, in order
    cnt: jax.Array  # int32 [R]: how many
    pq: jax.Array  # int32 [R]: eviction pointer: position in rq ...
    poff: jax.Array  # int32 [R]: ... and block within that request
    max_occ: jax.Array  # int32 [R]
    nreq: jax.Array  # int32 [R]
    rep: jax.Array  # int32 current replica
    hit: jax.Array  # int32 hit blocks so far in the current request
    alive: jax.Array  # bool: leading run still unbroken
    tok_hi: jax.Array
    tok_lo: jax.Array
    req_hit: jax.Array


_SEGMENTS = 8  # request segments one eviction window may span


def _evict(kv, occ, pq, poff, r, cap, leaf_first, stream, rq, cnt, window, do):
    """Evict replica ``r``'s least recent blocks until ``occ <= cap`` (when ``do``).

    Eviction is lazy: a key is stored on a replica iff its stamp is >= the replica's threshold, so
    evicting the least recent block is moving the threshold past its log entry. Each replica walks
    only its own part of the log: ``rq[r]`` lists the requests routed to it, in order (their stamp
    ranges ascend), and the pointer is (``pq``: position in that list, ``poff``: block within the
    request). A window examines ``window`` entries at once across up to ``_SEGMENTS`` requests; the
    first window runs unconditionally (it covers nearly every request), a while loop takes the
    remainder. The state is only read, so under vmap only scalars ride in the loop.

    Returns (occ, pq, poff, threshold stamp).
    """
    lane = jnp.arange(window, dtype=jnp.int32)
    seg = jnp.arange(_SEGMENTS, dtype=jnp.int32)
    K = kv.shape[1]
    nq = rq.shape[1]

    def segments(pq, poff):
        q = pq + seg
        ok = q < cnt
        reqs = rq[r, jnp.minimum(q, nq - 1)]
        lens = jnp.where(ok, stream.n_blocks[reqs], 0)
        ends = jnp.cumsum(lens) - poff  # exclusive end of each segment, in lanes from the pointer
        starts = ends - lens
        return reqs, ends, starts

    def one_window(occ, pq, poff):
        reqs, ends, starts = segments(pq, poff)
        sidx = jnp.sum(ends[None, :] <= lane[:, None], axis=1)  # segment of each lane
        valid = sidx < _SEGMENTS
        sc = jnp.minimum(sidx, _SEGMENTS - 1)
        idx = stream.offset[reqs[sc]] + lane - starts[sc]
        safe = jnp.clip(idx, 0, stream.log_leaf.shape[0] - 1)
        k = jnp.where(leaf_first, stream.log_leaf[safe], stream.log_plain[safe])
        k = jnp.where(valid, k, K)
        live = valid & (kv.at[r, k, 0].get(mode="fill", fill_value=-1) == idx)
        cum = jnp.cumsum(live.astype(jnp.int32))
        need = jnp.maximum(occ - cap, 0)
        got = cum[-1]
        span = jnp.clip(ends[-1], 0, window)  # entries this window could see
        adv = jnp.where(got >= need, jnp.argmax(cum >= need).astype(jnp.int32) + 1, span)
        adv = jnp.where(need > 0, adv, 0)
        # the pointer moves ``adv`` entries: find its segment (skipping empty ones)
        s_new = jnp.sum(ends <= adv)
        poff_new = jnp.where(s_new < _SEGMENTS, adv - starts[jnp.minimum(s_new, _SEGMENTS - 1)], 0)
        # (segments past the list's end have length 0: never step beyond it)
        return occ - jnp.minimum(need, got), jnp.minimum(pq + s_new, cnt), poff_new

    o2, q2, f2 = one_window(occ, pq, poff)
    occ, pq, poff = jnp.where(do, o2, occ), jnp.where(do, q2, pq), jnp.where(do, f2, poff)

    def cond(c):
        occ, pq, _ = c
        return do & (occ > cap) & (pq < cnt)

    occ, pq, poff = jax.lax.while_loop(cond, lambda c: one_window(*c), (occ, pq, poff))
    last = rq[r, jnp.clip(cnt - 1, 0, nq - 1)]
    frontier = stream.offset[last] + stream.n_blocks[last]
    at = rq[r, jnp.minimum(pq, nq - 1)]
    thr = jnp.where(pq < cnt, stream.offset[at] + poff, frontier)
    return occ, pq, poff, thr


def _simulate(stream: Stream, params: Params, key, *, max_replicas: int, per_request: bool, window: int):
    Kn = stream.n_keys
    R = max_replicas
    carry = _Carry(
        kv=jnp.stack([jnp.full((R, Kn), -1, jnp.int32), jnp.zeros((R, Kn), jnp.int32)], axis=-1),
        occ=jnp.zeros(R, jnp.int32),
        ptr=jnp.zeros(R, jnp.int32),
        rq=jnp.zeros((R, stream.arrival_ms.shape[0]), jnp.int32),
        cnt=jnp.zeros(R, jnp.int32),
        pq=jnp.zeros(R, jnp.int32),
        poff=jnp.zeros(R, jnp.int32),
        max_occ=jnp.zeros(R, jnp.int32),
        nreq=jnp.zeros(R, jnp.int32),
        rep=jnp.int32(0),
        hit=jnp.int32(0),
        alive=jnp.bool_(True),
        tok_hi=jnp.int32(0),
        tok_lo=jnp.int32(0),
        req_hit=jnp.int32(0),
    )
    replicas = jnp.clip(params.replicas, 1, R).astype(jnp.int32)
    bt = stream.block_tokens

    # per-request random bits for the random router, drawn once outside the scan
    rbits = jax.random.bits(key, (stream.arrival_ms.shape[0],), jnp.uint32)

    def step(c: _Carry, x):
        ids, pos, req, first, last = x
        n = stream.n_blocks[req]
        now = stream.arrival_ms[req]
        # ---- routing (first chunk of a request)
        kpos = stream.offset[req] + jnp.clip(jnp.minimum(params.prefix_blocks, n) - 1, 0, None)
        has = n > 0
        rv = RequestView(
            index=req,
            arrival_ms=now,
            n_blocks=n,
            prefix_hi=jnp.where(has, stream.key_hi[kpos], jnp.uint32(0)),
            prefix_lo=jnp.where(has, stream.key_lo[kpos], jnp.uint32(0)),
            random_bits=rbits[req],
        )
        chosen = route(params.router, rv, FleetView(c.kv[..., 0], c.ptr, c.occ, replicas), params, key)
        r = jnp.where(first, chosen, c.rep)
        # ---- lookup
        valid = ids < Kn
        # one gather and one scatter of (stamp, time) pairs: with two separate arrays XLA copies
        # the whole state on every step (the writes of one depend on reads of the other)
        got = c.kv.at[r, ids].get(mode="fill", fill_value=-1)
        st, tt = got[:, 0], got[:, 1]
        stored = st >= c.ptr[r]  # lazy eviction: stamps below the pointer are gone
        present = valid & stored & ((now - tt) <= params.ttl_ms)
        alive0 = jnp.where(first, True, c.alive)
        ok = present | ~valid
        run = jnp.cumprod(ok.astype(jnp.int32)) * alive0.astype(jnp.int32)
        hit = jnp.where(first, 0, c.hit) + jnp.sum(run * valid.astype(jnp.int32))
        alive = alive0 & jnp.all(ok)
        # ---- restamp and write
        base = stream.offset[req]
        new_st = jnp.where(params.leaf_first, base + n - 1 - pos, base + pos)
        new_t = jnp.where(params.refresh | ~present, now, tt)
        tgt = jnp.where(valid, ids, Kn)
        kv = c.kv.at[r, tgt].set(jnp.stack([new_st, new_t], axis=-1), mode="drop")
        occ_r = c.occ[r] + jnp.sum((valid & ~stored).astype(jnp.int32))
        # ---- the replica's request list (first chunk), then eviction (last chunk)
        nq = c.rq.shape[1]
        rq = c.rq.at[r, jnp.where(first, c.cnt[r], nq)].set(req, mode="drop")
        cnt_r = c.cnt[r] + first.astype(jnp.int32)
        occ_r, pq_r, poff_r, ptr_r = _evict(
            kv, occ_r, c.pq[r], c.poff[r], r, params.capacity, params.leaf_first,
            stream, rq, cnt_r, window, last,
        )
        occ = c.occ.at[r].set(occ_r)
        ptr = c.ptr.at[r].set(ptr_r)
        cnt = c.cnt.at[r].set(cnt_r)
        pq = c.pq.at[r].set(pq_r)
        poff = c.poff.at[r].set(poff_r)
        # ---- metrics
        real = last & (req < stream.n_requests)
        inp = stream.input_tokens[req]
        # min(hit * bt, input) without overflowing int32: past input // bt full blocks it is input
        hit_tok = jnp.where(hit > inp // bt, inp, hit * bt)
        add = jnp.where(real, hit_tok, 0)
        mask = (1 << _LIMB) - 1
        lo = c.tok_lo + (add & mask)  # < 2**21: no overflow
        tok_hi = c.tok_hi + (add >> _LIMB) + (lo >> _LIMB)
        lo = lo & mask
        max_occ = c.max_occ.at[r].max(jnp.where(last, occ_r, 0))
        nreq = c.nreq.at[r].add(real.astype(jnp.int32))
        req_hit = c.req_hit + (real & (hit > 0)).astype(jnp.int32)
        c = _Carry(kv, occ, ptr, rq, cnt, pq, poff, max_occ, nreq, r, hit, alive, tok_hi, lo, req_hit)
        out = (hit, hit_tok, r) if per_request else ()
        return c, out

    xs = (stream.chunk_ids, stream.chunk_pos, stream.chunk_req, stream.chunk_first, stream.chunk_last)
    c, out = jax.lax.scan(step, carry, xs)
    nr = jnp.maximum(stream.n_requests, 1).astype(jnp.float32)
    tot = c.tok_hi.astype(jnp.float32) * float(1 << _LIMB) + c.tok_lo.astype(jnp.float32)
    if per_request:
        # outputs at each request's last chunk, in request order
        last_idx = _last_chunk_index(stream)
        hit_blocks, hit_tokens, rep = (o[last_idx] for o in out)
    else:
        hit_blocks = hit_tokens = rep = jnp.zeros((0,), jnp.int32)
    return Metrics(
        token_hit_rate=jnp.where(stream.input_total > 0, tot / jnp.maximum(stream.input_total, 1.0), 0.0),
        request_hit_rate=c.req_hit.astype(jnp.float32) / nr,
        hit_tokens_hi=c.tok_hi,
        hit_tokens_lo=c.tok_lo,
        requests_hit=c.req_hit,
        max_occupancy=c.max_occ,
        occupancy=c.occ,
        requests_per_replica=c.nreq,
        hit_blocks=hit_blocks,
        hit_tokens=hit_tokens,
        replica=rep,
        replicas_over_bound=(params.replicas > R) | (params.replicas < 1),
    )


def _last_chunk_index(stream: Stream):
    # index of the last chunk of each real request: chunks are grouped by request in order
    last = stream.chunk_last
    idx = jnp.nonzero(last, size=stream.arrival_ms.shape[0] - 1, fill_value=0)[0]
    return idx


@partial(jax.jit, static_argnames=("max_replicas", "per_request", "window"))
def _simulate_jit(stream, params, key, *, max_replicas, per_request, window):
    return _simulate(stream, params, key, max_replicas=max_replicas, per_request=per_request, window=window)


@partial(jax.jit, static_argnames=("max_replicas", "per_request", "window", "stream_axis"))
def _simulate_grid_jit(stream, params, keys, *, max_replicas, per_request, window, stream_axis):
    fn = partial(_simulate, max_replicas=max_replicas, per_request=per_request, window=window)
    return jax.vmap(fn, in_axes=(0 if stream_axis else None, 0, 0))(stream, params, keys)


def simulate(
    stream: Stream,
    params: Params,
    key: jax.Array,
    *,
    max_replicas: int = 1,
    per_request: bool = True,
    window: int | None = None,
) -> Metrics:
    """Run one configuration over the stream (jit-compiled). ``key``: a PRNG key (``random`` routing).

    ``max_replicas`` is the static bound on replicas; ``per_request`` adds per-request arrays;
    ``window`` is how many log entries one eviction step examines (a speed knob, never a result).
    """
    check_bounds(params, max_replicas)
    window = default_window() if window is None else int(window)
    return _simulate_jit(stream, params, key, max_replicas=max_replicas, per_request=per_request, window=window)


def simulate_grid(
    stream: Stream,
    params: Params,
    keys: jax.Array,
    *,
    max_replicas: int = 1,
    per_request: bool = False,
    window: int | None = None,
    stream_axis: bool = False,
) -> Metrics:
    """Vmapped :func:`simulate` over a grid: ``params`` fields [G], ``keys`` [G] PRNG keys.

    With ``stream_axis=True`` the stream is stacked too (:func:`stack_streams`, leading axis [G]),
    so several workloads (seeds, layouts) run in the same program.
    """
    check_bounds(params, max_replicas)
    window = default_window() if window is None else int(window)
    return _simulate_grid_jit(
        stream, params, keys, max_replicas=max_replicas, per_request=per_request, window=window,
        stream_axis=stream_axis,
    )


def default_window() -> int:
    """Log entries one eviction step examines: small on CPUs (work is serial), wide on accelerators
    (each while-loop iteration costs a device round trip; a wide window needs fewer). Never a result."""
    return 64 if jax.default_backend() == "cpu" else 1024


def check_bounds(params: Params, max_replicas: int) -> None:
    """Raise if a configuration asks for more replicas than the static bound (never clip silently).

    Under an outer trace (params are tracers) the check moves into the metrics: ``replicas_over_bound``.
    """
    if max_replicas < 1:
        raise ValueError("max_replicas must be >= 1")
    if isinstance(params.replicas, jax.core.Tracer):
        return
    r = np.asarray(params.replicas)
    if np.any(r > max_replicas) or np.any(r < 1):
        raise ValueError(f"replicas {np.unique(r).tolist()} outside [1, max_replicas={max_replicas}]")

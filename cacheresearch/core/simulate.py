"""The scan: one step per request (or per ``chunk_runs`` runs of it), composed of components.

``simulate(stream, params, key) -> Metrics`` is a pure, jit-compiled function; ``simulate_grid``
vmaps it over configurations, and :func:`simulate_cells` runs a list of (stream, configuration) cells
grouped by stream and by the state shape each needs, so no stream is ever copied per
configuration. Every swept number is a dynamic field of ``Params``: one compile serves a grid.

A step reads as the pipeline::

    sync (stale view)  ->  loads (queue)  ->  probe (router view)  ->  route  ->
    cache (lookup, write, evict)  ->  queue (dispatch, TTFT)  ->  metrics

Components and their state (the scan carry is made of them):

* :mod:`cacheresearch.cache.store` ``StoreState``: the run store of every replica (and approximate-index rows);
* :mod:`.views` ``SyncState``: the stale view's sync point; ``probe`` gives every replica's match;
* :mod:`.queue` ``QueueState``: the FCFS queue of every replica;
* ``Totals`` (here): counters of the metrics; ``Cursor``: the current request (replica, instance,
  hit so far) for requests that take several steps.

The compiled program returns integers and exact integer sums; the ratios and means (hit rates,
TTFT mean, utilisation, ...) are divided on the host in float64 by :func:`finalize`, so they are
bitwise the same on any batch, chunk, padding or device count.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.cache.blocks import JAX_RULES, BlockState, block_match, block_occ, block_request, init_blocks
from cacheresearch.cache.policies import POLICIES, PRIORITY_IDS, S3FIFO_ID, is_priority
from cacheresearch.cache.priority import COUNT, PRIORITY_FIELDS, STORED, evict_priority
from cacheresearch.cache.s3fifo import S3State, init_s3, s3_request
from cacheresearch.cache.store import StoreState, evict, flush, init_store, leaf_stamp, stored_len
from cacheresearch.core.registry import numba_backend
from cacheresearch.core.stream import Stream, with_block_ids, with_stateful_singletons
from cacheresearch.core.views import SyncState, init_sync, leading, presence, probe, request_view, routing_counts, sync
from cacheresearch.metrics.core import LIMB as _LIMB  # noqa: F401
from cacheresearch.metrics.core import RATIO_FIELDS, Metrics, combine_limbs, finalize, hit_tokens  # noqa: F401
from cacheresearch.metrics.core import add_limbs as _add_limbs
from cacheresearch.metrics.core import percentile as _pct
from cacheresearch.metrics.core import sum_limbs as _sum_limbs
from cacheresearch.replica import fcfs as qm
from cacheresearch.routers import (
    CACHE_ROUTERS,
    LOAD_FREE_ROUTERS,
    REGISTRY,
    ROUTERS,
    VIEWS,
    FleetView,
    ring_positions,
    route,
    router_id,
)

_LIM = qm.LIM

__all__ = ["Metrics", "Static", "nested_fn", "check_stream", "simulate", "simulate_grid", "static_options",
           "check_bounds", "combine_limbs", "default_window", "request_bits", "finalize", "RATIO_FIELDS"]

def request_bits(key: jax.Array, n: int) -> jax.Array:
    """uint32 [n, 4]: each request's random words (column 0: the ``random`` router's draw and the
    tie-breaking offset; 1-2: ``power_of_two``; 3: ``kv_cost`` sampling). Pass them to the reference."""
    b0 = jax.random.bits(key, (n,), jnp.uint32)
    rest = jax.random.bits(jax.random.fold_in(key, 1), (n, 3), jnp.uint32)
    return jnp.concatenate([b0[:, None], rest], axis=1)


class Static(NamedTuple):
    max_replicas: int
    max_instances: int
    queue_slots: int
    match: bool  # compute per-replica prefix matches (cache-reading routers, overflow_share)
    index: bool  # keep approximate indexes
    stale: bool  # keep the as-of-sync fields
    max_vnodes: int
    per_request: bool
    window: int
    routers: tuple  # router ids compiled into the program (a grid may only use these)
    queue: bool = True  # model the replicas' queues (loads, TTFT); off: hit rates only, faster
    priority: bool = False  # keep the priority policies' fields (lfu, length_aware)
    s3: bool = False  # keep s3fifo's per-block queues
    max_depth: int = 0  # most blocks of a request (the length_aware search bound)
    scheduler: str = "fcfs"  # the replica model: fcfs (replica/fcfs.py) or vllm (replica/vllm.py)
    max_running: int = 256  # vllm: running-batch slots per replica (bounds max_num_seqs)
    max_runs: int = 0  # vllm: most runs of a request (its run lists' width)
    blocks: tuple = ()  # libCacheSim's per-block policies compiled into the program (cache/blocks.py)
    block_q: int = 0  # their lists per row (cache.blocks.n_lists: lfu's bound is the most accesses of a block)


class Totals(NamedTuple):
    tok_hi: jax.Array
    tok_lo: jax.Array
    req_hit: jax.Array
    max_occ: jax.Array  # [R]
    nreq: jax.Array  # [R]
    copies: jax.Array  # sum of prefix copies
    copies_n: jax.Array  # sampled requests
    over_n: jax.Array  # requests sent away from their best replica
    over_q: jax.Array  # requests with a cached prefix somewhere


class Cursor(NamedTuple):
    rep: jax.Array  # replica of the current request
    inst: jax.Array  # its router instance
    hit: jax.Array  # hit blocks so far
    alive: jax.Array  # leading run unbroken so far
    match: jax.Array  # [R] the router's view of its match (per-request output)


class Carry(NamedTuple):
    store: StoreState
    s3: S3State
    sync: SyncState
    queue: qm.QueueState
    totals: Totals
    cur: Cursor
    blk: BlockState  # the per-block policies' state (a one-element stand-in when none is compiled)


def _step_inputs(stream: Stream) -> tuple:
    """What the scan reads per step: the step's runs, their lengths and depths, log slots, request, flags."""
    return (stream.step_run, stream.step_len, stream.step_j0, stream.step_q, stream.step_req, stream.step_first,
            stream.step_last)


def _row_fields(st: Static) -> int:
    """Fields per run of a store row: stamp and time, the as-of-sync pair (stale view), the priority fields."""
    return 2 + (2 if st.stale else 0) + (PRIORITY_FIELDS if st.priority else 0)


def _init_carry(stream: Stream, st: Static, policy_id) -> Carry:
    """The scan's initial state: empty stores (replica rows, then the approximate index rows), queues, totals."""
    R, K = st.max_replicas, stream.n_keys
    init = (-1, 0) + ((-1, 0) if st.stale else ()) + ((0,) * PRIORITY_FIELDS if st.priority else ())
    V = st.max_instances * R if st.index else 0
    zR, z = jnp.zeros(R, jnp.int32), jnp.int32(0)
    return Carry(
        store=init_store(R + V, K, stream.log.shape[-2], init),
        s3=init_s3(R, max(stream.n_distinct, 1), stream.block_id.shape[0]) if st.s3 else init_s3(1, 1, 1),
        sync=init_sync(R),
        queue=qm.init_queue(R, st.queue_slots),
        totals=Totals(z, z, z, zR, zR, z, z, z, z),
        cur=Cursor(z, z, z, jnp.bool_(True), zR),
        blk=(init_blocks(st.blocks, policy_id, R, max(stream.n_distinct, 1), st.block_q, st.stale) if st.blocks
             else init_blocks((), policy_id, 1, 1, 1, False)),
    )


def _write_runs(store, g, gall, sl, sy, *, r, rows, vrow, runs, lens, j0s, qs, base, n, e0, now, params, st: Static,
                K: int, E1: int, F: int):
    """Restamp every run of the step on row ``r`` (and the approximate index row ``vrow``): one scatter of
    the new stamps, the entries logged for the lazy LRU pointer, the stored blocks counted."""
    leaf = params.leaf_first
    valid = runs != K
    leaf_b = leaf_stamp(base, n, j0s, lens)
    new_s = jnp.where(leaf, leaf_b, base + j0s)
    present = (sl > 0) & ((now - g[:, 1]) <= params.ttl_ms)
    new_t = jnp.where(params.refresh | ~present, now, g[:, 1])
    fields = [new_s, new_t]
    if st.stale:
        keep = g[:, 0] < sy.frontier  # the old value is the as-of-sync value
        fields += [jnp.where(keep, g[:, 0], g[:, 2]), jnp.where(keep, g[:, 1], g[:, 3])]
    if st.priority:  # count of requests on this row containing the run; all of it stored; its depth
        fields += [g[:, COUNT] + 1, lens, j0s]
    vals = jnp.stack(fields, axis=-1)[None]
    if st.index:  # the index row: leaf-first stamps, no clock
        vals = jnp.concatenate([vals, jnp.stack([leaf_b] + [jnp.zeros_like(leaf_b)] * (F - 1), axis=-1)[None]])
    tgt = jnp.where(runs < K, runs, K)
    lane_e = jnp.where(valid, e0 + qs, 0)
    nv = jnp.sum(valid.astype(jnp.int32))
    wl = jnp.arange(runs.shape[0], dtype=jnp.int32)
    if st.index:
        kv = store.kv.at[rows[:, None], tgt[None, :]].set(vals, mode="drop")
        sli = stored_len(gall[1, :, 0], lens, store.thr[vrow])
        new_blocks = jnp.stack([jnp.sum(jnp.where(valid, lens - sl, 0)), jnp.sum(jnp.where(valid, lens - sli, 0))])
        pos = jnp.where(valid[None, :], store.cnt[rows][:, None] + wl[None, :], E1)
        rq = store.rq.at[rows[:, None], pos].set(jnp.broadcast_to(lane_e, (2, lane_e.shape[0])), mode="drop")
        store = store._replace(kv=kv, rq=rq, cnt=store.cnt.at[rows].add(nv), occ=store.occ.at[rows].add(new_blocks))
    else:
        kv = store.kv.at[r, tgt].set(vals[0], mode="drop")
        rq = store.rq.at[r, jnp.where(valid, store.cnt[r] + wl, E1)].set(lane_e, mode="drop")
        store = store._replace(kv=kv, rq=rq, cnt=store.cnt.at[r].add(nv),
                               occ=store.occ.at[r].add(jnp.sum(jnp.where(valid, lens - sl, 0))))
    return store


def _evict_rows(store, *, r, vrow, cap_r, stream, params, st: Static, prio, is_lfu, last):
    """Evict (last step): the replica row down to its capacity (less pinned blocks under kv_pressure),
    the index row down to index_capacity (always leaf-first)."""
    leaf = params.leaf_first
    if st.priority:
        store = evict(store, r, cap_r, leaf, stream, st.window, last & ~prio)
        kv, o = evict_priority(store.kv, store.occ[r], r, cap_r, stream.run_len, is_lfu, st.max_depth,
                               last & prio)
        store = store._replace(kv=kv, occ=store.occ.at[r].set(o))
    else:
        store = evict(store, r, cap_r, leaf, stream, st.window, last)
    if st.index:
        store = evict(store, vrow, params.index_capacity, jnp.bool_(True), stream, st.window, last)
    return store


def _note_sync(blk, sy, st: Static, first, now, req, params):
    """The per-block state notes the request of a stale view's sync (its as-of-sync copies date from it)."""
    if st.stale and st.blocks:
        did = first & ((~sy.synced) | (now - sy.t >= params.stale_lag_ms))
        blk = blk._replace(ep=jnp.where(did, req, blk.ep))
    return blk


def _block_views(blk, st: Static, params, stream, base, n, active, mt, mv, tree, is_blk):
    """The per-block policies' matches and tree sizes, read from their own state: precise (view 0), as of the
    last sync (view 2), else the router's index rows (``mv``)."""
    if st.match and st.blocks:
        bm, bs = block_match(blk, st.blocks, params.policy, stream.block_id, base, n, st.max_replicas, st.stale)
        bm, bs = jnp.where(active, bm, 0), jnp.where(active, bs, 0)
        bv = jnp.where(params.view == 0, bm, jnp.where(params.view == 2, bs, mv))
        mt, mv = jnp.where(is_blk, bm, mt), jnp.where(is_blk, bv, mv)
    if st.blocks:
        tree = jnp.where(is_blk, block_occ(blk, st.blocks, params.policy), tree)
    return mt, mv, tree


def _per_block_request(s3, blk, st: Static, params, stream, r, base, n, cap_r, hit, occ_r, real, req, is_s3, is_blk,
                       knobs):
    """The policies with per-block state serve the whole request at its last step (their own lookup):
    s3fifo_sosp's queues, libCacheSim's per-block policies (one get per block)."""
    if st.s3:
        s3, hit3 = s3_request(s3, r, stream.block_id, base, n, cap_r, real & is_s3)
        hit = jnp.where(is_s3, hit3, hit)
        occ_r = jnp.where(is_s3, s3.occ[r], occ_r)
    if st.blocks:
        blk, hitb, _, occb = block_request(blk, st.blocks, params.policy, r, stream.block_id, base, n, cap_r, knobs,
                                           real & is_blk, req, st.stale)
        hit = jnp.where(is_blk, hitb, hit)
        occ_r = jnp.where(is_blk, occb, occ_r)
    return s3, blk, hit, occ_r


def _simulate(stream: Stream, params, key, st: Static):
    if st.scheduler == "vllm":
        from cacheresearch.replica.vllm import simulate_vllm  # noqa: PLC0415

        return simulate_vllm(stream, params, key, st, request_bits, _finish_vllm)
    K, R = stream.n_keys, st.max_replicas
    F = _row_fields(st)
    N1, E1 = stream.arrival_ms.shape[0], stream.log.shape[-2]
    zR = jnp.zeros(R, jnp.int32)
    carry = _init_carry(stream, st, params.policy)
    replicas = jnp.clip(params.replicas, 1, R).astype(jnp.int32)
    instances = jnp.clip(params.instances, 1, st.max_instances).astype(jnp.int32)
    ridx = jnp.arange(R, dtype=jnp.int32)
    active = ridx < replicas
    bt = stream.block_tokens
    bits = request_bits(key, N1)  # per-request random words, drawn once outside the scan
    ring = ring_positions(R, st.max_vnodes)
    leaf = params.leaf_first
    prio = is_priority(params.policy) if st.priority else None
    is_lfu = params.policy == POLICIES["lfu_perfect"].id
    is_s3 = params.policy == S3FIFO_ID
    is_blk = jnp.isin(params.policy, jnp.asarray([POLICIES[p].id for p in st.blocks] or [-1], jnp.int32))
    blk_knobs = _block_knobs(params)

    def step(c: Carry, x):
        runs, lens, j0s, qs, req, first, last = x
        n = stream.n_blocks[req]
        now = stream.arrival_ms[req]
        base = stream.offset[req]
        e0 = stream.entry0[req]
        u = jnp.where(first, jnp.mod(req, instances), c.cur.inst)
        store = c.store
        # ---- cache event: replica restart_replica restarts at restart_ms; its cache is flushed first
        prev = stream.arrival_ms[jnp.maximum(req - 1, 0)]
        boot = (first & (params.restart_replica >= 0) & (now >= params.restart_ms)
                & ((req == 0) | (prev < params.restart_ms)))
        store = flush(store, jnp.clip(params.restart_replica, 0, R - 1), base, boot)
        # ---- sync (stale view, before routing); the per-block state notes the request of the sync
        blk = _note_sync(c.blk, c.sync, st, first, now, req, params)
        sy = sync(c.sync, first, now, base, store.thr[:R], params.stale_lag_ms) if st.stale else c.sync
        # ---- loads at arrival
        if st.queue:
            queue, act_blocks, pinned_all = qm.loads(c.queue, now, u, params.local_load)
        else:
            queue = act_blocks = pinned_all = zR
        # ---- probe: every replica's match in the router's view (first step only)
        if st.match:
            mt, mv = probe(store, sy, stream, e0, jnp.where(first, stream.n_runs[req], 0), now, u, params,
                           R=R, stale=st.stale, index=st.index, active=active, prio=prio)
        else:
            mt = mv = zR
        mt, mv, tree = _block_views(blk, st, params, stream, base, jnp.where(first, n, 0), active, mt, mv,
                                    store.occ[:R], is_blk)
        if st.index:
            tree = jnp.where(params.view == 1, store.occ[R + u * R + ridx], tree)
        # ---- route
        rv, pb = request_view(stream, req, now, bits[req], u, params.prefix_blocks)
        fv = FleetView(replicas=replicas, match=mv, queue=queue, active_blocks=act_blocks, tree_size=tree)
        chosen = route(params.router, rv, fv, params, ring, compiled=st.routers)
        r = jnp.where(first, chosen, c.cur.rep)
        # ---- routing metrics (prefix copies: replicas whose leading run covers the routing prefix)
        t = c.totals
        copies_i, sample, qual, away = routing_counts(mt, mt[jnp.clip(chosen, 0, R - 1)], pb, n, active,
                                                      first & (req < stream.n_requests), st.match)
        t = t._replace(
            over_q=t.over_q + qual.astype(jnp.int32),
            over_n=t.over_n + away.astype(jnp.int32),
            copies=t.copies + jnp.where(sample, copies_i, 0),
            copies_n=t.copies_n + sample.astype(jnp.int32),
        )
        match_r = jnp.where(first, mv, c.cur.match)
        # ---- cache: lookup on row r (and the approximate index row of (u, r)), one gather, one scatter
        valid = runs != K
        vrow = R + u * R + r
        rows = jnp.stack([r, vrow]) if st.index else r[None]
        if st.index:
            gall = store.kv.at[rows[:, None], runs[None, :]].get(mode="fill", fill_value=-1)  # [2, W, F]
        else:  # scalar row: a plain dynamic gather (an index-array gather is slower under vmap)
            gall = store.kv.at[r, runs].get(mode="fill", fill_value=-1)[None]
        g = gall[0]
        sl = stored_len(g[:, 0], lens, store.thr[r])
        if st.priority:
            sl = jnp.where(prio, g[:, STORED], sl)
        full, part = presence(g, lens, store.thr[r], now, params.ttl_ms, leaf, sl)
        alive0 = jnp.where(first, True, c.cur.alive)
        hit0 = jnp.where(first, 0, c.cur.hit)
        hit, alive = leading(hit0, alive0, lens, valid, full, part)
        # ---- write: restamp every run of the step
        store = _write_runs(store, g, gall, sl, sy, r=r, rows=rows, vrow=vrow, runs=runs, lens=lens, j0s=j0s, qs=qs,
                            base=base, n=n, e0=e0, now=now, params=params, st=st, K=K, E1=E1, F=F)
        # ---- evict (last step)
        cap_r = jnp.where(params.kv_pressure, jnp.maximum(params.capacity - pinned_all[r], 0), params.capacity)
        store = _evict_rows(store, r=r, vrow=vrow, cap_r=cap_r, stream=stream, params=params, st=st, prio=prio,
                            is_lfu=is_lfu, last=last)
        # ---- s3fifo: per-block queues, the whole request at its last step (its own lookup)
        s3, blk, hit, occ_r = _per_block_request(c.s3, blk, st, params, stream, r, base, n, cap_r, hit,
                                                 store.occ[r], last & (req < stream.n_requests), req, is_s3, is_blk,
                                                 blk_knobs)
        # ---- metrics
        real = last & (req < stream.n_requests)
        inp = stream.input_tokens[req]
        hit_tok = hit_tokens(hit, bt, inp)
        tok_hi, tok_lo = _add_limbs(t.tok_hi, t.tok_lo, jnp.where(real, hit_tok, 0))
        t = t._replace(
            tok_hi=tok_hi, tok_lo=tok_lo,
            max_occ=t.max_occ.at[r].max(jnp.where(last, occ_r, 0)),
            nreq=t.nreq.at[r].add(real.astype(jnp.int32)),
            req_hit=t.req_hit + (real & (hit > 0)).astype(jnp.int32),
        )
        # ---- queue (last step): FCFS, prefill of the uncached tokens, decode share
        if st.queue:
            qs_, ttft = qm.dispatch(c.queue, r, now, real, inp - hit_tok, stream.output_tokens[req], n, u, params)
        else:
            qs_, ttft = c.queue, jnp.int32(0)
        c = Carry(store, s3, sy, qs_, t, Cursor(r, u, hit, alive, match_r), blk)
        out = (ttft,) + ((hit, hit_tok, r, match_r) if st.per_request else ())
        return c, out

    c, out = jax.lax.scan(step, carry, _step_inputs(stream))
    return _finish(stream, params, c, out, st, active, replicas, is_s3)


def _block_knobs(params):
    """libCacheSim S3FIFO's (small size, ghost size, promotion threshold): the sizes are derived on the host by
    :func:`~cacheresearch.core.params.make_params` (``int(C * ratio)``, a double product, truncated)."""
    return (params.s3fifo_small.astype(jnp.int32), params.s3fifo_ghost.astype(jnp.int32),
            params.s3fifo_promote.astype(jnp.int32))


def _occupancy(c: Carry, st: Static, params, is_s3):
    occ = c.store.occ[:c.totals.max_occ.shape[0]]
    if st.s3:
        occ = jnp.where(is_s3, c.s3.occ, occ)
    if st.blocks:
        blk = jnp.isin(params.policy, jnp.asarray([POLICIES[p].id for p in st.blocks], jnp.int32))
        occ = jnp.where(blk, block_occ(c.blk, st.blocks, params.policy), occ)
    return occ


def _finish(stream, params, c: Carry, out, st: Static, active, replicas, is_s3) -> Metrics:
    """Metrics of an fcfs run: integers and exact sums; the ratio fields are left NaN for :func:`finalize`."""
    R = st.max_replicas
    N1 = stream.arrival_ms.shape[0]
    t, q = c.totals, c.queue
    nreal = stream.n_requests
    last_idx = jnp.nonzero(stream.step_last, size=N1 - 1, fill_value=0)[0]  # steps are grouped by request
    ttft_req = out[0][last_idx]
    is_real = jnp.arange(N1 - 1) < nreal
    srt = jnp.sort(jnp.where(is_real, ttft_req, _LIM))

    def pct(p):
        return _pct(srt, nreal, p, N1 - 1) if st.queue else jnp.int32(-1)

    first_arr = stream.arrival_ms[0]
    last_arr = stream.arrival_ms[jnp.maximum(nreal - 1, 0)]
    horizon = jnp.maximum(jnp.maximum(jnp.max(q.busy), last_arr) - first_arr, 1).astype(jnp.int32)
    if st.per_request:
        hit_blocks, hit_tokens, rep, mreq = (o[last_idx] for o in out[1:])
        ttft_ms = ttft_req
    else:
        hit_blocks = hit_tokens = rep = ttft_ms = jnp.zeros((0,), jnp.int32)
        mreq = jnp.zeros((0, R), jnp.int32)
    nan = jnp.float32(jnp.nan)
    z = jnp.int32(0)
    inp_hi, inp_lo = _sum_limbs(jnp.where(is_real, stream.input_tokens[:N1 - 1], 0))
    ttft_hi, ttft_lo = _sum_limbs(jnp.where(is_real, ttft_req, 0))
    zf = jnp.zeros(R, jnp.float32)
    return Metrics(
        token_hit_rate=nan, request_hit_rate=nan,
        hit_tokens_hi=t.tok_hi,
        hit_tokens_lo=t.tok_lo,
        requests_hit=t.req_hit,
        max_occupancy=t.max_occ,
        occupancy=_occupancy(c, st, params, is_s3),
        requests_per_replica=t.nreq,
        ttft_p50_ms=pct(50),
        ttft_p90_ms=pct(90),
        ttft_p99_ms=pct(99),
        ttft_mean_ms=nan,
        busy_ms=q.busy_ms,
        utilisation=jnp.full(R, jnp.nan, jnp.float32), load_imbalance=nan, prefix_copies=nan, overflow_share=nan,
        queue_overflow=q.qover,
        time_overflow=q.tover,
        hit_blocks=hit_blocks,
        hit_tokens=hit_tokens,
        replica=rep,
        ttft_ms=ttft_ms,
        match=mreq,
        replicas_over_bound=(params.replicas > R) | (params.replicas < 1),
        tpot_mean_ms=nan, e2e_p50_ms=jnp.int32(-1), e2e_p90_ms=jnp.int32(-1), e2e_p99_ms=jnp.int32(-1),
        preemptions=jnp.int32(0), kv_util_mean=nan, kv_util_max=nan, queue_len_mean=nan, throughput_tps=nan,
        dropped=jnp.int32(0), steps=jnp.int32(0), events=jnp.int32(0),
        e2e_ms=jnp.zeros((0,), jnp.int32), preempted=jnp.zeros((0,), jnp.int32),
        client_wait_ms=jnp.zeros((0,), jnp.int32),
        kv_acc_at=jnp.zeros((0,), jnp.float32), q_acc_at=jnp.zeros((0,), jnp.float32),
        n_requests=jnp.asarray(nreal, jnp.int32), input_tokens_hi=inp_hi, input_tokens_lo=inp_lo,
        ttft_sum_hi=ttft_hi, ttft_sum_lo=ttft_lo, ttft_n=jnp.asarray(nreal, jnp.int32),
        busy_time=q.busy_ms, horizon_time=horizon, replicas_active=replicas.astype(jnp.int32),
        copies_sum=t.copies, copies_n=t.copies_n, over_n=t.over_n, over_q=t.over_q,
        tpot_ms_hi=z, tpot_ms_lo=z, tpot_ns_hi=z, tpot_ns_lo=z, tpot_n=z,
        output_tokens_hi=z, output_tokens_lo=z, kv_capacity=jnp.asarray(params.capacity, jnp.int32),
        kv_acc=zf, q_acc=zf,
        requests_ok=jnp.asarray(nreal, jnp.int32), requests_timed_out=z, requests_failed=z,
        status=jnp.zeros((0,), jnp.int32), vllm_counters_hi=jnp.zeros(4, jnp.int32),
        vllm_counters_lo=jnp.zeros(4, jnp.int32),
    )


def _finish_vllm(stream, params, c, st: Static, active, replicas) -> Metrics:
    """Metrics of a vllm-replica run (replica/vllm.py) from its final carry: integers, exact sums and the
    replicas' float32 accumulators; the ratio fields are left NaN for :func:`finalize`."""
    from cacheresearch.replica.clock import t_ceil_ms, t_div, t_sub  # noqa: PLC0415

    R = st.max_replicas
    N1 = stream.arrival_ms.shape[0]
    N = N1 - 1
    bt = stream.block_tokens
    nreal = stream.n_requests
    is_real = jnp.arange(N) < nreal
    arr = stream.arrival_ms[:N]
    ttft_t = jax.tree.map(lambda x: x[:N], c.ttft_t)
    fin_t = jax.tree.map(lambda x: x[:N], c.fin_t)
    served = is_real & (fin_t.ms >= 0)
    ttft_ms = jnp.where(served, t_ceil_ms(ttft_t) - arr, -1)
    e2e_ms = jnp.where(served, t_ceil_ms(fin_t) - arr, -1)
    inp = stream.input_tokens[:N]
    out = stream.output_tokens[:N]
    hit_b = jnp.where(served, c.hit_b[:N], 0)
    hit_tok = hit_tokens(hit_b, bt, inp)
    t0 = stream.arrival_ms[0]
    lat = served & (arr - t0 >= params.warmup_ms)
    nl = jnp.sum(lat.astype(jnp.int32))
    srt_t = jnp.sort(jnp.where(lat, ttft_ms, _LIM))
    srt_e = jnp.sort(jnp.where(lat, e2e_ms, _LIM))
    # TPOT per request in whole ns: (finish - first token) / (output tokens - 1) by exact long division,
    # whole ms and the ns below (output tokens up to 2,000,001)
    multi = lat & (out >= 2)
    d = t_sub(fin_t, ttft_t)
    k = jnp.clip(out - 1, 1, 2_000_000)
    q_ms, q_ns = t_div(jax.tree.map(lambda x: jnp.where(multi, x, 0), d), k)
    nm = jnp.sum(multi.astype(jnp.int32))
    reps = c.reps
    stt = reps.stats
    last_ms = jnp.max(jnp.where(served, t_ceil_ms(fin_t), 0))
    horizon_ms = jnp.maximum(jnp.maximum(last_ms, arr[jnp.maximum(nreal - 1, 0)]) - t0, 1)
    busy_ms = t_ceil_ms(stt.busy)
    nan = jnp.float32(jnp.nan)
    hr = jnp.clip(jnp.where(served, c.rep_of[:N], 0), 0, R - 1)
    if st.per_request:
        per = dict(hit_blocks=hit_b, hit_tokens=hit_tok, replica=jnp.where(is_real, c.rep_of[:N], -1), ttft_ms=ttft_ms,
                   match=jnp.zeros((N, R), jnp.int32), e2e_ms=e2e_ms, preempted=c.npre[:N],
                   client_wait_ms=jnp.zeros((N,), jnp.int32), kv_acc_at=c.acc_kv[:N], q_acc_at=c.acc_q[:N],
                   status=jnp.where(served, 0, 2).astype(jnp.int32))
    else:
        z0 = jnp.zeros((0,), jnp.int32)
        per = dict(hit_blocks=z0, hit_tokens=z0, replica=z0, ttft_ms=z0, match=jnp.zeros((0, R), jnp.int32),
                   e2e_ms=z0, preempted=z0, client_wait_ms=z0, kv_acc_at=z0.astype(jnp.float32),
                   q_acc_at=z0.astype(jnp.float32), status=z0)
    hit_hi, hit_lo = _sum_limbs(jnp.where(served, hit_tok, 0))
    inp_hi, inp_lo = _sum_limbs(jnp.where(is_real, inp, 0))
    ttft_hi, ttft_lo = _sum_limbs(jnp.where(lat, ttft_ms, 0))
    tq_hi, tq_lo = _sum_limbs(jnp.where(multi, q_ms, 0))
    tf_hi, tf_lo = _sum_limbs(jnp.where(multi, q_ns, 0))
    out_hi, out_lo = _sum_limbs(jnp.where(served, out, 0))
    nok = jnp.sum(served.astype(jnp.int32))
    return Metrics(
        token_hit_rate=nan, request_hit_rate=nan,
        hit_tokens_hi=hit_hi, hit_tokens_lo=hit_lo,
        requests_hit=jnp.sum((served & (hit_b > 0)).astype(jnp.int32)),
        max_occupancy=jnp.where(active, stt.kv_max, 0),
        occupancy=jnp.where(active, reps.pool.cached, 0),
        requests_per_replica=jnp.zeros(R, jnp.int32).at[hr].add(served.astype(jnp.int32)),
        ttft_p50_ms=_pct(srt_t, nl, 50, N), ttft_p90_ms=_pct(srt_t, nl, 90, N), ttft_p99_ms=_pct(srt_t, nl, 99, N),
        ttft_mean_ms=nan,
        busy_ms=busy_ms,
        utilisation=jnp.full(R, jnp.nan, jnp.float32), load_imbalance=nan, prefix_copies=nan, overflow_share=nan,
        queue_overflow=jnp.sum(jnp.where(active, stt.dropped, 0)),
        time_overflow=jnp.any(stt.tover) | jnp.any(stt.stuck),
        replicas_over_bound=(params.replicas > R) | (params.replicas < 1),
        tpot_mean_ms=nan,
        e2e_p50_ms=_pct(srt_e, nl, 50, N), e2e_p90_ms=_pct(srt_e, nl, 90, N), e2e_p99_ms=_pct(srt_e, nl, 99, N),
        preemptions=jnp.sum(jnp.where(active, stt.preempt, 0)),
        kv_util_mean=nan, kv_util_max=nan, queue_len_mean=nan, throughput_tps=nan,
        dropped=jnp.sum(jnp.where(active, stt.dropped + stt.rejected, 0)),
        steps=jnp.sum(jnp.where(active, stt.steps, 0)),
        events=c.events,
        **per,
        n_requests=jnp.asarray(nreal, jnp.int32), input_tokens_hi=inp_hi, input_tokens_lo=inp_lo,
        ttft_sum_hi=ttft_hi, ttft_sum_lo=ttft_lo, ttft_n=nl,
        busy_time=busy_ms, horizon_time=horizon_ms.astype(jnp.int32), replicas_active=replicas.astype(jnp.int32),
        copies_sum=c.copies, copies_n=c.copies_n, over_n=c.over_n, over_q=c.over_q,
        tpot_ms_hi=tq_hi, tpot_ms_lo=tq_lo, tpot_ns_hi=tf_hi, tpot_ns_lo=tf_lo, tpot_n=nm,
        output_tokens_hi=out_hi, output_tokens_lo=out_lo, kv_capacity=jnp.asarray(params.capacity, jnp.int32),
        kv_acc=jnp.where(active, stt.kv_acc, 0.0), q_acc=jnp.where(active, stt.q_acc, 0.0),
        requests_ok=nok, requests_timed_out=jnp.int32(0), requests_failed=jnp.asarray(nreal, jnp.int32) - nok,
        vllm_counters_hi=jnp.zeros(4, jnp.int32), vllm_counters_lo=jnp.zeros(4, jnp.int32),
    )


@partial(jax.jit, static_argnames=("st",))
def _simulate_jit(stream, params, key, *, st):
    return _simulate(stream, params, key, st)


def _grid_fn(st: Static, stream_axis: bool):
    fn = partial(_simulate, st=st)
    return jax.vmap(fn, in_axes=(0 if stream_axis else None, 0, 0))


@partial(jax.jit, static_argnames=("st", "stream_axis"))
def _simulate_grid_jit(stream, params, keys, *, st, stream_axis):
    return _grid_fn(st, stream_axis)(stream, params, keys)


def nested_fn(st: Static):
    """[S streams] x [C configurations per stream]: streams are never copied per configuration. The
    program's metrics are unfinalized (ratio fields NaN): pass them to :func:`finalize` with ``st``."""
    inner = jax.vmap(partial(_simulate, st=st), in_axes=(None, 0, 0))
    return jax.vmap(inner, in_axes=(0, 0, 0))



def static_options(
    params,
    *,
    max_replicas: int = 1,
    max_instances: int | None = None,
    queue_slots: int = 64,
    match: bool | None = None,
    index: bool | None = None,
    stale: bool | None = None,
    max_vnodes: int = 128,
    per_request: bool = False,
    window: int | None = None,
    routers_compiled=None,
    queue: bool = True,
    priority: bool | None = None,
    max_depth: int = 0,
    s3: bool | None = None,
    scheduler: str = "fcfs",
    max_running: int = 256,
    max_runs: int = 0,
    blocks: tuple | None = None,
    block_q: int = 0,
) -> Static:
    """The static shape options of a run, with ``None`` resolved from the (concrete) params.

    ``match``: compute every replica's prefix match per request (needed by the cache-reading
    routers and for ``overflow_share``; default: when a cache-reading router is in the grid);
    ``index``: keep the approximate indexes (default: when a cache router uses view ``approximate``);
    ``stale``: keep the as-of-sync fields (default: when view ``stale`` is used); ``max_instances``:
    router instances bound (default: the largest in the grid); ``queue_slots``: in-flight requests
    tracked per replica; ``max_vnodes``: the chwbl ring's bound; ``routers_compiled``: the router
    rules built into the program (default: those in the grid; fewer rules compile faster); ``queue``:
    model the replicas' queues (loads and TTFT); ``False`` gives hit rates only, faster per step
    (TTFT percentiles -1, TTFT mean and load imbalance NaN; routers that read load are refused).
    """
    concrete = not isinstance(params.router, jax.core.Tracer)
    if concrete:
        routers = np.asarray(params.router).reshape(-1)
        views = np.broadcast_to(np.asarray(params.view), np.shape(np.asarray(params.router))).reshape(-1)
        cache = np.isin(routers, [ROUTERS[n] for n in CACHE_ROUTERS])
        if match is None:
            match = bool(cache.any())
        if index is None:
            index = bool(match and (cache & (views == VIEWS["approximate"])).any())
        if stale is None:
            stale = bool(match and (cache & (views == VIEWS["stale"])).any())
        if max_instances is None:
            max_instances = int(np.max(np.asarray(params.instances)))
        compiled = tuple(sorted({int(x) for x in routers}))
        if priority is None:
            priority = bool(np.isin(np.asarray(params.policy), PRIORITY_IDS).any())
        if s3 is None:
            s3 = bool((np.asarray(params.policy) == S3FIFO_ID).any())
        if blocks is None:
            present = {int(x) for x in np.asarray(params.policy).reshape(-1)}
            blocks = tuple(n for n, p in POLICIES.items() if p.engine == "blocks" and p.id in present)
    else:
        priority = bool(priority)
        s3 = bool(s3)
        blocks = tuple(blocks or ())
        compiled = tuple(ROUTERS.values())
        match = bool(match) if match is not None else True
        index = bool(index) if index is not None else False
        stale = bool(stale) if stale is not None else False
        max_instances = 1 if max_instances is None else max_instances
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler {scheduler!r}: one of {list(SCHEDULERS)}")
    if max_running < 1:
        raise ValueError("max_running must be >= 1")
    if queue_slots < 1 or max_vnodes < 1 or max_instances < 1:
        raise ValueError("queue_slots, max_vnodes and max_instances must be >= 1")
    window = default_window() if window is None else int(window)
    if window < 1:
        raise ValueError("window must be >= 1")
    if routers_compiled is not None:
        compiled = tuple(sorted({router_id(r) if isinstance(r, str) else int(r) for r in routers_compiled}))
    return Static(int(max_replicas), int(max_instances), int(queue_slots), bool(match), bool(index), bool(stale),
                  int(max_vnodes), bool(per_request), window, compiled, bool(queue), priority=bool(priority),
                  s3=bool(s3), max_depth=int(max_depth) if priority else 0, scheduler=str(scheduler),
                  max_running=int(max_running) if scheduler == "vllm" else 1,
                  max_runs=int(max_runs) if scheduler == "vllm" else 0, blocks=_block_names(blocks),
                  block_q=int(block_q) if blocks else 0)


def _block_names(blocks) -> tuple:
    """The per-block policies of a program, in the registry's order; anything else is refused."""
    blocks = tuple(blocks or ())
    bad = [b for b in blocks if b not in POLICIES or POLICIES[b].engine != "blocks"]
    if bad:
        raise ValueError(f"blocks: {bad} are not per-block policies; those are "
                         f"{[n for n, p in POLICIES.items() if p.engine == 'blocks']}")
    return tuple(n for n in POLICIES if n in blocks)


#: Replica models: ``fcfs`` (one FCFS server per replica, prefill at a rate; replica/fcfs.py) and ``vllm``
#: (continuous batching over one KV pool per replica; replica/vllm.py).
SCHEDULERS = ("fcfs", "vllm")
#: Cache policies the JAX vllm replica's pool implements (vLLM's free queue is leaf-first LRU). The numba vllm
#: backend's pool orders, and why the pool refuses the others, are that backend's own table
#: (:func:`cacheresearch.core.registry.numba_backend` ``("vllm")``: ``policies``, ``refused``).
VLLM_POLICIES = ("lru", "unbounded")


def default_window() -> int:
    """Log entries one eviction step examines: small on CPUs (work is serial), wide on accelerators
    (each while-loop iteration costs a device round trip; a wide window needs fewer). Never a result."""
    return 16 if jax.default_backend() == "cpu" else 256


def check_bounds(params, max_replicas: int, st: Static | None = None, backend: str = "jax") -> None:
    """Raise if a configuration does not fit the static bounds (never clip silently): more replicas
    than ``max_replicas``; with the static options ``st``, more router instances or vnodes than their
    bounds, or a router/view whose state the options leave out (``match``, ``index``, ``stale``).

    Under an outer trace (params are tracers) the check moves into the metrics: ``replicas_over_bound``.
    """
    if max_replicas < 1:
        raise ValueError("max_replicas must be >= 1")
    if isinstance(params.replicas, jax.core.Tracer):
        return
    r = np.asarray(params.replicas)
    if np.any(r > max_replicas) or np.any(r < 1):
        raise ValueError(f"replicas {np.unique(r).tolist()} outside [1, max_replicas={max_replicas}]")
    if st is None:
        return
    if np.any(np.asarray(params.instances) > st.max_instances):
        raise ValueError(f"instances {np.unique(np.asarray(params.instances)).tolist()} above "
                         f"max_instances={st.max_instances}")
    if np.any(np.asarray(params.vnodes) > st.max_vnodes):
        raise ValueError(f"vnodes above max_vnodes={st.max_vnodes}")
    routers = np.asarray(params.router).reshape(-1)
    if backend != "numba":
        norule = [r for r in REGISTRY.routers() if r.rule is None and r.id in set(int(x) for x in routers)]
        if norule:
            raise ValueError(f"router {norule[0].name!r} on the JAX engine: it has a numba rule and no JAX rule"
                             f"{' (it keeps state across requests)' if norule[0].stateful else ''}; run it on "
                             "engine.backend=numba or auto, where a numba engine models the rest of the configuration")
        for r in REGISTRY.routers():  # a JAX rule that models its router's state knob at 0 only
            if r.rule is not None and r.stateful and r.state_knob:
                kv = np.broadcast_to(np.asarray(getattr(params, r.state_knob)), np.shape(np.asarray(params.router)))
                if ((np.asarray(params.router) == r.id) & (kv > 0)).any():
                    raise ValueError(f"router {r.name!r} with {r.state_knob} > 0 on the JAX engine: it then keeps "
                                     "state across requests, which the JAX scan does not carry; run it on "
                                     "engine.backend=numba or auto, where a numba engine models the rest of the "
                                     "configuration")
    missing = sorted(set(int(x) for x in routers) - set(st.routers))
    if missing:
        names = [n for n, i in ROUTERS.items() if i in missing]
        raise ValueError(f"routers {names} are not compiled into this program (routers_compiled)")
    load_free = {ROUTERS[n] for n in LOAD_FREE_ROUTERS}
    if not st.queue and (set(int(x) for x in routers) - load_free or np.any(np.asarray(params.kv_pressure))):
        raise ValueError("routers that read load and kv_pressure need queue=True")
    views = np.broadcast_to(np.asarray(params.view), np.shape(np.asarray(params.router))).reshape(-1)
    cache = np.isin(routers, [ROUTERS[n] for n in CACHE_ROUTERS])
    if cache.any() and not st.match:
        raise ValueError("a cache-reading router needs match=True")
    if (cache & (views == VIEWS["approximate"])).any() and not st.index:
        raise ValueError("view 'approximate' needs index=True")
    if (cache & (views == VIEWS["stale"])).any() and not st.stale:
        raise ValueError("view 'stale' needs stale=True")
    if (cache & (views == VIEWS["gie_estimate"])).any() and st.scheduler != "vllm":
        raise ValueError("view 'gie_estimate' (GIE's prefix index) is modelled with the vllm replica only "
                         "(scheduler='vllm')")
    if np.any(np.asarray(params.load_refresh_ms) > 0) and st.scheduler != "vllm":
        raise ValueError("load_refresh_ms (scraped load metrics) is modelled with the vllm replica only")
    if np.any(np.asarray(params.load_gauges) > 0) and st.scheduler != "vllm":
        raise ValueError("load_gauges (vLLM's published gauges) is modelled with the vllm replica only")
    if np.any(np.asarray(params.client_permits) > 0) and st.scheduler != "vllm":
        raise ValueError("client_permits (a closed-loop client) is modelled with the vllm replica only")
    if (np.any(np.asarray(params.kv_groups) > 1) or np.any(np.asarray(params.kv_window_groups) != 0)) \
            and st.scheduler != "vllm":
        raise ValueError("kv_groups (a hybrid KV layout) is modelled with the vllm replica only")
    if np.any(np.asarray(params.client_timeout_ms) > 0) and st.scheduler != "vllm":
        raise ValueError("client_timeout_ms (the client's timeouts) is modelled with the vllm replica only")
    blk = sorted({n for n, p in POLICIES.items() if p.id in set(np.asarray(params.policy).reshape(-1).tolist())
                  and p.engine == "blocks"})
    if backend != "numba" and st.scheduler != "vllm":
        nojax = [b for b in blk if b not in JAX_RULES]
        if nojax:
            raise ValueError(f"policy {nojax[0]!r} on the JAX engine: it has a numba kernel and no JAX rule "
                             "(cacheresearch/cache/blocks.py); run it on engine.backend=numba or auto")
    if set(blk) - set(st.blocks):
        raise ValueError(f"policies {sorted(set(blk) - set(st.blocks))} keep per-block state that this program "
                         "does not compile (static option blocks=)")
    if blk and np.any(np.asarray(params.restart_replica).reshape(-1) >= 0):
        raise ValueError(f"a replica restart (restart_replica) with the per-block policies {blk}: a restart's "
                         "flush is modelled on the run store (LRU and TTL policies) only")
    prio = np.isin(np.asarray(params.policy).reshape(-1), PRIORITY_IDS)
    if prio.any() and not st.priority:
        raise ValueError("policies lfu_perfect and length_aware need priority=True")
    if st.priority and st.stale:
        raise ValueError("the stale router view is not available with the priority policies (lfu_perfect, "
                         "length_aware): the stale view's as-of-sync copy of a run "
                         "holds its stamp and time, not the stored length and count that decide presence under "
                         "these policies")
    s3 = np.asarray(params.policy).reshape(-1) == S3FIFO_ID
    restart = np.asarray(params.restart_replica).reshape(-1) >= 0
    if restart.any() and (prio.any() or s3.any()):
        raise ValueError("a replica restart (restart_replica) is available with the LRU and TTL policies only")
    if np.any(np.asarray(params.restart_replica) >= max_replicas):
        raise ValueError(f"restart_replica must be below max_replicas={max_replicas}")
    if restart.any() and st is not None and st.scheduler == "vllm":
        raise ValueError("a replica restart (restart_replica) is modelled with the fcfs replica only")
    if s3.any() and not st.s3:
        raise ValueError("policy s3fifo_sosp needs s3=True")
    if st.scheduler == "vllm":
        names = {p.id: n for n, p in POLICIES.items()}
        pool = numba_backend("vllm")  # the pool's orders on the numba vllm backend, and why it refuses the rest
        bad = sorted({names[int(x)] for x in np.asarray(params.policy).reshape(-1)} - set(pool.policies))
        if bad:
            raise ValueError(f"policy {bad[0]!r} on the vllm replica: {pool.refused.get(bad[0], 'not a pool order')}; "
                             f"the vllm pool takes {list(pool.policies)}")
        bad = sorted({names[int(x)] for x in np.asarray(params.policy).reshape(-1)} - set(VLLM_POLICIES))
        if bad and backend != "numba":
            raise ValueError(f"policies {bad} on the JAX vllm replica: its pool is vLLM's leaf-first LRU over runs (no "
                             "per-block lists, no release clock); run them on engine.backend=numba or auto (numba "
                             "installed)")
        if not st.queue:
            raise ValueError("the vllm replica needs queue=True")
        if np.any(np.asarray(params.max_num_seqs) > st.max_running):
            raise ValueError(f"max_num_seqs above the static bound max_running={st.max_running}")
    if (s3 & cache).any():
        raise ValueError("policy s3fifo_sosp keeps per-block queues that the cache-reading routers' views do not read: "
                         "use a router that reads no cache state with it")


def serve_needs(st: Static) -> tuple[bool, bool]:
    """What :func:`serve_stream` derives for program ``st``: (every run stateful, block ids); programs with the
    same needs are served the same stream."""
    return bool(st.priority or st.scheduler == "vllm"), bool(st.s3 or st.blocks)


def serve_stream(stream: Stream, st: Static) -> Stream:
    """What the program ``st`` needs from a stream, derived from it (``compile_stream(w)`` serves every
    policy): every run stateful for the priority policies and the vllm replica, block ids for
    ``s3fifo_sosp`` and the per-block policies. The stream itself when it has them already."""
    stateful, ids = serve_needs(st)
    if stateful and stream.has_singletons:
        stream = with_stateful_singletons(stream)
    if ids and stream.n_distinct == 0:
        stream = with_block_ids(stream)
    return stream


def block_bound(stream: Stream) -> int:
    """The most accesses of one block id in a stream with block ids (lfu's frequency bound)."""
    bid = np.asarray(stream.block_id)
    U = int(stream.n_distinct)
    if bid.ndim > 1:
        return max(block_bound(jax.tree.map(lambda x, i=i: np.asarray(x)[i], stream)) for i in range(bid.shape[0]))
    ids = bid[bid < U]
    return int(np.bincount(ids, minlength=1).max(initial=0)) if ids.size else 0


def with_block_bound(stream: Stream, st: Static) -> Static:
    """``st`` with the per-block lists its stream needs (after :func:`serve_stream`)."""
    if not st.blocks:
        return st
    from cacheresearch.cache.blocks import n_lists  # noqa: PLC0415

    return st._replace(block_q=max(st.block_q, n_lists(st.blocks, block_bound(stream))))


def check_stream(stream: Stream, st: Static, params=None) -> None:
    """A stream fits the program (after :func:`serve_stream`): the vllm replica's run bound; the
    ``gie_estimate`` view (with concrete ``params``; traced ones are checked where they were made) needs the
    stream's GIE hashes."""
    if params is not None and isinstance(params.view, jax.core.Tracer):
        params = None
    if params is not None and stream.gie_hash is None:
        views = np.asarray(params.view).reshape(-1)
        if np.any(views == VIEWS["gie_estimate"]):
            raise ValueError("view 'gie_estimate' needs the stream's GIE hashes: compile_stream(..., gie_hashes="
                             "gie_hashes_from_keys(workload)) or gie_hashes_shared_prefix")
    if params is not None and stream.gie_hash is not None:
        g = (np.asarray(params.view).reshape(-1) == VIEWS["gie_estimate"])
        cap = np.broadcast_to(np.asarray(params.gie_lru_capacity), np.shape(np.asarray(params.view))).reshape(-1)
        if np.any(g & (cap < stream.gie_width)):
            raise ValueError(f"gie_lru_capacity below a request's {stream.gie_width} hashes: GIE's hash -> pods map "
                             "then lists hashes its LRU dropped, which the gie_estimate view does not model")
        ccap = np.broadcast_to(np.asarray(params.gie_cpu_lru_capacity), g.shape)
        con = np.broadcast_to(np.asarray(params.gie_cpu_w_pct), g.shape) > 0
        if np.any(g & con & (ccap < stream.gie_width)):
            raise ValueError(f"gie_cpu_lru_capacity below a request's {stream.gie_width} hashes: the CPU-tier "
                             "scorer's hash -> pods map then lists hashes its LRU dropped, which is not modelled")
    if st.scheduler == "vllm":
        runs = int(np.max(np.asarray(stream.n_runs), initial=0))
        if runs > st.max_runs:
            raise ValueError(f"a request has {runs} runs, above the static bound max_runs={st.max_runs}")
    if (st.priority or st.scheduler == "vllm") and stream.has_singletons:
        raise ValueError("this program needs every run stateful: pass the stream through serve_stream")
    if st.s3 and stream.n_distinct == 0:
        raise ValueError("policy s3fifo_sosp needs block ids: pass the stream through serve_stream")
    if st.blocks and stream.n_distinct == 0:
        raise ValueError(f"policies {list(st.blocks)} need block ids: pass the stream through serve_stream")
    if st.blocks:
        from cacheresearch.cache.blocks import n_lists  # noqa: PLC0415

        if n_lists(st.blocks, block_bound(stream)) > st.block_q:
            raise ValueError(f"block_q={st.block_q} is below the lists the stream needs (with_block_bound)")


def _with_runs(stream: Stream, options: dict) -> dict:
    if options.get("scheduler") == "vllm" and "max_runs" not in options:
        options = dict(options, max_runs=int(np.max(np.asarray(stream.n_runs), initial=0)))
    return options


def _max_depth(stream: Stream) -> int:
    return int(np.max(np.asarray(stream.n_blocks), initial=0))


def _refuse_closed_loop(params) -> None:
    """The JAX engine sends every request at its arrival; the client's permits are the numba backend's, and so is
    a hybrid KV layout (``kv_groups``)."""
    if not isinstance(params.client_permits, jax.core.Tracer) and np.any(np.asarray(params.client_permits) > 0):
        raise ValueError("client_permits > 0 (a closed-loop client) is modelled by the numba vllm backend only: "
                         "core.run.simulate_cells(..., backend='auto' or 'numba')")
    if not isinstance(params.kv_groups, jax.core.Tracer) and (np.any(np.asarray(params.kv_groups) > 1)
                                                               or np.any(np.asarray(params.kv_window_groups) != 0)):
        raise ValueError("kv_groups > 1 or kv_window_groups (a hybrid KV layout) is modelled by the numba vllm "
                         "backend only: core.run.simulate_cells(..., backend='auto' or 'numba')")
    if not isinstance(params.client_timeout_ms, jax.core.Tracer) and np.any(np.asarray(params.client_timeout_ms) > 0):
        raise ValueError("client_timeout_ms > 0 (the client's timeouts) is modelled by the numba vllm backend only: "
                         "core.run.simulate_cells(..., backend='auto' or 'numba')")


def simulate(stream: Stream, params, key: jax.Array, *, max_replicas: int = 1, per_request: bool = True,
             window: int | None = None, **options) -> Metrics:
    """Run one configuration over the stream (jit-compiled). ``key``: a PRNG key (random words per
    request, :func:`request_bits`). Returns finalized :class:`Metrics` (:func:`finalize`).

    ``max_replicas`` is the static bound on replicas; ``per_request`` adds per-request arrays;
    ``window`` is how many log entries one eviction step examines (a speed knob, never a result);
    ``options``: the other static options of :func:`static_options`.
    """
    st = static_options(params, max_replicas=max_replicas, per_request=per_request, window=window,
                        max_depth=_max_depth(stream), **_with_runs(stream, options))
    check_bounds(params, max_replicas, st)
    _refuse_closed_loop(params)
    stream = serve_stream(stream, st)
    st = with_block_bound(stream, st)
    check_stream(stream, st, params)
    return finalize(_simulate_jit(stream, params, key, st=st), st)


def simulate_grid(stream: Stream, params, keys: jax.Array, *, max_replicas: int = 1, per_request: bool = False,
                  window: int | None = None, stream_axis: bool = False, **options) -> Metrics:
    """Vmapped :func:`simulate` over a grid: ``params`` fields [G], ``keys`` [G] PRNG keys.

    With ``stream_axis=True`` the stream is stacked too (:func:`~cacheresearch.core.stream.stack_streams`,
    leading axis [G]). Prefer :func:`~cacheresearch.core.run.simulate_cells` for several workloads: it
    never copies a stream per configuration.
    """
    st = static_options(params, max_replicas=max_replicas, per_request=per_request, window=window,
                        max_depth=_max_depth(stream), **_with_runs(stream, options))
    check_bounds(params, max_replicas, st)
    _refuse_closed_loop(params)
    if stream_axis:  # a stacked stream: derive per workload, then stack again
        from cacheresearch.core.stream import stack_streams  # noqa: PLC0415

        G = int(np.asarray(stream.n_requests).shape[0])
        parts = [jax.tree.map(lambda x, i=i: np.asarray(x)[i], stream) for i in range(G)]
        if any(serve_stream(p, st) is not p for p in parts):
            stream = stack_streams([serve_stream(p, st) for p in parts])
    else:
        stream = serve_stream(stream, st)
    st = with_block_bound(stream, st)
    check_stream(stream, st, params)
    return finalize(_simulate_grid_jit(stream, params, keys, st=st, stream_axis=stream_axis), st)

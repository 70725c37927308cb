"""The vllm replica: continuous batching over one KV pool per replica, after vLLM v1's scheduler.

A component with its own state (:class:`Replica`, one per replica, vmapped) and a step
(:func:`replica_step`: one engine step of one replica), driven by a scan over arrivals
(:func:`simulate_vllm`). The semantics, step by step, are in docs/fleet_semantics.md ("The vllm
replica"); the plain-Python reference is ``tests/reference_batch.py`` and the two agree request by
request (every TTFT, finish time, prefix hit and preemption).

Time is exact integer picoseconds in two int32 lanes (:mod:`cacheresearch.replica.clock`: whole ms and
ps below; 24.8 days, the arrivals' own int32-ms bound; a saturated clock sets ``time_overflow``). A
replica's step starts at its clock: it releases the requests that finished at
the previous step, schedules the running batch (each decoding request one token, prefilling ones
chunks of the token budget ``max_num_batched_tokens``, in admission order; preempting the latest
admitted requests, by recompute, while the pool cannot hold the allocation), then admits waiting
requests FCFS while the budget, ``max_num_seqs`` and the pool allow (their prefix is matched and
pinned now, not at arrival), then advances its clock by the step time (:func:`step_time`,
exact picoseconds). Before
each arrival every replica runs the steps that start at or before it, so routers see the pools as
they are at that moment; after the last arrival the replicas drain.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cacheresearch.cache.store import evict, init_store, leaf_stamp, stored_len
from cacheresearch.core.views import init_sync, probe, request_view, routing_counts
from cacheresearch.replica.clock import (
    MS_LIM,
    Time,
    t_add,
    t_float_ms,
    t_fs_to_ps,
    t_le,
    t_max,
    t_ms,
    t_mul,
    t_scale,
    t_sum,
    t_where,
    t_zero,
)
from cacheresearch.replica.pool import PoolState, evict_lru, extend, init_pool, leading_hit, pin, release
from cacheresearch.routers import VIEWS, FleetView, ring_positions, route
from cacheresearch.routers.gie_index import gie_add, gie_match, init_gie_index

__all__ = ["Replica", "init_replica", "step_time", "replica_step", "simulate_vllm", "tracked_requests"]


class Slots(NamedTuple):
    """Running requests of one replica, compact in admission order (positions ``< nrun``)."""

    req: jax.Array  # int32 [S] request (N: empty)
    c: jax.Array  # int32 [S] tokens computed by prefill (the prefix hit included)
    pt: jax.Array  # int32 [S] prefill target: input tokens + tokens generated before this admission
    d: jax.Array  # int32 [S] output tokens generated
    d0: jax.Array  # int32 [S] output tokens generated before this admission
    hit: jax.Array  # int32 [S] prefix hit blocks at this admission
    npre: jax.Array  # int32 [S] preemptions so far
    tok: jax.Array  # int32 [S] tokens scheduled in the current step
    pref: jax.Array  # bool [S] prefilling when the current step was scheduled
    done: jax.Array  # bool [S] finished at the end of the current step (released at the next)


class Waiting(NamedTuple):
    req: jax.Array  # int32 [Q] FIFO ring (preempted requests go to the front)
    d: jax.Array  # int32 [Q] output tokens already generated (preempted requests)
    npre: jax.Array  # int32 [Q]
    head: jax.Array  # int32
    count: jax.Array  # int32


class Stats(NamedTuple):
    steps: jax.Array  # int32
    busy: Time  # time with a step running
    kv_acc: jax.Array  # float32 sum of blocks in use x step ms
    kv_max: jax.Array  # int32 most blocks in use after scheduling
    q_acc: jax.Array  # float32 sum of waiting requests x step ms
    preempt: jax.Array  # int32 preemptions
    dropped: jax.Array  # int32 requests dropped: the waiting ring was full
    rejected: jax.Array  # int32 requests dropped: larger than the whole pool
    stuck: jax.Array  # bool an eviction found nothing evictable (a bug; reported)
    tover: jax.Array  # bool the clock saturated


class Replica(NamedTuple):
    pool: PoolState
    run: Slots
    nrun: jax.Array  # int32
    wait: Waiting
    clock: Time  # when the next step starts (or the last step ended, when idle)
    load_req: jax.Array  # int32 requests waiting or running
    load_blk: jax.Array  # int32 their blocks
    seen: jax.Array  # bool the clock has been set (a first request arrived)
    stats: Stats
    # vLLM V1's gauges (load_gauges): (waiting requests, KV blocks in use) published at the end of the last
    # step run (g_pen, from g_pen_t on) and of the step before it (g_pub)
    g_pen_t: Time
    g_pen: jax.Array  # int32 [2]
    g_pub: jax.Array  # int32 [2]


def init_replica(K: int, S: int, Q: int, N: int) -> Replica:
    zS = jnp.zeros(S, jnp.int32)
    fS = jnp.zeros(S, jnp.bool_)
    z = jnp.int32(0)
    f0 = jnp.float32(0)
    return Replica(
        pool=init_pool(K),
        run=Slots(jnp.full(S, N, jnp.int32), zS, zS, zS, zS, zS, zS, zS, fS, fS),
        nrun=z,
        wait=Waiting(jnp.full(Q, N, jnp.int32), jnp.zeros(Q, jnp.int32), jnp.zeros(Q, jnp.int32), z, z),
        clock=t_zero(), load_req=z, load_blk=z, seen=jnp.bool_(False),
        stats=Stats(z, t_zero(), f0, z, f0, z, z, z, jnp.bool_(False), jnp.bool_(False)),
        g_pen_t=t_zero(), g_pen=jnp.zeros(2, jnp.int32), g_pub=jnp.zeros(2, jnp.int32),
    )


def gauges_at(reps: Replica, t: Time):
    """vLLM V1's gauges as of time ``t`` (``load_gauges``): each replica's waiting requests and KV blocks in
    use at the end of its last step completed by ``t`` (vLLM's ``make_stats`` at the end of
    ``update_from_output``; requests arriving during a step join the waiting queue at the next one)."""
    done = t_le(reps.g_pen_t, t)[..., None]
    g = jnp.where(done, reps.g_pen, reps.g_pub)
    return g[..., 0], g[..., 1]


def _ceil_div(a, b):
    return (a + b - 1) // b


def _count(x) -> Time:
    """A non-negative int32 count as a wide value (units in ``ms``'s place = 10**9)."""
    return Time(x // 10**9, x % 10**9)


def _pairs(tok, c):
    """Causal-attention pairs of a prefill chunk of ``tok`` tokens after ``c`` computed ones (wide):
    ``tok c + tok (tok + 1) / 2``."""
    even = tok % 2 == 0
    tri = t_mul(jnp.where(even, tok // 2, tok), jnp.where(even, tok + 1, (tok + 1) // 2))
    return t_add(t_mul(tok, c), tri)


def _lin(params, prefill_tokens, decode_reqs) -> Time:
    return t_add(t_add(t_mul(params.step_base_ns, 1000), t_mul(params.step_prefill_ns, prefill_tokens * 1000)),
                 t_mul(params.step_decode_ns, decode_reqs * 1000))


def step_time(params, prefill_tokens, decode_reqs, ctx_tokens: Time, pairs: Time) -> Time:
    """The step-time model, exact picoseconds (at least 1): ``1000 (step_base_ns + step_prefill_ns
    prefill_tokens + step_decode_ns decode_reqs) + step_ctx_ps ctx_tokens + ceil(step_prefill_ctx_fs pairs
    / 1000)``. ``ctx_tokens``: the decoding requests' context (input + generated tokens, summed; wide),
    ``pairs``: the prefill chunks' (prefill token, context token) pairs (wide). The one definition of a
    step's duration (the decode-stretch closed form sums it)."""
    lin = _lin(params, prefill_tokens, decode_reqs)
    ctx = t_scale(ctx_tokens, params.step_ctx_ps)
    q, r = params.step_prefill_ctx_fs // 1000, params.step_prefill_ctx_fs % 1000  # ceil(q P + r P / 1000)
    att = t_add(t_scale(pairs, q), t_fs_to_ps(t_scale(pairs, r)))
    dt = t_add(t_add(lin, ctx), att)
    return t_where((dt.ms == 0) & (dt.ps == 0), Time(dt.ms, jnp.ones_like(dt.ps)), dt)


def _req_runs(stream, req, W: int):
    """A request's runs in prompt order: (run [.., W], blocks, first block j0, valid)."""
    E1 = stream.log.shape[-2]
    q = jnp.arange(W, dtype=jnp.int32)
    p = stream.n_runs[req]
    ok = q < p[..., None]
    e = jnp.where(ok, stream.entry0[req][..., None] + q, E1 - 1)
    v = stream.log[0][e]
    j0 = v[..., 2] - stream.offset[req][..., None]
    return jnp.where(ok, v[..., 0], 0), jnp.where(ok, v[..., 1], 0), j0, ok


def _held(kv_tokens, bt):
    return _ceil_div(kv_tokens, bt)


def _keyed(c, P, bt):
    """Canonical run blocks among a request's first ``c`` computed tokens: full prompt blocks only."""
    return jnp.minimum(c // bt, P // bt)


def _work(c, pt, d, d0, P, bt):
    """Blocks a running request holds outside the runs (partial chunk block, generated tokens)."""
    return _held(_kv(c, pt, d, d0), bt) - _keyed(c, P, bt)


def _kv(c, pt, d, d0):
    """Tokens whose KV a running request holds: its computed prefill, then every generated token but
    the last (a token's KV is computed by the step after the one that sampled it)."""
    return jnp.where(c < pt, c, c + jnp.maximum(d - d0 - 1, 0))


def _admit_waiting(pool, run, nrun, wait, stats, load_blk, left, go, preempted, stream, params, *, W: int,
                   max_seqs: int):
    """Step 3: admit waiting requests FCFS while the token budget ``left``, ``max_num_seqs`` and the pool
    allow (none after a preemption); their prefix is matched and pinned now, their first chunk scheduled.
    A request larger than the whole pool is rejected (dropped)."""
    S, Q = run.req.shape[0], wait.req.shape[0]
    bt = stream.block_tokens
    cap = params.capacity
    seq_cap = jnp.minimum(params.max_num_seqs, max_seqs)

    def can_admit(c):
        _, _, nrun_, wait_, left_, blocked, _, _ = c
        return go & ~preempted & (wait_.count > 0) & (nrun_ < seq_cap) & (left_ > 0) & ~blocked

    def admit(c):
        pool_, run_, nrun_, wait_, left_, blocked, st_, lb = c
        h = wait_.req[wait_.head]
        dprev, np_ = wait_.d[wait_.head], wait_.npre[wait_.head]
        hr, hm, hj, hok = _req_runs(stream, h, W)
        ht = jnp.where(hok, hr, pool_.s.shape[0])
        sg = pool_.s.at[ht].get(mode="fill", fill_value=0)
        Ph = stream.input_tokens[h]
        hit = jnp.minimum(leading_hit(sg, hm, hok), jnp.maximum(Ph - 1, 0) // bt)
        pt = Ph + dprev
        c0 = hit * bt
        tk = jnp.minimum(pt - c0, left_)
        c1 = c0 + tk
        k1 = _keyed(c1, Ph, bt)
        a1 = _held(c1, bt) - k1
        r0 = pool_.ref.at[ht].get(mode="fill", fill_value=1)
        dpin = jnp.sum(jnp.where(hok & (r0 == 0), sg, 0))
        tq = jnp.clip(k1 - hj, 0, hm)
        dsum = jnp.sum(jnp.where(hok, jnp.maximum(tq - sg, 0), 0))
        fits = pool_.pinned + pool_.work + dpin + dsum + a1 <= cap
        reject = ~fits & (nrun_ == 0)  # larger than the whole pool: never schedulable
        okf = hok & fits  # every pool update is masked: no copy of the pool per admission
        pool_ = extend(pin(pool_, hr, okf), hr, tq, okf)
        pool_ = pool_._replace(work=pool_.work + jnp.where(fits, a1, 0))
        pool_, stk = evict_lru(pool_, stream.run_len, cap, fits)
        at = jnp.where(fits, nrun_, S)
        run_ = Slots(
            req=run_.req.at[at].set(h, mode="drop"), c=run_.c.at[at].set(c1, mode="drop"),
            pt=run_.pt.at[at].set(pt, mode="drop"), d=run_.d.at[at].set(dprev, mode="drop"),
            d0=run_.d0.at[at].set(dprev, mode="drop"), hit=run_.hit.at[at].set(hit, mode="drop"),
            npre=run_.npre.at[at].set(np_, mode="drop"), tok=run_.tok.at[at].set(tk, mode="drop"),
            pref=run_.pref.at[at].set(True, mode="drop"), done=run_.done,
        )
        pop = fits | reject
        wait_ = wait_._replace(head=jnp.where(pop, jnp.mod(wait_.head + 1, Q), wait_.head),
                               count=wait_.count - pop.astype(jnp.int32))
        st_ = st_._replace(rejected=st_.rejected + reject.astype(jnp.int32), stuck=st_.stuck | (fits & stk))
        lb = lb - jnp.where(reject, stream.n_blocks[h], 0)
        return (pool_, run_, nrun_ + fits.astype(jnp.int32), wait_, jnp.where(fits, left_ - tk, left_),
                ~fits & ~reject, st_, lb)

    pool, run, nrun, wait, _, _, stats, load_blk = jax.lax.while_loop(
        can_admit, admit, (pool, run, nrun, wait, left, jnp.bool_(False), stats, load_blk))
    return pool, run, nrun, wait, stats, load_blk


def _clock_and_gauges(clock0, go, run, sched, decode, pool, wait, stats, stream, params):
    """Step 4's time: the step's duration (:func:`step_time`) from its prefill tokens, decoding requests,
    their context and the prefill chunks' attention pairs; the clock and the step counters and gauges."""
    S = run.req.shape[0]
    p_tok = jnp.sum(jnp.where(sched & run.pref, run.tok, 0))
    d_tok = jnp.sum(decode.astype(jnp.int32))
    ctx = t_sum(_count(jnp.where(decode, stream.input_tokens[run.req] + run.d, 0)))
    pairs = t_sum(t_where(sched & run.pref, _pairs(run.tok, run.c - run.tok), t_zero(S)))
    stepped = go & jnp.any(sched)
    dt = t_where(stepped, step_time(params, p_tok, d_tok, ctx, pairs), t_zero())
    clock = t_add(clock0, dt)
    over = clock.ms >= MS_LIM
    used = pool.pinned + pool.work
    dtf = dt.ms.astype(jnp.float32) + dt.ps.astype(jnp.float32) * 1e-9
    stats = stats._replace(
        steps=stats.steps + stepped.astype(jnp.int32),
        busy=t_add(stats.busy, dt),
        kv_acc=stats.kv_acc + used.astype(jnp.float32) * dtf,
        kv_max=jnp.maximum(stats.kv_max, jnp.where(stepped, used, 0)),
        q_acc=stats.q_acc + wait.count.astype(jnp.float32) * dtf,
        tover=stats.tover | over,
    )
    return clock, stats


def replica_step(rep: Replica, go, stream, params, *, W: int, max_seqs: int):
    """One engine step of one replica (when ``go``): release, schedule running, admit, advance the clock.
    Returns (replica, events) with events per slot: (request, first token?, finished?, end time)."""
    S = rep.run.req.shape[0]
    Q = rep.wait.req.shape[0]
    N = stream.arrival_ms.shape[0] - 1
    bt = stream.block_tokens
    cap = params.capacity
    slot = jnp.arange(S, dtype=jnp.int32)
    pool, run, wait, stats = rep.pool, rep.run, rep.wait, rep.stats

    # ---- 1. release the requests that finished at the previous step; compact the slots
    valid = slot < rep.nrun
    done = run.done & valid & go
    runs, m, j0, ok = _req_runs(stream, run.req, W)
    nb = stream.n_blocks[run.req]
    P = stream.input_tokens[run.req]
    pool = release(pool, runs, nb, leaf_stamp(0, nb[:, None], j0, m), ok, done)
    wk = _work(run.c, run.pt, run.d, run.d0, P, bt)
    pool = pool._replace(work=pool.work - jnp.sum(jnp.where(done, wk, 0)))
    load_req = rep.load_req - jnp.sum(done.astype(jnp.int32))
    load_blk = rep.load_blk - jnp.sum(jnp.where(done, nb, 0))
    keep = valid & ~done
    dest = jnp.where(keep, jnp.cumsum(keep.astype(jnp.int32)) - 1, S)
    nrun = jnp.sum(keep.astype(jnp.int32))

    def compact(x, fill):
        return jnp.full_like(x, fill).at[dest].set(x, mode="drop")

    run = Slots(compact(run.req, N), *(compact(x, 0) for x in run[1:8]),
                jnp.zeros(S, jnp.bool_), jnp.zeros(S, jnp.bool_))
    runs, m, j0, ok = (compact(x, f) for x, f in ((runs, 0), (m, 0), (j0, 0), (ok, False)))
    nb, P = compact(nb, 0), compact(P, 0)
    out = stream.output_tokens[run.req]

    # ---- 2. the running batch, in admission order
    v = slot < nrun
    pref = v & (run.c < run.pt)
    want = jnp.where(pref, run.pt - run.c, jnp.where(v, 1, 0))
    budget = params.max_num_batched_tokens
    tok = jnp.clip(budget - (jnp.cumsum(want) - want), 0, want)
    c_new = jnp.where(pref, run.c + tok, run.c)
    kv_old = _kv(run.c, run.pt, run.d, run.d0)
    a_old = _held(kv_old, bt) - _keyed(run.c, P, bt)
    a_new = _held(kv_old + tok, bt) - _keyed(c_new, P, bt)
    tgt = jnp.clip(_keyed(c_new, P, bt)[:, None] - j0, 0, m)
    s_g = pool.s.at[jnp.where(ok, runs, pool.s.shape[0])].get(mode="fill", fill_value=0)
    ds = jnp.sum(jnp.where(ok, jnp.maximum(tgt - s_g, 0), 0), axis=1)
    delta = jnp.where(v & (tok > 0), ds + a_new - a_old, 0)
    cum = jnp.cumsum(delta)

    def violated(c):
        pool_, nrun_, _, _ = c
        return go & jnp.any((slot < nrun_) & (pool_.pinned + pool_.work + cum > cap))

    def preempt(c):
        pool_, nrun_, wait_, st_ = c
        L = nrun_ - 1
        oneL = slot == L
        pool_ = release(pool_, runs, nb, leaf_stamp(0, nb[:, None], j0, m), ok, oneL)
        pool_ = pool_._replace(work=pool_.work - a_old[L])
        room = wait_.count < Q
        h = jnp.mod(wait_.head - 1, Q)
        wait_ = Waiting(
            req=wait_.req.at[jnp.where(room, h, Q)].set(run.req[L], mode="drop"),
            d=wait_.d.at[jnp.where(room, h, Q)].set(run.d[L], mode="drop"),
            npre=wait_.npre.at[jnp.where(room, h, Q)].set(run.npre[L] + 1, mode="drop"),
            head=jnp.where(room, h, wait_.head), count=wait_.count + room.astype(jnp.int32),
        )
        st_ = st_._replace(preempt=st_.preempt + 1, dropped=st_.dropped + (~room).astype(jnp.int32))
        return pool_, L, wait_, st_

    npre_before = stats.preempt
    pool, nrun_k, wait, stats = jax.lax.while_loop(violated, preempt, (pool, nrun, wait, stats))
    # preempted requests that found the waiting ring full are dropped: the ring holds the others
    lost = (slot >= nrun_k) & (slot < nrun)
    ring_n = jnp.minimum(nrun - nrun_k, Q - rep.wait.count)
    dropped_slots = lost & (slot < nrun - ring_n)  # preempted last, after the ring filled
    load_req = load_req - jnp.sum(dropped_slots.astype(jnp.int32))
    load_blk = load_blk - jnp.sum(jnp.where(dropped_slots, nb, 0))
    preempted = stats.preempt > npre_before
    kept = slot < nrun_k
    tok = jnp.where(kept, tok, 0)
    sched = kept & (tok > 0) & go
    pool = extend(pool, runs.reshape(-1), tgt.reshape(-1), (ok & sched[:, None]).reshape(-1))
    pool = pool._replace(work=pool.work + jnp.sum(jnp.where(sched, a_new - a_old, 0)))
    pool, stuck1 = evict_lru(pool, stream.run_len, cap, go)
    nrun = nrun_k
    run = run._replace(c=jnp.where(kept, c_new, run.c), tok=tok, pref=pref & sched)

    # ---- 3. admit waiting requests FCFS
    rej0 = stats.rejected
    left = budget - jnp.sum(tok)
    pool, run, nrun, wait, stats, load_blk = _admit_waiting(pool, run, nrun, wait, stats, load_blk, left, go, preempted,
                                                            stream, params, W=W, max_seqs=max_seqs)
    load_req = load_req - (stats.rejected - rej0)

    # ---- 4. the step: token counts, time, completions
    v = slot < nrun
    sched, out = v & (run.tok > 0), stream.output_tokens[run.req]
    complete = sched & run.pref & (run.c >= run.pt)
    decode = sched & ~run.pref
    d_new = run.d + (complete | decode).astype(jnp.int32)
    first_tok = complete & (run.d == 0)
    fin = sched & (complete | decode) & (d_new >= jnp.maximum(out, 1))
    stats = stats._replace(stuck=stats.stuck | stuck1)
    clock, stats = _clock_and_gauges(rep.clock, go, run, sched, decode, pool, wait, stats, stream, params)
    run = run._replace(d=jnp.where(sched, d_new, run.d), done=fin)
    # the pool's arrays and the waiting ring change only under ``go`` (masked updates); the small state
    # is selected, so a replica that does not step costs no copy of its pool
    sel = lambda a, b: jnp.where(go, a, b)  # noqa: E731
    new = rep._replace(
        pool=pool._replace(ctr=sel(pool.ctr, rep.pool.ctr), cached=sel(pool.cached, rep.pool.cached),
                           pinned=sel(pool.pinned, rep.pool.pinned), work=sel(pool.work, rep.pool.work)),
        run=jax.tree.map(sel, run, rep.run), nrun=sel(nrun, rep.nrun),
        wait=wait._replace(head=sel(wait.head, rep.wait.head), count=sel(wait.count, rep.wait.count)),
        clock=t_where(go, clock, rep.clock), load_req=sel(load_req, rep.load_req), load_blk=sel(load_blk, rep.load_blk),
        seen=rep.seen, stats=jax.tree.map(sel, stats, rep.stats))
    return _publish(new, rep, go), (jnp.where(go & v, run.req, N), go & first_tok, go & fin, clock)


def _publish(new: Replica, old: Replica, go) -> Replica:
    """vLLM V1's gauges (``load_gauges``): a step that ran publishes its waiting count and KV blocks in use at
    its end (its clock); the one published before becomes the previous step's."""
    g = jnp.stack([new.wait.count, new.pool.pinned + new.pool.work])
    return new._replace(g_pen_t=t_where(go, new.clock, old.g_pen_t), g_pen=jnp.where(go, g, old.g_pen),
                        g_pub=jnp.where(go, old.g_pen, old.g_pub))


def _tri(n) -> Time:
    """``n (n - 1) / 2`` (wide count)."""
    even = n % 2 == 0
    return t_mul(jnp.where(even, n // 2, n), jnp.where(even, n - 1, (n - 1) // 2))


def _decode_stretch(rep: Replica, go, now_t: Time, stream, params, *, max_seqs: int):
    """The decode-only steps of one replica up to its next event, at once: ``(replica, events, taken)``.

    A stretch starts where the running batch only decodes (no prefill left, nothing finished to release,
    nothing admissible: the waiting queue empty or held back by ``max_num_seqs`` or the token budget) and
    takes ``n`` steps, the largest with every step starting at or before ``now_t``, no request finishing
    before the last step and every block allocation served without preemption. Between its events nothing
    but counters changes: each decoding request emits a token per step, its KV crosses block boundaries at
    known steps (``n`` steps allocate ``ceil((kv + n) / B) - ceil(kv / B)`` blocks), the pins and free-queue
    stamps stay, so the eviction is the same done once at the end, and the step times sum in closed form
    (:func:`step_time` at step ``j``: ``lin + step_ctx_ps (ctx0 + j d)``). ``taken`` is False (nothing
    changes) where no stretch applies; the caller runs an ordinary step there.
    """
    S = rep.run.req.shape[0]
    bt = stream.block_tokens
    run, pool = rep.run, rep.pool
    slot = jnp.arange(S, dtype=jnp.int32)
    v = slot < rep.nrun
    budget = params.max_num_batched_tokens
    dec = v & (slot < budget)  # the slots a decode-only step schedules (one token each, in order)
    dn = jnp.sum(dec.astype(jnp.int32))
    P = stream.input_tokens[run.req]
    out = jnp.maximum(stream.output_tokens[run.req], 1)
    seq_cap = jnp.minimum(params.max_num_seqs, max_seqs)
    quiet = (rep.wait.count == 0) | (rep.nrun >= seq_cap) | (rep.nrun >= budget)
    ok = go & (rep.nrun > 0) & ~jnp.any(v & (run.c < run.pt)) & ~jnp.any(v & run.done) & quiet
    f = jnp.min(jnp.where(dec, out - run.d, MS_LIM))  # steps until the first request finishes (its last)
    kv = _kv(run.c, run.pt, run.d, run.d0)
    room = params.capacity - pool.pinned - pool.work
    ctx0 = t_sum(_count(jnp.where(dec, P + run.d, 0)))
    c = params.step_ctx_ps
    lin = _lin(params, jnp.int32(0), dn)
    lin = t_where((lin.ms == 0) & (lin.ps == 0) & (c == 0), Time(lin.ms, jnp.ones_like(lin.ps)), lin)

    def total(n):  # time of the first n steps
        return t_add(t_scale(lin, n), t_scale(t_add(t_scale(ctx0, n), t_scale(_tri(n), dn)), c))

    def blocks(n):
        return jnp.sum(jnp.where(dec, _ceil_div(kv + n, bt) - _ceil_div(kv, bt), 0))

    def fits(n):
        return (blocks(n) <= room) & t_le(t_add(rep.clock, total(n - 1)), now_t)

    def search(_, lh):
        lo, hi = lh
        mid = lo + (hi - lo + 1) // 2
        p = fits(mid)
        return jnp.where(p, mid, lo), jnp.where(p, hi, mid - 1)

    n, _ = jax.lax.fori_loop(0, 32, search, (jnp.int32(0), jnp.where(ok, f, 0)))
    taken = ok & (n >= 1)
    n = jnp.where(taken, n, 0)
    T = t_where(taken, total(n), t_zero())
    d_new = jnp.where(dec & taken, run.d + n, run.d)
    fin = dec & taken & (d_new >= out)
    used0 = pool.pinned + pool.work
    pool = pool._replace(work=pool.work + jnp.where(taken, blocks(n), 0))
    pool, stuck = evict_lru(pool, stream.run_len, params.capacity, taken)
    used = pool.pinned + pool.work
    clock = t_add(rep.clock, T)
    Tf = t_float_ms(T)
    st = rep.stats
    # the KV gauge over the stretch takes its blocks in use as growing evenly (a float32 gauge; the
    # step-by-step sum differs in rounding and in where the blocks are crossed)
    stats = st._replace(
        steps=st.steps + n, busy=t_add(st.busy, T),
        kv_acc=st.kv_acc + 0.5 * (used0 + used).astype(jnp.float32) * Tf,
        kv_max=jnp.maximum(st.kv_max, jnp.where(taken, used, 0)),
        q_acc=st.q_acc + rep.wait.count.astype(jnp.float32) * Tf,
        stuck=st.stuck | stuck, tover=st.tover | (taken & (clock.ms >= MS_LIM)))
    run = run._replace(d=d_new, done=jnp.where(taken, fin, run.done),
                       tok=jnp.where(taken, dec.astype(jnp.int32), run.tok), pref=run.pref & ~taken)
    # the gauges: the stretch's last step and the one before it (blocks of its first n - 1 steps), or the
    # step before the stretch when it is one step
    wc = rep.wait.count
    prev = jnp.where(n >= 2, jnp.stack([wc, used0 + blocks(jnp.maximum(n - 1, 0))]), rep.g_pen)
    new = rep._replace(pool=pool, run=run, clock=t_where(taken, clock, rep.clock), stats=stats,
                       g_pen_t=t_where(taken, clock, rep.g_pen_t),
                       g_pen=jnp.where(taken, jnp.stack([wc, used]), rep.g_pen),
                       g_pub=jnp.where(taken, prev, rep.g_pub))
    events = (jnp.where(taken & dec, run.req, stream.arrival_ms.shape[0] - 1), jnp.zeros(S, jnp.bool_), fin, clock)
    return new, events, taken


def _loads(reps: Replica, stream, u, instances, local_load):
    """Each replica's load as a router reads it: (waiting requests, blocks of the requests waiting or
    running); with ``local_load`` only the requests of router instance ``u`` (request ``i`` is instance
    ``i mod instances``'s) count."""
    Q = reps.wait.req.shape[-1]
    S = reps.run.req.shape[-1]
    k = jnp.arange(Q, dtype=jnp.int32)
    wq = reps.wait.req[jnp.arange(reps.wait.req.shape[0])[:, None], jnp.mod(reps.wait.head[:, None] + k, Q)]
    wv = k[None, :] < reps.wait.count[:, None]
    rv = jnp.arange(S, dtype=jnp.int32)[None, :] < reps.nrun[:, None]
    wm = wv & (jnp.mod(wq, instances) == u)
    rm = rv & (jnp.mod(reps.run.req, instances) == u)
    q_loc = jnp.sum(wm.astype(jnp.int32), axis=1)
    b_loc = jnp.sum(jnp.where(wm, stream.n_blocks[wq], 0), axis=1) + jnp.sum(
        jnp.where(rm, stream.n_blocks[reps.run.req], 0), axis=1)
    return (jnp.where(local_load, q_loc, reps.wait.count), jnp.where(local_load, b_loc, reps.load_blk))


def has_work(rep: Replica):
    return (rep.nrun > 0) | (rep.wait.count > 0)


class _Carry(NamedTuple):
    reps: Replica  # [R]
    store: object  # approximate index rows (run store)
    ttft_t: Time  # [N + 1] time of the first token
    fin_t: Time  # [N + 1] finish time (ms -1: not served)
    hit_b: jax.Array  # int32 [N + 1] prefix hit blocks (last admission)
    npre: jax.Array  # int32 [N + 1] preemptions
    rep_of: jax.Array  # int32 [N + 1] replica
    copies: jax.Array  # int32 sum of prefix copies at arrival
    copies_n: jax.Array
    over_q: jax.Array
    over_n: jax.Array
    snap: jax.Array  # int32 [R, K] the stale view: stored heads as of the last sync ([1, 1] without it)
    sync_t: jax.Array  # int32 ms of the last sync
    synced: jax.Array  # bool
    gix: object  # (GieIndex [R, G], the CPU-tier scorer's GieIndex) (view gie_estimate; None: no GIE hashes)
    scrape_q: jax.Array  # int32 [R] waiting requests as of the last load scrape (load_refresh_ms > 0)
    scrape_kv: jax.Array  # int32 [R] KV blocks in use as of the last scrape
    scrape_t: jax.Array  # int32 ms of the last scrape (-1: none yet)
    acc_kv: jax.Array  # float32 [N + 1] the active replicas' kv_acc summed, at each arrival
    acc_q: jax.Array  # float32 [N + 1] the same of q_acc
    iters: jax.Array  # int32 [N + 1] event-loop iterations before each arrival (N: the drain)
    events: jax.Array  # int32 replica events (decode stretches and engine steps, summed over replicas)


def _record(c: _Carry, ev):
    req, first, fin, tick = ev  # [R, S] each (tick: Time [R])
    N1 = c.ttft_t.ms.shape[0]
    rf = jnp.where(first, req, N1).reshape(-1)
    rd = jnp.where(fin, req, N1).reshape(-1)

    def put(t: Time, at):
        return Time(*(x.at[at].set(jnp.broadcast_to(v[:, None], req.shape).reshape(-1), mode="drop")
                      for x, v in zip(t, tick)))

    return c._replace(ttft_t=put(c.ttft_t, rf), fin_t=put(c.fin_t, rd))


def _advance(c: _Carry, now_t, stream, params, W, max_seqs, R, at):
    """Run every replica's steps that start at or before ``now_t`` (a Time; all of them at MS_LIM ms);
    the loop's iterations are counted at arrival ``at`` (vmapped over configurations, the loop runs
    as many as the configuration with the most there: ``benchmarks/vllm_lockstep.py``)."""
    ridx = jnp.arange(R, dtype=jnp.int32)
    active = ridx < jnp.clip(params.replicas, 1, R)

    def elig(reps):
        return active & (has_work(reps) | jnp.any(reps.run.done, axis=1)) & t_le(reps.clock, now_t)

    def cond(c):
        return jnp.any(elig(c.reps))

    def body(c):
        go = elig(c.reps)
        stretch = jax.vmap(lambda r, g: _decode_stretch(r, g, now_t, stream, params, max_seqs=max_seqs))
        step = jax.vmap(lambda r, g: replica_step(r, g, stream, params, W=W, max_seqs=max_seqs))
        # a decode-only stretch where one applies, else one engine step (disjoint replicas)
        reps, ev_s, taken = stretch(c.reps, go)
        reps, ev = step(reps, go & ~taken)
        ev = jax.tree.map(lambda a, b: jnp.where(taken.reshape(taken.shape + (1,) * (a.ndim - 1)), a, b), ev_s, ev)
        # hits and preemption counts of finishing requests, before the slots change
        req, first, fin, _ = ev
        N1 = c.hit_b.shape[0]
        rd = jnp.where(fin, req, N1).reshape(-1)
        c = c._replace(reps=reps, hit_b=c.hit_b.at[rd].set(reps.run.hit.reshape(-1), mode="drop"),
                       npre=c.npre.at[rd].set(reps.run.npre.reshape(-1), mode="drop"),
                       iters=c.iters.at[at].add(1), events=c.events + jnp.sum(go.astype(jnp.int32)))
        return _record(c, ev)

    return jax.lax.while_loop(cond, body, c)


def _scrape(c: _Carry, now, real, stream, params, u, instances, W, S, R, at) -> _Carry:
    """The load scrape (``load_refresh_ms = P > 0``): the pods' waiting requests and KV blocks in use as
    of the last multiple of ``P`` at or before ``now``, taken when it is later than the last scrape (the
    replicas run up to that tick first; running them in two stretches changes nothing, no request
    arrives in between). With ``P = 0`` nothing runs: the router reads the live values."""
    P = params.load_refresh_ms
    tick = (now // jnp.maximum(P, 1)) * P
    due = real & (P > 0) & (tick > c.scrape_t)
    c = _advance(c, t_ms(jnp.where(due, tick, -1)), stream, params, W, S, R, at)
    q, _ = _loads(c.reps, stream, u, instances, params.local_load)
    kv = c.reps.pool.pinned + c.reps.pool.work
    gq, gkv = gauges_at(c.reps, t_ms(tick))  # vLLM's gauges as of the tick (load_gauges)
    gg = params.load_gauges > 0
    q, kv = jnp.where(gg, gq, q), jnp.where(gg, gkv, kv)
    return c._replace(scrape_q=jnp.where(due, q, c.scrape_q), scrape_kv=jnp.where(due, kv, c.scrape_kv),
                      scrape_t=jnp.where(due, tick, c.scrape_t))


def _enqueue(reps: Replica, r, req, now_t: Time, n, real, Q: int) -> Replica:
    """Request ``req`` (``n`` blocks) joins replica ``r``'s waiting ring, touching only its ring slot and
    counters (dropped when the ring is full); an idle replica's clock moves to the arrival."""
    ridx = jnp.arange(reps.nrun.shape[0], dtype=jnp.int32)
    w = reps.wait
    idle = (reps.nrun[r] == 0) & (w.count[r] == 0)
    room = real & (w.count[r] < Q)
    pos = jnp.where(room, jnp.mod(w.head[r] + w.count[r], Q), Q)
    one = (ridx == r).astype(jnp.int32)
    w = w._replace(req=w.req.at[r, pos].set(req, mode="drop"), d=w.d.at[r, pos].set(0, mode="drop"),
                   npre=w.npre.at[r, pos].set(0, mode="drop"), count=w.count + one * room.astype(jnp.int32))
    return reps._replace(
        wait=w,
        clock=t_where((ridx == r) & idle & real, t_max(reps.clock, now_t), reps.clock),
        load_req=reps.load_req + one * room.astype(jnp.int32),
        load_blk=reps.load_blk + one * jnp.where(room, n, 0),
        stats=reps.stats._replace(dropped=reps.stats.dropped + one * (real & ~room).astype(jnp.int32)),
    )


def tracked_requests(reps: Replica, stream, now, timeout_ms):
    """llm-d's active-request tracker (``active_request.go``) at ``now`` (ms), per replica: the requests
    routed there whose last token has not been sent (waiting or running; one that finished at ``now`` or
    before was released by the step that started there), less those whose TTL entry expired. An entry set
    at ``t`` expires at ``t + T`` (``T = timeout_ms``, the ``requestTimeout``) and is deleted at the next
    cleanup tick (every ``T`` from time 0, ttlcache's ``DeleteExpired``: ``expiresAt`` strictly before the
    tick), so at ``now`` a request counts while ``t >= (floor(now / T) - 1) T``. ``T = 0``: no expiry."""
    Q = reps.wait.req.shape[-1]
    S = reps.run.req.shape[-1]
    k = jnp.arange(Q, dtype=jnp.int32)
    wq = reps.wait.req[jnp.arange(reps.wait.req.shape[0])[:, None], jnp.mod(reps.wait.head[:, None] + k, Q)]
    wv = k[None, :] < reps.wait.count[:, None]
    rv = jnp.arange(S, dtype=jnp.int32)[None, :] < reps.nrun[:, None]
    T = timeout_ms
    cut = jnp.where(T > 0, (now // jnp.maximum(T, 1) - 1) * T, -1)
    return (jnp.sum((wv & (stream.arrival_ms[wq] >= cut)).astype(jnp.int32), axis=1)
            + jnp.sum((rv & (stream.arrival_ms[reps.run.req] >= cut)).astype(jnp.int32), axis=1))


def _fleet_view(c: "_Carry", now, now_t: Time, stream, params, u, instances, replicas, mv, gtot,
                mcpu=None) -> FleetView:
    """What the router reads at an arrival. Load: waiting requests (vLLM's num_requests_waiting, what llm-d's
    queue scorer reads) and KV blocks in use (gpu_cache_usage_perc), live or as of the last scrape
    (``load_refresh_ms > 0``; ``load_gauges``: vLLM's gauges as of the last completed step); the EPP's own
    count of requests in flight (active-request scorer, :func:`tracked_requests`), always live."""
    reps = c.reps
    queue, act = _loads(reps, stream, u, instances, params.local_load)
    kv_now = reps.pool.pinned + reps.pool.work
    gq, gkv = gauges_at(reps, now_t)
    gg = params.load_gauges > 0
    queue, kv_now = jnp.where(gg, gq, queue), jnp.where(gg, gkv, kv_now)
    scraped = params.load_refresh_ms > 0
    return FleetView(replicas=replicas, match=mv, queue=jnp.where(scraped, c.scrape_q, queue), active_blocks=act,
                     tree_size=reps.pool.cached, kv_used=jnp.where(scraped, c.scrape_kv, kv_now), match_total=gtot,
                     active_req=tracked_requests(reps, stream, now, params.gie_active_timeout_ms), match_cpu=mcpu)


def simulate_vllm(stream, params, key, st, request_bits, finish):
    """The scan over arrivals with vllm replicas; ``finish(stream, params, c, st, ...)`` builds Metrics."""
    R = st.max_replicas
    K = stream.run_len.shape[0]
    N1 = stream.arrival_ms.shape[0]
    N = N1 - 1
    W = max(st.max_runs, 1)
    S = st.max_running
    E1 = stream.log.shape[-2]
    V = st.max_instances * R if st.index else 0
    replicas = jnp.clip(params.replicas, 1, R).astype(jnp.int32)
    instances = jnp.clip(params.instances, 1, st.max_instances).astype(jnp.int32)
    ridx = jnp.arange(R, dtype=jnp.int32)
    active = ridx < replicas
    bits = request_bits(key, N1)
    ring = ring_positions(R, st.max_vnodes)
    reps = jax.vmap(lambda _: init_replica(K, S, st.queue_slots, N))(ridx)
    store = init_store(R + V, K, E1, (-1, 0)) if st.index else init_store(1, 1, 1, (-1, 0))
    neg = Time(jnp.full(N1, -1, jnp.int32), jnp.zeros(N1, jnp.int32))
    z = jnp.int32(0)
    gie = stream.gie_hash is not None
    c0 = _Carry(reps, store, neg, neg, jnp.zeros(N1, jnp.int32), jnp.zeros(N1, jnp.int32),
                jnp.zeros(N1, jnp.int32), z, z, z, z,
                jnp.zeros((R, K) if st.stale else (1, 1), jnp.int32), z, jnp.bool_(False),
                (init_gie_index(R, stream.n_gie), init_gie_index(R, stream.n_gie)) if gie else None,
                jnp.zeros(R, jnp.int32), jnp.zeros(R, jnp.int32),
                jnp.int32(-1), jnp.zeros(N1, jnp.float32), jnp.zeros(N1, jnp.float32), jnp.zeros(N1, jnp.int32), z)
    sy = init_sync(R)

    def step(c: _Carry, req):
        real = req < stream.n_requests  # padding requests (stacked streams) are never routed
        now = stream.arrival_ms[req]
        now_t = t_ms(now)
        u = jnp.mod(req, instances)
        c = _scrape(c, now, real, stream, params, u, instances, W, S, R, req)
        c = _advance(c, now_t, stream, params, W, S, R, req)
        reps = c.reps
        c = c._replace(acc_kv=c.acc_kv.at[req].set(jnp.sum(jnp.where(active, reps.stats.kv_acc, 0.0))),
                       acc_q=c.acc_q.at[req].set(jnp.sum(jnp.where(active, reps.stats.q_acc, 0.0))))
        n = stream.n_blocks[req]
        base = stream.offset[req]
        runs, m, j0, ok = _req_runs(stream, req, W)
        ok = ok & real
        tg = jnp.where(ok, runs, K)
        s_all = reps.pool.s.at[:, tg].get(mode="fill", fill_value=0)  # [R, W]
        mt = jnp.where(active, leading_hit(s_all, m[None], ok[None]), 0)
        mv = mt
        if st.stale:  # the router's copy of every pool, synced at the first request and every stale_lag_ms
            do = real & (params.view == 2) & (~c.synced | (now - c.sync_t >= params.stale_lag_ms))
            c = c._replace(snap=jnp.where(do, reps.pool.s, c.snap), sync_t=jnp.where(do, now, c.sync_t),
                           synced=c.synced | do)
            s_snap = c.snap.at[:, tg].get(mode="fill", fill_value=0)
            mv = jnp.where(params.view == 2, jnp.where(active, leading_hit(s_snap, m[None], ok[None]), 0), mv)
        if st.index:
            _, mvi = probe(c.store, sy, stream, stream.entry0[req], stream.n_runs[req], now, u, params, R=R,
                           stale=False, index=True, active=active)
            mv = jnp.where(params.view == 1, mvi, mv)  # approximate rows from the index; stale rows kept
        gtot, gcpu = None, None
        if gie:  # GIE's own index (view gie_estimate): its count of prompt-byte hashes and their total
            gids, gn = stream.gie_hash[req], stream.gie_n[req]
            gcnt, gtot = gie_match(c.gix[0], gids, gn, active)
            mv = jnp.where(params.view == VIEWS["gie_estimate"], gcnt, mv)
            gcpu, _ = gie_match(c.gix[1], gids, gn, active)  # the CPU-tier scorer's index (gie_cpu_w_pct > 0)
        rv, pb = request_view(stream, req, now, bits[req], u, params.prefix_blocks)
        fv = _fleet_view(c, now, now_t, stream, params, u, instances, replicas, mv, gtot, gcpu)
        r = route(params.router, rv, fv, params, ring, compiled=st.routers)
        if gie:  # PostCycle (later releases: PreRequest): each index learns the request's hashes on the chosen pod
            on = real & (params.view == VIEWS["gie_estimate"])
            c = c._replace(gix=(gie_add(c.gix[0], gids, gn, r, params.gie_lru_capacity, on),
                                gie_add(c.gix[1], gids, gn, r, params.gie_cpu_lru_capacity,
                                        on & (params.gie_cpu_w_pct > 0))))
        # routing metrics (as the fcfs engine: replicas holding the routing prefix; sent away from the best)
        copies_i, sample, qual, away = routing_counts(mt, mt[r], pb, n, active, real, st.match)
        c = c._replace(copies=c.copies + jnp.where(sample, copies_i, 0), copies_n=c.copies_n + sample.astype(jnp.int32),
                       over_q=c.over_q + qual.astype(jnp.int32), over_n=c.over_n + away.astype(jnp.int32),
                       rep_of=c.rep_of.at[req].set(r))
        # the approximate index learns the decision (leaf-first LRU of index_capacity blocks)
        store = c.store
        if st.index:
            vrow = R + u * R + r
            g = store.kv.at[vrow, tg].get(mode="fill", fill_value=-1)
            sli = stored_len(g[:, 0], m, store.thr[vrow])
            leaf_b = leaf_stamp(base, n, j0, m)
            vals = jnp.stack([leaf_b, jnp.zeros_like(leaf_b)], axis=-1)
            kv = store.kv.at[vrow, tg].set(vals, mode="drop")
            p = stream.n_runs[req]
            lane = jnp.arange(W, dtype=jnp.int32)
            rq_at = jnp.where(ok, store.cnt[vrow] + lane, E1)
            rq = store.rq.at[vrow, rq_at].set(stream.entry0[req] + lane, mode="drop")
            store = store._replace(kv=kv, rq=rq, cnt=store.cnt.at[vrow].add(jnp.where(real, p, 0)),
                                   occ=store.occ.at[vrow].add(jnp.sum(jnp.where(ok, m - sli, 0))))
            store = evict(store, vrow, params.index_capacity, jnp.bool_(True), stream, st.window, real)
        return c._replace(reps=_enqueue(reps, r, req, now_t, n, real, st.queue_slots), store=store), None

    c, _ = jax.lax.scan(step, c0, jnp.arange(N, dtype=jnp.int32))
    c = _advance(c, t_ms(MS_LIM), stream, params, W, S, R, N)
    return finish(stream, params, c, st, active, replicas)

"""S3-FIFO (Yang et al., SOSP 2023, Algorithm 1) per replica, at block granularity.

Runs do not help here: a partly evicted run is readmitted block by block into different queues, so
this policy keeps per-block state (block ids, which the engine derives from any stream:
``core.simulate.serve_stream``). The definition is the reference's (``tests/reference.py``, ``s3fifo_sosp``;
libCacheSim's S3FIFO is the policy ``s3fifo``, :mod:`cacheresearch.cache.block`):

* a small FIFO ``S`` of ``cS = min(C, max(1, C // 10))`` blocks, a main FIFO ``M`` of ``C - cS``, a
  ghost FIFO ``G`` of keys of size ``C - cS``; frequencies capped at 3;
* a request looks up its leading run (present = in ``S`` or ``M``), then touches its blocks leaf-first
  (last block first): a present block's frequency grows by one; a missing block enters ``M``'s head
  if its key is in ``G`` (and leaves ``G``), else ``S``'s head, with frequency 0;
* then, while ``S`` and ``M`` hold more than ``C`` blocks: if ``S`` holds more than ``cS`` or ``M`` is
  empty, pop ``S``'s tail until one block leaves the cache: a block with frequency >= 2 moves to
  ``M``'s head with frequency 0 (and if ``M`` then holds more than its capacity, one ``M`` eviction
  follows), else it is dropped and its key enters ``G`` (the oldest ghost leaves past ``G``'s size);
  otherwise pop ``M``'s tail: a block with frequency > 0 goes back to ``M``'s head with frequency - 1,
  else it is dropped.

``S`` and ``M`` are rings per replica (a key is in at most one of them, so a ring of the number of
block ids never overflows, and entries never go stale: keys leave them only at the tail). ``G`` is a
sequence number per key and a log of keys by sequence number, trimmed to its newest ``C - cS``
keys after each eviction (amortised O(1)). The eviction is a flat, branch-free while loop of single pops.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["S3State", "init_s3", "s3_request", "FREQ_CAP", "PROMOTE"]

FREQ_CAP = 3
PROMOTE = 2  # move from S to M when freq >= 2 (Algorithm 1: freq > 1)
_BIG = jnp.int32(2**31 - 1)


class S3State(NamedTuple):
    loc: jax.Array  # int32 [R, U] 0 absent, 1 in S, 2 in M
    freq: jax.Array  # int32 [R, U]
    gseq: jax.Array  # int32 [R, U] ghost sequence number (-1: not in G)
    sbuf: jax.Array  # int32 [R, U] ring of S (tail first)
    mbuf: jax.Array  # int32 [R, U] ring of M
    ptr: jax.Array  # int32 [R, 4] S tail, S head, M tail, M head (counters; slot = counter mod U)
    gcnt: jax.Array  # int32 [R] keys in G
    gclock: jax.Array  # int32 [R] next ghost sequence number
    gkey: jax.Array  # int32 [R, P] the key pushed to G with each sequence number (P: stream positions,
    #                  which bound the pushes: a push follows a drop from S, which follows an insertion)
    gtail: jax.Array  # int32 [R] sequence numbers below this have left G
    occ: jax.Array  # int32 [R] blocks in S and M


def init_s3(R: int, U: int, P: int) -> S3State:
    z = jnp.zeros((R, U), jnp.int32)
    zr = jnp.zeros(R, jnp.int32)
    return S3State(z, z, jnp.full((R, U), -1, jnp.int32), z, z, jnp.zeros((R, 4), jnp.int32), zr, zr,
                   jnp.zeros((R, P), jnp.int32), zr, zr)


def _window_ids(block_id, base, nn, j, window: int, U: int):
    """(valid lanes, block ids) of the ``window`` blocks from position ``j`` of the request (``U`` past its end)."""
    pos = j + jnp.arange(window, dtype=jnp.int32)
    ok = pos < nn
    return ok, jnp.where(ok, block_id[jnp.minimum(base + pos, block_id.shape[0] - 1)], U)


def _s3_lookup(s: S3State, r, block_id, base, nn, window: int):
    """Hit blocks: the leading run of the request's blocks present on replica ``r``."""
    U = s.loc.shape[1]

    def ids_at(j):
        return _window_ids(block_id, base, nn, j, window, U)

    def lk_cond(c):
        j, _, alive = c
        return (j < nn) & alive

    def lk_body(c):
        j, hit, alive = c
        ok, ids = ids_at(j)
        pres = s.loc.at[r, ids].get(mode="fill", fill_value=0) > 0
        f = pres | ~ok
        run = jnp.cumprod(f.astype(jnp.int32))
        return j + window, hit + jnp.sum(run * ok.astype(jnp.int32)), jnp.all(f)

    _, hit, _ = jax.lax.while_loop(lk_cond, lk_body, (jnp.int32(0), jnp.int32(0), jnp.bool_(True)))

    return hit


def _s3_touch(s: S3State, r, block_id, base, nn, window: int) -> S3State:
    """Touch the request's blocks leaf-first: present ones count a hit, ghosts enter M, others S."""
    U = s.loc.shape[1]

    def ids_at(j):
        return _window_ids(block_id, base, nn, j, window, U)

    # windows from the last one back, lanes reversed
    nwin = (nn + window - 1) // window

    def touch(k, s):
        j = (nwin - 1 - k) * window
        ok, ids = ids_at(j)
        ok, ids = ok[::-1], ids[::-1]
        loc = s.loc.at[r, ids].get(mode="fill", fill_value=0)
        pres = ok & (loc > 0)
        ghost = s.gseq.at[r, ids].get(mode="fill", fill_value=-1) >= 0
        to_m = ok & ~pres & ghost
        to_s = ok & ~pres & ~ghost
        st, sh, mt, mh = s.ptr[r, 0], s.ptr[r, 1], s.ptr[r, 2], s.ptr[r, 3]
        ps = sh + jnp.cumsum(to_s.astype(jnp.int32)) - 1
        pm = mh + jnp.cumsum(to_m.astype(jnp.int32)) - 1
        tgt = jnp.where(ok, ids, U)
        fr = s.freq.at[r, ids].get(mode="fill", fill_value=0)
        return S3State(
            loc=s.loc.at[r, tgt].set(jnp.where(pres, loc, jnp.where(to_m, 2, 1)), mode="drop"),
            freq=s.freq.at[r, tgt].set(jnp.where(pres, jnp.minimum(fr + 1, FREQ_CAP), 0), mode="drop"),
            gseq=s.gseq.at[r, jnp.where(to_m, ids, U)].set(-1, mode="drop"),
            sbuf=s.sbuf.at[r, jnp.where(to_s, jnp.mod(ps, U), U)].set(ids, mode="drop"),
            mbuf=s.mbuf.at[r, jnp.where(to_m, jnp.mod(pm, U), U)].set(ids, mode="drop"),
            ptr=s.ptr.at[r].set(jnp.stack([st, sh + jnp.sum(to_s), mt, mh + jnp.sum(to_m)]).astype(jnp.int32)),
            gcnt=s.gcnt.at[r].add(-jnp.sum(to_m.astype(jnp.int32))),
            gclock=s.gclock,
            gkey=s.gkey,
            gtail=s.gtail,
            occ=s.occ.at[r].add(jnp.sum((to_s | to_m).astype(jnp.int32))),
        )

    s = jax.lax.fori_loop(0, nwin, touch, s)

    return s


def _s3_evict(s: S3State, r, cap, do) -> S3State:
    """Evict down to ``cap`` on replica ``r`` (the S / M state machine), then trim the ghost."""
    U = s.loc.shape[1]
    # ---- evict: mode 0 choose, 1 evict_small, 2 evict_main (from the choice), 3 evict_main after a
    # promotion (then back to evict_small)
    cS = jnp.minimum(cap, jnp.maximum(1, cap // 10))
    cM = cap - cS

    def cond(c):
        s, mode = c
        return do & ((mode != 0) | (s.occ[r] > cap))

    def body(c):
        """One step of the eviction state machine, branch-free: a handful of scalar reads and
        scatters (conditionals over the whole state would copy it on every step)."""
        s, mode = c
        p = s.ptr[r]
        ns, nm = p[1] - p[0], p[3] - p[2]
        choose, small, main = mode == 0, mode == 1, mode >= 2
        back = mode == 3
        t = jnp.where(small, s.sbuf[r, jnp.mod(p[0], U)], s.mbuf[r, jnp.mod(p[2], U)])
        f = s.freq[r, t]
        s_pop = small & (ns > 0)
        promote = s_pop & (f >= PROMOTE)
        again = main & (f > 0)
        move = promote | again  # t goes to M's head
        drop_s = s_pop & ~promote
        drop = drop_s | (main & ~again)
        act = s_pop | main  # t is touched
        tt = jnp.where(act, t, U)
        loc_t = jnp.where(drop, 0, 2)
        freq_t = jnp.where(again, f - 1, 0)
        ptr = jnp.stack([p[0] + s_pop.astype(jnp.int32), p[1], p[2] + main.astype(jnp.int32),
                         p[3] + move.astype(jnp.int32)])
        # the ghost: a dropped S block's key enters G (trimmed to G's size after the loop)
        gin = drop_s & (cM > 0)
        gc = s.gclock[r]
        s = S3State(
            loc=s.loc.at[r, tt].set(loc_t, mode="drop"),
            freq=s.freq.at[r, tt].set(freq_t, mode="drop"),
            gseq=s.gseq.at[r, jnp.where(gin, t, U)].set(gc, mode="drop"),
            sbuf=s.sbuf,
            mbuf=s.mbuf.at[r, jnp.where(move, jnp.mod(p[3], U), U)].set(t, mode="drop"),
            ptr=s.ptr.at[r].set(ptr),
            gcnt=s.gcnt.at[r].add(gin.astype(jnp.int32)),
            gclock=s.gclock.at[r].add(gin.astype(jnp.int32)),
            gkey=s.gkey.at[r, jnp.where(gin, gc, s.gkey.shape[1])].set(t, mode="drop"),
            gtail=s.gtail,
            occ=s.occ.at[r].add(-drop.astype(jnp.int32)),
        )
        nxt = jnp.where(
            choose, jnp.where((ns > cS) | (nm == 0), 1, 2),
            jnp.where(small, jnp.where(ns == 0, 0, jnp.where(promote, jnp.where(nm + 1 > cM, 3, 1), 0)),
                      jnp.where(again, mode, jnp.where(back, 1, 0))))
        return s, nxt.astype(jnp.int32)

    s, _ = jax.lax.while_loop(cond, body, (s, jnp.int32(0)))

    # ---- the ghost keeps its cM newest keys (nothing reads it during eviction, so trimming once
    # after the loop keeps the same keys as trimming after every push)
    def g_cond(s):
        return do & (s.gcnt[r] > cM)

    def g_body(s):
        q = s.gtail[r]
        k = s.gkey[r, q]
        live = s.gseq[r, k] == q
        return s._replace(gseq=s.gseq.at[r, jnp.where(live, k, U)].set(-1, mode="drop"),
                          gcnt=s.gcnt.at[r].add(-live.astype(jnp.int32)), gtail=s.gtail.at[r].add(1))

    return jax.lax.while_loop(g_cond, g_body, s)


def s3_request(s: S3State, r, block_id, base, n, cap, do, window: int = 16):
    """Lookup, touch and evict request (blocks ``block_id[base : base + n]``) on replica ``r`` under
    capacity ``cap`` when ``do``; returns (state, hit blocks)."""
    nn = jnp.where(do, n, 0)
    hit = _s3_lookup(s, r, block_id, base, nn, window)
    s = _s3_touch(s, r, block_id, base, nn, window)
    return _s3_evict(s, r, cap, do), hit

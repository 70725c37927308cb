"""The KV pool of a batching replica (vLLM v1's KV cache manager, over runs): one replica's state.

One pool of ``C`` blocks holds the cached prefix blocks and the blocks of running requests
(docs/fleet_semantics.md, "The vllm replica"). Per stateful run ``k`` (the engine makes every run of
the stream stateful for this replica: ``core.simulate.serve_stream``):

* ``s[k]``: the run's stored head (blocks ``0 .. s-1`` of the run are cached; prefix hits stop at the
  first run that is not wholly stored, after its stored head);
* ``ref[k]``: running requests that pin the run (a scheduled request pins every run of its prompt);
  a pinned run cannot be evicted;
* ``stamp[k]``: the run's place in the free queue, set when its last pin is released. A released
  request's runs get fresh stamps in the order vLLM appends its blocks (tail block first), so block
  ``j`` of a request of ``n`` blocks released at counter ``c`` has free-queue stamp ``c + n - 1 - j``
  and eviction (lowest stamp first) takes tails before heads and older requests before newer ones.

Counters: ``cached = sum(s)``, ``pinned = sum(s[ref > 0])``, and ``work``: the running requests' blocks
that are no canonical run block (the partial last block of a chunk, generated tokens). Blocks in use =
``pinned + work`` (vLLM's KV usage); blocks held = ``cached + work <= C`` after every allocation.

The functions here work on one replica (vmapped over replicas by :mod:`cacheresearch.replica.vllm`);
``runs`` arrays are a request's runs in prompt order with a validity mask.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["PoolState", "init_pool", "leading_hit", "pin", "extend", "release", "evict_lru", "BIG"]

BIG = 2**31 - 1


class PoolState(NamedTuple):
    s: jax.Array  # int32 [K] stored head blocks per run
    ref: jax.Array  # int32 [K] pins
    stamp: jax.Array  # int32 [K] free-queue base stamp (meaningful when ref == 0 and s > 0)
    scratch: jax.Array  # int32 [K] BIG everywhere between calls (first-occurrence marks)
    ctr: jax.Array  # int32 next free-queue stamp
    cached: jax.Array  # int32 sum(s)
    pinned: jax.Array  # int32 sum(s[ref > 0])
    work: jax.Array  # int32 running requests' blocks outside the runs


def init_pool(K: int) -> PoolState:
    z = jnp.zeros(max(K, 1), jnp.int32)
    zs = jnp.int32(0)
    return PoolState(z, z, z, jnp.full(max(K, 1), BIG, jnp.int32), zs, zs, zs, zs)


def leading_hit(s_g, m, ok):
    """Leading stored blocks of a request: runs ``[..., W]`` in prompt order (stored heads ``s_g``,
    lengths ``m``, validity ``ok``); stops after the stored head of the first run not wholly stored."""
    full = (s_g >= m) | ~ok
    inc = jnp.cumprod(full.astype(jnp.int32), axis=-1)
    before = jnp.concatenate([jnp.ones_like(inc[..., :1]), inc[..., :-1]], axis=-1)
    return jnp.sum(jnp.where(ok, before * s_g, 0), axis=-1)


def _first(pool: PoolState, runs, ok):
    """Mask of the first valid occurrence of each run in the flat ``runs`` (scratch is restored)."""
    K = pool.s.shape[0]
    pos = jnp.arange(runs.shape[0], dtype=jnp.int32)
    tgt = jnp.where(ok, runs, K)
    sc = pool.scratch.at[tgt].min(pos, mode="drop")
    first = ok & (sc.at[tgt].get(mode="fill", fill_value=BIG) == pos)
    return first, sc.at[tgt].set(BIG, mode="drop")


def pin(pool: PoolState, runs, ok) -> PoolState:
    """Pin a request's runs (distinct within the request): ``ref += 1``; newly pinned blocks move from
    evictable to pinned."""
    tgt = jnp.where(ok, runs, pool.s.shape[0])
    r0 = pool.ref.at[tgt].get(mode="fill", fill_value=1)
    s0 = pool.s.at[tgt].get(mode="fill", fill_value=0)
    newly = jnp.sum(jnp.where(ok & (r0 == 0), s0, 0))
    return pool._replace(ref=pool.ref.at[tgt].add(1, mode="drop"), pinned=pool.pinned + newly)


def extend(pool: PoolState, runs, target, ok) -> PoolState:
    """Stored heads grow to ``target`` (pinned runs: the blocks a running request computed); ``runs``
    may repeat (several requests): the stored head becomes the largest target."""
    K = pool.s.shape[0]
    tgt = jnp.where(ok, runs, K)
    s_new = pool.s.at[tgt].max(jnp.where(ok, target, 0), mode="drop")
    first, scratch = _first(pool._replace(s=s_new), runs, ok)
    grown = jnp.sum(jnp.where(first, s_new.at[tgt].get(mode="fill", fill_value=0)
                              - pool.s.at[tgt].get(mode="fill", fill_value=0), 0))
    return pool._replace(s=s_new, scratch=scratch, cached=pool.cached + grown, pinned=pool.pinned + grown)


def release(pool: PoolState, runs, n_req, base_leaf, ok, rel) -> PoolState:
    """Release requests' pins: ``runs [X, W]`` of ``X`` requests (``rel [X]``: released, in the order of
    axis 0), each of ``n_req [X]`` blocks; ``base_leaf [X, W]`` = ``n - j0 - m`` of each run. Runs whose
    last pin goes get free-queue stamps: the latest release's, tail first."""
    K = pool.s.shape[0]
    nr = jnp.where(rel, n_req, 0)
    before = jnp.cumsum(nr) - nr  # counter offset: the blocks of the requests released before
    cand = pool.ctr + before[:, None] + base_leaf
    rel = ok & rel[:, None]
    fr = runs.reshape(-1)
    fo = rel.reshape(-1)
    tgt = jnp.where(fo, fr, K)
    ref = pool.ref.at[tgt].add(-1, mode="drop")
    # the latest candidate per run: scatter-max into the stamps of runs that reach ref 0
    r_new = ref.at[tgt].get(mode="fill", fill_value=1)
    zero = fo & (r_new == 0)
    first, scratch = _first(pool, fr, zero)
    s_at = pool.s.at[tgt].get(mode="fill", fill_value=0)
    unpinned = jnp.sum(jnp.where(first, s_at, 0))
    ztgt = jnp.where(zero, fr, K)
    stamp = pool.stamp.at[ztgt].set(-1, mode="drop").at[ztgt].max(jnp.where(zero, cand.reshape(-1), -1), mode="drop")
    return pool._replace(ref=ref, stamp=stamp, scratch=scratch, ctr=pool.ctr + jnp.sum(nr),
                         pinned=pool.pinned - unpinned)


def evict_lru(pool: PoolState, run_len, cap, do=True):
    """Evict unpinned cached blocks, lowest free-queue stamp first, until ``cached + work <= cap``.
    Returns (pool, stuck): ``stuck`` when nothing evictable was left (the caller's admission check
    makes that impossible; it is reported, never hidden). Nothing changes unless ``do``."""

    def key(p):
        low = p.stamp + run_len - p.s  # stamp of the run's lowest stored block (its stored tail)
        return jnp.where((p.ref == 0) & (p.s > 0), low, BIG)

    def cond(c):
        p, stuck = c
        return do & (p.cached + p.work > cap) & ~stuck

    def body(c):
        p, _ = c
        kk = key(p)
        k = jnp.argmin(kk).astype(jnp.int32)
        ok = kk[k] < BIG
        e = jnp.where(ok, jnp.minimum(p.cached + p.work - cap, p.s[k]), 0)
        return p._replace(s=p.s.at[k].add(-e), cached=p.cached - e), ~ok

    return jax.lax.while_loop(cond, body, (pool, jnp.bool_(False)))

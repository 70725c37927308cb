"""The ``gie_estimate`` view: GIE v0.5.1's prefix-cache-scorer index (estimate mode), exactly
(its capacity is the ``gie`` router's knob ``gie_lru_capacity``).

GIE (``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go`` and ``indexer.go``) keeps, per pod,
an LRU (hashicorp golang-lru) of at most ``lruCapacityPerServer`` block hashes, and a map hash -> pods
that the LRU's eviction callback keeps in step. A request's hashes (``h0`` the model, then one per
``hashBlockSize`` prompt bytes, at most ``maxPrefixBlocksToMatch``:
:mod:`cacheresearch.workload.gie_hashes`) are

* **matched** (``matchLongestPrefix``): walk ``i = 0, 1, ..`` while *some* pod holds ``h_i``, adding 1 to
  every pod that holds it; the walk stops at the first hash no pod holds. A pod's count is the number of
  the walked hashes it holds (not necessarily consecutive: the walk is over the union of pods). Matching
  does not touch the LRUs;
* **scored** ``count / total`` with ``total`` = the request's number of hashes (``h0`` included; 0 hashes:
  score 0), in the ``gie`` router (mode 1 under this view);
* **recorded** at the routing decision (``PostCycle``: ``indexer.Add(hashes, targetPod)``): each hash in
  order is added to the chosen pod's LRU (present: moved to the front; absent: inserted, evicting the
  least recently added entry when the LRU is full). Nothing is learned from the pods: no eviction
  feedback, nothing on completion.

The state is exact without a per-entry list: an LRU that only ever *adds* holds the ``C`` distinct keys
added most recently. Each pod stamps its adds with its own counter (``h_i`` of one request gets
``clk + i``); after an add leaves ``size > C`` entries, the ``size - C`` present entries with the lowest
stamps go (a binary search for the stamp below which exactly that many lie: stamps are unique per pod).

State :class:`GieIndex` ``[R, G]`` over the stream's ``G`` hash ids; :func:`gie_match` and
:func:`gie_add` are its two steps. The plain-Python oracle is ``tests/reference_gie_index.py`` (GIE's
Go code transcribed: ordered dicts per pod and a hash -> pods map).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["GieIndex", "init_gie_index", "gie_match", "gie_add"]


class GieIndex(NamedTuple):
    stamp: jax.Array  # int32 [R, G]: the pod's counter at the hash's last add (meaningful where present)
    present: jax.Array  # bool [R, G]
    clk: jax.Array  # int32 [R]: the pod's add counter
    size: jax.Array  # int32 [R]: hashes in the pod's LRU


def init_gie_index(R: int, G: int) -> GieIndex:
    return GieIndex(jnp.zeros((R, G), jnp.int32), jnp.zeros((R, G), bool), jnp.zeros(R, jnp.int32),
                    jnp.zeros(R, jnp.int32))


def gie_match(ix: GieIndex, ids, n, active):
    """``matchLongestPrefix`` of one request: (count [R] int32, total int32). ``ids [H]`` its hash ids
    (``h0`` first), ``n`` how many are real, ``active [R]`` the pods in the pool."""
    H = ids.shape[0]
    lane = jnp.arange(H, dtype=jnp.int32)
    valid = lane < n
    held = ix.present.at[:, ids].get(mode="fill", fill_value=False) & valid[None, :] & active[:, None]
    stop = valid & ~jnp.any(held, axis=0)
    L = jnp.where(jnp.any(stop), jnp.argmax(stop).astype(jnp.int32), n)
    count = jnp.sum((held & (lane < L)[None, :]).astype(jnp.int32), axis=1)
    return count, jnp.asarray(n, jnp.int32)


def gie_add(ix: GieIndex, ids, n, r, capacity, do) -> GieIndex:
    """``indexer.Add(hashes, pod r)`` when ``do``: every hash moved to the front of (or inserted into) pod
    ``r``'s LRU in order, then the oldest entries evicted down to ``capacity``."""
    G = ix.present.shape[1]
    H = ids.shape[0]
    lane = jnp.arange(H, dtype=jnp.int32)
    valid = (lane < n) & do
    tgt = jnp.where(valid, ids, G)
    was = ix.present.at[r, ids].get(mode="fill", fill_value=True)
    new = jnp.sum((valid & ~was).astype(jnp.int32))
    clk0 = ix.clk[r]
    stamp = ix.stamp.at[r, tgt].set(clk0 + lane, mode="drop")
    present = ix.present.at[r, tgt].set(True, mode="drop")
    clk = clk0 + jnp.where(do, jnp.asarray(n, jnp.int32), 0)
    size = ix.size[r] + new
    excess = size - jnp.maximum(jnp.asarray(capacity, jnp.int32), 1)
    row_s, row_p = stamp[r], present[r]

    def below(t):
        return jnp.sum((row_p & (row_s < t)).astype(jnp.int32))

    def cond(s):
        return s[0] < s[1]

    def body(s):
        lo, hi = s
        mid = lo + (hi - lo) // 2
        enough = below(mid) >= excess
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    # the smallest t with `excess` present entries stamped below it (none to find when excess <= 0)
    t, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), jnp.where(excess > 0, clk, 0)))
    gone = row_p & (row_s < t)
    present = present.at[r].set(row_p & ~gone)
    size = size - jnp.sum(gone.astype(jnp.int32))
    return GieIndex(stamp, present, ix.clk.at[r].set(clk), ix.size.at[r].set(size))

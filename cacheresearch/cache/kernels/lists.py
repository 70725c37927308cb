"""The doubly linked lists every per-block policy kernel is built from (numba, inlined).

A row (one replica's cache, one tier's row, one vLLM pool) holds its lists over block ids: ``o_[k]`` the
next older block, ``n_[k]`` the next newer one (-1 at the ends), ``w_[k]`` the list ``k`` is in (0: none).
A list's head (newest), tail (oldest) and count are the caller's locals while it works (kept in arrays,
the per-block code would reload them after every link write: ten times slower), stored back in the row's
scalars ``s`` when it is done.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["push", "unlink", "lead", "rows", "clear", "J"]

#: every kernel function: compiled where it is called (numba's IR inlining), cached on disk
J = numba.njit(cache=True, inline="always")


@J
def push(o_, n_, w_, head, tail, q, k):
    """Put ``k`` at the head (newest) of list ``q`` (head, tail); return the new (head, tail)."""
    o_[k] = head
    n_[k] = -1
    if head >= 0:
        n_[head] = k
    else:
        tail = k
    w_[k] = q
    return k, tail


@J
def unlink(o_, n_, w_, head, tail, k):
    """Take ``k`` out of its list (head, tail); return the new (head, tail)."""
    o, n = o_[k], n_[k]
    if n >= 0:
        o_[n] = o
    else:
        head = o
    if o >= 0:
        n_[o] = n
    else:
        tail = n
    w_[k] = 0
    return head, tail


@J
def lead(w_, ids, a, n, top):
    """The lookup: how many leading blocks of ``ids[a:a+n]`` are stored (``1 <= w_ <= top``)."""
    h = 0
    while h < n:
        w = w_[ids[a + h]]
        if w < 1 or w > top:
            break
        h += 1
    return h


@numba.njit(cache=True)
def rows(R, U):
    """``R`` empty rows over ``U`` block ids: (o_, n_, w_, a_), each [R, U]."""
    return (np.full((R, U), -1, np.int32), np.full((R, U), -1, np.int32), np.zeros((R, U), np.int32),
            np.zeros((R, U), np.int32))


@numba.njit(cache=True)
def clear(rep, off, nb, ids, o_, n_, w_, a_):
    """Return rows to :func:`rows`'s state after a run that sent request ``i`` (blocks ``ids[off[i]:off[i] +
    nb[i]]``) to row ``rep[i]``: a policy writes only the entries of the blocks ``get`` was called with, so
    these are all it may have changed. An engine keeps one set of rows per thread and clears it between
    configurations: allocating [R, U] afresh (the stream's distinct blocks times the rows) cost more than
    the run on a stream of unique blocks."""
    for i in range(rep.shape[0]):
        r, a = rep[i], off[i]
        for j in range(a, a + nb[i]):
            k = ids[j]
            o_[r, k], n_[r, k], w_[r, k], a_[r, k] = -1, -1, 0, 0

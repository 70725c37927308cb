"""The helpers of the routers' numba rules: plain Python in numba's subset (this module imports no numba).

A router's numba rule (``Router(numba=...)``, ``docs/adding_a_router.md``) is a function of the uniform argument
list :data:`ARGS` written in numba's subset (loops over ``range(nrep)``, integer arithmetic on int64). It reads
only its arguments, ``np`` and these helpers (``nb_*``): :mod:`cacheresearch.routers.dispatch` copies its source
into the generated dispatch module, where these helpers are compiled. The helpers are the integer twins of
:mod:`cacheresearch.routers.common` (``tests/reference_fleet.py`` mirrors both):

* :func:`nb_offset` (the tie-breaking offset ``off``), :func:`nb_scale` (``floor(b n / 2**32)``);
* :func:`nb_mix32` (``common.mix32`` of a prefix key's two words);
* :func:`nb_argmin_rot` (``common.argmin_rot`` over the replicas marked in ``elig``), :func:`nb_all` (mark
  every active replica);
* :func:`nb_i32` (a value wrapped to int32, as the JAX rules' int32 products) and :func:`nb_ratio16`
  (``routers.gie.ratio16``).

The arguments (:data:`ARGS`): ``i`` the request's index, ``n`` its blocks, ``pkh`` / ``pkl`` the two 32-bit words
of its prefix key, ``bits`` its four random words (int64 [4]), ``nrep`` the active replicas ``R``; per replica
(int64 [R_max], meaningful below ``nrep``): ``q`` queue, ``m`` match in the router's view (with ``gie``'s
CPU-tier scorer on, its index's count packed above: ``m = match + cpu x 2**32``), ``a`` active_blocks,
``tree`` tree_size, ``kvu`` kv_used, ``ac`` active_req; ``total`` the request's GIE hash count on the
``gie_estimate`` view (-1 on the others), ``cap`` the replica's capacity in blocks, ``kn`` the router's own knobs
(int64, in the order of its ``knobs``; a bool knob 0 / 1), ``ring`` the chwbl ring (int64 [R_max, V]),
scratch ``elig`` (bool [R_max]) and ``tmpv`` (int64 [R_max]), and the router's state: ``sr`` (int64
[R_max, state_replica]) and ``sg`` (int64 [state_global]), zero at the start of a run, kept across its requests.
A rule returns the chosen replica (an int in ``[0, nrep)``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ARGS", "HELPERS", "nb_offset", "nb_scale", "nb_mix32", "nb_all", "nb_argmin_rot", "nb_i32", "nb_ratio16"]

#: every router's numba rule takes these arguments, in this order
ARGS = "i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg"
#: the helpers a numba rule may call (compiled in the generated dispatch under these names)
HELPERS = ("nb_offset", "nb_scale", "nb_mix32", "nb_all", "nb_argmin_rot", "nb_i32", "nb_ratio16")
BIG = 2**31 - 1


def nb_scale(b, n):
    """``floor(b n / 2**32)`` for a 32-bit word ``b`` (``common.scale_bits``)."""
    return (b * n) >> 32


def nb_offset(bits, nrep):
    """The tie-breaking offset ``off = floor(bits[0] R / 2**32)`` (and the ``random`` router's pick)."""
    return (bits[0] * nrep) >> 32


def nb_mix32(hi, lo):
    """``common.mix32`` of a key's two 32-bit words (uint64 lanes, wrapping products)."""
    M = np.uint64(0xFFFFFFFF)
    h = (np.uint64(lo) ^ ((np.uint64(hi) * np.uint64(0x9E3779B1)) & M)) & M
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & M
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & M
    h ^= h >> np.uint64(16)
    return np.int64(h)


def nb_all(elig, nrep):
    """Mark the ``nrep`` active replicas eligible."""
    for r in range(nrep):
        elig[r] = True


def nb_argmin_rot(v, elig, nrep, off):
    """``common.argmin_rot``: the eligible replica minimising ``(v, (r - off) mod R)``; 0 if none."""
    vmin = np.int64(BIG)
    for r in range(nrep):
        if elig[r] and v[r] < vmin:
            vmin = v[r]
    best, brot = 0, BIG
    for r in range(nrep):
        if elig[r] and v[r] == vmin:
            rot = (r - off) % nrep
            if rot < brot:
                brot, best = rot, r
    return best


def nb_i32(x):
    """``x`` wrapped to int32 (the JAX rules' int32 products)."""
    return ((x + 2**31) % 2**32) - 2**31


def nb_ratio16(a, b):
    """``routers.gie.ratio16``: ``floor(65536 a / b)`` with both shifted right until ``b < 2**15``."""
    b = max(b, 1)
    s = 0
    while (b >> s) >= 2**15:
        s += 1
    return ((((a >> s) * 65536) + 2**31) % 2**32 - 2**31) // max(b >> s, 1)

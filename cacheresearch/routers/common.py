"""What every router rule reads, and the integer helpers the rules share.

:class:`RequestView` and :class:`FleetView` are the router's inputs (described in
:mod:`cacheresearch.routers`); :class:`Context` wraps them with the quantities several rules use
(active replicas, the tie-breaking offset, loads restricted to active replicas, the prefix hash,
the least-loaded replica), each computed once per decision, on first use.

The helpers are exact integer arithmetic on uint32 / int32 lanes (no x64 needed), mirrored in plain
Python by ``tests/reference_fleet.py``:

* :func:`mul32` (high and low words of a 64-bit product), :func:`scale_bits`
  (``floor(bits * n / 2**32)``);
* :func:`mix32` (the 64-bit key finaliser) and its Python twin :func:`prefix_hash_u64`;
  :func:`ring_positions` (the ``chwbl`` ring);
* :func:`argmin_rot` / :func:`argmax_rot` (ties broken by the rotation ``(r - off) mod R``) and
  :func:`clamp30`.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "RequestView",
    "FleetView",
    "Context",
    "M32",
    "BIG",
    "mul32",
    "scale_bits",
    "mix32",
    "prefix_hash_u64",
    "ring_positions",
    "argmin_rot",
    "argmax_rot",
    "clamp30",
]

M32 = 0xFFFFFFFF
BIG = jnp.int32(2**31 - 1)


class RequestView(NamedTuple):
    index: jax.Array  # int32 scalar
    arrival_ms: jax.Array  # int32
    n_blocks: jax.Array  # int32
    prefix_hi: jax.Array  # uint32: key of block min(K, n) - 1
    prefix_lo: jax.Array  # uint32
    bits: jax.Array  # uint32 [4]: this request's random words (drawn before the scan)
    instance: jax.Array  # int32: the router instance handling it


class FleetView(NamedTuple):
    replicas: jax.Array  # int32: active replicas R <= R_max
    match: jax.Array  # int32 [R_max]: leading-run blocks found in the view of each replica
    queue: jax.Array  # int32 [R_max]: in-flight requests
    active_blocks: jax.Array  # int32 [R_max]: blocks of the in-flight requests
    tree_size: jax.Array  # int32 [R_max]: blocks in the view
    kv_used: jax.Array | None = None  # int32 [R_max]: pool blocks in use (vllm replica); None: active_blocks
    match_total: jax.Array | None = None  # int32: view gie_estimate: the request's GIE hashes (None: other views)
    active_req: jax.Array | None = None  # int32 [R_max]: requests the router sent there and not finished, as the
    # llm-d EPP's active-request tracker counts them (vllm replica; None: ``queue``)
    match_cpu: jax.Array | None = None  # int32 [R_max]: view gie_estimate: the hashes the CPU-tier scorer's own GIE
    # index counts (llm-d's second approx-prefix-cache-producer; None: no such index)


def prefix_hash_u64(key: int) -> int:
    """Pure-Python twin of :func:`mix32` on a 64-bit key (for references and tests)."""
    hi, lo = (int(key) >> 32) & M32, int(key) & M32
    h = (lo ^ ((hi * 0x9E3779B1) & M32)) & M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def mix32(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """uint32 finaliser of a 64-bit key given as two lanes (murmur3 fmix32 of a folded key)."""
    hi = jnp.asarray(hi).astype(jnp.uint32)
    lo = jnp.asarray(lo).astype(jnp.uint32)
    h = lo ^ (hi * jnp.uint32(0x9E3779B1))
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return h


def ring_positions(max_replicas: int, max_vnodes: int) -> jax.Array:
    """uint32 [R_max, V_max]: ring position of node (r, v) = ``mix32(r, v)`` (``prefix_hash_u64((r << 32) | v)``)."""
    r = jnp.arange(max_replicas, dtype=jnp.uint32)[:, None]
    v = jnp.arange(max_vnodes, dtype=jnp.uint32)[None, :]
    return mix32(jnp.broadcast_to(r, (max_replicas, max_vnodes)), jnp.broadcast_to(v, (max_replicas, max_vnodes)))


def mul32(a, b):
    """High and low 32 bits of the 64-bit product of two uint32 values (no x64 needed)."""
    a = jnp.asarray(a).astype(jnp.uint32)
    b = jnp.asarray(b).astype(jnp.uint32)
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    lo = (mid << 16) | (p00 & 0xFFFF)
    return hi, lo


def scale_bits(bits, n):
    """``floor(bits * n / 2**32)`` for uint32 bits and 0 <= n < 2**32 (int32)."""
    return mul32(bits, n)[0].astype(jnp.int32)


def argmin_rot(v, active, R, off):
    """Index minimising (v, (r - off) mod R) over active replicas (int32 values)."""
    idx = jnp.arange(v.shape[0], dtype=jnp.int32)
    rot = jnp.mod(idx - off, jnp.maximum(R, 1))
    vmin = jnp.min(jnp.where(active, v, BIG))
    cand = active & (v == vmin)
    return jnp.argmin(jnp.where(cand, rot, BIG)).astype(jnp.int32)


def argmax_rot(v, active, R, off):
    """Index maximising (v, then the same rotation order) over active replicas (v >= 0)."""
    return argmin_rot(-v, active, R, off)


def clamp30(x):
    return jnp.minimum(x, jnp.int32(2**30))


class Context:
    """One routing decision's inputs and shared intermediate values (each computed on first use).

    ``req``, ``fleet``, ``params`` (a :class:`~cacheresearch.core.params.Params` or any object with
    the knob fields the rule reads), ``ring`` (:func:`ring_positions`, or ``None``: computed with 128
    vnodes when a rule asks for it).
    """

    def __init__(self, req: RequestView, fleet: FleetView, params, ring=None):
        self.req, self.fleet, self.params, self._ring = req, fleet, params, ring

    @cached_property
    def R(self):
        """Active replicas (int32)."""
        return self.fleet.replicas.astype(jnp.int32)

    @cached_property
    def Ru(self):
        return self.R.astype(jnp.uint32)

    @property
    def Rmax(self) -> int:
        """The static replica bound (length of the fleet vectors)."""
        return self.fleet.queue.shape[0]

    @cached_property
    def active(self):
        return jnp.arange(self.Rmax, dtype=jnp.int32) < self.R

    @cached_property
    def off(self):
        """Tie-breaking offset ``floor(bits[0] * R / 2**32)``."""
        return scale_bits(self.req.bits[0], self.Ru)

    @property
    def n(self):
        """Blocks of the request."""
        return self.req.n_blocks

    @cached_property
    def q(self):
        """``queue`` (0 on inactive replicas)."""
        return jnp.where(self.active, self.fleet.queue, 0)

    @cached_property
    def a(self):
        """``active_blocks`` (0 on inactive replicas)."""
        return jnp.where(self.active, self.fleet.active_blocks, 0)

    @cached_property
    def kv_used(self):
        """Pool blocks in use by running requests (``fleet.kv_used``; ``active_blocks`` when not given)."""
        kv = self.fleet.active_blocks if self.fleet.kv_used is None else self.fleet.kv_used
        return jnp.where(self.active, kv, 0)

    @cached_property
    def active_req(self):
        """In-flight requests as the router tracks them (``fleet.active_req``; ``queue`` when not given)."""
        c = self.fleet.queue if self.fleet.active_req is None else self.fleet.active_req
        return jnp.where(self.active, c, 0)

    @cached_property
    def m(self):
        """``match`` (0 on inactive replicas)."""
        return jnp.where(self.active, self.fleet.match, 0)

    @cached_property
    def qmax(self):
        return jnp.max(self.q)

    @cached_property
    def qmin(self):
        return jnp.min(jnp.where(self.active, self.q, BIG))

    @cached_property
    def prefix_hash(self):
        """``mix32`` of the request's prefix key (uint32)."""
        return mix32(self.req.prefix_hi, self.req.prefix_lo)

    @cached_property
    def least_loaded(self):
        """``argmin_rot(queue)``."""
        return argmin_rot(self.q, self.active, self.R, self.off)

    @cached_property
    def ring(self):
        return ring_positions(self.Rmax, 128) if self._ring is None else self._ring

    def argmin_rot(self, v, active=None):
        """:func:`argmin_rot` over the active replicas (or ``active``) with this request's offset."""
        return argmin_rot(v, self.active if active is None else active, self.R, self.off)

    def argmax_rot(self, v):
        return argmax_rot(v, self.active, self.R, self.off)

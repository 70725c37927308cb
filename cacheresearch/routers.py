"""Routers: which replica serves a request.

A router is a pure function ``route(req, fleet, params, key) -> replica`` evaluated inside the engine's
``lax.scan`` at the first chunk of each request:

* ``req`` (:class:`RequestView`): request index, arrival time, number of blocks, and the 64-bit key
  (two uint32 lanes) of block ``min(prefix_blocks, n) - 1``; because keys are chained, that one key
  identifies the request's first ``prefix_blocks`` blocks.
* ``fleet`` (:class:`FleetView`): the replicas' true state (per-key recency stamps, occupancy, the
  number of active replicas). Routers that read load or cache state (SGLang ``cache_aware``, Dynamo
  ``kv_cost``, bounded-load consistent hashing) take what they need from here; approximate routers
  will keep their own state next to it.
* ``params``: the :class:`cacheresearch.engine.Params` of the configuration (all knobs dynamic).

Routers available now:

``random``       uniform over the active replicas: 32 random bits per request, drawn from the PRNG
                 key before the scan, mapped to ``floor(bits * R / 2**32)``
``round_robin``  request ``i`` goes to replica ``i mod R``
``prefix_hash``  ``mix(key of block K-1) mod R`` with ``K = prefix_blocks`` (requests shorter than K
                 hash their last block; a request without blocks hashes key 0)

The router id is a dynamic parameter, so a grid over routers is one compiled program.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["ROUTERS", "router_id", "route", "prefix_hash_u64", "mix32", "RequestView", "FleetView"]

ROUTERS: dict[str, int] = {"random": 0, "round_robin": 1, "prefix_hash": 2}

_M = 0xFFFFFFFF


def router_id(name: str) -> int:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}") from None


class RequestView(NamedTuple):
    index: jax.Array  # int32 scalar
    arrival_ms: jax.Array  # int32
    n_blocks: jax.Array  # int32
    prefix_hi: jax.Array  # uint32: key of block min(K, n) - 1
    prefix_lo: jax.Array  # uint32
    random_bits: jax.Array  # uint32: this request's uniform draw (per key, drawn before the scan)


class FleetView(NamedTuple):
    stamp: jax.Array  # int32 [R_max, K]: recency stamp per key; stored iff stamp >= ptr[replica]
    ptr: jax.Array  # int32 [R_max]: eviction pointers
    occupancy: jax.Array  # int32 [R_max]
    replicas: jax.Array  # int32: active replicas R <= R_max


def prefix_hash_u64(key: int) -> int:
    """Pure-Python twin of the in-engine prefix hash (for references and tests)."""
    hi, lo = (int(key) >> 32) & _M, int(key) & _M
    h = (lo ^ ((hi * 0x9E3779B1) & _M)) & _M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M
    h ^= h >> 16
    return h


def mix32(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """uint32 finaliser of a 64-bit key given as two lanes (murmur3 fmix32 of a folded key)."""
    hi = hi.astype(jnp.uint32)
    lo = lo.astype(jnp.uint32)
    h = lo ^ (hi * jnp.uint32(0x9E3779B1))
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return h


def _random(req: RequestView, fleet: FleetView, params, key):
    # multiply-shift maps 32 uniform bits onto [0, R) (bias below R / 2**32)
    hi, _ = _mul32(req.random_bits, fleet.replicas.astype(jnp.uint32))
    return hi.astype(jnp.int32)


def _mul32(a, b):
    """High and low 32 bits of the 64-bit product of two uint32 values (no x64 needed)."""
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    lo = (mid << 16) | (p00 & 0xFFFF)
    return hi, lo


def _round_robin(req: RequestView, fleet: FleetView, params, key):
    return (req.index % fleet.replicas).astype(jnp.int32)


def _prefix_hash(req: RequestView, fleet: FleetView, params, key):
    h = mix32(req.prefix_hi, req.prefix_lo)
    return (h % fleet.replicas.astype(jnp.uint32)).astype(jnp.int32)


_BRANCHES = (_random, _round_robin, _prefix_hash)
assert len(_BRANCHES) == len(ROUTERS)


def route(router: jax.Array, req: RequestView, fleet: FleetView, params, key) -> jax.Array:
    """Replica index (int32) chosen by router id ``router`` (dynamic).

    The routers here are a few integer operations each, so all are evaluated and the chosen one
    selected (cheaper than a conditional per step, and identical under vmap). Routers that do real
    work per request should be dispatched with ``lax.switch`` instead.
    """
    out = jnp.int32(0)
    for i, fn in enumerate(_BRANCHES):
        out = jnp.where(router == i, fn(req, fleet, params, key), out)
    return out

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

``random``       uniform over the active replicas (a fresh draw per request from the PRNG key)
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
    k = jax.random.fold_in(key, req.index)
    return jax.random.randint(k, (), 0, fleet.replicas, dtype=jnp.int32)


def _round_robin(req: RequestView, fleet: FleetView, params, key):
    return (req.index % fleet.replicas).astype(jnp.int32)


def _prefix_hash(req: RequestView, fleet: FleetView, params, key):
    h = mix32(req.prefix_hi, req.prefix_lo)
    return (h % fleet.replicas.astype(jnp.uint32)).astype(jnp.int32)


_BRANCHES = (_random, _round_robin, _prefix_hash)
assert len(_BRANCHES) == len(ROUTERS)


def route(router: jax.Array, req: RequestView, fleet: FleetView, params, key) -> jax.Array:
    """Replica index (int32) chosen by router id ``router`` (dynamic)."""
    return jax.lax.switch(router, _BRANCHES, req, fleet, params, key)

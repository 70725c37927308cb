"""Fixed routes: the decisions of the load-free rules for a whole request sequence at once.

The rules of :data:`cacheresearch.routers.LOAD_FREE_ROUTERS` (``random``, ``round_robin``,
``prefix_hash``) read neither load nor cache, so the replica of every request is fixed before a run.
:func:`fixed_routes` evaluates the registered rules themselves (:func:`~cacheresearch.routers.route`,
vmapped over the requests), so the decisions are the engine's: ``random`` reads the engine's first
random word of each request (``request_bits`` column 0). The numba backends and the one-pass curves
route through here; they need no curve or engine module for it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.routers.common import FleetView, RequestView
from cacheresearch.routers.registry import REGISTRY, route, router_id

__all__ = ["fixed_routes", "prefix_keys"]


def prefix_keys(offsets: np.ndarray, n_blocks: np.ndarray, key_hi: np.ndarray, key_lo: np.ndarray,
                prefix_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """The routing key of every request (the engine's ``RequestView.prefix_hi/lo``): the key of block
    ``min(prefix_blocks, n) - 1``, 0 for a request without blocks. ``offsets``: each request's first
    block position in ``key_hi`` / ``key_lo``."""
    nb = np.asarray(n_blocks, np.int64)
    pos = np.asarray(offsets, np.int64) + np.clip(np.minimum(int(prefix_blocks), nb) - 1, 0, None)
    size = np.asarray(key_hi).shape[0]
    if size == 0:
        z = np.zeros(nb.shape[0], np.uint32)
        return z, z
    pos = np.minimum(pos, size - 1)
    has = nb > 0
    return (np.where(has, np.asarray(key_hi)[pos], 0).astype(np.uint32),
            np.where(has, np.asarray(key_lo)[pos], 0).astype(np.uint32))


def first_bits(keys, n: int) -> np.ndarray:
    """Column 0 of the engine's ``request_bits`` for ``n`` requests under each PRNG key: uint32 [len(keys), n]
    (what ``random`` routing draws; one compiled call for every key)."""
    kk = jnp.stack(list(keys)) if not hasattr(keys, "shape") else keys
    return np.asarray(_first_bits(kk, n))


def fixed_routes(router: str, replicas: int, n: int, *, prefix_hi=None, prefix_lo=None, keys=None,
                 bits0=None) -> np.ndarray:
    """The replica of each of ``n`` requests under the load-free rule ``router`` on ``replicas``
    replicas: int32 [len(keys), n] (one row when ``keys`` is None). ``prefix_hi``/``prefix_lo``
    (:func:`prefix_keys`) are needed by the rules that read ``prefix_blocks``; ``keys``: PRNG keys,
    needed by ``random`` (or ``bits0``, their :func:`first_bits`, drawn once for several calls). One
    compiled call for all rows (lengths padded to a power of two, so one compile serves many workloads)."""
    if router not in REGISTRY.load_free():
        raise ValueError(f"router {router!r} reads load or cache state (or is unknown); a fixed route needs one of "
                         f"{', '.join(REGISTRY.load_free())}")
    G = len(bits0) if bits0 is not None else 1 if keys is None else len(keys)
    b0 = np.zeros((G, n), np.uint32)
    if router == "random":
        if keys is None and bits0 is None:
            raise ValueError("random routing needs PRNG keys")
        b0 = np.asarray(bits0, np.uint32) if bits0 is not None else first_bits(keys, n)  # request_bits column 0
    if prefix_hi is None or router not in REGISTRY.knob_readers("prefix_blocks"):
        prefix_hi = prefix_lo = np.zeros(n, np.uint32)
    L = G * n
    pad = (1 << max(L - 1, 0).bit_length()) - L
    cols = [np.tile(np.arange(n, dtype=np.int32), G), np.tile(np.asarray(prefix_hi, np.uint32), G),
            np.tile(np.asarray(prefix_lo, np.uint32), G), b0.reshape(-1)]
    cols = [np.pad(np.asarray(x), (0, pad)) for x in cols]
    out = _route_batch(router_id(router), int(replicas), *cols)
    return np.asarray(out, dtype=np.int32)[:L].reshape(G, n)


@partial(jax.jit, static_argnums=1)
def _first_bits(keys, n: int):
    """Column 0 of the engine's ``request_bits`` for ``n`` requests under each PRNG key (one compiled call:
    the same draws as eager calls, without a dispatch per operation)."""
    return jax.vmap(lambda k: jax.random.bits(k, (n + 1,), jnp.uint32))(keys)[:, :n]


@partial(jax.jit, static_argnums=(0, 1))
def _route_batch(rid: int, replicas: int, index, prefix_hi, prefix_lo, bits0):
    """Router ``rid``'s decision for every request (vmapped :func:`cacheresearch.routers.route`) on a
    fleet of ``replicas`` that the rule does not read."""
    n = index.shape[0]
    zero = jnp.zeros(n, jnp.int32)
    bits = jnp.concatenate([bits0[:, None], jnp.zeros((n, 3), jnp.uint32)], axis=1)
    req = RequestView(index=index, arrival_ms=zero, n_blocks=zero, prefix_hi=prefix_hi, prefix_lo=prefix_lo,
                      bits=bits, instance=zero)
    empty = jnp.zeros(replicas, jnp.int32)
    fleet = FleetView(replicas=jnp.int32(replicas), match=empty, queue=empty, active_blocks=empty, tree_size=empty)
    return jax.vmap(lambda r: route(rid, r, fleet, None, compiled=(rid,)))(req)

"""``chwbl``: consistent hashing with bounded loads [``vnodes``, ``chwbl_c_pct``; ``prefix_blocks``].

Mirrokni, Thorup, Zadimoghaddam 2018; KubeAI, HAProxy. Ring nodes ``(r, v)`` for ``r < R``,
``v < vnodes`` at ``mix32(r, v)``; the key's point is ``mix32(prefix key)``;
``cap = ceil(c_pct * (sum(queue) + 1) / (100 R))``; the node reached first walking clockwise
(smallest ``(node - point) mod 2**32``, ties by ``(r, v)``) among replicas with ``queue[r] < cap``.
After assignment no replica holds more than ``cap``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from cacheresearch.routers.common import BIG, M32, Context
from cacheresearch.routers.numba_rules import nb_mix32
from cacheresearch.routers.registry import Knob, Router, register


def rule(ctx: Context):
    """Consistent hashing with bounded loads."""
    params, q, active, R, Rmax, h = ctx.params, ctx.q, ctx.active, ctx.R, ctx.Rmax, ctx.prefix_hash
    ring = ctx.ring
    V = ring.shape[1]
    total = jnp.sum(q)
    denom = 100 * R
    cap = (params.chwbl_c_pct * (total + 1) + denom - 1) // denom
    dist = ring - h  # uint32 wrap = clockwise distance
    node_ok = active[:, None] & (jnp.arange(V, dtype=jnp.int32)[None, :] < params.vnodes) & (q < cap)[:, None]
    # order (distance, r, v): compare distance first, then the flat index r * V + v
    dmin = jnp.min(jnp.where(node_ok, dist, jnp.uint32(M32)))
    flat = jnp.arange(Rmax * V, dtype=jnp.int32).reshape(Rmax, V)
    best = jnp.min(jnp.where(node_ok & (dist == dmin), flat, BIG))
    return jnp.minimum(best // V, Rmax - 1).astype(jnp.int32)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    vnodes, c_pct = kn[0], kn[1]
    h = nb_mix32(pkh, pkl)
    total_q = 0
    for r in range(nrep):
        total_q += q[r]
    denom = 100 * nrep
    lim = (c_pct * (total_q + 1) + denom - 1) // denom
    V = ring.shape[1]
    bd, best = np.int64(2**33), np.int64(2**31 - 1)
    for r in range(nrep):
        if q[r] < lim:
            for v in range(min(vnodes, V)):
                d = (ring[r, v] - h) & 0xFFFFFFFF
                if d < bd or (d == bd and r * V + v < best):
                    bd, best = d, r * V + v
    return min(best // V, ring.shape[0] - 1)


KNOBS = (
    Knob("vnodes", 100, 1, 2**16, doc="ring nodes per replica (at most the engine's max_vnodes)", unit="nodes"),
    Knob("chwbl_c_pct", 125, 100, 10**6, doc="load bound c: no replica above ceil(c (in flight + 1) / R)",
         unit="1/100"),
)

ROUTER = register(Router(
    name="chwbl", id=5, rule=rule, knobs=KNOBS, uses=("prefix_blocks",), reads_load=True,
    summary="first ring node clockwise from ``mix32(prefix key)`` among replicas with "
            "``queue < ceil(c_pct (sum(queue) + 1) / (100 R))``",
    source="Mirrokni, Thorup, Zadimoghaddam 2018; KubeAI, HAProxy",
    doc=__doc__, numba=numba_rule,
))

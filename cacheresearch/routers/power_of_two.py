"""``power_of_two``: the less loaded of two random replicas.

``a = floor(bits[1] R / 2**32)``, ``b = (a + 1 + floor(bits[2] (R-1) / 2**32)) mod R`` (``b = a`` when
``R = 1``); ``b`` if ``queue[b] < queue[a]`` else ``a``.
"""

from __future__ import annotations

import jax.numpy as jnp

from cacheresearch.routers.common import Context, scale_bits
from cacheresearch.routers.numba_rules import nb_scale
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    req, q, R, Ru = ctx.req, ctx.q, ctx.R, ctx.Ru
    pa = scale_bits(req.bits[1], Ru)
    pb = jnp.where(R > 1, jnp.mod(pa + 1 + scale_bits(req.bits[2], jnp.maximum(R - 1, 0).astype(jnp.uint32)), R), pa)
    return jnp.where(q[pb] < q[pa], pb, pa).astype(jnp.int32)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    pa = nb_scale(bits[1], nrep)
    pb = (pa + 1 + nb_scale(bits[2], nrep - 1)) % nrep if nrep > 1 else pa
    return pb if q[pb] < q[pa] else pa


ROUTER = register(Router(
    name="power_of_two", id=4, rule=rule, reads_load=True,
    summary=("two distinct random replicas (``bits[1]``, ``bits[2]``); the one with the shorter queue, "
             "the first on ties"),
    source="the power of two choices (Mitzenmacher 2001)",
    doc=__doc__, numba=numba_rule,
))

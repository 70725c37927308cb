"""``round_robin``: ``i mod R``.

Request ``i`` (its index in arrival order) goes to replica ``i mod R``.
"""

from __future__ import annotations

import jax.numpy as jnp

from cacheresearch.routers.common import Context
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    return jnp.mod(ctx.req.index, ctx.R).astype(jnp.int32)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    return i % nrep


ROUTER = register(Router(
    name="round_robin", id=1, rule=rule,
    summary="``i mod R``",
    doc=__doc__, numba=numba_rule,
))

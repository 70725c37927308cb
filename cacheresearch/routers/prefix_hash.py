"""``prefix_hash``: ``mix32(prefix key) mod R`` [``prefix_blocks``].

The prefix key is the 64-bit key of block ``min(prefix_blocks, n) - 1`` (chained keys: it names the
first ``prefix_blocks`` blocks); ``mix32`` is the uint32 finaliser of
:mod:`cacheresearch.routers.common` (``prefix_hash_u64`` its Python twin). Pure affinity: every request
of a prefix goes to one replica, whatever its load.
"""

from __future__ import annotations

import jax.numpy as jnp

from cacheresearch.routers.common import Context
from cacheresearch.routers.numba_rules import nb_mix32
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    return (ctx.prefix_hash % ctx.Ru).astype(jnp.int32)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    return nb_mix32(pkh, pkl) % nrep


ROUTER = register(Router(
    name="prefix_hash", id=2, rule=rule, uses=("prefix_blocks",),
    summary="``mix32(prefix key) mod R``",
    doc=__doc__, numba=numba_rule,
))

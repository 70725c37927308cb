"""``random``: ``floor(bits[0] * R / 2**32)``.

The request's first random word scaled to the ``R`` active replicas: a uniformly random replica,
reproducible from the words drawn before the scan (``engine.request_bits``). The same value is the
tie-breaking offset ``off`` of every other rule.
"""

from __future__ import annotations

from cacheresearch.routers.common import Context
from cacheresearch.routers.numba_rules import nb_offset
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    return ctx.off


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    return nb_offset(bits, nrep)


ROUTER = register(Router(
    name="random", id=0, rule=rule,
    summary="``floor(bits[0] * R / 2**32)``",
    doc=__doc__, numba=numba_rule,
))

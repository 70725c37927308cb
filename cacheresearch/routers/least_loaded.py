"""``least_loaded``: ``argmin_rot(queue)``.

The replica with the fewest requests in flight at arrival, ties broken by the request's rotation
(a uniformly random replica among the tied ones).
"""

from __future__ import annotations

from cacheresearch.routers.common import Context
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    return ctx.least_loaded


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    nb_all(elig, nrep)
    return nb_argmin_rot(q, elig, nrep, nb_offset(bits, nrep))


ROUTER = register(Router(
    name="least_loaded", id=3, rule=rule, reads_load=True,
    summary="``argmin_rot(queue)``",
    doc=__doc__, numba=numba_rule,
))

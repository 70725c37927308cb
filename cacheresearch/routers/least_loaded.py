"""``least_loaded``: ``argmin_rot(queue)``.

The replica with the fewest requests in flight at arrival, ties broken by the request's rotation
(a uniformly random replica among the tied ones).
"""

from __future__ import annotations

from cacheresearch.routers.common import Context
from cacheresearch.routers.registry import Router, register


def rule(ctx: Context):
    return ctx.least_loaded


ROUTER = register(Router(
    name="least_loaded", id=3, rule=rule, reads_load=True,
    summary="``argmin_rot(queue)``",
    doc=__doc__,
))

"""``least_recent``: the replica served least recently, ties to the lowest index.

The router remembers, for each replica, ``i + 1`` for the last request ``i`` it sent there (0: none yet). Request
``i`` goes to the active replica with the smallest such stamp (ties: the lowest index), which is then stamped
``i + 1``. On a fleet of fixed size this is ``i mod R`` (``round_robin``) computed from memory rather than from the
index: it is the example of a router with state (``docs/adding_a_router.md``), one int64 slot per replica
(``state_replica=1``) that its numba rule reads and updates. The numba engines run it; the JAX engine refuses it
(its scan carries no router state).
"""

from __future__ import annotations

from cacheresearch.routers.registry import Router, register


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    best = 0
    for r in range(1, nrep):
        if sr[r, 0] < sr[best, 0]:
            best = r
    sr[best, 0] = i + 1
    return best


ROUTER = register(Router(
    name="least_recent", id=11, numba=numba_rule, state_replica=1,
    summary="the replica whose last request is the oldest (never served: first), ties to the lowest index",
    source="an example of a router with state (equal to ``round_robin`` on a fleet of fixed size)",
    doc=__doc__,
))

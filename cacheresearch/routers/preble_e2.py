"""``preble_e2``: Preble E2 (arXiv 2407.00023) [``preble_rel_pct``, ``preble_abs``].

If ``100 max(queue) > preble_rel_pct min(queue)`` and ``max(queue) - min(queue) > preble_abs``:
``argmin_rot(queue)`` (rebalance); else with ``m* = max(match)``: if ``m* > 0`` and ``n - m* < m*``
exploit: ``argmin_rot(active_blocks)`` over replicas with ``match[r] = m*``; else explore:
``argmin_rot(active_blocks + n - match)`` (load plus this request's prefill, both in blocks).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from cacheresearch.routers.common import BIG, Context, clamp30
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.routers.registry import Knob, Router, register


def rule(ctx: Context):
    """Preble E2."""
    params, m, a, n, ll, active = ctx.params, ctx.m, ctx.a, ctx.n, ctx.least_loaded, ctx.active
    reb = (ctx.qmax * 100 > params.preble_rel_pct * ctx.qmin) & ((ctx.qmax - ctx.qmin) > params.preble_abs)
    mstar = jnp.max(m)
    exploit = (mstar > 0) & (n - mstar < mstar)
    ex = ctx.argmin_rot(jnp.where(m == mstar, a, BIG), active & (m == mstar))
    explore = ctx.argmin_rot(clamp30(a) + clamp30(n - m))
    return jnp.where(reb, ll, jnp.where(exploit, ex, explore))


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    rel, ab = kn[0], kn[1]
    qmax, qmin = 0, np.int64(2**31 - 1)
    for r in range(nrep):
        qmax, qmin = max(qmax, q[r]), min(qmin, q[r])
    nb_all(elig, nrep)
    off = nb_offset(bits, nrep)
    ll = nb_argmin_rot(q, elig, nrep, off)
    if qmax * 100 > rel * qmin and qmax - qmin > ab:
        return ll
    mstar = 0
    for r in range(nrep):
        mstar = max(mstar, m[r])
    if mstar > 0 and n - mstar < mstar:
        for r in range(nrep):
            elig[r] = m[r] == mstar
            tmpv[r] = a[r] if m[r] == mstar else 2**31 - 1
        return nb_argmin_rot(tmpv, elig, nrep, off)
    for r in range(nrep):
        tmpv[r] = min(a[r], 2**30) + min(n - m[r], 2**30)
    return nb_argmin_rot(tmpv, elig, nrep, off)


KNOBS = (
    Knob("preble_rel_pct", 150, 0, 10**6, doc="rebalance when max queue exceeds this multiple of min queue ...",
         unit="1/100"),
    Knob("preble_abs", 8, 0, 2**30, doc="... and max - min queue exceeds this (an absolute guard: ours)",
         unit="requests"),
)

ROUTER = register(Router(
    name="preble_e2", id=9, rule=rule, knobs=KNOBS, reads_cache=True, reads_load=True,
    summary="imbalanced: ``argmin_rot(queue)``; a long match: least ``active_blocks`` among the longest "
            "matches; else ``argmin_rot(active_blocks + n - match)``",
    source="Preble (arXiv 2407.00023), E2 scheduling",
    doc=__doc__, numba=numba_rule,
))

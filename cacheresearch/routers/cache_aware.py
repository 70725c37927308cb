"""``cache_aware``: the SGLang router
[``balance_abs``, ``balance_rel_pct``, ``cache_threshold_pm``, ``miss_smallest_tree``].

If ``max(queue) - min(queue) > balance_abs`` and ``100 max(queue) > balance_rel_pct min(queue)``:
``argmin_rot(queue)``; else ``b = argmax_rot(match)``; if ``1000 match[b] > cache_threshold_pm * n``:
``b``; else ``argmin_rot(tree_size)`` when ``miss_smallest_tree`` (older releases: the "death spiral" of
sglang PR 14305), otherwise ``argmin_rot(queue)``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from cacheresearch.routers.common import Context
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.routers.registry import Knob, Router, register


def rule(ctx: Context):
    """SGLang cache_aware."""
    params, m, n, ll, active = ctx.params, ctx.m, ctx.n, ctx.least_loaded, ctx.active
    imbalanced = ((ctx.qmax - ctx.qmin) > params.balance_abs) & (ctx.qmax * 100 > params.balance_rel_pct * ctx.qmin)
    b = ctx.argmax_rot(m)
    hit = (m[b] * 1000 > params.cache_threshold_pm * n) & (n > 0)
    miss = jnp.where(params.miss_smallest_tree, ctx.argmin_rot(jnp.where(active, ctx.fleet.tree_size, 0)), ll)
    return jnp.where(imbalanced, ll, jnp.where(hit, b, miss))


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    ct_pm, bal_abs, bal_rel, miss_tree = kn[0], kn[1], kn[2], kn[3]
    qmax, qmin = 0, np.int64(2**31 - 1)
    for r in range(nrep):
        qmax, qmin = max(qmax, q[r]), min(qmin, q[r])
    nb_all(elig, nrep)
    off = nb_offset(bits, nrep)
    ll = nb_argmin_rot(q, elig, nrep, off)
    if qmax - qmin > bal_abs and qmax * 100 > bal_rel * qmin:
        return ll
    for r in range(nrep):
        tmpv[r] = -m[r]
    b = nb_argmin_rot(tmpv, elig, nrep, off)
    if n > 0 and m[b] * 1000 > ct_pm * n:
        return b
    return nb_argmin_rot(tree, elig, nrep, off) if miss_tree != 0 else ll


KNOBS = (
    Knob("cache_threshold_pm", 300, 0, 1000, doc="a hit needs more than this share of the request matched",
         unit="1/1000"),
    Knob("balance_abs", 64, 0, 2**30, doc="imbalanced when max - min queue exceeds this ...", unit="requests"),
    Knob("balance_rel_pct", 150, 0, 10**6, doc="... and max queue exceeds this multiple of min queue", unit="1/100"),
    Knob("miss_smallest_tree", False, kind="bool",
         doc="a miss goes to the smallest tree, not the least loaded replica (older releases)"),
)

ROUTER = register(Router(
    name="cache_aware", id=6, rule=rule, knobs=KNOBS, reads_cache=True, reads_load=True,
    summary="imbalanced queues: ``argmin_rot(queue)``; else the longest match if above the threshold; "
            "else ``argmin_rot(queue)`` (``argmin_rot(tree_size)`` with ``miss_smallest_tree``)",
    source="SGLang router (sgl-model-gateway src/policies/cache_aware.rs)",
    doc=__doc__, numba=numba_rule,
))

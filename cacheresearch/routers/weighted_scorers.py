"""``weighted_scorers``: llm-d / Gateway API Inference Extension
[``prefix_weight_pct``, ``load_weight_pct``, ``queue_threshold``].

``prefix = floor(1024 match[r] / n)`` (0 when ``n = 0``), ``load = floor(512 (T - min(queue[r], T)) / T)``
(0.5 at an empty queue falling to 0 at ``T``), score ``prefix_weight_pct * prefix + load_weight_pct *
load``; ``argmax_rot(score)`` (max wins, ties random). Scores are quantised to 1/1024.
"""

from __future__ import annotations

import jax.numpy as jnp

from cacheresearch.routers.common import Context
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.routers.registry import Knob, Router, register


def rule(ctx: Context):
    """llm-d weighted scorers."""
    params, m, q, n = ctx.params, ctx.m, ctx.q, ctx.n
    T = jnp.maximum(params.queue_threshold, 1)
    pscore = jnp.where(n > 0, (m * 1024) // jnp.maximum(n, 1), 0)
    lscore = (512 * (T - jnp.minimum(q, T))) // T
    score = params.prefix_weight_pct * pscore + params.load_weight_pct * lscore
    return ctx.argmax_rot(score)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    pw, lw, T = kn[0], kn[1], max(kn[2], 1)
    for r in range(nrep):
        psc = (m[r] * 1024) // max(n, 1) if n > 0 else 0
        tmpv[r] = -(pw * psc + lw * ((512 * (T - min(q[r], T))) // T))
    nb_all(elig, nrep)
    return nb_argmin_rot(tmpv, elig, nrep, nb_offset(bits, nrep))


KNOBS = (
    Knob("prefix_weight_pct", 200, 0, 10**4, doc="weight of the prefix scorer (share of the request matched)",
         unit="1/100"),
    Knob("load_weight_pct", 100, 0, 10**4, doc="weight of the load (queue) scorer", unit="1/100"),
    Knob("queue_threshold", 128, 1, 2**20, doc="T: the load score falls from 0.5 at an empty queue to 0 at T",
         unit="requests"),
)

ROUTER = register(Router(
    name="weighted_scorers", id=8, rule=rule, knobs=KNOBS, reads_cache=True, reads_load=True,
    summary=("``argmax_rot(prefix_weight_pct floor(1024 match / n) + "
             "load_weight_pct floor(512 (T - min(queue, T)) / T))``"),
    source="llm-d inference scheduler / Gateway API Inference Extension",
    doc=__doc__, numba=numba_rule,
))

"""``kv_cost``: the NVIDIA Dynamo KV router [``overlap_weight_pct``, ``temperature``].

``cost[r] = overlap_weight_pct * (n - match[r]) + 100 * active_blocks[r]`` (integers, each term clamped
to ``2**30``); temperature 0: ``argmin_rot(cost)``; temperature ``t > 0``: sample
``softmax(-(cost - min) / max(max - min, 1) / t)`` (float32) with ``u = (bits[3] >> 8) / 2**24``: the
first ``r`` whose cumulative probability exceeds ``u`` (the last active replica if rounding leaves
none).
"""

from __future__ import annotations

import jax.numpy as jnp

from cacheresearch.routers.common import BIG, Context, clamp30
from cacheresearch.routers.numba_rules import nb_all, nb_argmin_rot, nb_offset
from cacheresearch.routers.registry import Knob, Router, register


def rule(ctx: Context):
    """NVIDIA Dynamo KV router cost."""
    params, m, a, n, active, R, req = ctx.params, ctx.m, ctx.a, ctx.n, ctx.active, ctx.R, ctx.req
    cost = clamp30(params.overlap_weight_pct * clamp30(n - m)) + clamp30(100 * clamp30(a))
    greedy = ctx.argmin_rot(cost)
    cmin = jnp.min(jnp.where(active, cost, BIG)).astype(jnp.float32)
    cmax = jnp.max(jnp.where(active, cost, 0)).astype(jnp.float32)
    temp = jnp.maximum(params.temperature.astype(jnp.float32), jnp.float32(1e-6))
    z = -(cost.astype(jnp.float32) - cmin) / jnp.maximum(cmax - cmin, jnp.float32(1.0)) / temp
    e = jnp.where(active, jnp.exp(z), jnp.float32(0.0))
    p = e / jnp.sum(e)
    u = (req.bits[3] >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
    c = jnp.cumsum(p)
    over = active & (c > u)
    sampled = jnp.where(jnp.any(over), jnp.argmax(over).astype(jnp.int32), R - 1)
    return jnp.where(params.temperature > 0, sampled, greedy)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    ow = kn[0]
    for r in range(nrep):
        tmpv[r] = min(ow * min(n - m[r], 2**30), 2**30) + min(100 * min(a[r], 2**30), 2**30)
    nb_all(elig, nrep)
    return nb_argmin_rot(tmpv, elig, nrep, nb_offset(bits, nrep))


def numba_refusal(p):
    """The numba rule is the greedy one (temperature 0)."""
    if float(p.temperature) > 0:
        return "kv_cost at temperature > 0 (float32 softmax sampling: JAX only)"
    return None


KNOBS = (
    Knob("overlap_weight_pct", 100, 0, 10**4, doc="weight of the blocks to prefill against the active blocks",
         unit="1/100"),
    Knob("temperature", 0.0, 0, kind="float", doc="0: the cheapest replica; > 0: softmax sampling of -cost"),
)

ROUTER = register(Router(
    name="kv_cost", id=7, rule=rule, knobs=KNOBS, reads_cache=True, reads_load=True,
    summary="``argmin_rot(overlap_weight_pct (n - match) + 100 active_blocks)``; softmax sampling at "
            "``temperature > 0``",
    source="NVIDIA Dynamo docs/router/kv_cache_routing.md",
    doc=__doc__, numba=numba_rule, numba_refusal=numba_refusal,
))

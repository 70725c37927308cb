"""The replica queue: one FCFS server per replica, integer milliseconds (docs/fleet_semantics.md).

A request dispatched at ``now`` to replica ``r`` starts at ``max(now, busy[r])``; its service is the
prefill of its uncached tokens, ``ceil(uncached * 1000 / prefill_tps)`` ms, plus its decode share,
``ceil(output * decode_us_per_token / 1000)`` ms; TTFT = wait + prefill. The loads a router reads
(requests in flight, their blocks) come from a ring of the last ``Q`` dispatches per replica; a
dispatch that finds every slot still in flight is counted in ``qover`` (loads would undercount), and a
finish time that saturates int32 sets ``tover``. Neither is ever silent.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["QueueState", "init_queue", "loads", "dispatch", "sat_add", "ms_of", "LIM"]

LIM = 2**31 - 1


class QueueState(NamedTuple):
    fin: jax.Array  # int32 [R, Q] finish times of the last Q dispatches
    blk: jax.Array  # int32 [R, Q] their blocks
    ins: jax.Array  # int32 [R, Q] the router instance that sent them
    head: jax.Array  # int32 [R] next slot
    busy: jax.Array  # int32 [R] busy-until time
    busy_ms: jax.Array  # int32 [R] service time served
    qover: jax.Array  # int32 dispatches that found every slot in flight
    tover: jax.Array  # bool a time saturated


def init_queue(R: int, Q: int) -> QueueState:
    z = jnp.zeros((R, Q), jnp.int32)
    zr = jnp.zeros(R, jnp.int32)
    return QueueState(z, z, z, zr, zr, zr, jnp.int32(0), jnp.bool_(False))


def sat_add(a, b):
    """a + b for non-negative int32, saturating at 2**31 - 1; returns (sum, saturated)."""
    over = a > LIM - b
    return jnp.where(over, LIM, a + b), over


def ms_of(units, per, scale):
    """``ceil(units * scale / per)`` exactly in int32 (``per`` >= 1; saturates); (value, saturated)."""
    q, rem = units // per, units % per
    big = q > (LIM - scale) // jnp.maximum(scale, 1)
    head = jnp.where(big, LIM - scale, q * scale)
    return head + (rem * scale + per - 1) // per, big


def loads(q: QueueState, now, u, local_load):
    """(requests in flight [R], their blocks [R], blocks pinned per replica [R]) at ``now``; with
    ``local_load`` the first two count only instance ``u``'s dispatches."""
    live = q.fin > now
    mine = live & ((~local_load) | (q.ins == u))
    return (jnp.sum(mine.astype(jnp.int32), axis=1), jnp.sum(jnp.where(mine, q.blk, 0), axis=1),
            jnp.sum(jnp.where(live, q.blk, 0), axis=1))


def dispatch(q: QueueState, r, now, real, uncached_tokens, output_tokens, n_blocks, u, params):
    """Serve a request on replica ``r`` (when ``real``); returns (state, TTFT ms)."""
    Q = q.fin.shape[1]
    pre_ms, o1 = ms_of(uncached_tokens, params.prefill_tps, jnp.int32(1000))
    dec_ms, o2 = ms_of(output_tokens, jnp.int32(1000), params.decode_us_per_token)
    start = jnp.maximum(now, q.busy[r])
    svc, o3 = sat_add(pre_ms, dec_ms)
    fin, o4 = sat_add(start, svc)
    ttft, o5 = sat_add(start - now, pre_ms)
    head = q.head[r]
    slot = jnp.where(real, head, Q)
    bms, o6 = sat_add(q.busy_ms[r], svc)
    return QueueState(
        fin=q.fin.at[r, slot].set(fin, mode="drop"),
        blk=q.blk.at[r, slot].set(n_blocks, mode="drop"),
        ins=q.ins.at[r, slot].set(u, mode="drop"),
        head=q.head.at[r].set(jnp.where(real, jnp.mod(head + 1, Q), head)),
        busy=q.busy.at[r].set(jnp.where(real, fin, q.busy[r])),
        busy_ms=q.busy_ms.at[r].set(jnp.where(real, bms, q.busy_ms[r])),
        qover=q.qover + (real & (q.fin[r, head] > now)).astype(jnp.int32),
        tover=q.tover | (real & (o1 | o2 | o3 | o4 | o5 | o6)),
    ), ttft

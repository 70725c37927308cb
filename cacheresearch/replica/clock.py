"""An exact 64-bit picosecond clock in int32 lanes (no x64): a time is ``ms * 10**9 + ps`` picoseconds.

The vllm replica's clock (:mod:`cacheresearch.replica.vllm`) and its step model need more than int32
and must stay exact integer arithmetic on every backend (TPUs emulate int64; JAX's x64 mode is global).
A :class:`Time` is a pair of int32 arrays, ``ms`` (whole milliseconds, as the arrivals are counted) and
``ps`` in ``[0, 10**9)``, so the clock spans ``2**31 - 1`` ms (24.8 days: the arrivals' own int32 ms
bound) at picosecond resolution. Every function here is exact; a result past the span saturates at
:data:`MS_LIM` ms, which the replica reports as ``time_overflow``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["PS_PER_MS", "MS_LIM", "Time", "t_zero", "t_ms", "t_add", "t_sub", "t_le", "t_lt", "t_mul",
           "t_scale", "t_sum", "t_fs_to_ps", "t_ceil_ms", "t_div", "t_where", "t_max", "t_float_ms"]

PS_PER_MS = 10**9
MS_LIM = 2**31 - 1


class Time(NamedTuple):
    ms: jax.Array  # int32 whole milliseconds
    ps: jax.Array  # int32 picoseconds in [0, 10**9)


def t_zero(shape=()) -> Time:
    z = jnp.zeros(shape, jnp.int32)
    return Time(z, z)


def t_ms(ms) -> Time:
    ms = jnp.asarray(ms, jnp.int32)
    return Time(ms, jnp.zeros_like(ms))


def t_add(a: Time, b: Time) -> Time:
    """``a + b``, saturating at :data:`MS_LIM` ms (``a, b >= 0``)."""
    ps = a.ps + b.ps  # < 2 * 10**9 < 2**31
    carry = (ps >= PS_PER_MS).astype(jnp.int32)
    over = a.ms > MS_LIM - b.ms - carry
    return Time(jnp.where(over, MS_LIM, a.ms + b.ms + carry), ps - carry * PS_PER_MS)


def t_sub(a: Time, b: Time) -> Time:
    """``a - b`` (``a >= b``)."""
    ps = a.ps - b.ps
    borrow = (ps < 0).astype(jnp.int32)
    return Time(a.ms - b.ms - borrow, ps + borrow * PS_PER_MS)


def t_le(a: Time, b: Time):
    return (a.ms < b.ms) | ((a.ms == b.ms) & (a.ps <= b.ps))


def t_lt(a: Time, b: Time):
    return (a.ms < b.ms) | ((a.ms == b.ms) & (a.ps < b.ps))


def t_where(c, a: Time, b: Time) -> Time:
    return Time(jnp.where(c, a.ms, b.ms), jnp.where(c, a.ps, b.ps))


def t_max(a: Time, b: Time) -> Time:
    return t_where(t_le(b, a), a, b)


def _digits(x):
    return x % 1000, (x // 1000) % 1000, x // 1_000_000


def t_mul(x, y) -> Time:
    """``x * y`` picoseconds exactly, ``x, y`` int32 in ``[0, 2**31)``: long multiplication in base 1000."""
    x0, x1, x2 = _digits(jnp.asarray(x, jnp.int32))
    y0, y1, y2 = _digits(jnp.asarray(y, jnp.int32))
    c = x0 * y0
    d0 = c % 1000
    c = x0 * y1 + x1 * y0 + c // 1000
    d1 = c % 1000
    c = x0 * y2 + x1 * y1 + x2 * y0 + c // 1000
    d2 = c % 1000
    c = x1 * y2 + x2 * y1 + c // 1000  # < 5e6: whole ms
    top = x2 * y2  # < 4.7e6, weight 10**12 ps = 1000 ms
    ms = jnp.where(top >= 2_000_000, MS_LIM, top * 1000 + c)
    return Time(ms, d0 + d1 * 1000 + d2 * 1_000_000)


def t_scale(a: Time, k) -> Time:
    """``a * k`` exactly (``k`` int32 >= 0); saturates past the span."""
    k = jnp.asarray(k, jnp.int32)
    lo = t_mul(a.ps, k)
    big = k > MS_LIM // jnp.maximum(a.ms, 1)
    hi = Time(jnp.where(big, MS_LIM, a.ms * jnp.where(big, 0, k)), jnp.zeros_like(lo.ps))
    return t_add(hi, lo)


def t_sum(a: Time, axis=-1) -> Time:
    """Exact sum over ``axis`` (fewer than 2**21 terms): the picoseconds in three base-1000 digits.
    Saturates (conservatively) when a term reaches ``MS_LIM / terms`` ms."""
    n = max(a.ms.shape[axis], 1)
    p0, p1, p2 = _digits(a.ps)
    s0, s1, s2 = (jnp.sum(p, axis=axis) for p in (p0, p1, p2))
    s1 = s1 + s0 // 1000
    s2 = s2 + s1 // 1000
    ms = jnp.sum(jnp.minimum(a.ms, MS_LIM // n), axis=axis)
    ms = jnp.where(jnp.any(a.ms >= MS_LIM // n, axis=axis), MS_LIM, ms)
    return t_add(Time(ms, jnp.zeros_like(ms)), Time(s2 // 1000, (s0 % 1000) + (s1 % 1000) * 1000
                                                          + (s2 % 1000) * 1_000_000))


def t_fs_to_ps(a: Time) -> Time:
    """A value counted in femtoseconds (``ms`` = units of 10**9 fs) to picoseconds, rounded up."""
    ps = (a.ms % 1000) * 1_000_000 + (a.ps + 999) // 1000  # <= 10**9
    carry = (ps >= PS_PER_MS).astype(jnp.int32)
    return Time(jnp.where(a.ms >= MS_LIM, MS_LIM, a.ms // 1000 + carry), ps - carry * PS_PER_MS)


def t_ceil_ms(a: Time):
    """Whole milliseconds, rounded up (int32)."""
    return a.ms + (a.ps > 0).astype(jnp.int32)


def t_div(a: Time, k):
    """``floor(a / k)`` as (whole ms, remaining ns) for int32 ``k`` in ``[1, 2_000_000]``: long division,
    the picoseconds in three base-1000 digits; the result's sub-millisecond part is floored to ns."""
    k = jnp.asarray(k, jnp.int32)
    q_ms, r = a.ms // k, a.ms % k
    d0, d1, d2 = _digits(a.ps)
    out = []
    for d in (d2, d1, d0):  # r < k <= 2e6: r * 1000 + 999 < 2**31
        r = r * 1000 + d
        out.append(r // k)
        r = r % k
    return q_ms, out[0] * 1000 + out[1]  # ns below the ms (the last digit's ps are floored away)


def t_float_ms(a: Time):
    """Milliseconds as float32 (for the time-averaged gauges only)."""
    return a.ms.astype(jnp.float32) + a.ps.astype(jnp.float32) * 1e-9

"""libCacheSim's per-block policies in the JAX scan: ``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``.

The same rules as the numba kernels (:mod:`cacheresearch.cache.kernels`) and their plain-Python
oracles (``tests/reference_blocks.py``), as branch-free JAX on one state pytree per configuration, so
they run wherever the scan runs (CPU, GPU, TPU), vmapped over configurations, with every router and view.
A request looks its leading blocks up on its replica, then makes one libCacheSim ``get`` per block,
leaf-first (its last block first); a miss evicts until one more block fits, then inserts.

State (:class:`BlockState`), per replica row ``r`` and dense block id ``k`` (``core.stream.with_block_ids``):

* ``W[r, k]``: the list ``k`` is in (0 absent; ``fifo``/``sieve`` 1; ``s3fifo`` 1 small, 2 main, 3 ghost;
  ``arc`` 1 T1, 2 T2, 3 B1, 4 B2; ``lfu`` its frequency bucket);
* ``O`` / ``N``: older / newer links of a doubly linked list (``fifo``: ``O`` is its ring of size U,
  the oldest slot ``(pos - count) mod U``: the same order as libCacheSim's ring of ``min(C, U)``);
* ``A``: ``sieve``'s visited bit, ``s3fifo``'s frequency;
* ``LH`` / ``LT`` / ``LC`` [R, Q]: each list's head (newest), tail (oldest) and length (``lfu``: one list
  per frequency, Q = the most accesses of one block + 2 bounds any frequency);
* ``S`` [R, 4]: ``fifo`` (pos, count), ``sieve`` hand, ``s3fifo`` "evicted yet", ``lfu`` (stored,
  lowest frequency); ``P`` [R]: ``arc``'s target ``p`` (float32 here; libCacheSim's is a double:
  the comparisons ``|T1| > p`` agree except where ``p`` lies within float32 rounding of an integer,
  checked equal on the test streams, stated as an assumption);
* ``WS`` / ``WM`` (stale view only): the as-of-sync value of ``W`` and the request that last wrote it
  (a write after the sync saves the old value once: the stale view reads presence as of the sync).

Every write goes to index ``U`` (or ``Q``) when its guard is off, which ``mode="drop"`` discards, and every
loop's condition carries its guard, so a vmapped batch runs each loop as often as its busiest lane and no
lane changes state it should not.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "BlockState", "init_blocks", "block_request", "block_match", "block_occ", "n_lists", "TOP",
    "block_state_bytes", "JAX_RULES",
]

#: presence: 1 <= W <= TOP[policy] (lfu: any frequency)
TOP = {"fifo": 1, "sieve": 1, "s3fifo": 2, "lfu": 2**30, "arc": 2, "clock": 1}
_NQ = {"fifo": 2, "sieve": 2, "s3fifo": 4, "arc": 5, "clock": 2}


class BlockState(NamedTuple):
    W: jax.Array  # int32 [R, U]
    O: jax.Array  # int32 [R, U]  # noqa: E741
    N: jax.Array  # int32 [R, U]
    A: jax.Array  # int32 [R, U]
    LH: jax.Array  # int32 [R, Q]
    LT: jax.Array  # int32 [R, Q]
    LC: jax.Array  # int32 [R, Q]
    S: jax.Array  # int32 [R, 4]
    P: jax.Array  # float32 [R]
    WS: jax.Array  # int32 [R, U] or [1, 1]
    WM: jax.Array  # int32 [R, U] or [1, 1]
    ep: jax.Array  # int32: the request of the last stale sync


def n_lists(policies: tuple, max_freq: int) -> int:
    """Q: the lists a row keeps for the policies compiled into a program (``max_freq``: the most
    accesses of one block in the stream, which bounds an lfu frequency)."""
    # a policy with no JAX rule (numba kernel only): the numba engines read this bound as its frequency buckets
    return max([max_freq + 2 if p == "lfu" or p not in _NQ else _NQ[p] for p in policies] + [2])


def block_state_bytes(R: int, U: int, Q: int, stale: bool) -> int:
    return 4 * R * (U * (4 + (2 if stale else 0)) + 3 * Q + 5)


def init_blocks(policies: tuple, policy_id, R: int, U: int, Q: int, stale: bool) -> BlockState:
    """Empty rows; ``policy_id``: the configuration's policy (its scalars' initial values)."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    z = jnp.zeros((R, U), jnp.int32)
    neg = jnp.full((R, U), -1, jnp.int32)
    is_sieve = policy_id == POLICIES["sieve"].id
    is_lfu = policy_id == POLICIES["lfu"].id
    s0 = jnp.stack([jnp.where(is_sieve, -1, 0), jnp.where(is_lfu, 1, 0), jnp.int32(0), jnp.int32(0)]).astype(jnp.int32)
    sw = (R, U) if stale else (1, 1)
    return BlockState(z, neg, neg, z, jnp.full((R, Q), -1, jnp.int32), jnp.full((R, Q), -1, jnp.int32),
                      jnp.zeros((R, Q), jnp.int32), jnp.broadcast_to(s0, (R, 4)), jnp.zeros(R, jnp.float32),
                      jnp.zeros(sw, jnp.int32), jnp.full(sw, -1, jnp.int32), jnp.int32(0))


class _Ctx(NamedTuple):
    r: jax.Array  # the row
    stale: bool  # keep the as-of-sync copy
    cur: jax.Array  # the request writing


def _setw(a: dict, c: _Ctx, k, v, do):
    U = a["W"].shape[1]
    kk = jnp.where(do, k, U)
    if c.stale:
        kc = jnp.clip(k, 0, U - 1)
        save = do & (a["WM"][c.r, kc] < a["ep"])
        a["WS"] = a["WS"].at[c.r, jnp.where(save, k, U)].set(a["W"][c.r, kc], mode="drop")
        a["WM"] = a["WM"].at[c.r, kk].set(c.cur, mode="drop")
    a["W"] = a["W"].at[c.r, kk].set(v, mode="drop")


def _unlink(a: dict, c: _Ctx, k, do):
    """Take ``k`` out of its list (``W[r, k]`` names it) when ``do``."""
    U, Q = a["W"].shape[1], a["LH"].shape[1]
    r = c.r
    kc = jnp.clip(k, 0, U - 1)
    q, o, n = a["W"][r, kc], a["O"][r, kc], a["N"][r, kc]
    a["O"] = a["O"].at[r, jnp.where(do & (n >= 0), n, U)].set(o, mode="drop")
    a["LH"] = a["LH"].at[r, jnp.where(do & (n < 0), q, Q)].set(o, mode="drop")
    a["N"] = a["N"].at[r, jnp.where(do & (o >= 0), o, U)].set(n, mode="drop")
    a["LT"] = a["LT"].at[r, jnp.where(do & (o < 0), q, Q)].set(n, mode="drop")
    a["LC"] = a["LC"].at[r, jnp.where(do, q, Q)].add(-1, mode="drop")
    _setw(a, c, k, 0, do)


def _push(a: dict, c: _Ctx, k, q, do):
    """Put ``k`` at the head (newest end) of list ``q`` when ``do``."""
    U, Q = a["W"].shape[1], a["LH"].shape[1]
    r = c.r
    h = a["LH"][r, jnp.clip(q, 0, Q - 1)]
    kk = jnp.where(do, k, U)
    a["O"] = a["O"].at[r, kk].set(h, mode="drop")
    a["N"] = a["N"].at[r, kk].set(-1, mode="drop")
    a["N"] = a["N"].at[r, jnp.where(do & (h >= 0), h, U)].set(k, mode="drop")
    a["LT"] = a["LT"].at[r, jnp.where(do & (h < 0), q, Q)].set(k, mode="drop")
    a["LH"] = a["LH"].at[r, jnp.where(do, q, Q)].set(k, mode="drop")
    a["LC"] = a["LC"].at[r, jnp.where(do, q, Q)].add(1, mode="drop")
    _setw(a, c, k, q, do)


def _loop(cond, body, a: dict):
    """A while loop over the state dict (its keys fixed)."""
    keys = tuple(sorted(a))

    def pack(d):
        return tuple(d[k] for k in keys)

    def unpack(t):
        return dict(zip(keys, t))

    out = jax.lax.while_loop(lambda t: cond(unpack(t)), lambda t: pack(body(unpack(t))), pack(a))
    return unpack(out)


def _sc(a, r, i):
    return a["S"][r, i]


def _set_sc(a, r, i, v):
    a["S"] = a["S"].at[r, i].set(v)


# ---------------------------------------------------------------- fifo
def _get_fifo(a: dict, c: _Ctx, k, C, kn, do):
    U = a["W"].shape[1]
    r = c.r
    hit = do & (a["W"][r, k] == 1)
    miss = do & ~hit & (C >= 1)

    def cond(a):
        return miss & (_sc(a, r, 1) >= C)

    def body(a):
        pos, cnt = _sc(a, r, 0), _sc(a, r, 1)
        old = a["O"][r, jnp.mod(pos - cnt, U)]
        _setw(a, c, old, 0, jnp.bool_(True))
        _set_sc(a, r, 1, cnt - 1)
        return a

    a = _loop(cond, body, a)
    pos, cnt = _sc(a, r, 0), _sc(a, r, 1)
    a["O"] = a["O"].at[r, jnp.where(miss, pos, U)].set(k, mode="drop")
    _setw(a, c, k, 1, miss)
    _set_sc(a, r, 0, jnp.where(miss, jnp.mod(pos + 1, U), pos))
    _set_sc(a, r, 1, cnt + miss.astype(jnp.int32))
    return a, hit


# ---------------------------------------------------------------- sieve
def _one_list_get(a: dict, c: _Ctx, k, C, do):
    """A one-list policy with a bit per block (sieve, clock): a hit sets the bit; (hit, miss, the room
    loop's condition: a miss while the list is full)."""
    U, r = a["W"].shape[1], c.r
    hit = do & (a["W"][r, k] == 1)
    a["A"] = a["A"].at[r, jnp.where(hit, k, U)].set(1, mode="drop")
    miss = do & ~hit & (C >= 1)

    def cond(a):
        return miss & (a["LC"][r, 1] + 1 > C)

    return hit, miss, cond


def _get_sieve(a: dict, c: _Ctx, k, C, kn, do):
    U, r = a["W"].shape[1], c.r
    hit, miss, cond = _one_list_get(a, c, k, C, do)

    def body(a):
        act = cond(a)  # under vmap the body also runs for lanes whose loop ended: their walk must end too
        tail, hand = a["LT"][r, 1], _sc(a, r, 0)
        o0 = jnp.where(hand < 0, tail, hand)

        def c2(x):
            o, A = x
            return act & (o >= 0) & (A[r, jnp.clip(o, 0, U - 1)] > 0)

        def b2(x):
            o, A = x
            A = A.at[r, o].set(0)
            nx = a["N"][r, o]
            return jnp.where(nx < 0, tail, nx), A

        o, A = jax.lax.while_loop(c2, b2, (o0, a["A"]))
        a["A"] = A
        _set_sc(a, r, 0, a["N"][r, o])
        _unlink(a, c, o, jnp.bool_(True))
        return a

    a = _loop(cond, body, a)
    a["A"] = a["A"].at[r, jnp.where(miss, k, U)].set(0, mode="drop")
    _push(a, c, k, 1, miss)
    return a, hit


# ---------------------------------------------------------------- clock
def _get_clock(a: dict, c: _Ctx, k, C, kn, do):
    """libCacheSim Clock (cacheresearch/cache/kernels/clock.py): a hit sets the block's bit; to make room, an
    oldest block with its bit set moves to the head with it cleared, else it leaves."""
    U, r = a["W"].shape[1], c.r
    hit, miss, cond = _one_list_get(a, c, k, C, do)

    def body(a):
        act = cond(a)  # under vmap the body also runs for lanes whose loop ended: they must change nothing
        t = a["LT"][r, 1]
        again = act & (a["A"][r, jnp.clip(t, 0, U - 1)] > 0)
        _unlink(a, c, t, act)
        a["A"] = a["A"].at[r, jnp.where(again, t, U)].set(0, mode="drop")
        _push(a, c, t, 1, again)
        return a

    a = _loop(cond, body, a)
    a["A"] = a["A"].at[r, jnp.where(miss, k, U)].set(0, mode="drop")
    _push(a, c, k, 1, miss)
    return a, hit


# ---------------------------------------------------------------- s3fifo
def _get_s3fifo(a: dict, c: _Ctx, k, C, kn, do):
    """libCacheSim S3FIFO (cache/kernels/s3fifo.py) as a flat state machine: mode 0 choose,
    1 a small-queue pop, 2 a main-queue pop, 3 a ghost trim then the ghost push of ``t``."""
    U = a["W"].shape[1]
    r = c.r
    cs, cg, th = kn
    cm = C - cs
    w = a["W"][r, k]
    hit = do & ((w == 1) | (w == 2))
    a["A"] = a["A"].at[r, jnp.where(hit, k, U)].add(1, mode="drop")
    miss = do & ~hit
    ghost = miss & (w == 3)
    _unlink(a, c, k, ghost)
    ins = miss & (C >= 1)
    a["_m"] = jnp.int32(0)
    a["_t"] = jnp.int32(0)

    def cond(a):
        return ins & ((a["_m"] != 0) | (a["LC"][r, 1] + a["LC"][r, 2] + 1 > C))

    def body(a):
        m = a["_m"]
        c1, c2, c3 = a["LC"][r, 1], a["LC"][r, 2], a["LC"][r, 3]
        choose, small, main, trim = m == 0, m == 1, m == 2, m == 3
        _set_sc(a, r, 0, jnp.where(choose, 1, _sc(a, r, 0)))  # something is evicted
        # a main pop: the tail, reinserted with min(f, 3) - 1 when f >= 1, else evicted
        t2 = a["LT"][r, 2]
        f2 = a["A"][r, jnp.clip(t2, 0, U - 1)]
        mp = main & (c2 > 0)
        _unlink(a, c, t2, mp)
        back = mp & (f2 >= 1)
        _push(a, c, t2, 2, back)
        a["A"] = a["A"].at[r, jnp.where(back, t2, U)].set(jnp.minimum(f2, 3) - 1, mode="drop")
        # a small pop: the tail to main (frequency >= th) or out (to the ghost when it has a size)
        t1 = a["LT"][r, 1]
        f1 = a["A"][r, jnp.clip(t1, 0, U - 1)]
        sp = small & (c1 > 0)
        _unlink(a, c, t1, sp)
        promo = sp & (f1 >= th)
        _push(a, c, t1, 2, promo)
        a["A"] = a["A"].at[r, jnp.where(promo, t1, U)].set(0, mode="drop")
        out = sp & ~promo
        # the ghost: trim its oldest, then push t
        tr = trim & (c3 + 1 > cg)
        _unlink(a, c, a["LT"][r, 3], tr)
        gp = trim & ~tr
        _push(a, c, a["_t"], 3, gp)
        nxt = jnp.where(choose, jnp.where((c2 > cm) | (c1 == 0), 2, 1),
                        jnp.where(main, jnp.where(back, 2, 0),
                                  jnp.where(small, jnp.where(promo, 1, jnp.where(out & (cg > 0), 3, 0)),
                                            jnp.where(tr, 3, 0))))
        a["_t"] = jnp.where(out, t1, a["_t"])
        a["_m"] = nxt.astype(jnp.int32)
        return a

    a = _loop(cond, body, a)
    del a["_m"], a["_t"]
    ev = _sc(a, r, 0)
    to_main = ins & (ghost | ((cs > 1) & (ev == 0) & (a["LC"][r, 1] >= cs)))
    to_small = ins & ~ghost & (cs > 1) & ~to_main
    _push(a, c, k, 2, to_main)
    _push(a, c, k, 1, to_small)
    a["A"] = a["A"].at[r, jnp.where(to_main | to_small, k, U)].set(0, mode="drop")
    return a, hit


# ---------------------------------------------------------------- lfu
def _get_lfu(a: dict, c: _Ctx, k, C, kn, do):
    Q = a["LH"].shape[1]
    r = c.r
    f = a["W"][r, k]
    hit = do & (f > 0)
    _unlink(a, c, k, hit)
    _push(a, c, k, f + 1, hit)
    miss = do & ~hit & (C >= 1)

    def cond(a):
        return miss & (_sc(a, r, 0) + 1 > C)

    def body(a):
        m0 = _sc(a, r, 1)
        m = jax.lax.while_loop(lambda m: (a["LC"][r, jnp.minimum(m, Q - 1)] == 0) & (m < Q - 1), lambda m: m + 1, m0)
        _unlink(a, c, a["LT"][r, m], jnp.bool_(True))
        _set_sc(a, r, 0, _sc(a, r, 0) - 1)
        _set_sc(a, r, 1, m)
        return a

    a = _loop(cond, body, a)
    _push(a, c, k, 1, miss)
    _set_sc(a, r, 0, _sc(a, r, 0) + miss.astype(jnp.int32))
    _set_sc(a, r, 1, jnp.where(miss, 1, _sc(a, r, 1)))
    return a, hit


# ---------------------------------------------------------------- arc
def _get_arc(a: dict, c: _Ctx, k, C, kn, do):
    r = c.r
    w = a["W"][r, k]
    hit = do & ((w == 1) | (w == 2))
    _unlink(a, c, k, hit)
    _push(a, c, k, 2, hit)
    miss = do & ~hit
    in1, in2 = miss & (w == 3), miss & (w == 4)
    c3, c4 = a["LC"][r, 3].astype(jnp.float32), a["LC"][r, 4].astype(jnp.float32)
    p = a["P"][r]
    Cf = C.astype(jnp.float32)
    p = jnp.where(in1, jnp.minimum(p + jnp.maximum(c4 / jnp.maximum(c3, 1.0), 1.0), Cf), p)
    p = jnp.where(in2, jnp.maximum(p - jnp.maximum(c3 / jnp.maximum(c4, 1.0), 1.0), 0.0), p)
    a["P"] = a["P"].at[r].set(p)
    gh = in1 | in2
    _unlink(a, c, k, gh)
    ins = miss & (C >= 1)

    def cond(a):
        return ins & (a["LC"][r, 1] + a["LC"][r, 2] + 1 > C)

    def body(a):
        c1, c2, c3, c4 = (a["LC"][r, q] for q in (1, 2, 3, 4))
        plain = ~gh
        over1 = plain & (c1 + c3 + 1 > C)
        d3 = over1 & (c3 > 0)
        d1 = over1 & (c3 <= 0)
        d4 = plain & ~over1 & (c1 + c3 + c2 + c4 >= 2 * C) & (c4 > 0)
        _unlink(a, c, a["LT"][r, 3], d3)
        _unlink(a, c, a["LT"][r, 1], d1)
        _unlink(a, c, a["LT"][r, 4], d4)
        rep = ~d1
        b2 = in2
        c1, c2 = a["LC"][r, 1], a["LC"][r, 2]
        pf = a["P"][r]
        c1f = c1.astype(jnp.float32)
        from1 = rep & (((c1 > 0) & ((c1f > pf) | ((c1f == pf) & b2))) | (c2 == 0))
        from2 = rep & ~from1
        t1, t2 = a["LT"][r, 1], a["LT"][r, 2]
        _unlink(a, c, t1, from1)
        _push(a, c, t1, 3, from1)
        _unlink(a, c, t2, from2)
        _push(a, c, t2, 4, from2)
        return a

    a = _loop(cond, body, a)
    _push(a, c, k, jnp.where(gh, 2, 1), ins)
    return a, hit


#: The JAX rules, by policy name: a per-block policy without one runs on the numba engines only, and the JAX
#: engine refuses it in one line (core.simulate.check_bounds).
_GET = {"fifo": _get_fifo, "sieve": _get_sieve, "s3fifo": _get_s3fifo, "lfu": _get_lfu, "arc": _get_arc,
        "clock": _get_clock}
JAX_RULES = tuple(_GET)


def _occ(a: dict, name: str, r):
    if name == "fifo":
        return a["S"][r, 1]
    if name == "lfu":
        return a["S"][r, 0]
    if name in ("sieve", "clock"):
        return a["LC"][r, 1]
    return a["LC"][r, 1] + a["LC"][r, 2]


def block_occ(s: BlockState, policies: tuple, policy_id):
    """Every row's stored blocks [R]."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    a = s._asdict()
    rows = jnp.arange(s.W.shape[0], dtype=jnp.int32)
    occ = jnp.zeros(rows.shape, jnp.int32)
    for p in policies:
        occ = jnp.where(policy_id == POLICIES[p].id, _occ(a, p, rows), occ)
    return occ


def _lead(W, r, block_id, base, nn, top, window: int = 16):
    """Leading blocks of ``block_id[base : base + nn]`` present (``1 <= W <= top``) on rows ``r`` [R'] -> [R']."""
    U = W.shape[1]
    lane = jnp.arange(window, dtype=jnp.int32)

    def cond(x):
        j, _, alive = x
        return (j < nn) & jnp.any(alive)

    def body(x):
        j, hit, alive = x
        pos = j + lane
        ok = pos < nn
        ids = jnp.where(ok, block_id[jnp.minimum(base + pos, block_id.shape[0] - 1)], U)
        w = W.at[r[:, None], ids[None, :]].get(mode="fill", fill_value=0)
        f = ((w >= 1) & (w <= top)) | ~ok[None, :]
        run = jnp.cumprod(f.astype(jnp.int32), axis=1)
        inc = jnp.sum(run * ok[None, :].astype(jnp.int32), axis=1)
        return j + window, hit + jnp.where(alive, inc, 0), alive & jnp.all(f, axis=1)

    z = jnp.zeros(r.shape, jnp.int32)
    _, hit, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), z, jnp.ones(r.shape, bool)))
    return hit


def block_match(s: BlockState, policies: tuple, policy_id, block_id, base, n, R: int, stale: bool):
    """Every replica's leading match of a request (blocks ``block_id[base : base + n]``): (now [R], as of
    the last stale sync [R]; zeros without ``stale``)."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    top = jnp.int32(1)
    for p in policies:
        top = jnp.where(policy_id == POLICIES[p].id, TOP[p], top)
    rows = jnp.arange(R, dtype=jnp.int32)
    now = _lead(s.W, rows, block_id, base, n, top)
    if not stale:
        return now, jnp.zeros(R, jnp.int32)
    Wsync = jnp.where(s.WM >= s.ep, s.WS, s.W)  # [R, U]: only in programs with the stale view
    return now, _lead(Wsync, rows, block_id, base, n, top)


def block_request(s: BlockState, policies: tuple, policy_id, r, block_id, base, n, cap, knobs, do, cur,
                  stale: bool):
    """Lookup, then one ``get`` per block leaf-first, of a request on row ``r`` under capacity ``cap`` when
    ``do``; ``knobs``: (s3fifo small size, ghost size, promotion threshold). Returns (state, hit blocks,
    the ``get`` calls that hit, the row's stored blocks)."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    top = jnp.int32(1)
    for p in policies:
        top = jnp.where(policy_id == POLICIES[p].id, TOP[p], top)
    nn = jnp.where(do, n, 0)
    hit = _lead(s.W, r[None], block_id, base, nn, top)[0]
    a = s._asdict()
    c = _Ctx(r, stale, cur)
    cap = jnp.asarray(cap, jnp.int32)
    occ = jnp.int32(0)
    hits = jnp.int32(0)
    for p in policies:
        mine = do & (policy_id == POLICIES[p].id)
        get = _GET[p]

        def body(j, x, get=get, mine=mine):
            a, h = x
            k = block_id[jnp.clip(base + nn - 1 - j, 0, block_id.shape[0] - 1)]
            a, hh = get(a, c, k, cap, knobs, mine)
            return a, h + hh.astype(jnp.int32)

        a, hits = jax.lax.fori_loop(0, jnp.where(mine, nn, 0), body, (a, hits))
        occ = jnp.where(policy_id == POLICIES[p].id, _occ(a, p, r), occ)
    return BlockState(**a), hit, hits, occ

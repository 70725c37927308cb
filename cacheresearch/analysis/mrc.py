"""One-pass hit-rate curves: exact LRU hit rates at every capacity (Mattson et al. 1970).

Both LRU policies of the engine are stack algorithms: after every request a replica holds exactly
the ``C`` most recently stamped keys it has seen (stamps as in :mod:`cacheresearch.engine`: leaf-first
order for ``lru``, prompt order for ``lru_plain``). So block ``j`` of a request is present at capacity
``C`` iff its *stack distance* ``d_j`` (the number of distinct other keys stamped on that replica
since its own last stamp) is below ``C``, and the request's hit at capacity ``C`` is the number of
leading blocks with ``max(d_0..d_j) < C``. One pass that computes every ``d_j`` therefore gives the
exact hit tokens of every request at every capacity at once.

The pass is a ``lax.scan`` over chunks of requests. Per replica it keeps ``last[K]`` (each key's
latest stamp, -1 if never seen) and a Fenwick tree over stamps with a one at every key's latest
stamp; ``d = live - prefix(last)``. All lookups of a request happen before its updates (requests
longer than a chunk get query chunks, then update chunks), exactly as in the engine.

Routing must depend on neither cache state nor load (:data:`cacheresearch.routers.LOAD_FREE_ROUTERS`:
``random``, ``round_robin``, ``prefix_hash``): the routed request sequence of each replica is then
fixed, and replicas are vmapped. :func:`route_requests` evaluates the registered rules themselves.

:func:`hit_curve` returns token and request hit counts at capacities ``0..max_capacity`` and
per-request thresholds from which the per-request hit at any capacity follows.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.routers import LOAD_FREE_ROUTERS
from cacheresearch.routers.fixed import fixed_routes, prefix_keys
from cacheresearch.workload import Workload

__all__ = ["HitCurve", "hit_curve", "route_requests", "route_requests_many", "stack_distances", "shards_sample",
           "lru_replay"]

_BIG = np.int32(2**31 - 1)  # "never seen": a miss at every capacity


class HitCurve(NamedTuple):
    capacities: np.ndarray  # int64 [C+1]: 0..max_capacity
    hit_tokens: np.ndarray  # int64 [C+1]: total hit tokens at each capacity
    requests_hit: np.ndarray  # int64 [C+1]
    input_tokens: int
    n_requests: int
    # per request: prefix maxima of stack distances (block j is a hit at C iff thresholds[j] < C)
    thresholds: np.ndarray  # int32 [total blocks], CSR like the workload's keys
    offsets: np.ndarray  # int64 [N+1]

    @property
    def token_hit_rate(self) -> np.ndarray:
        return self.hit_tokens / max(self.input_tokens, 1)

    @property
    def request_hit_rate(self) -> np.ndarray:
        return self.requests_hit / max(self.n_requests, 1)

    def hit_blocks_at(self, capacity: int) -> np.ndarray:
        """Per-request hit blocks at one capacity."""
        hit = (self.thresholds < capacity).astype(np.int64)
        return np.add.reduceat(np.concatenate([hit, [0]]), self.offsets[:-1]) * (np.diff(self.offsets) > 0)


def route_requests(workload: Workload, router: str, replicas: int, *, prefix_blocks: int = 80, key=None) -> np.ndarray:
    """The replica of every request under a load-free router (one of
    :data:`cacheresearch.routers.LOAD_FREE_ROUTERS`: it reads neither load nor cache state, so the
    routed sequence is fixed before the run). The registered rule itself, vmapped over the requests:
    the same decisions as the engine's (``random``: the engine's first random word per request)."""
    if router == "random" and key is None:
        raise ValueError("random routing needs a PRNG key")
    return route_requests_many(workload, router, replicas, prefix_blocks=prefix_blocks,
                               keys=None if key is None else [key])[0]


def route_requests_many(workload: Workload, router: str, replicas: int, *, prefix_blocks: int = 80,
                        keys=None) -> np.ndarray:
    """:func:`route_requests` for several PRNG keys at once (int32 [len(keys), N]; one row when
    ``keys`` is None): one compiled call for all of them (:func:`cacheresearch.routers.fixed.fixed_routes`)."""
    if router not in LOAD_FREE_ROUTERS:
        raise ValueError(f"router {router!r} reads cache state or is unknown; hit curves need a router that reads "
                         f"neither load nor cache: {', '.join(LOAD_FREE_ROUTERS)}")
    # the routing key of each request (prefix_keys), read at its one position: O(requests), not O(blocks)
    nb = workload.n_blocks.astype(np.int64)
    S = int(workload.total_blocks)
    pos = np.minimum(workload.offsets[:-1] + np.clip(np.minimum(int(prefix_blocks), nb) - 1, 0, None), max(S - 1, 0))
    k = np.asarray(workload.keys, np.uint64)[pos] if S else np.zeros(nb.shape[0], np.uint64)
    hi, lo = prefix_keys(np.arange(nb.shape[0]), nb, (k >> np.uint64(32)).astype(np.uint32),
                         (k & np.uint64(0xFFFFFFFF)).astype(np.uint32), 1)
    return fixed_routes(router, int(replicas), workload.n_requests, prefix_hi=hi, prefix_lo=lo, keys=keys)


# ------------------------------------------------------------------------------------ host prep


class _Steps(NamedTuple):
    ids: np.ndarray  # int32 [T, W] dense key ids (K for padding)
    stamp: np.ndarray  # int32 [T, W] new stamp of each lane (0-based, consecutive per replica)
    query: np.ndarray  # bool [T]
    update: np.ndarray  # bool [T]
    out_pos: np.ndarray  # int64 [T, W] flat block position the lane's distance belongs to (-1 none)


def _replica_steps(ids, nb, offsets, reqs, leaf_first: bool, W: int) -> _Steps:
    """Query/update steps for the requests ``reqs`` (in order) routed to one replica."""
    nbr = nb[reqs]
    nch = -(-nbr // W)
    nch = np.maximum(nch, 0)
    # stamps: consecutive over this replica's blocks
    base = np.concatenate([[0], np.cumsum(nbr)[:-1]])
    single = nch == 1
    # steps per request: 1 (query+update) if single chunk, else 2 * nch, 0 if no blocks
    nsteps = np.where(single, 1, 2 * nch)
    T = int(nsteps.sum())
    step_req = np.repeat(np.arange(len(reqs)), nsteps)
    first_step = np.concatenate([[0], np.cumsum(nsteps)[:-1]]).astype(np.int64)
    k = np.arange(T) - first_step[step_req]
    multi = ~single[step_req]
    chunk = np.where(multi, k % np.maximum(nch[step_req], 1), 0)
    is_query = np.where(multi, k < nch[step_req], True)
    is_update = np.where(multi, k >= nch[step_req], True)
    lane = np.arange(W)
    j = chunk[:, None] * W + lane[None, :]
    n_r = nbr[step_req][:, None]
    valid = j < n_r
    r = reqs[step_req][:, None]
    flat = np.where(valid, offsets[:-1][r] + j, 0)
    sid = np.where(valid, ids[flat], -1)
    jj = np.where(leaf_first, n_r - 1 - j, j)
    stamp = np.where(valid, base[step_req][:, None] + jj, 0)
    out_pos = np.where(valid & is_query[:, None], flat, -1)
    return _Steps(sid.astype(np.int32), stamp.astype(np.int32), is_query, is_update, out_pos)


# ------------------------------------------------------------------------------------ the scan


def _levels(n: int) -> int:
    return max(1, int(n).bit_length())


@partial(jax.jit, static_argnames=("n_keys", "n_stamps"))
def _distances(ids, stamp, query, update, *, n_keys: int, n_stamps: int):
    """Stack distances of every query lane; vmappable over replicas (leading axis of the inputs)."""
    L = _levels(n_stamps + 1)
    size = n_stamps + 1  # Fenwick tree, 1-based

    def lowbit_chain_down(i):  # prefix-sum indices: i, i - lowbit(i), ... (0 = stop)
        out = []
        for _ in range(L):
            out.append(i)
            i = i - (i & -i)
        return jnp.stack(out, -1)

    def lowbit_chain_up(i):  # update indices: i, i + lowbit(i), ... (> size-1 = stop)
        out = []
        for _ in range(L):
            out.append(i)
            i = i + (i & -i)
        return jnp.stack(out, -1)

    # One array holds the Fenwick tree [0, size) and last stamp + 1 of every key [size, size + K)
    # (0 = never seen): one gather phase and one scatter-add per step, so XLA updates it in place.
    def step(c, x):
        arr, live = c
        sid, st, q, u = x
        valid = sid >= 0
        p = arr.at[jnp.where(valid, size + sid, size + n_keys)].get(mode="fill", fill_value=0) - 1
        seen = valid & (p >= 0)
        # query: live stamps strictly after p = live - prefix(p)
        idx = lowbit_chain_down(jnp.where(seen, p + 1, 0))
        idx = jnp.where(idx >= 1, idx, size + n_keys)  # 0 ends a chain (gathers fill 0)
        pref = jnp.sum(arr.at[idx].get(mode="fill", fill_value=0), -1)
        d = jnp.where(seen, live - pref, _BIG)
        # update: -1 at the old stamp, +1 at the new one, last[key] = new stamp
        do = u & valid
        old_idx = lowbit_chain_up(jnp.where(do & seen, p + 1, size + 1))
        new_idx = lowbit_chain_up(jnp.where(do, st + 1, size + 1))
        # chains run past the tree (and may wrap negative in int32): drop those entries
        drop = size + n_keys
        old_idx = jnp.where((old_idx >= 1) & (old_idx < size), old_idx, drop)
        new_idx = jnp.where((new_idx >= 1) & (new_idx < size), new_idx, drop)
        key_idx = jnp.where(do, size + sid, drop)
        upd_idx = jnp.concatenate([old_idx.reshape(-1), new_idx.reshape(-1), key_idx])
        upd_val = jnp.concatenate(
            [-jnp.ones(old_idx.size, jnp.int32), jnp.ones(new_idx.size, jnp.int32),
             # lanes without an update are dropped; routing d through them makes the scatter depend
             # on every gather, so XLA reads before it writes and updates in place (no copy per step)
             jnp.where(do, st - p, d)]
        )
        arr = arr.at[upd_idx].add(upd_val, mode="drop")
        live = live + jnp.sum((do & ~seen).astype(jnp.int32))
        return (arr, live), jnp.where(q & valid, d, _BIG)

    init = (jnp.zeros(size + n_keys, jnp.int32), jnp.int32(0))
    _, d = jax.lax.scan(step, init, (ids, stamp, query, update))
    return d


def _distances_kernel(ids, offsets, replica, n_replicas, n_keys, leaf_first, out):  # pragma: no cover - compiled
    """Sequential Fenwick-tree pass (compiled by numba): same arithmetic as the JAX scan."""
    n = offsets.shape[0] - 1
    # per replica: stamps are consecutive within the replica; the tree spans the busiest replica
    per = np.zeros(n_replicas, np.int64)
    for i in range(n):
        per[replica[i]] += offsets[i + 1] - offsets[i]
    size = per.max() + 1
    tree = np.zeros((n_replicas, size), np.int32)
    last = np.full((n_replicas, n_keys), -1, np.int64)
    live = np.zeros(n_replicas, np.int64)
    nxt = np.zeros(n_replicas, np.int64)
    for i in range(n):
        r = replica[i]
        a, b = offsets[i], offsets[i + 1]
        m = b - a
        # lookups first
        for f in range(a, b):
            p = last[r, ids[f]]
            if p < 0:
                out[f] = 2147483647
            else:
                s = 0
                k = p + 1
                while k > 0:
                    s += tree[r, k]
                    k -= k & -k
                out[f] = live[r] - s
        # then restamp
        base = nxt[r]
        for f in range(a, b):
            j = f - a
            st = base + (m - 1 - j if leaf_first else j)
            key = ids[f]
            p = last[r, key]
            if p >= 0:
                k = p + 1
                while k < size:
                    tree[r, k] -= 1
                    k += k & -k
            else:
                live[r] += 1
            k = st + 1
            while k < size:
                tree[r, k] += 1
                k += k & -k
            last[r, key] = st
        nxt[r] = base + m


def _lru_kernel(ids, offsets, replica, n_replicas, n_keys, capacity, leaf_first, hits):  # pragma: no cover
    """One capacity, sequentially (compiled by numba): a doubly linked recency list per replica.

    Same semantics as the engine: lookup of the whole request first (leading run of present blocks),
    then every block is touched (leaf-first: last block first, so the first ends most recent), then
    least recent blocks are evicted down to the capacity.
    """
    n = offsets.shape[0] - 1
    size = n_replicas * n_keys
    prv = np.full(size, -1, np.int64)
    nxt = np.full(size, -1, np.int64)
    inl = np.zeros(size, np.bool_)
    head = np.full(n_replicas, -1, np.int64)  # most recent
    tail = np.full(n_replicas, -1, np.int64)  # least recent
    occ = np.zeros(n_replicas, np.int64)
    for i in range(n):
        r = replica[i]
        a, b = offsets[i], offsets[i + 1]
        base = r * n_keys
        h = 0
        while a + h < b and inl[base + ids[a + h]]:
            h += 1
        hits[i] = h
        m = b - a
        for t in range(m):
            f = b - 1 - t if leaf_first else a + t
            node = base + ids[f]
            if inl[node]:  # unlink
                p, q = prv[node], nxt[node]
                if p >= 0:
                    nxt[p] = q
                else:
                    head[r] = q
                if q >= 0:
                    prv[q] = p
                else:
                    tail[r] = p
            else:
                inl[node] = True
                occ[r] += 1
            prv[node] = -1  # push front
            nxt[node] = head[r]
            if head[r] >= 0:
                prv[head[r]] = node
            head[r] = node
            if tail[r] < 0:
                tail[r] = node
        while occ[r] > capacity:
            node = tail[r]
            p = prv[node]
            inl[node] = False
            tail[r] = p
            if p >= 0:
                nxt[p] = -1
            else:
                head[r] = -1
            occ[r] -= 1


_KERNEL = None
_LRU_KERNEL = None


def lru_replay(workload: Workload, replica: np.ndarray, capacity: int, *, policy: str = "lru") -> np.ndarray:
    """Per-request hit blocks at one capacity per replica, by a compiled sequential replay (numba).

    The fastest exact path for a single LRU configuration on a CPU; identical to the engine (tested).
    """
    global _LRU_KERNEL
    if policy not in ("lru", "lru_plain"):
        raise ValueError("lru_replay handles lru and lru_plain")
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    replica = np.asarray(replica)
    if replica.shape != (workload.n_requests,):
        raise ValueError("replica must give one replica per request")
    workload.check_distinct_keys()
    if _LRU_KERNEL is None:
        import numba  # noqa: PLC0415

        _LRU_KERNEL = numba.njit(cache=True, nogil=True)(_lru_kernel)
    ids = workload.dense_ids()
    hits = np.zeros(workload.n_requests, np.int64)
    _LRU_KERNEL(ids, workload.offsets, replica.astype(np.int64), int(replica.max(initial=0)) + 1,
                max(int(ids.max(initial=-1)) + 1, 1), int(capacity), policy == "lru", hits)
    return hits


def _numba_kernel():
    global _KERNEL
    if _KERNEL is None:
        try:
            import numba  # noqa: PLC0415
        except ImportError:  # pragma: no cover - numba is a declared dependency
            return None
        _KERNEL = numba.njit(cache=True, nogil=True)(_distances_kernel)
    return _KERNEL


def stack_distances(
    workload: Workload,
    replica: np.ndarray,
    *,
    policy: str = "lru",
    chunk_blocks: int = 64,
    backend: str = "auto",
) -> np.ndarray:
    """Stack distance of every block (flat, CSR like ``workload.keys``) on its request's replica.

    ``replica`` gives each request's replica. ``policy`` is ``lru`` (leaf-first stamps) or
    ``lru_plain`` (prompt order). ``backend``: ``jax`` (the vmapped scan, runs on any JAX device),
    ``numba`` (a compiled sequential pass on the host CPU, the fastest on CPU), or ``auto``
    (numba when JAX's default device is a CPU, else jax). Both compute identical integers.
    """
    if policy not in ("lru", "lru_plain"):
        raise ValueError("hit curves exist for the stack policies lru and lru_plain")
    if backend not in ("auto", "jax", "numba"):
        raise ValueError("backend must be auto, jax or numba")
    workload.check_distinct_keys()
    replica = np.asarray(replica)
    if replica.shape != (workload.n_requests,):
        raise ValueError("replica must give one replica per request")
    if replica.size and replica.min() < 0:
        raise ValueError("replica indices must be >= 0")
    ids = workload.dense_ids()
    K = int(ids.max(initial=-1)) + 1
    nb = workload.n_blocks
    if backend == "auto":
        backend = "numba" if jax.default_backend() == "cpu" and _numba_kernel() is not None else "jax"
    if backend == "numba":
        kern = _numba_kernel()
        if kern is None:
            raise RuntimeError("numba is not installed")
        out = np.empty(workload.total_blocks, np.int32)
        rep = replica.astype(np.int64)
        kern(ids.astype(np.int64), workload.offsets, rep, int(rep.max(initial=0)) + 1, max(K, 1), policy == "lru", out)
        return out
    steps = []
    reps = np.unique(replica)
    for r in reps:
        steps.append(_replica_steps(ids.astype(np.int64), nb, workload.offsets, np.nonzero(replica == r)[0],
                                    policy == "lru", chunk_blocks))
    T = max(s.ids.shape[0] for s in steps)
    S = max(int(nb[replica == r].sum()) for r in reps) if len(reps) else 0

    def pad(a, v):
        return np.concatenate([a, np.full((T - a.shape[0],) + a.shape[1:], v, a.dtype)])

    ids_b = np.stack([pad(s.ids, -1) for s in steps])
    st_b = np.stack([pad(s.stamp, 0) for s in steps])
    q_b = np.stack([pad(s.query, False) for s in steps])
    u_b = np.stack([pad(s.update, False) for s in steps])
    fn = jax.vmap(partial(_distances, n_keys=max(K, 1), n_stamps=max(S, 1)))
    d = np.asarray(fn(jnp.asarray(ids_b), jnp.asarray(st_b), jnp.asarray(q_b), jnp.asarray(u_b)))
    out = np.full(workload.total_blocks, _BIG, np.int32)
    for s, dr in zip(steps, d):
        m = s.out_pos >= 0
        out[s.out_pos[m]] = dr[: s.ids.shape[0]][m]
    return out


def hit_curve(
    workload: Workload,
    *,
    policy: str = "lru",
    replicas: int = 1,
    router: str = "round_robin",
    prefix_blocks: int = 80,
    key=None,
    max_capacity: int | None = None,
    chunk_blocks: int = 64,
    backend: str = "auto",
) -> HitCurve:
    """Exact hit tokens and hit requests at every per-replica capacity 0..max_capacity."""
    rep = route_requests(workload, router, replicas, prefix_blocks=prefix_blocks, key=key)
    d = stack_distances(workload, rep, policy=policy, chunk_blocks=chunk_blocks, backend=backend)
    return curve_from_distances(workload, d, max_capacity=max_capacity)


def curve_from_distances(workload: Workload, d: np.ndarray, *, max_capacity: int | None = None) -> HitCurve:
    nb = workload.n_blocks
    n = workload.n_requests
    off = workload.offsets
    req = np.repeat(np.arange(n, dtype=np.int64), nb)
    # prefix maximum within each request (segmented cummax via a monotone offset)
    v = req * (1 << 32) + d.astype(np.int64)
    thr = (np.maximum.accumulate(v) - req * (1 << 32)).astype(np.int64) if v.size else v
    if max_capacity is None:
        finite = thr[thr < _BIG]
        max_capacity = int(finite.max()) + 1 if finite.size else 1
    Cmax = int(max_capacity)
    j = np.arange(workload.total_blocks, dtype=np.int64) - off[:-1][req]
    inp = workload.input_tokens[req]
    bt = workload.block_tokens
    delta = np.minimum((j + 1) * bt, inp) - np.minimum(j * bt, inp)
    bins = np.where(thr < _BIG, thr + 1, Cmax + 1)  # hit for every C >= thr + 1
    bins = np.minimum(bins, Cmax + 1)
    tok = np.bincount(bins, weights=delta.astype(np.float64), minlength=Cmax + 2)[: Cmax + 1]
    first = off[:-1][nb > 0]
    rb = np.minimum(np.where(thr[first] < _BIG, thr[first] + 1, Cmax + 1), Cmax + 1)
    reqh = np.bincount(rb, minlength=Cmax + 2)[: Cmax + 1]
    return HitCurve(
        capacities=np.arange(Cmax + 1),
        hit_tokens=np.cumsum(tok).round().astype(np.int64),
        requests_hit=np.cumsum(reqh).astype(np.int64),
        input_tokens=int(workload.input_tokens.sum()),
        n_requests=n,
        thresholds=np.minimum(thr, _BIG).astype(np.int32),
        offsets=off,
    )


def _sample_hash(keys: np.ndarray, seed: int) -> np.ndarray:
    """Uniform [0, 1) value per key: murmur3's 64-bit finaliser of key + seed, top 24 bits."""
    with np.errstate(over="ignore"):
        x = keys.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return (x >> np.uint64(40)).astype(np.float64) / float(1 << 24)


def shards_sample(workload: Workload, rate: float, *, seed: int = 0, unit: str = "block") -> tuple[Workload, float]:
    """SHARDS spatial sampling (Waldspurger et al., FAST'15) for prefix caches.

    ``unit="block"`` (standard SHARDS): a block key is kept when its hash falls below ``rate``; each
    request keeps its sampled blocks, in order, as a shorter request (``input_tokens`` = sampled
    blocks x block size). Under leaf-first LRU with chained keys a block's stack distance grows along
    the prompt, so the hit of a request is the number of its blocks whose distance is below the
    capacity, and sampling blocks estimates the token hit rate. ``unit="root"``: whole requests are
    kept when the hash of their first block falls below ``rate`` (whole prefix trees together; high
    variance when there are few roots).

    Returns the sampled workload and the factor by which capacities scale: the sampled curve at
    capacity ``c`` estimates the full curve at ``c / rate``.
    """
    if not 0 < rate <= 1:
        raise ValueError("rate must be in (0, 1]")
    if unit not in ("block", "root"):
        raise ValueError("unit must be block or root")
    nb = workload.n_blocks
    if unit == "block":
        keep_block = _sample_hash(workload.keys, seed) < rate
        req = np.repeat(np.arange(workload.n_requests), nb)
        counts = np.bincount(req[keep_block], minlength=workload.n_requests).astype(np.int64)
        sub = Workload(
            arrival_ms=workload.arrival_ms,
            input_tokens=counts * workload.block_tokens,
            output_tokens=workload.output_tokens,
            tenant=workload.tenant,
            keys=workload.keys[keep_block],
            offsets=np.concatenate([[0], np.cumsum(counts)]),
            block_tokens=workload.block_tokens,
            name=f"{workload.name}|shards-block{rate}",
        )
        return sub, rate
    first = (np.where(nb > 0, workload.keys[np.minimum(workload.offsets[:-1], workload.total_blocks - 1)], 0)
             if workload.total_blocks else np.zeros(workload.n_requests, np.uint64))  # no keys: every input_length 0
    keep = _sample_hash(np.asarray(first, dtype=np.uint64), seed) < rate
    idx = np.nonzero(keep)[0]
    lens = nb[idx]
    offs = np.concatenate([[0], np.cumsum(lens)])
    keys = np.concatenate([workload.request_keys(i) for i in idx]) if idx.size else np.zeros(0, np.uint64)
    sub = Workload(
        arrival_ms=workload.arrival_ms[idx],
        input_tokens=workload.input_tokens[idx],
        output_tokens=workload.output_tokens[idx],
        tenant=workload.tenant[idx],
        keys=keys,
        offsets=offs,
        block_tokens=workload.block_tokens,
        name=f"{workload.name}|shards-root{rate}",
    )
    return sub, rate

"""Workload -> run-compressed device stream.

Traffic is made of *runs*: maximal chains of blocks that always travel together. Key ``b`` joins the
run of its predecessor ``a`` when, over the whole workload, ``a`` is always followed by ``b`` (never
last in a request, never followed by another key) and ``b`` is always preceded by ``a`` (never first,
never after another key). Then every occurrence of any block of a run comes with the whole run, in
the same order, in the same request, so the engine can look up, restamp and evict a run as one unit:
under every policy of the engine all blocks of a run share their recency and time, and eviction
removes a run's blocks in a fixed order (leaf-first: tail first; prompt order: head first), so a
run's stored part is always a head (leaf-first) or a tail (prompt order) of known length.

A shared system prompt of 625 blocks is one run, not 625 blocks; a request's unique tail is one run.
The decomposition needs no prefix-tree structure (any workload with distinct keys per request).

Stamps
------
Each request's runs are *entries* of a global log; request ``i`` owns entries
``E_i .. E_i + p_i - 1`` (``p_i`` runs). Blocks keep the block-level stamps of a leaf-first (or
prompt-order) touch: under leaf-first order block ``j`` of request ``i`` has stamp
``offset_i + n_i - 1 - j``, so a run starting at block ``j0`` with ``m`` blocks covers stamps
``[offset_i + n_i - j0 - m, offset_i + n_i - j0)``; its *base stamp* is the lowest. Under prompt order
the base is ``offset_i + j0``. Entry ``E_i + k`` is the request's run with the ``k``-th lowest base
(leaf-first: the last run first), so entries are sorted by base stamp in both orders and each
replica's list of entries is sorted too: LRU eviction is a pointer walking those lists.

Keys
----
Runs that occur in more than one request carry state (dense ids ``0 .. K-1``); ``K`` marks padding
and ``K + 1`` a *singleton* run (it occurs once and can never hit: no state, but it occupies capacity
until evicted).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.workload import MAX_ARRIVAL_MS, Workload, WorkloadError

__all__ = ["first_seen", "Stream", "StreamShape", "compile_stream", "pad_stream", "stack_streams", "run_structure",
           "stream_shape", "default_chunk_runs", "with_stateful_singletons", "with_block_ids"]


class Stream(NamedTuple):
    """Device arrays of one workload, ready for the scan (see :func:`compile_stream`)."""

    # per scan step [T, W] / [T]: up to W runs of one request
    step_run: jax.Array  # int32 [T, W] dense run id; K padding; K + 1 singleton
    step_len: jax.Array  # int32 [T, W] blocks in the run (0 for padding)
    step_j0: jax.Array  # int32 [T, W] first block of the run within its request
    step_q: jax.Array  # int32 [T, W] the run's index within its request (prompt order)
    step_req: jax.Array  # int32 [T] request index (N for padding steps)
    step_first: jax.Array  # bool [T]
    step_last: jax.Array  # bool [T]
    # per request [N + 1] (the last row is a dummy for padding)
    arrival_ms: jax.Array  # int32
    input_tokens: jax.Array  # int32
    output_tokens: jax.Array  # int32
    n_blocks: jax.Array  # int32
    offset: jax.Array  # int32: the request's first block stamp
    n_runs: jax.Array  # int32
    entry0: jax.Array  # int32: the request's first entry E_i
    # per recency order (0 prompt order, 1 leaf-first) and entry [2, E + 1, 3] (last entry: a
    # sentinel): the entry's (run, blocks, base stamp); one array, so one gather reads an entry
    log: jax.Array  # int32
    # per block position [S + 1] (flat, prompt order): the 64-bit keys (routing by prefix key)
    key_hi: jax.Array  # uint32
    key_lo: jax.Array  # uint32
    # scalars
    block_tokens: jax.Array  # int32
    input_total: jax.Array  # float32: total input tokens
    n_requests: jax.Array  # int32: real requests (excludes padding)
    # per stateful run [K]: its length (this array's size fixes the state's shape)
    run_len: jax.Array  # int32
    # block-level ids, only for policies with per-block state (s3fifo; compile_stream(block_ids=True)):
    # the dense id of every block [S + 1] (U at the end), and a [U] array whose size is the id space
    block_id: jax.Array  # int32 [S + 1] (or [1] when absent)
    block_space: jax.Array  # int8 [U] (or [0] when absent)
    # GIE's prompt-byte block hashes (view gie_estimate; compile_stream(gie_hashes=...)), None when absent:
    # per request [N + 1, H] their dense ids (G past the request's count), [N + 1] the count; [G] the id space
    gie_hash: jax.Array | None = None  # int32
    gie_n: jax.Array | None = None  # int32
    gie_space: jax.Array | None = None  # int8

    @property
    def n_keys(self) -> int:
        """Stateful runs (the state's second axis)."""
        return int(self.run_len.shape[-1])

    @property
    def n_entries(self) -> int:
        return int(self.log.shape[-2]) - 1

    @property
    def width(self) -> int:
        return int(self.step_run.shape[-1])

    @property
    def n_distinct(self) -> int:
        """Block ids (0 when the stream carries none)."""
        return int(self.block_space.shape[-1])

    @property
    def n_gie(self) -> int:
        """GIE hash ids (0 when the stream carries none)."""
        return 0 if self.gie_space is None else int(self.gie_space.shape[-1])

    @property
    def gie_width(self) -> int:
        return 0 if self.gie_hash is None else int(self.gie_hash.shape[-1])

    @property
    def has_singletons(self) -> bool:
        """Runs without state occur (id K + 1); the priority policies need every run stateful."""
        return bool(np.any(np.asarray(self.step_run) == self.n_keys + 1))


class StreamShape(NamedTuple):
    """The static shape of a stream: what one compiled program serves."""

    steps: int  # T
    width: int  # W
    requests: int  # N + 1
    entries: int  # E + 1
    positions: int  # S + 1
    keys: int  # K
    distinct: int = 0  # U: block ids (0 unless block_ids=True)
    gie_width: int = 0  # H: GIE hashes per request (0 without them)
    gie_ids: int = 0  # G: GIE hash ids

    def union(self, other: "StreamShape") -> "StreamShape":
        return StreamShape(*(max(a, b) for a, b in zip(self, other)))


def stream_shape(s: Stream) -> StreamShape:
    return StreamShape(int(s.step_run.shape[-2]), s.width, int(s.arrival_ms.shape[-1]), s.n_entries + 1,
                       int(s.key_hi.shape[-1]), s.n_keys, s.n_distinct, s.gie_width, s.n_gie)


class RunStructure(NamedTuple):
    """Host-side run decomposition of a workload (see :func:`run_structure`)."""

    start: np.ndarray  # int64 [E] flat position of each run occurrence's first block (prompt order)
    length: np.ndarray  # int64 [E]
    req: np.ndarray  # int64 [E] its request
    head: np.ndarray  # int64 [E] dense id (workload.dense_ids) of its first block's key
    n_runs: np.ndarray  # int64 [N]

    @property
    def mean_length(self) -> float:
        return float(self.length.mean()) if self.length.size else 0.0


def run_structure(w: Workload) -> RunStructure:
    """Split every request into runs of blocks that always travel together (module docstring)."""
    w.check_distinct_keys()
    cache = w.__dict__.get("_runs")
    if cache is not None:
        return cache
    n, S = w.n_requests, w.total_blocks
    nb = w.n_blocks.astype(np.int64)
    # int32 positions and ids (S < 2**31: compile_stream's bound) and O(runs) request indices: on a day of the
    # design scenario (32M blocks) the int64 arrays of every position were most of the peak memory
    raw = w.dense_ids().astype(np.int32) if S else np.zeros(0, np.int32)
    U = int(raw.max()) + 1 if S else 0
    first = np.zeros(S, bool)
    last = np.zeros(S, bool)
    has = nb > 0
    first[w.offsets[:-1][has]] = True
    last[w.offsets[1:][has] - 1] = True
    # successor / predecessor of every position (-1: end / start of the request)
    succ = np.full(S, -1, np.int32)
    pred = np.full(S, -1, np.int32)
    if S > 1:
        succ[:-1] = np.where(last[:-1], -1, raw[1:])
        pred[1:] = np.where(first[1:], -1, raw[:-1])
    # a key's successor (predecessor) is unique when its min equals its max and is a real key
    def unique_neighbour(v):
        lo = np.full(U, np.iinfo(np.int32).max, np.int32)
        hi = np.full(U, -2, np.int32)
        np.minimum.at(lo, raw, v)
        np.maximum.at(hi, raw, v)
        return np.where((lo == hi) & (lo >= 0), lo, -1)

    if S:
        nxt = unique_neighbour(succ)
        prv = unique_neighbour(pred)
        merged = np.zeros(S, bool)
        a, b = raw[:-1], raw[1:]
        merged[1:] = (~first[1:]) & (nxt[a] == b) & (prv[b] == a)
        start = np.nonzero(~merged)[0].astype(np.int64)
    else:
        start = np.zeros(0, np.int64)
    ends = np.append(start[1:], S)
    length = ends - start
    # the request of each run start: the last request whose offset is at or before it (empty requests skipped)
    req = (np.searchsorted(np.asarray(w.offsets[1:], np.int64), start, side="right").astype(np.int64) if S
           else np.zeros(0, np.int64))
    n_runs = np.bincount(req, minlength=n).astype(np.int64) if S else np.zeros(n, np.int64)
    rs = RunStructure(start, length, req, raw[start].astype(np.int64) if S else start, n_runs)
    object.__setattr__(w, "_runs", rs)
    return rs


def default_chunk_runs(n_runs: np.ndarray) -> int:
    """Runs per scan step: the width among 1, 2, 4 .. 64 minimising steps x (width + 8) (a step's
    fixed cost is worth about eight lanes). Never a result, only speed."""
    p = np.maximum(np.asarray(n_runs, np.int64), 1)
    best, cost = 1, None
    for w in (1, 2, 4, 8, 16, 32, 64):
        c = int(np.sum(-(-p // w))) * (w + 8)
        if cost is None or c < cost:
            best, cost = w, c
    return best


def compile_stream(workload: Workload, *, chunk_runs: int | None = None, stateful_singletons: bool = False,
                   block_ids: bool = False, gie_hashes=None) -> Stream:
    """Run-compressed, chunked device arrays for ``workload`` (host-side NumPy work, done once).

    The stream serves every policy as it is: what a policy needs beyond it is derived from the stream
    by the engine (:func:`cacheresearch.core.simulate.serve_stream`, once per program):
    :func:`with_stateful_singletons` for the priority policies (``lfu_perfect``, ``length_aware``) and
    the vllm replica, :func:`with_block_ids` for ``s3fifo_sosp``; the per-block policies
    (:mod:`cacheresearch.backends.numba_policies`) read the stream's block keys.

    ``chunk_runs``: runs per scan step (default :func:`default_chunk_runs`; a speed knob, never a
    result). A request with at most ``chunk_runs`` runs takes one scan step.
    ``stateful_singletons``, ``block_ids``: do those derivations here (the same arrays, up to the
    numbering of runs), e.g. to size a padded template.
    ``gie_hashes``: a :class:`~cacheresearch.workload.gie_hashes.GieHashes` of the workload's requests
    (the ``gie_estimate`` view reads them).
    """
    w = workload
    n = w.n_requests
    nb = w.n_blocks.astype(np.int64)
    S = w.total_blocks
    if S >= 2**31 - 2:
        raise ValueError(f"stream has {S} blocks; the int32 stamp bound is {2**31 - 3}")
    if n and int(w.arrival_ms[-1]) > MAX_ARRIVAL_MS:
        i = int(np.argmax(w.arrival_ms > MAX_ARRIVAL_MS))
        raise WorkloadError(
            f"request {i} arrives at {int(w.arrival_ms[i])} ms, beyond the engine's int32 millisecond clock "
            f"({MAX_ARRIVAL_MS} ms, {MAX_ARRIVAL_MS / 86_400_000:.1f} days): the engine takes the first {i} "
            f"requests (trace.max_requests={i}) or windows of the trace (experiment=fit and ttl_trace take any span)")
    if w.input_tokens.max(initial=0) >= 2**31 - 1:
        raise ValueError("an input length exceeds the int32 token bound")
    if w.output_tokens.max(initial=0) >= 2**31 - 1:
        raise ValueError("an output length exceeds the int32 token bound")
    rs = run_structure(w)
    E = int(rs.start.shape[0])
    W = default_chunk_runs(rs.n_runs) if chunk_runs is None else int(chunk_runs)
    if W < 1:
        raise ValueError("chunk_runs must be >= 1")

    # stateful runs: those whose head occurs in more than one request
    counts = np.bincount(rs.head, minlength=int(rs.head.max(initial=-1)) + 1)
    shared = (counts[rs.head] > 1) | bool(stateful_singletons)
    uh, inv = np.unique(rs.head[shared], return_inverse=True)
    K = max(int(uh.shape[0]), 1)
    run_id = np.full(E, K + 1, np.int64)
    run_id[shared] = inv
    run_len = np.ones(K, np.int64)
    run_len[inv] = rs.length[shared]

    # per occurrence: index within its request, first block within the request, base stamps
    entry0 = np.concatenate([[0], np.cumsum(rs.n_runs)[:-1]]).astype(np.int64)
    q = np.arange(E, dtype=np.int64) - entry0[rs.req]
    off = w.offsets[:-1]
    j0 = rs.start - off[rs.req]
    base_plain = rs.start  # = offset_i + j0
    base_leaf = off[rs.req] + nb[rs.req] - j0 - rs.length
    # entries: prompt order e = E_i + q; leaf-first e = E_i + (p_i - 1 - q)
    e_leaf = entry0[rs.req] + (rs.n_runs[rs.req] - 1 - q)

    def order_log(entry, base):
        lg = np.zeros((E + 1, 3), np.int32)
        lg[:, 0], lg[:, 2] = K, S  # the sentinel: padding run, base past every stamp
        lg[entry, 0], lg[entry, 1], lg[entry, 2] = run_id, rs.length, base
        return lg

    log = np.stack([order_log(np.arange(E), base_plain), order_log(e_leaf, base_leaf)])

    # steps: every request gets at least one (block-less requests are still counted)
    nst = np.maximum(1, -(-rs.n_runs // W))
    T = int(nst.sum())
    step_req = np.repeat(np.arange(n, dtype=np.int64), nst)
    first_step = np.concatenate([[0], np.cumsum(nst)[:-1]]).astype(np.int64)
    k = np.arange(T, dtype=np.int64) - first_step[step_req]
    lane = np.arange(W, dtype=np.int64)
    qq = k[:, None] * W + lane[None, :]
    valid = qq < rs.n_runs[step_req][:, None]
    occ = np.where(valid, entry0[step_req][:, None] + qq, 0)
    pick = lambda a, pad: np.where(valid, a[occ] if E else pad, pad).astype(np.int32)  # noqa: E731

    keys = w.keys
    pad1 = lambda a, v=0: np.concatenate([np.asarray(a), [v]])  # noqa: E731
    return Stream(
        step_run=jnp.asarray(pick(run_id, K)),
        step_len=jnp.asarray(pick(rs.length, 0)),
        step_j0=jnp.asarray(pick(j0, 0)),
        step_q=jnp.asarray(np.where(valid, qq, 0).astype(np.int32)),
        step_req=jnp.asarray(step_req.astype(np.int32)),
        step_first=jnp.asarray(k == 0),
        step_last=jnp.asarray(k == nst[step_req] - 1),
        arrival_ms=jnp.asarray(pad1(w.arrival_ms).astype(np.int32)),
        input_tokens=jnp.asarray(pad1(w.input_tokens).astype(np.int32)),
        output_tokens=jnp.asarray(pad1(w.output_tokens).astype(np.int32)),
        n_blocks=jnp.asarray(pad1(nb).astype(np.int32)),
        offset=jnp.asarray(pad1(off, S).astype(np.int32)),
        n_runs=jnp.asarray(pad1(rs.n_runs).astype(np.int32)),
        entry0=jnp.asarray(pad1(entry0, E).astype(np.int32)),
        log=jnp.asarray(log),
        key_hi=jnp.asarray(pad1((keys >> np.uint64(32)).astype(np.uint32))),
        key_lo=jnp.asarray(pad1((keys & np.uint64(0xFFFFFFFF)).astype(np.uint32))),
        block_tokens=jnp.asarray(np.int32(w.block_tokens)),
        input_total=jnp.asarray(np.float32(w.input_tokens.sum())),
        n_requests=jnp.asarray(np.int32(n)),
        run_len=jnp.asarray(run_len.astype(np.int32)),
        **_block_fields(w, block_ids),
        **_gie_fields(gie_hashes, n),
    )


def _gie_fields(g, n: int) -> dict:
    if g is None:
        return {}
    ids, cnt = np.asarray(g.ids), np.asarray(g.n)
    if ids.shape[0] != n or cnt.shape[0] != n:
        raise ValueError(f"gie_hashes cover {ids.shape[0]} requests, the workload has {n}")
    G = int(g.space)
    return dict(gie_hash=jnp.asarray(np.concatenate([ids, np.full((1, ids.shape[1]), G, ids.dtype)]).astype(np.int32)),
                gie_n=jnp.asarray(np.concatenate([cnt, [0]]).astype(np.int32)), gie_space=jnp.zeros(G, jnp.int8))


def first_seen(ids: np.ndarray) -> np.ndarray:
    """Dense ids renumbered in order of first appearance in the stream: a block's id then lies near the ids
    of the blocks that arrived with it, so the per-block state the policies walk (lists, bits, counters
    indexed by id) is touched in nearly sequential memory instead of at random (a ranking by key value
    scatters it). No result depends on the numbering (no policy breaks ties by id)."""
    if ids.size == 0:
        return ids
    _, first = np.unique(ids, return_index=True)  # first position of each id, in id order
    new = np.empty(first.size, np.int64)
    new[np.argsort(first, kind="stable")] = np.arange(first.size)
    return new[ids]


def _block_fields(w: Workload, on: bool) -> dict:
    if not on:
        return dict(block_id=jnp.zeros(1, jnp.int32), block_space=jnp.zeros(0, jnp.int8))
    ids = first_seen(w.dense_ids()) if w.total_blocks else np.zeros(0, np.int64)
    U = int(ids.max()) + 1 if ids.size else 1
    return dict(block_id=jnp.asarray(np.concatenate([ids, [U]]).astype(np.int32)),
                block_space=jnp.zeros(U, jnp.int8))


def with_stateful_singletons(s: Stream) -> Stream:
    """``s`` with every run stateful: each singleton occurrence (id ``K + 1``) gets an id of its own
    after the stateful runs (``K ..``), padding moves to the new ``K``. Results do not depend on how
    runs are numbered (no policy breaks ties by run id), so this serves what
    ``compile_stream(w, stateful_singletons=True)`` serves; ``s`` itself when it has no singletons."""
    K = s.n_keys
    step_run = np.asarray(s.step_run)
    log = np.asarray(s.log)
    n = int(np.asarray(s.n_requests))
    n_runs = np.asarray(s.n_runs)[:n].astype(np.int64)
    E = int(n_runs.sum())
    plain = log[0, :E]
    single = plain[:, 0] == K + 1
    n1 = int(single.sum())
    if n1 == 0:
        return s
    K2 = K + n1
    new = np.full(E + 1, K2, np.int64)  # per prompt-order entry: its id (the last: padding)
    new[:E] = plain[:, 0]
    new[:E][single] = K + np.arange(n1)
    entry0 = np.asarray(s.entry0)[:n].astype(np.int64)
    req = np.repeat(np.arange(n, dtype=np.int64), n_runs)
    e = np.arange(E, dtype=np.int64)
    mirror = 2 * entry0[req] + n_runs[req] - 1 - e  # leaf-first entry e <-> prompt-order entry mirror[e]
    out = log.copy()
    out[:, :, 0] = np.where(log[:, :, 0] == K, K2, log[:, :, 0])
    out[0, :E, 0] = new[:E]
    out[1, :E, 0] = new[mirror]
    sreq = np.asarray(s.step_req).astype(np.int64)
    sq = np.asarray(s.step_q).astype(np.int64)
    lane = step_run == K + 1
    ent = np.where(lane, np.concatenate([entry0, [0]])[np.minimum(sreq, n)][:, None] + sq, E)
    run = np.where(step_run == K, K2, np.where(lane, new[ent], step_run))
    run_len = np.concatenate([np.asarray(s.run_len), plain[single, 1]])
    return s._replace(step_run=jnp.asarray(run.astype(np.int32)), log=jnp.asarray(out),
                      run_len=jnp.asarray(run_len.astype(np.int32)))


def with_block_ids(s: Stream) -> Stream:
    """``s`` carrying every block's dense id (``compile_stream(w, block_ids=True)``'s fields), ranked from
    the stream's own block keys; ``s`` itself when it carries them already."""
    if s.n_distinct:
        return s
    n = int(np.asarray(s.n_requests))
    S = int(np.asarray(s.n_blocks)[:n].astype(np.int64).sum())
    keys = (np.asarray(s.key_hi)[:S].astype(np.uint64) << np.uint64(32)) | np.asarray(s.key_lo)[:S].astype(np.uint64)
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)  # one sort: ranks and first positions
    new = np.empty(first.size, np.int64)
    new[np.argsort(first, kind="stable")] = np.arange(first.size)  # first_seen's numbering
    ids = new[inv.reshape(-1)]
    U = int(ids.max()) + 1 if S else 1
    bid = np.full(int(np.asarray(s.key_hi).shape[-1]), U, np.int32)
    bid[:S] = ids
    return s._replace(block_id=jnp.asarray(bid), block_space=jnp.zeros(U, jnp.int8))


def pad_stream(s: Stream, shape: StreamShape) -> Stream:
    """``s`` padded to ``shape`` (at least as large in every dimension): same results, one program
    for every stream of that shape. Padding steps point at a dummy request with no runs; extra lanes
    of a wider step are padding runs."""
    own = stream_shape(s)
    if any(b < a for a, b in zip(own, shape)):
        raise ValueError(f"cannot pad a stream of shape {own} to {shape}")
    Wd = shape.width
    K, k = shape.keys, own.keys
    N1, n1 = shape.requests, own.requests

    def padv(a, size, v):
        a = np.asarray(a)
        if a.ndim == 2 and a.shape[1] < Wd:  # wider steps: extra lanes are padding
            a = np.concatenate([a, np.full((a.shape[0], Wd - a.shape[1]), v, a.dtype)], axis=1)
        return np.concatenate([a, np.full((size - a.shape[0],) + a.shape[1:], v, a.dtype)])

    def reid(a):  # padding k -> K, singleton k + 1 -> K + 1
        a = np.asarray(a)
        return np.where(a == k, K, np.where(a == k + 1, K + 1, a))

    req = np.asarray(s.step_req)
    req = np.where(req == n1 - 1, N1 - 1, req)
    E1 = shape.entries
    S1 = shape.positions
    n_blocks_total = own.positions - 1

    def rebase(a):  # sentinel base stamps (= S) move to the new S
        a = np.asarray(a)
        return np.where(a == n_blocks_total, S1 - 1, a)

    def pad_log(lg):  # [2, e1, 3] -> [2, E1, 3]: run ids re-numbered, sentinel bases moved
        out = np.zeros((2, E1, 3), np.int32)
        out[:, :, 0], out[:, :, 2] = K, S1 - 1
        out[:, : lg.shape[1], 0] = reid(lg[:, :, 0])
        out[:, : lg.shape[1], 1] = lg[:, :, 1]
        out[:, : lg.shape[1], 2] = rebase(lg[:, :, 2])
        return out

    def pad_blocks():
        U, u = shape.distinct, own.distinct
        if U == 0:
            return dict(block_id=np.asarray(s.block_id), block_space=np.asarray(s.block_space))
        bid = np.asarray(s.block_id)
        bid = np.where(bid >= u, U, bid) if u else np.full(1, U, np.int32)
        return dict(block_id=padv(bid, S1, U).astype(np.int32), block_space=np.zeros(U, np.int8))

    def pad_gie():
        G, H = shape.gie_ids, shape.gie_width
        if G == 0 and H == 0:
            return {}
        if s.gie_hash is None:
            return dict(gie_hash=np.full((N1, H), G, np.int32), gie_n=np.zeros(N1, np.int32),
                        gie_space=np.zeros(G, np.int8))
        g, h = own.gie_ids, np.asarray(s.gie_hash)
        h = np.where(h >= g, G, h)
        h = np.concatenate([h, np.full((h.shape[0], H - h.shape[1]), G, np.int32)], axis=1)
        h = np.concatenate([h[:-1], np.full((N1 - h.shape[0] + 1, H), G, np.int32)])
        cnt = np.asarray(s.gie_n)
        cnt = np.concatenate([cnt[:-1], np.zeros(N1 - cnt.shape[0] + 1, np.int32)])
        return dict(gie_hash=h.astype(np.int32), gie_n=cnt, gie_space=np.zeros(G, np.int8))

    return Stream(
        step_run=padv(reid(s.step_run), shape.steps, K),
        step_len=padv(s.step_len, shape.steps, 0),
        step_j0=padv(s.step_j0, shape.steps, 0),
        step_q=padv(s.step_q, shape.steps, 0),
        step_req=padv(req, shape.steps, N1 - 1),
        step_first=padv(s.step_first, shape.steps, False),
        step_last=padv(s.step_last, shape.steps, False),
        arrival_ms=padv(s.arrival_ms, N1, np.asarray(s.arrival_ms)[-1]),
        input_tokens=padv(s.input_tokens, N1, 0),
        output_tokens=padv(s.output_tokens, N1, 0),
        n_blocks=padv(s.n_blocks, N1, 0),
        offset=padv(rebase(s.offset), N1, S1 - 1),
        n_runs=padv(s.n_runs, N1, 0),
        entry0=padv(np.where(np.asarray(s.entry0) == own.entries - 1, E1 - 1, np.asarray(s.entry0)), N1, E1 - 1),
        log=pad_log(np.asarray(s.log)),
        key_hi=padv(s.key_hi, S1, 0),
        key_lo=padv(s.key_lo, S1, 0),
        block_tokens=np.asarray(s.block_tokens),
        input_total=np.asarray(s.input_total),
        n_requests=np.asarray(s.n_requests),
        run_len=padv(s.run_len, K, 1),
        **pad_blocks(),
        **pad_gie(),
    )


def stack_streams(streams: list[Stream]) -> Stream:
    """Pad streams to one shape and stack them on a leading axis (for vmapping over workloads)."""
    shape = stream_shape(streams[0])
    for s in streams[1:]:
        shape = shape.union(stream_shape(s))
    out = [pad_stream(s, shape) for s in streams]
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack([np.asarray(x) for x in xs])), *out)

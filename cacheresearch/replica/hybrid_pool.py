"""vLLM's hybrid prefix-hit and free rules per KV group, and an LRU pool of one GPU that applies them.

The rules (vllm-project/vllm ``vllm/v1/core/single_type_kv_cache_manager.py`` and
``kv_cache_coordinator.py``, ``HybridKVCacheCoordinator``; no EAGLE, no context parallelism, block hashes at
the groups' block size, which is one block size for every group of a unified layout,
:mod:`cacheresearch.replica.kv_layout`). A hit of ``L`` blocks needs, per group:

* full attention / MLA: blocks ``0 .. L-1`` (the longest cached prefix, left to right);
* a sliding window ``W``: only the ``n = ceil((W - 1) / block)`` blocks before the hit's end, ``L-n .. L-1``
  (the rightmost run of ``n`` cached blocks, right to left; with no such run, the run cached from block 0);
* linear attention / Mamba: the state at the hit's end, block ``L-1`` (the rightmost cached block).

Groups of one spec answer together (a block counts when every group of the spec caches it). The
coordinator puts full attention first and shrinks the candidate length until every spec agrees (one
pass when the model is full attention plus one other type). The request's hit is at most ``prompt - 1``
tokens. Here the three finders are written as closed forms over a boolean "cached" vector (the rightmost
window ending at or before the bound), not as vLLM's scans; ``tests/reference_hybrid.py`` transcribes the
scans and the two agree request by request.

Freeing (``remove_skipped_blocks`` with ``get_num_skipped_tokens``): a window group frees, after each step,
the blocks wholly before ``computed - W + 1``; they enter the one LRU free queue still cached (a later hit
may use them until they are evicted). A full-attention group frees nothing before the request ends.

The pool (:func:`simulate_hybrid`): ``num_blocks`` block ids (id 0 is vLLM's null block), one free queue
(freed blocks to its tail, allocation from its head, evicting the block's hash), a map per group from a
block's key to the blocks caching it (duplicates allowed, the first answers). Requests are served FCFS up
to ``max_num_seqs`` at once; a request is admitted when the free queue holds the blocks it allocates plus
the evictable cached blocks its hit takes; its prompt and output are allocated in one step (slots for
``prompt + output - 1`` tokens, the prefill's peak plus the decode's growth), the prompt's full blocks are
cached, and the window rule frees what has left the window by its last step; it holds the rest for
``prefill_us_per_token x (prompt - hit) + decode_us_per_token x output`` microseconds, then frees every
block (each group's blocks tail first, groups in order). A linear-attention group (vLLM's
``mamba_cache_mode="align"``, the prefix-caching mode of these models) allocates a running-state block held
to the end and, when the prompt has a full block past the hit, a checkpoint block for the state at the
prompt's last block boundary, which is cached; the checkpoint and the hit's state block are released
right after the step (vLLM releases them within the next steps: an assumption of this model, as is the
single-step allocation, which overstates a window group's peak by the decode's out-of-window blocks).

Plain Python and NumPy. The vllm replica's numba backend applies the same rules (``kv_groups``, ``kv_window_groups``,
``kv_window``); its reference ``tests/reference_batch.py`` calls :func:`hit_blocks` at lookup and
:func:`window_free_upto` at each step (experiments/hybrid_kv.md, "The hybrid pool in the vllm replica").
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from cacheresearch.replica.kv_layout import Unified

__all__ = ["spec_groups", "find_full", "find_window", "find_state", "hit_blocks", "window_free_upto",
           "HybridRun", "simulate_hybrid", "group_keys"]


def spec_groups(u: Unified) -> list[tuple[str, int, tuple[int, ...]]]:
    """``(kind, window, group ids)`` per spec, full attention first (vLLM's ``attention_groups`` order)."""
    specs: dict[tuple[str, int], list[int]] = {}
    for i, g in enumerate(u.groups):
        specs.setdefault((g.kind, g.sliding_window), []).append(i)
    out = [(k, w, tuple(ids)) for (k, w), ids in specs.items()]
    return sorted(out, key=lambda s: s[0] not in ("full", "mla"))


def find_full(cached: np.ndarray, bound: int) -> int:
    """Leading cached blocks, at most ``bound``."""
    c = cached[:bound]
    miss = np.flatnonzero(~c)
    return int(miss[0]) if miss.size else int(c.size)


def find_window(cached: np.ndarray, bound: int, need: int) -> int:
    """The largest ``e <= bound`` with blocks ``e-need .. e-1`` cached, else the leading run (``need >= 1``)."""
    c = cached[:bound].astype(np.int64)
    if c.size == 0:
        return 0
    # run[i]: cached blocks ending at i (a cumulative sum reset at every miss)
    cs = np.cumsum(c)
    last_reset = np.maximum.accumulate(np.where(c == 0, cs, 0))
    run = cs - last_reset
    ends = np.flatnonzero(run >= need)
    if ends.size:
        return int(ends[-1]) + 1
    return find_full(cached, bound)


def find_state(cached: np.ndarray, bound: int) -> int:
    """One past the rightmost cached block below ``bound`` (0 when none)."""
    idx = np.flatnonzero(cached[:bound])
    return int(idx[-1]) + 1 if idx.size else 0


def hit_blocks(u: Unified, cached: list[np.ndarray], prompt_tokens: int) -> int:
    """The coordinator's hit in blocks: ``cached[g][j]`` says whether group ``g`` caches the request's block
    ``j``; the candidate length shrinks until every spec agrees (full attention first)."""
    B = u.block_tokens
    specs = spec_groups(u)
    both = [np.logical_and.reduce([cached[i] for i in ids]) if len(ids) > 1 else cached[ids[0]]
            for _, _, ids in specs]
    hit = max(prompt_tokens - 1, 0)  # tokens
    simple = len(specs) == 2 and specs[0][0] in ("full", "mla")
    full_len = None
    while True:
        curr = hit
        for (kind, w, _), c in zip(specs, both):
            if kind in ("full", "mla"):
                if full_len is None:
                    full_len = find_full(c, curr // B) * B
                curr = min(curr, full_len)
            elif kind == "sliding_window":
                curr = find_window(c, curr // B, -(-(w - 1) // B)) * B
            else:
                curr = find_state(c, curr // B) * B
        if curr >= hit:
            break
        hit = curr
        if simple:
            break
    return hit // B


def window_free_upto(window: int, computed_tokens: int, block_tokens: int) -> int:
    """Blocks ``0 .. k-1`` a window group no longer needs after ``computed_tokens`` are computed."""
    return max(0, computed_tokens - window + 1) // block_tokens


def group_keys(keys: np.ndarray, fine_tokens: int, block_tokens: int) -> np.ndarray:
    """A request's keys at the group block size: the chained key of each group block's last fine block."""
    if block_tokens % fine_tokens:
        raise ValueError(f"block_tokens {block_tokens} must be a multiple of the workload's {fine_tokens}")
    k = block_tokens // fine_tokens
    return keys[k - 1::k]


@dataclass(frozen=True)
class HybridRun:
    """Per request: admission and finish times (us; -1: the request never fits the pool), hit tokens."""

    admit_us: np.ndarray
    finish_us: np.ndarray
    hit_tokens: np.ndarray
    prompt_tokens: np.ndarray
    peak_running: int
    evictions: int

    @property
    def token_hit_rate(self) -> float:
        ok = self.admit_us >= 0
        return float(self.hit_tokens[ok].sum() / max(int(self.prompt_tokens[ok].sum()), 1))


class _Pool:
    """Block ids with reference counts, a doubly linked free queue and per-group key maps."""

    def __init__(self, n: int, groups: int):
        self.ref = np.zeros(n, np.int64)
        self.key = np.zeros(n, np.uint64)
        self.grp = np.full(n, -1, np.int64)
        self.prev = np.arange(-1, n - 1, dtype=np.int64)
        self.next = np.arange(1, n + 1, dtype=np.int64)
        self.head, self.tail = 1, n - 1  # block 0 is the null block, never free
        self.next[n - 1] = -1
        self.prev[1] = -1
        self.free = n - 1
        self.maps: list[dict] = [dict() for _ in range(groups)]
        self.evictions = 0

    def _unlink(self, b: int) -> None:
        p, q = self.prev[b], self.next[b]
        if p >= 0:
            self.next[p] = q
        else:
            self.head = q
        if q >= 0:
            self.prev[q] = p
        else:
            self.tail = p
        self.free -= 1

    def _append(self, b: int) -> None:
        self.prev[b], self.next[b] = self.tail, -1
        if self.tail >= 0:
            self.next[self.tail] = b
        else:
            self.head = b
        self.tail = b
        self.free += 1

    def touch(self, b: int) -> None:
        if self.ref[b] == 0:
            self._unlink(b)
        self.ref[b] += 1

    def release(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self._append(b)

    def take(self) -> int:
        b = self.head
        self._unlink(b)
        g = int(self.grp[b])
        if g >= 0:
            lst = self.maps[g][int(self.key[b])]
            lst.remove(b)
            if not lst:
                del self.maps[g][int(self.key[b])]
            self.grp[b] = -1
            self.evictions += 1
        self.ref[b] = 1
        return b

    def cache(self, b: int, g: int, key: int) -> None:
        self.grp[b], self.key[b] = g, key
        self.maps[g].setdefault(key, []).append(b)


def _plan(pool: _Pool, u: Unified, gk: np.ndarray, P: int, T: int):
    """The hit and the blocks an admission takes: (hit blocks, per-group hit block ids to touch, blocks to
    allocate, blocks the admission needs from the free queue)."""
    B, G = u.block_tokens, len(u.groups)
    bound = max(P - 1, 0) // B
    cached = [np.array([int(k) in pool.maps[g] for k in gk[:bound]], dtype=bool) for g in range(G)]
    L = hit_blocks(u, cached, P)
    nT, m = -(-T // B), P // B
    touch, new = [], []
    for g, grp in enumerate(u.groups):
        if grp.kind == "sliding_window":
            idx = range(window_free_upto(grp.sliding_window, L * B, B), L)
        elif grp.kind == "mamba":
            idx = range(L - 1, L) if L else range(0)
        else:
            idx = range(L)
        touch.append([pool.maps[g][int(gk[j])][0] for j in idx])
        new.append((1 + (m > L)) if grp.kind == "mamba" else nT - L)
    need = sum(new) + sum(int(pool.ref[b] == 0) for t in touch for b in t)
    return L, touch, new, need


def _admit(pool: _Pool, u: Unified, gk: np.ndarray, P: int, T: int, L: int, touch, new) -> list[list[int]]:
    """Allocate, cache and apply the window rule; returns each group's held block list (0 = null)."""
    B = u.block_tokens
    m = P // B
    for t in touch:
        for b in t:
            pool.touch(b)
    held = []
    for g, grp in enumerate(u.groups):
        fresh = [pool.take() for _ in range(new[g])]
        if grp.kind == "mamba":
            if m > L:
                pool.cache(fresh[0], g, int(gk[m - 1]))
            for b in touch[g] + fresh[:-1]:  # the hit's state, then the checkpoint
                pool.release(b)
            held.append(fresh[-1:])
            continue
        if grp.kind == "sliding_window":
            skip = window_free_upto(grp.sliding_window, L * B, B)
            blocks = [0] * skip + touch[g] + fresh
        else:
            blocks = touch[g] + fresh
        for j in range(L, m):
            pool.cache(blocks[j], g, int(gk[j]))
        if grp.kind == "sliding_window":
            upto = window_free_upto(grp.sliding_window, T - 1, B)
            for j in range(min(upto, len(blocks)) - 1, -1, -1):
                if blocks[j] == 0:
                    break
                pool.release(blocks[j])
                blocks[j] = 0
        held.append(blocks)
    return held


def _validate(w, u: Unified, num_blocks: int, max_num_seqs: int, pre: int, dec: int) -> None:
    if u.block_tokens % w.block_tokens:
        raise ValueError(f"block_tokens {u.block_tokens} must be a multiple of the workload's {w.block_tokens}")
    for name, v, lo in (("num_blocks", num_blocks, 2), ("max_num_seqs", max_num_seqs, 1),
                        ("prefill_us_per_token", pre, 0), ("decode_us_per_token", dec, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if w.n_requests and not np.array_equal(w.n_blocks, w.input_tokens // w.block_tokens):
        i = int(np.argmax(w.n_blocks != w.input_tokens // w.block_tokens))
        raise ValueError(f"request {i}: {w.n_blocks[i]} block keys for {w.input_tokens[i]} tokens "
                         f"(one key per full {w.block_tokens}-token block)")
    if any(g.kind == "sliding_window" and g.sliding_window < 2 for g in u.groups):
        raise ValueError("sliding_window must be >= 2")


def _alone(u: Unified, T: int) -> int:
    """Most blocks a request of ``T`` slots can need (its hit's blocks included): it never fits a pool of fewer."""
    nT = -(-T // u.block_tokens)
    return sum(3 if g.kind == "mamba" else nT for g in u.groups)


def simulate_hybrid(w, u: Unified, num_blocks: int, *, max_num_seqs: int = 256, prefill_us_per_token: int = 0,
                    decode_us_per_token: int = 0) -> HybridRun:
    """Serve workload ``w`` (a :class:`~cacheresearch.workload.table.Workload`) on one pool of ``num_blocks``
    blocks of layout ``u`` (module docstring). Exact integer microseconds; FCFS admission."""
    _validate(w, u, num_blocks, max_num_seqs, prefill_us_per_token, decode_us_per_token)
    N, B = w.n_requests, u.block_tokens
    arr = w.arrival_ms.astype(np.int64) * 1000
    P_all, O_all = w.input_tokens.astype(np.int64), w.output_tokens.astype(np.int64)
    admit = np.full(N, -1, np.int64)
    finish = np.full(N, -1, np.int64)
    hits = np.zeros(N, np.int64)
    pool = _Pool(num_blocks, len(u.groups))
    running: list = []  # heap of (finish, admission order, request, held blocks)
    waiting: deque = deque()
    i, order, peak = 0, 0, 0
    inf = np.iinfo(np.int64).max
    while i < N or running:
        t = min(int(arr[i]) if i < N else inf, running[0][0] if running else inf)
        while running and running[0][0] <= t:
            for blocks in heapq.heappop(running)[3]:
                for b in reversed(blocks):
                    if b:
                        pool.release(b)
        while i < N and arr[i] <= t:
            waiting.append(i)
            i += 1
        while waiting and len(running) < max_num_seqs:
            r = waiting[0]
            P, out = int(P_all[r]), int(O_all[r])
            T = P + max(out, 1) - 1
            if _alone(u, T) > num_blocks - 1:
                waiting.popleft()  # never fits, even alone: left unserved (admit -1)
                continue
            gk = group_keys(w.request_keys(r), w.block_tokens, B)
            L, touch, new, need = _plan(pool, u, gk, P, T)
            if need > pool.free:
                break
            waiting.popleft()
            held = _admit(pool, u, gk, P, T, L, touch, new)
            hits[r], admit[r] = L * B, t
            finish[r] = t + prefill_us_per_token * (P - L * B) + decode_us_per_token * out
            heapq.heappush(running, (int(finish[r]), order, r, held))
            order += 1
            peak = max(peak, len(running))
    if waiting:  # an empty pool admits any request `_alone` passes
        raise RuntimeError("simulate_hybrid: requests left waiting on an empty pool")
    return HybridRun(admit, finish, hits, P_all, peak, pool.evictions)

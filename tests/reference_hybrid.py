"""Plain-Python reference of vLLM's hybrid KV cache manager, as ``cacheresearch.replica.hybrid_pool`` models it.

A transcription, class for class, of vllm-project/vllm ``vllm/v1/core/block_pool.py`` (a free queue of
blocks, a map from (block hash, group) to the blocks caching it, ``touch`` / ``free_blocks`` /
``get_new_blocks``), ``single_type_kv_cache_manager.py`` (``FullAttentionManager`` scanning left to right,
``SlidingWindowManager`` right to left for ``ceil((W - 1) / block)`` contiguous blocks,
``MambaManager`` right to left for one block; ``remove_skipped_blocks`` with ``get_num_skipped_tokens``)
and ``kv_cache_coordinator.py`` (``HybridKVCacheCoordinator.find_longest_cache_hit``'s fixed point, full
attention first, one pass for full + one other type). No EAGLE, no context parallelism, one block size.
Lists and dicts only; slow and obvious. The serving loop and the Mamba group's checkpoint / running-state
blocks follow the model's module docstring (its assumptions, stated there).
"""

from __future__ import annotations

FULL = ("full", "mla")


class Block:
    def __init__(self, bid):
        self.id, self.ref, self.hash, self.is_null = bid, 0, None, bid == 0


class BlockPool:
    def __init__(self, n):
        self.blocks = [Block(i) for i in range(n)]
        self.free_queue = self.blocks[1:]  # head first; block 0 is the null block
        self.null = self.blocks[0]
        self.cached = {}  # (key, group) -> {block id: block}, insertion ordered
        self.evictions = 0

    def get_cached_block(self, key, gids):
        out = []
        for g in gids:
            d = self.cached.get((key, g))
            if not d:
                return None
            out.append(next(iter(d.values())))
        return out

    def touch(self, blocks):
        for b in blocks:
            if b.ref == 0 and not b.is_null:
                self.free_queue.remove(b)
            b.ref += 1

    def free_blocks(self, ordered):
        for b in ordered:
            b.ref -= 1
            if b.ref == 0 and not b.is_null:
                self.free_queue.append(b)

    def get_new_blocks(self, n):
        out = []
        for _ in range(n):
            b = self.free_queue.pop(0)
            if b.hash is not None:
                d = self.cached[b.hash]
                del d[b.id]
                if not d:
                    del self.cached[b.hash]
                b.hash = None
                self.evictions += 1
            b.ref += 1
            out.append(b)
        return out

    def cache(self, b, key, g):
        b.hash = (key, g)
        self.cached.setdefault((key, g), {})[b.id] = b


def find_full(pool, hashes, max_length, gids, B):
    computed = [[] for _ in gids]
    for h in hashes[: max_length // B]:
        got = pool.get_cached_block(h, gids)
        if got is None:
            break
        for c, b in zip(computed, got):
            c.append(b)
    return computed


def find_sliding(pool, hashes, max_length, gids, B, W):
    need = -(-(W - 1) // B)
    n = max_length // B
    computed = [[pool.null] * n for _ in gids]
    run, found = 0, False
    for i in range(n - 1, -1, -1):
        got = pool.get_cached_block(hashes[i], gids)
        if got is not None:
            for c, b in zip(computed, got):
                c[i] = b
            run += 1
            if run >= need:
                for c in computed:
                    del c[i + run:]
                found = True
                break
        else:
            run = 0
    if not found:
        for c in computed:
            del c[run:]
    return computed


def find_mamba(pool, hashes, max_length, gids, B):
    computed = [[] for _ in gids]
    for i in range(max_length // B - 1, -1, -1):
        got = pool.get_cached_block(hashes[i], gids)
        if got is not None:
            for c, b in zip(computed, got):
                c.extend([pool.null] * i)
                c.append(b)
            break
    return computed


def attention_groups(groups):
    """[(kind, window, [group ids])] in first-appearance order, then full attention first (stable)."""
    specs = []
    for i, (kind, w) in enumerate(groups):
        for s in specs:
            if s[0] == kind and s[1] == w:
                s[2].append(i)
                break
        else:
            specs.append((kind, w, [i]))
    return sorted(specs, key=lambda s: s[0] not in FULL)


def find_longest_cache_hit(pool, hashes, max_len, groups, B):
    """Per-group hit blocks and the hit length in tokens (the coordinator's fixed point)."""
    specs = attention_groups(groups)
    hit = max_len
    by_group = [None] * len(groups)
    len_by_group = [0] * len(groups)
    simple = len(specs) == 2 and specs[0][0] in FULL
    while True:
        curr = hit
        for kind, w, gids in specs:
            if kind in FULL and by_group[gids[0]] is not None:
                curr = min(curr, len_by_group[gids[0]])
                continue
            if kind in FULL:
                got = find_full(pool, hashes, curr, gids, B)
            elif kind == "sliding_window":
                got = find_sliding(pool, hashes, curr, gids, B, w)
            else:
                got = find_mamba(pool, hashes, curr, gids, B)
            curr = len(got[0]) * B
            for g, blocks in zip(gids, got):
                by_group[g], len_by_group[g] = blocks, curr
        if curr >= hit:
            break
        hit = curr
        if simple:
            break
    for kind, _, gids in specs:
        if kind in FULL:
            for g in gids:
                del by_group[g][hit // B:]
    return [b if b is not None else [] for b in by_group], hit


def skipped_tokens(kind, w, computed):
    if kind == "sliding_window":
        return max(0, computed - w + 1)
    if kind == "mamba":
        return computed - 1
    return 0


def simulate(requests, groups, B, num_blocks, *, max_num_seqs, pre_us, dec_us):
    """``requests``: [(arrival_us, prompt, output, group-block keys)]; ``groups``: [(kind, window)].
    Returns per request (admit_us or -1, finish_us or -1, hit tokens) and the evictions."""
    pool = BlockPool(num_blocks)
    n = len(requests)
    out = [[-1, -1, 0] for _ in range(n)]
    running, waiting, nxt, order = [], [], 0, 0
    while nxt < n or running:
        cands = ([requests[nxt][0]] if nxt < n else []) + [r[0] for r in running]
        t = min(cands)
        for r in sorted([r for r in running if r[0] <= t], key=lambda r: (r[0], r[1])):
            running.remove(r)
            for blocks in r[2]:
                pool.free_blocks([b for b in reversed(blocks) if not b.is_null])
        while nxt < n and requests[nxt][0] <= t:
            waiting.append(nxt)
            nxt += 1
        while waiting and len(running) < max_num_seqs:
            idx = waiting[0]
            _, P, out_tok, keys = requests[idx]
            T = P + max(out_tok, 1) - 1
            nT = -(-T // B)
            if sum(3 if k == "mamba" else nT for k, _ in groups) > num_blocks - 1:
                waiting.pop(0)
                continue
            held = admit(pool, keys, P, T, groups, B)
            if held is None:
                break
            waiting.pop(0)
            blocks, hit = held
            out[idx][0], out[idx][2] = t, hit
            out[idx][1] = t + pre_us * (P - hit) + dec_us * out_tok
            running.append((out[idx][1], order, blocks))
            order += 1
    return out, pool.evictions


def admit(pool, keys, P, T, groups, B):
    """One admission: lookup, the free-queue check, allocation, caching, the window rule. None: no room."""
    hit_blocks, hit = find_longest_cache_hit(pool, keys, max(P - 1, 0), groups, B)
    L, nT, m = hit // B, -(-T // B), P // B
    plan = []
    for g, (kind, w) in enumerate(groups):
        skip = skipped_tokens(kind, w, hit) // B if hit > 0 else 0
        comp = hit_blocks[g][skip:] if kind != "mamba" else [b for b in hit_blocks[g] if not b.is_null]
        new = (1 + (m > L)) if kind == "mamba" else nT - max(skip, len(hit_blocks[g]))
        plan.append((skip, comp, new))
    need = sum(p[2] for p in plan) + sum(b.ref == 0 and not b.is_null for p in plan for b in p[1])
    if need > len(pool.free_queue):
        return None
    for _, comp, _ in plan:
        pool.touch(comp)
    held = []
    for g, ((kind, w), (skip, comp, new)) in enumerate(zip(groups, plan)):
        fresh = pool.get_new_blocks(new)
        if kind == "mamba":
            if m > L:
                pool.cache(fresh[0], keys[m - 1], g)
            pool.free_blocks(comp + fresh[:-1])
            held.append(fresh[-1:])
            continue
        blocks = [pool.null] * skip + comp + fresh
        for j in range(L, m):
            if not blocks[j].is_null:
                pool.cache(blocks[j], keys[j], g)
        if kind == "sliding_window":
            upto = min(skipped_tokens(kind, w, T - 1) // B, len(blocks))
            removed = []
            for i in range(upto - 1, -1, -1):
                if blocks[i].is_null:
                    break
                removed.append(blocks[i])
                blocks[i] = pool.null
            pool.free_blocks(removed)
        held.append(blocks)
    return held, hit

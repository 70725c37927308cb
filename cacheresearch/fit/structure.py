"""The prefix structure of a workload: sessions, each request's parent, and the radix tree of ids.

Chained block ids name a block *and its whole prefix*, so the requests of a trace form a forest of
radix trees keyed by their first block (a *root*). :func:`request_structure` describes every request
against the requests before it:

* its **session**: given (Bailian ``parent_chat_id`` chains, :func:`cacheresearch.workload.trace.read_bailian`)
  or, for traces without session ids (Mooncake), the tree of its first block;
* its **parent**: the given parent, else the earlier request of its session that shares the longest
  prefix with it (ties: the most recent);
* ``shared``: blocks shared with the parent, ``dropped = parent blocks - shared`` (how far up the
  parent's path the request branches off) and ``appended = blocks - shared`` (its new blocks); a
  multi-turn step extends the parent's context (``dropped == 0``, ``appended > 0``), an exact repeat
  has both zero;
* ``root_match``: for a session's first request, the blocks it shares with earlier requests of
  *other* sessions (a shared system prompt).

:func:`tree_stats` summarizes the radix tree (nodes, branching factors, depths, reuse of blocks)
for comparing a trace with a sample of a fitted model. Plain NumPy; no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from cacheresearch.workload import Workload

__all__ = ["Structure", "first_block_keys", "request_structure", "tree_stats", "block_reuse_times",
           "chain_content_hashes", "session_hit_rates", "split_conversations"]


class Structure(NamedTuple):
    session: np.ndarray  # int64 [N], sessions numbered by first request
    position: np.ndarray  # int64 [N]: index of the request within its session (0 = first)
    parent: np.ndarray  # int64 [N]: parent request (-1 for a session's first request)
    lag: np.ndarray  # int64 [N]: position - parent's position (0 for first requests)
    shared: np.ndarray  # int64 [N]
    dropped: np.ndarray  # int64 [N]
    appended: np.ndarray  # int64 [N]
    root_match: np.ndarray  # int64 [N]: first requests: blocks shared with other sessions; else 0
    root_group: np.ndarray  # int64 [N]: index of the request's first block among distinct first blocks


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    if n == 0:
        return 0
    neq = np.nonzero(a[:n] != b[:n])[0]
    return int(neq[0]) if neq.size else n


def _structure_loop(w: Workload, sess: np.ndarray, parent):
    """Positions, parents, shared blocks and root matches, request by request (given parents, or keys
    repeated inside a request)."""
    n = w.n_requests
    off = w.offsets
    keys = w.keys
    position = np.zeros(n, np.int64)
    count: dict[int, int] = {}
    par = np.full(n, -1, np.int64)
    shared = np.zeros(n, np.int64)
    root_match = np.zeros(n, np.int64)
    last_in: dict[tuple, int] = {}  # (session, key) -> latest request of that session containing the key
    owner_seen: dict[int, int] = {}  # key -> a session that has it (any)
    kl = keys.tolist()
    for i in range(n):
        s = int(sess[i])
        position[i] = count.get(s, 0)
        count[s] = position[i] + 1
        ks = kl[off[i]: off[i + 1]]
        if position[i] > 0:
            if parent is not None and parent[i] >= 0:
                p = int(parent[i])
                m = _common_prefix(keys[off[i]: off[i + 1]], keys[off[p]: off[p + 1]])
            else:
                m = 0
                while m < len(ks) and (s, ks[m]) in last_in:
                    m += 1
                p = last_in[(s, ks[m - 1])] if m else -1
                if p < 0:  # nothing shared: the previous request of the session
                    p = int(np.nonzero(sess[:i] == s)[0][-1])
            par[i] = p
            shared[i] = m
        else:
            m = 0
            while m < len(ks) and ks[m] in owner_seen:
                m += 1
            root_match[i] = m
        for k in ks:
            last_in[(s, k)] = i
            owner_seen.setdefault(k, s)
    return position, par, shared, root_match


def _leading(flag: np.ndarray, w: Workload, pos: np.ndarray) -> np.ndarray:
    """Per request, the length of the leading run of its blocks where ``flag`` holds."""
    nb = w.n_blocks.astype(np.int64)
    out = np.zeros(w.n_requests, np.int64)
    ne = nb > 0
    if ne.any():
        first_off = np.where(flag, np.iinfo(np.int64).max, pos)
        out[ne] = np.minimum(np.minimum.reduceat(first_off, w.offsets[:-1][ne]), nb[ne])
    return out


def _structure_vectorized(w: Workload, sess: np.ndarray):
    """What :func:`_structure_loop` computes without given parents, by sorting (block, request) pairs:
    a request's shared blocks are the leading run of its keys seen before in its session, its parent
    the latest earlier request of the session holding the last of them. ``None`` when a key repeats
    inside a request (the loop handles that case)."""
    n = w.n_requests
    nb = w.n_blocks.astype(np.int64)
    keys = w.keys
    req = np.repeat(np.arange(n, dtype=np.int64), nb)
    pos = np.arange(w.total_blocks, dtype=np.int64) - w.offsets[:-1][req]
    sb = sess[req]

    def prev_occurrence(*group):
        o = np.lexsort((req,) + group)
        same = np.ones(o.size - 1 if o.size else 0, bool)
        for g in group:
            same &= g[o][1:] == g[o][:-1]
        prev = np.full(req.size, -1, np.int64)
        if o.size:
            prev[o[1:]] = np.where(same, req[o][:-1], -1)
        return prev

    prev_s = prev_occurrence(keys, sb)  # the latest earlier request of the session with this key
    if np.any(prev_s == req):
        return None
    prev_any = prev_occurrence(keys)
    m_sess = _leading(prev_s >= 0, w, pos)
    m_any = _leading(prev_any >= 0, w, pos)
    order = np.argsort(sess, kind="stable")
    so = sess[order]
    start = np.concatenate([[True], so[1:] != so[:-1]]) if n else np.zeros(0, bool)
    grp_start = np.maximum.accumulate(np.where(start, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n) - grp_start
    prev_req = np.full(n, -1, np.int64)
    prev_req[order[1:]] = np.where(~start[1:], order[:-1], -1)
    later = position > 0
    par = np.full(n, -1, np.int64)
    shared = np.zeros(n, np.int64)
    root_match = np.where(later, 0, m_any)
    at = w.offsets[:-1] + np.maximum(m_sess - 1, 0)
    held = (prev_s[np.minimum(at[later], w.total_blocks - 1)] if w.total_blocks
            else np.full(int(later.sum()), -1, np.int64))  # no keys at all: every m_sess is 0
    par[later] = np.where(m_sess[later] > 0, held, prev_req[later])
    shared[later] = m_sess[later]
    return position, par, shared, root_match


def first_block_keys(w: Workload, missing: int = 2**64 - 1) -> np.ndarray:
    """Each request's first key, ``missing`` for a request without blocks (``input_length`` 0); a trace
    whose every request has no blocks has no keys at all."""
    if not w.total_blocks:
        return np.full(w.n_requests, missing, np.uint64)
    return np.where(w.n_blocks > 0, w.keys[np.minimum(w.offsets[:-1], w.total_blocks - 1)], np.uint64(missing))


def request_structure(w: Workload, session=None, parent=None, *, method: str = "auto") -> Structure:
    """The structure of every request (module docstring). ``session`` and ``parent`` (int [N],
    ``-1`` for none) come from the trace when it has them; otherwise sessions are the trees of the
    first blocks and parents the longest-prefix earlier requests. ``method``: ``auto`` sorts the
    (session, key, request) triples where no parent is given and no key repeats inside a request,
    else (and with ``loop``) the request-by-request reference; both give the same arrays."""
    n = w.n_requests
    first = first_block_keys(w)
    _, root_group = np.unique(first, return_inverse=True)
    root_group = root_group.astype(np.int64).reshape(-1)
    if session is None:
        sess_raw = root_group
    else:
        sess_raw = np.asarray(session, dtype=np.int64)
        if sess_raw.shape != (n,):
            raise ValueError("session must give one session per request")
    # renumber sessions by first request
    _, first_idx, inv = np.unique(sess_raw, return_index=True, return_inverse=True)
    order = np.argsort(first_idx, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    sess = rank[inv.reshape(-1)].astype(np.int64)
    if parent is not None:
        parent = np.asarray(parent, dtype=np.int64)
        if parent.shape != (n,):
            raise ValueError("parent must give one parent per request")
        if np.any(parent >= np.arange(n)):
            raise ValueError("a parent must be an earlier request")
        bad = (parent >= 0) & (sess[np.maximum(parent, 0)] != sess)
        if bad.any():
            raise ValueError(f"request {int(np.argmax(bad))} has a parent in another session")
    if method not in ("auto", "loop"):
        raise ValueError("method must be auto (sorting, where it applies) or loop (request by request, the reference)")
    vec = None if parent is not None or method == "loop" else _structure_vectorized(w, sess)
    if vec is None:
        position, par, shared, root_match = _structure_loop(w, sess, parent)
    else:
        position, par, shared, root_match = vec
    nb = w.n_blocks.astype(np.int64)
    has = par >= 0
    lag = np.where(has, position - position[np.maximum(par, 0)], 0)
    dropped = np.where(has, nb[np.maximum(par, 0)] - shared, 0)
    appended = np.where(has, nb - shared, 0)
    return Structure(sess, position, par, lag, shared, dropped, appended, root_match, root_group)


def split_conversations(w: Workload, st: Structure | None = None, *, partial_blocks: int = 1,
                        interleaved_min: float | None = 0.5, min_conversations: int = 10) -> tuple[np.ndarray, dict]:
    """Conversations of a trace without session ids, inside its root trees (``st``: the structure with
    roots as sessions, computed when not given).

    Several conversations of a service can open with one shared head (a system prompt, a tool
    prompt), so their requests fall in one root tree. A request continues its parent's conversation
    (its parent: the earlier request of the tree sharing the longest prefix) when it keeps the
    parent's whole prompt except at most ``partial_blocks`` trailing blocks (a request's last block
    is partial and is completed, under a new id, by the next turn) and appends to it or repeats it;
    else (it drops more of the parent: it shares only a head, or rewrites the context) it starts a
    conversation of its own. One forward pass (parents come first).

    A root is split only when it holds many conversations (at least ``min_conversations``) that run
    at the same time (independent users of one prompt): at least ``interleaved_min`` of its continuing
    requests come after a request of another of its conversations since their own conversation's
    previous request (or none continues: every conversation is one request). A root whose pieces
    follow one another (an agent that rewrites its context), or that holds a few (one user's
    branches, edits and retries, which interleave too), stays one session. ``interleaved_min=None``
    splits every root holding two or more. Returns ``(session per request, numbered by first request; info)``; ``info``:
    ``roots``, ``conversations`` (sessions after the split), ``split_roots``, ``interleaved_share``
    (over the continuing requests of roots holding several conversations). Assumptions (labelled): a
    new conversation whose first prompt extends a whole earlier prompt (but its partial last block) is
    read as that prompt's continuation; the thresholds (0.5, 10) are choices, not fitted values."""
    if st is None:
        st = request_structure(w)
    n = w.n_requests
    root = st.session
    cont = (st.parent >= 0) & (st.dropped <= partial_blocks)
    conv = np.empty(n, np.int64)
    par = st.parent.tolist()
    c = cont.tolist()
    nxt = 0
    for i in range(n):
        if c[i]:
            conv[i] = conv[par[i]]
        else:
            conv[i] = nxt
            nxt += 1
    n_roots = int(root.max(initial=-1)) + 1

    def prev_in(group):  # the previous request (index order = time order) of the same group, -1 for none
        o = np.lexsort((np.arange(n), group))
        prev = np.full(n, -1, np.int64)
        if n > 1:
            prev[o[1:]] = np.where(group[o][1:] == group[o][:-1], o[:-1], -1)
        return prev

    pc, pr = prev_in(conv), prev_in(root)
    later = pc >= 0
    inter = later & (pr != pc)
    per_root = np.bincount(root[~cont], minlength=n_roots)  # conversations per root
    n_later = np.bincount(root[later], minlength=n_roots)
    n_inter = np.bincount(root[inter], minlength=n_roots)
    multi = per_root > 1
    if interleaved_min is None:
        split = multi
    else:
        split = (per_root >= min_conversations) & (n_inter >= interleaved_min * n_later)
    sess = np.where(split[root], conv, -1 - root)  # an unsplit root is one session
    _, first_idx, inv = np.unique(sess, return_index=True, return_inverse=True)
    rank = np.empty(first_idx.size, np.int64)
    rank[np.argsort(first_idx, kind="stable")] = np.arange(first_idx.size)
    m = multi[root] & later
    return rank[inv.reshape(-1)], {
        "roots": n_roots, "conversations": int(first_idx.size), "split_roots": int(split.sum()),
        "interleaved_share": float(inter[m].mean()) if m.any() else float("nan")}


def chain_content_hashes(w: Workload) -> tuple[Workload, dict]:
    """Prefix-chain a trace whose ids are per-block content hashes.

    A chained id names a block *and its whole prefix*, so every occurrence of an id has the same
    predecessor (the id before it in its request, or none at position 0). Some public traces hash
    each block's content alone; then one id follows different predecessors. When any id does, the
    ids are rewritten so that a new id stands for the pair (chained id of the prefix, raw id), level
    by level down the requests (a trie of the raw ids): the result is prefix-chained and equal to the
    input on a trace that already was. Returns ``(workload, info)``; ``info`` says what was found
    (``ids``, ``inconsistent_ids``: ids seen after two or more different predecessors, ``chained``)."""
    keys = w.keys
    nb = w.n_blocks.astype(np.int64)
    info = {"ids": 0, "inconsistent_ids": 0, "chained": False}
    if w.total_blocks == 0:
        return w, info
    req = np.repeat(np.arange(w.n_requests), nb)
    pos = np.arange(w.total_blocks) - w.offsets[:-1][req]
    none = np.uint64(2**64 - 1)
    pred = np.where(pos > 0, np.concatenate([[none], keys[:-1]]), none)
    # distinct (id, predecessor) pairs by one sort on (id, predecessor) (np.unique(axis=0) sorts rows as
    # opaque bytes: tens of seconds on a few million blocks)
    o = np.lexsort((pred, keys))
    ks, ps = keys[o], pred[o]
    new_id = np.concatenate([[True], ks[1:] != ks[:-1]])
    new_pair = new_id | np.concatenate([[True], ps[1:] != ps[:-1]])
    npred = np.add.reduceat(new_pair.astype(np.int64), np.nonzero(new_id)[0])
    info["ids"] = int(new_id.sum())
    info["inconsistent_ids"] = int(np.sum(npred > 1))
    if info["inconsistent_ids"] == 0:
        return w, info
    new = np.zeros(w.total_blocks, np.uint64)
    nxt = 0
    order = np.argsort(pos, kind="stable")
    bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2))
    prev = np.full(w.total_blocks, -1, np.int64)  # chained id of the block before (-1 at position 0)
    for j in range(int(pos.max()) + 1):
        idx = order[bounds[j]: bounds[j + 1]]
        if j > 0:
            prev[idx] = new[idx - 1].astype(np.int64)
        a, b = prev[idx], keys[idx].view(np.int64)
        o = np.lexsort((b, a))  # rank the (prefix, raw id) pairs by one sort, as above
        first = np.concatenate([[True], (a[o][1:] != a[o][:-1]) | (b[o][1:] != b[o][:-1])]) if o.size else o
        inv = np.empty(idx.size, np.int64)
        inv[o] = np.cumsum(first) - 1
        new[idx] = (nxt + inv).astype(np.uint64)
        nxt += int(inv.max()) + 1 if inv.size else 0
    info["chained"] = True
    meta = dict(w.meta)
    meta["key_chaining"] = "content hashes chained into prefix ids"
    return dataclasses.replace(w, keys=new, meta=meta), info


def session_hit_rates(w: Workload, session: np.ndarray | None = None) -> np.ndarray:
    """Token hit rate of each session with an unbounded cache shared by all (sessions: given, else the
    trees of the first blocks). With prefix-chained ids a request hits the blocks already seen (a
    block seen implies its prefix seen), capped at its input tokens."""
    if w.n_requests == 0:
        return np.zeros(0)
    if session is None:
        _, session = np.unique(first_block_keys(w), return_inverse=True)
    session = np.asarray(session).reshape(-1)
    req = np.repeat(np.arange(w.n_requests), w.n_blocks)
    _, first_at, inv = np.unique(w.keys, return_index=True, return_inverse=True)
    seen_before = req[first_at][inv.reshape(-1)] < req
    hit_blocks = np.bincount(req[seen_before], minlength=w.n_requests)
    hit_tok = np.minimum(hit_blocks * int(w.block_tokens), w.input_tokens).astype(np.float64)
    _, s = np.unique(session, return_inverse=True)
    s = s.reshape(-1)
    tot = np.bincount(s, weights=w.input_tokens.astype(np.float64))
    hit = np.bincount(s, weights=hit_tok)
    return np.where(tot > 0, hit / np.maximum(tot, 1.0), 0.0)


def block_reuse_times(w: Workload) -> np.ndarray:
    """Seconds between consecutive requests that contain the same block, over every reuse."""
    t = np.repeat(w.arrival_ms, w.n_blocks) / 1000.0
    order = np.lexsort((t, w.keys))
    k, ts = w.keys[order], t[order]
    same = k[1:] == k[:-1]
    return (ts[1:] - ts[:-1])[same]


def tree_stats(w: Workload) -> dict:
    """Radix-tree summary: distinct blocks (nodes), roots, children per internal node, depth of
    leaves, share of block reuses taken by the most reused 10% of blocks, reuse-time quantiles."""
    keys = w.keys
    nb = w.n_blocks
    req = np.repeat(np.arange(w.n_requests), nb)
    pos = np.arange(w.total_blocks) - w.offsets[:-1][req]
    parent = np.where(pos > 0, np.concatenate([[np.uint64(0)], keys[:-1]]), np.uint64(2**64 - 1))
    uniq, inv, cnt = np.unique(keys, return_inverse=True, return_counts=True)
    depth = np.zeros(uniq.size, np.int64)
    depth[inv.reshape(-1)] = pos
    par_of = np.full(uniq.size, np.uint64(2**64 - 1))
    par_of[inv.reshape(-1)] = parent
    pk, children = np.unique(par_of, return_counts=True)
    internal = pk != np.uint64(2**64 - 1)
    n_roots = int(children[~internal].sum()) if (~internal).any() else 0
    ch = children[internal]
    is_parent = np.isin(uniq, pk[internal])
    leaf_depth = depth[~is_parent] + 1
    reuses = cnt - 1
    top = np.sort(reuses)[::-1][: max(1, uniq.size // 10)]
    rt = block_reuse_times(w)
    return {
        "requests": int(w.n_requests),
        "nodes": int(uniq.size),
        "roots": n_roots,
        "internal_nodes": int(ch.size),
        "branching_mean": float(ch.mean()) if ch.size else 0.0,
        "branching_nodes_share": float(np.mean(ch > 1)) if ch.size else 0.0,
        "leaf_depth_mean": float(leaf_depth.mean()) if leaf_depth.size else 0.0,
        "leaf_depth_p90": float(np.percentile(leaf_depth, 90)) if leaf_depth.size else 0.0,
        "block_reuse_share_top10pct": float(top.sum() / max(reuses.sum(), 1)),
        "reused_block_share": float(np.mean(cnt > 1)),
        "reuse_time_p50_s": float(np.median(rt)) if rt.size else float("nan"),
        "reuse_time_p90_s": float(np.percentile(rt, 90)) if rt.size else float("nan"),
    }

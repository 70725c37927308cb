"""Plain-Python reference of the vllm replica (cacheresearch/replica/vllm.py, cacheresearch/replica/pool.py).

Block by block, with dicts and lists: no runs, no vectors. The semantics (docs/fleet_semantics.md, "The
vllm replica"):

* time in integer picoseconds (Python ints: no horizon); a request arriving at ``t`` ms arrives at
  ``t * 10**9`` ps;
* before each arrival every replica runs the steps that start at or before it (its clock); a request
  joins its replica's waiting queue; an idle replica's clock moves to the arrival;
* a step: (1) release the requests that finished at the previous step (their pins go; blocks whose
  last pin goes enter the free queue in vLLM's order, tail first: block ``j`` of a request of ``n``
  blocks gets stamp ``ctr + n - 1 - j``, then ``ctr += n``); (2) the running batch in admission order:
  a prefilling request asks for the rest of its prefill target, a decoding one for one token; the
  token budget is handed out in order; the pool must hold every allocation (blocks in use + the
  request's new blocks, counted against the pool as the step began, <= capacity), else the latest
  admitted request is preempted (its pins released, its blocks back in the free queue, it goes to the
  front of the waiting queue to recompute its prompt and the tokens it generated); (3) when nothing was
  preempted, waiting requests are admitted FCFS while budget, ``max_num_seqs`` and the pool allow: the
  prefix hit (leading cached blocks, at most ``floor((input - 1) / B)``) is taken now, every key of the
  prompt is pinned, the first chunk is computed; (4) unpinned cached blocks are evicted, lowest stamp
  first, whenever the blocks held exceed the capacity; (5) the step takes :func:`step_time_ps`
  picoseconds (at least one): ``1000 (base_ns + prefill_ns * prefill tokens + decode_ns * decoding
  requests) + ctx_ps * (sum over decoding requests of input + generated tokens) + ceil(prefill_ctx_fs *
  pairs / 1000)``, ``pairs`` = sum over prefill chunks of ``t c + t (t + 1) / 2`` (``t`` tokens after
  ``c`` computed: causal attention); a request whose prefill
  completes emits a token at the step's end (its first: TTFT), a decoding one emits one; a request
  with all its output tokens finishes at the step's end.
* A request's computed full prompt blocks are cached (visible to lookups and routers) from the step
  that computes them; its other blocks (a partial block, generated tokens) are working blocks that
  vanish when it leaves.
* Events (what the engines' event loops count, ``Metrics.events``): every step is one event, except
  that consecutive decode-only steps of one replica within one run-up to an arrival (or the final
  drain) are one event together. A step is decode-only when, as it begins, the batch is non-empty,
  nothing in it has finished or is still prefilling, nothing is admissible (the waiting queue is empty
  or the batch holds ``max_num_seqs`` requests or the whole token budget) and it preempts nothing.
  Counted here step by step, independently of the engines' closed-form stretches.

A cpu tier per replica (``cpu_blocks > 0``; the numba backend's, ``cacheresearch/tiers/vllm.py``; pool policy lru
only): an ``OrderedDict`` of keys, last = most recent. A block the pool evicts goes there as the most recent (a copy
already held is moved, not counted as written); beyond ``cpu_blocks`` the least recent leaves. At admission the
hit is the pool's leading cached blocks, continued (when the pool's run is not already cut by the cap) by the
leading keys the cpu tier holds, capped as ever at ``floor((input - 1) / B)``; the cpu-hit keys are computed
blocks of the pool from then on (they count in the pool check and are stored), are touched in the cpu tier
deepest first (the leading one ends most recent) and stay there (inclusive). ``overlap="sync"``: the step that
admits them lasts ``ceil(blocks x block_bytes x 10**6 / cpu_mbps) + cpu_latency_ps`` longer per admitted request
with cpu hits. ``"async"``: such a request's hit blocks are allocated (pinned, stored) when the scan reaches it, its
load goes on the replica's link (after the loads before it) and it stays in the waiting queue, skipped, until a
step starting at or after the load lands; at a step's admissions the requests whose loads landed move to the
head of the queue (in order); a replica with nothing to run waits for the first landing (or the next event); a
request that fits nowhere while nothing runs and no load is in flight is rejected.

A hybrid KV layout (``kv_groups`` groups, bit ``g`` of ``kv_window_groups`` a sliding window of ``kv_window``
tokens; vLLM's hybrid KV cache manager, lru pool, no cpu tier): the keys are ``(key, group)`` pairs of one pool. At
admission the hit is ``hybrid_pool.hit_blocks`` over the groups' cached keys (capped as ever); with ``s0 =
hybrid_pool.window_free_upto(W, computed at admission, B)`` a full-attention group pins every prompt key, a window
group those from ``s0`` on, and computing stores each group's keys from there (the request's ``f = s0``). Working
blocks: every group its blocks past the keyed ones, a window group none below ``f``. At the start of every step,
after the finished requests' release, each running request's window groups free its blocks ``f ..
window_free_upto(W, its KV tokens, B) - 1``, groups in order, highest first: a cached key loses its pin (the next
free-queue stamp when its last goes), a working block leaves at once; a step whose start freed something begins a
new event. Finish and preemption release each group's keys tail first, groups in order, one stamp each. The
routers' views read the first full-attention group's keys.
vLLM's prefix-cache counters (``vllm_counters``, tokens, requests never preempted): every lookup (the admission scan
reaching a request that holds no blocks) adds its prompt tokens and its local hit tokens under ``attempt``; an
admission adds them under ``admission`` and, with a cpu tier, prompt - local hit tokens and its cpu-hit tokens to the
external pair. The client's timeouts (``client_timeout_ms = T > 0``): a request's deadline is its send + T; at each
step, after the finished requests are released, running requests whose deadline passed release their pins and leave
(end -2), then waiting ones whose deadline passed and whose load is not in flight; a step at which a request is
aborted is not decode-only; a replica idle on loads also wakes at the first deadline of a waiting request with no
load in flight; a permit goes back at the holder's finish or deadline. ``status``: 0 ok (finished by its deadline),
1 timed out, 2 never served.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
from reference_fleet import ring_nodes, router_oracle
from reference_gie_index import GieIndexer
from reference_vllm import POOL_ORACLES

from cacheresearch.replica.hybrid_pool import hit_blocks, window_free_upto
from cacheresearch.replica.kv_layout import KVGroup, Unified

PS_PER_MS = 10**9


def step_time_ps(*, base_ns, prefill_ns, decode_ns, ctx_ps, prefill_ctx_fs, prefill_tokens, decode_reqs, ctx_tokens,
                 pairs):
    """The step-time model in exact integer picoseconds (at least 1)."""
    ps = 1000 * (base_ns + prefill_ns * prefill_tokens + decode_ns * decode_reqs) + ctx_ps * ctx_tokens
    return max(ps + _cdiv(prefill_ctx_fs * pairs, 1000), 1)


def _cdiv(a, b):
    return -(-a // b)


class _Req:
    __slots__ = ("i", "c", "pt", "d", "d0", "hit", "npre", "tok", "pref", "done", "ch", "f")

    def __init__(self, i, c, pt, d, hit, npre, ch=0, f=0):
        self.i, self.c, self.pt, self.d, self.d0, self.hit, self.npre = i, c, pt, d, d, hit, npre
        self.tok, self.pref, self.done, self.ch = 0, True, False, ch
        self.f = f  # a hybrid layout: the window groups hold the request's blocks from f on


class _Replica:
    def __init__(self):
        self.stored = set()  # keys cached (canonical blocks)
        self.ref = {}  # key -> pins
        self.stamp = {}  # key -> free-queue stamp
        self.ctr = 0
        self.work = 0
        self.running: list[_Req] = []
        self.waiting: deque = deque()  # [i, d, npre, cpu load lands (ps, -1: none), hit, cpu hit]
        self.clock = 0
        self.steps = 0
        self.events = 0
        self.in_stretch = False  # the previous step of this run-up was decode-only
        self.freed = False  # a hybrid layout: this step's start freed window blocks
        self.busy = 0
        self.preempt = 0
        self.dropped = 0
        self.rejected = 0
        self.kv_max = 0
        self.cpu = OrderedDict()  # the cpu tier: keys, last = most recent
        self.offloaded = 0
        self.load = 0  # the cpu loads of the requests admitted in the step being built (ps)
        self.link = 0  # async: when the replica's link to its cpu tier is free (ps)
        # vLLM V1's gauges (load_gauges): (waiting, KV blocks in use) at the end of every step, with its time
        self.g_pen_t, self.g_pen, self.g_pub = 0, (0, 0), (0, 0)

    def publish(self):
        """make_stats at the end of a step (update_from_output): the step before becomes the previous one."""
        self.g_pub = self.g_pen
        self.g_pen_t, self.g_pen = self.clock, (len(self.waiting), self.pinned() + self.work)

    def gauges_at(self, t):
        """The gauges as of time ``t``: the last step completed by then."""
        return self.g_pen if self.g_pen_t <= t else self.g_pub

    def pinned(self):
        return sum(1 for k in self.stored if self.ref.get(k, 0) > 0)

    def has_work(self):
        return bool(self.running) or bool(self.waiting)


def _tier_lead(keys, rp, wc: float) -> int:
    """llm-d's precise producer over a pod's two tiers: the keys held in the pool (weight 1.0) or the cpu tier
    (``wc``; in both, the larger), summed in float64 in order up to the first held in neither, truncated."""
    acc = 0.0
    for k in keys:
        g, c = k in rp.stored, k in rp.cpu
        if not (g or c):
            break
        acc += max(1.0 if g else 0.0, wc if c else 0.0)  # llm-d's fillMaxWeights: the pod's largest tier weight
    return int(acc)


def reference_batch(workload, *, capacity_blocks, replicas=1, router="round_robin", bits=None,
                    max_num_seqs=256, max_num_batched_tokens=8192, step_base_ns=5_752_705,
                    step_prefill_ns=17_251, step_decode_ns=5_999, step_ctx_ps=0, step_prefill_ctx_fs=0,
                    queue_slots=1024, max_running=256,
                    view="precise", index_capacity=31_250, instances=1, prefix_blocks=80, stale_lag_ms=1000,
                    local_load=False, kv_pressure=False, gie_hashes=None, gie_lru_capacity=31_250,
                    load_refresh_ms=0, load_gauges=0, client_permits=0, client_timeout_ms=0, counter_mode=None,
                    policy="lru", ttl_ms=None, pool_knobs=None,
                    cpu_blocks=0, cpu_mbps=0, cpu_latency_ps=0, block_bytes=0, overlap="sync", imported=None,
                    kv_groups=1, kv_window_groups=0, kv_window=0, **kn):
    """Simulate the fleet of vllm replicas request by request; returns per-request arrays and totals.
    ``policy``: the pool's free-block order (``tests/reference_vllm.py``; ``ttl_ms`` for ``ttl_refresh``,
    ``pool_knobs`` for a per-block policy's sizes); ``cpu_blocks`` etc.: the cpu tier of the module docstring.
    ``imported`` (per request, optional): prompt tokens whose KV arrives with the request (a P/D decode pool): its
    first admission (no preemption yet) starts from ``max(hit tokens, min(imported, input - 1))`` computed tokens.
    ``kv_groups``, ``kv_window_groups``, ``kv_window``: a hybrid KV layout (the module docstring's last part)."""
    assert cpu_blocks == 0 or policy == "lru", "the cpu tier runs behind the lru pool only"
    NG, WM, W = int(kv_groups), int(kv_window_groups), int(kv_window)
    hybrid = NG > 1 or WM != 0
    win = [bool((WM >> g) & 1) for g in range(NG)]
    assert not hybrid or (policy in ("lru", "unbounded") and cpu_blocks == 0), "hybrid: lru pool, no cpu tier"
    unified = Unified("reference", int(workload.block_tokens), int(workload.block_tokens), "", 0, 1,
                      tuple(KVGroup("sliding_window" if w else "full", 1, W if w else 0) for w in win), 0)
    g0 = win.index(False) if False in win else 0  # the group the routers' views read: the first full-attention one

    def vk(k):
        """A request key as the routers' views read the pool."""
        return (k, g0) if hybrid else k
    R = int(replicas)
    N = int(workload.n_requests)
    B = int(workload.block_tokens)
    C = int(capacity_blocks)
    n_inst = int(instances)
    seqs = min(int(max_num_seqs), int(max_running))
    reps = [_Replica() for _ in range(R)]
    for rp in reps:  # the free-block order of a per-block policy (tests/reference_vllm.py); else vLLM's stamps
        rp.pol = POOL_ORACLES[policy](C, **(pool_knobs or {})) if policy in POOL_ORACLES else None
        rp.rel = {}  # key -> release time (ps; ttl_refresh)
    index = [[OrderedDict() for _ in range(R)] for _ in range(n_inst)]
    gix = GieIndexer(gie_lru_capacity)  # view gie_estimate: GIE's own index (tests/reference_gie_index.py)
    gie_of = None if gie_hashes is None else [[int(x) for x in gie_hashes.ids[i][: gie_hashes.n[i]]] for i in range(N)]
    scrape_t, scrape_q, scrape_kv = -1, [0] * R, [0] * R
    keys_of = [[int(k) for k in workload.request_keys(i)] for i in range(N)]
    P_of = [int(x) for x in workload.input_tokens]
    imp_of = [0] * N if imported is None else [int(x) for x in imported]
    O_of = [int(x) for x in workload.output_tokens]
    bits_l = [[0, 0, 0, 0]] * N if bits is None else [[int(x) for x in row] for row in np.asarray(bits).tolist()]
    knobs = dict(chwbl_c_pct=150, cache_threshold_pm=500, balance_abs=32, balance_rel_pct=150,
                 miss_smallest_tree=True, overlap_weight_pct=100, temperature=0.0, prefix_weight_pct=200,
                 load_weight_pct=100, queue_threshold=128, preble_rel_pct=150, preble_abs=16, gie_prefix_mode=0,
                 gie_prefix_w_pct=100, gie_kv_w_pct=100, gie_queue_w_pct=100, gie_window_blocks=0, gie_load_w_pct=0,
                 gie_load_threshold=128, gie_lru_capacity=31_250, gie_active_w_pct=0, gie_active_timeout_ms=120_000,
                 gie_cpu_w_pct=0, gie_cpu_lru_capacity=31_250, gie_cpu_tier_w_pct=0, gie_nohit_w_pct=0,
                 gie_nohit_lru_size=1024)
    knobs.update(kn)
    # llm-d's CPU-tier prefix scorer: a second producer's index, fed as the first (gie_cpu_w_pct > 0)
    cix = GieIndexer(knobs["gie_cpu_lru_capacity"]) if knobs["gie_cpu_w_pct"] > 0 else None
    ring = ring_nodes(replicas, int(knobs.get("vnodes", 100))) if router == "chwbl" else None  # chwbl's ring
    route = router_oracle(router, R)  # with its state, for a router that keeps one
    ttft = [-1] * N
    fin = [-1] * N
    hit = [0] * N
    cpu_hit = [0] * N
    npre_out = [0] * N
    rep_of = [-1] * N
    TO = int(client_timeout_ms)
    dl = [float("inf")] * N  # the client's deadlines (ps): send + client_timeout_ms
    # vLLM's prefix-cache counters (tokens; requests never preempted): [queries, local hits]
    vc = {"attempt": [0, 0], "admission": [0, 0], "external": [0, 0]}

    def keyed(c, P):
        return min(c // B, P // B)

    def work_of(q: _Req):
        P = P_of[q.i]
        return hy_work(kv_of(q), keyed(q.c, P), q.f)

    def hy_work(kv, kd, f):
        """Working blocks: every group its blocks past the keyed ones, a window group none below ``f``."""
        return sum(_cdiv(kv, B) - max(kd, f if w else 0) for w in win)

    def held(i, f):
        """A hybrid request's block keys in release order: groups in order, each tail first (a window group from
        ``f`` on)."""
        keys = keys_of[i]
        return [(keys[j], g) for g in range(NG) for j in reversed(range(f if win[g] else 0, len(keys)))]

    def unpin(rp, k):
        rp.ref[k] -= 1
        if rp.ref[k] == 0:
            rp.stamp[k] = rp.ctr
            rp.ctr += 1

    def window_release(rp: _Replica):
        """A step's start: each running request's window groups free its blocks wholly before ``computed - W + 1``
        (hybrid_pool.window_free_upto), groups in order, highest block first: cached ones to the free queue,
        working ones at once."""
        rp.freed = False
        if not WM:
            return
        for q in rp.running:
            f1 = window_free_upto(W, kv_of(q), B)
            if f1 <= q.f:
                continue
            rp.freed = True
            kd = keyed(q.c, P_of[q.i])
            for g in range(NG):
                if win[g]:
                    for j in reversed(range(q.f, f1)):
                        if j < kd:
                            unpin(rp, (keys_of[q.i][j], g))
                        else:
                            rp.work -= 1
            q.f = f1

    def kv_of(q: _Req):
        # the computed prefill, then every generated token but the last (its KV comes with the next step)
        return q.c if q.c < q.pt else q.c + max(q.d - q.d0 - 1, 0)

    def release(rp: _Replica, q: _Req):
        if hybrid:
            for k in held(q.i, q.f):
                unpin(rp, k)
            return
        keys = keys_of[q.i]
        n = len(keys)
        for j, k in enumerate(keys):
            rp.ref[k] -= 1
            if rp.ref[k] == 0:
                rp.stamp[k] = rp.ctr + n - 1 - j
                rp.rel[k] = rp.clock
        rp.ctr += n

    def expire(rp: _Replica, now):
        """ttl_refresh: free blocks released more than the TTL before ``now`` leave the pool."""
        if policy == "ttl_refresh":
            rp.stored -= {k for k in rp.stored if rp.ref.get(k, 0) == 0 and now - rp.rel[k] > int(ttl_ms) * PS_PER_MS}

    def store(rp: _Replica, new):
        """Newly computed blocks join the pool (a per-block policy takes them deepest first)."""
        rp.stored.update(new)
        if rp.pol is not None:
            for k in reversed(new):
                rp.pol.insert(k)

    def evict(rp: _Replica):
        while len(rp.stored) + rp.work > C:
            cand = [k for k in rp.stored if rp.ref.get(k, 0) == 0]
            assert cand, "nothing evictable"
            if rp.pol is not None:
                k = rp.pol.victim(lambda x: rp.ref.get(x, 0) > 0)
            else:
                k = min(cand, key=lambda x: rp.stamp[x])
            rp.stored.discard(k)
            if cpu_blocks > 0:  # offload on eviction
                if k in rp.cpu:
                    rp.cpu.move_to_end(k)
                else:
                    rp.cpu[k] = True
                    rp.offloaded += 1
                while len(rp.cpu) > cpu_blocks:
                    rp.cpu.popitem(last=False)

    def load_ps(ch):
        return _cdiv(ch * int(block_bytes) * 10**6, int(cpu_mbps)) + int(cpu_latency_ps)

    def new_canonical(rp, q_keys, c_new, P, f=0):
        if hybrid:  # every group's keys, a window group's from f on
            return [(q_keys[j], g) for g in range(NG) for j in range(f if win[g] else 0, keyed(c_new, P))
                    if (q_keys[j], g) not in rp.stored]
        return [k for k in q_keys[:keyed(c_new, P)] if k not in rp.stored]

    def due(rp: _Replica):
        """A request is aborted at the step about to begin: its deadline passed (after its load's landing)."""
        return (any(dl[q.i] <= rp.clock for q in rp.running if not q.done)
                or any(max(dl[w[0]], w[3]) <= rp.clock for w in rp.waiting))

    def abort(rp: _Replica):
        """The client's timeouts at a step boundary: running requests (admission order), then waiting ones (queue
        order, not one whose cpu load is in flight) whose deadline passed release their pins and leave."""
        for q in [q for q in rp.running if dl[q.i] <= rp.clock]:
            release(rp, q)
            rp.work -= work_of(q)
            fin[q.i] = -2
        rp.running = [q for q in rp.running if dl[q.i] > rp.clock]
        keep = deque()
        for w in rp.waiting:
            if dl[w[0]] <= rp.clock and w[3] <= rp.clock:
                if w[3] >= 0:  # its landed load's blocks are pinned
                    release(rp, _Req(w[0], 0, 0, 0, 0, 0))
                fin[w[0]] = -2
            else:
                keep.append(w)
        rp.waiting = keep

    def decode_only(rp: _Replica):
        """The step about to begin only decodes (the events rule of the module docstring, less preemption; no
        request is aborted at it)."""
        n = len(rp.running)
        quiet = not rp.waiting or n >= seqs or n >= int(max_num_batched_tokens)
        return n > 0 and quiet and not any(q.done or q.c < q.pt for q in rp.running) and not due(rp)

    def step(rp: _Replica):
        quiet = decode_only(rp)
        quiet = not engine_step(rp) and quiet
        if not (quiet and rp.in_stretch and not rp.freed):  # a window release at its start: a new event
            rp.events += 1
        rp.in_stretch = quiet

    def engine_step(rp: _Replica):
        """One engine step; returns whether it preempted."""
        expire(rp, rp.clock)
        # 1. release
        for q in [q for q in rp.running if q.done]:
            release(rp, q)
            rp.work -= work_of(q)
        rp.running = [q for q in rp.running if not q.done]
        if TO > 0:
            abort(rp)
        window_release(rp)
        if not rp.has_work():
            rp.publish()
            return False
        # 2. running batch
        budget = int(max_num_batched_tokens)
        plan = []
        used0 = rp.pinned() + rp.work
        cum = 0
        for q in rp.running:
            P = P_of[q.i]
            pref = q.c < q.pt
            want = q.pt - q.c if pref else 1
            tok = max(min(want, budget), 0)
            budget -= tok
            c_new = q.c + tok if pref else q.c
            kv_old = kv_of(q)
            a_old = hy_work(kv_old, keyed(q.c, P), q.f)
            a_new = hy_work(kv_old + tok, keyed(c_new, P), q.f)
            ds = len(new_canonical(rp, keys_of[q.i], c_new, P, q.f))
            delta = ds + a_new - a_old if tok > 0 else 0
            cum += delta
            plan.append((q, tok, pref, c_new, a_new - a_old, cum))
        preempted = False
        while rp.running and any(used0 + p[5] > C for p in plan[:len(rp.running)]):
            L = rp.running.pop()
            plan = plan[:len(rp.running)]
            release(rp, L)
            rp.work -= work_of(L)
            used0 = rp.pinned() + rp.work
            rp.preempt += 1
            preempted = True
            if len(rp.waiting) < queue_slots:
                rp.waiting.appendleft([L.i, L.d, L.npre + 1, -1, 0, 0])
            else:
                rp.dropped += 1
        for q, tok, pref, c_new, dwork, _ in plan:
            q.tok, q.pref = tok, pref and tok > 0
            if tok > 0:
                store(rp, new_canonical(rp, keys_of[q.i], c_new, P_of[q.i], q.f))
                rp.work += dwork
                q.c = c_new
        evict(rp)
        # 3. admissions
        left = int(max_num_batched_tokens) - sum(q.tok for q in rp.running)
        if not preempted:  # async: the requests whose loads landed move to the head of the queue, in order
            landed = [w for w in rp.waiting if 0 <= w[3] <= rp.clock]
            if landed:
                rp.waiting = deque(landed + [w for w in rp.waiting if not 0 <= w[3] <= rp.clock])
        j = 0
        while (not preempted) and j < len(rp.waiting) and len(rp.running) < seqs and left > 0:
            i, dprev, np_, rdy, h, ch = rp.waiting[j]
            if rdy > rp.clock:  # async: its cpu load lands after this step starts
                j += 1
                continue
            keys = keys_of[i]
            P = P_of[i]
            if rdy < 0 and hybrid:  # the coordinator's hit over every group's cached blocks
                bound = max(P - 1, 0) // B
                cached = [np.array([(k, g) in rp.stored for k in keys[:bound]], dtype=bool) for g in range(NG)]
                h, ch = hit_blocks(unified, cached, P), 0
            elif rdy < 0:
                h = 0
                for k in keys:
                    if k not in rp.stored:
                        break
                    h += 1
                h0, h = h, min(h, max(P - 1, 0) // B)
                ch = 0
                if cpu_blocks > 0 and h == h0:  # the cpu tier continues the pool's leading blocks
                    for k in keys[h0:max(P - 1, 0) // B]:
                        if k not in rp.cpu:
                            break
                        ch += 1
                    h += ch
            if rdy < 0 and np_ == 0:  # vLLM's counters: a lookup (per_attempt counts every one)
                vc["attempt"][0] += P
                vc["attempt"][1] += (h - ch) * B
            start = overlap == "async" and rdy < 0 and ch > 0  # allocate the hit, load, schedule when it lands
            pt = P + dprev
            c0 = h * B
            if np_ == 0 and imp_of[i] > 0:  # imported KV: all but the last prompt token computed at admission
                c0 = max(c0, min(imp_of[i], max(P - 1, 0)))
            tk = 0 if start else min(pt - c0, left)
            c1 = c0 + tk
            s0 = window_free_upto(W, c0, B) if WM else 0  # a window group holds the blocks from s0 on
            a1 = hy_work(c1, keyed(c1, P), s0)
            pins = held(i, s0) if hybrid else keys
            dpin = sum(1 for k in set(pins) if k in rp.stored and rp.ref.get(k, 0) == 0)
            dsum = len(new_canonical(rp, keys, c1, P, s0))
            if rp.pinned() + rp.work + dpin + dsum + a1 > C:
                in_flight = any(w[3] > rp.clock for w in rp.waiting)
                if not rp.running and not in_flight:  # never schedulable
                    del rp.waiting[j]
                    if rdy >= 0:
                        release(rp, _Req(i, 0, 0, 0, 0, 0))
                    rp.rejected += 1
                    continue
                break
            if rdy < 0:
                if np_ == 0:  # admitted: counted once (per_admission), the connector's (the cpu tier's) always here
                    vc["admission"][0] += P
                    vc["admission"][1] += (h - ch) * B
                    if cpu_blocks > 0:
                        vc["external"][0] += P - (h - ch) * B
                        vc["external"][1] += ch * B
                for k in pins:
                    rp.ref[k] = rp.ref.get(k, 0) + 1
                if rp.pol is not None:  # the cached blocks the request reuses are the policy's hits
                    for k in reversed(keys):
                        if k in rp.stored:
                            rp.pol.hit(k)
                for k in reversed(keys[h - ch:h]):  # cpu hits: read (touched), loaded
                    rp.cpu.move_to_end(k)
                if ch and not start:  # sync: before the step's forward pass
                    rp.load += load_ps(ch)
            store(rp, new_canonical(rp, keys, c1, P, s0))
            rp.work += a1
            evict(rp)
            if start:  # async: on the replica's one link after the loads before it
                rp.link = max(rp.link, rp.clock) + load_ps(ch)
                rp.waiting[j] = [i, dprev, np_, rp.link, h, ch]
                j += 1
                continue
            del rp.waiting[j]
            q = _Req(i, c1, pt, dprev, h, np_, ch, s0)
            q.tok, q.pref = tk, True
            rp.running.append(q)
            left -= tk
        # 4. the step
        sched = [q for q in rp.running if q.tok > 0]
        if not sched:
            rp.publish()
            return preempted
        ptok = sum(q.tok for q in sched if q.pref)
        dtok = sum(1 for q in sched if not q.pref)
        ctx = sum(P_of[q.i] + q.d for q in sched if not q.pref)  # a decoding request reads its whole KV
        pairs = sum(q.tok * (q.c - q.tok) + q.tok * (q.tok + 1) // 2 for q in sched if q.pref)
        dt = step_time_ps(base_ns=int(step_base_ns), prefill_ns=int(step_prefill_ns), decode_ns=int(step_decode_ns),
                          ctx_ps=int(step_ctx_ps), prefill_ctx_fs=int(step_prefill_ctx_fs), prefill_tokens=ptok,
                          decode_reqs=dtok, ctx_tokens=ctx, pairs=pairs)
        dt += rp.load
        rp.load = 0
        rp.clock += dt
        rp.steps += 1
        rp.busy += dt
        rp.kv_max = max(rp.kv_max, rp.pinned() + rp.work)
        rp.publish()
        for q in sched:
            complete = q.pref and q.c >= q.pt
            if complete or not q.pref:
                if complete and q.d == 0:
                    ttft[q.i] = rp.clock
                q.d += 1
                if q.d >= max(O_of[q.i], 1):
                    q.done = True
                    fin[q.i] = rp.clock
                    hit[q.i] = q.hit
                    cpu_hit[q.i] = q.ch
                    npre_out[q.i] = q.npre
            q.tok = 0
        # the pool's books: working blocks are the running requests' own; blocks held fit the pool
        assert rp.work == sum(work_of(q) for q in rp.running), (rp.work, [work_of(q) for q in rp.running])
        assert len(rp.stored) + rp.work <= C
        return preempted

    def wake(rp: _Replica):
        """A replica idle on cpu loads: its next step, at the first landing after its clock or the first deadline
        after it of a waiting request with no load in flight (None: none)."""
        return min((w[3] if w[3] > rp.clock else dl[w[0]] for w in rp.waiting
                    if w[3] > rp.clock or rp.clock < dl[w[0]] < float("inf")), default=None)

    def advance(now_t):
        for rp in reps:  # a decode-only stretch ends where the run-up ends
            rp.in_stretch = False
        idle = set()
        progress = True
        while progress:
            progress = False
            for x, rp in enumerate(reps):
                if x not in idle and (rp.has_work() or any(q.done for q in rp.running)) and rp.clock <= now_t:
                    s0, p0 = rp.steps, rp.preempt
                    step(rp)
                    progress = True
                    if rp.steps == s0 and rp.preempt == p0 and not rp.running and any(w[3] >= 0 for w in rp.waiting):
                        # async: nothing to run, nothing preempted, loads in flight: the next step starts when the
                        # first lands, or at the next event if that comes first
                        # (or at the first deadline of a waiting request with no load in flight)
                        t = wake(rp)
                        assert t is not None, "waiting on no load"
                        if t <= now_t:
                            rp.clock = t
                        else:
                            rp.clock = max(rp.clock, now_t)
                            idle.add(x)

    def scrape_at(t_ms, u):
        """The load scrape at the last multiple of load_refresh_ms by ``t_ms``, when it is new."""
        nonlocal scrape_t, scrape_q, scrape_kv
        if load_refresh_ms <= 0:
            return
        tick = (t_ms // int(load_refresh_ms)) * int(load_refresh_ms)
        if tick > scrape_t:
            advance(tick * PS_PER_MS)
            scrape_q = [sum(1 for w in rp.waiting if (not local_load or w[0] % n_inst == u)) for rp in reps]
            scrape_kv = [rp.pinned() + rp.work for rp in reps]
            if load_gauges:  # vLLM's gauges as of the tick (pod-wide)
                scrape_q = [rp.gauges_at(tick * PS_PER_MS)[0] for rp in reps]
                scrape_kv = [rp.gauges_at(tick * PS_PER_MS)[1] for rp in reps]
            scrape_t = tick

    def run_to(x, u):
        scrape_at(x // PS_PER_MS, u)
        advance(x)

    holders, last_send = [], [0]  # the client's permits: the requests holding one, the last send (ps)

    def client_send(i, arr_t, u):
        """inference-perf's permits: a permit in send order, at the arrival (or the previous send) when fewer than
        client_permits earlier requests hold one, else at the first whole ms at or after the next finish."""
        t = max(arr_t, last_send[0])
        run_to(t, u)
        while True:
            holders[:] = [h for h in holders if not (0 <= fin[h] <= t or dl[h] <= t)]  # a finish, a timeout
            if len(holders) < int(client_permits):
                break
            known = [fin[h] for h in holders if fin[h] >= 0] + [dl[h] for h in holders if dl[h] < float("inf")]
            # each busy replica's next step: its clock, or, idle on cpu loads (it waits at t), its next wake
            busy = [rp.clock if rp.clock > t else wake(rp) for rp in reps if rp.has_work()]
            busy = [x for x in busy if x is not None]
            if known and (not busy or min(known) <= min(busy)):  # settled: no step left to run ends before it
                t = _cdiv(min(known), PS_PER_MS) * PS_PER_MS
            elif not busy:  # nothing will finish: the holders were never served
                holders.clear()
                break
            else:
                t = max(t, min(busy))
            run_to(t, u)
        holders.append(i)
        last_send[0] = t
        return t

    sent = [int(a) for a in workload.arrival_ms]  # the sends (ms): the arrivals in an open loop
    last_sync, snapshot = None, None
    del kv_pressure  # the pool pins the blocks of running requests always (what kv_pressure asks of fcfs)
    for i in range(N):
        u = i % n_inst
        if client_permits > 0:
            sent[i] = client_send(i, sent[i] * PS_PER_MS, u) // PS_PER_MS
        now = sent[i]
        now_t = now * PS_PER_MS
        if TO > 0:
            dl[i] = now_t + TO * PS_PER_MS
        scrape_at(now, u)
        advance(now_t)
        for rp in reps:
            expire(rp, now_t)
        keys = keys_of[i]
        n = len(keys)
        precise = []
        for rp in reps:
            h = 0
            for k in keys:
                if vk(k) not in rp.stored:
                    break
                h += 1
            precise.append(h)
        # the stale view: every replica's cached blocks as of the last sync (the first request, then when
        # stale_lag_ms passed), taken after the replicas ran up to the arrival
        if view == "stale" and (last_sync is None or now - last_sync >= int(stale_lag_ms)):
            snapshot = [set(rp.stored) for rp in reps]
            last_sync = now
        if view == "stale":
            match = []
            for r in range(R):
                h = 0
                for k in keys:
                    if vk(k) not in snapshot[r]:
                        break
                    h += 1
                match.append(h)
        elif view == "gie_estimate":
            gm = gix.match_longest_prefix(gie_of[i])
            match = [gm.get(r, 0) for r in range(R)]
        elif view == "approximate":
            match = []
            for r in range(R):
                h = 0
                for k in keys:
                    if k not in index[u][r]:
                        break
                    h += 1
                match.append(h)
        else:
            match = precise
        # vLLM's num_requests_waiting (llm-d's queue scorer); with local_load only instance u's requests count
        mine = (lambda j: j % n_inst == u) if local_load else (lambda j: True)
        queue = [sum(1 for w in rp.waiting if mine(w[0])) for rp in reps]
        active = [sum(len(keys_of[q.i]) for q in rp.running if mine(q.i))
                  + sum(len(keys_of[w[0]]) for w in rp.waiting if mine(w[0])) for rp in reps]
        tree = [len(rp.stored) for rp in reps]
        pk = keys[min(int(prefix_blocks), n) - 1] if n > 0 else 0
        kv_used = [rp.pinned() + rp.work for rp in reps]
        if load_gauges:  # vLLM's gauges read live: as of this arrival
            queue = [rp.gauges_at(now_t)[0] for rp in reps]
            kv_used = [rp.gauges_at(now_t)[1] for rp in reps]
        if load_refresh_ms > 0:
            queue, kv_used = scrape_q, scrape_kv
        # llm-d's active-request tracker: +1 when routed, -1 when the last token is sent (a request that finished
        # at or before now was released), or at the first cleanup tick (every T from 0) after its TTL T ran out
        T = int(knobs["gie_active_timeout_ms"])
        tracked = [sum(1 for j in [w[0] for w in rp.waiting] + [q.i for q in rp.running]
                       if T == 0 or not any(sent[j] + T < k * T for k in range(1, now // T + 1)))
                   for rp in reps]
        cm = cix.match_longest_prefix(gie_of[i]) if cix is not None else {}
        if view == "precise" and knobs["gie_cpu_tier_w_pct"] > 0 and cpu_blocks > 0:
            match = [_tier_lead(keys, rp, knobs["gie_cpu_tier_w_pct"] / 100) for rp in reps]
        r = route(i=i, n=n, prefix_key=pk, bits=bits_l[i], R=R, match=match, queue=queue,
                  active_blocks=active, tree_size=tree, ring=ring, kn=knobs, kv_used=kv_used, capacity=C,
                  match_total=len(gie_of[i]) if view == "gie_estimate" else None, active_req=tracked,
                  match_cpu=None if cix is None else [cm.get(x, 0) for x in range(R)])
        rep_of[i] = r
        if view == "gie_estimate":
            gix.add(gie_of[i], r)
        if cix is not None:
            cix.add(gie_of[i], r)
        idx = index[u][r]
        for k in reversed(keys):
            idx[k] = True
            idx.move_to_end(k)
        while len(idx) > int(index_capacity):
            idx.popitem(last=False)
        rp = reps[r]
        if not rp.has_work() and not any(q.done for q in rp.running):
            rp.clock = max(rp.clock, now_t)
        if len(rp.waiting) < queue_slots:
            rp.waiting.append([i, 0, 0, -1, 0, 0])
        else:
            rp.dropped += 1
    advance(float("inf"))
    # the client's outcome: 0 ok, 1 timed out (aborted, or its last token after the deadline), 2 never served
    status = [1 if f == -2 or (f >= 0 and f > d) else (0 if f >= 0 else 2) for f, d in zip(fin, dl)]
    arr_t = [int(a) * PS_PER_MS for a in sent]  # latency from the send
    ttft_ms = [(_cdiv(t - a, PS_PER_MS) if f >= 0 else -1) for t, f, a in zip(ttft, fin, arr_t)]
    e2e_ms = [(_cdiv(f - a, PS_PER_MS) if f >= 0 else -1) for f, a in zip(fin, arr_t)]
    # TPOT per request in whole ns (floored), as the engine's metric
    tpot_ns = [((f - t) // (1000 * (o - 1)) if f >= 0 and o >= 2 else -1) for t, f, o in zip(ttft, fin, O_of)]
    return dict(
        ttft_ms=np.asarray(ttft_ms, np.int64), e2e_ms=np.asarray(e2e_ms, np.int64), hit_blocks=np.asarray(hit),
        preempted=np.asarray(npre_out), replica=np.asarray(rep_of),
        client_wait_ms=np.asarray(sent, np.int64) - np.asarray(workload.arrival_ms, np.int64),
        ttft_ps=ttft, fin_ps=fin, tpot_ns=tpot_ns,
        preemptions=sum(rp.preempt for rp in reps), steps=sum(rp.steps for rp in reps),
        events=sum(rp.events for rp in reps),
        dropped=sum(rp.dropped + rp.rejected for rp in reps), busy_ps=[rp.busy for rp in reps],
        kv_max=[rp.kv_max for rp in reps], cached=[len(rp.stored) for rp in reps],
        cpu_hit_blocks=np.asarray(cpu_hit), offloaded=sum(rp.offloaded for rp in reps),
        vllm_counters={m: vc[m if m == "attempt" else "admission"] + vc["external"] for m in ("attempt", "admission")},
        status=np.asarray(status), requests_ok=status.count(0), requests_timed_out=status.count(1),
        requests_failed=status.count(2),
    )

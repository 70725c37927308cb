"""The numba CPU backend of the vllm replica: :mod:`cacheresearch.replica.vllm`'s algorithm as compiled loops.

The JAX replica (:mod:`cacheresearch.replica.vllm`, :mod:`cacheresearch.replica.pool`) runs on any device,
vmapped over configurations; on a CPU its while loops pay XLA's fixed cost per iteration and a vmapped
batch steps in lockstep. This backend runs the same algorithm per event, configurations in parallel
threads (``prange``), for the configurations :func:`coverage` accepts:

* the same steps: release, the running batch in admission order with preemption by recompute, FCFS
  admission under ``max_num_seqs``, the token budget and the pool, the step-time model in exact integer
  picoseconds (:func:`cacheresearch.replica.vllm.step_time`; int64 here: 106 days, the JAX clock's
  24.8-day span is reported the same way, ``time_overflow``);
* the same decode-only stretches in closed form (:func:`cacheresearch.replica.vllm._decode_stretch`'s
  rule: the largest ``n`` whose steps start by the next arrival, finish nothing before the last and
  fit the pool), so the engine-step count, the clock and the float32 gauges follow the same events;
* the pool's eviction as a lazy pointer over its free queue: a run's free-queue stamps are a range of
  the release counter disjoint from every other run's, so lowest-stamp-first is the order the runs
  were released in (tail first within a request); the pointer skips entries whose run was pinned
  again, restamped or emptied (amortised O(1) per evicted run, where the JAX pool scans all runs);
* the pool's free-block order as ``lru`` / ``unbounded`` (vLLM's free queue), ``ttl_refresh`` or any registered
  per-block policy whose kernel has a pool's rules (:func:`cacheresearch.cache.kernels.dispatch.pool_refusal`;
  the JAX pool keeps vLLM's LRU only): ``ttl_refresh`` is that free queue with free runs released more than the
  TTL before a step or an arrival leaving the pool (their release times grow along the queue, so they lead
  it); a per-block policy (``fifo``, ``sieve``, ``s3fifo``, ``lfu``: libCacheSim's rules, its one kernel file in
  :mod:`cacheresearch.cache.kernels` through the dispatch generated from the registry) runs on the stream
  with every block a run of its own (:func:`_block_log`), every cached block in the policy's lists: a
  computed block enters them (``admit``), an admitted request's cached blocks are its hits (``touch``), and
  the eviction's ``victim`` is never pinned (fifo moves a pinned block to the head, sieve's hand passes it,
  s3fifo moves it to / keeps it in main, lfu takes the least frequent, least recent unpinned block);
  ``tests/reference_vllm.py`` states the rules and ``tests/test_vllm_policies.py`` checks them;
* a cpu tier per replica (:mod:`cacheresearch.tiers.vllm`, ``pc[PC_CPU] > 0``, per-block mode behind the lru pool):
  an LRU list over block ids in the per-block policies' links, fed by the pool's evictions (:func:`_cpu_put`),
  read at admission after the pool's leading hit (:func:`_cpu_lead`), its loads added to the admitting step's
  time (``LOADP``); ``tests/test_tiers_vllm.py`` checks it against ``tests/reference_batch.py``;
* every router with a numba rule (its file in :mod:`cacheresearch.routers`, through the dispatch generated
  from the router registry, :mod:`cacheresearch.routers.dispatch`) on the ``precise``, ``approximate`` (the
  router's own leaf-first index per instance and replica, the store's lazy pointer), ``stale`` and
  ``gie_estimate`` views,
  ``local_load``, the load scrape every ``load_refresh_ms`` (:func:`_scrape`) and vLLM's published gauges
  (``load_gauges``: each step publishes its waiting count and KV blocks in use at its end, :func:`_publish`);
* ``gie`` (:mod:`cacheresearch.routers.gie`): GIE's queue, kv-cache, prefix (estimate / precise) and
  load-aware scores in the same 1/65536 integers, the max-score picker's tie rule on the same random word;
  on the ``gie_estimate`` view GIE's own prefix index (:mod:`cacheresearch.routers.gie_index`) as a
  per-pod log of (hash, stamp) entries in stamp order: its lowest-stamped present entries are its first
  valid log entries, so the LRU's eviction is a lazy pointer too (amortised O(1) per hash); with
  ``gie_cpu_w_pct > 0`` a second such index (llm-d's CPU-tier producer, ``gie_cpu_lru_capacity``), its count
  handed to the rule above the GPU view's (``m = gpu + cpu x 2**32``).

* vLLM's hybrid KV cache manager (``kv_groups``, ``kv_window_groups``, ``kv_window``; per-block mode, lru pool, no
  cpu tier): full-attention and sliding-window groups of one pool, block ``j`` of a request one id per group
  (:func:`_hy_key`), the hit :func:`_hy_hit` (``hybrid_pool.hit_blocks``), a window group's blocks freed at each
  step's start (:func:`_hy_window`), release per group tail first (:func:`_hy_release`); ``tests/test_hybrid_vllm.py``
  checks it against ``tests/reference_batch.py`` (docs/fleet_semantics.md, "A hybrid KV layout");

* imported KV (``run_stream(..., imported=)``, a P/D decode pool: :mod:`cacheresearch.fleet.disagg`): a request's
  first admission counts ``min(imported, input - 1)`` prompt tokens as computed, so only the rest is prefilled
  (the JAX replica does not model it; ``tests/reference_batch.py`` states the same rule).

The metrics are the JAX replica's, field by field (:func:`run_stream` builds the same unfinalized
:class:`~cacheresearch.metrics.core.Metrics`); the float32 KV and queue integrals are accumulated in the
same order by the same float32 operations. ``tests/test_numba_vllm.py`` checks every request's TTFT,
end time, hit, preemptions and the step and event counts against ``tests/reference_batch.py`` and the JAX
replica.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit, prange

from cacheresearch.backends.capabilities import pool_policies, pool_refusal
from cacheresearch.cache.kernels import dispatch
from cacheresearch.cache.policies import POLICIES
from cacheresearch.core.stream import Stream
from cacheresearch.metrics.core import LIMB, Metrics
from cacheresearch.routers import VIEWS, ring_positions
from cacheresearch.routers import dispatch as rdispatch

__all__ = ["coverage", "run_stream", "state_bytes", "pool_policies", "pool_refusal"]

PS_MS = 10**9
MS_LIM = 2**31 - 1
T_BIG = 2**62  # above every clock
T_LIM = MS_LIM * PS_MS  # the JAX clock's span (Time saturates at MS_LIM ms): time_overflow past it
BIG = 2**31 - 1
D = None  # the dispatch on a per-block policy code (cacheresearch.cache.kernels.dispatch)
RD = None  # the dispatch on a router code (cacheresearch.routers.dispatch.bind binds both)

# per-replica integer state, columns of rs [R, NRS]
(CTR, CACHED, PINNED, WORK, NRUN, WHEAD, WCOUNT, CLOCK, LREQ, LBLK, STEPS, BUSY, KVMAX, PREEMPT, DROPPED, REJECTED,
 STUCK, TOVER, FPTR, FCNT, EVENTS, PUBW, PUBKV, PENT, PENW, PENKV, LOADP, OFFL, NLOAD, LINK,
 VQA, VHA, VQM, VHM, VQE, VHE) = range(36)
# LOADP: the cpu tier's loads of the requests admitted in the step being built (ps, sync); OFFL: blocks offloaded;
# NLOAD: waiting requests whose blocks are allocated for a cpu load (async); LINK: when the replica's link is free;
# vLLM's prefix-cache counters (tokens, requests never preempted; _count): VQA / VHA queries and local hits at every
# lookup (per_attempt), VQM / VHM at admissions only (per_admission), VQE / VHE the connector's (the cpu tier's)
NRS = 36
# running slots, columns of sl [R, S, NSL] (SCPU: the admission's cpu-hit blocks)
# SWF: a hybrid layout's window groups have freed the request's blocks below this one (window_free_upto)
SREQ, SC, SPT, SD, SD0, SHIT, SNPRE, STOK, SPREF, SDONE, SCPU, SWF = range(12)
NSL = 12
#: a request's cpu-hit blocks leave the kernel packed above its hit blocks: hitb = hit + cpu hit x CPU_SHIFT
CPU_SHIFT = 2**32
# the stream, columns of rq [N, NRQ] (per request); QIMP: prompt tokens whose KV arrives with the request (a P/D
# decode pool, cacheresearch/fleet/disagg.py): computed at its first admission, at most input - 1; QDL: the client's
# deadline (ps; T_BIG: none; client_timeout_ms: set at the send in a private copy)
QARR, QNB, QIN, QOUT, QOFF, QNR, QE0, QIMP, QDL = range(9)
NRQ = 9
# a configuration, columns of pi [G, NPI]
(CAP, SEQS, BUDGET, BASE, PRE_NS, DEC_NS, CTX_PS, PCTX_FS, NREP, NINST, ROUTER, VIEW, LAG, LOCAL, ICAP, PB, VNODES,
 CHWBL_C, CT_PM, BAL_ABS, BAL_REL, MISS_TREE, OVL_W, PW, LW, QT, PR_REL, PR_ABS, WARM, REFRESH, G_MODE, G_WP, G_WK,
 G_WQ, G_WIN, G_WL, G_THR, G_LRU, GAUGE, G_WA, G_TTL, PERMITS, TOUT, G_CW, G_CLRU, G_CTW) = range(46)
NPI = 46
_PI_FIELDS = ("capacity", "max_num_seqs", "max_num_batched_tokens", "step_base_ns", "step_prefill_ns", "step_decode_ns",
              "step_ctx_ps", "step_prefill_ctx_fs", "replicas", "instances", "router", "view", "stale_lag_ms",
              "local_load", "index_capacity", "prefix_blocks", "vnodes", "chwbl_c_pct", "cache_threshold_pm",
              "balance_abs", "balance_rel_pct", "miss_smallest_tree", "overlap_weight_pct", "prefix_weight_pct",
              "load_weight_pct", "queue_threshold", "preble_rel_pct", "preble_abs", "warmup_ms", "load_refresh_ms",
              "gie_prefix_mode", "gie_prefix_w_pct", "gie_kv_w_pct", "gie_queue_w_pct", "gie_window_blocks",
              "gie_load_w_pct", "gie_load_threshold", "gie_lru_capacity", "load_gauges", "gie_active_w_pct",
              "gie_active_timeout_ms", "client_permits", "client_timeout_ms", "gie_cpu_w_pct", "gie_cpu_lru_capacity",
              "gie_cpu_tier_w_pct")


def coverage(params: list, st) -> list[str]:
    """What this backend does not model among configurations ``params`` under the static options ``st``
    (empty: covered). The static bounds are :func:`cacheresearch.core.simulate.check_bounds`'s."""
    out = []
    if st.scheduler != "vllm":
        out.append(f"the {st.scheduler} replica (this is the vllm replica's backend)")
    pol_names = {v.id: k for k, v in POLICIES.items()}
    for pol in sorted({pol_names[int(p.policy)] for p in params} - set(pool_policies())):
        out.append(f"policy {pol!r} on the vllm pool ({pool_refusal(pol)})")
    rnames = rdispatch.names()
    out += rdispatch.refusals(rnames[int(p.router)] for p in params)
    out += sorted({w for p in params for w in rdispatch.config_refusals(rnames[int(p.router)], p)})
    if any(int(p.restart_replica) >= 0 for p in params):
        out.append("a replica restart (restart_replica)")
    if st.priority or st.s3:
        out.append("priority or s3fifo fields")
    return out


def state_bytes(stream: Stream, st) -> int:
    """The per-configuration state of one call's thread (pool, free queue, index rows, stale copy, slots; with
    the client's permits a private copy of the request table and the permit holders: counted always)."""
    K = int(np.asarray(stream.run_len).shape[0])
    E = int(np.asarray(stream.log).shape[-2])
    if st.blocks:  # a per-block policy: every block a run of its own, with its policy's links and counts
        K = max(int(stream.n_distinct), K)
        E = int(np.asarray(stream.n_blocks).astype(np.int64).sum()) + 1
    pool = st.max_replicas * K * (NB + 2) * 4  # the per-block rows (ttl_refresh's release times; the cpu tier's list)
    R = st.max_replicas
    rows = st.max_instances * R if st.index else 0
    G = int(stream.n_gie) if stream.gie_hash is not None else 0  # GIE's index (view gie_estimate), at most, and
    gie = 2 * R * (G * 9 + 2 * (G + int(stream.gie_width)) * 16) if G else 0  # the CPU-tier scorer's (gie_cpu_w_pct)
    return (R * K * (3 + 4 + (1 if st.stale else 0)) * 4 + rows * (K + 3 * E) * 8
            + R * (st.max_running * NSL + st.queue_slots * NWQ) * 8 + gie + (int(stream.n_requests) + 1) * (NRQ + 1) * 8
            + pool)


# ------------------------------------------------------------------------------ pool
# the pool's policy (pc [NPC] per configuration): mode, TTL (ps), s3fifo's small and ghost sizes, promotion hits;
# the cpu tier (cacheresearch/tiers/vllm.py): capacity in blocks (0: absent), read bandwidth (MB/s), latency per
# load (ps), bytes per block
# a hybrid KV layout (kv_groups, kv_window_groups, kv_window; per-block mode): groups, the window groups' bit mask,
# the window (tokens), the block id space of one group (the id of block j in a group: its id + the group's slot x PC_KU)
(PC_MODE, PC_TTL, PC_SMALL, PC_GHOST, PC_PROMOTE, PC_CPU, PC_MBPS, PC_LAT, PC_BB, PC_ASYNC, PC_CODE, PC_LB, PC_NG,
 PC_WM, PC_W, PC_KU) = range(16)
NPC = 16  # PC_CODE: the per-block policy's dispatch code; PC_LB: its frequency buckets (0: none)
# the waiting ring, columns of wq [R, Q, NWQ]: request, tokens generated before a preemption, preemptions; a cpu
# load in flight (async): when it lands (ps; -1: none), the hit blocks allocated and their cpu part
NWQ = 6
M_LRU, M_TTL, M_BLOCK = range(3)  # vLLM's free queue, its TTL variant, a per-block policy (PC_CODE)
#: run-store policy name -> the pool's mode (lru and unbounded: vLLM's free queue; unbounded never evicts)
POLICY_MODES = {"lru": M_LRU, "unbounded": M_LRU, "ttl_refresh": M_TTL}
# per block (a run of one block in block mode) [R, 4 or 6, K], int32: the kernel row's links, list, per-block
# extra (cacheresearch.cache.kernels); ttl_refresh's release time (ps, int64) split in two rows (high, low 31 bits),
# allocated in that mode only (int32 rows and no K-long bucket rows: the pool of a stream of unique blocks took
# 64 bytes a block and replica, now 16)
B_OLD, B_NEW, B_WHERE, B_FREQ, B_TIME_HI, B_TIME_LO = range(6)
NB = 4
# per replica [R, NPQ + 3 x buckets]: a per-block policy's scalars (NS), then its float scalar (as float64 bits),
# then the frequency buckets' heads, tails and counts (lfu); the cpu tier (lru pool) uses list 1 as (head = newest,
# tail = oldest, count) at 0-2
NS = 16
NPQ = NS + 1


@njit(cache=True)
def _lpush(r, q, k, pbl, pq):
    """Block ``k`` at the head (newest end) of list ``q``."""
    hq = 3 * (q - 1)
    head = pq[r, hq]
    pbl[r, B_OLD, k] = head
    pbl[r, B_NEW, k] = -1
    if head >= 0:
        pbl[r, B_NEW, head] = k
    else:
        pq[r, hq + 1] = k
    pq[r, hq] = k
    pq[r, hq + 2] += 1
    pbl[r, B_WHERE, k] = q


@njit(cache=True)
def _lunlink(r, k, pbl, pq):
    """Block ``k`` out of its list."""
    hq = 3 * (pbl[r, B_WHERE, k] - 1)
    o, n = pbl[r, B_OLD, k], pbl[r, B_NEW, k]
    if n >= 0:
        pbl[r, B_OLD, n] = o
    else:
        pq[r, hq] = o
    if o >= 0:
        pbl[r, B_NEW, o] = n
    else:
        pq[r, hq + 1] = n
    pq[r, hq + 2] -= 1
    pbl[r, B_WHERE, k] = 0


@njit(cache=True, inline="always")
def _hd(pq, r):
    """Replica ``r``'s frequency buckets' heads (a view of its row of ``pq``)."""
    lb = (pq.shape[1] - NPQ) // 3
    return pq[r, NPQ:NPQ + lb]


@njit(cache=True, inline="always")
def _tl(pq, r):
    lb = (pq.shape[1] - NPQ) // 3
    return pq[r, NPQ + lb:NPQ + 2 * lb]


@njit(cache=True, inline="always")
def _ct(pq, r):
    lb = (pq.shape[1] - NPQ) // 3
    return pq[r, NPQ + 2 * lb:NPQ + 3 * lb]


@njit(cache=True)
def _admit_block(r, k, pbl, pq, pc):
    """A computed block enters the pool's per-block policy (its kernel's ``admit``)."""
    D.admit(pc[PC_CODE], pbl[r, B_OLD], pbl[r, B_NEW], pbl[r, B_WHERE], pbl[r, B_FREQ], pq[r, :NS],
            pq[r, NS:NPQ].view(np.float64), _hd(pq, r), _tl(pq, r), _ct(pq, r), k, 0, pc[PC_SMALL], pc[PC_GHOST],
            pc[PC_PROMOTE])


@njit(cache=True)
def _hit_block(r, k, pbl, pq, pc):
    """A cached block reused by an admitted request (its kernel's ``touch``)."""
    D.touch(pc[PC_CODE], pbl[r, B_OLD], pbl[r, B_NEW], pbl[r, B_WHERE], pbl[r, B_FREQ], pq[r, :NS],
            pq[r, NS:NPQ].view(np.float64), _hd(pq, r), _tl(pq, r), _ct(pq, r), k)


@njit(cache=True)
def _victim(r, cap, pref, pbl, pq, pc):
    """The per-block policy's next victim, never pinned, unlinked (the caller checked that an unpinned cached
    block exists): its kernel's ``victim``."""
    return D.victim(pc[PC_CODE], pbl[r, B_OLD], pbl[r, B_NEW], pbl[r, B_WHERE], pbl[r, B_FREQ], pq[r, :NS],
                    pq[r, NS:NPQ].view(np.float64), _hd(pq, r), _tl(pq, r), _ct(pq, r), cap, pc[PC_SMALL],
                    pc[PC_GHOST], pc[PC_PROMOTE], pref[r])


@njit(cache=True)
def _cdiv(a, b):
    return (a + b - 1) // b


# ------------------------------------------------------------------------------ the cpu tier (per-block mode, lru pool)
# A replica's cpu tier is an LRU list over block ids in the per-block policies' links (list 1 of pbl / pq: head the
# most recent, B_WHERE != 0 held); the vLLM pool's lru keeps no per-block state there, so the rows are free.
@njit(cache=True)
def _cpu_put(r, k, rs, pbl, pq, pc):
    """Block ``k``, evicted from the GPU pool, goes to the cpu tier as its most recent (a copy already held
    is refreshed, not written again); the tier drops its least recent block beyond its capacity."""
    if pbl[r, B_WHERE, k] != 0:
        _lunlink(r, k, pbl, pq)
    else:
        rs[r, OFFL] += 1
    _lpush(r, 1, k, pbl, pq)
    if pq[r, 2] > pc[PC_CPU]:
        _lunlink(r, pq[r, 1], pbl, pq)


@njit(cache=True)
def _cpu_lead(r, log0, e0, p, g, lim, pbl):
    """The blocks the cpu tier holds from position ``g`` on, leading, up to position ``lim`` (per-block log)."""
    q = g
    while q < min(p, lim) and pbl[r, B_WHERE, log0[e0 + q, 0]] != 0:
        q += 1
    return q - g


@njit(cache=True)
def _cpu_load_ps(nblk, pc):
    """Loading ``nblk`` blocks from the cpu tier: ceil(bytes x 1e6 / MB/s) ps + the latency (0 for none)."""
    if nblk <= 0:
        return 0
    return _cdiv(nblk * pc[PC_BB] * 1_000_000, pc[PC_MBPS]) + pc[PC_LAT]


@njit(cache=True)
def _keyed(c, P, bt):
    return min(c // bt, P // bt)


@njit(cache=True)
def _kv(c, pt, d, d0):
    return c if c < pt else c + max(d - d0 - 1, 0)


@njit(cache=True)
def _lead(srow, log0, e0, p):
    """Leading stored blocks of a request on one pool row (replica.pool.leading_hit)."""
    hit = 0
    for q in range(p):
        sg = srow[log0[e0 + q, 0]]
        hit += sg
        if sg < log0[e0 + q, 1]:
            break
    return hit


@njit(cache=True)
def _valid(r, j, ps, pref, pst, frun, fst, pbl, pq, pc):
    run = frun[r, j]
    return pref[r, run] == 0 and ps[r, run] > 0 and pst[r, run] == fst[r, j]


@njit(cache=True)
def _push(r, run, stamp, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Append a run to the free queue (stamps arrive in increasing order); compact when full."""
    L = frun.shape[1]
    if rs[r, FCNT] == L:
        k = 0
        for j in range(rs[r, FPTR], rs[r, FCNT]):
            if _valid(r, j, ps, pref, pst, frun, fst, pbl, pq, pc):
                frun[r, k] = frun[r, j]
                fst[r, k] = fst[r, j]
                k += 1
        rs[r, FPTR] = 0
        rs[r, FCNT] = k
    c = rs[r, FCNT]
    frun[r, c] = run
    fst[r, c] = stamp
    rs[r, FCNT] = c + 1


@njit(cache=True)
def _release(r, h, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Release request ``h``'s pins (replica.pool.release): runs whose last pin goes get free-queue stamps
    ``ctr + n - j0 - m`` (tail first) and enter the free queue in that order (their release time kept for
    ``ttl_refresh``); a per-block policy keeps its own order (:func:`_victim`), so nothing is queued."""
    n, p, e0, off = rq[h, QNB], rq[h, QNR], rq[h, QE0], rq[h, QOFF]
    ctr = rs[r, CTR]
    for q in range(p - 1, -1, -1):
        run, m, j0 = log0[e0 + q, 0], log0[e0 + q, 1], log0[e0 + q, 2] - off
        pref[r, run] -= 1
        if pref[r, run] == 0:
            stamp = ctr + n - j0 - m
            pst[r, run] = stamp
            rs[r, PINNED] -= ps[r, run]
            if pc[PC_MODE] == M_TTL:
                pbl[r, B_TIME_HI, run] = rs[r, CLOCK] >> 31
                pbl[r, B_TIME_LO, run] = rs[r, CLOCK] & 0x7FFFFFFF
            if ps[r, run] > 0 and pc[PC_MODE] != M_BLOCK:
                _push(r, run, stamp, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    rs[r, CTR] = ctr + n


@njit(cache=True)
def _expire(r, now, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """``ttl_refresh``: free runs released more than the TTL before ``now`` (ps) leave the pool. Release times
    grow along the free queue (stamps are handed out in time order), so they are its first valid entries."""
    if pc[PC_MODE] != M_TTL:
        return
    while rs[r, FPTR] < rs[r, FCNT]:
        j = rs[r, FPTR]
        if _valid(r, j, ps, pref, pst, frun, fst, pbl, pq, pc):
            run = frun[r, j]
            if now - ((np.int64(pbl[r, B_TIME_HI, run]) << 31) | np.int64(pbl[r, B_TIME_LO, run])) <= pc[PC_TTL]:
                return
            rs[r, CACHED] -= ps[r, run]
            ps[r, run] = 0
        rs[r, FPTR] = j + 1


@njit(cache=True)
def _evict(r, cap, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Evict unpinned cached blocks until ``cached + work <= cap``: lowest free-queue stamp first (vLLM's
    LRU), or a per-block policy's victims (:func:`_victim`); True when nothing evictable was left
    (replica.pool.evict_lru's ``stuck``)."""
    if pc[PC_MODE] == M_BLOCK:
        while rs[r, CACHED] + rs[r, WORK] > cap:
            if rs[r, CACHED] - rs[r, PINNED] <= 0:
                return True
            v = _victim(r, cap, pref, pbl, pq, pc)
            ps[r, v] = 0
            rs[r, CACHED] -= 1
        return False
    while rs[r, CACHED] + rs[r, WORK] > cap:
        j = rs[r, FPTR]
        if j >= rs[r, FCNT]:
            return True
        if _valid(r, j, ps, pref, pst, frun, fst, pbl, pq, pc):
            run = frun[r, j]
            e = min(rs[r, CACHED] + rs[r, WORK] - cap, ps[r, run])
            ps[r, run] -= e
            rs[r, CACHED] -= e
            if ps[r, run] == 0:
                rs[r, FPTR] = j + 1
                if pc[PC_CPU] > 0:  # offload on eviction (per-block mode: the run is one block)
                    _cpu_put(r, run, rs, pbl, pq, pc)
        else:
            rs[r, FPTR] = j + 1
    return False


@njit(cache=True)
def _extend(r, h, target_blocks, rq, log0, rs, ps, pbl, pq, pc):
    """Stored heads of ``h``'s runs grow to its first ``target_blocks`` prompt blocks (pinned runs); under a
    per-block policy each new block enters it, deepest first (:func:`_admit_block`)."""
    p, e0, off = rq[h, QNR], rq[h, QE0], rq[h, QOFF]
    for k in range(p):
        q = p - 1 - k
        run, m, j0 = log0[e0 + q, 0], log0[e0 + q, 1], log0[e0 + q, 2] - off
        t = min(max(target_blocks - j0, 0), m)
        if t > ps[r, run]:
            g = t - ps[r, run]
            if pc[PC_MODE] == M_BLOCK:
                _admit_block(r, run, pbl, pq, pc)
            ps[r, run] = t
            rs[r, CACHED] += g
            rs[r, PINNED] += g


@njit(cache=True)
def _new_blocks(r, h, target_blocks, rq, log0, ps):
    """Canonical blocks ``h`` would add to the pool computing its first ``target_blocks`` prompt blocks."""
    p, e0, off = rq[h, QNR], rq[h, QE0], rq[h, QOFF]
    ds = 0
    for q in range(p):
        m, j0 = log0[e0 + q, 1], log0[e0 + q, 2] - off
        ds += max(min(max(target_blocks - j0, 0), m) - ps[r, log0[e0 + q, 0]], 0)
    return ds


# ------------------------------------------------------------------------------ a hybrid KV layout (per-block mode)
# vLLM's hybrid KV cache manager (cacheresearch/replica/hybrid_pool.py's rules): every block of a request has one block
# id per KV group (a full-attention or a sliding-window group), each its own entry of the per-block pool; block j of
# request h in layout group g is id(j) + slot(g) x PC_KU, the full-attention groups' slots first (slot 0, what the
# routers' views read, is the first full-attention group). A window group holds the request's blocks from SWF on.
@njit(cache=True)
def _hy(pc):
    """A hybrid layout (more than one group, or a window group)."""
    return pc[PC_NG] > 1 or pc[PC_WM] != 0


@njit(cache=True)
def _hy_win(pc, g):
    return ((pc[PC_WM] >> g) & 1) != 0


@njit(cache=True)
def _hy_below(pc, g):
    """Window groups before layout group ``g``."""
    n = 0
    for x in range(g):
        n += (pc[PC_WM] >> x) & 1
    return n


@njit(cache=True)
def _hy_key(h, j, g, rq, log0, pc):
    """The pool id of block ``j`` of request ``h`` in layout group ``g``."""
    b = _hy_below(pc, g)
    slot = pc[PC_NG] - _hy_below(pc, pc[PC_NG]) + b if _hy_win(pc, g) else g - b
    return log0[rq[h, QE0] + j, 0] + slot * pc[PC_KU]


@njit(cache=True)
def _hy_free(pc, kv, bt):
    """hybrid_pool.window_free_upto: the blocks wholly before ``kv - W + 1`` (0 without a window group)."""
    if pc[PC_WM] == 0:
        return 0
    return max(0, kv - pc[PC_W] + 1) // bt


@njit(cache=True)
def _hy_work(pc, kv, kd, f, bt):
    """Working blocks of a request with ``kv`` tokens of KV, ``kd`` keyed blocks and window groups freed below ``f``:
    every group its blocks past the keyed ones, a window group none below ``f``."""
    return pc[PC_NG] * (_cdiv(kv, bt) - kd) - _hy_below(pc, pc[PC_NG]) * max(0, f - kd)


@njit(cache=True)
def _hy_unpin(r, k, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Block id ``k`` loses a pin; its last pin gone, it enters the free queue next (still cached)."""
    pref[r, k] -= 1
    if pref[r, k] == 0:
        stamp = rs[r, CTR]
        rs[r, CTR] = stamp + 1
        pst[r, k] = stamp
        rs[r, PINNED] -= ps[r, k]
        if ps[r, k] > 0:
            _push(r, k, stamp, rs, ps, pref, pst, frun, fst, pbl, pq, pc)


@njit(cache=True)
def _hy_release(r, h, f, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Finish or preemption: every group releases its blocks tail first, groups in order (a window group its
    blocks from ``f`` on)."""
    n = rq[h, QNB]
    for g in range(pc[PC_NG]):
        lo = f if _hy_win(pc, g) else 0
        for j in range(n - 1, lo - 1, -1):
            _hy_unpin(r, _hy_key(h, j, g, rq, log0, pc), rs, ps, pref, pst, frun, fst, pbl, pq, pc)


@njit(cache=True)
def _hy_window(r, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc):
    """At a step's start (after the finished requests' release): each running request's window groups free its
    blocks wholly before ``computed - W + 1`` (computed: its KV so far), groups in order, highest block first; a
    cached block enters the free queue (a later hit may use it until it is evicted), a working block is free at
    once. Returns whether a block was freed."""
    if pc[PC_WM] == 0:
        return False
    freed = False
    for i in range(rs[r, NRUN]):
        h = sl[r, i, SREQ]
        f0 = sl[r, i, SWF]
        f1 = _hy_free(pc, _kv(sl[r, i, SC], sl[r, i, SPT], sl[r, i, SD], sl[r, i, SD0]), bt)
        if f1 <= f0:
            continue
        freed = True
        kd = _keyed(sl[r, i, SC], rq[h, QIN], bt)
        for g in range(pc[PC_NG]):
            if _hy_win(pc, g):
                for j in range(f1 - 1, f0 - 1, -1):
                    if j < kd:
                        _hy_unpin(r, _hy_key(h, j, g, rq, log0, pc), rs, ps, pref, pst, frun, fst, pbl, pq, pc)
                    else:
                        rs[r, WORK] -= 1
        sl[r, i, SWF] = f1
    return freed


@njit(cache=True)
def _hy_cached(r, h, j, win, rq, log0, ps, pc):
    """Block ``j`` of ``h`` is cached in every full-attention group (``win`` False) or every window group."""
    for g in range(pc[PC_NG]):
        if _hy_win(pc, g) == win and ps[r, _hy_key(h, j, g, rq, log0, pc)] == 0:
            return False
    return True


@njit(cache=True)
def _hy_hit(r, h, bound, bt, rq, log0, ps, pc):
    """hybrid_pool.hit_blocks on the pool: the full-attention groups' leading cached blocks (at most ``bound``), then
    the window groups' rightmost run of ``ceil((W - 1) / B)`` cached blocks ending by it (else their leading run)."""
    nw = _hy_below(pc, pc[PC_NG])
    L = bound
    if nw < pc[PC_NG]:
        L = 0
        while L < bound and _hy_cached(r, h, L, False, rq, log0, ps, pc):
            L += 1
    if nw == 0:
        return L
    need = _cdiv(pc[PC_W] - 1, bt)
    run, best, lead = 0, -1, -1
    for j in range(L):
        if _hy_cached(r, h, j, True, rq, log0, ps, pc):
            run += 1
        else:
            run = 0
            if lead < 0:
                lead = j
        if run >= need:
            best = j + 1
    if best >= 0:
        return best
    return lead if lead >= 0 else L


@njit(cache=True)
def _hy_pins(r, h, f, pin, rq, log0, rs, ps, pref, pc):
    """The blocks a request pins (every group's, a window group's from ``f`` on): with ``pin`` pinned now; returns
    the cached ones that were unpinned (the admission's ``dpin``)."""
    n, d = rq[h, QNB], 0
    for g in range(pc[PC_NG]):
        for j in range(f if _hy_win(pc, g) else 0, n):
            k = _hy_key(h, j, g, rq, log0, pc)
            if pref[r, k] == 0:
                d += ps[r, k]
                if pin:
                    rs[r, PINNED] += ps[r, k]
            if pin:
                pref[r, k] += 1
    return d


@njit(cache=True)
def _hy_extend(r, h, start, target, f, store, rq, log0, rs, ps, pc):
    """The blocks computing ``h``'s prompt blocks ``start .. target - 1`` adds to the pool (a window group's from
    ``f`` on); with ``store`` they are stored (pinned: ``h`` holds them). Returns how many. (A running request's
    blocks below its keyed ones are stored and pinned already: the caller starts there.)"""
    ds = 0
    for g in range(pc[PC_NG]):
        for j in range(max(start, f) if _hy_win(pc, g) else start, target):
            k = _hy_key(h, j, g, rq, log0, pc)
            if ps[r, k] == 0:
                ds += 1
                if store:
                    ps[r, k] = 1
                    rs[r, CACHED] += 1
                    rs[r, PINNED] += 1
    return ds


# ------------------------------------------------------------------------------ one engine step
@njit(cache=True)
def _leave(r, i, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Running slot ``i`` of replica ``r`` leaves (finished, or aborted by its client): its blocks are released
    (a hybrid layout: every group's, tail first) and its working blocks and load counts taken off."""
    h = sl[r, i, SREQ]
    c, pt, d, d0 = sl[r, i, SC], sl[r, i, SPT], sl[r, i, SD], sl[r, i, SD0]
    if _hy(pc):
        _hy_release(r, h, sl[r, i, SWF], rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
        rs[r, WORK] -= _hy_work(pc, _kv(c, pt, d, d0), _keyed(c, rq[h, QIN], bt), sl[r, i, SWF], bt)
    else:
        _release(r, h, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
        rs[r, WORK] -= _cdiv(_kv(c, pt, d, d0), bt) - _keyed(c, rq[h, QIN], bt)
    rs[r, LREQ] -= 1
    rs[r, LBLK] -= rq[h, QNB]


@njit(cache=True)
def _release_done(r, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Step 1: release the requests that finished at the previous step; compact the slots in order."""
    k = 0
    for i in range(rs[r, NRUN]):
        if sl[r, i, SDONE] != 0:
            _leave(r, i, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc)
        else:
            if k != i:
                sl[r, k, :] = sl[r, i, :]
            sl[r, k, SPREF] = 0
            sl[r, k, SDONE] = 0
            k += 1
    rs[r, NRUN] = k


@njit(cache=True)
def _preempt(r, L, Q, rs, sl, wq, a_old, rq, log0, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Preempt the latest admitted request (slot ``L``) by recompute: to the front of the waiting ring."""
    h = sl[r, L, SREQ]
    if _hy(pc):
        _hy_release(r, h, sl[r, L, SWF], rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    else:
        _release(r, h, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    rs[r, WORK] -= a_old
    if rs[r, WCOUNT] < Q:
        hd = (rs[r, WHEAD] - 1) % Q
        wq[r, hd, 0] = h
        wq[r, hd, 1] = sl[r, L, SD]
        wq[r, hd, 2] = sl[r, L, SNPRE] + 1
        wq[r, hd, 3], wq[r, hd, 4], wq[r, hd, 5] = -1, 0, 0
        rs[r, WHEAD] = hd
        rs[r, WCOUNT] += 1
    else:
        rs[r, DROPPED] += 1
    rs[r, PREEMPT] += 1


@njit(cache=True)
def _schedule_running(r, bt, Q, pi, rq, log0, rs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Step 2: the running batch in admission order (the token budget handed out in order), preempting
    the latest admitted while the pool cannot hold the allocations; then the pool grows and evicts.
    Returns (preempted, stuck)."""
    nrun = rs[r, NRUN]
    budget, cap = pi[BUDGET], pi[CAP]
    prev, cum = 0, 0
    hy = _hy(pc)
    for i in range(nrun):
        h = sl[r, i, SREQ]
        P = rq[h, QIN]
        c, pt, d, d0 = sl[r, i, SC], sl[r, i, SPT], sl[r, i, SD], sl[r, i, SD0]
        pre = c < pt
        want = pt - c if pre else 1
        tok = min(max(budget - prev, 0), want)
        prev += want
        c_new = c + tok if pre else c
        kv_old = _kv(c, pt, d, d0)
        if hy:  # a hybrid layout: every group allocates, a window group none below SWF
            f = sl[r, i, SWF]
            a_old = _hy_work(pc, kv_old, _keyed(c, P, bt), f, bt)
            a_new = _hy_work(pc, kv_old + tok, _keyed(c_new, P, bt), f, bt)
            if tok > 0:
                cum += (_hy_extend(r, h, _keyed(c, P, bt), _keyed(c_new, P, bt), f, False, rq, log0, rs, ps, pc)
                        + a_new - a_old)
        else:
            a_old = _cdiv(kv_old, bt) - _keyed(c, P, bt)
            a_new = _cdiv(kv_old + tok, bt) - _keyed(c_new, P, bt)
            if tok > 0:
                cum += _new_blocks(r, h, _keyed(c_new, P, bt), rq, log0, ps) + a_new - a_old
        tmp[i, 0], tmp[i, 1], tmp[i, 2], tmp[i, 3], tmp[i, 4], tmp[i, 5] = tok, c_new, a_old, a_new, cum, pre
    wc0 = rs[r, WCOUNT]
    nk = nrun
    while True:
        base = rs[r, PINNED] + rs[r, WORK]
        viol = False
        for i in range(nk):
            if base + tmp[i, 4] > cap:
                viol = True
                break
        if not viol:
            break
        nk -= 1
        _preempt(r, nk, Q, rs, sl, wq, tmp[nk, 2], rq, log0, ps, pref, pst, frun, fst, pbl, pq, pc)
    ring_n = min(nrun - nk, Q - wc0)
    for i in range(nk, nrun - ring_n):  # preempted after the ring filled: dropped
        rs[r, LREQ] -= 1
        rs[r, LBLK] -= rq[sl[r, i, SREQ], QNB]
    for i in range(nk):
        tok = tmp[i, 0]
        if tok > 0:
            h = sl[r, i, SREQ]
            if hy:
                _hy_extend(r, h, _keyed(sl[r, i, SC], rq[h, QIN], bt), _keyed(tmp[i, 1], rq[h, QIN], bt),
                           sl[r, i, SWF], True, rq, log0, rs, ps, pc)
            else:
                _extend(r, h, _keyed(tmp[i, 1], rq[h, QIN], bt), rq, log0, rs, ps, pbl, pq, pc)
            rs[r, WORK] += tmp[i, 3] - tmp[i, 2]
        sl[r, i, SC] = tmp[i, 1]
        sl[r, i, STOK] = tok
        sl[r, i, SPREF] = 1 if (tmp[i, 5] != 0 and tok > 0) else 0
    stuck = _evict(r, cap, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    rs[r, NRUN] = nk
    return nk < nrun, stuck


@njit(cache=True)
def _wq_remove(r, j, Q, rs, wq):
    """Entry ``j`` (from the head) leaves the waiting ring; the entries before it move up one place."""
    hd = rs[r, WHEAD]
    for k in range(j, 0, -1):
        wq[r, (hd + k) % Q, :] = wq[r, (hd + k - 1) % Q, :]
    rs[r, WHEAD] = (hd + 1) % Q
    rs[r, WCOUNT] -= 1


@njit(cache=True)
def _next_landing(r, Q, rs, wq):
    """The earliest cpu load still in flight after the replica's clock (T_BIG: none)."""
    t = T_BIG
    for k in range(rs[r, WCOUNT]):
        x = wq[r, (rs[r, WHEAD] + k) % Q, 3]
        if x > rs[r, CLOCK]:
            t = min(t, x)
    return t


@njit(cache=True)
def _landed_first(r, Q, rs, wq):
    """A stable partition of the waiting ring: the requests whose cpu loads landed by the clock, then the others."""
    n, hd = rs[r, WCOUNT], rs[r, WHEAD]
    tq = np.empty((n, NWQ), np.int64)
    m = 0
    for first in (True, False):
        for k in range(n):
            x = wq[r, (hd + k) % Q, 3]
            if (0 <= x <= rs[r, CLOCK]) == first:
                tq[m, :] = wq[r, (hd + k) % Q, :]
                m += 1
    for k in range(n):
        wq[r, (hd + k) % Q, :] = tq[k, :]


@njit(cache=True)
def _count(r, ntok, loc, ext, admitted, rs, pc):
    """vLLM's prefix-cache counters (tokens) for one lookup of a request never preempted (a preempted request's
    go to its ``preempted_*`` counters, not exported): ``vllm:prefix_cache_queries`` += its tokens, ``_hits`` += the
    local hit ``loc``, at every lookup (``VQA``, vLLM before PR #48860: ``get_computed_blocks`` counted each
    scheduling attempt) or at the admission only (``VQM``, after it); with a cpu tier (a KV connector) at the
    admission ``vllm:external_prefix_cache_queries`` += ``ntok - loc`` and ``_hits`` += its hit ``ext``."""
    if not admitted:
        rs[r, VQA] += ntok
        rs[r, VHA] += loc
        return
    rs[r, VQM] += ntok
    rs[r, VHM] += loc
    if pc[PC_CPU] > 0:
        rs[r, VQE] += ntok - loc
        rs[r, VHE] += ext


@njit(cache=True)
def _admit(r, bt, Q, max_seqs, pi, rq, log0, rs, sl, wq, ps, pref, pst, frun, fst, pbl, pq, pc):
    """Step 3: admit waiting requests FCFS while the budget, max_num_seqs and the pool allow; their
    prefix is matched and pinned now, their first chunk scheduled; larger than the whole pool: rejected.
    With a cpu tier, the hit continues into it: sync, the step waits for the load (``LOADP``); async, a request
    with cpu hits gets its hit blocks allocated and pinned, its load queued on the replica's link, and waits in
    the ring (skipped) until a step starting at or after the load's end (vLLM's WAITING_FOR_REMOTE_KVS); the
    requests whose loads landed go first (:func:`_landed_first`)."""
    cap = pi[CAP]
    seq_cap = min(pi[SEQS], max_seqs)
    left = pi[BUDGET]
    asy = pc[PC_ASYNC] != 0
    hy = _hy(pc)
    for i in range(rs[r, NRUN]):
        left -= sl[r, i, STOK]
    if rs[r, NLOAD] > 0:  # requests whose loads landed move to the head of the queue, in order
        _landed_first(r, Q, rs, wq)
    j = 0
    while j < rs[r, WCOUNT] and rs[r, NRUN] < seq_cap and left > 0:
        pos = (rs[r, WHEAD] + j) % Q
        h, dprev, np_, rdy = wq[r, pos, 0], wq[r, pos, 1], wq[r, pos, 2], wq[r, pos, 3]
        if rdy > rs[r, CLOCK]:  # its cpu load has not landed by this step's start
            j += 1
            continue
        p, e0 = rq[h, QNR], rq[h, QE0]
        Ph = rq[h, QIN]
        if rdy >= 0:  # its load landed: the hit blocks are stored and pinned already
            hit, ch = wq[r, pos, 4], wq[r, pos, 5]
        elif hy:  # a hybrid layout (no cpu tier): the coordinator's hit over the groups
            hit, ch = _hy_hit(r, h, max(Ph - 1, 0) // bt, bt, rq, log0, ps, pc), 0
        else:
            g0 = _lead(ps[r], log0, e0, p)
            hit = min(g0, max(Ph - 1, 0) // bt)
            ch = 0  # the cpu tier's leading blocks after the pool's (per-block mode)
            if pc[PC_CPU] > 0 and hit == g0:
                ch = _cpu_lead(r, log0, e0, p, g0, max(Ph - 1, 0) // bt, pbl)
                hit += ch
        if rdy < 0 and np_ == 0:  # a lookup of a request never preempted (vLLM's get_computed_blocks)
            _count(r, Ph, (hit - ch) * bt, ch * bt, False, rs, pc)
        start = asy and rdy < 0 and ch > 0  # async: allocate the hit blocks and start the load; schedule later
        pt = Ph + dprev
        c0 = hit * bt
        if np_ == 0 and rq[h, QIMP] > 0:  # imported KV (P/D): computed at the first admission but the last token
            c0 = max(c0, min(rq[h, QIMP], max(Ph - 1, 0)))
        tk = 0 if start else min(pt - c0, left)
        c1 = c0 + tk
        k1 = _keyed(c1, Ph, bt)
        s0 = _hy_free(pc, c0, bt)  # a window group pins (and allocates) from here on
        if hy:
            a1 = _hy_work(pc, c1, k1, s0, bt)
            dpin = _hy_pins(r, h, s0, False, rq, log0, rs, ps, pref, pc)
            dnew = _hy_extend(r, h, 0, k1, s0, False, rq, log0, rs, ps, pc)
        else:
            a1 = _cdiv(c1, bt) - k1
            dpin = 0
            for q in range(p):
                run = log0[e0 + q, 0]
                if pref[r, run] == 0:
                    dpin += ps[r, run]
            dnew = _new_blocks(r, h, k1, rq, log0, ps)
        fits = rs[r, PINNED] + rs[r, WORK] + dpin + dnew + a1 <= cap
        if not fits and (rs[r, NRUN] > 0 or (rs[r, NLOAD] > 0 and _next_landing(r, Q, rs, wq) < T_BIG)):
            break
        if not fits:  # larger than the whole pool (less what nothing can free): never schedulable
            _wq_remove(r, j, Q, rs, wq)
            if rdy >= 0:
                _release(r, h, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
                rs[r, NLOAD] -= 1
            rs[r, REJECTED] += 1
            rs[r, LBLK] -= rq[h, QNB]
            rs[r, LREQ] -= 1
            continue
        if rdy < 0 and np_ == 0:  # admitted: the lookup counted once (the connector's, which vLLM counts here always)
            _count(r, Ph, (hit - ch) * bt, ch * bt, True, rs, pc)
        if rdy < 0 and hy:
            _hy_pins(r, h, s0, True, rq, log0, rs, ps, pref, pc)
        elif rdy < 0:
            for q in range(p):
                run = log0[e0 + q, 0]
                if pref[r, run] == 0:
                    rs[r, PINNED] += ps[r, run]
                pref[r, run] += 1
            if pc[PC_MODE] == M_BLOCK:  # every cached block the request reuses is a hit of the policy, deepest first
                for q in range(p - 1, -1, -1):
                    if ps[r, log0[e0 + q, 0]] > 0:
                        _hit_block(r, log0[e0 + q, 0], pbl, pq, pc)
            if ch > 0:  # the cpu hits are read (touched deepest first: the leading one ends most recent) and loaded
                for q in range(hit - 1, hit - ch - 1, -1):
                    _lunlink(r, log0[e0 + q, 0], pbl, pq)
                    _lpush(r, 1, log0[e0 + q, 0], pbl, pq)
                if not start:
                    rs[r, LOADP] += _cpu_load_ps(ch, pc)
        if hy:
            _hy_extend(r, h, 0, k1, s0, True, rq, log0, rs, ps, pc)
        else:
            _extend(r, h, k1, rq, log0, rs, ps, pbl, pq, pc)
        rs[r, WORK] += a1
        if _evict(r, cap, rs, ps, pref, pst, frun, fst, pbl, pq, pc):
            rs[r, STUCK] = 1
        if start:  # on the replica's one link after the loads before it
            rs[r, LINK] = max(rs[r, LINK], rs[r, CLOCK]) + _cpu_load_ps(ch, pc)
            wq[r, pos, 3], wq[r, pos, 4], wq[r, pos, 5] = rs[r, LINK], hit, ch
            rs[r, NLOAD] += 1
            j += 1
            continue
        if rdy >= 0:
            rs[r, NLOAD] -= 1
        _wq_remove(r, j, Q, rs, wq)
        k = rs[r, NRUN]
        sl[r, k, SREQ], sl[r, k, SC], sl[r, k, SPT], sl[r, k, SD], sl[r, k, SD0] = h, c1, pt, dprev, dprev
        sl[r, k, SHIT], sl[r, k, SNPRE], sl[r, k, STOK], sl[r, k, SPREF], sl[r, k, SDONE] = hit, np_, tk, 1, 0
        sl[r, k, SCPU], sl[r, k, SWF] = ch, s0
        rs[r, NRUN] = k + 1
        left -= tk


@njit(cache=True)
def _abort(r, bt, Q, rq, log0, rs, sl, wq, ps, pref, pst, frun, fst, pbl, pq, pc, fin):
    """The client's timeouts at a step boundary (the replica's clock): vLLM aborts the requests whose clients gave
    up (the API server's abort on a disconnect; the engine's ``finish_requests(FINISHED_ABORTED)`` before the next
    schedule): running ones in admission order, then waiting ones in queue order, release their pins (their blocks
    enter the free queue as at a finish, still cached) and leave; one whose cpu load is in flight waits for its
    landing. An aborted request's end is -2 (not served)."""
    now = rs[r, CLOCK]
    k = 0
    for i in range(rs[r, NRUN]):
        h = sl[r, i, SREQ]
        if rq[h, QDL] <= now:
            _leave(r, i, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc)  # as at a finish
            fin[h] = -2
        else:
            if k != i:
                sl[r, k, :] = sl[r, i, :]
            k += 1
    rs[r, NRUN] = k
    j = 0
    while j < rs[r, WCOUNT]:
        pos = (rs[r, WHEAD] + j) % Q
        h, rdy = wq[r, pos, 0], wq[r, pos, 3]
        if rq[h, QDL] > now or rdy > now:
            j += 1
            continue
        if rdy >= 0:  # its load landed: its blocks are pinned
            _release(r, h, rq, log0, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
            rs[r, NLOAD] -= 1
        _wq_remove(r, j, Q, rs, wq)
        rs[r, LREQ] -= 1
        rs[r, LBLK] -= rq[h, QNB]
        fin[h] = -2


@njit(cache=True)
def _next_abort(r, Q, rq, rs, sl, wq):
    """The first step boundary time at which a request of replica ``r`` is aborted: its deadline, after its cpu
    load's landing for one in flight (T_BIG: none)."""
    t = T_BIG
    for i in range(rs[r, NRUN]):
        t = min(t, rq[sl[r, i, SREQ], QDL])
    for k in range(rs[r, WCOUNT]):
        pos = (rs[r, WHEAD] + k) % Q
        t = min(t, max(rq[wq[r, pos, 0], QDL], wq[r, pos, 3]))
    return t


@njit(cache=True)
def _next_wake(r, Q, rq, rs, wq):
    """An idle replica waiting on cpu loads: its next step, at the first landing after its clock or at the first
    deadline after it of a waiting request with no load in flight (T_BIG: none)."""
    t = T_BIG
    for k in range(rs[r, WCOUNT]):
        pos = (rs[r, WHEAD] + k) % Q
        x, d = wq[r, pos, 3], rq[wq[r, pos, 0], QDL]
        if x > rs[r, CLOCK]:
            t = min(t, x)
        elif d > rs[r, CLOCK]:
            t = min(t, d)
    return t


@njit(cache=True)
def _step_time(pi, ptok, dreqs, ctx, pairs):
    """replica.vllm.step_time in int64 picoseconds (at least 1)."""
    q, rr = pi[PCTX_FS] // 1000, pi[PCTX_FS] % 1000
    dt = (1000 * (pi[BASE] + pi[PRE_NS] * ptok + pi[DEC_NS] * dreqs) + pi[CTX_PS] * ctx + q * pairs
          + _cdiv(rr * pairs, 1000))
    return max(dt, 1)


@njit(cache=True)
def _f32ms(t):
    return np.float32(t // PS_MS) + np.float32(t % PS_MS) * np.float32(1e-9)


@njit(cache=True)
def _finish(r, h, slot, rs, sl, fin, hitb, npre):
    sl[r, slot, SDONE] = 1
    fin[h] = rs[r, CLOCK]
    hitb[h] = sl[r, slot, SHIT] + sl[r, slot, SCPU] * CPU_SHIFT
    npre[h] = sl[r, slot, SNPRE]


@njit(cache=True)
def _publish(r, rs, pw, pkv):
    """vLLM V1's gauges (``load_gauges``): the step that just ran publishes its waiting count and KV blocks in
    use at its end (the clock); ``(pw, pkv)`` are the step's before it (``pw < 0``: the last published)."""
    if pw < 0:
        pw, pkv = rs[r, PENW], rs[r, PENKV]
    rs[r, PUBW], rs[r, PUBKV] = pw, pkv
    rs[r, PENT], rs[r, PENW], rs[r, PENKV] = rs[r, CLOCK], rs[r, WCOUNT], rs[r, PINNED] + rs[r, WORK]


@njit(cache=True)
def _gauges_at(t, nrep, rs, q, kv):
    """Every replica's published gauges as of time ``t``: its last completed step's."""
    for r in range(nrep):
        if rs[r, PENT] <= t:
            q[r], kv[r] = rs[r, PENW], rs[r, PENKV]
        else:
            q[r], kv[r] = rs[r, PUBW], rs[r, PUBKV]


@njit(cache=True)
def _run_step(r, pi, rq, rs, fs, sl, ttft, fin, hitb, npre):
    """Step 4: the step's time from its prefill tokens, decoding requests, their context and the prefill
    chunks' attention pairs; the clock, gauges, first tokens and completions."""
    ptok, dreq, ctx, pairs, n_s = 0, 0, 0, 0, 0
    for i in range(rs[r, NRUN]):
        tok = sl[r, i, STOK]
        if tok > 0:
            n_s += 1
            if sl[r, i, SPREF] != 0:
                ptok += tok
                pairs += tok * (sl[r, i, SC] - tok) + tok * (tok + 1) // 2
            else:
                dreq += 1
                ctx += rq[sl[r, i, SREQ], QIN] + sl[r, i, SD]
    dt = _step_time(pi, ptok, dreq, ctx, pairs) if n_s > 0 else 0
    dt += rs[r, LOADP]  # the cpu tier's loads of the requests this step admitted, before its forward pass
    rs[r, LOADP] = 0
    rs[r, CLOCK] += dt
    used = rs[r, PINNED] + rs[r, WORK]
    dtf = _f32ms(dt)
    rs[r, STEPS] += 1 if n_s > 0 else 0
    rs[r, BUSY] += dt
    fs[r, 0] = fs[r, 0] + np.float32(used) * dtf
    if n_s > 0:
        rs[r, KVMAX] = max(rs[r, KVMAX], used)
    fs[r, 1] = fs[r, 1] + np.float32(rs[r, WCOUNT]) * dtf
    if rs[r, CLOCK] >= T_LIM:
        rs[r, TOVER] = 1
    _publish(r, rs, -1, 0)
    for i in range(rs[r, NRUN]):
        if sl[r, i, STOK] > 0:
            h = sl[r, i, SREQ]
            pre = sl[r, i, SPREF] != 0
            complete = pre and sl[r, i, SC] >= sl[r, i, SPT]
            if complete or not pre:
                if complete and sl[r, i, SD] == 0:
                    ttft[h] = rs[r, CLOCK]
                sl[r, i, SD] += 1
                if sl[r, i, SD] >= max(rq[h, QOUT], 1):
                    _finish(r, h, i, rs, sl, fin, hitb, npre)


@njit(cache=True)
def _step(r, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc, ttft, fin,
          hitb, npre):
    """One engine step of replica ``r`` (replica.vllm.replica_step); ``ttl_refresh`` expires first; the client's
    timeouts abort after the finished requests are released (:func:`_abort`)."""
    _expire(r, rs[r, CLOCK], rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    _release_done(r, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc)
    if pi[TOUT] > 0:  # vLLM's aborts (finish_requests) come between steps, before the window's release (schedule)
        _abort(r, bt, Q, rq, log0, rs, sl, wq, ps, pref, pst, frun, fst, pbl, pq, pc, fin)
    _hy_window(r, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc)
    preempted, stuck = _schedule_running(r, bt, Q, pi, rq, log0, rs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc)
    if stuck:
        rs[r, STUCK] = 1
    if not preempted:
        _admit(r, bt, Q, max_seqs, pi, rq, log0, rs, sl, wq, ps, pref, pst, frun, fst, pbl, pq, pc)
    _run_step(r, pi, rq, rs, fs, sl, ttft, fin, hitb, npre)


# ------------------------------------------------------------------------------ decode-only stretches
@njit(cache=True)
def _stretch_total(lin, cps, ctx0, dn, n):
    """Time of the first ``n`` decode-only steps (ps), saturated above the clock's span."""
    a = float(lin) * n + float(cps) * (float(ctx0) * n + float(dn) * (n * (n - 1) // 2))
    if a > 4e18:
        return 4 * 10**18
    return lin * n + cps * (ctx0 * n + dn * (n * (n - 1) // 2))


@njit(cache=True)
def _stretch_blocks(r, dn, n, bt, rq, sl):
    b = 0
    for i in range(dn):
        kv = _kv(sl[r, i, SC], sl[r, i, SPT], sl[r, i, SD], sl[r, i, SD0])
        b += _cdiv(kv + n, bt) - _cdiv(kv, bt)
    return b


@njit(cache=True)
def _stretch(r, now_t, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, ps, pref, pst, frun, fst, pbl, pq, pc, fin,
             hitb, npre):
    """The decode-only steps of replica ``r`` up to its next event, at once (replica.vllm._decode_stretch);
    False (the pool as it was, less a hybrid layout's window release of the step's start) where no stretch applies.
    A hybrid layout: every group allocates (``kv_groups`` x the blocks), and the stretch ends at the first step after
    which a window group would free a block (that release starts the next event)."""
    nrun = rs[r, NRUN]
    budget = pi[BUDGET]
    if nrun == 0 or not (rs[r, WCOUNT] == 0 or nrun >= min(pi[SEQS], max_seqs) or nrun >= budget):
        return False
    for i in range(nrun):
        if sl[r, i, SC] < sl[r, i, SPT] or sl[r, i, SDONE] != 0:
            return False
    dn = min(nrun, budget)
    f, ctx0 = BIG, 0
    if pi[TOUT] > 0 and _next_abort(r, Q, rq, rs, sl, wq) <= rs[r, CLOCK]:
        return False  # an abort at this step's start: _step aborts before the window's release
    _hy_window(r, bt, rq, log0, rs, sl, ps, pref, pst, frun, fst, pbl, pq, pc)  # the first step's start
    for i in range(dn):
        h = sl[r, i, SREQ]
        f = min(f, max(rq[h, QOUT], 1) - sl[r, i, SD])
        ctx0 += rq[h, QIN] + sl[r, i, SD]
        if pc[PC_WM] != 0:  # step k leaves kv0 + k tokens: the window frees a block after step bt (f + 1) + W - 1 - kv0
            kv0 = _kv(sl[r, i, SC], sl[r, i, SPT], sl[r, i, SD], sl[r, i, SD0])
            f = min(f, max(1, bt * (sl[r, i, SWF] + 1) + pc[PC_W] - 1 - kv0))
    ng = max(pc[PC_NG], 1)
    room = pi[CAP] - rs[r, PINNED] - rs[r, WORK]
    cps = pi[CTX_PS]
    lin = 1000 * (pi[BASE] + pi[DEC_NS] * dn)
    if lin == 0 and cps == 0:
        lin = 1
    dl = _next_abort(r, Q, rq, rs, sl, wq) if pi[TOUT] > 0 else T_BIG  # no step at or after an abort
    lo, hi = 0, f
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        start = rs[r, CLOCK] + _stretch_total(lin, cps, ctx0, dn, mid - 1)
        ok = ng * _stretch_blocks(r, dn, mid, bt, rq, sl) <= room and start <= now_t and start < dl
        if ok:
            lo = mid
        else:
            hi = mid - 1
    n = lo
    if n < 1:
        return False
    T = _stretch_total(lin, cps, ctx0, dn, n)
    used0 = rs[r, PINNED] + rs[r, WORK]
    pw, pkv = (rs[r, WCOUNT], used0 + ng * _stretch_blocks(r, dn, n - 1, bt, rq, sl)) if n >= 2 else (-1, 0)
    rs[r, WORK] += ng * _stretch_blocks(r, dn, n, bt, rq, sl)
    if _evict(r, pi[CAP], rs, ps, pref, pst, frun, fst, pbl, pq, pc):
        rs[r, STUCK] = 1
    # ttl_refresh: as of the last step's start, as step by step (the expired runs lead the free queue, so
    # evicting before expiring leaves the same pool)
    _expire(r, rs[r, CLOCK] + _stretch_total(lin, cps, ctx0, dn, n - 1), rs, ps, pref, pst, frun, fst, pbl, pq, pc)
    used = rs[r, PINNED] + rs[r, WORK]
    rs[r, CLOCK] += T
    Tf = _f32ms(T)
    rs[r, STEPS] += n
    rs[r, BUSY] += T
    # the KV gauge over the stretch takes its blocks in use as growing evenly (as the JAX replica)
    fs[r, 0] = fs[r, 0] + np.float32(0.5) * np.float32(used0 + used) * Tf
    rs[r, KVMAX] = max(rs[r, KVMAX], used)
    fs[r, 1] = fs[r, 1] + np.float32(rs[r, WCOUNT]) * Tf
    if rs[r, CLOCK] >= T_LIM:
        rs[r, TOVER] = 1
    _publish(r, rs, pw, pkv)
    for i in range(nrun):
        sl[r, i, SPREF] = 0
        sl[r, i, STOK] = 1 if i < dn else 0
        if i < dn:
            sl[r, i, SD] += n
            h = sl[r, i, SREQ]
            if sl[r, i, SD] >= max(rq[h, QOUT], 1):
                _finish(r, h, i, rs, sl, fin, hitb, npre)
    return True


@njit(cache=True)
def _advance(now_t, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc,
             ttft, fin,
             hitb, npre):
    """Every replica's steps that start at or before ``now_t``: a decode-only stretch where one applies,
    else one engine step (replicas are independent between arrivals)."""
    for r in range(nrep):
        while (rs[r, NRUN] > 0 or rs[r, WCOUNT] > 0) and rs[r, CLOCK] <= now_t:
            rs[r, EVENTS] += 1  # one event: a decode-only stretch or one engine step (metrics.core.Metrics)
            if not _stretch(r, now_t, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, ps, pref, pst, frun, fst, pbl, pq,
                            pc, fin, hitb, npre):
                s0, p0 = rs[r, STEPS], rs[r, PREEMPT]
                _step(r, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc,
                      ttft, fin,
                      hitb, npre)
                if rs[r, NLOAD] > 0 and rs[r, STEPS] == s0 and rs[r, NRUN] == 0 and rs[r, PREEMPT] == p0:
                    # nothing to run, nothing preempted, cpu loads in flight (async): the next step starts when the
                    # first lands, or at the next event (an arrival) if that comes first
                    t = _next_wake(r, Q, rq, rs, wq)
                    if t == T_BIG:  # cannot happen (the admission rejects what waits on nothing); never spin
                        rs[r, STUCK] = 1
                        break
                    if t <= now_t:
                        rs[r, CLOCK] = t
                    else:
                        rs[r, CLOCK] = max(rs[r, CLOCK], now_t)
                        break


# ------------------------------------------------------------------------------ gie: its index, the scrape
@njit(cache=True)
def _gie_match(ids, n, nrep, gpres, cnt):
    """routers.gie_index.gie_match: walk the hashes while some pod holds one, counting per pod."""
    for r in range(nrep):
        cnt[r] = 0
    for lane in range(n):
        h = ids[lane]
        held = False
        for r in range(nrep):
            if gpres[r, h]:
                cnt[r] += 1
                held = True
        if not held:
            break


@njit(cache=True)
def _gie_add(ids, n, r, cap, gpres, gst, gs, glog):
    """routers.gie_index.gie_add: pod ``r``'s LRU refreshes or inserts every hash in order (stamps
    ``clk + lane``), then drops its lowest-stamped entries down to ``cap``. The entries sit in a log in
    stamp order (``gs``: clk, size, pointer, count), so the lowest stamps are the first valid entries."""
    L = glog.shape[1]
    if gs[r, 3] + n > L:  # compact: keep the valid entries (at most size <= min(cap, G))
        k = 0
        for j in range(gs[r, 2], gs[r, 3]):
            h = glog[r, j, 0]
            if gpres[r, h] and gst[r, h] == glog[r, j, 1]:
                glog[r, k, 0], glog[r, k, 1] = h, glog[r, j, 1]
                k += 1
        gs[r, 2], gs[r, 3] = 0, k
    clk = gs[r, 0]
    for lane in range(n):
        h = ids[lane]
        if not gpres[r, h]:
            gpres[r, h] = True
            gs[r, 1] += 1
        gst[r, h] = clk + lane
        c = gs[r, 3]
        glog[r, c, 0], glog[r, c, 1] = h, clk + lane
        gs[r, 3] = c + 1
    gs[r, 0] = clk + n
    while gs[r, 1] > max(cap, 1) and gs[r, 2] < gs[r, 3]:
        j = gs[r, 2]
        h = glog[r, j, 0]
        if gpres[r, h] and gst[r, h] == glog[r, j, 1]:
            gpres[r, h] = False
            gs[r, 1] -= 1
        gs[r, 2] = j + 1


@njit(cache=True)
def _scrape(t_ms, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl,
            pq, pc,
            ttft, fin, hitb, npre, scr, sq, skv, a):
    """replica.vllm._scrape: with ``load_refresh_ms = P > 0``, at the first arrival (at ``t_ms``) past a new
    multiple of ``P`` the pods run up to that tick and their waiting requests and KV blocks in use are kept."""
    P = pi[REFRESH]
    if P <= 0:
        return
    tick = (t_ms // P) * P
    if tick <= scr[0]:
        return
    _advance(tick * PS_MS, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl,
             pq, pc, ttft,
             fin, hitb, npre)
    _loads(u, ninst, nrep, pi[LOCAL] != 0, Q, rq, rs, sl, wq, sq, a)
    for r in range(nrep):
        skv[r] = rs[r, PINNED] + rs[r, WORK]
    if pi[GAUGE] != 0:  # vLLM's gauges as of the tick
        _gauges_at(tick * PS_MS, nrep, rs, sq, skv)
    scr[0] = tick


# ------------------------------------------------------------------------------ the client's permits
@njit(cache=True)
def _run_to(x, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq,
            pc, ttft, fin,
            hitb, npre, scr, sq, skv, a):
    """The pods up to ``x`` (ps), the load scrape of the last tick by then taken first (as at an arrival)."""
    _scrape(x // PS_MS, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst,
            pbl, pq, pc,
            ttft, fin, hitb, npre, scr, sq, skv, a)
    _advance(x, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc, ttft,
             fin, hitb,
             npre)


@njit(cache=True)
def _client_send(i, arr_t, NP, fl, fm, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref,
                 pst, frun, fst, pbl, pq, pc, ttft, fin, hitb, npre, scr, sq, skv, a):
    """inference-perf's permits (``client_permits = NP``; replica.vllm docs): request ``i``, scheduled at
    ``arr_t``, takes a permit in send order, at ``max(arr_t, the previous send)`` when fewer than ``NP``
    earlier requests hold one, else at the first whole ms at or after the next finish; it holds it to its
    finish, or to its deadline (``client_timeout_ms``: the client gives up). Returns the send (ps, whole ms).
    Requests that will never finish (dropped, rejected) give theirs back when no pod has work left."""
    t = max(arr_t, fm[1])
    _run_to(t, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq,
            pc, ttft, fin,
            hitb, npre, scr, sq, skv, a)
    while True:
        j, fmin, cmin = 0, T_BIG, T_BIG
        while j < fm[0]:  # the permits given back by t (a finish, a timeout); the earliest known one of the others
            h = fl[j]
            if 0 <= fin[h] <= t or rq[h, QDL] <= t:
                fm[0] -= 1
                fl[j] = fl[fm[0]]
            else:
                if fin[h] >= 0:
                    fmin = min(fmin, fin[h])
                fmin = min(fmin, rq[h, QDL])
                j += 1
        if fm[0] < NP:
            break
        for r in range(nrep):  # each busy replica's next step: its clock, or, idle on cpu loads (the pods ran up
            if rs[r, NRUN] > 0 or rs[r, WCOUNT] > 0:  # to t and it waits at t), its next landing or deadline
                cmin = min(cmin, rs[r, CLOCK] if rs[r, CLOCK] > t else _next_wake(r, Q, rq, rs, wq))
        if fmin < T_BIG and fmin <= cmin:  # the next finish is settled: no step still to run ends before it
            t = -(-fmin // PS_MS) * PS_MS
        elif cmin == T_BIG:  # nothing will finish: the holders were never served
            fm[0] = 0
            break
        else:
            t = max(t, cmin)
        _run_to(t, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl,
                pq, pc, ttft,
                fin, hitb, npre, scr, sq, skv, a)
    fl[fm[0]] = i
    fm[0] += 1
    fm[1] = t
    return t


# ------------------------------------------------------------------------------ views and the arrival loop
@njit(cache=True)
def _index_match(row, log0, e0, p, ist, ithr):
    """Leading blocks of a request in an index row (leaf-first stamps, threshold: cache.store.stored_len)."""
    hit = 0
    for q in range(p):
        run, m = log0[e0 + q, 0], log0[e0 + q, 1]
        st = ist[row, run]
        sli = 0 if st < 0 else min(max(st + m - ithr[row], 0), m)
        if sli == m:
            hit += m
        else:
            hit += sli
            break
    return hit


@njit(cache=True)
def _index_learn(row, h, cap, rq, log0, ist, ix, ixl):
    """The approximate index learns a decision: the request's runs restamped leaf-first (entries tail
    first, ascending stamps), then its lazy-pointer LRU down to ``cap`` blocks (cache.store.evict)."""
    n, p, e0, off = rq[h, QNB], rq[h, QNR], rq[h, QE0], rq[h, QOFF]
    for k in range(p):
        q = p - 1 - k
        run, m, j0 = log0[e0 + q, 0], log0[e0 + q, 1], log0[e0 + q, 2] - off
        st = ist[row, run]
        sli = 0 if st < 0 else min(max(st + m - ix[row, 3], 0), m)
        ix[row, 4] += m - sli
        b = off + n - j0 - m
        ist[row, run] = b
        c = ix[row, 0]
        ixl[row, c, 0], ixl[row, c, 1], ixl[row, c, 2] = run, m, b
        ix[row, 0] = c + 1
    while ix[row, 4] > cap and ix[row, 1] < ix[row, 0]:  # ix: cnt, pointer, offset, threshold, occupancy
        j = ix[row, 1]
        run, m, b = ixl[row, j, 0], ixl[row, j, 1], ixl[row, j, 2]
        avail = m - ix[row, 2] if ist[row, run] == b else 0
        need = ix[row, 4] - cap
        if avail > need:
            ix[row, 2] += need
            ix[row, 4] -= need
        else:
            ix[row, 4] -= avail
            ix[row, 1] = j + 1
            ix[row, 2] = 0
    if ix[row, 1] < ix[row, 0]:
        ix[row, 3] = ixl[row, ix[row, 1], 2] + ix[row, 2]
    elif ix[row, 0] > 0:
        ix[row, 3] = ixl[row, ix[row, 0] - 1, 2] + ixl[row, ix[row, 0] - 1, 1]


@njit(cache=True)
def _loads(u, ninst, nrep, local, Q, rq, rs, sl, wq, q, a):
    """Each replica's load as the router reads it (waiting requests; blocks waiting or running); with
    ``local_load`` only router instance ``u``'s requests."""
    for r in range(nrep):
        if not local:
            q[r], a[r] = rs[r, WCOUNT], rs[r, LBLK]
            continue
        qq, aa = 0, 0
        for k in range(rs[r, WCOUNT]):
            h = wq[r, (rs[r, WHEAD] + k) % Q, 0]
            if h % ninst == u:
                qq += 1
                aa += rq[h, QNB]
        for k in range(rs[r, NRUN]):
            h = sl[r, k, SREQ]
            if h % ninst == u:
                aa += rq[h, QNB]
        q[r], a[r] = qq, aa


@njit(cache=True)
def _tracked(now, nrep, Q, pi, rq, rs, sl, wq, ac):
    """replica.vllm.tracked_requests: per replica, the waiting and running requests routed at or after the
    active-request tracker's expiry cutoff ``(floor(now / T) - 1) T`` (``T = gie_active_timeout_ms``; 0: none)."""
    T = pi[G_TTL]
    cut = (now // T - 1) * T if T > 0 else -1
    for r in range(nrep):
        k = 0
        for j in range(rs[r, WCOUNT]):
            k += 1 if rq[wq[r, (rs[r, WHEAD] + j) % Q, 0], QARR] >= cut else 0
        for j in range(rs[r, NRUN]):
            k += 1 if rq[sl[r, j, SREQ], QARR] >= cut else 0
        ac[r] = k


@njit(cache=True)
def _enqueue(i, r, now_t, Q, rq, rs, wq):
    """Request ``i`` joins replica ``r``'s waiting ring (dropped when full); an idle replica's clock moves
    to the arrival."""
    if rs[r, NRUN] == 0 and rs[r, WCOUNT] == 0:
        rs[r, CLOCK] = max(rs[r, CLOCK], now_t)
    if rs[r, WCOUNT] < Q:
        pos = (rs[r, WHEAD] + rs[r, WCOUNT]) % Q
        wq[r, pos, 0], wq[r, pos, 1], wq[r, pos, 2] = i, 0, 0
        wq[r, pos, 3], wq[r, pos, 4], wq[r, pos, 5] = -1, 0, 0
        rs[r, WCOUNT] += 1
        rs[r, LREQ] += 1
        rs[r, LBLK] += rq[i, QNB]
    else:
        rs[r, DROPPED] += 1


@njit(cache=True)
def _tier_lead(r, log0, e0, p, ps, pbl, wc):
    """llm-d's precise producer over both tiers (per-block mode with a cpu tier): along the request's blocks while
    replica ``r`` holds them in its pool (weight 1) or its cpu tier (weight ``wc``; in both: the larger), the weights
    summed in float64 in block order and truncated (``int(aggregatedScores[pod])``)."""
    acc = 0.0
    for q in range(p):
        k = log0[e0 + q, 0]
        g, c = ps[r, k] > 0, pbl[r, B_WHERE, k] != 0
        if not (g or c):
            break
        acc += max(1.0 if g else 0.0, wc if c else 0.0)  # a block in both tiers: the larger weight
    return np.int64(acc)


@njit(cache=True)
def _views(i, u, nrep, R, pi, rq, log0, ps, snap, sync, ist, ix, stale, index, mt, mv, gh, gn, gpres, pbl, pc):
    """Every replica's precise match ``mt`` and the router's view ``mv`` (precise, stale, approximate or
    gie_estimate: GIE's count of the request's prompt-byte hashes; precise with ``gie_cpu_tier_w_pct > 0`` and a
    cpu tier: the tier-weighted prefix, :func:`_tier_lead`)."""
    now = rq[i, QARR]
    p, e0 = rq[i, QNR], rq[i, QE0]
    for r in range(nrep):
        mt[r] = _lead(ps[r], log0, e0, p)
        mv[r] = mt[r]
    if stale and pi[VIEW] == 2:
        if sync[1] == 0 or now - sync[0] >= pi[LAG]:  # the router's copy of every pool
            snap[:, :] = ps
            sync[0], sync[1] = now, 1
        for r in range(nrep):
            mv[r] = _lead(snap[r], log0, e0, p)
    if index and pi[VIEW] == 1:
        for r in range(nrep):
            mv[r] = _index_match(u * R + r, log0, e0, p, ist, ix[:, 3])
    if pi[VIEW] == 3:
        _gie_match(gh[i], gn[i], nrep, gpres, mv)
    if pi[VIEW] == 0 and pi[G_CTW] > 0 and pc[PC_CPU] > 0:
        for r in range(nrep):
            mv[r] = _tier_lead(r, log0, e0, p, ps, pbl, pi[G_CTW] / 100)


@njit(cache=True)
def _one(g, rq, log0, pkey, K, bt, R, S, Q, NI, max_seqs, stale, index, match, pi, pc, rk, bits, ring, L, E, gh, gn,
         GI, ttft, fin, hitb, npre, repof, rs_out, fs_out, tot, kat, snd):
    """One configuration: the scan over arrivals (replica.vllm.simulate_vllm)."""
    N = rq.shape[0]
    pbl = np.zeros((R, NB + (2 if pc[PC_MODE] == M_TTL else 0),
                    K if (pc[PC_MODE] != M_LRU or pc[PC_CPU] > 0) else 1), np.int32)
    lb = max(pc[PC_LB], 1)
    pq = np.full((R, NPQ + 3 * lb), -1, np.int64)  # the buckets' heads and tails: empty lists
    for x in range(R):
        pq[x, 2] = 0  # the cpu tier's list: empty
        pq[x, NPQ + 2 * lb:] = 0  # the buckets' counts
        if pc[PC_MODE] == M_BLOCK:
            D.init(pc[PC_CODE], pq[x, :NS])
            pq[x, NS] = 0  # the float scalar 0.0
    ps, pref, pst = np.zeros((R, K), np.int32), np.zeros((R, K), np.int32), np.zeros((R, K), np.int32)
    frun, fst = np.zeros((R, L), np.int32), np.zeros((R, L), np.int32)
    rs = np.zeros((R, NRS), np.int64)
    fs = np.zeros((R, 2), np.float32)
    sl = np.zeros((R, S, NSL), np.int64)
    wq = np.zeros((R, Q, NWQ), np.int64)
    tmp = np.zeros((S, 6), np.int64)
    snap = np.zeros((R if stale else 1, K if stale else 1), np.int32)
    sync = np.zeros(2, np.int64)
    rows = NI * R if index else 1
    ist = np.full((rows, K if index else 1), -1, np.int64)
    ix = np.zeros((rows, 5), np.int64)
    ixl = np.zeros((rows, E if index else 1, 3), np.int64)
    mt, mv, q, a = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
    tree, tmpv = np.zeros(R, np.int64), np.zeros(R, np.int64)
    elig = np.zeros(R, np.bool_)
    sr, sg = np.zeros((R, RD.NSR), np.int64), np.zeros(RD.NSG, np.int64)  # the router's state
    nrep = min(max(pi[NREP], 1), R)
    ninst = min(max(pi[NINST], 1), NI)
    code = pi[ROUTER]
    gie = pi[VIEW] == 3  # GIE's index [R, GI] (view gie_estimate): present, stamps, (clk, size, ptr, cnt), log
    G1, Lg = (GI, 2 * (min(max(pi[G_LRU], 1), GI) + gh.shape[1]) + 2) if gie else (1, 1)
    gpres, gst = np.zeros((R, G1), np.bool_), np.zeros((R, G1), np.int64)
    gs, glog = np.zeros((R, 4), np.int64), np.zeros((R, Lg, 2), np.int64)
    gcw = gie and pi[G_CW] > 0  # the CPU-tier prefix scorer's own index, the same layout
    C1, Lc = (GI, 2 * (min(max(pi[G_CLRU], 1), GI) + gh.shape[1]) + 2) if gcw else (1, 1)
    cpres, cst = np.zeros((R, C1), np.bool_), np.zeros((R, C1), np.int64)
    cgs, clog, mcv = np.zeros((R, 4), np.int64), np.zeros((R, Lc, 2), np.int64), np.zeros(R, np.int64)
    scr, sq, skv, kvu = np.full(1, -1, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
    ac = np.zeros(R, np.int64)  # the active-request tracker's counts (gie_active_w_pct > 0)
    NP = pi[PERMITS]
    if NP > 0 or pi[TOUT] > 0:  # the client's permits: the sends (the arrival column of a private copy) follow the
        rq = rq.copy()  # finishes; its timeouts: the deadlines (QDL)
    fl = np.zeros(min(max(NP, 0), N) + 1, np.int64)  # the requests holding a permit
    fm = np.zeros(2, np.int64)  # (how many, the last send in ps)
    for i in range(N):
        u = i % ninst
        if NP > 0:
            now_t = _client_send(i, rq[i, QARR] * PS_MS, NP, fl, fm, u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0,
                                 rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc, ttft[g], fin[g], hitb[g],
                                 npre[g], scr, sq, skv, a)
            rq[i, QARR] = now_t // PS_MS
            snd[g, i] = rq[i, QARR]
        else:
            now_t = rq[i, QARR] * PS_MS
        if pi[TOUT] > 0:  # the client gives up at send + its timeout
            rq[i, QDL] = now_t + pi[TOUT] * PS_MS
        _scrape(rq[i, QARR], u, ninst, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun,
                fst, pbl, pq, pc, ttft[g], fin[g], hitb[g], npre[g], scr, sq, skv, a)
        _advance(now_t, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq,
                 pc, ttft[g],
                 fin[g], hitb[g], npre[g])
        for x in range(nrep):  # ttl_refresh: the pools as of the arrival
            _expire(x, now_t, rs, ps, pref, pst, frun, fst, pbl, pq, pc)
        for x in range(nrep):  # the KV and waiting integrals at this arrival (per-stage time means)
            kat[g, i, 0] += fs[x, 0]
            kat[g, i, 1] += fs[x, 1]
        n = rq[i, QNB]
        _views(i, u, nrep, R, pi, rq, log0, ps, snap, sync, ist, ix, stale, index, mt, mv, gh, gn, gpres, pbl, pc)
        if gcw:  # the CPU-tier scorer's count, packed above the GPU view's: m = gpu + cpu x 2**32 (routers/gie.py)
            _gie_match(gh[i], gn[i], nrep, cpres, mcv)
            for x in range(nrep):
                mv[x] += mcv[x] * CPU_SHIFT
        _loads(u, ninst, nrep, pi[LOCAL] != 0, Q, rq, rs, sl, wq, q, a)
        if pi[GAUGE] != 0 and pi[REFRESH] <= 0:  # vLLM's gauges read live: as of this arrival
            _gauges_at(now_t, nrep, rs, sq, skv)
        for x in range(nrep):
            tree[x] = rs[x, CACHED]
            gauges = pi[REFRESH] > 0 or pi[GAUGE] != 0
            kvu[x] = skv[x] if gauges else rs[x, PINNED] + rs[x, WORK]
            if gauges:  # the scraped (or published) waiting counts (every router's queue)
                q[x] = sq[x]
        if pi[G_WA] > 0:  # gie's active-request scorer
            _tracked(rq[i, QARR], nrep, Q, pi, rq, rs, sl, wq, ac)
        pb = min(pi[PB], n)
        kpos = rq[i, QOFF] + max(pb - 1, 0)
        r = RD.route(code, i, n, pkey[kpos, 0] if n > 0 else 0, pkey[kpos, 1] if n > 0 else 0, bits[g, i], nrep,
                     q, mv, a, tree, kvu, ac, gn[i] if gie else -1, pi[CAP], rk, ring, elig, tmpv, sr, sg)
        if gie:  # PostCycle (later releases: PreRequest): the chosen pod's LRU learns the request's hashes
            _gie_add(gh[i], gn[i], r, pi[G_LRU], gpres, gst, gs, glog)
        if gcw:
            _gie_add(gh[i], gn[i], r, pi[G_CLRU], cpres, cst, cgs, clog)
        # the routing metrics (replicas holding the routing prefix; sent away from the best)
        mbest, cp = 0, 0
        for x in range(nrep):
            mbest = max(mbest, mt[x])
            cp += 1 if mt[x] >= pb else 0
        if n > 0:
            tot[g, 0] += cp
            tot[g, 1] += 1
        if match and mbest > 0:
            tot[g, 3] += 1
            tot[g, 2] += 1 if mt[r] < mbest else 0
        repof[g, i] = r
        if index:
            _index_learn(u * R + r, i, pi[ICAP], rq, log0, ist, ix, ixl)
        _enqueue(i, r, now_t, Q, rq, rs, wq)
    end_t = np.int64(T_LIM)  # a typed int64, not a literal: one compiled _advance serves both calls
    _advance(end_t, nrep, bt, Q, max_seqs, pi, rq, log0, rs, fs, sl, wq, tmp, ps, pref, pst, frun, fst, pbl, pq, pc,
             ttft[g],
             fin[g], hitb[g], npre[g])
    rs_out[g] = rs
    fs_out[g] = fs


@njit(parallel=True, cache=True)
def _kernel(rq, log0, pkey, K, bt, R, S, Q, NI, max_seqs, stale, index, match, pi, pc, rk, bits, ring, L, E, gh, gn,
            GI):
    G, N = pi.shape[0], rq.shape[0]
    ttft, fin = np.full((G, N), -1, np.int64), np.full((G, N), -1, np.int64)
    hitb, npre, repof = np.zeros((G, N), np.int64), np.zeros((G, N), np.int64), np.zeros((G, N), np.int64)
    rs_out = np.zeros((G, R, NRS), np.int64)
    fs_out = np.zeros((G, R, 2), np.float32)
    tot = np.zeros((G, 4), np.int64)  # copies, copies_n, over_n, over_q
    kat = np.zeros((G, N, 2), np.float32)  # kv_acc_at, q_acc_at
    snd = np.zeros((G, N), np.int64)  # the sends (ms) under the client's permits (client_permits > 0)
    for g in prange(G):  # the prange index is typed both int64 and uint64: pass one type, one compiled _one
        _one(np.int64(g), rq, log0, pkey, K, bt, R, S, Q, NI, max_seqs, stale, index, match, pi[g], pc[g], rk[g],
             bits, ring, L, E, gh, gn, GI, ttft, fin, hitb, npre, repof, rs_out, fs_out, tot, kat, snd)
    return ttft, fin, hitb, npre, repof, rs_out, fs_out, tot, kat, snd


# ------------------------------------------------------------------------------ the host side
def _fields(params) -> dict:
    if isinstance(params, (list, tuple)):
        from cacheresearch.core.params import stack_params  # noqa: PLC0415

        params = stack_params(list(params))
    return {f: np.asarray(getattr(params, f)).reshape(-1) for f in params._fields}


def _config_matrix(P: dict) -> np.ndarray:
    G = P["policy"].shape[0]
    pi = np.zeros((G, NPI), np.int64)
    for k, f in enumerate(_PI_FIELDS):
        pi[:, k] = P[f].astype(np.int64)
    rnames, codes = rdispatch.names(), rdispatch.codes()
    pi[:, ROUTER] = [codes[rnames[int(x)]] for x in P["router"]]  # coverage() refused a router without a code
    return pi


def _gie_arrays(stream: Stream, P: dict, n: int):
    """The stream's GIE hash ids ``[n, H]``, counts ``[n]`` and id space (view gie_estimate), or 1-wide
    placeholders when no configuration reads them."""
    gie = np.any(P["view"] == VIEWS["gie_estimate"])
    if gie and stream.gie_hash is None:
        raise ValueError("view 'gie_estimate' needs the stream's GIE hashes (compile_stream(..., gie_hashes=...))")
    if not gie:
        return np.zeros((max(n, 1), 1), np.int64), np.zeros(max(n, 1), np.int64), 1
    gh = np.ascontiguousarray(np.asarray(stream.gie_hash)[:n].astype(np.int64))
    gn = np.asarray(stream.gie_n)[:n].astype(np.int64)
    return gh, gn, max(int(stream.n_gie), 1)


def _limbs(total) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(total, np.int64)
    return (t >> LIMB).astype(np.int32), (t & ((1 << LIMB) - 1)).astype(np.int32)


def _pct(srt, nl, p, size):
    """metrics.core.percentile over rows: nearest rank ``p`` of the first ``nl`` sorted values."""
    k = np.clip((p * nl + 99) // 100 - 1, 0, max(size - 1, 0))
    v = srt[np.arange(srt.shape[0]), np.minimum(k, srt.shape[1] - 1)] if srt.shape[1] else np.zeros(len(nl))
    return np.where(nl > 0, v, 0).astype(np.int32)


def _ceil_ms(t):
    return np.where(t >= 0, -(-t // PS_MS), -1)


def _pool_config(P: dict) -> np.ndarray:
    """The pool's policy per configuration ``[G, NPC]``: mode, TTL in ps, s3fifo's sizes and threshold."""
    names = {v.id: k for k, v in POLICIES.items()}
    G = P["policy"].shape[0]
    pc = np.zeros((G, NPC), np.int64)
    codes = dispatch.codes()
    pc[:, PC_MODE] = [POLICY_MODES.get(names[int(x)], M_BLOCK) for x in P["policy"]]
    pc[:, PC_CODE] = [codes.get(names[int(x)], -1) for x in P["policy"]]
    pc[:, PC_TTL] = P["ttl_ms"].astype(np.int64) * PS_MS
    pc[:, PC_SMALL] = P["s3fifo_small"]
    pc[:, PC_GHOST] = P["s3fifo_ghost"]
    pc[:, PC_PROMOTE] = P["s3fifo_promote"]
    small = (pc[:, PC_CODE] == codes.get("s3fifo", -2)) & (pc[:, PC_SMALL] < 2)
    if small.any():
        raise ValueError("s3fifo on the vllm pool needs a small queue of at least 2 blocks (s3fifo_small_pm x "
                         "capacity): libCacheSim admits no block as large as small, and a computed block cannot "
                         "stay out of the pool")
    ones, zeros = np.ones(G, np.int64), np.zeros(G, np.int64)
    pc[:, PC_NG] = P.get("kv_groups", ones)
    pc[:, PC_WM] = P.get("kv_window_groups", zeros)
    pc[:, PC_W] = P.get("kv_window", zeros)
    _check_layout(pc, [names[int(x)] for x in P["policy"]])
    return pc


def _check_layout(pc, policies) -> None:
    """A hybrid KV layout's knobs (one-line errors naming the key): the window groups among the groups, a window
    of at least 2 tokens, vLLM's free queue (lru / unbounded) as the pool's order."""
    for g in range(pc.shape[0]):
        ng, wm, w = (int(x) for x in pc[g, [PC_NG, PC_WM, PC_W]])
        if wm >> ng:
            raise ValueError(f"kv_window_groups {wm:#b} names a group past kv_groups {ng}")
        if wm and w < 2:
            raise ValueError(f"kv_window must be >= 2 tokens with window groups (kv_window_groups {wm:#b}), got {w}")
        if (ng > 1 or wm) and pc[g, PC_MODE] != M_LRU:
            raise ValueError(f"cache.policy {policies[g]!r} with a hybrid KV layout (kv_groups {ng}): the hybrid "
                             "pool runs vLLM's free queue (lru, unbounded) only")


def _hybrid_ids(pc, K: int, host: dict, bt: int):
    """``pc`` with one group's block id space ``K`` (a hybrid layout's groups take ids ``id + slot x K``); refuses a
    hybrid layout with a cpu tier, or over a stream whose requests lack a key per full block (one line each)."""
    pc = pc.copy()
    pc[:, PC_KU] = K
    hy = (pc[:, PC_NG] > 1) | (pc[:, PC_WM] != 0)
    if np.any(hy & (pc[:, PC_CPU] > 0)):
        raise ValueError("tiers.cpu with a hybrid KV layout (kv_groups > 1) is not modelled on the vllm replica; "
                         "vLLM before 0.21 runs a KV connector on the unified layout (kv_layout.runtime_layout)")
    bad = host["n_blocks"] != host["input_tokens"] // bt
    if hy.any() and bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"kv_groups: a hybrid KV layout needs a key per full {bt}-token block; request {i} has "
                         f"{host['n_blocks'][i]} for {host['input_tokens'][i]} tokens")
    return pc


def _block_log(stream: Stream, n: int):
    """The stream with every block a run of its own (per-block policies): entries ``(block id, 1, position)``
    at each block's position, so request ``i``'s entries start at its offset; (log0, K = the id space)."""
    from cacheresearch.core.stream import with_block_ids  # noqa: PLC0415

    s = with_block_ids(stream)
    S = int(np.asarray(s.n_blocks)[:n].astype(np.int64).sum())
    off = np.asarray(s.offset)[:n].astype(np.int64)
    nb = np.asarray(s.n_blocks)[:n].astype(np.int64)
    pos = np.arange(S, dtype=np.int64)
    if S and not np.array_equal(off, np.concatenate([[0], np.cumsum(nb)[:-1]])):
        raise ValueError("the per-block pool needs a stream whose requests' blocks are consecutive")
    U = max(s.n_distinct, 1)
    log0 = np.zeros((S + 1, 3), np.int64)
    log0[:S, 0] = np.asarray(s.block_id)[:S]
    log0[:S, 1] = 1
    log0[:S, 2] = pos
    log0[S] = (U, 0, 0)
    return log0, U


def run_stream(stream: Stream, params: list, keys: list, st, *, n_out: int | None = None,
               imported: np.ndarray | None = None) -> Metrics:
    """Configurations ``params`` (PRNG ``keys``) over one unpadded stream under the static options ``st``
    (``scheduler="vllm"``): the JAX replica's unfinalized :class:`Metrics` (ratio fields NaN; pass them to
    :func:`~cacheresearch.metrics.core.finalize`), leading axis [G]; per-request arrays have ``n_out``
    entries (default: the stream's requests), padded as the JAX program pads them. Configurations with a
    per-block policy run on the stream with every block a run of its own (:func:`_block_log`), the others on
    its runs; the results come back in the order given. ``imported`` (int [N], optional): per request, the prompt
    tokens whose KV arrives with it (a P/D decode pool, :mod:`cacheresearch.fleet.disagg`): its first admission
    counts ``min(imported, input - 1)`` tokens as computed (more when its prefix hit is longer), the rest is
    prefilled; a preempted request recomputes as ever."""
    P = _fields(params)
    G = P["policy"].shape[0]
    missing = coverage([type("P", (), {f: P[f][g] for f in P})() for g in range(G)], st)
    if missing:
        raise ValueError(f"the numba vllm backend does not model {'; '.join(missing)}")
    pc = _pool_config(P)
    per_block = (pc[:, PC_MODE] == M_BLOCK) | (pc[:, PC_NG] > 1) | (pc[:, PC_WM] != 0)  # a hybrid layout: per block
    if per_block.all() or not per_block.any():
        return _run_part(stream, P, pc, keys, st, n_out, bool(per_block.all()), imported=imported)
    parts = [np.nonzero(~per_block)[0], np.nonzero(per_block)[0]]
    ms = [_run_part(stream, {f: v[ix] for f, v in P.items()}, pc[ix], [keys[int(g)] for g in ix], st, n_out, b,
                    imported=imported)
          for ix, b in zip(parts, (False, True))]
    order = np.argsort(np.concatenate(parts), kind="stable")
    return Metrics(*(np.concatenate([np.asarray(a), np.asarray(b)])[order] for a, b in zip(*ms)))


def _run_part(stream: Stream, P: dict, pc, keys, st, n_out, per_block: bool, cpu_out: list | None = None, *,
              imported: np.ndarray | None = None) -> Metrics:
    """One kernel call; with ``cpu_out`` (a list) the per-request cpu-hit blocks ``[G, N]`` and the blocks offloaded
    per configuration ``[G]`` are appended to it (configurations with a cpu tier: ``pc[:, PC_CPU] > 0``, per-block
    mode, :mod:`cacheresearch.tiers.vllm`)."""
    from cacheresearch.core.simulate import request_bits  # noqa: PLC0415

    n = int(stream.n_requests)
    host = {k: np.asarray(getattr(stream, k))[:n].astype(np.int64) for k in
            ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs", "entry0")}
    me = sys.modules[__name__]
    RD = rdispatch.bind(me)
    if per_block:
        log0, K = _block_log(stream, n)
        host["n_runs"], host["entry0"] = host["n_blocks"], host["offset"]
        pc = _hybrid_ids(pc, K, host, int(stream.block_tokens))
        K *= int(pc[:, PC_NG].max(initial=1))  # every group its own block ids
        D = me.D
        hot = int(np.bincount(log0[:-1, 0]).max(initial=0)) if log0.shape[0] > 1 else 0
        pc = pc.copy()
        pc[:, PC_LB] = [hot + 2 if D.BUCKETS[c] else 0 for c in pc[:, PC_CODE]]  # a bucket per frequency, 0 unused
    else:
        log0 = np.ascontiguousarray(np.asarray(stream.log[0]).astype(np.int64))
        run_len = np.asarray(stream.run_len)
        K = int(run_len.shape[0])
        ent = log0[:-1]
        if np.any(ent[:, 0] >= K) or np.any(run_len[np.minimum(ent[:, 0], K - 1)] != ent[:, 1]):
            raise ValueError("the vllm replica needs compile_stream(..., stateful_singletons=True) (whole runs)")
    host["imported"] = np.zeros(n, np.int64) if imported is None else np.asarray(imported, np.int64)[:n]
    host["deadline"] = np.full(n, T_BIG, np.int64)  # the client's deadlines: none until a send sets one
    rq = np.stack([host[k] for k in ("arrival_ms", "n_blocks", "input_tokens", "output_tokens", "offset", "n_runs",
                                     "entry0", "imported", "deadline")], axis=1)
    pkey = np.stack([np.asarray(stream.key_hi), np.asarray(stream.key_lo)], axis=1).astype(np.int64)
    bits = np.stack([np.asarray(request_bits(k, n + 1))[:n] for k in keys]).astype(np.int64)
    R = st.max_replicas
    ring = np.asarray(ring_positions(R, st.max_vnodes)).astype(np.int64)
    gh, gn, GI = _gie_arrays(stream, P, n)
    out = _kernel(rq, log0, pkey, K, int(stream.block_tokens), R, st.max_running, st.queue_slots,
                  st.max_instances, st.max_running, bool(st.stale), bool(st.index), bool(st.match),
                  _config_matrix(P), np.ascontiguousarray(pc), rdispatch.knob_matrix(P, RD), bits, ring, 2 * K + 16,
                  int(log0.shape[0]), gh, gn, GI)
    out = list(out)
    hitb = out[2]
    out[2] = hitb & (CPU_SHIFT - 1)
    if cpu_out is not None:
        cpu_out += [hitb >> 32, out[5][:, :, OFFL].sum(axis=1)]
    return _metrics(stream, P, st, out, n, n if n_out is None else int(n_out))


def _outcome(P, fin_t, arr):
    """The client's outcome per request (inference-perf: a request with no error is a success): 0 ok, 1 timed out
    (``client_timeout_ms``: aborted, its end -2, or its last token after the deadline, send + timeout), 2 failed
    (never served); and its end for the run's span (ms): the last token's, the deadline, 0."""
    T = P["client_timeout_ms"].astype(np.int64)[:, None]
    served = fin_t >= 0
    timed = (T > 0) & ((fin_t == -2) | (served & (fin_t > (arr + T) * PS_MS)))
    status = np.where(timed, 1, np.where(served, 0, 2))
    return status, np.where(status == 0, _ceil_ms(fin_t), np.where(status == 1, arr + T, 0))


def _metrics(stream, P, st, out, n, no) -> Metrics:
    """core.simulate's vllm metrics from the kernel's outputs (integers, exact sums, the float32 gauges)."""
    ttft_t, fin_t, hitb, npre, repof, rs, fs, tot, kat, snd = out
    G, R = rs.shape[0], rs.shape[1]
    arr0 = np.asarray(stream.arrival_ms)[:n].astype(np.int64)
    # TTFT and end-to-end latency from the send: the scheduled arrival, or under the client's permits the
    # time a permit let the request go (inference-perf times a request from its send)
    arr = np.where((P["client_permits"] > 0)[:, None], snd, arr0[None])
    inp = np.asarray(stream.input_tokens)[:n].astype(np.int64)
    outp = np.asarray(stream.output_tokens)[:n].astype(np.int64)
    bt = int(stream.block_tokens)
    served = fin_t >= 0
    ttft_ms = np.where(served, _ceil_ms(ttft_t) - arr, -1)
    e2e_ms = np.where(served, _ceil_ms(fin_t) - arr, -1)
    hit_b = np.where(served, hitb, 0)
    hit_tok = np.where(hit_b > (inp // bt)[None], inp[None], hit_b * bt)
    t0 = arr0[0] if n else 0
    status, end_ms = _outcome(P, fin_t, arr)  # latency and throughput over the successes (inference-perf's)
    lat = (status == 0) & ((arr0 - t0)[None] >= P["warmup_ms"].astype(np.int64)[:, None])
    nl = lat.sum(axis=1)
    srt_t = np.sort(np.where(lat, ttft_ms, MS_LIM), axis=1)
    srt_e = np.sort(np.where(lat, e2e_ms, MS_LIM), axis=1)
    multi = lat & (outp >= 2)[None]
    d = np.where(multi, fin_t - ttft_t, 0)
    k = np.clip(outp - 1, 1, 2_000_000)[None]
    ms, rem = d // PS_MS, d % PS_MS
    q_ms, q_ns = ms // k, ((ms % k) * PS_MS + rem) // (1000 * k)
    active = np.arange(R)[None] < np.clip(P["replicas"].astype(np.int64), 1, R)[:, None]
    last_ms = np.max(end_ms, axis=1, initial=0)
    horizon = np.maximum(np.maximum(last_ms, arr[:, max(n - 1, 0)] if n else 0) - t0, 1)
    busy_ms = (-(-rs[:, :, BUSY] // PS_MS)).astype(np.int32)
    hr = np.clip(np.where(served, repof, 0), 0, R - 1)
    rpr = np.zeros((G, R), np.int32)
    for g in range(G):
        np.add.at(rpr[g], hr[g], served[g].astype(np.int32))
    size = max(no, 1)

    def per_req(a, fill):
        if not st.per_request:
            return np.zeros((G, 0), np.int32)
        o = np.full((G, no), fill, np.int32)
        o[:, :n] = a
        return o

    def per_req_f(a):
        if not st.per_request:
            return np.zeros((G, 0), np.float32)
        o = np.zeros((G, no), np.float32)
        o[:, :n] = a
        return o

    def lim(x):
        return _limbs(np.asarray(x, np.int64).sum(axis=1))

    hh, hl = lim(np.where(served, hit_tok, 0))
    ih, il = _limbs(np.full(G, inp.sum()))
    th, tl = lim(np.where(lat, ttft_ms, 0))
    qh, ql = lim(np.where(multi, q_ms, 0))
    fh, fl = lim(np.where(multi, q_ns, 0))
    oh, ol = lim(np.where(status == 0, outp[None], 0))
    nan = np.full(G, np.nan, np.float32)
    wa = lambda x: np.where(active, x, 0)  # noqa: E731
    # vLLM's prefix-cache counters as the configuration's counter_mode counts them (0 per_attempt, 1 per_admission)
    adm = (P["counter_mode"] != 0)[:, None]
    vc = np.stack([wa(np.where(adm, rs[:, :, VQM], rs[:, :, VQA])).sum(axis=1),
                   wa(np.where(adm, rs[:, :, VHM], rs[:, :, VHA])).sum(axis=1),
                   wa(rs[:, :, VQE]).sum(axis=1), wa(rs[:, :, VHE]).sum(axis=1)], axis=1)
    vch, vcl = _limbs(vc)
    nok = (status == 0).sum(axis=1)
    return Metrics(
        token_hit_rate=nan, request_hit_rate=nan, hit_tokens_hi=hh, hit_tokens_lo=hl,
        requests_hit=(served & (hit_b > 0)).sum(axis=1).astype(np.int32),
        max_occupancy=wa(rs[:, :, KVMAX]).astype(np.int32), occupancy=wa(rs[:, :, CACHED]).astype(np.int32),
        requests_per_replica=rpr, ttft_p50_ms=_pct(srt_t, nl, 50, size), ttft_p90_ms=_pct(srt_t, nl, 90, size),
        ttft_p99_ms=_pct(srt_t, nl, 99, size), ttft_mean_ms=nan, busy_ms=busy_ms,
        utilisation=np.full((G, R), np.nan, np.float32), load_imbalance=nan, prefix_copies=nan, overflow_share=nan,
        queue_overflow=wa(rs[:, :, DROPPED]).sum(axis=1).astype(np.int32),
        time_overflow=np.any(rs[:, :, TOVER] != 0, axis=1) | np.any(rs[:, :, STUCK] != 0, axis=1),
        hit_blocks=per_req(hit_b, 0), hit_tokens=per_req(hit_tok, 0), replica=per_req(repof, -1),
        ttft_ms=per_req(ttft_ms, -1),
        match=np.zeros((G, no if st.per_request else 0, R), np.int32),
        replicas_over_bound=(P["replicas"] > R) | (P["replicas"] < 1),
        tpot_mean_ms=nan, e2e_p50_ms=_pct(srt_e, nl, 50, size), e2e_p90_ms=_pct(srt_e, nl, 90, size),
        e2e_p99_ms=_pct(srt_e, nl, 99, size), preemptions=wa(rs[:, :, PREEMPT]).sum(axis=1).astype(np.int32),
        kv_util_mean=nan, kv_util_max=nan, queue_len_mean=nan, throughput_tps=nan,
        dropped=wa(rs[:, :, DROPPED] + rs[:, :, REJECTED]).sum(axis=1).astype(np.int32),
        steps=wa(rs[:, :, STEPS]).sum(axis=1).astype(np.int32),
        events=wa(rs[:, :, EVENTS]).sum(axis=1).astype(np.int32),
        e2e_ms=per_req(e2e_ms, -1), preempted=per_req(npre, 0), client_wait_ms=per_req(arr - arr0[None], 0),
        kv_acc_at=per_req_f(kat[:, :, 0]), q_acc_at=per_req_f(kat[:, :, 1]),
        n_requests=np.full(G, n, np.int32), input_tokens_hi=ih, input_tokens_lo=il, ttft_sum_hi=th, ttft_sum_lo=tl,
        ttft_n=nl.astype(np.int32), busy_time=busy_ms, horizon_time=horizon.astype(np.int32),
        replicas_active=np.clip(P["replicas"], 1, R).astype(np.int32), copies_sum=tot[:, 0].astype(np.int32),
        copies_n=tot[:, 1].astype(np.int32), over_n=tot[:, 2].astype(np.int32), over_q=tot[:, 3].astype(np.int32),
        tpot_ms_hi=qh, tpot_ms_lo=ql, tpot_ns_hi=fh, tpot_ns_lo=fl, tpot_n=multi.sum(axis=1).astype(np.int32),
        output_tokens_hi=oh, output_tokens_lo=ol, kv_capacity=P["capacity"].astype(np.int32),
        kv_acc=np.where(active, fs[:, :, 0], np.float32(0)).astype(np.float32),
        q_acc=np.where(active, fs[:, :, 1], np.float32(0)).astype(np.float32),
        requests_ok=nok.astype(np.int32), requests_timed_out=(status == 1).sum(axis=1).astype(np.int32),
        requests_failed=(n - nok - (status == 1).sum(axis=1)).astype(np.int32), status=per_req(status, 2),
        vllm_counters_hi=vch, vllm_counters_lo=vcl,
    )


rdispatch.bind(sys.modules[__name__])

"""``gie``: the Gateway API Inference Extension (GIE v0.5.1) / llm-d EPP scorers and max-score picker
[``gie_prefix_mode``, ``gie_prefix_w_pct``, ``gie_kv_w_pct``, ``gie_queue_w_pct``, ``gie_window_blocks``,
``gie_load_w_pct``, ``gie_load_threshold``, ``gie_lru_capacity``, ``gie_active_w_pct``, ``gie_active_timeout_ms``,
``gie_cpu_w_pct``, ``gie_cpu_lru_capacity``, ``gie_cpu_tier_w_pct``, ``gie_nohit_w_pct``, ``gie_nohit_lru_size``].

Three scorers, each a score in [0, 1] held as an integer of 1/65536 (``S = 65536``), summed with their
weights (hundredths) and the pod of the highest total picked, ties broken uniformly at random:

* **queue-scorer** (GIE ``plugins/scorer/queue.go``): ``(qmax - queue[r]) / (qmax - qmin)`` over the
  active pods of ``queue`` (the vllm replica's waiting requests, vLLM's ``num_requests_waiting``); every
  pod scores 1 when all are equal. Held as ``floor(S (qmax - q) / (qmax - qmin))``.
* **kv-cache-scorer** (GIE ``plugins/scorer/kvcache.go``, later ``kv-cache-utilization-scorer``):
  ``1 - KV usage`` = ``(capacity - kv_used[r]) / capacity``; ``kv_used`` is the pool's blocks in use by
  running requests (vLLM's ``gpu_cache_usage_perc``; the vllm replica's pinned + working blocks; on the
  fcfs engine ``active_blocks``). Held as ``ratio16(capacity - used, capacity)``.
* **load-aware-scorer** (llm-d ``load_aware.go``): ``0.5 (T - min(queue, T)) / T`` with
  ``T = gie_load_threshold`` (0.5 at an empty queue, 0 from ``T`` on). Held as ``ratio16(T - min(q, T), T) // 2``.
* **active-request-scorer** (llm-d inference scheduler ``pkg/plugins/scorer/active_request.go``, v0.2 to
  v0.6): ``(cmax - c[r]) / cmax`` with ``c`` the requests the EPP sent to pod ``r`` and not yet finished
  (its own tracker: +1 at ``PreRequest``, -1 at ``ResponseComplete``, never the pods' metrics) and ``cmax``
  the largest count; every pod scores 1 when ``cmax = 0`` (a pod with ``c = 0`` scores 1 anyway). Held as
  ``ratio16(cmax - c, cmax)``. ``c`` is ``FleetView.active_req`` (the vllm replica: waiting and running
  requests whose last token has not been sent, routed at or after the tracker's expiry cutoff,
  ``gie_active_timeout_ms``; the fcfs engine: its ``queue``, with no expiry).
* **prefix scorer**, by ``gie_prefix_mode``:

  - ``0`` none (score 0);
  - ``1`` estimate (GIE ``prefix-cache-scorer``): ``matched / total``. On the ``gie_estimate`` view
    (GIE's own index, :mod:`.gie_index`) ``matched = match[r]`` is GIE's count of prompt-byte hashes and
    ``total`` the request's hashes (``FleetView.match_total``). On another view (``approximate``: the
    block index) the prompt is truncated to its first ``W = gie_window_blocks`` blocks (``0``: the
    whole prompt): ``total = min(n, W)``, ``matched = min(match[r], total)``. 0 when ``total = 0``;
  - ``2`` precise (llm-d ``precise-prefix-cache-scorer`` / ``cache_tracking``, on the ``precise``
    view): the longest consecutive prefix ``match[r]``, min-max normalised over the pods with a hit
    (``match > 0``): ``(match - mmin) / (mmax - mmin)``, 1 for every hit pod when they are equal, 0 for
    pods without a hit.

* **CPU-tier prefix scorer** (llm-d's tiered-prefix-cache guide: a second ``approx-prefix-cache-producer``,
  ``cpu-prefix-cache-producer`` with its own ``lruCapacityPerServer``, read by a second ``prefix-cache-scorer``,
  ``cpu-prefix-cache-scorer``, with its own weight ``gie_cpu_w_pct``; 0: off): on the ``gie_estimate`` view a
  second GIE index per pod (:mod:`.gie_index`, ``gie_cpu_lru_capacity`` hashes) over the same hashes, matched
  and fed exactly as the GPU one (the union walk before the decision; the routed request's hashes added to the
  chosen pod's LRU at ``PreRequest``: llm-d-router's ``approximateprefix`` producer, one instance per name).
  It scores ``matched_cpu / total`` like the estimate mode (``FleetView.match_cpu``; on the numba engine packed
  above the GPU count, ``m = gpu + cpu x 2**32``). Nothing tells it what the pods' cpu tiers hold: with a
  capacity above the GPU index's the CPU index holds a superset of it (both LRUs only add, the same hashes in
  the same order), so its score is the hashes the router sent to a pod longer ago than the GPU index remembers.

* **precise view over both tiers** (``gie_cpu_tier_w_pct > 0``; llm-d-router's ``precise-prefix-cache-producer``
  indexing the OffloadingConnector's events as the ``cpu`` tier, ``kvCacheBackendConfigs`` weights gpu 1.0, cpu
  0.8 by default, ``LongestPrefixScorer``): on the ``precise`` view of a run with the replicas' cpu tier
  (:mod:`cacheresearch.tiers.vllm`, the numba vllm backend) ``match[r]`` is the prefix a pod holds in its pool or
  its cpu tier, each block weighing 1 (pool) or ``gie_cpu_tier_w_pct / 100`` (cpu tier; in both tiers the larger,
  llm-d's ``fillMaxWeights``), summed in float64 in block order and truncated (the producer's
  ``int(aggregatedScores[pod])``), then scored by the prefix mode as any match (llm-d-router's
  ``prefix-cache-scorer`` on that producer: mode 1, ``matched / total``; mode 2 min-maxes the truncated sums where
  the older ``precise-prefix-cache-scorer`` min-maxed the float sums). Without a cpu tier (every JAX run) it is
  the pool's prefix, today's view.

* **no-hit-lru-scorer** (llm-d's ``NoHitLRU``, the tiered-prefix-cache guide's later layout; weight
  ``gie_nohit_w_pct``, 0: off): a request is *cold* when no active pod has a hit in the router's view (``match = 0``
  on every pod; on ``gie_estimate`` the GPU index's count, not the CPU-tier one, and ``match <= 1``: GIE v0.5.1's
  ``h0``, the model's hash, is a hash of its own there, which llm-d-router's producer, the one this scorer reads,
  folds into the first block's hash instead, so a match of ``h0`` alone is no hit). Not cold: every pod scores 0.5.
  Cold, with ``R`` active pods (``R = 1``: 1): the pods never given a cold request score ``1 - i / (R - 1)`` in index
  order (``i`` their rank among themselves; llm-d's endpoint order), the others ``1 - (never + pos) / (R - 1)``
  clipped at 0 (``never`` the never-used count, ``pos`` 0 for the pod given a cold request longest ago). Held as
  ``ratio16(R - 1 - rank, R - 1)``. After the pick of a cold request (``PreRequest``, ``lruCache.Add``) the chosen
  pod moves to the LRU's recent end; past ``gie_nohit_lru_size`` pods (llm-d's ``lruSize``, default 1,024) the
  oldest leaves and counts as never used again. The LRU is router state (``sr[r, 0]``: ``i + 1`` of the last cold
  request sent to pod ``r``, 0: none), kept by the numba rule only: with ``gie_nohit_w_pct > 0`` the JAX engine
  refuses the router (``state_knob``) and ``auto`` runs it on numba; at 0 the rule keeps no state and both engines
  run it as before.

``ratio16(a, b) = floor(a' S / b')`` with ``a' = a >> s``, ``b' = b >> s`` and
``s = max(0, bitlen(b) - 15)`` (exact for ``b < 2**15``; integer arithmetic in int32 throughout).

Total ``= gie_prefix_w_pct * prefix + gie_kv_w_pct * kv + gie_queue_w_pct * queue + gie_load_w_pct * load +
gie_active_w_pct * active + gie_cpu_w_pct * cpu + gie_nohit_w_pct * nohit`` (int32: weights are at most 5,000, the
no-hit one 2,000, the seven terms below 2**31).
**max-score-picker**: the pods of the highest total; one of them uniformly at random,
``j = floor(bits[1] * k / 2**32)`` for ``k`` tied pods, the ``j``-th tied pod in index order (GIE shuffles the
pods, then sorts them stably by score). **random-picker** is the ``random`` router. Scores are quantised to
1/65536, so two pods GIE would order by less than that tie here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.routers.common import BIG, Context, scale_bits
from cacheresearch.routers.numba_rules import nb_i32, nb_ratio16, nb_scale
from cacheresearch.routers.registry import Knob, Router, register
from cacheresearch.routers.views import VIEWS

S = 65536  # scores in [0, 1] as integers of 1/S


def ratio16(a, b):
    """``floor(S a / b)`` for ``0 <= a <= b`` (int32), with both shifted right until ``b < 2**15``."""
    a = jnp.asarray(a, jnp.int32)
    b = jnp.maximum(jnp.asarray(b, jnp.int32), 1)
    s = jnp.maximum(0, 32 - jax.lax.clz(b) - 15)
    a2, b2 = a >> s, jnp.maximum(b >> s, 1)
    return (a2 * S) // b2


def rule(ctx: Context):
    """GIE scorers (queue, kv-cache, prefix) and the max-score picker; the no-hit-lru-scorer at weight 0 only
    (its state is the numba rule's: ``check_bounds`` refuses ``gie_nohit_w_pct > 0`` on the JAX engine)."""
    p, m, q, n, act = ctx.params, ctx.m, ctx.q, ctx.n, ctx.active
    # queue-scorer: min-max over the active pods, all equal -> 1
    qmax, qmin = ctx.qmax, ctx.qmin
    qs = jnp.where(qmax > qmin, ((qmax - q) * S) // jnp.maximum(qmax - qmin, 1), S)
    # kv-cache-scorer: 1 - usage
    cap = jnp.maximum(p.capacity, 1)
    used = jnp.clip(jnp.where(act, ctx.kv_used, 0), 0, cap)
    ks = ratio16(cap - used, cap)
    # prefix scorer
    W = p.gie_window_blocks
    total = jnp.where(W > 0, jnp.minimum(n, W), n)
    if ctx.fleet.match_total is not None:  # view gie_estimate: GIE's own hashes, counted by its index
        total = jnp.where(p.view == VIEWS["gie_estimate"], ctx.fleet.match_total, total)
    est = jnp.where(total > 0, ratio16(jnp.minimum(m, total), total), 0)
    hitp = act & (m > 0)
    mmax = jnp.max(jnp.where(hitp, m, 0))
    mmin = jnp.min(jnp.where(hitp, m, BIG))
    pre = jnp.where(hitp, jnp.where(mmax > mmin, ratio16(m - mmin, jnp.maximum(mmax - mmin, 1)), S), 0)
    mode = p.gie_prefix_mode
    ps = jnp.where(mode == 1, est, jnp.where(mode == 2, pre, 0))
    T = jnp.maximum(p.gie_load_threshold, 1)
    ls = ratio16(T - jnp.minimum(q, T), T) // 2
    ar = ctx.active_req  # active-request-scorer: (cmax - c) / cmax, all 1 when cmax = 0
    cmax = jnp.max(ar)
    as_ = jnp.where(cmax > 0, ratio16(cmax - ar, cmax), S)
    score = (p.gie_prefix_w_pct * ps + p.gie_kv_w_pct * ks + p.gie_queue_w_pct * qs + p.gie_load_w_pct * ls
             + p.gie_active_w_pct * as_)
    if ctx.fleet.match_cpu is not None:  # the CPU-tier prefix scorer: matched / total in the CPU index
        tc = ctx.fleet.match_total if ctx.fleet.match_total is not None else total
        mc = jnp.where(act, ctx.fleet.match_cpu, 0)
        cs = jnp.where(tc > 0, ratio16(jnp.minimum(mc, tc), tc), 0)
        score = score + p.gie_cpu_w_pct * cs
    score = jnp.where(act, score, -1)
    tied = act & (score == jnp.max(score))
    k = jnp.sum(tied.astype(jnp.int32))
    j = scale_bits(ctx.req.bits[1], k.astype(jnp.uint32))
    pos = jnp.cumsum(tied.astype(jnp.int32)) - 1
    return jnp.argmax(tied & (pos == j)).astype(jnp.int32)


def numba_rule(i, n, pkh, pkl, bits, nrep, q, m, a, tree, kvu, ac, total, cap, kn, ring, elig, tmpv, sr, sg):
    """The rule above over int64 (int32 products wrapped as the JAX rule's: ``nb_i32``); with
    ``gie_nohit_w_pct > 0`` the no-hit-LRU scorer over ``sr[r, 0]`` (``i + 1`` of the last cold request routed to
    pod ``r``, 0: never; the LRU's order is the stamps' order)."""
    mode, wp, wk, wq, win, wl, thr, wa, wc = kn[0], kn[1], kn[2], kn[3], kn[4], kn[5], kn[6], kn[7], kn[10]
    wn, nsz = kn[13], kn[14]
    qmax, qmin, mmax, mmin, cmax = 0, np.int64(2**31 - 1), 0, np.int64(2**31 - 1), 0
    cold, nu, h0 = True, 0, 1 if total >= 0 else 0  # gie_estimate: h0 (the model's hash) alone is no hit
    for r in range(nrep):
        qmax, qmin = max(qmax, q[r]), min(qmin, q[r])
        cmax = max(cmax, ac[r])
        mg = m[r] & 0xFFFFFFFF  # the GPU view's count (the CPU index's, when on, sits above: m = gpu + cpu x 2**32)
        if mg > 0:
            mmax, mmin = max(mmax, mg), min(mmin, mg)
        if mg > h0:
            cold = False
        nu += 1 if sr[r, 0] == 0 else 0
    c = max(cap, 1)
    tot = min(n, win) if win > 0 else n
    if total >= 0:  # view gie_estimate: GIE's own hashes
        tot = total
    T = max(thr, 1)
    best = np.int64(-(2**62))
    for r in range(nrep):
        mg, mc = m[r] & 0xFFFFFFFF, m[r] >> 32
        qs = nb_i32((qmax - q[r]) * 65536) // max(qmax - qmin, 1) if qmax > qmin else 65536
        ks = nb_ratio16(c - min(max(kvu[r], 0), c), c)
        if mode == 1:
            ps = nb_ratio16(min(mg, tot), tot) if tot > 0 else 0
        elif mode == 2:
            ps = 0 if mg <= 0 else (nb_ratio16(mg - mmin, max(mmax - mmin, 1)) if mmax > mmin else 65536)
        else:
            ps = 0
        ls = nb_ratio16(T - min(q[r], T), T) // 2
        asc = nb_ratio16(cmax - ac[r], cmax) if cmax > 0 else 65536
        cs = nb_ratio16(min(mc, tot), tot) if wc > 0 and tot > 0 else 0
        ns = 0
        if wn > 0:  # no-hit-lru-scorer: 0.5 unless cold; cold: 1 - rank / (n - 1), never-used pods first
            ns = 32768 if not cold else 65536
            if cold and nrep > 1:
                rank = 0
                for x in range(nrep):
                    if sr[r, 0] == 0:  # never used: its index among the never-used pods
                        rank += 1 if x < r and sr[x, 0] == 0 else 0
                    else:  # used: after every never-used pod, then its position in the LRU (oldest first)
                        rank += 1 if 0 < sr[x, 0] < sr[r, 0] else 0
                rank += nu if sr[r, 0] > 0 else 0
                ns = nb_ratio16(nrep - 1 - rank, nrep - 1) if rank < nrep - 1 else 0
        tmpv[r] = nb_i32(wp * ps + wk * ks + wq * qs + wl * ls + wa * asc + wc * cs + wn * ns)
        best = max(best, tmpv[r])
    k = 0
    for r in range(nrep):
        k += 1 if tmpv[r] == best else 0
    j = nb_scale(bits[1], k)
    pick = 0
    for r in range(nrep):
        if tmpv[r] == best:
            if j == 0:
                pick = r
                break
            j -= 1
    if wn > 0 and cold:  # PreRequest: the chosen pod to the LRU's most recent end; past lruSize the oldest leaves
        sr[pick, 0] = i + 1
        used, old = 0, 0
        for x in range(nrep):
            if sr[x, 0] > 0:
                used += 1
                old = x if sr[old, 0] == 0 or sr[x, 0] < sr[old, 0] else old
        if used > nsz:
            sr[old, 0] = 0
    return pick


KNOBS = (
    Knob("gie_prefix_mode", 0, 0, 2, doc="prefix scorer: 0 none, 1 estimate (matched / total: GIE's hashes on "
         "view gie_estimate, else over the first gie_window_blocks blocks), 2 precise (longest prefix, min-max "
         "over pods with a hit)"),
    Knob("gie_prefix_w_pct", 100, 0, 5000, doc="weight of the prefix scorer", unit="1/100"),
    Knob("gie_kv_w_pct", 100, 0, 5000, doc="weight of the kv-cache scorer (1 - KV usage)", unit="1/100"),
    Knob("gie_queue_w_pct", 100, 0, 5000, doc="weight of the queue scorer (min-max of waiting requests)",
         unit="1/100"),
    Knob("gie_window_blocks", 0, 0, 2**31 - 2, doc="estimate mode: the prompt's first W blocks are matched "
         "(GIE maxPrefixBlocksToMatch x hashBlockSize bytes, in cache blocks); 0: the whole prompt",
         unit="blocks"),
    Knob("gie_load_w_pct", 0, 0, 5000, doc="weight of llm-d's load-aware scorer", unit="1/100"),
    Knob("gie_load_threshold", 128, 1, 2**20, doc="load-aware scorer: the score falls from 0.5 at an empty "
         "queue to 0 at this many waiting requests", unit="requests"),
    Knob("gie_active_w_pct", 0, 0, 5000, doc="weight of llm-d's active-request scorer ((cmax - c) / cmax over the "
         "requests the EPP sent to each pod and not finished)", unit="1/100"),
    Knob("gie_active_timeout_ms", 120_000, 0, 2**31 - 2, doc="active-request scorer: the tracker's requestTimeout "
         "(llm-d's default 2 min): a request routed before (floor(now / T) - 1) T is no longer counted (its TTL "
         "entry expired at a cleanup tick every T); 0: never expires", unit="ms"),
    Knob("gie_lru_capacity", 31_250, 1, 2**31 - 2, doc="view gie_estimate: hashes per pod in GIE's prefix index "
         "LRU (lruCapacityPerServer; GIE v0.5.1's default 31,250)", unit="hashes"),
    Knob("gie_cpu_w_pct", 0, 0, 5000, doc="weight of llm-d's CPU-tier prefix scorer (the tiered-prefix-cache guide's "
         "cpu-prefix-cache-scorer over a second approx-prefix-cache-producer: matched / total in a second GIE "
         "index, view gie_estimate); 0: off", unit="1/100"),
    Knob("gie_cpu_lru_capacity", 31_250, 1, 2**31 - 2, doc="the CPU-tier scorer's index: hashes per pod in its LRU "
         "(the CPU producer's lruCapacityPerServer; llm-d's default 31,250)", unit="hashes"),
    Knob("gie_cpu_tier_w_pct", 0, 0, 5000, doc="view precise with the replicas' cpu tier (numba vllm backend): llm-d's "
         "precise producer's weight of a block a pod holds only in its cpu tier (kvCacheBackendConfigs cpu; llm-d's "
         "default 0.8 = 80); the match is int(sum of tier weights along the prefix held in either tier); 0: the cpu "
         "tier unseen", unit="1/100"),
    Knob("gie_nohit_w_pct", 0, 0, 2000, doc="weight of llm-d's no-hit-lru-scorer (a request no pod has a prefix hit "
         "for goes to the pods least recently given such a request: 1 - rank / (n - 1); 0.5 for every pod otherwise); "
         "the router then keeps state (numba engines only); 0: off", unit="1/100"),
    Knob("gie_nohit_lru_size", 1024, 1, 2**31 - 2, doc="the no-hit-lru-scorer's lruSize: pods its LRU remembers "
         "(llm-d's default 1,024); a pod pushed out counts as never used", unit="pods"),
)

ROUTER = register(Router(
    name="gie", id=10, rule=rule, knobs=KNOBS, reads_cache=True, reads_load=True,
    summary="max-score picker (uniform ties) over ``w_p prefix + w_kv (1 - KV usage) + w_q (qmax - q) / "
    "(qmax - qmin)``; prefix = matched / total in a window (estimate) or min-max longest prefix (precise); "
    "llm-d's CPU-tier prefix scorer ``w_c matched_cpu / total`` over a second index; llm-d's no-hit-lru-scorer "
    "(state: numba only)",
    source="Gateway API Inference Extension v0.5.1 scorers; llm-d inference scheduler v0.2 precise scorer; "
    "llm-d tiered-prefix-cache guide (llm-d-router approx / precise prefix-cache producers)",
    doc=__doc__, numba=numba_rule, state_replica=1, state_knob="gie_nohit_w_pct",
))

"""Metrics of a run: the ``Metrics`` record, exact two-limb integer sums, nearest-rank percentiles and
:func:`finalize`, which divides the ratios and means on the host in float64 from the exact sums (so a
ratio is bitwise the same on any batch, chunk, padding or device count)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Metrics", "RATIO_FIELDS", "combine_limbs", "sum_limbs", "add_limbs", "percentile", "finalize", "LIMB",
           "hit_tokens"]

LIMB = 20  # token counters: value = hi * 2**20 + lo


class Metrics(NamedTuple):
    """A run's metrics. The ratio and mean fields (:data:`RATIO_FIELDS`) are not computed by the compiled
    program: it returns exact integer sums (the fields after ``q_acc_at``) and :func:`finalize` divides
    them on the host in float64, so a ratio is bitwise the same whatever the batch, chunk, padding or
    device count (XLA may compile one division as a multiply by a reciprocal in one program and not in
    another). :func:`simulate`, :func:`simulate_grid` and :func:`~cacheresearch.core.run.simulate_cells`
    return finalized metrics (NumPy; under an outer trace, float32 jnp computed by the same formulas)."""

    token_hit_rate: jax.Array  # float64: hit tokens / input tokens (0 without input)
    request_hit_rate: jax.Array  # float64: requests_hit / n_requests
    hit_tokens_hi: jax.Array  # int32 limbs of total hit tokens (see combine_limbs)
    hit_tokens_lo: jax.Array
    requests_hit: jax.Array  # int32
    # Occupancy counts stored blocks. LRU policies evict down to the capacity; TTL policies and
    # ``unbounded`` never evict, so there an expired block stays stored (invisible to lookups)
    # until it is rewritten: for them these count every distinct block ever written.
    max_occupancy: jax.Array  # int32 [R_max]: most blocks stored at once after a request
    occupancy: jax.Array  # int32 [R_max]: blocks stored at the end
    requests_per_replica: jax.Array  # int32 [R_max]
    # load and latency (docs/fleet_semantics.md)
    ttft_p50_ms: jax.Array  # int32 nearest-rank percentiles of time to first token (-1 with queue=False)
    ttft_p90_ms: jax.Array
    ttft_p99_ms: jax.Array
    ttft_mean_ms: jax.Array  # float64: ttft_sum / ttft_n (NaN with queue=False)
    busy_ms: jax.Array  # int32 [R_max]: prefill + decode time served
    utilisation: jax.Array  # float64 [R_max]: busy_time / horizon_time
    load_imbalance: jax.Array  # float64: max / mean busy_ms over active replicas (1 when all are 0)
    # float64: mean replicas holding a request's whole routing prefix at arrival (NaN unless match)
    prefix_copies: jax.Array
    # float64: requests sent away from the replica holding most of their prefix (NaN unless match)
    overflow_share: jax.Array
    queue_overflow: jax.Array  # int32: dispatches that found every queue slot in flight (loads undercount)
    time_overflow: jax.Array  # bool: a finish time saturated at 2**31 - 1 ms (fcfs ms, vllm ps clock)
    # per request (empty arrays unless per_request=True)
    hit_blocks: jax.Array  # int32 [N]
    hit_tokens: jax.Array  # int32 [N]
    replica: jax.Array  # int32 [N]
    ttft_ms: jax.Array  # int32 [N]
    match: jax.Array  # int32 [N, R_max]: the router's view of the prefix match (0 unless match)
    replicas_over_bound: jax.Array  # bool: params asked for more replicas than max_replicas (a bug)
    # the vllm replica (replica/vllm.py; NaN / -1 / 0 with the fcfs replica). Latency metrics leave out
    # requests arriving within warmup_ms of the first arrival and requests never served.
    # float64 time per output token after the first (whole ns per request), mean over requests with >= 2
    tpot_mean_ms: jax.Array
    e2e_p50_ms: jax.Array  # int32 arrival to last token
    e2e_p90_ms: jax.Array
    e2e_p99_ms: jax.Array
    preemptions: jax.Array  # int32 preemptions (recompute)
    kv_util_mean: jax.Array  # float64 blocks in use / capacity, time average over the run, mean over replicas
    kv_util_max: jax.Array  # float64 the most blocks in use / capacity on any replica
    queue_len_mean: jax.Array  # float64 waiting requests per replica, time average
    throughput_tps: jax.Array  # float64 output tokens per second of the run
    dropped: jax.Array  # int32 requests not served: waiting ring full (engine.queue_slots) or larger than the pool
    steps: jax.Array  # int32 engine steps over all replicas
    # int32 replica events over all replicas: the iterations of each replica's event loop (replica/vllm.py
    # _advance), each either one decode-only stretch (>= 1 engine steps taken at once, up to the next
    # arrival, finish or block allocation the pool cannot serve) or one ordinary engine step (admission,
    # prefill chunk, release of finished requests, preemption; a step that schedules nothing counts too).
    # A batch of configurations costs about its events, not its steps. 0 with the fcfs replica (not counted).
    events: jax.Array
    e2e_ms: jax.Array  # int32 [N] per request (empty unless per_request)
    preempted: jax.Array  # int32 [N] per request
    # int32 [N] the vllm replica under the client's permits (client_permits > 0): how long a request waited in the
    # client for a permit after its scheduled arrival (its send = arrival + this; ttft_ms and e2e_ms count from
    # the send, as inference-perf times a request); 0 in an open loop (empty unless per_request)
    client_wait_ms: jax.Array
    # float32 [N] the vllm replica: kv_acc / q_acc summed over the active replicas when request i arrives
    # (after the replicas ran up to it; per-window time means by differences; empty unless per_request)
    kv_acc_at: jax.Array
    q_acc_at: jax.Array
    # exact sums behind the ratio fields (int32; ``_hi``/``_lo`` pairs are two limbs, :func:`combine_limbs`)
    n_requests: jax.Array  # real requests
    input_tokens_hi: jax.Array  # input tokens of the real requests
    input_tokens_lo: jax.Array
    ttft_sum_hi: jax.Array  # sum of ttft_ms over the requests of the mean
    ttft_sum_lo: jax.Array
    ttft_n: jax.Array  # those requests (fcfs: every real request; vllm: served, past warmup_ms)
    busy_time: jax.Array  # [R_max] busy time in ms (= busy_ms; vllm: its exact ps clock rounded up to ms)
    horizon_time: jax.Array  # the run's horizon in ms (>= 1)
    replicas_active: jax.Array  # replicas of the configuration (clipped to [1, R_max])
    copies_sum: jax.Array  # prefix copies summed over the sampled requests
    copies_n: jax.Array  # sampled requests (those with blocks)
    over_n: jax.Array  # requests sent away from the replica holding most of their prefix
    over_q: jax.Array  # requests with a cached prefix somewhere
    # the vllm replica (0 with the fcfs replica)
    tpot_ms_hi: jax.Array  # sum over TPOT requests of the whole ms of (decode time / (output tokens - 1))
    tpot_ms_lo: jax.Array
    tpot_ns_hi: jax.Array  # sum of the ns below those ms, floored: TPOT = whole ns per request
    tpot_ns_lo: jax.Array
    tpot_n: jax.Array  # requests of the TPOT mean (past warmup_ms, >= 2 output tokens)
    output_tokens_hi: jax.Array  # output tokens of the served requests
    output_tokens_lo: jax.Array
    kv_capacity: jax.Array  # KV pool blocks per replica (params.capacity)
    kv_acc: jax.Array  # float32 [R_max] blocks in use x ms per replica (replica/vllm.py Stats; 0 when inactive)
    q_acc: jax.Array  # float32 [R_max] waiting requests x ms per replica
    # the vllm replica's client outcome (inference-perf: a request with no error is a success; client_timeout_ms):
    # requests that finished by their deadline, that timed out (the client gave up; vLLM aborted or finished them
    # late), that failed (never served: waiting queue full or larger than the pool); latency and throughput count
    # the successes only. fcfs: every request a success.
    requests_ok: jax.Array  # int32
    requests_timed_out: jax.Array  # int32
    requests_failed: jax.Array  # int32
    status: jax.Array  # int32 [N] 0 ok, 1 timed out, 2 failed (empty unless per_request)
    # vLLM's own prefix-cache counters in tokens, as the configuration's counter_mode counts them (numba vllm
    # backend; 0 elsewhere): vllm:prefix_cache_queries, vllm:prefix_cache_hits, vllm:external_prefix_cache_queries,
    # vllm:external_prefix_cache_hits, int32 [4] limbs (combine_limbs)
    vllm_counters_hi: jax.Array
    vllm_counters_lo: jax.Array


#: The fields :func:`finalize` computes from the sums (the compiled program leaves them NaN).
RATIO_FIELDS = ("token_hit_rate", "request_hit_rate", "ttft_mean_ms", "utilisation", "load_imbalance",
                "prefix_copies", "overflow_share", "tpot_mean_ms", "kv_util_mean", "kv_util_max",
                "queue_len_mean", "throughput_tps")


def combine_limbs(hi, lo) -> np.ndarray:
    """Exact int64 totals from the engine's two-limb counters."""
    return (np.asarray(hi).astype(np.int64) << LIMB) + np.asarray(lo).astype(np.int64)


def sum_limbs(x: jax.Array):
    """Exact sum of non-negative int32 values (fewer than 2**29 of them) as two limbs ``(hi, lo)``,
    ``lo < 2**20`` (:func:`combine_limbs`). Integer sums do not depend on the reduction order, so the
    total is the same in every program. Blocks of 2**15 values: 16-bit halves summed per block (< 2**31),
    the block sums' halves summed over blocks, then ``A0 + 2**16 (A1 + B0) + 2**32 B1`` in limbs."""
    x = x.reshape(-1)
    B = max(1, min(1 << 15, x.shape[0]))
    x = jnp.pad(x, (0, -x.shape[0] % B)).reshape(-1, B)
    h0 = jnp.sum(x & 0xFFFF, axis=1)  # < 2**15 * 2**16
    h1 = jnp.sum(x >> 16, axis=1)  # < 2**15 * 2**15
    a0, a1 = jnp.sum(h0 & 0xFFFF), jnp.sum(h0 >> 16)
    b0, b1 = jnp.sum(h1 & 0xFFFF), jnp.sum(h1 >> 16)
    mid = a1 + b0  # weight 2**16
    mask = (1 << LIMB) - 1
    lo = (a0 & mask) + ((mid & 15) << 16)
    hi = (a0 >> LIMB) + (mid >> 4) + (b1 << (32 - LIMB)) + (lo >> LIMB)
    return hi.astype(jnp.int32), (lo & mask).astype(jnp.int32)


def _is_traced(m) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(m))


def finalize(m: Metrics, st) -> Metrics:
    """The ratio and mean fields (:data:`RATIO_FIELDS`) from the exact sums, on the host in float64.

    Works on any leading batch axes (cells, streams x configurations). Concrete metrics come back as
    NumPy; under an outer trace (``jax.jit`` around :func:`simulate`) the same formulas run in jnp float32.
    ``st`` says what the program computed: NaN for TTFT mean and load imbalance with ``queue=False``,
    for prefix copies and overflow share without ``match``, for the vllm replica's fields with fcfs.
    """
    if _is_traced(m):
        xp, ft = jnp, jnp.float32

        def total(hi, lo):
            return hi.astype(ft) * float(1 << LIMB) + lo.astype(ft)
    else:
        m = jax.device_get(m)
        xp, ft = np, np.float64

        def total(hi, lo):
            return combine_limbs(hi, lo).astype(ft)

    def f(x):
        return xp.asarray(x).astype(ft)

    def at_least_1(x):
        return xp.maximum(f(x), 1.0)

    nan = xp.full(xp.shape(m.n_requests), xp.nan, ft)
    inp = total(m.input_tokens_hi, m.input_tokens_lo)
    hit = total(m.hit_tokens_hi, m.hit_tokens_lo)
    hz = at_least_1(m.horizon_time)
    n_rep = at_least_1(m.replicas_active)
    R = xp.shape(m.busy_ms)[-1]
    active = xp.arange(R) < xp.asarray(m.replicas_active)[..., None]
    bms = xp.where(active, f(m.busy_ms), 0.0)
    sum_b = xp.sum(bms, axis=-1)
    imb = xp.where(sum_b > 0, xp.max(bms, axis=-1) * n_rep / xp.maximum(sum_b, 1.0), 1.0)
    out = dict(
        token_hit_rate=xp.where(inp > 0, hit / xp.maximum(inp, 1.0), 0.0),
        request_hit_rate=f(m.requests_hit) / at_least_1(m.n_requests),
        ttft_mean_ms=total(m.ttft_sum_hi, m.ttft_sum_lo) / at_least_1(m.ttft_n) if st.queue else nan,
        utilisation=f(m.busy_time) / hz[..., None],
        load_imbalance=imb if st.queue else nan,
        prefix_copies=f(m.copies_sum) / at_least_1(m.copies_n) if st.match else nan,
        overflow_share=f(m.over_n) / at_least_1(m.over_q) if st.match else nan,
    )
    if st.scheduler == "vllm":
        cap = at_least_1(m.kv_capacity)
        tpot_ns = total(m.tpot_ms_hi, m.tpot_ms_lo) * 1e6 + total(m.tpot_ns_hi, m.tpot_ns_lo)
        out.update(
            tpot_mean_ms=tpot_ns / at_least_1(m.tpot_n) / 1e6,
            kv_util_mean=xp.sum(f(m.kv_acc), axis=-1) / (cap * hz * n_rep),
            kv_util_max=xp.max(f(m.max_occupancy), axis=-1) / cap,
            queue_len_mean=xp.sum(f(m.q_acc), axis=-1) / (hz * n_rep),
            throughput_tps=total(m.output_tokens_hi, m.output_tokens_lo) / (hz / 1000.0),
        )
    else:
        out.update(tpot_mean_ms=nan, kv_util_mean=nan, kv_util_max=nan, queue_len_mean=nan, throughput_tps=nan)
    return m._replace(**out)



def add_limbs(hi, lo, add):
    mask = (1 << LIMB) - 1
    lo = lo + (add & mask)  # < 2**21: no overflow
    return hi + (add >> LIMB) + (lo >> LIMB), lo & mask


def percentile(sorted_vals, count, p, size):
    """Nearest-rank percentile ``p`` of the first ``count`` of ``sorted_vals`` (0 when empty)."""
    k = jnp.clip((p * count + 99) // 100 - 1, 0, max(size - 1, 0))
    return jnp.where(count > 0, sorted_vals[k] if size > 0 else 0, 0).astype(jnp.int32)


def hit_tokens(hit_blocks, block_tokens, input_tokens, xp=jnp):
    """Input tokens served from cache: ``min(hit_blocks * block_tokens, input_tokens)`` (a request's last
    block may be partial), without overflowing int32: past ``input // block`` full blocks it is the input.
    ``xp``: ``jnp`` (the engines) or ``np`` (studies on the host)."""
    return xp.where(hit_blocks > input_tokens // block_tokens, input_tokens, hit_blocks * block_tokens)


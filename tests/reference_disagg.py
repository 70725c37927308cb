"""Plain-Python reference of a disaggregated fleet (cacheresearch/fleet/disagg.py, docs/disagg_semantics.md).

Request by request, with lists: the prefill pool and the decode pool are each the vllm replica's reference
(``tests/reference_batch.py``), composed here:

* the prefill pool serves every request with one output token; a request is done at the whole ms at or after
  the step that emits it (its end-to-end time from the arrival);
* its KV (``ceil(input / B)`` blocks x ``block_bytes``) goes on its link (``mode="prefill"``: its prefill
  worker's; ``"shared"``: the one link), the transfers of a link one after another in order of (done, request):
  a transfer starts when it is done and the link is free (ns), holds the link ``ceil(bytes x 1000 / mbps)`` ns,
  lands ``latency_ns`` after it leaves; the decode pool sees it at the whole ms at or after it lands;
* the decode pool serves the landed requests in order of (landing ms, request) with all their output tokens,
  each importing ``input`` tokens of KV (``reference_batch(..., imported=)``);
* TTFT and end-to-end time run from the original arrival; a request the prefill pool dropped is -1.

An aggregated fleet (``pd=None``) is ``reference_batch`` on the whole fleet.
"""

from __future__ import annotations

from reference_batch import reference_batch

from cacheresearch.workload import Workload


def _cdiv(a, b):
    return -(-a // b)


def reference_link(done_ms, worker, nbytes, *, mbps, latency_ns, mode):
    """Landing times (ns) of the transfers; -1 for a request not sent (``done_ms < 0``)."""
    free = {}
    land = [-1] * len(done_ms)
    for d, i in sorted((int(d), i) for i, d in enumerate(done_ms) if d >= 0):
        k = int(worker[i]) if mode == "prefill" else 0
        start = max(d * 1_000_000, free.get(k, 0))
        free[k] = start + _cdiv(int(nbytes[i]) * 1000, mbps)
        land[i] = free[k] + latency_ns
    return land


def reference_disagg(wl: Workload, *, pd, prefill: dict, decode: dict, mbps=50_000, latency_ns=10_000,
                     mode="prefill", block_bytes=1, bits=None):
    """Per request: ttft_ms, e2e_ms, prefill hit blocks and replica, decode replica, prefill done and KV landing
    (ms); totals: preemptions and drops of both pools. ``prefill`` / ``decode``: ``reference_batch`` keyword
    arguments for each pool (``pd=None``: ``decode`` is the aggregated fleet); ``bits(n)``: the random words of
    an ``n``-request run."""
    N = wl.n_requests
    arr = [int(a) for a in wl.arrival_ms]
    if pd is None:
        r = reference_batch(wl, replicas=decode.pop("replicas"), bits=None if bits is None else bits(N), **decode)
        return dict(ttft_ms=list(r["ttft_ms"]), e2e_ms=list(r["e2e_ms"]), prefill_hit_blocks=list(r["hit_blocks"]),
                    prefill_replica=list(r["replica"]), decode_replica=[-1] * N,
                    preemptions=r["preemptions"], dropped=r["dropped"])
    P, D = pd
    pw = Workload(wl.arrival_ms, wl.input_tokens, [1] * N, wl.tenant, wl.keys, wl.offsets, wl.block_tokens)
    rp = reference_batch(pw, replicas=P, bits=None if bits is None else bits(N), **prefill)
    done = [arr[i] + int(rp["e2e_ms"][i]) if rp["e2e_ms"][i] >= 0 else -1 for i in range(N)]
    B = int(wl.block_tokens)
    nbytes = [_cdiv(int(wl.input_tokens[i]), B) * block_bytes for i in range(N)]
    land = reference_link(done, rp["replica"], nbytes, mbps=mbps, latency_ns=latency_ns, mode=mode)
    karr = [_cdiv(x, 1_000_000) if x >= 0 else -1 for x in land]
    order = [i for _, i in sorted((karr[i], i) for i in range(N) if karr[i] >= 0)]
    keys = [[int(k) for k in wl.request_keys(i)] for i in order]
    dw = Workload.from_lists(keys, block_tokens=B, arrival_ms=[karr[i] for i in order],
                             input_tokens=[int(wl.input_tokens[i]) for i in order],
                             output_tokens=[int(wl.output_tokens[i]) for i in order],
                             tenant=[int(wl.tenant[i]) for i in order])
    n = len(order)
    rd = reference_batch(dw, replicas=D, bits=None if bits is None else bits(n),
                         imported=[int(wl.input_tokens[i]) for i in order], **decode) if n else None
    ttft, e2e, drep = [-1] * N, [-1] * N, [-1] * N
    for j, i in enumerate(order):
        if rd["ttft_ms"][j] >= 0:
            ttft[i] = karr[i] + int(rd["ttft_ms"][j]) - arr[i]
            drep[i] = int(rd["replica"][j])
        if rd["e2e_ms"][j] >= 0:
            e2e[i] = karr[i] + int(rd["e2e_ms"][j]) - arr[i]
    return dict(ttft_ms=ttft, e2e_ms=e2e, prefill_hit_blocks=[int(x) for x in rp["hit_blocks"]],
                prefill_replica=[int(x) for x in rp["replica"]], decode_replica=drep, prefill_done_ms=done,
                kv_arrival_ms=karr, preemptions=rp["preemptions"] + (rd["preemptions"] if rd else 0),
                dropped=rp["dropped"] + (rd["dropped"] if rd else 0))

"""Prefill/decode disaggregation on the vllm replica: a prefill pool, a KV link, a decode pool.

The semantics are ``docs/disagg_semantics.md``; the plain-Python reference is ``tests/reference_disagg.py``
(``tests/test_disagg.py`` holds the two equal request by request). A disaggregated fleet is two pools of the
vllm replica (:mod:`cacheresearch.backends.numba_vllm`, the same engine as an aggregated fleet, nothing
re-implemented) composed in time order, which is exact because nothing flows back from decode to prefill
(no backpressure is modelled):

1. **prefill pool** (``prefill.replicas`` workers, their routers, prefix caches and step model): every request
   with one output token (the prefill worker's part); it is done at the step that emits that token
   (whole ms, rounded up);
2. **KV link**: the request's blocks (``ceil(input / block_tokens)``) x ``block_bytes`` move to the decode pool;
   transfers on one link go one at a time, FIFO in order of (prefill done, request), each occupying the link
   for ``ceil(bytes x 1000 / MB/s)`` ns and arriving ``latency`` later (:func:`link_arrivals`); ``link="prefill"``
   gives each prefill worker its own link (its NIC), ``"shared"`` one link for the fleet;
3. **decode pool** (``decode.replicas`` workers, a load router): the request arrives when its KV has landed
   (whole ms, rounded up) with its prompt's KV imported (``run_stream(..., imported=)``: its first admission
   counts all but the last prompt token as computed, vLLM's rule that the last prompt token is recomputed for
   its logits) and decodes all its output tokens there.

TTFT = the decode pool's first token - the arrival; ITL = (end - first token) / (output - 1). Requests the
prefill pool drops never reach the decode pool (TTFT -1). An aggregated fleet (``pd=None``) runs the same
engine once, unchanged. :func:`pd_shape` and :class:`KvLink` give one-line errors for impossible shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cacheresearch.core.stream import compile_stream
from cacheresearch.workload import Workload

__all__ = ["KvLink", "LINK_MODES", "DisaggCell", "DisaggResult", "pd_shape", "link_arrivals", "prefill_workload",
           "decode_workload", "simulate_disagg", "DisaggError"]

#: ``prefill``: one link per prefill worker (its NIC; transfers from one worker serialize); ``shared``: one link.
LINK_MODES = ("prefill", "shared")


class DisaggError(ValueError):
    """An impossible disaggregated shape or link (one line, naming the key)."""


def pd_shape(spec, where: str = "grid.pd") -> tuple[int, int] | None:
    """``"agg"`` -> None (aggregated); ``"P:D"`` -> (P, D) prefill and decode workers, each >= 1."""
    s = str(spec).strip()
    if s == "agg":
        return None
    parts = s.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise DisaggError(f"{where}: {spec!r} is not 'agg' or 'P:D' (prefill:decode workers, e.g. '2:6')")
    p, d = int(parts[0]), int(parts[1])
    if d < 1:
        raise DisaggError(f"{where}: {spec!r} has 0 decode workers; a disaggregated fleet needs at least 1")
    if p < 1:
        raise DisaggError(f"{where}: {spec!r} has 0 prefill workers; a disaggregated fleet needs at least 1")
    return p, d


@dataclass(frozen=True)
class KvLink:
    """The KV link from the prefill to the decode pool: bandwidth (GB/s = 1e9 bytes/s), latency per transfer
    (us), mode (:data:`LINK_MODES`). Checked at construction (one-line :class:`DisaggError`)."""

    gbps: float = 50.0
    latency_us: float = 10.0
    mode: str = "prefill"

    def __post_init__(self):
        if not np.isfinite(self.gbps) or self.gbps <= 0 or round(self.gbps * 1000) < 1:
            raise DisaggError(f"disagg.link_gbps: a link of {self.gbps!r} GB/s moves no KV; give at least 0.001")
        if not np.isfinite(self.latency_us) or self.latency_us < 0:
            raise DisaggError(f"disagg.link_latency_us: must be >= 0, got {self.latency_us!r}")
        if self.mode not in LINK_MODES:
            raise DisaggError(f"disagg.link: {self.mode!r}; choose one of {', '.join(LINK_MODES)}")

    @property
    def mbps(self) -> int:
        """MB/s (= bytes per us), integer."""
        return int(round(self.gbps * 1000))

    @property
    def latency_ns(self) -> int:
        return int(round(self.latency_us * 1000))


class DisaggCell(NamedTuple):
    """One configuration: the prefill pool's Params (``None``: aggregated, ``decode`` is the whole fleet), the
    decode pool's Params, the link and the bytes of one KV block."""

    prefill: object
    decode: object
    link: KvLink | None = None
    block_bytes: int = 0


class DisaggResult(NamedTuple):
    cells: list
    ttft_ms: np.ndarray  # int64 [G, N] from the arrival to the first token (-1: dropped)
    e2e_ms: np.ndarray  # int64 [G, N] from the arrival to the last token (-1: dropped)
    prefill_hit_blocks: np.ndarray  # int64 [G, N] prefix hit where the prompt was computed
    prefill_replica: np.ndarray  # int64 [G, N] (aggregated: the replica)
    decode_replica: np.ndarray  # int64 [G, N] (-1: aggregated or dropped)
    prefill_done_ms: np.ndarray  # int64 [G, N] (aggregated: the first token)
    kv_arrival_ms: np.ndarray  # int64 [G, N] KV landed on the decode pool (aggregated: the first token)
    preemptions: np.ndarray  # int64 [G] both pools
    dropped: np.ndarray  # int64 [G] both pools
    gpus: np.ndarray  # int64 [G] workers (replicas) in the fleet


def link_arrivals(done_ms: np.ndarray, worker: np.ndarray, nbytes: np.ndarray, link: KvLink) -> np.ndarray:
    """When each transfer lands (ns): requests with ``done_ms >= 0`` go on their link (the prefill worker's, or
    the one shared link) FIFO in order of (done, index); a transfer starts at ``max(done, link free)``, holds the
    link ``ceil(bytes x 1000 / MB/s)`` ns and lands ``latency_ns`` after it leaves the link. -1: not sent."""
    n = done_ms.shape[0]
    out = np.full(n, -1, np.int64)
    ok = np.nonzero(done_ms >= 0)[0]
    order = ok[np.lexsort((ok, done_ms[ok]))]
    free: dict[int, int] = {}
    mb = link.mbps
    for i in order.tolist():
        k = int(worker[i]) if link.mode == "prefill" else 0
        start = max(int(done_ms[i]) * 1_000_000, free.get(k, 0))
        free[k] = start + (int(nbytes[i]) * 1000 + mb - 1) // mb
        out[i] = free[k] + link.latency_ns
    return out


def prefill_workload(wl: Workload) -> Workload:
    """``wl`` with one output token a request: the prefill pool's part."""
    return Workload(wl.arrival_ms, wl.input_tokens, np.ones(wl.n_requests, np.int64), wl.tenant, wl.keys, wl.offsets,
                    wl.block_tokens, name=wl.name + "/prefill", meta=dict(wl.meta))


def decode_workload(wl: Workload, arrive_ms: np.ndarray) -> tuple[Workload, np.ndarray]:
    """The requests with ``arrive_ms >= 0`` in order of (arrival, index), arriving then: (workload, their
    indices in ``wl``)."""
    ok = np.nonzero(arrive_ms >= 0)[0]
    idx = ok[np.lexsort((ok, arrive_ms[ok]))]
    nb = wl.n_blocks[idx]
    offs = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    keys = np.concatenate([wl.request_keys(int(i)) for i in idx]) if idx.size else np.zeros(0, np.uint64)
    return Workload(arrive_ms[idx], wl.input_tokens[idx], wl.output_tokens[idx], wl.tenant[idx], keys, offs,
                    wl.block_tokens, name=wl.name + "/decode", meta=dict(wl.meta)), idx


def _static(params: list, s, *, S: int, Q: int):
    from cacheresearch.core.simulate import static_options  # noqa: PLC0415

    R = max(int(p.replicas) for p in params)
    views = {int(p.view) for p in params}
    return static_options(params[0], max_replicas=R, per_request=True, scheduler="vllm", max_running=S,
                          queue_slots=Q, max_runs=int(np.max(np.asarray(s.n_runs), initial=1)), index=1 in views,
                          stale=2 in views, max_instances=max(int(p.instances) for p in params))


def _run(w: Workload, params: list, key, *, S: int, Q: int, imported=None):
    """One call of the numba vllm backend: per-request (ttft, e2e, hit blocks, replica) [G, n], preemptions and
    drops [G]."""
    from cacheresearch.backends import numba_vllm as nv  # noqa: PLC0415 - imports numba itself

    n = w.n_requests
    if n == 0:
        z = np.zeros((len(params), 0), np.int64)
        return z, z, z, z, np.zeros(len(params), np.int64), np.zeros(len(params), np.int64)
    s = compile_stream(w, stateful_singletons=True)
    m = nv.run_stream(s, params, [key] * len(params), _static(params, s, S=S, Q=Q), imported=imported)
    a = [np.asarray(getattr(m, f))[:, :n].astype(np.int64) for f in ("ttft_ms", "e2e_ms", "hit_blocks", "replica")]
    return (*a, np.asarray(m.preemptions).astype(np.int64), np.asarray(m.dropped).astype(np.int64))


def _grouped(items: list, pick) -> dict:
    """Positions of ``items`` grouped by ``pick(item)`` (one engine call a group)."""
    groups: dict = {}
    for j, x in enumerate(items):
        groups.setdefault(pick(x), []).append(j)
    return groups


def simulate_disagg(wl: Workload, cells: list[DisaggCell], *, key=None, max_running: int = 256,
                    queue_slots: int = 4096) -> DisaggResult:
    """Every cell over ``wl``: the distinct prefill pools of the disaggregated cells in one engine call (cells
    that differ only in link or decode pool share it), the aggregated cells in another, then per distinct KV
    arrival sequence one decode call (cells sharing it run together)."""
    import jax  # noqa: PLC0415

    if not cells:
        raise DisaggError("disagg: no configurations")
    key = jax.random.key(0) if key is None else key
    G, N = len(cells), wl.n_requests
    out = {k: np.full((G, N), -1, np.int64) for k in ("ttft", "e2e", "phit", "prep", "drep", "pdone", "karr")}
    pre, drop = np.zeros(G, np.int64), np.zeros(G, np.int64)
    agg = [g for g, c in enumerate(cells) if c.prefill is None]
    dis = [g for g, c in enumerate(cells) if c.prefill is not None]
    if agg:
        t, e, h, r, p, d = _run(wl, [cells[g].decode for g in agg], key, S=max_running, Q=queue_slots)
        for j, g in enumerate(agg):
            out["ttft"][g], out["e2e"][g], out["phit"][g], out["prep"][g] = t[j], e[j], h[j], r[j]
            first = np.where(t[j] >= 0, wl.arrival_ms + t[j], -1)
            out["pdone"][g], out["karr"][g] = first, first
            pre[g], drop[g] = p[j], d[j]
    if dis:
        for c in (cells[g] for g in dis):
            if not isinstance(c.link, KvLink) or int(c.block_bytes) < 1:
                raise DisaggError("disagg.block_bytes: a disaggregated cell needs a KvLink and block_bytes >= 1")
        uniq = _grouped(dis, lambda g: tuple(np.asarray(x).tolist() for x in cells[g].prefill))
        first = [dis[js[0]] for js in uniq.values()]  # one prefill run per distinct prefill pool
        t, e, h, r, p, d = _run(prefill_workload(wl), [cells[g].prefill for g in first], key, S=max_running,
                                Q=queue_slots)
        nblk = -(-wl.input_tokens // wl.block_tokens)
        arrivals = {}
        run_of = {dis[j]: u for u, js in enumerate(uniq.values()) for j in js}
        for g in dis:
            c, j = cells[g], run_of[g]
            done = np.where(e[j] >= 0, wl.arrival_ms + e[j], -1)
            land = link_arrivals(done, r[j], nblk * int(c.block_bytes), c.link)
            karr = np.where(land >= 0, -(-land // 1_000_000), -1)
            out["phit"][g], out["prep"][g], out["pdone"][g], out["karr"][g] = h[j], r[j], done, karr
            pre[g], drop[g] = p[j], d[j]
            arrivals[g] = karr
        for same in _grouped([arrivals[g] for g in dis], lambda a: a.tobytes()).values():
            members = [dis[j] for j in same]
            dw, idx = decode_workload(wl, arrivals[members[0]])
            t, e, h, r, p, d = _run(dw, [cells[g].decode for g in members], key, S=max_running, Q=queue_slots,
                                    imported=dw.input_tokens)
            for j, g in enumerate(members):
                ok = t[j] >= 0
                out["ttft"][g, idx] = np.where(ok, dw.arrival_ms + t[j] - wl.arrival_ms[idx], -1)
                out["e2e"][g, idx] = np.where(e[j] >= 0, dw.arrival_ms + e[j] - wl.arrival_ms[idx], -1)
                out["drep"][g, idx] = np.where(ok, r[j], -1)
                pre[g] += p[j]
                drop[g] += d[j]
    gpus = np.array([int(c.decode.replicas) + (int(c.prefill.replicas) if c.prefill is not None else 0)
                     for c in cells], np.int64)
    out["phit"] = np.maximum(out["phit"], 0)
    return DisaggResult(list(cells), out["ttft"], out["e2e"], out["phit"], out["prep"], out["drep"], out["pdone"],
                        out["karr"], pre, drop, gpus)

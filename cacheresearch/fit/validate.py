"""What matters for caching, measured the same way on a trace and on samples of a fitted model.

* :func:`capacity_grid`: a log grid of LRU capacities from 1% to 100% of a workload's working set
  (its distinct blocks);
* :func:`capacity_hit_rates`: the token hit rate of one leaf-first LRU cache at each capacity, from
  one stack-distance pass (:func:`cacheresearch.analysis.mrc.hit_curve`, exact);
* :func:`ttl_hit_rates`: the token hit rate of one TTL cache refreshed on every hit, per TTL (from every
  block's previous use, by one sort: equal to the engine's replay request by request, without
  compiling the engine);
* :func:`analytic_hit_rates`: Che's approximation for the capacities and ``1 - exp(-lambda TTL)``
  for the TTLs, from the block-key rates of a workload (a fitted model's sample), token-weighted,
  over a finite window: a block requested ``n`` times in it contributes ``n - 1`` requests that can
  hit (its first is a compulsory miss), each hitting with Che's (or the TTL formula's) probability.
"""

from __future__ import annotations

import numpy as np

from cacheresearch.analysis.analytic import block_key_rates, che_hit_ratios, workload_duration_s
from cacheresearch.analysis.mrc import hit_curve
from cacheresearch.metrics.core import hit_tokens
from cacheresearch.workload import Workload

__all__ = ["capacity_grid", "capacity_hit_rates", "ttl_hit_blocks", "ttl_hit_rates", "analytic_hit_rates",
           "working_set"]


def working_set(w: Workload) -> int:
    """Distinct blocks of a workload (what an unbounded cache ends up holding)."""
    return int(np.unique(w.keys).size)


def capacity_grid(w: Workload, points: int = 16, lo: float = 0.01, hi: float = 1.0) -> np.ndarray:
    """Capacities (blocks) on a log grid from ``lo`` to ``hi`` of the working set, distinct integers
    (at least one block)."""
    ws = max(working_set(w), 1)  # a trace without blocks (every input_length 0): the one-block grid
    return np.unique(np.maximum(np.round(np.geomspace(lo * ws, hi * ws, points)).astype(np.int64), 1))


def capacity_hit_rates(w: Workload, capacities) -> np.ndarray:
    caps = np.asarray(capacities, dtype=np.int64)
    hc = hit_curve(w, max_capacity=int(caps.max()))
    return np.asarray(hc.token_hit_rate, dtype=np.float64)[caps]


def ttl_hit_blocks(w: Workload, ttls_s) -> np.ndarray:
    """``[T, N]`` hit blocks of every request in one unbounded TTL cache refreshed on every use, per TTL.

    With chained keys (a key stands for its block and its whole prefix) such a cache holds a key
    while the previous request containing it came at most ``TTL`` earlier (``now - last <= TTL`` on
    the millisecond clock, the engine's rule, :data:`cacheresearch.cache.policies` ``ttl_refresh``), and
    the blocks it holds of a request are a prefix of it; a request hits the leading run of those. One
    sort of the (key, request) pairs gives every block's previous use, so this equals the engine's
    replay (:func:`cacheresearch.backends.numba_cache.replay_grid`; ``tests/test_fit_validate.py``
    checks it request by request) without compiling it."""
    n = w.n_requests
    nb = w.n_blocks.astype(np.int64)
    req = np.repeat(np.arange(n, dtype=np.int64), nb)
    o = np.lexsort((req, w.keys))
    same = w.keys[o][1:] == w.keys[o][:-1]
    t = w.arrival_ms.astype(np.int64)
    age = np.full(req.size, np.iinfo(np.int64).max, np.int64)  # ms since the key's previous use
    if o.size:
        age[o[1:]] = np.where(same, t[req[o][1:]] - t[req[o][:-1]], np.iinfo(np.int64).max)
    pos = np.arange(req.size, dtype=np.int64) - w.offsets[:-1][req]
    ne = nb > 0
    out = np.zeros((len(ttls_s), n), np.int64)
    for j, ttl in enumerate(ttls_s):
        T = int(round(float(ttl) * 1000))
        if ne.any():
            dead_at = np.where(age <= T, np.iinfo(np.int64).max, pos)
            out[j, ne] = np.minimum(np.minimum.reduceat(dead_at, w.offsets[:-1][ne]), nb[ne])
    return out


def ttl_hit_rates(w: Workload, ttls_s) -> np.ndarray:
    """Token hit rate of one unbounded TTL cache refreshed on every use, per TTL (:func:`ttl_hit_blocks`;
    the engine's token accounting: ``min(hit blocks x block tokens, input tokens)``)."""
    hb = ttl_hit_blocks(w, ttls_s)
    inp = w.input_tokens.astype(np.int64)[None, :]
    ht = hit_tokens(hb, int(w.block_tokens), inp, np)
    total = float(inp.sum())
    return ht.sum(1) / total if total > 0 else np.zeros(len(ttls_s))


def _key_token_rates(w: Workload, duration_s: float | None):
    D = workload_duration_s(w) if duration_s is None else float(duration_s)
    keys, rates, counts = block_key_rates(w, D)
    req = np.repeat(np.arange(w.n_requests), w.n_blocks)
    j = np.arange(w.total_blocks) - w.offsets[:-1][req]
    inp = w.input_tokens[req]
    bt = w.block_tokens
    tok = (np.minimum((j + 1) * bt, inp) - np.minimum(j * bt, inp)).astype(np.float64)
    pos = np.searchsorted(keys, w.keys)
    tok_sum = np.bincount(pos, weights=tok, minlength=keys.size)
    return rates, tok_sum / np.maximum(counts, 1), counts.astype(np.float64)


def analytic_hit_rates(w: Workload, capacities, ttls_s, duration_s: float | None = None):
    """``(che [C], ttl [T])``: token hit rates predicted from the block-key rates of ``w`` under
    independent (Poisson) requests: Che's characteristic time per capacity, ``1 - exp(-lambda TTL)``
    per TTL; each block's ``n - 1`` repeat requests in the window weighted by its mean tokens."""
    lam, tok, n = _key_token_rates(w, duration_s)
    total = float(np.sum(tok * n))
    reuse = tok * (n - 1.0)  # the first request of a block in the window is a compulsory miss
    che = []
    for c in np.asarray(capacities, dtype=np.float64):
        h = che_hit_ratios(lam, float(c)).per_key
        che.append(float(np.sum(reuse * h) / total))
    ttl = [float(np.sum(reuse * -np.expm1(-lam * float(t))) / total) for t in ttls_s]
    return np.asarray(che), np.asarray(ttl)

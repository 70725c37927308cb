"""What matters for caching, measured the same way on a trace and on samples of a fitted model.

* :func:`capacity_grid`: a log grid of LRU capacities from 1% to 100% of a workload's working set
  (its distinct blocks);
* :func:`capacity_hit_rates`: the token hit rate of one leaf-first LRU cache at each capacity, from
  one stack-distance pass (:func:`cacheresearch.analysis.mrc.hit_curve`, exact);
* :func:`ttl_hit_rates`: the token hit rate of one TTL cache refreshed on every hit, per TTL (the
  engine's numba backend, :func:`cacheresearch.backends.numba_cache.replay_grid`, equal to the JAX engine);
* :func:`analytic_hit_rates`: Che's approximation for the capacities and ``1 - exp(-lambda TTL)``
  for the TTLs, from the block-key rates of a workload (a fitted model's sample), token-weighted,
  over a finite window: a block requested ``n`` times in it contributes ``n - 1`` requests that can
  hit (its first is a compulsory miss), each hitting with Che's (or the TTL formula's) probability.
"""

from __future__ import annotations

import jax
import numpy as np

from cacheresearch.analysis.analytic import block_key_rates, che_hit_ratios, workload_duration_s
from cacheresearch.analysis.mrc import hit_curve
from cacheresearch.backends.numba_cache import replay_grid
from cacheresearch.core.params import make_params
from cacheresearch.workload import Workload

__all__ = ["capacity_grid", "capacity_hit_rates", "ttl_hit_rates", "analytic_hit_rates", "working_set"]


def working_set(w: Workload) -> int:
    """Distinct blocks of a workload (what an unbounded cache ends up holding)."""
    return int(np.unique(w.keys).size)


def capacity_grid(w: Workload, points: int = 16, lo: float = 0.01, hi: float = 1.0) -> np.ndarray:
    """Capacities (blocks) on a log grid from ``lo`` to ``hi`` of the working set, distinct integers."""
    ws = working_set(w)
    return np.unique(np.maximum(np.round(np.geomspace(lo * ws, hi * ws, points)).astype(np.int64), 1))


def capacity_hit_rates(w: Workload, capacities) -> np.ndarray:
    caps = np.asarray(capacities, dtype=np.int64)
    hc = hit_curve(w, max_capacity=int(caps.max()))
    return np.asarray(hc.token_hit_rate, dtype=np.float64)[caps]


def ttl_hit_rates(w: Workload, ttls_s) -> np.ndarray:
    ps = [make_params("ttl_refresh", ttl_s=float(t)) for t in ttls_s]
    key = jax.random.key(0)
    m = replay_grid(w, ps, [key] * len(ps))
    return np.asarray(m.token_hit_rate, dtype=np.float64)


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

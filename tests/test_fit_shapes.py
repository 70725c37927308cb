"""The fit on service shapes unlike the shared traces (issue 18, the last target row): a conversation
service with 512-token blocks and per-block content hashes, and a day of API traffic with a diurnal
rate, one-off prompts, templates and 32-token blocks (generators: ``cacheresearch/fit/shapes.py``).
Each is fitted, sampled and replayed: the model exists, and its capacity and TTL curves are within
3 points of the trace's (mean of 2 sample seeds)."""

from __future__ import annotations

import numpy as np

from cacheresearch.fit import fit_workload, sample_workload
from cacheresearch.fit.shapes import generate_api_day, generate_chat_service
from cacheresearch.fit.structure import chain_content_hashes
from cacheresearch.fit.validate import capacity_grid, capacity_hit_rates, ttl_hit_rates

TTLS = [60.0, 300.0, 900.0, 3600.0]


def _gaps(w):
    m = fit_workload(w)
    caps = capacity_grid(w, 6)
    xs = [sample_workload(m, s) for s in (0, 1)]
    cap = np.mean([capacity_hit_rates(x, caps) for x in xs], 0)
    ttl = np.mean([ttl_hit_rates(x, TTLS) for x in xs], 0)
    vol = np.mean([x.input_tokens.sum() for x in xs]) / w.input_tokens.sum()
    return (float(np.max(np.abs(cap - capacity_hit_rates(w, caps)))),
            float(np.max(np.abs(ttl - ttl_hit_rates(w, TTLS)))), float(vol))


def test_chat_service_content_hashes_detected_and_fitted():
    raw = generate_chat_service(200, seed=5, content_hashes=True)
    w, chain = chain_content_hashes(raw)
    assert chain["chained"]  # a common opener after different system prompts gives it away
    assert chain["ids"] > 0
    ref = generate_chat_service(200, seed=5)  # the same trace with prefix-chained ids
    assert np.array_equal(capacity_hit_rates(w, capacity_grid(ref, 4)), capacity_hit_rates(ref, capacity_grid(ref, 4)))
    cap, ttl, vol = _gaps(w)
    assert cap <= 0.03 and ttl <= 0.03 and abs(vol - 1) <= 0.05, (cap, ttl, vol)


def test_api_day_diurnal_one_offs_32_token_blocks():
    w = generate_api_day(600, seed=2)
    assert w.block_tokens == 32 and set(np.unique(w.tenant).tolist()) == {0, 1}
    cap, ttl, vol = _gaps(w)
    assert cap <= 0.03 and ttl <= 0.03 and abs(vol - 1) <= 0.05, (cap, ttl, vol)

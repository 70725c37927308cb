"""The fit's fast paths equal their references: the TTL curve (one sort) the engine's replay, request by
request; request_structure's sorting path its loop."""

import jax
import numpy as np
import pytest

from cacheresearch.backends.numba_cache import replay_grid
from cacheresearch.core.params import make_params
from cacheresearch.fit.agent import generate_agent_sessions
from cacheresearch.fit.structure import request_structure
from cacheresearch.fit.validate import ttl_hit_blocks, ttl_hit_rates
from cacheresearch.workload import Workload


def _tree_workload(seed: int, n: int = 300) -> Workload:
    """Random prefix trees (chained keys), partial last blocks, many requests in the same millisecond,
    gaps on the TTL boundaries (multiples of 1 s)."""
    rng = np.random.default_rng(seed)
    paths, nxt = [], [1]

    def fresh(k):
        ids = np.arange(nxt[0], nxt[0] + k, dtype=np.uint64)
        nxt[0] += k
        return ids

    keys = []
    for _ in range(n):
        if paths and rng.random() < 0.8:
            p = paths[int(rng.integers(len(paths)))]
            k = np.concatenate([p[: int(rng.integers(1, p.size + 1))], fresh(int(rng.integers(0, 4)))])
        else:
            k = fresh(int(rng.integers(1, 6)))
        paths.append(k)
        keys.append(k)
    gaps = rng.choice([0, 0, 500, 1000, 2000, 3000, 60_000], n)
    ms = np.cumsum(gaps).astype(np.int64)
    inp = np.array([max(k.size * 16 - int(rng.integers(0, 16)), 1) for k in keys], dtype=np.int64)
    return Workload.from_lists(keys, block_tokens=16, arrival_ms=ms, input_tokens=inp, name="trees")


@pytest.mark.parametrize("w", [_tree_workload(0), _tree_workload(1), generate_agent_sessions(6, seed=3)],
                         ids=["trees0", "trees1", "agent"])
def test_ttl_hit_blocks_equal_engine(w):
    ttls = [0.0, 0.5, 1.0, 2.0, 3.0, 60.0, 300.0]
    ps = [make_params("ttl_refresh", ttl_s=t) for t in ttls]
    m = replay_grid(w, ps, [jax.random.key(0)] * len(ps))
    np.testing.assert_array_equal(ttl_hit_blocks(w, ttls), np.asarray(m.hit_blocks, dtype=np.int64))
    np.testing.assert_allclose(ttl_hit_rates(w, ttls), np.asarray(m.token_hit_rate, dtype=np.float64), rtol=1e-12)


@pytest.mark.parametrize("given", [False, True])
def test_request_structure_sorting_equals_loop(given):
    """request_structure's sorting path equals the request-by-request loop (sessions as root trees, or given)."""
    w = generate_agent_sessions(8, seed=2, compaction_rate=0.1)
    sess = np.random.default_rng(0).integers(0, 5, w.n_requests) if given else None
    for a, b in zip(request_structure(w, sess, method="loop"), request_structure(w, sess)):
        np.testing.assert_array_equal(a, b)

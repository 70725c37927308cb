"""libCacheSim's policies, hit for hit: the oracles (tests/reference_blocks.py) and the engine
(cacheresearch.backends.numba_policies) against libcachesim itself on object streams (one block per
request, so prefix semantics play no part): Zipf streams, the shipped fixture's block stream, and the
shared traces' block streams when ../shared is present (the whole traces under ``slow``).

Every policy runs with libCacheSim's default parameters. Object streams are the block streams the
engine sees (each request's blocks leaf-first, as the bench feeds libCacheSim)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference_blocks import BLOCK_ORACLES, object_hits

from cacheresearch.backends.numba_policies import block_replay
from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake

lcs = pytest.importorskip("libcachesim")

POLICIES = tuple(BLOCK_ORACLES)
LCS = {"fifo": lcs.FIFO, "sieve": lcs.Sieve, "s3fifo": lcs.S3FIFO, "lfu": lcs.LFU, "arc": lcs.ARC, "clock": lcs.Clock}
HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces"
TRACES = {"mooncake_synthetic_trace": 512, "agentic_coding_sessions": 64}


def lcs_hits(policy, seq, capacity):
    c = LCS[policy](cache_size=int(capacity), hashpower=20)
    return np.asarray([int(c.get(lcs.Request(obj_id=int(k), obj_size=1))) for k in seq], np.int64)


def objects(seq):
    return Workload.from_lists([[int(k)] for k in seq], block_tokens=1)


def engine_hits(policy, seq, capacity):
    return np.asarray(block_replay(objects(seq), policy, int(capacity)).hit_blocks[0], np.int64)


def zipf(n, universe, alpha, seed):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, universe + 1) ** alpha
    return (rng.choice(universe, size=n, p=p / p.sum()) + 1).tolist()


def leaf_first_stream(w, limit=None):
    ids = w.dense_ids()
    seq = np.concatenate([ids[w.offsets[i]:w.offsets[i + 1]][::-1] for i in range(w.n_requests)])
    return (seq if limit is None else seq[:limit]).astype(np.int64) + 1


def check(policy, seq, capacity, engine=True):
    expect = lcs_hits(policy, seq, capacity)
    got = np.asarray(object_hits(policy, seq, capacity))
    diff = np.nonzero(got != expect)[0]
    assert diff.size == 0, f"oracle {policy} C={capacity}: {diff.size} accesses differ, first at {diff[:3]}"
    if engine:
        got = engine_hits(policy, seq, capacity)
        diff = np.nonzero(got != expect)[0]
        assert diff.size == 0, f"engine {policy} C={capacity}: {diff.size} accesses differ, first at {diff[:3]}"
    return expect


# capacities: S3FIFO's small queue is int(0.1 C): C < 20 leaves one slot, and libCacheSim then admits only
# ghost hits (C = 10, 13 exercise it); odd capacities exercise the truncations
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("capacity,alpha,seed", [(10, 0.9, 0), (13, 1.1, 1), (20, 0.8, 2), (37, 1.0, 3),
                                                 (100, 0.9, 4), (333, 0.7, 5)])
def test_zipf_streams_hit_for_hit(policy, capacity, alpha, seed):
    seq = zipf(6000, 1200, alpha, seed)
    expect = check(policy, seq, capacity)
    assert 0 < expect.sum() < len(seq) or (policy == "s3fifo" and capacity < 20)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("capacity", [25, 120, 600])
def test_shipped_fixture_block_stream_hit_for_hit(policy, capacity):
    w = load_mooncake(HERE / "fixtures" / "mini_mooncake.jsonl", block_tokens=512)
    check(policy, leaf_first_stream(w), capacity)


def _trace_stream(name, limit=None):
    path = SHARED / f"{name}.jsonl"
    if not path.exists():
        pytest.skip("../shared/traces is not present")
    return leaf_first_stream(load_mooncake(path, block_tokens=TRACES[name]), limit)


@pytest.mark.parametrize("policy", POLICIES)
def test_shared_trace_first_30000_accesses_hit_for_hit(policy):
    seq = _trace_stream("mooncake_synthetic_trace", 30_000)
    U = len(set(seq.tolist()))
    for capacity in (U // 100, U // 20, U // 5, U // 2):
        check(policy, seq, capacity)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("policy", POLICIES)
def test_shared_traces_whole_hit_for_hit(policy, name):
    seq = _trace_stream(name)
    U = len(set(seq.tolist()))
    for capacity in (U // 100, U // 20, U // 5, U // 2):
        expect = lcs_hits(policy, seq, capacity)
        got = engine_hits(policy, seq, capacity)
        assert int(np.sum(got != expect)) == 0, f"{policy} {name} C={capacity}"

"""vLLM's own prefix-cache counters, the client's timeouts and the client's permits with async cpu loads on the vllm
replica (numba backend, tests/reference_batch.py): hand-worked cases; the hypothesis equality tests of the counters
live beside the engine's (tests/test_numba_vllm.py, tests/test_tiers_vllm.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from reference_batch import reference_batch

from cacheresearch.core.params import make_params
from cacheresearch.core.simulate import static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.metrics.core import combine_limbs, finalize
from cacheresearch.workload.table import Workload

nv = pytest.importorskip("cacheresearch.backends.numba_vllm")

#: one replica, a pool of 4 blocks of 16 tokens, every step 1 ms
HAND = dict(capacity_blocks=4, step_base_ns=1_000_000, step_prefill_ns=0, step_decode_ns=0,
            max_num_batched_tokens=8192, max_num_seqs=4)


def _run(w, params, R=1, S=4, Q=64):
    s = compile_stream(w, stateful_singletons=True)
    st_ = static_options(params[0], max_replicas=R, per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                         max_runs=int(np.max(np.asarray(s.n_runs))))
    m = finalize(nv.run_stream(s, params, [jax.random.key(0)] * len(params), st_), st_)
    return [type(m)(*(np.asarray(x)[g] for x in m)) for g in range(len(params))]


def _counters(m):
    return combine_limbs(m.vllm_counters_hi, m.vllm_counters_lo).tolist()


def test_hand_worked_counters_count_every_failed_attempt_per_attempt():
    """A [1 2 3] (48 tokens, 5 output tokens) at 0 ms; B [1 5 6] (48 tokens, 1 output token) at 1 ms.

    A prefills 0-1 ms and decodes one token a step; from its third token (the step at 2 ms) its KV needs a fourth
    block, so the pool (4) is full. B arrives as the step at 1 ms starts (that step runs first, without it). The
    steps at 2, 3 and 4 ms look B up (hit: block 1, A's, 16 tokens) and fail its allocation (3 + 1 in use + 2 new
    > 4); A's fifth token ends at 5 ms; the step at 5 ms releases A and admits B (hit 16 tokens again). vLLM before
    PR #48860 (``per_attempt``) counts every lookup: queries 48 (A) + 4 x 48 = 240, hits 4 x 16 = 64; after it
    (``per_admission``) once: 96 and 16. No cpu tier: no external counters. B: TTFT 6 - 1 = 5 ms.
    """
    w = Workload.from_lists([[1, 2, 3], [1, 5, 6]], block_tokens=16, arrival_ms=np.array([0, 1]),
                            output_tokens=np.array([5, 1]))
    ps = [make_params("lru", replicas=1, router="round_robin", counter_mode=mode, **HAND)
          for mode in ("per_attempt", "per_admission")]
    att, adm = _run(w, ps)
    assert _counters(att) == [240, 64, 0, 0]
    assert _counters(adm) == [96, 16, 0, 0]
    assert att.ttft_ms.tolist() == adm.ttft_ms.tolist() == [1, 5]
    ref = reference_batch(w, replicas=1, router="round_robin", max_running=4, **HAND)
    assert ref["vllm_counters"] == {"attempt": [240, 64, 0, 0], "admission": [96, 16, 0, 0]}

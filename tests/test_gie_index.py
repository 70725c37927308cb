"""The ``gie_estimate`` view against GIE v0.5.1's prefix-cache-scorer (the Go code transcribed in
``reference_gie_index.py``): hand-made index states, random add / match sequences, the prompt-byte hashes
against real byte hashing, and the vllm replica with the ``gie`` router request by request (with the load
scrape of ``load_refresh_ms`` too)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_gie_index import GieIndexer, hash_prompt
from test_batch import _check, _ref, _workload

from cacheresearch.core.params import make_params
from cacheresearch.core.simulate import request_bits, simulate
from cacheresearch.core.stream import compile_stream
from cacheresearch.routers.gie_index import gie_add, gie_match, init_gie_index
from cacheresearch.workload.gie_hashes import gie_hashes_from_keys, gie_hashes_shared_prefix
from cacheresearch.workload.table import Workload

_match = jax.jit(gie_match)
_add = jax.jit(gie_add)
H = 6


def _ids(x):
    return jnp.array(list(x) + [99] * (H - len(x)), jnp.int32)


def _state(ix, R, G):
    return [{g for g in range(G) if bool(ix.present[r, g])} for r in range(R)]


def test_union_walk_counts_hashes_held_not_a_consecutive_run():
    R, G = 3, 99
    ix = init_gie_index(R, G)
    act = jnp.ones(R, bool)
    ix = _add(ix, _ids([0, 1, 2, 3]), 4, 0, 4, True)  # pod 0: h0..h3 (full)
    ix = _add(ix, _ids([0, 7]), 2, 1, 4, True)  # pod 1: h0 and another prompt's block
    ix = _add(ix, _ids([0, 1, 2, 3]), 4, 1, 4, True)  # pod 1: 7 is the oldest entry and goes
    assert _state(ix, R, G)[1] == {0, 1, 2, 3}
    ix = _add(ix, _ids([0, 5]), 2, 0, 4, True)  # pod 0: refreshes 0, inserts 5, evicts its oldest: 1
    assert _state(ix, R, G)[0] == {0, 2, 3, 5}
    cnt, tot = _match(ix, _ids([0, 1, 2, 3, 4]), 5, act)
    # the walk goes on while any pod holds the hash: pod 0 lacks h1 (pod 1 has it) and still counts h2, h3
    ref = GieIndexer(4)
    ref.add([0, 1, 2, 3], 0), ref.add([0, 7], 1), ref.add([0, 1, 2, 3], 1), ref.add([0, 5], 0)
    want = ref.match_longest_prefix([0, 1, 2, 3, 4])
    assert [int(x) for x in cnt] == [want.get(r, 0) for r in range(R)] == [3, 4, 0]
    assert int(tot) == 5
    # an inactive pod holds nothing for the walk
    cnt, _ = _match(ix, _ids([0, 1, 2]), 3, jnp.array([True, False, True]))
    assert [int(x) for x in cnt] == [1, 0, 0]  # h1 only on pod 1 (inactive): the walk stops there
    # no hashes (prompt under one block): every pod counts 0
    cnt, tot = _match(ix, _ids([]), 0, act)
    assert int(jnp.sum(cnt)) == 0 and int(tot) == 0


def test_random_sequences_equal_the_go_transcription():
    rng = np.random.default_rng(5)
    for trial in range(6):
        R, cap = 3, int(rng.integers(H, 14))  # one R: one compile
        # prompts from a small trie: chained ids, prompts share prefixes
        prompts = []
        for _ in range(7):
            base = list(prompts[int(rng.integers(len(prompts)))][: int(rng.integers(1, H))]) if prompts else [0]
            while len(base) < int(rng.integers(1, H + 1)):
                base.append(int(rng.integers(1, 40)))
            prompts.append(base)
        ix, ref = init_gie_index(R, 40), GieIndexer(cap)
        act = jnp.ones(R, bool)
        for step in range(40):
            p = prompts[int(rng.integers(len(prompts)))]
            p = list(dict.fromkeys(p))  # chained hashes are distinct
            cnt, _ = _match(ix, _ids(p), len(p), act)
            want = ref.match_longest_prefix(p)
            assert [int(x) for x in cnt] == [want.get(r, 0) for r in range(R)], (trial, step)
            r = int(rng.integers(R))
            ix = _add(ix, _ids(p), len(p), r, cap, True)
            ref.add(p, r)
            assert _state(ix, R, 40) == [set(ref.lru.get(q, {})) for q in range(R)], (trial, step)
            assert [int(x) for x in ix.size] == [len(ref.lru.get(q, {})) for q in range(R)]


def _same_pattern(ids, n, hashes):
    """Equal dense ids exactly where the real hashes are equal (lane by lane, across requests)."""
    flat_i = [(int(ids[i, j])) for i in range(len(hashes)) for j in range(int(n[i]))]
    flat_h = [h for hs in hashes for h in hs]
    assert len(flat_i) == len(flat_h)
    for a in range(len(flat_h)):
        for b in range(a + 1, len(flat_h)):
            assert (flat_i[a] == flat_i[b]) == (flat_h[a] == flat_h[b]), (a, b)


def _bytes(tokens, bpt=4):
    return b"".join(int(t).to_bytes(bpt, "little") for t in tokens)


def test_shared_prefix_hashes_equal_byte_hashing():
    rng = np.random.default_rng(2)
    sys_len, q_len, groups, per = 40, 12, 3, 2
    system = rng.integers(0, 2**31, (groups, sys_len))
    quest = rng.integers(0, 2**31, (groups * per, q_len))
    group = np.array([0, 1, 0, 2, 1, 0, 2])
    prompt = np.array([0, 2, 1, 4, 3, 0, 5])
    for mb in (3, 8, 20):  # a window inside the system prompt, reaching the questions, past them
        g = gie_hashes_shared_prefix(group, prompt, system_len=sys_len, question_len=q_len, hash_block_bytes=16,
                                     max_blocks=mb)
        real = [hash_prompt(_bytes(list(system[a]) + list(quest[b])), "m", 16, mb) for a, b in zip(group, prompt)]
        assert [len(h) for h in real] == list(g.n)
        _same_pattern(g.ids, g.n, real)
    # a prompt shorter than one block has no hashes; the model hash is shared by all
    g = gie_hashes_shared_prefix([0], [0], system_len=2, question_len=1, hash_block_bytes=16, max_blocks=4)
    assert int(g.n[0]) == 0


def test_hashes_from_block_keys_on_block_aligned_sharing():
    rng = np.random.default_rng(3)
    bt = 4
    heads = [list(rng.integers(0, 2**31, 8)) for _ in range(2)]
    toks = [heads[0] + list(rng.integers(0, 2**31, 6)), heads[0] + list(rng.integers(0, 2**31, 9)),
            heads[1] + list(rng.integers(0, 2**31, 5)), heads[0][:4] + list(rng.integers(0, 2**31, 7))]
    keys, offs = [], [0]
    for t in toks:
        k, h = [], 0
        for j in range(len(t) // bt):
            h = hash((h, tuple(int(x) for x in t[j * bt:(j + 1) * bt]))) & (2**63 - 1)
            k.append(h)
        keys += k
        offs.append(offs[-1] + len(k))
    w = Workload(arrival_ms=np.arange(4, dtype=np.int64), input_tokens=np.array([len(t) for t in toks], np.int64),
                 output_tokens=np.ones(4, np.int64), tenant=np.zeros(4, np.int32),
                 keys=np.array(keys, np.uint64), offsets=np.array(offs, np.int64), block_tokens=bt)
    # 8 bytes per hash block = 2 tokens at 4 bytes per token: block-aligned sharing is seen exactly
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=8, max_blocks=5)
    real = [hash_prompt(_bytes(t), "m", 8, 5) for t in toks]
    assert [len(h) for h in real] == list(g.n)
    # ids equal only where the real hashes are (conservative inside a block): check both directions on
    # block boundaries (even hash indices end on a 4-token block edge)
    for i in range(4):
        for k in range(4):
            for j in range(0, min(int(g.n[i]), int(g.n[k])), 2):
                assert (g.ids[i, j] == g.ids[k, j]) == (real[i][j] == real[k][j]), (i, k, j)
            for j in range(min(int(g.n[i]), int(g.n[k]))):
                if g.ids[i, j] == g.ids[k, j]:
                    assert real[i][j] == real[k][j]


@pytest.mark.parametrize("refresh", [0, 7])
@pytest.mark.slow  # long; see README's slow checks
def test_vllm_replica_with_gie_estimate_equals_reference(refresh):
    w = _workload(4, 4, 200, 40, 30, 2, 12)
    g = gie_hashes_from_keys(w, bytes_per_token=4, hash_block_bytes=64, max_blocks=12)
    kn = dict(capacity_blocks=70, max_num_batched_tokens=64, max_num_seqs=4, gie_prefix_mode=1, gie_prefix_w_pct=100,
              gie_kv_w_pct=100, gie_queue_w_pct=100, view="gie_estimate", gie_lru_capacity=20,
              load_refresh_ms=refresh)
    s = compile_stream(w, stateful_singletons=True, gie_hashes=g)
    p = make_params("lru", replicas=3, router="gie", **kn)
    key = jax.random.key(0)
    m = simulate(s, p, key, max_replicas=3, scheduler="vllm", max_running=6, queue_slots=64)
    bits = np.asarray(request_bits(key, w.n_requests + 1))[: w.n_requests]
    ref = _ref(w, R=3, router="gie", bits=bits, S=6, Q=64, gie_hashes=g, **kn)
    _check(w, m, ref)

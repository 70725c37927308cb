"""Chained block keys: JAX implementation vs the plain-Python reference, and key properties."""

import struct

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheresearch.workload import keys as K
from cacheresearch.workload.keys import (
    ROOT,
    block_keys,
    block_keys_jit,
    keys_to_workload,
    pad_tokens,
    reference_block_keys,
    reference_hash_words,
    split_uint64,
    to_uint64,
    tokens_to_workload,
)

I32 = np.iinfo(np.int32)


def _rand_tokens(n, length, seed=0):
    return np.random.default_rng(seed).integers(0, 50_000, size=(n, length), dtype=np.int32)


def _keys(tokens, lengths, **kw):
    hi, lo, nb = block_keys_jit(np.asarray(tokens, np.int32), np.asarray(lengths, np.int32), **kw)
    return to_uint64(hi, lo), np.asarray(nb)


def _ref_rows(tokens, lengths, bs, **per_row):
    """Reference keys for every row; per_row values are arrays indexed by row (or None)."""
    out = []
    for i in range(len(lengths)):
        kw = {}
        for name, v in per_row.items():
            if v is None:
                continue
            if name == "mm_items":
                h, s, ln = v
                kw[name] = [(int(h[i, m]), int(s[i, m]), int(ln[i, m])) for m in range(h.shape[1])]
            else:
                kw[name] = int(v[i])
        out.append(reference_block_keys(list(tokens[i, : lengths[i]]), block_size=bs, **kw))
    return out


# ------------------------------------------------------------------------------------ hash H
def _murmur3_words(words, seed):
    h = seed
    for w in words:
        h = K._absorb_a_py(h, w)
    return K._final_a_py(h, len(words))


@pytest.mark.parametrize(
    "data,seed,expected",
    [
        (b"", 0, 0),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"\x21\x43\x65\x87", 0, 0xF55B516B),
        (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"abcd", 0x9747B28C, 0xF0478627),
    ],
)
def test_lane_a_is_murmur3_x86_32(data, seed, expected):
    words = list(struct.unpack(f"<{len(data) // 4}I", data))
    assert _murmur3_words(words, seed) == expected


def test_jax_hash_words_matches_reference():
    words = np.random.default_rng(1).integers(0, 2**32, size=(5, 7), dtype=np.uint64).astype(np.uint32)
    hi, lo = K.hash_words(words)
    got = to_uint64(hi, lo)
    for i in range(5):
        assert int(got[i]) == reference_hash_words(words[i].tolist())


def test_lane_helpers_roundtrip():
    k = np.random.default_rng(2).integers(0, 2**63, size=100, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    hi, lo = split_uint64(k)
    assert hi.dtype == lo.dtype == np.uint32
    np.testing.assert_array_equal(to_uint64(hi, lo), k)
    assert to_uint64(np.uint32(0xFFFFFFFF), np.uint32(1)) == np.uint64(0xFFFFFFFF00000001)


def test_keys_are_pinned():
    # Golden values: a change here changes every stored workload's keys.
    assert reference_block_keys(list(range(32)), block_size=16)[1] == 0xD5A0FC5E936720CB
    k = reference_block_keys(list(range(16)), adapter=3, cache_salt=7, mm_items=[(11, 2, 4)], prompt_embeds=5)
    assert k == [0x07719AF4AFBD845D]
    got, _ = _keys(np.arange(32)[None], [32])
    assert int(got[0, 1]) == 0xD5A0FC5E936720CB
    assert ROOT == 0x6A09E667F3BCC908


# ---------------------------------------------------------------------- JAX == Python reference
N, LMAX, M = 3, 24, 2
small_int = st.integers(0, 3)


@st.composite
def batches(draw):
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    tokens = np.array(
        draw(st.lists(st.integers(I32.min, I32.max), min_size=N * LMAX, max_size=N * LMAX)), dtype=np.int32
    ).reshape(N, LMAX)
    lengths = np.array(draw(st.lists(st.integers(0, LMAX), min_size=N, max_size=N)), dtype=np.int32)
    ints = lambda: np.array(draw(st.lists(small_int, min_size=N, max_size=N)), dtype=np.int32)  # noqa: E731
    adapter, salt, embeds = ints(), ints(), ints()
    mm_h = np.array(draw(st.lists(st.integers(0, 2**32 - 1), min_size=N * M, max_size=N * M)), np.uint32)
    mm_s = np.array(draw(st.lists(st.integers(0, LMAX + 4), min_size=N * M, max_size=N * M)), np.int32)
    mm_l = np.array(draw(st.lists(st.integers(0, 10), min_size=N * M, max_size=N * M)), np.int32)
    mm = (mm_h.reshape(N, M), mm_s.reshape(N, M), mm_l.reshape(N, M))
    return bs, tokens, lengths, adapter, salt, embeds, mm


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_jax_matches_reference(batch):
    bs, tokens, lengths, adapter, salt, embeds, mm = batch
    got, nb = _keys(
        tokens, lengths, block_size=bs, adapter=adapter, cache_salt=salt, mm_items=mm, prompt_embeds=embeds
    )
    ref = _ref_rows(tokens, lengths, bs, adapter=adapter, cache_salt=salt, mm_items=mm, prompt_embeds=embeds)
    np.testing.assert_array_equal(nb, lengths // bs)
    for i in range(N):
        assert got[i, : nb[i]].tolist() == ref[i]
        assert not got[i, nb[i] :].any()


@settings(max_examples=25, deadline=None)
@given(
    bs=st.sampled_from([2, 4]),
    cut_blocks=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_continuing_a_chain_equals_hashing_the_whole_prompt(bs, cut_blocks, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 100, size=(N, LMAX), dtype=np.int32)
    lengths = rng.integers(cut_blocks * bs, LMAX + 1, size=N).astype(np.int32)
    extras = dict(
        adapter=rng.integers(0, 3, N).astype(np.int32),
        cache_salt=rng.integers(0, 3, N).astype(np.int32),
        prompt_embeds=rng.integers(0, 3, N).astype(np.int32),
        mm_items=(
            rng.integers(1, 2**31, (N, M)).astype(np.uint32),
            rng.integers(0, LMAX, (N, M)).astype(np.int32),
            rng.integers(0, 8, (N, M)).astype(np.int32),
        ),
    )
    full, nb = _keys(tokens, lengths, block_size=bs, **extras)
    cut = cut_blocks * bs
    parent = None
    if cut_blocks:
        hi, lo = split_uint64(full[:, cut_blocks - 1])
        parent = (hi, lo)
    tail_tokens = np.zeros_like(tokens)  # fixed shape: one compilation per (bs, parent given)
    tail_tokens[:, : LMAX - cut] = tokens[:, cut:]
    tail, nb_tail = _keys(tail_tokens, lengths - cut, block_size=bs, parent=parent, start_token=cut, **extras)
    np.testing.assert_array_equal(nb_tail, nb - cut_blocks)
    np.testing.assert_array_equal(tail[:, : full.shape[1] - cut_blocks], full[:, cut_blocks:])
    assert not tail[:, full.shape[1] - cut_blocks :].any()


# --------------------------------------------------------------------------------- properties
def test_changing_one_token_changes_that_block_and_all_later_ones():
    bs, nblk = 8, 6
    base = _rand_tokens(1, bs * nblk, seed=3)
    rows = [base[0]]
    for j in range(nblk):
        t = base[0].copy()
        t[j * bs + (j % bs)] += 1
        rows.append(t)
    tokens = np.stack(rows)
    got, _ = _keys(tokens, [bs * nblk] * len(rows), block_size=bs)
    for j in range(nblk):
        row = got[j + 1]
        np.testing.assert_array_equal(row[:j], got[0, :j])
        assert np.all(row[j:] != got[0, j:])


def test_cache_salt_changes_every_key_and_enters_only_block_zero():
    tokens = np.repeat(_rand_tokens(1, 64, seed=4), 3, axis=0)
    got, _ = _keys(tokens, [64] * 3, cache_salt=np.array([0, 5, 6], np.int32))
    assert np.all(got[1] != got[0]) and np.all(got[2] != got[0]) and np.all(got[1] != got[2])
    # The salt is a block-0 extra key: hashing block 1 onwards as a continuation ignores it.
    hi, lo = split_uint64(got[:, 0])
    tail, _ = _keys(tokens[:, 16:], [48] * 3, parent=(hi, lo), start_token=16)
    np.testing.assert_array_equal(tail, got[:, 1:])
    tail0, _ = _keys(tokens[:, 16:], [48] * 3, parent=(hi, lo), start_token=16, cache_salt=np.zeros(3, np.int32))
    np.testing.assert_array_equal(tail0, tail)


def test_adapter_changes_every_key():
    tokens = np.repeat(_rand_tokens(1, 64, seed=5), 3, axis=0)
    got, _ = _keys(tokens, [64] * 3, adapter=np.array([0, 1, 2], np.int32))
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert np.all(got[a] != got[b])


@pytest.mark.parametrize("start,length", [(0, 1), (20, 5), (31, 2), (40, 30), (63, 1)])
def test_mm_item_changes_keys_from_its_first_block_on(start, length):
    bs, nblk = 8, 8
    tokens = np.repeat(_rand_tokens(1, bs * nblk, seed=6), 2, axis=0)
    mm = (
        np.array([[0], [77]], np.uint32),
        np.array([[0], [start]], np.int32),
        np.array([[0], [length]], np.int32),
    )
    got, _ = _keys(tokens, [bs * nblk] * 2, block_size=bs, mm_items=mm)
    first = start // bs
    np.testing.assert_array_equal(got[1, :first], got[0, :first])
    assert np.all(got[1, first:] != got[0, first:])


def test_mm_item_hash_and_offset_both_matter():
    tokens = np.repeat(_rand_tokens(1, 32, seed=7), 3, axis=0)
    mm = (
        np.array([[5], [6], [5]], np.uint32),
        np.array([[3], [3], [4]], np.int32),
        np.array([[2], [2], [2]], np.int32),
    )
    got, _ = _keys(tokens, [32] * 3, mm_items=mm)
    assert len({int(k) for k in got[:, 0]}) == 3


def test_none_extras_equal_zero_extras():
    tokens = _rand_tokens(2, 40, seed=8)
    z = np.zeros(2, np.int32)
    zm = (np.zeros((2, 1), np.uint32), np.zeros((2, 1), np.int32), np.zeros((2, 1), np.int32))
    a, _ = _keys(tokens, [40, 33], block_size=4)
    b, _ = _keys(tokens, [40, 33], block_size=4, adapter=z, cache_salt=z, prompt_embeds=z, mm_items=zm)
    np.testing.assert_array_equal(a, b)


def test_only_full_blocks_are_hashed():
    tokens = _rand_tokens(3, 40, seed=9)
    got, nb = _keys(tokens, [40, 35, 15], block_size=16)
    assert got.shape == (3, 2)
    np.testing.assert_array_equal(nb, [2, 2, 0])
    assert not got[2].any()
    # Tokens past the last full block (and padding) do not matter.
    t2 = tokens.copy()
    t2[:, 32:] += 1
    got2, _ = _keys(t2, [40, 35, 15], block_size=16)
    np.testing.assert_array_equal(got2, got)
    # A shorter length zeroes the dropped blocks; the kept ones are unchanged.
    got3, nb3 = _keys(tokens, [31, 35, 15], block_size=16)
    assert nb3[0] == 1 and got3[0, 0] == got[0, 0] and got3[0, 1] == 0


@pytest.mark.slow  # long; see README's slow checks
def test_jit_and_no_jit_agree():
    tokens = _rand_tokens(2, 12, seed=10)
    kw = dict(
        block_size=4,
        adapter=np.array([0, 2], np.int32),
        cache_salt=np.array([1, 0], np.int32),
        mm_items=(np.array([[9], [8]], np.uint32), np.array([[2], [6]], np.int32), np.array([[3], [5]], np.int32)),
    )
    lengths = np.array([12, 9], np.int32)
    a = block_keys_jit(tokens, lengths, **kw)
    with jax.disable_jit():
        b = block_keys(tokens, lengths, **kw)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    c = block_keys(tokens, lengths, **kw)  # eager dispatch (scan compiled internally)
    for x, y in zip(a, c):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_identical_prefixes_share_keys_exactly():
    bs = 8
    common = _rand_tokens(1, 44, seed=11)[0]  # 5 full blocks + 4 tokens
    tails = _rand_tokens(3, 20, seed=12)
    tokens = np.concatenate([np.broadcast_to(common, (3, 44)), tails], axis=1)
    got, nb = _keys(tokens, [64, 64, 60], block_size=bs)
    assert list(nb) == [8, 8, 7]
    for a in range(3):
        for b in range(a + 1, 3):
            np.testing.assert_array_equal(got[a, :5], got[b, :5])
            assert not set(got[a, 5 : nb[a]].tolist()) & set(got[b, 5 : nb[b]].tolist())


def test_block_zero_differs_from_root_chain_position():
    # The same block content at position 0 and position 1 gets different keys (chaining).
    blk = _rand_tokens(1, 16, seed=13)[0]
    got, _ = _keys(np.concatenate([blk, blk])[None], [32])
    assert got[0, 0] != got[0, 1]


def test_empty_and_degenerate_shapes():
    got, nb = _keys(np.zeros((2, 5), np.int32), [5, 3], block_size=16)
    assert got.shape == (2, 0) and list(nb) == [0, 0]
    got, nb = _keys(np.zeros((0, 32), np.int32), np.zeros(0, np.int32))
    assert got.shape == (0, 2)


def test_argument_errors():
    with pytest.raises(ValueError):
        block_keys(np.zeros((2, 16), np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError):
        block_keys(np.zeros(16, np.int32), np.zeros(1, np.int32))
    with pytest.raises(ValueError):
        block_keys(np.zeros((2, 16), np.int32), np.zeros(2, np.int32), block_size=0)
    with pytest.raises(ValueError):
        block_keys(np.zeros((2, 16), np.int32), np.zeros(2, np.int32), adapter=np.zeros(3, np.int32))
    with pytest.raises(ValueError):
        tokens_to_workload(np.zeros((2, 16), np.int32), np.array([16, 17]))


# ------------------------------------------------------------------------------ host helpers
def test_tokens_to_workload_csr():
    prompts = [list(range(40)), list(range(16)), list(range(7)), list(range(33))]
    tokens, lengths = pad_tokens(prompts)
    assert tokens.shape == (4, 40) and list(lengths) == [40, 16, 7, 33]
    w = tokens_to_workload(tokens, lengths, arrival_ms=[0, 1, 1, 5], tenant=[0, 1, 0, 1], output_tokens=3, name="t")
    assert list(w.n_blocks) == [2, 1, 0, 2]
    assert list(w.input_tokens) == [40, 16, 7, 33] and list(w.output_tokens) == [3] * 4
    assert w.block_tokens == 16 and w.name == "t"
    w.check_distinct_keys()
    ref = [reference_block_keys(p) for p in prompts]
    for i in range(4):
        assert w.request_keys(i).tolist() == ref[i]
    # Requests 0, 1 and 3 share their first block; 0 and 3 share both.
    assert w.request_keys(0)[0] == w.request_keys(1)[0]
    assert w.request_keys(0).tolist() == w.request_keys(3).tolist()


def test_keys_to_workload_validates():
    hi = np.ones((2, 3), np.uint32)
    with pytest.raises(ValueError):
        keys_to_workload(hi, hi, [1, 4], block_tokens=16, input_tokens=[16, 64])
    w = keys_to_workload(hi, hi * 2, [1, 3], block_tokens=16, input_tokens=[16, 48])
    assert w.total_blocks == 4 and int(w.keys[0]) == (1 << 32) | 2

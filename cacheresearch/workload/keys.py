"""Chained block keys: vLLM's prefix-cache hashing structure, vectorized in JAX.

Specification
-------------
A prompt of ``L`` tokens is cut into blocks of ``block_size`` tokens (default 16). Only FULL
blocks get a key, so a prompt has ``L // block_size`` keys; a trailing partial block is never
hashed (as in vLLM, it cannot be shared). Block ``j`` covers absolute token positions
``[s, e) = [start_token + j * block_size, start_token + (j + 1) * block_size)``
(``start_token`` is 0 unless a chain is continued, see below), and its key is

    key_j = H(parent_j, tokens of block j, extra keys of block j),
    parent_0 = ROOT,  parent_j = key_{j-1},

so a key identifies a block *and its whole prefix*: two requests share key ``j`` only if they
agree on every token (and extra key) of blocks ``0..j``. ``ROOT`` is a pinned constant
(:data:`ROOT`), so keys are reproducible across processes and machines; vLLM instead draws a
random root when ``PYTHONHASHSEED`` is unset. We copy vLLM's *structure*, not its bytes: our
keys are not equal to vLLM's.

Extra keys, in vLLM's order (each enters as a tag word followed by fixed-width fields):

1. LoRA adapter id (int, 0 = no adapter): ``[TAG_LORA, adapter]`` in every block.
2. Multimodal items, in the order of their slots: item ``m`` with identifier hash ``h_m`` and
   token range ``[start_m, start_m + length_m)`` (``length_m == 0`` = empty slot) adds
   ``[TAG_MM, h_m, start_m]`` to every block whose token range overlaps the item. Positions are
   absolute prompt positions. Give items sorted by ``start`` to match vLLM's order.
3. Cache salt (int, 0 = none): ``[TAG_SALT, salt]`` in the FIRST block of the prompt only
   (absolute block 0); it reaches later blocks through the chain.
4. Prompt-embeds hash (optional int per request, 0 = none): ``[TAG_EMBEDS, value]`` in every block.
   (vLLM hashes each block's slice of the embeddings; one value per request is the coarse
   version.)

All values are 32-bit words: token ids, adapter ids, salts, item hashes and the embeds hash are
taken modulo 2**32 (``int32`` arrays are reinterpreted as ``uint32``). The word sequence hashed
for a block is ``[parent_hi, parent_lo, tok_0 .. tok_{B-1}, extras...]``; the tag words make the
encoding unambiguous.

Hash function ``H``
-------------------
A 64-bit key is held as two ``uint32`` lanes ``(hi, lo)``; JAX's 64-bit mode is never enabled.
``hi`` is MurmurHash3_x86_32 (seed :data:`SEED_A`) of the word sequence (little-endian 4-byte
words: byte length ``4 * n_words``); ``lo`` is a second murmur3-shaped 32-bit hash with different
multipliers, rotations, seed (:data:`SEED_B`) and an xxHash32-style finalizer. Use
:func:`to_uint64` / :func:`split_uint64` to convert between lanes and ``numpy.uint64``
(``key = hi << 32 | lo``).

Collision expectations. Each lane's per-word update is a bijection of its state for a fixed
word and a bijection of the word for a fixed state, and the finalizers are bijections. Hence two
word sequences of equal length that differ in exactly one word NEVER collide (in either lane):
e.g. one changed token under the same parent, or the same block under parents that differ in
only one lane. For unrelated inputs the two lanes behave as independent 32-bit hashes, so a
pair of distinct blocks collides with probability about ``2**-64`` and a workload with ``n``
distinct blocks has about ``n**2 / 2**65`` expected colliding pairs (~3e-4 for n = 1e8). This
is a simulation hash: it is not cryptographic and not meant to resist adversarial inputs.

Vectorization
-------------
:func:`block_keys` is jit-compatible (``block_size`` static): ``lax.scan`` over block index,
broadcast over requests. To hash a shared prefix once and many per-request suffixes, hash the
prefix, then call :func:`block_keys` on each suffix with ``parent=`` the prefix's last key and
``start_token=`` the prefix length (a multiple of ``block_size``); the result equals hashing the
whole prompt. :func:`reference_block_keys` is a plain-Python implementation of the same
specification, used by the tests.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cacheresearch.workload.table import Workload

__all__ = [
    "ROOT",
    "ROOT_HI",
    "ROOT_LO",
    "SEED_A",
    "SEED_B",
    "TAG_LORA",
    "TAG_MM",
    "TAG_SALT",
    "TAG_EMBEDS",
    "block_keys",
    "block_keys_jit",
    "hash_words",
    "keys_to_workload",
    "pad_tokens",
    "reference_block_keys",
    "reference_hash_words",
    "SALT_MODES",
    "salt_values",
    "rekey_after",
    "split_uint64",
    "to_uint64",
    "tokens_to_workload",
]

_M32 = 0xFFFFFFFF

# Pinned root parent (fractional part of sqrt(2), the SHA-512 IV word) and lane seeds.
ROOT_HI = 0x6A09E667
ROOT_LO = 0xF3BCC908
ROOT = (ROOT_HI << 32) | ROOT_LO
SEED_A = 0x243F6A88  # pi
SEED_B = 0x85A308D3

# Tag words announcing each kind of extra key (ASCII).
TAG_LORA = 0x4C4F5241  # "LORA"
TAG_MM = 0x4D4D4954  # "MMIT"
TAG_SALT = 0x53414C54  # "SALT"
TAG_EMBEDS = 0x454D4244  # "EMBD"

# Lane A: MurmurHash3_x86_32.
_A_C1, _A_C2, _A_R1, _A_R2, _A_M, _A_N = 0xCC9E2D51, 0x1B873593, 15, 13, 5, 0xE6546B64
_A_F1, _A_F2 = 0x85EBCA6B, 0xC2B2AE35
# Lane B: the same shape with xxHash32 primes, other rotations and an xxHash32 finalizer.
_B_C1, _B_C2, _B_R1, _B_R2, _B_M, _B_N = 0x9E3779B1, 0x85EBCA77, 17, 11, 0x165667B1, 0x27D4EB2F
_B_F1, _B_F2 = 0x85EBCA77, 0xC2B2AE3D


# ----------------------------------------------------------------------------- lane helpers
def to_uint64(hi, lo) -> np.ndarray:
    """Combine ``uint32`` lanes (any array-likes of equal shape) into ``numpy.uint64`` keys."""
    hi = np.asarray(hi).astype(np.uint32).astype(np.uint64)
    lo = np.asarray(lo).astype(np.uint32).astype(np.uint64)
    return (hi << np.uint64(32)) | lo


def split_uint64(keys) -> tuple[np.ndarray, np.ndarray]:
    """Split ``uint64`` keys into ``(hi, lo)`` ``numpy.uint32`` lanes."""
    k = np.asarray(keys, dtype=np.uint64)
    return (k >> np.uint64(32)).astype(np.uint32), (k & np.uint64(_M32)).astype(np.uint32)


# ------------------------------------------------------------------- plain-Python reference
def _rotl_py(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _absorb_a_py(h: int, w: int) -> int:
    k = (w * _A_C1) & _M32
    k = _rotl_py(k, _A_R1)
    k = (k * _A_C2) & _M32
    h = _rotl_py(h ^ k, _A_R2)
    return (h * _A_M + _A_N) & _M32


def _absorb_b_py(h: int, w: int) -> int:
    k = (w * _B_C1) & _M32
    k = _rotl_py(k, _B_R1)
    k = (k * _B_C2) & _M32
    h = _rotl_py(h ^ k, _B_R2)
    return (h * _B_M + _B_N) & _M32


def _final_a_py(h: int, n: int) -> int:
    h ^= (4 * n) & _M32
    h ^= h >> 16
    h = (h * _A_F1) & _M32
    h ^= h >> 13
    h = (h * _A_F2) & _M32
    return h ^ (h >> 16)


def _final_b_py(h: int, n: int) -> int:
    h ^= (4 * n) & _M32
    h ^= h >> 15
    h = (h * _B_F1) & _M32
    h ^= h >> 13
    h = (h * _B_F2) & _M32
    return h ^ (h >> 16)


def reference_hash_words(words: Iterable[int]) -> int:
    """``H`` of a word sequence as a Python int in ``[0, 2**64)`` (slow reference)."""
    ha, hb, n = SEED_A, SEED_B, 0
    for w in words:
        w = int(w) & _M32
        ha = _absorb_a_py(ha, w)
        hb = _absorb_b_py(hb, w)
        n += 1
    return (_final_a_py(ha, n) << 32) | _final_b_py(hb, n)


def reference_block_keys(
    tokens: Sequence[int],
    *,
    block_size: int = 16,
    adapter: int = 0,
    cache_salt: int = 0,
    mm_items: Sequence[tuple[int, int, int]] = (),
    prompt_embeds: int = 0,
    parent: int = ROOT,
    start_token: int = 0,
) -> list[int]:
    """Keys of one prompt's full blocks, per the module specification (plain Python, slow).

    ``mm_items`` is a sequence of ``(item_hash, start, length)``; ``parent`` and ``start_token``
    continue a chain (defaults: a fresh prompt). Returns Python ints in ``[0, 2**64)``.
    """
    tokens = [int(t) & _M32 for t in tokens]
    adapter, cache_salt, prompt_embeds = (int(x) & _M32 for x in (adapter, cache_salt, prompt_embeds))
    keys = []
    for j in range(len(tokens) // block_size):
        s = start_token + j * block_size
        e = s + block_size
        words = [parent >> 32, parent & _M32] + tokens[j * block_size : (j + 1) * block_size]
        if adapter:
            words += [TAG_LORA, adapter]
        for h, st, ln in mm_items:
            if ln > 0 and st < e and st + ln > s:
                words += [TAG_MM, int(h) & _M32, int(st) & _M32]
        if s == 0 and cache_salt:
            words += [TAG_SALT, cache_salt]
        if prompt_embeds:
            words += [TAG_EMBEDS, prompt_embeds]
        parent = reference_hash_words(words)
        keys.append(parent)
    return keys


# ------------------------------------------------------------------------------------ salts
#: Who shares a cached block: ``none`` (one namespace), ``per_tenant`` (an organisation's requests
#: share), ``per_user`` (only a user's own requests share). Generators take these as ``salt=``.
SALT_MODES = ("none", "per_tenant", "per_user")
_SALT_NS = {"tenant": 0x54454E54, "user": 0x55534552, "request": 0x52455155}  # "TENT", "USER", "REQU"


def salt_values(namespace: str, ids) -> np.ndarray:
    """Nonzero ``uint32`` cache salts for integer ``ids`` in ``namespace`` (``tenant``, ``user``, ``request``).

    Distinct ids of one namespace get distinct salts (a bijective 32-bit mix of the id, for ids below
    2**32), and the namespaces use different mixes. 0 ("no salt") is never returned: the id whose mix is 0
    gets 1 instead (the only possible clash; ids here are small).
    """
    if namespace not in _SALT_NS:
        raise ValueError(f"unknown salt namespace {namespace!r}; choose one of {sorted(_SALT_NS)}")
    x = np.asarray(ids, dtype=np.int64)
    if np.any(x < 0) or np.any(x >= 2**32):
        raise ValueError("salt ids must lie in [0, 2**32)")
    v = x.astype(np.uint32) ^ np.uint32(_SALT_NS[namespace])
    with np.errstate(over="ignore"):
        for c in (0x85EBCA6B, 0xC2B2AE35):  # murmur3 fmix32: a bijection of uint32
            v = v ^ (v >> np.uint32(16))
            v = v * np.uint32(c)
        v = v ^ (v >> np.uint32(16))
    return np.where(v == 0, np.uint32(1), v).astype(np.uint32)


def rekey_after(w: Workload, at_ms: int, version: int = 1, *, name: str | None = None) -> Workload:
    """``w`` with every request arriving at or after ``at_ms`` keyed as model version ``version``.

    A model or version upgrade (or a new system-prompt deploy) changes every key from the first block
    on: vLLM keys blocks per model, and a salt or root change reaches every descendant through the
    chain. Each key of a later request is XOR-ed with one 64-bit word of ``version`` (a bijection):
    requests of the same version still share exactly what they shared, and no key of the new version
    equals one of the old (up to the 64-bit collision odds). ``version`` must be >= 1.
    """
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 1:
        raise ValueError(f"version must be an integer >= 1, got {version!r}")
    mix = np.uint64((int(salt_values("request", [int(version) % 2**32])[0]) << 32) | 0x9E3779B9)
    after = np.repeat(np.asarray(w.arrival_ms) >= int(at_ms), w.n_blocks)
    keys = np.where(after, w.keys ^ mix, w.keys)
    return Workload(arrival_ms=w.arrival_ms, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
                    tenant=w.tenant, keys=keys, offsets=w.offsets, block_tokens=w.block_tokens,
                    name=name or f"{w.name}-v{version}@{int(at_ms)}ms",
                    meta=dict(w.meta, version_upgrade_ms=int(at_ms), version=int(version)))


# -------------------------------------------------------------------------------- JAX version
def _u32(x):
    return jnp.asarray(x).astype(jnp.uint32)


def _c(x: int):
    return np.uint32(x)


def _rotl(x, r: int):
    return lax.shift_left(x, _c(r)) | lax.shift_right_logical(x, _c(32 - r))


def _absorb_a(h, w):
    k = _rotl(w * _c(_A_C1), _A_R1) * _c(_A_C2)
    return _rotl(h ^ k, _A_R2) * _c(_A_M) + _c(_A_N)


def _absorb_b(h, w):
    k = _rotl(w * _c(_B_C1), _B_R1) * _c(_B_C2)
    return _rotl(h ^ k, _B_R2) * _c(_B_M) + _c(_B_N)


def _final_a(h, n):
    h = h ^ (n * _c(4))
    h = h ^ lax.shift_right_logical(h, _c(16))
    h = h * _c(_A_F1)
    h = h ^ lax.shift_right_logical(h, _c(13))
    h = h * _c(_A_F2)
    return h ^ lax.shift_right_logical(h, _c(16))


def _final_b(h, n):
    h = h ^ (n * _c(4))
    h = h ^ lax.shift_right_logical(h, _c(15))
    h = h * _c(_B_F1)
    h = h ^ lax.shift_right_logical(h, _c(13))
    h = h * _c(_B_F2)
    return h ^ lax.shift_right_logical(h, _c(16))


class _State:
    """Both lanes plus the word count, absorbing words unconditionally or under a mask."""

    def __init__(self, shape):
        self.a = jnp.full(shape, _c(SEED_A), jnp.uint32)
        self.b = jnp.full(shape, _c(SEED_B), jnp.uint32)
        self.n = jnp.zeros(shape, jnp.uint32)

    def absorb(self, w, cond=None):
        a, b = _absorb_a(self.a, w), _absorb_b(self.b, w)
        if cond is None:
            self.a, self.b, self.n = a, b, self.n + _c(1)
        else:
            self.a = jnp.where(cond, a, self.a)
            self.b = jnp.where(cond, b, self.b)
            self.n = self.n + cond.astype(jnp.uint32)

    def final(self):
        return _final_a(self.a, self.n), _final_b(self.b, self.n)


def hash_words(words):
    """JAX ``H`` of word sequences: ``words`` is ``[..., W]``; returns ``(hi, lo)`` of shape ``[...]``."""
    words = _u32(words)
    st = _State(words.shape[:-1])
    for i in range(words.shape[-1]):
        st.absorb(words[..., i])
    return st.final()


_UNROLL_MAX = 32  # unroll the per-token loop up to this block size; scan over tokens beyond


def _mm_arrays(mm_items, n_req: int):
    """``(item_hash uint32, start int32, length int32)``, each ``[N, M]``, checked."""
    if len(mm_items) != 3:
        raise ValueError("mm_items must be (item_hash, start, length)")
    mm_hash = _u32(mm_items[0])
    mm_start = jnp.asarray(mm_items[1]).astype(jnp.int32)
    mm_len = jnp.asarray(mm_items[2]).astype(jnp.int32)
    if not (mm_hash.ndim == 2 and mm_hash.shape[0] == n_req and mm_hash.shape == mm_start.shape == mm_len.shape):
        raise ValueError("mm_items arrays must all have shape [N, M]")
    return mm_hash, mm_start, mm_len


def block_keys(
    tokens,
    lengths,
    *,
    block_size: int = 16,
    adapter=None,
    cache_salt=None,
    mm_items=None,
    prompt_embeds=None,
    parent=None,
    start_token=0,
):
    """Chained keys of every full block of a batch of prompts (jit-compatible).

    Args:
      tokens: int ``[N, Lmax]`` token ids, padded (padding values are never hashed).
      lengths: int ``[N]`` prompt lengths; values above ``Lmax`` count as ``Lmax``.
      block_size: tokens per block (static under jit).
      adapter: optional int ``[N]`` LoRA adapter ids (0 = none), enters every block.
      cache_salt: optional int ``[N]`` (0 = none), enters absolute block 0 only.
      mm_items: optional ``(item_hash [N, M], start [N, M], length [N, M])``; ``length == 0``
        marks an empty slot; positions are absolute.
      prompt_embeds: optional int ``[N]`` prompt-embeds hash (0 = none), enters every block.
      parent: optional ``(hi [N], lo [N])`` uint32 key that block 0 of ``tokens`` chains from
        (default: :data:`ROOT`), to continue a chain.
      start_token: int scalar or ``[N]``: absolute position of ``tokens[:, 0]`` (a multiple of
        ``block_size`` when continuing a chain); used for the salt and multimodal offsets.

    Returns:
      ``(hi, lo, n_blocks)``: ``uint32 [N, Lmax // block_size]`` key lanes (0 beyond a
      request's ``n_blocks``; ignore those) and ``int32 [N]`` ``n_blocks = lengths // block_size``.
    """
    if int(block_size) <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    bs = int(block_size)
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [N, Lmax], got shape {tokens.shape}")
    n_req, lmax = tokens.shape
    nb = lmax // bs
    lengths = jnp.asarray(lengths).astype(jnp.int32)
    if lengths.shape != (n_req,):
        raise ValueError(f"lengths must have shape ({n_req},), got {lengths.shape}")
    n_blocks = jnp.clip(jnp.minimum(lengths, lmax) // bs, 0, nb).astype(jnp.int32)

    def per_request(x, name):
        if x is None:
            return None
        x = _u32(x)
        if x.shape != (n_req,):
            raise ValueError(f"{name} must have shape ({n_req},), got {x.shape}")
        return x

    adapter = per_request(adapter, "adapter")
    cache_salt = per_request(cache_salt, "cache_salt")
    prompt_embeds = per_request(prompt_embeds, "prompt_embeds")
    if mm_items is not None:
        mm_hash, mm_start, mm_len = _mm_arrays(mm_items, n_req)
        mm_end = mm_start + mm_len
        mm_start_w = mm_start.astype(jnp.uint32)
        n_mm = mm_hash.shape[1]
    if parent is None:
        p_hi = jnp.full((n_req,), _c(ROOT_HI), jnp.uint32)
        p_lo = jnp.full((n_req,), _c(ROOT_LO), jnp.uint32)
    else:
        p_hi, p_lo = (jnp.broadcast_to(_u32(p), (n_req,)) for p in parent)
    start = jnp.broadcast_to(jnp.asarray(start_token).astype(jnp.int32), (n_req,))

    # [nb, B, N]: block-major, token-within-block, request.
    blocks = _u32(tokens[:, : nb * bs]).reshape(n_req, nb, bs).transpose(1, 2, 0)
    tag = lambda t: jnp.full((n_req,), _c(t), jnp.uint32)  # noqa: E731

    def step(carry, xs):
        ph, pl = carry
        blk, j = xs
        st = _State((n_req,))
        st.absorb(ph)
        st.absorb(pl)
        if bs <= _UNROLL_MAX:
            for t in range(bs):
                st.absorb(blk[t])
        else:

            def tok_step(ab, w):
                a, b = ab
                return (_absorb_a(a, w), _absorb_b(b, w)), None

            (st.a, st.b), _ = lax.scan(tok_step, (st.a, st.b), blk, unroll=8)
            st.n = st.n + _c(bs)
        s = start + j * bs
        e = s + bs
        if adapter is not None:
            has = adapter != 0
            st.absorb(tag(TAG_LORA), has)
            st.absorb(adapter, has)
        if mm_items is not None:
            for m in range(n_mm):
                hit = (mm_len[:, m] > 0) & (mm_start[:, m] < e) & (mm_end[:, m] > s)
                st.absorb(tag(TAG_MM), hit)
                st.absorb(mm_hash[:, m], hit)
                st.absorb(mm_start_w[:, m], hit)
        if cache_salt is not None:
            has = (cache_salt != 0) & (s == 0)
            st.absorb(tag(TAG_SALT), has)
            st.absorb(cache_salt, has)
        if prompt_embeds is not None:
            has = prompt_embeds != 0
            st.absorb(tag(TAG_EMBEDS), has)
            st.absorb(prompt_embeds, has)
        hi, lo = st.final()
        valid = j < n_blocks
        zero = jnp.zeros_like(hi)
        return (hi, lo), (jnp.where(valid, hi, zero), jnp.where(valid, lo, zero))

    _, (hi, lo) = lax.scan(step, (p_hi, p_lo), (blocks, jnp.arange(nb, dtype=jnp.int32)))
    return hi.T, lo.T, n_blocks


block_keys_jit = jax.jit(block_keys, static_argnames=("block_size",))
""":func:`block_keys` under ``jax.jit`` (``block_size`` static)."""


# ------------------------------------------------------------------------------ host helpers
def pad_tokens(prompts: Sequence[Sequence[int]], *, pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pack ragged prompts into ``(tokens int32 [N, Lmax], lengths int32 [N])`` (zero padding)."""
    lengths = np.array([len(p) for p in prompts], dtype=np.int32)
    lmax = int(lengths.max(initial=0)) if pad_to is None else int(pad_to)
    if lengths.size and lengths.max() > lmax:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest prompt ({lengths.max()})")
    tokens = np.zeros((len(prompts), lmax), dtype=np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = np.asarray(p, dtype=np.int64).astype(np.int32)
    return tokens, lengths


def _per_request(x, n: int, name: str, dtype) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 0:
        a = np.full(n, a)
    if a.shape != (n,):
        raise ValueError(f"{name} must be a scalar or have shape ({n},), got {a.shape}")
    return a.astype(dtype)


def keys_to_workload(
    hi,
    lo,
    n_blocks,
    *,
    block_tokens: int,
    input_tokens,
    arrival_ms=None,
    output_tokens=0,
    tenant=0,
    name: str = "",
    meta: dict | None = None,
) -> Workload:
    """Pack key lanes ``[N, nb]`` (as returned by :func:`block_keys`) into a CSR :class:`Workload`.

    ``arrival_ms`` defaults to ``arange(N)``; ``output_tokens`` and ``tenant`` may be scalars.
    """
    hi, lo = np.asarray(hi), np.asarray(lo)
    n_blocks = np.asarray(n_blocks, dtype=np.int64)
    n = n_blocks.shape[0]
    if hi.shape != lo.shape or hi.ndim != 2 or hi.shape[0] != n:
        raise ValueError(f"hi/lo must be [N, nb] with N = {n}, got {hi.shape} and {lo.shape}")
    if np.any(n_blocks < 0) or np.any(n_blocks > hi.shape[1]):
        raise ValueError("n_blocks must lie in [0, nb]")
    mask = np.arange(hi.shape[1])[None, :] < n_blocks[:, None]
    keys = to_uint64(hi[mask], lo[mask])
    offsets = np.concatenate([[0], np.cumsum(n_blocks)]).astype(np.int64)
    return Workload(
        arrival_ms=np.arange(n) if arrival_ms is None else _per_request(arrival_ms, n, "arrival_ms", np.int64),
        input_tokens=_per_request(input_tokens, n, "input_tokens", np.int64),
        output_tokens=_per_request(output_tokens, n, "output_tokens", np.int64),
        tenant=_per_request(tenant, n, "tenant", np.int32),
        keys=keys,
        offsets=offsets,
        block_tokens=int(block_tokens),
        name=name,
        meta=dict(meta or {}),
    )


def tokens_to_workload(
    tokens,
    lengths,
    *,
    block_tokens: int = 16,
    arrival_ms=None,
    output_tokens=0,
    tenant=0,
    adapter=None,
    cache_salt=None,
    mm_items=None,
    prompt_embeds=None,
    name: str = "",
    meta: dict | None = None,
) -> Workload:
    """Hash padded prompts (see :func:`block_keys`) and return them as a :class:`Workload`.

    ``input_tokens`` is each prompt's length; extra keys are passed through to :func:`block_keys`.
    """
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths)
    if tokens.ndim != 2 or lengths.shape != (tokens.shape[0],):
        raise ValueError(f"tokens must be [N, Lmax] and lengths [N], got {tokens.shape} and {lengths.shape}")
    if np.any(lengths < 0) or np.any(lengths > tokens.shape[1]):
        raise ValueError(f"lengths must lie in [0, {tokens.shape[1]}]")
    hi, lo, nb = block_keys_jit(
        tokens.astype(np.int64).astype(np.int32) if tokens.dtype != np.int32 else tokens,
        lengths.astype(np.int32),
        block_size=int(block_tokens),
        adapter=adapter,
        cache_salt=cache_salt,
        mm_items=mm_items,
        prompt_embeds=prompt_embeds,
    )
    return keys_to_workload(
        hi,
        lo,
        nb,
        block_tokens=block_tokens,
        input_tokens=lengths,
        arrival_ms=arrival_ms,
        output_tokens=output_tokens,
        tenant=tenant,
        name=name,
        meta=meta,
    )

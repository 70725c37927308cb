"""The prompt-byte block hashes of GIE's ``prefix-cache-scorer`` (estimate mode), as dense ids per request.

GIE v0.5.1 (``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``, ``hashPrompt``) hashes the
prompt's *bytes*: a prompt shorter than ``hashBlockSize`` bytes gets no hashes at all; a longer one is cut
to its first ``hashBlockSize x maxPrefixBlocksToMatch`` bytes and gets ``1 + floor(bytes / hashBlockSize)``
hashes: ``h0`` the hash of the model name (the same for every request of a model), then
``h_i = xxhash(block_i || h_{i-1})`` for each whole ``hashBlockSize``-byte block (a partial last block is
ignored). Chained, so ``h_i`` names the first ``i x hashBlockSize`` bytes.

The simulator's prompts are tokens, so the bytes need a model: **assumption**, every token is
``bytes_per_token`` bytes (GIE's own comment: "a good guess of average characters per token is 4"). A
prompt of ``T`` tokens is ``floor(bytes_per_token x T)`` bytes, and the first ``i x hashBlockSize`` bytes
are decided by its first ``t_i = ceil(i x hashBlockSize / bytes_per_token)`` tokens: two prompts share
``h_i`` exactly when they share those tokens.

Two sources of "which prompts share their first ``t`` tokens":

* :func:`gie_hashes_from_keys`, any :class:`~cacheresearch.workload.table.Workload`: from its chained block
  keys. ``t`` at a block boundary is named by the key of block ``t / bt - 1``; inside block ``j`` by
  (block ``j``'s key, ``t mod bt``), which is conservative (two prompts that share the first tokens of
  block ``j`` but differ later in it count as different); inside the trailing partial block (no key) by
  the request alone.
* :func:`gie_hashes_shared_prefix`, inference-perf's ``shared_prefix`` prompts (a group's system prompt,
  then the prompt's own question): exact, ``t`` tokens name (group, t) within the system prompt and
  (prompt, t) beyond it.

Every distinct prefix gets a dense id (``0`` is ``h0``, the model hash); ``GieHashes.ids [N, H]`` holds a
request's ids in prompt order (``h0`` first), ``n [N]`` how many (0 or ``1 + B``), ``space`` the number of
ids. ``H = 1 + maxPrefixBlocksToMatch`` at most.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["GieHashes", "hash_block_ends", "gie_hashes_from_keys", "gie_hashes_shared_prefix"]


class GieHashes(NamedTuple):
    ids: np.ndarray  # int32 [N, H]: dense ids of h0, h1, ..; `space` past a request's n
    n: np.ndarray  # int32 [N]
    space: int  # distinct ids (0 .. space - 1)
    bytes_per_token: float
    hash_block_bytes: int
    max_blocks: int


def _check(bytes_per_token, hash_block_bytes, max_blocks):
    if not (np.isfinite(bytes_per_token) and bytes_per_token > 0):
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token!r}")
    if int(hash_block_bytes) < 1 or int(max_blocks) < 1:
        raise ValueError("hash_block_bytes and max_blocks must be >= 1")


def hash_block_ends(input_tokens, *, bytes_per_token: float = 4.0, hash_block_bytes: int = 64,
                    max_blocks: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(``B [N]`` whole hash blocks of each prompt, ``t [max_blocks]`` the tokens deciding the first ``i``
    blocks, ``t[i - 1] = ceil(i x hash_block_bytes / bytes_per_token)``)."""
    _check(bytes_per_token, hash_block_bytes, max_blocks)
    nbytes = np.floor(np.asarray(input_tokens, np.float64) * float(bytes_per_token) + 1e-9).astype(np.int64)
    B = np.minimum(nbytes // int(hash_block_bytes), int(max_blocks))
    i = np.arange(1, int(max_blocks) + 1, dtype=np.float64)
    t = np.ceil(i * int(hash_block_bytes) / float(bytes_per_token) - 1e-9).astype(np.int64)
    return B, t


def _intern(kind, a, b, B, H, meta) -> GieHashes:
    """Dense ids of identities (kind, a, b) [N, H - 1] (valid where lane < B), h0 = 0 in front."""
    N = B.shape[0]
    valid = np.arange(H - 1)[None, :] < B[:, None]
    rows = np.stack([kind[valid], a[valid], b[valid]], axis=1) if valid.any() else np.zeros((0, 3), np.int64)
    _, inv = np.unique(rows, axis=0, return_inverse=True)
    space = 1 + (int(inv.max()) + 1 if inv.size else 0)
    ids = np.full((N, H), space, np.int64)
    has = B > 0
    ids[has, 0] = 0
    body = np.full((N, H - 1), space, np.int64)
    body[valid] = 1 + inv.reshape(-1)
    ids[:, 1:] = body
    n = np.where(has, B + 1, 0)
    if space >= 2**31 - 2:
        raise ValueError(f"{space} distinct GIE hashes: above the int32 id bound")
    return GieHashes(ids.astype(np.int32), n.astype(np.int32), space, *meta)


def gie_hashes_from_keys(w, *, bytes_per_token: float = 4.0, hash_block_bytes: int = 64,
                         max_blocks: int = 256) -> GieHashes:
    """GIE's hashes of every request of a block-keyed workload (module docstring: conservative inside a
    block, the request alone past its last whole block)."""
    B, t = hash_block_ends(w.input_tokens, bytes_per_token=bytes_per_token, hash_block_bytes=hash_block_bytes,
                           max_blocks=max_blocks)
    N, H, bt = w.n_requests, int(max_blocks) + 1, int(w.block_tokens)
    nb = w.n_blocks.astype(np.int64)
    j = t // bt  # [H - 1]
    rr = t % bt
    keys = w.keys.view(np.int64) if w.keys.size else np.zeros(1, np.int64)
    off = w.offsets[:-1].astype(np.int64)[:, None]
    at_edge = (rr == 0)[None, :]
    blk = np.where(rr == 0, j - 1, j)[None, :]  # the block whose key names the prefix
    keyed = blk < nb[:, None]
    pos = np.clip(off + blk, 0, max(keys.size - 1, 0))
    kv = keys[pos]
    req = np.broadcast_to(np.arange(N, dtype=np.int64)[:, None], (N, H - 1))
    kind = np.where(keyed, np.where(at_edge, 0, 1), 2)
    a = np.where(keyed, kv, req)
    b = np.broadcast_to(np.where(at_edge[0], 0, rr)[None, :], (N, H - 1))
    b = np.where(kind == 2, np.broadcast_to(t[None, :], (N, H - 1)), b)
    return _intern(kind, a, b, B, H, (float(bytes_per_token), int(hash_block_bytes), int(max_blocks)))


def gie_hashes_shared_prefix(group, prompt, *, system_len: int, question_len: int, bytes_per_token: float = 4.0,
                             hash_block_bytes: int = 64, max_blocks: int = 256) -> GieHashes:
    """GIE's hashes of inference-perf ``shared_prefix`` requests (``group [N]``, ``prompt [N]`` per request),
    exact under the bytes-per-token model: ``t`` tokens are the group's own up to ``system_len``, the
    prompt's beyond."""
    group = np.asarray(group, np.int64)
    prompt = np.asarray(prompt, np.int64)
    N, H = group.shape[0], int(max_blocks) + 1
    B, t = hash_block_ends(np.full(N, int(system_len) + int(question_len)), bytes_per_token=bytes_per_token,
                           hash_block_bytes=hash_block_bytes, max_blocks=max_blocks)
    sys_part = (t <= int(system_len))[None, :]
    kind = np.broadcast_to(np.where(sys_part, 0, 1), (N, H - 1))
    a = np.where(sys_part, group[:, None], prompt[:, None])
    b = np.broadcast_to(t[None, :], (N, H - 1))
    return _intern(kind, a, b, B, H, (float(bytes_per_token), int(hash_block_bytes), int(max_blocks)))

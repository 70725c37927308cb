"""Plain-Python oracle of GIE v0.5.1's prefix-cache-scorer (estimate mode), transcribed from its Go code
(``plugins/multi/prefix/plugin.go``: ``hashPrompt``, ``matchLongestPrefix``, ``Score``, ``PostCycle``;
``indexer.go``: per-pod hashicorp LRUs and the hash -> pods map their eviction callback keeps).

It hashes real bytes (xxhash is replaced by Python's blake2b: only equality of chained hashes matters),
so a test can feed it a prompt string and compare with the engine's dense ids.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


def hash_prompt(prompt: bytes, model: str, block: int = 64, max_blocks: int = 256) -> list[int]:
    """``hashPrompt``: no hashes under one block; else h0 = hash(model), h_i = hash(block_i + h_{i-1}) for
    the whole blocks of the first ``block * max_blocks`` bytes."""
    if len(prompt) < block:
        return []
    prompt = prompt[: block * max_blocks]
    res = [int.from_bytes(hashlib.blake2b(model.encode(), digest_size=8).digest(), "little")]
    for i in range(0, len(prompt) - block + 1, block):
        b = prompt[i:i + block] + res[-1].to_bytes(8, "little")
        res.append(int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little"))
    return res


class GieIndexer:
    """``indexer``: per-pod LRU (OrderedDict, most recent last) of at most ``capacity`` hashes."""

    def __init__(self, capacity: int = 31_250):
        self.capacity = int(capacity)
        self.lru: dict[int, OrderedDict] = {}
        self.hash_to_pods: dict[int, set] = {}

    def add(self, hashes, pod: int) -> None:
        lru = self.lru.setdefault(pod, OrderedDict())
        for h in hashes:  # lruForPod.Add: refresh or insert, evicting the oldest beyond capacity
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > self.capacity:
                    old, _ = lru.popitem(last=False)
                    self.hash_to_pods[old].discard(pod)
                    if not self.hash_to_pods[old]:
                        del self.hash_to_pods[old]
        for h in hashes:
            self.hash_to_pods.setdefault(h, set()).add(pod)

    def get(self, h) -> set:
        return self.hash_to_pods.get(h, set())

    def match_longest_prefix(self, hashes) -> dict[int, int]:
        res: dict[int, int] = {}
        for h in hashes:
            pods = self.get(h)
            if not pods:
                break
            for p in pods:
                res[p] = res.get(p, 0) + 1
        return res

    def scores(self, hashes, pods) -> list[float]:
        """``Score``: matched / total per pod (0 without hashes)."""
        total = len(hashes)
        m = self.match_longest_prefix(hashes)
        return [0.0 if total == 0 else m.get(p, 0) / total for p in pods]

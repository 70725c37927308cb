"""The request table every simulation consumes.

A :class:`Workload` is host-side (NumPy) data: one row per request (arrival time in integer
milliseconds, input and output length in tokens, tenant) and the request's block keys stored
CSR-style: ``keys[offsets[i]:offsets[i + 1]]`` are request ``i``'s block keys in prompt order.
Keys are 64-bit (``uint64``); a key identifies a block *and its whole prefix* (chained hashing,
see :mod:`cacheresearch.workload.keys`), so two requests share a cached block only if they share every
block before it.

Trace loaders (:mod:`cacheresearch.workload.trace`) and synthetic generators (:mod:`cacheresearch.workload.synthetic`)
produce a ``Workload``; :func:`cacheresearch.engine.compile_stream` turns it into device arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Workload", "WorkloadError"]

#: Arrival times are int32 milliseconds inside the engine, with headroom for sums: 12.4 days (checked by
#: ``cacheresearch.core.stream.compile_stream``).
MAX_ARRIVAL_MS = np.iinfo(np.int32).max // 2
#: The span a workload itself may hold (ms; exact in float64): the fit (its samples and curves) take it.
MAX_TRACE_MS = 2**53


class WorkloadError(ValueError):
    """A workload violates the request-table contract."""


@dataclass(frozen=True, eq=False)
class Workload:
    arrival_ms: np.ndarray  # int64 [N], non-decreasing
    input_tokens: np.ndarray  # int64 [N], >= 0
    output_tokens: np.ndarray  # int64 [N], >= 0
    tenant: np.ndarray  # int32 [N]
    keys: np.ndarray  # uint64 [sum of blocks]
    offsets: np.ndarray  # int64 [N + 1], offsets[0] == 0
    block_tokens: int
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        conv = {
            "arrival_ms": np.int64,
            "input_tokens": np.int64,
            "output_tokens": np.int64,
            "tenant": np.int32,
            "keys": np.uint64,
            "offsets": np.int64,
        }
        for name, dt in conv.items():
            object.__setattr__(self, name, np.ascontiguousarray(np.asarray(getattr(self, name)), dtype=dt))
        self.validate()

    # ------------------------------------------------------------------ basics
    @property
    def n_requests(self) -> int:
        return int(self.arrival_ms.shape[0])

    @property
    def n_blocks(self) -> np.ndarray:
        """Number of block keys of each request."""
        return np.diff(self.offsets)

    @property
    def total_blocks(self) -> int:
        return int(self.offsets[-1])

    def request_keys(self, i: int) -> np.ndarray:
        return self.keys[self.offsets[i] : self.offsets[i + 1]]

    def __len__(self) -> int:
        return self.n_requests

    def validate(self) -> None:
        n = self.arrival_ms.shape[0]
        for name in ("input_tokens", "output_tokens", "tenant"):
            if getattr(self, name).shape != (n,):
                raise WorkloadError(f"{name} has shape {getattr(self, name).shape}, expected ({n},)")
        if self.offsets.shape != (n + 1,) or (n + 1 and self.offsets[0] != 0):
            raise WorkloadError("offsets must have N + 1 entries starting at 0")
        if np.any(np.diff(self.offsets) < 0) or self.offsets[-1] != self.keys.shape[0]:
            raise WorkloadError("offsets must be non-decreasing and end at len(keys)")
        if self.block_tokens <= 0:
            raise WorkloadError(f"block_tokens must be positive, got {self.block_tokens}")
        if n:
            if np.any(self.input_tokens < 0) or np.any(self.output_tokens < 0):
                raise WorkloadError("token counts must be non-negative")
            if np.any(np.diff(self.arrival_ms) < 0):
                i = int(np.argmax(np.diff(self.arrival_ms) < 0)) + 1
                raise WorkloadError(f"arrival times must be non-decreasing (request {i})")
            if self.arrival_ms[0] < 0 or self.arrival_ms[-1] > MAX_TRACE_MS:
                raise WorkloadError(f"arrival times must lie in [0, {MAX_TRACE_MS}] ms; shift or split the trace")

    def dense_ids(self) -> np.ndarray:
        """Each block key's rank among the distinct keys (int64 [total blocks]); cached."""
        cache = self.__dict__.get("_dense")
        if cache is None:
            cache = self._sort_keys()[0]
        return cache

    def _sort_keys(self) -> tuple[np.ndarray, int]:
        """One stable sort of the keys gives both the dense ids (``np.unique``'s inverse) and the first
        request that repeats a key (-1: none): equal keys are adjacent in key order, and within them in
        position order, so a request's repeated key is two neighbours with the same request. Both cached."""
        order = np.argsort(self.keys, kind="stable")
        k = self.keys[order]
        new = np.ones(k.shape[0], dtype=bool)
        new[1:] = k[1:] != k[:-1]
        del k  # one block-long temporary at a time (a day of the design scenario has 32M blocks)
        ids = np.empty(new.shape[0], dtype=np.int64)
        c = np.cumsum(new, dtype=np.int64)
        c -= 1
        ids[order] = c
        del c
        # the request of each sorted position: the first whose end lies past it (empty requests hold none)
        req = np.searchsorted(np.asarray(self.offsets[1:], np.int64), order, side="right")
        del order
        dup = ~new[1:] & (req[1:] == req[:-1])
        first = int(req[1:][dup].min()) if dup.any() else -1
        object.__setattr__(self, "_dense", ids)
        object.__setattr__(self, "_repeat", first)
        return ids, first

    def check_distinct_keys(self) -> None:
        """Chained keys never repeat inside one request; the engine relies on it (checked once)."""
        if self.total_blocks == 0:
            return
        first = self.__dict__.get("_repeat")
        if first is None:
            first = self._sort_keys()[1]
        if first >= 0:
            raise WorkloadError(
                f"request {first} repeats a block key; chained block keys are distinct within a request"
            )

    # ------------------------------------------------------------ conveniences
    def slice(self, start: int, stop: int) -> "Workload":
        """Requests ``start:stop`` as a new workload (keys shared, offsets rebased)."""
        o = self.offsets[start : stop + 1]
        return Workload(
            arrival_ms=self.arrival_ms[start:stop],
            input_tokens=self.input_tokens[start:stop],
            output_tokens=self.output_tokens[start:stop],
            tenant=self.tenant[start:stop],
            keys=self.keys[o[0] : o[-1]],
            offsets=o - o[0],
            block_tokens=self.block_tokens,
            name=self.name,
            meta=dict(self.meta),
        )

    @staticmethod
    def from_lists(
        keys: list,
        *,
        block_tokens: int,
        arrival_ms=None,
        input_tokens=None,
        output_tokens=None,
        tenant=None,
        name: str = "",
    ) -> "Workload":
        """Build from a list of per-request key lists (tests, small examples).

        ``input_tokens`` defaults to ``len(keys) * block_tokens`` per request.
        """
        n = len(keys)
        lens = np.array([len(k) for k in keys], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        flat = np.array([int(x) for k in keys for x in k], dtype=np.uint64)
        return Workload(
            arrival_ms=np.arange(n) if arrival_ms is None else arrival_ms,
            input_tokens=lens * block_tokens if input_tokens is None else input_tokens,
            output_tokens=np.zeros(n) if output_tokens is None else output_tokens,
            tenant=np.zeros(n) if tenant is None else tenant,
            keys=flat,
            offsets=offsets,
            block_tokens=block_tokens,
            name=name,
        )

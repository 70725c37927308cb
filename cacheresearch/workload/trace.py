"""Trace input and output.

Mooncake JSONL
    One JSON object per line::

        {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, ...]}

    ``timestamp`` is the arrival time in integer milliseconds (kept as given: it must be
    non-negative and non-decreasing, unless ``sort=True`` orders the requests by it; a float must
    have an integral value; a trace whose timestamps run past the engine's span, such as
    epoch milliseconds, is rebased to its first request and the offset kept in ``meta["timestamp_offset_ms"]``),
    ``input_length``/``output_length`` are token counts and
    ``hash_ids`` lists the prompt's block ids in prompt order. Each id stands for a block *and its
    whole prefix* (chained hashing), so the ids become the workload's block keys unchanged. The
    block size is not in the file: the caller gives it (512 tokens for Mooncake's traces), or it is
    inferred (:data:`BLOCK_SIZES` that fit every line; 512 when it fits, else the largest), and
    ``len(hash_ids) == ceil(input_length / block_tokens)`` must hold on every line. An optional
    non-negative integer ``tenant`` field is read when present (default 0); other fields are
    ignored. Blank lines are skipped.

Qwen-Bailian JSONL (Alibaba's "KVCache Cache in the Wild" usage traces)
    One JSON object per line::

        {"chat_id": 7, "parent_chat_id": 3, "timestamp": 61.25, "input_length": 1840,
         "output_length": 212, "type": "text", "turn": 2, "hash_ids": [0, 1, ...]}

    ``timestamp`` is in seconds from the trace start (integer or float; stored as integer
    milliseconds, rounded), ``hash_ids`` are 16-token blocks by default
    (``len(hash_ids) == ceil(input_length / 16)``), ``chat_id`` is a non-negative integer unique in
    the file, ``parent_chat_id`` is ``-1`` for the first request of a session or the ``chat_id`` of
    an earlier request, ``type`` is a request category (``text``, ``search``, ``image``, ``file``;
    other non-empty names are kept too) and ``turn`` a non-negative integer. :func:`read_bailian`
    returns the workload with the session structure (:class:`BailianTrace`): each request's parent
    request (by ``parent_chat_id``), its session (the root of its parent chain) and its type; the
    workload's ``tenant`` column is the type's index. A parent that is not in the file (the trace is
    a window of a longer log) makes its child the root of a new session; the count is kept in
    ``meta["orphans"]``.

:func:`load_trace` reads either format, given (``format="mooncake"`` / ``"bailian"``) or detected
from the first non-blank line (a ``chat_id`` field means Bailian).

libCacheSim oracleGeneral
    Packed 24-byte little-endian records ``(uint32 time, uint64 id, uint32 size,
    int64 next_access_vtime)``; ``next_access_vtime`` is the index of the next record with the same
    id, or -1. :func:`write_oracle_general` writes a block-id access stream in this format so that
    libCacheSim can replay it as a cross-check.
"""

from __future__ import annotations

import json
import math
from os import PathLike
from pathlib import Path
from typing import NamedTuple

import numpy as np

from cacheresearch.workload.table import MAX_ARRIVAL_MS, MAX_TRACE_MS, Workload

__all__ = [
    "TraceError",
    "BlockSizeError",
    "BLOCK_SIZES",
    "TRACE_FORMATS",
    "BailianTrace",
    "detect_format",
    "estimate_trace_size",
    "TraceSize",
    "load_trace",
    "load_mooncake",
    "read_bailian",
    "load_bailian",
    "save_bailian",
    "save_mooncake",
    "write_oracle_general",
    "read_oracle_general",
    "ORACLE_GENERAL_DTYPE",
]

_U64_MAX = (1 << 64) - 1
_I32_MAX = (1 << 31) - 1

#: One oracleGeneral record: packed (no padding), little-endian, 24 bytes.
ORACLE_GENERAL_DTYPE = np.dtype(
    [("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next_access_vtime", "<i8")]
)
assert ORACLE_GENERAL_DTYPE.itemsize == 24


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the 1-based line and the field."""


class BlockSizeError(TraceError):
    """A line's ``hash_ids`` count does not fit the block size (given, or inferred from the lines before it): the
    message names the file and line; a caller that knows the configuration key of the block size adds it."""


#: Block sizes (tokens per hash id) a Mooncake-format trace is tried at when none is given.
BLOCK_SIZES = (16, 32, 64, 128, 256, 512, 1024)


def _fail(path, lineno: int, field: str | None, msg: str, cls=TraceError) -> TraceError:
    where = f"{path}:{lineno}"
    if field is not None:
        return cls(f"{where}: field {field!r}: {msg}")
    return cls(f"{where}: {msg}")


def _fitting(n_in: int, n_ids: int, sizes=BLOCK_SIZES) -> set:
    """The block sizes of ``sizes`` with ``ceil(n_in / b) == n_ids``."""
    return {b for b in sizes if -(-n_in // b) == n_ids}


def _length_error(path, lineno: int, n_ids: int, n_in: int, block_tokens: int | None, fit_before: set | None,
                  first_line: int) -> BlockSizeError:
    """The line whose ``hash_ids`` count fits no block size: the given one, or (inferring) any of those that fit
    every line before it; the sizes that would fit it are named."""
    here = sorted(_fitting(n_in, n_ids))
    fits = f"block sizes of {list(BLOCK_SIZES)} that fit this line: {here}" if here else \
        f"no block size of {list(BLOCK_SIZES)} fits this line"
    if block_tokens is not None:
        msg = (f"has {n_ids} ids but input_length {n_in} with block_tokens {block_tokens} needs "
               f"ceil({n_in}/{block_tokens}) = {-(-n_in // block_tokens)} ({fits})")
    elif fit_before is None or lineno == first_line:
        msg = f"has {n_ids} ids for input_length {n_in}: {fits}; the trace's block size is to be given"
    else:
        msg = (f"has {n_ids} ids for input_length {n_in}, which fits none of the block sizes that fit lines "
               f"{first_line}-{lineno - 1} ({sorted(fit_before)}); {fits}: a corrupt line, or lines of another "
               "block size")
    return _fail(path, lineno, "hash_ids", msg, BlockSizeError)


def _int_field(obj: dict, field: str, path, lineno: int, upper: int | None = None) -> int:
    if field not in obj:
        raise _fail(path, lineno, field, "missing")
    v = obj[field]
    if type(v) is not int:  # rejects bool, float, str, None, ...
        raise _fail(path, lineno, field, f"expected a non-negative integer, got {v!r}")
    if v < 0:
        raise _fail(path, lineno, field, f"must be non-negative, got {v}")
    if upper is not None and v > upper:
        raise _fail(path, lineno, field, f"must be at most {upper}, got {v}")
    return v


def _ms_field(obj: dict, path, lineno: int) -> int:
    """Milliseconds of a Mooncake ``timestamp``: an integer, or a float with an integral value (JSON
    writers emit ``10.0``); a fraction is refused (Mooncake's clock is integer milliseconds, and a
    fractional value is more likely seconds, as in a Bailian trace, than a fraction of a millisecond)."""
    if "timestamp" not in obj:
        raise _fail(path, lineno, "timestamp", "missing")
    v = obj["timestamp"]
    if type(v) is float:
        if not math.isfinite(v) or v < 0 or v > 2**62 or v != math.floor(v):
            raise _fail(path, lineno, "timestamp",
                        f"expected a non-negative integer number of milliseconds, got {v!r}"
                        + (" (a fraction: seconds? a Bailian trace's timestamps are seconds: format=bailian)"
                           if math.isfinite(v) and v >= 0 and v != math.floor(v) else ""))
        return int(v)
    return _int_field(obj, "timestamp", path, lineno, upper=2**62)  # int64 headroom; the span is checked later


def _check_hash_ids(ids, path, lineno: int) -> None:
    if type(ids) is not list:
        raise _fail(path, lineno, "hash_ids", f"expected a list of integers, got {type(ids).__name__}")
    if not ids:
        return
    # Fast path: every element a plain int within [0, 2**64).
    if all(type(h) is int for h in ids) and min(ids) >= 0 and max(ids) <= _U64_MAX:
        if len(set(ids)) != len(ids):
            seen = set()
            for j, h in enumerate(ids):
                if h in seen:
                    raise _fail(
                        path, lineno, "hash_ids",
                        f"hash id {h} repeats within the request (position {j}); "
                        "chained block ids are distinct within a request",
                    )
                seen.add(h)
        return
    for j, h in enumerate(ids):
        if type(h) is not int:
            raise _fail(path, lineno, "hash_ids", f"element {j} is not an integer: {h!r}")
        if not 0 <= h <= _U64_MAX:
            raise _fail(path, lineno, "hash_ids", f"element {j} = {h} is outside [0, 2**64)")
    raise AssertionError("unreachable")  # pragma: no cover


def _span_message(ts_ms: int, base_ms: int, n_before: int) -> str:
    rebased = f" after rebasing to the first request ({base_ms} ms)" if base_ms else ""
    return (f"{ts_ms} ms{rebased} is beyond a workload's span ({MAX_TRACE_MS} ms); take the first part of "
            f"the trace with max_requests (trace.max_requests={n_before} or fewer) or split it into windows")


def load_mooncake(
    path: str | PathLike,
    *,
    block_tokens: int | None = None,
    max_requests: int | None = None,
    name: str | None = None,
    sort: bool = False,
) -> Workload:
    """Load a Mooncake-format JSONL trace into a :class:`Workload`.

    ``block_tokens`` is the tokens per ``hash_ids`` entry (512 for the Mooncake traces); None infers it: the
    sizes of :data:`BLOCK_SIZES` that fit every line read, 512 when it is one of them, else the largest
    (``meta["block_tokens_inferred"]`` lists those that fit); a line that fits none of the sizes that fit the
    lines before it is reported as itself (:class:`BlockSizeError`).
    ``max_requests`` keeps only the first that many requests (the rest of the file is not read).
    ``name`` defaults to the file's stem. Raises :class:`TraceError` on malformed input.
    Timestamps are integer milliseconds (a float with an integral value is read as one; a fraction
    is refused: it is more likely seconds than a fraction of a millisecond). A timestamp below the one
    before it is an error unless ``sort``:
    then the requests are ordered by timestamp (stable: ties keep the file's order; logs written at
    completion are out of arrival order) and ``meta["requests_reordered"]`` counts the requests moved.
    """
    if block_tokens is not None and (type(block_tokens) is not int or block_tokens <= 0):
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    if max_requests is not None and (type(max_requests) is not int or max_requests < 1):
        raise ValueError(f"max_requests must be a positive integer or None, got {max_requests!r}")
    p = Path(path)
    fit = set(BLOCK_SIZES) if block_tokens is None else None  # inferring: the sizes that fit every line so far
    first_line = 0
    ts_l: list[int] = []
    in_l: list[int] = []
    out_l: list[int] = []
    ten_l: list[int] = []
    len_l: list[int] = []
    flat: list[int] = []
    line_l: list[int] = []
    prev_ts = -1
    prev_line = 0
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if max_requests is not None and len(ts_l) >= max_requests:
                break
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                raise _fail(path, lineno, None, f"invalid JSON ({e})") from None
            if type(obj) is not dict:
                raise _fail(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
            ts = _ms_field(obj, path, lineno)
            if ts < prev_ts and not sort:
                raise _fail(
                    path, lineno, "timestamp",
                    f"timestamps must be non-decreasing: {ts} after {prev_ts} (line {prev_line}); "
                    "trace.sort=true (load_mooncake(sort=True)) orders the requests by timestamp",
                )
            n_in = _int_field(obj, "input_length", path, lineno)
            n_out = _int_field(obj, "output_length", path, lineno)
            tenant = _int_field(obj, "tenant", path, lineno, upper=_I32_MAX) if "tenant" in obj else 0
            if "hash_ids" not in obj:
                raise _fail(path, lineno, "hash_ids", "missing")
            ids = obj["hash_ids"]
            _check_hash_ids(ids, path, lineno)
            first_line = first_line or lineno
            if fit is not None:
                now = {b for b in fit if -(-n_in // b) == len(ids)}
                if not now:
                    raise _length_error(path, lineno, len(ids), n_in, None, fit, first_line)
                fit = now
            elif len(ids) != -(-n_in // block_tokens):
                raise _length_error(path, lineno, len(ids), n_in, block_tokens, None, first_line)
            prev_ts, prev_line = ts, lineno
            line_l.append(lineno)
            ts_l.append(ts)
            in_l.append(n_in)
            out_l.append(n_out)
            ten_l.append(tenant)
            len_l.append(len(ids))
            flat.extend(ids)
    if not ts_l:
        raise TraceError(f"{path}:1: empty trace: no requests found")
    inferred = {}
    if fit is not None:
        block_tokens = 512 if 512 in fit else max(fit)
        inferred = {"block_tokens_inferred": ",".join(str(b) for b in sorted(fit))}
    arrival = np.asarray(ts_l, dtype=np.int64)
    keys = np.asarray(flat, dtype=np.uint64)
    lens = np.asarray(len_l, dtype=np.int64)
    moved = 0
    if sort and np.any(arrival[1:] < arrival[:-1]):
        o = np.argsort(arrival, kind="stable")
        moved = int(np.sum(o != np.arange(o.size)))
        off0 = np.concatenate([[0], np.cumsum(lens)])
        lo = lens[o]  # each request's blocks, in the new order, by one gather
        keys = keys[np.repeat(off0[:-1][o] - np.concatenate([[0], np.cumsum(lo)[:-1]]), lo) + np.arange(lo.sum())]
        arrival, lens = arrival[o], lens[o]
        line_l, in_l, out_l, ten_l = ([x[i] for i in o] for x in (line_l, in_l, out_l, ten_l))
    base = int(arrival[0]) if arrival[-1] > MAX_ARRIVAL_MS else 0  # e.g. epoch milliseconds: rebase
    arrival -= base
    if arrival[-1] > MAX_TRACE_MS:
        i = int(np.argmax(arrival > MAX_TRACE_MS))
        raise _fail(path, line_l[i], "timestamp", _span_message(int(arrival[i]), base, i))
    offsets = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    extra = {**({"timestamp_offset_ms": int(base)} if base else {}),
             **({"requests_reordered": moved} if moved else {}), **inferred}
    return Workload(
        arrival_ms=arrival,
        input_tokens=np.asarray(in_l, dtype=np.int64),
        output_tokens=np.asarray(out_l, dtype=np.int64),
        tenant=np.asarray(ten_l, dtype=np.int32),
        keys=keys,
        offsets=offsets,
        block_tokens=block_tokens,
        name=p.stem if name is None else name,
        meta={"format": "mooncake", "file": p.name, **extra},
    )


def save_mooncake(workload: Workload, path: str | PathLike) -> Path:
    """Write ``workload`` in the Mooncake JSONL format (inverse of :func:`load_mooncake`).

    A ``tenant`` field is written only when some request has a non-zero tenant. Raises
    ``ValueError`` when a request's block count is not ``ceil(input_tokens / block_tokens)``
    (the loader would reject the file).
    """
    w = workload
    bt = w.block_tokens
    need = -(-w.input_tokens // bt)
    bad = np.nonzero(need != w.n_blocks)[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"request {i} has {int(w.n_blocks[i])} blocks but input_tokens {int(w.input_tokens[i])} "
            f"needs {int(need[i])} at block_tokens {bt}; not representable as Mooncake JSONL"
        )
    with_tenant = bool(np.any(w.tenant != 0))
    ts = w.arrival_ms.tolist()
    n_in = w.input_tokens.tolist()
    n_out = w.output_tokens.tolist()
    ten = w.tenant.tolist()
    off = w.offsets.tolist()
    keys = w.keys.tolist()
    lines = []
    for i in range(w.n_requests):
        rec = {"timestamp": ts[i], "input_length": n_in[i], "output_length": n_out[i]}
        if with_tenant:
            rec["tenant"] = ten[i]
        rec["hash_ids"] = keys[off[i] : off[i + 1]]
        lines.append(json.dumps(rec))
    p = Path(path)
    with open(p, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
        if lines:
            f.write("\n")
    return p


def write_oracle_general(block_ids: np.ndarray, path: str | PathLike, *, times=None) -> int:
    """Write a block-id access stream as a libCacheSim oracleGeneral binary trace.

    Record ``i`` is ``(time, block_ids[i], 1, next)`` where ``next`` is the index of the next
    access to the same id (or -1) and ``time`` is ``times[i]`` (default: ``i``). Returns the
    number of records written.
    """
    ids = np.ascontiguousarray(np.asarray(block_ids), dtype=np.uint64).reshape(-1)
    n = ids.shape[0]
    if n >= 1 << 32:
        raise ValueError("oracleGeneral supports fewer than 2**32 records")
    if times is None:
        t = np.arange(n, dtype=np.uint32)
    else:
        t64 = np.asarray(times, dtype=np.int64).reshape(-1)
        if t64.shape != (n,) or (n and (t64.min() < 0 or t64.max() >= 1 << 32)):
            raise ValueError("times must have one entry per id, each in [0, 2**32)")
        t = t64.astype(np.uint32)
    order = np.argsort(ids, kind="stable")  # equal ids stay in stream order
    s = ids[order]
    same = s[1:] == s[:-1]
    nxt = np.full(n, -1, dtype=np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    rec = np.empty(n, dtype=ORACLE_GENERAL_DTYPE)
    rec["time"] = t
    rec["id"] = ids
    rec["size"] = 1
    rec["next_access_vtime"] = nxt
    rec.tofile(Path(path))
    return n


def read_oracle_general(path: str | PathLike) -> np.ndarray:
    """Read an oracleGeneral file back as a structured array of :data:`ORACLE_GENERAL_DTYPE`."""
    return np.fromfile(Path(path), dtype=ORACLE_GENERAL_DTYPE)


# ------------------------------------------------------------------------------ Qwen-Bailian
#: Trace formats :func:`load_trace` reads, with the tokens per ``hash_ids`` entry each uses by default.
TRACE_FORMATS = {"mooncake": 512, "bailian": 16}
BAILIAN_TYPES = ("text", "search", "image", "file")


class BailianTrace(NamedTuple):
    """A Bailian trace: the request table and its sessions (one entry per request, file order)."""

    workload: Workload  # tenant = index into type_names
    chat_id: np.ndarray  # int64 [N]
    parent_chat_id: np.ndarray  # int64 [N] (-1: a root)
    parent: np.ndarray  # int64 [N]: index of the parent request, -1 for a root (or an orphan)
    session: np.ndarray  # int64 [N]: 0-based session index (sessions numbered by their first request)
    turn: np.ndarray  # int64 [N]
    type: np.ndarray  # int32 [N]: index into type_names
    type_names: tuple  # category names, known ones first (text, search, image, file), then in order of appearance

    @property
    def n_sessions(self) -> int:
        return int(self.session.max(initial=-1)) + 1


def _timestamp_s(obj: dict, path, lineno: int) -> int:
    if "timestamp" not in obj:
        raise _fail(path, lineno, "timestamp", "missing")
    v = obj["timestamp"]
    if type(v) not in (int, float) or not math.isfinite(v):
        raise _fail(path, lineno, "timestamp", f"expected a finite number of seconds, got {v!r}")
    if v < 0:
        raise _fail(path, lineno, "timestamp", f"must be non-negative, got {v}")
    ms = int(round(v * 1000))
    if ms > MAX_TRACE_MS:
        raise _fail(path, lineno, "timestamp", f"{v} s is beyond a workload's span ({MAX_TRACE_MS / 1000:.0f} s)")
    return ms


def read_bailian(
    path: str | PathLike,
    *,
    block_tokens: int = 16,
    max_requests: int | None = None,
    name: str | None = None,
) -> BailianTrace:
    """Read a Qwen-Bailian JSONL trace (module docstring) with its sessions.

    Raises :class:`TraceError` naming the file, the 1-based line and the field on malformed input
    (missing or mistyped fields, decreasing timestamps, a repeated ``chat_id``, a request that is
    its own parent, ``hash_ids`` of the wrong length or repeating an id).
    """
    if type(block_tokens) is not int or block_tokens <= 0:
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    if max_requests is not None and (type(max_requests) is not int or max_requests < 1):
        raise ValueError(f"max_requests must be a positive integer or None, got {max_requests!r}")
    p = Path(path)
    cols: dict[str, list] = {k: [] for k in ("ts", "in", "out", "chat", "par", "turn", "type", "len")}
    flat: list[int] = []
    index_of: dict[int, int] = {}
    line_of: dict[int, int] = {}
    types: dict[str, int] = {t: i for i, t in enumerate(BAILIAN_TYPES)}
    prev_ts, prev_line = -1, 0
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if max_requests is not None and len(cols["ts"]) >= max_requests:
                break
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise _fail(path, lineno, None, f"invalid JSON ({e})") from None
            if type(obj) is not dict:
                raise _fail(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
            chat = _int_field(obj, "chat_id", path, lineno)
            if chat in index_of:
                raise _fail(path, lineno, "chat_id", f"{chat} repeats (first on line {line_of[chat]})")
            if "parent_chat_id" not in obj:
                raise _fail(path, lineno, "parent_chat_id", "missing")
            par = obj["parent_chat_id"]
            if type(par) is not int or par < -1:
                raise _fail(path, lineno, "parent_chat_id", f"expected -1 (a root) or a chat_id, got {par!r}")
            if par == chat:
                raise _fail(path, lineno, "parent_chat_id", f"a request cannot be its own parent ({chat})")
            ts = _timestamp_s(obj, path, lineno)
            if ts < prev_ts:
                raise _fail(path, lineno, "timestamp",
                            f"timestamps must be non-decreasing: {ts / 1000} s after {prev_ts / 1000} s "
                            f"(line {prev_line})")
            n_in = _int_field(obj, "input_length", path, lineno)
            n_out = _int_field(obj, "output_length", path, lineno)
            turn = _int_field(obj, "turn", path, lineno)
            if "type" not in obj:
                raise _fail(path, lineno, "type", "missing")
            tname = obj["type"]
            if type(tname) is not str or not tname:
                raise _fail(path, lineno, "type", f"expected a category name such as "
                                                  f"{'/'.join(BAILIAN_TYPES)}, got {tname!r}")
            if "hash_ids" not in obj:
                raise _fail(path, lineno, "hash_ids", "missing")
            ids = obj["hash_ids"]
            _check_hash_ids(ids, path, lineno)
            if len(ids) != -(-n_in // block_tokens):
                raise _length_error(path, lineno, len(ids), n_in, block_tokens, None, lineno)
            prev_ts, prev_line = ts, lineno
            index_of[chat] = len(cols["ts"])
            line_of[chat] = lineno
            for k, v in (("ts", ts), ("in", n_in), ("out", n_out), ("chat", chat), ("par", par), ("turn", turn),
                         ("type", types.setdefault(tname, len(types))), ("len", len(ids))):
                cols[k].append(v)
            flat.extend(ids)
    if not cols["ts"]:
        raise TraceError(f"{path}:1: empty trace: no requests found")
    n = len(cols["ts"])
    parent = np.array([index_of.get(q, -1) if q >= 0 else -1 for q in cols["par"]], dtype=np.int64)
    # a parent listed later than its child is not a parent in arrival order: treat the child as a root
    parent = np.where(parent < np.arange(n), parent, -1)
    orphans = int(np.sum((np.asarray(cols["par"]) >= 0) & (parent < 0)))
    session = np.empty(n, dtype=np.int64)
    n_sess = 0
    for i in range(n):  # parents come first, so one forward pass labels every chain
        if parent[i] < 0:
            session[i] = n_sess
            n_sess += 1
        else:
            session[i] = session[parent[i]]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.asarray(cols["len"], dtype=np.int64), out=offsets[1:])
    names = tuple(sorted(types, key=types.get))
    used = sorted(set(cols["type"]))
    remap = np.full(len(names), -1, np.int32)  # keep only the categories present, known ones first
    remap[used] = np.arange(len(used), dtype=np.int32)
    tcode = remap[np.asarray(cols["type"], dtype=np.int64)]
    names = tuple(names[u] for u in used)
    w = Workload(
        arrival_ms=np.asarray(cols["ts"], dtype=np.int64),
        input_tokens=np.asarray(cols["in"], dtype=np.int64),
        output_tokens=np.asarray(cols["out"], dtype=np.int64),
        tenant=tcode,
        keys=np.asarray(flat, dtype=np.uint64),
        offsets=offsets,
        block_tokens=block_tokens,
        name=p.stem if name is None else name,
        meta={"format": "bailian", "file": p.name, "types": ",".join(names), "sessions": n_sess,
              "orphans": orphans},
    )
    return BailianTrace(w, np.asarray(cols["chat"], np.int64), np.asarray(cols["par"], np.int64), parent, session,
                        np.asarray(cols["turn"], np.int64), tcode, names)


def load_bailian(path: str | PathLike, *, block_tokens: int = 16, max_requests: int | None = None,
                 name: str | None = None) -> Workload:
    """The request table of a Bailian trace (:func:`read_bailian` without the session arrays)."""
    return read_bailian(path, block_tokens=block_tokens, max_requests=max_requests, name=name).workload


def save_bailian(trace: BailianTrace, path: str | PathLike) -> Path:
    """Write a :class:`BailianTrace` as Bailian JSONL (inverse of :func:`read_bailian`, timestamps in
    seconds with millisecond resolution)."""
    w = trace.workload
    off = w.offsets.tolist()
    keys = w.keys.tolist()
    lines = []
    for i in range(w.n_requests):
        rec = {"chat_id": int(trace.chat_id[i]), "parent_chat_id": int(trace.parent_chat_id[i]),
               "timestamp": int(w.arrival_ms[i]) / 1000, "input_length": int(w.input_tokens[i]),
               "output_length": int(w.output_tokens[i]), "type": trace.type_names[int(trace.type[i])],
               "turn": int(trace.turn[i]), "hash_ids": keys[off[i]: off[i + 1]]}
        lines.append(json.dumps(rec))
    p = Path(path)
    p.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return p


class TraceSize(NamedTuple):
    """An estimate of a JSONL trace's size from its first lines and its byte count."""

    requests: int  # lines with a request (estimated)
    blocks: int  # hash ids over all requests (estimated)
    exact: bool  # True when the whole file was read
    bytes_per_request: float


def estimate_trace_size(path: str | PathLike, *, sample_lines: int = 1000, windows: int = 20) -> TraceSize:
    """Requests and blocks of a Mooncake or Bailian JSONL file without reading it all: about
    ``sample_lines`` lines read in ``windows`` stretches spread evenly over the file (contexts grow
    over a trace, so its first lines alone undercount), scaled by the file's byte count; exact when
    the file is read whole. What a study reads to estimate its memory before it loads the trace. Lines
    that are not JSON objects with a ``hash_ids`` list count as requests without blocks."""
    size = Path(path).stat().st_size
    n = nb = used = 0
    per = max(1, sample_lines // max(1, windows))

    def take(raw: bytes) -> None:
        nonlocal n, nb, used
        used += len(raw)
        if not raw.strip():
            return
        n += 1
        try:
            ids = json.loads(raw).get("hash_ids")
            nb += len(ids) if isinstance(ids, list) else 0
        except (ValueError, AttributeError):
            pass

    with open(path, "rb") as f:
        whole = True
        for raw in f:  # the whole file when it is small, else the first window
            take(raw)
            if n >= sample_lines:
                whole = f.read(1) == b""
                break
        if not whole:
            n = nb = used = 0
            for k in range(windows):
                f.seek(int(k * size / windows))
                if k:
                    f.readline()  # the rest of a line cut by the seek
                for _ in range(per):
                    raw = f.readline()
                    if not raw:
                        break
                    take(raw)
    if n == 0:
        return TraceSize(0, 0, True, 0.0)
    scale = 1.0 if whole else size / max(used, 1)
    return TraceSize(int(round(n * scale)), int(round(nb * scale)), whole, used / n)


def detect_format(path: str | PathLike) -> str:
    """``"bailian"`` when the first non-blank line is a JSON object with a ``chat_id`` field, else
    ``"mooncake"`` (the loader then checks every field)."""
    with open(Path(path), "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise _fail(path, lineno, None, f"invalid JSON ({e})") from None
            return "bailian" if isinstance(obj, dict) and "chat_id" in obj else "mooncake"
    raise TraceError(f"{path}:1: empty trace: no requests found")


def load_trace(path: str | PathLike, *, format: str = "auto", block_tokens: int | None = None,
               max_requests: int | None = None, name: str | None = None, sort: bool = False) -> Workload:
    """Load a Mooncake or Bailian JSONL trace. ``format``: ``auto`` (:func:`detect_format`),
    ``mooncake`` or ``bailian``; ``block_tokens``: None infers a Mooncake trace's (:func:`load_mooncake`) and
    takes a Bailian trace's 16 (:data:`TRACE_FORMATS`)."""
    if format == "auto":
        format = detect_format(path)
    if format not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {format!r}; choose auto or one of {sorted(TRACE_FORMATS)}")
    bt = TRACE_FORMATS[format] if block_tokens is None and format == "bailian" else block_tokens
    if format == "bailian":
        if sort:
            raise ValueError("sort=True is for Mooncake traces; a Bailian trace's parents must come before "
                             "their children, in timestamp order")
        return load_bailian(path, block_tokens=bt, max_requests=max_requests, name=name)
    return load_mooncake(path, block_tokens=bt, max_requests=max_requests, name=name, sort=sort)

"""Mooncake JSONL loader/writer and the libCacheSim oracleGeneral writer."""

from __future__ import annotations

import json
import struct
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from cacheresearch.workload import Workload
from cacheresearch.workload.trace import (
    ORACLE_GENERAL_DTYPE,
    TraceError,
    load_mooncake,
    read_oracle_general,
    save_mooncake,
    write_oracle_general,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mini_mooncake.jsonl"
SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
needs_shared = pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared Mooncake trace not present")


def _assert_chained(w: Workload) -> None:
    """Every key has one fixed predecessor (it names the block and its whole prefix)."""
    pred = {}
    for i in range(w.n_requests):
        ks = w.request_keys(i).tolist()
        for j, k in enumerate(ks):
            p = ks[j - 1] if j else None
            assert pred.setdefault(k, p) == p, f"key {k} has two predecessors"


def _assert_same(a: Workload, b: Workload) -> None:
    for f in ("arrival_ms", "input_tokens", "output_tokens", "tenant", "keys", "offsets"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert a.block_tokens == b.block_tokens


# ---------------------------------------------------------------------------------- loading
def test_fixture_loads():
    w = load_mooncake(FIXTURE, block_tokens=512)
    assert w.n_requests == 200
    assert w.name == "mini_mooncake" and w.meta["file"] == "mini_mooncake.jsonl"
    assert w.keys.dtype == np.uint64 and w.arrival_ms.dtype == np.int64
    assert np.all(np.diff(w.arrival_ms) >= 0) and w.arrival_ms[0] >= 0
    assert np.array_equal(w.n_blocks, -(-w.input_tokens // 512))
    assert np.all(w.input_tokens > 0)
    w.check_distinct_keys()
    _assert_chained(w)
    # the fixture shares prefixes: many requests start with the same root block
    first = w.keys[w.offsets[:-1]]
    assert np.unique(first).size < w.n_requests // 2
    assert np.unique(w.keys).size < w.total_blocks // 2


def test_fixture_matches_generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_mini", FIXTURE.parent / "make_mini_mooncake.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.generate()
    assert FIXTURE.read_text() == "".join(json.dumps(r) + "\n" for r in rows)


def test_max_requests_and_name():
    w = load_mooncake(FIXTURE, block_tokens=512, max_requests=10, name="mini")
    full = load_mooncake(FIXTURE, block_tokens=512)
    assert w.n_requests == 10 and w.name == "mini"
    _assert_same(w, full.slice(0, 10))
    assert load_mooncake(FIXTURE, block_tokens=512, max_requests=10_000).n_requests == 200
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError):
            load_mooncake(FIXTURE, block_tokens=512, max_requests=bad)
    with pytest.raises(ValueError):
        load_mooncake(FIXTURE, block_tokens=0)


@needs_shared
def test_shared_trace_loads_fast():
    t0 = time.perf_counter()
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    elapsed = time.perf_counter() - t0
    assert w.n_requests == 3993
    assert w.total_blocks == 121_877
    assert np.array_equal(w.n_blocks, -(-w.input_tokens // 512))
    w.check_distinct_keys()
    assert elapsed < 1.0, f"loading took {elapsed:.2f} s"


def test_blank_lines_skipped_and_optional_fields(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [9], "extra": "x"}\n'
        "\n"
        '{"timestamp": 5, "input_length": 0, "output_length": 0, "hash_ids": [], "tenant": 3}\n'
    )
    w = load_mooncake(p, block_tokens=4)
    assert w.arrival_ms.tolist() == [5, 5]
    assert w.input_tokens.tolist() == [3, 0]
    assert w.tenant.tolist() == [0, 3]
    assert w.keys.tolist() == [9] and w.offsets.tolist() == [0, 1, 1]


def test_large_uint64_ids(tmp_path):
    p = tmp_path / "t.jsonl"
    big = 2**64 - 1
    p.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 0, "hash_ids": [big, 2**63]}) + "\n")
    w = load_mooncake(p, block_tokens=4)
    assert w.keys.tolist() == [big, 2**63]


# ------------------------------------------------------------------------------- bad input
GOOD = {"timestamp": 10, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}


def _with(**changes):
    d = dict(GOOD)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return json.dumps(d)


_DROP = object()

BAD_LINES = {
    "missing timestamp": (_with(timestamp=_DROP), "timestamp"),
    "missing input_length": (_with(input_length=_DROP), "input_length"),
    "missing output_length": (_with(output_length=_DROP), "output_length"),
    "missing hash_ids": (_with(hash_ids=_DROP), "hash_ids"),
    "float timestamp": (_with(timestamp=10.5), "timestamp"),  # 10.0 is read as 10 ms; a fraction is refused
    "negative float timestamp": (_with(timestamp=-1.0), "timestamp"),
    "infinite timestamp": (_with(timestamp=float("inf")), "timestamp"),
    "string timestamp": (_with(timestamp="10"), "timestamp"),
    "bool timestamp": (_with(timestamp=True), "timestamp"),
    "null timestamp": (_with(timestamp=None), "timestamp"),
    "negative timestamp": (_with(timestamp=-1), "timestamp"),
    "huge timestamp": (_with(timestamp=2**63), "timestamp"),  # 2**40 is an epoch in ms: rebased, not refused
    "decreasing timestamp": (_with(timestamp=9), "timestamp"),
    "negative input_length": (_with(input_length=-5, hash_ids=[]), "input_length"),
    "float input_length": (_with(input_length=1000.0), "input_length"),
    "bool output_length": (_with(output_length=False), "output_length"),
    "negative output_length": (_with(output_length=-1), "output_length"),
    "hash_ids not a list": (_with(hash_ids="1,2"), "hash_ids"),
    "hash_ids float element": (_with(hash_ids=[1, 2.0]), "hash_ids"),
    "hash_ids bool element": (_with(hash_ids=[True, 2]), "hash_ids"),
    "hash_ids negative element": (_with(hash_ids=[1, -2]), "hash_ids"),
    "hash_ids too large": (_with(hash_ids=[1, 2**64]), "hash_ids"),
    "too few hash_ids": (_with(hash_ids=[1]), "hash_ids"),
    "too many hash_ids": (_with(hash_ids=[1, 2, 3]), "hash_ids"),
    "repeated hash id": (_with(hash_ids=[4, 4]), "hash_ids"),
    "negative tenant": (_with(tenant=-1), "tenant"),
    "invalid JSON": ('{"timestamp": 10, "input_length": ', "invalid JSON"),
    "not an object": ("[1, 2, 3]", "JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_names_file_line_and_field(tmp_path, case):
    line, field = BAD_LINES[case]
    p = tmp_path / "bad_trace.jsonl"
    # line 1 good, line 2 blank (still counted), line 3 good, line 4 bad
    p.write_text(_with(timestamp=0) + "\n\n" + json.dumps(GOOD) + "\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(TraceError) as ei:
        load_mooncake(p, block_tokens=512)
    msg = str(ei.value)
    assert "bad_trace.jsonl:4:" in msg, msg
    assert field in msg, msg
    assert isinstance(ei.value, ValueError)


def test_bad_line_beyond_max_requests_is_not_read(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(GOOD) + "\nnot json\n")
    assert load_mooncake(p, block_tokens=512, max_requests=1).n_requests == 1
    with pytest.raises(TraceError, match=r"t\.jsonl:2: invalid JSON"):
        load_mooncake(p, block_tokens=512)


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file(tmp_path, text):
    p = tmp_path / "empty.jsonl"
    p.write_text(text)
    with pytest.raises(TraceError, match=r"empty\.jsonl.*empty"):
        load_mooncake(p, block_tokens=512)


def test_first_line_error_number(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(_with(hash_ids=[7]) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:1: field 'hash_ids'.*ceil\(1000/512\) = 2"):
        load_mooncake(p, block_tokens=512)


# -------------------------------------------------------------------------------- round trip
def test_round_trip_fixture_is_byte_identical(tmp_path):
    w = load_mooncake(FIXTURE, block_tokens=512)
    out = save_mooncake(w, tmp_path / "rt.jsonl")
    assert out.read_bytes() == FIXTURE.read_bytes()
    _assert_same(load_mooncake(out, block_tokens=512), w)


@needs_shared
def test_round_trip_shared_trace(tmp_path):
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    out = save_mooncake(w, tmp_path / "rt.jsonl")
    _assert_same(load_mooncake(out, block_tokens=512), w)


def test_round_trip_tenant_and_big_keys(tmp_path):
    w = Workload.from_lists(
        [[2**64 - 1, 5], [], [2**64 - 1, 6, 7]],
        block_tokens=16,
        arrival_ms=[0, 0, 30],
        input_tokens=[17, 0, 48],
        output_tokens=[1, 2, 3],
        tenant=[0, 4, 1],
    )
    out = save_mooncake(w, tmp_path / "rt.jsonl")
    assert '"tenant": 4' in out.read_text()
    _assert_same(load_mooncake(out, block_tokens=16), w)


def test_save_rejects_inconsistent_block_counts(tmp_path):
    w = Workload.from_lists([[1, 2]], block_tokens=16, input_tokens=[40])
    with pytest.raises(ValueError, match="request 0"):
        save_mooncake(w, tmp_path / "x.jsonl")


# ----------------------------------------------------------------------------- oracleGeneral
def test_oracle_general_records(tmp_path):
    ids = np.array([5, 7, 5, 0, 7, 5, 2**64 - 1], dtype=np.uint64)
    p = tmp_path / "s.oracleGeneral"
    assert write_oracle_general(ids, p) == 7
    raw = p.read_bytes()
    assert len(raw) == 24 * 7 and ORACLE_GENERAL_DTYPE.itemsize == 24
    rec = np.fromfile(p, dtype=ORACLE_GENERAL_DTYPE)
    assert rec["time"].tolist() == list(range(7))
    assert rec["id"].tolist() == ids.tolist()
    assert rec["size"].tolist() == [1] * 7
    assert rec["next_access_vtime"].tolist() == [2, 4, 5, -1, -1, -1, -1]
    # byte layout independent of numpy: <I Q I q, packed
    assert struct.unpack_from("<IQIq", raw, 24 * 2) == (2, 5, 1, 5)
    assert struct.unpack_from("<IQIq", raw, 24 * 6) == (6, 2**64 - 1, 1, -1)
    assert np.array_equal(read_oracle_general(p), rec)


def test_oracle_general_times_and_empty(tmp_path):
    p = tmp_path / "t.oracleGeneral"
    write_oracle_general([3, 3], p, times=[100, 250])
    assert read_oracle_general(p)["time"].tolist() == [100, 250]
    with pytest.raises(ValueError):
        write_oracle_general([3, 3], p, times=[1])
    write_oracle_general(np.array([], dtype=np.uint64), p)
    assert p.stat().st_size == 0


def test_oracle_general_next_access_random(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=2000).astype(np.uint64)
    p = tmp_path / "r.oracleGeneral"
    write_oracle_general(ids, p)
    nxt = read_oracle_general(p)["next_access_vtime"]
    last = {}
    expect = [-1] * len(ids)
    for i, k in enumerate(ids.tolist()):
        if k in last:
            expect[last[k]] = i
        last[k] = i
    assert nxt.tolist() == expect


def _python_lru_miss_ratio(ids, capacity: int) -> float:
    od: OrderedDict = OrderedDict()
    miss = 0
    for k in ids:
        if k in od:
            od.move_to_end(k)
        else:
            miss += 1
            od[k] = None
            if len(od) > capacity:
                od.popitem(last=False)
    return miss / len(ids)


def _lcs_lru_miss_ratio(path: Path, capacity: int) -> float:
    lcs = pytest.importorskip("libcachesim")
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = lcs.LRU(cache_size=capacity, hashpower=16)
    miss_ratio, _ = cache.process_trace(reader)
    return float(miss_ratio)


@pytest.mark.parametrize("capacity", [1, 10, 100, 500, 5000])
def test_oracle_general_libcachesim_lru_fixture(tmp_path, capacity):
    w = load_mooncake(FIXTURE, block_tokens=512)
    p = tmp_path / "fixture.oracleGeneral"
    write_oracle_general(w.keys, p)
    expect = _python_lru_miss_ratio(w.keys.tolist(), capacity)
    assert _lcs_lru_miss_ratio(p, capacity) == pytest.approx(expect, abs=1e-12)


@needs_shared
@pytest.mark.parametrize("capacity", [1000, 20000])
def test_oracle_general_libcachesim_lru_shared(tmp_path, capacity):
    w = load_mooncake(SHARED_TRACE, block_tokens=512)
    p = tmp_path / "shared.oracleGeneral"
    write_oracle_general(w.keys, p)
    expect = _python_lru_miss_ratio(w.keys.tolist(), capacity)
    assert _lcs_lru_miss_ratio(p, capacity) == pytest.approx(expect, abs=1e-12)


def test_mooncake_epoch_timestamps_rebased_and_span_errors(tmp_path):
    """A clock that starts beyond the engine's span (epoch milliseconds) is rebased to the first
    request and the offset kept; a trace longer than the span is refused with the way out named."""
    import json

    from cacheresearch.workload.table import MAX_ARRIVAL_MS
    from cacheresearch.workload.trace import TraceError, load_mooncake

    t0 = 1_733_000_000_000
    p = tmp_path / "epoch.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t0 + d, "input_length": 20, "output_length": 1,
                                     "hash_ids": [1, 2]}) + "\n" for d in (0, 5, 5, 900)))
    w = load_mooncake(p, block_tokens=16)
    assert w.arrival_ms.tolist() == [0, 5, 5, 900]
    assert w.meta["timestamp_offset_ms"] == t0
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 20, "output_length": 1,
                                     "hash_ids": [1, 2]}) + "\n" for t in (0, 10, MAX_ARRIVAL_MS + 1)))
    w = load_mooncake(p, block_tokens=16)  # a workload holds any span; the engine's int32 clock refuses it
    assert w.arrival_ms.tolist() == [0, 10, MAX_ARRIVAL_MS + 1]
    from cacheresearch.core.stream import compile_stream
    from cacheresearch.workload import WorkloadError

    with pytest.raises(WorkloadError, match=r"request 2 .*12.4 days.*max_requests=2"):
        compile_stream(w)
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 20, "output_length": 1,
                                     "hash_ids": [1, 2]}) + "\n" for t in (t0, t0 - 1)))
    with pytest.raises(TraceError, match="non-decreasing"):
        load_mooncake(p, block_tokens=16)
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 20, "output_length": 1,  # kept as given
                                     "hash_ids": [1, 2]}) + "\n" for t in (7, 9, MAX_ARRIVAL_MS)))
    w = load_mooncake(p, block_tokens=16)
    assert w.arrival_ms.tolist() == [7, 9, MAX_ARRIVAL_MS] and "timestamp_offset_ms" not in w.meta
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 20, "output_length": 1,  # a late start
                                     "hash_ids": [1, 2]}) + "\n" for t in (10 * 86_400_000, MAX_ARRIVAL_MS + 5)))
    w = load_mooncake(p, block_tokens=16)
    assert w.arrival_ms.tolist() == [0, MAX_ARRIVAL_MS + 5 - 10 * 86_400_000]


def test_integral_float_timestamps_and_sort_orders_a_log(tmp_path):
    """An integral float is a millisecond count, a fraction is refused (seconds?); a log out of arrival
    order is an error that names trace.sort, and with sort=True the requests are ordered stably with
    their own blocks."""
    p = tmp_path / "log.jsonl"
    rows = [(10.0, [1, 2]), (3.0, [1, 5]), (4, [7]), (10, [1, 2, 9])]
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 16 * len(h) - 1, "output_length": 2,
                                     "hash_ids": h}) + "\n" for t, h in rows))
    with pytest.raises(TraceError, match=r":2: field 'timestamp': timestamps must be non-decreasing.*trace.sort"):
        load_mooncake(p, block_tokens=16)
    w = load_mooncake(p, block_tokens=16, sort=True)
    assert w.arrival_ms.tolist() == [3, 4, 10, 10]
    assert [w.keys[w.offsets[i]: w.offsets[i + 1]].tolist() for i in range(4)] == [[1, 5], [7], [1, 2], [1, 2, 9]]
    assert w.input_tokens.tolist() == [31, 15, 31, 47]
    assert w.meta["requests_reordered"] == 3
    assert "requests_reordered" not in load_mooncake(p, block_tokens=16, max_requests=1).meta
    p.write_text(json.dumps({"timestamp": 61.25, "input_length": 1, "output_length": 1, "hash_ids": [1]}) + "\n")
    with pytest.raises(TraceError, match="seconds"):
        load_mooncake(p, block_tokens=16)


# ------------------------------------------------------------------------- the block size, inferred
AGENT = Path(__file__).resolve().parent / "fixtures" / "mini_agent.jsonl"  # 64-token blocks


def test_block_size_inferred_from_every_line():
    from cacheresearch.workload.trace import load_trace  # noqa: PLC0415

    a = load_mooncake(AGENT)
    assert a.block_tokens == 64 and a.meta["block_tokens_inferred"] == "64"
    _assert_same(a, load_mooncake(AGENT, block_tokens=64))
    m = load_trace(FIXTURE)  # Mooncake's 512 fits: taken, as when given
    assert m.block_tokens == 512 and "512" in m.meta["block_tokens_inferred"].split(",")
    _assert_same(m, load_mooncake(FIXTURE, block_tokens=512))
    assert "block_tokens_inferred" not in load_mooncake(FIXTURE, block_tokens=512).meta


def test_ambiguous_block_size_takes_512_else_the_largest(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(dict(timestamp=0, input_length=100, output_length=1, hash_ids=[1])) + "\n")
    w = load_mooncake(p)  # one id for 100 tokens: 128, 256, 512 and 1024 fit
    assert w.block_tokens == 512 and w.meta["block_tokens_inferred"] == "128,256,512,1024"
    p.write_text(json.dumps(dict(timestamp=0, input_length=600, output_length=1, hash_ids=[1, 2])) + "\n")
    assert load_mooncake(p).block_tokens == 512  # ceil(600/512) = 2; 1024 gives 1, 256 gives 3
    p.write_text(json.dumps(dict(timestamp=0, input_length=200, output_length=1, hash_ids=[1, 2])) + "\n")
    assert load_mooncake(p).block_tokens == 128  # ceil(200/b) = 2 for b in 100..199: of the sizes tried, 128


def test_a_line_that_fits_no_size_is_reported_as_itself(tmp_path):
    from cacheresearch.workload.trace import BlockSizeError  # noqa: PLC0415

    lines = AGENT.read_text().splitlines()
    o = json.loads(lines[30])
    o["hash_ids"] = o["hash_ids"][:-3]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines[:30] + [json.dumps(o)] + lines[31:]) + "\n")
    with pytest.raises(BlockSizeError, match=r"t\.jsonl:31: field 'hash_ids': has 44 ids for input_length 2999, "
                                             r"which fits none of the block sizes that fit lines 1-30 \(\[64\]\)"):
        load_mooncake(p)
    p.write_text("\n".join(lines[:40] + [lines[40][:50]] + lines[41:]) + "\n")  # cut in the middle
    with pytest.raises(TraceError, match=r"t\.jsonl:41: invalid JSON"):
        load_mooncake(p)
    with pytest.raises(BlockSizeError, match=r"mini_agent\.jsonl:1: .* block_tokens 512 .*fit this line: \[64\]"):
        load_mooncake(AGENT, block_tokens=512)
    p.write_text(json.dumps(dict(timestamp=0, input_length=100, output_length=1, hash_ids=[1, 2, 3, 4, 5, 6, 7, 8]))
                 + "\n")  # 8 ids for 100 tokens: 13..14 tokens a block, none of the sizes tried
    with pytest.raises(BlockSizeError, match=r"t\.jsonl:1: .*no block size of .* fits this line"):
        load_mooncake(p)

"""The Qwen-Bailian loader: fields, sessions via parent_chat_id, errors naming file/line/field,
format detection and the round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cacheresearch.workload.trace import (
    TraceError,
    detect_format,
    load_bailian,
    load_trace,
    read_bailian,
    save_bailian,
)

FIX = Path(__file__).resolve().parent / "fixtures"
BAILIAN = FIX / "mini_bailian.jsonl"
MOONCAKE = FIX / "mini_mooncake.jsonl"


def _rows():
    return [json.loads(x) for x in BAILIAN.read_text().splitlines() if x.strip()]


def test_fixture_loads_with_sessions():
    tr = read_bailian(BAILIAN)
    w = tr.workload
    rows = _rows()
    assert w.n_requests == len(rows) and w.block_tokens == 16
    assert np.array_equal(w.arrival_ms, [round(r["timestamp"] * 1000) for r in rows])
    assert np.array_equal(w.n_blocks, [-(-r["input_length"] // 16) for r in rows])
    assert w.meta["format"] == "bailian" and w.meta["orphans"] == 0
    # sessions follow parent_chat_id: a child is in its parent's session, a root starts one
    by_chat = {r["chat_id"]: i for i, r in enumerate(rows)}
    for i, r in enumerate(rows):
        if r["parent_chat_id"] < 0:
            assert tr.parent[i] == -1
        else:
            p = by_chat[r["parent_chat_id"]]
            assert tr.parent[i] == p and tr.session[i] == tr.session[p]
            # multi-turn growth: the child's ids extend the parent's
            assert w.request_keys(i)[: w.n_blocks[p]].tolist() == rows[p]["hash_ids"]
    assert tr.n_sessions == sum(r["parent_chat_id"] < 0 for r in rows) == w.meta["sessions"]
    assert [tr.type_names[t] for t in tr.type] == [r["type"] for r in rows]
    assert np.array_equal(w.tenant, tr.type)
    assert tr.type_names[0] == "text"  # known categories first
    w.check_distinct_keys()


def test_detection_and_load_trace():
    assert detect_format(BAILIAN) == "bailian" and detect_format(MOONCAKE) == "mooncake"
    a = load_trace(BAILIAN)
    assert a.meta["format"] == "bailian" and a.block_tokens == 16
    b = load_trace(MOONCAKE)
    assert b.meta["format"] == "mooncake" and b.block_tokens == 512
    assert np.array_equal(load_trace(BAILIAN, format="bailian").keys, a.keys)
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(BAILIAN, format="csv")
    # Bailian lines read as Mooncake fail on the millisecond timestamp field of the first float
    with pytest.raises(TraceError, match="timestamp"):
        load_trace(BAILIAN, format="mooncake", block_tokens=16)


def test_round_trip(tmp_path):
    tr = read_bailian(BAILIAN)
    out = save_bailian(tr, tmp_path / "rt.jsonl")
    tr2 = read_bailian(out)
    for f in ("arrival_ms", "input_tokens", "output_tokens", "tenant", "keys", "offsets"):
        assert np.array_equal(getattr(tr.workload, f), getattr(tr2.workload, f)), f
    for f in ("chat_id", "parent_chat_id", "parent", "session", "turn", "type"):
        assert np.array_equal(getattr(tr, f), getattr(tr2, f)), f


def test_max_requests_and_orphans(tmp_path):
    rows = _rows()
    w = load_bailian(BAILIAN, max_requests=10)
    assert w.n_requests == 10
    # drop the first root: its children's parent is outside the file, so they start sessions
    child = next(r for r in rows if r["parent_chat_id"] >= 0)
    keep = [r for r in rows if r["chat_id"] != child["parent_chat_id"]]
    p = tmp_path / "window.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in keep))
    tr = read_bailian(p)
    assert tr.workload.meta["orphans"] >= 1
    i = [r["chat_id"] for r in keep].index(child["chat_id"])
    assert tr.parent[i] == -1 and tr.parent_chat_id[i] == child["parent_chat_id"]


GOOD = {"chat_id": 5, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 40, "output_length": 3,
        "type": "text", "turn": 1, "hash_ids": [0, 1, 2]}


@pytest.mark.parametrize("patch, field, msg", [
    ({"chat_id": -2}, "chat_id", "non-negative"),
    ({"chat_id": "a"}, "chat_id", "integer"),
    ({"parent_chat_id": -3}, "parent_chat_id", "-1"),
    ({"parent_chat_id": 5}, "parent_chat_id", "own parent"),
    ({"timestamp": "now"}, "timestamp", "seconds"),
    ({"timestamp": -1.0}, "timestamp", "non-negative"),
    ({"input_length": 1.5}, "input_length", "integer"),
    ({"type": ""}, "type", "category"),
    ({"turn": None}, "turn", "integer"),
    ({"hash_ids": [0, 1]}, "hash_ids", "ceil"),
    ({"hash_ids": [0, 1, 1]}, "hash_ids", "repeats"),
    ({"hash_ids": "0,1,2"}, "hash_ids", "list"),
])
def test_errors_name_file_line_field(tmp_path, patch, field, msg):
    p = tmp_path / "bad.jsonl"
    first = dict(GOOD, chat_id=1, timestamp=0.5)
    p.write_text(json.dumps(first) + "\n\n" + json.dumps({**GOOD, **patch}) + "\n")
    with pytest.raises(TraceError) as e:
        read_bailian(p)
    s = str(e.value)
    assert s.startswith(f"{p}:3: field {field!r}") and msg in s, s


def test_structural_errors(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(dict(GOOD, timestamp=2.0)) + "\n")
    with pytest.raises(TraceError, match=r"bad.jsonl:2: field 'chat_id': 5 repeats \(first on line 1\)"):
        read_bailian(p)
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(dict(GOOD, chat_id=6, timestamp=1.0)) + "\n")
    with pytest.raises(TraceError, match=r":2: field 'timestamp': timestamps must be non-decreasing"):
        read_bailian(p)
    missing = {k: v for k, v in GOOD.items() if k != "turn"}
    p.write_text(json.dumps(missing) + "\n")
    with pytest.raises(TraceError, match=r":1: field 'turn': missing"):
        read_bailian(p)
    p.write_text("{not json\n")
    with pytest.raises(TraceError, match=r":1: invalid JSON"):
        read_bailian(p)
    p.write_text("\n\n")
    with pytest.raises(TraceError, match="empty trace"):
        read_bailian(p)

"""Edge cases of real trace files for ``experiment=fit`` / ``ttl_trace`` (the fit never fails on a
well-formed trace; a malformed one gives the file, the line and the field). Each trace is a tiny
Mooncake JSONL file written in ``tmp_path`` and read back by the loader the studies use, then fitted
(no ablation), sampled (2 seeds) and validated.

Crashes these cases found: a trace whose every request has ``input_length`` 0 (no keys at all:
an index into the empty key array in the prefix structure, the session hit rates and the capacity
grid); ``ttl_trace`` refusing requests without blocks; a malformed file reaching the command line of
``experiment=fit`` / ``ttl_trace`` as a traceback (the loader's TraceError was not turned into a
study error as in ``experiment=replay``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cacheresearch.fit import fit_workload, sample_workload
from cacheresearch.fit.describe import STATUSES, component_rows, describe_model
from cacheresearch.fit.structure import request_structure, session_hit_rates
from cacheresearch.fit.ttl_advice import advise_trace
from cacheresearch.fit.validate import capacity_grid, capacity_hit_rates, ttl_hit_rates
from cacheresearch.studies.base import StudyError
from cacheresearch.studies.traces import load_fit_trace

BT = 16


def _rec(ts, ids, n_in=None, n_out=8, **extra):
    n_in = len(ids) * BT - 3 if n_in is None and ids else (0 if n_in is None else n_in)
    return dict(timestamp=int(ts), input_length=int(n_in), output_length=int(n_out), hash_ids=[int(h) for h in ids],
                **extra)


def _sessions(n=60, t0=0, span_ms=3_600_000, seed=0):
    """Growing conversations under five shared system prompts."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, span_ms, n)) + t0
    ctx, nxt, out = {}, 1000, []
    for i in range(n):
        s = int(rng.integers(0, 20))
        ctx.setdefault(s, list(range(1 + 3 * (s % 5), 4 + 3 * (s % 5))))
        k = int(rng.integers(1, 4))
        ctx[s] = ctx[s] + list(range(nxt, nxt + k))
        nxt += k
        out.append(_rec(ts[i], ctx[s]))
    return out


def _write(path, recs, nl="\n", tail=""):
    path.write_bytes((nl.join(r if isinstance(r, str) else json.dumps(r) for r in recs) + nl + tail).encode())
    return path


def _fit_check(path, **tc):
    """Load as the studies do, fit, sample two seeds and validate on the trace's grid."""
    w, extra = load_fit_trace(dict(path=str(path), format="auto", block_tokens=BT, **tc))
    m = fit_workload(w, **extra)
    assert m["components"]
    caps = capacity_grid(w, 4)
    assert np.all(np.isfinite(capacity_hit_rates(w, caps))) and np.all(np.isfinite(ttl_hit_rates(w, [60, 3600])))
    for seed in (0, 1):
        x = sample_workload(m, seed)
        assert x.n_requests >= 1 and np.all(np.diff(x.arrival_ms) >= 0)
        assert np.array_equal(x.n_blocks, -(-x.input_tokens // BT))
        for h in (capacity_hit_rates(x, caps), ttl_hit_rates(x, [60, 3600])):
            assert np.all((h >= 0) & (h <= 1))
    return w, m


CASES = {
    "same_timestamp_bursts": lambda: [dict(r, timestamp=1000 * (i // 20)) for i, r in enumerate(_sessions())],
    "epoch_ms": lambda: _sessions(t0=1_700_000_000_000),
    "tiny_clock": lambda: [dict(r, timestamp=r["timestamp"] // 1_000_000) for r in _sessions()],  # 0..3 ms
    "one_request": lambda: _sessions(1),
    "two_requests": lambda: _sessions(2),
    "three_requests": lambda: _sessions(3),
    "all_identical": lambda: [_rec(5000, [1, 2, 3, 4], n_in=60) for _ in range(60)],
    "identical_prompt_constant_gap": lambda: [_rec(i * 1000, [1, 2, 3, 4], n_in=60) for i in range(60)],
    "some_without_blocks": lambda: [r if i % 4 else dict(r, hash_ids=[], input_length=0)
                                    for i, r in enumerate(_sessions())],
    "all_without_blocks": lambda: [_rec(i * 1000, [], n_in=0) for i in range(40)],
    "output_zero": lambda: [dict(r, output_length=0) for r in _sessions()],
    "ids_beyond_2_63": lambda: [dict(r, hash_ids=[h + 15 * 2**60 for h in r["hash_ids"]]) for r in _sessions()],
    "one_session_always_extends": lambda: [_rec(i * 500, range(1, 3 + i)) for i in range(150)],
    "two_sharing_only_a_root": lambda: [_rec(0, [1, 2, 3]), _rec(1000, [1, 5, 6])],
    "constant_interval": lambda: [dict(r, timestamp=i * 1000) for i, r in enumerate(_sessions())],
    "no_reuse_constant_interval": lambda: [_rec(i * 1000, [10 * i + 1, 10 * i + 2]) for i in range(80)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_edge_case_fits_samples_and_validates(tmp_path, case):
    recs = CASES[case]()
    _, m = _fit_check(_write(tmp_path / f"{case}.jsonl", recs))
    if len(recs) < 30:
        assert any("empirical" in n for n in m["notes"])  # the fallbacks are named
    # the model in words (experiment=fit's summary): every component has a status, no raw dumps
    assert all(r["status"] in STATUSES for t in component_rows(m).values() for r in t.values())
    text = "\n".join(describe_model(m))
    assert text.startswith("The fitted model") and not re.search(r"\[\s*-?\d|\{\s*['\"]", text), text


def test_crlf_blank_lines_extra_fields_and_ids_beyond_2_53_read_exactly(tmp_path):
    """Windows line endings, trailing blank lines, unknown fields and ids past float64's integers read as
    the plain file does (ids kept exactly; the fit of such a file is the fit of the plain one)."""
    recs = _sessions(40)
    b, _ = load_fit_trace(dict(path=str(_write(tmp_path / "lf.jsonl", recs)), block_tokens=BT))
    a, _ = load_fit_trace(dict(path=str(_write(tmp_path / "crlf.jsonl", recs, nl="\r\n", tail="\r\n  \r\n\n")),
                               block_tokens=BT))
    assert np.array_equal(a.keys, b.keys) and np.array_equal(a.arrival_ms, b.arrival_ms)
    extra = [dict(r, model="m", session_id="s", meta={"a": [1]}) for r in recs]
    x, _ = load_fit_trace(dict(path=str(_write(tmp_path / "x.jsonl", extra)), block_tokens=BT))
    assert np.array_equal(x.keys, b.keys) and np.array_equal(x.input_tokens, b.input_tokens)
    big = [dict(r, hash_ids=[h + 2**53 + 1 for h in r["hash_ids"]]) for r in recs]
    y, _ = load_fit_trace(dict(path=str(_write(tmp_path / "y.jsonl", big)), block_tokens=BT))
    assert y.keys.tolist() == [h for r in big for h in r["hash_ids"]]


def test_no_keys_at_all_structure_and_grid(tmp_path):
    """Every input_length 0 (no keys): the structure, session hit rates and capacity grid used to index
    the empty key array."""
    w, _ = load_fit_trace(dict(path=str(_write(tmp_path / "e.jsonl", CASES["all_without_blocks"]())), block_tokens=BT))
    st = request_structure(w)
    assert st.session.tolist() == [0] * w.n_requests
    assert session_hit_rates(w).tolist() == [0.0]
    assert capacity_grid(w, 4).tolist() == [1]


def test_ttl_advice_leaves_out_requests_without_blocks(tmp_path):
    recs = CASES["some_without_blocks"]()
    w, _ = load_fit_trace(dict(path=str(_write(tmp_path / "m.jsonl", recs)), block_tokens=BT))
    a = advise_trace(w, reuse="poisson")
    assert a.empty_requests == sum(1 for r in recs if not r["hash_ids"])
    assert a.duration_s == pytest.approx((w.arrival_ms[-1] - w.arrival_ms[0]) / 1000)  # the window counts them
    assert all(recs[int(i)]["hash_ids"] for i in a.first_request)  # indices into the file's requests
    with pytest.raises(ValueError, match="nothing to cache"):
        advise_trace(load_fit_trace(dict(path=str(_write(tmp_path / "e.jsonl", CASES["all_without_blocks"]())),
                                         block_tokens=BT))[0])


BAD = {  # (line 4 replaced, field named in the message)
    "negative_id": (lambda r: dict(r, hash_ids=[-1] + r["hash_ids"][1:]), "hash_ids"),
    "id_2_64": (lambda r: dict(r, hash_ids=[2**64] + r["hash_ids"][1:]), "hash_ids"),
    "float_id": (lambda r: dict(r, hash_ids=[1.5] + r["hash_ids"][1:]), "hash_ids"),
    "repeated_id": (lambda r: dict(r, hash_ids=[7, 7] + r["hash_ids"][2:]), "hash_ids"),
    "ids_short_of_input_length": (lambda r: dict(r, input_length=r["input_length"] + 5 * BT), "hash_ids"),
    "ids_null": (lambda r: dict(r, hash_ids=None), "hash_ids"),
    "output_missing": (lambda r: {k: v for k, v in r.items() if k != "output_length"}, "output_length"),
    "output_bool": (lambda r: dict(r, output_length=True), "output_length"),
    "input_string": (lambda r: dict(r, input_length="12"), "input_length"),
    "timestamp_float": (lambda r: dict(r, timestamp=r["timestamp"] + 0.5), "timestamp"),
    "timestamp_back": (lambda r: dict(r, timestamp=0), "timestamp"),
    "timestamp_nan": (lambda r: '{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
                      "timestamp"),
    "truncated_json": (lambda r: json.dumps(r)[:25], None),
    "not_an_object": (lambda r: "[1, 2, 3]", None),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_line_names_file_line_and_field(tmp_path, case):
    recs = [dict(r, timestamp=1000 + 10 * i) for i, r in enumerate(_sessions(8))]
    change, field = BAD[case]
    recs[3] = change(recs[3])
    p = _write(tmp_path / f"{case}.jsonl", recs)
    with pytest.raises(StudyError) as e:
        load_fit_trace(dict(path=str(p), block_tokens=BT))
    msg = str(e.value)
    assert f"{p}:4:" in msg, msg
    if field is not None:
        assert f"field {field!r}" in msg, msg
    assert "Traceback" not in msg


def test_empty_file_is_a_clear_error(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n \n")):
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(StudyError, match="empty trace"):
            load_fit_trace(dict(path=str(p), block_tokens=BT))


def test_trace_size_estimate_and_memory_refusal(tmp_path):
    """A trace study estimates its memory from the file's first lines before reading it, and refuses a
    run that would not fit with the trace.max_requests that would."""
    from cacheresearch.studies.traces import check_trace_memory
    from cacheresearch.workload.trace import estimate_trace_size

    recs = _sessions(300)
    p = _write(tmp_path / "t.jsonl", recs)
    n_ids = sum(len(r["hash_ids"]) for r in recs)
    exact = estimate_trace_size(p)
    assert exact.exact and (exact.requests, exact.blocks) == (300, n_ids)
    est = estimate_trace_size(p, sample_lines=50)  # scaled by the byte count: a close estimate, not exact
    assert not est.exact and abs(est.requests - 300) < 60 and abs(est.blocks - n_ids) < 0.3 * n_ids
    got = check_trace_memory(p, available=1 << 40)
    assert got["blocks"] == n_ids and got["need_bytes"] > 0
    assert check_trace_memory(p, max_requests=30, available=1 << 40)["requests"] == 30
    with pytest.raises(StudyError, match=r"trace.max_requests=\d+"):
        check_trace_memory(p, per_block=1e6, per_request=0, fixed=0, available=int(n_ids * 1e6 / 2))
    with pytest.raises(StudyError, match="larger machine"):
        check_trace_memory(p, available=1 << 20)
    w, _ = load_fit_trace(dict(path=str(p), block_tokens=BT))  # the check passes on this machine
    assert w.n_requests == 300


def test_a_trace_longer_than_the_engine_clock_fits(tmp_path):
    """Sessions over 20 days (past the engine's 12.4-day int32 clock): the fit, its samples and the curves
    take the span; the samples are not clipped to the engine's clock."""
    from cacheresearch.workload import MAX_ARRIVAL_MS

    recs = _sessions(80, span_ms=20 * 86_400_000, seed=2)
    w, m = _fit_check(_write(tmp_path / "long.jsonl", recs))
    assert w.arrival_ms[-1] > MAX_ARRIVAL_MS
    x = sample_workload(m, 0)
    assert x.arrival_ms[-1] > MAX_ARRIVAL_MS and np.sum(x.arrival_ms == MAX_ARRIVAL_MS) <= 1  # not piled at it


def test_unsorted_log_needs_trace_sort(tmp_path):
    recs = _sessions(40)
    recs[5], recs[20] = recs[20], recs[5]  # a log written out of arrival order
    p = _write(tmp_path / "log.jsonl", recs)
    with pytest.raises(StudyError, match="trace.sort=true"):
        load_fit_trace(dict(path=str(p), block_tokens=BT))
    w, _ = load_fit_trace(dict(path=str(p), block_tokens=BT, sort=True))
    assert np.all(np.diff(w.arrival_ms) >= 0) and w.meta["requests_reordered"] >= 2
    _fit_check(p, sort=True)


def test_ttl_advice_on_a_trace_longer_than_the_engine_clock(tmp_path):
    """ttl_trace replays a trace past the engine's int32 clock on int64 milliseconds, equal to a
    plain-Python TTL cache request by request, and advises every shared root."""
    from cacheresearch.fit.ttl_advice import replay_hit_tokens
    from cacheresearch.workload import MAX_ARRIVAL_MS

    w, _ = load_fit_trace(dict(path=str(_write(tmp_path / "long.jsonl", _sessions(80, span_ms=20 * 86_400_000,
                                                                                    seed=2))), block_tokens=BT))
    assert w.arrival_ms[-1] > MAX_ARRIVAL_MS
    ht = replay_hit_tokens(w, [300, 3600])
    for j, ttl_ms in enumerate((300_000, 3_600_000)):  # plain Python: one TTL cache refreshed on every use
        last, want = {}, []
        for i in range(w.n_requests):
            t, ks = int(w.arrival_ms[i]), w.keys[w.offsets[i]: w.offsets[i + 1]].tolist()
            hb = 0
            while hb < len(ks) and ks[hb] in last and t - last[ks[hb]] <= ttl_ms:
                hb += 1
            for k in ks:
                last[k] = t
            want.append(min(hb * BT, int(w.input_tokens[i])))
        assert ht[j].tolist() == want, ttl_ms
    assert np.sum(ht) > 0  # the trace reuses within the TTLs: the check is not all zeros
    a = advise_trace(w)
    assert np.all(np.isfinite(a.simulated)) and a.choice.size == a.simulated.shape[0]

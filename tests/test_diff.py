"""python -m cacheresearch.diff: first differing block, prefix hit, invalidated tokens; the change-point report."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cacheresearch.analysis.changepoint import change_points, format_report, potential_hits
from cacheresearch.diff import diff_keys, diff_tokens, main, tokenize
from cacheresearch.workload.keys import rekey_after
from cacheresearch.workload.synthetic import fleet_workload

FIX = Path(__file__).parent / "fixtures"


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_example_prompts(capsys):
    a, b = str(FIX / "diff_prompt_a.json"), str(FIX / "diff_prompt_b.json")
    r = _json(capsys, [a, b, "--json"])
    # 72 tokens, token 41 differs: block 2 of 16; blocks 0-1 shared; block 3 (tokens 48-63) equal but re-keyed
    assert r["first_diff_block"] == 2 and r["shared_prefix_tokens"] == 32 and r["invalidated_tokens"] == 16
    assert r["block_tokens"] == 16
    r = _json(capsys, [a, b, "--json", "--block-tokens", "8"])
    assert (r["first_diff_block"], r["shared_prefix_tokens"], r["invalidated_tokens"]) == (5, 40, 24)
    assert main([a, b]) == 0
    text = capsys.readouterr().out
    assert "block 2" in text and "32 tokens" in text


def test_prefix_salt_and_vllm_cap():
    a = list(range(40))
    r = diff_tokens(a, a[:33], block_tokens=16)
    assert r["first_diff_block"] is None and r["shared_prefix_tokens"] == 32 and r["invalidated_tokens"] == 0
    assert r["vllm_hit_tokens"] == 32
    r = diff_tokens(a, a[:32], block_tokens=16)  # B = 2 full blocks: vLLM recomputes its last token
    assert r["shared_prefix_tokens"] == 32 and r["vllm_hit_tokens"] == 16
    r = diff_tokens(a, a, block_tokens=16, salt_a=0, salt_b=7)  # a salt changes every key from block 0
    assert r["first_diff_block"] == 0 and r["shared_prefix_tokens"] == 0
    r = diff_tokens([9] + a[1:], a, block_tokens=8)  # a volatile token at the top invalidates the rest
    assert r["first_diff_block"] == 0 and r["invalidated_tokens"] == 32
    rnd = np.random.default_rng(0).integers(0, 1000, 64).tolist()
    assert diff_tokens(a + rnd, a + rnd[::-1], block_tokens=8)["invalidated_tokens"] == 0


def test_text_and_errors(tmp_path, capsys):
    assert tokenize("Hello world") == tokenize("Hello world") and len(tokenize("Hello, world!")) == 4
    pa, pb = tmp_path / "a.txt", tmp_path / "b.txt"
    pa.write_text("System: be brief. " * 10 + "User: hi")
    pb.write_text("System: be brief. " * 10 + "User: bye")
    r = _json(capsys, [str(pa), str(pb), "--text", "--json", "--block-tokens", "4"])
    n = len(tokenize(pa.read_text()))
    d = next(i for i, (x, y) in enumerate(zip(tokenize(pa.read_text()), tokenize(pb.read_text()))) if x != y)
    assert r["first_diff_block"] == d // 4 and r["shared_prefix_tokens"] == (d // 4) * 4 and r["tokens_a"] == n
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, \"x\"]")
    assert main([str(bad), str(pa)]) == 2
    assert "element 2" in capsys.readouterr().err
    assert main([str(pa), str(pb)]) == 2  # text without --text
    assert "--text" in capsys.readouterr().err


def test_trace_requests(capsys):
    trace = FIX / "mini_mooncake.jsonl"
    r = _json(capsys, ["--trace", str(trace), "0", "1", "--json"])
    from cacheresearch.workload.trace import load_trace

    w = load_trace(trace)
    ref = diff_keys(w.request_keys(0), w.request_keys(1), block_tokens=w.block_tokens)
    assert r["shared_prefix_tokens"] == ref["shared_prefix_tokens"] and r["invalidated_tokens"] is None
    assert r["block_tokens"] == 512
    assert main(["--trace", str(trace), "0", "999999"]) == 2


def test_cli_subprocess():
    out = subprocess.run([sys.executable, "-m", "cacheresearch.diff", str(FIX / "diff_prompt_a.json"),
                          str(FIX / "diff_prompt_b.json"), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["first_diff_block"] == 2


# ------------------------------------------------------------------------------ change points
@pytest.fixture(scope="module")
def fleet():
    return fleet_workload(n_tenants=30, system_tokens=160, doc_tokens=96, user_tokens=16, n_requests=1200,
                          rate_per_s=2.0, seed=3)


def _reference_hits(w):
    seen, out = set(), []
    for i in range(w.n_requests):
        ks = w.request_keys(i).tolist()
        h = 0
        while h < len(ks) and ks[h] in seen:
            h += 1
        out.append(min(h * w.block_tokens, int(w.input_tokens[i])))
        seen.update(ks)
    return np.asarray(out)


def test_potential_hits_equal_reference(fleet):
    w = rekey_after(fleet, int(fleet.arrival_ms[600]))
    assert np.array_equal(potential_hits(w), _reference_hits(w))


def _rekey_from_block(w, at_ms, block, unique=False):
    keys = w.keys.copy()
    for i in np.nonzero(w.arrival_ms >= at_ms)[0]:
        a, b = w.offsets[i] + block, w.offsets[i + 1]
        mix = np.uint64(0xABCDEF12345 + (i if unique else 0))
        keys[a:b] ^= mix
    from cacheresearch.workload import Workload

    return Workload(w.arrival_ms, w.input_tokens, w.output_tokens, w.tenant, keys, w.offsets, w.block_tokens)


@pytest.mark.parametrize("kind", ["deploy", "timestamp", "reorder"])
def test_change_point_causes(fleet, kind):
    T = int(fleet.arrival_ms[600])
    if kind == "deploy":
        w = rekey_after(fleet, T)
    elif kind == "timestamp":
        w = _rekey_from_block(fleet, T, 0, unique=True)
    else:  # the tools after the 10-block system prompt reordered: keys change from block 10 on
        w = _rekey_from_block(fleet, T, 10)
    rep = change_points(w, window_s=10.0, drop=0.1)
    eps = rep["episodes"]
    assert len(eps) == 1 and abs(eps[0]["start_s"] - T / 1000) <= 10
    e = eps[0]
    if kind == "deploy":
        assert e["cause"].startswith("deploy") and e["new_first_share"] > 0.5 and e["recovery_windows"] is not None
    elif kind == "timestamp":
        assert e["cause"].startswith("volatile") and e["unique_first_share"] > 0.5 and e["recovery_windows"] is None
    else:
        assert e["new_first_share"] == 0.0 and e["divergence_block"] == 10 and "diverge at block 10" in e["cause"]
    assert "cause" in format_report(rep)
    assert not change_points(fleet, window_s=10.0, drop=0.1)["episodes"]  # nothing injected, nothing found

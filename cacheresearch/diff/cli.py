"""``python -m cacheresearch.diff``: why does request B not hit request A's cache?

Usage::

    python -m cacheresearch.diff A.json B.json --tokenizer tekken [--json]     # two chat requests (OpenAI or
                                                                                # Anthropic shape)
    python -m cacheresearch.diff A.json B.json --tokenizer cl100k_base --tokenizer-b tekken   # another tokenizer
    python -m cacheresearch.diff A.json B.json --template chatml --template-b chatml_v2       # another template
    python -m cacheresearch.diff A.txt B.txt --text --tokenizer cl100k_base    # two prompt texts
    python -m cacheresearch.diff A.json B.json [--block-tokens 16] [--json]    # token-id JSON lists
    python -m cacheresearch.diff --strings "prompt one" "prompt two"            # literal text
    python -m cacheresearch.diff --trace FILE I J [--block-tokens 512]          # requests I and J of a trace
    python -m cacheresearch.diff changepoints FILE [--window-s 60] [--inject-deploy-at-s T] [--json]

``--tokenizer`` takes ``word`` (bundled; the default), ``cl100k_base``, ``tekken`` (``tekken_240718``,
``tekken_240911``) or a path to a ``tokenizer.json`` (with ``--template jinja``: its
``tokenizer_config.json``'s chat template). ``--template``: ``chatml`` (default), ``chatml_v2``,
``sorted``, ``plain``, ``jinja``, ``mistral`` (mistral-common's request encoder; its own Tekken ids).
A JSON file holding a list of integers is read as token ids (the old interface); an object (or a list of
messages) as a chat request. Chat requests report (``--json``: one object) ``first_token``,
``first_block``, ``message``, ``part``, ``cause``, ``hit_tokens``, ``hit_tokens_lost`` and
``usd_lost_per_request`` under ``--pricing`` (:mod:`cacheresearch.diff.requests`); token ids and texts
report the token-level fields of :mod:`cacheresearch.diff.tokens`. Malformed JSON is an error naming its
line, column and character.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cacheresearch.diff.requests import diff_requests
from cacheresearch.diff.tokens import changepoints_main, diff_keys, diff_tokens, text_report, tokenize
from cacheresearch.workload.prompt.request import RequestError, parse_request
from cacheresearch.workload.prompt.tokenizers import TokenizerUnavailable, get_tokenizer

__all__ = ["main"]


def _load(path: str, text: bool):
    """('tokens', [ids]) | ('request', ChatRequest) | ('text', str)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such file")
    raw = p.read_text(encoding="utf-8")
    if text:
        return "text", raw
    try:
        v = json.loads(raw)
    except json.JSONDecodeError as e:
        lines = raw.splitlines()
        line = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else ""
        raise ValueError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno} (character {e.pos}): {e.msg}"
                         f"\n  {line[:200]}\n  {' ' * max(e.colno - 1, 0)}^\n(pass --text for a text file)") from None
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "tokens", v
    if isinstance(v, dict) or (isinstance(v, list) and v and all(isinstance(x, dict) for x in v)):
        return "request", parse_request(v, where=str(path))
    if isinstance(v, list):
        bad = next((i for i, x in enumerate(v) if not isinstance(x, int) or isinstance(x, bool)), None)
        where = f" (element {bad}: {v[bad]!r})" if bad is not None else ""
        raise ValueError(f"{path}: a token-id file is a JSON list of integers{where}; a chat request is an object")
    raise ValueError(f"{path}: neither a chat request (an object) nor token ids (a list of integers)")


def _text_request(r: dict) -> str:
    bs = r["block_tokens"]
    out = [f"block size {bs} tokens; A: {r['tokens_a']} tokens ({r['tokenizer_a']}, {r['template_a']}), "
           f"B: {r['tokens_b']} tokens ({r['tokenizer_b']}, {r['template_b']})"]
    if r["cause"] is None:
        out.append(r["detail"])
    else:
        where = f"token {r['first_token']}, block {r['first_block']}" if r["first_token"] is not None else \
            f"block {r['first_block']} (the same tokens, other keys)"
        out.append(f"first difference: {where}, in {r['part'] or 'every block'}")
        if r.get("text_a") is not None and r["first_token"] is not None:
            out.append(f"  A: {r['text_a']!r}\n  B: {r['text_b']!r}")
        out.append(f"cause: {r['cause']} ({r['detail']})")
    out.append(f"prefix hit: {r['hit_tokens']} tokens; with the difference fixed: {r['hit_tokens_if_fixed']} "
               f"(lost: {r['hit_tokens_lost']} tokens, ${r['usd_lost_per_request']:.6f} per request under "
               f"{r['pricing']})")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["changepoints"]:
        return changepoints_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.diff", description=__doc__.split("\n")[0])
    ap.add_argument("a", nargs="?", help="A: a chat request or token-id JSON file (or text with --text / --strings)")
    ap.add_argument("b", nargs="?", help="B")
    ap.add_argument("--text", action="store_true", help="A and B are UTF-8 text files")
    ap.add_argument("--strings", action="store_true", help="A and B are the prompts' text itself")
    ap.add_argument("--trace", nargs=3, metavar=("FILE", "I", "J"), help="requests I and J of a trace")
    ap.add_argument("--tokenizer", default="word", help="word | cl100k_base | tekken | PATH/tokenizer.json")
    ap.add_argument("--tokenizer-b", default=None, help="B's tokenizer (default: --tokenizer)")
    ap.add_argument("--template", default=None, help="chatml (default for requests) | chatml_v2 | sorted | plain | "
                                                     "jinja | mistral")
    ap.add_argument("--template-b", default=None, help="B's template (default: --template)")
    ap.add_argument("--pricing", default="anthropic_5m", help="pricing preset for the dollars lost")
    ap.add_argument("--block-tokens", type=int, default=None,
                    help="block size (default 16; for --trace the format's: Mooncake 512, Bailian 16)")
    ap.add_argument("--salt-a", type=int, default=0, help="cache_salt of A (0 = none; token ids and text)")
    ap.add_argument("--salt-b", type=int, default=0, help="cache_salt of B")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    kind = "tokens"
    try:
        if a.trace:
            from cacheresearch.workload.trace import load_trace  # noqa: PLC0415

            path, i, j = a.trace
            w = load_trace(path, block_tokens=a.block_tokens)
            for name, v in (("I", i), ("J", j)):
                if not v.isdigit() or int(v) >= w.n_requests:
                    raise ValueError(f"--trace {name}={v}: a request index in [0, {w.n_requests})")
            r = diff_keys(w.request_keys(int(i)), w.request_keys(int(j)), block_tokens=w.block_tokens)
            r.update(requests=[int(i), int(j)])
        else:
            if a.a is None or a.b is None:
                ap.error("give prompts A and B (or --trace FILE I J)")
            if a.strings:
                la, lb = ("text", a.a), ("text", a.b)
            else:
                la, lb = _load(a.a, a.text), _load(a.b, a.text)
            if {la[0], lb[0]} == {"request"} or (la[0] == "text" and (a.tokenizer != "word" or a.tokenizer_b
                                                                      or a.template)):
                kind = "request"
                ra = la[1] if la[0] == "request" else parse_request({"messages": [{"role": "user", "content": la[1]}]})
                rb = lb[1] if lb[0] == "request" else parse_request({"messages": [{"role": "user", "content": lb[1]}]})
                tpl = a.template or ("chatml" if la[0] == "request" else "plain")
                r = diff_requests(ra, rb, tokenizer=a.tokenizer, tokenizer_b=a.tokenizer_b, template=tpl,
                                  template_b=a.template_b, block_tokens=a.block_tokens or 16, pricing=a.pricing)
            elif la[0] != lb[0]:
                raise ValueError(f"A is {la[0]} and B is {lb[0]}: give two of the same kind")
            else:
                if la[0] == "text":
                    ta, tb = tokenize(la[1]), tokenize(lb[1])
                else:
                    ta, tb = la[1], lb[1]
                    get_tokenizer(a.tokenizer)  # validates the name
                r = diff_tokens(ta, tb, block_tokens=a.block_tokens or 16, salt_a=a.salt_a, salt_b=a.salt_b)
                r.update(first_token=r.get("first_diff_token"), first_block=r["first_diff_block"])
    except (ValueError, OSError, RequestError, TokenizerUnavailable) as e:
        print(f"cacheresearch.diff: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        if kind == "request":
            print(json.dumps(r))
        else:
            keep = ("first_diff_block", "shared_prefix_tokens", "invalidated_tokens", "block_tokens", "vllm_hit_tokens",
                    "first_diff_token", "tokens_a", "tokens_b", "blocks_a", "blocks_b", "requests", "first_token",
                    "first_block")
            print(json.dumps({k: r[k] for k in keep if k in r}))
    else:
        print(_text_request(r) if kind == "request" else text_report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

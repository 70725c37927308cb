"""Token-level diff of two prompts (token ids, text, or a trace's block keys) and the change-point report.

The command line (:mod:`cacheresearch.diff.cli`)::

    python -m cacheresearch.diff A.json B.json [--block-tokens 16] [--json]   # token-id JSON lists
    python -m cacheresearch.diff A.txt B.txt --text                             # text, bundled tokenizer
    python -m cacheresearch.diff --strings "prompt one" "prompt two"            # literal text
    python -m cacheresearch.diff --trace FILE I J [--block-tokens 512]          # requests I and J of a trace
    python -m cacheresearch.diff changepoints FILE [--window-s 60] [--inject-deploy-at-s T] [--json]

A and B are cut into blocks of ``--block-tokens`` tokens and keyed with the project's chained keys
(:mod:`cacheresearch.workload.keys`: vLLM's structure; ``--salt-a`` / ``--salt-b`` add a
``cache_salt``). Printed (``--json``: one object):

``first_diff_block``      0-based index of the block holding the first token where A and B differ
                          (``null`` when one prompt is a prefix of the other and the salts agree)
``shared_prefix_tokens``  the prefix hit: leading full blocks whose keys agree x block size (what B
                          hits with A cached, or A with B cached)
``invalidated_tokens``    tokens of full blocks after the first differing block whose content is the
                          same in A and B at the same position: reusable content that gets new keys
                          because every key chains on its parent (a timestamp at the top invalidates
                          everything after it; a changed tool definition everything after the tool)
``block_tokens``          the block size
``vllm_hit_tokens``       the hit under vLLM's cap (the last prompt token is recomputed): at most
                          ``floor((len(B) - 1) / block) * block``

Token-id files are JSON lists of integers. ``--text`` reads UTF-8 text and tokenizes it with the
bundled tokenizer (:func:`tokenize`: a GPT-2-style pre-tokenizer, one token per piece, ids from a
stable hash; an approximation of a BPE, bundled so that no download is needed). With ``--trace``,
the two requests' block keys (Mooncake ``hash_ids``, or Bailian) are compared directly: tokens are
unknown there, so ``invalidated_tokens`` is ``null``.

``changepoints`` prints :func:`cacheresearch.analysis.changepoint.change_points` of a trace (optionally
with a deploy injected at ``T`` seconds: every later request re-keyed as a new version).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cacheresearch.workload.keys import reference_block_keys
from cacheresearch.workload.prompt.tokenizers import WORD_VOCAB, word_tokenize

__all__ = ["tokenize", "diff_tokens", "diff_keys"]

VOCAB = WORD_VOCAB


def tokenize(text: str, vocab_size: int = VOCAB) -> list[int]:
    """Token ids of ``text``: GPT-2-style pieces (words with their leading space, numbers, punctuation
    runs, whitespace), each one token with id ``crc32(piece) % vocab_size``. Deterministic everywhere
    (the ``word`` tokenizer of :mod:`cacheresearch.workload.prompt.tokenizers`)."""
    return word_tokenize(text, vocab_size)


def _report(keys_a, keys_b, *, bs: int, first_diff_token, tokens_a=None, tokens_b=None, len_b=None) -> dict:
    na, nb = len(keys_a), len(keys_b)
    shared = 0
    while shared < min(na, nb) and keys_a[shared] == keys_b[shared]:
        shared += 1
    first = None
    if first_diff_token is not None:
        first = first_diff_token // bs
    elif shared < min(na, nb):  # same tokens, different keys: the salt (or extras) differ from block 0
        first = shared
    inval = None
    if tokens_a is not None:
        inval = 0
        if first is not None:
            for j in range(first + 1, min(na, nb)):
                if tokens_a[j * bs:(j + 1) * bs] == tokens_b[j * bs:(j + 1) * bs]:
                    inval += bs
    out = dict(first_diff_block=first, shared_prefix_tokens=shared * bs, invalidated_tokens=inval, block_tokens=bs,
               blocks_a=na, blocks_b=nb)
    if len_b is not None:
        out["vllm_hit_tokens"] = min(shared, max(len_b - 1, 0) // bs) * bs
    if tokens_a is not None and first is not None:
        out["block_a"] = list(tokens_a[first * bs:(first + 1) * bs])
        out["block_b"] = list(tokens_b[first * bs:(first + 1) * bs])
        out["first_diff_token"] = first_diff_token
    return out


def diff_tokens(a, b, *, block_tokens: int = 16, salt_a: int = 0, salt_b: int = 0) -> dict:
    """The report of two token-id prompts (module docstring)."""
    if block_tokens < 1:
        raise ValueError(f"--block-tokens must be >= 1, got {block_tokens}")
    a, b = [int(x) for x in a], [int(x) for x in b]
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    ka = reference_block_keys(a, block_size=block_tokens, cache_salt=salt_a)
    kb = reference_block_keys(b, block_size=block_tokens, cache_salt=salt_b)
    out = _report(ka, kb, bs=block_tokens, first_diff_token=d, tokens_a=a, tokens_b=b, len_b=len(b))
    out.update(tokens_a=len(a), tokens_b=len(b))
    return out


def diff_keys(keys_a, keys_b, *, block_tokens: int) -> dict:
    """The report of two requests given only their block keys (a trace's hash ids)."""
    ka, kb = [int(k) for k in keys_a], [int(k) for k in keys_b]
    return _report(ka, kb, bs=block_tokens, first_diff_token=None)


def _read_tokens(path: str, text: bool) -> list[int]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such file")
    raw = p.read_text(encoding="utf-8")
    if text:
        return tokenize(raw)
    try:
        v = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON (line {e.lineno}: {e.msg}); pass --text for a text file") from None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        bad = next((i for i, x in enumerate(v) if not isinstance(x, int) or isinstance(x, bool)), None) \
            if isinstance(v, list) else None
        where = f" (element {bad}: {v[bad]!r})" if bad is not None else ""
        raise ValueError(f"{path}: a token-id file is a JSON list of integers{where}")
    return v


def text_report(r: dict) -> str:
    bs = r["block_tokens"]
    lines = []
    if "tokens_a" in r:
        lines.append(f"block size {bs} tokens; A: {r['tokens_a']} tokens ({r['blocks_a']} full blocks), "
                     f"B: {r['tokens_b']} tokens ({r['blocks_b']} full blocks)")
    else:
        lines.append(f"block size {bs} tokens; A: {r['blocks_a']} blocks, B: {r['blocks_b']} blocks (keys only)")
    if r["first_diff_block"] is None:
        lines.append("no difference: one prompt is a prefix of the other")
    elif r.get("first_diff_token") is not None:
        lines.append(f"first difference: token {r['first_diff_token']}, in block {r['first_diff_block']}")
    else:
        lines.append(f"first differing block: {r['first_diff_block']}")
    sp = r["shared_prefix_tokens"]
    lines.append(f"prefix hit: {sp // bs} blocks = {sp} tokens" +
                 (f" (vLLM, last token recomputed: {r['vllm_hit_tokens']})" if "vllm_hit_tokens" in r else ""))
    if r["invalidated_tokens"] is None:
        lines.append("invalidated: unknown (a trace has block keys, not tokens)")
    elif r["first_diff_block"] is not None:
        lines.append(f"invalidated: {r['invalidated_tokens']} tokens after the difference are the same in both "
                     "prompts but get new keys (each key chains on its parent)")
    if "block_a" in r:
        lines.append(f"block {r['first_diff_block']} of A: {r['block_a']}")
        lines.append(f"block {r['first_diff_block']} of B: {r['block_b']}")
    return "\n".join(lines)


def changepoints_main(argv) -> int:
    from cacheresearch.analysis.changepoint import change_points, format_report, potential_hits  # noqa: PLC0415
    from cacheresearch.workload.keys import rekey_after  # noqa: PLC0415
    from cacheresearch.workload.trace import load_trace  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m cacheresearch.diff changepoints",
                                 description="windows where a trace's hit rate collapses, and what changed")
    ap.add_argument("trace")
    ap.add_argument("--block-tokens", type=int, default=None, help="default: the trace format's")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--drop", type=float, default=0.2, help="hit-rate drop below the baseline that flags a window")
    ap.add_argument("--baseline-windows", type=int, default=5)
    ap.add_argument("--inject-deploy-at-s", type=float, default=None,
                    help="re-key every request from this time on (a new model version / system prompt)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        w = load_trace(a.trace, block_tokens=a.block_tokens)
        if a.inject_deploy_at_s is not None:
            w = rekey_after(w, int(a.inject_deploy_at_s * 1000), version=1)
        hit = potential_hits(w)
        rep = change_points(w, hit, window_s=a.window_s, drop=a.drop, baseline_windows=a.baseline_windows)
    except (ValueError, OSError) as e:
        print(f"cacheresearch.diff changepoints: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, default=float) if a.json else format_report(rep))
    return 0

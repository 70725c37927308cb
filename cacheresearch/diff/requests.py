"""Diff of two chat requests on real tokens (:func:`diff_requests`).

Both requests are rendered (a template) and tokenized (a tokenizer; B may use another one of each), cut
into blocks and keyed with the project's chained keys, adapter, images and salt included
(:meth:`cacheresearch.workload.prompt.render.Encoded.block_keys`). The report:

``first_token``      index of the first token where A and B differ (``null`` if one is a prefix of the other)
``first_block``      the first block whose keys differ (``null`` if none of B's full blocks differs)
``message``          index in the JSON ``messages`` array of the message holding the first difference
                     (``null`` when it is not in a message: the tools, documents, Anthropic's ``system``)
``part``             that part, named: ``system``, ``tool 2 ('search')``, ``document 0``, ``message 3 (user)``
``cause``            :mod:`cacheresearch.diff.causes`
``hit_tokens``       what B hits with A cached (vLLM's cap: the last prompt token is recomputed)
``hit_tokens_lost``  the hit B would get with the difference fixed, minus ``hit_tokens``. "Fixed": for an
                     adapter or salt, the same extra keys; for a tokenizer or template, A rendered and
                     tokenized as B is; otherwise the differing part moved after everything A and B share
                     (static first, volatile last): the common prefix plus the common suffix of the tokens.
``usd_lost_per_request``  ``hit_tokens_lost`` x base price x (1 - read multiplier) / 1e6 under the pricing
                     preset (the lost tokens are billed as uncached instead of read; the provider's minimum
                     and increments applied to both hits)
"""

from __future__ import annotations

from cacheresearch.analysis.pricing import cacheable_tokens, preset
from cacheresearch.diff.causes import classify
from cacheresearch.workload.keys import reference_block_keys
from cacheresearch.workload.prompt.render import encode_request, part_name
from cacheresearch.workload.prompt.request import ChatRequest

__all__ = ["diff_requests", "diff_encoded"]


def _shared_blocks(ka, kb) -> int:
    n = 0
    while n < min(len(ka), len(kb)) and ka[n] == kb[n]:
        n += 1
    return n


def _cap(blocks: int, len_b: int, bs: int) -> int:
    return min(blocks, max(len_b - 1, 0) // bs) * bs


def diff_encoded(ea, eb, *, block_tokens: int = 16) -> dict:
    bs = int(block_tokens)
    if bs < 1:
        raise ValueError(f"--block-tokens must be >= 1, got {bs}")
    a, b = ea.tokens, eb.tokens
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    ka, kb = ea.block_keys(bs), eb.block_keys(bs)
    sh = _shared_blocks(ka, kb)
    if d is not None:
        first_block = min(d // bs, sh) if d // bs < len(kb) else None
    else:  # the same tokens: keys differ only through the extra keys (adapter, salt, images)
        first_block = sh if sh < min(len(ka), len(kb)) else None
    return dict(first_token=d, first_block=first_block, shared_blocks=sh, hit_tokens=_cap(sh, len(b), bs),
                tokens_a=len(a), tokens_b=len(b), blocks_a=len(ka), blocks_b=len(kb), block_tokens=bs)


def _suffix(a, b, p) -> int:
    s = 0
    while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    return s


def diff_requests(req_a: ChatRequest, req_b: ChatRequest, *, tokenizer="word", tokenizer_b=None, template="chatml",
                  template_b=None, block_tokens: int = 16, pricing: str = "anthropic_5m") -> dict:
    """The report of module docstring for requests A and B."""
    tb_, tpb = tokenizer_b or tokenizer, template_b or template
    ea = encode_request(req_a, template, tokenizer)
    eb = encode_request(req_b, tpb, tb_)
    r = diff_encoded(ea, eb, block_tokens=block_tokens)
    bs = r["block_tokens"]
    d = r["first_token"]
    if d is not None:
        label = eb.labels[d] if d < len(eb.labels) else ("markup", None, None)
    elif len(eb.tokens) > len(ea.tokens) and eb.labels:
        label = eb.labels[len(ea.tokens)]
    else:
        label = ("markup", None, None)
    c = classify(req_a, req_b, label=label, text_a=ea.text, text_b=eb.text, same_tokenizer=ea.tokenizer == eb.tokenizer)
    if d is None and r["first_block"] is None:
        c = dict(cause=None, detail="no difference: one prompt is a prefix of the other", part=None)
    # the hit with the difference fixed
    if c["cause"] in ("adapter", "salt"):
        fixed = _cap(_shared_blocks(reference_block_keys(ea.tokens, block_size=bs, mm_items=ea.images),
                                    reference_block_keys(eb.tokens, block_size=bs, mm_items=eb.images)), len(eb.tokens),
                     bs)
    elif c["cause"] in ("tokenizer", "template"):
        ea2 = encode_request(req_a, tpb, tb_)
        fixed = diff_encoded(ea2, eb, block_tokens=bs)["hit_tokens"]
    elif d is None:
        fixed = r["hit_tokens"]
    else:
        s = _suffix(ea.tokens, eb.tokens, d)
        fixed = min(((d + s) // bs) * bs, (max(len(eb.tokens) - 1, 0) // bs) * bs)
    lost = max(fixed - r["hit_tokens"], 0)
    p = preset(pricing)
    lost_billed = int(cacheable_tokens(max(fixed, r["hit_tokens"]), p)) - int(cacheable_tokens(r["hit_tokens"], p))
    part = c["part"]
    msg = None
    if part is not None and part[0] == "message":
        msg = part[1]
    elif part is not None and part[0] == "system":
        msg = part[1]  # the system message's index (OpenAI shape); None for Anthropic's top-level system
    r.update(message=msg, part=None if part is None else part_name(part), cause=c["cause"], detail=c["detail"],
             hit_tokens_if_fixed=fixed, hit_tokens_lost=lost, pricing=p.name,
             usd_lost_per_request=lost_billed * p.base_per_mtok * (1.0 - p.read_multiplier) / 1e6,
             tokenizer_a=ea.tokenizer, tokenizer_b=eb.tokenizer, template_a=ea.template, template_b=eb.template)
    if d is not None:
        r["token_a"] = ea.tokens[d] if d < len(ea.tokens) else None
        r["token_b"] = eb.tokens[d] if d < len(eb.tokens) else None
        r["text_a"] = ea.text[ea.starts[d]:ea.starts[d] + 40] if d < len(ea.starts) else ""
        r["text_b"] = eb.text[eb.starts[d]:eb.starts[d] + 40] if d < len(eb.starts) else ""
    return r

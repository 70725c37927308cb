"""Why two chat requests diverge: the first differing token, the part of the request it sits in, and the
cause when it is one of the known ones.

Causes, checked in this order (the first that applies):

``adapter``    the LoRA adapter differs (an extra key of every block: nothing is shared)
``salt``       the cache salt differs (an extra key of block 0; it reaches every later key)
``tokenizer``  the two requests render to the same text but were tokenized differently (another tokenizer,
               or another version of one)
``template``   the two requests carry the same content but render to different text (another chat template
               or template version)
``reordered``  the differing part holds the same tools in another order, or a JSON schema whose keys come in
               another order (equal once parsed)
``whitespace`` the differing part is equal once runs of whitespace are collapsed and the ends stripped
``timestamp``  the differing characters (widened to whole words) look like a date, a time, a UUID, a long hex
               or decimal id, or a request / session id (``req_...``, ``sess-...``); or a short text was
               inserted (or removed) that holds one, as a prompt that gains ``Current date: ...`` at the top
``content``    anything else (a real change of the text)

The part is found on the rendered tokens: each token carries the label of the request part its first
character came from (:mod:`cacheresearch.workload.prompt.render`). When the first differing token lies in
the template's markup (a tool added, a section header), the first differing part in render order is used.
"""

from __future__ import annotations

import json
import re

from cacheresearch.workload.prompt.request import ChatRequest

__all__ = ["CAUSES", "classify_text", "classify", "part_text", "VOLATILE"]

CAUSES = ("timestamp", "reordered", "whitespace", "template", "tokenizer", "adapter", "salt", "content")

#: What a volatile value looks like (each alternative is tried on the differing words).
VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?"  # ISO date / datetime
    r"|\d{1,2}:\d{2}(:\d{2})?(\s?[AaPp][Mm])?"  # a clock time
    r"|\d{1,2}/\d{1,2}/\d{2,4}"  # 12/01/2026
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # UUID
    r"|(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}"  # long hex
    r"|\d{6,}"  # unix time, counters
    r"|(req|request|sess|session|trace|msg|run|call|chatcmpl|id)[-_][A-Za-z0-9_-]{4,}"  # prefixed ids
    r"|(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,?\s+\d{1,2}\s+[A-Z][a-z]+|[A-Z][a-z]+\s+\d{1,2},\s+\d{4}"
)
#: an inserted (or removed) text up to this long that holds a volatile value is a timestamp, not content
INSERTED_MAX_CHARS = 80
_WORD = re.compile(r"[\w:./+-]")


def _norm_ws(s: str) -> str:
    return " ".join(s.split())


def _widen(s: str, a: int, b: int) -> str:
    while a > 0 and _WORD.match(s[a - 1]):
        a -= 1
    while b < len(s) and _WORD.match(s[b]):
        b += 1
    return s[a:b]


def classify_text(a: str, b: str) -> tuple[str, str]:
    """Cause of the difference between two versions of one part's text: whitespace, timestamp or content."""
    if a == b:
        return "content", "equal"
    if _norm_ws(a) == _norm_ws(b):
        return "whitespace", "equal once whitespace is collapsed"
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    ins = b[p:len(b) - s] if p + s == len(a) else a[p:len(a) - s] if p + s == len(b) else None
    if ins is not None and len(ins.strip()) <= INSERTED_MAX_CHARS and VOLATILE.search(ins):
        verb = "inserted" if p + s == len(a) else "removed"
        return "timestamp", f"a volatile value {verb}: {ins.strip()!r}"
    wa, wb = _widen(a, p, len(a) - s), _widen(b, p, len(b) - s)
    hits = [w for w in (wa, wb) if w and VOLATILE.search(w)]
    if hits and all(not w or VOLATILE.search(w) for w in (wa, wb)):
        return "timestamp", f"a volatile value: {wa!r} -> {wb!r}"
    return "content", f"{wa[:60]!r} -> {wb[:60]!r}"


def _canon(x) -> str:
    return json.dumps(x, sort_keys=True, ensure_ascii=False)


def part_text(req: ChatRequest, kind: str, idx) -> str | None:
    """The text of one part (``kind`` as in the render labels; ``idx`` the tool / document index or the
    message's JSON index)."""
    if kind == "system":
        return req.system
    if kind == "tool":
        return json.dumps(req.tools[idx].as_dict(), ensure_ascii=False) if idx is not None and idx < len(req.tools) \
            else None
    if kind == "document":
        return req.documents[idx] if idx is not None and idx < len(req.documents) else None
    if kind == "message":
        m = next((m for m in req.messages if m.index == idx), None)
        return None if m is None else m.content + "".join(f"<image:{h}>" for h in m.images)
    return None


def _parts(req: ChatRequest):
    """The request's parts in the order the templates render them."""
    out = [("system", req.system_index, "system")]
    out += [("tool", k, t.name) for k, t in enumerate(req.tools)]
    out += [("document", k, None) for k in range(len(req.documents))]
    out += [("message", m.index, m.role) for m in req.messages]
    return out


def _content_equal(a: ChatRequest, b: ChatRequest) -> bool:
    key = lambda r: (r.system, [json.dumps(t.as_dict()) for t in r.tools], list(r.documents),  # noqa: E731
                     [(m.role, m.content, m.images) for m in r.messages])
    return key(a) == key(b)


def classify(req_a: ChatRequest, req_b: ChatRequest, *, label, text_a: str, text_b: str,
             same_tokenizer: bool = True) -> dict:
    """``{"cause", "detail", "part"}`` for two requests whose first differing token has render label
    ``label`` (``(kind, index, name)``) and whose rendered texts are ``text_a`` / ``text_b``."""
    if (req_a.adapter or None) != (req_b.adapter or None):
        return dict(cause="adapter", detail=f"adapter {req_a.adapter!r} -> {req_b.adapter!r}", part=None)
    if (req_a.cache_salt or None) != (req_b.cache_salt or None):
        return dict(cause="salt", detail=f"cache_salt {req_a.cache_salt!r} -> {req_b.cache_salt!r}", part=None)
    if text_a == text_b and not same_tokenizer:
        return dict(cause="tokenizer", detail="the same text, tokenized differently", part=label)
    if _content_equal(req_a, req_b):
        return dict(cause="template", detail="the same content, rendered differently", part=label)
    kind, idx, _ = label
    if kind not in ("system", "tool", "document", "message") or part_text(req_a, kind, idx) == part_text(req_b, kind,
                                                                                                        idx):
        # the first differing token is markup (or the label is not precise): the first differing part
        pa, pb = _parts(req_a), _parts(req_b)
        label = next(((k, i, n) for (k, i, n) in pa if part_text(req_a, k, i) != part_text(req_b, k, i)),
                     pb[len(pa)] if len(pb) > len(pa) else label)
        kind, idx, _ = label
    if kind == "tool":
        ta, tb = [_canon(t.as_dict()) for t in req_a.tools], [_canon(t.as_dict()) for t in req_b.tools]
        if sorted(ta) == sorted(tb) and ta != tb:
            na, nb = [t.name for t in req_a.tools], [t.name for t in req_b.tools]
            return dict(cause="reordered", detail=f"the same {len(ta)} tools in another order ({na} -> {nb})",
                        part=label)
        if idx is not None and idx < min(len(ta), len(tb)) and ta[idx] == tb[idx]:
            return dict(cause="reordered", detail=f"tool {req_a.tools[idx].name!r}: its JSON schema's keys come in "
                                                  "another order (equal once parsed)", part=label)
    if kind == "message":
        ma = next((m for m in req_a.messages if m.index == idx), None)
        mb = next((m for m in req_b.messages if m.index == idx), None)
        if ma is not None and mb is not None and ma.content == mb.content and ma.images != mb.images:
            return dict(cause="content", detail=f"another image ({len(ma.images)} -> {len(mb.images)} images, "
                                                "identified by hash)", part=label)
    a, b = part_text(req_a, kind, idx), part_text(req_b, kind, idx)
    if a is None or b is None:
        return dict(cause="content", detail=f"{kind} {idx} exists in only one request", part=label)
    for s, t in ((a, b),):
        try:
            if _canon(json.loads(s)) == _canon(json.loads(t)):
                return dict(cause="reordered", detail="JSON with the same keys in another order", part=label)
        except (ValueError, TypeError):
            pass
    cause, detail = classify_text(a, b)
    return dict(cause=cause, detail=detail, part=label)

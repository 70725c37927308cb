"""Chat templates: a :class:`ChatRequest` rendered into text with labelled spans, then into token ids.

Templates (``get_template(spec)``):

``chatml``      ChatML markup as text: ``<|im_start|>system\\n`` + system prompt, a ``# Tools`` section (one
                JSON object per tool, in the request's order, keys in the order given unless the template
                sorts them) and a ``# Documents`` section, ``<|im_end|>``; then each message; then the
                generation prompt ``<|im_start|>assistant\\n``. Images render as ``<image>``.
``chatml_v2``   the same template after an edit (the tools header becomes ``## Available tools``): what a
                "template change mid-run" looks like to the cache.
``sorted``      ``chatml`` with every JSON schema serialised with sorted keys (the fix for unsorted keys)
``plain``       the parts joined by blank lines, no markup (prompt text files)
``jinja``       the tokenizer's own chat template (``tokenizer_config.json``'s ``chat_template``, rendered
                with jinja2: ``messages`` with the system message first, ``tools`` as OpenAI function
                objects, ``documents``, ``add_generation_prompt=True``)
``mistral``     mistral-common's request encoder (``MistralTokenizer.from_file`` of the Tekken file, its
                instruct template: v3 puts the tools and the system prompt before the LAST user message);
                the token ids are mistral-common's own, control tokens included

:func:`encode_request` returns an :class:`Encoded`: token ids, each token's part label (which message,
which tool, which document, or the template's markup), images as ``(hash, start, length)`` token ranges,
and the adapter and salt as the 32-bit extra keys of :mod:`cacheresearch.workload.keys`;
:meth:`Encoded.block_keys` chains them with the project's key spec.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field

from cacheresearch.workload.keys import reference_block_keys
from cacheresearch.workload.prompt.request import ChatRequest
from cacheresearch.workload.prompt.tokenizers import Tokenizer, encode_cached, get_tokenizer

__all__ = ["Rendered", "Encoded", "Template", "TEMPLATES", "get_template", "encode_request", "extra_key",
           "part_name"]

IMAGE = "<image>"


def extra_key(s: str | None) -> int:
    """A nonzero 32-bit word for an adapter name or a salt string (0 = none)."""
    if s is None or s == "":
        return 0
    return (zlib.crc32(s.encode("utf-8")) & 0xFFFFFFFF) or 1


def part_name(label) -> str:
    kind, idx, name = label
    if kind == "tool":
        return f"tool {idx} ({name!r})"
    if kind == "message":
        return f"message {idx} ({name})"
    if kind == "document":
        return f"document {idx}"
    return kind


@dataclass
class Rendered:
    text: str
    spans: list  # [(start, end, label)], label = (kind, index, name); kind in system/tool/document/message/markup
    images: list = field(default_factory=list)  # [(hash, char_start, char_end)]
    tokens: list | None = None  # set when the template produces ids itself (mistral)
    starts: list | None = None

    def label_at(self, pos: int):
        for s, e, lab in self.spans:
            if s <= pos < e:
                return lab
        return ("markup", None, None)


@dataclass
class Encoded:
    tokens: list
    labels: list  # per token: (kind, index, name)
    text: str
    starts: list
    images: list  # [(hash32, token_start, token_len)]
    adapter: int
    salt: int
    tokenizer: str
    template: str

    def block_keys(self, block_tokens: int) -> list[int]:
        return reference_block_keys(self.tokens, block_size=block_tokens, adapter=self.adapter,
                                    cache_salt=self.salt, mm_items=self.images)

    def part_tokens(self) -> dict:
        """Tokens per part label, in order of first appearance."""
        out: dict = {}
        for lab in self.labels:
            out[lab] = out.get(lab, 0) + 1
        return out


class Template:
    name = "chatml"
    tools_header = "# Tools"
    sort_keys = False

    def __init__(self, name="chatml", tools_header="# Tools", sort_keys=False):
        self.name, self.tools_header, self.sort_keys = name, tools_header, sort_keys

    def tool_json(self, t) -> str:
        return json.dumps(t.as_dict(), ensure_ascii=False, sort_keys=self.sort_keys)

    def render(self, req: ChatRequest, tok: Tokenizer | None = None) -> Rendered:
        buf, spans, images = [], [], []
        pos = 0

        def put(s, label):
            nonlocal pos
            if s:
                buf.append(s)
                spans.append((pos, pos + len(s), label))
                pos += len(s)

        mk = ("markup", None, None)
        put("<|im_start|>system\n", mk)
        put(req.system, ("system", req.system_index, "system"))
        if req.tools:
            put(f"\n\n{self.tools_header}\n", mk)
            for k, t in enumerate(req.tools):
                put("\n", mk)
                put(self.tool_json(t), ("tool", k, t.name))
        if req.documents:
            put("\n\n# Documents\n", mk)
            for k, d in enumerate(req.documents):
                put("\n", mk)
                put(d, ("document", k, None))
        put("<|im_end|>\n", mk)
        for m in req.messages:
            lab = ("message", m.index, m.role)
            put(f"<|im_start|>{m.role}\n", mk)
            put(m.content, lab)
            for h in m.images:
                images.append((h, pos, pos + len(IMAGE)))
                put(IMAGE, lab)
            put("<|im_end|>\n", mk)
        put("<|im_start|>assistant\n", mk)
        return Rendered("".join(buf), spans, images)


class PlainTemplate(Template):
    def render(self, req, tok=None):
        parts = [(req.system, ("system", req.system_index, "system"))]
        parts += [(Template.tool_json(self, t), ("tool", k, t.name)) for k, t in enumerate(req.tools)]
        parts += [(d, ("document", k, None)) for k, d in enumerate(req.documents)]
        parts += [(m.content, ("message", m.index, m.role)) for m in req.messages]
        buf, spans, pos = [], [], 0
        for s, lab in parts:
            if not s:
                continue
            if buf:
                buf.append("\n\n")
                spans.append((pos, pos + 2, ("markup", None, None)))
                pos += 2
            buf.append(s)
            spans.append((pos, pos + len(s), lab))
            pos += len(s)
        return Rendered("".join(buf), spans, [])


def _locate(text: str, parts) -> list:
    """Spans of each part's text in ``text`` (first occurrence not yet claimed, any order)."""
    claimed, spans = [], []
    for s, lab in parts:
        if not s:
            continue
        start = 0
        while True:
            i = text.find(s, start)
            if i < 0:
                break
            if all(i + len(s) <= a or i >= b for a, b, _ in claimed):
                claimed.append((i, i + len(s), lab))
                break
            start = i + 1
    spans = sorted(claimed)
    return spans


class JinjaTemplate(Template):
    """The tokenizer's chat template (``tokenizer_config.json``), or one given as a string."""

    def __init__(self, source: str | None = None, name="jinja"):
        super().__init__(name)
        self.source = source

    def render(self, req, tok=None):
        try:
            import jinja2  # noqa: PLC0415
            from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
        except ImportError as e:
            from cacheresearch.workload.prompt.tokenizers import TokenizerUnavailable  # noqa: PLC0415

            raise TokenizerUnavailable("the jinja template needs jinja2: pip install 'cacheresearch[prompt]'") from e
        src = self.source or getattr(tok, "chat_template", None)
        if not src:
            raise ValueError("template jinja: the tokenizer has no chat_template (tokenizer_config.json) and none "
                             "was given")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        msgs = ([{"role": "system", "content": req.system}] if req.system else [])
        msgs += [{"role": m.role, "content": m.content + IMAGE * len(m.images)} for m in req.messages]
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.parameters}} for t in req.tools]
        special = getattr(tok, "special", {}) or {}
        text = env.from_string(src).render(messages=msgs, tools=tools or None, documents=list(req.documents) or None,
                                           add_generation_prompt=True, bos_token=special.get("bos_token", ""),
                                           eos_token=special.get("eos_token", ""))
        parts = [(req.system, ("system", req.system_index, "system"))]
        parts += [(json.dumps(tools[k]["function"]["parameters"], ensure_ascii=False), ("tool", k, t.name))
                  for k, t in enumerate(req.tools)]
        parts += [(d, ("document", k, None)) for k, d in enumerate(req.documents)]
        parts += [(m.content, ("message", m.index, m.role)) for m in req.messages]
        return Rendered(text, _locate(text, parts), [])


class MistralTemplate(Template):
    """mistral-common's request encoder (the model's instruct template), token ids included."""

    def __init__(self, file="tekken_240911.json", name="mistral"):
        super().__init__(name)
        self.file = file

    def render(self, req, tok=None):
        from mistral_common.protocol.instruct.messages import (  # noqa: PLC0415
            AssistantMessage,
            SystemMessage,
            ToolMessage,
            UserMessage,
        )
        from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: PLC0415
        from mistral_common.protocol.instruct.tool_calls import Function, Tool  # noqa: PLC0415
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: PLC0415
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: PLC0415

        from cacheresearch.workload.prompt.tokenizers import byte_to_char_starts, mistral_data  # noqa: PLC0415

        mt = _mistral(self.file, MistralTokenizer, mistral_data)
        msgs = [SystemMessage(content=req.system)] if req.system else []
        for m in req.messages:
            if m.role == "user":
                msgs.append(UserMessage(content=m.content + IMAGE * len(m.images)))
            elif m.role == "assistant":
                msgs.append(AssistantMessage(content=m.content))
            else:
                msgs.append(ToolMessage(content=m.content, tool_call_id="call00000"))
        if req.documents:  # no document slot in the instruct template: documents join the system prompt
            doc = "\n\n".join(req.documents)
            msgs = [SystemMessage(content=(req.system + "\n\n" if req.system else "") + doc)] + msgs[1 if req.system
                                                                                                    else 0:]
        tools = [Tool(function=Function(name=t.name, description=t.description, parameters=t.parameters))
                 for t in req.tools]
        r = mt.encode_chat_completion(ChatCompletionRequest(messages=msgs, tools=tools or None))
        tk = mt.instruct_tokenizer.tokenizer
        pieces = [tk.id_to_byte_piece(t, SpecialTokenPolicy.KEEP) for t in r.tokens]
        raw = b"".join(pieces)
        text = raw.decode("utf-8", errors="replace")
        bstarts, b = [], 0
        for p in pieces:
            bstarts.append(b)
            b += len(p)
        starts = byte_to_char_starts(text, bstarts) if text.encode("utf-8") == raw else bstarts
        parts = [(req.system, ("system", req.system_index, "system"))]
        parts += [(json.dumps(t.parameters, ensure_ascii=False)[1:-1], ("tool", k, t.name))
                  for k, t in enumerate(req.tools)]
        parts += [(d, ("document", k, None)) for k, d in enumerate(req.documents)]
        parts += [(m.content, ("message", m.index, m.role)) for m in req.messages]
        return Rendered(text, _locate(text, parts), [], tokens=list(r.tokens), starts=starts)


_MT: dict = {}


def _mistral(file, cls, data):
    if file not in _MT:
        _MT[file] = cls.from_file(data(file))
    return _MT[file]


TEMPLATES = ("chatml", "chatml_v2", "sorted", "plain", "jinja", "mistral")


def get_template(spec: str) -> Template:
    s = str(spec)
    if s == "chatml":
        return Template("chatml")
    if s == "chatml_v2":
        return Template("chatml_v2", tools_header="## Available tools")
    if s == "sorted":
        return Template("sorted", sort_keys=True)
    if s == "plain":
        return PlainTemplate("plain")
    if s == "jinja":
        return JinjaTemplate()
    if s.startswith("mistral"):
        f = s.split(":", 1)[1] if ":" in s else "tekken_240911.json"
        return MistralTemplate(f if f.endswith(".json") else f + ".json", name=s)
    raise ValueError(f"--template {s!r}: choose one of {list(TEMPLATES)}")


def encode_request(req: ChatRequest, template="chatml", tokenizer="word", *, memo: dict | None = None) -> Encoded:
    """Render ``req`` with ``template`` and tokenize it with ``tokenizer`` (names or objects)."""
    tpl = get_template(template) if isinstance(template, str) else template
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    r = tpl.render(req, tok)
    if r.tokens is not None:
        ids, starts = r.tokens, r.starts
        tok_id = f"mistral-common:{getattr(tpl, 'file', '')}"
    elif memo is not None and tok.cut_safe:
        ids, starts = encode_cached(tok, r.text, memo), None
        tok_id = tok.id
    else:
        ids, starts = tok.encode_offsets(r.text)
        tok_id = tok.id
    labels = [r.label_at(s) for s in starts] if starts is not None else []
    images = []
    if r.images and starts is not None:
        import bisect  # noqa: PLC0415

        for h, a, b in r.images:
            i, j = max(bisect.bisect_right(starts, a) - 1, 0), bisect.bisect_left(starts, b)
            images.append((int(h, 16) & 0xFFFFFFFF, i, max(j - i, 1)))
    return Encoded(list(ids), labels, r.text, starts or [], images, extra_key(req.adapter), extra_key(req.cache_salt),
                   tok_id, tpl.name)

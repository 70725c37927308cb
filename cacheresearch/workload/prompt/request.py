"""Chat requests as data: system prompt, tools (JSON schemas), documents, history and the new turn,
plus the cache's extra keys (LoRA adapter, images by hash, cache salt) and the routing hint
``prompt_cache_key``.

:func:`parse_request` reads the two message shapes people send:

* OpenAI (chat completions): ``{"messages": [{"role": "system" | "developer" | "user" | "assistant" |
  "tool", "content": str | [parts]}], "tools": [{"type": "function", "function": {"name", "description",
  "parameters"}}], "prompt_cache_key": ...}``; content parts ``{"type": "text", "text"}`` and
  ``{"type": "image_url", "image_url": {"url"}}``.
* Anthropic (messages): ``{"system": str | [{"type": "text", "text"}], "messages": [...], "tools":
  [{"name", "description", "input_schema"}]}``; content blocks ``text``, ``image`` (``source``),
  ``tool_use`` and ``tool_result``.

Project extensions accepted in either shape: ``documents`` (a list of strings, or of ``{"title", "text"}``),
``adapter`` (or ``lora``: the LoRA adapter name), ``cache_salt`` (vLLM's field name) and
``prompt_cache_key``. An image is identified by the hash of its URL or source (``sha256``), as vLLM
identifies a multimodal item by the hash of its content.

Every part keeps its place in the JSON it came from (:attr:`Message.index` = the index in the JSON's
``messages`` array), so a difference found in the rendered tokens can be reported as "message 3" or
"tool 'search'". :class:`RequestError` names the position of malformed JSON (line, column, character).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

__all__ = ["Tool", "Message", "ChatRequest", "RequestError", "parse_request", "load_request", "image_hash"]


class RequestError(ValueError):
    """A request that cannot be read (malformed JSON, or a shape that is neither OpenAI's nor Anthropic's)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict)  # the JSON schema, in the key order it was given

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class Message:
    role: str  # user | assistant | tool
    content: str
    images: tuple[str, ...] = ()  # image hashes, in order (each rendered as one placeholder after the text)
    index: int | None = None  # index in the source JSON's "messages" array


@dataclass(frozen=True)
class ChatRequest:
    system: str = ""
    tools: tuple[Tool, ...] = ()
    documents: tuple[str, ...] = ()
    messages: tuple[Message, ...] = ()  # the history, then the new turn (the last message)
    adapter: str | None = None
    cache_salt: str | None = None
    prompt_cache_key: str | None = None
    system_index: int | None = None  # index of the system message in the source "messages" (OpenAI shape)
    shape: str = "project"  # openai | anthropic | project

    def replace(self, **kw) -> "ChatRequest":
        from dataclasses import replace  # noqa: PLC0415

        return replace(self, **kw)


def image_hash(source) -> str:
    """A stable identifier of an image: sha256 of its URL / source, as canonical JSON (hex, 16 digits)."""
    blob = source if isinstance(source, str) else json.dumps(source, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _err(where: str, msg: str):
    raise RequestError(f"{where}: {msg}")


def _content(c, where: str) -> tuple[str, tuple[str, ...]]:
    """Text and image hashes of a message content (a string or a list of parts / blocks)."""
    if c is None:
        return "", ()
    if isinstance(c, str):
        return c, ()
    if not isinstance(c, list):
        _err(where, f"content must be a string or a list of parts, got {type(c).__name__}")
    texts, images = [], []
    for k, p in enumerate(c):
        w = f"{where}.content[{k}]"
        if isinstance(p, str):
            texts.append(p)
            continue
        if not isinstance(p, dict) or "type" not in p:
            _err(w, "a content part is an object with a 'type'")
        t = p["type"]
        if t in ("text", "input_text"):
            texts.append(str(p.get("text", "")))
        elif t == "image_url":
            u = p.get("image_url")
            images.append(image_hash(u.get("url") if isinstance(u, dict) else u))
        elif t in ("image", "input_image"):
            images.append(image_hash(p.get("source", p.get("image_url", p))))
        elif t == "tool_use":
            texts.append(json.dumps({"name": p.get("name"), "input": p.get("input")}, ensure_ascii=False))
        elif t == "tool_result":
            inner, imgs = _content(p.get("content"), w)
            texts.append(inner)
            images.extend(imgs)
        elif t == "document":
            src = p.get("source", {})
            texts.append(str(src.get("data", "")) if isinstance(src, dict) else str(src))
        else:
            _err(w, f"unknown content part type {t!r}")
    return "\n".join(texts), tuple(images)


def _tool(t, where: str) -> Tool:
    if not isinstance(t, dict):
        _err(where, "a tool is an object")
    if "function" in t and isinstance(t["function"], dict):  # OpenAI
        f = t["function"]
        return Tool(str(f.get("name", "")), str(f.get("description", "")), f.get("parameters") or {})
    if "name" in t:  # Anthropic (input_schema) or the project's own (parameters)
        return Tool(str(t["name"]), str(t.get("description", "")), t.get("input_schema", t.get("parameters")) or {})
    _err(where, "a tool needs 'function' (OpenAI) or 'name' (Anthropic)")


def _documents(d, where: str) -> tuple[str, ...]:
    if d is None:
        return ()
    if not isinstance(d, list):
        _err(where, "documents must be a list")
    out = []
    for k, x in enumerate(d):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            title, text = x.get("title"), x.get("text", x.get("content", ""))
            out.append(f"{title}\n{text}" if title else str(text))
        else:
            _err(f"{where}[{k}]", "a document is a string or {title, text}")
    return tuple(out)


def parse_request(obj, *, where: str = "request") -> ChatRequest:
    """A :class:`ChatRequest` from a parsed JSON object (OpenAI or Anthropic shape, see the module doc)."""
    if isinstance(obj, list):  # a bare message list
        obj = {"messages": obj}
    if not isinstance(obj, dict):
        _err(where, f"a chat request is a JSON object (or a list of messages), got {type(obj).__name__}")
    msgs = obj.get("messages", [])
    if not isinstance(msgs, list):
        _err(f"{where}.messages", "must be a list")
    system, system_index = "", None
    shape = "anthropic" if "system" in obj or any(isinstance(t, dict) and "input_schema" in t
                                                    for t in obj.get("tools") or []) else "openai"
    if "system" in obj:
        system, _ = _content(obj["system"], f"{where}.system")
    out = []
    for i, m in enumerate(msgs):
        w = f"{where}.messages[{i}]"
        if not isinstance(m, dict) or "role" not in m:
            _err(w, "a message is an object with a 'role'")
        role = str(m["role"])
        text, imgs = _content(m.get("content"), w)
        if role in ("system", "developer"):
            if system_index is not None or system:
                system = system + "\n\n" + text
            else:
                system, system_index = text, i
            continue
        if role not in ("user", "assistant", "tool"):
            _err(w, f"unknown role {role!r}")
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
                     for c in m["tool_calls"] if isinstance(c, dict)]
            text = (text + "\n" if text else "") + json.dumps(calls, ensure_ascii=False)
        out.append(Message(role, text, imgs, i))
    tools = obj.get("tools") or []
    if not isinstance(tools, list):
        _err(f"{where}.tools", "must be a list")
    adapter = obj.get("adapter", obj.get("lora"))
    return ChatRequest(
        system=system,
        tools=tuple(_tool(t, f"{where}.tools[{k}]") for k, t in enumerate(tools)),
        documents=_documents(obj.get("documents"), f"{where}.documents"),
        messages=tuple(out),
        adapter=None if adapter in (None, "") else str(adapter),
        cache_salt=None if obj.get("cache_salt") in (None, "") else str(obj["cache_salt"]),
        prompt_cache_key=None if obj.get("prompt_cache_key") in (None, "") else str(obj["prompt_cache_key"]),
        system_index=system_index,
        shape=shape,
    )


def load_request(path: str, text: str | None = None) -> ChatRequest:
    """Read a request from a JSON file; malformed JSON raises :class:`RequestError` naming its position."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if 0 < e.lineno <= len(text.splitlines()) else ""
        caret = " " * max(e.colno - 1, 0) + "^"
        raise RequestError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno} (character {e.pos}): "
                           f"{e.msg}\n  {line[:200]}\n  {caret[:201]}") from None
    return parse_request(obj, where=str(path))

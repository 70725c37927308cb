"""The design scenario as chat requests: tenants with a system prompt, tool schemas and documents, each
request a fresh question; and the seed's layout mistakes applied to it, each with its fix.

:func:`tenant_requests` draws the content (deterministic in ``seed``): per tenant a system prompt, a tool
set drawn from a pool of JSON-schema tools (its own order), and documents, about ``prefix_tokens`` tokens
in all; per request a tenant (uniform), a user of that tenant, a Poisson arrival time and a fresh question
of about ``suffix_tokens`` tokens. Text is English-like (words from a fixed list), so real tokenizers cut
it the way they cut prose.

:data:`LAYOUTS` (each a function of the request, its index and an RNG, applied by :func:`apply_layout`):

``stable``            static first, volatile last (the reference layout)
``timestamp_top``     ``Current time: <ISO time of arrival, ms>`` at the top of the system prompt (with a
                      seconds-resolution stamp, two requests of a tenant in the same second would share it)
``timestamp_end``     the fix: the time in the new turn
``tools_shuffled``    the tool list in a random order per request (the fix: one fixed order, ``stable``)
``unsorted_keys``     every JSON schema's keys in a random order per request (a dict built from a set);
                      the fix is the ``sorted`` template (serialise with sorted keys), on the same requests
``trailing_space``    half the requests carry a trailing space after the system prompt (two code paths);
                      the fix: strip it (``stable``)
``template_change``   the chat template changes (``chatml`` -> ``chatml_v2``) halfway through the run; the
                      fix: no change mid-run (``stable``)
``personal_top``      the user's name and plan at the top of the system prompt; the fix ``personal_end``
                      puts them in the new turn

:func:`requests_to_workload` renders and tokenizes requests (memoised pieces, exact:
:func:`~cacheresearch.workload.prompt.tokenizers.encode_cached`) and hashes them with the project's key spec.
"""

from __future__ import annotations

import copy
import datetime as _dt

import numpy as np

from cacheresearch.workload.keys import tokens_to_workload
from cacheresearch.workload.prompt.render import encode_request, get_template
from cacheresearch.workload.prompt.request import ChatRequest, Message, Tool
from cacheresearch.workload.prompt.tokenizers import encode_cached, get_tokenizer

__all__ = ["LAYOUTS", "FIXES", "tenant_requests", "apply_layout", "requests_to_workload", "layout_template"]

_WORDS = ("account access action add address admin agent alert allow amount answer api app apply archive ask "
          "audit available backup balance bank basic batch bill billing block branch budget build bundle cache "
          "call cancel capacity card case change channel charge check choose clear client close cloud cluster "
          "code commit compute config confirm connect contact contract copy cost count create credit current "
          "customer daily data database date deadline default delete deliver deploy detail device direct "
          "discount disk document domain download draft due edit email enable endpoint error estimate event "
          "export fee field file filter find fix flag folder form format free function gateway group guide "
          "history host hour identity image import include index invoice issue item key label language latency "
          "launch level license limit link list load local lock log login manage manual market member memory "
          "message method metric migrate minute mode model monitor month move name network node note notice "
          "number object offer open option order owner package page partner password payment pending permission "
          "phone plan platform policy port price priority process product profile project provider public "
          "query queue quota rate record refund region release remote report request reset resource response "
          "restore result review role route rule run sample save scale schedule schema search secret section "
          "secure select send server service session setting share size snapshot source standard start status "
          "step storage store stream subscription support system table tag task team template tenant term "
          "test ticket tier time token tool total trace track transfer trial type update upgrade upload usage "
          "user value vendor version view volume wait warning week window work workflow zone").split()
_FIRST = "Ana Ben Chen Dara Eli Farah Gus Hana Ivan Jo Kai Lena Milo Nia Omar Pia Quinn Rosa Sam Tara".split()
_TIERS = ("free", "pro", "team", "enterprise")

LAYOUTS = ("stable", "timestamp_top", "timestamp_end", "tools_shuffled", "unsorted_keys", "unsorted_keys_sorted",
           "trailing_space", "template_change", "personal_top", "personal_end")
#: mistake -> its fix
FIXES = {"timestamp_top": "timestamp_end", "tools_shuffled": "stable", "unsorted_keys": "unsorted_keys_sorted",
         "trailing_space": "stable", "template_change": "stable", "personal_top": "personal_end"}


def _sentence(rng, n):
    w = rng.choice(_WORDS, size=n)
    return (" ".join(w)).capitalize() + "."


def _para(rng, n_words):
    out, k = [], 0
    while k < n_words:
        m = int(rng.integers(8, 20))
        out.append(_sentence(rng, m))
        k += m
    return " ".join(out)


def _tool_pool(rng, n=12):
    pool = []
    for t in range(n):
        props = {}
        for _ in range(int(rng.integers(3, 7))):
            name = "_".join(rng.choice(_WORDS, size=2))
            kind = str(rng.choice(["string", "integer", "boolean", "number"]))
            p = {"type": kind, "description": _sentence(rng, int(rng.integers(6, 14)))}
            if kind == "string" and rng.random() < 0.3:
                p["enum"] = [str(x) for x in rng.choice(_WORDS, size=3, replace=False)]
            props[name] = p
        req = list(props)[: max(1, len(props) // 2)]
        name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{t}"
        pool.append(Tool(name, _para(rng, int(rng.integers(25, 45))), {"type": "object", "properties": props,
                                                                        "required": req}))
    return pool


def tenant_requests(*, n_tenants=16, prefix_tokens=10_000, suffix_tokens=200, n_requests=1000, duration_s=28_800.0,
                    users_per_tenant=50, tools_per_tenant=6, documents_per_tenant=4, shared_head=False,
                    seed=0):
    """``(requests, arrival_ms, tenant, user)`` of the templated design scenario (module docstring).

    Token counts are approximate (about 1.3 tokens per word for the real tokenizers); the rendered lengths
    are what the studies report. ``shared_head``: every tenant gets tenant 0's system prompt and tools (a
    platform's head shared by all tenants), then its own documents.
    """
    r_c, r_q, r_t, r_a = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    pool = _tool_pool(r_c)
    words = int(prefix_tokens / 1.3)
    tenants = []
    for k in range(n_tenants):
        system = f"You are the support assistant of tenant {k}. " + _para(r_c, 150)
        tools = tuple(pool[j] for j in r_c.choice(len(pool), size=tools_per_tenant, replace=False))
        tool_words = sum(len(str(t.as_dict()).split()) for t in tools)
        if shared_head and tenants:
            system, tools = tenants[0].system, tenants[0].tools
        doc_words = max(words - 150 - tool_words, 50)
        nd = max(int(documents_per_tenant), 1)
        docs = tuple("\n".join(_para(r_c, 120) for _ in range(max(doc_words // nd // 120, 1))) for _ in range(nd))
        tenants.append(ChatRequest(system=system, tools=tools, documents=docs, system_index=0))
    tenant = r_t.integers(0, n_tenants, n_requests).astype(np.int32)
    user = r_t.integers(0, users_per_tenant, n_requests).astype(np.int32)
    gaps = r_a.exponential(duration_s * 1000.0 / n_requests, n_requests)
    arrival = np.floor(np.cumsum(gaps)).astype(np.int64)
    q_words = max(int(suffix_tokens / 1.3), 1)
    reqs = [tenants[t].replace(messages=(Message("user", _para(r_q, q_words), (), 1),)) for t in tenant]
    return reqs, arrival, tenant, user


def _shuffle_keys(x, rng):
    if isinstance(x, dict):
        items = list(x.items())
        order = rng.permutation(len(items))
        return {items[i][0]: _shuffle_keys(items[i][1], rng) for i in order}
    if isinstance(x, list):
        return [_shuffle_keys(v, rng) for v in x]
    return x


def _iso(ms: int) -> str:
    t = _dt.datetime(2026, 12, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(milliseconds=int(ms))
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"  # ms, as datetime.isoformat()


def apply_layout(req: ChatRequest, layout: str, *, i: int, arrival_ms: int, user: int, rng) -> ChatRequest:
    """``req`` (a ``stable`` request) with ``layout``'s mistake or fix applied (module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {list(LAYOUTS)}")
    turn = req.messages[-1]
    person = f"The user is {_FIRST[user % len(_FIRST)]} (user {user}, {_TIERS[user % len(_TIERS)]} plan)."
    if layout == "timestamp_top":
        return req.replace(system=f"Current time: {_iso(arrival_ms)}.\n" + req.system)
    if layout == "timestamp_end":
        return req.replace(messages=req.messages[:-1] + (Message("user", f"Current time: {_iso(arrival_ms)}.\n"
                                                                 + turn.content, turn.images, turn.index),))
    if layout == "tools_shuffled":
        return req.replace(tools=tuple(req.tools[j] for j in rng.permutation(len(req.tools))))
    if layout in ("unsorted_keys", "unsorted_keys_sorted"):
        return req.replace(tools=tuple(Tool(t.name, t.description, _shuffle_keys(copy.deepcopy(t.parameters), rng))
                                       for t in req.tools))
    if layout == "trailing_space":
        return req.replace(system=req.system + " ") if rng.random() < 0.5 else req
    if layout == "personal_top":
        return req.replace(system=person + "\n" + req.system)
    if layout == "personal_end":
        return req.replace(messages=req.messages[:-1] + (Message("user", person + "\n" + turn.content, turn.images,
                                                                 turn.index),))
    return req  # stable, template_change (the template changes, not the request)


def layout_template(layout: str, i: int, n: int, base: str = "chatml") -> str:
    """The template request ``i`` of ``n`` is rendered with under ``layout``."""
    if layout == "unsorted_keys_sorted":
        return "sorted"
    if layout == "template_change" and i >= n // 2:
        return "chatml_v2"
    return base


def requests_to_workload(reqs, arrival_ms, *, tokenizer, templates, block_tokens=16, tenant=0, output_tokens=0,
                         chunk=128, name="", meta=None):
    """Render (``templates``: one name, or one per request), tokenize (memoised, exact) and hash requests."""
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    n = len(reqs)
    tpls = [templates] * n if isinstance(templates, str) else list(templates)
    cache = {t: get_template(t) for t in set(tpls)}
    memo: dict = {}
    rows = []
    for i in range(n):
        text = cache[tpls[i]].render(reqs[i], tok).text
        rows.append(encode_cached(tok, text, memo, as_array=True) if tok.cut_safe else
                    np.asarray(encode_request(reqs[i], cache[tpls[i]], tok).tokens, np.int32))
    lengths = np.asarray([len(r) for r in rows], np.int64)
    L = -(-max(int(lengths.max()), 1) // 1024) * 1024  # one padded shape for every chunk: one compile
    parts = []
    for a in range(0, n, chunk):
        pad = np.zeros((chunk, L), np.int32)
        ln = np.zeros(chunk, np.int64)
        for j, r in enumerate(rows[a:a + chunk]):
            pad[j, : len(r)] = r
            ln[j] = len(r)
        parts.append((pad, ln, min(chunk, n - a)))
    from cacheresearch.workload.table import Workload  # noqa: PLC0415

    ws = [(tokens_to_workload(p, ln, block_tokens=block_tokens), m) for p, ln, m in parts]
    keys = np.concatenate([w.keys[: w.offsets[m]] for w, m in ws])
    nb = np.concatenate([np.diff(w.offsets)[:m] for w, m in ws])
    offsets = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    return Workload(np.asarray(arrival_ms, np.int64), lengths, np.broadcast_to(np.asarray(output_tokens, np.int64),
                                                                              (n,)).copy(),
                    np.broadcast_to(np.asarray(tenant, np.int32), (n,)).copy(), keys, offsets, int(block_tokens),
                    name=name, meta=dict(meta or {}))

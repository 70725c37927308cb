"""Anthropic-style ``cache_control`` breakpoints placed on rendered content, and an advisor.

A request's content blocks (system prompt, each tool, each document, each turn: the parts of a
:class:`~cacheresearch.workload.prompt.ChatRequest`) have real token counts from a template and a
tokenizer (:func:`content_blocks`). A placement is a set of at most ``max_breakpoints`` (4) block indices;
the provider's semantics are :func:`cacheresearch.analysis.pricing.breakpoint_lookup` (the 20-block
lookback, the minimum cacheable length, writes from the hit to the last breakpoint) and its TTL replay
:class:`~cacheresearch.analysis.pricing.ProviderCache`.

:func:`expected_cost` is the closed form of one placement for a sample of requests over ``duration_s``:
for a request, the prefix through block ``b`` is shared by the requests whose content agrees through
``b``, at rate ``lambda_b`` (counted in the sample), so the entry at breakpoint ``b`` is alive with
probability ``p_b = 1 - exp(-lambda_b TTL)`` (refreshed TTL); the entries are nested (a request sharing a
longer prefix shares every shorter one, ``p`` non-increasing), so the longest live breakpoint is ``b_i``
with probability ``p_i - p_{i+1}``; each outcome is billed as :func:`breakpoint_lookup` bills it (read
through the hit, write to the last breakpoint, the rest uncached). :func:`advise` minimises it over every
placement of up to ``max_breakpoints`` eligible blocks (exhaustive: ``C(n, <=4)`` closed-form evaluations).
:func:`simulate_cost` replays the sample through :class:`ProviderCache` for a placement: the check, and
:func:`brute_force` runs it for every placement (small cases).

Baselines: ``end`` (one breakpoint on the last block: the whole prompt, which a fresh question makes
unique) and ``static_end`` (one breakpoint on the last block that every request of the prefix's group
shares: the seed's "a breakpoint at the end of the static region").
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from cacheresearch.analysis.pricing import MTOK, Pricing, ProviderCache, cacheable_tokens, preset

__all__ = ["content_blocks", "Sample", "expected_cost", "advise", "simulate_cost", "brute_force", "baselines"]


def content_blocks(req, template="chatml", tokenizer="word"):
    """``(ids, tokens)``: per content block of ``req`` (system, tools, documents, messages, in render order) a
    chained id of the content through it and the prompt's token count at its end (real tokens: template and
    tokenizer of :func:`~cacheresearch.workload.prompt.encode_request`; markup counts with the block after it)."""
    from cacheresearch.workload.prompt import encode_request  # noqa: PLC0415

    e = encode_request(req, template, tokenizer)
    order, ends = [], {}
    for i, lab in enumerate(e.labels):
        if lab[0] == "markup":
            continue
        if lab not in ends:
            order.append(lab)
        ends[lab] = i + 1
    h = hashlib.sha256()
    ids, toks = [], []
    for lab in order:
        kind, idx, _ = lab
        from cacheresearch.diff.causes import part_text  # noqa: PLC0415

        h.update(repr((kind, part_text(req, kind, idx))).encode("utf-8"))
        ids.append(h.copy().hexdigest()[:16])
        toks.append(ends[lab])
    toks[-1] = len(e.tokens)
    return ids, toks


@dataclass
class Sample:
    """Requests of one template: ``ids[i]`` / ``tokens[i]`` per content block (equal block counts), arrival
    times ``t_s``, over ``duration_s``."""

    ids: list
    tokens: np.ndarray  # [N, n_blocks] cumulative tokens at each block's end
    t_s: np.ndarray
    duration_s: float

    @classmethod
    def from_requests(cls, reqs, t_s, *, template="chatml", tokenizer="word", duration_s=None):
        """Content blocks of every request. Requests that differ only in their last message (a fresh turn)
        share the blocks before it: those are computed once (the text before the last message is the same,
        and it ends at a newline the memoised tokenization cuts at exactly), the last block's end is the
        prompt's full length."""
        from cacheresearch.workload.prompt import encode_cached, get_template, get_tokenizer  # noqa: PLC0415

        tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        tpl = get_template(template) if isinstance(template, str) else template
        static: dict = {}
        memo: dict = {}
        rows = []
        for r in reqs:
            if not (tok.cut_safe and r.messages and tpl.name in ("chatml", "chatml_v2", "sorted")):
                rows.append(content_blocks(r, template, tokenizer))
                continue
            key = (r.system, tuple(repr(t.as_dict()) for t in r.tools), r.documents,
                   tuple((m.role, m.content, m.images) for m in r.messages[:-1]), r.messages[-1].role)
            if key not in static:
                static[key] = content_blocks(r, tpl, tok)
            ids, toks = static[key]
            last = hashlib.sha256((ids[-2] if len(ids) > 1 else "").encode() + repr(r.messages[-1].content).encode())
            n = len(encode_cached(tok, tpl.render(r, tok).text, memo, as_array=True))
            rows.append((ids[:-1] + [last.hexdigest()[:16]], toks[:-1] + [n]))
        n = {len(i) for i, _ in rows}
        if len(n) != 1:
            raise ValueError(f"requests of one template need the same number of content blocks, got {sorted(n)}")
        t = np.asarray(t_s, np.float64)
        d = float(duration_s) if duration_s is not None else float(t.max() - t.min()) * len(t) / max(len(t) - 1, 1)
        return cls([i for i, _ in rows], np.asarray([k for _, k in rows], np.int64), t, d)

    @property
    def n_blocks(self) -> int:
        return self.tokens.shape[1]

    def rates(self) -> np.ndarray:
        """[N, n_blocks] rate of requests sharing request i's content through block b (itself included)."""
        out = np.zeros(self.tokens.shape)
        for b in range(self.n_blocks):
            col = [r[b] for r in self.ids]
            u, inv, cnt = np.unique(col, return_inverse=True, return_counts=True)
            out[:, b] = cnt[inv] / self.duration_s
        return out


def _bill(total, hit_tok, end_tok, p: Pricing):
    read = cacheable_tokens(hit_tok, p)
    end = np.maximum(cacheable_tokens(end_tok, p), read)
    return (total - end) + p.write_multiplier * (end - read) + p.read_multiplier * read


def expected_cost(sample: Sample, placement, pricing="anthropic_5m", rates=None) -> float:
    """Closed-form mean input cost per request (USD) of ``placement`` (module docstring)."""
    p = preset(pricing) if isinstance(pricing, str) else pricing
    lam = sample.rates() if rates is None else rates
    T = sample.tokens.astype(np.float64)
    total = T[:, -1]
    bps = [b for b in sorted(set(int(x) for x in placement))]
    elig = [b for b in bps if np.all(T[:, b] >= max(p.min_cacheable_tokens, 1))] if bps else []
    if not elig:
        return float(np.mean(total) * p.base_per_mtok / MTOK)
    last = T[:, elig[-1]]
    pr = [1.0 - np.exp(-lam[:, b] * p.ttl_s) for b in elig] + [np.zeros(len(total))]
    for i in range(len(elig) - 1, 0, -1):  # nested: a longer live prefix implies the shorter
        pr[i - 1] = np.maximum(pr[i - 1], pr[i])
    cost = (1.0 - pr[0]) * _bill(total, 0.0, last, p)
    for i, b in enumerate(elig):
        cost = cost + (pr[i] - pr[i + 1]) * _bill(total, T[:, b], last, p)
    return float(np.mean(cost) * p.base_per_mtok / MTOK)


def _placements(n, k_max):
    for k in range(1, k_max + 1):
        yield from itertools.combinations(range(n), k)


def advise(sample: Sample, pricing="anthropic_5m", *, max_breakpoints=None) -> dict:
    """The placement of least :func:`expected_cost` over every placement of up to ``max_breakpoints``
    (default the preset's, 4) blocks long enough to cache. Returns ``placement``, ``usd_per_request``."""
    p = preset(pricing) if isinstance(pricing, str) else pricing
    k = int(max_breakpoints or p.max_breakpoints or 4)
    lam = sample.rates()
    ok = [b for b in range(sample.n_blocks) if np.all(sample.tokens[:, b] >= max(p.min_cacheable_tokens, 1))]
    best, best_c = (), expected_cost(sample, (), p, lam)
    for pl in itertools.chain.from_iterable(itertools.combinations(ok, j) for j in range(1, k + 1)):
        c = expected_cost(sample, pl, p, lam)
        if c < best_c - 1e-15:
            best, best_c = pl, c
    return dict(placement=tuple(best), usd_per_request=best_c, candidates=len(ok))


def simulate_cost(sample: Sample, placement, pricing="anthropic_5m") -> float:
    """Mean input cost per request (USD) of ``placement`` replayed through :class:`ProviderCache` in arrival
    order (exact provider semantics: lookback, minimum, writes, refresh)."""
    p = preset(pricing) if isinstance(pricing, str) else pricing
    pc = ProviderCache(p)
    order = np.argsort(sample.t_s, kind="stable")
    tot = 0.0
    for i in order:
        _, _, c = pc.request(float(sample.t_s[i]), sample.ids[i], sample.tokens[i].tolist(), tuple(placement))
        tot += c
    return tot / len(order)


def brute_force(sample: Sample, pricing="anthropic_5m", *, max_breakpoints=None) -> dict:
    """Every placement of up to ``max_breakpoints`` blocks simulated; the cheapest and all costs."""
    p = preset(pricing) if isinstance(pricing, str) else pricing
    k = int(max_breakpoints or p.max_breakpoints or 4)
    costs = {(): simulate_cost(sample, (), p)}
    for pl in _placements(sample.n_blocks, k):
        costs[pl] = simulate_cost(sample, pl, p)
    best = min(costs, key=costs.get)
    return dict(placement=best, usd_per_request=costs[best], costs=costs)


def baselines(sample: Sample) -> dict:
    """``end``: the last block; ``static_end``: the last block every request shares with another request of
    its group (the end of the static region, found in the sample: the last block whose content repeats)."""
    n = sample.n_blocks
    shared = [b for b in range(n) if len({r[b] for r in sample.ids}) < len(sample.ids)]
    return dict(end=(n - 1,), static_end=(max(shared),) if shared else (n - 1,))




def design_sample(*, n_tenants=200, requests_per_day=50_000.0, duration_s=86_400.0, prefix_tokens=10_000,
                  tools_per_tenant=6, documents_per_tenant=4, shared_head=True, tokenizer="cl100k_base",
                  template="chatml", seed=0) -> Sample:
    """The design scenario as chat requests (:func:`~cacheresearch.workload.prompt.scenario.tenant_requests`)
    with a platform head (system prompt and tools) shared by every tenant, as a :class:`Sample`."""
    from cacheresearch.workload.prompt.scenario import tenant_requests  # noqa: PLC0415

    n = int(round(requests_per_day * duration_s / 86_400.0))
    reqs, arr, _, _ = tenant_requests(n_tenants=n_tenants, prefix_tokens=prefix_tokens, suffix_tokens=200,
                                      n_requests=n, duration_s=duration_s, tools_per_tenant=tools_per_tenant,
                                      documents_per_tenant=documents_per_tenant, shared_head=shared_head, seed=seed)
    return Sample.from_requests(reqs, arr / 1000.0, template=template, tokenizer=tokenizer, duration_s=duration_s)


def main(argv=None) -> int:
    """``python -m cacheresearch.analysis.breakpoints [--tenants 200] [--hours 24] [--tokenizer cl100k_base]``:
    the advisor on the design scenario beside the baselines, closed form and simulated."""
    import argparse  # noqa: PLC0415
    import json  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m cacheresearch.analysis.breakpoints")
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--requests-per-day", type=float, default=50_000.0)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--tokenizer", default="cl100k_base")
    ap.add_argument("--pricing", default="anthropic_5m")
    ap.add_argument("--no-shared-head", action="store_true")
    a = ap.parse_args(argv)
    s = design_sample(n_tenants=a.tenants, requests_per_day=a.requests_per_day, duration_s=a.hours * 3600.0,
                      tokenizer=a.tokenizer, shared_head=not a.no_shared_head)
    adv = advise(s, a.pricing)
    rows = dict(advisor=adv["placement"], **baselines(s))
    rpd = a.requests_per_day
    out = dict(blocks=s.n_blocks, block_end_tokens=s.tokens[0].tolist(), requests=len(s.ids), placements={})
    for k, pl in rows.items():
        out["placements"][k] = dict(blocks=list(pl), usd_per_day_closed_form=expected_cost(s, pl, a.pricing) * rpd,
                                    usd_per_day_simulated=simulate_cost(s, pl, a.pricing) * rpd)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

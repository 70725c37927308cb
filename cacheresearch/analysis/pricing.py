"""Provider prompt-caching economics: price presets, per-request token splits, daily costs, a TTL advisor.

Every number here is a configurable preset, never a constant buried in code (vendors change prices):
a :class:`Pricing` is a frozen dataclass; :func:`preset` returns a named one with any field replaced.
Each preset carries a ``source`` string naming the documentation it follows (as read for
``shared/reference/FACTS.md``, section "Provider prompt caching"; check the vendor's current page).

Presets
-------
``anthropic_5m``      write 1.25x, read 0.1x, TTL 5 min refreshed on every hit, up to 4 breakpoints,
                      20-block lookback, minimum 1,024 tokens; base $3 / Mtok (a Sonnet-class model)
``anthropic_1h``      the same with the 1-hour TTL: write 2x
``no_write_premium``  write 1.0x, read 0.1x, 5-minute refreshed TTL (the seed's third row)
``openai_auto``       automatic caching of prompts of 1,024+ tokens in 128-token increments, no write
                      premium, read 0.1x (recent models; 0.5x on older ones), entries cleared after
                      5-10 minutes of inactivity (modelled as a 5-minute refreshed TTL)
``gemini_explicit``   explicit cache objects: creation billed at the input price (1.0x), reads
                      discounted, a TTL you set (default 1 h, not extended by hits), storage billed per
                      token-hour; base $1.25 / Mtok (a Gemini 2.5 Pro-class model)

Money model
-----------
A request's input splits into ``uncached`` tokens (1x), ``written`` tokens (cache creation, ``w``x)
and ``read`` tokens (cache hits, ``r``x): :class:`TokenSplit`, :func:`split_tokens`,
:func:`request_cost_usd`. For one prefix of rate ``lambda`` the expected cost relative to uncached is
``h r + (1 - h) w`` (:func:`cacheresearch.analysis.analytic.cost_multiplier`) plus, for explicit caches,
storage: the entry is present a fraction ``h`` of the time (PASTA: Poisson arrivals see time
averages, for both TTL kinds), which costs ``h * storage / (base * lambda_per_hour)`` per request
(:meth:`Pricing.multiplier`).

Breakpoints (Anthropic-style, :func:`breakpoint_lookup`, :class:`ProviderCache`)
----------------------------------------------------------------------------------
A prompt is a list of content blocks; a breakpoint after block ``b`` asks the provider to cache the
prefix through ``b``. On a request, for every breakpoint the provider checks the prefix ending at
the breakpoint and at earlier block boundaries, ``lookback_blocks`` positions in all (the
breakpoint's own and the ``lookback_blocks - 1`` before it); the longest cached prefix found is
read. Then every breakpoint past the hit whose prefix has at least ``min_cacheable_tokens`` is
written; the written tokens are those from the end of the hit to the last written breakpoint; the
rest is uncached. At most ``max_breakpoints`` (4) per request. Automatic caching
(``max_breakpoints=None``, OpenAI-style) checks every boundary and writes every boundary of
sufficient length; cached lengths are rounded down to ``min + k * increment_tokens`` (1,024 + k*128).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Hashable, NamedTuple, Sequence

import numpy as np

from cacheresearch.analysis.analytic import break_even_hit_rate, cost_multiplier, ttl_hit

__all__ = [
    "Pricing",
    "PRESETS",
    "preset",
    "TokenSplit",
    "cacheable_tokens",
    "split_tokens",
    "request_cost_usd",
    "breakpoint_lookup",
    "ProviderCache",
    "daily_cost_usd",
    "daily_cost_uncached_usd",
    "Advice",
    "advise_ttl",
]

MTOK = 1_000_000.0


@dataclass(frozen=True)
class Pricing:
    """One provider's prompt-caching price model (all fields configurable)."""

    name: str
    base_per_mtok: float = 3.0  # $ per million uncached input tokens
    write_multiplier: float = 1.25  # cache write (creation) price / base
    read_multiplier: float = 0.1  # cache read (hit) price / base
    ttl_s: float = 300.0  # lifetime of an entry
    refresh_on_hit: bool = True  # hits restart the TTL clock
    min_cacheable_tokens: int = 1024  # shorter prefixes are never cached
    increment_tokens: int = 1  # cached lengths are min + k * increment (OpenAI: 128)
    max_breakpoints: int | None = 4  # None: automatic caching, no breakpoints
    lookback_blocks: int | None = 20  # positions checked per breakpoint (None: all)
    storage_per_mtok_hour: float = 0.0  # $ per million cached tokens per hour (explicit caches)
    source: str = ""

    def __post_init__(self):
        for f in ("base_per_mtok", "write_multiplier", "read_multiplier", "ttl_s", "storage_per_mtok_hour"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{self.name}: {f} must be a finite number >= 0, got {v!r}")
        if self.min_cacheable_tokens < 0 or self.increment_tokens < 1:
            raise ValueError(f"{self.name}: min_cacheable_tokens >= 0 and increment_tokens >= 1 required")
        if self.max_breakpoints is not None and self.max_breakpoints < 1:
            raise ValueError(f"{self.name}: max_breakpoints must be >= 1 or None")
        if self.lookback_blocks is not None and self.lookback_blocks < 1:
            raise ValueError(f"{self.name}: lookback_blocks must be >= 1 or None")

    def replace(self, **changes) -> "Pricing":
        return dataclasses.replace(self, **changes)

    @property
    def break_even_hit_rate(self) -> float:
        """``(w - 1) / (w - r)`` (storage not included)."""
        return float(break_even_hit_rate(self.write_multiplier, self.read_multiplier))

    def hit_rate(self, rate_per_s):
        """Poisson steady-state hit rate of a prefix requested at ``rate_per_s`` (refresh or fixed TTL)."""
        return ttl_hit(rate_per_s, self.ttl_s, self.refresh_on_hit)

    def multiplier(self, rate_per_s, hit_rate=None):
        """Expected cost of a cached prefix relative to uncached, per request.

        ``h r + (1 - h) w`` with ``h`` the steady-state hit rate (or ``hit_rate`` when given), plus the
        storage share ``h * storage / (base * requests per hour)`` for explicit caches.
        """
        rate = np.asarray(rate_per_s, dtype=np.float64)
        h = self.hit_rate(rate) if hit_rate is None else np.asarray(hit_rate, dtype=np.float64)
        m = cost_multiplier(h, self.write_multiplier, self.read_multiplier)
        if self.storage_per_mtok_hour > 0:
            per_hour = np.maximum(rate * 3600.0, 1e-300)
            m = m + h * self.storage_per_mtok_hour / (self.base_per_mtok * per_hour)
        return m


_ANTHROPIC = ("Anthropic prompt caching docs (docs.anthropic.com, build-with-claude/prompt-caching) as summarized in "
              "FACTS.md 'Provider prompt caching': cache_control breakpoints (up to 4), 20-block lookback, minimum "
              "cacheable prefix 1,024-4,096 tokens by model (1,024 here), TTL 5 min refreshed on every hit or 1 h; "
              "writes 1.25x (5 min) or 2x (1 h) base input, reads 0.1x; base $3/Mtok = a Sonnet-class input price")

PRESETS: dict[str, Pricing] = {
    "anthropic_5m": Pricing(
        "anthropic_5m", base_per_mtok=3.0, write_multiplier=1.25, read_multiplier=0.1, ttl_s=300.0,
        refresh_on_hit=True, min_cacheable_tokens=1024, max_breakpoints=4, lookback_blocks=20,
        source=_ANTHROPIC + "; 5-minute TTL",
    ),
    "anthropic_1h": Pricing(
        "anthropic_1h", base_per_mtok=3.0, write_multiplier=2.0, read_multiplier=0.1, ttl_s=3600.0,
        refresh_on_hit=True, min_cacheable_tokens=1024, max_breakpoints=4, lookback_blocks=20,
        source=_ANTHROPIC + "; 1-hour TTL",
    ),
    "no_write_premium": Pricing(
        "no_write_premium", base_per_mtok=3.0, write_multiplier=1.0, read_multiplier=0.1, ttl_s=300.0,
        refresh_on_hit=True, min_cacheable_tokens=1024, max_breakpoints=4, lookback_blocks=20,
        source="the seed's comparison row: Anthropic-style 5-minute refreshed TTL and 0.1x reads, but writes at "
               "the base price (1.0x), as OpenAI-style automatic caching bills them",
    ),
    "openai_auto": Pricing(
        "openai_auto", base_per_mtok=3.0, write_multiplier=1.0, read_multiplier=0.1, ttl_s=300.0,
        refresh_on_hit=True, min_cacheable_tokens=1024, increment_tokens=128, max_breakpoints=None,
        lookback_blocks=None,
        source="OpenAI 'Prompt Caching in the API' (openai.com/index/api-prompt-caching, 2024) and FACTS.md: "
               "automatic for prompts of 1,024+ tokens, the longest previously computed prefix in 128-token "
               "increments, caches cleared after 5-10 minutes of inactivity (always within 1 h of last use); "
               "reads 0.5x at launch, about 0.1x on recent models (0.1x here); no write premium (newest models "
               "may add one: set write_multiplier)",
    ),
    "gemini_explicit": Pricing(
        "gemini_explicit", base_per_mtok=1.25, write_multiplier=1.0, read_multiplier=0.1, ttl_s=3600.0,
        refresh_on_hit=False, min_cacheable_tokens=4096, max_breakpoints=1, lookback_blocks=1,
        storage_per_mtok_hour=4.5,
        source="Google Gemini API context caching and pricing pages (ai.google.dev/gemini-api/docs/caching, "
               "/pricing, 2025) and FACTS.md: explicit cache objects with a TTL you set (default 1 h), creation "
               "billed at the standard input price, cached reads discounted (0.1x for 2.5-series models), storage "
               "$4.50 per Mtok-hour (2.5 Pro; $1.00 for Flash), minimum 4,096 tokens (2.5 Pro; 1,024 Flash); "
               "base $1.25/Mtok = 2.5 Pro input up to 200k tokens",
    ),
}


def preset(name: str, **overrides) -> Pricing:
    """A named preset (:data:`PRESETS`), with any field replaced: ``preset("anthropic_5m", base_per_mtok=15)``."""
    try:
        p = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown pricing preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return p.replace(**overrides) if overrides else p


# ----------------------------------------------------------------------------- token splits
class TokenSplit(NamedTuple):
    """Input tokens of a request by how they are billed."""

    uncached: np.ndarray
    written: np.ndarray
    read: np.ndarray

    @property
    def total(self):
        return self.uncached + self.written + self.read


def cacheable_tokens(tokens, pricing: Pricing):
    """The longest cacheable length within ``tokens``: 0 below the minimum, else
    ``min + floor((tokens - min) / increment) * increment``."""
    t = np.asarray(tokens, dtype=np.int64)
    m, inc = int(pricing.min_cacheable_tokens), int(pricing.increment_tokens)
    q = m + ((t - m) // inc) * inc
    return np.where(t >= max(m, 1), q, 0).astype(np.int64)


def split_tokens(input_tokens, hit_tokens, prefix_tokens, pricing: Pricing) -> TokenSplit:
    """Billing split of requests whose first ``prefix_tokens`` are marked cacheable and whose first
    ``hit_tokens`` were found in the provider's cache.

    ``read`` = the hit, rounded down to a cacheable length and capped at the cacheable prefix;
    ``written`` = the rest of the cacheable prefix (it is (re)written); ``uncached`` = everything else.
    Arrays broadcast.
    """
    inp, hit, pre = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (input_tokens, hit_tokens,
                                                                              prefix_tokens)))
    if np.any(inp < 0) or np.any(hit < 0) or np.any(pre < 0):
        raise ValueError("token counts must be >= 0")
    c = cacheable_tokens(np.minimum(pre, inp), pricing)
    read = np.minimum(cacheable_tokens(hit, pricing), c)
    written = c - read
    return TokenSplit(inp - c, written, read)


def request_cost_usd(split: TokenSplit, pricing: Pricing):
    """Dollar cost of input tokens split as ``split`` (storage not included)."""
    per_tok = pricing.base_per_mtok / MTOK
    return per_tok * (np.asarray(split.uncached, np.float64) + pricing.write_multiplier * np.asarray(split.written)
                      + pricing.read_multiplier * np.asarray(split.read))


# ----------------------------------------------------------------------------- breakpoints
def _check_breakpoints(breakpoints, n_blocks, pricing):
    bps = sorted({int(b) for b in breakpoints})
    if any(b < 0 or b >= n_blocks for b in bps):
        raise ValueError(f"breakpoints must index content blocks in [0, {n_blocks}), got {list(breakpoints)}")
    if pricing.max_breakpoints is not None and len(bps) > pricing.max_breakpoints:
        raise ValueError(f"{pricing.name}: at most {pricing.max_breakpoints} breakpoints per request, got {len(bps)}")
    return bps


def breakpoint_lookup(boundary_ids: Sequence[Hashable], boundary_tokens: Sequence[int], breakpoints, cached,
                      pricing: Pricing):
    """Hit, writes and the billing split of one request (no state change; see :class:`ProviderCache`).

    ``boundary_ids[j]`` identifies the prompt prefix through content block ``j`` (e.g. a chained hash),
    ``boundary_tokens[j]`` its length in tokens (non-decreasing; the last is the prompt's length);
    ``breakpoints`` are content-block indices (at most ``max_breakpoints``; ignored for automatic
    caching, where every boundary acts as one); ``cached`` supports ``in`` (ids present now).

    Returns ``(hit_block, writes, split)``: the block index of the longest cached prefix found (-1 for
    none), the block indices to write, and a :class:`TokenSplit`.
    """
    n = len(boundary_ids)
    if len(boundary_tokens) != n or n == 0:
        raise ValueError("boundary_ids and boundary_tokens must be non-empty and of equal length")
    toks = [int(t) for t in boundary_tokens]
    if any(b > a for a, b in zip(toks[1:], toks[:-1])):
        raise ValueError("boundary_tokens must be non-decreasing")
    total = toks[-1]
    eligible = lambda j: toks[j] >= max(pricing.min_cacheable_tokens, 1)  # noqa: E731
    if pricing.max_breakpoints is None:  # automatic: every boundary is checked and written
        bps = list(range(n))
        look = n
    else:
        bps = _check_breakpoints(breakpoints, n, pricing)
        look = n if pricing.lookback_blocks is None else int(pricing.lookback_blocks)
    hit = -1
    for b in bps:
        for j in range(b, max(b - look, -1), -1):
            if j <= hit:
                break
            if eligible(j) and boundary_ids[j] in cached:
                hit = j
                break
    writes = [b for b in bps if b > hit and eligible(b)]
    hit_tok = toks[hit] if hit >= 0 else 0
    end = toks[writes[-1]] if writes else hit_tok
    read = int(cacheable_tokens(hit_tok, pricing)) if hit >= 0 else 0
    cache_end = max(int(cacheable_tokens(end, pricing)), read)
    split = TokenSplit(np.int64(total - cache_end), np.int64(cache_end - read), np.int64(read))
    return hit, writes, split


class ProviderCache:
    """A host-side replay of one provider cache (one routing domain): TTL entries keyed by prefix id.

    ``request(t_s, ids, tokens, breakpoints)`` looks up (:func:`breakpoint_lookup`), refreshes the hit
    entry when the pricing refreshes on hit, writes the new entries with expiry ``t + ttl`` and
    returns ``(hit_block, split, cost_usd)``. An entry is present while ``t <= expiry``. Storage is
    charged per entry-second present when ``storage_per_mtok_hour > 0`` (``storage_usd``).
    """

    def __init__(self, pricing: Pricing):
        self.pricing = pricing
        self.expiry: dict[Hashable, float] = {}
        self.tokens: dict[Hashable, int] = {}
        self.written_at: dict[Hashable, float] = {}
        self.storage_usd = 0.0

    def _live(self, t):
        return {k for k, e in self.expiry.items() if t <= e}

    def _charge(self, k, until):
        p = self.pricing
        if p.storage_per_mtok_hour > 0 and k in self.written_at:
            hours = max(0.0, min(until, self.expiry[k]) - self.written_at[k]) / 3600.0
            self.storage_usd += p.storage_per_mtok_hour * self.tokens[k] / MTOK * hours

    def request(self, t_s: float, boundary_ids, boundary_tokens, breakpoints=()):
        p = self.pricing
        live = self._live(t_s)
        hit, writes, split = breakpoint_lookup(boundary_ids, boundary_tokens, breakpoints, live, p)
        if hit >= 0 and p.refresh_on_hit:
            k = boundary_ids[hit]
            self._charge(k, t_s)
            self.written_at[k] = t_s
            self.expiry[k] = t_s + p.ttl_s
        for j in writes:
            k = boundary_ids[j]
            if k in self.expiry:
                self._charge(k, t_s)
            self.expiry[k] = t_s + p.ttl_s
            self.written_at[k] = t_s
            self.tokens[k] = int(cacheable_tokens(int(boundary_tokens[j]), p))
        return hit, split, float(request_cost_usd(split, p))

    def close(self, t_s: float) -> float:
        """Charge storage of every entry up to ``t_s`` (or its expiry); returns the storage total."""
        for k in list(self.expiry):
            self._charge(k, t_s)
            self.written_at[k] = min(t_s, self.expiry[k])
        return self.storage_usd


# ----------------------------------------------------------------------------- daily costs
def daily_cost_uncached_usd(requests_per_day, prefix_tokens, base_per_mtok: float = 3.0):
    """Prefix tokens sent without caching: ``requests * tokens * base / 1e6`` dollars per day."""
    return np.asarray(requests_per_day, np.float64) * np.asarray(prefix_tokens, np.float64) * base_per_mtok / MTOK


def daily_cost_usd(pricing: Pricing | None, *, n_prefixes: int, prefix_tokens: int, requests_per_day,
                   hit_rate=None):
    """Expected daily cost of the prefix tokens of ``requests_per_day`` requests spread evenly over
    ``n_prefixes`` prefixes of ``prefix_tokens`` tokens (Poisson arrivals per prefix).

    ``pricing=None`` is no caching. The cacheable part of each prefix pays :meth:`Pricing.multiplier`
    (at the steady-state hit rate, or ``hit_rate`` when given); a remainder below the minimum or the
    increment is uncached. The worked example: 200 x 10,000 tokens, 50,000 requests/day at $3/Mtok
    -> $1,500 uncached, $874 (5 min), $150 (1 h), $717 (no write premium).
    """
    req = np.asarray(requests_per_day, np.float64)
    if pricing is None:
        return daily_cost_uncached_usd(req, prefix_tokens)
    rate = req / float(n_prefixes) / 86_400.0
    c = float(cacheable_tokens(int(prefix_tokens), pricing))
    m = pricing.multiplier(rate, hit_rate)
    return req * pricing.base_per_mtok / MTOK * (c * m + (float(prefix_tokens) - c))


# ----------------------------------------------------------------------------- the TTL advisor
class Advice(NamedTuple):
    options: tuple[str, ...]  # option names ("none" = no caching)
    cost_usd_per_day: np.ndarray  # [P, O] expected daily cost of each prefix under each option
    choice: np.ndarray  # [P] index of the cheapest option per prefix
    advised_usd_per_day: float  # total with each prefix on its cheapest option
    uniform_usd_per_day: dict  # option -> total with every prefix on that option
    best_uniform: str  # the cheapest one-size-fits-all option
    saving_usd_per_day: float  # best uniform minus advised (>= 0)

    @property
    def saving_fraction(self) -> float:
        u = self.uniform_usd_per_day[self.best_uniform]
        return self.saving_usd_per_day / u if u > 0 else 0.0

    def counts(self) -> dict:
        return {o: int(np.sum(self.choice == i)) for i, o in enumerate(self.options)}


def advise_ttl(rates_per_s, prefix_tokens, options=("anthropic_5m", "anthropic_1h", "none"),
               pricings: dict | None = None) -> Advice:
    """The cheapest caching option for every prefix, from its request rate.

    ``rates_per_s`` [P] are per-prefix Poisson rates, ``prefix_tokens`` a scalar or [P]. Each option is
    a preset name, a :class:`Pricing`, or ``"none"`` (no caching, multiplier 1 at the base price of the
    first priced option). Expected daily cost of a prefix under an option:
    ``86400 * rate * tokens * base / 1e6 * multiplier(rate)`` (cacheable part; a remainder below the
    minimum is uncached). Returns the per-prefix choice and the saving over the best single option.
    """
    lam = np.asarray(rates_per_s, dtype=np.float64).reshape(-1)
    tok = np.broadcast_to(np.asarray(prefix_tokens, dtype=np.float64), lam.shape)
    pricings = dict(pricings or {})
    resolved, names = [], []
    for o in options:
        if isinstance(o, Pricing):
            resolved.append(o)
            names.append(o.name)
        elif o == "none":
            resolved.append(None)
            names.append("none")
        else:
            resolved.append(pricings.get(o) or preset(o))
            names.append(o)
    priced = [p for p in resolved if p is not None]
    base_none = priced[0].base_per_mtok if priced else 3.0
    req_day = lam * 86_400.0
    cost = np.empty((lam.size, len(resolved)))
    for j, p in enumerate(resolved):
        if p is None:
            cost[:, j] = req_day * tok * base_none / MTOK
            continue
        c = cacheable_tokens(tok.astype(np.int64), p).astype(np.float64)
        m = p.multiplier(lam)
        cost[:, j] = req_day * p.base_per_mtok / MTOK * (c * m + (tok - c))
    choice = np.argmin(cost, axis=1)
    advised = float(cost[np.arange(lam.size), choice].sum())
    uniform = {n: float(cost[:, j].sum()) for j, n in enumerate(names)}
    best = min(uniform, key=uniform.get)
    return Advice(tuple(names), cost, choice, advised, uniform, best, uniform[best] - advised)

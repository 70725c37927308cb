"""TTL advice on a trace: the cheapest caching option per shared root, checked by replaying the trace.

A *root* is the tree of requests that start with the same first block (chained keys: a shared system
prompt or a conversation's opening); a *shared* root has two or more requests. For each root and each
option (a refreshed-TTL pricing such as ``anthropic_5m`` / ``anthropic_1h``, or ``"none"``: no
caching), :func:`advise_trace` predicts the root's daily cost, picks the cheapest option per root
(the advice) and replays the trace to check it:

**Caching model** (what both the prediction and the replay bill). Every request's whole prompt is
cacheable at block boundaries (automatic caching: every block boundary is an entry, the longest
live prefix is read, everything after it is written); an entry lives ``ttl_s`` after its last use
(refresh on hit and on write). Billing is :func:`cacheresearch.analysis.pricing.split_tokens` with the
whole input as the cacheable prefix: a prompt shorter than the pricing's minimum is not cached, a hit
is read only once it reaches the minimum (and is rounded down to the increment), the rest of the
cacheable prompt is written, so ``base * (r * read + w * written + uncached) / 1e6`` dollars.
``"none"`` pays ``base * input / 1e6`` at the base price of the first priced option.

**Replay** (``simulated``). One TTL cache refreshed on hit, unbounded, one replica: the engine's numba
backend (:func:`cacheresearch.backends.numba_cache.replay_grid`, equal to the JAX engine request by request),
once per TTL. Roots share no keys and an unbounded TTL cache couples no keys, so the replay of a
*plan* (each root on its own option) is each root's requests taken from the replay of its option:
exact (``tests/test_ttl_trace.py`` checks it against a plain-Python replay with per-root TTLs).

**Prediction** (``predicted``). In a refreshed TTL cache a request reads its block ``m`` exactly when
the previous request containing that block's key came at most ``TTL`` earlier (chained keys: the
blocks before it were used then too). The prediction treats the requests of each key as a Poisson
process: given that a key occurs ``n`` times in a window of ``D`` seconds, its occurrences are
uniform order statistics, each of the ``n - 1`` inner spacings exceeds ``T`` with probability
``(1 - T / D)^n``, so each occurrence hits with probability ``q = (n - 1) / n * (1 - (1 - T / D)^n)``
(exact in expectation for a Poisson key, conditional on its count). Block ``j`` of a request is
read when the hit reaches ``max(j, j_min)`` (``j_min``: the block at which the prompt reaches the
pricing's minimum), so the expected read tokens are ``sum_j tokens_j * q(key at max(j, j_min))``
(the rounding to the increment is ignored: less than one increment per request). ``steady`` is the
long-run version (no compulsory first miss, ``q = 1 - exp(-lambda T)`` with ``lambda = n / D``): what
the advisor of :mod:`cacheresearch.analysis.pricing` assumes.

``fitted`` (the default) replaces the exponential by each root's reuse law, then blends in the
root's own reuse gaps (:func:`root_gap_cdfs`): the hit probability at ``T`` is the posterior mean
``(k F_own(T) + k0 F_law) / (k + k0)`` of a beta (Dirichlet-process) prior centred on the fitted law,
``k`` the root's reusing requests (not blocks: the blocks of one request share one predecessor).
The prior's weight ``k0`` is estimated from the trace per TTL (empirical Bayes,
:func:`prior_weight`): the method-of-moments estimate of a beta-binomial's concentration, from how
far the roots' own shares spread around the law beyond their binomial sampling spread. Roots that
differ from the law more than their few reuses explain get a small ``k0`` (their own gaps count);
roots the law explains get a large one (the law counts). A busy root is predicted from its own gaps,
a root of a few requests mostly from the law. Small roots stay noisy: a root's replay is one draw of
its few reuses, so even a predictor exact in expectation is off by that draw's spread (on the shared
Mooncake trace a median 27% at 5 minutes).

Daily figures scale the window's cost by ``86400 / D``. Plain NumPy on the host; no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cacheresearch.analysis.pricing import MTOK, Pricing, preset, request_cost_usd, split_tokens
from cacheresearch.workload import Workload

__all__ = ["TraceAdvice", "resolve_options", "root_groups", "request_option_costs", "predict_root_costs",
           "block_reuse_gaps", "root_reuse_laws", "root_gap_cdfs", "choose_reuse_scale", "law_root_shares",
           "root_gap_halves", "prior_weight", "root_cost_errors", "typical_root_costs",
           "replay_hit_tokens", "advise_trace", "cheapest", "DAY"]

DAY = 86_400.0


class TraceAdvice(NamedTuple):
    options: tuple[str, ...]  # option names; "none" = no caching
    pricings: tuple  # Pricing or None per option
    duration_s: float  # observation window D
    per_day: float  # 86400 / D
    root: np.ndarray  # int64 [N]: root of each request with blocks (roots ordered by requests, then first arrival)
    first_request: np.ndarray  # int64 [G]: index of the root's first request (in the trace as given)
    requests: np.ndarray  # int64 [G]
    input_tokens: np.ndarray  # int64 [G]: input tokens of the root's requests in the window
    trunk_blocks: np.ndarray  # int64 [G]: blocks shared by every request of the root
    predicted: np.ndarray  # float64 [G, O]: predicted $/day (finite window, the replay's conditions)
    steady: np.ndarray  # float64 [G, O]: predicted $/day in the long run (no compulsory first miss)
    simulated: np.ndarray  # float64 [G, O]: replayed $/day
    uncached: np.ndarray  # float64 [G]: $/day without caching
    choice: np.ndarray  # int64 [G]: advised option (cheapest predicted; ties go to "none")
    choice_steady: np.ndarray  # int64 [G]: cheapest steady
    oracle: np.ndarray  # int64 [G]: ex-post cheapest option (cheapest simulated)
    predicted_poisson: np.ndarray | None = None  # float64 [G, O]: the Poisson prediction (for comparison)
    reuse_laws: tuple = ()  # per root: the reuse-time law the prediction used ({"used", "family", "why", ...})
    reuse: str = "poisson"  # what ``predicted`` assumes: "fitted" (each root's reuse-time law) or "poisson"
    typical: np.ndarray | None = None  # float64 [G, O]: typical (median) $/day per root (:func:`typical_root_costs`)
    empty_requests: int = 0  # requests without blocks (input_length 0) left out: no tokens, nothing to cache

    @property
    def shared(self) -> np.ndarray:
        return self.requests >= 2

    def plan_cost(self, which: str, choice) -> float:
        """Total $/day of ``which`` (``predicted`` / ``steady`` / ``simulated``) with each root on
        option ``choice[root]``."""
        c = getattr(self, which)
        return float(c[np.arange(c.shape[0]), np.asarray(choice)].sum())


def resolve_options(options, pricings: dict | None = None, base_per_mtok: float | None = None):
    """``(names, resolved)``: each option a preset name, a :class:`Pricing` or ``"none"``.

    Refused with a message naming the option: an empty or repeated list, an unknown preset, a fixed
    TTL (``refresh_on_hit=False``: the prediction and the plan replay model refreshed TTLs) and
    storage pricing (explicit caches bill stored token-hours, which the replay does not measure).
    ``pricings`` maps names to :class:`Pricing` objects that replace the presets; ``base_per_mtok``
    replaces every priced option's base price.
    """
    opts = list(options) if options is not None else []
    if not opts:
        raise ValueError("options: give at least one option (preset names or 'none')")
    names, out = [], []
    for o in opts:
        if isinstance(o, Pricing):
            p = o
        elif o == "none":
            p = None
        elif isinstance(o, str):
            p = (pricings or {}).get(o)
            if p is None:
                try:
                    p = preset(o)
                except ValueError as e:
                    raise ValueError(f"options: {e}") from None
        else:
            raise ValueError(f"options: {o!r} is neither a preset name, a Pricing nor 'none'")
        name = "none" if p is None else (o if isinstance(o, str) else p.name)
        if name in names:
            raise ValueError(f"options: {name!r} is given twice")
        if p is not None:
            if base_per_mtok is not None:
                p = p.replace(base_per_mtok=float(base_per_mtok))
            if p.storage_per_mtok_hour > 0:
                raise ValueError(f"options: {name!r} bills storage ({p.storage_per_mtok_hour} $/Mtok-hour), which "
                                 "the trace replay does not measure; choose presets without storage pricing")
            if not p.refresh_on_hit:
                raise ValueError(f"options: {name!r} has a fixed TTL (refresh_on_hit=False); TTL advice on a trace "
                                 "models TTLs refreshed on every use only")
            if not p.ttl_s >= 0.001:
                raise ValueError(f"options: {name!r} has ttl_s={p.ttl_s}; a TTL must be at least 0.001 s (the "
                                 "replay's clock counts milliseconds)")
        names.append(name)
        out.append(p)
    return tuple(names), tuple(out)


def root_groups(w: Workload):
    """``(root [N], first_request [G])``: each request's root (its first block's key), roots numbered
    by requests (most first), ties by first arrival. Requests without blocks are refused."""
    if w.n_requests == 0:
        raise ValueError("the trace has no requests")
    empty = np.nonzero(w.n_blocks == 0)[0]
    if empty.size:
        raise ValueError(f"request {int(empty[0])} has no blocks (input_tokens 0); every request needs a first block")
    first = w.keys[w.offsets[:-1]]
    _, first_idx, inv, cnt = np.unique(first, return_index=True, return_inverse=True, return_counts=True)
    order = np.lexsort((first_idx, -cnt))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv.reshape(-1)].astype(np.int64), first_idx[order].astype(np.int64)


def _block_tokens(w: Workload):
    req = np.repeat(np.arange(w.n_requests), w.n_blocks)
    j = np.arange(w.total_blocks) - w.offsets[:-1][req]
    inp = w.input_tokens[req]
    bt = w.block_tokens
    return req, j, (np.minimum((j + 1) * bt, inp) - np.minimum(j * bt, inp)).astype(np.float64)


def _min_block(w: Workload, p: Pricing) -> np.ndarray:
    """Per request, the first block index whose end reaches the pricing's minimum (``n_blocks`` if none)."""
    m = max(int(p.min_cacheable_tokens), 1)
    bt = w.block_tokens
    jm = np.maximum(-(-m // bt) - 1, 0)  # block whose end (j + 1) * bt first reaches m
    return np.where(w.input_tokens >= m, np.minimum(jm, w.n_blocks - 1), w.n_blocks).astype(np.int64)


def request_option_costs(w: Workload, pricing: Pricing | None, read_tokens, base_none: float) -> np.ndarray:
    """Dollar cost of every request under ``pricing`` given its read (hit) tokens (``None``: no caching)."""
    inp = w.input_tokens
    if pricing is None:
        return inp.astype(np.float64) * base_none / MTOK
    rt = np.asarray(read_tokens)
    if rt.dtype.kind == "f":  # expected reads: bill linearly (split_tokens rounds integers)
        c = split_tokens(inp, 0, inp, pricing).written.astype(np.float64)  # cacheable tokens
        read = np.minimum(rt, c)
        return pricing.base_per_mtok / MTOK * ((inp - c) + pricing.write_multiplier * (c - read)
                                               + pricing.read_multiplier * read)
    return np.asarray(request_cost_usd(split_tokens(inp, rt, inp, pricing), pricing), dtype=np.float64)


def predict_root_costs(w: Workload, pricings, root, n_roots: int, duration_s: float, *, steady: bool = False,
                       base_none: float = 3.0, reuse_laws=None, own_gaps=None,
                       reuse_scale: str = "rate", prior_weights: dict | None = None, block_q: dict | None = None
                       ) -> np.ndarray:
    """``[G, O]`` predicted dollars per day per root and option (module docstring, *Prediction*).
    ``reuse_laws``: per root the CDF of its reuse times in units of each key's mean spacing ``D / n``
    (:func:`root_reuse_laws`); then an occurrence of a key seen ``n`` times hits with
    ``(n - 1) / n * F_root(TTL n / D)`` instead of the Poisson formula (whose ``F`` is exponential).
    ``own_gaps`` (:func:`root_gap_cdfs`): ``T -> (F [G], k [G])``, each root's empirical CDF of its
    reuse gaps in seconds at ``T`` and its number of reusing requests; the hit probability is then the
    posterior mean ``(k F_own(T) + k0 F_root) / (k + k0)`` of a prior centred on the fitted law that
    weighs as much as ``k0`` reusing requests: ``prior_weights[T]`` (:func:`prior_weight`), or
    ``REUSE_MIN`` for a TTL it does not name. ``block_q``: a dict that receives, per priced option index,
    the hit probability of every block (:func:`typical_root_costs` draws from them)."""
    D = float(duration_s)
    req, j, tok = _block_tokens(w)
    _, pos, cnt = np.unique(w.keys, return_inverse=True, return_counts=True)
    pos = pos.reshape(-1)
    n = cnt.astype(np.float64)
    out = np.zeros((n_roots, len(pricings)))
    key_root = np.zeros(n.size, np.int64)
    key_root[pos] = np.asarray(root)[req]
    for o, p in enumerate(pricings):
        if p is None:
            cost = request_option_costs(w, None, None, base_none)
        else:
            T = float(p.ttl_s)
            if steady:
                q_key = -np.expm1(-(n / D) * T)
            elif reuse_laws is not None:
                q_key = (n - 1.0) / n * _law_at(reuse_laws, key_root, T * n / D if reuse_scale == "rate"
                                                 else np.full(n.size, T))
                if own_gaps is not None:  # the root's own reuse gaps, weighted by its reusing requests
                    f_own, k = own_gaps(T)
                    k0 = float((prior_weights or {}).get(T, REUSE_MIN))
                    if np.isfinite(k0):  # else the law alone
                        q_key = ((n - 1.0) / n * (k * f_own)[key_root] + k0 * q_key) / (k[key_root] + k0)
            else:
                q_key = (n - 1.0) / n * (1.0 - np.clip(1.0 - T / D, 0.0, 1.0) ** n)
            jm = _min_block(w, p)
            eff = np.maximum(j, jm[req])  # the block the hit must reach for block j to be read
            ok = eff < w.n_blocks[req]
            e_idx = w.offsets[:-1][req] + np.minimum(eff, w.n_blocks[req] - 1)
            q = np.where(ok, q_key[pos[e_idx]], 0.0)
            if block_q is not None:
                block_q[o] = q
            read = np.bincount(req, weights=tok * q, minlength=w.n_requests)
            cost = request_option_costs(w, p, read, base_none)
        out[:, o] = np.bincount(root, weights=cost, minlength=n_roots)
    return out * (DAY / D)


def typical_root_costs(w: Workload, pricings, root, n_roots: int, duration_s: float, block_q: dict, *,
                       base_none: float = 3.0, draws: int = 201, seed: int = 0) -> np.ndarray:
    """``[G, O]`` the typical (median) $/day per root and option under the predicted hit probabilities.

    A request's hits are a prefix: a use of block ``j`` uses every block before it, so an earlier block is
    always used at least as recently and a TTL that keeps block ``j`` keeps them all. The read length of a
    request is therefore drawn comonotonically from its blocks' probabilities ``q_j`` (one uniform ``U``
    per request: block ``j`` is read iff ``U <= q_j``; the mean read is the expected prediction's
    ``sum tok_j q_j``), independently across requests; a root's cost is the sum over its requests, and
    its median over ``draws`` draws is the point prediction that minimises the absolute error of a
    root's cost. The expected cost (:func:`predict_root_costs`) stays the prediction for totals and for
    the advice (expected dollars); the typical one answers "what will this root cost", whose realised
    extra misses beyond the first write are a small, right-skewed count."""
    req, _, tok = _block_tokens(w)
    rng = np.random.default_rng(seed)
    out = np.zeros((n_roots, len(pricings)))
    root = np.asarray(root)
    for o, p in enumerate(pricings):
        if p is None:
            out[:, o] = np.bincount(root, weights=request_option_costs(w, None, None, base_none),
                                    minlength=n_roots)
            continue
        q = block_q[o]
        sure = np.bincount(req, weights=tok * (q >= 1.0), minlength=w.n_requests)  # read in every draw
        unc = (q > 0.0) & (q < 1.0)  # only these blocks vary between draws
        r_u, t_u, q_u = req[unc], tok[unc], q[unc]
        if r_u.size:  # consecutive blocks of a request with one probability are read or not together
            start = np.flatnonzero(np.r_[True, (r_u[1:] != r_u[:-1]) | (q_u[1:] != q_u[:-1])])
            r_u, q_u, t_u = r_u[start], q_u[start], np.add.reduceat(t_u, start)
        costs = np.empty((draws, n_roots))
        for s in range(draws):
            u = rng.random(w.n_requests)
            read = sure + np.bincount(r_u, weights=t_u * (u[r_u] < q_u), minlength=w.n_requests)
            costs[s] = np.bincount(root, weights=request_option_costs(w, p, read, base_none), minlength=n_roots)
        out[:, o] = np.median(costs, axis=0)
    return out * (DAY / float(duration_s))


REUSE_MIN = 30  # a root with fewer reusing requests takes the pooled law of all roots
REUSE_FIT_POINTS = 4000  # a law is fitted to at most this many order statistics of a root's reuse times


def block_reuse_gaps(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """``(gap_s, req)`` per block: seconds since the previous request containing its key (NaN for the
    key's first use) and the block's request."""
    req = np.repeat(np.arange(w.n_requests, dtype=np.int64), w.n_blocks)
    o = np.lexsort((req, w.keys))
    same = w.keys[o][1:] == w.keys[o][:-1]
    t = w.arrival_ms.astype(np.float64) / 1000.0
    gap = np.full(req.size, np.nan)
    if o.size:
        gap[o[1:]] = np.where(same, t[req[o][1:]] - t[req[o][:-1]], np.nan)
    return gap, req


def root_gap_cdfs(w: Workload, root, n_roots: int):
    """``T -> (F [G], k [G])``: per root the share of its blocks' reuse gaps (seconds since the previous
    request holding the key) at most ``T``, and its number of reusing requests (requests with a reused
    block): the effective sample size, since the blocks of one request share one predecessor. A
    session's blocks all see the session's gaps between requests, whatever their rate over the window,
    so seconds (not units of a key's mean spacing) are the scale of a root's own gaps."""
    gap, req = block_reuse_gaps(w)
    ok = np.isfinite(gap)
    rb = np.asarray(root)[req[ok]]
    g = gap[ok]
    tot = np.bincount(rb, minlength=n_roots).astype(np.float64)
    k = (np.bincount(np.asarray(root)[np.unique(req[ok])], minlength=n_roots).astype(np.float64)
         if ok.any() else np.zeros(n_roots))

    def at(T: float):
        return np.bincount(rb, weights=(g <= T).astype(np.float64), minlength=n_roots) / np.maximum(tot, 1.0), k

    return at


def _law_at(laws, key_root: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each key's root's reuse law (a vectorized CDF) at ``x`` (one value per key)."""
    out = np.zeros(x.size)
    order = np.argsort(key_root, kind="stable")
    bounds = np.searchsorted(key_root[order], np.arange(len(laws) + 1))
    for g, f in enumerate(laws):
        idx = order[bounds[g]: bounds[g + 1]]
        if idx.size:
            out[idx] = f(x[idx])
    return out


def _reuse_law(x: np.ndarray) -> tuple:
    """``(cdf, description)`` of reuse times ``x`` (in units of their key's mean spacing): the law
    chosen by AIC among the positive families and lognormal mixtures of up to three components (tool
    round trips beside think and idle times), fitted to evenly spaced order statistics; the empirical
    law when KS rejects it at 1% with a distance above 0.05 (the fit's rule,
    :data:`cacheresearch.fit.model.KS_MAX`)."""
    from cacheresearch.fit import laws as L  # noqa: PLC0415

    xs = np.sort(np.maximum(x, 1e-9))
    sub = xs[np.round(np.linspace(0, xs.size - 1, min(xs.size, REUSE_FIT_POINTS))).astype(np.int64)]
    cands = []
    for fit in (L.fit_positive, lambda v: L.fit_lognorm_mix(v, 3)):
        try:
            law = fit(sub)
        except (ValueError, RuntimeError, FloatingPointError):
            continue
        k = (3 * (len(law.params) // 3) - 1) if law.family == "lognorm_mix" else len(law.params)
        cands.append((2 * k - 2 * law.loglik, law))
    desc = {"n": int(xs.size)}

    def emp(v):
        return np.searchsorted(xs, v, side="right") / xs.size

    if not cands:
        return emp, dict(desc, used="empirical", why="no parametric fit")
    law = min(cands, key=lambda c: c[0])[1]
    d, p = L.ks_distance(law, sub)
    desc.update(family=law.family, ks=float(d), ks_p=float(p), params=law.to_dict()["params"])
    if p < 0.01 and d > 0.05:
        return emp, dict(desc, used="empirical", why=f"KS distance {d:.3f} > 0.05 (p {p:.2g})")
    return (lambda v: L._cdf(law, np.asarray(v, dtype=np.float64))), dict(desc, used="parametric", why="")


def root_reuse_laws(w: Workload, root, n_roots: int, duration_s: float, scale: str = "rate") -> tuple[list, list]:
    """``(cdfs, laws)``: each root's reuse-time law, the seconds between consecutive requests that contain
    one of its keys, each divided by its key's mean spacing ``D / n`` (``n`` requests hold the key in
    the window ``D``): the shape of the reuse (bursts within sessions, long idle gaps between them)
    apart from each key's rate, which stays the key's own as in the Poisson prediction (there the
    law is exponential). Roots with fewer than ``REUSE_MIN`` requests that reuse a key take the law
    pooled over all roots (fewer values than that do not fix a law's shape). ``scale="seconds"``:
    the gaps in seconds instead (a session's blocks all see its gaps between requests, whatever
    their rate over the window); evaluate those laws at ``T``, the rate laws at ``T n / D``."""
    gap, req = block_reuse_gaps(w)
    _, pos, cnt = np.unique(w.keys, return_inverse=True, return_counts=True)
    x = gap * cnt[pos.reshape(-1)] / float(duration_s) if scale == "rate" else gap
    ok = np.isfinite(x)
    r_blk = np.asarray(root)[req]
    reusing = np.bincount(np.asarray(root)[np.unique(req[ok])], minlength=n_roots) if ok.any() else np.zeros(n_roots)
    pooled = _reuse_law(x[ok]) if ok.any() else None
    cdfs, laws = [], []
    order = np.argsort(r_blk[ok], kind="stable")
    x_sorted, r_sorted = x[ok][order], r_blk[ok][order]
    bounds = np.searchsorted(r_sorted, np.arange(n_roots + 1))
    for g in range(n_roots):
        if reusing[g] >= REUSE_MIN:
            f, d = _reuse_law(x_sorted[bounds[g]: bounds[g + 1]])
        elif pooled is not None:
            f, d = pooled[0], dict(pooled[1], pooled=True, why=f"{int(reusing[g])} reusing requests (< {REUSE_MIN}): "
                                   "the pooled law of all roots")
        else:
            f, d = (lambda v: np.zeros(np.shape(v))), {"used": "none", "why": "no reuse in the trace"}
        cdfs.append(f)
        laws.append(d)
    return cdfs, laws


def choose_reuse_scale(w: Workload, root, n_roots: int, duration_s: float, ttls, own_gaps) -> tuple:
    """``(scale, cdfs, laws, misfit)``: the scale of the reuse laws (``rate``: units of each key's mean
    spacing, right for keys requested independently; ``seconds``: right for sessions) whose laws
    describe the roots' own gaps better: per TTL and root, the law's mean hit probability over the
    root's reused blocks against the root's own share of gaps at most ``T``, weighted by its reusing
    requests (``misfit``: the weighted mean absolute difference per scale). Ties keep ``rate``."""
    blocks = _reused_blocks(w, root, n_roots)
    best, misfit = None, {}
    for scale in ("rate", "seconds"):
        cdfs, laws = root_reuse_laws(w, root, n_roots, duration_s, scale)
        err = wsum = 0.0
        for T in ttls:
            f_own, k = own_gaps(float(T))
            f_law = law_root_shares(w, root, n_roots, duration_s, float(T), cdfs, scale, blocks=blocks)
            err += float(np.sum(k * np.abs(f_law - f_own)))
            wsum += float(k.sum())
        misfit[scale] = err / wsum if wsum > 0 else 0.0
        if best is None or misfit[scale] < misfit[best[0]] - 1e-12:
            best = (scale, cdfs, laws)
    return best + (misfit,)


def _reused_blocks(w: Workload, root, n_roots: int) -> tuple:
    """``(root [B'], n [B'], per-root count [G])`` of the reused blocks (a finite gap): each one's root
    and its key's number of requests, and each root's number of reused blocks (at least 1)."""
    gap, req = block_reuse_gaps(w)
    ok = np.isfinite(gap)
    _, pos, cnt = np.unique(w.keys, return_inverse=True, return_counts=True)
    rb = np.asarray(root)[req[ok]]
    return rb, cnt[pos.reshape(-1)][ok].astype(np.float64), np.maximum(np.bincount(rb, minlength=n_roots), 1)


def law_root_shares(w: Workload, root, n_roots: int, duration_s: float, T: float, cdfs, scale: str, *,
                    blocks: tuple | None = None) -> np.ndarray:
    """``[G]`` per root the law's mean probability that a reused block's gap is at most ``T`` (over the
    root's reused blocks): what the root's own share ``F_own(T)`` (:func:`root_gap_cdfs`) estimates.
    ``blocks``: :func:`_reused_blocks` of the same trace, when the caller has it."""
    rb, n_blk, nb = _reused_blocks(w, root, n_roots) if blocks is None else blocks
    x = T * n_blk / float(duration_s) if scale == "rate" else np.full(n_blk.size, float(T))
    return np.bincount(rb, weights=_law_at(cdfs, rb, x), minlength=n_roots) / nb


def root_gap_halves(w: Workload, root, n_roots: int):
    """``T -> ((F_a, k_a), (F_b, k_b))``: :func:`root_gap_cdfs` of two halves of each root's reusing
    requests (alternate ones, in arrival order), for cross-validation: each half is predicted from the
    other."""
    gap, req = block_reuse_gaps(w)
    ok = np.isfinite(gap)
    rq, g = req[ok], gap[ok]
    root = np.asarray(root)
    ureq = np.unique(rq)
    rr = root[ureq]
    o = np.lexsort((ureq, rr))
    starts = np.searchsorted(rr[o], np.arange(n_roots))
    rank = np.zeros(w.n_requests, np.int64)
    rank[ureq[o]] = np.arange(o.size) - starts[rr[o]]
    half = rank[rq] % 2
    rb = root[rq]

    def at(T: float):
        out = []
        for h in (0, 1):
            sel = half == h
            tot = np.bincount(rb[sel], minlength=n_roots).astype(np.float64)
            f = np.bincount(rb[sel], weights=(g[sel] <= T).astype(np.float64), minlength=n_roots) / np.maximum(tot, 1.0)
            k = np.bincount(root[np.unique(rq[sel])], minlength=n_roots).astype(np.float64)
            out.append((f, k))
        return tuple(out)

    return at


PRIOR_GRID = np.concatenate([np.logspace(-2, 4, 25), [np.inf]])  # candidate prior weights (reusing requests)


def prior_weight(halves, mu, use=None) -> float:
    """The prior's weight ``k0`` (in reusing requests), chosen by two-fold cross-validation on the trace:
    each half of every root's reusing requests (:func:`root_gap_halves`) is predicted by the posterior
    ``(k_a F_a + k0 mu) / (k_a + k0)`` of the other half, and ``k0`` (from :data:`PRIOR_GRID`, ``inf``:
    the law alone) minimises the squared error weighted by the held-out half's reusing requests. It
    asks how much a root's own gaps tell about its next reuses beyond the law: on roots whose few
    reuses are noise around the law it picks a large weight, on roots that differ from the law a small
    one. An in-sample check would always prefer ``k0 = 0`` (the root's replay itself). ``mu``: the law's
    share per root at ``T`` (:func:`law_root_shares`); ``use``: the roots whose law is a prior (bool
    ``[G]``: those on the law pooled over all roots; a root's own law was fitted to its own gaps). Fewer
    than two roots with reuse in both halves: ``REUSE_MIN`` (a fixed prior)."""
    (fa, ka), (fb, kb) = halves
    mu = np.asarray(mu, dtype=np.float64)
    m = (ka >= 1) & (kb >= 1) & (True if use is None else np.asarray(use, dtype=bool))
    if int(m.sum()) < 2:
        return float(REUSE_MIN)
    best, loss = float(REUSE_MIN), np.inf
    for k0 in PRIOR_GRID:
        err = 0.0
        for (f1, k1), (f2, k2) in (((fa, ka), (fb, kb)), ((fb, kb), (fa, ka))):
            pred = mu if np.isinf(k0) else (k1 * f1 + k0 * mu) / (k1 + k0)
            err += float(np.sum((k2 * (pred - f2) ** 2)[m]))
        if err < loss - 1e-15:
            best, loss = float(k0), err
    return best


def replay_hit_tokens(w: Workload, ttls_s) -> np.ndarray:
    """``[T, N]`` hit tokens of every request in one unbounded TTL cache refreshed on hit, per TTL
    (the engine's numba backend; the engine's token accounting). A trace longer than the engine's int32
    millisecond clock (12.4 days) is replayed by :func:`cacheresearch.fit.validate.ttl_hit_blocks` on
    int64 milliseconds instead, which equals the engine request by request where both run
    (``tests/test_fit_validate.py``)."""
    from cacheresearch.workload import MAX_ARRIVAL_MS  # noqa: PLC0415

    if w.n_requests and int(w.arrival_ms[-1]) > MAX_ARRIVAL_MS:
        from cacheresearch.fit.validate import ttl_hit_blocks  # noqa: PLC0415

        hb = ttl_hit_blocks(w, ttls_s)
    else:
        import jax  # noqa: PLC0415

        from cacheresearch.backends.numba_cache import replay_grid  # noqa: PLC0415
        from cacheresearch.core.params import make_params  # noqa: PLC0415

        ps = [make_params("ttl_refresh", ttl_s=float(t)) for t in ttls_s]
        m = replay_grid(w, ps, [jax.random.key(0)] * len(ps))
        hb = np.asarray(m.hit_blocks, dtype=np.int64)
    bt = w.block_tokens
    inp = w.input_tokens[None, :]
    return np.where(hb > inp // bt, inp, hb * bt)


def _trunks(w: Workload, root, first_request) -> np.ndarray:
    """Blocks every request of a root shares with the root's first request."""
    G = first_request.size
    tr = w.n_blocks[first_request].astype(np.int64).copy()
    keys, off = w.keys, w.offsets
    for i in range(w.n_requests):
        g = int(root[i])
        f = int(first_request[g])
        if i == f:
            continue
        a, b = keys[off[i]: off[i + 1]], keys[off[f]: off[f] + tr[g]]
        k = min(a.size, b.size)
        neq = np.nonzero(a[:k] != b[:k])[0]
        tr[g] = int(neq[0]) if neq.size else k
    return tr[:G]


def advise_trace(w: Workload, options=("anthropic_5m", "anthropic_1h", "none"), *, pricings: dict | None = None,
                 base_per_mtok: float | None = None, duration_s: float | None = None,
                 reuse: str = "fitted") -> TraceAdvice:
    """Predict, advise and replay (module docstring). ``duration_s`` is the observation window
    (default: the span of arrival times). ``reuse``: ``fitted`` predicts each root from its fitted
    reuse-time law (:func:`root_reuse_laws`), ``poisson`` from Poisson keys; both are returned."""
    if reuse not in ("fitted", "poisson"):
        raise ValueError(f"reuse must be fitted or poisson, got {reuse!r}")
    names, res = resolve_options(options, pricings, base_per_mtok)
    if duration_s is None:
        if w.n_requests < 2:
            raise ValueError("the trace needs at least two requests to infer its window; pass duration_s")
        D = (int(w.arrival_ms[-1]) - int(w.arrival_ms[0])) / 1000.0
        if D <= 0:
            raise ValueError("every request arrives at the same time; pass duration_s")
    else:
        D = float(duration_s)
        span = (int(w.arrival_ms[-1]) - int(w.arrival_ms[0])) / 1000.0
        if not np.isfinite(D) or D <= 0 or D < span:
            raise ValueError(f"duration_s={duration_s!r} must be positive and cover the trace's span ({span:g} s)")
    n_all = w.n_requests
    w, kept = _without_empty(w)
    root, first = root_groups(w)
    G = first.size
    priced = [p for p in res if p is not None]
    base_none = priced[0].base_per_mtok if priced else 3.0
    pois = predict_root_costs(w, res, root, G, D, base_none=base_none)
    laws = ()
    pred = pois
    typ = None
    if reuse == "fitted":
        own = root_gap_cdfs(w, root, G)
        scale, cdfs, laws, misfit = choose_reuse_scale(w, root, G, D, sorted({p.ttl_s for p in priced}), own)
        k0, blocks, halves = {}, _reused_blocks(w, root, G), root_gap_halves(w, root, G)
        pooled = np.asarray([bool(d.get("pooled")) for d in laws])
        for T in sorted({p.ttl_s for p in priced}):
            mu = law_root_shares(w, root, G, D, float(T), cdfs, scale, blocks=blocks)
            k0[float(T)] = prior_weight(halves(float(T)), mu, use=pooled)
        laws = [dict(d, scale=scale, scale_misfit=misfit, prior_weight={f"{t:g}": v for t, v in k0.items()})
                for d in laws]
        bq: dict = {}
        pred = predict_root_costs(w, res, root, G, D, base_none=base_none, reuse_laws=cdfs, own_gaps=own,
                                  reuse_scale=scale, prior_weights=k0, block_q=bq)
        typ = typical_root_costs(w, res, root, G, D, bq, base_none=base_none)
    stdy = predict_root_costs(w, res, root, G, D, steady=True, base_none=base_none)
    ttls = sorted({p.ttl_s for p in priced})
    hits = replay_hit_tokens(w, ttls) if ttls else np.zeros((0, w.n_requests), np.int64)
    sim = np.zeros((G, len(res)))
    for o, p in enumerate(res):
        ht = None if p is None else hits[ttls.index(p.ttl_s)]
        sim[:, o] = np.bincount(root, weights=request_option_costs(w, p, ht, base_none), minlength=G)
    sim *= DAY / D
    unc = np.bincount(root, weights=request_option_costs(w, None, None, base_none), minlength=G) * (DAY / D)
    return TraceAdvice(
        options=names, pricings=res, duration_s=D, per_day=DAY / D, root=root, first_request=kept[first],
        requests=np.bincount(root, minlength=G).astype(np.int64),
        input_tokens=np.bincount(root, weights=w.input_tokens, minlength=G).astype(np.int64),
        trunk_blocks=_trunks(w, root, first), predicted=pred, steady=stdy, simulated=sim, uncached=unc,
        choice=cheapest(pred, names), choice_steady=cheapest(stdy, names), oracle=cheapest(sim, names),
        predicted_poisson=pois, reuse_laws=tuple(laws), reuse=reuse, typical=typ,
        empty_requests=int(n_all - kept.size))


def _without_empty(w: Workload) -> tuple[Workload, np.ndarray]:
    """``w`` without its requests that have no blocks (``input_length`` 0: nothing to cache, no tokens to
    pay for, so every plan's cost is unchanged), and the indices of the requests kept; the window is taken
    before."""
    keep = w.n_blocks > 0
    if keep.all():
        return w, np.arange(w.n_requests, dtype=np.int64)
    if not keep.any():
        raise ValueError(f"none of the {w.n_requests} requests has a block (every input_length is 0): "
                         "there is nothing to cache")
    idx = np.nonzero(keep)[0]
    sub = Workload(arrival_ms=w.arrival_ms[idx], input_tokens=w.input_tokens[idx], output_tokens=w.output_tokens[idx],
                   tenant=w.tenant[idx], keys=w.keys, offsets=np.append(w.offsets[idx], w.offsets[-1]),
                   block_tokens=w.block_tokens, name=w.name, meta=dict(w.meta))  # the dropped hold no keys
    return sub, idx.astype(np.int64)


def cheapest(costs, names) -> np.ndarray:
    """Index of the cheapest option per row; a tie (within 1e-9 relative) goes to ``"none"`` when it
    is an option (a prompt below the minimum costs the same under every option: it is not cached),
    else to the first of the tied options."""
    c = np.asarray(costs, dtype=np.float64)
    best = np.argmin(c, axis=1)
    if "none" in names:
        o = list(names).index("none")
        lo = c[np.arange(c.shape[0]), best]
        best = np.where(c[:, o] <= lo + 1e-9 * np.maximum(np.abs(lo), 1e-300), o, best)
    return best.astype(np.int64)


def root_cost_errors(a: TraceAdvice, which: str = "predicted") -> dict:
    """Per priced option, the median and 90th percentile over shared roots of ``|predicted - replayed| /
    replayed`` (``which``: ``predicted``, ``typical`` or ``predicted_poisson``)."""
    c = getattr(a, which)
    out = {}
    for o, p in enumerate(a.pricings):
        if p is None or c is None:
            continue
        sim = a.simulated[a.shared, o]
        ok = sim > 0
        e = np.abs(c[a.shared, o][ok] - sim[ok]) / sim[ok]
        out[a.options[o]] = {"median": float(np.median(e)) if e.size else float("nan"),
                             "p90": float(np.percentile(e, 90)) if e.size else float("nan")}
    return out

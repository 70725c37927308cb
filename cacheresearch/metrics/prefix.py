"""Per-prefix economics in the sweeps' datasets: hit rate, cost multiplier and dollars per day per prefix.

The seed's design question is per prefix: which prefixes pay for their cache, and what each costs.
The routing dataset (:func:`cacheresearch.shell.sweep.to_dataset`) gets a ``prefix`` dimension from the
engine's per-request hit tokens:

* **groups.** Synthetic sources (``fleet``, ``design``, ``tenant``): one group per tenant (its
  shared prefix) when there are at most ``output.prefix_top`` tenants, else the ``prefix_top``
  busiest tenants and ``other``. Traces: the ``prefix_top`` commonest *roots* (first-block keys,
  ``root <hex key>``) and ``other``. Coordinates are the labels (``tenant 3``, ``root 1a2b...``,
  ``other``); groups are fixed per stream (labels of the first stream name the coordinates; a grid
  over workloads with other tenants' ranks keeps the first stream's ranking and marks absent groups
  with NaN).
* ``prefix_token_hit_rate``: hit tokens / input tokens of the group's requests (every input token of
  the request counts, so unique suffixes lower it).
* ``prefix_cost_multiplier``: ``h r + (1 - h) w`` with ``h`` that token hit rate, under the pricing
  preset ``output.pricing`` (:mod:`cacheresearch.analysis.pricing`); ``prefix_usd_per_day``: the
  group's input cost per day at that preset (hit tokens at the read price, missed tokens at the write
  price, scaled by 86,400 s over the workload's span of arrivals).
* ``prefix_rate_per_s``: the group's requests per second; ``prefix_tokens``: its shared prefix length
  (from the generator's parameters; NaN for traces).
* ``prefix_hit_rate_ttl_formula``: where the simulated model allows it (TTL policies with the
  ``random`` / ``round_robin`` / ``prefix_hash`` routers), the TTL formula at every block with that
  block's own rate: a block key stands for its whole prefix, so its rate ``lambda_k`` is the rate of the
  requests containing it (a tenant's document: the tenant's rate; a system prompt shared by every
  tenant: the sum of theirs), on the replica the router sends them to (``random`` / ``round_robin``:
  ``lambda_k / R`` on every replica; ``prefix_hash``: counted per replica from the engine's hash).
  Under refresh-on-hit a block is present exactly when a request containing it came within the TTL,
  and then so are its ancestors, so the expected hit blocks of a request are
  ``sum_k (1 - exp(-lambda_k TTL))`` (Poisson arrivals: exact in expectation, by PASTA); fixed TTL uses
  ``lambda TTL / (1 + lambda TTL)`` per block (an approximation: a block may outlive its parent).
  Keys seen once get rate 0. The expected hit tokens, ``min(hit blocks x block tokens, input)``, summed
  over the group's requests, over its input tokens. No capacity limit; NaN elsewhere (LRU: capacity
  couples the prefixes).

Cheap by construction: per-request hit tokens come out of the same engine call (``per_request``), and
the grouping is one ``bincount`` per cell.
"""

from __future__ import annotations

import numpy as np

from cacheresearch.analysis.analytic import prefix_hash_replicas, workload_duration_s
from cacheresearch.analysis.pricing import preset
from cacheresearch.cache.policies import policy_spec

__all__ = ["prefix_groups", "prefix_variables", "ttl_combos", "block_rates", "PREFIX_DOCS"]

_TTL_RULES = ("random", "round_robin", "prefix_hash")


def ttl_combos(cells: list[dict], rules: list[str]) -> list[tuple]:
    """The (router rule, replicas, prefix_blocks) of the grid's TTL cells the formula covers."""
    out = set()
    for c, r in zip(cells, rules):
        if policy_spec(c["policy"]).uses_ttl and r in _TTL_RULES:
            out.add((r, int(c["replicas"]), int(c["prefix_blocks"]) if r == "prefix_hash" else 0))
    return sorted(out)


def block_rates(w, rule: str, replicas: int, prefix_blocks: int = 80) -> np.ndarray:
    """float64 [total blocks]: the rate (1/s) of block ``b``'s key on the replica its request goes to
    (module docstring); 0 for keys that occur once."""
    if w.total_blocks == 0:
        return np.zeros(0)
    D = workload_duration_s(w) if w.n_requests > 1 else 1.0
    dense = w.dense_ids().astype(np.int64)
    if rule == "prefix_hash" and replicas > 1:
        rep = prefix_hash_replicas(w, replicas, prefix_blocks)
        ident = np.repeat(rep, w.n_blocks) * (int(dense.max()) + 1) + dense
        _, inv, cnt = np.unique(ident, return_inverse=True, return_counts=True)
        c = cnt[inv]
        return np.where(c > 1, c / D, 0.0)
    cnt = np.bincount(dense)
    c = cnt[dense]
    return np.where(c > 1, c / D / (1 if rule == "prefix_hash" else replicas), 0.0)

DAY = 86_400.0


def _prefix_tokens(w) -> float:
    m = w.meta
    g = m.get("generator")
    if g == "fleet_workload":
        return float(m.get("system_tokens", 0) + m.get("doc_tokens", 0)) if m.get("layout") == "stable" and \
            m.get("salt", "none") == "none" else float("nan")
    if g == "tenant_workload":
        return float(m.get("system_tokens", 0) + m.get("prefix_tokens", 0)) if m.get("layout", "stable") == "stable" \
            and m.get("salt", "none") != "per_user" else float("nan")
    if g in ("design_workload", "prefix_poisson_workload"):
        return float(m.get("shared_tokens", 0) + m.get("prefix_tokens", 0))
    return float("nan")


def prefix_groups(w, source: str, top_n: int = 8, ttl_combos=()) -> dict:
    """The grouping of one workload: ``group`` (int32 [N]), ``labels``, ``prefix_tokens`` [P]
    (NaN where unknown) and ``span_s`` (first to last arrival, at least 1 s); with ``ttl_combos``
    (:func:`ttl_combos`) also what the TTL formula needs (per-block rates, block -> request)."""
    if top_n < 1:
        raise ValueError(f"output.prefix_top must be >= 1, got {top_n}")
    n = w.n_requests
    if source == "trace":
        nb = w.n_blocks
        root = np.zeros(n, np.uint64)
        has = nb > 0
        root[has] = w.keys[w.offsets[:-1][has]]
        uniq, inv, cnt = np.unique(root, return_inverse=True, return_counts=True)
        order = np.argsort(-cnt, kind="stable")[:top_n]
        labels = [f"root {int(uniq[k]):016x}" for k in order]
        rank = np.full(uniq.shape[0], len(order), np.int64)
        rank[order] = np.arange(len(order))
        group = rank[inv]
        ptok = [float("nan")] * len(order)
    else:
        t = w.tenant.astype(np.int64)
        cnt = np.bincount(t, minlength=int(t.max(initial=0)) + 1)
        present = np.nonzero(cnt)[0]
        if present.shape[0] <= top_n:
            order = present
        else:
            order = present[np.argsort(-cnt[present], kind="stable")[:top_n]]
            order = np.sort(order)
        labels = [f"tenant {int(k)}" for k in order]
        rank = np.full(cnt.shape[0], len(order), np.int64)
        rank[order] = np.arange(len(order))
        group = rank[t]
        ptok = [_prefix_tokens(w)] * len(order)
    if np.any(group == len(labels)):
        labels.append("other")
        ptok.append(float("nan"))
    span = max((float(w.arrival_ms[-1]) - float(w.arrival_ms[0])) / 1000.0, 1.0) if n else 1.0
    out = dict(group=group.astype(np.int32), labels=labels, prefix_tokens=np.asarray(ptok, np.float64), span_s=span,
               input_tokens=np.bincount(group, weights=w.input_tokens.astype(np.float64), minlength=len(labels)),
               requests=np.bincount(group, minlength=len(labels)).astype(np.int64),
               block_tokens=int(w.block_tokens))
    if ttl_combos:
        out["rates"] = {k: block_rates(w, k[0], k[1], k[2] or 80).astype(np.float32) for k in ttl_combos}
        out["block_req"] = np.repeat(np.arange(n, dtype=np.int32), w.n_blocks)
        out["request_input"] = w.input_tokens.astype(np.int64)
    return out


PREFIX_DOCS = {
    "prefix_token_hit_rate": ("per prefix group: hit tokens / input tokens of its requests", "1"),
    "prefix_cost_multiplier": ("per prefix group: input cost relative to uncached, h r + (1 - h) w", "1"),
    "prefix_usd_per_day": ("per prefix group: input cost per day (hits at the read price, misses at the write "
                           "price)", "USD/day"),
    "prefix_rate_per_s": ("per prefix group: requests per second", "requests/s"),
    "prefix_tokens": ("per prefix group: shared prefix length (NaN: unknown)", "tokens"),
    "prefix_hit_rate_ttl_formula": ("per prefix group: token hit rate from the TTL formula with the group's own rate "
                                    "(TTL policies, load-free routers; NaN elsewhere)", "1"),
}


def _ttl_formula(cell: dict, rule: str, gr: dict):
    """Expected hit tokens per group of one TTL cell (module docstring), or None where not covered."""
    spec = policy_spec(cell["policy"])
    if not spec.uses_ttl or rule not in _TTL_RULES or "rates" not in gr:
        return None
    key = (rule, int(cell["replicas"]), int(cell["prefix_blocks"]) if rule == "prefix_hash" else 0)
    lam = gr["rates"].get(key)
    if lam is None:
        return None
    x = lam.astype(np.float64) * float(cell["ttl_s"])
    p = -np.expm1(-x) if spec.refresh_on_hit else x / (1.0 + x)
    n = gr["request_input"].shape[0]
    blocks = np.bincount(gr["block_req"], weights=p, minlength=n)
    tok = np.minimum(blocks * gr["block_tokens"], gr["request_input"])
    return np.bincount(gr["group"], weights=tok, minlength=len(gr["labels"]))


def prefix_variables(cells: list[dict], rules: list[str], hit_tokens, idx, groups: list[dict], dims: list[str],
                     shape: tuple, *, pricing: str = "anthropic_5m") -> tuple[dict, list[str], dict]:
    """Dataset variables ``{name: (dims + ["prefix"], array)}``, the prefix labels and attrs.

    ``cells``: every configuration (grid keys); ``rules``: each cell's router rule; ``hit_tokens``:
    the engine's per-request hit tokens ``[G, N_max]``; ``idx``: each cell's stream; ``groups``:
    :func:`prefix_groups` per stream.
    """
    pr = preset(pricing)
    labels = list(groups[0]["labels"])
    P = len(labels)
    G = len(cells)
    hit = np.asarray(hit_tokens)
    out = {k: np.full((G, P), np.nan) for k in PREFIX_DOCS}
    for g in range(G):
        gr = groups[int(idx[g])]
        n = gr["group"].shape[0]
        h = np.bincount(gr["group"], weights=hit[g, :n].astype(np.float64), minlength=len(gr["labels"]))
        inp = gr["input_tokens"]
        # map this stream's labels onto the coordinate labels
        pos = {lab: j for j, lab in enumerate(gr["labels"])}
        for j, lab in enumerate(labels):
            k = pos.get(lab)
            if k is None or inp[k] <= 0:
                continue
            rate = gr["requests"][k] / gr["span_s"]
            hr = h[k] / inp[k]
            out["prefix_token_hit_rate"][g, j] = hr
            out["prefix_cost_multiplier"][g, j] = hr * pr.read_multiplier + (1 - hr) * pr.write_multiplier
            out["prefix_usd_per_day"][g, j] = (pr.base_per_mtok / 1e6 * (h[k] * pr.read_multiplier
                                               + (inp[k] - h[k]) * pr.write_multiplier) * DAY / gr["span_s"])
            out["prefix_rate_per_s"][g, j] = rate
            out["prefix_tokens"][g, j] = gr["prefix_tokens"][k]
        formula = _ttl_formula(cells[g], rules[g], gr)
        if formula is not None:
            for j, lab in enumerate(labels):
                k = pos.get(lab)
                if k is not None and inp[k] > 0:
                    out["prefix_hit_rate_ttl_formula"][g, j] = formula[k] / inp[k]
    d = list(dims) + ["prefix"]
    data = {k: (d, v.reshape(tuple(shape) + (P,))) for k, v in out.items()}
    return data, labels, dict(prefix_pricing=pr.name, prefix_pricing_source=pr.source)

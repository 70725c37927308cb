"""Per-prefix economics in the sweeps' datasets: hit rate, cost multiplier and dollars per day per prefix.

The seed's design question is per prefix: which prefixes pay for their cache, and what each costs.
The routing dataset (:func:`cacheresearch.sweep.to_dataset`) gets a ``prefix`` dimension from the
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
  ``random`` / ``round_robin`` / ``prefix_hash`` routers, a tenant group with a known prefix), the
  closed form with the group's own rate (:func:`cacheresearch.analysis.analytic.ttl_fleet_hit`:
  ``1 - exp(-lambda TTL)`` refreshed, ``lambda TTL / (1 + lambda TTL)`` fixed; ``random`` splits the
  rate over the replicas) turned into a token hit rate: ``P(hit) x full prefix blocks x block tokens /
  mean input tokens``. The formula assumes Poisson arrivals per prefix and no capacity limit; NaN
  elsewhere (LRU: capacity couples the prefixes).

Cheap by construction: per-request hit tokens come out of the same engine call (``per_request``), and
the grouping is one ``bincount`` per cell.
"""

from __future__ import annotations

import numpy as np

from .analysis.analytic import ttl_fleet_hit
from .analysis.pricing import preset
from .cache.policies import policy_spec

__all__ = ["prefix_groups", "prefix_variables", "PREFIX_DOCS"]

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


def prefix_groups(w, source: str, top_n: int = 8) -> dict:
    """The grouping of one workload: ``group`` (int32 [N]), ``labels``, ``prefix_tokens`` [P]
    (NaN where unknown) and ``span_s`` (first to last arrival, at least 1 s)."""
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
    return dict(group=group.astype(np.int32), labels=labels, prefix_tokens=np.asarray(ptok, np.float64), span_s=span,
                input_tokens=np.bincount(group, weights=w.input_tokens.astype(np.float64), minlength=len(labels)),
                requests=np.bincount(group, minlength=len(labels)).astype(np.int64),
                block_tokens=int(w.block_tokens))


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
            spec = policy_spec(cells[g]["policy"])
            ptok = gr["prefix_tokens"][k]
            if spec.uses_ttl and np.isfinite(ptok) and rules[g] in ("random", "round_robin", "prefix_hash"):
                p_hit = float(ttl_fleet_hit(rate, float(cells[g]["ttl_s"]), int(cells[g]["replicas"]), rules[g],
                                            bool(spec.refresh_on_hit)))
                bt = gr["block_tokens"]
                mean_in = inp[k] / gr["requests"][k]
                out["prefix_hit_rate_ttl_formula"][g, j] = p_hit * (ptok // bt) * bt / mean_in
    d = list(dims) + ["prefix"]
    data = {k: (d, v.reshape(tuple(shape) + (P,))) for k, v in out.items()}
    return data, labels, dict(prefix_pricing=pr.name, prefix_pricing_source=pr.source)

"""Named router presets: the projects' published defaults, each with its source.

``router`` names the rule; every other key overrides a knob's default
(:data:`cacheresearch.routers.ROUTER_DEFAULTS`). A preset name can be used wherever a router name is
accepted (:func:`cacheresearch.core.params.resolve_router`).
"""

from __future__ import annotations

__all__ = ["PRESETS"]

#: Named presets: the projects' published defaults (source in ``source``). ``router`` names the rule;
#: every other key overrides :data:`ROUTER_DEFAULTS`. A preset name can be used wherever a router
#: name is accepted.
PRESETS: dict[str, dict] = {
    "sglang_cache_aware": dict(
        router="cache_aware", view="approximate", cache_threshold_pm=300, balance_abs=64, balance_rel_pct=150,
        # max_tree_size 2**26 characters (~16.7M tokens at 4 characters per token): unbounded here
        index_capacity=2**31 - 1,
        source="sgl-model-gateway src/policies/cache_aware.rs CLI defaults: cache_threshold 0.3, "
        "balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2^26",
    ),
    "sglang_cache_aware_old": dict(
        router="cache_aware", view="approximate", miss_smallest_tree=True,
        source="older sglang router: a miss goes to the smallest tree regardless of load (sglang PR 14305)",
    ),
    "llmd_precise": dict(
        router="weighted_scorers", view="precise", prefix_weight_pct=200, load_weight_pct=100, queue_threshold=128,
        source="llm-d inference scheduler sample weights prefix 2.0, load 1.0; queue threshold 128; KV events",
    ),
    "llmd_approximate": dict(
        router="weighted_scorers", view="approximate", index_capacity=31_250, prefix_weight_pct=200,
        load_weight_pct=100, queue_threshold=128,
        source="llm-d approximate prefix scorer: LRU of 31,250 block hashes per pod, from routing decisions",
    ),
    "llmd_load": dict(
        router="weighted_scorers", prefix_weight_pct=0, load_weight_pct=100, queue_threshold=128,
        source="llm-d with the load (queue) scorer only",
    ),
    "dynamo_kv": dict(
        router="kv_cost", view="precise", overlap_weight_pct=100, temperature=0.0,
        source="NVIDIA Dynamo docs/router/kv_cache_routing.md: overlap weight 1, temperature 0",
    ),
    "kubeai_chwbl": dict(
        router="chwbl", chwbl_c_pct=125, vnodes=100,
        source="KubeAI PrefixHash: consistent hashing with bounded loads, load factor 1.25",
    ),
    "preble": dict(
        router="preble_e2", view="precise", preble_rel_pct=150, preble_abs=8,
        source="Preble (arXiv 2407.00023) E2: rebalance when max load > 1.5 x min (absolute guard 8: ours)",
    ),
}

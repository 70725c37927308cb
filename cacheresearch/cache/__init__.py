"""The cache: policy names and their parameters (:mod:`.policies`), the run store with exact lazy
LRU eviction (:mod:`.store`) and the priority policies' eviction (:mod:`.priority`)."""

from cacheresearch.cache.policies import INF, POLICIES, PRIORITY_IDS, PolicySpec, is_priority, policy_spec

__all__ = ["POLICIES", "PolicySpec", "policy_spec", "is_priority", "PRIORITY_IDS", "INF"]

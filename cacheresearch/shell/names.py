"""The names the command line accepts: what the shell checks a configuration against before it imports the
engines (JAX, numba, xarray), so that a bad key, experiment, policy, router or path is refused in well under 2 s
(:mod:`cacheresearch.shell.precheck`; ``python -m cacheresearch.bench.refusals`` times it).

The policies are read from their registry (:func:`policy_names`: it imports no JAX). Each other list is a copy
of a registry (the routers' :data:`cacheresearch.routers.ROUTERS` and ``PRESETS``, the knobs
:data:`cacheresearch.engine.KNOBS`, the studies :data:`cacheresearch.studies.REGISTRY`, ...), since importing
those registries imports JAX; ``tests/test_precheck.py`` fails, naming the list to update here, when a registry
and its copy differ. Only the standard library is imported here.
"""

from __future__ import annotations

__all__ = ["policy_names", "ROUTER_NAMES", "PRESET_NAMES", "KNOB_NAMES", "STUDY_NAMES", "SCHEDULER_NAMES",
           "STEP_PRESET_NAMES", "BACKEND_NAMES", "LATENCY_PRESET_NAMES", "SALT_NAMES"]



def policy_names() -> tuple[str, ...]:
    """:data:`cacheresearch.cache.policies.POLICIES`, in registration order, read from the registry itself (it
    imports no JAX: a policy registered at run time, a plug-in, is accepted as soon as it is registered)."""
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415

    return tuple(POLICIES)


#: :data:`cacheresearch.routers.ROUTERS` (the rules)
ROUTER_NAMES = ("random", "round_robin", "prefix_hash", "least_loaded", "power_of_two", "chwbl", "cache_aware",
                "kv_cost", "weighted_scorers", "preble_e2", "gie", "least_recent")
#: :data:`cacheresearch.routers.PRESETS` (named routers: a rule and its knobs)
PRESET_NAMES = ("sglang_cache_aware", "sglang_cache_aware_old", "llmd_precise", "llmd_approximate", "llmd_load",
                "dynamo_kv", "kubeai_chwbl", "preble")
#: :data:`cacheresearch.engine.KNOBS` (router, replica-speed and policy knobs), in declaration order
KNOB_NAMES = (
    "prefix_blocks", "view", "stale_lag_ms", "instances", "local_load", "index_capacity", "vnodes", "chwbl_c_pct",
    "cache_threshold_pm", "balance_abs", "balance_rel_pct", "miss_smallest_tree", "overlap_weight_pct",
    "temperature", "prefix_weight_pct", "load_weight_pct", "queue_threshold", "preble_rel_pct", "preble_abs",
    "gie_prefix_mode", "gie_prefix_w_pct", "gie_kv_w_pct", "gie_queue_w_pct", "gie_window_blocks", "gie_load_w_pct",
    "gie_load_threshold", "gie_active_w_pct", "gie_active_timeout_ms", "gie_lru_capacity", "gie_cpu_w_pct",
    "gie_cpu_lru_capacity", "gie_cpu_tier_w_pct", "gie_nohit_w_pct", "gie_nohit_lru_size", "kv_pressure",
    "restart_replica", "restart_ms", "load_refresh_ms", "load_gauges", "client_permits", "kv_groups",
    "kv_window_groups", "kv_window", "client_timeout_ms", "counter_mode", "prefill_tps", "decode_us_per_token",
    "max_num_seqs", "max_num_batched_tokens", "step_base_ns", "step_prefill_ns", "step_decode_ns", "step_ctx_ps",
    "step_prefill_ctx_fs", "warmup_ms", "s3fifo_small_pm", "s3fifo_ghost_pm", "s3fifo_promote",
)
#: :data:`cacheresearch.studies.REGISTRY`, plus ``grid`` (the shell's own study)
STUDY_NAMES = ("grid", "economics", "ttl", "che", "ttl_advisor", "isolation", "audit", "autoscale", "disagg",
               "volatile", "events", "granularity", "capacity", "fit", "mooncake_fig9", "mooncake_fig10",
               "mooncake_table1", "ttl_trace", "llmd_benchmark", "llmd_tiered", "hosted", "layouts", "policy_curves",
               "tune", "tiers")
#: :data:`cacheresearch.core.simulate.SCHEDULERS` (``replica.scheduler``)
SCHEDULER_NAMES = ("fcfs", "vllm")
#: :data:`cacheresearch.core.params.STEP_PRESETS` (``replica.step_model``)
STEP_PRESET_NAMES = ("llama31_8b_h100_tp1", "llama31_8b_a100_tp1", "codellama34b_h100_tp1", "qwen3_32b_h100_tp2",
                     "llama33_70b_h100_tp4")
#: :data:`cacheresearch.core.run.BACKENDS` (``engine.backend``)
BACKEND_NAMES = ("auto", "jax", "numba")
#: :data:`cacheresearch.engine.LATENCY_PRESETS` (``fleet.latency``)
LATENCY_PRESET_NAMES = ("h100_8b", "h100_32b_tp2")
#: :data:`cacheresearch.workload.keys.SALT_MODES` (``workload.tenant.salt``, ``grid.salt``)
SALT_NAMES = ("none", "per_tenant", "per_user")

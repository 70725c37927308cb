"""What the router knows: its views of the replicas' caches, its instances, and the shared knobs.

``match[r]`` (blocks of the request's leading run found in the router's view of replica ``r``) and
``tree_size[r]`` come from the view ``params.view``:

``precise`` (0)       the replica's true cache at arrival (KV events, no delay);
``approximate`` (1)   instance ``u``'s own index of replica ``r``, built only from its own routing
                      decisions: every block of each request it sends to ``r`` is touched leaf-first,
                      LRU-evicted beyond ``index_capacity`` blocks (llm-d's approximate prefix index;
                      SGLang's radix tree of routed text);
``stale`` (2)         the true cache as it was at the last *sync*; a sync happens before routing
                      request ``i`` when ``i == 0`` or ``arrival - last_sync >= stale_lag_ms`` (KV events
                      delivered in batches every ``stale_lag_ms``), TTL checked at arrival against the
                      block's time as of the sync.
``gie_estimate`` (3)  GIE v0.5.1's prefix-cache-scorer index (:mod:`.gie_index`): prompt-byte block
                      hashes (the stream's ``gie_hash``), a per-pod LRU of ``gie_lru_capacity``
                      hashes fed by routing decisions; ``match[r]`` is GIE's count of hashes (not
                      blocks) and ``FleetView.match_total`` the request's hashes (vllm replica only).

``tree_size[r]`` is the index's occupancy (approximate) or the replica's true occupancy (precise,
stale). Request ``i`` is handled by router instance ``u = i mod instances``; with ``local_load`` an
instance counts only the in-flight requests it dispatched itself (instances that do not share load).

The knobs declared here are no single router's own: the view group (the prefix length, the view and
the instances, read by the engine to build what every router sees) and the replica group
(``kv_pressure``, a property of the replicas' caches, not of routing).
"""

from __future__ import annotations

from cacheresearch.routers.registry import Knob, register_knobs

__all__ = ["VIEWS", "view_id", "VIEW_KNOBS", "REPLICA_KNOBS"]

VIEWS: dict[str, int] = {"precise": 0, "approximate": 1, "stale": 2, "gie_estimate": 3}


def view_id(name: str) -> int:
    try:
        return VIEWS[name]
    except KeyError:
        raise ValueError(f"unknown router view {name!r}; choose one of {sorted(VIEWS)}") from None


VIEW_KNOBS = register_knobs(
    "view",
    Knob("prefix_blocks", 80, 1, 2**31 - 2, doc="K: the routing prefix is the first K blocks (its key is the key of "
         "block min(K, n) - 1); also the prefix-copies metric", unit="blocks"),
    Knob("view", "precise", kind="view", choices=tuple(VIEWS),
         doc="what the router knows (precise, approximate, stale)"),
    Knob("stale_lag_ms", 1000, 0, 2**31 - 2, doc="view stale: time between syncs of the router's copy", unit="ms"),
    Knob("instances", 1, 1, 2**16, doc="router instances (request i goes to instance i mod instances)"),
    Knob("local_load", False, kind="bool", doc="an instance counts only its own in-flight requests"),
    Knob("index_capacity", 2**31 - 1, 0, 2**31 - 1, doc="view approximate: blocks per (instance, replica) index",
         unit="blocks"),
)

REPLICA_KNOBS = register_knobs(
    "replica",
    # not a router knob: in-flight requests pin their blocks (vLLM never evicts blocks in use), so a
    # replica's cache keeps at most capacity - (blocks of its in-flight requests); see the engine
    Knob("kv_pressure", False, kind="bool",
         doc="in-flight requests pin their blocks: a replica's cache keeps at most capacity minus their blocks"),
    # a cache event, not a router knob: the replica restarts and its cache is flushed (docs/fleet_semantics.md)
    Knob("restart_replica", -1, -1, 2**16, doc="cache event: this replica restarts at restart_ms and its cache is "
         "flushed before the first request arriving at or after it (-1: none)"),
    Knob("restart_ms", 0, 0, 2**31 - 2, doc="cache event: time of the replica restart", unit="ms"),
    # the replicas' metrics as a scraper sees them (GIE's EPP scrapes every 50 ms), not a routing rule
    Knob("load_refresh_ms", 0, 0, 2**30, doc="the load metrics routers read (waiting requests, KV usage) are "
         "scraped every this many ms (at its multiples; GIE's default 50); 0: read live (vllm replica only)",
         unit="ms"),
    # what the pods export (vLLM V1's SchedulerStats), not a routing rule
    Knob("load_gauges", 0, 0, 1, doc="the load metrics a router reads: 0 the replica's state at the read (every "
         "request routed to it counts as waiting at once); 1 vLLM V1's gauges: num_requests_waiting and KV "
         "blocks in use as of the end of the replica's last completed engine step (make_stats in "
         "update_from_output; requests that arrive during a step join the waiting queue at the next step, "
         "so one admitted at that step is never counted; pod-wide, also under local_load; vllm replica only)"),
    # the load generator's, not the fleet's: a closed-loop client (inference-perf's worker semaphores)
    Knob("client_permits", 0, 0, 2**24, doc="the client's permits (inference-perf: num_workers x "
         "worker_max_concurrency): a request takes one in arrival order before it is sent and holds it to its "
         "last token, so with every permit held it is sent at the first whole ms after the next finish; "
         "TTFT and e2e count from the send; 0: open loop (every request sent at its arrival); vllm replica, "
         "numba backend only"),
    # the model's KV layout as vLLM's hybrid KV cache manager runs it (cacheresearch/replica/kv_layout.py
    # engine_knobs), not a routing rule: groups of one shared pool of capacity block ids
    Knob("kv_groups", 1, 1, 30, doc="KV cache groups of the model's layout (vLLM's hybrid KV cache manager: one block "
         "id per group per block of a request, all from the one pool of capacity block ids); 1 with "
         "kv_window_groups 0: one full-attention group (kv_layout.engine_knobs; vllm replica, numba backend only)"),
    Knob("kv_window_groups", 0, 0, 2**30 - 1, doc="which of the kv_groups are sliding-window groups (bit g: group g, "
         "in the layout's order); the others are full attention"),
    Knob("kv_window", 0, 0, 2**30, doc="the sliding window of the window groups (tokens, >= 2 where "
         "kv_window_groups is not 0): after each step a request's window groups free its blocks wholly before "
         "computed - kv_window + 1", unit="tokens"),
    # the load generator's: inference-perf's load.request_timeout (seconds; default none)
    Knob("client_timeout_ms", 0, 0, 2**30, doc="the client's per-request timeout (inference-perf's "
         "load.request_timeout): at send + this the client gives up (a failure, its permit returned) and vLLM aborts "
         "the request at the first step boundary at or after it (a waiting request leaves the queue, a running one "
         "frees its blocks, one in a cpu load after the load lands); latency and throughput count the successes only; "
         "0: none; vllm replica, numba backend only", unit="ms"),
    # what vLLM's metrics count, not what it does
    Knob("counter_mode", "per_attempt", kind="view", choices=("per_attempt", "per_admission"),
         doc="when vLLM counts a request in vllm:prefix_cache_queries / _hits: per_attempt at every lookup of a "
         "waiting request, the failed allocations that hold it in the queue included (vLLM before PR #48860: "
         "v0.23.0, which llm-d v0.8's llm-d-cuda image ships); per_admission once, when it is admitted (vLLM after "
         "PR #48860, merged 2026-07-16); the connector's external counters count at the admission either way; "
         "numba backend"),
)

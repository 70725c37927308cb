"""Tier specifications: what a lower KV tier is, and the checks that turn bad input into one-line errors.

A replica's cache is an ordered list of tiers (:data:`TIER_NAMES`): ``gpu`` (the engine's prefix cache,
``cache.capacity_blocks``, leaf-first LRU as today), then ``cpu`` (host memory, one per replica),
``pool`` (one store shared by every replica of the fleet, Mooncake-store-like) and ``disk`` (one per
replica). Each lower tier has a capacity in blocks (0: absent), an eviction policy (:data:`TIER_POLICIES`),
read and write bandwidth (GB/s, decimal: 1e9 bytes) and a fixed latency per access (microseconds), and a
memory bound (GiB) the capacity must fit in. A block's bytes are the model preset's KV bytes per token
(:func:`cacheresearch.replica.hardware.kv_bytes_per_token`, the whole KV of the replica: ``tp=1``) times
``cache.block_tokens``. The semantics of the tiered cache are in :mod:`cacheresearch.tiers` and
``experiments/tiers.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from cacheresearch.cache.policies import BLOCK_POLICY_IDS, POLICIES, block_policies
from cacheresearch.replica.hardware import GIB, kv_bytes_per_token

__all__ = ["why_not", "tier_spec", "TIER_NAMES", "LOWER_TIERS", "TIER_POLICIES", "OFFLOAD_MODES", "LOAD_MODES",
           "TIER_ROUTERS",
           "TIER_VIEWS", "TierSpec", "TieredConfig", "TierError", "tier_block_bytes", "make_config", "DEFAULT_TIERS"]

TIER_NAMES = ("gpu", "cpu", "pool", "disk")
LOWER_TIERS = TIER_NAMES[1:]
#: Policies a tier can run (the gpu tier and every lower tier): ``lru``, the engine's leaf-first LRU (a
#: request's touches, then evict from the LRU end down to capacity: today's gpu cache), and libCacheSim's
#: per-block policies, every one the registry holds (``fifo``, ``sieve``, ``s3fifo``, ``lfu``, ``arc``, and any
#: plug-in: :func:`tier_policies`; ``tests/reference_blocks.py``: every access, a read hit or a write, is one
#: ``get``; a miss evicts before it inserts). A tier is a keyed store with no clock of its own, so the TTL
#: policies cannot run on one, nor the priority policies (``lfu_perfect``, ``length_aware``), which need the
#: whole request's history. This tuple: the package's own.
TIER_POLICIES = ("lru", *BLOCK_POLICY_IDS)


def tier_policies() -> tuple[str, ...]:
    """The policies a tier runs now: ``lru`` and every registered per-block policy (plug-ins included)."""
    return ("lru", *block_policies())
#: What the cache-reading tier routers see: ``precise`` (every tier now), ``stale`` (every tier as of the
#: last sync, every ``stale_lag_ms``: the fleet's stale view), ``approximate`` (the router's own index of
#: what it routed, ``index_capacity`` blocks per replica, leaf-first LRU: it knows no tiers, so its match
#: counts at the gpu weight).
TIER_VIEWS = ("precise", "stale", "approximate")
#: ``evict``: a block goes down one tier when it is evicted from the tier above (a victim cache; SGLang
#: HiCache's ``write_back`` write policy); ``write_through``: every computed block is written to every
#: lower tier at once (HiCache's ``write_through``; vLLM's OffloadingConnector stores blocks "as they are
#: produced", LMCache stores after prefill); evictions then drop the block.
OFFLOAD_MODES = ("evict", "write_through")
#: ``serial``: loading the hit blocks is part of the request's service on its replica (load, then
#: prefill); ``overlap``: the load runs while the request waits, off the replica's server (vLLM's
#: asynchronous connector: the request waits in WAITING_FOR_REMOTE_KVS while the GPU serves others).
LOAD_MODES = ("serial", "overlap")
#: The routers the tiered engine runs: the load-free ones (decisions from the registered rules), the
#: queue-reading ``least_loaded``, and ``tier_scorer``: llm-d's precise prefix scorer plus its load scorer
#: (``weighted_scorers``), the match counted per tier with a weight per tier (``tier_weights_pct``);
#: ``tier_kv_cost``: NVIDIA Dynamo's KV router cost (``kv_cost`` at temperature 0: overlap weight x blocks
#: left to prefill + the replica's active blocks, lowest wins) with the overlap counted the same way;
#: ``tier_cache_aware``: SGLang's cache_aware rule (balance by queue when imbalanced, else the best match
#: above ``cache_threshold_pm``, else the least loaded) on the same match.
#: ``tier_preble``: Preble's E2 (exploit the replicas holding the longest match when its tail is shorter,
#: else explore by load + blocks left; rebalance when imbalanced) on the same match; ``chwbl``:
#: consistent hashing with bounded loads (KubeAI), which reads no cache; ``power_of_two``: the shorter queue of two
#: random replicas (the engine's ``bits[1]``, ``bits[2]``).
TIER_ROUTERS = ("random", "round_robin", "prefix_hash", "least_loaded", "tier_scorer", "tier_kv_cost",
                "tier_cache_aware", "tier_preble", "chwbl", "power_of_two")


class TierError(ValueError):
    """A tier configuration is invalid (the message names the key)."""


@dataclass(frozen=True)
class TierSpec:
    """One lower tier. ``memory_gib``: the memory it may take (per replica; the whole pool for ``pool``)."""

    name: str
    capacity_blocks: int = 0
    policy: str = "lru"
    read_gbps: float = 0.0
    write_gbps: float = 0.0
    latency_us: float = 0.0
    memory_gib: float = 0.0

    @property
    def shared(self) -> bool:
        return self.name == "pool"


#: Default lower tiers (every capacity 0: absent). Bandwidths and latencies are assumptions, labelled in
#: ``experiments/tiers.md``: cpu = PCIe Gen5 x16 host-to-device at about 50 GB/s effective (of 64 GB/s),
#: 10 us per transfer; pool = a 400 Gb/s RDMA NIC at about 40 GB/s effective, 50 us (Mooncake's transfer
#: engine reports 87 GB/s over 4 x 200 Gb/s); disk = one NVMe Gen4 drive at 6 GB/s read, 3 GB/s write,
#: 100 us. Memory bounds: 2 TiB of host DRAM per replica, a 64 TiB pool, 30 TB of disk.
DEFAULT_TIERS = {
    "cpu": dict(capacity_blocks=0, policy="lru", read_gbps=50.0, write_gbps=50.0, latency_us=10.0, memory_gib=2048.0),
    "pool": dict(capacity_blocks=0, policy="lru", read_gbps=40.0, write_gbps=40.0, latency_us=50.0,
                 memory_gib=65536.0),
    "disk": dict(capacity_blocks=0, policy="lru", read_gbps=6.0, write_gbps=3.0, latency_us=100.0,
                 memory_gib=27_940.0),
}


@dataclass(frozen=True)
class TieredConfig:
    """One configuration of the tiered fleet: the GPU tier, the lower tiers, the router, the replica speed."""

    gpu_blocks: int
    tiers: tuple = ()  # TierSpec of cpu, pool, disk (in that order)
    replicas: int = 1
    router: str = "round_robin"
    prefix_blocks: int = 80
    block_bytes: int = 1
    offload: str = "evict"
    load_mode: str = "serial"
    prefill_tps: int = 20_000
    decode_us_per_token: int = 250
    prefix_weight_pct: int = 200
    load_weight_pct: int = 100
    queue_threshold: int = 128
    overlap_weight_pct: int = 100  # tier_kv_cost (Dynamo's overlap weight x 100)
    cache_threshold_pm: int = 300  # tier_cache_aware: SGLang's defaults (match share x 1000, load balance)
    balance_abs: int = 64
    balance_rel_pct: int = 150
    preble_rel_pct: int = 150  # tier_preble: Preble's rebalance rule (max > 1.5 x min and max - min > 8)
    preble_abs: int = 8
    chwbl_c_pct: int = 125  # chwbl: KubeAI's load factor 1.25, 100 ring nodes per replica
    vnodes: int = 100
    tier_weights_pct: tuple = (100, 80, 60, 40)  # gpu, cpu, pool, disk (tier_scorer)
    gpu_policy: str = "lru"
    view: str = "precise"
    stale_lag_ms: int = 1000
    index_capacity: int = 2**31 - 1
    label: str = field(default="", compare=False)

    def tier(self, name: str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        return TierSpec(name)

    @property
    def untiered(self) -> bool:
        return all(t.capacity_blocks == 0 for t in self.tiers)

    def with_(self, **kw) -> TieredConfig:
        return replace(self, **kw)


def tier_block_bytes(model: str = "llama3_8b", block_tokens: int = 16, kv_dtype: str = "bf16") -> int:
    """Bytes of one block in a lower tier: the replica's whole KV of ``block_tokens`` tokens."""
    return int(kv_bytes_per_token(model, kv_dtype=kv_dtype, tp=1)) * int(block_tokens)


def _num(key, v, *, lo=0.0, integer=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
        raise TierError(f"{key}: must be a {'integer' if integer else 'number'} >= {lo:g}, got {v!r}")
    if integer and int(v) != v:
        raise TierError(f"{key}: must be an integer, got {v!r}")
    return int(v) if integer else float(v)


def tier_spec(name: str, given: dict | None, block_bytes: int, where: str) -> TierSpec:
    d = dict(DEFAULT_TIERS[name])
    for k, v in (given or {}).items():
        if k not in d:
            raise TierError(f"{where}{name}.{k}: unknown key; known keys are {sorted(d)}")
        d[k] = v
    key = f"{where}{name}."
    cap = _num(key + "capacity_blocks", d["capacity_blocks"], integer=True)
    pol = d["policy"]
    if pol not in tier_policies():
        raise TierError(f"{key}policy: {pol!r} cannot run on a tier ({why_not(pol)}); choose one of "
                        f"{', '.join(tier_policies())}")
    rbw = _num(key + "read_gbps", d["read_gbps"])
    wbw = _num(key + "write_gbps", d["write_gbps"])
    lat = _num(key + "latency_us", d["latency_us"])
    mem = _num(key + "memory_gib", d["memory_gib"])
    if cap > 0:
        if rbw <= 0:
            raise TierError(f"{key}read_gbps: the {name} tier holds {cap} blocks but has no read bandwidth; "
                            "give a positive GB/s")
        if wbw <= 0:
            raise TierError(f"{key}write_gbps: the {name} tier holds {cap} blocks but has no write bandwidth; "
                            "give a positive GB/s")
        need = cap * block_bytes
        if need > mem * GIB:
            raise TierError(f"{key}capacity_blocks: {cap} blocks x {block_bytes} bytes = {need / GIB:.1f} GiB "
                            f"exceeds {key}memory_gib = {mem:g} GiB")
        if round(rbw * 1000) < 1 or round(wbw * 1000) < 1:
            raise TierError(f"{key}read_gbps: bandwidths below 0.001 GB/s are not modelled")
    return TierSpec(name, cap, pol, rbw, wbw, lat, mem)


#: fleet routers and their tiered twins (the same rule on the tier-weighted match)
_TIER_TWIN = {"weighted_scorers": "tier_scorer", "kv_cost": "tier_kv_cost", "cache_aware": "tier_cache_aware",
              "preble_e2": "tier_preble"}


def why_not(policy: str) -> str:
    """Why a registered policy cannot run on a tier, in words."""
    if policy in ("ttl_refresh", "ttl_fixed"):
        return "a TTL needs a clock; a tier is a keyed store with a capacity and no clock"
    if policy == "unbounded":
        return "a tier has a capacity in blocks; give it a large capacity_blocks instead"
    if policy == "lru_plain":
        return "it touches a request's blocks in prompt order; a tier's lru is the engine's leaf-first lru"
    if policy in ("lfu_perfect", "length_aware", "s3fifo_sosp"):
        return "it ranks a request's runs by their history in the engine's run store, which a tier does not keep"
    if policy in POLICIES:
        return f"its rule family {POLICIES[policy].engine!r} keeps no per-block kernel a tier could run"
    return "not a registered policy"


def make_config(*, gpu_blocks: int, tiers: dict | None = None, replicas: int = 1, router: str = "round_robin",
                block_bytes: int | None = None, model: str = "llama3_8b", block_tokens: int = 16,
                kv_dtype: str = "bf16", where: str = "tiers.", **kw) -> TieredConfig:
    """A checked :class:`TieredConfig`. ``tiers``: ``{cpu: {...}, pool: {...}, disk: {...}}`` over
    :data:`DEFAULT_TIERS`; ``block_bytes`` defaults to :func:`tier_block_bytes` of ``model``.
    ``where``: the key prefix the errors name."""
    tiers = dict(tiers or {})
    for k in tiers:
        if k not in LOWER_TIERS:
            raise TierError(f"{where}{k}: unknown tier; the lower tiers are {', '.join(LOWER_TIERS)}")
    bb = tier_block_bytes(model, block_tokens, kv_dtype) if block_bytes is None else int(block_bytes)
    if bb < 1:
        raise TierError(f"{where}block_bytes: must be >= 1, got {block_bytes!r}")
    specs = tuple(tier_spec(n, tiers.get(n), bb, where) for n in LOWER_TIERS)
    gpu = _num("cache.capacity_blocks", gpu_blocks, integer=True)
    if router not in TIER_ROUTERS:
        tiered = _TIER_TWIN.get(router)
        if tiered:
            raise TierError(f"router: {router!r} reads one cache; the tiered engine runs it as {tiered!r}, which "
                            "counts the match in every tier (tier_weights_pct)")
        raise TierError(f"router: {router!r} is not run by the tiered engine; choose one of {', '.join(TIER_ROUTERS)}")
    if int(replicas) < 1:
        raise TierError(f"replicas: must be >= 1, got {replicas!r}")
    gp = kw.get("gpu_policy", "lru")
    if gp not in tier_policies():
        raise TierError(f"{where}gpu.policy: {gp!r} cannot run on a tier ({why_not(gp)}); choose one of "
                        f"{', '.join(tier_policies())}")
    vw = kw.get("view", "precise")
    if vw not in TIER_VIEWS:
        raise TierError(f"{where}view: {vw!r}; choose one of {', '.join(TIER_VIEWS)}")
    for k in ("stale_lag_ms", "index_capacity"):
        if k in kw:
            kw[k] = _num(f"{where}{k}", kw[k], integer=True)
    off = kw.get("offload", "evict")
    if off not in OFFLOAD_MODES:
        raise TierError(f"{where}offload: {off!r}; choose one of {', '.join(OFFLOAD_MODES)}")
    lm = kw.get("load_mode", "serial")
    if lm not in LOAD_MODES:
        raise TierError(f"{where}load_mode: {lm!r}; choose one of {', '.join(LOAD_MODES)}")
    if "chwbl_c_pct" in kw:
        kw["chwbl_c_pct"] = _num("chwbl_c_pct", kw["chwbl_c_pct"], lo=100, integer=True)
    if "vnodes" in kw:
        kw["vnodes"] = _num("vnodes", kw["vnodes"], lo=1, integer=True)
    tw = tuple(kw.pop("tier_weights_pct", (100, 80, 60, 40)))
    if len(tw) != 4 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in tw):
        raise TierError(f"{where}tier_weights_pct: four non-negative integers (gpu, cpu, pool, disk), got {tw!r}")
    for k in ("prefill_tps", "prefix_blocks", "queue_threshold"):
        if k in kw:
            kw[k] = _num(k, kw[k], lo=1, integer=True)
    for k in ("decode_us_per_token", "prefix_weight_pct", "load_weight_pct", "overlap_weight_pct",
              "cache_threshold_pm", "balance_abs", "balance_rel_pct", "preble_rel_pct", "preble_abs"):
        if k in kw:
            kw[k] = _num(k, kw[k], integer=True)
    return TieredConfig(gpu_blocks=gpu, tiers=specs, replicas=int(replicas), router=router, block_bytes=bb,
                        tier_weights_pct=tw, **kw)

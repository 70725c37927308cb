"""The sweep's typed configuration schema (Hydra structured configs): every key a config or the command line may
set, with its default. ``configs/config.yaml`` composes it (``sweep_schema``) under the config groups and the
experiment; the shell (:mod:`cacheresearch.shell.sweep`) validates the values against the core's declarations."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from cacheresearch.shell.names import KNOB_NAMES

#: ``configs/`` at the repository root (the package is installed editable).
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

#: Keys the grid knows, in the order their dimensions appear in the output (seed last).
#: Router and replica-speed knobs (:data:`cacheresearch.engine.KNOBS`, declared in the routers' registry
#: and :mod:`cacheresearch.core.params`; their names copied in :mod:`cacheresearch.shell.names`, so that the
#: schema imports no engine) may be grid keys too; ``prefix_blocks`` is ``fleet.prefix_blocks``.
KNOB_KEYS = tuple(k for k in KNOB_NAMES if k != "prefix_blocks")
#: Workload keys of the ``tenant`` source that may be grid keys (each value is its own stream).
TENANT_GRID_KEYS = ("rate_per_s", "hot_share", "arrival", "salt")
GRID_KEYS = (("policy", "capacity_blocks", "cpu_capacity_blocks", "ttl_s", "replicas", "router", "prefix_blocks")
             + KNOB_KEYS + TENANT_GRID_KEYS + ("layout", "seed"))
#: Grid keys of studies that lay out their own grid (experiment=tiers: cpu_gbps; experiment=disagg: pd, link_gbps);
#: the grid study refuses them.
STUDY_GRID_KEYS = ("cpu_gbps", "pd", "link_gbps")
LAYOUTS = ("stable", "timestamp_top")
SOURCES = ("fleet", "design", "trace", "tenant", "fitted")
ARRIVALS = ("poisson", "bursty", "diurnal")


class SweepError(ValueError):
    """A sweep configuration or its input is invalid (the message says which key and why)."""


# ------------------------------------------------------------------------------ schema
@dataclass
class TraceConf:
    path: Optional[str] = None  # Mooncake or Bailian JSONL, relative to the directory the command runs in
    format: str = "auto"  # mooncake | bailian | auto (detected from the first line)
    block_tokens: Optional[int] = None  # tokens per hash id (null: inferred from a Mooncake trace; 16 Bailian)
    max_requests: Optional[int] = None
    sort: bool = False  # order the requests by timestamp (Mooncake); else a decreasing timestamp is an error


@dataclass
class FleetWorkloadConf:
    """Arguments of :func:`cacheresearch.workload.synthetic.fleet_workload` (``seed`` comes from ``seed``/``seeds``)."""

    n_tenants: int = 8
    system_tokens: int = 1200
    doc_tokens: int = 800
    user_tokens: int = 60
    n_requests: int = 2000
    block_tokens: int = 16
    tenant_law: str = "uniform"
    zipf_s: float = 1.0
    layout: str = "stable"
    rate_per_s: Optional[float] = None
    output_tokens: int = 0
    vocab_size: int = 128_256


@dataclass
class DesignWorkloadConf:
    """Arguments of :func:`cacheresearch.workload.synthetic.design_workload` (``seed``: from ``seed``/``seeds``)."""

    n_tenants: int = 200
    prefix_tokens: int = 10_000
    suffix_tokens: int = 200
    n_requests: int = 50_000
    duration_s: float = 86_400.0
    rate_per_s: Optional[float] = None
    hot_share: float = 0.0
    tenant_law: str = "uniform"
    zipf_s: float = 1.0
    block_tokens: int = 16
    output_tokens: int = 0
    vocab_size: int = 128_256


@dataclass
class TenantWorkloadConf:
    """Arguments of :func:`cacheresearch.workload.synthetic.tenant_workload` (``seed`` from ``seed``/``seeds``;
    ``rate_per_s``, ``hot_share``, ``arrival`` may be grid keys). ``layout: timestamp_top`` gives every
    request a unique first block (a timestamp at the top of the prompt): every key changes."""

    n_tenants: int = 200
    prefix_tokens: int = 10_000
    users_per_tenant: int = 1
    user_tokens: int = 0
    query_tokens: int = 200
    rate_per_s: float = 50_000 / 86_400
    duration_s: float = 86_400.0
    # if set: duration_s = n_requests / rate_per_s (same expected count per load level)
    n_requests: Optional[int] = None
    arrival: str = "poisson"
    tenant_law: str = "uniform"
    zipf_s: float = 1.0
    hot_share: float = 0.0
    burst_ratio: float = 10.0
    burst_high_share: float = 0.1
    burst_mean_high_s: float = 60.0
    diurnal_amplitude: float = 0.8
    diurnal_period_s: float = 86_400.0
    block_tokens: int = 16
    output_tokens: int = 0
    vocab_size: int = 128_256
    layout: str = "stable"
    system_tokens: int = 0  # a system prompt shared by every tenant, before each tenant's prefix
    salt: str = "none"  # cache salt: none | per_tenant | per_user (vLLM cache_salt; a grid key too)


@dataclass
class FittedWorkloadConf:
    """A model fitted by ``experiment=fit`` (cacheresearch.fit): ``path`` to its ``results.nc`` or a
    YAML / JSON model; whole sessions are sampled with the run's ``seed`` over ``duration_s`` (null:
    the fitted trace's window)."""

    path: Optional[str] = None
    duration_s: Optional[float] = None


@dataclass
class WorkloadConf:
    source: str = "fleet"  # fleet | design | trace | tenant | fitted
    fleet: FleetWorkloadConf = field(default_factory=FleetWorkloadConf)
    design: DesignWorkloadConf = field(default_factory=DesignWorkloadConf)
    tenant: TenantWorkloadConf = field(default_factory=TenantWorkloadConf)
    fitted: FittedWorkloadConf = field(default_factory=FittedWorkloadConf)


#: ``fleet.knobs``: the base value of every router / speed knob (null = the declared default or the preset's).
KnobsConf = make_dataclass(
    "KnobsConf", [(k, Any, field(default=None)) for k in KNOB_KEYS],
    namespace={"__module__": __name__, "__doc__": "Base values of the router and replica-speed knobs (null: default)."},
)


@dataclass
class FleetConf:
    router: str = "round_robin"  # a rule, a preset of cacheresearch.routers.PRESETS, or a name under ``variants``
    replicas: int = 1
    prefix_blocks: int = 80
    max_replicas: Optional[int] = None  # static bound; default: the largest replica count in the grid
    latency: str = "h100_8b"  # replica speed preset (cacheresearch.engine.LATENCY_PRESETS)
    knobs: KnobsConf = field(default_factory=KnobsConf)  # base values of router / speed knobs (KNOB_KEYS)
    # named router variants: {name: {router: RULE_OR_PRESET, KNOB: value, ...}}; usable as router names
    variants: Any = field(default_factory=dict)


@dataclass
class CacheConf:
    policy: str = "lru"
    capacity_blocks: Optional[int] = None  # blocks per replica (LRU policies)
    ttl_s: Optional[float] = None  # seconds (TTL policies)
    block_tokens: Optional[int] = None  # vLLM's block size (experiment=llmd_benchmark; grids take the workload's)


@dataclass
class ReplicaConf:
    """How a replica serves and how much KV it holds.

    ``scheduler``: ``fcfs`` (one server per replica, prefill at a rate) or ``vllm`` (continuous batching
    with one KV pool for cached and running blocks). ``gpu`` / ``model`` / ``kv_dtype`` / ``tp`` /
    ``gpu_memory_utilization`` give the KV capacity from hardware in place of ``cache.capacity_blocks``;
    ``hybrid_manager`` (models with sliding-window layers only): vLLM's hybrid KV cache manager on (its default)
    or off (a KV connector that is not ``SupportsHMA``: every layer holds every block, half the blocks for
    gpt-oss; :func:`cacheresearch.replica.hardware.kv_blocks`).
    """

    scheduler: str = "fcfs"
    step_model: Optional[str] = None  # step-time preset of the vllm scheduler (null: the default preset)
    gpu: Optional[str] = None
    model: Optional[str] = None
    kv_dtype: str = "bf16"
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    hybrid_manager: bool = True


@dataclass
class EngineConf:
    chunk_runs: Optional[int] = None  # runs per scan step (None: chosen from the stream; speed only)
    max_batch: Optional[int] = None  # configurations per compiled call (None: as many as fit in memory)
    # per-replica prefix matches (cache routers, overflow_share, prefix_copies); None: auto
    match: Optional[bool] = None
    queue_slots: int = 256  # in-flight requests tracked per replica (overflow is reported)
    backend: str = "auto"  # auto | jax | numba (core/run.py BACKENDS: auto = numba where it covers, on a CPU host)
    # JAX's persistent compilation cache for the command line: auto = $XDG_CACHE_HOME/cacheresearch/jax
    # (~/.cache/...), a directory, or none; a JAX_COMPILATION_CACHE_DIR in the environment wins
    compile_cache: Optional[str] = "auto"


@dataclass
class TierConf:
    """One lower tier (:data:`cacheresearch.tiers.spec.DEFAULT_TIERS`: null takes the tier's default)."""

    capacity_blocks: int = 0  # blocks per replica (pool: for the fleet); 0: absent
    policy: str = "lru"
    read_gbps: Optional[float] = None
    write_gbps: Optional[float] = None
    latency_us: Optional[float] = None
    memory_gib: Optional[float] = None


@dataclass
class TiersConf:
    """KV tiers behind every replica's gpu cache (:mod:`cacheresearch.tiers`; experiments/tiers.md). With a
    tier present (``tiers.cpu.capacity_blocks`` or ``grid.cpu_capacity_blocks`` > 0, or a pool or disk) a cell
    runs on the tiered engine; the results gain ``hit_rate_by_tier``."""

    cpu: TierConf = field(default_factory=TierConf)
    pool: TierConf = field(default_factory=TierConf)
    disk: TierConf = field(default_factory=TierConf)
    offload: str = "evict"  # evict | write_through
    load_mode: str = "serial"  # serial | overlap
    tier_weights_pct: Any = field(default_factory=lambda: [100, 80, 60, 40])  # gpu, cpu, pool, disk
    model: str = "llama3_8b"  # a block's bytes: the model preset's KV bytes per token x the workload's block tokens
    kv_dtype: str = "bf16"


@dataclass
class LaunchConf:
    """Chunks, resume, parts and progress (:mod:`cacheresearch.shell.chunks`; README, "Scaling out")."""

    chunks: bool = True  # write each chunk to DIR/chunks as it finishes and resume from them (command line)
    resume: str = "auto"  # auto: skip finished chunks, refuse a changed config; fresh: discard old chunks
    part: int = 0  # with parts > 1: run only this slice of the grid (a multirun over launch.part=0,1,...)
    parts: int = 1
    dir: Optional[str] = None  # directory of chunks/ and results.nc (default: the run dir; parts > 1: the sweep dir)
    devices: Optional[int] = None  # local devices the configurations are sharded over (null: all)
    progress: Optional[bool] = None  # on stderr; null: a bar on a terminal, else a line per chunk (10 s at most)


#: Every known grid key is a field (null = not swept), so ``grid.policy=[...]`` needs no ``+``. The knob
#: fields come from the declarations (:data:`KNOB_KEYS`), never from a list kept here.
GridConf = make_dataclass(
    "GridConf", [(k, Any, field(default=None)) for k in GRID_KEYS + STUDY_GRID_KEYS],
    namespace={"__module__": __name__, "__doc__": "Every known grid key (null = not swept)."},
)


@dataclass
class OutputConf:
    variable: str = "token_hit_rate"  # the variable of the summary table and the figure
    figure: bool = True
    prefix_top: int = 8  # per-prefix variables: tenants (or trace roots) kept as their own prefix group
    pricing: str = "anthropic_5m"  # the pricing preset of the per-prefix cost columns


@dataclass
class SweepConfig:
    name: str = "sweep"
    description: str = ""
    kind: str = "grid"  # "grid" (this module's product grid) or a study of cacheresearch.studies (economics, ttl, ...)
    study: Any = None  # free-form settings of the study named by ``kind``
    workload: WorkloadConf = field(default_factory=WorkloadConf)
    trace: TraceConf = field(default_factory=TraceConf)
    fleet: FleetConf = field(default_factory=FleetConf)
    cache: CacheConf = field(default_factory=CacheConf)
    replica: ReplicaConf = field(default_factory=ReplicaConf)
    engine: EngineConf = field(default_factory=EngineConf)
    launch: LaunchConf = field(default_factory=LaunchConf)
    tiers: TiersConf = field(default_factory=TiersConf)
    seed: int = 0
    seeds: int = 1
    grid: GridConf = field(default_factory=GridConf)
    output: OutputConf = field(default_factory=OutputConf)
    report: Any = None  # {source, published: [{label, select, <var>}], compare: [{dim, baseline, variant}]}
    llmd_tiered: Any = None  # experiment=llmd_tiered: run, overhead_ms, cpu_read_gbps, load_mode, ...
    llmd: Any = None  # experiment=llmd_benchmark: inference_perf, epp {ARM: FILE}, warmup_stages, ...
    tune: Any = None  # experiment=tune: knobs, objective, slo, method, population, generations, ...


ConfigStore.instance().store(name="sweep_schema", node=SweepConfig)

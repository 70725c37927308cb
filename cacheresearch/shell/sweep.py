"""Parameter sweeps from the command line: the thin Hydra shell around the engine.

Usage (from the repository root)::

    python -m cacheresearch.sweep                                   # the default: experiment=routing (the main job)
    python -m cacheresearch.sweep experiment=replay trace.path=FILE trace.block_tokens=512 \\
        'grid.policy=[lru,lru_plain,unbounded]' 'grid.capacity_blocks=[1000,10000,30000]' \\
        'grid.replicas=[1,2,4,8]' fleet.router=round_robin hydra.run.dir=OUT

Configuration (``configs/config.yaml``, ``configs/experiment/*.yaml``; the schema is
:class:`SweepConfig`, registered in Hydra's ConfigStore as ``sweep_schema``):

``workload.source``   ``fleet`` (:func:`~cacheresearch.workload.synthetic.fleet_workload`, arguments under
                      ``workload.fleet``), ``design`` (:func:`~cacheresearch.workload.synthetic.design_workload`,
                      ``workload.design``), ``tenant`` (:func:`~cacheresearch.workload.synthetic.tenant_workload`,
                      ``workload.tenant``; ``n_requests`` sets the duration per load level; ``layout:
                      timestamp_top`` re-keys every request), ``trace`` (a Mooncake or Bailian JSONL
                      file: ``trace.path``, ``trace.format`` (auto / mooncake / bailian),
                      ``trace.block_tokens``, ``trace.max_requests``) or ``fitted`` (whole sessions sampled
                      from a model fitted by ``experiment=fit``: ``workload.fitted.path``, ``.duration_s``)
``fleet``             ``router`` (a rule, a preset of :data:`cacheresearch.routers.PRESETS` or a name under
                      ``fleet.variants``), ``replicas``, ``prefix_blocks``, ``max_replicas`` (default: the
                      largest replica count of the grid), ``latency`` (replica speed preset), ``knobs``
                      (base values of router and speed knobs), ``variants`` (named router variants:
                      ``{name: {router: ..., KNOB: value}}``). The knob keys, their types and ranges
                      come from the knob declarations (the routers' registry, ``docs/routers.md``)
``cache``             ``policy``, ``capacity_blocks``, ``ttl_s``
``engine``            ``chunk_runs`` (runs per scan step; default chosen per stream); ``max_batch``
                      (configurations per compiled call, i.e. per chunk; default as many as fit in memory);
                      ``backend`` (``auto``: per program the numba CPU backend where it covers the
                      configurations, on a CPU host, else the JAX engine; ``jax``; ``numba``: refuses what
                      it does not cover); every backend gives the same results
``launch``            chunks and launchers (:mod:`cacheresearch.shell.chunks`, README "Scaling out"): ``chunks``
                      (chunk files and resume, on), ``resume`` (``auto`` | ``fresh``), ``part`` / ``parts``
                      (one slice of the grid, for a multirun over ``launch.part``), ``dir``, ``devices``,
                      ``progress`` (on stderr; null: a bar on a terminal, else a line per chunk)
``seed``, ``seeds``   first seed and number of seeds (``seeds > 1`` adds a ``seed`` dimension)
``grid``              ``policy``, ``capacity_blocks``, ``ttl_s``, ``replicas``, ``router``,
                      ``prefix_blocks``, every router / speed knob (``view``, ``instances``, ``prefill_tps``,
                      ...), the tenant workload's ``rate_per_s``, ``hot_share``, ``arrival``, and
                      ``layout``, ``seed``: a list makes the key an output dimension
                      (coordinates as given); a scalar overrides the base value; null keeps the base
``report``            free-form: published numbers and paired comparisons for the summary
``kind``, ``study``   ``kind: grid`` (default) is the product grid above; any other value names a study of
                      :mod:`cacheresearch.studies` (``economics``, ``ttl``, ``che``, ``ttl_advisor``) that
                      runs with the free-form settings under ``study`` (plus ``seed``/``seeds``) and
                      writes the same three outputs with its own dimensions

The product grid runs as the chunks of :func:`cacheresearch.shell.chunks.run_grid`: compiled, vmapped calls
of :mod:`cacheresearch.core.run`, as many configurations each as fit in memory (or ``engine.max_batch``),
each written to ``RUN_DIR/chunks`` as it finishes, so a rerun resumes. Configuration axes (policy, capacity,
TTL, replicas, router, prefix_blocks, and the seed as the router's PRNG key) are rows of the params
batch; workload axes (``layout``, and ``seed`` for synthetic workloads) are separate streams, stacked
with :func:`~cacheresearch.engine.stack_streams` and indexed per configuration (``stream_axis=True``).
A parameter a policy does not use (TTL for ``lru``, capacity for TTL policies) is ignored in that cell.

Outputs in the run directory (``hydra.run.dir=OUT``): ``results.nc`` (xarray Dataset, netCDF4 via
h5netcdf), ``summary.txt`` (also printed) and ``figure.png``. :func:`run_experiment` does the same
without a subprocess (Hydra's compose API), for tests and notebooks.

Only this module, :mod:`cacheresearch.shell.report` and :mod:`cacheresearch.studies` touch Hydra, xarray,
matplotlib or files; the simulation core does not.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import jax
import numpy as np
import xarray as xr
from omegaconf import DictConfig, OmegaConf

from cacheresearch import __version__, studies
from cacheresearch.cache.policies import INF, POLICIES, policy_spec
from cacheresearch.core.params import DEFAULT_STEP_PRESET, KNOB_DECLS, STEP_PRESETS
from cacheresearch.core.run import BACKENDS
from cacheresearch.core.simulate import SCHEDULERS
from cacheresearch.core.stream import run_structure
from cacheresearch.engine import (
    combine_limbs,
    compile_stream,
    make_params,
    resolve_router,
    stack_params,
    static_options,
)
from cacheresearch.metrics.prefix import PREFIX_DOCS, prefix_groups, prefix_variables, ttl_combos
from cacheresearch.routers import PRESETS, ROUTERS
from cacheresearch.shell.pipeline import FIGURE_FILE, RESULT_FILE, SUMMARY_FILE, PipelineError, chunk_stores, run_study
from cacheresearch.shell.pipeline import write_outputs as _write_outputs
from cacheresearch.shell.precheck import precheck
from cacheresearch.shell.schema import (  # noqa: F401  (the schema, re-exported for the shell's users)
    ARRIVALS,
    CONFIG_DIR,
    GRID_KEYS,
    KNOB_KEYS,
    LAYOUTS,
    SOURCES,
    TENANT_GRID_KEYS,
    CacheConf,
    DesignWorkloadConf,
    EngineConf,
    FittedWorkloadConf,
    FleetConf,
    FleetWorkloadConf,
    GridConf,
    KnobsConf,
    LaunchConf,
    OutputConf,
    ReplicaConf,
    SweepConfig,
    SweepError,
    TenantWorkloadConf,
    TraceConf,
    WorkloadConf,
)
from cacheresearch.studies.base import Cells, Study
from cacheresearch.workload import Workload, WorkloadError
from cacheresearch.workload.keys import SALT_MODES
from cacheresearch.workload.synthetic import design_workload, fleet_workload, tenant_workload
from cacheresearch.workload.trace import BlockSizeError, TraceError, load_trace

__all__ = [
    "SweepConfig",
    "SweepError",
    "GRID_KEYS",
    "CONFIG_DIR",
    "compose_config",
    "run",
    "run_experiment",
    "main",
]



# ------------------------------------------------------------------------------ the plan
@dataclass
class Plan:
    """The validated grid: output dimensions, their coordinates, and the base value of every key."""

    source: str
    dims: list[str]
    coords: dict[str, list]
    base: dict[str, Any]
    max_replicas: int
    workload_dims: list[str]  # dims that change the requests (separate streams)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)

    def cells(self):
        """Every configuration as a dict of all grid keys, in C order of :attr:`dims`."""
        for combo in itertools.product(*(self.coords[d] for d in self.dims)):
            cell = dict(self.base)
            cell.update(zip(self.dims, combo))
            yield cell


def _integer(key: str, v, lo: int) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise SweepError(f"{key} must be an integer, got {v!r}")
    if v < lo:
        raise SweepError(f"{key} must be >= {lo}, got {v}")
    return int(v)


def _number(key: str, v, lo: float) -> float | int:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
        raise SweepError(f"{key} must be a finite number, got {v!r}")
    if v < lo:
        raise SweepError(f"{key} must be >= {lo}, got {v}")
    return v


def _check_value(key: str, v, source: str):
    """Validate one value of a grid key (``key`` names where it came from, for the message)."""
    name = key.split(".")[-1]
    if name == "policy":
        if v not in POLICIES:
            raise SweepError(f"{key}: unknown policy {v!r}; choose one of {sorted(POLICIES)}")
        return v
    if name == "router":
        if not isinstance(v, str):
            raise SweepError(f"{key}: a router is a name, got {v!r}")
        return v  # rules, presets and fleet.variants are resolved per configuration
    if name == "layout":
        if v not in LAYOUTS:
            raise SweepError(f"{key}: unknown layout {v!r}; choose one of {list(LAYOUTS)}")
        return v
    if name == "capacity_blocks":
        if v is None:
            return None
        v = _integer(key, v, 0)
        if v >= INF:
            raise SweepError(f"{key} must be below {INF}; use policy 'unbounded' for no limit")
        return v
    if name == "cpu_capacity_blocks":
        return _integer(key, v, 0)
    if name == "ttl_s":
        if v is None:
            return None
        v = _number(key, v, 0)
        if v * 1000 >= INF:
            raise SweepError(f"{key} must be below {INF / 1000:.0f} s")
        return v
    if name == "replicas":
        return _integer(key, v, 1)
    if name == "prefix_blocks":
        return _integer(key, v, 1)
    if name == "seed":
        return _integer(key, v, 0)
    if name == "rate_per_s":
        v = _number(key, v, 0)
        if v <= 0:
            raise SweepError(f"{key} must be > 0, got {v}")
        return v
    if name == "hot_share":
        v = _number(key, v, 0)
        if v > 1:
            raise SweepError(f"{key} must be in [0, 1], got {v}")
        return v
    if name == "arrival":
        if v not in ARRIVALS:
            raise SweepError(f"{key}: unknown arrival process {v!r}; choose one of {list(ARRIVALS)}")
        return v
    if name == "salt":
        if v not in SALT_MODES:
            raise SweepError(f"{key}: unknown salt {v!r}; choose one of {list(SALT_MODES)}")
        return v
    if name in KNOB_KEYS:
        return _check_knob(key, KNOB_DECLS[name], v)
    raise AssertionError(name)  # pragma: no cover


def _check_knob(key: str, knob, v):
    """A knob's value checked against its declaration (kind and range), the message naming ``key``."""
    if v is None:
        return None
    if knob.kind == "view":
        if not isinstance(v, str):
            raise SweepError(f"{key}: a {knob.name} is a name ({', '.join(knob.choices)}), got {v!r}")
        if v not in knob.choices:
            raise SweepError(f"{key}: unknown router {knob.name} {v!r}; choose one of {list(knob.choices)}")
        return v
    if knob.kind == "bool":
        if not isinstance(v, bool):
            raise SweepError(f"{key} must be true or false, got {v!r}")
        return v
    if knob.kind == "float":
        v = float(_number(key, v, knob.lo))
    else:
        v = _integer(key, v, knob.lo)
    if knob.hi is not None and v > knob.hi:
        raise SweepError(f"{key} must be <= {knob.hi}, got {v}")
    return v


_TENANT_SOURCE_KEYS = {"rate_per_s": "rate_per_s", "hot_share": "hot_share", "arrival": "arrival"}


def _base_values(cfg) -> dict[str, Any]:
    knobs = OmegaConf.to_container(cfg.fleet.knobs, resolve=True) if cfg.fleet.knobs else {}
    if not isinstance(knobs, dict):
        raise SweepError("fleet.knobs must be a mapping of router / speed knobs")
    unknown = sorted(set(knobs) - set(KNOB_KEYS))
    if unknown:
        raise SweepError(f"fleet.knobs: unknown keys {unknown}; known: {list(KNOB_KEYS)}")
    src = cfg.workload.source
    base = {
        "policy": cfg.cache.policy,
        "capacity_blocks": cfg.cache.capacity_blocks,
        "cpu_capacity_blocks": OmegaConf.select(cfg, "tiers.cpu.capacity_blocks", default=0),
        "ttl_s": cfg.cache.ttl_s,
        "replicas": cfg.fleet.replicas,
        "router": cfg.fleet.router,
        "prefix_blocks": cfg.fleet.prefix_blocks,
        "layout": (cfg.workload.fleet.layout if src == "fleet" else cfg.workload.tenant.layout if src == "tenant"
                   else None),
        "seed": cfg.seed,
    }
    for k in KNOB_KEYS:
        base[k] = knobs.get(k)
    for k in TENANT_GRID_KEYS:
        base[k] = cfg.workload.tenant[k] if src == "tenant" else None
    return base


_BASE_KEY = {
    "policy": "cache.policy",
    "capacity_blocks": "cache.capacity_blocks",
    "cpu_capacity_blocks": "tiers.cpu.capacity_blocks",
    "ttl_s": "cache.ttl_s",
    "replicas": "fleet.replicas",
    "router": "fleet.router",
    "prefix_blocks": "fleet.prefix_blocks",
    "layout": "workload.fleet.layout",
    "seed": "seed",
    **{k: f"fleet.knobs.{k}" for k in KNOB_KEYS},
    **{k: f"workload.tenant.{k}" for k in TENANT_GRID_KEYS},
}


def _check_policy_knobs(policies: list, base: dict, coords: dict) -> None:
    """A TTL, or a policy's own knob (``s3fifo_small_pm`` ...), given while no policy of the grid reads it: a
    one-line error naming the key (it would change nothing)."""
    ttl_key = "grid.ttl_s" if "ttl_s" in coords else "cache.ttl_s"
    if ("ttl_s" in coords or base["ttl_s"] is not None) and not any(policy_spec(p).uses_ttl for p in policies):
        with_ttl = sorted(k for k, v in POLICIES.items() if v.uses_ttl)
        raise SweepError(f"{ttl_key}: a TTL is set but no policy of the grid {list(policies)} has one; drop it "
                         f"or choose a TTL policy ({', '.join(with_ttl)})")
    for k in sorted({k for spec in POLICIES.values() for k in spec.knobs}):
        if k in coords or base.get(k) is not None:
            owners = sorted(n for n, v in POLICIES.items() if k in v.knobs)
            if not any(k in policy_spec(p).knobs for p in policies):
                where = f"grid.{k}" if k in coords else _BASE_KEY[k]
                raise SweepError(f"{where}: a knob of the policies {owners}, none of which is in the grid "
                                 f"{list(policies)}")


def make_plan(cfg: DictConfig) -> Plan:
    """Validate ``cfg`` and lay out the grid (raises :class:`SweepError` with a readable message)."""
    source = cfg.workload.source
    if source not in SOURCES:
        raise SweepError(f"workload.source: unknown source {source!r}; choose one of {list(SOURCES)}")
    grid = OmegaConf.to_container(cfg.grid, resolve=True)
    unknown = sorted(k for k, v in grid.items() if k not in GRID_KEYS and v is not None)
    if "pd" in unknown or "link_gbps" in unknown:
        raise SweepError("grid.pd / grid.link_gbps: prefill/decode splits run in experiment=disagg "
                         "(studies/disagg.py); this grid serves aggregated fleets")
    if unknown:  # a study's own grid key (experiment=tiers), or no schema
        raise SweepError(f"grid: unknown keys {unknown}; known grid keys are {list(GRID_KEYS)}")
    base = _base_values(cfg)
    hw_cap = hardware_capacity(cfg)  # replica.gpu / replica.model: KV capacity in place of cache.capacity_blocks
    if hw_cap is not None:
        if grid.get("capacity_blocks") is not None:
            raise SweepError("replica.gpu / replica.model set the KV capacity: drop grid.capacity_blocks "
                             "(grid.capacity_blocks=null)")
        base["capacity_blocks"] = hw_cap
    for k in GRID_KEYS:
        if k in ("layout",) + TENANT_GRID_KEYS and base[k] is None:
            continue
        base[k] = _check_value(_BASE_KEY[k], base[k], source)

    coords: dict[str, list] = {}
    for k in GRID_KEYS:
        v = grid.get(k)
        if v is None:
            continue
        if k == "layout" and source not in ("fleet", "tenant"):
            raise SweepError(f"grid.layout applies to workload.source=fleet or tenant (the source is {source!r})")
        if k in TENANT_GRID_KEYS and source != "tenant":
            raise SweepError(f"grid.{k} applies to workload.source=tenant only (the source is {source!r})")
        if isinstance(v, (list, tuple)):
            if not v:
                raise SweepError(f"grid.{k} is an empty list")
            vals = []
            for x in v:
                if isinstance(x, (list, tuple, dict)):
                    raise SweepError(f"grid.{k}: elements must be scalars, got {x!r}")
                if x is None:
                    raise SweepError(f"grid.{k}: null is not a valid grid value")
                vals.append(_check_value(f"grid.{k}", x, source))
            if len(set(vals)) != len(vals):
                raise SweepError(f"grid.{k} has repeated values: {v}")
            coords[k] = vals
        elif isinstance(v, dict):
            raise SweepError(f"grid.{k} must be a scalar or a list, got a mapping")
        else:
            base[k] = _check_value(f"grid.{k}", v, source)

    seeds = _integer("seeds", cfg.seeds, 1)
    if "seed" not in coords and seeds > 1:
        coords["seed"] = [base["seed"] + i for i in range(seeds)]

    # policies that need a capacity / a TTL must get one in every cell where they appear
    policies = coords.get("policy", [base["policy"]])
    for p in policies:
        spec = policy_spec(p)
        if spec.uses_capacity and base["capacity_blocks"] is None and "capacity_blocks" not in coords:
            raise SweepError(
                f"policy {p!r} needs a capacity: set cache.capacity_blocks=N or grid.capacity_blocks=[...]"
            )
        if spec.uses_ttl and base["ttl_s"] is None and "ttl_s" not in coords:
            raise SweepError(f"policy {p!r} needs a TTL: set cache.ttl_s=SECONDS or grid.ttl_s=[...]")
    _check_policy_knobs(policies, base, coords)

    replicas = coords.get("replicas", [base["replicas"]])
    max_r = cfg.fleet.max_replicas
    if max_r is None:
        max_r = max(replicas)
    max_r = _integer("fleet.max_replicas", max_r, 1)
    if max(replicas) > max_r:
        raise SweepError(f"replicas {sorted(replicas)} exceed fleet.max_replicas={max_r}")

    dims = [k for k in GRID_KEYS if k in coords]
    wl_keys = {"fleet": ("layout", "seed"), "design": ("seed",), "fitted": ("seed",),
               "tenant": ("layout", "seed") + TENANT_GRID_KEYS}.get(source, ())
    return Plan(
        source=source, dims=dims, coords=coords, base=base, max_replicas=max_r,
        workload_dims=[d for d in dims if d in wl_keys],
    )


def hardware_capacity(cfg) -> int | None:
    """KV blocks per replica from ``replica.gpu`` / ``model`` / ``kv_dtype`` / ``tp`` /
    ``gpu_memory_utilization`` / ``hybrid_manager`` (:func:`cacheresearch.replica.hardware.kv_blocks`, in the
    workload's block size), or ``None`` when neither ``replica.gpu`` nor ``replica.model`` is set."""
    rc = cfg.get("replica") if hasattr(cfg, "get") else None
    if rc is None or (rc.get("gpu") is None and rc.get("model") is None):
        return None
    if rc.get("gpu") is None or rc.get("model") is None:
        raise SweepError("replica.gpu and replica.model go together (the KV capacity needs both)")
    from cacheresearch.replica.hardware import kv_blocks  # noqa: PLC0415

    src = cfg.workload.source
    node = cfg.trace if src == "trace" else cfg.workload.get(src)
    bt = node.get("block_tokens", 16) if node is not None else 16
    if bt is None and src == "trace" and cfg.trace.path is not None:  # inferred from the trace's first lines
        try:
            bt = load_trace(_resolve_path(str(cfg.trace.path)), format=str(cfg.trace.format),
                            max_requests=2000).block_tokens
        except (OSError, ValueError) as e:
            raise SweepError(f"trace: {e}") from None
    try:
        cap = kv_blocks(str(rc.model), str(rc.gpu), tp=int(rc.tp), kv_dtype=str(rc.kv_dtype),
                        gpu_memory_utilization=float(rc.gpu_memory_utilization), block_tokens=int(bt),
                        hybrid_manager=bool(rc.get("hybrid_manager", True)))
    except ValueError as e:
        raise SweepError(f"replica: {e}") from None
    _log(f"replica: {rc.model} on {rc.tp} x {rc.gpu}, kv_dtype {rc.kv_dtype}, gpu_memory_utilization "
         f"{rc.gpu_memory_utilization}: {cap} blocks of {bt} tokens per replica")
    return cap


# ------------------------------------------------------------------------------ workloads
def _resolve_path(p: str) -> Path:
    try:
        from hydra.utils import to_absolute_path

        return Path(to_absolute_path(p))
    except Exception:  # noqa: BLE001 - outside a Hydra run: relative to the working directory
        return Path(p).resolve()


def _workload_key(plan: Plan, cell: dict) -> tuple:
    if plan.source == "fleet":
        return (cell["layout"], cell["seed"])
    if plan.source in ("design", "fitted"):
        return (cell["seed"],)
    if plan.source == "tenant":
        return (cell["layout"], cell["seed"]) + tuple(cell[k] for k in TENANT_GRID_KEYS)
    return ()


def timestamp_top(w: Workload) -> Workload:
    """``w`` with a unique first block per request (a timestamp at the top of the prompt): chained
    keys change from the first block on, so every key of request ``i`` is re-keyed with ``i``."""
    req = np.repeat(np.arange(w.n_requests, dtype=np.uint64), w.n_blocks)
    with np.errstate(over="ignore"):
        salt = (req + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        keys = w.keys ^ salt ^ (salt >> np.uint64(29))
    return Workload(arrival_ms=w.arrival_ms, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
                    tenant=w.tenant, keys=keys, offsets=w.offsets, block_tokens=w.block_tokens,
                    name=w.name + "-timestamp_top", meta=dict(w.meta, layout="timestamp_top"))


def build_workload(cfg, plan: Plan, wkey: tuple) -> Workload:
    """The workload of one stream (``wkey`` from :func:`_workload_key`)."""
    src = plan.source
    try:
        if src == "trace":
            if cfg.trace.path is None:
                raise SweepError("workload.source=trace needs trace.path=FILE (a Mooncake JSONL trace)")
            path = _resolve_path(str(cfg.trace.path))
            if not path.is_file():
                raise SweepError(f"trace.path: file not found: {cfg.trace.path} (looked at {path})")
            w = load_trace(path, format=str(cfg.trace.format), block_tokens=cfg.trace.block_tokens,
                           max_requests=cfg.trace.max_requests, sort=bool(cfg.trace.get("sort", False)))
            if "block_tokens_inferred" in w.meta:
                _log(f"trace: {w.n_requests:,} requests; block size {w.block_tokens} tokens, inferred (sizes that "
                     f"fit every line: {w.meta['block_tokens_inferred']}; trace.block_tokens=N sets it)")
            return w
        if src == "fitted":
            from cacheresearch.fit import sample_workload  # noqa: PLC0415
            from cacheresearch.studies.traces import model_from_file  # noqa: PLC0415

            fc = cfg.workload.fitted
            if fc.path is None:
                raise SweepError("workload.source=fitted needs workload.fitted.path=FILE "
                                 "(results.nc of experiment=fit)")
            path = _resolve_path(str(fc.path))
            if not path.is_file():
                raise SweepError(f"workload.fitted.path: file not found: {fc.path} (looked at {path})")
            return sample_workload(model_from_file(path), seed=int(wkey[0]), duration_s=fc.duration_s,
                                   name=f"fitted-{path.parent.name or path.stem}")
        if src == "fleet":
            args = OmegaConf.to_container(cfg.workload.fleet, resolve=True)
            args.update(layout=wkey[0], seed=wkey[1])
            return fleet_workload(**args)
        if src == "tenant":
            args = OmegaConf.to_container(cfg.workload.tenant, resolve=True)
            layout = args.pop("layout")
            n_req = args.pop("n_requests")
            args.update(dict(zip(TENANT_GRID_KEYS, wkey[2:])), seed=wkey[1])
            if n_req is not None:
                args["duration_s"] = _integer("workload.tenant.n_requests", n_req, 1) / float(args["rate_per_s"])
            w = tenant_workload(**args)
            return timestamp_top(w) if layout == "timestamp_top" or wkey[0] == "timestamp_top" else w
        args = OmegaConf.to_container(cfg.workload.design, resolve=True)
        return design_workload(**args, seed=wkey[0])
    except SweepError:
        raise
    except BlockSizeError as e:
        raise SweepError(f"trace: {e}; set trace.block_tokens=N"
                         + (" (or null: inferred)" if cfg.trace.block_tokens is not None else "")) from None
    except (TraceError, WorkloadError) as e:
        raise SweepError(f"trace: {e}") from None
    except (ValueError, TypeError) as e:
        where = "trace" if src == "trace" else f"workload.{src}"
        raise SweepError(f"{where}: {e}") from None


def describe_workload(w: Workload) -> dict:
    return {
        "name": w.name,
        "n_requests": int(w.n_requests),
        "total_blocks": int(w.total_blocks),
        "distinct_keys": int(w.dense_ids().max()) + 1 if w.total_blocks else 0,
        "run_occurrences": int(run_structure(w).start.shape[0]),  # blocks that travel together (engine units)
        "input_tokens": int(w.input_tokens.sum()),
        "block_tokens": int(w.block_tokens),
        "meta": {k: (v if isinstance(v, (str, int, float, type(None))) else str(v)) for k, v in w.meta.items()},
    }


# ------------------------------------------------------------------------------ the run
def router_knobs(cfg, cell: dict) -> tuple[str, dict]:
    """(rule or preset, knobs) of a cell: a ``fleet.variants`` entry expands to its router and knobs;
    explicit knobs (``fleet.knobs``, ``grid.*``) override the variant's."""
    variants = OmegaConf.to_container(cfg.fleet.variants, resolve=True) if cfg.fleet.variants else {}
    name = cell["router"]
    knobs: dict = {}
    if name in variants:
        v = dict(variants[name])
        if "router" not in v:
            raise SweepError(f"fleet.variants.{name} needs a 'router' (a rule or preset)")
        name = v.pop("router")
        unknown = sorted(set(v) - set(KNOB_KEYS))
        if unknown:
            raise SweepError(f"fleet.variants: unknown knobs {unknown}; known: {list(KNOB_KEYS)}")
        knobs.update(v)
    elif name not in ROUTERS and name not in PRESETS:
        raise SweepError(f"unknown router {name!r}: choose a rule {sorted(ROUTERS)}, a preset {sorted(PRESETS)} "
                         f"or a name under fleet.variants {sorted(variants)}")
    knobs.update({k: cell[k] for k in KNOB_KEYS if cell.get(k) is not None})
    return name, knobs


def _params_of(cell: dict, cfg=None):
    try:
        name, knobs = router_knobs(cfg, cell) if cfg is not None else (cell["router"], {})
        latency = str(cfg.fleet.latency) if cfg is not None else None
        step = None
        if cfg is not None and _scheduler(cfg) == "vllm":
            step = str(cfg.replica.step_model) if cfg.replica.step_model is not None else DEFAULT_STEP_PRESET
        p = make_params(
            cell["policy"], capacity_blocks=cell["capacity_blocks"], ttl_s=cell["ttl_s"],
            replicas=cell["replicas"], router=name, prefix_blocks=cell["prefix_blocks"], latency=latency,
            step_model=step, **knobs,
        )
        if step is not None and cell["capacity_blocks"] is not None and policy_spec(cell["policy"]).uses_ttl:
            # the vllm replica's pool is GPU memory whatever the policy: a TTL policy keeps the KV capacity
            p = p._replace(capacity=np.int32(int(cell["capacity_blocks"])))
        return p
    except ValueError as e:
        raise SweepError(f"configuration {cell}: {e}") from None


def _scheduler(cfg) -> str:
    """``replica.scheduler``, checked (fcfs | vllm)."""
    v = str(cfg.replica.scheduler)
    if v not in SCHEDULERS:
        raise SweepError(f"replica.scheduler={v!r}: choose one of {list(SCHEDULERS)}")
    if cfg.replica.step_model is not None and str(cfg.replica.step_model) not in STEP_PRESETS:
        raise SweepError(f"replica.step_model={cfg.replica.step_model!r}: choose one of {sorted(STEP_PRESETS)}")
    return v


def _backend(cfg) -> str:
    """``engine.backend``, checked (auto | jax | numba: :data:`cacheresearch.core.run.BACKENDS`)."""
    v = str(cfg.engine.get("backend", "auto"))
    if v not in BACKENDS:
        raise SweepError(f"engine.backend={v!r}: choose one of {list(BACKENDS)}")
    return v


def _log(msg: str) -> None:
    """Progress and plan lines go to stderr (stdout carries the summary)."""
    print(msg, file=sys.stderr, flush=True)


def grid_cells(cfg, plan: Plan):
    """Generator: build the streams, yield the grid's cells (:class:`~cacheresearch.studies.base.Cells`),
    receive their metrics. Returns (metrics as NumPy [G]; stream index [G]; workload summaries
    (``describe``, ``input_tokens``, ``n_requests``); timings)."""
    cells = list(plan.cells())
    t0 = time.perf_counter()
    wkeys: dict[tuple, int] = {}
    idx = np.empty(len(cells), dtype=np.int64)
    for g, cell in enumerate(cells):
        idx[g] = wkeys.setdefault(_workload_key(plan, cell), len(wkeys))
    chunk = None if cfg.engine.chunk_runs is None else _integer("engine.chunk_runs", cfg.engine.chunk_runs, 1)
    prio = any(policy_spec(c["policy"]).priority for c in cells)  # lfu / length_aware rank every run
    blocks = any(policy_spec(c["policy"]).block_state for c in cells)  # s3fifo keeps per-block queues
    vllm = _scheduler(cfg) == "vllm"  # the vllm replica's pool keeps every run
    # what the per-prefix TTL formula needs from each workload (cacheresearch.metrics.prefix)
    combos = ttl_combos(cells, [resolve_router(router_knobs(cfg, c)[0])["router"] for c in cells])
    # Che's LRU prediction of the cells whose router has one (random / round_robin, prefix_hash), per workload
    che_cases: dict[tuple, set] = {k: set() for k in wkeys}
    for g, c in enumerate(cells):
        case = _che_case(cfg, c)
        if case is not None:
            che_cases[_workload_key(plan, c)].add(case)
    tiered = [g for g, c in enumerate(cells) if _tiered(cfg, c)]  # cells with a lower tier: the tiered engine
    tier_w = {int(idx[g]) for g in tiered}
    if tiered and int(OmegaConf.select(cfg, "launch.parts", default=1) or 1) > 1:
        raise SweepError("tiers: cells with a lower tier run in one process (the tiered engine is not chunked); "
                         "run without launch.parts")
    # one workload at a time: its stream and a summary are kept, its block keys are not (a tiered cell's are)
    streams, workloads, kept = [], [], {}
    _log(f"workloads: building {len(wkeys)} stream(s) for {len(cells)} configurations ...")
    t_line = time.perf_counter()
    for n_built, k in enumerate(wkeys):
        if n_built and time.perf_counter() - t_line >= 5.0:  # a line at most every 5 s
            t_line = time.perf_counter()
            _log(f"workloads: {n_built} of {len(wkeys)} streams built, {t_line - t0:.0f} s")
        w = build_workload(cfg, plan, k)
        if wkeys[k] in tier_w:
            kept[wkeys[k]] = w
        try:
            streams.append(compile_stream(w, chunk_runs=chunk, stateful_singletons=prio or vllm, block_ids=blocks))
        except WorkloadError as e:  # the engine's bounds (its int32 clock): a clear message, not a traceback
            raise SweepError(f"workload {w.name}: {e}") from None
        workloads.append(dict(describe=describe_workload(w), input_tokens=int(w.input_tokens.sum()),
                              n_requests=int(w.n_requests), che=che_lru(w, che_cases[k]),
                              groups=prefix_groups(w, plan.source, _integer("output.prefix_top",
                                                                             cfg.output.prefix_top, 1), combos)))
        del w
    t_build = time.perf_counter() - t0
    _log(f"workloads: {len(wkeys)} stream(s) built in {t_build:.1f} s")

    params = [_params_of(c, cfg) for c in cells]
    opts = dict(queue_slots=_integer("engine.queue_slots", cfg.engine.queue_slots, 1), scheduler=_scheduler(cfg))
    if vllm:  # the running-batch slots: the largest max_num_seqs of the grid
        opts["max_running"] = int(max(int(p.max_num_seqs) for p in params))
    if cfg.engine.match is not None:
        opts["match"] = bool(cfg.engine.match)
    grid_p = stack_params(params)
    st_all = static_options(grid_p, max_replicas=plan.max_replicas, **opts)
    opts.update(match=st_all.match, max_instances=st_all.max_instances)
    seeds = np.asarray([c["seed"] for c in cells], dtype=np.uint32)
    tcfg = _tier_configs(cfg, cells, params, tiered, idx, kept) if not vllm else {}
    vtier = _vllm_tiers(cfg, cells, tiered, idx, kept) if vllm else {}
    timing = {"build_s": t_build, "simulate_s": 0.0, "compile_s": 0.0, "batches": 0}
    plain = np.setdiff1d(np.arange(len(cells)), tiered)
    parts = []
    if plain.size:
        m = yield Cells(streams, idx[plain], [params[g] for g in plain], seeds[plain], max_replicas=plan.max_replicas,
                        options=dict(per_request=True, backend=_backend(cfg), **opts))
        parts.append((plain, m))
    if tiered:
        from cacheresearch.tiers.fleet import run_cells  # noqa: PLC0415
        t0 = time.perf_counter()
        order = sorted(kept)
        of = np.asarray([order.index(int(idx[g])) for g in tiered])
        if vllm:
            _log(f"running {len(tiered)} configurations with a cpu tier on the numba vllm backend ...")
            st_t = static_options(stack_params([params[g] for g in tiered]), max_replicas=plan.max_replicas,
                                  per_request=True, **opts)
            m, by_tier, written = _run_vllm_tiers(streams, idx, tiered, params, seeds, vtier, st_t, _backend(cfg))
        else:
            _log(f"running {len(tiered)} configurations with KV tiers on the tiered engine ...")
            m, by_tier, written = run_cells([kept[s] for s in order], of, [params[g] for g in tiered], seeds[tiered],
                                            [tcfg[g] for g in tiered], max_replicas=plan.max_replicas)
        timing["tiers_s"] = time.perf_counter() - t0
        parts.append((np.asarray(tiered), m))
        tok = np.zeros((len(cells), 4), np.int64)
        tok[tiered] = by_tier
        wr = np.zeros((len(cells), 4), np.int64)
        wr[tiered] = written
        timing["tiers"] = dict(cells=np.asarray(tiered), tokens=tok, written=wr)
    return _merge_metrics(len(cells), parts), idx, workloads, timing


def _tiered(cfg, cell: dict) -> bool:
    """Whether a cell has a lower tier: ``cpu_capacity_blocks`` > 0, or a pool or disk in ``tiers``."""
    if int(cell.get("cpu_capacity_blocks") or 0) > 0:
        return True
    return any(int(OmegaConf.select(cfg, f"tiers.{t}.capacity_blocks", default=0) or 0) > 0 for t in ("pool", "disk"))


def _tier_configs(cfg, cells, params, tiered, idx, kept) -> dict:
    """The tiered engine's configuration of each tiered cell (:func:`cacheresearch.tiers.fleet.tier_config_of`)."""
    if not tiered:
        return {}
    from cacheresearch.tiers import TierError, tier_block_bytes  # noqa: PLC0415
    from cacheresearch.tiers.fleet import tier_config_of  # noqa: PLC0415

    tc = OmegaConf.to_container(cfg.tiers, resolve=True) if OmegaConf.select(cfg, "tiers") is not None else {}
    lower = {t: {k: v for k, v in (tc.get(t) or {}).items() if v is not None} for t in ("cpu", "pool", "disk")}
    out = {}
    for g in tiered:
        c = cells[g]
        tiers = {t: dict(v) for t, v in lower.items()}
        tiers["cpu"]["capacity_blocks"] = int(c.get("cpu_capacity_blocks") or 0)
        try:
            bb = tier_block_bytes(str(tc.get("model", "llama3_8b")), int(kept[int(idx[g])].block_tokens),
                                  str(tc.get("kv_dtype", "bf16")))
            out[g] = tier_config_of(params[g], tiers=tiers, block_bytes=bb, offload=str(tc.get("offload", "evict")),
                                    load_mode=str(tc.get("load_mode", "serial")),
                                    tier_weights_pct=tuple(tc.get("tier_weights_pct", (100, 80, 60, 40))),
                                    scheduler=_scheduler(cfg))
        except (TierError, ValueError) as e:
            raise SweepError(str(e) if str(e).startswith(("tiers.", "fleet.", "cache.", "replica."))
                             else f"tiers: {e}") from None
    return out


def _vllm_tiers(cfg, cells, tiered, idx, kept) -> dict:
    """The vllm replica's cpu tier of each tiered cell (:func:`cacheresearch.tiers.vllm.cpu_tier`: the cpu tier only;
    ``tiers.load_mode`` serial: the admitting step waits for the loads (``sync``), overlap: ``async``)."""
    if not tiered:
        return {}
    from cacheresearch.tiers import TierError, tier_block_bytes  # noqa: PLC0415
    from cacheresearch.tiers.vllm import cpu_tier  # noqa: PLC0415

    tc = OmegaConf.to_container(cfg.tiers, resolve=True)
    for t in ("pool", "disk"):
        if int((tc.get(t) or {}).get("capacity_blocks") or 0) > 0:
            raise SweepError(f"tiers.{t}.capacity_blocks: the vllm replica has a cpu tier only (a pool or disk tier "
                             "runs on the fcfs replica)")
    if tc.get("offload", "evict") != "evict":
        raise SweepError(f"tiers.offload: {tc.get('offload')!r}; the vllm replica's cpu tier offloads on eviction")
    if any(int(x) != y for x, y in zip(tc.get("tier_weights_pct", (100, 80, 60, 40)), (100, 80, 60, 40))):
        raise SweepError("tiers.tier_weights_pct: the vllm replica's routers read the gpu pool only (no tier weights)")
    cpu = {k: v for k, v in (tc.get("cpu") or {}).items() if v is not None and k != "capacity_blocks"}
    lm = str(tc.get("load_mode", "serial"))
    if lm not in ("serial", "overlap"):
        raise SweepError(f"tiers.load_mode: {lm!r}; choose serial (the step waits: sync) or overlap (async)")
    out = {}
    for g in tiered:
        try:
            bb = tier_block_bytes(str(tc.get("model", "llama3_8b")), int(kept[int(idx[g])].block_tokens),
                                  str(tc.get("kv_dtype", "bf16")))
            out[g] = cpu_tier(capacity_blocks=int(cells[g].get("cpu_capacity_blocks") or 0), block_bytes=bb,
                              overlap="sync" if lm == "serial" else "async", **cpu)
        except (TierError, ValueError, TypeError) as e:
            raise SweepError(str(e) if str(e).startswith("tiers.") else f"tiers: {e}") from None
    return out


def _run_vllm_tiers(streams, idx, tiered, params, seeds, vtier: dict, st, backend: str):
    """The tiered cells on the numba vllm backend (:func:`cacheresearch.tiers.vllm.run_stream_tiered`), per stream:
    (finalized metrics [cells], tokens by tier [cells, 4], blocks written per tier [cells, 4])."""
    import jax  # noqa: PLC0415

    from cacheresearch.metrics.core import finalize  # noqa: PLC0415
    from cacheresearch.tiers import TierError  # noqa: PLC0415
    from cacheresearch.tiers.vllm import run_stream_tiered  # noqa: PLC0415

    tiered = np.asarray(tiered)
    n_out = max(int(np.asarray(s.n_requests)) for s in streams)
    parts, tok, wr = [], np.zeros((len(tiered), 4), np.int64), np.zeros((len(tiered), 4), np.int64)
    for sid in np.unique(idx[tiered]):
        loc = np.flatnonzero(idx[tiered] == sid)
        gs = tiered[loc]
        keys = jax.vmap(jax.random.key)(np.asarray(seeds[gs], np.uint32))
        try:
            r = run_stream_tiered(streams[int(sid)], [params[g] for g in gs], keys, st, [vtier[g] for g in gs],
                                  n_out=n_out, backend=backend)
        except (TierError, ValueError) as e:
            raise SweepError(str(e)) from None
        m = finalize(r.metrics, st)
        n = int(np.asarray(streams[int(sid)].n_requests))
        bt = int(streams[int(sid)].block_tokens)
        ht = np.asarray(m.hit_tokens)[:, :n].astype(np.int64)
        cpu_tok = np.minimum(np.asarray(r.cpu_hit_blocks)[:, :n].astype(np.int64) * bt, ht)
        tok[loc, 1] = cpu_tok.sum(axis=1)
        tok[loc, 0] = ht.sum(axis=1) - tok[loc, 1]
        wr[loc, 1] = np.asarray(r.offloaded_blocks)
        parts.append((loc, m))
    return _merge_metrics(len(tiered), parts), tok, wr


def _merge_metrics(G: int, parts: list):
    """One :class:`Metrics` of ``G`` cells from ``(cells, metrics)`` parts; per-request arrays padded with 0 to
    the widest part."""
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(G)):
        return parts[0][1]
    fields = type(parts[0][1])._fields
    out = {}
    for f in fields:
        arrs = [np.asarray(getattr(m, f)) for _, m in parts]
        shape = tuple(max(a.shape[d] for a in arrs) for d in range(1, arrs[0].ndim))
        o = np.zeros((G,) + shape, arrs[0].dtype)
        for (ix, _), a in zip(parts, arrs):
            o[(ix,) + tuple(slice(0, k) for k in a.shape[1:])] = a
        out[f] = o
    return type(parts[0][1])(**out)


def _che_case(cfg, cell: dict) -> tuple | None:
    """(capacity, replicas, rule, prefix_blocks) of a cell Che's LRU approximation predicts, or None: a capacity
    and a router that ignores the cache and load (random / round_robin: every replica sees 1/R of every key;
    prefix_hash: each prefix's whole rate on one replica)."""
    cap = cell.get("capacity_blocks")
    if cap is None:
        return None
    rule = resolve_router(router_knobs(cfg, cell)[0])["router"]
    if rule not in ("random", "round_robin", "prefix_hash"):
        return None
    return int(cap), int(cell["replicas"]), "random" if rule == "round_robin" else rule, int(cell["prefix_blocks"])


def che_lru(w: Workload, cases) -> dict:
    """Che's LRU token hit rate for each (capacity, replicas, rule, prefix_blocks) case of workload ``w``
    (:func:`cacheresearch.analysis.analytic.che_fleet`: block-key rates, IRM; a block hit counts its block's
    tokens, so the block ratio stands for the token ratio; ``first_miss``: a replica's first request of a block
    misses, the trace's cold start)."""
    from cacheresearch.analysis.analytic import che_fleet  # noqa: PLC0415 - SciPy, only when a cell has a case

    out = {}
    for cap, R, rule, pb in sorted(cases):
        ok = w.n_blocks.sum() and w.n_requests > 1 and int(w.arrival_ms[-1]) > int(w.arrival_ms[0])
        out[(cap, R, rule, pb)] = float(che_fleet(w, cap, R, rule, prefix_blocks=pb, first_miss=True).overall) \
            if ok else float("nan")
    return out


def grid_study(cfg):
    """The ``grid`` study: every ``grid.*`` key given as a list is an axis; one dataset over them."""
    t0 = time.perf_counter()
    plan = make_plan(cfg)
    metrics, idx, workloads, timing = yield from grid_cells(cfg, plan)
    timing["wall_s"] = time.perf_counter() - t0
    return to_dataset(cfg, plan, metrics, idx, workloads, timing)


def _summarize_grid(ds: xr.Dataset) -> str:
    from cacheresearch.shell import report  # noqa: PLC0415

    return report.summarize(ds, str(ds.attrs.get("output_variable", "token_hit_rate")))


def _plot_grid(ds: xr.Dataset):
    from cacheresearch.shell import report  # noqa: PLC0415

    return report.plot(ds, str(ds.attrs.get("output_variable", "token_hit_rate")))


GRID = studies.register(Study("grid", grid_study, _summarize_grid, _plot_grid, SweepConfig,
                              "a product grid over the grid.* keys given as lists (routing, replay, ...)"))


def _launch_args(cfg) -> dict:
    """``launch.*`` as :func:`cacheresearch.shell.chunks.run_grid` arguments (validated)."""
    la = cfg.get("launch") or LaunchConf()
    parts = _integer("launch.parts", la.parts, 1)
    part = _integer("launch.part", la.part, 0)
    if part >= parts:
        raise SweepError(f"launch.part={part} must be below launch.parts={parts}")
    devices = None if la.devices is None else _integer("launch.devices", la.devices, 1)
    if devices is not None and devices > jax.local_device_count():
        raise SweepError(f"launch.devices={devices}: this process has {jax.local_device_count()} local devices")
    return dict(part=part, parts=parts, devices=devices,
                progress=None if la.progress is None else bool(la.progress))


#: long names and units of the grid dataset's variables
GRID_VAR_DOCS = {
    "token_hit_rate": ("token hit rate: hit tokens / input tokens", "1"),
    "hit_rate_by_tier": ("input tokens served by each KV tier (gpu, cpu, pool, disk) / input tokens", "1"),
    "tier_written_blocks": ("blocks written into each lower tier (offload or write-through)", "blocks"),
    "request_hit_rate": ("request hit rate: share of requests with at least one hit block", "1"),
    "che_lru_hit_rate": ("Che's LRU prediction of the hit rate (IRM on block keys, a replica's first request of a "
                         "block a miss; random / round_robin and prefix_hash routers with a capacity; NaN elsewhere)",
                         "1"),
    "hit_tokens": ("input tokens served from cache (exact)", "tokens"),
    "input_tokens": ("input tokens of the workload", "tokens"),
    "requests_hit": ("requests with at least one hit block", "requests"),
    "n_requests": ("requests in the workload", "requests"),
    "ttft_p50_s": ("time to first token, median (queueing wait + prefill of the uncached suffix)", "s"),
    "ttft_p90_s": ("time to first token, 90th percentile (nearest rank)", "s"),
    "ttft_p99_s": ("time to first token, 99th percentile (nearest rank)", "s"),
    "ttft_mean_s": ("time to first token, mean", "s"),
    "load_imbalance": ("load imbalance: max / mean of replica work (busy time)", "1"),
    "utilisation_max": ("busiest replica's utilisation: busy time / run horizon", "1"),
    "prefix_copies": ("replicas holding a request's whole routing prefix at arrival, mean (NaN unless "
                      "engine.match)", "replicas"),
    "overflow_share": ("share of requests with a cached prefix sent to a replica holding less of it "
                       "(NaN unless engine.match)", "1"),
    "queue_overflow": ("dispatches that found every tracked queue slot in flight (raise engine.queue_slots)",
                       "requests"),
    "tpot_mean_s": ("time per output token after the first, mean (vllm replica)", "s"),
    "e2e_p50_s": ("arrival to last token, median (vllm replica)", "s"),
    "e2e_p90_s": ("arrival to last token, 90th percentile (vllm replica)", "s"),
    "e2e_p99_s": ("arrival to last token, 99th percentile (vllm replica)", "s"),
    "preemptions": ("preemptions by recompute (the KV pool could not hold an allocation)", "preemptions"),
    "kv_util_mean": ("KV blocks in use (pinned + working) / capacity, time average, mean over replicas", "1"),
    "kv_util_max": ("most KV blocks in use / capacity on any replica", "1"),
    "queue_len_mean": ("waiting requests per replica, time average", "requests"),
    "throughput_tps": ("output tokens per second over the run", "tokens/s"),
    "dropped": ("requests not served: waiting queue full (engine.queue_slots) or larger than the pool", "requests"),
    "engine_steps": ("engine steps of all replicas", "steps"),
    "engine_events": ("replica events of all replicas: decode-only stretches taken at once and other engine steps",
                      "events"),
    "vllm_prefix_cache_queries_tokens": ("vLLM's vllm:prefix_cache_queries: prompt tokens looked up in the local "
                                         "prefix cache, counted as fleet.knobs.counter_mode says (vllm replica, "
                                         "numba backend)", "tokens"),
    "vllm_prefix_cache_hits_tokens": ("vLLM's vllm:prefix_cache_hits: tokens those lookups found in the local "
                                      "prefix cache (vllm replica, numba backend)", "tokens"),
    "vllm_prefix_cache_hit_rate": ("vLLM's reported prefix-cache hit rate: vllm:prefix_cache_hits / "
                                   "vllm:prefix_cache_queries (NaN without queries)", "1"),
    "vllm_external_queries_tokens": ("vLLM's vllm:external_prefix_cache_queries: tokens asked of the KV connector "
                                     "(the cpu tier) beyond the local hit, at admissions", "tokens"),
    "vllm_external_hits_tokens": ("vLLM's vllm:external_prefix_cache_hits: tokens the KV connector (the cpu tier) "
                                  "matched", "tokens"),
    "requests_ok": ("requests that finished by their client deadline (inference-perf's successes)", "requests"),
    "requests_timed_out": ("requests whose client gave up at its timeout (fleet.knobs.client_timeout_ms)",
                           "requests"),
    "requests_failed": ("requests never served (waiting queue full or larger than the pool)", "requests"),
    "requests_per_s": ("successful requests per second of the run (inference-perf's requests_per_sec: successes / "
                       "the run's span)", "requests/s"),
}


#: long names and units of the grid dataset's coordinates (the seed's depends on the source)
GRID_COORD_DOCS = {
    "policy": ("cache policy", None),
    "capacity_blocks": ("cache capacity per replica", "blocks"),
    "cpu_capacity_blocks": ("cpu KV tier per replica (tiers.cpu; 0: none)", "blocks"),
    "tier": ("KV tier", None),
    "ttl_s": ("time to live", "s"),
    "replicas": ("number of replicas", None),
    "router": ("router", None),
    "layout": ("prompt layout", None),
    "rate_per_s": ("arrival rate (load level)", "requests/s"),
    "hot_share": ("extra traffic share of the hot tenant", "1"),
    "arrival": ("arrival process", None),
    "salt": ("cache salt: who may share a cached block", None),
}


def _tier_variables(ti, metrics, inp, dims, shape) -> dict:
    """``hit_rate_by_tier`` and ``tier_written_blocks`` (dims + ``tier``); an untiered cell's hits are its gpu's."""
    G = len(inp)
    tok = np.array(ti["tokens"]) if ti is not None else np.zeros((G, 4), np.int64)
    wr = np.array(ti["written"]) if ti is not None else np.zeros((G, 4), np.int64)
    plain = np.setdiff1d(np.arange(G), ti["cells"] if ti is not None else [])
    tok[plain, 0] = combine_limbs(metrics.hit_tokens_hi, metrics.hit_tokens_lo)[plain]
    denom = np.maximum(inp, 1).astype(np.float64)[:, None]
    return {"hit_rate_by_tier": (dims + ["tier"], (tok / denom).reshape(tuple(shape) + (4,))),
            "tier_written_blocks": (dims + ["tier"], wr.reshape(tuple(shape) + (4,)))}


def _vllm_client_variables(metrics, grid) -> dict:
    """vLLM's own prefix-cache counters and the client's outcome counts (vllm replica)."""
    vc = combine_limbs(metrics.vllm_counters_hi, metrics.vllm_counters_lo).reshape(-1, 4)
    ok = np.asarray(metrics.requests_ok, np.float64).reshape(-1)
    span = np.maximum(np.asarray(metrics.horizon_time, np.float64).reshape(-1), 1.0) / 1000.0
    return {"vllm_prefix_cache_queries_tokens": grid(vc[:, 0], np.int64),
            "vllm_prefix_cache_hits_tokens": grid(vc[:, 1], np.int64),
            "vllm_prefix_cache_hit_rate": grid(np.where(vc[:, 0] > 0, vc[:, 1] / np.maximum(vc[:, 0], 1), np.nan),
                                               np.float64),
            "vllm_external_queries_tokens": grid(vc[:, 2], np.int64),
            "vllm_external_hits_tokens": grid(vc[:, 3], np.int64),
            "requests_ok": grid(metrics.requests_ok, np.int64),
            "requests_timed_out": grid(metrics.requests_timed_out, np.int64),
            "requests_failed": grid(metrics.requests_failed, np.int64),
            "requests_per_s": grid(ok / span, np.float64)}


def to_dataset(cfg, plan: Plan, metrics, idx, workloads, timing) -> xr.Dataset:
    """The results as an xarray Dataset (dims = list-valued grid keys, coordinates as given)."""
    shape, dims = plan.shape, plan.dims
    coords = {d: np.asarray(plan.coords[d]) for d in dims}

    def grid(a, dtype):
        return (dims, np.asarray(a).astype(dtype).reshape(shape))

    inp = np.asarray([w["input_tokens"] for w in workloads], dtype=np.int64)
    nreq = np.asarray([w["n_requests"] for w in workloads], dtype=np.int64)
    data = {
        "token_hit_rate": grid(metrics.token_hit_rate, np.float64),
        "request_hit_rate": grid(metrics.request_hit_rate, np.float64),
        "hit_tokens": grid(combine_limbs(metrics.hit_tokens_hi, metrics.hit_tokens_lo), np.int64),
        "input_tokens": grid(inp[idx], np.int64),
        "requests_hit": grid(metrics.requests_hit, np.int64),
        "n_requests": grid(nreq[idx], np.int64),
        "ttft_p50_s": grid(np.asarray(metrics.ttft_p50_ms) / 1000.0, np.float64),
        "ttft_p90_s": grid(np.asarray(metrics.ttft_p90_ms) / 1000.0, np.float64),
        "ttft_p99_s": grid(np.asarray(metrics.ttft_p99_ms) / 1000.0, np.float64),
        "ttft_mean_s": grid(np.asarray(metrics.ttft_mean_ms) / 1000.0, np.float64),
        "load_imbalance": grid(metrics.load_imbalance, np.float64),
        "utilisation_max": grid(np.max(np.asarray(metrics.utilisation), axis=-1), np.float64),
        "prefix_copies": grid(metrics.prefix_copies, np.float64),
        "overflow_share": grid(metrics.overflow_share, np.float64),
        "queue_overflow": grid(metrics.queue_overflow, np.int64),
    }
    cells = list(plan.cells())
    che = [workloads[int(idx[g])].get("che", {}).get(_che_case(cfg, c), np.nan) for g, c in enumerate(cells)]
    data["che_lru_hit_rate"] = grid(che, np.float64)
    if timing.get("tiers") is not None or "cpu_capacity_blocks" in dims:  # KV tiers: the tokens each tier served
        data.update(_tier_variables(timing.get("tiers"), metrics, inp[idx], dims, shape))
        coords["tier"] = np.asarray(["gpu", "cpu", "pool", "disk"])
    if _scheduler(cfg) == "vllm":  # the batching replica's serving metrics (replica/vllm.py)
        data.update({
            "tpot_mean_s": grid(np.asarray(metrics.tpot_mean_ms) / 1000.0, np.float64),
            "e2e_p50_s": grid(np.asarray(metrics.e2e_p50_ms) / 1000.0, np.float64),
            "e2e_p90_s": grid(np.asarray(metrics.e2e_p90_ms) / 1000.0, np.float64),
            "e2e_p99_s": grid(np.asarray(metrics.e2e_p99_ms) / 1000.0, np.float64),
            "preemptions": grid(metrics.preemptions, np.int64),
            "kv_util_mean": grid(metrics.kv_util_mean, np.float64),
            "kv_util_max": grid(metrics.kv_util_max, np.float64),
            "queue_len_mean": grid(metrics.queue_len_mean, np.float64),
            "throughput_tps": grid(metrics.throughput_tps, np.float64),
            "dropped": grid(metrics.dropped, np.int64),
            "engine_steps": grid(metrics.steps, np.int64),
            "engine_events": grid(metrics.events, np.int64),
            **_vllm_client_variables(metrics, grid),
        })
    if np.size(metrics.hit_tokens) and all("groups" in w for w in workloads):  # per-prefix economics
        rules = [resolve_router(router_knobs(cfg, c)[0])["router"] for c in cells]
        try:
            pdata, plabels, pattrs = prefix_variables(cells, rules, metrics.hit_tokens, idx,
                                                      [w["groups"] for w in workloads], dims, shape,
                                                      pricing=str(cfg.output.pricing))
        except ValueError as e:
            raise SweepError(f"output.pricing: {e}") from None
        data.update(pdata)
        coords["prefix"] = np.asarray(plabels)
    ds = xr.Dataset(data, coords=coords)
    for v, (ln, u) in PREFIX_DOCS.items():
        if v in ds:
            ds[v].attrs.update(long_name=ln, units=u)
    if "prefix" in ds.coords:
        ds.attrs.update(pattrs)
    for v, (ln, u) in GRID_VAR_DOCS.items():
        if v in ds:
            ds[v].attrs.update(long_name=ln, units=u)
    coord_doc = {
        **GRID_COORD_DOCS,
        "seed": ("seed (router PRNG key)" if plan.source == "trace" else "seed (workload draw and router PRNG key)",
                 None),
        **{k: (f"{k}: {d.doc}", d.unit) for k, d in KNOB_DECLS.items()},  # router / speed knobs, as declared
    }
    for d in dims:
        ln, u = coord_doc.get(d, (d, None))
        ds[d].attrs["long_name"] = ln
        if u:
            ds[d].attrs["units"] = u

    desc = []
    wk = list({_workload_key(plan, c): None for c in plan.cells()})
    for k, w in zip(wk, workloads):
        d = dict(w["describe"])
        if plan.source == "fleet":
            d.update(layout=k[0], seed=k[1])
        elif plan.source == "design":
            d.update(seed=k[0])
        elif plan.source == "tenant":
            d.update(layout=k[0], seed=k[1], **dict(zip(TENANT_GRID_KEYS, k[2:])))
        desc.append(d)
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    ds.attrs.update(
        title=f"cacheresearch sweep: {cfg.name}",
        experiment=str(cfg.name),
        description=str(cfg.description or ""),
        config=cfg_yaml,
        workload_source=plan.source,
        workload=json.dumps(desc),
        workload_n_requests=np.asarray([d["n_requests"] for d in desc], dtype=np.int64),
        workload_total_blocks=np.asarray([d["total_blocks"] for d in desc], dtype=np.int64),
        workload_distinct_keys=np.asarray([d["distinct_keys"] for d in desc], dtype=np.int64),
        n_configs=int(np.prod(shape, dtype=np.int64)),
        n_streams=len(workloads),
        max_replicas=int(plan.max_replicas),
        replica_scheduler=_scheduler(cfg),
        base=json.dumps({k: v for k, v in plan.base.items()}),
        cacheresearch_version=__version__,
        jax_version=jax.__version__,
        jax_backend=jax.default_backend(),
        build_time_s=float(timing["build_s"]),
        simulate_time_s=float(timing["simulate_s"]),
        compile_time_s=float(timing["compile_s"]),
        n_compiled_calls=int(timing["batches"]),
        wall_time_s=float(timing.get("wall_s", 0.0)),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    return ds


def run(cfg, output_dir: str | Path | None = None, *, write: bool = True, chunks: bool = False) -> xr.Dataset | None:
    """Validate ``cfg``, run its study (``kind``; ``grid`` by default) through the pipeline
    (:mod:`cacheresearch.shell.pipeline`) and (when ``write``) write the outputs into ``output_dir``.

    ``chunks``: run as chunk files in ``output_dir/chunks`` (skip those already there, refuse a changed
    configuration; ``launch.part``/``launch.parts``: one slice of the grid; :mod:`cacheresearch.shell.chunks`).
    Returns None when other parts of a multi-part run still have configurations to run."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg)
    msg = precheck(cfg)  # names, input files, the traces' first lines: before any work
    if msg:
        raise SweepError(msg)
    try:
        study = studies.get(str(cfg.get("kind", "grid") or "grid"))
    except studies.StudyError as e:
        raise SweepError(str(e)) from None
    store_of = _chunk_stores(cfg, output_dir) if chunks else None
    mb = OmegaConf.select(cfg, "engine.max_batch", default=None)  # a bare study config may have no engine
    mb = None if mb is None else _integer("engine.max_batch", mb, 1)
    try:
        ds = run_study(study, cfg, store_of=store_of, max_batch=mb, launch=_launch_args(cfg), log=_log)
    except (PipelineError, studies.StudyError) as e:
        raise SweepError(str(e)) from None
    if ds is None:  # a part of a multi-part run; the last part to finish combines
        return None
    if write:
        if output_dir is None:
            raise ValueError("output_dir is required when write=True")
        var = OmegaConf.select(cfg, "output.variable", default=None)  # the summary's table and the figure's
        write_outputs(ds, output_dir, figure=bool(OmegaConf.select(cfg, "output.figure", default=True)),
                      variable=var if var in ds else None)
    return ds


def write_outputs(ds: xr.Dataset, output_dir, *, figure: bool = True, variable: str | None = None) -> str:
    """``results.nc``, ``summary.txt`` and (optionally) ``figure.png`` in ``output_dir`` (each atomically);
    returns the summary. ``variable``: the grid's summary variable (default: the run's ``output.variable``)."""
    if variable is not None:
        ds.attrs["output_variable"] = str(variable)
    return _write_outputs(ds, output_dir, studies.get(str(ds.attrs.get("study_kind", "grid"))), figure=figure)


def _input_files(cfg) -> dict:
    """{path: [bytes, sha256]} of the input files the configuration names (trace, fitted model)."""
    import hashlib  # noqa: PLC0415

    out = {}
    for key in ("trace.path", "workload.fitted.path"):
        v = OmegaConf.select(cfg, key)
        if v is None:
            continue
        path = _resolve_path(str(v))
        if path.is_file():
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[str(v)] = [path.stat().st_size, h.hexdigest()]
    return out


def _chunk_stores(cfg, root):
    """The chunk files of run directory ``root`` per batch of cells, checked against ``cfg``
    (:mod:`cacheresearch.shell.chunks`, :func:`cacheresearch.shell.pipeline.chunk_stores`)."""
    if root is None:
        raise ValueError("chunks=True needs an output directory")
    if str(cfg.launch.resume) == "fresh" and int(cfg.launch.parts) > 1:
        raise SweepError("launch.resume=fresh with launch.parts > 1 would let each part discard the others' "
                         f"chunks: remove {Path(root) / 'chunks'} first, then run the parts")
    conf = OmegaConf.to_container(cfg, resolve=True)
    conf["input_files"] = _input_files(cfg)  # a trace edited in place is another configuration
    return chunk_stores(root, conf, __version__, resume=str(cfg.launch.resume), log=_log)


# ------------------------------------------------------------------------------ entry points
def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The composed configuration for ``overrides`` (Hydra's compose API; no run directory)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="cacheresearch.sweep"):
        return compose(config_name="config", overrides=list(overrides))


def run_experiment(overrides: list[str] | tuple[str, ...], output_dir: str | Path) -> xr.Dataset:
    """Run an experiment in-process: ``run_experiment(["experiment=seed_fleet", "seeds=2"], "out")``.

    Same outputs as the command line (``results.nc``, ``summary.txt``, ``figure.png`` in
    ``output_dir``); returns the dataset. ``hydra.*`` overrides are not accepted here.
    """
    bad = [o for o in overrides if o.lstrip("+~").startswith("hydra.")]
    if bad:
        raise SweepError(f"run_experiment takes the output directory as an argument; drop {bad}")
    cfg = compose_config(overrides)
    return run(cfg, output_dir)


def notebook_dataset(reduced: list[str], env: str = "CACHERESEARCH_RESULTS") -> tuple[xr.Dataset, Path]:
    """A notebook's dataset: the run named by ``$CACHERESEARCH_RESULTS`` (a run directory or a
    ``results.nc``), else a reduced in-process run (``reduced`` overrides) in a temporary directory.

    Returns the dataset and the directory its figures go to.
    """
    import os  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from cacheresearch.shell import report  # noqa: PLC0415

    results = os.environ.get(env)
    if results:
        return report.load(results), Path(results) if Path(results).is_dir() else Path(results).parent
    name = next((o.split("=", 1)[1] for o in reduced if o.startswith("experiment=")), "run")
    out_dir = Path(tempfile.mkdtemp(prefix=f"{name}_"))
    ds = run_experiment(reduced, out_dir)
    print(f"reduced run ({' '.join(o for o in reduced if not o.startswith('experiment='))}) in {out_dir}")
    print(f"full run: python -m cacheresearch.sweep experiment={name}")
    return ds, out_dir


def compile_cache(cfg) -> str | None:
    """Turn on JAX's persistent compilation cache at ``engine.compile_cache`` (``auto``:
    ``$XDG_CACHE_HOME/cacheresearch/jax``, else ``~/.cache/cacheresearch/jax``; ``none``: off). A rerun of
    the same programs loads them instead of compiling (the main job: 20 s of its 42 s). A cache directory
    already set (``JAX_COMPILATION_CACHE_DIR``) is kept. Returns the directory in use, or None."""
    v = OmegaConf.select(cfg, "engine.compile_cache", default="auto")
    if v is None or str(v).lower() in ("", "none", "null", "off", "false"):
        return None
    if jax.config.jax_compilation_cache_dir:
        return str(jax.config.jax_compilation_cache_dir)
    if str(v) == "auto":
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "cacheresearch" / "jax"
    else:
        path = Path(str(v)).expanduser()
    jax.config.update("jax_compilation_cache_dir", str(path))
    return str(path)


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    launch = cfg.launch
    compile_cache(cfg)
    try:
        parts = _integer("launch.parts", launch.parts, 1)
        if launch.dir is not None:
            out = str(launch.dir)
        elif parts > 1 and hc.mode == RunMode.MULTIRUN:
            out = hc.sweep.dir  # every job of the multirun meets in the sweep directory
        elif parts > 1:
            raise SweepError("launch.parts > 1 outside a multirun needs launch.dir=DIR (one directory for all parts)")
        else:
            out = hc.runtime.output_dir
        ds = run(cfg, out, write=False, chunks=bool(launch.chunks))
        if ds is None:
            print(f"part {int(launch.part) + 1} of {parts} done; the part that finishes last writes "
                  f"{Path(out) / RESULT_FILE} (or rerun without launch.part to finish)")
            return
        var = OmegaConf.select(cfg, "output.variable", default=None)  # the summary's table and the figure's
        text = write_outputs(ds, out, figure=bool(cfg.output.figure), variable=var if var in ds else None)
    except SweepError as e:
        print(f"cacheresearch.shell.sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(text)
    print(f"\nwrote {Path(out) / RESULT_FILE}, {SUMMARY_FILE}, {FIGURE_FILE if cfg.output.figure else ''}".rstrip(", "))


if __name__ == "__main__":
    main()

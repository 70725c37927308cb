"""``experiment=tune``: a population search over router, cache and fleet knobs under an SLO.

A grid answers "which of these configurations is best"; this study answers "what is the best configuration"
within bounds. The knobs (``tune.knobs``: ``{NAME: {low, high} | {values: [...]}}``) are any configuration
knob of the engine: ``router`` (rules, presets, ``fleet.variants`` names), ``policy``, ``capacity_blocks``,
``ttl_s``, ``replicas``, ``prefix_blocks`` and every router / replica knob the registry declares
(:data:`cacheresearch.core.params.KNOB_DECLS`: scorer weights, the chwbl load bound, batch limits, ...),
continuous, integer or categorical (a ``values`` list). The search minimises ``tune.objective`` (one metric, or
``{METRIC: WEIGHT, ...}``: a weighted sum) under ``tune.slo`` (``{METRIC: {max: X} | {min: Y}}`` or
``"<= X"`` / ``">= Y"``), from the engine's metrics and ``usd_per_day`` (:func:`usd_per_day`: GPU hours of the
fleet plus, with ``tune.cost.pricing``, the provider's prompt-caching bill).

``tune.method``: ``cma`` (CMA-ES, the ``cma`` package's ask-tell interface, on the knobs mapped to the unit
cube; a categorical or integer knob is its coordinate floored / rounded), ``random`` (uniform in the cube)
or ``grid`` (the product of each knob's ``grid`` list, or its ``values``, or ``tune.grid_points`` evenly
spaced points: the exhaustive answer the others are compared with). ``tune.population`` candidates per
generation, ``tune.generations`` generations (grid: as many as its points need). Every candidate of a
generation is a cell of ONE engine call (the study yields one :class:`~cacheresearch.studies.base.Cells`
per generation) on the same streams and seeds (``seed`` .. ``seed + seeds - 1``): paired comparisons.
Each generation is its own chunk directory (``chunks/call-K``), so a killed search resumes from the last
finished generation and, the search being deterministic given its seed (``tune.search_seed``) and the
evaluated objectives, gives the same answer.

Constraints: a candidate's violation is the sum of its relative SLO misses (``(value - max) / |max|``,
``(min - value) / |min|``); the search ranks ``objective + tune.penalty x violation``; the best is the
lowest objective among the feasible candidates (none feasible: the least penalised, flagged). The winner is
re-evaluated on ``tune.holdout_seeds`` fresh seeds from ``tune.holdout_seed`` (new workload draws and router
keys): out of sample; the gap is reported.

Engine workaround (the runner compiles one program per state shape, batch size and set of compiled routers,
:mod:`cacheresearch.core.run`): each generation's cells are padded, per program, with anchor cells (one per
router / policy / view value the knobs allow) to a fixed count, so every generation reuses the programs
compiled for the first instead of compiling anew. The padding's results are dropped (``engine_cells``
counts them; ``evaluations`` does not).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import xarray as xr
from omegaconf import OmegaConf

from cacheresearch.analysis.pricing import PRESETS as PRICING_PRESETS
from cacheresearch.cache.policies import BLOCK_POLICY_IDS, INF, POLICIES, PRIORITY_IDS, S3FIFO_ID
from cacheresearch.core.params import DEFAULT_STEP_PRESET, KNOB_DECLS, make_params, stack_params
from cacheresearch.core.simulate import combine_limbs, static_options
from cacheresearch.core.stream import compile_stream
from cacheresearch.routers import CACHE_ROUTERS, PRESETS, ROUTERS, VIEWS
from cacheresearch.studies import base as B
from cacheresearch.studies.base import Cells, Study, StudyError
from cacheresearch.workload.synthetic import design_workload, fleet_workload, tenant_workload

__all__ = ["DEFAULTS", "METRICS", "VLLM_METRICS", "Knob", "parse_tune", "usd_per_day", "tune_study",
           "summarize_tune", "plot_tune", "overrides_of", "comparison_figure", "STUDIES"]

DEFAULTS = dict(method="cma", population=16, generations=10, search_seed=0, objective="ttft_p99_s", slo={},
                knobs={}, penalty=100.0, sigma0=0.3, grid_points=5, holdout_seeds=3, holdout_seed=1000,
                progress=True, benchmark=None,
                cost=dict(gpu_usd_per_hour=2.5, gpus_per_replica=1, pricing=None))
METHODS = ("cma", "random", "grid")

#: The metrics every replica model produces: (long name, units).
METRICS = {
    "token_hit_rate": ("token hit rate: hit tokens / input tokens", "1"),
    "request_hit_rate": ("share of requests with at least one hit block", "1"),
    "ttft_p50_s": ("time to first token, median", "s"),
    "ttft_p90_s": ("time to first token, 90th percentile", "s"),
    "ttft_p99_s": ("time to first token, 99th percentile", "s"),
    "ttft_mean_s": ("time to first token, mean", "s"),
    "load_imbalance": ("load imbalance: max / mean of replica work", "1"),
    "utilisation_max": ("busiest replica's utilisation", "1"),
    "queue_overflow": ("dispatches that found every tracked queue slot in flight", "requests"),
    "usd_per_day": ("cost per day: GPU hours of the fleet + the provider's prompt-caching bill", "USD/day"),
    "gpu_usd_per_day": ("GPU hours of the fleet per day, priced", "USD/day"),
    "token_usd_per_day": ("prompt tokens billed per day under tune.cost.pricing (0 without)", "USD/day"),
}
#: The metrics of the vllm replica only.
VLLM_METRICS = {
    "tpot_mean_s": ("time per output token after the first, mean", "s"),
    "e2e_p50_s": ("arrival to last token, median", "s"),
    "e2e_p90_s": ("arrival to last token, 90th percentile", "s"),
    "e2e_p99_s": ("arrival to last token, 99th percentile", "s"),
    "preemptions": ("preemptions by recompute", "preemptions"),
    "kv_util_mean": ("KV blocks in use / capacity, time average", "1"),
    "throughput_tps": ("output tokens per second", "tokens/s"),
    "dropped": ("requests not served", "requests"),
}
#: The metrics of ``tune.benchmark=llmd`` (experiment=llmd_benchmark's summaries over the non-warm-up stages).
LLMD_METRICS = {
    "ttft_p90_s_all": ("client TTFT p90, the report's summary across QPS (successes-weighted mean of stages)", "s"),
    "ttft_mean_s_all": ("client TTFT mean over the non-warm-up stages", "s"),
    "output_tokens_per_s_all": ("output tokens per second, mean of the non-warm-up stages", "tokens/s"),
    "requests_per_s_all": ("requests per second, mean of the non-warm-up stages", "requests/s"),
    "ttft_p90_s_pooled_all": ("client TTFT p90 of the non-warm-up stages' requests pooled", "s"),
}
#: The knobs ``tune.benchmark=llmd`` tunes: the precise EPP file's scorer weights (x 100).
LLMD_KNOBS = {"gie_prefix_w_pct": "prefix-cache-scorer", "gie_kv_w_pct": "kv-cache-scorer",
              "gie_queue_w_pct": "queue-scorer"}
_MS = {"ttft_p50_s": "ttft_p50_ms", "ttft_p90_s": "ttft_p90_ms", "ttft_p99_s": "ttft_p99_ms",
       "ttft_mean_s": "ttft_mean_ms", "tpot_mean_s": "tpot_mean_ms", "e2e_p50_s": "e2e_p50_ms",
       "e2e_p90_s": "e2e_p90_ms", "e2e_p99_s": "e2e_p99_ms"}
#: The configuration keys a knob may name besides the declared knobs, and where the command line sets them.
_CONFIG_KEYS = {"router": "fleet.router", "policy": "cache.policy", "capacity_blocks": "cache.capacity_blocks",
                "ttl_s": "cache.ttl_s", "replicas": "fleet.replicas", "prefix_blocks": "fleet.prefix_blocks"}
_WORKLOAD_KEYS = ("rate_per_s", "hot_share", "arrival", "salt", "layout", "seed")


# ------------------------------------------------------------------------------ knobs
@dataclass(frozen=True)
class Knob:
    """One searched knob: ``kind`` cat (``values``), int or float in [``low``, ``high``] (``log``: log-spaced)."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    values: tuple = ()
    grid: tuple = ()
    log: bool = False

    @property
    def levels(self) -> int:
        return len(self.values) if self.kind == "cat" else (int(self.high - self.low) + 1 if self.kind == "int"
                                                             else 0)

    def decode(self, u: float):
        """The knob's value at unit coordinate ``u`` (clipped to [0, 1])."""
        u = min(max(float(u), 0.0), 1.0)
        if self.kind == "cat":
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        x = (math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low))) if self.log
             else self.low + u * (self.high - self.low))
        return int(min(max(round(x), self.low), self.high)) if self.kind == "int" else float(x)

    def encode(self, v) -> float:
        """The unit coordinate of value ``v`` (a categorical value: the middle of its cell)."""
        if self.kind == "cat":
            return (self.values.index(v) + 0.5) / len(self.values)
        if self.log:
            return (math.log(v) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (float(v) - self.low) / (self.high - self.low)

    def grid_values(self, points: int) -> list:
        if self.grid:
            return list(self.grid)
        if self.kind == "cat":
            return list(self.values)
        return list(dict.fromkeys(self.decode(u) for u in np.linspace(0.0, 1.0, points)))

    def as_number(self, v) -> float:
        """A value as a number for the history (a categorical value: its index)."""
        return float(self.values.index(v)) if self.kind == "cat" else float(v)


def _declared(name: str):
    """(kind, low, high, values) of a tunable key from its declaration; StudyError naming it otherwise."""
    key = f"tune.knobs.{name}"
    if name in _WORKLOAD_KEYS:
        raise StudyError(f"{key}: a workload key, not a configuration knob: it cannot be tuned (it changes the "
                         "streams every candidate shares)")
    if name == "router":
        return "cat", None, None, None
    if name == "policy":
        return "cat", None, None, tuple(POLICIES)
    if name in ("capacity_blocks", "replicas", "prefix_blocks"):
        return "int", (0 if name == "capacity_blocks" else 1), INF - 1, None
    if name == "ttl_s":
        return "float", 0.0, (INF - 1) / 1000, None
    d = KNOB_DECLS.get(name)
    if d is None:
        raise StudyError(f"{key}: unknown knob; tunable: {sorted(set(_CONFIG_KEYS) | set(KNOB_DECLS))}")
    if d.kind == "view":
        return "cat", None, None, tuple(d.choices)
    if d.kind == "bool":
        return "cat", None, None, (False, True)
    return d.kind, d.lo, d.hi, None


def _knob(name: str, spec, variants: dict) -> Knob:
    key = f"tune.knobs.{name}"
    kind, lo, hi, choices = _declared(name)
    if not isinstance(spec, dict):
        raise StudyError(f"{key}: give {{low: X, high: Y}} or {{values: [...]}}, got {spec!r}")
    bad = sorted(set(spec) - {"low", "high", "values", "grid", "log"})
    if bad:
        raise StudyError(f"{key}.{bad[0]}: unknown key; known keys are ['grid', 'high', 'log', 'low', 'values']")
    if "values" in spec or kind == "cat":
        vals = spec.get("values", list(choices) if choices else None)
        if not isinstance(vals, (list, tuple)) or not vals:
            raise StudyError(f"{key}.values: empty (give a non-empty list of values)")
        if len(set(map(str, vals))) != len(vals):
            raise StudyError(f"{key}.values has repeated values: {list(vals)}")
        for v in vals:
            if name == "router" and (not isinstance(v, str) or v not in ROUTERS and v not in PRESETS
                                     and v not in variants):
                raise StudyError(f"{key}.values: unknown router {v!r}: a rule {sorted(ROUTERS)}, a preset "
                                 f"{sorted(PRESETS)} or a name under fleet.variants {sorted(variants)}")
            if choices is not None and v not in choices:
                raise StudyError(f"{key}.values: {v!r} is not one of {list(choices)}")
            if kind in ("int", "float") and (isinstance(v, bool) or not isinstance(v, (int, float))
                                             or not lo <= v <= (hi if hi is not None else math.inf)):
                raise StudyError(f"{key}.values: {v!r} outside the knob's range [{lo}, {hi}]")
        return Knob(name, "cat", values=tuple(vals), grid=tuple(spec.get("grid") or ()))
    if "low" not in spec or "high" not in spec:
        raise StudyError(f"{key}: give both low and high (or values: [...])")
    low, high = spec["low"], spec["high"]
    for k, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise StudyError(f"{key}.{k} must be a finite number, got {v!r}")
    if not low < high:
        raise StudyError(f"{key}: empty bounds [{low}, {high}] (low must be below high)")
    if low < lo or (hi is not None and high > hi):
        raise StudyError(f"{key}: bounds [{low}, {high}] outside the knob's declared range [{lo}, {hi}]")
    log = bool(spec.get("log", False))
    if log and low <= 0:
        raise StudyError(f"{key}.log needs low > 0, got {low}")
    grid = tuple(spec.get("grid") or ())
    for v in grid:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
            raise StudyError(f"{key}.grid: {v!r} outside the bounds [{low}, {high}]")
    return Knob(name, kind, float(low), float(high), grid=tuple(int(v) if kind == "int" else float(v) for v in grid),
                log=log)


def _rule(router: str, variants: dict) -> str:
    """The routing rule behind a router name (a rule, a preset or a ``fleet.variants`` entry)."""
    for _ in range(4):
        if router in ROUTERS:
            return router
        spec = (variants.get(router) or {}) if router in variants else PRESETS.get(router, {})
        router = str(spec.get("router", router))
    return router


def unused_knobs(values: dict, variants: dict) -> list[str]:
    """The knobs of ``values`` that do not apply to its router: a rule's own knob (``chwbl_c_pct``, ...) where
    the candidate's router is another rule."""
    if "router" not in values:
        return []
    from cacheresearch.routers.registry import REGISTRY  # noqa: PLC0415

    owner = {k.name: r.name for r in REGISTRY.routers() for k in r.knobs}
    rule = _rule(str(values["router"]), variants)
    return [k for k in values if k in owner and owner[k] != rule]


def _effective(values: dict, variants: dict) -> tuple:
    """A candidate as the configuration it runs: the knobs that apply to its router."""
    drop = set(unused_knobs(values, variants))
    return tuple((k, v) for k, v in values.items() if k not in drop)


def _tied_best(spec: "TuneSpec", hist: dict, best: tuple, variants: dict) -> tuple[tuple, list]:
    """Among the feasible candidates with exactly the best objective: the one with the smallest numeric knobs (the
    smallest capacity that reaches the best), and every distinct configuration tied with it."""
    _, bg, bi = best
    b = hist["obj"][bg][bi]
    tied = {}
    for g, (vals, obj, viol) in enumerate(zip(hist["values"], hist["obj"], hist["viol"])):
        for i, v in enumerate(vals):
            if viol[i] == 0 and obj[i] == b and hist["viol"][bg][bi] == 0:
                tied.setdefault(_effective(v, variants), (g, i))
    if len(tied) <= 1:
        return (bg, bi), []
    num = [k.name for k in spec.knobs if k.kind != "cat"]
    key = lambda e: tuple(dict(e).get(n, 0) for n in num)  # noqa: E731
    order = sorted(tied, key=key)
    return tied[order[0]], [dict(e) for e in order]


# ------------------------------------------------------------------------------ the configuration
@dataclass(frozen=True)
class TuneSpec:
    benchmark: str | None
    method: str
    population: int
    generations: int
    search_seed: int
    objective: dict  # {metric: weight}
    slo: list  # [(metric, "max" | "min", bound)]
    knobs: list
    penalty: float
    sigma0: float
    grid_points: int
    holdout: list
    progress: bool
    cost: dict


def _tune_node(cfg) -> dict:
    node = cfg.get("tune") if hasattr(cfg, "get") else None
    if node is not None and not isinstance(node, dict):
        node = OmegaConf.to_container(node, resolve=True)
    node = dict(node or {})
    for k in node:
        if k not in DEFAULTS:
            raise StudyError(f"tune.{k}: unknown key; known keys are {sorted(DEFAULTS)}")
    cost = dict(DEFAULTS["cost"], **(node.get("cost") or {}))
    for k in cost:
        if k not in DEFAULTS["cost"]:
            raise StudyError(f"tune.cost.{k}: unknown key; known keys are {sorted(DEFAULTS['cost'])}")
    return dict(DEFAULTS, **dict(node, cost=cost))


def _metric(key: str, name, produced: dict) -> str:
    if not isinstance(name, str) or name not in produced:
        extra = (" (a metric of the vllm replica: set replica.scheduler=vllm)" if name in VLLM_METRICS else "")
        raise StudyError(f"{key}: {name!r} is not a metric the replica model produces{extra}; choose one of "
                         f"{sorted(produced)}")
    return name


def _slo(node, produced) -> list:
    if not isinstance(node, dict):
        raise StudyError(f"tune.slo must be a mapping {{METRIC: {{max: X}} | {{min: Y}}}}, got {node!r}")
    out = []
    for name, spec in node.items():
        key = f"tune.slo.{name}"
        _metric(key, name, produced)
        if isinstance(spec, str):
            s = spec.replace(" ", "")
            if s[:2] not in ("<=", ">="):
                raise StudyError(f"{key}: write '<= X' or '>= Y', got {spec!r}")
            spec = {"max" if s[:2] == "<=" else "min": s[2:]}
        if not isinstance(spec, dict) or not spec or set(spec) - {"max", "min"}:
            raise StudyError(f"{key}: give {{max: X}} and / or {{min: Y}}, got {spec!r}")
        for side, v in spec.items():
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise StudyError(f"{key}.{side} must be a number, got {v!r}") from None
            if not math.isfinite(v):
                raise StudyError(f"{key}.{side} must be finite, got {v}")
            out.append((name, side, v))
    return out


def parse_tune(cfg) -> TuneSpec:
    """``cfg.tune`` checked (every error names its key)."""
    t = _tune_node(cfg)
    if t["method"] not in METHODS:
        raise StudyError(f"tune.method={t['method']!r}: choose one of {list(METHODS)}")
    for k, lo in (("population", 2), ("generations", 1), ("grid_points", 2), ("holdout_seeds", 0)):
        v = t[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise StudyError(f"tune.{k} must be an integer >= {lo}, got {v!r}")
    if t["benchmark"] not in (None, "llmd"):
        raise StudyError(f"tune.benchmark={t['benchmark']!r}: null (the composed workload and fleet) or llmd "
                         "(experiment=llmd_benchmark's precise arm: its EPP scorer weights)")
    produced = (dict(LLMD_METRICS) if t["benchmark"] == "llmd"
                else dict(METRICS, **(VLLM_METRICS if _scheduler(cfg) == "vllm" else {})))
    obj = t["objective"]
    obj = {obj: 1.0} if isinstance(obj, str) else obj
    if not isinstance(obj, dict) or not obj:
        raise StudyError(f"tune.objective: a metric name or {{METRIC: WEIGHT, ...}}, got {t['objective']!r}")
    for m, w in obj.items():
        _metric(f"tune.objective.{m}" if len(obj) > 1 or not isinstance(t["objective"], str) else "tune.objective",
                m, produced)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise StudyError(f"tune.objective.{m}: the weight must be a finite number, got {w!r}")
    knobs = t["knobs"]
    if not isinstance(knobs, dict) or not knobs:
        raise StudyError("tune.knobs: give at least one knob ({NAME: {low: X, high: Y}} or {NAME: {values: [...]}})")
    variants = _variants(cfg)
    ks = [_knob(str(n), s, variants) for n, s in knobs.items()]
    if t["benchmark"] == "llmd":
        for k in ks:
            if k.name not in LLMD_KNOBS:
                raise StudyError(f"tune.knobs.{k.name}: tune.benchmark=llmd tunes the EPP scorer weights "
                                 f"{sorted(LLMD_KNOBS)} only")
    pricing = t["cost"]["pricing"]
    if pricing is not None and pricing not in PRICING_PRESETS:
        raise StudyError(f"tune.cost.pricing={pricing!r}: choose one of {sorted(PRICING_PRESETS)} or null")
    for k in ("gpu_usd_per_hour", "gpus_per_replica"):
        v = t["cost"][k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise StudyError(f"tune.cost.{k} must be a number >= 0, got {v!r}")
    for k in ("penalty", "sigma0"):
        if isinstance(t[k], bool) or not isinstance(t[k], (int, float)) or not t[k] > 0:
            raise StudyError(f"tune.{k} must be a positive number, got {t[k]!r}")
    h0 = t["holdout_seed"]
    if isinstance(h0, bool) or not isinstance(h0, int) or h0 < 0:
        raise StudyError(f"tune.holdout_seed must be an integer >= 0, got {h0!r}")
    return TuneSpec(t["benchmark"], t["method"], t["population"], t["generations"], int(t["search_seed"]),
                    {m: float(w) for m, w in obj.items()}, _slo(t["slo"] or {}, produced), ks, float(t["penalty"]),
                    float(t["sigma0"]), t["grid_points"], [h0 + i for i in range(t["holdout_seeds"])],
                    bool(t["progress"]), t["cost"])


def _get(cfg, dotted, default=None):
    v = OmegaConf.select(cfg, dotted, default=default) if not isinstance(cfg, dict) else default
    return default if v is None else v


def _scheduler(cfg) -> str:
    return str(_get(cfg, "replica.scheduler", "fcfs"))


def _variants(cfg) -> dict:
    v = OmegaConf.select(cfg, "fleet.variants", default=None) if not isinstance(cfg, dict) else None
    return {} if v is None else dict(OmegaConf.to_container(v, resolve=True) if not isinstance(v, dict) else v)


# ------------------------------------------------------------------------------ workloads and cells
def _workload(cfg, seed: int):
    """The workload of the composed configuration (sources tenant, fleet, design; stable layout) for ``seed``."""
    src = str(_get(cfg, "workload.source", "tenant"))
    node = OmegaConf.select(cfg, f"workload.{src}", default=None)
    if src not in ("tenant", "fleet", "design") or node is None:
        raise StudyError(f"workload.source={src!r}: experiment=tune runs on the synthetic sources tenant, fleet "
                         "and design")
    args = OmegaConf.to_container(node, resolve=True)
    if args.pop("layout", "stable") != "stable":
        raise StudyError(f"workload.{src}.layout: experiment=tune runs the stable layout only")
    try:
        if src == "tenant":
            n_req = args.pop("n_requests")
            if n_req is not None:
                args["duration_s"] = float(n_req) / float(args["rate_per_s"])
            return tenant_workload(**args, seed=seed)
        if src == "fleet":
            return fleet_workload(**args, seed=seed)
        return design_workload(**args, seed=seed)
    except (TypeError, ValueError) as e:
        raise StudyError(f"workload.{src}: {e}") from None


def _base(cfg) -> dict:
    knobs = OmegaConf.select(cfg, "fleet.knobs", default=None)
    knobs = {k: v for k, v in (OmegaConf.to_container(knobs, resolve=True) if knobs is not None else {}).items()
             if v is not None}
    return dict(router=str(_get(cfg, "fleet.router", "round_robin")), policy=str(_get(cfg, "cache.policy", "lru")),
                capacity_blocks=_get(cfg, "cache.capacity_blocks"), ttl_s=_get(cfg, "cache.ttl_s"),
                replicas=int(_get(cfg, "fleet.replicas", 1)), prefix_blocks=int(_get(cfg, "fleet.prefix_blocks", 80)),
                knobs=knobs)


def _params(cfg, base: dict, values: dict):
    """The Params of a candidate: the base configuration with the knobs' ``values``."""
    c = dict(base, knobs=dict(base["knobs"]))
    for k, v in values.items():
        if k in _CONFIG_KEYS:
            c[k] = v
        else:
            c["knobs"][k] = v
    router, knobs = c["router"], {}
    variants = _variants(cfg)
    if router in variants:
        knobs = dict(variants[router])
        router = knobs.pop("router")
    knobs.update(c["knobs"])
    step = None
    if _scheduler(cfg) == "vllm":
        step = str(_get(cfg, "replica.step_model", DEFAULT_STEP_PRESET))
    try:
        return make_params(c["policy"], capacity_blocks=c["capacity_blocks"], ttl_s=c["ttl_s"], replicas=c["replicas"],
                           router=router, prefix_blocks=c["prefix_blocks"], latency=str(_get(cfg, "fleet.latency",
                                                                                               "h100_8b")),
                           step_model=step, **knobs)
    except ValueError as e:
        raise StudyError(f"tune: candidate {values}: {e}") from None


def _program_key(p) -> tuple:
    """The state shape a configuration's program has (:mod:`cacheresearch.core.run` groups cells so)."""
    cache = int(p.router) in {ROUTERS[n] for n in CACHE_ROUTERS}
    block = {POLICIES[n].id for n in BLOCK_POLICY_IDS}
    return (bool(cache and int(p.view) == VIEWS["approximate"]), bool(cache and int(p.view) == VIEWS["stale"]),
            int(p.policy) in PRIORITY_IDS, int(p.policy) == S3FIFO_ID, int(p.policy) if int(p.policy) in block else -1)


def _anchors(cfg, base, knobs) -> dict:
    """{program key: [Params]}: one configuration per router / policy / view value the knobs allow, so each
    generation's program compiles the same router rules at the same size."""
    cat = [k for k in knobs if k.kind == "cat" and k.name in ("router", "policy", "view")]
    mid = {k.name: k.decode(0.5) for k in knobs}
    out: dict = {}
    for combo in itertools.product(*(k.values for k in cat)):
        p = _params(cfg, base, dict(mid, **dict(zip((k.name for k in cat), combo))))
        out.setdefault(_program_key(p), []).append(p)
    return out


class _Engine:
    """The streams, the static options and the padded cells of one search."""

    def __init__(self, cfg, spec: TuneSpec):
        self.cfg, self.spec, self.base = cfg, spec, _base(cfg)
        self.seeds = B.seeds(cfg)
        self.anchors = _anchors(cfg, self.base, spec.knobs)
        reps = [int(self.base["replicas"])]
        for k in spec.knobs:
            if k.name == "replicas":
                reps += [int(v) for v in k.values] if k.kind == "cat" else [int(k.high)]
        self.max_replicas = max(reps)
        every = [p for ps in self.anchors.values() for p in ps]
        if any(k.name == "instances" for k in spec.knobs) or any(k.name == "max_num_seqs" for k in spec.knobs):
            corner = {k.name: k.decode(1.0) for k in spec.knobs if k.name in ("instances", "max_num_seqs")}
            every.append(_params(cfg, self.base, corner))
        opts = dict(queue_slots=int(_get(cfg, "engine.queue_slots", 256)), scheduler=_scheduler(cfg))
        if opts["scheduler"] == "vllm":
            opts["max_running"] = int(max(int(p.max_num_seqs) for p in every))
        m = OmegaConf.select(cfg, "engine.match", default=None) if not isinstance(cfg, dict) else None
        st = static_options(stack_params(every), max_replicas=self.max_replicas,
                            match=None if m is None else bool(m), **opts)
        self.options = dict(per_request=False, backend=str(_get(cfg, "engine.backend", "auto")), **opts,
                            match=st.match, max_instances=st.max_instances)
        self.streams, self.duration_s, self.input_tokens = {}, {}, {}

    def streams_for(self, seeds):
        for s in seeds:
            if s not in self.streams:
                w = _workload(self.cfg, s)
                self.streams[s] = compile_stream(w, stateful_singletons=self.options["scheduler"] == "vllm")
                self.duration_s[s] = max(float(np.max(w.arrival_ms)) / 1000.0, 1e-9)
                self.input_tokens[s] = int(w.input_tokens.sum())
        return [self.streams[s] for s in seeds]

    def cells(self, params: list, seeds: list, pad: bool = True):
        """Cells of ``params`` x ``seeds`` padded per program (``pad``); returns (Cells, index of each real cell)."""
        streams = self.streams_for(seeds)
        P = self.spec.population if pad else 0
        by_key: dict = {}
        for i, p in enumerate(params):
            by_key.setdefault(_program_key(p), []).append(i)
        cp, cs, sd, real = [], [], [], {}
        for key, idx in by_key.items():
            anchors = self.anchors.get(key, []) if pad else []
            size = max(P, len(idx)) + len(anchors)
            fill = [params[i] for i in idx] + anchors
            group = fill + [fill[j % len(fill)] for j in range(size - len(fill))]
            for j, p in enumerate(group):
                for si, s in enumerate(seeds):
                    if j < len(idx):
                        real[(idx[j], si)] = len(cp)
                    cp.append(p)
                    cs.append(si)
                    sd.append(s)
        return Cells(streams, cs, cp, sd, max_replicas=self.max_replicas, options=dict(self.options)), real


# ------------------------------------------------------------------------------ metrics and cost
def usd_per_day(replicas, hit_tokens, input_tokens, duration_s, cost: dict) -> tuple:
    """(total, GPU, tokens) in dollars per day: ``replicas x gpus_per_replica x gpu_usd_per_hour x 24`` (GPU hours:
    every replica is billed all day) + with ``cost["pricing"]`` (a :data:`cacheresearch.analysis.pricing.PRESETS`
    name) the prompt tokens billed per day: missed tokens at the write multiplier (cache creation), hit tokens at
    the read multiplier, times the base price, scaled from the run's ``duration_s`` to a day."""
    gpu = np.asarray(replicas, float) * float(cost["gpus_per_replica"]) * float(cost["gpu_usd_per_hour"]) * 24.0
    tok = np.zeros_like(gpu)
    if cost.get("pricing"):
        pr = PRICING_PRESETS[cost["pricing"]]
        hit, inp = np.asarray(hit_tokens, float), np.asarray(input_tokens, float)
        tok = (pr.base_per_mtok / 1e6 * ((inp - hit) * pr.write_multiplier + hit * pr.read_multiplier)
               * B.DAY / np.asarray(duration_s, float))
    return gpu + tok, gpu, tok


def _metrics_of(m, real: dict, n: int, seeds: list, eng: _Engine, replicas) -> dict:
    """{metric: float [n]} (mean over the seeds) of the real cells."""
    S = len(seeds)
    idx = np.asarray([[real[(i, s)] for s in range(S)] for i in range(n)], np.int64)
    names = list(METRICS) + (list(VLLM_METRICS) if eng.options["scheduler"] == "vllm" else [])
    hit = combine_limbs(np.asarray(m.hit_tokens_hi), np.asarray(m.hit_tokens_lo)).astype(float)[idx]
    inp = np.asarray([[eng.input_tokens[s] for s in seeds]] * n, float)
    dur = np.asarray([[eng.duration_s[s] for s in seeds]] * n, float)
    tot, gpu, tok = usd_per_day(np.asarray(replicas, float)[:, None] + 0 * hit, hit, inp, dur, eng.spec.cost)
    out = {"usd_per_day": tot, "gpu_usd_per_day": gpu, "token_usd_per_day": tok}
    util = np.asarray(m.utilisation, float)
    out["utilisation_max"] = util.reshape(util.shape[0], -1).max(axis=1)[idx]
    for k in names:
        if k not in out:
            a = np.asarray(getattr(m, _MS.get(k, k)), float)[idx]
            out[k] = a / 1000.0 if k in _MS else a
    return {k: np.asarray(v, float).mean(axis=1) for k, v in out.items()}


def _score(spec: TuneSpec, met: dict):
    """(objective, violation, constraint values [n, C], penalised) of the candidates."""
    obj = sum(w * met[m] for m, w in spec.objective.items())
    cons = np.stack([met[m] for m, _, _ in spec.slo], axis=1) if spec.slo else np.zeros((len(obj), 0))
    viol = np.zeros(len(obj))
    for j, (_, side, b) in enumerate(spec.slo):
        miss = cons[:, j] - b if side == "max" else b - cons[:, j]
        viol += np.maximum(miss, 0.0) / max(abs(b), 1e-12)
    viol = np.where(np.isfinite(viol), viol, np.inf)
    obj = np.where(np.isfinite(obj), obj, np.inf)
    return obj, viol, cons, obj + spec.penalty * viol


# ------------------------------------------------------------------------------ the search
class _Search:
    """Ask-tell over the unit cube: ``ask(g)`` gives the coordinates [n, K] of generation ``g``; ``tell`` ranks."""

    def __init__(self, spec: TuneSpec):
        self.spec, K = spec, len(spec.knobs)
        if spec.method == "grid":
            pts = list(itertools.product(*(k.grid_values(spec.grid_points) for k in spec.knobs)))
            self.points = np.asarray([[k.encode(v) for k, v in zip(spec.knobs, p)] for p in pts], float)
            self.generations = -(-len(self.points) // spec.population)
        else:
            self.generations = spec.generations
        if spec.method == "cma":
            import cma  # noqa: PLC0415

            saved = np.random.get_state()
            minstd = [0.25 / k.levels if 1 < k.levels <= 64 else 0.0 for k in spec.knobs]
            self.es = cma.CMAEvolutionStrategy([0.5] * K, spec.sigma0, {
                "popsize": spec.population, "seed": 7919 * spec.search_seed + 1, "bounds": [0.0, 1.0],
                "minstd": minstd, "verbose": -9, "verb_log": 0, "verb_disp": 0, "tolx": 0, "tolfun": 0,
                "tolflatfitness": 10 ** 9, "tolstagnation": 10 ** 9, "tolfunhist": 0})
            self.rng_state = np.random.get_state()  # cma draws from NumPy's global generator: kept apart
            np.random.set_state(saved)

    def ask(self, g: int) -> np.ndarray:
        s = self.spec
        if s.method == "grid":
            return self.points[g * s.population:(g + 1) * s.population]
        if s.method == "random":
            return np.random.default_rng([s.search_seed, g]).random((s.population, len(s.knobs)))
        saved = np.random.get_state()
        np.random.set_state(self.rng_state)
        self.x = self.es.ask()
        self.rng_state = np.random.get_state()
        np.random.set_state(saved)
        return np.clip(np.asarray(self.x, float), 0.0, 1.0)

    def tell(self, penalised: np.ndarray):
        if self.spec.method != "cma":
            return
        saved = np.random.get_state()
        np.random.set_state(self.rng_state)
        finite = np.where(np.isfinite(penalised), penalised, np.nanmax(np.where(np.isfinite(penalised), penalised,
                                                                                 -np.inf), initial=0) * 10 + 1e9)
        self.es.tell(self.x, [float(v) for v in finite])
        self.rng_state = np.random.get_state()
        np.random.set_state(saved)


def _log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def _engine_eval(cfg, eng: _Engine, vals: list, seeds: list, pad: bool = True):
    """Generator: one engine call for candidates ``vals`` on ``seeds``; returns ({metric: [n]} per seed list, cells)."""
    params = [_params(cfg, eng.base, v) for v in vals]
    cells, real = eng.cells(params, seeds, pad=pad)
    m = yield cells
    reps = [int(p.replicas) for p in params]
    if pad:
        return _metrics_of(m, real, len(params), seeds, eng, reps), len(cells.params)
    per = [_metrics_of(m, {(i, 0): real[(i, j)] for i in range(len(params))}, len(params), [s], eng, reps)
           for j, s in enumerate(seeds)]
    return {k: np.stack([d[k] for d in per], axis=1) for k in per[0]}, len(cells.params)


def _epp_file(weights: dict, out_dir) -> str:
    """The bundled precise EPP file with the scorer weights of ``weights`` (knob -> pct) written to ``out_dir``."""
    import yaml  # noqa: PLC0415

    from cacheresearch.studies.llmd_benchmark import BUNDLED, BUNDLED_EPP  # noqa: PLC0415

    doc = yaml.safe_load((BUNDLED / BUNDLED_EPP["precise"]).read_text())
    plugins = doc["schedulingProfiles"][0]["plugins"]
    for knob, ref in LLMD_KNOBS.items():
        if knob in weights:
            for pl in plugins:
                if pl.get("pluginRef") == ref:
                    pl["weight"] = float(weights[knob]) / 100.0
    text = yaml.safe_dump(doc, sort_keys=False)
    import hashlib  # noqa: PLC0415

    path = f"{out_dir}/epp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _llmd_eval(cfg, vals: list, seed: int, published: bool = False):
    """Generator: the llm-d benchmark (experiment=llmd_benchmark) with one arm per candidate (the precise EPP file
    with the candidate's weights) in one engine call; returns ({metric: [n, 1]}, ttft_p90_s [n, stage])."""
    import tempfile  # noqa: PLC0415

    from cacheresearch.studies.llmd_benchmark import BUNDLED, BUNDLED_EPP, llmd_benchmark_study  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as d:
        epp = {f"c{i}": _epp_file(v, d) for i, v in enumerate(vals)}
        if published:
            epp["published"] = str(BUNDLED / BUNDLED_EPP["precise"])
        c = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else dict(cfg)
        c["llmd"] = dict(c.get("llmd") or {}, epp=epp, seed=int(seed))
        c["kind"] = "llmd_benchmark"
        ds = yield from llmd_benchmark_study(OmegaConf.create(c))
    met = {k: ds[k].values[:, None].astype(float) for k in LLMD_METRICS}
    return met, ds.ttft_p90_s.values.astype(float), ds.stage_rate.values


def tune_study(cfg):
    """The study: one engine call per generation, then one for the winner on the holdout seeds."""
    t0 = time.perf_counter()
    spec = parse_tune(cfg)
    llmd = spec.benchmark == "llmd"
    eng = None if llmd else _Engine(cfg, spec)
    seeds = B.seeds(cfg)
    search = _Search(spec)
    G = search.generations
    hist = {k: [] for k in ("u", "values", "metrics", "obj", "viol", "cons", "pen", "stage")}
    best, cells_run, extra = None, 0, {}
    for g in range(G):
        u = search.ask(g)
        vals = [{k.name: k.decode(x) for k, x in zip(spec.knobs, row)} for row in u]
        if llmd:
            met, stage, rates = yield from _llmd_eval(cfg, vals, seeds[0], published=g == 0)
            if g == 0:  # the published weights, in sample (not a candidate)
                extra.update(published={k: v[-1] for k, v in met.items()}, published_stage=stage[-1], rates=rates)
                met, stage = {k: v[:-1] for k, v in met.items()}, stage[:-1]
            hist["stage"].append(stage)
            met = {k: v.mean(axis=1) for k, v in met.items()}
            cells_run += len(vals) + (g == 0)
        else:
            met, n = yield from _engine_eval(cfg, eng, vals, eng.seeds)
            cells_run += n
        obj, viol, cons, pen = _score(spec, met)
        search.tell(pen)
        for k, v in (("u", u), ("values", vals), ("metrics", met), ("obj", obj), ("viol", viol), ("cons", cons),
                     ("pen", pen)):
            hist[k].append(v)
        for i in range(len(vals)):
            key = (viol[i] > 0, obj[i] if viol[i] == 0 else pen[i])
            if np.isfinite(key[1]) and (best is None or key < best[0]):
                best = (key, g, i)
        if spec.progress:
            b = "none yet" if best is None else (f"{hist['obj'][best[1]][best[2]]:.6g}"
                                                 + (" (infeasible)" if best[0][0] else ""))
            _log(f"tune: generation {g + 1}/{G} ({len(vals)} candidates, {int((viol == 0).sum())} feasible): "
                 f"best so far {b}")
    if best is None:
        raise StudyError("tune: no candidate gave a finite objective (check tune.objective and the workload)")
    (bg, bi), ties = _tied_best(spec, hist, best, {} if llmd else _variants(cfg))
    hold = None
    if spec.holdout and llmd:
        per, pub = [], []
        for s in spec.holdout:  # the benchmark takes one seed per run: winner and published side by side
            met, stage, _ = yield from _llmd_eval(cfg, [hist["values"][bg][bi]], s, published=True)
            per.append({k: v[0] for k, v in met.items()})
            pub.append({k: v[1] for k, v in met.items()})
            extra.setdefault("holdout_stage", []).append(stage[0])
            extra.setdefault("holdout_published_stage", []).append(stage[1])
            cells_run += 2
        hold = {k: np.concatenate([d[k] for d in per]) for k in per[0]}
        extra["holdout_published"] = {k: np.concatenate([d[k] for d in pub]) for k in pub[0]}
    elif spec.holdout:
        met, n = yield from _engine_eval(cfg, eng, [hist["values"][bg][bi]], spec.holdout, pad=False)
        cells_run += n
        hold = {k: v[0] for k, v in met.items()}
    ds = _dataset(cfg, spec, seeds, hist, (bg, bi), hold, cells_run, t0)
    ds.attrs["best_ties"] = json.dumps(ties, default=str)
    if llmd:
        _llmd_vars(ds, spec, hist, (bg, bi), extra)
    return ds


def _llmd_vars(ds, spec, hist, best, extra):
    """The llm-d benchmark's per-stage TTFT p90 of the best and of the published weights, and their summaries."""
    bg, bi = best
    ds.coords["stage"] = np.arange(len(extra["rates"]))
    ds["stage_rate"] = (("stage",), np.asarray(extra["rates"], float))
    ds["best_stage_ttft_p90_s"] = (("stage",), hist["stage"][bg][bi])
    ds["published_stage_ttft_p90_s"] = (("stage",), extra["published_stage"])
    names = list(ds.metric.values)
    ds["published_metric_value"] = (("metric",), np.asarray([float(extra["published"][n][0]) for n in names]))
    ds["published_objective"] = ((), float(sum(w * extra["published"][m][0] for m, w in spec.objective.items())))
    docs = {"stage_rate": ("stage's request rate", "requests/s"),
            "best_stage_ttft_p90_s": ("client TTFT p90 per stage, the best weights (in sample)", "s"),
            "published_stage_ttft_p90_s": ("client TTFT p90 per stage, the published weights (in sample)", "s"),
            "published_metric_value": ("the published weights' metrics (in sample)", "1"),
            "published_objective": ("the published weights' objective (in sample)",
                                    ds.objective.attrs.get("units", "1")),
            "holdout_stage_ttft_p90_s": ("client TTFT p90 per stage, the best weights, fresh seeds", "s"),
            "holdout_published_stage_ttft_p90_s": ("client TTFT p90 per stage, the published weights, fresh seeds",
                                                   "s"),
            "holdout_published_objective": ("the published weights' objective, mean over the fresh seeds",
                                            ds.objective.attrs.get("units", "1")),
            "stage": ("stage of the benchmark", "1")}
    if "holdout_stage" in extra:
        ds["holdout_stage_ttft_p90_s"] = (("holdout_seed", "stage"), np.stack(extra["holdout_stage"]))
        ds["holdout_published_stage_ttft_p90_s"] = (("holdout_seed", "stage"),
                                                    np.stack(extra["holdout_published_stage"]))
        hp = extra["holdout_published"]
        ds["holdout_published_objective"] = ((), float(np.mean(sum(w * hp[m] for m, w in spec.objective.items()))))
    B.doc(ds, docs)
    ds["stage"].attrs.update(long_name=docs["stage"][0], units="1")


# ------------------------------------------------------------------------------ the dataset
def overrides_of(cfg, values: dict) -> str:
    """The command-line overrides that set ``values`` (knob -> value) in a composed configuration."""
    out = []
    for k, v in values.items():
        key = _CONFIG_KEYS.get(k, f"fleet.knobs.{k}")
        out.append(f"{key}={str(v).lower() if isinstance(v, bool) else v}")
    return " ".join(out)


def _dataset(cfg, spec: TuneSpec, seeds: list, hist: dict, best: tuple, hold, cells_run: int, t0: float):
    G, P, K = len(hist["obj"]), spec.population, len(spec.knobs)
    names = list(hist["metrics"][0])

    def grid(rows, shape_tail=()):
        a = np.full((G, P) + shape_tail, np.nan)
        for g, r in enumerate(rows):
            r = np.asarray(r, float)
            a[g, :len(r)] = r
        return a

    value = grid([[[k.as_number(v[k.name]) for k in spec.knobs] for v in vs] for vs in hist["values"]], (K,))
    valid = grid([np.ones(len(o)) for o in hist["obj"]])
    obj, viol, pen = grid(hist["obj"]), grid(hist["viol"]), grid(hist["pen"])
    cons = grid(hist["cons"], (len(spec.slo),))
    met = np.stack([grid([h[n] for h in hist["metrics"]]) for n in names], axis=-1)
    feas = (viol == 0) & (valid == 1)
    fobj = np.where(feas, obj, np.inf)
    best_so_far = np.minimum.accumulate(fobj.min(axis=1))
    bg, bi = best
    bvals = hist["values"][bg][bi]
    variants = {} if spec.benchmark else _variants(cfg)
    evals = int(np.nansum(valid))
    ds = xr.Dataset(
        {
            "knob_value": (("generation", "candidate", "knob"), value),
            "unit_value": (("generation", "candidate", "knob"), grid(hist["u"], (K,))),
            "objective": (("generation", "candidate"), obj),
            "violation": (("generation", "candidate"), viol),
            "penalised_objective": (("generation", "candidate"), pen),
            "feasible": (("generation", "candidate"), feas.astype(np.int8)),
            "evaluated": (("generation", "candidate"), valid == 1),
            "constraint_value": (("generation", "candidate", "constraint"), cons),
            "metric_value": (("generation", "candidate", "metric"), met),
            "best_so_far": (("generation",), np.where(np.isfinite(best_so_far), best_so_far, np.nan)),
            "evaluations_so_far": (("generation",), np.cumsum(np.nansum(valid, axis=1)).astype(np.int64)),
            "best_objective": ((), float(obj[bg, bi])),
            "best_feasible": ((), np.int8(feas[bg, bi])),
            "best_knob_value": (("knob",), value[bg, bi]),
            "best_metric_value": (("metric",), met[bg, bi]),
            "evaluations": ((), np.int64(evals)),
            "engine_cells": ((), np.int64(cells_run)),
            "best_generation": ((), np.int64(bg)),
            "best_candidate": ((), np.int64(bi)),
        },
        coords={"generation": np.arange(G), "candidate": np.arange(P), "knob": [k.name for k in spec.knobs],
                "constraint": [f"{m} {'<=' if s == 'max' else '>='} {b:g}" for m, s, b in spec.slo],
                "metric": names},
    )
    if hold is not None:
        ho = sum(w * hold[m] for m, w in spec.objective.items())
        ds["holdout_objective_seed"] = (("holdout_seed",), ho)
        ds["holdout_metric_value"] = (("holdout_seed", "metric"), np.stack([hold[n] for n in names], axis=-1))
        ds["holdout_objective"] = ((), float(np.mean(ho)))
        ds["holdout_gap"] = ((), float(np.mean(ho) - obj[bg, bi]))
        ds.coords["holdout_seed"] = np.asarray(spec.holdout, np.int64)
    _document(ds, spec)
    ds.attrs.update(B.common_attrs(cfg, "tune", t0, dict(
        method=spec.method, population=P, generations=G, search_seed=spec.search_seed,
        objective_terms=json.dumps(spec.objective), slo=json.dumps([list(s) for s in spec.slo]),
        seeds=json.dumps(seeds), benchmark=str(spec.benchmark or ""),
        knobs=json.dumps([dict(name=k.name, kind=k.kind, low=k.low, high=k.high,
                                                             values=list(k.values), log=k.log)
                                                        for k in spec.knobs], default=str),
        best_config=json.dumps(bvals, default=str),
        best_unused_knobs=json.dumps(unused_knobs(bvals, variants)),
        best_overrides=(overrides_of(cfg, dict(_effective(bvals, variants))) if spec.benchmark is None
                         else "the precise EPP file's weights: "
                        + ", ".join(f"{LLMD_KNOBS[k]} {v / 100:g}" for k, v in bvals.items())),
        grid_points_total=int(len(_Search(spec).points)) if spec.method == "grid" else -1)))
    return ds


def _document(ds: xr.Dataset, spec: TuneSpec):
    one = next(iter(spec.objective))
    units = dict(METRICS, **VLLM_METRICS, **LLMD_METRICS)
    ou = units[one][1] if len(spec.objective) == 1 and spec.objective[one] == 1.0 else "1"
    terms = " + ".join(f"{w:g} x {m}" for m, w in spec.objective.items())
    docs = {
        "knob_value": ("candidate's knob value (a categorical knob: the index into its values, attrs knobs)", "1"),
        "unit_value": ("candidate's coordinate in the search's unit cube", "1"),
        "objective": (f"objective: {terms} (mean over the seeds)", ou),
        "violation": ("sum of the relative SLO misses (0: feasible)", "1"),
        "penalised_objective": (f"objective + {spec.penalty:g} x violation (what the search ranks)", ou),
        "feasible": ("1 if the candidate meets every SLO", "1"),
        "evaluated": ("the cell holds a candidate (the last grid generation may be shorter)", "1"),
        "constraint_value": ("value of each SLO's metric (mean over the seeds)", "1"),
        "metric_value": ("every metric of the candidate (mean over the seeds; units in attrs metric_units)", "1"),
        "best_so_far": ("lowest feasible objective up to this generation", ou),
        "evaluations_so_far": ("candidates evaluated up to this generation", "1"),
        "best_objective": ("lowest feasible objective found (in sample)", ou),
        "best_feasible": ("1 if the best candidate meets every SLO", "1"),
        "best_knob_value": ("the best candidate's knob values (categorical: index)", "1"),
        "best_metric_value": ("the best candidate's metrics (in sample)", "1"),
        "evaluations": ("candidates evaluated (population x generations; each on every seed)", "1"),
        "engine_cells": ("engine cells run: candidates x seeds, the per-program padding and the holdout", "1"),
        "best_generation": ("generation of the best candidate", "1"),
        "best_candidate": ("index of the best candidate in its generation", "1"),
        "holdout_objective_seed": ("the best candidate's objective on each fresh seed (out of sample)", ou),
        "holdout_metric_value": ("the best candidate's metrics on each fresh seed", "1"),
        "holdout_objective": ("the best candidate's objective, mean over the fresh seeds", ou),
        "holdout_gap": ("holdout objective - in-sample best objective", ou),
        "generation": ("generation of the search", "1"),
        "candidate": ("candidate within a generation", "1"),
        "knob": ("searched knob", "1"),
        "constraint": ("SLO constraint", "1"),
        "metric": ("metric of the replica model", "1"),
        "holdout_seed": ("fresh seed of the out-of-sample evaluation", "1"),
    }
    B.doc(ds, docs)
    for c in ("generation", "candidate", "knob", "constraint", "metric", "holdout_seed"):
        if c in ds.coords:
            ds[c].attrs.update(long_name=docs[c][0], units=docs[c][1])
    units = dict(METRICS, **VLLM_METRICS, **LLMD_METRICS)
    ds.attrs["metric_units"] = json.dumps({m: units[m][1] for m in ds["metric"].values.tolist()})


# ------------------------------------------------------------------------------ text and figures
def _knob_text(ds, vals, skip=()) -> str:
    knobs = json.loads(ds.attrs["knobs"])
    out = []
    for k, v in zip(knobs, vals):
        if k["name"] in skip:
            continue
        out.append(f"{k['name']}={k['values'][int(v)] if k['kind'] == 'cat' else (int(v) if k['kind'] == 'int' else round(float(v), 4))}")  # noqa: E501
    return " ".join(out)


def _ties_text(ds) -> list[str]:
    ties = json.loads(ds.attrs.get("best_ties", "[]"))
    if not ties:
        return []
    keys = [k for k in ties[0] if len({str(t.get(k)) for t in ties}) > 1]
    same = {k: v for k, v in ties[0].items() if k not in keys}
    alts = "; ".join(", ".join(f"{k}={t.get(k, '-')}" for k in keys) for t in ties)
    return [f"tied: {len(ties)} configurations reach exactly the best objective {float(ds.best_objective):.6g}"
            + (f" ({', '.join(f'{k}={v}' for k, v in same.items())})" if same else "") + f": {alts}; the one above "
            "is the first with the smallest numeric knobs (the smallest capacity that reaches the best)"]


def _holdout_slo_text(ds) -> list[str]:
    """The fresh seeds on which the winner misses an SLO (each named, with its value)."""
    if "holdout_metric_value" not in ds:
        return []
    names = [str(m) for m in ds.metric.values]
    out = []
    for m, side, b in json.loads(ds.attrs.get("slo", "[]")):
        if m not in names:
            continue
        v = ds.holdout_metric_value.sel(metric=m).values
        for s, x in zip(ds.holdout_seed.values, v):
            if (x > b) if side == "max" else (x < b):
                out.append(f"out of sample, seed {int(s)} misses the SLO: {m} {x:.4g} {'>' if side == 'max' else '<'} "
                           f"{b:g}")
    return out or [f"out of sample: every fresh seed meets the SLO ({', '.join(map(str, ds.constraint.values))})"
                   if ds.sizes.get("constraint") else "out of sample: no SLO set"]


def summarize_tune(ds: xr.Dataset) -> str:
    a = ds.attrs
    obj = json.loads(a["objective_terms"])
    unused = json.loads(a.get("best_unused_knobs", "[]"))
    lines = B.header(ds) + [
        "",
        f"method {a['method']}: {int(a['generations'])} generations x {int(a['population'])} candidates, "
        f"{int(ds.evaluations)} evaluations ({int(ds.engine_cells)} engine cells with padding and holdout), "
        f"search seed {a['search_seed']}, seeds {a['seeds']}",
        "objective: " + " + ".join(f"{w:g} x {m}" for m, w in obj.items()) + "; SLO: "
        + (", ".join(str(c) for c in ds.constraint.values) or "none"),
        "",
        f"best objective {float(ds.best_objective):.6g}" + ("" if int(ds.best_feasible) else " (INFEASIBLE)")
        + f" at generation {int(ds.best_generation) + 1}, candidate {int(ds.best_candidate)}",
        f"best configuration: {_knob_text(ds, ds.best_knob_value.values, unused)}"
        + (f" ({', '.join(unused)} searched too, but not a knob of this router: left out)" if unused else ""),
        (f"as command-line overrides: {a['best_overrides']}" if not a.get("benchmark") else a["best_overrides"]),
    ]
    lines += _ties_text(ds)
    if "holdout_objective" in ds:
        lines.append(f"out of sample ({ds.sizes['holdout_seed']} fresh seeds "
                     f"{ds.holdout_seed.values.tolist()}): objective {float(ds.holdout_objective):.6g} "
                     f"(per seed {', '.join(f'{v:.4g}' for v in ds.holdout_objective_seed.values)}), gap "
                     f"{float(ds.holdout_gap):+.4g} from the in-sample {float(ds.best_objective):.6g}")
        lines += _holdout_slo_text(ds)
    rows = [["metric", "in sample", "out of sample"]]
    for j, m in enumerate(ds.metric.values):
        ho = f"{float(ds.holdout_metric_value[:, j].mean()):.4g}" if "holdout_metric_value" in ds else "-"
        rows.append([str(m), f"{float(ds.best_metric_value[j]):.4g}", ho])
    lines += ["", "the best candidate's metrics:", B.table(rows)]
    if "best_stage_ttft_p90_s" in ds:
        lines += ["", f"published weights: objective {float(ds.published_objective):.6g} in sample"
                  + (f", {float(ds.holdout_published_objective):.6g} on the fresh seeds"
                     if "holdout_published_objective" in ds else ""),
                  "client TTFT p90 per stage (s):"]
        rows = [["stage", "QPS", "tuned", "published"] + (["tuned, fresh", "published, fresh"]
                                                          if "holdout_stage_ttft_p90_s" in ds else [])]
        for j in range(ds.sizes["stage"]):
            r = [str(j), f"{float(ds.stage_rate[j]):g}", f"{float(ds.best_stage_ttft_p90_s[j]):.3f}",
                 f"{float(ds.published_stage_ttft_p90_s[j]):.3f}"]
            if "holdout_stage_ttft_p90_s" in ds:
                r += [f"{float(ds.holdout_stage_ttft_p90_s[:, j].mean()):.3f}",
                      f"{float(ds.holdout_published_stage_ttft_p90_s[:, j].mean()):.3f}"]
            rows.append(r)
        lines.append(B.table(rows))
    lines += ["", "best so far by generation:"]
    bs = ds.best_so_far.values
    ev = ds.evaluations_so_far.values
    lines.append("  " + "; ".join(f"{g + 1}: {v:.4g} ({e} evals)" for g, (v, e) in enumerate(zip(bs, ev))))
    return "\n".join(lines)


def plot_tune(ds: xr.Dataset):
    """The convergence figure: every candidate's objective and the best so far against evaluations."""
    nk = ds.sizes["knob"]
    f = B.fig(5.5 + 3.6 * nk, 4.2)
    axes = f.subplots(1, 1 + nk)
    ax = axes[0]
    P = ds.sizes["candidate"]
    ev = np.arange(ds.sizes["generation"] * P).reshape(-1, P) + 1
    obj, feas = ds.objective.values, ds.feasible.values == 1
    ax.scatter(ev[feas], obj[feas], s=6, c="tab:blue", alpha=0.5, label="feasible candidate")
    ax.scatter(ev[~feas & np.isfinite(obj)], obj[~feas & np.isfinite(obj)], s=6, c="tab:gray", alpha=0.4,
               label="infeasible candidate")
    ax.step(ds.evaluations_so_far.values, ds.best_so_far.values, where="post", c="k", label="best so far")
    if "holdout_objective" in ds:
        ax.axhline(float(ds.holdout_objective), c="tab:red", ls=":", label="winner out of sample")
    ax.set_xlabel("evaluations (candidates)")
    ax.set_ylabel(_obj_label(ds))
    fin = obj[feas]
    if fin.size:
        lo, hi = np.nanmin(fin), np.nanpercentile(fin, 90)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.05 * (hi - lo + 1e-9))
    ax.legend(fontsize=7)
    ax.set_title(f"{ds.attrs['method']}: {ds.attrs['generations']} generations x {P} candidates", fontsize="small")
    knobs = json.loads(ds.attrs["knobs"])
    gen = np.repeat(np.arange(1, ds.sizes["generation"] + 1)[:, None], P, axis=1)
    for j, (k, kax) in enumerate(zip(knobs, axes[1:])):
        v = ds.knob_value.values[:, :, j]
        ok = np.isfinite(v)
        kax.scatter(gen[ok & ~feas], v[ok & ~feas], s=10, c="tab:gray", alpha=0.5, label="infeasible")
        kax.scatter(gen[ok & feas], v[ok & feas], s=10, c="tab:blue", alpha=0.6, label="feasible")
        if k["name"] not in json.loads(ds.attrs.get("best_unused_knobs", "[]")):  # not a knob of the best's router
            kax.axhline(float(ds.best_knob_value.values[j]), c="k", ls=":", lw=1, label="best")
        kax.set_xticks(range(1, ds.sizes["generation"] + 1))
        if k["kind"] == "cat":  # a categorical knob: its values as categories, not a continuous coordinate
            kax.set_yticks(range(len(k["values"])), [str(x) for x in k["values"]], fontsize="x-small")
            kax.set_ylim(-0.5, len(k["values"]) - 0.5)
        kax.set_xlabel("generation")
        kax.set_ylabel(f"{k['name']}" + (f" ({_KNOB_UNITS.get(k['name'], '')})" if _KNOB_UNITS.get(k['name']) else ""))
        kax.set_title(f"{k['name']}: every candidate", fontsize="small")
        kax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7)
    return f


#: units of the searched knobs on the figure's axes
_KNOB_UNITS = {"capacity_blocks": "blocks per replica", "chwbl_c_pct": "load bound c x 100", "replicas": "replicas",
               "prefix_blocks": "blocks", "ttl_s": "s"}


def _obj_label(ds) -> str:
    ln = ds.objective.attrs.get("long_name", "objective").replace(" (mean over the seeds)", "")
    u = ds.objective.attrs.get("units", "")
    return f"{ln[:50]} ({u})" if u and u != "1" else ln[:60]


def comparison_figure(datasets: list, labels: list):
    """Best so far against evaluations for several searches (e.g. cma on 3 seeds, random, grid)."""
    f = B.fig(7, 4.5)
    ax = f.subplots()
    for ds, lab in zip(datasets, labels):
        ax.step(ds.evaluations_so_far.values, ds.best_so_far.values, where="post", label=lab)
    ax.set_xscale("log")
    ax.set_xlabel("evaluations")
    ax.set_ylabel(_obj_label(datasets[0]))
    ax.legend(fontsize=8)
    return f


STUDIES = [Study("tune", tune_study, summarize_tune, plot_tune, None,
                 "a population search (cma, random, grid) over configuration knobs under an SLO")]

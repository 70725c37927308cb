"""CF attributes of every ``results.nc``: each variable carries ``long_name`` and, where it is a quantity,
``units`` (CF conventions; ``"1"`` for a ratio or a count of things without a unit).

Studies set their own attributes where they build their datasets; :func:`complete` fills what a study left
out from :data:`ATTRS` (coordinates and variables shared by several studies) and from the rules of
:data:`PREFIXES` / :data:`SUFFIXES` (an interval's ends, per-seed values, standard errors, the published value
beside a simulated one take their variable's units), never
overwriting an attribute the study set. The pipeline (:func:`cacheresearch.shell.pipeline.run_study`) calls it
for every study; :func:`missing` lists what is still missing (``tests/test_cf_attrs.py`` asserts it is empty).
Labels (a router's name, a policy, a layout) are strings: they carry ``long_name`` and no ``units``.
"""

from __future__ import annotations

import xarray as xr

__all__ = ["ATTRS", "PREFIXES", "SUFFIXES", "complete", "missing"]

#: name -> (long_name, units or None for a label)
ATTRS: dict[str, tuple[str, str | None]] = {
    # labels
    "arrival": ("arrival process", None),
    "event": ("cache event", None),
    "gpu": ("GPU preset (memory and bandwidth, with its source)", None),
    "kv_dtype": ("KV cache data type", None),
    "layout": ("prompt layout", None),
    "model": ("model preset", None),
    "option": ("caching option (pricing preset or none)", None),
    "plan": ("TTL plan", None),
    "policy": ("eviction policy", None),
    "position": ("where the volatile token sits", None),
    "prefix": ("prefix group (a tenant or a trace root; rest: all others)", "1"),  # "1" where it is an index
    "pricing": ("pricing preset", None),
    "router": ("router (rule, preset or variant)", None),
    "salt": ("cache salt", None),
    "scenario": ("workload scenario", None),
    "tokenizer": ("tokenizer", None),
    "trace": ("trace file", None),
    "workload": ("workload", None),
    "best_uniform": ("the single option that is cheapest over all prefixes", None),
    "arm": ("benchmark arm (scheduler configuration)", None),
    "stage": ("load stage", "1"),  # the stage index
    "cpu_capacity": ("cpu tier capacity as set in grid.cpu_capacity_blocks (blocks, or a float: multiples of "
                     "the gpu tier)", None),
    "tier": ("KV cache tier (gpu, cpu, pool, disk)", None),
    "pool_router": ("router of the global-pool question", None),
    # quantities
    "base_per_mtok": ("base input price", "USD/Mtok"),
    "block_accesses": ("block accesses of the trace's stream (leaf-first)", "blocks"),
    "block_tokens": ("tokens per block", "tokens"),
    "cache_keys": ("prompt_cache_key values per prefix (0: none sent)", "1"),
    "capacity": ("cache capacity", "blocks"),
    "capacity_blocks": ("KV cache capacity per replica", "blocks"),
    "capacity_share": ("cache capacity as a share of the working set", "1"),
    "capacity_tokens": ("cache capacity", "tokens"),
    "hit_rate_sim_se": ("cluster-robust standard error of hit_rate_sim", "1"),
    "input_tokens": ("input tokens", "tokens"),
    "machines": ("machines the route key hashes over", "1"),
    "node_tokens": ("cache capacity per node", "tokens"),
    "point": ("point of the size grid", "1"),
    "prefix_fraction": ("share of the victim's prompt the probe shares", "1"),
    "rate_per_min": ("requests per minute per prefix", "requests/min"),
    "rate_per_s": ("request rate", "requests/s"),
    "read_multiplier": ("price multiplier of a cache read", "1"),
    "refresh_on_hit": ("TTL refreshed on a hit (1) or fixed from the write (0)", "1"),
    "requests": ("requests", "requests"),
    "requests_per_hour": ("requests per hour per prefix", "requests/h"),
    "root": ("shared root (requests that share a first block)", "1"),
    "seed": ("seed (workload draw and PRNG key)", "1"),
    "sim_duration_s": ("simulated duration", "s"),
    "sim_prefixes": ("simulated prefixes", "1"),
    "sim_requests": ("simulated requests", "requests"),
    "tp": ("tensor-parallel degree", "1"),
    "ttl_s": ("cache TTL", "s"),
    "victim_requests": ("victim requests before each probe", "requests"),
    "write_multiplier": ("price multiplier of a cache write", "1"),
    # the llm-d benchmark (arm x stage; inference-perf's measures, time means over each stage's span)
    "ttft_p90_s": ("time to first token, 90th percentile", "s"),
    "ttft_mean_s": ("time to first token, mean", "s"),
    "ttft_p90_s_pooled": ("time to first token, 90th percentile of the pooled requests", "s"),
    "output_tokens_per_s": ("output token throughput", "tokens/s"),
    "requests_per_s": ("request throughput", "requests/s"),
    "token_hit_rate": ("token hit rate: hit tokens / input tokens", "1"),
    "itl_mean_s": ("inter-token latency, mean (two client timestamps a token, as inference-perf measured)", "s"),
    "tpot_mean_s": ("time per output token, mean", "s"),
    "kv_usage_mean": ("KV blocks in use / KV pool, time mean", "1"),
    "waiting_mean": ("waiting requests per replica, time mean", "requests"),
    "stage_drained": ("the stage's requests all finished before the next stage (1) or not (0)", "1"),
    "n_requests": ("requests", "requests"),
    "preemptions": ("preemptions (recompute)", "1"),
    "dropped": ("requests dropped (queue overflow)", "requests"),
    "timed_out": ("requests whose client gave up at its timeout (inference-perf's load.request_timeout)", "requests"),
    "wall_s": ("wall time of the arm's simulation", "s"),
    "stage_rate": ("the stage's request rate", "requests/s"),
    "stage_duration_s": ("the stage's duration", "s"),
    "stage_warmup": ("a warm-up stage (1), left out of the summaries", "1"),
}

#: prefix -> long_name template ({} is the base variable's long_name); units are the base variable's
PREFIXES = {"published_": "the published report's value: {}"}

#: suffix -> long_name template ({} is the variable's long_name); units are the variable's
SUFFIXES = {
    "_ci_low": "lower end of the 95% interval: {}",
    "_ci_high": "upper end of the 95% interval: {}",
    "_lo": "lower end of the 95% interval: {}",
    "_hi": "upper end of the 95% interval: {}",
    "_seeds": "{}, per seed",
    "_se": "standard error: {}",
    "_all": "{}, summarised over the non-warm-up stages",
    "_run": "{}, over the whole run (idle gaps included)",
}


def _is_label(da: xr.DataArray) -> bool:
    return da.dtype.kind in "OSU"


def _lookup(ds: xr.Dataset, name: str, depth: int = 0):
    """(long_name, units) of ``name``: the study's own attributes, the table, or a prefix / suffix rule."""
    if name in ds.variables and "long_name" in ds[name].attrs:
        a = ds[name].attrs
        return a["long_name"], a.get("units", ATTRS.get(name, (None, None))[1])
    if name in ATTRS:
        return ATTRS[name]
    if depth > 3:
        return None
    for pre, tmpl in PREFIXES.items():
        if name.startswith(pre) and (e := _lookup(ds, name[len(pre):], depth + 1)):
            return tmpl.format(e[0]), e[1]
    for suf, tmpl in SUFFIXES.items():
        if name.endswith(suf) and (e := _lookup(ds, name[: -len(suf)], depth + 1)):
            return tmpl.format(e[0]), e[1]
    return None


def complete(ds: xr.Dataset) -> xr.Dataset:
    """Fill missing ``long_name`` / ``units`` in place (see the module); returns ``ds``."""
    for name in [*ds.data_vars, *ds.coords]:
        da = ds[name]
        a = da.attrs
        if "long_name" in a and ("units" in a or _is_label(da)):
            continue
        entry = ATTRS.get(str(name)) or _lookup(ds, str(name))
        if entry is None:
            continue
        ln, u = entry
        a.setdefault("long_name", ln)
        if u is not None and "units" not in a and not _is_label(da):
            a["units"] = u
        elif u is not None and "units" not in a and str(name) == "capacity":
            a["units"] = u  # a capacity given as text ('inf', '40') is still in blocks
    return ds


def missing(ds: xr.Dataset) -> list[str]:
    """What CF attributes are missing: every variable needs ``long_name``; numeric ones also ``units``."""
    out = []
    for name in [*ds.data_vars, *ds.coords]:
        da = ds[name]
        if "long_name" not in da.attrs:
            out.append(f"{name}: long_name")
        if "units" not in da.attrs and not _is_label(da):
            out.append(f"{name}: units")
    return out

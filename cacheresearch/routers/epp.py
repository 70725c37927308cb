"""Read a Gateway API Inference Extension ``EndpointPickerConfig`` (the llm-d EPP's scheduler file) into
the ``gie`` router's knobs.

Plugins understood (GIE v0.5.1 and llm-d inference scheduler v0.2, the versions of the llm-d
73-capacity benchmark):

* ``prefix-cache-scorer``: estimate mode (default) with ``hashBlockSize`` (bytes, default 64),
  ``maxPrefixBlocksToMatch`` (default 256) and ``lruCapacityPerServer`` (hashes per pod, default
  31,250) -> ``view=approximate``, ``gie_prefix_mode=1``; ``mode: cache_tracking`` (llm-d's precise mode,
  ``indexerConfig.tokenProcessorConfig.blockSize`` tokens, which must equal vLLM's block size) ->
  ``view=precise``, ``gie_prefix_mode=2``;
* ``prefix-cache-scorer`` of later GIE releases: ``blockSize`` (characters) or ``blockSizeTokens`` with
  ``autoTune`` and ``maxPrefixTokensToMatch`` (:func:`estimate_params` says how each release reads them);
* ``precise-prefix-cache-scorer`` (the later name of cache_tracking): ``indexerConfig`` as above, or
  ``tokenProcessorConfig`` at the top of its parameters (llm-d's later layout; where both give a
  ``blockSize`` they must agree); ``indexerConfig.speculativeIndexing: true`` (llm-d inference scheduler
  #659, 2026: the routed pod indexed at the decision, before its KV events) is refused, since the precise view
  sees a prefix when the pod schedules it; ``kvBlockIndexConfig``'s backends (``inMemoryConfig``,
  ``redisConfig``, ``valkeyConfig``) hold the same index;
* ``tokenizer`` (llm-d's later tokenizer plugin, any parameters): it tokenises prompts for the precise scorer,
  which works on the prompts' own token blocks here; it scores nothing and cannot stand in a profile;
* ``queue-scorer``, ``kv-cache-scorer`` (also ``kv-cache-utilization-scorer``), ``load-aware-scorer``
  (``threshold``, default 128);
* ``active-request-scorer`` (llm-d ``pkg/plugins/scorer/active_request.go``, the 37-capacity benchmark's):
  the EPP's own count of requests in flight per pod, ``(cmax - c) / cmax`` -> ``gie_active_w_pct``;
  ``requestTimeout`` (a Go duration string, ``"30s"``, ``"2m"``, ``"1h30m"``; default ``2m``) ->
  ``gie_active_timeout_ms`` (llm-d logs an invalid one and keeps 2 min; here it is an error);
* ``max-score-picker`` (``maxNumOfEndpoints``), ``random-picker`` (``maxNumOfEndpoints``),
  ``single-profile-handler``;
* ``decode-filter`` (llm-d ``pkg/plugins/filter``: ``NewByLabel(RoleLabel, allowsNoLabel=true, decode, both,
  ...)``, the role filter the llm-d benchmark harness's configs put in a single profile): it keeps the pods
  labelled a decode role or not labelled at all, so in aggregated serving (no prefill-only pods, what this
  simulator models) it keeps every pod and changes nothing; ``prefill-filter``, ``pd-profile-handler`` and the
  other disaggregation plugins are refused (prefill / decode disaggregation is not modelled);
* parameters with no effect on a decision, accepted and ignored: ``max-score-picker``'s / ``random-picker``'s
  ``maxNumOfEndpoints`` (endpoints after the first are fallbacks; the request goes to the first),
  ``indexerConfig.tokenProcessorConfig.hashSeed`` (the seed of the precise index's block hashes, the same on
  the pods' side: which blocks match does not depend on it) and ``indexerConfig.kvBlockIndexConfig``'s
  ``enableMetrics`` / ``metricsLoggingInterval`` (the index's own metrics logging);
* one ``schedulingProfiles`` entry whose ``plugins`` name the plugins by ``pluginRef`` (a plugin's
  ``name``, or its ``type`` when it has none) with their ``weight`` (default 1).

The estimate mode runs on the ``gie_estimate`` view, GIE's own index (:mod:`.gie_index`): prompt bytes
hashed in ``hashBlockSize``-byte blocks, at most ``maxPrefixBlocksToMatch`` of them
(:func:`epp_hash_config` gives the pair, :mod:`cacheresearch.workload.gie_hashes` the hashes under a
bytes-per-token assumption), a per-pod LRU of ``lruCapacityPerServer`` hashes (``gie_lru_capacity``).
An unknown key, plugin type or parameter is an :class:`EppConfigError` naming the file and the key.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

__all__ = ["EppConfigError", "GIE_DEFAULTS", "GIE_LATER", "estimate_params", "DEFAULT_REQUEST_TIMEOUT_MS",
           "go_duration_ms", "read_epp", "epp_knobs", "epp_hash_config"]

#: GIE v0.5.1 ``prefix`` plugin defaults (``DefaultHashBlockSize``, ``DefaultMaxPrefixBlocks``,
#: ``DefaultLRUCapacityPerServer``) and llm-d's load-aware threshold.
GIE_DEFAULTS = dict(hashBlockSize=64, maxPrefixBlocksToMatch=256, lruCapacityPerServer=31_250, threshold=128)
#: later GIE releases' prefix plugin: blocks in tokens (``blockSizeTokens``, default 16), hashed as
#: ``averageCharactersPerToken`` (4) characters each; ``autoTune`` (default true) takes the block size and
#: the LRU capacity from the pods' metrics (vLLM's block size, its number of GPU blocks)
GIE_LATER = dict(blockSizeTokens=16, averageCharactersPerToken=4, autoTune=True)
_LATER_KEYS = ("blockSizeTokens", "autoTune", "maxPrefixTokensToMatch")

_TOP = {"apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "saturationDetector", "data"}
#: top-level sections of later GIE releases accepted without effect here: ``saturationDetector`` (its thresholds
#: only shed sheddable requests, negative priority, which inference-perf never sends) and ``data`` (the data
#: layer's sources); ``featureGates`` may not enable flow control (requests queued in the EPP: not modelled)
_INDEXER = {"tokenProcessorConfig": {"blockSize", "hashSeed"},
            "kvBlockIndexConfig": {"enableMetrics", "metricsLoggingInterval", "inMemoryConfig", "redisConfig",
                                   "valkeyConfig"},
            "prefixStoreConfig": None, "tokenizersPoolConfig": None, "kvEventsConfig": None,
            "speculativeIndexing": None}
_PARAMS = {
    "single-profile-handler": set(),
    "prefix-cache-scorer": {"hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "mode",
                            "indexerConfig", "blockSize", "blockSizeTokens", "autoTune", "maxPrefixTokensToMatch"},
    "precise-prefix-cache-scorer": {"indexerConfig", "kvEventsConfig", "tokenProcessorConfig"},
    "tokenizer": None,  # any parameters: no effect on a decision
    "queue-scorer": set(),
    "kv-cache-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "load-aware-scorer": {"threshold"},
    "active-request-scorer": {"requestTimeout"},
    "max-score-picker": {"maxNumOfEndpoints"},
    "random-picker": {"maxNumOfEndpoints"},
    "decode-filter": set(),
}
#: filters that keep every pod of an aggregated deployment (every serving pod is a decode pod)
_PASS_ALL_FILTERS = {"decode-filter"}
#: prefill / decode disaggregation (two profiles, prefill-only pods): not modelled, refused by name
_DISAGG = {"prefill-filter", "encode-filter", "pd-profile-handler", "disagg-profile-handler", "epd-profile-handler",
           "prefill-header-handler", "prefix-based-pd-decider", "always-disagg-pd-decider"}
_SCORERS = {"prefix-cache-scorer", "precise-prefix-cache-scorer", "queue-scorer", "kv-cache-scorer",
            "kv-cache-utilization-scorer", "load-aware-scorer", "active-request-scorer"}
#: llm-d's active-request scorer: ``defaultRequestTimeout = 2 * time.Minute``
DEFAULT_REQUEST_TIMEOUT_MS = 120_000
_GO_UNITS_NS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
                "h": 3600 * 10**9}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_PICKERS = {"max-score-picker", "random-picker"}


class EppConfigError(ValueError):
    """An EndpointPickerConfig the reader cannot take (the message names the file and the key)."""


def _err(path, key, msg):
    return EppConfigError(f"{path}: {key}: {msg}")


def _pos_int(path, key, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(path, key, f"must be an integer >= 1, got {v!r}")
    return v


def go_duration_ms(text) -> int:
    """A Go ``time.ParseDuration`` string (``"300ms"``, ``"1.5h"``, ``"2h45m"``; no sign) in whole ms
    (floored); ValueError when it is not one or is below 1 ms."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a duration string: {text!r}")
    pos, ns = 0, 0.0
    while pos < len(text):
        mt = _GO_PART.match(text, pos)
        if mt is None:
            raise ValueError(f"not a Go duration (e.g. 30s, 2m, 1h30m): {text!r}")
        ns += float(mt.group(1)) * _GO_UNITS_NS[mt.group(2)]
        pos = mt.end()
    ms = int(ns // 10**6)
    if ms < 1:
        raise ValueError(f"must be at least 1ms, got {text!r}")
    return ms


def read_epp(path) -> dict:
    """The scheduler of one EPP file: ``{"picker", "scorers": [(type, weight, params)], "file"}``."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise EppConfigError(f"{path}: cannot read: {e}") from None
    except yaml.YAMLError as e:
        raise EppConfigError(f"{path}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise _err(path, "(top)", "must be a mapping")
    for k in doc:
        if k not in _TOP:
            raise _err(path, k, f"unknown key; expected {sorted(_TOP)}")
    for k in ("saturationDetector", "data"):
        if k in doc and not isinstance(doc[k], (dict, type(None))):
            raise _err(path, k, "must be a mapping")
    gates = doc.get("featureGates") or []
    if not isinstance(gates, list) or not all(isinstance(g, str) for g in gates):
        raise _err(path, "featureGates", f"must be a list of names, got {gates!r}")
    if any(g.lower() == "flowcontrol" for g in gates):
        raise _err(path, "featureGates", "flowControl (requests queued in the EPP when the pods saturate) is not "
                   "modelled")
    if doc.get("kind", "EndpointPickerConfig") != "EndpointPickerConfig":
        raise _err(path, "kind", f"must be EndpointPickerConfig, got {doc.get('kind')!r}")
    plugins = doc.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise _err(path, "plugins", "must be a non-empty list")
    by_ref = {}
    for i, p in enumerate(plugins):
        where = f"plugins[{i}]"
        if not isinstance(p, dict) or "type" not in p:
            raise _err(path, where, "each plugin needs a type")
        for k in p:
            if k not in ("type", "name", "parameters"):
                raise _err(path, f"{where}.{k}", "unknown key; expected type, name, parameters")
        t = p["type"]
        if t in _DISAGG:
            raise _err(path, f"{where}.type", f"{t} is a prefill / decode disaggregation plugin; disaggregated "
                       "serving (prefill-only pods, two scheduling profiles) is not modelled")
        if t not in _PARAMS:
            raise _err(path, f"{where}.type", f"unknown plugin {t!r}; known: {sorted(_PARAMS)}")
        params = p.get("parameters") or {}
        if not isinstance(params, dict):
            raise _err(path, f"{where}.parameters", "must be a mapping")
        for k in params:
            if _PARAMS[t] is not None and k not in _PARAMS[t]:
                raise _err(path, f"{where}.parameters.{k}", f"unknown parameter of {t}; known: {sorted(_PARAMS[t])}")
        _check_params(path, where, t, params)
        ref = p.get("name", t)
        if ref in by_ref:
            raise _err(path, f"{where}.name", f"plugin {ref!r} is declared twice")
        by_ref[ref] = (t, params)
    profiles = doc.get("schedulingProfiles")
    if not isinstance(profiles, list) or len(profiles) != 1:
        raise _err(path, "schedulingProfiles", "must list exactly one profile (single-profile-handler)")
    prof = profiles[0]
    if not isinstance(prof, dict) or not isinstance(prof.get("plugins"), list):
        raise _err(path, "schedulingProfiles[0].plugins", "must be a list of pluginRef entries")
    for k in prof:
        if k not in ("name", "plugins"):
            raise _err(path, f"schedulingProfiles[0].{k}", "unknown key; expected name, plugins")
    scorers, picker, filters = [], None, []
    for j, e in enumerate(prof["plugins"]):
        where = f"schedulingProfiles[0].plugins[{j}]"
        if not isinstance(e, dict) or "pluginRef" not in e:
            raise _err(path, where, "needs a pluginRef")
        for k in e:
            if k not in ("pluginRef", "weight"):
                raise _err(path, f"{where}.{k}", "unknown key; expected pluginRef, weight")
        ref = e["pluginRef"]
        if ref not in by_ref:
            raise _err(path, f"{where}.pluginRef", f"{ref!r} is not a declared plugin ({sorted(by_ref)})")
        t, params = by_ref[ref]
        w = e.get("weight", 1)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 100:
            raise _err(path, f"{where}.weight", f"must be a number in [0, 100], got {w!r}")
        if t in _SCORERS:
            scorers.append((t, float(w), params))
        elif t in _PICKERS:
            if picker is not None:
                raise _err(path, f"{where}.pluginRef", "a profile has one picker")
            picker = t
        elif t in _PASS_ALL_FILTERS:
            if "weight" in e:
                raise _err(path, f"{where}.weight", f"{t} is a filter: it takes no weight")
            filters.append(t)
        else:
            raise _err(path, f"{where}.pluginRef", f"{t} is not a scorer or picker of a profile")
    if picker is None:
        picker = "max-score-picker"  # GIE's default picker
    kinds = [s[0] for s in scorers]
    for t in set(kinds):
        if kinds.count(t) > 1:
            raise _err(path, "schedulingProfiles[0].plugins", f"scorer {t} appears twice")
    if sum(t in ("prefix-cache-scorer", "precise-prefix-cache-scorer") for t in kinds) > 1:
        raise _err(path, "schedulingProfiles[0].plugins", "one prefix scorer per profile")
    return dict(file=str(path), picker=picker, scorers=scorers, filters=filters)


def _check_params(path, where, t, params):
    if "autoTune" in params and not isinstance(params["autoTune"], bool):
        raise _err(path, f"{where}.parameters.autoTune", f"must be true or false, got {params['autoTune']!r}")
    if "hashBlockSize" in params and any(k in params for k in ("blockSize", "blockSizeTokens")):
        raise _err(path, f"{where}.parameters.hashBlockSize", "give one block size (hashBlockSize of GIE v0.5, "
                   "blockSize or blockSizeTokens of later releases), not several")
    for k in ("hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "threshold", "maxNumOfEndpoints",
              "blockSize", "blockSizeTokens", "maxPrefixTokensToMatch"):
        if k in params:
            _pos_int(path, f"{where}.parameters.{k}", params[k])
    if "requestTimeout" in params:
        try:
            go_duration_ms(params["requestTimeout"])
        except ValueError as e:
            raise _err(path, f"{where}.parameters.requestTimeout", str(e)) from None
    if "mode" in params and params["mode"] not in ("estimate", "cache_tracking"):
        raise _err(path, f"{where}.parameters.mode", f"must be estimate or cache_tracking, got {params['mode']!r}")
    ic = params.get("indexerConfig")
    if ic is not None:
        if not isinstance(ic, dict):
            raise _err(path, f"{where}.parameters.indexerConfig", "must be a mapping")
        for k, v in ic.items():
            if k not in _INDEXER:
                raise _err(path, f"{where}.parameters.indexerConfig.{k}", f"unknown key; known: {sorted(_INDEXER)}")
            allowed = _INDEXER[k]
            if allowed is not None and isinstance(v, dict):
                for k2 in v:
                    if k2 not in allowed:
                        raise _err(path, f"{where}.parameters.indexerConfig.{k}.{k2}",
                                   f"unknown key; known: {sorted(allowed)}")
        tpc = ic.get("tokenProcessorConfig") or {}
        if "blockSize" in tpc:
            _pos_int(path, f"{where}.parameters.indexerConfig.tokenProcessorConfig.blockSize", tpc["blockSize"])
        if ic.get("speculativeIndexing") not in (None, False):
            raise _err(path, f"{where}.parameters.indexerConfig.speculativeIndexing",
                       "speculative indexing (the routed pod indexed at the decision, before its KV events) is not "
                       "modelled: the precise view sees a prefix when the pod schedules it")
    top = params.get("tokenProcessorConfig")
    if top is not None:
        if not isinstance(top, dict):
            raise _err(path, f"{where}.parameters.tokenProcessorConfig", "must be a mapping")
        for k in top:
            if k not in _INDEXER["tokenProcessorConfig"]:
                raise _err(path, f"{where}.parameters.tokenProcessorConfig.{k}",
                           f"unknown key; known: {sorted(_INDEXER['tokenProcessorConfig'])}")
        if "blockSize" in top:
            _pos_int(path, f"{where}.parameters.tokenProcessorConfig.blockSize", top["blockSize"])
            inner = ((ic or {}).get("tokenProcessorConfig") or {}).get("blockSize")
            if inner is not None and inner != top["blockSize"]:
                raise _err(path, f"{where}.parameters.tokenProcessorConfig.blockSize",
                           f"{top['blockSize']}, but indexerConfig.tokenProcessorConfig.blockSize is {inner}")


def _precise_block_size(params) -> tuple[int, str]:
    """The precise index's block size in tokens and the key it came from (llm-d's default: 16)."""
    if "blockSize" in (params.get("tokenProcessorConfig") or {}):
        return int(params["tokenProcessorConfig"]["blockSize"]), "tokenProcessorConfig.blockSize"
    inner = (params.get("indexerConfig") or {}).get("tokenProcessorConfig") or {}
    return int(inner.get("blockSize", 16)), "indexerConfig.tokenProcessorConfig.blockSize"


def _pct(w: float) -> int:
    return int(round(100 * w))


def _estimate(params) -> bool:
    return params.get("mode", "estimate") == "estimate"


def estimate_params(params: dict, *, block_tokens: int | None = None,
                    capacity_blocks: int | None = None) -> dict:
    """The estimate-mode prefix scorer's hash block (bytes), blocks matched and LRU hashes per pod, by the
    GIE release its keys belong to:

    * v0.5 (the series' benchmarks): ``hashBlockSize`` bytes (default 64), ``maxPrefixBlocksToMatch`` (256),
      ``lruCapacityPerServer`` (31,250);
    * a release between: ``blockSize`` in characters (bytes), the same other keys;
    * later releases (any of ``blockSizeTokens``, ``autoTune``, ``maxPrefixTokensToMatch``): blocks of
      ``blockSizeTokens`` tokens (default 16) hashed as 4 characters per token; ``maxPrefixTokensToMatch``
      > 0 sets the blocks matched (tokens // block); ``autoTune`` (default true there) takes the block size
      from the pods' vLLM block size (``block_tokens``) and the LRU capacity from their GPU blocks
      (``capacity_blocks``), as GIE reads them from the pods' metrics.
    """
    later = any(k in params for k in _LATER_KEYS)
    mb = int(params.get("maxPrefixBlocksToMatch", GIE_DEFAULTS["maxPrefixBlocksToMatch"]))
    lru = int(params.get("lruCapacityPerServer", GIE_DEFAULTS["lruCapacityPerServer"]))
    if not later:
        hb = int(params.get("hashBlockSize", params.get("blockSize", GIE_DEFAULTS["hashBlockSize"])))
        return dict(hash_block_bytes=hb, max_blocks=mb, lru_capacity=lru, auto_tune=False)
    auto = bool(params.get("autoTune", GIE_LATER["autoTune"]))
    bst = int(params.get("blockSizeTokens", GIE_LATER["blockSizeTokens"]))
    if auto and block_tokens:
        bst = int(block_tokens)
    if auto and capacity_blocks:
        lru = int(capacity_blocks)
    mt = int(params.get("maxPrefixTokensToMatch", 0) or 0)
    if mt > 0:
        mb = max(1, mt // bst)
    return dict(hash_block_bytes=bst * GIE_LATER["averageCharactersPerToken"], max_blocks=mb, lru_capacity=lru,
                auto_tune=auto)


def epp_hash_config(spec: dict, *, block_tokens: int | None = None,
                    capacity_blocks: int | None = None) -> tuple[int, int] | None:
    """``(hash block bytes, blocks matched)`` of the profile's estimate-mode prefix scorer (None without one):
    :func:`estimate_params`."""
    for t, _, params in spec["scorers"]:
        if t == "prefix-cache-scorer" and _estimate(params):
            e = estimate_params(params, block_tokens=block_tokens, capacity_blocks=capacity_blocks)
            return (e["hash_block_bytes"], e["max_blocks"])
    return None


def epp_knobs(spec: dict, *, block_tokens: int, capacity_blocks: int | None = None) -> dict:
    """The router knobs (``make_params`` keywords) of a :func:`read_epp` result, for a pool of
    ``block_tokens``-token blocks. The estimate mode's hashes are the stream's (:func:`epp_hash_config`)."""
    path = spec["file"]
    if spec["picker"] == "random-picker":
        if spec["scorers"]:
            raise _err(path, "schedulingProfiles[0].plugins", "random-picker ignores scorers; list none")
        return dict(router="random")
    kn = dict(router="gie", gie_prefix_mode=0, gie_prefix_w_pct=0, gie_kv_w_pct=0, gie_queue_w_pct=0,
              gie_load_w_pct=0, gie_active_w_pct=0, view="precise")
    for t, w, params in spec["scorers"]:
        if t == "queue-scorer":
            kn["gie_queue_w_pct"] = _pct(w)
        elif t in ("kv-cache-scorer", "kv-cache-utilization-scorer"):
            kn["gie_kv_w_pct"] = _pct(w)
        elif t == "active-request-scorer":
            kn["gie_active_w_pct"] = _pct(w)
            to = params.get("requestTimeout")
            to_ms = DEFAULT_REQUEST_TIMEOUT_MS if to is None else go_duration_ms(to)
            # a TTL past the engine's int32-ms span never expires within a run: exactly "no expiry" (0)
            kn["gie_active_timeout_ms"] = to_ms if to_ms <= 2**31 - 2 else 0
        elif t == "load-aware-scorer":
            kn["gie_load_w_pct"] = _pct(w)
            kn["gie_load_threshold"] = int(params.get("threshold", GIE_DEFAULTS["threshold"]))
        elif t == "precise-prefix-cache-scorer" or params.get("mode") == "cache_tracking":
            bs, key = _precise_block_size(params)
            if bs != block_tokens:
                raise _err(path, key,
                           f"{bs} tokens, but the pods' blocks are {block_tokens} tokens (cache.block_tokens): "
                           "the precise index would never match")
            kn.update(gie_prefix_mode=2, gie_prefix_w_pct=_pct(w), view="precise")
        else:
            lru = estimate_params(params, block_tokens=block_tokens, capacity_blocks=capacity_blocks)["lru_capacity"]
            kn.update(gie_prefix_mode=1, gie_prefix_w_pct=_pct(w), view="gie_estimate", gie_lru_capacity=lru)
    return kn

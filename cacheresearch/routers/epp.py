"""Read a Gateway API Inference Extension ``EndpointPickerConfig`` (the llm-d EPP's scheduler file) into
the ``gie`` router's knobs.

Plugins understood (GIE v0.5.1 and llm-d inference scheduler v0.2, the versions of the llm-d
73-capacity benchmark; later GIE releases; llm-d-router's prefix-cache producers):

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
* llm-d-router's producers (the llm-d tiered-prefix-cache guide's layout): ``prefix-cache-scorer`` with
  ``prefixMatchInfoProducerName`` (no name: the producer ``approx-prefix-cache-producer``, declared or created
  with its defaults) reads

  - an ``approx-prefix-cache-producer`` (``autoTune``, ``blockSizeTokens``, ``blockSize``,
    ``maxPrefixBlocksToMatch``, ``maxPrefixTokensToMatch``, ``lruCapacityPerServer``: :func:`producer_params`)
    -> ``view=gie_estimate``, ``gie_prefix_mode=1``; a second such scorer over its own producer (the guide's
    ``cpu-prefix-cache-scorer`` over ``cpu-prefix-cache-producer``, ``autoTune: false``, its own
    ``lruCapacityPerServer``) -> ``gie_cpu_w_pct`` and ``gie_cpu_lru_capacity`` (both producers must hash alike:
    one stream carries one hash configuration). In a file that declares no producer, two ``prefix-cache-scorer``
    instances with their own index parameters (the GIE-era layout) read as the same pair;
  - a ``precise-prefix-cache-producer`` (``tokenProcessorConfig.blockSizeTokens`` / ``blockSize`` equal to the pods'
    block size, ``indexerConfig``, ``kvEventsConfig``) -> ``view=precise``, ``gie_prefix_mode=1`` (matched / total),
    no window, and its ``indexerConfig.kvCacheBackendConfigs`` cpu weight (default 0.8; a tier a given list omits
    weighs 1.0) -> ``gie_cpu_tier_w_pct`` (the view over both tiers where the pods have a cpu tier);
    ``speculativeIndexing: true`` and ``sessionManager`` are refused;

  ``prefixLengthWeight`` must be 0 (``maxModelLen`` then has no effect); a producer no scorer reads changes nothing;
* ``no-hit-lru-scorer`` (llm-d's ``NoHitLRU``, the tiered guide's later layout) -> ``gie_nohit_w_pct`` and its
  ``lruSize`` (default 1,024) -> ``gie_nohit_lru_size``: a request is cold when no pod has a hit in the producer it
  reads (``prefixMatchInfoProducerName``; none: llm-d's default producer, taken to be the index of the profile's
  first approximate prefix scorer, the one the router's view holds); it needs an approximate prefix scorer, and a
  named producer must be that scorer's;
* a Helm values file of llm-d's router chart (``router.epp.pluginsCustomConfig``, the entry ``pluginsConfigFile``
  names) or GIE's (``inferenceExtension``): its EndpointPickerConfig is read;
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

__all__ = ["EppConfigError", "GIE_DEFAULTS", "GIE_LATER", "PRODUCER_DEFAULTS", "estimate_params", "producer_params",
           "DEFAULT_REQUEST_TIMEOUT_MS", "go_duration_ms", "read_epp", "epp_knobs", "epp_hash_config"]

#: GIE v0.5.1 ``prefix`` plugin defaults (``DefaultHashBlockSize``, ``DefaultMaxPrefixBlocks``,
#: ``DefaultLRUCapacityPerServer``) and llm-d's load-aware threshold.
GIE_DEFAULTS = dict(hashBlockSize=64, maxPrefixBlocksToMatch=256, lruCapacityPerServer=31_250, threshold=128)
#: later GIE releases' prefix plugin: blocks in tokens (``blockSizeTokens``, default 16), hashed as
#: ``averageCharactersPerToken`` (4) characters each; ``autoTune`` (default true) takes the block size and
#: the LRU capacity from the pods' metrics (vLLM's block size, its number of GPU blocks)
GIE_LATER = dict(blockSizeTokens=16, averageCharactersPerToken=4, autoTune=True)
_LATER_KEYS = ("blockSizeTokens", "autoTune", "maxPrefixTokensToMatch")
#: llm-d-router's ``approx-prefix-cache-producer`` (``dataproducer/approximateprefix/types.go``, ``defaultConfig``):
#: autoTune on, 16-token blocks (never below ``minBlockSizeTokens`` = 64, ``GetBlockSize``), at most 131,072
#: tokens matched (else ``maxPrefixBlocksToMatch``, 2,048; both 0: the whole prompt), 31,250 hashes per pod
PRODUCER_DEFAULTS = dict(autoTune=True, blockSizeTokens=16, minBlockSizeTokens=64, maxPrefixTokensToMatch=131_072,
                         maxPrefixBlocksToMatch=2048, lruCapacityPerServer=31_250)
_PRODUCER_KEYS = ("autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch",
                  "lruCapacityPerServer")
#: the prompt's blocks when a producer matches without a cap (both caps 0): more than any prompt here
_UNLIMITED_BLOCKS = 2**20
#: plugins a file may name that this reader refuses, by name, with the reason
_REFUSED: dict = {}

_TOP = {"apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "saturationDetector", "data"}
#: top-level sections of later GIE releases accepted without effect here: ``saturationDetector`` (its thresholds
#: only shed sheddable requests, negative priority, which inference-perf never sends) and ``data`` (the data
#: layer's sources); ``featureGates`` may not enable flow control (requests queued in the EPP: not modelled)
_INDEXER = {"tokenProcessorConfig": {"blockSize", "blockSizeTokens", "hashSeed"},
            "kvBlockIndexConfig": {"enableMetrics", "metricsLoggingInterval", "inMemoryConfig", "redisConfig",
                                   "valkeyConfig"},
            "prefixStoreConfig": None, "tokenizersPoolConfig": None, "kvEventsConfig": None,
            "speculativeIndexing": None, "kvCacheBackendConfigs": None}
#: llm-d's precise index's tier weights (``kvcache.DefaultKVCacheBackendConfig``); a tier a configured list omits
#: weighs 1.0 (``fillMaxWeights``)
TIER_WEIGHTS = {"gpu": 1.0, "cpu": 0.8}
_PARAMS = {
    "single-profile-handler": set(),
    "prefix-cache-scorer": {"hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "mode",
                            "indexerConfig", "blockSize", "blockSizeTokens", "autoTune", "maxPrefixTokensToMatch",
                            "prefixMatchInfoProducerName", "prefixLengthWeight", "maxModelLen"},
    "approx-prefix-cache-producer": set(_PRODUCER_KEYS),
    "precise-prefix-cache-producer": {"tokenProcessorConfig", "indexerConfig", "kvEventsConfig", "speculativeIndexing",
                                      "speculativeTTL", "sessionManager"},
    "precise-prefix-cache-scorer": {"indexerConfig", "kvEventsConfig", "tokenProcessorConfig"},
    "tokenizer": None,  # any parameters: no effect on a decision
    "queue-scorer": set(),
    "kv-cache-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "load-aware-scorer": {"threshold"},
    "active-request-scorer": {"requestTimeout"},
    "no-hit-lru-scorer": {"lruSize", "prefixMatchInfoProducerName"},
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
            "kv-cache-utilization-scorer", "load-aware-scorer", "active-request-scorer", "no-hit-lru-scorer"}
#: llm-d's no-hit-lru-scorer: ``defaultLRUSize`` (pods its LRU holds)
NOHIT_LRU_SIZE = 1024
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
    doc = _from_values(path, doc)
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
        if t in _REFUSED:
            raise _err(path, f"{where}.type", f"{t}: {_REFUSED[t]}")
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
    for t in set(kinds) - {"prefix-cache-scorer"}:
        if kinds.count(t) > 1:
            raise _err(path, "schedulingProfiles[0].plugins", f"scorer {t} appears twice")
    index = _prefix_indexes(path, scorers, by_ref)
    return dict(file=str(path), picker=picker, scorers=scorers, filters=filters, index=index)


def _prefix_indexes(path, scorers, by_ref) -> list:
    """Per scorer of the profile, the index its prefix score reads: ``("own", params)`` (a GIE-era
    ``prefix-cache-scorer`` with its own index and parameters), ``("producer", name, params)`` (llm-d-router's
    ``prefix-cache-scorer`` reading an ``approx-prefix-cache-producer``, declared or auto-created with its defaults),
    ``("precise",)``, or None (not a prefix scorer). At most two approximate prefix scorers (the tiered guide's GPU
    and CPU scorers, each its own index), or one precise prefix scorer alone."""
    where = "schedulingProfiles[0].plugins"
    producers = {n: p for n, (t, p) in by_ref.items() if t == "approx-prefix-cache-producer"}
    precise = {n: p for n, (t, p) in by_ref.items() if t == "precise-prefix-cache-producer"}
    out, read = [], {}
    for t, _, params in scorers:
        if t == "precise-prefix-cache-scorer" or (t == "prefix-cache-scorer" and not _estimate(params)):
            out.append(("precise",))
        elif t != "prefix-cache-scorer":
            out.append(None)
        elif params.get("prefixMatchInfoProducerName") in precise:  # llm-d-router's precise producer
            name = params["prefixMatchInfoProducerName"]
            if name in read:
                raise _err(path, where, f"two prefix scorers read producer {name!r}; give each its own producer")
            read[name] = True
            out.append(("precise", name, precise[name]))
        elif "prefixMatchInfoProducerName" in params or producers or precise:
            name = params.get("prefixMatchInfoProducerName", "approx-prefix-cache-producer")
            own = sorted(set(params) & (_PARAMS["prefix-cache-scorer"] - {"prefixMatchInfoProducerName",
                                                                          "prefixLengthWeight", "maxModelLen"}))
            if own:
                raise _err(path, f"prefix-cache-scorer.parameters.{own[0]}", "a prefix-cache-scorer that reads a "
                           "producer (prefixMatchInfoProducerName, or a file declaring approx-prefix-cache-producer) "
                           "takes its index parameters from the producer")
            if name not in producers and name in by_ref:
                raise _err(path, "prefix-cache-scorer.parameters.prefixMatchInfoProducerName",
                           f"{name!r} is a {by_ref[name][0]}, not an approx-prefix-cache-producer")
            if name not in producers and "prefixMatchInfoProducerName" in params:
                raise _err(path, "prefix-cache-scorer.parameters.prefixMatchInfoProducerName",
                           f"{name!r} is not a declared plugin ({sorted(by_ref)})")
            if name in read:
                raise _err(path, where, f"two prefix scorers read producer {name!r}; give each its own producer")
            read[name] = True
            out.append(("producer", name, producers.get(name, {})))
        else:
            out.append(("own", params))
        if t == "prefix-cache-scorer" and float(params.get("prefixLengthWeight", 0) or 0) != 0:
            raise _err(path, "prefix-cache-scorer.parameters.prefixLengthWeight",
                       "the prefix length term (prefixLengthWeight > 0) is not modelled; give 0")
    kinds = [x[0] for x in out if x is not None]
    if "precise" in kinds and len(kinds) > 1:
        raise _err(path, where, "a precise prefix scorer beside another prefix scorer is not modelled (an approximate "
                   "CPU-tier scorer needs view gie_estimate, the precise one view precise)")
    if len(kinds) > 2:
        raise _err(path, where, f"{len(kinds)} prefix scorers; at most two approximate ones (a GPU and a CPU tier's)")
    return out


def _from_values(path, doc: dict) -> dict:
    """The EndpointPickerConfig inside a Helm values file (llm-d's router chart: ``router.epp``; GIE's chart:
    ``inferenceExtension``): the ``pluginsCustomConfig`` entry named by ``pluginsConfigFile`` (or its only entry);
    a file that is not one is returned as it is."""
    if "plugins" in doc or "kind" in doc:
        return doc
    router = doc.get("router")
    where, epp = ("router.epp", router.get("epp")) if isinstance(router, dict) else ("inferenceExtension",
                                                                                   doc.get("inferenceExtension"))
    if not isinstance(epp, dict) or "pluginsCustomConfig" not in epp:
        return doc
    custom = epp["pluginsCustomConfig"]
    if not isinstance(custom, dict) or not custom:
        raise _err(path, f"{where}.pluginsCustomConfig", "must map file names to EndpointPickerConfig texts")
    name = epp.get("pluginsConfigFile")
    if name is None and len(custom) == 1:
        name = next(iter(custom))
    if name not in custom:
        raise _err(path, f"{where}.pluginsConfigFile", f"{name!r} is not in pluginsCustomConfig ({sorted(custom)})")
    try:
        inner = yaml.safe_load(custom[name]) if isinstance(custom[name], str) else custom[name]
    except yaml.YAMLError as e:
        raise _err(path, f"{where}.pluginsCustomConfig.{name}", f"not YAML: {e}") from None
    if not isinstance(inner, dict):
        raise _err(path, f"{where}.pluginsCustomConfig.{name}", "must be an EndpointPickerConfig mapping")
    return inner


def _check_params(path, where, t, params):
    if "autoTune" in params and not isinstance(params["autoTune"], bool):
        raise _err(path, f"{where}.parameters.autoTune", f"must be true or false, got {params['autoTune']!r}")
    if "hashBlockSize" in params and any(k in params for k in ("blockSize", "blockSizeTokens")):
        raise _err(path, f"{where}.parameters.hashBlockSize", "give one block size (hashBlockSize of GIE v0.5, "
                   "blockSize or blockSizeTokens of later releases), not several")
    zero_ok = ("maxPrefixBlocksToMatch", "maxPrefixTokensToMatch", "lruCapacityPerServer") \
        if t == "approx-prefix-cache-producer" else ()  # llm-d-router: 0 is "no cap" / "the default"
    for k in ("hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "threshold", "maxNumOfEndpoints",
              "blockSize", "blockSizeTokens", "maxPrefixTokensToMatch", "maxModelLen", "lruSize"):
        if k in params and not (k in zero_ok and params[k] == 0 and not isinstance(params[k], bool)):
            _pos_int(path, f"{where}.parameters.{k}", params[k])
    if "prefixMatchInfoProducerName" in params and not isinstance(params["prefixMatchInfoProducerName"], str):
        raise _err(path, f"{where}.parameters.prefixMatchInfoProducerName", "must be a plugin name")
    w = params.get("prefixLengthWeight", 0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
        raise _err(path, f"{where}.parameters.prefixLengthWeight", f"must be a number in [0, 1], got {w!r}")
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
        _check_tiers(path, where, ic.get("kvCacheBackendConfigs"))
        if ic.get("speculativeIndexing") not in (None, False):
            raise _err(path, f"{where}.parameters.indexerConfig.speculativeIndexing",
                       "speculative indexing (the routed pod indexed at the decision, before its KV events) is not "
                       "modelled: the precise view sees a prefix when the pod schedules it")
    if params.get("speculativeIndexing") not in (None, False):
        raise _err(path, f"{where}.parameters.speculativeIndexing", "speculative indexing (the routed pod indexed at "
                   "the decision, before its KV events) is not modelled: the precise view sees a prefix when the pod "
                   "schedules it")
    if params.get("sessionManager") is not None:
        raise _err(path, f"{where}.parameters.sessionManager", "session-manager lookup is not modelled")
    top = params.get("tokenProcessorConfig")
    if top is not None:
        if not isinstance(top, dict):
            raise _err(path, f"{where}.parameters.tokenProcessorConfig", "must be a mapping")
        for k in top:
            if k not in _INDEXER["tokenProcessorConfig"]:
                raise _err(path, f"{where}.parameters.tokenProcessorConfig.{k}",
                           f"unknown key; known: {sorted(_INDEXER['tokenProcessorConfig'])}")
        if "blockSizeTokens" in top:
            _pos_int(path, f"{where}.parameters.tokenProcessorConfig.blockSizeTokens", top["blockSizeTokens"])
        if "blockSize" in top:
            _pos_int(path, f"{where}.parameters.tokenProcessorConfig.blockSize", top["blockSize"])
            inner = ((ic or {}).get("tokenProcessorConfig") or {}).get("blockSize")
            if inner is not None and inner != top["blockSize"]:
                raise _err(path, f"{where}.parameters.tokenProcessorConfig.blockSize",
                           f"{top['blockSize']}, but indexerConfig.tokenProcessorConfig.blockSize is {inner}")


def _check_tiers(path, where, tiers) -> None:
    key = f"{where}.parameters.indexerConfig.kvCacheBackendConfigs"
    if tiers is None:
        return
    if not isinstance(tiers, list):
        raise _err(path, key, "must be a list of {name, weight}")
    for j, t in enumerate(tiers):
        if not isinstance(t, dict) or set(t) - {"name", "weight", "modelConfigs"} or not isinstance(t.get("name"), str):
            raise _err(path, f"{key}[{j}]", "each entry is {name, weight}")
        w = t.get("weight", 0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 50:
            raise _err(path, f"{key}[{j}].weight", f"must be a number in [0, 50], got {w!r}")


def tier_weights(params) -> dict:
    """The precise producer's tier weights: ``indexerConfig.kvCacheBackendConfigs`` (a tier it omits: 1.0), else
    llm-d's defaults (:data:`TIER_WEIGHTS`)."""
    given = (params.get("indexerConfig") or {}).get("kvCacheBackendConfigs")
    if given is None:
        return dict(TIER_WEIGHTS)
    w = {t["name"]: float(t.get("weight", 0)) for t in given}
    return {"gpu": w.get("gpu", 1.0), "cpu": w.get("cpu", 1.0)}


def _precise_block_size(params) -> tuple[int, str]:
    """The precise index's block size in tokens and the key it came from (llm-d's default: 16)."""
    if "blockSizeTokens" in (params.get("tokenProcessorConfig") or {}):
        return int(params["tokenProcessorConfig"]["blockSizeTokens"]), "tokenProcessorConfig.blockSizeTokens"
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


def producer_params(params: dict, *, block_tokens: int | None = None, capacity_blocks: int | None = None) -> dict:
    """llm-d-router's ``approx-prefix-cache-producer`` (``dataproducer/approximateprefix``: ``GetBlockSize``,
    ``resolveMaxBlocks``, ``makeserver``) with ``params``: blocks of ``blockSizeTokens`` tokens (the deprecated
    ``blockSize`` mapped to it), with ``autoTune`` the pods' block size (``block_tokens``), never below 64 tokens,
    hashed as 4 characters (bytes) per token; ``maxPrefixTokensToMatch // block`` blocks matched when it is set
    (> 0), else ``maxPrefixBlocksToMatch`` (both 0: the whole prompt); per pod an LRU of the pods' GPU blocks with
    ``autoTune`` (``capacity_blocks``), else ``lruCapacityPerServer`` (0: 31,250)."""
    d = PRODUCER_DEFAULTS
    auto = bool(params.get("autoTune", d["autoTune"]))
    bst = int(params.get("blockSizeTokens", params.get("blockSize", d["blockSizeTokens"])))
    if auto and block_tokens:
        bst = int(block_tokens)
    bst = max(bst, d["minBlockSizeTokens"])
    mt = int(params.get("maxPrefixTokensToMatch", d["maxPrefixTokensToMatch"]))
    mb = int(params.get("maxPrefixBlocksToMatch", d["maxPrefixBlocksToMatch"]))
    mb = mt // bst if mt > 0 else (mb if mb > 0 else _UNLIMITED_BLOCKS)
    lru = int(params.get("lruCapacityPerServer", d["lruCapacityPerServer"])) or d["lruCapacityPerServer"]
    if auto and capacity_blocks:
        lru = int(capacity_blocks)
    return dict(hash_block_bytes=bst * GIE_LATER["averageCharactersPerToken"], max_blocks=mb, lru_capacity=lru,
                auto_tune=auto)


def _approx_indexes(spec: dict, block_tokens, capacity_blocks) -> list[tuple[float, dict]]:
    """``(weight, estimate parameters)`` of the profile's approximate prefix scorers, in profile order."""
    out = []
    for (t, w, params), ix in zip(spec["scorers"], spec.get("index") or [None] * len(spec["scorers"])):
        if ix is None and t == "prefix-cache-scorer" and _estimate(params):
            ix = ("own", params)  # a spec built before the producers were read
        if ix is None or ix[0] == "precise":
            continue
        f = estimate_params if ix[0] == "own" else producer_params
        out.append((w, f(ix[-1], block_tokens=block_tokens, capacity_blocks=capacity_blocks)))
    return out


def epp_hash_config(spec: dict, *, block_tokens: int | None = None,
                    capacity_blocks: int | None = None) -> tuple[int, int] | None:
    """``(hash block bytes, blocks matched)`` of the profile's approximate prefix scorer (the first, when the
    tiered guide's CPU scorer reads a second index: :func:`epp_knobs` checks they hash alike; None without one):
    :func:`estimate_params` or :func:`producer_params`."""
    ix = _approx_indexes(spec, block_tokens, capacity_blocks)
    return (ix[0][1]["hash_block_bytes"], ix[0][1]["max_blocks"]) if ix else None


def _precise_producer_knobs(path, name: str, params: dict, w: float, block_tokens: int) -> dict:
    """llm-d-router's ``prefix-cache-scorer`` over a ``precise-prefix-cache-producer``: ``matched / total`` of the
    pods' own blocks (view precise, mode 1, no window), the producer's cpu-tier weight on the view's blocks the pods
    hold in their cpu tier (``gie_cpu_tier_w_pct``; seen only where the pods have one, the numba vllm backend)."""
    bs, key = _precise_block_size(params)
    if bs != block_tokens:
        raise _err(path, f"{name}.{key}", f"{bs} tokens, but the pods' blocks are {block_tokens} tokens "
                   "(cache.block_tokens): the precise index is modelled on the pods' own blocks")
    tw = tier_weights(params)
    if tw["gpu"] != 1.0 or tw["cpu"] <= 0:
        raise _err(path, f"{name}.indexerConfig.kvCacheBackendConfigs", f"gpu {tw['gpu']:g}, cpu {tw['cpu']:g}: "
                   "modelled with the gpu tier at 1 and a positive cpu weight")
    return dict(gie_prefix_mode=1, gie_prefix_w_pct=_pct(w), gie_window_blocks=0, view="precise",
                gie_cpu_tier_w_pct=_pct(tw["cpu"]))


def _nohit_knobs(path, spec: dict, params: dict, w: float) -> dict:
    """llm-d's ``no-hit-lru-scorer``: its weight and ``lruSize``. Its cold test reads the match of the router's view,
    the index of the profile's first approximate prefix scorer: the producer it names must be that one (no name:
    llm-d's default producer, assumed to be it)."""
    key = "no-hit-lru-scorer.parameters.prefixMatchInfoProducerName"
    ixs = [ix for ix in spec.get("index") or [] if ix is not None and ix[0] != "precise"]
    if not ixs:
        raise _err(path, "no-hit-lru-scorer", "its cold test (no pod with a prefix hit) reads an approximate prefix "
                   "index; this profile has no approximate prefix scorer")
    first = ixs[0][1] if ixs[0][0] == "producer" else None
    name = params.get("prefixMatchInfoProducerName") or ""
    if name and name != first:
        raise _err(path, key, f"{name!r}: the cold test is modelled on the index of the profile's first approximate "
                   f"prefix scorer ({first or 'its own index'}) only")
    return dict(gie_nohit_w_pct=_pct(w), gie_nohit_lru_size=int(params.get("lruSize", NOHIT_LRU_SIZE)))


def epp_knobs(spec: dict, *, block_tokens: int, capacity_blocks: int | None = None,
              second_index_at_first_blocks: bool = False) -> dict:
    """The router knobs (``make_params`` keywords) of a :func:`read_epp` result, for a pool of
    ``block_tokens``-token blocks. The estimate mode's hashes are the stream's (:func:`epp_hash_config`); a second
    approximate prefix scorer (the tiered-prefix-cache guide's ``cpu-prefix-cache-scorer`` over its own
    ``approx-prefix-cache-producer``) is the CPU-tier scorer (``gie_cpu_w_pct``, ``gie_cpu_lru_capacity``): the two
    are the same algorithm, each its own index and weight, so which one fills which slot changes no decision.
    Two producers that hash at different block sizes are refused (one stream carries one hash configuration) unless
    ``second_index_at_first_blocks``: an approximation that hashes the second index at the first's block size (and
    matches the first's number of blocks) with the same tokens of capacity (its ``lruCapacityPerServer`` scaled by
    the ratio of the block sizes), so its matched / total differs from the producer's by at most one of the coarser
    blocks."""
    path = spec["file"]
    if spec["picker"] == "random-picker":
        if spec["scorers"]:
            raise _err(path, "schedulingProfiles[0].plugins", "random-picker ignores scorers; list none")
        return dict(router="random")
    kn = dict(router="gie", gie_prefix_mode=0, gie_prefix_w_pct=0, gie_kv_w_pct=0, gie_queue_w_pct=0,
              gie_load_w_pct=0, gie_active_w_pct=0, view="precise")
    ix = _approx_indexes(spec, block_tokens, capacity_blocks)
    if len(ix) == 2:
        a, b = ((e["hash_block_bytes"], e["max_blocks"]) for _, e in ix)
        if a != b and second_index_at_first_blocks:
            e = dict(ix[1][1])
            e["lru_capacity"] = max(1, e["lru_capacity"] * e["hash_block_bytes"] // a[0])
            ix[1] = (ix[1][0], e)
        elif a != b:
            raise _err(path, "approx-prefix-cache-producer", f"the two approximate prefix scorers hash differently "
                       f"((block bytes, blocks matched) {a} and {b}); one stream carries one hash configuration")
        kn.update(gie_cpu_w_pct=_pct(ix[1][0]), gie_cpu_lru_capacity=ix[1][1]["lru_capacity"])
    if ix:
        kn.update(gie_prefix_mode=1, gie_prefix_w_pct=_pct(ix[0][0]), view="gie_estimate",
                  gie_lru_capacity=ix[0][1]["lru_capacity"])
    for (t, w, params), ix in zip(spec["scorers"], spec.get("index") or [None] * len(spec["scorers"])):
        if ix is not None and len(ix) == 3 and ix[0] == "precise":
            kn.update(_precise_producer_knobs(path, ix[1], ix[2], w, block_tokens))
        elif t == "queue-scorer":
            kn["gie_queue_w_pct"] = _pct(w)
        elif t in ("kv-cache-scorer", "kv-cache-utilization-scorer"):
            kn["gie_kv_w_pct"] = _pct(w)
        elif t == "active-request-scorer":
            kn["gie_active_w_pct"] = _pct(w)
            to = params.get("requestTimeout")
            to_ms = DEFAULT_REQUEST_TIMEOUT_MS if to is None else go_duration_ms(to)
            # a TTL past the engine's int32-ms span never expires within a run: exactly "no expiry" (0)
            kn["gie_active_timeout_ms"] = to_ms if to_ms <= 2**31 - 2 else 0
        elif t == "no-hit-lru-scorer":
            kn.update(_nohit_knobs(path, spec, params, w))
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
    return kn

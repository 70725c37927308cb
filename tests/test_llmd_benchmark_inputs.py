"""The llm-d benchmark's inputs: the inference-perf and EPP readers on the bundled 73-capacity files and on
broken files, the shared_prefix prompt order and stage drain against inference-perf's rules, and the
roofline against BLIS's coefficients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cacheresearch.replica.roofline import BLIS, EFF, blis_check, step_coefficients, vllm_scheduler_defaults
from cacheresearch.routers.epp import (
    EppConfigError,
    epp_hash_config,
    epp_knobs,
    estimate_params,
    go_duration_ms,
    producer_params,
    read_epp,
)
from cacheresearch.studies.llmd_benchmark import BENCHMARKS, BUNDLED, BUNDLED_37, BUNDLED_EPP_37
from cacheresearch.workload.inference_perf import (
    InferencePerfError,
    read_inference_perf,
    shared_prefix_workload,
    stage_drained,
    stage_notes,
)

IP = BUNDLED / "inference-perf.yaml"


def test_bundled_inference_perf():
    c = read_inference_perf(IP)
    assert c.load_type == "poisson" and c.ignore_eos
    assert [(s.rate, s.duration) for s in c.stages[:3]] == [(15, 50), (3, 20), (10, 20)]
    assert len(c.stages) == 17 and c.stages[-1].rate == 60
    assert sum(s.n_requests for s in c.stages) == 17_084  # the report's request count
    assert sum(s.n_requests for s in c.stages[1:]) == 16_334 and sum(s.duration for s in c.stages[1:]) == 452
    d = c.data
    assert (d.num_groups, d.num_prompts_per_group, d.system_prompt_len, d.question_len, d.output_len) == \
        (150, 5, 6000, 1200, 1000)


def test_bundled_epp_files():
    k = {a: epp_knobs(read_epp(BUNDLED / f"epp-{f}-scheduling.yaml"), block_tokens=64)
         for a, f in (("precise", "precise"), ("approximate", "estimated"), ("load", "load"), ("random", "random"))}
    assert k["random"] == {"router": "random"}
    p = k["precise"]
    assert (p["router"], p["view"], p["gie_prefix_mode"]) == ("gie", "precise", 2)
    assert (p["gie_prefix_w_pct"], p["gie_kv_w_pct"], p["gie_queue_w_pct"]) == (300, 200, 200)
    a = k["approximate"]
    assert (a["view"], a["gie_prefix_mode"], a["gie_prefix_w_pct"], a["gie_kv_w_pct"], a["gie_queue_w_pct"]) == \
        ("gie_estimate", 1, 100, 100, 100)
    # GIE's own index: 31,250 hashes per pod, prompt bytes in 64-byte blocks, at most 256 of them
    assert a["gie_lru_capacity"] == 31_250
    assert epp_hash_config(read_epp(BUNDLED / "epp-estimated-scheduling.yaml")) == (64, 256)
    assert epp_hash_config(read_epp(BUNDLED / "epp-precise-scheduling.yaml")) is None
    lo = k["load"]
    assert (lo["gie_prefix_w_pct"], lo["gie_kv_w_pct"], lo["gie_queue_w_pct"]) == (0, 100, 100)


def test_bundled_37_capacity_files():
    """The held-out 37-capacity benchmark's files (bundled verbatim, SOURCE.txt): the workload and the four
    arms' scorers, weights and parameters as the report lists them."""
    import hashlib

    src = (BUNDLED_37 / "SOURCE.txt").read_text()
    for f in ["inference-perf.yaml", *BUNDLED_EPP_37.values()]:
        assert hashlib.sha256((BUNDLED_37 / f).read_bytes()).hexdigest() in src, f  # unchanged since bundled
    c = read_inference_perf(BUNDLED_37 / "inference-perf.yaml")
    assert c.load_type == "constant" and c.ignore_eos and c.model_name == "meta-llama/Llama-3.1-70B-Instruct"
    assert [(s.rate, s.duration) for s in c.stages] == [(10, 25), (3, 210), (4, 180), (5, 120), (6, 120), (8, 90),
                                                         (10, 70), (12, 60), (15, 50), (20, 50)]
    assert sum(s.n_requests for s in c.stages) == 6_810
    d = c.data
    assert (d.num_groups, d.num_prompts_per_group, d.system_prompt_len, d.question_len, d.output_len) == \
        (83, 3, 8000, 1000, 1000)
    k = {a: epp_knobs(read_epp(BUNDLED_37 / f), block_tokens=64) for a, f in BUNDLED_EPP_37.items()}
    assert k["random"] == {"router": "random"}
    p, a, lo = k["precise"], k["approximate"], k["load"]
    # precise: prefix (cache_tracking, 64-token blocks) 2 + kv-cache 1 + active-request 1; no queue scorer
    assert (p["view"], p["gie_prefix_mode"], p["gie_prefix_w_pct"], p["gie_kv_w_pct"], p["gie_active_w_pct"],
            p["gie_queue_w_pct"]) == ("precise", 2, 200, 100, 100, 0)
    # estimate: active 1 + kv 1 + prefix 2 on GIE's index with 256-byte blocks, 256 of them, 2,200 hashes per pod
    assert (a["view"], a["gie_prefix_mode"], a["gie_prefix_w_pct"], a["gie_kv_w_pct"], a["gie_active_w_pct"]) == \
        ("gie_estimate", 1, 200, 100, 100)
    assert a["gie_lru_capacity"] == 2200
    assert epp_hash_config(read_epp(BUNDLED_37 / BUNDLED_EPP_37["approximate"])) == (256, 256)
    assert (lo["gie_prefix_w_pct"], lo["gie_kv_w_pct"], lo["gie_active_w_pct"], lo["gie_queue_w_pct"]) == \
        (0, 100, 100, 0)
    # no requestTimeout in the files: llm-d's default, 2 minutes
    assert p["gie_active_timeout_ms"] == a["gie_active_timeout_ms"] == lo["gie_active_timeout_ms"] == 120_000
    assert BENCHMARKS["37-capacity"]["published_all"]["ttft_p90_s"]["precise"] == 0.409


def test_active_request_scorer_parameters_and_broken_variants(tmp_path):
    assert [go_duration_ms(t) for t in ("30s", "2m", "1h30m", "1.5h", "250ms", ".5s")] == \
        [30_000, 120_000, 5_400_000, 5_400_000, 250, 500]
    load = (BUNDLED_37 / "epp-load.yaml").read_text()
    timed = load.replace("- type: active-request-scorer\n", "- type: active-request-scorer\n  parameters:\n"
                         "    requestTimeout: 45s\n", 1)
    assert epp_knobs(read_epp(_write(tmp_path, "t.yaml", timed)), block_tokens=64)["gie_active_timeout_ms"] == 45_000
    never = timed.replace("45s", "10000h")  # past the engine's 24.8-day span: no expiry within a run
    assert epp_knobs(read_epp(_write(tmp_path, "n.yaml", never)), block_tokens=64)["gie_active_timeout_ms"] == 0
    cases = {
        "dur.yaml": (load.replace("- type: active-request-scorer\n", "- type: active-request-scorer\n  parameters:\n"
                                  "    requestTimeout: 2 minutes\n", 1), r"plugins\[0\]\.parameters\.requestTimeout"),
        "zero.yaml": (load.replace("- type: active-request-scorer\n", "- type: active-request-scorer\n  parameters:\n"
                                   "    requestTimeout: 0s\n", 1), r"requestTimeout: must be at least 1ms"),
        "key.yaml": (load.replace("- type: active-request-scorer\n", "- type: active-request-scorer\n  parameters:\n"
                                  "    idleThreshold: 2\n", 1), r"plugins\[0\]\.parameters\.idleThreshold"),
        "twice.yaml": (load.replace("  - pluginRef: kv-cache-scorer", "  - pluginRef: active-request-scorer", 1),
                       r"active-request-scorer appears twice"),
    }
    for name, (text, key) in cases.items():
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            read_epp(_write(tmp_path, name, text))
    precise = (BUNDLED_37 / "epp-precise-prefix-cache_load.yaml").read_text()
    bad = precise.replace("enableMetrics: true", "enableMetricz: true")
    with pytest.raises(EppConfigError, match=r"kvBlockIndexConfig\.enableMetricz"):
        read_epp(_write(tmp_path, "m.yaml", bad))


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


EPP_OK = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def test_estimate_parameters_of_later_gie_releases(tmp_path):
    """The estimate-mode prefix scorer's keys as each GIE release reads them: v0.5's hashBlockSize (bytes);
    blockSize (characters); later releases' blockSizeTokens (4 characters each), maxPrefixTokensToMatch, and
    autoTune (their default) taking the block size and the LRU capacity from the pods."""
    def spec(params):
        text = EPP_OK.replace("- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n  parameters:\n" +
                              "".join(f"    {k}: {v}\n" for k, v in params.items()))
        return read_epp(_write(tmp_path, "e.yaml", text))

    def both(params, bt=64, cap=625):
        sp = spec(params)
        return epp_hash_config(sp, block_tokens=bt, capacity_blocks=cap), \
            epp_knobs(sp, block_tokens=bt, capacity_blocks=cap)["gie_lru_capacity"]

    assert both({"hashBlockSize": 256, "lruCapacityPerServer": 2200}) == ((256, 256), 2200)  # v0.5: pods unread
    assert both({"blockSize": 128}) == ((128, 256), 31_250)  # characters, v0.5's other defaults
    assert both({"blockSizeTokens": 32, "autoTune": "false"}) == ((128, 256), 31_250)
    assert both({"blockSizeTokens": 32, "autoTune": "false", "maxPrefixTokensToMatch": 1024}) == ((128, 32), 31_250)
    # autoTune (the later releases' default): vLLM's block size and GPU blocks, whatever the file's block size
    assert both({"blockSizeTokens": 32}) == ((256, 256), 625)
    assert both({"autoTune": "true", "lruCapacityPerServer": 99}, bt=16, cap=4802) == ((64, 256), 4802)
    assert estimate_params({"autoTune": True})["auto_tune"] and not estimate_params({})["auto_tune"]
    later = EPP_OK + "featureGates: [prepareDataPlugins]\nsaturationDetector:\n  queueDepthThreshold: 5\ndata: {}\n"
    assert epp_knobs(read_epp(_write(tmp_path, "g.yaml", later)), block_tokens=16)["gie_queue_w_pct"] == 100
    with pytest.raises(EppConfigError, match="featureGates: flowControl"):
        read_epp(_write(tmp_path, "f.yaml", EPP_OK + "featureGates: [flowControl]\n"))
    for params, key in (({"hashBlockSize": 64, "blockSizeTokens": 16}, "give one block size"),
                        ({"autoTune": 3}, "autoTune: must be true or false"),
                        ({"blockSizeTokens": 0}, r"blockSizeTokens: must be an integer >= 1")):
        with pytest.raises(EppConfigError, match=key):
            spec(params)


def test_epp_defaults_and_broken_files(tmp_path):
    k = epp_knobs(read_epp(_write(tmp_path, "ok.yaml", EPP_OK)), block_tokens=16)
    assert k["gie_prefix_w_pct"] == 200 and k["gie_queue_w_pct"] == 100 and k["gie_kv_w_pct"] == 0
    assert k["gie_lru_capacity"] == 31_250 and k["view"] == "gie_estimate"  # GIE v0.5.1 defaults
    assert epp_hash_config(read_epp(tmp_path / "ok.yaml")) == (64, 256)
    cases = {
        "plugin.yaml": (EPP_OK.replace("queue-scorer\n- type", "queue-scorerz\n- type"), r"plugins\[1\]\.type"),
        "param.yaml": (EPP_OK.replace("- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n  parameters:\n"
                                      "    hashBlokSize: 64\n"), r"plugins\[0\]\.parameters\.hashBlokSize"),
        "ref.yaml": (EPP_OK.replace("pluginRef: queue-scorer", "pluginRef: qs"), r"plugins\[1\]\.pluginRef"),
        "top.yaml": (EPP_OK + "extra: 1\n", r"extra"),
        "neg.yaml": (EPP_OK.replace("- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n  parameters:\n"
                                    "    lruCapacityPerServer: -3\n"), r"lruCapacityPerServer"),
    }
    for name, (text, key) in cases.items():
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            read_epp(_write(tmp_path, name, text))
    precise = (BUNDLED / "epp-precise-scheduling.yaml").read_text()
    with pytest.raises(EppConfigError, match="blockSize"):
        epp_knobs(read_epp(_write(tmp_path, "p.yaml", precise)), block_tokens=16)  # 64-token index, 16-token pods


def test_decode_filter_keeps_every_pod_and_disaggregation_is_refused(tmp_path):
    """The llm-d harness's single-profile configs put ``decode-filter`` in the profile; it keeps unlabelled and
    decode-role pods (llm-d's ``NewByLabel(..., allowsNoLabel=true, ...)``), so in aggregated serving the knobs
    are those of the file without it. Disaggregation plugins are refused by name."""
    with_filter = EPP_OK.replace("plugins:\n", "plugins:\n- type: decode-filter\n", 1).replace(
        "  plugins:\n", "  plugins:\n  - pluginRef: decode-filter\n", 1)
    assert with_filter.count("decode-filter") == 2
    spec = read_epp(_write(tmp_path, "df.yaml", with_filter))
    assert spec["filters"] == ["decode-filter"]
    assert epp_knobs(spec, block_tokens=16) == epp_knobs(read_epp(_write(tmp_path, "ok.yaml", EPP_OK)), block_tokens=16)
    weighted = with_filter.replace("  - pluginRef: decode-filter\n", "  - pluginRef: decode-filter\n    weight: 2\n")
    bad = {"pf.yaml": (with_filter.replace("decode-filter", "prefill-filter"),
                       r"plugins\[0\]\.type: prefill-filter is a prefill / decode disaggregation plugin"),
           "pd.yaml": (EPP_OK.replace("plugins:\n", "plugins:\n- type: pd-profile-handler\n", 1),
                       r"pd-profile-handler is a prefill / decode"),
           "w.yaml": (weighted, r"weight: decode-filter is a filter")}
    for name, (text, key) in bad.items():
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            read_epp(_write(tmp_path, name, text))


LATER_PRECISE = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: single-profile-handler
  - type: tokenizer
    parameters:
      modelName: Qwen/Qwen3-32B
      udsTokenizerConfig: {socketFile: /tmp/tokenizer/tokenizer-uds.socket}
  - type: precise-prefix-cache-scorer
    parameters:
      tokenProcessorConfig:
        blockSize: 64
        hashSeed: "42"
      indexerConfig:
        tokenizersPoolConfig: {modelName: Qwen/Qwen3-32B, local: null, hf: null}
        kvBlockIndexConfig:
          valkeyConfig: {address: "valkey://valkey:6379", backendType: valkey}
          enableMetrics: true
      kvEventsConfig: {topicFilter: "kv@", concurrency: 4, discoverPods: false, zmqEndpoint: "tcp://*:5557"}
  - type: kv-cache-utilization-scorer
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: precise-prefix-cache-scorer
        weight: 3.0
      - pluginRef: kv-cache-utilization-scorer
        weight: 2.0
      - pluginRef: queue-scorer
        weight: 2.0
      - pluginRef: max-score-picker
"""


def test_later_llmd_precise_layout(tmp_path):
    """llm-d's later precise-scorer layout (``tokenProcessorConfig`` at the top of the parameters, a tokenizer
    plugin, a valkey-backed index) gives the same knobs as the 73-capacity precise file; its block size is
    checked against the pods'; speculative indexing, two disagreeing block sizes and a tokenizer in a profile are
    refused with the key."""
    k = epp_knobs(read_epp(_write(tmp_path, "later.yaml", LATER_PRECISE)), block_tokens=64)
    assert k == epp_knobs(read_epp(BUNDLED / "epp-precise-scheduling.yaml"), block_tokens=64)
    with pytest.raises(EppConfigError, match=r"later.yaml: tokenProcessorConfig\.blockSize: 64 tokens, but the pods"):
        epp_knobs(read_epp(tmp_path / "later.yaml"), block_tokens=16)
    bad = {"spec.yaml": (LATER_PRECISE.replace("      indexerConfig:\n", "      indexerConfig:\n"
                                               "        speculativeIndexing: true\n"), r"speculativeIndexing"),
           "two.yaml": (LATER_PRECISE.replace("      indexerConfig:\n", "      indexerConfig:\n"
                                              "        tokenProcessorConfig: {blockSize: 16}\n"),
                        r"tokenProcessorConfig\.blockSize: 64, but indexerConfig"),
           "tk.yaml": (LATER_PRECISE.replace("      - pluginRef: max-score-picker\n",
                                             "      - pluginRef: max-score-picker\n      - pluginRef: tokenizer\n"),
                       r"tokenizer is not a scorer or picker"),
           "key.yaml": (LATER_PRECISE.replace('hashSeed: "42"', "hashSeeds: 1"), r"tokenProcessorConfig\.hashSeeds")}
    for name, (text, key) in bad.items():
        assert text != LATER_PRECISE, name
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            read_epp(_write(tmp_path, name, text))
    ok = LATER_PRECISE.replace("      indexerConfig:\n", "      indexerConfig:\n        speculativeIndexing: false\n")
    assert epp_knobs(read_epp(_write(tmp_path, "sf.yaml", ok)), block_tokens=64) == k


def test_inference_perf_broken_files(tmp_path):
    good = IP.read_text()
    cases = {
        "a.yaml": (good.replace("num_groups: 150", "num_grups: 150"), r"data\.shared_prefix\.num_grups"),
        "b.yaml": (good.replace("type: poisson", "type: burst"), r"load\.type"),
        "c.yaml": (good.replace("    - rate: 3\n", "    - rate: -3\n"), r"load\.stages\[1\]\.rate"),
        "d.yaml": (good.replace("type: shared_prefix", "type: random"), r"data\.type"),
        "e.yaml": (good + "\nbogus: 1\n", r"bogus"),
    }
    for name, (text, key) in cases.items():
        with pytest.raises(InferencePerfError, match=rf"{name}: {key}"):
            read_inference_perf(_write(tmp_path, name, text))


WARM_TEXTS = {
    # the series' three ways of marking a warm-up (73-capacity, 37-capacity, load-with-headroom), then none
    "above": ("load:\n  type: poisson\n  stages:\n    # Warmup - seat residents\n    - rate: 15\n      duration: 50"
              "\n\n    # Main ladder\n    - rate: 3\n      duration: 20\n", 1),
    "inline": ("load:\n  stages:\n    - rate: 10           # warmup phase\n      duration: 25\n    - rate: 3\n"
               "      duration: 210\n", 1),
    "on duration, two": ("load:\n  stages:\n    - rate: 10\n      duration: 20 # PREWARM\n    - rate: 12\n"
                         "      duration: 5 # Warm-up 2\n    - rate: 3\n      duration: 9\n", 2),
    "none": ("load:\n  type: constant\n  stages:\n  - rate: 2\n    duration: 50\n  - rate: 5\n    duration: 50\n"
             "api:\n  type: completion  # warm words outside the stages do not count\n", 0),
    "not leading": ("# warm-up of the header: not a stage\nload:\n  stages:\n    - rate: 2\n      duration: 5\n"
                    "    - rate: 9 # warm again\n      duration: 5\n", 0),
}


def test_warmup_stages_are_read_from_the_files_comments(tmp_path):
    """``llmd.warmup_stages=auto``: the leading stages whose YAML comments name a warm-up, as the series marks
    them; the bundled files' first stages; an integer overrides; a bad value is a clear error."""
    from cacheresearch.studies.base import StudyError
    from cacheresearch.studies.llmd_benchmark import _warmup

    for name, (text, n) in WARM_TEXTS.items():
        doc = __import__("yaml").safe_load(text)
        k = len(doc["load"]["stages"])
        notes = stage_notes(text, k)
        assert len(notes) == k, name
        body = text + "data:\n  type: shared_prefix\n  shared_prefix: {num_groups: 2, num_prompts_per_group: 1, " \
            "system_prompt_len: 8, question_len: 4, output_len: 2}\n"
        c = read_inference_perf(_write(tmp_path, "w.yaml", body))
        assert c.warmup_stages == n, (name, c.stage_notes)
        assert _warmup("auto", c, k)[0] == n
    assert stage_notes("load:\n  stages: [{rate: 1, duration: 2}]\n", 1) == ("",)  # flow style: no notes
    assert read_inference_perf(IP).warmup_stages == 1
    assert read_inference_perf(BUNDLED_37 / "inference-perf.yaml").warmup_stages == 1
    c = read_inference_perf(IP)
    assert _warmup(3, c, 17) == (3, "llmd.warmup_stages") and _warmup(None, c, 17)[0] == 1
    with pytest.raises(StudyError, match="auto or an integer"):
        _warmup("first", c, 17)
    with pytest.raises(StudyError, match=r"in \[0, 16\]"):
        _warmup(17, c, 17)


NEWER_IP = """load:
  type: constant
  request_timeout: 60
  num_workers: 2
  worker_max_concurrency: 50
  worker_max_tcp_connections: 10
  circuit_breakers: []
  base_seed: 7
  stages:
  - rate: 2
    duration: 5
data:
  type: shared_prefix
  shared_prefix:
    num_unique_system_prompts: 3
    num_users_per_system_prompt: 2
    system_prompt_len: 40
    question_distribution: null
    enable_multi_turn_chat: false
"""


def test_inference_perf_defaults_aliases_and_client_keys(tmp_path):
    """Files written for newer inference-perf releases: its aliases, its defaults for a parameter left out, its
    client-side load keys accepted, request_timeout read; what cannot be modelled is a clear error."""
    c = read_inference_perf(_write(tmp_path, "n.yaml", NEWER_IP))
    d = c.data
    assert (d.num_groups, d.num_prompts_per_group, d.system_prompt_len, d.question_len, d.output_len) == \
        (3, 2, 40, 50, 50)  # question_len and output_len: inference-perf's defaults
    assert c.request_timeout_s == 60.0 and c.stages[0].n_requests == 10
    assert (c.num_workers, c.worker_max_concurrency, c.client_permits) == (2, 50, 100)  # the client's permits
    assert read_inference_perf(_write(tmp_path, "s.yaml", SMALL_IP)).client_permits is None  # cpu_count(): unknown
    bad = {
        "m.yaml": (NEWER_IP.replace("enable_multi_turn_chat: false", "enable_multi_turn_chat: true"),
                   r"enable_multi_turn_chat: not supported"),
        "l.yaml": (NEWER_IP.replace("system_prompt_len: 40", "system_prompt_len: {min: 1, max: 5}"),
                   r"system_prompt_len: a length distribution"),
        "q.yaml": (NEWER_IP.replace("question_distribution: null", "question_distribution: {min: 1}"),
                   r"question_distribution: not supported"),
        "a.yaml": (NEWER_IP + "    num_groups: 4\n", r"num_unique_system_prompts: an alias of num_groups"),
        "t.yaml": (NEWER_IP.replace("request_timeout: 60", "request_timeout: 0"), r"load\.request_timeout"),
        "r.yaml": (NEWER_IP.replace("base_seed: 7", "trace: {file: x.csv}"), r"load\.trace: not supported"),
        "k.yaml": (NEWER_IP.replace("base_seed: 7", "bogus_key: 1"), r"load\.bogus_key: unknown key"),
        "w.yaml": (NEWER_IP.replace("num_workers: 2", "num_workers: 0"), r"load\.num_workers: must be an integer"),
    }
    for name, (text, key) in bad.items():
        with pytest.raises(InferencePerfError, match=rf"{name}: .*{key}"):
            read_inference_perf(_write(tmp_path, name, text))


def test_prompt_order_and_stages_follow_inference_perf():
    c = read_inference_perf(IP)
    w = shared_prefix_workload(c, block_tokens=64, seed=3, stage_gap_s=100, max_requests_per_stage=900)
    st, pr, order = w.meta["stage"], w.meta["prompt"], w.meta["order"]
    assert sorted(order.tolist()) == list(range(750))  # 750 fixed prompts, shuffled once
    for k in range(len(c.stages)):
        p = pr[st == k]
        n = min(c.stages[k].n_requests, 900)
        assert p.shape[0] == n
        np.testing.assert_array_equal(p, order[np.arange(n) % 750])  # request n -> prompts[n mod 750], per stage
    # every prompt is group prefix + fixed question: same group -> same first 93 blocks (6,000 // 64)
    nb = w.n_blocks[0]
    keys = w.keys.reshape(-1, nb)
    g = w.tenant
    i, j = np.nonzero(g[:, None] == g[None, :100])
    np.testing.assert_array_equal(keys[i, :93], keys[j, :93])
    same_prompt = pr[:, None] == pr[None, :100]
    a, b = np.nonzero(same_prompt)
    np.testing.assert_array_equal(keys[a], keys[b])
    assert w.input_tokens[0] == 7200 and np.all(w.output_tokens == 1000)
    # stages are separated by the gap after the previous stage's last send
    arr = w.arrival_ms
    for k in range(1, len(c.stages)):
        assert arr[st == k].min() >= arr[st == k - 1].max() + 100_000 - 1


def test_stage_drained_flags_a_stage_still_running():
    arr = np.array([0, 10, 100, 110])
    st = np.array([0, 0, 1, 1])
    assert stage_drained(arr, np.array([50, 90, 150, 200]), st).tolist() == [True, True]
    assert stage_drained(arr, np.array([50, 101, 150, 200]), st).tolist() == [False, True]
    assert stage_drained(arr, np.array([50, 90, 150, -1]), st).tolist() == [True, False]


def test_roofline_against_blis():
    rows = blis_check()
    assert {r["case"] for r in rows} == set(BLIS)
    assert 0.3 < EFF["eff_bw"] <= 1 and 0.3 < EFF["eff_flops"] <= 1
    for r in rows:  # one pair of factors explains every BLIS model within a factor of 1.5
        assert abs(r["base_err"]) < 0.5 and abs(r["prefill_err"]) < 0.5, r
    # H100 cases: the weight read of the calibrated roofline is within 20% of BLIS's beta0
    for r in rows:
        if r["gpu"] == "h100_80gb":
            assert abs(r["base_err"]) < 0.2, r
    # Qwen3-32B on 2 x H100: decode at ~8k context is KV-bound, ~ 39-60 ns per context token
    q = step_coefficients("qwen3_32b", "h100_80gb", 2)
    assert 39_000 <= q["step_ctx_ps"] <= 60_000
    # ~60 requests at ~8k context: a decode step of 25-45 ms (the report's ITL is about 25-29 ms)
    t = q["step_base_ns"] * 1e-9 + 60 * 8000 * q["step_ctx_ps"] * 1e-12
    assert 0.025 < t < 0.045, t
    assert vllm_scheduler_defaults("h100_80gb")["max_num_seqs"] == 1024
    assert vllm_scheduler_defaults("a100_80gb")["max_num_seqs"] == 256


def test_tensor_parallel_all_reduce_by_hand():
    """Each token's share of the two all-reduces per layer: 2 layers hidden 2 bytes, of which a ring sends
    2 (tp - 1) / tp over a GPU's link at link_bw x eff_bw; none at tp 1; it is in the prefill and decode
    knobs and lowers the TP4 BLIS case's error without touching the TP1 cases' matmul terms."""
    from cacheresearch.replica.roofline import GPU_PEAK, roofline

    assert roofline("llama3_70b", "h100_80gb", 1).allreduce_token_s() == 0.0
    assert step_coefficients("llama3_8b", "h100_80gb", 1)["step_decode_ns"] == 0
    bw = GPU_PEAK["h100_80gb"].link_bw * EFF["eff_bw"]
    by_hand = {2: 2 * 64 * 5120 * 2 * 1.0 / bw, 4: 2 * 64 * 5120 * 2 * 1.5 / bw, 8: 2 * 64 * 5120 * 2 * 1.75 / bw}
    for tp, t in by_hand.items():  # Qwen3-32B: hidden 5120, not heads x head_dim (8192)
        r = roofline("qwen3_32b", "h100_80gb", tp)
        assert r.allreduce_token_s() == pytest.approx(t)
        q = step_coefficients("qwen3_32b", "h100_80gb", tp)
        assert q["step_decode_ns"] == round(t * 1e9)
        assert q["step_prefill_ns"] == round((r.prefill_token_s(0.0) + t) * 1e9)
    a100 = roofline("llama3_70b", "a100_80gb", 4).allreduce_token_s()
    assert a100 == pytest.approx(2 * 80 * 8192 * 2 * 1.5 / (300e9 * EFF["eff_bw"]))
    # the calibration takes the all-reduce out of BLIS's beta1 before fitting the matmul efficiency
    tp4 = next(r for r in blis_check() if r["tp"] == 4)
    assert tp4["allreduce_us"] > 0 and abs(tp4["prefill_err"]) < 0.3, tp4
    assert all(r["allreduce_us"] == 0 for r in blis_check() if r["tp"] == 1)


SMALL_IP = """load:
  type: poisson
  stages:
    - rate: 4  # warm-up
      duration: 3
    - rate: 8
      duration: 3
server:
  ignore_eos: true
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 3
    num_prompts_per_group: 2
    system_prompt_len: 256
    question_len: 64
    output_len: 6
"""


@pytest.mark.slow  # long; see README's slow checks
def test_study_on_a_small_benchmark_of_the_series(tmp_path):
    """The study end to end on its own small files: dims, coordinates, summaries, drained stages."""
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study

    ip = _write(tmp_path, "ip.yaml", SMALL_IP)
    epp = {a: str(BUNDLED / f) for a, f in (("approximate", "epp-estimated-scheduling.yaml"),
                                           ("load", "epp-load-scheduling.yaml"))}
    cfg = OmegaConf.create(dict(kind="llmd_benchmark", name="small", seed=1, fleet=dict(replicas=2),
                                replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                cache=dict(block_tokens=16, capacity_blocks=60),
                                llmd=dict(inference_perf=str(ip), epp=epp, stage_gap_s=30, max_running=8)))
    ds = run_study(cfg)
    assert dict(ds.sizes) == {"arm": 2, "stage": 2}
    assert ds.stage_rate.values.tolist() == [4, 8] and ds.stage_warmup.values.tolist() == [True, False]
    assert bool(ds.stage_drained.all())
    assert ds.n_requests.values.tolist() == [12, 24]
    for v in ("ttft_p90_s", "ttft_mean_s", "output_tokens_per_s", "requests_per_s", "token_hit_rate"):
        assert np.all(np.isfinite(ds[v].values)), v
    # the summary pools the ladder after the warm-up: here the one stage after it
    np.testing.assert_allclose(ds.ttft_mean_s_all.values, ds.ttft_mean_s.sel(stage=1).values)
    np.testing.assert_allclose(ds.ttft_p90_s_all.values, ds.ttft_p90_s.sel(stage=1).values)
    np.testing.assert_allclose(ds.ttft_p90_s_pooled_all.values, ds.ttft_p90_s.sel(stage=1).values)
    assert np.all(ds.ttft_p90_s.values >= ds.ttft_mean_s.values * 0.5)
    assert "published_ttft_p90_s" not in ds  # its own files: no report beside it
    # KV usage and waiting: time means per stage (from the engine's integrals at the stages' first arrivals)
    kv, wq = ds.kv_usage_mean.values, ds.waiting_mean.values
    assert np.all((kv > 0) & (kv <= 1)) and np.all(wq >= 0)
    np.testing.assert_allclose(ds.kv_usage_mean_all.values, ds.kv_usage_mean.sel(stage=1).values)
    # the run's mean includes the 30 s idle gaps after each stage; the stages' own means do not
    assert np.all(ds.kv_usage_mean.max("stage").values > ds.kv_usage_mean_run.values)
    # the approximate arm ran on GIE's own index, its hashes under the bytes-per-token assumption
    assert ds.attrs["gie_hash_configs"] == "[(64, 256)]" and ds.attrs["metrics_refresh_ms"] == 50
    np.testing.assert_allclose(ds.itl_mean_s.values, ds.tpot_mean_s.values * 5 / 11, rtol=1e-9)  # 6 tokens each
    np.testing.assert_allclose(ds.itl_mean_s_all.values, ds.itl_mean_s.sel(stage=1).values)


SERIES = Path(__file__).resolve().parent / "fixtures" / "llmd_series"


def test_another_benchmark_of_the_series_runs_from_its_own_files():
    """A hand-made file set of the series (tests/fixtures/llmd_series: constant sends, another model, pod count
    and residency, the later plugin names, estimate-mode parameters off GIE's defaults, llm-d's load-aware
    scorer): read and run end to end on the numba vllm backend, nothing taken from the bundled files."""
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study

    epp = {a: str(SERIES / f"epp-{a}.yaml") for a in ("precise", "estimated", "random")}
    cfg = OmegaConf.create(dict(kind="llmd_benchmark", name="series", seed=2, fleet=dict(replicas=3),
                                replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                cache=dict(block_tokens=16, capacity_blocks=64),
                                llmd=dict(inference_perf=str(SERIES / "inference-perf.yaml"), epp=epp, stage_gap_s=60,
                                          max_running=16)))
    ds = run_study(cfg)
    assert ds.arm.values.tolist() == ["precise", "estimated", "random"]
    assert ds.stage_rate.values.tolist() == [4, 2, 6, 10] and ds.n_requests.values.tolist() == [20, 12, 30, 40]
    assert bool(ds.stage_drained.all()) and "published_ttft_p90_s" not in ds
    assert ds.attrs["gie_hash_configs"] == "[(32, 40)]"  # the file's hashBlockSize / maxPrefixBlocksToMatch
    knobs = eval(ds.attrs["knobs"])  # noqa: S307 - the study's own repr of plain dicts
    assert knobs["estimated"]["gie_lru_capacity"] == 600 and knobs["estimated"]["gie_load_threshold"] == 16
    assert (knobs["precise"]["gie_prefix_w_pct"], knobs["precise"]["gie_kv_w_pct"]) == (200, 100)
    for v in ("ttft_p90_s", "ttft_mean_s", "output_tokens_per_s", "token_hit_rate", "kv_usage_mean"):
        assert np.all(np.isfinite(ds[v].values)), v
    # constant sends: a stage's requests/s is its rate (n requests over the span of n - 1 gaps)
    np.testing.assert_allclose(ds.requests_per_s.sel(arm="random").values,
                               [r * n / (n - 1) for r, n in ((4, 20), (2, 12), (6, 30), (10, 40))], rtol=1e-2)
    # inference-perf's ITL with two client timestamps per token, beside the time per token: every request of a
    # shared_prefix stage has the same output length n, so ITL = mean decode / (2n - 1), TPOT = mean decode / (n - 1)
    from cacheresearch.workload.inference_perf import read_inference_perf

    n = read_inference_perf(SERIES / "inference-perf.yaml").data.output_len
    assert ds.attrs["itl_events_per_token"] == 2.0 and "SSE" in ds.attrs["itl_note"]
    assert np.all(np.isfinite(ds.itl_mean_s.values)) and np.all(ds.tpot_mean_s.values > 0)
    np.testing.assert_allclose(ds.itl_mean_s.values, ds.tpot_mean_s.values * (n - 1) / (2 * n - 1), rtol=1e-9)


def test_fixed_overhead_is_a_pure_addition_to_the_client_ttft(tmp_path):
    """``llmd.overhead_ms`` (default 250, an assumption) never reaches the simulation: with 0 and 250 the cells
    are the same, every request's pod TTFT, finish time and pod are the same, and the dataset's TTFTs are
    shifted by exactly 0.25 s while every other variable is unchanged."""
    from omegaconf import OmegaConf

    from cacheresearch.core.run import simulate_cells
    from cacheresearch.studies import get
    from cacheresearch.studies.llmd_benchmark import DEFAULTS, client_ttft_s

    assert DEFAULTS["overhead_ms"] == 250.0
    ip = _write(tmp_path, "ip.yaml", SMALL_IP)
    epp = {a: str(BUNDLED / f) for a, f in (("approximate", "epp-estimated-scheduling.yaml"),
                                           ("precise", "epp-precise-scheduling.yaml"))}
    runs = {}
    for ov in (None, 0, 250):
        llmd = dict(inference_perf=str(ip), epp=epp, stage_gap_s=30, max_running=8)
        if ov is not None:
            llmd["overhead_ms"] = ov
        cfg = OmegaConf.create(dict(kind="llmd_benchmark", name="ov", seed=3, fleet=dict(replicas=3),
                                    replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                    cache=dict(block_tokens=64, capacity_blocks=20), llmd=llmd))
        r = get("llmd_benchmark").plan(cfg)
        c = r.cells
        m, _ = simulate_cells(c.streams, c.stream_of, c.params, c.seeds, max_replicas=c.max_replicas, **c.options)
        pod = {f: np.asarray(getattr(m, f)).copy() for f in ("ttft_ms", "e2e_ms", "hit_tokens")}
        params = [p._asdict() for p in c.params]
        r.assemble(m)
        assert r.cells is None
        runs[ov] = (pod, params, r.dataset)
    (p0, k0, d0), (p1, k1, d1), (_, _, dd) = runs[0], runs[250], runs[None]
    for f in p0:  # the pods and the routing saw the same thing
        np.testing.assert_array_equal(p0[f], p1[f], err_msg=f)
    for a, b in zip(k0, k1):
        for f in a:
            np.testing.assert_array_equal(np.asarray(a[f]), np.asarray(b[f]), err_msg=f)
    assert np.all(p0["ttft_ms"] >= 0)
    np.testing.assert_allclose(client_ttft_s(p0["ttft_ms"], 250) - client_ttft_s(p0["ttft_ms"], 0), 0.25,
                               rtol=0, atol=1e-12)
    for v in d0.data_vars:
        if v.startswith("ttft_"):
            np.testing.assert_allclose(d1[v].values - d0[v].values, 0.25, rtol=0, atol=1e-9, err_msg=v)
        elif v != "wall_s":
            np.testing.assert_array_equal(d0[v].values, d1[v].values, err_msg=v)
    np.testing.assert_allclose(dd.ttft_p90_s_all.values, d1.ttft_p90_s_all.values, rtol=0, atol=1e-12)
    assert d1.attrs["overhead_ms"] == 250.0 and "assumption" in d1.attrs["overhead_note"]


def test_model_auto_reads_the_files_model(tmp_path):
    """replica.model=auto takes the preset named by the inference-perf file (server.model_name, else the
    tokenizer's name); an explicit model wins; an unknown id is a clear error naming the file."""
    from cacheresearch.studies.llmd_benchmark import LlmdBenchmarkError, _model_of

    series = Path(__file__).resolve().parent / "fixtures" / "llmd_series" / "inference-perf.yaml"
    assert _model_of("auto", read_inference_perf(IP)) == "qwen3_32b"
    assert _model_of(None, read_inference_perf(series)) == "llama3_8b"
    assert _model_of("mistral_7b", read_inference_perf(series)) == "mistral_7b"
    text = IP.read_text().replace("model_name: Qwen/Qwen3-32B", "model_name: org/unknown")
    p = tmp_path / "ip.yaml"
    p.write_text(text)
    assert _model_of("auto", read_inference_perf(p)) == "qwen3_32b"  # the tokenizer still names it
    p.write_text(text.replace("pretrained_model_name_or_path: Qwen/Qwen3-32B", "pretrained_model_name_or_path: x/y"))
    with pytest.raises(LlmdBenchmarkError, match="ip.yaml names the model 'org/unknown'"):
        _model_of("auto", read_inference_perf(p))


# llm-d-kv-cache-manager benchmarking/load-with-headroom/standard-scale-64p-cache-load/analysis_metrics.csv
# (commit c9ac9ee), the precise-prefix-cache rows: requested_qps, successes, failures, duration_s (summed send
# durations), ttft_p90_s, ttft_mean_s, output_toks_per_sec_json; and that report's "Summary across QPS" row:
# 1393.5 tok/s, 8.017 requests/s, TTFT p90 6.314 s, TTFT mean 2.260 s.
_PRECISE_64P = [
    (3, 360, 0, 118.40629061171785, 5.711062978487462, 3.100527604928033, 520.8547684594029),
    (4, 400, 0, 99.23455262416974, 5.223418842582032, 1.3509035791142379, 660.3905785865172),
    (5, 450, 0, 89.7404651879333, 3.0783620533533393, 2.069098920766264, 799.4764096635581),
    (6, 360, 0, 59.73012522608042, 5.4918007288593795, 1.4070743070850666, 900.1326482488086),
    (8, 472, 8, 60.021882712841034, 13.58478849399835, 4.581923980607209, 993.9497577097691),
    (10, 500, 0, 50.9300377080217, 9.563477235334004, 3.9093122221790253, 1232.0333937094883),
    (12, 599, 1, 50.09942111000419, 2.352571247890592, 1.4151043234803466, 1673.2293503595354),
    (14, 490, 0, 35.11351663200185, 9.659766856627538, 2.5101312429321054, 1811.423158686468),
    (16, 480, 0, 30.732918120920658, 5.267191958846524, 1.5259339819866, 1932.6519123512803),
    (18, 540, 0, 30.658077341038734, 9.844008490256966, 2.8028006735275053, 2170.459979139531),
    (20, 600, 0, 31.418794037308544, 0.7800200080964714, 0.5559482991610033, 2634.2198804674654),
]


def test_inference_perf_itl_counts_the_clients_timestamps():
    """inference-perf's pooled ITL mean: the requests' decode spans over their inter-timestamp gaps, with
    ``events_per_token`` timestamps per token (the series' clients: 2, so about half the time per token); one-token
    requests have no gap; the bundled reports' ITL tables are there, with their p50-0 reading documented."""
    from cacheresearch.studies.llmd_benchmark import BENCHMARKS, DEFAULTS, inference_perf_itl_s

    assert inference_perf_itl_s([999.0], [1000], 1) == pytest.approx(0.001)
    assert inference_perf_itl_s([999.0], [1000], 2) == pytest.approx(0.999 / 1999)
    # pooled: gaps summed over requests, not a mean of per-request means
    assert inference_perf_itl_s([90.0, 10.0], [10, 2], 1) == pytest.approx(0.1 / 10)
    assert inference_perf_itl_s([0.0, 40.0], [1, 5], 2) == pytest.approx(0.04 / (1 + 9))
    assert np.isnan(inference_perf_itl_s([], [], 2))
    assert DEFAULTS["itl_events_per_token"] == 2.0
    from omegaconf import OmegaConf

    from cacheresearch.studies.llmd_benchmark import LlmdBenchmarkError, _llmd_cfg

    assert _llmd_cfg(OmegaConf.create(dict(llmd=dict(itl_events_per_token=1))))["itl_events_per_token"] == 1
    for bad in (0, 0.5, float("nan")):
        with pytest.raises(LlmdBenchmarkError, match="itl_events_per_token must be >= 1"):
            _llmd_cfg(OmegaConf.create(dict(llmd=dict(itl_events_per_token=bad))))
    for b in BENCHMARKS.values():
        tab = b["published"]["itl_mean_s"]
        assert set(tab) == {"precise", "approximate", "load", "random"}
        assert len({len(v) for v in tab.values()}) == 1 and len(tab["precise"]) == len(b["published"]["ttft_p90_s"]
                                                                                         ["precise"])


def test_report_summary_reproduces_a_published_summary_row():
    """The summary across QPS as the series' report generator computes it, on a published report's own
    per-QPS rows: every figure to the report's printed digits (a pooled p90 or a token-weighted throughput
    would not give them)."""
    from cacheresearch.studies.llmd_benchmark import report_summary

    r, s, f, d, p90, mean, tok = (np.array(c, dtype=float) for c in zip(*_PRECISE_64P, strict=True))
    out = report_summary(r, s, s + f, d, p90, mean, tok)
    assert round(out["output_tokens_per_s_all"], 1) == 1393.5
    assert round(out["requests_per_s_all"], 3) == 8.017
    assert round(out["ttft_p90_s_all"], 3) == 6.314
    assert round(out["ttft_mean_s_all"], 3) == 2.260
    # the ITL mean is summarised as the TTFT mean, successes-weighted (0.023 in the report; a plain mean: 0.022)
    itl = [0.015963655, 0.019429440, 0.025553712, 0.017994316, 0.023366233, 0.022510869, 0.025449205, 0.023354543,
           0.022567643, 0.024225047, 0.023792149]  # the CSV's itl_mean_s, the same rows
    assert "itl_mean_s_all" not in out
    out = report_summary(r, s, s + f, d, p90, mean, tok, means={"itl_mean_s": itl})
    assert round(out["itl_mean_s_all"], 3) == 0.023 and round(float(np.mean(itl)), 3) == 0.022
    # stages of one requested rate are merged into one row first (p90 and throughput averaged, counts summed)
    two = report_summary([3, 3, 5], [10, 30, 20], [10, 30, 20], [5, 15, 4], [1.0, 3.0, 10.0], [0.5, 1.5, 4.0],
                         [100.0, 300.0, 500.0])
    assert two["output_tokens_per_s_all"] == pytest.approx((200.0 + 500.0) / 2)
    assert two["ttft_p90_s_all"] == pytest.approx((2.0 * 40 + 10.0 * 20) / 60)
    assert two["requests_per_s_all"] == pytest.approx(60 / 24)


def test_client_permits_close_the_loop(tmp_path):
    """``llmd.client_permits``: auto is open loop for a file that leaves ``num_workers`` to the client's CPU count
    (the same dataset as 0), and the file's ``num_workers x worker_max_concurrency`` when it sets them; with few
    permits requests wait in the client, the pods never hold more than that many, and the TTFT the client
    measures (from the send) is lower than the open loop's while the stage takes longer."""
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study

    def run(text, permits=None):
        ip = _write(tmp_path, f"ip{permits}{len(text)}.yaml", text)
        llmd = dict(inference_perf=str(ip), epp={"load": str(BUNDLED / "epp-load-scheduling.yaml")}, stage_gap_s=60,
                    max_running=8, overhead_ms=0)
        if permits is not None:
            llmd["client_permits"] = permits
        cfg = OmegaConf.create(dict(kind="llmd_benchmark", name="cp", seed=4, fleet=dict(replicas=2),
                                    replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                    cache=dict(block_tokens=16, capacity_blocks=60), llmd=llmd))
        return run_study(cfg)

    heavy = SMALL_IP.replace("rate: 8", "rate: 40").replace("output_len: 6", "output_len: 60")
    auto, zero, two = run(heavy), run(heavy, 0), run(heavy, 2)
    assert auto.attrs["client_permits"] == 0 and "open loop" in auto.attrs["client_permits_source"]
    for v in ("ttft_p90_s", "ttft_mean_s", "output_tokens_per_s", "requests_per_s"):
        np.testing.assert_array_equal(auto[v].values, zero[v].values, err_msg=v)
    assert two.attrs["client_permits"] == 2 and bool(two.stage_drained.all())
    assert float(two.ttft_mean_s.sel(stage=1)) < float(zero.ttft_mean_s.sel(stage=1))
    assert float(two.requests_per_s.sel(stage=1)) < float(zero.requests_per_s.sel(stage=1))  # sends spread out
    assert float(two.waiting_mean.sel(stage=1)) <= float(zero.waiting_mean.sel(stage=1))
    filed = run(heavy.replace("type: poisson", "type: poisson\n  num_workers: 1\n  worker_max_concurrency: 2"))
    assert filed.attrs["client_permits"] == 2 and "num_workers 1" in filed.attrs["client_permits_source"]
    np.testing.assert_array_equal(filed.ttft_p90_s.values, two.ttft_p90_s.values)


def test_request_timeout_cuts_requests_off(tmp_path):
    """The file's ``load.request_timeout`` is the replica's ``client_timeout_ms``: under load some requests time out
    (a failure: ``timed_out``), every success ended within the timeout of its send (overhead 0: the client's TTFT
    and its last token are the pods'), and without the key nothing times out."""
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study
    from cacheresearch.studies.llmd_benchmark import summarize_llmd_benchmark

    def run(text):
        ip = _write(tmp_path, f"ipt{len(text)}.yaml", text)
        llmd = dict(inference_perf=str(ip), epp={"load": str(BUNDLED / "epp-load-scheduling.yaml")}, stage_gap_s=60,
                    max_running=8, overhead_ms=0)
        cfg = OmegaConf.create(dict(kind="llmd_benchmark", name="to", seed=4, fleet=dict(replicas=2),
                                    replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                    cache=dict(block_tokens=16, capacity_blocks=60), llmd=llmd))
        return run_study(cfg)

    heavy = SMALL_IP.replace("rate: 8", "rate: 40").replace("output_len: 6", "output_len: 60")
    base = run(heavy)
    cut = run(heavy.replace("type: poisson", "type: poisson\n  request_timeout: 0.8"))
    assert int(base.timed_out.sum()) == 0 and 0 < int(cut.timed_out.sum()) < int(cut.n_requests.sum())
    assert cut.attrs["request_timeout_s"] == 0.8 and "timed out per arm: load" in summarize_llmd_benchmark(cut)
    assert float(cut.ttft_p90_s.max()) <= 0.8 < float(base.ttft_p90_s.max())  # the successes' TTFT only


TIERED = Path(__file__).parent / "fixtures" / "llmd_tiered"


def test_tiered_prefix_cache_guide_values_file():
    """llm-d's tiered-prefix-cache guide (tests/fixtures/llmd_tiered/SOURCE.md), read from its Helm values file:
    the GPU scorer reads the producer the EPP creates by default (autoTune: the pods' block size, never below 64
    tokens, and their GPU blocks), the CPU scorer its own producer (41,000 hashes) with its own weight."""
    sp = read_epp(TIERED / "tiered-prefix-cache-cpu.values.yaml")
    k = epp_knobs(sp, block_tokens=64, capacity_blocks=2000)
    assert (k["view"], k["gie_prefix_mode"], k["gie_queue_w_pct"], k["gie_kv_w_pct"]) == ("gie_estimate", 1, 200, 200)
    assert (k["gie_prefix_w_pct"], k["gie_lru_capacity"]) == (100, 2000)
    assert (k["gie_cpu_w_pct"], k["gie_cpu_lru_capacity"]) == (100, 41_000)
    # 64-token blocks hashed as 4 bytes a token; 131,072 tokens matched at most (2,048 blocks)
    assert epp_hash_config(sp, block_tokens=64, capacity_blocks=2000) == (256, 2048)
    assert epp_hash_config(sp, block_tokens=16, capacity_blocks=2000) == (256, 2048)  # 16 tokens: raised to 64
    # the later layout of the same guide adds no-hit-lru-scorer (weight 1, llm-d's lruSize 1,024)
    k = epp_knobs(read_epp(TIERED / "single-host-tiered-prefix-cache-cpu.values.yaml"), block_tokens=16)
    assert (k["gie_nohit_w_pct"], k["gie_nohit_lru_size"]) == (100, 1024)


def test_tiered_layouts_and_the_gpt_oss_weights(tmp_path):
    """Both producers declared (the single-host layout without no-hit-lru-scorer), the GIE-era layout (two
    prefix-cache-scorers each with its own index parameters) and the gpt-oss run's weights 2 : 2 : 3 : 2."""
    text = (TIERED / "single-host-tiered-prefix-cache-cpu.values.yaml").read_text()
    text = text.replace("        - type: no-hit-lru-scorer\n", "").replace("          - pluginRef: no-hit-lru-scorer\n",
                                                                          "")
    k = epp_knobs(read_epp(_write(tmp_path, "v.yaml", text)), block_tokens=16, capacity_blocks=7000)
    assert (k["gie_prefix_w_pct"], k["gie_lru_capacity"], k["gie_cpu_w_pct"], k["gie_cpu_lru_capacity"]) == \
        (100, 7000, 100, 82_000)
    gie_era = """kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  name: gpu-prefix-cache-scorer
- type: prefix-cache-scorer
  name: cpu-prefix-cache-scorer
  parameters:
    autoTune: false
    lruCapacityPerServer: 41000
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: gpu-prefix-cache-scorer
    weight: 3
  - pluginRef: cpu-prefix-cache-scorer
    weight: 2
"""
    sp = read_epp(_write(tmp_path, "g.yaml", gie_era))
    k = epp_knobs(sp, block_tokens=64, capacity_blocks=7000)
    assert (k["gie_queue_w_pct"], k["gie_kv_w_pct"], k["gie_prefix_w_pct"], k["gie_cpu_w_pct"]) == (200, 200, 300, 200)
    # GIE v0.5's defaults for the first (64-byte blocks, 256 of them, 31,250 hashes), a later release's for the
    # second (16 tokens x 4 bytes, 256 blocks, its own 41,000): they hash alike
    assert (k["gie_lru_capacity"], k["gie_cpu_lru_capacity"]) == (31_250, 41_000)
    assert epp_hash_config(sp, block_tokens=64, capacity_blocks=7000) == (64, 256)
    with pytest.raises(EppConfigError, match="approx-prefix-cache-producer: the two approximate prefix scorers hash"):
        epp_knobs(read_epp(_write(tmp_path, "h.yaml", gie_era.replace("autoTune: false", "autoTune: false\n"
                                                                      "    blockSizeTokens: 32"))), block_tokens=64)


def test_producer_parameters_and_refusals(tmp_path):
    assert producer_params({}) == dict(hash_block_bytes=256, max_blocks=2048, lru_capacity=31_250, auto_tune=True)
    assert producer_params({}, block_tokens=128, capacity_blocks=900) == dict(
        hash_block_bytes=512, max_blocks=1024, lru_capacity=900, auto_tune=True)
    assert producer_params({"autoTune": False, "blockSizeTokens": 96, "maxPrefixTokensToMatch": 0,
                            "maxPrefixBlocksToMatch": 10, "lruCapacityPerServer": 0}, capacity_blocks=900) == dict(
        hash_block_bytes=384, max_blocks=10, lru_capacity=31_250, auto_tune=False)
    base = (TIERED / "tiered-prefix-cache-cpu.values.yaml").read_text()
    bad = {
        "undeclared.yaml": (base.replace("prefixMatchInfoProducerName: cpuPrefixProducer",
                                         "prefixMatchInfoProducerName: nope"), "'nope' is not a declared plugin"),
        "notproducer.yaml": (base.replace("prefixMatchInfoProducerName: cpuPrefixProducer",
                                          "prefixMatchInfoProducerName: queue-scorer"),
                             "'queue-scorer' is a queue-scorer, not an approx-prefix-cache-producer"),
        "shared.yaml": (base.replace("        - type: prefix-cache-scorer\n          name: gpu-prefix-cache-scorer\n",
                                     "        - type: prefix-cache-scorer\n          name: gpu-prefix-cache-scorer\n"
                                     "          parameters:\n"
                                     "            prefixMatchInfoProducerName: cpuPrefixProducer\n"),
                        "two prefix scorers read producer 'cpuPrefixProducer'"),
        "length.yaml": (base.replace("prefixMatchInfoProducerName: cpuPrefixProducer",
                                     "prefixMatchInfoProducerName: cpuPrefixProducer\n"
                                     "            prefixLengthWeight: 0.5\n            maxModelLen: 8192"),
                        "prefixLengthWeight: the prefix length term"),
        "own.yaml": (base.replace("prefixMatchInfoProducerName: cpuPrefixProducer",
                                  "prefixMatchInfoProducerName: cpuPrefixProducer\n"
                                  "            lruCapacityPerServer: 5"),
                     "takes its index parameters from the producer"),
        "precise.yaml": (base.replace("type: approx-prefix-cache-producer", "type: precise-prefix-cache-producer"),
                         "autoTune: unknown parameter of precise-prefix-cache-producer"),
        "cap.yaml": (base.replace("lruCapacityPerServer: 41000", "lruCapacityPerServer: -1"),
                     r"parameters\.lruCapacityPerServer: must be an integer >= 1"),
    }
    for name, (text, key) in bad.items():
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            epp_knobs(read_epp(_write(tmp_path, name, text)), block_tokens=64)
    mixed = EPP_OK.replace("- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n- type: "
                           "precise-prefix-cache-scorer\n  parameters:\n    tokenProcessorConfig: {blockSize: 16}\n"
                           ).replace("  - pluginRef: queue-scorer\n", "  - pluginRef: queue-scorer\n"
                                     "  - pluginRef: precise-prefix-cache-scorer\n")
    with pytest.raises(EppConfigError, match="a precise prefix scorer beside another prefix scorer"):
        read_epp(_write(tmp_path, "mixed.yaml", mixed))


def test_study_with_the_pods_cpu_tier_and_the_tiered_guides_router(tmp_path):
    """``tiers.cpu`` gives every pod a cpu tier (the numba vllm backend's per-block mode) and the tiered guide's EPP
    file its CPU-tier scorer: the knobs reach the run (attrs), the tier serves part of the prompts, and bad tier
    keys and the JAX backend are refused in one line naming the key."""
    from omegaconf import OmegaConf

    from cacheresearch.studies import run_study
    from cacheresearch.studies.base import StudyError

    ip = _write(tmp_path, "ip.yaml", SMALL_IP)
    epp = {"tiered": str(TIERED / "tiered-prefix-cache-cpu.values.yaml"),
           "load": str(BUNDLED / "epp-load-scheduling.yaml")}

    def cfg(load_mode="overlap", **cpu):
        return OmegaConf.create(dict(kind="llmd_benchmark", name="tiered", seed=1, fleet=dict(replicas=2),
                                     replica=dict(model="llama3_8b", gpu="h100_80gb", tp=1),
                                     cache=dict(block_tokens=16, capacity_blocks=40),
                                     llmd=dict(inference_perf=str(ip), epp=epp, stage_gap_s=30, max_running=8),
                                     tiers=dict(cpu=cpu, load_mode=load_mode), engine=dict(backend="auto")))

    ds = run_study(cfg(capacity_blocks=400, read_gbps=20.0, latency_us=5.0))
    knobs = ds.attrs["knobs"]
    assert "'gie_cpu_w_pct': 100" in knobs and "'gie_cpu_lru_capacity': 41000" in knobs
    assert "capacity_blocks=400" in ds.attrs["cpu_tier"] and "block_bytes=2097152" in ds.attrs["cpu_tier"]
    assert "overlap='async'" in ds.attrs["cpu_tier"]
    cpu = ds.cpu_token_hit_rate.values
    assert np.all(np.isfinite(cpu)) and cpu.max() > 0 and np.all(cpu <= ds.token_hit_rate.values + 1e-12)
    assert np.all(ds.offloaded_blocks.values > 0)
    for bad, key in ((cfg(capacity_blocks=400, bogus=1), "tiers.cpu.bogus: unknown key"),
                     (cfg(load_mode="later", capacity_blocks=400), "tiers.load_mode"),
                     (cfg(capacity_blocks=-1), "tiers.cpu.capacity_blocks")):
        with pytest.raises(StudyError, match=key):
            run_study(bad)
    jax_cfg = cfg(capacity_blocks=400)
    jax_cfg.engine.backend = "jax"
    with pytest.raises(StudyError, match="engine.backend=jax"):
        run_study(jax_cfg)


PRECISE_PRODUCER = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: precise-prefix-cache-producer
    parameters:
      tokenProcessorConfig:
        blockSizeTokens: 64
      indexerConfig:
        kvBlockIndexConfig:
          enableMetrics: true
      kvEventsConfig:
        topicFilter: "kv@"
        engineType: "vllm"
  - type: prefix-cache-scorer
    parameters:
      prefixMatchInfoProducerName: precise-prefix-cache-producer
  - type: kv-cache-utilization-scorer
  - type: queue-scorer
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: kv-cache-utilization-scorer
        weight: 2.0
      - pluginRef: queue-scorer
        weight: 2.0
      - pluginRef: prefix-cache-scorer
        weight: 3.0
"""


def test_precise_producer_with_its_tier_weights(tmp_path):
    """llm-d-router's precise producer read by a prefix-cache-scorer: matched / total on the precise view (mode 1,
    no window), the cpu tier weighed as its kvCacheBackendConfigs say (default 0.8; a tier a given list omits
    weighs 1.0)."""
    k = epp_knobs(read_epp(_write(tmp_path, "p.yaml", PRECISE_PRODUCER)), block_tokens=64)
    assert (k["view"], k["gie_prefix_mode"], k["gie_window_blocks"], k["gie_prefix_w_pct"]) == ("precise", 1, 0, 300)
    assert k["gie_cpu_tier_w_pct"] == 80 and (k["gie_kv_w_pct"], k["gie_queue_w_pct"]) == (200, 200)
    tiers = PRECISE_PRODUCER.replace("          enableMetrics: true\n", "          enableMetrics: true\n"
                                     "        kvCacheBackendConfigs:\n          - {name: gpu, weight: 1.0}\n")
    assert epp_knobs(read_epp(_write(tmp_path, "t.yaml", tiers)), block_tokens=64)["gie_cpu_tier_w_pct"] == 100
    cpu = tiers.replace("{name: gpu, weight: 1.0}", "{name: gpu, weight: 1.0}\n          - {name: cpu, weight: 0.5}")
    assert epp_knobs(read_epp(_write(tmp_path, "c.yaml", cpu)), block_tokens=64)["gie_cpu_tier_w_pct"] == 50
    bad = {"blk.yaml": (PRECISE_PRODUCER, 16, "blockSizeTokens: 64 tokens, but the pods' blocks are 16"),
           "gpu.yaml": (tiers.replace("weight: 1.0}", "weight: 0.9}"), 64, "modelled with the gpu tier at 1"),
           "spec.yaml": (PRECISE_PRODUCER.replace("      kvEventsConfig:", "      speculativeIndexing: true\n"
                                                  "      kvEventsConfig:"), 64, "speculativeIndexing"),
           "sess.yaml": (PRECISE_PRODUCER.replace("      kvEventsConfig:", "      sessionManager: s\n"
                                                  "      kvEventsConfig:"), 64, "sessionManager")}
    for name, (text, bt, key) in bad.items():
        with pytest.raises(EppConfigError, match=rf"{name}: .*{key}"):
            epp_knobs(read_epp(_write(tmp_path, name, text)), block_tokens=bt)

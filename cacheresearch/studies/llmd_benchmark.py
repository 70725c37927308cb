"""``experiment=llmd_benchmark``: an llm-d benchmark of the 73-capacity series, run from its own files.

Inputs: one inference-perf file (``llmd.inference_perf``; :mod:`cacheresearch.workload.inference_perf`) and
one EPP ``EndpointPickerConfig`` per arm (``llmd.epp``: ``{ARM: FILE}``; :mod:`cacheresearch.routers.epp`);
with neither, the bundled 73-capacity files (``llmd/73-capacity/``, ``SOURCE.txt``), arms ``precise``,
``approximate``, ``load``, ``random``; ``llmd.bundled=37-capacity`` takes the series' 37-capacity files
instead (``llmd/37-capacity/``: Llama-3.1-70B on 4 pods, held out; ``experiment=llmd_benchmark_37``). The
pods: ``fleet.replicas`` vllm replicas of ``replica.model`` on ``replica.tp`` x ``replica.gpu`` with
``cache.block_tokens``-token blocks and ``cache.capacity_blocks`` blocks (from the hardware when null),
scheduler limits vLLM's defaults for that GPU
(:func:`~cacheresearch.replica.roofline.vllm_scheduler_defaults`) unless ``fleet.knobs`` sets them, step time
from the roofline (:mod:`cacheresearch.replica.roofline`).

Each arm is one continuous run over every stage (caches and the approximate index carry over), the
stages separated by ``llmd.stage_gap_s`` of idle time so that each drains before the next starts
(inference-perf's wait); ``stage_drained`` says whether it did. ``llmd.overhead_ms`` (default 250) is
added to every client-measured TTFT: the gateway, EPP, tokenizer and HTTP time a simulator of the pods does
not have. **Assumption**, read off the 73-capacity report's lowest stage (precise at 3 QPS: 0.29 s mean TTFT
with almost full hits, so about 0.25 s per request outside the pods), one constant for every benchmark of
the series, never set per benchmark; a pure addition after the simulation (routing and the pods never see
it: :func:`client_ttft_s`); ``llmd.overhead_ms=0`` is the what-if without it.
``llmd.max_requests_per_stage`` runs a reduced benchmark (the first requests of each stage).

Dataset: dims ``arm`` x ``stage`` (coordinates ``stage_rate``, ``stage_duration_s``, ``stage_warmup``):
``ttft_p90_s``, ``ttft_mean_s``, ``output_tokens_per_s``, ``requests_per_s``, ``token_hit_rate``,
``itl_mean_s`` (inference-perf's ITL mean as the series measured it: ``llmd.itl_events_per_token`` client
timestamps per output token, default 2, so about half the time per token: ``ITL_EVENTS_NOTE``), ``tpot_mean_s``
(the time per output token itself), ``kv_usage_mean`` (KV blocks in use / pool) and ``waiting_mean``
(waiting requests per pod), time means over each stage's span (start to last finish), ``stage_drained``,
``n_requests``; per arm the whole run's time means ``kv_usage_mean_run`` and ``waiting_mean_run`` (idle gaps
included), ``preemptions``, ``dropped``; and the summaries over the non-warm-up stages (``llmd.warmup_stages``,
default auto: the leading stages the file's comments mark as warm-up)
``ttft_p90_s_all``, ``ttft_mean_s_all``, ``output_tokens_per_s_all``, ``requests_per_s_all`` as the series'
report generator computes its "Summary across QPS" (:func:`report_summary`: the p90 is a successes-weighted
mean of per-stage p90s, the throughput a plain mean of per-stage throughputs), ``ttft_p90_s_pooled_all``
(the pooled p90 of those stages' requests, for comparison), ``itl_mean_s_all`` and ``tpot_mean_s_all``
(successes-weighted as the TTFT mean), ``kv_usage_mean_all``, ``waiting_mean_all``
(time means over the stages' spans). Per-stage figures follow inference-perf's ``summarize_requests``.

The approximate arm runs on GIE's own index (view ``gie_estimate``): the stream carries the prompts'
byte-block hashes under ``llmd.bytes_per_token`` (an assumption, default 4: GIE's own guess), one stream
per estimate-mode hash configuration. ``llmd.metrics_refresh_ms`` (default 50: GIE v0.5.1's
``DefaultRefreshMetricsInterval``; 0 = live) is how often the schedulers' load metrics are scraped;
``llmd.load_gauges`` (default 1) says what a scrape reads: vLLM V1's gauges, ``num_requests_waiting`` and KV
usage as of the end of each pod's last completed engine step (``Scheduler.make_stats`` at the end of
``update_from_output``; new requests join the waiting queue between steps, ``EngineCoreProc.run_busy_loop``),
so a request admitted at the step after its arrival is never seen waiting; 0 reads the pods' state at the
scrape instead. ``llmd.client_permits`` (default auto) is inference-perf's client: ``num_workers x
worker_max_concurrency`` permits, each taken in send order before a request goes and held to its last token
(the vllm replica's ``client_permits``, a closed loop; TTFT and throughput count from the actual sends); auto
reads them from the file's ``load`` section when it sets ``num_workers`` and is otherwise open loop, an
assumption (inference-perf's default is the client machine's CPU count, which no report states). The file's
``load.request_timeout`` (none in the bundled files) is the replica's ``client_timeout_ms``: the client gives up
then, vLLM aborts the request, and it is a failure (``timed_out`` per arm; the stage figures count successes).
``published_*`` hold the report's figures beside ours when the files are the bundled ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
import xarray as xr
from omegaconf import OmegaConf

from cacheresearch.core.params import make_params
from cacheresearch.core.stream import compile_stream
from cacheresearch.replica.hardware import block_bytes, kv_blocks
from cacheresearch.replica.roofline import step_coefficients, vllm_scheduler_defaults
from cacheresearch.routers.epp import EppConfigError, epp_hash_config, epp_knobs, read_epp
from cacheresearch.studies.base import Cells, Study, StudyError, common_attrs
from cacheresearch.workload.gie_hashes import gie_hashes_shared_prefix
from cacheresearch.workload.inference_perf import (
    InferencePerfError,
    read_inference_perf,
    shared_prefix_workload,
    stage_drained,
)

__all__ = ["BENCHMARKS", "BUNDLED", "BUNDLED_37", "BUNDLED_EPP", "BUNDLED_EPP_37", "PUBLISHED", "PUBLISHED_37",
           "client_ttft_s", "gie_streams", "inference_perf_itl_s", "llmd_benchmark_study", "summarize_llmd_benchmark",
           "plot_llmd_benchmark", "STUDIES"]

BUNDLED = Path(__file__).resolve().parent / "llmd" / "73-capacity"
BUNDLED_EPP = {"precise": "epp-precise-scheduling.yaml", "approximate": "epp-estimated-scheduling.yaml",
               "load": "epp-load-scheduling.yaml", "random": "epp-random-scheduling.yaml"}

_R = [3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60]
#: The report's per-stage tables (llm-d-kv-cache-manager benchmarking/73-capacity/README.md at d070ea6), the
#: 16 ladder stages, and its "Summary across QPS" row.
PUBLISHED = {
    "ttft_p90_s": {
        "precise": [0.498, 0.600, 0.400, 0.600, 0.500, 0.583, 0.509, 0.500, 0.488, 0.500, 0.589, 0.600, 0.507, 0.600,
                    0.600, 0.500],
        "approximate": [0.497, 0.499, 0.400, 0.600, 0.700, 0.609, 0.708, 2.459, 43.018, 43.515, 44.930, 46.335,
                        47.284, 50.108, 49.930, 50.226],
        "load": [1.609, 4.124, 7.002, 77.707, 72.972, 85.979, 83.806, 88.086, 100.911, 101.524, 105.884, 105.015,
                 108.572, 110.681, 113.278, 110.184],
        "random": [0.820, 1.398, 2.299, 70.273, 78.420, 82.943, 86.182, 91.519, 101.272, 101.142, 101.265, 103.514,
                   105.004, 104.321, 106.816, 105.988],
    },
    "ttft_mean_s": {
        "precise": [0.291, 0.335, 0.249, 0.363, 0.300, 0.303, 0.296, 0.275, 0.269, 0.281, 0.293, 0.311, 0.288, 0.308,
                    0.319, 0.283],
        "approximate": [0.300, 0.271, 0.232, 0.329, 0.407, 0.370, 0.373, 2.780, 13.160, 16.941, 18.081, 19.111,
                        21.940, 22.327, 23.423, 24.281],
        "load": [0.944, 2.241, 4.013, 29.229, 28.710, 32.534, 32.831, 33.874, 53.545, 53.802, 56.746, 55.208, 58.807,
                 58.467, 61.750, 58.497],
        "random": [0.622, 0.826, 1.278, 25.073, 28.185, 30.689, 32.212, 34.043, 54.196, 53.247, 53.572, 56.130,
                   56.035, 54.844, 56.803, 57.426],
    },
    "output_tokens_per_s": {
        "precise": [1219.1, 3902.1, 5761.1, 9184.5, 9382.0, 9242.2, 9221.8, 9780.6, 10270.8, 10054.8, 10128.7,
                    10296.5, 10284.6, 10140.9, 10313.9, 10496.9],
        "approximate": [1310.9, 3842.4, 5152.9, 8082.6, 8415.7, 8445.1, 8435.9, 7443.5, 8045.9, 7969.6, 7695.2,
                        7455.9, 7452.3, 7100.7, 7013.8, 7247.9],
        "load": [1274.8, 3607.0, 3348.4, 4902.5, 4785.5, 4872.8, 4888.7, 4660.7, 4946.4, 4973.3, 4723.6, 4004.8,
                 3991.0, 4671.9, 3866.5, 4745.1],
        "random": [1314.0, 3568.5, 3791.1, 4933.1, 4765.4, 4781.3, 4636.3, 4332.6, 4773.8, 4844.6, 4969.5, 4783.2,
                   4845.1, 4921.7, 4764.2, 4835.2],
    },
    # inference-perf's ITL mean as the report prints it: about half the time per output token (see
    # ITL_EVENTS_NOTE; its ITL p50 is 0.0000 at every stage of every arm)
    "itl_mean_s": {
        "precise": [0.011, 0.013, 0.015, 0.021, 0.020, 0.021, 0.021, 0.021, 0.027, 0.028, 0.028, 0.029, 0.029, 0.029,
                    0.029, 0.029],
        "approximate": [0.011, 0.013, 0.015, 0.021, 0.022, 0.022, 0.023, 0.026, 0.027, 0.026, 0.026, 0.026, 0.026,
                        0.026, 0.026, 0.026],
        "load": [0.012, 0.016, 0.020, 0.024, 0.024, 0.024, 0.024, 0.024, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025,
                 0.025, 0.025],
        "random": [0.012, 0.016, 0.020, 0.024, 0.024, 0.024, 0.024, 0.024, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025,
                   0.025, 0.025],
    },
}
PUBLISHED_ALL = {
    "ttft_p90_s": {"precise": 0.542, "approximate": 31.083, "load": 94.865, "random": 92.551},
    "ttft_mean_s": {"precise": 0.298, "approximate": 13.316, "load": 46.987, "random": 45.281},
    "output_tokens_per_s": {"precise": 8730.0, "approximate": 6944.4, "load": 4266.4, "random": 4428.7},
    "itl_mean_s": {"precise": 0.026, "approximate": 0.024, "load": 0.024, "random": 0.025},
    # the report's EPP summary over its whole run (KV usage mean as a fraction; waiting requests mean)
    "kv_usage_mean": {"precise": 0.593, "approximate": 0.662, "load": 0.543, "random": 0.590},
    "waiting_mean": {"precise": 0.1, "approximate": 8.1, "load": 28.9, "random": 27.3},
}
PUBLISHED_RATES = _R

BUNDLED_37 = Path(__file__).resolve().parent / "llmd" / "37-capacity"
BUNDLED_EPP_37 = {"precise": "epp-precise-prefix-cache_load.yaml", "approximate": "epp-estimate-prefix-cache_load.yaml",
                  "load": "epp-load.yaml", "random": "epp-random.yaml"}
#: The 37-capacity report's per-stage tables (llm-d-kv-cache-manager benchmarking/37-capacity/README.md at edb766f;
#: its arms precise-prefix-cache_load, estimate-prefix-cache_load, load, random), the 9 ladder stages
#: (3, 4, 5, 6, 8, 10, 12, 15, 20 QPS), and its "Summary across QPS" row. Held out: nothing was set from them.
PUBLISHED_37 = {
    "ttft_p90_s": {
        "precise": [0.400, 0.486, 0.400, 0.400, 0.400, 0.400, 0.400, 0.400, 0.400],
        "approximate": [2.200, 3.402, 4.322, 30.211, 64.280, 66.291, 81.511, 103.779, 165.276],
        "load": [3.299, 15.818, 31.501, 88.121, 101.514, 129.421, 115.098, 148.000, 208.052],
        "random": [2.000, 22.814, 30.994, 56.371, 74.757, 88.089, 96.284, 128.434, 197.010],
    },
    "ttft_mean_s": {
        "precise": [0.246, 0.304, 0.270, 0.271, 0.248, 0.242, 0.255, 0.247, 0.250],
        "approximate": [1.007, 1.497, 1.919, 9.700, 20.389, 26.567, 31.615, 38.253, 71.632],
        "load": [1.548, 5.021, 11.329, 31.824, 42.683, 47.727, 53.087, 67.339, 86.643],
        "random": [1.102, 7.257, 11.988, 23.742, 40.124, 46.359, 49.556, 58.760, 93.345],
    },
    "output_tokens_per_s": {
        "precise": [2590.0, 3345.2, 3916.7, 4640.3, 5557.1, 6264.0, 6765.9, 7345.1, 8003.9],
        "approximate": [2573.6, 3326.3, 3691.2, 3724.3, 3571.6, 3798.6, 3773.5, 3200.9, 3017.1],
        "load": [2545.4, 2967.6, 2943.6, 2656.5, 2506.3, 2620.3, 2897.6, 2549.1, 2334.5],
        "random": [2505.7, 2829.5, 2898.2, 2955.9, 3108.8, 3117.3, 3140.8, 3126.2, 3241.0],
    },
    "itl_mean_s": {
        "precise": [0.013, 0.015, 0.016, 0.017, 0.019, 0.020, 0.022, 0.024, 0.031],
        "approximate": [0.017, 0.020, 0.024, 0.027, 0.028, 0.028, 0.028, 0.028, 0.029],
        "load": [0.019, 0.026, 0.026, 0.027, 0.027, 0.027, 0.027, 0.027, 0.028],
        "random": [0.020, 0.026, 0.026, 0.027, 0.028, 0.027, 0.027, 0.027, 0.028],
    },
}
PUBLISHED_ALL_37 = {
    "ttft_p90_s": {"precise": 0.409, "approximate": 64.430, "load": 98.318, "random": 84.938},
    "ttft_mean_s": {"precise": 0.259, "approximate": 25.337, "load": 40.689, "random": 40.915},
    "output_tokens_per_s": {"precise": 5380.9, "approximate": 3408.6, "load": 2669.0, "random": 2991.5},
    "itl_mean_s": {"precise": 0.020, "approximate": 0.026, "load": 0.026, "random": 0.026},
    # the report's EPP summary over its whole run (KV usage mean as a fraction; waiting requests mean)
    "kv_usage_mean": {"precise": 0.593, "approximate": 0.690, "load": 0.741, "random": 0.750},
    "waiting_mean": {"precise": 0.5, "approximate": 26.8, "load": 37.6, "random": 36.6},
}
#: the bundled benchmarks of the series (``llmd.bundled``): files, arms and the report's figures
BENCHMARKS = {
    "73-capacity": dict(dir=BUNDLED, epp=BUNDLED_EPP, published=PUBLISHED, published_all=PUBLISHED_ALL),
    "37-capacity": dict(dir=BUNDLED_37, epp=BUNDLED_EPP_37, published=PUBLISHED_37, published_all=PUBLISHED_ALL_37),
}

DEFAULTS = dict(bundled="73-capacity", inference_perf=None, epp=None, warmup_stages="auto", stage_gap_s=600.0,
                overhead_ms=250.0, max_requests_per_stage=None, bytes_per_token=4.0, metrics_refresh_ms=50,
                load_gauges=1, max_running=256, client_permits="auto", itl_events_per_token=2.0, seed=None)

OVERHEAD_NOTE = ("assumption: fixed gateway / EPP / tokenizer / HTTP time outside the pods, added to every client "
                 "TTFT after the simulation; default 250 ms read off the 73-capacity report's lowest stage (precise "
                 "at 3 QPS: 0.29 s mean TTFT with almost full hits), one constant for the series")


ITL_EVENTS_NOTE = (
    "inference-perf's ITL as the series measured it: one client timestamp per streamed SSE event, about two per "
    "output token (the series' reports print an ITL p50 of 0.0000 at every stage: half the gaps are between the "
    "two events of one token; the 64p report's CSV gives 3.5e-05 s), so its ITL mean is about half the time per "
    "output token. Read in two sources: BLIS's training-data schema ('vLLM sends paired SSE data/event lines, "
    "resulting in approximately 2x entries relative to output_tokens ... ITL = diff(output_token_times[::2])') "
    "and inference-perf's own later fix (#564/#566: ITL 'roughly halved' by a second timestamp per streamed "
    "chunk); the reports' own tables agree (73-capacity and 37-capacity at 3 QPS: the time per token implied by "
    "the stage span is 2.2-2.3x the ITL mean). itl_mean_s = sum of (last token - first token) over the stage's "
    "requests / sum of (events_per_token x output tokens - 1); tpot_mean_s is the time per output token itself")


def inference_perf_itl_s(decode_ms, output_tokens, events_per_token: float) -> float:
    """inference-perf's pooled ITL mean (s) over a set of requests: the sum of their inter-event gaps over the
    number of gaps, with ``events_per_token`` client timestamps per output token (``ITL_EVENTS_NOTE``; 1 gives
    the time per output token). ``decode_ms``: each request's first token to its last token."""
    d = np.asarray(decode_ms, np.float64)
    gaps = np.asarray(output_tokens, np.float64) * float(events_per_token) - 1.0
    keep = gaps > 0
    return float(d[keep].sum() / gaps[keep].sum() / 1000.0) if keep.any() else np.nan


class LlmdBenchmarkError(ValueError):
    pass


def cpu_tier_of(cfg, model, tp: int, block_tokens: int, kv_dtype: str):
    """The pods' cpu tier from the run's ``tiers`` (the sweep's schema, ``TiersConf``; None: capacity 0).
    ``tiers.cpu``: ``capacity_blocks`` per pod (vLLM's ``num_cpu_blocks``), ``read_gbps`` / ``latency_us`` of a
    pod's host-to-device link (null: the cpu tier's defaults, 50 GB/s and 10 us), ``write_gbps``, ``memory_gib``,
    ``policy`` (lru); ``tiers.load_mode``: ``serial`` (LMCache's connector: the admitting step waits for its loads)
    or ``overlap`` (vLLM's OffloadingConnector). A block's bytes: one GPU's share, ``replica.model``'s KV bytes per
    token / ``replica.tp`` x ``cache.block_tokens`` (each TP rank loads its share over its own link; ``tiers.model``
    is the routing sweep's). Errors are one line naming the key (``tiers.*``)."""
    from cacheresearch.studies.tiers_vllm import OVERLAP_OF  # noqa: PLC0415
    from cacheresearch.tiers.spec import DEFAULT_TIERS  # noqa: PLC0415
    from cacheresearch.tiers.vllm import cpu_tier  # noqa: PLC0415

    tc = _get(cfg, "tiers")
    if tc is None:
        return None
    if not isinstance(tc, dict):
        tc = OmegaConf.to_container(tc, resolve=True)
    for t in ("pool", "disk"):
        if int((tc.get(t) or {}).get("capacity_blocks") or 0) > 0:
            raise LlmdBenchmarkError(f"tiers.{t}.capacity_blocks: the llm-d benchmark's pods take a cpu tier only")
    c = {k: v for k, v in (tc.get("cpu") or {}).items() if v is not None}
    for k in c:
        if k not in DEFAULT_TIERS["cpu"]:
            raise LlmdBenchmarkError(f"tiers.cpu.{k}: unknown key; known keys are {sorted(DEFAULT_TIERS['cpu'])}")
    mode = tc.get("load_mode", "serial")
    if mode not in OVERLAP_OF:
        raise LlmdBenchmarkError(f"tiers.load_mode: {mode!r}; choose one of {', '.join(OVERLAP_OF)}")
    bb = block_bytes(model, kv_dtype=kv_dtype, tp=tp, block_tokens=block_tokens)
    t = cpu_tier(block_bytes=bb, overlap=OVERLAP_OF[mode], where="tiers.", **c)
    return t if t.capacity_blocks > 0 else None


def _run_arms(streams, sid, ps, seed: int, tier, R: int, S: int, Q: int, backend: str):
    """Generator: the arms' finalized metrics [arm] and the cpu tier's outputs (None without a tier). Without one
    every arm is a cell of one batch the pipeline runs as chunks (resumable; ``engine.max_batch``); with the pods'
    cpu tier the numba vllm backend's per-block mode runs them here (:func:`_run_tiered`, not resumable)."""
    if tier is None:
        mm = yield Cells(streams, sid, ps, [seed] * len(ps), max_replicas=R,
                         options=dict(per_request=True, scheduler="vllm", max_running=S, queue_slots=Q,
                                      backend=backend))
        return mm, None
    return _run_tiered(streams, sid, ps, seed, tier, R, S, Q, backend)


def _run_tiered(streams, sid, ps, seed: int, tier, R: int, S: int, Q: int, backend: str):
    """Every arm on the numba vllm backend's per-block mode with the pods' cpu tier (:func:`run_stream_tiered`,
    one call per stream); the finalized metrics stacked [arm] as the pipeline returns them, the per-request cpu-hit
    blocks [arm, N] and the blocks offloaded [arm]."""
    from cacheresearch.core.simulate import static_options  # noqa: PLC0415
    from cacheresearch.metrics.core import finalize  # noqa: PLC0415
    from cacheresearch.tiers.vllm import run_stream_tiered  # noqa: PLC0415

    out, cpu, off = [None] * len(ps), [None] * len(ps), np.zeros(len(ps), np.int64)
    for k in sorted(set(sid)):
        idx = [i for i, x in enumerate(sid) if x == k]
        st_ = static_options(ps[idx[0]], max_replicas=R, per_request=True, scheduler="vllm", max_running=S,
                             queue_slots=Q, max_runs=int(np.max(np.asarray(streams[k].n_runs))), index=False,
                             stale=False)
        try:
            res = run_stream_tiered(streams[k], [ps[i] for i in idx], [jax.random.key(seed)] * len(idx), st_,
                                    [tier] * len(idx), backend=backend)
        except ValueError as e:
            raise StudyError(str(e)) from None
        m = finalize(res.metrics, st_)
        for j, i in enumerate(idx):
            out[i] = jax.tree.map(lambda x, j=j: np.asarray(x)[j], m)
            cpu[i], off[i] = np.asarray(res.cpu_hit_blocks[j]), int(res.offloaded_blocks[j])
    return jax.tree.map(lambda *xs: np.stack(xs), *out), (np.stack(cpu), off)


def _tier_vars(mm, cpu_hit, offl, w, stage, K: int, bt: int) -> dict:
    """``cpu_token_hit_rate`` [arm, stage] (the prompt tokens read from the cpu tier over the stage's served
    requests' prompt tokens) and ``offloaded_blocks`` [arm]."""
    ok = (np.asarray(mm.ttft_ms) >= 0) & (np.asarray(mm.e2e_ms) >= 0)
    rate = np.full((ok.shape[0], K), np.nan)
    for i in range(ok.shape[0]):
        for k in range(K):
            sel = ok[i] & (stage == k)
            if sel.any():
                rate[i, k] = float(cpu_hit[i][sel].sum() * bt / w.input_tokens[sel].sum())
    return {"cpu_token_hit_rate": (("arm", "stage"), rate), "offloaded_blocks": (("arm",), offl.astype(np.float64))}


def gie_streams(w, ip, hcfg: dict, bytes_per_token: float) -> tuple[list, list]:
    """One compiled stream of the shared-prefix workload ``w`` per estimate-mode hash configuration among the arms'
    ``hcfg`` (``{ARM: (hash block bytes, blocks matched) or None}``: GIE's prompt-byte hashes under
    ``bytes_per_token``), and those configurations in order; arms without one read the first stream (with no
    configuration at all, a stream without GIE hashes)."""
    confs = sorted({c for c in hcfg.values() if c is not None})
    streams = [compile_stream(w, stateful_singletons=True, gie_hashes=gie_hashes_shared_prefix(
        w.tenant, w.meta["prompt"], system_len=ip.data.system_prompt_len, question_len=ip.data.question_len,
        bytes_per_token=float(bytes_per_token), hash_block_bytes=hb, max_blocks=mb)) for hb, mb in confs] \
        or [compile_stream(w, stateful_singletons=True)]
    return streams, confs


def _llmd_cfg(cfg) -> dict:
    given = cfg.get("llmd") if hasattr(cfg, "get") else None
    if given is not None and not isinstance(given, dict):
        given = OmegaConf.to_container(given, resolve=True)
    out = dict(DEFAULTS)
    for k, v in (given or {}).items():
        if k not in DEFAULTS:
            raise LlmdBenchmarkError(f"llmd.{k}: unknown key; known keys are {sorted(DEFAULTS)}")
        out[k] = v
    if int(out["metrics_refresh_ms"]) < 0:
        raise LlmdBenchmarkError(f"llmd.metrics_refresh_ms must be >= 0, got {out['metrics_refresh_ms']}")
    if not float(out["itl_events_per_token"]) >= 1:
        raise LlmdBenchmarkError(f"llmd.itl_events_per_token must be >= 1 (client timestamps per output token), "
                                 f"got {out['itl_events_per_token']}")
    return out


def _get(cfg, dotted, default=None):
    node = cfg
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part)
    return default if node is None else node


def _gauges(m, stage, K: int, warm: int, starts, fin, ok_all, cap: int, R: int):
    """Per-stage time means of KV usage (blocks in use / pool) and waiting requests per pod, over the stage's
    span (its start to its last finish), and the same over the non-warm-up stages. The engine's integrals
    at each arrival (``kv_acc_at``, ``q_acc_at``) are differenced between the stages' first arrivals; the
    stages drain before the next starts, so the idle time between them adds nothing."""
    kv_at = np.asarray(m.kv_acc_at).astype(np.float64)
    q_at = np.asarray(m.q_acc_at).astype(np.float64)
    first = [int(np.argmax(stage == k)) if np.any(stage == k) else -1 for k in range(K)]
    ends_kv = [kv_at[first[k + 1]] if k + 1 < K and first[k + 1] >= 0 else float(np.sum(m.kv_acc))
               for k in range(K)]
    ends_q = [q_at[first[k + 1]] if k + 1 < K and first[k + 1] >= 0 else float(np.sum(m.q_acc)) for k in range(K)]
    kv, wq = np.full(K, np.nan), np.full(K, np.nan)
    tot = np.zeros(3)
    for k in range(K):
        ok = ok_all & (stage == k)
        if first[k] < 0 or not ok.any():
            continue
        span = fin[ok].max() - starts[k]
        dkv, dq = ends_kv[k] - kv_at[first[k]], ends_q[k] - q_at[first[k]]
        kv[k], wq[k] = dkv / (cap * R * span), dq / (R * span)
        if k >= warm:
            tot += (dkv, dq, span)
    if tot[2] <= 0:
        return kv, wq, np.nan, np.nan
    return kv, wq, tot[0] / (cap * R * tot[2]), tot[1] / (R * tot[2])


def client_ttft_s(pod_ttft_ms, overhead_ms: float) -> np.ndarray:
    """The client-measured TTFT (s): the pods' TTFT (ms, from the simulation) plus the fixed overhead outside
    the pods (``llmd.overhead_ms``, an assumption). Applied after the simulation: it changes no routing
    decision and no pod dynamics, only shifts every TTFT by the same constant."""
    return (np.asarray(pod_ttft_ms).astype(np.float64) + float(overhead_ms)) / 1000.0


def report_summary(rate, successes, completed, send_s, ttft_p90, ttft_mean, out_tok_s, means=None) -> dict:
    """The report's "Summary across QPS" from per-stage figures, as the series' report generator computes it
    (llm-d-kv-cache-manager's benchmark aggregator, ``aggregate_per_qps`` then ``_build_summary_across_qps``):
    stages of the same requested rate are first merged into one row (successes, completed requests and send
    durations summed, TTFT p90 / mean and output tokens/s averaged); then over the rows: output tokens/s is
    the plain mean of the rows' throughputs, requests/s the completed requests over the summed send durations,
    TTFT mean and TTFT p90 the successes-weighted means of the rows' values (so the summary "p90" is a
    weighted mean of per-stage p90s, not a pooled percentile). Checked to the report's digits on the
    load-with-headroom (64p) benchmark's ``analysis_metrics.csv`` (``tests/test_llmd_benchmark_inputs.py``).
    ``means`` (optional, ``{NAME: per-stage values}``) are summarised as the TTFT mean is, successes-weighted, as
    ``NAME_all`` (the ITL mean: the 64p report's 0.023 s for precise; a plain mean of its rows gives 0.022)."""
    rate = np.asarray(rate, np.float64)
    means = dict(means or {})
    rows = sorted(set(rate.tolist()))
    agg = {k: [] for k in ("succ", "comp", "dur", "p90", "mean", "tok", *means)}
    for r in rows:
        sel = rate == r
        agg["succ"].append(np.sum(np.asarray(successes, np.float64)[sel]))
        agg["comp"].append(np.sum(np.asarray(completed, np.float64)[sel]))
        agg["dur"].append(np.nansum(np.asarray(send_s, np.float64)[sel]))
        for k, x in (("p90", ttft_p90), ("mean", ttft_mean), ("tok", out_tok_s), *means.items()):
            agg[k].append(np.nanmean(np.asarray(x, np.float64)[sel]) if np.isfinite(np.asarray(x)[sel]).any()
                          else np.nan)
    a = {k: np.asarray(v) for k, v in agg.items()}
    ok = a["succ"] > 0
    w = a["succ"][ok]
    out = dict(ttft_p90_s_all=float(np.sum(a["p90"][ok] * w) / w.sum()) if ok.any() else np.nan,
               ttft_mean_s_all=float(np.sum(a["mean"][ok] * w) / w.sum()) if ok.any() else np.nan,
               output_tokens_per_s_all=float(np.nanmean(a["tok"])) if np.isfinite(a["tok"]).any() else np.nan,
               requests_per_s_all=float(a["comp"].sum() / a["dur"].sum()) if a["dur"].sum() > 0 else np.nan)
    for k in means:
        wk = ok & np.isfinite(a[k])
        out[f"{k}_all"] = float(np.sum(a[k][wk] * a["succ"][wk]) / a["succ"][wk].sum()) if wk.any() else np.nan
    return out


def _arm_metrics(m, w, stage, K: int, warm: int, ov: float, rates, events_per_token: float = 2.0):
    """One arm's per-stage figures as inference-perf reports a stage (``summarize_requests``: TTFT p90 by
    ``np.percentile``, with the fixed overhead; output tokens/s over the stage's first send to its last
    finish; requests/s over its send duration, first send to last), inference-perf's ITL mean as the series
    measured it (:func:`inference_perf_itl_s`) and its TPOT (the mean over requests of (last token - first token)
    / (output tokens - 1)), the token hit rate, the report's summary
    over the non-warm-up stages (:func:`report_summary`) beside the pooled p90 of those stages' requests,
    and which stages drained."""
    # the sends: the scheduled arrivals, later where the client's permits held a request back (client_permits)
    arr = w.arrival_ms.astype(np.float64) + np.asarray(m.client_wait_ms).astype(np.float64)
    ttft = np.asarray(m.ttft_ms).astype(np.float64)
    e2e = np.asarray(m.e2e_ms).astype(np.float64)
    hit = np.asarray(m.hit_tokens).astype(np.float64)
    # inference-perf's successes: served, and by the client's deadline (load.request_timeout: status 0)
    served = (ttft >= 0) & (e2e >= 0) & (np.asarray(m.status) == 0)
    fin = np.where(served, arr + e2e, -1)
    tt = client_ttft_s(ttft, ov)
    dec = np.where(served, e2e - ttft, np.nan)  # ms, first token to last (the overhead shifts both ends)
    out_tok = np.asarray(w.output_tokens).astype(np.float64)
    per = {v: np.full(K, np.nan) for v in ("ttft_p90_s", "ttft_mean_s", "output_tokens_per_s", "requests_per_s",
                                           "token_hit_rate", "itl_mean_s", "tpot_mean_s")}
    succ, comp, send = np.zeros(K), np.zeros(K), np.full(K, np.nan)
    for k in range(K):
        sel = stage == k
        ok = sel & served
        succ[k], comp[k] = ok.sum(), sel.sum()
        if sel.sum() > 1:
            send[k] = (arr[sel].max() - arr[sel].min()) / 1000.0
            per["requests_per_s"][k] = sel.sum() / send[k] if send[k] > 0 else np.nan
        if not ok.any():
            continue
        per["ttft_p90_s"][k] = float(np.percentile(tt[ok], 90))
        per["ttft_mean_s"][k] = float(tt[ok].mean())
        span = (fin[ok].max() - arr[sel].min()) / 1000.0
        per["output_tokens_per_s"][k] = float(w.output_tokens[ok].sum()) / span if span > 0 else np.nan
        per["token_hit_rate"][k] = float(hit[ok].sum() / w.input_tokens[ok].sum())
        per["itl_mean_s"][k] = inference_perf_itl_s(dec[ok], out_tok[ok], events_per_token)
        multi = ok & (out_tok > 1)
        if multi.any():
            per["tpot_mean_s"][k] = float(np.mean(dec[multi] / (out_tok[multi] - 1.0)) / 1000.0)
    lad = slice(warm, K)
    alls = report_summary(np.asarray(rates)[lad], succ[lad], comp[lad], send[lad], per["ttft_p90_s"][lad],
                          per["ttft_mean_s"][lad], per["output_tokens_per_s"][lad],
                          means={v: per[v][lad] for v in ("itl_mean_s", "tpot_mean_s")})
    pooled = served & (stage >= warm)
    alls["ttft_p90_s_pooled_all"] = float(np.percentile(tt[pooled], 90)) if pooled.any() else np.nan
    return per, alls, stage_drained(arr, fin, stage), fin, served


def _model_of(model, ip) -> str:
    """``replica.model``: a preset, a ``config.json`` path, or ``auto`` (null): the preset whose Hugging Face id
    is the inference-perf file's ``server.model_name`` (else its tokenizer's name)."""
    from cacheresearch.replica.hardware import preset_for_hf_id  # noqa: PLC0415

    if model is not None and str(model) != "auto":
        return str(model)
    for name in (ip.model_name, ip.tokenizer_name):
        if name and preset_for_hf_id(name):
            return preset_for_hf_id(name)
    raise LlmdBenchmarkError(
        f"replica.model=auto: {ip.file} names the model {ip.model_name or ip.tokenizer_name or '(none)'!r}, which is "
        "no preset's Hugging Face id (replica/hardware.py HF_MODEL_IDS); set replica.model to a preset or to the path "
        "of the model's config.json")


def _published_vars(bench: dict, names, K: int) -> dict:
    """The report's per-stage figures (``published_*``, the ladder after the warm-up stage) and summaries
    (``published_*_all``) of a bundled benchmark, for the arms it names; none when the stages differ."""
    tabs = bench["published"]
    if K != len(next(iter(tabs["ttft_p90_s"].values()))) + 1:
        return {}
    dv = {}
    for v, tab in tabs.items():
        x = np.full((len(names), K), np.nan)
        for i, a in enumerate(names):
            if a in tab:
                x[i, 1:] = tab[a]
        dv[f"published_{v}"] = (("arm", "stage"), x)
    for v, tab in bench["published_all"].items():
        dv[f"published_{v}_all"] = (("arm",), np.array([tab.get(a, np.nan) for a in names]))
    return dv


def llmd_benchmark_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    try:
        lc = _llmd_cfg(cfg)
        if lc["bundled"] not in BENCHMARKS:
            raise LlmdBenchmarkError(f"llmd.bundled: {lc['bundled']!r} is not a bundled benchmark "
                                     f"({sorted(BENCHMARKS)})")
        bench = BENCHMARKS[lc["bundled"]]
        ip_path = Path(lc["inference_perf"]) if lc["inference_perf"] else bench["dir"] / "inference-perf.yaml"
        ip = read_inference_perf(ip_path)
        epp = lc["epp"] or {a: str(bench["dir"] / f) for a, f in bench["epp"].items()}
        if not isinstance(epp, dict) or not epp:
            raise LlmdBenchmarkError("llmd.epp must be a mapping {ARM: FILE}")
        R = int(_get(cfg, "fleet.replicas", 8))
        model = _model_of(_get(cfg, "replica.model", "auto"), ip)
        gpu = str(_get(cfg, "replica.gpu", "h100_80gb"))
        tp = int(_get(cfg, "replica.tp", 2))
        bt = int(_get(cfg, "cache.block_tokens", 64))
        cap = _get(cfg, "cache.capacity_blocks")
        cap = int(cap) if cap is not None else kv_blocks(
            model, gpu, tp=tp, block_tokens=bt, kv_dtype=str(_get(cfg, "replica.kv_dtype", "bf16")),
            gpu_memory_utilization=float(_get(cfg, "replica.gpu_memory_utilization", 0.9)))
        tier = cpu_tier_of(cfg, model, tp, bt, str(_get(cfg, "replica.kv_dtype", "bf16")))
        specs = {a: read_epp(f) for a, f in epp.items()}
        arms = {a: epp_knobs(sp, block_tokens=bt, capacity_blocks=cap) for a, sp in specs.items()}
        hcfg = {a: epp_hash_config(sp, block_tokens=bt, capacity_blocks=cap) for a, sp in specs.items()}
        refresh = int(lc["metrics_refresh_ms"])
    except (InferencePerfError, EppConfigError, LlmdBenchmarkError, ValueError) as e:
        raise StudyError(str(e)) from None
    seed = int(lc["seed"] if lc["seed"] is not None else _get(cfg, "seed", 0))
    w = shared_prefix_workload(ip, block_tokens=bt, seed=seed, stage_gap_s=float(lc["stage_gap_s"]),
                               max_requests_per_stage=lc["max_requests_per_stage"])
    sched = vllm_scheduler_defaults(gpu)
    knobs = dict(_get(cfg, "fleet.knobs", {}) or {})
    knobs = {k: v for k, v in (OmegaConf.to_container(knobs) if not isinstance(knobs, dict) else knobs).items()
             if v is not None}
    step = step_coefficients(model, gpu, tp)
    base = dict(max_num_seqs=sched["max_num_seqs"], max_num_batched_tokens=sched["max_num_batched_tokens"],
                **{k: v for k, v in step.items() if k.startswith("step_")})
    base.update(knobs)
    streams, confs = gie_streams(w, ip, hcfg, float(lc["bytes_per_token"]))
    stage = w.meta["stage"]
    K = len(ip.stages)
    n_stage = np.bincount(stage, minlength=K)
    Q = int(max(n_stage.max(), 1)) + 8
    S = int(min(int(lc["max_running"]), int(base["max_num_seqs"])))
    seqs_capped = int(base["max_num_seqs"]) > S
    base["max_num_seqs"] = min(int(base["max_num_seqs"]), S)  # the static bound, stated in the attrs
    ov = float(lc["overhead_ms"])
    ev = float(lc["itl_events_per_token"])
    warm, warm_src = _warmup(lc["warmup_stages"], ip, K)
    client, permits_src = _client(lc["client_permits"], ip)
    names = list(arms)
    per = {v: np.full((len(names), K), np.nan) for v in ("ttft_p90_s", "ttft_mean_s", "output_tokens_per_s",
                                                          "requests_per_s", "token_hit_rate", "itl_mean_s",
                                                          "tpot_mean_s", "kv_usage_mean", "waiting_mean")}
    drained = np.zeros((len(names), K), bool)
    run_vars = {v: np.full(len(names), np.nan) for v in ("kv_usage_mean_run", "waiting_mean_run", "preemptions",
                                                         "dropped", "timed_out", "wall_s")}
    alls = {v: np.full(len(names), np.nan) for v in ("ttft_p90_s_all", "ttft_mean_s_all", "output_tokens_per_s_all",
                                                     "requests_per_s_all", "kv_usage_mean_all", "waiting_mean_all",
                                                     "ttft_p90_s_pooled_all", "itl_mean_s_all", "tpot_mean_s_all")}
    starts = w.meta["stage_start_ms"].astype(np.float64)
    durs = np.array([s.duration for s in ip.stages])
    ps = []
    for a in names:
        kn = dict(base, load_refresh_ms=refresh, load_gauges=int(lc["load_gauges"]), **client)
        kn.update({k: v for k, v in arms[a].items() if k != "router"})
        ps.append(make_params("lru", capacity_blocks=cap, replicas=R, router=arms[a]["router"], **kn))
    sid = [confs.index(hcfg[a]) if hcfg[a] is not None else 0 for a in names]
    t1 = time.perf_counter()
    mm, tier_out = yield from _run_arms(streams, sid, ps, seed, tier, R, S, Q, str(_get(cfg, "engine.backend", "auto")))
    run_vars["wall_s"][:] = (time.perf_counter() - t1) / len(ps)
    for i, a in enumerate(names):
        m = jax.tree.map(lambda x, i=i: x[i], mm)
        st_i, all_i, drained[i], fin_i, ok_i = _arm_metrics(m, w, stage, K, warm, ov, [s.rate for s in ip.stages],
                                                            events_per_token=ev)
        st_i["kv_usage_mean"], st_i["waiting_mean"], all_i["kv_usage_mean_all"], all_i["waiting_mean_all"] = \
            _gauges(m, stage, K, warm, starts, fin_i, ok_i, cap, R)
        for v, x in st_i.items():
            per[v][i] = x
        for v, x in all_i.items():
            alls[v][i] = x
        run_vars["kv_usage_mean_run"][i] = float(m.kv_util_mean)
        run_vars["waiting_mean_run"][i] = float(m.queue_len_mean)
        for v, x in (("preemptions", m.preemptions), ("dropped", m.dropped), ("timed_out", m.requests_timed_out)):
            run_vars[v][i] = int(x)
    coords = dict(arm=names, stage=np.arange(K), stage_rate=("stage", [s.rate for s in ip.stages]),
                  stage_duration_s=("stage", durs), stage_warmup=("stage", np.arange(K) < warm))
    dv = {v: (("arm", "stage"), x) for v, x in per.items()}
    dv["stage_drained"] = (("arm", "stage"), drained)
    dv["n_requests"] = (("stage",), n_stage)
    dv.update({v: (("arm",), x) for v, x in {**run_vars, **alls}.items()})
    dv.update(_tier_vars(mm, *tier_out, w, stage, K, bt) if tier is not None else {})
    if lc["inference_perf"] is None and lc["epp"] is None:
        dv.update(_published_vars(bench, names, K))
    ds = xr.Dataset(dv, coords=coords)
    ds.attrs.update(common_attrs(cfg, "llmd_benchmark", t0, dict(
        bundled=lc["bundled"], inference_perf=str(ip_path), epp=repr({a: str(f) for a, f in epp.items()}), replicas=R,
        model=model, gpu=gpu,
        tp=tp, block_tokens=bt, capacity_blocks=cap, step_source=step["source"], sched_source=sched["source"],
        knobs=repr({a: arms[a] for a in names}), base_knobs=repr(base), overhead_ms=ov,
        overhead_note=OVERHEAD_NOTE,
        bytes_per_token=float(lc["bytes_per_token"]),
        bytes_per_token_note="assumption: prompt bytes per token, for GIE's byte-block hashes (GIE's own guess: 4)",
        metrics_refresh_ms=refresh, gie_hash_configs=repr(confs),
        max_requests_per_stage=-1 if lc["max_requests_per_stage"] is None else int(lc["max_requests_per_stage"]),
        stage_gap_s=float(lc["stage_gap_s"]), warmup_stages=warm, warmup_source=warm_src,
        client_permits=client["client_permits"], client_permits_source=permits_src,
        itl_events_per_token=ev, itl_note=ITL_EVENTS_NOTE,
        request_timeout_s=-1.0 if ip.request_timeout_s is None else ip.request_timeout_s, max_running=S, queue_slots=Q,
        max_num_seqs_capped=int(seqs_capped),
        cpu_tier=repr(tier) if tier is not None else "none",
        all_stages_drained=int(drained.all()))))
    return ds


def _client(v, ip) -> tuple[dict, str]:
    """The client's knobs (``client_permits``: :func:`_client_permits`, and where they come from; ``client_timeout_ms``:
    inference-perf's ``load.request_timeout``, seconds, none: no timeout)."""
    permits, src = _client_permits(v, ip)
    ms = 0 if ip.request_timeout_s is None else max(int(round(ip.request_timeout_s * 1000)), 1)
    return dict(client_permits=permits, client_timeout_ms=ms), src


def _client_permits(v, ip) -> tuple[int, str]:
    """``llmd.client_permits``: inference-perf's permits (``num_workers x worker_max_concurrency``, a closed loop;
    0: an open loop). ``auto`` takes them from the file when it sets ``load.num_workers``; else inference-perf
    takes the client machine's ``cpu_count()``, which no file or report states, and the run is open loop (the
    assumption: a client with enough CPUs that its permits never bind)."""
    if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
        if ip.client_permits is not None:
            return ip.client_permits, (f"auto: the file's load.num_workers {ip.num_workers} x worker_max_concurrency "
                                       f"{ip.worker_max_concurrency}")
        return 0, ("auto: open loop (the file leaves load.num_workers to the client machine's cpu_count(), which it "
                   "does not state: assumed large enough that the permits never bind)")
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise StudyError(f"llmd.client_permits must be auto or an integer >= 0, got {v!r}") from None
    if n < 0 or isinstance(v, bool):
        raise StudyError(f"llmd.client_permits must be auto or an integer >= 0, got {v!r}")
    return n, "llmd.client_permits" + ("" if n else " (0: open loop)")


def _warmup(v, ip, K: int) -> tuple[int, str]:
    """``llmd.warmup_stages``: ``auto`` reads the file's stage comments (:attr:`InferencePerfConfig.warmup_stages`),
    an integer is taken as given; either must leave at least one stage in the ladder."""
    if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
        warm = ip.warmup_stages
        src = (f"auto: stage comment {ip.stage_notes[0]!r}" if warm else "auto: no stage comment names a warm-up")
    else:
        try:
            warm = int(v)
        except (TypeError, ValueError):
            raise StudyError(f"llmd.warmup_stages must be auto or an integer, got {v!r}") from None
        src = "llmd.warmup_stages"
    if not 0 <= warm < K:
        raise StudyError(f"llmd.warmup_stages must be in [0, {K - 1}], got {warm} ({src})")
    return warm, src


def summarize_llmd_benchmark(ds: xr.Dataset) -> str:
    lines = [f"{ds.attrs.get('experiment', 'llmd_benchmark')}: {ds.attrs.get('inference_perf', '')}",
             f"pods {ds.attrs['replicas']} x {ds.attrs['model']} on {ds.attrs['tp']} x {ds.attrs['gpu']}, "
             f"{ds.attrs['capacity_blocks']} blocks of {ds.attrs['block_tokens']}; {ds.attrs['step_source']}",
             f"reduced run: {ds.attrs['max_requests_per_stage']} requests per stage at most" if
             ds.attrs.get("max_requests_per_stage", -1) >= 0 else "full run",
             f"warm-up stages left out of the summaries: {ds.attrs['warmup_stages']} "
             f"({ds.attrs.get('warmup_source', 'llmd.warmup_stages')})",
             f"client permits: {ds.attrs.get('client_permits', 0)} ({ds.attrs.get('client_permits_source', '')})",
             f"all stages drained: {bool(ds.attrs['all_stages_drained'])}"]
    if ds.attrs.get("cpu_tier", "none") != "none" and "cpu_token_hit_rate" in ds:
        share = ", ".join(f"{a} {float(np.nanmean(ds.cpu_token_hit_rate.sel(arm=a).values)):.3f}"
                          for a in ds.arm.values)
        lines.append(f"pods' cpu tier: {ds.attrs['cpu_tier']}; prompt tokens read from it (mean over stages): {share}")
    if ds.attrs.get("request_timeout_s", -1) > 0:
        lines.append(f"the file's load.request_timeout ({ds.attrs['request_timeout_s']:g} s): the client gives up "
                     "then and vLLM aborts the request (client_timeout_ms); timed out per arm: "
                     + ", ".join(f"{a} {int(t)}" for a, t in zip(ds.arm.values, ds.timed_out.values)))
    lines.append("")
    last = int(ds.stage.values[-1])
    rate = f"{float(ds.stage_rate.sel(stage=last)):g}"  # the last stage (60 QPS in the bundled files)
    hdr = (f"| arm | TTFT p90 all (s) | pooled p90 (s) | TTFT mean all (s) | output tok/s all "
           f"| {rate}-QPS (last) stage p90 (s) | ITL mean all (s) | TPOT all (s) | KV mean | waiting |")
    lines += [hdr, "|---|---|---|---|---|---|---|---|---|---|"]
    for a in ds.arm.values:
        r = ds.sel(arm=a)

        def pub(v, rr=r):
            return f" ({float(rr[v]):.3g})" if v in rr and np.isfinite(float(rr[v])) else ""

        pooled = float(r.ttft_p90_s_pooled_all) if "ttft_p90_s_pooled_all" in r else np.nan
        lines.append(f"| {a} | {float(r.ttft_p90_s_all):.3g}{pub('published_ttft_p90_s_all')} | {pooled:.3g} "
                     f"| {float(r.ttft_mean_s_all):.3g}{pub('published_ttft_mean_s_all')} "
                     f"| {float(r.output_tokens_per_s_all):,.0f}{pub('published_output_tokens_per_s_all')} "
                     f"| {float(r.ttft_p90_s.sel(stage=last)):.3g} "
                     f"| {float(r.itl_mean_s_all):.3f}{pub('published_itl_mean_s_all')} "
                     f"| {float(r.tpot_mean_s_all):.3f} | {float(r.kv_usage_mean_all):.2f} "
                     f"| {float(r.waiting_mean_all):.2f} |")
    lines += ["", "(published in parentheses; \"all\" is the report generator's summary across QPS: p90 and mean "
              "successes-weighted over the stages, tok/s the plain mean of the stages'; ITL is inference-perf's as the "
              f"series measured it, {float(ds.attrs.get('itl_events_per_token', 2)):g} client timestamps per output "
              "token (llmd.itl_events_per_token), TPOT the time per output token itself)", "",
              "TTFT p90 per stage (s):", ""]
    lines.append("| rate | " + " | ".join(str(a) for a in ds.arm.values) + " |")
    lines.append("|---" * (1 + ds.sizes["arm"]) + "|")
    for k in ds.stage.values:
        row = [f"{float(ds.stage_rate.sel(stage=k)):g}" + (" (warm-up)" if bool(ds.stage_warmup.sel(stage=k)) else "")]
        for a in ds.arm.values:
            v = float(ds.ttft_p90_s.sel(arm=a, stage=k))
            p = float(ds.published_ttft_p90_s.sel(arm=a, stage=k)) if "published_ttft_p90_s" in ds else np.nan
            row.append(f"{v:.3g}" + (f" ({p:.3g})" if np.isfinite(p) else ""))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_llmd_benchmark(ds: xr.Dataset):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    vars_ = ["ttft_p90_s", "ttft_mean_s", "output_tokens_per_s", "itl_mean_s", "token_hit_rate", "kv_usage_mean",
             "waiting_mean"]
    vars_ = [v for v in vars_ if v in ds]
    fig, axes = plt.subplots(1, len(vars_), figsize=(4.5 * len(vars_), 4.5))
    ladder = ~ds.stage_warmup.values
    x = ds.stage_rate.values[ladder]
    for ax, v in zip(axes, vars_):
        for j, a in enumerate(ds.arm.values):
            col = f"C{j}"
            ax.plot(x, ds[v].sel(arm=a).values[ladder], "o-", color=col, label=f"{a} (ours)", ms=3)
            pv = f"published_{v}"
            if pv in ds:
                ax.plot(x, ds[pv].sel(arm=a).values[ladder], "x--", color=col, label=f"{a} (report)", ms=4)
        ax.set_xlabel("stage rate (QPS)")
        ax.set_title(v)
        if v.startswith("ttft"):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="x-small")
    fig.suptitle(f"{ds.attrs.get('experiment', '')}: ours (solid) vs the report (dashed)")
    fig.tight_layout()
    return fig


STUDIES = [Study("llmd_benchmark", llmd_benchmark_study, summarize_llmd_benchmark, plot_llmd_benchmark)]

"""``experiment=llmd_tiered``: llm-d's published tiered-prefix-cache runs, reproduced from their own files.

A run is a folder (``llmd_tiered.run``: a bundled name, :data:`RUNS`, or a path) holding the inference-perf
profile (``inference-perf.yaml``), one EPP ``EndpointPickerConfig`` per arm, ``run.yaml`` (the deployment as
the files state it: model, replicas, TP, GPU, block size, GPU and CPU cache sizes or the bytes they come from,
which arm has the CPU tier; each number with its source in ``SOURCE.txt``) and, when published,
``published.json`` (the report's tables). Nothing is set from the published outputs.

Each arm is one continuous run over every stage on the numba vllm replica (:mod:`cacheresearch.tiers.vllm`):
``fleet`` replicas with ``gpu_cache_tokens / block_tokens`` GPU blocks (or the hardware's count at the file's
``gpu_memory_utilization``), the arm's router read from its EPP file (:mod:`cacheresearch.routers.epp`), and,
where the arm offloads, a CPU tier of ``cpu_cache_tokens / block_tokens`` blocks (or ``cpu_bytes`` over the
block's bytes) behind vLLM's OffloadingConnector: offload on eviction, asynchronous loads
(``llmd_tiered.load_mode``: ``async``, the connector's ``WAITING_FOR_REMOTE_KVS``; ``sync`` is LMCache's).
**Assumptions** (attrs): the host link's read bandwidth and latency (``llmd_tiered.cpu_read_gbps`` 50 GB/s,
``cpu_latency_us`` 10: no file states them), the time outside the pods (``llmd_tiered.overhead_ms``, the llm-d
series' 250 ms: :data:`~cacheresearch.studies.llmd_benchmark.OVERHEAD_NOTE`), GIE's 4 bytes per token.

Per arm and stage, as inference-perf reports a stage: TTFT mean / p90, request latency (E2E) mean / p90, total
tokens/s (input + output over the stage's first send to its last finish), requests/s, the token hit rate of
each tier; per arm over the whole run: those figures over every request, the CPU-tier share of the hit tokens,
preemptions. ``published_*`` hold the report's numbers beside ours (NaN where the report has no such stage).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import xarray as xr
import yaml

from cacheresearch.studies.base import Study, StudyError, common_attrs

__all__ = ["RUNS", "llmd_tiered_study", "summarize_llmd_tiered", "plot_llmd_tiered", "read_run", "STUDIES"]

_HERE = Path(__file__).resolve().parent / "llmd"
#: the bundled published runs (folders under studies/llmd/, each with SOURCE.txt)
RUNS = {"qwen3-32b": _HERE / "tiered-qwen3-32b", "gpt-oss-120b": _HERE / "tiered-gpt-oss-120b"}
DEFAULTS = dict(run="qwen3-32b", max_requests_per_stage=None, stage_gap_s=600.0, overhead_ms=250.0,
                cpu_read_gbps=50.0, cpu_latency_us=10.0, load_mode="async", bytes_per_token=4.0, max_running=512,
                gpu_overhead_gib=0.0, counter_mode="per_attempt", seed=0)
_RUN_KEYS = {"model", "replicas", "tp", "gpu", "block_tokens", "gpu_cache_tokens", "gpu_memory_utilization",
             "cpu_cache_tokens", "cpu_bytes", "max_num_seqs", "connector_supports_hma", "cpu_index_at_gpu_blocks",
             "arms"}
STAGE_VARS = ("ttft_mean_s", "ttft_p90_s", "e2e_mean_s", "e2e_p90_s", "tokens_per_s", "output_tokens_per_s",
              "requests_per_s",
              "gpu_hit_rate", "cpu_hit_rate")
RUN_VARS = ("ttft_mean_s_run", "ttft_median_s_run", "ttft_p90_s_run", "e2e_mean_s_run", "e2e_p90_s_run",
            "requests_per_s_ok_run", "input_tokens_per_s_run", "output_tokens_per_s_run", "gpu_hit_rate_run",
            "cpu_hit_rate_run", "preemptions", "dropped", "offloaded_blocks", "requests_timed_out",
            "vllm_prefix_cache_queries_tokens", "vllm_prefix_cache_hits_tokens", "gpu_hit_rate_counter",
            "vllm_external_queries_tokens", "vllm_external_hits_tokens", "external_hit_rate_counter", "wall_s")


def _cfg(cfg) -> dict:
    from omegaconf import OmegaConf  # noqa: PLC0415 - the shell's config object

    given = cfg.get("llmd_tiered") if hasattr(cfg, "get") else None
    if given is not None and not isinstance(given, dict):
        given = OmegaConf.to_container(given, resolve=True)
    out = dict(DEFAULTS)
    for k, v in (given or {}).items():
        if k not in DEFAULTS:
            raise StudyError(f"llmd_tiered.{k}: unknown key; known keys are {sorted(DEFAULTS)}")
        out[k] = v
    if out["counter_mode"] not in ("per_attempt", "per_admission"):
        raise StudyError(f"llmd_tiered.counter_mode: {out['counter_mode']!r}; choose per_attempt or per_admission")
    if out["load_mode"] not in ("async", "sync"):
        raise StudyError(f"llmd_tiered.load_mode: {out['load_mode']!r}; choose async or sync")
    for k in ("cpu_read_gbps", "overhead_ms", "stage_gap_s", "cpu_latency_us", "gpu_overhead_gib"):
        if not float(out[k]) >= 0:
            raise StudyError(f"llmd_tiered.{k} must be >= 0, got {out[k]!r}")
    return out


def read_run(run) -> tuple[Path, dict, dict | None]:
    """The run's folder, its ``run.yaml`` (checked: known keys, positive sizes, every arm's EPP file present) and
    its ``published.json`` (None when absent)."""
    d = RUNS.get(str(run), Path(str(run)))
    f = d / "run.yaml"
    if not f.is_file():
        raise StudyError(f"llmd_tiered.run: {run!r} is neither a bundled run ({sorted(RUNS)}) nor a folder with a "
                         "run.yaml")
    r = yaml.safe_load(f.read_text()) or {}
    bad = sorted(set(r) - _RUN_KEYS)
    if bad:
        raise StudyError(f"{f}: unknown key {bad[0]!r}; known keys are {sorted(_RUN_KEYS)}")
    for k in ("replicas", "tp", "block_tokens"):
        if not isinstance(r.get(k), int) or r[k] < 1:
            raise StudyError(f"{f}: key {k!r} must be an integer >= 1, got {r.get(k)!r}")
    if not isinstance(r.get("arms"), dict) or not r["arms"]:
        raise StudyError(f"{f}: key 'arms' must map each arm to {{epp: FILE, cpu_tier: true|false}}")
    for a, spec in r["arms"].items():
        extra = sorted(set(spec) - {"epp", "cpu_tier", "hybrid_manager"}) if isinstance(spec, dict) else []
        if extra:
            raise StudyError(f"{f}: arm {a!r}: unknown key {extra[0]!r}; known keys are cpu_tier, epp, hybrid_manager")
        if not isinstance(spec, dict) or not (d / str(spec.get("epp", ""))).is_file():
            epp = spec.get("epp") if isinstance(spec, dict) else spec
            raise StudyError(f"{f}: arm {a!r}: its epp file {epp} is not in the folder")
    if any(s.get("cpu_tier") for s in r["arms"].values()) and not (r.get("cpu_cache_tokens") or r.get("cpu_bytes")):
        raise StudyError(f"{f}: an arm has the CPU tier but neither cpu_cache_tokens nor cpu_bytes is given")
    pub = json.loads((d / "published.json").read_text()) if (d / "published.json").is_file() else None
    return d, r, pub


def _model(d: Path, r: dict) -> str:
    m = str(r.get("model") or "")
    if not m:
        raise StudyError(f"{d / 'run.yaml'}: key 'model' is missing")
    return str(d / m) if (d / m).is_file() else m


def hybrid_manager(r: dict, arm: str) -> bool:
    """Whether vLLM runs the arm with its hybrid KV cache manager: always, unless the arm has a KV connector (the
    CPU tier) that is not ``SupportsHMA`` (``run.yaml`` ``connector_supports_hma``, default false: vLLM's
    OffloadingConnector before v0.21.0; ``vllm/config/vllm.py`` then disables the manager and
    ``unify_hybrid_kv_cache_specs`` promotes window layers to full attention). An arm's own ``hybrid_manager``
    (true / false) overrides the rule: a what-if (vLLM's ``--disable-hybrid-kv-cache-manager``)."""
    spec = r["arms"][arm]
    if spec.get("hybrid_manager") is not None:  # a what-if: the arm's own setting
        return bool(spec["hybrid_manager"])
    return not (spec.get("cpu_tier") and not r.get("connector_supports_hma", False))


def _sizes(d: Path, r: dict, arm: str, overhead_gib: float = 0.0) -> dict:
    """The arm's GPU blocks per replica, CPU-tier blocks and a block's bytes (the files' figures; the hardware's
    where the files give bytes or a memory fraction), under the layout vLLM runs for the arm
    (:func:`hybrid_manager`)."""
    from cacheresearch.replica.hardware import kv_blocks, kv_cache_layout  # noqa: PLC0415
    from cacheresearch.replica.kv_layout import engine_knobs  # noqa: PLC0415

    model, bt, tp = _model(d, r), int(r["block_tokens"]), int(r["tp"])
    hm = hybrid_manager(r, arm)
    try:
        lay = kv_cache_layout(model, tp=tp, block_tokens=bt, hybrid_manager=hm)
        if r.get("gpu_cache_tokens"):
            gpu, gsrc = int(r["gpu_cache_tokens"]) // bt, "run.yaml gpu_cache_tokens"
        else:
            util = float(r.get("gpu_memory_utilization") or 0.9)
            gpu = kv_blocks(model, str(r.get("gpu", "h100_80gb")), tp=tp, block_tokens=bt, gpu_memory_utilization=util,
                            hybrid_manager=hm, overhead_bytes=int(float(overhead_gib) * (1 << 30)))
            gsrc = (f"the hardware's KV blocks at gpu_memory_utilization {util}, {float(overhead_gib):g} GiB per GPU "
                    "of activations and graphs (llmd_tiered.gpu_overhead_gib)")
    except ValueError as e:
        raise StudyError(f"llmd_tiered: model {model}: {e}") from None
    try:
        kv = engine_knobs(lay) if lay.hybrid else {}  # the vllm replica's KV groups (kv_layout.engine_knobs)
    except ValueError as e:
        raise StudyError(f"llmd_tiered ({d.name}): arm {arm!r}: {e}") from None
    bb = lay.block_bytes
    if r.get("cpu_cache_tokens"):
        cpu, csrc = int(r["cpu_cache_tokens"]) // bt, "run.yaml cpu_cache_tokens"
    else:
        cpu, csrc = (int(r["cpu_bytes"]) // bb if r.get("cpu_bytes") else 0), "run.yaml cpu_bytes / block bytes"
    return dict(model=model, gpu_blocks=gpu, gpu_source=gsrc, cpu_blocks=cpu, cpu_source=csrc, block_bytes=bb,
                hybrid_manager=hm, kv_knobs=kv, layout=f"{len(lay.groups)} group(s) of {lay.group_size} layers, "
                                          f"{lay.block_bytes:,} bytes a block id")


def _streams(w, ip, specs: dict, bt: int, caps: dict, bpt: float):
    """One compiled stream per GIE hash configuration of the arms' EPP files (llmd_benchmark.gie_streams) and
    each arm's stream."""
    from cacheresearch.routers.epp import epp_hash_config  # noqa: PLC0415
    from cacheresearch.studies.llmd_benchmark import gie_streams  # noqa: PLC0415

    hcfg = {a: epp_hash_config(sp, block_tokens=bt, capacity_blocks=caps[a]) for a, sp in specs.items()}
    streams, confs = gie_streams(w, ip, hcfg, bpt)
    return streams, {a: confs.index(c) if c is not None else 0 for a, c in hcfg.items()}


def _run_seconds(arr, fin, stage, K: int, interval_s: float) -> float:
    """The run's length as inference-perf's multi-worker load generator lays it out (``LoadGenerator.mp_run``):
    a stage ends when its last request has finished, then the generator sleeps ``load.interval`` seconds and
    the next stage's first request is scheduled one second after it starts (``run_stage``: ``start_time =
    perf_counter() + 1``). The simulation separates stages by a long idle gap instead; LRU pools and GIE's
    index are order-based, so a stage that starts after a drained one runs the same however long the idle time,
    and the stages' own spans (first send to last finish) are laid end to end here."""
    total = 0.0
    for k in range(K):
        sel = stage == k
        if sel.any():
            total += (np.max(np.where(fin[sel] >= arr[sel], fin[sel], arr[sel])) - arr[sel].min()) / 1000.0
    return total + (K - 1) * (float(interval_s) + 1.0)


def _counters(m) -> dict:
    """vLLM's own prefix-cache counters of configuration 0 (tokens, as ``counter_mode`` counts them) and the
    hit rates a dashboard shows from them (hits / queries), beside the requests that timed out."""
    from cacheresearch.metrics.core import combine_limbs  # noqa: PLC0415

    vc = combine_limbs(m.vllm_counters_hi, m.vllm_counters_lo).reshape(-1, 4)[0].astype(np.float64)
    return dict(vllm_prefix_cache_queries_tokens=vc[0], vllm_prefix_cache_hits_tokens=vc[1],
                gpu_hit_rate_counter=vc[1] / vc[0] if vc[0] > 0 else np.nan, vllm_external_queries_tokens=vc[2],
                vllm_external_hits_tokens=vc[3], external_hit_rate_counter=vc[3] / vc[2] if vc[2] > 0 else np.nan,
                requests_timed_out=int(np.asarray(m.requests_timed_out).reshape(-1)[0]))


def _stage_figures(m, g: int, cpu_blocks, w, K: int, ov_s: float, interval_s: float) -> tuple[dict, dict]:
    """Configuration ``g``'s per-stage and whole-run figures (module docstring), inference-perf's way: TTFT and
    latency over the successful requests, throughput over a stage's first send to its last finish, the whole
    run's rates over its length (:func:`_run_seconds`)."""
    n = int(w.n_requests)
    arr = w.arrival_ms.astype(np.float64) + np.asarray(m.client_wait_ms[g])[:n].astype(np.float64)
    ttft = np.asarray(m.ttft_ms[g])[:n].astype(np.float64)
    e2e = np.asarray(m.e2e_ms[g])[:n].astype(np.float64)
    ok = (ttft >= 0) & (e2e >= 0)
    if np.asarray(m.status).size:  # the client's outcome: 0 ok (1 timed out, 2 never served)
        ok &= np.asarray(m.status[g])[:n] == 0
    tt, ee = ttft / 1000.0 + ov_s, e2e / 1000.0 + ov_s
    fin = arr + e2e
    inp, out = w.input_tokens.astype(np.float64), w.output_tokens.astype(np.float64)
    hit = np.asarray(m.hit_tokens[g])[:n].astype(np.float64)
    cpu = np.asarray(cpu_blocks)[:n].astype(np.float64) * int(w.block_tokens)
    stage = np.asarray(w.meta["stage"])
    per = {v: np.full(K, np.nan) for v in STAGE_VARS}
    for k in range(K):
        sel = stage == k
        s_ok = sel & ok
        if sel.sum() > 1:
            per["requests_per_s"][k] = s_ok.sum() / ((arr[sel].max() - arr[sel].min()) / 1000.0)
        if not s_ok.any():
            continue
        per["ttft_mean_s"][k], per["ttft_p90_s"][k] = tt[s_ok].mean(), np.percentile(tt[s_ok], 90)
        per["e2e_mean_s"][k], per["e2e_p90_s"][k] = ee[s_ok].mean(), np.percentile(ee[s_ok], 90)
        span = (fin[s_ok].max() - arr[sel].min()) / 1000.0
        per["tokens_per_s"][k] = (inp[s_ok].sum() + out[s_ok].sum()) / span if span > 0 else np.nan
        per["output_tokens_per_s"][k] = out[s_ok].sum() / span if span > 0 else np.nan
        per["gpu_hit_rate"][k] = (hit[s_ok].sum() - cpu[s_ok].sum()) / inp[s_ok].sum()
        per["cpu_hit_rate"][k] = cpu[s_ok].sum() / inp[s_ok].sum()
    run = dict.fromkeys(RUN_VARS, np.nan)
    if ok.any():
        span = _run_seconds(arr, fin, stage, K, interval_s)
        run.update(ttft_mean_s_run=tt[ok].mean(), ttft_median_s_run=np.median(tt[ok]),
                   ttft_p90_s_run=np.percentile(tt[ok], 90), e2e_mean_s_run=ee[ok].mean(),
                   e2e_p90_s_run=np.percentile(ee[ok], 90), requests_per_s_ok_run=ok.sum() / span,
                   input_tokens_per_s_run=inp[ok].sum() / span, output_tokens_per_s_run=out[ok].sum() / span,
                   gpu_hit_rate_run=(hit[ok].sum() - cpu[ok].sum()) / inp[ok].sum(),
                   cpu_hit_rate_run=cpu[ok].sum() / inp[ok].sum())
    return per, run


def _arms(d: Path, r: dict, sz: dict, c: dict):
    """Per arm: its router knobs (from its EPP file), its CPU tier, and the pods' base knobs (roofline step
    model, vLLM's scheduler defaults for the GPU, the file's max_num_seqs)."""
    from cacheresearch.replica.roofline import step_coefficients, vllm_scheduler_defaults  # noqa: PLC0415
    from cacheresearch.routers.epp import EppConfigError, epp_knobs, read_epp  # noqa: PLC0415
    from cacheresearch.tiers.vllm import cpu_tier  # noqa: PLC0415

    gpu, bt = str(r.get("gpu", "h100_80gb")), int(r["block_tokens"])
    try:
        specs = {a: read_epp(d / s["epp"]) for a, s in r["arms"].items()}
        rehash = bool(r.get("cpu_index_at_gpu_blocks", False))  # an approximation run.yaml states (epp_knobs)
        knobs = {a: epp_knobs(sp, block_tokens=bt, capacity_blocks=sz[a]["gpu_blocks"],
                              second_index_at_first_blocks=rehash) for a, sp in specs.items()}
        step = step_coefficients(_model(d, r), gpu, int(r["tp"]))
    except (EppConfigError, ValueError) as e:
        raise StudyError(f"llmd_tiered ({d.name}): {e}") from None
    sched = vllm_scheduler_defaults(gpu)
    seqs = int(r.get("max_num_seqs") or sched["max_num_seqs"])
    base = dict(max_num_seqs=min(seqs, int(c["max_running"])), max_num_batched_tokens=sched["max_num_batched_tokens"],
                **{k: v for k, v in step.items() if k.startswith("step_")})
    tiers = {a: cpu_tier(capacity_blocks=sz[a]["cpu_blocks"] if s.get("cpu_tier") else 0,
                         read_gbps=float(c["cpu_read_gbps"]), latency_us=float(c["cpu_latency_us"]),
                         block_bytes=sz[a]["block_bytes"], overlap=str(c["load_mode"]))
             for a, s in r["arms"].items()}
    return specs, knobs, tiers, base, dict(step_source=step["source"], sched_source=sched["source"],
                                             max_num_seqs_file=seqs)


def llmd_tiered_study(cfg) -> xr.Dataset:
    import jax  # noqa: PLC0415

    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.simulate import static_options  # noqa: PLC0415
    from cacheresearch.tiers.vllm import run_stream_tiered  # noqa: PLC0415
    from cacheresearch.workload.inference_perf import (  # noqa: PLC0415
        InferencePerfError,
        read_inference_perf,
        shared_prefix_workload,
    )

    t0 = time.perf_counter()
    c = _cfg(cfg)
    d, r, pub = read_run(c["run"])
    try:
        ip = read_inference_perf(d / "inference-perf.yaml")
    except InferencePerfError as e:
        raise StudyError(str(e)) from None
    sz = {a: _sizes(d, r, a, float(c["gpu_overhead_gib"])) for a in r["arms"]}
    interval = float(((yaml.safe_load((d / "inference-perf.yaml").read_text()) or {}).get("load") or {})
                     .get("interval", 1.0))  # inference-perf's default
    specs, knobs, tiers, base, src = _arms(d, r, sz, c)
    bt, R, K = int(r["block_tokens"]), int(r["replicas"]), len(ip.stages)
    w = shared_prefix_workload(ip, block_tokens=bt, seed=int(c["seed"]), stage_gap_s=float(c["stage_gap_s"]),
                               max_requests_per_stage=c["max_requests_per_stage"])
    streams, sid = _streams(w, ip, specs, bt, {a: z["gpu_blocks"] for a, z in sz.items()}, float(c["bytes_per_token"]))
    names = list(r["arms"])
    timeout_ms = int(round(1000 * float(ip.request_timeout_s))) if ip.request_timeout_s else 0  # load.request_timeout
    per = {v: np.full((len(names), K), np.nan) for v in STAGE_VARS}
    run = {v: np.full(len(names), np.nan) for v in RUN_VARS}
    Q = int(np.bincount(np.asarray(w.meta["stage"]), minlength=K).max()) + 8
    for i, a in enumerate(names):
        p = make_params("lru", capacity_blocks=sz[a]["gpu_blocks"], replicas=R, router=knobs[a]["router"],
                        counter_mode=str(c["counter_mode"]), client_timeout_ms=timeout_ms,
                        **base, **sz[a]["kv_knobs"], **{k: v for k, v in knobs[a].items() if k != "router"})
        s = streams[sid[a]]
        st = static_options(p, max_replicas=R, per_request=True, scheduler="vllm", max_running=base["max_num_seqs"],
                            queue_slots=Q, max_runs=int(np.max(np.asarray(s.n_runs))))
        t1 = time.perf_counter()
        res = run_stream_tiered(s, [p], [jax.random.key(int(c["seed"]))], st, [tiers[a]])
        pa, ra = _stage_figures(res.metrics, 0, res.cpu_hit_blocks[0], w, K, float(c["overhead_ms"]) / 1000.0,
                                interval)
        for v, x in pa.items():
            per[v][i] = x
        ra.update(_counters(res.metrics))
        ra.update(preemptions=int(np.asarray(res.metrics.preemptions)[0]),
                  dropped=int(np.asarray(res.metrics.dropped)[0]),
                  offloaded_blocks=int(np.asarray(res.offloaded_blocks)[0]), wall_s=time.perf_counter() - t1)
        for v, x in ra.items():
            run[v][i] = x
    rates = [s.rate for s in ip.stages]
    dv = {v: (("arm", "stage"), x) for v, x in per.items()}
    dv.update({v: (("arm",), x) for v, x in run.items()})
    dv.update(_published(pub, names, rates))
    for v in ("gpu_blocks", "block_bytes", "hybrid_manager"):
        dv[v] = (("arm",), np.array([sz[a][v] for a in names]))
    dv["cpu_blocks"] = (("arm",), np.array([sz[a]["cpu_blocks"] if r["arms"][a].get("cpu_tier") else 0 for a in names]))
    model = _model(d, r)
    ds = xr.Dataset(dv, coords=dict(arm=names, stage=np.arange(K), stage_rate=("stage", rates)))
    ds.attrs.update(common_attrs(cfg, "llmd_tiered", t0, dict(
        run=str(c["run"]), folder=d.name, model=model if not Path(model).is_file() else d.name + "/model",
        replicas=R, tp=int(r["tp"]), gpu=str(r.get("gpu", "h100_80gb")), block_tokens=bt,
        gpu_blocks_source=sz[names[0]]["gpu_source"], cpu_blocks_source=sz[names[0]]["cpu_source"],
        layouts=repr({a: sz[a]["layout"] for a in names}), max_num_seqs=base["max_num_seqs"],
        arms=repr({a: dict(r["arms"][a], knobs=knobs[a]) for a in names}), **src,
        cpu_read_gbps=float(c["cpu_read_gbps"]), cpu_latency_us=float(c["cpu_latency_us"]),
        load_mode=str(c["load_mode"]), overhead_ms=float(c["overhead_ms"]),
        assumptions="host link read bandwidth and latency (llmd_tiered.cpu_read_gbps / cpu_latency_us: no file "
                    "states them); the time outside the pods (llmd_tiered.overhead_ms: the llm-d series' 250 ms); "
                    "GIE's 4 bytes per token (llmd_tiered.bytes_per_token); where the GPU blocks come from the "
                    "hardware, vLLM's profiled activation and CUDA-graph memory (llmd_tiered.gpu_overhead_gib, 0: an "
                    "upper bound on the blocks)",
        counter_mode=str(c["counter_mode"]), client_timeout_ms=timeout_ms,
        max_requests_per_stage=-1 if c["max_requests_per_stage"] is None else int(c["max_requests_per_stage"]),
        stage_interval_s=interval,
        request_timeout_s=-1.0 if ip.request_timeout_s is None else float(ip.request_timeout_s))))
    return ds


def _published(pub: dict | None, names: list, rates: list) -> dict:
    """The report's per-stage figures on our stages (NaN where it has none) and its whole-run figures."""
    if not pub:
        return {}
    out = {}
    pr = list(pub.get("stage_rates", []))
    for v, tab in pub.get("per_stage", {}).items():
        x = np.full((len(names), len(rates)), np.nan)
        for i, a in enumerate(names):
            for k, rate in enumerate(rates):
                if rate in pr and tab.get(a) is not None:
                    x[i, k] = float(tab[a][pr.index(rate)])
        out[f"published_{v}"] = (("arm", "stage"), x)
    for v, tab in pub.get("summary", {}).items():
        out[f"published_{v}_run"] = (("arm",), np.array([np.nan if tab.get(a) is None else float(tab[a])
                                                     for a in names]))
    return out


def _gain(x) -> str:
    return f"{(x[1] / x[0] - 1) * 100:+.1f}%" if len(x) == 2 and np.all(np.isfinite(x)) and x[0] > 0 else "n/a"


def summarize_llmd_tiered(ds: xr.Dataset) -> str:
    a = ds.attrs
    lines = [f"llmd_tiered: {a['run']} ({a['folder']}): {a['replicas']} x {a['model']} on {a['tp']} x {a['gpu']}",
             "GPU blocks of " + f"{a['block_tokens']} per arm " + ", ".join(
                 f"{n} {int(ds.gpu_blocks.sel(arm=n)):,}" for n in ds.arm.values) + f" ({a['gpu_blocks_source']}); "
             "CPU tier blocks " + ", ".join(f"{n} {int(ds.cpu_blocks.sel(arm=n)):,}" for n in ds.arm.values)
             + f" ({a['cpu_blocks_source']}), {a['cpu_read_gbps']:g} GB/s, "
             f"{a['cpu_latency_us']:g} us, loads {a['load_mode']}; max_num_seqs {a['max_num_seqs']}",
             f"assumptions: {a['assumptions']}",
             "reduced run" if a.get("max_requests_per_stage", -1) >= 0 else "full run", ""]
    names = [str(x) for x in ds.arm.values]
    lines += ["| whole run | " + " | ".join(names) + " | gain | published |", "|---" * (len(names) + 3) + "|"]
    for v, pv in (("requests_per_s_ok_run", "published_requests_per_s_ok_run"),
                  ("ttft_mean_s_run", "published_ttft_mean_s_run"), ("ttft_p90_s_run", "published_ttft_p90_s_run"),
                  ("e2e_mean_s_run", "published_latency_mean_s_run"), ("gpu_hit_rate_run", None),
                  ("cpu_hit_rate_run", None), ("input_tokens_per_s_run", "published_input_tokens_per_s_run"),
                  ("gpu_hit_rate_counter", "published_gpu_hit_rate_counter_run"),
                  ("external_hit_rate_counter", "published_external_hit_rate_counter_run"),
                  ("vllm_prefix_cache_queries_tokens", "published_gpu_queries_tokens_run"),
                  ("requests_timed_out", None)):
        x = ds[v].values.astype(float)
        p = ds[pv].values.astype(float) if pv and pv in ds else np.full(len(names), np.nan)
        pub = " / ".join(f"{y:.3g}" for y in p) + (f" ({_gain(p)})" if np.isfinite(p).all() else "")
        lines.append(f"| {v} | " + " | ".join(f"{y:.3g}" for y in x) + f" | {_gain(x)} | {pub} |")
    tok = "output_tokens_per_s" if "published_output_tokens_per_s" in ds else "tokens_per_s"
    unit = "output tok/s" if tok == "output_tokens_per_s" else "tok/s (in + out)"
    lines += ["", "per stage, ours (published):", "",
              "| rate | " + " | ".join(f"{n} TTFT mean (s) | {n} {unit}" for n in names) + " |",
              "|---" * (1 + 2 * len(names)) + "|"]
    for k in ds.stage.values:
        row = [f"{float(ds.stage_rate.sel(stage=k)):g}"]
        for n in names:
            for v in ("ttft_mean_s", tok):
                y = float(ds[v].sel(arm=n, stage=k))
                p = float(ds[f"published_{v}"].sel(arm=n, stage=k)) if f"published_{v}" in ds else np.nan
                row.append(f"{y:,.3g}" + (f" ({p:,.3g})" if np.isfinite(p) else ""))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_llmd_tiered(ds: xr.Dataset):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    tok = "output_tokens_per_s" if "published_output_tokens_per_s" in ds else "tokens_per_s"
    vars_ = ("ttft_mean_s", "e2e_mean_s", tok, "gpu_hit_rate", "cpu_hit_rate")
    units = {"ttft_mean_s": "mean TTFT (s)", "e2e_mean_s": "mean request latency (s)",
             "tokens_per_s": "input + output tokens per second", "output_tokens_per_s": "output tokens per second",
             "gpu_hit_rate": "share of prompt tokens hit in the GPU pool",
             "cpu_hit_rate": "share of prompt tokens loaded from the CPU tier"}
    fig, axes = plt.subplots(1, len(vars_), figsize=(4.2 * len(vars_), 4.2))
    x = ds.stage_rate.values
    for ax, v in zip(axes, vars_):
        for j, a in enumerate(ds.arm.values):
            ax.plot(x, ds[v].sel(arm=a).values, "o-", color=f"C{j}", ms=3, label=f"{a} (ours)")
            if f"published_{v}" in ds:
                ax.plot(x, ds[f"published_{v}"].sel(arm=a).values, "x--", color=f"C{j}", ms=5,
                        label=f"{a} (published)")
        ax.set_xlabel("stage rate (QPS)")
        ax.set_ylabel(units[v])
        ax.set_title(v)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="x-small")
    fig.suptitle(f"llmd_tiered {ds.attrs.get('run', '')}: ours (solid) and the report (dashed)")
    fig.tight_layout()
    return fig


STUDIES = [Study("llmd_tiered", llmd_tiered_study, summarize_llmd_tiered, plot_llmd_tiered)]

"""What prefix hit rate and KV capacity a hybrid model gets, against a dense model of the same size.

``python -m cacheresearch.studies.hybrid_kv [--quick] [--json OUT]`` prints, as Markdown tables:

1. **Capacity** of each model preset of :mod:`cacheresearch.replica.kv_layout` on its GPUs: the block size
   vLLM runs (and why it was forced), the groups, the bytes of one block, vLLM's ``num_gpu_blocks`` and how
   many requests of 8k / 32k tokens fit, beside the same model with every attention layer full
   (:func:`~cacheresearch.replica.kv_layout.dense_counterpart`: same heads, same weights, same memory: the
   dense model of its size).
2. **Hit rate** of gpt-oss-120b (1 x H100, ``gpu_memory_utilization`` 0.95, the llm-d benchmark's settings)
   and of its dense counterpart on the llm-d benchmark's workload (150 customers x 6,000-token prefixes,
   1,200-token queries, 256 output tokens; :func:`~cacheresearch.workload.synthetic.llmd_workload`) over a
   load grid, with vLLM's 16-token blocks and the benchmark's 128.
3. **Hit rate** of Qwen3-Next-80B-A3B (2 x H200: the forced 544-token block) and its dense counterpart on
   shared system prompts of several lengths, each followed by a fresh question.

Every run is :func:`~cacheresearch.replica.hybrid_pool.simulate_hybrid` (its module docstring states the
serving model); request service times are fixed per token (``PREFILL_US`` per uncached prompt token,
``DECODE_US`` per output token: assumptions, chosen near an H100's gpt-oss-120b speeds, and the same for
both models so only the KV layout differs).

With ``--vllm`` (numba), 4. **the vllm replica** (continuous batching, chunked prefill, preemption by recompute,
the default step model) runs gpt-oss-120b on the llm-d workload twice (:func:`vllm_rows`): with vLLM's hybrid
KV cache manager, and with the unified layout vLLM runs when a KV connector that is not ``SupportsHMA`` turns it
off (:func:`~cacheresearch.replica.kv_layout.runtime_layout`: every layer full attention, half the block ids).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from cacheresearch.replica.hybrid_pool import simulate_hybrid
from cacheresearch.replica.kv_layout import (
    WEIGHT_BYTES,
    dense_counterpart,
    engine_knobs,
    pool_blocks,
    preset_layout,
    runtime_layout,
    sequences_that_fit,
    unify,
)
from cacheresearch.workload.synthetic import llmd_workload, tenant_workload

__all__ = ["capacity_rows", "gpt_oss_rows", "mamba_rows", "vllm_rows", "main", "DEPLOYMENTS", "PREFILL_US",
           "DECODE_US"]

PREFILL_US = 50  # per uncached prompt token (20k tokens/s of prefill)
DECODE_US = 15_000  # per output token (15 ms between tokens)

#: (preset, gpu, tp, gpu_memory_utilization): one deployment per model, each the smallest common one it fits.
DEPLOYMENTS = [
    ("gpt-oss-120b", "h100_80gb", 1, 0.95),
    ("gpt-oss-20b", "h100_80gb", 1, 0.9),
    ("gemma-3-27b", "h100_80gb", 1, 0.9),
    ("qwen3-next-80b-a3b", "h200_141gb", 2, 0.9),
    ("qwen3-next-80b-a3b", "h100_80gb", 4, 0.9),
    ("llama-3.1-8b", "h100_80gb", 1, 0.9),
    ("llama-3.1-70b", "h100_80gb", 4, 0.9),
    ("deepseek-v3", "h200_141gb", 8, 0.9),
]


def _capacity(layout, gpu, tp, util, block):
    u = unify(layout, block)
    n = pool_blocks(u, gpu, weight_bytes=WEIGHT_BYTES[layout.name.split(" ")[0]][0], tp=tp,
                    gpu_memory_utilization=util)
    return u, n


def capacity_rows(block_tokens: int = 16) -> list[dict]:
    rows = []
    for name, gpu, tp, util in DEPLOYMENTS:
        lay = preset_layout(name, tp=tp)
        u, n = _capacity(lay, gpu, tp, util, block_tokens)
        d, nd = _capacity(dense_counterpart(lay), gpu, tp, util, block_tokens)
        row = dict(model=name, gpu=gpu, tp=tp, util=util, block_tokens=u.block_tokens, forced=u.forced,
                   groups=" + ".join(f"{g.kind}{'(' + str(g.sliding_window) + ')' if g.sliding_window else ''}"
                                     for g in u.groups), group_size=u.group_size, block_bytes=u.block_bytes,
                   blocks=n, dense_block_tokens=d.block_tokens, dense_blocks=nd)
        for T in (8192, 32768):
            row[f"seqs_{T}"] = sequences_that_fit(u, n, T)
            row[f"dense_seqs_{T}"] = sequences_that_fit(d, nd, T)
        rows.append(row)
    return rows


def _run(w, layout, gpu, tp, util, block, seqs):
    u, n = _capacity(layout, gpu, tp, util, block)
    t0 = time.perf_counter()
    r = simulate_hybrid(w, u, n, max_num_seqs=seqs, prefill_us_per_token=PREFILL_US, decode_us_per_token=DECODE_US)
    ok = r.admit_us >= 0
    wait = (r.admit_us[ok] - w.arrival_ms[ok] * 1000) / 1e6
    return dict(block_tokens=u.block_tokens, blocks=n, hit_rate=r.token_hit_rate, served=int(ok.sum()),
                wait_mean_s=float(wait.mean()) if wait.size else 0.0, peak_running=r.peak_running,
                evictions=r.evictions, seconds=time.perf_counter() - t0)


def gpt_oss_rows(qps_list, duration_s: float, seed: int = 0) -> list[dict]:
    """gpt-oss-120b and its dense counterpart on the llm-d benchmark workload (module docstring)."""
    lay = preset_layout("gpt-oss-120b")
    rows = []
    for qps in qps_list:
        w = llmd_workload(qps, duration_s=duration_s, seed=seed)
        for block in (16, 128):
            for model, layout in (("gpt-oss-120b", lay), ("dense counterpart", dense_counterpart(lay))):
                if block % w.block_tokens:
                    continue
                rows.append(dict(qps=qps, model=model, **_run(w, layout, "h100_80gb", 1, 0.95, block, 512)))
    return rows


def mamba_rows(shapes, n_requests: int, rate_per_s: float, seed: int = 0) -> list[dict]:
    """Qwen3-Next-80B-A3B (2 x H200) and its dense counterpart on shared system prompts + fresh questions."""
    lay = preset_layout("qwen3-next-80b-a3b", tp=2)
    rows = []
    for prefix, query in shapes:
        w = tenant_workload(n_tenants=4, prefix_tokens=prefix, query_tokens=query, rate_per_s=rate_per_s,
                            duration_s=n_requests / rate_per_s, output_tokens=200, seed=seed)
        for model, layout in (("qwen3-next-80b-a3b", lay), ("dense counterpart", dense_counterpart(lay))):
            rows.append(dict(prefix_tokens=prefix, query_tokens=query, model=model,
                             **_run(w, layout, "h200_141gb", 2, 0.9, 16, 256)))
    return rows


def vllm_rows(qps_list, duration_s: float, seed: int = 0, max_num_seqs: int = 512) -> list[dict]:
    """gpt-oss-120b (1 x H100, 0.95) on the vllm replica (numba backend, one replica, the default step model,
    ``max_num_batched_tokens`` 8192) on the llm-d workload: the hybrid layout (``engine_knobs``) and the unified
    one vLLM runs behind a KV connector that is not ``SupportsHMA`` (``runtime_layout``); capacity: vLLM's
    ``num_gpu_blocks`` less its null block."""
    import jax  # noqa: PLC0415 - the engine's imports, only for this table

    from cacheresearch.backends import numba_vllm as nv  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415
    from cacheresearch.core.simulate import static_options  # noqa: PLC0415
    from cacheresearch.core.stream import compile_stream  # noqa: PLC0415
    from cacheresearch.metrics.core import finalize  # noqa: PLC0415

    lay = preset_layout("gpt-oss-120b")
    rows = []
    for qps in qps_list:
        s = compile_stream(llmd_workload(qps, duration_s=duration_s, seed=seed), stateful_singletons=True)
        for model, layout in (("hybrid manager", lay),
                              ("unified (connector, no HMA)", runtime_layout(lay, connector=True,
                                                                              connector_supports_hma=False))):
            u, n = _capacity(layout, "h100_80gb", 1, 0.95, 16)
            p = make_params("lru", capacity_blocks=n - 1, max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                            **engine_knobs(u))
            st = static_options(p, max_replicas=1, per_request=True, scheduler="vllm", max_running=max_num_seqs,
                                queue_slots=4096, max_runs=int(np.max(np.asarray(s.n_runs))))
            t0 = time.perf_counter()
            m = finalize(nv.run_stream(s, [p], [jax.random.key(seed)], st), st)
            rows.append(dict(qps=qps, model=model, groups=len(u.groups), blocks=n,
                             hit_rate=float(np.asarray(m.token_hit_rate)[0]),
                             ttft_p50_s=int(np.asarray(m.ttft_p50_ms)[0]) / 1000,
                             ttft_p99_s=int(np.asarray(m.ttft_p99_ms)[0]) / 1000,
                             preemptions=int(np.asarray(m.preemptions)[0]),
                             peak_blocks=int(np.asarray(m.max_occupancy)[0, 0]), seconds=time.perf_counter() - t0))
    return rows


def _table(rows, cols) -> str:
    def fmt(c, v):
        return f"{v:.1%}" if c == "hit_rate" else f"{v:.2f}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(c, r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.studies.hybrid_kv", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short load grid (for a check, not the page's numbers)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--vllm", action="store_true", help="also run gpt-oss-120b on the vllm replica (numba)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    cap = capacity_rows()
    gpt = gpt_oss_rows([5.0] if a.quick else [2.0, 5.0, 10.0], 60.0 if a.quick else 180.0)
    mam = mamba_rows([(240, 40), (2176, 1)] if a.quick else [(240, 40), (500, 200), (2000, 300), (2176, 1), (2175, 1)],
                     100 if a.quick else 400, 2.0)
    print("## Capacity (vLLM's num_gpu_blocks; requests of 8k / 32k tokens that fit at once)\n")
    print(_table(cap, ["model", "gpu", "tp", "block_tokens", "groups", "block_bytes", "blocks", "seqs_8192",
                       "dense_seqs_8192", "seqs_32768", "dense_seqs_32768"]))
    for r in cap:
        if r["forced"]:
            print(f"\n* {r['model']} (tp {r['tp']}): block size forced: {r['forced']}")
    print("\n## gpt-oss-120b vs its dense counterpart, llm-d benchmark workload, 1 x H100\n")
    print(_table(gpt, ["qps", "model", "block_tokens", "blocks", "hit_rate", "wait_mean_s", "peak_running",
                       "evictions"]))
    print("\n## Qwen3-Next-80B-A3B vs its dense counterpart, shared system prompts, 2 x H200\n")
    print(_table(mam, ["prefix_tokens", "query_tokens", "model", "block_tokens", "blocks", "hit_rate",
                       "wait_mean_s", "peak_running"]))
    out = dict(capacity=cap, gpt_oss=gpt, mamba=mam)
    if a.vllm:
        out["vllm"] = vllm_rows([5.0] if a.quick else [2.0, 5.0, 10.0, 20.0], 60.0 if a.quick else 180.0)
        print("\n## gpt-oss-120b on the vllm replica: the hybrid manager vs the unified layout, 1 x H100\n")
        print(_table(out["vllm"], ["qps", "model", "groups", "blocks", "hit_rate", "ttft_p50_s", "ttft_p99_s",
                                   "preemptions", "peak_blocks"]))
    out["seconds"] = time.perf_counter() - t0
    print(f"\n{out['seconds']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=lambda x: x.item() if isinstance(x, np.generic) else str(x))
    return out


if __name__ == "__main__":
    main()

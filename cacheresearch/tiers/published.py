"""Published offloading results beside the tiered model's, and the bench of a tiered sweep (experiments/tiers.md).

``python -m cacheresearch.tiers.published microbench``   CPU-tier hit vs GPU hit TTFT by prompt length
``python -m cacheresearch.tiers.published pool TRACE``    Mooncake's global pool vs local caches
``python -m cacheresearch.tiers.published bench``         the tiered engine against the fcfs engine
``python -m cacheresearch.tiers.published bench_main``    the main job's grid (its routers the engine runs)

Nothing here is fitted to the published numbers: every input is the publication's own hardware figure or
a preset named in ``experiments/tiers.md``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from cacheresearch.tiers.engine import run_tiers
from cacheresearch.tiers.spec import make_config
from cacheresearch.workload.table import Workload

__all__ = ["cpu_hit_load_ms", "pool_vs_local", "bench", "bench_main", "QWEN3_30B_A3B_KV_BYTES_PER_TOKEN"]

#: Qwen3-30B-A3B (and -Coder) config.json: 48 layers x 4 KV heads x head_dim 128, BF16 KV:
#: 2 x 48 x 4 x 128 x 2 bytes per token (an assumption: read from the published config, not a preset here).
QWEN3_30B_A3B_KV_BYTES_PER_TOKEN = 2 * 48 * 4 * 128 * 2


def _requests(reqs, bt):
    keys = np.concatenate([np.asarray(r, np.uint64) for r in reqs])
    off = np.concatenate([[0], np.cumsum([len(r) for r in reqs])])
    n = len(reqs)
    return Workload(arrival_ms=np.arange(n) * 600_000, input_tokens=np.asarray([len(r) * bt for r in reqs]),
                    output_tokens=np.ones(n, np.int64), tenant=np.zeros(n), keys=keys, offsets=off, block_tokens=bt)


def cpu_hit_load_ms(tokens: int, *, kv_bytes_per_token: int, read_gbps: float, latency_us: float = 10.0,
                    block_tokens: int = 16) -> int:
    """The load time (ms) of a prompt of ``tokens`` tokens served whole from the cpu tier: the prompt, then an
    unrelated prompt that pushes it out of a gpu tier sized to one prompt, then the prompt again."""
    nb = tokens // block_tokens
    a = list(range(1, nb + 1))
    b = list(range(10**9, 10**9 + nb))
    w = _requests([a, b, a], block_tokens)
    cfg = make_config(gpu_blocks=nb, block_bytes=kv_bytes_per_token * block_tokens,
                      tiers=dict(cpu=dict(capacity_blocks=4 * nb, read_gbps=read_gbps, write_gbps=read_gbps,
                                          latency_us=latency_us, memory_gib=1e9)))
    r = run_tiers(w, [cfg])[0]
    assert r.hit_tier[2].tolist() == [0, nb, 0, 0]
    return int(r.load_ms[2])


def pool_vs_local(path: str, node_tokens=(1_000_000, 3_000_000), nodes: int = 10, block_tokens: int = 512):
    """Mooncake FAST'25 Fig. 10: token hit rate of ``nodes`` local caches of ``node_tokens`` vs one pool of
    ``nodes`` x that, on a Mooncake trace; local caches reached by round robin or by the tier-aware scorer.
    The caches are lower tiers (cpu per node, or the shared pool) behind a gpu tier of 0 blocks, so every
    block goes through offload on eviction: a leaf-first LRU of the tier's capacity."""
    from cacheresearch.workload.trace import load_mooncake  # noqa: PLC0415

    w = load_mooncake(path, block_tokens=block_tokens)
    inp = w.input_tokens.sum()
    rows = []
    for t in node_tokens:
        c = t // block_tokens
        big = dict(memory_gib=1e9, read_gbps=50.0, write_gbps=50.0)
        cfgs = [make_config(gpu_blocks=0, replicas=nodes, router="round_robin", block_bytes=1,
                            tiers=dict(pool=dict(capacity_blocks=c * nodes, **big)))]
        cfgs += [make_config(gpu_blocks=0, replicas=nodes, router=rt, block_bytes=1,
                             tiers=dict(cpu=dict(capacity_blocks=c, **big))) for rt in ("round_robin", "tier_scorer")]
        res = run_tiers(w, cfgs)
        g, rr, ts = (float(r.hit_tokens.sum() / inp) for r in res)
        rows.append(dict(node_tokens=t, pool=g, local_round_robin=rr, local_tier_scorer=ts))
    return rows


def bench(n_requests: int = 2500, reps: int = 2):
    """Wall time of the design scenario's 4 routers on the tiered engine with no lower tier, with a cpu tier
    of 2 x the gpu tier, and the fcfs engine (``simulate_cells``, backend auto) on the same untiered cells."""
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415
    from cacheresearch.engine import compile_stream, make_params  # noqa: PLC0415
    from cacheresearch.replica.hardware import kv_blocks  # noqa: PLC0415
    from cacheresearch.tiers.spec import tier_block_bytes  # noqa: PLC0415
    from cacheresearch.workload.synthetic import tenant_workload  # noqa: PLC0415

    w = tenant_workload(n_tenants=200, prefix_tokens=10_000, query_tokens=200, output_tokens=200, hot_share=0.5,
                        rate_per_s=12.0, duration_s=n_requests / 12.0, block_tokens=16, seed=0)
    gpu = kv_blocks("llama3_8b", "h100_80gb", block_tokens=16)
    bb = tier_block_bytes("llama3_8b", 16)
    routers = ["random", "prefix_hash", "least_loaded", "tier_scorer"]
    out = {}
    for label, cap in (("tiered, no lower tier", 0), ("tiered, cpu = 2 x gpu", 2 * gpu)):
        cfgs = [make_config(gpu_blocks=gpu, replicas=8, router=r, block_bytes=bb, prefix_blocks=625,
                            tiers=dict(cpu=dict(capacity_blocks=cap))) for r in routers]
        run_tiers(w, cfgs)  # compiled (numba, JAX routes) before timing
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run_tiers(w, cfgs)
            ts.append(time.perf_counter() - t0)
        out[label] = min(ts)
    P = [make_params("lru", capacity_blocks=gpu, replicas=8, router="weighted_scorers" if r == "tier_scorer" else r,
                     prefix_blocks=625, prefill_tps=20_000, decode_us_per_token=250) for r in routers]
    s = compile_stream(w)
    simulate_cells([s], np.zeros(len(P), np.int64), P, np.zeros(len(P)), max_replicas=8, per_request=True)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        simulate_cells([s], np.zeros(len(P), np.int64), P, np.zeros(len(P)), max_replicas=8, per_request=True)
        ts.append(time.perf_counter() - t0)
    out["fcfs engine (simulate_cells), untiered"] = min(ts)
    return w, out


#: The main job's routers (experiment=routing) that the tiered engine runs, as (engine preset, tiered router).
MAIN_ROUTERS = (("random", "random", {}), ("least_loaded", "least_loaded", {}), ("prefix_hash", "prefix_hash", {}),
                ("kubeai_chwbl", "chwbl", {}), ("kubeai_chwbl", "chwbl", dict(chwbl_c_pct=200)),
                ("dynamo_kv", "tier_kv_cost", {}), ("llmd_precise", "tier_scorer", {}), ("preble", "tier_preble", {}))


def bench_main(cpu_blocks: int = 40_000, reps: int = 1):
    """The main job's grid (experiment=routing: design scenario with load, 8 replicas, prefix 625 blocks, h100_8b)
    restricted to the routers the tiered engine runs (all but sglang_cache_aware, whose view is approximate) and
    the stable layout: 8 routers x rates 4 / 16 / 32 x capacities 10,000 / 40,000 = 48 cells. Wall time of the
    fcfs engine (``simulate_cells``, per request, both
    backends as the runner picks them), of the tiered engine with no lower tier (checked equal to it: replica,
    hits, TTFT), and with a cpu tier of ``cpu_blocks`` per replica. Workloads are built once, outside the timing."""
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415
    from cacheresearch.engine import compile_stream, make_params  # noqa: PLC0415
    from cacheresearch.workload.synthetic import tenant_workload  # noqa: PLC0415

    rates, caps = (4.0, 16.0, 32.0), (10_000, 40_000)
    ws = [tenant_workload(n_tenants=200, prefix_tokens=10_000, query_tokens=200, output_tokens=200, hot_share=0.5,
                          rate_per_s=r, duration_s=2500 / r, block_tokens=16, seed=0) for r in rates]
    streams = [compile_stream(w) for w in ws]
    P, C, of = [], [], []
    for si in range(len(ws)):
        for cap in caps:
            for preset, tr, kn in MAIN_ROUTERS:
                P.append(make_params("lru", capacity_blocks=cap, replicas=8, router=preset, prefix_blocks=625,
                                     latency="h100_8b", **kn))
                C.append(make_config(gpu_blocks=cap, replicas=8, router=tr, prefix_blocks=625, block_bytes=2**21,
                                     tier_weights_pct=(100, 80, 60, 40), **kn))
                of.append(si)
    of = np.asarray(of)
    out = {}
    simulate_cells(streams, of, P, np.zeros(len(P)), max_replicas=8, per_request=True, queue_slots=512)  # compiled
    t0 = time.perf_counter()
    for _ in range(reps):
        m, _ = simulate_cells(streams, of, P, np.zeros(len(P)), max_replicas=8, per_request=True, queue_slots=512)
    out["fcfs engine (simulate_cells)"] = (time.perf_counter() - t0) / reps
    for label, cpu in (("tiered engine, no lower tier", 0), (f"tiered engine, cpu {cpu_blocks} blocks", cpu_blocks)):
        cfgs = [c.with_(tiers=tuple(t if t.name != "cpu" else t.__class__(**{**t.__dict__, "capacity_blocks": cpu})
                                    for t in c.tiers)) for c in C]
        for si, w in enumerate(ws):  # compiled (numba, JAX routes) before timing
            run_tiers(w, [cfgs[g] for g in np.flatnonzero(of == si)])
        t0 = time.perf_counter()
        for _ in range(reps):
            res = [None] * len(cfgs)
            for si, w in enumerate(ws):
                idx = np.flatnonzero(of == si)
                for g, r in zip(idx, run_tiers(w, [cfgs[g] for g in idx], [0] * len(idx))):
                    res[g] = r
        out[label] = (time.perf_counter() - t0) / reps
        if cpu == 0:
            for g, r in enumerate(res):
                n = ws[of[g]].n_requests
                for f in ("replica", "hit_blocks", "ttft_ms"):
                    if not np.array_equal(getattr(r, f), np.asarray(getattr(m, f))[g, :n]):
                        raise AssertionError(f"cell {g}: {f} differs from the fcfs engine")
    return len(P), out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    what = argv[0] if argv else "microbench"
    if what == "microbench":
        print("| prompt tokens | our cpu-tier load (ms) |")
        print("|---|---|")
        for L in (1024, 4096, 16_384, 65_536):
            ms = cpu_hit_load_ms(L, kv_bytes_per_token=QWEN3_30B_A3B_KV_BYTES_PER_TOKEN, read_gbps=54.0)
            print(f"| {L} | {ms} |")
    elif what == "pool":
        print("| node capacity | pool | local round robin | local tier_scorer | pool / rr | pool / tier_scorer |")
        print("|---|---|---|---|---|---|")
        for r in pool_vs_local(argv[1]):
            print(f"| {r['node_tokens'] / 1e6:g}M tokens | {r['pool']:.1%} | {r['local_round_robin']:.1%} | "
                  f"{r['local_tier_scorer']:.1%} | {r['pool'] / r['local_round_robin']:.2f}x | "
                  f"{r['pool'] / r['local_tier_scorer']:.2f}x |")
    elif what == "bench":
        w, out = bench()
        print(f"design scenario: {w.n_requests} requests, {w.total_blocks} blocks, 8 replicas, 4 routers")
        print("| engine | wall (s) |")
        print("|---|---|")
        for k, v in out.items():
            print(f"| {k} | {v:.2f} |")
    elif what == "bench_main":
        n, out = bench_main()
        print(f"the main job's grid on the tiered engine's routers: {n} cells (untiered results checked equal)")
        print("| engine | wall (s) |")
        print("|---|---|")
        for k, v in out.items():
            print(f"| {k} | {v:.2f} |")
    else:
        print(f"unknown command {what!r}; choose microbench, pool TRACE, bench or bench_main", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

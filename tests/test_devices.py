"""The configuration axis sharded over 8 devices (forced host devices, in a subprocess: the flag must be
set before jax is imported) gives bitwise the results of 1 device, every field, and within a device
count every chunk size (1, 7, all) gives bitwise identical results; for the fcfs replica and for the
vllm replica.

The compiled programs return integers and exact integer sums only (plus the vllm replica's float32
accumulators, summed in a fixed order inside its scan); the ratios and means are divided on the host
in float64 (``core.simulate.finalize``). Before that, XLA compiled ``sum / n_requests`` as a multiply by
the reciprocal in the single-device program and as a true division in the sharded one (1 ulp apart).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_chunks import ROOT, env

SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from cacheresearch.core.run import simulate_cells
from cacheresearch.metrics.core import RATIO_FIELDS
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.workload.synthetic import tenant_workload

assert jax.device_count() == 8, jax.devices()
ws = [tenant_workload(n_tenants=4, prefix_tokens=32, users_per_tenant=2, user_tokens=8, query_tokens=8,
                      rate_per_s=r, duration_s=3.0, block_tokens=4, output_tokens=4, seed=s)
      for r, s in ((6, 0), (9, 1))]
fleets = {
    "fcfs": ([compile_stream(w) for w in ws],
             [dict(policy="lru", capacity_blocks=20, replicas=3, router="random"),
              dict(policy="lru", capacity_blocks=9, replicas=2, router="random"),
              dict(policy="ttl_refresh", ttl_s=0.4, replicas=3, router="weighted_scorers", view="precise")],
             dict(queue_slots=32), (1, 7, None)),
    # small pools and budgets: chunked prefill, preemptions, TPOT over several output tokens (one stream:
    # the vllm program compiles slowly; chunk size 1 and all share the shape on 8 devices)
    "vllm": ([compile_stream(ws[1], stateful_singletons=True)],
             [dict(policy="lru", capacity_blocks=24, replicas=3, router="random", max_num_seqs=3,
                   max_num_batched_tokens=24),
              dict(policy="lru", capacity_blocks=16, replicas=2, router="llmd_precise", max_num_seqs=2,
                   max_num_batched_tokens=16, warmup_ms=300)],
             dict(queue_slots=32, scheduler="vllm", max_running=3, backend="jax"), (1, None)),  # the JAX sharding
}
runs = {}
for name in sys.argv[2:]:
    streams, configs, opts, sizes = fleets[name]
    order = [(s, c) for c in range(len(configs)) for s in range(len(streams))]
    params = [make_params(prefix_blocks=8, **configs[c]) for _, c in order]
    stream_of = np.asarray([s for s, _ in order])
    seeds = np.arange(len(order), dtype=np.uint32) % 3
    for dev in (1, 8):
        for mb in sizes if dev == 8 or name == "fcfs" else (None,):
            m, plan = simulate_cells(streams, stream_of, params, seeds, max_replicas=3, match=True,
                                     max_instances=1, devices=dev, max_batch=mb, **opts)
            runs[f"{name}/{dev}/{mb}"] = {
                "devices": plan.devices, "calls": plan.calls,
                "m": {f: np.asarray(getattr(m, f)).tolist() for f in m._fields},
                "dtype": {f: str(np.asarray(getattr(m, f)).dtype) for f in m._fields},
                "finite": {f: bool(np.all(np.isfinite(getattr(m, f)))) for f in RATIO_FIELDS}}
json.dump(runs, open(sys.argv[1], "w"))
"""


def _runs(tmp_path, name):
    out = tmp_path / "runs.json"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out), name], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def _check(runs, name, sizes, n_cells):
    assert runs[f"{name}/8/None"]["devices"] == 8 and runs[f"{name}/1/None"]["devices"] == 1
    assert runs[f"{name}/{8 if name == 'vllm' else 1}/1"]["calls"] == n_cells  # chunk size 1: a call per cell
    ref = runs[f"{name}/1/None"]
    assert ref["calls"] == 1
    # the ratios are finalized on the host (float64) and exercised: every one finite where it applies
    for f in ("token_hit_rate", "request_hit_rate", "ttft_mean_ms", "utilisation", "load_imbalance",
              "prefix_copies", "overflow_share"):
        assert ref["dtype"][f] == "float64" and ref["finite"][f], (name, f)
    vllm_only = ("tpot_mean_ms", "kv_util_mean", "kv_util_max", "queue_len_mean", "throughput_tps")
    assert all(ref["finite"][f] == (name == "vllm") for f in vllm_only), (name, ref["finite"])
    if name == "vllm":
        assert 0 < min(ref["m"]["tpot_mean_ms"]) and sum(ref["m"]["preemptions"]) > 0
    for dev in (1, 8):
        base = runs[f"{name}/{dev}/None"]
        for mb in sizes[dev]:  # chunk sizes: bitwise identical within a device count
            got = runs[f"{name}/{dev}/{mb}"]
            for f, v in base["m"].items():
                np.testing.assert_array_equal(np.asarray(got["m"][f]), np.asarray(v), err_msg=f"{name} {dev}/{mb} {f}")
        for f, v in ref["m"].items():  # 8 devices against 1: bitwise, every field (NaN where NaN)
            a = np.asarray(base["m"][f], dtype=ref["dtype"][f])
            b = np.asarray(v, dtype=ref["dtype"][f])
            assert a.tobytes() == b.tobytes(), (name, dev, f, a, b)


@pytest.mark.slow
def test_eight_devices_equal_one_and_chunk_sizes_are_identical(tmp_path):
    _check(_runs(tmp_path, "fcfs"), "fcfs", {1: (1, 7), 8: (1, 7)}, 6)


@pytest.mark.slow  # ~30 s on 2 cores: the vllm program compiles slowly
def test_vllm_replica_eight_devices_equal_one(tmp_path):
    """The vllm replica's float32 accumulators (KV and queue time integrals) come out of a sequential
    scan, so they too are bitwise equal across device counts and chunk sizes."""
    _check(_runs(tmp_path, "vllm"), "vllm", {1: (), 8: (1,)}, 2)


def test_exact_sums_and_host_ratios():
    """The two-limb sums are exact past int32 and past one block of 2**15 values; the finalized ratios
    are the float64 divisions of the integers (here against the per-request arrays)."""
    import jax
    import jax.numpy as jnp

    from cacheresearch.core.simulate import simulate  # the JAX scan
    from cacheresearch.engine import compile_stream, make_params
    from cacheresearch.metrics.core import combine_limbs
    from cacheresearch.metrics.core import sum_limbs as _sum_limbs
    from cacheresearch.workload.synthetic import tenant_workload

    rng = np.random.default_rng(0)
    fn = jax.jit(_sum_limbs)
    for n in (0, 1, 7, (1 << 15) + 3, 3 << 16):
        for top in (2, 1 << 20, (1 << 31) - 1):
            x = rng.integers(0, top, n, dtype=np.int64)
            x[: n // 3] = top - 1  # many maximal values: every carry
            hi, lo = fn(jnp.asarray(x, jnp.int32))
            assert int(combine_limbs(hi, lo)) == int(x.sum()) and 0 <= int(lo) < 1 << 20, (n, top)
    w = tenant_workload(n_tenants=4, prefix_tokens=32, users_per_tenant=2, user_tokens=8, query_tokens=8,
                        rate_per_s=9, duration_s=3.0, block_tokens=4, output_tokens=4, seed=1)
    m = simulate(compile_stream(w), make_params("lru", capacity_blocks=9, replicas=3, router="random", prefix_blocks=8),
                 jax.random.key(0), max_replicas=3, match=True, queue_slots=32)
    n = w.n_requests
    assert int(m.n_requests) == n and int(combine_limbs(m.input_tokens_hi, m.input_tokens_lo)) == w.input_tokens.sum()
    assert m.token_hit_rate == np.asarray(m.hit_tokens)[:n].sum() / w.input_tokens.sum()
    assert m.request_hit_rate == np.count_nonzero(np.asarray(m.hit_blocks)[:n]) / n
    assert m.ttft_mean_ms == np.asarray(m.ttft_ms)[:n].sum() / n and m.ttft_mean_ms.dtype == np.float64
    busy = np.asarray(m.busy_ms, np.float64)
    assert np.array_equal(m.utilisation, busy / int(m.horizon_time))
    assert m.load_imbalance == busy.max() * 3 / busy.sum()
    assert m.prefix_copies == int(m.copies_sum) / int(m.copies_n) and 0 < m.overflow_share < 1

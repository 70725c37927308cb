"""The configuration axis sharded over 8 devices (forced host devices, in a subprocess: the flag must be
set before jax is imported) gives the results of 1 device, and within a device count every chunk size
(1, 7, all) gives bitwise identical results.

Across device counts, integers are bitwise identical; float32 ratios and means agree to 1 ulp. XLA
compiles ``sum / n_requests`` (a per-stream denominator) of the single-device program as a
multiplication by the reciprocal, and of the sharded program sometimes as a true division, so a few
float32 means (``ttft_mean_ms``) differ in the last bit (README, "Scaling out").
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from test_chunks import ROOT, env

SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from cacheresearch.core.run import simulate_cells
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.workload.synthetic import tenant_workload

assert jax.device_count() == 8, jax.devices()
ws = [tenant_workload(n_tenants=4, prefix_tokens=32, users_per_tenant=2, user_tokens=8, query_tokens=8,
                      rate_per_s=r, duration_s=3.0, block_tokens=4, output_tokens=4, seed=s)
      for r, s in ((6, 0), (9, 1))]
streams = [compile_stream(w) for w in ws]
configs = [dict(policy="lru", capacity_blocks=20, replicas=3, router="random"),
           dict(policy="lru", capacity_blocks=9, replicas=2, router="random"),
           dict(policy="ttl_refresh", ttl_s=0.4, replicas=3, router="weighted_scorers", view="precise")]
order = [(s, c) for c in range(len(configs)) for s in range(len(streams))]
params = [make_params(prefix_blocks=8, **configs[c]) for _, c in order]
stream_of = np.asarray([s for s, _ in order])
seeds = np.asarray([0, 1, 2, 0, 1, 2], dtype=np.uint32)
runs = {}
for dev in (1, 8):
    for mb in (1, 7, None):
        m, plan = simulate_cells(streams, stream_of, params, seeds, max_replicas=3, match=True, max_instances=1,
                                 queue_slots=32, devices=dev, max_batch=mb)
        runs[f"{dev}/{mb}"] = {"devices": plan.devices, "calls": plan.calls,
                               "m": {f: np.asarray(getattr(m, f)).tolist() for f in m._fields},
                               "dtype": {f: str(np.asarray(getattr(m, f)).dtype) for f in m._fields}}
json.dump(runs, open(sys.argv[1], "w"))
"""


def test_eight_devices_equal_one_and_chunk_sizes_are_identical(tmp_path):
    out = tmp_path / "runs.json"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert runs["8/None"]["devices"] == 8 and runs["1/None"]["devices"] == 1
    assert runs["1/1"]["calls"] == 6 and runs["1/None"]["calls"] == 1  # chunk size 1: one call per configuration
    ref = runs["1/None"]
    dtypes = ref["dtype"]
    for dev in (1, 8):
        base = runs[f"{dev}/None"]
        for mb in (1, 7):  # chunk sizes: bitwise identical within a device count
            got = runs[f"{dev}/{mb}"]
            for f, v in base["m"].items():
                np.testing.assert_array_equal(np.asarray(got["m"][f]), np.asarray(v), err_msg=f"{dev}/{mb} {f}")
        for f, v in ref["m"].items():  # 8 devices against 1
            a = np.asarray(base["m"][f], dtype=dtypes[f])
            b = np.asarray(v, dtype=dtypes[f])
            if np.issubdtype(b.dtype, np.floating):
                np.testing.assert_array_max_ulp(np.nan_to_num(a), np.nan_to_num(b), maxulp=1)
                assert np.array_equal(np.isnan(a), np.isnan(b)), f
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"devices {dev} {f}")

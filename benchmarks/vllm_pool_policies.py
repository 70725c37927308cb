"""The vllm pool's free-block order by policy (experiments/policies_on_vllm.md): run a sweep, count the
configurations whose clock overflowed or whose pool got stuck (``Metrics.time_overflow``, which results.nc
does not carry), and print token hit rate, TTFT and preemptions per policy.

    python benchmarks/vllm_pool_policies.py OUT_DIR OVERRIDE...

e.g. ``python benchmarks/vllm_pool_policies.py out experiment=routing replica=vllm 'grid.policy=[lru,s3fifo]'``.
"""

from __future__ import annotations

import sys

import numpy as np


def main(out: str, overrides: list[str]) -> None:
    from cacheresearch.shell import sweep

    seen = {}
    to_dataset = sweep.to_dataset

    def recording(cfg, plan, metrics, idx, workloads, timing):
        seen["overflow"] = np.asarray(metrics.time_overflow).astype(bool)
        seen["policy"] = str(cfg.cache.policy)
        return to_dataset(cfg, plan, metrics, idx, workloads, timing)

    sweep.to_dataset = recording
    try:
        ds = sweep.run_experiment(overrides, out)
    finally:
        sweep.to_dataset = to_dataset
    if "policy" not in ds.dims:  # cache.policy=NAME without grid.policy: a policy axis of one
        ds = ds.expand_dims(policy=[seen["policy"]])
    ov = seen["overflow"]
    print(f"time_overflow (clock past its span or a stuck pool): {int(ov.sum())} of {ov.size} configurations")
    keep = [d for d in ds["token_hit_rate"].dims if ds.sizes[d] > 1 and d != "policy"]
    cols = ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "preemptions", "kv_util_mean")
    print("| " + " | ".join(keep + ["policy"] + list(cols)) + " |")
    print("|" + "---|" * (len(keep) + 1 + len(cols)))
    flat = ds[list(cols)].stack(cell=keep + ["policy"]) if keep else ds[list(cols)].stack(cell=["policy"])
    for j in range(flat.sizes["cell"]):
        c = flat.isel(cell=j)
        labels = [str(c[d].values) for d in keep + ["policy"]]
        vals = [f"{float(c[v]):.4f}" if v in ("token_hit_rate", "kv_util_mean") else f"{float(c[v]):.3f}"
                if v.endswith("_s") else f"{int(c[v])}" for v in cols]
        print("| " + " | ".join(labels + vals) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

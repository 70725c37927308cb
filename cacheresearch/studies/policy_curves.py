"""Miss ratio against cache size for every per-block policy, the way the S3-FIFO and SIEVE papers draw it.

``python -m cacheresearch.studies.policy_curves TRACE [TRACE ...] --block-tokens N --out DIR``

For each trace (Mooncake JSONL; block size from ``--block-tokens``, or per trace as ``PATH:N``) the
block stream (each request's blocks leaf-first, one cache) runs through ``fifo``, ``sieve``,
``s3fifo``, ``lfu`` and ``arc`` (libCacheSim's rules and defaults, the numba engine) at ``--points``
cache sizes from 0.1% to 100% of the trace's distinct blocks (log-spaced). The miss ratio is
libCacheSim's: missed block accesses / block accesses. Writes ``policy_curves.csv`` (trace, policy,
capacity, size fraction, miss ratio, miss-ratio reduction from FIFO) and ``policy_curves.png`` (one
panel per trace: miss ratio against size fraction; below it the reduction from FIFO, as the S3-FIFO
paper's Figure 7 plots it).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from cacheresearch.cache.block import BLOCK_POLICY_IDS

__all__ = ["policy_curves", "main"]


def policy_curves(w, points: int = 12, policies=BLOCK_POLICY_IDS) -> list[dict]:
    from cacheresearch.backends.numba_policies import block_replay_grid
    from cacheresearch.core.params import make_params

    U = int(np.unique(w.keys).size)
    caps = np.unique(np.maximum(np.geomspace(U / 1000, U, points).astype(int), 10))
    S = int(w.total_blocks)
    rows = []
    miss = {}
    for p in policies:
        m = block_replay_grid(w, [make_params(p, capacity_blocks=int(c)) for c in caps])
        miss[p] = 1.0 - np.asarray(m.block_hits, np.float64) / S
    for p in policies:
        for c, mr, mf in zip(caps, miss[p], miss.get("fifo", miss[p])):
            rows.append(dict(policy=p, capacity=int(c), size_fraction=float(c) / U, miss_ratio=float(mr),
                             reduction_from_fifo=float((mf - mr) / mf) if mf > 0 else 0.0))
    return rows


def main(argv=None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cacheresearch.workload.trace import load_mooncake

    ap = argparse.ArgumentParser(prog="python -m cacheresearch.studies.policy_curves",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", help="Mooncake JSONL files (PATH or PATH:BLOCK_TOKENS)")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--points", type=int, default=12)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    allrows = []
    fig, axes = plt.subplots(2, len(a.traces), figsize=(5 * len(a.traces), 7), squeeze=False)
    for j, spec in enumerate(a.traces):
        path, _, bt = spec.partition(":")
        w = load_mooncake(path, block_tokens=int(bt or a.block_tokens))
        rows = policy_curves(w, a.points)
        name = Path(path).stem
        for r in rows:
            r["trace"] = name
        allrows += rows
        for p in BLOCK_POLICY_IDS:
            rr = [r for r in rows if r["policy"] == p]
            x = [r["size_fraction"] for r in rr]
            axes[0, j].plot(x, [r["miss_ratio"] for r in rr], "o-", ms=3, label=p)
            axes[1, j].plot(x, [r["reduction_from_fifo"] for r in rr], "o-", ms=3, label=p)
        axes[0, j].set(xscale="log", title=f"{name} ({w.total_blocks:,} block accesses)", ylabel="miss ratio")
        axes[1, j].set(xscale="log", xlabel="cache size / distinct blocks", ylabel="miss-ratio reduction from FIFO")
        axes[0, j].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "policy_curves.png", dpi=120)
    with open(out / "policy_curves.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["trace", "policy", "capacity", "size_fraction", "miss_ratio",
                                           "reduction_from_fifo"])
        wr.writeheader()
        wr.writerows(allrows)
    for r in allrows:
        print(f"{r['trace']:28s} {r['policy']:7s} C={r['capacity']:>7d} ({r['size_fraction']:.4f})  "
              f"miss {r['miss_ratio']:.4f}  vs fifo {r['reduction_from_fifo']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

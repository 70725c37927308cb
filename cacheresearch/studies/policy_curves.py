"""Miss ratio against cache size for every per-block policy, the way the S3-FIFO and SIEVE papers draw it.

``python -m cacheresearch.sweep experiment=policy_curves study.traces=[PATH:N,...] hydra.run.dir=OUT``
(a registered study: ``results.nc``, ``summary.txt``, ``figure.png``), or the same as a plain command,
``python -m cacheresearch.studies.policy_curves TRACE [TRACE ...] --block-tokens N --out DIR``
(``policy_curves.csv`` and ``policy_curves.png``).

For each trace (Mooncake JSONL, or any format ``experiment=fit`` reads; block size per trace as
``PATH:N``, else the trace's own) the block stream (each request's blocks leaf-first, one cache) runs
through ``fifo``, ``sieve``, ``s3fifo``, ``lfu`` and ``arc`` (libCacheSim's rules and defaults, the numba
engine) at ``points`` cache sizes from 0.1% to 100% of the trace's distinct blocks (log-spaced). The miss
ratio is libCacheSim's: missed block accesses / block accesses; the reduction from FIFO is the S3-FIFO
paper's Figure 7 measure, (FIFO's miss ratio - the policy's) / FIFO's.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import xarray as xr

from cacheresearch.cache.policies import BLOCK_POLICY_IDS, block_policies
from cacheresearch.studies import base as SB
from cacheresearch.studies.base import Study, StudyError

__all__ = ["policy_curves", "policy_curves_study", "summarize_policy_curves", "plot_policy_curves", "main",
           "STUDIES", "DEFAULTS"]

DEFAULTS = dict(traces=[], points=12, policies=list(BLOCK_POLICY_IDS), max_requests=None)


def policy_curves(w, points: int = 12, policies=BLOCK_POLICY_IDS) -> list[dict]:
    """Rows (policy, capacity, size fraction, miss ratio, reduction from FIFO) of workload ``w``."""
    from cacheresearch.backends.numba_policies import block_replay_grid  # noqa: PLC0415
    from cacheresearch.core.params import make_params  # noqa: PLC0415

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


def _trace_specs(cfg, c) -> list[tuple[str, int | None]]:
    specs = [str(t) for t in c["traces"]]
    top = cfg.get("trace") if hasattr(cfg, "get") else None
    if not specs and top is not None and top.get("path"):  # the top-level trace.path, one trace
        specs = [str(top["path"]) + (f":{int(top['block_tokens'])}" if top.get("block_tokens") else "")]
    if not specs:
        raise StudyError("study.traces is required: a list of trace files, each PATH or PATH:BLOCK_TOKENS")
    out = []
    for spec in specs:
        path, sep, bt = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "")
        out.append((path, int(bt) if sep else None))
    return out


def policy_curves_study(cfg) -> xr.Dataset:
    """``experiment=policy_curves``: dims ``trace``, ``policy``, ``point`` (the capacity grid of each trace)."""
    from cacheresearch.studies.traces import load_fit_trace  # noqa: PLC0415 - reads every trace format

    t0 = time.perf_counter()
    c = SB.study_cfg(cfg, DEFAULTS)
    pols = [str(p) for p in c["policies"]]
    bad = sorted(set(pols) - set(block_policies()))
    if bad or not pols:
        raise StudyError(f"study.policies: unknown {bad}; choose among {list(block_policies())}")
    points = int(c["points"])
    if points < 2:
        raise StudyError(f"study.points must be >= 2 (got {points})")
    names, caps, frac, miss, red, acc = [], [], [], [], [], []
    specs = _trace_specs(cfg, c)
    traces = [load_fit_trace(dict(path=path, format="auto", block_tokens=bt, max_requests=c["max_requests"]),
                             key=f"study.traces ({path}:BLOCK_TOKENS)")[0]
              for path, bt in specs]  # every trace read (and checked) before the first curve runs
    for (path, _), w in zip(specs, traces):
        rows = policy_curves(w, points, pols)
        cp = np.asarray([r["capacity"] for r in rows if r["policy"] == pols[0]], np.int64)
        pad = points - cp.size  # small traces: fewer distinct sizes than points (NaN-padded)
        def col(key, p, rows=rows, pad=pad):
            return np.pad(np.asarray([r[key] for r in rows if r["policy"] == p], np.float64), (0, pad),
                          constant_values=np.nan)
        names.append(path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".jsonl"))
        caps.append(np.pad(cp.astype(np.float64), (0, pad), constant_values=np.nan))
        frac.append(col("size_fraction", pols[0]))
        miss.append([col("miss_ratio", p) for p in pols])
        red.append([col("reduction_from_fifo", p) for p in pols])
        acc.append(int(w.total_blocks))
    ds = xr.Dataset(
        dict(capacity=(("trace", "point"), np.asarray(caps)), size_fraction=(("trace", "point"), np.asarray(frac)),
             miss_ratio=(("trace", "policy", "point"), np.asarray(miss)),
             reduction_from_fifo=(("trace", "policy", "point"), np.asarray(red)),
             block_accesses=(("trace",), np.asarray(acc, np.int64))),
        coords=dict(trace=names, policy=pols, point=np.arange(points)))
    SB.doc(ds, dict(capacity=("cache size", "blocks"), size_fraction=("cache size / distinct blocks", "1"),
                    miss_ratio=("missed block accesses / block accesses", "1"),
                    reduction_from_fifo=("(FIFO's miss ratio - the policy's) / FIFO's", "1")))
    ds.attrs.update(SB.common_attrs(cfg, "policy_curves", t0))
    return ds


def summarize_policy_curves(ds) -> str:
    lines = SB.header(ds)
    for t in ds.trace.values:
        d = ds.sel(trace=t)
        lines += ["", f"{t}: {int(d.block_accesses):,} block accesses; miss ratio (reduction from FIFO)"]
        rows = [["size fraction"] + list(ds.policy.values)]
        for k in range(ds.sizes["point"]):
            f = float(d.size_fraction[k])
            if np.isnan(f):
                continue
            rows.append([f"{f:.4f}"] + [f"{float(d.miss_ratio.sel(policy=p)[k]):.4f} "
                                         f"({float(d.reduction_from_fifo.sel(policy=p)[k]):+.3f})"
                                         for p in ds.policy.values])
        lines.append(SB.table(rows))
    return "\n".join(lines)


def plot_policy_curves(ds):
    n = ds.sizes["trace"]
    f = SB.fig(5 * n, 7)
    axes = f.subplots(2, n, squeeze=False)
    for j, t in enumerate(ds.trace.values):
        d = ds.sel(trace=t)
        for p in ds.policy.values:
            axes[0, j].plot(d.size_fraction, d.miss_ratio.sel(policy=p), "o-", ms=3, label=str(p))
            axes[1, j].plot(d.size_fraction, d.reduction_from_fifo.sel(policy=p), "o-", ms=3, label=str(p))
        axes[0, j].set(xscale="log", title=f"{t} ({int(d.block_accesses):,} block accesses)", ylabel="miss ratio")
        axes[1, j].set(xscale="log", xlabel="cache size / distinct blocks", ylabel="miss-ratio reduction from FIFO")
        axes[0, j].legend(fontsize=8)
    return f


STUDIES = [Study("policy_curves", policy_curves_study, summarize_policy_curves, plot_policy_curves,
                 SB.defaults_class("PolicyCurvesDefaults", DEFAULTS))]


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

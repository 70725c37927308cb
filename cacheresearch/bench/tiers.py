"""Bench cases of KV tiers: a tiered sweep against the untiered one, on the main job's grid.

``python -m cacheresearch.bench.tiers [--quick] [--json FILE]``. The grid is ``experiment=routing``'s: the design
scenario with load (200 tenants x 10,000-token prefixes, a hot tenant with half the traffic, 2,605 requests, 16-token
blocks, 8 replicas), its 9 routers x rates 4 / 16 / 32 requests/s x capacities 10,000 / 40,000 blocks x layouts
``stable`` / ``timestamp_top`` (108 cells; ``--quick``: the stable layout at 16 requests/s, 18 cells). Workloads and
streams are built once, outside the timings; every path runs once to compile before it is timed. Each path is its
own row (nothing reports "the fastest"):

``untiered_engine``   the main engine (``simulate_cells``, ``engine.backend=auto``: numba per request on a CPU)
``untiered_tiered``   the tiered engine with no lower tier (:func:`cacheresearch.tiers.fleet.run_cells`); its
                      metrics are checked equal to the main engine's, cell by cell (the fields it tracks)
``cpu_tier``          the tiered engine with a CPU tier of ``--cpu-blocks`` per replica (50 GB/s)

Each row: seconds, blocks the cells walk (requests' blocks x cells), ns per block, and the ratio to
``untiered_engine``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["tier_sweep", "main"]

ROUTERS = ("random", "least_loaded", "prefix_hash", "kubeai_chwbl", ("kubeai_chwbl", {"chwbl_c_pct": 200}),
           "sglang_cache_aware", "dynamo_kv", "llmd_precise", "preble")


def _grid(quick: bool):
    from cacheresearch.engine import make_params  # noqa: PLC0415
    from cacheresearch.shell.sweep import timestamp_top  # noqa: PLC0415
    from cacheresearch.workload.synthetic import tenant_workload  # noqa: PLC0415

    rates, layouts = ((16.0,), ("stable",)) if quick else ((4.0, 16.0, 32.0), ("stable", "timestamp_top"))
    ws, P, of = [], [], []
    for lay in layouts:
        for r in rates:
            w = tenant_workload(n_tenants=200, prefix_tokens=10_000, query_tokens=200, output_tokens=200,
                                hot_share=0.5, rate_per_s=r, duration_s=2500 / r, block_tokens=16, seed=0)
            ws.append(timestamp_top(w) if lay == "timestamp_top" else w)
            for cap in (10_000, 40_000):
                for rt in ROUTERS:
                    name, kn = (rt, {}) if isinstance(rt, str) else rt
                    P.append(make_params("lru", capacity_blocks=cap, replicas=8, router=name, prefix_blocks=625,
                                         latency="h100_8b", **kn))
                    of.append(len(ws) - 1)
    return ws, P, np.asarray(of)


def tier_sweep(quick: bool = False, cpu_blocks: int = 40_000) -> list[dict]:
    """The three rows (module docstring)."""
    from cacheresearch.core.run import simulate_cells  # noqa: PLC0415
    from cacheresearch.engine import compile_stream  # noqa: PLC0415
    from cacheresearch.metrics.core import Metrics  # noqa: PLC0415
    from cacheresearch.tiers import tier_block_bytes  # noqa: PLC0415
    from cacheresearch.tiers.fleet import UNTRACKED, run_cells, tier_config_of  # noqa: PLC0415

    ws, P, of = _grid(quick)
    streams = [compile_stream(w) for w in ws]
    seeds = np.zeros(len(P), np.int64)
    blocks = int(sum(int(ws[s].n_blocks.sum()) for s in of))
    bb = tier_block_bytes("llama3_8b", 16)
    rows = []

    def timed(path, fn):
        fn()  # compiled, warmed
        t = time.perf_counter()
        out = fn()
        s = time.perf_counter() - t
        rows.append(dict(case="tier_sweep", path=path, configs=len(P), blocks=blocks, project_s=round(s, 3),
                         ns_per_block=round(s * 1e9 / max(blocks, 1), 1)))
        return out

    m, _ = timed("untiered_engine", lambda: simulate_cells(streams, of, P, seeds, max_replicas=8, per_request=True,
                                                             queue_slots=512))
    c0 = [tier_config_of(p, block_bytes=bb) for p in P]
    mt, _, _ = timed("untiered_tiered", lambda: run_cells(ws, of, P, seeds, c0, max_replicas=8))
    for f in Metrics._fields:
        if f in UNTRACKED or f == "queue_overflow":  # the tiered engine's queues are unbounded
            continue
        a, b = np.asarray(getattr(m, f)), np.asarray(getattr(mt, f))
        if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            raise AssertionError(f"the tiered engine with no lower tier differs from the main engine in {f}")
    c1 = [tier_config_of(p, tiers={"cpu": {"capacity_blocks": cpu_blocks}}, block_bytes=bb) for p in P]
    timed(f"cpu_tier ({cpu_blocks} blocks per replica)", lambda: run_cells(ws, of, P, seeds, c1, max_replicas=8))
    base = rows[0]["project_s"]
    for r in rows:
        r["ratio_to_untiered_engine"] = round(r["project_s"] / max(base, 1e-9), 2)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench.tiers", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the stable layout at 16 requests/s (18 cells)")
    ap.add_argument("--cpu-blocks", type=int, default=40_000)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    a = ap.parse_args(argv)
    rows = tier_sweep(a.quick, a.cpu_blocks)
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(cores=os.cpu_count(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

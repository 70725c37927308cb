"""The routing summary's answers (``shell.answers``, ``report.routing_answers``) on small hand-made datasets:
the cap to set or that none meets the SLO, overloaded cells, interpolated crossings, ties, the best policy by the
experiment's objective (not by hit rate where TTFT misses the SLO)."""

from __future__ import annotations

import numpy as np
import xarray as xr
import yaml

from cacheresearch.shell import answers as A
from cacheresearch.shell import report

ROUTERS = ["random", "prefix_hash", "kubeai_chwbl", "chwbl_c2", "preble", "llmd_precise"]
CONFIG = {"fleet": {"variants": {"chwbl_c2": {"router": "kubeai_chwbl", "chwbl_c_pct": 200}}},
          "report": {"kind": "routing", "slo_s": 2.0}}


def _ds(p99: dict, hit: dict, util: dict, rates=(8.0, 32.0)) -> xr.Dataset:
    """Routers x rate; ``p99[r]`` / ``hit[r]`` / ``util[r]`` list a value per rate."""
    dims = ("router", "rate_per_s")
    arr = lambda d: np.array([d[r] for r in ROUTERS], dtype=float)  # noqa: E731
    ds = xr.Dataset({"ttft_p99_s": (dims, arr(p99)), "token_hit_rate": (dims, arr(hit)),
                     "utilisation_max": (dims, arr(util))},
                    coords={"router": ROUTERS, "rate_per_s": list(rates)})
    ds.attrs["config"] = yaml.safe_dump(CONFIG)
    return ds


def test_uncapped_affinity_meeting_the_slo_needs_no_cap():
    ds = _ds({r: [0.3, 0.34] for r in ROUTERS}, {r: [0.9, 0.9 if r == "prefix_hash" else 0.8] for r in ROUTERS},
             {r: [0.3, 0.6] for r in ROUTERS})
    text = report.routing_answers(ds, CONFIG["report"])
    assert "Cap to set: none needed" in text and "uncapped prefix_hash meets the SLO" in text
    assert "must be capped" not in text and "no cap meets" not in text
    assert "report.slo_s" in text and "2 s" in text


def test_no_cap_meets_the_slo_and_overloaded_is_named():
    p99 = {"random": [1.0, 12.0], "prefix_hash": [1.5, 103.0], "kubeai_chwbl": [1.0, 2.9], "chwbl_c2": [1.2, 3.9],
           "preble": [0.5, 1.27], "llmd_precise": [0.6, 1.86]}
    util = {r: [0.5, 1.0 if r in ("random", "prefix_hash") else 0.8] for r in ROUTERS}
    ds = _ds(p99, {r: [0.8, 0.8] for r in ROUTERS}, util)
    text = report.routing_answers(ds, CONFIG["report"])
    assert "no cap meets the SLO at 32 req/s" in text
    assert "prefix_hash (no cap): overloaded (utilisation 1.00)" in text and "103" not in text
    assert "kubeai_chwbl (c = 1.25)" in text and "chwbl_c2 (c = 2)" in text
    # the crossing between the grid's points is interpolated and says so: 1.0 -> 2.9 s over 8 -> 32 req/s
    x = 8 + (2.0 - 1.0) / (2.9 - 1.0) * 24
    assert f"crosses at ~{x:.3g} req/s, interpolated between 8 and 32" in text
    assert "Router to use: preble" in text


def test_a_cap_that_meets_the_slo_is_named():
    p99 = {r: [0.5, 5.0] for r in ROUTERS}
    p99["chwbl_c2"] = [0.5, 1.5]
    p99["kubeai_chwbl"] = [0.5, 1.2]
    hit = {r: [0.8, 0.7] for r in ROUTERS}
    hit["chwbl_c2"] = [0.8, 0.85]
    text = report.routing_answers(_ds(p99, hit, {r: [0.5, 0.9] for r in ROUTERS}), CONFIG["report"])
    assert "Cap to set: c = 2 (chwbl_c2)" in text  # the higher hit rate of the two within the SLO


def test_ties_are_reported_as_ties():
    p99 = {r: [0.5, 5.0] for r in ROUTERS}
    p99["preble"] = p99["llmd_precise"] = [0.4, 1.5]
    text = report.routing_answers(_ds(p99, {r: [0.8, 0.8] for r in ROUTERS}, {r: [0.5, 0.9] for r in ROUTERS}),
                                  CONFIG["report"])
    assert "Router to use: preble and llmd_precise (tied)" in text


def test_a_crossing_at_an_overloaded_point_is_not_interpolated():
    da = xr.DataArray([1.0, 50.0], coords={"rate_per_s": [8.0, 32.0]}, dims="rate_per_s")
    u = xr.DataArray([0.5, 1.0], coords={"rate_per_s": [8.0, 32.0]}, dims="rate_per_s")
    assert "not interpolated" in A.slo_crossing(da, "rate_per_s", 2.0, u)
    assert A.slo_crossing(da, "rate_per_s", 100.0).startswith("stays below")


def test_best_policy_by_the_objective_with_its_slo():
    hit = {"lru": 0.80, "s3fifo": 0.85, "fifo": 0.80}
    p99 = {"lru": 1.5, "s3fifo": 2.5, "fifo": 1.5}  # s3fifo hits more but misses the SLO
    assert A.best_policy(hit, p99, 2.0) == ["lru", "fifo"]  # a tie, not an lru win
    assert A.best_policy(hit, {"lru": 3.0, "s3fifo": 2.5, "fifo": 3.0}, 2.0) == ["s3fifo"]  # none meets: lowest p99


def test_the_vllm_replica_is_busy_without_being_overloaded():
    """vllm's utilisation is 1 whenever it holds a sequence: uncapped prefix_hash at p99 0.34 s needs no cap."""
    ds = _ds({r: [0.2, 0.34] for r in ROUTERS}, {r: [0.9, 0.9 if r == "prefix_hash" else 0.85] for r in ROUTERS},
             {r: [0.95, 1.0] for r in ROUTERS})
    ds.attrs["config"] = yaml.safe_dump(dict(CONFIG, replica={"scheduler": "vllm"}))
    text = report.routing_answers(ds, CONFIG["report"])
    assert "Cap to set: none needed" in text and "overloaded" not in text
    ds.attrs["config"] = yaml.safe_dump(CONFIG)  # the same numbers on the fcfs replica: a queue that never drains
    assert "no cap meets the SLO" in report.routing_answers(ds, CONFIG["report"])

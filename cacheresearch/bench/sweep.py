"""The sweep cases: N configurations through the engine (default and JAX), the curve and cache_aware."""

from __future__ import annotations

import time

import jax
import numpy as np

from cacheresearch.bench.auto import auto_call, auto_method
from cacheresearch.bench.lcs import LcsStreams, leaf_first_ids
from cacheresearch.bench.timing import curve_backend, measure, ratio_of, rounded
from cacheresearch.bench.workloads import WorkloadSpec, capacity_grid, subset_index


class SweepCase:
    """The sweep cases: N configurations through the engine (default and JAX), the curve and cache_aware.

    A mixin of :class:`cacheresearch.bench.core.Bench`.
    """

    def sweep_grid(self, spec: WorkloadSpec, n_configs: int):
        R = spec.replicas
        reps = (1, 2) if R == 1 else (R // 2, R)
        seeds = (0, 1)
        caps = capacity_grid(spec.capacity, n_configs // 4)
        cells = [(c, r, s) for s in seeds for r in reps for c in caps]
        return caps, reps, seeds, cells

    def sweep_lcs(self, spec: WorkloadSpec, cells, groups):
        """libCacheSim on the sweep's configurations (all, or ``--lcs-max-runs`` of them), one cache per
        replica: (result, prep seconds, hit rates sequential / parallel per configuration, accesses, the
        time scale of a subset, a note)."""
        w = spec.workload
        # libCacheSim: the configurations (all, or --lcs-max-runs of them), one cache per replica
        lr = lcs_prep = None
        lcs_hit = np.full(len(cells), np.nan)
        lcs_par_hit = np.full(len(cells), np.nan)
        lcs_acc = None
        scale = 1.0
        lcs_note = None
        if self.lcs is not None:
            t = time.perf_counter()
            ids_leaf = leaf_first_ids(w)
            streams = {
                (r, s): LcsStreams(self.lcs, w, ids_leaf, self.routing(spec, r, s), r, self.tmp,
                    f"{spec.name}_sw_r{r}_s{s}")
                for r, s in groups
            }
            lcs_prep = time.perf_counter() - t
            run_idx = subset_index(len(cells), self.lcs_max_runs)
            scale = len(cells) / run_idx.size
            if run_idx.size < len(cells):
                lcs_note = (f"ran {run_idx.size} of {len(cells)} configurations (evenly spaced), sequentially and "
                            f"in parallel; times scaled by {scale:.2f}")
            lr = self.lcs_run([(streams[(cells[i][1], cells[i][2])], int(cells[i][0])) for i in run_idx], parallel=True)
            totals = {g: max(st.total, 1) for g, st in streams.items()}
            for j, i in enumerate(run_idx):
                g = (cells[i][1], cells[i][2])
                lcs_hit[i] = 1.0 - lr.sequential_misses[j] / totals[g]
                if lr.parallel is not None:
                    lcs_par_hit[i] = 1.0 - lr.parallel_misses[j] / totals[g]
            acc = sorted({st.accesses for st in streams.values()})
            lcs_acc = acc[0] if len(acc) == 1 else acc

        return lr, lcs_prep, lcs_hit, lcs_par_hit, lcs_acc, scale, lcs_note

    def case_sweep(self, spec: WorkloadSpec, stream) -> list[dict]:
        w = spec.workload
        N = self.configs
        caps, reps, seeds, cells = self.sweep_grid(spec, N)
        groups = [(r, s) for s in seeds for r in reps]

        # (a) the engine: every configuration in one vmapped call
        eng, eng_tokens, _ = self.engine_grid(stream, cells, max(reps))
        # logged at once, so that a time-limited run keeps the engine's figure
        self.log(f"[bench] {spec.name}: engine, {len(cells)} configurations in one call: {eng.best:.4f} s "
                 f"(first call {eng.first:.2f} s)")
        # (a') the default path (bench/auto.py: backend=auto with the sweep's options; numba on a CPU host)
        nba = measure(auto_call(stream, cells, max(reps)),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        if not np.array_equal(nba.value[0], eng_tokens):
            raise AssertionError(f"{spec.name}: sweep: the default backend != the JAX engine")
        # (b) one-pass curves: one per (replicas, seed) routing group, all capacities read off
        def curves():
            return {
                (r, s): self.curve(w, replicas=r, router="random", key=jax.random.PRNGKey(s),
                    max_capacity=int(caps.max()))
                for r, s in groups
            }

        cur = measure(curves, repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        hc = cur.value
        curve_tokens = np.array([int(hc[(r, s)].hit_tokens[c]) for c, r, s in cells], dtype=np.int64)
        thr_sorted = {g: np.sort(hc[g].thresholds) for g in groups}
        proj_block = np.array([np.searchsorted(thr_sorted[(r, s)], c, side="left") for c, r,
            s in cells]) / max(w.total_blocks, 1)
        proj_token = curve_tokens / max(int(w.input_tokens.sum()), 1)

        exact = bool(np.array_equal(eng_tokens, curve_tokens))
        if not exact:
            bad = int(np.argmax(eng_tokens != curve_tokens))
            raise AssertionError(f"{spec.name}: sweep config {cells[bad]}: engine {eng_tokens[bad]} != curve "
                                 f"{curve_tokens[bad]}")

        lr, lcs_prep, lcs_hit, lcs_par_hit, lcs_acc, scale, lcs_note = self.sweep_lcs(spec, cells, groups)

        def opt(x):
            return None if np.isnan(x) else rounded(x)

        per_config = [
            {"capacity": int(c), "replicas": int(r), "seed": int(s), "project_hit_tokens": int(curve_tokens[i]),
             "project_hit_rate": rounded(proj_block[i]), "project_token_hit_rate": rounded(proj_token[i]),
             "libcachesim_hit_rate": opt(lcs_hit[i]), "libcachesim_parallel_hit_rate": opt(lcs_par_hit[i])}
            for i, (c, r, s) in enumerate(cells)
        ]
        have = ~np.isnan(lcs_hit)
        lcs_mean = float(lcs_hit[have].mean()) if have.any() else None
        max_diff = float(np.abs(lcs_hit[have] - proj_block[have]).max()) if have.any() else None
        common = {
            "workload": spec.name, "accesses": w.total_blocks, "configs": len(cells),
            "total_accesses": w.total_blocks * len(cells),
            "libcachesim_prep_s": rounded(lcs_prep), "libcachesim_accesses": lcs_acc,
            "libcachesim_parallel_accesses": None if lr is None else lr.parallel_accesses,
            # means over the configurations libCacheSim ran (all, unless --lcs-max-runs)
            "project_hit_rate": rounded(proj_block[have].mean() if have.any() else proj_block.mean()),
            "project_token_hit_rate": rounded(proj_token[have].mean() if have.any() else proj_token.mean()),
            "libcachesim_hit_rate": rounded(lcs_mean), "max_abs_hit_rate_diff": rounded(max_diff),
            "libcachesim_parallel_equals_sequential": None if lr is None or lr.parallel is None else True,
            "grid": {"capacities": [int(c) for c in caps], "replicas": list(reps), "seeds": list(seeds)},
            "engine_equals_curve": exact,
            "per_config": per_config,
        }
        if lcs_note:
            common["libcachesim_note"] = lcs_note
        out = []
        e = {
            "name": f"sweep{N}_engine_jax", "path": "engine_jax", **common,
            **eng.fields(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(lr, eng.best, eng.compile_estimate, scale=scale, multi=True),
            "method": (f"engine_jax: the JAX engine, simulate_grid over {len(cells)} configs in one call (vmap, "
                       f"per_request=False, "
                       "queue=False: hit rates only); first call = compile + run"),
            "repeats": eng.runs,
        }
        out.append(self.add_case(e, spec))
        en = {
            "name": f"sweep{N}_engine", "path": "engine", **common,
            **nba.fields(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(lr, nba.best, nba.compile_estimate, scale=scale, multi=True),
            "method": auto_method(len(cells), nba.value[2]),
            "repeats": nba.runs,
        }
        out.append(self.add_case(en, spec))
        c = {
            "name": f"sweep{N}_curve", "path": "curve", **common,
            **cur.fields(None),
            **self.lcs_fields(lr, cur.best, cur.compile_estimate, scale=scale, multi=True),
            "method": (f"curve: hit_curve (backend={curve_backend(self.curve_backend)}) per (replicas, seed) group "
                       f"({len(groups)} groups), all capacities read off; first call = compile + run"),
            "repeats": cur.runs,
        }
        out.append(self.add_case(c, spec))
        self._sweep[spec.name] = {"engine": eng, "configs": len(cells), "cells": cells, "tokens": eng_tokens}
        return out

    # cache-aware sweep ----------------------------------------------------------------------------
    def case_cache_aware(self, spec: WorkloadSpec, stream) -> dict:
        w = spec.workload
        N = self.configs
        caps, reps, seeds, cells = self.sweep_grid(spec, N)
        # the baseline first: the same grid, random router, with the queue model as well
        base, base_tokens, _ = self.engine_grid(stream, cells, max(reps), router="random", queue=True)
        self.log(f"[bench] {spec.name}: random router, queue=True, {len(cells)} configurations: {base.best:.4f} s")
        ca, ca_tokens, params = self.engine_grid(stream, cells, max(reps), router="cache_aware", queue=True,
            view="precise")
        prev = self._sweep.get(spec.name)
        base_equal = None
        if prev is not None and prev["cells"] == cells:
            base_equal = bool(np.array_equal(prev["tokens"], base_tokens))
            if not base_equal:
                raise AssertionError(f"{spec.name}: random router with queue=True != queue=False (hit tokens)")
        total_in = max(int(w.input_tokens.sum()), 1)
        knobs = {k: np.asarray(getattr(params, k)).reshape(-1)[0].item()
                 for k in ("cache_threshold_pm", "balance_abs", "balance_rel_pct", "miss_smallest_tree")
                 if hasattr(params, k)}
        case = {
            "name": f"sweep{N}_cache_aware", "path": "engine_jax",
            "workload": spec.name, "accesses": w.total_blocks, "configs": len(cells),
            "total_accesses": w.total_blocks * len(cells),
            **ca.fields(self.stream_prep_s.get(spec.name)),
            **self.lcs_fields(None, ca.best, ca.compile_estimate, multi=True),
            "libcachesim_accesses": None, "libcachesim_hit_rate": None,
            "libcachesim_note": "libCacheSim has no router that reads cache state or load: no libCacheSim "
                                "figure, no ratio",
            "router": "cache_aware", "view": "precise", "queue": True, "router_knobs": knobs,
            "baseline_router": "random", "baseline_queue": True,
            "baseline_s": rounded(base.best), "baseline_s_median": rounded(base.median),
            "baseline_compile_s": rounded(base.compile_estimate), "baseline_first_call_s": rounded(base.first),
            "cost_vs_random": rounded(ratio_of(ca.best, base.best), 4),
            "baseline_equals_sweep_engine": base_equal,
            # the engine's block hit rate needs per-request output, which this timed call leaves out
            "project_hit_rate": None,
            "project_token_hit_rate": rounded(ca_tokens.mean() / total_in),
            "baseline_token_hit_rate": rounded(base_tokens.mean() / total_in),
            "grid": {"capacities": [int(c) for c in caps], "replicas": list(reps), "seeds": list(seeds)},
            "per_config": [
                {"capacity": int(c), "replicas": int(r), "seed": int(s), "project_hit_tokens": int(ca_tokens[i]),
                 "baseline_hit_tokens": int(base_tokens[i]), "project_token_hit_rate": rounded(ca_tokens[i] / total_in)}
                for i, (c, r, s) in enumerate(cells)
            ],
            "method": (f"engine_jax: the JAX engine, simulate_grid over {len(cells)} configs in one call, "
                       f"router cache_aware (view precise, "
                       "default knobs), queue=True (the router reads loads); cost_vs_random = its time / the same "
                       "grid with router random and queue=True; first call = compile + run"),
            "repeats": ca.runs, "baseline_repeats": base.runs,
        }
        return self.add_case(case, spec)

    # mrc ------------------------------------------------------------------------------------------

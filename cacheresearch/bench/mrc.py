"""The hit-curve cases: mrc_curve, the scaling rows and SHARDS."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.analysis import mrc
from cacheresearch.bench.lcs import LcsStreams, leaf_first_ids
from cacheresearch.bench.timing import curve_backend, measure, ratio_of, ready, rounded
from cacheresearch.bench.workloads import WorkloadSpec, lcs_capacities, slice_requests, subset_index
from cacheresearch.core.simulate import simulate_grid  # the JAX scan
from cacheresearch.engine import combine_limbs, compile_stream, make_params, stack_params


class CurveCase:
    """The hit-curve cases: mrc_curve, the scaling rows and SHARDS.

    A mixin of :class:`cacheresearch.bench.core.Bench`.
    """

    def case_mrc(self, spec: WorkloadSpec, stream) -> dict:
        w = spec.workload
        key = jax.random.PRNGKey(0)
        cur = measure(lambda: self.curve(w, replicas=1, router="random", key=key),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        hc = cur.value
        ws = int(hc.capacities[-1])
        self._exact_curves[spec.name] = (hc, cur.best)
        caps = lcs_capacities(ws, 64)
        thr = np.sort(hc.thresholds)
        proj_block = np.searchsorted(thr, caps, side="left") / max(w.total_blocks, 1)
        # the exact engine at three of the capacities (untimed)
        pick = caps[[len(caps) // 4, len(caps) // 2, (3 * len(caps)) // 4]]
        cells = [(int(c), 1, 0) for c in pick]
        params = stack_params([make_params("lru", c, replicas=1, router="random") for c, _, _ in cells])
        keys = jnp.stack([key] * len(cells))
        m = ready(simulate_grid(stream, params, keys, max_replicas=1, per_request=False, queue=False))
        eng_tokens = combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo)
        cur_tokens = hc.hit_tokens[pick]
        exact = bool(np.array_equal(eng_tokens, cur_tokens))
        if not exact:
            raise AssertionError(f"{spec.name}: mrc curve {cur_tokens.tolist()} != engine {eng_tokens.tolist()} "
                                 f"at {pick.tolist()}")
        lr = lcs_prep = lcs_note = lcs_acc = None
        lcs_hit = lcs_par_hit = None
        max_diff = None
        scale = 1.0
        if self.lcs is not None:
            t = time.perf_counter()
            streams = LcsStreams(self.lcs, w, leaf_first_ids(w), np.zeros(w.n_requests, np.int64), 1, self.tmp,
                f"{spec.name}_mrc")
            lcs_prep = time.perf_counter() - t
            run_idx = subset_index(caps.size, self.lcs_max_runs)
            scale = caps.size / run_idx.size
            if run_idx.size < caps.size:
                lcs_note = (f"ran {run_idx.size} of {caps.size} capacities (evenly spaced), sequentially and in "
                            f"parallel; times scaled by {scale:.2f}")
            lr = self.lcs_run([(streams, int(caps[i])) for i in run_idx], parallel=True)
            lcs_hit = np.full(caps.size, np.nan)
            lcs_hit[run_idx] = 1.0 - lr.sequential_misses / max(streams.total, 1)
            if lr.parallel is not None:
                lcs_par_hit = np.full(caps.size, np.nan)
                lcs_par_hit[run_idx] = 1.0 - lr.parallel_misses / max(streams.total, 1)
            max_diff = float(np.nanmax(np.abs(lcs_hit - proj_block)))
            lcs_acc = streams.accesses

        def opt_list(a):
            return None if a is None else [None if np.isnan(x) else rounded(x) for x in a]

        case = {
            "name": "mrc_curve", "path": "curve",
            "workload": spec.name,
            "accesses": w.total_blocks,
            "configs": int(caps.size),
            **cur.fields(None),
            "libcachesim_prep_s": rounded(lcs_prep), "libcachesim_accesses": lcs_acc,
            "libcachesim_parallel_accesses": None if lr is None else lr.parallel_accesses,
            **self.lcs_fields(lr, cur.best, cur.compile_estimate, scale=scale, multi=True),
            "project_hit_rate": rounded(
                proj_block[~np.isnan(lcs_hit)].mean() if lcs_hit is not None else proj_block.mean()),
            "libcachesim_hit_rate": rounded(None if lcs_hit is None else np.nanmean(lcs_hit)),
            "libcachesim_parallel_equals_sequential": None if lr is None or lr.parallel is None else True,
            "max_abs_hit_rate_diff": rounded(max_diff),
            "method": (f"curve: one hit_curve (1 replica, backend={curve_backend(self.curve_backend)}) gives "
                       f"all {ws + 1} "
                       f"capacities 0..working set; libCacheSim: {caps.size} log-spaced capacities; hit rates "
                       f"are means "
                       "over those capacities"),
            "working_set_blocks": ws,
            "engine_checked_capacities": [int(c) for c in pick],
            "engine_checked_hit_tokens": [int(x) for x in eng_tokens],
            "curve_equals_engine": exact,
            "curve": {
                "capacities": [int(c) for c in caps],
                "project_block_hit_rate": [rounded(x) for x in proj_block],
                "project_token_hit_rate": [rounded(x) for x in hc.token_hit_rate[caps]],
                "libcachesim_hit_rate": opt_list(lcs_hit),
                "libcachesim_parallel_hit_rate": opt_list(lcs_par_hit),
            },
            "repeats": cur.runs,
        }
        if lcs_note:
            case["libcachesim_note"] = lcs_note
        return self.add_case(case, spec)

    # scaling --------------------------------------------------------------------------------------
    def scaling(self, spec: WorkloadSpec, stream) -> list[dict]:
        w = spec.workload
        R, C = spec.replicas, spec.capacity
        key = jax.random.PRNGKey(0)
        out = []
        half = slice_requests(w, max(1, w.n_requests // 2))
        for sub, label in ((half, "half"), (w, "full")):
            if sub is w and spec.name in self._single:  # measured by the single cases
                eng, cur = self._single[spec.name]["engine"], self._single[spec.name]["curve"]
            else:
                s = stream if sub is w else ready(compile_stream(sub))
                params = make_params("lru", C, replicas=R, router="random")
                eng = self.engine_single(s, params, key, R)
                cur = measure(lambda: self.curve(sub, replicas=R, router="random", key=key, max_capacity=C),
                              repeats=self.repeats, budget_s=self.budget_s, warmup=True)
            for method, tm in (("engine single", eng), ("curve single", cur)):
                out.append({
                    "workload": spec.name, "axis": "requests", "size": label, "requests": sub.n_requests,
                    "accesses": sub.total_blocks, "configs": 1, "method": method, "project_s": rounded(tm.best),
                    "project_s_median": rounded(tm.median),
                        "us_per_access_config": rounded(1e6 * tm.best / max(sub.total_blocks, 1), 4),
                })
        # configs: a quarter of the sweep vs the whole sweep (same stream, one vmapped call each)
        N = self.configs
        for n in (N // 4, N):
            if n < 4:
                continue
            _, reps, _, cells = self.sweep_grid(spec, n)
            prev = self._sweep.get(spec.name)
            if prev is not None and prev["configs"] == len(cells) and n == N:
                tm = prev["engine"]
            else:
                tm, _, _ = self.engine_grid(stream, cells, max(reps))
            out.append({
                "workload": spec.name, "axis": "configs", "size": str(len(cells)), "requests": w.n_requests,
                "accesses": w.total_blocks, "configs": len(cells), "method": "engine grid (simulate_grid)",
                "project_s": rounded(tm.best), "project_s_median": rounded(tm.median),
                "us_per_access_config": rounded(1e6 * tm.best / max(w.total_blocks * len(cells), 1), 4),
            })
        self.report["scaling"].extend(out)
        for row in out:
            self.log(f"  scaling {row['axis']:<8} {row['size']:>5} {row['method']:<28} {row['project_s']:>9.4f}s "
                     f"{row['us_per_access_config']:>9.4f} us/access/config")
        self.save()
        return out

    # SHARDS ---------------------------------------------------------------------------------------
    def shards(self, spec: WorkloadSpec, rates=(0.1, 0.01)) -> list[dict]:
        w = spec.workload
        key = jax.random.PRNGKey(0)
        if spec.name in self._exact_curves:
            exact, exact_s = self._exact_curves[spec.name]
        else:
            tm = measure(lambda: self.curve(w, replicas=1, router="random", key=key), repeats=1, budget_s=0,
                warmup=True)
            exact, exact_s = tm.value, tm.best
        ex = exact.token_hit_rate
        out = []
        for rate in rates:
            t = time.perf_counter()
            sub, factor = mrc.shards_sample(w, rate)
            sample_s = time.perf_counter() - t
            row = {"workload": spec.name, "rate": rate, "sampled_requests": sub.n_requests,
                "sampled_accesses": sub.total_blocks,
                   "sample_s": rounded(sample_s), "exact_curve_s": rounded(exact_s)}
            if sub.n_requests == 0 or sub.total_blocks == 0:
                row.update({"curve_s": None, "max_abs_error": None, "note": "the sample is empty"})
            else:
                tm = measure(lambda: self.curve(sub, replicas=1, router="random", key=key), repeats=self.repeats,
                             budget_s=self.budget_s, warmup=True)
                sc = tm.value
                c = sc.capacities[1:]
                full_c = np.minimum(np.round(c / factor).astype(np.int64), exact.capacities[-1])
                err = np.abs(sc.token_hit_rate[1:] - ex[full_c])
                # also at the exact curve's own capacities (sampled curve read at C * rate)
                C = exact.capacities[1:]
                sc_c = np.minimum(np.round(C * factor).astype(np.int64), sc.capacities[-1])
                err2 = np.abs(sc.token_hit_rate[sc_c] - ex[1:])
                row.update({
                    "curve_s": rounded(tm.best), "curve_first_call_s": rounded(tm.first),
                    "total_s": rounded(sample_s + tm.best),
                    "speedup_vs_exact": rounded(ratio_of(exact_s, sample_s + tm.best), 3),
                    "max_abs_error": rounded(float(err.max()) if err.size else None),
                    "mean_abs_error": rounded(float(err.mean()) if err.size else None),
                    "max_abs_error_at_exact_capacities": rounded(float(err2.max()) if err2.size else None),
                    "sampled_working_set": int(sc.capacities[-1]),
                })
            out.append(row)
            self.log(f"  shards rate={rate}: {row}")
        self.report["shards"].extend(out)
        self.save()
        return out

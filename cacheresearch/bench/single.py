"""The single-configuration cases: engine (default and JAX), hit curve and replay, one configuration."""

from __future__ import annotations

import time

import jax
import numpy as np

from cacheresearch.analysis import mrc
from cacheresearch.bench.auto import auto_call, auto_method
from cacheresearch.bench.lcs import LcsStreams, leaf_first_ids
from cacheresearch.bench.timing import curve_backend, measure, ready, rounded
from cacheresearch.bench.workloads import WorkloadSpec, slice_requests
from cacheresearch.engine import combine_limbs, compile_stream, make_params


class SingleCase:
    """The single-configuration cases: engine (default and JAX), hit curve and replay, one configuration.

    A mixin of :class:`cacheresearch.bench.core.Bench`.
    """

    def case_single(self, spec: WorkloadSpec, stream=None) -> list[dict]:
        w, R, C = spec.workload, spec.replicas, spec.capacity
        key = jax.random.PRNGKey(0)
        if stream is None:
            t = time.perf_counter()
            stream = ready(compile_stream(w))
            self.stream_prep_s[spec.name] = time.perf_counter() - t
        prep = self.stream_prep_s.get(spec.name)
        params = make_params("lru", C, replicas=R, router="random")
        eng = self.engine_single(stream, params, key, R)
        m = eng.value
        eng_tokens = int(combine_limbs(m.hit_tokens_hi, m.hit_tokens_lo))
        eng_blocks = np.asarray(m.hit_blocks).astype(np.int64)

        cur = measure(
            lambda: self.curve(w, replicas=R, router="random", key=key, max_capacity=C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        hc = cur.value
        cur_blocks = hc.hit_blocks_at(C)
        curve_exact = bool(int(hc.hit_tokens[C]) == eng_tokens and np.array_equal(cur_blocks, eng_blocks))
        if not curve_exact:
            raise AssertionError(f"{spec.name}: hit curve at C={C} ({int(hc.hit_tokens[C])} tokens) != engine "
                                 f"({eng_tokens})")

        # the one-capacity compiled replay (routing included, as in the curve)
        rpl = measure(
            lambda: mrc.lru_replay(w, mrc.route_requests(w, "random", R, key=key), C),
            repeats=self.repeats, budget_s=self.budget_s, warmup=True,
        )
        replay_exact = bool(np.array_equal(rpl.value, eng_blocks))
        if not replay_exact:
            raise AssertionError(f"{spec.name}: lru_replay at C={C} != engine")

        # the default path (engine.backend=auto, bench/auto.py), one configuration
        nbs = measure(auto_call(stream, [(C, R, 0)], R),
                      repeats=self.repeats, budget_s=self.budget_s, warmup=True)
        if not np.array_equal(nbs.value[1][:w.n_requests], eng_blocks[:w.n_requests]):
            raise AssertionError(f"{spec.name}: the default backend != the JAX engine")

        # libCacheSim: one configuration, one cache per replica, one core
        lr = lcs_prep = lcs_hit = lcs_acc = None
        rep = np.asarray(m.replica)
        if self.lcs is not None:
            t = time.perf_counter()
            streams = LcsStreams(self.lcs, w, leaf_first_ids(w), rep, R, self.tmp, f"{spec.name}_single")
            lcs_prep = time.perf_counter() - t
            lr = self.lcs_run([(streams, C)], parallel=False)
            lcs_hit = 1.0 - int(lr.sequential_misses[0]) / max(streams.total, 1)
            lcs_acc = streams.accesses

        # reference (one config, on a prefix when large)
        ref = self.reference(spec, rep, eng_blocks)
        total_blocks = max(w.total_blocks, 1)
        common = {
            "workload": spec.name, "accesses": w.total_blocks, "configs": 1,
            "libcachesim_prep_s": rounded(lcs_prep), "libcachesim_accesses": lcs_acc,
            "project_hit_rate": rounded(eng_blocks.sum() / total_blocks),
            "project_token_hit_rate": rounded(eng_tokens / max(int(w.input_tokens.sum()), 1)),
            "project_hit_tokens": eng_tokens, "project_hit_blocks": int(eng_blocks.sum()),
            "libcachesim_hit_rate": rounded(lcs_hit),
            "capacity": C, "replicas": R,
            "curve_equals_engine": curve_exact, "replay_equals_engine": replay_exact,
            **ref,
        }
        backend = curve_backend(self.curve_backend)
        paths = (
            ("engine_jax", eng, rounded(prep),
             "engine_jax: the JAX engine, simulate(per_request=True, queue=False), one configuration; first call = "
             "compile + run"),
            ("curve", cur, None,
             f"curve: hit_curve(max_capacity=C, backend={backend}), routing included; first call = compile + run"),
            ("replay", rpl, None,
             "replay: route_requests + lru_replay (numba, one capacity); first call = compile + run"),
            ("engine", nbs, rounded(prep), auto_method(1, nbs.value[2])),
        )
        out = []
        for path, tm, path_prep, method in paths:
            case = {
                "name": f"single_{path}", "path": path, **common,
                **tm.fields(path_prep),
                **self.lcs_fields(lr, tm.best, tm.compile_estimate, multi=False),
                "method": method, "repeats": tm.runs,
            }
            if ref.get("reference_s_per_access"):
                slowdown = ref["reference_s_per_access"] / (tm.best / total_blocks)
                case["reference_slowdown_vs_project"] = rounded(slowdown, 4)
            out.append(self.add_case(case, spec))
        self._single[spec.name] = {"engine": eng, "curve": cur}
        return out

    def reference(self, spec: WorkloadSpec, rep: np.ndarray, eng_blocks: np.ndarray) -> dict:
        reference_simulate = self.reference_fn
        if reference_simulate is None:
            return {"reference_s": None, "reference_note": "no reference given (--reference tests/reference.py)"}
        w = spec.workload
        n = int(np.searchsorted(w.offsets, self.reference_max_blocks, side="right")) - 1
        n = max(1, min(n, w.n_requests))
        sub = w if n == w.n_requests else slice_requests(w, n)
        t = time.perf_counter()
        out = reference_simulate(sub, policy="lru", capacity_blocks=spec.capacity, replicas=spec.replicas,
                                 router="random", replica_choices=rep[:n])
        ref_s = time.perf_counter() - t
        res = {
            "reference_s": rounded(ref_s), "reference_accesses": sub.total_blocks, "reference_requests": n,
            "reference_s_per_access": rounded(ref_s / max(sub.total_blocks, 1)),
        }
        if n == w.n_requests:
            res["reference_equals_engine"] = bool(np.array_equal(out["hit_blocks"], eng_blocks))
            if not res["reference_equals_engine"]:
                raise AssertionError(f"{spec.name}: reference != engine")
        return res

    # sweep ----------------------------------------------------------------------------------------

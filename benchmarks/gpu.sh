#!/usr/bin/env bash
# One prepared GPU benchmark run (about 9 minutes at most), for a bare device machine with no network.
#
#   bash benchmarks/gpu.sh            # from the repository root; results go to $OUT (default: bench-out/)
#   bash benchmarks/gpu.sh --dry-run  # every phase at toy size on whatever JAX sees (a CPU too): checks
#                                     # the script end to end, nothing to quote (DRY_RUN=1 is the same)
#
# Everything ends up in ONE JSON, $OUT/gpu_run.json (the phases' JSONs, the main jobs' exit, wall time
# and peak memory, the machine), written at the end from what the phases left. What it runs:
#   0. the vllm replica (JAX backend) at VLLM_CONFIGS (default 1,000) configurations of the llm-d-like
#      grid (python -m cacheresearch.bench.vllm --backends jax: simulated requests, engine steps and
#      replica events per second, events per configuration mean / max, the runner's calls; first call
#      = compile + run, then one timed call)                                              -> vllm.json
#   M. the main job (python -m cacheresearch.sweep, experiment=routing) on fcfs replicas and on vllm
#      replicas (replica.scheduler=vllm), each under /usr/bin/time -v when present    -> main_*.log
# then the bench (python -m cacheresearch.bench, see that module's docstring for what each case times):
#   1. seed_fleet + mooncake: single_engine / single_curve / single_replay, the sweep at 4,096
#      configurations (--configs 4096: 1,024 capacities x 2 replica counts x 2 seeds) as
#      sweep4096_engine (one vmapped simulate_grid call) and sweep4096_curve, sweep4096_cache_aware
#      (cache_aware router, precise view, queue=True; cost_vs_random against the random router with
#      queue=True) and mrc_curve; libCacheSim runs 64 of the 4,096 configurations and its times are
#      scaled (its runs are independent and take the same time each)                   -> bench_4096.json
#   2. the design scenario (200 tenants x 10,000-token prefixes, 8 replicas) at 1,000 configurations,
#      DESIGN_REQUESTS requests (default 5,000 so the phase fits its time; 50000 is the full
#      scenario), libCacheSim on 16 of the configurations; cases CASES2 (default without
#      cache_aware, which runs the grid twice more)                                     -> bench_design.json
# The figure to quote is `ratio` = libcachesim_parallel_s / project_s: libCacheSim on ALL of this
# host's CPU cores (LCS_WORKERS processes, default every usable core; `libcachesim_workers` in the
# JSON), its caches built and its worker pool started outside the timer, against one GPU. The
# one-core figure stays in `ratio_sequential` (= libcachesim_s / project_s). The single_* cases have
# one configuration and compare with one core (`ratio_basis` says which). The summary at the end
# prints the parallel field of every case and says where it is missing ($OUT/summary.txt).
# Each phase has a time limit; the JSON is rewritten after every case, so a phase cut short still
# leaves the cases it finished. Logs: $OUT/phase1.log, $OUT/phase2.log; machine: $OUT/env.txt.
#
# Packages: the device image has JAX with its CUDA plugin, numpy and numba. libCacheSim is not there:
# carry it as a wheel in .whl/ (ignored by git), made on a machine with PyPI access:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_34_x86_64 -d .whl libcachesim==0.3.5
# Every wheel in .whl/ is installed into /tmp/site. Without libCacheSim the bench still runs (its
# columns stay empty). The project itself is imported from the checkout (an editable install without
# dependencies is tried first; running from the repository root works either way).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=${DRY_RUN:-}
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; fi
# the shared Mooncake trace does not travel to a device machine: carry a copy in .traces/ (ignored)
if [ -z "${CACHERESEARCH_TRACE:-}" ] && [ -f .traces/mooncake_synthetic_trace.jsonl ]; then
    export CACHERESEARCH_TRACE=.traces/mooncake_synthetic_trace.jsonl
fi
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-560}          # the whole script, seconds (a device command may run 600 s)
PHASE1_S=${PHASE1_S:-150}        # phase 1 limit, seconds
DESIGN_REQUESTS=${DESIGN_REQUESTS:-5000}
DESIGN_CONFIGS=${DESIGN_CONFIGS:-1000}
SWEEP_CONFIGS=${SWEEP_CONFIGS:-4096}
CASES1=${CASES1:-single,sweep,cache_aware,mrc}
CASES2=${CASES2:-single,sweep,mrc}
LCS_WORKERS=${LCS_WORKERS:-$(nproc 2>/dev/null || echo 1)}   # libCacheSim's parallel figure: every core
VLLM_CONFIGS=${VLLM_CONFIGS:-1000}
VLLM_REQUESTS=${VLLM_REQUESTS:-400}
VLLM_S=${VLLM_S:-150}            # phase 0 limit, seconds
MAIN_S=${MAIN_S:-75}             # each main job's limit, seconds
WORKLOADS1=${WORKLOADS1:-seed_fleet,mooncake}
WORKLOADS2=${WORKLOADS2:-design}
MAIN_ARGS=()                     # overrides of the main jobs (none: the main job as configured)
if [ -n "$DRY_RUN" ]; then       # toy sizes: the script's plumbing, not figures
    ALLOW_CPU=1
    VLLM_CONFIGS=2; VLLM_REQUESTS=20; SWEEP_CONFIGS=8; DESIGN_CONFIGS=4; DESIGN_REQUESTS=100
    WORKLOADS1=tiny; CASES1=sweep; CASES2=sweep
    # a rerun loads the programs instead of compiling them (the command line's default cache directory)
    export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheresearch/jax}
    MAIN_ARGS=("grid.router=[random,llmd_precise]" "grid.rate_per_s=[4]" "grid.capacity_blocks=[10000]"
               "grid.layout=[stable]" "workload.tenant.n_requests=40" "workload.tenant.n_tenants=4"
               "output.figure=false")
fi

# libCacheSim's extension links libglib-2.0 and libpcre2-8, which the device image lacks: carry them in
# .libs/ (ignored; unpacked from Debian's libglib2.0-0 and libpcre2-8-0 with apt-get download + dpkg -x)
if [ -d .libs ]; then export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
CURVE_BACKEND=${CURVE_BACKEND:-numba}   # the one-pass curve is host work: numba on the host CPU

# ---- packages (no network: only what is carried)
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${SKIP_INSTALL:-}" ]; then
    $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
        || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if ! $PY -c "import jax" 2>/dev/null; then
    echo "jax is missing; trying pip install 'jax[cuda12]' (needs a package registry)"
    $PY -m pip install -q "jax[cuda12]" || { echo "no jax: giving up"; exit 2; }
fi

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    $PY - <<'EOF'
import jax, numpy, sys
print("python", sys.version.split()[0], "jax", jax.__version__, "numpy", numpy.__version__)
print("backend", jax.default_backend(), jax.devices())
try:
    import libcachesim
    print("libcachesim", getattr(libcachesim, "__version__", "?"))
except Exception as e:
    print("libcachesim missing:", e)
try:
    import numba
    print("numba", numba.__version__)
except Exception as e:
    print("numba missing:", e)
import cacheresearch
print("cacheresearch", cacheresearch.__version__)
EOF
} 2>&1 | tee "$OUT/env.txt"

if [ "$($PY -c 'import jax; print(jax.default_backend())' 2>/dev/null)" != "gpu" ] && [ -z "${ALLOW_CPU:-}" ]; then
    echo "JAX sees no GPU (set ALLOW_CPU=1 to run anyway): stopping"
    exit 2
fi

# ---- phase 0: the vllm replica, JAX backend, VLLM_CONFIGS configurations
echo "== phase 0: vllm replica x ${VLLM_CONFIGS} configurations (limit ${VLLM_S}s) =="
timeout --signal=INT --kill-after=10 "$VLLM_S" \
    $PY -m cacheresearch.bench.vllm --n "$VLLM_CONFIGS" --requests "$VLLM_REQUESTS" --backends jax \
        --json "$OUT/vllm.json" 2>&1 | tee "$OUT/phase0.log"
echo "phase 0 exit ${PIPESTATUS[0]} after ${SECONDS}s"

# ---- the main job on both replica models (exit, wall time and peak memory: /usr/bin/time -v)
TIMEV=()
if [ -x /usr/bin/time ]; then TIMEV=(/usr/bin/time -v); fi
for sched in fcfs vllm; do
    echo "== main job, replica.scheduler=${sched} (limit ${MAIN_S}s) =="
    t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$MAIN_S" "${TIMEV[@]}" \
        $PY -m cacheresearch.sweep "replica.scheduler=${sched}" "hydra.run.dir=$OUT/main_${sched}" "${MAIN_ARGS[@]}" \
        > "$OUT/main_${sched}.log" 2>&1
    rc=$?
    echo "main job ${sched}: exit ${rc} after $((SECONDS - t0))s" | tee -a "$OUT/main_${sched}.log"
    echo "{\"exit\": ${rc}, \"script_wall_s\": $((SECONDS - t0))}" > "$OUT/main_${sched}.json"
done

# ---- phase 1: the 4,096-configuration sweep on seed_fleet and mooncake
echo "== phase 1 (limit ${PHASE1_S}s) =="
timeout --signal=INT --kill-after=10 "$PHASE1_S" \
    $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads "$WORKLOADS1" --configs "$SWEEP_CONFIGS" \
        --cases "$CASES1" --lcs-max-runs 64 --lcs-workers "$LCS_WORKERS" \
        --repeats 2 --budget 10 --no-scaling --no-shards --json "$OUT/bench_4096.json" 2>&1 | tee "$OUT/phase1.log"
echo "phase 1 exit ${PIPESTATUS[0]} after ${SECONDS}s"

# ---- phase 2: the design scenario at 1,000 configurations, in the time left
left=$((TOTAL_S - SECONDS - 10))   # 10 s kept for the summary
if [ "$left" -lt 60 ]; then
    echo "only ${left}s left: skipping phase 2"
else
    echo "== phase 2 (limit ${left}s) =="
    timeout --signal=INT --kill-after=10 "$left" \
        $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads "$WORKLOADS2" --design-requests "$DESIGN_REQUESTS" \
            --configs "$DESIGN_CONFIGS" --cases "$CASES2" --lcs-max-runs 16 --lcs-workers "$LCS_WORKERS" \
            --repeats 1 --budget 5 --no-scaling --no-shards --json "$OUT/bench_design.json" 2>&1 | tee "$OUT/phase2.log"
    echo "phase 2 exit ${PIPESTATUS[0]} after ${SECONDS}s"
fi

# ---- summary: the GPU against libCacheSim on all of this host's cores (libcachesim_parallel_s)
$PY - "$OUT/bench_4096.json" "$OUT/bench_design.json" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, sys
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"{path}: not readable ({e})")
        continue
    print(f"{path}: libCacheSim workers {report['settings'].get('lcs_workers')}, "
          f"pool start {report['settings'].get('libcachesim_pool_start_s')} s (untimed)")
    for c in report["cases"]:
        par = c.get("libcachesim_parallel_s")
        if c.get("cost_vs_random") is not None:
            tail = f"cost_vs_random {c['cost_vs_random']} (random and cache_aware both queue=True)"
        elif c["configs"] > 1 and par is None:
            tail = "NO libcachesim_parallel_s: " + str(c.get("libcachesim_parallel_note") or "libCacheSim missing")
        elif par is None:
            tail = (f"one configuration: libCacheSim on one core {c.get('libcachesim_s')} s, ratio {c.get('ratio')} "
                    f"[{c.get('ratio_basis')}]")
        else:
            tail = (f"libcachesim_parallel_s {par} on {c.get('libcachesim_workers')} workers, ratio {c.get('ratio')} "
                    f"[{c.get('ratio_basis')}], one core {c.get('libcachesim_s')} s, ratio_sequential {c.get('ratio_sequential')}")
        print(f"  {c['workload']:<10} {c['name']:<28} {c['configs']:>5} cfgs  project {c['project_s']} s  {tail}")
EOF

# ---- one JSON: every phase's results, the main jobs' exit, wall time and peak memory, the machine
$PY - "$OUT" "${DRY_RUN:-0}" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as e:
        return {"missing": f"{name}: {e}"}


run = {"env": (out / "env.txt").read_text() if (out / "env.txt").exists() else None, "dry_run": sys.argv[2] == "1",
       "vllm": load("vllm.json"), "bench_4096": load("bench_4096.json"), "bench_design": load("bench_design.json"),
       "main_jobs": {}}
for sched in ("fcfs", "vllm"):
    job = load(f"main_{sched}.json")
    p = out / f"main_{sched}.log"
    log = p.read_text(errors="replace") if p.exists() else ""
    for key, pat in (("wall", r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)"),
                     ("max_rss_kb", r"Maximum resident set size \(kbytes\): (\d+)"),
                     ("user_s", r"User time \(seconds\): (\S+)"), ("system_s", r"System time \(seconds\): (\S+)")):
        m = re.search(pat, log)
        job[key] = m.group(1) if m else None
    run["main_jobs"][sched] = job
(out / "gpu_run.json").write_text(json.dumps(run, indent=1))
for r in run["vllm"].get("rows", []):
    print("vllm", {k: r.get(k) for k in ("name", "backend", "calls", "first_call_s", "wall_s", "requests_per_s",
                                          "engine_steps_per_s", "events_per_s", "events_per_config_mean",
                                          "events_per_config_max")})
for sched, job in run["main_jobs"].items():
    print("main job", sched, job)
print("wrote", out / "gpu_run.json")
EOF
ls -la "$OUT"

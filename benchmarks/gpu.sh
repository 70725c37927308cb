#!/usr/bin/env bash
# One prepared GPU benchmark run (about 8 minutes at most), for a bare device machine with no network.
#
#   bash benchmarks/gpu.sh            # from the repository root; results go to $OUT (default: bench-out/)
#
# What it runs (python -m cacheresearch.bench, see that module's docstring for what each case times):
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
# the shared Mooncake trace does not travel to a device machine: carry a copy in .traces/ (ignored)
if [ -z "${CACHERESEARCH_TRACE:-}" ] && [ -f .traces/mooncake_synthetic_trace.jsonl ]; then
    export CACHERESEARCH_TRACE=.traces/mooncake_synthetic_trace.jsonl
fi
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
TOTAL_S=${TOTAL_S:-430}          # the whole script, seconds
PHASE1_S=${PHASE1_S:-220}        # phase 1 limit, seconds
DESIGN_REQUESTS=${DESIGN_REQUESTS:-5000}
DESIGN_CONFIGS=${DESIGN_CONFIGS:-1000}
SWEEP_CONFIGS=${SWEEP_CONFIGS:-4096}
CASES1=${CASES1:-single,sweep,cache_aware,mrc}
CASES2=${CASES2:-single,sweep,mrc}
LCS_WORKERS=${LCS_WORKERS:-$(nproc 2>/dev/null || echo 1)}   # libCacheSim's parallel figure: every core

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

# ---- phase 1: the 4,096-configuration sweep on seed_fleet and mooncake
echo "== phase 1 (limit ${PHASE1_S}s) =="
timeout --signal=INT --kill-after=10 "$PHASE1_S" \
    $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads seed_fleet,mooncake --configs "$SWEEP_CONFIGS" \
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
        $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads design --design-requests "$DESIGN_REQUESTS" \
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
ls -la "$OUT"

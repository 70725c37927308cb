#!/usr/bin/env bash
# One prepared GPU benchmark run (about 8 minutes at most), for a bare device machine with no network.
#
#   bash benchmarks/gpu.sh            # from the repository root; results go to $OUT (default: bench-out/)
#
# What it runs (python -m cacheresearch.bench, see that module's docstring):
#   1. seed_fleet + mooncake with the sweep at 4,096 configurations (--configs 4096: 1,024 capacities x
#      2 replica counts x 2 seeds, one vmapped simulate_grid call), libCacheSim timed on 64 of the
#      4,096 runs and scaled (its runs are independent and take the same time each)      -> bench_4096.json
#   2. the design scenario (200 tenants x 10,000-token prefixes, 8 replicas) at 1,000 configurations,
#      DESIGN_REQUESTS requests (default 5,000 so the phase fits its time; 50000 is the full
#      scenario, whose engine scan is 1M steps per call), libCacheSim timed on 16 runs   -> bench_design.json
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

# libCacheSim's extension links libglib-2.0 and libpcre2-8, which the device image lacks: carry them in
# .libs/ (ignored; unpacked from Debian's libglib2.0-0 and libpcre2-8-0 with apt-get download + dpkg -x)
if [ -d .libs ]; then export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
CHUNK1=${CHUNK1:-128}            # engine chunk width, phase 1 (seed_fleet: 128 blocks per request)
CHUNK2=${CHUNK2:-256}            # engine chunk width, phase 2 (design: 637 blocks per request)
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
CACHERESEARCH_CHUNK_BLOCKS=$CHUNK1 timeout --signal=INT --kill-after=10 "$PHASE1_S" \
    $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads seed_fleet,mooncake --configs "$SWEEP_CONFIGS" --lcs-max-runs 64 \
        --repeats 2 --budget 10 --no-scaling --no-shards --json "$OUT/bench_4096.json" 2>&1 | tee "$OUT/phase1.log"
echo "phase 1 exit ${PIPESTATUS[0]} after ${SECONDS}s"

# ---- phase 2: the design scenario at 1,000 configurations, in the time left
left=$((TOTAL_S - SECONDS))
if [ "$left" -lt 60 ]; then
    echo "only ${left}s left: skipping phase 2"
    exit 0
fi
echo "== phase 2 (limit ${left}s) =="
CACHERESEARCH_CHUNK_BLOCKS=$CHUNK2 timeout --signal=INT --kill-after=10 "$left" \
    $PY -m cacheresearch.bench --curve-backend "$CURVE_BACKEND" --workloads design --design-requests "$DESIGN_REQUESTS" --configs "$DESIGN_CONFIGS" \
        --lcs-max-runs 16 --repeats 1 --budget 5 --no-scaling --no-shards --json "$OUT/bench_design.json" 2>&1 | tee "$OUT/phase2.log"
echo "phase 2 exit ${PIPESTATUS[0]} after ${SECONDS}s"
ls -la "$OUT"

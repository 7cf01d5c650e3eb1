#!/usr/bin/env bash
# The user's view in one device run on an NVIDIA H200 (about 4-5 minutes):
#   1. build the default CUDA library (sm_90a) and the CPU one, once, into build/ (where the public
#      call flash_kernel.attention and `run` both find them)
#   2. the GPU tests of the public call where users put it: inside a CUDA graph capture, on a
#      non-default stream, on cuda:1 (skipped on a one-GPU host), plus the binding's GPU tests
#   3. `sovereign-audit bench --preset dit`: every diffusion-transformer shape, ours through the
#      public call against SDPA-flash and SDPA-cuDNN, the path each shape ran, refusals as rows
#   (KERNEL_TESTS=1: tests/test_kernel_gpu.py too; SANITIZE=1: memcheck and racecheck after the tests)
#   3b. bench/host_overhead.py: the public call's host cost beside SDPA's
#   3c. MMA_SYNC=1: the sm_90 library (the mma.sync path users of cc 8.x/9.0 without sm_90a get) built
#       too and timed against SDPA-flash and SDPA-cuDNN at every head-dim shape
#   4. with time left and diffusers and cryptography carried as wheels (.whl/): `sovereign-audit run --device cuda`
#      with the default library (and a carried gfx1030 build audited beside it), the research
#      object tarred to $OUT/research-object.tgz
# Results under $OUT; the short tables print last.
#   OUT=/tmp/uv bash bench/device_user_view.sh      # BUDGET_S (default 285) bounds the whole run
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/user_view_out}
BUDGET_S=${BUDGET_S:-285}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. bench/device_common.sh

. bench/device_wheels.sh
use_carried_wheels "$OUT/pip.log"
record_env "$OUT/env.txt" python3 -c 'import diffusers; print("diffusers", diffusers.__version__)'

# 1. One build of the default libraries.
#    (PREBUILT=1: use the libraries already in build/, e.g. built with the same nvcc on another machine
#    and carried; the GPU tests still check that they were built from this tree's sources)
TARGETS=(--target sm_90a --target cpu)
[ -n "${MMA_SYNC:-}" ] && TARGETS+=(--target sm_90)
if [ -n "${PREBUILT:-}" ]; then
    note "build: prebuilt $(ls build | tr '\n' ' ')"
else
    python3 -m audit build "${TARGETS[@]}" --out build >"$OUT/build.log" 2>&1
    note "build rc=$? ($(el) s)"
fi

# 2. The public call in a graph capture, on a side stream, on cuda:1; the binding's GPU tests.
KT=()
[ -n "${KERNEL_TESTS:-}" ] && KT=(tests/test_kernel_gpu.py -n 8)   # the kernels' own GPU tests too
timeout -k 5 ${TEST_TIMEOUT:-90} python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_cuda_placement.py \
    tests/test_binding.py "${KT[@]}" >"$OUT/pytest.log" 2>&1
note "pytest gpu rc=$?: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/pytest.log" | head -8 | tee -a "$SUMMARY"

# 2b. With SANITIZE=1: compute-sanitizer memcheck and racecheck (SANITIZE_STAGES) on the default library
#     (small shapes, every head-dim bucket, exact-size cudaMalloc buffers; racecheck cannot see
#     TMA/wgmma traffic).
#     SANITIZE_LIBS (default sm_90a) names the libraries; racecheck runs at N <= 77 on the head dims of
#     RACECHECK_DIMS (default: every bucket of both tensor-core paths).
if [ -n "${SANITIZE:-}" ] && [ "$(left)" -gt 150 ]; then
    SL=${SANITIZE_LIBS:-sm_90a}
    FK_BUILD=build FK_LIBS="$SL" FK_STAGES=memcheck FK_MEMCHECK_LIBS="$SL" \
        FK_MEMCHECK_TIMEOUT=100 OUT="$OUT/memcheck" bash bench/device_kernel.sh >"$OUT/memcheck.log" 2>&1
    FK_BUILD=build FK_LIBS="$SL" FK_STAGES=racecheck FK_RACECHECK_LIBS="$SL" FK_RACECHECK_TIMEOUT=100 \
        FK_DRIVER_DIMS=${RACECHECK_DIMS:-32,64,72,96,128,160,192,256} FK_DRIVER_MAX_N=77 \
        OUT="$OUT/racecheck" bash bench/device_kernel.sh >"$OUT/racecheck.log" 2>&1
    grep -hE "^(memcheck|racecheck)" "$OUT/memcheck/summary.txt" "$OUT/racecheck/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

# 3. The diffusion-transformer table through the public call.
timeout -k 5 $(( $(left) > 130 ? 110 : $(left) - 20 )) python3 -m audit bench --device cuda --preset dit \
    --backend primary --backend sdpa-flash --backend sdpa-cudnn --repeats 10 --warmup 2 --no-progress \
    --json "$OUT/bench-dit.json" >"$OUT/bench-dit.txt" 2>&1
note "bench --preset dit rc=$? ($(el) s)"

# 3a. fp16 where the long-sequence goals are stated (Wan2.1-1.3B self-attention, head dim 256).
timeout -k 5 60 python3 -m audit bench --device cuda --dtype fp16 --shape 1,12,32760,128 --shape 1,12,16384,256 \
    --backend primary --backend sdpa-flash --backend sdpa-cudnn --repeats 10 --warmup 2 --no-progress \
    --json "$OUT/bench-fp16.json" >"$OUT/bench-fp16.txt" 2>&1
note "bench fp16 rc=$? ($(el) s)"

# 3b. The host cost of one call: the public call's wall time per call against the same call
#     replayed from a CUDA graph (its kernel's own time), beside SDPA's, plus where the host time goes.
timeout -k 5 90 python3 bench/host_overhead.py --build build >"$OUT/host.txt" 2>&1
note "host_overhead rc=$? ($(el) s)"

# 3c. The mma.sync path (sm_90 library) at every head dim, against SDPA-flash (what it must beat) and SDPA-cuDNN;
#     MMA_REPEATS timed calls each (30: the margins there are a few per cent, 10 leave intervals too wide to tell).
if [ -n "${MMA_SYNC:-}" ]; then
    timeout -k 5 120 python3 -m audit bench --device cuda --lib build/sm_90/libflash_kernel.so \
        --shape 1,16,16384,32 --shape 1,16,16384,64 --shape 1,16,17550,72 --shape 1,24,16384,80 --shape 1,24,16384,96 \
        --shape 1,24,16384,128 --shape 1,16,16384,160 --shape 1,16,16384,192 --shape 1,12,16384,256 \
        --backend primary --backend sdpa-flash --backend sdpa-cudnn --repeats "${MMA_REPEATS:-30}" --warmup 2 --no-progress \
        --json "$OUT/bench-mma.json" >"$OUT/bench-mma.txt" 2>&1
    note "bench mma.sync rc=$? ($(el) s)"
fi

# 4. The research object with the default library, if it can finish in the time left. An RDNA2
#    (gfx1030) build carried in .device/gfx1030/ (this machine has no hipcc) is audited beside it.
# run needs diffusers (the pipeline) and cryptography (the signatures); the device image has
# neither: carry both as wheels in .whl/ (cryptography's abi3 manylinux wheel and cffi's).
missing=$(python3 -c 'import importlib.util as u; print(" ".join(m for m in ("diffusers", "cryptography") if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
    note "run: not started: missing $missing (carry the wheels in .whl/)"
elif [ "$(left)" -gt 120 ]; then
    rm -rf /tmp/ro
    ARTIFACTS=()
    if [ -f .device/gfx1030/libflash_kernel.so ]; then
        mkdir -p build/gfx1030 && cp .device/gfx1030/libflash_kernel.so build/gfx1030/
        ARTIFACTS=(--artifact build/gfx1030/libflash_kernel.so)
    fi
    timeout -k 5 $(( $(left) - 10 )) python3 -m audit run --out /tmp/ro --device cuda --target sm_90a \
        --target cpu "${ARTIFACTS[@]}" --build-dir build --repeats 10 --pipeline-steps 2 >"$OUT/run.log" 2>&1
    rc=$?
    note "run rc=$rc ($(el) s)"
    python3 -m audit verify /tmp/ro >"$OUT/verify.log" 2>&1
    note "verify rc=$?: $(tail -1 "$OUT/verify.log")"
    [ -d /tmp/ro ] && tar czf "$OUT/research-object.tgz" -C /tmp ro
else
    note "run: not started: $(left) s left"
fi

echo "==== summary"
cat "$SUMMARY"
echo "==== bench fp16"
sed -n '/^ours = /,$p' "$OUT/bench-fp16.txt"
echo "==== host cost of one call"
sed -n '/^steps of/,$p' "$OUT/host.txt"
if [ -f "$OUT/bench-mma.txt" ]; then
    echo "==== mma.sync (sm_90 library)"
    sed -n '/^ours = /,$p' "$OUT/bench-mma.txt"
fi
echo "==== bench --preset dit"
sed -n '/^ours = /,$p' "$OUT/bench-dit.txt"
if [ -f /tmp/ro/evidence/pipeline.json ]; then
    echo "==== pipeline (research object)"
    python3 - <<'PY'
import json
from audit.evidence.pipeline_command import render_table
d = json.load(open("/tmp/ro/evidence/pipeline.json"))
print(render_table(type("R", (), {"to_dict": lambda self: d})()))
PY
fi

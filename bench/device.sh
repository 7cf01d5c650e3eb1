#!/usr/bin/env bash
# Every measurement made on a GPU machine, as one named run each, from one entry point:
#
#   bash bench/device.sh --list                  the runs, one line each
#   bash bench/device.sh RUN [VAR=VALUE ...]     one run, from the repository root (found from here)
#   bash bench/device.sh --dry-run RUN [VAR=VALUE ...]
#                                                what RUN would do: its settings and its commands;
#                                                nothing is built, run or written
#
# A run's settings are environment variables (OUT, BUDGET_S, the knobs its comment names), given
# before the command or as VAR=VALUE after the run's name. Exit status: the run's own; 2 for a
# usage error (an unknown run, an argument that is not VAR=VALUE).
#
# Adding a run is a change in one place, the runs section below (keep the marker lines as they are:
# --list, --dry-run and tests/test_device_runs.py read them):
#     # =====...
#     # NAME
#     # what it does; its knobs (environment variables) and their defaults
#     register NAME 'one line for --list'
#     run_NAME() {          # NAME with "-" written "_"; runs in its own subshell, from the
#     ...                   # repository root, under `set -u`; calls device_common once OUT (and
#     }  # end of run_NAME  # BUDGET_S) are set
# A run that needs another starts it as `bash bench/device.sh OTHER` (its own process and settings).

# ---------------------------------------------------------------------------------------------------
# The set-up the runs share.
#   device_common   called once OUT (and BUDGET_S, where the run has a budget) is set: starts the
#                   clock and empties $SUMMARY ($OUT/summary.txt unless set)
#   el              seconds since device_common
#   left            seconds of BUDGET_S left
#   note LINE       the line on the screen and in $SUMMARY
#   record_env FILE [CMD...]   GPU, driver, max SM clock, nvcc, torch/CUDA/cuDNN/GPU count, commit
#                   (none where the folder is not a checkout's top) (and what CMD prints) into
#                   FILE, and one "env:" line through note
#   build_variants SECONDS SPEC...   one nvcc per "LABEL:-DFLAGS ..." (LABEL may end in @head,dims),
#                   in the background, sm_90a as `sovereign-audit build` makes it; appends
#                   LABEL=PATH to LIBS and the nvcc's pid to PIDS (the library under $VB/NAME,
#                   logs under $LOG)
#   install_wheels DIR SITE LOG   every DIR/*.whl into SITE (pip, no index, no dependencies)
#   use_carried_wheels LOG   the device machine has no network: Python packages it lacks
#                   (diffusers, cryptography, ...) travel as wheels in .whl/ and are installed
#                   into /tmp/site, put ahead of the checkout on PYTHONPATH; without them, the
#                   checkout alone (pip's output into LOG)
#   begin_run DIR SECONDS [CMD...]   OUT (default DIR) and BUDGET_S (default SECONDS), then
#                   device_common, use_carried_wheels and record_env $OUT/env.txt [CMD...]
#   build_unless_prebuilt TARGET...   `sovereign-audit build` of the targets into build/,
#                   skipped under PREBUILT=1 (the carried build/)
device_common() {
    START=$(date +%s)
    SUMMARY=${SUMMARY:-$OUT/summary.txt}
    : > "$SUMMARY"
}
el() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(el) )); }
note() { echo "$*" | tee -a "$SUMMARY"; }

record_env() {
    local file=$1; shift
    { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      nvcc --version | tail -1
      python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpus", torch.cuda.device_count())'
      # the commit only where this is a checkout's top: an archive copied inside another checkout
      # (the device runs' .device/<name>/repo) would report the outer one's
      if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then git log -1 --format='commit %H'
      else echo "commit: none (not a git checkout's top)"; fi
      [ $# -gt 0 ] && "$@"; } > "$file" 2>&1
    note "env: $(tr '\n' ';' < "$file")"
}

VARIANT_NVCC=(nvcc -x cu -O3 -std=c++17 -shared -Xcompiler -fPIC --expt-relaxed-constexpr --threads 2
              -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 -DFK_WGMMA
              '-DFK_TARGET="sm_90a"' -Xptxas -v)
build_variants() {
    local seconds=$1 spec label flags name; shift
    for spec in "$@"; do
        [ -z "$spec" ] && continue
        label=${spec%%:*}; flags=${spec#*:}; name=${label%%@*}
        mkdir -p "$VB/$name"
        # shellcheck disable=SC2086
        timeout -k 5 "$seconds" "${VARIANT_NVCC[@]}" $flags -I flash_kernel/include -I flash_kernel/src \
            flash_kernel/src/fk_gpu.hip -o "$VB/$name/libflash_kernel.so" > "$LOG/build-$name.log" 2>&1 &
        PIDS+=($!)
        LIBS+=("$label=$VB/$name/libflash_kernel.so")
    done
}

# After build_variants: waits for each build, then runs two smoke calls of the library at precision
# $1 (bench/one_call.py --lib, head dims 64 and 128, 60 s each, its output checked against SDPA);
# a variant that did not build, fails or hangs is left out with its last line noted. Fills
# VARIANT_ARGS with --lib NAME=PATH for the rest.
wait_variants() {
    local i lib name
    VARIANT_ARGS=()
    for i in "${!PIDS[@]}"; do
        lib=${LIBS[$i]#*=} name=${LIBS[$i]%%=*}
        if ! wait "${PIDS[$i]}"; then note "variant $name did not build: $(tail -1 "$LOG/build-${name%%@*}.log")"; continue; fi
        if timeout -k 5 60 python3 bench/one_call.py 2,3,1000,1000,64 --precision "$1" --lib "$lib" >"$OUT/smoke-${name%%@*}.txt" 2>&1 &&
            timeout -k 5 60 python3 bench/one_call.py 2,3,1000,1000,128 --precision "$1" --lib "$lib" >>"$OUT/smoke-${name%%@*}.txt" 2>&1; then
            VARIANT_ARGS+=(--lib "${LIBS[$i]}")
        else note "variant $name failed its smoke calls: $(tail -1 "$OUT/smoke-${name%%@*}.txt")"; fi
    done
}

install_wheels() {  # DIR SITE LOG: every DIR/*.whl into SITE, from the files alone (no index, no deps)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" \
        "$1"/*.whl >"$3" 2>&1
}
use_carried_wheels() {
    if ls .whl/*.whl >/dev/null 2>&1; then
        install_wheels .whl /tmp/site "$1" && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD
    else
        export PYTHONPATH=$PWD
    fi
}

begin_run() {
    OUT=${OUT:-$1}
    BUDGET_S=${BUDGET_S:-$2}
    shift 2
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    device_common
    use_carried_wheels "$OUT/pip.log"
    record_env "$OUT/env.txt" "$@"
}
build_unless_prebuilt() {
    if [ -z "${PREBUILT:-}" ]; then
        python3 -m audit build $(printf -- '--target %s ' "$@") --out build >"$OUT/build.log" 2>&1
        note "build rc=$? ($(el) s)"
    fi
}

RUN_NAMES=()
declare -A RUN_DESC=()
register() { RUN_NAMES+=("$1"); RUN_DESC[$1]=$2; }

# ---------------------------------------------------------------------------------------------------
# The runs, the one most often used first.
# ==================================================================================================
# user-view
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
#   OUT=/tmp/uv bash bench/device.sh user-view      # BUDGET_S (default 285) bounds the whole run
register user-view 'the default libraries as users call them: GPU tests, `bench --preset dit`, fp16, host cost, mma.sync with MMA_SYNC=1, sanitizers with SANITIZE=1, then the research object'
run_user_view() {
begin_run /tmp/user_view_out 285 python3 -c 'import diffusers; print("diffusers", diffusers.__version__)'

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
        FK_MEMCHECK_TIMEOUT=100 OUT="$OUT/memcheck" bash bench/device.sh kernel >"$OUT/memcheck.log" 2>&1
    FK_BUILD=build FK_LIBS="$SL" FK_STAGES=racecheck FK_RACECHECK_LIBS="$SL" FK_RACECHECK_TIMEOUT=100 \
        FK_DRIVER_DIMS=${RACECHECK_DIMS:-32,64,72,96,128,160,192,256} FK_DRIVER_MAX_N=77 \
        OUT="$OUT/racecheck" bash bench/device.sh kernel >"$OUT/racecheck.log" 2>&1
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
}  # end of run_user_view

# ==================================================================================================
# research-object
# The signed research object of the default CUDA library, and the sanitizers on it, in one device
# run on an NVIDIA GPU (about 5-6 minutes on an H200):
#   1. `sovereign-audit build` of the default libraries (sm_90a, cpu) into build/
#   2. compute-sanitizer memcheck and racecheck on the sm_90a library (the kernel run's driver:
#      every head-dim bucket, small shapes, exact-size cudaMalloc buffers)
#   3. `sovereign-audit run --device cuda` (build, audit, parity, bench, the Wan2.1 DiT pipeline with
#      SDPA-cuDNN as the reference, report, signatures), an RDNA2 (gfx1030) build carried in
#      .device/gfx1030/ audited beside it; then `sovereign-audit verify` on the bundle; once for
#      each of PRECISIONS (default "exact"; "exact fp8" adds the FP8 research object, every claim
#      in it labelled FP8, written to a bundle of its own)
# Needs diffusers and cryptography: where the machine lacks them, carry their wheels in .whl/.
# PREBUILT=1 uses build/ as carried instead of building; SANITIZE=0 skips step 2 (for a library
# the same device session already sanitized). Results under $OUT (the bundles as
# research-object.tgz and research-object-fp8.tgz, the logs as logs.tgz); a summary prints last.
#   OUT=/tmp/ro_out PRECISIONS="exact fp8" bash bench/device.sh research-object
register research-object 'the default libraries built, memcheck and racecheck on sm_90a, `sovereign-audit run --device cuda` and `verify`; the bundle as an archive'
run_research_object() {
OUT=${OUT:-/tmp/research_object_out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1
SUMMARY=$LOGS/summary.txt
device_common
use_carried_wheels "$LOGS/pip.log"
if [ -z "${PREBUILT:-}" ]; then
    python3 -m audit build --target sm_90a --target cpu --out build >"$LOGS/build.log" 2>&1
    note "build rc=$? ($(el) s)"
fi

if [ "${SANITIZE:-1}" != 0 ]; then
    FK_BUILD=build FK_LIBS=sm_90a FK_STAGES="memcheck racecheck" FK_MEMCHECK_LIBS=sm_90a FK_RACECHECK_LIBS=sm_90a \
        FK_MEMCHECK_TIMEOUT=${FK_MEMCHECK_TIMEOUT:-100} FK_RACECHECK_TIMEOUT=${FK_RACECHECK_TIMEOUT:-100} \
        OUT="$LOGS/sanitize" bash bench/device.sh kernel >"$LOGS/sanitize.log" 2>&1
    grep -E "^(memcheck|racecheck)" "$LOGS/sanitize/summary.txt" | tee -a "$LOGS/summary.txt"
    note "sanitizers done ($(el) s)"
else
    note "sanitizers skipped (SANITIZE=0: they ran on this library in another run)"
fi

ARTIFACTS=()
if [ -f .device/gfx1030/libflash_kernel.so ]; then
    mkdir -p build/gfx1030 && cp .device/gfx1030/libflash_kernel.so build/gfx1030/
    ARTIFACTS=(--artifact build/gfx1030/libflash_kernel.so)
fi
for precision in ${PRECISIONS:-exact}; do
    ro=ro suffix=
    [ "$precision" = exact ] || { ro=ro-$precision; suffix=-$precision; }
    rm -rf "/tmp/$ro"
    timeout -k 5 ${RUN_TIMEOUT:-330} python3 -m audit run --out "/tmp/$ro" --device cuda --target sm_90a --target cpu \
        "${ARTIFACTS[@]}" --build-dir build --repeats 10 --pipeline-steps 2 --precision "$precision" \
        >"$LOGS/run$suffix.log" 2>&1
    note "run ($precision) rc=$? ($(el) s)"
    python3 -m audit verify "/tmp/$ro" >"$LOGS/verify$suffix.log" 2>&1
    note "verify ($precision) rc=$?: $(tail -1 "$LOGS/verify$suffix.log")"
    [ -d "/tmp/$ro" ] && tar czf "$OUT/research-object$suffix.tgz" -C /tmp "$ro"
    echo "==== run ($precision)"; tail -25 "$LOGS/run$suffix.log"
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
echo "==== summary"; cat "$LOGS/summary.txt"
}  # end of run_research_object

# ==================================================================================================
# evidence
# Parity and op timing of our CUDA library on the H200, in one run of < 8 minutes.
#
#   OUT=/some/dir bash bench/device.sh evidence      (run from the repository root)
#
# Needs build/sm_90/libflash_kernel.so and build/sm_90-generic/libflash_kernel.so (built on the
# CPU machine and carried), python3 with torch, click, rich and numpy (the device image has them).
# Writes $OUT/environment.json, $OUT/parity-*.json, $OUT/bench-*.json and a log per step, and prints
# a short table last. A step that fails or hits its time limit is reported; the others still run.
# Exit status: 0 when every step exited 0, else 1 (the table says which).
#
# A CPU rehearsal of the whole flow (tiny shapes, our CPU library):
#   SMOKE=1 DEVICE=cpu TARGET=cpu GENERIC_TARGET=cpu GENERIC_LABEL=cpu-again bash bench/device.sh evidence
register evidence 'parity and op timing through sovereign-audit (`parity`, `bench`) on the sm_90 and sm_90-generic libraries'
run_evidence() {
OUT=${OUT:-out/device-evidence}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
BUDGET_S=${BUDGET_S:-450}  # the whole script: under 8 minutes, so it fits a 10-minute device run
START=$(date +%s)
FAILED=()

step() {  # step NAME LIMIT_S CMD...: run CMD with a timeout that also respects the whole budget
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START) - 20))
  if ((left < 15)); then
    echo "== $name: SKIPPED (time budget spent)" | tee -a "$OUT/steps.txt"
    FAILED+=("$name(skipped)")
    return
  fi
  ((limit > left)) && limit=$left
  local t0 rc
  t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 40 "$OUT/$name.log"
  echo "== $name: rc=$rc in $(($(date +%s) - t0))s" | tee -a "$OUT/steps.txt"
  ((rc == 0)) || FAILED+=("$name(rc=$rc)")
}

: >"$OUT/steps.txt"
ls -l build/sm_90/libflash_kernel.so build/sm_90-generic/libflash_kernel.so 2>&1 | tee "$OUT/libraries.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.used \
  --format=csv 2>&1 | tee "$OUT/nvidia-smi-before.txt"

step environment 60 python3 -c "import json; from audit.evidence.environment import capture; \
json.dump(capture(), open('$OUT/environment.json', 'w'), indent=2)"

DEVICE=${DEVICE:-cuda}
TARGET=${TARGET:-sm_90}
GENERIC_TARGET=${GENERIC_TARGET:-sm_90-generic}
GLABEL=${GENERIC_LABEL:-$GENERIC_TARGET}  # names its files
VIDEO=(--preset wan2.1-1.3b-480p --preset cogvideox-5b)  # head dim 128 and 64, bf16
FP16=(--preset wan2.1-1.3b-480p --shape 2,16,8192,64)
FP16_BENCH=(--preset wan2.1-1.3b-480p)
if [[ ${SMOKE:-0} == 1 ]]; then
  VIDEO=(--preset tiny-128 --preset tiny-64); FP16=(--preset tiny-cross); FP16_BENCH=(--preset tiny-64)
fi
# Most important first (the budget may cut the tail): parity of the flash path, then its timing.
step parity-$TARGET-bf16 90 python3 -m audit parity --target "$TARGET" --device "$DEVICE" --dtype bf16 \
  "${VIDEO[@]}" --json "$OUT/parity-$TARGET-bf16.json"
# Timing: every backend (flash, naive, eager, SDPA flash/cuDNN/efficient) at N=10; a slow
# baseline is capped at 20 s per shape (>= 3 repeats, recorded in the JSON).
step bench-$TARGET-bf16 150 python3 -m audit bench --target "$TARGET" --device "$DEVICE" --dtype bf16 \
  "${VIDEO[@]}" --repeats 10 --warmup 2 --max-backend-seconds 20 --no-progress \
  --json "$OUT/bench-$TARGET-bf16.json"
step parity-$TARGET-fp16 60 python3 -m audit parity --target "$TARGET" --device "$DEVICE" --dtype fp16 \
  "${FP16[@]}" --json "$OUT/parity-$TARGET-fp16.json"
step bench-$TARGET-fp16 75 python3 -m audit bench --target "$TARGET" --device "$DEVICE" --dtype fp16 \
  "${FP16_BENCH[@]}" --repeats 10 --warmup 2 --max-backend-seconds 15 --no-progress \
  --json "$OUT/bench-$TARGET-fp16.json"
# The layout video DiTs hand over: (B,N,H,D) storage, strided (B,H,N,D) views.
step parity-$TARGET-bf16-bnhd 60 python3 -m audit parity --target "$TARGET" --device "$DEVICE" \
  --dtype bf16 --layout bnhd "${FP16_BENCH[@]}" --json "$OUT/parity-$TARGET-bf16-bnhd.json"
step parity-$GLABEL-bf16 90 python3 -m audit parity --target "$GENERIC_TARGET" --device "$DEVICE" \
  --dtype bf16 "${VIDEO[@]}" --json "$OUT/parity-$GLABEL-bf16.json"

# The generic (RDNA2 logic) path on NVIDIA: a proxy, never an RDNA2 figure; SDPA flash as the anchor.
step bench-$GLABEL-bf16 90 python3 -m audit bench --target "$GENERIC_TARGET" --device "$DEVICE" \
  --dtype bf16 "${VIDEO[@]}" --repeats 10 --warmup 2 --max-backend-seconds 20 --no-progress \
  --backend primary --backend sdpa-flash --json "$OUT/bench-$GLABEL-bf16.json"

# GPU-only checks of the measuring code itself: a real OOM is skipped, CUDA events, poisoning.
if [[ ${SMOKE:-0} != 1 ]]; then
  step pytest-gpu 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_bench_gpu.py
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv \
  >"$OUT/nvidia-smi-after.txt" 2>&1

# The short table, from the JSON files alone.
python3 - "$OUT" <<'EOF'
import glob, json, os, sys

out = sys.argv[1]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as exc:
        print(f"  {os.path.basename(p)}: unreadable ({type(exc).__name__})")
        return None

print("\n=== parity (rel_l2 and cosine vs float64; cosine vs oracle) ===")
for p in sorted(glob.glob(os.path.join(out, "parity-*.json"))):
    d = load(p)
    if not d:
        continue
    lib = d["selection"].get("library", {})
    print(f"{os.path.basename(p)}: {lib.get('target')}/{lib.get('flash_path')} {d['dtype']} "
          f"{d.get('layout')} {'PASSED' if d['passed'] else 'FAILED'}"
          f"{'' if d.get('complete') else ' (INCOMPLETE: the step was cut short)'}")
    for s in d["shapes"]:
        r, o = s["candidate_vs_reference"] or {}, s["candidate_vs_oracle"] or {}
        c, co = r.get("cosine"), o.get("cosine")
        print(f"  {s['shape']['label']:32s} {s['status']:6s} rel_l2 {r.get('rel_l2') or 0:.2e} "
              f"1-cos {(1 - c) if c is not None else float('nan'):.1e} "
              f"vs-oracle 1-cos {(1 - co) if co is not None else float('nan'):.1e} "
              f"NaN {r.get('nan')}")
        for g in s["gates"]:
            if not g["passed"]:
                print(f"      FAILED {g['name']} {g['detail']}")

print("\n=== bench (median ms [IQR], TFLOP/s; speedup of ours with 95% CI) ===")
for p in sorted(glob.glob(os.path.join(out, "bench-*.json"))):
    d = load(p)
    if not d:
        continue
    lib = d["selection"].get("library", {})
    print(f"{os.path.basename(p)}: {lib.get('target')}/{lib.get('flash_path')} {d['dtype']} "
          f"on {d.get('device_name')}{'' if d.get('complete') else ' (INCOMPLETE)'}")
    for s in d["shapes"]:
        print(f"  {s['shape']['label']}")
        for b in s["backends"]:
            t = b.get("timing")
            if t:
                tag = " vendor A/B" if b["vendor"] else ""
                print(f"    {b['name']:15s} {t['median']:9.3f} ms [{t['iqr']:.3f}] "
                      f"{b['tflops'] or 0:7.1f} TF/s  n={t['n']}{tag}")
            else:
                print(f"    {b['name']:15s} skipped: {b['reason'][:110]}")
        for sp in s["speedups"]:
            print(f"    {sp['subject']} vs {sp['baseline']:15s} {sp['ratio']:6.2f}x "
                  f"[{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]")
EOF

echo
cat "$OUT/steps.txt"
echo "total $(($(date +%s) - START))s"
if ((${#FAILED[@]})); then
  echo "steps not clean: ${FAILED[*]}"
  exit 1
fi
}  # end of run_evidence

# ==================================================================================================
# pipeline
# The end-to-end Wan2.1-T2V-1.3B measurement on the H200 (480x832, 81 frames, 32760 tokens):
# naive (our pre-flash path, the reference), flash (our kernel) and sdpa-flash (vendor A/B) in
# every self-attention, a few UniPC + CFG steps each, the VAE decode, parity and calibration.
#
# Run from the repository root on the device machine, with the diffusers wheel in .whl/ and our
# sm_90 library in build/sm_90 (carry: .whl, build):
#   bash bench/device.sh pipeline            # writes $OUT/pipeline.json and $OUT/pipeline.log
# Knobs (environment): STEPS (default 8), ATTENTION (default naive,flash,sdpa-flash),
# PRESET (default wan-480p), DEVICE (default cuda; PRESET=tiny DEVICE=cpu is a dry run on a CPU),
# DECODE=0 to skip the VAE decode, TILING=0 to decode untiled, VAE_DTYPE (default bf16),
# EXTRA (more `pipeline` options).
#
# Time budget (H200, bf16; per step = 2 CFG passes x 30 layers = 60 self-attention calls at
# N=32760): naive ~130+ ms/call -> ~8-9 s/step, flash ~20 ms/call -> ~1.7 s/step, the rest of the
# DiT ~0.5 s/step. Each core also runs one warm-up and one instrumented step, the calibration
# re-runs flash, and each core decodes once (~10-40 s, tiled). STEPS=8: ~3.5-5 minutes in all;
# if the naive path is much slower than 130 ms/call, lower STEPS or set DECODE=0.
register pipeline 'the end-to-end Wan2.1-T2V-1.3B pipeline (`sovereign-audit pipeline`) with the attention cores of ATTENTION'
run_pipeline() {
set -euo pipefail

OUT=${OUT:-/tmp/pipeline-out}
mkdir -p "$OUT"
STEPS=${STEPS:-8}
ATTENTION=${ATTENTION:-naive,flash,sdpa-flash}
VAE_DTYPE=${VAE_DTYPE:-bf16}
PRESET=${PRESET:-wan-480p}
DEVICE=${DEVICE:-cuda}
export DEVICE
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The checkout itself (audit, flash_kernel) is not installed there.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

python3 - <<'EOF'
import importlib, os, sys
missing = []
for m in ("torch", "click", "numpy", "diffusers", "flash_kernel", "audit.evidence.pipeline"):
    try:
        importlib.import_module(m)
    except Exception as exc:
        missing.append(f"{m}: {type(exc).__name__}: {exc}")
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
if missing:
    sys.exit("preflight failed: " + "; ".join(missing))
import diffusers, flash_kernel
print("diffusers", diffusers.__version__)
lib = flash_kernel.library_for(os.environ["DEVICE"])
print("kernel library", lib.path, lib.target, lib.flash_path, "head dims", list(lib.head_dims))
EOF

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total \
    --format=csv,noheader 2>/dev/null || true

ARGS=(--preset "$PRESET" --steps "$STEPS" --device "$DEVICE" --dtype bf16 --vae-dtype "$VAE_DTYPE"
      --attention "$ATTENTION" --json "$OUT/pipeline.json")
[[ "${DECODE:-1}" == 0 ]] && ARGS+=(--no-decode)
[[ "${TILING:-1}" == 0 ]] && ARGS+=(--no-vae-tiling)
# shellcheck disable=SC2206
[[ -n "${EXTRA:-}" ]] && ARGS+=(${EXTRA})

set +e
python3 -m audit pipeline "${ARGS[@]}" 2>&1 | tee "$OUT/pipeline.log"
rc=${PIPESTATUS[0]}
set -e
echo "pipeline exit status $rc (0 ok, 1 one of our cores failed, 2 usage, 4 internal)"
exit "$rc"
}  # end of run_pipeline

# ==================================================================================================
# all
# The evidence of a release in one device run: GPU tests, parity and op timing
# (the evidence run), then the end-to-end Wan2.1 pipeline (the pipeline run),
# inside one 10-minute command. Carry: build/sm_90, build/sm_90-generic, .whl (diffusers).
#   bash bench/device.sh all        # results: $OUT/results.tgz, $OUT/summary.txt
register all 'GPU tests, then the evidence run, then the pipeline run, in one 10-minute command'
run_all() {
export PYTHONUNBUFFERED=1
WORK=/tmp/device-all
mkdir -p "$WORK/ev" "$WORK/pipe"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD

# 1. The kernel's own GPU correctness tests (float64 reference, poisoned outputs) and the binding's.
timeout -k 5 ${PYTEST_S:-70} python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_kernel_gpu.py tests/test_binding.py >"$WORK/pytest-gpu.log" 2>&1
echo "pytest-gpu rc=$?" >"$WORK/summary.txt"
tail -n 3 "$WORK/pytest-gpu.log" >>"$WORK/summary.txt"

# 2. Parity and op timing (its own time budget cuts the tail, never the head).
BUDGET_S=${EVIDENCE_S:-220} OUT="$WORK/ev" bash bench/device.sh evidence >"$WORK/evidence.log" 2>&1
echo "evidence rc=$?" >>"$WORK/summary.txt"

# 3. End to end: naive (pre-flash) vs flash in every self-attention of Wan2.1-1.3B at 480p.
STEPS=${STEPS:-2} ATTENTION=${ATTENTION:-naive,flash} OUT="$WORK/pipe" \
    timeout -k 10 ${PIPELINE_S:-280} bash bench/device.sh pipeline >"$WORK/pipeline.log" 2>&1
echo "pipeline rc=$?" >>"$WORK/summary.txt"

tar czf "$OUT/results.tgz" -C "$WORK" .
cp "$WORK/summary.txt" "$OUT/summary.txt"
cat "$WORK/summary.txt"
echo "--- evidence table"; sed -n '/=== parity/,$p' "$WORK/evidence.log" | head -60
echo "--- pipeline"; tail -n 25 "$WORK/pipeline.log"
}  # end of run_all

# ==================================================================================================
# kernel
# A kernel run on an NVIDIA GPU in stages (FK_STAGES). It builds the sm_90,
# sm_90-generic and tuning-variant libraries (or uses carried builds under $FK_BUILD), runs the GPU
# tests, runs compute-sanitizer memcheck over the test shapes (exact-size cudaMalloc buffers, so an
# out-of-bounds access cannot hide in a caching allocator's slack), then times every variant side by
# side with PyTorch (bench/kernel_bench.py). Logs go to $OUT; a short table prints last.
#
#   FK_BUILD=build/h3 FK_VARIANTS="w8:-DFK_MMA_WARPS_D128=8 -DFK_MMA_WARPS_D64=8" bash bench/device.sh kernel
#   FK_STAGES="test memcheck racecheck fma bench" (default all), FK_SHAPES="1,12,32760,128 1,30,17776,64"
#   FK_LIBS="sm_90a" FK_STAGES="memcheck racecheck" FK_MEMCHECK_LIBS=sm_90a FK_RACECHECK_LIBS=sm_90a: sanitizers alone
# Libraries: $FK_BUILD/{sm_90,sm_90a,sm_90-generic}/libflash_kernel.so, built here when absent (carry
# builds from `sovereign-audit build` so that the GPU tests can match them to their provenance).
register kernel 'stages (FK_STAGES): GPU tests, memcheck, racecheck, fp32 FMA peak, every library and -D variant timed beside PyTorch'
run_kernel() {
OUT=${OUT:-/tmp/fk_device_out}
FK_BUILD=${FK_BUILD:-build/h3}
FK_STAGES=${FK_STAGES:-"test memcheck racecheck fma bench"}
FK_SHAPES=${FK_SHAPES:-"1,12,32760,128 1,30,17776,64"}
FK_DTYPE=${FK_DTYPE:-bf16}
FK_SLOW_PATHS=${FK_SLOW_PATHS-1}   # set empty to skip timing the generic and naive paths
mkdir -p "$OUT" "$FK_BUILD"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

NVCC_FLAGS=(-x cu -O3 -std=c++17 -shared -Xcompiler -fPIC --expt-relaxed-constexpr
            -gencode arch=compute_90,code=sm_90 -I flash_kernel/include -I flash_kernel/src)
SM90A=(-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 -DFK_WGMMA)
build() {  # build NAME EXTRA_FLAGS... (flags after the sm_90 gencode; an sm_90a build adds its own cubins)
    local name=$1; shift
    local so=$FK_BUILD/$name/libflash_kernel.so
    [ -f "$so" ] && return 0
    mkdir -p "$FK_BUILD/$name"
    local flags=("${NVCC_FLAGS[@]}")
    if [[ " $* " == *" -DFK_WGMMA "* ]]; then flags=("${flags[@]/arch=compute_90,code=sm_90/arch=compute_90a,code=sm_90a}"); fi
    nvcc "${flags[@]}" "$@" flash_kernel/src/fk_gpu.hip -o "$so" >"$FK_BUILD/build-$name.log" 2>&1 \
        || { note "BUILD FAILED $name: $(tail -3 "$FK_BUILD/build-$name.log" | tr "\n" " ")"; return 1; }
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  git log -1 --format='commit %H %s' 2>/dev/null || true; } > "$OUT/env.txt" 2>&1
FK_LIBS=${FK_LIBS:-"sm_90 sm_90-generic sm_90a"}   # the libraries to build (or find) under $FK_BUILD
[[ " $FK_LIBS " == *" sm_90 "* ]] && build sm_90
[[ " $FK_LIBS " == *" sm_90-generic "* ]] && build sm_90-generic -DFK_FORCE_GENERIC
[[ " $FK_LIBS " == *" sm_90a "* ]] && build sm_90a -gencode arch=compute_80,code=sm_80 -DFK_WGMMA
# What the mma kernel compiled to (HMMA = mma.sync, LDSM = ldmatrix, LDGSTS = cp.async; LDL/STL = spills).
cuobjdump --dump-sass "$FK_BUILD/sm_90/libflash_kernel.so" 2>/dev/null | awk '/Function : /{f=$3} {print f, $0}' \
    | grep flash_mma | grep -oE "HMMA[.A-Z0-9]*|LDSM[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|MUFU\.EX2|LDL|STL" | sort | uniq -c \
    | sed 's/^/sass (mma kernels): /' >> "$OUT/env.txt"
# The Hopper kernels (HGMMA = wgmma, UTMALDG = TMA load, SYNCS = mbarrier, USETMAXREG = setmaxnreg).
cuobjdump --dump-sass "$FK_BUILD/sm_90a/libflash_kernel.so" 2>/dev/null | awk '/Function : /{f=$3} {print f, $0}' \
    | grep flash_wgmma | grep -oE "HGMMA\.[0-9x]+[.A-Z0-9]*|UTMALDG[.A-Z0-9]*|SYNCS\.[.A-Z0-9]*|USETMAXREG[.A-Z0-9]*|HMMA[.A-Z0-9]*|LDL|STL" \
    | sort | uniq -c | sed 's/^/sass (wgmma kernels): /' >> "$OUT/env.txt"
cuobjdump --list-elf "$FK_BUILD/sm_90a/libflash_kernel.so" 2>/dev/null | sed 's/^/cubins (sm_90a build): /' >> "$OUT/env.txt"
VARIANT_LIBS=()
IFS=';' read -r -a VARS <<< "${FK_VARIANTS:-}"
for v in "${VARS[@]}"; do
    [ -z "$v" ] && continue
    label=${v%%:*}; flags=${v#*:}; name=${label%%@*}   # name@64:flags = timed at head dim 64 only
    # shellcheck disable=SC2086
    build "var-$name" $flags && VARIANT_LIBS+=(--lib "mma_$label=$FK_BUILD/var-$name/libflash_kernel.so")
done

stage_test() {
    FLASH_KERNEL_BUILD=$FK_BUILD timeout ${FK_TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py \
        >"$OUT/pytest.log" 2>&1
    note "pytest tests/test_kernel_gpu.py: $(tail -1 "$OUT/pytest.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -8 | tee -a "$SUMMARY"
}

# Each tuning variant's mma path through the same tests (its own build folder holding it as sm_90).
stage_vtest() {
    for v in "${VARS[@]}"; do
        [ -z "$v" ] && continue
        name=${v%%:*}; name=${name%%@*}
        mkdir -p "$FK_BUILD/t-$name/sm_90"
        cp "$FK_BUILD/var-$name/libflash_kernel.so" "$FK_BUILD/t-$name/sm_90/" || continue
        FLASH_KERNEL_BUILD=$FK_BUILD/t-$name timeout ${FK_TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider \
            -k "not generic" tests/test_kernel_gpu.py >>"$OUT/pytest.log" 2>&1
        note "pytest (variant $name, mma path): $(tail -1 "$OUT/pytest.log")"
    done
}

stage_memcheck() {
    local DRV=/tmp/fk_memcheck_drv
    mkdir -p $DRV
    nvcc -O2 -std=c++17 -I flash_kernel/include bench/fk_memcheck.cpp -o "$DRV/fk_memcheck" -ldl >"$DRV/build.log" 2>&1 \
        || note "memcheck driver build failed: $(tail -3 $DRV/build.log)"
    for t in ${FK_MEMCHECK_LIBS:-sm_90 sm_90a sm_90-generic}; do
        timeout ${FK_MEMCHECK_TIMEOUT:-120} compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
            "$DRV/fk_memcheck" "$FK_BUILD/$t/libflash_kernel.so" >"$DRV/memcheck-$t.log" 2>&1
        note "memcheck $t: exit $? | $(grep -E 'ERROR SUMMARY|calls' "$DRV/memcheck-$t.log" | tr '\n' ' ')"
        { echo "=== $t"; cat "$DRV/memcheck-$t.log"; } >> "$OUT/memcheck.log"
    done
}

# FK_DRIVER_DIMS="40,72,160" limits the driver to those head dims (memcheck and racecheck);
# FK_DRIVER_MAX_N=77 keeps the racecheck shapes at N <= 77 (default 1000).
# Shared-memory races (racecheck) on the flash path (FK_RACECHECK_FLASH_ONLY= to add the naive path),
# small shapes, fp16/bf16 at D 64/128.
stage_racecheck() {
    local DRV=/tmp/fk_memcheck_drv
    [ -x "$DRV/fk_memcheck" ] || stage_memcheck_build_only
    for t in ${FK_RACECHECK_LIBS:-sm_90a sm_90}; do
        FK_DRIVER_SMALL=1 FK_DRIVER_FLASH_ONLY=${FK_RACECHECK_FLASH_ONLY-1} timeout ${FK_RACECHECK_TIMEOUT:-150} compute-sanitizer --tool racecheck --racecheck-report all \
            --error-exitcode 9 --print-limit 20 "$DRV/fk_memcheck" "$FK_BUILD/$t/libflash_kernel.so" >"$DRV/racecheck-$t.log" 2>&1
        note "racecheck $t: exit $? | $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|calls' "$DRV/racecheck-$t.log" | tr '\n' ' ')"
        { echo "=== $t"; cat "$DRV/racecheck-$t.log"; } >> "$OUT/racecheck.log"
    done
}
stage_memcheck_build_only() { FK_MEMCHECK_LIBS=" " stage_memcheck; }

# The fp32 FMA peak of the day (the forced-generic path is quoted against it).
stage_fma() {
    [ -f bench/fma_peak.cu ] || { note "fma: bench/fma_peak.cu missing"; return; }
    nvcc -O3 -arch=sm_90 bench/fma_peak.cu -o /tmp/fma_peak >/tmp/fma-build.log 2>&1 || { note "fma: build failed"; return; }
    timeout 60 /tmp/fma_peak > "$OUT/fma.txt" 2>&1
    note "fma: $(tr '\n' ' ' < "$OUT/fma.txt")"
}

stage_bench() {
    SHAPE_ARGS=()
    for s in $FK_SHAPES; do SHAPE_ARGS+=(--shape "$s"); done
    for dt in $FK_DTYPE; do  # one or more of bf16 fp16
        FLASH_KERNEL_BUILD=$FK_BUILD timeout ${FK_BENCH_TIMEOUT:-240} python3 bench/kernel_bench.py "${SHAPE_ARGS[@]}" --dtype "$dt" \
            --lib "ours_mma=$FK_BUILD/sm_90/libflash_kernel.so" \
            ${FK_NO_WGMMA:---lib "ours_wgmma=$FK_BUILD/sm_90a/libflash_kernel.so"} "${VARIANT_LIBS[@]}" \
            ${FK_SLOW_PATHS:+--generic-lib "$FK_BUILD/sm_90-generic/libflash_kernel.so"} \
            ${FK_SLOW_PATHS:+--naive-lib "$FK_BUILD/sm_90/libflash_kernel.so"} ${FK_BENCH_ARGS:-} \
            --json "$OUT/bench-$dt.json" >>"$OUT/bench.txt" 2>&1
        note "bench $dt exit $?"
    done
}

for stage in $FK_STAGES; do "stage_$stage"; done
echo "==== summary"
cat "$SUMMARY"
cat "$OUT/env.txt"
[ -f "$OUT/bench.txt" ] && grep -vE "^#" "$OUT/bench.txt" | grep -v "^shape " | tail -60
}  # end of run_kernel

# ==================================================================================================
# survey
# The kernel survey in one device run, most important first (a run killed at
# its limit still returns what $OUT holds): GPU tests of sm_90a / sm_90 / sm_90-generic, the fp32
# FMA peak, racecheck and memcheck of the sm_90a library, the op bench (mma variants, wgmma, generic
# and naive against SDPA flash/cuDNN), then the wan-480p pipeline with the fastest library.
#   FK_BUILD=build/d2 FK_VARIANTS="fll:x;pipe:x" bash bench/device.sh survey   (needs FK_BUILD and .whl)
register survey 'the kernel run with the survey defaults, then the Wan2.1 pipeline with the same libraries'
run_survey() {
export OUT=${OUT:-/tmp/fk_device_out} FK_BUILD=${FK_BUILD:-build/d2}
export FK_STAGES=${FK_STAGES:-"test fma racecheck memcheck bench"} FK_MEMCHECK_LIBS=${FK_MEMCHECK_LIBS:-sm_90a}
export FK_RACECHECK_LIBS=${FK_RACECHECK_LIBS:-sm_90a} FK_SLOW_PATHS=${FK_SLOW_PATHS-1} FK_DTYPE=${FK_DTYPE:-bf16}
export FK_BENCH_ARGS=${FK_BENCH_ARGS:-"--torch-methods sdpa_flash,sdpa_cudnn"}
export FK_SHAPES=${FK_SHAPES:-"1,12,32760,128 1,48,17776,64 2,32,6144,64"}
export FK_MEMCHECK_TIMEOUT=${FK_MEMCHECK_TIMEOUT:-100} FK_RACECHECK_TIMEOUT=${FK_RACECHECK_TIMEOUT:-80}
export FK_TEST_TIMEOUT=${FK_TEST_TIMEOUT:-150}
bash bench/device.sh kernel > "$OUT/kernel.log" 2>&1
if [ "${FK_PIPELINE:-1}" = 1 ]; then
    FLASH_KERNEL_BUILD=$FK_BUILD OUT=$OUT/pipeline STEPS=${STEPS:-2} ATTENTION=${ATTENTION:-naive,flash} \
        timeout ${FK_PIPELINE_TIMEOUT:-240} bash bench/device.sh pipeline > "$OUT/pipeline.log" 2>&1
    echo "pipeline exit $?" >> "$OUT/summary.txt"
fi
# $OUT returns at most 8 files: the logs travel as one archive
(cd "$OUT" && tar -czf logs.tgz --remove-files $(ls kernel.log pytest.log memcheck.log racecheck.log pipeline.log 2>/dev/null))
echo "==== summary"; cat "$OUT/summary.txt"; cat "$OUT/env.txt"
grep -vE "^#" "$OUT/bench.txt" 2>/dev/null | grep -v "^shape " | tail -40
tar -xzOf "$OUT/logs.tgz" pipeline.log 2>/dev/null | grep -E "speedup|Amdahl|share|s/step|DiT|kernel library" | tail -20
}  # end of run_survey

# ==================================================================================================
# variants
# The Hopper kernel's default against -D variants of it and SDPA-cuDNN in one device run on an
# NVIDIA H200:
#   1. builds, in parallel: the default sm_90a library with `sovereign-audit build` (into build/,
#      where the public call flash_kernel.attention finds it; provenance for the tests), each
#      variant of $FK_VARIANTS ("name:-DFLAG ...;...": switches of gpu/fk_traits.h) by the same nvcc
#      command plus its flags, and, with FK_BASE_SRC=<a checkout>, that tree's sources as "base"
#      (FK_PREBUILT=1: all of them built elsewhere by the same nvcc and carried)
#   2. the sm_90a GPU tests (tests/test_kernel_gpu.py: float64 reference, fresh random inputs,
#      NaN-poisoned outputs, the path of every call checked), and every variant against float64
#      at head dims 64, 72, 128 on persistent-grid shapes (many items a block, short and long Nk)
#   3. compute-sanitizer memcheck of the default on the test shapes and on shapes with more work
#      items than SMs, then racecheck on small ones
#   4. ours through the public call, the variants and SDPA-cuDNN timed call by call
#      (bench/kernel_bench.py) at the cross-attention, short and long self-attention and wide
#      head-dim shapes (FK_SHAPES), bf16
# Under $OUT: summary.txt, bench.json and logs.tgz; the short table prints last.
#   OUT=/tmp/v FK_VARIANTS="nostages:-DFK_WGMMA_STAGES_D128=2" bash bench/device.sh variants
#   BUDGET_S (default 300) bounds the run; FK_REPEATS (default 10) timed calls per method and shape
register variants 'the default sm_90a library against -D variants (FK_VARIANTS) and the sources of another tree: tests, float64 checks, sanitizers, timing against SDPA-cuDNN'
run_variants() {
OUT=${OUT:-/tmp/variants_out}
BUDGET_S=${BUDGET_S:-300}
VB=build/variants
LOG=/tmp/variants_logs
mkdir -p "$OUT" "$VB" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
device_common
record_env "$LOG/env.txt"

FK_VARIANTS=${FK_VARIANTS-}

# 1. Builds, in parallel. FK_PREBUILT=1: the libraries are already there (build/sm_90a by
#    `sovereign-audit build`, with provenance; build/variants/<name>, base included), built by the
#    same nvcc 13.0 elsewhere and carried: the device's time goes to tests and timing.
if [ -n "${FK_PREBUILT:-}" ]; then
    LIBS=()
    [ -f "$VB/base/libflash_kernel.so" ] && LIBS+=("base=$VB/base/libflash_kernel.so")
    IFS=';' read -r -a VARS <<< "$FK_VARIANTS"
    for v in "${VARS[@]}"; do [ -n "$v" ] && LIBS+=("${v%%:*}=$VB/${v%%:*}/libflash_kernel.so"); done
    note "prebuilt: default $(stat -c %s build/sm_90a/libflash_kernel.so 2>/dev/null) bytes$(for l in "${LIBS[@]}"; do printf ', %s %s' "${l%%=*}" "$(stat -c %s "${l#*=}" 2>/dev/null)"; done)"
else

timeout -k 5 200 python3 -m audit build --target sm_90a --out build > "$LOG/build-default.log" 2>&1 &
PIDS=($!)
IFS=';' read -r -a VARS <<< "$FK_VARIANTS"
LIBS=()
build_variants 200 "${VARS[@]}"
if [ -n "${FK_BASE_SRC:-}" ]; then  # another tree's sources, e.g. the commit before
    mkdir -p "$VB/base"
    timeout -k 5 200 "${VARIANT_NVCC[@]}" -I "$FK_BASE_SRC/flash_kernel/include" -I "$FK_BASE_SRC/flash_kernel/src" \
        "$FK_BASE_SRC/flash_kernel/src/fk_gpu.hip" -o "$VB/base/libflash_kernel.so" > "$LOG/build-base.log" 2>&1 &
    PIDS+=($!)
    LIBS=("base=$VB/base/libflash_kernel.so" "${LIBS[@]}")
fi
for p in "${PIDS[@]}"; do wait "$p" || note "a build failed (pid $p): see build-*.log"; done
note "builds done ($(el) s): default $(stat -c %s build/sm_90a/libflash_kernel.so 2>/dev/null) bytes$(for l in "${LIBS[@]}"; do printf ', %s %s' "${l%%=*}" "$(stat -c %s "${l#*=}" 2>/dev/null)"; done)"
grep -h "spill" "$LOG"/build-*.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -5 | sed 's/^/ptxas spills: /' | tee -a "$SUMMARY"
fi

# 2-3. Correctness: sanitizers beside the GPU tests (both use the GPU lightly), then the variants.
DRV=/tmp/fk_memcheck_drv
mkdir -p $DRV
( nvcc -O2 -std=c++17 -I flash_kernel/include bench/fk_memcheck.cpp -o $DRV/fk_memcheck -ldl > $DRV/build.log 2>&1
  FK_DRIVER_DIMS=64,72,128 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 60 compute-sanitizer --tool memcheck \
    --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck build/sm_90a/libflash_kernel.so > "$LOG/memcheck.log" 2>&1
  echo "memcheck rc=$?" >> "$LOG/memcheck.log"
  FK_DRIVER_MANY=1 FK_DRIVER_DIMS=64,72,128,200,256 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 60 compute-sanitizer --tool memcheck \
    --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck build/sm_90a/libflash_kernel.so > "$LOG/memcheck-many.log" 2>&1
  echo "memcheck rc=$?" >> "$LOG/memcheck-many.log"
  FK_DRIVER_MANY=1 FK_DRIVER_SMALL=1 FK_DRIVER_DIMS=64,128 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 60 compute-sanitizer \
    --tool racecheck --racecheck-report all --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck \
    build/sm_90a/libflash_kernel.so > "$LOG/racecheck.log" 2>&1
  echo "racecheck rc=$?" >> "$LOG/racecheck.log" ) &
MC=$!
timeout -k 5 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE -k sm_90a tests/test_kernel_gpu.py > "$LOG/pytest.log" 2>&1
note "pytest tests/test_kernel_gpu.py -k sm_90a -n 8 rc=$? ($(el) s): $(tail -1 "$LOG/pytest.log")"
grep -E "^(FAILED|ERROR)" "$LOG/pytest.log" | head -8 | tee -a "$SUMMARY"
timeout -k 5 60 python3 bench/check_variants.py --dims 64,72,128 --cases many "${LIBS[@]}" > "$LOG/variants-check.log" 2>&1
note "variants vs float64 rc=$? ($(el) s): $(grep -E '^[a-z0-9_]+: ' "$LOG/variants-check.log" | tr '\n' ' ')"
wait $MC
note "memcheck (default; test shapes, d 64,72,128): $(grep -E 'ERROR SUMMARY|calls|rc=' "$LOG/memcheck.log" | tr '\n' ' ')"
note "memcheck (default; many items, d 64,72,128,200,256): $(grep -E 'ERROR SUMMARY|calls|rc=' "$LOG/memcheck-many.log" | tr '\n' ' ')"
note "racecheck (default; many items, small, d 64,128): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|calls|rc=' "$LOG/racecheck.log" | tr '\n' ' ')"

# 4. Timing: ours (the public call), the variants, SDPA-cuDNN; bf16, call by call.
SHAPES=${FK_SHAPES:-"1,12,32760,512,128 2,40,32760,512,128 8,16,2048,2048,128 2,24,8192,8192,128 1,24,4608,4608,128
        1,16,16384,16384,32 1,12,32760,32760,128 1,12,16384,16384,256 1,16,16384,16384,192 1,16,16384,16384,160"}
ARGS=(); for s in $SHAPES; do ARGS+=(--shape "$s"); done
for l in "${LIBS[@]}"; do ARGS+=(--lib "${l%%=*}${FK_VARIANT_DIMS:+@$FK_VARIANT_DIMS}=${l#*=}"); done  # e.g. FK_VARIANT_DIMS=32,64,128
t=$(( $(left) - 10 )); [ "$t" -gt 240 ] && t=240
timeout -k 5 "$t" python3 bench/kernel_bench.py "${ARGS[@]}" --dtype bf16 --torch-methods sdpa_cudnn \
    --repeats "${FK_REPEATS:-10}" --warmup 2 --rotate 2 --json "$OUT/bench.json" > "$LOG/bench.txt" 2>&1
note "bench rc=$? ($(el) s)"

cp "$SUMMARY" "$LOG/" && tar czf "$OUT/logs.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")"
echo "==== summary"
cat "$SUMMARY"
echo "==== bf16: ms (TFLOP/s) and x SDPA-cuDNN [95 % interval] per method"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
by = {}
for r in rows:
    by.setdefault(",".join(map(str, r["shape"])), []).append(r)
for shape, rs in by.items():
    cells = []
    for r in rs:
        if r["method"] == "sdpa_cudnn":
            cells.append(f"cuDNN {r['median_ms']:.3f} ({r['tflops']:.0f})")
        elif "median_ms" in r:
            lo, hi = r.get("x_sdpa_cudnn_ci95", (float("nan"),) * 2)
            cells.append(f"{r['method']} {r['median_ms']:.3f} ({r['tflops']:.0f}) {r.get('x_sdpa_cudnn', float('nan')):.2f} [{lo:.2f},{hi:.2f}]")
    print(f"{shape:<22} " + " | ".join(cells))
PY
}  # end of run_variants

# ==================================================================================================
# persistent
# The default wgmma kernel against a variant of it (by default the per-tile grid), on an NVIDIA
# H200, in one run:
#   1. build the default sm_90a library with `sovereign-audit build` into build/ (the public call
#      flash_kernel.attention finds it there) and, beside it, the same sources with the variant's
#      macros (FK_OTHER="name:flags", default "tile:-DFK_WGMMA_PERSISTENT=0": one block per work
#      item) by the same nvcc command plus the macros
#   2. the GPU tests of the sm_90a library against float64 (tests/test_kernel_gpu.py: fresh random
#      inputs, NaN-poisoned outputs, the path of every call checked; many work items per block,
#      ragged tiles, K/V of one tile) and of the public call in a graph capture / on a side stream
#   3. compute-sanitizer memcheck (and racecheck, smaller) of the default library on shapes of the
#      persistent path
#   4. ours through the public call, the variant's library and SDPA-cuDNN, taking turns call by
#      call (bench/kernel_bench.py), at the cross-attention, short and long self-attention shapes
# Results under $OUT; the short table prints last.
#   OUT=/tmp/persist bash bench/device.sh persistent      # BUDGET_S (default 300) bounds the run
register persistent 'the persistent wgmma grid against another build of the same sources (FK_OTHER, default one block per query tile) and SDPA-cuDNN'
run_persistent() {
OUT=${OUT:-/tmp/persist_out}
BUDGET_S=${BUDGET_S:-300}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
device_common
record_env "$OUT/env.txt"

# 1. Both libraries, built at the same time.
FK_OTHER=${FK_OTHER:-"tile:-DFK_WGMMA_PERSISTENT=0"}
ONAME=${FK_OTHER%%:*}
OTHER=build/$ONAME/sm_90a/libflash_kernel.so
mkdir -p "$(dirname "$OTHER")"
OFLAGS=${FK_OTHER#*:} python3 - "$OTHER" > "$OUT/other-cmd.txt" <<'PY'
import os, shlex, sys
from audit.kernel_build.targets import nvidia_spec
cmd = nvidia_spec("sm_90a").command(sys.argv[1])
print(shlex.join(cmd[:1] + os.environ["OFLAGS"].split() + cmd[1:]))
PY
(eval "$(cat "$OUT/other-cmd.txt")" > "$OUT/build-$ONAME.log" 2>&1; echo $? > "$OUT/build-$ONAME.rc") &
timeout 300 python3 -m audit build --target sm_90a --out build > "$OUT/build.log" 2>&1
note "build sm_90a (default) rc=$? ($(el) s)"
wait
note "build sm_90a variant $ONAME rc=$(cat "$OUT/build-$ONAME.rc") ($(el) s): $(cat "$OUT/other-cmd.txt")"

# 2. Correctness of the default library (sm_90a alone) and of the public call where users put it.
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -k "sm_90a" tests/test_kernel_gpu.py > "$OUT/pytest.log" 2>&1
note "pytest tests/test_kernel_gpu.py -k sm_90a rc=$?: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -8 | tee -a "$SUMMARY"
timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_placement.py > "$OUT/pytest-placement.log" 2>&1
note "pytest tests/test_cuda_placement.py rc=$?: $(tail -1 "$OUT/pytest-placement.log")"

# 3. memcheck: the C ABI called on exact-size cudaMalloc buffers (no allocator slack to hide an
#    out-of-bounds access), shapes with more work items than SMs, every bucket and a padded head dim.
cat > /tmp/fk_persist_drv.cpp <<'CPP'
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "flash_kernel.h"
typedef int32_t (*fwd_t)(const fk_attention_args *);
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { std::printf("dlopen: %s\n", dlerror()); return 2; }
    fwd_t flash = (fwd_t)dlsym(h, "fk_flash_forward");
    const char *(*path)() = (const char *(*)())dlsym(h, "fk_last_flash_path");
    const char *(*err)() = (const char *(*)())dlsym(h, "fk_last_error");
    int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const long shapes[][4] = {{2, 3, 1, 1}, {1, sms + 7L, 300, 1000}, {2, sms + 3L, 129, 100}, {1, 2, 77, 4097}};
    const int dims[] = {64, 72, 128, 200, 256};
    const bool small = std::getenv("FK_DRIVER_SMALL") != nullptr;  // racecheck: fewer, smaller calls
    int calls = 0, bad = 0;
    for (auto &s : shapes) for (int d : dims) for (int dt = 1; dt < 3; ++dt) for (int lay = 0; lay < 2; ++lay) {
        if (small && (s[2] > 200 || dt == 1 || lay == 1 || (d != 64 && d != 128))) continue;
        long B = s[0], H = s[1], nq = s[2], nk = s[3];
        size_t nqe = B * H * nq * d, nke = B * H * nk * d;
        std::vector<uint16_t> host(nke > nqe ? nke : nqe);
        for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x3c00 ^ (std::rand() & 0x83ff));  // small values, both signs
        void *q, *k, *v, *o;
        cudaMalloc(&q, nqe * 2); cudaMalloc(&k, nke * 2); cudaMalloc(&v, nke * 2); cudaMalloc(&o, nqe * 2);
        cudaMemcpy(q, host.data(), nqe * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(k, host.data(), nke * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(v, host.data(), nke * 2, cudaMemcpyHostToDevice);
        fk_attention_args a{}; a.abi_version = FK_ABI_VERSION; a.dtype = dt; a.q = q; a.k = k; a.v = v; a.o = o;
        a.batch = B; a.heads = H; a.nq = nq; a.nk = nk; a.head_dim = d;
        auto st = [&](int64_t *x, long n) { if (lay == 0) { x[0] = H * n * d; x[1] = n * d; x[2] = d; } else { x[0] = n * H * d; x[1] = d; x[2] = H * d; } };
        st(a.q_stride, nq); st(a.o_stride, nq); st(a.k_stride, nk); st(a.v_stride, nk);
        int32_t rc = flash(&a); cudaError_t e = cudaDeviceSynchronize(); ++calls;
        if (rc != 0 || e != cudaSuccess || std::strcmp(path(), "wgmma") != 0) {
            ++bad;
            std::printf("FAIL B%ld H%ld nq%ld nk%ld d%d dt%d lay%d rc %d (%s) path %s cuda %s\n", B, H, nq, nk, d, dt, lay, rc,
                        err(), path(), cudaGetErrorString(e));
        }
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o);
    }
    std::printf("persistent driver: %d calls, %d failures\n", calls, bad);
    return bad ? 1 : 0;
}
CPP
nvcc -O2 -std=c++17 -I flash_kernel/include /tmp/fk_persist_drv.cpp -o /tmp/fk_persist_drv -ldl > "$OUT/driver-build.log" 2>&1 \
    || note "memcheck driver build failed: $(tail -3 "$OUT/driver-build.log" | tr '\n' ' ')"
timeout -k 5 $(( $(left) > 200 ? 90 : 45 )) compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    /tmp/fk_persist_drv build/sm_90a/libflash_kernel.so > "$OUT/memcheck.log" 2>&1
note "memcheck (default sm_90a) rc=$?: $(grep -E 'ERROR SUMMARY|driver:' "$OUT/memcheck.log" | tr '\n' ' ')"
FK_DRIVER_SMALL=1 timeout -k 5 $(( $(left) > 200 ? 60 : 30 )) compute-sanitizer --tool racecheck --racecheck-report all \
    --error-exitcode 9 --print-limit 20 /tmp/fk_persist_drv build/sm_90a/libflash_kernel.so > "$OUT/racecheck.log" 2>&1
note "racecheck (default sm_90a, small) rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|driver:' "$OUT/racecheck.log" | tr '\n' ' ')"

# 4. Time: ours (the public call, default library), the other grid, SDPA-cuDNN; bf16.
SHAPES="1,12,32760,512,128 2,40,32760,512,128 2,24,8192,8192,128 8,16,2048,2048,128 1,24,4608,4608,128
        1,12,32760,32760,128 1,40,75600,75600,128 1,30,17776,17776,64 1,12,16384,16384,256"
ARGS=(); for s in $SHAPES; do ARGS+=(--shape "$s"); done
t=$(( $(left) - 10 )); [ "$t" -gt 200 ] && t=200
timeout -k 5 "$t" python3 bench/kernel_bench.py "${ARGS[@]}" --dtype bf16 --lib "$ONAME=$OTHER" \
    --torch-methods sdpa_cudnn --repeats 10 --warmup 2 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
note "bench rc=$? ($(el) s)"

# The logs in one archive (few files come back from a device run), the summary and tables last.
tar czf "$OUT/logs.tgz" -C "$OUT" --remove-files $(cd "$OUT" && ls ./*.log ./*.txt ./*.rc 2>/dev/null | grep -v -e summary.txt -e bench.txt) 2>/dev/null
echo "==== bench (bench/kernel_bench.py)"
cat "$OUT/bench.txt"
echo "==== summary"
cat "$SUMMARY"
echo "==== ours (default) vs $ONAME vs SDPA-cuDNN, bf16, ms; ratios of medians [95 % CI]"
python3 - "$OUT/bench.json" "$ONAME" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from kernel_bench import ratio_ci
rows = json.load(open(sys.argv[1]))["rows"]
other = sys.argv[2]
by = {}
for r in rows:
    by.setdefault(tuple(r["shape"]), {})[r["method"]] = r
print(f"{'shape (B,H,Nq,Nk,D)':<24} {'path':<6} {'ours ms':>8} {other + ' ms':>8} {'cuDNN ms':>8} {'ours/' + other:>16} "
      f"{'ours/cuDNN':>16} {other + '/cuDNN':>16}")
for shape, m in by.items():
    def ms(k):
        return m[k]["median_ms"] if k in m and "median_ms" in m[k] else float("nan")
    def ratio(a, b):  # how much faster a is than b: median(b) / median(a)
        if a not in m or b not in m or "times_ms" not in m[a] or "times_ms" not in m[b]:
            return "-"
        lo, hi = ratio_ci(m[b]["times_ms"], m[a]["times_ms"])
        return f"{ms(b) / ms(a):.2f} [{lo:.2f},{hi:.2f}]"
    print(f"{','.join(map(str, shape)):<24} {m.get('ours', {}).get('path') or '-':<6} {ms('ours'):8.3f} {ms(other):8.3f} "
          f"{ms('sdpa_cudnn'):8.3f} {ratio('ours', other):>16} {ratio('ours', 'sdpa_cudnn'):>16} {ratio(other, 'sdpa_cudnn'):>16}")
PY
}  # end of run_persistent

# ==================================================================================================
# dims
# The two ends of the head-dim range in one device run on an NVIDIA H200: head dim 32 on the Hopper
# (wgmma) path against SDPA-cuDNN, and bucket 256 (head dims 200..256) on the mma.sync path (the
# sm_90 library) against SDPA-flash. Every library is built elsewhere by the same nvcc and carried:
#   build/sm_90a, build/sm_90      `sovereign-audit build --target sm_90a --target sm_90` (provenance)
#   build/variants/<name>          the other libraries named in WG_LIBS and MMA_LIBS
#   1. tests/test_kernel_gpu.py on both libraries (TEST_TIMEOUT seconds at most; PYTEST_K narrows it) (float64 reference, fresh random inputs,
#      NaN-poisoned outputs, the path of every call checked), and every carried library against
#      float64 at the head dims it is timed at (bench/check_variants.py)
#   2. compute-sanitizer memcheck and racecheck of the default libraries at head dims 32..64 (sm_90a)
#      and 200..256 (sm_90), and of each library in SANITIZE_VARIANTS at its head dims
#   3. the public call, WG_LIBS and SDPA-cuDNN timed call by call at WG_SHAPES; the sm_90 library,
#      MMA_LIBS and SDPA-flash at MMA_SHAPES (bench/kernel_bench.py), DTYPES, REPEATS timed calls each
# WG_SHAPES="" leaves the wgmma path out (its checks, sanitizers and timing): an mma.sync-only run.
# Under $OUT: summary.txt, bench-*.json and logs.tgz; the short tables print last.
#   OUT=/tmp/d WG_LIBS="base@32,64" MMA_LIBS="l2@256" bash bench/device.sh dims
register dims 'the ends of the head-dim range with carried libraries: wgmma at 32..64 against SDPA-cuDNN, mma.sync at 200..256 against SDPA-flash'
run_dims() {
OUT=${OUT:-/tmp/dims_out}
BUDGET_S=${BUDGET_S:-300}
VB=build/variants
LOG=/tmp/dims_logs
mkdir -p "$OUT" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
device_common
record_env "$LOG/env.txt"

WG_LIBS=${WG_LIBS-}      # "NAME@D,...": sm_90a libraries under $VB, timed at those head dims
MMA_LIBS=${MMA_LIBS-}    # the same for sm_90 (mma.sync) libraries
WG_SHAPES=${WG_SHAPES-"1,16,16384,16384,32 1,16,16384,16384,40 1,16,16384,16384,64"}
MMA_SHAPES=${MMA_SHAPES:-"1,12,16384,16384,256 1,12,16384,16384,200"}
DTYPES=${DTYPES:-bf16}
REPEATS=${REPEATS:-10}
PYTEST_K=${PYTEST_K:-not generic}
MMA_CHECK_DIMS=${MMA_CHECK_DIMS:-200-256/8}  # head dims the sm_90 libraries are checked at (bench/check_variants.py)
SANITIZE_VARIANTS=${SANITIZE_VARIANTS-}  # "NAME:DIMS ..." libraries under $VB to run the sanitizers on too
lib_args() {  # NAME@D,... -> --lib NAME@D,...=$VB/NAME/libflash_kernel.so
    local l
    for l in $1; do printf -- '--lib\n%s=%s\n' "$l" "$VB/${l%%@*}/libflash_kernel.so"; done
}
note "carried: sm_90a $(stat -c %s build/sm_90a/libflash_kernel.so) bytes, sm_90 $(stat -c %s build/sm_90/libflash_kernel.so) bytes$(for l in $WG_LIBS $MMA_LIBS; do printf ', %s %s' "${l%%@*}" "$(stat -c %s "$VB/${l%%@*}/libflash_kernel.so")"; done)"

# 2. Sanitizers in the background (they use the GPU lightly) while the tests run.
DRV=/tmp/fk_memcheck_drv
mkdir -p $DRV
sanitize() {  # LABEL LIB DIMS
    FK_DRIVER_DIMS=$3 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 50 compute-sanitizer --tool memcheck --error-exitcode 9 \
        --print-limit 20 $DRV/fk_memcheck "$2" > "$LOG/memcheck-$1.log" 2>&1
    echo "memcheck rc=$?" >> "$LOG/memcheck-$1.log"
    FK_DRIVER_SMALL=1 FK_DRIVER_MAX_N=77 FK_DRIVER_DIMS=$3 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 50 compute-sanitizer \
        --tool racecheck --racecheck-report all --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck "$2" \
        > "$LOG/racecheck-$1.log" 2>&1
    echo "racecheck rc=$?" >> "$LOG/racecheck-$1.log"
}
( nvcc -O2 -std=c++17 -I flash_kernel/include bench/fk_memcheck.cpp -o $DRV/fk_memcheck -ldl > $DRV/build.log 2>&1
  [ -n "$WG_SHAPES" ] && sanitize sm_90a build/sm_90a/libflash_kernel.so 32,40,48,56,64 &
  sanitize sm_90 build/sm_90/libflash_kernel.so "${MMA_SANITIZE_DIMS:-200,224,232,256}" &
  for v in $SANITIZE_VARIANTS; do sanitize "${v%%:*}" "$VB/${v%%:*}/libflash_kernel.so" "${v#*:}" & done
  wait ) &
MC=$!

# 1. Tests: each carried library against float64 (in the background), both libraries through
#    tests/test_kernel_gpu.py.
WG_CHECK=(); for l in $WG_LIBS; do WG_CHECK+=("${l%%@*}=$VB/${l%%@*}/libflash_kernel.so"); done
MMA_CHECK=(); for l in $MMA_LIBS; do MMA_CHECK+=("${l%%@*}=$VB/${l%%@*}/libflash_kernel.so"); done
( if [ -n "$WG_SHAPES" ]; then
    timeout -k 5 90 python3 bench/check_variants.py --dims 32-64/8 --cases ragged default=build/sm_90a/libflash_kernel.so \
      "${WG_CHECK[@]}" > "$LOG/check-wgmma.log" 2>&1
    echo "rc=$?" >> "$LOG/check-wgmma.log"
  fi
  timeout -k 5 90 python3 bench/check_variants.py --dims "$MMA_CHECK_DIMS" --cases ragged --path mma_sync \
    default=build/sm_90/libflash_kernel.so "${MMA_CHECK[@]}" > "$LOG/check-mma.log" 2>&1
  echo "rc=$?" >> "$LOG/check-mma.log" ) &
CV=$!
timeout -k 5 "${TEST_TIMEOUT:-170}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfEs -k "$PYTEST_K" \
    tests/test_kernel_gpu.py > "$LOG/pytest.log" 2>&1
note "pytest tests/test_kernel_gpu.py -k '$PYTEST_K' -n 8 rc=$? ($(el) s): $(tail -1 "$LOG/pytest.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$LOG/pytest.log" | head -8 | tee -a "$SUMMARY"
wait $CV
[ -n "$WG_SHAPES" ] && note "wgmma libraries vs float64 at 32..64: $(grep -E '^[a-z0-9_]+: |rc=' "$LOG/check-wgmma.log" | tr '\n' ' ')"
note "mma.sync libraries vs float64 at $MMA_CHECK_DIMS: $(grep -E '^[a-z0-9_]+: |rc=' "$LOG/check-mma.log" | tr '\n' ' ')"
wait $MC
for f in "$LOG"/memcheck-*.log "$LOG"/racecheck-*.log; do
    note "$(basename "$f" .log): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls|rc=' "$f" | tr '\n' ' ')"
done

# 3. Timing, call by call in turns, median of REPEATS after 2 warm-up calls over 2 rotated input sets.
for dt in $DTYPES; do
    if [ -n "$WG_SHAPES" ]; then
        ARGS=(); for s in $WG_SHAPES; do ARGS+=(--shape "$s"); done
        mapfile -t L < <(lib_args "$WG_LIBS")
        timeout -k 5 100 python3 bench/kernel_bench.py "${ARGS[@]}" "${L[@]}" --dtype "$dt" --torch-methods sdpa_cudnn \
            --repeats "$REPEATS" --warmup 2 --rotate 2 --json "$OUT/bench-wgmma-$dt.json" > "$LOG/bench-wgmma-$dt.txt" 2>&1
        note "bench wgmma $dt rc=$? ($(el) s)"
    fi
    ARGS=(); for s in $MMA_SHAPES; do ARGS+=(--shape "$s"); done
    mapfile -t L < <(lib_args "$MMA_LIBS")
    timeout -k 5 100 python3 bench/kernel_bench.py --no-public "${ARGS[@]}" --lib "mma=build/sm_90/libflash_kernel.so" \
        "${L[@]}" --dtype "$dt" --torch-methods sdpa_flash \
        --repeats "$REPEATS" --warmup 2 --rotate 2 --json "$OUT/bench-mma-$dt.json" > "$LOG/bench-mma-$dt.txt" 2>&1
    note "bench mma.sync $dt rc=$? ($(el) s)"
done

cp "$SUMMARY" "$LOG/" && tar czf "$OUT/logs.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")"
echo "==== summary"
cat "$SUMMARY"
echo "==== ms (TFLOP/s) and x the SDPA baseline [95 % interval] per method"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    rows = json.load(open(path))["rows"]
    print("--", os.path.basename(path))
    by = {}
    for r in rows:
        by.setdefault(",".join(map(str, r["shape"])), []).append(r)
    for shape, rs in by.items():
        cells = []
        for r in rs:
            if "median_ms" not in r:
                continue
            m = r["method"]
            if m.startswith("sdpa_"):
                cells.append(f"{m} {r['median_ms']:.3f} ({r['tflops']:.0f})")
                continue
            key = next((k for k in r if k.startswith("x_sdpa_") and not k.endswith("ci95")), None)
            lo, hi = r.get(f"{key}_ci95", (float("nan"),) * 2) if key else (float("nan"),) * 2
            x = r.get(key, float("nan")) if key else float("nan")
            cells.append(f"{m} {r['median_ms']:.3f} ({r['tflops']:.0f}) {x:.2f} [{lo:.2f},{hi:.2f}]")
        print(f"{shape:<22} " + " | ".join(cells))
PY
}  # end of run_dims

# ==================================================================================================
# wide
# The Hopper kernel at the wide head dims (136..256: wgmma buckets 192 and 256) in one device run
# on an NVIDIA H200 (about 2-3 minutes):
#   1. builds, in parallel: the default sm_90a library with `sovereign-audit build` (into build/,
#      where the public call flash_kernel.attention finds it; provenance for the tests) and each
#      variant of $WIDE_VARIANTS with nvcc and -D switches of gpu/fk_traits.h (ptxas -v logged)
#   2. spills: LDL/STL in the SASS of every library's wgmma kernels, ptxas' spill lines
#   3. the GPU tests at head dims 136..256 on the default (float64 reference, fresh random inputs,
#      NaN-poisoned outputs, the path of every call checked; the persistent grid's many-item shapes), and each variant against float64 at
#      every head dim 136..256 (fp16, bf16, both layouts, ragged), with compute-sanitizer memcheck of
#      the default at head dims 160, 200 (padded) and 192, 256 (exact) alongside, then racecheck at
#      160, 192, 256 on small shapes
#   4. ours through the public call, the variants and SDPA-flash / SDPA-cuDNN timed call by call
#      (bench/kernel_bench.py) at head dims 160, 192, 256, bf16 and fp16
# Under $OUT: summary.txt, bench-{bf16,fp16}.json and logs.tgz (every log); the short table prints last.
#   OUT=/tmp/wide bash bench/device.sh wide
#   WIDE_SET=all|confirm, or WIDE_VARIANTS="name[@D,...]:-DFLAG ...;..." (empty: the default alone);
#   WIDE_SHAPES, WIDE_FP16_SHAPES
register wide 'the Hopper kernel at head dims 136..256: the default and -D variants built in parallel, spills, tests, sanitizers, timing'
run_wide() {
OUT=${OUT:-/tmp/wide_out}
VB=${VB:-build/wide}   # variant builds
LOG=${LOG:-/tmp/wide_logs}
mkdir -p "$OUT" "$VB" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
device_common

# Variants: what each -D turns back from the defaults (bucket 192 with BN 112 and ping-pong, wide
# P V, K/V released apart, early rescale, bucket 256 without ping-pong). "old" is the kernel before
# these switches existed. WIDE_SET=all (default) times them all; WIDE_SET=confirm the old kernel and
# the two ping-pong choices beside the default.
OLD="-DFK_WGMMA_BUCKET_192=0 -DFK_WGMMA_WIDE_PV_D256=0 -DFK_WGMMA_PINGPONG_D256=1 -DFK_WGMMA_WIDE_SPLIT_KV=0 -DFK_WGMMA_WIDE_EARLY_RESCALE=0"
TURNS="turns192off@160,192:-DFK_WGMMA_PINGPONG_D192=0;turns256on@256:-DFK_WGMMA_PINGPONG_D256=1"
if [ "${WIDE_SET:-all}" = confirm ]; then
    DEFAULT_VARIANTS="old:$OLD;$TURNS"
else
    DEFAULT_VARIANTS="old:$OLD;\
widepv:-DFK_WGMMA_BUCKET_192=0 -DFK_WGMMA_PINGPONG_D256=1 -DFK_WGMMA_WIDE_SPLIT_KV=0 -DFK_WGMMA_WIDE_EARLY_RESCALE=0;\
split:-DFK_WGMMA_BUCKET_192=0 -DFK_WGMMA_PINGPONG_D256=1 -DFK_WGMMA_WIDE_EARLY_RESCALE=0;\
free:-DFK_WGMMA_BUCKET_192=0 -DFK_WGMMA_WIDE_EARLY_RESCALE=0;\
no192:-DFK_WGMMA_BUCKET_192=0;$TURNS;\
b192bn96@160,192:-DFK_WGMMA_BN_D192=96;\
b192bn64s3@160,192:-DFK_WGMMA_BN_D192=64 -DFK_WGMMA_STAGES_D192=3"
fi
WIDE_VARIANTS=${WIDE_VARIANTS-$DEFAULT_VARIANTS}
WIDE_SHAPES=${WIDE_SHAPES:-"1,12,16384,16384,160 1,24,16384,16384,160 1,12,16384,16384,192 1,12,16384,16384,256"}
WIDE_FP16_SHAPES=${WIDE_FP16_SHAPES:-"1,12,16384,16384,192 1,12,16384,16384,256"}

record_env "$LOG/env.txt"

# 1. Builds, in parallel (one nvcc per library; each compiles its two cubins on 2 threads).
timeout -k 5 150 python3 -m audit build --target sm_90a --out build >"$LOG/build-default.log" 2>&1 &
PIDS=($!)
IFS=';' read -r -a VARS <<< "$WIDE_VARIANTS"
LIBS=()
build_variants 150 "${VARS[@]}"
for p in "${PIDS[@]}"; do wait "$p" || note "a build failed (pid $p): see build-*.log"; done
note "builds done ($(el) s): default $(stat -c %s build/sm_90a/libflash_kernel.so 2>/dev/null) bytes$(for l in "${LIBS[@]}"; do printf ', %s %s' "${l%%=*}" "$(stat -c %s "${l#*=}" 2>/dev/null)"; done)"

# 2. Spills: LDL/STL in the wgmma kernels' SASS (local memory = spills), ptxas' own words.
for so in build/sm_90a/libflash_kernel.so "${LIBS[@]#*=}"; do
    [ -f "$so" ] || continue
    cuobjdump --dump-sass "$so" > /tmp/wide.sass 2>/dev/null
    n=$(awk '/Function : /{f=$3} f ~ /flash_wgmma/ && /(LDL|STL)/' /tmp/wide.sass | wc -l)
    g=$(awk '/Function : /{f=$3} f ~ /flash_wgmma_kernelINS_4BF16ELi(192|256)ELb0/ && /HGMMA/ {match($0, /HGMMA\.[0-9x]+/); print substr($0, RSTART, RLENGTH)}' /tmp/wide.sass | sort | uniq -c | tr '\n' ' ')
    note "sass $so: LDL/STL in wgmma kernels: $n | bf16 exact 192/256 kernels: $g"
done
grep -h "spill" "$LOG"/build-*.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -5 | sed 's/^/ptxas spills: /' | tee -a "$SUMMARY"

# 3. Correctness: the GPU tests on the default, a float64 check of every variant, memcheck beside them.
DRV=/tmp/fk_memcheck_drv
mkdir -p $DRV
( nvcc -O2 -std=c++17 -I flash_kernel/include bench/fk_memcheck.cpp -o $DRV/fk_memcheck -ldl >$DRV/build.log 2>&1 &&
  FK_DRIVER_DIMS=160,192,200,256 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 60 compute-sanitizer --tool memcheck \
    --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck build/sm_90a/libflash_kernel.so >"$LOG/memcheck.log" 2>&1
  echo "memcheck rc=$?" >> "$LOG/memcheck.log"
  # racecheck (shared-memory hazards) after it: small shapes, fp16/bf16, the flash path alone
  FK_DRIVER_DIMS=160,192,256 FK_DRIVER_SMALL=1 FK_DRIVER_FLASH_ONLY=1 timeout -k 5 60 compute-sanitizer --tool racecheck \
    --racecheck-report all --error-exitcode 9 --print-limit 20 $DRV/fk_memcheck build/sm_90a/libflash_kernel.so \
    >"$LOG/racecheck.log" 2>&1
  echo "racecheck rc=$?" >> "$LOG/racecheck.log" ) &
MC=$!
WIDE_DIMS="136 or 144 or 152 or 160 or 168 or 176 or 184 or 192 or 200 or 208 or 216 or 224 or 232 or 240 or 248 or 256"
timeout -k 5 80 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernel_gpu.py -k \
    "sm_90a and not float32 and (test_wide_head_dims or ((test_every_head_dim or test_other_head_dims or test_many_work_items) and ($WIDE_DIMS)))" \
    >"$LOG/pytest.log" 2>&1
note "pytest (default, head dims 136..256) rc=$? ($(el) s): $(tail -1 "$LOG/pytest.log")"
grep -E "^(FAILED|ERROR)" "$LOG/pytest.log" | head -6 | tee -a "$SUMMARY"
timeout -k 5 60 python3 bench/check_variants.py --dims 136-256/8 --cases ragged "${LIBS[@]}" >"$LOG/variants-check.log" 2>&1
note "variants vs float64 rc=$? ($(el) s): $(grep -E '^[a-z0-9_@,]+: ' "$LOG/variants-check.log" | tr '\n' ' ')"
wait $MC
note "memcheck (default; d 160,192,200,256): $(grep -E 'ERROR SUMMARY|calls|rc=' "$LOG/memcheck.log" | tr '\n' ' ')"
note "racecheck (default; d 160,192,256, small): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|calls|rc=' "$LOG/racecheck.log" | tr '\n' ' ')"

# 4. Timing through the public call, the variants beside it, SDPA-flash and SDPA-cuDNN, call by call.
LIBARGS=()
for l in "${LIBS[@]}"; do LIBARGS+=(--lib "$l"); done
bench() {  # dtype shapes...
    local dt=$1; shift
    local args=()
    for s in "$@"; do args+=(--shape "$s"); done
    timeout -k 5 90 python3 bench/kernel_bench.py "${args[@]}" --dtype "$dt" "${LIBARGS[@]}" \
        --torch-methods sdpa_flash,sdpa_cudnn --warmup 2 --repeats 10 --rotate 2 --json "$OUT/bench-$dt.json" \
        >"$LOG/bench-$dt.txt" 2>&1
    note "bench $dt rc=$? ($(el) s)"
}
# shellcheck disable=SC2086
bench bf16 $WIDE_SHAPES
# shellcheck disable=SC2086
[ -n "$WIDE_FP16_SHAPES" ] && bench fp16 $WIDE_FP16_SHAPES

cp "$SUMMARY" "$LOG/" && tar czf "$OUT/logs.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")"
echo "==== summary"
cat "$SUMMARY"
for dt in bf16 fp16; do
    [ -f "$OUT/bench-$dt.json" ] || continue
    echo "==== $dt: ms (TFLOP/s), x cuDNN [95 % interval]"
    python3 - "$OUT/bench-$dt.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if "median_ms" not in r:
        print(",".join(map(str, r["shape"])), r["method"], r.get("error", "")[:80]); continue
    ci = r.get("x_sdpa_cudnn_ci95", (float("nan"),) * 2)
    print(f'{",".join(map(str, r["shape"])):<22} {r["method"]:<12} {r.get("path") or "":<8} {r["median_ms"]:7.3f} ({r["tflops"]:4.0f}) '
          f'x cuDNN {r.get("x_sdpa_cudnn", float("nan")):.2f} [{ci[0]:.2f}, {ci[1]:.2f}]  x flash {r.get("x_sdpa_flash", float("nan")):.2f}  relL2 {r.get("rel_l2_vs_reference", float("nan")):.1e}')
PY
done
}  # end of run_wide

# ==================================================================================================
# wide-pv
# Head-dim bucket 256 on the Hopper path, P V as one wide wgmma (the default) against one n64 wgmma
# per column block (-DFK_WGMMA_WIDE_PV_D256=0), then the user's view of the default library, in one
# device run on an NVIDIA H200 (about 5 minutes):
#   1. `sovereign-audit build` of the default libraries (sm_90a, sm_90, cpu) into build/
#   2. tests/test_kernel_gpu.py on them (float64 reference, fresh random inputs, NaN-poisoned outputs)
#   3. bench/kernel_bench.py at head dims 160, 192, 256, bf16 and fp16: the wide default, the n64
#      comparison build, the sm_90 (mma.sync) library, SDPA-flash and SDPA-cuDNN in turns call by call
#   4. the user-view run on the same build (every DiT shape through the public call, fp16 at
#      the long-sequence goals, the host cost of one call; with USER_BUDGET_S (default 240) raised,
#      SANITIZE=1's memcheck/racecheck and the research object too)
#   OUT=/tmp/wide bash bench/device.sh wide-pv
register wide-pv 'bucket 256 with its wide P V against -DFK_WGMMA_WIDE_PV_D256=0 (the kernel run), then the user-view run on the same build'
run_wide_pv() {
OUT=${OUT:-/tmp/wide_pv_out}
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m audit build --target sm_90a --target sm_90 --target cpu --out build >"$OUT/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - START )) s)" | tee "$OUT/top.txt"
FK_BUILD=build FK_LIBS="sm_90 sm_90a" FK_STAGES="test bench" PYTEST_ADDOPTS="-n 8 -q" FK_TEST_TIMEOUT=110 \
    FK_BENCH_TIMEOUT=70 FK_SLOW_PATHS= FK_DTYPE="bf16 fp16" \
    FK_VARIANTS="pv64@160,192,256:-DFK_WGMMA -DFK_WGMMA_WIDE_PV_D256=0" \
    FK_SHAPES="1,16,16384,160 1,16,16384,192 1,12,16384,256" \
    FK_BENCH_ARGS="--torch-methods sdpa_flash,sdpa_cudnn --warmup 2 --rotate 2" \
    OUT="$OUT/kernel" bash bench/device.sh kernel >"$OUT/kernel.log" 2>&1
echo "kernel run rc=$? ($(( $(date +%s) - START )) s)" | tee -a "$OUT/top.txt"
OUT="$OUT/user" BUDGET_S=${USER_BUDGET_S:-240} SANITIZE=${SANITIZE:-} bash bench/device.sh user-view >"$OUT/user.log" 2>&1
echo "user view rc=$? ($(( $(date +%s) - START )) s)" | tee -a "$OUT/top.txt"
echo "==== kernel (wide P V vs n64)"; cat "$OUT/kernel/summary.txt" 2>/dev/null
grep -vE "^#" "$OUT/kernel/bench.txt" 2>/dev/null | grep -v "^shape " | tail -30
echo "==== user view"; tail -60 "$OUT/user.log"
cat "$OUT/top.txt"
}  # end of run_wide_pv

# ==================================================================================================
# lse
# The log-sum-exp (flash_kernel.attention(..., return_lse=True)) on one GPU: its GPU tests at every
# head dim on the sm_90a (wgmma), sm_90 (mma.sync) and sm_90-generic builds, then its cost as users
# call it: bench/kernel_bench.py --lse times the public call with and without it in turns at every
# diffusion-transformer shape (the cost line: median with lse / median without, 95 % interval).
# ALL_TESTS=1: every GPU test (kernels, binding, placement), not only the lse ones. SANITIZE=1:
# memcheck on SANITIZE_LIBS (default: the three CUDA builds) and racecheck on the tensor-core ones, over
# the driver's calls (every other dtype and layout asks for the lse) at the head dims of
# SANITIZE_DIMS (default 64,72,128,256).
#   OUT=/tmp/lse bash bench/device.sh lse       # BUDGET_S (default 540); PREBUILT=1 uses build/
register lse 'the log-sum-exp on one GPU: its GPU tests on every CUDA build, then its cost over the plain public call (kernel_bench --lse)'
run_lse() {
begin_run /tmp/lse_out 540
build_unless_prebuilt sm_90a sm_90 sm_90-generic
if [ -n "${ALL_TESTS:-}" ]; then
    timeout -k 5 $(( $(left) / 2 )) python3 -m pytest -q -p no:cacheprovider -rs -m gpu -n 8 tests/test_kernel_gpu.py \
        tests/test_binding.py tests/test_cuda_placement.py >"$OUT/tests.log" 2>&1
    note "GPU tests rc=$? ($(el) s): $(tail -1 "$OUT/tests.log")"
    grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/tests.log" | head -8 | tee -a "$SUMMARY"
else
    timeout -k 5 $(( $(left) / 2 )) python3 -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py -k lse -x \
        >"$OUT/tests.log" 2>&1
    note "lse GPU tests rc=$? ($(el) s): $(tail -1 "$OUT/tests.log")"
fi
if [ -n "${SANITIZE:-}" ]; then
    SL=${SANITIZE_LIBS:-"sm_90a sm_90 sm_90-generic"}
    FK_BUILD=build FK_LIBS="$SL" FK_STAGES=memcheck FK_MEMCHECK_LIBS="$SL" FK_MEMCHECK_TIMEOUT=90 \
        FK_DRIVER_DIMS=${SANITIZE_DIMS:-64,72,128,256} OUT="$OUT/memcheck" bash bench/device.sh kernel >"$OUT/memcheck.log" 2>&1
    FK_BUILD=build FK_LIBS="sm_90a sm_90" FK_STAGES=racecheck FK_RACECHECK_LIBS="sm_90a sm_90" FK_RACECHECK_TIMEOUT=90 \
        FK_DRIVER_DIMS=${SANITIZE_DIMS:-64,72,128,256} FK_DRIVER_MAX_N=77 OUT="$OUT/racecheck" bash bench/device.sh kernel \
        >"$OUT/racecheck.log" 2>&1
    grep -hE "^(memcheck|racecheck)" "$OUT/memcheck/summary.txt" "$OUT/racecheck/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi
timeout -k 5 $(( $(left) - 10 )) python3 bench/kernel_bench.py --preset dit --lse --torch-methods '' --repeats 30 \
    --json "$OUT/lse_bench.json" >"$OUT/lse_bench.txt" 2>&1
note "kernel_bench --lse rc=$? ($(el) s)"
grep "return_lse cost" "$OUT/lse_bench.txt" | tee -a "$SUMMARY"
}  # end of run_lse

# ==================================================================================================
# fp8
# The FP8 kernel (precision="fp8": INT8 Q K^T with K smoothed, e4m3 P V) on one cc 9.0 GPU:
#   1. a smoke call per bucket (head dims 64 and 128) under a 60 s limit, so a hang shows at once,
#      then bench/fp8_probe.py (the workspace against fp8.py's operands, the output per row block
#      and column group, V = I): a wrong kernel stops after its tests and memcheck;
#   2. its GPU tests (tests/test_fp8_gpu.py: against flash_kernel.fp8.reference and float64 at every
#      head dim 32..128, dtypes, layouts, the lse, DiT-shaped inputs, Nk 32k, B*H past 65535);
#   3. memcheck and racecheck over the driver's fp8 calls (FK_DRIVER_FP8, exact-size workspaces)
#      on the sm_90a build at SANITIZE_DIMS (default 32,64,72,128);
#   4. its speed beside ours exact and SDPA-cuDNN at every --preset dit shape and the long video
#      presets (kernel_bench --fp8: TFLOP/s dense-equivalent, quantization inside the timed call;
#      "fp8 speedup" lines: median ours / median ours_fp8 with the 95 % interval).
#   5. FP8_VARIANTS (default: "single128", P V summed in O itself (one level) at head dim 128,
#      the form that waits on its accumulator model) built beside it, smoke-tested (wait_variants) and timed at
#      precision fp8 only in the same kernel_bench call ("fp8 NAME at" lines: the variant's median
#      over ours_fp8's, 95 % interval; its relL2 column against SDPA shows its error);
#      FP8_VARIANTS= builds none.
#   OUT=/tmp/fp8 PREBUILT=1 bash bench/device.sh fp8     # BUDGET_S (default 570)
register fp8 'the FP8 kernel on one cc 9.0 GPU: a smoke call, its GPU tests, memcheck and racecheck, then its speed beside ours exact and SDPA-cuDNN (kernel_bench --fp8)'
run_fp8() {
begin_run /tmp/fp8_out 570
build_unless_prebuilt sm_90a cpu
# FP8_VARIANTS ("name:-DFLAG ...;..."): built now in the background, timed beside ours_fp8 in the
# same kernel_bench call ("fp8 NAME at" lines)
VB=build/variants LOG=$OUT PIDS=() LIBS=()
IFS=';' read -r -a FP8_VARS <<< "${FP8_VARIANTS-single128:-DFK_FP8_SINGLE_LEVEL_D128=1}"
build_variants 240 "${FP8_VARS[@]}"
timeout -k 5 60 python3 - >"$OUT/smoke.txt" 2>&1 <<'PY'
import torch, flash_kernel
from flash_kernel import fp8
lib = flash_kernel.load("build/sm_90a/libflash_kernel.so")
for d in (64, 128):
    g = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(1, 2, n, d, generator=g).bfloat16() for n in (300, 700, 700))
    out = lib.fp8_attention(q.cuda(), k.cuda(), v.cuda())
    torch.cuda.synchronize()
    ref = fp8.reference(q, k, v)
    s = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / d ** 0.5, -1) @ v.double()
    rel = lambda a, b: ((a.double().cpu() - b.double()).norm() / b.double().norm()).item()
    print(f"smoke d{d}: path {lib.last_flash_path()} finite {bool(torch.isfinite(out).all())} "
          f"rel-L2 vs fp8.reference {rel(out, ref):.2e}, vs float64 {rel(out, s):.2e} (reference's own {rel(ref, s):.2e})")
    # far from its own reference (half the reference's distance to float64): the kernel is wrong
    if not (torch.isfinite(out).all() and rel(out, ref) <= 0.5 * rel(ref, s) + 1e-3):
        raise SystemExit(3)
PY
smoke=$?
note "fp8 smoke rc=$smoke ($(el) s)"
tee -a "$SUMMARY" < "$OUT/smoke.txt" | tail -4
# stage by stage: the quantization's workspace against fp8.py, the attention per block and column
timeout -k 5 90 python3 bench/fp8_probe.py >"$OUT/probe.txt" 2>&1
note "fp8 probe rc=$? ($(el) s)"
tee -a "$SUMMARY" < "$OUT/probe.txt" | tail -8
# a wrong kernel stops after its tests (the first failures) and memcheck: its speed means nothing
[ "$smoke" = 0 ] && maxfail= || maxfail=--maxfail=12
timeout -k 5 $(( $(left) / 3 )) python3 -m pytest -q -p no:cacheprovider -rs $maxfail tests/test_fp8_gpu.py >"$OUT/tests.log" 2>&1
note "fp8 GPU tests rc=$? ($(el) s): $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)|^E  " "$OUT/tests.log" | head -12 | tee -a "$SUMMARY"
FK_BUILD=build FK_LIBS=sm_90a FK_STAGES=memcheck FK_MEMCHECK_LIBS=sm_90a FK_MEMCHECK_TIMEOUT=90 FK_DRIVER_FP8=1 \
    FK_DRIVER_DIMS=${SANITIZE_DIMS:-32,64,72,128} OUT="$OUT/memcheck" bash bench/device.sh kernel >"$OUT/memcheck.log" 2>&1
if [ "$smoke" != 0 ]; then
    grep -hE "^memcheck" "$OUT/memcheck/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
    note "fp8 kernel wrong: racecheck and speed skipped"
    return 0
fi
FK_BUILD=build FK_LIBS=sm_90a FK_STAGES=racecheck FK_RACECHECK_LIBS=sm_90a FK_RACECHECK_TIMEOUT=90 FK_DRIVER_FP8=1 \
    FK_DRIVER_DIMS=${SANITIZE_DIMS:-32,64,72,128} FK_DRIVER_MAX_N=77 OUT="$OUT/racecheck" bash bench/device.sh kernel \
    >"$OUT/racecheck.log" 2>&1
grep -hE "^(memcheck|racecheck)" "$OUT/memcheck/summary.txt" "$OUT/racecheck/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
wait_variants fp8
timeout -k 5 $(( $(left) - 10 )) python3 bench/kernel_bench.py --preset dit --preset hunyuanvideo-720p --preset mochi \
    --preset cogvideox-5b --preset ltx-video --fp8 --torch-methods sdpa_cudnn --repeats 10 --warmup 2 \
    --lib-fp8-only "${VARIANT_ARGS[@]}" --json "$OUT/fp8_bench.json" >"$OUT/fp8_bench.txt" 2>&1
note "kernel_bench --fp8 rc=$? ($(el) s)"
grep -E "ours_fp8|fp8 speedup|^fp8 " "$OUT/fp8_bench.txt" | tee -a "$SUMMARY"
}  # end of run_fp8

# ===================================================================================================
# dit-forward
# One diffusers DiT forward end to end (bench/dit_forward.py: WanTransformer3DModel, random weights
# in bf16) with SDPA-cuDNN, ours exact and ours fp8 in turns: median forward time, speed over cuDNN,
# the output's rel-L2 from cuDNN's, the attention kernels' share of the forward's GPU time and the
# speed-up Amdahl's law predicts from it. diffusers and its dependencies travel as wheels in .whl/
# (the device's transformers wants huggingface-hub below 2.0).
#   OUT=/tmp/dit PREBUILT=1 bash bench/device.sh dit-forward   # MODEL (wan-1.3b), SIZES ("720p"),
#                                                              # REPEATS (3), BUDGET_S (540),
#                                                              # FP8_MIN_KEYS (0; 16384: cross-attn exact)
register dit-forward 'one diffusers Wan DiT forward with SDPA-cuDNN, ours exact and ours fp8 in turns (bench/dit_forward.py): speed, error, the attention share against Amdahl'
run_dit_forward() {
begin_run /tmp/dit_out 540
build_unless_prebuilt sm_90a cpu
for size in ${SIZES:-720p}; do
    timeout -k 5 $(( $(left) - 10 )) python3 bench/dit_forward.py --model "${MODEL:-wan-1.3b}" --size "$size" \
        --repeats "${REPEATS:-3}" --fp8-min-keys "${FP8_MIN_KEYS:-0}" --json "$OUT/dit_$size.json" >"$OUT/dit_$size.txt" 2>&1
    note "dit_forward $size rc=$? ($(el) s)"
    grep -vE "Warning|_warn_once" "$OUT/dit_$size.txt" | tail -5 | tee -a "$SUMMARY"
done
}  # end of run_dit_forward

# ==================================================================================================
# fa4
# Ours against SDPA-cuDNN and FlashAttention-4 (`bench --backend fa4`), side by side in one bench
# call: every --preset dit shape and the long video presets (HunyuanVideo 720p, Mochi, CogVideoX-5B,
# LTX-Video), DTYPE (default bf16), inputs stored (B,N,H,D) as diffusers holds them (LAYOUT, default
# bnhd), REPEATS timed calls a backend (default 10), methods interleaved call by call.
# The device machine has no network: FA4_STAGE names a folder holding what bench/fa4_wheels.sh
# fetched (the wheels, and nvidia-cutlass-dsl-libs-cu13's files as cu13.part* pieces of one tar.xz),
# installed into FA4_SITE (default /tmp/site); without FA4_STAGE, FA4_SITE must already hold them.
#   OUT=/tmp/fa4 FA4_STAGE=/tmp/stage PREBUILT=1 bash bench/device.sh fa4     # BUDGET_S (default 560)
register fa4 'ours against SDPA-cuDNN and FlashAttention-4 (bench --backend fa4) at every --preset dit shape and the long video presets, in one bench call'
use_fa4() {  # FlashAttention-4 from FA4_STAGE (or already in FA4_SITE) on PYTHONPATH; the environment recorded
FA4_SITE=${FA4_SITE:-/tmp/site}
mkdir -p "$FA4_SITE"
if [ -n "${FA4_STAGE:-}" ]; then
    install_wheels "$FA4_STAGE" "$FA4_SITE" "$OUT/pip.log"
    note "fa4 wheels rc=$?"
    cat "$FA4_STAGE"/cu13.part* | xz -d | tar -x -C "$FA4_SITE"
    note "fa4 cu13 libraries rc=$?"
fi
# the CuTe DSL's Python packages sit under nvidia_cutlass_dsl/dsl_packages
export PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages:$PWD
record_env "$OUT/env.txt" python3 -c 'import importlib.metadata as m; print(*(d + " " + m.version(d) for d in ("flash-attn-4", "nvidia-cutlass-dsl")))'
}

run_fa4() {
OUT=${OUT:-/tmp/fa4_out}
BUDGET_S=${BUDGET_S:-560}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
device_common
use_fa4
if [ -z "${PREBUILT:-}" ]; then
    python3 -m audit build --target sm_90a --target cpu --out build >"$OUT/build.log" 2>&1
    note "build rc=$? ($(el) s)"
fi
timeout -k 10 $(( $(left) - 15 )) python3 -m audit bench --device cuda --dtype "${DTYPE:-bf16}" --layout "${LAYOUT:-bnhd}" \
    --preset dit --preset hunyuanvideo-720p --preset mochi --preset cogvideox-5b --preset ltx-video \
    --backend primary --backend sdpa-cudnn --backend fa4 --repeats "${REPEATS:-10}" --warmup 2 --no-progress \
    --json "$OUT/bench-fa4.json" >"$OUT/bench-fa4.txt" 2>&1
note "bench --backend fa4 rc=$? ($(el) s)"
sed -n '/^ours = /,$p' "$OUT/bench-fa4.txt" | tee -a "$SUMMARY"
}  # end of run_fa4

# ==================================================================================================
# fa4-ab
# The kernel's -D variants against the default build, SDPA-cuDNN and FlashAttention-4, in one
# kernel_bench call (methods in turns call by call, inputs stored (B,N,H,D)): BF16_VARIANTS
# ("name:-DFLAG ...;...", built here in the background) at SHAPES (default: the long video
# self-attention shapes, head dims 64 (LTX-Video among them) and 128, then the padded head
# dims), REPEATS timed calls a method (default 10). "variant NAME at" lines: ours' median over the
# variant's (above 1.0: the variant is faster), with the 95 % interval. FlashAttention-4 as for fa4.
# Each variant first runs two smoke calls (wait_variants): one that fails or hangs is left out.
#   OUT=/tmp/ab FA4_STAGE=/tmp/stage PREBUILT=1 BF16_VARIANTS="c3d64:-DFK_WGMMA_CONSUMERS_D64=3 -DFK_WGMMA_Q_REGS_D64=0;qsmem:-DFK_WGMMA_Q_REGS_D64=0" bash bench/device.sh fa4-ab
register fa4-ab 'the kernel'"'"'s -D variants (BF16_VARIANTS) beside the default build, SDPA-cuDNN and FlashAttention-4 in one kernel_bench call'
run_fa4_ab() {
begin_run /tmp/fa4_ab_out 560
use_fa4
build_unless_prebuilt sm_90a cpu
VB=build/variants LOG=$OUT PIDS=() LIBS=()
IFS=';' read -r -a AB_VARS <<< "${BF16_VARIANTS-}"
build_variants 240 "${AB_VARS[@]}"
wait_variants exact
note "variants built and smoke-tested ($(el) s)"
read -r -a SHAPE_ARGS <<< "${SHAPES:---preset wan2.1-14b-720p --preset hunyuanvideo-720p --preset mochi --preset cogvideox-5b --preset ltx-video --shape 1,12,32760,128 --shape 1,30,17776,64 --shape 1,16,16384,32 --shape 1,16,17550,72 --shape 1,24,16384,80 --shape 1,24,16384,96}"
timeout -k 5 $(( $(left) - 10 )) python3 bench/kernel_bench.py "${SHAPE_ARGS[@]}" --layout bnhd \
    --torch-methods sdpa_cudnn,fa4 --repeats "${REPEATS:-10}" --warmup 2 "${VARIANT_ARGS[@]}" \
    --json "$OUT/ab.json" >"$OUT/ab.txt" 2>&1
note "kernel_bench fa4-ab rc=$? ($(el) s)"
grep -E "^[0-9]|^variant " "$OUT/ab.txt" | grep -vE " (sdpa_cudnn|fa4) " | cut -c1-150 | tee -a "$SUMMARY"
}  # end of run_fa4_ab

# ==================================================================================================
# context-parallel
# Our kernel under diffusers' context parallelism on 2 GPUs (one process a GPU, NCCL; the device
# kind nvidia-h200-x2; keep the NVLink-multicast settings the device notes give):
#   1. bench/context_parallel.py under torchrun: diffusers' WanTransformer3DModel at the
#      Wan2.1-T2V-14B 720p shape (random weights, 75600 tokens), one DiT forward, ours against
#      SDPA-cuDNN (diffusers' _native_cudnn backend) unsplit on one GPU, then under Ulysses 2 and
#      ring 2: seconds, speedup over one GPU, scaling efficiency, ours over cuDNN, the NCCL share
#   2. the binding's test on the second GPU (tests/test_cuda_placement.py, cuda:1), and the diffusers
#      backend's context-parallel tests on the GPUs (tests/test_diffusers_context_parallel.py, NCCL)
#   3. with time left, `sovereign-audit pipeline --ulysses 2` (wan-480p, STEPS steps, flash and
#      sdpa-cudnn) under torchrun
# Knobs: GPUS (default 2), LAYERS (default 40: the 14B model), REPEATS (default 2), STEPS (default 2),
# BUDGET_S (default 570), PREBUILT=1 (use build/). Carry .whl (diffusers) and, with PREBUILT, build.
#   OUT=/tmp/cp bash bench/device.sh context-parallel
register context-parallel 'Wan2.1-14B 720p DiT forward on 2 GPUs: Ulysses 2 and ring 2, ours vs SDPA-cuDNN, against one GPU; the cuda:1 test; pipeline --ulysses 2'
run_context_parallel() {
GPUS=${GPUS:-2}
begin_run /tmp/context_parallel_out 570 python3 -c 'import diffusers; print("diffusers", diffusers.__version__)'
build_unless_prebuilt sm_90a cpu
# one forward of the 14B model at 75600 tokens: ~12 s on one H200 (~9 s of it attention); each
# (split, attention) runs 1 + REPEATS + 1 (profiled) forwards: ~4-5 minutes at REPEATS=2
timeout -k 10 $(( $(left) - 180 )) torchrun --nproc-per-node "$GPUS" bench/context_parallel.py \
    --layers "${LAYERS:-40}" --repeats "${REPEATS:-2}" --json "$OUT/context_parallel.json" >"$OUT/context_parallel.txt" 2>&1
note "context_parallel rc=$? ($(el) s)"
grep -vE "^\[|Warning|warn" "$OUT/context_parallel.txt" | tail -12 | tee -a "$SUMMARY"
timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_placement.py -k second_gpu >"$OUT/cuda1.log" 2>&1
note "cuda:1 test rc=$? ($(el) s): $(tail -1 "$OUT/cuda1.log")"
timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider tests/test_diffusers_context_parallel.py -k gpus >"$OUT/cp_tests.log" 2>&1
note "context-parallel GPU tests (NCCL) rc=$? ($(el) s): $(tail -1 "$OUT/cp_tests.log")"
if [ "$(left)" -gt 120 ]; then
    timeout -k 10 $(( $(left) - 10 )) torchrun --nproc-per-node "$GPUS" -m audit.cli pipeline --preset wan-480p \
        --ulysses "$GPUS" --steps "${STEPS:-2}" --attention sdpa-cudnn,flash --no-decode --no-calibrate \
        --json "$OUT/pipeline_ulysses.json" >"$OUT/pipeline_ulysses.log" 2>&1
    note "pipeline --ulysses $GPUS rc=$? ($(el) s)"
    grep -E "^(pipeline|context|attention|sdpa|flash)" "$OUT/pipeline_ulysses.log" | tee -a "$SUMMARY"
fi
}  # end of run_context_parallel

# ---------------------------------------------------------------------------------------------------
# The command line.
fail_usage() { echo "error: $*" >&2; exit 2; }  # one line; exit 2: a usage error

list_runs() {
    local n
    for n in "${RUN_NAMES[@]}"; do printf '%-16s %s\n' "$n" "${RUN_DESC[$n]}"; done
}

dry_run() {  # NAME: what the run would do, from its source; nothing is run
    local name=$1 fn=run_${1//-/_} src first last var
    first=$(grep -n "^register $name " "$SELF" | cut -d: -f1)
    while sed -n "$((first - 1))p" "$SELF" | grep -qE '^#( [^=].*)?$'; do first=$((first - 1)); done
    last=$(grep -n "^}  # end of $fn\$" "$SELF" | cut -d: -f1)
    src=$(sed -n "${first},${last}p" "$SELF")
    echo "run: $name: ${RUN_DESC[$name]}"
    echo "from: $ROOT"
    echo "settings given: ${GIVEN[*]:-none}"
    echo "settings it reads (value now; unset: the run's default):"
    # the settings the shared helpers it calls read count as its own
    local helpers="" h
    for h in begin_run build_unless_prebuilt; do
        grep -qE "^$h( |\$)" <<< "$src" && helpers+=$(declare -f "$h")$'\n'
    done
    for var in $(grep -oE '\$\{[A-Z_][A-Z0-9_]*(:?[-+=]|\})' <<< "$src$helpers" | sed -E 's/^\$\{//; s/[:}+=-]+$//' | sort -u); do
        case $var in PIDS|LIBS|VARS|ARGS|SHAPE_ARGS|VARIANT_LIBS|VARIANT_NVCC|LIBARGS|FAILED|ARTIFACTS|TARGETS|KT|WG_CHECK|MMA_CHECK|L|PIPESTATUS) continue ;; esac
        if [ -n "${!var+x}" ]; then echo "  $var=${!var}"; else echo "  $var (unset)"; fi
    done
    local nested
    nested=$(sed -n "/^$fn() {\$/,\$p" <<< "$src" | grep -oE 'bash bench/device\.sh [a-z][a-z0-9-]*' | awk '{print $3}' | sort -u | tr '\n' ' ')
    [ -n "$nested" ] && echo "runs it starts: $nested(each: bash bench/device.sh --dry-run NAME)"
    echo "what it does (bench/device.sh lines $first-$last):"
    echo "$src"
    echo "dry run: nothing was built, run or written"
}

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$(dirname "$(dirname "$SELF")")
DRY=
case ${1:-} in
    --list) list_runs; exit 0 ;;
    -h|--help) sed -n '2,/^$/p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --dry-run) DRY=1; shift ;;
    "") fail_usage "no run named (bash bench/device.sh --list shows them)" ;;
    -*) fail_usage "unknown option $(printf '%q' "$1") (bash bench/device.sh --help)" ;;
esac
NAME=${1:-}
[ -n "$NAME" ] || fail_usage "no run named (bash bench/device.sh --list shows them)"
shift
[ -n "${RUN_DESC[$NAME]+x}" ] || fail_usage "no run named $(printf '%q' "$NAME") (bash bench/device.sh --list shows them)"
GIVEN=()
for a in "$@"; do
    [[ $a =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail_usage "$(printf '%q' "$a") is not VAR=VALUE (a run's settings follow its name)"
    GIVEN+=("$a")
    export "${a?}"
done
cd "$ROOT" || { echo "error: cannot enter $ROOT" >&2; exit 2; }
[ -n "$DRY" ] && { dry_run "$NAME"; exit 0; }
( set -u; "run_${NAME//-/_}" )
exit $?

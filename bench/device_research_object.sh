#!/usr/bin/env bash
# The signed research object of the default CUDA library, and the sanitizers on it, in one device
# run on an NVIDIA GPU (about 5-6 minutes on an H200):
#   1. `sovereign-audit build` of the default libraries (sm_90a, cpu) into build/
#   2. compute-sanitizer memcheck and racecheck on the sm_90a library (bench/device_kernel.sh's driver:
#      every head-dim bucket, small shapes, exact-size cudaMalloc buffers)
#   3. `sovereign-audit run --device cuda` (build, audit, parity, bench, the Wan2.1 DiT pipeline with
#      SDPA-cuDNN as the reference, report, signatures), an RDNA2 (gfx1030) build carried in
#      .device/gfx1030/ audited beside it; then `sovereign-audit verify` on the bundle
# Needs diffusers and cryptography: where the machine lacks them, carry their wheels in .whl/.
# Results under $OUT (the bundle as research-object.tgz, the logs as logs.tgz); a summary prints last.
#   OUT=/tmp/ro_out bash bench/device_research_object.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/research_object_out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1
SUMMARY=$LOGS/summary.txt
. bench/device_common.sh
. bench/device_wheels.sh
use_carried_wheels "$LOGS/pip.log"
python3 -m audit build --target sm_90a --target cpu --out build >"$LOGS/build.log" 2>&1
note "build rc=$? ($(el) s)"

FK_BUILD=build FK_LIBS=sm_90a FK_STAGES="memcheck racecheck" FK_MEMCHECK_LIBS=sm_90a FK_RACECHECK_LIBS=sm_90a \
    FK_MEMCHECK_TIMEOUT=${FK_MEMCHECK_TIMEOUT:-100} FK_RACECHECK_TIMEOUT=${FK_RACECHECK_TIMEOUT:-100} \
    OUT="$LOGS/sanitize" bash bench/device_kernel.sh >"$LOGS/sanitize.log" 2>&1
grep -E "^(memcheck|racecheck)" "$LOGS/sanitize/summary.txt" | tee -a "$LOGS/summary.txt"
note "sanitizers done ($(el) s)"

ARTIFACTS=()
if [ -f .device/gfx1030/libflash_kernel.so ]; then
    mkdir -p build/gfx1030 && cp .device/gfx1030/libflash_kernel.so build/gfx1030/
    ARTIFACTS=(--artifact build/gfx1030/libflash_kernel.so)
fi
rm -rf /tmp/ro
timeout -k 5 ${RUN_TIMEOUT:-330} python3 -m audit run --out /tmp/ro --device cuda --target sm_90a --target cpu \
    "${ARTIFACTS[@]}" --build-dir build --repeats 10 --pipeline-steps 2 >"$LOGS/run.log" 2>&1
note "run rc=$? ($(el) s)"
python3 -m audit verify /tmp/ro >"$LOGS/verify.log" 2>&1
note "verify rc=$?: $(tail -1 "$LOGS/verify.log")"
[ -d /tmp/ro ] && tar czf "$OUT/research-object.tgz" -C /tmp ro
tar czf "$OUT/logs.tgz" -C "$LOGS" .
echo "==== run"; tail -25 "$LOGS/run.log"
echo "==== summary"; cat "$LOGS/summary.txt"

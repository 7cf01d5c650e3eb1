#!/usr/bin/env bash
# Head-dim bucket 256 on the Hopper path, P V as one wide wgmma (the default) against one n64 wgmma
# per column block (-DFK_WGMMA_WIDE_PV_D256=0), then the user's view of the default library, in one
# device run on an NVIDIA H200 (about 5 minutes):
#   1. `sovereign-audit build` of the default libraries (sm_90a, sm_90, cpu) into build/
#   2. tests/test_kernel_gpu.py on them (float64 reference, fresh random inputs, NaN-poisoned outputs)
#   3. bench/kernel_bench.py at head dims 160, 192, 256, bf16 and fp16: the wide default, the n64
#      comparison build, the sm_90 (mma.sync) library, SDPA-flash and SDPA-cuDNN in turns call by call
#   4. bench/device_user_view.sh on the same build (every DiT shape through the public call, fp16 at
#      the long-sequence goals, the host cost of one call; with USER_BUDGET_S (default 240) raised,
#      SANITIZE=1's memcheck/racecheck and the research object too)
#   OUT=/tmp/wide bash bench/device_wide_pv.sh
set -u
cd "$(dirname "$0")/.."
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
    OUT="$OUT/kernel" bash bench/device_kernel.sh >"$OUT/kernel.log" 2>&1
echo "device_kernel rc=$? ($(( $(date +%s) - START )) s)" | tee -a "$OUT/top.txt"
OUT="$OUT/user" BUDGET_S=${USER_BUDGET_S:-240} SANITIZE=${SANITIZE:-} bash bench/device_user_view.sh >"$OUT/user.log" 2>&1
echo "user view rc=$? ($(( $(date +%s) - START )) s)" | tee -a "$OUT/top.txt"
echo "==== kernel (wide P V vs n64)"; cat "$OUT/kernel/summary.txt" 2>/dev/null
grep -vE "^#" "$OUT/kernel/bench.txt" 2>/dev/null | grep -v "^shape " | tail -30
echo "==== user view"; tail -60 "$OUT/user.log"
cat "$OUT/top.txt"

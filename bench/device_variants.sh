#!/usr/bin/env bash
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
#   OUT=/tmp/v FK_VARIANTS="nostages:-DFK_WGMMA_STAGES_D128=2" bash bench/device_variants.sh
#   BUDGET_S (default 300) bounds the run; FK_REPEATS (default 10) timed calls per method and shape
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/variants_out}
BUDGET_S=${BUDGET_S:-300}
VB=build/variants
LOG=/tmp/variants_logs
mkdir -p "$OUT" "$VB" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
. bench/device_common.sh
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

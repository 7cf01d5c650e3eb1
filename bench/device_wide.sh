#!/usr/bin/env bash
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
#   OUT=/tmp/wide bash bench/device_wide.sh
#   WIDE_SET=all|confirm, or WIDE_VARIANTS="name[@D,...]:-DFLAG ...;..." (empty: the default alone);
#   WIDE_SHAPES, WIDE_FP16_SHAPES
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/wide_out}
VB=${VB:-build/wide}   # variant builds
LOG=${LOG:-/tmp/wide_logs}
mkdir -p "$OUT" "$VB" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
. bench/device_common.sh

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

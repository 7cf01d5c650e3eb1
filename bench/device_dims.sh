#!/usr/bin/env bash
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
#   OUT=/tmp/d WG_LIBS="base@32,64" MMA_LIBS="l2@256" bash bench/device_dims.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dims_out}
BUDGET_S=${BUDGET_S:-300}
VB=build/variants
LOG=/tmp/dims_logs
mkdir -p "$OUT" "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLASH_KERNEL_BUILD=$PWD/build
. bench/device_common.sh
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

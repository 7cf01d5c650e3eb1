#!/usr/bin/env bash
# device_kernel.sh: the one script for a kernel run on an NVIDIA GPU. It builds the sm_90,
# sm_90-generic and tuning-variant libraries (or uses carried builds under $FK_BUILD), runs the GPU
# tests, runs compute-sanitizer memcheck over the test shapes (exact-size cudaMalloc buffers, so an
# out-of-bounds access cannot hide in a caching allocator's slack), then times every variant side by
# side with PyTorch (bench/kernel_bench.py). Logs go to $OUT; a short table prints last.
#
#   FK_BUILD=build/h3 FK_VARIANTS="w8:-DFK_MMA_WARPS_D128=8 -DFK_MMA_WARPS_D64=8" bench/device_kernel.sh
#   FK_STAGES="test memcheck racecheck fma bench" (default all), FK_SHAPES="1,12,32760,128 1,30,17776,64"
#   FK_LIBS="sm_90a" FK_STAGES="memcheck racecheck" FK_MEMCHECK_LIBS=sm_90a FK_RACECHECK_LIBS=sm_90a: sanitizers alone
# Libraries: $FK_BUILD/{sm_90,sm_90a,sm_90-generic}/libflash_kernel.so, built here when absent (carry
# builds from `sovereign-audit build` so that the GPU tests can match them to their provenance).
set -u
cd "$(dirname "$0")/.."
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

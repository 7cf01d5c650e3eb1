#!/usr/bin/env bash
# device_survey.sh: the kernel survey in one device run, most important first (a run killed at
# its limit still returns what $OUT holds): GPU tests of sm_90a / sm_90 / sm_90-generic, the fp32
# FMA peak, racecheck and memcheck of the sm_90a library, the op bench (mma variants, wgmma, generic
# and naive against SDPA flash/cuDNN), then the wan-480p pipeline with the fastest library.
#   FK_BUILD=build/d2 FK_VARIANTS="fll:x;pipe:x" bash bench/device_survey.sh   (needs FK_BUILD and .whl)
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/fk_device_out} FK_BUILD=${FK_BUILD:-build/d2}
export FK_STAGES=${FK_STAGES:-"test fma racecheck memcheck bench"} FK_MEMCHECK_LIBS=${FK_MEMCHECK_LIBS:-sm_90a}
export FK_RACECHECK_LIBS=${FK_RACECHECK_LIBS:-sm_90a} FK_SLOW_PATHS=${FK_SLOW_PATHS-1} FK_DTYPE=${FK_DTYPE:-bf16}
export FK_BENCH_ARGS=${FK_BENCH_ARGS:-"--torch-methods sdpa_flash,sdpa_cudnn"}
export FK_SHAPES=${FK_SHAPES:-"1,12,32760,128 1,48,17776,64 2,32,6144,64"}
export FK_MEMCHECK_TIMEOUT=${FK_MEMCHECK_TIMEOUT:-100} FK_RACECHECK_TIMEOUT=${FK_RACECHECK_TIMEOUT:-80}
export FK_TEST_TIMEOUT=${FK_TEST_TIMEOUT:-150}
bash bench/device_kernel.sh > "$OUT/kernel.log" 2>&1
if [ "${FK_PIPELINE:-1}" = 1 ]; then
    FLASH_KERNEL_BUILD=$FK_BUILD OUT=$OUT/pipeline STEPS=${STEPS:-2} ATTENTION=${ATTENTION:-naive,flash} \
        timeout ${FK_PIPELINE_TIMEOUT:-240} bash bench/device_pipeline.sh > "$OUT/pipeline.log" 2>&1
    echo "pipeline exit $?" >> "$OUT/summary.txt"
fi
# $OUT returns at most 8 files: the logs travel as one archive
(cd "$OUT" && tar -czf logs.tgz --remove-files $(ls kernel.log pytest.log memcheck.log racecheck.log pipeline.log 2>/dev/null))
echo "==== summary"; cat "$OUT/summary.txt"; cat "$OUT/env.txt"
grep -vE "^#" "$OUT/bench.txt" 2>/dev/null | grep -v "^shape " | tail -40
tar -xzOf "$OUT/logs.tgz" pipeline.log 2>/dev/null | grep -E "speedup|Amdahl|share|s/step|DiT|kernel library" | tail -20

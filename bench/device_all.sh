#!/usr/bin/env bash
# The evidence of a release in one device run: GPU tests, parity and op timing
# (bench/device_evidence.sh), then the end-to-end Wan2.1 pipeline (bench/device_pipeline.sh),
# inside one 10-minute command. Carry: build/sm_90, build/sm_90-generic, .whl (diffusers).
#   bash bench/device_all.sh        # results: $OUT/results.tgz, $OUT/summary.txt
set -u
cd "$(dirname "$0")/.."
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
BUDGET_S=${EVIDENCE_S:-220} OUT="$WORK/ev" bash bench/device_evidence.sh >"$WORK/evidence.log" 2>&1
echo "evidence rc=$?" >>"$WORK/summary.txt"

# 3. End to end: naive (pre-flash) vs flash in every self-attention of Wan2.1-1.3B at 480p.
STEPS=${STEPS:-2} ATTENTION=${ATTENTION:-naive,flash} OUT="$WORK/pipe" \
    timeout -k 10 ${PIPELINE_S:-280} bash bench/device_pipeline.sh >"$WORK/pipeline.log" 2>&1
echo "pipeline rc=$?" >>"$WORK/summary.txt"

tar czf "$OUT/results.tgz" -C "$WORK" .
cp "$WORK/summary.txt" "$OUT/summary.txt"
cat "$WORK/summary.txt"
echo "--- evidence table"; sed -n '/=== parity/,$p' "$WORK/evidence.log" | head -60
echo "--- pipeline"; tail -n 25 "$WORK/pipeline.log"

#!/usr/bin/env bash
# Parity and op timing of our CUDA library on the H200, in one run of < 8 minutes.
#
#   OUT=/some/dir bash bench/device_evidence.sh      (run from the repository root)
#
# Needs build/sm_90/libflash_kernel.so and build/sm_90-generic/libflash_kernel.so (built on the
# CPU machine and carried), python3 with torch, click, rich and numpy (the device image has them).
# Writes $OUT/environment.json, $OUT/parity-*.json, $OUT/bench-*.json and a log per step, and prints
# a short table last. A step that fails or hits its time limit is reported; the others still run.
# Exit status: 0 when every step exited 0, else 1 (the table says which).
#
# A CPU rehearsal of the whole flow (tiny shapes, our CPU library):
#   SMOKE=1 DEVICE=cpu TARGET=cpu GENERIC_TARGET=cpu GENERIC_LABEL=cpu-again bash bench/device_evidence.sh

set -u
cd "$(dirname "$0")/.."
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

#!/usr/bin/env bash
# The end-to-end Wan2.1-T2V-1.3B measurement on the H200 (480x832, 81 frames, 32760 tokens):
# naive (our pre-flash path, the reference), flash (our kernel) and sdpa-flash (vendor A/B) in
# every self-attention, a few UniPC + CFG steps each, the VAE decode, parity and calibration.
#
# Run from the repository root on the device machine, with the diffusers wheel in .whl/ and our
# sm_90 library in build/sm_90 (carry: .whl, build):
#   bash bench/device_pipeline.sh            # writes $OUT/pipeline.json and $OUT/pipeline.log
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
set -euo pipefail
cd "$(dirname "$0")/.."

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

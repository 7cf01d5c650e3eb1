# What the device scripts share; sourced after OUT (and BUDGET_S, where the script has a budget) is set.
#   el            seconds since the script sourced this
#   left          seconds of BUDGET_S left
#   note LINE     the line on the screen and in $SUMMARY ($OUT/summary.txt unless set; emptied here)
#   record_env FILE [CMD...]   GPU, driver, max SM clock, nvcc, torch/CUDA/cuDNN/GPU count, commit
#                 (none where the folder is not a checkout's top)
#                 (and what CMD prints) into FILE, and one "env:" line through note
#   build_variants SECONDS SPEC...   one nvcc per "LABEL:-DFLAGS ..." (LABEL may end in @head,dims),
#                 in the background, sm_90a as `sovereign-audit build` makes it; appends LABEL=PATH
#                 to LIBS and the nvcc's pid to PIDS (the library under $VB/NAME, logs under $LOG)
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(el) )); }
SUMMARY=${SUMMARY:-$OUT/summary.txt}
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

record_env() {
    local file=$1; shift
    { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      nvcc --version | tail -1
      python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpus", torch.cuda.device_count())'
      # the commit only where this is a checkout's top: an archive copied inside another checkout
      # (the device runs' .device/<name>/repo) would report the outer one's
      if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then git log -1 --format='commit %H'
      else echo "commit: none (not a git checkout's top)"; fi
      [ $# -gt 0 ] && "$@"; } > "$file" 2>&1
    note "env: $(tr '\n' ';' < "$file")"
}

VARIANT_NVCC=(nvcc -x cu -O3 -std=c++17 -shared -Xcompiler -fPIC --expt-relaxed-constexpr --threads 2
              -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 -DFK_WGMMA
              '-DFK_TARGET="sm_90a"' -Xptxas -v)
build_variants() {
    local seconds=$1 spec label flags name; shift
    for spec in "$@"; do
        [ -z "$spec" ] && continue
        label=${spec%%:*}; flags=${spec#*:}; name=${label%%@*}
        mkdir -p "$VB/$name"
        # shellcheck disable=SC2086
        timeout -k 5 "$seconds" "${VARIANT_NVCC[@]}" $flags -I flash_kernel/include -I flash_kernel/src \
            flash_kernel/src/fk_gpu.hip -o "$VB/$name/libflash_kernel.so" > "$LOG/build-$name.log" 2>&1 &
        PIDS+=($!)
        LIBS+=("$label=$VB/$name/libflash_kernel.so")
    done
}

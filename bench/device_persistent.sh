#!/usr/bin/env bash
# The default wgmma kernel against a variant of it (by default the per-tile grid), on an NVIDIA
# H200, in one run:
#   1. build the default sm_90a library with `sovereign-audit build` into build/ (the public call
#      flash_kernel.attention finds it there) and, beside it, the same sources with the variant's
#      macros (FK_OTHER="name:flags", default "tile:-DFK_WGMMA_PERSISTENT=0": one block per work
#      item) by the same nvcc command plus the macros
#   2. the GPU tests of the sm_90a library against float64 (tests/test_kernel_gpu.py: fresh random
#      inputs, NaN-poisoned outputs, the path of every call checked; many work items per block,
#      ragged tiles, K/V of one tile) and of the public call in a graph capture / on a side stream
#   3. compute-sanitizer memcheck (and racecheck, smaller) of the default library on shapes of the
#      persistent path
#   4. ours through the public call, the variant's library and SDPA-cuDNN, taking turns call by
#      call (bench/kernel_bench.py), at the cross-attention, short and long self-attention shapes
# Results under $OUT; the short table prints last.
#   OUT=/tmp/persist bash bench/device_persistent.sh      # BUDGET_S (default 300) bounds the run
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/persist_out}
BUDGET_S=${BUDGET_S:-300}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
. bench/device_common.sh
record_env "$OUT/env.txt"

# 1. Both libraries, built at the same time.
FK_OTHER=${FK_OTHER:-"tile:-DFK_WGMMA_PERSISTENT=0"}
ONAME=${FK_OTHER%%:*}
OTHER=build/$ONAME/sm_90a/libflash_kernel.so
mkdir -p "$(dirname "$OTHER")"
OFLAGS=${FK_OTHER#*:} python3 - "$OTHER" > "$OUT/other-cmd.txt" <<'PY'
import os, shlex, sys
from audit.kernel_build.targets import nvidia_spec
cmd = nvidia_spec("sm_90a").command(sys.argv[1])
print(shlex.join(cmd[:1] + os.environ["OFLAGS"].split() + cmd[1:]))
PY
(eval "$(cat "$OUT/other-cmd.txt")" > "$OUT/build-$ONAME.log" 2>&1; echo $? > "$OUT/build-$ONAME.rc") &
timeout 300 python3 -m audit build --target sm_90a --out build > "$OUT/build.log" 2>&1
note "build sm_90a (default) rc=$? ($(el) s)"
wait
note "build sm_90a variant $ONAME rc=$(cat "$OUT/build-$ONAME.rc") ($(el) s): $(cat "$OUT/other-cmd.txt")"

# 2. Correctness of the default library (sm_90a alone) and of the public call where users put it.
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -k "sm_90a" tests/test_kernel_gpu.py > "$OUT/pytest.log" 2>&1
note "pytest tests/test_kernel_gpu.py -k sm_90a rc=$?: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -8 | tee -a "$SUMMARY"
timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_placement.py > "$OUT/pytest-placement.log" 2>&1
note "pytest tests/test_cuda_placement.py rc=$?: $(tail -1 "$OUT/pytest-placement.log")"

# 3. memcheck: the C ABI called on exact-size cudaMalloc buffers (no allocator slack to hide an
#    out-of-bounds access), shapes with more work items than SMs, every bucket and a padded head dim.
cat > /tmp/fk_persist_drv.cpp <<'CPP'
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "flash_kernel.h"
typedef int32_t (*fwd_t)(const fk_attention_args *);
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { std::printf("dlopen: %s\n", dlerror()); return 2; }
    fwd_t flash = (fwd_t)dlsym(h, "fk_flash_forward");
    const char *(*path)() = (const char *(*)())dlsym(h, "fk_last_flash_path");
    const char *(*err)() = (const char *(*)())dlsym(h, "fk_last_error");
    int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const long shapes[][4] = {{2, 3, 1, 1}, {1, sms + 7L, 300, 1000}, {2, sms + 3L, 129, 100}, {1, 2, 77, 4097}};
    const int dims[] = {64, 72, 128, 200, 256};
    const bool small = std::getenv("FK_DRIVER_SMALL") != nullptr;  // racecheck: fewer, smaller calls
    int calls = 0, bad = 0;
    for (auto &s : shapes) for (int d : dims) for (int dt = 1; dt < 3; ++dt) for (int lay = 0; lay < 2; ++lay) {
        if (small && (s[2] > 200 || dt == 1 || lay == 1 || (d != 64 && d != 128))) continue;
        long B = s[0], H = s[1], nq = s[2], nk = s[3];
        size_t nqe = B * H * nq * d, nke = B * H * nk * d;
        std::vector<uint16_t> host(nke > nqe ? nke : nqe);
        for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x3c00 ^ (std::rand() & 0x83ff));  // small values, both signs
        void *q, *k, *v, *o;
        cudaMalloc(&q, nqe * 2); cudaMalloc(&k, nke * 2); cudaMalloc(&v, nke * 2); cudaMalloc(&o, nqe * 2);
        cudaMemcpy(q, host.data(), nqe * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(k, host.data(), nke * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(v, host.data(), nke * 2, cudaMemcpyHostToDevice);
        fk_attention_args a{}; a.abi_version = FK_ABI_VERSION; a.dtype = dt; a.q = q; a.k = k; a.v = v; a.o = o;
        a.batch = B; a.heads = H; a.nq = nq; a.nk = nk; a.head_dim = d;
        auto st = [&](int64_t *x, long n) { if (lay == 0) { x[0] = H * n * d; x[1] = n * d; x[2] = d; } else { x[0] = n * H * d; x[1] = d; x[2] = H * d; } };
        st(a.q_stride, nq); st(a.o_stride, nq); st(a.k_stride, nk); st(a.v_stride, nk);
        int32_t rc = flash(&a); cudaError_t e = cudaDeviceSynchronize(); ++calls;
        if (rc != 0 || e != cudaSuccess || std::strcmp(path(), "wgmma") != 0) {
            ++bad;
            std::printf("FAIL B%ld H%ld nq%ld nk%ld d%d dt%d lay%d rc %d (%s) path %s cuda %s\n", B, H, nq, nk, d, dt, lay, rc,
                        err(), path(), cudaGetErrorString(e));
        }
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o);
    }
    std::printf("persistent driver: %d calls, %d failures\n", calls, bad);
    return bad ? 1 : 0;
}
CPP
nvcc -O2 -std=c++17 -I flash_kernel/include /tmp/fk_persist_drv.cpp -o /tmp/fk_persist_drv -ldl > "$OUT/driver-build.log" 2>&1 \
    || note "memcheck driver build failed: $(tail -3 "$OUT/driver-build.log" | tr '\n' ' ')"
timeout -k 5 $(( $(left) > 200 ? 90 : 45 )) compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    /tmp/fk_persist_drv build/sm_90a/libflash_kernel.so > "$OUT/memcheck.log" 2>&1
note "memcheck (default sm_90a) rc=$?: $(grep -E 'ERROR SUMMARY|driver:' "$OUT/memcheck.log" | tr '\n' ' ')"
FK_DRIVER_SMALL=1 timeout -k 5 $(( $(left) > 200 ? 60 : 30 )) compute-sanitizer --tool racecheck --racecheck-report all \
    --error-exitcode 9 --print-limit 20 /tmp/fk_persist_drv build/sm_90a/libflash_kernel.so > "$OUT/racecheck.log" 2>&1
note "racecheck (default sm_90a, small) rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|driver:' "$OUT/racecheck.log" | tr '\n' ' ')"

# 4. Time: ours (the public call, default library), the other grid, SDPA-cuDNN; bf16.
SHAPES="1,12,32760,512,128 2,40,32760,512,128 2,24,8192,8192,128 8,16,2048,2048,128 1,24,4608,4608,128
        1,12,32760,32760,128 1,40,75600,75600,128 1,30,17776,17776,64 1,12,16384,16384,256"
ARGS=(); for s in $SHAPES; do ARGS+=(--shape "$s"); done
t=$(( $(left) - 10 )); [ "$t" -gt 200 ] && t=200
timeout -k 5 "$t" python3 bench/kernel_bench.py "${ARGS[@]}" --dtype bf16 --lib "$ONAME=$OTHER" \
    --torch-methods sdpa_cudnn --repeats 10 --warmup 2 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
note "bench rc=$? ($(el) s)"

# The logs in one archive (few files come back from a device run), the summary and tables last.
tar czf "$OUT/logs.tgz" -C "$OUT" --remove-files $(cd "$OUT" && ls ./*.log ./*.txt ./*.rc 2>/dev/null | grep -v -e summary.txt -e bench.txt) 2>/dev/null
echo "==== bench (bench/kernel_bench.py)"
cat "$OUT/bench.txt"
echo "==== summary"
cat "$SUMMARY"
echo "==== ours (default) vs $ONAME vs SDPA-cuDNN, bf16, ms; ratios of medians [95 % CI]"
python3 - "$OUT/bench.json" "$ONAME" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from kernel_bench import ratio_ci
rows = json.load(open(sys.argv[1]))["rows"]
other = sys.argv[2]
by = {}
for r in rows:
    by.setdefault(tuple(r["shape"]), {})[r["method"]] = r
print(f"{'shape (B,H,Nq,Nk,D)':<24} {'path':<6} {'ours ms':>8} {other + ' ms':>8} {'cuDNN ms':>8} {'ours/' + other:>16} "
      f"{'ours/cuDNN':>16} {other + '/cuDNN':>16}")
for shape, m in by.items():
    def ms(k):
        return m[k]["median_ms"] if k in m and "median_ms" in m[k] else float("nan")
    def ratio(a, b):  # how much faster a is than b: median(b) / median(a)
        if a not in m or b not in m or "times_ms" not in m[a] or "times_ms" not in m[b]:
            return "-"
        lo, hi = ratio_ci(m[b]["times_ms"], m[a]["times_ms"])
        return f"{ms(b) / ms(a):.2f} [{lo:.2f},{hi:.2f}]"
    print(f"{','.join(map(str, shape)):<24} {m.get('ours', {}).get('path') or '-':<6} {ms('ours'):8.3f} {ms(other):8.3f} "
          f"{ms('sdpa_cudnn'):8.3f} {ratio('ours', other):>16} {ratio('ours', 'sdpa_cudnn'):>16} {ratio(other, 'sdpa_cudnn'):>16}")
PY

"""Writes flash_kernel/src/gpu/fk_wgmma_ops.h: the wgmma inline-PTX wrappers of the Hopper path.

A wgmma instruction names every accumulator register as an operand (n/2 of them for m64nNk16 in
fp32), so the wrappers are generated rather than typed. Run from the repository root:
    python3 flash_kernel/tools/gen_wgmma_ops.py
and commit the header with this script (tests/test_wgmma_ops.py checks they agree).
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "gpu" / "fk_wgmma_ops.h"
TYPES = {"bf16": "BF16", "f16": "F16"}
# S = Q K^T: n = keys per tile (BN; 80 at bucket 256, 112 at 192; 176 and 192 for the wider tiles
# -DFK_WGMMA_BN may ask for at buckets 64 and 128)
SS_N = (64, 80, 96, 112, 128, 176, 192)
# O += P V: n = the head-dim bucket, or the column blocks of O that hold data (bucket 256 at head
# dims of 3 blocks: n192), or the first columns of bucket 64's column block (head dims 32 and 40..48:
# n32, n48) or of bucket 128's two (head dims 66..80 and 81..96: n80, n96). One wide instruction per k16 step sends P's registers once; the accumulator of an nN
# instruction is the n64 ones side by side, so O keeps one layout.
RS_N = (32, 48, 64, 80, 96, 128, 192, 256)
# S = Q K^T with Q in registers (buckets 64 and 128 with Q held in registers): n = BN, K K-major.
RSK_N = (128,)
# The FP8 kernel (gpu/fk_fp8.h): INT8 S = Q K^T (n = its 128 keys per tile, s32 accumulators) and
# e4m3 O_tile = P V^T with P from registers (n = the head-dim bucket, 64 or 128).
FP8_SS_N = (128,)
FP8_RS_N = (64, 128)


def _acc(n: int, constraint: str = "f") -> tuple[str, str]:
    """The accumulator operands of an m64nN wgmma: n/2 registers, "f" (fp32) or "r" (s32)."""
    regs = n // 2
    placeholders = ", ".join(f"%{i}" for i in range(regs))
    operands = ", ".join(f'"+{constraint}"(d[{i}])' for i in range(regs))
    return "{" + placeholders + "}", operands


def ss(ptx: str, n: int) -> str:
    regs = n // 2
    ph, ops = _acc(n)
    return f"""    // D[64 x {n}] (+)= A[64 x 16] * B[16 x {n}]; A and B from shared memory (K-major, 128B swizzle).
    static FK_DEVICE void ss_n{n}(float (&d)[{regs}], uint64_t da, uint64_t db, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {ph}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;\\n}}\\n"
            : {ops}
            : "l"(da), "l"(db), "r"(accumulate));
    }}
"""


def rs(ptx: str, n: int) -> str:
    regs = n // 2
    ph, ops = _acc(n)
    return f"""    // D[64 x {n}] += A[64 x 16] * B[16 x {n}]; A from registers (the m16n8k16 A fragment per warp),
    // B from shared memory stored N-major (row-major V: the transpose bit is set).
    static FK_DEVICE void rs_n{n}(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t db) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {ph}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, 1;\\n}}\\n"
            : {ops}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }}
"""


def rsk(ptx: str, n: int) -> str:
    regs = n // 2
    ph, ops = _acc(n)
    return f"""    // D[64 x {n}] (+)= A[64 x 16] * B[16 x {n}]; A from registers (the m16n8k16 A fragment per warp),
    // B from shared memory K-major (K of S = Q K^T: no transpose).
    static FK_DEVICE void rsk_n{n}(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t db, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {ph}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, 0;\\n}}\\n"
            : {ops}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
    }}
"""


def ss_s8(n: int) -> str:
    regs = n // 2
    placeholders, operands = _acc(n, "r")
    return f"""    // D[64 x {n}] (+)= A[64 x 32] * B[32 x {n}] in int8, exact int32 sums; A and B from shared
    // memory, K-major with the 128-byte swizzle (integer wgmma has no transpose).
    static FK_DEVICE void ss_s8_n{n}(uint32_t (&d)[{regs}], uint64_t da, uint64_t db, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k32.s32.s8.s8 {placeholders}, %{regs}, %{regs + 1}, p;\\n}}\\n"
            : {operands}
            : "l"(da), "l"(db), "r"(accumulate));
    }}
"""


def rs_e4m3(n: int) -> str:
    regs = n // 2
    ph, ops = _acc(n)
    return f"""    // D[64 x {n}] (+)= A[64 x 32] * B[32 x {n}] in e4m3 (the tensor core's FP8 accumulator); A from
    // registers (four e4m3 per register: rows r, r+8 x k 4(lane%4)..+3 and +16), B K-major in shared
    // memory with the 128-byte swizzle (FP8 wgmma has no transpose).
    static FK_DEVICE void rs_e4m3_n{n}(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t db, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {ph}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1;\\n}}\\n"
            : {ops}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
    }}
"""


def render() -> str:
    parts = ["// GENERATED by flash_kernel/tools/gen_wgmma_ops.py: do not edit by hand.\n",
             "// wgmma (sm_90a) wrappers used by gpu/fk_wgmma.h; included only where __CUDA_ARCH_FEAT_SM90_ALL is set.\n",
             "#ifndef FK_WGMMA_OPS_H\n#define FK_WGMMA_OPS_H\n\nnamespace fk {\nnamespace wgmma {\n\n",
             "template <class E> struct Ops;\n\n"]
    for ptx, elem in TYPES.items():
        parts.append(f"template <> struct Ops<{elem}> {{\n")
        parts.extend(ss(ptx, n) for n in SS_N)
        parts.extend(rs(ptx, n) for n in RS_N)
        parts.extend(rsk(ptx, n) for n in RSK_N)
        parts.append("};\n\n")
    parts.append("struct OpsFp8 {\n")
    parts.extend(ss_s8(n) for n in FP8_SS_N)
    parts.extend(rs_e4m3(n) for n in FP8_RS_N)
    parts.append("};\n\n")
    parts.append("}  // namespace wgmma\n}  // namespace fk\n\n#endif  // FK_WGMMA_OPS_H\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        ok = OUT.exists() and OUT.read_text() == text
        print("fk_wgmma_ops.h is up to date" if ok else "fk_wgmma_ops.h differs from the generator: rerun it")
        return 0 if ok else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The generated wgmma wrappers (gpu/fk_wgmma_ops.h) must be what their generator writes today, and
each wrapper must name exactly as many accumulator operands as its instruction shape has."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEADER = REPO / "flash_kernel" / "src" / "gpu" / "fk_wgmma_ops.h"


def test_header_matches_generator():
    r = subprocess.run([sys.executable, "flash_kernel/tools/gen_wgmma_ops.py", "--check"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_operand_counts_match_shapes():
    text = HEADER.read_text()
    found = 0
    for m in re.finditer(r'm64n(\d+)k16\.f32\.(\w+)\.\w+ \{([^}]*)\}', text):
        n, regs = int(m.group(1)), m.group(3).split(",")
        assert len(regs) == n // 2, f"m64n{n}k16 names {len(regs)} accumulators, wants {n // 2}"
        assert [r.strip() for r in regs] == [f"%{i}" for i in range(n // 2)]
        found += 1
    # {bf16, f16} x (ss {n64, n80, n96, n112, n128, n176, n192} + rs {n32, n48, n64, n80, n96, n128,
    # n192, n256} + rsk {n128})
    assert found == 32


def test_fp8_wrappers_name_their_operands():
    """The FP8 kernel's: the INT8 S = Q K^T (s32 accumulators, "+r", scale-d alone) and the e4m3
    P V with A from registers (f32, "+f", scale-d and the two sign immediates, no transpose)."""
    text = HEADER.read_text()
    (s8,) = re.findall(r'm64n128k32\.s32\.s8\.s8 \{([^}]*)\}, %64, %65, p;', text)
    assert [r.strip() for r in s8.split(",")] == [f"%{i}" for i in range(64)]
    assert text.count('"+r"(d[63])') == 1
    for n in (64, 128):
        (regs,) = re.findall(rf'm64n{n}k32\.f32\.e4m3\.e4m3 \{{([^}}]*)\}}, \{{%{n // 2}, %{n // 2 + 1}, '
                             rf'%{n // 2 + 2}, %{n // 2 + 3}\}}, %{n // 2 + 4}, p, 1, 1;', text)
        assert [r.strip() for r in regs.split(",")] == [f"%{i}" for i in range(n // 2)]


def test_register_a_wrappers_transpose_only_v():
    """P V reads V N-major (transpose bit 1); S = Q K^T with Q in registers reads K K-major (0)."""
    text = HEADER.read_text()
    for name, bit in (("rs", "1"), ("rsk", "0")):
        bodies = re.findall(rf"void {name}_n\d+\(.*?\n(.*?)\n    }}", text, re.S)
        assert len(bodies) == (16 if name == "rs" else 2)
        for body in bodies:
            assert re.search(rf"\}}, %\d+, p, 1, 1, {bit};", body), body[:200]

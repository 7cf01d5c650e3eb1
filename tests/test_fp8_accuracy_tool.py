"""flash_kernel/tools/fp8_accuracy.py: --drop-bits moves the FP8 accumulator model (fp8.fp22) the
way it must (fewer bits cleared, less loss from one-level P V accumulation), and bad arguments are
usage errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "flash_kernel" / "tools" / "fp8_accuracy.py"
SINGLE = "int8-smooth single-level fp22"


def rows(*args: str, variants: str = f"int8-smooth,{SINGLE}") -> dict[str, float]:
    """Worst rel-L2 per variant of one tool run (D 64, Nk 16384, one seed, random inputs)."""
    p = subprocess.run([sys.executable, str(TOOL), "--seeds", "1", "--nq", "64", "--d", "64", "--nk", "16384",
                        "--kinds", "random", "--variants", variants, *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] == "random":
            out[cells[3]] = float(cells[5])  # worst rel-L2
    return out


def test_fewer_dropped_bits_shrink_the_one_level_loss_and_leave_two_level_alone():
    at13, at19 = rows("--drop-bits", "10"), rows("--drop-bits", "4")
    # two-level sums each 128-key tile in a fresh accumulator: the model's bits barely matter
    assert at13["int8-smooth"] == pytest.approx(at19["int8-smooth"], rel=1e-2)
    # one level carries O through every step: 13 bits truncated cost visibly more than 19
    assert at13[SINGLE] - at13["int8-smooth"] > 5 * abs(at19[SINGLE] - at19["int8-smooth"])


def test_v_offsets_cost_one_level_and_smoothing_v_or_groups_win_it_back():
    """A constant per V channel (--v-offset) makes one-level P V sums grow with Nk, which the 13-bit
    model truncates: one level loses to two levels there; V smoothed (its mean subtracted before
    the rounding, added back after) is more accurate than either, and the accumulator carried over
    groups of 4 tiles (Scheme.flush_tiles) stays near two levels."""
    got = rows("--drop-bits", "10", "--v-offset", "2",
               variants=f"int8-smooth,{SINGLE},int8-smooth single-level V smoothed,int8-smooth added every 4 tiles")
    two, one, smoothed = got["int8-smooth"], got[SINGLE], got["int8-smooth single-level V smoothed"]
    grouped = got["int8-smooth added every 4 tiles"]
    assert one > 3 * two and smoothed < two / 2, got
    assert two < grouped < 1.5 * two, got


@pytest.mark.parametrize("args", [("--variants", "nope"), ("--drop-bits", "23"), ("--drop-bits", "-1"),
                                  ("--v-offset", "-1"), ("--v-offset", "nan"), ("--v-offset", "inf")])
def test_bad_arguments_are_usage_errors(args):
    p = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr


def test_one_level_above_a_head_dim_is_one_level_there_and_two_level_below():
    """Scheme.one_level_above models a kernel whose bucket 128 sums P V in one level and whose
    bucket 64 keeps two: the reference must equal the one-level scheme at head dim 128 and the
    two-level one at 64, element for element."""
    import torch
    from dataclasses import replace

    from flash_kernel import fp8

    two = fp8.SCHEMES["int8-smooth"]
    one, split = replace(two, two_level=False), replace(two, one_level_above=64)
    gen = torch.Generator().manual_seed(7)
    for d, same in ((128, one), (64, two)):
        q, k, v = (torch.randn(1, 1, n, d, generator=gen).bfloat16() for n in (64, 1024, 1024))
        got = fp8.reference(q, k, v, scheme=split)
        assert torch.equal(got, fp8.reference(q, k, v, scheme=same))
        other = one if same is two else two
        assert not torch.equal(got, fp8.reference(q, k, v, scheme=other))

"""The gate's contract under a fixed-seed, fixed-budget run of the mutation fuzzer (bench/fuzz).

A few hundred mutated ELF files, folders, wheels, conda packages, container images, policies and
baselines, each through `check` in every output format and `inspect` text and --json: exit 0/1/3
only (2 for a broken policy or baseline), one-line errors, no traceback, no hang, bounded RSS,
nothing opened under a canary folder the mutants point links at, nothing written outside the case.
`make fuzz` runs the same fuzzer for as long as asked. Seeds are built once by the real compilers
(a compiler that is missing drops its seeds).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED = 20261204
CASES = int(os.environ.get("SOVEREIGN_FUZZ_CASES", "240"))
SECONDS = float(os.environ.get("SOVEREIGN_FUZZ_SECONDS", "170"))  # a slow runner stops early, never hangs CI


@pytest.mark.slow
def test_fixed_seed_fuzz_run_finds_no_contract_violation(tmp_path, capsys):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not on PATH: the fuzzer's seeds are built by it (make test installs it)")
    sys.path.insert(0, str(REPO))
    try:
        from bench.fuzz.__main__ import main
    finally:
        sys.path.remove(str(REPO))
    out = tmp_path / "fuzz"
    jobs = "2" if (os.cpu_count() or 1) >= 2 else "1"
    code = main(["--seed", str(SEED), "--cases", str(CASES), "--seconds", str(SECONDS), "--jobs", jobs,
                 "--out", str(out), "--quiet"])
    summary = (out / "summary.txt").read_text()
    with capsys.disabled():
        print("\n" + summary)
    assert "cases in" in summary
    assert code == 0, f"contract violations (reproducers under {out / 'violations'}):\n{summary}"

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
CASES = int(os.environ.get("SOVEREIGN_FUZZ_CASES", "200"))
SECONDS = float(os.environ.get("SOVEREIGN_FUZZ_SECONDS", "150"))  # a slow runner stops early, never hangs CI


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


def _outcome(rc=0, stdout=b"", stderr=b"", hook=(), timed_out=False, maxrss_kb=50_000):
    sys.path.insert(0, str(REPO))
    try:
        from bench.fuzz.execute import Outcome
    finally:
        sys.path.remove(str(REPO))
    return Outcome(rc, None, timed_out, maxrss_kb, 0.1, stdout, stderr, list(hook), False)


def _kinds(out, fmt="text", allowed=frozenset({0, 1, 3})):
    sys.path.insert(0, str(REPO))
    try:
        from bench.fuzz.contract import check_run
    finally:
        sys.path.remove(str(REPO))
    return {k for k, _ in check_run("check", out, set(allowed), fmt, 1 << 20)}


def test_the_contract_checker_flags_each_kind_of_violation():
    assert _kinds(_outcome(0, b"PASS  lib.so\n")) == set()
    assert _kinds(_outcome(3, b"ERROR lib.so\nresult: ERROR (exit 3)\n")) == set()
    assert "exit-4" in _kinds(_outcome(4, stderr=b"internal error: KeyError: 1\n"))
    assert "exit-2" in _kinds(_outcome(2, stderr=b"error: bad\n"))
    assert "exit-2" not in _kinds(_outcome(2, stderr=b"error: bad\n"), allowed={0, 1, 2, 3})
    assert "traceback" in _kinds(_outcome(1, stderr=b"Traceback (most recent call last):\n  x\nValueError\n"))
    assert "error-lines" in _kinds(_outcome(3, stderr=b"error: a\nerror: b\n"))
    assert "error-lines" in _kinds(_outcome(3, b"PASS\n"))  # exit 3 that nothing explains
    assert "stderr-line" in _kinds(_outcome(3, stderr=b"error: a\nsecond half\n"))
    assert "hang" in _kinds(_outcome(None, timed_out=True))
    assert "rss" in _kinds(_outcome(0, maxrss_kb=2 << 20))
    assert "workflow-command" in _kinds(_outcome(1, b"FAIL x\n::error::forged\n"))
    assert "control-chars" in _kinds(_outcome(1, b"FAIL \x1b[2Jx\n"))
    assert "read-outside" in _kinds(_outcome(0, hook=["read-outside\topen\t'/canary/secret.so'"]))


def test_github_annotations_are_checked_for_form():
    sys.path.insert(0, str(REPO))
    try:
        from bench.fuzz.contract import github_line_problem
    finally:
        sys.path.remove(str(REPO))
    assert github_line_problem("::error file=a.so,title=sovereign-audit%3A x::a.so: needs libcudnn") is None
    assert github_line_problem("::add-mask::x") is not None
    assert github_line_problem("::error file=a,b.so,title=x::m") is not None  # an unescaped comma
    assert github_line_problem("::error title=x:y::m") is not None  # an unescaped colon ends the properties early
    assert github_line_problem("::error::m\r::warning::n") is not None

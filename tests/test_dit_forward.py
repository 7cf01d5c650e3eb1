"""bench/dit_forward.py on a CPU: the tiny Wan model end to end through our backend at both
precisions (every attention call served, the table printed, the JSON written), and its usage errors.
The GPU figures it exists for come from the device (bench/device.sh dit-forward)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "dit_forward.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_tiny_forward_on_cpu_serves_every_attention_call_at_both_precisions(tmp_path):
    out = tmp_path / "dit.json"
    p = run("--model", "tiny", "--size", "tiny", "--device", "cpu", "--repeats", "1", "--json", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    rows = {r["attention"]: r for r in doc["rows"]}
    assert set(rows) == {"ours", "ours-fp8"}  # no cuDNN on a CPU
    # 2 layers x (self + text cross-attention) per forward, served, none passed on to torch
    for name, precision in (("ours", "exact"), ("ours-fp8", "fp8")):
        counts = rows[name]["counts"]
        assert counts["precision"] == precision and counts["served"] == 4 and not counts["passed_on"]
    # fp8 differs from exact (it quantizes), and not by much
    assert 0 < rows["ours-fp8"]["rel_l2_vs_ours"] < 5e-2
    assert doc["tokens"] == 2 * 4 * 4
    assert "ours-fp8" in p.stdout and "Amdahl" in p.stdout


def test_fp8_min_keys_leaves_the_short_self_attention_exact(tmp_path):
    out = tmp_path / "dit.json"
    # the tiny model's self-attention sees 32 keys, its text cross-attention 512
    p = run("--model", "tiny", "--size", "tiny", "--device", "cpu", "--repeats", "1", "--attention", "ours-fp8",
            "--fp8-min-keys", "100", "--json", str(out))
    assert p.returncode == 0, p.stderr
    counts = json.loads(out.read_text())["rows"][0]["counts"]
    assert counts["paths"] == {"cpu": 2, "fp8 reference": 2} and counts["fp8_min_keys"] == 100


@pytest.mark.parametrize("args", [("--attention", "cudnn"), ("--repeats", "0"), ("--size", "1080p"),
                                  ("--fp8-min-keys", "-1")])
def test_bad_arguments_are_usage_errors(args):
    p = run("--device", "cpu", "--model", "tiny", *args)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr

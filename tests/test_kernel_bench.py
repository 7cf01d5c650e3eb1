"""bench/kernel_bench.py's turn-taking timer, on the CPU (ratios measured side by side).

The ratios of a device run are only fair if no method owns a position in the sequence (the first
calls after a new shape, the last before the next). `time_interleaved` is run here with CUDA events
replaced by a recorder: every method gets exactly its number of calls, methods take turns call by
call, each round starts at another method, and the times returned are each method's own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def bench(monkeypatch):
    clock = {"t": 0.0}

    class Event:  # a CUDA event stand-in on a fake clock that only the timed calls advance
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = clock["t"]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    spec = importlib.util.spec_from_file_location("kernel_bench", REPO / "bench" / "kernel_bench.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", [str(REPO), *sys.path])
    spec.loader.exec_module(mod)
    return mod, clock


def test_methods_take_turns_and_keep_their_own_times(bench):
    mod, clock = bench
    calls = []

    def method(name, ms):
        def fn(*args):
            calls.append((name, args[0]))
            clock["t"] += ms
        return fn

    fns = [method("A", 1.0), method("B", 2.0), method("C", 0.5)]
    times = mod.time_interleaved(fns, [4, 4, 2], [("x",), ("y",)], warmup=1)
    assert [len(t) for t in times] == [4, 4, 2]
    assert times == [[1.0] * 4, [2.0] * 4, [0.5] * 2]
    timed = [c[0] for c in calls[3:]]  # after one warm-up call each
    assert calls[:3] == [("A", "x"), ("B", "x"), ("C", "x")]
    # round 0 starts at A, round 1 at B, round 2 at C (done after 2 calls, so A), round 3 at A
    assert timed == ["A", "B", "C", "B", "C", "A", "A", "B", "A", "B"]
    # the input sets rotate by round: every method of round i sees inputs[i % 2]
    assert [c[1] for c in calls[3:6]] == ["x"] * 3 and [c[1] for c in calls[6:9]] == ["y"] * 3


def test_no_methods_is_no_calls(bench):
    mod, _ = bench
    assert mod.time_interleaved([], [], [("x",)], warmup=3) == []


def test_ratio_interval_brackets_the_ratio_and_excludes_one_only_when_it_should(bench):
    mod, _ = bench
    base = [2.00, 2.02, 1.98, 2.01, 2.03, 1.99, 2.00, 2.02, 1.97, 2.01]
    faster = [x / 1.10 for x in base]           # 10 % faster, same spread
    lo, hi = mod.ratio_ci(base, faster)
    assert lo <= 1.10 <= hi and lo > 1.0
    lo, hi = mod.ratio_ci(base, list(reversed(base)))  # the same distribution: 1.0 inside
    assert lo <= 1.0 <= hi
    noisy = [1.0, 3.0, 1.2, 2.8, 1.1, 2.9, 1.3, 2.7, 1.05, 2.95]   # median ~2, very wide spread
    lo, hi = mod.ratio_ci(base, noisy)
    assert lo < 1.0 < hi


def test_shapes_take_nq_and_nk_and_presets_come_from_the_audit_table(bench):
    mod, _ = bench
    assert mod.parse_shape("1,12,32760,128") == (1, 12, 32760, 32760, 128)
    assert mod.parse_shape("2,40,32760,512,128") == (2, 40, 32760, 512, 128)
    for bad in ("1,2,3", "1,2,3,4,5,6", "1,2,0,64", "a,b,c,d"):
        with pytest.raises(Exception, match="B,H,N,D or B,H,Nq,Nk,D"):
            mod.parse_shape(bad)
    cross = mod.preset_shapes("cross")
    assert cross == [((1, 12, 32760, 512, 128), "Wan2.1-1.3B text cross-attention"),
                     ((2, 40, 32760, 512, 128), "Wan2.1-14B cross-attention, CFG batch")]
    with pytest.raises(Exception, match="unknown preset 'nope'"):
        mod.preset_shapes("nope")


def test_the_table_names_the_path_and_shows_refusals_as_rows(bench):
    mod, _ = bench
    rows = [
        {"method": "ours", "shape": [1, 16, 17550, 17550, 72], "what": "head dim 72", "path": "refused",
         "error": "FK_ERR_HEAD_DIM: head_dim 72 is not supported by this library"},
        {"method": "ours", "shape": [1, 12, 32760, 512, 128], "what": "Wan cross", "path": "wgmma",
         "median_ms": 1.5, "tflops": 227.0, "x_sdpa_flash": 0.8, "x_sdpa_flash_ci95": (0.79, 0.81),
         "x_sdpa_cudnn": 0.51, "x_sdpa_cudnn_ci95": (0.50, 0.52), "rel_l2_vs_reference": 2e-3},
        {"method": "sdpa_cudnn", "shape": [1, 12, 32760, 512, 128], "what": "Wan cross",
         "median_ms": 0.77, "tflops": 447.0, "rel_l2_vs_reference": 2e-3},
    ]
    lines = mod.render(rows).splitlines()
    assert "path" in lines[0] and "x cuDNN" in lines[0]
    assert lines[1].startswith("1,16,17550,17550,72") and " refused " in lines[1]
    assert "error: FK_ERR_HEAD_DIM" in lines[1]
    assert " wgmma " in lines[2] and "[0.79,0.81]" in lines[2] and "[0.50,0.52]" in lines[2]
    assert " sdpa_cudnn " in lines[3] and " - " in lines[3]  # a baseline has no path


def test_lse_cost_is_the_ratio_of_the_two_public_calls(bench):
    """--lse: per shape timed both ways, median(ours_lse) / median(ours) with an interval that
    holds it; a shape missing either method has no cost line."""
    mod, _ = bench
    rows = [{"method": "ours", "shape": [1, 2, 3, 3, 64], "times_ms": [1.0, 1.1, 0.9, 1.0]},
            {"method": "ours_lse", "shape": [1, 2, 3, 3, 64], "times_ms": [1.2, 1.2, 1.1, 1.3]},
            {"method": "sdpa_flash", "shape": [1, 2, 3, 3, 64], "times_ms": [5.0] * 4},
            {"method": "ours", "shape": [1, 1, 9, 9, 128], "times_ms": [2.0] * 4}]
    (cost,) = mod.pair_ratios(rows, "ours_lse", "ours")
    assert cost["shape"] == [1, 2, 3, 3, 64]
    assert cost["ratio"] == pytest.approx(1.2 / 1.0)
    lo, hi = cost["ci95"]
    assert lo <= cost["ratio"] <= hi


def test_fp8_speedup_is_ours_over_ours_fp8(bench):
    """--fp8: median(ours) / median(ours_fp8) per shape, the FP8 kernel's speedup over exact."""
    mod, _ = bench
    rows = [{"method": "ours", "shape": [1, 2, 3, 3, 64], "times_ms": [2.0, 2.2, 1.8, 2.0]},
            {"method": "ours_fp8", "shape": [1, 2, 3, 3, 64], "times_ms": [1.0, 1.0, 1.1, 0.9]},
            {"method": "ours_fp8", "shape": [1, 1, 9, 9, 128], "times_ms": [2.0] * 4}]
    (speed,) = mod.pair_ratios(rows, "ours", "ours_fp8")
    assert speed["shape"] == [1, 2, 3, 3, 64] and speed["ratio"] == pytest.approx(2.0)
    lo, hi = speed["ci95"]
    assert lo <= speed["ratio"] <= hi


def test_fp8_needs_the_public_call(bench, capsys):
    mod, _ = bench
    with pytest.raises(SystemExit) as exc:
        mod.main(["--fp8", "--no-public", "--shape", "1,1,8,64"])
    assert exc.value.code == 2 and "--fp8" in capsys.readouterr().err


def test_lse_needs_the_public_call(bench, capsys):
    mod, _ = bench
    with pytest.raises(SystemExit) as exc:
        mod.main(["--lse", "--no-public", "--shape", "1,1,8,64"])
    assert exc.value.code == 2 and "--lse" in capsys.readouterr().err


def test_bnhd_inputs_are_views_of_token_major_storage(bench):
    mod, _ = bench
    (q, k, v), = mod.make_inputs((2, 3, 5, 7, 16), torch.float32, "bnhd", 1, 0, device="cpu")
    assert q.shape == (2, 3, 5, 16) and k.shape == v.shape == (2, 3, 7, 16)
    # (B,N,H,D) storage: heads step D elements, tokens step H * D
    assert q.stride() == (5 * 3 * 16, 16, 3 * 16, 1) and k.stride() == (7 * 3 * 16, 16, 3 * 16, 1)
    assert not q.is_contiguous() and q.transpose(1, 2).is_contiguous()
    (q2, _, _), = mod.make_inputs((2, 3, 5, 7, 16), torch.float32, "bhnd", 1, 0, device="cpu")
    assert q2.is_contiguous() and q2.shape == q.shape


def test_the_table_shows_the_ratio_over_flashattention4(bench):
    mod, _ = bench
    rows = [{"method": "ours", "shape": [1, 24, 44776, 44776, 128], "what": "Mochi-1", "path": "wgmma",
             "median_ms": 10.0, "tflops": 700.0, "x_sdpa_cudnn": 1.2, "x_sdpa_cudnn_ci95": (1.1, 1.3),
             "x_fa4": 0.93, "x_fa4_ci95": (0.91, 0.95), "rel_l2_vs_reference": 2e-3}]
    lines = mod.render(rows).splitlines()
    assert "x FA4" in lines[0]
    assert "0.93" in lines[1] and "[0.91,0.95]" in lines[1]


def test_one_call_refuses_a_bad_shape_before_touching_a_device():
    """bench/one_call.py (what ncu and the variants' smoke calls run) stops on a malformed shape
    with a usage error, before it asks for a GPU."""
    import subprocess

    for bad in ("1,2", "1,2,0,64", "1,2,3,4,5,6", "a,b,c,d"):
        r = subprocess.run([sys.executable, str(REPO / "bench" / "one_call.py"), bad], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, (bad, r.stderr)
        assert "shape must be B,H,N,D or B,H,Nq,Nk,D" in r.stderr, r.stderr

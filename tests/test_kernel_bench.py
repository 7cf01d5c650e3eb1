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

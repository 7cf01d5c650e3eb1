"""bench: interleaved order, rotated input sets, skipped backends with reasons, speedups with CIs,
TFLOP/s, the JSON report and the CLI. Timing values themselves are not asserted (no timed tests)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from audit.cli import main  # noqa: E402
from audit.evidence.bench import run_bench  # noqa: E402
from audit.evidence.presets import Shape, resolve_shapes  # noqa: E402
from audit.evidence.selection import Backend, Selection  # noqa: E402

SMALL = Shape(1, 2, 64, 64, 64, "small")


def _sdpa(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _logging_selection(log, oracle_fn=None):
    def primary(q, k, v, scale=None):
        log.append(("candidate", q.data_ptr()))
        return _sdpa(q, k, v)

    def naive(q, k, v, scale=None):
        log.append(("naive", q.data_ptr()))
        return (oracle_fn or _sdpa)(q, k, v)

    return Selection("candidate", "test", "cpu", Backend("candidate", primary, False),
                     Backend("naive", naive, True), "test oracle")


def test_order_is_interleaved_and_rotated_and_input_sets_rotate():
    log = []
    rep = run_bench(_logging_selection(log), [SMALL], "fp32", repeats=6, warmup=1, sets=3,
                    backends=("primary", "naive"), progress=False, capture_environment=False)
    timed = log[2:]  # after one warm-up call each
    names = [n for n, _ in timed]
    assert names == ["candidate", "naive", "naive", "candidate"] * 3  # start rotates every repeat
    assert len({p for _, p in timed}) == 3  # every input set was used
    shape = rep.shapes[0]
    assert shape.input_sets == 3
    assert all(len(b.summary.samples) == 6 for b in shape.backends)


@pytest.mark.parametrize("sets,n_backends", [(2, 2), (2, 4), (3, 3), (4, 2)])
def test_every_backend_sees_every_input_set_and_consecutive_calls_differ(sets, n_backends):
    log = []

    def make(i):
        def fn(q, k, v, scale=None):
            log.append((i, q.data_ptr()))
            return q
        return Backend(f"b{i}", fn, False)

    sel = Selection("candidate", "t", "cpu", make(0), make(1) if n_backends > 1 else None, "")
    # n logging backends in place of the real list
    from audit.evidence import bench as B

    orig = B.backends_for
    B.backends_for = lambda s, d, w=None, dt=None: [(f"b{i}", make(i)) for i in range(n_backends)]
    try:
        B.run_bench(sel, [SMALL], "fp32", repeats=8, warmup=1, sets=sets, progress=False,
                    capture_environment=False)
    finally:
        B.backends_for = orig
    timed = log[n_backends:]
    for i in range(n_backends):
        assert len({p for b, p in timed if b == i}) >= 2  # no backend re-reads one set only
    assert all(a[1] != b[1] for a, b in zip(timed, timed[1:], strict=False))  # never the set just read
    assert len({p for _, p in timed}) == sets


def test_out_of_memory_backend_is_skipped_and_the_rest_goes_on():
    def oom(q, k, v, scale=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    rep = run_bench(_logging_selection([], oracle_fn=oom), [SMALL], "fp32", repeats=3, warmup=1,
                    backends=("primary", "naive", "eager"), progress=False,
                    capture_environment=False)
    b = {x.name: x for x in rep.shapes[0].backends}
    assert b["naive"].status == "skipped" and b["naive"].reason.startswith("out of memory")
    assert b["candidate"].status == "ok" and b["eager"].status == "ok"
    assert [(s.subject, s.baseline) for s in rep.shapes[0].speedups] == [("candidate", "eager")]


def test_failure_mid_run_is_recorded_with_the_repeat():
    calls = {"n": 0}

    def flaky(q, k, v, scale=None):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("device lost")
        return _sdpa(q, k, v)

    sel = Selection("candidate", "t", "cpu", Backend("candidate", _sdpa, False),
                    Backend("naive", flaky, True), "")
    rep = run_bench(sel, [SMALL], "fp32", repeats=5, warmup=1, backends=("primary", "naive"),
                    progress=False, capture_environment=False)
    naive = rep.shapes[0].backend("naive")
    assert naive.status == "skipped" and "repeat 2" in naive.reason and "device lost" in naive.reason


def test_speedups_tflops_and_json(tmp_path, capsys):
    cand = tmp_path / "c.py"
    cand.write_text("import torch.nn.functional as F\n"
                    "def fn(q, k, v, scale=None):\n"
                    "    return F.scaled_dot_product_attention(q, k, v, scale=scale)\n")
    js = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--candidate", f"{cand}:fn", "--device", "cpu", "--preset", "tiny-cross",
              "--repeats", "10", "--warmup", "1", "--json", str(js), "--no-progress"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    data = json.loads(js.read_text())
    assert data["schema"] == "sovereign-audit.bench/1"
    assert data["environment"]["schema"] == "sovereign-audit.environment/1"
    assert data["repeats"] == 10 and data["primary"] == "candidate"
    shape = data["shapes"][0]
    flops = 4 * 1 * 2 * 77 * 300 * 64
    assert shape["shape"]["flops"] == flops
    by = {b["name"]: b for b in shape["backends"]}
    assert set(by) == {"candidate", "naive", "eager", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"}
    for b in by.values():
        if b["status"] == "ok":
            t = b["timing"]
            assert len(t["samples"]) == 10 and t["min"] <= t["q1"] <= t["median"] <= t["q3"] <= t["max"]
            assert b["tflops"] == pytest.approx(flops / (t["median"] * 1e-3) / 1e12)
        else:
            assert b["reason"]  # every skip says why
    assert by["sdpa-flash"]["vendor"] and not by["sdpa-flash"]["sovereign"]
    # SDPA has no cuDNN kernel for CPU tensors: a short reason, not PyTorch's raw error text
    cudnn = by["sdpa-cudnn"]
    assert cudnn["status"] == "skipped"
    assert cudnn["reason"].startswith("not available: this PyTorch has no kernel of this backend")
    assert "on cpu" in cudnn["reason"] and "RuntimeError" not in cudnn["reason"]
    for sp in shape["speedups"]:
        assert sp["subject"] == "candidate"
        assert sp["ci_low"] <= sp["ratio"] <= sp["ci_high"]
        assert sp["ratio"] == pytest.approx(by[sp["baseline"]]["median_ms"] / by["candidate"]["median_ms"])
    assert "speedup candidate vs eager" in out and "95% CI" in out


def test_bad_bench_options_exit_2(capsys, tmp_path):
    cand = tmp_path / "c.py"
    cand.write_text("def fn(q, k, v, scale=None):\n    return q\n")
    for args in (["--repeats", "0"], ["--sets", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["bench", "--candidate", f"{cand}:fn", "--device", "cpu", "--preset", "tiny-64",
                  *args])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith("error:"), (args, err)


def test_bench_exits_1_when_the_measured_kernel_never_ran(tmp_path, capsys):
    cand = tmp_path / "c.py"
    cand.write_text("def fn(q, k, v, scale=None):\n    raise RuntimeError('unsupported here')\n")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--candidate", f"{cand}:fn", "--device", "cpu", "--preset", "tiny-64",
              "--repeats", "2", "--backend", "primary", "--backend", "eager"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "unsupported here" in err


def test_default_shapes_on_cpu_are_the_small_presets():
    rep = run_bench(Selection("candidate", "t", "cpu", Backend("candidate", _sdpa, False), None,
                              "none"), resolve_shapes([], []), "fp32", repeats=1, warmup=0,
                    backends=("primary",), progress=False, capture_environment=False)
    assert [s.shape.name for s in rep.shapes] == ["tiny-128", "tiny-64", "tiny-cross"]


def test_time_cap_reduces_repeats_of_a_slow_backend_and_says_so():
    import time

    def slow(q, k, v, scale=None):
        time.sleep(0.4)
        return _sdpa(q, k, v)

    sel = Selection("candidate", "t", "cpu", Backend("candidate", _sdpa, False),
                    Backend("naive", slow, True), "")
    rep = run_bench(sel, [SMALL], "fp32", repeats=10, warmup=1, backends=("primary", "naive"),
                    progress=False, capture_environment=False, max_backend_s=1.6)
    # a 0.4 s call within a 1.6 s budget: 3-4 repeats; the fast backend (well under the 0.16 s a
    # call it may take before it is capped, even on a loaded machine) keeps all 10
    naive, cand = rep.shapes[0].backend("naive"), rep.shapes[0].backend("candidate")
    assert 3 <= naive.repeats <= 4 and len(naive.summary.samples) == naive.repeats
    assert "capped" in naive.reason and naive.status == "ok"
    assert cand.repeats == 10 and len(cand.summary.samples) == 10


def test_a_shape_whose_inputs_do_not_fit_is_skipped_and_the_next_shape_is_timed():
    # ~256 PB of inputs: torch's CPU allocator refuses at once ("can't allocate memory")
    rep = run_bench(_logging_selection([]), [Shape(99999, 99999, 99999, 99999, 64), SMALL], "fp32", repeats=3,
                    warmup=1, backends=("primary", "eager"), progress=False, capture_environment=False)
    huge, small = rep.shapes
    assert {b.status for b in huge.backends} == {"skipped"}
    assert all(b.reason.startswith("inputs do not fit: out of memory") for b in huge.backends)
    assert {b.status for b in small.backends} == {"ok"}

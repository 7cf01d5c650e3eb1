"""The tiny Wan2.1 pipeline end to end on the CPU with our kernel library (built by the real
builder), with the CPU defaults (naive then flash, in every self- and cross-attention): report
shape, the swap being active, parity of flash against the pre-flash run, the Amdahl figures being
derived from the measured share, and the calibration moving the metric."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from audit.evidence import dit_attention as da  # noqa: E402
from audit.evidence import metrics  # noqa: E402
from audit.evidence import pipeline as P  # noqa: E402
from audit.evidence.pipeline import generate as G  # noqa: E402  (cfg_step, decode: looked up here)
from audit.evidence.pipeline import lanes as L  # noqa: E402  (make_core: the cores of every lane)

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2


@pytest.fixture(scope="session")
def cpu_library() -> str:
    from audit.kernel_build.builder import ensure_built

    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH: the CPU kernel library cannot be built here (make test installs it)")
    # with g++ here, a builder that raises or a build that fails is a test error, not a skip
    result = ensure_built(["cpu"], ROOT / "build")  # build_targets, unless already current
    lib = ROOT / "build" / "cpu" / "libflash_kernel.so"
    assert lib.is_file(), f"the CPU kernel library was not built: {result.to_dict()}"
    return str(lib)


@pytest.fixture(scope="module")
def report(cpu_library):
    # attention and swap left to their defaults: on the CPU naive,flash and self,cross
    return P.run_pipeline("tiny", steps=STEPS, device="cpu", dtype="fp32", seed=0, lib=cpu_library,
                          environment=False)


def test_report_shape_and_schema(report):
    d = report.to_dict()
    assert d["schema"] == "sovereign-audit.pipeline/1"
    assert d["complete"] is True and d["reference"] == "naive" and d["reference_requested"] == "naive"
    json.dumps(d, allow_nan=False)  # strict JSON: no NaN/inf sneaks in
    assert d["versions"]["diffusers"] == "0.42.1" and d["versions"]["torch"]
    assert d["config"]["swap_check"]["bit_exact"] is True
    assert d["config"]["preset"]["transformer"]["attention_head_dim"] == 128
    assert d["library"]["target"] == "cpu"
    assert [r["attention"] for r in d["runs"]] == ["naive", "flash"]
    assert [c["attention"] for c in d["comparisons"]] == ["flash"]
    assert d["config"]["swap"] == ["self", "cross"] and d["config"]["swap_check"]["swapped"] == ["self", "cross"]
    assert d["config"]["cross_attention_shape_b_nq_nk_h_d"] == [1, 75, 512, 2, 128]


def test_every_run_used_its_swapped_core(report):
    layers = report.config["preset"]["transformer"]["num_layers"]
    for run in report.runs:
        assert run.status == "ok", run.reason
        # two CFG passes per step, a self- and a cross-attention call per block and pass
        assert run.attention_calls == STEPS * 2 * layers * 2
        assert len(run.step_s) == STEPS and run.dit_loop_s == pytest.approx(sum(run.step_s))
        assert run.vae_decode_s and run.vae_decode_s > 0
        assert run.instrumented.attention_calls == 2 * layers * 2
        by_kind = run.instrumented.attention_ms_by_kind
        assert list(by_kind) == ["self", "cross"] and [len(v) for v in by_kind.values()] == [2 * layers] * 2
        assert sorted(by_kind["self"] + by_kind["cross"]) == sorted(run.instrumented.attention_ms_samples)
        assert 0 < run.instrumented.share < 1
        assert run.latents_nonfinite == 0


def test_amdahl_comes_from_the_measured_share_and_op_speedup(report):
    ref = report.run("naive").instrumented
    for c in report.comparisons:
        ins = report.run(c.attention).instrumented
        # self and cross swapped: the ratio of the step's summed core times
        s_op = ref.attention_ms_total / ins.attention_ms_total
        assert c.reference_attention_share == pytest.approx(ref.share)
        assert c.op_speedup == pytest.approx(s_op)
        assert c.amdahl_predicted == pytest.approx(1 / ((1 - ref.share) + ref.share / s_op))
        assert c.speedup_dit == pytest.approx(report.run("naive").dit_loop_s / report.run(c.attention).dit_loop_s)
        assert c.speedup_dit_ci["ci_low"] <= c.speedup_dit_ci["ratio"] <= c.speedup_dit_ci["ci_high"]


def test_flash_matches_the_pre_flash_run(report):
    for name in ("flash",):
        c = report.comparison(name)
        for what in (c.latents, c.frames):
            assert what["nan"] == 0 and what["inf"] == 0
            assert what["cosine"] > 0.99999
            assert what["rel_l2"] < 1e-4


def test_calibration_moves_the_metric_beyond_the_kernel_error(report):
    cal = report.calibration
    assert cal.status == "ok" and cal.attention == "flash" and cal.rel == 1e-3
    assert cal.latents["rel_l2"] > 0 and cal.latents["cosine"] < 1.0
    # fp32: a 1e-3 attention error shows far above the flash-vs-naive difference, so the parity
    # figure is read against it, not against "cosine 1.0".
    assert cal.latents["rel_l2"] > 10 * report.comparison("flash").latents["rel_l2"]


def _latents_with(core, tiny, rel=None):
    model, _ = P.build_transformer(tiny, torch.device("cpu"), torch.float32, 0)
    inputs = P.make_inputs(tiny, torch.device("cpu"), torch.float32, 0)
    pert = da.Perturbation(rel, 11) if rel else None
    da.swap_self_attention(model, lambda i: da.SwappedSelfAttnProcessor(core, "x", None, pert))
    with torch.no_grad():
        lat, _ = P.denoise(model, inputs, 1, 5.0, torch.float32, torch.device("cpu"))
    return lat


def test_larger_perturbations_move_the_latents_further():
    tiny = P.get_preset("tiny")
    core = da.make_core("sdpa")
    clean = _latents_with(core, tiny)
    errs = [metrics.compare(_latents_with(core, tiny, rel), clean).rel_l2 for rel in (1e-3, 1e-2)]
    assert 0 < errs[0] < errs[1]
    # A wrong core (1% scaled output) is visible in the parity metric too.
    wrong = _latents_with(lambda q, k, v: core(q, k, v) * 1.01, tiny)
    assert metrics.compare(wrong, clean).rel_l2 > errs[0]


def test_a_failing_core_is_recorded_and_the_rest_goes_on(cpu_library, monkeypatch):
    real = da.make_core

    def broken(name, lib=None):
        if name == "flash":
            def core(q, k, v):
                raise RuntimeError("simulated kernel fault\nsecond line")
            return core
        return real(name, lib)

    monkeypatch.setattr(L, "make_core", broken)
    rep = P.run_pipeline("tiny", steps=1, device="cpu", dtype="fp32", attention="flash,sdpa",
                         lib=cpu_library, decode_video=False, calibrate=True, environment=False)
    flash, sdpa = rep.runs
    assert flash.status == "skipped" and "simulated kernel fault second line" in flash.reason
    assert sdpa.status == "ok" and rep.reference == "sdpa"  # the first core that ran
    assert rep.calibration.attention == "sdpa"
    from audit.errors import GateFailed

    with pytest.raises(GateFailed, match="flash"):
        P.check_outcome(rep)


def test_a_failed_decode_keeps_the_dit_measurement(monkeypatch):
    real = G.decode

    def decode(vae, latents, device):
        if latents.shape[2] > 1:  # the real decode, not the one-frame warm-up
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(vae, latents, device)

    monkeypatch.setattr(G, "decode", decode)
    rep = P.run_pipeline("tiny", steps=1, device="cpu", dtype="fp32", attention="sdpa,sdpa-math",
                         calibrate=False, environment=False)
    for run in rep.runs:
        assert run.status == "ok" and run.dit_loop_s > 0
        assert run.vae_decode_s is None and "simulated" in run.vae_reason
    c = rep.comparison("sdpa-math")
    assert c.latents is not None and c.frames is None and c.speedup_dit_vae is None


def test_every_core_is_warm_before_timing_and_the_cores_take_turns(monkeypatch):
    """The order of work, read off the real calls: warm-up step of every core, the instrumented
    steps, then the loop in turns with the first of each round rotating; the decodes likewise
    (one untimed each, then timed rounds in turns)."""
    seen: list[tuple[str, str]] = []
    final: dict[str, object] = {}
    real_step, real_decode = G.cfg_step, G.decode

    def cfg_step(transformer, *args):
        core = transformer.blocks[0].attn1.processor.name
        out = real_step(transformer, *args)
        seen.append(("step", core))
        final[core] = out
        return out

    def decode(vae, latents, device):
        owner = next((k for k, v in final.items() if v is latents), "warm-up")
        seen.append(("decode", owner))
        return real_decode(vae, latents, device)

    monkeypatch.setattr(G, "cfg_step", cfg_step)
    monkeypatch.setattr(G, "decode", decode)
    rep = P.run_pipeline("tiny", steps=3, device="cpu", dtype="fp32", attention="sdpa,sdpa-math",
                         calibrate=False, environment=False)
    a, b = ("step", "sdpa"), ("step", "sdpa-math")
    assert seen.pop(0) == ("decode", "warm-up")  # a tiny decode initialises the VAE's backends
    assert seen[:10] == [a, b,  # warm-up, every core before anything timed
                         a, b,  # instrumented steps
                         a, b, b, a, a, b]  # the loop: rounds AB, BA, AB
    da_, db_ = ("decode", "sdpa"), ("decode", "sdpa-math")
    assert seen[10:] == [da_, db_,  # untimed decode of each core's latents
                         da_, db_, db_, da_]  # P.VAE_ROUNDS timed rounds, in turns
    assert P.VAE_ROUNDS == 2
    for run in rep.runs:
        assert len(run.step_s) == 3 and len(run.vae_decode_samples_s) == 2
        assert run.vae_decode_s == pytest.approx(sorted(run.vae_decode_samples_s)[0] / 2
                                                 + sorted(run.vae_decode_samples_s)[1] / 2)
    c = rep.comparison("sdpa-math")
    d = c.to_dict()
    assert d["speedup_dit_vae_ci"]["ci_low"] <= d["speedup_dit_vae_measured"] <= d["speedup_dit_vae_ci"]["ci_high"]
    assert [k["what"] for k in d["consistency"]] == ["DiT loop", "DiT loop + VAE decode"]
    assert all(k["verdict"] in ("consistent", "inconsistent") for k in d["consistency"])
    assert d["amdahl_predicted_dit_vae"] <= max(1.0, d["amdahl_predicted_dit"]) + 1e-9
    assert d["op_speedup_ci"]["ci_low"] <= d["op_speedup"] <= d["op_speedup_ci"]["ci_high"]


def test_a_core_failing_mid_loop_leaves_the_others_measured(monkeypatch):
    real = L.make_core

    def flaky(name, lib=None):
        core, calls = real(name, lib), [0]
        if name != "sdpa-math":
            return core

        def failing(q, k, v):
            calls[0] += 1
            if calls[0] > 2 * 2 * 2:  # warm-up and instrumented steps pass, the loop's first fails
                raise RuntimeError("simulated fault in the loop")
            return core(q, k, v)
        return failing

    monkeypatch.setattr(L, "make_core", flaky)
    rep = P.run_pipeline("tiny", steps=2, device="cpu", dtype="fp32", attention="sdpa,sdpa-math",
                         decode_video=False, calibrate=False, environment=False)
    ok, bad = rep.runs
    assert ok.status == "ok" and len(ok.step_s) == 2 and ok.dit_loop_s > 0
    assert bad.status == "skipped" and "simulated fault in the loop" in bad.reason
    assert rep.comparisons == [] and rep.complete


def test_cross_attention_alone_can_be_swapped(cpu_library):
    rep = P.run_pipeline("tiny", steps=1, device="cpu", dtype="fp32", attention="sdpa,flash", swap="cross",
                         lib=cpu_library, decode_video=False, calibrate=False, environment=False)
    layers = rep.config["preset"]["transformer"]["num_layers"]
    assert rep.config["swap"] == ["cross"] and rep.config["attention_calls_per_step"] == 2 * layers
    assert rep.config["swap_check"] == {**rep.config["swap_check"], "bit_exact": True, "swapped": ["cross"]}
    sdpa, flash = rep.runs
    for run in rep.runs:
        assert run.status == "ok", run.reason
        assert run.attention_calls == 2 * layers
        assert list(run.instrumented.attention_ms_by_kind) == ["cross"]
    c = rep.comparison("flash")
    # one kind of call: s_op is the ratio of per-call medians
    assert c.op_speedup == pytest.approx(sdpa.instrumented.attention_ms_per_call_median
                                         / flash.instrumented.attention_ms_per_call_median)
    assert c.latents["cosine"] > 0.99999 and c.latents["rel_l2"] < 1e-4

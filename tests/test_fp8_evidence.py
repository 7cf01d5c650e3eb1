"""`--precision exact|fp8` through parity, bench, pipeline and run: the fp8 gates come from the
typed config (and [parity.gates.fp8]), every evidence JSON records its precision, fp8 on a device
without the FP8 kernel is one `error:` line and exit 2, and the report never headlines an FP8 run
as exact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from audit.cli import main  # noqa: E402
from audit.errors import UsageError  # noqa: E402
from audit.evidence import precision as P  # noqa: E402
from audit.evidence.parity import DEFAULT_COSINE, effective_gates  # noqa: E402
from audit.evidence.selection import Backend, Selection  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAPE = "1,2,150,300,64"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture(scope="module")
def cpu_library() -> str:
    from audit.kernel_build.builder import ensure_built

    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH: the CPU kernel library cannot be built here")
    ensure_built(["cpu"], ROOT / "build")
    lib = ROOT / "build" / "cpu" / "libflash_kernel.so"
    assert lib.is_file()
    return str(lib)


# ---- gates --------------------------------------------------------------------------------------

def test_fp8_gates_come_from_the_typed_config_and_only_the_fp8_table_overrides_them():
    g = effective_gates("bf16", precision="fp8")
    assert (g.cosine, g.rel_l2, g.nonfinite) == (P.FP8_GATES.cosine, P.FP8_GATES.rel_l2, 0) == (0.999, 5e-2, 0)
    exact_only = {"parity": {"gates": {"rel_l2": 1e-9, "bf16": {"cosine": 0.5}}}}
    assert effective_gates("bf16", exact_only, precision="fp8").rel_l2 == 5e-2
    assert effective_gates("bf16", exact_only, precision="fp8").cosine == 0.999
    assert effective_gates("bf16", exact_only).rel_l2 == 1e-9  # the exact gates still read them
    fp8_table = {"parity": {"gates": {"fp8": {"rel_l2": 0.02}}}}
    assert effective_gates("bf16", fp8_table, precision="fp8").rel_l2 == 0.02
    assert effective_gates("bf16", fp8_table).cosine == DEFAULT_COSINE  # exact untouched
    with pytest.raises(UsageError, match="parity.gates.fp8.bogus"):
        effective_gates("bf16", {"parity": {"gates": {"fp8": {"bogus": 1}}}}, precision="fp8")


def test_fp8_is_refused_off_the_cpu_and_unknown_precisions_are_usage_errors():
    P.require("fp8", "cpu")
    P.require("exact", "cuda")
    if not torch.cuda.is_available():  # here: no CUDA at all, and the kernel's needs named
        with pytest.raises(UsageError, match=r"--precision fp8: .*cuda: CUDA is not available.*sm_90a .*cc 9.0"):
            P.require("fp8", "cuda")
    with pytest.raises(UsageError, match="unknown precision 'fp4'"):
        P.require("fp4", "cpu")


# ---- parity and bench ---------------------------------------------------------------------------

def test_parity_fp8_passes_its_gates_and_records_its_precision(cpu_library, capsys, tmp_path):
    out_json = tmp_path / "p.json"
    code, out, err = run_cli(["parity", "--precision", "fp8", "--dtype", "bf16", "--shape", SHAPE,
                              "--json", str(out_json)], capsys)
    assert code == 0, out + err
    d = json.loads(out_json.read_text())
    assert d["precision"] == "fp8" and d["selection"]["precision"] == "fp8"
    assert d["selection"]["primary"]["name"] == "flash-fp8"
    assert d["gates"] == {"rel_l2": 0.05, "cosine": 0.999, "nonfinite": 0}
    s = d["shapes"][0]
    assert {g["name"] for g in s["gates"]} >= {"rel_l2", "cosine", "scale_rel_l2", "dit_rel_l2", "dit_cosine"}
    assert 1e-3 < s["candidate_vs_reference"]["rel_l2"] < 0.05  # quantized: a visible, bounded error
    assert s["dit_probe"]["metrics"]["rel_l2"] < P.FP8_DIT_GATES.rel_l2
    assert "precision fp8" in out and "DiT-shaped" in out


def test_parity_fp8_fails_a_tighter_gate_from_the_config(cpu_library, capsys, tmp_path):
    conf = tmp_path / "gates.toml"
    conf.write_text("[parity.gates.fp8]\nrel_l2 = 1e-3\n")
    code, out, err = run_cli(["parity", "--precision", "fp8", "--shape", SHAPE, "--config", str(conf)],
                             capsys)
    assert code == 1 and "rel_l2 vs reference = " in err and "> 0.001" in err, out + err


def test_parity_exact_is_unchanged_and_says_so(cpu_library, capsys, tmp_path):
    out_json = tmp_path / "p.json"
    code, out, err = run_cli(["parity", "--shape", SHAPE, "--json", str(out_json)], capsys)
    assert code == 0, out + err
    d = json.loads(out_json.read_text())
    assert d["precision"] == "exact" and d["selection"]["primary"]["name"] == "flash"
    assert d["shapes"][0]["candidate_vs_reference"]["rel_l2"] < 1e-4  # fp32 exact: no quantization
    assert d["shapes"][0]["dit_probe"] is None


def test_bench_fp8_records_its_precision(cpu_library, capsys, tmp_path):
    out_json = tmp_path / "b.json"
    code, out, err = run_cli(["bench", "--precision", "fp8", "--shape", SHAPE, "--backend", "primary",
                              "--repeats", "1", "--warmup", "0", "--json", str(out_json)], capsys)
    assert code == 0, out + err
    d = json.loads(out_json.read_text())
    assert d["precision"] == "fp8" and d["primary"] == "flash-fp8"
    assert "precision fp8" in out


@pytest.mark.parametrize("command", ["parity", "bench"])
def test_fp8_on_a_gpu_selection_is_one_error_line_and_exit_2(command, capsys, monkeypatch):
    # a selection on a CUDA device (as select() makes on a GPU machine): the fp8 check refuses it
    import audit.evidence.selection as S

    def on_cuda(**kw):
        be = Backend("flash", lambda q, k, v, scale=None: q, True)
        return Selection("target", "sm_90a", "cuda", be, None, "")

    monkeypatch.setattr(S, "select", on_cuda)
    code, out, err = run_cli([command, "--precision", "fp8", "--shape", SHAPE], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --precision fp8:"), err
    assert "sm_90" in err and "cuda" in err and "Traceback" not in err


def test_run_fp8_on_a_gpu_is_refused_before_anything_runs(capsys, monkeypatch, tmp_path):
    import audit.run.stages as stages

    monkeypatch.setattr(stages, "resolve_device", lambda requested: "cuda")
    code, out, err = run_cli(["run", "--precision", "fp8", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.strip().startswith("error: --precision fp8:") and "sm_90" in err, err
    assert not (tmp_path / "o").exists()


def test_pipeline_fp8_on_a_gpu_is_refused(capsys, monkeypatch):
    pytest.importorskip("diffusers")
    import audit.evidence.pipeline.runner as R

    monkeypatch.setattr(R, "resolve_library", lambda names, device, lib, target: (None, "cuda"))
    code, out, err = run_cli(["pipeline", "--precision", "fp8", "--attention", "sdpa,flash"], capsys)
    assert code == 2 and err.strip().startswith("error: --precision fp8:") and "sm_90" in err, err


def test_pipeline_fp8_runs_flash_fp8_and_calibrates_the_exact_reference(cpu_library):
    pytest.importorskip("diffusers")
    from audit.evidence.pipeline import run_pipeline

    rep = run_pipeline("tiny", steps=1, device="cpu", dtype="fp32", seed=0, lib=cpu_library,
                       environment=False, decode_video=False, precision="fp8").to_dict()
    assert rep["config"]["precision"] == "fp8" and rep["config"]["attention"] == ["naive", "flash-fp8"]
    assert [r["status"] for r in rep["runs"]] == ["ok", "ok"]
    cal = rep["calibration"]
    assert cal["attention"] == "naive"
    lat = rep["comparisons"][0]["latents"]
    assert 0 < lat["rel_l2"] < 5e-2  # FP8 moves the latents, visibly and boundedly


# ---- the report ---------------------------------------------------------------------------------

def _fp8(ev: dict) -> dict:
    ev["run"]["precision"] = "fp8"
    ev["bench"]["precision"] = "fp8"
    ev["bench"]["primary"] = "flash-fp8"
    ev["parity"] = {"precision": "fp8", "passed": True, "dtype": "bf16",
                    "gates": {"rel_l2": 0.05, "cosine": 0.999, "nonfinite": 0},
                    "shapes": [{"shape": {"label": "s (1,2,150,300,64)"}, "status": "passed",
                                "candidate_vs_reference": {"rel_l2": 0.038, "cosine": 0.9993},
                                "candidate_vs_oracle": {"rel_l2": 0.038, "cosine": 0.9993}, "gates": []}]}
    return ev


def test_an_fp8_run_is_never_headlined_as_exact():
    from test_report_headline import cpu_evidence, page_of

    model, page = page_of(_fp8(cpu_evidence()))
    assert "FP8 (quantized, not exact)" in model.title, model.title
    claims = " ".join(c.text for c in model.claimed)
    assert "within the bf16 gates" not in claims and "matches a float64 reference" not in claims
    assert "within the fp8 gates" in claims and "not exact" in claims
    speed = [c.text for c in model.claimed if "faster than" in c.text]
    assert speed and all("FP8 (quantized, not exact)" in t for t in speed)
    abstract = " ".join(model.abstract)
    assert "FP8 parity" in abstract and "the FP8 (quantized, not exact) flash forward is" in abstract
    assert any(n.startswith("Exact attention:") for n in model.not_claimed)
    assert any("FP8" in a for a in model.boundary["applies_to"])
    precision = dict(model.methods)["Precision"]
    assert precision.startswith("FP8 (quantized, not exact)") and "C ABI" not in precision


def test_an_fp8_pipeline_alone_makes_the_report_fp8():
    from test_report_headline import cpu_evidence, page_of

    ev = cpu_evidence()
    ev["pipeline"]["config"]["precision"] = "fp8"
    model, _ = page_of(ev)
    assert "FP8 (quantized, not exact)" in model.title


def test_an_exact_run_says_nothing_of_fp8():
    from test_report_headline import cpu_evidence, page_of

    model, page = page_of(cpu_evidence())
    assert "FP8" not in page

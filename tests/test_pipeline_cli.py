"""`sovereign-audit pipeline` on the command line: bad input is one line and exit 2; the tiny
preset runs and writes its JSON."""

from __future__ import annotations

import json

import pytest

from audit.cli import main


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("argv, needle", [
    (["--preset", "wan-9000p"], "unknown pipeline preset 'wan-9000p'"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--steps", "-3"], "--steps must be a positive integer"),
    (["--attention", "naive,cudnn-magic"], "unknown attention 'cudnn-magic'"),
    (["--attention", "flash,flash"], "lists a core twice"),
    (["--attention", ","], "needs at least one"),
    (["--json", "/nonexistent-dir/x/pipeline.json"], "does not exist or is not writable"),
    (["--calibration-rel", "0", "--attention", "sdpa"], "calibration perturbation must be > 0"),
    (["--guidance-scale", "nan", "--attention", "sdpa"], "--guidance-scale must be finite"),
    (["--swap", "attn1"], "unknown --swap entry 'attn1'"),
    (["--swap", "self,self"], "an entry twice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    code, out, err = run_cli(["pipeline", *argv], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in out + err


def test_steps_must_be_an_integer(capsys):
    code, _, err = run_cli(["pipeline", "--steps", "many"], capsys)
    assert code == 2 and "Traceback" not in err


def test_cuda_without_a_gpu_is_exit_2(capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run_cli(["pipeline", "--device", "cuda", "--attention", "sdpa"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "error: --device cuda requested but torch sees no CUDA GPU"]


def test_lib_with_sdpa_only_is_exit_2(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    code, _, err = run_cli(["pipeline", "--attention", "sdpa", "--lib", str(tmp_path / "x.so")], capsys)
    assert code == 2 and "uses no core of our library" in err


def test_missing_library_file_is_exit_2(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    code, _, err = run_cli(["pipeline", "--lib", str(tmp_path / "nope.so")], capsys)
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1


def test_tiny_runs_from_the_cli_and_writes_json(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    out_json = tmp_path / "pipeline.json"
    code, out, err = run_cli(["pipeline", "--preset", "tiny", "--steps", "1", "--attention", "sdpa,sdpa-math",
                              "--no-decode", "--json", str(out_json), "--quiet"], capsys)
    assert code == 0, err
    assert "sdpa-math vs sdpa" in out and "calibration (sdpa-math" not in out
    data = json.loads(out_json.read_text())
    assert data["schema"] == "sovereign-audit.pipeline/1" and data["complete"] is True
    assert data["config"]["decode"] is False and data["comparisons"][0]["frames"] is None
    assert data["calibration"]["attention"] == "sdpa" and data["calibration"]["status"] == "ok"
    assert not list(tmp_path.glob("*.tmp"))

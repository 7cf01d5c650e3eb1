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


# ---- context parallelism: --ulysses / --ring under torchrun --------------------------------------

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def as_rank(monkeypatch, world: int, rank: int = 0) -> None:
    """The environment torchrun gives a process (no process group is made by the refusals below)."""
    for k, v in {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": 29400}.items():
        monkeypatch.setenv(k, str(v))


def test_parallel_outside_torchrun_is_one_error_line(monkeypatch, capsys):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    code, out, err = run_cli(["pipeline", "--ulysses", "2"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --ulysses/--ring need one process per rank, "
                                                                  "started by torchrun")
    assert "torchrun --nproc-per-node 2" in lines[0] and "Traceback" not in out + err


@pytest.mark.parametrize("argv, world, needle", [
    (["--ulysses", "2"], 3, "--ulysses 2 x --ring 1 needs 2 processes; torchrun started 3"),
    (["--ulysses", "2", "--ring", "2"], 2, "--ulysses 2 x --ring 2 needs 4 processes; torchrun started 2"),
    (["--ring", "0"], 2, "--ring must be a positive integer"),
    (["--ulysses", "-1"], 2, "--ulysses must be a positive integer"),
])
def test_parallel_world_size_mismatch_is_one_error_line(monkeypatch, capsys, argv, world, needle):
    as_rank(monkeypatch, world)
    code, out, err = run_cli(["pipeline", *argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


@pytest.mark.parametrize("argv, needle", [
    (["--preset", "tiny", "--ulysses", "2"], "the preset's 75 video tokens do not split into 2 equal parts"),
    (["--preset", "tiny-cp", "--ring", "2", "--attention", "sdpa,flash"],
     "--ring merges partial results by the log-sum-exp, which sdpa does not return"),
])
def test_parallel_runs_the_split_cannot_serve_are_refused(monkeypatch, capsys, argv, needle):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    as_rank(monkeypatch, 2)
    code, out, err = run_cli(["pipeline", "--device", "cpu", *argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err


@pytest.mark.parametrize("split", [["--ulysses", "2"], ["--ring", "2"]], ids=["ulysses", "ring"])
def test_tiny_cp_under_torchrun_with_gloo(tmp_path, split):
    """Two processes launched by torchrun on the CPU (gloo): rank 0 alone prints and writes the
    report; the swap is bit-exact under the split; flash against naive as in one process."""
    import os
    import socket
    import subprocess
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_json = tmp_path / "pipeline.json"
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(port), "-m", "audit.cli", "pipeline", "--preset", "tiny-cp", *split, "--steps", "1",
                           "--no-decode", "--no-calibrate", "--attention", "naive,flash", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("flash vs naive") == 1  # one voice
    data = json.loads(out_json.read_text())
    par = data["config"]["parallel"]
    assert par["world_size"] == 2 and par["split"] == split[0].lstrip("-") + " 2"
    assert data["config"]["swap_check"]["bit_exact"] is True
    assert [r["status"] for r in data["runs"]] == ["ok", "ok"]
    (cmp,) = data["comparisons"]
    assert cmp["latents"]["rel_l2"] < 1e-4

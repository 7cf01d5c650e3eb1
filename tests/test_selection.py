"""Selection and bad input: shapes, presets, candidates, devices, gates, config; every bad input
is one `error:` line and exit 2 (a library or config that cannot be read: 3)."""

from __future__ import annotations

import pytest

from audit.cli import main
from audit.errors import UsageError
from audit.evidence.presets import PRESETS, Shape, parse_shape, preset, resolve_shapes

torch = pytest.importorskip("torch")


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def one_error_line(err: str) -> bool:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err


@pytest.fixture
def cand(tmp_path):
    """A candidate file with good and broken functions."""
    p = tmp_path / "cands.py"
    p.write_text(
        "import torch.nn.functional as F\n"
        "def good(q, k, v, scale=None):\n"
        "    return F.scaled_dot_product_attention(q, k, v, scale=scale)\n"
        "not_callable = 3\n")
    return p


def test_parse_shape_forms():
    assert parse_shape("1,12,32760,128") == Shape(1, 12, 32760, 32760, 128)
    assert parse_shape(" 2, 3, 77, 300, 64 ") == Shape(2, 3, 77, 300, 64)
    s = parse_shape("1,2,77,300,64")
    assert s.flops == 4 * 1 * 2 * 77 * 300 * 64 and s.label == "(1,2,77,300,64)"


@pytest.mark.parametrize("text", ["1,2,3", "1,2,3,4,5,6", "1,x,3,4", "1,0,3,4", "1,-2,3,4", "",
                                  "1,2,3,4.5", "1,2,99999999999,4"])
def test_malformed_shapes_raise(text):
    with pytest.raises(UsageError):
        parse_shape(text)


def test_presets_match_the_issue():
    assert preset("wan2.1-1.3b-480p") == Shape(1, 12, 32760, 32760, 128, "wan2.1-1.3b-480p")
    assert preset("hunyuanvideo-720p").nq == 118800
    assert preset("ltx-video").batch == 2 and preset("cogvideox-5b").head_dim == 64
    assert preset("tiny-cross").nk == 300
    with pytest.raises(UsageError, match="unknown preset"):
        preset("wan3")
    assert [s.name for s in resolve_shapes([], [])] == ["tiny-128", "tiny-64", "tiny-cross"]
    assert len(PRESETS) >= 10


@pytest.mark.parametrize("cmd", ["parity", "bench"])
@pytest.mark.parametrize("args,needle", [
    (["--shape", "1,2,3"], "malformed shape"),
    (["--shape", "a,b,c,d"], "malformed shape"),
    (["--preset", "no-such-model"], "unknown preset"),
    (["--candidate", "nocolon"], "malformed --candidate"),
    (["--candidate", "no_such_module_xyz:fn"], "cannot import candidate module"),
    (["--candidate", "{cand}:missing"], "has no attribute"),
    (["--candidate", "{cand}:not_callable"], "not callable"),
    (["--candidate", "{broken}:fn"], "cannot import candidate module"),
    (["--candidate", "{cand}:good", "--lib", "/nonexistent.so"], "only one of"),
    (["--lib", "/nonexistent/libflash_kernel.so"], "does not exist"),
    (["--candidate", "{cand}:good", "--config", "{badtoml}"], "not valid TOML"),
    (["--target", "../evil"], "malformed target"),
])
def test_bad_input_exits_2_with_one_line(cmd, args, needle, cand, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import definitely_not_a_module_qq\n")
    badtoml = tmp_path / "bad.toml"
    badtoml.write_text("[parity.gates\nrel_l2 = ")
    args = [a.format(cand=cand, broken=broken, badtoml=badtoml) for a in args]
    code, out, err = run_cli([cmd, *args, "--device", "cpu"], capsys)
    assert code == 2, (out, err)
    assert one_error_line(err), err
    assert needle in err


def test_candidate_syntax_error_is_a_usage_error(tmp_path, capsys):
    p = tmp_path / "syn.py"
    p.write_text("def fn(:\n")
    code, out, err = run_cli(["parity", "--candidate", f"{p}:fn", "--device", "cpu"], capsys)
    assert code == 2 and one_error_line(err) and "SyntaxError" in err


def test_device_cuda_without_gpu(cand, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    code, out, err = run_cli(["parity", "--candidate", f"{cand}:good", "--device", "cuda",
                              "--preset", "tiny-64"], capsys)
    assert code == 2 and one_error_line(err) and "no CUDA GPU" in err


@pytest.mark.parametrize("gate,needle", [("rel_l2", "malformed --gate"), ("speed=3", "malformed --gate"),
                                         ("rel_l2=abc", "not a number"), ("cosine=2", "<= 1"),
                                         ("rel_l2=-1", ">= 0"), ("rel_l2=inf", "finite")])
def test_bad_gate_values(gate, needle, cand, capsys):
    code, out, err = run_cli(["parity", "--candidate", f"{cand}:good", "--device", "cpu",
                              "--preset", "tiny-64", "--gate", gate], capsys)
    assert code == 2 and one_error_line(err) and needle in err


def test_unknown_config_key(cand, tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[parity.gates]\nspeed = 3\n")
    code, out, err = run_cli(["parity", "--candidate", f"{cand}:good", "--device", "cpu",
                              "--preset", "tiny-64", "--config", str(cfg)], capsys)
    assert code == 2 and "unknown key parity.gates.speed" in err


def test_config_that_is_a_directory(cand, tmp_path, capsys):
    cfg = tmp_path / "dir.toml"
    cfg.mkdir()
    code, out, err = run_cli(["parity", "--candidate", f"{cand}:good", "--device", "cpu",
                              "--preset", "tiny-64", "--config", str(cfg)], capsys)
    assert code == 2 and "directory" in err and "Traceback" not in err


def test_untrusted_text_is_escaped_in_output(tmp_path, capsys):
    p = tmp_path / "e\x1b[31mred.py"  # a terminal escape in the candidate's file name
    p.write_text("import torch.nn.functional as F\n"
                 "def fn(q, k, v, scale=None):\n"
                 "    return F.scaled_dot_product_attention(q, k, v, scale=scale)\n")
    code, out, err = run_cli(["parity", "--candidate", f"{p}:fn", "--device", "cpu",
                              "--preset", "tiny-64"], capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\\x1b[31mred.py" in out


def test_list_presets(capsys):
    code, out, err = run_cli(["bench", "--list-presets"], capsys)
    assert code == 0 and "wan2.1-14b-720p" in out and "1,40,75600,128" in out

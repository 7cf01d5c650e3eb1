"""bench at the diffusion-transformer shapes, as a user runs it: the preset groups, (B,H,Nq,Nk,D)
shapes, our library timed through the public call flash_kernel.attention, the flash path each
shape ran, a head dim the library lacks reported as a refused row (the other backends still
timed), and the closing table of ours against SDPA with intervals. Our CPU library is built by
the real builder; timing values themselves are not asserted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import flash_kernel  # noqa: E402
from audit.cli import main  # noqa: E402
from audit.errors import UsageError  # noqa: E402
from audit.evidence.presets import PRESET_GROUPS, PRESETS, expand_preset, resolve_shapes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cpu_build():
    from audit.kernel_build.builder import ensure_built

    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH: the CPU kernel library cannot be built here (make test installs it)")
    ensure_built(["cpu"], ROOT / "build")  # where both `bench --target cpu` and the public call look
    lib = ROOT / "build" / "cpu" / "libflash_kernel.so"
    assert lib.is_file()
    return lib


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# ---- presets ------------------------------------------------------------------------------------

def test_the_dit_group_holds_the_image_video_cross_and_head_dim_shapes():
    dit = [(s.batch, s.heads, s.nq, s.nk, s.head_dim) for s in expand_preset("dit")]
    for shape in [(1, 24, 4608, 4608, 128), (2, 24, 4429, 4429, 64), (1, 16, 4173, 4173, 64),
                  (2, 24, 8192, 8192, 128), (8, 16, 2048, 2048, 128), (1, 12, 32760, 32760, 128),
                  (1, 40, 75600, 75600, 128), (1, 30, 17776, 17776, 64), (1, 12, 32760, 512, 128),
                  (2, 40, 32760, 512, 128)]:
        assert shape in dit, shape
    assert {d for *_, d in dit} == {32, 64, 72, 80, 96, 128, 256}
    assert len(dit) == len(set(dit))
    assert all(n in PRESETS for members in PRESET_GROUPS.values() for n in members)


def test_groups_expand_in_order_after_the_shapes():
    shapes = resolve_shapes(["1,2,3,4,64"], ["cross", "tiny-64"])
    assert [(s.nq, s.nk) for s in shapes] == [(3, 4), (32760, 512), (32760, 512), (257, 257)]
    assert [s.name for s in shapes] == ["", "wan2.1-1.3b-cross", "wan2.1-14b-cross", "tiny-64"]


def test_an_unknown_preset_names_the_groups():
    with pytest.raises(UsageError, match="groups: image, video, cross, head-dims, dit, tiny"):
        expand_preset("flux-2048")


def test_list_presets_shows_the_groups(capsys):
    code, out, _ = run_cli(["bench", "--list-presets"], capsys)
    assert code == 0
    assert "groups (--preset GROUP" in out
    assert "cross                wan2.1-1.3b-cross, wan2.1-14b-cross" in out
    assert "wan2.1-1.3b-cross    1,12,32760,512,128  Wan2.1-1.3B text cross-attention" in out


# ---- the bench through the public call ------------------------------------------------------------

def test_bench_times_the_public_call_names_the_path_and_refuses_a_missing_head_dim(cpu_build, capsys, tmp_path,
                                                                                monkeypatch):
    monkeypatch.delenv("FLASH_KERNEL_BUILD", raising=False)
    monkeypatch.delenv("FLASH_KERNEL_TARGET", raising=False)
    calls = []
    public = flash_kernel.attention

    def counting(q, k, v, scale=None, layout="bhnd"):
        calls.append(tuple(q.shape))
        return public(q, k, v, scale=scale, layout=layout)

    monkeypatch.setattr(flash_kernel, "attention", counting)
    js = tmp_path / "bench.json"
    code, out, err = run_cli(["bench", "--device", "cpu", "--shape", "1,2,40,44", "--shape", "1,2,33,70,64",
                              "--repeats", "3", "--warmup", "1", "--sets", "2", "--backend", "primary",
                              "--backend", "sdpa-flash", "--backend", "sdpa-cudnn", "--json", str(js),
                              "--no-progress"], capsys)
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["primary"] == "flash" and data["primary_call"] == "flash_kernel.attention (the public call)"
    refused, cross = data["shapes"]
    # every call of ours went through flash_kernel.attention: warm-up + repeats on each shape
    assert calls.count((1, 2, 33, 64)) == 1 + 3 and calls.count((1, 2, 40, 44)) == 1
    by = {b["name"]: b for b in refused["backends"]}
    assert refused["path"] == "refused" and by["flash"]["status"] == "refused"
    assert by["flash"]["reason"].startswith("FK_ERR_HEAD_DIM: head_dim 44 is not supported")
    assert by["sdpa-flash"]["status"] == "ok"  # the others are still timed on a refused shape
    assert refused["speedups"] == []
    assert cross["path"] == "cpu" and cross["shape"]["nq"] == 33 and cross["shape"]["nk"] == 70
    assert {b["name"]: b["status"] for b in cross["backends"]}["flash"] == "ok"
    assert [sp["baseline"] for sp in cross["speedups"]] == ["sdpa-flash"]  # no cuDNN on the CPU
    table = out[out.index("ours = flash"):].splitlines()
    assert "ours/cuDNN" in table[1] and "ours/SDPA-flash" in table[1]
    row = next(line for line in table if line.startswith("1,2,40,40,44"))
    assert " refused " in row
    assert any("refused: FK_ERR_HEAD_DIM" in line for line in table)
    sp = cross["speedups"][0]
    row = next(line for line in table if line.startswith("1,2,33,70,64"))
    assert " cpu " in row and f"{sp['ratio']:.2f} [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]" in row


def test_bench_of_only_refused_shapes_exits_1(cpu_build, capsys):
    code, _, err = run_cli(["bench", "--device", "cpu", "--shape", "1,2,40,44", "--repeats", "2",
                            "--backend", "primary", "--no-progress"], capsys)
    assert code == 1 and "flash ran on no shape" in err and "FK_ERR_HEAD_DIM" in err


def test_a_library_other_than_the_public_calls_is_called_directly_and_says_so(cpu_build, capsys, tmp_path,
                                                                           monkeypatch):
    copy = tmp_path / "elsewhere" / "libflash_kernel.so"
    copy.parent.mkdir()
    shutil.copy(cpu_build, copy)
    monkeypatch.setattr(flash_kernel, "attention", lambda *a, **k: pytest.fail("the public call was used"))
    js = tmp_path / "bench.json"
    code, out, err = run_cli(["bench", "--lib", str(copy), "--shape", "1,1,17,64", "--repeats", "2",
                              "--backend", "primary", "--json", str(js), "--no-progress"], capsys)
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["primary_call"].startswith("Library.attention") and data["shapes"][0]["path"] == "cpu"
    assert "called through Library.attention" in out


def test_the_report_names_the_path_ours_ran_and_what_the_pipeline_swapped():
    from audit.report.readers import pipeline_swapped
    from audit.report.tables import bench_table

    def shape(path):
        return {"shape": {"label": "x", "batch": 1, "heads": 1, "nq": 8, "nk": 8, "head_dim": 64}, "path": path,
                "backends": [{"name": "flash", "status": "ok" if path != "refused" else "refused",
                              "reason": "FK_ERR_HEAD_DIM: no" if path == "refused" else "", "timing": {}},
                             {"name": "sdpa-cudnn", "vendor": True, "status": "ok", "timing": {}}],
                "speedups": []}

    ev = {"bench": {"primary": "flash", "shapes": [shape("wgmma"), shape("refused"), shape(None)]}}
    _, rows = bench_table(ev)
    names = [r["cells"][1]["text"] for r in rows]
    assert names == ["flash (ours, wgmma path)", "sdpa-cudnn (vendor)", "flash (ours)", "sdpa-cudnn (vendor)",
                     "flash (ours)", "sdpa-cudnn (vendor)"]
    assert rows[2]["cells"][2]["text"].startswith("refused: FK_ERR_HEAD_DIM")
    assert pipeline_swapped({"pipeline": {"config": {"swap": ["self", "cross"]}}}) == "self- and cross-attention"
    assert pipeline_swapped({"pipeline": {"config": {"swap": ["cross"]}}}) == "cross-attention"
    assert pipeline_swapped({"pipeline": {"config": {}}}) == "self-attention"  # evidence from before --swap

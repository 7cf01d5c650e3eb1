"""Text stays short when a dependency is audited in the same run: each file that loads it gets
one line naming what it brings and where that is listed (a torch wheel's 130 binaries each
repeated libtorch_cpu's MKL and oneDNN findings in full); -v and JSON still have every finding.
gcc-built libraries: one defining cuBLAS and CBLAS symbols, two that NEED it."""

from __future__ import annotations

import json

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.cli import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    require_tool("gcc")
    d = tmp_path_factory.mktemp("through")
    cc_shared(d / "lib/libheavy.so", "int cublasSgemm_v2(void){return 0;}\nint cblas_sgemm(void){return 1;}\n",
              "-Wl,-soname,libheavy.so", name="heavy.c")
    for app in ("one", "two"):
        cc_shared(d / f"lib/lib{app}.so", "extern int cublasSgemm_v2(void);\nint f(void){return cublasSgemm_v2();}\n",
                  f"-L{d / 'lib'}", "-lheavy", "-Wl,-rpath,$ORIGIN", name=f"{app}.c")
    for src in (d / "lib").glob("*.c"):
        src.unlink()
    return d / "lib"


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["check", *map(str, args)])
    assert exc.value.code == 1
    return capsys.readouterr().out


def section(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL") and ln.endswith(name))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start + 1:end]


def test_a_dependency_audited_here_is_one_line(folder, capsys):
    out = run(capsys, folder)
    heavy = section(out, "libheavy.so")
    assert any("[nvidia.cublas]" in ln for ln in heavy) and any("[blas.cblas]" in ln for ln in heavy)
    for app in ("libone.so", "libtwo.so"):
        own = section(out, app)
        through = [ln for ln in own if "through libheavy.so" in ln]
        assert len(through) == 1, own
        assert through[0].startswith("  x through libheavy.so: ")
        assert "blas.cblas" in through[0] and "nvidia.cublas" in through[0]
        assert f"listed under {folder / 'libheavy.so'}" in through[0]
        assert not any("cblas_sgemm" in ln for ln in own)  # not repeated


def test_verbose_and_json_keep_the_findings_under_each_file(folder, capsys):
    out = run(capsys, folder, "-v")
    assert any("cblas_sgemm" in ln for ln in section(out, "libone.so"))
    doc = json.loads(run(capsys, folder, "--format", "json"))
    one = next(f for f in doc["files"] if f["path"].endswith("libone.so"))
    rules = {f["rule"] for f in one["findings"] if f.get("matches_in")}
    assert {"blas.cblas", "nvidia.cublas"} <= rules

"""The text report stays a page wide: a name of hundreds of characters (C++ kernel and template
names) is shown as its start and end, names alike once cut are shown once, and -v and JSON keep
every name whole. A gcc-built library defining long cuBLAS-prefixed symbols."""

from __future__ import annotations

import json

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.cli import main

MIDDLE = "x" * 400
NAMES = [f"cublasKernel_{MIDDLE}_{tail}" for tail in ("first", "second")] + \
        [f"cublasKernel_{MIDDLE}{'y' * 50}{MIDDLE}_first"]  # differs from the first only in its middle


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    require_tool("gcc")
    d = tmp_path_factory.mktemp("long-names")
    return cc_shared(d / "liblong.so", "".join(f"int {n}(void){{return {i};}}\n" for i, n in enumerate(NAMES)))


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["check", *map(str, args)])
    assert exc.value.code == 1
    return capsys.readouterr().out


def test_long_names_are_cut_in_text(lib, capsys):
    out = run(capsys, lib)
    line = next(ln for ln in out.splitlines() if "static-symbol" in ln)
    assert len(line) < 400
    assert "3: cublasKernel_" in line and "_second" in line and MIDDLE not in out
    # the first and third look alike once cut: shown once, and the count says 3
    shown = line.split(": ", 2)[2].rsplit("  (", 1)[0].split(", ")
    assert len(shown) == 3 and shown[-1] == "+1 more"


def test_verbose_and_json_keep_every_name_whole(lib, capsys):
    out = run(capsys, lib, "-v")
    assert all(n in out for n in NAMES)
    doc = json.loads(run(capsys, lib, "--format", "json"))
    (finding,) = [f for f in doc["files"][0]["findings"] if f["kind"] == "static-symbol"]
    assert sorted(n for m in finding["matches"] for n in m["names"]) == sorted(NAMES)


def test_a_long_note_is_cut_at_its_end():
    from audit.linkage.model import Finding
    from audit.linkage.outputs.text import _finding_lines

    f = Finding(rule="nvidia.cublas", kind="static-symbol", subject="cublasX", where=".dynsym", reason="r",
                detail="stubs: " + ", ".join(f"cublasName{i} -> dlsym slot" for i in range(40)))
    (note,) = [ln for ln in _finding_lines(f, False) if "note:" in ln]
    assert note.endswith("...") and "stubs: cublasName0 -> dlsym slot, cublasName1" in note and len(note) < 330
    (full,) = [ln for ln in _finding_lines(f, True) if "note:" in ln]
    assert full.endswith("cublasName39 -> dlsym slot")

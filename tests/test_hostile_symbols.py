"""Names read from a binary reach every output of `check` as inert text: a gcc-assembled .so
whose vendor-prefixed symbol carries a terminal escape, a GitHub workflow command and markup,
and whose file name does too."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET

import pytest
from conftest import require_tool

from audit.cli import main

SYMBOL = "cublasEvil\x1b[2J::error file=x::pwned<script>alert(1)</script>%0A"
FILE = "lib<i>\x1b[31m::warning::x.so"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    require_tool("gcc")
    d = tmp_path_factory.mktemp("hostile-symbols")
    asm = d / "h.s"
    # GAS takes any byte but '"' and '\\' inside a quoted symbol name
    asm.write_text(f'\t.text\n\t.globl "{SYMBOL}"\n\t.type "{SYMBOL}", @function\n"{SYMBOL}":\n\tret\n'
                   '\t.section .note.GNU-stack,"",@progbits\n')
    lib = d / FILE
    subprocess.run(["gcc", "-shared", "-o", str(lib), str(asm)], check=True, capture_output=True)
    return lib


def outputs(hostile, tmp_path, capsys) -> dict[str, str]:
    files = {fmt: tmp_path / f"out.{fmt}" for fmt in ("text", "json", "sarif", "junit", "github")}
    with pytest.raises(SystemExit) as exc:
        main(["check", str(hostile), *[a for fmt, p in files.items() for a in ("--format", f"{fmt}={p}")]])
    capsys.readouterr()
    assert exc.value.code == 1  # the symbol is a cuBLAS name: the file fails
    return {fmt: p.read_text() for fmt, p in files.items()}


def test_no_output_carries_a_raw_control_character(hostile, tmp_path, capsys):
    out = outputs(hostile, tmp_path, capsys)
    for fmt, text in out.items():
        assert "\x1b" not in text, fmt
    assert "cublasEvil\\x1b[2J::error file=x::pwned<script>" in out["text"]
    # JSON and SARIF keep the exact name as data
    subjects = [f["subject"] for f in json.loads(out["json"])["files"][0]["findings"]]
    assert SYMBOL in subjects
    assert SYMBOL in strings(json.loads(out["sarif"]))


def strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


def test_github_annotations_cannot_start_a_command(hostile, tmp_path, capsys):
    lines = outputs(hostile, tmp_path, capsys)["github"].splitlines()
    commands = [ln for ln in lines if ln.startswith("::")]
    assert commands and all(ln.startswith("::error file=") for ln in commands)
    for ln in commands:
        head = ln.partition("::")[2].partition("::")[0]
        assert "\n" not in ln and "%0A" not in head.replace("%250A", "")
        assert "::" not in head  # the file property's colons are %3A
    assert any("pwned<script>alert(1)</script>%250A" in ln for ln in commands)


def test_junit_is_well_formed_with_the_name_as_text(hostile, tmp_path, capsys):
    root = ET.fromstring(outputs(hostile, tmp_path, capsys)["junit"])
    failures = list(root.iter("failure"))
    assert failures
    assert any("pwned<script>" in f.get("message") for f in failures)  # as text, once parsed

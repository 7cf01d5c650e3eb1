"""PE exports that are loader stubs are run-time loads, not static copies.

cuDNN's Windows dispatcher exports its API as functions that resolve their own name once
through GetProcAddress, keep the pointer and call through it. The fixtures are built by
clang-15 --target=x86_64-pc-windows-msvc with lld-link-15 (thread-safe statics and Control Flow
Guard, as MSVC builds cudnn64_9.dll) and by MinGW-w64 GCC, from tests/fixtures/pe_stubs; what a
test expects comes from those sources and from llvm-objdump-15, never from the code under test.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import once, run
from platform_fixtures import MINGW
from test_check_pe import alone, check_json

from audit.pe import stubs
from audit.pe.reader import read_pe

SRC = Path(__file__).parent / "fixtures" / "pe_stubs"
STUBS = ("cudnnActivationForward", "cudnnAddTensor", "cudnnGetVersion")
CONTROL = ("cudnnCreate", "cudnnGetProperty", "cudnnRunCallback")


@pytest.fixture(scope="module")
def pe_stubs(fixture_root) -> dict[str, Path]:
    return once("pe_stubs", lambda: _build(fixture_root))


def _build(fixture_root) -> dict[str, Path]:
    clang, lld_link = require_tool("clang-15"), require_tool("lld-link-15")
    d = fixture_root / "pe_stubs"
    d.mkdir(exist_ok=True)
    msvc = [clang, "--target=x86_64-pc-windows-msvc", "-O2", "-c"]
    cfg = ["-Xclang", "-cfguard"]
    run([require_tool("llvm-dlltool-15"), "-m", "i386:x86-64", "-d", SRC / "kernel32.def", "-l", "kernel32.lib"], cwd=d)
    run([*msvc, *cfg, "-fno-exceptions", "-fms-compatibility-version=19.40", "-o", "stubs.obj", SRC / "stubs.cpp"],
        cwd=d)
    run([*msvc, "-o", "plain.obj", SRC / "plain.c"], cwd=d)
    run([*msvc, *cfg, "-o", "control.obj", SRC / "control.c"], cwd=d)
    run([*msvc, "-o", "support.obj", SRC / "support.c"], cwd=d)
    run([*msvc, "-o", "dispatch.obj", SRC / "dispatch.s"], cwd=d)
    link = [lld_link, "/dll", "/nodefaultlib", "/guard:cf", "/entry:_DllMainCRTStartup"]
    run([*link, "/out:fkstubs.dll", "stubs.obj", "plain.obj", "support.obj", "dispatch.obj", "kernel32.lib"], cwd=d)
    run([*link, "/out:fkcontrol.dll", "control.obj", "support.obj", "dispatch.obj", "kernel32.lib"], cwd=d)
    run([require_tool(MINGW), "-O2", "-shared", "-o", "fkmingw.dll", SRC / "plain.c"], cwd=d)
    return {"stubs": d / "fkstubs.dll", "control": d / "fkcontrol.dll", "mingw": d / "fkmingw.dll"}


def disassembly(path: Path, name: str) -> list[str]:
    """llvm-objdump-15 -d lines of the function `name` (its label to the next blank line)."""
    out = subprocess.run([require_tool("llvm-objdump-15"), "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(rf"^[0-9a-f]+ <{name}>:\n(.*?)(?:\n\n|\Z)", out, re.M | re.S)
    assert m, f"{name} not in the disassembly of {path.name}"
    return m.group(1).splitlines()


def stored_slot(lines: list[str]) -> int:
    """The slot the first `movq %rax, N(%rip)` stores the resolved pointer to, from objdump's
    comment (the static resolver that follows, unlabelled, stores its library handle)."""
    slots = [int(m.group(1), 16) for line in lines
             if (m := re.search(r"movq\s+%rax, -?\d+\(%rip\)\s+# 0x([0-9a-f]+)", line))]
    assert slots, lines
    return slots[0]


def findings(data: dict, name: str) -> list[dict]:
    f = next(f for f in data["files"] if f["path"].endswith(name))
    return [x for x in f["findings"] if x["rule"] == "nvidia.cudnn"]


def test_the_fixture_stubs_have_the_dispatcher_shape(pe_stubs):
    """Each export stores the resolved pointer, loads it back and leaves through an indirect
    jump or call; the C++ ones test _Init_thread_epoch (%gs:88) first, as cuDNN's do."""
    for path, names in ((pe_stubs["stubs"], STUBS), (pe_stubs["mingw"], ("cudnnAddTensor",))):
        for name in names:
            lines = disassembly(path, name)
            slot = stored_slot(lines)
            assert any(re.search(rf"movq\s+-?\d+\(%rip\), %r\w+\s+# 0x{slot:x}\b", x) for x in lines), lines
            assert any(re.search(r"(jmpq|callq)\s+\*", x) for x in lines), lines
    for name in ("cudnnActivationForward", "cudnnGetVersion"):
        assert any("%gs:88" in x for x in disassembly(pe_stubs["stubs"], name))


@pytest.mark.parametrize("which,names", [("stubs", STUBS), ("mingw", ("cudnnAddTensor",))])
def test_loader_stubs_are_loads_not_static_copies(pe_stubs, which, names, tmp_path, capsys):
    path = pe_stubs[which]
    _rc, data, _err = check_json(capsys, alone(path, tmp_path))
    got = findings(data, path.name)
    assert not [x for x in got if x["kind"] == "static-symbol"], got
    stub = [x for x in got if x["kind"] == "dlopen-string" and "GetProcAddress of their own name" in (x["detail"] or "")]
    assert len(stub) == 1 and stub[0]["detail"].startswith(f"{len(names)} defined function(s) are stubs"), got
    for name in names[:3]:
        slot = stored_slot(disassembly(path, name))
        assert f'{name} -> GetProcAddress("{name}") slot @0x{slot:x}' in stub[0]["detail"]


def test_real_code_and_other_indirect_calls_stay_static(pe_stubs, tmp_path, capsys):
    """cudnnRunCallback stores a pointer, names itself and jumps through the pointer;
    cudnnGetProperty asks GetProcAddress for another name: neither is a loader stub."""
    path = pe_stubs["control"]
    run_cb = disassembly(path, "cudnnRunCallback")
    assert any(re.search(r"movq\s+%r\w+, -?\d+\(%rip\)", x) for x in run_cb)
    assert any(re.search(r"jmpq\s+\*", x) for x in run_cb)
    _rc, data, _err = check_json(capsys, alone(path, tmp_path))
    got = findings(data, path.name)
    static = [x for x in got if x["kind"] == "static-symbol"]
    assert len(static) == 1 and static[0]["count"] == len(CONTROL), got
    assert not [x for x in got if "GetProcAddress" in (x["detail"] or "")], got
    assert read_pe(path).forwarders == []


def test_reading_is_bounded(pe_stubs, monkeypatch):
    """At most MAX_EXPORTS_READ exports are read, BODY_MAX bytes each: past them, an export
    stays what its export says."""
    path = pe_stubs["stubs"]
    assert {f.symbol for f in read_pe(path).forwarders} == set(STUBS)
    monkeypatch.setattr(stubs, "MAX_EXPORTS_READ", 1)
    assert len(read_pe(path).forwarders) == 1
    monkeypatch.setattr(stubs, "MAX_EXPORTS_READ", 1 << 13)
    monkeypatch.setattr(stubs, "BODY_MAX", 16)  # the name is loaded further in than this
    assert read_pe(path).forwarders == []


@pytest.mark.parametrize("index,value", [(3, (0x1000, 0xFFFFFFF0)), (10, (0xFFFFFF00, 0x100)), (3, (0x7FFFFFF0, 12))])
def test_bad_exception_or_load_config_directory_is_read_safely(pe_stubs, tmp_path, index, value):
    """An exception (.pdata) or load configuration directory pointing past the file is no
    function table and no dispatch pointer: the stubs that need neither are still seen."""
    raw = bytearray(pe_stubs["stubs"].read_bytes())
    opt = int.from_bytes(raw[0x3C:0x40], "little") + 24
    at = opt + 112 + 8 * index
    raw[at:at + 8] = value[0].to_bytes(4, "little") + value[1].to_bytes(4, "little")
    bad = tmp_path / "fkstubs.dll"
    bad.write_bytes(bytes(raw))
    got = {f.symbol for f in read_pe(bad).forwarders}
    assert "cudnnAddTensor" in got  # a direct GetProcAddress call and call *%rax: no guard, no table needed

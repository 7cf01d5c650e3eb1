"""Managed (.NET) assemblies: the native libraries their P/Invoke methods load.

`[DllImport("cublas64_12.dll")]` compiles to CLI metadata (a ModuleRef and an ImplMap row); the
assembly's import directory names mscoree.dll alone, and the runtime loads the ModuleRef's library
on the method's first call. `check` reads those tables (audit/pe/clr.py): a denied library is a
`needed` finding asked for by "P/Invoke (CLI ModuleRef)", its entry points imported symbols.
Fixtures: C# compiled by Mono's mcs (make test installs mono-mcs)."""

from __future__ import annotations

import json
import subprocess

import pytest

from audit.linkage.resolution.native import pinvoke_probes
from cli_runner import audit, cli
from conftest import require_tool

TEMPLATE = """using System;
using System.Runtime.InteropServices;
public static class Native {{
{decls}
    public static int Touch() {{ return 0; }}
}}
"""


def assembly(tmp_path, name: str, decls: str):
    mcs = require_tool("mcs")
    src = tmp_path / f"{name}.cs"
    src.write_text(TEMPLATE.format(decls=decls))
    out = tmp_path / f"{name}.dll"
    subprocess.run([mcs, "-target:library", f"-out:{out}", str(src)], check=True, capture_output=True, timeout=120)
    return out


def test_pinvoke_of_cublas_fails_naming_the_mechanism(tmp_path):
    """Before: PASS (the import directory holds mscoree.dll alone)."""
    dll = assembly(tmp_path, "gemm", '    [DllImport("cublas64_12.dll", EntryPoint = "cublasCreate_v2")]\n'
                                     '    public static extern int Create(out IntPtr handle);\n'
                                     '    [DllImport("cublas64_12.dll")]\n'
                                     '    public static extern int cublasSgemm_v2(IntPtr h);\n')
    res = audit(dll)
    assert res.verdict == "fail"
    got = {(f.rule, f.kind, f.subject, f.where) for f in res.failing}
    assert ("nvidia.cublas", "needed", "cublas64_12.dll", "P/Invoke (CLI ModuleRef)") in got
    symbols = [f for f in res.failing if f.kind == "imported-symbol"]
    assert symbols and symbols[0].rule == "nvidia.cublas" and symbols[0].where == "P/Invoke"
    assert set(symbols[0].matches[0].names) == {"cublasCreate_v2", "cublasSgemm_v2"}


@pytest.mark.parametrize("spelling", ["cudnn64_9", "libcudnn.so.9", "cudnn"])
def test_every_spelling_the_runtime_probes_is_judged(tmp_path, spelling):
    """A bare name: .NET tries cudnn.dll, libcudnn.so, ... (`cudnn` alone is no denied name; the
    Linux spelling it probes is)."""
    dll = assembly(tmp_path, "dnn", f'    [DllImport("{spelling}")]\n    public static extern int cudnnCreate(out IntPtr h);\n')
    res = audit(dll)
    assert ("nvidia.cudnn", "needed") in {(f.rule, f.kind) for f in res.failing}, [f.to_dict() for f in res.findings]


def test_a_clean_assembly_passes_without_noise(tmp_path):
    """No P/Invoke, or the system's: a pass, and mscoree.dll (the runtime's loader) is the system's."""
    dll = assembly(tmp_path, "clean", '    [DllImport("kernel32.dll")]\n    public static extern uint GetTickCount();\n')
    res = audit(dll)
    assert res.verdict == "pass" and not res.findings


def test_json_and_inspect_name_the_pinvoke_library(tmp_path, capsys):
    dll = assembly(tmp_path, "gemm2", '    [DllImport("cublasLt64_12.dll")]\n    public static extern int cublasLtCreate(out IntPtr h);\n')
    rc, out, err = cli(capsys, "check", "--format", "json", str(dll))
    assert rc == 1
    found = json.loads(out)["files"][0]["findings"]
    assert {(f["rule"], f["kind"], f["where"]) for f in found} >= {("nvidia.cublaslt", "needed", "P/Invoke (CLI ModuleRef)")}
    rc, out, err = cli(capsys, "inspect", str(dll))
    assert rc == 0 and "cublasLt64_12.dll (pinvoke)" in out


def test_broken_metadata_is_an_error_not_a_pass(tmp_path, capsys):
    """The metadata signature or the table stream's row counts made unreadable: exit 3, one line."""
    dll = assembly(tmp_path, "bad", '    [DllImport("cublas64_12.dll")]\n    public static extern int cublasCreate_v2(out IntPtr h);\n')
    data = dll.read_bytes()
    at = data.index(b"BSJB")
    for label, mutated in (("signature", data[:at] + b"XXXX" + data[at + 4:]),
                           ("rows", _huge_rows(data, at))):
        bad = tmp_path / f"bad_{label}.dll"
        bad.write_bytes(mutated)
        rc, out, err = cli(capsys, "check", str(bad))
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 3, (label, out, err)
        assert "CLI" in out + err and "Traceback" not in err, (label, out, err)


def _huge_rows(data: bytes, root: int) -> bytes:
    """The first row count of the #~ stream set to 2^31 (past any stream)."""
    vlen = int.from_bytes(data[root + 12:root + 16], "little")
    at = root + 16 + vlen + 4
    while True:
        off = int.from_bytes(data[at:at + 4], "little")
        name_end = data.index(b"\0", at + 8)
        if data[at + 8:name_end] == b"#~":
            rows = root + off + 24
            return data[:rows] + (1 << 31).to_bytes(4, "little") + data[rows + 4:]
        at += 8 + (name_end - (at + 8) + 4) // 4 * 4


def test_probe_spellings():
    assert pinvoke_probes("cublas") == ["cublas", "cublas.dll", "libcublas.so", "cublas.so", "libcublas.dylib",
                                        "cublas.dylib", "libcublas"]
    assert pinvoke_probes("cudnn64_9.dll")[:3] == ["cudnn64_9.dll", "cudnn64_9.dll", "libcudnn64_9.so"]


def test_mono_s_own_framework_assemblies_are_read_and_pass():
    """Real assemblies nobody here wrote (Mono's, installed with mcs): every table kind a framework
    library has, wide heaps; they P/Invoke libc, kernel32, System.Native, ... and no vendor library."""
    from pathlib import Path

    from audit.pe.reader import read_pe

    lib = Path("/usr/lib/mono/4.5/mscorlib.dll")
    if not lib.is_file():
        pytest.skip("Mono's mscorlib.dll not installed (make test installs mono-mcs)")
    info = read_pe(lib)
    pinvoked = {i.name for i in info.imports if i.kind == "pinvoke"}
    assert {"libc", "System.Native", "kernel32.dll"} <= pinvoked
    res = audit(lib)
    assert res.verdict == "pass" and not res.failing


def test_a_literal_given_to_a_pinvoked_loader_is_a_dlopen_string(tmp_path):
    """LoadLibrary (kernel32) and dlopen (libdl) reached by P/Invoke, given string literals: the
    #US heap's library names are load-by-name strings, as a native file's are (before: PASS)."""
    dll = assembly(tmp_path, "dyn", '    [DllImport("kernel32", CharSet = CharSet.Unicode)]\n'
                                    '    static extern IntPtr LoadLibrary(string name);\n'
                                    '    [DllImport("libdl.so.2")]\n'
                                    '    static extern IntPtr dlopen(string name, int flags);\n'
                                    '    public static IntPtr Go() { IntPtr h = LoadLibrary("cublas64_12.dll");\n'
                                    '        return h != IntPtr.Zero ? h : dlopen("libcublas.so.12", 2); }\n')
    res = audit(dll)
    (f,) = [f for f in res.failing if f.kind == "dlopen-string"]
    assert f.rule == "nvidia.cublas" and f.where.startswith("#US @0x") and f.count == 2
    assert "LoadLibrary" in f.detail and "dlopen" in f.detail


def test_a_literal_given_to_native_library_load_is_a_dlopen_string(tmp_path):
    """.NET's own loader (System.Runtime.InteropServices.NativeLibrary.Load, .NET Core 3+): a
    MemberRef of the assembly. Mono's mcs has no such type, so a stand-in assembly declares it;
    the caller's metadata is then what a .NET Core compiler writes (a TypeRef, a MemberRef)."""
    mcs = require_tool("mcs")
    stand_in = tmp_path / "NativeLibrary.cs"
    stand_in.write_text("namespace System.Runtime.InteropServices { public static class NativeLibrary {\n"
                        "  public static System.IntPtr Load(string name) { return System.IntPtr.Zero; } } }\n")
    ref = tmp_path / "StandIn.dll"
    subprocess.run([mcs, "-target:library", f"-out:{ref}", str(stand_in)], check=True, capture_output=True, timeout=120)
    caller = tmp_path / "Caller.cs"
    caller.write_text("using System.Runtime.InteropServices;\npublic static class Caller {\n"
                      '  public static System.IntPtr Go() { return NativeLibrary.Load("cudnn64_9.dll"); } }\n')
    dll = tmp_path / "Caller.dll"
    subprocess.run([mcs, "-target:library", f"-r:{ref}", f"-out:{dll}", str(caller)], check=True, capture_output=True,
                   timeout=120)
    res = audit(dll)
    (f,) = [f for f in res.failing if f.kind == "dlopen-string"]
    assert (f.rule, f.subject) == ("nvidia.cudnn", "cudnn64_9.dll") and "NativeLibrary.Load" in f.detail
    # the same literal in an assembly that loads nothing by name is no load
    quiet = assembly(tmp_path, "quiet", '    public static string Name() { return "cudnn64_9.dll"; }\n')
    assert not [f for f in audit(quiet).findings if f.kind == "dlopen-string" and f.severity != "warn"]

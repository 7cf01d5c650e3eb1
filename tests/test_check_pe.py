"""`check` on Windows PE files (DLL, .pyd), judged by the same policy as ELF files.

Fixtures are built by MinGW-w64 (GCC, GNU ld, dlltool) from the sources below; what a test
expects comes from those sources and from llvm-readobj-15 --coff-imports, never from the
code under test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import once, run
from platform_fixtures import MINGW, pe_libs  # noqa: F401  (fixture)
from test_check import cli

HASH = "0123456789abcdef0123456789abcdef"  # delvewheel's 32 hex digits
OPENBLAS_DLL = f"libscipy_openblas64_-{HASH}.dll"

DNN_C = "__declspec(dllexport) int cudnnCreate(void **h) { *h = 0; return 0; }\n"
CUDNN_DEF = "LIBRARY cudnn64_9.dll\nEXPORTS\n    cudnnCreate\n"
# lld-link (GNU ld leaves the delay-import directory of dlltool's delay library empty)
DELAY_C = r"""
extern int __declspec(dllimport) cudnnCreate(void **h);  /* delay-loaded: cudnn64_9.dll */
void *__delayLoadHelper2(const void *descr, void **slot) { (void)descr; return *slot; }
int _DllMainCRTStartup(void *a, unsigned b, void *c) { return 1; }
__declspec(dllexport) int fk_delay_run(void) { void *h; return cudnnCreate(&h); }
"""
LOAD_C = r"""
#include <windows.h>
typedef int (*create_fn)(void **);
__declspec(dllexport) int fk_load_run(void) {
    void *h;
    HMODULE dnn = LoadLibraryA("cudnn64_9.dll");
    if (!dnn) return 1;
    create_fn c = (create_fn)GetProcAddress(dnn, "cudnnCreate");
    return c ? c(&h) : 2;
}
"""
# the same name in data, but no loader imported: a name, not a load
NAME_ONLY_C = r"""
const char *fk_vendor_note = "cudnn64_9.dll";
__declspec(dllexport) const char *fk_note(void) { return fk_vendor_note; }
"""
OPENBLAS_C = "__declspec(dllexport) void scipy_dgemm_(void) {}\n"
CORE_C = r"""
extern void scipy_dgemm_(void);
__declspec(dllexport) void PyInit__core(void) { scipy_dgemm_(); }
"""
CRT_DEF = "LIBRARY api-ms-win-crt-runtime-l1-1-0.dll\nEXPORTS\n    _initterm\n"
CLEAN_C = r"""
#include <windows.h>
extern void _initterm(void *, void *);
__declspec(dllexport) int fk_clean(void) { _initterm(0, 0); return (int)GetTickCount(); }
"""


@pytest.fixture(scope="module")
def pe_more(fixture_root) -> dict[str, Path]:
    return once("pe_check", lambda: _build(fixture_root))


def _build(fixture_root) -> dict[str, Path]:
    gcc = require_tool(MINGW)
    dlltool = require_tool("x86_64-w64-mingw32-dlltool")
    d = fixture_root / "pe_check"
    d.mkdir(exist_ok=True)
    for name, text in (("dnn.c", DNN_C), ("cudnn.def", CUDNN_DEF), ("delay.c", DELAY_C), ("load.c", LOAD_C),
                       ("nameonly.c", NAME_ONLY_C), ("openblas.c", OPENBLAS_C), ("core.c", CORE_C),
                       ("crt.def", CRT_DEF), ("clean.c", CLEAN_C)):
        (d / name).write_text(text)
    clang, lld_link = require_tool("clang-15"), require_tool("lld-link-15")
    run([require_tool("llvm-dlltool-15"), "-m", "i386:x86-64", "-d", "cudnn.def", "-l", "cudnn.lib"], cwd=d)
    run([clang, "--target=x86_64-pc-windows-msvc", "-O1", "-c", "-o", "delay.obj", "delay.c"], cwd=d)
    run([lld_link, "/dll", "/nodefaultlib", "/entry:_DllMainCRTStartup", "/out:fkdelay.dll", "delay.obj",
         "cudnn.lib", "/delayload:cudnn64_9.dll"], cwd=d)
    run([gcc, "-shared", "-o", "fkload.dll", "load.c"], cwd=d)
    run([gcc, "-shared", "-o", "fknameonly.dll", "nameonly.c"], cwd=d)
    run([gcc, "-shared", "-o", OPENBLAS_DLL, "openblas.c", f"-Wl,--out-implib,libopenblas_imp.a"], cwd=d)
    run([gcc, "-shared", "-o", "_core.cp311-win_amd64.pyd", "core.c", "-L.", "-lopenblas_imp"], cwd=d)
    run([dlltool, "--input-def", "crt.def", "--dllname", "api-ms-win-crt-runtime-l1-1-0.dll",
         "--output-lib", "libapicrt.a"], cwd=d)
    run([gcc, "-shared", "-o", "fkclean.dll", "clean.c", "-L.", "-lapicrt"], cwd=d)
    return {n: d / f for n, f in (("delay", "fkdelay.dll"), ("load", "fkload.dll"), ("nameonly", "fknameonly.dll"),
                                  ("openblas", OPENBLAS_DLL), ("core", "_core.cp311-win_amd64.pyd"),
                                  ("clean", "fkclean.dll"))}


def coff_imports(path: Path) -> list[tuple[str, str]]:
    """(DLL name, "import" | "delay-load") from llvm-readobj-15 --coff-imports."""
    out = subprocess.run([require_tool("llvm-readobj-15"), "--coff-imports", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return [("delay-load" if kind == "DelayImport" else "import", name)
            for kind, name in re.findall(r"^(Import|DelayImport) \{\s*\n\s*Name: (\S+)", out, re.M)]


def alone(path: Path, tmp_path: Path, *more: Path) -> Path:
    """`path` (and `more`) copied into a folder of their own: nothing else beside them."""
    d = tmp_path / "alone"
    d.mkdir(exist_ok=True)
    for p in (path, *more):
        shutil.copy(p, d / p.name)
    return d / path.name


def check_json(capsys, *args):
    rc, out, err = cli(capsys, "check", "--format", "json", *map(str, args))
    return rc, json.loads(out), err


def failing(data: dict, path_end: str) -> set[tuple[str, str, str]]:
    f = next(f for f in data["files"] if f["path"].endswith(path_end))
    return {(x["rule"], x["kind"], x["where"]) for x in f["findings"] if x["failing"]}


def test_import_of_cublas_is_needed(pe_libs, tmp_path, capsys):
    app = alone(pe_libs["app"], tmp_path)
    assert ("import", "cublas64_12.dll") in coff_imports(app)
    rc, data, _ = check_json(capsys, app)
    assert rc == 1
    assert data["files"][0]["format"] == "pe"
    assert ("nvidia.cublas", "needed", "import") in failing(data, "fkapp.dll")


def test_import_resolved_in_its_own_folder(pe_libs, capsys):
    rc, data, _ = check_json(capsys, pe_libs["app"])
    assert rc == 1
    node = next(c for c in data["files"][0]["resolved"]["children"] if c["name"] == "cublas64_12.dll")
    assert (node["status"], node["how"], node["path"]) == ("denied", "own folder", str(pe_libs["cublas"]))


def test_delay_load_import(pe_more, tmp_path, capsys):
    dll = alone(pe_more["delay"], tmp_path)
    assert ("delay-load", "cudnn64_9.dll") in coff_imports(dll)
    rc, data, _ = check_json(capsys, dll)
    assert rc == 1
    assert ("nvidia.cudnn", "needed", "delay-load import") in failing(data, "fkdelay.dll")


def test_export_forwarded_to_cublas(pe_libs, tmp_path, capsys):
    dll = alone(pe_libs["forward"], tmp_path)
    rc, data, _ = check_json(capsys, dll)
    assert rc == 1
    assert ("nvidia.cublas", "needed", "export forward") in failing(data, "fkfwd.dll")


def test_loadlibrary_string_with_getprocaddress(pe_more, tmp_path, capsys):
    dll = alone(pe_more["load"], tmp_path)
    assert "cudnn64_9.dll" not in {n for _, n in coff_imports(dll)}  # loaded by name only
    rc, data, _ = check_json(capsys, dll)
    assert rc == 1
    found = [x for x in data["files"][0]["findings"] if x["kind"] == "dlopen-string"]
    assert [(x["rule"], x["subject"]) for x in found] == [("nvidia.cudnn", "cudnn64_9.dll")]
    assert "LoadLibraryA" in found[0]["detail"] and "GetProcAddress" in found[0]["detail"]


def test_name_in_data_without_a_loader_is_no_load(pe_more, tmp_path, capsys):
    dll = alone(pe_more["nameonly"], tmp_path)
    assert b"cudnn64_9.dll" in dll.read_bytes()
    rc, data, _ = check_json(capsys, dll)
    assert rc == 0, data["files"][0]["findings"]


def _wheel(pe_more, tmp_path) -> Path:
    whl = tmp_path / "fkpkg-1.0-cp311-cp311-win_amd64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(pe_more["core"], "fkpkg/_core.cp311-win_amd64.pyd")
        zf.write(pe_more["openblas"], f"fkpkg.libs/{OPENBLAS_DLL}")
        zf.writestr("fkpkg/__init__.py", "")
    return whl


def test_delvewheel_libs_folder_in_a_wheel(pe_more, tmp_path, capsys):
    assert ("import", OPENBLAS_DLL) in coff_imports(pe_more["core"])
    whl = _wheel(pe_more, tmp_path)
    rc, data, _ = check_json(capsys, whl)
    assert rc == 1
    assert ("blas.openblas", "needed", "import") in failing(data, "_core.cp311-win_amd64.pyd")
    core = next(f for f in data["files"] if f["path"].endswith(".pyd"))
    node = next(c for c in core["resolved"]["children"] if c["name"] == OPENBLAS_DLL)
    assert (node["status"], node["how"], node["rule"]) == ("denied", "pkg.libs", "blas.openblas")
    assert node["path"] == f"{whl}!/fkpkg.libs/{OPENBLAS_DLL}"
    # the bundled DLL is itself audited: a denied library by its own name
    assert ("blas.openblas", "soname") in {(r, k) for r, k, _ in failing(data, OPENBLAS_DLL)}


def test_clean_dll_with_system_imports_passes(pe_more, tmp_path, capsys):
    dll = alone(pe_more["clean"], tmp_path)
    imports = {n.lower() for _, n in coff_imports(dll)}
    assert {"kernel32.dll", "api-ms-win-crt-runtime-l1-1-0.dll"} <= imports
    rc, data, err = check_json(capsys, dll)
    assert rc == 0
    f = data["files"][0]
    assert f["verdict"] == "pass" and f["findings"] == [] and f["warnings"] == [] and data["warnings"] == []
    assert {c["status"] for c in f["resolved"]["children"]} == {"trusted"}


def _mixed_folder(pe_libs, tmp_path) -> Path:
    """A folder of a gcc-built clean ELF library and the MinGW-built DLL that imports cuBLAS."""
    gcc = require_tool("gcc")
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "clean.c").write_text("int fk_clean(void) { return 1; }\n")
    run([gcc, "-shared", "-fPIC", "-o", "libclean.so", "clean.c"], cwd=d)
    (d / "clean.c").unlink()
    shutil.copy(pe_libs["app"], d / "fkapp.dll")
    return d


def test_mixed_folder_elf_and_dll(pe_libs, tmp_path, capsys):
    d = _mixed_folder(pe_libs, tmp_path)
    rc, data, _ = check_json(capsys, d)
    assert rc == 1
    verdicts = {Path(f["path"]).name: f["verdict"] for f in data["files"]}
    assert verdicts == {"libclean.so": "pass", "fkapp.dll": "fail"}




def test_inspect_counts_what_it_read_by_format(pe_libs, tmp_path):
    """inspect's last line counts the files of each format it read (it said "ELF file(s)" of DLLs)."""
    import sys

    d = _mixed_folder(pe_libs, tmp_path)
    (d / "notes.txt").write_text("not a binary\n")
    r = subprocess.run([sys.executable, "-m", "audit", "inspect", str(d)], capture_output=True, text=True, timeout=300)
    assert r.stdout.splitlines()[-1] == "2 file(s) read (1 PE, 1 ELF), 0 unreadable, 1 skipped (nothing to audit)"


@pytest.mark.parametrize("fmt", ["json", "sarif", "junit", "github", "text"])
def test_every_output_format_on_a_pe_finding(pe_libs, tmp_path, capsys, fmt):
    app = alone(pe_libs["app"], tmp_path)
    rc, out, err = cli(capsys, "check", "--format", fmt, str(app))
    assert rc == 1, err
    assert "Traceback" not in out + err
    assert "cublas64_12.dll" in out
    if fmt in ("json", "sarif"):
        json.loads(out)


def test_inspect_reads_a_dll_and_its_tree(pe_libs, capsys):
    rc, out, err = cli(capsys, "inspect", "--json", str(pe_libs["app"]))
    assert rc == 0, err
    f = json.loads(out)["files"][0]
    assert f["format"] == "pe"
    assert [n.lower() for _, n in coff_imports(pe_libs["app"])] == [n.lower() for n in f["needed"]]
    tree = {c["name"]: c["status"] for c in f["dependency_tree"]["children"]}
    assert tree["cublas64_12.dll"] == "denied"
    rc, out, err = cli(capsys, "inspect", str(pe_libs["app"]))
    assert rc == 0 and "PE 64-bit" in out


def test_truncated_dll_is_one_error_line(pe_libs, tmp_path, capsys):
    bad = tmp_path / "trunc.dll"
    bad.write_bytes(pe_libs["app"].read_bytes()[:1500])
    rc, out, err = cli(capsys, "check", str(bad))
    assert rc == 3 and "Traceback" not in out + err
    errors = [ln for ln in out.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "malformed PE file" in errors[0]

"""Windows and macOS static archives are audited member by member, as ELF ones are: COFF objects
(MinGW, clang for MSVC, in GNU ar or llvm-lib archives), the short import objects of an import
library (each names a DLL and a symbol: linking the library loads the DLL) and Mach-O objects.

Every input is built here with the real tools (mingw gcc -c and dlltool, clang-15 for the MSVC
and macOS targets, llvm-ar-15, llvm-lib-15, llvm-dlltool-15); expected names come from the
sources and the .def file. Each case runs the CLI in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import run
from test_static_archive import as_json, cli  # the same CLI runners

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION

VENDOR = "int cublasSgemm_v2(int a) { return a * 2; }\n"
CLEAN = "int own_add(int a, int b) { return a + b; }\n"
CALLER = "extern int cublasSgemm_v2(int);\nint use_gemm(int a) { return cublasSgemm_v2(a) + 1; }\n"
DLLIMPORT = "__declspec(dllimport) int cublasSgemm_v2(int);\nint use_gemm(int a) { return cublasSgemm_v2(a); }\n"
CBLAS = "double cblas_dgemm(double a) { return a * 2; }\n"
DEF = "LIBRARY cublas64_12.dll\nEXPORTS\ncublasSgemm_v2\ncublasCreate_v2\n"




def findings(doc: dict, path: str) -> set[tuple[str, str, str]]:
    (f,) = [f for f in doc["files"] if f["path"] == path]
    return {(x["rule"], x["kind"], x["subject"]) for x in f["findings"]}


def one_input_error(proc: subprocess.CompletedProcess, *expect: str) -> None:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == EXIT_INPUT, out
    errors = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("error:")]
    assert len(errors) == 1, out
    for want in expect:
        assert want in out, (want, out)


def compile_to(tmp: Path, name: str, source: str, *cc: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    run(*cc, "-c", "-o", out, src)
    return out


def mingw(tmp: Path, name: str, source: str) -> Path:
    return compile_to(tmp, name, source, require_tool("x86_64-w64-mingw32-gcc"))


def msvc(tmp: Path, name: str, source: str) -> Path:
    return compile_to(tmp, name, source, require_tool("clang-15"), "--target=x86_64-pc-windows-msvc")


def macho(tmp: Path, name: str, source: str) -> Path:
    return compile_to(tmp, name, source, require_tool("clang-15"), "--target=arm64-apple-macos11")


def llvm_ar(out: Path, *members: Path, flags: str = "rcs") -> Path:
    run(require_tool("llvm-ar-15"), flags, out, *members, cwd=members[0].parent)
    return out


def test_mingw_object_defining_a_vendor_api_is_a_static_symbol(tmp_path):
    vendor, clean = mingw(tmp_path, "vendor.obj", VENDOR), mingw(tmp_path, "clean.obj", CLEAN)
    lib = llvm_ar(tmp_path / "libmixed.a", vendor, clean)
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, f"{lib}!/vendor.obj") == {("nvidia.cublas", "static-symbol", "cublasSgemm_v2")}
    assert findings(doc, f"{lib}!/clean.obj") == set()
    assert {f["format"] for f in doc["files"]} == {"coff"}


def test_msvc_library_of_objects(tmp_path):
    """An llvm-lib library (MSVC's format: two `/` linker members, NUL-ended long names) of
    clang objects: a clean one passes; one calling the vendor API through dllimport is an
    imported symbol."""
    lib_tool = require_tool("llvm-lib-15")
    clean = msvc(tmp_path, "a_clean_object_with_a_long_name.obj", CLEAN)
    lib = tmp_path / "own.lib"
    run(lib_tool, f"/out:{lib}", clean.name, cwd=tmp_path)
    rc, doc = as_json(lib)
    assert rc == EXIT_OK, doc
    assert [f["path"] for f in doc["files"]] == [f"{lib}!/a_clean_object_with_a_long_name.obj"]
    caller = msvc(tmp_path, "caller_that_calls_the_vendor_dll.obj", DLLIMPORT)
    lib = tmp_path / "calls.lib"
    run(lib_tool, f"/out:{lib}", clean.name, caller.name, cwd=tmp_path)
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, f"{lib}!/caller_that_calls_the_vendor_dll.obj") == {
        ("nvidia.cublas", "imported-symbol", "cublasSgemm_v2")}


def test_clean_coff_archive_passes(tmp_path):
    lib = llvm_ar(tmp_path / "libown.a", mingw(tmp_path, "clean.obj", CLEAN),
                  mingw(tmp_path, "caller_of_own.obj", "extern int own_add(int,int);\nint g(void){return own_add(1,2);}\n"))
    rc, doc = as_json(lib)
    assert rc == EXIT_OK, doc
    assert len(doc["files"]) == 2


@pytest.mark.parametrize("tool", ["llvm-dlltool-15", "x86_64-w64-mingw32-dlltool"])
def test_import_library_names_the_dll_it_links(tmp_path, tool):
    """llvm-dlltool writes short import objects (what MSVC's lib.exe writes); MinGW's dlltool
    writes small COFF objects, the DLL's name in the tail's .idata$7. Either way linking the
    library loads cublas64_12.dll and imports the names of the .def file."""
    exe = require_tool(tool)
    (tmp_path / "cublas.def").write_text(DEF)
    lib = tmp_path / "cublas.lib"
    if tool.startswith("llvm"):
        run(exe, "-m", "i386:x86-64", "-d", tmp_path / "cublas.def", "-l", lib)
    else:
        run(exe, "-d", tmp_path / "cublas.def", "-l", lib, cwd=tmp_path)
    proc = cli("check", "--format", "json", lib)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_VIOLATION, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    found = {(x["rule"], x["kind"], x["subject"]) for f in doc["files"] for x in f["findings"]}
    assert ("nvidia.cublas", "needed", "cublas64_12.dll") in found, found
    names = {n for f in doc["files"] for x in f["findings"] if x["kind"] == "imported-symbol"
             for n in [x["subject"], *x["examples"]]}
    assert names == {"cublasSgemm_v2", "cublasCreate_v2"}, doc
    assert any("cublas64_12.dll" in f["needed"] for f in doc["files"])


def test_macho_objects(tmp_path):
    vendor, clean = macho(tmp_path, "vendor.o", CBLAS), macho(tmp_path, "clean.o", CLEAN)
    lib = llvm_ar(tmp_path / "libblas.a", vendor, clean)
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, f"{lib}!/vendor.o") == {("blas.cblas", "static-symbol", "cblas_dgemm")}
    assert {f["format"] for f in doc["files"]} == {"macho"}
    assert {f["elf_type"] for f in doc["files"]} == {"MH_OBJECT"}
    lib = llvm_ar(tmp_path / "libown.a", clean)
    rc, doc = as_json(lib)
    assert rc == EXIT_OK, doc
    assert [f["verdict"] for f in doc["files"]] == ["pass"]


def _truncated(tmp: Path, obj: Path, keep: float) -> Path:
    data = obj.read_bytes()
    cut = tmp / f"cut_{obj.name}"
    cut.write_bytes(data[:int(len(data) * keep)])
    return cut


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_truncated_members_are_one_input_error(tmp_path, keep):
    """A member cut short (its symbol table, or its string table, past its end) beside a clean
    one: the archive is never passed."""
    for make, ext in ((mingw, "obj"), (msvc, "obj"), (macho, "o")):
        clean = make(tmp_path, f"clean.{ext}", CLEAN)
        cut = _truncated(tmp_path, make(tmp_path, f"vendor.{ext}", VENDOR), keep)
        lib = llvm_ar(tmp_path / f"lib{make.__name__}.a", clean, cut, flags="rcS")  # no index: llvm-ar reads members
        proc = cli("check", lib)
        one_input_error(proc, f"{lib}!/{cut.name}")


def test_truncated_import_member_is_one_input_error(tmp_path):
    (tmp_path / "cublas.def").write_text(DEF)
    lib = tmp_path / "cublas.lib"
    run(require_tool("llvm-dlltool-15"), "-m", "i386:x86-64", "-d", tmp_path / "cublas.def", "-l", lib)
    data = bytearray(lib.read_bytes())
    at = data.find(b"\0\0\xff\xff\0\0")  # the first short import object: its names cut short
    assert at > 0
    length = int.from_bytes(data[at + 12:at + 16], "little")
    data[at + 12:at + 16] = (length + 64).to_bytes(4, "little")
    lib.write_bytes(bytes(data))
    one_input_error(cli("check", lib), str(lib))


def test_a_coff_object_on_its_own_is_audited_as_an_archive_member_is(tmp_path):
    """A COFF object named on its own, or met in a folder (what a build hands its linker), is read
    as the same object inside an archive is: its symbols judged, a clean one passing."""
    caller = msvc(tmp_path, "caller.obj", DLLIMPORT)
    rc, doc = as_json(caller)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, str(caller)) == {("nvidia.cublas", "imported-symbol", "cublasSgemm_v2")}
    assert doc["files"][0]["format"] == "coff"
    folder = tmp_path / "objs"
    folder.mkdir()
    vendor = mingw(folder, "vendor.obj", VENDOR)
    clean = mingw(folder, "clean.obj", CLEAN)
    rc, doc = as_json(folder)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, str(vendor)) == {("nvidia.cublas", "static-symbol", "cublasSgemm_v2")}
    assert findings(doc, str(clean)) == set()
    rc, doc = as_json(clean)
    assert rc == EXIT_OK and doc["files"][0]["verdict"] == "pass", doc


def test_a_truncated_coff_object_on_its_own_is_one_error(tmp_path):
    obj = msvc(tmp_path, "caller.obj", DLLIMPORT)
    data = obj.read_bytes()
    cut = tmp_path / "cut.obj"
    cut.write_bytes(data[: len(data) // 2])  # the symbol table's end is past the file's
    one_input_error(cli("check", cut), "cut.obj")


PRAGMA = '#pragma comment(lib, "{lib}")\nint own_add(int a, int b) {{ return a + b; }}\n'


@pytest.mark.parametrize("lib, rule", [("cublas.lib", "nvidia.cublas"), ("cudnn", "nvidia.cudnn"),
                                       ("cublasLt.lib", "nvidia.cublaslt")])
def test_a_defaultlib_directive_naming_a_vendor_import_library_fails(tmp_path, lib, rule):
    """`#pragma comment(lib, ...)` puts /DEFAULTLIB:NAME in the object's .drectve: whatever links
    the object links that library, and its import library loads the vendor DLL. The object has no
    vendor symbol: the directive alone is the evidence, on its own and inside a static library."""
    obj = msvc(tmp_path, "pulls.obj", PRAGMA.format(lib=lib))
    name = lib if lib.endswith(".lib") else lib + ".lib"
    rc, doc = as_json(obj)
    assert rc == EXIT_VIOLATION, doc
    assert findings(doc, str(obj)) == {(rule, "needed", name)}
    (finding,) = doc["files"][0]["findings"]
    assert "/DEFAULTLIB" in json.dumps(finding)
    archive = llvm_ar(tmp_path / "libpulls.a", obj)
    rc, doc = as_json(archive)
    assert rc == EXIT_VIOLATION and findings(doc, f"{archive}!/pulls.obj") == {(rule, "needed", name)}, doc


def test_defaultlib_directives_of_system_and_compiler_libraries_pass(tmp_path):
    """The C runtime's library (what cl.exe's objects name: libcmt, oldnames), kernel32 and a
    project's own library are no vendor's."""
    src = PRAGMA.format(lib="kernel32.lib") + "".join(f'#pragma comment(lib, "{n}")\n'
                                                      for n in ("myproject", "libcmt", "oldnames"))
    obj = msvc(tmp_path, "own.obj", src)
    from audit.pe.reader import read_coff_object

    assert {i.name for i in read_coff_object(obj).imports} == {"kernel32.lib", "myproject.lib", "libcmt.lib",
                                                              "oldnames.lib"}
    rc, doc = as_json(obj)
    assert rc == EXIT_OK and doc["files"][0]["findings"] == [], doc


def test_an_object_naming_thousands_of_libraries_is_one_error(tmp_path):
    """Every directive is an edge of the dependency tree: past its bound the file is one error,
    not a long walk (the names are told apart once each, not compared pairwise)."""
    src = "".join(f'#pragma comment(lib, "lib{i}")\n' for i in range(6000)) + CLEAN
    obj = msvc(tmp_path, "many.obj", src)
    one_input_error(cli("check", obj), "more than 5000 edges")

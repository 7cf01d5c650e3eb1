"""`check` on macOS Mach-O files (dylib, bundle, universal), judged by the same policy as ELF.

Fixtures are built by clang-15 with ld64.lld-15 and llvm-lipo-15 from the sources below (no
macOS SDK here: the system's libraries are stand-ins with the system's install names); what a
test expects comes from those sources and from llvm-objdump-15 --macho --dylibs-used, never
from the code under test.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import once, run
from platform_fixtures import LIBSYSTEM_C
from test_check import cli

ACCELERATE = "/System/Library/Frameworks/Accelerate.framework/Versions/A/Accelerate"
LIBSYSTEM = "/usr/lib/libSystem.B.dylib"
STUB_C = "int fk_stub(void) { return 0; }\n"
CUBLAS_C = "int cublasCreate_v2(void **h) { *h = 0; return 0; }\n"
ACCEL_C = "void cblas_sgemm(void) {}\n"
USE_ACCEL_C = "extern void cblas_sgemm(void);\nint fk_run(void) { cblas_sgemm(); return 0; }\n"
USE_CUBLAS_C = "extern int cublasCreate_v2(void **);\nint fk_run(void) { void *h; return cublasCreate_v2(&h); }\n"
CLEAN_C = "extern int fk_stub(void);\nint fk_run(void) { return fk_stub(); }\n"


def _cc(arch: str) -> list[str]:
    return [require_tool("clang-15"), f"--target={arch}-apple-macos11", "-fuse-ld=lld", "-nostdlib", "-shared"]


@pytest.fixture(scope="module")
def macho_more(fixture_root) -> dict[str, Path]:
    return once("macho_check", lambda: _build(fixture_root))


def _build(fixture_root) -> dict[str, Path]:
    require_tool("ld64.lld-15")
    lipo = require_tool("llvm-lipo-15")
    d = fixture_root / "macho_check"
    d.mkdir(exist_ok=True)
    for name, text in (("stub.c", LIBSYSTEM_C + STUB_C), ("cublas.c", CUBLAS_C), ("accel.c", ACCEL_C),
                       ("use_accel.c", USE_ACCEL_C), ("use_cublas.c", USE_CUBLAS_C), ("clean.c", CLEAN_C)):
        (d / name).write_text(text)
    out: dict[str, Path] = {}
    for arch in ("x86_64", "arm64"):
        a = d / arch
        a.mkdir(exist_ok=True)
        cc = _cc(arch)
        run([*cc, "-o", "libSystem.B.dylib", "../stub.c", f"-Wl,-install_name,{LIBSYSTEM}"], cwd=a)
        # a stand-in for the framework (no SDK): only its install name matters
        run([*cc, "-o", "Accelerate", "../accel.c", f"-Wl,-install_name,{ACCELERATE}"], cwd=a)
        run([*cc, "-o", "libcublas.dylib", "../cublas.c", "-Wl,-install_name,@rpath/libcublas.dylib"], cwd=a)
        run([*cc, "-o", "libfkaccel.dylib", "../use_accel.c", "Accelerate", "libSystem.B.dylib"], cwd=a)
        # pkg/sub/_core.so, its vendor library at pkg/.dylibs/ (delocate's folder)
        run([*cc, "-o", "_core.so", "../use_cublas.c", "libcublas.dylib",
             "libSystem.B.dylib", "-Wl,-rpath,@loader_path/../.dylibs"], cwd=a)
        run([*cc, "-o", "libfkclean.dylib", "../clean.c", "libSystem.B.dylib"], cwd=a)
        for name in ("libfkaccel.dylib", "_core.so", "libcublas.dylib", "libfkclean.dylib"):
            out[f"{arch}/{name}"] = a / name
    # universal: the x86_64 slice clean, the arm64 slice loading cuBLAS
    run([lipo, "-create", "-output", str(d / "libfkmixed.dylib"), str(out["x86_64/libfkclean.dylib"]),
         str(out["arm64/_core.so"])])
    out["mixed"] = d / "libfkmixed.dylib"
    run([lipo, "-create", "-output", str(d / "libfkclean_universal.dylib"), str(out["x86_64/libfkclean.dylib"]),
         str(out["arm64/libfkclean.dylib"])])
    out["clean-universal"] = d / "libfkclean_universal.dylib"
    return out


def dylibs_used(path: Path, arch: str | None = None) -> list[str]:
    args = [require_tool("llvm-objdump-15"), "--macho", "--dylibs-used", str(path)]
    if arch:
        args[2:2] = [f"--arch={arch}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [line.split(" (")[0].strip() for line in out.splitlines()[1:] if line.startswith("\t")]


def check_json(capsys, *args):
    rc, out, err = cli(capsys, "check", "--format", "json", *map(str, args))
    return rc, json.loads(out), err


def failing(data: dict) -> set[tuple[str, str, str]]:
    return {(x["rule"], x["kind"], x["where"]) for f in data["files"] for x in f["findings"] if x["failing"]}


def test_accelerate_framework_load_is_denied(macho_more, capsys):
    lib = macho_more["arm64/libfkaccel.dylib"]
    assert ACCELERATE in dylibs_used(lib)
    rc, data, _ = check_json(capsys, lib)
    assert rc == 1
    assert data["files"][0]["format"] == "macho"
    assert ("apple.accelerate", "needed", "LC_LOAD_DYLIB") in failing(data)
    # the system's libSystem is neither a finding nor unresolved
    subjects = {x["subject"] for x in data["files"][0]["findings"]}
    assert ACCELERATE in subjects and LIBSYSTEM not in subjects
    assert "cblas_sgemm" in subjects  # the CBLAS call it imports (use_accel.c)


def test_rpath_through_loader_path_inside_a_wheel(macho_more, tmp_path, capsys):
    core = macho_more["arm64/_core.so"]
    assert "@rpath/libcublas.dylib" in dylibs_used(core)
    whl = tmp_path / "fkpkg-1.0-cp311-cp311-macosx_11_0_arm64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(core, "fkpkg/sub/_core.so")
        zf.write(macho_more["arm64/libcublas.dylib"], "fkpkg/.dylibs/libcublas.dylib")
    rc, data, _ = check_json(capsys, whl)
    assert rc == 1
    result = next(f for f in data["files"] if f["path"].endswith("_core.so"))
    node = next(c for c in result["resolved"]["children"] if c["name"] == "@rpath/libcublas.dylib")
    assert (node["status"], node["how"], node["rule"]) == ("denied", "rpath", "nvidia.cublas")
    assert node["path"] == f"{whl}!/fkpkg/.dylibs/libcublas.dylib"
    assert ("nvidia.cublas", "needed", "LC_LOAD_DYLIB") in {(x["rule"], x["kind"], x["where"])
                                                             for x in result["findings"]}


def test_universal_binary_arm64_slice_alone_loads_a_vendor_library(macho_more, capsys):
    mixed = macho_more["mixed"]
    assert "@rpath/libcublas.dylib" in dylibs_used(mixed, "arm64")
    assert "@rpath/libcublas.dylib" not in dylibs_used(mixed, "x86_64")
    rc, data, _ = check_json(capsys, mixed)
    assert rc == 1
    result = data["files"][0]
    assert len(result["slices"]) == 2
    needed = [x for x in result["findings"] if x["kind"] == "needed"]
    assert len(needed) == 1 and needed[0]["rule"] == "nvidia.cublas"
    assert "arm64" in needed[0]["where"] and "x86_64" not in needed[0]["where"]
    rc, out, _ = cli(capsys, "check", str(mixed))
    assert rc == 1 and "slice arm64" in out


def test_clean_universal_dylib_passes(macho_more, capsys):
    rc, data, _ = check_json(capsys, macho_more["clean-universal"])
    assert rc == 0
    assert data["files"][0]["findings"] == [] and data["files"][0]["warnings"] == []


@pytest.mark.parametrize("fmt", ["json", "sarif", "junit", "github", "text"])
def test_every_output_format_on_a_macho_finding(macho_more, capsys, fmt):
    rc, out, err = cli(capsys, "check", "--format", fmt, str(macho_more["mixed"]))
    assert rc == 1, err
    assert "Traceback" not in out + err
    if fmt in ("json", "sarif"):
        json.loads(out)

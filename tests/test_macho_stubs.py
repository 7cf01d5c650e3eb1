"""Mach-O forwarding stubs and Accelerate's new-LAPACK names ($NEWLAPACK, $NEWLAPACK$ILP64).

Fixtures are built by clang-15 with ld64.lld-15 (no macOS SDK: Accelerate is a stand-in dylib
with the framework's install name, exporting the suffixed names through asm labels, as Apple's
headers declare them). What a test expects comes from the sources below and from
llvm-objdump-15 --macho -d / llvm-nm-15, never from the code under test.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import once, run
from platform_fixtures import LIBSYSTEM_C
from test_check import cli

ACCELERATE = "/System/Library/Frameworks/Accelerate.framework/Versions/A/Accelerate"
LIBSYSTEM = "/usr/lib/libSystem.B.dylib"
ARGS = "int *m, int *n, double *a, int *lda, int *ipiv, int *info"
# 11 pointer arguments: the last three are passed on the stack (arm64: x0-x7; x86_64: 6 registers)
ARGS11 = "char *t, int *m, int *n, double *al, double *a, int *lda, double *x, int *ix, double *be, double *y, int *iy"
PASS11 = "t, m, n, al, a, lda, x, ix, be, y, iy"
# 16 pointers and two hidden lengths: ten stack slots, moved with ldp/ldur/stp/stur on arm64
ARGS18 = ", ".join(f"int *a{i}" for i in range(16)) + ", int l1, int l2"
PASS18 = ", ".join(f"a{i}" for i in range(16)) + ", l1, l2"
# the stand-in Accelerate: the new-LAPACK entry points under their suffixed names
ACCEL_C = f"""
void acc_dgetrf({ARGS}) __asm("_dgetrf$NEWLAPACK");
void acc_dgetrf({ARGS}) {{ *info = *m + *n; }}
void acc_dgetrs({ARGS}) __asm("_dgetrs$NEWLAPACK");
void acc_dgetrs({ARGS}) {{ *info = *m; }}
void acc_dgemv({ARGS11}) __asm("_dgemv$NEWLAPACK");
void acc_dgemv({ARGS11}) {{ *iy = *ix; }}
void acc_cblas_ddot(void) __asm("_cblas_ddot$NEWLAPACK$ILP64");
void acc_cblas_ddot(void) {{}}
void acc_dgesvx({ARGS18}) __asm("_dgesvx$NEWLAPACK");
void acc_dgesvx({ARGS18}) {{ *a0 = l1 + l2; }}
"""
# scipy's shape: local Fortran-name thunks that tail-call the suffixed import
THUNKS_C = f"""
extern void acc_dgetrf({ARGS}) __asm("_dgetrf$NEWLAPACK");
extern void acc_dgetrs({ARGS}) __asm("_dgetrs$NEWLAPACK");
extern void acc_dgemv({ARGS11}) __asm("_dgemv$NEWLAPACK");
extern void acc_dgesvx({ARGS18}) __asm("_dgesvx$NEWLAPACK");
#define LOCAL __attribute__((visibility("hidden")))
LOCAL void dgetrf_({ARGS}) {{ acc_dgetrf(m, n, a, lda, ipiv, info); }}
LOCAL void dgemv_({ARGS11}) {{ acc_dgemv({PASS11}); }}
LOCAL void dgesvx_({ARGS18}) {{ acc_dgesvx({PASS18}); }}
/* calls the import and then computes: not a stub */
LOCAL void dgetrs_({ARGS}) {{ acc_dgetrs(m, n, a, lda, ipiv, info); *info += 1; }}
/* a real static copy: a loop body */
LOCAL void dgemm_(int *n, double *a, double *b, double *c) {{
    for (int i = 0; i < *n; i++) c[i] += a[i] * b[i];
}}
int fk_run(void *p) {{
    int k = 1;
    dgetrf_(&k, &k, p, &k, &k, &k);
    dgetrs_(&k, &k, p, &k, &k, &k);
    dgemv_(p, &k, &k, p, p, &k, p, &k, p, p, &k);
    dgemm_(&k, p, p, p);
    dgesvx_(p, p, p, p, p, p, p, p, p, p, p, p, p, p, p, p, 1, 2);
    return k;
}}
"""
# the CBLAS name with the ILP64 suffix, imported from a library no rule denies
USE_ILP64_C = """
extern void acc_cblas_ddot(void) __asm("_cblas_ddot$NEWLAPACK$ILP64");
int fk_run(void) { acc_cblas_ddot(); return 0; }
"""
ARCHS = ("arm64", "x86_64")


def _build(root: Path) -> dict[str, Path]:
    clang = require_tool("clang-15")
    require_tool("ld64.lld-15")
    d = root / "macho_stubs"
    d.mkdir(exist_ok=True)
    for name, text in (("sys.c", LIBSYSTEM_C), ("accel.c", ACCEL_C), ("thunks.c", THUNKS_C),
                       ("ilp64.c", USE_ILP64_C)):
        (d / name).write_text(text)
    out = {}
    for arch in ARCHS:
        a = d / arch
        a.mkdir(exist_ok=True)
        cc = [clang, f"--target={arch}-apple-macos11", "-fuse-ld=lld", "-nostdlib", "-shared", "-O2"]
        run([*cc, "-o", "libSystem.B.dylib", "../sys.c", f"-Wl,-install_name,{LIBSYSTEM}"], cwd=a)
        run([*cc, "-o", "Accelerate", "../accel.c", f"-Wl,-install_name,{ACCELERATE}"], cwd=a)
        run([*cc, "-o", "libfkblas.dylib", "../accel.c", "-Wl,-install_name,@rpath/libfkblas.dylib"], cwd=a)
        run([*cc, "-o", "libfkthunks.dylib", "../thunks.c", "Accelerate", "libSystem.B.dylib"], cwd=a)
        run([*cc, "-o", "libfkilp64.dylib", "../ilp64.c", "libfkblas.dylib", "libSystem.B.dylib"], cwd=a)
        out[f"{arch}/thunks"] = a / "libfkthunks.dylib"
        out[f"{arch}/ilp64"] = a / "libfkilp64.dylib"
    return out


@pytest.fixture(scope="module")
def stubs_libs(fixture_root) -> dict[str, Path]:
    return once("macho_stubs", lambda: _build(fixture_root))


def disassembly(path: Path) -> dict[str, list[str]]:
    """function name -> its instruction lines (llvm-objdump-15 --macho -d)."""
    text = subprocess.run([require_tool("llvm-objdump-15"), "--macho", "-d", "--no-show-raw-insn", str(path)],
                          capture_output=True, text=True, check=True).stdout
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"^\S+:$", line) and not line.startswith(str(path)):
            current = out.setdefault(line[:-1], [])
        elif current is not None and line.strip():
            current.append(line.strip().split(":\t", 1)[-1])  # without the address
    return out


def nm(path: Path) -> set[str]:
    text = subprocess.run([require_tool("llvm-nm-15"), str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in text.splitlines() if line.strip()}


def findings(capsys, path: Path) -> tuple[int, list[dict]]:
    rc, out, _ = cli(capsys, "check", "--format", "json", str(path))
    return rc, json.loads(out)["files"][0]["findings"]


def names_of(finding: dict) -> set[str]:
    return {n for m in finding["matches"] for n in m["names"]}


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_has_the_shapes(stubs_libs, arch):
    """The fixture is what the tests below assume: thunks that end in a branch to the stub of the
    suffixed import, and a loop that does not."""
    lib = stubs_libs[f"{arch}/thunks"]
    assert {"_dgetrf_", "_dgemv_", "_dgetrs_", "_dgemm_", "_dgetrf$NEWLAPACK", "_dgemv$NEWLAPACK"} <= nm(lib)
    dis = disassembly(lib)
    branch = "b\t" if arch == "arm64" else "jmp\t"
    for fn, target in (("_dgetrf_", "_dgetrf$NEWLAPACK"), ("_dgemv_", "_dgemv$NEWLAPACK"),
                       ("_dgesvx_", "_dgesvx$NEWLAPACK")):
        last = dis[fn][-1] if arch == "arm64" else next(x for x in dis[fn] if x.startswith(branch))
        assert last.startswith(branch) and f"symbol stub for: {target}" in last, dis[fn]
    assert not any(f"symbol stub for: _dgetrs$NEWLAPACK" in x and x.startswith(branch) for x in dis["_dgetrs_"])
    if arch == "arm64":  # the stack arguments are moved before the branch
        assert len(dis["_dgemv_"]) > 1
        assert len(dis["_dgesvx_"]) > 9 and any(x.startswith(("ldur", "stur")) for x in dis["_dgesvx_"])


@pytest.mark.parametrize("arch", ARCHS)
def test_thunks_to_accelerate_are_its_imports_not_copies(stubs_libs, capsys, arch):
    rc, found = findings(capsys, stubs_libs[f"{arch}/thunks"])
    assert rc == 1
    by = {(x["rule"], x["kind"]): x for x in found}
    static = by.get(("blas.reference", "static-symbol"))
    # the loop and the function that computes after its call stay definitions
    assert static is not None and names_of(static) == {"dgemm_", "dgetrs_"}
    imported = by[("apple.accelerate", "imported-symbol")]
    assert {"dgetrf_", "dgemv_", "dgesvx_"} <= names_of(imported)
    assert {"dgetrf$NEWLAPACK", "dgemv$NEWLAPACK", "dgetrs$NEWLAPACK"} <= names_of(imported)
    assert "dgetrf_ -> dgetrf$NEWLAPACK (stub)" in imported["detail"]
    assert "dgemv_ -> dgemv$NEWLAPACK (stub)" in imported["detail"]
    assert ("apple.accelerate", "needed") in by


@pytest.mark.parametrize("arch", ARCHS)
def test_ilp64_name_is_the_cblas_api(stubs_libs, capsys, arch):
    lib = stubs_libs[f"{arch}/ilp64"]
    assert "_cblas_ddot$NEWLAPACK$ILP64" in nm(lib)
    rc, found = findings(capsys, lib)
    assert rc == 1
    by = {(x["rule"], x["kind"]): x for x in found}
    # from a library no rule denies: the rule of the name it stands for (cblas_ddot)
    assert names_of(by[("blas.cblas", "imported-symbol")]) == {"cblas_ddot$NEWLAPACK$ILP64"}

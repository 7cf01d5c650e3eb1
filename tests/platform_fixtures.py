"""Windows PE and macOS Mach-O fixture binaries, built at test time by real linkers.

PE: MinGW-w64 (x86_64-w64-mingw32-gcc with GNU ld, and dlltool for the delay-load import
library) and clang-15 with lld-link (the MSVC-style layout: import tables in .rdata).
Mach-O: clang-15 with ld64.lld-15, and llvm-lipo-15 for the universal binary.
Session-scoped and built once (elf_fixtures.once); a missing tool skips with its name.

What the tests may assert comes from the sources written here: the DLL and dylib names, the
imported and exported function names, the strings handed to LoadLibrary/dlopen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import once, run

MINGW = "x86_64-w64-mingw32-gcc"

# -- PE ------------------------------------------------------------------------------------------
FAKE_CUBLAS_C = r"""
/* stands in for NVIDIA's cublas64_12.dll: only the exported names matter */
__declspec(dllexport) int cublasCreate_v2(void **h) { *h = 0; return 0; }
__declspec(dllexport) int cublasSgemm_v2(void *h) { return h != 0; }
"""
CUFFT_DEF = "LIBRARY cufft64_11.dll\nEXPORTS\n    cufftPlan1d\n"
APP_C = r"""
#include <windows.h>
extern int cublasCreate_v2(void **h);  /* from cublas64_12.dll's import library */
extern int cufftPlan1d(void);           /* delay-loaded: cufft64_11.dll */
typedef int (*create_fn)(void **);
__declspec(dllexport) int fk_app_run(void) {
    void *h;
    int rc = cublasCreate_v2(&h) + cufftPlan1d();
    /* the loader by name: what LoadLibraryA and LoadLibraryW are given */
    HMODULE dnn = LoadLibraryA("cudnn64_9.dll");
    HMODULE mi = LoadLibraryW(L"MIOpen.dll");
    if (dnn) {
        create_fn c = (create_fn)GetProcAddress(dnn, "cudnnCreate");
        create_fn d = (create_fn)GetProcAddress(dnn, "cudnnDestroy");
        if (c && d) rc += c(&h) + d(h);
    }
    return rc + (mi != 0);
}
"""
FORWARD_DEF = "LIBRARY fkfwd.dll\nEXPORTS\n    fk_own\n    cublasSgemm_v2 = cublas64_12.cublasSgemm_v2\n"
FORWARD_C = "__declspec(dllexport) int fk_own(void) { return 1; }\n"
LLD_APP_C = r"""
extern int __declspec(dllimport) cublasCreate_v2(void **h);
extern int __declspec(dllimport) cufftPlan1d(void);
/* lld-link's /DELAYLOAD thunks call this (delayimp.lib's, written out: no MSVC libraries here) */
void *__delayLoadHelper2(const void *descr, void **slot) { (void)descr; return *slot; }
int _DllMainCRTStartup(void *a, unsigned b, void *c) { return 1; }
__declspec(dllexport) int fk_lld_run(void) { void *h; return cublasCreate_v2(&h) + cufftPlan1d(); }
"""
CUBLAS_DEF = "LIBRARY cublas64_12.dll\nEXPORTS\n    cublasCreate_v2\n    cublasSgemm_v2\n"


@pytest.fixture(scope="session")
def pe_libs(fixture_root) -> dict[str, Path]:
    """MinGW-built (GNU ld): cublas64_12.dll (a fake exporting cublasCreate_v2, cublasSgemm_v2),
    fkapp.dll (imports cublasCreate_v2 from cublas64_12.dll, delay-loads cufftPlan1d from
    cufft64_11.dll through dlltool's --output-delaylib, LoadLibraryA("cudnn64_9.dll") with
    GetProcAddress "cudnnCreate"/"cudnnDestroy", LoadLibraryW(L"MIOpen.dll")), its stripped copy
    fkapp_stripped.dll, and fkfwd.dll (exports fk_own and forwards cublasSgemm_v2 to
    cublas64_12.cublasSgemm_v2)."""
    return once("pe_libs", lambda: _build_pe_libs(fixture_root))


def _build_pe_libs(fixture_root) -> dict[str, Path]:
    gcc = require_tool(MINGW)
    dlltool = require_tool("x86_64-w64-mingw32-dlltool")
    strip = require_tool("x86_64-w64-mingw32-strip")
    d = fixture_root / "pe"
    d.mkdir(exist_ok=True)
    (d / "cublas.c").write_text(FAKE_CUBLAS_C)
    (d / "cufft.def").write_text(CUFFT_DEF)
    (d / "app.c").write_text(APP_C)
    (d / "fwd.def").write_text(FORWARD_DEF)
    (d / "fwd.c").write_text(FORWARD_C)
    run([gcc, "-shared", "-o", "cublas64_12.dll", "cublas.c", "-Wl,--out-implib,libcublas64_12.dll.a"], cwd=d)
    run([dlltool, "--input-def", "cufft.def", "--dllname", "cufft64_11.dll",
         "--output-delaylib", "libcufft_delay.a"], cwd=d)
    run([gcc, "-shared", "-O1", "-o", "fkapp.dll", "app.c", "-L.", "-lcublas64_12.dll", "-lcufft_delay"], cwd=d)
    run([strip, "-o", "fkapp_stripped.dll", "fkapp.dll"], cwd=d)
    run([gcc, "-shared", "-o", "fkfwd.dll", "fwd.c", "fwd.def"], cwd=d)
    return {"cublas": d / "cublas64_12.dll", "app": d / "fkapp.dll", "stripped": d / "fkapp_stripped.dll",
            "forward": d / "fkfwd.dll"}


@pytest.fixture(scope="session")
def pe_lld_libs(fixture_root) -> dict[str, Path]:
    """clang-15 --target=x86_64-pc-windows-msvc with lld-link-15: fklld.dll, importing
    cublasCreate_v2 from cublas64_12.dll and delay-loading cufftPlan1d from cufft64_11.dll
    (/DELAYLOAD), import libraries made by llvm-dlltool-15 from .def files."""
    return once("pe_lld_libs", lambda: _build_pe_lld_libs(fixture_root))


def _build_pe_lld_libs(fixture_root) -> dict[str, Path]:
    clang = require_tool("clang-15")
    lld_link = require_tool("lld-link-15")
    dlltool = require_tool("llvm-dlltool-15")
    d = fixture_root / "pe_lld"
    d.mkdir(exist_ok=True)
    (d / "app.c").write_text(LLD_APP_C)
    (d / "cublas.def").write_text(CUBLAS_DEF)
    (d / "cufft.def").write_text(CUFFT_DEF)
    run([dlltool, "-m", "i386:x86-64", "-d", "cublas.def", "-l", "cublas.lib"], cwd=d)
    run([dlltool, "-m", "i386:x86-64", "-d", "cufft.def", "-l", "cufft.lib"], cwd=d)
    run([clang, "--target=x86_64-pc-windows-msvc", "-O1", "-c", "-o", "app.obj", "app.c"], cwd=d)
    run([lld_link, "/dll", "/nodefaultlib", "/entry:_DllMainCRTStartup", "/out:fklld.dll", "app.obj",
         "cublas.lib", "cufft.lib", "/delayload:cufft64_11.dll"], cwd=d)
    return {"app": d / "fklld.dll"}


# -- Mach-O --------------------------------------------------------------------------------------
LIBSYSTEM_C = r"""
/* stands in for /usr/lib/libSystem.B.dylib (no macOS SDK here): the loader's entry points */
void *dlopen(const char *p, int m) { (void)p; (void)m; return 0; }
void *dlsym(void *h, const char *n) { (void)h; (void)n; return 0; }
/* the lazy-binding entry ld64 expects in libSystem (no C underscore) */
void fk_stub_binder(void) __asm__("dyld_stub_binder");
void fk_stub_binder(void) {}
"""
MACHO_CUBLAS_C = "int cublasCreate_v2(void **h) { *h = 0; return 0; }\n"
MACHO_CUDNN_C = "int cudnnCreate(void **h) { *h = 0; return 0; }\n"
MACHO_APP_C = r"""
extern void *dlopen(const char *, int);
extern void *dlsym(void *, const char *);
extern int cublasCreate_v2(void **h);
extern int cudnnCreate(void **h) __attribute__((weak_import));
int fk_app_run(void) {
    void *h;
    int rc = cublasCreate_v2(&h);
    if (cudnnCreate) rc += cudnnCreate(&h);
    void *fft = dlopen("libcufft.dylib", 2);
    if (fft && dlsym(fft, "cufftPlan1d") && dlsym(fft, "cufftExecC2C")) rc++;
    return rc;
}
"""
MACHO_ARCHS = ("x86_64", "arm64")


@pytest.fixture(scope="session")
def macho_libs(fixture_root) -> dict[str, Path]:
    """clang-15 with ld64.lld-15 (-fuse-ld=lld), per architecture (x86_64, arm64):
    libSystem.B.dylib (a stand-in exporting dlopen, dlsym), libcublas.dylib (install name
    @rpath/libcublas.dylib), libcudnn.dylib (@rpath/libcudnn.dylib), libfkapp.dylib (install name
    @rpath/libfkapp.dylib; loads @rpath/libcublas.dylib, weakly @rpath/libcudnn.dylib; LC_RPATH
    @loader_path/../lib then @executable_path/Frameworks; dlopen("libcufft.dylib") with dlsym
    "cufftPlan1d", "cufftExecC2C") and libfkre.dylib (re-exports @rpath/libcudnn.dylib);
    `universal`: llvm-lipo-15 -create of both libfkapp.dylib, x86_64 first."""
    return once("macho_libs", lambda: _build_macho_libs(fixture_root))


def _build_macho_libs(fixture_root) -> dict[str, Path]:
    clang = require_tool("clang-15")
    require_tool("ld64.lld-15")
    lipo = require_tool("llvm-lipo-15")
    d = fixture_root / "macho"
    d.mkdir(exist_ok=True)
    for name, text in (("sys.c", LIBSYSTEM_C), ("cublas.c", MACHO_CUBLAS_C), ("cudnn.c", MACHO_CUDNN_C),
                       ("app.c", MACHO_APP_C)):
        (d / name).write_text(text)
    out: dict[str, Path] = {}
    for arch in MACHO_ARCHS:
        a = d / arch
        a.mkdir(exist_ok=True)
        cc = [clang, f"--target={arch}-apple-macos11", "-fuse-ld=lld", "-nostdlib", "-shared"]
        run([*cc, "-o", "libSystem.B.dylib", "../sys.c", "-Wl,-install_name,/usr/lib/libSystem.B.dylib"], cwd=a)
        run([*cc, "-o", "libcublas.dylib", "../cublas.c", "-Wl,-install_name,@rpath/libcublas.dylib"], cwd=a)
        run([*cc, "-o", "libcudnn.dylib", "../cudnn.c", "-Wl,-install_name,@rpath/libcudnn.dylib"], cwd=a)
        run([*cc, "-O1", "-o", "libfkapp.dylib", "../app.c", "-Wl,-install_name,@rpath/libfkapp.dylib",
             "libSystem.B.dylib", "libcublas.dylib", "-Wl,-weak_library,libcudnn.dylib",
             "-Wl,-rpath,@loader_path/../lib", "-Wl,-rpath,@executable_path/Frameworks"], cwd=a)
        run([*cc, "-o", "libfkre.dylib", "../cublas.c", "-Wl,-install_name,@rpath/libfkre.dylib",
             "-Wl,-reexport_library,libcudnn.dylib"], cwd=a)
        out[arch] = a / "libfkapp.dylib"
        out[f"{arch}-reexport"] = a / "libfkre.dylib"
    run([lipo, "-create", "-output", str(d / "libfkapp_universal.dylib"), *(str(out[a]) for a in MACHO_ARCHS)])
    out["universal"] = d / "libfkapp_universal.dylib"
    return out

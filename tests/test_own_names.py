"""A program's own function and operator names are no vendor API looked up by name, in every
format; a vendor's classes compiled into a Windows DLL are a static copy, as in ELF.

torch's libtorch_cpu holds `mkl_gemm_batched` and `mkldnn_linear` as strings (operator names,
`aten::mkldnn_linear`) beside its own C++ functions of those names, in a file that imports
dlsym: they are its own names (a C API has no namespace and no mangled form). Each fixture is
built by a real compiler per format: g++ (ELF), clang-15 + ld64.lld-15 (Mach-O arm64), clang-15
for the MSVC ABI + lld-link-15 (PE, MSVC-decorated names and RTTI type names). The vendor names
a fixture really hands to the loader (cublasCreate_v2, cublasDestroy_v2) must still be found.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import run

from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

# {lookup}: the loader's lookup function, declared for each platform
OPERATORS = r"""
{decl}
namespace at {{ namespace native {{
{export} int mkl_gemm_batched(int a) {{ return a + 1; }}
{export} int mkl_gemm_bf16bf16f32(int a) {{ return a + 2; }}
}} }}
extern "C" {export} const char *const op_names[] = {{
    "mkl_gemm_batched", "mkl_gemm_bf16bf16f32",
    "aten::mkldnn_linear", "mkldnn_linear", "aten::mkldnn_convolution", "mkldnn_convolution",
}};
extern "C" {export} void *resolve(void *h, int i) {{ return {lookup}(h, i ? "cublasCreate_v2" : "cublasDestroy_v2"); }}
"""
ELF_DECL = "#include <dlfcn.h>"
MACHO_DECL = 'extern "C" void *dlsym(void *, const char *);'
PE_DECL = 'extern "C" __declspec(dllimport) void *__stdcall GetProcAddress(void *, const char *);'
LIBSYSTEM = r"""
void *dlsym(void *h, const char *n) { (void)h; (void)n; return 0; }
void fk_stub_binder(void) __asm__("dyld_stub_binder");
void fk_stub_binder(void) {}
"""

# oneDNN-like classes compiled into a DLL (its RTTI type names), two of its API names as strings
# handed to GetProcAddress; what the C runtime would give (operator new, type_info's vtable) here
COMPILED_IN_PE = r"""
extern "C" __declspec(dllimport) void *__stdcall GetProcAddress(void *, const char *);
static char arena[256];
void *operator new(unsigned long long) { return arena; }
void operator delete(void *) noexcept {}
void operator delete(void *, unsigned long long) noexcept {}
extern "C" const void *type_info_vftable[1] __asm__("??_7type_info@@6B@") = {nullptr};
namespace dnnl { namespace impl {
struct primitive_t { virtual ~primitive_t() {} virtual int kind() const { return 1; } };
struct engine_t : primitive_t { int kind() const override { return 2; } };
} }
extern "C" __declspec(dllexport) int run_it(int i) {
    dnnl::impl::primitive_t *p = i ? new dnnl::impl::engine_t : new dnnl::impl::primitive_t;
    int k = p->kind();
    delete p;
    return k;
}
extern "C" __declspec(dllexport) void *api(void *h, int i) {
    return GetProcAddress(h, i ? "dnnl_engine_create" : "dnnl_stream_create");
}
"""


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def _elf(d: Path) -> Path:
    (d / "ops.cc").write_text(OPERATORS.format(decl=ELF_DECL, export="", lookup="dlsym"))
    run(require_tool("g++"), "-shared", "-fPIC", "-O1", "-o", d / "libops.so", d / "ops.cc", "-ldl")
    return d / "libops.so"


def _macho(d: Path) -> Path:
    clang = require_tool("clang-15")
    require_tool("ld64.lld-15")
    cc = [clang, "--target=arm64-apple-macos11", "-fuse-ld=lld", "-nostdlib", "-shared"]
    (d / "sys.c").write_text(LIBSYSTEM)
    (d / "ops.cc").write_text(OPERATORS.format(decl=MACHO_DECL, export="", lookup="dlsym"))
    run(*cc, "-o", d / "libSystem.B.dylib", d / "sys.c", "-Wl,-install_name,/usr/lib/libSystem.B.dylib")
    run(*cc, "-O1", "-o", d / "libops.dylib", d / "ops.cc", d / "libSystem.B.dylib",
        "-Wl,-install_name,@rpath/libops.dylib")
    return d / "libops.dylib"


def _pe(d: Path, name: str, source: str) -> Path:
    clang = require_tool("clang-15")
    lld_link = require_tool("lld-link-15")
    kernel32 = Path("/usr/x86_64-w64-mingw32/lib/libkernel32.a")  # MinGW's import library
    if not kernel32.exists():
        pytest.skip("MinGW-w64's libkernel32.a is missing (make test installs mingw-w64)")
    (d / f"{name}.cc").write_text(source)
    run(clang, "--target=x86_64-pc-windows-msvc", "-O1", "-fno-exceptions", "-c", "-o", d / f"{name}.obj",
        d / f"{name}.cc")
    run(lld_link, "/dll", "/noentry", "/nodefaultlib", f"/out:{d / (name + '.dll')}", d / f"{name}.obj", kernel32)
    return d / f"{name}.dll"


@pytest.fixture(scope="module")
def operators(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("own-names")
    out = {}
    for fmt, build in (("elf", _elf), ("macho", _macho)):
        (d / fmt).mkdir()
        out[fmt] = build(d / fmt)
    (d / "pe").mkdir()
    out["pe"] = _pe(d / "pe", "ops", OPERATORS.format(decl=PE_DECL, export="__declspec(dllexport)",
                                                       lookup="GetProcAddress"))
    return out


def _findings(path: Path):
    (res,) = check_paths([str(path)], policy(), ResolveOptions()).files
    return res.findings


@pytest.mark.parametrize("fmt", ["elf", "macho", "pe"])
def test_own_operator_names_are_no_lookups(operators, fmt):
    data = operators[fmt].read_bytes()
    # the fixture's shape, as the file holds it: the names as strings and as the program's own
    assert b"\0mkl_gemm_batched\0" in data and b"aten::mkldnn_linear\0" in data
    assert b"16mkl_gemm_batched" in data or b"?mkl_gemm_batched@native@at@@" in data
    findings = _findings(operators[fmt])
    assert not [f for f in findings if f.rule in ("intel.mkl", "intel.onednn")]
    (cublas,) = [f for f in findings if f.rule == "nvidia.cublas" and f.kind == "dlsym-string"]
    assert cublas.matches[0].names == ["cublasCreate_v2", "cublasDestroy_v2"]


def test_vendor_classes_compiled_into_a_dll_are_a_static_copy(tmp_path):
    dll = _pe(tmp_path, "engine", COMPILED_IN_PE)
    assert b".?AUengine_t@impl@dnnl@@\0" in dll.read_bytes()  # MSVC's RTTI type name of the class
    findings = [f for f in _findings(dll) if f.rule == "intel.onednn"]
    assert [(f.kind, f.matches[0].names) for f in findings] == [
        ("static-symbol", [".?AUengine_t@impl@dnnl@@", ".?AUprimitive_t@impl@dnnl@@"])]
    assert "dnnl_engine_create" in findings[0].detail


VERSION_RC = r"""
1 VERSIONINFO
FILEVERSION 9,28,0,42
BEGIN
  BLOCK "StringFileInfo"
  BEGIN
    BLOCK "040904b0"
    BEGIN
      VALUE "FileDescription", "stand-in for a vendor DLL's version resource"
      VALUE "InternalName", "cudnn_ops64_9.dll"
      VALUE "OriginalFilename", "cudnn_ops64_9.dll"
    END
  END
  BLOCK "VarFileInfo"
  BEGIN
    VALUE "Translation", 0x409, 1200
  END
END
"""
LOADS_GRAPH = r"""
#include <windows.h>
__declspec(dllexport) void *load_graph(void) { return LoadLibraryW(L"cudnn_graph64_9.dll"); }
"""


def test_a_dlls_own_name_in_its_version_resource_is_no_load(tmp_path):
    gcc = require_tool("x86_64-w64-mingw32-gcc")
    windres = require_tool("x86_64-w64-mingw32-windres")
    (tmp_path / "ver.rc").write_text(VERSION_RC)
    (tmp_path / "ops.c").write_text(LOADS_GRAPH)
    run(windres, tmp_path / "ver.rc", "-O", "coff", "-o", tmp_path / "ver.o")
    dll = tmp_path / "cudnn_ops64_9.dll"
    run(gcc, "-shared", "-O1", "-o", dll, tmp_path / "ops.c", tmp_path / "ver.o")
    assert "cudnn_ops64_9.dll".encode("utf-16-le") in dll.read_bytes()  # OriginalFilename, in .rsrc
    loads = [m.names for f in _findings(dll) if f.kind == "dlopen-string" for m in f.matches]
    assert loads == [["cudnn_graph64_9.dll"]]  # the name it loads, not its own


# A loader's wrappers named after the API they look up (PaddlePaddle's phi::dynload::cblas_sgemm
# objects): variables of the program, whose names are the vendor's: still a lookup.
WRAPPERS = r"""
#include <dlfcn.h>
namespace phi { namespace dynload {
struct Loader { const char *name; void *operator()(void *h) const { return dlsym(h, name); } };
Loader cblas_sgemm{"cblas_sgemm"}, cblas_dgemm{"cblas_dgemm"};
} }
extern "C" void *use(void *h) { return phi::dynload::cblas_sgemm(h) ? phi::dynload::cblas_dgemm(h) : 0; }
"""


def test_wrapper_objects_named_after_the_api_are_still_lookups(tmp_path):
    (tmp_path / "wrap.cc").write_text(WRAPPERS)
    lib = tmp_path / "libwrap.so"
    run(require_tool("g++"), "-shared", "-fPIC", "-O1", "-o", lib, tmp_path / "wrap.cc", "-ldl")
    assert b"_ZN3phi7dynload11cblas_sgemmE\0" in lib.read_bytes()  # the wrapper object, as g++ names it
    (found,) = [f for f in _findings(lib) if f.rule == "blas.cblas" and f.kind == "dlsym-string"]
    assert found.matches[0].names == ["cblas_dgemm", "cblas_sgemm"]

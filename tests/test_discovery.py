"""Vendor components that hide: libraries renamed by wheel repair tools, symbols renamed by their
build, libraries loaded with dlopen from beside the caller, and libraries that ld.so's search does
not reach but the same wheel or folder ships. Every fixture is built here by gcc, in the shape of
the real case (numpy/scipy's scipy-openblas, onnxruntime-gpu's providers, torch's bin/)."""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared, cuda_linkage_libs, run  # noqa: F401  (fixture)

from audit.linkage.check import check_paths
from audit.linkage.judging.patterns import soname_stem
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def audit(*paths):
    return check_paths([str(p) for p in paths], policy(), ResolveOptions())


def only(report):
    assert len(report.files) == 1, [f.path for f in report.files]
    return report.files[0]


def by_path(report, suffix):
    hits = [f for f in report.files if f.path.endswith(suffix)]
    assert len(hits) == 1, [f.path for f in report.files]
    return hits[0]


def vendor_lib(d: Path, soname: str, symbols: list[str]) -> Path:
    """A stand-in vendor library: the real name and the real API names, our own trivial bodies."""
    body = "".join(f"int {s}(void){{return {i};}}\n" for i, s in enumerate(symbols))
    return cc_shared(d / soname, body, f"-Wl,-soname,{soname}")


def user_of(out: Path, lib: Path, symbols: list[str], *flags) -> Path:
    """A library that calls `symbols` from `lib` (linked by its file name, so DT_NEEDED is it)."""
    decl = "".join(f"extern int {s}(void);\n" for s in symbols)
    calls = "+".join(f"{s}()" for s in symbols)
    return cc_shared(out, decl + f"int fk_user(void){{return {calls};}}\n", f"-L{lib.parent}",
                     f"-l:{lib.name}", *flags)


# ---------------------------------------------------------------- renamed libraries and symbols


@pytest.mark.parametrize("name, stem", [
    ("libscipy_openblas64_-32a4b2a6.so", "libscipy_openblas64_"),  # auditwheel: <name>-<8 hex>.so
    ("libscipy_openblas-6cdc3b4a.so", "libscipy_openblas"),
    ("libctranslate2-a7a60d30.so.4.6.0", "libctranslate2"),  # the version stays after the hash
    ("libgfortran-040039e1-0352e75f.so.5.0.0", "libgfortran"),  # repaired twice
    ("libopenblaso-r0-d77a1985.3.15.so", "libopenblaso"),  # <name>-r0-<hex>.<version>.so
    ("libopenblas64_p-r0-2f7c42d4.3.18.so", "libopenblas64_p"),
    ("@loader_path/.dylibs/libopenblas.0.dylib", "libopenblas"),  # delocate: the path and .dylib
    ("libopenblas-57db09cfe174768fb409a6bb5a530d4c.dll", "libopenblas"),  # delvewheel
    ("libcublas.so.12.3", "libcublas"),
    ("libnvrtc-builtins.so.13.0", "libnvrtc-builtins"),  # a real name part, not a hash
    ("libLLVM-17.so.1", "libLLVM-17"),
])
def test_soname_stem_undoes_repair_tool_renaming(name, stem):
    assert soname_stem(name) == stem


@pytest.mark.parametrize("soname, rule", [
    ("libscipy_openblas64_-32a4b2a6.so", "blas.openblas"),  # numpy's bundled OpenBLAS
    ("libscipy_openblas-6cdc3b4a.so", "blas.openblas"),  # scipy's
    ("libopenblaso-r0-d77a1985.3.15.so", "blas.openblas"),
    ("libcublas-3f2a1b4c.so.12", "nvidia.cublas"),  # an exact-name rule, reached only by the stem
    ("libcudnn-0b1c2d3e.so.9", "nvidia.cudnn"),
])
def test_a_renamed_vendor_library_fails_by_name_even_when_unresolvable(tmp_path, soname, rule):
    lib = vendor_lib(tmp_path / "libs", soname, ["fk_vendor_entry"])
    user = user_of(tmp_path / "alone/libuser.so", lib, ["fk_vendor_entry"])
    res = only(audit(user))  # audited on its own: the library is not shipped beside it
    needed = [f for f in res.findings if f.kind == "needed"]
    assert [(f.rule, f.subject) for f in needed] == [(rule, soname)]
    assert needed[0].detail == "not found on this system"
    assert res.verdict == "fail"


def test_a_hash_named_library_of_no_vendor_passes(tmp_path):
    lib = vendor_lib(tmp_path / "libs", "libfkmath-0123abcd.so.1", ["fk_vendor_entry"])
    user = user_of(tmp_path / "alone/libuser.so", lib, ["fk_vendor_entry"])
    res = only(audit(user))
    assert res.verdict == "pass" and [f.kind for f in res.findings] == ["unresolved"]


@pytest.mark.parametrize("symbols", [
    ["scipy_dgemm_", "scipy_cblas_dgemm", "scipy_openblas_get_config"],  # scipy's cython_blas
    ["scipy_dgemm_64_", "scipy_cblas_dgemm64_", "scipy_openblas_get_config64_"],  # numpy (ILP64)
])
def test_scipy_openblas_prefixed_imports_match_the_blas_rules(tmp_path, symbols):
    lib = vendor_lib(tmp_path / "libs", "libfkmath.so.1", symbols)  # a library name of no vendor
    user = user_of(tmp_path / "alone/libuser.so", lib, symbols)
    res = only(audit(user))
    got = {(f.rule, f.subject) for f in res.findings if f.kind == "imported-symbol"}
    assert got == {("blas.reference", symbols[0]), ("blas.cblas", symbols[1]), ("blas.openblas", symbols[2])}


def test_prefix_lookalikes_pass(tmp_path):
    symbols = ["scipy_dgemm_helper", "scipyx_dgemm_", "scipy_fk_norm"]  # not a renamed BLAS name
    lib = vendor_lib(tmp_path / "libs", "libfkmath.so.1", symbols)
    res = only(audit(user_of(tmp_path / "alone/libuser.so", lib, symbols)))
    assert res.verdict == "pass" and not [f for f in res.findings if f.kind != "unresolved"]


# ---------------------------------------------------------------- dlopen of a library shipped beside it


LOADER = '#include <dlfcn.h>\nvoid *fk_load(void){{return dlopen("{name}", RTLD_NOW);}}\n'


@pytest.fixture(scope="module")
def providers(tmp_path_factory) -> dict[str, Path]:
    """onnxruntime-gpu's shape: capi/libloader.so (the runtime) dlopens "libplugin_cuda.so",
    shipped in the same folder, which links cuBLAS (not shipped: the CUDA wheels bring it)."""
    require_tool("gcc")
    root = tmp_path_factory.mktemp("providers")
    cublas = vendor_lib(root / "cuda", "libcublas.so.12", ["cublasCreate_v2"])
    capi = root / "pkg/capi"
    plugin = user_of(capi / "libplugin_cuda.so", cublas, ["cublasCreate_v2"])
    loader = cc_shared(capi / "libloader.so", LOADER.format(name="libplugin_cuda.so"), "-ldl")
    # the Python module one folder up, no RUNPATH: the plugin is found among the wheel's members
    module = cc_shared(root / "pkg/_state.so", LOADER.format(name="libplugin_cuda.so"), "-ldl")
    ghost = cc_shared(root / "ghost/libghost.so", LOADER.format(name="libnowhere_cuda.so"), "-ldl")
    whl = root / "pkg-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for f in (plugin, loader, module):
            zf.write(f, f.relative_to(root).as_posix())
    return {"plugin": plugin, "loader": loader, "module": module, "ghost": ghost, "wheel": whl}


def test_a_dlopen_of_a_library_beside_the_caller_is_walked(providers):
    res = only(audit(providers["loader"]))  # one file: the plugin is found in the caller's folder
    plugin = next(c for c in res.tree.children if c.name == "libplugin_cuda.so")
    assert (plugin.edge, plugin.how, plugin.status) == ("dlopen", "beside", "unlisted")
    trans = [f for f in res.findings if f.kind == "transitive"]
    assert [(f.rule, f.subject, f.chain) for f in trans] == [
        ("nvidia.cublas", "libcublas.so.12", ["libloader.so", "libplugin_cuda.so (dlopen)", "libcublas.so.12"])]
    assert trans[0].where == "DT_NEEDED of libplugin_cuda.so"
    assert any(f.kind == "imported-symbol" and f.chain[-1] == "libplugin_cuda.so (dlopen)" for f in res.findings)
    assert res.verdict == "fail"


def test_a_dlopen_resolved_among_the_wheel_members_is_walked(providers):
    report = audit(providers["wheel"])
    res = by_path(report, "!/pkg/_state.so")
    plugin = next(c for c in res.tree.children if c.name == "libplugin_cuda.so")
    assert (plugin.edge, plugin.how) == ("dlopen", "member")
    assert plugin.note.endswith("!/pkg/capi/libplugin_cuda.so")
    assert any("dlopen string libplugin_cuda.so of _state.so" in w and "member" in w for w in res.warnings)
    assert [f.chain for f in res.findings if f.kind == "transitive"] == [
        ["_state.so", "libplugin_cuda.so (dlopen)", "libcublas.so.12"]]
    assert by_path(report, "!/pkg/capi/libloader.so").verdict == "fail"


def test_a_dlopen_string_naming_a_vendor_library_under_another_name_is_found(tmp_path):
    # libhelper.so beside the caller is cuDNN by its SONAME: the name string alone says nothing
    vendor_lib(tmp_path / "pkg", "libcudnn.so.9", ["cudnnCreate"]).rename(tmp_path / "pkg/libhelper.so")
    loader = cc_shared(tmp_path / "pkg/libloader.so", LOADER.format(name="libhelper.so"), "-ldl")
    res = only(audit(loader))
    (f,) = [f for f in res.findings if f.rule == "nvidia.cudnn"]
    assert (f.kind, f.subject, f.where, f.chain) == (
        "dlopen-string", "libhelper.so", "dlopen string of libloader.so", ["libloader.so", "libhelper.so (dlopen)"])
    assert "SONAME libcudnn.so.9" in f.detail and res.verdict == "fail"


def test_a_dlopen_string_that_names_no_file_is_not_an_edge(providers):
    res = only(audit(providers["ghost"]))
    assert res.verdict == "pass" and res.tree.children and all(c.edge == "needed" for c in res.tree.children)


# ---------------------------------------------------------------- the member set as a fallback


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> dict[str, Path]:
    """torch's bin/test_shim shape: bin/test_app needs libcore_cpu.so with RUNPATH $ORIGIN, but the
    library is in lib/; libcore_cpu.so itself links cuBLAS (not shipped)."""
    require_tool("gcc")
    root = tmp_path_factory.mktemp("shim")
    cublas = vendor_lib(root / "cuda", "libcublas.so.12", ["cublasCreate_v2"])
    core = user_of(root / "pkg/lib/libcore_cpu.so", cublas, ["cublasCreate_v2"], "-Wl,-soname,libcore_cpu.so")
    (root / "pkg/bin").mkdir(parents=True)
    main = root / "pkg/bin/test_app.c"
    main.write_text("extern int fk_user(void);\nint main(void){return fk_user();}\n")
    app = root / "pkg/bin/test_app"
    run("gcc", "-o", app, main, f"-L{core.parent}", "-lcore_cpu", f"-Wl,-rpath-link,{cublas.parent}",
        "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    whl = root / "pkg-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for f in (core, app):
            zf.write(f, f.relative_to(root).as_posix())
    return {"app": app, "folder": root / "pkg", "wheel": whl}


def test_alone_an_unreachable_needed_is_only_a_warning(shim):
    res = only(audit(shim["app"]))
    assert [(f.kind, f.subject, f.severity) for f in res.findings] == [("unresolved", "libcore_cpu.so", "warn")]
    assert res.verdict == "pass"


@pytest.mark.parametrize("kind", ["folder", "wheel"])
def test_inside_a_folder_or_wheel_the_members_resolve_it(shim, kind):
    report = audit(shim[kind])
    res = by_path(report, "bin/test_app")
    core = next(c for c in res.tree.children if c.name == "libcore_cpu.so")
    shown = f"{shim['wheel']}!/pkg/lib/libcore_cpu.so" if kind == "wheel" else str(shim["folder"] / "lib/libcore_cpu.so")
    assert (core.how, core.status) == ("member", "unlisted")
    assert core.note == f"not on ld.so's search path; resolved to member {shown}"
    assert res.warnings == [f"DT_NEEDED libcore_cpu.so of test_app is not on ld.so's search path; resolved to member {shown}"]
    assert not [f for f in res.findings if f.kind == "unresolved"]
    trans = [f for f in res.findings if f.kind == "transitive"]
    assert [(f.rule, f.chain) for f in trans] == [("nvidia.cublas", ["test_app", "libcore_cpu.so", "libcublas.so.12"])]
    assert res.verdict == "fail"


# ---------------------------------------------------------------- attention kernels in namespaces


VENDOR_KERNELS = {  # a piece of each mangled kernel name -> the rule it belongs to
    "11onnxruntime5flash16flash_fwd_kernel": "attention.flash-attn",
    "11onnxruntime5flash24flash_fwd_splitkv_kernel": "attention.flash-attn",
    "11onnxruntime5flash30flash_bwd_dq_dk_dv_loop_kernel": "attention.flash-attn",
    "16FlashAttnFwdSm90": "attention.flash-attn",
    "11onnxruntime4fmha12fused_kernel": "attention.xformers",
    "15AttentionKernelI": "attention.xformers",
    "23AttentionBackwardKernelI": "attention.xformers",
    "39fmha_cutlassF_f16_aligned_64x64_rf_sm80": "attention.xformers",
    "56cudnn_generated_fort_native_sdpa_sm90_flash_fprop_knob_3": "nvidia.cudnn",
}


def kernel_names(path) -> set[str]:
    from audit.elf.reader import read_elf

    return {k for dc in read_elf(str(path)).device_code for k in dc.kernels}


def test_attention_kernels_are_recognised_in_any_namespace(cuda_linkage_libs):
    names = kernel_names(cuda_linkage_libs["attention_named"])
    assert len(names) == len(VENDOR_KERNELS), sorted(names)  # nvcc kept every kernel, under its own name
    for piece, rule in VENDOR_KERNELS.items():
        (name,) = [n for n in names if piece in n]
        got = policy().rule_for_kernel(name)
        assert got is not None and got.id == rule, (name, got and got.id)
    res = only(audit(cuda_linkage_libs["attention_named"]))
    counts = {f.rule: f.distinct for f in res.findings if f.kind == "device-kernel"}  # names, not entries
    assert counts == {"attention.flash-attn": 4, "attention.xformers": 4, "nvidia.cudnn": 1}
    assert res.verdict == "fail"


def test_our_own_attention_kernels_and_lookalikes_pass(cuda_linkage_libs):
    names = kernel_names(cuda_linkage_libs["attention_own"])
    assert len(names) == 8 and any("16flash_mma_kernel" in n for n in names)
    assert [n for n in names if policy().rule_for_kernel(n)] == []
    res = only(audit(cuda_linkage_libs["attention_own"]))
    assert res.verdict == "pass" and res.findings == []


# ---------------------------------------------------------------- a library name assembled in code


RUNTIME_LOADER = r"""
#include <dlfcn.h>
#include <string.h>
static const char *const api[] = {%(api)s};
void *fk_fns[sizeof api / sizeof api[0]];
int fk_load(void) {
    char name[24];
    memcpy(name, "%(lib)s", sizeof "%(lib)s");  /* gcc -O2 stores it with immediates */
    void *h = dlopen(name, RTLD_NOW);
    if (!h) return -1;
    for (unsigned i = 0; i < sizeof api / sizeof api[0]; i++) fk_fns[i] = dlsym(h, api[i]);
    return 0;
}
"""

RUNTIME_LOADER_CXX = r"""
#include <dlfcn.h>
#include <string>
void *fk_load(void) {  // onnxruntime's CUDA provider's shape: a std::string built from a literal
    std::string name("libcudnn.so.9");
    void *h = dlopen(name.c_str(), RTLD_NOW);
    return h ? dlsym(h, "cudnnGetVersion") : nullptr;
}
void *fk_create(void *h) { return dlsym(h, "cudnnCreate"); }
"""


def runtime_loader(out: Path, lib: str, api: list[str], cxx: bool = False) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".cpp" if cxx else ".c")
    src.write_text(RUNTIME_LOADER_CXX if cxx else RUNTIME_LOADER % {"lib": lib, "api": ", ".join(f'"{a}"' for a in api)})
    run("g++" if cxx else "gcc", "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl")
    return out


CUDNN_API = ["cudnnCreate", "cudnnGetVersion", "cudnnDestroy"]


@pytest.mark.parametrize("cxx", [False, True], ids=["c-memcpy", "cxx-string"])
def test_cudnn_found_by_dlsym_names_and_its_name_built_from_immediates(tmp_path, cxx):
    lib = runtime_loader(tmp_path / "libprovider.so", "libcudnn.so.9", CUDNN_API, cxx)
    assert b"libcudnn.so" not in lib.read_bytes()  # the name is in no string: only in code
    res = only(audit(lib))
    kinds = {(f.rule, f.kind): f for f in res.findings}
    assert set(kinds) == {("nvidia.cudnn", "dlsym-string"), ("nvidia.cudnn", "assembled-name")}
    api = kinds[("nvidia.cudnn", "dlsym-string")]
    expect = sorted(CUDNN_API[:2]) if cxx else sorted(CUDNN_API)
    assert [api.subject] + api.examples == expect and api.count == len(expect)
    assert "dlsym" in api.detail
    built = kinds[("nvidia.cudnn", "assembled-name")]
    assert built.subject == "libcudnn.so.9" and built.where.startswith(".text @0x") and "(immediates)" in built.where
    assert f"{len(expect)} of its API names are dlsym strings" in built.detail
    assert res.verdict == "fail"


def test_on_aarch64_the_same_name_is_a_string_in_rodata(tmp_path):
    # aarch64 compilers load a short literal from .rodata (adrp/ldr) instead of building it from
    # immediates: the library-name scan finds it there
    gcc = require_tool("aarch64-linux-gnu-gcc")
    src = tmp_path / "provider.c"
    src.write_text(RUNTIME_LOADER % {"lib": "libcudnn.so.9", "api": ", ".join(f'"{a}"' for a in CUDNN_API)})
    lib = tmp_path / "libprovider_a64.so"
    run(gcc, "-shared", "-fPIC", "-O2", "-o", lib, src)
    res = only(audit(lib))
    kinds = {(f.rule, f.kind) for f in res.findings}
    assert ("nvidia.cudnn", "dlopen-string") in kinds and ("nvidia.cudnn", "assembled-name") not in kinds
    assert res.verdict == "fail"


def test_one_api_string_alone_is_not_evidence(tmp_path):
    res = only(audit(runtime_loader(tmp_path / "libone.so", "libfkplugin.so.1", ["cudnnCreate"])))
    assert res.verdict == "pass" and res.findings == []


def test_an_assembled_name_of_no_vendor_passes(tmp_path):
    lib = runtime_loader(tmp_path / "libown.so", "libfkplugin.so.1", ["fk_plugin_init", "fk_plugin_run"])
    res = only(audit(lib))
    assert res.verdict == "pass" and res.findings == []


def test_api_strings_explained_by_imports_are_not_dlsym_evidence(tmp_path):
    cudnn = vendor_lib(tmp_path / "cuda", "libcudnn.so.9", ["cudnnCreate", "cudnnGetVersion"])
    src = RUNTIME_LOADER % {"lib": "libfkplugin.so.1", "api": '"cudnnCreate", "cudnnGetVersion"'}
    src += "extern int cudnnCreate(void);\nint fk_direct(void){return cudnnCreate();}\n"
    user = cc_shared(tmp_path / "libdirect.so", src, f"-L{cudnn.parent}", "-l:libcudnn.so.9", "-ldl")
    res = only(audit(user))
    assert {f.kind for f in res.findings if f.rule == "nvidia.cudnn"} == {"needed", "imported-symbol"}


def test_a_member_found_by_its_soname_when_the_versioned_file_has_no_symlink(tmp_path):
    # a build folder copied without ldconfig's symlinks: lib/libcore.so.1.2.3, SONAME libcore.so.1
    cublas = vendor_lib(tmp_path / "cuda", "libcublas.so.12", ["cublasCreate_v2"])
    core = user_of(tmp_path / "pkg/lib/libcore.so.1", cublas, ["cublasCreate_v2"], "-Wl,-soname,libcore.so.1")
    core = core.rename(tmp_path / "pkg/lib/libcore.so.1.2.3")
    vendor_lib(tmp_path / "pkg/lib", "libcore.so.1.0", ["fk_other"])  # sorts first, another SONAME: not it
    cc_shared(tmp_path / "pkg/bin/libapp.so", "extern int fk_user(void);\nint fk_app(void){return fk_user();}\n",
                     f"-L{tmp_path / 'cuda'}", f"-Wl,{core}", "-Wl,--allow-shlib-undefined")
    res = by_path(audit(tmp_path / "pkg"), "bin/libapp.so")
    node = next(c for c in res.tree.children if c.name == "libcore.so.1")
    assert (node.how, node.path) == ("member", str(core))
    assert [f.chain for f in res.findings if f.kind == "transitive"] == [["libapp.so", "libcore.so.1", "libcublas.so.12"]]

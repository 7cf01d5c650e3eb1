"""A string is loading evidence only where something loads it: gcc/g++ build libraries whose
data holds vendor library and API names as a loader is given them (a whole NUL-terminated
string in a file that imports dlopen/dlsym) and as words of text (help text, a build-information
line, environment-variable names, typeinfo names of a vendor's code compiled in). `check` must
fail on the first, and give the second no loading evidence: a mention is a note (warn) that
quotes the text around it and is no dlopen edge of the tree; an environment variable is no API
name; API names beside the vendor's own C++ types are a static copy."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from conftest import require_tool
from cli_runner import audit, found
from linkage_fixtures import run

from audit.elf.reader import read_elf
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import dlopen_names

# The texts the fixtures hold (gflags help text, an OpenCV-like build-information line).
HELP = "Specify path for loading libcublas.so."
BUILD_INFO = "Extra dependencies: /usr/lib64/libopenblasp.so dl m pthread rt"
HELP_MKLML = "Path of libmklml_intel.so to use for MKL."

PROSE = f"""
#include <dlfcn.h>
const char *help_cublas = "{HELP}";
const char *build_info = "{BUILD_INFO}";
const char *help_mklml = "{HELP_MKLML}";
void *load(void) {{ return dlopen("libcudnn.so.9", RTLD_NOW); }}
"""

NO_LOADER = """
const char *name_only = "libcusolver.so.11";
const char *which(void) { return name_only; }
"""

ENV_NAMES = """
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int threads(void) {
    const char *a = getenv("MKL_NUM_THREADS"), *b = getenv("MKL_DYNAMIC");
    printf("MKL_NUM_THREADS : %s\\n", a ? a : "");
    return (a != 0) + (b != 0);
}
void *api(void *h, int i) { return dlsym(h, i ? "cublasCreate_v2" : "cublasDestroy_v2"); }
"""

# oneDNN-like classes compiled in (hidden, stripped: no symbol names them), and two of its C API
# names as strings handed to dlsym
COMPILED_IN = """
#include <dlfcn.h>
#include <typeinfo>
namespace dnnl { namespace impl {
struct primitive_t { virtual ~primitive_t() {} virtual int kind() const { return 1; } };
struct engine_t : primitive_t { int kind() const override { return 2; } };
} }
extern "C" int run_it(int i) {
    dnnl::impl::primitive_t *p = i ? new dnnl::impl::engine_t : new dnnl::impl::primitive_t;
    int k = p->kind() + (int)typeid(*p).name()[0];
    delete p;
    return k;
}
extern "C" void *api(void *h, int i) { return dlsym(h, i ? "dnnl_engine_create" : "dnnl_stream_create"); }
"""


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    gcc = require_tool("gcc")
    d = tmp_path_factory.mktemp("evidence-strings")
    out = {}
    for name, text, flags in (("prose", PROSE, ["-ldl", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"]),
                              ("noloader", NO_LOADER, []), ("envnames", ENV_NAMES, ["-ldl"])):
        (d / f"{name}.c").write_text(text)
        out[name] = d / f"lib{name}.so"
        run(gcc, "-shared", "-fPIC", "-O1", "-o", out[name], d / f"{name}.c", *flags)
    # a denied library beside the file that mentions it in help text (a RUNPATH $ORIGIN folder)
    (d / "mklml.c").write_text("int mklml_fixture(void) { return 0; }\n")
    run(gcc, "-shared", "-fPIC", "-o", d / "libmklml_intel.so", d / "mklml.c", "-Wl,-soname,libmklml_intel.so")
    return out


@pytest.fixture(scope="module")
def compiled_in(tmp_path_factory) -> Path:
    gxx = require_tool("g++")
    d = tmp_path_factory.mktemp("evidence-compiled-in")
    (d / "engine.cc").write_text(COMPILED_IN)
    out = d / "libengine.so"
    run(gxx, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-s", "-o", out, d / "engine.cc", "-ldl")
    return out


def test_names_inside_text_are_mentions_and_whole_strings_are_names(libs):
    hits = {h.text: h for h in read_elf(libs["prose"]).library_strings}
    data = libs["prose"].read_bytes()
    for text, name in ((HELP, "libcublas.so"), (BUILD_INFO, "libopenblasp.so"), (HELP_MKLML, "libmklml_intel.so")):
        hit = hits[name]
        assert hit.mention, name
        # the offset is the name's own, inside the text the fixture holds
        at = data.index(text.encode())
        assert hit.offset == at + text.index(name)
        assert name in hit.context and hit.context in text or text.startswith(hit.context.strip("."))
    assert not hits["libcudnn.so.9"].mention
    assert hits["libcudnn.so.9"].context == "libcudnn.so.9"


def test_a_mention_is_a_note_that_quotes_the_text(libs):
    res = audit(libs["prose"])
    (cublas,) = found(res, "nvidia.cublas", "dlopen-string")
    assert cublas.severity == "warn"
    assert "mentioned in text" in cublas.detail and HELP in cublas.detail
    (blas,) = [f for f in res.findings if f.subject == "libopenblasp.so"]
    assert blas.severity == "warn" and "Extra dependencies: /usr/lib64/libopenblasp.so dl m" in blas.detail
    # the name handed to dlopen stays a failure
    (cudnn,) = found(res, "nvidia.cudnn", "dlopen-string")
    assert cudnn.severity == "fail" and cudnn.subject == "libcudnn.so.9" and "imports dlopen" in cudnn.detail


def test_a_mention_is_no_dlopen_edge(libs):
    info = read_elf(libs["prose"])
    assert "libmklml_intel.so" not in dlopen_names(info)
    assert "libcudnn.so.9" in dlopen_names(info)
    res = audit(libs["prose"])
    # the denied library lies in the file's RUNPATH folder: reached only through a dlopen edge
    assert not [f for f in res.findings if f.subject == "libmklml_intel.so" and f.severity == "fail"]
    assert not [f for f in res.findings if f.where.startswith("dlopen string of")]
    assert os.path.exists(libs["prose"].parent / "libmklml_intel.so")


def test_a_name_in_a_file_that_imports_no_loader_is_a_note(libs):
    (solver,) = found(audit(libs["noloader"]), "nvidia.cusolver", "dlopen-string")
    assert solver.subject == "libcusolver.so.11"
    assert solver.severity == "warn" and "no code-loading import" in solver.detail


def test_environment_variable_names_are_no_api_names(libs):
    res = audit(libs["envnames"])
    assert found(res, "intel.mkl", "dlsym-string") == []
    assert not [f for f in res.findings if f.rule == "intel.mkl"]
    # the API names it does hand to dlsym are still found
    (cublas,) = found(res, "nvidia.cublas", "dlsym-string")
    assert cublas.matches[0].names == ["cublasCreate_v2", "cublasDestroy_v2"]


def test_api_names_beside_the_vendors_own_types_are_a_static_copy(compiled_in):
    info = read_elf(compiled_in, api_prefixes=policy().api_prefixes)
    assert not [s for s in info.symbols if "dnnl" in s.name]  # stripped, hidden: no symbol says so
    assert {"dnnl_engine_create", "dnnl_stream_create"} <= {h.text for h in info.api_strings}
    res = audit(compiled_in)
    assert found(res, "intel.onednn", "dlsym-string") == []
    (copy,) = found(res, "intel.onednn", "static-symbol")
    # typeinfo names of the two classes the fixture defines (Itanium ABI: N<len>name...E)
    assert copy.matches[0].names == ["N4dnnl4impl11primitive_tE", "N4dnnl4impl8engine_tE"]
    assert "compiled in" in copy.detail and "dnnl_engine_create" in copy.detail

"""A loader that resolves a symbol-list API by name and builds its library's name in code.

PaddlePaddle's libphi_core.so shape, rebuilt with g++ -O2: `dlsym(handle, "cblas_sgemm")` for
CBLAS names (a closed list, policies/cblas.names, not a glob), and the MKL-ML library's name
built as a std::string, which g++ compiles to a 16-byte constant loaded from .rodata
(`movdqa .LC0(%rip),%xmm0`; `vmovdqa` under -mavx), stored into the string's buffer, and a byte
immediate for the 17th character (`movb $0x6f,0x10(%rax)`): the whole name is never in the
data. Both must be found (dlsym-string, assembled-name); a list's near names (`cblas_matrixproduct`,
not CBLAS), an environment-variable name and help text naming the library stay non-evidence.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from conftest import require_tool
from cli_runner import audit, found
from linkage_fixtures import run

from audit.elf.immediates import name_constants
from audit.elf.parse import ElfImage
from audit.elf.reader import read_assembled_names
from audit.linkage.judging.policy import list_prefixes, load_policy

LOADER = r"""
#include <dlfcn.h>
#include <cstdlib>
#include <string>
extern std::string mklml_dir;  // the program's (a flag's value): no string built here but the name
static void *handle;
extern "C" void *mklml_handle() {
    std::string path = mklml_dir + "/" + std::string("libmklml_intel.so");
    return handle = dlopen(path.c_str(), RTLD_NOW);
}
extern "C" void *cblas_fn(int i) {
    return dlsym(handle, i == 0 ? "cblas_sgemm" : i == 1 ? "cblas_dgemm" : "cblas_saxpy");
}
"""

# One CBLAS name only, beside names of the prefix that are not CBLAS, a variable and help text.
NEAR = r"""
#include <dlfcn.h>
#include <cstdlib>
extern "C" const char *help = "Use cblas_sgemm from libmklml_intel.so for GEMM.";
extern "C" void *fn(void *h, int i) {
    if (std::getenv("CBLAS_NUM_THREADS")) return 0;
    return dlsym(h, i == 0 ? "cblas_matrixproduct" : i == 1 ? "cblas_innerproduct" : "cblas_dgemm");
}
"""


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


@pytest.fixture(scope="module", params=["sse", "avx"])
def loader(request, tmp_path_factory) -> Path:
    gxx = require_tool("g++")
    d = tmp_path_factory.mktemp(f"list-loader-{request.param}")
    (d / "loader.cc").write_text(LOADER)
    out = d / "libloader.so"
    run(gxx, "-shared", "-fPIC", "-O2", *(["-mavx"] if request.param == "avx" else []), "-o", out,
        d / "loader.cc", "-ldl")
    return out


@pytest.fixture(scope="module")
def near(tmp_path_factory) -> Path:
    gxx = require_tool("g++")
    d = tmp_path_factory.mktemp("list-near")
    (d / "near.cc").write_text(NEAR)
    out = d / "libnear.so"
    run(gxx, "-shared", "-fPIC", "-O2", "-o", out, d / "near.cc", "-ldl")
    return out


def test_the_fixture_has_the_vector_constant_shape(loader):
    """What the test is about, read by objdump: the name's first 16 bytes are one constant
    loaded RIP-relative into an xmm register, the 17th a byte immediate; the whole name is no
    string in the file."""
    objdump = require_tool("objdump")
    text = run(objdump, "-d", "--no-show-raw-insn", loader)
    assert re.search(r"v?movdq[au]\s+0x[0-9a-f]+\(%rip\),%xmm\d", text)
    assert re.search(r"movb\s+\$0x6f,0x10\(%r[a-z0-9]+\)", text)
    data = loader.read_bytes()
    assert b"libmklml_intel.s" in data and b"libmklml_intel.so" not in data


def test_the_name_built_from_a_vector_constant_is_assembled(loader):
    with open(loader, "rb") as fh:
        constants = name_constants(ElfImage(fh.read()))
    assert b"libmklml_intel.s" in constants.values()
    assert [h.text for h in read_assembled_names(str(loader))] == ["libmklml_intel.so"]
    (built,) = found(audit(loader), "intel.mkl", "assembled-name")
    assert built.subject == "libmklml_intel.so" and built.severity == "fail"


def test_names_of_a_symbol_list_handed_to_dlsym_are_found(loader):
    (resolved,) = found(audit(loader), "blas.cblas", "dlsym-string")
    assert resolved.matches[0].names == ["cblas_dgemm", "cblas_saxpy", "cblas_sgemm"]


def test_near_names_variables_and_help_text_are_no_evidence(near):
    res = audit(near)
    assert found(res, "blas.cblas", "dlsym-string") == []  # one CBLAS name only; the others are not CBLAS
    assert found(res, "intel.mkl", "assembled-name") == []
    assert {f.severity for f in res.findings if f.rule == "intel.mkl"} <= {"warn"}  # the help text: a note


def test_list_prefixes_are_the_namespaces_many_names_share():
    names = [f"cblas_{x}" for x in "abcdefghij"] + ["dgemm_", "sgemm_", "LAPACKE_dgesv", "ab_c"]
    assert list_prefixes(names) == ["cblas_"]
    shipped = policy()
    assert {b"cblas_", b"LAPACKE_", b"scipy_cblas_"} <= set(shipped.api_prefixes)
    assert not [p for p in shipped.api_prefixes if re.fullmatch(rb"[a-z]{1,5}_", p) and p.endswith(b"gemm_")]

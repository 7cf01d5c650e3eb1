"""Implib.so-style lazy trampolines are imports through a loader, not static copies: gcc builds a
hand-written x86-64 shim in that style (a table of pointers in .data, each exported cublasX
doing `cmpq $0, table+8*i(%rip); je 2f; 1: jmp *table+8*i(%rip); 2: push $i; call resolve; ...`,
a resolver that dlopens "libcublas.so.12" and asks dlsym for the names), and beside it a
function of the same opening that jumps through another slot (real code). `check` must report
the trampolines as loaded at run time, naming the table, and keep the other a static symbol."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import run

from audit.elf.reader import read_elf
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

NAMES = ["cublasCreate_v2", "cublasDestroy_v2", "cublasSgemm_v2"]  # the trampolines, in table order

TRAMPOLINES = r"""
  .data
  .globl _cublas_tramp_table
  .hidden _cublas_tramp_table
  .p2align 3
_cublas_tramp_table:
  .zero 32
other_slot:
  .quad 0

  .text
  .globl _cublas_save_regs_and_resolve
  .hidden _cublas_save_regs_and_resolve
  .type _cublas_save_regs_and_resolve, %function
_cublas_save_regs_and_resolve:
  pushq %rdi
  movq 16(%rsp), %rdi
  call _cublas_tramp_resolve
  popq %rdi
  ret

#define TRAMP(sym, off, num) \
  .globl sym; .p2align 4; .type sym, %function; \
sym: \
  cmpq $0, _cublas_tramp_table+off(%rip); \
  je 2f; \
1: \
  jmp *_cublas_tramp_table+off(%rip); \
2: \
  pushq $num; \
  call _cublas_save_regs_and_resolve; \
  addq $8, %rsp; \
  jmp 1b

TRAMP(cublasCreate_v2, 0, 0)
TRAMP(cublasDestroy_v2, 8, 1)
TRAMP(cublasSgemm_v2, 16, 2)

/* the same opening, but the jump leaves through another slot than the one compared: real code */
  .globl cublasGetVersion_v2; .p2align 4; .type cublasGetVersion_v2, %function
cublasGetVersion_v2:
  cmpq $0, _cublas_tramp_table+24(%rip)
  je 2f
1:
  jmp *other_slot(%rip)
2:
  pushq $3
  call _cublas_save_regs_and_resolve
  addq $8, %rsp
  jmp 1b
  .section .note.GNU-stack,"",@progbits
"""

RESOLVER = r"""
#include <dlfcn.h>
#include <stdlib.h>
extern void *_cublas_tramp_table[];
static const char *const sym_names[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSgemm_v2", 0};
static void *handle;
void _cublas_tramp_resolve(int i) {
  if (!handle) handle = dlopen("libcublas.so.12", RTLD_LAZY | RTLD_GLOBAL);
  if (!handle) abort();
  _cublas_tramp_table[i] = dlsym(handle, sym_names[i]);
}
"""


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def build_shim(d: Path, cc: str, trampolines: str = TRAMPOLINES, resolver: str = RESOLVER, *flags: str) -> Path:
    """d/libcublas_shim.so: the trampolines' assembly and their resolver, linked by `cc`."""
    (d / "tramp.S").write_text(trampolines)
    (d / "resolve.c").write_text(resolver)
    out = d / "libcublas_shim.so"
    run(cc, "-shared", "-fPIC", "-O2", *flags, "-o", out, d / "tramp.S", d / "resolve.c", "-ldl")
    return out


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("implib-trampolines"), require_tool("gcc"))


def table_address(path: Path) -> int:
    """_cublas_tramp_table's address, read with pyelftools."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as fh:
        (sym,) = ELFFile(fh).get_section_by_name(".symtab").get_symbol_by_name("_cublas_tramp_table")
        return sym["st_value"]


def test_trampolines_are_forwarders_through_their_table_slot(shim):
    fw = {f.symbol: f for f in read_elf(shim, symbol_pattern=policy().symbol_pattern).forwarders}
    base = table_address(shim)
    for i, name in enumerate(NAMES):
        assert fw[name].via == "trampoline"
        assert fw[name].target == f"_cublas_tramp_table[{i}]"
        assert fw[name].slot == base + 8 * i
    assert "cublasGetVersion_v2" not in fw


def test_check_reports_a_loader_import_naming_the_table(shim):
    (res,) = check_paths([str(shim)], policy(), ResolveOptions()).files
    cublas = [f for f in res.findings if f.rule == "nvidia.cublas"]
    (static,) = [f for f in cublas if f.kind == "static-symbol"]
    assert static.matches[0].names == ["cublasGetVersion_v2"]
    (tramp,) = [f for f in cublas if f.kind == "dlopen-string" and f.detail and "trampoline" in f.detail]
    assert tramp.matches[0].names == NAMES
    assert "_cublas_tramp_table" in tramp.detail and "libcublas.so.12" in tramp.detail

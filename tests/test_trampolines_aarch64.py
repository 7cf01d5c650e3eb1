"""Implib.so-style lazy trampolines on AArch64 are imports through a loader, as on x86-64
(tests/test_trampolines.py): aarch64-linux-gnu-gcc builds a shim in Implib.so's AArch64 shape
(each exported cublasX: `1: adrp x16, table+8*i; ldr x16, [x16, #:lo12:table+8*i]; cbz x16, 2f;
br x16; 2: mov x16, #i; stp x16, lr, [sp, #-16]!; bl resolve; ldp x16, lr, [sp], #16; b 1b`, one
with a large index that needs movk, and one with bti c first), a resolver that dlopens
"libcublas.so.12" and asks dlsym for the names, and two functions of the same opening that are
real code: one leaves through another register than it loaded, one's slow path calls no
resolver. `check` must report the trampolines as loaded at run time, naming the table, and keep
the other two static symbols."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import require_tool
from test_trampolines import build_shim

from audit.elf.reader import read_elf
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

NAMES = {"cublasCreate_v2": 0, "cublasDestroy_v2": 1, "cublasSgemm_v2": 2, "cublasDgemm_v2": 0x12345}
STATIC = ["cublasGetVersion_v2", "cublasSetStream_v2"]

TRAMPOLINES = r"""
  .data
  .globl _cublas_tramp_table
  .hidden _cublas_tramp_table
  .p2align 3
_cublas_tramp_table:
  .zero 8 * 0x12346

  .text
  .globl _cublas_save_regs_and_resolve
  .hidden _cublas_save_regs_and_resolve
  .type _cublas_save_regs_and_resolve, %function
_cublas_save_regs_and_resolve:
  stp x29, x30, [sp, #-16]!
  ldr x0, [sp, #16]
  bl _cublas_tramp_resolve
  ldp x29, x30, [sp], #16
  ret

#define SLOW(num) \
  mov x16, (num) & 0xffff; \
  .if (num) > 0xffff; movk x16, (num) >> 16, lsl #16; .endif; \
  stp x16, x30, [sp, #-16]!; \
  bl _cublas_save_regs_and_resolve; \
  ldp x16, x30, [sp], #16

#define TRAMP(sym, num, first) \
  .globl sym; .p2align 4; .type sym, %function; \
sym: \
  first; \
1: \
  adrp x16, _cublas_tramp_table+8*(num); \
  ldr x16, [x16, #:lo12:_cublas_tramp_table+8*(num)]; \
  cbz x16, 2f; \
  br x16; \
2: \
  SLOW(num); \
  b 1b

TRAMP(cublasCreate_v2, 0, nop)
TRAMP(cublasDestroy_v2, 1, bti c)
TRAMP(cublasSgemm_v2, 2, nop)
TRAMP(cublasDgemm_v2, 0x12345, nop)

/* the same opening, but it leaves through another register than it loaded: real code */
  .globl cublasGetVersion_v2; .p2align 4; .type cublasGetVersion_v2, %function
cublasGetVersion_v2:
1:
  adrp x16, _cublas_tramp_table+24
  ldr x16, [x16, #:lo12:_cublas_tramp_table+24]
  cbz x16, 2f
  br x17
2:
  SLOW(3)
  b 1b

/* the same fast path, but the slow path computes instead of calling a resolver */
  .globl cublasSetStream_v2; .p2align 4; .type cublasSetStream_v2, %function
cublasSetStream_v2:
1:
  adrp x16, _cublas_tramp_table+32
  ldr x16, [x16, #:lo12:_cublas_tramp_table+32]
  cbz x16, 2f
  br x16
2:
  mov x16, #4
  add x0, x0, x16
  ret
  .section .note.GNU-stack,"",@progbits
"""

RESOLVER = r"""
#include <dlfcn.h>
#include <stdlib.h>
extern void *_cublas_tramp_table[];
static void *handle;
void _cublas_tramp_resolve(long i) {
  static const char *const names[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSgemm_v2"};
  if (!handle) handle = dlopen("libcublas.so.12", RTLD_LAZY | RTLD_GLOBAL);
  if (!handle) abort();
  _cublas_tramp_table[i] = dlsym(handle, i < 3 ? names[i] : "cublasDgemm_v2");
}
"""


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("implib-trampolines-aarch64"), require_tool("aarch64-linux-gnu-gcc"),
                      TRAMPOLINES, RESOLVER, "-march=armv8.5-a")


def table_address(path: Path) -> int:
    """_cublas_tramp_table's address, read with pyelftools."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        assert elf["e_machine"] == "EM_AARCH64"
        (sym,) = elf.get_section_by_name(".symtab").get_symbol_by_name("_cublas_tramp_table")
        return sym["st_value"]


def test_trampolines_are_forwarders_through_their_table_slot(shim):
    fw = {f.symbol: f for f in read_elf(shim, symbol_pattern=policy().symbol_pattern).forwarders}
    base = table_address(shim)
    for name, i in NAMES.items():
        assert fw[name].via == "trampoline", name
        assert fw[name].target == f"_cublas_tramp_table[{i}]"
        assert fw[name].slot == base + 8 * i
    assert not set(STATIC) & set(fw)


def test_check_reports_a_loader_import_naming_the_table(shim):
    (res,) = check_paths([str(shim)], policy(), ResolveOptions()).files
    cublas = [f for f in res.findings if f.rule == "nvidia.cublas"]
    (static,) = [f for f in cublas if f.kind == "static-symbol"]
    assert static.matches[0].names == STATIC
    (tramp,) = [f for f in cublas if f.kind == "dlopen-string" and f.detail and "trampoline" in f.detail]
    assert tramp.matches[0].names == sorted(NAMES)
    assert "_cublas_tramp_table" in tramp.detail and "libcublas.so.12" in tramp.detail

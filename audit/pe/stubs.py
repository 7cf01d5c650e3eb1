"""Loader stubs among a PE's exports: exported functions whose code asks GetProcAddress for
their own name once, keeps the pointer and calls through it.

A dispatcher DLL can export a vendor's whole API without holding any of its code: cuDNN's
cudnn64_9.dll defines each cudnn* export as (MSVC, x86-64)

    cmpl   $1, flag(%rip)            ; the sub-libraries loaded?
    ...    _Init_thread_epoch test   ; a function-local static, thread-safe
    movq   slot(%rip), %rax
    testq  %rax, %rax
    ...    (arguments)
    callq  *__guard_dispatch_icall_fptr(%rip)   ; call *%rax under Control Flow Guard
    ...
    leaq   guard(%rip), %rcx
    callq  _Init_thread_header
    leaq   "cudnnActivationForward"(%rip), %rdx  ; its own name
    callq  resolve                   ; LoadLibrary + GetProcAddress through the IAT
    movq   %rax, slot(%rip)
    callq  _Init_thread_footer

Such an export is a run-time load of the library that defines the name (as libcudnn.so.9's
dlsym stubs are, audit/elf/forward.py), not a static copy. An export counts as one when its
body (read from its RVA, at most BODY_MAX bytes and never past the next export):

1. loads the address of a string equal to its own name (lea reg, [rip+d]), and within a few
   bytes after it calls GetProcAddress through its import address table slot, or calls a
   function of this file whose first RESOLVER_MAX bytes do (one jmp thunk followed);
2. stores a register to a slot [rip+d] in writable, non-executable data;
3. calls or jumps through that same slot: through it directly, through a register loaded from
   it (call *%rax), or, under Control Flow Guard, through the load configuration's dispatch
   pointer with the slot loaded into %rax.

A function that only makes an indirect call, or looks up another name, or keeps the pointer
nowhere it calls through, is left as what its export says. x86-64 images only; byte patterns
as in audit/elf/forward.py, not a full decode.
"""

from __future__ import annotations

import bisect
import struct

import numpy as np

from audit.elf.forward import _rip_operands, _through, _x86_strings
from audit.elf.model import Forward

MAX_EXPORTS_READ = 1 << 13  # exports whose code is read per file (the rest stay as exported)
BODY_MAX = 1024  # bytes of one export read (cuDNN's dispatcher: its exports start at most 672 bytes apart)
RESOLVER_MAX = 1024  # bytes of a called function searched for its GetProcAddress call
ARG_WINDOW = 24  # bytes after loading the name's address in which the call that takes it starts
VIA = "GetProcAddress"
SCN_CNT_CODE, SCN_MEM_EXECUTE, SCN_MEM_WRITE = 0x20, 0x20000000, 0x80000000
DIR_EXCEPTION, DIR_LOAD_CONFIG = 3, 10
MAX_FUNCTIONS = 1 << 22  # .pdata entries read (each 12 bytes)
_GUARD_DISPATCH_AT = 120  # IMAGE_LOAD_CONFIG_DIRECTORY64.GuardCFDispatchFunctionPointer
_RAX = 0


class _Image:
    """The section table of one PE image, addressed by virtual address (image base + RVA), and
    where its functions start: the exception directory's (.pdata) entries and the exports."""

    def __init__(self, pe, exports: list[tuple[str, int]]):
        self.buf, self.size, self.base = pe.buf, pe.size, pe.image_base
        self.secs = sorted(((self.base + s.va, s) for s in pe.sections), key=lambda p: p[0])
        self.starts = [va for va, _ in self.secs]
        self.begins = self._pdata(pe)  # RVAs, sorted
        self.exports = np.sort(np.array([r for _, r in exports], dtype=np.int64))

    def _pdata(self, pe) -> np.ndarray:
        """The function starts .pdata lists (RUNTIME_FUNCTION.BeginAddress), read in place."""
        rva, size = pe.dir(DIR_EXCEPTION)
        entries = min(size // 12, MAX_FUNCTIONS)
        hit = self.section(self.base + rva) if rva and entries else None
        if hit is None or self.base + rva + 12 * entries > hit[0] + hit[1].rawsize:
            return np.zeros(0, np.int64)
        at = hit[1].raw + self.base + rva - hit[0]
        if at + 12 * entries > self.size:
            return np.zeros(0, np.int64)
        begins = np.frombuffer(self.buf, dtype="<u4", count=3 * entries, offset=at)[::3].astype(np.int64)
        return begins if bool(np.all(begins[1:] >= begins[:-1])) else np.sort(begins)  # sorted, as the format asks

    def body(self, va: int, limit: int) -> bytes | None:
        """The code of the function at `va`: up to `limit` bytes, never past the next function."""
        rva = va - self.base
        for starts in (self.begins, self.exports):
            k = int(np.searchsorted(starts, rva, side="right"))
            if k < len(starts):
                limit = min(limit, int(starts[k]) - rva)
        return self.code(va, limit)

    def section(self, va: int, loaded: bool = False):
        """(start, section) holding `va` in its stored bytes, or (`loaded`) anywhere in its
        memory image (a .data section's zero-filled tail is not stored)."""
        i = bisect.bisect_right(self.starts, va) - 1
        if i < 0:
            return None
        start, s = self.secs[i]
        return (start, s) if va < start + (max(s.vsize, s.rawsize) if loaded else s.rawsize) else None

    def code(self, va: int, limit: int) -> bytes | None:
        """Up to `limit` stored bytes at `va` in an executable section."""
        hit = self.section(va)
        if hit is None or not hit[1].flags & (SCN_CNT_CODE | SCN_MEM_EXECUTE):
            return None
        start, s = hit
        at = s.raw + va - start
        end = min(s.raw + s.rawsize, self.size, at + limit)
        return bytes(self.buf[at:end]) if at < end else None

    def data(self, va: int, n: int) -> bytes | None:
        hit = self.section(va)
        if hit is None:
            return None
        start, s = hit
        at = s.raw + va - start
        return bytes(self.buf[at:at + n]) if va + n <= start + s.rawsize and at + n <= self.size else None

    def writable(self, va: int) -> bool:
        hit = self.section(va, loaded=True)
        return hit is not None and bool(hit[1].flags & SCN_MEM_WRITE) and not hit[1].flags & SCN_MEM_EXECUTE


def loader_stubs(pe, exports: list[tuple[str, int]], getproc_rvas: set[int]) -> list[Forward]:
    """The exports among `exports` ((name, RVA), code exports the policy kept) that are loader
    stubs; `getproc_rvas`: the import address table slots bound to GetProcAddress."""
    if pe.machine != "IMAGE_FILE_MACHINE_AMD64" or pe.bits != 64 or not getproc_rvas or not exports:
        return []
    img = _Image(pe, exports[:MAX_EXPORTS_READ])
    getproc = {img.base + r for r in getproc_rvas}
    dispatch = _guard_dispatch(pe, img)
    resolvers: dict[int, bool] = {}
    out = []
    for name, rva in exports[:MAX_EXPORTS_READ]:
        va = img.base + rva
        body = img.body(va, BODY_MAX)
        if body is None:
            continue
        slot = _stub_slot(img, body, va, name, getproc, dispatch, resolvers)
        if slot is not None:
            out.append(Forward(symbol=name, target=name, via=VIA, slot=slot))
    return out


def _guard_dispatch(pe, img: _Image) -> int | None:
    """The address of the Control Flow Guard dispatch pointer the load configuration names."""
    rva, size = pe.dir(DIR_LOAD_CONFIG)
    if not rva or size < _GUARD_DISPATCH_AT + 8:
        return None
    raw = img.data(img.base + rva, _GUARD_DISPATCH_AT + 8)
    if raw is None:
        return None
    declared = struct.unpack_from("<I", raw, 0)[0]  # the structure's own size: older ones end before it
    value = struct.unpack_from("<Q", raw, _GUARD_DISPATCH_AT)[0]
    return value if declared >= _GUARD_DISPATCH_AT + 8 and value else None


def _stub_slot(img: _Image, body: bytes, va: int, name: str, getproc: set[int], dispatch: int | None,
               resolvers: dict[int, bool]) -> int | None:
    want = name.encode("utf-8", "surrogateescape") + b"\0"
    # the name first: an export that does not load its own name is no stub (cheap to see)
    own = [end for end, a in _x86_strings(body, va) if img.data(a, len(want)) == want]
    if not own or not any(_resolves(img, body, va, end, getproc, resolvers) for end in own):
        return None
    stored = set().union(*_rip_operands(body, va, (b"\x48\x89", b"\x4c\x89")).values())
    if not stored:
        return None
    loaded = _rip_operands(body, va, (b"\x48\x8b", b"\x4c\x8b"))
    copies = _copies(body)
    via_reg = _indirect_registers(body)
    called = _through(body, va, 0x15, False) | _through(body, va, 0x25, False)
    for _ in range(2):  # the second pass: %rax, where the call goes through the guard's dispatch
        via_reg |= set().union(*(copies.get(r, ()) for r in via_reg))  # movq %r10, %rax; callq *%rax
        called |= set().union(*(loaded.get(r, ()) for r in via_reg))
        if dispatch is None or dispatch not in called or _RAX in via_reg:
            break
        via_reg.add(_RAX)  # the dispatch function jumps to %rax
    for slot in sorted(stored & called):
        if img.writable(slot) and slot not in getproc:
            return slot
    return None


def _indirect_registers(body: bytes) -> set[int]:
    """Registers of the call *reg / jmp *reg patterns of a body (ff d0+r / ff e0+r; a REX prefix
    with its B bit, 41 or 49, names r8-r15)."""
    regs = set()
    i = body.find(b"\xff")
    while 0 <= i < len(body) - 1:
        if body[i + 1] & 0xF8 in (0xD0, 0xE0):
            rex = body[i - 1] if i else 0
            regs.add((body[i + 1] & 7) + (8 if 0x40 <= rex <= 0x4F and rex & 1 else 0))
        i = body.find(b"\xff", i + 1)
    return regs


def _copies(body: bytes) -> dict[int, set[int]]:
    """destination register -> source registers of the 64-bit register moves of a body (REX.W
    8b or 89 with mod 11: movq %r10, %rax is 49 8b c2 or 4c 89 d0)."""
    out: dict[int, set[int]] = {}
    for rex in range(0x48, 0x50):
        for op in (0x8B, 0x89):
            pat = bytes([rex, op])
            i = body.find(pat)
            while 0 <= i <= len(body) - 3:
                modrm = body[i + 2]
                if modrm >= 0xC0:
                    reg, rm = (modrm >> 3 & 7) + (8 if rex & 4 else 0), (modrm & 7) + (8 if rex & 1 else 0)
                    dst, src = (reg, rm) if op == 0x8B else (rm, reg)
                    out.setdefault(dst, set()).add(src)
                i = body.find(pat, i + 1)
    return out


def _resolves(img: _Image, body: bytes, va: int, at: int, getproc: set[int], resolvers: dict[int, bool]) -> bool:
    """True if the first call after body[at] (loading the name's address), within ARG_WINDOW
    bytes, reaches GetProcAddress: through its IAT slot, or by calling a function of this file
    that calls it so. A call is a call rel32 into code or a call through a slot of the image."""
    for i in range(at, min(at + ARG_WINDOW, len(body) - 5)):
        if body[i] == 0xFF and body[i + 1] == 0x15 and i + 6 <= len(body):
            slot = va + i + 6 + struct.unpack_from("<i", body, i + 2)[0]
            if img.section(slot, loaded=True) is not None:
                return slot in getproc
        elif body[i] == 0xE8:
            target = va + i + 5 + struct.unpack_from("<i", body, i + 1)[0]
            if img.code(target, 1) is not None:
                if target not in resolvers:
                    resolvers[target] = _calls_getproc(img, target, getproc)
                return resolvers[target]
    return False


def _calls_getproc(img: _Image, va: int, getproc: set[int]) -> bool:
    code = img.body(va, RESOLVER_MAX)
    if code is not None and code[:1] == b"\xe9" and len(code) >= 5:  # an incremental-link jmp thunk
        va = va + 5 + struct.unpack_from("<i", code, 1)[0]
        code = img.body(va, RESOLVER_MAX)
    if code is None:
        return False
    return not getproc.isdisjoint(_through(code, va, 0x15, False) | _through(code, va, 0x25, False))

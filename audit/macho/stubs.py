"""Mach-O forwarding stubs: defined functions whose code only passes the call on to an import.

scipy's macOS extensions define the Fortran BLAS/LAPACK names as local thunks: `_dgetrf_` is one
arm64 `b` to the symbol stub of `_dgetrf$NEWLAPACK` (Accelerate's entry point), `_dgemm_` moves
its stack arguments first. Such a definition holds no vendor code; it is the import, reached
through a stub. This module reads, for the defined names the reader kept (those the policy's
filter selected), the first instructions of each and reports the ones that forward, as the ELF
reader does for PLT thunks (audit/elf/forward.py):

- the symbol stubs: each `S_SYMBOL_STUBS` section (`__TEXT,__stubs`, `__auth_stubs`) is an array
  of stubs of `reserved2` bytes, stub k binding the import named by entry `reserved1 + k` of the
  indirect symbol table (LC_DYSYMTAB), itself an index into the symbol table;
- arm64: after an optional `bti c` or `nop`, at most MAX_INSNS instructions that only move
  arguments (`mov` between registers; loads and stores at a fixed offset from `sp`, no
  write-back: `ldr`/`str`, `ldur`/`stur`, `ldp`/`stp`), then a `b` to a stub (or to another such function of the file, followed at most
  MAX_HOPS times);
- x86_64: after an optional `endbr64` and an empty frame (`push %rbp; mov %rsp, %rbp; pop %rbp`,
  which clang keeps by default), a `jmp` (rel32 or rel8) to a stub.

Anything else (a call, a computation, a branch elsewhere, a loop) is not a stub: the name stays
a definition. Every definition of a name must forward for it to count. Reads only the load
commands, the symbol, string and indirect tables and a few bytes of code per name; every offset
is checked against the slice, every walk is bounded. Raises ValueError / struct.error on a
malformed table (the reader turns them into InputError).
"""

from __future__ import annotations

import struct

from audit.elf.model import Forward
from audit.macho.sections import ZEROFILL_TYPES, section_headers

LC_SEGMENT, LC_SYMTAB, LC_DYSYMTAB, LC_SEGMENT_64 = 0x1, 0x2, 0xB, 0x19
CPU_X86_64, CPU_ARM64 = 0x01000007, 0x0100000C
S_SYMBOL_STUBS = 0x8
INDIRECT_SYMBOL_LOCAL, INDIRECT_SYMBOL_ABS = 0x80000000, 0x40000000
N_STAB, N_TYPE, N_SECT = 0xE0, 0x0E, 0xE
MAX_INSNS = 32  # instructions read per function before its branch (scipy's LAPACK thunks: up to ~20 moves)
MAX_HOPS = 2  # branches to another function of the file followed
MAX_NAMES = 1 << 16  # defined names looked at in one slice
MAX_INDIRECT = 1 << 24

_BTI_C, _NOP, _PACIBSP = 0xD503245F, 0xD503201F, 0xD503237F
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_EMPTY_FRAME = b"\x55\x48\x89\xe5\x5d"  # pushq %rbp; movq %rsp, %rbp; popq %rbp (clang's frame pointer)


def read_forwarders(buf, base: int, size: int, names) -> list[Forward]:
    """Forwards of the slice at `base` (`size` bytes) for the defined C names `names` (without
    the leading "_"), sorted by name. [] for another architecture, or without stubs."""
    wanted = set(names)
    if not wanted:
        return []
    img = _Image(buf, base, size)
    if img.cpu not in (CPU_ARM64, CPU_X86_64) or not img.stubs or img.symtab is None:
        return []
    addrs = img.defined_addresses(wanted)
    out = []
    for name in sorted(addrs)[:MAX_NAMES]:
        targets = {img.forwards_to(a) for a in addrs[name]}
        if len(targets) == 1 and None not in targets:
            target, stub = targets.pop()
            out.append(Forward(symbol=name, target=target, via="stub", slot=stub))
    return out


class _Image:
    def __init__(self, buf, base: int, size: int):
        self.buf, self.base, self.size = buf, base, size
        if size < 32:
            raise ValueError("too short for a Mach-O header")
        self.e = e = "<" if struct.unpack_from("<I", buf, base)[0] in (0xFEEDFACE, 0xFEEDFACF) else ">"
        magic, cpu, _sub, _ft, ncmds, sizeofcmds, _flags = struct.unpack_from(e + "IiiIIII", buf, base)
        self.cpu, self.bits = cpu & 0xFFFFFFFF, 64 if magic == 0xFEEDFACF else 32
        hdr = 32 if self.bits == 64 else 28
        if hdr + sizeofcmds > size:
            raise ValueError("load commands run past the slice")
        self.sections: list[tuple[int, int, int]] = []  # (addr, size, file offset) of code/data
        self.stubs: list[tuple[int, int, int, int]] = []  # (addr, size, stub size, first indirect)
        self.symtab = self.indirect = None
        pos, end = base + hdr, base + hdr + sizeofcmds
        for _ in range(ncmds):
            if pos + 8 > end:
                raise ValueError("load command runs past the load commands")
            cmd, cmdsize = struct.unpack_from(e + "II", buf, pos)
            if cmdsize < 8 or pos + cmdsize > end:
                raise ValueError(f"load command {cmd:#x} has size {cmdsize}")
            if cmd in (LC_SEGMENT, LC_SEGMENT_64):
                self._segment(pos, cmdsize, cmd == LC_SEGMENT_64)
            elif cmd == LC_SYMTAB and cmdsize >= 24:
                self.symtab = struct.unpack_from(e + "IIII", buf, pos + 8)
            elif cmd == LC_DYSYMTAB and cmdsize >= 80:
                self.indirect = struct.unpack_from(e + "II", buf, pos + 56)
            pos += cmdsize
        if self.indirect is None:
            self.stubs = []

    def _segment(self, pos: int, cmdsize: int, is64: bool) -> None:
        for f in section_headers(self.buf, self.e, pos, cmdsize, is64):
            addr, size, offset, flags, res1, res2 = f[2], f[3], f[4], f[8], f[9], f[10]
            if not size or not offset or flags & 0xFF in ZEROFILL_TYPES:  # no bytes in the file
                continue
            if offset + size > self.size:
                raise ValueError(f"section at {offset:#x}+{size:#x} lies outside the slice")
            self.sections.append((addr, size, offset))
            if flags & 0xFF == S_SYMBOL_STUBS and res2:
                self.stubs.append((addr, size, res2, res1))

    def _entry(self, index: int) -> tuple[int, int, int]:
        """(n_type, n_value, n_strx) of symbol `index`."""
        symoff, nsyms, _stroff, _strsize = self.symtab
        if index >= nsyms:
            raise ValueError(f"indirect symbol {index} past the {nsyms}-entry symbol table")
        entry = 16 if self.bits == 64 else 12
        at = symoff + entry * index
        if at + entry > self.size:
            raise ValueError("symbol table lies outside the slice")
        if self.bits == 64:
            strx, ntype, _s, _d, value = struct.unpack_from(self.e + "IBBHQ", self.buf, self.base + at)
        else:
            strx, ntype, _s, _d, value = struct.unpack_from(self.e + "IBBHI", self.buf, self.base + at)
        return ntype, value, strx

    def _name(self, strx: int) -> str | None:
        _symoff, _nsyms, stroff, strsize = self.symtab
        if not 0 < strx < strsize or stroff + strsize > self.size:
            return None
        start = self.base + stroff + strx
        stop = self.buf.find(b"\0", start, self.base + stroff + strsize)
        if stop < 0:
            return None
        raw = bytes(self.buf[start:stop]).decode("utf-8", "surrogateescape")
        return raw[1:] if raw.startswith("_") else raw

    def defined_addresses(self, wanted: set[str]) -> dict[str, list[int]]:
        """name -> the addresses of its definitions (N_SECT entries), for the names wanted."""
        symoff, nsyms, stroff, strsize = self.symtab
        entry = 16 if self.bits == 64 else 12
        if symoff + entry * nsyms > self.size or stroff + strsize > self.size:
            raise ValueError("symbol table lies outside the slice")
        fmt = self.e + ("IBBHQ" if self.bits == 64 else "IBBHI")
        raw = self.buf[self.base + symoff:self.base + symoff + entry * nsyms]
        out: dict[str, list[int]] = {}
        for strx, ntype, _sect, _desc, value in struct.iter_unpack(fmt, raw):
            if ntype & N_STAB or ntype & N_TYPE != N_SECT:
                continue
            name = self._name(strx)
            if name in wanted:
                out.setdefault(name, []).append(value)
        return out

    def stub_target(self, addr: int) -> str | None:
        """The import the symbol stub at `addr` binds, or None if `addr` is not a stub's start."""
        ind_off, n_ind = self.indirect
        if n_ind > MAX_INDIRECT or ind_off + 4 * n_ind > self.size:
            raise ValueError(f"indirect symbol table of {n_ind} entries lies outside the slice")
        for start, size, each, first in self.stubs:
            if start <= addr < start + size:
                k, rest = divmod(addr - start, each)
                if rest or first + k >= n_ind:
                    return None
                index = struct.unpack_from(self.e + "I", self.buf, self.base + ind_off + 4 * (first + k))[0]
                if index & (INDIRECT_SYMBOL_LOCAL | INDIRECT_SYMBOL_ABS):
                    return None
                ntype, _value, strx = self._entry(index)
                return self._name(strx) if ntype & N_TYPE == 0 else None  # N_UNDF: an import
        return None

    def _code(self, addr: int, length: int) -> bytes:
        for start, size, offset in self.sections:
            if start <= addr < start + size:
                n = min(length, start + size - addr)
                at = self.base + offset + (addr - start)
                return bytes(self.buf[at:at + n])
        return b""

    def forwards_to(self, addr: int, hops: int = MAX_HOPS) -> tuple[str, int] | None:
        """(import, stub address) the function at `addr` forwards to, or None."""
        nxt = self._arm64(addr) if self.cpu == CPU_ARM64 else self._x86_64(addr)
        if nxt is None:
            return None
        target = self.stub_target(nxt)
        if target is not None:
            return target, nxt
        if hops and not any(s <= nxt < s + n for s, n, _e, _f in self.stubs):
            return self.forwards_to(nxt, hops - 1)
        return None

    def _arm64(self, addr: int) -> int | None:
        """The destination of the `b` that ends an argument-moving prologue at `addr`, or None."""
        code = self._code(addr, 4 * (MAX_INSNS + 1))
        for k in range(len(code) // 4):
            insn = struct.unpack_from("<I", code, 4 * k)[0]
            if insn & 0xFC000000 == 0x14000000:  # b imm26
                imm = insn & 0x03FFFFFF
                if imm & 0x02000000:
                    imm -= 1 << 26
                return addr + 4 * k + 4 * imm
            if k == 0 and insn in (_BTI_C, _NOP, _PACIBSP):
                continue
            if not _moves_arguments(insn):
                return None
        return None

    def _x86_64(self, addr: int) -> int | None:
        code = self._code(addr, 14)
        at = 4 if code.startswith(_ENDBR64) else 0
        if code[at:at + 5] == _EMPTY_FRAME:
            at += 5
        if code[at:at + 1] == b"\xe9" and len(code) >= at + 5:
            return addr + at + 5 + struct.unpack_from("<i", code, at + 1)[0]
        if code[at:at + 1] == b"\xeb" and len(code) >= at + 2:
            return addr + at + 2 + struct.unpack_from("<b", code, at + 1)[0]
        return None


def _moves_arguments(insn: int) -> bool:
    """An arm64 instruction that only moves a value: `mov` between registers (ORR with the zero
    register), or a load or store at a fixed offset from `sp` without write-back (scaled,
    unscaled) (one register, or a pair; general or SIMD registers)."""
    if insn & 0x7FE0FFE0 == 0x2A0003E0:  # mov wd/xd, wm/xm (orr, shift 0)
        return True
    rn = insn >> 5 & 0x1F
    if rn != 31:
        return False
    if insn & 0x3B000000 == 0x39000000:  # ldr/str (unsigned offset), any size, general or SIMD
        return True
    if insn & 0x3B200C00 == 0x38000000:  # ldur/stur (unscaled signed offset)
        return True
    if insn & 0x3A000000 == 0x28000000 and insn >> 23 & 0x3 == 0x2:  # ldp/stp (signed offset)
        return True
    return False

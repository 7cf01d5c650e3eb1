"""Forwarding stubs: defined functions whose code only passes the call on.

A file can define a vendor API name without containing the vendor's code: scipy defines
`dgemm_` as one `jmp scipy_dgemm_@plt`, and a lazy loader defines `cublasCreate_v2` as a stub
that asks dlsym for "cublasCreate_v2" once and jumps through the pointer it kept. Such a
definition is an import (or a run-time load), not a static copy. This module reads the first
instructions of the defined symbols the policy kept (x86-64 and AArch64) and says where each
one forwards to:

- "plt": a (tail) jump or call to a PLT entry, whose GOT slot's relocation names the import;
- "got": a jump or call through a GOT slot whose relocation names an undefined symbol;
- "dlsym": a tail jump through a writable slot (no relocation binds it to a symbol) that the
  same body also stores to, in a body of at most 1 KiB that loads the address of a string equal
  to the function's own name (the name handed to dlsym), in a file that imports dlsym or dlvsym.
  A function that calls through a pointer and goes on (logging its own name, say) is not one;
  on x86-64 a wrapper is: a body that hands its own name straight to dlsym (its PLT entry or
  GOT slot), stores the result and calls through it.

- "trampoline": an Implib.so-style lazy trampoline, x86-64 `cmpq $0, table+8*i(%rip); je 2f;
  1: jmp *table+8*i(%rip); 2: push $i; call resolve; ...`, AArch64 `1: adrp x16, table+8*i;
  ldr x16, [x16, #:lo12:table+8*i]; cbz x16, 2f; br x16; 2: mov x16, #i; (movk;) stp x16, lr,
  [sp, #-16]!; bl resolve; ...`: the slot is one of a table of
  pointers in writable data that no relocation binds, filled on the first call by a resolver
  that dlopens the library and asks dlsym for the name (JAX/XLA's CUDA plugins define all of
  cuBLAS so, needing only libc and libdl). The target is the table's slot (`table[i]`), named by
  .symtab where it names the table.

A jump to code defined in this file is followed (two hops at most); if it ends in real code,
the symbol is not a forwarder. Only short, fixed instruction shapes are recognised: a body that
does anything else (moves arguments, computes) is left as what the symbol table says.
Candidates are screened in bulk with numpy on their first bytes; only those whose first
instruction can forward are decoded one by one.
"""

from __future__ import annotations

import bisect
import re
import struct
from itertools import compress

import numpy as np

from audit.elf.membership import isin
from audit.elf.model import Forward
from audit.elf.parse import (SHF_ALLOC, SHF_EXECINSTR, SHF_WRITE, SHN_LORESERVE, SHN_UNDEF, SHT_NOBITS, ElfImage,
                             release)
from audit.elf.symbols import SymbolTable, names_at

EM_X86_64, EM_AARCH64 = 62, 183
_DLSYM_NAMES = re.compile(rb"dlv?sym\x00")
ET_EXEC, ET_DYN = 2, 3
SHT_RELA = 4
_STT_CODE = {0, 2, 10}  # NOTYPE (hand-written assembly), FUNC, GNU_IFUNC
_HEAD = 32  # bytes read per candidate: the longest shape below fits
_THUNK_MAX = 24  # a jump thunk's st_size is at most this (0: unsized, hand-written assembly)
_CALL_STUB_MAX = 32  # a call-and-return stub has a body this small (st_size)
_DLSYM_BODY_MAX = 1024  # bodies searched for the lazy dlsym shape (whole, up to this size)
_ARG_WINDOW = 24  # bytes after loading a name's address in which the call that takes it must start
_WINDOW = 1 << 23  # bytes of the file whose function bodies are screened (and released) at a time
_HOPS = 2  # jumps to code in this file that are followed
_TRAMP_MAX = 64  # an Implib.so trampoline's st_size is at most this (0: unsized, as it is generated)
_TRAMP_READ = 40  # bytes read of one: endbr64, cmpq, je, jmp, push, call (AArch64: bti c, adrp,
# ldr, cbz, br, mov, movk, stp, bl: 36)
SHT_SYMTAB = 2

# x86-64 encodings
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
# AArch64 encodings (little-endian words)
_A64_SKIP = {0xD503245F, 0xD503233F, 0xD503201F}  # bti c, paciasp, nop
_A64_FRAME_PUSH = 0xA9BF7BFD  # stp x29, x30, [sp, #-16]!
_A64_FRAME_SET = 0x910003FD  # mov x29, sp
_A64_FRAME_POP = 0xA8C17BFD  # ldp x29, x30, [sp], #16
_A64_RET = 0xD65F03C0
_A64_AUTIASP = 0xD50323BF


def read_forwarders(img: ElfImage, dynsym: SymbolTable | None,
                    picks: list[tuple[np.ndarray, list[str]]], imports_dlsym: bool) -> list[Forward]:
    """Forwarders among the defined symbols in `picks` ((symbol-table entries, their names));
    `dynsym` is the table the dynamic relocations index."""
    if img.e_machine not in (EM_X86_64, EM_AARCH64) or img.e_type not in (ET_EXEC, ET_DYN) or img.bits != 64 \
            or img.endian != "little" or not img.sections:
        return []
    try:
        return _forwarders(img, dynsym, picks, imports_dlsym)
    finally:  # the code and relocations read here leave the resident set (see parse.release)
        for sec in img.sections:
            if sec.flags & SHF_EXECINSTR or sec.type == SHT_RELA:
                release(img.buf, sec.offset, sec.offset + sec.size)


def _forwarders(img: ElfImage, dynsym: SymbolTable | None, picks: list[tuple[np.ndarray, list[str]]],
                imports_dlsym: bool) -> list[Forward]:
    ctx = _Context(img, dynsym)
    names: list[str] = []
    parts = []
    for sub, kept in picks:
        if len(sub) == 0:
            continue
        code = ((sub["st_shndx"] != SHN_UNDEF) & (sub["st_shndx"] < SHN_LORESERVE)
                & np.isin(sub["st_info"] & 0xF, list(_STT_CODE)) & (sub["st_value"] != 0))
        parts.append(sub[code])
        names += compress(kept, code.tolist())
    if not names:
        return []
    sub = np.concatenate([p[["st_shndx", "st_value", "st_size"]].astype(
        [("st_shndx", "<i8"), ("st_value", "<i8"), ("st_size", "<i8")]) for p in parts])
    # one decode per address: .dynsym and .symtab (and aliases) name the same code
    value, first, where = _unique(sub["st_value"])
    size = np.zeros(len(value), dtype=np.int64)
    np.maximum.at(size, where, sub["st_size"])
    offs = ctx.file_offsets(sub["st_shndx"][first], value)
    jumps, lazy = ctx.screen(offs, value, size, imports_dlsym)
    fwd = {u: ctx.forward(int(value[u]), 0) for u in np.flatnonzero(jumps).tolist()}
    fwd = {u: fw for u, fw in fwd.items() if fw is not None}
    hit = np.zeros(len(value), dtype=bool)
    hit[list(fwd)] = True
    hit |= lazy
    per_name = hit[where]
    # a name defined more than once counts as a forwarder only if every definition is one (only
    # the few names with a forwarding definition are ever looked up: the set holds just those)
    hits = set(compress(names, per_name.tolist()))
    plain = set(filter(hits.__contains__, compress(names, (~per_name).tolist())))
    found: dict[str, Forward] = {}
    for i in np.flatnonzero(per_name).tolist():
        name, u = names[i], int(where[i])
        if name in plain:
            continue
        fw = fwd.get(u)
        if fw is None and lazy[u]:  # the dlsym shape depends on the name
            fw = ctx.dlsym_stub(int(value[u]), int(size[u]), name)
        if fw is None:
            plain.add(name)
            found.pop(name, None)
        elif name not in found:
            found[name] = Forward(name, *fw)
    return sorted(found.values(), key=lambda f: f.symbol)


def _unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """np.unique(values, return_index=True, return_inverse=True) from a stable argsort: the
    same three arrays, without np.unique's import of numpy.ma (~7 ms, in every run)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.ones(len(ordered), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    where = np.empty(len(values), dtype=np.intp)
    where[order] = np.cumsum(new) - 1
    return ordered[new], order[new], where


class _Context:
    """Per-file lookups: sections by address, and the dynamic relocations (read on first use)."""

    def __init__(self, img: ElfImage, dynsym: SymbolTable | None):
        self.img = img
        self.x86 = img.e_machine == EM_X86_64
        self._dynsym = dynsym
        secs = sorted((s for s in img.sections if s.flags & SHF_ALLOC and s.size and s.addr), key=lambda s: s.addr)
        self.secs = secs
        self.starts = [s.addr for s in secs]
        self._relocs: tuple[np.ndarray, np.ndarray] | None = None
        self._dlsym_plt: set[int] | None = None
        self._symtab: dict[int, str] | None = None
        self.u8 = np.frombuffer(img.buf, dtype=np.uint8)

    # -- screening, in bulk --------------------------------------------------------------
    def file_offsets(self, shndx: np.ndarray, value: np.ndarray) -> np.ndarray:
        """File offset of each address's code (-1 where it is not inside an executable section)."""
        secs = self.img.sections
        addr = np.array([s.addr for s in secs], dtype=np.int64)
        off = np.array([s.offset for s in secs], dtype=np.int64)
        size = np.array([s.size for s in secs], dtype=np.int64)
        code = np.array([bool(s.flags & SHF_EXECINSTR) and s.type != SHT_NOBITS
                         and s.offset + s.size <= self.img.size for s in secs])
        ok = (shndx >= 0) & (shndx < len(secs))
        k = np.where(ok, shndx, 0)
        inside = ok & code[k] & (value >= addr[k]) & (value < addr[k] + size[k])
        return np.where(inside, off[k] + value - addr[k], -1)

    def screen(self, offs: np.ndarray, value: np.ndarray, size: np.ndarray,
               lazy: bool) -> tuple[np.ndarray, np.ndarray]:
        """(screen_jumps, screen_lazy if `lazy`) in one pass over the code in file order, a window
        at a time, each window's pages released after it: the candidates' first bytes are spread
        over the whole of the code, and read in one go they kept most of it mapped (libtorch_cpu:
        ~120 MB)."""
        jumps = np.zeros(len(offs), dtype=bool)
        lazies = np.zeros(len(offs), dtype=bool)
        grid = np.arange(0, self.img.size + _WINDOW, _WINDOW)
        j = np.flatnonzero(offs >= 0)
        j = j[np.argsort(offs[j], kind="stable")]
        jcut = np.searchsorted(offs[j], grid).tolist()
        if lazy:  # bodies searched for the dlsym shape, in file order
            r = np.flatnonzero((offs >= 0) & (size > 0) & (size <= _DLSYM_BODY_MAX) & (offs + size <= self.img.size))
            r = r[np.argsort(offs[r], kind="stable")]
            rcut = np.searchsorted(offs[r], grid).tolist()
            data = [(s.addr, s.addr + s.size) for s in self.secs
                    if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR and not s.name.startswith(".got")]
            lo = np.array([a for a, _ in data], dtype=np.int64)
            hi = np.array([b for _, b in data], dtype=np.int64)
        for k in range(len(grid) - 1):
            w = j[jcut[k]:jcut[k + 1]]
            spans = []
            if len(w):
                jumps[w] = self.screen_jumps(offs[w], size[w])
                spans.append((int(offs[w[0]]), int(offs[w[-1]]) + max(_HEAD, _CALL_STUB_MAX)))
            if lazy and rcut[k] < rcut[k + 1]:
                w = r[rcut[k]:rcut[k + 1]]
                lazies[w] = self._lazy_window(offs[w], value[w], size[w], lo, hi)
                spans.append((int(offs[w[0]]), int(offs[w[-1]] + size[w[-1]])))
            if spans:
                release(self.img.buf, min(a for a, _ in spans), max(b for _, b in spans))
        return jumps, lazies

    def screen_jumps(self, offs: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Addresses whose first instruction can forward: a jump, or (a tiny body that ends in
        ret and holds a call opcode) a call."""
        mask = np.zeros(len(offs), dtype=bool)
        # a thunk is one jump (after endbr64/bti): a few bytes, or no size at all (assembly)
        r = np.flatnonzero((offs >= 0) & (offs + _HEAD <= self.img.size) & (size <= _THUNK_MAX))
        if not len(r):
            return mask
        head = self.u8[offs[r][:, None] + np.arange(8)]
        if self.x86:
            i = np.arange(len(r))
            skip = np.where((head[:, 0] == 0xF3) & (head[:, 1] == 0x0F) & (head[:, 2] == 0x1E)
                            & (head[:, 3] == 0xFA), 4, 0)
            b0 = head[i, skip]
            op = np.where(b0 == 0xF2, head[i, skip + 1], b0)  # bnd prefix
            modrm = np.where(b0 == 0xF2, head[i, skip + 2], head[i, skip + 1])
            tail = (op == 0xE9) | (op == 0xEB) | ((op == 0xFF) & (modrm == 0x25))
        else:
            words = np.ascontiguousarray(head).view("<u4")
            w = np.where(np.isin(words[:, 0], list(_A64_SKIP)), words[:, 1], words[:, 0])
            tail = ((w & 0xFC000000) == 0x14000000) | ((w & 0x9F000000) == 0x90000000)
        small = np.flatnonzero((offs >= 0) & (offs + _HEAD <= self.img.size) & (size >= 8) & (size <= _CALL_STUB_MAX))
        if len(small):  # the call form: look at the whole (tiny) body
            body = self.u8[offs[small][:, None] + np.arange(_CALL_STUB_MAX)]
            valid = np.arange(_CALL_STUB_MAX)[None, :] < size[small][:, None]
            last = body[np.arange(len(small)), size[small] - 1]
            if self.x86:
                call = ((body == 0xE8) | ((body == 0xFF) & (np.roll(body, -1, axis=1) == 0x15))) & valid
                ok = (last == 0xC3) & call.any(axis=1)
            else:
                words = np.ascontiguousarray(body).view("<u4")
                lastw = words[np.arange(len(small)), size[small] // 4 - 1]
                ok = (lastw == _A64_RET) & ((words & 0xFC000000) == 0x94000000).any(axis=1)
            mask[small[ok]] = True
        mask[r] |= tail
        if self.x86:  # an Implib.so trampoline: cmpq $0, d(%rip) (48 83 3d d32 00), then je
            t = np.flatnonzero((offs >= 0) & (offs + _TRAMP_READ <= self.img.size) & (size <= _TRAMP_MAX))
            if len(t):
                head = self.u8[offs[t][:, None] + np.arange(14)]
                i = np.arange(len(t))
                skip = np.where((head[:, 0] == 0xF3) & (head[:, 1] == 0x0F) & (head[:, 2] == 0x1E)
                                & (head[:, 3] == 0xFA), 4, 0)
                ok = ((head[i, skip] == 0x48) & (head[i, skip + 1] == 0x83) & (head[i, skip + 2] == 0x3D)
                      & (head[i, skip + 7] == 0) & ((head[i, skip + 8] == 0x74) | (head[i, skip + 8] == 0x0F)))
                mask[t[ok]] = True
        else:  # an Implib.so trampoline: adrp xN; ldr xN, [xN, #lo12]; cbz xN (after bti c)
            t = np.flatnonzero((offs >= 0) & (offs + _TRAMP_READ <= self.img.size) & (size <= _TRAMP_MAX))
            if len(t):
                words = np.ascontiguousarray(self.u8[offs[t][:, None] + np.arange(16)]).view("<u4")
                i = np.arange(len(t))
                skip = np.isin(words[:, 0], list(_A64_SKIP)).astype(np.int64)
                ok = (((words[i, skip] & 0x9F000000) == 0x90000000)
                      & ((words[i, skip + 1] & 0xFFC00000) == 0xF9400000)
                      & ((words[i, skip + 2] & 0xFF000000) == 0xB4000000))
                mask[t[ok]] = True
        return mask

    def _lazy_window(self, offs, value, size, lo, hi) -> np.ndarray:
        """Which of these (small) bodies jump through a writable data slot that is not a GOT
        entry, or load one and jump to a register: the shape of a stub that leaves through a
        pointer it filled in itself (the fill and the name are checked when decoding)."""
        n = size if self.x86 else size // 4 * 4
        start = np.concatenate(([0], np.cumsum(n)[:-1]))
        u8 = self.u8
        blob = np.concatenate([u8[o:o + k] for o, k in zip(offs.tolist(), n.tolist())])
        mask = np.zeros(len(offs), dtype=bool)
        if self.x86:
            ends, disps = [], []  # where each slot-naming instruction ends, and its displacement
            # both jumps below start with ff: its positions are found once, in one pass
            last = len(blob)
            ff = np.flatnonzero(blob == 0xFF)
            ff = ff[ff < last - 1]
            after = blob[ff + 1]
            # jmp *disp32(%rip): ff 25 disp32
            pos = ff[(after == 0x25) & (ff < last - 5)]
            ends.append(pos + 6)
            disps.append(_disp32(blob, pos + 2))
            # mov reg, disp32(%rip) (REX.W 8b, mod 00 rm 101), in a body that jumps to a register
            by_reg = np.zeros(len(offs), dtype=bool)
            by_reg[_row(start, ff[(after & 0xF8) == 0xE0])] = True
            pos = np.zeros(0, dtype=np.int64)
            if by_reg.any():
                pos = np.flatnonzero(blob[1:-5] == 0x8B)  # the opcode: rarer than the REX.W byte
                rex = blob[pos]
                pos = pos[((rex == 0x48) | (rex == 0x4C)) & ((blob[pos + 2] & 0xC7) == 0x05)]
                pos = pos[by_reg[_row(start, pos)]]
            ends.append(pos + 7)
            disps.append(_disp32(blob, pos + 3))
            end, disp = np.concatenate(ends), np.concatenate(disps)
            row = _row(start, end - 1)
            inside = end <= start[row] + n[row]  # the instruction lies inside one body
            row, slot = row[inside], (value[row] + end - start[row] + disp)[inside]
            if len(lo) and len(row):
                k = np.clip(np.searchsorted(lo, slot, side="right") - 1, 0, None)
                mask[row[(slot >= lo[k]) & (slot < hi[k])]] = True
            # a wrapper that calls dlsym itself (call rel32 to dlsym's PLT entry)
            entries = self.dlsym_entries()
            if entries:
                pos = np.flatnonzero(blob[:-4] == 0xE8)
                row = _row(start, pos)
                target = value[row] + pos - start[row] + 5 + _disp32(blob, pos + 1)
                mask[row[isin(target, list(entries))]] = True
        else:  # br Xn somewhere in the body (the slot is checked when decoding)
            w = blob.view("<u4") & 0xFFFFFC1F
            pos = np.flatnonzero(w == 0xD61F0000) * 4
            mask[_row(start, pos)] = True
        return mask

    # -- bytes ---------------------------------------------------------------------------
    def section_at(self, addr: int):
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            s = self.secs[i]
            if addr < s.addr + s.size:
                return s
        return None

    def code(self, addr: int, size: int) -> bytes | None:
        s = self.section_at(addr)
        if s is None or not s.flags & SHF_EXECINSTR or s.type == SHT_NOBITS:
            return None
        size = min(size, s.addr + s.size - addr)
        off = s.offset + addr - s.addr
        if size <= 0 or off + size > self.img.size:
            return None
        return bytes(self.img.buf[off:off + size])

    # -- the forwarding shapes -----------------------------------------------------------
    def forward(self, addr: int, hops: int) -> tuple[str, str, int] | None:
        """(target, via, slot) if the code at `addr` only forwards to an import."""
        sec = self.section_at(addr)
        plt = sec is not None and (sec.name.startswith(".plt") or sec.name == ".iplt")
        head = self.code(addr, _HEAD)
        if head is None:
            return None
        if not hops:
            tramp = self.trampoline(addr) if self.x86 else self.a64_trampoline(addr)
            if tramp is not None:
                return tramp
        step = (_x86_step if self.x86 else _a64_step)(head, addr)
        if step is None:
            return None
        kind, where = step
        if kind == "slot":
            return self.through_slot(where, "plt" if plt else "got")
        if hops >= _HOPS:
            return None
        return self.forward(where, hops + 1)  # a jump to a PLT entry or to another stub

    def trampoline(self, addr: int) -> tuple[str, str, int] | None:
        """(table[i], "trampoline", slot) if the code at `addr` is an Implib.so-style lazy
        trampoline (see the module docstring): the compare and the jump name one slot, in
        writable data that is not a GOT and that no relocation binds to a symbol, and the path
        taken while it is empty pushes the slot's index and calls a resolver in this file."""
        code = self.code(addr, _TRAMP_READ)
        if code is None:
            return None
        i = 4 if code.startswith(_ENDBR64) else 0
        if code[i:i + 3] != b"\x48\x83\x3d" or len(code) < i + 8 or code[i + 7] != 0:
            return None
        slot = addr + i + 8 + struct.unpack_from("<i", code, i + 3)[0]
        i += 8
        if code[i] == 0x74:  # je rel8
            slow, i = i + 2 + struct.unpack_from("<b", code, i + 1)[0], i + 2
        elif code[i:i + 2] == b"\x0f\x84" and len(code) >= i + 6:  # je rel32
            slow, i = i + 6 + struct.unpack_from("<i", code, i + 2)[0], i + 6
        else:
            return None
        if code[i:i + 2] != b"\xff\x25" or len(code) < i + 6 \
                or addr + i + 6 + struct.unpack_from("<i", code, i + 2)[0] != slot:
            return None
        # the slow path: push $index (6a imm8 or 68 imm32), then call rel32 to code in this file
        if not 0 <= slow <= len(code) - 7:
            return None
        if code[slow] == 0x6A:
            index, at = code[slow + 1], slow + 2
        elif code[slow] == 0x68 and slow + 10 <= len(code):
            index, at = struct.unpack_from("<I", code, slow + 1)[0], slow + 5
        else:
            return None
        if code[at] != 0xE8 or len(code) < at + 5:
            return None
        return self._tramp_slot(addr + at + 5 + struct.unpack_from("<i", code, at + 1)[0], slot, index)

    def a64_trampoline(self, addr: int) -> tuple[str, str, int] | None:
        """trampoline() for AArch64 (the module docstring's shape): adrp and ldr name the slot,
        cbz on the loaded register leads to the slow path, br leaves through it; the slow path
        moves the slot's index into that register (movz, and movk for the high half), saves it
        with the link register and calls a resolver in this file."""
        code = self.code(addr, _TRAMP_READ)
        if code is None:
            return None
        words = _a64_words(code)
        i = 1 if words and words[0] in _A64_SKIP else 0
        if len(words) < i + 5:
            return None
        page = _adrp(words[i], addr + 4 * i)
        use = _a64_use(words[i + 1], page[0]) if page is not None else None
        if use is None or use[0] != "ldr" or use[1] != page[0]:
            return None
        reg, slot, cbz = page[0], page[1] + use[2], words[i + 2]
        if cbz & 0xFF00001F != 0xB4000000 | reg or words[i + 3] != 0xD61F0000 | reg << 5:  # cbz xN; br xN
            return None
        off = (cbz >> 5) & 0x7FFFF
        k = i + 2 + (off - (1 << 19) if off & (1 << 18) else off)  # the slow path's word
        if not i + 4 <= k < len(words) - 2 or words[k] & 0xFFE0001F != 0xD2800000 | reg:  # movz xN, #imm16
            return None
        index = (words[k] >> 5) & 0xFFFF
        k += 1
        if words[k] & 0xFFE0001F == 0xF2A00000 | reg:  # movk xN, #imm16, lsl #16
            index |= ((words[k] >> 5) & 0xFFFF) << 16
            k += 1
        # stp xN, x30, [sp, #-16]!, then bl resolver
        if k + 1 >= len(words) or words[k] != 0xA9BF7BE0 | reg or words[k + 1] & 0xFC000000 != 0x94000000:
            return None
        return self._tramp_slot(_a64_branch_target(words[k + 1], addr + 4 * (k + 1)), slot, index)

    def _tramp_slot(self, resolve: int, slot: int, index: int) -> tuple[str, str, int] | None:
        """A trampoline's (table[i], "trampoline", slot), once its resolver is code of this file
        (not a PLT entry) and its slot lies in writable data that is not a GOT and that no
        relocation binds to a symbol."""
        resolver = self.section_at(resolve)
        if resolver is None or not resolver.flags & SHF_EXECINSTR or resolver.name.startswith(".plt"):
            return None
        s = self.section_at(slot)
        if s is None or not s.flags & SHF_WRITE or s.flags & SHF_EXECINSTR or s.name.startswith(".got") \
                or self.reloc_symbol(slot) is not None:
            return None
        base = slot - 8 * index
        table = self.symbol_at(base) if self.section_at(base) is s else None
        return (f"{table}[{index}]" if table else f"table @0x{base:x}[{index}]"), "trampoline", slot

    def symbol_at(self, addr: int) -> str | None:
        """The name of a data symbol (object or no type) of .symtab at exactly `addr`, if any."""
        if self._symtab is None:
            self._symtab = {}
            dt = np.dtype([("st_name", "<u4"), ("st_info", "u1"), ("st_other", "u1"), ("st_shndx", "<u2"),
                           ("st_value", "<u8"), ("st_size", "<u8")])
            img = self.img
            for sec in img.sections:
                if sec.type != SHT_SYMTAB or not sec.size or sec.offset + sec.size > img.size \
                        or not 0 <= sec.link < len(img.sections):
                    continue
                strs = img.sections[sec.link]
                if strs.offset + strs.size > img.size:
                    continue
                syms = np.frombuffer(img.buf, dtype=dt, count=sec.size // dt.itemsize, offset=sec.offset)
                data = syms[np.isin(syms["st_info"] & 0xF, [0, 1]) & (syms["st_shndx"] != SHN_UNDEF)
                            & (syms["st_name"] != 0)]
                for value, name in zip(data["st_value"].tolist(), data["st_name"].tolist()):
                    if name < strs.size and value not in self._symtab:
                        at = strs.offset + name
                        end = img.buf.find(b"\0", at, strs.offset + strs.size)
                        # not an ARM/AArch64 mapping symbol ($d, $x.0: where data or code starts)
                        if end > at and img.buf[at] != 0x24:
                            self._symtab[value] = bytes(img.buf[at:end]).decode("utf-8", "backslashreplace")
        return self._symtab.get(addr)

    def through_slot(self, slot: int, via: str) -> tuple[str, str, int] | None:
        sym = self.reloc_symbol(slot)
        if sym is None:
            return None
        name, defined = sym
        return None if defined else (name, via, slot)

    def dlsym_stub(self, addr: int, size: int, name: str) -> tuple[str, str, int] | None:
        """(name, "dlsym", slot) if the body is a lazy stub for its own name (see the module
        docstring), else None."""
        body = self.code(addr, size)
        if body is None:
            return None
        want = name.encode("utf-8", "surrogateescape") + b"\0"
        if self.x86:
            # the name first: most bodies screened in do not load their own name (cheap to see)
            own = [end for end, a in _x86_strings(body, addr) if self.data(a, len(want)) == want]
            if not own:
                return None
            refs = _x86_refs(body, addr)
            if refs is None:
                return None
            _, left, called, stored = refs
            slots = stored & left
            if not slots and any(self.calls_dlsym(body, addr, end) for end in own):
                # a wrapper: its own name goes straight to dlsym, and it calls what came back
                slots = stored & called
        else:
            refs = _a64_refs(body, addr)
            if refs is None:
                return None
            strings, slots = refs
            if not any(self.data(a, len(want)) == want for a in strings):
                return None
        for slot in sorted(slots):
            s = self.section_at(slot)
            if s is not None and s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR \
                    and not s.name.startswith(".got") and self.reloc_symbol(slot) is None:
                return name, "dlsym", slot
        return None

    def calls_dlsym(self, body: bytes, addr: int, at: int) -> bool:
        """True if a call to dlsym/dlvsym (through its PLT entry or GOT slot) starts within a few
        instructions after body[at]."""
        for i in range(at, min(at + _ARG_WINDOW, len(body) - 5)):
            if body[i] == 0xE8:
                if addr + i + 5 + struct.unpack_from("<i", body, i + 1)[0] in self.dlsym_entries():
                    return True
            elif body[i] == 0xFF and body[i + 1] == 0x15 and i + 6 <= len(body):
                sym = self.reloc_symbol(addr + i + 6 + struct.unpack_from("<i", body, i + 2)[0])
                if sym is not None and sym[0].split("@", 1)[0] in ("dlsym", "dlvsym"):
                    return True
        return False

    def dlsym_entries(self) -> set[int]:
        """Addresses of the PLT entries (x86-64: jmp *slot after an optional endbr64/bnd) whose
        slot a relocation binds to dlsym or dlvsym. In bulk: a library can import 40k names."""
        if self._dlsym_plt is not None:
            return self._dlsym_plt
        self._dlsym_plt = set()
        table = self._dynsym
        if table is None or not len(table.syms):
            return self._dlsym_plt
        buf, base, size = self.img.buf, table.str_off, table.str_size
        # string-table offsets whose name is dlsym or dlvsym (tails may be shared): one pass
        names = {m.start() - base for m in _DLSYM_NAMES.finditer(buf, base, base + size)}
        index = np.flatnonzero(isin(table.syms["st_name"], list(names))) if names else []
        if self._relocs is None:
            self._load_relocs()
        offs, syms = self._relocs
        slots = offs[isin(syms, np.asarray(index, dtype=np.uint64))].astype(np.int64)
        if not len(slots):
            return self._dlsym_plt
        for sec in self.secs:
            stride = sec.entsize if sec.entsize in (8, 16) else 16  # .plt.got: 8-byte entries
            if not (sec.name.startswith(".plt") and sec.flags & SHF_EXECINSTR) or sec.type == SHT_NOBITS \
                    or sec.offset + sec.size > self.img.size or sec.size < stride:
                continue
            count = sec.size // stride
            rows = self.u8[sec.offset:sec.offset + count * stride].reshape(count, stride)
            entry = sec.addr + stride * np.arange(count)
            for at in (0, 1, 4, 5) if stride == 16 else (0, 1):  # ff 25 after nothing, bnd, endbr64, both
                k = np.flatnonzero((rows[:, at] == 0xFF) & (rows[:, at + 1] == 0x25))
                disp = np.ascontiguousarray(rows[k, at + 2:at + 6]).view("<i4")[:, 0].astype(np.int64)
                slot = entry[k] + at + 6 + disp
                self._dlsym_plt.update(entry[k][isin(slot, slots)].tolist())
        return self._dlsym_plt

    def data(self, addr: int, size: int) -> bytes | None:
        s = self.section_at(addr)
        if s is None or s.type == SHT_NOBITS or addr + size > s.addr + s.size:
            return None
        off = s.offset + addr - s.addr
        return bytes(self.img.buf[off:off + size]) if off + size <= self.img.size else None

    # -- relocations ---------------------------------------------------------------------
    def reloc_symbol(self, slot: int):
        """(name, defined) of the symbol a dynamic relocation at `slot` names; None if none does
        (no relocation, or one without a symbol such as R_*_RELATIVE)."""
        if self._relocs is None:
            self._load_relocs()
        offs, syms = self._relocs
        i = int(np.searchsorted(offs, np.uint64(slot & 0xFFFFFFFFFFFFFFFF)))
        if i >= len(offs) or int(offs[i]) != slot:
            return None
        table = self._dynsym
        symidx = int(syms[i])
        if table is None or symidx >= len(table.syms):
            return None
        entry = table.syms[symidx]
        name = names_at(self.img, table, [int(entry["st_name"])], [-1])[0]
        return name, int(entry["st_shndx"]) != SHN_UNDEF

    def _load_relocs(self) -> None:
        """The dynamic relocations that name a symbol, sorted by the address they fill (the
        many R_*_RELATIVE ones are dropped first: a library can have millions)."""
        img = self.img
        dt = np.dtype([("r_offset", "<u8"), ("r_info", "<u8"), ("r_addend", "<i8")])
        offs, syms = [], []
        for sec in img.sections:
            if sec.type != SHT_RELA or not sec.size or sec.offset + sec.size > img.size:
                continue
            if self._dynsym is None or sec.link != self._dynsym.index:
                continue  # static relocations (.rela.text of an object file) are not run-time slots
            arr = np.frombuffer(img.buf, dtype=dt, count=sec.size // dt.itemsize, offset=sec.offset)
            sym = arr["r_info"] >> np.uint64(32)
            named = sym != 0
            offs.append(arr["r_offset"][named])
            syms.append(sym[named])
        o = np.concatenate(offs) if offs else np.zeros(0, dtype=np.uint64)
        f = np.concatenate(syms) if syms else np.zeros(0, dtype=np.uint64)
        order = np.argsort(o, kind="stable")
        self._relocs = (o[order], f[order])


def _row(start: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Which body (by its start offset in the joined bytes) each position lies in."""
    return np.searchsorted(start, pos, side="right") - 1


def _disp32(blob: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian signed 32-bit values at positions `at` of a byte array."""
    v = (blob[at].astype(np.int64) | blob[at + 1].astype(np.int64) << 8
         | blob[at + 2].astype(np.int64) << 16 | blob[at + 3].astype(np.int64) << 24)
    return np.where(v >= 1 << 31, v - (1 << 32), v)


# ---------------------------------------------------------------- x86-64


def _x86_step(code: bytes, addr: int) -> tuple[str, int] | None:
    """("jump", target) or ("slot", address) if the code is a tail jump, or a call followed by
    nothing but stack clean-up and ret; None otherwise."""
    i = 4 if code.startswith(_ENDBR64) else 0
    jump = _x86_branch(code, i, addr, tail=True)
    if jump is not None:
        return jump[0]
    # call form: frame set-up, the call, frame tear-down, ret
    for _ in range(4):
        n = _x86_frame(code, i, push=True)
        if not n:
            break
        i += n
    call = _x86_branch(code, i, addr, tail=False)
    if call is None:
        return None
    step, i = call
    for _ in range(4):
        n = _x86_frame(code, i, push=False)
        if not n:
            break
        i += n
    if code[i:i + 1] == b"\xc3" or code[i:i + 2] == b"\xf2\xc3":
        return step
    return None


def _x86_branch(code: bytes, i: int, addr: int, tail: bool):
    """A jmp (tail) or call at code[i]: ((kind, where), index after it) or None."""
    if code[i:i + 1] == b"\xf2":  # bnd prefix (MPX-era PLT entries)
        i += 1
    op = code[i:i + 1]
    rel, mem = (b"\xe9", 0x25) if tail else (b"\xe8", 0x15)
    if op == rel and len(code) >= i + 5:
        return ("jump", addr + i + 5 + struct.unpack_from("<i", code, i + 1)[0]), i + 5
    if tail and op == b"\xeb" and len(code) >= i + 2:
        return ("jump", addr + i + 2 + struct.unpack_from("<b", code, i + 1)[0]), i + 2
    if op == b"\xff" and len(code) >= i + 6 and code[i + 1] == mem:
        return ("slot", addr + i + 6 + struct.unpack_from("<i", code, i + 2)[0]), i + 6
    return None


def _x86_frame(code: bytes, i: int, push: bool) -> int:
    """Length of one frame set-up (push) or tear-down (pop) instruction at code[i], else 0."""
    b = code[i:i + 4]
    if not b:
        return 0
    lo, hi = (0x50, 0x57) if push else (0x58, 0x5F)
    if lo <= b[0] <= hi:
        return 1  # push/pop rax..rdi
    if len(b) >= 2 and b[0] == 0x41 and lo <= b[1] <= hi:
        return 2  # push/pop r8..r15
    if push and b[:3] == b"\x48\x89\xe5":
        return 3  # mov rbp, rsp
    if not push and b[0] == 0xC9:
        return 1  # leave
    if len(b) >= 4 and b[:3] == (b"\x48\x83\xec" if push else b"\x48\x83\xc4"):
        return 4  # sub/add rsp, imm8
    return 0


def _rip_operands(body: bytes, addr: int, prefixes: tuple[bytes, ...]) -> dict[int, set[int]]:
    """register -> addresses of the [rip + disp32] operands of the instructions that start with
    one of `prefixes` (REX.W 48 or 4c, then the opcode) and have mod 00, rm 101 in their ModRM
    byte; the register is the ModRM reg field (+8 with REX.R, prefix 4c)."""
    out: dict[int, set[int]] = {}
    for pat in prefixes:
        i = body.find(pat)
        while 0 <= i <= len(body) - 7:
            modrm = body[i + 2]
            if modrm & 0xC7 == 0x05:
                reg = (modrm >> 3 & 7) + (8 if pat[0] == 0x4C else 0)
                out.setdefault(reg, set()).add(addr + i + 7 + struct.unpack_from("<i", body, i + 3)[0])
            i = body.find(pat, i + 1)
    return out


def _ends_path(body: bytes, addr: int, end: int) -> bool:
    """True if an unconditional jump ending at body[end] (address addr + end) is followed by what
    compilers put after one: alignment padding (nop forms, int3), a block already at a 16-byte
    boundary, or the end of the body. A jump pattern found inside another instruction's bytes
    is seldom followed so."""
    return end >= len(body) or (addr + end) % 16 == 0 or body[end] in (0x90, 0xCC) \
        or body[end:end + 2] in (b"\x0f\x1f", b"\x66\x90") \
        or (body[end] == 0x66 and body[end + 1:end + 2] in (b"\x0f", b"\x2e", b"\x66"))


def _registers(body: bytes, addr: int, low: int, tail: bool) -> set[int]:
    """Registers of the jmp *reg (low 0xe0) or call *reg (low 0xd0) patterns in a body (ff low+r;
    41 ff low+r for r8-r15); a tail jump must end its path (see _ends_path)."""
    regs = set()
    i = body.find(b"\xff")
    while 0 <= i < len(body) - 1:
        if body[i + 1] & 0xF8 == low and (not tail or _ends_path(body, addr, i + 2)):
            regs.add((body[i + 1] & 7) + (8 if i and body[i - 1] == 0x41 else 0))
        i = body.find(b"\xff", i + 1)
    return regs


def _through(body: bytes, addr: int, op: int, tail: bool) -> set[int]:
    """Slots of the jmp *[rip+d] (op 0x25) or call *[rip+d] (op 0x15) patterns in a body."""
    out = set()
    pat = bytes([0xFF, op])
    i = body.find(pat)
    while 0 <= i <= len(body) - 6:
        if not tail or _ends_path(body, addr, i + 6):
            out.add(addr + i + 6 + struct.unpack_from("<i", body, i + 2)[0])
        i = body.find(pat, i + 1)
    return out


def _x86_refs(body: bytes, addr: int):
    """(string refs [(end of the lea, address)], slots left through, slots called through, slots
    stored to) of a body, from byte patterns, or None if it stores to no [rip+d] slot.

    Left through: a tail jmp *[rip+d] (ff 25), or a load into a register (mov reg, [rip+d])
    that the body tail-jumps to (jmp *reg, the same register), the jump followed by padding or
    the body's end. Called through: the same with call. Byte patterns, not a full decode: the
    checks on register, padding and what the addresses point at keep a pattern found inside
    another instruction from passing."""
    stored = set().union(*_rip_operands(body, addr, (b"\x48\x89", b"\x4c\x89")).values())
    if not stored:
        return None
    loaded = _rip_operands(body, addr, (b"\x48\x8b", b"\x4c\x8b"))
    left = _through(body, addr, 0x25, True).union(*(loaded.get(r, ()) for r in _registers(body, addr, 0xE0, True)))
    called = _through(body, addr, 0x15, False).union(*(loaded.get(r, ()) for r in _registers(body, addr, 0xD0, False)))
    return _x86_strings(body, addr), left, called, stored


def _x86_strings(body: bytes, addr: int) -> list[tuple[int, int]]:
    """[(end of the lea, address)] of the lea reg, [rip + disp32] instructions of a body."""
    strings = []
    for pat in (b"\x48\x8d", b"\x4c\x8d"):
        i = body.find(pat)
        while 0 <= i <= len(body) - 7:
            if body[i + 2] & 0xC7 == 0x05:
                strings.append((i + 7, addr + i + 7 + struct.unpack_from("<i", body, i + 3)[0]))
            i = body.find(pat, i + 1)
    return strings


# ---------------------------------------------------------------- AArch64


def _a64_words(code: bytes) -> list[int]:
    n = len(code) // 4
    return list(struct.unpack_from(f"<{n}I", code, 0))


def _a64_branch_target(word: int, pc: int) -> int:
    imm = word & 0x03FFFFFF
    if imm & 0x02000000:
        imm -= 0x04000000
    return pc + imm * 4


def _adrp(word: int, pc: int) -> tuple[int, int] | None:
    """(register, page address) of an ADRP, else None."""
    if word & 0x9F000000 != 0x90000000:
        return None
    imm = (((word >> 5) & 0x7FFFF) << 2) | ((word >> 29) & 3)
    if imm & (1 << 20):
        imm -= 1 << 21
    return word & 0x1F, (pc & ~0xFFF) + (imm << 12)


def _a64_use(word: int, reg: int) -> tuple[str, int, int] | None:
    """("ldr", dest, offset) for ldr Xt, [reg, #imm]; ("str", source, offset) for str Xt, [reg,
    #imm]; ("add", dest, imm) for add Xd, reg, #imm."""
    if (word >> 5) & 0x1F != reg:
        return None
    if word & 0xFFC00000 == 0xF9400000:  # LDR (unsigned immediate), 64-bit
        return "ldr", word & 0x1F, ((word >> 10) & 0xFFF) * 8
    if word & 0xFFC00000 == 0xF9000000:  # STR (unsigned immediate), 64-bit
        return "str", word & 0x1F, ((word >> 10) & 0xFFF) * 8
    if word & 0xFF800000 == 0x91000000:  # ADD (immediate), 64-bit
        imm = (word >> 10) & 0xFFF
        return "add", word & 0x1F, imm << 12 if word & (1 << 22) else imm
    return None


def _a64_step(code: bytes, addr: int) -> tuple[str, int] | None:
    words = _a64_words(code)
    i = 0
    while i < len(words) and words[i] in _A64_SKIP:
        i += 1
    if i >= len(words):
        return None
    w = words[i]
    if w & 0xFC000000 == 0x14000000:  # b target
        return "jump", _a64_branch_target(w, addr + 4 * i)
    page = _adrp(w, addr + 4 * i)
    if page is not None:  # adrp xN; ldr xM, [xN, #off]; (add xN, xN, #off;) br xM: a PLT entry's shape
        reg, base = page
        use = _a64_use(words[i + 1], reg) if i + 1 < len(words) else None
        if use is None or use[0] != "ldr":
            return None
        slot, dest = base + use[2], use[1]
        for w2 in words[i + 2:i + 4]:
            if w2 & 0xFFFFFC1F == 0xD61F0000:  # br
                return ("slot", slot) if (w2 >> 5) & 0x1F == dest else None
            if _a64_use(w2, reg) is None or _a64_use(w2, reg)[0] != "add":
                return None
        return None
    # call form: stp x29, x30, [sp, #-16]!; mov x29, sp; bl target; ldp x29, x30, [sp], #16; ret
    if words[i:i + 2] == [_A64_FRAME_PUSH, _A64_FRAME_SET] and i + 5 <= len(words):
        bl = words[i + 2]
        rest = [x for x in words[i + 3:i + 6] if x != _A64_AUTIASP]
        if bl & 0xFC000000 == 0x94000000 and rest[:2] == [_A64_FRAME_POP, _A64_RET]:
            return "jump", _a64_branch_target(bl, addr + 4 * (i + 2))
    return None


def _a64_refs(body: bytes, addr: int) -> tuple[set[int], set[int]] | None:
    """(addresses formed by adrp+add, lazy slots) in a body that ends in a register branch
    (br), else None. A lazy slot is an adrp-based address the body both loads (ldr) and stores
    (str): the pointer it fills and leaves through. Each adrp's register is followed to its
    uses until another adrp sets it; the caller's exact checks weed out stale pairings."""
    words = _a64_words(body)
    if not any(w & 0xFFFFFC1F == 0xD61F0000 for w in words):
        return None
    strings, loaded, stored = set(), set(), set()
    for i, w in enumerate(words):
        page = _adrp(w, addr + 4 * i)
        if page is None:
            continue
        reg, base = page
        for w2 in words[i + 1:]:
            if _adrp(w2, 0) is not None and w2 & 0x1F == reg:
                break
            use = _a64_use(w2, reg)
            if use is not None:
                {"ldr": loaded, "str": stored, "add": strings}[use[0]].add(base + use[2])
    slots = loaded & stored
    return (strings, slots) if slots else None

"""Library names assembled in code: x86-64 instructions that store a name piece by piece.

A short string built at run time (`std::string("libcudnn.so.") + ...`, a memcpy of a literal into
a stack buffer) is often compiled into no string at all: the compiler stores its bytes with
`movabs $imm64, %reg` / `mov %reg, disp(%rsp)` and `movl $imm32, disp(%rsp)`, overlapping the
stores where the length is odd (onnxruntime's CUDA provider: `movabs "libcudnn"`, then
`movabs "dnn.so.9"` stored 5 bytes further, gives `libcudnn.so.9`). Such a name never appears
in the data, so `strings` and the library-name scan miss it.

Read here: each `movabs` (REX.W B8+r) whose 8 immediate bytes start with `lib` and are name
characters, then the printable immediates of the next few stores (movabs imm64, mov imm32 /
imm16 / imm8 to memory) within a short window, merged where one piece's start repeats the end of
the name so far (an overlapping store writes the same bytes) and appended otherwise, up to the
first NUL. A name longer than 15 bytes copied into a std::string's buffer is compiled to a
16-byte constant in .rodata that a vector load reads RIP-relative (`movdqa .LC0(%rip),%xmm0`,
`vmovdqa` under AVX) and stores, then immediates for the rest (PaddlePaddle's libphi_core.so:
the constant `libmklml_intel.s`, then `movb $0x6f,0x10(%rax)`): each such load of a 16-byte
aligned constant that starts with `lib` and holds only name characters (name_constants) starts
a name too, its stores merged the same way. The result is kept only if it holds a library file
name (`lib<name>.so[.N]`), so unrelated immediates never make a finding. x86-64 only; other
machines yield nothing (aarch64 compilers load such a literal from .rodata with adrp/ldr, where
the library-name scan finds it).

Fail closed: an executable section outside the file is Malformed (the reader checks the
sections' bounds when it first reads the file); past MAX_HITS occurrences each further name is
still listed once, and more than MAX_NAMES different names is Malformed.
"""

from __future__ import annotations

import re

import numpy as np

from audit.elf.membership import in_sorted
from audit.elf.model import StringHit
from audit.elf.parse import SHF_ALLOC, SHF_EXECINSTR, SHT_PROGBITS, ElfImage, Malformed, decode, release
from audit.elf.strings import library_names

_NAME = rb"[A-Za-z0-9_.+\-]"
_FIRST = re.compile(rb"lib" + _NAME + rb"{5}")  # the literal "lib" lets re skip ahead fast
# ModRM (+SIB/disp) of a store to memory: [reg+disp8], [reg+disp32], [rsp], [reg] (not RIP-relative)
_MEM = rb"(?:\x44\x24.|\x84\x24.{4}|[\x40-\x43\x45-\x47].|[\x80-\x83\x85-\x87].{4}|\x04\x24|[\x00-\x03\x06\x07])"
_PIECE = re.compile(
    rb"[\x48\x49][\xb8-\xbf](?P<q>" + _NAME + rb"[\x00A-Za-z0-9_.+\-]{7})"  # movabs $imm64, %r
    rb"|\x66\x41?\xc7" + _MEM + rb"(?P<w>" + _NAME + rb"[\x00A-Za-z0-9_.+\-])"  # movw $imm16, mem
    rb"|\x41?\xc7" + _MEM + rb"(?P<d>" + _NAME + rb"[\x00A-Za-z0-9_.+\-]{3})"  # movl $imm32, mem
    rb"|\x41?\xc6" + _MEM + rb"(?P<b>" + _NAME + rb"|\x00)",  # movb $imm8, mem
    re.DOTALL)
_WINDOW = 64  # bytes of code after a piece in which the next piece is looked for
_MAX_PIECES = 6
EM_X86_64 = 62
MAX_HITS = 1000  # occurrences listed in full; past it, each further name once
MAX_NAMES = 100_000  # different names (~26 MB of names at most); more is Malformed


def _merge(name: bytes, piece: bytes) -> bytes:
    """Append `piece`, overlapping it with the end of `name` as far as they agree."""
    for k in range(min(len(name), len(piece)), 0, -1):
        if name.endswith(piece[:k]):
            return name + piece[k:]
    return name + piece


_CHUNK = 32 << 20


def _matches(buf, start: int, end: int):
    """_FIRST.finditer(buf, start, end), read in 32 MiB steps whose pages are let go once
    scanned (parse.release): all of a library's code is read, but only a step of it stays
    resident. Each step resumes where the last match ended, so the matches are the same."""
    pos = start
    while pos < end:
        stop = min(end, pos + _CHUNK)
        resume = stop
        for m in _FIRST.finditer(buf, pos, min(end, stop + 8)):  # a match may run past the step
            if m.start() >= stop:
                break
            resume = max(resume, m.end())
            yield m
        release(buf, pos, stop)
        pos = resume


def assembled_names(img: ElfImage, warnings: list[str]) -> list[StringHit]:
    """Library names built from immediates in the executable sections (x86-64)."""
    if img.e_machine != EM_X86_64:
        return []
    hits: list[StringHit] = []
    seen: set[str] = set()
    buf = img.buf
    constants = name_constants(img)
    for sec in img.sections:
        if sec.type != SHT_PROGBITS or not sec.flags & SHF_EXECINSTR or not sec.size:
            continue
        if sec.offset + sec.size > img.size:
            raise Malformed(f"section {sec.name or sec.index} (offset {sec.offset:#x}, size {sec.size:#x}) "
                            f"lies outside the file ({img.size:#x} bytes): its code cannot be read")
        end = sec.offset + sec.size
        starts = [(m.start() - 2, m.group(), m.end()) for m in _matches(buf, sec.offset + 2, end)
                  if buf[m.start() - 2] in (0x48, 0x49) and 0xB8 <= buf[m.start() - 1] <= 0xBF]
        if constants:
            starts = sorted(starts + _vector_loads(img, sec, constants))
        for at, name, pos in starts:
            for _, lib in library_names(_pieces(buf, name, pos, end)):
                text = decode(lib)
                if len(hits) >= MAX_HITS:  # past the cap: each name still once, so none is dropped
                    if text in seen:
                        continue
                    if len(seen) >= MAX_NAMES:
                        raise Malformed(f"more than {MAX_NAMES} different library names assembled in code "
                                        "(the limit): they cannot all be listed")
                seen.add(text)
                hits.append(StringHit(section=sec.name, offset=at, text=text))
    return hits


def _pieces(buf, name: bytes, pos: int, end: int) -> bytes:
    """`name` with the immediates of the stores that follow it at `pos` merged in (up to
    _MAX_PIECES, each within _WINDOW bytes of the last), up to a stored NUL."""
    for _ in range(_MAX_PIECES):
        p = _PIECE.search(buf, pos, min(pos + _WINDOW, end))
        if p is None:
            break
        imm = p.group(p.lastgroup)
        piece = imm.split(b"\0", 1)[0]
        name = _merge(name, piece) if piece else name
        pos = p.end()
        if len(piece) < len(imm):  # the terminating NUL: the name is complete
            break
    return name


def name_constants(img: ElfImage) -> dict[int, bytes]:
    """Address -> bytes of each 16-byte constant in the loaded data that is the head of a library
    name with no NUL in it ("libmklml_intel.s"): 16-byte aligned, as a vector load needs it and
    compilers place it. Only code can finish such a name, so only code that loads it matters."""
    out: dict[int, bytes] = {}
    buf = img.buf
    for sec in img.sections:
        if sec.type != SHT_PROGBITS or not sec.flags & SHF_ALLOC or sec.flags & SHF_EXECINSTR or not sec.size:
            continue
        end = min(sec.offset + sec.size, img.size)
        pos = buf.find(b"lib", sec.offset, end)
        while pos >= 0:
            addr = sec.addr + (pos - sec.offset)
            if not addr % 16 and pos + 16 <= end and _CONSTANT.fullmatch(buf, pos, pos + 16):
                out[addr] = bytes(buf[pos:pos + 16])
                if len(out) > MAX_NAMES:
                    raise Malformed(f"more than {MAX_NAMES} library-name constants in the data (the limit)")
            pos = buf.find(b"lib", pos + 3, end)
    return out


_VECTOR_OPS = np.zeros(256, dtype=bool)
_VECTOR_OPS[[0x10, 0x28, 0x6F]] = True  # movups/movaps/movdqa-movdqu load opcodes (SSE and VEX)
_STEP = 2 << 20  # bytes of code per numpy pass (its temporary masks are a few times this)


def _vector_loads(img: ElfImage, sec, constants: dict[int, bytes]) -> list[tuple[int, bytes, int]]:
    """(instruction offset, the constant's bytes, offset after the instruction) of each 16-byte
    RIP-relative load in `sec` of one of `constants`: [VEX c5 xx | [66|f3] [REX] 0f] op modrm
    disp32 with op 10/28/6f and modrm mod 00 rm 101 (gcc's movdqa .LC0(%rip),%xmm0 that copies
    a literal into a std::string's buffer; vmovdqa under AVX). Vectorised: the opcode and ModRM
    bytes of a window are tested with numpy, and only the few loads aimed at a constant read."""
    wanted = np.array(sorted(constants), dtype=np.int64)
    buf, out = img.buf, []
    end = sec.offset + sec.size
    for lo in range(sec.offset, end, _STEP):
        n = min(_STEP + 6, end - lo)
        if n < 7:
            break
        a = np.frombuffer(buf, dtype=np.uint8, count=n, offset=lo)
        op = np.flatnonzero(_VECTOR_OPS[a[:n - 6]] & ((a[1:n - 5] & 0xC7) == 0x05))
        op = op[op < _STEP]
        if len(op):
            disp = (a[op + 2].astype(np.uint32) | a[op + 3].astype(np.uint32) << 8
                    | a[op + 4].astype(np.uint32) << 16 | a[op + 5].astype(np.uint32) << 24).view(np.int32)
            target = sec.addr + (lo - sec.offset) + op.astype(np.int64) + 6 + disp
            for i in np.flatnonzero(in_sorted(target, wanted)).tolist():
                at = lo + int(op[i])
                if at - 2 >= sec.offset and buf[at - 2] == 0xC5:  # two-byte VEX prefix
                    start = at - 2
                elif at - 1 >= sec.offset and buf[at - 1] == 0x0F:
                    start = at - 1  # and up to two legacy prefixes before it (66/f3, REX)
                    for _ in range(2):
                        if start > sec.offset and buf[start - 1] in _LEGACY:
                            start -= 1
                else:
                    continue
                out.append((start, constants[int(target[i])], at + 6))
        release(buf, lo, lo + _STEP)
    return out


_LEGACY = frozenset([0x66, 0xF3]) | frozenset(range(0x40, 0x50))  # operand-size/rep prefixes, REX
_CONSTANT = re.compile(rb"lib" + _NAME + rb"{13}")

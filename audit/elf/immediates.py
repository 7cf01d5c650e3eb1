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
first NUL. The result is kept only if it holds a library file name (`lib<name>.so[.N]`), so
unrelated immediates never make a finding. x86-64 only; other machines yield nothing (aarch64
compilers load such a literal from .rodata with adrp/ldr, where the library-name scan finds it).

Fail closed: an executable section outside the file is Malformed (the reader checks the
sections' bounds when it first reads the file); past MAX_HITS occurrences each further name is
still listed once, and more than MAX_NAMES different names is Malformed.
"""

from __future__ import annotations

import re

from audit.elf.model import StringHit
from audit.elf.parse import SHF_EXECINSTR, SHT_PROGBITS, ElfImage, Malformed, decode, release
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
    for sec in img.sections:
        if sec.type != SHT_PROGBITS or not sec.flags & SHF_EXECINSTR or not sec.size:
            continue
        if sec.offset + sec.size > img.size:
            raise Malformed(f"section {sec.name or sec.index} (offset {sec.offset:#x}, size {sec.size:#x}) "
                            f"lies outside the file ({img.size:#x} bytes): its code cannot be read")
        end = sec.offset + sec.size
        for m in _matches(buf, sec.offset + 2, end):
            at = m.start() - 2
            if buf[at] not in (0x48, 0x49) or not 0xB8 <= buf[at + 1] <= 0xBF:
                continue
            name, pos = m.group(), m.end()
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
            for _, lib in library_names(name):
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

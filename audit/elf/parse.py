"""Low-level ELF structure over a byte buffer: header, section and program headers.

Every offset read from the file is checked against the buffer before use, so a corrupted or
hostile file raises `Malformed` (turned into InputError by the reader), never IndexError or a
hang: all loops are bounded by counts that were themselves checked against the buffer size.
Works on 32/64-bit and little/big-endian files alike (device code objects go through here too).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"

SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB = 0, 1, 2, 3
SHT_DYNAMIC, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 6, 7, 8, 11
SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
SHN_UNDEF, SHN_LORESERVE, SHN_XINDEX = 0, 0xFF00, 0xFFFF

ET_NAMES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
# The machines this tool meets; others are shown as EM_<number>.
EM_NAMES = {
    0: "EM_NONE", 2: "EM_SPARC", 3: "EM_386", 8: "EM_MIPS", 20: "EM_PPC", 21: "EM_PPC64",
    22: "EM_S390", 40: "EM_ARM", 43: "EM_SPARCV9", 50: "EM_IA_64", 62: "EM_X86_64",
    183: "EM_AARCH64", 190: "EM_CUDA", 224: "EM_AMDGPU", 243: "EM_RISCV", 247: "EM_BPF",
    258: "EM_LOONGARCH",
}
EM_CUDA, EM_AMDGPU = 190, 224


class Malformed(Exception):
    """The buffer is not a well-formed ELF file (message says what is wrong, one line)."""


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@dataclass(frozen=True)
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


def find_nul(buf, start: int, end: int) -> int:
    """Offset of the first NUL in buf[start:end], or -1. Works on any buffer: bytes and mmap
    search in place; a memoryview (a code object read in place inside its container) is
    searched through small, growing windows, so a short name never copies a large table."""
    find = getattr(buf, "find", None)
    if find is not None:
        return find(b"\0", start, end)
    step = 256
    while start < end:
        stop = min(end, start + step)
        i = bytes(buf[start:stop]).find(b"\0")
        if i >= 0:
            return start + i
        start, step = stop, min(step * 4, 1 << 20)
    return -1


def release(buf, start: int, end: int) -> None:
    """Let the pages of buf[start:end] leave this process's resident set once they are read (a
    map only; any other buffer is left alone). They stay in the page cache and come back on the
    next read, so this changes memory, never results: a 1.3 GB fatbin walked end to end then
    costs the memory of the part being read, not of the whole section."""
    madvise = getattr(buf, "madvise", None)
    if madvise is None:
        return
    page = mmap.PAGESIZE
    a, b = -(-start // page) * page, end // page * page
    if b > a:
        try:
            madvise(mmap.MADV_DONTNEED, a, b - a)
        except (OSError, ValueError):
            pass


def has_nonzero(buf, start: int, end: int) -> bool:
    """True if buf[start:end] holds a non-zero byte (read in 1 MiB steps, never copied whole)."""
    for pos in range(start, end, 1 << 20):
        if bytes(buf[pos:min(end, pos + (1 << 20))]).strip(b"\0"):
            return True
    return False


def decode(raw: bytes) -> str:
    """Untrusted bytes from a binary -> str; undecodable bytes become \\xNN (reversible, printable)."""
    return raw.decode("utf-8", errors="backslashreplace")


class ElfImage:
    """A parsed ELF header with its section and program header tables, over `buf`.

    `buf` is any buffer (mmap, bytes, memoryview); `size` bounds every read.
    """

    def __init__(self, buf, *, require_sections: bool = False):
        self.buf = buf
        self.size = len(buf)
        if self.size < 16 or bytes(buf[:4]) != ELF_MAGIC:
            raise Malformed("not an ELF file (no \\x7fELF magic)")
        ei_class, ei_data = buf[4], buf[5]
        if ei_class not in (1, 2):
            raise Malformed(f"bad ELF class byte {ei_class} (expected 1 or 2)")
        if ei_data not in (1, 2):
            raise Malformed(f"bad ELF data byte {ei_data} (expected 1 little or 2 big endian)")
        self.bits = 32 if ei_class == 1 else 64
        self.endian = "little" if ei_data == 1 else "big"
        self.e = "<" if ei_data == 1 else ">"
        self.osabi = buf[7]
        self.abiversion = buf[8]
        hdr_fmt = self.e + ("HHIIIIIHHHHHH" if self.bits == 32 else "HHIQQQIHHHHHH")
        hdr_size = 16 + struct.calcsize(hdr_fmt)
        if self.size < hdr_size:
            raise Malformed(f"truncated ELF header ({self.size} bytes, need {hdr_size})")
        (self.e_type, self.e_machine, _version, self.e_entry, self.e_phoff, self.e_shoff,
         self.e_flags, _ehsize, self.e_phentsize, phnum, self.e_shentsize, shnum,
         shstrndx) = struct.unpack_from(hdr_fmt, buf, 16)
        self.sections: list[Section] = []
        self.segments: list[Segment] = []
        self.warnings: list[str] = []
        # data the section table does not show (audit.elf.segments): scanned like data sections
        self.extra_ranges: list[Section] = []
        # the other loaded bytes (code, unwind tables), whatever their sections claim to be:
        # scanned for library names, and for device code where names cannot be trusted
        self.code_ranges: list[Section] = []
        self._read_sections(shnum, shstrndx, require_sections)
        self._read_segments(phnum)

    # -- helpers ---------------------------------------------------------------------------
    def check_range(self, offset: int, size: int, what: str) -> None:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise Malformed(f"{what} at offset {offset:#x} size {size:#x} runs past end of file ({self.size:#x})")

    def bytes_at(self, offset: int, size: int, what: str) -> bytes:
        self.check_range(offset, size, what)
        return bytes(self.buf[offset:offset + size])

    def cstring(self, table_off: int, table_size: int, index: int) -> bytes | None:
        """NUL-terminated string at `index` in a string table; None if out of range."""
        if index < 0 or index >= table_size:
            return None
        start = table_off + index
        end = find_nul(self.buf, start, table_off + table_size)
        if end < 0:  # unterminated: take up to the table's end (fail soft, caller may warn)
            end = table_off + table_size
        return bytes(self.buf[start:end])

    # -- tables ----------------------------------------------------------------------------
    def _read_sections(self, shnum: int, shstrndx: int, require: bool) -> None:
        if self.e_shoff == 0:
            if require:
                raise Malformed("no section header table")
            return
        fmt = self.e + ("IIIIIIIIII" if self.bits == 32 else "IIQQQQIIQQ")
        entsize = struct.calcsize(fmt)
        if self.e_shentsize < entsize:
            raise Malformed(f"section header entry size {self.e_shentsize} < {entsize}")
        self.check_range(self.e_shoff, entsize, "section header table")
        first = struct.unpack_from(fmt, self.buf, self.e_shoff)
        if shnum == 0:  # extended numbering: the real count lives in section 0's sh_size
            shnum = first[5]
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
        if shnum > (self.size - self.e_shoff) // self.e_shentsize:
            raise Malformed(f"section header table ({shnum} entries) runs past end of file")
        if self.e_shentsize == entsize:  # the usual layout: one bulk unpack of the whole table
            table = bytes(self.buf[self.e_shoff:self.e_shoff + shnum * entsize])
            raw = list(struct.iter_unpack(fmt, table))
        else:
            raw = [struct.unpack_from(fmt, self.buf, self.e_shoff + i * self.e_shentsize) for i in range(shnum)]
        names_off = names_size = 0
        if 0 < shstrndx < shnum:
            s = raw[shstrndx]
            names_off, names_size = s[4], s[5]
            if s[1] == SHT_NOBITS or names_off + names_size > self.size:
                self.warnings.append("section name table out of range: section names unavailable")
                names_off = names_size = 0
        elif shnum:
            self.warnings.append(f"section name table index {shstrndx} invalid: section names unavailable")
        # Names from one copy of the (small) name table; Sections built without the frozen
        # dataclass's per-field __setattr__: a cubin-heavy library has ~350k sections in all.
        names = bytes(self.buf[names_off:names_off + names_size])
        find, new, put = names.find, object.__new__, object.__setattr__
        for i, s in enumerate(raw):
            at = s[0]
            if at < names_size:
                end = find(b"\0", at)
                name = decode(names[at:end if end >= 0 else names_size])
            else:
                name = ""
            sec = new(Section)
            put(sec, "__dict__", {"index": i, "name": name, "type": s[1], "flags": s[2], "addr": s[3],
                                  "offset": s[4], "size": s[5], "link": s[6], "info": s[7], "entsize": s[9]})
            self.sections.append(sec)

    def _read_segments(self, phnum: int) -> None:
        if self.e_phoff == 0 or phnum == 0:
            return
        fmt = self.e + ("IIIIIIII" if self.bits == 32 else "IIQQQQQQ")
        entsize = struct.calcsize(fmt)
        if self.e_phentsize < entsize:
            raise Malformed(f"program header entry size {self.e_phentsize} < {entsize}")
        if phnum == 0xFFFF and self.sections:  # PN_XNUM: real count in section 0's sh_info
            phnum = self.sections[0].info
        if self.e_phoff + phnum * self.e_phentsize > self.size:
            raise Malformed(f"program header table ({phnum} entries) runs past end of file")
        for i in range(phnum):
            p = struct.unpack_from(fmt, self.buf, self.e_phoff + i * self.e_phentsize)
            if self.bits == 32:  # p_type p_offset p_vaddr p_paddr p_filesz p_memsz p_flags p_align
                self.segments.append(Segment(p[0], p[6], p[1], p[2], p[4], p[5]))
            else:  # p_type p_flags p_offset p_vaddr p_paddr p_filesz p_memsz p_align
                self.segments.append(Segment(p[0], p[1], p[2], p[3], p[5], p[6]))

    # -- lookups ---------------------------------------------------------------------------
    def section_data(self, sec: Section) -> memoryview:
        """The section's bytes (empty for NOBITS); Malformed if it lies outside the file."""
        if sec.type == SHT_NOBITS or sec.size == 0:
            return memoryview(b"")
        self.check_range(sec.offset, sec.size, f"section {sec.name or sec.index}")
        return memoryview(self.buf)[sec.offset:sec.offset + sec.size]

    def sections_named(self, name: str) -> list[Section]:
        return [s for s in self.sections if s.name == name]

    def sections_of_type(self, sh_type: int) -> list[Section]:
        return [s for s in self.sections if s.type == sh_type]

    def vaddr_to_offset(self, vaddr: int, size: int = 1) -> int | None:
        """File offset of a virtual address through the PT_LOAD segments (as ld.so maps them)."""
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.vaddr <= vaddr and vaddr + size <= seg.vaddr + seg.filesz:
                off = seg.offset + (vaddr - seg.vaddr)
                if off + size <= self.size:
                    return off
        return None

    @property
    def machine_name(self) -> str:
        return EM_NAMES.get(self.e_machine, f"EM_{self.e_machine}")

    @property
    def type_name(self) -> str:
        return ET_NAMES.get(self.e_type, f"ET_{self.e_type:#x}")

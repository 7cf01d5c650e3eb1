"""What ld.so reads, when the section headers cannot be relied on: the dynamic segment and PT_LOAD.

The loader needs no section header table: a file without one (e_shoff = 0) still loads, imports
its DT_NEEDED libraries and dlopens what its data names. For such a file the tables the reader
works from are rebuilt from PT_DYNAMIC as sections (`synthesize`): DT_SYMTAB (its count from
DT_HASH, a DT_GNU_HASH walk and the relocations' symbol indices), DT_STRTAB, DT_VERSYM,
DT_VERNEED and DT_VERDEF; every other byte of the PT_LOAD segments becomes a data range whose
strings and device code are read by content (`load_gaps`).

For a file with section headers, `check_consistent` compares what both say about the dynamic
linking (the dynamic table, .dynsym and .dynstr against PT_DYNAMIC's pointers): a file whose
structure contradicts itself is refused, never read through the half that looks harmless. And
`load_gaps` gives the bytes of the PT_LOAD segments that no scanned section covers, so data
hidden from the section table (a section header removed, shrunk or retyped) is read all the same.
Section flags, types and names are the file author's: a data section flagged SHF_EXECINSTR or
typed as unwind tables loads and is read by a pointer like any other, so `unread_ranges` gives
every other loaded byte (code, unwind tables) for the library-name scan too; only the dynamic
tables PT_DYNAMIC confirms (their strings are symbol and library names, reported as such) are
left to their own readers.
"""

from __future__ import annotations

import bisect
import struct

import numpy as np

from audit.elf.dynamic import dynamic_entries
from audit.elf.symbols import MAX_ENTRIES
from audit.elf.parse import (PT_DYNAMIC, PT_INTERP, PT_LOAD, SHF_ALLOC, SHF_EXECINSTR, SHT_DYNAMIC,
                             SHT_DYNSYM, SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM,
                             SHT_NOBITS, SHT_PROGBITS, SHT_STRTAB, ElfImage, Malformed, Section)

DT_PLTRELSZ, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_RELA, DT_RELASZ = 2, 4, 5, 6, 7, 8
DT_STRSZ, DT_SYMENT, DT_REL, DT_RELSZ, DT_PLTREL, DT_JMPREL = 10, 11, 17, 18, 20, 23
DT_GNU_HASH, DT_VERSYM, DT_VERDEF, DT_VERNEED = 0x6FFFFEF5, 0x6FFFFFF0, 0x6FFFFFFC, 0x6FFFFFFE
PF_X, PF_W = 1, 2
PT_GNU_EH_FRAME = 0x6474E550


def _new_section(index: int, name: str, sh_type: int, flags: int, addr: int, offset: int, size: int,
                 link: int = 0, entsize: int = 0) -> Section:
    return Section(index, name, sh_type, flags, addr, offset, size, link, 0, entsize)


class _Dynamic:
    """PT_DYNAMIC's entries, with the file offsets of the tables they point at."""

    def __init__(self, img: ElfImage):
        self.img = img
        seg = next((s for s in img.segments if s.type == PT_DYNAMIC), None)
        self.segment = seg
        self.entries = dynamic_entries(img, seg.offset, seg.filesz) if seg is not None else []
        self.tags: dict[int, int] = {}
        for tag, val in self.entries:
            self.tags.setdefault(tag, val)

    def offset(self, tag: int, size: int = 1, what: str = "") -> int | None:
        """File offset of the table DT_<tag> points at; Malformed if it is not in the file."""
        addr = self.tags.get(tag)
        if addr is None:
            return None
        off = self.img.vaddr_to_offset(addr, max(size, 1))
        if off is None:
            raise Malformed(f"{what or f'dynamic tag {tag:#x}'} at address {addr:#x} (size {size:#x}) "
                            "lies outside the file's loaded segments")
        return off

    def u32s(self, off: int, count: int, what: str) -> np.ndarray:
        self.img.check_range(off, 4 * count, what)
        return np.frombuffer(self.img.buf, dtype=self.img.e + "u4", count=count, offset=off)

    def symbol_count(self, entsize: int, sym_off: int, relocations: bool = True) -> int:
        """Entries of DT_SYMTAB: the most any of DT_HASH, DT_GNU_HASH and (`relocations`) the
        relocations imply. The hash tables alone are cheap and cover every import: DT_HASH
        counts all symbols, and DT_GNU_HASH's unhashed imports come before its first bucket."""
        img = self.img
        counts = [0]
        if DT_HASH in self.tags:
            off = self.offset(DT_HASH, 8, "DT_HASH")
            counts.append(int(self.u32s(off, 2, "DT_HASH")[1]))
        if DT_GNU_HASH in self.tags:
            counts.append(self._gnu_hash_count())
        if relocations:
            counts.append(self._reloc_count())
        if DT_HASH not in self.tags and DT_GNU_HASH not in self.tags:
            strtab = self.tags.get(DT_STRTAB, 0)
            if strtab > self.tags[DT_SYMTAB]:  # the usual layout: .dynstr right after .dynsym
                counts.append((strtab - self.tags[DT_SYMTAB]) // entsize)
        count = max(counts)
        if count > MAX_ENTRIES or sym_off + count * entsize > img.size:
            raise Malformed(f"dynamic symbol table claims {count} entries, more than the file holds "
                            f"(or over the {MAX_ENTRIES} limit)")
        return count

    def _gnu_hash_count(self) -> int:
        img = self.img
        off = self.offset(DT_GNU_HASH, 16, "DT_GNU_HASH")
        nbuckets, symoffset, bloom_size, _shift = self.u32s(off, 4, "DT_GNU_HASH").tolist()
        word = img.bits // 8
        buckets_at = off + 16 + bloom_size * word
        if nbuckets > img.size or buckets_at + 4 * nbuckets > img.size:
            raise Malformed("DT_GNU_HASH buckets run past the end of the file")
        buckets = self.u32s(buckets_at, nbuckets, "DT_GNU_HASH buckets")
        last = int(buckets.max()) if nbuckets else 0
        if last < symoffset:
            return symoffset
        chain_at = buckets_at + 4 * nbuckets
        pos = chain_at + 4 * (last - symoffset)
        while True:  # the last chain ends at the entry with its low bit set: bounded by the file
            if pos + 4 > img.size:
                raise Malformed("DT_GNU_HASH chain runs past the end of the file")
            (h,) = struct.unpack_from(img.e + "I", img.buf, pos)
            if h & 1:
                return last + 1
            last += 1
            pos += 4

    def reloc_tables(self) -> list[tuple[int, int, bool]]:
        """(file offset, size, has addend) of DT_RELA, DT_REL and DT_JMPREL."""
        out = []
        for tag, size_tag, rela in ((DT_RELA, DT_RELASZ, True), (DT_REL, DT_RELSZ, False),
                                    (DT_JMPREL, DT_PLTRELSZ, self.tags.get(DT_PLTREL) == DT_RELA)):
            if tag in self.tags and self.tags.get(size_tag):
                size = self.tags[size_tag]
                out.append((self.offset(tag, size, f"relocation table (dynamic tag {tag})"), size, rela))
        return out

    def _reloc_count(self) -> int:
        """One more than the largest symbol index a dynamic relocation names (0 if none)."""
        img = self.img
        best = 0
        for off, size, rela in self.reloc_tables():
            words = (3 if rela else 2)
            u = img.e + ("u8" if img.bits == 64 else "u4")
            n = size // (words * img.bits // 8)
            if n == 0:
                continue
            table = np.frombuffer(img.buf, dtype=u, count=n * words, offset=off).reshape(n, words)
            info = table[:, 1]
            sym = info >> np.uint64(32) if img.bits == 64 else info >> np.uint32(8)
            best = max(best, int(sym.max()) + 1)
        return best if best > 1 else 0


def relative_addend(img: ElfImage):
    """A function: vaddr -> the addend of the RELA relocation that patches it (None if none),
    the relocations read once, on first use."""
    found: dict = {}

    def at(vaddr: int) -> int | None:
        if "table" not in found:
            rows = []
            if img.bits == 64 and img.endian == "little":
                for off, size, rela in _Dynamic(img).reloc_tables():
                    if rela and size >= 24:
                        rows.append(np.frombuffer(img.buf, dtype="<u8", count=size // 24 * 3, offset=off).reshape(-1, 3))
            found["table"] = rows
        for t in found["table"]:
            hit = np.flatnonzero(t[:, 0] == vaddr)
            if len(hit):
                return int(t[hit[0], 2])
        return None
    return at


def synthesize(img: ElfImage) -> list[str]:
    """For a file without section headers: img.sections rebuilt from PT_DYNAMIC (as documented
    above) and img.extra_ranges set to the rest of the PT_LOAD segments. Returns warnings."""
    dyn = _Dynamic(img)
    secs: list[Section] = [_new_section(0, "", 0, 0, 0, 0, 0)]
    if DT_SYMTAB in dyn.tags:
        entsize = dyn.tags.get(DT_SYMENT) or (24 if img.bits == 64 else 16)
        if entsize < (24 if img.bits == 64 else 16):
            raise Malformed(f"DT_SYMENT {entsize} is smaller than a symbol")
        sym_off = dyn.offset(DT_SYMTAB, entsize, "DT_SYMTAB")
        count = dyn.symbol_count(entsize, sym_off)
        if DT_STRTAB not in dyn.tags or DT_STRSZ not in dyn.tags:
            raise Malformed("DT_SYMTAB without DT_STRTAB/DT_STRSZ")
        str_off = dyn.offset(DT_STRTAB, dyn.tags[DT_STRSZ], "DT_STRTAB")
        img.check_range(sym_off, count * entsize, "DT_SYMTAB")
        secs.append(_new_section(1, ".dynsym", SHT_DYNSYM, SHF_ALLOC, dyn.tags[DT_SYMTAB], sym_off,
                                 count * entsize, link=2, entsize=entsize))
        secs.append(_new_section(2, ".dynstr", SHT_STRTAB, SHF_ALLOC, dyn.tags[DT_STRTAB], str_off,
                                 dyn.tags[DT_STRSZ]))
        if DT_VERSYM in dyn.tags:
            off = dyn.offset(DT_VERSYM, 2 * count, "DT_VERSYM")
            secs.append(_new_section(len(secs), ".gnu.version", SHT_GNU_VERSYM, SHF_ALLOC,
                                     dyn.tags[DT_VERSYM], off, 2 * count, link=1, entsize=2))
        for tag, name, sh_type in ((DT_VERNEED, ".gnu.version_r", SHT_GNU_VERNEED),
                                   (DT_VERDEF, ".gnu.version_d", SHT_GNU_VERDEF)):
            if tag in dyn.tags:  # no size recorded: up to the end of its segment (the walk stops at vn_next 0)
                off = dyn.offset(tag, 16, name)
                end = _segment_end(img, off)
                secs.append(_new_section(len(secs), name, sh_type, SHF_ALLOC, dyn.tags[tag], off, end - off,
                                         link=2))
    img.sections = secs
    img.extra_ranges = load_gaps(img, dyn, covered=[])
    img.code_ranges = unread_ranges(img, [(r.offset, r.offset + r.size) for r in img.extra_ranges], dyn)
    return ["no section header table: read through the program headers (PT_DYNAMIC, PT_LOAD)"]


def _segment_end(img: ElfImage, off: int) -> int:
    for seg in img.segments:
        if seg.type == PT_LOAD and seg.offset <= off < seg.offset + seg.filesz:
            return min(seg.offset + seg.filesz, img.size)
    return off


def _structural(img: ElfImage, dyn: _Dynamic) -> list[tuple[int, int]]:
    """File ranges of the dynamic tables (_tables) and of the unwind tables."""
    out = _tables(img, dyn)
    for seg in img.segments:
        if seg.type == PT_GNU_EH_FRAME:  # unwind tables, like code: the header and its .eh_frame
            out.append((seg.offset, seg.offset + seg.filesz))
            frame = _eh_frame(img, seg)
            if frame is not None:
                out.append(frame)
    return out


def _tables(img: ElfImage, dyn: _Dynamic) -> list[tuple[int, int]]:
    """File ranges of the tables PT_DYNAMIC points at (their strings are symbol and library
    names, reported as such) and of PT_DYNAMIC and PT_INTERP themselves."""
    out = []
    for sec in img.sections:
        if sec.index and sec.type in (SHT_DYNSYM, SHT_STRTAB) and sec.flags & SHF_ALLOC \
                and _confirmed(dyn, sec):
            out.append((sec.offset, sec.offset + sec.size))
    for off, size, _ in dyn.reloc_tables():
        out.append((off, off + size))
    for seg in img.segments:
        if seg.type in (PT_DYNAMIC, PT_INTERP):
            out.append((seg.offset, seg.offset + seg.filesz))
    return out


def _eh_frame(img: ElfImage, hdr) -> tuple[int, int] | None:
    """The file range of the section .eh_frame_hdr's eh_frame_ptr points at (pc-relative sdata4,
    as the linkers write it), if a section starts there."""
    if hdr.filesz < 8 or hdr.offset + 8 > img.size or img.buf[hdr.offset + 1] != 0x1B:
        return None
    (rel,) = struct.unpack_from(img.e + "i", img.buf, hdr.offset + 4)
    addr = hdr.vaddr + 4 + rel
    sec = next((s for s in img.sections if s.addr == addr and s.flags & SHF_ALLOC and s.size), None)
    return None if sec is None else (sec.offset, sec.offset + sec.size)


def _confirmed(dyn: _Dynamic, sec: Section) -> bool:
    """A .dynsym/.dynstr is left out of the data scan only where PT_DYNAMIC points at it."""
    tag = DT_SYMTAB if sec.type == SHT_DYNSYM else DT_STRTAB
    try:
        return dyn.offset(tag) == sec.offset
    except Malformed:
        return False


def load_gaps(img: ElfImage, dyn: _Dynamic | None = None, covered: list[tuple[int, int]] | None = None) -> list[Section]:
    """The bytes of the PT_LOAD segments outside `covered` (file ranges already read as data or
    device code) and outside the dynamic tables and code (see _structural), as data ranges named
    PT_LOAD[i] for the string and device-code scans. Code counts as covered only where an
    executable section lies in an executable segment."""
    if dyn is None:
        dyn = _Dynamic(img)
    skip = list(covered or []) + _structural(img, dyn)
    exec_segs = [s for s in img.segments if s.type == PT_LOAD and s.flags & PF_X]
    for sec in img.sections:
        if sec.type == SHT_PROGBITS and sec.flags & SHF_EXECINSTR and sec.size and any(
                s.offset <= sec.offset and sec.offset + sec.size <= s.offset + s.filesz for s in exec_segs):
            skip.append((sec.offset, sec.offset + sec.size))
    return [_gap(i, seg, a, b) for i, seg, a, b in _outside(img, skip)]


def _outside(img: ElfImage, skip: list[tuple[int, int]]):
    """(segment index, segment, start, end) of the PT_LOAD bytes in the file outside `skip`."""
    skip = sorted(skip)
    for i, seg in enumerate(img.segments):
        if seg.type != PT_LOAD or not seg.filesz:
            continue
        lo, hi = seg.offset, min(seg.offset + seg.filesz, img.size)
        pos = lo
        for a, b in skip:
            if b <= pos or a >= hi:
                continue
            if a > pos:
                yield i, seg, pos, a
            pos = max(pos, b)
        if pos < hi:
            yield i, seg, pos, hi


def unread_ranges(img: ElfImage, read: list[tuple[int, int]], dyn: _Dynamic | None = None) -> list[Section]:
    """The PT_LOAD bytes outside `read` (what the data scan reads: data sections, device code,
    load_gaps) and outside the dynamic tables (_tables): code and unwind tables whatever their
    sections say, one range per section they lie in (named after it; PT_LOAD[i] where none),
    flagged SHF_EXECINSTR. They are scanned for library names (every loaded byte a dlopen
    could be handed is read), and for device code where names cannot be trusted."""
    if dyn is None:
        dyn = _Dynamic(img)
    bounds = sorted((s.offset, s.offset + s.size, s.name or f"[section {s.index}]") for s in img.sections
                    if s.index and s.flags & SHF_ALLOC and s.type != SHT_NOBITS and s.size)
    starts = [b[0] for b in bounds]
    out: list[Section] = []
    for i, seg, lo, hi in _outside(img, read + _tables(img, dyn)):
        pos = lo
        k = max(bisect.bisect_right(starts, lo) - 1, 0)
        while pos < hi:
            while k < len(bounds) and bounds[k][1] <= pos:
                k += 1
            if k < len(bounds) and bounds[k][0] <= pos:  # inside a section: up to its end
                end, name = min(hi, bounds[k][1]), bounds[k][2]
            else:  # before the next section: no section shows these bytes
                end = min(hi, bounds[k][0]) if k < len(bounds) else hi
                name = f"PT_LOAD[{i}]"
            out.append(_new_section(-1, name, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR,
                                    seg.vaddr + (pos - seg.offset), pos, end - pos))
            pos = end
    return out


def _gap(i: int, seg, start: int, end: int) -> Section:
    return _new_section(-1, f"PT_LOAD[{i}]", SHT_PROGBITS, SHF_ALLOC, seg.vaddr + (start - seg.offset),
                        start, end - start)


def check_consistent(img: ElfImage) -> None:
    """Malformed if the section table and PT_DYNAMIC describe different dynamic linking: a
    .dynamic section with other entries than PT_DYNAMIC, a .dynsym or its string table elsewhere
    than DT_SYMTAB / DT_STRTAB, or a .dynsym shorter than the symbol count PT_DYNAMIC implies."""
    dyn = _Dynamic(img)
    if dyn.segment is None:
        return
    for sec in img.sections:
        if sec.type == SHT_DYNAMIC and sec.size and sec.offset != dyn.segment.offset:
            if dynamic_entries(img, sec.offset, sec.size) != dyn.entries:
                raise Malformed("structure contradicts itself: the .dynamic section and PT_DYNAMIC differ")
        if sec.type == SHT_DYNSYM and DT_SYMTAB in dyn.tags:
            entsize = sec.entsize or (24 if img.bits == 64 else 16)
            off = dyn.offset(DT_SYMTAB, entsize, "DT_SYMTAB")
            if off != sec.offset:
                raise Malformed("structure contradicts itself: .dynsym is not where DT_SYMTAB points")
            if sec.size // entsize < dyn.symbol_count(entsize, off, relocations=False):
                raise Malformed("structure contradicts itself: .dynsym holds fewer symbols than "
                                "PT_DYNAMIC's hash table and relocations name")
            if 0 < sec.link < len(img.sections) and DT_STRTAB in dyn.tags \
                    and img.sections[sec.link].offset != dyn.offset(DT_STRTAB, 1, "DT_STRTAB"):
                raise Malformed("structure contradicts itself: .dynstr is not where DT_STRTAB points")

"""The dynamic section, symbol versioning tables, PT_INTERP and the GNU build-id note.

The dynamic section is taken from PT_DYNAMIC and its strings through DT_STRTAB mapped by the
PT_LOAD segments, as ld.so reads them (a doctored section table cannot hide a DT_NEEDED);
the `.dynamic` section and its sh_link string table are the fallback for files without
program headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from audit.elf.model import VersionNeed
from audit.elf.parse import (PT_DYNAMIC, PT_INTERP, PT_NOTE, SHT_DYNAMIC, SHT_GNU_VERDEF,
                             SHT_GNU_VERNEED, SHT_NOTE, ElfImage, Malformed, decode)

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
# Loads DT_NEEDED does not list. Filter libraries (ld --filter, --auxiliary): glibc's ld.so loads
# the named library with the object, runs its constructors and binds the object's symbols to it, a
# DT_FILTER's always (its absence is a load error), a DT_AUXILIARY's where it is found. Audit
# libraries (ld --audit, --depaudit; ':'-separated lists): ld.so loads them, constructors and all,
# for the main program alone (glibc 2.32 and later), so they count where the object has PT_INTERP.
DT_AUXILIARY, DT_FILTER, DT_DEPAUDIT, DT_AUDIT = 0x7FFFFFFD, 0x7FFFFFFF, 0x6FFFFEFB, 0x6FFFFEFC
FILTER_TAGS = {DT_AUXILIARY: "DT_AUXILIARY", DT_FILTER: "DT_FILTER"}
AUDIT_TAGS = {DT_AUDIT: "DT_AUDIT", DT_DEPAUDIT: "DT_DEPAUDIT"}
NT_GNU_BUILD_ID = 3


@dataclass
class DynamicInfo:
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    filters: list[tuple[str, str]] = field(default_factory=list)  # (DT_FILTER | DT_AUXILIARY, library)
    audit: list[tuple[str, str]] = field(default_factory=list)  # (DT_AUDIT | DT_DEPAUDIT, library)
    warnings: list[str] = field(default_factory=list)


def _dynamic_location(img: ElfImage) -> tuple[int, int] | None:
    for seg in img.segments:
        if seg.type == PT_DYNAMIC:
            return seg.offset, seg.filesz
    for sec in img.sections_of_type(SHT_DYNAMIC):
        return sec.offset, sec.size
    return None


def dynamic_entries(img: ElfImage, off: int, size: int) -> list[tuple[int, int]]:
    """The (tag, value) entries of the dynamic table at file offset `off`, up to DT_NULL."""
    img.check_range(off, size, "dynamic section")
    fmt = img.e + ("iI" if img.bits == 32 else "qQ")
    ent = struct.calcsize(fmt)
    entries = []
    for i in range(size // ent):
        tag, val = struct.unpack_from(fmt, img.buf, off + i * ent)
        if tag == DT_NULL:
            break
        entries.append((tag, val))
    return entries


def read_dynamic(img: ElfImage) -> DynamicInfo:
    info = DynamicInfo()
    loc = _dynamic_location(img)
    if loc is None:
        return info
    entries = dynamic_entries(img, *loc)
    strtab_addr = next((v for t, v in entries if t == DT_STRTAB), None)
    strsz = next((v for t, v in entries if t == DT_STRSZ), None)
    str_off = str_size = None
    if strtab_addr is not None and strsz is not None:
        str_off = img.vaddr_to_offset(strtab_addr, strsz)
        str_size = strsz
    if str_off is None:  # no PT_LOAD mapping (e.g. no program headers): the section's sh_link
        for sec in img.sections_of_type(SHT_DYNAMIC):
            if 0 < sec.link < len(img.sections):
                link = img.sections[sec.link]
                if link.offset + link.size <= img.size:
                    str_off, str_size = link.offset, link.size
            break
    wanted = [(t, v) for t, v in entries
              if t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH) or t in FILTER_TAGS or t in AUDIT_TAGS]
    if wanted and str_off is None:
        raise Malformed("dynamic string table (DT_STRTAB) not found in the file")

    def name(val: int) -> str:
        raw = img.cstring(str_off, str_size, val)
        if raw is None:
            raise Malformed(f"dynamic entry string offset {val:#x} outside the string table")
        return decode(raw)

    for tag, val in wanted:
        if tag == DT_NEEDED:
            info.needed.append(name(val))
        elif tag == DT_SONAME:
            info.soname = name(val)
        elif tag == DT_RPATH:
            info.rpath.extend(p for p in name(val).split(":") if p)
        elif tag == DT_RUNPATH:
            info.runpath.extend(p for p in name(val).split(":") if p)
        elif tag in FILTER_TAGS:
            info.filters.append((FILTER_TAGS[tag], name(val)))
        elif tag in AUDIT_TAGS:
            info.audit.extend((AUDIT_TAGS[tag], n) for n in name(val).split(":") if n)
    return info


def _strtab_of(img: ElfImage, sec) -> tuple[int, int]:
    if not 0 < sec.link < len(img.sections):
        raise Malformed(f"section {sec.name} links to invalid string table {sec.link}")
    link = img.sections[sec.link]
    img.check_range(link.offset, link.size, f"string table of {sec.name}")
    return link.offset, link.size


def _str(img: ElfImage, tab: tuple[int, int], index: int, what: str) -> str:
    raw = img.cstring(tab[0], tab[1], index)
    if raw is None:
        raise Malformed(f"{what} name offset {index:#x} outside its string table")
    return decode(raw)


def read_version_needs(img: ElfImage) -> tuple[list[VersionNeed], dict[int, tuple[str, str]]]:
    """`.gnu.version_r`: the needs, and version index -> (version name, file) for .gnu.version."""
    needs: list[VersionNeed] = []
    by_index: dict[int, tuple[str, str]] = {}
    for sec in img.sections_of_type(SHT_GNU_VERNEED):
        tab = _strtab_of(img, sec)
        img.check_range(sec.offset, sec.size, "section .gnu.version_r")
        end = sec.offset + sec.size
        pos, budget = sec.offset, sec.size // 16 + 1  # each Verneed is >= 16 bytes: bounds the walk
        while budget > 0 and pos + 16 <= end:
            budget -= 1
            vn_version, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from(img.e + "HHIII", img.buf, pos)
            file = _str(img, tab, vn_file, "verneed file")
            versions = []
            apos = pos + vn_aux
            for _ in range(min(vn_cnt, sec.size // 16 + 1)):
                if not sec.offset <= apos <= end - 16:
                    raise Malformed("verneed auxiliary entry outside .gnu.version_r")
                _hash, _flags, other, vna_name, vna_next = struct.unpack_from(img.e + "IHHII", img.buf, apos)
                vname = _str(img, tab, vna_name, "verneed version")
                versions.append(vname)
                by_index[other & 0x7FFF] = (vname, file)
                if vna_next == 0:
                    break
                apos += vna_next
            needs.append(VersionNeed(file=file, versions=tuple(versions)))
            if vn_next == 0:
                break
            pos += vn_next
    return needs, by_index


def read_version_defs(img: ElfImage) -> dict[int, str]:
    """`.gnu.version_d`: version index -> the name this file defines it as (indices 0 and 1,
    local and global, are no versions)."""
    out: dict[int, str] = {}
    for sec in img.sections_of_type(SHT_GNU_VERDEF):
        tab = _strtab_of(img, sec)
        img.check_range(sec.offset, sec.size, "section .gnu.version_d")
        end = sec.offset + sec.size
        pos, budget = sec.offset, sec.size // 20 + 1
        while budget > 0 and pos + 20 <= end:
            budget -= 1
            _ver, flags, ndx, cnt, _hash, aux, nxt = struct.unpack_from(img.e + "HHHHIII", img.buf, pos)
            # the VER_FLG_BASE entry names the file itself (index 1: unversioned), not a version
            if cnt and not flags & 1 and (ndx & 0x7FFF) > 1 and sec.offset <= pos + aux <= end - 8:
                vda_name, _ = struct.unpack_from(img.e + "II", img.buf, pos + aux)
                out[ndx & 0x7FFF] = _str(img, tab, vda_name, "verdef")
            if nxt == 0:
                break
            pos += nxt
    return out


def read_interpreter(img: ElfImage) -> str | None:
    for seg in img.segments:
        if seg.type == PT_INTERP:
            raw = img.bytes_at(seg.offset, seg.filesz, "PT_INTERP")
            return decode(raw.split(b"\0", 1)[0])
    return None


def each_note(img: ElfImage, off: int, size: int):
    """(file offset, owner, type, descriptor offset, descriptor size) of each note in
    [off, off+size); descriptors are not copied (a caller reads only the notes it wants)."""
    img.check_range(off, size, "note")
    pos, end = off, off + size
    while pos + 12 <= end:
        namesz, descsz, ntype = struct.unpack_from(img.e + "III", img.buf, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        nxt = desc_at + ((descsz + 3) & ~3)
        if nxt > end or nxt <= pos:
            return
        yield pos, bytes(img.buf[name_at:name_at + namesz]).rstrip(b"\0"), ntype, desc_at, descsz
        pos = nxt


def read_build_id(img: ElfImage) -> str | None:
    places = [(s.offset, s.size) for s in img.sections_of_type(SHT_NOTE)]
    places += [(p.offset, p.filesz) for p in img.segments if p.type == PT_NOTE]
    for off, size in places:
        if off + size > img.size:
            continue
        for _, name, ntype, desc_at, descsz in each_note(img, off, size):
            if name == b"GNU" and ntype == NT_GNU_BUILD_ID and descsz:
                return bytes(img.buf[desc_at:desc_at + descsz]).hex()
    return None

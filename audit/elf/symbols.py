r"""Symbol tables in bulk: numpy structured arrays over the section bytes, no per-symbol objects.

Only the symbols worth reporting are kept (as `SymbolColumns`, whole columns rather than a
`Symbol` object each): imports from `.dynsym` always (from `.symtab`
too when the file has no `.dynsym`, as in relocatable objects), and any symbol whose name matches
the caller's pattern. Names are resolved only for those: the pattern runs once over the whole
string table (`audit.elf.textscan`), the matching string ranges are joined to st_name with numpy
(searchsorted), and only names the scan cannot settle are checked one by one.

Pattern semantics: exactly `pattern.search(name)` on each name alone (bytes): `^`/`\A` anchor
at the name's start, `$`/`\Z` at its end. MULTILINE patterns are allowed but take the slow,
name-by-name path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import numpy as np

from audit.elf.model import SymbolColumns
from audit.elf.parse import SHN_UNDEF, SHT_DYNSYM, SHT_SYMTAB, ElfImage, Malformed, decode, find_nul
from audit.elf.textscan import matching_strings

STT = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 5: "COMMON", 6: "TLS",
       10: "GNU_IFUNC"}
STB = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "GNU_UNIQUE"}
# Limits against hostile tables (real libraries stay far below: libtorch_cpu.so's .symtab has
# 530k entries, of which a few thousand are reported).
MAX_ENTRIES = 16_000_000  # entries of one symbol table
MAX_KEPT = 1_000_000  # symbols of one table kept for the report


def sym_dtype(bits: int, e: str) -> np.dtype:
    if bits == 64:
        return np.dtype([("st_name", e + "u4"), ("st_info", "u1"), ("st_other", "u1"),
                         ("st_shndx", e + "u2"), ("st_value", e + "u8"), ("st_size", e + "u8")])
    return np.dtype([("st_name", e + "u4"), ("st_value", e + "u4"), ("st_size", e + "u4"),
                     ("st_info", "u1"), ("st_other", "u1"), ("st_shndx", e + "u2")])


@dataclass
class SymbolTable:
    name: str  # ".dynsym" / ".symtab" (by type, whatever the section is called)
    index: int  # section index (for .gnu.version, which parallels .dynsym)
    syms: np.ndarray
    str_off: int
    str_size: int

    def __len__(self) -> int:
        return len(self.syms)


def load_tables(img: ElfImage) -> list[SymbolTable]:
    out = []
    dt = sym_dtype(img.bits, img.e)
    for sec in img.sections:
        if sec.type not in (SHT_DYNSYM, SHT_SYMTAB):
            continue
        label = ".dynsym" if sec.type == SHT_DYNSYM else ".symtab"
        entsize = sec.entsize or dt.itemsize
        if entsize < dt.itemsize:
            raise Malformed(f"{label} entry size {entsize} < {dt.itemsize}")
        img.check_range(sec.offset, sec.size, f"symbol table {label}")
        count = sec.size // entsize
        if count > MAX_ENTRIES:
            raise Malformed(f"{label} claims {count} entries, over the {MAX_ENTRIES} limit")
        if not 0 < sec.link < len(img.sections):
            raise Malformed(f"{label} links to invalid string table index {sec.link}")
        strsec = img.sections[sec.link]
        img.check_range(strsec.offset, strsec.size, f"string table of {label}")
        if count == 0:
            syms = np.zeros(0, dtype=dt)
        elif entsize == dt.itemsize:
            syms = np.frombuffer(img.buf, dtype=dt, count=count, offset=sec.offset)
        else:  # unusual but legal: a larger entsize; read it strided
            syms = np.ndarray((count,), dtype=dt, buffer=img.buf, offset=sec.offset, strides=(entsize,))
        out.append(SymbolTable(label, sec.index, syms, strsec.offset, strsec.size))
    return out


def select(img: ElfImage, table: SymbolTable, pattern: re.Pattern[bytes] | None,
           keep_imports: bool, warnings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the entries to keep, sorted; their names' end offsets in the string table,
    or -1 where not known yet)."""
    syms = table.syms
    if len(syms) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    nm = syms["st_name"]
    bad = nm >= table.str_size
    if bad.any():
        warnings.append(f"{table.name}: {int(bad.sum())} symbol name offsets outside the string table")
    keep = np.zeros(len(syms), dtype=bool)
    if keep_imports:
        keep |= (syms["st_shndx"] == SHN_UNDEF) & (nm != 0) & ~bad
    name_end = np.full(len(syms), -1, dtype=np.int64)
    if pattern is not None:
        keep |= _pattern_mask(img, table, pattern, nm, bad, name_end)
        if pattern.search(b"") is not None:  # a pattern that accepts the empty name
            keep |= (nm == 0) & ~bad
    keep[0] = False  # the null symbol is never reported
    idx = np.flatnonzero(keep)
    if len(idx) > MAX_KEPT:  # refused before a name is made: each kept one costs ~200 bytes
        raise Malformed(f"{table.name}: {len(idx)} symbols to report (imports and names the policy "
                        f"selects), over the {MAX_KEPT} limit")
    return idx, name_end[idx]


def _pattern_mask(img, table, pattern, nm, bad, name_end) -> np.ndarray:
    mask = np.zeros(len(nm), dtype=bool)
    if table.str_size == 0:
        return mask
    ok = ~bad & (nm != 0)
    found = matching_strings(img.buf, table.str_off, table.str_size, pattern)
    if found is None:  # anchored pattern: no bulk scan, every name is checked on its own
        check = ok
    else:
        starts, ends, final = found
        check = np.zeros(len(nm), dtype=bool)
        # (in place where it can: each new array of a large table's size costs a page fault per
        # 4 KiB in a freshly forked reader)
        if len(starts):
            kk = np.searchsorted(starts, nm, side="right")
            kk -= 1
            inside = ok & (kk >= 0)
            np.maximum(kk, 0, out=kk)
            inside &= nm < ends[kk]
            exact = inside & (nm == starts[kk]) & final[kk]
            mask |= exact
            check |= inside & ~exact
            name_end[inside] = ends[kk[inside]]  # a name inside string k ends where k ends
            del kk
        # A name that starts inside another string (the linker shares string tails) was seen by
        # the scan only as part of the longer string: check it on its own.
        blob = np.frombuffer(img.buf, dtype=np.uint8, count=table.str_size, offset=table.str_off)
        before = nm.astype(np.int64)
        before -= 1
        prev = blob[np.clip(before, 0, table.str_size - 1, out=before)]
        del before
        check |= ok & (nm > 0) & (prev != 0) & ~mask
    verdict: dict[int, bool] = {}
    search = pattern.search
    for i in np.flatnonzero(check).tolist():
        off = int(nm[i])
        v = verdict.get(off)
        if v is None:
            raw = img.cstring(table.str_off, table.str_size, off) or b""
            v = verdict[off] = search(raw) is not None
        if v:
            mask[i] = True
    return mask


def name_ends(img: ElfImage, table: SymbolTable, idx: np.ndarray) -> np.ndarray:
    """End offsets (at the NUL, or the table's end) of the names of entries `idx`, in bulk:
    the string table's NULs are located once with numpy. Offsets outside the table give -1.
    For the small tables of embedded code objects, where names are asked for in bulk."""
    offs = table.syms["st_name"][idx].astype(np.int64)
    size = table.str_size
    if size == 0:
        return np.full(len(offs), -1, dtype=np.int64)
    blob = np.frombuffer(img.buf, dtype=np.uint8, count=size, offset=table.str_off)
    nuls = np.append(np.flatnonzero(blob == 0), size)
    ends = nuls[np.searchsorted(nuls, np.minimum(offs, size))]
    return np.where(offs < size, ends, -1)


def names_ending(img: ElfImage, table: SymbolTable, idx: np.ndarray, suffix: bytes) -> list[str]:
    """Decoded names of entries `idx` that end with `suffix` (longer than it), in table order;
    only those names are copied out of the string table."""
    if len(idx) == 0:
        return []
    ends = name_ends(img, table, idx)
    offs = table.syms["st_name"][idx].astype(np.int64)
    keep = (ends >= 0) & (ends - offs > len(suffix))
    blob = np.frombuffer(img.buf, dtype=np.uint8, count=table.str_size, offset=table.str_off)
    for k, ch in enumerate(reversed(suffix)):
        at = np.where(keep, ends - 1 - k, 0)
        keep &= blob[at] == ch
    return names_at(img, table, offs[keep].tolist(), ends[keep].tolist())


_KINDS = [STT.get(i, f"STT_{i}") for i in range(16)]
_BINDS = [STB.get(i, f"STB_{i}") for i in range(16)]


def names_at(img: ElfImage, table: SymbolTable, offsets: list[int], ends: list[int]) -> list[str]:
    """Decoded names at string-table offsets (ends: known end offsets, or -1 to look them up)."""
    return split_names(names_text(img, table, offsets, ends), len(offsets))


def split_names(text: str, count: int) -> list[str]:
    """names_text's string back as its `count` names."""
    return text.split("\0") if count else []


def names_text(img: ElfImage, table: SymbolTable, offsets: list[int], ends: list[int]) -> str:
    """names_at's names joined by NULs, as one string (what a helper process sends as it is)."""
    # one decode for all: NUL never occurs inside a name, so it separates them safely
    return decode(names_raw(img, table, offsets, ends))


def names_raw(img: ElfImage, table: SymbolTable, offsets: list[int], ends: list[int]) -> bytes:
    """names_text's bytes before decoding: the raw names joined by NULs."""
    buf, base, size = img.buf, table.str_off, table.str_size
    raws = []
    for off, end in zip(offsets, ends):
        if off >= size:
            raws.append(b"")
            continue
        if end < 0:
            e = find_nul(buf, base + off, base + size)
            end = size if e < 0 else e - base
        raws.append(bytes(buf[base + off:base + end]))
    return b"\0".join(raws)


def symbol_columns(img: ElfImage, table: SymbolTable, idx: np.ndarray,
                   versions: dict[int, tuple[str, str | None]] | None = None,
                   versym: np.ndarray | None = None, ends: np.ndarray | None = None,
                   names: list[str] | None = None) -> dict[str, list]:
    """The columns of SymbolColumns (audit.elf.model) for entries `idx` (`names`: theirs, when
    already read, as audit.elf.prescan does): whole numpy columns turned into lists, no Python
    statement per symbol."""
    if len(idx) == 0:
        return {"name": []}
    sub = table.syms[idx]
    if names is None:
        offsets = sub["st_name"].tolist()
        names = names_at(img, table, offsets, ends.tolist() if ends is not None else [-1] * len(offsets))
    info = sub["st_info"]
    out = {"name": names, "defined": (sub["st_shndx"] != SHN_UNDEF).tolist(), "table": [table.name] * len(idx),
           "kind": list(map(_KINDS.__getitem__, (info & 0xF).tolist())),
           "bind": list(map(_BINDS.__getitem__, (info >> 4).tolist()))}
    if versym is not None and versions and len(versym) == len(table.syms):
        pairs = list(map(versions.get, (versym[idx] & 0x7FFF).tolist(), repeat((None, None), len(idx))))
        out["version"] = list(map(itemgetter(0), pairs))
        out["version_file"] = list(map(itemgetter(1), pairs))
    return out

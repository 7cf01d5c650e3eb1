"""The native libraries a managed (.NET) assembly loads: its CLI metadata's P/Invoke tables.

A method declared `[DllImport("cublas64_12.dll")] static extern ...` is a row of the ImplMap
table (the entry point's name and a ModuleRef); the runtime loads that ModuleRef's library the
first time the method is called, as a delay-load import is loaded (ECMA-335 II.22.22, II.22.31).
The assembly's own import directory names mscoree.dll alone, so the load is in these tables only.

Read (ECMA-335 II.24): the CLI header (data directory 14), the metadata root ("BSJB") and its
stream headers, the table stream (#~, or #- uncompressed) up to ImplMap (table 0x1C), and the
#Strings heap. The tables before ImplMap are skipped by their row sizes, which depend on the
heaps' index widths and on the row counts of every table a coded index can name, so all of those
are read. Fail closed: a table number past the ones ECMA-335 defines, a count or offset past the
stream, a name past the heap raise ValueError (the file's verdict becomes an error).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from audit.elf.model import StringHit

DIR_CLR = 14
BSJB = 0x424A5342
MAX_STREAMS = 16
MAX_ROWS = 1 << 24  # rows of one table (a 3-byte row index is the format's own bound)
MAX_USER_STRINGS = 1 << 20  # entries of the #US heap read
MAX_LIBRARY_HITS = 100_000
# a library file name in a string literal: any platform's (a managed assembly runs anywhere)
LIBRARY_NAME = re.compile(r"[A-Za-z0-9_.+\-]*[A-Za-z0-9_+\-]\.(?:dll|so(?:\.[0-9]+)*|dylib)(?![A-Za-z0-9_+\-])", re.IGNORECASE)
LAST_TABLE = 0x2C  # GenericParamConstraint: the highest table number ECMA-335 defines
TYPE_REF, MEMBER_REF, MODULE_REF, IMPL_MAP = 0x01, 0x0A, 0x1A, 0x1C
# the runtime's own load-by-name calls (.NET Core 3 and later), as (type, method): a string the
# assembly holds can then be a library it loads, as a dlopen string is
NATIVE_LOADERS = {("NativeLibrary", "Load"), ("NativeLibrary", "TryLoad")}


@dataclass
class ClrInfo:
    """What a managed assembly's metadata says it loads."""

    pinvoke: list[tuple[str, list[str]]] = field(default_factory=list)  # (library, entry points)
    loaders: list[str] = field(default_factory=list)  # "NativeLibrary.Load", ...: calls it makes
    user_strings: tuple[int, int] | None = None  # the #US heap (UTF-16 literals): file offset, size

# coded indexes (II.24.2.6): the tables they can name (None: an unused tag) and their tag bits
TYPE_DEF_OR_REF = ((0x02, 0x01, 0x1B), 2)
HAS_CONSTANT = ((0x04, 0x08, 0x17), 2)
HAS_CUSTOM_ATTRIBUTE = ((0x06, 0x04, 0x01, 0x02, 0x08, 0x09, 0x0A, 0x00, 0x0E, 0x17, 0x14, 0x11, 0x1A,
                         0x1B, 0x20, 0x23, 0x26, 0x27, 0x28, 0x2A, 0x2C, 0x2B), 5)
HAS_FIELD_MARSHAL = ((0x04, 0x08), 1)
HAS_DECL_SECURITY = ((0x02, 0x06, 0x20), 2)
MEMBER_REF_PARENT = ((0x02, 0x01, 0x1A, 0x06, 0x1B), 3)
HAS_SEMANTICS = ((0x14, 0x17), 1)
METHOD_DEF_OR_REF = ((0x06, 0x0A), 1)
MEMBER_FORWARDED = ((0x04, 0x06), 1)
CUSTOM_ATTRIBUTE_TYPE = ((None, None, 0x06, 0x0A, None), 3)
RESOLUTION_SCOPE = ((0x00, 0x1A, 0x23, 0x01), 2)

# the columns of tables 0x00..0x1C: an int (bytes), "s" (#Strings), "g" (#GUID), "b" (#Blob), a
# table number (a simple index) or a coded index
COLUMNS = {
    0x00: (2, "s", "g", "g", "g"),                                      # Module
    0x01: (RESOLUTION_SCOPE, "s", "s"),                                 # TypeRef
    0x02: (4, "s", "s", TYPE_DEF_OR_REF, ("t", 0x04), ("t", 0x06)),     # TypeDef
    0x03: (("t", 0x04),),                                               # FieldPtr
    0x04: (2, "s", "b"),                                                # Field
    0x05: (("t", 0x06),),                                               # MethodPtr
    0x06: (4, 2, 2, "s", "b", ("t", 0x08)),                             # MethodDef
    0x07: (("t", 0x08),),                                               # ParamPtr
    0x08: (2, 2, "s"),                                                  # Param
    0x09: (("t", 0x02), TYPE_DEF_OR_REF),                               # InterfaceImpl
    0x0A: (MEMBER_REF_PARENT, "s", "b"),                                # MemberRef
    0x0B: (1, 1, HAS_CONSTANT, "b"),                                    # Constant
    0x0C: (HAS_CUSTOM_ATTRIBUTE, CUSTOM_ATTRIBUTE_TYPE, "b"),           # CustomAttribute
    0x0D: (HAS_FIELD_MARSHAL, "b"),                                     # FieldMarshal
    0x0E: (2, HAS_DECL_SECURITY, "b"),                                  # DeclSecurity
    0x0F: (2, 4, ("t", 0x02)),                                          # ClassLayout
    0x10: (4, ("t", 0x04)),                                             # FieldLayout
    0x11: ("b",),                                                       # StandAloneSig
    0x12: (("t", 0x02), ("t", 0x14)),                                   # EventMap
    0x13: (("t", 0x14),),                                               # EventPtr
    0x14: (2, "s", TYPE_DEF_OR_REF),                                    # Event
    0x15: (("t", 0x02), ("t", 0x17)),                                   # PropertyMap
    0x16: (("t", 0x17),),                                               # PropertyPtr
    0x17: (2, "s", "b"),                                                # Property
    0x18: (2, ("t", 0x06), HAS_SEMANTICS),                              # MethodSemantics
    0x19: (("t", 0x02), METHOD_DEF_OR_REF, METHOD_DEF_OR_REF),          # MethodImpl
    0x1A: ("s",),                                                       # ModuleRef
    0x1B: ("b",),                                                       # TypeSpec
    0x1C: (2, MEMBER_FORWARDED, "s", ("t", MODULE_REF)),                # ImplMap
}


def _u(buf, at: int, n: int) -> int:
    return int.from_bytes(buf[at:at + n], "little")


def read_clr(pe) -> ClrInfo | None:
    """The P/Invoke libraries of a managed PE file (`pe`: audit/pe/reader.py's reader), as
    (library as the assembly names it, [entry points]) for every ModuleRef (one no ImplMap row
    uses is listed too, with no entry points: the runtime can still be asked to load it), its
    NativeLibrary load calls and its #US heap; None for a native file."""
    rva, size = pe.dir(DIR_CLR)
    if not rva:
        return None
    buf = pe.buf
    hdr = pe.off(rva, 16, "CLI header")
    md_rva, md_size = struct.unpack_from("<II", buf, hdr + 8)
    root = pe.off(md_rva, md_size, "CLI metadata")
    if md_size < 20 or _u(buf, root, 4) != BSJB:
        raise ValueError("CLI metadata has no BSJB signature")
    vlen = _u(buf, root + 12, 4)
    if vlen > 256 or 16 + vlen + 4 > md_size:
        raise ValueError(f"CLI metadata version string of {vlen} bytes")
    at = root + 16 + vlen
    nstreams = _u(buf, at + 2, 2)
    if nstreams > MAX_STREAMS:
        raise ValueError(f"CLI metadata names {nstreams} streams")
    at += 4
    streams: dict[str, tuple[int, int]] = {}
    end = root + md_size
    for _ in range(nstreams):
        if at + 8 > end:
            raise ValueError("CLI stream headers run past the metadata")
        off, sz = _u(buf, at, 4), _u(buf, at + 4, 4)
        stop = bytes(buf[at + 8:min(at + 40, end)]).find(b"\0")
        if stop < 0:
            raise ValueError("CLI stream name unterminated")
        name = bytes(buf[at + 8:at + 8 + stop]).decode("ascii", "replace")
        if off + sz > md_size:
            raise ValueError(f"CLI stream {name} runs past the metadata")
        streams[name] = (root + off, sz)
        at += 8 + (stop + 4) // 4 * 4
    tables = streams.get("#~") or streams.get("#-")
    if tables is None:
        raise ValueError("CLI metadata has no table stream (#~)")
    heap = streams.get("#Strings", (0, 0))
    info = _read_tables(buf, tables, heap)
    info.user_strings = streams.get("#US")
    return info


def _read_tables(buf, tables: tuple[int, int], heap: tuple[int, int]) -> ClrInfo:
    t, tsize = tables
    if tsize < 24:
        raise ValueError("CLI table stream too short")
    heap_sizes, valid = buf[t + 6], _u(buf, t + 8, 8)
    if valid >> (LAST_TABLE + 1):
        raise ValueError(f"CLI metadata has tables past 0x{LAST_TABLE:x} (valid mask {valid:#x}): not read")
    rows = [0] * (LAST_TABLE + 1)
    at = t + 24
    for i in range(LAST_TABLE + 1):
        if valid >> i & 1:
            if at + 4 > t + tsize:
                raise ValueError("CLI table row counts run past the stream")
            rows[i] = _u(buf, at, 4)
            if rows[i] > MAX_ROWS:
                raise ValueError(f"CLI table 0x{i:x} claims {rows[i]} rows")
            at += 4
    if heap_sizes & 0x40:  # extra data (uncompressed #- streams)
        at += 4
    heap_width = {"s": 4 if heap_sizes & 1 else 2, "g": 4 if heap_sizes & 2 else 2, "b": 4 if heap_sizes & 4 else 2}

    def width(col) -> int:
        if isinstance(col, int):
            return col
        if isinstance(col, str):
            return heap_width[col]
        if col[0] == "t":
            return 2 if rows[col[1]] < (1 << 16) else 4
        named, bits = col
        most = max(rows[n] for n in named if n is not None)
        return 2 if most < (1 << (16 - bits)) else 4

    layout = {n: [width(c) for c in cols] for n, cols in COLUMNS.items()}
    start = {}
    for n in range(IMPL_MAP + 1):
        start[n] = at
        at += rows[n] * sum(layout[n])
    if at > t + tsize:
        raise ValueError("CLI tables run past the table stream")

    def string(index: int) -> str:
        base, hsize = heap
        if index >= hsize:
            raise ValueError(f"CLI string index {index:#x} past the #Strings heap")
        stop = bytes(buf[base + index:base + min(hsize, index + 1024)]).find(b"\0")
        if stop < 0:
            raise ValueError("CLI string unterminated (or past 1024 bytes)")
        return bytes(buf[base + index:base + index + stop]).decode("utf-8", "replace")

    mod_w = layout[MODULE_REF][0]
    modules = [string(_u(buf, start[MODULE_REF] + r * mod_w, mod_w)) for r in range(rows[MODULE_REF])]
    entries: list[list[str]] = [[] for _ in modules]
    flags_w, fwd_w, name_w, scope_w = layout[IMPL_MAP]
    row = flags_w + fwd_w + name_w + scope_w
    for r in range(rows[IMPL_MAP]):
        base = start[IMPL_MAP] + r * row
        name = string(_u(buf, base + flags_w + fwd_w, name_w))
        scope = _u(buf, base + flags_w + fwd_w + name_w, scope_w)
        if not 1 <= scope <= len(modules):
            raise ValueError(f"P/Invoke {name!r} names ModuleRef {scope} of {len(modules)}")
        entries[scope - 1].append(name)
    info = ClrInfo(pinvoke=list(zip(modules, entries)))

    # MemberRefs whose parent is a TypeRef (MemberRefParent tag 1) named as a runtime loader
    tr_cols, mr_cols = layout[TYPE_REF], layout[MEMBER_REF]
    type_names = {}
    for r in range(rows[TYPE_REF]):
        base = start[TYPE_REF] + r * sum(tr_cols)
        type_names[r + 1] = string(_u(buf, base + tr_cols[0], tr_cols[1]))
    wanted_types = {t for t, _ in NATIVE_LOADERS}
    for r in range(rows[MEMBER_REF]):
        base = start[MEMBER_REF] + r * sum(mr_cols)
        parent = _u(buf, base, mr_cols[0])
        if parent & 7 != 1 or type_names.get(parent >> 3) not in wanted_types:
            continue
        member = (type_names[parent >> 3], string(_u(buf, base + mr_cols[0], mr_cols[1])))
        if member in NATIVE_LOADERS and ".".join(member) not in info.loaders:
            info.loaders.append(".".join(member))
    return info


def user_string_libraries(buf, heap: tuple[int, int]) -> list[StringHit]:
    """Library file names in the #US heap's string literals (what NativeLibrary.Load or a
    P/Invoke'd LoadLibrary/dlopen is given). The heap is a run of length-prefixed UTF-16 strings
    (ECMA-335 II.24.2.4: a compressed length, the characters, one final byte)."""
    base, size = heap
    end = base + size
    at = base + 1  # the first entry is the empty string
    hits: list[StringHit] = []
    for _ in range(MAX_USER_STRINGS):
        if at >= end:
            return hits
        b0 = buf[at]
        if b0 & 0x80 == 0:
            n, head = b0, 1
        elif b0 & 0xC0 == 0x80 and at + 2 <= end:
            n, head = ((b0 & 0x3F) << 8) | buf[at + 1], 2
        elif b0 & 0xE0 == 0xC0 and at + 4 <= end:
            n, head = ((b0 & 0x1F) << 24) | (buf[at + 1] << 16) | (buf[at + 2] << 8) | buf[at + 3], 4
        else:
            raise ValueError(f"#US heap entry at {at:#x} has no valid length")
        if at + head + n > end:
            raise ValueError(f"#US heap entry at {at:#x} runs past the heap")
        text = bytes(buf[at + head:at + head + n - (n % 2)]).decode("utf-16-le", errors="replace")
        for m in LIBRARY_NAME.finditer(text):
            if len(hits) >= MAX_LIBRARY_HITS:
                raise ValueError(f"more than {MAX_LIBRARY_HITS} library names in the #US heap")
            hits.append(StringHit(section="#US", offset=at + head + 2 * m.start(), text=m.group(0)))
        at += head + n
    raise ValueError(f"#US heap holds more than {MAX_USER_STRINGS} strings")

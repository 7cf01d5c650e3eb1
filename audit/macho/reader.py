"""read_macho: one Mach-O file (dylib, bundle, executable; thin or universal) -> one BinaryInfo
(audit/binary/model.py, the model PE files are read into too) per architecture slice.

Design. The file is mmap'ed; a universal (fat) header names its slices, and each slice is read
on its own from its load commands: the libraries it loads and how (LC_LOAD_DYLIB, _WEAK_,
_REEXPORT_, _LAZY_LOAD_, _UPWARD_), LC_RPATH search paths (kept as written: @rpath,
@loader_path, @executable_path are the resolver's to expand), LC_ID_DYLIB, LC_UUID. Imported
names come from the symbol table (N_UNDF with the library ordinal of two-level namespace), the
chained-fixups import table and the dyld-info bind opcodes (a stripped file may keep only
those); defined names from the symbol table. C names lose their leading "_" so judging sees
the names the sources spell, as on ELF. Data sections (not code, not zero-fill) are searched for
".dylib" / ".framework" / ".metallib" names and, where the file imports dlsym, API names;
sections holding fatbins or offload bundles go to the ELF package's device-code readers, and an
embedded Metal library (magic "MTLB") is named as device code. Only load commands, the tables
they point at and the data sections are touched, and of the code only the first instructions
of the defined names kept (audit/macho/stubs.py: forwarding stubs).

Written with struct over the map rather than LIEF: the few tables read here do not justify a
large native dependency, and the same fail-closed rules as the ELF and PE readers apply: every
count and offset is checked against the slice that holds it and against a ceiling, every walk
is a bounded loop, and anything malformed raises InputError with one line naming the file.
"""

from __future__ import annotations

import os
import re
import struct
import zlib

from audit.elf.amdgpu import read_hip_fatbin
from audit.elf.model import DeviceCode
from audit.elf.nvidia import read_nv_fatbin
from audit.elf.parse import Malformed, decode
from audit.errors import InputError
from audit.binary import common
from audit.binary.common import Region
from audit.macho import stubs
from audit.macho.sections import ZEROFILL_TYPES, section_headers
from audit.binary.model import IMPORT, LAZY, REEXPORT, UPWARD, WEAK, BinaryInfo, Import

FAT_MAGIC, FAT_MAGIC_64 = 0xCAFEBABE, 0xCAFEBABF  # big-endian on disk
MH_MAGIC, MH_MAGIC_64 = 0xFEEDFACE, 0xFEEDFACF
CPU_TYPES = {7: ("CPU_TYPE_X86", "i386"), 0x01000007: ("CPU_TYPE_X86_64", "x86_64"),
             12: ("CPU_TYPE_ARM", "arm"), 0x0100000C: ("CPU_TYPE_ARM64", "arm64"),
             0x0200000C: ("CPU_TYPE_ARM64_32", "arm64_32"), 18: ("CPU_TYPE_POWERPC", "ppc"),
             0x01000012: ("CPU_TYPE_POWERPC64", "ppc64")}
FILE_TYPES = {1: "MH_OBJECT", 2: "MH_EXECUTE", 6: "MH_DYLIB", 7: "MH_DYLINKER", 8: "MH_BUNDLE",
              9: "MH_DYLIB_STUB", 10: "MH_DSYM", 11: "MH_KEXT_BUNDLE"}
LC_SEGMENT, LC_SYMTAB, LC_LOAD_DYLIB, LC_ID_DYLIB, LC_LOAD_DYLINKER = 0x1, 0x2, 0xC, 0xD, 0xE
LC_SEGMENT_64, LC_UUID, LC_LAZY_LOAD_DYLIB, LC_DYLD_INFO = 0x19, 0x1B, 0x20, 0x22
LC_REQ_DYLD = 0x80000000
LC_LOAD_WEAK_DYLIB, LC_RPATH, LC_REEXPORT_DYLIB = 0x18 | LC_REQ_DYLD, 0x1C | LC_REQ_DYLD, 0x1F | LC_REQ_DYLD
LC_DYLD_INFO_ONLY, LC_LOAD_UPWARD_DYLIB = 0x22 | LC_REQ_DYLD, 0x23 | LC_REQ_DYLD
LC_DYLD_CHAINED_FIXUPS = 0x34 | LC_REQ_DYLD
DYLIB_COMMANDS = {LC_LOAD_DYLIB: (IMPORT, "LC_LOAD_DYLIB"), LC_LOAD_WEAK_DYLIB: (WEAK, "LC_LOAD_WEAK_DYLIB"),
                  LC_REEXPORT_DYLIB: (REEXPORT, "LC_REEXPORT_DYLIB"),
                  LC_LAZY_LOAD_DYLIB: (LAZY, "LC_LAZY_LOAD_DYLIB"),
                  LC_LOAD_UPWARD_DYLIB: (UPWARD, "LC_LOAD_UPWARD_DYLIB")}
N_STAB, N_TYPE, N_EXT, N_UNDF, N_SECT = 0xE0, 0x0E, 0x01, 0x0, 0xE
N_WEAK_REF, N_WEAK_DEF = 0x40, 0x80
S_ATTR_PURE_INSTRUCTIONS, S_ATTR_SOME_INSTRUCTIONS = 0x80000000, 0x400
MAX_SLICES = 64
MAX_SYMBOLS = 1 << 24
MAX_METALLIBS = 256
METALLIB_MAGIC = b"MTLB"
_LIB_SUFFIX = common.suffix_re(b".dylib", b".framework", b".metallib")
_MALFORMED = (Malformed, struct.error, ValueError, IndexError, OverflowError, zlib.error, UnicodeError)


def is_macho(path: str | os.PathLike) -> bool:
    """True if the path is a regular file starting with a Mach-O or universal magic (never raises).
    A universal header is told from a Java class file (same magic) by its small slice count."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return False
    if len(head) < 8:
        return False
    magic = struct.unpack_from(">I", head)[0]
    if magic in (FAT_MAGIC, FAT_MAGIC_64):
        return 0 < struct.unpack_from(">I", head, 4)[0] <= MAX_SLICES
    return magic in (MH_MAGIC, MH_MAGIC_64) or struct.unpack_from("<I", head)[0] in (MH_MAGIC, MH_MAGIC_64)


def read_macho(path: str | os.PathLike, symbol_pattern: re.Pattern[bytes] | None = None,
               api_prefixes: tuple[bytes, ...] = (), sha256: bool = True,
               markers: tuple[bytes, ...] = ()) -> list[BinaryInfo]:
    """Read one Mach-O file: one BinaryInfo per slice (one for a thin file), in the order the
    universal header lists them. Keeps imports always and defined names when their bytes match
    `symbol_pattern`; API-name strings where the slice imports dlsym. Raises InputError."""
    path = os.fspath(path)
    mm, size = common.open_mapped(path, "Mach-O")
    try:
        return read_macho_buffer(path, mm, size, symbol_pattern, api_prefixes, sha256, markers)
    finally:
        common.close_quietly(mm)


def read_macho_buffer(path: str, buf, size: int, symbol_pattern=None, api_prefixes=(), sha256=True,
                      markers: tuple[bytes, ...] = ()) -> list[BinaryInfo]:
    try:
        infos = [_Slice(path, buf, base, length, label).read(symbol_pattern, tuple(api_prefixes), tuple(markers))
                 for base, length, label in _slices(buf, size)]
    except InputError:
        raise
    except _MALFORMED as exc:
        raise InputError(f"{path}: malformed Mach-O file: {exc or type(exc).__name__}") from None
    digest = common.sha256_of(buf, size) if sha256 else ""
    for info in infos:
        info.sha256, info.size = digest, size
    return infos


def _slices(buf, size: int) -> list[tuple[int, int, str | None]]:
    """(offset, size, label) of each slice: the whole file for a thin one."""
    if size < 8:
        raise ValueError(f"{size} bytes: too short for a Mach-O header")
    magic, n = struct.unpack_from(">II", buf, 0)
    if magic not in (FAT_MAGIC, FAT_MAGIC_64):
        return [(0, size, None)]
    entry = 20 if magic == FAT_MAGIC else 32
    if not 0 < n <= MAX_SLICES or 8 + entry * n > size:
        raise ValueError(f"universal header lists {n} slices")
    out = []
    for i in range(n):
        if magic == FAT_MAGIC:
            cpu, _sub, off, length, _align = struct.unpack_from(">iiIII", buf, 8 + entry * i)
        else:
            cpu, _sub, off, length, _align, _r = struct.unpack_from(">iiQQII", buf, 8 + entry * i)
        if off < 8 + entry * n or off + length > size:
            raise ValueError(f"slice {i} ({off:#x}+{length:#x}) lies outside the file")
        arch = CPU_TYPES.get(cpu & 0xFFFFFFFF, (None, f"cpu{cpu:#x}"))[1]
        out.append((off, length, f"{arch} @{off:#x}"))
    return out


def _uleb(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("ULEB128 runs past its table")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


class _Slice:
    def __init__(self, path: str, buf, base: int, size: int, label: str | None):
        self.path, self.buf, self.base, self.size, self.label = path, buf, base, size, label
        self.end = base + size

    def at(self, off: int, length: int, what: str) -> int:
        """The file offset of `length` bytes at slice offset `off`, which must lie in the slice."""
        if off < 0 or length < 0 or off + length > self.size:
            raise ValueError(f"{what} ({off:#x}+{length:#x}) lies outside the slice")
        return self.base + off

    def read(self, symbol_pattern, api_prefixes, markers: tuple[bytes, ...] = ()) -> BinaryInfo:
        buf, base = self.buf, self.base
        if self.size < 28:
            raise ValueError("too short for a Mach-O header")
        raw = struct.unpack_from("<I", buf, base)[0]
        if raw in (MH_MAGIC, MH_MAGIC_64):
            e = "<"
        elif struct.unpack_from(">I", buf, base)[0] in (MH_MAGIC, MH_MAGIC_64):
            e = ">"
        else:
            raise ValueError(f"no Mach-O magic at {base:#x}")
        self.e = e
        magic, cpu, _sub, ftype, ncmds, sizeofcmds, _flags = struct.unpack_from(e + "IiiIIII", buf, base)
        self.bits = 64 if magic == MH_MAGIC_64 else 32
        hdr = 32 if self.bits == 64 else 28
        if hdr + sizeofcmds > self.size or ncmds > sizeofcmds // 8:
            raise ValueError(f"{ncmds} load commands in {sizeofcmds} bytes run past the slice")
        info = BinaryInfo(path=self.path, sha256="", size=0, format="macho",
                          machine=CPU_TYPES.get(cpu & 0xFFFFFFFF, (f"CPU_TYPE_{cpu:#x}",))[0], bits=self.bits,
                          endian="little" if e == "<" else "big", file_type=FILE_TYPES.get(ftype, f"MH_{ftype:#x}"),
                          soname=None, slice=self.label)
        dylibs: list[str] = []  # by ordinal (1-based), every kind of dylib command in order
        sections: list[tuple[str, int, int, int]] = []
        symtab = dyld_info = chained = None
        pos, cmds_end = base + hdr, base + hdr + sizeofcmds
        for i in range(ncmds):
            if pos + 8 > cmds_end:
                raise ValueError(f"load command {i} runs past the load commands")
            cmd, cmdsize = struct.unpack_from(e + "II", buf, pos)
            if cmdsize < 8 or pos + cmdsize > cmds_end:
                raise ValueError(f"load command {i} ({cmd:#x}) has size {cmdsize}")
            if cmd in DYLIB_COMMANDS:
                kind, where = DYLIB_COMMANDS[cmd]
                name = self._lc_str(pos, cmdsize, where)
                dylibs.append(name)
                info.imports.append(Import(name, kind, where))
            elif cmd == LC_ID_DYLIB:
                info.soname = self._lc_str(pos, cmdsize, "LC_ID_DYLIB")
            elif cmd == LC_RPATH:
                info.rpath.append(self._lc_str(pos, cmdsize, "LC_RPATH"))
            elif cmd == LC_LOAD_DYLINKER:
                info.interpreter = self._lc_str(pos, cmdsize, "LC_LOAD_DYLINKER")
            elif cmd == LC_UUID and cmdsize >= 24:
                info.build_id = bytes(buf[pos + 8:pos + 24]).hex()
            elif cmd in (LC_SEGMENT, LC_SEGMENT_64):
                sections.extend(self._sections(pos, cmdsize, cmd == LC_SEGMENT_64))
            elif cmd == LC_SYMTAB and cmdsize >= 24:
                symtab = struct.unpack_from(e + "IIII", buf, pos + 8)
            elif cmd in (LC_DYLD_INFO, LC_DYLD_INFO_ONLY) and cmdsize >= 48:
                dyld_info = struct.unpack_from(e + "10I", buf, pos + 8)
            elif cmd == LC_DYLD_CHAINED_FIXUPS and cmdsize >= 16:
                chained = struct.unpack_from(e + "II", buf, pos + 8)
            pos += cmdsize
        info.needed = common.unique(dylibs)
        syms = common.SymbolSink(symbol_pattern)
        imported: dict[str, tuple[str, str | None, bool]] = {}  # name -> (table, library, weak)
        # each import once, under the table read first: the symbol table, then those a
        # stripped file keeps for dyld (chained fixups, bind opcodes)
        if symtab:
            self._symtab(*symtab, dylibs, imported, syms)
        if chained:
            self._chained_imports(*chained, dylibs, imported, info.warnings)
        if dyld_info:
            for k, table in ((2, "dyld-bind"), (6, "dyld-lazy-bind")):
                if dyld_info[k + 1]:
                    self._binds(dyld_info[k], dyld_info[k + 1], table, dylibs, imported)
        for name, (table, lib, weak) in imported.items():
            syms.add(name, False, table, "FUNC", "WEAK" if weak else "GLOBAL", lib)
        info.symbols = syms.columns()
        info.symbol_counts = syms.counts
        kept = [n for n, d in zip(info.symbols.name, info.symbols.defined) if d]
        info.forwarders = stubs.read_forwarders(buf, base, self.size, kept) if kept and imported else []
        info.code_loading_imports = common.code_loading(imported)
        for imp in list(info.imports):
            n = sum(1 for _t, lib, _w in imported.values() if lib == imp.name)
            info.imports[info.imports.index(imp)] = Import(imp.name, imp.kind, imp.where, n)
        self._data(info, sections, api_prefixes, markers)
        return info

    def _lc_str(self, pos: int, cmdsize: int, what: str) -> str:
        off = struct.unpack_from(self.e + "I", self.buf, pos + 8)[0]
        if off < 12 or off >= cmdsize:
            raise ValueError(f"{what} string offset {off} lies outside its command")
        return common.cstring(self.buf, pos + off, pos + cmdsize, f"{what} name")

    def _sections(self, pos: int, cmdsize: int, is64: bool):
        for f in section_headers(self.buf, self.e, pos, cmdsize, is64):
            sect, seg, size, offset, flags = f[0], f[1], f[3], f[4], f[8]
            name = decode(seg.rstrip(b"\0")) + "," + decode(sect.rstrip(b"\0"))
            if flags & 0xFF in ZEROFILL_TYPES or not size or not offset:
                continue
            yield name, self.at(offset, size, f"section {name}"), size, flags

    def _symtab(self, symoff, nsyms, stroff, strsize, dylibs, imported, syms) -> None:
        entry = 16 if self.bits == 64 else 12
        if nsyms > MAX_SYMBOLS:
            raise ValueError(f"symbol table of {nsyms} entries")
        start = self.at(symoff, entry * nsyms, "symbol table")
        strs = self.at(stroff, strsize, "string table")
        fmt = self.e + ("IBBHQ" if self.bits == 64 else "IBBHI")
        raw = self.buf[start:start + entry * nsyms]  # the table only: 16 bytes a symbol
        for strx, ntype, _sect, desc, _value in struct.iter_unpack(fmt, raw):
            if ntype & N_STAB:
                continue
            typ = ntype & N_TYPE
            if strx == 0 or strx >= strsize:
                continue
            name = _c_name(common.cstring(self.buf, strs + strx, strs + strsize, "symbol name"))
            if typ == N_UNDF and ntype & N_EXT:
                imported.setdefault(name, ("symtab", _library(desc >> 8 & 0xFF, dylibs), bool(desc & N_WEAK_REF)))
            elif typ in (N_SECT, 0x2):  # N_SECT, N_ABS
                bind = ("WEAK" if desc & N_WEAK_DEF else "GLOBAL") if ntype & N_EXT else "LOCAL"
                syms.add(name, True, "symtab", "NOTYPE", bind)

    def _chained_imports(self, dataoff, datasize, dylibs, imported, warnings) -> None:
        start = self.at(dataoff, datasize, "chained fixups")
        if datasize < 28:
            raise ValueError("chained fixups header is too short")
        _v, _starts, imports_off, symbols_off, count, fmt, sym_fmt = struct.unpack_from(self.e + "7I", self.buf, start)
        size = {1: 4, 2: 8, 3: 16}.get(fmt)
        if size is None:
            raise ValueError(f"chained fixups import format {fmt}")
        if sym_fmt != 0:
            warnings.append("chained fixups symbol names are compressed: imports read from the symbol table only")
            return
        if imports_off + size * count > datasize or symbols_off > datasize:
            raise ValueError(f"chained fixups list {count} imports past their table")
        names_at, names_end = start + symbols_off, start + datasize
        for k in range(count):
            at = start + imports_off + size * k
            if fmt == 3:
                v = struct.unpack_from(self.e + "Q", self.buf, at)[0]
                ordinal, weak, name_off = _signed(v & 0xFFFF, 16), v >> 16 & 1, v >> 32
            else:
                v = struct.unpack_from(self.e + "I", self.buf, at)[0]
                ordinal, weak, name_off = _signed(v & 0xFF, 8), v >> 8 & 1, v >> 9
            name = _c_name(common.cstring(self.buf, names_at + name_off, names_end, "chained fixups import name"))
            imported.setdefault(name, ("chained-fixups", _library(ordinal, dylibs), bool(weak)))

    def _binds(self, off: int, size: int, table: str, dylibs, imported) -> None:
        """The names the dyld-info bind opcodes bind, with their library ordinal: a bounded walk
        (every opcode consumes at least one byte)."""
        buf = self.buf
        pos = self.at(off, size, table)
        end = pos + size
        ordinal, name, weak = 0, None, False
        while pos < end:
            byte = buf[pos]
            pos += 1
            op, imm = byte & 0xF0, byte & 0x0F
            if op == 0x10:  # SET_DYLIB_ORDINAL_IMM
                ordinal = imm
            elif op == 0x20:  # SET_DYLIB_ORDINAL_ULEB
                ordinal, pos = _uleb(buf, pos, end)
            elif op == 0x30:  # SET_DYLIB_SPECIAL_IMM
                ordinal = _signed(0xF0 | imm, 8) if imm else 0
            elif op == 0x40:  # SET_SYMBOL_TRAILING_FLAGS_IMM
                stop = buf.find(b"\0", pos, end)
                if stop < 0:
                    raise ValueError(f"{table} symbol name runs past its table")
                name, weak, pos = _c_name(decode(buf[pos:stop])), bool(imm & 1), stop + 1
            elif op in (0x60, 0x70, 0x80, 0xA0):  # SET_ADDEND_SLEB, SET_SEGMENT_AND_OFFSET_ULEB, ADD_ADDR_ULEB, DO_BIND_ADD_ADDR_ULEB
                _, pos = _uleb(buf, pos, end)
            elif op == 0xC0:  # DO_BIND_ULEB_TIMES_SKIPPING_ULEB
                _, pos = _uleb(buf, pos, end)
                _, pos = _uleb(buf, pos, end)
            elif op == 0xD0 and imm == 0:  # THREADED, SET_BIND_ORDINAL_TABLE_SIZE_ULEB
                _, pos = _uleb(buf, pos, end)
            if op in (0x90, 0xA0, 0xB0, 0xC0) and name is not None:  # a DO_BIND form
                imported.setdefault(name, (table, _library(ordinal, dylibs), weak))

    def _data(self, info: BinaryInfo, sections, api_prefixes, markers: tuple[bytes, ...] = ()) -> None:
        device, data = [], []
        for name, at, size, flags in sections:
            if flags & (S_ATTR_PURE_INSTRUCTIONS | S_ATTR_SOME_INSTRUCTIONS):
                continue
            (device if "fatbin" in name.lower() else data).append(Region(name, at, size))
        info.library_strings = common.library_strings(self.buf, data, _LIB_SUFFIX, False, set(), info.warnings)
        if common.looks_up_symbols(info.code_loading_imports):
            info.api_strings = common.api_strings(self.buf, self.end, data, api_prefixes, info.warnings)
        info.marker_strings = common.markers_in(self.buf, data, markers)
        for reg in device:
            reader = read_hip_fatbin if "hip" in reg.name.lower() else read_nv_fatbin
            info.device_code.extend(reader(self.buf, reg.offset, reg.offset + reg.size, reg.name))
        for reg in data:
            pos, hi = reg.offset, reg.offset + reg.size
            while len(info.device_code) < MAX_METALLIBS:
                at = self.buf.find(METALLIB_MAGIC, pos, hi)
                if at < 0:
                    break
                # the library's own length (u64 at 0x10 of its header) where it fits the section
                length = struct.unpack_from("<Q", self.buf, at + 0x10)[0] if at + 0x18 <= hi else 0
                size = length if 0x18 <= length <= hi - at else hi - at
                info.device_code.append(DeviceCode(container="metallib", section=reg.name, offset=at, size=size,
                                                   kind="metallib", target="air"))
                pos = at + 4


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


def _library(ordinal: int, dylibs: list[str]) -> str | None:
    """The library a two-level-namespace ordinal names: 1..n the dylib commands in order; 0
    (this image), -1/0xfe (the main executable) and -2/0xff (flat lookup) name none."""
    return dylibs[ordinal - 1] if 1 <= ordinal <= len(dylibs) else None


def _c_name(name: str) -> str:
    """A C symbol as its source spells it: Mach-O prefixes one underscore."""
    return name[1:] if name.startswith("_") else name

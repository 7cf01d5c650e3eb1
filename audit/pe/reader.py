"""read_pe: one Windows PE/COFF file (DLL, EXE, .pyd) -> BinaryInfo (audit/binary/model.py).

Design. The file is mmap'ed and read with struct at the offsets its headers name: the DOS and
COFF headers, the section table, then only the data directories that say what gets loaded
(import, delay-load import, bound import, export, debug, and a managed assembly's CLI metadata:
its P/Invoke libraries, audit/pe/clr.py) and the COFF symbol table where one is left in (MinGW
keeps it). Data sections are searched for ".dll" names (ASCII and UTF-16LE:
what LoadLibraryA/W is given) and, where the file imports GetProcAddress, API names; device
code sections (`.nv_fatb[in]`, `.hip_fat[bin]`) are read by the ELF package's fatbin and offload
bundle readers, in place. A 670 MB cuBLASLt DLL is thus a few directory reads plus its fatbin
headers, never a copy. pefile was not used: pure Python, it parses every directory eagerly
and takes tens of seconds and GBs on such a file; LIEF would be fast but is a large native
dependency for the few tables read here.

Fail closed: every count read from the file is checked against the bytes that hold it and
against a fixed ceiling, every walk is a bounded loop (no recursion), and anything malformed
raises audit.errors.InputError with a one-line message naming the file.
"""

from __future__ import annotations

import os
import re
import struct
import zlib

from audit.elf.amdgpu import read_hip_fatbin
from audit.elf.model import Forward
from audit.elf.nvidia import read_nv_fatbin
from audit.elf.parse import Malformed, decode
from audit.errors import InputError
from audit.binary import common
from audit.binary.common import Region
from audit.binary.model import BOUND, DEFAULTLIB, DELAY_LOAD, EXPORT_FORWARD, IMPORT, PINVOKE, BinaryInfo, Import
from audit.pe.clr import read_clr, user_string_libraries
from audit.pe.stubs import loader_stubs

MACHINES = {0x14C: "IMAGE_FILE_MACHINE_I386", 0x8664: "IMAGE_FILE_MACHINE_AMD64",
            0xAA64: "IMAGE_FILE_MACHINE_ARM64", 0xA641: "IMAGE_FILE_MACHINE_ARM64EC",
            0xA64E: "IMAGE_FILE_MACHINE_ARM64X", 0x1C4: "IMAGE_FILE_MACHINE_ARMNT",
            0x200: "IMAGE_FILE_MACHINE_IA64"}
DIR_EXPORT, DIR_IMPORT, DIR_DEBUG, DIR_BOUND_IMPORT, DIR_DELAY_IMPORT = 0, 1, 6, 11, 13
IMAGE_FILE_DLL = 0x2000
SCN_CNT_CODE, SCN_MEM_EXECUTE = 0x20, 0x20000000
MAX_DLLS = 4096  # import descriptors per directory
MAX_THUNKS = 1 << 20  # imported names per file
MAX_EXPORTS = 1 << 20
MAX_COFF_SYMBOLS = 1 << 22
NV_SECTIONS = (".nv_fatb",)  # ".nv_fatbin" (a long name) or cut to 8 bytes
HIP_SECTIONS = (".hip_fat",)
# what an import library links in besides the thunks (MinGW dlltool, MSVC/llvm-dlltool)
_IMPORT_SCAFFOLD = re.compile(r"^(?:__imp_|_head_|__(?:DELAY_)?IMPORT_DESCRIPTOR_|__NULL_IMPORT_DESCRIPTOR$|\x7f)"
                              r"|_iname$|_NULL_THUNK_DATA$")
_DLL_SUFFIX = common.suffix_re(b".dll", ignore_case=True)
_LOADERS = ("LoadLibrary", "LoadPackagedLibrary", "LdrLoadDll",
            "dlopen", "NativeLibrary.")  # the last two: a managed assembly's P/Invoke, its runtime's call
_MALFORMED = (Malformed, struct.error, ValueError, IndexError, OverflowError, zlib.error, UnicodeError)


def is_pe(path: str | os.PathLike) -> bool:
    """True if the path is a regular file with an MZ header pointing at a PE signature (never raises)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:2] != b"MZ":
                return False
            fh.seek(struct.unpack_from("<I", head, 0x3C)[0])
            return fh.read(4) == b"PE\0\0"
    except OSError:
        return False


def read_pe(path: str | os.PathLike, symbol_pattern: re.Pattern[bytes] | None = None,
            api_prefixes: tuple[bytes, ...] = (), sha256: bool = True, markers: tuple[bytes, ...] = ()) -> BinaryInfo:
    """Read one PE file. Keeps imports always and defined names (exports, COFF symbols) when their
    bytes match `symbol_pattern`; keeps API-name strings starting with `api_prefixes` where the
    file imports GetProcAddress, and the whole data strings starting with one of `markers`.
    Raises InputError."""
    path = os.fspath(path)
    mm, size = common.open_mapped(path, "PE")
    try:
        return read_pe_buffer(path, mm, size, symbol_pattern, api_prefixes, sha256, markers)
    finally:
        common.close_quietly(mm)


def read_pe_buffer(path: str, buf, size: int, symbol_pattern=None, api_prefixes=(), sha256=True,
                   markers: tuple[bytes, ...] = ()) -> BinaryInfo:
    """read_pe over a buffer already in memory or mapped (`path` names it in messages)."""
    try:
        return _Pe(path, buf, size).read(symbol_pattern, tuple(api_prefixes), sha256, tuple(markers))
    except InputError:
        raise
    except _MALFORMED as exc:
        raise InputError(f"{path}: malformed PE file: {exc or type(exc).__name__}") from None


def read_coff_object(path: str | os.PathLike, symbol_pattern: re.Pattern[bytes] | None = None,
                     api_prefixes: tuple[bytes, ...] = (), sha256: bool = True,
                     markers: tuple[bytes, ...] = ()) -> BinaryInfo:
    """Read one COFF object file (a member of a static archive or import library): a plain or
    bigobj object (its defined and undefined external symbols, as read_pe reads an image's COFF
    symbol table), or one or more short import objects one after another (what an MSVC or LLVM
    import library holds: each names a DLL and a symbol it exports). Raises InputError."""
    path = os.fspath(path)
    mm, size = common.open_mapped(path, "COFF object")
    try:
        try:
            if bytes(mm[:4]) == _ANON and size >= 8 and struct.unpack_from("<H", mm, 4)[0] == 0:
                return _short_imports(path, mm, size, sha256)
            return _Coff(path, mm, size).read(symbol_pattern, tuple(api_prefixes), sha256, tuple(markers))
        except InputError:
            raise
        except _MALFORMED as exc:
            raise InputError(f"{path}: malformed COFF object: {exc or type(exc).__name__}") from None
    finally:
        common.close_quietly(mm)


MAX_DIRECTIVE_BYTES = 1 << 20


def defaultlibs(text: str) -> list[str]:
    """The libraries `/DEFAULTLIB:NAME` (or `-defaultlib:`, any case) names in a .drectve text,
    quotes removed, `.lib` added where the name has no extension, as the linker does; in order,
    once each."""
    out: dict[str, None] = {}  # ordered, and a set: a crafted section may repeat a name 10^5 times
    for m in _DEFAULTLIB.finditer(text):
        name = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        if not name:
            continue
        if "." not in name.replace("\\", "/").rsplit("/", 1)[-1]:
            name += ".lib"
        out.setdefault(name)
    return list(out)


_DEFAULTLIB = re.compile(r'(?:^|\s)[/-]defaultlib:(?:"([^"]*)"|(\S+))', re.IGNORECASE)
_ANON = b"\0\0\xff\xff"  # IMAGE_FILE_MACHINE_UNKNOWN, then 0xFFFF: an import or "anonymous" object header
_BIGOBJ_CLSID = bytes.fromhex("c7a1bad1eebaa94baf20faf66aa4dcb8")
MAX_SHORT_IMPORTS = 1 << 20
_IMPORT_TYPES = {0: "FUNC", 1: "OBJECT", 2: "OBJECT"}  # IMPORT_CODE, IMPORT_DATA, IMPORT_CONST


def _short_imports(path: str, buf, size: int, sha256: bool) -> BinaryInfo:
    """Short import objects back to back (IMPORT_OBJECT_HEADER, 20 bytes, then the symbol's
    name and the DLL's, NUL-terminated): the DLL is a library the linked program loads, each
    symbol an import from it."""
    info = BinaryInfo(path=path, sha256="", size=size, format="coff", machine="", bits=64, endian="little",
                      file_type="import library", soname=None)
    syms = common.SymbolSink(None)
    per_dll: dict[str, int] = {}
    at = 0
    while at < size:
        if len(per_dll) and sum(per_dll.values()) >= MAX_SHORT_IMPORTS:
            raise ValueError(f"more than {MAX_SHORT_IMPORTS} short import objects")
        if at + 20 > size:
            raise ValueError(f"truncated short import header at {at:#x}")
        sig1, sig2, version, machine, _ts, length, _hint, typ = struct.unpack_from("<HHHHIIHH", buf, at)
        if (sig1, sig2, version) != (0, 0xFFFF, 0):
            raise ValueError(f"no short import header at {at:#x}")
        end = at + 20 + length
        if end > size:
            raise ValueError(f"short import at {at:#x} has {length} bytes of names, past the file's {size}")
        stop = buf.find(b"\0", at + 20, end)
        if stop < 0:
            raise ValueError(f"short import at {at:#x}: its symbol name is not NUL-terminated")
        name = decode(buf[at + 20:stop])
        dll = common.cstring(buf, stop + 1, end, "imported DLL name", 1024)
        if not name or not dll:
            raise ValueError(f"short import at {at:#x} names no symbol or no DLL")
        if not info.machine:
            info.machine = MACHINES.get(machine, f"IMAGE_FILE_MACHINE_{machine:#06x}")
            info.bits = 32 if machine in (0x14C, 0x1C4) else 64
        name_type = typ >> 2 & 7
        if name_type in (2, 3):  # IMPORT_NAME_NOPREFIX, IMPORT_NAME_UNDECORATE: exported without it
            name = name.lstrip("?@_") or name
            if name_type == 3:
                name = name.split("@", 1)[0] or name
        syms.add(name, False, "import-library", _IMPORT_TYPES.get(typ & 3, "NOTYPE"), "GLOBAL", dll)
        per_dll[dll] = per_dll.get(dll, 0) + 1
        at = end
    if not per_dll:
        raise ValueError("no short import object")
    info.imports = [Import(dll, IMPORT, "import library", n) for dll, n in per_dll.items()]
    info.needed = list(per_dll)
    info.symbols = syms.columns()
    info.symbol_counts = syms.counts
    info.code_loading_imports = common.code_loading(info.symbols.name)
    if sha256:
        info.sha256 = common.sha256_of(buf, size)
    return info


class _Section:
    __slots__ = ("name", "va", "vsize", "raw", "rawsize", "flags")

    def __init__(self, name, va, vsize, raw, rawsize, flags):
        self.name, self.va, self.vsize, self.raw, self.rawsize, self.flags = name, va, vsize, raw, rawsize, flags


class _Pe:
    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.size = path, buf, size
        self._last: _Section | None = None
        # file offsets of strings the directories name: DLL names and imported/exported names
        # are no evidence of a load by name (they are read as imports and symbols)
        self.named: set[int] = set()
        self.sym_entry = 18  # bytes a COFF symbol (a bigobj object's: 20)
        self.is_object = False
        self.code_exports: list[tuple[str, int]] = []  # (name, RVA) of the exports the policy kept
        self.getproc_slots: set[int] = set()  # RVAs of the IAT slots bound to GetProcAddress
        self._header()

    # ------------------------------------------------------------------ headers

    def _header(self) -> None:
        buf, size = self.buf, self.size
        if size < 64 or buf[:2] != b"MZ":
            raise ValueError("no MZ header")
        pe = struct.unpack_from("<I", buf, 0x3C)[0]
        if pe + 24 > size or buf[pe:pe + 4] != b"PE\0\0":
            raise ValueError(f"no PE signature at {pe:#x}")
        (machine, nsec, _ts, self.symptr, self.nsyms, opt_size,
         self.characteristics) = struct.unpack_from("<HHIIIHH", buf, pe + 4)
        opt = pe + 24
        if opt + opt_size > size or opt_size < 2:
            raise ValueError(f"optional header ({opt_size} bytes) runs past the file")
        magic = struct.unpack_from("<H", buf, opt)[0]
        if magic == 0x20B:
            self.bits, need, base_at, ndirs_at = 64, 112, 24, 108
            self.image_base = struct.unpack_from("<Q", buf, opt + base_at)[0]
        elif magic == 0x10B:
            self.bits, need, base_at, ndirs_at = 32, 96, 28, 92
            self.image_base = struct.unpack_from("<I", buf, opt + base_at)[0]
        else:
            raise ValueError(f"optional header magic {magic:#x} is neither PE32 nor PE32+")
        if opt_size < need:
            raise ValueError(f"optional header of {opt_size} bytes is too short")
        self.headers_size = struct.unpack_from("<I", buf, opt + 60)[0]
        ndirs = min(struct.unpack_from("<I", buf, opt + ndirs_at)[0], 16, (opt_size - need) // 8)
        self.dirs = [struct.unpack_from("<II", buf, opt + need + 8 * i) for i in range(ndirs)]
        self.machine = MACHINES.get(machine, f"IMAGE_FILE_MACHINE_{machine:#06x}")
        self._sections(opt + opt_size, nsec)

    def _sections(self, table: int, nsec: int) -> None:
        if table + 40 * nsec > self.size:
            raise ValueError(f"section table ({nsec} sections) runs past the file")
        self.sections = []
        for i in range(nsec):
            raw_name, vsize, va, rawsize, raw = struct.unpack_from("<8sIIII", self.buf, table + 40 * i)
            flags = struct.unpack_from("<I", self.buf, table + 40 * i + 36)[0]
            sec = _Section(self._section_name(raw_name), va, vsize, raw, rawsize, flags)
            if rawsize and raw + rawsize > self.size:
                raise ValueError(f"truncated: section {sec.name} ends at {raw + rawsize:#x}, "
                                 f"past the file's {self.size} bytes")
            self.sections.append(sec)

    def _section_name(self, raw: bytes) -> str:
        name = raw.rstrip(b"\0")
        # "/123": a long name in the COFF string table (MinGW writes them where it keeps symbols)
        if name[:1] == b"/" and name[1:].isdigit() and self.symptr:
            strtab = self.symptr + self.sym_entry * self.nsyms
            at = strtab + int(name[1:])
            if self.nsyms <= MAX_COFF_SYMBOLS and strtab + 4 <= self.size and at < self.size:
                try:
                    return common.cstring(self.buf, at, self.size, "section name", 255)
                except ValueError:
                    pass
        return decode(name)

    def dir(self, index: int) -> tuple[int, int]:
        return self.dirs[index] if index < len(self.dirs) else (0, 0)

    def off(self, rva: int, length: int = 1, what: str = "data") -> int:
        """The file offset of `length` bytes at `rva`, which must lie in one section's raw data."""
        sec = self._last
        if sec is None or not (sec.va <= rva and rva + length <= sec.va + max(sec.vsize, sec.rawsize)):
            sec = next((s for s in self.sections
                        if s.va <= rva and rva + length <= s.va + max(s.vsize, s.rawsize)), None)
            if sec is None:
                if 0 <= rva and rva + length <= min(self.headers_size, self.size):
                    return rva  # in the headers, mapped as they are stored
                raise ValueError(f"{what} at RVA {rva:#x} lies in no section")
            self._last = sec
        at = sec.raw + (rva - sec.va)
        if rva - sec.va + length > sec.rawsize or at + length > self.size:
            raise ValueError(f"{what} at RVA {rva:#x} lies outside {sec.name}'s stored bytes")
        return at

    def string(self, rva: int, what: str) -> str:
        at = self.off(rva, 1, what)
        self.named.add(at)
        return common.cstring(self.buf, at, self.size, what)

    # ------------------------------------------------------------------ the file

    def _linker_directives(self, info: BinaryInfo) -> None:
        """An object's .drectve section: options the linker takes as if given on its command line.
        `/DEFAULTLIB:NAME` (MSVC's `#pragma comment(lib, NAME)`) links the library NAME into
        whatever the object is linked into: an import library there loads its DLL."""
        for sec in self.sections:
            if sec.name != ".drectve" or not sec.rawsize:
                continue
            if sec.raw + sec.rawsize > self.size or sec.rawsize > MAX_DIRECTIVE_BYTES:
                raise ValueError(f".drectve ({sec.rawsize} bytes at {sec.raw:#x}) runs past the file or its limit")
            text = bytes(self.buf[sec.raw:sec.raw + sec.rawsize])
            if text.startswith(b"\xef\xbb\xbf"):  # UTF-8, marked
                text = text[3:]
            for name in defaultlibs(text.decode("utf-8", "replace")):
                info.imports.append(Import(name, DEFAULTLIB, ".drectve"))

    def file_type(self) -> str:
        return "DLL" if self.characteristics & IMAGE_FILE_DLL else "EXE"

    def read(self, symbol_pattern, api_prefixes, sha256, markers: tuple[bytes, ...] = ()) -> BinaryInfo:
        info = BinaryInfo(path=self.path, sha256="", size=self.size, format="coff" if self.is_object else "pe",
                          machine=self.machine, bits=self.bits, endian="little", file_type=self.file_type(),
                          soname=None)
        syms = common.SymbolSink(symbol_pattern)
        self._imports(info, syms)
        self._delay_imports(info, syms)
        self._bound_imports(info)
        clr = read_clr(self)  # a managed assembly: the native libraries and loaders it calls
        for module, entry_points in clr.pinvoke if clr else ():
            info.imports.append(Import(module, PINVOKE, "CLI ImplMap", len(entry_points)))
            for name in entry_points:
                syms.add(name, False, "P/Invoke", "FUNC", "GLOBAL", module)
        for name in clr.loaders if clr else ():
            syms.add(name, False, "CLI MemberRef", "FUNC", "GLOBAL", None)
        self._exports(info, syms)
        if self.code_exports and self.getproc_slots:  # a dispatcher's exports: loader stubs, not copies
            info.forwarders.extend(loader_stubs(self, self.code_exports, self.getproc_slots))
            info.forwarders.sort(key=lambda f: f.symbol)
        self._coff_symbols(info, syms)
        if self.is_object:
            self._linker_directives(info)
        info.needed = common.unique(i.name for i in info.imports)
        info.symbols = syms.columns()
        info.symbol_counts = syms.counts
        info.code_loading_imports = common.code_loading(
            n for n, d in zip(info.symbols.name, info.symbols.defined) if not d)
        info.build_id = self._codeview(info.warnings)
        device = [s for s in self.sections if s.name.startswith(NV_SECTIONS + HIP_SECTIONS)]
        data = [Region(s.name, s.raw, min(s.rawsize, self.size - s.raw)) for s in self.sections
                if not s.flags & (SCN_CNT_CODE | SCN_MEM_EXECUTE) and s.rawsize and s.raw < self.size
                and (s.raw or not self.is_object)
                and s not in device and s.name != ".reloc"]
        # a DLL name in data is a load by name only in a file that imports the loader
        if any(n.startswith(_LOADERS) for n in info.code_loading_imports):
            info.library_strings = common.library_strings(self.buf, data, _DLL_SUFFIX, True, self.named, info.warnings)
            if clr and clr.user_strings:  # a managed assembly's string literals (UTF-16, in .text)
                info.library_strings += user_string_libraries(self.buf, clr.user_strings)
        if common.looks_up_symbols(info.code_loading_imports):
            info.api_strings = [h for h in common.api_strings(self.buf, self.size, data, api_prefixes, info.warnings)
                                if h.offset not in self.named]
        info.marker_strings = common.markers_in(self.buf, data, markers)
        for s in device:
            start, end = s.raw, min(s.raw + s.rawsize, self.size)
            reader = read_nv_fatbin if s.name.startswith(NV_SECTIONS) else read_hip_fatbin
            info.device_code.extend(reader(self.buf, start, end, s.name))
        if sha256:
            info.sha256 = common.sha256_of(self.buf, self.size)
        return info

    def _thunks(self, rva: int, dll: str, syms, table: str, budget: list[int], iat: int = 0) -> int:
        """Add the names of one import name table (INT) at `rva`; how many. `iat`: the import
        address table it fills, whose GetProcAddress slot is noted."""
        step, fmt = (8, "<Q") if self.bits == 64 else (4, "<I")
        flag = 1 << (self.bits - 1)
        n = 0
        while True:
            if budget[0] <= 0:
                raise ValueError(f"more than {MAX_THUNKS} imported names")
            value = struct.unpack_from(fmt, self.buf, self.off(rva + n * step, step, f"{dll}'s import name table"))[0]
            if value == 0:
                return n
            budget[0] -= 1
            if value & flag:
                name = f"#{value & 0xFFFF}"  # by ordinal: the DLL's export number, no name
            else:
                at = self.off((value & 0x7FFFFFFF) + 2, 1, f"{dll}'s imported name")
                self.named.add(at)
                name = common.cstring(self.buf, at, self.size, f"{dll}'s imported name")
                if iat and name == "GetProcAddress":
                    self.getproc_slots.add(iat + n * step)
            syms.add(name, False, table, "FUNC", "GLOBAL", dll)
            n += 1

    def _imports(self, info: BinaryInfo, syms) -> None:
        rva, size = self.dir(DIR_IMPORT)
        if not rva:
            return
        budget = [MAX_THUNKS]
        for i in range(MAX_DLLS + 1):
            at = self.off(rva + 20 * i, 20, "import descriptor")
            oft, _ts, _fwd, name_rva, iat = struct.unpack_from("<IIIII", self.buf, at)
            if not (oft or name_rva or iat):
                return
            if i == MAX_DLLS:
                raise ValueError(f"more than {MAX_DLLS} imported DLLs")
            dll = self.string(name_rva, "imported DLL name")
            n = self._thunks(oft or iat, dll, syms, "import", budget, iat)
            info.imports.append(Import(dll, IMPORT, "import directory", n))

    def _delay_imports(self, info: BinaryInfo, syms) -> None:
        rva, size = self.dir(DIR_DELAY_IMPORT)
        if not rva:
            return
        budget = [MAX_THUNKS]
        for i in range(MAX_DLLS + 1):
            at = self.off(rva + 32 * i, 32, "delay-load descriptor")
            attrs, name_rva, _hmod, iat, int_rva = struct.unpack_from("<IIIII", self.buf, at)
            if not (name_rva or iat or int_rva):
                return
            if i == MAX_DLLS:
                raise ValueError(f"more than {MAX_DLLS} delay-loaded DLLs")
            if not attrs & 1:  # an old (VC6) descriptor holds addresses, not RVAs
                name_rva, int_rva = (name_rva - self.image_base) & 0xFFFFFFFF, (int_rva - self.image_base) & 0xFFFFFFFF
            dll = self.string(name_rva, "delay-loaded DLL name")
            n = self._thunks(int_rva, dll, syms, "delay-import", budget) if int_rva else 0
            info.imports.append(Import(dll, DELAY_LOAD, "delay-load directory", n))

    def _bound_imports(self, info: BinaryInfo) -> None:
        """Bound imports: a table in the headers (file offsets from its start), each module with
        its forwarder refs (DLLs the bound imports were forwarded to, loaded too)."""
        base, size = self.dir(DIR_BOUND_IMPORT)
        if not base:
            return
        if base + size > self.size or size > 1 << 20:
            raise ValueError("bound import directory runs past the file")
        pos, end = base, base + size
        while pos + 8 <= end:
            _ts, name_off, nrefs = struct.unpack_from("<IHH", self.buf, pos)
            if not (_ts or name_off or nrefs):
                return
            for k in range(nrefs + 1):
                at = pos + 8 * k
                if at + 8 > end:
                    raise ValueError("bound import forwarder refs run past their directory")
                name_at = base + struct.unpack_from("<H", self.buf, at + 4)[0]
                self.named.add(name_at)
                name = common.cstring(self.buf, name_at, end, "bound import name")
                info.imports.append(Import(name, BOUND, "bound import directory"))
            pos += 8 * (nrefs + 1)

    def _exports(self, info: BinaryInfo, syms) -> None:
        rva, size = self.dir(DIR_EXPORT)
        if not rva:
            return
        at = self.off(rva, 40, "export directory")
        (name_rva, ord_base, nfuncs, nnames, funcs_rva, names_rva,
         ords_rva) = struct.unpack_from("<12xIIIIIII", self.buf, at)
        if name_rva:
            info.soname = self.string(name_rva, "export directory's DLL name")
        if nfuncs > MAX_EXPORTS or nnames > nfuncs:
            raise ValueError(f"export directory counts {nfuncs} functions, {nnames} names")
        funcs = struct.unpack_from(f"<{nfuncs}I", self.buf, self.off(funcs_rva, 4 * nfuncs, "export address table")) \
            if nfuncs else ()
        names = struct.unpack_from(f"<{nnames}I", self.buf, self.off(names_rva, 4 * nnames, "export name table")) \
            if nnames else ()
        ords = struct.unpack_from(f"<{nnames}H", self.buf, self.off(ords_rva, 2 * nnames, "export ordinal table")) \
            if nnames else ()
        by_index: dict[int, str] = {}
        for name_at, index in zip(names, ords):
            if index >= nfuncs:
                raise ValueError(f"export ordinal index {index} past {nfuncs} functions")
            by_index.setdefault(index, self.string(name_at, "exported name"))
        forwarded_to: dict[str, int] = {}
        for index, target in enumerate(funcs):
            if not target:
                continue
            name = by_index.get(index) or f"#{ord_base + index}"
            if rva <= target < rva + size:  # inside the directory: "OTHERDLL.Name" or "OTHERDLL.#12"
                text = self.string(target, f"forwarder of {name}")
                dll, dot, func = text.rpartition(".")
                if not dot or not dll:
                    raise ValueError(f"export forwarder {text!r} of {name} names no DLL")
                dll = dll if dll.lower().endswith(".dll") else dll + ".dll"
                forwarded_to[dll] = forwarded_to.get(dll, 0) + 1
                info.forwarders.append(Forward(symbol=name, target=func, via="export", slot=funcs_rva + 4 * index))
                syms.add(name, True, "export", "FUNC", "GLOBAL", dll)
            else:
                syms.add(name, True, "export", "FUNC", "GLOBAL")
                if syms.pattern is None or syms.pattern.search(name.encode("utf-8", "surrogateescape")):
                    self.code_exports.append((name, target))
        info.forwarders.sort(key=lambda f: f.symbol)
        info.imports.extend(Import(dll, EXPORT_FORWARD, "export directory", n) for dll, n in forwarded_to.items())

    def _coff_symbols(self, info: BinaryInfo, syms) -> None:
        """The COFF symbol table a MinGW-linked image keeps unless stripped (static copies show
        here), or an object file's (its definitions and the names it calls)."""
        if not self.symptr or not self.nsyms:
            return
        n, entry = self.nsyms, self.sym_entry
        strtab = self.symptr + entry * n
        if n > MAX_COFF_SYMBOLS or strtab + 4 > self.size:
            if self.is_object:
                raise ValueError(f"COFF symbol table ({n} entries at {self.symptr:#x}) runs past the file")
            info.warnings.append(f"COFF symbol table ({n} entries at {self.symptr:#x}) lies outside the file: not read")
            return
        strsize = min(struct.unpack_from("<I", self.buf, strtab)[0], self.size - strtab)
        raw = self.buf[self.symptr:strtab]  # 18 (bigobj: 20) bytes a symbol: a bounded copy of the table only
        fmt = "<8sIhHBB" if entry == 18 else "<8sIiHBB"
        rows = []
        i = 0
        while i < n:
            name8, value, secnum, typ, cls, naux = struct.unpack_from(fmt, raw, entry * i)
            i += 1 + naux
            if cls in (2, 105):  # EXTERNAL, WEAK_EXTERNAL
                bind = "WEAK" if cls == 105 else "GLOBAL"
            elif cls == 3 and typ >> 4 == 2:  # STATIC function
                bind = "LOCAL"
            else:
                continue
            if name8[:4] == b"\0\0\0\0":
                off = struct.unpack_from("<I", name8, 4)[0]
                if off >= strsize:
                    if self.is_object:
                        raise ValueError(f"COFF symbol {i} names string {off:#x} past the string table")
                    info.warnings.append(f"COFF symbol {i} names string {off:#x} past the string table")
                    continue
                name = common.cstring(self.buf, strtab + off, strtab + strsize, "COFF symbol name",
                                     strsize if self.is_object else 4096)
            else:
                name = decode(name8.rstrip(b"\0"))
            defined = secnum > 0 or cls == 105
            if self.is_object and cls == 2 and (secnum == -1 or (secnum == 0 and value)):
                defined = True  # an absolute symbol, or a common one (its size in the value)
            rows.append((name, defined, "FUNC" if typ >> 4 == 2 else "NOTYPE", bind))
        # An import library's parts are linked in: __imp_X (the address slot) and X (the jump
        # to it) are the import of X, not a copy of it; its descriptors are scaffolding.
        thunks = {r[0][6:] for r in rows if r[0].startswith("__imp_")}
        for name, defined, kind, bind in rows:
            if self.is_object and not defined and name.startswith("__imp_") and len(name) > 6:
                name = name[6:]  # a __declspec(dllimport) call: through the import slot of the name
            elif _IMPORT_SCAFFOLD.search(name):
                if self.is_object and defined and name.endswith("_iname"):
                    self._iname(info)
                continue
            syms.add(name, defined and name not in thunks, "coff-symtab", kind, bind)

    def _iname(self, info: BinaryInfo) -> None:
        """A MinGW (dlltool) import library's tail object: its `.idata$7` holds the name of the
        DLL the library's imports load."""
        for s in self.sections:
            if s.name == ".idata$7" and s.rawsize:
                dll = common.cstring(self.buf, s.raw, s.raw + s.rawsize, "imported DLL name")
                if dll and all(i.name != dll for i in info.imports):
                    info.imports.append(Import(dll, IMPORT, "import library (.idata$7)"))

    def _codeview(self, warnings: list[str]) -> str | None:
        """GUID and age of the CodeView (RSDS) debug record: the PE's build id."""
        rva, size = self.dir(DIR_DEBUG)
        if not rva or not size:
            return None
        try:
            at = self.off(rva, min(size, 28 * 64), "debug directory")
            for k in range(min(size // 28, 64)):
                typ, dsize, _addr, ptr = struct.unpack_from("<12xIIII", self.buf, at + 28 * k)
                if typ == 2 and dsize >= 24 and ptr + 24 <= self.size and self.buf[ptr:ptr + 4] == b"RSDS":
                    guid, age = self.buf[ptr + 4:ptr + 20], struct.unpack_from("<I", self.buf, ptr + 20)[0]
                    return f"{bytes(guid).hex()}{age:x}"
        except ValueError as exc:
            warnings.append(f"debug directory not read: {exc}")
        return None


class _Coff(_Pe):
    """A COFF object file (MinGW, clang or MSVC `-c`; an archive's member): the file header at
    offset 0 (a bigobj's 56-byte header: 32-bit section numbers, 20-byte symbols), its section
    table and symbol table; no directories (nothing is loaded), no image base."""

    def _header(self) -> None:
        buf, size = self.buf, self.size
        self.is_object, self.dirs, self.headers_size, self.image_base = True, [], 0, 0
        if bytes(buf[:4]) == _ANON:
            if size < 56:
                raise ValueError(f"{size} bytes: too short for an object header")
            version, machine = struct.unpack_from("<HH", buf, 4)
            if version < 2 or bytes(buf[12:28]) != _BIGOBJ_CLSID:
                raise ValueError("an object whose code is not COFF (a /GL link-time-code-generation object, "
                                 "compiler IL): not read")
            nsec, self.symptr, self.nsyms = struct.unpack_from("<III", buf, 44)
            self.sym_entry, table, self.characteristics = 20, 56, 0
        else:
            if size < 20:
                raise ValueError(f"{size} bytes: too short for a COFF header")
            (machine, nsec, _ts, self.symptr, self.nsyms, opt_size,
             self.characteristics) = struct.unpack_from("<HHIIIHH", buf, 0)
            table = 20 + opt_size
        if nsec > 0xFFFFFF:
            raise ValueError(f"{nsec} sections")
        self.machine = MACHINES.get(machine, f"IMAGE_FILE_MACHINE_{machine:#06x}")
        self.bits = 32 if machine in (0x14C, 0x1C4) else 64
        self._sections(table, nsec)

    def file_type(self) -> str:
        return "object"

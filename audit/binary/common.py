"""What the PE and Mach-O readers share: mapping a file, bounded C strings, library-name and
API-name strings in data, code-loading imports, and keeping the symbols judging asks for.

Library names are found from their suffix (".dll", ".dylib", ...), one regex over each data
region, and the name is read backwards from it (at most 255 bytes): a literal-led search that
costs linear time on hostile data. PE data is searched for UTF-16LE names too (what
LoadLibraryW is given). API names for GetProcAddress/dlsym are read by the ELF package's
vectorised `strings_in`, handed the regions.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from audit.elf.model import StringHit, SymbolColumns
from audit.elf.reader import open_regular
from audit.elf.parse import SHF_ALLOC, SHT_PROGBITS, Malformed, decode, release
from audit.elf.strings import MARKER_TEXT_MAX, marker_strings, strings_in
from audit.elf.strings import MAX_HITS as MAX_MARKERS
from audit.errors import InputError

MAX_HITS = 10_000  # library-name strings per file; more is an error (a name past it is never dropped)
MAX_NAME = 255
NAME_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-."
_NAME_SET = frozenset(NAME_CHARS)
_WIDE_DLL = re.compile(rb"\.\0[dD]\0[lL]\0[lL]\0")  # ".dll" in UTF-16LE, any case

# Imports through which a binary loads code at run time: the ELF names (as read_elf's
# CODE_LOADING_RE), the Windows loader (LoadLibrary*/GetProcAddress are dlopen/dlsym) and macOS's
# older image loaders.
CODE_LOADING_RE = re.compile(
    r"^(?:dlopen|dlmopen|dlsym|dlvsym|hipModuleLoad\w*|cuModuleLoad\w*|cuLibraryLoad\w*"
    r"|hiprtc\w*|nvrtc\w*|LoadLibrary(?:Ex)?[AW]?|LoadPackagedLibrary|GetProcAddress"
    r"|NativeLibrary\.(?:Try)?Load"  # P/Invoke spells LoadLibrary bare; .NET's own loader
    r"|LdrLoadDll|LdrGetProcedureAddress\w*|NSAddImage|NSCreateObjectFileImageFrom\w+)$")
SYMBOL_LOOKUP = frozenset({"dlsym", "dlvsym", "GetProcAddress", "LdrGetProcedureAddress",
                           "LdrGetProcedureAddressEx", "LdrGetProcedureAddressForCaller"})


@dataclass(frozen=True)
class Region:
    """A stretch of the file holding data (not code): a section to search for strings."""

    name: str
    offset: int
    size: int
    # what identifier_strings asks of a section
    type: int = SHT_PROGBITS
    flags: int = SHF_ALLOC


def open_mapped(path: str, what: str):
    """(mmap, size) of a regular, non-empty file; InputError otherwise (never blocks on a FIFO)."""
    article = "an" if what[:1].lower() in "aeiou" else "a"
    fd, size = open_regular(path, f"{article} {what} file")
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), size
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot map file: {exc}") from None
    finally:
        os.close(fd)


def close_quietly(mm) -> None:
    try:
        mm.close()
    except BufferError:  # a view still refers to it; it is unmapped when collected
        pass


def sha256_of(buf, size: int) -> str:
    """The digest of the mapped file, 8 MiB at a time, each part let go once hashed."""
    h = hashlib.sha256()
    step = 8 << 20
    for pos in range(0, size, step):
        end = min(size, pos + step)
        h.update(memoryview(buf)[pos:end])
        release(buf, pos, end)
    return h.hexdigest()


def cstring(buf, at: int, limit: int, what: str, max_len: int = 4096) -> str:
    """The NUL-terminated string at buf[at:], which must end before `limit` and within max_len."""
    if at < 0 or at >= limit:
        raise ValueError(f"{what} at {at:#x} lies outside the file")
    end = buf.find(b"\0", at, min(limit, at + max_len + 1))
    if end < 0:
        raise ValueError(f"{what} at {at:#x} is not NUL-terminated within {max_len} bytes")
    return decode(buf[at:end])


def suffix_re(*suffixes: bytes, ignore_case: bool = False) -> re.Pattern[bytes]:
    """A search for any of `suffixes` (each starting with "."), not followed by a name character."""
    alts = b"|".join(re.escape(s) for s in suffixes)
    return re.compile(rb"(?:" + alts + rb")(?![A-Za-z0-9_+\-])", re.IGNORECASE if ignore_case else 0)


def library_strings(buf, regions: Iterable[Region], suffix: re.Pattern[bytes], wide: bool,
                    skip: set[int], warnings: list[str]) -> list[StringHit]:
    """Library names (a name ending in one of `suffix`'s suffixes) in the data regions, as
    single bytes and, where `wide`, ".dll" names in UTF-16LE. `skip`: file offsets of strings already read as
    imports (the import directory's own DLL names are no load by name)."""
    hits: list[StringHit] = []
    wide_re = _WIDE_DLL if wide else None
    for reg in regions:
        lo, hi = reg.offset, reg.offset + reg.size
        for m in _windows(suffix, buf, lo, hi):
            stem = bytes(buf[max(lo, m.start() - MAX_NAME):m.start()])
            start = len(stem.rstrip(NAME_CHARS))
            at = m.start() - (len(stem) - start)
            if at == m.start() or at in skip:
                continue
            if len(hits) >= MAX_HITS:
                raise InputError(f"more than {MAX_HITS} library-name strings (limit)")
            hits.append(StringHit(section=reg.name, offset=at, text=decode(buf[at:m.end()])))
        if wide_re is not None:
            for m in _windows(wide_re, buf, lo, hi):  # a window resident at a time, as above
                if m.end() + 1 < hi and buf[m.end() + 1] == 0 and buf[m.end()] in _NAME_SET \
                        and buf[m.end()] != 0x2E:
                    continue  # ".dllx": a longer word
                at = m.start()
                while at - 2 >= max(lo, m.start() - 2 * MAX_NAME) and buf[at - 1] == 0 and buf[at - 2] in _NAME_SET:
                    at -= 2
                # a wide string follows a 0 byte (its NUL, or a wide character's high byte): a
                # first "character" after any other byte is the end of an ASCII string before it
                while at < m.start() and at > lo and buf[at - 1] != 0:
                    at += 2
                if at == m.start() or at in skip or _version_value(buf, at, lo):
                    continue
                if len(hits) >= MAX_HITS:
                    raise InputError(f"more than {MAX_HITS} library-name strings (limit)")
                text = bytes(buf[at:m.end()]).decode("utf-16-le", errors="backslashreplace")
                hits.append(StringHit(section=reg.name, offset=at, text=text))
        release(buf, lo, hi)
    return hits


# The version resource's keys whose value is the file's own name (VS_VERSIONINFO's StringTable:
# the key in UTF-16, its NUL, zero padding to 4 bytes, then the value): identity, not a load.
_OWN_NAME_KEYS = tuple(k.encode("utf-16-le")[:-1] for k in ("OriginalFilename", "InternalName"))


def _version_value(buf, at: int, lo: int) -> bool:
    """True where the UTF-16 string at `at` is the value of a version resource's OriginalFilename
    or InternalName (cuDNN's cudnn_ops64_9.dll names itself so in .rsrc)."""
    before = bytes(buf[max(lo, at - 40):at])
    return len(before) - len(before.rstrip(b"\0")) in range(3, 8) and before.rstrip(b"\0").endswith(_OWN_NAME_KEYS)


_WINDOW = 16 << 20


def _windows(pattern: re.Pattern[bytes], buf, lo: int, hi: int):
    """pattern.finditer over buf[lo:hi], 16 MiB at a time, each window let go once searched: a
    large section is not held resident whole. A match starting in a window is that window's."""
    for at in range(lo, hi, _WINDOW):
        stop = min(hi, at + _WINDOW)
        for m in pattern.finditer(buf, at, min(hi, stop + 64)):
            if m.start() >= stop:
                break
            yield m
        release(buf, max(lo, at - MAX_NAME * 2), at - MAX_NAME * 2 + _WINDOW)


def api_strings(buf, size: int, regions: list[Region], prefixes: tuple[bytes, ...],
                warnings: list[str]) -> list[StringHit]:
    """NUL-delimited identifiers starting with one of `prefixes` in the data regions (the names a
    binary hands to GetProcAddress / dlsym), read by audit.elf.strings.strings_in. InputError past
    its limit of names (fail closed: a name past it is never dropped in silence)."""
    if not prefixes:
        return []
    try:
        return strings_in(buf, [(r.name, r.offset, r.size) for r in regions], prefixes)[1]
    except Malformed as exc:
        raise InputError(str(exc)) from None


def markers_in(buf, regions: Iterable[Region], markers: tuple[bytes, ...]) -> list[StringHit]:
    """The whole strings in the data regions that start with one of `markers` (a policy's marker
    texts), as audit.elf.strings.marker_strings reads them in an ELF file's data sections.
    InputError past its limit of strings (fail closed)."""
    hits: list[StringHit] = []
    try:
        for reg in regions if markers else ():
            lo, hi = reg.offset, reg.offset + reg.size
            for at in range(lo, hi, _WINDOW):  # a window resident at a time, as _windows does
                stop = min(hi, at + _WINDOW)
                found: list[StringHit] = []
                marker_strings(buf, at, min(hi, stop + MARKER_TEXT_MAX), reg.name, markers, found)
                # a window's own strings: those starting in it, and at its first byte only after a NUL
                hits += [h for h in found if h.offset < stop and (h.offset != at or at == lo or buf[at - 1] == 0)]
                if len(hits) > MAX_MARKERS:
                    raise Malformed(f"more than {MAX_MARKERS} marker strings (the limit): they cannot all be listed")
                release(buf, at, stop)
    except Malformed as exc:
        raise InputError(str(exc)) from None
    return hits


def code_loading(names: Iterable[str]) -> list[str]:
    return sorted({n for n in names if CODE_LOADING_RE.match(n)})


def looks_up_symbols(code_loading_imports: list[str]) -> bool:
    return bool(SYMBOL_LOOKUP & set(code_loading_imports))


class SymbolSink:
    """Collects symbols into SymbolColumns: imports always, defined names when `pattern` (bytes,
    searched anywhere in the name) selects them, counting every one offered per table."""

    def __init__(self, pattern: re.Pattern[bytes] | None):
        self.pattern = pattern
        self.cols = {f: [] for f in SymbolColumns.FIELDS}
        self.counts: dict[str, int] = {}

    def add(self, name: str, defined: bool, table: str, kind: str, bind: str, source: str | None = None) -> None:
        self.counts[table] = self.counts.get(table, 0) + 1
        if defined and self.pattern is not None and not self.pattern.search(name.encode("utf-8", "surrogateescape")):
            return
        for f, v in zip(SymbolColumns.FIELDS, (name, defined, table, kind, bind, None, source)):
            self.cols[f].append(v)

    def columns(self) -> SymbolColumns:
        out = SymbolColumns()
        out.extend(**self.cols)
        return out


def unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))

"""read_elf: one file -> ElfInfo (audit/elf/model.py), fast and fail-closed.

The file is mmap'ed and only the parts that are read are touched (tables, strings, the headers
and symbols of embedded code objects), and parts read once leave the resident set again
(parse.release), so resident memory follows what is being read, not the file's size. Its
sha256 is computed beside the parse, a chunk at a time (audit.elf.hashing: a forked child for a
large file, else a thread), and a very large symbol table is selected in a
forked child too when a CPU is free for it (audit.elf.prescan, audit.elf.idle), which then
decodes the forwarding stubs while this process builds the symbols (this process reads the data
sections' strings while the child selects).
Every failure to read or parse raises audit.errors.InputError with a one-line message naming
the file; nothing else escapes for a malformed input.

What ld.so reads is read whatever the section table says (audit.elf.segments): a file without
section headers through PT_DYNAMIC and PT_LOAD, a section table that contradicts PT_DYNAMIC is
refused, loaded bytes no data section covers are scanned as data, the rest of the loaded bytes
(code and unwind tables, whatever their section flags say) for library names, and device code
is found outside its named sections too (audit.elf.content). Anything that cannot be read (a
section outside the file, more names than a limit) makes the file an error, never a warning
beside a pass. Decompression is bounded
(audit.elf.decompress), and so are the symbol tables (audit.elf.symbols).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import mmap
import os
import re
import stat
import struct
import threading
import zlib
from collections.abc import Callable
from itertools import compress
from operator import not_

import numpy as np

from audit.elf import hashing, prescan, segments
from audit.elf.amdgpu import amdgpu_target, code_object_info, read_hip_fatbin
from audit.elf.content import device_at_targets, device_in_data, wrapper_targets
from audit.elf.dynamic import (read_build_id, read_dynamic, read_interpreter, read_version_defs,
                               read_version_needs)
from audit.elf.forward import read_forwarders
from audit.elf.immediates import assembled_names
from audit.elf.model import DeviceCode, ElfInfo, Forward, StringHit, SymbolColumns
from audit.elf.nvidia import cubin_kernels, read_nv_fatbin
from audit.elf.notes import read_notes
from audit.elf.parse import (EM_AMDGPU, EM_CUDA, PT_LOAD, SHF_ALLOC, SHF_EXECINSTR, SHN_UNDEF, SHT_GNU_VERSYM,
                             SHT_NOBITS, SHT_PROGBITS, ElfImage, Malformed, release)
from audit.elf.strings import SKIP_SECTIONS, identifier_strings, library_strings, scannable
from audit.elf.symbols import load_tables, names_at, select, symbol_columns
from audit.elf.textscan import scan_plan
from audit.errors import InputError

# Imports through which a binary loads code at run time (exact names or prefixes).
CODE_LOADING_RE = re.compile(
    r"^(?:dlopen|dlmopen|dlsym|dlvsym|hipModuleLoad\w*|cuModuleLoad\w*|cuLibraryLoad\w*"
    r"|hiprtc\w*|nvrtc\w*)$")

# Exceptions a malformed file can raise from guarded parsing code: all mean "unparseable".
_MALFORMED = (Malformed, struct.error, ValueError, IndexError, OverflowError, zlib.error,
              UnicodeError)


def is_elf(path: str | os.PathLike) -> bool:
    """True if the path is a regular file starting with the ELF magic (never raises)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 4:
            return False
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def open_regular(path: str, what: str = "an ELF file") -> tuple[int, int]:
    """(fd, size) of a regular, non-empty file; InputError otherwise (never blocks on a FIFO).
    `what` names the format an empty file is not (every format's reader opens files here)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path}: symlink loop") from None
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file")
    if st.st_size == 0:
        raise InputError(f"{path}: empty file (0 bytes), not {what}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return fd, st.st_size


def read_elf(path: str | os.PathLike, symbol_pattern: re.Pattern[bytes] | None = None,
             api_prefixes: tuple[bytes, ...] = (), meanwhile: Callable[[bool], object] | None = None,
             on_symbols: Callable[[SymbolColumns], object] | None = None, sha256: bool = True,
             markers: tuple[bytes, ...] = ()) -> ElfInfo:
    """Read one ELF file. Keeps imports always and other symbols when their (bytes) names match
    `symbol_pattern` (searched anywhere in the name; see audit.elf.symbols). Where the object
    imports dlsym/dlvsym, strings in its data that are identifiers starting with one of
    `api_prefixes` are kept as `api_strings`. `meanwhile(device_code)`, if given, is called once
    while helper processes read for this one (the caller's own preparation, off the critical
    path; `device_code`: whether the file has a GPU code section, so work only kernels need can
    be left), and
    `on_symbols(symbols)` once the kept symbols are known while a helper still reads (the caller
    may start on them); neither is called if no helper reads. `sha256=False`: the file is not
    hashed (ElfInfo.sha256 stays ""), for a caller that shows no hash. The whole strings in its
    data that start with one of `markers` (a policy's marker texts) are kept as `marker_strings`,
    read in the data-string pass (audit.elf.strings.marker_strings). Raises InputError."""
    path = os.fspath(path)
    fd, size = open_regular(path)
    try:
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: cannot map file: {exc}") from None
    finally:
        os.close(fd)
    try:
        info = read_elf_buffer(path, mm, symbol_pattern, hash_path=path, api_prefixes=api_prefixes,
                               meanwhile=meanwhile, on_symbols=on_symbols, sha256=sha256, markers=markers)
        info.read_assembled_names = functools.partial(read_assembled_names, path)
        return info
    finally:
        try:
            mm.close()
        except BufferError:  # a numpy view still refers to it; it is unmapped when collected
            pass


def read_assembled_names(path: str) -> list[StringHit]:
    """Library names assembled in the code of the ELF file at `path` (audit.elf.immediates);
    [] if it cannot be read again (it was read once already: a change since is not chased)."""
    try:
        fd, _size = open_regular(path)
    except InputError:
        return []
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            return assembled_names(ElfImage(mm), [])
    except (OSError, ValueError, *_MALFORMED):
        return []
    finally:
        os.close(fd)


def assembled_names_in(buf) -> list[StringHit]:
    """read_assembled_names for bytes in memory (an archive member read again)."""
    try:
        return assembled_names(ElfImage(buf), [])
    except _MALFORMED:
        return []


def read_elf_buffer(name: str, buf, symbol_pattern: re.Pattern[bytes] | None = None, *,
                    hash_path: str | None = None, api_prefixes: tuple[bytes, ...] = (),
                    meanwhile: Callable[[bool], object] | None = None,
                    on_symbols: Callable[[SymbolColumns], object] | None = None, sha256: bool = True,
                    markers: tuple[bytes, ...] = ()) -> ElfInfo:
    """read_elf on bytes already in memory (an archive member); `name` labels it in messages.
    `buf` must offer find/rfind (bytes, mmap): the string scans use them. The sha256 is of
    `buf`, or of the file at `hash_path` read plainly (then mapped pages are not all touched);
    none with `sha256=False`."""
    if len(buf) == 0:
        raise InputError(f"{name}: empty file (0 bytes), not an ELF file")
    digest: dict[str, str] = {}
    if not sha256:
        hasher = None
    elif hash_path is not None:
        hasher = hashing.Hasher(hash_path)  # a large file: in a forked child (audit.elf.hashing)
    else:
        hasher = threading.Thread(target=lambda: digest.setdefault("sha256", hashlib.sha256(buf).hexdigest()),
                                  daemon=True)
    pre, sel = _prescan(buf, symbol_pattern)  # forks: before any thread of ours starts
    if hasher is not None:
        hasher.start()
    try:
        info = _parse(name, buf, symbol_pattern, api_prefixes, pre, sel, meanwhile, on_symbols, markers)
    except _MALFORMED as exc:
        msg = str(exc) or type(exc).__name__
        raise InputError(f"{name}: not a readable ELF file: {msg}") from None
    except MemoryError:
        raise InputError(f"{name}: too large to read (out of memory)") from None
    finally:
        if isinstance(hasher, hashing.Hasher):
            digest["sha256"] = hasher.result() or ""
        elif hasher is not None:
            hasher.join()
        if pre is not None:
            pre.close()
    info.sha256 = digest.get("sha256", "")
    if not info.sha256 and sha256:
        raise InputError(f"{name}: could not hash the file")
    return info


def _prescan(buf, symbol_pattern) -> tuple[prescan.Prescan | None, dict]:
    """The largest symbol table handed to a forked child (audit.elf.prescan), if it is large,
    and the other tables' selections ({section index: _select's answer}), made here while the
    child selects and handed over to it: it decodes the forwarding stubs, which need every table."""
    try:
        img = ElfImage(buf)
        tables = load_tables(img) if img.sections else []
        big = prescan.candidate(tables, symbol_pattern)
        if big is None:
            return None, {}
        keep = _keep_imports(tables)
    except _MALFORMED:
        return None, {}  # _parse reports it
    scan_plan(symbol_pattern)  # the pattern's scanner, made once here: the child inherits it
    then = functools.partial(_child_forwarders, img, tables, keep, big.index)
    pre = prescan.start(img, big, symbol_pattern, keep[big.index], then,
                        rows=sum(len(t) for t in tables if t is not big),
                        text=sum(t.str_size for t in tables if t is not big))
    try:
        sel = {t.index: _select(img, t, symbol_pattern, keep[t.index]) for t in tables if t is not big}
    except _MALFORMED:
        sel = {}  # _parse reports it (the child, left without, stops)
    if pre is not None:
        pre.give(sel)
    return pre, sel


def _keep_imports(tables) -> dict[int, bool]:
    """Per table: are its imports kept? From .dynsym; from .symtab only when there is no .dynsym
    (relocatable objects)."""
    has_dynsym = any(t.name == ".dynsym" for t in tables)
    return {t.index: t.name == ".dynsym" or not has_dynsym for t in tables}


def _select(img: ElfImage, table, symbol_pattern, keep_imports: bool):
    """(indices kept, their name ends, their names, warnings) of one table."""
    warns: list[str] = []
    idx, ends = select(img, table, symbol_pattern, keep_imports, warns)
    names = names_at(img, table, table.syms["st_name"][idx].tolist(), ends.tolist())
    return idx, ends, names, warns


def _code_loading(tables, sel: dict) -> list[str]:
    """Imported names through which the object loads code (CODE_LOADING_RE), over the tables
    selected so far."""
    found = set()
    for table in tables:
        if table.index in sel:
            idx, _, names, _ = sel[table.index]
            undefined = (table.syms["st_shndx"][idx] == SHN_UNDEF).tolist()
            found.update(filter(CODE_LOADING_RE.match, compress(names, undefined)))
    return sorted(found)


def _imports_dlsym(code_loading: list[str]) -> bool:
    return bool({"dlsym", "dlvsym"} & {n.split("@", 1)[0] for n in code_loading})


def _forwarders(img: ElfImage, tables, sel: dict, imports_dlsym: bool, picks=None) -> tuple[list[Forward], str | None]:
    """(forwarders, a warning if the code could not be read): a refinement of what the symbols
    say, so a failure leaves them as they are."""
    dynsym = next((t for t in tables if t.name == ".dynsym"), None)
    if picks is None:
        picks = [(t.syms[sel[t.index][0]], sel[t.index][2]) for t in tables]
    try:
        return read_forwarders(img, dynsym, picks, imports_dlsym), None
    except _MALFORMED as exc:
        return [], f"forwarding stubs not read: {exc or type(exc).__name__}"


def _child_forwarders(img, tables, keep: dict[int, bool], index: int, got, given: dict) -> tuple:
    """In the prescan child, once the large table (`index`) is sent and the parent has handed
    over the others' selections (`given`: their indices, name ends, names, warnings): the
    forwarding stubs, as _parse would decode them from every table's selection."""
    sel = {index: got}
    for t in tables:
        if t.index != index:
            idx, ends, names, warns = given[t.index]
            if names is None:  # not handed over: read here
                names = names_at(img, t, t.syms["st_name"][idx].tolist(), ends.tolist())
            sel[t.index] = idx, ends, names, warns
    dlsym = _imports_dlsym(_code_loading(tables, sel))
    picks = [(t.syms[sel[t.index][0]], sel[t.index][2]) for t in tables]
    for t in tables:  # read once: memory for the code
        sec = img.sections[t.index]
        release(img.buf, sec.offset, sec.offset + sec.size)
        release(img.buf, t.str_off, t.str_off + t.str_size)
    return _forwarders(img, tables, sel, dlsym, picks)


def _parse(path: str, mm, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
           pre: prescan.Prescan | None = None, selected: dict | None = None,
           meanwhile: Callable[[bool], object] | None = None,
           on_symbols: Callable[[SymbolColumns], object] | None = None,
           markers: tuple[bytes, ...] = ()) -> ElfInfo:
    """The whole reading; `pre`, `selected`: what _prescan started and selected already."""
    img = ElfImage(mm)
    warnings = list(img.warnings)
    # Without section headers the tables come from PT_DYNAMIC, as ld.so reads them; with them,
    # both must agree, and loaded bytes no scanned section covers are read as data all the same.
    synthetic = not img.sections and any(seg.type == PT_LOAD for seg in img.segments)
    if synthetic:
        warnings += segments.synthesize(img)
    elif img.sections and any(seg.type == PT_LOAD for seg in img.segments):
        segments.check_consistent(img)
        covered = [(sec.offset, sec.offset + sec.size) for sec in img.sections
                   if _is_device_section(sec) or (sec.type == SHT_PROGBITS and sec.flags & SHF_ALLOC
                                                 and not sec.flags & SHF_EXECINSTR and sec.size
                                                 and sec.name not in SKIP_SECTIONS)]
        img.extra_ranges = segments.load_gaps(img, covered=covered)
        img.code_ranges = segments.unread_ranges(img, covered + [(r.offset, r.offset + r.size)
                                                                 for r in img.extra_ranges])
    for sec in img.sections:  # code is read too (library names, immediates): all of it, or an error
        if sec.type == SHT_PROGBITS and sec.flags & SHF_EXECINSTR and sec.size:
            if sec.offset + sec.size > img.size:
                raise Malformed(f"executable section {sec.name or sec.index} (offset {sec.offset:#x}, size "
                                f"{sec.size:#x}) lies outside the file ({img.size:#x} bytes)")
    dyn = read_dynamic(img)
    warnings += dyn.warnings
    needs, need_index = read_version_needs(img) if img.sections else ([], {})
    versions: dict[int, tuple[str, str | None]] = {k: (v, None) for k, v in read_version_defs(img).items()}
    versions.update(need_index)
    versions.pop(0, None)  # VER_NDX_LOCAL / VER_NDX_GLOBAL: an unversioned symbol
    versions.pop(1, None)
    if synthetic:  # the rest is read through the program headers (segments.synthesize says so)
        warnings.append("no section header table: forwarding stubs not decoded (they are told apart "
                        "by the sections they lie in)")
    elif not img.sections:  # no PT_LOAD either: nothing is loaded, so nothing is there to read
        warnings.append("no section header table and no PT_LOAD segment: nothing loadable to read")

    tables = load_tables(img)
    keep = _keep_imports(tables)
    counts: dict[str, int] = {}
    sel: dict[int, tuple] = {}
    for table in tables:
        counts[table.name] = counts.get(table.name, 0) + len(table)
        if pre is not None and pre.index == table.index:  # the child's table is collected below
            continue
        got = (selected or {}).get(table.index)
        sel[table.index] = got or _select(img, table, symbol_pattern, keep[table.index])
    # While the child reads its table: the data sections' strings (the API names handed to dlsym
    # only where dlsym is imported: that scan reads all data), with what the tables read so far say.
    api_warn: list[str] = []
    lib_warn: list[str] = []
    early = _code_loading(tables, sel)
    early_dlsym = _imports_dlsym(early)
    api = identifier_strings(img, api_prefixes, api_warn) if api_prefixes and early_dlsym else []
    marked: list[StringHit] = []
    strings = library_strings(img, lib_warn, markers, marked)
    if pre is not None:
        _run_hook(meanwhile, any(_is_device_section(sec) for sec in img.sections))
        big = next(t for t in tables if t.index == pre.index)
        sel[big.index] = pre.result() or _select(img, big, symbol_pattern, keep[big.index])

    symbols = SymbolColumns()
    picks = []
    for table in tables:
        idx, ends, names, warns = sel[table.index]
        warnings += warns
        versym = _versym(img, table) if table.name == ".dynsym" else None
        symbols.extend(**symbol_columns(img, table, idx, versions, versym, ends, names))
        picks.append((table.syms[idx], names))  # a copy of the kept entries: the table's pages go now
        sec = img.sections[table.index]
        release(img.buf, sec.offset, sec.offset + sec.size)  # read once: memory for the next table
        release(img.buf, table.str_off, table.str_off + table.str_size)
    if pre is None:
        code_loading = early
    else:
        code_loading = sorted(set(filter(CODE_LOADING_RE.match, compress(symbols.name, map(not_, symbols.defined)))))
    imports_dlsym = _imports_dlsym(code_loading)
    if api_prefixes and imports_dlsym and not early_dlsym:  # dlsym is imported in the child's table
        api = identifier_strings(img, api_prefixes, api_warn)
    warnings += api_warn
    if pre is not None:
        _run_hook(on_symbols, symbols)
    done = pre.then() if pre is not None else None  # decoded by the child, exactly as here
    if synthetic:  # the stubs are told apart by the sections they lie in: none are known
        forwarders, fw_warn = [], None
    else:
        forwarders, fw_warn = done if done is not None else _forwarders(img, tables, sel, imports_dlsym, picks)
    if fw_warn:
        warnings.append(fw_warn)

    device = []
    for sec in img.sections:
        if _is_device_section(sec):
            img.check_range(sec.offset, sec.size, f"section {sec.name}")
            reader = read_hip_fatbin if sec.name == ".hip_fatbin" else read_nv_fatbin
            device += reader(img.buf, sec.offset, sec.offset + sec.size, sec.name)  # in place
    device += _device_elsewhere(img, synthetic)
    device += _device_file(img)
    warnings += lib_warn
    notes = read_notes(img)
    interpreter = read_interpreter(img)  # a program: ld.so honours its audit libraries

    return ElfInfo(
        path=path, sha256="", size=img.size, build_id=read_build_id(img), elf_class=img.bits,
        machine=img.machine_name, endian=img.endian, elf_type=img.type_name, soname=dyn.soname,
        needed=dyn.needed, rpath=dyn.rpath, runpath=dyn.runpath, interpreter=interpreter,
        extra_loads=dyn.filters + (dyn.audit if interpreter else []),
        version_needs=needs, symbols=symbols, symbol_counts=counts,
        code_loading_imports=code_loading, forwarders=forwarders, library_strings=strings,
        api_strings=api, marker_strings=marked,
        device_code=device, warnings=warnings + notes.warnings, package_note=notes.package,
        dlopen_declared=notes.dlopen)


def _device_elsewhere(img: ElfImage, synthetic: bool) -> list:
    """Device code outside the sections named for it: found by content where names are not
    known (no section headers, unnamed sections), else at the registration wrappers' targets."""
    places = list(scannable(img)) + img.code_ranges  # code and unwind tables too: flags are not evidence
    unnamed = any(not sec.name for sec in img.sections[1:])
    targets = None if synthetic or unnamed else wrapper_targets(img, segments.relative_addend(img))
    if targets is None:
        return device_in_data(img, places)
    named = [(sec.offset, sec.offset + sec.size) for sec in img.sections if _is_device_section(sec)]
    return device_at_targets(img, targets, named, places)


def _device_file(img: ElfImage) -> list[DeviceCode]:
    """The file itself as device code when it is one: a standalone cubin (EM_CUDA: what
    TensorRT-LLM and FlashInfer ship as `.cubin` files) or an AMDGPU code object (EM_AMDGPU, a
    `.hsaco`/`.co`), so its kernels are judged as kernels wherever the file sits. One entry for
    the whole file (section "file", offset 0), its target from e_flags; a file whose kernels
    cannot be read is an entry with `error` (fail closed), never a pass."""
    if img.e_machine == EM_CUDA:
        kind, target = "cubin", cuda_target(img.e_flags, img.abiversion)
        read = cubin_kernels
    elif img.e_machine == EM_AMDGPU:
        kind, target = "amdgcn-code-object", amdgpu_target(img.e_flags, img.osabi, img.abiversion)
        read = lambda buf: code_object_info(buf)[1]  # noqa: E731
    else:
        return []
    base = dict(container="file", section="file", offset=0, size=img.size, kind=kind, target=target)
    try:
        return [DeviceCode(kernels=read(memoryview(img.buf)), **base)]
    except _MALFORMED as exc:
        return [DeviceCode(error=f"{kind} unreadable: {exc}", **base)]


def cuda_target(e_flags: int, abiversion: int) -> str:
    """`sm_<N>` of a cubin from its e_flags (LLVM's BinaryFormat/ELF.h, EM_CUDA): ELF ABI version 8
    (ELFABIVERSION_CUDA_V2, CUDA 12.8 on) keeps the SM number in bits 8-15; version 7 and older in
    bits 0-7, with 0x800 (EF_CUDA_ACCELERATORS) for an `a` target such as sm_90a."""
    if abiversion >= 8:
        return f"sm_{(e_flags >> 8) & 0xFF}"
    return f"sm_{e_flags & 0xFF}" + ("a" if e_flags & 0x800 else "")


def _is_device_section(sec) -> bool:
    """A section of embedded GPU code objects (read_hip_fatbin, read_nv_fatbin)."""
    return sec.name in (".hip_fatbin", ".nv_fatbin") and sec.type != SHT_NOBITS and bool(sec.size)


def _run_hook(hook, *args) -> None:
    """A caller's work run while a helper reads: a failure is its own to report when it does
    the same work again, never this file's."""
    if hook is not None:
        try:
            hook(*args)
        except Exception:  # noqa: BLE001
            pass


def _versym(img: ElfImage, table) -> np.ndarray | None:
    for sec in img.sections:
        if sec.type == SHT_GNU_VERSYM and sec.link == table.index:
            count = sec.size // 2
            img.check_range(sec.offset, count * 2, "section .gnu.version")
            return np.frombuffer(img.buf, dtype=img.e + "u2", count=count, offset=sec.offset)
    return None

"""NVIDIA fatbins in `.nv_fatbin`: every PTX and cubin entry, and the kernels each defines.

Layout (CUDA fatbin, as cuobjdump reads it): fatbin header u32 magic 0xBA55ED50, u16 version, u16
header size, u64 payload size; then entries: u16 kind @0 (1 PTX, 2 cubin), u32 entry-header size
@4, u64 payload size @8, u32 compressed size @0x10, u16 minor @0x18, u16 major @0x1a, u32 SM
@0x1c, u64 flags @0x28 (0x2000 LZ4, 0x8000 zstd, 0x100000 an "a" target), u64 uncompressed size
@0x38 (0x200000 marks an "f" family target like sm_100f, as nvcc 13.0 writes it). A section may hold several fatbins (one per translation unit), so it is walked by magic.
"""

from __future__ import annotations

import re
import struct
import zlib

import numpy as np

from audit.elf.decompress import MAX_OUTPUT, MAX_RATIO, RATIO_FLOOR, DecompressError, inflate
from audit.elf.model import DeviceCode
from audit.elf.parse import EM_CUDA, ElfImage, Malformed, decode, has_nonzero, release

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_LZ4, FLAG_ZSTD, FLAG_ARCH_A = 0x2000, 0x8000, 0x100000
FLAG_ARCH_F = 0x200000  # a family target like sm_100f (seen with nvcc 13.0; not in the reference)
STO_CUDA_ENTRY = 0x10  # st_other bit nvcc sets on __global__ functions
_PTX_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_$%][A-Za-z0-9_$%]*)")
ENTRY_MIN = 0x40


def cubin_kernels(data) -> tuple[str, ...]:
    """Kernel names of a cubin (any buffer: a memoryview reads it in place): FUNC symbols
    marked as entries, else `.text.<name>` sections."""
    names = _entry_names_fast(data)
    if names is not None:
        return names
    from audit.elf.symbols import load_tables, name_ends, names_at  # local: avoids an import cycle

    img = ElfImage(data)
    if img.e_machine != EM_CUDA:
        raise Malformed(f"cubin has e_machine {img.e_machine}, not EM_CUDA (190)")
    names: dict[str, None] = {}
    for table in load_tables(img):
        syms = table.syms
        entry = ((syms["st_info"] & 0xF) == 2) & ((syms["st_other"] & STO_CUDA_ENTRY) != 0) \
            & (syms["st_shndx"] != 0)
        idx = np.flatnonzero(entry)
        if len(idx):
            for name in names_at(img, table, syms["st_name"][idx].tolist(), name_ends(img, table, idx).tolist()):
                names[name] = None
    if not names:
        for sec in img.sections:
            if sec.name.startswith(".text.") and len(sec.name) > 6:
                names[sec.name[6:]] = None
    return tuple(names)


# The fast path of cubin_kernels, for what nvcc writes (ELF64, little endian, EM_CUDA, plain
# section and program header tables): only the header, the section table (one numpy view, no
# Python object per section) and the symbol tables are read. Anything it does not vouch for
# (another layout, a check ElfImage or load_tables would fail) returns None, and the full reader
# above gives the answer, or the error, in its own words: the result is the same either way,
# only the ~60 section objects per cubin (350k in cuBLASLt) are saved.
_EHDR = struct.Struct("<HHIQQQIHHHHHH")
_SHDR = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
                  ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("align", "<u8"), ("entsize", "<u8")])
_SYM64 = np.dtype([("st_name", "<u4"), ("st_info", "u1"), ("st_other", "u1"), ("st_shndx", "<u2"),
                   ("st_value", "<u8"), ("st_size", "<u8")])


class _Buf:
    __slots__ = ("buf",)  # what symbols.name_ends / names_at read of an ElfImage

    def __init__(self, buf):
        self.buf = buf


def _entry_names_fast(data) -> tuple[str, ...] | None:
    from audit.elf.symbols import MAX_ENTRIES, SymbolTable, name_ends, names_at

    size = len(data)
    if size < 64 or bytes(data[:6]) != b"\x7fELF\x02\x01":
        return None
    (_type, machine, _v, _entry, phoff, shoff, _flags, _eh, phentsize, phnum, shentsize, shnum,
     shstrndx) = _EHDR.unpack_from(data, 16)
    if machine != EM_CUDA or shoff == 0 or shnum == 0 or shentsize != 64 or shstrndx == 0xFFFF \
            or shnum > (size - shoff) // 64:
        return None
    if phoff and phnum and (phentsize < 56 or phnum == 0xFFFF or phoff + phnum * phentsize > size):
        return None
    shdrs = np.frombuffer(data, dtype=_SHDR, count=shnum, offset=shoff)
    types = shdrs["type"]
    names: dict[str, None] = {}
    img = _Buf(data)
    for i in np.flatnonzero((types == 2) | (types == 11)).tolist():
        sh = shdrs[i]
        off, ssize, link, entsize = int(sh["offset"]), int(sh["size"]), int(sh["link"]), int(sh["entsize"])
        if entsize not in (0, 24) or off + ssize > size or not 0 < link < shnum:
            return None
        count = ssize // 24
        if count > MAX_ENTRIES:
            return None
        st = shdrs[link]
        str_off, str_size = int(st["offset"]), int(st["size"])
        if str_off + str_size > size:
            return None
        if count == 0:
            continue
        syms = np.frombuffer(data, dtype=_SYM64, count=count, offset=off)
        idx = np.flatnonzero(((syms["st_info"] & 0xF) == 2) & ((syms["st_other"] & STO_CUDA_ENTRY) != 0)
                             & (syms["st_shndx"] != 0))
        if len(idx):
            table = SymbolTable(".symtab" if types[i] == 2 else ".dynsym", i, syms, str_off, str_size)
            for name in names_at(img, table, syms["st_name"][idx].tolist(), name_ends(img, table, idx).tolist()):
                names[name] = None
    if not names:  # no entry symbol: the `.text.<name>` sections, as the full reader names them
        if not 0 < shstrndx < shnum:
            return None
        st = shdrs[shstrndx]
        str_off, str_size = int(st["offset"]), int(st["size"])
        if st["type"] == 8 or str_off + str_size > size:  # SHT_NOBITS, or outside: ElfImage warns
            return None
        blob = bytes(data[str_off:str_off + str_size])
        for at in shdrs["name"].tolist():
            if at < str_size and blob.startswith(b".text.", at):
                end = blob.find(b"\0", at)
                raw = blob[at:end if end >= 0 else str_size]
                if len(raw) > 6:
                    names[decode(raw)[6:]] = None
    return tuple(names)


def ptx_kernels(text: bytes) -> tuple[str, ...]:
    return tuple(dict.fromkeys(decode(m.group(1)) for m in _PTX_ENTRY_RE.finditer(text)))


class _Entry:
    """One fatbin entry's header, read; its payload still to decompress and parse."""

    __slots__ = ("base", "kind", "algo", "payload", "usize", "span")

    def __init__(self, base, kind, algo, payload, usize, span):
        self.base, self.kind, self.algo, self.payload, self.usize, self.span = base, kind, algo, payload, usize, span


def _header(data, at: int, end: int, section: str, file_off: int) -> tuple[_Entry | DeviceCode, int]:
    kind_code, hsize, psize = struct.unpack_from("<HxxIQ", data, at)
    csize, minor, major, sm = struct.unpack_from("<IxxxxHHI", data, at + 0x10)
    flags = struct.unpack_from("<Q", data, at + 0x28)[0]
    usize = struct.unpack_from("<Q", data, at + 0x38)[0] if hsize >= 0x40 else 0
    if hsize < ENTRY_MIN or at + hsize + psize > end:
        raise Malformed(f"{section}+{file_off:#x}: fatbin entry (header {hsize}, payload {psize}) "
                        "runs past its fatbin")
    suffix = "a" if flags & FLAG_ARCH_A else "f" if flags & FLAG_ARCH_F else ""
    kind = {KIND_PTX: "ptx", KIND_CUBIN: "cubin"}.get(kind_code, "unknown")
    target = f"{'compute' if kind == 'ptx' else 'sm'}_{sm}{suffix}"
    algo = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else None
    start = at + hsize
    base = dict(container="nv_fatbin", section=section, offset=file_off + hsize, size=psize,
                kind=kind, target=target, compressed=algo)
    if kind == "unknown":
        return DeviceCode(**base, error=f"unknown fatbin entry kind {kind_code}"), hsize + psize
    payload = memoryview(data)[start:start + psize]  # in place: no copy of a stored cubin
    if algo and csize and csize <= psize:
        payload = payload[:csize]
    return _Entry(base, kind, algo, payload, usize, (at, at + hsize + psize)), hsize + psize


def _inflated(e: _Entry):
    """The entry's payload, decompressed; a DecompressError is returned, not raised."""
    if not e.algo:
        return e.payload
    if e.algo == "zstd":
        out = _zstd_whole(e.payload, e.usize)
        if out is not None:
            return out
    try:
        return inflate(e.algo, e.payload, e.usize or None)[0]
    except DecompressError as exc:
        return exc


_ZSTD = None


def _zstd_whole(payload, declared: int):
    """A zstd payload decompressed in one call, where that is safe and gives what inflate would:
    its frame states its size, no larger than the size the fatbin declares, within inflate's
    limits (so the buffer allocated is bounded as inflate's output is), and the output has that
    size. None otherwise (no size, an error, a mismatch): inflate then decompresses it, a piece
    at a time, and words any error. A cubin is a few KB: fed 512 bytes at a time, the
    per-call overhead was most of the time of cuBLASLt's 1,600 zstd entries."""
    try:
        import zstandard
    except ImportError:
        return None
    n = len(payload)
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError:
        return None
    if not 0 < size <= declared or size > MAX_OUTPUT or (size >= RATIO_FLOOR and size > MAX_RATIO * max(n, 1)):
        return None
    global _ZSTD
    if _ZSTD is None:
        _ZSTD = zstandard.ZstdDecompressor()  # one context for all: making one costs as much as a cubin
    try:
        out = _ZSTD.decompress(payload, max_output_size=size)
    except zstandard.ZstdError:
        return None
    return out if len(out) == size else None


def _finish(e: _Entry, payload) -> DeviceCode:
    if isinstance(payload, DecompressError):
        return DeviceCode(**e.base, error=str(payload))
    try:
        kernels = ptx_kernels(payload) if e.kind == "ptx" else cubin_kernels(payload)
    except (Malformed, struct.error, ValueError) as exc:
        return DeviceCode(**e.base, error=f"cubin unreadable: {exc}")
    return DeviceCode(**e.base, kernels=kernels)


def _decoded(entries: list, buf) -> list[DeviceCode]:
    """Each entry decompressed and parsed, in order; its pages leave the resident set once it is
    done (parse.release: one fatbin can be most of a 700 MB library). Decompression stays on
    this thread: on helper threads glibc's per-thread arenas kept twice the memory (measured on
    cuDNN's engines: 345 MB peak against 153 MB) for no less CPU time.

    An entry whose payload is byte for byte one already read (same kind, compression and
    declared size) gets that entry's outcome without being decompressed again: cuBLASLt repeats
    its cubins, 6,000 entries hold ~1,400 different payloads. Candidates are found by CRC-32 and
    confirmed by comparing the bytes (a collision costs a comparison, never a wrong answer); a
    few are kept per key, so a file built to collide cannot make it quadratic."""
    out: list[DeviceCode] = []
    seen: dict[tuple, list] = {}
    for e in entries:
        if isinstance(e, DeviceCode):
            out.append(e)
            continue
        key = (e.kind, e.algo, e.usize, len(e.payload), zlib.crc32(e.payload))
        same = seen.setdefault(key, [])
        for payload, span, kernels, error in same:
            matched = bytes(payload) == bytes(e.payload)
            release(buf, *span)
            if matched:
                out.append(DeviceCode(**e.base, error=error) if error is not None
                           else DeviceCode(**e.base, kernels=kernels))
                break
        else:
            code = _finish(e, _inflated(e))
            if len(same) < _SAME_KEPT:
                same.append((e.payload, e.span, code.kernels, code.error))
            out.append(code)
        release(buf, *e.span)
    return out


_SAME_KEPT = 4  # payloads kept per (kind, compression, sizes, CRC-32) key


def read_nv_fatbin(buf, start: int, end: int, section: str) -> list[DeviceCode]:
    """Every fatbin entry in one `.nv_fatbin` section, buf[start:end], in order.

    `buf` is the whole mapped file (it must have `find`): offsets are file offsets, and a
    stored (uncompressed) cubin is read in place."""
    entries: list = []
    pos = start
    while pos < end:
        at = buf.find(FATBIN_MAGIC, pos, end)
        if at < 0:
            break
        where = f"{section}+{at:#x}"
        if at + 16 > end:
            entries.append(_error(section, at, end - at, f"{where}: truncated fatbin header"))
            break
        _magic, _version, hsize, fsize = struct.unpack_from("<IHHQ", buf, at)
        fend = at + hsize + fsize
        if hsize < 16 or fend > end:
            entries.append(_error(section, at, end - at,
                                  f"{where}: fatbin (header {hsize}, size {fsize}) runs past the section"))
            pos = at + 4
            continue
        epos = at + hsize
        while epos + ENTRY_MIN <= fend:
            try:
                entry, used = _header(buf, epos, fend, section, epos)
            except Malformed as exc:
                entries.append(_error(section, epos, fend - epos, str(exc)))
                break
            entries.append(entry)
            # the kernel maps the pages around a header it reads (fault-around, 64 KiB): let
            # them go now, or 5,700 headers keep ~300 MB of payloads resident before decoding
            window = epos & ~0xFFFF
            release(buf, window, window + 0x10000)
            epos += used  # used >= ENTRY_MIN: the walk ends
        pos = max(fend, at + 4)
    out = _decoded(entries, buf)
    if not out and has_nonzero(buf, start, end):
        out.append(_error(section, start, end - start, "section holds data but no fatbin"))
    return out


def _error(section, off, size, msg) -> DeviceCode:
    return DeviceCode(container="nv_fatbin", section=section, offset=off, size=size,
                      kind="unknown", target="unknown", error=msg)

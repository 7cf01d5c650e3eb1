"""Clang offload bundles in `.hip_fatbin` and the AMDGPU code objects inside them.

Layout (LLVM clang-offload-bundler format): a bundle is `__CLANG_OFFLOAD_BUNDLE__`, u64 entry count,
then per entry u64 offset (from the bundle start), u64 size, u64 id length, id bytes. A compressed
bundle starts `CCOB` (v1/v2/v3, zlib or zstd) and holds one such bundle. A section holds one bundle
per translation unit, so the whole section is walked. A bundle that cannot be read becomes a
DeviceCode with `error` set (the linkage stage fails closed on it), never an exception.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from audit.elf.decompress import DecompressError, inflate
from audit.elf.model import DeviceCode
from audit.elf.parse import EM_AMDGPU, ElfImage, Malformed, decode, has_nonzero, release

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
CCOB_METHODS = {0: "zlib", 1: "zstd"}
# The next bundle of either kind: one search that stops at the nearest, so walking a section
# reads the gaps between bundles and never the code objects the walk steps over.
_MAGIC_RE = re.compile(re.escape(BUNDLE_MAGIC) + b"|" + CCOB_MAGIC)

# EF_AMDGPU_MACH (e_flags & 0xff): LLVM's BinaryFormat/ELF.h, current through gfx1250/gfx1251 and
# gfx13 (llvm/test/CodeGen/AMDGPU/elf-header-flags-mach.ll lists each target with its value).
# gfx940 (0x40) and gfx941 (0x4b) are reserved in LLVM now but were emitted by LLVM 15-18: objects
# built then still carry them. A value absent here is a target this table does not know yet.
AMDGPU_MACH = {
    0x20: "gfx600", 0x21: "gfx601", 0x22: "gfx700", 0x23: "gfx701", 0x24: "gfx702",
    0x25: "gfx703", 0x26: "gfx704", 0x28: "gfx801", 0x29: "gfx802", 0x2A: "gfx803",
    0x2B: "gfx810", 0x2C: "gfx900", 0x2D: "gfx902", 0x2E: "gfx904", 0x2F: "gfx906",
    0x30: "gfx908", 0x31: "gfx909", 0x32: "gfx90c", 0x33: "gfx1010", 0x34: "gfx1011",
    0x35: "gfx1012", 0x36: "gfx1030", 0x37: "gfx1031", 0x38: "gfx1032", 0x39: "gfx1033",
    0x3A: "gfx602", 0x3B: "gfx705", 0x3C: "gfx805", 0x3D: "gfx1035", 0x3E: "gfx1034",
    0x3F: "gfx90a", 0x40: "gfx940", 0x41: "gfx1100", 0x42: "gfx1013", 0x43: "gfx1150",
    0x44: "gfx1103", 0x45: "gfx1036", 0x46: "gfx1101", 0x47: "gfx1102", 0x48: "gfx1200",
    0x49: "gfx1250", 0x4A: "gfx1151", 0x4B: "gfx941", 0x4C: "gfx942", 0x4E: "gfx1201",
    0x4F: "gfx950", 0x50: "gfx1310", 0x51: "gfx9-generic", 0x52: "gfx10-1-generic",
    0x53: "gfx10-3-generic", 0x54: "gfx11-generic", 0x55: "gfx1152", 0x57: "gfx1154",
    0x58: "gfx1153", 0x59: "gfx12-generic", 0x5A: "gfx1251", 0x5B: "gfx12-5-generic",
    0x5C: "gfx1172", 0x5D: "gfx1170", 0x5E: "gfx1171", 0x5F: "gfx9-4-generic",
    0x62: "gfx11-7-generic", 0x63: "gfx13-generic",
}
ELFOSABI_AMDGPU_HSA = 64
_FEATURE_V4 = {1: "", 2: "-", 3: "+"}  # 0 unsupported, 1 any (no suffix), 2 off, 3 on


def amdgpu_target(e_flags: int, osabi: int, abiversion: int) -> str:
    """The target id, e.g. "gfx1030" or "gfx90a:sramecc+:xnack-", from e_flags.

    HSA code object v4+ (ABI version >= 2) encode xnack in bits 8-9 and sramecc in bits 10-11;
    v3 (ABI version 1) has one on/off bit each (0x100 xnack, 0x200 sramecc)."""
    mach = e_flags & 0xFF
    name = AMDGPU_MACH.get(mach, f"gfx-unknown-{mach:#04x}")
    feats = []
    if osabi == ELFOSABI_AMDGPU_HSA and abiversion >= 2:
        sramecc = _FEATURE_V4.get((e_flags >> 10) & 3, "")
        xnack = _FEATURE_V4.get((e_flags >> 8) & 3, "")
        if sramecc:
            feats.append("sramecc" + sramecc)
        if xnack:
            feats.append("xnack" + xnack)
    elif osabi == ELFOSABI_AMDGPU_HSA and abiversion == 1:
        if e_flags & 0x200:
            feats.append("sramecc+")
        if e_flags & 0x100:
            feats.append("xnack+")
    return ":".join([name] + feats)


def code_object_info(data) -> tuple[str, tuple[str, ...]]:
    """(target, kernel names) of one AMDGPU code object (any buffer: a memoryview reads it in
    place); Malformed if it is not one."""
    from audit.elf.symbols import load_tables, names_ending  # local: avoids an import cycle

    img = ElfImage(data)
    if img.e_machine != EM_AMDGPU:
        raise Malformed(f"code object has e_machine {img.e_machine}, not EM_AMDGPU (224)")
    target = amdgpu_target(img.e_flags, data[7], data[8])  # raw bytes: pyelftools misnames OSABI 64
    kernels: dict[str, None] = {}  # ordered, deduplicated (.dynsym and .symtab both list them)
    for table in load_tables(img):
        defined = np.flatnonzero(table.syms["st_shndx"] != 0)
        for name in names_ending(img, table, defined, b".kd"):  # the kernel descriptors
            kernels[name[:-3]] = None
    return target, tuple(kernels)


def _entries(data, at: int, end: int, where: str):
    """Yield (offset, size, id, end of the entry table) for each entry of the uncompressed
    bundle at data[at:end]."""
    n = end - at
    if n < 32:
        raise Malformed(f"{where}: truncated offload bundle header")
    (count,) = struct.unpack_from("<Q", data, at + 24)
    if count > (n - 32) // 24:
        raise Malformed(f"{where}: offload bundle claims {count} entries, more than fit")
    pos = at + 32
    for _ in range(count):
        if pos + 24 > end:
            raise Malformed(f"{where}: truncated offload bundle entry table")
        off, size, idlen = struct.unpack_from("<QQQ", data, pos)
        pos += 24
        if idlen > end - pos:
            raise Malformed(f"{where}: offload bundle entry id runs past the bundle")
        ident = decode(bytes(data[pos:pos + idlen]))
        pos += idlen
        yield off, size, ident, pos - at


def _entry_kind(ident: str) -> str:
    if ident.startswith("host-"):
        return "host"
    if "amdgcn" in ident:
        return "amdgcn-code-object"
    return "unknown"


def _target_from_id(ident: str) -> str:
    # "hipv4-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-" -> "gfx90a:sramecc+:xnack-"
    if "--" in ident:
        return ident.split("--", 1)[1]
    return ident.rsplit("-", 1)[-1]


def read_bundle(data, at: int, end: int, section: str, file_offset: int,
                compressed: str | None) -> tuple[list[DeviceCode], int]:
    """The entries of the uncompressed bundle at data[at:end], and the bytes it spans.

    `data` is any buffer: the mapped file itself (each code object is then read in place,
    never copied) or a decompressed bundle. For a compressed bundle `file_offset` is where its
    CCOB container starts in the file and each entry's size is its size after decompression."""
    out = []
    span = 32
    n = end - at
    view = memoryview(data)
    for off, size, ident, table_end in _entries(data, at, end, f"{section}+{file_offset:#x}"):
        span = max(span, table_end)
        kind = _entry_kind(ident)
        base = dict(container="hip_fatbin", section=section,
                    offset=file_offset if compressed else file_offset + off, size=size,
                    kind=kind, bundle_id=ident, compressed=compressed)
        if off + size > n:
            out.append(DeviceCode(target=_target_from_id(ident), **base,
                                  error="entry runs past the end of its bundle"))
            continue
        span = max(span, off + size)
        if kind == "host":
            out.append(DeviceCode(target=ident[len("host-"):], **base))
            continue
        if kind != "amdgcn-code-object":
            out.append(DeviceCode(target=_target_from_id(ident), **base,
                                  error="unrecognised offload bundle entry"))
            continue
        try:
            target, kernels = code_object_info(view[at + off:at + off + size])
        except (Malformed, struct.error, ValueError) as exc:
            out.append(DeviceCode(target=_target_from_id(ident), **base,
                                  error=f"code object unreadable: {exc}"))
            continue
        out.append(DeviceCode(target=target, kernels=kernels, **base))
    return out, span


def read_ccob(data, at: int, end: int, section: str, file_offset: int) -> tuple[list[DeviceCode], int]:
    """The compressed bundle at data[at:end]: its entries and the bytes it spans (0 if unknown)."""
    where = f"{section}+{file_offset:#x}"
    n = end - at
    if n < 20:
        raise Malformed(f"{where}: truncated CCOB header")
    version, method = struct.unpack_from("<HH", data, at + 4)
    if version == 1:
        total, (usize,), start = 0, struct.unpack_from("<I", data, at + 8), 20
    elif version == 2:
        if n < 24:
            raise Malformed(f"{where}: truncated CCOB v2 header")
        total, usize = struct.unpack_from("<II", data, at + 8)
        start = 24
    elif version == 3:
        if n < 32:
            raise Malformed(f"{where}: truncated CCOB v3 header")
        total, usize = struct.unpack_from("<QQ", data, at + 8)
        start = 32
    else:
        return [_ccob_error(section, file_offset, n, None, f"unknown CCOB version {version}")], 0
    algo = CCOB_METHODS.get(method)
    if algo is None:
        return [_ccob_error(section, file_offset, n, None, f"unknown CCOB compression method {method}")], total
    if total and (total > n or total < start):
        return [_ccob_error(section, file_offset, n, algo, f"CCOB total size {total} does not fit the section")], 0
    payload = memoryview(data)[at + start:at + total if total else end]
    try:
        bundle, used = inflate(algo, payload, usize)
    except DecompressError as exc:
        return [_ccob_error(section, file_offset, total or n, algo, str(exc))], total
    if not bundle.startswith(BUNDLE_MAGIC):
        return [_ccob_error(section, file_offset, total or n, algo,
                            "decompressed CCOB data is not an offload bundle")], total
    try:
        entries, _ = read_bundle(bundle, 0, len(bundle), section, file_offset, algo)
    except Malformed as exc:
        return [_ccob_error(section, file_offset, total or n, algo, str(exc))], total
    return entries, total or (start + used if used else 0)


def _ccob_error(section, off, size, algo, msg) -> DeviceCode:
    return DeviceCode(container="hip_fatbin", section=section, offset=off, size=size,
                      kind="unknown", target="unknown", compressed=algo, error=msg)


def read_hip_fatbin(buf, start: int, end: int, section: str) -> list[DeviceCode]:
    """Every bundle (plain or CCOB) in one `.hip_fatbin` section, buf[start:end], in order.

    `buf` is the whole mapped file (it must have `find`), so offsets are file offsets and the
    section is walked in place: only the bundle tables and each code object's headers and
    symbols are touched, not its code."""
    out: list[DeviceCode] = []
    pos = start
    while pos < end:
        m = _MAGIC_RE.search(buf, pos, end)
        if m is None:
            break
        at = m.start()
        try:
            if m.group() == BUNDLE_MAGIC:
                entries, used = read_bundle(buf, at, end, section, at, None)
            else:
                entries, used = read_ccob(buf, at, end, section, at)
        except Malformed as exc:
            entries, used = [_ccob_error(section, at, end - at, None, str(exc))], 0
        out.extend(entries)
        release(buf, at, at + used)
        pos = at + max(used, 4)  # always moves on: the walk ends within end - start steps
    if not out and has_nonzero(buf, start, end):
        out.append(_ccob_error(section, start, end - start, None, "section holds data but no offload bundle"))
    return out


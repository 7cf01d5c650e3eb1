"""Device code found by its content: offload bundles, CCOB containers and NVIDIA fatbins in data.

The `.hip_fatbin` / `.nv_fatbin` names are only labels: the runtime reaches the code through a
pointer, so the same bytes under another name, under no name (a lost section name table) or in
a file without section headers load all the same. Where the section table cannot be trusted
for names, every data range the string scan reads is searched for the containers' magic
numbers (`device_in_data`); otherwise the registration wrappers the runtime is handed are
followed to their containers (`wrapper_targets`, `device_at_targets`): a cheap search of the
writable data, where an ordinary file's named sections already hold everything they point at.
"""

from __future__ import annotations

import struct

from audit.elf.amdgpu import BUNDLE_MAGIC, CCOB_MAGIC, CCOB_METHODS, read_hip_fatbin
from audit.elf.model import DeviceCode
from audit.elf.nvidia import FATBIN_MAGIC, read_nv_fatbin
from audit.elf.parse import PT_LOAD, ElfImage
from audit.elf.segments import PF_W
from audit.elf.strings import label


def _first(buf, magic: bytes, start: int, end: int, valid) -> int:
    """Offset of the first occurrence of `magic` in buf[start:end] that `valid(at)` accepts, or -1."""
    at = buf.find(magic, start, end)
    while at >= 0 and not valid(at):
        at = buf.find(magic, at + 1, end)
    return at


def device_in_data(img: ElfImage, sections) -> list[DeviceCode]:
    """Device code inside the given data sections and ranges (whatever their names), read from
    the first container found to the range's end, as the named sections are."""
    buf, size = img.buf, img.size
    out: list[DeviceCode] = []

    def ccob(at: int) -> bool:
        if at + 8 > end:
            return False
        version, method = struct.unpack_from("<HH", buf, at + 4)
        return version in (1, 2, 3) and method in CCOB_METHODS

    def fatbin(at: int) -> bool:
        if at + 8 > end:
            return False
        version, hsize = struct.unpack_from("<HH", buf, at + 4)
        return version == 1 and hsize == 16

    for sec in sections:
        start, end = sec.offset, min(sec.offset + sec.size, size)
        where = label(sec)
        hits = [a for a in (buf.find(BUNDLE_MAGIC, start, end), _first(buf, CCOB_MAGIC, start, end, ccob))
                if a >= 0]
        if hits:
            out += read_hip_fatbin(buf, min(hits), end, where)
        at = _first(buf, FATBIN_MAGIC, start, end, fatbin)
        if at >= 0:
            out += read_nv_fatbin(buf, at, end, where)
    return out


# The registration wrappers the compilers emit (clang's __hip_fatbin_wrapper in
# .hipFatBinSegment, nvcc's __fatDeviceText in .nvFatBinSegment): u32 magic, u32 version 1, then
# a pointer to the container. The runtime reaches the code only through them, so they tell
# where device code is without searching all data.
HIP_WRAPPER = struct.pack("<I", 0x48495046)
NV_WRAPPER = struct.pack("<I", 0x466243B1)


def wrapper_targets(img: ElfImage, relocated) -> list[tuple[str, int]] | None:
    """(kind "hip" or "nv", file offset of the container) for each registration wrapper in the
    writable loaded data (where a relocated pointer lives); None if one points nowhere known.
    `relocated(vaddr)` is the addend of the relative relocation at vaddr, or None."""
    if img.bits != 64 or img.endian != "little":
        return None  # the wrappers are read for 64-bit little-endian hosts; others: search all
    buf = img.buf
    out = []
    for seg in img.segments:
        if seg.type != PT_LOAD or not (seg.flags & PF_W or img.e_type == 2):  # ET_EXEC: every segment
            continue
        start, end = seg.offset, min(seg.offset + seg.filesz, img.size)
        for kind, magic in (("hip", HIP_WRAPPER), ("nv", NV_WRAPPER)):
            at = buf.find(magic, start, end)
            while 0 <= at <= end - 16:
                version, ptr = struct.unpack_from("<IQ", buf, at + 4)
                if version == 1:
                    addr = ptr or relocated(seg.vaddr + (at - start) + 8)
                    off = img.vaddr_to_offset(addr, 8) if addr else None
                    if off is None:
                        return None
                    out.append((kind, off))
                at = buf.find(magic, at + 4, end)
    return out


def device_at_targets(img: ElfImage, targets: list[tuple[str, int]], covered: list[tuple[int, int]],
                      places) -> list[DeviceCode]:
    """Device code at the wrappers' targets that no named device section (`covered`) holds: read
    from the first target in each data range of `places` to that range's end."""
    first: dict[tuple[str, int], tuple[int, object]] = {}
    for kind, off in targets:
        if any(a <= off < b for a, b in covered):
            continue
        sec = next((s for s in places if s.offset <= off < s.offset + s.size), None)
        key = (kind, -1 if sec is None else id(sec))
        if key not in first or off < first[key][0]:
            first[key] = (off, sec)
    out: list[DeviceCode] = []
    for (kind, _), (off, sec) in first.items():
        end = img.size if sec is None else min(sec.offset + sec.size, img.size)
        where = "data" if sec is None else label(sec)
        reader = read_hip_fatbin if kind == "hip" else read_nv_fatbin
        found = reader(img.buf, off, end, where)
        if not found:
            found = [DeviceCode(container=f"{kind}_fatbin", section=where, offset=off, size=0, kind="unknown",
                                target="unknown", error="a registration wrapper points here, but no device code is here")]
        out += found
    return out

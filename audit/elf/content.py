"""Device code found by its content: offload bundles, CCOB containers and NVIDIA fatbins in data.

The `.hip_fatbin` / `.nv_fatbin` names are only labels: the runtime reaches the code through a
pointer, so the same bytes under another name, under no name (a lost section name table) or in
a file without section headers load all the same. Every data range the string scan reads is
searched for the containers' magic numbers too, and what is found is read as device code.
"""

from __future__ import annotations

import struct

from audit.elf.amdgpu import BUNDLE_MAGIC, CCOB_MAGIC, CCOB_METHODS, read_hip_fatbin
from audit.elf.model import DeviceCode
from audit.elf.nvidia import FATBIN_MAGIC, read_nv_fatbin
from audit.elf.parse import ElfImage
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

"""The section headers of one Mach-O segment load command (LC_SEGMENT / LC_SEGMENT_64), read the
same way by the reader and by the stub decoder."""

from __future__ import annotations

import struct
from collections.abc import Iterator

# section types that hold no bytes in the file: S_ZEROFILL, S_GB_ZEROFILL, S_THREAD_LOCAL_ZEROFILL
ZEROFILL_TYPES = (0x1, 0xC, 0x12)


def section_headers(buf, e: str, pos: int, cmdsize: int, is64: bool) -> Iterator[tuple]:
    """Each section header of the segment command at `pos` (`e`: the struct byte order), as
    (sectname, segname, addr, size, offset, align, reloff, nreloc, flags, reserved1, reserved2, ...).
    ValueError for a command too short for its header or for the sections it lists."""
    head, entry, fmt = (72, 80, e + "16s16sQQIIIIIIII") if is64 else (56, 68, e + "16s16sIIIIIIIII")
    if cmdsize < head:
        raise ValueError(f"segment command of {cmdsize} bytes")
    nsects = struct.unpack_from(e + "I", buf, pos + head - 8)[0]
    if head + entry * nsects > cmdsize:
        raise ValueError(f"segment lists {nsects} sections in {cmdsize} bytes")
    for k in range(nsects):
        yield struct.unpack_from(fmt, buf, pos + head + entry * k)

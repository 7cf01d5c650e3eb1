"""Tar members read as a stream (compressed layers, conda packages, tars found in a folder).

tarfile steps over a member it is not asked for by reading its declared size, block by block,
and goes on reading when the stream has already ended: a header declaring exabytes over a
short stream would loop for ever. No member may end past what the stream may unpack to.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

from audit.errors import InputError, printable


def bounded_members(tf: tarfile.TarFile, limit: int, why: str) -> Iterator[tarfile.TarInfo]:
    """tf's members in order; InputError for the first whose data would end more than `limit`
    bytes into the stream (checked before tarfile steps over it), `why` saying which limit."""
    for m in tf:
        if m.offset_data + m.size > limit:
            raise InputError(f"{why}: member {printable(m.name)} declares {m.size} bytes")
        yield m

"""Run one bytes regex over a whole NUL-separated string table (or any section) in one pass.

`matching_strings` returns the NUL-delimited strings that contain a match, as sorted start/end
offsets (relative to the table), so callers join them to st_name offsets in bulk.
"""

from __future__ import annotations

import re

import numpy as np

_NUL_TO_NL = bytes.maketrans(b"\0", b"\n")


def _needs_lines(pattern: re.Pattern[bytes]) -> bool:
    # ^ and $ must anchor at each string: scan a copy with NUL -> \n under re.MULTILINE.
    # A cheap over-approximation (a ^ inside [^...] also triggers it); it costs only speed.
    src = pattern.pattern
    return b"^" in src or b"$" in src


def matching_strings(buf, off: int, size: int, pattern: re.Pattern[bytes]):
    """(starts, ends) int64 arrays, relative to `off`, of the strings in buf[off:off+size]
    that contain a match of `pattern` (ends exclusive, at the NUL or the table's end)."""
    if _needs_lines(pattern):
        text = bytes(buf[off:off + size]).translate(_NUL_TO_NL)
        scan = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
        base, end = 0, size
    else:
        text, scan, base, end = buf, pattern, off, off + size
    starts: list[int] = []
    ends: list[int] = []
    pos = base
    find = buf.find
    while pos < end:
        m = scan.search(text, pos, end)
        if m is None:
            break
        at = m.start()
        if at >= end:
            break
        idx = off + (at - base)  # absolute position of the match in buf
        # the string holding the match's first byte, delimited by NULs in the original buffer
        r = buf.rfind(b"\0", off, idx)
        s = r + 1 if r >= 0 else off
        e = find(b"\0", idx, off + size)
        if e < 0:
            e = off + size
        starts.append(s - off)
        ends.append(e - off)
        pos = base + (e - off) + 1  # next string: one candidate per string, matches never overlap it
    return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)

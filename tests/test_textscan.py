"""The bulk scan of a string table (audit.elf.textscan.matching_strings) against the plain
answer: each NUL-separated string searched on its own with the same pattern."""

from __future__ import annotations

import numpy as np
import pytest

from audit.elf.textscan import matching_strings, scan_plan
from audit.linkage.patterns import combined_bytes_regex

PATTERN = combined_bytes_regex(["cublas*", "mkl_*", "_ZN4dnnl*", "sgemm_"])

TABLES = {
    "none": [b"", b"_ZN2at4add", b"main", b"xcublasCreate"],
    "first": [b"cublasCreate_v2", b"_ZN2at4add", b"mkl_malloc"],
    "last, no NUL after it": [b"", b"foo", b"_ZN4dnnl6engineE"],
    "newline inside": [b"", b"mkl_a\nb", b"mkl_ok\n", b"sgemm_", b"sgemm_x"],
}


def _plain(table: bytes) -> list[tuple[int, int]]:
    out, at = [], 0
    for text in table.split(b"\x00"):
        if PATTERN.search(text):
            out.append((at, at + len(text)))
        at += len(text) + 1
    return out


@pytest.mark.parametrize("strings", TABLES.values(), ids=TABLES.keys())
def test_the_strings_found_are_those_the_pattern_selects_one_by_one(strings):
    assert scan_plan(PATTERN).nul_safe  # the policy's union takes the path that collects spans in bulk
    table = b"\x00".join(strings) + (b"" if strings[-1].startswith(b"_ZN4") else b"\x00")
    buf = b"pad" + table + b"\x00tail"  # the table sits inside a larger buffer
    got = matching_strings(buf, 3, len(table), PATTERN)
    assert got is not None
    starts, ends, final = got
    assert len(starts) == len(ends) and len(final) >= len(starts)
    assert list(zip(starts.tolist(), ends.tolist())) == _plain(table)
    assert bool(np.all(final[:len(starts)]))  # a whole-name pattern without lookarounds: settled

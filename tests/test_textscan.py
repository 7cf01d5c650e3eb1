"""The bulk scan of a string table (audit.elf.textscan.matching_strings) against the plain
answer: each NUL-separated string searched on its own with the same pattern."""

from __future__ import annotations

import numpy as np
import pytest

from audit.elf.textscan import matching_strings, scan_plan
from audit.linkage.judging.patterns import combined_bytes_regex

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


@pytest.mark.parametrize("source", [
    PATTERN.pattern,
    rb"^(?:ab|a(?P<x>c+))$",  # groups, named ones too
    rb"(?i)^cublas",  # inline flags: compiled the same, its tree not kept
    rb"[",  # invalid: re.compile's own error
])
def test_a_pattern_compiled_with_its_tree_kept_is_re_compile_s_pattern(source):
    """compile_scannable builds the pattern from its own parse (kept for the scan plan): equal to
    re.compile's (same source, flags and compiled code), and the plan made from the kept tree is
    the plan made from parsing the source again."""
    import re

    from audit.elf import textscan
    from audit.elf.regex_tree import compile_scannable, parsed_tree

    try:
        want = re.compile(source)
    except re.error:
        with pytest.raises(re.error):
            compile_scannable(source)
        return
    got = compile_scannable(source)
    assert got == want and got.groupindex == want.groupindex and got.groups == want.groups
    if got.flags == 0:
        kept = textscan._plan(got)  # takes the kept tree
        assert parsed_tree(got) is None  # once
    else:
        assert parsed_tree(got) is None  # never kept: the inline flags change the parse
        kept = textscan._plan(got)
    fresh = textscan._plan(re.compile(source))  # parses the source
    assert (kept.kind, kept.final, kept.nul_safe) == (fresh.kind, fresh.final, fresh.nul_safe)
    assert kept.scanner == fresh.scanner

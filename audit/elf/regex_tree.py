"""A bytes regex compiled once with its parse tree kept, for the scan that rewrites that tree.

audit.elf.textscan plans its bulk scan from a pattern's parse tree; re.compile parses the
source too and throws its tree away. A policy's union of a few hundred globs is ~9k characters,
and parsing it (pure Python) is about half of compiling it: `compile_scannable` compiles it
exactly as re.compile does and keeps the tree, which `parsed_tree` hands to the scan plan once.
No numpy here: the policy compiles its pattern before the reader is imported.
"""

from __future__ import annotations

import _sre
import re

try:  # Python 3.11+
    import re._compiler as _sre_compile
    import re._parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_compile as _sre_compile  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_TREES: dict = {}  # (source, flags) -> parse tree, until its scan plan takes it
_MAX_TREES = 8


def compile_scannable(source: bytes, flags: int = 0) -> re.Pattern[bytes]:
    """re.compile(source, flags): the same pattern (equal to it: source, flags and code), its
    parse tree kept for parsed_tree."""
    try:
        tree = _sre_parse.parse(source, flags)
        groupindex = tree.state.groupdict
        indexgroup = [None] * tree.state.groups
        for name, i in groupindex.items():
            indexgroup[i] = name
        # re._compiler.compile on the tree, which it would otherwise parse from the source itself
        pattern = _sre.compile(source, flags | tree.state.flags, _sre_compile._code(tree, flags),
                               tree.state.groups - 1, groupindex, tuple(indexgroup))
    except Exception:  # noqa: BLE001 - private API drift, or a bad pattern: re.compile decides
        return re.compile(source, flags)
    if pattern.flags == flags:  # no inline flags: parsing pattern.pattern gives this same tree
        if len(_TREES) >= _MAX_TREES:
            _TREES.clear()
        _TREES[(source, flags)] = tree
    return pattern


def parsed_tree(pattern: re.Pattern[bytes]):
    """The parse tree compile_scannable kept for `pattern` (once; None if there is none)."""
    return _TREES.pop((pattern.pattern, pattern.flags), None)

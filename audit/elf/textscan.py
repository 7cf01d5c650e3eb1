"""Run one bytes regex over a whole NUL-separated string table in one pass.

`matching_strings` returns the strings of the table that the pattern selects, as sorted
start/end offsets relative to the table, so callers join them to st_name offsets in bulk, and
says whether each one still needs checking on its own with `pattern.search(name)`.

Two paths:
- Whole-name patterns, written the way audit.linkage.patterns writes them: they start with the
  NUL-boundary lookbehind `(?<![^\\x00])`. The scan consumes the NUL instead (`\\x00(?:...)`),
  which lets the regex engine jump from NUL to NUL with its literal-prefix search instead of
  trying every byte; a match that lies inside one string is final (no per-name check).
- Any other pattern: `finditer` over the table; every string with a match is a candidate that
  is checked on its own (lookarounds may see across the NUL in the joined table).
Patterns using `^`, `$`, `\\A`, `\\Z` or `\\b`-style anchors (they would anchor at the table's
ends, not each name's) are not scanned at all: `None` tells the caller to check every name.
"""

from __future__ import annotations

import re

import numpy as np

try:  # Python 3.11+
    import re._compiler as _sre_compile
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_compile as _sre_compile  # type: ignore[no-redef]
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

NUL_START = rb"(?<![^\x00])"
_EMPTY = np.zeros(0, dtype=np.int64)


def _has_anchor(pattern: re.Pattern[bytes]) -> bool:
    """True if the pattern uses AT codes (^ $ \\A \\Z \\b \\B), or cannot be analysed."""
    try:
        tree = _sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - private parser API: any surprise means "be exact"
        return True
    stack = [tree]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 100_000:
            return True
        items = node.data if hasattr(node, "data") else node
        for op, av in items:
            if op is _sre_constants.AT:
                return True
            for sub in (av if isinstance(av, (list, tuple)) else (av,)):
                if isinstance(sub, _sre_parse.SubPattern):
                    stack.append(sub)
                elif isinstance(sub, (list, tuple)):
                    stack.extend(x for x in sub if isinstance(x, _sre_parse.SubPattern))
    return False


def _first_key(item, reorder: bool):
    if not item.data:
        return None
    op, av = item.data[0]
    if op is _sre_constants.LITERAL or (reorder and op is _sre_constants.IN):
        return (op, repr(av))
    return None


def _factor_branch(state, items: list, reorder: bool) -> list:
    """Alternatives with the same first element merged into one (a trie): `ab|ac|d` -> `a(?:b|c)|d`.

    The engine then tests each prefix once instead of once per alternative. Without `reorder`
    only literals are grouped, and an alternative that does not start with a literal is a
    barrier nothing moves across: alternatives starting with different literals cannot both
    match at one position, so leftmost-first semantics are kept exactly. With `reorder` (used
    where only WHETHER a match exists at a position matters) any identical first element groups."""
    out: list = []
    run: dict = {}

    def flush():
        for group in run.values():
            if len(group) == 1:
                out.append(group[0])
                continue
            rests = [_sre_parse.SubPattern(state, list(g.data[1:])) for g in group]
            rests = _factor_branch(state, rests, reorder)
            body = [group[0].data[0]]
            if len(rests) == 1:
                body += rests[0].data
            else:
                body.append((_sre_constants.BRANCH, (None, rests)))
            out.append(_sre_parse.SubPattern(state, body))
        run.clear()

    for item in items:
        item = _factor_tree(item, reorder)
        key = _first_key(item, reorder)
        if key is not None:
            run.setdefault(key, []).append(item)
        elif reorder:
            out.append(item)
        else:
            flush()
            out.append(item)
    flush()
    return out


def _factor_tree(sub, reorder: bool = False):
    data = []
    for op, av in sub.data:
        if op is _sre_constants.BRANCH:
            av = (av[0], _factor_branch(sub.state, list(av[1]), reorder))
        elif op is _sre_constants.SUBPATTERN:
            av = av[:3] + (_factor_tree(av[3], reorder),)
        elif op in (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT):
            av = (av[0], av[1], _factor_tree(av[2], reorder))
        data.append((op, av))
    return _sre_parse.SubPattern(sub.state, data)


def optimized(source: bytes, flags: int, reorder: bool = False) -> re.Pattern[bytes]:
    """`source` compiled with its alternations factored into a trie (same matches, faster);
    falls back to a plain compile if the private parser API is not what we expect."""
    plain = re.compile(source, flags)
    if flags & (re.IGNORECASE | re.LOCALE):
        return plain
    try:
        tree = _factor_tree(_sre_parse.parse(source, flags), reorder)
        fast = _sre_compile.compile(tree, flags)
        fast.search(b"")  # it must accept bytes
        return fast
    except Exception:  # noqa: BLE001 - private API drift: the plain pattern is always correct
        return plain


_SCAN_CACHE: dict[tuple[bytes, int], tuple[str, re.Pattern[bytes] | None]] = {}


def scan_plan(pattern: re.Pattern[bytes]) -> tuple[str, re.Pattern[bytes] | None]:
    """("names", None) | ("whole", nul-prefixed scanner) | ("search", pattern); cached."""
    key = (pattern.pattern, pattern.flags)
    plan = _SCAN_CACHE.get(key)
    if plan is None:
        if _has_anchor(pattern):
            plan = ("names", None)
        elif pattern.pattern.startswith(NUL_START):
            plan = ("whole", optimized(b"\\x00(?:" + pattern.pattern[len(NUL_START):] + b")",
                                       pattern.flags, reorder=True))
        else:
            plan = ("search", pattern)
        if len(_SCAN_CACHE) > 64:
            _SCAN_CACHE.clear()
        _SCAN_CACHE[key] = plan
    return plan


def matching_strings(buf, off: int, size: int, pattern: re.Pattern[bytes]):
    """(starts, ends, final) for the strings of buf[off:off+size] that the pattern selects, or
    None when every name must be checked on its own. starts/ends are int64 arrays relative to
    `off` (ends exclusive, at the NUL or the table's end); final[i] is True when string i is
    known to match as a whole name, so only names starting inside it need their own check."""
    kind, scan = scan_plan(pattern)
    if kind == "names":
        return None
    end = off + size
    if kind == "whole":
        spans = [m.span() for m in scan.finditer(buf, off, end)]
        starts = [s + 1 - off for s, _ in spans]
        ends = [e - off for _, e in spans]
        # the first string has no NUL before it: try it directly
        if size and buf[off] != 0:
            first_end = buf.find(b"\0", off, end)
            first_end = end if first_end < 0 else first_end
            if pattern.search(bytes(buf[off:first_end])):
                starts.insert(0, 0)
                ends.insert(0, first_end - off)
        s_arr = np.asarray(starts, dtype=np.int64)
        e_arr = np.asarray(ends, dtype=np.int64)
        # final unless the match ran over a NUL (a pattern that can match one): then check it
        final = np.ones(len(s_arr), dtype=bool)
        for i in range(len(s_arr)):
            if buf.find(b"\0", off + int(s_arr[i]), off + int(e_arr[i])) >= 0:
                final[i] = False
        return s_arr, e_arr, final
    starts, ends = [], []
    pos = off
    find, rfind = buf.find, buf.rfind
    while pos < end:
        m = scan.search(buf, pos, end)
        if m is None:
            break
        at = m.start()
        r = rfind(b"\0", off, at)
        s = r + 1 if r >= 0 else off
        e = find(b"\0", at, end)
        e = end if e < 0 else e
        starts.append(s - off)
        ends.append(e - off)
        pos = e + 1  # one candidate per string; the next search starts at the next string
    if not starts:
        return _EMPTY, _EMPTY, np.zeros(0, dtype=bool)
    return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
            np.zeros(len(starts), dtype=bool))

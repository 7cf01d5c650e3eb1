r"""Run one bytes regex over a whole NUL-separated string table in one pass.

`matching_strings` returns the strings of the table that the pattern selects, as sorted
start/end offsets relative to the table, so callers join them to st_name offsets in bulk, and
says whether each one still needs checking on its own with `pattern.search(name)`.

Semantics are those of `pattern.search(name)` on each name alone. To keep them over the joined
table, the pattern is rewritten once (on its parse tree) before scanning:
- `^` / `\A` become "just after a NUL" and `$` / `\Z` "just before a NUL" (`$` also before a
  final newline, as on a lone name); `\b` / `\B` need nothing (NUL is not a word character).
- A pattern that starts with such an anchor (or the NUL lookbehind `(?<![^\x00])`) is scanned
  as `\x00(?:...)`: the engine then jumps from NUL to NUL with its literal-prefix search
  instead of trying every byte, and each match lies inside one string ("whole" plan).
- Alternatives are factored into a trie (`ab|ac` -> `a(?:b|c)`): each prefix is tested once.
- Without lookarounds a match found inside one string is final; with them (they could see
  across a NUL) every candidate string is re-checked on its own.
MULTILINE patterns, or trees the rewrite does not understand, are not scanned at all: `None`
tells the caller to check every name on its own (exact, slower).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain

import numpy as np

from audit.elf.regex_tree import parsed_tree

try:  # Python 3.11+
    import re._compiler as _sre_compile
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_compile as _sre_compile  # type: ignore[no-redef]
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]


class _Unscannable(Exception):
    pass


_C = _sre_constants
_SPAN = re.Match.span
_START_ATS = {_C.AT_BEGINNING, _C.AT_BEGINNING_STRING}
_KEEP_ATS = {_C.AT_BOUNDARY, _C.AT_NON_BOUNDARY}


def _snippet(src: bytes):
    return _sre_parse.parse(src).data[0]


def _is_nul_lookbehind(node) -> bool:
    op, av = node
    return (op is _C.ASSERT_NOT and av[0] == -1 and len(av[1].data) == 1
            and av[1].data[0] == (_C.NOT_LITERAL, 0))


def _is_nul_lookahead(node) -> bool:
    op, av = node
    return (op is _C.ASSERT_NOT and av[0] == 1 and len(av[1].data) == 1
            and av[1].data[0] == (_C.NOT_LITERAL, 0))


def _rewrite(sub, flags: dict):
    """The tree with name anchors turned into NUL-boundary lookarounds; records whether the
    original had lookarounds of its own. Raises _Unscannable for what it does not understand."""
    flags["nodes"] = flags.get("nodes", 0) + len(sub.data)
    if flags["nodes"] > 200_000:
        raise _Unscannable("pattern too large to analyse")
    data = []
    for node in sub.data:
        op, av = node
        if op is _C.AT:
            if av in _START_ATS:
                data.append(_snippet(rb"(?<![^\x00])"))
            elif av is _C.AT_END:
                data.append(_snippet(rb"(?=\n?(?:\x00|\Z))"))
            elif av is _C.AT_END_STRING:
                data.append(_snippet(rb"(?=\x00|\Z)"))
            elif av in _KEEP_ATS:
                data.append(node)
            else:  # MULTILINE line anchors, locale/unicode boundaries
                raise _Unscannable(str(av))
            continue
        if op in (_C.ASSERT, _C.ASSERT_NOT):
            if not (_is_nul_lookbehind(node) or _is_nul_lookahead(node)):  # same on a lone name
                flags["lookaround"] = True
            data.append((op, (av[0], _rewrite(av[1], flags))))
        elif op is _C.BRANCH:
            data.append((op, (av[0], [_rewrite(x, flags) for x in av[1]])))
        elif op is _C.SUBPATTERN:
            data.append((op, av[:3] + (_rewrite(av[3], flags),)))
        elif op in (_C.MAX_REPEAT, _C.MIN_REPEAT) + ((_C.POSSESSIVE_REPEAT,) if hasattr(_C, "POSSESSIVE_REPEAT") else ()):
            data.append((op, (av[0], av[1], _rewrite(av[2], flags))))
        elif hasattr(_C, "ATOMIC_GROUP") and op is _C.ATOMIC_GROUP:
            data.append((op, _rewrite(av, flags)))
        elif op in (_C.GROUPREF, _C.GROUPREF_EXISTS):
            raise _Unscannable("backreference")
        else:
            data.append(node)
    return _sre_parse.SubPattern(sub.state, data)


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


_NUL_CATEGORIES = {_C.CATEGORY_NOT_DIGIT, _C.CATEGORY_NOT_SPACE, _C.CATEGORY_NOT_WORD,
                   _C.CATEGORY_NOT_LINEBREAK}


def _set_has_nul(items) -> bool:
    negate = any(op is _C.NEGATE for op, _ in items)
    has = False
    for op, av in items:
        if op is _C.LITERAL and av == 0:
            has = True
        elif op is _C.RANGE and av[0] <= 0 <= av[1]:
            has = True
        elif op is _C.CATEGORY and av in _NUL_CATEGORIES:
            has = True
        elif op not in (_C.NEGATE, _C.LITERAL, _C.RANGE, _C.CATEGORY):
            return True  # something we do not model: assume it can
    return has != negate


def can_consume_nul(sub) -> bool:
    """Conservative: False only if no part of the tree can consume a NUL byte."""
    for op, av in sub.data:
        if op is _C.ANY or (op is _C.NOT_LITERAL and av != 0) or (op is _C.LITERAL and av == 0):
            return True
        if op is _C.IN and _set_has_nul(av):
            return True
        if op is _C.BRANCH and any(can_consume_nul(x) for x in av[1]):
            return True
        if op is _C.SUBPATTERN and can_consume_nul(av[3]):
            return True
        if op in (_C.MAX_REPEAT, _C.MIN_REPEAT) or op is getattr(_C, "POSSESSIVE_REPEAT", None):
            if can_consume_nul(av[2]):
                return True
        if op is getattr(_C, "ATOMIC_GROUP", None) and can_consume_nul(av):
            return True
        if op in (_C.GROUPREF, _C.GROUPREF_EXISTS, _C.GROUPREF_IGNORE):
            return True
        # LITERAL/NOT_LITERAL handled above; AT and lookarounds consume nothing
    return False


@dataclass(frozen=True)
class ScanPlan:
    kind: str  # "names" (check every name), "whole" (scanner starts at a NUL), "search"
    scanner: re.Pattern[bytes] | None
    final: bool  # a match inside one string needs no check of its own
    nul_safe: bool = False  # the scanner cannot run over a NUL (after its leading one)


_SCAN_CACHE: dict[tuple[bytes, int], ScanPlan] = {}


def _plan(pattern: re.Pattern[bytes]) -> ScanPlan:
    if pattern.flags & (re.MULTILINE | re.LOCALE) or not isinstance(pattern.pattern, bytes):
        return ScanPlan("names", None, False)
    try:
        tree = parsed_tree(pattern) or _sre_parse.parse(pattern.pattern, pattern.flags)
        info: dict = {}
        tree = _rewrite(tree, info)
        final = not info.get("lookaround")
        kind = "search"
        nul_safe = False
        if tree.data and _is_nul_lookbehind(tree.data[0]):  # a name-start anchor leads
            body = _sre_parse.SubPattern(tree.state, list(tree.data[1:]))
            nul_safe = not can_consume_nul(body)
            tree = _sre_parse.SubPattern(tree.state, [(_C.LITERAL, 0)] + list(body.data))
            kind = "whole"
        if not pattern.flags & re.IGNORECASE:
            tree = _factor_tree(tree, reorder=True)
        scanner = _sre_compile.compile(tree, pattern.flags)
        scanner.search(b"")  # it must accept bytes
        return ScanPlan(kind, scanner, final, nul_safe)
    except Exception:  # noqa: BLE001 - private parser API drift or an odd tree: be exact instead
        return ScanPlan("names", None, False)


def scan_plan(pattern: re.Pattern[bytes]) -> ScanPlan:
    key = (pattern.pattern, pattern.flags)
    plan = _SCAN_CACHE.get(key)
    if plan is None:
        plan = _plan(pattern)
        if len(_SCAN_CACHE) > 64:
            _SCAN_CACHE.clear()
        _SCAN_CACHE[key] = plan
    return plan


def matching_strings(buf, off: int, size: int, pattern: re.Pattern[bytes]):
    """(starts, ends, final) for the strings of buf[off:off+size] that the pattern selects, or
    None when every name must be checked on its own. starts/ends are int64 arrays relative to
    `off` (ends exclusive, at the NUL or the table's end); final[i] is True when string i is
    known to match as a whole name, so only names starting inside it need their own check."""
    plan = scan_plan(pattern)
    if plan.kind == "names":
        return None
    end = off + size
    starts: list[int] = []
    ends: list[int] = []
    finals: list[bool] = []
    find = buf.find
    if plan.kind == "whole":
        # the first string has no NUL before it: check it on its own
        if size and buf[off] != 0:
            e = find(b"\0", off, end)
            e = end if e < 0 else e
            if pattern.search(bytes(buf[off:e])):
                starts.append(0)
                ends.append(e - off)
                finals.append(True)
        matches = plan.scanner.finditer(buf, off, end)
        if plan.nul_safe:
            # no match can run over a NUL: a match ending at a NUL (the usual case with `$`)
            # ends its string; only the others need a look for their NUL. The spans go straight
            # into one array (57k of them in libtorch_cpu's .symtab), never a list of tuples.
            sp = np.fromiter(chain.from_iterable(map(_SPAN, matches)), dtype=np.int64)
            if not len(sp):
                return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                        np.asarray(finals, dtype=bool))
            s_abs, m_end = sp[0::2] + 1, sp[1::2]
            blob = np.frombuffer(buf, dtype=np.uint8, count=size, offset=off)
            at_nul = (m_end >= end) | (blob[np.minimum(m_end, end - 1) - off] == 0)
            e_abs = np.where(m_end >= end, end, m_end)
            for i in np.flatnonzero(~at_nul).tolist():
                e = find(b"\0", int(m_end[i]), end)
                e_abs[i] = end if e < 0 else e
            return (np.concatenate([np.asarray(starts, dtype=np.int64), s_abs - off]),
                    np.concatenate([np.asarray(ends, dtype=np.int64), e_abs - off]),
                    np.concatenate([np.asarray(finals, dtype=bool), np.full(len(s_abs), plan.final)]))
        for m_start, m_end in map(_SPAN, matches):
            s = m_start + 1
            e = find(b"\0", s, end)
            e = end if e < 0 else e
            if m_end > e:  # the match ran over a NUL: it may hide later strings, go exact
                return _search_strings(buf, off, size, plan.scanner)
            starts.append(s - off)
            ends.append(e - off)
            finals.append(plan.final)
        return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                np.asarray(finals, dtype=bool))
    found = _search_strings(buf, off, size, plan.scanner)
    # a name anchor at the table's first byte would look at whatever precedes the table
    if size and buf[off] != 0 and (not len(found[0]) or found[0][0] != 0):
        e = find(b"\0", off, end)
        e = end if e < 0 else e
        if pattern.search(bytes(buf[off:e])):
            found = tuple(np.concatenate([[v], arr]).astype(arr.dtype)
                          for v, arr in zip((0, e - off, False), found))
    return found


def _search_strings(buf, off: int, size: int, scanner):
    """Every string holding a match of `scanner`, each to be checked on its own."""
    starts, ends = [], []
    end = off + size
    pos = off
    find, rfind = buf.find, buf.rfind
    while pos < end:
        m = scanner.search(buf, pos, end)
        if m is None:
            break
        at = min(m.start(), end - 1)
        r = rfind(b"\0", off, at + 1) if buf[at] != 0 else rfind(b"\0", off, at)
        s = r + 1 if r >= 0 else off
        e = find(b"\0", at, end)
        e = end if e < 0 else e
        if e < s:
            e = s
        starts.append(s - off)
        ends.append(e - off)
        pos = max(e + 1, pos + 1)  # one candidate per string; always moves on
    return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
            np.zeros(len(starts), dtype=bool))

"""One finding per (rule, mechanism, file): scan.py's evidence grouped for a person to read.

scan.py reports evidence where it sees it: one symbol table, one fatbin entry, one DT_NEEDED
edge at a time, so a library with 983 vendor kernels in 983 entries would be 983 findings. Here
they become one finding per (rule, kind, object the evidence is in) with a count, a few
examples and every match kept (`Finding.matches`), in a fixed order, so that the same input
always gives the same report.
"""

from __future__ import annotations

from audit.linkage.model import KINDS, Finding, Match

MAX_EXAMPLES = 10


def _places(f: Finding) -> list[Match]:
    """The raw finding's matches (or the finding itself as one), with its offset, chain and
    detail. New Match objects: a library's raw findings are shared by every tree it is in."""
    return [Match(m.names, m.where, f.offset if m.offset is None else m.offset, list(f.chain),
                  f.detail if m.detail is None else m.detail)
            for m in (f.matches or [Match([f.subject], f.where)])]


def _order(key: tuple[str, str, str]) -> tuple:
    rule, kind, in_file = key
    return rule, KINDS.index(kind) if kind in KINDS else len(KINDS), kind, in_file


def group_findings(raw: list[Finding]) -> list[Finding]:
    """Merge findings of the same rule, kind and object; sorted by rule, kind, object."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in raw:
        groups.setdefault((f.rule, f.kind, f.in_file or ""), []).append(f)
    out: list[Finding] = []
    for key in sorted(groups, key=_order):
        members = groups[key]
        first = members[0]
        places = [m for f in members for m in _places(f)]
        for m in places:
            if m.chain == first.chain:
                m.chain = None  # the finding's own chain: not repeated per match
        seen: dict[str, None] = {}
        count = 0
        for m in places:
            count += len(m.names)
            for n in m.names:
                if len(seen) > MAX_EXAMPLES:
                    break
                seen.setdefault(n)
        names = list(seen)
        wheres = len({m.where for m in places})
        where = places[0].where + (f" and {wheres - 1} more place{'s' if wheres > 2 else ''}" if wheres > 1 else "")
        out.append(Finding(
            rule=first.rule, kind=first.kind, subject=names[0] if names else first.subject, where=where,
            reason=first.reason, use_instead=first.use_instead, severity=first.severity, chain=list(first.chain),
            in_file=first.in_file, offset=places[0].offset, count=count, examples=names[1:MAX_EXAMPLES + 1],
            detail=places[0].detail, matches=places,
            distinct_names=len(set().union(*(m.names for m in places))) if count > 1 else count))
    return out

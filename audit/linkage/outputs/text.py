"""Plain-text rendering of a CheckReport, with the why-chains.

Everything that came from a binary, a file name or a policy is passed through `escape`, so a
symbol or path cannot move the cursor, clear the screen or fake a PASS line; and no line of the
whole text starts with `::`, so a name shown first on a line cannot be a CI workflow command.
"""

from __future__ import annotations

# escape: non-printable characters as \xNN / \uNNNN, one line
from audit.errors import no_commands
from audit.errors import printable as escape
from audit.linkage.model import CheckReport, Finding

_SHOWN = 5  # names shown per finding without --verbose
_NAME_WIDTH = 100  # a longer name is cut without --verbose (C++ kernel names run to thousands)
_NOTE_WIDTH = 300


def _cut(text: str, width: int) -> str:
    """The start (namespace, kernel family) and the end (what tells instances apart) of a long name."""
    if len(text) <= width:
        return text
    tail = width // 3
    return text[:width - tail - 3] + "..." + text[-tail:]


def _policy_line(pol: dict) -> str:
    """`policy sovereign (shipped)`, or `policy mine from ./mine.toml, extending sovereign (shipped)`."""
    name = escape(pol.get("name"))
    sources = [escape(s["path"]) for s in pol.get("sources", [])]
    if sources == [f"{name} (shipped)"]:
        return f"policy {sources[0]}"
    if not sources:
        return f"policy {name}"
    return f"policy {name} from " + ", extending ".join(reversed(sources))


def _finding_lines(f: Finding, verbose: bool) -> list[str]:
    mark = "x" if f.failing else ("~" if f.excepted else "=" if f.baseline == "unchanged" else "!")
    sev = "" if f.severity == "fail" else f" ({f.severity})"
    if f.baseline == "unchanged":
        sev += " (baseline)"
    names = [f.subject] + list(f.examples)
    # names that look alike once cut are shown once; the count says how many there are
    shown_names = list(dict.fromkeys(escape(n) if verbose else _cut(escape(n), _NAME_WIDTH) for n in names[:_SHOWN]))
    shown = ", ".join(shown_names)
    distinct = f.distinct
    more = distinct - min(len(shown_names), _SHOWN)
    many = "" if f.count == 1 else (f"{f.count}: " if distinct == f.count else f"{f.count} matches, {distinct} names: ")
    head = f"    {mark} {f.kind}{sev}: {many}{shown}" + (f", +{more} more" if more > 0 else "")
    lines = [head + f"  ({escape(f.where)})"]
    if len(f.chain) > 1:
        lines.append("        chain: " + " -> ".join(escape(c) for c in f.chain))
    if f.in_file:
        lines.append(f"        in:    {escape(f.in_file)}")
    if f.detail and not (verbose and f.matches):
        note = escape(f.detail)
        short = note if verbose or len(note) <= _NOTE_WIDTH else note[:_NOTE_WIDTH - 3] + "..."
        lines.append(f"        note:  {short}")
    if f.excepted:
        lines.append(f"        excepted: {escape(f.excepted)}")
    if f.exception_expired:
        lines.append(f"        exception EXPIRED on {escape(f.exception_expired)}: no longer waived")
    if verbose:
        if f.matches_in:
            lines.append(f"        every match: listed under {escape(f.matches_in)}")
        for m in f.matches:
            extra = f"; chain {' -> '.join(escape(c) for c in m.chain)}" if m.chain else ""
            extra += f"; {escape(m.detail)}" if m.detail else ""
            lines.append(f"        at {escape(m.where)}{extra}:")
            lines += [f"          {escape(n)}" for n in m.names]
    return lines


def _rule_lines(findings: list[Finding], verbose: bool) -> list[str]:
    first = findings[0]
    lines = [f"  [{escape(first.rule)}] {escape(first.reason)}"]
    if first.use_instead:
        lines.append(f"    use instead: {escape(first.use_instead)}")
    for f in findings:
        lines += _finding_lines(f, verbose)
    return lines


def _inherited_lines(where: str, findings: list[Finding]) -> list[str]:
    """What a dependency audited in this run brings, in one line: its own result lists it (a
    torch extension would otherwise repeat libtorch_cpu's MKL and oneDNN findings in full)."""
    failing = sum(1 for f in findings if f.failing)
    mark = "x" if failing else "="
    rules = ", ".join(escape(r) for r in dict.fromkeys(f.rule for f in findings))
    state = "" if failing == len(findings) else f" ({failing} failing)"
    dep = escape(findings[0].chain[-1]) if findings[0].chain else escape(where)
    lines = [f"  {mark} through {dep}: {len(findings)} finding(s){state} of {rules}; "
             f"listed under {escape(where)} (-v lists them here)"]
    if len(findings[0].chain) > 2:
        lines.append("        chain: " + " -> ".join(escape(c) for c in findings[0].chain))
    return lines


def render_text(report: CheckReport, verbose: bool = False) -> str:
    """Grouped by file, then rule; `verbose` lists every match of every finding."""
    lines = [f"sovereign-audit check {report.tool_version}, {_policy_line(report.policy)}"]
    for fr in report.files:
        label = {"pass": "PASS ", "fail": "FAIL ", "error": "ERROR"}[fr.verdict]
        extra = f"  [{', '.join(escape(t) for t in fr.device_targets)}]" if fr.device_targets else ""
        lines.append(f"{label} {escape(fr.path)}{extra}")
        if fr.layer:
            lines.append(f"  added by layer {fr.layer['index']} {escape(fr.layer.get('digest') or '?')}"
                         + (f": {escape(fr.layer['created_by'])}" if fr.layer.get("created_by") else ""))
        if fr.error:
            lines.append(f"  error: {escape(fr.error)}")
        by_rule: dict[str, list[Finding]] = {}
        inherited: dict[str, list[Finding]] = {}  # a dependency audited in this run -> its findings
        for f in fr.findings:
            if f.matches_in and not verbose:
                inherited.setdefault(f.matches_in, []).append(f)
            else:
                by_rule.setdefault(f.rule, []).append(f)
        for findings in by_rule.values():
            lines += _rule_lines(findings, verbose)
        for where, findings in inherited.items():
            lines += _inherited_lines(where, findings)
        for w in fr.warnings:
            lines.append(f"  warning: {escape(w)}")
    for w in report.warnings:
        lines.append(f"warning: {escape(w)}")
    if report.baseline is not None:
        b = report.baseline
        lines.append(f"baseline {escape(b['file'])}: {b['new']} new, {b['unchanged']} known, "
                     f"{len(b['absent'])} no longer found")
        for a in b["absent"]:
            lines.append(f"  absent: [{escape(a['rule'])}] {escape(a['kind'])}: {escape(a['subject'])} "
                         f"in {escape(a['path'])}")
    for e in report.errors:
        lines.append(f"error: {escape(e)}")
    s = report.summary
    skipped = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in sorted(s["skipped"].items()))
    timing = f"; {report.elapsed_s:.2f} s" if report.timing else ""
    lines.append(f"summary: {s['files']} file(s): {s['pass']} pass, {s['fail']} fail, {s['error']} error; "
                 f"{s['findings']} violation(s)" + (f"; skipped {skipped}" if skipped else "") + timing)
    lines.append(f"result: {report.verdict.upper()} (exit {report.exit_code})")
    return no_commands("\n".join(lines) + "\n")

"""Plain-text rendering of a CheckReport, with the why-chains.

Everything that came from a binary, a file name or a policy is passed through `escape`, so a
symbol or path cannot move the cursor, clear the screen or fake a PASS line.
"""

from __future__ import annotations

from audit.linkage.model import CheckReport, Finding

_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}


def escape(text) -> str:
    """Printable, one line: control, format (bidi) and other non-printable characters as \\xNN / \\uNNNN."""
    out = []
    for ch in str(text):
        o = ord(ch)
        if ch.isprintable() and o not in _BIDI:
            out.append(ch)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


def _finding_lines(f: Finding) -> list[str]:
    mark = "x" if f.failing else ("~" if f.excepted else "=" if f.baseline == "unchanged" else "!")
    sev = "" if f.severity == "fail" else f" ({f.severity})"
    if f.baseline == "unchanged":
        sev += " (baseline)"
    head = f"  {mark} [{escape(f.rule)}]{sev} {f.kind}: {escape(f.subject)}  ({escape(f.where)})"
    if f.count > 1:
        head += f"  +{f.count - 1} more"
    lines = [head]
    if len(f.chain) > 1:
        lines.append("      chain: " + " -> ".join(escape(c) for c in f.chain))
    if f.in_file:
        lines.append(f"      in:    {escape(f.in_file)}")
    if f.examples:
        lines.append("      also:  " + ", ".join(escape(e) for e in f.examples[:5]))
    if f.detail:
        lines.append(f"      note:  {escape(f.detail)}")
    lines.append(f"      why:   {escape(f.reason)}")
    if f.use_instead:
        lines.append(f"      use instead: {escape(f.use_instead)}")
    if f.excepted:
        lines.append(f"      excepted: {escape(f.excepted)}")
    if f.exception_expired:
        lines.append(f"      exception EXPIRED on {escape(f.exception_expired)}: no longer waived")
    return lines


def render_text(report: CheckReport) -> str:
    pol = report.policy
    lines = [f"sovereign-audit check {report.tool_version}: policy {escape(pol.get('name'))} "
             f"({', '.join(escape(s['path']) for s in pol.get('sources', []))})"]
    for fr in report.files:
        label = {"pass": "PASS ", "fail": "FAIL ", "error": "ERROR"}[fr.verdict]
        extra = f"  [{', '.join(escape(t) for t in fr.device_targets)}]" if fr.device_targets else ""
        lines.append(f"{label} {escape(fr.path)}{extra}")
        if fr.layer:
            lines.append(f"  added by layer {fr.layer['index']} {escape(fr.layer.get('digest') or '?')}"
                         + (f": {escape(fr.layer['created_by'])}" if fr.layer.get("created_by") else ""))
        if fr.error:
            lines.append(f"  error: {escape(fr.error)}")
        for f in fr.findings:
            lines += _finding_lines(f)
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
    s = report.summary
    skipped = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in sorted(s["skipped"].items()))
    lines.append(f"summary: {s['files']} file(s): {s['pass']} pass, {s['fail']} fail, {s['error']} error; "
                 f"{s['findings']} violation(s)" + (f"; skipped {skipped}" if skipped else ""))
    return "\n".join(lines) + "\n"

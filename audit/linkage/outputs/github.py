"""GitHub Actions: `::error` workflow commands and a markdown job summary.

Workflow command escaping (GitHub's toolkit, command.ts): in the message `%`, CR, LF become
%25, %0D, %0A; in property values `:` and `,` also become %3A and %2C. Other control characters
are written as \\xNN, as in the text output. The summary is markdown
that GitHub renders as HTML: untrusted text is HTML-escaped and markdown punctuation
backslash-escaped, so a symbol name cannot inject links, images or tables.
"""

from __future__ import annotations

import html
import os

from audit.linkage.model import CheckReport, Finding
from audit.linkage.outputs.text import escape


def escape_data(text: str) -> str:
    text = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return escape(text)  # other control and bidi characters as \xNN: the log would render ESC as colour


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(level: str, message: str, file: str | None = None, title: str | None = None) -> str:
    props = []
    if file:
        props.append(f"file={escape_property(file)}")
    if title:
        props.append(f"title={escape_property(title)}")
    return f"::{level}{' ' + ','.join(props) if props else ''}::{escape_data(message)}"


def _text(f: Finding) -> str:
    text = f"{f.message}. {f.reason}"
    if f.use_instead:
        text += f" Use instead: {f.use_instead}."
    if f.exception_expired:
        text += f" (exception expired {f.exception_expired})"
    return text


def layer_text(layer: dict) -> str:
    """The image layer that added a file: "layer 2 sha256:... (COPY ...)" (unescaped)."""
    text = f"layer {layer['index']} {layer.get('digest') or '?'}"
    return text + (f" ({layer['created_by']})" if layer.get("created_by") else "")


def render_github(report: CheckReport) -> str:
    lines = []
    for fr in report.files:
        # GitHub maps `file=` to a file of the repository: a member of a wheel or image is not one,
        # so its archive is annotated and the member named in the message
        file, member = fr.path, ""
        if fr.archive:
            file, member = fr.archive, fr.path[len(fr.archive):].removeprefix("!/") + ": "
        if fr.error:
            lines.append(_command("error", f"{member}cannot audit: {fr.error}", file,
                                  "sovereign-audit: unreadable input"))
        for f in fr.findings:
            if f.excepted or f.baseline == "unchanged":
                continue
            level = "error" if f.severity == "fail" else "warning"
            layer = f" Added by {layer_text(fr.layer)}." if fr.layer else ""
            lines.append(_command(level, member + _text(f) + layer, file, f"sovereign-audit {f.rule}"))
    for e in report.errors:
        lines.append(_command("error", e, title="sovereign-audit"))
    for w in report.warnings:
        lines.append(_command("warning", w, title="sovereign-audit"))
    return "\n".join(lines) + ("\n" if lines else "")


_MD_SPECIAL = set("\\`*_{}[]()#+-.!|~")  # < > & are HTML-escaped instead


def md_escape(text) -> str:
    marked = "".join("\\" + c if c in _MD_SPECIAL else c for c in escape(text))
    return html.escape(marked, quote=False)


def render_summary(report: CheckReport) -> str:
    s = report.summary
    verdict = {0: "PASS", 1: "FAIL", 3: "ERROR"}.get(report.exit_code, "ERROR")
    out = [f"## sovereign-audit check: {verdict}", "",
           f"Policy **{md_escape(report.policy.get('name'))}**: {s['files']} file(s), {s['pass']} pass, "
           f"{s['fail']} fail, {s['error']} error, {s['findings']} violation(s).", "",
           "| file | verdict | violations | device targets |", "|---|---|---|---|"]
    for fr in report.files:
        out.append(f"| {md_escape(fr.path)} | {fr.verdict} | {len(fr.failing)} | "
                   f"{md_escape(', '.join(fr.device_targets)) or '-'} |")
    bad = [(fr, f) for fr in report.files for f in fr.findings if f.failing]
    errors = [fr for fr in report.files if fr.error]
    if bad or errors:
        out += ["", "### Why", ""]
        for fr in errors:
            out.append(f"- {md_escape(fr.path)}: could not be audited: {md_escape(fr.error)}")
        for fr, f in bad:
            chain = " &rarr; ".join(md_escape(c) for c in f.chain) if len(f.chain) > 1 else md_escape(fr.path)
            out.append(f"- **{md_escape(f.rule)}** ({f.kind}) {md_escape(f.subject)} in {chain}: {md_escape(f.reason)}")
    return "\n".join(out) + "\n\n"


def append_step_summary(report: CheckReport) -> str | None:
    """Append the summary to $GITHUB_STEP_SUMMARY when it is set; returns the file written."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(render_summary(report))
    return target

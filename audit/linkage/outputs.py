"""`--format FMT[=FILE]`: parse the specs and write each rendering (stdout when no FILE)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from audit.errors import UsageError
from audit.linkage.model import CheckReport
from audit.linkage.policy import Policy

FORMATS = ("text", "json", "sarif", "junit", "github")


@dataclass(frozen=True)
class OutputSpec:
    format: str
    file: str | None = None  # None: standard output


def parse_format(spec: str) -> OutputSpec:
    fmt, sep, file = spec.partition("=")
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise UsageError(f"--format {spec!r}: unknown format (choose from {', '.join(FORMATS)}, optionally =FILE)")
    if sep and not file:
        raise UsageError(f"--format {spec!r}: empty file name after '='")
    return OutputSpec(fmt, file or None)


def render(report: CheckReport, policy: Policy, fmt: str, verbose: bool = False) -> str:
    if fmt == "text":
        from audit.linkage.output_text import render_text
        return render_text(report, verbose)
    if fmt == "json":
        from audit.linkage.output_json import render_json
        return render_json(report)
    if fmt == "sarif":
        from audit.linkage.output_sarif import render_sarif
        return render_sarif(report, policy)
    if fmt == "junit":
        from audit.linkage.output_junit import render_junit
        return render_junit(report, policy)
    from audit.linkage.output_github import render_github
    return render_github(report)


def write_outputs(report: CheckReport, policy: Policy, specs: list[OutputSpec], verbose: bool = False) -> None:
    """Write every requested rendering; the GitHub job summary goes to $GITHUB_STEP_SUMMARY too.
    `verbose`: the text lists every match (JSON always has them all)."""
    for spec in specs or [OutputSpec("text")]:
        text = render(report, policy, spec.format, verbose)
        if spec.file is None:
            click.echo(text, nl=False)
            continue
        try:
            with open(spec.file, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {spec.file}: {exc.strerror or exc}") from None
    if any(s.format == "github" for s in specs):
        from audit.linkage.output_github import append_step_summary
        try:
            append_step_summary(report)
        except OSError as exc:
            raise UsageError(f"cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror or exc}") from None

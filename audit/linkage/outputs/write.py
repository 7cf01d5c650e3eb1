"""`--format FMT[=FILE]`: parse the specs and write each rendering (stdout when no FILE)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

import click

from audit.errors import UsageError
from audit.linkage.model import CheckReport
from audit.linkage.judging.policy import Policy

FORMATS = ("text", "json", "sarif", "junit", "github", "cyclonedx", "spdx")


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
        from audit.linkage.outputs.text import render_text
        return render_text(report, verbose)
    if fmt == "json":
        from audit.linkage.outputs.json import render_json
        return render_json(report)
    if fmt == "sarif":
        from audit.linkage.outputs.sarif import render_sarif
        return render_sarif(report, policy)
    if fmt == "junit":
        from audit.linkage.outputs.junit import render_junit
        return render_junit(report, policy)
    if fmt == "cyclonedx":
        from audit.linkage.outputs.cyclonedx import render_cyclonedx
        return render_cyclonedx(report, policy)
    if fmt == "spdx":
        from audit.linkage.outputs.spdx import render_spdx
        return render_spdx(report, policy)
    from audit.linkage.outputs.github import render_github
    return render_github(report)


def check_destinations(specs: list[OutputSpec]) -> None:
    """Refuse, before any work, an output file that cannot be written: a missing folder, a folder
    as the file, or one file named twice (the second rendering would overwrite the first)."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.file is None:
            continue
        real = os.path.realpath(spec.file)
        if real in seen and (os.path.isfile(real) or not os.path.exists(real)):
            raise UsageError(f"{spec.file}: named by two outputs ({seen[real]} and {spec.format})")
        seen[real] = spec.format
        parent = os.path.dirname(real) or "."
        if os.path.isdir(real):
            raise UsageError(f"cannot write {spec.file}: Is a directory")
        if not os.path.isdir(parent):
            raise UsageError(f"cannot write {spec.file}: No such directory {parent}")
        if not os.access(parent, os.W_OK) and not os.access(real, os.W_OK):
            raise UsageError(f"cannot write {spec.file}: Permission denied")
    if any(s.format in ("cyclonedx", "spdx") for s in specs):  # their date: refused before any work
        from audit.linkage.outputs.sbom import created
        created()
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and any(s.format == "github" for s in specs):
        parent = os.path.dirname(os.path.realpath(summary)) or "."
        if os.path.isdir(summary) or not os.path.isdir(parent):
            raise UsageError(f"cannot append to $GITHUB_STEP_SUMMARY ({summary}): not a file in an existing folder")


def write_outputs(report: CheckReport, policy: Policy, specs: list[OutputSpec], verbose: bool = False) -> None:
    """Write every requested rendering; the GitHub job summary goes to $GITHUB_STEP_SUMMARY too.
    `verbose`: the text lists every match (JSON always has them all). Every rendering is made
    before any is written, and a file is replaced whole, so a failure never leaves a file cut short."""
    specs = specs or [OutputSpec("text")]
    texts = [render(report, policy, spec.format, verbose) for spec in specs]
    for spec, text in zip(specs, texts):
        if spec.file is None:
            click.echo(text, nl=False)
            continue
        try:
            _replace(spec.file, text)
        except OSError as exc:
            raise UsageError(f"cannot write {spec.file}: {exc.strerror or exc}") from None
    if any(s.format == "github" for s in specs):
        from audit.linkage.outputs.github import append_step_summary
        try:
            append_step_summary(report)
        except OSError as exc:
            raise UsageError(f"cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror or exc}") from None


def _replace(path: str, text: str) -> None:
    """`path` gets `text` whole or keeps what it had: written beside it, then renamed over it.
    A device or pipe (/dev/stdout) is written in place."""
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isfile(real):
        with open(real, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    if os.path.exists(real):
        mode = os.stat(real).st_mode & 0o777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real) or ".", prefix=".sovereign-audit-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

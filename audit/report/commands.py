"""`sovereign-audit report`: a thin Click wrapper over bundle.write_bundle."""

from __future__ import annotations

import os
from pathlib import Path

import click

from audit.errors import EXIT_OK, EXIT_VIOLATION, InputError
from audit.report.bundle import write_bundle
from audit.signing.keys import load_signing_key


def signing_key(path):
    """Load the key before any work: a bad key file or $SOVEREIGN_AUDIT_SIGNING_KEY fails in one
    line now, not after a build."""
    return load_signing_key(path)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a folder it cannot look into: not the bundle's evidence/ to descend to
        return False


def _readable_folder(path: Path) -> None:
    """InputError (exit 3) unless `path` is a folder this process can list."""
    try:
        os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"{path}: not a folder of evidence") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the evidence folder: {exc.strerror or exc}") from None


@click.command("report")
@click.argument("evidence_dir", type=click.Path(readable=False, path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Bundle folder to write.")
@click.option("--key", type=click.Path(readable=False, path_type=Path), default=None, metavar="FILE",
              help="Ed25519 PKCS#8 PEM signing key (else $SOVEREIGN_AUDIT_SIGNING_KEY, else ephemeral).")
@click.pass_context
def report_cmd(ctx, evidence_dir, out, key):
    """Rebuild the bundle (report.html, RO-Crate, attestations, manifest) from saved evidence.

    EVIDENCE_DIR holds the evidence JSON files (a bundle's evidence/ folder, or a bundle itself).
    Exit 0 written; 1 written, but the run that made the evidence did not finish (a stage left
    running or pending, or partial evidence: the report says "incomplete"); 2 usage (e.g. --out
    not empty); 3 unreadable or malformed evidence.
    """
    if key is not None and not key.is_file():
        raise InputError(f"--key {key}: {'not a regular file' if key.exists() else 'no such file'}")
    key = signing_key(key)
    _readable_folder(evidence_dir)
    if _is_dir(evidence_dir / "evidence") and not (evidence_dir / "run.json").exists():
        evidence_dir = evidence_dir / "evidence"
        _readable_folder(evidence_dir)
    result = write_bundle(evidence_dir, out, key)
    if result.replaced:
        click.echo(result.replaced, err=True)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    for why in result.incomplete:
        click.echo(f"incomplete: {why}", err=True)
    click.echo(f"report: {result.report}")
    ctx.exit(EXIT_VIOLATION if result.incomplete else EXIT_OK)

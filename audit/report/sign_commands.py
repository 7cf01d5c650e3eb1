"""`keygen` and `verify`: small Click wrappers over audit.signing.keys and audit.report.verify."""

from __future__ import annotations

import json

import click

from audit.errors import EXIT_VIOLATION


@click.command("keygen")
@click.option("--out", "prefix", required=True, metavar="PREFIX",
              help="Write PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub (SubjectPublicKeyInfo PEM).")
@click.option("--force", is_flag=True, help="Overwrite existing PREFIX.key / PREFIX.pub.")
def keygen_cmd(prefix, force):
    """Make an Ed25519 signing key pair for `run --key` (or $SOVEREIGN_AUDIT_SIGNING_KEY)."""
    from audit.signing.keys import generate_keypair, write_keypair

    key = generate_keypair()
    priv, pub = write_keypair(prefix, key, force=force)
    click.echo(f"wrote {priv} (private, keep secret) and {pub} (public)")
    click.echo(f"keyid {key.keyid}")


@click.command("verify")
@click.argument("bundle", metavar="DIR", type=click.Path(file_okay=False, readable=False, path_type=str))
@click.option("--key", "pubkey", metavar="PUB", type=click.Path(dir_okay=False, readable=False, path_type=str),
              help="The signer's public key (PEM). Without it the bundle's own public.pem is used: "
                   "integrity only, not identity.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def verify_cmd(ctx, bundle, pubkey, as_json):
    """Check a bundle's signatures, subject digests and manifest, offline.

    \b
    Exit codes: 0 everything holds; 1 a signature, digest or manifest check failed
    (one line per failing file); 2 not a well-formed bundle, or a --key file that is not
    an Ed25519 PEM public key; 3 the folder or the --key file cannot be read; 130 interrupted.
    """
    from audit.report.verify import printable, verify_bundle

    result = verify_bundle(bundle, pubkey)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for line in result.failures:
            click.echo(f"FAIL {line}")
        for note in result.notes:
            click.echo(f"note: {note}")
        verdict = "OK" if result.ok else f"FAILED ({len(result.failures)} failing)"
        click.echo(f"verify {printable(bundle)}: {verdict}; {result.checked} checks; keyid {result.keyid}")
    if not result.ok:
        ctx.exit(EXIT_VIOLATION)


@click.command("verify-attestation")
@click.argument("attestation", metavar="FILE", type=click.Path(dir_okay=False, readable=False, path_type=str))
@click.option("--key", "pubkey", required=True, metavar="PUB",
              type=click.Path(dir_okay=False, readable=False, path_type=str),
              help="The signer's Ed25519 public key (SubjectPublicKeyInfo PEM, as `keygen` writes PREFIX.pub).")
@click.option("--artifact", "artifacts", multiple=True, metavar="PATH",
              type=click.Path(dir_okay=False, readable=False, path_type=str),
              help="A file that must be one of the subjects (by its sha256). Repeatable.")
@click.option("--require-passed", is_flag=True, help="Also fail (exit 1) when the verdict is FAILED.")
@click.pass_context
def verify_attestation_cmd(ctx, attestation, pubkey, artifacts, require_passed):
    """Check a `check --attest` file: signature, in-toto statement and SLSA VSA shape, subjects.

    FILE holds DSSE envelopes, one per line (*.intoto.jsonl), or one envelope as JSON.

    \b
      sovereign-audit verify-attestation check.intoto.jsonl --key signing.pub --artifact dist/x.whl

    \b
    Exit codes: 0 verified; 1 a signature does not verify under PUB, an --artifact is no
    subject, or (--require-passed) the verdict is FAILED; 2 not a DSSE envelope of an in-toto
    VSA statement, or PUB is not an Ed25519 PEM public key; 3 FILE, PUB or an --artifact
    cannot be read. Each failure is one `error:` line on standard error.
    """
    from audit.errors import EXIT_USAGE, printable
    from audit.linkage.outputs.attestation import verify_file
    from audit.signing.keys import load_public_key, keyid_of

    public = load_public_key(pubkey)
    result = verify_file(attestation, public, list(artifacts))
    if require_passed:
        for stmt in result.statements:
            if stmt["predicate"]["verificationResult"] != "PASSED":
                result.failures.append(f"{printable(attestation)}: the verdict is FAILED "
                                       f"({printable(stmt['predicate']['resourceUri'])[:120]})")
    for line in result.failures:
        click.echo(f"error: {line}", err=True)
    if not result.ok:
        ctx.exit(EXIT_USAGE if result.malformed else EXIT_VIOLATION)
    for stmt in result.statements:
        p = stmt["predicate"]
        click.echo(f"verified {printable(attestation)}: {p['verificationResult']} for "
                   f"{printable(p['resourceUri'])[:200]}; {len(stmt['subject'])} subjects; "
                   f"policy {printable(p['policy']['uri'])[:200]}; keyid {keyid_of(public)}")

"""`keygen` and `verify`: small Click wrappers over audit.report.keys and audit.report.verify."""

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
    from audit.report.keys import generate_keypair, write_keypair

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

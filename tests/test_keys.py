"""Keys: `keygen` output read back by openssl; where the signing key comes from; bad keys."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.signer import SSlibKey

from audit.cli import main
from audit.errors import EXIT_INPUT, EXIT_USAGE, AuditError
from audit.signing.keys import ENV_KEY, ENV_PASSWORD, load_public_key, load_signing_key
from conftest import require_tool


def cli(*args):
    """The CLI in-process through audit.cli.main (the console entry point): (exit code, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return exc.value.code, out.getvalue(), err.getvalue()


def test_keygen_console_entry(tmp_path):
    p = subprocess.run([sys.executable, "-m", "audit", "keygen", "--out", str(tmp_path / "k")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "k.key").exists() and (tmp_path / "k.pub").exists()


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.delenv(ENV_PASSWORD, raising=False)


def test_keygen_writes_pkcs8_and_spki_that_openssl_reads(tmp_path):
    openssl = require_tool("openssl")
    rc, out, err = cli("keygen", "--out", tmp_path / "ci")
    assert rc == 0, err
    priv, pub = tmp_path / "ci.key", tmp_path / "ci.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_text().startswith("-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")  # SubjectPublicKeyInfo
    text = subprocess.run([openssl, "pkey", "-in", str(priv), "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout
    assert "ED25519 Private-Key" in text
    derived = subprocess.run([openssl, "pkey", "-in", str(priv), "-pubout"], capture_output=True,
                             text=True, check=True).stdout
    assert derived == pub.read_text()
    der = subprocess.run([openssl, "pkey", "-pubin", "-in", str(pub), "-outform", "DER"], capture_output=True,
                         check=True).stdout
    keyid = load_signing_key(priv).keyid
    assert f"keyid {keyid}" in out
    # securesystemslib's default keyid (what in-toto/TUF verifiers match signatures by), computed by it
    assert keyid == SSlibKey.from_crypto(load_pem_public_key(pub.read_bytes())).keyid
    # and by hand from openssl's DER (an Ed25519 SPKI ends with the 32 raw key bytes)
    canonical = '{"keytype":"ed25519","keyval":{"public":"%s"},"scheme":"ed25519"}' % der[-32:].hex()
    assert keyid == hashlib.sha256(canonical.encode()).hexdigest()


def test_keygen_refuses_to_overwrite(tmp_path):
    assert cli("keygen", "--out", tmp_path / "k")[0] == 0
    before = (tmp_path / "k.key").read_bytes()
    rc, _, err = cli("keygen", "--out", tmp_path / "k")
    assert rc == EXIT_USAGE and "exists; pass --force" in err and err.startswith("error: ")
    assert (tmp_path / "k.key").read_bytes() == before
    (tmp_path / "k.key").unlink()  # only the .pub left: still refused
    assert cli("keygen", "--out", tmp_path / "k")[0] == EXIT_USAGE
    rc, _, _ = cli("keygen", "--out", tmp_path / "k", "--force")
    assert rc == 0 and (tmp_path / "k.key").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600


def test_keygen_never_writes_through_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "k.key").symlink_to(victim)
    rc, _, err = cli("keygen", "--out", tmp_path / "k", "--force")
    assert rc == EXIT_USAGE and "symlink" in err
    assert victim.read_text() == "keep me"


def test_keygen_missing_directory(tmp_path):
    rc, _, err = cli("keygen", "--out", tmp_path / "no" / "such" / "k")
    assert rc == EXIT_USAGE and "does not exist" in err


def test_key_sources(tmp_path, monkeypatch):
    cli("keygen", "--out", tmp_path / "a")
    cli("keygen", "--out", tmp_path / "b")
    a = load_signing_key(tmp_path / "a.key")
    b_pem = (tmp_path / "b.key").read_text()
    assert not a.ephemeral
    assert a.public_pem == (tmp_path / "a.pub").read_bytes()

    monkeypatch.setenv(ENV_KEY, b_pem)  # the PEM text itself (a CI secret)
    from_env = load_signing_key(None)
    assert not from_env.ephemeral and from_env.public_pem == (tmp_path / "b.pub").read_bytes()
    assert load_signing_key(tmp_path / "a.key").keyid == a.keyid  # an explicit path wins over the env

    monkeypatch.setenv(ENV_KEY, b_pem.replace("\n", "\\n"))  # one line with literal \n escapes
    assert load_signing_key(None).keyid == from_env.keyid

    monkeypatch.setenv(ENV_KEY, str(tmp_path / "a.key"))  # a path
    from_env_path = load_signing_key(None)
    assert from_env_path.keyid == a.keyid
    # the report says where the key came from, never where the private key lives
    assert (a.source, from_env.source, from_env_path.source) == (
        "the --key file", f"${ENV_KEY}", f"the file named by ${ENV_KEY}")

    monkeypatch.delenv(ENV_KEY)
    e1, e2 = load_signing_key(None), load_signing_key(None)
    assert e1.ephemeral and e2.ephemeral and e1.keyid != e2.keyid
    assert "private" not in str(e1.to_dict()).lower()


def test_public_key_loading(tmp_path):
    cli("keygen", "--out", tmp_path / "a")
    pub = load_public_key(tmp_path / "a.pub")
    assert pub.public_bytes_raw() == load_signing_key(tmp_path / "a.key").public.public_bytes_raw()
    with pytest.raises(AuditError) as exc:
        load_public_key(tmp_path / "a.key")  # a private key is not a public key file
    assert exc.value.exit_code == EXIT_USAGE


def _code(fn, *args) -> int:
    with pytest.raises(AuditError) as exc:
        fn(*args)
    assert "\n" not in exc.value.message
    return exc.value.exit_code


def test_bad_signing_keys(tmp_path, monkeypatch):
    openssl = require_tool("openssl")
    assert _code(load_signing_key, tmp_path / "missing.key") == EXIT_INPUT
    (tmp_path / "junk.key").write_text("not a key\n")
    assert _code(load_signing_key, tmp_path / "junk.key") == EXIT_USAGE
    subprocess.run([openssl, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024",
                    "-out", str(tmp_path / "rsa.key")], check=True, capture_output=True)
    with pytest.raises(AuditError, match="not Ed25519"):
        load_signing_key(tmp_path / "rsa.key")
    subprocess.run([openssl, "genpkey", "-algorithm", "ED25519", "-aes-256-cbc", "-pass", "pass:s3cret",
                    "-out", str(tmp_path / "enc.key")], check=True, capture_output=True)
    with pytest.raises(AuditError, match=ENV_PASSWORD):
        load_signing_key(tmp_path / "enc.key")
    monkeypatch.setenv(ENV_PASSWORD, "s3cret")
    assert not load_signing_key(tmp_path / "enc.key").ephemeral
    monkeypatch.setenv(ENV_KEY, "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    assert _code(load_signing_key, None) == EXIT_USAGE


def test_openssl_made_key_signs_for_us(tmp_path):
    """A key made by openssl (not by us) is accepted: the format is the standard one."""
    openssl = require_tool("openssl")
    subprocess.run([openssl, "genpkey", "-algorithm", "ED25519", "-out", str(tmp_path / "o.key")], check=True)
    key = load_signing_key(tmp_path / "o.key")
    pub = subprocess.run([openssl, "pkey", "-in", str(tmp_path / "o.key"), "-pubout"], capture_output=True,
                         check=True).stdout
    assert key.public_pem == pub
    assert os.environ.get(ENV_KEY) is None

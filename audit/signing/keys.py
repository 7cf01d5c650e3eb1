"""Ed25519 signing keys: load, generate, write (PEM: PKCS#8 private, SubjectPublicKeyInfo public).

Where the signing key comes from, in order:
1. an explicit path (`--key FILE`): a PEM file holding a PKCS#8 Ed25519 private key;
2. the environment variable SOVEREIGN_AUDIT_SIGNING_KEY (for CI secrets): its value is either the PEM
   text itself (it starts with "-----BEGIN"; literal "\n" escapes are accepted for one-line secrets)
   or, otherwise, the path of a PEM file;
3. neither: a fresh EPHEMERAL key that exists only for this run. It proves the bundle was not changed
   after signing (integrity) but says nothing about who signed it (no identity).
An encrypted private key takes its passphrase from SOVEREIGN_AUDIT_SIGNING_KEY_PASSWORD.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.errors import InputError, UsageError

ENV_KEY = "SOVEREIGN_AUDIT_SIGNING_KEY"
ENV_PASSWORD = "SOVEREIGN_AUDIT_SIGNING_KEY_PASSWORD"
MAX_KEY_FILE = 64 * 1024  # a PEM key is a few hundred bytes; refuse to slurp anything big
# The report says where the key came from, never where a secret lives on this machine.
_SOURCE_FILE = "the --key file"
_SOURCE_ENV = f"${ENV_KEY}"
_SOURCE_ENV_FILE = f"the file named by ${ENV_KEY}"


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    public_pem: bytes  # SubjectPublicKeyInfo PEM
    keyid: str  # keyid_of(public): securesystemslib's default keyid
    ephemeral: bool
    source: str = ""  # where the key came from, in words for the report; never a path (see _SOURCE_*)

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    def private_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def to_dict(self) -> dict:
        # Never the private key.
        return {"keyid": self.keyid, "ephemeral": self.ephemeral, "algorithm": "ed25519",
                "source": self.source, "public_pem": self.public_pem.decode("ascii")}


def public_pem_of(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def keyid_of(public: Ed25519PublicKey) -> str:
    """securesystemslib's default keyid: sha256 (hex) of the key's canonical JSON, i.e. of
    {"keytype":"ed25519","keyval":{"public":"<raw key, hex>"},"scheme":"ed25519"} with sorted keys and
    no spaces. DSSE verifiers built on securesystemslib (in-toto, TUF tools) match signatures to keys
    by this id, so an envelope signed here is found by them; cosign and our `verify` ignore it."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    canonical = '{"keytype":"ed25519","keyval":{"public":"%s"},"scheme":"ed25519"}' % raw
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _from_private(private: Ed25519PrivateKey, ephemeral: bool, source: str) -> SigningKey:
    public = private.public_key()
    return SigningKey(private=private, public_pem=public_pem_of(public), keyid=keyid_of(public),
                      ephemeral=ephemeral, source=source)


def generate_keypair(ephemeral: bool = False) -> SigningKey:
    """A new Ed25519 key (for `keygen`, or an ephemeral run key)."""
    return _from_private(Ed25519PrivateKey.generate(), ephemeral, "ephemeral" if ephemeral else "generated")


def _read_small(path: Path, what: str) -> bytes:
    """The bytes of a key file: a regular file only (opened without blocking, so a FIFO or a
    device named as a key never hangs the run), at most MAX_KEY_FILE bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"cannot read {what} {path!s}: not a regular file")
            if st.st_size > MAX_KEY_FILE:
                raise UsageError(f"{what} {path!s}: too large to be a PEM key")
            data = fh.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path!s}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the name (the environment variable's value)
        raise InputError(f"cannot read {what} {path!s}: not a file name") from None
    if len(data) > MAX_KEY_FILE:  # grew while it was read
        raise UsageError(f"{what} {path!s}: too large to be a PEM key")
    return data


def private_key_from_pem(data: bytes, where: str) -> Ed25519PrivateKey:
    password = os.environ.get(ENV_PASSWORD)
    try:
        key = serialization.load_pem_private_key(data, password=password.encode() if password else None)
    except TypeError:
        raise UsageError(f"{where}: the private key is encrypted; set {ENV_PASSWORD}") from None
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{where}: not a PEM private key (expected PKCS#8 Ed25519, as `keygen` writes)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{where}: the key is not Ed25519 ({type(key).__name__})")
    return key


def load_signing_key(path: str | Path | None = None) -> SigningKey:
    """The key to sign with: `path`, else $SOVEREIGN_AUDIT_SIGNING_KEY (PEM text or a path), else ephemeral."""
    if path is not None and str(path) != "":
        p = Path(path)
        return _from_private(private_key_from_pem(_read_small(p, "signing key"), f"signing key {p}"),
                             False, _SOURCE_FILE)
    env = os.environ.get(ENV_KEY, "")
    if env.strip():
        if env.lstrip().startswith("-----BEGIN"):
            if "\n" not in env and "\\n" in env:  # a secret stored with literal \n escapes (some CI UIs)
                env = env.replace("\\n", "\n")
            return _from_private(private_key_from_pem(env.encode(), f"${ENV_KEY}"), False, _SOURCE_ENV)
        p = Path(env)
        return _from_private(private_key_from_pem(_read_small(p, f"signing key (${ENV_KEY})"),
                                                  f"signing key {p} (${ENV_KEY})"), False, _SOURCE_ENV_FILE)
    return generate_keypair(ephemeral=True)


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a SubjectPublicKeyInfo PEM file (what `keygen` writes as PREFIX.pub)."""
    p = Path(path)
    data = _read_small(p, "public key")
    return public_key_from_pem(data, f"public key {p}")


def public_key_from_pem(data: bytes, where: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{where}: not a PEM public key (expected SubjectPublicKeyInfo Ed25519)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(f"{where}: the key is not Ed25519 ({type(key).__name__})")
    return key


def write_keypair(prefix: str | Path, key: SigningKey, force: bool = False) -> tuple[Path, Path]:
    """Write PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub (SPKI PEM); refuse to overwrite unless force."""
    prefix = Path(prefix)
    priv_path = prefix.parent / (prefix.name + ".key")
    pub_path = prefix.parent / (prefix.name + ".pub")
    if not prefix.parent.is_dir():
        raise UsageError(f"keygen: directory {prefix.parent!s} does not exist")
    if not force:
        for p in (priv_path, pub_path):
            if os.path.lexists(p):
                raise UsageError(f"keygen: {p!s} exists; pass --force to overwrite it")
    for p in (priv_path, pub_path):
        if os.path.islink(p):  # never write a private key through a symlink someone planted
            raise UsageError(f"keygen: {p!s} is a symlink; refusing to write through it")
    # The private key never exists on disk with looser permissions than 0600, even briefly.
    tmp = priv_path.parent / (priv_path.name + f".tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.private_pem())
        os.chmod(tmp, 0o600)
        os.replace(tmp, priv_path)
        pub_path.write_bytes(key.public_pem)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"keygen: cannot write {prefix!s}.key/.pub: {exc.strerror or exc}") from None
    return priv_path, pub_path

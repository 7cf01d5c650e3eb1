"""`verify`: check a bundle offline — every envelope's signature, every subject digest, the manifest.

Outcome: VerifyResult.ok when everything holds; otherwise one failure line per problem, each naming
the file. A bundle that is not one at all (no manifest, bad JSON, bad base64, wrong payloadType)
raises MalformedBundle (exit 2). Names are never trusted: a subject or manifest entry that is
absolute, has `..`, or goes through a symlink is a failure, and nothing outside the bundle is read.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from audit.errors import InputError, UsageError
from audit.signing import dsse
from audit.signing.keys import keyid_of, load_public_key, public_key_from_pem
from audit.report.manifest import (
    MANIFEST, MANIFEST_ENVELOPE, PUBLIC_KEY, SCHEMA, STATEMENT_TYPE, UNLISTED, UnsafePath,
    hash_member, name_problem, open_member, read_member, walk_bundle,
)

INTEGRITY_ONLY = ("no --key given: checked against the bundle's own public.pem, which proves integrity "
                  "only (nothing changed since signing), not identity (who signed)")
EPHEMERAL = "signed with an ephemeral key: integrity only, no identity"
# A member larger than the manifest says (and than this) is a failure found from its size alone;
# below it the digest is still computed, so the failure names what differs.
HASH_OFF_SIZE = 64 << 20


class MalformedBundle(UsageError):
    """Not a bundle we can check at all: exit 2."""


def printable(text: str) -> str:
    """`text` safe for a terminal line: control and other non-printable characters escaped."""
    out = []
    for c in str(text):
        if c.isprintable() and c != "\\":
            out.append(c)
        else:
            out.append(repr(c)[1:-1] if c != "\\" else "\\\\")
    return "".join(out)


@dataclass
class VerifyResult:
    ok: bool
    failures: list[str] = field(default_factory=list)  # one line each, naming the file
    checked: int = 0  # signatures, subject digests and manifest entries checked
    ephemeral: bool = False  # the manifest says the signing key was ephemeral
    keyid: str = ""  # of the key the signatures were checked against
    identity: bool = False  # True only when the verifier supplied the key (--key)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"schema": "sovereign-audit.verify/1", **asdict(self)}


class _Checker:
    def __init__(self, root: Path, public, key_desc: str, sizes: dict[str, int] | None = None):
        self.root, self.public, self.key_desc = root, public, key_desc
        self.sizes = sizes or {}  # the manifest's size of each file it lists
        self.failures: list[str] = []
        self.checked = 0

    def fail(self, line: str) -> None:
        if line not in self.failures:
            self.failures.append(line)

    def digest(self, name: str, expected: str, claimed_by: str, size: int | None = None,
               listed_size: int | None = None) -> None:
        """`listed_size`: the manifest's size for `name` where a subject is checked. A file larger
        than its listed size and than HASH_OFF_SIZE fails on its size without being read (a
        sparse file can claim 200 GiB in a few bytes of disk)."""
        self.checked += 1
        try:
            known = size if size is not None else listed_size
            if known is not None:
                fd = open_member(self.root, name)
                try:
                    actual_size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                if actual_size != known and actual_size > max(known, HASH_OFF_SIZE):
                    self.fail(f"{printable(name)}: size {actual_size} does not match "
                              f"{MANIFEST if size is None else claimed_by} ({known}); not hashed")
                    return
            actual, actual_size = hash_member(self.root, name)
        except UnsafePath as exc:
            self.fail(f"{printable(name)}: {exc} (named by {claimed_by})")
            return
        if actual != expected:
            self.fail(f"{printable(name)}: sha256 does not match {claimed_by}")
        elif size is not None and actual_size != size:
            self.fail(f"{printable(name)}: size {actual_size} does not match {claimed_by} ({size})")

    def envelope(self, name: str) -> dict | None:
        """Check one envelope's signature and subjects; its Statement when the signature holds."""
        try:
            data = read_member(self.root, name)
        except UnsafePath as exc:
            self.fail(f"{printable(name)}: {exc}")
            return None
        try:
            env = dsse.loads(data, printable(name))
        except dsse.MalformedEnvelope as exc:
            raise MalformedBundle(exc.message) from None
        if env.payload_type != dsse.PAYLOAD_TYPE:
            raise MalformedBundle(f"{printable(name)}: payloadType {printable(env.payload_type)!r} is not "
                                  f"{dsse.PAYLOAD_TYPE}")
        self.checked += len(env.signatures)
        bad = env.failing(self.public)
        for i in bad:  # every signature present must verify: a stray one is named, not skipped
            keyid = env.signatures[i].keyid
            shown = printable(keyid[:64] + ("…" if len(keyid) > 64 else "")) if keyid else "none"
            self.fail(f"{printable(name)}: signature {i + 1} of {len(env.signatures)} (keyid {shown}) "
                      f"does not verify with {self.key_desc}")
        if bad:
            return None  # an unauthenticated payload is not read further
        try:
            st = json.loads(env.payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise MalformedBundle(f"{printable(name)}: payload is not JSON") from None
        if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE or not isinstance(st.get("subject"), list):
            raise MalformedBundle(f"{printable(name)}: payload is not an in-toto Statement v1")
        for s in st["subject"]:
            sname = s.get("name") if isinstance(s, dict) else None
            problem = _name_problem(sname)
            if problem:
                self.fail(f"{printable(name)}: subject {printable(repr(sname))}: {problem}")
                continue
            digest = s.get("digest", {}).get("sha256") if isinstance(s.get("digest"), dict) else None
            if not isinstance(digest, str):
                self.fail(f"{printable(name)}: subject {printable(sname)!r} has no sha256 digest")
                continue
            self.digest(sname, digest.lower(), name, listed_size=self.sizes.get(sname))
        return st


def _name_problem(name) -> str | None:
    """name_problem, and a name no file can have here: a lone surrogate that JSON can spell
    (`"\\ud800"`) but the file system cannot encode."""
    problem = name_problem(name)
    if problem is None:
        try:
            os.fsencode(name)
        except UnicodeError:
            return "not a file name this system can spell (an unpaired surrogate)"
    return problem


def _load_key(root: Path, pubkey, notes: list[str]):
    if pubkey is not None:
        public = load_public_key(pubkey)
        try:
            bundled = public_key_from_pem(read_member(root, PUBLIC_KEY, 64 << 10), PUBLIC_KEY)
            if keyid_of(bundled) != keyid_of(public):
                notes.append(f"the bundle's {PUBLIC_KEY} is not the key given with --key (only --key is trusted)")
        except (UnsafePath, UsageError):
            pass
        return public, f"--key {printable(str(pubkey))}", True
    notes.append(INTEGRITY_ONLY)
    try:
        data = read_member(root, PUBLIC_KEY, 64 << 10)
    except UnsafePath as exc:
        if str(exc).startswith("missing"):
            raise MalformedBundle(f"{printable(str(root))}: no {PUBLIC_KEY} in the bundle; pass --key PUB") from None
        return None, f"{PUBLIC_KEY} ({exc})", False
    return public_key_from_pem(data, f"{printable(str(root))}/{PUBLIC_KEY}"), f"the bundle's {PUBLIC_KEY}", False


def _load_manifest(root: Path) -> dict:
    try:
        data = read_member(root, MANIFEST)
    except UnsafePath as exc:
        if str(exc).startswith("missing"):
            raise MalformedBundle(f"{printable(str(root))}: no {MANIFEST}: not a sovereign-audit bundle") from None
        raise  # a symlink or a non-file where the manifest should be: a failure, reported by the caller
    try:
        m = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedBundle(f"{MANIFEST}: not JSON ({exc})") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA or not isinstance(m.get("files"), list):
        raise MalformedBundle(f"{MANIFEST}: not a {SCHEMA} manifest")
    for i, e in enumerate(m["files"]):
        if not (isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
                and "path" in e):
            raise MalformedBundle(f"{MANIFEST}: files[{i}] lacks path, sha256 or size")
    return m


def verify_bundle(dir: Path, pubkey: Path | None = None) -> VerifyResult:
    """Verify the bundle in `dir` against `pubkey` (a SPKI PEM file) or, if None, its own public.pem."""
    root = Path(dir)
    try:
        os.listdir(root)
    except FileNotFoundError:
        raise InputError(f"{printable(str(root))}: no such folder") from None
    except NotADirectoryError:
        raise MalformedBundle(f"{printable(str(root))}: not a folder") from None
    except OSError as exc:
        raise InputError(f"{printable(str(root))}: cannot read the bundle folder: {exc.strerror or exc}") from None
    notes: list[str] = []
    public, key_desc, identity = _load_key(root, pubkey, notes)
    try:
        manifest = _load_manifest(root)
    except UnsafePath as exc:  # e.g. manifest.json replaced by a symlink: nothing listed can be trusted
        return VerifyResult(ok=False, failures=[f"{MANIFEST}: {exc}"], notes=notes)
    files, problems = walk_bundle(root)
    if MANIFEST_ENVELOPE not in files and not any(n == MANIFEST_ENVELOPE for n, _ in problems):
        raise MalformedBundle(f"{printable(str(root))}: no {MANIFEST_ENVELOPE}: the manifest is unsigned")
    sizes: dict[str, int] = {}
    for e in manifest["files"]:
        if not _name_problem(e["path"]):
            sizes.setdefault(e["path"], e["size"])
    c = _Checker(root, public, key_desc, sizes)
    if public is None:
        c.fail(f"{PUBLIC_KEY}: {key_desc}; no signature can be checked (pass --key PUB)")

    envelopes = [MANIFEST_ENVELOPE] + [n for n in files if n.startswith("attestations/") and n.endswith(".dsse.json")]
    manifest_statement = None
    for name in envelopes:
        if public is None:
            break
        st = c.envelope(name)
        if name == MANIFEST_ENVELOPE:
            manifest_statement = st
    if manifest_statement is not None:
        if not any(isinstance(s, dict) and s.get("name") == MANIFEST for s in manifest_statement["subject"]):
            c.fail(f"{MANIFEST}: not a subject of {MANIFEST_ENVELOPE}, so it is not signed")

    listed = set()
    for e in manifest["files"]:
        path = e["path"]
        problem = _name_problem(path)
        if problem:
            c.fail(f"{MANIFEST}: entry {printable(repr(path))}: {problem}")
            continue
        if path in listed:
            c.fail(f"{MANIFEST}: {printable(path)} is listed twice")
            continue
        listed.add(path)
        c.digest(path, e["sha256"].lower(), MANIFEST, e["size"])
    for name, problem in problems:
        c.fail(f"{printable(name)}: {problem}")
    for name in files:
        if name not in listed and name not in UNLISTED:
            c.fail(f"{printable(name)}: not listed in {MANIFEST}")

    key = manifest.get("key") if isinstance(manifest.get("key"), dict) else {}
    ephemeral = key.get("ephemeral") is True
    if ephemeral:
        notes.append(EPHEMERAL)
    return VerifyResult(ok=not c.failures, failures=c.failures, checked=c.checked, ephemeral=ephemeral,
                        keyid=keyid_of(public) if public is not None else "", identity=identity and not ephemeral,
                        notes=notes)

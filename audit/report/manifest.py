"""The bundle manifest: every file's bundle-relative path, sha256 and size, signed.

Layout written here (the LAST step of writing a bundle):
  public.pem          the signer's Ed25519 public key (SubjectPublicKeyInfo PEM); listed in the manifest
  manifest.json       {"schema": "sovereign-audit.manifest/1", "files": [{"path", "sha256", "size"}], "key"}
  manifest.dsse.json  a DSSE envelope of an in-toto Statement whose subjects are manifest.json and every
                      listed file (so `cosign verify-blob-attestation` can check any single file too)
Only manifest.json and manifest.dsse.json are not listed (they cannot list themselves).

Also home of the bundle path rules shared with `verify`: a bundle holds only regular files and the
folders that hold them (an empty folder is refused: no manifest entry could cover it); names are
relative POSIX paths without `.`/`..` parts; symlinks are refused, never followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from audit.errors import InputError

MANIFEST = "manifest.json"
MANIFEST_ENVELOPE = "manifest.dsse.json"
PUBLIC_KEY = "public.pem"
UNLISTED = frozenset({MANIFEST, MANIFEST_ENVELOPE})
SCHEMA = "sovereign-audit.manifest/1"
MANIFEST_PREDICATE = "https://sovereign-audit.dev/manifest/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
_CHUNK = 1 << 20


class UnsafePath(Exception):
    """A bundle name or file that must not be read: the reason is the message."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    sha256: str
    size: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Manifest:
    files: list[ManifestEntry] = field(default_factory=list)
    keyid: str = ""
    ephemeral: bool = False

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "algorithm": "sha256",
                "key": {"keyid": self.keyid, "ephemeral": self.ephemeral, "algorithm": "ed25519",
                        "file": PUBLIC_KEY},
                "files": [f.to_dict() for f in self.files]}


def name_problem(name) -> str | None:
    """Why `name` cannot be a bundle member (lexically), or None. No file system access."""
    if not isinstance(name, str) or name == "":
        return "not a file name"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "control character in the name"
    if "\\" in name:
        return "backslash in the name (bundle names are POSIX paths)"
    if name.startswith("/"):
        return "absolute path points outside the bundle"
    parts = name.split("/")
    if ".." in parts:
        return "'..' points outside the bundle"
    if any(p in ("", ".") for p in parts):
        return "not a normalised relative path"
    return None


def open_member(root: Path, name: str) -> int:
    """An fd for reading bundle member `name`, refusing anything that could lead outside `root`.

    Every component is lstat'ed: a symlink anywhere is refused (reporting whether it escapes),
    and only a regular file is opened (O_NOFOLLOW, O_NONBLOCK: a FIFO never hangs us).
    """
    problem = name_problem(name)
    if problem:
        raise UnsafePath(problem)
    cur = Path(root)
    parts = PurePosixPath(name).parts
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise UnsafePath("missing") from None
        except OSError as exc:
            raise UnsafePath(f"unreadable ({exc.strerror or exc})") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(symlink_problem(root, cur))
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise UnsafePath("missing (a parent is not a folder)")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath("not a regular file")
    try:
        fd = os.open(cur, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnsafePath(f"unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between lstat and open
        os.close(fd)
        raise UnsafePath("not a regular file")
    return fd


def symlink_problem(root: Path, link: Path) -> str:
    try:
        target = os.path.realpath(link)
        inside = os.path.commonpath([os.path.realpath(root), target]) == os.path.realpath(root)
    except (OSError, ValueError):
        inside = False
    if inside:
        return "symlink (a bundle holds only regular files)"
    return "symlink points outside the bundle"


def hash_member(root: Path, name: str) -> tuple[str, int]:
    """(sha256 hex, size) of bundle member `name`; UnsafePath when it cannot be read safely."""
    fd = open_member(root, name)
    h = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def read_member(root: Path, name: str, limit: int = 64 << 20) -> bytes:
    fd = open_member(root, name)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafePath(f"larger than {limit} bytes")
    return data


def walk_bundle(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Every member's name (sorted) and every (name, problem) met: symlinks, sockets, odd names,
    empty folders.

    Never follows a symlink, so a link to '/' cannot make us walk the machine.
    """
    files: list[str] = []
    problems: list[tuple[str, str]] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(Path(root) / rel if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            problems.append((rel or ".", f"unreadable folder ({exc.strerror or exc})"))
            continue
        if rel and not entries:  # the manifest lists files only, so it could not vouch for this
            problems.append((rel + "/", "empty folder (a bundle holds files, and folders that hold them)"))
        for e in entries:
            name = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                problems.append((name, symlink_problem(root, Path(e.path))))
            elif e.is_dir(follow_symlinks=False):
                stack.append(name)
            elif e.is_file(follow_symlinks=False):
                bad = name_problem(name)
                if bad:
                    problems.append((name, bad))
                else:
                    files.append(name)
            else:
                problems.append((name, "not a regular file"))
    return sorted(files), problems


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def statement(subjects: list[dict], predicate_type: str, predicate: dict) -> dict:
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type,
            "predicate": predicate}


def subject(name: str, sha256: str) -> dict:
    return {"name": name, "digest": {"sha256": sha256}}


def build_manifest(bundle_dir: Path, keyid: str = "", ephemeral: bool = False) -> Manifest:
    """The manifest of what is in `bundle_dir` now; InputError on anything a bundle must not hold."""
    files, problems = walk_bundle(bundle_dir)
    if problems:
        name, why = problems[0]
        raise InputError(f"bundle {bundle_dir!s}: {name!r}: {why}; refusing to sign it")
    entries = []
    for name in files:
        if name in UNLISTED:
            continue
        try:
            digest, size = hash_member(bundle_dir, name)
        except UnsafePath as exc:
            raise InputError(f"bundle {bundle_dir!s}: {name!r}: {exc}") from None
        entries.append(ManifestEntry(name, digest, size))
    return Manifest(entries, keyid, ephemeral)


def write_public_key(bundle_dir: Path, key) -> Path:
    """Write public.pem (the key that verifies the bundle's signatures) into `bundle_dir`."""
    path = Path(bundle_dir) / PUBLIC_KEY
    if os.path.islink(path):
        raise InputError(f"bundle {bundle_dir!s}: {PUBLIC_KEY} is a symlink; refusing to write through it")
    path.write_bytes(key.public_pem)
    return path


def write_manifest(bundle_dir: Path, key) -> Path:
    """Write public.pem, manifest.json and manifest.dsse.json into `bundle_dir`; returns manifest.json.

    Call it last: any file written after it is an unlisted file and makes `verify` fail.
    """
    from audit.signing import dsse  # local: keeps `manifest` importable without cryptography loaded

    bundle_dir = Path(bundle_dir)
    for n in (MANIFEST, MANIFEST_ENVELOPE):
        if os.path.islink(bundle_dir / n):
            raise InputError(f"bundle {bundle_dir!s}: {n} is a symlink; refusing to write through it")
    write_public_key(bundle_dir, key)
    manifest = build_manifest(bundle_dir, key.keyid, key.ephemeral)
    body = (json.dumps(manifest.to_dict(), indent=2, ensure_ascii=True) + "\n").encode()
    (bundle_dir / MANIFEST).write_bytes(body)
    subjects = [subject(MANIFEST, sha256_bytes(body))] + [subject(e.path, e.sha256) for e in manifest.files]
    predicate = {"manifest": MANIFEST, "files": len(manifest.files),
                 "key": {"keyid": key.keyid, "ephemeral": key.ephemeral},
                 "note": ("ephemeral key: integrity only, no identity" if key.ephemeral
                          else "signed with a persistent key: identity is whoever holds it")}
    st = json.dumps(statement(subjects, MANIFEST_PREDICATE, predicate), indent=2, ensure_ascii=True).encode()
    (bundle_dir / MANIFEST_ENVELOPE).write_text(dsse.sign(st, key).to_json())
    return bundle_dir / MANIFEST

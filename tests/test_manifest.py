"""The manifest lists every file with its sha256 and size, is signed, and refuses what a bundle must not hold."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.errors import AuditError
from audit.signing import dsse
from audit.signing.keys import generate_keypair
from audit.report.manifest import name_problem, write_manifest
from conftest import require_tool


def _tree(root: Path) -> None:
    (root / "evidence").mkdir(parents=True)
    (root / "evidence" / "parity.json").write_text('{"schema": "x"}\n')
    (root / "artifacts" / "cpu").mkdir(parents=True)
    (root / "artifacts" / "cpu" / "lib.so").write_bytes(bytes(range(256)) * 40)
    (root / "empty.txt").write_bytes(b"")
    (root / "name with spaces & <tags>.txt").write_text("hostile but legal\n")


def test_lists_every_file_with_digest_and_size(tmp_path):
    sha256sum = require_tool("sha256sum")
    root = tmp_path / "b"
    _tree(root)
    key = generate_keypair()
    path = write_manifest(root, key)
    assert path == root / "manifest.json"
    m = json.loads(path.read_text())
    assert m["schema"] == "sovereign-audit.manifest/1"
    assert m["key"] == {"keyid": key.keyid, "ephemeral": False, "algorithm": "ed25519", "file": "public.pem"}
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                     and p.name not in ("manifest.json", "manifest.dsse.json"))
    assert [e["path"] for e in m["files"]] == on_disk
    assert "public.pem" in on_disk and (root / "public.pem").read_bytes() == key.public_pem
    # digests and sizes from an independent tool
    for e in m["files"]:
        out = subprocess.run([sha256sum, str(root / e["path"])], capture_output=True, text=True, check=True)
        assert e["sha256"] == out.stdout.split()[0]
        assert e["size"] == os.path.getsize(root / e["path"])


def test_envelope_signs_the_manifest_and_every_file(tmp_path):
    root = tmp_path / "b"
    _tree(root)
    key = generate_keypair()
    write_manifest(root, key)
    env = dsse.loads((root / "manifest.dsse.json").read_text())
    assert env.verify(key.public)
    st = json.loads(env.payload)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://sovereign-audit.dev/manifest/v1"
    names = [s["name"] for s in st["subject"]]
    m = json.loads((root / "manifest.json").read_text())
    assert names == ["manifest.json"] + [e["path"] for e in m["files"]]
    import hashlib
    assert st["subject"][0]["digest"]["sha256"] == hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    assert base64.b64decode(json.loads((root / "manifest.dsse.json").read_text())["payload"]) == env.payload


def test_rewriting_replaces_the_old_manifest(tmp_path):
    root = tmp_path / "b"
    _tree(root)
    key = generate_keypair()
    write_manifest(root, key)
    (root / "late.txt").write_text("added later")
    write_manifest(root, key)
    paths = [e["path"] for e in json.loads((root / "manifest.json").read_text())["files"]]
    assert "late.txt" in paths and "manifest.json" not in paths and "manifest.dsse.json" not in paths


def test_refuses_symlinks(tmp_path):
    root = tmp_path / "b"
    _tree(root)
    (root / "evidence" / "link").symlink_to("/etc/passwd")
    with pytest.raises(AuditError, match="symlink points outside the bundle") as exc:
        write_manifest(root, generate_keypair())
    assert exc.value.exit_code == 3
    assert not (root / "manifest.json").exists()


def test_refuses_an_empty_folder(tmp_path):
    """The manifest lists files only, so it could not vouch for an empty folder: signing refuses one
    (and `verify` reports one added later)."""
    root = tmp_path / "b"
    _tree(root)
    (root / "evidence" / "later").mkdir()
    with pytest.raises(AuditError, match="'evidence/later/': empty folder") as exc:
        write_manifest(root, generate_keypair())
    assert exc.value.exit_code == 3
    assert not (root / "manifest.json").exists()


def test_refuses_newlines_in_names(tmp_path):
    root = tmp_path / "b"
    _tree(root)
    (root / "two\nlines.txt").write_text("x")
    with pytest.raises(AuditError, match="control character"):
        write_manifest(root, generate_keypair())


@pytest.mark.parametrize("name, ok", [
    ("evidence/parity.json", True), ("a b/<c>.txt", True), ("../x", False), ("/etc/passwd", False),
    ("a/../../b", False), ("a//b", False), ("./a", False), ("", False), ("a\\b", False), ("a\x00b", False),
    (None, False), ("a/", False),
])
def test_name_rules(name, ok):
    assert (name_problem(name) is None) == ok


# Names built from the pieces that matter: separators, dots, dot-dots, plain parts.
_parts = st.sampled_from(["a", "b.json", "..", ".", "", "...", "..a", "a..", " ", "<x>", "é"])


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(_parts, min_size=1, max_size=6))
def test_accepted_names_never_leave_the_bundle(absolute, parts):
    """Every name name_problem accepts resolves (lexically) to a path strictly inside the root."""
    name = ("/" if absolute else "") + "/".join(parts)
    root = "/bundle/root"
    if name_problem(name) is None:
        joined = posixpath.normpath(posixpath.join(root, name))
        assert joined.startswith(root + "/"), name
        assert posixpath.relpath(joined, root) == name  # already normalised: one spelling per file

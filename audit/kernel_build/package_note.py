"""The `.note.package` every library `build` makes carries, so an SBOM of a check names it.

The note is the systemd/Fedora "ELF package metadata" format (owner "FDO", type 0xcafe1a7e, a
JSON object; audit.elf.notes reads it back): {"type": "generic", "name": "flash_kernel",
"version": <sovereign-audit's version>, "target": <the build target>, "sourceDigest":
"sha256:<digest of the sources>"}. The source digest is the sha256 of the sorted
"<sha256>  <path>\\n" lines of the sources provenance.json lists (the `sha256sum` format), so it
can be recomputed from provenance.json alone.

It is added after the compile with objcopy (binutils), not by the linker: ld's
`--package-metadata` takes the JSON as one argument, which nvcc's and hipcc's linker-option
forwarding split at its commas, and the sources are only known once the compiler has listed
them (-MD).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from audit import __version__

OWNER = b"FDO\0"
NT_FDO_PACKAGING_METADATA = 0xCAFE1A7E
NAME = "flash_kernel"


class StampError(Exception):
    """The note could not be added (one line)."""


def source_digest(sources) -> str:
    """sha256 over the sorted `sha256sum` lines of the sources (FileDigest: path, sha256)."""
    lines = sorted(f"{s.sha256}  {s.path}\n" for s in sources)
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def document(target: str, sources) -> dict:
    return {"type": "generic", "name": NAME, "version": __version__, "target": target,
            "sourceDigest": source_digest(sources)}


def note_bytes(doc: dict) -> bytes:
    """The ELF note: namesz, descsz, type, the owner and the NUL-terminated JSON, each 4-aligned."""
    desc = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\0"

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % 4)

    return struct.pack("<III", len(OWNER), len(desc), NT_FDO_PACKAGING_METADATA) + pad(OWNER) + pad(desc)


def stamp(library: Path, doc: dict) -> None:
    """Add the note to `library` in place as a `.note.package` section (SHT_NOTE, 4-aligned)."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        raise StampError("objcopy (binutils) not found: cannot add .note.package to the library")
    with tempfile.TemporaryDirectory(prefix="fk-note-", dir=library.parent) as tmp:
        note = Path(tmp) / "note.package"
        note.write_bytes(note_bytes(doc))
        cmd = [objcopy, "--remove-section", ".note.package", "--add-section", f".note.package={note}",
               "--set-section-flags", ".note.package=contents,readonly",
               "--set-section-alignment", ".note.package=4", str(library)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StampError(f"objcopy failed: {exc}") from None
        if proc.returncode != 0:
            line = (proc.stderr or proc.stdout).strip().splitlines()[:1] or [f"exit {proc.returncode}"]
            raise StampError(f"objcopy could not add .note.package: {line[0][:300]}")

"""The two JSON notes a binary may carry about itself, read where present:

  - `.note.package` (owner "FDO", type 0xcafe1a7e): the package the file belongs to, as the
    systemd/Fedora "ELF package metadata" format writes it (`ld --package-metadata`,
    Fedora's and Debian's package notes): a JSON object, {"type": "rpm", "name": ...,
    "version": ..., "architecture": ..., "os": ..., "osVersion": ...}; every key is kept.
  - `.note.dlopen` (owner "FDO", type 0x407c0c0a): libraries the file loads with dlopen,
    declared by its authors (systemd's "dlopen metadata" format, SD_ELF_NOTE_DLOPEN): a JSON
    array of {"feature", "description", "priority", "soname": [...]}; one note or several.

Both are looked for in SHT_NOTE sections and PT_NOTE segments (a stripped file keeps only the
segment), each note once. Bounded: a note's descriptor over MAX_DESC bytes, or more than
MAX_DECLARED declared libraries, is refused. Fail closed where it matters: a `.note.dlopen`
that cannot be read declares linkage nobody can see, so the file is an error (Malformed); a
`.note.package` that cannot be read only loses the file's name for itself (a warning).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from audit.elf.dynamic import each_note
from audit.elf.parse import PT_NOTE, SHT_NOTE, ElfImage, Malformed

OWNER = b"FDO"
NT_FDO_PACKAGING_METADATA = 0xCAFE1A7E
NT_FDO_DLOPEN_METADATA = 0x407C0C0A
MAX_DESC = 64 << 10  # one note's JSON; real ones are a few hundred bytes
MAX_DECLARED = 1024  # declared libraries in one file
MAX_TEXT = 4096  # one string of a note


@dataclass(frozen=True)
class DlopenDecl:
    """One library the file declares it may dlopen: the sonames are alternatives, tried in order."""

    sonames: tuple[str, ...]
    feature: str | None = None
    description: str | None = None
    priority: str | None = None  # "required" | "recommended" | "suggested" (the spec's words)


@dataclass
class ElfNotes:
    package: dict | None = None  # the .note.package object as written (strings, numbers, booleans)
    dlopen: list[DlopenDecl] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _places(img: ElfImage) -> list[tuple[int, int]]:
    places = [(s.offset, s.size) for s in img.sections_of_type(SHT_NOTE)]
    places += [(p.offset, p.filesz) for p in img.segments if p.type == PT_NOTE]
    return sorted(set(places))


def _json(img: ElfImage, desc_at: int, descsz: int):
    if descsz > MAX_DESC:
        raise ValueError(f"{descsz} bytes, over the {MAX_DESC}-byte limit")
    raw = bytes(img.buf[desc_at:desc_at + descsz]).rstrip(b"\0")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({type(exc).__name__})") from None


def _text(value, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{what} is not a string of at most {MAX_TEXT} characters")
    return value


def _decls(doc) -> list[DlopenDecl]:
    if not isinstance(doc, list):
        raise ValueError("is not a JSON array")
    out = []
    for entry in doc:
        if not isinstance(entry, dict):
            raise ValueError("holds an entry that is not an object")
        names = entry.get("soname")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and 0 < len(n) <= MAX_TEXT
                                                                for n in names):
            raise ValueError("holds an entry without a list of sonames")
        out.append(DlopenDecl(tuple(names), _text(entry.get("feature"), "feature"),
                              _text(entry.get("description"), "description"), _text(entry.get("priority"), "priority")))
    return out


def _package(doc) -> dict:
    if not isinstance(doc, dict):
        raise ValueError("is not a JSON object")
    for k, v in doc.items():
        if len(k) > MAX_TEXT or not isinstance(v, (str, int, float, bool)) or (isinstance(v, str) and len(v) > MAX_TEXT):
            raise ValueError(f"key {k[:40]!r} holds a value that is not a short string, number or boolean")
    return doc


def read_notes(img: ElfImage) -> ElfNotes:
    """The file's package note and declared dlopen libraries (empty when it has none)."""
    notes = ElfNotes()
    seen: set[int] = set()
    for off, size in _places(img):
        if off + size > img.size:  # a section table entry past the end: the reader says so elsewhere
            continue
        for at, owner, ntype, desc_at, descsz in each_note(img, off, size):
            if owner != OWNER or ntype not in (NT_FDO_PACKAGING_METADATA, NT_FDO_DLOPEN_METADATA):
                continue
            if at in seen:  # the same note through its section and its segment
                continue
            seen.add(at)
            if ntype == NT_FDO_DLOPEN_METADATA:
                try:
                    notes.dlopen += _decls(_json(img, desc_at, descsz))
                except ValueError as exc:
                    raise Malformed(f".note.dlopen at {at:#x} cannot be read: {exc}") from None
                if sum(len(d.sonames) for d in notes.dlopen) > MAX_DECLARED:
                    raise Malformed(f".note.dlopen declares more than {MAX_DECLARED} libraries")
            elif notes.package is None:
                try:
                    notes.package = _package(_json(img, desc_at, descsz))
                except ValueError as exc:
                    notes.warnings.append(f".note.package at {at:#x} cannot be read ({exc}): the file's package "
                                          "is not named")
    return notes

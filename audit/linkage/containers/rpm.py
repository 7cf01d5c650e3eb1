"""RPM packages (v3/v4) as a stream of the files they install, read as a tar's members are; and
plain cpio archives of the newc format their payload uses (cpio_members).

    for info, data in rpm_members(fh, size, ratio, total_bytes):   # (tarfile.TarInfo, stream)

A package is a 96-byte lead, a signature header (padded to 8 bytes), the main header, then the
payload: a cpio archive ("newc") compressed with gzip, xz, lzma, bzip2 or zstd, or not at all.
Only the main header's payload tags are read (what the payload is); every count and length is
checked against the file before it is used, and the payload inflates no further than a tar's
stream may (tars.py). A package that is damaged, truncated or of a payload this cannot read is an
InputError naming why: never a pass. Members come as tars.tar_members gives a tar's (TarInfo
with name and size, and a stream of its data), so the inputs read both alike; names are checked
there (safe_member), as a tar's are.
"""

from __future__ import annotations

import re
import struct
import tarfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from audit.binformat import RPM_MAGIC
from audit.errors import InputError, printable
from audit.linkage.containers.compressed import compression, inflation_limit, is_stream_error, open_reader
from audit.linkage.containers.tars import _Bounded

LEAD_BYTES = 96
_HEADER_MAGIC = b"\x8e\xad\xe8\x01"  # a header structure, version 1
_MAX_TAGS = 100_000  # tags of one header (real ones hold a few hundred)
_MAX_STORE = 256 << 20  # one header's data store
_STRING = 6  # RPM_STRING_TYPE
_PAYLOADFORMAT, _PAYLOADCOMPRESSOR = 1124, 1125
_MAX_MEMBERS = 200_000  # as a tar's
_MAX_NAME = 65_536  # a cpio member's name, NUL included (PATH_MAX is 4096)
_CPIO_MAGIC = (b"070701", b"070702")  # newc, and newc with a checksum: one layout
_HEX = re.compile(rb"[0-9A-Fa-f]{104}")  # a newc header's 13 fields; int() alone would take " +1_f"
_S_IFMT, _S_IFREG = 0o170000, 0o100000


def rpm_members(fh: BinaryIO, size: int, ratio: float, total_bytes: int) -> Iterator[tuple[tarfile.TarInfo, _Data]]:
    """(TarInfo, its data stream) of each regular file the RPM read from `fh` (of `size` bytes)
    installs, in payload order; a hard link's earlier names (no data of their own) and symlinks
    are not given. The payload is bounded as a tar's stream: the smaller of `total_bytes`
    (--max-archive-size) and `ratio` times its compressed size, never below 64 MiB; 200,000
    members. Raises InputError for a package that cannot be read or passes a limit."""
    start, tags = _payload_start(fh, size)
    fmt = tags.get(_PAYLOADFORMAT, "cpio")
    if fmt != "cpio":  # a delta rpm's payload ("drpm") is not the files
        raise InputError(f"RPM package: payload format '{printable(fmt)}' not audited (only cpio is read)")
    fh.seek(start)
    magic = fh.read(10)
    fh.seek(start)
    compressed = size - start
    if not magic:
        raise InputError("truncated RPM package: no payload after its headers")
    how, open_payload = _compression(magic, tags.get(_PAYLOADCOMPRESSOR))
    if open_payload is None:  # read in place: the file's size bounds it
        limit, raw = compressed, fh
    else:
        limit, why = inflation_limit("RPM payload", compressed, ratio, total_bytes)
        try:
            raw = _Bounded(open_payload(fh), limit, why)
        except Exception as exc:  # a decompressor that reads its header at once
            raise _read_error(exc, how) from None
    yield from _cpio(_Payload(raw, how), limit)


def cpio_members(fh: BinaryIO, size: int, ratio: float = 0.0, total_bytes: int = 0) -> Iterator[tuple[tarfile.TarInfo, _Data]]:
    """(TarInfo, its data stream) of each regular file of a cpio archive in the newc format (an
    initramfs, a cpio made by `cpio -H newc` or `bsdtar --format newc`), read in place: its size
    bounds it. The same reader as an RPM's payload (same signature as tar_members; a compressed
    one is a file compressed on its own, read first by compressed.py)."""
    fh.seek(0)
    yield from _cpio(_Payload(fh, "uncompressed", "cpio archive"), size)


def _payload_start(fh: BinaryIO, size: int) -> tuple[int, dict[int, str]]:
    """Where the payload starts, and the main header's payload tags."""
    fh.seek(0)
    lead = fh.read(LEAD_BYTES)
    if lead[:4] != RPM_MAGIC:
        raise InputError("not an RPM package: no lead")
    if len(lead) < LEAD_BYTES:
        raise InputError(f"truncated RPM package: {size} bytes, shorter than its {LEAD_BYTES}-byte lead")
    end, _ = _header(fh, LEAD_BYTES, size, "signature header", ())
    end += -end % 8  # the signature header is padded to 8 bytes; the main header is not
    end, tags = _header(fh, end, size, "header", (_PAYLOADFORMAT, _PAYLOADCOMPRESSOR))
    return end, tags


_NAME, _VERSION, _RELEASE, _ARCH = 1000, 1001, 1002, 1022


def package_tags(fh: BinaryIO, size: int) -> dict[str, str]:
    """What the package says it is: name, version, release and arch from its main header (for an
    SBOM; raises InputError as rpm_members does for a package it cannot read)."""
    fh.seek(0)
    lead = fh.read(LEAD_BYTES)
    if lead[:4] != RPM_MAGIC or len(lead) < LEAD_BYTES:
        raise InputError("not an RPM package")
    end, _ = _header(fh, LEAD_BYTES, size, "signature header", ())
    end += -end % 8
    _, tags = _header(fh, end, size, "header", (_NAME, _VERSION, _RELEASE, _ARCH))
    return {key: tags[tag] for key, tag in (("name", _NAME), ("version", _VERSION), ("release", _RELEASE),
                                              ("arch", _ARCH)) if tag in tags}


def _header(fh: BinaryIO, at: int, size: int, what: str, wanted: tuple[int, ...]) -> tuple[int, dict[int, str]]:
    """The header structure at `at`: where it ends, and the string tags of `wanted` it holds.
    Only the index is read whole (16 bytes a tag, capped); a wanted string is read from its
    offset in the data store, never the store itself."""
    fh.seek(at)
    intro = fh.read(16)
    if len(intro) < 16:
        raise InputError(f"truncated RPM package: it ends inside its {what} (at byte {size})")
    if intro[:4] != _HEADER_MAGIC:
        raise InputError(f"malformed RPM package: no {what} at byte {at}")
    count, store = struct.unpack_from(">II", intro, 8)
    if count > _MAX_TAGS or store > _MAX_STORE:
        raise InputError(f"malformed RPM package: its {what} declares {count} tags and {store} bytes "
                         f"(limits {_MAX_TAGS} and {_MAX_STORE})")
    data_at = at + 16 + 16 * count
    if data_at + store > size:
        raise InputError(f"truncated RPM package: its {what} declares {16 + 16 * count + store} bytes, "
                         f"past the file's end ({size - at} bytes left)")
    index = fh.read(16 * count)
    tags: dict[int, str] = {}
    for tag, kind, offset, _n in struct.iter_unpack(">IIII", index):
        if tag not in wanted:
            continue
        if kind != _STRING or offset >= store:
            raise InputError(f"malformed RPM package: tag {tag} of its {what} is not a string in its data")
        fh.seek(data_at + offset)
        value, nul, _ = fh.read(min(256, store - offset)).partition(b"\0")
        if not nul:
            raise InputError(f"malformed RPM package: tag {tag} of its {what} is not a string in its data")
        tags[tag] = value.decode("utf-8", "surrogateescape")  # printable() shows a stray byte as \xNN
    return data_at + store, tags


def _compression(magic: bytes, named: str | None) -> tuple[str, Callable | None]:
    """The payload's compression (its name, how it is opened; None: not compressed), from its
    first bytes; InputError naming the header's compressor where they match none known."""
    if magic.startswith(b"07070"):  # a cpio archive as it is (_cpio refuses all but newc)
        return "uncompressed", None
    # lzma ("alone") has no magic of its own: its properties byte (0x5d for every preset) then a
    # little-endian dictionary size, or the header tag names it
    how = compression(magic) or ("lzma" if named == "lzma" or magic.startswith(b"\x5d\0\0") else None)
    if how is not None:
        return how, lambda fh: open_reader(how, fh)
    raise InputError(f"RPM package: payload compressed with {printable(named or 'an unknown method')} "
                     f"(first bytes {magic.hex()}) not audited")


def _read_error(exc: BaseException, how: str) -> BaseException:
    """InputError for what a decompressor raises on damaged data (zstandard's, lzma's and bz2's
    own included); anything else (a bug) is raised as it is."""
    if isinstance(exc, InputError):
        return exc
    if is_stream_error(exc):
        text = " ".join(str(exc).split()) or type(exc).__name__
        return InputError(f"{'truncated' if isinstance(exc, EOFError) else 'cannot read'} RPM payload ({how}): {text}")
    return exc


class _Payload:
    """The payload's cpio bytes, decompressed, read exactly: a read ends short only at the
    stream's end, and a decompressor's error is an InputError."""

    def __init__(self, raw: BinaryIO | _Bounded, how: str, label: str = "RPM payload"):
        self.raw, self.how, self.at, self.label = raw, how, 0, label

    def read(self, n: int) -> bytes:
        parts, left = [], n
        while left > 0:
            try:
                chunk = self.raw.read(min(left, 1 << 20))
            except Exception as exc:  # noqa: BLE001  mapped, or raised as it is
                raise _read_error(exc, self.how) from None
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        data = b"".join(parts)
        self.at += len(data)
        return data

    def exact(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) < n:
            raise InputError(f"truncated {self.label}: it ends inside {what}")
        return data


class _Data:
    """One member's data: `size` bytes of the payload, read as tarfile's extractfile() gives
    a tar member's (read(n) until b"")."""

    def __init__(self, payload: _Payload, size: int, name: str):
        self.payload, self.left, self.name = payload, size, name

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.payload.exact(n, f"member {printable(self.name)}")
        self.left -= n
        return data

    def skip(self) -> None:
        while self.left:
            self.read(1 << 20)


def _cpio(payload: _Payload, limit: int) -> Iterator[tuple[tarfile.TarInfo, _Data]]:
    """The regular files of a newc cpio archive, up to its TRAILER!!! member."""
    for n in range(_MAX_MEMBERS + 1):
        if n == _MAX_MEMBERS:
            raise InputError(f"{payload.label} has more than {_MAX_MEMBERS} members")
        header = payload.exact(110, "a member's header")
        if header[:6] == b"07070X":  # rpm >= 4.12 with a file of 4 GiB or more: names live in the header
            raise InputError(f"{payload.label}: format 'stripped cpio' (07070X, files of 4 GiB or more) "
                             "not audited")
        if header[:6] not in _CPIO_MAGIC or not _HEX.fullmatch(header, 6):
            raise InputError(f"{payload.label}: not a cpio (newc) archive at byte {payload.at - 110} "
                             f"(its header starts '{printable(header[:6].decode('latin-1'))}')")
        _ino, mode, _uid, _gid, nlink, _mtime, size, *_dev, namesize, _check = (
            int(header[at:at + 8], 16) for at in range(6, 110, 8))
        if not 1 <= namesize <= _MAX_NAME:
            raise InputError(f"{payload.label}: a member's name declares {namesize} bytes")
        raw = payload.exact(namesize, "a member's name")
        payload.exact(-(110 + namesize) % 4, "a member's name")
        if raw[-1:] != b"\0":
            raise InputError(f"{payload.label}: a member's name does not end in NUL")
        name = raw[:-1].decode("utf-8", "surrogateescape")  # as tarfile decodes a tar's names
        if name == "TRAILER!!!":  # read on to the stream's end: a damaged or cut one is not passed
            while payload.read(1 << 20):
                pass
            return
        if payload.at + size > limit:  # checked before it is stepped over, as a tar's members are
            if payload.how == "uncompressed":  # read in place: past the file's end is a cut file
                raise InputError(f"truncated {payload.label}: member {printable(name)} declares {size} bytes, "
                                 f"past its end ({limit} bytes)")
            raise InputError(f"{payload.label}: member {printable(name)} declares {size} bytes, past what "
                             f"it may unpack to ({limit} bytes)")
        data = _Data(payload, size, name)
        # a hard link's data comes with its last name; the earlier ones are empty and found by name
        if mode & _S_IFMT == _S_IFREG and (size or nlink <= 1):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.type = size, mode & 0o7777, tarfile.REGTYPE
            yield info, data
        data.skip()
        payload.exact(-size % 4, f"member {printable(name)}")

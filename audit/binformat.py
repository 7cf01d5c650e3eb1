"""What kind of binary a file is, from its first bytes: the formats the audit reads (ELF, PE,
Mach-O, COFF, static archives) and the native or device-code formats and archives it does not
read yet (a 7-Zip or cpio archive, ...), which must never be skipped as if they were data.
Zip archives, Debian and RPM packages are containers the inputs open (is_zip, is_deb, is_rpm).

    kind = identify(first_bytes, size)   # first_bytes: at least HEAD_BYTES of the file, or all of it

Only consistent headers count: a text file that happens to start with two bytes of a COFF
machine number is not an object file.
"""

from __future__ import annotations

import struct
from enum import Enum

HEAD_BYTES = 4096  # enough to see a PE header (e_lfanew is 0x40..0x200 in practice) and any magic


class Kind(Enum):
    """A file's format; the value is how a report names it."""

    ELF = "ELF"
    PE_EXECUTABLE = "PE/COFF executable (Windows)"
    PE_DLL = "PE/COFF DLL (Windows)"
    COFF_OBJECT = "COFF object (Windows)"
    MACHO = "Mach-O (macOS)"
    MACHO_FAT = "Mach-O universal binary (macOS)"
    STATIC_ARCHIVE = "static archive (ar)"
    CLANG_OFFLOAD_BUNDLE = "clang offload bundle"
    CLANG_OFFLOAD_BUNDLE_COMPRESSED = "compressed clang offload bundle (CCOB)"
    NVIDIA_FATBIN = "NVIDIA fatbin"
    # a container the inputs open (is_rpm); still a binary, so that where one is not opened (a
    # static archive's member) it is an error, never data, as a .deb is there (an ar archive)
    RPM_PACKAGE = "RPM package"
    # archives the audit cannot open yet: they may hold binaries, so never data
    SEVEN_ZIP = "7-Zip archive"
    CABINET = "Microsoft cabinet archive"
    CPIO = "cpio archive"
    SQUASHFS = "squashfs image"
    XAR = "xar archive (macOS installer package)"
    NOT_BINARY = "not a binary"

    @property
    def binary(self) -> bool:
        return self is not Kind.NOT_BINARY


_MACHO = (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe")
# IMAGE_FILE_MACHINE_*: i386, amd64, arm64, arm, armnt, arm64ec, ia64
_COFF_MACHINES = frozenset((0x14C, 0x8664, 0xAA64, 0x1C0, 0x1C4, 0xA641, 0x200))
_IMAGE_FILE_DLL = 0x2000
_MAX_FAT_ARCHS = 20  # as `file`: a Java class file has version >= 45 where a fat header has its count


# A zip archive (a wheel, a jar, an egg) is a container, not a binary: the inputs open it and
# audit its members. Its first bytes: a local file header, or an empty archive's end record.
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def is_zip(head: bytes) -> bool:
    return head[:4] in ZIP_MAGIC


def is_deb(head: bytes) -> bool:
    """A Debian package: an ar archive whose first member is `debian-binary` (a container: its
    data.tar is opened, not linked in as a static archive's objects are)."""
    return head[:8] == b"!<arch>\n" and head[8:24].rstrip(b" /") == b"debian-binary"


RPM_MAGIC = b"\xed\xab\xee\xdb"  # an RPM package's lead


def is_rpm(head: bytes) -> bool:
    """An RPM package (a container: the files its payload installs are opened,
    audit/linkage/containers/rpm.py)."""
    return head[:4] == RPM_MAGIC


def is_newc_cpio(head: bytes) -> bool:
    """A cpio archive in the newc format (an initramfs; an RPM's payload's format): a container
    the inputs open (rpm.cpio_members). The old binary and odc cpio formats stay Kind.CPIO, an error."""
    return head[:6] in (b"070701", b"070702")


def identify(head: bytes, size: int | None = None) -> Kind:
    """The kind of a file whose first bytes are `head` (HEAD_BYTES of them, or the whole file)
    and whose size is `size` (None: len(head))."""
    size = len(head) if size is None else size
    if head[:4] == b"\x7fELF":
        return Kind.ELF
    if head[:8] in (b"!<arch>\n", b"!<thin>\n"):
        return Kind.STATIC_ARCHIVE
    if head[:4] in _MACHO:
        return Kind.MACHO
    if head[:4] in (b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf", b"\xbe\xba\xfe\xca") and len(head) >= 8:
        order = "<" if head[:4] == b"\xbe\xba\xfe\xca" else ">"
        count = struct.unpack_from(order + "I", head, 4)[0]
        return Kind.MACHO_FAT if 0 < count < _MAX_FAT_ARCHS else Kind.NOT_BINARY
    if head[:24] == b"__CLANG_OFFLOAD_BUNDLE__":
        return Kind.CLANG_OFFLOAD_BUNDLE
    if head[:4] == b"CCOB" and len(head) >= 8:
        version, method = struct.unpack_from("<HH", head, 4)
        if version in (1, 2, 3) and method in (0, 1):  # zlib or zstd
            return Kind.CLANG_OFFLOAD_BUNDLE_COMPRESSED
    if head[:4] == b"\x50\xed\x55\xba":  # 0xBA55ED50, little-endian
        return Kind.NVIDIA_FATBIN
    if is_rpm(head):
        return Kind.RPM_PACKAGE
    archive = _opaque_archive(head)
    if archive is not None:
        return archive
    if head[:2] == b"MZ":
        return _pe(head)
    if head[:4] == b"\0\0\xff\xff":
        return _anon_object(head, size)
    return _coff_object(head, size)


_OPAQUE = ((b"7z\xbc\xaf\x27\x1c", Kind.SEVEN_ZIP),
           (b"MSCF\0\0\0\0", Kind.CABINET), (b"070701", Kind.CPIO),
           (b"070702", Kind.CPIO), (b"070707", Kind.CPIO), (b"hsqs", Kind.SQUASHFS), (b"sqsh", Kind.SQUASHFS),
           (b"xar!\x00\x1c", Kind.XAR))


def _opaque_archive(head: bytes) -> Kind | None:
    """An archive format whose members the audit cannot list yet, by its magic."""
    return next((kind for magic, kind in _OPAQUE if head.startswith(magic)), None)


def _anon_object(head: bytes, size: int) -> Kind:
    """IMAGE_FILE_MACHINE_UNKNOWN then 0xFFFF: a short import object (an import library's
    member: version 0, a machine, then its names' length) or an MSVC "anonymous" object (a
    bigobj object, or a /GL object of compiler IL: version 1 or more, a class id)."""
    if len(head) < 20:
        return Kind.NOT_BINARY
    version, machine, _stamp, length = struct.unpack_from("<HHII", head, 4)
    if version == 0:
        return Kind.COFF_OBJECT if machine in _COFF_MACHINES and 20 + length <= size else Kind.NOT_BINARY
    return Kind.COFF_OBJECT if machine in _COFF_MACHINES and size >= 56 else Kind.NOT_BINARY


def _pe(head: bytes) -> Kind:
    if len(head) < 0x40:
        return Kind.NOT_BINARY
    at = struct.unpack_from("<I", head, 0x3C)[0]
    if at < 0x40 or at + 24 > len(head) or head[at:at + 4] != b"PE\0\0":
        return Kind.NOT_BINARY
    characteristics = struct.unpack_from("<H", head, at + 22)[0]
    return Kind.PE_DLL if characteristics & _IMAGE_FILE_DLL else Kind.PE_EXECUTABLE


def _coff_object(head: bytes, size: int) -> Kind:
    """A COFF object file has no magic, only a machine number: every other header field must
    agree with the file's size before it is believed."""
    if len(head) < 20:
        return Kind.NOT_BINARY
    machine, sections, _stamp, symtab, symbols, optional, _flags = struct.unpack_from("<HHIIIHH", head, 0)
    if machine not in _COFF_MACHINES or not 0 < sections <= 0xFEFF or optional != 0:
        return Kind.NOT_BINARY
    headers_end = 20 + 40 * sections
    if headers_end > size:
        return Kind.NOT_BINARY
    if symbols == 0:
        if symtab != 0:
            return Kind.NOT_BINARY
    elif symtab < headers_end or symtab + 18 * symbols > size:
        return Kind.NOT_BINARY
    # each section header seen: its raw data lies inside the file
    for k in range(sections):
        at = 20 + 40 * k
        if at + 40 > len(head):
            break
        raw_size, raw_at = struct.unpack_from("<II", head, at + 16)
        if raw_size and raw_at and (raw_at < headers_end or raw_at + raw_size > size):  # MSVC's .bss: no data, at 0
            return Kind.NOT_BINARY
    return Kind.COFF_OBJECT

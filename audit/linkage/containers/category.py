"""What an archive member needs, from its first bytes and its name: one answer for every
container (wheels and other zips, tarballs, cpio archives, Debian, RPM and conda packages), so none skips as data what
another reads."""

from __future__ import annotations

from audit.binformat import Kind, identify, is_deb, is_newc_cpio, is_rpm, is_zip
from audit.linkage.containers.compressed import compression
from audit.linkage.containers.image import looks_like_tar
from audit.linkage.resolution.native import AUDITED
from audit.python_source.reader import is_python_source

COMPRESSED_TAR = (".tar.gz", ".tgz", ".tar.zst", ".tar.xz")  # an image must be an uncompressed tar

# the categories that are written out and read (a Kind is a binary the audit does not read: an error)
READ = ("binary", "python", "static", "zip", "tar", "deb", "rpm", "cpio", "compressed")


def member_category(head: bytes, size: int, name: str) -> str | Kind | None:
    """What a member whose first bytes are `head` needs: "binary", "static", "deb", "rpm", "cpio",
    "zip", "tar", "python" (read if it calls a loader), "compressed" (a file compressed on its own), the
    Kind of a binary the audit does not read (an error), or None (data)."""
    kind = identify(head, size)
    if kind in AUDITED:
        return "binary"
    if is_deb(head):
        return "deb"
    if is_rpm(head):  # before kind.binary: identify() names it, for where it is not opened
        return "rpm"
    if is_newc_cpio(head):  # likewise (Kind.CPIO)
        return "cpio"
    if kind is Kind.STATIC_ARCHIVE:
        return "static"
    if kind.binary:
        return kind
    if is_zip(head):
        return "zip"
    if looks_like_tar(head) or name.endswith(COMPRESSED_TAR):
        return "tar"
    if compression(head):  # libx.so.gz: decompressed, then read as what it holds (compressed.py)
        return "compressed"
    return "python" if is_python_source(name) else None

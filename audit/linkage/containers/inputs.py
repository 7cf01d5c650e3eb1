"""The inputs of `check`: PATH arguments expanded into ELF files (files, directory trees, wheels,
conda packages (conda.py), RPM packages (rpm.py), container images (image.py, layers.py), and the
object files of the static archives named or met in any of them (static_archive.py)).

Nothing here judges a file; a member that cannot be read becomes an Input with an error.
"""

from __future__ import annotations

import hashlib
import lzma
import mmap
import os
import posixpath
import re
import shutil
import stat
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field, replace

from audit.binformat import HEAD_BYTES, Kind, identify, is_deb, is_newc_cpio, is_rpm, is_zip
from audit.errors import InputError
from audit.linkage.containers.category import COMPRESSED_TAR, READ, member_category
from audit.linkage.containers.compressed import RATIO_FLOOR, compression, decompress, inner_name, peek
from audit.linkage.containers.conda import _package_tar, extract_conda, is_conda
from audit.linkage.containers.conda import _safe as _conda_safe
from audit.linkage.resolution.fs import HOST, ConfinedFS, FileSystem
from audit.linkage.model import WHEEL_SEP
from audit.linkage.resolution.native import AUDITED, read_binary
from audit.linkage.parallel import cpu_count, map_ordered
from audit.linkage.containers.identity import Container, PackageId, container, dpkg_owners, owner_of
from audit.linkage.containers.image import Image, is_oci_dir, looks_like_tar, open_image, tar_kind
from audit.linkage.resolution.ldso import Member, MemberSet, ResolveOptions
from audit.linkage.containers.rpm import cpio_members, rpm_members
from audit.linkage.containers.static_archive import ArMember, read_members
from audit.linkage.containers.tars import safe_member, tar_members, tar_read_error
from audit.python_source.reader import is_python_source, stream_may_load

_MAX_WHEEL_MEMBERS = 200_000
MAX_ZIP_DEPTH = 4  # zip archives inside zip archives (a jar in a wheel, a jar in a jar), read this deep
MAX_NESTED_ZIPS = 4096  # and this many in one run (pyspark's wheel holds ~250 jars)
_PARALLEL_UNPACK_BYTES = 16 << 20  # compressed bytes below which one process unpacks a wheel
# Members smaller than this may compress as well as they like: they cannot fill a disk, and real
# ones do (cuDNN 9's libcudnn_engines_tensor_ir.so.9: 2 MB at 327:1).


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may unpack to before it is refused (exit 3, one line per member): an
    upload of a few hundred MB must not fill a CI runner's disk or memory. Members are streamed
    to disk, never held whole in memory. `check --max-member-size/--max-member-ratio/
    --max-archive-size` set them (docs/ci.md)."""

    member_bytes: int = 4 << 30  # one ELF member, uncompressed
    ratio: float = 100.0  # uncompressed / compressed, for members of 64 MiB or more
    total_bytes: int = 16 << 30  # all ELF members of one archive, uncompressed

    def refuse_in(self, size: int, total: int, what: str) -> tuple[str | None, int]:
        """A member of a stream (a tar's; no compressed size of its own): why it is refused (its
        size, or `total` of `what` with it past --max-archive-size), or None; and the total with it."""
        total += size
        why = self.refuse(size, size)
        if why is None and total > self.total_bytes:
            why = f"{what} unpack to more than {self.total_bytes} bytes (--max-archive-size)"
        return why, total

    def refuse(self, size: int, compressed: int) -> str | None:
        """Why a member of this declared size is refused, or None."""
        if size > self.member_bytes:
            return f"member unpacks to {size} bytes, over the {self.member_bytes}-byte limit (--max-member-size)"
        if size >= RATIO_FLOOR and size > self.ratio * max(compressed, 1):
            return (f"member compressed {size / max(compressed, 1):.0f}:1, over the {self.ratio:g}:1 limit "
                    "(--max-member-ratio)")
        return None


@dataclass(eq=False)  # hashed by identity: one resolver per scope
class Scope:
    """Where an input's libraries are searched when not just as the command line says: a
    container image's own filesystem and environment, or a conda package's prefix."""

    fs: FileSystem = HOST
    own_system: bool = False  # an image: --root, --ldpath and --use-env describe this machine, not it
    env_path: str | None = None  # LD_LIBRARY_PATH of the image's config
    env_preload: str | None = None  # LD_PRELOAD of the image's config: loaded into every process
    fallback: list[tuple[str, str]] = field(default_factory=list)

    def options(self, base: ResolveOptions) -> ResolveOptions:
        if self.own_system:
            return replace(ResolveOptions(), use_env=self.env_path is not None or self.env_preload is not None,
                           ld_library_path=self.env_path, ld_preload=self.env_preload,
                           fallback=list(self.fallback), max_nodes=base.max_nodes)
        return replace(base, fallback=base.fallback + self.fallback)


@dataclass
class Input:
    shown: str  # the path as reported: a path given or found, or "x.whl!/pkg/lib.so"
    read_from: str | None  # where to read it (None: the error is already known)
    explicit: bool  # named on the command line (a non-ELF file is then an error, not a skip)
    error: str | None = None
    members: MemberSet | None = None  # the wheel or folder it came from (the resolver's fallback)
    scope: Scope | None = None  # None: resolved on this machine, as the options say
    layer: dict | None = None  # in an image: the layer that added the file
    archive: str | None = None  # the wheel, conda package or image it is a member of, as given or found
    package: PackageId | None = None  # in an image: the Debian package dpkg's records say owns it


class Inputs:
    """Expands PATH arguments into ELF files: files, directory trees, wheels, conda packages, images."""

    def __init__(self, conda_prefix: str | None = None, limits: ArchiveLimits | None = None,
                 jobs: int | None = None, identify: bool = False):
        self.identify = identify  # record each container's digest and package (identity.py), for an SBOM
        self.containers: dict[str, Container] = {}  # by the name reports give it
        self.conda_prefix = conda_prefix  # a conda environment the packages' libraries resolve against
        self.limits = limits or ArchiveLimits()
        self.jobs = jobs  # processes that unpack an archive (None: one per core)
        self.skipped: dict[str, int] = {}
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self._real_folders: dict[str, str] = {}  # folder -> its realpath (_real)
        self.tmpdirs: list[tempfile.TemporaryDirectory] = []
        self.images: list[Image] = []
        self.labels: list[tuple[str, str]] = []  # (extraction folder, the wheel/package as reported)
        self._archives: str | None = None  # the folder static archives' members are written to
        self._zip_depth = 0  # how deep in zip archives inside archives the member being read lies
        self._nested_bytes = 0  # what zip archives inside archives unpacked to, in all
        self._nested_count = 0  # how many zip archives inside archives were opened
        self._under: str | None = None  # where a zip archive's members are unpacked (None: a temporary folder)
        self.archive_count = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def static_archive(self, report: str, data, layer: dict | None = None, explicit: bool = False):
        """The members of a static archive whose bytes are `data` (bytes, or an mmap of it), as
        inputs: each object file a build links in (ELF, COFF or Mach-O) is written to a folder of
        its own and audited as `ARCHIVE!/member`; the short import objects of an import library
        (MSVC, llvm-lib: each names a DLL and one symbol) are written one after another, one
        file per member name (the DLL's: an import library holds thousands), and audited as
        one; a binary of another format is an error, as elsewhere; other members (text) are
        skipped. A malformed or thin archive is one error; one with no binary member is an
        error when named (nothing in it was read), else counted and warned about."""
        try:
            found = read_members(data, report)
        except InputError as exc:
            yield Input(report, None, True, exc.message)
            return
        if self.identify:
            self.containers[report] = Container(report, "static-archive", hashlib.sha256(data).hexdigest(), len(data))
        kinds = [identify(bytes(data[m.offset:m.offset + min(m.size, HEAD_BYTES)]), m.size) for m in found]
        if not any(k.binary for k in kinds):
            if explicit:
                yield Input(report, None, True, "static archive (ar) with no object file in it: nothing to audit")
            else:
                self.skip("archive")
                self.warnings.append(f"{report}: static archive (ar) with no object file in it, nothing audited")
            return
        tmp = self._archive_tmp()
        self.archive_count += 1
        folders: list[tuple[str, set[str], set[str]]] = []  # each folder, its files and subfolders
        total = 0
        imports: dict[str, list[ArMember]] = {}  # short import objects by member name
        for m, kind in zip(found, kinds):
            shown = f"{report}{WHEEL_SEP}{m.name.lstrip('/')}"
            if kind not in _OBJECT_KINDS:
                if kind.binary:
                    yield Input(shown, None, True, not_audited(kind), layer=layer)
                elif _damaged_coff(bytes(data[m.offset:m.offset + 20])):
                    yield Input(shown, None, True, "malformed COFF object: its headers do not fit in the member's "
                                f"{m.size} bytes (truncated or damaged)", layer=layer)
                else:
                    self.skip("non_elf")
                continue
            why = self.limits.refuse(m.size, m.size)
            total += m.size
            if why is None and total > self.limits.total_bytes:
                why = f"the archive's object members hold more than {self.limits.total_bytes} bytes (--max-archive-size)"
            if why:
                yield Input(shown, None, True, why, layer=layer)
                continue
            if kind is Kind.COFF_OBJECT and _short_import(data, m):
                imports.setdefault(m.name, []).append(m)
                continue
            yield from self._archive_member(tmp, report, m.name, [m], data, folders, layer)
        # written as NAME.imports: the member is named after the DLL it imports from, which
        # must not resolve to the member itself
        for name, parts in imports.items():
            yield from self._archive_member(tmp, report, name, parts, data, folders, layer, ".imports")

    def _archive_member(self, tmp: str, report: str, name: str, parts: list, data, folders: list, layer,
                        suffix: str = ""):
        """One input: the bytes of `parts` (members of the archive) written one after another."""
        shown = f"{report}{WHEEL_SEP}{name.lstrip('/')}"
        dest = self._archive_dest(tmp, report, name + suffix, folders)
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "xb") as out:
                for m in parts:
                    for at in range(m.offset, m.offset + m.size, 1 << 20):
                        out.write(data[at:min(at + (1 << 20), m.offset + m.size)])
        except OSError as exc:
            yield Input(shown, None, True, f"cannot unpack member: {exc.strerror or exc}", layer=layer)
            return
        self.seen.add(self._real(dest))
        yield Input(shown, dest, True, layer=layer)

    def _archive_tmp(self) -> str:
        if self._archives is None:
            tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-ar-")
            self.tmpdirs.append(tmp)
            self._archives = tmp.name
        return self._archives

    def _archive_dest(self, tmp: str, report: str, name: str, folders: list) -> str:
        """Where a member is written: `FOLDER/name` (its stored path, when that is a safe
        relative one; else `member`), in the first folder of this archive where that name is
        free (an archive may hold two members of one name). Each folder is labelled with the
        archive: a message about `FOLDER/x.o` reads `ARCHIVE!/x.o`."""
        parts = name.lstrip("/").split("/")
        if any(p in ("", ".", "..") or len(os.fsencode(p)) > 255 for p in parts):
            parts = ["member"]
        rel = "/".join(parts)
        dirs = {"/".join(parts[:i]) for i in range(1, len(parts))}
        for folder, files, subdirs in folders:
            if rel not in files and rel not in subdirs and not dirs & files:
                break
        else:  # fixed width: no folder's name is the start of another's
            folder, files, subdirs = os.path.join(tmp, f"{self.archive_count:06d}-{len(folders):06d}"), set(), set()
            folders.append((folder, files, subdirs))
            for label in dict.fromkeys((folder, os.path.realpath(folder))):
                self.labels.append((label, report))
        files.add(rel)
        subdirs |= dirs
        return os.path.join(folder, *parts)

    def _archive_file(self, report: str, host: str, explicit: bool = False):
        """A static archive on this machine's file system: read in place (mapped)."""
        try:
            with open(host, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                yield from self.static_archive(report, mm, explicit=explicit)
        except (OSError, ValueError) as exc:
            yield Input(report, None, True, f"cannot read: {getattr(exc, 'strerror', None) or exc}")

    def expand_found(self, path: str):
        """A regular file met in a folder, read as the walk of a folder reads it (a tarball or
        compressed file with nothing to read is counted skipped, never an error)."""
        if path.endswith(".whl"):
            yield from _members_of(path, self._wheel(path, path))
        elif is_conda(path):
            yield from _members_of(path, self._conda(path, path))
        else:
            yield from self._file(path, path, explicit=False)

    def expand(self, arg: str):
        try:
            st = os.stat(arg)
        except OSError as exc:
            yield Input(arg, None, True, f"cannot read: {exc.strerror or exc}")
            return
        if stat.S_ISDIR(st.st_mode) and is_oci_dir(arg):
            yield from self._image(arg)
        elif stat.S_ISDIR(st.st_mode):
            yield from self._walk(arg)
        elif not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            yield Input(arg, None, True, "not a regular file")
        elif arg.endswith(".whl"):
            yield from _members_of(arg, self._wheel(arg, arg))
        elif is_conda(arg):
            yield from _members_of(arg, self._conda(arg, arg))
        elif _starts_as(arg, is_zip):  # a jar, egg, zip, ...: its members audited as a wheel's
            yield from _members_of(arg, self._wheel(arg, arg))
        elif _starts_as(arg, is_deb):  # a Debian package: its data.tar's members
            yield from _members_of(arg, self._deb(arg, arg))
        elif _starts_as(arg, is_rpm):  # an RPM package: its payload's members
            yield from _members_of(arg, self._rpm(arg, arg))
        elif _starts_as(arg, is_newc_cpio):  # a cpio archive (an initramfs): its members
            yield from _members_of(arg, self._cpio(arg, arg))
        elif arg.endswith(COMPRESSED_TAR):  # an sdist, a build's tarball (a compressed image: an error)
            yield from _members_of(arg, self._tar_files(arg, arg, "compressed_tar", explicit=True))
        elif _is_tar(arg):
            yield from (self._image(arg) if tar_kind(arg) == "image" else
                        _members_of(arg, self._tar_files(arg, arg, "tar", explicit=True)))
        else:
            yield from self._file(arg, arg, explicit=True)

    def _again(self, host: str) -> bool:
        """An archive already opened in this run (named twice, or a link to it in a folder)."""
        real = self._real(host)
        if real in self.seen:
            self.skip("duplicate")
            return True
        self.seen.add(real)
        return False

    def _image(self, arg: str):
        yield from _members_of(arg, self._image_files(arg))

    def _image_files(self, arg: str):
        if self._again(arg):
            return
        from audit.linkage.containers.layers import ImageTree

        try:
            image = open_image(arg)
            self.images.append(image)
            if self.identify:
                self.containers[arg] = container(arg, "image", image.config_digest)
            tree = ImageTree(image, self.limits.total_bytes, self.limits.ratio)
        except InputError as exc:
            yield Input(arg, None, True, exc.message)
            return
        except OSError as exc:
            yield Input(arg, None, True, f"cannot read image: {exc.strerror or exc}")
            return
        scope = Scope(tree, own_system=True, env_path=image.env.get("LD_LIBRARY_PATH"),
                      env_preload=image.env.get("LD_PRELOAD"))
        owners = dpkg_owners(tree) if self.identify else {}
        elf = tree.elf_files()
        # as for a wheel: a NEEDED ld.so would not find in the container falls back to the image's
        # own files by name (the node and a warning say so)
        members = MemberSet(arg, (Member(p, f"{arg}!{p}") for p in tree.names_of([p for p, _, _ in elf])))
        found = 0
        for path, entry, first in elf:
            if not first:
                self.skip("duplicate")  # a hard link to a file already audited
                continue
            found += 1
            # read whole into memory when audited: the same bound as an unpacked member
            why = self.limits.refuse(entry.size, entry.size)
            yield Input(f"{arg}!{path}", None if why else path, True, why, scope=scope,
                        layer=tree.layer_of(entry), members=members, package=owner_of(owners, path))
        for path, entry, kind in tree.other_binaries():
            found += 1
            if kind is Kind.STATIC_ARCHIVE:  # read whole into memory: the bound of an ELF file
                why = self.limits.refuse(entry.size, entry.size)
                if why is None:
                    yield from self.static_archive(f"{arg}!{path}", tree._bytes(entry), tree.layer_of(entry))
                    continue
                yield Input(f"{arg}!{path}", None, True, why, layer=tree.layer_of(entry))
                continue
            yield Input(f"{arg}!{path}", None, True, not_audited(kind), scope=scope, layer=tree.layer_of(entry))
        archives = tree.archives()  # jars, wheels, tarballs, .debs, .rpms: resolved among themselves
        peeked = tree.peek_compressed([e for _, e, k in archives if k == "compressed"], HEAD_BYTES)
        for path, entry, kind in archives:
            if kind == "compressed":  # libx.so.gz: read only where it holds something to read
                head = peeked[(entry.layer, entry.member)]
                category = None if isinstance(head, InputError) else member_category(head, len(head), inner_name(path))
                if isinstance(head, InputError) or isinstance(category, Kind):
                    found += 1
                    yield Input(f"{arg}!{path}", None, True, head.message if isinstance(head, InputError)
                                else not_audited(category), layer=tree.layer_of(entry))
                    continue
                if category is None:
                    self.skip("compressed_data")
                    continue
            found += 1
            why = self.limits.refuse(entry.size, entry.size)  # read whole into memory, as an ELF file is
            if why:
                yield Input(f"{arg}!{path}", None, True, why, layer=tree.layer_of(entry))
                continue
            yield from self._archive_in_image(f"{arg}!{path}", tree, entry, kind)
        for path, entry in tree.python_sources():  # Python files that call a library loader
            why = self.limits.refuse(entry.size, entry.size)
            yield Input(f"{arg}!{path}", None if why else path, True, why, scope=scope,
                        layer=tree.layer_of(entry), package=owner_of(owners, path))
        if not found:
            self.warnings.append(f"{arg}: the image holds no ELF file")

    def _archive_in_image(self, report: str, tree, entry, kind: str):
        """A zip archive (a jar, a wheel, a .conda package in a cache) or a tarball in an image,
        written out to a folder of its own and read as when met in a folder; its members resolve
        inside that folder only (ConfinedFS), never on this machine."""
        folder = tempfile.mkdtemp(prefix="archive-", dir=self._archive_tmp())
        conda = is_conda(report) and kind == "zip"
        suffix = next((s for s in COMPRESSED_TAR if report.endswith(s)), ".tar")
        name = "package.conda" if conda else "archive.zip" if kind == "zip" else "package.deb" if kind == "deb" \
            else "package.rpm" if kind == "rpm" else "archive.cpio" if kind == "cpio" \
            else "compressed" if kind == "compressed" else "archive" + suffix
        host = os.path.join(folder, name)
        with open(host, "wb") as fh:
            fh.write(tree._bytes(entry))
        scope = Scope(ConfinedFS(folder, read_binary), own_system=True)
        layer, before = tree.layer_of(entry), self._under
        self._under = folder
        read = self._conda if conda else self._wheel if kind == "zip" else self._deb if kind == "deb" else \
            self._rpm if kind == "rpm" else self._cpio if kind == "cpio" else \
            self._decompressed if kind == "compressed" else \
            (lambda r, h: self._tar_files(r, h, "compressed_tar" if h.endswith(COMPRESSED_TAR) else "tar"))
        try:
            for inp in read(report, host):
                inp.layer = layer
                if inp.read_from is not None and scope.fs.inside(inp.read_from):
                    inp.scope = scope
                yield inp
        finally:
            self._under = before

    def _real(self, host: str) -> str:
        """os.path.realpath(host), with each folder resolved once: a folder's tens of thousands of
        files would otherwise cost one lstat per path component each. Every key of `seen` is made
        here, so a file met twice (named, in a folder, through a link) is recognised alike."""
        folder, name = os.path.split(host)
        if name in ("", ".", "..") or os.path.islink(host):
            return os.path.realpath(host)
        real_folder = self._real_folders.get(folder)
        if real_folder is None:
            real_folder = self._real_folders[folder] = os.path.realpath(folder)
        return os.path.join(real_folder, name)

    def _file(self, report: str, host: str, explicit: bool):
        real = self._real(host)
        if real in self.seen:
            self.skip("duplicate")
            return
        try:
            head, size = _head(host)
        except OSError as exc:
            self.seen.add(real)
            yield Input(report, None, explicit, f"cannot read: {exc.strerror or exc}")
            return
        magic = head[:4]
        if not explicit and looks_like_tar(head):  # met in a folder (a named tar is opened as an image)
            yield from self._tar_in_folder(host)
            return
        if not explicit and is_zip(head) and not is_conda(host):  # a jar, egg, zip met in a folder
            yield from _members_of(report, self._wheel(report, host))
            return
        if not explicit and is_deb(head):  # a Debian package met in a folder
            yield from _members_of(report, self._deb(report, host))
            return
        if not explicit and is_rpm(head):  # an RPM package met in a folder
            yield from _members_of(report, self._rpm(report, host))
            return
        if not explicit and is_newc_cpio(head):  # a cpio archive met in a folder
            yield from _members_of(report, self._cpio(report, host))
            return
        self.seen.add(real)
        kind = identify(head, size)
        if not explicit and not kind.binary and host.endswith(COMPRESSED_TAR):
            # an sdist, or a tarball of a build: its members that need reading are audited
            self.seen.discard(real)
            yield from _members_of(report, self._tar_files(report, host, "compressed_tar"))
            return
        if not kind.binary and compression(head):  # libx.so.gz: what it inflates to is read
            self.seen.discard(real)
            yield from _members_of(report, self._decompressed(report, host, explicit))
            return
        if kind in AUDITED:  # ELF, PE (DLL, EXE, .pyd), Mach-O (thin or universal), COFF object
            yield Input(report, host, explicit)
        elif kind is Kind.STATIC_ARCHIVE:  # its object files are linked into a build: each is audited
            yield from _members_of(report, self._archive_file(report, host, explicit))
        elif kind.binary:  # a binary the audit cannot read yet must not pass as data
            yield Input(report, None, True, not_audited(kind))
        elif is_python_source(host):  # read where it calls a library loader (audit/python_source)
            yield from self._python_file(report, host, explicit)
        elif explicit:
            yield Input(report, None, True, "not an ELF file" + (" (empty)" if not magic else ""))
        else:
            self.skip("non_elf")

    def _python_file(self, report: str, host: str, explicit: bool):
        """A Python source: audited when named, or when its bytes hold a loader's name; else
        counted as skipped ("python_no_load")."""
        if not explicit:
            try:
                with open(host, "rb") as fh:
                    loads = stream_may_load(fh)
            except OSError as exc:
                yield Input(report, None, True, f"cannot read: {exc.strerror or exc}")
                return
            if not loads:
                self.skip("python_no_load")
                return
        yield Input(report, host, True)

    def _tar_in_folder(self, host: str):
        """A tar met in a folder: an image is audited as when named; another tar (a tarball of a
        build) has its members audited (_tar_files)."""
        if tar_kind(host) == "image":
            yield from self._image(host)
            return
        yield from _members_of(host, self._tar_files(host, host, "tar"))

    def _deb(self, report: str, host: str):
        """A Debian package (`ar`: debian-binary, control.tar.*, data.tar.*): its data.tar, the
        files it installs, written out and read as a tarball's members are, named from the
        package (`libx.deb!/usr/lib/x86_64-linux-gnu/libx.so.1`)."""
        if self._again(host):
            return
        if self.identify:
            self.containers[report] = container(host, "deb")
        try:
            with open(host, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                data = [m for m in read_members(mm, report) if m.name.startswith("data.tar")]
                if len(data) != 1:
                    yield Input(report, None, True,
                                f"not a Debian package: {len(data)} data.tar members (one expected)")
                    return
                why = self.limits.refuse(data[0].size, data[0].size)
                if why:
                    yield Input(report, None, True, why)
                    return
                folder = tempfile.mkdtemp(prefix="deb-", dir=self._under or self._archive_tmp())
                suffix = next((s for s in COMPRESSED_TAR if data[0].name.endswith(s)), ".tar")
                tarball = os.path.join(folder, "data" + suffix)
                with open(tarball, "wb") as out:
                    for at in range(data[0].offset, data[0].offset + data[0].size, 1 << 20):
                        out.write(mm[at:min(at + (1 << 20), data[0].offset + data[0].size)])
        except InputError as exc:
            yield Input(report, None, True, exc.message)
            return
        except (OSError, ValueError) as exc:
            yield Input(report, None, True, f"cannot read: {getattr(exc, 'strerror', None) or exc}")
            return
        yield from self._tar_files(report, tarball, "tar")

    def _rpm(self, report: str, host: str):
        """An RPM package: the files its cpio payload installs (rpm.py), read in place as a
        tarball's members are, named from the package (`libx.rpm!/usr/lib64/libx.so.1`). One
        with nothing to read is counted as skipped (`rpm`)."""
        if self.identify and report not in self.containers:
            self.containers[report] = container(host, "rpm")
        yield from self._tar_files(report, host, "rpm", read=rpm_members)

    def _cpio(self, report: str, host: str):
        """A cpio archive of the newc format (an initramfs): its regular files, read in place as a
        tarball's members are (`initrd.cpio!/usr/lib/libx.so`). One with nothing to read is
        counted as skipped (`cpio`)."""
        yield from self._tar_files(report, host, "cpio", read=cpio_members)

    def _tar_files(self, report: str, host: str, why: str, explicit: bool = False, read=tar_members):
        """A tar that is not an image (an sdist, a tarball of a build; plain, gzip, xz, bzip2 or
        zstd): every regular member that needs reading (a binary, a static archive, a zip archive
        or tar inside, a Python source that calls a library loader) is written out under its own
        name and audited as a wheel's members are; links are not created (members are found by
        name, as a wheel's). One with nothing to read is counted as skipped (`why`), or, named on
        the command line, an error. `read` lists the members: tar_members, or rpm_members for an
        RPM's payload (the same (TarInfo, stream) pairs)."""
        if self._again(host):
            return
        if self.identify and report not in self.containers:  # a .deb or .rpm named itself already
            self.containers[report] = container(host, "tar")
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-tar-", dir=self._under)
        self.tmpdirs.append(tmp)
        for folder in dict.fromkeys((tmp.name, os.path.realpath(tmp.name))):
            self.labels.append((folder, report))
        written: dict[str, tuple[str, str]] = {}  # member name -> (where, category); a later one replaces it
        errors: list[Input] = []
        total, image, marks = 0, False, set()
        try:
            with open(host, "rb") as fh:
                for m, src in read(fh, os.fstat(fh.fileno()).st_size, self.limits.ratio, self.limits.total_bytes):
                    inner = f"{report}{WHEEL_SEP}{m.name}"
                    name = safe_member(m.name)
                    if name is not None:  # docker save's manifest.json beside its layer tars, OCI's oci-layout
                        marks |= {k for k, hit in (("manifest", name == "manifest.json"), ("oci", name == "oci-layout"),
                                                   ("layer", name.endswith("/layer.tar")
                                                    or name.startswith("blobs/sha256/"))) if hit}
                        if "oci" in marks or {"manifest", "layer"} <= marks:  # an image
                            image = True
                            break
                    head = src.read(HEAD_BYTES)
                    category = member_category(head, m.size, m.name)
                    written.pop(name, None)  # a later member of a name replaces the earlier, as extraction does
                    if category is None:  # data: whatever its name
                        continue
                    if name is None:  # a member to read, named out of the tar: never written
                        errors.append(Input(inner, None, True, "unsafe member path in tar"))
                        continue
                    if isinstance(category, Kind):  # a binary the audit cannot read yet
                        errors.append(Input(inner, None, True, not_audited(category)))
                        continue
                    refused, total = self.limits.refuse_in(m.size, total, "the tar's members to audit")
                    if not refused and self._zip_depth:  # inside another archive: one budget for all the nesting
                        if self._nested_bytes + m.size > self.limits.total_bytes:
                            refused = (f"archives inside archives unpack to more than {self.limits.total_bytes} "
                                       "bytes (--max-archive-size)")
                        else:
                            self._nested_bytes += m.size
                    if refused:
                        errors.append(Input(inner, None, True, refused))
                        continue
                    dest = os.path.join(tmp.name, *name.split("/"))
                    try:
                        os.makedirs(os.path.dirname(dest), exist_ok=True)
                        with open(dest, "wb") as out:
                            out.write(head)
                            shutil.copyfileobj(src, out, 1 << 20)
                        if category == "python":
                            with open(dest, "rb") as r:
                                if not stream_may_load(r):
                                    os.unlink(dest)
                                    continue
                    except OSError as exc:  # a member named where another is a file: kept out, reported
                        errors.append(Input(inner, None, True, f"cannot unpack: {exc.strerror or exc}"))
                        continue
                    written[name] = (dest, category)
        except InputError as exc:
            yield from errors
            yield Input(report, None, True, exc.message)
            return
        except Exception as exc:  # a member's data that cannot be decompressed as it is copied
            text = tar_read_error(exc)
            if text is None:
                raise
            yield from errors
            yield Input(report, None, True, text)
            return
        if image:  # its layers would be audited as loose files, resolved on this machine
            yield Input(report, None, True, "a compressed container image: decompress it first (an image tar is "
                                            "read in place, so it must be uncompressed)" if why == "compressed_tar"
                        else "a container image inside an archive: audit it as a file of its own")
            return
        yield from errors
        if not written and not errors:
            if explicit:
                yield Input(report, None, True, "not a container image, and nothing in it to audit (no binary, "
                                                "archive or Python source that loads a library)")
            else:
                self.skip(why)
            return
        yield from self._unpacked(report, [(f"{report}{WHEEL_SEP}{n}", d, c) for n, (d, c) in written.items()])

    def _unpacked(self, report: str, members: list[tuple[str, str, str]]):
        """The inputs of an archive's members written out: (name as reported, where written,
        category: "binary", "python", "static", "zip", "tar", "deb", "rpm", "cpio" or "compressed")."""
        binaries = MemberSet(report, (Member(dest, inner) for inner, dest, c in members if c == "binary"))
        for wanted in READ:  # binaries first: the others may need them
            for inner, dest, category in members:
                if category != wanted:
                    continue
                if category in ("binary", "python", "static"):
                    self.seen.add(self._real(dest))
                if category == "binary":
                    yield Input(inner, dest, True, members=binaries)
                elif category == "python":
                    yield Input(inner, dest, True)
                elif category == "static":
                    yield from self._archive_file(inner, dest)
                elif category == "compressed":
                    yield from self._decompressed(inner, dest)
                else:
                    yield from self._nested(inner, dest, category)

    def _walk(self, top: str):
        unlisted: list[Input] = []

        def onerror(exc: OSError):  # a part of the input that cannot be read fails closed, as a file does
            unlisted.append(Input(exc.filename or top, None, True, f"cannot list folder: {exc.strerror or exc}"))

        files: list[str] = []
        images: set[str] = set()  # OCI layout folders: audited as images, not walked
        for dirpath, dirnames, filenames in os.walk(top, onerror=onerror, followlinks=False):
            dirnames.sort()
            oci = {d for d in dirnames if is_oci_dir(os.path.join(dirpath, d))}
            dirnames[:] = [d for d in dirnames if d not in oci]
            images |= {os.path.join(dirpath, d) for d in oci}
            files += [os.path.join(dirpath, name) for name in sorted(filenames + list(oci))]
        # the whole folder is listed first: its files are the fallback for each other's NEEDED
        members = MemberSet(top, (Member(f, f) for f in files if not f.endswith(".whl") and f not in images))
        yield from unlisted
        for full in files:
            if full in images:
                yield from self._image(full)
                continue
            if os.path.islink(full) and not os.path.exists(full):
                self.skip("broken_symlink")
                self.warnings.append(f"{full}: broken symlink or symlink loop, skipped")
                continue
            if not os.path.isfile(full):
                self.skip("not_regular")
                continue
            # archives are opened as when named on the command line: wheels, conda packages, images
            if full.endswith(".whl"):
                yield from _members_of(full, self._wheel(full, full))
            elif is_conda(full):
                yield from _members_of(full, self._conda(full, full))
            else:
                for inp in self._file(full, full, explicit=False):
                    if inp.scope is None:  # an image's files resolve among the image's own
                        inp.members = members
                    yield inp

    def _wheel(self, report: str, host: str):
        """A wheel, or any zip archive (a jar, an egg): its binaries, Python sources that load
        libraries, static archives and zip archives inside are written out and audited as members."""
        if self._again(host):
            return
        what = "wheel" if host.endswith(".whl") else "zip archive"
        if self.identify:
            self.containers[report] = container(host, "wheel" if what == "wheel" else "zip")
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-wheel-", dir=self._under)
        self.tmpdirs.append(tmp)
        for folder in dict.fromkeys((tmp.name, os.path.realpath(tmp.name))):
            self.labels.append((folder, report))
        jobs = self.jobs if self.jobs is not None else cpu_count()
        errors: list[Input] = []  # reported first, in member order, as they are found
        try:
            with zipfile.ZipFile(host) as zf:
                members = [m for m in zf.infolist() if not m.filename.endswith("/")]  # is_dir() fails on ''
            if len(members) > _MAX_WHEEL_MEMBERS:
                yield Input(report, None, True, f"{what} has {len(members)} members (limit {_MAX_WHEEL_MEMBERS})")
                return
            # Which members are ELF files: each member's first bytes, read on every core.
            chunks = [members[i::jobs] for i in range(jobs)] if jobs > 1 and len(members) > 256 else [members]
            wanted: dict[str, str] = {}  # member -> its category (member_category): each is unpacked, then read
            unreadable: dict[str, str] = {}
            for got, bad in map_ordered(_ElfSniffer(host, self.limits), chunks, jobs):
                wanted.update(got)
                unreadable.update(bad)
            todo = []
            total = 0
            for m in members:
                inner = f"{report}{WHEEL_SEP}{m.filename}"
                parts = m.filename.split("/")
                if m.filename.startswith("/") or "\\" in m.filename or ".." in parts or "" in parts[:-1]:
                    errors.append(Input(inner, None, True, f"unsafe member path in {what}"))
                    continue
                if m.filename in unreadable:
                    errors.append(Input(inner, None, True, unreadable[m.filename]))
                    continue
                if m.filename not in wanted:
                    self.skip("python_no_load" if is_python_source(m.filename) else "non_elf")
                    continue
                why = self.limits.refuse(m.file_size, m.compress_size)
                if why:
                    errors.append(Input(inner, None, True, why))
                    continue
                total += m.file_size
                if total > self.limits.total_bytes:
                    errors.append(Input(inner, None, True, f"the {what}'s ELF members unpack to more than "
                                        f"{self.limits.total_bytes} bytes (--max-archive-size)"))
                    break
                if self._zip_depth:  # inside another archive: one budget for all the nesting
                    self._nested_bytes += m.file_size
                    if self._nested_bytes > self.limits.total_bytes:
                        errors.append(Input(inner, None, True, "zip archives inside archives unpack to more than "
                                            f"{self.limits.total_bytes} bytes (--max-archive-size)"))
                        break
                todo.append(m)
            # Streamed to disk, never whole in memory; the largest first, on every core once
            # there is enough to unpack for the workers to pay for themselves.
            order = sorted(range(len(todo)), key=lambda k: -todo[k].compress_size)
            big = sum(m.compress_size for m in todo) >= _PARALLEL_UNPACK_BYTES
            refused = map_ordered(_Unpacker(host, tmp.name, self.limits), todo, jobs if big else 1, order)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
            yield from errors
            yield Input(report, None, True, f"cannot read {what}: {' '.join(str(exc).split())}")
            return
        finally:
            _Zip.close(host)
        yield from errors
        unpacked = []
        for m, why in zip(todo, refused):
            inner = f"{report}{WHEEL_SEP}{m.filename}"
            if why:
                yield Input(inner, None, True, why)
                continue
            unpacked.append((inner, os.path.join(tmp.name, *m.filename.split("/")), wanted[m.filename]))
        yield from self._unpacked(report, unpacked)

    def _decompressed(self, report: str, host: str, explicit: bool = False):
        """A file compressed on its own (gzip, xz, bzip2, zstd; compressed.py): its first bytes
        decompressed say what it holds; one that holds something to read is decompressed (bounded
        as a tar's stream) and read as that member would be (`libx.so.gz!/libx.so`); one of data
        is counted as skipped (`compressed_data`), or, named, an error. Nested compression counts
        toward MAX_ZIP_DEPTH."""
        if self._again(host):
            return
        inner = inner_name(report)
        if inner in (".", ".."):  # a name of dots: never a path out of the folder it is written to
            inner = "decompressed"
        try:
            head = peek(host, HEAD_BYTES)
        except InputError as exc:
            yield Input(report, None, True, exc.message)
            return
        category = member_category(head, len(head), inner)
        if isinstance(category, Kind):
            yield Input(report, None, True, not_audited(category))
            return
        if category is None:
            if explicit:
                yield Input(report, None, True, "a compressed file holding nothing to audit")
            else:
                self.skip("compressed_data")
            return
        if self._zip_depth >= MAX_ZIP_DEPTH:
            yield Input(report, None, True, f"compressed file nested more than {MAX_ZIP_DEPTH} deep: not read")
            return
        # every compressed file of the run shares the nested archives' count and byte budget: ten
        # thousand small bombs, each within its own ratio, must not fill the runner's disk
        self._nested_count += 1
        left = self.limits.total_bytes - self._nested_bytes
        if self._nested_count > MAX_NESTED_ZIPS or left <= 0:
            yield Input(report, None, True, f"more than {MAX_NESTED_ZIPS} archives or compressed files inside "
                                            f"archives, or more than {self.limits.total_bytes} bytes unpacked from "
                                            "them (--max-archive-size): not read")
            return
        folder = tempfile.mkdtemp(prefix="inflate-", dir=self._under or self._archive_tmp())
        for label in dict.fromkeys((folder, os.path.realpath(folder))):
            self.labels.append((label, report))
        dest = os.path.join(folder, inner)
        why = None
        try:
            decompress(host, dest, self.limits.ratio, left)
        except InputError as exc:
            why = exc.message
        self._nested_bytes += os.path.getsize(dest) if os.path.isfile(dest) else 0
        if why is not None:
            if os.path.isfile(dest):
                os.unlink(dest)  # a bomb's first bytes: nothing to keep on the runner's disk
            yield Input(report, None, True, why)
            return
        self._zip_depth += 1
        try:
            yield from self._unpacked(report, [(f"{report}{WHEEL_SEP}{inner}", dest, category)])
        finally:
            self._zip_depth -= 1

    def _nested(self, report: str, host: str, kind: str):
        """A zip archive, tar, .deb, .rpm or cpio archive that is a member of another archive (a jar in a wheel, a
        jar in a jar, a tarball in a wheel): read as when met in a folder, MAX_ZIP_DEPTH deep at
        most, all of them within one byte budget."""
        if self._zip_depth >= MAX_ZIP_DEPTH:
            yield Input(report, None, True, f"zip archive nested more than {MAX_ZIP_DEPTH} deep: not read")
            return
        self._nested_count += 1
        if self._nested_count > MAX_NESTED_ZIPS:
            yield Input(report, None, True, f"more than {MAX_NESTED_ZIPS} zip archives inside archives: not read")
            return
        self._zip_depth += 1
        try:
            if kind == "zip":
                yield from self._wheel(report, host)
            elif kind == "deb":
                yield from self._deb(report, host)
            elif kind == "rpm":
                yield from self._rpm(report, host)
            elif kind == "cpio":
                yield from self._cpio(report, host)
            else:
                yield from self._tar_files(report, host, "compressed_tar" if host.endswith(COMPRESSED_TAR) else "tar")
        finally:
            self._zip_depth -= 1

    def _conda(self, report: str, host: str):
        if self._again(host):
            return
        if self.identify:
            self.containers[report] = container(host, "conda")
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-conda-", dir=self._under)
        self.tmpdirs.append(tmp)
        root = os.path.join(tmp.name, "pkg")  # the package's files; its bytes wait beside it while it is read
        for folder in dict.fromkeys((root, os.path.realpath(root))):
            self.labels.append((folder, report))
        try:
            extracted = extract_conda(host, root, self.limits.member_bytes, self.limits.total_bytes)
        except InputError as exc:
            yield Input(report, None, True, exc.message)
            return
        members = MemberSet(report, (Member(x.written, f"{report}{WHEEL_SEP}{x.name}")
                                     for x in extracted if x.written and x.category == "binary"))
        prefix = self.conda_prefix
        scope = Scope(fallback=[("conda-prefix", os.path.join(prefix, "lib"))]) if prefix else None
        archives = [x.name for x in extracted if x.kind is Kind.STATIC_ARCHIVE]
        if archives:
            yield from self._conda_archives(report, host, archives)
        for x in extracted:
            if x.kind is Kind.STATIC_ARCHIVE:
                continue
            elif x.error:
                yield Input(f"{report}{WHEEL_SEP}{x.name}", None, True, x.error)
            elif not x.audited:  # another name of a member (a link): found by name only
                continue
            elif x.category == "binary":
                self.seen.add(self._real(x.written))
                yield Input(f"{report}{WHEEL_SEP}{x.name}", x.written, True, members=members, scope=scope)
            else:  # a Python loader; a jar, tarball, .deb or .rpm, whose members are audited in turn
                yield from self._unpacked(report, [(f"{report}{WHEEL_SEP}{x.name}", x.written, x.category)])

    def _conda_archives(self, report: str, host: str, names: list[str]):
        """The static archives of a conda package (extract_conda writes ELF files only): the
        package is read again for them, each streamed to disk under the archive limits, then
        expanded into its members."""
        folder = tempfile.mkdtemp(prefix="conda-", dir=self._archive_tmp())
        wanted, written, refused, total = set(names), {}, {}, 0
        try:
            with _package_tar(host) as tf:
                for n, m in enumerate(tf):
                    if not m.isreg() or _conda_safe(host, m.name) not in wanted:
                        continue
                    name = _conda_safe(host, m.name)
                    why, total = self.limits.refuse_in(m.size, total, "the package's static archives")
                    if why:
                        refused[name] = why
                        continue
                    dest = os.path.join(folder, str(n))
                    with tf.extractfile(m) as src, open(dest, "xb") as out:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    written[name] = dest  # the last one of a name is what the package installs
                    refused.pop(name, None)
        except Exception as exc:  # noqa: BLE001  read once already: now unreadable, it fails closed
            yield Input(report, None, True, f"cannot read conda package again for its static archives: "
                                            f"{' '.join(str(exc).split()) or type(exc).__name__}")
            return
        for name in dict.fromkeys(names):
            shown = f"{report}{WHEEL_SEP}{name}"
            if name in refused:
                yield Input(shown, None, True, refused[name])
            elif name in written:
                yield from self._archive_file(shown, written[name])
            else:
                yield Input(shown, None, True, "static archive not found again in the package")

    def relabel(self, text: str | None) -> str | None:
        """`text` with every path inside a wheel's (or conda package's) extraction folder written
        as `WHEEL!/member`: the folder is gone when the report is read, and its random name would
        make two runs differ."""
        if not text:
            return text
        for folder, wheel in self.labels:
            if folder in text:
                text = re.sub(re.escape(folder) + r"(/[^\s()\[\]'\",;]*)?",
                              lambda m, wheel=wheel: _member(wheel, m.group(1)), text)
        return text

    def cleanup(self) -> None:
        for tmp in self.tmpdirs:
            tmp.cleanup()
        for image in self.images:
            image.close()


class _Zip:
    """One open ZipFile per archive and process: a forked worker must not share its parent's
    file offset, so each opens the archive itself, once."""

    _open: dict[str, zipfile.ZipFile] = {}
    _pid = 0

    @classmethod
    def get(cls, path: str) -> zipfile.ZipFile:
        if cls._pid != os.getpid():
            cls._open, cls._pid = {}, os.getpid()
        if path not in cls._open:
            cls._open[path] = zipfile.ZipFile(path)
        return cls._open[path]

    @classmethod
    def close(cls, path: str) -> None:
        zf = cls._open.pop(path, None) if cls._pid == os.getpid() else None
        if zf is not None:
            zf.close()


# What a damaged member raises while it is read (the archive around it is still readable):
# a bad CRC, corrupt deflate data, invalid LZMA properties or data, a truncated stream, an
# unknown method, an encrypted member.
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, NotImplementedError, RuntimeError)


def _member_error(exc: BaseException) -> str:
    return f"cannot read member: {' '.join(str(exc).split()) or type(exc).__name__}"


class _ElfSniffer:
    """What each member (of one chunk) needs, from its first bytes (member_category): the members to
    unpack and read, each with its category; and why each other member is an error (its start
    cannot be read, it is a binary of a format not audited, a Python source past the limits).
    A Python source is read whole, in chunks, and wanted only where it names a library loader."""

    def __init__(self, host: str, limits: ArchiveLimits | None = None):
        self.host, self.limits = host, limits or ArchiveLimits()

    def __call__(self, chunk: list[zipfile.ZipInfo]) -> tuple[dict[str, str], dict[str, str]]:
        zf = _Zip.get(self.host)
        wanted, bad = {}, {}
        for m in chunk:
            try:
                with zf.open(m) as fh:
                    head = fh.read(HEAD_BYTES)
                category = member_category(head, m.file_size, m.filename)
                if isinstance(category, Kind):  # reported as an error: a binary the audit cannot read yet
                    bad[m.filename] = not_audited(category)
                elif category == "python":
                    why = self.limits.refuse(m.file_size, m.compress_size)
                    if why:  # not read: it may load a library
                        bad[m.filename] = why
                        continue
                    with zf.open(m) as fh:
                        if stream_may_load(fh):
                            wanted[m.filename] = category
                elif category is not None:
                    wanted[m.filename] = category
            except _MEMBER_ERRORS as exc:
                bad[m.filename] = _member_error(exc)
            except InputError as exc:
                bad[m.filename] = exc.message
        return wanted, bad


class _Unpacker:
    """Streams one member to disk; returns why it was refused, or None. The byte count is
    checked as it is written: a header that understates the size does not get past the limit."""

    def __init__(self, host: str, dest: str, limits: ArchiveLimits):
        self.host, self.dest, self.limits = host, dest, limits

    def __call__(self, m: zipfile.ZipInfo) -> str | None:
        path = os.path.join(self.dest, *m.filename.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        limit = min(self.limits.member_bytes, max(m.file_size, 0))
        written = 0
        with open(path, "wb") as out:
            try:
                with _Zip.get(self.host).open(m) as src:
                    while chunk := src.read(1 << 20):
                        written += len(chunk)
                        if written > limit:
                            out.truncate(0)
                            return f"member unpacks to more than its declared {m.file_size} bytes"
                        out.write(chunk)
            except _MEMBER_ERRORS as exc:  # e.g. its CRC does not match: this member only is unreadable
                out.truncate(0)
                return _member_error(exc)
        return None


def _members_of(archive: str, inputs):
    """The inputs of an archive, each marked with it (a report names the archive's file, e.g. in
    a GitHub annotation); an error about the whole archive is its own."""
    for inp in inputs:
        if inp.shown != archive:
            inp.archive = archive
        yield inp


# what a static archive's members are read as (audit/linkage/resolution/native.py read_binary)
_OBJECT_KINDS = (Kind.ELF, Kind.COFF_OBJECT, Kind.MACHO, Kind.MACHO_FAT)


def _short_import(data, m) -> bool:
    """An import library's member: a short import object (IMPORT_OBJECT_HEADER, version 0)."""
    return m.size >= 20 and bytes(data[m.offset:m.offset + 6]) == b"\0\0\xff\xff\0\0"


def _damaged_coff(head: bytes) -> bool:
    """An archive member that starts as a COFF object or a short import object does (a machine
    number no text starts with, no optional header), though identify() found it inconsistent:
    not text to skip."""
    if len(head) < 20:
        return head[:4] == b"\0\0\xff\xff" or head[:2] in _COFF_MAGICS
    if head[:4] == b"\0\0\xff\xff":
        return True
    return head[:2] in _COFF_MAGICS and head[16:18] == b"\0\0"


_COFF_MAGICS = (b"\x64\x86", b"\x64\xaa", b"\x4c\x01", b"\x41\xa6")  # x86-64, arm64, i386, arm64ec


def not_audited(kind: Kind) -> str:
    return f"{kind.value}: format not audited"


def _starts_as(path: str, test) -> bool:
    """Whether the file's first bytes pass `test` (is_zip, is_deb, is_rpm); False where it cannot be read."""
    try:
        return test(_head(path)[0])
    except OSError:  # reported where the file is read
        return False


def _head(path: str) -> tuple[bytes, int]:
    """The first bytes of a regular file and its size; a FIFO or device met since it was listed
    is not opened for reading (it would block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        return os.pread(fd, HEAD_BYTES, 0), st.st_size
    finally:
        os.close(fd)


def _is_tar(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return looks_like_tar(fh.read(512))
    except OSError:
        return False


def _member(wheel: str, rest: str | None) -> str:
    if not rest:
        return wheel + WHEEL_SEP
    inner = posixpath.normpath(rest.lstrip("/"))  # "pkg/_core/../../pkg.libs/x.so" -> "pkg.libs/x.so"
    return wheel + WHEEL_SEP + inner

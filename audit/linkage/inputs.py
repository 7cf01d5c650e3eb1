"""The inputs of `check`: PATH arguments expanded into ELF files (files, directory trees, wheels,
container images).

Nothing here judges a file; a member that cannot be read becomes an Input with an error.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field, replace

from audit.errors import InputError
from audit.linkage.conda import extract_conda, is_conda
from audit.linkage.fs import HOST, FileSystem
from audit.linkage.model import WHEEL_SEP
from audit.linkage.image import is_oci_dir, looks_like_tar, open_image
from audit.linkage.resolve import Member, MemberSet, ResolveOptions

_MAX_WHEEL_MEMBERS = 200_000
_MAX_WHEEL_BYTES = 32 << 30  # declared uncompressed size of the ELF members we extract


@dataclass(eq=False)  # hashed by identity: one resolver per scope
class Scope:
    """Where an input's libraries are searched when not just as the command line says: a
    container image's own filesystem and environment, or a conda package's prefix."""

    fs: FileSystem = HOST
    own_system: bool = False  # an image: --root, --ldpath and --use-env describe this machine, not it
    env_path: str | None = None  # LD_LIBRARY_PATH of the image's config
    fallback: list[tuple[str, str]] = field(default_factory=list)

    def options(self, base: ResolveOptions) -> ResolveOptions:
        if self.own_system:
            return replace(ResolveOptions(), use_env=self.env_path is not None, ld_library_path=self.env_path,
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


class Inputs:
    """Expands PATH arguments into ELF files: files, directory trees, wheels."""

    def __init__(self, conda_prefix: str | None = None):
        self.conda_prefix = conda_prefix  # a conda environment the packages' libraries resolve against
        self.skipped: dict[str, int] = {}
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.tmpdirs: list[tempfile.TemporaryDirectory] = []
        self.images: list = []

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

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
            yield from self._wheel(arg, arg)
        elif is_conda(arg):
            yield from self._conda(arg, arg)
        elif _is_tar(arg):
            yield from self._image(arg)
        else:
            yield from self._file(arg, arg, explicit=True)

    def _image(self, arg: str):
        from audit.linkage.layers import ImageTree

        try:
            image = open_image(arg)
            self.images.append(image)
            tree = ImageTree(image)
        except InputError as exc:
            yield Input(arg, None, True, exc.message)
            return
        except OSError as exc:
            yield Input(arg, None, True, f"cannot read image: {exc.strerror or exc}")
            return
        scope = Scope(tree, own_system=True, env_path=image.env.get("LD_LIBRARY_PATH"))
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
            yield Input(f"{arg}!{path}", path, True, scope=scope, layer=tree.layer_of(entry), members=members)
        if not found:
            self.warnings.append(f"{arg}: the image holds no ELF file")

    def _file(self, report: str, host: str, explicit: bool):
        real = os.path.realpath(host)
        if real in self.seen:
            self.skip("duplicate")
            return
        self.seen.add(real)
        try:
            with open(host, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            yield Input(report, None, explicit, f"cannot read: {exc.strerror or exc}")
            return
        if magic == b"\x7fELF":
            yield Input(report, host, explicit)
        elif magic == b"!<ar" and explicit:
            yield Input(report, None, True, "a static archive (ar), not an ELF file: audit the object it is linked into")
        elif magic == b"!<ar":  # a static archive: its members are not audited, so say so
            self.skip("archive")
            self.warnings.append(f"{report}: static archive (ar) not audited; audit the object it is linked into")
        elif explicit:
            yield Input(report, None, True, "not an ELF file" + (" (empty)" if not magic else ""))
        else:
            self.skip("non_elf")

    def _walk(self, top: str):
        def onerror(exc: OSError):
            self.warnings.append(f"cannot list {exc.filename}: {exc.strerror}")
            self.skip("unreadable_dir")

        files: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top, onerror=onerror, followlinks=False):
            dirnames.sort()
            files += [os.path.join(dirpath, name) for name in sorted(filenames)]
        # the whole folder is listed first: its files are the fallback for each other's NEEDED
        members = MemberSet(top, (Member(f, f) for f in files if not f.endswith(".whl")))
        for full in files:
            if os.path.islink(full) and not os.path.exists(full):
                self.skip("broken_symlink")
                self.warnings.append(f"{full}: broken symlink or symlink loop, skipped")
                continue
            if not os.path.isfile(full):
                self.skip("not_regular")
                continue
            if full.endswith(".whl"):
                yield from self._wheel(full, full)
            elif is_conda(full):
                yield from self._conda(full, full)
            else:
                for inp in self._file(full, full, explicit=False):
                    inp.members = members
                    yield inp

    def _wheel(self, report: str, host: str):
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-wheel-")
        self.tmpdirs.append(tmp)
        try:
            with zipfile.ZipFile(host) as zf:
                members = zf.infolist()
                if len(members) > _MAX_WHEEL_MEMBERS:
                    yield Input(report, None, True, f"wheel has {len(members)} members (limit {_MAX_WHEEL_MEMBERS})")
                    return
                total = 0
                extracted = []
                for m in members:
                    if m.is_dir():
                        continue
                    inner = f"{report}{WHEEL_SEP}{m.filename}"
                    parts = m.filename.split("/")
                    if m.filename.startswith("/") or "\\" in m.filename or ".." in parts or "" in parts[:-1]:
                        yield Input(inner, None, True, "unsafe member path in wheel")
                        continue
                    with zf.open(m) as fh:
                        if fh.read(4) != b"\x7fELF":
                            self.skip("non_elf")
                            continue
                    total += m.file_size
                    if total > _MAX_WHEEL_BYTES:
                        yield Input(inner, None, True, "wheel's ELF members exceed the size limit")
                        return
                    dest = os.path.join(tmp.name, *parts)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with zf.open(m) as src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    extracted.append((inner, dest))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
            yield Input(report, None, True, f"cannot read wheel: {' '.join(str(exc).split())}")
            return
        members = MemberSet(report, (Member(dest, inner) for inner, dest in extracted))
        for inner, dest in extracted:
            self.seen.add(os.path.realpath(dest))
            yield Input(inner, dest, True, members=members)

    def _conda(self, report: str, host: str):
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-conda-")
        self.tmpdirs.append(tmp)
        try:
            extracted = extract_conda(host, tmp.name)
        except InputError as exc:
            yield Input(report, None, True, exc.message)
            return
        members = MemberSet(report, (Member(dest, f"{report}{WHEEL_SEP}{name}") for name, dest, _ in extracted))
        prefix = self.conda_prefix
        scope = Scope(fallback=[("conda-prefix", os.path.join(prefix, "lib"))]) if prefix else None
        for name, dest, audited in extracted:
            if not audited:
                continue
            self.seen.add(os.path.realpath(dest))
            yield Input(f"{report}{WHEEL_SEP}{name}", dest, True, members=members, scope=scope)

    def cleanup(self) -> None:
        for tmp in self.tmpdirs:
            tmp.cleanup()
        for image in self.images:
            image.close()


def _is_tar(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return looks_like_tar(fh.read(512))
    except OSError:
        return False

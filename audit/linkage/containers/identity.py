"""What a container or a binary says it is, from its own metadata, and its package URL (purl):

  - a wheel: its `NAME-VERSION.dist-info/METADATA` (Name, Version) -> pkg:pypi/name@version
    (the name normalised as PEP 503 and the purl spec say: lower case, runs of -_. as -);
  - a conda package: its `info/index.json` (name, version, build, subdir) ->
    pkg:conda/name@version?build=...&subdir=...&type=conda|tar.bz2;
  - a Debian package: its control.tar's `control` -> pkg:deb/name@version?arch=...;
  - an RPM package: its header's name, version, release, arch -> pkg:rpm/name@version-release?arch=...;
  - a tarball: its digest only;
  - a container image: the digest of its config (the image ID); no purl (a saved image
    carries no registry name it could be looked up by);
  - a binary's `.note.package` (audit.elf.notes): pkg:deb/os/name@version?arch=... (rpm,
    alpm, apk alike), pkg:generic/name@version for any other type;
  - a file of an image: the Debian package dpkg's records inside the image say owns it
    (dpkg_owners): pkg:deb/<os-release ID>/name@version?arch=...&distro=...;
  - a static archive: its digest only.

Nothing here is trusted: each field is bounded, and a container without readable metadata
simply has no PackageId (the file is still audited, and named by its path and digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from urllib.parse import quote

from audit.linkage.containers.tars import bounded_members

_MAX_METADATA = 1 << 20  # a METADATA or index.json larger than this is not read
_MAX_FIELD = 256
_INFO_STREAM = 64 << 20  # how far into a conda package's stream info/index.json is looked for
_INFO_MEMBERS = 10_000
# .note.package types whose purl type is the same word and takes the os as its namespace
_OS_TYPES = {"deb", "rpm", "alpm", "apk"}


@dataclass(frozen=True)
class PackageId:
    """A package as its own metadata names it. `source`: where that was read."""

    name: str
    version: str | None = None
    purl: str | None = None
    source: str = ""  # "METADATA" | "info/index.json" | "control" (.deb) | "header" (.rpm) | ".note.package" | "dpkg"

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "purl": self.purl, "source": self.source}


@dataclass
class Container:
    """A wheel, conda package, image or static archive that audited files are members of
    (their reported paths start with `path` and "!")."""

    path: str  # as given or found, as reports name it
    kind: str  # "wheel" | "zip" (a jar, an egg) | "conda" | "deb" | "rpm" | "tar" | "image" | "static-archive"
    sha256: str | None = None  # of the file (a wheel, a conda package, an archive); None for an image
    size: int | None = None
    package: PackageId | None = None
    digest: str | None = None  # an image: "sha256:..." of its config, the image ID

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "sha256": self.sha256, "size": self.size,
                "package": self.package.to_dict() if self.package else None, "digest": self.digest}


def _enc(text: str) -> str:
    return quote(text, safe="")


def purl(ptype: str, name: str, version: str | None = None, namespace: str | None = None,
         qualifiers: dict[str, str | None] | None = None) -> str:
    """A package URL (github.com/package-url/purl-spec): each part percent-encoded, qualifiers
    sorted by key, empty ones left out."""
    text = f"pkg:{ptype}/" + (f"{_enc(namespace)}/" if namespace else "") + _enc(name)
    if version:
        text += "@" + _enc(version)
    quals = sorted((k, v) for k, v in (qualifiers or {}).items() if v)
    if quals:
        text += "?" + "&".join(f"{k}={_enc(v)}" for k, v in quals)
    return text


def _field(value) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if 0 < len(value) <= _MAX_FIELD and value.isprintable() else None


def pypi_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_package(path: str) -> PackageId | None:
    """The wheel's Name and Version from its top-level `*.dist-info/METADATA`."""
    try:
        with zipfile.ZipFile(path) as zf:
            metas = sorted(i for i in zf.infolist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename))
            if not metas:
                return None
            base = os.path.basename(path).split("-")[0].lower()
            meta = next((m for m in metas if m.filename.split("-")[0].lower() == base), metas[0])
            if meta.file_size > _MAX_METADATA:
                return None
            with zf.open(meta) as fh:
                text = fh.read(_MAX_METADATA + 1)[:_MAX_METADATA].decode("utf-8", "replace")
    except Exception:  # noqa: BLE001  metadata only (any member's decompressor may fail): it names nothing
        return None
    headers = HeaderParser().parsestr(text, headersonly=True)
    name, version = _field(headers.get("Name")), _field(headers.get("Version"))
    if not name:
        return None
    return PackageId(name, version, purl("pypi", pypi_name(name), version), "METADATA")


def _index_json(tf: tarfile.TarFile) -> dict | None:
    """info/index.json, looked for among the stream's first members only (conda writes info/
    first): bounded in members and bytes, as a streamed tar must be (tars.py)."""
    for n, m in enumerate(bounded_members(tf, _INFO_STREAM, "conda package metadata")):
        if n >= _INFO_MEMBERS:
            return None
        if m.name.lstrip("./") == "info/index.json" and m.isreg() and m.size <= _MAX_METADATA:
            with tf.extractfile(m) as fh:
                doc = json.loads(fh.read(_MAX_METADATA))
            return doc if isinstance(doc, dict) else None
    return None


def conda_package(path: str) -> PackageId | None:
    """name, version, build and subdir from the package's info/index.json."""
    try:
        if path.endswith(".tar.bz2"):
            with tarfile.open(path, mode="r|bz2") as tf:
                doc = _index_json(tf)
        else:
            with zipfile.ZipFile(path) as zf:
                infos = [n for n in zf.namelist() if n.startswith("info-") and n.endswith(".tar.zst") and "/" not in n]
                if len(infos) != 1:
                    return None
                import zstandard

                with zf.open(infos[0]) as raw, zstandard.ZstdDecompressor().stream_reader(
                        raw, read_across_frames=True) as z, tarfile.open(fileobj=z, mode="r|") as tf:
                    doc = _index_json(tf)
    except Exception:  # noqa: BLE001  metadata only: an unreadable one names nothing
        return None
    if doc is None:
        return None
    name, version = _field(doc.get("name")), _field(doc.get("version"))
    if not name:
        return None
    kind = "tar.bz2" if path.endswith(".tar.bz2") else "conda"
    quals = {"build": _field(doc.get("build")), "subdir": _field(doc.get("subdir")), "type": kind}
    return PackageId(name, version, purl("conda", name.lower(), version, qualifiers=quals), "info/index.json")


def deb_package(path: str) -> PackageId | None:
    """Package, Version and Architecture from the .deb's control.tar `control` file ->
    pkg:deb/name@version?arch=... (no namespace: a .deb alone does not say its distribution)."""
    import mmap

    from audit.linkage.containers.static_archive import read_members
    from audit.linkage.containers.tars import tar_members

    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            control = [m for m in read_members(mm, path) if m.name.startswith("control.tar")]
            if len(control) != 1 or control[0].size > _INFO_STREAM:
                return None
            import io

            blob = io.BytesIO(bytes(mm[control[0].offset:control[0].offset + control[0].size]))
        text = None
        for m, data in tar_members(blob, len(blob.getvalue()), 100.0, _INFO_STREAM):
            if m.name.lstrip("./") == "control" and m.size <= _MAX_METADATA:
                text = data.read(_MAX_METADATA).decode("utf-8", "replace")
                break
    except Exception:  # noqa: BLE001  metadata only: an unreadable one names nothing
        return None
    fields = next(iter(_paragraphs(text)), {}) if text else {}
    name, version = _field(fields.get("Package")), _field(fields.get("Version"))
    if not name:
        return None
    return PackageId(name, version, purl("deb", name, version, qualifiers={"arch": _field(fields.get("Architecture"))}),
                     "control")


def rpm_package(path: str) -> PackageId | None:
    """Name, version, release and arch from the RPM's main header -> pkg:rpm/name@version-release
    ?arch=... (no namespace: an RPM alone does not say its distribution)."""
    from audit.linkage.containers.rpm import package_tags

    try:
        with open(path, "rb") as fh:
            tags = package_tags(fh, os.fstat(fh.fileno()).st_size)
    except Exception:  # noqa: BLE001  metadata only: an unreadable one names nothing
        return None
    name, version, release = _field(tags.get("name")), _field(tags.get("version")), _field(tags.get("release"))
    if not name:
        return None
    full = f"{version}-{release}" if version and release else version
    return PackageId(name, full, purl("rpm", name, full, qualifiers={"arch": _field(tags.get("arch"))}), "header")


def note_package(note: dict | None) -> PackageId | None:
    """A binary's .note.package object as a PackageId."""
    if not note:
        return None
    name, version = _field(note.get("name")), _field(note.get("version"))
    ptype = (_field(note.get("type")) or "").lower()
    if not name:
        return None
    if ptype in _OS_TYPES:
        ref = purl(ptype, name, version, _field(note.get("os")), {"arch": _field(note.get("architecture"))})
    else:
        ref = purl("generic", name, version)
    return PackageId(name, version, ref, ".note.package")


def file_digest(path: str) -> tuple[str, int] | None:
    """(sha256, size) of a file on this machine, or None if it cannot be read."""
    h = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError:
        return None
    return h.hexdigest(), size


def container(path: str, kind: str, image_digest: str | None = None) -> Container:
    """A container's identity: its file's digest and what its metadata says it is."""
    if kind == "image":
        return Container(path, kind, digest=f"sha256:{image_digest}" if image_digest else None)
    got = file_digest(path)
    readers = {"wheel": wheel_package, "conda": conda_package, "deb": deb_package, "rpm": rpm_package}
    package = readers[kind](path) if kind in readers else None
    return Container(path, kind, sha256=got[0] if got else None, size=got[1] if got else None, package=package)


_HOST_DIGESTS: dict[str, tuple[str, int] | None] = {}  # real path -> digest, once per process


def stamp_tree(tree, on_host: bool) -> None:
    """Each node of a resolved tree (audit.linkage.resolution.ldso.DepNode) keeps what the file
    it led to is: the digest, size and package note of a file that was read, else (on this
    machine's file system) the digest of a library the policy did not read (trusted, denied)."""
    for node, _ in tree.walk():
        if node.sha256 is not None:
            continue
        if node.info is not None:
            node.sha256, node.size = node.info.sha256 or None, node.info.size
            node.package_note = getattr(node.info, "package_note", None)
        elif on_host and node.path and node.status in ("trusted", "denied"):
            real = os.path.realpath(node.path)
            if real not in _HOST_DIGESTS:
                _HOST_DIGESTS[real] = file_digest(real)
            got = _HOST_DIGESTS[real]
            if got is not None:
                node.sha256, node.size = got


_DPKG = "/var/lib/dpkg"
_MAX_STATUS = 32 << 20  # /var/lib/dpkg/status of a large image is a few MB
_MAX_LIST = 8 << 20  # one package's file list
_MAX_PACKAGES = 20_000
_MAX_LISTS = 256 << 20  # all file lists together


def _paragraphs(text: str):
    """The control paragraphs of a dpkg status file: {field: value} (continuation lines dropped)."""
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line[:1] not in (" ", "\t", "") and ":" in line:
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        if fields.get("Package"):
            yield fields


def _os_release(fs) -> dict[str, str]:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = fs.read_text(path, 64 << 10)
        if text:
            out = {}
            for line in text.splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    out[key.strip()] = value.strip().strip("\"'")
            return out
    return {}


def _usr(path: str) -> str:
    """/usr/lib/x -> /lib/x: one key for both sides of a merged /usr (dpkg lists either)."""
    for top in ("/usr/lib/", "/usr/lib64/", "/usr/bin/", "/usr/sbin/"):
        if path.startswith(top):
            return path[4:]
    return path


def dpkg_owners(fs) -> dict[str, PackageId]:
    """The Debian package each file of an image belongs to, from dpkg's own records inside it:
    /var/lib/dpkg/status with info/PKG[:ARCH].list, or (distroless) status.d/PKG with
    status.d/PKG.md5sums. Keyed by path, /usr-merged paths under their short form (`_usr`)."""
    release = _os_release(fs)
    distro = _field(release.get("ID"))
    qual_distro = f"{distro}-{release['VERSION_ID']}" if distro and _field(release.get("VERSION_ID")) else None
    packages: dict[str, dict] = {}
    status = fs.read_text(f"{_DPKG}/status", _MAX_STATUS)
    for p in _paragraphs(status or ""):
        if "installed" in p.get("Status", "installed"):
            packages[p["Package"] + (":" + p["Architecture"] if p.get("Architecture") else "")] = p
    lists: dict[str, str] = {}  # package key -> file list text
    budget = [_MAX_LISTS]

    def read(path: str, limit: int) -> str:
        text = fs.read_text(path, min(limit, budget[0])) or "" if budget[0] > 0 else ""
        budget[0] -= len(text)
        return text

    for name in (fs.listdir(f"{_DPKG}/info") or [])[:_MAX_PACKAGES * 4]:
        if name.endswith(".list"):
            lists[name[:-5]] = read(f"{_DPKG}/info/{name}", _MAX_LIST)
    for name in (fs.listdir(f"{_DPKG}/status.d") or [])[:_MAX_PACKAGES * 2]:
        text = read(f"{_DPKG}/status.d/{name}", 1 << 20)
        if name.endswith(".md5sums"):
            lists[name[:-8]] = "\n".join("/" + line.split(None, 1)[1] for line in text.splitlines()
                                         if len(line.split(None, 1)) == 2)
        else:
            for p in _paragraphs(text):
                packages[name] = p
    owners: dict[str, PackageId] = {}
    for key, text in list(lists.items())[:_MAX_PACKAGES]:
        p = packages.get(key) or packages.get(key.split(":")[0]) or next(
            (v for k, v in packages.items() if k.split(":")[0] == key.split(":")[0]), None)
        if p is None:
            continue
        name, version, arch = _field(p.get("Package")), _field(p.get("Version")), _field(p.get("Architecture"))
        if not name:
            continue
        pid = PackageId(name, version, purl("deb", name, version, distro or None,
                                            {"arch": arch, "distro": qual_distro}), "dpkg")
        for path in text.splitlines():
            if path.startswith("/"):
                owners.setdefault(_usr(path), pid)
    return owners


def owner_of(owners: dict[str, PackageId], path: str) -> PackageId | None:
    return owners.get(_usr(path))

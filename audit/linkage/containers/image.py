"""Container images as inputs: a Docker archive (`docker save`, `podman save`) or an OCI image
layout (a directory or a tar holding `oci-layout`, `index.json`, `blobs/sha256/...`).

Read without a container runtime and without unpacking anything to disk:
  1. the manifest: manifest.json (Docker archive), else index.json -> the image manifest (OCI);
  2. the config: the layers' diff_ids, the history (`created_by`), `Env` (LD_LIBRARY_PATH);
  3. every blob checked against its digest (the blob's name or the manifest's descriptor; each
     layer's uncompressed bytes against the config's diff_id);
  4. the layers applied in order (layers.py) into the final tree that the audit searches.
Anything inconsistent raises InputError: the image is unreadable input (exit 3).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import stat
import tarfile
from dataclasses import dataclass, field

from audit.errors import InputError

_MAX_JSON = 16 << 20  # manifest, index and config documents
_MAX_INDEX_DEPTH = 4  # nested image indexes
# layers of one image: docker and podman stop at 127 (overlay's depth); each named layer is
# hashed and read, so a manifest naming one blob thousands of times must not cost minutes
MAX_LAYERS = 256
_HASH_CHUNK = 4 << 20
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


class Region(io.RawIOBase):
    """A byte range of a file, read with pread: a blob inside an image tar, read in place."""

    def __init__(self, fd: int, offset: int, size: int):
        super().__init__()
        self.fd, self.offset, self.size, self.pos = fd, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, {0: pos, 1: self.pos + pos, 2: self.size + pos}[whence])
        return self.pos

    def readinto(self, buf) -> int:
        n = max(0, min(len(buf), self.size - self.pos))
        data = pread(self.fd, n, self.offset + self.pos) if n else b""
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def pread(self, n: int, at: int) -> bytes:
        n = max(0, min(n, self.size - at))
        return pread(self.fd, n, self.offset + at) if n else b""


def pread(fd: int, n: int, offset: int) -> bytes:
    """Exactly n bytes at offset (os.pread may return less for large reads); short at end of file."""
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 30), offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


@dataclass
class LayerRef:
    index: int  # 1-based, bottom first
    blob: Region
    digest: str | None  # of the blob as stored (None: a Docker archive names it by path only)
    diff_id: str | None  # of the uncompressed tar (the config's rootfs.diff_ids)
    created_by: str | None  # the history entry that made it

    def describe(self) -> dict:
        return {"index": self.index, "digest": self.diff_id or self.digest, "created_by": self.created_by}


@dataclass
class Image:
    label: str  # as given on the command line
    layers: list[LayerRef]
    env: dict[str, str] = field(default_factory=dict)
    fds: list[int] = field(default_factory=list)  # open files the layers are read from
    config_digest: str | None = None  # hex sha256 of the config blob: the image ID

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


# ---------------------------------------------------------------- the container of blobs


class _Files:
    """The image's files (a directory or a tar), by relative path; symlinks resolved inside."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd
        self.is_dir = fd < 0
        self.members: dict[str, tarfile.TarInfo] = {}
        self.opened: list[int] = [fd] if fd >= 0 else []
        self._regions: dict[str, Region] = {}  # of a directory: one open file per blob
        if not self.is_dir:
            try:
                with tarfile.open(fileobj=Region(fd, 0, os.fstat(fd).st_size), mode="r:") as tf:
                    for m in tf:
                        self.members[_norm(m.name)] = m
            except (tarfile.TarError, EOFError, ValueError) as exc:
                raise InputError(f"{path}: not a container image (not a readable tar: {_line(exc)})") from None

    def has(self, name: str) -> bool:
        try:
            self.region(name)
            return True
        except InputError:
            return False

    def region(self, name: str, depth: int = 0) -> Region:
        name = _norm(name)
        if name.startswith("/") or ".." in name.split("/"):
            raise InputError(f"{self.path}: unsafe path {name!r} in the image")
        if self.is_dir:
            full = os.path.join(self.path, name)
            real, top = os.path.realpath(full), os.path.realpath(self.path)
            if not real.startswith(top + os.sep):
                raise InputError(f"{self.path}: {name} points outside the image directory")
            try:
                st = os.stat(real)
            except OSError:
                raise InputError(f"{self.path}: missing blob {name}") from None
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{self.path}: {name} is not a regular file")
            if real not in self._regions:
                fd = os.open(real, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self.opened.append(fd)
                self._regions[real] = Region(fd, 0, st.st_size)
            return Region(self._regions[real].fd, 0, st.st_size)
        m = self.members.get(name)
        if m is None:
            raise InputError(f"{self.path}: missing blob {name}")
        if m.issym() and depth < 8:  # docker save links identical layers to one copy
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
            return self.region(target, depth + 1)
        if not m.isfile():
            raise InputError(f"{self.path}: {name} is not a regular file in the archive")
        return Region(self.fd, m.offset_data, m.size)

    def json(self, name: str, digest: str | None = None) -> dict | list:
        region = self.region(name)
        if region.size > _MAX_JSON:
            raise InputError(f"{self.path}: {name} is too large for an image document")
        data = region.pread(region.size, 0)
        if digest is not None:
            _check_digest(self.path, name, hashlib.sha256(data).hexdigest(), digest)
        try:
            return json.loads(data)
        except (ValueError, UnicodeError, RecursionError) as exc:
            raise InputError(f"{self.path}: {name} is not valid JSON ({_line(exc)})") from None


# ---------------------------------------------------------------- opening an image


def is_oci_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "oci-layout")) and os.path.isfile(os.path.join(path, "index.json"))


def looks_like_tar(head: bytes) -> bool:
    return len(head) >= 262 and head[257:262] == b"ustar"


def tar_kind(path: str) -> str | None:
    """"image" for an uncompressed tar that holds a container image at its top level
    (`manifest.json`: docker save; `index.json`: an OCI layout), "tar" for another tar, None for
    a file that is not a tar. Only the tar's headers are read."""
    try:
        with open(path, "rb") as fh:
            if not looks_like_tar(fh.read(512)):
                return None
            fh.seek(0)
            with tarfile.open(fileobj=fh, mode="r:") as tf:
                for m in tf:
                    if _norm(m.name) in ("manifest.json", "index.json"):
                        return "image"
    except (OSError, tarfile.TarError, EOFError, ValueError):
        pass  # a damaged tar: not an image this can read either
    return "tar"


def open_image(path: str) -> Image:
    """Read an image's manifest and config and check its blobs (layers are read by layers.py)."""
    fd = -1
    if not os.path.isdir(path):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    files = None
    try:
        files = _Files(path, fd)
        if files.has("manifest.json"):
            config_name, layer_names, layer_descs = _docker_manifest(files)
            config_digest = _digest_in_name(config_name)
            config = files.json(config_name, config_digest)
        elif files.has("index.json"):
            manifest = _oci_manifest(files)
            desc = _obj(manifest.get("config"))
            config_digest = _descriptor_digest(files, desc)
            config = files.json(_blob_name(files, desc), config_digest)
            layer_descs = manifest.get("layers")
            if not isinstance(layer_descs, list):
                raise InputError(f"{path}: image manifest has no layers list")
            layer_names = [_blob_name(files, d) for d in layer_descs]
        else:
            raise InputError(f"{path}: not a container image (no manifest.json or index.json)")
        return Image(label=path, layers=_layers(files, config, layer_names, layer_descs), env=_env(config),
                     fds=files.opened, config_digest=config_digest)
    except BaseException:
        for opened in (files.opened if files else [fd] if fd >= 0 else []):
            os.close(opened)
        raise


def _docker_manifest(files: _Files):
    doc = files.json("manifest.json")
    if not isinstance(doc, list) or not doc or not all(isinstance(e, dict) for e in doc):
        raise InputError(f"{files.path}: manifest.json is not a list of images")
    if len(doc) > 1:
        raise InputError(f"{files.path}: holds {len(doc)} images; save one image per archive")
    entry = doc[0]
    config, layers = entry.get("Config"), entry.get("Layers")
    if not isinstance(config, str) or not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
        raise InputError(f"{files.path}: manifest.json entry lacks Config or Layers")
    descs = [None] * len(layers)
    for i, name in enumerate(layers):  # a newer docker save also describes the layers in OCI form
        digest = _digest_in_name(name)
        if digest:
            descs[i] = {"digest": f"sha256:{digest}"}
    return config, layers, descs


def _oci_manifest(files: _Files) -> dict:
    candidates = []

    def walk(index: dict, depth: int) -> None:
        entries = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(entries, list):
            raise InputError(f"{files.path}: index has no manifests list")
        for desc in entries:
            if not isinstance(desc, dict):
                raise InputError(f"{files.path}: malformed descriptor in an index")
            mt = desc.get("mediaType")
            if mt in INDEX_TYPES and depth < _MAX_INDEX_DEPTH:
                walk(files.json(_blob_name(files, desc), _descriptor_digest(files, desc)), depth + 1)
            elif mt in MANIFEST_TYPES or mt is None:
                plat = _obj(desc.get("platform"))
                if plat.get("architecture") == "unknown":  # attestation manifests (buildx)
                    continue
                candidates.append(desc)

    walk(files.json("index.json"), 0)
    if not candidates:
        raise InputError(f"{files.path}: index.json names no image manifest")
    if len(candidates) > 1:
        host = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        mine = [d for d in candidates if _obj(d.get("platform")).get("architecture") == host]
        if len(mine) != 1:
            raise InputError(f"{files.path}: holds {len(candidates)} image manifests; save one image per layout")
        candidates = mine
    manifest = files.json(_blob_name(files, candidates[0]), _descriptor_digest(files, candidates[0]))
    if not isinstance(manifest, dict):
        raise InputError(f"{files.path}: image manifest is not a JSON object")
    return manifest


def _layers(files: _Files, config, names: list[str], descs: list) -> list[LayerRef]:
    if len(names) > MAX_LAYERS:
        raise InputError(f"{files.path}: the image names {len(names)} layers (limit {MAX_LAYERS})")
    if not isinstance(config, dict):
        raise InputError(f"{files.path}: image config is not a JSON object")
    diff_ids = _obj(config.get("rootfs")).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != len(names):
        raise InputError(f"{files.path}: the config lists {len(diff_ids) if isinstance(diff_ids, list) else 'no'} "
                         f"layer digests for {len(names)} layers")
    history = config.get("history") if isinstance(config.get("history"), list) else []
    history = [h for h in history if isinstance(h, dict) and not h.get("empty_layer")]
    out = []
    for i, name in enumerate(names):
        desc = _obj(descs[i])
        created = history[i].get("created_by") if len(history) == len(names) else None
        out.append(LayerRef(index=i + 1, blob=files.region(name), digest=desc.get("digest"),
                            diff_id=diff_ids[i] if isinstance(diff_ids[i], str) else None,
                            created_by=created if isinstance(created, str) else None))
    return out


def _env(config: dict) -> dict[str, str]:
    env = _obj(config.get("config") or config.get("container_config")).get("Env") or []
    out = {}
    for item in env if isinstance(env, list) else []:
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def verify_blob(label: str, layer: LayerRef) -> str:
    """sha256 of the layer blob as stored, checked against its descriptor; returns the hex."""
    h = hashlib.sha256()
    pos = 0
    while pos < layer.blob.size:
        chunk = layer.blob.pread(_HASH_CHUNK, pos)
        if not chunk:
            raise InputError(f"{label}: layer {layer.index} is truncated")
        h.update(chunk)
        pos += len(chunk)
    got = h.hexdigest()
    if layer.digest:
        _check_digest(label, f"layer {layer.index}", got, layer.digest)
    return got


# ---------------------------------------------------------------- small helpers


def _obj(value) -> dict:
    """A JSON object where one is expected; anything else (a hostile document) reads as empty."""
    return value if isinstance(value, dict) else {}


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _digest_in_name(name: str) -> str | None:
    parts = _norm(name).split("/")
    if len(parts) == 3 and parts[:2] == ["blobs", "sha256"] and len(parts[2]) == 64:
        return parts[2]
    base = parts[-1].removesuffix(".json")
    return base if len(parts) == 1 and len(base) == 64 and all(c in "0123456789abcdef" for c in base) else None


def _blob_name(files: _Files, desc: dict) -> str:
    digest = desc.get("digest") if isinstance(desc, dict) else None
    if not isinstance(digest, str) or ":" not in digest:
        raise InputError(f"{files.path}: descriptor without a digest")
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise InputError(f"{files.path}: unsupported or malformed digest {digest!r}")
    return f"blobs/sha256/{hexd}"


def _descriptor_digest(files: _Files, desc: dict) -> str:
    return _blob_name(files, desc).rsplit("/", 1)[1]


def _check_digest(label: str, what: str, got: str, expected: str) -> None:
    want = expected.split(":", 1)[1] if expected.startswith("sha256:") else expected
    if got != want:
        raise InputError(f"{label}: digest mismatch for {what}: expected sha256:{want[:16]}..., "
                         f"content is sha256:{got[:16]}...")


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

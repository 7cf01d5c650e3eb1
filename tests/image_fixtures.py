"""Container images written as files with tarfile, as `docker save` and OCI tools lay them out.

No container runtime: layers are tars of real files (gcc-built libraries, the host's libc),
the config carries diff_ids, history and Env, and blobs are named by their sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _info(name: str, **kw) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def layer_tar(entries) -> bytes:
    """entries: ("file", name, bytes) | ("dir", name) | ("symlink", name, target) |
    ("hardlink", name, target) | ("whiteout", path) | ("opaque", dir)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            kind, name = e[0], e[1]
            if kind == "file":
                data = e[2]
                tf.addfile(_info(name, size=len(data), mode=0o755), io.BytesIO(data))
            elif kind == "dir":
                tf.addfile(_info(name, type=tarfile.DIRTYPE, mode=0o755))
            elif kind == "symlink":
                tf.addfile(_info(name, type=tarfile.SYMTYPE, linkname=e[2]))
            elif kind == "hardlink":
                tf.addfile(_info(name, type=tarfile.LNKTYPE, linkname=e[2]))
            elif kind == "whiteout":
                head, _, base = name.rpartition("/")
                tf.addfile(_info(f"{head}/.wh.{base}" if head else f".wh.{base}", size=0))
            elif kind == "opaque":
                tf.addfile(_info(f"{name.rstrip('/')}/.wh..wh..opq", size=0))
            else:
                raise ValueError(kind)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _config(layers: list[bytes], created_by: list[str | None], env: list[str]) -> bytes:
    history = []
    for i, c in enumerate(created_by):
        history.append({"created_by": c} if c else {})
        if i == 0:  # an ENV step makes no layer: it must not shift the mapping
            history.append({"created_by": "ENV X=1", "empty_layer": True})
    return json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": env},
                       "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(b)}" for b in layers]},
                       "history": history}).encode()


def _write_tar(out: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            tf.addfile(_info(name, size=len(data), mode=0o644), io.BytesIO(data))
        for name, target in (links or {}).items():
            tf.addfile(_info(name, type=tarfile.SYMTYPE, linkname=target))
    return out


def docker_archive(out: Path, layers: list[bytes], created_by=None, env=(), *,
                   tamper=None, blobs: bool = False) -> Path:
    """A legacy `docker save` tar: manifest.json, <config sha>.json, <id>/layer.tar; with
    `blobs`, the layout of newer docker save: every file under blobs/sha256/ by its digest."""
    created_by = created_by or [None] * len(layers)
    config = _config(layers, created_by, list(env))
    files = {}
    names = []
    for i, layer in enumerate(layers):
        lid = _sha(f"layer{i}".encode() + layer[:64])
        names.append(f"blobs/sha256/{_sha(layer)}" if blobs else f"{lid}/layer.tar")
        files[names[-1]] = layer
    cname = f"blobs/sha256/{_sha(config)}" if blobs else f"{_sha(config)}.json"
    files[cname] = config
    files["manifest.json"] = json.dumps([{"Config": cname, "RepoTags": ["app:1"], "Layers": names}]).encode()
    if tamper:
        tamper(files, names)
    return _write_tar(out, files)


def compress(data: bytes, how: str | None) -> bytes:
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    if how == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    return data


def oci_layout(out: Path, layers: list[bytes], created_by=None, env=(), *, how: str | None = None,
               as_tar: bool = False, tamper=None) -> Path:
    """An OCI image layout (a directory, or the same as a tar): index.json -> manifest -> blobs."""
    created_by = created_by or [None] * len(layers)
    config = _config(layers, created_by, list(env))
    blobs = {}
    descs = []
    suffix = {"gzip": "+gzip", "zstd": "+zstd", None: ""}[how]
    for layer in layers:
        stored = compress(layer, how)
        blobs[_sha(stored)] = stored
        descs.append({"mediaType": f"application/vnd.oci.image.layer.v1.tar{suffix}",
                      "digest": f"sha256:{_sha(stored)}", "size": len(stored)})
    blobs[_sha(config)] = config
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": f"sha256:{_sha(config)}", "size": len(config)},
                           "layers": descs}).encode()
    blobs[_sha(manifest)] = manifest
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{_sha(manifest)}",
         "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
    files.update({f"blobs/sha256/{k}": v for k, v in blobs.items()})
    if tamper:
        tamper(files, [d["digest"].split(":")[1] for d in descs])
    if as_tar:
        return _write_tar(out, files)
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out

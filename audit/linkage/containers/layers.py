"""An image's layers applied in order into its final filesystem, held in memory (a FileSystem
for resolve.py): what `docker run` would show, without writing a file.

Per the OCI image spec: a layer's `.wh.NAME` deletes NAME and `.wh..wh..opq` empties its
directory of what LOWER layers added; a file replacing a directory drops the directory's
contents; hard links share their target's bytes. A member's bytes are read in place from an
uncompressed layer (a seek into the image file) or, for gzip/zstd layers, by decompressing the
layer once more and parsing its surviving ELF files as they stream past.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tarfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from audit.binformat import HEAD_BYTES, Kind, identify, is_deb, is_newc_cpio, is_rpm, is_zip
from audit.elf.model import ElfInfo
from audit.errors import InputError
from audit.linkage.containers.compressed import compression, inflation_limit, open_reader, peek_stream
from audit.linkage.containers.image import Image, LayerRef, Region, looks_like_tar, verify_blob
from audit.linkage.containers.tars import bounded_members
from audit.linkage.resolution.native import AUDITED, MACHO_KINDS, PE_KINDS
from audit.python_source.reader import is_python_source, read_python_buffer, stream_may_load

_HEAD = 64  # bytes kept of every file of a compressed layer (the ELF header probe needs 20)
_TAR_HEAD = 262  # of one that may be a tar, whatever its name: its "ustar" magic ends here
_KEEP = 32 << 20  # small files kept whole from compressed layers (_kept): ld.so.conf, dpkg's records
_KEEP_TOTAL = 256 << 20  # all of them, in one image (dpkg keeps one file list per package)
_MAX_ENTRIES = 2_000_000
# a compressed tar is known by its name here (a plain one by its magic too: _may_be_tar)
_TAR_NAMES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.zst", ".tar.bz2")


def _kept(path: str) -> bool:
    # ld.so's configuration, and dpkg's records of which package owns each file (identity.py)
    return (path == "/etc/ld.so.conf" or path.startswith(("/etc/ld.so.conf.d/", "/var/lib/dpkg/status.d/"))
            or path in ("/var/lib/dpkg/status", "/etc/os-release", "/usr/lib/os-release")
            or (path.startswith("/var/lib/dpkg/info/") and path.endswith(".list")))


@dataclass(slots=True)
class Entry:
    kind: str  # "file" | "dir" | "link" | "other"
    layer: int  # 0-based index into Image.layers
    member: int  # ordinal of the tar member in its layer: identifies the bytes
    offset: int = 0  # of the data in the uncompressed layer
    size: int = 0
    target: str | None = None  # symlink target
    path: str = ""  # the member's own name (a hard link shares the entry)
    head: bytes | None = None  # first bytes, when known
    data: bytes | None = None  # the whole file, kept for ld.so.conf from compressed layers
    loads: bool | None = None  # a Python source: whether it holds a loader's name (None: not looked at yet)


class _Prefixed:
    """A stream whose first bytes were already read: them, then the rest."""

    def __init__(self, head: bytes, rest):
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = self.head, b""
            return out
        return self.rest.read(n)


class _HashingReader:
    """Passes reads through and hashes them (a compressed layer's uncompressed bytes = diff_id);
    refuses to pass more than `limit` bytes (a layer that inflates without end)."""

    def __init__(self, raw, limit: int, why: str):
        self.raw, self.sha = raw, hashlib.sha256()
        self.limit, self.why, self.count = limit, why, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # all of it: still counted as it comes
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        data = self.raw.read(n)
        self.count += len(data)
        if self.count > self.limit:
            raise InputError(self.why)
        self.sha.update(data)
        return data

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return self.sha.hexdigest()


def _compression(layer: LayerRef) -> str | None:
    magic = layer.blob.pread(4, 0)
    if magic[:2] == b"\x1f\x8b":
        return "gzip"
    if magic == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return None


def _may_be_tar(head: bytes, size: int) -> bool:
    """Whether a file may be a tar (its size a whole number of 512-byte blocks, its first bytes
    a member name padded with NULs): only those are read as far as the tar magic."""
    return size >= 1024 and size % 512 == 0 and 32 <= head[:1][0] < 127 and b"\0" in head[:100] \
        if head else False


def _peeked(fh, n: int) -> bytes | InputError:
    try:
        return peek_stream(fh, n)
    except InputError as exc:
        return exc


def _decompressed(layer: LayerRef, kind: str):
    return open_reader(kind, Region(layer.blob.fd, layer.blob.offset, layer.blob.size))


class ImageTree:
    """The final filesystem of an image; implements fs.FileSystem with absolute image paths."""

    def __init__(self, image: Image, max_bytes: int = 16 << 30, max_ratio: float = 100.0):
        """max_bytes, max_ratio: what one compressed layer may inflate to, in bytes and as a
        multiple of its compressed size (from 64 MiB up): check's archive limits."""
        self.image = image
        self.max_bytes, self.max_ratio = max_bytes, max_ratio
        self.entries: dict[str, Entry] = {"/": Entry("dir", -1, -1)}
        self.children: dict[str, set[str]] = {"/": set()}
        self.compression = [_compression(layer) for layer in image.layers]
        self._parsed: dict[tuple[int, int], ElfInfo | Exception] = {}
        self._pattern = None
        self._kept_bytes = 0  # of the files kept whole (_kept), within _KEEP_TOTAL
        self._python: list[tuple[str, Entry]] | None = None  # python_sources(), once found
        # every blob is hashed on its own thread (hashlib releases the GIL) while the layers'
        # headers are read; nothing read is kept unless its blob's digest checks out
        with ThreadPoolExecutor(max_workers=max(1, min(len(image.layers), os.cpu_count() or 1))) as pool:
            digests = [pool.submit(verify_blob, image.label, layer) for layer in image.layers]
            try:
                for i, layer in enumerate(image.layers):
                    self._apply(i, self._scan(i, layer, digests[i]))
            finally:
                for d in digests:
                    d.cancel()

    # -- building ----------------------------------------------------------------------------
    def _scan(self, i: int, layer: LayerRef, digest: Future) -> list[tuple[str, tarfile.TarInfo, Entry | None]]:
        label = f"{self.image.label}: layer {layer.index}"
        kind = self.compression[i]
        out = []
        try:
            if kind is None:
                with tarfile.open(fileobj=Region(layer.blob.fd, layer.blob.offset, layer.blob.size), mode="r:") as tf:
                    for n, m in enumerate(tf):
                        out.append(self._member(label, i, n, m, None))
                got = digest.result()
                if layer.diff_id and got != layer.diff_id.removeprefix("sha256:"):
                    raise InputError(f"{label}: digest mismatch: the config's diff_id does not match the layer")
            else:
                limit, why = self._limit(label, layer)
                stream = _HashingReader(_decompressed(layer, kind), limit, why)
                with tarfile.open(fileobj=stream, mode="r|") as tf:
                    for n, m in enumerate(bounded_members(tf, limit, why)):
                        out.append(self._member(label, i, n, m, tf))
                got = stream.drain()
                digest.result()
                if layer.diff_id and got != layer.diff_id.removeprefix("sha256:"):
                    raise InputError(f"{label}: digest mismatch: the config's diff_id does not match the "
                                     f"uncompressed layer")
        except InputError:
            _digest_first(label, layer, digest, kind)
            raise
        except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError, MemoryError) as exc:
            _digest_first(label, layer, digest, kind)
            raise InputError(f"{label}: not a readable {kind or 'tar'} layer ({_line(exc)})") from None
        except Exception as exc:  # zstandard.ZstdError and friends
            if type(exc).__module__.startswith("zstandard"):
                _digest_first(label, layer, digest, kind)
                raise InputError(f"{label}: not a readable zstd layer ({_line(exc)})") from None
            raise
        return out

    def _limit(self, label: str, layer: LayerRef) -> tuple[int, str]:
        return inflation_limit(f"{label}:", layer.blob.size, self.max_ratio, self.max_bytes)

    def _member(self, label: str, i: int, n: int, m: tarfile.TarInfo, stream) -> tuple:
        if n >= _MAX_ENTRIES:
            raise InputError(f"{label}: more than {_MAX_ENTRIES} members")
        path = _safe_path(label, m.name)
        if m.issym():
            _check_link(label, path, m.linkname)
            return path, m, Entry("link", i, n, target=m.linkname)
        if m.islnk():
            return path, m, None  # resolved when applied: the target's entry
        if m.isdir():
            return path, m, Entry("dir", i, n)
        if m.isreg() and not m.issparse():
            entry = Entry("file", i, n, offset=m.offset_data, size=m.size, path=path)
            if stream is not None:
                fh = stream.extractfile(m)
                entry.head = fh.read(_HEAD)
                if entry.head[:2] == b"MZ":  # a PE header lies further in: enough to tell it
                    entry.head += fh.read(HEAD_BYTES - _HEAD)
                elif _may_be_tar(entry.head, m.size):  # a tar's "ustar" lies at byte 257
                    entry.head += fh.read(_TAR_HEAD - _HEAD)
                if _kept(path) and m.size <= _KEEP and self._kept_bytes + m.size <= _KEEP_TOTAL:
                    self._kept_bytes += m.size
                    entry.data = entry.head + fh.read()
                elif is_python_source(path):  # looked at now: the stream is not read twice
                    entry.loads = stream_may_load(_Prefixed(entry.head, fh))
            return path, m, entry
        return path, m, Entry("other", i, n)

    def _apply(self, i: int, members: list) -> None:
        label = f"{self.image.label}: layer {self.image.layers[i].index}"
        for path, _m, _e in members:  # whiteouts hide what lower layers added
            base = posixpath.basename(path)
            if base == ".wh..wh..opq":
                parent = posixpath.dirname(self._where(path))
                for name in list(self.children.get(parent, ())):
                    self._remove(posixpath.join(parent, name))
            elif base.startswith(".wh."):
                self._remove(self._where(posixpath.join(posixpath.dirname(path), base[4:])))
        for path, m, entry in members:
            if posixpath.basename(path).startswith(".wh.") or path == "/":
                continue
            path = self._where(path)
            if entry is None:  # a hard link: the same bytes as its target
                target = self._where(_safe_path(label, m.linkname))
                found = self.entries.get(target)
                if found is None or found.kind != "file":
                    raise InputError(f"{label}: hard link {path} to missing file {target}")
                entry = found
            self._add(path, entry)

    def _where(self, path: str) -> str:
        """`path` with its parent directories taken through symlinks already in the tree, as
        extraction follows them (a layer's `lib/x/libfoo.so` over a lower `lib -> usr/lib` lands in
        /usr/lib/x); parents that do not exist yet are kept as named."""
        from audit.linkage.resolution.ldso import Paths

        parts = path.strip("/").split("/")
        here = "/"
        for part in parts[:-1]:
            here = posixpath.join(here, part)
            e = self.entries.get(here)
            if e is not None and e.kind == "link":
                real = Paths(None, self).real(here)
                if real is not None and self.entries[real].kind == "dir":
                    here = real
        return posixpath.join(here, parts[-1])

    def _add(self, path: str, entry: Entry) -> None:
        old = self.entries.get(path)
        if old is not None and old.kind == "dir" and entry.kind == "dir":
            return  # directories merge
        if old is not None:
            self._remove(path)
        parent = posixpath.dirname(path)
        if self.entries.get(parent) is None or self.entries[parent].kind != "dir":
            self._add(parent, Entry("dir", entry.layer, -1))  # implied by the member's path
        self.entries[path] = entry
        self.children[parent].add(posixpath.basename(path))
        if entry.kind == "dir":
            self.children.setdefault(path, set())

    def _remove(self, path: str) -> None:
        """A whiteout: the entry and, for a folder, everything under it (without recursion: a
        layer may nest deep; a folder's children go with it, so a child's parent may be gone)."""
        if path not in self.entries or path == "/":
            return
        stack = [path]
        while stack:
            cur = stack.pop()
            stack.extend(posixpath.join(cur, name) for name in self.children.pop(cur, ()))
            self.entries.pop(cur, None)
            self.children.get(posixpath.dirname(cur), set()).discard(posixpath.basename(cur))

    # -- what the audit reads ----------------------------------------------------------------
    def elf_files(self) -> list[tuple[str, Entry, bool]]:
        """(path, entry, first use of its bytes) of every regular file of an audited format (ELF,
        PE, Mach-O, COFF object), sorted by path; of hard-linked names, the member's own name comes first."""
        paths = [p for p in sorted(self.entries)
                 if self.entries[p].kind == "file" and self._kind(self.entries[p]) in AUDITED]
        first: dict[tuple[int, int], str] = {}
        for p in paths:
            e = self.entries[p]
            key = (e.layer, e.member)
            if key not in first or p == e.path:
                first[key] = p
        return [(p, self.entries[p], first[(self.entries[p].layer, self.entries[p].member)] == p) for p in paths]

    def archives(self) -> list[tuple[str, Entry, str]]:
        """(path, entry, "zip" | "tar" | "deb" | "rpm" | "cpio" | "compressed") of every regular file of the
        final tree that is a zip archive (a jar, an egg, a wheel, a .conda package), a Debian or RPM
        package, a newc cpio archive, a tar (by its name: `.tar`, `.tar.gz`, `.tgz`, `.tar.xz`, `.tar.zst`) or a file
        compressed on its own (libx.so.gz: peek_compressed says what it holds), sorted by path; one
        name of each hard-linked set."""
        out, seen = [], set()
        for p in sorted(self.entries):
            e = self.entries[p]
            if e.kind != "file" or (e.layer, e.member) in seen:
                continue
            head = self._head(e, _TAR_HEAD if _may_be_tar(self._head(e, _HEAD), e.size) else 24)
            kind = "deb" if is_deb(head) else "rpm" if is_rpm(head) else "cpio" if is_newc_cpio(head) \
                else "zip" if is_zip(head) \
                else "tar" if p.endswith(_TAR_NAMES) or looks_like_tar(head) \
                else "compressed" if compression(head) else None
            if kind in ("deb", "rpm", "cpio") or kind and self._kind(e) is Kind.NOT_BINARY:
                seen.add((e.layer, e.member))
                out.append((p, e, kind))
        return out

    def peek_compressed(self, entries: list[Entry], n: int) -> dict[tuple[int, int], bytes | InputError]:
        """The first `n` bytes, decompressed, of each file compressed on its own among `entries`
        (or why they cannot be had), by (layer, member): a compressed layer is decompressed once
        for all of its own, not once a file (most such files are data: man pages, changelogs)."""
        out: dict[tuple[int, int], bytes | InputError] = {}
        by_layer: dict[int, set[int]] = {}
        for e in entries:
            by_layer.setdefault(e.layer, set()).add(e.member)
        for i, members in sorted(by_layer.items()):
            blob = self.image.layers[i].blob
            if self.compression[i] is None:
                for e in entries:
                    if e.layer == i:
                        out[(i, e.member)] = _peeked(Region(blob.fd, blob.offset + e.offset, e.size), n)
                continue
            try:
                with tarfile.open(fileobj=_decompressed(self.image.layers[i], self.compression[i]), mode="r|") as tf:
                    for k, m in enumerate(tf):
                        if k in members:
                            out[(i, k)] = _peeked(tf.extractfile(m), n)
            except Exception:  # noqa: BLE001  read once already; now unreadable: each left out is an error below
                pass
        for e in entries:
            out.setdefault((e.layer, e.member), InputError("the layer could not be read again"))
        return out

    def python_sources(self) -> list[tuple[str, Entry]]:
        """(path, entry) of every regular Python file of the final tree that holds a library
        loader's name (audit/python_source), sorted by path; one name of each hard-linked set.
        Found once (the tree no longer changes): the inputs ask, then each compressed layer."""
        if self._python is None:
            self._python = self._find_python_sources()
        return self._python

    def _find_python_sources(self) -> list[tuple[str, Entry]]:
        out, seen = [], set()
        for p in sorted(self.entries):
            e = self.entries[p]
            if e.kind != "file" or (e.layer, e.member) in seen or not is_python_source(p):
                continue
            if e.loads is None:  # an uncompressed layer: read in place, in chunks
                e.loads = stream_may_load(Region(self.image.layers[e.layer].blob.fd,
                                                 self.image.layers[e.layer].blob.offset + e.offset, e.size))
            if e.loads and self._kind(e) is Kind.NOT_BINARY:
                seen.add((e.layer, e.member))
                out.append((p, e))
        return out

    def other_binaries(self) -> list[tuple[str, Entry, Kind]]:
        """(path, entry, kind) of every regular file of the final tree that is a binary of a
        format the audit does not read on its own (static archives, fatbins, ...), sorted by path; one name
        of each hard-linked set."""
        out, seen = [], set()
        for p in sorted(self.entries):
            e = self.entries[p]
            if e.kind != "file" or (e.layer, e.member) in seen:
                continue
            kind = self._kind(e)
            if kind.binary and kind not in AUDITED and kind is not Kind.RPM_PACKAGE \
                    and not is_deb(head := self._head(e, 24)) and not is_newc_cpio(head):  # archives() has these
                seen.add((e.layer, e.member))
                out.append((p, e, kind))
        return out

    def names_of(self, files: list[str]) -> list[str]:
        """`files` and every symlink of the tree that leads to one of them, sorted."""
        from audit.linkage.resolution.ldso import Paths

        wanted, paths = set(files), Paths(None, self)
        links = [p for p, e in self.entries.items() if e.kind == "link" and paths.real(p) in wanted]
        return sorted(wanted.union(links))

    def layer_of(self, entry: Entry) -> dict:
        return self.image.layers[entry.layer].describe()

    def _kind(self, e: Entry) -> Kind:
        head = self._head(e, _HEAD)
        if head[:2] == b"MZ":  # a PE header lies further in
            head = self._head(e, HEAD_BYTES)
        return identify(head, e.size)

    def _head(self, e: Entry, n: int) -> bytes:
        if e.head is None or (len(e.head) < n and len(e.head) < e.size and self.compression[e.layer] is None):
            e.head = self.image.layers[e.layer].blob.pread(max(n, _HEAD), e.offset)[:e.size]
        return e.head[:n]

    def _real_entry(self, path: str) -> Entry | None:
        from audit.linkage.resolution.ldso import Paths

        real = Paths(None, self).real(path)
        return self.entries.get(real) if real else None

    def kind(self, path: str) -> str | None:
        e = self.entries.get(posixpath.normpath(path) if path.startswith("/") else path)
        return e.kind if e else None

    def readlink(self, path: str) -> str:
        e = self.entries.get(path)
        if e is None or e.kind != "link":
            raise OSError(f"{path}: not a symlink")
        return e.target

    def head(self, path: str, n: int) -> bytes:
        e = self._real_entry(path)
        return self._head(e, n) if e is not None and e.kind == "file" else b""

    def read_text(self, path: str, limit: int) -> str | None:
        e = self._real_entry(path)
        if e is None or e.kind != "file":
            return None
        if e.data is not None:
            data = e.data
        elif self.compression[e.layer] is None:
            data = self.image.layers[e.layer].blob.pread(min(e.size, limit), e.offset)
        else:
            return None
        return data[:limit].decode("utf-8", errors="replace")

    def listdir(self, path: str) -> list[str] | None:
        from audit.linkage.resolution.ldso import Paths

        real = Paths(None, self).real(path)
        if real is None or self.entries[real].kind != "dir":
            return None
        return sorted(self.children.get(real, ()))

    def size(self, path: str) -> int:
        e = self._real_entry(path)
        return e.size if e is not None and e.kind == "file" else 0

    def shareable(self, path: str) -> bool:
        # an uncompressed layer is read with pread on a file descriptor a forked worker inherits;
        # a compressed one is decompressed once, in the process that holds the parsed results
        e = self._real_entry(path)
        return e is not None and self.compression[e.layer] is None

    def read_elf(self, path: str, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
                 markers: tuple[bytes, ...] = ()) -> ElfInfo:
        from audit.elf.reader import assembled_names_in

        e = self._real_entry(path)
        name = f"{self.image.label}!{path}"
        if e is None or e.kind != "file":
            raise InputError(f"{name}: not a regular file in the image")
        if self.compression[e.layer] is None:
            info = _read_buffer(name, self._bytes(e), symbol_pattern, api_prefixes, markers)
        else:
            key = (e.layer, e.member)
            if key not in self._parsed:
                self._parse_layer(e.layer, symbol_pattern, api_prefixes, markers)
            info = self._parsed.get(key) or InputError(f"{name}: could not be read back from its layer")
            if isinstance(info, Exception):
                raise info
        if isinstance(info, ElfInfo):
            # the code scan for assembled library names runs on demand (rarely): the bytes are read again
            info.read_assembled_names = lambda: assembled_names_in(self._bytes(e))
        return info

    def _bytes(self, e: Entry) -> bytes:
        """A file's bytes: read in place, or found by decompressing its layer again."""
        if self.compression[e.layer] is None:
            return self.image.layers[e.layer].blob.pread(e.size, e.offset)
        try:
            with tarfile.open(fileobj=_decompressed(self.image.layers[e.layer], self.compression[e.layer]),
                              mode="r|") as tf:
                for n, m in enumerate(tf):
                    if n == e.member:
                        return tf.extractfile(m).read()
        except Exception:  # noqa: BLE001  read once already; now unreadable: nothing more to find
            pass
        return b""

    def _parse_layer(self, i: int, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
                     markers: tuple[bytes, ...] = ()) -> None:
        """Decompress layer i again; parse each of its audited files that the final tree still shows."""
        wanted = {e.member: path for path, e, _ in reversed(self.elf_files()) if e.layer == i}
        wanted.update((e.member, path) for path, e in self.python_sources() if e.layer == i)
        layer = self.image.layers[i]
        try:
            with tarfile.open(fileobj=_decompressed(layer, self.compression[i]), mode="r|") as tf:
                for n, m in enumerate(tf):
                    if n in wanted:
                        name = f"{self.image.label}!{wanted[n]}"
                        try:
                            self._parsed[(i, n)] = _read_buffer(name, tf.extractfile(m).read(), symbol_pattern,
                                                                api_prefixes, markers)
                        except InputError as exc:
                            self._parsed[(i, n)] = exc
        except Exception as exc:  # it was readable in the first pass: the file changed under us
            for n, path in wanted.items():
                self._parsed.setdefault((i, n), InputError(f"{self.image.label}!{path}: cannot read: {_line(exc)}"))


def _read_buffer(name: str, data: bytes, symbol_pattern, api_prefixes: tuple[bytes, ...],
                 markers: tuple[bytes, ...] = ()):
    """A file of the image read by its format's reader, as read_binary reads one on this machine:
    an ElfInfo, a PE file's BinaryInfo, a Mach-O file's BinaryInfo (a list, one per slice, for a
    universal binary)."""
    kind = identify(data[:HEAD_BYTES], len(data))
    if kind is Kind.NOT_BINARY and is_python_source(name):
        return read_python_buffer(name, data)
    if kind in PE_KINDS:
        from audit.pe.reader import read_pe_buffer

        return read_pe_buffer(name, data, len(data), symbol_pattern, api_prefixes, markers=markers)
    if kind in MACHO_KINDS:
        from audit.macho.reader import read_macho_buffer

        slices = read_macho_buffer(name, data, len(data), symbol_pattern, api_prefixes, markers=markers)
        return slices if len(slices) > 1 else slices[0]
    from audit.elf.reader import read_elf_buffer

    return read_elf_buffer(name, data, symbol_pattern, api_prefixes=api_prefixes, markers=markers)


def _digest_first(label: str, layer: LayerRef, digest: Future, kind: str | None) -> None:
    """A layer that fails to read may simply be damaged: say so when its digest shows it."""
    got = digest.result()  # raises the mismatch against the blob's own descriptor
    if kind is None and layer.diff_id and got != layer.diff_id.removeprefix("sha256:"):
        raise InputError(f"{label}: digest mismatch: the config's diff_id does not match the layer")


def _safe_path(label: str, name: str) -> str:
    """A member name as an absolute image path; '..' or an absolute name is hostile input."""
    raw = name
    while name.startswith("./"):
        name = name[2:]
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\0" in name:
        raise InputError(f"{label}: unsafe member path {raw!r}")
    return "/" + "/".join(parts)


def _check_link(label: str, path: str, target: str) -> None:
    """A symlink whose target climbs above the image root is hostile: an extracting tool
    would write through it outside the root (ld.so in the container would stop at /)."""
    depth = 0 if target.startswith("/") else path.count("/") - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise InputError(f"{label}: symlink {path} -> {target!r} escapes the image root")
        elif part not in ("", "."):
            depth += 1


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

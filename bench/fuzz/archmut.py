"""Structure-aware cases around the ELF seeds: folders, wheels, conda packages, container images,
policies and baselines.

An archive is built from a list of members, the members are mutated (hostile names, links
pointing out of the archive at the canary folder, duplicates, FIFOs and devices, declared sizes
that lie, small bombs), then it is written, and sometimes its bytes are damaged after writing.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import random
import struct
import tarfile
import zipfile
from dataclasses import dataclass, field

NAMES = [
    "../escape.so", "../../../../../../tmp/escape.so", "/abs/escape.so", "a/../../escape.so", "./a//b/./lib.so",
    "lib\n::error file=x::forged.so", "lib\x1b[31mred.so", "lib\r\n::add-mask::x.so", "::warning::lib.so",
    "lib\u202eos.so", "lib,title=x:y.so", "lib%0A::error::x.so", "d" * 255 + "/lib.so", "x" * 300 + ".so",
    "lib\udcff\udcfe.so", "lib.so/", "", ".", "..", "a/.", "lib<&>\"'.so",
]


@dataclass
class Case:
    family: str
    files: list = field(default_factory=list)  # ("file", rel, bytes) | ("symlink", rel, target) | ("fifo", rel) | ("dir", rel)
    inputs: list = field(default_factory=list)  # paths relative to the case's input folder
    check_args: list = field(default_factory=list)
    inspect_args: list = field(default_factory=list)
    usage_ok: bool = False  # a policy or baseline mutation: exit 2 is a right answer
    outside_ok: bool = False  # host-mode input: its links may lead anywhere on this machine
    notes: list = field(default_factory=list)
    primary: bytes | None = None  # the mutated ELF, kept by the feedback corpus


# -- tar ---------------------------------------------------------------------------------------
def tar_bytes(entries, rng: random.Random | None = None) -> bytes:
    """entries: ("file", name, data) | ("dir", name) | ("symlink", name, target) |
    ("hardlink", name, target) | ("fifo", name) | ("chr", name, major, minor) |
    ("bigfile", name, data, declared)"""
    buf = io.BytesIO()
    fmt = tarfile.PAX_FORMAT if rng is None or rng.random() < 0.7 else tarfile.GNU_FORMAT
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for e in entries:
            kind, name = e[0], e[1]
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.mode = 0, 0o755
            if kind == "file":
                ti.size = len(e[2])
                tf.addfile(ti, io.BytesIO(e[2]))
            elif kind == "bigfile":  # the header's size is fixed up after writing
                ti.size = len(e[2])
                tf.addfile(ti, io.BytesIO(e[2]))
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind in ("symlink", "hardlink"):
                ti.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                ti.linkname = e[2]
                tf.addfile(ti)
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
                tf.addfile(ti)
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, e[2], e[3]
                tf.addfile(ti)
    data = bytearray(buf.getvalue())
    for e in entries:
        if e[0] == "bigfile":
            _declare_size(data, e[1], e[3])
    return bytes(data)


def _declare_size(data: bytearray, name: str, size: int) -> None:
    """Rewrite a ustar header's size field (octal or base-256) and its checksum."""
    key = name.encode("utf-8", "surrogateescape")[:100]
    pos = 0
    while pos + 512 <= len(data):
        head = data[pos:pos + 512]
        if head[:len(key)] == key and head[156] in (0, ord("0")):
            if size < 8 ** 11:
                data[pos + 124:pos + 136] = b"%011o\0" % size
            else:
                data[pos + 124:pos + 136] = b"\x80" + size.to_bytes(11, "big")
            data[pos + 148:pos + 156] = b"        "
            data[pos + 148:pos + 156] = b"%06o\0 " % sum(data[pos:pos + 512])
            return
        pos += 512


_BOMBS: dict[str, bytes] = {}  # compressed once per process


class Builder:
    def __init__(self, rng: random.Random, seeds: dict[str, bytes], elfmut, canary: str):
        self.rng = rng
        self.seeds = seeds
        self.elfmut = elfmut
        self.canary = canary  # absolute path of the folder no run may open
        self.elf_names = [k for k in seeds if k not in ("pe", "coff", "clr", "deb", "rpm", "cpio", "baseline")]

    # -- pieces
    def elf(self, case: Case, mutate: float = 0.5) -> bytes:
        name = self.rng.choice(self.elf_names)
        data = self.seeds[name]
        if self.rng.random() < mutate:
            data, notes = self.elfmut.mutate(data)
            case.notes.append(f"{name}: " + "; ".join(notes))
            case.primary = data
        return data

    def damaged(self, case: Case, data: bytes, span: int = 512) -> bytes:
        """A non-ELF seed as it is, cut short, or with a few of its first `span` bytes changed
        (its headers and tables)."""
        r = self.rng.randrange(3)
        if r == 0:
            return data
        if r == 1:
            cut = self.rng.randrange(1, len(data))
            case.notes.append(f"non-ELF seed cut to {cut} bytes")
            return data[:cut]
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 8)):
            at = self.rng.randrange(min(len(out), span))
            out[at] = self.rng.choice([0, 0xFF, 0x7F, 0x80, self.rng.randrange(256)])
        case.notes.append("non-ELF seed with header bytes changed")
        return bytes(out)

    def escape(self, rel_up: int = 12) -> str:
        return "../" * rel_up + self.canary.lstrip("/")

    def canary_target(self) -> str:
        return self.rng.choice([self.canary + "/secret.so", self.canary, self.escape() + "/secret.so",
                                self.escape(), self.canary + "/etc", self.canary + "/"])

    def hostile_name(self) -> str:
        return self.rng.choice(NAMES)

    def tar_mutations(self, entries: list, prefix: str, case: Case) -> list:
        """Mutations of a member list, shared by conda packages and image layers."""
        files = [e for e in entries if e[0] == "file"]
        for _ in range(self.rng.choice([1, 1, 2, 3])):
            r = self.rng.randrange(14)
            victim = self.rng.choice(files)[1] if files else prefix + "lib.so"
            if r == 0:
                entries.append(("symlink", prefix + "libout.so", self.canary_target()))
                case.notes.append("symlink member -> canary")
            elif r == 1:  # a link, then a file written through it
                entries.append(("symlink", prefix + "sub", self.rng.choice([self.canary, self.escape()])))
                entries.append(("file", prefix + "sub/libthrough.so", self.seeds["dep"]))
                case.notes.append("symlink dir -> canary, then a file through it")
            elif r == 2:
                chain = [f"{prefix}l{i}.so" for i in range(self.rng.choice([3, 40, 60]))]
                for a, b in zip(chain, chain[1:]):
                    entries.append(("symlink", a, b.rsplit("/", 1)[-1]))
                entries.append(("symlink", chain[-1], self.rng.choice([self.canary_target(), chain[0].rsplit("/", 1)[-1]])))
                case.notes.append(f"symlink chain of {len(chain)}")
            elif r == 3:
                entries.append(("symlink", prefix + "loop.so", "loop.so"))
                entries.append(("symlink", prefix + "dirloop", "."))
                case.notes.append("symlink loops")
            elif r == 4:
                entries.append(("hardlink", prefix + "libhl.so", self.rng.choice(
                    [self.canary + "/secret.so", self.escape() + "/secret.so", victim, prefix + "missing.so",
                     prefix + "libhl.so"])))
                case.notes.append("hard link")
            elif r == 5:
                entries.append(("fifo", prefix + "libfifo.so"))
                case.notes.append("FIFO member")
            elif r == 6:
                entries.append(("chr", prefix + "libzero.so", 1, 5))
                case.notes.append("character device member (/dev/zero)")
            elif r == 7:
                name = self.hostile_name()
                entries.append(("file", name if self.rng.random() < 0.5 else prefix + name, self.elf(case)))
                case.notes.append(f"member named {name[:40]!r}")
            elif r == 8:  # duplicate name, other content
                entries.append(("file", victim, self.rng.choice([self.elf(case), b"not an elf", b""])))
                case.notes.append(f"duplicate member {victim}")
            elif r == 9:
                entries.append(("bigfile", prefix + "libbig.so", self.seeds["dep"][:4096],
                                self.rng.choice([1 << 33, 1 << 62, 10 ** 12])))
                case.notes.append("a header declaring a huge size")
            elif r == 10 and files:
                # by position: an earlier round may have replaced the tuple `files` holds
                i = self.rng.choice([k for k, e in enumerate(entries) if e[0] == "file"])
                entries[i] = ("file", entries[i][1], self.elf(case, mutate=1.0))
            elif r == 11:
                entries.append(("symlink", prefix + "libdangling.so", "/nonexistent/libx.so"))
                entries.append(("symlink", prefix + "libabs.so", "/usr/lib/libfkdep.so"))
                case.notes.append("dangling and absolute symlinks")
            elif r == 12:
                entries.insert(0, ("file", victim, self.elf(case)))  # a file, then a link of the same name
                entries.append(("symlink", victim, self.canary_target()))
                case.notes.append("file replaced by a symlink -> canary")
            else:
                entries.append(("dir", prefix + self.hostile_name()))
                case.notes.append("hostile directory name")
        return entries

    def damage(self, data: bytes, case: Case, what: str) -> bytes:
        r = self.rng.random()
        if r < 0.5:
            cut = self.rng.randrange(1, max(2, len(data)))
            case.notes.append(f"{what} truncated at {cut}")
            return data[:cut]
        buf = bytearray(data)
        for _ in range(self.rng.randint(1, 8)):
            buf[self.rng.randrange(len(buf))] = self.rng.randrange(256)
        case.notes.append(f"{what}: bytes damaged")
        return bytes(buf)

    def bomb(self, kind: str) -> bytes:
        """65 MiB of zeros compressed (a ~1000:1 member over the 64 MiB ratio floor), made once."""
        if kind not in _BOMBS:
            zeros = bytes(65 << 20)
            if kind == "gzip":
                _BOMBS[kind] = gzip.compress(zeros, compresslevel=9, mtime=0)
            elif kind == "zip":
                buf = io.BytesIO()
                with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                    zf.writestr("pkg/libbomb.so", zeros)
                _BOMBS[kind] = buf.getvalue()
        return _BOMBS[kind]

    # -- families
    def elf_case(self, corpus: list[bytes]) -> Case:
        case = Case("elf", outside_ok=True)
        if corpus and self.rng.random() < 0.3:
            base, src = self.rng.choice(corpus), "corpus"
        else:
            src = self.rng.choice(self.elf_names)
            base = self.seeds[src]
        data, notes = self.elfmut.mutate(base)
        case.notes.append(f"{src}: " + "; ".join(notes))
        case.primary = data
        name = "lib.so" if self.rng.random() < 0.85 else self.hostile_name().replace("/", "_") or "x"
        case.files.append(("file", name, data))
        case.inputs.append(name)
        return case

    def folder_case(self) -> Case:
        case = Case("folder", outside_ok=True)
        case.files.append(("dir", "d"))
        case.files.append(("file", "d/libfkdep.so", self.seeds["dep"]))
        case.files.append(("file", "d/libmut.so", self.elf(case, mutate=0.7)))
        for _ in range(self.rng.randint(1, 4)):
            r = self.rng.randrange(8)
            if r == 0:
                case.files.append(("file", "d/fk.dll", self.seeds["pe"]))
                case.notes.append("PE DLL beside the ELF")
                if "coff" in self.seeds:  # a COFF object, read as an archive member is
                    case.files.append(("file", "d/fk.obj", self.damaged(case, self.seeds["coff"])))
                if "clr" in self.seeds:  # a managed assembly: its CLI metadata lies past the headers
                    clr = self.seeds["clr"]
                    case.files.append(("file", "d/managed.dll", self.damaged(case, clr, len(clr))))
            elif r == 1:
                case.files.append(("fifo", "d/libfifo.so"))
                case.notes.append("FIFO in the folder")
            elif r == 2:
                case.files.append(("symlink", "d/loop.so", "loop.so"))
                case.files.append(("symlink", "d/sub", "."))
                case.notes.append("symlink loops")
            elif r == 3:
                name = "d/" + self.hostile_name().replace("/", "_")
                if name != "d/":
                    case.files.append(("file", name, self.elf(case)))
                    case.notes.append(f"file named {name[:40]!r}")
            elif r == 4:
                case.files.append(("file", "d/pkg-1.0-py3-none-any.whl", self.wheel_bytes(Case("wheel"))))
                case.notes.append("a wheel in the folder")
            elif r == 5:
                case.files.append(("file", "d/x.tar", self.rng.choice([tar_bytes([("file", "a.so", self.seeds["dep"])]),
                                                                       b"\0" * 1024, self.image_bytes(Case("image"))])))
                case.notes.append("a tar in the folder")
            elif r == 6:
                case.files.append(("symlink", "d/libdev.so", "/dev/zero"))
                case.files.append(("file", "d/_load.py", self.python_source(case)))
                case.files.append(("file", "d/app.jar", self.jar(case)))
                case.notes.append("symlink to /dev/zero; a Python source; a jar")
                if "deb" in self.seeds:  # a Debian package, its data.tar damaged at times
                    deb = self.seeds["deb"]
                    case.files.append(("file", "d/fk_1.0_amd64.deb", self.damaged(case, deb, len(deb))))
                if "rpm" in self.seeds:  # an RPM package, its headers or payload damaged at times
                    rpm = self.seeds["rpm"]
                    case.files.append(("file", "d/fk-1.0-1.x86_64.rpm", self.damaged(case, rpm, len(rpm))))
                if "cpio" in self.seeds:  # a newc cpio archive, its headers damaged or cut at times
                    cpio = self.seeds["cpio"]
                    case.files.append(("file", "d/initrd.cpio", self.damaged(case, cpio, len(cpio))))
                case.files.append(("file", "d/libz.so.gz", self.compressed(case)))
            else:
                case.files.append(("file", "d/empty.so", b""))
                case.files.append(("file", "d/short.so", b"\x7fELF\x02\x01"))
                case.notes.append("empty and 6-byte ELF")
        case.inputs.append("d")
        return case

    def compressed(self, case: Case) -> bytes:
        """A mutated ELF compressed on its own (gzip, xz, bzip2 or zstd), at times compressed
        twice, cut, damaged, or a bomb of zeros behind an ELF header."""
        import bz2
        import gzip
        import lzma

        import zstandard

        r = self.rng.randrange(5)
        # a bomb (past the 64 MiB floor) is made by the fast compressors only: bzip2 and xz of
        # 70 MiB would cost seconds a case
        how = self.rng.choice(["gzip", "zstd"] if r == 4 else ["gzip", "xz", "bzip2", "zstd"])
        pack = {"gzip": gzip.compress, "xz": lzma.compress, "bzip2": bz2.compress,
                "zstd": lambda b: zstandard.ZstdCompressor().compress(b)}[how]
        body = self.elf(case) + (bytes(70 << 20) if r == 4 else b"")
        data = pack(pack(body) if r == 1 else body)
        if r == 2:
            data = data[:self.rng.randrange(1, max(2, len(data)))]
        elif r == 3:
            data = self.damaged(case, data)
        case.notes.append(f"a {how} file ({['plain', 'twice', 'cut', 'damaged', 'bomb'][r]})")
        return data

    def python_source(self, case: Case) -> bytes:
        """A Python module that hands library names to ctypes, mutated: bytes flipped, cut, or
        given what a parser chokes on (NUL, CR, deep nesting, a bogus coding cookie, bytes that
        are not UTF-8) or names an output must escape (control characters, workflow commands)."""
        lines = [b"import ctypes, os", b'LIBS = ["libfkdep.so", "libcublas.so.12"]', b"for lib in LIBS:",
                 b"    ctypes.CDLL(lib)", b'ctypes.cdll.LoadLibrary(os.path.join("/opt", "libcudnn.so.9"))',
                 b"h = ctypes.windll.cublas64_12"]
        r = self.rng.randrange(9)
        if r == 0:
            name = self.hostile_name().encode("utf-8", "surrogateescape").replace(b'"', b"").replace(b"\\", b"")
            lines.append(b'ctypes.CDLL("' + name + b'")')
            case.notes.append("a hostile name handed to ctypes")
        elif r == 1:
            lines.insert(self.rng.randrange(len(lines)), self.rng.choice([b"\0", b"\r::error::x", b"\xff\xfe"]))
            case.notes.append("NUL, CR or non-UTF-8 bytes in the source")
        elif r == 2:
            depth = self.rng.choice([150, 1000, 100_000])
            lines.insert(1, b"x = " + b"(" * depth + b"1" + b")" * depth)
            case.notes.append(f"nesting {depth} deep")
        elif r == 3:
            lines.insert(0, self.rng.choice([b"# -*- coding: bogus -*-", b"# coding: utf-16", b"\xef\xbb\xbf# bom"]))
            case.notes.append("a coding declaration")
        elif r == 4:
            lines.append(b'ctypes.CDLL("lib" + ' + b" + ".join([b'"x"'] * self.rng.choice([100, 20_000])) + b")")
            case.notes.append("a long chain of +")
        data = b"\n".join(lines) + b"\n"
        if r >= 5:
            data = self.damaged(case, data, len(data))
        return data

    def jar(self, case: Case, depth: int = 0) -> bytes:
        """A Java archive with a JNI library (a mutated ELF), sometimes a jar inside it (nested up
        to six deep: past the audit's limit) and sometimes damaged."""
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\n")
            zf.writestr("native/libjni.so", self.elf(case, 0.3) if depth == 0 else self.seeds["dep"])
            if depth < 6 and self.rng.random() < 0.3:
                zf.writestr("lib/inner.jar", self.jar(case, depth + 1))
                if depth == 0:
                    case.notes.append("a jar inside the jar")
        data = buf.getvalue()
        if depth == 0 and self.rng.random() < 0.15:
            data = self.damaged(case, data, len(data))
        return data

    def wheel_members(self, case: Case) -> list:
        return [["pkg/__init__.py", b"", zipfile.ZIP_DEFLATED, None],
                ["pkg/lib/libfkmain.so", self.seeds.get("main", self.seeds["dep"]), zipfile.ZIP_DEFLATED, None],
                ["pkg/lib/libfkdep.so", self.seeds["dep"], zipfile.ZIP_DEFLATED, None],
                ["pkg/lib/libmut.so", self.elf(case), zipfile.ZIP_DEFLATED, None],
                ["pkg-1.0.dist-info/METADATA", b"Name: pkg\nVersion: 1.0\n", zipfile.ZIP_DEFLATED, None],
                ["pkg-1.0.dist-info/RECORD", b"", zipfile.ZIP_DEFLATED, None],
                ["pkg/_load.py", self.python_source(case), zipfile.ZIP_DEFLATED, None],
                ["pkg/jars/app.jar", self.jar(case), zipfile.ZIP_STORED, None]]

    def wheel_bytes(self, case: Case) -> bytes:
        members = self.wheel_members(case)
        patch = []
        for _ in range(self.rng.choice([1, 1, 2, 3])):
            r = self.rng.randrange(10)
            m = self.rng.choice(members[1:4])
            if r == 0:
                m[0] = self.rng.choice(NAMES + [self.escape() + "/written.so"])
                case.notes.append(f"member renamed {m[0][:40]!r}")
            elif r == 1:
                members.append([m[0], self.rng.choice([self.seeds["dep"], b"junk"]), zipfile.ZIP_STORED, None])
                case.notes.append(f"duplicate member {m[0]}")
            elif r == 2:
                members.append(["pkg/lib/libout.so", self.canary_target().encode(), zipfile.ZIP_STORED, 0o120777])
                case.notes.append("symlink member -> canary")
            elif r == 3:
                members.append(["pkg/lib/sub", self.canary.encode(), zipfile.ZIP_STORED, 0o120777])
                members.append(["pkg/lib/sub/libthrough.so", self.seeds["dep"], zipfile.ZIP_STORED, None])
                case.notes.append("symlink dir member -> canary, then a file through it")
            elif r == 4:
                patch.append(("size", m[0], self.rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF])))
                case.notes.append(f"declared size of {m[0]} lies")
            elif r == 5:
                patch.append(("method", m[0], self.rng.choice([1, 12, 14, 99, 0xFFFF])))
                case.notes.append(f"compression method of {m[0]} changed")
            elif r == 6:
                patch.append(("flags", m[0], self.rng.choice([0x1, 0x800, 0x41])))
                m[0] = m[0].replace("libfk", "libXX")
                patch.append(("name", m[0]))
                case.notes.append("member name bytes not UTF-8 / encrypted flag")
            elif r == 7:
                case.check_args += ["--max-member-size", self.rng.choice(["1K", "8K", "1"])]
                case.notes.append("a small --max-member-size")
            elif r == 8:
                m[3] = self.rng.choice([0o010644, 0o020644, 0o060644, 0o040755])  # FIFO, chr, blk, dir modes
                case.notes.append(f"member {m[0]} with file type bits {m[3]:o}")
            else:
                case.check_args += ["--max-archive-size", self.rng.choice(["1K", "20K"])]
                case.notes.append("a small --max-archive-size")
        for m in members:  # bytes that are not UTF-8: written as XX, then patched in the headers
            if "\udcff\udcfe" in m[0]:
                m[0] = m[0].replace("\udcff\udcfe", "XX")
                patch.append(("name", m[0]))
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data, method, mode in members:
                zi = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
                zi.compress_type = method
                if mode is not None:
                    zi.external_attr = mode << 16
                    zi.create_system = 3
                with _quiet():
                    zf.writestr(zi, data)
        data = bytearray(buf.getvalue())
        for p in patch:
            _zip_patch(data, p)
        if self.rng.random() < 0.08:
            data = bytearray(self.damage(bytes(data), case, "wheel"))
        return bytes(data)

    def wheel_case(self) -> Case:
        case = Case("wheel")
        if self.rng.random() < 0.04:
            data = self.bomb("zip")
            case.notes.append("zip bomb: 65 MiB of zeros in one member")
        else:
            data = self.wheel_bytes(case)
        case.files.append(("file", "pkg-1.0-py3-none-any.whl", data))
        case.inputs.append("pkg-1.0-py3-none-any.whl")
        return case

    def conda_entries(self, case: Case) -> list:
        entries = [("dir", "lib"), ("file", "lib/libfkmain.so", self.seeds.get("main", self.seeds["dep"])),
                   ("file", "lib/libfkdep.so", self.seeds["dep"]), ("file", "lib/libmut.so", self.elf(case, 0.3)),
                   ("file", "info/index.json", b'{"name": "pkg", "version": "1.0"}')]
        return self.tar_mutations(entries, "lib/", case)

    def conda_case(self) -> Case:
        case = Case("conda")
        entries = self.conda_entries(case)
        if self.rng.random() < 0.6:
            raw = tar_bytes(entries, self.rng)
            data = bz2.compress(raw, 1)
            if self.rng.random() < 0.1:
                data = self.damage(data, case, "bz2 stream")
            name = "pkg-1.0-0.tar.bz2"
        else:
            import zstandard

            pkg = zstandard.ZstdCompressor().compress(tar_bytes(entries, self.rng))
            info = zstandard.ZstdCompressor().compress(tar_bytes([("file", "info/index.json", b"{}")]))
            if self.rng.random() < 0.1:
                pkg = self.damage(pkg, case, "zstd stream")
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as zf:
                zf.writestr("metadata.json", '{"conda_pkg_format_version": 2}')
                zf.writestr(self.rng.choice(["pkg-pkg-1.0-0.tar.zst", "pkg-../../x.tar.zst"]), pkg)
                zf.writestr("info-pkg-1.0-0.tar.zst", info)
            data = buf.getvalue()
            name = "pkg-1.0-0.conda"
        case.files.append(("file", name, data))
        case.inputs.append(name)
        return case

    def image_bytes(self, case: Case) -> bytes:
        base = [("dir", "usr/"), ("dir", "usr/lib/"), ("file", "usr/lib/libfkmain.so", self.seeds.get("main", self.seeds["dep"])),
                ("dir", "etc/"), ("file", "etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n/usr/lib\n")]
        top = [("file", "usr/lib/libfkdep.so", self.seeds["dep"]), ("file", "usr/lib/libmut.so", self.elf(case, 0.3)),
               ("file", "usr/lib/app.jar", self.jar(case))]
        if self.rng.random() < 0.3:  # a tarball in the image: its members are read, confined to it
            inner = tar_bytes([("file", "sdk/libfkdep.so", self.seeds["dep"]), ("file", "sdk/_load.py", self.python_source(case))],
                              self.rng)
            top.append(("file", "opt/sdk.tar.gz", self.damaged(case, gzip.compress(inner, mtime=0), 64)))
            case.notes.append("a tarball in the image")
        top = self.tar_mutations(top, "usr/lib/", case)
        env = ["PATH=/usr/bin"]
        r = self.rng.randrange(12)
        if r == 0:
            top.append(("file", "etc/ld.so.conf", self.rng.choice([
                b"include /etc/ld.so.conf\n", f"include {self.canary}/*.conf\n{self.canary}\n".encode(),
                b"include ../../../../*\n", b"\xff\xfe\n" * 1000])))
            case.notes.append("hostile /etc/ld.so.conf")
        elif r == 1:
            env.append(self.rng.choice([f"LD_LIBRARY_PATH={self.canary}:{self.escape()}",
                                        "LD_LIBRARY_PATH=" + ":".join(["/usr/lib"] * 5000), "LD_LIBRARY_PATH"]))
            case.notes.append("hostile Env LD_LIBRARY_PATH")
        elif r == 2:
            top.append(("file", "usr/lib/.wh..wh..opq", b""))
            top.append(("file", "usr/.wh.." + self.rng.choice(["", ".", "..", "../etc"]), b""))
            case.notes.append("whiteouts of . and ..")
        layers = [tar_bytes(base, self.rng), tar_bytes(top, self.rng)]
        how = self.rng.choice([None, None, "gzip"])
        if how == "gzip":
            layers = [gzip.compress(x, mtime=0) for x in layers]
            if self.rng.random() < 0.15:
                layers[1] = self.damage(layers[1], case, "gzip layer")
            elif self.rng.random() < 0.05:
                layers[1] = self.bomb("gzip")
                case.notes.append("gzip bomb layer: 65 MiB of zeros")
        files = self._image_files(layers, env, how, case, oci=self.rng.random() < 0.4)
        return tar_bytes([("file", n, d) for n, d in files.items()])

    def _image_files(self, layers, env, how, case: Case, oci: bool) -> dict[str, bytes]:
        sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
        raw = [gzip.decompress(x) if how == "gzip" and x[:2] == b"\x1f\x8b" and len(x) < (1 << 20) and _gz_ok(x) else x
               for x in layers]
        config = {"architecture": "amd64", "os": "linux", "config": {"Env": env},
                  "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha(x)}" for x in raw]},
                  "history": [{"created_by": "COPY . /"}, {"created_by": "RUN \x1b[2J\n::error::x"}]}
        r = self.rng.randrange(10)
        if r == 0:
            config["rootfs"]["diff_ids"] = config["rootfs"]["diff_ids"][:1]
            case.notes.append("config: fewer diff_ids than layers")
        elif r == 1:
            config = self.rng.choice([[], "x", {"rootfs": None}, {"config": {"Env": "x"}}])
            case.notes.append(f"config replaced by {json.dumps(config)[:30]}")
        cbytes = json.dumps(config).encode()
        files: dict[str, bytes] = {}
        if oci:
            suffix = "+gzip" if how == "gzip" else ""
            descs = [{"mediaType": f"application/vnd.oci.image.layer.v1.tar{suffix}", "digest": f"sha256:{sha(x)}",
                      "size": len(x)} for x in layers]
            for x in layers:
                files[f"blobs/sha256/{sha(x)}"] = x
            if r == 2:
                descs = descs * self.rng.choice([2, 200])
                case.notes.append("manifest: layers repeated")
            elif r == 3:
                descs[-1]["digest"] = self.rng.choice(["sha256:../../../../" + self.canary.lstrip("/") + "/secret.so",
                                                       "md5:abc", "sha256:" + "0" * 64, "sha256:"])
                case.notes.append(f"manifest: layer digest {descs[-1]['digest'][:40]}")
            elif r == 4:
                descs[-1]["size"] = self.rng.choice([-1, 0, 1 << 62])
                case.notes.append("manifest: layer size lies")
            files[f"blobs/sha256/{sha(cbytes)}"] = cbytes
            manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                   "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                              "digest": f"sha256:{sha(cbytes)}", "size": len(cbytes)},
                                   "layers": descs}).encode()
            files[f"blobs/sha256/{sha(manifest)}"] = manifest
            index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                        "digest": f"sha256:{sha(manifest)}", "size": len(manifest)}]}
            if r == 5:
                index["manifests"] = index["manifests"] * 3 + [{"digest": f"sha256:{sha(b'')}", "size": 0}]
                case.notes.append("index: repeated and empty manifests")
            files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
            files["index.json"] = json.dumps(index).encode()
        else:
            names = []
            for i, x in enumerate(layers):
                names.append(f"{sha(x)[:12]}{i}/layer.tar")
                files[names[-1]] = x
            files[f"{sha(cbytes)}.json"] = cbytes
            if r == 2:
                names = names * self.rng.choice([2, 200])
                case.notes.append("manifest: layers repeated")
            elif r == 3:
                names[-1] = self.rng.choice([self.escape() + "/secret.so", "/etc/passwd", "missing/layer.tar",
                                             self.canary + "/secret.so"])
                case.notes.append(f"manifest: layer path {names[-1][:40]}")
            manifest = [{"Config": f"{sha(cbytes)}.json", "RepoTags": ["app:1"], "Layers": names}]
            if r == 5:
                manifest = self.rng.choice([{}, [], [manifest[0]] * 3, [[[[[]]]]], "x",
                                            [{"Config": None, "Layers": [None]}]])
                case.notes.append("manifest.json replaced")
            files["manifest.json"] = json.dumps(manifest).encode()
        return files

    def image_case(self) -> Case:
        case = Case("image")
        data = self.image_bytes(case)
        if self.rng.random() < 0.08:
            data = self.damage(data, case, "image tar")
        case.files.append(("file", "app.tar", data))
        case.inputs.append("app.tar")
        return case

    def policy_case(self, policy_text: str) -> Case:
        case = Case("policy", usage_ok=True, outside_ok=True)
        lines = policy_text.splitlines()
        for _ in range(self.rng.randint(1, 4)):
            r = self.rng.randrange(7)
            i = self.rng.randrange(len(lines))
            if r == 0:
                del lines[i]
            elif r == 1:
                lines.insert(i, lines[self.rng.randrange(len(lines))])
            elif r == 2 and "=" in lines[i]:
                k = lines[i].split("=", 1)[0]
                lines[i] = k + "= " + self.rng.choice(['["["]', '["**"]', '["[z-a]*"]', '["\\\\"]', "1", "true",
                                                       '"' + "a" * 5000 + '"', "[[]]", '["*" ]', '{x = 1}',
                                                       '["' + "*a" * 200 + '"]', '["\\u0000"]', '["lib[!]"]'])
            elif r == 3:
                lines.insert(i, self.rng.choice(["[[rules]]", "[rules]", "[allow]", "[settings]\nunresolved = 'x'",
                                                 "id = 1", "\x00", "= =", "[[rules]]\nid = \"a\"\nsymbols = [\"*\"]"]))
            elif r == 4:
                j = self.rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            elif r == 5:
                lines[i] = lines[i][: self.rng.randrange(len(lines[i]) + 1)]
            else:
                key = self.rng.choice(["id", "sonames", "strings", "kernels"])
                lines.insert(i, key + " = " + self.rng.choice(['["["]', '"x"', "[1]", '["libc*"]']))
        case.notes.append("policy text mutated")
        case.files.append(("file", "policy.toml", "\n".join(lines).encode("utf-8", "surrogateescape")))
        case.files.append(("file", "libstatic.so", self.seeds.get("static_cublas", self.seeds["dep"])))
        case.inputs.append("libstatic.so")
        case.check_args += ["--policy", "@IN@/policy.toml"]
        case.inspect_args += ["--policy", "@IN@/policy.toml"]
        return case

    def baseline_case(self) -> Case:
        case = Case("baseline", usage_ok=True, outside_ok=True)
        base = self.seeds.get("baseline")
        doc = json.loads(base) if base else {}
        for _ in range(self.rng.randint(1, 3)):
            doc = _json_mutate(doc, self.rng)
        text = json.dumps(doc)
        r = self.rng.random()
        if r < 0.1:
            text = text[: self.rng.randrange(len(text) + 1)]
        elif r < 0.15:
            text = "[" * 100000 + "]" * 100000
        case.notes.append("baseline JSON mutated")
        case.files.append(("file", "baseline.json", text.encode()))
        for k in ("static_cublas", "dlopen_cudnn"):
            if k in self.seeds:
                case.files.append(("file", f"d/lib{k}.so", self.seeds[k]))
        case.inputs.append("d")
        case.check_args += ["--baseline", "@IN@/baseline.json"]
        return case


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def _gz_ok(x: bytes) -> bool:
    try:
        gzip.decompress(x)
        return True
    except Exception:
        return False


def _zip_patch(data: bytearray, p) -> None:
    """Edit a written zip's local and central headers of one member."""
    what, name = p[0], p[1]
    key = name.encode("utf-8", "surrogateescape")
    for sig, name_at, fields in ((b"PK\x03\x04", 30, {"flags": 6, "method": 8, "size": 22}),
                                 (b"PK\x01\x02", 46, {"flags": 8, "method": 10, "size": 24})):
        pos = 0
        while True:
            pos = data.find(sig, pos)
            if pos < 0:
                break
            nlen = struct.unpack_from("<H", data, pos + (26 if sig == b"PK\x03\x04" else 28))[0]
            if bytes(data[pos + name_at:pos + name_at + nlen]) == key:
                if what == "name":
                    data[pos + name_at:pos + name_at + nlen] = key.replace(b"XX", b"\xff\xfe")
                elif what == "flags":
                    struct.pack_into("<H", data, pos + fields["flags"], p[2])
                elif what == "method":
                    struct.pack_into("<H", data, pos + fields["method"], p[2])
                elif what == "size":
                    struct.pack_into("<I", data, pos + fields["size"], p[2])
            pos += 4


def _json_mutate(node, rng: random.Random, depth: int = 0):
    hostile = [None, 0, -1, 1 << 70, 1.5e308, "", "\x1b[2J", "::error::x", "../../x", [], {}, [[]] * 3,
               {"id": None}, "a" * 10000, True]
    if depth > 6 or rng.random() < 0.25:
        return rng.choice(hostile)
    if isinstance(node, dict) and node:
        k = rng.choice(list(node))
        r = rng.random()
        if r < 0.2:
            del node[k]
        elif r < 0.3:
            node[rng.choice(["schema", "findings", "files", k + "_x"])] = rng.choice(hostile)
        else:
            node[k] = _json_mutate(node[k], rng, depth + 1)
        return node
    if isinstance(node, list) and node:
        i = rng.randrange(len(node))
        r = rng.random()
        if r < 0.2:
            node.append(node[i])
        elif r < 0.3:
            del node[i]
        else:
            node[i] = _json_mutate(node[i], rng, depth + 1)
        return node
    return rng.choice(hostile)


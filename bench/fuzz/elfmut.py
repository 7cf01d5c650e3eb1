"""Structure-aware mutations of one ELF file, in memory.

pyelftools locates, once per seed, every field a reader trusts: the ELF header, the section and
program header tables, .dynamic entries, symbol table entries, string tables, device-code
sections (.hip_fatbin, .nv_fatbin) and SHF_COMPRESSED headers. A mutation sets one of them to an
extreme, zero, another entry's value or a near value, splices hostile strings into string
tables, or cuts the file.
"""

from __future__ import annotations

import io
import random
import struct

from elftools.elf.elffile import ELFFile

SHF_COMPRESSED = 0x800

# (name, offset, width) per class
EHDR = {
    64: [("e_type", 16, 2), ("e_machine", 18, 2), ("e_version", 20, 4), ("e_entry", 24, 8), ("e_phoff", 32, 8),
         ("e_shoff", 40, 8), ("e_flags", 48, 4), ("e_ehsize", 52, 2), ("e_phentsize", 54, 2), ("e_phnum", 56, 2),
         ("e_shentsize", 58, 2), ("e_shnum", 60, 2), ("e_shstrndx", 62, 2)],
    32: [("e_type", 16, 2), ("e_machine", 18, 2), ("e_version", 20, 4), ("e_entry", 24, 4), ("e_phoff", 28, 4),
         ("e_shoff", 32, 4), ("e_flags", 36, 4), ("e_ehsize", 40, 2), ("e_phentsize", 42, 2), ("e_phnum", 44, 2),
         ("e_shentsize", 46, 2), ("e_shnum", 48, 2), ("e_shstrndx", 50, 2)],
}
SHDR = {
    64: [("sh_name", 0, 4), ("sh_type", 4, 4), ("sh_flags", 8, 8), ("sh_addr", 16, 8), ("sh_offset", 24, 8),
         ("sh_size", 32, 8), ("sh_link", 40, 4), ("sh_info", 44, 4), ("sh_addralign", 48, 8), ("sh_entsize", 56, 8)],
    32: [("sh_name", 0, 4), ("sh_type", 4, 4), ("sh_flags", 8, 4), ("sh_addr", 12, 4), ("sh_offset", 16, 4),
         ("sh_size", 20, 4), ("sh_link", 24, 4), ("sh_info", 28, 4), ("sh_addralign", 32, 4), ("sh_entsize", 36, 4)],
}
PHDR = {
    64: [("p_type", 0, 4), ("p_flags", 4, 4), ("p_offset", 8, 8), ("p_vaddr", 16, 8), ("p_filesz", 32, 8),
         ("p_memsz", 40, 8), ("p_align", 48, 8)],
    32: [("p_type", 0, 4), ("p_offset", 4, 4), ("p_vaddr", 8, 4), ("p_filesz", 16, 4), ("p_memsz", 20, 4),
         ("p_flags", 24, 4), ("p_align", 28, 4)],
}
SYM = {
    64: [("st_name", 0, 4), ("st_info", 4, 1), ("st_other", 5, 1), ("st_shndx", 6, 2), ("st_value", 8, 8),
         ("st_size", 16, 8)],
    32: [("st_name", 0, 4), ("st_value", 4, 4), ("st_size", 8, 4), ("st_info", 12, 1), ("st_other", 13, 1),
         ("st_shndx", 14, 2)],
}
CHDR = {64: [("ch_type", 0, 4), ("ch_size", 8, 8), ("ch_addralign", 16, 8)],
        32: [("ch_type", 0, 4), ("ch_size", 4, 4), ("ch_addralign", 8, 4)]}
# dynamic tags a resolver follows: NEEDED, STRTAB, STRSZ, SONAME, RPATH, RUNPATH, SYMTAB, HASH,
# GNU_HASH, VERNEED, VERNEEDNUM, VERSYM, NULL, FILTER, AUXILIARY, AUDIT, DEPAUDIT
DT_TAGS = [1, 5, 10, 14, 15, 29, 6, 4, 0x6FFFFEF5, 0x6FFFFFFE, 0x6FFFFFFF, 0x6FFFFFF0, 0, 0x7FFFFFFF, 0x7FFFFFFD,
           0x6FFFFEFC, 0x6FFFFEFB]

# strings a binary may carry that an output must neither execute nor let through raw
HOSTILE = [
    b"libcudnn.so.9", b"libcublas.so.12", b"libopenblas.so.0",
    b"\n::error file=x.so::forged annotation", b"::warning::forged", b"x\r\n::add-mask::secret",
    b"::set-output name=x::y", b"%0A::error::percent",
    b"\x1b[2J\x1b[31mred\x1b]0;title\x07", b"\xff\xfe\xc0\xaf\xed\xa0\x80 invalid utf8",
    b"\xe2\x80\xae\xe2\x80\x8b bidi", b"../../../../../../etc/passwd", b"/dev", b"zero", b"/proc/self",
    b"$ORIGIN/../../../../../..", b"$ORIGIN:$ORIGIN:$ORIGIN:$ORIGIN:$ORIGIN:$ORIGIN", b"${LIB}/$PLATFORM",
    b"lib" + b"A" * 300 + b".so", b"a::b::c::d", b"</testcase><script>x</script>", b'"},{"injected":1',
    b"cublasSgemm_v2", b"_ZN7cutlass4gemmE", b"\x00",
]


def extremes(width: int) -> list[int]:
    top = (1 << (8 * width)) - 1
    return sorted({0, 1, 2, 0x7F, 0x80, 0xFF, top, top >> 1, (top >> 1) + 1, top - 1} & set(range(top + 1))
                  if width == 1 else {0, 1, 2, 0x7F, 0xFF, 0x100, 0xFFFF, top, top >> 1, (top >> 1) + 1, top - 1,
                                      min(top, 1 << 31), min(top, 1 << 40)})


class Layout:
    """Where the fields are, computed once per seed from the unmutated file."""

    def __init__(self, data: bytes):
        elf = ELFFile(io.BytesIO(data))
        self.size = len(data)
        self.cls = elf.elfclass
        self.end = "<" if elf.little_endian else ">"
        self.fields: dict[str, list[tuple[str, int, int]]] = {"ehdr": [(n, o, w) for n, o, w in EHDR[self.cls]]}
        self.groups: dict[str, list[list[tuple[str, int, int]]]] = {}  # kind -> entries -> fields
        self.strings: list[tuple[str, int, int]] = []  # (section, start, end)
        self.device: list[tuple[str, int, int]] = []
        self.compressed: list[tuple[str, int, int]] = []
        self.sections: list[tuple[str, int, int, int]] = []  # name, offset, size, header offset
        h = elf.header
        shents, phents = [], []
        for i in range(h["e_shnum"]):
            base = h["e_shoff"] + i * h["e_shentsize"]
            shents.append([(f"shdr[{i}].{n}", base + o, w) for n, o, w in SHDR[self.cls]])
        for i in range(h["e_phnum"]):
            base = h["e_phoff"] + i * h["e_phentsize"]
            phents.append([(f"phdr[{i}].{n}", base + o, w) for n, o, w in PHDR[self.cls]])
        self.groups["shdr"], self.groups["phdr"] = shents, phents
        dyn, syms = [], []
        w = 8 if self.cls == 64 else 4
        for idx, sec in enumerate(elf.iter_sections()):
            name, off, size, typ = sec.name, sec["sh_offset"], sec["sh_size"], sec["sh_type"]
            nobits = typ == "SHT_NOBITS"
            self.sections.append((name, off, 0 if nobits else size, h["e_shoff"] + idx * h["e_shentsize"]))
            if nobits or off + size > len(data):
                continue
            if sec["sh_flags"] & SHF_COMPRESSED:
                self.compressed.append((name, off, size))
            if typ == "SHT_DYNAMIC":
                for j in range(min(size // (2 * w), 64)):
                    b = off + j * 2 * w
                    dyn.append([(f"dyn[{j}].d_tag", b, w), (f"dyn[{j}].d_val", b + w, w)])
            elif typ in ("SHT_SYMTAB", "SHT_DYNSYM"):
                ent = 24 if self.cls == 64 else 16
                for j in range(1, min(size // ent, 200)):
                    b = off + j * ent
                    syms.append([(f"{name}[{j}].{n}", b + o, ww) for n, o, ww in SYM[self.cls]])
            elif typ == "SHT_STRTAB" or name in (".rodata", ".comment", ".gnu.version_r"):
                self.strings.append((name, off, off + size))
            if name in (".hip_fatbin", ".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment"):
                self.device.append((name, off, size))
        self.groups["dyn"], self.groups["sym"] = dyn, syms

    def all_fields(self) -> list[tuple[str, int, int]]:
        out = list(self.fields["ehdr"])
        for entries in self.groups.values():
            for e in entries:
                out += e
        return [f for f in out if f[1] + f[2] <= self.size]


class ElfMutator:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.layouts: dict[int, Layout | None] = {}

    def layout(self, data: bytes) -> Layout | None:
        key = hash(data)
        if key not in self.layouts:
            try:
                self.layouts[key] = Layout(data)
            except Exception:  # an already-mutated corpus entry pyelftools cannot read: bytes only
                self.layouts[key] = None
        return self.layouts[key]

    # -- helpers
    def _get(self, buf, lay, off, width) -> int:
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
        return struct.unpack_from(lay.end + fmt, buf, off)[0]

    def _put(self, buf, lay, off, width, value) -> None:
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
        struct.pack_into(lay.end + fmt, buf, off, value & ((1 << (8 * width)) - 1))

    def _value(self, buf, lay, field, peers) -> int:
        _name, off, width = field
        r = self.rng.random()
        cur = self._get(buf, lay, off, width)
        if r < 0.45:
            return self.rng.choice(extremes(width))
        if r < 0.6 and peers:
            p = self.rng.choice(peers)
            return self._get(buf, lay, p[1], p[2]) if p[1] + p[2] <= len(buf) else 0
        if r < 0.75:
            return cur + self.rng.choice([-2, -1, 1, 2, 8, -8, 4096])
        if r < 0.85:
            return len(buf) + self.rng.choice([-16, -1, 0, 1, 64])
        return self.rng.getrandbits(8 * width)

    # -- mutations: each returns a one-line description
    def field(self, buf, lay, kind=None) -> str:
        if kind is None:
            kind = self.rng.choice(["ehdr", "shdr", "shdr", "phdr", "dyn", "dyn", "sym"])
        if kind == "ehdr":
            fields = lay.fields["ehdr"]
            f = self.rng.choice(fields)
            peers = [x for x in fields if x[2] == f[2] and x != f]
        else:
            entries = lay.groups.get(kind) or []
            if not entries:
                return self.field(buf, lay, "ehdr")
            e = self.rng.choice(entries)
            f = self.rng.choice(e)
            suffix = f[0].rsplit(".", 1)[1]
            peers = [x for other in entries for x in other if x[0].endswith("." + suffix) and x != f]
        if f[1] + f[2] > len(buf):
            return "noop"
        if kind == "dyn" and f[0].endswith("d_tag") and self.rng.random() < 0.6:
            v = self.rng.choice(DT_TAGS)
        else:
            v = self._value(buf, lay, f, peers)
        self._put(buf, lay, f[1], f[2], v)
        return f"{f[0]}={v:#x}"

    def no_section_headers(self, buf, lay) -> str:
        for name, off, w in lay.fields["ehdr"]:
            if name in ("e_shoff", "e_shnum", "e_shstrndx"):
                self._put(buf, lay, off, w, 0)
        return "e_shoff=e_shnum=e_shstrndx=0"

    def cut_table(self, buf, lay) -> str:
        which = self.rng.choice(["e_shnum", "e_phnum"])
        f = next(x for x in lay.fields["ehdr"] if x[0] == which)
        cur = self._get(buf, lay, f[1], f[2])
        v = self.rng.choice([cur // 2, 1, cur + 1, cur * 4, 0xFFFF])
        self._put(buf, lay, f[1], f[2], v)
        return f"{which} {cur}->{v}"

    def splice_string(self, buf, lay) -> str:
        if not lay.strings:
            return self.bytes_flip(buf, lay)
        name, start, end = self.rng.choice(lay.strings)
        if end - start < 2:
            return "noop"
        # the start of some NUL-terminated string in the table
        pos = self.rng.randrange(start, end)
        while pos > start and buf[pos - 1] != 0:
            pos -= 1
        payload = self.rng.choice(HOSTILE)
        overrun = self.rng.random() < 0.2
        if not overrun:
            payload = payload[: max(0, end - pos - 1)]
        payload = payload[: len(buf) - pos]
        buf[pos:pos + len(payload)] = payload
        if not overrun and pos + len(payload) < end and self.rng.random() < 0.8:
            buf[pos + len(payload)] = 0
        return f"string in {name}@{pos:#x} := {bytes(payload[:24])!r}{' (overrun)' if overrun else ''}"

    def unterminate(self, buf, lay) -> str:
        if not lay.strings:
            return "noop"
        name, start, end = self.rng.choice(lay.strings)
        for i in range(start, min(end, len(buf))):
            if buf[i] == 0:
                buf[i] = ord("A")
        return f"every NUL in {name} replaced"

    def device(self, buf, lay) -> str:
        if not lay.device:
            return self.field(buf, lay)
        name, off, size = self.rng.choice(lay.device)
        head = bytes(buf[off:off + 8])
        if head.startswith(b"__CLANG_OFFLOAD_BUNDLE__"[:8]):  # count @24, then (off, size, idlen) entries
            slots = [24] + [32 + 8 * k for k in range(9)]
        elif head.startswith(b"CCOB"):
            slots = [4, 6, 8, 12, 16, 24]
        elif head[:4] in (b"\x50\xed\x55\xba", b"\xba\x55\xed\x50"):  # NVIDIA fatbin: walk entry headers
            slots = [4, 6, 8]
            pos = 16
            for _ in range(6):
                if pos + 64 > size:
                    break
                slots += [pos + x for x in (0, 4, 8, 16, 28, 32, 40, 48, 56)]
                hsize = struct.unpack_from("<I", buf, off + pos + 4)[0]
                psize = struct.unpack_from("<Q", buf, off + pos + 8)[0]
                if not hsize or pos + hsize + psize > size:
                    break
                pos += hsize + psize
        else:
            slots = list(range(0, min(size, 128), 4))
        slot = self.rng.choice(slots)
        width = self.rng.choice([w for w in (2, 4, 8) if slot + w <= size] or [1])
        if slot + width > size:
            return "noop"
        v = self.rng.choice(extremes(width) + [size, size - 1, size + 1])
        struct.pack_into({1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width], buf, off + slot, v & ((1 << 8 * width) - 1))
        if self.rng.random() < 0.3 and size > 256:  # and damage a compressed payload
            p = off + self.rng.randrange(64, size)
            buf[p:p + 8] = self.rng.randbytes(min(8, off + size - p))
        return f"{name}+{slot:#x} ({width}B) := {v:#x}"

    def compressed(self, buf, lay) -> str:
        if lay.compressed and self.rng.random() < 0.8:
            name, off, size = self.rng.choice(lay.compressed)
            f = self.rng.choice(CHDR[lay.cls])
            if self.rng.random() < 0.25:
                p = off + self.rng.randrange(min(size, 24), max(size, 25))
                buf[p:p + 16] = self.rng.randbytes(len(buf[p:p + 16]))
                return f"{name}: compressed payload damaged"
            v = self.rng.choice(extremes(f[2]) + [2, 3, 99, 1 << 34])
            self._put(buf, lay, off + f[1], f[2], v)
            return f"{name}.{f[0]} := {v:#x}"
        # set SHF_COMPRESSED on a section that is not compressed: its first bytes become a header
        name, _off, _size, hoff = self.rng.choice(lay.sections[1:] or lay.sections)
        fl = next(x for x in SHDR[lay.cls] if x[0] == "sh_flags")
        if hoff + fl[1] + fl[2] > len(buf):
            return "noop"
        self._put(buf, lay, hoff + fl[1], fl[2], self._get(buf, lay, hoff + fl[1], fl[2]) | SHF_COMPRESSED)
        return f"{name}: SHF_COMPRESSED set"

    def bytes_flip(self, buf, lay) -> str:
        n = self.rng.randint(1, 16)
        for _ in range(n):
            buf[self.rng.randrange(len(buf))] = self.rng.randrange(256)
        return f"{n} random bytes"

    def truncate(self, buf, lay) -> str:
        points = [64, len(buf) // 2, len(buf) - 1, self.rng.randrange(1, len(buf))]
        if lay:
            points += [o for _n, o, _s, _h in lay.sections if 0 < o < len(buf)]
        cut = self.rng.choice(points)
        del buf[cut:]
        return f"truncated at {cut:#x}"

    def mutate(self, data: bytes, n: int | None = None) -> tuple[bytes, list[str]]:
        buf = bytearray(data)
        lay = self.layout(data)
        done = []
        n = n or self.rng.choice([1, 1, 1, 2, 2, 3, 4])
        for _ in range(n):
            if lay is None or len(buf) < 64:
                done.append(self.bytes_flip(buf, lay) if buf else "empty")
                continue
            op = self.rng.choices(
                [self.field, self.no_section_headers, self.cut_table, self.splice_string, self.unterminate,
                 self.device, self.compressed, self.bytes_flip, self.truncate],
                weights=[30, 3, 5, 20, 2, 12, 6, 5, 4])[0]
            try:
                done.append(op(buf, lay))
            except (struct.error, IndexError, ValueError) as exc:  # a field past a cut: skip it
                done.append(f"{op.__name__} skipped ({type(exc).__name__})")
            if op == self.truncate:
                lay = None  # the layout no longer matches the bytes
        return bytes(buf), done

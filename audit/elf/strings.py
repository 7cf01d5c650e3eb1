"""Library-name strings embedded in a file's data: what a dlopen() would be given.

Scanned: every allocated, non-executable SHT_PROGBITS section (.rodata*, .data*, .data.rel.ro,
.tdata, ...): a name handed to dlopen may sit in writable data too; an SHF_COMPRESSED one both
as stored and decompressed (bounded: audit.elf.decompress); and the loaded bytes no section
shows (audit.elf.segments). Not scanned: `.dynstr`
(its library names are DT_NEEDED / verneed entries, reported as such, and its other strings are
symbol names), `.interp`, and the device-code sections (read as device code instead).
Library names are looked for in the rest of the loaded bytes too (ElfImage.code_ranges: code
and unwind tables, whatever their sections claim to be: a data section can be flagged as code);
machine code rarely holds "lib", so that costs one fast regex pass (~0.15 s per 280 MB of code).
One bytes regex runs over each section's data in bulk.

A name is a string dlopen can be given only where it is the whole string around it: the text
run (printable bytes, up to a NUL or any other byte) holds no whitespace. A name inside prose
(gflags help text "Specify path for loading libcublas.so.", a build-information line "Extra
dependencies: /usr/lib64/libopenblasp.so dl m") is a mention: kept, with the text around it,
but no loader is given it (LibraryString.mention). A path, a version or printf suffix
("libcublas.so.%d") keep a name whole.

Marker strings (`markers`: text only a vendor's own code holds, a policy's rule `markers`) are
looked for in the same data sections in the same pass, each section while it is resident: the
whole NUL-terminated strings that start with one of the markers' literal texts, where a string
starts at the range's start or after a NUL (text that merely contains a marker, "this is not
libblis: really", is not such a string). One bytes.find per marker and section: no pass over
the code.

Fail closed: a section that lies outside the file, or more than MAX_HITS names of a kind, makes
the file unreadable (Malformed), never a partial list beside a pass. `strings_in` scans byte
ranges of any buffer, for readers of other formats.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

from audit.elf.membership import in_sorted
from audit.elf.model import StringHit
from audit.elf.decompress import DecompressError, inflate
from audit.elf.parse import SHF_ALLOC, SHF_EXECINSTR, SHT_PROGBITS, ElfImage, Malformed, decode, release

# lib<name>.so with an optional version suffix: libcublas.so.12, libMIOpen.so, libnvrtc-builtins.so.13.0
# A literal-prefixed run (re's fast path): each "lib" starts a run of name characters that the
# regex takes greedily and never backtracks over, so hostile data costs linear time.
_RUN_RE = re.compile(rb"lib[A-Za-z0-9_+\-.]{0,255}")
# Inside a run: the library name ends at ".so" plus an optional numeric version.
_SO_RE = re.compile(rb"\.so(?:\.[0-9]+)*(?![A-Za-z0-9_+\-])")
_INNER_LIB_RE = re.compile(rb"[^A-Za-z0-9]lib")
SKIP_SECTIONS = {".interp", ".hip_fatbin", ".nv_fatbin", ".hipFatBinSegment", ".nvFatBinSegment"}
SHF_COMPRESSED = 0x800
_CH_TYPES = {1: "zlib", 2: "zstd"}  # ELFCOMPRESS_ZLIB, ELFCOMPRESS_ZSTD
MAX_HITS = 10_000  # per file and kind; more makes the file an error (Malformed), never a partial list


@dataclass(frozen=True)
class LibraryString(StringHit):
    """A library-name hit with the text run it lies in (`context`: cut to CONTEXT_CUT bytes on
    each side of the name, control and non-ASCII bytes escaped) and whether that run is prose
    around the name (`mention`) rather than the name or a path ending in it."""

    context: str = ""
    mention: bool = False


CONTEXT_CUT = 40  # bytes of the text run kept on each side of a name
_AROUND = 512  # bytes looked at on each side of a name for the end of its text run
_TEXT = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}  # bytes of a text run (printable, tab, newlines)
_SPACE = re.compile(rb"[ \t\n\r]")


def is_mention(hit) -> bool:
    """True for a library name read inside prose (LibraryString.mention): not a loadable name."""
    return bool(getattr(hit, "mention", False))


def _escaped(raw: bytes) -> str:
    """Bytes of a text run, printable: control and non-ASCII bytes as \\xNN, \\n, \\t."""
    out = []
    for b in raw:
        if b == 0x0A:
            out.append("\\n")
        elif b == 0x09:
            out.append("\\t")
        elif b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def text_run(buf, at: int, end: int, lo: int, hi: int) -> tuple[bytes, bytes]:
    """(text before, text after) the name buf[at:end]: the run of text bytes (_TEXT) on each side,
    up to a NUL or other byte, `lo`/`hi` (the range's bounds) or _AROUND bytes."""
    left = bytes(buf[max(lo, at - _AROUND):at])
    right = bytes(buf[end:min(hi, end + _AROUND)])
    i = len(left)
    while i and left[i - 1] in _TEXT:
        i -= 1
    j = 0
    while j < len(right) and right[j] in _TEXT:
        j += 1
    return left[i:], right[:j]


def judge_name(buf, at: int, end: int, lo: int, hi: int) -> tuple[str, bool]:
    """(context, mention) of the library name buf[at:end] in buf[lo:hi] (see the module docstring)."""
    before, after = text_run(buf, at, end, lo, hi)
    mention = bool(_SPACE.search(before) or _SPACE.search(after))
    cut_b = before[-CONTEXT_CUT:]
    cut_a = after[:CONTEXT_CUT]
    context = (("..." if len(cut_b) < len(before) else "") + _escaped(cut_b + bytes(buf[at:end]) + cut_a)
               + ("..." if len(cut_a) < len(after) else ""))
    return context, mention


def scannable(img: ElfImage):
    """The data sections, then the loaded bytes no section shows (ElfImage.extra_ranges)."""
    for sec in img.sections:
        if (sec.type == SHT_PROGBITS and sec.flags & SHF_ALLOC and not sec.flags & SHF_EXECINSTR
                and sec.size and sec.name not in SKIP_SECTIONS):
            yield sec
    yield from img.extra_ranges


def label(sec) -> str:
    """A section's name, or its index where the name is lost (a broken section name table)."""
    return sec.name or f"[section {sec.index}]"


def library_names(run: bytes) -> list[tuple[int, bytes]]:
    """Library names in one run ("libfoo.so.1" -> [(0, b"libfoo.so.1")]), with any inner
    "lib..." name too ("libx.libcublas.so" also gives "libcublas.so"): fail closed."""
    m = _SO_RE.search(run)
    if m is None or m.start() <= 3:
        return []
    name = run[:m.end()]
    out = [(0, name)]
    for inner in _INNER_LIB_RE.finditer(name, 0, m.start()):
        if inner.end() < m.start():
            out.append((inner.start() + 1, name[inner.start() + 1:]))
    return out


def library_strings(img: ElfImage, warnings: list[str], markers: tuple[bytes, ...] = (),
                    marker_hits: list[StringHit] | None = None) -> list[StringHit]:
    """Library names in the data sections (stored and decompressed), the loaded bytes no section
    shows, and the code and unwind ranges (ElfImage.code_ranges). Malformed for a section outside
    the file or more than MAX_HITS names. With `markers`, the whole strings in the data that start
    with one of them are added to `marker_hits` (marker_strings), in the same pass."""
    hits: list[StringHit] = []
    for sec in scannable(img):
        _inside(img.size, sec)
        _scan(img.buf, sec.offset, sec.offset + sec.size, label(sec), 0, hits)
        if markers and marker_hits is not None:
            marker_strings(img.buf, sec.offset, sec.offset + sec.size, label(sec), markers, marker_hits)
        if sec.flags & SHF_COMPRESSED:  # what a tool that honours the flag reads: scanned too
            data = decompressed(img, sec)
            _scan(data, 0, len(data), label(sec), sec.offset, hits, at_base=True)
            if markers and marker_hits is not None:
                marker_strings(data, 0, len(data), label(sec), markers, marker_hits, at=sec.offset)
        release(img.buf, sec.offset, sec.offset + sec.size)
    for sec in img.code_ranges:
        _inside(img.size, sec)
        pos, end = sec.offset, sec.offset + sec.size
        while pos < end:  # a step resident at a time; the next resumes after the last name run
            hi = min(pos + _CODE_STEP, end)
            last = _scan(img.buf, pos, hi, label(sec), 0, hits, limit=min(end, hi + 260), bounds=(sec.offset, end))
            release(img.buf, pos, hi)
            pos = max(hi, last)
    return hits


_CODE_STEP = 8 << 20
MARKER_TEXT_MAX = 4096  # bytes of a marker string read for its NUL; longer is not a whole string kept
MARKER_TEXT_CUT = 256  # characters of it kept (and shown)


def marker_strings(buf, start: int, end: int, section: str, markers: tuple[bytes, ...], hits: list[StringHit],
                   at: int | None = None) -> None:
    """The whole strings in buf[start:end] that start with one of `markers` (literal bytes),
    added to `hits` in file order per marker: a string starts at `start` or after a NUL and ends
    at a NUL within MARKER_TEXT_MAX bytes and before `end`. `text` is the string up to its NUL,
    cut to MARKER_TEXT_CUT characters ("..." after); `offset` its file offset, or `at` for every
    hit (decompressed bytes have no file offset). Malformed past MAX_HITS."""
    for marker in markers:
        pos = buf.find(marker, start, end)
        while pos >= 0:
            if pos == start or buf[pos - 1] == 0:
                nul = buf.find(b"\0", pos + len(marker), min(end, pos + MARKER_TEXT_MAX))
                if nul >= 0:
                    if len(hits) >= MAX_HITS:
                        raise Malformed(f"more than {MAX_HITS} marker strings (the limit): "
                                        "they cannot all be listed")
                    text = decode(bytes(buf[pos:nul]))
                    if len(text) > MARKER_TEXT_CUT:
                        text = text[:MARKER_TEXT_CUT] + "..."
                    hits.append(StringHit(section=section, offset=pos if at is None else at, text=text))
            pos = buf.find(marker, pos + 1, end)


def _inside(size: int, sec) -> None:
    if sec.offset < 0 or sec.size < 0 or sec.offset + sec.size > size:
        raise Malformed(f"section {label(sec)} (offset {sec.offset:#x}, size {sec.size:#x}) lies outside "
                        f"the file ({size:#x} bytes): the file is truncated or contradicts itself")


def _scan(buf, start: int, end: int, section: str, base: int, hits: list[StringHit],
          at_base: bool = False, limit: int | None = None, bounds: tuple[int, int] | None = None) -> int:
    """Library names starting in buf[start:end] (read on to `limit`, default `end`) added to
    `hits` (offsets from `base`, or `base` itself with `at_base`: decompressed bytes have no file
    offset), each with its text run (judge_name, within `bounds`, default (start, limit or end));
    Malformed once there are more than MAX_HITS. Returns where the last run ended."""
    last = start
    lo, hi = bounds or (start, end if limit is None else limit)
    for m in _RUN_RE.finditer(buf, start, end if limit is None else limit):
        if m.start() >= end:
            break
        last = m.end()
        for rel, name in library_names(m.group()):
            if len(hits) >= MAX_HITS:
                raise Malformed(f"more than {MAX_HITS} library-name strings (the limit): "
                                "they cannot all be listed")
            at = m.start() + rel
            context, mention = judge_name(buf, at, at + len(name), lo, hi)
            hits.append(LibraryString(section=section, offset=base if at_base else base + at,
                                      text=decode(name), context=context, mention=mention))
    return last


def strings_in(buf, ranges, prefixes: tuple[bytes, ...] = ()) -> tuple[list[StringHit], list[StringHit]]:
    """(library-name strings, API-name strings) in byte ranges of `buf` (bytes, mmap: anything
    with find), for readers of any format. `ranges`: (label, offset, size) triples; the API
    names are NUL-delimited identifiers starting with one of `prefixes` (identifier_strings).
    Offsets are the buffer's. Raises Malformed for a range outside the buffer or past MAX_HITS
    names of a kind."""
    places = [_Range(name, offset, size) for name, offset, size in ranges]
    lib: list[StringHit] = []
    for r in places:
        _inside(len(buf), r)
        pos, end = r.offset, r.offset + r.size
        while pos < end:  # a window resident at a time (a DLL's .rdata runs to hundreds of MB)
            hi = min(pos + _CODE_STEP, end)
            last = _scan(buf, pos, hi, r.name, 0, lib, limit=min(end, hi + 260), bounds=(r.offset, end))
            release(buf, pos, hi)
            pos = max(hi, last)
    return lib, _identifiers(buf, places, prefixes)


class _Range:
    __slots__ = ("name", "offset", "size", "index")

    def __init__(self, name: str, offset: int, size: int):
        self.name, self.offset, self.size, self.index = name, offset, size, -1


def decompressed(img: ElfImage, sec):
    """An SHF_COMPRESSED section's contents (Elf_Chdr, then zlib or zstd), decompressed within
    audit.elf.decompress's limits; Malformed if it cannot be."""
    chdr = img.e + ("IIQQ" if img.bits == 64 else "III")
    head = struct.calcsize(chdr)
    if sec.size < head:
        raise Malformed(f"compressed section {sec.name or sec.index} is shorter than its header")
    fields = struct.unpack_from(chdr, img.buf, sec.offset)
    ch_type, ch_size = fields[0], fields[2] if img.bits == 64 else fields[1]
    algo = _CH_TYPES.get(ch_type)
    if algo is None:
        raise Malformed(f"compressed section {sec.name or sec.index}: unknown compression type {ch_type}")
    try:
        data, _ = inflate(algo, memoryview(img.buf)[sec.offset + head:sec.offset + sec.size], ch_size)
    except DecompressError as exc:
        raise Malformed(f"compressed section {sec.name or sec.index} cannot be read: {exc}") from None
    if len(data) != ch_size:
        raise Malformed(f"compressed section {sec.name or sec.index}: {len(data)} bytes, "
                        f"its header declares {ch_size}")
    return data


# ---------------------------------------------------------------- API names handed to dlsym

_IDENT = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,127}")
_CHUNK = 4 << 20  # bytes of a section looked at per numpy pass (its temporary arrays are ~10x this)


def _head_keys(prefixes) -> np.ndarray:
    # sorted in Python: np.unique would import numpy.ma (~13 ms) for a few dozen numbers
    return np.array(sorted({p[0] << 16 | p[1] << 8 | p[2] for p in prefixes if len(p) >= 3}), dtype=np.uint32)


def identifier_strings(img: ElfImage, prefixes: tuple[bytes, ...], warnings: list[str]) -> list[StringHit]:
    """NUL-delimited strings in the data sections that are C identifiers starting with one of
    `prefixes` (literal prefixes of vendor API names, 3 bytes or more): the names a binary hands
    to dlsym. Malformed for a section outside the file or more than MAX_HITS names."""
    places = list(scannable(img))
    for sec in places:
        _inside(img.size, sec)
    return _identifiers(img.buf, places, prefixes)


def _identifiers(buf, places, prefixes: tuple[bytes, ...]) -> list[StringHit]:
    """identifier_strings over `places` (objects with offset, size, name, index), in bounds.
    Vectorised: string starts (a byte after a NUL) are found with numpy and only those
    whose first three bytes begin a prefix are read, so a large .rodata costs two passes."""
    keys = _head_keys(prefixes)
    if not len(keys):
        return []
    starts_api = re.compile(b"|".join(re.escape(p) for p in sorted({p for p in prefixes if len(p) >= 3})))
    heads = np.zeros(256, dtype=bool)  # the first bytes of the keys
    heads[keys >> 16] = True
    first, last = int(keys[0] >> 16), int(keys[-1] >> 16)  # the range of the keys' first bytes
    hits: list[StringHit] = []
    # a window's masks are made in place, in buffers made once: fresh ones each window would
    # cost a page fault per 4 KiB every time
    nul_buf = np.empty(_CHUNK + 3, dtype=bool)
    edge_buf = np.empty(_CHUNK, dtype=bool)
    cut_buf = np.empty(_CHUNK, dtype=bool)
    for sec in places:
        for lo in range(sec.offset, sec.offset + sec.size, _CHUNK):
            n = min(_CHUNK + 3, sec.offset + sec.size - lo)
            if n < 4:
                continue
            a = np.frombuffer(buf, dtype=np.uint8, count=n, offset=lo)
            nul = np.equal(a, 0, out=nul_buf[:n])
            edge = np.greater(nul[:-3], nul[1:-2], out=edge_buf[:n - 3])  # a NUL, then a byte that is not,
            cut = cut_buf[:n - 3]
            edge &= np.greater_equal(a[1:-2], first, out=cut)  # ... in the range of the keys' first bytes
            edge &= np.less_equal(a[1:-2], last, out=cut)  # (binary data mostly is not: 2M starts -> ~0.3M)
            starts = np.flatnonzero(edge) + 1
            if lo == sec.offset and a[0] != 0:
                starts = np.concatenate([[0], starts])
            # a string starting at the window's end is this window's (the next looks from its 2nd byte)
            starts = starts[starts <= min(_CHUNK, n - 3)]
            starts = starts[heads[a[starts]]]  # most strings fail on their first byte already
            key = (a[starts].astype(np.uint32) << 16) | (a[starts + 1].astype(np.uint32) << 8) | a[starts + 2]
            for st in starts[in_sorted(key, keys)].tolist():  # the keys are sorted once, above
                at = lo + st
                end = buf.find(b"\0", at, min(at + 129, sec.offset + sec.size))
                word = bytes(buf[at:end]) if end > 0 else b""
                if _IDENT.fullmatch(word) and starts_api.match(word):
                    if len(hits) >= MAX_HITS:
                        raise Malformed(f"more than {MAX_HITS} API-name strings (the limit): "
                                        "they cannot all be listed")
                    hits.append(StringHit(section=label(sec), offset=at, text=decode(word)))
            release(buf, lo, lo + _CHUNK)
    return hits

"""The ELF reader as a release gate: what the loader can reach is read, or the file is an error.

Each input is a real compiled library changed the way an attacker would change it (header
fields rewritten with struct, sections added or renamed with objcopy): the section header table
removed, the section name table lost, device code under another name, a compressed data
section, and decompression bombs in device code. Each is audited by the CLI in a subprocess;
a verdict of pass is never acceptable for them, and memory stays bounded (measured as the
largest resident set of the audit's processes).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from conftest import require_tool
from elf_fixtures import hip_env

REPO = Path(__file__).resolve().parent.parent
MEMORY_BOUND_KB = 500 * 1024

DLOPEN_C = r"""
#include <dlfcn.h>
static const char vendor_lib[] = "libcublas.so.12";
void *fk_load(void) { return dlopen(vendor_lib, RTLD_NOW); }
"""
IMPORT_C = """
extern int cublasSgemm_v2(void);
int fk_call(void) { return cublasSgemm_v2(); }
"""
PLAIN_C = "int fk_plain(int x) { return x + 1; }\n"
# imports dlopen but names no library: the name it loads is only in the section under test
LOADER_C = "#include <dlfcn.h>\nvoid *fk_load(const char *name) { return dlopen(name, RTLD_NOW); }\n"
TENSILE_KERNEL = "Cijk_Ailk_Bljk_SB_MT64x64"
TENSILE_HIP = """
#include <hip/hip_runtime.h>
extern "C" __global__ void %s(float *c, const float *a) { c[threadIdx.x] = a[threadIdx.x] * 2.0f; }
""" % TENSILE_KERNEL

# Measures the audit's peak resident memory: the wrapper's children are the audit and what it forks.
_MEASURE = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "sys.stderr.write('maxrss_kb=%d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.exit(rc)")


def check(path: Path) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak resident KiB) of `python3 -m audit check PATH`."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "audit", "check", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    err, _, tail = proc.stderr.rpartition("maxrss_kb=")
    return proc.returncode, proc.stdout, err, int(tail.strip() or 0)


def assert_error(rc: int, out: str, err: str, *words: str) -> None:
    """Exit 3 (unreadable input, fail closed) with the reason on one line, no traceback."""
    assert rc == 3, (rc, out, err)
    assert "Traceback" not in err
    text = out + err
    for w in words:
        assert w in text, (w, text)


def build(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    gcc = require_tool("gcc")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"lib{name}.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, timeout=120)
    return out


def section_headers(data: bytes) -> list[dict]:
    """The section headers of a 64-bit little-endian ELF file, with names (the documented layout)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = []
    for i in range(shnum):
        at = shoff + i * shentsize
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from("<IIQQQQIIQQ", data, at)
        heads.append(dict(at=at, name_off=name, type=typ, flags=flags, offset=off, size=size, entsize=entsize))
    names = heads[shstrndx]
    for h in heads:
        start = names["offset"] + h["name_off"]
        h["name"] = data[start:data.index(b"\0", start)].decode()
    return heads


def header_of(data: bytes, name: str) -> dict:
    return next(h for h in section_headers(data) if h["name"] == name)


def without_section_headers(data: bytes) -> bytes:
    """As sstrip leaves a file: e_shoff, e_shnum and e_shstrndx zeroed (ld.so needs none)."""
    b = bytearray(data)
    struct.pack_into("<Q", b, 0x28, 0)
    struct.pack_into("<HH", b, 0x3C, 0, 0)
    return bytes(b)


def with_lost_section_names(data: bytes) -> bytes:
    b = bytearray(data)
    struct.pack_into("<H", b, 0x3E, 0xFFF0)
    return bytes(b)


def add_section(base: Path, out: Path, name: str, content: bytes) -> Path:
    objcopy = require_tool("objcopy")
    blob = out.with_suffix(".bin")
    blob.write_bytes(content)
    subprocess.run([objcopy, "--add-section", f"{name}={blob}", "--set-section-flags",
                    f"{name}=alloc,readonly,data", str(base), str(out)], check=True, capture_output=True, timeout=120)
    return out


# ---------------------------------------------------------------- the section header table


def test_no_section_headers_still_shows_the_dlopen_string(tmp_path):
    lib = build(tmp_path, "dl", DLOPEN_C, "-ldl")
    bare = tmp_path / "bare.so"
    bare.write_bytes(without_section_headers(lib.read_bytes()))
    rc, out, err, _ = check(bare)
    assert rc == 1, (rc, out, err)
    assert "libcublas.so.12" in out and "dlopen" in out
    assert "Traceback" not in err


def test_no_section_headers_still_shows_the_imports(tmp_path):
    lib = build(tmp_path, "imp", IMPORT_C)
    bare = tmp_path / "bare.so"
    bare.write_bytes(without_section_headers(lib.read_bytes()))
    rc, out, err, _ = check(bare)
    assert rc == 1, (rc, out, err)
    assert "cublasSgemm_v2" in out


def test_dynsym_section_shorter_than_pt_dynamic_says_is_an_error(tmp_path):
    lib = build(tmp_path, "imp", IMPORT_C)
    data = bytearray(lib.read_bytes())
    dynsym = header_of(bytes(data), ".dynsym")
    struct.pack_into("<Q", data, dynsym["at"] + 0x20, 24)  # sh_size: the null symbol alone
    short = tmp_path / "short.so"
    short.write_bytes(bytes(data))
    rc, out, err, _ = check(short)
    assert_error(rc, out, err, "contradicts itself")


def test_dynamic_section_other_than_pt_dynamic_is_an_error(tmp_path):
    lib = build(tmp_path, "dl", DLOPEN_C, "-ldl")
    data = bytearray(lib.read_bytes())
    dynamic = header_of(bytes(data), ".dynamic")
    # the .dynamic section header now points at a copy with its first DT_NEEDED turned to DT_DEBUG
    table = bytearray(data[dynamic["offset"]:dynamic["offset"] + dynamic["size"]])
    for i in range(0, len(table), 16):
        if struct.unpack_from("<q", table, i)[0] == 1:
            struct.pack_into("<q", table, i, 21)
            break
    struct.pack_into("<Q", data, dynamic["at"] + 0x18, len(data))
    data += table
    forged = tmp_path / "forged.so"
    forged.write_bytes(bytes(data))
    rc, out, err, _ = check(forged)
    assert_error(rc, out, err, "contradicts itself")


# ---------------------------------------------------------------- device code by content


@pytest.fixture(scope="module")
def tensile_lib(tmp_path_factory) -> Path:
    hipcc = require_tool("hipcc")
    d = tmp_path_factory.mktemp("tensile")
    src = d / "tensile.hip"
    src.write_text(TENSILE_HIP)
    out = d / "libtensile.so"
    proc = subprocess.run([hipcc, "--offload-arch=gfx1030", "-shared", "-fPIC", "-o", str(out), str(src)],
                          env=hip_env(), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"hipcc failed:\n{proc.stderr[-3000:]}")
    return out


@pytest.mark.parametrize("mutation", ["lost-names", "no-section-headers", "renamed"])
def test_tensile_kernel_is_found_whatever_its_section_is_called(tensile_lib, tmp_path, mutation):
    data = tensile_lib.read_bytes()
    out_path = tmp_path / f"{mutation}.so"
    if mutation == "lost-names":
        out_path.write_bytes(with_lost_section_names(data))
    elif mutation == "no-section-headers":
        out_path.write_bytes(without_section_headers(data))
    else:
        objcopy = require_tool("objcopy")
        subprocess.run([objcopy, "--rename-section", ".hip_fatbin=.rodata.k", str(tensile_lib), str(out_path)],
                       check=True, capture_output=True, timeout=120)
    rc, out, err, _ = check(out_path)
    assert rc == 1, (rc, out, err)
    assert TENSILE_KERNEL in out and "device-kernel" in out


# ---------------------------------------------------------------- compressed data


def _chdr(ch_type: int, size: int) -> bytes:
    return struct.pack("<IIQQ", ch_type, 0, size, 1)  # Elf64_Chdr


def compressed_section_lib(tmp_path: Path, declared: int | None) -> Path:
    lib = build(tmp_path, "loader", LOADER_C)
    text = b"\0" * 64 + b"libcublas.so.12\0" + b"\0" * 64
    content = _chdr(1, len(text) if declared is None else declared) + zlib.compress(text)
    out = add_section(lib, tmp_path / "libz.so", ".rodata.z", content)
    data = bytearray(out.read_bytes())
    head = header_of(bytes(data), ".rodata.z")
    struct.pack_into("<Q", data, head["at"] + 8, head["flags"] | 0x800)  # SHF_COMPRESSED
    out.write_bytes(bytes(data))
    return out


def test_compressed_data_section_is_read_decompressed(tmp_path):
    rc, out, err, _ = check(compressed_section_lib(tmp_path, None))
    assert rc == 1, (rc, out, err)
    assert "libcublas.so.12" in out


def test_compressed_data_section_with_an_absurd_size_is_an_error(tmp_path):
    rc, out, err, _ = check(compressed_section_lib(tmp_path, 1 << 40))
    assert_error(rc, out, err, ".rodata.z")
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) <= 1


# ---------------------------------------------------------------- decompression bombs


def zstd_zeros(n: int, head: bytes) -> bytes:
    import zstandard

    c = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [c.compress(head)]
    chunk = bytes(1 << 20)
    for _ in range(n // len(chunk)):
        parts.append(c.compress(chunk))
    parts.append(c.flush())
    return b"".join(parts)


def lz4_zeros_block(n: int) -> bytes:
    """An LZ4 block (the documented sequence format) of `n` zero bytes: one literal, one match
    at offset 1 stretched by length bytes, five closing literals."""
    ext = n - 6 - 19
    return (bytes([0x1F, 0x00]) + struct.pack("<H", 1) + b"\xff" * (ext // 255) + bytes([ext % 255])
            + bytes([0x50]) + b"\0" * 5)


def test_ccob_of_a_gib_of_zeros_is_refused_in_bounded_memory(tmp_path):
    usize = (1 << 30) - 64  # declared honestly, under any old per-entry cap
    bundle_head = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", 0)
    data = zstd_zeros(usize - len(bundle_head), bundle_head)
    ccob = b"CCOB" + struct.pack("<HHQQQ", 3, 1, 32 + len(data), usize, 0) + data
    lib = add_section(build(tmp_path, "plain", PLAIN_C), tmp_path / "libbomb.so", ".hip_fatbin", ccob)
    rc, out, err, rss = check(lib)
    assert_error(rc, out, err, "zstd")
    assert rss < MEMORY_BOUND_KB, f"peak resident memory {rss} KiB"


def test_nv_fatbin_lz4_entry_of_a_gib_of_zeros_is_refused_in_bounded_memory(tmp_path):
    usize = 1 << 30
    payload = lz4_zeros_block(usize)
    entry = struct.pack("<HHIQ", 2, 0, 0x40, len(payload)) + struct.pack("<IIHHI", len(payload), 0, 0, 9, 90)
    entry += b"\0" * (0x28 - len(entry)) + struct.pack("<Q", 0x2000) + b"\0" * 8 + struct.pack("<Q", usize)
    assert len(entry) == 0x40
    body = entry + payload
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    lib = add_section(build(tmp_path, "plain", PLAIN_C), tmp_path / "libbomb.so", ".nv_fatbin", fatbin)
    rc, out, err, rss = check(lib)
    assert_error(rc, out, err, "lz4")
    assert rss < MEMORY_BOUND_KB, f"peak resident memory {rss} KiB"


def test_ccob_of_unknown_size_is_refused_while_it_streams(tmp_path):
    # CCOB v2 with no uncompressed size recorded: only the ratio limit stops a GiB of zeros
    bundle_head = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", 0)
    data = zstd_zeros(1 << 30, bundle_head)
    ccob = b"CCOB" + struct.pack("<HHIIQ", 2, 1, 24 + len(data), 0, 0) + data
    lib = add_section(build(tmp_path, "plain", PLAIN_C), tmp_path / "libbomb.so", ".hip_fatbin", ccob)
    rc, out, err, rss = check(lib)
    assert_error(rc, out, err, "zstd", "200:1")
    assert rss < MEMORY_BOUND_KB, f"peak resident memory {rss} KiB"


def test_symbol_table_of_millions_of_reported_names_is_refused_in_bounded_memory(tmp_path):
    # a .symtab moved to 3 million entries, each named like a vendor import
    lib = build(tmp_path, "plain", PLAIN_C)
    data = bytearray(lib.read_bytes())
    symtab, strtab = header_of(bytes(data), ".symtab"), header_of(bytes(data), ".strtab")
    count = 3_000_000
    names = b"\0cublasSgemm_v2\0"
    entry = struct.pack("<IBBHQQ", 1, 0x12, 0, 0, 0, 0)  # GLOBAL FUNC, undefined
    data += b"\0" * (-len(data) % 8)
    sym_off = len(data)
    data += bytes(24) + entry * (count - 1)
    str_off = len(data)
    data += names
    struct.pack_into("<QQ", data, symtab["at"] + 0x18, sym_off, count * 24)
    struct.pack_into("<QQ", data, strtab["at"] + 0x18, str_off, len(names))
    big = tmp_path / "libsyms.so"
    big.write_bytes(bytes(data))
    rc, out, err, rss = check(big)
    assert_error(rc, out, err, ".symtab", "limit")
    assert rss < MEMORY_BOUND_KB, f"peak resident memory {rss} KiB"


# ---------------------------------------------------------------- flags, bounds and limits


def set_header_field(data: bytes, name: str, field: str, value: int) -> bytes:
    """One field of a named section's header rewritten (64-bit little-endian layout)."""
    at = {"flags": 8, "offset": 0x18, "size": 0x20}[field]
    b = bytearray(data)
    struct.pack_into("<Q", b, header_of(data, name)["at"] + at, value)
    return bytes(b)


SHF_EXECINSTR = 0x4


def test_data_section_flagged_as_code_is_still_read_for_library_names(tmp_path):
    # .rodata and .text in one R+X segment (as libtorch_cpu.so is laid out), then .rodata flagged
    # SHF_EXECINSTR: the loader maps the same bytes and dlopen is handed the same pointer
    lib = build(tmp_path, "dlx", DLOPEN_C, "-ldl", "-Wl,-z,noseparate-code")
    data = lib.read_bytes()
    rodata = header_of(data, ".rodata")
    flagged = tmp_path / "flagged.so"
    flagged.write_bytes(set_header_field(data, ".rodata", "flags", rodata["flags"] | SHF_EXECINSTR))
    rc, out, err, _ = check(flagged)
    assert rc == 1, (rc, out, err)
    assert "libcublas.so.12" in out and "Traceback" not in err


@pytest.mark.parametrize("name", [".rodata", ".text"])
def test_section_outside_the_file_is_an_error(tmp_path, name):
    lib = build(tmp_path, "out", 'const char *fk_greeting(void) { return "hello, world"; }\n')
    data = lib.read_bytes()
    bad = tmp_path / "outside.so"
    bad.write_bytes(set_header_field(data, name, "size", len(data)))
    rc, out, err, _ = check(bad)
    assert_error(rc, out, err, "lies outside the file")
    assert out.count("lies outside the file") == 1, out


def test_more_library_names_than_the_limit_is_an_error(tmp_path):
    # ten thousand harmless names, then the vendor's: never a pass with the last one dropped
    names = ", ".join(f'"libfk{i:05d}.so"' for i in range(10_000))
    src = ("#include <dlfcn.h>\nconst char *const fk_names[] = {%s, \"libcublas.so.12\"};\n"
           "void *fk_load(int i) { return dlopen(fk_names[i], RTLD_NOW); }\n" % names)
    lib = build(tmp_path, "many", src, "-ldl")
    rc, out, err, _ = check(lib)
    assert_error(rc, out, err, "more than 10000 library-name strings")
    assert out.count("more than 10000") == 1, out


def test_more_api_names_than_the_limit_is_an_error(tmp_path):
    names = ", ".join(f'"cublasFk{i:05d}"' for i in range(10_001))
    src = ("#include <dlfcn.h>\nconst char *const fk_names[] = {%s};\n"
           "void *fk_sym(void *h, int i) { return dlsym(h, fk_names[i]); }\n" % names)
    lib = build(tmp_path, "manyapi", src, "-ldl")
    rc, out, err, _ = check(lib)
    assert_error(rc, out, err, "more than 10000 API-name strings")


def test_no_section_headers_warns_only_of_what_is_not_read(tmp_path):
    lib = build(tmp_path, "dlw", DLOPEN_C, "-ldl")
    bare = tmp_path / "bare.so"
    bare.write_bytes(without_section_headers(lib.read_bytes()))
    proc = subprocess.run([sys.executable, "-m", "audit", "check", "--format", "json", str(bare)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    warnings = json.loads(proc.stdout)["files"][0]["warnings"]
    assert not any("strings and device code not read" in w for w in warnings), warnings
    assert any("forwarding stubs not decoded" in w for w in warnings), warnings

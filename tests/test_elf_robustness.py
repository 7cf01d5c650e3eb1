"""Bad inputs: every one is an InputError with one line naming the file; nothing hangs.

Corruptions are placed with pyelftools (an independent reader) so the test knows where each
header field lives without asking the code under test.
"""

from __future__ import annotations

import os
import struct
import threading

import pytest
from elftools.elf.elffile import ELFFile

from audit.elf.model import ElfInfo
from audit.elf.reader import read_elf
from audit.errors import EXIT_INPUT, InputError
from elf_fixtures import host_libs  # noqa: F401 (pytest fixture)


def expect_input_error(path, *fragments: str) -> str:
    with pytest.raises(InputError) as err:
        read_elf(path)
    msg = err.value.message
    assert str(path) in msg and "\n" not in msg
    assert err.value.exit_code == EXIT_INPUT
    for f in fragments:
        assert f in msg
    return msg


def write(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def patched(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def layout(path):
    """Field offsets in the fixture, from pyelftools."""
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        secs = {s.name: (i, s.header) for i, s in enumerate(elf.iter_sections())}
        return {"shoff": elf.header.e_shoff, "shentsize": elf.header.e_shentsize, "sections": secs}


def test_not_elf_and_empty(tmp_path):
    expect_input_error(write(tmp_path, "text.so", b"hello, not an ELF\n"), "not an ELF")
    expect_input_error(write(tmp_path, "empty.so", b""), "empty")
    expect_input_error(write(tmp_path, "magic-only.so", b"\x7fELF"))


@pytest.mark.parametrize("fraction", [0.002, 0.004, 0.01, 0.25, 0.5, 0.9, 0.999])
def test_truncated(host_libs, tmp_path, fraction):
    data = host_libs["main"].read_bytes()
    expect_input_error(write(tmp_path, "trunc.so", data[:max(5, int(len(data) * fraction))]))


def test_bad_class_and_data_bytes(host_libs, tmp_path):
    data = host_libs["main"].read_bytes()
    expect_input_error(write(tmp_path, "class.so", data[:4] + b"\x03" + data[5:]), "class")
    expect_input_error(write(tmp_path, "data.so", data[:5] + b"\x00" + data[6:]), "data")


def test_wrong_endianness_is_refused(host_libs, tmp_path):
    data = host_libs["main"].read_bytes()
    # a little-endian file relabelled big-endian: its offsets now point far past the end
    expect_input_error(write(tmp_path, "swapped.so", data[:5] + b"\x02" + data[6:]))


def test_corrupted_section_table(host_libs, tmp_path):
    data = host_libs["main"].read_bytes()
    lay = layout(host_libs["main"])
    expect_input_error(write(tmp_path, "shoff.so", patched(data, 0x28, "<Q", len(data) + 4096)), "section header")
    expect_input_error(write(tmp_path, "shentsize.so", patched(data, 0x3A, "<H", 12)), "entry size")
    expect_input_error(write(tmp_path, "shnum.so", patched(data, 0x3C, "<H", 0xFFF0)), "section header table")
    # .dynsym pointing past the end, and claiming 2**40 bytes
    idx, _ = lay["sections"][".dynsym"]
    hdr = lay["shoff"] + idx * lay["shentsize"]
    expect_input_error(write(tmp_path, "symoff.so", patched(data, hdr + 0x18, "<Q", len(data) + 1)), ".dynsym")
    expect_input_error(write(tmp_path, "symsize.so", patched(data, hdr + 0x20, "<Q", 1 << 40)), ".dynsym")
    expect_input_error(write(tmp_path, "symlink.so", patched(data, hdr + 0x28, "<I", 9999)), "string table")


def test_bad_section_name_table_is_a_warning(host_libs, tmp_path):
    data = host_libs["main"].read_bytes()
    info = read_elf(write(tmp_path, "shstrndx.so", patched(data, 0x3E, "<H", 0xFFF0)))
    assert isinstance(info, ElfInfo) and any("section name" in w for w in info.warnings)
    assert info.needed  # the dynamic section is still read through PT_DYNAMIC


def test_dynamic_string_offset_out_of_range(host_libs, tmp_path):
    data = host_libs["main"].read_bytes()
    with open(host_libs["main"], "rb") as fh:
        dyn = ELFFile(fh).get_section_by_name(".dynamic")
        off = dyn["sh_offset"]
        tags = [t.entry.d_tag for t in dyn.iter_tags()]
    i = tags.index("DT_NEEDED")
    bad = patched(data, off + i * 16 + 8, "<Q", 1 << 31)
    expect_input_error(write(tmp_path, "needed.so", bad), "string")


def test_symlink_loop_directory_missing(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    expect_input_error(tmp_path / "a", "symlink loop")
    expect_input_error(tmp_path, "directory")
    expect_input_error(tmp_path / "missing.so", "No such file")


def test_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.so"
    os.mkfifo(fifo)
    done: list = []

    def target():
        try:
            read_elf(fifo)
        except InputError as exc:
            done.append(exc.message)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(10)
    assert done and "not a regular file" in done[0]


def test_unreadable_file(host_libs, tmp_path, monkeypatch):
    # root reads everything, so the permission failure is injected at os.open
    real_open = os.open

    def deny(path, *a, **kw):
        if str(path).endswith("secret.so"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    p = write(tmp_path, "secret.so", host_libs["main"].read_bytes())
    monkeypatch.setattr(os, "open", deny)
    expect_input_error(p, "Permission denied")


def test_message_is_one_line_for_hostile_names(tmp_path):
    p = write(tmp_path, "evil\nname.so", b"not elf")
    with pytest.raises(InputError) as err:
        read_elf(p)
    assert "\n" not in err.value.message


def test_no_section_headers_still_gives_the_dynamic_section(host_libs, tmp_path):
    # as after sstrip: e_shoff, e_shnum and e_shstrndx zeroed; ld.so only needs program headers
    data = host_libs["main"].read_bytes()
    bare = patched(patched(patched(data, 0x28, "<Q", 0), 0x3C, "<H", 0), 0x3E, "<H", 0)
    info = read_elf(write(tmp_path, "sstripped.so", bare))
    full = read_elf(host_libs["main"])
    assert (info.needed, info.soname, info.runpath) == (full.needed, full.soname, full.runpath)
    # the dynamic symbols come from DT_SYMTAB, as ld.so finds them
    assert info.symbols == full.symbols and any("no section header table" in w for w in info.warnings)

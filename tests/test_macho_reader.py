"""read_macho on dylibs made by clang-15 with ld64.lld-15, and a universal binary by llvm-lipo-15.

Expected values come from the sources in tests/platform_fixtures.py; load commands, slices and
bindings are cross-checked with llvm-otool-15 / llvm-objdump-15.
"""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from audit.errors import InputError
from audit.macho.reader import _Slice, is_macho, read_macho
from audit.binary.model import IMPORT, REEXPORT, WEAK
from conftest import require_tool
from platform_fixtures import macho_libs  # noqa: F401  (session fixture)

VENDOR = re.compile(rb"cublas|cudnn|cufft|fk_")


def tool(name: str, *args) -> str:
    return subprocess.run([require_tool(name), *map(str, args)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("arch,machine", [("arm64", "CPU_TYPE_ARM64"), ("x86_64", "CPU_TYPE_X86_64")])
def test_rpath_and_weak_loads(macho_libs, arch, machine):
    [info] = read_macho(macho_libs[arch], VENDOR)
    assert info.format == "macho" and info.machine == machine and info.bits == 64 and info.slice is None
    assert info.file_type == "MH_DYLIB" and info.soname == "@rpath/libfkapp.dylib"
    assert [(i.name, i.kind) for i in info.imports] == [
        ("/usr/lib/libSystem.B.dylib", IMPORT), ("@rpath/libcublas.dylib", IMPORT), ("@rpath/libcudnn.dylib", WEAK)]
    # otool -L lists the install name first, then the loads in order, "weak" marked
    listed = re.findall(r"^\s+(\S+) \(.*?(weak)?\)$", tool("llvm-otool-15", "-L", macho_libs[arch]), re.M)[1:]
    assert [(n, WEAK if w else IMPORT) for n, w in listed] == [(i.name, i.kind) for i in info.imports]
    assert info.needed == ["/usr/lib/libSystem.B.dylib", "@rpath/libcublas.dylib", "@rpath/libcudnn.dylib"]
    assert info.rpath == ["@loader_path/../lib", "@executable_path/Frameworks"]
    assert info.rpath == re.findall(r"path (\S+) \(offset", tool("llvm-otool-15", "-l", macho_libs[arch]))
    uuid = re.search(r"uuid (\S+)", tool("llvm-otool-15", "-l", macho_libs[arch])).group(1)
    assert info.build_id == uuid.replace("-", "").lower()


def test_imports_name_their_library(macho_libs):
    [info] = read_macho(macho_libs["arm64"], VENDOR)
    imported = {s.name: (s.version_file, s.bind) for s in info.symbols if not s.defined}
    assert imported["cublasCreate_v2"] == ("@rpath/libcublas.dylib", "GLOBAL")
    assert imported["cudnnCreate"] == ("@rpath/libcudnn.dylib", "WEAK")  # __attribute__((weak_import))
    assert imported["dlopen"][0] == "/usr/lib/libSystem.B.dylib"
    assert {s.name for s in info.symbols if s.defined} == {"fk_app_run"}
    assert info.code_loading_imports == ["dlopen", "dlsym"]
    by_dylib = {i.name: i.symbols for i in info.imports}
    assert by_dylib["@rpath/libcublas.dylib"] == 1 and by_dylib["@rpath/libcudnn.dylib"] == 1


def test_bind_opcodes_agree_with_objdump(macho_libs):
    """The dyld-info bind opcodes alone (what a file stripped of its symbol table keeps) name
    the same imports and libraries as llvm-objdump --bind / --lazy-bind."""
    path = macho_libs["x86_64"]
    out = tool("llvm-objdump-15", "--macho", "--bind", "--lazy-bind", path)
    expected = {(m.group(2).removeprefix("_"), m.group(1))
                for m in re.finditer(r"\s(libSystem|libcublas|libcudnn)\s+(\w+)\s*$", out, re.M)}
    assert ("cublasCreate_v2", "libcublas") in expected
    [info] = read_macho(path)
    dylibs = [i.name for i in info.imports]
    data = path.read_bytes()
    sl = _Slice(str(path), data, 0, len(data), None)
    cmd = re.search(r"cmd LC_DYLD_INFO_ONLY.*?bind_off (\d+)\n\s+bind_size (\d+).*?lazy_bind_off (\d+)\n\s+lazy_bind_size (\d+)",
                    tool("llvm-otool-15", "-l", path), re.S)
    got: dict = {}
    for off, size, table in ((cmd.group(1), cmd.group(2), "b"), (cmd.group(3), cmd.group(4), "l")):
        if int(size):
            sl._binds(int(off), int(size), table, dylibs, got)
    names = {(n, lib.rsplit("/", 1)[-1].removesuffix(".dylib").removesuffix(".B")) for n, (_t, lib, _w) in got.items()}
    assert names == expected


def test_dlopen_string_and_dlsym_names(macho_libs):
    [info] = read_macho(macho_libs["arm64"], VENDOR, api_prefixes=(b"cufft",))
    assert [(h.section, h.text) for h in info.library_strings] == [("__TEXT,__cstring", "libcufft.dylib")]
    assert {h.text for h in info.api_strings} == {"cufftPlan1d", "cufftExecC2C"}
    data = macho_libs["arm64"].read_bytes()
    for hit in info.library_strings + info.api_strings:
        assert data[hit.offset:hit.offset + len(hit.text)] == hit.text.encode()


def test_universal_binary_two_slices(macho_libs):
    infos = read_macho(macho_libs["universal"], VENDOR)
    archs = tool("llvm-lipo-15", "-archs", macho_libs["universal"]).split()
    assert archs == ["x86_64", "arm64"]
    assert [i.machine for i in infos] == ["CPU_TYPE_X86_64", "CPU_TYPE_ARM64"]
    offsets = [int(m, 16) if m.startswith("0x") else int(m) for m in
               re.findall(r"offset (\S+)", tool("llvm-otool-15", "-f", macho_libs["universal"]))]
    assert [i.slice for i in infos] == [f"x86_64 @{offsets[0]:#x}", f"arm64 @{offsets[1]:#x}"]
    size = macho_libs["universal"].stat().st_size
    for info in infos:
        assert info.needed[1:] == ["@rpath/libcublas.dylib", "@rpath/libcudnn.dylib"]
        assert info.rpath == ["@loader_path/../lib", "@executable_path/Frameworks"]
        assert {h.text for h in info.library_strings} == {"libcufft.dylib"}
        assert info.size == size and info.sha256 == infos[0].sha256 != ""
    # offsets are of the universal file: the string lies in the slice it was read from
    data = macho_libs["universal"].read_bytes()
    assert all(data[i.library_strings[0].offset:].startswith(b"libcufft.dylib") for i in infos)
    assert infos[0].library_strings[0].offset < offsets[1] <= infos[1].library_strings[0].offset


def test_reexport(macho_libs):
    [info] = read_macho(macho_libs["arm64-reexport"], VENDOR)
    assert ("@rpath/libcudnn.dylib", REEXPORT) in {(i.name, i.kind) for i in info.imports}
    assert "LC_REEXPORT_DYLIB" in tool("llvm-otool-15", "-l", macho_libs["arm64-reexport"])
    assert "@rpath/libcudnn.dylib" in info.needed


def test_is_macho(macho_libs, tmp_path):
    assert is_macho(macho_libs["arm64"]) and is_macho(macho_libs["universal"])
    java = tmp_path / "A.class"
    java.write_bytes(struct.pack(">II", 0xCAFEBABE, 0x00000041) + b"\0" * 32)  # a class file's version
    assert not is_macho(java) and not is_macho(tmp_path / "missing")


def _thin(data) -> int:
    return 32  # the first load command follows the 64-bit header


MALFORMED = {
    "empty": lambda d: d.clear(),
    "header_only": lambda d: d.__delitem__(slice(40, None)),
    "truncated_half": lambda d: d.__delitem__(slice(len(d) // 2, None)),
    "sizeofcmds_huge": lambda d: d.__setitem__(slice(20, 24), struct.pack("<I", 0x7FFFFFF0)),
    "ncmds_huge": lambda d: d.__setitem__(slice(16, 20), struct.pack("<I", 0xFFFFFFFF)),
    "cmdsize_zero": lambda d: d.__setitem__(slice(_thin(d) + 4, _thin(d) + 8), b"\0\0\0\0"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_raises_input_error(macho_libs, tmp_path, case):
    data = bytearray(macho_libs["arm64"].read_bytes())
    MALFORMED[case](data)
    path = tmp_path / f"{case}.dylib"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        read_macho(path, VENDOR)
    assert str(path) in err.value.message and "\n" not in err.value.message


def test_universal_slice_outside_file(macho_libs, tmp_path):
    data = bytearray(macho_libs["universal"].read_bytes())
    struct.pack_into(">I", data, 8 + 20 + 12, 0x7FFFFFF0)  # the second slice's size
    path = tmp_path / "fat.dylib"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="slice 1"):
        read_macho(path)

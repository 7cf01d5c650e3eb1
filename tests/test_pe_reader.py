"""read_pe on DLLs made by MinGW-w64 (GNU ld) and by clang-15 with lld-link-15.

Expected values come from the sources in tests/platform_fixtures.py; the import and export
tables are cross-checked with llvm-readobj-15 where it reads them.
"""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from audit.errors import InputError
from audit.binary.model import DELAY_LOAD, EXPORT_FORWARD, IMPORT
from audit.pe.reader import is_pe, read_pe
from conftest import require_tool
from platform_fixtures import pe_libs, pe_lld_libs  # noqa: F401  (session fixtures)

VENDOR = re.compile(rb"cublas|cudnn|cufft|fk_")


def readobj(*args) -> str:
    return subprocess.run([require_tool("llvm-readobj-15"), *map(str, args)], capture_output=True,
                          text=True, check=True).stdout


def test_mingw_import_of_cublas(pe_libs):
    info = read_pe(pe_libs["app"], VENDOR)
    assert info.format == "pe" and info.machine == "IMAGE_FILE_MACHINE_AMD64" and info.bits == 64
    assert info.file_type == "DLL" and info.soname == "fkapp.dll"
    assert [i.name for i in info.imports if i.kind == IMPORT] == \
        re.findall(r"Import \{\n  Name: (\S+)", readobj("--coff-imports", pe_libs["app"]))
    assert "cublas64_12.dll" in info.needed
    imported = {(s.name, s.version_file) for s in info.symbols if not s.defined and s.table == "import"}
    assert ("cublasCreate_v2", "cublas64_12.dll") in imported
    assert {"LoadLibraryA", "LoadLibraryW", "GetProcAddress"} <= set(info.code_loading_imports)
    assert info.sha256 and info.size == pe_libs["app"].stat().st_size


def test_mingw_import_thunks_are_not_static_copies(pe_libs):
    """MinGW keeps its COFF symbols: the import library's jump to cublasCreate_v2 is there by
    name, and is the import, not a copy of cuBLAS."""
    info = read_pe(pe_libs["app"], VENDOR)
    coff = [s for s in info.symbols if s.table == "coff-symtab"]
    assert coff, "MinGW leaves a COFF symbol table in an unstripped DLL"
    assert not [s.name for s in coff if s.defined and s.name.startswith(("cublas", "cufft"))]
    assert {"cublasCreate_v2", "cufftPlan1d"} <= {s.name for s in coff if not s.defined}
    assert "fk_app_run" in {s.name for s in coff if s.defined}
    stripped = read_pe(pe_libs["stripped"], VENDOR)
    assert "coff-symtab" not in stripped.symbol_counts
    assert stripped.needed == info.needed


def test_loadlibrary_strings_and_getprocaddress_names(pe_libs):
    info = read_pe(pe_libs["app"], VENDOR, api_prefixes=(b"cudnn",))
    texts = {h.text for h in info.library_strings}
    assert "cudnn64_9.dll" in texts  # LoadLibraryA("cudnn64_9.dll")
    assert "MIOpen.dll" in texts  # LoadLibraryW(L"MIOpen.dll"): UTF-16LE
    # import directory names are imports, not loads by name
    assert not texts & {"cublas64_12.dll", "KERNEL32.dll", "msvcrt.dll"}
    assert {h.text for h in info.api_strings} == {"cudnnCreate", "cudnnDestroy"}
    for hit in info.library_strings + info.api_strings:
        raw = pe_libs["app"].read_bytes()[hit.offset:hit.offset + 2 * len(hit.text)]
        assert raw.startswith(hit.text.encode()) or raw.startswith(hit.text.encode("utf-16-le"))


def test_mingw_delay_lib_is_seen_by_its_name(pe_libs):
    """dlltool --output-delaylib links the delay-load descriptor into .idata but GNU ld leaves
    the delay-import directory empty (llvm-readobj lists no DelayImport): the DLL name is then
    a string, and the thunk an imported name."""
    assert "DelayImport" not in readobj("--coff-imports", pe_libs["app"])
    info = read_pe(pe_libs["app"], VENDOR)
    assert "cufft64_11.dll" in {h.text for h in info.library_strings}
    assert "cufftPlan1d" in {s.name for s in info.symbols if not s.defined}


def test_lld_link_delay_load(pe_lld_libs):
    info = read_pe(pe_lld_libs["app"], VENDOR)
    out = readobj("--coff-imports", pe_lld_libs["app"])
    assert re.findall(r"DelayImport \{\n  Name: (\S+)", out) == ["cufft64_11.dll"]
    assert [(i.name, i.kind, i.symbols) for i in info.imports] == \
        [("cublas64_12.dll", IMPORT, 1), ("cufft64_11.dll", DELAY_LOAD, 1)]
    assert info.needed == ["cublas64_12.dll", "cufft64_11.dll"]
    delayed = [(s.name, s.version_file) for s in info.symbols if s.table == "delay-import"]
    assert delayed == [("cufftPlan1d", "cufft64_11.dll")]
    # lld-link puts the import tables in .rdata: their names are still no load-by-name string
    assert info.library_strings == []
    assert info.code_loading_imports == []


def test_export_forwarder(pe_libs):
    info = read_pe(pe_libs["forward"], VENDOR)
    out = subprocess.run([require_tool("llvm-objdump-15"), "-p", str(pe_libs["forward"])],
                         capture_output=True, text=True, check=True).stdout
    assert "cublasSgemm_v2 (forwarded to cublas64_12.cublasSgemm_v2)" in out
    assert [(f.symbol, f.target, f.via) for f in info.forwarders] == [("cublasSgemm_v2", "cublasSgemm_v2", "export")]
    assert ("cublas64_12.dll", EXPORT_FORWARD) in {(i.name, i.kind) for i in info.imports}
    assert "cublas64_12.dll" in info.needed
    exports = {s.name: s.version_file for s in info.symbols if s.table == "export"}
    assert exports == {"cublasSgemm_v2": "cublas64_12.dll", "fk_own": None}


def test_exports_of_the_fake_vendor_dll(pe_libs):
    info = read_pe(pe_libs["cublas"], None)
    exports = sorted(s.name for s in info.symbols if s.table == "export")
    assert exports == sorted(re.findall(r"Name: (cublas\w+)", readobj("--coff-exports", pe_libs["cublas"])))
    assert exports == ["cublasCreate_v2", "cublasSgemm_v2"]
    assert info.soname == "cublas64_12.dll"


def test_symbol_pattern_keeps_imports_and_selected_definitions(pe_libs):
    info = read_pe(pe_libs["app"], re.compile(rb"^fk_"))
    assert {s.name for s in info.symbols if s.defined} == {"fk_app_run"}
    assert "cublasCreate_v2" in {s.name for s in info.symbols if not s.defined}
    assert info.symbol_counts["import"] == len([s for s in info.symbols if s.table == "import"])


def test_is_pe(pe_libs, tmp_path):
    assert is_pe(pe_libs["app"])
    (tmp_path / "x").write_bytes(b"MZ" + b"\0" * 100)
    assert not is_pe(tmp_path / "x") and not is_pe(tmp_path / "missing")


def _patched(src, tmp_path, name, patch) -> str:
    data = bytearray(src.read_bytes())
    patch(data)
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return str(out)


def _pe_offset(data) -> int:
    return struct.unpack_from("<I", data, 0x3C)[0]


def _import_dir_offset(data) -> int:
    """The file offset of the import directory, from the headers (PE32+)."""
    pe = _pe_offset(data)
    nsec, opt_size = struct.unpack_from("<H", data, pe + 6)[0], struct.unpack_from("<H", data, pe + 20)[0]
    rva = struct.unpack_from("<I", data, pe + 24 + 112 + 8)[0]
    for i in range(nsec):
        _n, vsize, va, rawsize, raw = struct.unpack_from("<8sIIII", data, pe + 24 + opt_size + 40 * i)
        if va <= rva < va + max(vsize, rawsize):
            return raw + rva - va
    raise AssertionError("import directory in no section")


MALFORMED = {
    "empty": lambda d: d.clear(),
    "truncated_headers": lambda d: d.__delitem__(slice(0x100, None)),
    "truncated_half": lambda d: d.__delitem__(slice(len(d) // 2, None)),
    "bad_lfanew": lambda d: d.__setitem__(slice(0x3C, 0x40), struct.pack("<I", 0x7FFFFFF0)),
    "bad_magic": lambda d: d.__setitem__(slice(_pe_offset(d) + 24, _pe_offset(d) + 26), b"\x07\x01"),
    "many_sections": lambda d: d.__setitem__(slice(_pe_offset(d) + 6, _pe_offset(d) + 8), b"\xff\xff"),
    "import_name_outside": lambda d: d.__setitem__(slice(_import_dir_offset(d) + 12, _import_dir_offset(d) + 16),
                                                   struct.pack("<I", 0x7FFFFFF0)),
    "name_table_outside": lambda d: d.__setitem__(slice(_import_dir_offset(d), _import_dir_offset(d) + 4),
                                                  struct.pack("<I", 0x7FFFFFF0)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_raises_input_error(pe_libs, tmp_path, case):
    path = _patched(pe_libs["app"], tmp_path, f"{case}.dll", MALFORMED[case])
    with pytest.raises(InputError) as err:
        read_pe(path, VENDOR)
    assert path in err.value.message and "\n" not in err.value.message


def test_not_a_file(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        read_pe(tmp_path)

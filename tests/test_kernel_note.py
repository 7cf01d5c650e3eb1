"""`build` stamps each library with a `.note.package` (audit/kernel_build/package_note.py), so
an SBOM of `check` names our own kernel: read back by binutils' readelf, by our ELF reader and
in the CycloneDX/SPDX documents."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest

from audit.elf.reader import read_elf
from audit.files import sha256_file
from audit.kernel_build import package_note
from audit.kernel_build.builder import ensure_built
from audit.kernel_build.provenance import FileDigest
from conftest import require_tool


@pytest.fixture(scope="module")
def cpu_lib(fixture_root):
    require_tool("g++")
    tb = ensure_built(["cpu"], fixture_root / "fk_build").get("cpu")
    assert tb.status == "built", tb.reason
    return tb


def test_the_built_library_carries_its_package_note(cpu_lib):
    out = subprocess.run(["readelf", "-n", cpu_lib.library], capture_output=True, text=True, check=True).stdout
    assert "FDO_PACKAGING_METADATA" in out and '"name":"flash_kernel"' in out
    note = read_elf(cpu_lib.library).package_note
    assert (note["name"], note["type"], note["target"]) == ("flash_kernel", "generic", "cpu")
    # the source digest is recomputed from provenance.json alone
    sources = [FileDigest(s["path"], s["sha256"], s["size"]) for s in cpu_lib.provenance["sources"]]
    assert note["sourceDigest"] == package_note.source_digest(sources) == cpu_lib.provenance["package_note"]["sourceDigest"]
    # and the recorded output digest is of the stamped library
    assert cpu_lib.provenance["outputs"][0]["sha256"] == sha256_file(cpu_lib.library)


def test_an_sbom_of_the_library_names_our_kernel(cpu_lib, tmp_path):
    cdx = tmp_path / "k.cdx.json"
    proc = subprocess.run(["python3", "-m", "audit", "check", cpu_lib.library, "--format", f"cyclonedx={cdx}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    comp = json.loads(cdx.read_text())["components"][0]
    version = read_elf(cpu_lib.library).package_note["version"]
    assert (comp["name"], comp["version"], comp["purl"]) == (
        "libflash_kernel.so", version, f"pkg:generic/flash_kernel@{version}")


def test_note_bytes_are_the_elf_note_layout():
    """namesz 4 ("FDO\\0"), descsz of the JSON with its NUL, type 0xcafe1a7e, 4-aligned."""
    raw = package_note.note_bytes({"name": "x"})
    assert raw[:12] == struct.pack("<III", 4, 13, 0xCAFE1A7E)
    assert raw[12:16] == b"FDO\0" and raw[16:29] == b'{"name":"x"}\0' and raw[29:] == b"\0\0\0"

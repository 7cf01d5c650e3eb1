"""A wheel with one damaged member (its CRC does not match, or its deflate stream is corrupt):
that member is an unreadable entry (verdict error, exit 3), and every other member is still
audited. gcc-built libraries, the wheel written by zipfile and then damaged byte by byte."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import zipfile
import zlib

import pytest
from linkage_fixtures import cc_shared

from audit.cli import main
from audit.errors import EXIT_INPUT


def _data_offset(whl, name: str) -> tuple[int, int]:
    """(offset, size) of a member's stored bytes in the archive (after its local header)."""
    with zipfile.ZipFile(whl) as zf:
        info = zf.getinfo(name)
    raw = whl.read_bytes()
    fn_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    return info.header_offset + 30 + fn_len + extra_len, info.compress_size


def _flip(whl, at: int) -> None:
    raw = bytearray(whl.read_bytes())
    raw[at] ^= 0xFF
    whl.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("damaged")
    return {
        "clean": cc_shared(d / "libclean.so", "int clean(void){return 0;}\n"),
        "cublas": cc_shared(d / "libstatic.so", "int cublasSgemm_v2(void){return 0;}\n"),
        "victim": cc_shared(d / "libvictim.so", "int victim(void){return 1;}\n"),
        "big": _big_library(d),
    }


def _big_library(d):
    """A 17 MB library of incompressible data: a wheel holding it is unpacked by worker processes."""
    (d / "blob.bin").write_bytes(os.urandom(17 << 20))
    asm = d / "blob.s"
    asm.write_text('\t.section .rodata\n\t.globl blob\nblob:\n\t.incbin "blob.bin"\n'
                   '\t.section .note.GNU-stack,"",@progbits\n')
    subprocess.run(["gcc", "-shared", "-o", str(d / "libbig.so"), str(asm)], cwd=d, check=True, capture_output=True)
    return d / "libbig.so"


def _wheel(tmp_path, libs, compression, big):
    whl = tmp_path / "demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", compression) as zf:
        if big:
            zf.write(libs["big"], "demo/libbig.so")
        zf.write(libs["clean"], "demo/libclean.so")
        zf.write(libs["victim"], "demo/libvictim.so")
        zf.write(libs["cublas"], "demo/libstatic.so")
        zf.writestr("demo/__init__.py", "")
    return whl


def _check(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--format", "json", *map(str, args)])
    return exc.value.code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("jobs", ["1", "2"])  # 2: a wheel of over 16 MB, unpacked by 2 workers
@pytest.mark.parametrize("compression, where", [
    (zipfile.ZIP_STORED, "end"),  # the bytes read whole: the CRC check at the end fails
    (zipfile.ZIP_DEFLATED, "start"),  # the deflate stream is corrupt from its first block
])
def test_a_damaged_member_is_one_unreadable_entry(libs, tmp_path, capsys, compression, where, jobs):
    whl = _wheel(tmp_path, libs, compression, big=jobs == "2")
    offset, size = _data_offset(whl, "demo/libvictim.so")
    _flip(whl, offset + (size - 100 if where == "end" else 0))
    with zipfile.ZipFile(whl) as zf:  # the damage is real, and in that member only
        with pytest.raises((zipfile.BadZipFile, zlib.error)):
            zf.read("demo/libvictim.so")
        for other in ("demo/libclean.so", "demo/libstatic.so"):
            zf.read(other)
    rc, doc = _check(capsys, whl, "--jobs", jobs)
    assert rc == EXIT_INPUT
    by = {f["path"].split("!/", 1)[1]: f for f in doc["files"]}
    assert sorted(set(by) - {"demo/libbig.so"}) == ["demo/libclean.so", "demo/libstatic.so", "demo/libvictim.so"]
    assert by.get("demo/libbig.so", {"verdict": "pass"})["verdict"] == "pass"
    assert by["demo/libvictim.so"]["verdict"] == "error"
    assert by["demo/libvictim.so"]["error"].startswith("cannot read member: ")
    if where == "end":
        assert "Bad CRC-32" in by["demo/libvictim.so"]["error"]
    assert by["demo/libclean.so"]["verdict"] == "pass"
    assert by["demo/libstatic.so"]["verdict"] == "fail"
    assert [(x["rule"], x["kind"]) for x in by["demo/libstatic.so"]["findings"]] == [("nvidia.cublas", "static-symbol")]
    # __init__.py: a Python source that names no library loader, counted, not read
    assert doc["summary"]["error"] == 1 and doc["summary"]["skipped"] == {"python_no_load": 1}

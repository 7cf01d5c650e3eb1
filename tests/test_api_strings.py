"""The scan for vendor API names among a file's data strings (what a binary hands to dlsym),
checked against a plain reading of the same bytes, and numpy's quiet import for `check`.

The fixture's data section is written byte for byte here (gcc's assembler includes it with
.incbin), so where each string lies is known: one starts exactly where the scan's 4 MiB window
ends, one at the section's first byte, others are near misses."""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from audit.elf.parse import ElfImage
from audit.elf.strings import _CHUNK, identifier_strings, scannable
from conftest import require_tool

PREFIXES = (b"cudnn", b"cublas", b"mkl_", b"hipMalloc")
STRINGS = {  # offset in the section -> NUL-terminated string
    0: b"cudnnAtTheStart",  # no NUL before it: the section's first byte
    100: b"cublasCreate_v2",
    200: b"cuZZnotAPrefix",  # its first byte starts a prefix, its first three do not
    300: b"mkl_" + b"x" * 124,  # 128 bytes: the longest identifier taken
    500: b"mkl_" + b"y" * 125,  # 129 bytes: too long
    700: b"hipMalloc-not-an-identifier",
    800: b"xcudnnInside",  # the prefix is not at the string's start
    _CHUNK - 20: b"cudnnBeforeTheEdge",  # runs over the first window's end
    _CHUNK: b"cudnnAtTheEdge",  # starts exactly where the second window does
    _CHUNK + 40: b"cublasLtAfter",
}
SIZE = _CHUNK + 200


def _blob() -> bytes:
    data = bytearray(b"\x00" * SIZE)
    for at, text in STRINGS.items():
        data[at:at + len(text)] = text
    for at in range(1000, _CHUNK - 100, 4096):  # text that is no identifier string
        data[at:at + 12] = b"cud.nn.cubla"
    return bytes(data)


def _plain(data: bytes, prefixes) -> list[tuple[int, str]]:
    """The same question answered slowly: every NUL-terminated string of the section, whole."""
    out, at = [], 0
    for text in data.split(b"\x00")[:-1]:  # the last piece has no NUL after it
        if (3 <= len(text) <= 128 and re.fullmatch(rb"[A-Za-z_][A-Za-z0-9_]*", text)
                and any(text.startswith(p) for p in prefixes)):
            out.append((at, text.decode()))
        at += len(text) + 1
    return out


@pytest.fixture(scope="module")
def api_data_lib(tmp_path_factory) -> Path:
    gcc = require_tool("gcc")
    d = tmp_path_factory.mktemp("api-strings")
    (d / "blob.bin").write_bytes(_blob())
    (d / "lib.c").write_text('__asm__(".section .fkdata,\\"a\\",@progbits\\n.incbin \\"blob.bin\\"\\n.previous");\n'
                             "int fk_api(void) { return 1; }\n")
    out = d / "libfkapi.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), "lib.c"], cwd=d, check=True, capture_output=True)
    return out


def test_api_names_are_the_whole_strings_a_plain_reading_finds(api_data_lib):
    with open(api_data_lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        img = ElfImage(mm)
        sec = next(s for s in scannable(img) if s.name == ".fkdata")
        assert sec.size == SIZE
        expect = [(sec.offset + at, text) for at, text in _plain(bytes(mm[sec.offset:sec.offset + SIZE]), PREFIXES)]
        hits = [(h.offset, h.text) for h in identifier_strings(img, PREFIXES, []) if h.section == ".fkdata"]
    assert hits == expect
    texts = [t for _, t in hits]  # written above, independent of either reading
    assert texts == ["cudnnAtTheStart", "cublasCreate_v2", "mkl_" + "x" * 124, "cudnnBeforeTheEdge",
                     "cudnnAtTheEdge", "cublasLtAfter"]


def _threads_after_import(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport os\n"
                          "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"],
                         capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")})
    return out.stdout.split()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_numpy_for_check_starts_no_blas_threads_and_leaves_the_environment_alone():
    quiet = _threads_after_import("from audit.elf.quiet_numpy import import_numpy; import_numpy(); import numpy")
    assert quiet == ["1", "None"]
    if (os.cpu_count() or 1) > 1:  # the plain import does start them (what the quiet one avoids)
        assert int(_threads_after_import("import numpy")[0]) > 1
    kept = subprocess.run([sys.executable, "-c", "import os; from audit.elf.quiet_numpy import import_numpy; "
                           "import_numpy(); print(os.environ['OPENBLAS_NUM_THREADS'])"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "3"}).stdout.strip()
    assert kept == "3"  # a value the user set is put back

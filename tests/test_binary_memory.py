"""Resident memory follows the window being read, not the size of a DLL's data.

A Windows DLL's `.rdata` runs to hundreds of MB (cuBLASLt's DLL: 669 MB in all). Its library-name
strings (ASCII and UTF-16) and the API names it hands GetProcAddress are searched a window at a
time, each let go once searched. The fixture: a MinGW DLL that imports LoadLibraryA and
GetProcAddress, linked with 256 MiB of random bytes as read-only data (objcopy -I binary).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent
DATA = 256 << 20
LOADER_C = ("#include <windows.h>\n"
            "void *fk_load(const char *n) { HMODULE h = LoadLibraryA(n); return h ? (void *)GetProcAddress(h, \"f\") : 0; }\n")
# the audit's peak resident set, measured by a wrapper around it
_MEASURE = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


@pytest.fixture(scope="module")
def big_dll(tmp_path_factory) -> Path:
    gcc = require_tool("x86_64-w64-mingw32-gcc")
    objcopy = require_tool("x86_64-w64-mingw32-objcopy")
    d = tmp_path_factory.mktemp("bigdll")
    (d / "blob.bin").write_bytes(os.urandom(DATA))
    (d / "loader.c").write_text(LOADER_C)
    subprocess.run([objcopy, "-I", "binary", "-O", "pe-x86-64", "-B", "i386:x86-64",
                    "--rename-section", ".data=.rdata,alloc,load,readonly,data,contents", "blob.bin", "blob.o"],
                   cwd=d, check=True, capture_output=True)
    subprocess.run([gcc, "-shared", "-o", "big.dll", "loader.c", "blob.o"], cwd=d, check=True, capture_output=True)
    (d / "blob.bin").unlink()
    (d / "blob.o").unlink()
    return d / "big.dll"


def test_a_dll_with_256_mib_of_data_is_read_in_windows(big_dll):
    proc = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "audit", "check", "--format", "json",
                           str(big_dll)], capture_output=True, text=True, timeout=300, cwd=REPO)
    peak_kb = int(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    # the data alone would be 262,144 KB resident if held whole
    assert peak_kb < 160_000, f"peak resident {peak_kb} KB"

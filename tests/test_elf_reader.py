"""read_elf on gcc/clang-built host objects, checked against readelf and the fixture sources."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from audit.elf.reader import read_elf
from elf_fixtures import cross_libs, host_libs, tool  # noqa: F401 (pytest fixtures)

WHOLE = rb"(?<![^\x00])(?:cublas[A-Z][^\x00]*|mkl_[a-z][^\x00]*)(?![^\x00])"


def readelf(*args: str) -> str:
    return subprocess.run([tool("readelf"), "-W", *args], capture_output=True, text=True, check=True).stdout


def readelf_dynamic(path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in readelf("-d", str(path)).splitlines():
        m = re.search(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+.*\[(.*)\]", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def test_dynamic_section_matches_readelf_and_source(host_libs):
    info = read_elf(host_libs["main"])
    ref = readelf_dynamic(host_libs["main"])
    assert info.needed == ref["NEEDED"]
    assert "libfkdep.so" in info.needed
    assert info.soname == "libfkmain.so.1" == ref["SONAME"][0]
    assert info.runpath == ["$ORIGIN", "/opt/fk/lib"] == ref["RUNPATH"][0].split(":")
    assert info.rpath == [] and "RPATH" not in ref
    assert (info.elf_class, info.endian, info.machine, info.elf_type) == (64, "little", "EM_X86_64", "ET_DYN")


def test_rpath_is_kept_apart_from_runpath(host_libs):
    info = read_elf(host_libs["rpath"])
    assert info.rpath == ["/opt/fk/rpath"] == readelf_dynamic(host_libs["rpath"])["RPATH"][0].split(":")
    assert info.runpath == []


def test_interpreter_and_build_id_match_readelf(host_libs):
    info = read_elf(host_libs["prog"])
    interp = re.search(r"Requesting program interpreter: (\S+)\]", readelf("-l", str(host_libs["prog"])))
    assert info.interpreter == interp.group(1)
    build_id = re.search(r"Build ID: ([0-9a-f]+)", readelf("-n", str(host_libs["prog"])))
    assert info.build_id == build_id.group(1)
    assert read_elf(host_libs["main"]).interpreter is None  # a shared library has none


def test_sha256_and_size(host_libs):
    import hashlib

    data = host_libs["main"].read_bytes()
    info = read_elf(host_libs["main"])
    assert info.sha256 == hashlib.sha256(data).hexdigest() and info.size == len(data)


def test_version_needs_match_readelf(host_libs):
    info = read_elf(host_libs["main"])
    text = readelf("-V", str(host_libs["main"]))
    ref: dict[str, set[str]] = {}
    current = None
    section = text.split("Version needs section", 1)[1]
    for line in section.splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            ref[current] = set()
        m = re.search(r"Name: (\S+)", line)
        if m and current:
            ref[current].add(m.group(1))
    assert {v.file: set(v.versions) for v in info.version_needs} == ref
    dlopen = next(s for s in info.symbols if s.name == "dlopen")
    assert dlopen.version_file == "libc.so.6" and dlopen.version.startswith("GLIBC_")


def test_symbol_counts_match_readelf(host_libs):
    info = read_elf(host_libs["main"])
    counts = dict((name, int(n)) for name, n in
                  re.findall(r"Symbol table '(\.\w+)' contains (\d+) entries", readelf("-s", str(host_libs["main"]))))
    assert info.symbol_counts == counts


def test_imports_always_kept_and_code_loading(host_libs):
    info = read_elf(host_libs["main"])
    imports = {s.name for s in info.symbols if not s.defined}
    assert {"fk_dep_value", "dlopen", "printf"} <= imports
    assert all(s.table == ".dynsym" for s in info.symbols)  # no pattern: imports only
    assert "dlopen" in info.code_loading_imports
    assert "printf" not in info.code_loading_imports


@pytest.mark.parametrize("pattern,substring", [(WHOLE, False), (rb"cublasFake|mkl_", True),
                                               (rb"^(?:cublasFake|mkl_)", False)],
                         ids=["whole-name", "substring", "anchored"])
def test_pattern_selects_vendor_definitions(host_libs, pattern, substring):
    info = read_elf(host_libs["main"], re.compile(pattern))
    got = {(s.name, s.table, s.defined, s.kind, s.bind) for s in info.symbols if s.defined}
    assert ("cublasFakeGemm", ".dynsym", True, "FUNC", "GLOBAL") in got
    assert ("cublasFakeGemm", ".symtab", True, "FUNC", "GLOBAL") in got
    assert ("mkl_local_helper", ".symtab", True, "FUNC", "LOCAL") in got
    # a name sharing its tail with a longer one (xmkl_tail) is found on its own
    assert ("mkl_tail", ".dynsym", True, "FUNC", "GLOBAL") in got
    assert any(name == "xmkl_tail" for name, *_ in got) == substring  # "mkl_" is inside it
    assert not any(name == "fk_load" for name, *_ in got)


def test_library_strings_are_where_they_say(host_libs):
    info = read_elf(host_libs["main"])
    texts = {h.text for h in info.library_strings}
    assert {"libcublas.so.12", "libMIOpen.so"} <= texts
    data = host_libs["main"].read_bytes()
    for hit in info.library_strings:
        assert data[hit.offset:hit.offset + len(hit.text)] == hit.text.encode()
    # .dynstr is not scanned: DT_NEEDED names are not reported again as strings
    assert "libfkdep.so" not in texts


def test_relocatable_object_imports_from_symtab(host_libs):
    info = read_elf(host_libs["object"], re.compile(WHOLE))
    assert info.elf_type == "ET_REL" and ".dynsym" not in info.symbol_counts
    imports = {s.name for s in info.symbols if not s.defined}
    assert {"fk_dep_value", "dlopen"} <= imports
    assert info.code_loading_imports == ["dlopen"]
    assert "cublasFakeGemm" in {s.name for s in info.symbols if s.defined}


def test_big_endian_and_32_bit(cross_libs):
    be = read_elf(cross_libs["be64"], re.compile(rb"fk_tiny"))
    assert (be.elf_class, be.endian, be.machine, be.soname) == (64, "big", "EM_PPC64", "libbe64.so.1")
    assert "fk_tiny" in {s.name for s in be.symbols if s.defined}
    x86 = read_elf(cross_libs["x86_32"], re.compile(rb"fk_tiny"))
    assert (x86.elf_class, x86.endian, x86.machine, x86.soname) == (32, "little", "EM_386", "libx86_32.so.1")
    assert "fk_tiny" in {s.name for s in x86.symbols if s.defined}
    for info, path in ((be, cross_libs["be64"]), (x86, cross_libs["x86_32"])):
        counts = dict((n, int(c)) for n, c in
                      re.findall(r"Symbol table '(\.\w+)' contains (\d+) entries", readelf("-s", str(path))))
        assert info.symbol_counts == counts


def test_to_dict_is_json_ready(host_libs):
    import json

    d = read_elf(host_libs["main"]).to_dict()
    assert json.loads(json.dumps(d))["soname"] == "libfkmain.so.1"


@pytest.mark.parametrize("key", ["main", "versioned"])
def test_symbol_versions_match_readelf(host_libs, key):
    info = read_elf(host_libs[key], re.compile(rb"^fk_|^cublas"))
    ref = {}
    for line in readelf("--dyn-syms", str(host_libs[key])).splitlines():
        parts = line.split()  # Num: Value Size Type Bind Vis Ndx Name[@[@]VERSION] [(n)]
        if len(parts) >= 8 and parts[0].rstrip(":").isdigit():
            name, _, version = parts[7].replace("@@", "@").partition("@")
            ref[name] = version or None
    dyn = {s.name: s.version for s in info.symbols if s.table == ".dynsym"}
    assert dyn and all(ref[name] == version for name, version in dyn.items())
    if key == "versioned":
        assert dyn["fk_v1"] == "FK_1.0" and dyn["fk_v2"] == "FK_2.0"
    else:
        assert dyn["cublasFakeGemm"] is None and dyn["dlopen"].startswith("GLIBC_")


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FORKED_READ = r"""
import hashlib, json, os, re, sys, threading
from audit.elf import hashing, prescan
from audit.elf.reader import read_elf

path, rx = sys.argv[1], re.compile(sys.argv[2].encode("latin-1"))
plain = read_elf(path, rx).to_dict()
forks = []
real_fork = os.fork
os.fork = lambda: forks.append(1) or real_fork()
prescan.MIN_ENTRIES, hashing.MIN_FORK_BYTES = 1, 1
out = {"threads": threading.active_count()}
forked = read_elf(path, rx).to_dict()
out["forks"] = len(forks)
out["same"] = forked == plain
out["sha"] = forked["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
hashing.prefetch(path)  # started early, as `check FILE` does; collected by the next read
out["prefetched"] = bool(hashing._prefetched)
out["same_prefetched"] = read_elf(path, rx).to_dict() == plain
out["forks_after"], out["left"] = len(forks), bool(hashing._prefetched)
print(json.dumps(out))
"""


@pytest.mark.parametrize("pattern", [WHOLE, rb"cublasFake|mkl_"], ids=["whole-name", "substring"])
def test_forked_prescan_and_hash_give_the_same_result(host_libs, pattern):
    """Large files hash in a forked child and select their largest symbol table in another
    (audit.elf.hashing, audit.elf.prescan); with the size thresholds lowered, this small library
    takes those paths, and everything read must equal the in-process read. Run in a fresh
    interpreter: the forks are only taken in a single-threaded process, and pytest's may not be."""
    import json
    import sys

    cp = subprocess.run([sys.executable, "-c", _FORKED_READ, str(host_libs["main"]), pattern.decode("latin-1")],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _REPO}, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    got = json.loads(cp.stdout)
    assert got["threads"] == 1
    assert got["forks"] == 2 and got["same"] and got["sha"]  # the hash child and the prescan child
    assert got["prefetched"] and got["same_prefetched"]
    assert got["forks_after"] == 4 and not got["left"]  # the read took the prefetched hash


def test_a_cpu_counts_as_free_when_half_of_one_stayed_idle():
    """audit.elf.idle from two /proc/stat samples (idle ticks over all CPUs, all ticks, CPUs):
    this process keeps one CPU busy, so a second one free means about half the ticks idle."""
    from audit.elf.idle import has_spare

    start = (1000, 5000, 2)
    assert has_spare(start, (1000 + 18, 5000 + 40, 2))  # the other CPU idle 18 of 20 ticks
    assert has_spare(start, (1000 + 10, 5000 + 40, 2))  # half of it: just enough
    assert not has_spare(start, (1000 + 3, 5000 + 40, 2))  # both CPUs busy
    assert not has_spare(start, (1000 + 40, 5000 + 40, 1))  # one CPU: it is this process's
    assert has_spare(start, (1000 + 60, 5000 + 80, 4))  # 3 of 4 CPUs idle
    assert has_spare(start, (1000, 5000 + 4, 2))  # too short to tell: as without a measure
    assert has_spare(start, (900, 5000 + 40, 2))  # counters gone back (another namespace?): no conclusion


def test_the_cpus_idle_time_is_read_where_the_system_has_it():
    from audit.elf import idle

    got = idle._sample()
    if not os.path.exists("/proc/stat"):
        assert got is None
        return
    busy_idle, total, cpus = got
    assert cpus >= 1 and 0 <= busy_idle <= total


_BUSY_READ = r"""
import json, os, re, sys
from audit.elf import idle, prescan
from audit.elf.reader import read_elf

path, rx = sys.argv[1], re.compile(sys.argv[2].encode("latin-1"))
plain = read_elf(path, rx, sha256=False).to_dict()
forks = []
real_fork = os.fork
os.fork = lambda: forks.append(1) or real_fork()
prescan.MIN_ENTRIES = 1
out = {}
# (idle ticks over the CPUs, all ticks, CPUs) at the mark and when the child would be forked
samples = {"busy": [(1000, 5000, 2), (1002, 5040, 2)], "free": [(1000, 5000, 2), (1020, 5040, 2)]}
for name, seq in samples.items():
    feed = iter(seq)
    idle._sample = lambda: next(feed)
    idle.mark()  # as `check` does when it starts
    before = len(forks)
    got = read_elf(path, rx, sha256=False).to_dict()
    out[name] = {"forks": len(forks) - before, "same": got == plain}
print(json.dumps(out))
"""


def test_no_child_is_forked_when_every_cpu_is_busy(host_libs):
    """With the CPUs taken since the command started (audit.elf.idle), the large table is selected
    in this process, with the same result; with one free, the child is forked as before. Run in
    a fresh interpreter: the fork is only taken in a single-threaded process."""
    import json
    import sys

    cp = subprocess.run([sys.executable, "-c", _BUSY_READ, str(host_libs["main"]), WHOLE.decode("latin-1")],
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _REPO}, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    got = json.loads(cp.stdout)
    assert got["busy"] == {"forks": 0, "same": True}, got
    assert got["free"] == {"forks": 1, "same": True}, got

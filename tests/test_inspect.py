"""`sovereign-audit inspect`, run as a real process (exit codes, stdout/stderr split)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from elf_fixtures import KERNELS, compressed_hip_libs, hip_libs, host_libs  # noqa: F401 (pytest fixtures)


def inspect(*args: str):
    return subprocess.run([sys.executable, "-m", "audit", "inspect", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_text_output(host_libs):
    r = inspect(host_libs["main"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(host_libs["main"]) in out
    for text in ("libfkdep.so", "libfkmain.so.1", "$ORIGIN, /opt/fk/lib", "libcublas.so.12", "dlopen",
                 "ELF64 little-endian EM_X86_64 ET_DYN"):
        assert text in out
    # the default sovereign policy flags the vendor-named definition, and only vendor-named ones
    vendor = out.split("vendor-looking symbols:")[1].split("library-name strings:")[0]
    assert "cublasFakeGemm" in vendor and "mkl_local_helper" in vendor
    assert "fk_load" not in vendor and "fk_dep_value" not in vendor
    assert r.stderr == ""


def test_json_output_and_directory_walk(host_libs, tmp_path):
    d = tmp_path / "tree"
    (d / "sub").mkdir(parents=True)
    shutil.copy(host_libs["main"], d / "sub" / "libfkmain.so")
    shutil.copy(host_libs["dep"], d / "libfkdep.so")
    (d / "README.txt").write_text("not an ELF")
    (d / "sub" / "data.bin").write_bytes(b"\0" * 100)
    (d / "loop").symlink_to(d, target_is_directory=True)  # not followed: no loop
    r = inspect("--json", d)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "sovereign-audit.inspect/1"
    assert sorted(f["path"].rsplit("/", 1)[-1] for f in doc["files"]) == ["libfkdep.so", "libfkmain.so"]
    assert doc["skipped_non_elf"] == 2 and doc["errors"] == []
    main = next(f for f in doc["files"] if f["path"].endswith("libfkmain.so"))
    assert main["soname"] == "libfkmain.so.1" and "libfkdep.so" in main["needed"]


def test_device_code_in_text_and_json(hip_libs):
    r = inspect(hip_libs["both"])
    assert r.returncode == 0, r.stderr
    assert "gfx1030" in r.stdout and "gfx90a:sramecc+:xnack-" in r.stdout
    for k in KERNELS:
        assert k in r.stdout
    doc = json.loads(inspect("--json", hip_libs["both"]).stdout)
    targets = {d["target"] for d in doc["files"][0]["device_code"] if d["kind"] == "amdgcn-code-object"}
    assert targets == {"gfx1030", "gfx90a:sramecc+:xnack-"}


def test_bad_inputs_exit_3_and_others_still_print(host_libs, tmp_path):
    bad = tmp_path / "broken.so"
    bad.write_bytes(host_libs["main"].read_bytes()[:200])
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    r = inspect(host_libs["main"], bad, empty, tmp_path / "missing.so")
    assert r.returncode == 3
    assert "libfkmain.so.1" in r.stdout  # the good file is still shown
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    assert "broken.so" in lines[0] and "empty.so" in lines[1] and "missing.so" in lines[2]
    assert "Traceback" not in r.stderr


def test_unreadable_device_entry_exits_3_like_check(compressed_hip_libs, tmp_path):
    # a real hipcc bundle in a zlib CCOB container, its compressed stream damaged: the file is
    # read, one entry is not, so neither command may call the run clean
    data = bytearray(compressed_hip_libs["v2-zlib"].read_bytes())
    at = data.find(b"CCOB")
    data[at + 40:at + 60] = b"\xff" * 20
    bad = tmp_path / "libbadccob.so"
    bad.write_bytes(bytes(data))
    r = inspect(bad)
    assert "ERROR: zlib" in r.stdout and "1 device-code entry unreadable" in r.stdout
    assert r.returncode == 3, r.stdout
    assert r.stderr.startswith("error: ") and "zlib" in r.stderr and "Traceback" not in r.stderr
    j = inspect("--json", bad)
    assert j.returncode == 3 and "zlib" in json.loads(j.stdout)["errors"][0]["error"]
    c = subprocess.run([sys.executable, "-m", "audit", "check", str(bad)], capture_output=True, text=True, timeout=300)
    assert c.returncode == 3 and "zlib" in c.stdout


def test_untrusted_names_are_escaped(host_libs, tmp_path):
    evil = tmp_path / "lib\x1b[31mred\x07.so"
    shutil.copy(host_libs["main"], evil)
    r = inspect(evil)
    assert r.returncode == 0
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b[31mred\\x07.so" in r.stdout
    broken = tmp_path / "bad\x1bname.so"
    broken.write_bytes(b"junk")
    r = inspect(broken)
    assert r.returncode == 3 and "\x1b" not in r.stderr and "\\x1bname.so" in r.stderr


def test_usage_error_exit_2():
    r = subprocess.run([sys.executable, "-m", "audit", "inspect"], capture_output=True, text=True)
    assert r.returncode == 2


def test_dependency_tree_follows_runpath(host_libs):
    doc = json.loads(inspect("--json", host_libs["main"]).stdout)
    tree = doc["files"][0]["dependency_tree"]
    dep = next(c for c in tree["children"] if c["name"] == "libfkdep.so")
    # libfkmain.so has DT_RUNPATH $ORIGIN and libfkdep.so sits beside it
    assert dep["path"] == str(host_libs["dep"]) and dep["how"] == "runpath"
    text = inspect(host_libs["main"]).stdout
    assert "dependency tree:" in text and f"libfkdep.so -> {host_libs['dep']} (runpath" in text
    assert "dependency_tree" not in json.loads(inspect("--json", "--no-deps", host_libs["main"]).stdout)["files"][0]


def test_a_folder_without_elf_files_exits_3_as_check_does(tmp_path):
    (tmp_path / "README.txt").write_text("no binaries here\n")
    (tmp_path / "data.bin").write_bytes(b"\0" * 64)
    r = inspect(tmp_path)
    assert r.returncode == 3
    assert r.stderr.splitlines() == [f"error: no ELF file found in {tmp_path}: nothing was read"]
    assert r.stdout.splitlines()[-1] == "0 file(s) read, 0 unreadable, 2 skipped (nothing to audit)"
    doc = json.loads(inspect("--json", tmp_path).stdout)
    assert doc["files"] == [] and [e["error"] for e in doc["errors"]] == [
        f"no ELF file found in {tmp_path}: nothing was read"]
    c = subprocess.run([sys.executable, "-m", "audit", "check", str(tmp_path)], capture_output=True, text=True,
                       timeout=300)
    assert c.returncode == r.returncode and f"error: no ELF file found in {tmp_path}" in c.stdout

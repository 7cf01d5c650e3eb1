"""Static archives (`.a`) are audited member by member: an object file in one is linked into a
user's build, so vendor code in it (libcublas_static.a, MKL's .a files) must be found, and an
archive that cannot be read whole must never pass.

Every input is built here: objects with gcc/clang/mingw `-c`, archives with GNU ar and llvm-ar,
wheels, conda packages and image layers with Python's zipfile/tarfile. Each case runs the CLI in
a subprocess: exit code, one `error:` line, no traceback.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from image_fixtures import docker_archive, layer_tar
from linkage_fixtures import run

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION

REPO = Path(__file__).resolve().parents[1]
LONG = "a_member_name_longer_than_fifteen.o"  # past ar's 16-byte field: kept in the `//` table


def cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "audit", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def as_json(*args) -> tuple[int, dict]:
    proc = cli("check", "--format", "json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def verdicts(doc: dict) -> dict[str, str]:
    return {f["path"]: f["verdict"] for f in doc["files"]}


def rules(doc: dict, path: str) -> set[tuple[str, str, str]]:
    (f,) = [f for f in doc["files"] if f["path"] == path]
    return {(x["rule"], x["kind"], x["subject"]) for x in f["findings"]}


def assert_one_input_error(proc: subprocess.CompletedProcess, *expect: str) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == EXIT_INPUT, proc.stdout + proc.stderr
    errors = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip().startswith("error:")]
    assert len(errors) == 1, proc.stdout + proc.stderr
    for want in expect:
        assert want in errors[0], (want, errors)


@pytest.fixture(scope="module")
def objs(tmp_path_factory) -> dict[str, Path]:
    """Object files: one defining a cuBLAS entry point (the shipped policy's nvidia.cublas
    symbol rule), one calling it (undefined), one of the project's own (clean)."""
    d = tmp_path_factory.mktemp("objs")
    sources = {
        "vendor": "int cublasSgemm_v2(int a) { return a * 2; }\n",
        "caller": "extern int cublasSgemm_v2(int);\nint use_gemm(int a) { return cublasSgemm_v2(a) + 1; }\n",
        "clean": "int own_add(int a, int b) { return a + b; }\n",
        "clean2": "double own_half(double x) { return x / 2; }\n",
    }
    out = {}
    for name, text in sources.items():
        (d / f"{name}.c").write_text(text)
        run("gcc", "-c", "-fPIC", "-o", d / f"{name}.o", d / f"{name}.c")
        out[name] = d / f"{name}.o"
    (d / LONG).write_bytes(out["clean2"].read_bytes())
    out["long"] = d / LONG
    return out


def ar(out: Path, *members: Path, flags: str = "rcs", cwd: Path | None = None) -> Path:
    run("ar", flags, out, *members, cwd=cwd)
    return out


@pytest.fixture()
def vendor_a(objs, tmp_path) -> Path:
    return ar(tmp_path / "libmixed.a", objs["vendor"], objs["long"])


@pytest.fixture()
def clean_a(objs, tmp_path) -> Path:
    return ar(tmp_path / "libown.a", objs["clean"], objs["long"])


def test_vendor_object_in_an_archive_is_found_and_named_inside_it(vendor_a):
    rc, doc = as_json(vendor_a)
    assert rc == EXIT_VIOLATION, doc
    assert verdicts(doc) == {f"{vendor_a}!/vendor.o": "fail", f"{vendor_a}!/{LONG}": "pass"}
    assert rules(doc, f"{vendor_a}!/vendor.o") == {("nvidia.cublas", "static-symbol", "cublasSgemm_v2")}
    assert all(f["elf_type"] == "ET_REL" for f in doc["files"])
    assert "sovereign-audit-ar" not in json.dumps(doc)  # no temporary folder in the report


def test_clean_archive_passes(clean_a):
    rc, doc = as_json(clean_a)
    assert rc == EXIT_OK, doc
    assert verdicts(doc) == {f"{clean_a}!/clean.o": "pass", f"{clean_a}!/{LONG}": "pass"}


def test_object_that_calls_a_vendor_api_is_a_violation(objs, tmp_path):
    lib = ar(tmp_path / "libcalls.a", objs["caller"])
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION, doc
    assert rules(doc, f"{lib}!/caller.o") == {("nvidia.cublas", "imported-symbol", "cublasSgemm_v2")}


def test_archive_in_a_folder_and_in_a_wheel_gets_the_same_verdicts(vendor_a, clean_a, tmp_path):
    for lib, expect_rc in ((vendor_a, EXIT_VIOLATION), (clean_a, EXIT_OK)):
        folder = tmp_path / f"dist-{lib.stem}"
        (folder / "lib").mkdir(parents=True)
        (folder / "lib" / lib.name).write_bytes(lib.read_bytes())
        (folder / "README.txt").write_text("docs\n")
        whl = tmp_path / f"demo_{lib.stem}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.write(lib, f"demo/lib/{lib.name}")
            zf.writestr("demo/__init__.py", "")
        for target, shown in ((folder, f"{folder}/lib/{lib.name}"), (whl, f"{whl}!/demo/lib/{lib.name}")):
            rc, doc = as_json(target)
            assert rc == expect_rc, doc
            got = {p.removeprefix(shown): v for p, v in verdicts(doc).items()}
            want = ({"!/vendor.o": "fail", f"!/{LONG}": "pass"} if lib is vendor_a
                    else {"!/clean.o": "pass", f"!/{LONG}": "pass"})
            assert got == want, doc
            assert "archive" not in doc["summary"]["skipped"], doc
            text = json.dumps(doc)
            assert "sovereign-audit-ar" not in text and "sovereign-audit-wheel" not in text


def test_archive_in_an_image_is_audited(vendor_a, tmp_path):
    layer = layer_tar([("dir", "usr"), ("dir", "usr/lib"), ("file", "usr/lib/libmixed.a", vendor_a.read_bytes())])
    image = docker_archive(tmp_path / "image.tar", [layer])
    rc, doc = as_json(image)
    assert rc == EXIT_VIOLATION, doc
    assert verdicts(doc) == {f"{image}!/usr/lib/libmixed.a!/vendor.o": "fail",
                             f"{image}!/usr/lib/libmixed.a!/{LONG}": "pass"}


@pytest.mark.parametrize("fmt", ["tar.bz2", "conda"])
def test_archive_in_a_conda_package_is_audited(vendor_a, tmp_path, fmt):
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        for name, data in (("info/index.json", b'{"name": "demo"}'), ("lib/libmixed.a", vendor_a.read_bytes())):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    if fmt == "tar.bz2":
        import bz2

        pkg = tmp_path / "demo-1.0-0.tar.bz2"
        pkg.write_bytes(bz2.compress(tar.getvalue()))
    else:
        import zstandard

        pkg = tmp_path / "demo-1.0-0.conda"
        with zipfile.ZipFile(pkg, "w") as zf:
            zf.writestr("metadata.json", '{"conda_pkg_format_version": 2}')
            zf.writestr("pkg-demo-1.0-0.tar.zst", zstandard.ZstdCompressor().compress(tar.getvalue()))
            zf.writestr("info-demo-1.0-0.tar.zst", zstandard.ZstdCompressor().compress(b""))
    rc, doc = as_json(pkg)
    assert rc == EXIT_VIOLATION, doc
    assert verdicts(doc) == {f"{pkg}!/lib/libmixed.a!/vendor.o": "fail", f"{pkg}!/lib/libmixed.a!/{LONG}": "pass"}


def test_full_path_names_and_two_members_of_one_name(objs, tmp_path):
    """`ar P` keeps a member's path; `ar q` appends a second member of a name already there:
    each is audited on its own."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/clean.o").write_bytes(objs["vendor"].read_bytes())  # named clean.o, holds cuBLAS
    (tmp_path / "clean.o").write_bytes(objs["clean"].read_bytes())
    lib = ar(tmp_path / "libpaths.a", Path("sub/clean.o"), flags="rcsP", cwd=tmp_path)
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION and verdicts(doc) == {f"{lib}!/sub/clean.o": "fail"}, doc
    twice = ar(tmp_path / "libtwice.a", Path("clean.o"), cwd=tmp_path)
    (tmp_path / "sub2").mkdir()
    (tmp_path / "sub2/clean.o").write_bytes(objs["vendor"].read_bytes())
    run("ar", "q", twice, "sub2/clean.o", cwd=tmp_path)  # stored as a second "clean.o"
    rc, doc = as_json(twice)
    assert rc == EXIT_VIOLATION, doc
    assert sorted(f["verdict"] for f in doc["files"]) == ["fail", "pass"], doc
    assert {f["path"] for f in doc["files"]} == {f"{twice}!/clean.o"}


def test_bsd_archive_names_are_read(objs, tmp_path):
    llvm_ar = require_tool("llvm-ar")
    lib = tmp_path / "libbsd.a"
    run(llvm_ar, "--format=bsd", "rcs", lib, objs["vendor"], objs["long"])
    assert b"#1/" in lib.read_bytes()  # the long name is stored BSD-style
    rc, doc = as_json(lib)
    assert rc == EXIT_VIOLATION, doc
    assert verdicts(doc) == {f"{lib}!/vendor.o": "fail", f"{lib}!/{LONG}": "pass"}


def test_truncated_archive_is_one_input_error(vendor_a, tmp_path):
    data = vendor_a.read_bytes()
    for cut in (len(data) - 100, 8 + 30):  # inside the last member; inside the first header
        bad = tmp_path / f"libcut{cut}.a"
        bad.write_bytes(data[:cut])
        assert_one_input_error(cli("check", bad), str(bad), "truncated")


def test_malformed_headers_are_one_input_error(vendor_a, tmp_path):
    data = vendor_a.read_bytes()
    size_at = 8 + 48  # the first member's size field
    cases = {
        "size": data[:size_at] + b"12x4      " + data[size_at + 10:],
        "fmag": data[:8 + 58] + b"XX" + data[8 + 60:],
        "huge": data[:size_at] + b"9999999999" + data[size_at + 10:],
    }
    for name, blob in cases.items():
        bad = tmp_path / f"lib{name}.a"
        bad.write_bytes(blob)
        assert_one_input_error(cli("check", bad), str(bad), "malformed static archive")


def test_long_name_past_the_table_is_one_input_error(objs, tmp_path):
    lib = ar(tmp_path / "liblong.a", objs["long"])
    data = lib.read_bytes()
    at = data.index(b"/0              ")
    bad = tmp_path / "libbadref.a"
    bad.write_bytes(data[:at] + b"/999           " + data[at + 15:])
    assert_one_input_error(cli("check", bad), str(bad), "long name")


def test_thin_archive_is_one_input_error(objs, tmp_path):
    thin = ar(tmp_path / "libthin.a", objs["vendor"], flags="rcsT")
    assert thin.read_bytes().startswith(b"!<thin>\n")
    assert_one_input_error(cli("check", thin), str(thin), "thin archive: members live outside it")
    folder = tmp_path / "dist"
    folder.mkdir()
    (folder / "libthin.a").write_bytes(thin.read_bytes())
    assert_one_input_error(cli("check", folder), "thin archive")


def test_windows_and_macos_objects_in_an_archive_are_read(objs, tmp_path):
    """COFF and Mach-O objects are read as ELF ones are (test_archive_objects.py has more)."""
    mingw = require_tool("x86_64-w64-mingw32-gcc")
    clang = require_tool("clang-15")
    src = tmp_path / "f.c"
    src.write_text("int f(void){return 1;}\n")
    run(mingw, "-c", "-o", tmp_path / "coff.o", src)
    run(clang, "--target=arm64-apple-macos11", "-c", "-o", tmp_path / "macho.o", src)
    for obj, fmt in (("coff.o", "coff"), ("macho.o", "macho")):
        lib = ar(tmp_path / f"lib{obj}.a", tmp_path / obj, objs["clean"])
        rc, doc = as_json(lib)
        assert rc == EXIT_OK, doc
        assert {f["path"]: f.get("format") for f in doc["files"]} == {f"{lib}!/{obj}": fmt, f"{lib}!/clean.o": None}


def test_archive_with_no_object_file(tmp_path):
    """Named, an archive with nothing to audit in it is an error (nothing was read); met in a
    folder, it is counted and warned about."""
    empty = tmp_path / "libempty.a"
    empty.write_bytes(b"!<arch>\n")
    assert_one_input_error(cli("check", empty), "no object file")
    (tmp_path / "notes.txt").write_text("text\n")
    textual = ar(tmp_path / "libtext.a", tmp_path / "notes.txt")
    folder = tmp_path / "dist"
    folder.mkdir()
    (folder / "libtext.a").write_bytes(textual.read_bytes())
    proc = cli("check", "--format", "json", folder)
    doc = json.loads(proc.stdout)
    assert doc["summary"]["skipped"].get("archive") == 1, doc
    assert any(w.startswith(f"{folder}/libtext.a: static archive") for w in doc["warnings"]), doc


def test_archive_members_are_held_to_the_archive_limits(objs, tmp_path):
    lib = ar(tmp_path / "libone.a", objs["clean"])
    proc = cli("check", "--max-member-size", "100", lib)
    assert_one_input_error(proc, "--max-member-size")
    assert f"{lib}!/clean.o" in proc.stdout

"""Windows PE and macOS Mach-O files inside conda packages and container images, audited as in a
folder or wheel; tars met in a folder or wheel, whose members' first bytes are read.

The binaries are built by real linkers (platform_fixtures.py, test_check_pe.py,
test_check_macho.py): what a test expects comes from their sources (fkapp.dll imports
cublas64_12.dll, libfkapp.dylib loads @rpath/libcublas.dylib with LC_RPATH @loader_path/../lib),
never from the code under test.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from image_fixtures import docker_archive, layer_tar, oci_layout
from linkage_fixtures import cc_shared, tarball
from platform_fixtures import macho_libs, pe_libs  # noqa: F401  (fixtures)
from test_check import cli
from test_check_pe import pe_more  # noqa: F401  (fixture)
from test_conda import dot_conda, tar_bz2

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION

BUILDERS = {"conda": lambda d, e: dot_conda(d / "fkwin-1.0-0.conda", e),
            "tar.bz2": lambda d, e: tar_bz2(d / "fkwin-1.0-0.tar.bz2", e)}


def check_json(capsys, *args):
    rc, out, err = cli(capsys, "check", "--format", "json", *map(str, args))
    return rc, json.loads(out), err


def result(data: dict, path: str) -> dict:
    return next(f for f in data["files"] if f["path"] == path)


def child(res: dict, name: str) -> dict:
    return next(c for c in res["resolved"]["children"] if c["name"] == name)


# -- PE and Mach-O files in conda packages -------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_dll_in_a_conda_package_importing_cublas_fails(pe_libs, tmp_path, capsys, fmt):
    """A Windows package: the extension in Lib/site-packages, the vendor DLL in Library/bin (where
    conda puts DLLs): the import is found there, and the DLL itself is denied by its name."""
    pkg = BUILDERS[fmt](tmp_path, [
        ("Lib/site-packages/fk/fkapp.dll", "file", pe_libs["app"].read_bytes()),
        ("Library/bin/cublas64_12.dll", "file", pe_libs["cublas"].read_bytes()),
        ("Lib/site-packages/fk/__init__.py", "file", b""),
    ])
    rc, data, err = check_json(capsys, pkg)
    assert rc == EXIT_VIOLATION, err
    app = result(data, f"{pkg}!/Lib/site-packages/fk/fkapp.dll")
    assert app["verdict"] == "fail" and app["format"] == "pe"
    node = child(app, "cublas64_12.dll")
    assert (node["status"], node["how"], node["rule"]) == ("denied", "Library/bin", "nvidia.cublas")
    assert node["path"] == f"{pkg}!/Library/bin/cublas64_12.dll"
    assert ("nvidia.cublas", "needed") in {(x["rule"], x["kind"]) for x in app["findings"] if x["failing"]}
    assert result(data, f"{pkg}!/Library/bin/cublas64_12.dll")["verdict"] == "fail"
    assert "format not audited" not in json.dumps(data)


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_dll_alone_in_library_bin_importing_cublas_fails(pe_libs, tmp_path, capsys, fmt):
    pkg = BUILDERS[fmt](tmp_path, [("Library/bin/fkapp.dll", "file", pe_libs["app"].read_bytes())])
    rc, out, _ = cli(capsys, "check", str(pkg))
    assert rc == EXIT_VIOLATION
    assert f"{pkg}!/Library/bin/fkapp.dll" in out and "cublas64_12.dll" in out


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_clean_dll_in_a_conda_package_passes(pe_more, tmp_path, capsys, fmt):
    pkg = BUILDERS[fmt](tmp_path, [("Library/bin/fkclean.dll", "file", pe_more["clean"].read_bytes())])
    rc, data, err = check_json(capsys, pkg)
    assert rc == EXIT_OK, err
    assert [(f["path"], f["verdict"], f["format"]) for f in data["files"]] == \
        [(f"{pkg}!/Library/bin/fkclean.dll", "pass", "pe")]


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_dylib_in_a_conda_package_loading_cublas_through_rpath_fails(macho_libs, tmp_path, capsys, fmt):
    """A macOS package: lib/libfkapp.dylib loads @rpath/libcublas.dylib; its LC_RPATH
    @loader_path/../lib is the package's own lib/."""
    arm = macho_libs["arm64"]
    pkg = BUILDERS[fmt](tmp_path, [
        ("lib/libfkapp.dylib", "file", arm.read_bytes()),
        ("lib/libcublas.dylib", "file", (arm.parent / "libcublas.dylib").read_bytes()),
    ])
    rc, data, err = check_json(capsys, pkg)
    assert rc == EXIT_VIOLATION, err
    app = result(data, f"{pkg}!/lib/libfkapp.dylib")
    assert app["format"] == "macho"
    node = child(app, "@rpath/libcublas.dylib")
    assert (node["status"], node["how"], node["rule"]) == ("denied", "rpath", "nvidia.cublas")
    assert node["path"] == f"{pkg}!/lib/libcublas.dylib"


# -- PE files in container images ----------------------------------------------------------------

@pytest.mark.parametrize("how", [None, "gzip"])
def test_dll_in_an_image_layer_is_audited_inside_the_image(pe_libs, pe_more, tmp_path, capsys, how):
    """An image's DLLs are resolved inside the image (as its ELF files are): fkapp.dll's import
    is found in its own folder of the image."""
    layer = layer_tar([("dir", "app"), ("file", "app/fkapp.dll", pe_libs["app"].read_bytes()),
                       ("file", "app/cublas64_12.dll", pe_libs["cublas"].read_bytes()),
                       ("file", "app/fkclean.dll", pe_more["clean"].read_bytes())])
    img = (oci_layout(tmp_path / "img.tar", [layer], how=how, as_tar=True) if how
           else docker_archive(tmp_path / "img.tar", [layer]))
    rc, data, err = check_json(capsys, img)
    assert rc == EXIT_VIOLATION, err
    app = result(data, f"{img}!/app/fkapp.dll")
    assert app["verdict"] == "fail" and app["format"] == "pe"
    node = child(app, "cublas64_12.dll")
    assert (node["status"], node["how"], node["rule"]) == ("denied", "own folder", "nvidia.cublas")
    assert node["path"] == f"{img}!/app/cublas64_12.dll"
    assert result(data, f"{img}!/app/fkclean.dll")["verdict"] == "pass"
    assert "format not audited" not in json.dumps(data)


# -- tars met in a folder or wheel ---------------------------------------------------------------

SDIST = {"fk-1.0/PKG-INFO": b"Metadata-Version: 2.1\nName: fk\n", "fk-1.0/fk/__init__.py": b"x = 1\n",
         "fk-1.0/src/fk.c": b"int fk(void) { return 0; }\n"}


@pytest.fixture(scope="module")
def clean_so(fixture_root) -> Path:
    return cc_shared(Path(fixture_root) / "tars/libfkclean.so", "int fk_clean(void){return 0;}\n")


def test_sdist_of_sources_beside_a_clean_library_passes(clean_so, tmp_path, capsys):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "libfkclean.so").write_bytes(clean_so.read_bytes())
    (dist / "fk-1.0.tar.gz").write_bytes(tarball(SDIST))
    (dist / "notes.tar").write_bytes(tarball(SDIST, "w"))
    rc, data, err = check_json(capsys, dist)
    assert rc == EXIT_OK, err
    assert data["summary"]["skipped"]["compressed_tar"] == 1 and data["summary"]["skipped"]["tar"] == 1
    assert [f["verdict"] for f in data["files"]] == ["pass"]


@pytest.mark.parametrize("name,mode", [("fk-1.0.tar.gz", "w:gz"), ("fk-1.0.tgz", "w:gz"),
                                       ("fk-1.0.tar.xz", "w:xz"), ("fk.tar", "w")])
def test_a_tar_s_libraries_are_audited(clean_so, tmp_path, capsys, name, mode):
    """A tarball met in a folder (an sdist, a build's tarball): its binaries are written out and
    audited as a wheel's members are, named inside it."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "libfkclean.so").write_bytes(clean_so.read_bytes())
    (dist / name).write_bytes(tarball({**SDIST, "fk-1.0/fk/libcublas.so.12": clean_so.read_bytes(),
                                    "fk-1.0/fk/libother.so": clean_so.read_bytes()}, mode))
    rc, data, err = check_json(capsys, dist)
    assert rc == EXIT_VIOLATION and "Traceback" not in err
    bad = result(data, f"{dist / name}!/fk-1.0/fk/libcublas.so.12")
    assert [(x["rule"], x["kind"]) for x in bad["findings"]] == [("nvidia.cublas", "soname")]
    assert result(data, f"{dist / name}!/fk-1.0/fk/libother.so")["verdict"] == "pass"
    assert result(data, str(dist / "libfkclean.so"))["verdict"] == "pass"


def test_a_zstd_tar_s_library_is_audited(clean_so, tmp_path, capsys):
    import zstandard

    dist = tmp_path / "dist"
    dist.mkdir()
    data = tarball({**SDIST, "fk/libcublas.so.12": clean_so.read_bytes()}, "w")
    (dist / "fk-1.0.tar.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    rc, out, err = cli(capsys, "check", str(dist))
    assert rc == EXIT_VIOLATION and "fk-1.0.tar.zst!/fk/libcublas.so.12" in out


def test_tar_in_a_wheel(clean_so, tmp_path, capsys):
    whl = tmp_path / "fk-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("fk/__init__.py", "")
        zf.writestr("fk/data/sources.tar.gz", tarball(SDIST))
        zf.writestr("fk/data/vendor.tar.gz", tarball({"lib/libcublas.so.12": clean_so.read_bytes()}))
    rc, data, _ = check_json(capsys, whl)
    assert rc == EXIT_VIOLATION
    bad = result(data, f"{whl}!/fk/data/vendor.tar.gz!/lib/libcublas.so.12")
    assert [(x["rule"], x["kind"]) for x in bad["findings"]] == [("nvidia.cublas", "soname")]
    assert data["summary"]["skipped"]["compressed_tar"] == 1  # the sources: nothing in them to read


def test_gzip_bomb_tar_is_refused_quickly(clean_so, tmp_path, capsys):
    """A tar.gz whose one member is 1 GiB of zeros (about 1 MiB compressed): refused past the
    inflation limit (64 MiB here), not read to its end."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "libfkclean.so").write_bytes(clean_so.read_bytes())
    size = 1 << 30
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
        ti = tarfile.TarInfo("bomb/zeros")
        ti.size = size
        gz.write(ti.tobuf(format=tarfile.GNU_FORMAT))
        chunk = bytes(1 << 24)
        for _ in range(size // len(chunk)):
            gz.write(chunk)
    (dist / "bomb.tar.gz").write_bytes(raw.getvalue())
    start = time.monotonic()
    rc, out, err = cli(capsys, "check", str(dist))
    assert time.monotonic() - start < 10
    assert rc == EXIT_INPUT
    assert "bomb.tar.gz" in out + err and "--max-member-ratio" in out + err
    assert "Traceback" not in out + err


def test_damaged_tar_gz_is_an_error(clean_so, tmp_path, capsys):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "libfkclean.so").write_bytes(clean_so.read_bytes())
    good = tarball(SDIST)
    (dist / "fk-1.0.tar.gz").write_bytes(good[:len(good) // 2])
    rc, out, err = cli(capsys, "check", str(dist))
    assert rc == EXIT_INPUT and "fk-1.0.tar.gz" in out + err and "cannot read tar" in out + err
    assert "Traceback" not in out + err


def test_a_tar_s_unsafe_names_are_errors_only_where_a_member_needs_reading(clean_so, tmp_path, capsys):
    """A member named out of the tar (absolute, `..`) is never written: an error where it is a
    binary, nothing where it is data."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "build.tar.gz").write_bytes(tarball({"/etc/notes.txt": b"data\n", "../up/README": b"data\n",
                                                 "../../escape/libfk.so": clean_so.read_bytes(),
                                                 "ok/libfk.so": clean_so.read_bytes()}))
    rc, data, err = check_json(capsys, dist)
    assert rc == EXIT_INPUT and "Traceback" not in err
    by = {f["path"]: f for f in data["files"]}
    assert sorted(by) == [f"{dist}/build.tar.gz!/../../escape/libfk.so", f"{dist}/build.tar.gz!/ok/libfk.so"]
    assert by[f"{dist}/build.tar.gz!/../../escape/libfk.so"]["error"] == "unsafe member path in tar"
    assert by[f"{dist}/build.tar.gz!/ok/libfk.so"]["verdict"] == "pass"
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_a_named_tarball_is_read_and_one_with_nothing_to_audit_is_an_error(clean_so, tmp_path, capsys):
    sdist = tmp_path / "fk-1.0.tar.gz"
    sdist.write_bytes(tarball({**SDIST, "fk-1.0/fk/libcublas.so.12": clean_so.read_bytes()}))
    rc, data, _ = check_json(capsys, sdist)
    assert rc == EXIT_VIOLATION and [f["path"] for f in data["files"]] == [f"{sdist}!/fk-1.0/fk/libcublas.so.12"]
    sources = tmp_path / "src-1.0.tar.gz"
    sources.write_bytes(tarball(SDIST))
    rc, out, _ = cli(capsys, "check", sources)
    assert rc == EXIT_INPUT and "not a container image, and nothing in it to audit" in out

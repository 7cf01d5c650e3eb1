"""`inspect` opens what `check` opens: a wheel and a container image (built as files from real
gcc-built libraries) are read member by member, named `ARCHIVE!/member` as `check` names them,
and their dependency trees are resolved inside the archive."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from image_fixtures import docker_archive, layer_tar
from linkage_fixtures import cc_shared

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, EXIT_VIOLATION
from cli_runner import cli


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    require_tool("gcc")
    d = tmp_path_factory.mktemp("inspect-archive-libs")
    cudnn = cc_shared(d / "libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    app = cc_shared(d / "libapp.so", "extern int cudnnCreate(void);\nint f(void){return cudnnCreate();}\n",
                    f"-L{d}", "-l:libcudnn.so.9", "-Wl,-rpath,$ORIGIN/../pkg.libs")
    return {"cudnn": cudnn, "app": app}


@pytest.fixture(scope="module")
def wheel(libs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("inspect-wheel") / "pkg-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(out, "w") as zf:
        zf.write(libs["app"], "pkg/libapp.so")
        zf.write(libs["cudnn"], "pkg.libs/libcudnn.so.9")
        zf.writestr("pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return out


def test_inspect_reads_a_wheel_as_check_does(wheel, libs, capsys):
    rc, out, err = cli(capsys, "inspect", "--json", wheel)
    assert rc == EXIT_OK, err
    doc = json.loads(out)
    paths = [f["path"] for f in doc["files"]]
    assert paths == [f"{wheel}!/pkg/libapp.so", f"{wheel}!/pkg.libs/libcudnn.so.9"]
    assert doc["skipped_non_elf"] == 1  # the WHEEL file
    app = doc["files"][0]
    assert app["needed"] == ["libcudnn.so.9", "libc.so.6"]
    # resolved inside the wheel, by its RPATH, and named as a member (no temporary folder)
    child = app["dependency_tree"]["children"][0]
    assert child["name"] == "libcudnn.so.9" and child["path"] == f"{wheel}!/pkg.libs/libcudnn.so.9"
    assert child["status"] == "denied"
    assert "sovereign-audit-" not in out
    # the same names and the same denied library as `check`
    rc, out, _ = cli(capsys, "check", "--format", "json", wheel)
    assert rc == EXIT_VIOLATION
    checked = json.loads(out)
    assert [f["path"] for f in checked["files"]] == paths
    assert checked["files"][0]["resolved"]["children"][0]["path"] == child["path"]


def test_inspect_reads_an_image_in_place(libs, tmp_path, capsys):
    layer = layer_tar([("dir", "usr"), ("dir", "usr/lib"),
                       ("file", "usr/lib/libapp.so", libs["app"].read_bytes()),
                       ("file", "usr/lib/libcudnn.so.9", libs["cudnn"].read_bytes()),
                       ("file", "etc/hostname", b"box\n")])
    image = docker_archive(tmp_path / "app.tar", [layer], ["COPY libs /usr/lib/"])
    rc, out, err = cli(capsys, "inspect", "--json", image)
    assert rc == EXIT_OK, err
    doc = json.loads(out)
    assert [f["path"] for f in doc["files"]] == [f"{image}!/usr/lib/libapp.so", f"{image}!/usr/lib/libcudnn.so.9"]
    child = doc["files"][0]["dependency_tree"]["children"][0]
    assert child["name"] == "libcudnn.so.9" and child["status"] == "denied"
    assert child["path"] == "/usr/lib/libcudnn.so.9"  # the image's own path, not this machine's


def test_inspect_reports_a_bad_archive_member_in_one_line(libs, tmp_path, capsys):
    evil = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.write(libs["app"], "../../outside/libapp.so")
    rc, out, err = cli(capsys, "inspect", evil)
    assert rc == EXIT_INPUT
    assert err == f"error: {evil}!/../../outside/libapp.so: unsafe member path in wheel\n"
    assert out.endswith("0 file(s) read, 1 unreadable, 0 skipped (nothing to audit)\n")
    assert not (tmp_path.parent / "outside").exists()


def test_a_bad_conda_package_is_named_once(libs, tmp_path, capsys):
    import io
    import tarfile

    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = libs["app"].read_bytes()
        info = tarfile.TarInfo("../escape.so")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    pkg = tmp_path / "bad-1.0-0.conda"
    with zipfile.ZipFile(pkg, "w") as zf:
        zf.writestr("pkg-bad-1.0-0.tar.zst", zstandard.ZstdCompressor().compress(buf.getvalue()))
    rc, _, err = cli(capsys, "inspect", pkg)
    assert rc == EXIT_INPUT
    assert err == f"error: {pkg}: unsafe member path '../escape.so'\n"


@pytest.mark.parametrize("option", ["--root", "--ldpath"])
def test_a_missing_search_folder_is_a_usage_error_as_in_check(libs, tmp_path, capsys, option):
    for command in ("inspect", "check"):
        rc, out, err = cli(capsys, command, libs["app"], option, tmp_path / "missing")
        assert (rc, out) == (EXIT_USAGE, ""), command
        assert err == f"error: {option} {tmp_path / 'missing'}: not a directory\n"


def test_a_wheel_in_a_folder_is_opened_as_check_opens_it(wheel, libs, tmp_path, capsys):
    folder = tmp_path / "dist"
    folder.mkdir()
    (folder / wheel.name).write_bytes(wheel.read_bytes())
    (folder / "libcudnn.so.9").write_bytes(libs["cudnn"].read_bytes())
    rc, out, err = cli(capsys, "inspect", "--json", folder)
    assert rc == EXIT_OK, err
    inspected = sorted(f["path"] for f in json.loads(out)["files"])
    assert inspected == sorted([f"{folder / wheel.name}!/pkg/libapp.so", f"{folder / wheel.name}!/pkg.libs/libcudnn.so.9",
                                str(folder / "libcudnn.so.9")])
    rc, out, _ = cli(capsys, "check", "--format", "json", folder)
    assert sorted(f["path"] for f in json.loads(out)["files"]) == inspected


def test_inspect_reads_a_folder_s_packages_as_check_does(libs, tmp_path, capsys):
    """A folder holding a .deb (dpkg-deb), a jar, a gzipped library and a source tarball: inspect
    reads the members `check` reads, named alike (it read ELF files and wheels only, and counted
    the rest as non-ELF)."""
    import gzip

    from linkage_fixtures import tarball
    from test_archive_inputs import dpkg_deb, jar

    d = tmp_path / "dist"
    d.mkdir()
    app = libs["app"].read_bytes()
    deb = dpkg_deb(tmp_path, {"usr/lib/libapp.so": app}).rename(d / "x_1_amd64.deb")
    (d / "app.jar").write_bytes(jar({"native/libapp.so": app}))
    (d / "libapp.so.gz").write_bytes(gzip.compress(app))
    (d / "src-1.0.tar.gz").write_bytes(tarball({"src/README": b"no binary here\n"}))
    rc, out, err = cli(capsys, "inspect", "--json", d)
    assert rc == EXIT_OK, err
    doc = json.loads(out)
    inspected = sorted(f["path"] for f in doc["files"])
    assert inspected == sorted([f"{deb}!/usr/lib/libapp.so", f"{d}/app.jar!/native/libapp.so",
                                f"{d}/libapp.so.gz!/libapp.so"])
    rc, out, _ = cli(capsys, "check", "--format", "json", d)
    assert sorted(f["path"] for f in json.loads(out)["files"]) == inspected

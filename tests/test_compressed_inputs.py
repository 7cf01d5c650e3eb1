"""Files compressed on their own (libx.so.gz, .xz, .bz2, .zst) are read as what they hold: a loader
can inflate one and load the result, so a compressed vendor-linked library must never pass as
data. Compressed by the real tools (gzip, xz, bzip2, zstd) from gcc-built libraries; met named, in
a folder, a wheel, a tarball, a conda package and an image. A compressed file of data (a man
page) is counted as skipped; a damaged or bomb-like one is an error."""

from __future__ import annotations

import subprocess

import pytest
from conftest import require_tool
from linkage_fixtures import tarball
from test_archive_inputs import audit, cudnn_needed, in_wheel_tarball_and_conda, jni  # noqa: F401  (jni: the fixture)

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from tests.cli_runner import cli

TOOLS = {"gz": ["gzip", "-c"], "xz": ["xz", "-c"], "bz2": ["bzip2", "-c"], "zst": ["zstd", "-q", "-c"]}


def compress(data: bytes, ext: str) -> bytes:
    tool = TOOLS[ext]
    require_tool(tool[0])
    return subprocess.run(tool, input=data, capture_output=True, check=True).stdout


@pytest.mark.parametrize("ext", list(TOOLS))
def test_a_compressed_library_named_or_in_a_folder_is_read(jni, tmp_path, ext):  # noqa: F811
    d = tmp_path / "d"
    d.mkdir()
    lib = d / f"libjnicudnn.so.{ext}"
    lib.write_bytes(compress(jni["cudnn"], ext))
    (d / "changelog.gz").write_bytes(compress(b"a changelog, not a binary\n" * 50, "gz"))
    for arg in (lib, d):
        report = audit(arg)
        assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{lib}!/libjnicudnn.so", True)], arg
    assert report.skipped.get("compressed_data") == 1


def test_cli_verdicts_and_exit_codes(jni, tmp_path, capsys):  # noqa: F811
    (tmp_path / "libclean.so.gz").write_bytes(compress(jni["clean"], "gz"))
    (tmp_path / "libjnicudnn.so.xz").write_bytes(compress(jni["cudnn"], "xz"))
    (tmp_path / "notes.txt.gz").write_bytes(compress(b"hello\n", "gz"))
    assert cli(capsys, "check", tmp_path / "libclean.so.gz")[0] == EXIT_OK
    assert cli(capsys, "check", tmp_path / "libjnicudnn.so.xz")[0] == EXIT_VIOLATION
    rc, out, err = cli(capsys, "check", tmp_path / "notes.txt.gz")
    assert rc == EXIT_INPUT and "a compressed file holding nothing to audit" in out + err


def test_a_cut_or_bomb_like_compressed_file_is_an_error(jni, tmp_path, capsys):  # noqa: F811
    whole = compress(jni["cudnn"], "gz")
    cut = tmp_path / "libcut.so.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    zst = compress(jni["cudnn"], "zst")
    zcut = tmp_path / "libcut.so.zst"  # zstandard's reader says nothing of a cut: the frames are walked
    zcut.write_bytes(zst[:len(zst) // 2])
    bomb = tmp_path / "libbomb.so.gz"
    bomb.write_bytes(compress(jni["cudnn"] + bytes(200 << 20), "gz"))  # an ELF head, then 200 MiB of zeros
    for path, why in ((cut, "ended before the end-of-stream marker"), (zcut, "zstd stream ends early"),
                      (bomb, "inflates more than 100:1")):
        rc, out, err = cli(capsys, "check", path)
        assert rc == EXIT_INPUT and why in out + err and "Traceback" not in out + err, out + err


def test_in_a_wheel_a_tarball_and_a_conda_package(jni, tmp_path):  # noqa: F811
    gz = compress(jni["cudnn"], "gz")
    for arg, inner in in_wheel_tarball_and_conda(tmp_path, "libjnicudnn.so.gz", gz):
        report = audit(arg)
        assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{arg}!/{inner}!/libjnicudnn.so", True)]


def test_a_compressed_tar_by_any_name_and_nesting(jni, tmp_path):  # noqa: F811
    """A gzip holding a tar, named neither .tar.gz nor .tgz, is read as the tar it is; a .gz of
    a .gz is read through both."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "payload.gz").write_bytes(compress(tarball({"lib/libjnicudnn.so": jni["cudnn"]}, "w"), "gz"))
    (d / "libtwice.so.gz.gz").write_bytes(compress(compress(jni["cudnn"], "gz"), "gz"))
    report = audit(d)
    assert sorted((f.path, cudnn_needed(f)) for f in report.files) == [
        (f"{d}/libtwice.so.gz.gz!/libtwice.so.gz!/libtwice.so", True),
        (f"{d}/payload.gz!/payload!/lib/libjnicudnn.so", True)]


@pytest.mark.parametrize("how", [None, "gzip"])
def test_an_image_s_compressed_files(jni, tmp_path, how):  # noqa: F811
    """In an image (plain and gzip layers) the compressed library is read, confined to itself;
    the compressed man page is data."""
    from tests.image_fixtures import layer_tar, oci_layout

    layer = layer_tar([("dir", "usr"), ("dir", "usr/lib"), ("dir", "usr/share"),
                       ("file", "usr/lib/libjnicudnn.so.zst", compress(jni["cudnn"], "zst")),
                       ("file", "usr/lib/libclean.so", jni["clean"]),
                       ("file", "usr/share/ls.1.gz", compress(b".TH LS 1\n" * 40, "gz"))])
    image = oci_layout(tmp_path / f"img-{how}", [layer], how=how)
    report = audit(image)
    files = {f.path: f for f in report.files}
    assert cudnn_needed(files[f"{image}!/usr/lib/libjnicudnn.so.zst!/libjnicudnn.so"])
    assert files[f"{image}!/usr/lib/libclean.so"].verdict == "pass"
    assert len(files) == 2 and report.skipped.get("compressed_data") == 1


def test_compressed_files_share_one_byte_budget(jni, tmp_path, capsys):  # noqa: F811
    """Each file may inflate to 64 MiB whatever its ratio; all of them together no further than
    --max-archive-size, so many small bombs cannot fill the runner's disk."""
    d = tmp_path / "d"
    d.mkdir()
    body = jni["cudnn"] + bytes(60 << 20)  # an ELF, then 60 MiB of zeros: ~60 KiB compressed
    for name in ("liba.so.gz", "libb.so.gz"):
        (d / name).write_bytes(compress(body, "gz"))
    rc, out, err = cli(capsys, "check", d, "--max-archive-size", str(100 << 20))
    assert rc == EXIT_INPUT, out + err
    assert "liba.so.gz!/liba.so" in out and "FAIL" in out  # the first read
    assert "unpacks to more than" in out + err  # the second past what is left of the budget


def test_text_that_starts_like_a_compressor_s_magic_is_data(jni, tmp_path):  # noqa: F811
    """Only a real stream header counts: a note that starts "BZh" (bzip2's first three bytes) or
    with gzip's two is data, not a damaged compressed file (an error)."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "libclean.so").write_bytes(jni["clean"])
    (d / "NOTES").write_bytes(b"BZh, said the build: see below\n" * 4)
    (d / "blob.bin").write_bytes(b"\x1f\x8b" + b"not deflate" * 8)
    report = audit(d)
    assert [(f.path, f.verdict) for f in report.files] == [(f"{d}/libclean.so", "pass")]


def test_a_cut_compressed_file_in_a_folder_is_an_error_not_data(jni, tmp_path):  # noqa: F811
    """Cut within the first bytes that say what it holds, it is never judged on part of them:
    a cut gzip and a cut zstd file (its frames walked) are errors, not skipped as data."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "libclean.so").write_bytes(jni["clean"])
    text = b"line of a changelog\n" * 400
    (d / "changelog.gz").write_bytes(compress(text, "gz")[:40])
    zst = compress(jni["cudnn"], "zst")
    (d / "libx.so.zst").write_bytes(zst[:len(zst) - 3])
    report = audit(d)
    assert sorted((f.path, f.verdict) for f in report.files) == [
        (f"{d}/changelog.gz", "error"), (f"{d}/libclean.so", "pass"), (f"{d}/libx.so.zst", "error")]

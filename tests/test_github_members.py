"""`--format github` for archive members: `file=` is the archive (the file in the repository,
which GitHub can map), the member is named in the message; both escaped by the workflow-command
rules. gcc-built libraries in a real wheel and a real (tarfile-built) image."""

from __future__ import annotations

import zipfile

import pytest
from image_fixtures import docker_archive, layer_tar
from linkage_fixtures import cc_shared

from audit.cli import main
from audit.errors import EXIT_INPUT
from audit.linkage.outputs.github import escape_data, escape_property

MEMBER = "demo/lib%odd,name:1\n.so"  # %, comma, colon and a newline: all legal in a zip member name


@pytest.fixture(scope="module")
def static_cublas(tmp_path_factory):
    return cc_shared(tmp_path_factory.mktemp("gh") / "libstatic.so", "int cublasSgemm_v2(void){return 0;}\n")


def github(capsys, *paths) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--format", "github", *map(str, paths)])
    return exc.value.code, capsys.readouterr().out.splitlines()


def test_wheel_members_annotate_the_wheel(static_cublas, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (tmp_path / "dist").mkdir()
    whl = "dist/demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(static_cublas, MEMBER)
        zf.writestr("../escape.so", b"\x7fELF" + b"\0" * 60)
    rc, lines = github(capsys, whl)
    assert rc == EXIT_INPUT
    finding = [ln for ln in lines if "nvidia.cublas" in ln]
    assert len(finding) == 1
    assert finding[0].startswith(f"::error file={whl},title=sovereign-audit nvidia.cublas::"
                                 + escape_data(f"{MEMBER}: static-symbol cublasSgemm_v2"))
    assert "%0A.so: " in finding[0] and "%25odd,name:1" in finding[0]  # message rules: % and newline only
    unsafe = [ln for ln in lines if "unsafe member path" in ln]
    assert unsafe == [f"::error file={whl},title=sovereign-audit%3A unreadable input::"
                      "../escape.so: cannot audit: unsafe member path in wheel"]
    assert not any("!/" in ln.split("::")[1] for ln in lines if ln.startswith("::"))  # no member as file=


def test_a_property_value_is_escaped_in_the_archive_name(static_cublas, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    whl = "odd,dir:1%/demo-1.0-py3-none-linux_x86_64.whl"
    (tmp_path / "odd,dir:1%").mkdir()
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(static_cublas, "demo/libstatic.so")
    _, lines = github(capsys, whl)
    (line,) = [ln for ln in lines if ln.startswith("::error ")]
    assert line.startswith(f"::error file={escape_property(whl)},title=")
    assert escape_property(whl) == "odd%2Cdir%3A1%25/demo-1.0-py3-none-linux_x86_64.whl"


def test_image_members_annotate_the_image(static_cublas, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    layer = layer_tar([("dir", "usr"), ("dir", "usr/lib"),
                       ("file", "usr/lib/libstatic.so", static_cublas.read_bytes())])
    docker_archive(tmp_path / "app.tar", [layer], ["COPY libstatic.so /usr/lib/"], [])
    _, lines = github(capsys, "app.tar")
    (line,) = [ln for ln in lines if "nvidia.cublas" in ln]
    assert line.startswith("::error file=app.tar,title=sovereign-audit nvidia.cublas::usr/lib/libstatic.so: ")
    assert "Added by layer 1 sha256:" in line

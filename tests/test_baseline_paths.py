"""A baseline written with one spelling of a folder applies to another: CI runs `check dist`,
a developer `check ./dist/` or an absolute path. A gcc-built library that defines a cuBLAS
symbol is the known finding."""

from __future__ import annotations

import json
import os

import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.cli import main
from audit.errors import EXIT_OK, EXIT_VIOLATION


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out


@pytest.fixture
def repo(linkage_libs, tmp_path, monkeypatch):
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "libfast.so").write_bytes(linkage_libs["static_cublas"].read_bytes())
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("spelling", ["./dist/", "dist/libfast.so", "{abs}/dist", "../{name}/dist"])
def test_a_baseline_matches_any_spelling_of_the_same_path(repo, capsys, spelling):
    rc, _ = cli(capsys, "check", "dist", "--write-baseline", "base.json", "--format", "text=/dev/null")
    assert rc == EXIT_VIOLATION
    assert json.loads((repo / "base.json").read_text())["files"][0]["path"] == os.path.join("dist", "libfast.so")
    path = spelling.format(abs=repo, name=repo.name)
    rc, out = cli(capsys, "check", path, "--baseline", "base.json", "--format", "json")
    doc = json.loads(out)
    assert rc == EXIT_OK, doc["baseline"]
    assert doc["baseline"]["new"] == 0 and doc["baseline"]["unchanged"] >= 1 and doc["baseline"]["absent"] == []


def test_another_file_of_the_same_name_is_still_new(repo, capsys):
    cli(capsys, "check", "dist", "--write-baseline", "base.json", "--format", "text=/dev/null")
    (repo / "other").mkdir()
    (repo / "other" / "libfast.so").write_bytes((repo / "dist" / "libfast.so").read_bytes())
    rc, out = cli(capsys, "check", "other", "--baseline", "base.json", "--format", "json")
    assert rc == EXIT_VIOLATION and json.loads(out)["baseline"]["new"] >= 1

"""Output files of `check`: a bad destination is refused before any work and before any file is
touched, a file already there is replaced whole or kept, and error lines on stderr cannot carry
terminal control sequences. Real gcc-built libraries from linkage_fixtures."""

from __future__ import annotations

import json
import os

import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.errors import EXIT_USAGE, InputError, one_line, printable
from cli_runner import cli


def test_a_bad_second_output_leaves_the_first_file_untouched(linkage_libs, tmp_path, capsys):
    kept = tmp_path / "linkage.json"
    kept.write_text("earlier result\n")
    rc, out, err = cli(capsys, "check", linkage_libs["static_cublas"], "--format", f"json={kept}",
                       "--format", f"sarif={tmp_path / 'no-such-folder' / 'x.sarif'}")
    assert rc == EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and "no-such-folder" in err
    assert kept.read_text() == "earlier result\n"


@pytest.mark.parametrize("second", ["--format", "--write-baseline"])
def test_one_file_named_by_two_outputs_is_refused(linkage_libs, tmp_path, capsys, second):
    kept = tmp_path / "out.json"
    kept.write_text("earlier result\n")
    value = f"sarif={kept}" if second == "--format" else str(kept)
    rc, _, err = cli(capsys, "check", linkage_libs["clean"], "--format", f"json={kept}", second, value)
    assert rc == EXIT_USAGE and "named by two outputs" in err
    assert kept.read_text() == "earlier result\n"


def test_a_folder_as_output_file_is_refused(linkage_libs, tmp_path, capsys):
    rc, _, err = cli(capsys, "check", linkage_libs["clean"], "--format", f"junit={tmp_path}")
    assert rc == EXIT_USAGE and "Is a directory" in err


def test_an_existing_file_is_replaced_whole_keeping_its_mode(linkage_libs, tmp_path, capsys):
    out = tmp_path / "linkage.json"
    out.write_text("x" * 100_000)  # longer than the result: a cut-short rewrite would leave a tail
    os.chmod(out, 0o640)
    rc, _, _ = cli(capsys, "check", linkage_libs["static_cublas"], "--format", f"json={out}")
    assert rc == 1
    assert json.loads(out.read_text())["verdict"] == "fail"
    assert out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linkage.json"]  # no temporary file left


def test_an_output_through_a_symlink_writes_its_target(linkage_libs, tmp_path, capsys):
    target = tmp_path / "target.sarif"
    target.write_text("old")
    (tmp_path / "link.sarif").symlink_to(target.name)
    rc, _, _ = cli(capsys, "check", linkage_libs["clean"], "--format", f"sarif={tmp_path / 'link.sarif'}")
    assert rc == 0 and (tmp_path / "link.sarif").is_symlink()
    assert json.loads(target.read_text())["version"] == "2.1.0"


def test_error_lines_escape_control_characters(linkage_libs, tmp_path, capsys):
    hostile = tmp_path / "evil\x1b[2J\u202e.d"
    rc, out, err = cli(capsys, "check", linkage_libs["clean"], "--root", hostile)
    assert rc == EXIT_USAGE and out == ""
    assert "\x1b" not in err and "\u202e" not in err
    assert "evil\\x1b[2J\\u202e.d" in err and err.count("\n") == 1


def test_printable_keeps_text_and_escapes_controls():
    assert printable("libcudnn.so.9 ünïcode") == "libcudnn.so.9 ünïcode"
    assert printable("a\x1b[31mb\x07\x9b") == "a\\x1b[31mb\\x07\\x9b"
    assert one_line(InputError("x\x1b]0;title\x07\nnext")) == "x\\x1b]0;title\\x07 next"
    assert one_line(OSError("a\x1bb")) == "OSError: a\\x1bb"


def test_a_bad_step_summary_is_refused_before_any_output(linkage_libs, tmp_path, capsys, monkeypatch):
    kept = tmp_path / "linkage.json"
    kept.write_text("earlier result\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no-such-folder" / "summary.md"))
    rc, out, err = cli(capsys, "check", linkage_libs["static_cublas"], "--format", "github",
                       "--format", f"json={kept}")
    assert (rc, out) == (EXIT_USAGE, "")  # no annotation printed, no file touched
    assert err.count("\n") == 1 and "GITHUB_STEP_SUMMARY" in err
    assert kept.read_text() == "earlier result\n"

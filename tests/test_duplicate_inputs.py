"""An archive named twice, or met again through a link in a folder, is audited once (as a
file is): the summary counts it once and says `duplicate`. A gcc-built library in a wheel."""

from __future__ import annotations

import json
import zipfile

import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.cli import main


def test_a_wheel_named_twice_is_audited_once(linkage_libs, tmp_path, capsys):
    wheel = tmp_path / "pkg-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(linkage_libs["static_cublas"], "pkg/libfast.so")
    folder = tmp_path / "dist"
    folder.mkdir()
    (folder / "again.whl").symlink_to(wheel)
    with pytest.raises(SystemExit) as exc:
        main(["check", "--format", "json", str(wheel), str(wheel), str(folder)])
    doc = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1
    assert [f["path"] for f in doc["files"]] == [f"{wheel}!/pkg/libfast.so"]
    assert doc["summary"]["files"] == 1 and doc["summary"]["skipped"] == {"duplicate": 2}

"""A library's `.note.dlopen` (systemd's dlopen metadata) is its authors' own declaration of what it
loads at run time: a denied soname there is a failure of kind `dlopen-note`, not a mention.

The note is made by gcc from the C that systemd's SD_ELF_NOTE_DLOPEN macro expands to."""

from __future__ import annotations

import json

import pytest

from linkage_fixtures import cc_shared
from test_sbom import cli, dlopen_note_source


@pytest.mark.parametrize("sonames", [["libcublas.so.12"], ["libfoo.so.1", "libcudnn.so.9"]])
def test_a_denied_soname_declared_in_dlopen_note_fails(capsys, tmp_path, sonames):
    note = json.dumps([{"feature": "gemm", "description": "fast matrices", "priority": "suggested",
                        "soname": sonames}])
    lib = cc_shared(tmp_path / "libplugin.so", dlopen_note_source(note))
    code, out, err = cli(capsys, "check", lib, "--format", "json")
    assert code == 1, err
    findings = json.loads(out)["files"][0]["findings"]
    noted = [f for f in findings if f["kind"] == "dlopen-note"]
    assert [f["subject"] for f in noted] == [s for s in sonames if s != "libfoo.so.1"]
    assert noted[0]["severity"] == "fail" and "feature 'gemm'" in noted[0]["detail"]


def test_a_declared_soname_the_policy_allows_passes(capsys, tmp_path):
    lib = cc_shared(tmp_path / "libplugin.so", dlopen_note_source(
        json.dumps([{"feature": "z", "soname": ["libz.so.1"]}])))
    code, out, err = cli(capsys, "check", lib, "--format", "json")
    assert code == 0, (out, err)
    assert not [f for f in json.loads(out)["files"][0]["findings"] if f["kind"] == "dlopen-note"]

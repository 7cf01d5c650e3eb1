"""--baseline / --write-baseline: only findings the earlier JSON result lacks fail the run."""

from __future__ import annotations

import json
import random
import shutil
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.errors import EXIT_OK, EXIT_USAGE, EXIT_VIOLATION
from cli_runner import cli


@pytest.fixture(scope="session")
def built(fixture_root) -> dict[str, Path]:
    require_tool("gcc")
    d = Path(fixture_root) / "baseline-libs"
    cudnn = cc_shared(d / "vendor/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    return {
        "needs_cudnn": cc_shared(d / "a/libneeds.so", "int a(void){return 0;}\n", f"-L{cudnn.parent}",
                                 "-l:libcudnn.so.9"),
        "static_cublas": cc_shared(d / "b/libstatic.so", "int cublasSgemm_v2(void){return 0;}\n"),
        "dlopen_cublas": cc_shared(d / "c/libdl.so", '#include <dlfcn.h>\n'
                                   'void *l(void){return dlopen("libcublas.so.12", RTLD_NOW);}\n', "-ldl"),
        "clean": cc_shared(d / "d/libclean.so", "int c(void){return 0;}\n"),
    }


def project(tmp_path: Path, built, *names) -> Path:
    d = tmp_path / "dist"
    d.mkdir(exist_ok=True)
    for n in names:
        shutil.copy(built[n], d / built[n].name)
    return d


def test_known_findings_pass_new_ones_fail(built, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as a CI job gives them
    project(tmp_path, built, "needs_cudnn", "static_cublas", "clean")
    rc, out, _ = cli(capsys, "check", "dist", "--write-baseline", "base.json")
    assert rc == EXIT_VIOLATION and "FAIL  dist/libneeds.so" in out  # writing a baseline judges as usual
    doc = json.loads(Path("base.json").read_text())
    assert doc["schema"].startswith("sovereign-audit.linkage/")

    rc, out, _ = cli(capsys, "check", "dist", "--baseline", "base.json")
    assert rc == EXIT_OK, out
    assert "(baseline)" in out and "PASS  dist/libneeds.so" in out
    assert "0 new" in out

    # a new library with a new finding: only it fails
    project(tmp_path, built, "dlopen_cublas")
    rc, out, _ = cli(capsys, "check", "dist", "--baseline", "base.json", "--format", "json")
    assert rc == EXIT_VIOLATION
    res = json.loads(out)
    states = {(f["path"], g["kind"]): g["baseline"] for f in res["files"] for g in f["findings"]}
    assert states[("dist/libdl.so", "dlopen-string")] == "new"
    assert states[("dist/libneeds.so", "needed")] == "unchanged"
    assert {f["path"]: f["verdict"] for f in res["files"]} == {
        "dist/libclean.so": "pass", "dist/libdl.so": "fail", "dist/libneeds.so": "pass", "dist/libstatic.so": "pass"}
    assert res["baseline"]["absent"] == []


def test_match_ignores_order_offsets_and_counts(built, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    project(tmp_path, built, "needs_cudnn", "static_cublas", "dlopen_cublas")
    cli(capsys, "check", "dist", "--write-baseline", "base.json")
    doc = json.loads(Path("base.json").read_text())
    rnd = random.Random(7)
    rnd.shuffle(doc["files"])
    for f in doc["files"]:
        rnd.shuffle(f["findings"])
        for g in f["findings"]:
            g.update(offset=12345, where="elsewhere", count=99, chain=["x"], examples=[])
    Path("base.json").write_text(json.dumps(doc))
    rc, out, _ = cli(capsys, "check", "dist", "--baseline", "base.json")
    assert rc == EXIT_OK, out
    # ...but the subject is part of the identity: a renamed subject is a new finding
    for f in doc["files"]:
        for g in f["findings"]:
            if g["kind"] == "needed":
                g["subject"] = "libcudnn.so.8"
    Path("base.json").write_text(json.dumps(doc))
    rc, out, _ = cli(capsys, "check", "dist", "--baseline", "base.json")
    assert rc == EXIT_VIOLATION
    assert "absent: [nvidia.cudnn] needed: libcudnn.so.8 in dist/libneeds.so" in out


def test_a_second_library_of_a_known_rule_is_new(built, tmp_path, capsys, monkeypatch):
    """Findings group every name of one rule and kind in a file: a library that needed libcudnn.so.9
    and now also libcudnn_ops.so.9 keeps its finding's subject, but the new name must still fail."""
    monkeypatch.chdir(tmp_path)
    project(tmp_path, built, "needs_cudnn")
    cli(capsys, "check", "dist", "--write-baseline", "base.json")
    vendor = built["needs_cudnn"].parent.parent / "vendor"
    cc_shared(vendor / "libcudnn_ops.so.9", "int cudnnOps(void){return 0;}\n", "-Wl,-soname,libcudnn_ops.so.9")
    cc_shared(Path("dist/libneeds.so"), "int a(void){return 0;}\n", f"-L{vendor}", "-l:libcudnn.so.9",
              "-l:libcudnn_ops.so.9")
    rc, out, _ = cli(capsys, "check", "dist", "--baseline", "base.json", "--format", "json")
    res = json.loads(out)
    (needed,) = [g for f in res["files"] for g in f["findings"] if g["kind"] == "needed"]
    assert needed["subject"] == "libcudnn.so.9" and needed["count"] == 2
    assert rc == EXIT_VIOLATION and needed["baseline"] == "new"
    assert res["baseline"]["absent"] == []  # the known name is still there: nothing is absent


def test_sarif_marks_new_unchanged_and_absent(built, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    project(tmp_path, built, "needs_cudnn", "static_cublas")
    cli(capsys, "check", "dist", "--write-baseline", "base.json", "--format", "sarif=plain.sarif")
    plain = json.loads(Path("plain.sarif").read_text())
    assert all("baselineState" not in r for r in plain["runs"][0]["results"])  # no baseline, no state
    Path("dist/libstatic.so").unlink()
    project(tmp_path, built, "dlopen_cublas")
    rc, _, _ = cli(capsys, "check", "dist", "--baseline", "base.json", "--format", "sarif=r.sarif")
    assert rc == EXIT_VIOLATION
    doc = json.loads(Path("r.sarif").read_text())
    schema = json.loads(resources.files("audit.schemas").joinpath("sarif-2.1.0.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
    states = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["properties"]["evidence"]):
              r["baselineState"] for r in doc["runs"][0]["results"]}
    assert states[("dist/libneeds.so", "needed")] == "unchanged"
    assert states[("dist/libdl.so", "dlopen-string")] == "new"
    assert states[("dist/libstatic.so", "static-symbol")] == "absent"


@pytest.mark.parametrize("content", ["not json", json.dumps({"schema": "other/1", "files": []}),
                                     json.dumps({"schema": "sovereign-audit.linkage/1", "files": [{"path": 1}]})])
def test_a_baseline_that_is_not_a_json_result_is_a_usage_error(built, tmp_path, capsys, content):
    d = project(tmp_path, built, "clean")
    (tmp_path / "b.json").write_text(content)
    rc, out, err = cli(capsys, "check", d, "--baseline", tmp_path / "b.json")
    assert rc == EXIT_USAGE and "--baseline" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli(capsys, "check", d, "--baseline", tmp_path / "missing.json")
    assert rc == EXIT_USAGE and "cannot read" in err

"""audit/schemas/: the JSON Schemas (draft 2020-12) of check --format json, inspect --json and run's
run.json, validated against real outputs of gcc- and MinGW-built files; each document names its
schema in `$schema`, and a baseline loads with or without that field."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared
from test_report_fixtures import cli as run_cli

from audit import schemas
from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from cli_runner import cli

NAMES = {"check-1.schema.json": schemas.CHECK, "inspect-1.schema.json": schemas.INSPECT,
         "run-1.schema.json": schemas.RUN}


def validate(doc: dict, uri: str) -> None:
    schema = schemas.load(uri)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)


@pytest.fixture()
def dist(tmp_path, monkeypatch):
    """A clean library, a cuBLAS copy, a wheel holding it, a non-ELF file named explicitly (an error),
    and a MinGW DLL where MinGW is installed."""
    require_tool("gcc")
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "dist"
    cc_shared(d / "libclean.so", "int c(void){return 0;}\n")
    vendor = cc_shared(tmp_path / "build/libv.so", "volatile int acc;\nint cublasSgemm_v2(void){acc += 7; return acc;}\n")
    with zipfile.ZipFile(d / "pkg-1.0-py3-none-linux_x86_64.whl", "w") as zf:
        zf.write(vendor, "pkg/libv.so")
    (tmp_path / "notes.txt").write_text("not a binary\n")
    if shutil.which("x86_64-w64-mingw32-gcc"):
        (tmp_path / "w.c").write_text("__declspec(dllexport) int w(void){return 0;}\n")
        subprocess.run(["x86_64-w64-mingw32-gcc", "-shared", "-o", str(d / "w.dll"), str(tmp_path / "w.c")],
                       check=True)
    return d


def test_every_schema_is_a_valid_draft_2020_12_schema_named_by_its_id():
    files = {p.name for p in resources.files("audit.schemas").iterdir() if p.name.endswith(".schema.json")}
    assert files == set(NAMES)
    for name, uri in NAMES.items():
        schema = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == uri and schemas.load(uri) == schema


def test_check_json_outputs_validate_and_name_their_schema(dist, capsys):
    docs = []
    rc, _, _ = cli(capsys, "check", "dist", "--format", "json=all.json", "--timing")
    assert rc == EXIT_VIOLATION
    docs.append(json.loads(Path("all.json").read_text()))
    rc, _, _ = cli(capsys, "check", "dist", "notes.txt", "--format", "json=err.json")
    assert rc == EXIT_INPUT
    docs.append(json.loads(Path("err.json").read_text()))
    rc, _, _ = cli(capsys, "check", "dist", "--baseline", "all.json", "--format", "json=base.json")
    assert rc == EXIT_OK
    docs.append(json.loads(Path("base.json").read_text()))
    assert docs[-1]["baseline"]["unchanged"] > 0
    for doc in docs:
        assert doc["$schema"] == schemas.CHECK and list(doc)[:2] == ["$schema", "schema"]
        validate(doc, doc["$schema"])
    verdicts = {f["verdict"] for doc in docs for f in doc["files"]}
    assert verdicts == {"pass", "fail", "error"}
    if (dist / "w.dll").exists():
        assert any(f.get("format") == "pe" for f in docs[0]["files"])

    bad = json.loads(json.dumps(docs[0]))
    bad["files"][0]["verdict"] = "ok"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, schemas.CHECK)


def test_a_baseline_loads_with_and_without_its_schema_field(dist, capsys):
    cli(capsys, "check", "dist", "--write-baseline", "with.json")
    doc = json.loads(Path("with.json").read_text())
    assert doc["$schema"] == schemas.CHECK
    del doc["$schema"]  # as written before the field existed
    Path("without.json").write_text(json.dumps(doc))
    for base in ("with.json", "without.json"):
        rc, out, _ = cli(capsys, "check", "dist", "--baseline", base)
        assert rc == EXIT_OK and "(baseline)" in out


def test_inspect_json_validates(dist, capsys):
    for args in (["dist"], ["dist", "--no-deps"], ["dist", "notes.txt"]):
        rc, out, _ = cli(capsys, "inspect", "--json", *args)
        assert rc in (EXIT_OK, EXIT_INPUT)
        doc = json.loads(out)
        assert doc["$schema"] == schemas.INSPECT
        validate(doc, doc["$schema"])
    assert any("dependency_tree" in f for f in json.loads(cli(capsys, "inspect", "--json", "dist")[1])["files"])


def test_run_record_validates(dist, tmp_path):
    # a real run, short: the user's library audited, our kernel not built, no timed stages
    proc = run_cli("run", "--no-build", "--artifact", str(dist / "libclean.so"), "--skip", "parity", "--skip", "bench",
                   "--skip", "pipeline", "--device", "cpu", "--out", str(tmp_path / "bundle"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads((tmp_path / "bundle/evidence/run.json").read_text())
    assert run["$schema"] == schemas.RUN
    validate(run, run["$schema"])
    validate(json.loads((tmp_path / "bundle/evidence/linkage.json").read_text()), schemas.CHECK)

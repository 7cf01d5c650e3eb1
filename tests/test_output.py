"""Output formats: SARIF valid against the shipped official 2.1.0 schema, JUnit parsed with
xml.etree, GitHub workflow-command escaping and the job summary, text escaping of hostile names."""

from __future__ import annotations

import functools
import json
import shutil
import xml.etree.ElementTree as ET
from importlib import resources

import jsonschema
import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.linkage.check import check_paths
from audit.linkage.outputs.github import (
    escape_data,
    escape_property,
    md_escape,
    render_github,
    render_summary,
)
from audit.linkage.outputs.junit import render_junit
from audit.linkage.outputs.sarif import artifact_uri, render_sarif
from audit.linkage.outputs.text import escape, render_text
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from cli_runner import cli

HOSTILE = "evil\x1b[2J\nPASS ok,:%[x](javascript:e)<b>.so"  # no "/": a file name


@functools.lru_cache(maxsize=1)
def sarif_schema():
    return json.loads(resources.files("audit.schemas").joinpath("sarif-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def mixed(linkage_libs, tmp_path_factory):
    """A report with a pass, a fail, a waived finding, an unreadable file and a hostile name."""
    d = tmp_path_factory.mktemp("mixed")
    (d / "broken.so").write_bytes(linkage_libs["clean"].read_bytes()[:64])
    shutil.copy(linkage_libs["static_cublas"], d / HOSTILE)
    shutil.copy(linkage_libs["dlopen_cudnn"], d / "libwaived.so")
    pol_path = d / "policy.toml"
    pol_path.write_text('extends = "sovereign"\n[[exceptions]]\nfile = "libwaived.so"\nrule = "nvidia.cudnn"\n'
                        'reason = "reviewed: loads only when the user opts in"\n')
    policy = load_policy(pol_path)
    paths = [linkage_libs["clean"], d / HOSTILE, d / "libwaived.so", d / "broken.so"]
    report = check_paths([str(p) for p in paths], policy, ResolveOptions())
    assert [f.verdict for f in report.files] == ["pass", "fail", "pass", "error"]
    return report, policy, d


def test_sarif_is_valid_against_the_official_schema(mixed):
    report, policy, _ = mixed
    doc = json.loads(render_sarif(report, policy))
    jsonschema.Draft4Validator.check_schema(sarif_schema())
    jsonschema.validate(doc, sarif_schema(), cls=jsonschema.Draft4Validator)
    run = doc["runs"][0]
    assert doc["version"] == "2.1.0"
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert "nvidia.cublas" in rule_ids and "linkage.unresolved" in rule_ids
    results = run["results"]
    assert len(results) == sum(len(f.findings) for f in report.files)
    for res in results:
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
    waived = [r for r in results if r.get("suppressions")]
    assert [r["ruleId"] for r in waived] == ["nvidia.cudnn"]
    assert waived[0]["suppressions"][0]["justification"].startswith("reviewed")
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is False and inv["exitCode"] == 3
    assert any("broken.so" in n["message"]["text"] for n in inv["toolExecutionNotifications"])


def test_sarif_uris():
    assert artifact_uri("build/gfx1030/libflash_kernel.so") == "build/gfx1030/libflash_kernel.so"
    assert artifact_uri("/tmp/a b/x.so") == "file:///tmp/a%20b/x.so"
    assert artifact_uri("dist/x.whl!/pkg/lib.so") == "dist/x.whl!/pkg/lib.so"


def test_junit_has_a_testcase_per_file_and_rule(mixed):
    report, policy, d = mixed
    root = ET.fromstring(render_junit(report, policy))
    suite = root.find("testsuite")
    n_rules = len(policy.all_rules())
    cases = suite.findall("testcase")
    audited = [f for f in report.files if f.sha256]
    assert len(cases) == len(audited) * n_rules + 1  # + the unreadable file's single error case
    assert int(suite.get("tests")) == len(cases)
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("name")) for c in failed] == ["nvidia.cublas"]
    assert "static-symbol" in failed[0].find("failure").text
    errors = [c for c in cases if c.find("error") is not None]
    assert len(errors) == 1 and errors[0].get("classname") == str(d / "broken.so")
    assert int(suite.get("failures")) == 1 and int(suite.get("errors")) == 1
    # the hostile name survives as escaped text, not as a control character
    hostile = [c for c in cases if "evil" in c.get("classname")][0].get("classname")
    assert "\x1b" not in hostile and "\\x1b" in hostile


@pytest.mark.parametrize("raw, data, prop", [
    ("a%b", "a%25b", "a%25b"),
    ("line1\nline2\r", "line1%0Aline2%0D", "line1%0Aline2%0D"),
    ("x:y,z", "x:y,z", "x%3Ay%2Cz"),
])
def test_github_escaping_rules(raw, data, prop):
    assert escape_data(raw) == data
    assert escape_property(raw) == prop


def test_github_annotations(mixed):
    report, _, d = mixed
    lines = render_github(report).splitlines()
    errors = [ln for ln in lines if ln.startswith("::error ")]
    hostile = [ln for ln in errors if "evil" in ln]
    assert len(hostile) == 1
    expected_file = escape_property(str(d / HOSTILE))
    assert hostile[0].startswith(f"::error file={expected_file},title=sovereign-audit nvidia.cublas::")
    assert "\n" not in hostile[0] and "PASS ok%2C%3A%25" in hostile[0]
    assert any("broken.so" in ln and "cannot audit" in ln for ln in errors)
    assert not any("libwaived" in ln for ln in lines)  # waived findings are not annotated


def test_step_summary_is_appended(mixed, linkage_libs, tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rc, out, _ = cli(capsys, "check", "--format", "github", str(linkage_libs["static_cublas"]))
    assert rc == 1 and out.startswith("::error file=")
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "## sovereign-audit check: FAIL" in text
    assert "nvidia\\.cublas" in text
    md = render_summary(mixed[0])
    assert "<b>" not in md and "&lt;b&gt;" in md and "\\[x\\]\\(javascript" in md and "\x1b" not in md


def test_md_escape():
    assert md_escape("a|b") == "a\\|b"
    assert md_escape("<script>") == "&lt;script&gt;"
    assert md_escape("x\ny") == "x\\\\x0ay"


def test_text_escapes_hostile_names_and_shows_why(mixed):
    report, _, _ = mixed
    text = render_text(report)
    assert "\x1b" not in text
    assert not any(line.startswith("PASS ok") for line in text.splitlines())
    assert "evil\\x1b[2J\\x0aPASS ok" in text
    failing = [f for fr in report.files for f in fr.findings if f.failing][0]
    assert f"  [{failing.rule}] {failing.reason}" in text.splitlines()  # why: once per rule and file
    assert "excepted: reviewed" in text
    assert text.splitlines()[-2].startswith("summary: 4 file(s): 2 pass, 1 fail, 1 error")
    assert text.splitlines()[-1] == "result: ERROR (exit 3)"
    assert escape("a\u202eb") == "a\\u202eb"  # bidi override


def test_several_formats_at_once(linkage_libs, tmp_path, capsys):
    sarif, junit, js = tmp_path / "o.sarif", tmp_path / "o.xml", tmp_path / "o.json"
    rc, out, _ = cli(capsys, "check", "--format", "text", "--format", f"sarif={sarif}", "--format", f"junit={junit}",
                     "--format", f"json={js}", str(linkage_libs["clean"]))
    assert rc == 0 and out.startswith("sovereign-audit check")
    jsonschema.validate(json.loads(sarif.read_text()), sarif_schema(), cls=jsonschema.Draft4Validator)
    assert ET.parse(junit).getroot().tag == "testsuites"
    assert json.loads(js.read_text())["summary"]["pass"] == 1
    rc, _, err = cli(capsys, "check", "--format", f"json={tmp_path / 'no/such/dir/x.json'}", str(linkage_libs["clean"]))
    assert rc == 2 and err.startswith("error: cannot write")

"""Hostile names never become markup: a gcc-built .so named `"><img src=x onerror=alert(1)>.so`
with `<script>` strings inside, and evidence JSON whose names carry markup."""

from __future__ import annotations

import json
import shutil

import pytest

from test_report_fixtures import (HOSTILE_FILE, HOSTILE_IMG, HOSTILE_SCRIPT, assert_inert, cli, hostile_so,
                                  load, parse_html, require_cpu_run, tmpdir)

PAYLOADS = [HOSTILE_SCRIPT, HOSTILE_IMG, "<img src=x onerror=alert(1)>", "<script"]


def assert_escaped(text: str, *shown: str) -> None:
    for p in PAYLOADS:
        assert p not in text, f"raw {p!r} in report.html"
    assert_inert(text)
    visible = "".join(parse_html(text).text)
    for s in shown:  # the hostile text is still there, as text (so the test is not vacuous)
        assert s in visible, f"{s!r} not shown"


@pytest.fixture(scope="module")
def hostile_bundle():
    out = tmpdir("hostile-run") / "b"
    proc = cli("run", "--out", str(out), "--no-build", "--artifact", str(hostile_so()), "--device", "cpu",
               "--skip", "parity", "--skip", "bench", "--skip", "pipeline", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_hostile_file_name_is_escaped_in_the_report(hostile_bundle):
    html = (hostile_bundle / "report.html").read_text()
    assert_escaped(html, HOSTILE_FILE)
    sov = html.split('<section id="sovereignty">')[1].split("</section>")[0]
    assert HOSTILE_FILE in "".join(parse_html(sov).text)  # shown as text in the sovereignty table


def test_hostile_artifact_is_copied_inside_the_bundle(hostile_bundle):
    copy = hostile_bundle / "artifacts" / "user" / HOSTILE_FILE
    assert copy.read_bytes() == hostile_so().read_bytes()
    inside = hostile_bundle.resolve()
    assert all(inside in p.resolve().parents for p in hostile_bundle.rglob("*"))


def test_hostile_names_stay_plain_json_in_the_crate(hostile_bundle):
    crate = load(hostile_bundle / "ro-crate-metadata.json")
    names = [e.get("@id") for e in crate["@graph"]]
    assert f"artifacts/user/{HOSTILE_FILE}" in names


HOSTILE_BACKEND = "<script>alert('backend')</script>"
HOSTILE_SHAPE = '"><img src=x onerror=alert("shape")>'
HOSTILE_DEVICE = "GPU</title><script>alert('dev')</script>"
HOSTILE_SUBJECT = "libcudnn.so.9<img src=x onerror=alert('sym')>"
HOSTILE_REASON = "</td></tr></table><script>alert('reason')</script>"
HOSTILE_POLICY = "<iframe src=javascript:alert('policy')>"


def poison(d):
    """Edit a real run's evidence so every name that reaches the page carries markup."""
    bench = json.loads((d / "bench.json").read_text())
    bench["device_name"] = HOSTILE_DEVICE
    for s in bench["shapes"]:
        s["shape"]["label"] = HOSTILE_SHAPE
        s["backends"][0]["name"] = HOSTILE_BACKEND
        bench["primary"] = HOSTILE_BACKEND
        for sp in s["speedups"]:
            sp["subject"] = HOSTILE_BACKEND
        s["backends"][-1]["reason"] = HOSTILE_REASON
    (d / "bench.json").write_text(json.dumps(bench))
    link = json.loads((d / "linkage.json").read_text())
    link["policy"]["name"] = HOSTILE_POLICY
    link["files"][0]["findings"] = [{"rule": "nvidia-cudnn" + HOSTILE_SCRIPT, "kind": "dlopen-string",
                                     "subject": HOSTILE_SUBJECT, "where": ".rodata+0x10" + HOSTILE_IMG,
                                     "reason": HOSTILE_REASON, "severity": "fail", "chain": [HOSTILE_SHAPE]}]
    link["files"][0]["needed"].append(HOSTILE_SUBJECT)
    (d / "linkage.json").write_text(json.dumps(link))
    run = json.loads((d / "run.json").read_text())
    run["stages"][4]["reason"] = HOSTILE_REASON
    run["stages"][4]["notes"] = [HOSTILE_SCRIPT]
    run["command_line"] += " " + HOSTILE_IMG
    (d / "run.json").write_text(json.dumps(run))
    # a CPU run names its CPU (the GPU name above is shown only when a GPU ran the kernel)
    env = json.loads((d / "environment.json").read_text())
    env["cpu"]["model"] = HOSTILE_DEVICE
    (d / "environment.json").write_text(json.dumps(env))


@pytest.mark.slow
def test_hostile_evidence_json_is_escaped_everywhere():
    src = require_cpu_run() / "evidence"
    ev = tmpdir("hostile-evidence") / "evidence"
    shutil.rmtree(ev, ignore_errors=True)
    shutil.copytree(src, ev)
    poison(ev)
    out = tmpdir("hostile-evidence-out") / "b"
    proc = cli("report", str(ev), "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = (out / "report.html").read_text()
    for p in (HOSTILE_BACKEND, HOSTILE_SHAPE, HOSTILE_DEVICE, HOSTILE_SUBJECT, HOSTILE_REASON, HOSTILE_POLICY):
        assert p not in html
    assert "<iframe" not in html
    assert_escaped(html, HOSTILE_BACKEND, HOSTILE_SHAPE, HOSTILE_DEVICE, HOSTILE_SUBJECT, HOSTILE_REASON,
                   HOSTILE_POLICY)
    # the figures' labels (SVG <text>) are escaped too
    svg = html.split('<section id="figures">')[1].split("</section>")[0]
    assert any(HOSTILE_SHAPE in t for t in parse_html(svg).text)

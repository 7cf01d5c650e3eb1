"""The GitHub Action (action.yml), the pre-commit hook and docs/ci.md against the CLI they drive:
every option the action passes is one `check` accepts, and the action's own script runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.linkage.commands import check_cmd
from audit.linkage.outputs.write import parse_format

ROOT = Path(__file__).resolve().parent.parent


def action() -> dict:
    return yaml.safe_load((ROOT / "action.yml").read_text())


def check_step() -> dict:
    return next(s for s in action()["runs"]["steps"] if s.get("id") == "check")


def cli_options() -> set[str]:
    return {o for p in check_cmd.params for o in getattr(p, "opts", []) if o.startswith("--")}


def test_action_is_composite_and_every_input_is_used():
    doc = action()
    assert doc["runs"]["using"] == "composite"
    text = (ROOT / "action.yml").read_text()
    for name, spec in doc["inputs"].items():
        assert spec.get("description"), name
        assert f"inputs.{name}" in text.split("runs:", 1)[1], f"input {name} is declared but never used"
    assert set(doc["inputs"]) >= {"paths", "policy", "baseline", "format"}
    uses = [s["uses"] for s in doc["runs"]["steps"] if "uses" in s]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)


def test_every_option_the_action_passes_is_one_check_accepts():
    script = check_step()["run"]
    passed = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", script))
    assert passed, script
    assert passed <= cli_options(), passed - cli_options()
    # the inputs that map to options: each reaches the script through its env variable
    env = check_step()["env"]
    for name, option in {"policy": "--policy", "baseline": "--baseline", "format": "--format",
                         "sarif": "--format"}.items():
        var = next(k for k, v in env.items() if v == "${{ inputs.%s }}" % name)
        assert any(f"${var}" in line and option in line for line in script.splitlines()), (name, option)
    for spec in action()["inputs"]["format"]["default"].split():
        parse_format(spec)  # raises on a format check does not know


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """`sovereign-audit` on PATH as the installed entry point would be: this checkout's CLI."""
    d = tmp_path_factory.mktemp("bin")
    exe = d / "sovereign-audit"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} "
                   f"exec {shlex.quote(sys.executable)} -m audit \"$@\"\n")
    exe.chmod(0o755)
    return d


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    require_tool("gcc")
    d = tmp_path_factory.mktemp("ci-dist")
    cudnn = cc_shared(d / "vendor/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    cc_shared(d / "dist/libneeds.so", "int a(void){return 0;}\n", f"-L{cudnn.parent}", "-l:libcudnn.so.9")
    cc_shared(d / "dist/libclean.so", "int c(void){return 0;}\n")
    return d


def run_step(shim: Path, cwd: Path, runner_env: dict | None = None, **inputs) -> tuple[int, dict, str]:
    """Run the action's check step as the runner would: bash, inputs as env, $GITHUB_OUTPUT
    (NAME=VALUE lines and NAME<<DELIMITER blocks)."""
    step = check_step()
    doc = action()
    values = {k: str(v.get("default", "")) for k, v in doc["inputs"].items()}
    values.update({k.replace("_", "-"): v for k, v in inputs.items()})
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", GITHUB_OUTPUT=str(cwd / "gh-output"))
    env.pop("SOVEREIGN_AUDIT_SIGNING_KEY", None)
    env.update(runner_env or {})
    for var, expr in step["env"].items():
        env[var] = values[re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", expr).group(1)]
    (cwd / "gh-output").write_text("")
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    out, lines = {}, iter((cwd / "gh-output").read_text().splitlines())
    for line in lines:
        if "<<" in line and "=" not in line.split("<<", 1)[0]:
            name, end = line.split("<<", 1)
            out[name] = "\n".join(iter(lambda: next(lines), end))
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return proc.returncode, out, proc.stdout + proc.stderr


def test_the_action_script_runs_check_and_reports_its_exit_code(shim, dist):
    rc, out, log = run_step(shim, dist, paths="dist/libneeds.so\ndist/libclean.so",
                            format="text github junit=linkage.xml")
    assert rc == 0, log  # the verdict is a later step, after the SARIF upload
    assert out["exit-code"] == "1", log
    assert (dist / "sovereign-audit.sarif").is_file() and (dist / "linkage.xml").is_file()
    assert "::error file=dist/libneeds.so" in log
    # adopt: write a baseline, then the same tree passes with it
    subprocess.run([str(shim / "sovereign-audit"), "check", "dist", "--write-baseline", "base.json",
                    "--format", "json=/dev/null"], cwd=dist, capture_output=True, check=False)
    rc, out, log = run_step(shim, dist, paths="dist", baseline="base.json", policy="sovereign", sarif="")
    assert out["exit-code"] == "0", log
    rc, out, log = run_step(shim, dist, paths="dist", baseline="missing.json")
    assert out["exit-code"] == "2", log


def test_pre_commit_hook_entry_runs_on_matching_files(shim, dist):
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "sovereign-audit")
    entry = shlex.split(hook["entry"])
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^{re.escape(entry[0])} = "audit\.cli:main"', pyproject, re.M)  # the installed script
    files = re.compile(hook["files"])
    assert all(files.search(p) for p in ("lib/libx.so", "lib/libx.so.1.2", "dist/a-1.0-py3-none-any.whl",
                                         "pkg-1.0-0.conda", "pkg-1.0-0.tar.bz2"))
    assert not any(files.search(p) for p in ("README.md", "src/x.c", "lib/x.sort"))
    proc = subprocess.run([str(shim / entry[0]), *entry[1:], "dist/libneeds.so"], cwd=dist, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "libcudnn.so.9" in proc.stdout


def test_docs_use_only_declared_inputs_and_real_options():
    text = (ROOT / "docs/ci.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    declared = set(action()["inputs"])
    used_action = 0
    for block in blocks:
        doc = yaml.safe_load(block)
        steps = [s for job in (doc.get("jobs") or {}).values() for s in job.get("steps", [])] \
            if isinstance(doc, dict) else []
        for s in steps:
            if "sovereign-audit" in str(s.get("uses", "")):
                used_action += 1
                assert set(s.get("with", {})) <= declared, set(s.get("with", {})) - declared
    assert used_action >= 1
    assert "gitlab" in text.lower() and "pre-commit" in text
    for option in set(re.findall(r"sovereign-audit check[^\n`]*", text)):
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", option):
            assert flag in cli_options() | {"--help"}, flag


def test_help_lists_every_format_with_an_example(capsys):
    from audit.cli import main
    from audit.linkage.outputs.write import FORMATS

    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for fmt in FORMATS:
        line = next((ln for ln in text.splitlines() if re.match(rf"\s+{fmt}\s.*--format ", ln)), None)
        assert line is not None, fmt
        example = re.search(r"--format (\S+)", line)
        assert example and parse_format(example.group(1)).format == fmt, line


def test_the_action_writes_sboms_and_a_signed_verdict_and_uploads_them(shim, dist, tmp_path):
    import base64
    import json

    upload = next(s for s in action()["runs"]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "${{ steps.check.outputs.files }}" and "always()" in upload["if"]
    github = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "0" * 40}
    rc, out, log = run_step(shim, dist, github, paths="dist/libneeds.so dist/libclean.so", format="text",
                            cyclonedx="sbom.cdx.json", spdx="sbom.spdx.json", attest="check.intoto.jsonl")
    assert rc == 0 and out["exit-code"] == "1", log
    assert out["files"].splitlines() == ["sovereign-audit.sarif", "sbom.cdx.json", "sbom.spdx.json",
                                         "check.intoto.jsonl", "check.intoto.jsonl.pub"]
    assert "ephemeral key" in log
    envelope = json.loads((dist / "check.intoto.jsonl").read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    assert stmt["predicate"]["resourceUri"] == "git+https://github.com/o/r@" + "0" * 40
    assert stmt["predicate"]["verificationResult"] == "FAILED"
    names = {s["name"] for s in stmt["subject"]}
    assert {"dist/libneeds.so", "dist/libclean.so", "sbom.cdx.json", "sbom.spdx.json"} <= names
    verify = [str(shim / "sovereign-audit"), "verify-attestation", "check.intoto.jsonl", "--artifact", "sbom.cdx.json"]
    proc = subprocess.run(verify + ["--key", "check.intoto.jsonl.pub"], cwd=dist, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    # a key from a secret: no .pub beside it; the signature verifies under that key's public half
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run([str(shim / "sovereign-audit"), "keygen", "--out", str(keys / "ci")], check=True,
                   capture_output=True)
    rc, out, log = run_step(shim, dist, paths="dist/libclean.so", format="", sarif="", attest="signed.intoto.jsonl",
                            signing_key=(keys / "ci.key").read_text())
    assert out["exit-code"] == "0" and out["files"] == "signed.intoto.jsonl", log
    assert "ephemeral" not in log and not (dist / "signed.intoto.jsonl.pub").exists()
    proc = subprocess.run(verify[:2] + ["signed.intoto.jsonl", "--key", str(keys / "ci.pub"), "--require-passed"],
                          cwd=dist, capture_output=True, text=True)
    assert proc.returncode == 0 and "PASSED for dist/libclean.so" in proc.stdout, proc.stderr

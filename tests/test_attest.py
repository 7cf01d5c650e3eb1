"""Attestations: in-toto Statements of the right types, subjects with real digests, fields from evidence."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from audit.errors import AuditError
from audit.signing import dsse
from audit.report.attest import write_attestations
from audit.signing.keys import generate_keypair
from conftest import require_tool
from test_verify import EVIDENCE, kernel_so  # noqa: F401  (the session fixture: a gcc-built .so)


def _bundle(root: Path, so: Path, evidence=EVIDENCE) -> Path:
    (root / "evidence").mkdir(parents=True)
    (root / "artifacts" / "cpu").mkdir(parents=True)
    for stage, obj in evidence.items():
        (root / "evidence" / f"{stage}.json").write_text(json.dumps(obj))
    (root / "artifacts" / "cpu" / "libflash_kernel.so").write_bytes(so.read_bytes())
    return root


def _statements(paths, key) -> dict[str, dict]:
    out = {}
    for p in paths:
        env = dsse.loads(p.read_text())
        assert env.payload_type == "application/vnd.in-toto+json"
        assert env.verify(key.public)
        st = json.loads(env.payload)
        assert st["_type"] == "https://in-toto.io/Statement/v1"
        out[p.name] = st
    return out


def _sha256sum(path: Path) -> str:
    return subprocess.run([require_tool("sha256sum"), str(path)], capture_output=True, text=True,
                          check=True).stdout.split()[0]


def test_all_four_attestations(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    key = generate_keypair()
    paths = write_attestations(root, key)
    assert all(p.parent == root / "attestations" for p in paths)
    st = _statements(paths, key)
    assert set(st) == {"build.provenance.dsse.json", "parity.test-result.dsse.json",
                       "linkage.test-result.dsse.json", "performance.dsse.json"}
    so_digest = _sha256sum(root / "artifacts" / "cpu" / "libflash_kernel.so")

    slsa = st["build.provenance.dsse.json"]
    assert slsa["predicateType"] == "https://slsa.dev/provenance/v1"
    assert slsa["subject"] == [{"name": "artifacts/cpu/libflash_kernel.so", "digest": {"sha256": so_digest}}]
    bd = slsa["predicate"]["buildDefinition"]
    prov = EVIDENCE["build"]["targets"][0]["provenance"]
    assert bd["externalParameters"] == {"targets": ["cpu"], "requested": ["cpu"]}
    ip = bd["internalParameters"]["cpu"]
    assert ip["command"] == prov["command"] and ip["cwd"] == "/src" and ip["flags"] == prov["flags"]
    assert ip["toolchain"] == prov["compiler"]
    deps = bd["resolvedDependencies"]
    assert {"name": "flash_kernel/src/k.c", "digest": {"sha256": prov["sources"][0]["sha256"]}} in deps
    assert {"name": "sovereign-audit checkout", "digest": {"gitCommit": prov["git"]["commit"]},
            "annotations": {"flash_kernel_dirty": False}} in deps
    gcc = next(d for d in deps if d.get("uri") == "file:///usr/bin/gcc")
    assert gcc["annotations"]["version"] == "12.2.0"
    rd = slsa["predicate"]["runDetails"]
    assert rd["builder"]["id"].startswith("https://sovereign-audit.dev/builder/")
    assert rd["metadata"] == {"startedOn": "2026-12-03T06:00:00+00:00", "finishedOn": "2026-12-03T06:00:30+00:00"}
    assert rd["byproducts"][0] == {"name": "evidence/build.json",
                                   "digest": {"sha256": _sha256sum(root / "evidence" / "build.json")}}

    parity = st["parity.test-result.dsse.json"]
    assert parity["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert parity["predicate"]["result"] == "PASSED"
    assert parity["predicate"]["passedTests"] == ["tiny (1,2,77,64)"]
    assert parity["predicate"]["failedTests"] == []
    assert {"name": "evidence/parity.json", "digest": {"sha256": _sha256sum(root / "evidence/parity.json")}} \
        in parity["subject"]
    assert {"name": "artifacts/cpu/libflash_kernel.so", "digest": {"sha256": so_digest}} in parity["subject"]

    linkage = st["linkage.test-result.dsse.json"]
    assert linkage["predicate"]["result"] == "PASSED"
    assert linkage["predicate"]["passedTests"] == ["artifacts/cpu/libflash_kernel.so"]

    perf = st["performance.dsse.json"]
    assert perf["predicateType"] == "https://sovereign-audit.dev/performance/v1"
    assert [s["name"] for s in perf["subject"]] == ["evidence/bench.json", "evidence/environment.json"]
    sp = perf["predicate"]["claims"]["bench"]["speedups"]
    assert sp == [{"shape": "tiny (1,2,77,64)", "subject": "flash", "baseline": "naive", "ratio": 2.0,
                   "ci_low": 1.9, "ci_high": 2.1, "confidence": None}]


def test_pipeline_figures_are_whole_word_matches(tmp_path, kernel_so):
    ev = dict(EVIDENCE)
    ev["pipeline"] = {"schema": "sovereign-audit.pipeline/1", "config": {"calibration_rel": 0.001},
                      "comparisons": [{"speedup_dit_measured": 1.23, "op_speedup": 2.9, "amdahl_predicted_dit": 1.1,
                                       "speedup_dit_ci": {"ratio": 1.23, "ci_low": 1.1}, "flag": True}]}
    root = _bundle(tmp_path / "b", kernel_so, ev)
    key = generate_keypair()
    perf = _statements(write_attestations(root, key), key)["performance.dsse.json"]
    assert [s["name"] for s in perf["subject"]] == ["evidence/bench.json", "evidence/pipeline.json",
                                                   "evidence/environment.json"]
    figures = perf["predicate"]["claims"]["pipeline"]["figures"]
    assert figures == [{"path": "comparisons[0].speedup_dit_measured", "value": 1.23},
                       {"path": "comparisons[0].op_speedup", "value": 2.9},
                       {"path": "comparisons[0].amdahl_predicted_dit", "value": 1.1},
                       {"path": "comparisons[0].speedup_dit_ci.ratio", "value": 1.23}]


def test_failed_parity_and_linkage_are_failed(tmp_path, kernel_so):
    ev = dict(EVIDENCE)
    ev["parity"] = {"schema": "sovereign-audit.parity/1", "passed": False, "shapes": [
        {"shape": {"label": "a (1,1,1,64)"}, "status": "passed"},
        {"shape": {"label": "b (1,1,77,64)"}, "status": "failed"}]}
    ev["linkage"] = {"schema": "sovereign-audit.linkage/1", "exit_code": 1,
                     "files": [{"path": "artifacts/cpu/libflash_kernel.so", "verdict": "fail"},
                               {"path": "other.so", "verdict": "pass"}]}
    root = _bundle(tmp_path / "b", kernel_so, ev)
    key = generate_keypair()
    st = _statements(write_attestations(root, key), key)
    p = st["parity.test-result.dsse.json"]["predicate"]
    assert p["result"] == "FAILED" and p["passedTests"] == ["a (1,1,1,64)"] and p["failedTests"] == ["b (1,1,77,64)"]
    lp = st["linkage.test-result.dsse.json"]["predicate"]
    assert lp["result"] == "FAILED"
    assert lp["failedTests"] == ["artifacts/cpu/libflash_kernel.so"] and lp["passedTests"] == ["other.so"]


def test_test_names_are_bundle_names_never_paths_of_the_machine(tmp_path, kernel_so):
    """linkage.json records where `run` audited each object (an absolute path on that machine, as the
    real run writes it); the attestation names the object as the bundle does, matched by sha256."""
    so_sha = _sha256sum(kernel_so)
    ev = dict(EVIDENCE)
    ev["linkage"] = {"schema": "sovereign-audit.linkage/1", "exit_code": 1, "files": [
        {"path": "/home/ci/work/out/artifacts/cpu/libflash_kernel.so", "sha256": so_sha, "verdict": "pass"},
        {"path": "/home/ci/build/libother.so", "sha256": "0" * 64, "verdict": "fail"}]}
    root = _bundle(tmp_path / "b", kernel_so, ev)
    key = generate_keypair()
    lp = _statements(write_attestations(root, key), key)["linkage.test-result.dsse.json"]["predicate"]
    assert lp["passedTests"] == ["artifacts/cpu/libflash_kernel.so"]
    assert lp["failedTests"] == ["libother.so"]  # not in the bundle: its file name only
    assert "/home/ci" not in json.dumps(lp)


def test_copied_provenance_json_is_preferred_and_listed(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    prov = dict(EVIDENCE["build"]["targets"][0]["provenance"], flags=["-O3"])
    (root / "artifacts" / "cpu" / "provenance.json").write_text(json.dumps(prov))
    key = generate_keypair()
    st = _statements(write_attestations(root, key), key)["build.provenance.dsse.json"]
    assert st["predicate"]["buildDefinition"]["internalParameters"]["cpu"]["flags"] == ["-O3"]
    assert {"name": "artifacts/cpu/provenance.json",
            "digest": {"sha256": _sha256sum(root / "artifacts/cpu/provenance.json")}} in \
        st["predicate"]["runDetails"]["byproducts"]
    assert [s["name"] for s in st["subject"]] == ["artifacts/cpu/libflash_kernel.so"]


def test_no_verdict_is_warned_not_guessed(tmp_path, kernel_so):
    ev = {"parity": {"schema": "sovereign-audit.parity/1"}}
    root = _bundle(tmp_path / "b", kernel_so, ev)
    key = generate_keypair()
    st = _statements(write_attestations(root, key), key)
    assert st["parity.test-result.dsse.json"]["predicate"]["result"] == "WARNED"


def test_missing_evidence_writes_only_what_exists(tmp_path, kernel_so):
    root = tmp_path / "b"
    (root / "evidence").mkdir(parents=True)
    key = generate_keypair()
    assert write_attestations(root, key) == []
    (root / "evidence" / "bench.json").write_text(json.dumps(EVIDENCE["bench"]))
    assert [p.name for p in write_attestations(root, key)] == ["performance.dsse.json"]


def test_rebuilding_in_place_drops_stale_attestations(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    key = generate_keypair()
    assert len(write_attestations(root, key)) == 4
    (root / "evidence" / "parity.json").unlink()
    (root / "attestations" / "someone-elses.json").write_text("{}")
    names = sorted(p.name for p in write_attestations(root, key))
    assert "parity.test-result.dsse.json" not in names
    assert sorted(p.name for p in (root / "attestations").iterdir()) == sorted(names + ["someone-elses.json"])


def test_user_artifacts_are_audited_not_built(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    (root / "artifacts" / "user").mkdir()
    (root / "artifacts" / "user" / "theirs.so").write_bytes(b"\x7fELF user object")
    key = generate_keypair()
    st = _statements(write_attestations(root, key), key)
    slsa_names = [s["name"] for s in st["build.provenance.dsse.json"]["subject"]]
    assert slsa_names == ["artifacts/cpu/libflash_kernel.so"]
    link_names = [s["name"] for s in st["linkage.test-result.dsse.json"]["subject"]]
    assert "artifacts/user/theirs.so" in link_names
    assert hashlib.sha256(b"\x7fELF user object").hexdigest() in json.dumps(st["linkage.test-result.dsse.json"])


def test_bad_evidence_is_a_clear_error(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    (root / "evidence" / "parity.json").write_text("{truncated")
    with pytest.raises(AuditError, match="evidence/parity.json: not JSON") as exc:
        write_attestations(root, generate_keypair())
    assert exc.value.exit_code == 3


def test_evidence_symlink_outside_is_refused(tmp_path, kernel_so):
    root = _bundle(tmp_path / "b", kernel_so)
    (tmp_path / "elsewhere.json").write_text(json.dumps(EVIDENCE["parity"]))
    (root / "evidence" / "parity.json").unlink()
    (root / "evidence" / "parity.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(AuditError, match="symlink points outside the bundle"):
        write_attestations(root, generate_keypair())

"""`verify`: round trip, every kind of tampering, escaping names, wrong key, malformed bundles.

Bundles are built with the signing API (write_attestations, write_manifest) over a real shared object
compiled by gcc and small hand-written evidence JSON; the full `run` bundle is tested by the report's
own tests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main
from audit.errors import AuditError
from audit.report.attest import write_attestations
from audit.signing.keys import generate_keypair, keyid_of, load_public_key, load_signing_key, write_keypair
from audit.report.manifest import write_manifest
from audit.report.verify import MalformedBundle, verify_bundle
from conftest import require_tool

KERNEL_C = "int fk_abi_version(void) { return 1; }\nconst char *fk_target(void) { return \"cpu\"; }\n"

EVIDENCE = {
    # field names as audit.kernel_build.builder.TargetBuild / audit.kernel_build.provenance.Provenance write them
    "build": {"schema": "sovereign-audit.build/1", "requested": ["cpu"], "ok": True,
              "started_at": "2026-12-03T06:00:00+00:00", "finished_at": "2026-12-03T06:00:30+00:00",
              "tool_version": "0.1.0", "targets": [
        {"target": "cpu", "kind": "cpu", "status": "built", "reason": "", "provenance": {
            "schema": "sovereign-audit.provenance/1", "target": "cpu", "kind": "cpu",
            "command": ["/usr/bin/gcc", "-O2", "-shared", "-fPIC", "k.c", "-o", "libflash_kernel.so"],
            "cwd": "/src", "env": {}, "flags": ["-O2", "-shared", "-fPIC"],
            "compiler": {"name": "gcc", "path": "/usr/bin/gcc", "version": "12.2.0",
                         "packages": {"gcc-12": "12.2.0-14"}},
            "sources": [{"path": "flash_kernel/src/k.c", "sha256": hashlib.sha256(KERNEL_C.encode()).hexdigest(),
                         "size": len(KERNEL_C)}],
            "sources_method": "compiler-deps", "host": {"hostname": "test"},
            "git": {"commit": "0123456789abcdef0123456789abcdef01234567", "flash_kernel_dirty": False}}}]},
    # as audit.linkage.check.CheckReport.to_dict() writes it
    "linkage": {"schema": "sovereign-audit.linkage/1", "exit_code": 0, "policy": {"name": "default"},
                "files": [{"path": "artifacts/cpu/libflash_kernel.so", "verdict": "pass", "findings": []}]},
    "parity": {"schema": "sovereign-audit.parity/1", "passed": True, "shapes": [
        {"shape": {"label": "tiny (1,2,77,64)"}, "status": "passed"}]},
    "bench": {"schema": "sovereign-audit.bench/1", "shapes": [
        {"shape": {"label": "tiny (1,2,77,64)"}, "backends": [{"name": "flash", "median_ms": 1.0}],
         "speedups": [{"subject": "flash", "baseline": "naive", "ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1}]}]},
    "environment": {"schema": "sovereign-audit.environment/1", "host": "test"},
}


@pytest.fixture(scope="session")
def kernel_so(fixture_root) -> Path:
    gcc = require_tool("gcc")
    d = fixture_root / "signing"
    d.mkdir(exist_ok=True)
    (d / "k.c").write_text(KERNEL_C)
    out = d / "libflash_kernel.so"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(out), str(d / "k.c")], check=True)
    return out


def make_bundle(root: Path, so: Path, key=None, evidence=EVIDENCE) -> tuple[Path, object]:
    """A small real bundle at root: evidence, one built object, report.html, attestations, manifest."""
    key = key or generate_keypair()
    (root / "evidence").mkdir(parents=True)
    (root / "artifacts" / "cpu").mkdir(parents=True)
    for stage, obj in evidence.items():
        (root / "evidence" / f"{stage}.json").write_text(json.dumps(obj, indent=2))
    shutil.copy(so, root / "artifacts" / "cpu" / "libflash_kernel.so")
    (root / "report.html").write_text("<!doctype html><title>report</title>\n")
    write_attestations(root, key)
    write_manifest(root, key)
    return root, key


@pytest.fixture
def bundle(tmp_path, kernel_so):
    """(bundle dir, path of the signer's public key as a separate file)."""
    root, key = make_bundle(tmp_path / "bundle", kernel_so)
    pub = tmp_path / "signer.pub"
    pub.write_bytes(key.public_pem)
    return root, pub


def cli(*args) -> tuple[int, str, str]:
    """Run the CLI in-process through audit.cli.main (the console entry point): (exit code, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return exc.value.code, out.getvalue(), err.getvalue()


def cli_subprocess(*args) -> tuple[int, str, str]:
    """The same in a child process with a timeout: for tests where a hang is the failure."""
    p = subprocess.run([sys.executable, "-m", "audit", *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def fail_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("FAIL ")]


def edit_payload(envelope: Path, change) -> None:
    """Re-encode the envelope with change(payload bytes) applied, keeping it well-formed base64."""
    env = json.loads(envelope.read_text())
    env["payload"] = base64.b64encode(change(base64.b64decode(env["payload"]))).decode()
    envelope.write_text(json.dumps(env))


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_round_trip_with_key(bundle):
    root, pub = bundle
    rc, out, err = cli_subprocess("verify", root, "--key", pub)
    assert rc == 0, out + err
    assert fail_lines(out) == []
    assert ": OK;" in out
    r = verify_bundle(root, pub)
    assert r.ok and r.identity and not r.ephemeral
    # 1 manifest envelope + 4 attestations, each subject and each manifest entry
    assert r.checked > 5 + 8


def test_without_key_says_integrity_only(bundle):
    root, _ = bundle
    rc, out, _ = cli("verify", root)
    assert rc == 0
    assert "integrity only" in out and "not identity" in out
    assert verify_bundle(root, None).identity is False


def test_ephemeral_key_is_reported(tmp_path, kernel_so):
    root, key = make_bundle(tmp_path / "b", kernel_so, key=load_signing_key(None))
    assert key.ephemeral
    r = verify_bundle(root, None)
    assert r.ok and r.ephemeral
    assert any("ephemeral key: integrity only, no identity" in n for n in r.notes)
    assert json.loads((root / "manifest.json").read_text())["key"]["ephemeral"] is True


def test_json_output(bundle):
    root, pub = bundle
    rc, out, _ = cli("verify", root, "--key", pub, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["ok"] is True and doc["failures"] == [] and doc["checked"] > 0


def test_tampered_payload_byte(bundle):
    root, pub = bundle
    env = root / "attestations" / "parity.test-result.dsse.json"
    edit_payload(env, lambda b: b.replace(b'"PASSED"', b'"FAILED"'))
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    lines = fail_lines(out)
    assert any(line.startswith("FAIL attestations/parity.test-result.dsse.json: signature 1 of 1 (keyid ")
               and line.endswith(f"does not verify with --key {pub}") for line in lines), out
    # the envelope file itself also no longer matches the manifest
    assert any("attestations/parity.test-result.dsse.json: sha256 does not match manifest.json" in line
               for line in lines)


def test_tampered_signature(bundle):
    root, pub = bundle
    env_path = root / "attestations" / "build.provenance.dsse.json"
    env = json.loads(env_path.read_text())
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[10] ^= 0x80
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    env_path.write_text(json.dumps(env))
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert "FAIL attestations/build.provenance.dsse.json: signature 1 of 1 (keyid " in out


def test_tampered_evidence_file(bundle):
    root, pub = bundle
    flip_byte(root / "evidence" / "parity.json", 5)
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    lines = fail_lines(out)
    assert lines and all(line.startswith("FAIL evidence/parity.json:") for line in lines), lines
    # named by the manifest, the manifest envelope and the parity attestation
    assert len(lines) == 3


def test_tampered_artifact(bundle):
    root, pub = bundle
    flip_byte(root / "artifacts" / "cpu" / "libflash_kernel.so", 100)
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    lines = fail_lines(out)
    assert any("artifacts/cpu/libflash_kernel.so: sha256 does not match attestations/build.provenance.dsse.json"
               in line for line in lines), lines
    assert all("artifacts/cpu/libflash_kernel.so" in line for line in lines)


def test_tampered_manifest(bundle):
    root, pub = bundle
    m = json.loads((root / "manifest.json").read_text())
    m["files"][0]["size"] += 1
    (root / "manifest.json").write_text(json.dumps(m, indent=2))
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert "FAIL manifest.json: sha256 does not match manifest.dsse.json" in out
    assert f"FAIL {m['files'][0]['path']}: size" in out


def test_unlisted_file(bundle):
    root, pub = bundle
    (root / "evidence" / "extra.json").write_text("{}")
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert fail_lines(out) == ["FAIL evidence/extra.json: not listed in manifest.json"]


def test_missing_listed_file(bundle):
    root, pub = bundle
    (root / "report.html").unlink()
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert fail_lines(out) == ["FAIL report.html: missing (named by manifest.dsse.json)",
                               "FAIL report.html: missing (named by manifest.json)"]


def test_wrong_key(bundle, tmp_path):
    root, signer = bundle
    keyid = keyid_of(load_public_key(signer))  # the envelopes name the signer's key, not the one given
    other = generate_keypair()
    priv, pub = write_keypair(tmp_path / "other", other)
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    lines = fail_lines(out)
    envelopes = ["manifest.dsse.json"] + sorted(
        f"attestations/{p.name}" for p in (root / "attestations").iterdir())
    for e in envelopes:
        assert any(line.startswith(f"FAIL {e}: signature 1 of 1 (keyid {keyid}) does not verify with --key")
                   for line in lines), e
    assert "not the key given with --key" in out


def _resign_with_subject(root: Path, key, name: str, digest: str) -> None:
    """A properly signed attestation naming `name`, then the manifest rewritten so only the name is wrong."""
    st = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": name, "digest": {"sha256": digest}}],
          "predicateType": "https://example.com/x", "predicate": {}}
    from audit.signing import dsse
    (root / "attestations" / "evil.dsse.json").write_text(dsse.sign(json.dumps(st).encode(), key).to_json())
    write_manifest(root, key)


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "evidence/../../outside.txt"])
def test_subject_outside_the_bundle(tmp_path, kernel_so, name):
    root, key = make_bundle(tmp_path / "b", kernel_so)
    # A file outside whose digest the subject claims: if verify followed the name, it would "match".
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    digest = hashlib.sha256(b"secret\n").hexdigest()
    _resign_with_subject(root, key, name, digest)
    r = verify_bundle(root, None)
    assert not r.ok
    assert r.failures == [f"attestations/evil.dsse.json: subject {name!r}: "
                          + ("absolute path points outside the bundle" if name.startswith("/")
                             else "'..' points outside the bundle")]
    rc, out, _ = cli("verify", root)
    assert rc == 1 and "FAIL attestations/evil.dsse.json: subject" in out


def test_subject_to_a_fifo_outside_never_hangs(tmp_path, kernel_so):
    root, key = make_bundle(tmp_path / "b", kernel_so)
    os.mkfifo(tmp_path / "fifo")
    _resign_with_subject(root, key, "../fifo", "0" * 64)
    rc, out, _ = cli_subprocess("verify", root)  # with a timeout: a read of the FIFO would hang
    assert rc == 1 and "'..' points outside the bundle" in out


def test_manifest_entry_outside_the_bundle(tmp_path, kernel_so):
    root, key = make_bundle(tmp_path / "b", kernel_so)
    m = json.loads((root / "manifest.json").read_text())
    m["files"].append({"path": "../../etc/passwd", "sha256": "0" * 64, "size": 1})
    (root / "manifest.json").write_text(json.dumps(m))
    r = verify_bundle(root, None)
    assert "manifest.json: entry '../../etc/passwd': '..' points outside the bundle" in r.failures
    assert "manifest.json: sha256 does not match manifest.dsse.json" in r.failures


def test_symlink_pointing_outside(bundle, tmp_path):
    root, pub = bundle
    # Replace a listed file by a symlink to an identical copy outside: following it would "pass".
    target = tmp_path / "copy.json"
    shutil.copy(root / "evidence" / "parity.json", target)
    (root / "evidence" / "parity.json").unlink()
    (root / "evidence" / "parity.json").symlink_to(target)
    (root / "evidence" / "passwd").symlink_to("/etc/passwd")
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    lines = fail_lines(out)
    assert "FAIL evidence/passwd: symlink points outside the bundle" in lines
    assert any(line.startswith("FAIL evidence/parity.json: symlink points outside the bundle") for line in lines)


def test_manifest_replaced_by_a_symlink(bundle, tmp_path):
    root, pub = bundle
    shutil.move(root / "manifest.json", tmp_path / "manifest.json")
    (root / "manifest.json").symlink_to(tmp_path / "manifest.json")
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert fail_lines(out) == ["FAIL manifest.json: symlink points outside the bundle"]


def test_symlinked_folder_pointing_outside(bundle, tmp_path):
    root, pub = bundle
    (tmp_path / "elsewhere").mkdir()
    shutil.move(root / "evidence", tmp_path / "elsewhere" / "evidence")
    (root / "evidence").symlink_to(tmp_path / "elsewhere" / "evidence")
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert "FAIL evidence: symlink points outside the bundle" in fail_lines(out)
    assert any(line.startswith("FAIL evidence/parity.json: symlink points outside the bundle")
               for line in fail_lines(out))


def test_fifo_in_bundle_is_a_failure_not_a_hang(bundle):
    root, pub = bundle
    os.mkfifo(root / "evidence" / "pipe")
    rc, out, _ = cli_subprocess("verify", root, "--key", pub)
    assert rc == 1
    assert "FAIL evidence/pipe: not a regular file" in out


def test_hostile_file_name_is_escaped_in_output(bundle):
    root, pub = bundle
    (root / "evil\x1b[31mred.txt").write_text("x")
    rc, out, _ = cli("verify", root, "--key", pub)
    assert rc == 1
    assert "\x1b" not in out
    assert "FAIL evil\\x1b[31mred.txt: control character in the name" in out


# --- malformed bundles: exit 2 ---------------------------------------------------------------------

def _expect_malformed(root, *extra, contains: str):
    rc, out, err = cli("verify", root, *extra)
    assert rc == 2, out + err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert contains in err, err
    with pytest.raises(MalformedBundle):
        verify_bundle(root, None)


def test_no_manifest(bundle):
    root, _ = bundle
    (root / "manifest.json").unlink()
    _expect_malformed(root, contains="no manifest.json")


def test_manifest_not_json(bundle):
    root, _ = bundle
    (root / "manifest.json").write_text("{not json")
    _expect_malformed(root, contains="manifest.json: not JSON")


def test_envelope_bad_json(bundle):
    root, _ = bundle
    (root / "attestations" / "parity.test-result.dsse.json").write_text("][")
    _expect_malformed(root, contains="attestations/parity.test-result.dsse.json: not JSON")


def test_deeply_nested_json_is_malformed_not_a_crash(bundle):
    root, _ = bundle
    (root / "manifest.json").write_text("[" * 200000)
    _expect_malformed(root, contains="manifest.json: not JSON")


def test_envelope_bad_base64(bundle):
    root, _ = bundle
    p = root / "attestations" / "linkage.test-result.dsse.json"
    env = json.loads(p.read_text())
    env["payload"] = "!!!" + env["payload"]
    p.write_text(json.dumps(env))
    _expect_malformed(root, contains="payload is not standard padded base64")


def test_wrong_payload_type(bundle):
    root, _ = bundle
    p = root / "manifest.dsse.json"
    env = json.loads(p.read_text())
    env["payloadType"] = "text/plain"
    p.write_text(json.dumps(env))
    _expect_malformed(root, contains="payloadType 'text/plain' is not application/vnd.in-toto+json")


def test_unsigned_manifest(bundle):
    root, _ = bundle
    (root / "manifest.dsse.json").unlink()
    _expect_malformed(root, contains="no manifest.dsse.json")


def test_no_public_key_and_no_key(bundle):
    root, _ = bundle
    (root / "public.pem").unlink()
    _expect_malformed(root, contains="no public.pem")


def test_not_a_folder(tmp_path):
    rc, _, err = cli_subprocess("verify", tmp_path / "nowhere")
    assert rc == 3 and err.startswith("error: ")  # a missing input: unreadable (README, exit codes)


def test_key_file_missing_is_unreadable_input(bundle, tmp_path):
    root, _ = bundle
    rc, _, err = cli("verify", root, "--key", tmp_path / "absent.pub")
    assert rc == 3 and "cannot read public key" in err


def test_key_file_not_a_key(bundle, tmp_path):
    root, _ = bundle
    (tmp_path / "junk.pub").write_text("hello\n")
    rc, _, err = cli("verify", root, "--key", tmp_path / "junk.pub")
    assert rc == 2 and "not a PEM public key" in err


@pytest.fixture(scope="module")
def fuzz_bundle(tmp_path_factory, kernel_so):
    root, _ = make_bundle(tmp_path_factory.mktemp("fuzz") / "b", kernel_so)
    return root


def _same_signed_content(data: bytes, original: bytes) -> bool:
    """Edits DSSE leaves unsigned (JSON layout, keyid): the envelope still says the same signed thing."""
    from audit.signing import dsse
    try:
        a, b = dsse.loads(data), dsse.loads(original)
    except AuditError:
        return False
    return (a.payload_type, a.payload) == (b.payload_type, b.payload) and \
        {x.sig for x in b.signatures} <= {x.sig for x in a.signatures}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(["manifest.json", "manifest.dsse.json", "attestations/parity.test-result.dsse.json"]),
       edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_bundles_fail_cleanly(fuzz_bundle, target, edits):
    """Any byte edits: a failure naming the file or a clean malformed-bundle error, never a crash."""
    path = fuzz_bundle / target
    original = path.read_bytes()
    data = bytearray(original)
    for where, byte in edits:
        data[int(where * len(data))] = byte
    data = bytes(data)
    try:
        path.write_bytes(data)
        try:
            r = verify_bundle(fuzz_bundle, None)
        except AuditError as exc:
            assert exc.exit_code in (2, 3) and "\n" not in exc.message
        else:
            if r.ok:  # only an unchanged file, or the one unlisted envelope saying the same signed thing
                assert data == original or (target == "manifest.dsse.json" and _same_signed_content(data, original))
            else:
                assert any(target in f for f in r.failures), r.failures
    finally:
        path.write_bytes(original)
    assert verify_bundle(fuzz_bundle, None).ok

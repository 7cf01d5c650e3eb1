"""docs/verify.md's procedure, run exactly as written (openssl, jq, coreutils; no Python crypto).

The shell block between the `tested-procedure` markers is extracted from the document and run with
bash on a real bundle; then on copies with one byte changed it must fail.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from test_verify import kernel_so, make_bundle  # noqa: F401  (session fixture: a gcc-built .so)

DOC = Path(__file__).resolve().parents[1] / "docs" / "verify.md"


def procedure() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- tested-procedure: begin -->\n```bash\n(.*?)```\n<!-- tested-procedure: end -->",
                  text, re.S)
    assert m, "docs/verify.md lost its tested-procedure block"
    return m.group(1)


def run_procedure(bundle: Path, key: Path, scratch: Path) -> subprocess.CompletedProcess:
    for tool in ("bash", "openssl", "jq", "base64", "sha256sum"):
        require_tool(tool)
    scratch.mkdir(exist_ok=True)
    script = scratch / "verify.sh"
    script.write_text(procedure())
    return subprocess.run(["bash", str(script)], cwd=scratch, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "B": str(bundle), "K": str(key)})


@pytest.fixture
def signed(tmp_path, kernel_so):
    root, key = make_bundle(tmp_path / "bundle", kernel_so)
    pub = tmp_path / "signer.pub"
    pub.write_bytes(key.public_pem)
    return root, pub


def test_documented_procedure_verifies_a_real_bundle(signed, tmp_path):
    root, pub = signed
    p = run_procedure(root, pub, tmp_path / "scratch")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("bundle verified")
    # one "Signature Verified Successfully" per envelope: the manifest's and the four attestations
    assert p.stdout.count("Signature Verified Successfully") == 5


@pytest.mark.parametrize("envelope, message", [
    ("manifest.dsse.json", "Signature Verification Failure"),  # checked first: openssl says no
    # an attestation is also a subject of the manifest envelope, whose digest check fails first
    ("attestations/parity.test-result.dsse.json", "attestations/parity.test-result.dsse.json: FAILED"),
])
def test_payload_byte_tamper_fails(signed, tmp_path, envelope, message):
    root, pub = signed
    env_path = root / envelope
    env = json.loads(env_path.read_text())
    payload = bytearray(base64.b64decode(env["payload"]))
    payload[len(payload) // 2] ^= 0x01
    env["payload"] = base64.b64encode(bytes(payload)).decode()
    env_path.write_text(json.dumps(env))
    p = run_procedure(root, pub, tmp_path / "scratch")
    assert p.returncode != 0
    assert message in p.stdout + p.stderr
    assert "bundle verified" not in p.stdout


@pytest.mark.parametrize("victim", ["evidence/parity.json", "artifacts/cpu/libflash_kernel.so", "report.html"])
def test_file_byte_tamper_fails_the_digests(signed, tmp_path, victim):
    root, pub = signed
    data = bytearray((root / victim).read_bytes())
    data[0] ^= 0x01
    (root / victim).write_bytes(bytes(data))
    p = run_procedure(root, pub, tmp_path / "scratch")
    assert p.returncode != 0
    assert "did NOT match" in p.stderr and "bundle verified" not in p.stdout


def test_wrong_key_fails(signed, tmp_path):
    root, _ = signed
    other = tmp_path / "other.pub"
    subprocess.run([require_tool("openssl"), "genpkey", "-algorithm", "ED25519", "-out", str(tmp_path / "o.key")],
                   check=True)
    subprocess.run(["openssl", "pkey", "-in", str(tmp_path / "o.key"), "-pubout", "-out", str(other)], check=True)
    p = run_procedure(root, other, tmp_path / "scratch")
    assert p.returncode != 0 and "Signature Verification Failure" in p.stdout + p.stderr


def test_unlisted_file_and_symlink_fail(signed, tmp_path):
    root, pub = signed
    extra = tmp_path / "extra"
    shutil.copytree(root, extra, symlinks=True)
    (extra / "evidence" / "added.json").write_text("{}")
    p = run_procedure(extra, pub, tmp_path / "s1")
    assert p.returncode != 0 and "added.json" in p.stdout
    (root / "evidence" / "passwd").symlink_to("/etc/passwd")
    p = run_procedure(root, pub, tmp_path / "s2")
    assert p.returncode != 0 and "REFUSED: symlink" in p.stdout

"""`check --attest`: a DSSE envelope of an in-toto Statement v1 with a SLSA VSA v1 predicate, checked by
independent verifiers (securesystemslib for the signature; the in-toto attestation framework's own
Python bindings for the statement and the VSA v1 predicate), and by `verify-attestation`."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from google.protobuf import json_format
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from linkage_fixtures import cc_shared
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from audit.cli import main
from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, EXIT_VIOLATION
from cli_runner import cli

VSA = "https://slsa.dev/verification_summary/v1"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    with pytest.raises(SystemExit):
        main(["keygen", "--out", str(d / "signer")])
    with pytest.raises(SystemExit):
        main(["keygen", "--out", str(d / "other")])
    return d


@pytest.fixture()
def dist(tmp_path, monkeypatch):
    """A wheel with a cuBLAS copy in it (a violation) and a clean library, built by gcc and zip."""
    require_tool("gcc")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("SOVEREIGN_AUDIT_SIGNING_KEY", raising=False)
    b = tmp_path / "build"
    cc_shared(b / "pkg/_ext.so", "volatile int acc;\nint cublasSgemm_v2(void){acc += 7; return acc;}\n")
    clean = cc_shared(tmp_path / "libclean.so", "int c(void){return 0;}\n")
    whl = tmp_path / "pkg_name-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(b / "pkg/_ext.so", "pkg/_ext.so")
        zf.writestr("pkg/__init__.py", "")
    return {"wheel": Path(whl.name), "clean": Path(clean.name)}


def payload(path: Path) -> dict:
    lines = path.read_text().splitlines()
    assert len(lines) == 1  # JSON Lines: one envelope per line
    return json.loads(base64.b64decode(json.loads(lines[0])["payload"]))


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_failed_wheel_verifies_with_securesystemslib_and_the_in_toto_bindings(dist, keys, capsys):
    rc, _, err = cli(capsys, "check", dist["wheel"], "--format", "json=r.json", "--attest", "c.intoto.jsonl",
                     "--key", keys / "signer.key")
    assert rc == EXIT_VIOLATION and err == ""

    # the signature, by securesystemslib (its own key and keyid from the public PEM)
    key = SSlibKey.from_crypto(load_pem_public_key((keys / "signer.pub").read_bytes()))
    envelope = Envelope.from_dict(json.loads(Path("c.intoto.jsonl").read_text()))
    assert envelope.payload_type == "application/vnd.in-toto+json"
    envelope.verify([key], 1)
    other = SSlibKey.from_crypto(load_pem_public_key((keys / "other.pub").read_bytes()))
    with pytest.raises(VerificationError):
        envelope.verify([other], 1)

    # the statement, by the in-toto attestation framework's bindings (strict: no unknown field)
    stmt = json.loads(envelope.payload)
    pb = json_format.Parse(json.dumps(stmt), statement_pb2.Statement())
    Statement.copy_from_pb(pb).validate()
    # the VSA v1 predicate by its proto; what the proto lacks is what the spec lets a producer add:
    # fields named by URIs, and verifier.version (SLSA 1.2's)
    predicate = dict(stmt["predicate"])
    extensions = [k for k in predicate if k.startswith("https://")]
    for k in extensions:
        del predicate[k]
    predicate["verifier"] = {k: v for k, v in predicate["verifier"].items() if k != "version"}
    # in-toto-attestation 0.9.3 (the last on PyPI) still declares verifiedLevels a single string;
    # the spec's list of SlsaResult came with the framework's v1.1.1 protos: checked by hand here
    levels = predicate.pop("verifiedLevels")
    vsa = json_format.Parse(json.dumps(predicate), vsa_pb2.VerificationSummary())
    assert stmt["predicateType"] == VSA
    assert vsa.verification_result == "FAILED" and levels == ["FAILED"]
    assert vsa.resource_uri == "pkg:pypi/pkg-name@1.0"
    assert vsa.policy.uri.endswith("#audit/policies/sovereign.toml") and len(vsa.policy.digest["sha256"]) == 64
    assert stmt["predicate"]["verifier"]["version"]["sovereign-audit"]

    # subjects: the wheel as a whole and the JSON report written in the same run, by their bytes
    subjects = {s["name"]: s for s in stmt["subject"]}
    assert set(subjects) == {str(dist["wheel"]), "r.json"}
    assert subjects[str(dist["wheel"])]["digest"]["sha256"] == sha256(dist["wheel"])
    assert subjects[str(dist["wheel"])]["annotations"] == {"verdict": "fail"}
    assert subjects["r.json"]["digest"]["sha256"] == sha256(Path("r.json"))

    # the findings' digest, recomputed from the JSON report as docs/ci.md says
    report = json.loads(Path("r.json").read_text())
    reduced = [{"path": f["path"], "findings": f["findings"]} for f in report["files"]]
    canonical = json.dumps(reduced, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    findings = stmt["predicate"]["https://sovereign-audit.dev/vsa/findings/v1"]
    assert findings["sha256"] == hashlib.sha256(canonical).hexdigest()
    assert findings["failing"] == report["summary"]["findings"] > 0 and findings["exitCode"] == 1

    rc, out, err = cli(capsys, "verify-attestation", "c.intoto.jsonl", "--key", keys / "signer.pub",
                       "--artifact", dist["wheel"], "--artifact", "r.json")
    assert rc == EXIT_OK and err == "" and "FAILED for pkg:pypi/pkg-name@1.0; 2 subjects" in out
    rc, _, err = cli(capsys, "verify-attestation", "c.intoto.jsonl", "--key", keys / "signer.pub", "--require-passed")
    assert rc == EXIT_VIOLATION and err.startswith("error: ") and "FAILED" in err and len(err.splitlines()) == 1


def test_same_inputs_same_bytes_and_source_date_epoch(dist, keys, capsys, monkeypatch):
    outs = []
    for name in ("a", "b"):
        rc, _, _ = cli(capsys, "check", dist["clean"], "--attest", f"{name}.intoto.jsonl", "--key", keys / "signer.key")
        assert rc == EXIT_OK
        outs.append(Path(f"{name}.intoto.jsonl").read_bytes())
    assert outs[0] == outs[1]
    stmt = payload(Path("a.intoto.jsonl"))
    assert stmt["predicate"]["verificationResult"] == "PASSED"
    assert stmt["predicate"]["verifiedLevels"] == ["SOVEREIGN_AUDIT_LINKAGE_PASSED"]
    assert stmt["predicate"]["resourceUri"] == "libclean.so"
    mtime = int(dist["clean"].stat().st_mtime)
    import datetime
    want = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert stmt["predicate"]["timeVerified"] == want

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    cli(capsys, "check", dist["clean"], "--attest", "e.intoto.jsonl", "--key", keys / "signer.key")
    assert payload(Path("e.intoto.jsonl"))["predicate"]["timeVerified"] == "2023-11-14T22:13:20Z"
    for bad in ("yesterday", "-1", "253402300800"):  # the last one: year 10000
        monkeypatch.setenv("SOURCE_DATE_EPOCH", bad)
        rc, out, err = cli(capsys, "check", dist["clean"], "--attest", "f.intoto.jsonl", "--key", keys / "signer.key")
        assert rc == EXIT_USAGE and out == "" and err.startswith(f"error: $SOURCE_DATE_EPOCH {bad}"), err
        assert len(err.splitlines()) == 1 and not Path("f.intoto.jsonl").exists()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "253402300799")
    cli(capsys, "check", dist["clean"], "--attest", "g.intoto.jsonl", "--key", keys / "signer.key")
    assert payload(Path("g.intoto.jsonl"))["predicate"]["timeVerified"] == "9999-12-31T23:59:59Z"

    rc, out, _ = cli(capsys, "verify-attestation", "a.intoto.jsonl", "--key", keys / "signer.pub",
                     "--artifact", dist["clean"], "--require-passed")
    assert rc == EXIT_OK and "PASSED for libclean.so; 1 subjects" in out


def test_ephemeral_key_writes_its_public_half_and_says_so(dist, capsys):
    rc, _, err = cli(capsys, "check", dist["clean"], "--attest", "c.intoto.jsonl")
    assert rc == EXIT_OK
    assert err == "note: c.intoto.jsonl is signed with an ephemeral key (integrity only, no identity); " \
                  "its public key is c.intoto.jsonl.pub\n"
    rc, _, _ = cli(capsys, "verify-attestation", "c.intoto.jsonl", "--key", "c.intoto.jsonl.pub")
    assert rc == EXIT_OK


def test_usage_errors_come_before_the_audit(dist, keys, capsys):
    for args, msg in [
        (["--key", keys / "signer.key"], "--key signs or names --attest's verdict"),
        (["--resource-uri", "pkg:pypi/x@1"], "--resource-uri signs or names --attest's verdict"),
        (["--attest", "missing/c.intoto.jsonl"], "cannot write missing/c.intoto.jsonl: No such directory"),
        (["--attest", "c.intoto.jsonl", "--key", keys / "signer.pub"], "not a PEM private key"),
    ]:
        rc, out, err = cli(capsys, "check", dist["clean"], *args)
        assert rc == EXIT_USAGE and out == "" and len(err.splitlines()) == 1 and msg in err, err
    rc, _, err = cli(capsys, "check", dist["clean"], dist["wheel"], "--attest", "c.intoto.jsonl")
    assert rc == EXIT_USAGE and "--resource-uri" in err
    rc, _, _ = cli(capsys, "check", dist["clean"], dist["wheel"], "--attest", "c.intoto.jsonl",
                   "--resource-uri", "pkg:generic/dist@1", "--key", keys / "signer.key")
    assert rc == EXIT_VIOLATION
    stmt = payload(Path("c.intoto.jsonl"))
    assert stmt["predicate"]["resourceUri"] == "pkg:generic/dist@1"
    assert [s["annotations"]["verdict"] for s in stmt["subject"]] == ["pass", "fail"]  # sorted by name


def test_verify_attestation_failures_are_one_error_line_each(dist, keys, capsys, tmp_path):
    from audit.signing import dsse
    from audit.signing.keys import load_signing_key

    cli(capsys, "check", dist["clean"], "--attest", "c.intoto.jsonl", "--key", keys / "signer.key")
    env = json.loads(Path("c.intoto.jsonl").read_text())
    stmt = payload(Path("c.intoto.jsonl"))

    tampered = dict(stmt, predicate=dict(stmt["predicate"], verificationResult="PASSED", resourceUri="x"))
    Path("tampered.intoto.jsonl").write_text(json.dumps(dict(env, payload=base64.b64encode(
        json.dumps(tampered).encode()).decode())) + "\n")
    key = load_signing_key(keys / "signer.key")
    not_vsa = dict(stmt, predicateType="https://slsa.dev/provenance/v1")
    Path("provenance.intoto.jsonl").write_text(json.dumps(dsse.sign(json.dumps(not_vsa).encode(), key).to_dict()))
    no_subject = dict(stmt, subject=[])
    Path("nosubject.intoto.jsonl").write_text(json.dumps(dsse.sign(json.dumps(no_subject).encode(), key).to_dict()))
    Path("notjson.intoto.jsonl").write_text("{not json\n")
    Path("bad.pub").write_text("not a key\n")

    cases = [
        (["c.intoto.jsonl", "--key", keys / "other.pub"], EXIT_VIOLATION, "does not verify under the given key"),
        (["tampered.intoto.jsonl", "--key", keys / "signer.pub"], EXIT_VIOLATION, "does not verify"),
        (["c.intoto.jsonl", "--key", keys / "signer.pub", "--artifact", dist["wheel"]], EXIT_VIOLATION,
         "matches no subject"),
        (["provenance.intoto.jsonl", "--key", keys / "signer.pub"], EXIT_USAGE, "predicateType is https://slsa.dev/provenance/v1"),
        (["nosubject.intoto.jsonl", "--key", keys / "signer.pub"], EXIT_USAGE, "no subject"),
        (["notjson.intoto.jsonl", "--key", keys / "signer.pub"], EXIT_USAGE, "not JSON"),
        (["c.intoto.jsonl", "--key", "bad.pub"], EXIT_USAGE, "not a PEM public key"),
        (["missing.intoto.jsonl", "--key", keys / "signer.pub"], EXIT_INPUT, "cannot read missing.intoto.jsonl"),
        (["c.intoto.jsonl", "--key", "missing.pub"], EXIT_INPUT, "cannot read public key"),
        (["c.intoto.jsonl", "--key", keys / "signer.pub", "--artifact", "missing.so"], EXIT_INPUT,
         "cannot read artifact missing.so"),
    ]
    for args, code, msg in cases:
        rc, out, err = cli(capsys, "verify-attestation", *args)
        assert (rc, len(err.splitlines())) == (code, 1) and err.startswith("error: ") and msg in err, (args, err)
        assert out == ""


def test_docs_ci_python_examples_run_as_written(dist, keys, capsys):
    """docs/ci.md's securesystemslib check and findings-digest recipe, run on a real attestation."""
    import re
    import shutil
    import subprocess
    import sys

    shutil.copy(keys / "signer.pub", "ci.pub")
    rc, _, _ = cli(capsys, "check", dist["wheel"], "--format", "json=linkage.json", "--attest", "check.intoto.jsonl",
                   "--key", keys / "signer.key")
    assert rc == EXIT_VIOLATION
    text = (Path(__file__).resolve().parent.parent / "docs/ci.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    verify = next(b for b in blocks if "Envelope.from_dict" in b)
    recipe = next(b for b in blocks if "hashlib" in b and "linkage.json" in b)
    out = subprocess.run([sys.executable, "-c", verify], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "FAILED\n", out.stderr
    out = subprocess.run([sys.executable, "-c", recipe], capture_output=True, text=True)
    digest = payload(Path("check.intoto.jsonl"))["predicate"]["https://sovereign-audit.dev/vsa/findings/v1"]["sha256"]
    assert out.returncode == 0 and out.stdout == digest + "\n", out.stderr


def test_verify_attestation_exit_codes_are_documented_in_help_and_docs(capsys):
    import re

    rc, out, _ = cli(capsys, "verify-attestation", "--help")
    flat = " ".join(out.split())
    assert rc == EXIT_OK
    for code, words in ((0, "verified"), (1, "does not verify under PUB"), (2, "not a DSSE envelope"),
                        (3, "cannot be read")):
        assert re.search(rf"\b{code} [^;]*{re.escape(words)}", flat), (code, flat)
    doc = (Path(__file__).resolve().parent.parent / "docs/ci.md").read_text()
    table = doc[doc.index("### Verifying it"):]
    for code, words in ((0, "every signature verifies"), (1, "does not verify under PUB"), (2, "not a DSSE envelope"),
                        (3, "cannot be read")):
        assert re.search(rf"^\| {code} \|[^\n]*{re.escape(words)}", table, re.M), code


def test_images_are_subjects_as_a_whole_tar_or_by_their_oci_index(dist, keys, capsys, tmp_path):
    """A `docker save` tar by its own sha256; an OCI layout folder by its index.json, which names
    every manifest by digest; the files inside are no subjects of their own."""
    from image_fixtures import docker_archive, layer_tar, oci_layout

    elf = (tmp_path / dist["clean"]).read_bytes()
    layer = layer_tar([("dir", "usr/"), ("dir", "usr/lib/"), ("file", "usr/lib/libclean.so", elf)])
    tar = docker_archive(tmp_path / "app.tar", [layer])
    (tmp_path / "layout").mkdir()
    oci_layout(tmp_path / "layout", [layer])
    rc, _, _ = cli(capsys, "check", "app.tar", "layout", "--attest", "img.intoto.jsonl", "--key", keys / "signer.key",
                   "--resource-uri", "oci://registry.example/app@sha256:" + "1" * 64)
    assert rc == EXIT_OK
    subjects = {s["name"]: s["digest"]["sha256"] for s in payload(Path("img.intoto.jsonl"))["subject"]}
    assert subjects == {"app.tar": sha256(tar), "layout/index.json": sha256(tmp_path / "layout/index.json")}
    rc, out, _ = cli(capsys, "verify-attestation", "img.intoto.jsonl", "--key", keys / "signer.pub",
                     "--artifact", "app.tar", "--artifact", "layout/index.json")
    assert rc == EXIT_OK and "PASSED for oci://registry.example/app@sha256:" in out


def test_verify_attestation_refuses_a_huge_file_and_a_fifo_without_reading_them(keys, capsys, tmp_path, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    with open("big.intoto.jsonl", "wb") as fh:
        fh.truncate(65 << 20)  # sparse: nothing is written
    os.mkfifo("pipe.intoto.jsonl")  # a reader that opened it would wait forever
    for name, code, msg in (("big.intoto.jsonl", EXIT_USAGE, "too large for an attestation"),
                            ("pipe.intoto.jsonl", EXIT_INPUT, "not a regular file")):
        rc, out, err = cli(capsys, "verify-attestation", name, "--key", keys / "signer.pub")
        assert (rc, out, len(err.splitlines())) == (code, "", 1) and msg in err, err


def test_an_unreadable_input_fails_the_verdict_and_is_listed_unattested(dist, keys, capsys):
    import os

    os.symlink("nowhere.so", "broken.so")  # named on the command line: an input that cannot be read
    rc, _, _ = cli(capsys, "check", dist["clean"], "broken.so", "--attest", "c.intoto.jsonl", "--key",
                   keys / "signer.key", "--resource-uri", "pkg:generic/x@1")
    assert rc == EXIT_INPUT
    stmt = payload(Path("c.intoto.jsonl"))
    assert stmt["predicate"]["verificationResult"] == "FAILED" and stmt["predicate"]["verifiedLevels"] == ["FAILED"]
    assert [s["name"] for s in stmt["subject"]] == ["libclean.so"]
    findings = stmt["predicate"]["https://sovereign-audit.dev/vsa/findings/v1"]
    assert findings["unattested"] == ["broken.so"] and findings["exitCode"] == EXIT_INPUT


def test_a_file_time_out_of_range_gives_a_timestamp_in_range(dist, keys, capsys):
    import os

    import datetime

    for when in (2 ** 40, -(2 ** 40)):  # the file system keeps what it can (ext4: up to year 2446)
        os.utime(dist["clean"], (when, when))
        kept = int(dist["clean"].stat().st_mtime)
        clamped = min(max(kept, 0), 253402300799)
        want = datetime.datetime.fromtimestamp(clamped, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rc, _, err = cli(capsys, "check", dist["clean"], "--attest", "c.intoto.jsonl", "--key", keys / "signer.key")
        assert rc == EXIT_OK, err
        assert payload(Path("c.intoto.jsonl"))["predicate"]["timeVerified"] == want
    assert want == "1970-01-01T00:00:00Z"  # before 1970: the epoch


def test_hostile_statement_strings_are_escaped_in_error_lines(dist, keys, capsys):
    from audit.signing import dsse
    from audit.signing.keys import load_signing_key

    cli(capsys, "check", dist["clean"], "--attest", "c.intoto.jsonl", "--key", keys / "signer.key")
    stmt = payload(Path("c.intoto.jsonl"))
    stmt["predicate"]["verifiedLevels"] = ["FAILED", "##[error]x\x1b[2J"]  # contradicts PASSED
    stmt["predicateType"] = "::error::\u202eforged"
    key = load_signing_key(keys / "signer.key")
    Path("h.intoto.jsonl").write_text(json.dumps(dsse.sign(json.dumps(stmt).encode(), key).to_dict()))
    rc, out, err = cli(capsys, "verify-attestation", "h.intoto.jsonl", "--key", keys / "signer.pub")
    assert rc == EXIT_USAGE and out == "" and len(err.splitlines()) == 2
    assert "##[" not in err and "\x1b" not in err and "\u202e" not in err
    assert all(line.startswith("error: ") for line in err.splitlines())


def test_file_names_that_are_not_utf8_are_attested_by_their_bytes(dist, keys, capsys):
    """A file, a wheel and a policy whose names hold bytes that are not UTF-8 (as a fuzzer found:
    exit 4 from the resourceUri's percent-encoding): the run's own exit code, the names'
    bytes percent-encoded in the URIs, each subject named as the file is, and the envelope verifies
    with those files as artifacts."""
    import os
    import shutil

    odd = os.fsdecode(b"lib\xff\xfe.so")
    shutil.copy(dist["clean"], odd)
    rc, _, err = cli(capsys, "check", odd, "--attest", "c.intoto.jsonl", "--key", keys / "signer.key")
    assert rc == EXIT_OK, err
    stmt = payload(Path("c.intoto.jsonl"))
    assert stmt["predicate"]["resourceUri"] == "lib%FF%FE.so"
    assert [s["name"] for s in stmt["subject"]] == [odd]
    rc, out, err = cli(capsys, "verify-attestation", "c.intoto.jsonl", "--key", keys / "signer.pub", "--artifact", odd)
    assert rc == EXIT_OK and err == "", err

    wheel = os.fsdecode(b"pkg_name-1.0\xff-cp311-cp311-linux_x86_64.whl")
    shutil.copy(dist["wheel"], wheel)
    rc, _, err = cli(capsys, "check", wheel, "--attest", "w.intoto.jsonl", "--key", keys / "signer.key")
    assert rc == EXIT_VIOLATION, err
    assert payload(Path("w.intoto.jsonl"))["predicate"]["resourceUri"] == "pkg:pypi/pkg-name@1.0%FF"

    policy = os.fsdecode(b"p\xff.toml")
    shutil.copy(Path(__file__).resolve().parent.parent / "policies" / "sovereign.toml", policy)
    rc, _, err = cli(capsys, "check", dist["clean"], "--policy", policy, "--attest", "p.intoto.jsonl",
                     "--key", keys / "signer.key")
    assert rc == EXIT_OK, err
    assert payload(Path("p.intoto.jsonl"))["predicate"]["policy"]["uri"] == "p%FF.toml"

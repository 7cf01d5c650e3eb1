"""`check --attest FILE`: the run's verdict as a signed SLSA Verification Summary Attestation.

FILE holds one line (JSON Lines, the `*.intoto.jsonl` that SLSA and Scorecard tooling look for):
a DSSE envelope (audit.signing.dsse, Ed25519, the keys of `keygen` and `run`) whose payload is an
in-toto Statement v1 with the predicate https://slsa.dev/verification_summary/v1:

  subject             every audited artifact as it lies on disk: a file given or found, a wheel,
                      conda package or image tar as a whole (its members' digests are in the JSON
                      report and the SBOMs, which are subjects too when this run writes them); an
                      OCI layout folder by its index.json, which names every manifest by digest
  verifier            {"id": VERIFIER_ID, "version": {"sovereign-audit": version}}
  timeVerified        $SOURCE_DATE_EPOCH, else (with --timing) now, else the newest modification
                      time of the artifacts: the same inputs give the same bytes
  resourceUri         --resource-uri, else pkg:pypi/NAME@VERSION for one wheel, else the one input
  policy              uri (the policy file as given, or the shipped policy as a purl subpath) and
                      the sha256 of that file; every file it extends is under POLICY_SOURCES
  verificationResult  PASSED when the run exits 0, else FAILED (a violation or an input that
                      could not be read: fail closed)
  verifiedLevels      [PASSED_LEVEL] or ["FAILED"]: the SLSA build track is not verified here, and
                      the spec reserves SLSA_* names for its tracks
  FINDINGS            (an extension field named by a URI, as the parsing rules ask) the sha256 of
                      the findings (findings_digest), the counts behind the verdict, and the files
                      that could not be named by a digest (unattested)

`verify_file` checks such a file: the signature under a public key, the statement's shape, and
that given artifacts are among the subjects.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote

from audit import __version__
from audit.errors import InputError, UsageError, printable
from audit.linkage.model import CheckReport

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
VSA_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = "https://sovereign-audit.dev/verifier/check"
FINDINGS = "https://sovereign-audit.dev/vsa/findings/v1"
POLICY_SOURCES = "https://sovereign-audit.dev/vsa/policy-sources/v1"
PASSED_LEVEL = "SOVEREIGN_AUDIT_LINKAGE_PASSED"
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z: RFC 3339 has four-digit years
MAX_ATTESTATION_BYTES = 64 << 20  # one envelope is a few kB per thousand subjects
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANK = {"pass": 0, "fail": 1, "error": 2}
# PEP 427: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


@dataclass(frozen=True)
class Subject:
    name: str
    sha256: str
    annotations: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"name": self.name, "digest": {"sha256": self.sha256}}
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        return d


@dataclass(frozen=True)
class Artifacts:
    """The subjects for the audited artifacts, and what could not be one (an unreadable file)."""
    subjects: list[Subject]
    unnamed: list[str]
    newest_mtime: int | None


def _hash(path: str) -> str | None:
    from audit.elf.hashing import hash_file
    return hash_file(path)


def artifact_subjects(report: CheckReport) -> Artifacts:
    """One subject per artifact on disk, with the worst verdict of the files audited in it."""
    verdicts: dict[str, str] = {}  # artifact path -> verdict
    members: dict[str, list] = {}  # archive -> its FileResults (used where the archive is not a file)
    for fr in report.files:
        key = fr.archive or fr.path
        old = verdicts.get(key, "pass")
        verdicts[key] = fr.verdict if _RANK.get(fr.verdict, 2) > _RANK.get(old, 2) else old
        if fr.archive:
            members.setdefault(fr.archive, []).append(fr)
    own = {fr.path: fr.sha256 for fr in report.files if not fr.archive}
    own.update({c.path: c.sha256 for c in report.containers if c.sha256})  # hashed as they were opened
    subjects, unnamed, newest = {}, [], None
    for path, verdict in verdicts.items():
        name, digest = path, None
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "index.json")):  # an OCI layout
            name = path.rstrip("/") + "/index.json"
            digest = _hash(name)
        elif os.path.isfile(path):
            digest = own.get(path) or _hash(path)
        if digest is None and path in members:  # not a file of its own: each member by its digest
            for fr in members[path]:
                if fr.sha256:
                    subjects[fr.path] = Subject(fr.path, fr.sha256, {"verdict": fr.verdict})
                else:
                    unnamed.append(fr.path)
            continue
        if digest is None:
            unnamed.append(path)
            continue
        subjects[name] = Subject(name, digest, {"verdict": verdict})
        try:
            mtime = int(os.stat(name).st_mtime)
            newest = mtime if newest is None else max(newest, mtime)
        except OSError:
            pass
    return Artifacts([subjects[k] for k in sorted(subjects)], unnamed, newest)


def output_subjects(written: list[tuple[str, str]]) -> list[Subject]:
    """The reports this run wrote to files ((format, path) pairs), each by the digest of its bytes."""
    out = []
    for fmt, path in written:
        if os.path.isfile(path):
            digest = _hash(path)
            if digest:
                out.append(Subject(path, digest, {"output": fmt}))
    return out


def findings_digest(files: list[dict]) -> str:
    """sha256 of the findings in canonical JSON: the JSON report's `files`, each reduced to
    {"path", "findings"}, dumped with sorted keys, no spaces and ASCII escapes. A reader of the
    JSON report recomputes it in one line (docs/ci.md)."""
    reduced = [{"path": f["path"], "findings": f["findings"]} for f in files]
    return hashlib.sha256(_canonical(reduced)).hexdigest()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def source_date_epoch() -> int | None:
    """$SOURCE_DATE_EPOCH as an integer, None when unset; a UsageError when it is not one."""
    text = os.environ.get("SOURCE_DATE_EPOCH")
    if text is None or not text.strip():
        return None
    if not text.strip().isdigit() or len(text.strip()) > 12 or int(text.strip()) > _LAST_SECOND:
        raise UsageError(f"$SOURCE_DATE_EPOCH {printable(text)[:40]}: not a number of seconds since 1970 "
                         f"(up to {_LAST_SECOND}, the end of year 9999)")
    return int(text.strip())


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uri(text: str) -> str:
    """Percent-encoded for a URI: a name's bytes that are not UTF-8 (kept by os.fsdecode as
    surrogates) as the bytes they were, %FF, never an error."""
    return quote(text, errors="surrogateescape")


def default_resource_uri(inputs: list[str]) -> str | None:
    """pkg:pypi/NAME@VERSION for one wheel, the path as a URI reference for one other input, else None."""
    if len(inputs) != 1:
        return None
    m = _WHEEL.match(os.path.basename(inputs[0]))
    if m and os.path.isfile(inputs[0]):
        name = re.sub(r"[-_.]+", "-", m["name"]).lower()  # the purl spec's PyPI name normalisation
        return f"pkg:pypi/{_uri(name)}@{_uri(m['version'])}"
    return _uri(inputs[0].replace(os.sep, "/"))


def policy_descriptor(policy: dict) -> tuple[dict, list[dict]]:
    """(the VSA's `policy`, every source base first) from CheckReport.policy."""
    sources = [{"uri": _policy_uri(s["path"]), "digest": {"sha256": s["sha256"]}} for s in policy.get("sources", [])]
    if not sources:  # a policy built in code (tests): its name only
        return {"uri": _uri(str(policy.get("name", "")))}, []
    return dict(sources[-1]), sources


def _policy_uri(label: str) -> str:
    if label.endswith(" (shipped)"):
        return f"pkg:pypi/sovereign-audit@{__version__}#audit/policies/{_uri(label[:-len(' (shipped)')])}.toml"
    return _uri(label.replace(os.sep, "/"))


def statement(report: CheckReport, subjects: list[Subject], resource_uri: str, when: str,
              unnamed: list[str] = ()) -> dict:
    files = [{"path": f.path, "findings": [x.to_dict() for x in f.findings]} for f in report.files]
    policy, sources = policy_descriptor(report.policy)
    passed = report.exit_code == 0
    summary = report.summary
    predicate = {
        "verifier": {"id": VERIFIER_ID, "version": {"sovereign-audit": report.tool_version}},
        "timeVerified": when,
        "resourceUri": resource_uri,
        "policy": policy,
        "verificationResult": "PASSED" if passed else "FAILED",
        "verifiedLevels": [PASSED_LEVEL] if passed else ["FAILED"],
        "slsaVersion": "1.0",
        POLICY_SOURCES: sources,
        FINDINGS: {"sha256": findings_digest(files), "failing": summary["findings"],
                   "files": summary["files"], "exitCode": report.exit_code,
                   "unattested": sorted(unnamed)},  # audited (or not readable) but no digest to name them by
    }
    return {"_type": STATEMENT_TYPE, "subject": [s.to_dict() for s in subjects],
            "predicateType": VSA_TYPE, "predicate": predicate}


def time_verified(report: CheckReport, newest_mtime: int | None) -> str:
    epoch = source_date_epoch()
    if epoch is not None:
        return _rfc3339(epoch)
    if report.timing:
        return _rfc3339(time.time())
    return _rfc3339(min(max(newest_mtime or 0, 0), _LAST_SECOND))  # a file's time may be anything


@dataclass(frozen=True)
class Written:
    path: str
    statement: dict
    keyid: str
    ephemeral: bool
    public_key_path: str | None  # where an ephemeral key's public half was written


def write_attestation(path: str, report: CheckReport, key, resource_uri: str | None,
                      written: list[tuple[str, str]]) -> Written:
    """Build, sign and write the attestation (a SigningKey from audit.signing.keys)."""
    from audit.linkage.outputs.write import _replace as replace_file
    from audit.signing import dsse

    artifacts = artifact_subjects(report)
    subjects = artifacts.subjects + output_subjects(written)
    if not artifacts.subjects:
        raise InputError(f"--attest {path}: no audited artifact could be named by its digest; nothing to attest")
    uri = resource_uri or default_resource_uri(report.inputs) or ""
    stmt = statement(report, subjects, uri, time_verified(report, artifacts.newest_mtime), artifacts.unnamed)
    envelope = dsse.sign(_canonical(stmt), key)
    line = json.dumps(envelope.to_dict(), separators=(",", ":")) + "\n"
    pub = None
    try:
        replace_file(path, line)
        if key.ephemeral:  # without it nobody could check the signature: integrity only
            pub = path + ".pub"
            replace_file(pub, key.public_pem.decode("ascii"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return Written(path, stmt, key.keyid, key.ephemeral, pub)


# --- verification -------------------------------------------------------------------------------

@dataclass
class Verification:
    """What verify_file found: failures (each one `error:` line), and the statements that verified."""
    failures: list[str] = field(default_factory=list)
    statements: list[dict] = field(default_factory=list)
    malformed: bool = False  # a failure of shape (exit 2) rather than of trust (exit 1)

    @property
    def ok(self) -> bool:
        return not self.failures


def read_envelopes(path: str) -> list:
    """The DSSE envelopes of a `*.intoto.jsonl` file (one per line), or of a file holding one
    envelope as a JSON document. InputError when unreadable, MalformedEnvelope when not DSSE."""
    from audit.files import read_regular_file
    from audit.signing import dsse

    try:
        size = os.stat(path).st_size
        if size > MAX_ATTESTATION_BYTES:
            raise UsageError(f"{printable(path)}: {size} bytes, too large for an attestation")
        data = read_regular_file(path)
    except OSError as exc:
        raise InputError(f"cannot read {printable(path)}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise dsse.MalformedEnvelope(f"{printable(path)}: not UTF-8 text") from None
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        whole = None
    if isinstance(whole, dict):
        return [dsse.parse(whole, printable(path))]
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise dsse.MalformedEnvelope(f"{printable(path)}: empty, no envelope")
    return [dsse.loads(ln, f"{printable(path)}:{i}") for i, ln in lines]


def check_statement(stmt, where: str) -> list[str]:
    """The shape an in-toto Statement v1 with a VSA v1 predicate must have: one line per problem."""
    if not isinstance(stmt, dict):
        return [f"{where}: the payload is not a JSON object"]
    bad = []
    if stmt.get("_type") != STATEMENT_TYPE:
        bad.append(f"{where}: _type is not {STATEMENT_TYPE}")
    subjects = stmt.get("subject")
    if not isinstance(subjects, list) or not subjects:
        bad.append(f"{where}: no subject")
        subjects = []
    for i, s in enumerate(subjects):
        digest = s.get("digest") if isinstance(s, dict) else None
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(digest, dict) \
                or not _SHA256.fullmatch(str(digest.get("sha256", ""))):
            bad.append(f"{where}: subject[{i}] has no name or no sha256 digest")
    if stmt.get("predicateType") != VSA_TYPE:
        bad.append(f"{where}: predicateType is {printable(stmt.get('predicateType'))[:80]}, not {VSA_TYPE}")
    p = stmt.get("predicate")
    if not isinstance(p, dict):
        return bad + [f"{where}: no predicate"]
    if not isinstance(p.get("verifier"), dict) or not isinstance(p["verifier"].get("id"), str):
        bad.append(f"{where}: predicate.verifier.id missing")
    if not isinstance(p.get("timeVerified"), str) or not re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", p["timeVerified"]):
        bad.append(f"{where}: predicate.timeVerified is not an RFC 3339 timestamp")
    if not isinstance(p.get("resourceUri"), str):
        bad.append(f"{where}: predicate.resourceUri missing")
    pol = p.get("policy")
    if not isinstance(pol, dict) or not isinstance(pol.get("uri"), str):
        bad.append(f"{where}: predicate.policy.uri missing")
    result, levels = p.get("verificationResult"), p.get("verifiedLevels")
    if result not in ("PASSED", "FAILED"):
        bad.append(f"{where}: predicate.verificationResult is not PASSED or FAILED")
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        bad.append(f"{where}: predicate.verifiedLevels is not a list of strings")
    elif result == "FAILED" and levels != ["FAILED"] or result == "PASSED" and "FAILED" in levels:
        bad.append(f"{where}: predicate.verifiedLevels {printable(repr(levels))[:80]} contradicts "
                   f"verificationResult {result}")
    return bad


def verify_file(path: str, public, artifacts: list[str] = ()) -> Verification:
    """(1) read the envelopes, (2) check every signature under `public`, (3) check each payload is
    a VSA statement, (4) find each artifact's sha256 among the subjects."""
    from audit.signing import dsse

    out = Verification()
    envelopes = read_envelopes(path)  # (1): raises on unreadable or malformed input
    digests: set[str] = set()
    for i, env in enumerate(envelopes, 1):
        where = printable(path) if len(envelopes) == 1 else f"{printable(path)}:{i}"
        if env.payload_type != dsse.PAYLOAD_TYPE:
            out.failures.append(f"{where}: payloadType {printable(env.payload_type)[:60]} is not {dsse.PAYLOAD_TYPE}")
            out.malformed = True
            continue
        failing = env.failing(public)  # (2)
        if failing:
            out.failures.append(f"{where}: signature {', '.join(map(str, failing))} does not verify under the given key")
            continue
        try:
            stmt = json.loads(env.payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            stmt = None
        problems = check_statement(stmt, where)  # (3)
        if problems:
            out.failures.extend(problems)
            out.malformed = True
            continue
        out.statements.append(stmt)
        digests.update(s["digest"]["sha256"] for s in stmt["subject"])
    for art in artifacts:  # (4)
        digest = _hash(art) if os.path.isfile(art) else None
        if digest is None:
            raise InputError(f"cannot read artifact {printable(art)}: not a readable file")
        if out.statements and digest not in digests:
            out.failures.append(f"{printable(art)}: sha256 {digest} matches no subject of {printable(path)}")
    return out

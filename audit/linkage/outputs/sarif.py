"""SARIF 2.1.0 rendering (validated in tests against the shipped official schema).

One result per finding; waived findings carry a `suppressions` entry; files that could not be
audited are tool execution notifications and make `executionSuccessful` false.
"""

from __future__ import annotations

import hashlib
import json
import os
from urllib.parse import quote

from audit.errors import no_commands
from audit.linkage.model import WHEEL_SEP, CheckReport, Finding
from audit.linkage.judging.policy import Policy

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def artifact_uri(path: str) -> str:
    """A URI-reference for a reported path (relative stays relative, for code scanning). A file
    name that is not UTF-8 keeps its own bytes, percent-encoded."""
    outer, _, inner = path.partition(WHEEL_SEP)
    if os.path.isabs(outer):
        uri = "file://" + quote(outer, errors="surrogateescape")
    else:
        uri = quote(outer.replace(os.sep, "/"), errors="surrogateescape")
    return uri + (quote(WHEEL_SEP + inner, safe="/!", errors="surrogateescape") if inner else "")


def _level(f: Finding) -> str:
    return "error" if f.severity == "fail" else "warning"


def _fingerprint(path: str, f: Finding) -> str:
    key = "\0".join([path, f.rule, f.kind, f.subject, " -> ".join(f.chain)])
    return hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest()


def render_sarif(report: CheckReport, policy: Policy) -> str:
    rules = policy.all_rules()
    index = {r.id: i for i, r in enumerate(rules)}
    driver_rules = []
    for r in rules:
        entry = {
            "id": r.id,
            "name": r.name or r.id,
            "shortDescription": {"text": r.name or r.id},
            "fullDescription": {"text": r.reason},
            "defaultConfiguration": {"level": "error" if policy.severity(r.id) == "fail" else "warning"},
            "properties": {"family": r.family, "tags": ["sovereignty", r.family or "linkage"]},
        }
        if r.use_instead:
            entry["help"] = {"text": f"Use instead: {r.use_instead}"}
        driver_rules.append(entry)
    artifacts, art_index = [], {}
    results, notifications = [], []
    for fr in report.files:
        art_index[fr.path] = len(artifacts)
        art = {"location": {"uri": artifact_uri(fr.path)}}
        if fr.sha256:
            art["hashes"] = {"sha-256": fr.sha256}
        if fr.size is not None:
            art["length"] = fr.size
        artifacts.append(art)
        loc = {"physicalLocation": {"artifactLocation": {"uri": artifact_uri(fr.path), "index": art_index[fr.path]}}}
        if fr.error:
            notifications.append({"level": "error", "message": {"text": f"{fr.path}: {fr.error}"},
                                  "locations": [loc]})
        for f in fr.findings:
            where = json.loads(json.dumps(loc))
            if f.offset is not None:
                where["physicalLocation"]["region"] = {"byteOffset": f.offset}
            text = f"{f.rule}: {f.message}. {f.reason}"
            if f.use_instead:
                text += f" Use instead: {f.use_instead}."
            if f.exception_expired:
                text += f" (exception expired {f.exception_expired})"
            res = {
                "ruleId": f.rule, "ruleIndex": index[f.rule], "level": _level(f), "message": {"text": text},
                "locations": [where],
                "partialFingerprints": {"sovereignAudit/v1": _fingerprint(fr.path, f)},
                "properties": {"evidence": f.kind, "subject": f.subject, "where": f.where, "chain": f.chain,
                               "inFile": f.in_file, "count": f.count, "distinct": f.distinct,
                               "examples": f.examples},
            }
            if fr.layer:
                res["properties"]["layer"] = fr.layer
            if f.baseline is not None:
                res["baselineState"] = f.baseline
            if f.excepted:
                res["suppressions"] = [{"kind": "external", "status": "accepted", "justification": f.excepted}]
            results.append(res)
    for a in (report.baseline or {}).get("absent", []):  # in the baseline, no longer found
        res = {"ruleId": a["rule"], "level": "note", "baselineState": "absent",
               "message": {"text": f"{a['rule']}: {a['kind']} {a['subject']} no longer found"},
               "locations": [{"physicalLocation": {"artifactLocation": {"uri": artifact_uri(a["path"])}}}],
               "properties": {"evidence": a["kind"], "subject": a["subject"]}}
        if a["rule"] in index:
            res["ruleIndex"] = index[a["rule"]]
        results.append(res)
    for e in report.errors:
        notifications.append({"level": "error", "message": {"text": e}})
    for w in report.warnings:
        notifications.append({"level": "warning", "message": {"text": w}})
    run = {
        "tool": {"driver": {"name": "sovereign-audit", "version": report.tool_version,
                            "semanticVersion": report.tool_version, "rules": driver_rules}},
        "invocations": [{"executionSuccessful": report.exit_code in (0, 1), "exitCode": report.exit_code,
                         "toolExecutionNotifications": notifications}],
        "artifacts": artifacts,
        "results": results,
        "properties": {"policy": report.policy, "summary": report.summary},
    }
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    # as render_json: exact strings, and `##[` in one written `##\u005b` for the CI log
    return no_commands(json.dumps(doc, indent=2, ensure_ascii=True) + "\n", "\\u003a", "\\u005b")

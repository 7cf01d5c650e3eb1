"""ro-crate-metadata.json of a real run, checked by roc-validator (the RO-Crate project's own validator,
run offline) and against the RO-Crate 1.2 and Process Run Crate 0.5 rules restated here independently."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from test_report_fixtures import load, require_cpu_run

pytestmark = pytest.mark.slow

PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
OBJECT_TYPES = {"MediaObject", "Dataset", "Collection", "CreativeWork", "PropertyValue", "File"}


def ids(v) -> list[str]:
    v = v if isinstance(v, list) else [v]
    return [x["@id"] for x in v if isinstance(x, dict)]


def types(ent) -> set[str]:
    t = ent.get("@type")
    return set(t if isinstance(t, list) else [t])


def iso(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def crate():
    bundle = require_cpu_run()
    data = load(bundle / "ro-crate-metadata.json")
    graph = {e["@id"]: e for e in data["@graph"]}
    assert len(graph) == len(data["@graph"]), "duplicate @id"
    return bundle, data, graph


def test_metadata_descriptor_and_root(crate):
    _, data, graph = crate
    assert data["@context"] == "https://w3id.org/ro/crate/1.2/context"
    desc = graph["ro-crate-metadata.json"]
    assert "CreativeWork" in types(desc)
    assert ids(desc["conformsTo"]) == ["https://w3id.org/ro/crate/1.2"]
    assert ids(desc["about"]) == ["./"]
    root = graph["./"]
    assert "Dataset" in types(root)
    for key in ("name", "description", "datePublished", "license"):
        assert root.get(key), key
    iso(root["datePublished"])
    assert ids(root["license"])[0] in graph


def test_root_conforms_to_the_process_run_crate_profile(crate):
    _, _, graph = crate
    assert PROFILE in ids(graph["./"]["conformsTo"])
    # RO-Crate 1.2: a profile's contextual entity MUST include Profile, SHOULD include CreativeWork
    assert types(graph[PROFILE]) == {"CreativeWork", "Profile"} and graph[PROFILE]["name"]
    publisher = graph[ids(graph["./"]["publisher"])[0]]
    assert types(publisher) & {"Person", "Organization"} and publisher["name"]


def test_one_create_action_per_stage_with_instrument_times_and_status(crate):
    bundle, _, graph = crate
    run = load(bundle / "evidence" / "run.json")
    actions = [e for e in graph.values() if "CreateAction" in types(e)]
    assert sorted(a["name"] for a in actions) == sorted(f"sovereign-audit {s['name']}" for s in run["stages"])
    mentioned = set(ids(graph["./"]["mentions"]))
    stages = {f"sovereign-audit {s['name']}": s for s in run["stages"]}
    for a in actions:
        s = stages[a["name"]]
        assert a["@id"] in mentioned
        assert a.get("description")
        tool = graph[ids(a["instrument"])[0]]
        assert "SoftwareApplication" in types(tool) and tool.get("name")
        assert ("version" in tool) != ("softwareVersion" in tool)
        assert tool["@id"].startswith("https://")
        assert iso(a["startTime"]) <= iso(a["endTime"])
        assert iso(a["startTime"]) == iso(s["started"]) and iso(a["endTime"]) == iso(s["ended"])
        status = ids(a["actionStatus"])[0]
        assert status in ("http://schema.org/CompletedActionStatus", "http://schema.org/FailedActionStatus")
        assert "ActionStatusType" in types(graph[status]) and graph[status]["name"]  # described, not dangling
        assert ("error" in a) == (status.endswith("FailedActionStatus"))
        agent = graph[ids(a["agent"])[0]]
        assert types(agent) & {"Person", "Organization"}
        for ref in ids(a.get("object", [])) + ids(a.get("result", [])):
            assert ref in graph and types(graph[ref]) & OBJECT_TYPES, ref
    by_name = {a["name"]: a for a in actions}
    assert "evidence/parity.json" in ids(by_name["sovereign-audit parity"]["result"])
    assert "artifacts/cpu/libflash_kernel.so" in ids(by_name["sovereign-audit build"]["result"])
    assert "artifacts/cpu/libflash_kernel.so" in ids(by_name["sovereign-audit linkage"]["object"])


def test_every_data_entity_exists_and_every_file_is_described(crate):
    bundle, _, graph = crate
    parts = set(ids(graph["./"]["hasPart"]))
    for ref in parts:
        assert (bundle / ref).is_file(), ref
        assert "File" in types(graph[ref])
        # the crate's fixity against the file itself, read here
        data = (bundle / ref).read_bytes()
        assert graph[ref]["contentSize"] == str(len(data)), ref
        assert graph[ref]["sha256"] == hashlib.sha256(data).hexdigest(), ref
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    # the crate itself, and the signature pair written after it (they sign it, so it cannot list them)
    assert on_disk - parts == {"ro-crate-metadata.json", "manifest.json", "manifest.dsse.json"}
    assert "public.pem" in parts
    so = graph["artifacts/cpu/libflash_kernel.so"]
    build = load(bundle / "evidence" / "build.json")
    assert so["sha256"] == [t for t in build["targets"] if t["target"] == "cpu"][0]["sha256"]


def test_no_singleton_arrays(crate):
    """RO-Crate 1.2 (compact JSON-LD): a property with one value holds the value, not [value]."""
    _, data, _ = crate
    for ent in data["@graph"]:
        for prop, value in ent.items():
            assert not (isinstance(value, list) and len(value) == 1), (ent["@id"], prop)


# --------------------------------------------------------------------------------------------
# roc-validator, offline (tests/rocrate_offline.py serves the JSON-LD context from tests/fixtures/jsonld)

# Process Run Crate 0.5 predates RO-Crate 1.2, so roc-validator checks it on top of its RO-Crate 1.1
# profile. These of its REQUIRED checks only restate RO-Crate 1.1, which a 1.2 crate cannot meet:
RESTATES_1_1 = {
    "ro-crate-1.1_5.3": "the metadata descriptor's conformsTo must be https://w3id.org/ro/crate/1.1; ours is "
                        "1.2 (checked by the ro-crate-1.2 run)",
}
# RECOMMENDED checks the crate does not meet, each for a reason:
ACCEPTED = {
    "ro-crate-1.2_91.0": "a Person SHOULD have an ORCID @id: the operator of a run is not identified",
    "ro-crate-1.2_93.0": "the publisher SHOULD have a contactPoint: the operator of a run is not identified",
    "process-run-crate-0.5_8.7": "roc-validator wants actionStatus as a string; RO-Crate 1.2 (provenance "
                                 "section) writes it as a reference {\"@id\": ...}, which we follow",
    "ro-crate-1.1_22.2": "RO-Crate 1.1 asks for an author; 1.2 does not, and the only author of a run's "
                         "evidence is its unidentified operator",
    "ro-crate-1.1_22.3": "RO-Crate 1.1 wants an Organization as publisher; 1.2 allows the Person we name",
}
JOBS = [{"profile": "ro-crate-1.2", "severity": "REQUIRED"},
        {"profile": "ro-crate-1.2", "severity": "RECOMMENDED"},
        {"profile": "process-run-crate-0.5", "severity": "REQUIRED", "skip": sorted(RESTATES_1_1)},
        {"profile": "process-run-crate-0.5", "severity": "RECOMMENDED"}]


@pytest.fixture(scope="module")
def validated(crate):
    bundle = crate[0]
    helper = Path(__file__).with_name("rocrate_offline.py")
    p = subprocess.run([sys.executable, str(helper), str(bundle), json.dumps(JOBS)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out, {(r["profile"], r["severity"]): r for r in out["results"]}


def _ids(result) -> set[str]:
    return {i["check"] for i in result["issues"]}


def test_roc_validator_ran_offline_on_the_shipped_context(validated):
    out, _ = validated
    assert out["asked"] == ["https://w3id.org/ro/crate/1.2/context"]  # every request was served


def test_roc_validator_ro_crate_1_2_required(validated):
    r = validated[1]["ro-crate-1.2", "REQUIRED"]
    assert r["passed"] and r["issues"] == [], r["issues"]


def test_roc_validator_process_run_crate_required(validated):
    r = validated[1]["process-run-crate-0.5", "REQUIRED"]
    assert r["passed"] and r["issues"] == [], r["issues"]
    # the skipped checks are needed, and are the only REQUIRED ones that fail without the skip
    full = validated[1]["process-run-crate-0.5", "RECOMMENDED"]
    assert {i["check"] for i in full["issues"] if i["severity"] == "REQUIRED"} == set(RESTATES_1_1)


@pytest.mark.parametrize("profile", ["ro-crate-1.2", "process-run-crate-0.5"])
def test_roc_validator_recommended_only_the_accepted(validated, profile):
    r = validated[1][profile, "RECOMMENDED"]
    left = _ids(r) - set(ACCEPTED) - set(RESTATES_1_1)
    assert not left, [i for i in r["issues"] if i["check"] in left]

"""ro-crate-metadata.json: RO-Crate 1.2 with the Process Run Crate profile (0.5).

One CreateAction per stage of the run, each with its instrument (the sovereign-audit command, a
SoftwareApplication), object (its inputs), result (its evidence file), startTime/endTime and
actionStatus; the root Dataset conformsTo the profile and mentions every action.
"""

from __future__ import annotations

import mimetypes
from datetime import datetime, timezone
from pathlib import Path

from audit import __version__
from audit.files import write_json_atomic
from audit.report.layout import EVIDENCE_FILES

CONTEXT = "https://w3id.org/ro/crate/1.2/context"
CRATE_SPEC = "https://w3id.org/ro/crate/1.2"
PROCESS_PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
TOOL_ID = "https://pypi.org/project/sovereign-audit/"  # absolute URI, as the profile recommends
LICENSE = "https://spdx.org/licenses/Apache-2.0"
STAGE_ABOUT = {
    "environment": "Capture the hardware, drivers and software versions",
    "build": "Build the flash-attention kernel library per target",
    "linkage": "Audit linkage: DT_NEEDED, transitive, versioned imports, symbols, dlopen strings, device code",
    "parity": "Check the flash forward against a float64 reference and our naive path",
    "bench": "Time the op against our naive path, torch eager and (GPU) the vendor SDPA backends",
    "pipeline": "Run the DiT pipeline end to end with naive and flash self-attention",
    "report": "Render the research-object report from the evidence",
}


def _file(path: str, name: str, about: str = "", sha256: str | None = None, size: int | None = None,
          fmt: str | None = None) -> dict:
    ent = {"@id": path, "@type": "File", "name": name}
    if about:
        ent["description"] = about
    ent["encodingFormat"] = fmt or mimetypes.guess_type(path)[0] or "application/octet-stream"
    if sha256:
        ent["sha256"] = sha256
    if size is not None:
        ent["contentSize"] = str(size)
    return ent


def build_crate(evidence: dict, artifacts=(), attestations=(), signing=None, extra_files=()) -> dict:
    run = evidence.get("run") or {}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    graph: list[dict] = []
    parts: list[dict] = []
    files: dict[str, dict] = {}

    def add_file(ent: dict) -> None:
        if ent["@id"] not in files:
            files[ent["@id"]] = ent
            parts.append({"@id": ent["@id"]})

    add_file(_file("report.html", "The research-object report", "One self-contained HTML file", fmt="text/html"))
    for stem in sorted(evidence):
        add_file(_file(f"evidence/{stem}.json", f"{stem} evidence",
                       f"schema {evidence[stem].get('schema', 'not recorded')}", fmt="application/json"))
    for a in artifacts:
        add_file(_file(a.path, Path(a.path).name, f"{a.kind} object {a.label}", a.sha256, a.size,
                       "application/x-sharedlib"))
        if a.provenance:
            add_file(_file(a.provenance, "provenance.json", f"build provenance of {a.label}",
                           fmt="application/json"))
    for name in attestations:
        add_file(_file(name, Path(name).name, "DSSE envelope of an in-toto Statement v1",
                       fmt="application/json"))
    for name in extra_files:
        add_file(_file(name, name, {"manifest.json": "every file's sha256 and size (written last)",
                                    "manifest.dsse.json": "DSSE envelope signing the manifest",
                                    "public.pem": "Ed25519 public key (SubjectPublicKeyInfo PEM)"}.get(name, ""),
                       fmt="application/json" if name.endswith(".json") else "application/x-pem-file"))

    tool = {"@id": TOOL_ID, "@type": "SoftwareApplication", "name": "sovereign-audit",
            "version": str((run.get("tool") or {}).get("version") or __version__),
            "url": TOOL_ID, "description": "Proves a GPU kernel build is sovereign and its performance claim holds"}
    agent = {"@id": "#operator", "@type": "Person", "name": "the operator of this run (not identified)"}
    actions = []
    for s in run.get("stages") or []:
        if not isinstance(s, dict) or not s.get("name"):
            continue
        name = str(s["name"])
        aid = f"#stage-{name}"
        act = {"@id": aid, "@type": "CreateAction", "name": f"sovereign-audit {name}",
               "description": STAGE_ABOUT.get(name, name), "instrument": {"@id": TOOL_ID},
               "agent": {"@id": agent["@id"]}}
        if s.get("started"):
            act["startTime"] = s["started"]
        if s.get("ended"):
            act["endTime"] = s["ended"]
        status = s.get("status")
        if status == "ok":
            act["actionStatus"] = {"@id": "http://schema.org/CompletedActionStatus"}
        elif status == "failed":
            act["actionStatus"] = {"@id": "http://schema.org/FailedActionStatus"}
            act["error"] = str(s.get("reason") or "failed")
        elif status == "skipped":
            act["description"] += f" (skipped: {s.get('reason') or 'no reason recorded'})"
        result = s.get("evidence")
        if isinstance(result, str) and result in files:
            act["result"] = [{"@id": result}]
            if name == "build":
                act["result"] += [{"@id": a.path} for a in artifacts if a.kind == "target"]
        obj = _inputs(name, artifacts, files)
        if obj:
            act["object"] = obj
        actions.append(act)

    root = {"@id": "./", "@type": "Dataset",
            "name": "sovereign-audit research object",
            "description": "Evidence that a hand-written flash-attention kernel build is sovereign and "
                           "that its performance claim holds, with the report generated from it.",
            "datePublished": now, "license": {"@id": LICENSE},
            "conformsTo": {"@id": PROCESS_PROFILE}, "hasPart": parts,
            "mentions": [{"@id": a["@id"]} for a in actions]}
    graph = [{"@id": "ro-crate-metadata.json", "@type": "CreativeWork", "conformsTo": {"@id": CRATE_SPEC},
              "about": {"@id": "./"}},
             root,
             {"@id": PROCESS_PROFILE, "@type": "CreativeWork", "name": "Process Run Crate", "version": "0.5"},
             {"@id": LICENSE, "@type": "CreativeWork", "name": "Apache License 2.0"},
             tool, agent, *files.values(), *actions]
    return {"@context": CONTEXT, "@graph": graph}


def _inputs(stage: str, artifacts, files: dict) -> list[dict]:
    """What each stage consumed, as far as the bundle holds it."""
    ev = lambda s: f"evidence/{EVIDENCE_FILES[s]}"  # noqa: E731
    objs: list[str] = []
    if stage == "linkage" or stage in ("parity", "bench"):
        objs += [a.path for a in artifacts]
    if stage == "pipeline":
        objs += [a.path for a in artifacts if a.kind == "target"]
    if stage == "report":
        objs += [ev(s) for s in EVIDENCE_FILES]
    return [{"@id": o} for o in objs if o in files]


def write_crate(out: Path, evidence: dict, artifacts=(), attestations=(), signing=None,
                manifest_names=()) -> Path:
    crate = build_crate(evidence, artifacts, attestations, signing, manifest_names)
    return write_json_atomic(out / "ro-crate-metadata.json", crate)

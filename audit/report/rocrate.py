"""ro-crate-metadata.json: RO-Crate 1.2 with the Process Run Crate profile (0.5).

One CreateAction per stage of the run, each with its instrument (the sovereign-audit command, a
SoftwareApplication), object (its inputs), result (its evidence file), startTime/endTime and
actionStatus; the root Dataset conformsTo the profile (a contextual entity typed Profile, as
RO-Crate 1.2 requires) and mentions every action. Every File carries its contentSize and sha256,
read from the bundle when the crate is written; so the crate describes every file already in the
bundle then, and not manifest.json / manifest.dsse.json: they are written after it, to sign it.
A property with one value is written as that value, not as a one-element array (RO-Crate's
compact form). Times are ISO 8601 with milliseconds and a numeric offset, which both RO-Crate
and the Process Run Crate profile accept.
"""

from __future__ import annotations

import mimetypes
from datetime import datetime, timezone
from pathlib import Path

from audit import __version__
from audit.errors import InputError
from audit.files import sha256_file, write_json_atomic
from audit.report.layout import EVIDENCE_FILES

CONTEXT = "https://w3id.org/ro/crate/1.2/context"
CRATE_SPEC = "https://w3id.org/ro/crate/1.2"
PROCESS_PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
TOOL_ID = "https://pypi.org/project/sovereign-audit/"  # absolute URI, as the profile recommends
LICENSE = "https://spdx.org/licenses/Apache-2.0"
OPERATOR = "#operator"
COMPLETED = "http://schema.org/CompletedActionStatus"
FAILED = "http://schema.org/FailedActionStatus"
STAGE_ABOUT = {
    "environment": "Capture the hardware, drivers and software versions",
    "build": "Build the flash-attention kernel library per target",
    "linkage": "Audit linkage: DT_NEEDED, transitive, versioned imports, symbols, dlopen strings, device code",
    "parity": "Check the flash forward against a float64 reference and our naive path",
    "bench": "Time the op against our naive path, torch eager and (GPU) the vendor SDPA backends",
    "pipeline": "Run the DiT pipeline end to end once per attention core (stock SDPA-cuDNN as the "
                "reference on a GPU, our naive path on a CPU), swapped into its attention",
    "report": "Render the research-object report from the evidence",
}
SIGNED_AFTER = frozenset({"manifest.json", "manifest.dsse.json"})  # written after the crate, to sign it
SIGNING_FILES = {"public.pem": "Ed25519 public key (SubjectPublicKeyInfo PEM) that verifies the signatures"}


def refs(ids) -> dict | list[dict]:
    """JSON-LD references to `ids`: one reference object, or a list when there are several."""
    out = [{"@id": i} for i in ids]
    return out[0] if len(out) == 1 else out


def iso_time(ts) -> str | None:
    """`ts` (ISO 8601, "Z" or an offset) as YYYY-MM-DDTHH:MM:SS.mmm+HH:MM; None when unparsable."""
    if not isinstance(ts, str):
        return None
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.isoformat(timespec="milliseconds")


def _file(root: Path, path: str, name: str, about: str = "", fmt: str | None = None) -> dict:
    full = root / path
    if full.is_symlink() or not full.is_file():  # the bundle's own files, just written: regular files
        raise InputError(f"bundle {root!s}: {path}: not a regular file; cannot describe it in the RO-Crate")
    size, sha256 = full.stat().st_size, sha256_file(full)
    ent = {"@id": path, "@type": "File", "name": name}
    if about:
        ent["description"] = about
    ent["encodingFormat"] = fmt or mimetypes.guess_type(path)[0] or "application/octet-stream"
    ent["contentSize"] = str(size)
    ent["sha256"] = sha256
    return ent


def build_crate(root: Path, evidence: dict, artifacts=(), attestations=(), extra_files=()) -> dict:
    """The crate of the bundle in `root`; every File named here must already be in it."""
    root = Path(root)
    run = evidence.get("run") or {}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    files: dict[str, dict] = {}

    def add_file(path: str, name: str, about: str = "", fmt: str | None = None) -> None:
        if path not in files:
            files[path] = _file(root, path, name, about, fmt)

    add_file("report.html", "The research-object report", "One self-contained HTML file", fmt="text/html")
    for stem in sorted(evidence):
        add_file(f"evidence/{stem}.json", f"{stem} evidence",
                 f"schema {evidence[stem].get('schema', 'not recorded')}", fmt="application/json")
    for a in artifacts:
        add_file(a.path, Path(a.path).name, f"{a.kind} object {a.label}", "application/x-sharedlib")
        if a.provenance:
            add_file(a.provenance, "provenance.json", f"build provenance of {a.label}", fmt="application/json")
    for name in attestations:
        add_file(name, Path(name).name, "DSSE envelope of an in-toto Statement v1", fmt="application/json")
    for name in extra_files:
        if name in SIGNED_AFTER:  # the crate cannot describe what signs it
            continue
        add_file(name, name, SIGNING_FILES.get(name, ""),
                 fmt="application/json" if name.endswith(".json") else "application/x-pem-file")

    tool = {"@id": TOOL_ID, "@type": "SoftwareApplication", "name": "sovereign-audit",
            "version": str((run.get("tool") or {}).get("version") or __version__),
            "url": TOOL_ID, "description": "Proves a GPU kernel build is sovereign and its performance claim holds"}
    agent = {"@id": OPERATOR, "@type": "Person", "name": "the operator of this run (not identified)",
             "description": "whoever ran sovereign-audit and published this bundle; the bundle does not say who"}
    actions, statuses = [], set()
    for s in run.get("stages") or []:
        if not isinstance(s, dict) or not s.get("name"):
            continue
        name = str(s["name"])
        act = {"@id": f"#stage-{name}", "@type": "CreateAction", "name": f"sovereign-audit {name}",
               "description": STAGE_ABOUT.get(name, name), "instrument": {"@id": TOOL_ID},
               "agent": {"@id": OPERATOR}}
        for ours, theirs in (("startTime", "started"), ("endTime", "ended")):
            t = iso_time(s.get(theirs))
            if t:
                act[ours] = t
        status = s.get("status")
        if status == "ok":
            act["actionStatus"] = {"@id": COMPLETED}
            statuses.add(COMPLETED)
        elif status == "failed":
            act["actionStatus"] = {"@id": FAILED}
            statuses.add(FAILED)
            act["error"] = str(s.get("reason") or "failed")
        elif status == "skipped":
            act["description"] += f" (skipped: {s.get('reason') or 'no reason recorded'})"
        result = s.get("evidence")
        if isinstance(result, str) and result in files:
            results = [result]
            if name == "build":
                results += [a.path for a in artifacts if a.kind == "target"]
            act["result"] = refs(results)
        obj = _inputs(name, artifacts, files)
        if obj:
            act["object"] = refs(obj)
        actions.append(act)

    root_entity = {"@id": "./", "@type": "Dataset",
                   "name": "sovereign-audit research object",
                   "description": "Evidence that a hand-written flash-attention kernel build is sovereign and "
                                  "that its performance claim holds, with the report generated from it.",
                   "datePublished": now, "license": {"@id": LICENSE}, "publisher": {"@id": OPERATOR},
                   "conformsTo": {"@id": PROCESS_PROFILE}, "hasPart": refs(files)}
    if actions:
        root_entity["mentions"] = refs(a["@id"] for a in actions)
    status_entities = [{"@id": sid, "@type": "ActionStatusType", "name": sid.rsplit("/", 1)[1],
                        "description": "schema.org status of a finished action"}
                       for sid in sorted(statuses)]
    graph = [{"@id": "ro-crate-metadata.json", "@type": "CreativeWork", "conformsTo": {"@id": CRATE_SPEC},
              "about": {"@id": "./"}},
             root_entity,
             {"@id": PROCESS_PROFILE, "@type": ["CreativeWork", "Profile"], "name": "Process Run Crate",
              "version": "0.5"},
             {"@id": LICENSE, "@type": "CreativeWork", "name": "Apache License 2.0",
              "description": "Apache License, Version 2.0 (SPDX identifier Apache-2.0)"},
             tool, agent, *files.values(), *actions, *status_entities]
    return {"@context": CONTEXT, "@graph": graph}


def _inputs(stage: str, artifacts, files: dict) -> list[str]:
    """What each stage consumed, as far as the bundle holds it."""
    ev = lambda s: f"evidence/{EVIDENCE_FILES[s]}"  # noqa: E731
    objs: list[str] = []
    if stage == "linkage" or stage in ("parity", "bench"):
        objs += [a.path for a in artifacts]
    if stage == "pipeline":
        objs += [a.path for a in artifacts if a.kind == "target"]
    if stage == "report":
        objs += [ev(s) for s in EVIDENCE_FILES]
    return [o for o in objs if o in files]


def write_crate(out: Path, evidence: dict, artifacts=(), attestations=(), signing=None,
                manifest_names=()) -> Path:
    crate = build_crate(out, evidence, artifacts, attestations, manifest_names)
    return write_json_atomic(out / "ro-crate-metadata.json", crate)

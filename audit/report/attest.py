"""in-toto attestations of a bundle, each a DSSE envelope under attestations/.

  attestations/build.provenance.dsse.json  SLSA Provenance v1 for artifacts/<target>/*.so (built by us;
                                           artifacts/user/ holds --artifact objects: audited, not built)
  attestations/parity.test-result.dsse.json   in-toto Test Result v0.1 for parity
  attestations/linkage.test-result.dsse.json  in-toto Test Result v0.1 for the linkage policy check
  attestations/performance.dsse.json       our predicate (PERFORMANCE_PREDICATE) for bench + pipeline

Subjects are bundle-relative POSIX names with sha256 digests of the bundle's own files, so the bundle
checks itself offline. Evidence files are read as written by their stages; the fields read here are
looked up tolerantly (a missing field becomes "not recorded", never a guess) because the stages own
their schemas. An evidence file that is missing just means its attestation is not written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from audit import __version__
from audit.errors import InputError
from audit.signing import dsse
from audit.report.manifest import UnsafePath, hash_member, read_member, statement, subject, walk_bundle

SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
PERFORMANCE_PREDICATE = "https://sovereign-audit.dev/performance/v1"
BUILD_TYPE = "https://sovereign-audit.dev/build/flash_kernel/v1"
BUILDER_ID = f"https://sovereign-audit.dev/builder/sovereign-audit@{__version__}"
EVIDENCE = ("build", "linkage", "parity", "bench", "pipeline", "environment")
ATTESTATIONS_DIR = "attestations"
NOT_RECORDED = "not recorded"
ATTESTATION_NAMES = ("build.provenance.dsse.json", "parity.test-result.dsse.json",
                     "linkage.test-result.dsse.json", "performance.dsse.json")
CLAIM_WORDS = frozenset({"speedup", "ratio", "tflops", "amdahl"})


def _load_evidence(bundle_dir: Path, stage: str) -> tuple[dict | None, str | None]:
    """(parsed JSON, sha256) of evidence/<stage>.json, or (None, None) when absent."""
    name = f"evidence/{stage}.json"
    try:
        data = read_member(bundle_dir, name)
    except UnsafePath as exc:
        if str(exc).startswith("missing"):
            return None, None
        raise InputError(f"bundle {bundle_dir!s}: {name}: {exc}") from None
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"bundle {bundle_dir!s}: {name}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError(f"bundle {bundle_dir!s}: {name}: not a JSON object")
    return obj, hash_member(bundle_dir, name)[0]


def _first(d, *keys, default=None):
    """The first of `keys` present in dict `d` (evidence schemas are owned by other stages)."""
    if isinstance(d, dict):
        for k in keys:
            if k in d and d[k] is not None:
                return d[k]
    return default


USER_ARTIFACTS = "user"  # artifacts/user/: the user's --artifact objects (audited, not built by us)


def _artifacts(bundle_dir: Path) -> dict[str, list[str]]:
    """{target: [bundle names]}: artifacts/<target>/*.so we built, and artifacts/user/* (any name)."""
    files, _ = walk_bundle(bundle_dir)
    out: dict[str, list[str]] = {}
    for name in files:
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "artifacts":
            continue
        if parts[1] == USER_ARTIFACTS or parts[2].endswith(".so") or ".so." in parts[2]:
            if parts[2] != "provenance.json":
                out.setdefault(parts[1], []).append(name)
    return out


def _subjects(bundle_dir: Path, names) -> list[dict]:
    out = []
    for name in sorted(set(names)):
        try:
            out.append(subject(name, hash_member(bundle_dir, name)[0]))
        except UnsafePath as exc:
            raise InputError(f"bundle {bundle_dir!s}: {name}: {exc}") from None
    return out


def _target_entries(build: dict | None) -> dict[str, dict]:
    """build.json's per-target records keyed by target name (a list or a dict of them)."""
    targets = _first(build or {}, "targets", "results", default=[])
    out = {}
    if isinstance(targets, dict):
        targets = [dict(v, target=k) if isinstance(v, dict) else {"target": k} for k, v in targets.items()]
    if isinstance(targets, list):
        for t in targets:
            if isinstance(t, dict) and isinstance(t.get("target"), str):
                out[t["target"]] = t
    return out


def _target_provenance(bundle_dir: Path, target: str, entry: dict) -> dict:
    """The per-target provenance: artifacts/<target>/provenance.json if copied, else build.json's record."""
    try:
        obj = json.loads(read_member(bundle_dir, f"artifacts/{target}/provenance.json"))
        if isinstance(obj, dict):
            return obj
    except (UnsafePath, ValueError, UnicodeDecodeError, RecursionError):
        pass
    prov = entry.get("provenance")
    return prov if isinstance(prov, dict) else entry


def _source_dependencies(prov: dict) -> list[dict]:
    """SLSA ResourceDescriptors for the source files: each with its sha256 as recorded by the build."""
    sources = _first(prov, "sources", "source_digests", "inputs", default=[])
    out = []
    if isinstance(sources, dict):  # {path: sha256} or {path: {"sha256": ...}}
        sources = [{"path": k, "sha256": v if isinstance(v, str) else _first(v, "sha256")}
                   for k, v in sources.items()]
    if isinstance(sources, list):
        for s in sources:
            if not isinstance(s, dict):
                continue
            name = _first(s, "path", "name", "file", "uri")
            digest = _first(s, "sha256") or _first(_first(s, "digest", default={}), "sha256")
            if isinstance(name, str) and isinstance(digest, str):
                out.append({"name": name, "digest": {"sha256": digest}})
    return out


def _toolchain_dependency(compiler) -> dict | None:
    """The compiler as a ResourceDescriptor (uri = its path; version and Debian packages annotated)."""
    if not isinstance(compiler, dict) or not isinstance(compiler.get("path"), str):
        return None
    ann = {k: compiler[k] for k in ("name", "version", "details", "packages") if compiler.get(k)}
    return {"name": str(compiler.get("name", compiler["path"])), "uri": "file://" + compiler["path"],
            "annotations": ann}


def slsa_provenance(bundle_dir: Path, build: dict | None, build_sha: str | None,
                    artifacts: dict[str, list[str]]) -> dict:
    """SLSA Provenance v1 for the built objects, from build.json and each target's provenance.json."""
    entries = _target_entries(build)
    internal, deps, seen = {}, [], set()

    def add_dep(d):
        key = json.dumps(d, sort_keys=True)
        if d and key not in seen:
            seen.add(key)
            deps.append(d)

    for target in sorted(artifacts):
        prov = _target_provenance(bundle_dir, target, entries.get(target, {}))
        internal[target] = {
            "kind": _first(prov, "kind", default=NOT_RECORDED),
            "command": _first(prov, "command", "commands", "command_lines", default=NOT_RECORDED),
            "cwd": _first(prov, "cwd", default=NOT_RECORDED),
            "env": _first(prov, "env", default=NOT_RECORDED),
            "flags": _first(prov, "flags", "cflags", default=NOT_RECORDED),
            "toolchain": _first(prov, "compiler", "toolchain", "versions", default=NOT_RECORDED),
            "sources_method": _first(prov, "sources_method", default=NOT_RECORDED),
            "expected_flash_path": _first(prov, "expected_flash_path", default=NOT_RECORDED),
            "host": _first(prov, "host", default=NOT_RECORDED),
        }
        git = prov.get("git")
        if isinstance(git, dict) and isinstance(git.get("commit"), str):
            add_dep({"name": "sovereign-audit checkout", "digest": {"gitCommit": git["commit"]},
                     "annotations": {"flash_kernel_dirty": git.get("flash_kernel_dirty")}})
        for d in _source_dependencies(prov):
            add_dep(d)
        add_dep(_toolchain_dependency(prov.get("compiler")))
    byproducts = [{"name": "evidence/build.json", "digest": {"sha256": build_sha}}] if build_sha else []
    for target in sorted(artifacts):
        try:
            byproducts.append(subject(f"artifacts/{target}/provenance.json",
                                      hash_member(bundle_dir, f"artifacts/{target}/provenance.json")[0]))
        except UnsafePath:
            pass
    metadata = {}
    for ours, theirs in (("startedOn", ("started_at", "started", "startedOn")),
                         ("finishedOn", ("finished_at", "finished", "finishedOn"))):
        v = _first(build or {}, *theirs)
        if isinstance(v, str):
            metadata[ours] = v
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"targets": sorted(artifacts),
                                   "requested": _first(build or {}, "requested", default=NOT_RECORDED)},
            "internalParameters": internal,
            "resolvedDependencies": deps,
        },
        "runDetails": {"builder": {"id": BUILDER_ID,
                                   "version": {"sovereign-audit": _first(build or {}, "tool_version",
                                                                         default=__version__)}},
                       "metadata": metadata, "byproducts": byproducts},
    }
    names = [n for t in sorted(artifacts) for n in artifacts[t]]
    return statement(_subjects(bundle_dir, names), SLSA_PROVENANCE, predicate)


def _verdict(obj: dict) -> bool | None:
    """True passed, False failed, None when the evidence states no verdict."""
    for k in ("passed", "ok", "pass"):
        v = obj.get(k)
        if isinstance(v, bool):
            return v
    v = _first(obj, "status", "verdict", "result")
    if isinstance(v, str):
        v = v.lower()
        if v in ("passed", "pass", "ok", "clean", "sovereign"):
            return True
        if v in ("failed", "fail", "violation", "violations", "error", "not sovereign"):
            return False
    code = obj.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code == 0
    return None


def _bundle_name(value: str, sha, names: dict[str, str]) -> str:
    """A case's file as the bundle names it (matched by sha256), never an absolute path of the machine
    that ran the stage: an unmatched absolute path keeps only its file name."""
    if isinstance(sha, str) and sha.lower() in names:
        return names[sha.lower()]
    return PurePosixPath(value).name if value.startswith("/") else value


def _case_name(case: dict, i: int, names: dict[str, str]) -> str:
    parts = []
    for k in ("candidate", "backend", "name", "path", "object", "shape", "dtype"):
        v = case.get(k)
        if isinstance(v, dict) and isinstance(v.get("label"), str):  # bench/parity Shape.to_dict()
            parts.append(v["label"])
        elif isinstance(v, list):
            parts.append("x".join(str(x) for x in v))
        elif k in ("path", "object") and isinstance(v, str):
            parts.append(_bundle_name(v, case.get("sha256"), names))
        elif v is not None and not isinstance(v, dict):
            parts.append(str(v))
    return " ".join(parts) or f"case {i}"


def _cases(obj: dict, keys, names: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    passed, failed, unknown = [], [], []
    cases = _first(obj, *keys, default=[])
    if isinstance(cases, dict):
        cases = [dict(v, name=k) if isinstance(v, dict) else {"name": k, "passed": v} for k, v in cases.items()]
    if not isinstance(cases, list):
        return passed, failed, unknown
    for i, c in enumerate(cases):
        if not isinstance(c, dict):
            continue
        name = _case_name(c, i, names)
        v = _verdict(c)
        (passed if v is True else failed if v is False else unknown).append(name)
    return passed, failed, unknown


def result_statement(evidence_name: str, obj: dict, sha: str, extra_subjects: list[dict],
                     case_keys, configuration: list[dict]) -> dict:
    """An in-toto Test Result; a test that names a file names it as `extra_subjects` do (bundle names)."""
    names = {s["digest"]["sha256"]: s["name"] for s in extra_subjects}
    passed, failed, unknown = _cases(obj, case_keys, names)
    verdict = _verdict(obj)
    if verdict is None and (passed or failed):
        verdict = not failed and not unknown
    result = "PASSED" if verdict is True else "FAILED" if verdict is False else "WARNED"
    predicate = {"result": result, "configuration": configuration, "passedTests": passed,
                 "failedTests": failed}
    if unknown:
        predicate["warnedTests"] = unknown
    if verdict is None:
        predicate["note"] = f"{evidence_name} states no overall verdict"
    return statement([subject(evidence_name, sha)] + extra_subjects, TEST_RESULT, predicate)


def _find_claims(obj, path="", out=None, depth=0):
    """Every numeric field named like a speedup/ratio/TFLOP figure, with its JSON path (bounded)."""
    out = [] if out is None else out
    if depth > 8 or len(out) >= 200:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            words = set(re.split(r"[^a-z0-9]+", str(k).lower()))  # whole words: "calibration" is no ratio
            if isinstance(v, (int, float)) and not isinstance(v, bool) and words & CLAIM_WORDS:
                out.append({"path": p, "value": v})
            else:
                _find_claims(v, p, out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _find_claims(v, f"{path}[{i}]", out, depth + 1)
    return out


def _bench_figures(bench: dict) -> dict:
    """Speedups (ratio of medians, bootstrap CI) and per-backend medians, per shape, as bench.json has them."""
    speedups, backends = [], []
    for sh in bench.get("shapes", []) if isinstance(bench.get("shapes"), list) else []:
        if not isinstance(sh, dict):
            continue
        label = _first(sh.get("shape"), "label", default=NOT_RECORDED)
        for sp in sh.get("speedups", []) or []:
            if isinstance(sp, dict):
                speedups.append({"shape": label, **{k: sp.get(k) for k in
                                 ("subject", "baseline", "ratio", "ci_low", "ci_high", "confidence")}})
        for be in sh.get("backends", []) or []:
            if isinstance(be, dict):
                backends.append({"shape": label, **{k: be.get(k) for k in
                                 ("name", "sovereign", "vendor", "status", "median_ms", "tflops")}})
    return {"speedups": speedups, "backends": backends}


def performance(bench, bench_sha, pipeline, pipeline_sha, env, env_sha) -> dict:
    subjects, predicate = [], {"claims": {}, "device": NOT_RECORDED}
    for stage, obj, sha in (("bench", bench, bench_sha), ("pipeline", pipeline, pipeline_sha)):
        if obj is None:
            continue
        subjects.append(subject(f"evidence/{stage}.json", sha))
        claim = {"schema": obj.get("schema", NOT_RECORDED), "status": _first(obj, "status", default=NOT_RECORDED),
                 "dtype": _first(obj, "dtype", default=NOT_RECORDED)}
        if stage == "bench":
            claim.update(_bench_figures(obj))
        # Every numeric field named like a speedup, ratio or TFLOP/s figure, with its JSON path.
        if not claim.get("speedups"):
            claim["figures"] = _find_claims(obj)
        predicate["claims"][stage] = claim
        for k in ("device_name", "device"):
            if isinstance(obj.get(k), str) and obj[k] and predicate["device"] == NOT_RECORDED:
                predicate["device"] = obj[k]
    if env is not None:
        subjects.append(subject("evidence/environment.json", env_sha))
        predicate["environment"] = "evidence/environment.json"
    predicate["note"] = ("figures are copied from the evidence files named as subjects; "
                         "those files are the full record")
    return statement(subjects, PERFORMANCE_PREDICATE, predicate)


def _inline(name: str, value) -> list[dict]:
    """A configuration ResourceDescriptor carrying `value` inline (in-toto: content is base64)."""
    if value is None:
        return []
    body = json.dumps(value, sort_keys=True, default=str).encode()
    return [{"name": name, "mediaType": "application/json", "content": dsse.b64encode(body)}]


def _write(bundle_dir: Path, name: str, st: dict, key) -> Path:
    body = json.dumps(st, indent=2, ensure_ascii=True, default=str).encode()
    path = bundle_dir / ATTESTATIONS_DIR / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise InputError(f"bundle {bundle_dir!s}: {ATTESTATIONS_DIR}/{name} is a symlink; refusing")
    path.write_text(dsse.sign(body, key).to_json())
    return path


def write_attestations(bundle_dir: Path, key, set_aside=()) -> list[Path]:
    """Write the bundle's attestations (those whose evidence exists); returns their paths.

    `set_aside`: evidence stems of a run that did not finish (report.completeness): partial
    evidence is kept in the bundle but never attested as a result."""
    bundle_dir = Path(bundle_dir)
    ev = {s: (None, None) if s in set_aside else _load_evidence(bundle_dir, s) for s in EVIDENCE}
    artifacts = _artifacts(bundle_dir)
    art_subjects = _subjects(bundle_dir, [n for names in artifacts.values() for n in names])
    env_conf = ([subject("evidence/environment.json", ev["environment"][1])]
                if ev["environment"][0] is not None else [])
    written = []
    built = {t: names for t, names in artifacts.items() if t != USER_ARTIFACTS}
    if built:
        written.append(_write(bundle_dir, "build.provenance.dsse.json",
                              slsa_provenance(bundle_dir, ev["build"][0], ev["build"][1], built), key))
    parity, parity_sha = ev["parity"]
    if parity is not None:
        conf = env_conf + _inline("gates", _first(parity, "gates"))
        written.append(_write(bundle_dir, "parity.test-result.dsse.json",
                              result_statement("evidence/parity.json", parity, parity_sha, art_subjects,
                                               ("shapes", "results", "cases", "candidates", "checks"), conf), key))
    linkage, linkage_sha = ev["linkage"]
    if linkage is not None:
        conf = _inline("policy", _first(linkage, "policy"))
        written.append(_write(bundle_dir, "linkage.test-result.dsse.json",
                              result_statement("evidence/linkage.json", linkage, linkage_sha, art_subjects,
                                               ("objects", "results", "files", "reports"), conf), key))
    if ev["bench"][0] is not None or ev["pipeline"][0] is not None:
        written.append(_write(bundle_dir, "performance.dsse.json",
                              performance(*ev["bench"], *ev["pipeline"], *ev["environment"]), key))
    # A bundle rebuilt in place must not keep an attestation of evidence that is gone now.
    for name in ATTESTATION_NAMES:
        stale = bundle_dir / ATTESTATIONS_DIR / name
        if stale not in written and stale.is_file() and not stale.is_symlink():
            stale.unlink()
    return written

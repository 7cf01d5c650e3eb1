"""The bundle: one folder a reader can check offline.

    report.html              one self-contained file (inline CSS and SVG, no JavaScript)
    ro-crate-metadata.json   RO-Crate 1.2 + Process Run Crate 0.5
    evidence/*.json          the stages' evidence, copied verbatim
    artifacts/<target>/      copies of the built objects (+ provenance.json): the attestation subjects
    artifacts/user/          copies of --artifact objects
    attestations/            DSSE envelopes (signing API), then manifest.json + public key (LAST)

Every destination path is joined through `layout.safe_join`, so names taken from evidence
(targets, file names) cannot place a file outside the bundle.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from audit.errors import InputError, UsageError
from audit.files import sha256_file, write_json_atomic
from audit.report import completeness, model, render, rocrate
from audit.report.layout import (MAX_EVIDENCE_BYTES, build_targets, load_evidence, prepare_out, safe_component,
                                 safe_join)

SIGNING_UNAVAILABLE = "signing: not available"


@dataclass
class ArtifactCopy:
    kind: str  # "target" (ours, from build.json) or "user" (--artifact)
    label: str  # target name or the user's file name (untrusted: escaped when rendered)
    path: str  # bundle-relative POSIX path
    sha256: str
    size: int
    source: str  # where it was copied from
    provenance: str | None = None  # bundle-relative path of provenance.json
    digest_matches_evidence: bool | None = None  # vs the sha256 build.json / run.json recorded

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SigningInfo:
    available: bool
    ephemeral: bool | None = None
    keyid: str | None = None
    source: str | None = None
    line: str = SIGNING_UNAVAILABLE  # the signed-state line the report prints
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BundleResult:
    out: Path
    report: Path
    crate: Path
    evidence: list[str] = field(default_factory=list)
    artifacts: list[ArtifactCopy] = field(default_factory=list)
    attestations: list[str] = field(default_factory=list)
    manifest: str | None = None
    signing: SigningInfo = field(default_factory=lambda: SigningInfo(False))
    warnings: list[str] = field(default_factory=list)
    replaced: str | None = None  # what an earlier bundle in `out` held, when one was replaced
    incomplete: list[str] = field(default_factory=list)  # why the run is incomplete (empty: it is not)

    def to_dict(self) -> dict:
        return {"out": str(self.out), "report": str(self.report), "crate": str(self.crate),
                "evidence": self.evidence, "artifacts": [a.to_dict() for a in self.artifacts],
                "attestations": self.attestations, "manifest": self.manifest,
                "signing": self.signing.to_dict(), "warnings": self.warnings, "replaced": self.replaced,
                "incomplete": self.incomplete}


# --------------------------------------------------------------------------------------------
# paths


def _copy_into(root: Path, rel: str, src: Path) -> Path:
    dest = safe_join(root, rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    safe_join(root, rel)  # again, now that the parents exist (a symlinked parent is caught)
    if dest.is_symlink():
        dest.unlink()
    shutil.copyfile(src, dest)  # the file's bytes, never a link to elsewhere
    return dest


def _user_name(name: str, index: int, sha256: str) -> str:
    return name if safe_component(name) else f"artifact-{index}-{sha256[:12]}.so"


# --------------------------------------------------------------------------------------------
# evidence


def _first_file(*paths: Path) -> Path | None:
    return next((p for p in paths if p is not None and p.is_file() and not p.is_symlink()), None)


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _is_json_object(path: Path) -> bool:
    try:
        return path.stat().st_size <= MAX_EVIDENCE_BYTES and isinstance(json.loads(path.read_text("utf-8")), dict)
    except (OSError, ValueError):
        return False


def _object_source(recorded_sha: str | None, *paths: Path) -> tuple[Path | None, str]:
    """The first candidate that is an ELF object with the digest the evidence recorded.

    Evidence may come from elsewhere: copying whatever path it names would let a crafted
    build.json pull any local file (say /etc/passwd) into a bundle that is then shared.
    """
    why = "not found"
    for p in paths:
        if p is None or p.is_symlink() or not p.is_file():
            continue
        if not _is_elf(p):
            why = f"{p} is not an ELF object"
            continue
        if recorded_sha and sha256_file(p) != recorded_sha:
            why = f"{p} does not have the sha256 the evidence recorded (rebuilt or changed since)"
            continue
        return p, ""
    return None, why


def _place_object(out: Path, rel: str, src: Path, warnings: list[str]) -> tuple[Path, str] | None:
    """Copy an object into the bundle and digest the copy (what is attested is what was copied);
    a refused path becomes a warning and None."""
    try:
        dest = _place(out, rel, src)
    except InputError as exc:
        warnings.append(exc.message)
        return None
    return dest, sha256_file(dest)


def _place(out: Path, rel: str, src: Path) -> Path:
    """Copy src to out/rel unless out/rel already is that file (a bundle regenerated in place)."""
    dest = safe_join(out, rel)
    if dest.is_file() and not dest.is_symlink() and src.resolve() == dest.resolve():
        return dest
    return _copy_into(out, rel, src)


def copy_artifacts(out: Path, evidence: dict, evidence_dir: Path, kinds=("target", "user")
                   ) -> tuple[list[ArtifactCopy], list[str]]:
    """Copy our built objects (and the user's --artifact objects) into artifacts/.

    Sources, first found: the bundle's own copy (in place), the copy in the bundle the evidence
    came from, the path the evidence recorded. The digest is checked against the one recorded.
    """
    copies: list[ArtifactCopy] = []
    warnings: list[str] = []
    old_bundle = evidence_dir.resolve().parent / "artifacts"  # rebuilding from a bundle's evidence/
    here = out / "artifacts"
    for t in build_targets(evidence.get("build")) if "target" in kinds else []:
        if t.get("status") != "built":
            continue
        target = str(t.get("target", ""))
        lib = t.get("library")
        if not lib:
            warnings.append(f"target {target!r}: build.json names no library")
            continue
        if not safe_component(target):
            warnings.append(f"target {target!r}: unsafe name, its object was not copied")
            continue
        name = Path(str(lib)).name
        name = name if safe_component(name) else "libflash_kernel.so"
        src, why = _object_source(t.get("sha256"), here / target / name, old_bundle / target / name,
                                  Path(str(lib)))
        if src is None:
            warnings.append(f"target {target}: object not copied: {why}")
            continue
        rel = f"artifacts/{target}/{name}"
        placed = _place_object(out, rel, src, warnings)
        if placed is None:
            continue
        dest, digest = placed
        recorded = t.get("sha256")
        # Provenance: only the file beside the verified object, else the copy embedded in build.json.
        prov = t.get("provenance")
        prov_src = _first_file(src.parent / "provenance.json")
        prov_rel = f"artifacts/{target}/provenance.json"
        if prov_src is not None and _is_json_object(prov_src):
            _place(out, prov_rel, prov_src)
        elif isinstance(prov, dict):
            write_json_atomic(safe_join(out, prov_rel), prov)
        else:
            prov_rel = None
        match = None if not recorded else (recorded == digest)
        if match is False:
            warnings.append(f"target {target}: the copied object's sha256 differs from build.json's "
                            "(it was rebuilt or changed after the build stage)")
        copies.append(ArtifactCopy("target", target, rel, digest, dest.stat().st_size, str(src), prov_rel, match))
    run = evidence.get("run") or {}
    used: set[str] = set()
    for i, a in enumerate(run.get("artifacts", []) or [] if "user" in kinds else []):
        if not isinstance(a, dict):
            continue
        orig = Path(str(a.get("path", "")))
        name = _user_name(str(a.get("name") or orig.name), i, str(a.get("sha256", "")))
        if name in used:  # two --artifact objects with one file name: keep both
            name = f"{i}-{name}" if safe_component(f"{i}-{name}") else f"artifact-{i}.so"
        used.add(name)
        src, why = _object_source(a.get("sha256"), here / "user" / name, old_bundle / "user" / name, orig)
        if src is None:
            warnings.append(f"artifact {str(a.get('name') or orig.name)!r} not copied: {why}")
            continue
        rel = f"artifacts/user/{name}"
        placed = _place_object(out, rel, src, warnings)
        if placed is None:
            continue
        dest, digest = placed
        match = None if not a.get("sha256") else (a.get("sha256") == digest)
        if match is False:
            warnings.append(f"artifact {name!r}: changed since the run audited it (sha256 differs)")
        copies.append(ArtifactCopy("user", str(a.get("name") or orig.name), rel, digest, dest.stat().st_size,
                                   str(orig), None, match))
    return copies, warnings


# --------------------------------------------------------------------------------------------
# signing (another module's API; guarded so a bundle is still written, marked unsigned)


def load_key(key) -> tuple[Any, SigningInfo]:
    try:
        from audit.signing.keys import SigningKey, load_signing_key
    except ImportError as exc:
        return None, SigningInfo(False, reason=f"signing module missing ({exc})")
    k = key if isinstance(key, SigningKey) else load_signing_key(key)
    line = (f"signed (Ed25519, keyid {k.keyid[:16]}…); ephemeral key: integrity only, no identity"
            if k.ephemeral else f"signed (Ed25519, keyid {k.keyid[:16]}…) with the key from "
            f"{getattr(k, 'source', '') or 'the given file'}: whoever holds it vouches for this bundle")
    return k, SigningInfo(True, bool(k.ephemeral), k.keyid, getattr(k, "source", None), line)


def sign(out: Path, key, info: SigningInfo, warnings: list[str], set_aside=()) -> tuple[list[str], bool]:
    if key is None:
        return [], False
    try:
        from audit.report.attest import write_attestations
        from audit.report.manifest import write_public_key
    except ImportError as exc:
        warnings.append(f"attestations not written: signing module missing ({exc})")
        return [], False
    paths = write_attestations(out, key, set_aside)
    write_public_key(out, key)  # before the RO-Crate, which describes it
    return [p.resolve().relative_to(out.resolve()).as_posix() for p in paths], True


def manifest(out: Path, key, warnings: list[str]) -> str | None:
    if key is None:
        return None
    try:
        from audit.report.manifest import write_manifest
    except ImportError as exc:
        warnings.append(f"manifest not written: signing module missing ({exc})")
        return None
    return write_manifest(out, key).resolve().relative_to(out.resolve()).as_posix()


# --------------------------------------------------------------------------------------------
# the whole bundle


def write_bundle(evidence_dir: Path, out: Path, key=None,
                 on_rendered: Callable[[], None] | None = None) -> BundleResult:
    """Write the bundle into `out` from the evidence in `evidence_dir` (see module docstring).

    `key`: a SigningKey, a PEM path, or None (env, else ephemeral). `on_rendered` runs after
    report.html is written and before the RO-Crate and signing (the orchestrator closes run.json
    there, so the manifest signs its final form).
    """
    evidence_dir, out = Path(evidence_dir), Path(out)
    in_place = out.resolve() / "evidence" == evidence_dir.resolve()
    evidence, warnings = load_evidence(evidence_dir)
    key_obj, signing = load_key(key)
    if not signing.available:
        warnings.append(f"{SIGNING_UNAVAILABLE}: {signing.reason}")
    replaced = None
    if not in_place:
        if out.resolve() == evidence_dir.resolve() or evidence_dir.resolve() in out.resolve().parents:
            raise UsageError(f"--out {out}: must not be inside the evidence folder")
        replaced = prepare_out(out)
        for stem in evidence:
            _copy_into(out, f"evidence/{stem}.json", evidence_dir / f"{stem}.json")
    else:
        # Regenerated in place: drop earlier signatures, keep the evidence and the artifacts it audited.
        if (out / "attestations").is_dir() and not (out / "attestations").is_symlink():
            shutil.rmtree(out / "attestations")
    evidence_names = sorted(f"evidence/{stem}.json" for stem in evidence)
    copies, w = copy_artifacts(out, evidence, evidence_dir)
    warnings += w

    finished = completeness.assess(evidence)
    report_model = model.build_model(evidence, artifacts=copies, signing=signing, warnings=warnings)
    report = out / "report.html"
    render.write_report(report_model, report)
    if on_rendered is not None:
        on_rendered()
        evidence, _ = load_evidence(out / "evidence")  # run.json was just finalised

    attestations, signed = sign(out, key_obj, signing, warnings, set_aside=finished.partial)
    crate = rocrate.write_crate(out, evidence, copies, attestations=attestations, signing=signing,
                                manifest_names=("manifest.json", "manifest.dsse.json", "public.pem")
                                if signed else ())
    manifest_name = manifest(out, key_obj, warnings) if signed else None
    return BundleResult(out, report, crate, evidence_names, copies, attestations, manifest_name, signing,
                        warnings, replaced, list(finished.reasons))

"""Building flash_kernel/ per target: `build_targets(targets, out) -> BuildResult`.

Each target compiles into a temporary file beside the library and is renamed into place only
when the compiler succeeded, so a failed or interrupted build never leaves a half-written
library; the previous library and its provenance.json (a matching pair) stay untouched then.
The compiler's full output always goes to DIR/<target>/build.log.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from audit import __version__
from audit.kernel_build import package_note
from audit.kernel_build import provenance as prov
from audit.kernel_build import targets as tg
from audit.kernel_build.toolchain import Toolchain, ToolchainMissing, find
from audit.errors import InputError, UsageError
from audit.files import sha256_file, write_json_atomic

BUILD_SCHEMA = "sovereign-audit.build/1"
COMPILE_TIMEOUT_S = 1800
BUILT, SKIPPED, FAILED = "built", "skipped", "failed"


@dataclass
class TargetBuild:
    target: str
    kind: str
    status: str  # built | skipped | failed
    reason: str  # one line; "" when built
    requested: bool  # named by the caller (False: a default target)
    library: str | None = None
    provenance_path: str | None = None
    log: str | None = None
    sha256: str | None = None
    duration_s: float = 0.0
    provenance: dict | None = None  # the provenance.json content, so build.json stands alone

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BuildResult:
    out_dir: str
    requested: list[str]  # as asked ([] for the defaults)
    targets: list[TargetBuild] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""
    tool_version: str = __version__
    schema: str = BUILD_SCHEMA

    @property
    def ok(self) -> bool:
        """Every requested target was built (defaults skipped for a missing toolchain are fine)."""
        return all(t.status == BUILT for t in self.targets if t.requested or t.status == FAILED)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def get(self, target: str) -> TargetBuild | None:
        return next((t for t in self.targets if t.target == target), None)

    def to_dict(self) -> dict:
        return {"schema": self.schema, "out_dir": self.out_dir, "requested": list(self.requested),
                "ok": self.ok, "started_at": self.started_at, "finished_at": self.finished_at,
                "tool_version": self.tool_version, "targets": [t.to_dict() for t in self.targets]}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def source_root() -> Path:
    """The folder holding the flash_kernel package (found without importing it)."""
    spec = importlib.util.find_spec("flash_kernel")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the flash_kernel sources are not installed (reinstall sovereign-audit)")
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def valid_targets() -> list[str]:
    return list(tg.all_specs())


def resolve_targets(targets: list[str] | None) -> tuple[list[str], bool]:
    """(names to build, explicitly requested?). Unknown names: UsageError listing the valid ones."""
    specs = tg.all_specs()
    if not targets:
        return list(tg.DEFAULT_TARGETS), False
    unknown = [t for t in targets if t not in specs]
    if unknown:
        raise UsageError(f"unknown target {', '.join(map(repr, unknown))}; valid targets: {', '.join(specs)} "
                         f"(AMD targets come from the installed rocm-device-libs)")
    return list(dict.fromkeys(targets)), True


def first_error_line(log: str, returncode: int | None) -> str:
    """The first meaningful line of a compiler log, for a one-line message."""
    lines = [" ".join(line.split()) for line in log.splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        low = line.lower()
        if "error" in low or "fatal" in low:
            return line[:300]
    if lines:
        return lines[0][:300]
    return f"the compiler exited with status {returncode}"


def build_targets(targets: list[str] | None, out: Path, jobs: int | None = None,
                  defines: tuple[str, ...] = ()) -> BuildResult:
    """Build each target into out/<target>/ (defaults: gfx1030, sm_90a and sm_90 where their
    toolchains exist, and cpu always), with `defines` ("FK_NAME=INTEGER", the kernel's switches)
    added to every compile. Never raises for a failed compile: see each TargetBuild's status; a bad
    define is a UsageError before anything is compiled."""
    names, explicit = resolve_targets(targets)
    try:
        parsed = tuple(tg.parse_define(d) for d in defines)
        specs = {n: tg.with_defines(s, parsed) for n, s in tg.all_specs().items() if n in names}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _build_names(names, explicit, Path(out), jobs, specs)


def _build_names(names: list[str], explicit: bool, out: Path, jobs: int | None = None,
                 specs: dict[str, tg.TargetSpec] | None = None) -> BuildResult:
    result = BuildResult(out_dir=str(out), requested=names if explicit else [], started_at=_now())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the build folder {str(out)!r}: {exc.strerror or exc}") from None
    specs = specs or tg.all_specs()
    root = source_root()
    toolchains: dict[str, Toolchain | ToolchainMissing] = {}
    for name in names:
        c = specs[name].compiler
        if c not in toolchains:
            try:
                toolchains[c] = find(c)
            except ToolchainMissing as exc:
                toolchains[c] = exc
    workers = max(1, min(len(names), jobs or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(build_one, specs[n], toolchains[specs[n].compiler], root, out,
                               explicit or n == "cpu") for n in names]
        result.targets = [f.result() for f in futures]
    result.finished_at = _now()
    write_json_atomic(out / "build.json", result.to_dict())
    return result


def up_to_date(spec: tg.TargetSpec, tc: Toolchain, root: Path, out: Path) -> TargetBuild | None:
    """The existing build of spec under out/, if its provenance still matches: same compiler,
    flags and env, every recorded source and the library itself unchanged. Else None."""
    tdir = out / spec.name
    try:
        rec = json.loads((tdir / "provenance.json").read_text())
        if (rec.get("schema") != prov.PROVENANCE_SCHEMA or rec.get("target") != spec.name
                or rec.get("flags") != list(spec.flags)
                or rec.get("env") != dict(spec.env) or rec.get("compiler", {}).get("path") != tc.path
                or rec.get("compiler", {}).get("version") != tc.version or rec.get("cwd") != str(root)):
            return None
        for s in rec["sources"]:
            if sha256_file(root / s["path"]) != s["sha256"]:
                return None
        lib = tdir / tg.LIBRARY_NAME
        if sha256_file(lib) != rec["outputs"][0]["sha256"]:
            return None
        recorded = [prov.FileDigest(s["path"], s["sha256"], s.get("size", 0)) for s in rec["sources"]]
        if rec.get("package_note") != package_note.document(spec.name, recorded):  # unstamped, or another version
            return None
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return TargetBuild(spec.name, spec.kind, BUILT, "up to date (provenance matches)", True, str(lib),
                       str(tdir / "provenance.json"), str(tdir / "build.log"), rec["outputs"][0]["sha256"],
                       0.0, rec)


def ensure_built(targets: list[str] | None, out: Path, jobs: int | None = None) -> BuildResult:
    """Like build_targets (same defaults and exit semantics), but reuses targets whose provenance
    proves them current (for `run`, tests and stages that need a library)."""
    names, explicit = resolve_targets(targets)
    out = Path(out)
    specs, root = tg.all_specs(), source_root()
    reused: dict[str, TargetBuild] = {}
    for n in names:
        try:
            tc = find(specs[n].compiler)
        except ToolchainMissing:
            continue
        if not (root / specs[n].source).is_file():
            continue
        tb = up_to_date(specs[n], tc, root, out)
        if tb is not None:
            tb.requested = explicit or n == "cpu"
            reused[n] = tb
    missing = [n for n in names if n not in reused]
    if missing:
        result = _build_names(missing, explicit, out, jobs)
    else:
        result = BuildResult(str(out), [], started_at=_now(), finished_at=_now())
    built = {t.target: t for t in result.targets}
    result.requested = names if explicit else []
    result.targets = [reused.get(n) or built[n] for n in names]
    write_json_atomic(out / "build.json", result.to_dict())
    return result


def build_one(spec: tg.TargetSpec, tc, root: Path, out: Path, requested: bool) -> TargetBuild:
    """Compile one target from the sources under root into out/<target>/ (never raises for a
    failed compile: the TargetBuild says failed, with the first error line)."""
    t0 = time.monotonic()
    tb = TargetBuild(spec.name, spec.kind, SKIPPED, "", requested)
    if isinstance(tc, ToolchainMissing):
        tb.reason = str(tc)
        return tb
    if spec.kind == "amd" and spec.name not in tg.device_lib_isas():
        tb.reason = f"the installed rocm-device-libs have no bitcode for {spec.name}"
        return tb
    if not (root / spec.source).is_file():
        tb.reason = f"{spec.source} is not in the source tree yet"
        return tb
    tdir = out / spec.name
    try:
        tdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        tb.status, tb.reason = FAILED, f"cannot create {str(tdir)!r}: {exc.strerror or exc}"
        return tb
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    final = tdir / tg.LIBRARY_NAME
    tmp = (tdir / f".{tg.LIBRARY_NAME}.tmp-{tag}").resolve()
    dep = (tdir / f".deps.tmp-{tag}.d").resolve()
    log_path = tdir / "build.log"
    argv = spec.command(str(tmp), str(dep))
    argv[0] = tc.path  # the compiler actually run, by absolute path
    started = _now()
    returncode, output = None, ""
    try:
        cp = subprocess.run(argv, cwd=root, env={**os.environ, **spec.env}, capture_output=True, text=True,
                            errors="replace", timeout=COMPILE_TIMEOUT_S)
        returncode, output = cp.returncode, (cp.stdout or "") + (cp.stderr or "")
    except subprocess.TimeoutExpired as exc:
        output = f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {COMPILE_TIMEOUT_S} s)"
    except OSError as exc:
        output = f"cannot run {argv[0]}: {exc}"
    finished = _now()
    tb.log = str(log_path)
    _write_text(log_path, f"# target {spec.name}\n# cwd {root}\n# env {json.dumps(spec.env)}\n"
                          f"# argv {json.dumps(argv)}\n# exit {returncode}\n{output}")
    try:
        if returncode != 0 or not tmp.is_file():
            tb.status = FAILED
            reason = first_error_line(output, returncode) if returncode != 0 else "the compiler wrote no output"
            tb.reason = f"{reason} (full log: {log_path})"
            return tb
        deps = prov.parse_depfile(dep.read_text(errors="replace")) if dep.is_file() else []
        sources = prov.tree_sources(root, deps)
        method = "compiler-deps"
        if spec.source not in sources:  # no usable dependency output: fall back to scanning
            sources, method = prov.scan_sources(root), "scan"
        source_digests = [prov.digest(root / s, s) for s in sources]
        note = package_note.document(spec.name, source_digests)
        try:  # before the output is hashed: the digest is of the library as shipped, note included
            package_note.stamp(tmp, note)
        except package_note.StampError as exc:
            tb.status, tb.reason = FAILED, str(exc)
            return tb
        out_digest = prov.digest(tmp, tg.LIBRARY_NAME)
        record = prov.Provenance(
            target=spec.name, kind=spec.kind, command=argv, cwd=str(root), env=dict(spec.env),
            flags=list(spec.flags), compiler=tc.to_dict(),
            sources=source_digests, sources_method=method, package_note=note,
            outputs=[out_digest], host=prov.host_info(), started_at=started, finished_at=finished,
            duration_s=round(time.monotonic() - t0, 3), expected_flash_path=spec.flash_path, note=spec.note,
            git=prov.git_info(root), tool_version=__version__, temp_output=str(tmp))
        os.replace(tmp, final)
        write_json_atomic(tdir / "provenance.json", record.to_dict())
        tb.status, tb.library, tb.sha256 = BUILT, str(final), out_digest.sha256
        tb.provenance_path = str(tdir / "provenance.json")
        tb.provenance = record.to_dict()
        return tb
    finally:
        tb.duration_s = round(time.monotonic() - t0, 3)
        for p in (tmp, dep):
            try:
                p.unlink()
            except OSError:
                pass


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)

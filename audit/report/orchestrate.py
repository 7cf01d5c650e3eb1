"""The `run` pipeline: build -> check -> parity -> bench -> pipeline -> report.

Every stage runs inside its own guard: a stage whose module is missing or that raises is recorded as
FAILED with a one-line reason and the run goes on with what it has (never swallowed: the report
shows it and the exit code is 1). Each stage's evidence JSON is written atomically (temp file +
rename) the moment the stage completes, and run.json is rewritten after every stage, so a crash or
Ctrl-C loses nothing that was already done.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from audit import __version__
from audit.errors import EXIT_OK, EXIT_VIOLATION, AuditError, InputError, UsageError

RUN_SCHEMA = "sovereign-audit.run/1"
STAGES = ("environment", "build", "linkage", "parity", "bench", "pipeline", "report")
# Evidence file of each stage (bundle-relative under evidence/).
EVIDENCE_FILES = {
    "environment": "environment.json",
    "build": "build.json",
    "linkage": "linkage.json",
    "parity": "parity.json",
    "bench": "bench.json",
    "pipeline": "pipeline.json",
}
# Small CPU presets: the whole run must finish within 10 minutes on 2 cores with no GPU.
CPU_PARITY_PRESETS = ("tiny-128", "tiny-64", "tiny-cross")
CPU_BENCH_PRESETS = ("tiny-128", "tiny-64")
GPU_PRESETS = ("wan2.1-1.3b-480p", "cogvideox-5b")
# What a bundle folder may already hold from an earlier run (the only things `run` removes).
BUNDLE_ENTRIES = ("evidence", "artifacts", "attestations", "report.html", "ro-crate-metadata.json",
                  "manifest.json", "manifest.dsse.json", "public.pem")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def one_line(exc: BaseException) -> str:
    """An exception as one line: AuditError's own message, else `Type: message`."""
    if isinstance(exc, AuditError):
        return exc.message
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write JSON via a temp file in the same folder + os.replace: a reader sees old or new, never half."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class StageRecord:
    name: str
    status: str = "pending"  # pending | running | ok | failed | skipped
    reason: str | None = None  # why it failed or was skipped; a gate's failure
    verdict: str | None = None  # pass | fail | None (a stage without a gate)
    started: str | None = None
    ended: str | None = None
    seconds: float | None = None
    evidence: str | None = None  # bundle-relative path of its evidence JSON
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Artifact:
    """A user's own shared object added with --artifact."""

    path: str
    name: str
    sha256: str
    size: int
    abi: str | None = None  # our C ABI's target string when flash_kernel.load accepted it
    abi_reason: str | None = None  # why it is audited only (not timed, not checked for parity)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunConfig:
    out: Path
    device: str = "auto"  # auto | cpu | cuda
    targets: tuple[str, ...] = ()  # () = the builder's default set
    artifacts: tuple[Path, ...] = ()
    no_build: bool = False
    key: Any = None  # a SigningKey, a PEM path, or None (env, else ephemeral)
    build_dir: Path = Path("build")
    repeats: int | None = None  # None: per device default
    pipeline_preset: str | None = None  # None: tiny on CPU, wan-480p on CUDA
    pipeline_steps: int | None = None
    skip: tuple[str, ...] = ()  # evidence stages not to run (recorded as skipped)
    argv: list[str] = field(default_factory=list)


@dataclass
class RunRecord:
    command: list[str]
    started: str
    device_requested: str
    device: str = "cpu"
    ended: str | None = None
    tool_version: str = __version__
    cwd: str = ""
    host: dict = field(default_factory=dict)
    targets_requested: list[str] = field(default_factory=list)
    targets_built: list[str] = field(default_factory=list)
    targets_run: list[str] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    stages: list[StageRecord] = field(default_factory=list)
    exit_code: int | None = None
    bundle_dir: str = ""  # absolute path of --out: objects audited inside it are shown bundle-relative

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "schema": RUN_SCHEMA,
            "tool": {"name": "sovereign-audit", "version": self.tool_version},
            "command": self.command,
            "command_line": shlex.join(self.command),
            "cwd": self.cwd,
            "bundle_dir": self.bundle_dir,
            "started": self.started,
            "ended": self.ended,
            "device_requested": self.device_requested,
            "device": self.device,
            "host": self.host,
            "targets_requested": self.targets_requested,
            "targets_built": self.targets_built,
            "targets_run": self.targets_run,
            "artifacts": [a.to_dict() for a in self.artifacts],
            "stages": [s.to_dict() for s in self.stages],
            "exit_code": self.exit_code,
        }


@dataclass
class RunResult:
    out: Path
    record: RunRecord
    report: Path | None
    exit_code: int

    def to_dict(self) -> dict:
        return {"out": str(self.out), "report": str(self.report) if self.report else None,
                "exit_code": self.exit_code, "run": self.record.to_dict()}


# --------------------------------------------------------------------------------------------
# set-up


def resolve_device(requested: str) -> str:
    if requested not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {requested!r}: expected auto, cpu or cuda")
    if requested == "cpu":
        return "cpu"
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: there is no GPU we could use
        has_cuda = False
    if requested == "cuda" and not has_cuda:
        raise UsageError("--device cuda: no CUDA GPU is available here (use --device cpu or auto)")
    return "cuda" if has_cuda else "cpu"


def prepare_out(out: Path) -> None:
    """Make `out` ready: empty, or an earlier bundle whose generated entries are removed.

    Refuses a non-empty folder that is not a bundle: `run` never deletes files it did not write.
    """
    import shutil

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()}
        if entries and not ((out / "evidence" / "run.json").is_file()
                            or (out / "ro-crate-metadata.json").is_file()):
            raise UsageError(f"--out {out}: folder is not empty and is not a sovereign-audit bundle")
        unknown = sorted(entries - set(BUNDLE_ENTRIES))
        if unknown:
            raise UsageError(f"--out {out}: holds files a bundle does not ({', '.join(unknown[:3])});"
                             " choose an empty folder")
        for name in BUNDLE_ENTRIES:
            p = out / name
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)
    (out / "evidence").mkdir(parents=True, exist_ok=True)


def describe_artifact(path: Path) -> Artifact:
    try:
        st = path.stat()
        if not path.is_file():
            raise InputError(f"--artifact {path}: not a regular file")
        digest = sha256_file(path)
    except OSError as exc:
        raise InputError(f"--artifact {path}: cannot read it ({exc.strerror or exc})") from None
    return Artifact(path=str(path), name=path.name, sha256=digest, size=st.st_size)


def probe_abi(art: Artifact) -> None:
    """Does this object export our C ABI? (flash_kernel.load; loading runs its constructors.)"""
    try:
        import flash_kernel

        lib = flash_kernel.load(art.path)
        art.abi = str(getattr(lib, "target", "") or "unknown")
    except Exception as exc:
        art.abi = None
        art.abi_reason = f"not checked for parity or timed: does not load as our C ABI ({one_line(exc)})"


def host_facts() -> dict:
    # A minimal, dependency-free description kept in run.json even when environment capture fails.
    return {"hostname": platform.node(), "system": platform.system(), "release": platform.release(),
            "machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


# --------------------------------------------------------------------------------------------
# the pipeline


class Runner:
    """Runs the stages in order, recording each one; see module docstring."""

    def __init__(self, config: RunConfig, echo: Callable[[str], None] = lambda s: None):
        self.config = config
        self.out = config.out
        self.evidence_dir = config.out / "evidence"
        self.echo = echo
        self.record = RunRecord(command=list(config.argv) or ["sovereign-audit", "run"], started=now_iso(),
                                device_requested=config.device, cwd=os.getcwd(), host=host_facts(),
                                targets_requested=list(config.targets),
                                bundle_dir=str(config.out.resolve()),
                                stages=[StageRecord(n) for n in STAGES])
        self.results: dict[str, Any] = {}  # stage -> its typed result (for the next stages)
        self.libraries: list[tuple[str, str]] = []  # (label, .so path) run for parity and bench
        self.copies: dict[str, str] = {}  # target -> its copy in the bundle (artifacts/<target>/)

    # -- bookkeeping -------------------------------------------------------------------------

    def save_run(self) -> None:
        write_json_atomic(self.evidence_dir / "run.json", self.record.to_dict())

    def save_evidence(self, stage: str, data: dict) -> str:
        name = EVIDENCE_FILES[stage]
        write_json_atomic(self.evidence_dir / name, data)
        return f"evidence/{name}"

    def stage(self, name: str, fn: Callable[[StageRecord], None]) -> StageRecord:
        rec = self.record.stage(name)
        rec.status, rec.started = "running", now_iso()
        self.save_run()
        self.echo(f"[{name}] ...")
        t0 = time.monotonic()
        try:
            if name in self.config.skip:
                self.skip(rec, f"--skip {name}")
            else:
                fn(rec)
            if rec.status == "running":
                rec.status = "ok"
        except KeyboardInterrupt:
            rec.status, rec.reason = "failed", "interrupted (Ctrl-C)"
            self._close(rec, t0)
            raise
        except ImportError as exc:
            rec.status = "failed"
            rec.reason = f"stage not available: {one_line(exc)}"
        except Exception as exc:  # recorded and shown, never swallowed
            rec.status, rec.reason = "failed", one_line(exc)
        self._close(rec, t0)
        tail = f" ({rec.reason})" if rec.reason else ""
        verdict = f", {rec.verdict}" if rec.verdict else ""
        self.echo(f"[{name}] {rec.status}{verdict}{tail}")
        return rec

    def _close(self, rec: StageRecord, t0: float) -> None:
        rec.ended = now_iso()
        rec.seconds = round(time.monotonic() - t0, 3)
        self.save_run()

    @staticmethod
    def skip(rec: StageRecord, reason: str) -> None:
        rec.status, rec.reason = "skipped", reason

    # -- stages ------------------------------------------------------------------------------

    def run_environment(self, rec: StageRecord) -> None:
        from audit.evidence.environment import capture

        env = capture()
        data = env.to_dict() if hasattr(env, "to_dict") else dict(env)
        rec.evidence = self.save_evidence("environment", data)

    def run_build(self, rec: StageRecord) -> None:
        if self.config.no_build:
            return self.skip(rec, "--no-build: our kernel was not built; only --artifact objects are audited")
        from audit.build import builder

        # Reuse a target whose provenance proves it current (same sources, compiler, flags and
        # library digest: its reason says so); build the rest.
        build = getattr(builder, "ensure_built", None) or builder.build_targets
        result = build(list(self.config.targets) or None, self.config.build_dir)
        self.results["build"] = result
        data = result.to_dict()
        rec.evidence = self.save_evidence("build", data)
        built, failed = [], []
        for t in _build_targets(data):
            status = t.get("status")
            if status == "built":
                built.append(str(t.get("target")))
            elif status == "failed":
                failed.append(f"{t.get('target')}: {_first_line(t.get('reason') or t.get('error') or '')}")
            elif status == "skipped":
                rec.notes.append(f"{t.get('target')} skipped: {_first_line(t.get('reason') or '')}")
        self.record.targets_built = built
        # Copy the objects into the bundle now: linkage, parity, bench and the pipeline then use
        # exactly the bytes the bundle holds and the attestations name.
        from audit.report.bundle import copy_artifacts

        copies, warnings = copy_artifacts(self.out, {"build": data}, self.evidence_dir, kinds=("target",))
        self.copies = {c.label: str((self.out / c.path).resolve()) for c in copies}
        rec.notes += warnings
        # An object that changed between the build and the copy (another build into the same
        # folder) is not the one build.json describes: fail closed rather than audit other bytes.
        failed += [f"{t}: not copied into the bundle ({'; '.join(warnings) or 'unknown reason'})"
                   for t in built if t not in self.copies]
        if failed:
            rec.status, rec.verdict = "failed", "fail"
            rec.reason = "build failed for " + "; ".join(failed)
        elif not built:
            rec.status, rec.reason = "failed", "no target was built"

    def audit_paths(self) -> list[str]:
        paths = [lib for _, lib in self.built_libraries()]
        paths += [a.path for a in self.record.artifacts]
        return paths

    def built_libraries(self) -> list[tuple[str, str]]:
        """(target, library path) of every target the build stage reports as built."""
        data = self._evidence("build")
        out = []
        for t in _build_targets(data) if data else []:
            target = str(t.get("target"))
            lib = self.copies.get(target)
            if t.get("status") == "built" and lib:
                out.append((target, lib))
        return out

    def run_linkage(self, rec: StageRecord) -> None:
        paths = self.audit_paths()
        if not paths:
            return self.skip(rec, "nothing to audit: no built target and no --artifact")
        from audit.linkage.check import check_paths
        from audit.linkage.policy import load_policy

        policy = load_policy(None)
        report = check_paths(paths, policy, _resolve_options())
        self.results["linkage"] = report
        rec.evidence = self.save_evidence("linkage", report.to_dict())
        code = int(getattr(report, "exit_code", 0))
        if code == 0:
            rec.verdict = "pass"
        else:
            rec.verdict = "fail"
            rec.reason = ("the sovereignty policy is violated" if code == EXIT_VIOLATION
                          else f"an object could not be read or checked (exit {code}): fail closed")

    def runnable_libraries(self) -> list[tuple[str, str]]:
        """Libraries this device can run: ours for the device's targets, plus --artifact ABI objects."""
        device = self.record.device
        libs = []
        for target, lib in self.built_libraries():
            if device == "cpu" and target == "cpu":
                libs.append((target, lib))
            elif device == "cuda" and target.startswith("sm_") and _cuda_can_run(target):
                libs.append((target, lib))
        for a in self.record.artifacts:
            if a.abi is None:
                continue
            # An artifact runs only where its target does: a gfx1030 object is audited, never run here.
            if (device == "cpu" and a.abi == "cpu") or (
                    device == "cuda" and a.abi.startswith("sm_") and _cuda_can_run(a.abi)):
                libs.append((f"artifact:{a.name}", a.path))
            elif not a.abi_reason:
                a.abi_reason = f"audited only: built for {a.abi}, which this {device} machine cannot run"
        return libs

    def run_parity(self, rec: StageRecord) -> None:
        from audit.evidence import parity

        shapes = self.shapes(CPU_PARITY_PRESETS)
        self._per_library(rec, "parity", lambda lib: _call_parity(parity, lib, shapes, self.record.device),
                          gated=True)

    def run_bench(self, rec: StageRecord) -> None:
        from audit.evidence import bench

        shapes = self.shapes(CPU_BENCH_PRESETS)
        repeats = self.config.repeats or 10
        self._per_library(rec, "bench", lambda lib: _call_bench(bench, lib, shapes, self.record.device,
                                                                repeats), gated=False)

    def _per_library(self, rec: StageRecord, stage: str, call: Callable[[str], Any], gated: bool) -> None:
        """The primary library's evidence (ours; with --no-build the first --artifact) goes to
        <stage>.json, another target's to <stage>.<target>.json, an --artifact's to
        <stage>.artifact-N.json."""
        if not self.libraries:
            return self.skip(rec, f"no library runs on {self.record.device}: nothing for {stage}")
        failures = []
        for i, (label, lib) in enumerate(self.libraries):
            try:
                report = call(lib)
            except Exception as exc:
                if i == 0:  # the primary (ours, else the first --artifact): the stage fails
                    raise
                rec.notes.append(f"{label}: {one_line(exc)}")
                failures.append(label)
                continue
            data = report.to_dict()
            if i == 0:
                self.results[stage] = report
                rec.evidence = self.save_evidence(stage, data)
            else:
                name = f"{stage}.{'artifact-' + str(i) if label.startswith('artifact:') else label}.json"
                write_json_atomic(self.evidence_dir / name, data)
                rec.notes.append(f"{label}: evidence/{name}")
            if gated:
                passed = _gate_passed(report)
                if passed is False:
                    failures.append(f"{label}: " + _failed_gates(data))
        if gated:
            rec.verdict = "fail" if failures else "pass"
            if failures:
                rec.reason = f"a {stage} gate failed: " + "; ".join(failures)
        elif failures:
            rec.status, rec.reason = "failed", f"{stage} failed for " + ", ".join(failures)

    def run_pipeline(self, rec: StageRecord) -> None:
        ours = [lib for _, lib in self.libraries[:1]]  # the primary library
        if not ours:
            return self.skip(rec, f"no library with our C ABI runs on {self.record.device}: "
                                  "the DiT pipeline needs one")
        from audit.evidence.pipeline import run_pipeline

        device = self.record.device
        preset = self.config.pipeline_preset or ("tiny" if device == "cpu" else "wan-480p")
        steps = self.config.pipeline_steps or 2
        # checkpoint: the pipeline hands over its partial report after each of its own stages.
        report = _call_kwargs(run_pipeline, preset=preset, steps=steps, device=device, lib=ours[0],
                              checkpoint=lambda r: self.save_evidence("pipeline", r.to_dict()))
        self.results["pipeline"] = report
        data = report.to_dict()
        rec.evidence = self.save_evidence("pipeline", data)
        broken = [f"{r.get('attention')}: {r.get('reason') or r.get('status')}" for r in data.get("runs") or []
                  if isinstance(r, dict) and r.get("sovereign") and r.get("status") != "ok"]
        if broken:
            rec.status, rec.reason = "failed", "our attention core failed in the pipeline: " + "; ".join(broken)

    def shapes(self, cpu_presets: tuple[str, ...]) -> list:
        from audit.evidence.presets import preset

        names = cpu_presets if self.record.device == "cpu" else GPU_PRESETS
        return [preset(n) for n in names]

    def _evidence(self, stage: str) -> dict | None:
        import json

        p = self.evidence_dir / EVIDENCE_FILES[stage]
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    # -- the whole run -----------------------------------------------------------------------

    def run(self) -> RunResult:
        from audit.report.bundle import write_bundle

        cfg = self.config
        unknown = [s for s in cfg.skip if s not in ("parity", "bench", "pipeline")]
        if unknown:
            raise UsageError(f"--skip {unknown[0]!r}: only parity, bench and pipeline can be skipped")
        if cfg.targets and not cfg.no_build:
            try:
                from audit.build.builder import resolve_targets
            except ImportError:
                pass  # the build stage records that the builder is missing
            else:
                resolve_targets(list(cfg.targets))  # an unknown target is a usage error (exit 2)
        self.record.device = resolve_device(cfg.device)
        self.record.artifacts = [describe_artifact(Path(p)) for p in cfg.artifacts]
        prepare_out(self.out)
        for a in self.record.artifacts:
            probe_abi(a)
        self.save_run()

        self.stage("environment", self.run_environment)
        self.stage("build", self.run_build)
        self.stage("linkage", self.run_linkage)
        self.libraries = self.runnable_libraries()
        self.record.targets_run = [t for t, _ in self.libraries if not t.startswith("artifact:")]
        self.stage("parity", self.run_parity)
        self.stage("bench", self.run_bench)
        self.stage("pipeline", self.run_pipeline)

        report_path: Path | None = None
        rec = self.record.stage("report")
        rec.status, rec.started = "running", now_iso()
        t0 = time.monotonic()

        def rendered() -> None:
            # Called by write_bundle after report.html, before the RO-Crate and signing, so the
            # run.json the manifest signs is final.
            rec.status = "ok"
            rec.evidence = "report.html"
            self.record.exit_code = self.exit_code()
            self.record.ended = now_iso()
            self._close(rec, t0)

        self.echo("[report] ...")
        try:
            bundle = write_bundle(self.evidence_dir, self.out, cfg.key, on_rendered=rendered, run=self)
            report_path = bundle.report
            self.echo(f"[report] ok ({bundle.signing.line})")
        except KeyboardInterrupt:
            rec.status, rec.reason = "failed", "interrupted (Ctrl-C)"
            self._close(rec, t0)
            raise
        except Exception as exc:
            rec.status, rec.reason = "failed", one_line(exc)
            self.record.exit_code = self.exit_code()
            self.record.ended = now_iso()
            self._close(rec, t0)
            self.echo(f"[report] failed ({rec.reason})")
        code = self.exit_code()
        return RunResult(self.out, self.record, report_path, code)

    def exit_code(self) -> int:
        # Fail closed: a failed gate, a violated policy, or a stage that could not produce its
        # evidence all mean the claim does not hold as stated.
        for s in self.record.stages:
            if s.verdict == "fail" or s.status == "failed":
                return EXIT_VIOLATION
        return EXIT_OK


def run(config: RunConfig, echo: Callable[[str], None] = lambda s: None) -> RunResult:
    return Runner(config, echo).run()


# --------------------------------------------------------------------------------------------
# adapters to the stage APIs (kept here so a stage's signature change touches one place)


def _first_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


def _build_targets(data: dict | None) -> list[dict]:
    if not data:
        return []
    targets = data.get("targets", [])
    if isinstance(targets, dict):
        return [dict(v, target=v.get("target", k)) for k, v in targets.items()]
    return [t for t in targets if isinstance(t, dict)]


def _resolve_options():
    try:
        from audit.linkage.resolve import ResolveOptions
    except ImportError:
        from audit.linkage.check import ResolveOptions  # type: ignore[no-redef]
    return ResolveOptions()


# A plain sm_XY cubin runs on cc X.y for y >= Y; an arch-specific sm_XYa cubin only on cc X.Y.
def _cubin_runs(cubin: str, major: int, minor: int) -> bool:
    digits = cubin[3:].rstrip("a")
    if len(digits) < 2 or not digits.isdigit():
        return False
    want_major, want_minor = int(digits[:-1]), int(digits[-1])
    if cubin.endswith("a"):
        return (major, minor) == (want_major, want_minor)
    return major == want_major and minor >= want_minor


def _cuda_can_run(target: str, capability: tuple[int, int] | None = None) -> bool:
    if capability is None:
        try:
            import torch

            capability = torch.cuda.get_device_capability()
        except Exception:
            return False
    from audit.build.targets import cuda_cubins

    cubins = cuda_cubins(target) or (target.split("-")[0],)  # the target's own gencode flags
    return any(_cubin_runs(c, *capability) for c in cubins)


def _call_kwargs(fn: Callable, **kwargs):
    """Call fn with the keyword arguments it accepts (stage signatures differ in optional knobs)."""
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _selection(lib_path: str, device: str):
    from audit.evidence.selection import select

    return select(lib=lib_path, device=device)


def run_dtype(device: str) -> str:
    # The CPU path is timed in fp32 (its native type); GPUs in bf16, the video DiTs' precision.
    return "fp32" if device == "cpu" else "bf16"


def _call_parity(parity_mod, lib_path, shapes, device):
    return _call_kwargs(parity_mod.run_parity, selection=_selection(lib_path, device), shapes=shapes,
                        dtype=run_dtype(device), device=device, gates=None, seed=0)


def _call_bench(bench_mod, lib_path, shapes, device, repeats):
    return _call_kwargs(bench_mod.run_bench, selection=_selection(lib_path, device), shapes=shapes,
                        dtype=run_dtype(device), device=device, repeats=repeats, seed=0, progress=False)


def _gate_passed(report) -> bool | None:
    for attr in ("passed", "ok", "gates_passed"):
        v = getattr(report, attr, None)
        if isinstance(v, bool):
            return v
        if callable(v):
            try:
                r = v()
                if isinstance(r, bool):
                    return r
            except TypeError:
                pass
    code = getattr(report, "exit_code", None)
    if isinstance(code, int):
        return code == 0
    return None


def _failed_gates(data: dict) -> str:
    lines = [str(x) for x in data.get("failures") or []]
    return "; ".join(lines[:5]) or "see its evidence file"


class _environ:
    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, {}

    def __enter__(self):
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

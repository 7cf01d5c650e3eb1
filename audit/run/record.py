"""What a run records: its configuration, each stage's status, and run.json (schema run/1).

run.json is rewritten after every stage, so it always says how far the run got.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from audit import __version__
from audit.schemas import RUN

RUN_SCHEMA = "sovereign-audit.run/1"
STAGES = ("environment", "build", "linkage", "parity", "bench", "pipeline", "report")


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
    precision: str = "exact"  # exact | fp8: what parity, bench and the pipeline run our kernel at


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
    precision: str = "exact"  # exact | fp8: what our kernel's evidence was measured at

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "$schema": RUN,
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
            "precision": self.precision,
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

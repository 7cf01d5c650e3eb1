"""The `run` pipeline: environment -> build -> linkage -> parity -> bench -> pipeline -> report.

Every stage runs inside its own guard: a stage whose module is missing or that raises is recorded as
FAILED with a one-line reason and the run goes on with what it has (never swallowed: the report
shows it and the exit code is 1). Each stage's evidence JSON is written atomically (temp file +
rename) the moment the stage completes, and run.json is rewritten after every stage, so a crash or
Ctrl-C loses nothing that was already done.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from audit.kernel_build.builder import BUILT, FAILED, SKIPPED, resolve_targets
from audit.errors import EXIT_OK, EXIT_VIOLATION, UsageError, one_line
from audit.files import now_iso, write_json_atomic
from audit.report.bundle import copy_artifacts, write_bundle
from audit.report.layout import EVIDENCE_FILES, prepare_out
from audit.run import stages
from audit.run.record import STAGES, RunConfig, RunRecord, RunResult, StageRecord

SKIPPABLE = ("parity", "bench", "pipeline")


class Runner:
    """Runs the stages in order, recording each one; see module docstring."""

    def __init__(self, config: RunConfig, echo: Callable[[str], None] = lambda s: None):
        self.config = config
        self.out = config.out
        self.evidence_dir = config.out / "evidence"
        self.echo = echo
        self.record = RunRecord(command=list(config.argv) or ["sovereign-audit", "run"], started=now_iso(),
                                device_requested=config.device, cwd=os.getcwd(), host=stages.host_facts(),
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
        rec.evidence = self.save_evidence("environment", stages.environment())

    def run_build(self, rec: StageRecord) -> None:
        if self.config.no_build:
            return self.skip(rec, "--no-build: our kernel was not built; only --artifact objects are audited")
        result = stages.build(self.config.targets, self.config.build_dir)
        self.results["build"] = result
        data = result.to_dict()
        rec.evidence = self.save_evidence("build", data)
        built, failed = [], []
        for t in result.targets:
            if t.status == BUILT:
                built.append(t.target)
            elif t.status == FAILED:
                failed.append(f"{t.target}: {_first_line(t.reason)}")
            elif t.status == SKIPPED:
                rec.notes.append(f"{t.target} skipped: {_first_line(t.reason)}")
        self.record.targets_built = built
        # Copy the objects into the bundle now: linkage, parity, bench and the pipeline then use
        # exactly the bytes the bundle holds and the attestations name.
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

    def built_libraries(self) -> list[tuple[str, str]]:
        """(target, path of its copy in the bundle) of every target the build stage built."""
        result = self.results.get("build")
        targets = result.targets if result is not None else []
        return [(t.target, self.copies[t.target]) for t in targets
                if t.status == BUILT and t.target in self.copies]

    def audit_paths(self) -> list[str]:
        return [lib for _, lib in self.built_libraries()] + [a.path for a in self.record.artifacts]

    def run_linkage(self, rec: StageRecord) -> None:
        paths = self.audit_paths()
        if not paths:
            return self.skip(rec, "nothing to audit: no built target and no --artifact")
        report = stages.linkage(paths)
        self.results["linkage"] = report
        rec.evidence = self.save_evidence("linkage", report.to_dict())
        if report.exit_code == EXIT_OK:
            rec.verdict = "pass"
        else:
            rec.verdict = "fail"
            rec.reason = ("the sovereignty policy is violated" if report.exit_code == EXIT_VIOLATION
                          else f"an object could not be read or checked (exit {report.exit_code}): fail closed")

    def run_parity(self, rec: StageRecord) -> None:
        self._per_library(rec, "parity", lambda lib: stages.parity(lib, self.record.device, self.config.precision),
                           gated=True)

    def run_bench(self, rec: StageRecord) -> None:
        repeats = self.config.repeats or 10
        self._per_library(rec, "bench", lambda lib: stages.bench(lib, self.record.device, repeats, self.config.precision),
                           gated=False)

    def _per_library(self, rec: StageRecord, stage: str, call: Callable[[str], Any], gated: bool) -> None:
        """The primary library's evidence (ours; with --no-build the first --artifact) goes to
        <stage>.json, another target's to <stage>.<target>.json, an --artifact's to
        <stage>.artifact-N.json. `gated`: the report is a ParityReport whose gates decide the verdict."""
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
            if gated and not report.passed:
                failures.append(f"{label}: " + ("; ".join(report.failure_lines()[:5]) or "see its evidence file"))
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
        report = stages.pipeline(ours[0], self.record.device, self.config.pipeline_preset,
                                 self.config.pipeline_steps, precision=self.config.precision,
                                 checkpoint=lambda r: self.save_evidence("pipeline", r.to_dict()))
        self.results["pipeline"] = report
        rec.evidence = self.save_evidence("pipeline", report.to_dict())
        broken = [f"{r.attention}: {r.reason or r.status}" for r in report.failed_sovereign()]
        if broken:
            rec.status, rec.reason = "failed", "our attention core failed in the pipeline: " + "; ".join(broken)

    # -- the whole run -----------------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.config
        unknown = [s for s in cfg.skip if s not in SKIPPABLE]
        if unknown:
            raise UsageError(f"--skip {unknown[0]!r}: only parity, bench and pipeline can be skipped")
        if cfg.targets and not cfg.no_build:
            resolve_targets(list(cfg.targets))  # an unknown target is a usage error (exit 2)
        self.record.device = stages.resolve_device(cfg.device)
        from audit.evidence import precision as P

        P.require(cfg.precision, self.record.device)  # fp8 where it cannot run: a usage error
        self.record.precision = cfg.precision
        self.record.artifacts = [stages.describe_artifact(Path(p)) for p in cfg.artifacts]
        replaced = prepare_out(self.out)
        if replaced:
            self.echo(replaced)
        for a in self.record.artifacts:
            stages.probe_abi(a)
        self.save_run()

        self.stage("environment", self.run_environment)
        self.stage("build", self.run_build)
        self.stage("linkage", self.run_linkage)
        self.libraries = stages.runnable_libraries(self.record.device, self.built_libraries(),
                                                   self.record.artifacts)
        self.record.targets_run = [t for t, _ in self.libraries if not t.startswith("artifact:")]
        self.stage("parity", self.run_parity)
        self.stage("bench", self.run_bench)
        self.stage("pipeline", self.run_pipeline)
        return self.write_report()

    def write_report(self) -> RunResult:
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
            bundle = write_bundle(self.evidence_dir, self.out, self.config.key, on_rendered=rendered)
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
        return RunResult(self.out, self.record, report_path, self.exit_code())

    def exit_code(self) -> int:
        # Fail closed: a failed gate, a violated policy, or a stage that could not produce its
        # evidence all mean the claim does not hold as stated.
        for s in self.record.stages:
            if s.verdict == "fail" or s.status == "failed":
                return EXIT_VIOLATION
        return EXIT_OK


def run(config: RunConfig, echo: Callable[[str], None] = lambda s: None) -> RunResult:
    return Runner(config, echo).run()


def _first_line(text: str) -> str:
    return " ".join(str(text).split())[:300]

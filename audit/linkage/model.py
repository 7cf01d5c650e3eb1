"""The linkage stage's result: findings per file and the CheckReport.

The output formats (output_*.py) read only this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from audit import __version__
from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from audit.elf.notes import DlopenDecl
from audit.linkage.containers.identity import Container, PackageId
from audit.linkage.resolution.ldso import DepNode

SCHEMA = "sovereign-audit.linkage/1"
KINDS = ("soname", "needed", "transitive", "verneed", "static-symbol", "imported-symbol", "dlopen-string",
         "dlopen-note", "dlsym-string", "assembled-name",
         "device-kernel", "rpath", "unresolved", "mismatch")
WHEEL_SEP = "!/"  # "x.whl!/pkg/lib.so": a member of an archive


@dataclass(slots=True)
class Match:
    """One place where a rule matched and the names it matched there (a symbol table, a fatbin
    entry, a DT_NEEDED edge). `names` may be long (thousands of symbols): it is shared, not copied."""

    names: list[str]
    where: str
    offset: int | None = None
    chain: list[str] | None = None  # set only where it differs from its finding's chain
    detail: str | None = None

    def to_dict(self) -> dict:
        d: dict = {"where": self.where, "names": list(self.names)}
        for k in ("offset", "chain", "detail"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


@dataclass
class Finding:
    rule: str
    kind: str  # one of KINDS
    subject: str  # what matched: a library name, a symbol, a string, a kernel
    where: str  # where it was found: "DT_NEEDED", ".dynsym", ".rodata @0x1f20" (file offset), ...
    reason: str
    use_instead: str | None = None
    severity: str = "fail"  # "fail" | "warn"
    chain: list[str] = field(default_factory=list)  # audited file -> ... -> the library
    in_file: str | None = None  # the dependency it was found in (None: the audited file)
    offset: int | None = None  # file offset of the evidence, where it has one
    count: int = 1  # how many names of this kind this rule matched here (all places)
    examples: list[str] = field(default_factory=list)  # a few more of them (distinct, after `subject`)
    detail: str | None = None
    matches: list[Match] = field(default_factory=list)  # every place and name (group.py fills it)
    matches_in: str | None = None  # matches left out: listed under that audited file's own result
    distinct_names: int | None = None  # set when grouped: kept when `matches` is left out
    excepted: str | None = None  # the reason of the policy exception that waives it
    exception_expired: str | None = None  # the date an exception that would waive it expired
    baseline: str | None = None  # with --baseline: "new" or "unchanged" (known, kept out of the verdict)

    @classmethod
    def from_rule(cls, rule, policy, kind: str, subject: str, where: str, chain: list[str], **kw) -> "Finding":
        """A finding of `rule` (a policy.Rule): its id, reason, advice and severity copied in one place."""
        return cls(rule=rule.id, kind=kind, subject=subject, where=where, reason=rule.reason,
                   use_instead=rule.use_instead, severity=policy.severity(rule.id), chain=list(chain), **kw)

    @property
    def failing(self) -> bool:
        return self.severity == "fail" and self.excepted is None and self.baseline != "unchanged"

    @property
    def message(self) -> str:
        """One line (untrusted parts unescaped: renderers escape)."""
        text = f"{self.kind} {self.subject} ({self.where})"
        if self.in_file:
            text += f" in {self.in_file}"
        if len(self.chain) > 1:
            text += f" via {' -> '.join(self.chain)}"
        if self.count > 1:
            text += f" and {self.count - 1} more"
        return text

    @property
    def distinct(self) -> int:
        """How many different names matched (a kernel built for two targets is one name)."""
        if self.distinct_names is not None:
            return self.distinct_names
        if not self.matches:
            return self.count
        return len({n for m in self.matches for n in m.names})

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("rule", "kind", "subject", "where", "reason", "use_instead",
                                          "severity", "chain", "in_file", "offset", "count", "examples", "detail",
                                          "excepted", "exception_expired")}
        if self.baseline is not None:
            d["baseline"] = self.baseline
        d["distinct"] = self.distinct
        d["failing"] = self.failing
        d["message"] = self.message
        d["matches"] = [m.to_dict() for m in self.matches]
        if self.matches_in:
            d["matches_in"] = self.matches_in
        return d


@dataclass
class FileResult:
    path: str  # as reported: a path given or found, or "x.whl!/pkg/lib.so"
    verdict: str  # "pass" | "fail" | "error"
    sha256: str | None = None
    size: int | None = None
    elf_class: int | None = None
    machine: str | None = None
    elf_type: str | None = None
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    version_needs: list[str] = field(default_factory=list)
    device_targets: list[str] = field(default_factory=list)
    tree: DepNode | None = None
    layer: dict | None = None  # in a container image: the layer that added the file (index, digest, created_by)
    archive: str | None = None  # the wheel, conda package or image it is a member of (the file on disk)
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    format: str | None = None  # "pe" | "macho"; None: ELF
    slices: list[str] | None = None  # a universal Mach-O binary's slices, each judged
    package: PackageId | None = None  # what the file says it is (.note.package), where it says
    dlopen_declared: list[DlopenDecl] = field(default_factory=list)  # libraries its .note.dlopen declares

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.failing]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("path", "verdict", "sha256", "size", "elf_class", "machine",
                                          "elf_type", "soname", "needed", "rpath", "runpath",
                                          "version_needs", "device_targets", "warnings", "error")}
        if self.format is not None:  # ELF results keep their fields as they were
            d["format"] = self.format
        if self.slices is not None:
            d["slices"] = list(self.slices)
        if self.layer is not None:
            d["layer"] = dict(self.layer)
        d["resolved"] = self.tree.to_dict() if self.tree else None
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


@dataclass
class CheckReport:
    files: list[FileResult]
    policy: dict  # {"name", "sources"}
    options: dict
    inputs: list[str]
    # why -> count: non_elf, tar, archive, broken_symlink, not_regular, duplicate, ...
    skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # run-level: e.g. no ELF file found (exit 3)
    elapsed_s: float = 0.0
    timing: bool = False  # report elapsed_s: off by default, so the same input gives the same bytes
    tool_version: str = __version__
    schema: str = SCHEMA
    baseline: dict | None = None  # with --baseline: {"file", "new", "unchanged", "absent": [{rule, kind, subject, path}]}
    # the wheels, conda packages and images audited files came from (filled for outputs that name
    # them: the SBOMs), by FileResult.archive
    containers: list[Container] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """3 if any file could not be audited or none was found (fail closed), else 1 on a
        violation, else 0."""
        if self.errors or not self.files or any(f.verdict == "error" for f in self.files):
            return EXIT_INPUT
        if any(f.verdict == "fail" for f in self.files):
            return EXIT_VIOLATION
        return EXIT_OK

    @property
    def verdict(self) -> str:
        """"pass" | "fail" | "error" for the whole run (same precedence as exit_code)."""
        return {EXIT_OK: "pass", EXIT_VIOLATION: "fail"}.get(self.exit_code, "error")

    @property
    def summary(self) -> dict:
        count = {v: sum(f.verdict == v for f in self.files) for v in ("pass", "fail", "error")}
        return {"files": len(self.files), **count,
                "findings": sum(len(f.failing) for f in self.files), "skipped": dict(self.skipped)}

    def to_dict(self) -> dict:
        d = {"schema": self.schema, "tool": {"name": "sovereign-audit", "version": self.tool_version},
             "policy": self.policy, "options": self.options, "inputs": self.inputs,
             "exit_code": self.exit_code, "verdict": self.verdict, "summary": self.summary,
             "errors": self.errors, "warnings": self.warnings}
        if self.timing:
            d["elapsed_s"] = round(self.elapsed_s, 3)
        d["files"] = [f.to_dict() for f in self.files]
        if self.baseline is not None:
            d["baseline"] = self.baseline
        return d

"""`check`: findings per file and the CheckReport (the linkage stage's result).

For every audited ELF file: the dependency tree (resolve.py) and the evidence that a denied
library is linked, loaded or embedded: needed / transitive / verneed / static-symbol /
imported-symbol / dlopen-string / device-kernel / rpath, plus the built-in unresolved and
NEEDED-vs-verneed mismatch checks. Libraries the tree descends into are scanned the same way
(their findings carry the chain). Fail closed: a file, dependency or device-code entry that
cannot be parsed makes the file's verdict `error` (exit 3), never `pass`.
"""

from __future__ import annotations

import datetime as _dt
import heapq
import os
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

from audit import __version__
from audit.elf.model import ElfInfo
from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from audit.linkage.policy import RULE_MISMATCH, RULE_UNRESOLVED, Policy
from audit.linkage.resolve import DepNode, ResolveOptions, Resolver, TreeTooLarge, probe

SCHEMA = "sovereign-audit.linkage/1"
KINDS = ("soname", "needed", "transitive", "verneed", "static-symbol", "imported-symbol", "dlopen-string",
         "device-kernel", "rpath", "unresolved", "mismatch")
_MAX_EXAMPLES = 10
_MAX_DIR_LIST = 20000  # entries looked at per RPATH/RUNPATH directory
_MAX_WHEEL_MEMBERS = 200_000
_MAX_WHEEL_BYTES = 32 << 30  # declared uncompressed size of the ELF members we extract
WHEEL_SEP = "!/"


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
    count: int = 1  # how many names of this kind this rule matched here
    examples: list[str] = field(default_factory=list)  # a few more of them
    detail: str | None = None
    excepted: str | None = None  # the reason of the policy exception that waives it
    exception_expired: str | None = None  # the date an exception that would waive it expired

    @property
    def failing(self) -> bool:
        return self.severity == "fail" and self.excepted is None

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

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("rule", "kind", "subject", "where", "reason", "use_instead",
                                          "severity", "chain", "in_file", "offset", "count", "examples", "detail",
                                          "excepted", "exception_expired")}
        d["failing"] = self.failing
        d["message"] = self.message
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
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.failing]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("path", "verdict", "sha256", "size", "elf_class", "machine",
                                          "elf_type", "soname", "needed", "rpath", "runpath",
                                          "version_needs", "device_targets", "warnings", "error")}
        d["resolved"] = self.tree.to_dict() if self.tree else None
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


@dataclass
class CheckReport:
    files: list[FileResult]
    policy: dict  # {"name", "sources"}
    options: dict
    inputs: list[str]
    skipped: dict[str, int] = field(default_factory=dict)  # non_elf, broken_symlink, duplicate
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    tool_version: str = __version__
    schema: str = SCHEMA

    @property
    def exit_code(self) -> int:
        """3 if any file could not be audited or none was found (fail closed), else 1 on a
        violation, else 0."""
        if not self.files or any(f.verdict == "error" for f in self.files):
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
        return {"schema": self.schema, "tool": {"name": "sovereign-audit", "version": self.tool_version},
                "policy": self.policy, "options": self.options, "inputs": self.inputs,
                "exit_code": self.exit_code, "verdict": self.verdict, "summary": self.summary, "warnings": self.warnings,
                "elapsed_s": round(self.elapsed_s, 3), "files": [f.to_dict() for f in self.files]}


# ---------------------------------------------------------------- reading


def _default_read_elf():
    from audit.elf.reader import read_elf  # the ELF engineer's reader (imported lazily)

    return read_elf


class CachedReader:
    """read_elf with the policy's symbol filter, cached by real path for the whole run."""

    def __init__(self, policy: Policy, read_elf: Callable | None = None):
        self._read_elf = read_elf or _default_read_elf()
        self._pattern = policy.symbol_pattern
        self._cache: dict[str, ElfInfo | Exception] = {}

    def __call__(self, path: str) -> ElfInfo:
        real = os.path.realpath(path)
        hit = self._cache.get(real)
        if hit is None:
            try:
                hit = self._read_elf(real, symbol_pattern=self._pattern)
            except Exception as exc:  # remembered: the same bad file is reported once per use
                hit = exc
            self._cache[real] = hit
        if isinstance(hit, Exception):
            raise hit
        return hit


def _error_text(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.strerror:
        msg = exc.strerror
    return msg if getattr(exc, "exit_code", None) else f"cannot parse ({type(exc).__name__}): {msg}"


# ---------------------------------------------------------------- inputs


@dataclass
class _Input:
    report: str  # the path as reported
    host: str | None  # where to read it (None: error already known)
    explicit: bool  # named on the command line (a non-ELF file is then an error, not a skip)
    error: str | None = None


class _Inputs:
    """Expands PATH arguments into ELF files: files, directory trees, wheels."""

    def __init__(self):
        self.skipped: dict[str, int] = {}
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.tmpdirs: list[tempfile.TemporaryDirectory] = []

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def expand(self, arg: str):
        try:
            st = os.stat(arg)
        except OSError as exc:
            yield _Input(arg, None, True, f"cannot read: {exc.strerror or exc}")
            return
        if stat.S_ISDIR(st.st_mode):
            yield from self._walk(arg)
        elif not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            yield _Input(arg, None, True, "not a regular file")
        elif arg.endswith(".whl"):
            yield from self._wheel(arg, arg)
        else:
            yield from self._file(arg, arg, explicit=True)

    def _file(self, report: str, host: str, explicit: bool):
        real = os.path.realpath(host)
        if real in self.seen:
            self.skip("duplicate")
            return
        self.seen.add(real)
        try:
            with open(host, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            yield _Input(report, None, explicit, f"cannot read: {exc.strerror or exc}")
            return
        if magic == b"\x7fELF":
            yield _Input(report, host, explicit)
        elif magic == b"!<ar" and explicit:
            yield _Input(report, None, True, "a static archive (ar), not an ELF file: audit the object it is linked into")
        elif magic == b"!<ar":  # a static archive: its members are not audited, so say so
            self.skip("archive")
            self.warnings.append(f"{report}: static archive (ar) not audited; audit the object it is linked into")
        elif explicit:
            yield _Input(report, None, True, "not an ELF file" + (" (empty)" if not magic else ""))
        else:
            self.skip("non_elf")

    def _walk(self, top: str):
        def onerror(exc: OSError):
            self.warnings.append(f"cannot list {exc.filename}: {exc.strerror}")
            self.skip("unreadable_dir")

        for dirpath, dirnames, filenames in os.walk(top, onerror=onerror, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if os.path.islink(full) and not os.path.exists(full):
                    self.skip("broken_symlink")
                    self.warnings.append(f"{full}: broken symlink or symlink loop, skipped")
                    continue
                if not os.path.isfile(full):
                    self.skip("not_regular")
                    continue
                if name.endswith(".whl"):
                    yield from self._wheel(full, full)
                else:
                    yield from self._file(full, full, explicit=False)

    def _wheel(self, report: str, host: str):
        tmp = tempfile.TemporaryDirectory(prefix="sovereign-audit-wheel-")
        self.tmpdirs.append(tmp)
        try:
            with zipfile.ZipFile(host) as zf:
                members = zf.infolist()
                if len(members) > _MAX_WHEEL_MEMBERS:
                    yield _Input(report, None, True, f"wheel has {len(members)} members (limit {_MAX_WHEEL_MEMBERS})")
                    return
                total = 0
                extracted = []
                for m in members:
                    if m.is_dir():
                        continue
                    inner = f"{report}{WHEEL_SEP}{m.filename}"
                    parts = m.filename.split("/")
                    if m.filename.startswith("/") or "\\" in m.filename or ".." in parts or "" in parts[:-1]:
                        yield _Input(inner, None, True, "unsafe member path in wheel")
                        continue
                    with zf.open(m) as fh:
                        if fh.read(4) != b"\x7fELF":
                            self.skip("non_elf")
                            continue
                    total += m.file_size
                    if total > _MAX_WHEEL_BYTES:
                        yield _Input(inner, None, True, "wheel's ELF members exceed the size limit")
                        return
                    dest = os.path.join(tmp.name, *parts)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with zf.open(m) as src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    extracted.append((inner, dest))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
            yield _Input(report, None, True, f"cannot read wheel: {' '.join(str(exc).split())}")
            return
        for inner, dest in extracted:
            self.seen.add(os.path.realpath(dest))
            yield _Input(inner, dest, True)

    def cleanup(self) -> None:
        for tmp in self.tmpdirs:
            tmp.cleanup()


# ---------------------------------------------------------------- scanning one object


def scan_object(info: ElfInfo, policy: Policy, chain: list[str], in_file: str | None) -> tuple[list[Finding], list[str]]:
    """Content evidence in one object (no tree): (findings, errors that make it unauditable)."""
    findings: list[Finding] = []
    errors: list[str] = []

    def add(rule, kind, subject, where, **kw):
        findings.append(Finding(rule=rule.id, kind=kind, subject=subject, where=where, reason=rule.reason,
                                use_instead=rule.use_instead, severity=policy.severity(rule.id),
                                chain=list(chain), in_file=in_file, **kw))

    needed = set(info.needed)
    for vn in info.version_needs:
        rule = policy.deny_rule_for_soname(vn.file)
        if rule:
            add(rule, "verneed", vn.file, ".gnu.version_r", examples=list(vn.versions[:_MAX_EXAMPLES]))
        if vn.file not in needed:
            add(policy.rule(RULE_MISMATCH), "mismatch", vn.file, ".gnu.version_r",
                examples=list(vn.versions[:_MAX_EXAMPLES]),
                detail="versioned imports name a file that DT_NEEDED does not list")

    # Set operations, not a Python loop per symbol: libtorch_cpu brings ~85k vendor names.
    syms = info.symbols
    by_name = policy.classify_symbols(s.name for s in syms)
    if by_name:
        defined = {s.name for s in syms if s.defined}
        imported = {s.name for s in syms if not s.defined}
        in_table = {t: {s.name for s in syms if s.table == t} for t in {s.table for s in syms}}
        groups: dict[tuple, list[str]] = {}
        for name, rule in by_name.items():
            if name in defined:
                groups.setdefault((rule.id, "static-symbol"), []).append(name)
            if name in imported:
                groups.setdefault((rule.id, "imported-symbol"), []).append(name)
        for (rid, kind), names in groups.items():
            tables = [t for t, members in sorted(in_table.items()) if not members.isdisjoint(names)]
            # .symtab spells versioned imports "name@VERSION": one name, not two
            base = {n.split("@", 1)[0] or n if "@" in n else n for n in names}
            first = heapq.nsmallest(_MAX_EXAMPLES, base)  # not a full sort of ~30k long names
            add(policy.rule(rid), kind, first[0], ", ".join(tables), count=len(base), examples=first[1:])

    loader = ", ".join(info.code_loading_imports[:4])
    strings: dict[tuple, list] = {}
    for hit in info.library_strings:
        rule = policy.rule_for_string(hit.text)
        if rule:
            strings.setdefault((rule.id, hit.text), []).append(hit)
    for (rid, text), hits in strings.items():
        add(policy.rule(rid), "dlopen-string", text, f"{hits[0].section} @0x{hits[0].offset:x}", count=len(hits),
            offset=hits[0].offset if in_file is None else None,
            detail=f"imports {loader}" if loader else "no code-loading import seen")

    for dc in info.device_code:
        where = f"{dc.section} @0x{dc.offset:x} {dc.kind} {dc.target}"
        if dc.error:
            errors.append(f"device code at {where}: {dc.error}")
        kern: dict[str, list[str]] = {}
        for name in dc.kernels:
            rule = policy.rule_for_kernel(name)
            if rule:
                kern.setdefault(rule.id, []).append(name)
        for rid, names in kern.items():
            add(policy.rule(rid), "device-kernel", names[0], where, count=len(names),
                offset=dc.offset if in_file is None else None,
                examples=names[1:_MAX_EXAMPLES])
    return findings, errors


def _rpath_findings(node: DepNode, resolver: Resolver, policy: Policy, chain: list[str]) -> list[Finding]:
    """RPATH/RUNPATH directories that hold a denied library: the object can load it by name.

    System directories are left out: ld.so searches them anyway, so a libblas.so among the
    thousands of files in /usr/lib/<triplet> says nothing about this object ($ORIGIN of a system
    library is such a directory).
    """
    out: list[Finding] = []
    got = probe(node.realpath or node.path or "")
    for tag, entry, d in resolver.own_dirs(node):
        if got and resolver.is_system_dir(d, got[0], got[2]):
            continue
        try:
            with os.scandir(d) as it:
                names = sorted(e.name for _, e in zip(range(_MAX_DIR_LIST), it))
        except OSError:
            continue
        for name in names:
            rule = policy.deny_rule_for_soname(name)
            if rule and ".so" in name:
                out.append(Finding(rule=rule.id, kind="rpath", subject=name, where=f"{tag} {entry}",
                                   reason=rule.reason, use_instead=rule.use_instead, chain=list(chain),
                                   in_file=None if len(chain) <= 1 else node.path,
                                   detail=f"directory {d} holds it"))
                break
    return out


def _tree_findings(tree: DepNode, resolver: Resolver, policy: Policy) -> tuple[list[Finding], list[str]]:
    findings: list[Finding] = []
    errors: list[str] = []
    for node, chain in tree.walk():
        names = [n.name for n in chain]
        depth = len(chain) - 1
        if node.status == "denied":
            rule = policy.rule(node.rule)
            kind = "needed" if depth == 1 else "transitive"
            where = "DT_NEEDED" + (f" of {chain[-2].name}" if depth > 1 else "")
            detail = f"found at {node.path} ({node.how})" if node.path else "not found on this system"
            findings.append(Finding(rule=rule.id, kind=kind, subject=node.name, where=where, reason=rule.reason,
                                    use_instead=rule.use_instead, chain=names,
                                    detail=detail + (f"; {node.note}" if node.note and node.path else "")))
        elif node.status == "unresolved":
            rule = policy.rule(RULE_UNRESOLVED)
            findings.append(Finding(rule=rule.id, kind="unresolved", subject=node.name,
                                    where="DT_NEEDED" + (f" of {chain[-2].name}" if depth > 1 else ""),
                                    reason=rule.reason, use_instead=rule.use_instead,
                                    severity=policy.severity(rule.id), chain=names))
        elif node.status == "error":
            errors.append(f"dependency {node.name} ({node.path}) could not be parsed: {node.note}")
        if node.info is not None and node.status in ("root", "inspected", "unlisted"):
            if depth > 0:
                more, errs = scan_object(node.info, policy, names, node.path)
                findings += more
                errors += errs
            findings += _rpath_findings(node, resolver, policy, names)
    return findings, errors


def _apply_exceptions(result: FileResult, policy: Policy, used: set[int], today: _dt.date) -> None:
    for finding in result.findings:
        if finding.severity != "fail":
            continue
        for i, exc in enumerate(policy.exceptions):
            if exc.matches(result.path, finding.rule):
                used.add(i)
                if exc.expired(today):
                    finding.exception_expired = exc.expires.isoformat()
                else:
                    finding.excepted = exc.reason
                    break


# ---------------------------------------------------------------- the stage API


def check_file(inp: _Input, policy: Policy, resolver: Resolver, read: Callable[[str], ElfInfo]) -> FileResult:
    if inp.host is None:
        return FileResult(path=inp.report, verdict="error", error=inp.error)
    try:
        info = read(inp.host)
    except Exception as exc:
        return FileResult(path=inp.report, verdict="error", error=_error_text(exc))
    result = FileResult(
        path=inp.report, verdict="pass", sha256=info.sha256, size=info.size, elf_class=info.elf_class,
        machine=info.machine, elf_type=info.elf_type, soname=info.soname, needed=list(info.needed),
        rpath=list(info.rpath), runpath=list(info.runpath),
        version_needs=[vn.file for vn in info.version_needs],
        device_targets=sorted({dc.target for dc in info.device_code if dc.kind not in ("host", "unknown")}),
        warnings=list(info.warnings),
    )
    errors: list[str] = []
    findings, errs = scan_object(info, policy, [os.path.basename(inp.report)], None)
    # the audited object is itself a denied library (e.g. a vendor .so shipped inside a wheel)
    for where, name in (("DT_SONAME", info.soname), ("file name", os.path.basename(inp.report))):
        rule = policy.deny_rule_for_soname(name) if name else None
        if rule:
            findings.insert(0, Finding(rule=rule.id, kind="soname", subject=name, where=where, reason=rule.reason,
                                       use_instead=rule.use_instead, chain=[os.path.basename(inp.report)]))
            break
    errors += errs
    try:
        tree, warns = resolver.tree(info, inp.host)
        tree.name = os.path.basename(inp.report)
        result.tree = tree
        result.warnings += warns
        more, errs = _tree_findings(tree, resolver, policy)
        findings += more
        errors += errs
    except TreeTooLarge as exc:
        errors.append(str(exc))
    result.findings = findings
    if errors:
        result.verdict, result.error = "error", "; ".join(errors)
    return result


def check_paths(paths, policy: Policy, options: ResolveOptions | None = None, *,
                read_elf: Callable | None = None, today: _dt.date | None = None) -> CheckReport:
    """Audit every ELF file under `paths` (files, directories, wheels) against `policy`."""
    start = time.perf_counter()
    options = options or ResolveOptions()
    today = today or _dt.datetime.now(_dt.timezone.utc).date()
    read = CachedReader(policy, read_elf)
    resolver = Resolver(options, policy, read)
    inputs = _Inputs()
    files: list[FileResult] = []
    used: set[int] = set()
    try:
        for arg in paths:
            for inp in inputs.expand(str(arg)):
                result = check_file(inp, policy, resolver, read)
                _apply_exceptions(result, policy, used, today)
                if result.verdict == "pass" and result.failing:
                    result.verdict = "fail"
                files.append(result)
    finally:
        inputs.cleanup()
    warnings = list(resolver.warnings) + inputs.warnings
    if not files:
        warnings.append("no ELF file found in: " + ", ".join(str(p) for p in paths))
    for i, exc in enumerate(policy.exceptions):
        if i not in used:
            state = " (and it has expired)" if exc.expired(today) else ""
            warnings.append(f"{exc.source}: exception for rule {exc.rule} on '{exc.file}' matches nothing{state}")
    return CheckReport(
        files=files, policy={"name": policy.name, "sources": policy.sources}, options=options.to_dict(),
        inputs=[str(p) for p in paths], skipped=inputs.skipped, warnings=warnings,
        elapsed_s=time.perf_counter() - start,
    )

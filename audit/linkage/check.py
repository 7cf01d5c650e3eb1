"""`check`: the linkage stage's API. Expands the inputs (inputs.py), reads each ELF file once,
resolves its tree (resolve.py), judges it (scan.py) and returns a CheckReport (model.py).

For every audited ELF file: the dependency tree (resolve.py) and the evidence that a denied
library is linked, loaded or embedded: needed / transitive / verneed / static-symbol /
imported-symbol / dlopen-string / static-string / device-kernel, plus the built-in unresolved and
NEEDED-vs-verneed mismatch checks and the rpath note (a denied library in a search directory
that the object may dlopen). Libraries the tree descends into are scanned the same way
(their findings carry the chain). Fail closed: a file, dependency or device-code entry that
cannot be parsed makes the file's verdict `error` (exit 3), never `pass`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import time
from collections.abc import Callable

from audit.elf.model import ElfInfo
from audit.linkage.resolution.fs import HOST, FileSystem, on_host
from audit.linkage.judging.group import group_findings
from audit.linkage.containers.identity import note_package, stamp_tree
from audit.linkage.containers.inputs import ArchiveLimits, Input, Inputs, Scope
from audit.linkage.model import CheckReport, FileResult, Finding
from audit.linkage.parallel import cpu_count, map_ordered
from audit.linkage.judging.policy import Policy
from audit.linkage.resolution.native import format_of, resolver_for
from audit.linkage.resolution.ldso import DepNode, Paths, ResolveOptions, Resolver, TreeTooLarge
from audit.linkage.judging.scan import prejudge, scan_object, tree_findings

__all__ = ["CachedReader", "CheckReport", "FileResult", "Finding", "ResolveOptions", "check_file", "check_paths"]


# ---------------------------------------------------------------- reading


def _default_read_elf():
    # ELF files go to read_elf as they are; PE and Mach-O files to their readers. The ELF reader
    # is imported here, before any file is read, so a missing package (numpy) is named at once
    # (exit 2), not reported as every file's own error.
    import audit.elf.reader  # noqa: F401
    from audit.linkage.resolution.native import read_binary

    return read_binary


class CachedReader:
    """read_elf with the policy's symbol filter, cached by real path for the whole run (one per
    file system: this machine's, or an image's)."""

    def __init__(self, policy: Policy, read_elf: Callable | None = None, fs: FileSystem = HOST,
                 sha256: bool = True):
        self._read_elf = read_elf or (_default_read_elf() if fs is HOST else fs.read_elf)
        self._pattern = policy.symbol_pattern
        # vendor API names as strings (dlsym evidence)
        self._more = {"api_prefixes": policy.api_prefixes} if read_elf is None else {}
        if not sha256 and read_elf is None and fs is HOST:  # no output shows the files' hashes
            self._more["sha256"] = False
        if read_elf is None and policy.markers:  # vendor text kept in the data-string pass (images too)
            self._more["markers"] = policy.markers
        if read_elf is None and fs is HOST:  # while the reader's helpers read: the policy's other
            # regexes compiled, then the symbols' basis for judging made (audit.linkage.judging.scan)
            self._more["meanwhile"] = policy.prepare
            self._more["on_symbols"] = functools.partial(prejudge, policy)
        self._real = os.path.realpath if fs is HOST else (lambda p, paths=Paths(None, fs): paths.real(p) or p)
        self._cache: dict[str, ElfInfo | Exception] = {}

    def __call__(self, path: str) -> ElfInfo:
        real = self._real(path)
        hit = self._cache.get(real)
        if hit is None:
            try:
                hit = self._read_elf(real, symbol_pattern=self._pattern, **self._more)
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


def _name_members(files: list[FileResult], hosts: dict[str, str], inputs: Inputs,
                  in_image: dict[int, tuple[str, FileSystem]]) -> None:
    """Report names, not host paths: a wheel's members as `WHEEL!/member` (never the temporary
    folder they were read from), and a dependency that is itself audited in this run by the name
    its own result has; its matches are listed there once, not again under every file that loads
    it (libtorch_cpu's 85k vendor symbols would otherwise be copied into each torch extension)."""
    for fr in files:
        if id(fr) in in_image:
            _name_image_paths(fr, *in_image[id(fr)], {r.path for r in files})
            continue
        for f in fr.findings:
            shown = hosts.get(os.path.realpath(f.in_file)) if f.in_file else None
            if shown:
                f.in_file = f.matches_in = shown
                f.matches = []
            else:
                f.in_file = inputs.relabel(f.in_file)
            f.detail = inputs.relabel(f.detail)
            for m in f.matches:
                m.detail = inputs.relabel(m.detail)
        if fr.tree is not None:
            for node, _ in fr.tree.walk():
                node.path, node.realpath = inputs.relabel(node.path), inputs.relabel(node.realpath)
                node.note, node.via = inputs.relabel(node.note), inputs.relabel(node.via)
        fr.warnings = [inputs.relabel(w) for w in fr.warnings]
        fr.error = inputs.relabel(fr.error)


def _name_image_paths(fr: FileResult, label: str, fs: FileSystem, audited: set[str]) -> None:
    """An image's own paths (`/usr/lib/libx.so`) as `IMAGE!/usr/lib/libx.so`, as its audited files
    are named; a dependency audited in the same run keeps its matches under its own result."""
    paths = Paths(None, fs)

    def name(path: str | None) -> str | None:
        return f"{label}!{path}" if path and path.startswith("/") else path

    for f in fr.findings:
        if f.in_file:
            real = name(paths.real(f.in_file) or f.in_file)
            f.in_file = name(f.in_file)
            if real in audited:
                f.matches_in = real
                f.matches = []
    if fr.tree is not None:
        for node, _ in fr.tree.walk():
            node.path, node.realpath = name(node.path), name(node.realpath)


_OWN_NAME = {"elf": "DT_SONAME", "pe": "export directory name", "coff": "export directory name",
             "macho": "LC_ID_DYLIB", "python": "module name"}


def check_file(inp: Input, policy: Policy, resolver: Resolver, read: Callable[[str], ElfInfo]) -> FileResult:
    if inp.read_from is None:
        return FileResult(path=inp.shown, verdict="error", error=inp.error, archive=inp.archive)
    try:
        info = read(inp.read_from)
    except Exception as exc:
        return FileResult(path=inp.shown, verdict="error", error=_error_text(exc), archive=inp.archive)
    slices = info if isinstance(info, list) else [info]  # a universal Mach-O binary: each slice judged
    first = slices[0]
    fmt = format_of(first)
    resolver = resolver_for(resolver, first)
    result = FileResult(
        path=inp.shown, verdict="pass", sha256=first.sha256 or None, size=first.size,
        elf_class=first.elf_class if fmt == "elf" else first.bits,
        machine=first.machine, elf_type=first.elf_type if fmt == "elf" else first.file_type,
        soname=first.soname, needed=list(dict.fromkeys(n for s in slices for n in s.needed)),
        rpath=list(dict.fromkeys(r for s in slices for r in s.rpath)), runpath=list(first.runpath),
        version_needs=[vn.file for vn in first.version_needs],
        device_targets=sorted({dc.target for s in slices for dc in s.device_code if dc.kind not in ("host", "unknown")}),
        warnings=[w for s in slices for w in s.warnings], layer=inp.layer, archive=inp.archive,
        format=None if fmt == "elf" else fmt,
        slices=[s.slice for s in slices] if len(slices) > 1 else None,
        package=note_package(getattr(first, "package_note", None)) or inp.package,
        dlopen_declared=list(getattr(first, "dlopen_declared", ())),
    )
    name = os.path.basename(inp.shown)
    findings: list[Finding] = []
    errors: list[str] = []
    trees = []
    for one in slices:
        found, errs = scan_object(one, policy, [name], None)
        errors += errs
        # the audited object is itself a denied library (e.g. a vendor .so shipped inside a wheel)
        for where, own in ((_OWN_NAME[fmt], one.soname), ("file name", name)):
            rule = policy.deny_rule_for_soname(own) if own else None
            if rule:
                found.insert(0, Finding.from_rule(rule, policy, "soname", own, where, [name]))
                break
        try:
            tree, warns = resolver.tree(one, inp.read_from, members=inp.members)
            tree.name = name
            trees.append(tree)
            if first.sha256:  # hashed for an output that shows it (an SBOM): each library's too
                stamp_tree(tree, inp.scope is None or on_host(inp.scope.fs))
            result.warnings += [w for w in warns if w not in result.warnings]
            more, errs = tree_findings(tree, resolver, policy)
            found += more
            errors += errs
        except TreeTooLarge as exc:
            errors.append(str(exc))
        if len(slices) > 1:  # every finding names the slice it is in
            for f in found:
                f.where = f"{f.where} [slice {one.slice}]"
                for m in f.matches:
                    m.where = f"{m.where} [slice {one.slice}]"
            if trees and trees[-1].name == name:
                trees[-1].name = f"{name} [slice {one.slice}]"
        findings += found
    if len(trees) == 1:
        result.tree = trees[0]
    elif trees:  # the slices side by side under the file
        result.tree = DepNode(name=name, status="root", path=inp.read_from, children=trees)
    result.findings = group_findings(findings)
    if errors:
        result.verdict, result.error = "error", "; ".join(errors)
    return result


_PARALLEL_MIN_BYTES = 32 << 20  # below this much to read, starting workers costs more than it saves


def _check_all(items: list[Input], check_one: Callable[[Input], FileResult], jobs: int | None) -> list[FileResult]:
    """check_one over every input, in input order. Files are independent and go to worker
    processes, the largest first: files on this machine's file system, and files in an image's
    uncompressed layers (read in place through the archive a worker inherits); files of a
    compressed layer are checked here, one after another (the layer is decompressed once)."""
    results: list[FileResult | None] = [None] * len(items)
    forkable = [i for i, inp in enumerate(items)
                if inp.read_from is not None and (inp.scope is None or inp.scope.fs.shareable(inp.read_from))]
    sizes = {i: (items[i].scope.fs if items[i].scope else HOST).size(items[i].read_from) for i in forkable}
    if jobs is None:
        jobs = cpu_count() if sum(sizes.values()) >= _PARALLEL_MIN_BYTES else 1
    if jobs > 1 and len(forkable) > 1:
        order = sorted(range(len(forkable)), key=lambda k: -sizes[forkable[k]])
        audited = {os.path.realpath(items[i].read_from) for i in forkable if items[i].scope is None
                   or on_host(items[i].scope.fs)}
        in_images: dict[int, set[str]] = {}  # an image's own paths audited in this run, per image
        for inp in items:
            if inp.scope is not None and not on_host(inp.scope.fs) and inp.read_from is not None:
                in_images.setdefault(id(inp.scope.fs), set()).add(inp.read_from)
        done = map_ordered(_shipped(check_one, audited, in_images), [items[i] for i in forkable], jobs, order)
        for i, result in zip(forkable, done):
            results[i] = result
    for i, inp in enumerate(items):
        if results[i] is None:
            results[i] = check_one(inp)
    return results  # type: ignore[return-value]


def _shipped(check_one, audited: set[str], in_images: dict[int, set[str]]):
    """check_one for a worker: the result without what the parent drops anyway, which would
    cost more to send back than the check itself: the parsed objects its tree holds, and the
    matches of findings in a dependency audited in this run too (_name_members lists them
    under that file once: libtorch_cpu's ~85k vendor names would otherwise travel back with
    each of the 131 torch files that load it). `audited`: the real paths of this machine's
    files in the run; `in_images`: each image's own audited paths (by id of its file system)."""
    def run(inp: Input) -> FileResult:
        result = check_one(inp)
        if result.tree is not None:
            for node, _ in result.tree.walk():
                node.info = None
        if inp.scope is None or on_host(inp.scope.fs):  # _name_members' own condition
            for f in result.findings:
                if f.in_file and os.path.realpath(f.in_file) in audited:
                    f.matches = []
        else:  # _name_image_paths' condition, on the image's own paths
            own, paths = in_images.get(id(inp.scope.fs), set()), Paths(None, inp.scope.fs)
            for f in result.findings:
                if f.in_file and (paths.real(f.in_file) or f.in_file) in own:
                    f.matches = []
        return result
    return run


def check_paths(paths, policy: Policy, options: ResolveOptions | None = None, *,
                read_elf: Callable | None = None, today: _dt.date | None = None,
                jobs: int | None = None, limits: ArchiveLimits | None = None, timing: bool = False,
                sha256: bool = True) -> CheckReport:
    """Audit every ELF file under `paths` (files, directories, wheels, conda packages, container
    images) against `policy`.

    `jobs`: processes to audit files on this machine's file system with (None: one per core
    when there is enough to do); the report is the same for any number. `limits`: what an
    archive member may unpack to (ArchiveLimits' defaults when None). `timing`: the report
    carries the elapsed time (then two runs no longer give the same bytes). `sha256=False`: the
    files on this machine are not hashed (FileResult.sha256 stays None), for outputs that show
    no hash: hashing libtorch_cpu.so's 434 MB is ~0.3 s of CPU, more than any other step."""
    start = time.perf_counter()
    options = options or ResolveOptions()
    today = today or _dt.datetime.now(_dt.timezone.utc).date()
    # one resolver per file system searched: this machine's, each image's, each conda package's
    contexts: dict[Scope | None, tuple[Resolver, CachedReader]] = {}

    def context(scope: Scope | None) -> tuple[Resolver, CachedReader]:
        if scope not in contexts:
            fs = HOST if scope is None else scope.fs
            read = CachedReader(policy, read_elf if fs is HOST else None, fs, sha256)
            contexts[scope] = Resolver(options if scope is None else scope.options(options), policy, read, fs), read
        return contexts[scope]

    def check_one(inp: Input) -> FileResult:
        resolver, read = context(inp.scope)
        return check_file(inp, policy, resolver, read)

    inputs = Inputs(conda_prefix=options.conda_prefix, limits=limits or ArchiveLimits(), jobs=jobs, identify=sha256)
    files: list[FileResult] = []
    used: set[int] = set()
    try:
        items = [inp for arg in paths for inp in inputs.expand(str(arg))]
        for inp in items:  # made here, in input order, so forked workers share them
            context(inp.scope)
        results = _check_all(items, check_one, jobs)
        hosts: dict[str, str] = {}  # real path read on this machine -> the audited file's reported name
        in_image: dict[int, tuple[str, FileSystem]] = {}  # results whose paths are an image's own
        for inp, result in zip(items, results):
            _apply_exceptions(result, policy, used, today)
            if result.verdict == "pass" and result.failing:
                result.verdict = "fail"
            files.append(result)
            if inp.scope is not None and not on_host(inp.scope.fs):  # IMAGE!/path: the image's label
                in_image[id(result)] = (inp.shown[:len(inp.shown) - len(inp.read_from or "") - 1], inp.scope.fs)
            elif inp.read_from is not None:
                hosts.setdefault(os.path.realpath(inp.read_from), inp.shown)
        _name_members(files, hosts, inputs, in_image)
    finally:
        inputs.cleanup()
    warnings = [inputs.relabel(w) for resolver, _ in contexts.values() for w in resolver.warnings]
    warnings += [inputs.relabel(w) for w in inputs.warnings]
    errors = [] if files else ["no ELF file found in " + ", ".join(str(p) for p in paths) + ": nothing was audited"]
    for i, exc in enumerate(policy.exceptions):
        if i not in used:
            state = " (and it has expired)" if exc.expired(today) else ""
            warnings.append(f"{exc.source}: exception for rule {exc.rule} on '{exc.file}' matches nothing{state}")
    return CheckReport(
        files=files, policy={"name": policy.name, "sources": policy.sources}, options=options.to_dict(),
        inputs=[str(p) for p in paths], skipped=inputs.skipped, warnings=warnings, errors=errors,
        elapsed_s=time.perf_counter() - start, timing=timing, containers=list(inputs.containers.values()),
    )

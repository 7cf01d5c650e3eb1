"""`sovereign-audit inspect PATH... [--json]`: what the ELF reader sees in each file.

Directories are walked (symlinked directories are not followed, so loops cannot occur); files
in them that are not ELF are counted and skipped. Wheels, conda packages and container images
are opened as `check` opens them. A path named on the command line that is not
an ELF file is an error. Exit 0, or 3 if any input or any embedded device-code entry could not
be read (the others still print; each error is one line on stderr), or if no ELF file was
found, as `check` does. All strings from binaries and file names are escaped, and no line of
the output starts with `::` (a CI workflow command).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field

import click

from audit.linkage.resolution.native import read_binary, resolver_for

from audit.elf.model import ElfInfo
from audit.elf.reader import is_elf
from audit.errors import EXIT_INPUT, EXIT_OK, InputError, UsageError, no_commands, printable
from audit.schemas import INSPECT

SCHEMA = "sovereign-audit.inspect/1"
TEXT_LIMIT = 40  # rows per list in text output; --json has them all


@dataclass
class InspectResult:
    files: list[ElfInfo] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, one-line message)
    skipped: int = 0  # non-ELF (or non-regular) files met while walking directories
    vendor_pattern: re.Pattern[bytes] | None = None
    trees: dict[str, dict] = field(default_factory=dict)  # path -> resolved dependency tree
    tree_warnings: dict[str, list[str]] = field(default_factory=dict)
    nothing_found: str | None = None  # "no ELF file found in ...": exit 3, as `check`

    @property
    def entry_errors(self) -> list[tuple[str, str]]:
        """(path, message) for each embedded device-code entry that could not be read: the file
        was read, but not all of it, so the run cannot say what it holds (exit 3, as `check`)."""
        return [(f.path, f"device code at {d.section} @{d.offset:#x} {d.kind} {d.target}: {d.error}")
                for f in self.files for d in f.device_code if d.error]

    @property
    def exit_code(self) -> int:
        return EXIT_INPUT if self.errors or self.entry_errors or self.nothing_found else EXIT_OK

    def to_dict(self) -> dict:
        files = []
        for f in self.files:
            d = f.to_dict()
            if f.path in self.trees:
                d["dependency_tree"] = self.trees[f.path]
                d["dependency_warnings"] = self.tree_warnings.get(f.path, [])
            files.append(d)
        return {"$schema": INSPECT, "schema": SCHEMA, "files": files,
                "errors": [{"path": p, "error": e} for p, e in self.errors + self.entry_errors]
                + ([{"path": None, "error": self.nothing_found}] if self.nothing_found else []),
                "skipped_non_elf": self.skipped}


def expand_paths(paths: list[str], result: InspectResult, archives: list[str] | None = None,
                 found: list[str] | None = None) -> list[str]:
    """Files to read: named files as given, directories walked (sorted, deduplicated by real path).
    Wheels, conda packages and container images (tars, OCI layout folders) met in a directory go
    to `archives` (opened as `check` opens them); with `found`, every other file there that is
    not an ELF or native binary goes to it (read as `check` reads a file met in a folder: other
    archives, packages, tarballs, compressed files, Python loaders; data is counted skipped)."""
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(p)

    for arg in paths:
        if os.path.isdir(arg):
            def onerror(exc: OSError, arg=arg):
                result.errors.append((exc.filename or arg, f"cannot list directory: {exc.strerror or exc}"))

            for dirpath, dirnames, filenames in os.walk(arg, onerror=onerror, followlinks=False):
                dirnames.sort()
                if archives is not None:  # an OCI layout folder is an image, not a tree to walk
                    oci = [d for d in dirnames if _is_archive(os.path.join(dirpath, d))]
                    archives += [os.path.join(dirpath, d) for d in oci]
                    dirnames[:] = [d for d in dirnames if d not in oci]
                for name in sorted(filenames):
                    p = os.path.join(dirpath, name)
                    try:
                        st = os.stat(p)
                    except OSError:  # dangling symlink or a loop: nothing to read
                        result.skipped += 1
                        continue
                    if archives is not None and stat.S_ISREG(st.st_mode) and _packaged(p):
                        archives.append(p)
                        continue
                    if found is not None and stat.S_ISREG(st.st_mode) and not (is_elf(p) or _native(p)):
                        found.append(p)
                        continue
                    if not stat.S_ISREG(st.st_mode) or not (is_elf(p) or _native(p)):
                        result.skipped += 1
                        continue
                    add(p)
        else:
            add(arg)  # read_elf says why if it is missing, unreadable or not ELF
    return out


def inspect_paths(paths: list[str], symbol_pattern: re.Pattern[bytes] | None,
                  policy=None, resolve_options=None) -> InspectResult:
    """Read every ELF under `paths`; never raises for a bad input (it becomes an error entry).
    With a policy, each file's dependency tree is resolved as ld.so would (audit.linkage.resolution.ldso).
    A wheel, conda package or container image is opened as `check` opens it, its members named
    `ARCHIVE!/member` and resolved inside it."""
    result = InspectResult(vendor_pattern=symbol_pattern)
    resolver = _resolver(policy, resolve_options) if policy is not None else None
    plain = [p for p in paths if not _is_archive(p)]
    archives = [p for p in paths if _is_archive(p)]
    found: list[str] = []
    for p in expand_paths(plain, result, archives, found):
        try:
            got = read_binary(p, symbol_pattern)
        except InputError as exc:
            result.errors.append((p, exc.message))
            continue
        for info in _slices(got, p):
            result.files.append(info)
            if resolver is not None:
                _add_tree(result, resolver, info, p)
    if archives or found:
        _inspect_archives(archives, result, symbol_pattern, policy, resolve_options, found)
    if not result.files and not result.errors:  # every input read, and none held an ELF file
        result.nothing_found = f"no ELF file found in {', '.join(paths)}: nothing was read"
    return result


def _add_tree(result: InspectResult, resolver, info: ElfInfo, path: str, members=None, relabel=None) -> None:
    from audit.linkage.resolution.ldso import TreeTooLarge

    try:
        tree, warnings = resolver_for(resolver, info).tree(info, path, members=members)
    except TreeTooLarge as exc:
        result.errors.append((info.path, f"{info.path}: {exc}"))
        return
    relabel = relabel or (lambda text: text)
    result.trees[info.path] = _relabeled(tree.to_dict(), relabel)
    result.tree_warnings[info.path] = [relabel(w) for w in warnings]


def _relabeled(value, relabel):
    """`value` with every string in it passed through `relabel`; with a stack, as a NEEDED chain
    nests deeper than Python's recursion limit allows for (two levels a library)."""
    work: list = []

    def shell(v):
        if isinstance(v, str):
            return relabel(v)
        if isinstance(v, (list, dict)):
            out = dict.fromkeys(v) if isinstance(v, dict) else [None] * len(v)
            work.append((v, out))
            return out
        return v

    top = shell(value)
    while work:
        src, dst = work.pop()
        for k, v in (src.items() if isinstance(src, dict) else enumerate(src)):
            dst[k] = shell(v)
    return top


def _native(path: str) -> bool:
    """A PE or Mach-O file (read like an ELF file)."""
    from audit.linkage.resolution.native import MACHO_KINDS, PE_KINDS, _magic_kind

    return _magic_kind(path) in PE_KINDS + MACHO_KINDS


def _slices(got, path: str) -> list:
    """What was read, as a list: a universal Mach-O binary's slices each named `PATH [slice ARCH]`."""
    if not isinstance(got, list):
        got.path = path
        return [got]
    for info in got:
        info.path = f"{path} [slice {info.slice}]"
    return got


def _packaged(path: str) -> bool:
    """A wheel, conda package or container image tar found in a directory (`check` opens
    these there too; a tar that is not an image is skipped, as there)."""
    from audit.linkage.containers.conda import is_conda
    from audit.linkage.containers.image import tar_kind

    return path.endswith(".whl") or is_conda(path) or (not is_elf(path) and tar_kind(path) == "image")


def _is_archive(path: str) -> bool:
    """A wheel, conda package or container image (file or OCI layout): what `check` opens."""
    from audit.linkage.containers.image import is_oci_dir

    if os.path.isdir(path):
        return is_oci_dir(path)
    try:
        return os.path.isfile(path) and not is_elf(path) and not _native(path) and os.path.getsize(path) > 0
    except OSError:
        return False


def _inspect_archives(paths: list[str], result: InspectResult, symbol_pattern, policy, options,
                      found: list[str] = ()) -> None:
    """The members `check` would audit, read the same way (an image's files in place, through
    its layers), each named as `check` names it: of `paths` as named, of `found` as met in a
    folder."""
    from audit.linkage.resolution.fs import HOST
    from audit.linkage.containers.inputs import Inputs
    from audit.linkage.resolution.ldso import Resolver, ResolveOptions

    options = options or ResolveOptions.from_cli()
    inputs = Inputs(conda_prefix=options.conda_prefix)
    resolvers: dict = {}
    try:
        for arg, named in [(p, True) for p in paths] + [(p, False) for p in found]:
            for inp in (inputs.expand(arg) if named else inputs.expand_found(arg)):
                if inp.read_from is None:
                    result.errors.append((inp.shown, inputs.relabel(inp.error)))
                    continue
                fs = HOST if inp.scope is None else inp.scope.fs
                read = read_binary if fs is HOST else fs.read_elf
                try:
                    got = read(inp.read_from, symbol_pattern)
                except InputError as exc:
                    result.errors.append((inp.shown, inputs.relabel(exc.message)))
                    continue
                for info in _slices(got, inp.shown):
                    info.warnings = [inputs.relabel(w) for w in info.warnings]
                    result.files.append(info)
                    if policy is None:
                        continue
                    if inp.scope not in resolvers:
                        scoped = options if inp.scope is None else inp.scope.options(options)
                        resolvers[inp.scope] = Resolver(scoped, policy, lambda p, read=read: read(p), fs)
                    _add_tree(result, resolvers[inp.scope], info, inp.read_from, inp.members, inputs.relabel)
        result.skipped += sum(n for why, n in inputs.skipped.items() if why != "duplicate")
    finally:
        inputs.cleanup()


def _resolver(policy, options):
    from audit.linkage.resolution.ldso import Resolver, ResolveOptions

    cache: dict[str, ElfInfo] = {}

    def read(path: str) -> ElfInfo:  # dependencies: headers and dynamic section are what matter
        real = os.path.realpath(path)
        if real not in cache:
            cache[real] = read_binary(real)
        return cache[real]

    return Resolver(options or ResolveOptions.from_cli(), policy, read)


# -- text rendering -------------------------------------------------------------------------
def esc(text: str | None) -> str:
    """A string from a binary or a file name, safe to print on a terminal or in a log."""
    if text is None:
        return "-"
    return printable(text)


def _join(items, empty: str = "-") -> str:
    items = [esc(i) for i in items]
    return ", ".join(items) if items else empty


def _limited(lines: list[str], total: int) -> list[str]:
    if total > len(lines):
        lines.append(f"    ... and {total - len(lines)} more (--json lists all)")
    return lines


def render_file(info: ElfInfo, vendor: re.Pattern[bytes] | None) -> str:
    out = [esc(info.path)]
    row = lambda k, v: out.append(f"  {k:<14}{v}")  # noqa: E731
    row("sha256", info.sha256)
    row("size", f"{info.size} bytes")
    row("build-id", esc(info.build_id))
    if getattr(info, "format", "elf") == "elf":
        row("format", f"ELF{info.elf_class} {info.endian}-endian {info.machine} {info.elf_type}")
    elif info.format == "python":  # its loads are its library-name strings, each with its line
        row("format", info.file_type)
    else:
        row("format", f"{'PE' if info.format == 'pe' else 'Mach-O'} {info.bits}-bit {info.endian}-endian "
                      f"{info.machine} {info.file_type}" + (f" (slice {esc(info.slice)})" if info.slice else ""))
        row("imports", "; ".join(f"{esc(i.name)} ({i.kind})" for i in info.imports) or "-")
    row("soname", esc(info.soname))
    row("interpreter", esc(info.interpreter))
    row("needed", _join(info.needed))
    if getattr(info, "extra_loads", None):  # ELF filter and audit libraries: loads DT_NEEDED omits
        row("also loads", "; ".join(f"{esc(n)} ({tag})" for tag, n in info.extra_loads))
    row("rpath", _join(info.rpath))
    row("runpath", _join(info.runpath))
    row("verneed", "; ".join(f"{esc(v.file)} ({_join(v.versions)})" for v in info.version_needs) or "-")
    imports = sum(1 for s in info.symbols if not s.defined)
    counts = ", ".join(f"{k} {v}" for k, v in info.symbol_counts.items()) or "none"
    row("symbols", f"{counts}; {imports} imports")
    row("code loading", _join(info.code_loading_imports))
    if vendor is not None:
        hits = [s for s in info.symbols if vendor.search(s.name.encode("utf-8", "surrogateescape"))]
        out.append(f"  vendor-looking symbols: {len(hits)}")
        out += _limited([f"    {'defined' if s.defined else 'imported':<9}{s.table:<9}{s.kind:<8}{s.bind:<7}"
                         f"{esc(s.name)}" + (f"@{esc(s.version)}" if s.version else "")
                         for s in hits[:TEXT_LIMIT]], len(hits))
    out.append(f"  library-name strings: {len(info.library_strings)}")
    out += _limited([f"    {esc(h.section)} @{h.offset:#x}  {esc(h.text)}" for h in info.library_strings[:TEXT_LIMIT]],
                    len(info.library_strings))
    out.append(f"  device code: {len(info.device_code)}")
    for d in info.device_code[:TEXT_LIMIT]:
        line = f"    {d.container:<11}{d.kind:<19}{esc(d.target):<24}@{d.offset:#x} {d.size} bytes"
        if d.compressed:
            line += f" ({d.compressed})"
        if d.bundle_id:
            line += f" id {esc(d.bundle_id)}"
        out.append(line)
        if d.kernels:
            out.append(f"      kernels: {_join(d.kernels)}")
        if d.error:
            out.append(f"      ERROR: {esc(d.error)}")
    if len(info.device_code) > TEXT_LIMIT:
        out.append(f"    ... and {len(info.device_code) - TEXT_LIMIT} more (--json lists all)")
    for w in info.warnings:
        out.append(f"  warning: {esc(w)}")
    return "\n".join(out)


def render_tree(node: dict) -> list[str]:
    """One line per node below the root, indented by depth; iterative, as a NEEDED chain may run
    deeper than Python's recursion limit."""
    out: list[str] = []
    stack = [(child, 1) for child in reversed(node.get("children", []))]
    while stack:
        node, depth = stack.pop()
        where = f" -> {esc(node['path'])}" if node.get("path") else ""
        how = f" ({esc(node['how'])}{' of ' + esc(node['via']) if node.get('via') else ''})" if node.get("how") else ""
        extra = f" rule {esc(node['rule'])}" if node.get("rule") else ""
        note = f"; {esc(node['note'])}" if node.get("note") else ""
        out.append(f"  {'  ' * depth}{esc(node['name'])}{where}{how} [{node['status']}{extra}{note}]")
        stack += [(child, depth + 1) for child in reversed(node.get("children", []))]
    return out


def render_text(result: InspectResult) -> str:
    parts = []
    for f in result.files:
        text = render_file(f, result.vendor_pattern)
        if f.path in result.trees:
            lines = ["  dependency tree:"] + (render_tree(result.trees[f.path]) or ["    (no DT_NEEDED)"])
            lines += [f"  warning: {esc(w)}" for w in result.tree_warnings.get(f.path, [])]
            text += "\n" + "\n".join(lines)
        parts.append(text)
    tail = f"{len(result.files)} file(s) read{_by_format(result.files)}, {len(result.errors)} unreadable, " \
           f"{result.skipped} skipped (nothing to audit)"
    if result.entry_errors:
        tail += f"; {len(result.entry_errors)} device-code entr{'y' if len(result.entry_errors) == 1 else 'ies'} unreadable"
    return no_commands("\n\n".join(parts + [tail]))


_FORMAT_NAMES = {"elf": "ELF", "pe": "PE", "macho": "Mach-O", "python": "Python"}


def _by_format(files) -> str:
    """" (2 ELF, 1 PE)": how many of each format were read (ELF, PE, Mach-O, Python source)."""
    counts: dict[str, int] = {}
    for f in files:
        name = _FORMAT_NAMES.get(getattr(f, "format", "elf"), str(getattr(f, "format", "elf")))
        counts[name] = counts.get(name, 0) + 1
    return f" ({', '.join(f'{n} {name}' for name, n in counts.items())})" if counts else ""


def _load_policy(path: str | None):
    from audit.linkage.judging.policy import load_policy  # the policy's patterns and allow-lists (lazy)

    return load_policy(path)


@click.command("inspect")
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False))  # unreadable: exit 3, not 2
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema sovereign-audit.inspect/1).")
@click.option("--policy", metavar="FILE", default=None,
              help="Policy whose symbol patterns select the vendor-looking symbols (default: sovereign).")
@click.option("--no-vendor-symbols", is_flag=True, help="Keep imports only; do not select vendor-looking symbols.")
@click.option("--no-deps", is_flag=True, help="Do not resolve the dependency tree.")
@click.option("--root", metavar="DIR", default=None, help="Resolve dependencies inside this sysroot.")
@click.option("--ldpath", metavar="DIR", multiple=True, help="Extra library directory (repeatable).")
@click.pass_context
def inspect_cmd(ctx, paths, as_json, policy, no_vendor_symbols, no_deps, root, ldpath):
    """Show what is inside ELF files: identity, linkage, symbols, strings, embedded device code
    and the dependency tree resolved as ld.so would.

    PATH is an ELF file, a directory, a wheel, a conda package or a container image, as for
    `check` (an archive's members are named ARCHIVE!/member and resolved inside it).

    \b
    Exit codes: 0 every input read, 2 a bad policy or option, 3 some input or embedded device-code
    entry could not be read (the rest are still shown), or no ELF file found.
    """
    if root is not None and not os.path.isdir(root):
        raise UsageError(f"--root {root}: not a directory")
    for d in ldpath:
        if not os.path.isdir(d):
            raise UsageError(f"--ldpath {d}: not a directory")
    pol = _load_policy(policy) if not (no_vendor_symbols and no_deps) else None
    options = None
    if not no_deps:
        from audit.linkage.resolution.ldso import ResolveOptions

        options = ResolveOptions.from_cli(root=root, ldpath=ldpath)
    result = inspect_paths(list(paths), None if no_vendor_symbols else pol.symbol_pattern,
                           None if no_deps else pol, options)
    for path, message in result.errors + result.entry_errors:
        # InputError messages already name the file (as one printable line); walk errors are
        # given their path here
        named = message.startswith(path) or message.startswith(esc(" ".join(path.split())))
        line = message if named else f"{path}: {message}"
        click.echo(f"error: {esc(line)}", err=True)
    if result.nothing_found:
        click.echo(f"error: {esc(result.nothing_found)}", err=True)
    if as_json:
        # `##[` inside a string as `##\u005b`: the same JSON, and nothing a CI log obeys
        click.echo(no_commands(json.dumps(result.to_dict(), indent=1, ensure_ascii=True), "\\u003a", "\\u005b"))
    else:
        click.echo(render_text(result))
    ctx.exit(result.exit_code)

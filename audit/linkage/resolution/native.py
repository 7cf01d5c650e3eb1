"""Windows PE and macOS Mach-O files in the linkage stage: reading any audited format by its
magic, and resolving a PE or Mach-O file's libraries as its own platform's loader would.

`read_binary` hands an ELF file to read_elf unchanged (same arguments, same result) and reads a
PE file into one BinaryInfo and a Mach-O file into one BinaryInfo per architecture slice (a
list only for a universal binary). The resolvers build the same DepNode trees as the ELF
Resolver (resolve.py) and answer the same questions judging asks of a resolver (`memo`,
`paths`, `own_dirs`, `is_system_dir`), so scan.py judges every format alike.

Windows (the loader's search for a DLL that is neither an API set nor a KnownDLL, inside the
audited set): the requesting DLL's own folder, the wheel's or folder's `<pkg>.libs/` folders
(delvewheel puts the DLLs it bundles there and adds them with os.add_dll_directory), a conda
package's `Library/bin/` (where conda puts DLLs, on the search path of its Python), then
--ldpath directories, then the audited set's other members by name. Names are compared without
regard to case. API sets (`api-ms-win-*`, `ext-ms-*`) and KnownDLLs are the system's own: the
loader never takes them from an application's folder. Another trusted name (a C runtime, the
CUDA or HIP base runtime) found in the audited set is inspected like any other library, and is
the system's when not found.

macOS (dyld): `@rpath/` through the LC_RPATH entries of the requester and of every object that
loaded it, up to the audited file; `@loader_path` is the folder of the object whose load
command or LC_RPATH it is; `@executable_path` is the audited file's folder when it is an
executable (unknown for a library audited alone: the entry is skipped); then --ldpath and the
audited set's members by file name (delocate's `.dylibs/`). Paths under /usr/lib and
/System/Library are the system's (the shared cache): never unresolved, and judged by name
(Accelerate is denied wherever it is).
"""

from __future__ import annotations

import os
from collections import deque

from audit.binary.model import DEFAULTLIB, PINVOKE, BinaryInfo
from audit.binformat import HEAD_BYTES, Kind, identify
from audit.linkage.resolution.fs import HOST, FileSystem
from audit.python_source.reader import is_python_source, read_python
from audit.linkage.resolution.ldso import DepNode, MemberSet, Paths, ResolveOptions, TreeTooLarge, attach, loaded_again

PE_KINDS = (Kind.PE_DLL, Kind.PE_EXECUTABLE)
MACHO_KINDS = (Kind.MACHO, Kind.MACHO_FAT)
AUDITED = (Kind.ELF, Kind.COFF_OBJECT) + PE_KINDS + MACHO_KINDS  # the formats `check` and `inspect` read

# Always the system's: the loader maps these from System32 whatever folder a DLL comes from.
KNOWN_DLLS = frozenset((
    "kernel32.dll", "kernelbase.dll", "ntdll.dll", "user32.dll", "gdi32.dll", "gdi32full.dll",
    "advapi32.dll", "ws2_32.dll", "shell32.dll", "shlwapi.dll", "ole32.dll", "oleaut32.dll",
    "combase.dll", "rpcrt4.dll", "sechost.dll", "msvcrt.dll", "ucrtbase.dll", "comdlg32.dll",
    "setupapi.dll", "imm32.dll", "psapi.dll", "normaliz.dll", "wldap32.dll", "crypt32.dll",
    "bcrypt.dll", "version.dll", "winmm.dll", "iphlpapi.dll", "secur32.dll", "userenv.dll",
    "cfgmgr32.dll", "dbghelp.dll", "powrprof.dll", "msctf.dll", "clbcatq.dll", "difxapi.dll",
    "imagehlp.dll", "nsi.dll", "wintrust.dll",
    "mscoree.dll"))  # not a KnownDLL, but the system's: the .NET runtime's loader every managed assembly imports
_MAC_SYSTEM = ("/usr/lib/", "/System/Library/")
_PE_ASKED = {"import": "import", "delay-load": "delay-load import", "bound": "bound import",
             "export-forward": "export forward", "defaultlib": "/DEFAULTLIB directive (.drectve)",
             "pinvoke": "P/Invoke (CLI ModuleRef)"}
_LOADS_BY_NAME = ("LoadLibrary", "LoadPackagedLibrary", "LdrLoadDll", "dlopen", "dlmopen", "NSAddImage",
                  "NativeLibrary.")


def pinvoke_probes(base: str) -> list[str]:
    """The file names .NET's P/Invoke probing tries for a DllImport name (with and without the
    platform's prefix and suffix): "cublas" -> cublas.dll, libcublas.so, cublas.so, libcublas.dylib,
    cublas.dylib, libcublas."""
    stem = base
    for suffix in (".dll", ".so", ".dylib"):
        if stem.casefold().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return [base, f"{stem}.dll", f"lib{stem}.so", f"{stem}.so", f"lib{stem}.dylib", f"{stem}.dylib", f"lib{stem}"]


def _magic_kind(path: str) -> Kind | None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
            size = os.fstat(fh.fileno()).st_size
    except (OSError, ValueError):
        return None
    return identify(head, size)


def read_binary(path: str, symbol_pattern=None, api_prefixes: tuple[bytes, ...] = (), sha256: bool = True,
                **elf_options):
    """ElfInfo (read_elf, with every option as given), a PE file's BinaryInfo, or a Mach-O file's
    BinaryInfo (a list of one per slice for a universal binary). Raises InputError."""
    kind = _magic_kind(path) if os.path.isfile(path) else None
    if kind is Kind.NOT_BINARY and is_python_source(path):
        return read_python(path, sha256)
    markers = elf_options.get("markers", ())  # vendor marker texts: looked for in every format's data
    if kind in PE_KINDS:
        from audit.pe.reader import read_pe

        return read_pe(path, symbol_pattern, api_prefixes, sha256, markers)
    if kind is Kind.COFF_OBJECT:  # on its own, or a static archive's or import library's member
        from audit.pe.reader import read_coff_object

        return read_coff_object(path, symbol_pattern, api_prefixes, sha256, markers)
    if kind in MACHO_KINDS:
        from audit.macho.reader import read_macho

        slices = read_macho(path, symbol_pattern, api_prefixes, sha256, markers)
        return slices if len(slices) > 1 else slices[0]
    from audit.elf.reader import read_elf

    return read_elf(path, symbol_pattern=symbol_pattern, api_prefixes=api_prefixes, sha256=sha256, **elf_options)


def format_of(info) -> str:
    return getattr(info, "format", "elf")


def resolver_for(resolver, info):
    """The resolver for `info`'s format: the ELF Resolver itself, or a platform resolver made
    once per ELF Resolver (same options, policy, reader and memo)."""
    fmt = format_of(info[0] if isinstance(info, list) else info)
    if fmt == "elf":
        return resolver
    key = ("native-resolver", fmt)
    if key not in resolver.memo:
        cls = WindowsResolver if fmt in ("pe", "coff") else SourceResolver if fmt == "python" else MacResolver
        resolver.memo[key] = cls(resolver.options, resolver.policy, resolver.read, resolver.paths.fs, resolver.memo)
    return resolver.memo[key]


def loads_by_name(info) -> bool:
    return any(n.startswith(_LOADS_BY_NAME) for n in info.code_loading_imports)


class _NativeResolver:
    """What both platform resolvers share: judging's questions, reading a dependency, the walk."""

    how_found = "found"

    def __init__(self, options: ResolveOptions, policy, read, fs: FileSystem = HOST, memo: dict | None = None):
        self.options = options
        self.policy = policy
        self.read = read
        self.paths = Paths(options.root, fs)
        self.memo = memo if memo is not None else {}
        self.warnings: list[str] = []
        self._listings: dict[str, dict[str, str]] = {}

    # judging's questions (scan.rpath_findings): no ELF search directories here
    def own_dirs(self, node: DepNode) -> list:
        return []

    def is_system_dir(self, directory: str, bits: int, machine: int) -> bool:
        return False

    def _kind_ok(self, path: str) -> str | None:
        real = self.paths.real(path)
        if real is None or self.paths.fs.kind(real) != "file":
            return None
        head = self.paths.fs.head(real, HEAD_BYTES)
        return real if identify(head, max(len(head), self.paths.fs.size(real))) in self.kinds else None

    def tree(self, info: BinaryInfo, path: str, members: MemberSet | None = None) -> tuple[DepNode, list[str]]:
        warnings: list[str] = []
        root = DepNode(name=os.path.basename(path), status="root", path=path,
                       realpath=self.paths.real(path) or path, soname=info.soname, info=info)
        loaded: dict[str, DepNode] = {self.key(os.path.basename(path)): root}
        by_real = {root.realpath: root}
        queue = deque([(root, (root,))])
        count = 0
        while queue:
            node, chain = queue.popleft()
            edges = [(imp.name, "needed", self.asked(imp)) for imp in node.info.imports]
            if loads_by_name(node.info):
                edges += [(h.text, "dlopen", "dlopen") for h in node.info.library_strings]
            seen_here: set[str] = set()
            for name, edge, kind in edges:
                key = self.key(name)
                if (key, edge) in seen_here:
                    continue
                seen_here.add((key, edge))
                count += 1
                if count > self.options.max_nodes:
                    raise TreeTooLarge(f"dependency tree has more than {self.options.max_nodes} edges")
                if key in loaded:
                    if edge == "needed":
                        loaded_again(node, name, loaded[key])
                    continue
                if edge == "dlopen" and (self.policy.is_trusted(name) or self.policy.deny_rule_for_soname(name)):
                    continue  # a denied name is a dlopen-string finding already; a trusted one the system's
                child = self.resolve(name, kind, node, chain, members, warnings, edge == "dlopen")
                if child is None:
                    continue
                attach(node, child, key, edge, loaded, by_real, chain, queue)
        return root, warnings

    def finish(self, node: DepNode, name: str, root_info) -> DepNode:
        """A found file: denied by its own name or its own recorded name, else read and walked."""
        rule = self.policy.deny_rule_for_soname(os.path.basename(node.realpath or name))
        if rule:
            node.status, node.rule = "denied", rule.id
            return node
        try:
            got = self.read(node.realpath)
        except Exception as exc:  # fail closed: an unreadable dependency cannot be vouched for
            node.status = "error"
            node.note = " ".join(str(getattr(exc, "message", exc)).split()) or type(exc).__name__
            return node
        info = self.pick(got, root_info)
        if info is None:
            node.status = "error"
            node.note = f"holds no {root_info.machine} code for the audited file"
            return node
        node.info = info
        node.soname = info.soname
        rule = self.policy.deny_rule_for_soname(info.soname) if info.soname else None
        if rule:
            node.status, node.rule = "denied", rule.id
            node.note = "; ".join(filter(None, [node.note, f"its own name {info.soname}"]))
            return node
        node.status = "inspected" if self.policy.is_inspected(name) or node.status == "inspected" else "unlisted"
        return node

    def pick(self, got, root_info):
        """The part of what was read that the audited file would load: a slice of its machine."""
        slices = got if isinstance(got, list) else [got]
        for info in slices:
            if format_of(info) == root_info.format and info.machine == root_info.machine:
                return info
        return None

    def _listing(self, d: str) -> dict[str, str]:
        """casefolded name -> the name as stored, of directory `d` (read once per run)."""
        if d not in self._listings:
            names = self.paths.fs.listdir(d) or []
            self._listings[d] = {}
            for n in sorted(names):
                self._listings[d].setdefault(n.casefold(), n)
        return self._listings[d]


class WindowsResolver(_NativeResolver):
    kinds = PE_KINDS

    def _directive(self, name: str, base: str, asked: str) -> DepNode:
        """A library a COFF object's /DEFAULTLIB names: a static or import library the linker takes,
        judged by its name alone (no linker search path is known here). Import library X.lib
        stands for the DLL X.dll, NVIDIA's X64_<version>.dll (cublas.lib: cublas64_12.dll) or
        libX.dll; the system's and the compiler's libraries (libcmt, kernel32, ...) pass."""
        stem = base[:-4] if base[-4:].casefold() == ".lib" else base
        for candidate, shown in ((f"{stem}.dll", f"{stem}.dll"), (f"{stem}64_.dll", f"{stem}64_*.dll"),
                                 (f"lib{stem}.dll", f"lib{stem}.dll")):
            rule = self.policy.deny_rule_for_soname(candidate)
            if rule is not None:
                return DepNode(name=name, status="denied", rule=rule.id, how="directive", edge="needed",
                               request=asked, note=f"a library the linker takes: the import library of {shown}")
        return DepNode(name=name, status="trusted", how="system", edge="needed", request=asked,
                       note="a library the linker takes; judged by its name alone")

    @staticmethod
    def asked(imp) -> str:
        return _PE_ASKED.get(imp.kind, imp.kind)

    @staticmethod
    def key(name: str) -> str:
        return name.replace("\\", "/").rsplit("/", 1)[-1].casefold()

    def resolve(self, name: str, kind: str, requester: DepNode, chain, members: MemberSet | None,
                warnings: list[str], dlopen: bool) -> DepNode | None:
        base = name.replace("\\", "/").rsplit("/", 1)[-1]
        if kind == _PE_ASKED[DEFAULTLIB]:
            return self._directive(name, base, kind)
        rule = None if dlopen else self.policy.deny_rule_for_soname(base)
        if kind == _PE_ASKED[PINVOKE]:  # the runtime probes the name in each platform's spellings
            rule = rule or next(filter(None, map(self.policy.deny_rule_for_soname, pinvoke_probes(base))), None)
            if "." not in base:
                base += ".dll"  # the file Windows' probing finds
        folded = base.casefold()
        edge = "dlopen" if dlopen else "needed"
        how_asked = "LoadLibrary string" if dlopen else kind
        if rule is None and (folded.startswith(("api-ms-win-", "ext-ms-")) or folded in KNOWN_DLLS):
            return DepNode(name=name, status="trusted", how="system", edge=edge, request=how_asked,
                           note="API set: the system's" if folded.startswith(("api-", "ext-")) else "KnownDLL: the system's")
        found = self._search(base, requester, members, warnings, how_asked)
        trusted = rule is None and self.policy.is_trusted(base)
        if found is None:
            if dlopen:
                return None
            if rule:
                return DepNode(name=name, status="denied", rule=rule.id, note="not found", edge=edge, request=how_asked)
            if trusted:
                return DepNode(name=name, status="trusted", how="system", edge=edge, request=how_asked,
                               note="not in the audited files: the system's")
            return DepNode(name=name, status="unresolved", note="not found", edge=edge, request=how_asked)
        path, real, how = found
        node = DepNode(name=name, status="", path=path, realpath=real, how=how, edge=edge, request=how_asked)
        if rule:
            node.status, node.rule = "denied", rule.id
            return node
        if trusted:
            node.status = "inspected"
            node.note = "trusted name found in the audited files: inspected"
        return self.finish(node, base, chain[0].info)

    def _search(self, base: str, requester: DepNode, members: MemberSet | None, warnings, how_asked):
        folded = base.casefold()
        dirs = [("own folder", os.path.dirname(os.path.abspath(requester.path or requester.realpath or ".")))]
        dirs += self._libs_dirs(members)
        dirs += [("ldpath", d) for d in self.options.ldpath]
        for how, d in dirs:
            stored = self._listing(d).get(folded)
            if stored:
                path = os.path.join(d, stored)
                real = self._kind_ok(path)
                if real:
                    return path, real, how
        if members is not None:
            for m in members.lookup(base) + [m for m in self._members_folded(members).get(folded, ())
                                             if os.path.basename(m.path) != base]:
                real = self._kind_ok(m.path)
                if real:
                    text = f"{how_asked} {base} of {requester.name} is not in its folder or a .libs folder; " \
                           f"resolved to member {m.shown}"
                    if text not in warnings:
                        warnings.append(text)
                    return m.path, real, "member"
        return None

    def _members_folded(self, members: MemberSet) -> dict:
        key = ("members-folded", id(members))
        if key not in self.memo:
            index: dict[str, list] = {}
            for hits in members._by_name.values():
                for m in hits:
                    index.setdefault(os.path.basename(m.path).casefold(), []).append(m)
            self.memo[key] = (members, index)  # the set kept alive while its id is a key
        return self.memo[key][1]

    def _libs_dirs(self, members: MemberSet | None) -> list[tuple[str, str]]:
        """(how, folder): the `<pkg>.libs` folders among the audited set's files (delvewheel's),
        then its `Library/bin` folders (a conda package's or environment's DLLs, on the PATH
        conda's Python searches), each sorted."""
        if members is None:
            return []
        key = ("libs-dirs", id(members))
        if key not in self.memo:
            folders = {os.path.dirname(m.path) for hits in members._by_name.values() for m in hits}
            libs = sorted(d for d in folders if os.path.basename(d).endswith(".libs"))
            conda = sorted(d for d in folders if os.path.basename(d).casefold() == "bin"
                           and os.path.basename(os.path.dirname(d)).casefold() == "library")
            self.memo[key] = (members, [("pkg.libs", d) for d in libs] + [("Library/bin", d) for d in conda])
        return self.memo[key][1]


class MacResolver(_NativeResolver):
    kinds = MACHO_KINDS

    @staticmethod
    def asked(imp) -> str:
        return imp.where  # the load command: LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, ...

    @staticmethod
    def key(name: str) -> str:
        return name

    def resolve(self, name: str, kind: str, requester: DepNode, chain, members: MemberSet | None,
                warnings: list[str], dlopen: bool) -> DepNode | None:
        rule = None if dlopen else self.policy.deny_rule_for_soname(name)
        edge = "dlopen" if dlopen else "needed"
        how_asked = "dlopen string" if dlopen else kind
        root = chain[0]
        if name.startswith(_MAC_SYSTEM):
            if rule:
                return DepNode(name=name, status="denied", rule=rule.id, how="system", edge=edge,
                               request=how_asked, note="the system's")
            return DepNode(name=name, status="trusted", how="system", edge=edge, request=how_asked,
                           note="the system's")
        found = self._search(name, requester, chain, root, members, warnings, how_asked)
        if found is None:
            if dlopen:
                return None
            if rule:
                return DepNode(name=name, status="denied", rule=rule.id, note="not found", edge=edge, request=how_asked)
            return DepNode(name=name, status="unresolved", note="not found", edge=edge, request=how_asked)
        path, real, how, via = found
        node = DepNode(name=name, status="", path=path, realpath=real, how=how, via=via, edge=edge,
                       request=how_asked)
        if rule:
            node.status, node.rule = "denied", rule.id
            return node
        if self.policy.is_trusted(name):
            node.status = "inspected"
            node.note = "trusted name found outside the system: inspected"
        return self.finish(node, name, root.info)

    def _expand(self, entry: str, owner: DepNode, root: DepNode) -> str | None:
        if entry.startswith("@loader_path"):
            return os.path.dirname(os.path.abspath(owner.path or ".")) + entry[len("@loader_path"):]
        if entry.startswith("@executable_path"):
            if root.info is None or root.info.file_type != "MH_EXECUTE":
                return None  # a library audited alone: the program that will load it is unknown
            return os.path.dirname(os.path.abspath(root.path or ".")) + entry[len("@executable_path"):]
        if entry.startswith("@"):
            return None
        return self.paths.host(entry) if entry.startswith("/") else None

    def _search(self, name: str, requester: DepNode, chain, root: DepNode, members, warnings, how_asked):
        tries: list[tuple[str, str, str | None]] = []  # (path, how, via)
        if name.startswith("@rpath/"):
            rest = name[len("@rpath/"):]
            for owner in reversed(chain):  # the requester first, then whoever loaded it
                for entry in owner.info.rpath if owner.info is not None else ():
                    d = self._expand(entry, owner, root)
                    if d is not None:
                        tries.append((os.path.join(d, rest), "rpath", f"LC_RPATH {entry} of {owner.name}"))
        elif name.startswith("@"):
            full = self._expand(name, requester, root)
            if full is not None:
                tries.append((full, name.split("/", 1)[0][1:], None))
        elif name.startswith("/"):
            tries.append((self.paths.host(name), "path", None))
        base = name.rsplit("/", 1)[-1]
        tries += [(os.path.join(d, base), "ldpath", None) for d in self.options.ldpath]
        for path, how, via in tries:
            path = os.path.normpath(path)
            real = self._kind_ok(path)
            if real:
                return path, real, how, via
        if members is not None:
            for m in members.lookup(base):
                real = self._kind_ok(m.path)
                if real:
                    text = f"{how_asked} {name} of {requester.name} is not on dyld's search path; resolved to member {m.shown}"
                    if text not in warnings:
                        warnings.append(text)
                    return m.path, real, "member", None
        return None


class SourceResolver(_NativeResolver):
    """A Python source links nothing: its tree is the file alone (the libraries its code hands to
    a loader are judged as its library strings)."""

    @staticmethod
    def asked(imp) -> str:
        return imp.kind

    @staticmethod
    def key(name: str) -> str:
        return name

    def resolve(self, name: str, kind: str, requester: DepNode, chain, members: MemberSet | None,
                warnings: list[str], dlopen: bool = False) -> DepNode | None:
        return None

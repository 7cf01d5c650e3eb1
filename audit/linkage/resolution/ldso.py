"""ld.so-style library resolution and the dependency tree.

Follows glibc's dynamic loader (elf/dl-load.c, _dl_map_object) for one DT_NEEDED name:
  1. a name with a '/' is a path ($ORIGIN expanded);
  2. DT_RPATH of the requesting object, then of its loader, and on up to the audited object,
     skipping every object that has DT_RUNPATH (glibc drops RPATH when RUNPATH exists), and
     only if the requesting object itself has no DT_RUNPATH;
  3. --ldpath directories, then LD_LIBRARY_PATH (only with --use-env);
  4. DT_RUNPATH of the requesting object only (RUNPATH never applies to grandchildren);
  5. the directories of /etc/ld.so.conf and its includes (what ldconfig puts in ld.so.cache);
  6. the default directories.
A candidate must be an ELF file of the same class, byte order and machine as the audited
object; others are skipped (ld.so skips them too). Libraries already loaded (by requested name,
SONAME or file identity) satisfy later requests, so cycles terminate. Loading is breadth-first,
as ld.so does, which decides whose RPATH chain a library is found through. $ORIGIN is the
directory of the path an object was found by, without resolving symlinks (glibc's l_origin).

With --root SYSROOT every absolute path taken from the audited system (RPATH/RUNPATH entries,
ld.so.conf and its includes, default directories, symlink targets) is looked up under SYSROOT.
Every look-up goes through a FileSystem (fs.py): this machine's, or a container image's final
tree, searched as ld.so inside that container would.
Not modelled: DF_1_NODEFLIB, hwcaps subdirectories, secure-mode (setuid) restrictions.

Beyond ld.so, two edges an installed package really has:
  - member fallback: inside a wheel, folder or image (a MemberSet), a NEEDED that ld.so's search
    does not reach is looked up among the other members by file name (an installer puts them
    side by side; a RUNPATH written for another layout misses them). The node says so
    (how "member") and a warning names the member.
  - the environment a package is installed into (ResolveOptions.fallback, e.g. a conda
    prefix's lib/): searched last, after the members (which overwrite it when installed).
  - dlopen edges: a library-name string in an object that names a file on the object's search
    path, in its own directory, or among the members is walked like a NEEDED (edge "dlopen").
"""

from __future__ import annotations

import glob as _glob
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from audit.elf.model import ElfInfo
from audit.elf.strings import is_mention
from audit.linkage.resolution.fs import HOST, FileSystem
from audit.linkage.resolution.fs import glob as fs_glob

_MAX_LINKS = 40  # ELOOP after this many symlinks, like the kernel
# Libraries in one NEEDED chain below the audited object. ld.so has no such bound, but real
# chains are a few dozen deep; the tree is written out as nested JSON, which Python's encoder
# refuses past ~1000 levels (two per library). Past it the file is an error (exit 3).
MAX_DEPTH = 256
_TRIPLETS = {
    (64, 62): "x86_64-linux-gnu", (32, 3): "i386-linux-gnu", (64, 183): "aarch64-linux-gnu",
    (32, 40): "arm-linux-gnueabihf", (64, 21): "powerpc64le-linux-gnu", (64, 22): "s390x-linux-gnu",
    (64, 243): "riscv64-linux-gnu", (64, 258): "loongarch64-linux-gnu",
}
SYSTEM_HOW = ("ld.so.conf", "default")


@dataclass
class ResolveOptions:
    """How to search for libraries (the `check` options --root, --ldpath, --use-env)."""

    root: str | None = None  # sysroot for a hermetic audit
    ldpath: list[str] = field(default_factory=list)  # extra directories, searched like LD_LIBRARY_PATH
    use_env: bool = False
    ld_library_path: str | None = None  # captured from the environment when use_env
    ld_preload: str | None = None  # LD_PRELOAD: the environment's when use_env, an image's Env
    ldso_conf: str = "/etc/ld.so.conf"  # inside root when root is set
    fallback: list[tuple[str, str]] = field(default_factory=list)  # (how, dir): searched last, after members
    conda_prefix: str | None = None  # the environment conda packages resolve against (its lib/)
    max_nodes: int = 5000  # a bound on huge trees: past it the file is an error, never a hang

    @classmethod
    def from_cli(cls, root: str | None = None, ldpath=(), use_env: bool = False,
                 conda_prefix: str | None = None) -> ResolveOptions:
        return cls(
            conda_prefix=os.path.realpath(conda_prefix) if conda_prefix else None,
            root=os.path.realpath(root) if root else None,
            ldpath=[os.path.abspath(p) for p in ldpath],
            use_env=use_env,
            ld_library_path=os.environ.get("LD_LIBRARY_PATH") if use_env else None,
            ld_preload=os.environ.get("LD_PRELOAD") if use_env else None,
        )

    def to_dict(self) -> dict:
        return {"root": self.root, "ldpath": list(self.ldpath), "use_env": self.use_env,
                "ld_library_path": self.ld_library_path, "ld_preload": self.ld_preload, "ldso_conf": self.ldso_conf,
                **({"fallback": [list(f) for f in self.fallback]} if self.fallback else {}),
                **({"conda_prefix": self.conda_prefix} if self.conda_prefix else {})}


@dataclass
class DepNode:
    """One DT_NEEDED edge of the tree and where it led."""

    name: str  # as requested in DT_NEEDED (the root: the audited file's name)
    status: str  # root | trusted | inspected | unlisted | denied | unresolved | loaded | error
    path: str | None = None  # where it was found (host path)
    realpath: str | None = None
    how: str | None = None  # path | rpath | ldpath | LD_LIBRARY_PATH | runpath | ld.so.conf | default | loaded
    #                         | beside (a dlopen target in the requester's directory) | member (MemberSet fallback)
    #                         | conda-prefix (ResolveOptions.fallback)
    via: str | None = None  # for rpath: whose DT_RPATH; for runpath: the requester's; for member: the set's label
    edge: str = "needed"  # how the parent asks for it: "needed" (DT_NEEDED) or "dlopen" (a name string)
    soname: str | None = None
    rule: str | None = None  # the deny rule that matched
    note: str | None = None
    children: list[DepNode] = field(default_factory=list)
    info: ElfInfo | None = field(default=None, repr=False, compare=False)
    # how a PE or Mach-O file asks for it ("delay-load import", "LC_LOAD_WEAK_DYLIB"); None: DT_NEEDED
    request: str | None = None
    # the file it led to, as read (for the SBOMs): its digest, size and .note.package object
    sha256: str | None = None
    size: int | None = None
    package_note: dict | None = None

    def to_dict(self) -> dict:
        """The tree as nested dicts, made with a stack, not by recursion (see MAX_DEPTH)."""
        top: dict = {}
        todo = [(self, top)]
        while todo:
            node, d = todo.pop()
            d.update({k: getattr(node, k) for k in ("name", "edge", "status", "path", "how", "via", "soname",
                                                     "rule", "note")})
            if node.request is not None:
                d["request"] = node.request
            d["children"] = [{} for _ in node.children]
            todo += zip(reversed(node.children), reversed(d["children"]))
        return top

    @property
    def label(self) -> str:
        """The name as a chain shows it: a dlopen edge says so."""
        return f"{self.name} (dlopen)" if self.edge == "dlopen" else self.name

    def walk(self, chain: tuple[DepNode, ...] = ()):
        """(node, chain from the root to the node inclusive), depth first, with a stack."""
        todo = [chain + (self,)]
        while todo:
            here = todo.pop()
            yield here[-1], here
            todo += [here + (child,) for child in reversed(here[-1].children)]


@dataclass(frozen=True)
class Member:
    path: str  # where it is on this machine (an extracted wheel member, a file in a folder)
    shown: str  # how reports name it ("x.whl!/torch/lib/libtorch_cpu.so", or the path)


class MemberSet:
    """The files of one audited wheel, folder or image, by file name: the fallback for a library
    name that ld.so's own search does not reach (Resolver.tree(..., members=...)).

    Reusable for any archive: build it from every extracted file (not only ELF ones: candidates
    are checked for class and machine when looked up) and pass it with each member audited.
    """

    def __init__(self, label: str, members: Iterable[Member]):
        self.label = label  # the wheel, folder or image, as reported
        self._by_name: dict[str, list[Member]] = {}
        self._versions: dict[str, list[Member]] | None = None  # built on the first versions_of
        for m in members:
            self._by_name.setdefault(os.path.basename(m.path), []).append(m)
        for hits in self._by_name.values():
            hits.sort(key=lambda m: m.shown)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    def lookup(self, name: str) -> list[Member]:
        """Members whose file name is `name`, sorted by reported path (deterministic)."""
        return list(self._by_name.get(name, ())) if "/" not in name else []

    def versions_of(self, name: str) -> list[Member]:
        """Members whose file name is `name` plus a version (`libfoo.so.1` -> `libfoo.so.1.2.3`):
        a library shipped without the symlink ldconfig would make, found by its SONAME."""
        if "/" in name:
            return []
        if self._versions is None:
            self._versions = self._index_versions()
        return list(self._versions.get(name, ()))

    def _index_versions(self) -> dict[str, list[Member]]:
        """Every name a member answers as `name` + version, once: a folder holds tens of thousands
        of files, and scanning them all per lookup cost seconds."""
        index: dict[str, list[Member]] = {}
        for base in sorted(self._by_name):
            for i, ch in enumerate(base):
                if ch == "." and base[i + 1:].replace(".", "").isdigit():
                    index.setdefault(base[:i], []).extend(self._by_name[base])
        return index


# ---------------------------------------------------------------- paths


def probe(path: str, fs: FileSystem = HOST) -> tuple[int, str, int] | None:
    """(bits, endian, e_machine) from an ELF header, or None if not a readable ELF file.

    Only the 20 header bytes ld.so itself checks before mapping a candidate.
    """
    head = fs.head(path, 20)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    endian = "little" if head[5] == 1 else "big"
    return (32 if head[4] == 1 else 64, endian, int.from_bytes(head[18:20], endian))


class Paths:
    """Maps paths of the audited system to `fs`'s, honouring --root."""

    def __init__(self, root: str | None, fs: FileSystem = HOST):
        self.root = root.rstrip("/") if root else None
        self.fs = fs
        self._real_host: dict[str, str | None] = {}  # realpath on this machine, once per path and run

    def host(self, path: str) -> str:
        """An absolute path as the audited system sees it -> where it is here."""
        return self.root + path if self.root and path.startswith("/") else path

    def real(self, host_path: str) -> str | None:
        """Symlinks resolved, staying inside the sysroot (or the image); None if missing or a loop."""
        root = self.root or ""
        if self.fs is HOST and (not root or not (host_path == root or host_path.startswith(root + "/"))):
            if host_path not in self._real_host:
                try:
                    self._real_host[host_path] = os.path.realpath(host_path, strict=True)
                except (OSError, RuntimeError):
                    self._real_host[host_path] = None
            return self._real_host[host_path]
        if not host_path.startswith("/"):
            return None
        todo = deque(host_path[len(root):].split("/"))
        done: list[str] = []
        links = 0
        while todo:
            part = todo.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            here = root + "/" + "/".join(done + [part])
            kind = self.fs.kind(here)
            if kind is None:
                return None
            if kind == "link":
                links += 1
                if links > _MAX_LINKS:
                    return None
                try:
                    target = self.fs.readlink(here)
                except OSError:
                    return None
                if target.startswith("/"):
                    done = []  # absolute targets are inside the sysroot
                todo.extendleft(reversed(target.split("/")))
            else:
                done.append(part)
        return root + "/" + "/".join(done)

    def is_file(self, path: str) -> bool:
        real = self.real(path)
        return real is not None and self.fs.kind(real) == "file"

    def probe(self, path: str) -> tuple[int, str, int] | None:
        return probe(path, self.fs)

    def glob(self, pattern: str) -> list[str]:
        return sorted(_glob.glob(self.host(pattern))) if self.fs is HOST else fs_glob(self.fs, self.host(pattern))


def expand_dst(entry: str, origin: str, bits: int, machine: int) -> str | None:
    """$ORIGIN, $LIB, $PLATFORM (and ${...}) expanded; None if an unknown token remains."""
    triplet = _TRIPLETS.get((bits, machine))
    values = {"ORIGIN": origin, "LIB": f"lib/{triplet}" if triplet else ("lib64" if bits == 64 else "lib"),
              "PLATFORM": (triplet or "").split("-")[0]}
    for key, value in values.items():
        entry = entry.replace("${" + key + "}", value).replace("$" + key, value)
    return None if "$" in entry else entry


def read_ldso_conf(paths: Paths, conf: str) -> tuple[list[str], list[str]]:
    """(directories in order, warnings) from ld.so.conf and its `include` globs, recursively."""
    dirs: list[str] = []
    warnings: list[str] = []
    seen: set[str] = set()

    def parse(path: str, depth: int) -> None:
        if depth > 16 or path in seen:
            warnings.append(f"ld.so.conf include loop or depth at {path}")
            return
        seen.add(path)
        real = paths.real(paths.host(path))  # symlinks resolved inside the audited system
        text = paths.fs.read_text(real, 1 << 20) if real else None
        if text is None:
            if depth == 0:
                warnings.append(f"cannot read {path}; using only the default directories")
            return
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include") and line[7:8].isspace():
                for pat in line[8:].split():
                    if not pat.startswith("/"):
                        pat = os.path.join(os.path.dirname(path), pat)
                    for hit in paths.glob(pat):
                        inner = hit[len(paths.root):] if paths.root else hit
                        parse(inner, depth + 1)
            elif line.startswith("hwcap"):
                continue
            else:
                for d in line.replace(",", " ").replace(":", " ").split():
                    d = d.split("=", 1)[0]  # old "dir=TYPE" syntax
                    if d.startswith("/") and d not in dirs:
                        dirs.append(d)

    parse(conf, 0)
    return dirs, warnings


def default_dirs(bits: int, machine: int) -> list[str]:
    triplet = _TRIPLETS.get((bits, machine))
    multi = [f"/lib/{triplet}", f"/usr/lib/{triplet}"] if triplet else []
    wide = ["/lib64", "/usr/lib64"] if bits == 64 else ["/lib32", "/usr/lib32"]
    return multi + wide + ["/lib", "/usr/lib"]


# ---------------------------------------------------------------- the tree



def loaded_again(node: DepNode, name: str, first: DepNode) -> None:
    """A NEEDED name some object of the tree already loaded: shown under `node`, not walked again."""
    node.children.append(DepNode(name=name, status="loaded", path=first.path, realpath=first.realpath,
                                 how="loaded", note="already loaded"))


def attach(node: DepNode, child: DepNode, key: str, edge: str, loaded: dict, by_real: dict, chain: tuple,
           queue, by_soname: bool = False) -> None:
    """Add a resolved library under `node` (every resolver builds its tree the same way): a file
    already in the tree is shown as loaded and not walked again (a dlopen of it adds nothing); a
    new one is walked next, within MAX_DEPTH. `loaded` maps names (and, `by_soname`, sonames) to
    the node that loaded them; `by_real` real paths to their first node."""
    first = by_real.get(child.realpath) if child.realpath else None
    if first is not None:
        loaded[key] = first
        if edge != "dlopen":
            child.status, child.how, child.note = "loaded", "loaded", f"same file as {first.name}"
            node.children.append(child)
        return
    node.children.append(child)
    loaded[key] = child
    if child.realpath:
        by_real[child.realpath] = child
    if by_soname and child.soname:
        loaded.setdefault(child.soname, child)
    if child.status in ("inspected", "unlisted"):
        if len(chain) > MAX_DEPTH:
            raise TreeTooLarge(f"dependency chain deeper than {MAX_DEPTH} libraries "
                               f"(at {child.name}, needed by {node.name})")
        queue.append((child, chain + (child,)))


MAX_PRELOADS = 1024
PRELOAD_FILE = "/etc/ld.so.preload"


def _dynamic(info: ElfInfo) -> bool:
    """Loaded through ld.so (a static program is not, and gets no preload)."""
    return bool(info.interpreter or info.needed or info.soname or info.elf_type == "ET_DYN")


def read_ld_preload(paths: Paths) -> list[str]:
    """The libraries /etc/ld.so.preload of the audited system names: glibc's ld.so loads each into
    every dynamically linked program before its own dependencies (entries split at ':', spaces,
    tabs and newlines, as rtld does). Past MAX_PRELOADS the list is cut there, and the tree of every
    file that would load them is an error (tree())."""
    real = paths.real(paths.host(PRELOAD_FILE))  # symlinks resolved inside the audited system
    text = paths.fs.read_text(real, 1 << 20) if real else None
    if not text:
        return []
    return list(dict.fromkeys(e for e in text.replace(":", " ").split() if e))


class Resolver:
    """Builds dependency trees for audited objects; one per check run (caches ld.so.conf)."""

    def __init__(self, options: ResolveOptions, policy, read: Callable[[str], ElfInfo], fs: FileSystem = HOST):
        self.options = options
        self.policy = policy
        self.read = read  # path -> ElfInfo (cached by the caller); raises on unparseable input
        self.paths = Paths(options.root, fs)
        self.conf_dirs, self.warnings = read_ldso_conf(self.paths, options.ldso_conf)
        # what a process of the audited system loads with every object, as (name, how it is asked
        # for), in ld.so's order: LD_PRELOAD (an image's Env, or this shell's under --use-env), then
        # /etc/ld.so.preload (an image's or --root's; never this machine's, which is the runner's)
        env = options.ld_preload if options.use_env else None
        self.preload = [(n, "LD_PRELOAD") for n in dict.fromkeys((env or "").replace(":", " ").split())]
        self.preload += [(n, PRELOAD_FILE) for n in (read_ld_preload(self.paths) if (options.root or fs is not HOST)
                                                     else [])]
        self.env_dirs = [d for d in (options.ld_library_path or "").split(":") if d] if options.use_env else []
        self._system: dict[tuple[int, int], set[str]] = {}
        self.memo: dict = {}  # what the checker derives once per run from objects read (scan.py)

    def tree(self, info: ElfInfo, path: str, members: MemberSet | None = None) -> tuple[DepNode, list[str]]:
        """The dependency tree of the object at `path` (already read as `info`), and warnings.

        `members`: the wheel, folder or image the object came from; a name ld.so's search does
        not reach is then looked up among them (and a warning says which member was taken).
        """
        warnings: list[str] = []
        ident = self.paths.probe(path) or (info.elf_class, info.endian, -1)
        rootnode = DepNode(name=os.path.basename(path), status="root", path=path,
                           realpath=self.paths.real(path) or path, soname=info.soname, info=info)
        loaded: dict[str, DepNode] = {os.path.basename(path): rootnode}
        if info.soname:
            loaded[info.soname] = rootnode
        by_real: dict[str, DepNode] = {rootnode.realpath: rootnode}
        queue: deque[tuple[DepNode, tuple[DepNode, ...]]] = deque([(rootnode, (rootnode,))])
        count = 0
        if len(self.preload) > MAX_PRELOADS and _dynamic(info):
            raise TreeTooLarge(f"{PRELOAD_FILE} names more than {MAX_PRELOADS} libraries")
        while queue:
            node, chain = queue.popleft()
            # (name, edge, how it is asked for: None for DT_NEEDED); filter and audit libraries load
            # as a NEEDED does (audit/elf/dynamic.py)
            edges = ([(n, "needed", how) for n, how in self.preload if node is rootnode and _dynamic(node.info)]
                     + [(n, "needed", None) for n in node.info.needed]
                     + [(n, "needed", tag) for tag, n in node.info.extra_loads]
                     + [(n, "dlopen", None) for n in dlopen_names(node.info)])
            for needed, edge, request in edges:
                count += edge == "needed"  # a dlopen string counts once it names a file (below)
                if count > self.options.max_nodes:
                    raise TreeTooLarge(f"dependency tree has more than {self.options.max_nodes} edges")
                if needed in loaded:
                    if edge == "needed":
                        loaded_again(node, needed, loaded[needed])
                    continue
                if edge == "dlopen":
                    # A denied name is a dlopen-string finding already; a trusted one is a system
                    # library; an unfound one is only a string: none of them is an edge to walk.
                    if self.policy.is_trusted(needed) or self.policy.deny_rule_for_soname(needed):
                        continue
                    child = self._resolve(needed, node, chain, ident, warnings, members, dlopen=True)
                    if child is None:
                        continue
                    count += 1
                else:
                    child = self._resolve(needed, node, chain, ident, warnings, members)
                    child.request = request
                attach(node, child, needed, edge, loaded, by_real, chain, queue, by_soname=True)
        return rootnode, warnings

    def _resolve(self, needed: str, requester: DepNode, chain, ident, warnings: list[str],
                 members: MemberSet | None = None, dlopen: bool = False) -> DepNode | None:
        rule = None if dlopen else self.policy.deny_rule_for_soname(needed)
        found = self._search(needed, requester, chain, ident, warnings)
        if found is None and dlopen and "/" not in needed:
            # loaders commonly dlopen dirname(dladdr(self)) + name: a file shipped beside the caller
            beside = os.path.join(_origin(requester), needed)
            hit = self._candidate(beside, ident)
            found = (beside, hit, "beside", requester.name) if hit else None
        member = None
        if found is None and members is not None:
            member = self._member(needed, requester, ident, members, warnings, dlopen)
            found = (member.path, self.paths.real(member.path), "member", members.label) if member else None
        for how, d in self.options.fallback if found is None else ():  # e.g. the conda environment
            hit = self._candidate(os.path.join(d, needed), ident)  # the package will be installed into
            found = (os.path.join(d, needed), hit, how, None) if hit else None
            if found:
                break
        if found is None:
            if dlopen:
                return None
            return DepNode(name=needed, status="denied" if rule else "unresolved",
                           rule=rule.id if rule else None, note="not found")
        path, real, how, via = found
        node = DepNode(name=needed, status="", path=path, realpath=real, how=how, via=via,
                       edge="dlopen" if dlopen else "needed")
        if member is not None:
            node.note = f"not on ld.so's search path; resolved to member {member.shown}"
        rule = rule or self.policy.deny_rule_for_soname(os.path.basename(real))
        if rule:
            node.status, node.rule = "denied", rule.id
            return node
        listed = self.policy.is_inspected(needed)
        if self.policy.is_trusted(needed):
            if how in SYSTEM_HOW:
                node.status = "trusted"
                return node
            listed = True
            node.note = "; ".join(filter(None, [node.note, "trusted name found outside the system directories: inspected"]))
        try:
            node.info = self.read(real)
        except Exception as exc:  # fail closed: an unreadable dependency cannot be vouched for
            node.status = "error"
            node.note = " ".join(str(getattr(exc, "message", exc)).split()) or type(exc).__name__
            return node
        node.soname = node.info.soname
        rule = self.policy.deny_rule_for_soname(node.soname) if node.soname else None
        if rule:
            node.status, node.rule = "denied", rule.id
            node.note = f"SONAME {node.soname}"
            return node
        node.status = "inspected" if listed else "unlisted"
        return node

    def _member(self, name: str, requester: DepNode, ident, members: MemberSet, warnings: list[str],
                dlopen: bool) -> Member | None:
        """The fallback: a member of the audited wheel/folder/image with this file name (of the
        audited object's class and machine), else one whose file name is this name plus a version
        and whose SONAME is this name; the first by reported path if several."""
        hits = [m for m in members.lookup(name) if self._candidate(m.path, ident)]
        if not hits:
            hits = [m for m in members.versions_of(name) if self._candidate(m.path, ident) and self._soname(m.path) == name]
        if not hits:
            return None
        m = hits[0]
        asked = "dlopen string" if dlopen else "DT_NEEDED"
        more = f" ({len(hits) - 1} other member(s) of that name not taken)" if len(hits) > 1 else ""
        _warn(warnings, f"{asked} {name} of {requester.name} is not on ld.so's search path; "
                        f"resolved to member {m.shown}{more}")
        return m

    def _soname(self, path: str) -> str | None:
        try:
            return self.read(path).soname
        except Exception:  # noqa: BLE001 - unreadable: not the library asked for (it is audited on its own)
            return None

    def _search(self, name: str, requester: DepNode, chain, ident, warnings) -> tuple[str, str, str, str | None] | None:
        bits, _endian, machine = ident
        info = requester.info
        origin = _origin(requester)
        if "/" in name:
            expanded = expand_dst(name, origin, bits, machine)
            if expanded is None:
                return None
            host = self.paths.host(expanded) if expanded.startswith("/") else os.path.abspath(expanded)
            hit = self._candidate(host, ident)
            return (host, hit, "path", None) if hit else None
        searches: list[tuple[str, str | None, list[str], str]] = []
        if not info.runpath:
            for node in reversed(chain):  # the requester, its loader, ... the audited object
                if node.info is not None and not node.info.runpath and node.info.rpath:
                    searches.append(("rpath", node.name, node.info.rpath, _origin(node)))
        searches.append(("ldpath", None, self.options.ldpath, ""))
        searches.append(("LD_LIBRARY_PATH", None, self.env_dirs, ""))
        if info.runpath:
            searches.append(("runpath", requester.name, info.runpath, origin))
        searches.append(("ld.so.conf", None, self.conf_dirs, ""))
        searches.append(("default", None, default_dirs(bits, machine), ""))
        for how, via, dirs, dir_origin in searches:
            for entry in dirs:
                d = self._dir(how, via, entry, dir_origin, bits, machine, warnings)
                if d is None:
                    continue
                host = os.path.join(d, name)
                hit = self._candidate(host, ident)
                if hit:
                    return host, hit, how, via
        return None

    def _dir(self, how, via, entry, origin, bits, machine, warnings) -> str | None:
        if how in ("ldpath", "LD_LIBRARY_PATH"):
            return entry  # paths in the file system searched (this machine's, or the image's)
        if how in ("rpath", "runpath"):
            expanded = expand_dst(entry, origin, bits, machine)
            label = f"DT_{how.upper()} entry '{entry}' of {via}"
            if expanded is None:
                _warn(warnings, f"{label}: unknown $-token, skipped")
                return None
            if not expanded.startswith("/"):
                _warn(warnings, f"{label}: relative to the process's working directory (a hijack risk), skipped")
                return None
            # $ORIGIN already names a path on this machine; other absolute entries are the system's.
            return expanded if entry.startswith(("$ORIGIN", "${ORIGIN}")) else self.paths.host(expanded)
        return self.paths.host(entry)

    def own_dirs(self, node: DepNode) -> list[tuple[str, str, str]]:
        """(tag, entry, directory here) for the object's own DT_RUNPATH, else DT_RPATH entries."""
        info = node.info
        tag, entries = ("runpath", info.runpath) if info.runpath else ("rpath", info.rpath)
        got = self.paths.probe(node.realpath or node.path or "")
        machine = got[2] if got else -1
        out = []
        for entry in entries:
            d = self._dir(tag, node.name, entry, _origin(node), info.elf_class, machine, [])
            if d:
                out.append((f"DT_{tag.upper()}", entry, d))
        return out

    def is_system_dir(self, directory: str, bits: int, machine: int) -> bool:
        """Whether `directory` is one ld.so searches anyway (ld.so.conf or default directories)."""
        real = self.paths.real(directory)
        if real is None:
            return False
        key = (bits, machine)
        if key not in self._system:
            dirs = {self.paths.real(self.paths.host(d)) for d in self.conf_dirs + default_dirs(bits, machine)}
            self._system[key] = dirs - {None}
        return real in self._system[key]

    def _candidate(self, host: str, ident) -> str | None:
        """The real path of `host` if it is an ELF of the audited object's class and machine."""
        real = self.paths.real(host)
        if real is None or self.paths.fs.kind(real) != "file":
            return None
        got = self.paths.probe(real)
        if got is None or (ident[2] != -1 and got != ident) or got[0] != ident[0]:
            return None
        return real


class TreeTooLarge(Exception):
    pass


def dlopen_names(info: ElfInfo) -> list[str]:
    """Library file names (no '/') in the object's data, first occurrence order: what it may dlopen.
    A name mentioned in text (prose, help text: audit.elf.strings.is_mention) is not one."""
    return list(dict.fromkeys(h.text for h in info.library_strings if "/" not in h.text and not is_mention(h)))


def _origin(node: DepNode) -> str:
    """$ORIGIN: the directory of the path the object was found by, symlinks NOT resolved (glibc
    takes it from the name it opened); for an audited executable, its real path (the kernel's)."""
    if node.status == "root" and node.info is not None and node.info.interpreter:
        return os.path.dirname(node.realpath or node.path or ".")
    return os.path.dirname(os.path.abspath(node.path or node.realpath or "."))


def _warn(warnings: list[str], text: str) -> None:
    if text not in warnings:
        warnings.append(text)

"""What both SBOMs (cyclonedx.py, spdx.py) describe, taken once from a CheckReport: a graph of
components and typed edges (docs/sbom.md).

Components, each once, by a reference unique in the document:
  - `container:PATH`  a wheel, conda package or image that audited files came from;
  - the audited files, by their reported path (`x.whl!/pkg/lib.so`), in their container;
  - `lib:PATH`        a library a file's tree resolved to that is not itself audited here;
  - `unresolved:NAME` a library named (DT_NEEDED, a dlopen string, .note.dlopen) but not found;
  - `vendor:RULE`     a vendor library known only by its evidence (a static copy of its code,
                      its device kernels, imports of its API), named after the policy's rule.
Edges (EDGE_KINDS): the resolved tree's NEEDED and dlopen edges, the libraries a file's
`.note.dlopen` declares, and each finding that shows a library without a tree edge to it.
Every finding stays on the component it was found in, with the file's verdict.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field

from audit import __version__
from audit.errors import UsageError, printable
from audit.linkage.containers.identity import PackageId, note_package
from audit.linkage.judging.policy import Policy
from audit.linkage.model import WHEEL_SEP, CheckReport, FileResult, Finding

NS = "sovereign-audit"
# edge kind -> (what it means, the SPDX 2.3 relationship type)
EDGE_KINDS = {
    "needed": ("loaded by the dynamic loader at start (DT_NEEDED, an import, a load command)", "DYNAMIC_LINK"),
    "dlopen": ("loaded at run time by name (a library-name string, a name assembled in code)", "DYNAMIC_LINK"),
    "dlopen-declared": ("declared in the file's .note.dlopen as loaded at run time", "DYNAMIC_LINK"),
    "imported-symbols": ("the file imports the vendor library's API", "DYNAMIC_LINK"),
    "static-copy": ("the vendor library's code is compiled into the file", "STATIC_LINK"),
    "embedded-device-code": ("the file embeds the vendor library's GPU kernels", "CONTAINS"),
}
# finding kind -> edge kind towards the library it names (kinds absent here are properties only)
_FINDING_EDGES = {"dlopen-string": "dlopen", "assembled-name": "dlopen", "dlsym-string": "dlopen",
                  "imported-symbol": "imported-symbols", "static-symbol": "static-copy",
                  "static-string": "static-copy", "device-kernel": "embedded-device-code"}
_NAMED = {"dlopen-string", "assembled-name"}  # the finding's subject is a library's file name
_SHARED = {"ET_DYN", "MH_DYLIB", "MH_BUNDLE"}
_CONTAINER_TYPES = {"wheel": "library", "conda": "library", "zip": "library", "deb": "library", "rpm": "library",
                    "tar": "file", "image": "container", "static-archive": "library"}


@dataclass
class Component:
    ref: str
    role: str  # "container" | "file" | "library" | "unresolved" | "vendor"
    name: str
    kind: str  # CycloneDX component type: "library" | "application" | "file" | "container"
    sha256: str | None = None
    size: int | None = None
    package: PackageId | None = None
    parent: str | None = None  # the container component it is nested in
    properties: list[tuple[str, str]] = field(default_factory=list)  # (name without NS prefix, value)

    def prop(self, name: str, value) -> None:
        if value is not None and value != "" and (name, str(value)) not in self.properties:
            self.properties.append((name, str(value)))


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # one of EDGE_KINDS
    detail: str | None = None  # e.g. the finding or note that shows it


@dataclass
class Graph:
    components: dict[str, Component]
    edges: list[Edge]
    report: CheckReport
    policy: Policy
    _children: dict | None = field(default=None, repr=False)

    def children(self, parent: str | None) -> list[Component]:
        if self._children is None:
            self._children = {}
            for c in self.components.values():
                self._children.setdefault(c.parent, []).append(c)
        return self._children.get(parent, [])

    def depends(self) -> dict[str, list[str]]:
        """Each component's targets, in edge order, without repeats."""
        out: dict[str, list[str]] = {ref: [] for ref in self.components}
        for e in self.edges:
            if e.target not in out[e.source]:
                out[e.source].append(e.target)
        return out


def finding_value(f: Finding) -> str:
    """A finding as one property value: compact JSON, keys sorted (docs/sbom.md)."""
    d = {"rule": f.rule, "mechanism": f.kind, "subject": f.subject, "where": f.where, "reason": f.reason,
         "severity": f.severity, "failing": f.failing, "count": f.count}
    for k in ("in_file", "excepted", "exception_expired", "baseline", "use_instead"):
        if getattr(f, k):
            d[k.replace("_", "-")] = getattr(f, k)
    if len(f.chain) > 1:
        d["chain"] = f.chain
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def build_graph(report: CheckReport, policy: Policy) -> Graph:
    comps: dict[str, Component] = {}
    edges: list[Edge] = []
    seen_edges: set[tuple[str, str, str]] = set()

    def edge(source: str, target: str, kind: str, detail: str | None = None) -> None:
        if source != target and (source, target, kind) not in seen_edges:
            seen_edges.add((source, target, kind))
            edges.append(Edge(source, target, kind, detail))

    containers = {c.path for c in report.containers}
    for c in report.containers:
        name = c.package.name if c.package else c.path.rstrip("/").rsplit(WHEEL_SEP, 1)[-1].rsplit("/", 1)[-1]
        comp = comps[f"container:{c.path}"] = Component(
            f"container:{c.path}", "container", name, _CONTAINER_TYPES[c.kind], c.sha256, c.size, c.package,
            parent=_container_of(c.path, containers))
        comp.prop("container", c.kind)
        comp.prop("path", c.path)
        comp.prop("image-id", c.digest)

    # the audited files first: a library audited in this run is named by its own result
    by_path: dict[str, str] = {}
    for fr in report.files:
        comps[fr.path] = _file_component(fr, containers)
        by_path[fr.path] = fr.path
        if WHEEL_SEP not in fr.path:  # a file on this machine: its tree names it by its real path
            by_path.setdefault(os.path.realpath(fr.path), fr.path)

    members = {}  # (container ref, file name) -> the audited file's ref
    for fr in report.files:
        members.setdefault((comps[fr.path].parent, comps[fr.path].name), fr.path)

    def library(node) -> str:
        where = node.realpath or node.path
        if where and where in by_path:
            return by_path[where]
        if node.path and node.path in by_path:
            return by_path[node.path]
        if not where:
            return unresolved(node.name)
        ref = f"lib:{where}"
        if ref not in comps:
            name = node.soname or os.path.basename(where.split(WHEEL_SEP)[-1]) or node.name
            comp = comps[ref] = Component(ref, "library", name, "library", node.sha256, node.size,
                                          note_package(node.package_note), parent=_container_of(where, containers))
            comp.prop("path", where)
            comp.prop("soname", node.soname)
            comp.prop("size", node.size)
            comp.prop("status", node.status)
            comp.prop("found-by", node.how)
            comp.prop("rule", node.rule)
            if node.sha256 is None:
                comp.prop("not-hashed", "trusted by the policy: not read" if node.status == "trusted" else "not read")
        return ref

    def unresolved(name: str) -> str:
        ref = f"unresolved:{name}"
        if ref not in comps:
            comp = comps[ref] = Component(ref, "unresolved", name, "library")
            comp.prop("status", "unresolved")
            comp.prop("note", "named but not found where the loader would search; no file read")
        return ref

    def vendor(rule_id: str) -> str:
        ref = f"vendor:{rule_id}"
        if ref not in comps:
            rule = policy.rule(rule_id)
            comp = comps[ref] = Component(ref, "vendor", (rule.name if rule and rule.name else rule_id), "library")
            comp.prop("rule", rule_id)
            comp.prop("note", "known by its evidence in the files that depend on it, not as a file")
        return ref

    # each library first from the node that loaded it (its digest, how it was found): a node
    # that says "already loaded" may come earlier in a depth-first walk
    for fr in report.files:
        for node, chain in fr.tree.walk() if fr.tree is not None else ():
            if len(chain) > 1 and node.status not in ("root", "loaded", "unresolved"):
                library(node)

    for fr in report.files:
        names: dict[str, str] = {}  # a library's requested name -> its ref, in this file's tree
        if fr.tree is not None:
            refs: dict[int, str] = {}
            for node, chain in fr.tree.walk():
                if len(chain) == 1 or node.status == "root":
                    refs[id(node)] = fr.path
                    continue
                ref = refs[id(node)] = library(node) if node.status not in ("unresolved",) else unresolved(node.name)
                names.setdefault(node.name, ref)
                parent = refs.get(id(chain[-2]), fr.path)
                edge(parent, ref, "dlopen" if node.edge == "dlopen" else "needed", node.request)
        for decl in fr.dlopen_declared:
            for soname in decl.sonames:
                detail = ", ".join(x for x in (decl.priority, decl.feature) if x) or None
                # not walked by the resolver: found as its tree names it, else among the files
                # audited with it in its container (as the member fallback would)
                target = names.get(soname) or members.get((comps[fr.path].parent, soname)) or unresolved(soname)
                edge(fr.path, target, "dlopen-declared", detail)
        for f in fr.findings:
            source = fr.path  # found in a dependency: on the dependency's own component
            if f.in_file:
                source = by_path.get(f.in_file) or (f"lib:{f.in_file}" if f"lib:{f.in_file}" in comps else fr.path)
            comps[source].prop("finding", finding_value(f))
            kind = _FINDING_EDGES.get(f.kind)
            if kind is None:
                continue
            # a library-name string names its file; a dlopen-string finding of stubs or trampolines
            # has an API name as subject (cublasCreate_v2): its target is the vendor, not a file
            if f.kind in _NAMED and (f.subject in names or policy.deny_rule_for_soname(f.subject)):
                target = names.get(f.subject) or unresolved(f.subject)
            else:
                target = vendor(f.rule)
            edge(source, target, kind, f"{f.kind}: {f.subject}")
    if not any(c.parent is None and c.role in ("container", "file") for c in comps.values()):
        # nothing was audited (an empty folder): the inputs themselves, so a document still
        # describes what it is about
        for path in report.inputs:
            comp = comps.setdefault(f"input:{path}", Component(f"input:{path}", "input", path, "file"))
            comp.prop("path", path)
            for e in report.errors:
                comp.prop("error", e)
    return Graph(comps, edges, report, policy)


def _file_component(fr: FileResult, containers: set[str]) -> Component:
    shared = fr.soname or fr.elf_type in _SHARED or fr.path.lower().endswith((".dll", ".pyd", ".so", ".dylib"))
    kind = "library" if shared else "application" if fr.elf_type in ("ET_EXEC", "MH_EXECUTE") else "file"
    name = fr.path.split(WHEEL_SEP)[-1].rsplit("/", 1)[-1] or fr.path
    comp = Component(fr.path, "file", name, kind, fr.sha256, fr.size, fr.package,
                     parent=_container_of(fr.path, containers))
    comp.prop("path", fr.path)
    comp.prop("verdict", fr.verdict)
    comp.prop("error", fr.error)
    comp.prop("soname", fr.soname)
    comp.prop("size", fr.size)
    comp.prop("format", fr.format or ("elf" if fr.sha256 or fr.machine else None))
    comp.prop("machine", fr.machine)
    if fr.layer:
        comp.prop("layer-index", fr.layer.get("index"))
        comp.prop("layer-digest", fr.layer.get("digest"))
    for t in fr.device_targets:
        comp.prop("device-target", t)
    for d in fr.dlopen_declared:
        comp.prop("dlopen-declared", json.dumps({"soname": list(d.sonames), "feature": d.feature,
                                                 "priority": d.priority, "description": d.description},
                                                sort_keys=True, separators=(",", ":"), ensure_ascii=True))
    if fr.package is not None:
        comp.prop("package-source", fr.package.source)
    return comp


def _container_of(path: str, containers: set[str]) -> str | None:
    """The innermost container `path` is a member of (`x.whl!/lib/libx.a!/x.o`: the archive,
    itself in the wheel): the longest container name followed by `!` that starts it."""
    best = None
    for at in range(len(path)):
        if path[at] == "!" and path[:at] in containers:
            best = path[:at]
    return f"container:{best}" if best is not None else None


def created() -> str:
    """The documents' date: SOURCE_DATE_EPOCH when set (reproducible builds' convention), else
    the Unix epoch, so the same input always gives the same bytes (docs/sbom.md)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    try:
        seconds = int(epoch) if epoch else 0
        if seconds < 0:
            raise ValueError
        return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"SOURCE_DATE_EPOCH={printable(epoch)!s}: not a number of seconds since 1970 "
                         "(the SBOMs' date)") from None


def content_uuid(doc: dict) -> str:
    """A UUID made from the document's own content (without its serial): the same content, the
    same UUID; any change to it, another."""
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=True).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=5))


def summary_properties(report: CheckReport, policy: Policy) -> list[tuple[str, str]]:
    props = [("tool", f"sovereign-audit {__version__}"), ("policy", policy.name)]
    props += [("policy-source", f"{s['path']} sha256:{s['sha256']}") for s in policy.sources]
    props += [("verdict", report.verdict), ("exit-code", str(report.exit_code))]
    props += [("input", p) for p in report.inputs]
    props += [("error", e) for e in report.errors]
    return props

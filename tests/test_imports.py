"""The packages' import graphs: no cycle anywhere under audit/ or flash_kernel/, and the stages never import `run`.

Every `import`/`from ... import` in every module is read with ast, the ones inside functions
included (a function-level import still ties the two modules together; it only hides the cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} for every .py file of `package` under root."""
    mods = {}
    for p in (root / package).rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = p
    return mods


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, module-level and function-level imports alike."""
    mods = _modules(root, package)

    def owner(name: str) -> str | None:  # the module that defines `name` (a module, or a name in one)
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges |= {owner(a.name) for a in node.names if a.name.split(".")[0] == package}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x / from ..y import z
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] != package:
                    continue
                edges |= {owner(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else owner(base)
                          for a in node.names}
        graph[mod] = {e for e in edges if e and e != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp)


def test_no_import_cycle_under_audit():
    graph = import_graph(REPO, "audit")
    assert "audit.run.runner" in graph and "audit.report.bundle" in graph  # the walk found the package
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


def test_no_import_cycle_in_the_kernel_package():
    # the ctypes binding sits below the torch custom ops, and the package above both
    graph = import_graph(REPO, "flash_kernel")
    assert graph["flash_kernel._op"] == {"flash_kernel._binding"}
    assert graph["flash_kernel._binding"] == set()
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


def test_report_and_the_stages_never_import_run():
    graph = import_graph(REPO, "audit")
    assert "audit.report.bundle" in graph["audit.run.runner"]  # run sits above the report
    below = [m for m in graph if not (m == "audit.run" or m.startswith("audit.run."))
             and m not in ("audit.cli", "audit.__main__")]
    offenders = {m: sorted(e for e in graph[m] if e == "audit.run" or e.startswith("audit.run."))
                 for m in below}
    assert not {m: e for m, e in offenders.items() if e}


def test_the_walk_sees_function_level_and_relative_imports(tmp_path):
    """The detector itself: a cycle hidden in a function, and one through a relative import, are found."""
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def late():\n    from demo.a import x\n    return x\n")
    (pkg / "c.py").write_text("from .sub import d\n")
    (pkg / "sub" / "d.py").write_text("import demo.c\n")
    (pkg / "e.py").write_text("import os\nfrom demo import a\n")
    graph = import_graph(tmp_path, "demo")
    assert cycles(graph) == [["demo.a", "demo.sub.b"], ["demo.c", "demo.sub.d"]]
    assert graph["demo.e"] == {"demo.a"}


# the data flow build -> audit -> evidence -> report, as layers: a package may import only from a
# lower layer (the shared utilities at the bottom, the command line at the top)
LAYERS = [
    {"audit", "audit.errors", "audit.files", "audit.forking", "audit.resources", "audit.schemas"},
    {"audit.signing"},                           # Ed25519 keys and DSSE envelopes
    {"audit.elf", "audit.binformat", "audit.kernel_build"},  # reading binaries; building the kernel
    {"audit.binary"},                            # the model the other formats share, and their helpers
    {"audit.pe", "audit.macho", "audit.python_source"},  # reading Windows and macOS binaries, Python sources
    {"audit.linkage", "audit.evidence"},         # judging binaries; measuring the kernel
    {"audit.report"},                            # saved evidence to a signed bundle
    {"audit.run"},                               # the whole job
    {"audit.cli"},
    {"audit.__main__"},
]


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_each_stage_imports_only_the_layers_below_it():
    graph = import_graph(REPO, "audit")
    layer = {pkg: i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}
    unplaced = sorted({_package(m) for m in graph} - set(layer))
    assert not unplaced, f"packages missing from LAYERS: {unplaced}"
    upward = sorted(f"{m} -> {e}" for m, es in graph.items() for e in es
                    if _package(m) != _package(e) and layer[_package(e)] >= layer[_package(m)])
    assert not upward, "imports of the same or a higher layer: " + "; ".join(upward)

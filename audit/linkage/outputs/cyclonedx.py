"""CycloneDX 1.6 JSON rendering of what `check` audited (docs/sbom.md; validated in tests
against the official schema and cyclonedx-python-lib's validator).

Containers (wheels, conda packages, images) hold their audited files as nested components;
every library a tree resolved to, every library named but not found and every vendor library
known by its evidence is a component too. `dependencies` is the graph; the kind of each edge,
each finding and each file's verdict are `sovereign-audit:*` properties.
"""

from __future__ import annotations

import json

from audit import __version__
from audit.errors import no_commands
from audit.linkage.judging.policy import Policy
from audit.linkage.model import CheckReport
from audit.linkage.outputs.sbom import NS, Component, Graph, build_graph, content_uuid, created, summary_properties

SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"


def _component(c: Component, g: Graph, out_edges: dict[str, list]) -> dict:
    d: dict = {"type": c.kind, "bom-ref": c.ref, "name": c.name}
    if c.package is not None and c.package.version:
        d["version"] = c.package.version
    if c.sha256:
        d["hashes"] = [{"alg": "SHA-256", "content": c.sha256}]
    if c.package is not None and c.package.purl:
        d["purl"] = c.package.purl
    props = [{"name": f"{NS}:role", "value": c.role}]
    props += [{"name": f"{NS}:{name}", "value": value} for name, value in c.properties]
    props += [{"name": f"{NS}:edge:{e.kind}", "value": e.target} for e in out_edges.get(c.ref, ())]
    d["properties"] = props
    kids = g.children(c.ref)
    if kids:
        d["components"] = [_component(k, g, out_edges) for k in kids]
    return d


def render_cyclonedx(report: CheckReport, policy: Policy) -> str:
    g = build_graph(report, policy)
    out_edges: dict[str, list] = {}
    for e in g.edges:
        out_edges.setdefault(e.source, []).append(e)
    doc: dict = {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "timestamp": created(),
            "tools": {"components": [{"type": "application", "name": "sovereign-audit", "version": __version__}]},
            "properties": [{"name": f"{NS}:{n}", "value": v} for n, v in summary_properties(report, policy)],
        },
        "components": [_component(c, g, out_edges) for c in g.children(None)],
        "dependencies": [{"ref": ref, "dependsOn": targets} for ref, targets in g.depends().items()],
    }
    doc["serialNumber"] = f"urn:uuid:{content_uuid(doc)}"
    order = ("$schema", "bomFormat", "specVersion", "serialNumber", "version", "metadata", "components", "dependencies")
    doc = {k: doc[k] for k in order}
    # as render_json: exact strings, ASCII only, and no line a CI runner would obey
    return no_commands(json.dumps(doc, indent=2, ensure_ascii=True) + "\n", "\\u003a", "\\u005b")

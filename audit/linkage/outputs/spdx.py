"""SPDX 2.3 JSON rendering of what `check` audited (docs/sbom.md; validated in tests against
the official schema and spdx-tools' parser and validator).

Every container, audited file and library is a package (`filesAnalyzed: false`: SPDX files
must carry a SHA-1, which this tool does not compute); containers CONTAIN their files; the
edges are DYNAMIC_LINK / STATIC_LINK / CONTAINS relationships whose comment names the edge
kind; findings, verdicts and the other `sovereign-audit:*` properties are annotations.
"""

from __future__ import annotations

import hashlib
import json
import re

from audit import __version__
from audit.errors import no_commands
from audit.linkage.judging.policy import Policy
from audit.linkage.model import CheckReport
from audit.linkage.outputs.sbom import EDGE_KINDS, NS, Component, build_graph, content_uuid, created, summary_properties

_PURPOSE = {"library": "LIBRARY", "application": "APPLICATION", "file": "FILE", "container": "CONTAINER"}


def spdx_id(ref: str, name: str) -> str:
    """SPDXRef-NAME-HASH: readable, unique (the hash of the component's reference), and only
    the characters SPDX allows."""
    safe = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-.")[:48] or "x"
    return f"SPDXRef-{safe}-{hashlib.sha256(ref.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def _package(c: Component, sid: str, date: str, annotator: str) -> dict:
    d: dict = {"SPDXID": sid, "name": c.name, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
               "primaryPackagePurpose": _PURPOSE[c.kind]}
    if c.package is not None and c.package.version:
        d["versionInfo"] = c.package.version
    if c.sha256:
        d["checksums"] = [{"algorithm": "SHA256", "checksumValue": c.sha256}]
    if c.package is not None and c.package.purl:
        d["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": c.package.purl}]
    props = [("role", c.role)] + c.properties
    d["annotations"] = [{"annotationDate": date, "annotationType": "OTHER", "annotator": annotator,
                         "comment": f"{NS}:{name}={value}"} for name, value in props]
    return d


def render_spdx(report: CheckReport, policy: Policy) -> str:
    g = build_graph(report, policy)
    date = created()
    annotator = f"Tool: sovereign-audit-{__version__}"
    ids = {ref: spdx_id(ref, c.name) for ref, c in g.components.items()}
    packages = [_package(c, ids[c.ref], date, annotator) for c in g.components.values()]
    rels = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": ids[c.ref]}
            for c in g.components.values() if c.parent is None and c.role in ("container", "file", "input")]
    rels += [{"spdxElementId": ids[c.parent], "relationshipType": "CONTAINS", "relatedSpdxElement": ids[c.ref],
              "comment": f"{NS}:edge=member"} for c in g.components.values() if c.parent is not None]
    for e in g.edges:
        comment = f"{NS}:edge={e.kind}" + (f" ({e.detail})" if e.detail else "")
        rels.append({"spdxElementId": ids[e.source], "relationshipType": EDGE_KINDS[e.kind][1],
                     "relatedSpdxElement": ids[e.target], "comment": comment})
    doc: dict = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": "sovereign-audit check " + " ".join(report.inputs),
        "creationInfo": {"created": date, "creators": [annotator],
                         "comment": "; ".join(f"{NS}:{n}={v}" for n, v in summary_properties(report, policy))},
        "packages": packages,
        "relationships": rels,
    }
    doc["documentNamespace"] = f"https://spdx.org/spdxdocs/sovereign-audit-{content_uuid(doc)}"
    order = ("spdxVersion", "dataLicense", "SPDXID", "name", "documentNamespace", "creationInfo", "packages",
             "relationships")
    doc = {k: doc[k] for k in order}
    return no_commands(json.dumps(doc, indent=2, ensure_ascii=True) + "\n", "\\u003a", "\\u005b")

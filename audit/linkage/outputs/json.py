"""JSON rendering: CheckReport.to_dict() (schema sovereign-audit.linkage/1, described by `$schema`), ASCII-only."""

from __future__ import annotations

import json

from audit.errors import no_commands
from audit.linkage.model import CheckReport
from audit.schemas import CHECK


def render_json(report: CheckReport) -> str:
    # ensure_ascii: names from binaries may hold any code point; the file stays 7-bit clean.
    # Strings keep their exact value; `##[` in one is written `##\u005b`, which a CI log does not obey.
    doc = {"$schema": CHECK, **report.to_dict()}  # the schema shipped as audit/schemas/check-1.schema.json
    return no_commands(json.dumps(doc, indent=2, ensure_ascii=True) + "\n", "\\u003a", "\\u005b")

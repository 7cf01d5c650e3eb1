"""JSON rendering: CheckReport.to_dict() (schema sovereign-audit.linkage/1), ASCII-only."""

from __future__ import annotations

import json

from audit.errors import no_commands
from audit.linkage.model import CheckReport


def render_json(report: CheckReport) -> str:
    # ensure_ascii: names from binaries may hold any code point; the file stays 7-bit clean.
    # Strings keep their exact value; `##[` in one is written `##\u005b`, which a CI log does not obey.
    return no_commands(json.dumps(report.to_dict(), indent=2, ensure_ascii=True) + "\n", "\\u003a", "\\u005b")

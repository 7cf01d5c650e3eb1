"""JSON rendering: CheckReport.to_dict() (schema sovereign-audit.linkage/1), ASCII-only."""

from __future__ import annotations

import json

from audit.linkage.model import CheckReport


def render_json(report: CheckReport) -> str:
    # ensure_ascii: names from binaries may hold any code point; the file stays 7-bit clean.
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=True) + "\n"

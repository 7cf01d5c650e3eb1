"""JSON Schemas (draft 2020-12) of the tool's own JSON outputs, shipped with the package.

Each output names its schema in a `$schema` field, the schema's `$id`; the file with that name is
here (importlib.resources: `audit.schemas`, e.g. `check-1.schema.json`). The version in the name
follows the document's own `schema` field (sovereign-audit.linkage/1 -> check-1). Fields may be
added within a version; a reader ignores what it does not know. sarif-2.1.0.json is OASIS's.
"""

from __future__ import annotations

import json
from importlib import resources

BASE = "https://sovereign-audit.dev/schemas/"
CHECK = BASE + "check-1.schema.json"  # check --format json, and --write-baseline
INSPECT = BASE + "inspect-1.schema.json"  # inspect --json
RUN = BASE + "run-1.schema.json"  # run's evidence/run.json


def load(uri_or_name: str) -> dict:
    """The schema document for a `$schema` URI or a file name here."""
    name = uri_or_name.removeprefix(BASE)
    return json.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))

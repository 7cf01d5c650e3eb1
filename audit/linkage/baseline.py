"""A baseline: an earlier `check --format json` result whose findings are known and tolerated,
so a repository adopting a policy fails only on new ones.

A finding is the same as a known one when its rule, kind (the mechanism: needed, transitive,
imported-symbol, ...), subject and file path are; offsets, counts, order and chains may differ.
Known findings stay in every output, marked "unchanged"; findings of the baseline that are no
longer found are listed as "absent" (SARIF baselineState, as code scanning reads it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from audit.errors import UsageError
from audit.linkage.model import SCHEMA, CheckReport, Finding

Key = tuple[str, str, str, str]  # (rule, kind, subject, file path)


def key(path: str, f: Finding) -> Key:
    return (f.rule, f.kind, f.subject, path)


@dataclass(frozen=True)
class Baseline:
    source: str
    keys: frozenset[Key]


def load_baseline(path: str) -> Baseline:
    """Read a `check --format json` result; UsageError (exit 2) if it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise UsageError(f"--baseline {path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, UnicodeError) as exc:
        raise UsageError(f"--baseline {path}: not JSON ({' '.join(str(exc).split())})") from None
    family = SCHEMA.rsplit("/", 1)[0] + "/"
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(family) \
            or not isinstance(doc.get("files"), list):
        raise UsageError(f"--baseline {path}: not a `check --format json` result (schema {SCHEMA})")
    keys = set()
    for fr in doc["files"]:
        found = fr.get("findings") if isinstance(fr, dict) else None
        if not isinstance(found, list) or not isinstance(fr.get("path"), str):
            raise UsageError(f"--baseline {path}: a file entry without path or findings")
        for f in found:
            parts = [f.get(k) if isinstance(f, dict) else None for k in ("rule", "kind", "subject")]
            if not all(isinstance(p, str) for p in parts):
                raise UsageError(f"--baseline {path}: a finding without rule, kind or subject")
            keys.add((parts[0], parts[1], parts[2], fr["path"]))
    return Baseline(path, frozenset(keys))


def apply_baseline(report: CheckReport, baseline: Baseline) -> None:
    """Mark each finding new or unchanged; a file whose only failing findings are known passes."""
    seen: set[Key] = set()
    new = unchanged = 0
    for fr in report.files:
        for f in fr.findings:
            k = key(fr.path, f)
            if k in baseline.keys:
                f.baseline = "unchanged"
                seen.add(k)
                unchanged += 1
            else:
                f.baseline = "new"
                new += 1
        if fr.verdict == "fail" and not fr.failing:
            fr.verdict = "pass"
    absent = [dict(zip(("rule", "kind", "subject", "path"), k, strict=True)) for k in sorted(baseline.keys - seen)]
    report.baseline = {"file": baseline.source, "new": new, "unchanged": unchanged, "absent": absent}

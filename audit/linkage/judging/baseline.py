"""A baseline: an earlier `check --format json` result whose findings are known and tolerated,
so a repository adopting a policy fails only on new ones.

A finding is the same as a known one when its rule, kind (the mechanism: needed, transitive,
imported-symbol, ...), subject and file path are, and every name it matched was matched then: a
finding groups all the names of one rule and kind in a file, so a second vendor library NEEDED
beside a known one is new (where a finding lists no matches, its examples and count stand in).
Offsets, order and chains may differ.
Known findings stay in every output, marked "unchanged"; findings of the baseline that are no
longer found are listed as "absent" (SARIF baselineState, as code scanning reads it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from audit.errors import UsageError
from audit.files import read_regular_file
from audit.linkage.model import SCHEMA, WHEEL_SEP, CheckReport, Finding

Key = tuple[str, str, str, str]  # (rule, kind, subject, file path)


def key(path: str, f: Finding) -> Key:
    return (f.rule, f.kind, f.subject, same_path(path))


def same_path(path: str) -> str:
    """A file's path as the baseline compares it: `dist`, `dist/` and `./dist` name the same
    files, and so do `../here/dist` and an absolute path inside the working folder (paths outside
it are compared absolute); a member after `!/` as is."""
    outer, sep, inner = path.partition(WHEEL_SEP)
    if outer:
        full = os.path.abspath(outer)
        rel = os.path.relpath(full)
        outer = full if rel == ".." or rel.startswith(".." + os.sep) else rel
    return outer + sep + inner


@dataclass(frozen=True)
class Baseline:
    source: str
    keys: frozenset[Key]
    names: dict  # Key -> (names matched, count, whether the names are all of them)

    def knows(self, k: Key, f: Finding) -> bool:
        if k not in self.keys:
            return False
        names, count, complete = self.names.get(k, (frozenset(), 0, False))
        if f.matches and complete:
            return {n for m in f.matches for n in m.names} <= names
        return {f.subject, *f.examples} <= names and f.count <= count


def _names(f: dict) -> tuple[frozenset, int, bool]:
    matches = f.get("matches")
    if isinstance(matches, list) and matches:
        names = {n for m in matches for n in (m.get("names") or [])}
        return frozenset(names | {f["subject"]}), len(names), True
    examples = f.get("examples") or []
    count = f.get("count") if isinstance(f.get("count"), int) else 1
    return frozenset({f["subject"], *examples}), count, False


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _finding_problem(f: dict) -> str | None:
    """What is wrong with the fields a baseline reads from a finding (None: nothing); absent or
    null ones are allowed, as an older `check` wrote fewer of them."""
    if f.get("examples") is not None and not _strings(f["examples"]):
        return "examples must be a list of strings"
    count = f.get("count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        return "count must be a whole number"
    matches = f.get("matches")
    if matches is None:
        return None
    if not isinstance(matches, list) or not all(isinstance(m, dict) for m in matches):
        return "matches must be a list of objects"
    if not all(m.get("names") is None or _strings(m["names"]) for m in matches):
        return "each match's names must be a list of strings"
    return None


def load_baseline(path: str) -> Baseline:
    """Read a `check --format json` result; UsageError (exit 2) if it is not one."""
    try:
        doc = json.loads(read_regular_file(path).decode("utf-8"))
    except OSError as exc:
        raise UsageError(f"--baseline {path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, UnicodeError) as exc:
        raise UsageError(f"--baseline {path}: not JSON ({' '.join(str(exc).split())})") from None
    except RecursionError:  # json recurses once per nested array or object
        raise UsageError(f"--baseline {path}: not a `check --format json` result (nested too deeply)") from None
    family = SCHEMA.rsplit("/", 1)[0] + "/"
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(family) \
            or not isinstance(doc.get("files"), list):
        raise UsageError(f"--baseline {path}: not a `check --format json` result (schema {SCHEMA})")
    keys = set()
    names: dict = {}
    for fr in doc["files"]:
        found = fr.get("findings") if isinstance(fr, dict) else None
        if not isinstance(found, list) or not isinstance(fr.get("path"), str):
            raise UsageError(f"--baseline {path}: a file entry without path or findings")
        for f in found:
            parts = [f.get(k) if isinstance(f, dict) else None for k in ("rule", "kind", "subject")]
            if not all(isinstance(p, str) for p in parts):
                raise UsageError(f"--baseline {path}: a finding without rule, kind or subject")
            problem = _finding_problem(f)
            if problem:
                raise UsageError(f"--baseline {path}: a finding of rule {parts[0]!r}: {problem}")
            k = (parts[0], parts[1], parts[2], same_path(fr["path"]))
            keys.add(k)
            got, count, complete = _names(f)
            old = names.get(k)
            names[k] = (got | old[0], count + old[1], complete and old[2]) if old else (got, count, complete)
    return Baseline(path, frozenset(keys), names)


def apply_baseline(report: CheckReport, baseline: Baseline) -> None:
    """Mark each finding new or unchanged; a file whose only failing findings are known passes."""
    seen: set[Key] = set()
    new = unchanged = 0
    for fr in report.files:
        for f in fr.findings:
            k = key(fr.path, f)
            if k in baseline.keys:
                seen.add(k)  # found again (with new names it is new, but not absent)
            if baseline.knows(k, f):
                f.baseline = "unchanged"
                unchanged += 1
            else:
                f.baseline = "new"
                new += 1
        if fr.verdict == "fail" and not fr.failing:
            fr.verdict = "pass"
    absent = [dict(zip(("rule", "kind", "subject", "path"), k, strict=True)) for k in sorted(baseline.keys - seen)]
    report.baseline = {"file": baseline.source, "new": new, "unchanged": unchanged, "absent": absent}

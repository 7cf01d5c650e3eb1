"""The gate's contract, checked on each run of a case.

- exit 0, 1 or 3 only (2 as well where the case mutated a policy or baseline); never 4, never a
  signal, never a hang past the wall-clock limit, peak RSS under the bound
- no "Traceback" on stderr; on exit 3 exactly one stderr line starting `error:`
- no line starting `::` in any output but --format github's, and there only our own
  well-formed workflow commands (known command, escaped properties, no CR)
- no raw control characters (ANSI escapes, CR, bidi) in text outputs
- json/sarif/junit files and inspect --json parse
- nothing opened under the canary folder, nothing written outside the case folder, temporary
  files removed, no worker left running, and the same verdict in every format
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET

GITHUB_COMMANDS = {"error", "warning", "notice", "group", "endgroup", "debug"}
GITHUB_PROPS = {"file", "line", "endLine", "col", "endColumn", "title"}
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def _lines(b: bytes) -> list[str]:
    return b.decode("utf-8", "replace").split("\n")


def github_line_problem(line: str) -> str | None:
    m = re.match(r"^::([A-Za-z-]+)(?: ([^:]*))?::(.*)$", line)
    if not m:
        return "malformed workflow command"
    cmd, props, data = m.groups()
    if cmd not in GITHUB_COMMANDS:
        return f"workflow command '{cmd}'"
    for prop in (props or "").split(",") if props else []:
        key, eq, value = prop.partition("=")
        if not eq or key not in GITHUB_PROPS:
            return f"property {prop[:30]!r}"
        if "\r" in value or "\n" in value:
            return "raw CR/LF in a property"
    if "\r" in data:
        return "raw CR in the message"
    return None


def check_run(tag: str, out, allowed: set[int], fmt: str | None, rss_kb: int) -> list[tuple[str, str]]:
    v: list[tuple[str, str]] = []
    err_text = out.stderr.decode("utf-8", "replace")
    if out.timed_out:
        v.append(("hang", f"{tag}: still running at the wall-clock limit"))
    elif out.signal:
        v.append(("signal", f"{tag}: killed by signal {out.signal}"))
    elif out.rc not in allowed:
        first = next((ln for ln in err_text.splitlines() if ln.strip()), "")
        v.append((f"exit-{out.rc}", f"{tag}: exit {out.rc}: {first[:200]}"))
    if out.maxrss_kb > rss_kb:
        v.append(("rss", f"{tag}: peak RSS {out.maxrss_kb // 1024} MiB"))
    if "Traceback" in err_text:
        v.append(("traceback", f"{tag}: " + err_text.strip().splitlines()[-1][:200]))
    stray = [ln for ln in err_text.splitlines() if ln.strip() and not ln.startswith(("error:", "warning:"))]
    if stray and "Traceback" not in err_text:
        v.append(("stderr-line", f"{tag}: stderr line not 'error:'/'warning:': {stray[0][:120]!r}"))
    if out.rc == 3:
        errs = [ln for ln in err_text.splitlines() if ln.startswith("error:")]
        text_out = out.stdout.decode("utf-8", "replace")
        in_report = (fmt == "text" and "ERROR" in text_out) or (fmt == "github" and "::error" in text_out)
        if fmt in ("text", "github") and not (len(errs) == 1 or (not errs and in_report)):
            v.append(("error-lines", f"{tag}: exit 3 with {len(errs)} 'error:' lines on stderr"
                                     f"{'' if in_report else ' and no ERROR in the report'}"))
        elif fmt not in ("text", "github") and not errs:
            v.append(("error-lines", f"{tag}: exit 3 and no 'error:' line on stderr"))
    for stream, data in (("stdout", out.stdout), ("stderr", out.stderr)):
        for ln in _lines(data):
            if ln.startswith("::") and not (fmt == "github" and stream == "stdout"):
                v.append(("workflow-command", f"{tag} {stream}: {ln[:120]!r}"))
                break
            if fmt == "github" and stream == "stdout" and ln.startswith("::"):
                why = github_line_problem(ln)
                if why:
                    v.append(("workflow-command", f"{tag}: {why}: {ln[:120]!r}"))
                    break
        if fmt in ("text", "github", "inspect") and _CTRL.search(data.decode("utf-8", "replace").replace("\n", "").replace("\t", "")):
            m = _CTRL.search(data.decode("utf-8", "replace").replace("\n", "").replace("\t", ""))
            v.append(("control-chars", f"{tag} {stream}: raw {m.group()!r}"))
    for kind, detail in (h.split("\t", 1) for h in out.hook if "\t" in h):
        v.append((kind, f"{tag}: {detail[:200]}"))
    if out.orphans:
        v.append(("orphan-process", f"{tag}: a process of its group outlived it"))
    return v


def check_files(tag: str, cwd: str, rc: int | None) -> list[tuple[str, str]]:
    """The machine-readable outputs of run `tag` parse (when the run wrote them)."""
    v = []
    for name, parse in (("out.json", json.load), ("out.sarif", json.load), ("out.xml", ET.parse),
                        ("out.cdx.json", json.load), ("out.spdx.json", json.load),
                        ("out.intoto.jsonl", lambda fh: [json.loads(line) for line in fh])):
        p = os.path.join(cwd, name)
        if not os.path.exists(p):
            # an attestation needs a subject: a run that read no artifact at all (exit 3) has none
            if rc in ((0, 1) if name == "out.intoto.jsonl" else (0, 1, 3)):
                v.append(("missing-output", f"{tag}: {name} not written (exit {rc})"))
            continue
        try:
            with open(p, "rb") as fh:
                parse(fh)
        except Exception as exc:
            v.append(("bad-output", f"{tag}: {name}: {type(exc).__name__}: {str(exc)[:120]}"))
    return v


def check_json_stdout(tag: str, out) -> list[tuple[str, str]]:
    if out.rc not in (0, 3) or not out.stdout.strip():
        return []
    try:
        json.loads(out.stdout)
    except ValueError as exc:
        return [("bad-output", f"{tag}: stdout is not JSON: {str(exc)[:120]}")]
    return []


def snapshot(folder: str) -> dict[str, tuple]:
    snap = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            snap[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return snap

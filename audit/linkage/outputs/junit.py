"""JUnit XML rendering: one testcase per (file, rule); files that could not be read are errors.

CI systems show JUnit natively; every string goes through `xml_safe` first, because XML 1.0
cannot carry most control characters at all (ElementTree would write them and break the file),
and a newline inside a name would start a line of the log that a runner may obey (`::warning`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from audit.errors import no_commands, printable
from audit.linkage.model import CheckReport
from audit.linkage.judging.policy import Policy


def xml_safe(text) -> str:
    """One line of printable text: what XML 1.0 forbids (control characters, lone surrogates from
    a file name that is not UTF-8) and line breaks are written as \\xNN / \\uNNNN."""
    return printable(text)


def render_junit(report: CheckReport, policy: Policy) -> str:
    rules = policy.all_rules()
    suites = ET.Element("testsuites", name="sovereign-audit")
    suite = ET.SubElement(suites, "testsuite", name=xml_safe(f"sovereign-audit check (policy {policy.name})"))
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="policy", value=xml_safe(policy.name))
    ET.SubElement(props, "property", name="schema", value=report.schema)
    tests = failures = errors = 0
    for fr in report.files:
        if fr.verdict == "error":
            tests += 1
            errors += 1
            case = ET.SubElement(suite, "testcase", classname=xml_safe(fr.path), name="readable", time="0")
            err = ET.SubElement(case, "error", message=xml_safe(fr.error or "error"), type="unreadable")
            err.text = xml_safe(fr.error or "")
            if not fr.sha256:
                continue  # nothing was read: no rule can be evaluated
        by_rule: dict[str, list] = {}
        for f in fr.findings:
            by_rule.setdefault(f.rule, []).append(f)
        for rule in rules:
            tests += 1
            case = ET.SubElement(suite, "testcase", classname=xml_safe(fr.path), name=xml_safe(rule.id), time="0")
            found = by_rule.get(rule.id, [])
            bad = [f for f in found if f.failing]
            if bad:
                failures += 1
                fail = ET.SubElement(case, "failure", message=xml_safe(f"{rule.id}: {bad[0].message}"),
                                     type=bad[0].kind)
                # each line escaped on its own: the newlines between them are the only ones
                lines = [f"{f.kind}: {f.message}" for f in bad] + [f"why: {rule.reason}"]
                if rule.use_instead:
                    lines.append(f"use instead: {rule.use_instead}")
                fail.text = "\n".join(xml_safe(line) for line in lines)
            elif found:
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join(xml_safe(
                    f"{'excepted' if f.excepted else f.severity}: {f.message}" + (f" ({f.excepted})" if f.excepted else ""))
                    for f in found)
    for el in (suites, suite):
        el.set("tests", str(tests))
        el.set("failures", str(failures))
        el.set("errors", str(errors))
    suite.set("skipped", "0")
    suite.set("time", f"{report.elapsed_s:.3f}" if report.timing else "0")  # see --timing
    ET.indent(suites)
    # character references: the same document once parsed, and no line a runner would obey
    return no_commands(ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n", "&#58;", "&#91;")

"""Vendor code recognised by its own text when its symbols are gone: a rule's `markers` are whole
strings in the data only the vendor's own code holds (BLIS's "libblis: ..." messages). gcc builds
libraries with BLIS's message strings in functions that are hidden and stripped (no bli_ name
anywhere), with the same words inside prose, and with a bli_ symbol left in: `check` must fail
on the first (static-string), not on the second, and keep static-symbol for the third."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import run

from audit.elf.reader import read_elf
from audit.errors import PolicyError
from audit.linkage.judging.policy import load_policy, to_toml

REPO = Path(__file__).resolve().parent.parent

# BLIS's bli_print_msg / bli_abort messages (frame/base/bli_error.c), in hidden functions
LOCATION = "libblis: %s (line %lu):\n"
MESSAGE = "libblis: %s\n"
ABORTING = "libblis: Aborting.\n"
STRIPPED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((visibility("hidden"))) void report(const char *msg, const char *file, unsigned long line) {
    fprintf(stderr, "libblis: %s (line %lu):\n", file, line);
    fprintf(stderr, "libblis: %s\n", msg);
}
__attribute__((visibility("hidden"))) void give_up(void) { fprintf(stderr, "libblis: Aborting.\n"); abort(); }
__attribute__((visibility("default"))) int fk_solve(int n) {
    if (n < 0) { report("negative", __FILE__, __LINE__); give_up(); }
    return n * 2;
}
"""
PROSE_TEXT = "this is not libblis: really"
PROSE = """
#include <stdio.h>
int fk_say(int n) { if (n) puts("this is not libblis: really"); return n; }
"""
# one BLIS function left exported under its own name (an unstripped copy)
UNSTRIPPED = """
int bli_dgemm(int n) { return n * 3; }
int fk_call(int n) { return bli_dgemm(n) + 1; }
"""
# a policy's exact (no '*') marker: only the whole string, never a longer one or text around it
# (not a suffix of another string: the linker would keep one copy, inside the longer string)
EXACT_POLICY = """
extends = "sovereign"
name = "exact-marker"
[[rules]]
id = "test.exact"
reason = "a test rule with an exact marker"
markers = ["VENDOR_ONLY_TEXT"]
"""
EXACT = """
#include <stdio.h>
int fk_pick(int i) {
    const char *s[] = {"VENDOR_ONLY_TEXT_LONGER", "not VENDOR_ONLY_TEXT here", "VENDOR_ONLY_TEXT"};
    return puts(s[i % 3]);
}
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    gcc = require_tool("gcc")
    d = tmp_path_factory.mktemp("vendor-markers")
    out = {}
    for name, text, flags in (("stripped", STRIPPED, ["-fvisibility=hidden", "-s"]), ("prose", PROSE, ["-s"]),
                              ("unstripped", UNSTRIPPED, []), ("exact", EXACT, ["-s"])):
        (d / f"{name}.c").write_text(text)
        out[name] = d / f"lib{name}.so"
        run(gcc, "-shared", "-fPIC", "-O1", "-o", out[name], d / f"{name}.c", *flags)
    return out


def check(path: Path, *args: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([sys.executable, "-m", "audit", "check", "--format", "json", *args, str(path)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    (res,) = json.loads(proc.stdout)["files"]
    return proc.returncode, res["findings"]


def test_stripped_vendor_code_is_found_by_its_own_messages(libs):
    data = libs["stripped"].read_bytes()
    assert b"bli_" not in data  # no symbol, no string names BLIS's functions
    code, findings = check(libs["stripped"])
    assert code == 1
    (f,) = [f for f in findings if f["rule"] == "blas.blis"]
    assert f["kind"] == "static-string" and f["severity"] == "fail"
    texts = {n for m in f["matches"] for n in m["names"]}
    assert texts == {LOCATION, MESSAGE, ABORTING}
    # each place is the string's own file offset, in the read-only data
    for m in f["matches"]:
        (text,) = m["names"]
        assert m["where"] == f".rodata @0x{m['offset']:x}"
        assert data[m["offset"]:m["offset"] + len(text) + 1] == text.encode() + b"\0"
    assert '"libblis: *"' in f["detail"] and "a copy of its code is inside" in f["detail"]


def test_the_marker_inside_prose_is_no_evidence(libs):
    assert PROSE_TEXT.encode() + b"\0" in libs["prose"].read_bytes()
    assert read_elf(libs["prose"], markers=load_policy(None).markers).marker_strings == []
    code, findings = check(libs["prose"])
    assert code == 0 and not [f for f in findings if f["kind"] == "static-string"]


def test_an_unstripped_copy_stays_a_static_symbol(libs):
    code, findings = check(libs["unstripped"])
    assert code == 1
    (f,) = [f for f in findings if f["rule"] == "blas.blis" and f["kind"] == "static-symbol"]
    assert f["subject"] == "bli_dgemm"


def test_an_exact_marker_is_the_whole_string_only(libs, tmp_path):
    pol = tmp_path / "exact.toml"
    pol.write_text(EXACT_POLICY)
    code, findings = check(libs["exact"], "--policy", str(pol))
    assert code == 1
    (f,) = [f for f in findings if f["kind"] == "static-string"]
    assert f["rule"] == "test.exact" and f["count"] == 1 and f["subject"] == "VENDOR_ONLY_TEXT"
    data = libs["exact"].read_bytes()
    assert data[f["offset"] - 1:f["offset"] + 17] == b"\0VENDOR_ONLY_TEXT\0"
    # the reader keeps both strings that start with it; judging takes the whole one only
    kept = read_elf(libs["exact"], markers=load_policy(str(pol)).markers).marker_strings
    assert sorted(h.text for h in kept) == ["VENDOR_ONLY_TEXT", "VENDOR_ONLY_TEXT_LONGER"]


def test_markers_are_shown_and_load_back(tmp_path):
    pol = load_policy(None)
    (blis,) = [r for r in pol.rules if r.id == "blas.blis"]
    assert blis.markers == ("libblis: *",)
    assert pol.markers == (b"libblis: ",)
    again = tmp_path / "shown.toml"
    again.write_text(to_toml(pol))
    assert [r.markers for r in load_policy(str(again)).rules] == [r.markers for r in pol.rules]


@pytest.mark.parametrize("markers, says", [
    ('"libblis: *"', "must be an array"),
    ('["lib*blis: "]', "'*' may only end it"),
    ('["lib*blis: x"]', "'*' may only end it"),
    ('["short*"]', "characters before any trailing '*'"),
    ('["*"]', "characters before any trailing '*'"),
    ('["tab\\there ok"]', "printable ASCII only"),
    ('[3]', "must be a string"),
])
def test_bad_markers_are_policy_errors(tmp_path, markers, says):
    p = tmp_path / "bad.toml"
    p.write_text(f'[[rules]]\nid = "x.y"\nreason = "r"\nmarkers = {markers}\n')
    with pytest.raises(PolicyError) as exc:
        load_policy(str(p))
    assert "markers" in str(exc.value) and says in str(exc.value)

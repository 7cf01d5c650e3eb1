"""A hostile string never speaks: names from binaries, file names, archive members and policy
text carrying newlines, `::` workflow commands, `##[` commands, terminal escapes, markup and bytes
that are not UTF-8 reach every output of `check` and `inspect`, and the `error:` lines, as inert
text. A GitHub runner obeys `::command` at the start of a line (after white space) and `##[command]`
anywhere in a line; no output line may be either, except the annotations the github format writes.

The inputs are built by gcc (GNU as takes any byte but '"' and '\\' in a quoted symbol name),
patchelf and zipfile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent

NEEDED = "x\n::warning file=INJECTED::pwn"
LEADING = "::warning::lead##[error]lib.so"  # a name that starts a line of its own in -v and the tree
SONAME = "so\r::notice::z"
SYMBOL = "cublasEvil\x1b[31m::error file=x::sym##[add-mask]s<script>alert(1)</script>"
FILE = "f\n::warning::q<script>.so"
RAW_FILE = b"bad\xff\xfe##[error]n.so"  # not UTF-8: kept as surrogates by Python, never an encoder crash
MEMBER = "pkg/lib\n::warning::w<script>.so"
REASON = "denied\n::error::reason##[stop-commands]tok"
POLICY = f"""extends = "sovereign"
name = "hostile\\n::warning::policy"

[[rules]]
id = "nvidia.cublas"
name = "evil\\u001b[2J"
reason = "denied\\n::error::reason##[stop-commands]tok"
use-instead = "\\r::notice::instead"
symbols = ["cublas[A-Z]*"]
"""

_ANNOTATION = re.compile(r"::(error|warning) (file|title)=[^:\r\n]*::")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def run(*cmd):
    proc = subprocess.run([c if isinstance(c, bytes) else str(c) for c in cmd], capture_output=True)
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed: {proc.stderr.decode(errors='replace')}")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A folder: a .so with hostile DT_NEEDED, DT_SONAME and symbol names, under a hostile file
    name, a copy under a name that is not UTF-8, and a wheel whose member name is hostile."""
    require_tool("gcc")
    require_tool("patchelf")
    d = tmp_path_factory.mktemp("gate-escaping")
    asm = d / "h.s"
    asm.write_text(f'\t.text\n\t.globl "{SYMBOL}"\n\t.type "{SYMBOL}", @function\n"{SYMBOL}":\n'
                   '\tret\n\t.section .note.GNU-stack,"",@progbits\n')
    lib = d / "h.so"
    run("gcc", "-shared", "-o", lib, asm)
    for edit in (("--add-needed", NEEDED), ("--add-needed", LEADING), ("--add-needed", b"lib\xff\xfe.so"),
                 ("--set-soname", SONAME)):  # one edit a call: patchelf 0.14 mixes up several
        run("patchelf", *edit, lib)
    tree = d / "tree"
    tree.mkdir()
    shutil.copy(lib, tree / FILE)
    shutil.copy(lib, os.fsencode(tree) + b"/" + RAW_FILE)
    with zipfile.ZipFile(tree / "hostile-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr(MEMBER, lib.read_bytes())
    (d / "hostile.toml").write_text(POLICY)
    return d


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    # strict UTF-8 on stdout and stderr, as a CI runner's locale may give: a lone surrogate
    # written there raises instead of passing through
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "audit", *map(str, args)], capture_output=True,
                          cwd=cwd, env=env, timeout=300)


def lines(text: str) -> list[str]:
    """Lines as a GitHub runner splits them (CR, LF or CR LF)."""
    return re.split(r"\r\n|\r|\n", text)


def assert_inert(text: str, annotations: bool = False) -> None:
    """No line a runner obeys, no terminal control: a line that starts with `::` must be one of our
    annotations (github format), whose properties hold no raw `::`, and no line holds `##[`."""
    assert "##[" not in text
    assert not _CONTROL.search(text), repr(_CONTROL.search(text).group())
    for line in lines(text):
        if not line.lstrip().startswith("::"):
            continue
        assert annotations and _ANNOTATION.match(line), f"a line a runner obeys: {line!r}"


def decoded(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    return proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")  # strict: output is UTF-8


def strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


def check_shown(fmt: str, out: str) -> None:
    """The hostile text is still there, escaped for the format (the test is not vacuous)."""
    if fmt == "text":
        assert "x\\x0a::warning file=INJECTED::pwn" in out
        assert "\\x3a:warning::lead##\\x5berror]lib.so" in out  # shown alone on a -v line
        assert "f\\x0a::warning::q<script>.so" in out and "bad\\xff\\xfe##\\x5berror]n.so" in out
        assert "lib\\x0a::warning::w<script>.so" in out
        assert "denied\\x0a::error::reason##\\x5bstop-commands]tok" in out
    elif fmt in ("json", "sarif"):
        values = strings(json.loads(out))
        assert NEEDED in " ".join(values) and any(SYMBOL in v for v in values)
        assert any(REASON in v for v in values)
        assert "\\u005b" in out  # `##[` written as an escape, the same string once parsed
    elif fmt == "junit":
        root = ET.fromstring(out)
        assert "<script" not in out
        texts = " ".join([e.text or "" for e in root.iter()] + [v for e in root.iter() for v in e.attrib.values()])
        assert "f\\x0a::warning::q<script>.so" in texts and "bad\\xff\\xfe##\\x5berror]n.so" in texts
        assert "sym##\\x5badd-mask]s<script>" in texts
        assert "why: denied\\x0a::error::reason##\\x5bstop-commands]tok" in texts
    else:
        assert "denied%0A::error::reason##\\x5bstop-commands]tok Use instead: %0D::notice::instead." in out
        assert "file=" in out and "bad\\xff\\xfe##\\x5berror]n.so" in out
        assert "%0A%3A%3Awarning%3A%3Aq<script>.so" in out  # the file property: colons escaped


FORMATS = ("text", "json", "sarif", "junit", "github")


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_stdout_in_every_format_is_inert(hostile, fmt):
    proc = cli("check", "-v", "--policy", hostile / "hostile.toml", "--format", fmt, hostile / "tree")
    out, err = decoded(proc)
    assert proc.returncode == 1, err  # the symbol is denied by the policy's own rule
    assert "Traceback" not in err
    assert_inert(out, annotations=fmt == "github")
    assert_inert(err)
    check_shown(fmt, out)


def test_check_files_in_every_format_are_inert(hostile, tmp_path):
    files = {fmt: tmp_path / f"out.{fmt}" for fmt in FORMATS}
    proc = cli("check", "-v", "--policy", hostile / "hostile.toml", hostile / "tree",
               *[a for fmt, p in files.items() for a in ("--format", f"{fmt}={p}")])
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == b""
    for fmt, path in files.items():
        text = path.read_bytes().decode("utf-8")
        assert_inert(text, annotations=fmt == "github")
        check_shown(fmt, text)


def test_inspect_text_is_inert(hostile):
    # a relative path that starts with `::` is the first line of its file's block
    leading = hostile / "tree" / LEADING
    shutil.copy(hostile / "h.so", leading)
    try:
        proc = cli("inspect", "tree", cwd=hostile)
        proc_rel = cli("inspect", LEADING, cwd=hostile / "tree")
    finally:
        leading.unlink()
    for p in (proc, proc_rel):
        out, err = decoded(p)
        assert p.returncode == 0, err
        assert_inert(out)
        assert_inert(err)
    out = decoded(proc)[0]
    assert "x\\x0a::warning file=INJECTED::pwn" in out and "so\\x0d::notice::z" in out
    assert "bad\\xff\\xfe##\\x5berror]n.so" in out and "lib\\x0a::warning::w<script>.so" in out
    assert "    \\x3a:warning::lead##\\x5berror]lib.so [unresolved" in out  # a dependency tree line
    assert decoded(proc_rel)[0].startswith("\\x3a:warning::lead##\\x5berror]lib.so\n")


def test_inspect_json_is_inert_and_exact(hostile):
    proc = cli("inspect", "--json", hostile / "tree")
    out, err = decoded(proc)
    assert proc.returncode == 0, err
    assert_inert(out)
    files = json.loads(out)["files"]
    assert any(NEEDED in f["needed"] and f["soname"] == SONAME for f in files)
    assert any(f["path"].endswith(FILE) for f in files)
    assert any(f["path"].endswith("!/" + MEMBER) for f in files)


@pytest.mark.parametrize("command", ["check", "inspect"])
def test_error_lines_are_one_inert_line(hostile, command):
    missing = os.fsdecode(os.fsencode(hostile) + b"/gone\n::warning::e##[error]x\xff.so")
    args = ("--baseline", missing, hostile / "h.so") if command == "check" else (missing,)
    proc = cli(command, *args)
    out, err = decoded(proc)
    assert proc.returncode == (2 if command == "check" else 3), err
    assert_inert(out)
    assert_inert(err)
    [line] = err.splitlines()
    assert line.startswith("error: ") and line.count("gone") == 1  # the path is named once
    assert "::warning::e##\\x5berror]x\\xff.so" in line


def test_unreadable_input_in_the_report_is_inert(hostile):
    missing = os.fsdecode(os.fsencode(hostile) + b"/gone\n::warning::e##[error]x\xff.so")
    for fmt in FORMATS:
        proc = cli("check", "--format", fmt, missing)
        out, err = decoded(proc)
        assert proc.returncode == 3, err
        assert_inert(out, annotations=fmt == "github")
        assert_inert(err)
        assert "warning" in out.partition("gone")[2][:20]  # named, escaped for the format


def test_policy_errors_are_one_inert_line(hostile, tmp_path):
    bad = tmp_path / "bad.toml"  # a pattern that does not compile is quoted in the error
    bad.write_text('[[rules]]\nid = "x.y"\nreason = "r"\nsymbols = ["cublas##[error]x\\n::warning::p[A-Z"]\n')
    proc = cli("check", "--policy", bad, hostile / "h.so")
    out, err = decoded(proc)
    assert proc.returncode == 2, err
    assert_inert(err)
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert "cublas##\\x5berror]x" in err


def test_no_commands_breaks_each_kind_of_command_line():
    from audit.errors import no_commands, printable

    text = "ok\n  ::warning::a\r::error::b\r\n\t::x\nkeep :: this ##[group]c"
    assert no_commands(text) == "ok\n  \\x3a:warning::a\r\\x3a:error::b\r\n\t\\x3a:x\nkeep :: this ##\\x5bgroup]c"
    assert no_commands("::a", "&#58;", "&#91;") == "&#58;:a"
    assert printable("n\udcff##[e]\n") == "n\\xff##\\x5be]\\x0a"  # the byte a file name held


# -- a NEEDED chain 250 libraries deep (several Python frames a library, when recursive) ------
CHAIN = 250  # the resolver refuses a chain deeper than 256 (exit 3); this one it takes


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Path:
    """lib0.so -> lib1.so -> ... -> lib250.so: one gcc build, copies given a DT_NEEDED by patchelf."""
    require_tool("gcc")
    require_tool("patchelf")
    d = tmp_path_factory.mktemp("needed-chain")
    (d / "t.c").write_text("int t(void) { return 1; }\n")
    run("gcc", "-shared", "-fPIC", "-o", d / f"lib{CHAIN}.so", d / "t.c")
    for i in range(CHAIN):
        shutil.copy(d / f"lib{CHAIN}.so", d / f"lib{i}.so")
    for start in range(0, CHAIN, 8):  # a few at a time
        procs = [subprocess.Popen(["patchelf", "--add-needed", f"lib{i + 1}.so", str(d / f"lib{i}.so")])
                 for i in range(start, min(start + 8, CHAIN))]
        assert all(p.wait() == 0 for p in procs)
    return d


def test_inspect_renders_a_needed_chain_250_deep(chain):
    proc = cli("inspect", "--ldpath", chain, chain / "lib0.so")
    out, err = decoded(proc)
    assert proc.returncode == 0, err
    tree = out.partition("  dependency tree:\n")[2].splitlines()
    assert tree[0] == f"    lib1.so -> {chain}/lib1.so (ldpath) [unlisted]"
    assert tree[CHAIN - 1] == f"  {'  ' * CHAIN}lib{CHAIN}.so -> {chain}/lib{CHAIN}.so (ldpath) [unlisted]"


def test_inspect_json_of_a_needed_chain_250_deep(chain):
    proc = cli("inspect", "--json", "--no-vendor-symbols", "--ldpath", chain, chain / "lib0.so")
    out, err = decoded(proc)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    node, names = doc["files"][0]["dependency_tree"], []
    while node["children"]:
        [node] = node["children"]
        names.append(node["name"])
    assert names == [f"lib{i}.so" for i in range(1, CHAIN + 1)]


@pytest.mark.parametrize("module, name", [("audit.evidence.commands", "_safe"), ("audit.kernel_build.command", "_one_line")])
def test_the_stage_commands_escape_runner_commands_in_quoted_text(module, name):
    """`build`, `parity`, `bench` and `pipeline` quote compiler output, torch messages and paths in
    their error lines: a `##[` in them (a runner command anywhere in a line) and an ANSI escape
    are shown as escapes, like every other error line."""
    import importlib

    escape = getattr(importlib.import_module(module), name)
    line = escape("nvcc: ##[stop-commands]tok \x1b[31mred\nnext")
    assert "##[" not in line and "\x1b" not in line and "\n" not in line, line


def test_policy_show_writes_no_runner_command_from_a_policy(tmp_path):
    """A policy is text from a repository: its reason (`##[`), and its file name (a CR, then
    `::`), never become a command line in `policy show`, TOML or JSON, and the TOML still reads
    back to the same reason."""
    import tomllib

    reason = "vendor ##[stop-commands]tok"
    path = tmp_path / "p\r::warning file=X::pwn.toml"
    path.write_text('extends = "sovereign"\n[[rules]]\nid = "x.y"\nfamily = "blas"\nname = "X"\n'
                    f'reason = "{reason}"\nsonames = ["libxvendor"]\n')
    for args in ((), ("--json",)):
        proc = cli("policy", "show", "--policy", path, *args)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout.decode()
        assert "##[" not in text, text[:300]
        assert not [ln for ln in re.split(r"[\r\n]", text) if ln.lstrip().startswith("::")]
    toml = tomllib.loads(cli("policy", "show", "--policy", path).stdout.decode())
    assert [r["reason"] for r in toml["rules"] if r["id"] == "x.y"] == [reason]

"""Loads an ELF file makes that DT_NEEDED does not list. Filter libraries (DT_FILTER, DT_AUXILIARY:
GNU ld's --filter and --auxiliary): ld.so maps the named library with the object, runs its
constructors and binds the object's symbols to it. A program's audit libraries (DT_AUDIT,
DT_DEPAUDIT) and its interpreter (PT_INTERP). `check` judges each as a NEEDED, names the tag, and
walks the filtee it finds. Fixtures come from gcc and GNU ld."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from linkage_fixtures import cc_shared, run

from cli_runner import audit, cli
from conftest import require_tool

SOURCE = "int f(void) { return 1; }\n"
VENDOR = ('#include <stdio.h>\n__attribute__((constructor)) static void hello(void) { puts("filtee loaded"); }\n'
          "int f(void) { return 42; }\n")


def child(res, name):
    (node,) = [c for c in res.tree.children if c.name == name]
    return node


def program(tmp_path, name: str, *flags, returns: int = 0) -> Path:
    """gcc's main() returning `returns`, linked with `flags` (ld options)."""
    require_tool("gcc")
    main = tmp_path / f"{name}.c"
    main.write_text(f"int main(void) {{ return {returns}; }}\n")
    exe = tmp_path / name
    run("gcc", "-o", exe, main, *flags)
    return exe


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    require_tool("gcc")
    d = tmp_path_factory.mktemp("filters")
    return {
        "auxiliary_cublas": cc_shared(d / "libaux.so", SOURCE, "-Wl,--auxiliary=libcublas.so.12"),
        "filter_cudnn": cc_shared(d / "libfilter.so", SOURCE, "-Wl,--filter=libcudnn.so.9"),
        "filter_missing": cc_shared(d / "libmissing.so", SOURCE, "-Wl,--filter=libnot_here_anywhere.so.3"),
        "dir": d,
    }


@pytest.mark.parametrize("name,rule,subject,tag", [
    ("auxiliary_cublas", "nvidia.cublas", "libcublas.so.12", "DT_AUXILIARY"),
    ("filter_cudnn", "nvidia.cudnn", "libcudnn.so.9", "DT_FILTER"),
])
def test_a_filter_naming_a_vendor_library_fails_as_needed(libs, name, rule, subject, tag):
    """Before: PASS (DT_NEEDED is empty, the name is only in .dynstr)."""
    res = audit(libs[name])
    assert res.verdict == "fail"
    assert [(f.rule, f.kind, f.subject, f.where) for f in res.failing] == [(rule, "needed", subject, tag)]
    assert child(res, subject).request == tag


def test_a_filter_the_system_lacks_is_unresolved_as_a_needed_is(libs):
    res = audit(libs["filter_missing"])
    assert [(f.kind, f.subject, f.where) for f in res.findings] == [
        ("unresolved", "libnot_here_anywhere.so.3", "DT_FILTER")]


def test_the_filtee_found_is_walked_and_its_content_judged(libs, tmp_path):
    """A filtee under a harmless name that defines a vendor entry point: found through the
    filter object's DT_RUNPATH, read, and its static definition judged."""
    vendor = cc_shared(tmp_path / "libhelper.so.1", "void cublasSgemm_v2(void) {}\n", "-Wl,-soname,libhelper.so.1")
    top = cc_shared(tmp_path / "libtop.so", SOURCE, "-Wl,--filter=libhelper.so.1", "-Wl,-rpath,$ORIGIN")
    res = audit(top)
    node = child(res, "libhelper.so.1")
    assert (node.request, node.path) == ("DT_FILTER", str(vendor))
    assert ("nvidia.cublas", "static-symbol") in {(f.rule, f.kind) for f in res.failing}
    assert res.verdict == "fail"


def test_the_json_report_names_the_tag(libs, capsys):
    import json

    rc, out, err = cli(capsys, "check", "--format", "json", str(libs["filter_cudnn"]))
    assert rc == 1
    (f,) = json.loads(out)["files"][0]["findings"]
    assert (f["kind"], f["where"], f["subject"]) == ("needed", "DT_FILTER", "libcudnn.so.9")


def test_glibc_loads_both_filtees_and_runs_their_constructors(tmp_path):
    """Why these are findings: on this machine's glibc a program linked against either filter
    object loads the filtee, runs its constructor and calls the filtee's f()."""
    require_tool("gcc")
    cc_shared(tmp_path / "libvendor.so.1", VENDOR, "-Wl,-soname,libvendor.so.1")
    main = tmp_path / "main.c"
    main.write_text("int f(void);\nint main(void) { return f(); }\n")
    for flag in ("--filter", "--auxiliary"):
        lib = cc_shared(tmp_path / f"libwrap{flag.strip('-')}.so", SOURCE, f"-Wl,{flag}=libvendor.so.1")
        exe = tmp_path / f"main{flag.strip('-')}"
        run("gcc", "-o", exe, main, f"-L{tmp_path}", f"-l{lib.name[3:-3]}", f"-Wl,-rpath,{tmp_path}")
        env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
        proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=30)
        assert (proc.returncode, proc.stdout.strip()) == (42, "filtee loaded"), (flag, proc)


def test_a_program_s_audit_libraries_are_loads_a_library_s_are_not(tmp_path):
    """DT_AUDIT / DT_DEPAUDIT (ld --audit, --depaudit; ':'-separated lists): glibc loads them for the
    main program only, so a program naming cuBLAS there fails, and a shared library carrying the
    tag (which ld.so ignores) passes."""
    res = audit(program(tmp_path, "prog", "-Wl,--audit=libtrace_ok.so.1:libcublas.so.12"))
    assert [(f.rule, f.kind, f.subject, f.where) for f in res.failing] == [
        ("nvidia.cublas", "needed", "libcublas.so.12", "DT_AUDIT")]
    assert ("unresolved", "libtrace_ok.so.1", "DT_AUDIT") in {(f.kind, f.subject, f.where) for f in res.findings}
    lib = cc_shared(tmp_path / "libdep.so", SOURCE, "-Wl,--depaudit=libcublas.so.12")
    assert audit(lib).verdict == "pass"


def test_glibc_loads_a_program_s_audit_library(tmp_path):
    """The mechanism, on this machine: the audit library's constructor runs before main."""
    require_tool("gcc")
    cc_shared(tmp_path / "libaud.so.1", '#include <unistd.h>\n__attribute__((constructor)) static void c(void) '
              '{ write(1, "audit ran\\n", 10); }\nunsigned la_version(unsigned v) { return v; }\n',
              "-Wl,-soname,libaud.so.1")
    exe = program(tmp_path, "prog", "-Wl,--audit=libaud.so.1", returns=7)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)})
    assert (proc.returncode, proc.stdout) == (7, "audit ran\n")


def test_inspect_shows_what_else_loads(libs, capsys):
    rc, out, err = cli(capsys, "inspect", str(libs["filter_cudnn"]))
    assert rc == 0 and "also loads" in out and "libcudnn.so.9 (DT_FILTER)" in out


def test_a_vendor_library_as_the_program_interpreter_fails(tmp_path):
    """PT_INTERP naming cuBLAS (ld --dynamic-linker): the kernel maps that file and runs it before
    the program. Before: PASS."""
    res = audit(program(tmp_path, "prog", "-Wl,--dynamic-linker=/opt/cuda/lib64/libcublas.so.12"))
    assert [(f.rule, f.kind, f.subject, f.where) for f in res.failing] == [
        ("nvidia.cublas", "needed", "libcublas.so.12", "PT_INTERP")]
    assert "/opt/cuda/lib64/libcublas.so.12" in res.failing[0].detail
    assert audit(program(tmp_path, "ordinary")).verdict == "pass"  # the system's ld.so, as every program has

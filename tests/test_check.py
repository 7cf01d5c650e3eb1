"""`check` end to end on gcc/hipcc/nvcc-built objects: verdicts, evidence kinds, chains,
exceptions, inputs (directories, wheels, bad files) and exit codes."""

from __future__ import annotations

import functools
import json
import os
import shutil
import zipfile

import pytest
from linkage_fixtures import (  # noqa: F401  (fixtures)
    OPENBLAS,
    cc_shared,
    cuda_linkage_libs,
    hip_linkage_libs,
    linkage_libs,
    openblas_available,
)

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from cli_runner import cli

needs_openblas = pytest.mark.skipif(not openblas_available(), reason="libopenblas-dev not installed (make test installs it)")


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def check_json(capsys, *args):
    rc, out, err = cli(capsys, "check", "--format", "json", *map(str, args))
    return rc, json.loads(out), err


def one(path, pol=None):
    report = check_paths([str(path)], pol or policy(), ResolveOptions())
    assert len(report.files) == 1
    return report, report.files[0]


def kinds(result):
    return {(f.rule, f.kind) for f in result.failing}


def test_clean_library_passes(linkage_libs, capsys):
    rc, doc, _ = check_json(capsys, linkage_libs["clean"])
    assert rc == EXIT_OK
    assert doc["schema"] == "sovereign-audit.linkage/1" and doc["exit_code"] == 0 and doc["verdict"] == "pass"
    f = doc["files"][0]
    assert f["verdict"] == "pass" and f["findings"] == [] and len(f["sha256"]) == 64
    assert "libm.so.6" in f["needed"]
    libm = [c for c in f["resolved"]["children"] if c["name"] == "libm.so.6"][0]
    assert libm["status"] == "trusted" and libm["children"] == []  # trusted: not descended
    for key in ("path", "sha256", "verdict", "needed", "resolved", "device_targets", "findings", "warnings"):
        assert key in f


def test_files_are_hashed_only_for_outputs_that_show_the_hash(linkage_libs, tmp_path, capsys, monkeypatch):
    """The text log and GitHub annotations show no sha256: `check` with only those hashes
    nothing and writes the same log; JSON, SARIF and JUnit carry the hash and get it."""
    import hashlib

    from audit.elf import hashing

    hashed = []
    real = hashing.hash_file
    monkeypatch.setattr(hashing, "hash_file", lambda path: hashed.append(path) or real(path))
    lib = linkage_libs["static_cublas"]
    rc, plain, _ = cli(capsys, "check", str(lib))
    assert rc == EXIT_VIOLATION and hashed == []
    _, gh, _ = cli(capsys, "check", "--format", "github", str(lib))
    assert hashed == [] and "static-symbol" in gh
    logged = tmp_path / "log.txt"
    rc, doc, _ = check_json(capsys, "--format", f"text={logged}", lib)
    assert rc == EXIT_VIOLATION and len(hashed) == 1
    assert doc["files"][0]["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert logged.read_text() == plain  # the log is the same with or without the hash
    for fmt in ("sarif", "junit"):
        cli(capsys, "check", "--format", fmt, str(lib))
    assert len(hashed) == 3
    _, res = one(lib)  # the API hashes unless told not to
    assert res.sha256 == doc["files"][0]["sha256"]
    quick = check_paths([str(lib)], policy(), ResolveOptions(), sha256=False).files[0]
    assert quick.sha256 is None and [f.to_dict() for f in quick.findings] == [f.to_dict() for f in res.findings]


@needs_openblas
def test_openblas_linked_library_fails(linkage_libs, capsys):
    rc, doc, _ = check_json(capsys, linkage_libs["openblas"])
    assert rc == EXIT_VIOLATION
    needed = [x for x in doc["files"][0]["findings"] if x["kind"] == "needed"]
    assert len(needed) == 1
    assert needed[0]["rule"] == "blas.openblas" and needed[0]["subject"] == OPENBLAS
    assert needed[0]["chain"] == ["libuses_openblas.so", OPENBLAS]
    assert needed[0]["reason"] and needed[0]["use_instead"]


@needs_openblas
def test_openblas_through_origin_runpath_fails_with_the_chain(linkage_libs, capsys):
    rc, out, _ = cli(capsys, "check", str(linkage_libs["origin_top"]))
    assert rc == EXIT_VIOLATION
    assert "chain: libtop.so -> libmiddle.so -> libopenblas.so.0" in out
    _, res = one(linkage_libs["origin_top"])
    trans = [f for f in res.failing if f.kind == "transitive"]
    assert trans[0].rule == "blas.openblas" and trans[0].chain == ["libtop.so", "libmiddle.so", OPENBLAS]
    mid = res.tree.children[0]
    assert mid.name == "libmiddle.so" and mid.how == "runpath" and mid.path == str(linkage_libs["origin_mid"])


def test_vendor_named_static_symbol_fails(linkage_libs):
    _, res = one(linkage_libs["static_cublas"])
    assert res.verdict == "fail"
    hit = [f for f in res.failing if f.kind == "static-symbol"][0]
    assert hit.rule == "nvidia.cublas" and hit.count == 2
    assert {hit.subject, *hit.examples} == {"cublasCreate_v2", "cublasSgemm_v2"}


def test_lookalike_names_pass(linkage_libs):
    _, res = one(linkage_libs["lookalike"])
    assert res.verdict == "pass" and res.findings == []


def test_dlopen_of_a_vendor_library_by_name_fails(linkage_libs):
    _, res = one(linkage_libs["dlopen_cudnn"])
    hit = [f for f in res.failing if f.kind == "dlopen-string"]
    assert [(f.rule, f.subject) for f in hit] == [("nvidia.cudnn", "libcudnn.so.9")]
    assert "dlopen" in hit[0].detail and hit[0].offset is not None
    # dlopen of the base driver by name is allowed
    _, ok = one(linkage_libs["dlopen_cuda"])
    assert ok.verdict == "pass"


def test_removed_needed_is_caught_by_verneed(linkage_libs):
    if "verneed" not in linkage_libs.paths:
        pytest.skip("patchelf not installed (make test installs it)")
    _, res = one(linkage_libs["verneed"])
    assert "libcublas.so.12" not in res.needed and "libcublas.so.12" in res.version_needs
    assert ("nvidia.cublas", "verneed") in kinds(res)
    assert ("linkage.needed-verneed-mismatch", "mismatch") in kinds(res)
    assert res.verdict == "fail"


def test_an_audited_vendor_library_is_itself_a_finding(linkage_libs):
    _, res = one(linkage_libs.root / "verneed/vendor/libcublas.so.12")
    assert ("nvidia.cublas", "soname") in kinds(res) and ("nvidia.cublas", "static-symbol") in kinds(res)


def test_runpath_to_a_directory_of_vendor_libraries_is_not_a_linkage(linkage_libs, tmp_path):
    vendor = linkage_libs.root / "verneed/vendor"  # holds a libcublas.so.12
    lib = cc_shared(tmp_path / "libnear.so", "int near(void){return 0;}\n", f"-Wl,-rpath,{vendor}",
                    "-Wl,--enable-new-dtags")
    _, res = one(lib)
    assert res.verdict == "pass" and res.findings == []  # it neither needs nor dlopens anything there
    loader = cc_shared(tmp_path / "libloader.so", "#include <dlfcn.h>\nvoid *l(const char *n){return dlopen(n, 2);}\n",
                       "-ldl", f"-Wl,-rpath,{vendor}", "-Wl,--enable-new-dtags")
    _, res = one(loader)
    hits = [f for f in res.findings if f.kind == "rpath"]
    assert [(f.rule, f.subject, f.where, f.severity) for f in hits] == [
        ("nvidia.cublas", "libcublas.so.12", f"DT_RUNPATH {vendor}", "warn")]
    assert res.verdict == "pass"


def test_runpath_to_a_system_directory_is_not_evidence(tmp_path):
    sysdir = "/usr/lib/x86_64-linux-gnu"
    if not any(policy().deny_rule_for_soname(n) for n in os.listdir(sysdir) if ".so" in n):
        pytest.skip(f"no denied library in {sysdir} to be tempted by")
    lib = cc_shared(tmp_path / "libsys.so", "int s(void){return 0;}\n", f"-Wl,-rpath,{sysdir}", "-Wl,--enable-new-dtags")
    _, res = one(lib)
    assert res.verdict == "pass" and not [f for f in res.findings if f.kind == "rpath"]


def _exception_policy(tmp_path, file_glob, expires):
    path = tmp_path / "exc.toml"
    path.write_text('extends = "sovereign"\n[[exceptions]]\n'
                    f'file = "{file_glob}"\nrule = "nvidia.cublas"\nreason = "vendored until Q3"\n'
                    + (f"expires = {expires}\n" if expires else ""))
    return path


def test_exceptions_waive_expire_and_warn(linkage_libs, tmp_path, capsys):
    lib = str(linkage_libs["static_cublas"])
    rc, doc, _ = check_json(capsys, "--policy", _exception_policy(tmp_path, "libstatic_cublas.so", "2999-12-31"), lib)
    assert rc == EXIT_OK
    f = doc["files"][0]["findings"][0]
    assert f["excepted"] == "vendored until Q3" and not f["failing"]
    # expired: a violation again, and the output says why
    rc, out, _ = cli(capsys, "check", "--policy", str(_exception_policy(tmp_path, "libstatic_cublas.so", "2000-01-01")), lib)
    assert rc == EXIT_VIOLATION and "EXPIRED on 2000-01-01" in out
    # an exception that matches nothing is a warning, not a failure
    rc, doc, _ = check_json(capsys, "--policy", _exception_policy(tmp_path, "other/*.so", None),
                            linkage_libs["clean"])
    assert rc == EXIT_OK and any("matches nothing" in w for w in doc["warnings"])


def test_bad_policy_exits_2_naming_the_key(linkage_libs, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rules]]\nid = "x.y"\nreason = "r"\nsonames = ["libx"]\nsymbol = ["x*"]\n')
    rc, out, err = cli(capsys, "check", "--policy", str(bad), str(linkage_libs["clean"]))
    assert rc == EXIT_USAGE and out == ""
    assert err == f"error: {bad}: rules[0].symbol: unknown key (allowed: family, id, kernels, markers, name, " \
                  "reason, shared-kernels, sonames, strings, symbol-lists, symbols, use-instead)\n"


def test_bad_inputs_exit_3_one_line_each(linkage_libs, tmp_path, capsys):
    clean = linkage_libs["clean"].read_bytes()
    (tmp_path / "truncated.so").write_bytes(clean[:100])
    (tmp_path / "empty.so").write_bytes(b"")
    (tmp_path / "text.so").write_text("not an ELF\n")
    hdr = bytearray(clean)
    hdr[4] = 7  # a bad EI_CLASS byte
    (tmp_path / "badclass.so").write_bytes(bytes(hdr))
    os.mkfifo(tmp_path / "fifo.so")  # must not block
    (tmp_path / "libstatic.a").write_bytes(b"!<arch>\n")
    for name in ("truncated.so", "empty.so", "text.so", "badclass.so", "missing.so", "fifo.so", "libstatic.a"):
        rc, out, err = cli(capsys, "check", str(tmp_path / name))
        assert rc == EXIT_INPUT, name
        assert "Traceback" not in out + err
        lines = [ln for ln in out.splitlines() if ln.startswith("ERROR")]
        assert lines == [f"ERROR {tmp_path / name}"]


def test_directory_skips_non_elf_but_fails_closed_on_broken_elf(linkage_libs, tmp_path, capsys):
    tree = tmp_path / "tree"
    (tree / "lib").mkdir(parents=True)
    shutil.copy(linkage_libs["clean"], tree / "lib/libclean.so")
    os.symlink("libclean.so", tree / "lib/libclean.so.1")  # the same file twice: audited once
    os.symlink("nowhere", tree / "lib/dangling.so")
    (tree / "README.md").write_text("docs\n")
    (tree / "lib/data.bin").write_bytes(b"\0" * 64)
    (tree / "lib/libvendor_static.a").write_bytes(b"!<arch>\n")
    rc, doc, _ = check_json(capsys, tree)
    assert rc == EXIT_OK and [f["path"] for f in doc["files"]] == [str(tree / "lib/libclean.so")]
    assert doc["summary"]["skipped"] == {"non_elf": 2, "duplicate": 1, "broken_symlink": 1, "archive": 1}
    assert any("static archive" in w for w in doc["warnings"])
    (tree / "lib/libbroken.so").write_bytes(linkage_libs["clean"].read_bytes()[:200])
    rc, doc, _ = check_json(capsys, tree)
    assert rc == EXIT_INPUT
    assert [f["verdict"] for f in doc["files"]] == ["error", "pass"]


@needs_openblas
def test_wheel_members_are_audited_with_paths_inside_the_wheel(linkage_libs, tmp_path, capsys):
    whl = tmp_path / "demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(linkage_libs["clean"], "demo/libclean.so")
        zf.write(linkage_libs["origin_top"], "demo/libtop.so")
        zf.write(linkage_libs["origin_mid"], "demo/deps/libmiddle.so")
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    rc, doc, _ = check_json(capsys, whl)
    assert rc == EXIT_VIOLATION
    verdicts = {f["path"]: f["verdict"] for f in doc["files"]}
    assert verdicts == {f"{whl}!/demo/libclean.so": "pass", f"{whl}!/demo/libtop.so": "fail",
                        f"{whl}!/demo/deps/libmiddle.so": "fail"}
    top = [f for f in doc["files"] if f["path"].endswith("libtop.so")][0]
    trans = [x for x in top["findings"] if x["kind"] == "transitive"][0]
    assert trans["chain"] == ["libtop.so", "libmiddle.so", OPENBLAS]  # $ORIGIN works inside the wheel
    # METADATA is data; __init__.py, a Python source naming no library loader, is not read
    assert (doc["summary"]["skipped"]["non_elf"], doc["summary"]["skipped"]["python_no_load"]) == (1, 1)


def test_unsafe_or_corrupt_wheels_are_errors(tmp_path, capsys):
    evil = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../escape.so", b"\x7fELF" + b"\0" * 60)
    rc, doc, _ = check_json(capsys, evil)
    assert rc == EXIT_INPUT and "unsafe" in doc["files"][0]["error"]
    assert not (tmp_path.parent / "escape.so").exists()
    junk = tmp_path / "junk-1.0-py3-none-any.whl"
    junk.write_bytes(b"PK\x03\x04 definitely not a zip")
    rc, doc, _ = check_json(capsys, junk)
    assert rc == EXIT_INPUT and "cannot read wheel" in doc["files"][0]["error"]


def test_nothing_to_audit_fails_closed(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("no binaries here\n")
    rc, doc, _ = check_json(capsys, tmp_path)
    assert rc == EXIT_INPUT and doc["files"] == [] and doc["verdict"] == "error"
    assert doc["errors"] == [f"no ELF file found in {tmp_path}: nothing was audited"] and doc["warnings"] == []
    # the text says it once, as an error, and ends with the exit code it returns
    rc, out, _ = cli(capsys, "check", str(tmp_path))
    lines = out.splitlines()
    assert rc == EXIT_INPUT and sum("no ELF file found" in line for line in lines) == 1
    assert f"error: no ELF file found in {tmp_path}: nothing was audited" in lines
    assert "warning" not in out and lines[-1] == "result: ERROR (exit 3)"


def test_usage_errors_exit_2(linkage_libs, tmp_path, capsys):
    for args in (["--format", "yaml"], ["--format", "json="], ["--root", str(tmp_path / "none")],
                 ["--ldpath", str(tmp_path / "none")]):
        rc, _, err = cli(capsys, "check", *args, str(linkage_libs["clean"]))
        assert rc == EXIT_USAGE and err.startswith("error: ") and err.count("\n") == 1
    rc, _, _ = cli(capsys, "check")
    assert rc == EXIT_USAGE


def test_error_outranks_violation_in_the_exit_code(linkage_libs, tmp_path, capsys):
    (tmp_path / "x.so").write_text("no")
    rc, _, _ = cli(capsys, "check", str(linkage_libs["static_cublas"]), str(tmp_path / "x.so"))
    assert rc == EXIT_INPUT


def test_hip_gfx1030_object_passes_and_a_tensile_named_kernel_fails(hip_linkage_libs):
    _, res = one(hip_linkage_libs["sovereign_kernel"])
    assert res.device_targets == ["gfx1030"]
    assert "libamdhip64.so.5" in res.needed
    assert res.verdict == "pass", [f.message for f in res.findings]
    hip = [c for c in res.tree.children if c.name == "libamdhip64.so.5"][0]
    assert hip.status == "trusted"
    _, bad = one(hip_linkage_libs["tensile_named"])
    hit = [f for f in bad.failing if f.kind == "device-kernel"]
    assert hit and hit[0].rule == "amd.tensile" and hit[0].subject.startswith("Cijk_Ailk_Bljk")
    assert "gfx1030" in hit[0].where


def test_cuda_sm90_object_passes_and_a_cutlass_kernel_fails(cuda_linkage_libs):
    _, res = one(cuda_linkage_libs["sovereign_kernel"])
    assert "sm_90" in res.device_targets
    assert not any(n.startswith("libcudart") for n in res.needed)  # cudart is static
    assert res.verdict == "pass", [f.message for f in res.findings]
    _, bad = one(cuda_linkage_libs["cutlass_named"])
    assert ("nvidia.cutlass", "device-kernel") in kinds(bad)
    assert bad.verdict == "fail"

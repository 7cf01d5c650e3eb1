"""What `check` reports, as a person and a CI system read it: one finding per (rule, kind,
object) with a count, every match kept in JSON and listed by -v; byte-identical outputs from
run to run; wheel members named `WHEEL!/member`, never by the folder they were unpacked to."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.errors import EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from cli_runner import cli


def _vendor_wheel(tmp_path: Path) -> Path:
    """A wheel laid out as auditwheel lays them out: extensions in pkg/ and pkg/sub/, the libraries
    they need in pkg.libs/ (RUNPATH $ORIGIN/..): a vendor library by name (libcublas.so.12), and a
    helper that defines cuBLAS entry points itself and needs that library."""
    b = tmp_path / "build"
    libs = b / "pkg.libs"
    cc_shared(libs / "libcublas.so.12", "int cublasCreate_v2(void){return 0;}\n", "-Wl,-soname,libcublas.so.12")
    # real bodies (a body that only jumps to cublasCreate_v2 would be a forwarding stub, not a copy)
    cc_shared(libs / "libhelper.so", "extern int cublasCreate_v2(void);\nvolatile int acc;\n"
              "int cublasSgemm_v2(void){acc += 7; return acc * cublasCreate_v2();}\n"
              "int cublasDgemm_v2(void){acc += 1; return acc;}\nint cublasHgemm(void){acc += 2; return acc;}\n",
              f"-L{libs}", "-l:libcublas.so.12", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    cc_shared(b / "pkg/_ext.so", "extern int cublasSgemm_v2(void);\nint ext(void){return cublasSgemm_v2();}\n",
              f"-L{libs}", "-l:libhelper.so", "-Wl,-rpath,$ORIGIN/../pkg.libs", "-Wl,--enable-new-dtags")
    cc_shared(b / "pkg/sub/_deep.so", "extern int cublasSgemm_v2(void);\nint deep(void){return cublasSgemm_v2();}\n",
              f"-L{libs}", "-l:libhelper.so", "-Wl,-rpath,$ORIGIN/../../pkg.libs", "-Wl,--enable-new-dtags")
    whl = tmp_path / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for member in ("pkg/_ext.so", "pkg/sub/_deep.so", "pkg.libs/libhelper.so", "pkg.libs/libcublas.so.12"):
            zf.write(b / member, member)
        zf.writestr("pkg/__init__.py", "")
    return whl


def test_same_wheel_same_bytes_and_members_named_in_the_wheel(tmp_path, capsys):
    whl = _vendor_wheel(tmp_path)
    outs = []
    for run in ("a", "b"):
        d = tmp_path / run
        d.mkdir()
        rc, text, _ = cli(capsys, "check", "--format", "text", "--format", f"json={d / 'r.json'}",
                          "--format", f"sarif={d / 'r.sarif'}", "--format", f"junit={d / 'r.xml'}", whl)
        assert rc == EXIT_VIOLATION
        outs.append({"text": text.encode(), **{p.suffix: p.read_bytes() for p in d.iterdir()}})
    assert outs[0] == outs[1]  # byte-identical, every format
    for data in outs[0].values():
        assert b"sovereign-audit-wheel-" not in data and b"elapsed" not in data

    doc = json.loads(outs[0][".json"])
    ext = next(f for f in doc["files"] if f["path"] == f"{whl}!/pkg/_ext.so")
    deep = next(f for f in doc["files"] if f["path"] == f"{whl}!/pkg/sub/_deep.so")
    cublas = f"{whl}!/pkg.libs/libcublas.so.12"
    helper = f"{whl}!/pkg.libs/libhelper.so"
    for fr in (ext, deep):
        transitive = [f for f in fr["findings"] if f["kind"] == "transitive"]
        assert len(transitive) == 1 and transitive[0]["detail"].startswith(f"found at {cublas} ")
        node = next(n for n in fr["resolved"]["children"] if n["name"] == "libhelper.so")
        leaf = next(n for n in node["children"] if n["name"] == "libcublas.so.12")
        assert node["path"] == helper and leaf["path"] == cublas  # "pkg/sub/../../pkg.libs" resolved too
        # the helper's cuBLAS definitions: counted here, listed once under the helper's own result
        static = [f for f in fr["findings"] if f["kind"] == "static-symbol"]
        assert len(static) == 1 and static[0]["in_file"] == helper and static[0]["matches_in"] == helper
        assert static[0]["count"] == 3 and static[0]["matches"] == []
    own = next(f for f in doc["files"] if f["path"] == helper)
    (static,) = [f for f in own["findings"] if f["kind"] == "static-symbol"]
    assert static["matches"] == [{"where": static["where"],
                                  "names": ["cublasDgemm_v2", "cublasHgemm", "cublasSgemm_v2"]}]
    assert "elapsed_s" not in doc

    rc, _, _ = cli(capsys, "check", "--timing", "--format", f"json={tmp_path / 't.json'}", whl)
    assert rc == EXIT_VIOLATION and json.loads((tmp_path / "t.json").read_text())["elapsed_s"] >= 0


def test_needed_libraries_of_one_rule_are_one_finding(tmp_path):
    d = tmp_path / "lib"
    for name in ("libcudnn.so.9", "libcudnn_ops.so.9"):
        cc_shared(d / name, "int f(void){return 0;}\n", f"-Wl,-soname,{name}")
    user = cc_shared(tmp_path / "libuser.so", "int u(void){return 0;}\n", f"-L{d}", "-l:libcudnn.so.9",
                     "-l:libcudnn_ops.so.9", f"-Wl,-rpath,{d}")
    report = check_paths([str(user)], load_policy(None), ResolveOptions())
    needed = [f for f in report.files[0].findings if f.kind == "needed"]
    assert len(needed) == 1 and needed[0].count == 2
    assert [m.names for m in needed[0].matches] == [["libcudnn.so.9"], ["libcudnn_ops.so.9"]]
    assert needed[0].subject == "libcudnn.so.9" and needed[0].examples == ["libcudnn_ops.so.9"]
    assert all(m.detail.startswith("found at ") for m in needed[0].matches)


_KERNELS = 12


@pytest.fixture(scope="module")
def many_cutlass_kernels(tmp_path_factory) -> Path:
    """nvcc, two targets (two cubins in the fatbin), twelve kernels in namespace cutlass: what a
    library embedding CUTLASS looks like, at a scale where one finding per entry would be noise."""
    nvcc = require_tool("nvcc")
    d = tmp_path_factory.mktemp("cutlass-many")
    inst = "".join(f"template __global__ void Kernel<{i}>(float *);\n" for i in range(_KERNELS))
    (d / "k.cu").write_text("namespace cutlass {\ntemplate <int N>\n__global__ void Kernel(float *x) "
                            "{ x[threadIdx.x] *= N; }\n" + inst + "}\n")
    out = d / "libmany.so"
    subprocess.run([nvcc, "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                    "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(d / "k.cu")], check=True,
                   capture_output=True)
    return out


def test_device_kernels_one_finding_every_match_kept(many_cutlass_kernels, capsys, tmp_path):
    rc, out, _ = cli(capsys, "check", "--format", "text", "--format", f"json={tmp_path / 'r.json'}",
                     many_cutlass_kernels)
    assert rc == EXIT_VIOLATION
    (fr,) = json.loads((tmp_path / "r.json").read_text())["files"]
    kern = [f for f in fr["findings"] if f["kind"] == "device-kernel"]
    assert len(kern) == 1 and kern[0]["rule"] == "nvidia.cutlass"
    places = kern[0]["matches"]
    assert sorted(p["where"].split()[-1] for p in places) == ["sm_80", "sm_90"]
    assert all(len(p["names"]) == _KERNELS for p in places)
    assert kern[0]["count"] == 2 * _KERNELS and kern[0]["distinct"] == _KERNELS
    names = {n for p in places for n in p["names"]}
    assert all(n.startswith("_ZN7cutlass6KernelILi") for n in names) and len(names) == _KERNELS
    # text: one line for the finding, a few names, the rest counted
    lines = [line for line in out.splitlines() if "device-kernel" in line]
    assert len(lines) == 1 and f"{2 * _KERNELS} matches, {_KERNELS} names" in lines[0]
    assert sum(n in out for n in names) == 5 and f"+{_KERNELS - 5} more" in lines[0]
    assert out.count("[nvidia.cutlass]") == 1
    # -v: every match, under the place it was found
    rc, verbose, _ = cli(capsys, "check", "-v", many_cutlass_kernels)
    assert rc == EXIT_VIOLATION and all(verbose.count(f"          {n}\n") == 2 for n in names)

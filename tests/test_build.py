"""`sovereign-audit build`: real compiles by g++, hipcc and nvcc, provenance checked against
digests computed here independently, failure and missing-toolchain behaviour."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit.kernel_build import targets as tg
from audit.kernel_build.builder import BUILT, FAILED, SKIPPED, BuildResult, TargetBuild, build_one, ensure_built, up_to_date
from audit.kernel_build.toolchain import find

REPO = Path(__file__).resolve().parent.parent


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def included_tree_files(root: Path, source: str, include_dirs=("flash_kernel/include", "flash_kernel/src"),
                        conditional: bool = True) -> set[str]:
    """Every flash_kernel/ file `source` includes, found by following #include "..." lines
    (an independent check of the compiler-dependency listing in provenance.json). With
    conditional=False, only includes outside any #if block (an include guard does not count):
    the files every target's compile must read; conditional=True adds those a target may skip."""
    seen: set[str] = set()
    todo = [root / source]
    while todo:
        f = todo.pop().resolve()
        rel = f.relative_to(root.resolve()).as_posix()
        if rel in seen:
            continue
        seen.add(rel)
        for name in _includes(f.read_text(errors="replace"), conditional):
            for base in [f.parent] + [root / d for d in include_dirs]:
                cand = base / name
                if cand.is_file():
                    todo.append(cand)
                    break
    return seen


def _includes(text: str, conditional: bool) -> list[str]:
    names, stack = [], []  # stack: one bool per open #if block, True for an include guard
    lines = [ln.strip() for ln in text.splitlines()]
    for i, line in enumerate(lines):
        d = re.match(r"#\s*(\w+)\s*(.*)", line)
        if not d:
            continue
        word, rest = d.group(1), d.group(2)
        if word in ("if", "ifdef", "ifndef"):
            nxt = next((ln for ln in lines[i + 1:] if ln.startswith("#")), "")
            stack.append(word == "ifndef" and re.fullmatch(rf"#\s*define\s+{re.escape(rest.split()[0])}\s*", nxt) is not None
                         if rest else False)
        elif word == "endif" and stack:
            stack.pop()
        elif word == "include" and (conditional or all(stack)):
            m = re.match(r'"([^"]+)"', rest)
            if m:
                names.append(m.group(1))
    return names


def run_cli(*args, env=None, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "audit", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=900)


def check_provenance(tb: TargetBuild, root: Path = REPO) -> dict:
    tdir = Path(tb.library).parent
    prov = json.loads((tdir / "provenance.json").read_text())
    assert prov["schema"] == "sovereign-audit.provenance/1" and prov["target"] == tb.target
    assert isinstance(prov["command"], list) and all(isinstance(a, str) for a in prov["command"])
    assert os.path.isabs(prov["command"][0]) and Path(prov["command"][0]).name == prov["compiler"]["name"]
    spec = tg.all_specs()[tb.target]
    assert prov["flags"] == list(spec.flags)
    assert prov["command"][1:1 + len(spec.flags)] == list(spec.flags)
    assert spec.source in prov["command"] and "-o" in prov["command"]
    assert prov["compiler"]["version"] and prov["compiler"]["version_text"]
    for key in ("hostname", "kernel", "distro", "cpu", "machine"):
        assert prov["host"][key], key
    # digests computed here, independently
    listed = {s["path"]: s["sha256"] for s in prov["sources"]}
    required = included_tree_files(root, spec.source, conditional=False)
    allowed = included_tree_files(root, spec.source)
    assert required <= set(listed) <= allowed, (sorted(required - set(listed)), sorted(set(listed) - allowed))
    for rel, digest in listed.items():
        assert digest == sha256(root / rel), rel
    assert prov["outputs"][0]["sha256"] == sha256(Path(tb.library)) == tb.sha256
    assert prov["outputs"][0]["size"] == Path(tb.library).stat().st_size
    assert not [p.name for p in tdir.iterdir() if ".tmp-" in p.name], "temporary files left behind"
    return prov


# ---- cpu: always --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cpu_build(fixture_root) -> TargetBuild:
    # the same build folder as tests/test_kernel_cpu.py: built once, reused while its provenance matches
    tb = ensure_built(["cpu"], fixture_root / "fk_build").get("cpu")
    assert tb.status == BUILT, tb.reason
    return tb


def test_cpu_build_and_provenance(cpu_build):
    prov = check_provenance(cpu_build)
    assert prov["kind"] == "cpu" and prov["compiler"]["name"] == "g++"
    assert not any(a.startswith(("-march", "-mtune", "-mavx")) for a in prov["command"]), "must run on any x86-64"
    assert {"-O3", "-std=c++17", "-shared", "-fPIC", "-pthread"} <= set(prov["command"])
    assert prov["sources_method"] == "compiler-deps"
    assert {"flash_kernel/src/fk_cpu.cpp", "flash_kernel/src/fk_common.h",
            "flash_kernel/include/flash_kernel.h"} <= {s["path"] for s in prov["sources"]}
    if shutil.which("dpkg-query"):
        assert "libc6" in prov["compiler"]["packages"]
    build_json = json.loads((Path(cpu_build.library).parent.parent / "build.json").read_text())
    assert build_json["schema"] == "sovereign-audit.build/1"
    assert any(t["target"] == "cpu" and t["status"] == "built" for t in build_json["targets"])
    out = subprocess.run(["readelf", "-d", cpu_build.library], capture_output=True, text=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
    assert needed and needed <= {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6", "ld-linux-x86-64.so.2"}


def test_cpu_library_reports_its_target(cpu_build):
    code = ("import ctypes,sys; d=ctypes.CDLL(sys.argv[1]); d.fk_target.restype=ctypes.c_char_p;"
            "d.fk_flash_path.restype=ctypes.c_char_p; print(d.fk_abi_version(), d.fk_target().decode(),"
            " d.fk_flash_path().decode())")
    out = subprocess.run([sys.executable, "-c", code, cpu_build.library], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "cpu", "cpu"]


# ---- the builder's mechanics on a small source tree of our own ----------------------------------

def small_tree(tmp_path: Path, body: str) -> Path:
    root = tmp_path / "tree"
    (root / "flash_kernel" / "include").mkdir(parents=True)
    (root / "flash_kernel" / "src" / "sub").mkdir(parents=True)
    (root / "flash_kernel" / "src" / "sub" / "extra.h").write_text("#pragma once\n#define FK_EXTRA 3\n")
    (root / "flash_kernel" / "src" / "unused.h").write_text("#error never included\n")
    (root / "flash_kernel" / "src" / "fk_cpu.cpp").write_text(body)
    return root


GOOD = '#include <vector>\n#include "sub/extra.h"\nextern "C" int fk_abi_version(void) { return FK_EXTRA - 2; }\n'


def test_provenance_lists_exactly_what_the_tu_included(tmp_path):
    root = small_tree(tmp_path, GOOD)
    out = tmp_path / "out"
    tb = build_one(tg.cpu_spec(), find("g++"), root, out, True)
    assert tb.status == BUILT, tb.reason
    prov = json.loads((out / "cpu" / "provenance.json").read_text())
    assert {s["path"] for s in prov["sources"]} == {"flash_kernel/src/fk_cpu.cpp", "flash_kernel/src/sub/extra.h"}
    for s in prov["sources"]:
        assert s["sha256"] == sha256(root / s["path"])
    assert prov["cwd"] == str(root.resolve())
    assert (out / "cpu" / "build.log").is_file()
    # up_to_date: reused while nothing changed, refused once an included header changes
    assert up_to_date(tg.cpu_spec(), find("g++"), root.resolve(), out) is not None
    (root / "flash_kernel" / "src" / "sub" / "extra.h").write_text("#pragma once\n#define FK_EXTRA 4\n")
    assert up_to_date(tg.cpu_spec(), find("g++"), root.resolve(), out) is None


def test_failed_compile_leaves_the_previous_library_and_a_log(tmp_path):
    root = small_tree(tmp_path, GOOD + "this is not C++;\n")
    out = tmp_path / "out"
    (out / "cpu").mkdir(parents=True)
    previous = out / "cpu" / "libflash_kernel.so"
    previous.write_bytes(b"previous good build")
    tb = build_one(tg.cpu_spec(), find("g++"), root, out, True)
    assert tb.status == FAILED
    assert "error" in tb.reason and "\n" not in tb.reason and "build.log" in tb.reason
    assert previous.read_bytes() == b"previous good build"
    assert not (out / "cpu" / "provenance.json").exists()
    log = (out / "cpu" / "build.log").read_text()
    assert "this is not C++" in log or "does not name a type" in log
    assert sorted(p.name for p in (out / "cpu").iterdir()) == ["build.log", "libflash_kernel.so"]


def test_exit_code_semantics():
    def tb(name, status, requested):
        return TargetBuild(name, "x", status, "", requested)

    # defaults: a default target skipped for its toolchain is fine; cpu (always requested) must build
    assert BuildResult("o", [], [tb("gfx1030", SKIPPED, False), tb("cpu", BUILT, True)]).exit_code == 0
    assert BuildResult("o", [], [tb("sm_90", FAILED, False), tb("cpu", BUILT, True)]).exit_code == 1
    # named targets: each must be built
    assert BuildResult("o", ["gfx1030"], [tb("gfx1030", SKIPPED, True)]).exit_code == 1


def test_defaults_skip_missing_toolchains_and_reuse_a_current_cpu_build(cpu_build, monkeypatch):
    """Default targets (None): gfx1030, sm_90a and sm_90 without their toolchains are skipped and do not
    fail the build; cpu is reused because its provenance still matches. Only the toolchain lookup
    is replaced here: the reuse check and the result are the real ones."""
    import audit.kernel_build.builder as builder
    from audit.kernel_build.toolchain import ToolchainMissing

    real_find = builder.find

    def only_gxx(name):
        if name != "g++":
            raise ToolchainMissing(f"{name} not found: test")
        return real_find(name)

    monkeypatch.setattr(builder, "find", only_gxx)
    out = Path(cpu_build.library).parent.parent
    result = ensure_built(None, out)
    got = {t.target: (t.status, t.requested) for t in result.targets}
    assert got == {"gfx1030": (SKIPPED, False), "sm_90a": (SKIPPED, False), "sm_90": (SKIPPED, False),
                   "cpu": (BUILT, True)}
    assert [t.target for t in result.targets] == ["gfx1030", "sm_90a", "sm_90", "cpu"]  # sm_90a: run's primary
    assert result.get("cpu").reason.startswith("up to date") and result.get("cpu").sha256 == cpu_build.sha256
    assert result.exit_code == 0 and result.requested == []
    named = ensure_built(["gfx1030", "cpu"], out)
    assert named.exit_code == 1 and named.get("gfx1030").requested


# ---- the command line ---------------------------------------------------------------------------

def test_a_define_builds_a_variant_recorded_in_its_provenance(tmp_path):
    """--define FK_NAME=INT reaches the compiler as -DFK_NAME=INT after the target's own flags and
    is recorded in provenance.json (flags, note) and build.json, so a variant's library says what
    it is; ensure_built (the default build) does not take that folder's build as current."""
    out = tmp_path / "variant"
    cp = run_cli("build", "--target", "cpu", "--define", "FK_FP8_FLUSH_TILES_D128=4", "-D", "FK_SOME_SWITCH=-1",
                 "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    prov = json.loads((out / "cpu" / "provenance.json").read_text())
    assert prov["flags"][-2:] == ["-DFK_FP8_FLUSH_TILES_D128=4", "-DFK_SOME_SWITCH=-1"]
    assert prov["command"][1:len(prov["flags"]) + 1] == prov["flags"]
    assert "variant build" in prov["note"]
    assert "-DFK_FP8_FLUSH_TILES_D128=4" in (out / "build.json").read_text()
    assert ensure_built(["cpu"], out).targets[0].reason != "up to date (provenance matches)"


@pytest.mark.parametrize("define", ["FK_X", "FK_X=", "X=1", "fk_x=1", "FK_X=abc", "FK_X=1 -o/tmp/x", "FK_X=1;id",
                                    "FK_X=1\n##[warning]x", "FK_X=99999999999", "FK_TARGET=1", "FK_WGMMA=0"])
def test_a_bad_define_is_a_usage_error_before_any_compile(tmp_path, define):
    cp = run_cli("build", "--target", "sm_90a", "--target", "cpu", "--define", define, "--out", str(tmp_path / "o"))
    assert cp.returncode == 2, cp.stderr
    line = cp.stderr.strip()
    assert line.startswith("error: --define ") and "\n" not in line and "Traceback" not in cp.stderr
    assert not (tmp_path / "o").exists()


def test_a_define_given_twice_is_a_usage_error(tmp_path):
    cp = run_cli("build", "--target", "cpu", "-D", "FK_X=1", "-D", "FK_X=2", "--out", str(tmp_path / "o"))
    assert cp.returncode == 2 and cp.stderr.strip() == "error: --define FK_X: given more than once"
    assert not (tmp_path / "o").exists()


def test_unknown_target_is_a_usage_error(tmp_path):
    cp = run_cli("build", "--target", "gfx9999", "--target", "cpu", "--out", str(tmp_path / "o"))
    assert cp.returncode == 2
    line = cp.stderr.strip()
    assert line.startswith("error: unknown target 'gfx9999'") and "\n" not in line
    for name in ("cpu", "sm_90a", "sm_90", "sm_80", "sm_90-generic", "gfx1030", "gfx90a"):
        assert name in line
    assert not (tmp_path / "o" / "cpu").exists()


def test_missing_toolchain_names_the_package(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    cp = run_cli("build", "--target", "gfx1030", "--out", str(tmp_path / "o"), env={"PATH": str(empty)})
    assert cp.returncode == 1, cp.stderr
    assert "skipped  gfx1030" in cp.stdout
    assert "hipcc not found: apt install hipcc libamdhip64-dev rocm-device-libs" in cp.stdout
    data = json.loads((tmp_path / "o" / "build.json").read_text())
    assert [(t["target"], t["status"]) for t in data["targets"]] == [("gfx1030", "skipped")]
    assert not (tmp_path / "o" / "gfx1030" / "libflash_kernel.so").exists()


# ---- GPU targets (compiled here; run elsewhere) -------------------------------------------------

GPU_TARGETS = {"gfx1030": "hipcc", "gfx90a": "hipcc", "sm_90": "nvcc", "sm_90a": "nvcc"}


@pytest.fixture(scope="session")
def gpu_builds(fixture_root) -> dict[str, TargetBuild]:
    assert (REPO / tg.GPU_SOURCE).is_file(), f"{tg.GPU_SOURCE} is missing"
    wanted = [t for t, c in GPU_TARGETS.items() if shutil.which(c) or (c == "nvcc" and find_ok("nvcc"))]
    if not wanted:
        pytest.skip("neither hipcc nor nvcc is installed")
    result = ensure_built(wanted, fixture_root / "fk_build")
    return {t.target: t for t in result.targets}


def find_ok(name: str) -> bool:
    try:
        find(name)
        return True
    except Exception:
        return False


def gpu_build(gpu_builds, target) -> TargetBuild:
    tb = gpu_builds.get(target)
    if tb is None:
        pytest.skip(f"{GPU_TARGETS[target]} not installed")
    assert tb.status == BUILT, f"{target}: {tb.status}: {tb.reason}"
    return tb


def elf_sections(path: str) -> set[str]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        return {s.name for s in ELFFile(f).iter_sections()}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gfx1030", "gfx90a"])
def test_amd_build(gpu_builds, target):
    tb = gpu_build(gpu_builds, target)
    prov = check_provenance(tb)
    assert prov["env"] == {"HIP_PLATFORM": "amd"} and f"--offload-arch={target}" in prov["command"]
    assert prov["compiler"]["details"].get("hip") and prov["compiler"]["details"].get("clang")
    if shutil.which("dpkg-query"):
        assert "hipcc" in prov["compiler"]["packages"] and "rocm-device-libs" in prov["compiler"]["packages"]
    assert ".hip_fatbin" in elf_sections(tb.library)
    assert f"hipv4-amdgcn-amd-amdhsa--{target}".encode() in Path(tb.library).read_bytes()


@pytest.mark.slow
def test_sm90_build(gpu_builds):
    tb = gpu_build(gpu_builds, "sm_90")
    prov = check_provenance(tb)
    assert "arch=compute_90,code=sm_90" in prov["command"] and prov["compiler"]["details"].get("cuda_release")
    assert ".nv_fatbin" in elf_sections(tb.library)
    out = subprocess.run(["readelf", "-d", tb.library], capture_output=True, text=True).stdout
    assert "libcudart" not in out  # cudart is static: the base runtime only


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "gfx1030", "gfx90a", "sm_90", "sm_90a"])
def test_built_objects_pass_check_under_the_default_policy(request, target):
    tb = request.getfixturevalue("cpu_build") if target == "cpu" else gpu_build(request.getfixturevalue("gpu_builds"), target)
    cp = run_cli("check", tb.library)
    assert cp.returncode == 0, f"{target}: {cp.stdout[-2000:]} {cp.stderr[-2000:]}"


def _device_entries(obj):
    if isinstance(obj, dict):
        if "kind" in obj and "target" in obj:
            yield obj
        for v in obj.values():
            yield from _device_entries(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _device_entries(v)


@pytest.mark.slow
@pytest.mark.parametrize("target,kind", [("gfx1030", "amdgcn-code-object"), ("sm_90", "cubin"), ("sm_90a", "cubin")])
def test_inspect_shows_the_device_code(gpu_builds, target, kind):
    tb = gpu_build(gpu_builds, target)
    cp = run_cli("inspect", "--json", tb.library)
    assert cp.returncode == 0, cp.stderr
    entries = list(_device_entries(json.loads(cp.stdout)))
    assert any(e["kind"] == kind and str(e["target"]).startswith(target) for e in entries), entries


# ---- sm_90a: the Hopper target (two cubins: sm_90a for wgmma/TMA, sm_80 for mma.sync) -------------

FATBIN_MAGIC, ARCH_SPECIFIC = 0xBA55ED50, 0x100000  # fatbin header magic; entry flag of an "a" cubin
SYSTEM_NEEDED = {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6", "ld-linux-x86-64.so.2"}


def fatbin_cubins(path: str) -> list[tuple[int, int]]:
    """(SM, flags) of every cubin entry in .nv_fatbin, walked here by the documented layout,
    independently of audit/elf (fatbin header: magic, u16 version, u16 header size, u64 payload
    size; entry: u16 kind @0, u32 header size @4, u64 payload size @8, u32 SM @0x1c, u64 flags @0x28)."""
    import struct

    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        data = ELFFile(f).get_section_by_name(".nv_fatbin").data()
    cubins, at = [], 0
    while at + 16 <= len(data):
        magic, _version, head, payload = struct.unpack_from("<IHHQ", data, at)
        if magic != FATBIN_MAGIC:  # fatbins are aligned inside the section: skip the padding
            at += 8
            continue
        e, end = at + head, at + head + payload
        while e < end:
            kind, ehead, esize = struct.unpack_from("<H2xIQ", data, e)
            if kind == 2:
                cubins.append((struct.unpack_from("<I", data, e + 0x1C)[0], struct.unpack_from("<Q", data, e + 0x28)[0]))
            e += ehead + esize
        at = end
    return cubins


def needed(path: str) -> set[str]:
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


@pytest.mark.slow
def test_sm90a_build_has_an_sm90a_and_an_sm80_cubin(gpu_builds):
    tb = gpu_build(gpu_builds, "sm_90a")
    prov = check_provenance(tb)
    cmd = prov["command"]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "-gencode"] == ["arch=compute_90a,code=sm_90a",
                                                                         "arch=compute_80,code=sm_80"]
    assert "-DFK_WGMMA" in cmd and prov["expected_flash_path"] == "wgmma" and "cc 9.0" in prov["note"]
    # headers read only by a device pass (fk_wgmma.h includes its ops under __CUDA_ARCH_FEAT_SM90_ALL)
    # are digested too: this build takes every conditional include of the tree
    listed = {s["path"] for s in prov["sources"]}
    assert listed == included_tree_files(REPO, tg.GPU_SOURCE), sorted(included_tree_files(REPO, tg.GPU_SOURCE) - listed)
    cubins = fatbin_cubins(tb.library)
    # the arch-specific ("a") flag on the SM 90 cubins and on no SM 80 one; nothing else in the fatbin
    assert {sm for sm, _ in cubins} == {80, 90}, cubins
    assert all(flags & ARCH_SPECIFIC for sm, flags in cubins if sm == 90), cubins
    assert not any(flags & ARCH_SPECIFIC for sm, flags in cubins if sm == 80), cubins
    # the walk tells the two apart: the plain sm_90 library's cubins carry no "a" flag
    plain = fatbin_cubins(gpu_build(gpu_builds, "sm_90").library)
    assert {sm for sm, _ in plain} == {90} and not any(f & ARCH_SPECIFIC for _, f in plain), plain
    # the tensor maps come through cudaGetDriverEntryPoint: no libcuda (nor any vendor library) linked
    assert needed(tb.library) == SYSTEM_NEEDED, needed(tb.library)
    # fk_target() is a host function: callable here without a GPU
    code = ("import ctypes,sys; d=ctypes.CDLL(sys.argv[1]); d.fk_target.restype=ctypes.c_char_p;"
            "print(d.fk_abi_version(), d.fk_target().decode())")
    out = subprocess.run([sys.executable, "-c", code, tb.library], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "sm_90a"]


@pytest.mark.slow
def test_sm90a_inspect_and_check_list_both_cubins(gpu_builds):
    tb = gpu_build(gpu_builds, "sm_90a")
    cp = run_cli("inspect", "--json", tb.library)
    assert cp.returncode == 0, cp.stderr
    cubins = [e for e in _device_entries(json.loads(cp.stdout)) if e["kind"] == "cubin" and e["error"] is None]
    assert {e["target"] for e in cubins} == {"sm_90a", "sm_80"}, cubins
    for target in ("sm_90a", "sm_80"):  # the flash kernels are in both cubins, not only a stub
        kernels = {k for e in cubins if e["target"] == target for k in e["kernels"]}
        assert any("flash_mma_kernel" in k for k in kernels), (target, sorted(kernels))
    hopper = {k for e in cubins if e["target"] == "sm_90a" for k in e["kernels"] if "wgmma" in k}
    assert len(hopper) >= 4, sorted(hopper)  # fp16/bf16 x D 64/128
    text = run_cli("inspect", tb.library).stdout
    assert re.search(r"cubin\s+sm_90a\s", text) and re.search(r"cubin\s+sm_80\s", text), text[-3000:]
    cp = run_cli("check", "--format", "json", tb.library)
    assert cp.returncode == 0, cp.stdout[-2000:]
    res = json.loads(cp.stdout)
    (fr,) = res["files"]
    assert fr["verdict"] == "pass" and set(fr["device_targets"]) == {"sm_80", "sm_90a"}, fr


@pytest.mark.slow
@pytest.mark.parametrize("vendor,rule", [("libcublas.so.13", "nvidia.cublas"), ("libcudnn.so.9", "nvidia.cudnn")])
def test_sm90a_library_with_a_vendor_library_linked_fails_check(gpu_builds, tmp_path, vendor, rule):
    """The same sm_90a object with one vendor library added to DT_NEEDED (as linking it would):
    check must fail and name the rule."""
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        pytest.skip("patchelf not on PATH (make test installs it)")
    tb = gpu_build(gpu_builds, "sm_90a")
    bad = tmp_path / "libflash_kernel.so"
    shutil.copy(tb.library, bad)
    subprocess.run([patchelf, "--add-needed", vendor, str(bad)], check=True, capture_output=True)
    assert vendor in needed(str(bad))
    cp = run_cli("check", str(bad))
    assert cp.returncode == 1, cp.stdout[-2000:]
    assert f"[{rule}]" in cp.stdout and f"needed: {vendor}  (DT_NEEDED)" in cp.stdout, cp.stdout[-2000:]
    res = json.loads(run_cli("check", "--format", "json", str(bad)).stdout)
    (fr,) = res["files"]
    hits = [(f["rule"], f["kind"], f["subject"], f["where"]) for f in fr["findings"] if f["failing"]]
    assert hits == [(rule, "needed", vendor, "DT_NEEDED")], hits

"""Embedded device code: hipcc offload bundles (plain and CCOB) and nvcc fatbins.

Targets and kernel names asserted here are the ones the fixture builds ask for and the fixture
source defines (fk_probe_kernel, fk_probe_scale); bundle ids, offsets and e_flags are checked
against roc-obj-ls and llvm-readelf-15 where they are installed.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from audit.elf.reader import read_elf
from elf_fixtures import (KERNELS, compressed_hip_libs, cuda_libs, hip_libs, host_libs,  # noqa: F401
                          run, tool)


def amd(info):
    return [d for d in info.device_code if d.kind == "amdgcn-code-object"]


@pytest.mark.parametrize("name,targets", [("gfx1030", {"gfx1030"}), ("gfx90a", {"gfx90a"}),
                                          ("both", {"gfx1030", "gfx90a:sramecc+:xnack-"})])
def test_hip_targets_and_kernels(hip_libs, name, targets):
    info = read_elf(hip_libs[name])
    objs = amd(info)
    assert {d.target for d in objs} == targets
    for d in objs:
        assert set(d.kernels) == set(KERNELS) and d.error is None
        assert d.container == "hip_fatbin" and d.section == ".hip_fatbin" and d.compressed is None
        assert d.bundle_id == f"hipv4-amdgcn-amd-amdhsa--{d.target}"
    assert any(d.kind == "host" for d in info.device_code)
    assert "libamdhip64.so.5" in info.needed


def _roc_obj_ls(path):
    out = subprocess.run([tool("roc-obj-ls"), str(path)], capture_output=True, text=True, check=True).stdout
    return {(m.group(1), int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"(\S+)\s+file://\S+#offset=(\d+)&size=(\d+)", out)}


@pytest.mark.parametrize("name", ["gfx1030", "both"])
def test_hip_bundles_match_roc_obj_ls(hip_libs, name):
    info = read_elf(hip_libs[name])
    ours = {(d.bundle_id, d.offset, d.size) for d in info.device_code}
    assert ours == _roc_obj_ls(hip_libs[name])


def test_hip_e_flags_and_kernels_match_llvm_readobj(hip_libs, tmp_path):
    readobj = tool("llvm-readobj-15")
    readelf = tool("llvm-readelf-15")
    info = read_elf(hip_libs["both"])
    data = hip_libs["both"].read_bytes()
    expect = {"gfx1030": ["EF_AMDGPU_MACH_AMDGCN_GFX1030"],
              "gfx90a:sramecc+:xnack-": ["EF_AMDGPU_MACH_AMDGCN_GFX90A", "EF_AMDGPU_FEATURE_SRAMECC_ON_V4",
                                         "EF_AMDGPU_FEATURE_XNACK_OFF_V4"]}
    assert sorted(d.target for d in amd(info)) == sorted(expect)  # else the loop below checks nothing
    for d in amd(info):
        co = tmp_path / f"{d.target.replace(':', '_')}.co"
        co.write_bytes(data[d.offset:d.offset + d.size])
        header = subprocess.run([readobj, "-h", str(co)], capture_output=True, text=True, check=True).stdout
        for flag in expect[d.target]:
            assert flag in header
        syms = subprocess.run([readelf, "-s", "-W", str(co)], capture_output=True, text=True, check=True).stdout
        kds = {m.group(1) for m in re.finditer(r"\s(\S+)\.kd$", syms, re.M)}
        assert kds == set(d.kernels)


@pytest.mark.parametrize("key,algo", [("v1-zlib", "zlib"), ("v2-zlib", "zlib"), ("v2-zstd", "zstd"),
                                      ("v3-zstd", "zstd")])
def test_compressed_bundles(compressed_hip_libs, key, algo):
    info = read_elf(compressed_hip_libs[key])
    objs = amd(info)
    # two CCOB containers in one section, each holding the hipcc bundle (gfx1030 + gfx90a)
    assert sorted(d.target for d in objs) == sorted(["gfx1030", "gfx90a:sramecc+:xnack-"] * 2)
    for d in objs:
        assert d.compressed == algo and d.error is None and set(d.kernels) == set(KERNELS)


def test_hipcc_offload_compress_if_supported(fixture_root):
    hipcc = tool("hipcc")
    probe = subprocess.run([hipcc, "--help"], capture_output=True, text=True, env=_hip_env())
    if "offload-compress" not in probe.stdout + probe.stderr:
        pytest.skip("Debian's hipcc 5.2 (clang 15) has no --offload-compress; CCOB is covered by "
                    "test_compressed_bundles around hipcc's own bundle")
    # where hipcc can compress, its own compressed bundle must be read like our CCOB fixtures
    from elf_fixtures import DEVICE_SRC
    out = fixture_root / "hip" / "libfk_hipcompressed.so"
    out.parent.mkdir(exist_ok=True)
    run([hipcc, "--offload-arch=gfx1030", "--offload-compress", "-shared", "-fPIC", "-o", str(out),
         str(DEVICE_SRC / "fk_probe.hip")], env=_hip_env())
    objs = amd(read_elf(out))
    assert [d.target for d in objs] == ["gfx1030"]
    assert objs[0].compressed in ("zlib", "zstd") and objs[0].error is None
    assert set(objs[0].kernels) == set(KERNELS)


def _hip_env():
    from elf_fixtures import hip_env

    return hip_env()


def test_corrupted_bundle_is_an_entry_error_not_a_crash(compressed_hip_libs, tmp_path):
    data = bytearray(compressed_hip_libs["v2-zlib"].read_bytes())
    at = data.find(b"CCOB")
    data[at + 40:at + 60] = b"\xff" * 20  # inside the zlib stream
    bad = tmp_path / "libbadccob.so"
    bad.write_bytes(bytes(data))
    info = read_elf(bad)
    errors = [d for d in info.device_code if d.error]
    assert errors and errors[0].compressed == "zlib" and "zlib" in errors[0].error


def test_cuda_sm90(cuda_libs):
    info = read_elf(cuda_libs["sm90"])
    cubins = [d for d in info.device_code if d.kind == "cubin"]
    ptx = [d for d in info.device_code if d.kind == "ptx"]
    assert {d.target for d in cubins} == {"sm_90"}
    assert any(set(d.kernels) == set(KERNELS) for d in cubins)
    assert {d.target for d in ptx} == {"compute_90"} and set(ptx[0].kernels) == set(KERNELS)
    assert all(d.container == "nv_fatbin" and d.error is None for d in info.device_code)
    # nvcc links cudart statically: no libcudart in NEEDED, its strings name libcuda.so.1
    assert not any(n.startswith("libcudart") for n in info.needed)
    assert "libcuda.so.1" in {h.text for h in info.library_strings}
    assert "dlopen" in info.code_loading_imports


def test_cuda_sm90a_arch_suffix(cuda_libs):
    info = read_elf(cuda_libs["sm90a"])
    assert {d.target for d in info.device_code if d.kind == "cubin"} == {"sm_90a"}
    assert not [d for d in info.device_code if d.kind == "ptx"]


def test_cuda_family_target_suffix(cuda_libs):
    info = read_elf(cuda_libs["sm100f"])
    assert {d.target for d in info.device_code if d.kind == "cubin"} == {"sm_100f"}


def test_cuda_ptx_only(cuda_libs):
    info = read_elf(cuda_libs["ptx"])
    assert [d.kind for d in info.device_code] == ["ptx"]
    assert info.device_code[0].target == "compute_90"
    assert set(info.device_code[0].kernels) == set(KERNELS)


def test_cuda_lz4_compressed(cuda_libs):
    info = read_elf(cuda_libs["lz4"])
    assert info.device_code and all(d.compressed == "lz4" and d.error is None for d in info.device_code)
    assert any(set(d.kernels) == set(KERNELS) for d in info.device_code if d.kind == "cubin")


def test_missing_decompressor_is_reported_not_raised(cuda_libs, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    info = read_elf(cuda_libs["sm90"])
    zstd = [d for d in info.device_code if d.compressed == "zstd"]
    if not zstd:
        pytest.skip("this nvcc did not zstd-compress any entry by default")
    assert all(d.error == "zstd-compressed; install zstandard" for d in zstd)
    assert any(set(d.kernels) == set(KERNELS) for d in info.device_code if d.kind == "cubin")


def test_cuobjdump_agrees(cuda_libs):
    cuobjdump = tool("cuobjdump")
    out = subprocess.run([cuobjdump, "--list-elf", str(cuda_libs["sm90a"])], capture_output=True, text=True).stdout
    assert "sm_90a" in out
    assert {d.target for d in read_elf(cuda_libs["sm90a"]).device_code} == {"sm_90a"}


def test_hip_bundle_ids_match_clang_offload_bundler(hip_libs, tmp_path):
    bundler = tool("clang-offload-bundler-15")
    objcopy = tool("objcopy")
    section = tmp_path / "hip_fatbin.bin"
    run([objcopy, "--dump-section", f".hip_fatbin={section}", str(hip_libs["both"]), str(tmp_path / "copy.so")])
    listed = subprocess.run([bundler, "--list", "--type=o", f"--input={section}"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert {d.bundle_id for d in read_elf(hip_libs["both"]).device_code} == set(listed)


def test_amdgpu_mach_table_agrees_with_llvm_header():
    from pathlib import Path

    from audit.elf.amdgpu import AMDGPU_MACH

    header = Path("/usr/lib/llvm-15/include/llvm/BinaryFormat/ELF.h")
    if not header.is_file():
        pytest.skip("llvm-15-dev's BinaryFormat/ELF.h not installed (an independent source of the values)")
    values = {int(v, 16): name.lower() for name, v in
              re.findall(r"EF_AMDGPU_MACH_AMDGCN_(GFX\w+?)\s*=\s*(0x[0-9a-fA-F]+)", header.read_text())}
    assert values[0x36] == "gfx1030" and values[0x3F] == "gfx90a"
    for value, name in values.items():
        assert AMDGPU_MACH.get(value) == name, hex(value)

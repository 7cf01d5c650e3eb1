"""The RDNA2 (gfx1030) object of the generic flash kernel, as the compiler made it.

The library is built by the project's builder with the real hipcc (Debian HIP 5.2, LLVM 15) and
read back through bench/rdna2_codegen.py: llvm-objdump's disassembly, the code object's msgpack
metadata note and the .kd kernel descriptors. Asserted: the fp16 D=64 and D=128 kernels use
v_dot2(c)_f32_f16, in their hot loop; no flash kernel uses private (scratch) memory, in its hot loop
or anywhere; the metadata is plausible and its LDS size equals GenericTile's shared memory computed
here from fk_traits.h's formula.

How the checks were made to fail (kept as tests below): the same assertion helpers are run on a
second build with `-mllvm -amdgpu-limit-to-128-vgprs` (LLVM's own switch; the fp16/bf16 kernels
need 149-215 VGPRs, so they must spill) and must report the spills (scratch in the hot loop,
private_segment_fixed_size > 0); the dot check must reject the bf16 kernels, which have no dot
instruction; the loop finder is run on synthetic disassembly whose answer is known.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elf_fixtures import compressed_hip_libs, hip_libs, host_libs  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


def _load_bench():
    spec = importlib.util.spec_from_file_location("rdna2_codegen", REPO / "bench" / "rdna2_codegen.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rdna2_codegen"] = mod
    spec.loader.exec_module(mod)
    return mod


rc = _load_bench()

SPILL_FLAGS = ("-mllvm", "-amdgpu-limit-to-128-vgprs")
DIT = [("fp16", 64), ("fp16", 128), ("bf16", 64), ("bf16", 128)]


def tile_smem_bytes(d: int, es: int) -> int:
    """GenericTile<D, ES>::kSmemBytes, by fk_traits.h's formula (if GenericTile changes, change this)."""
    bm = (16 if d > 128 else 32) if es == 4 else (32 if d >= 256 else 64)
    bn = (16 if d > 128 else 32) if es == 4 else (64 if d <= 64 else 32)
    w = d // (4 // es) + 1
    pw = bn + 1
    return (bm + bn) * w * 4 + bm * pw * 4


ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


# ---- the assertion helpers (one place, so the negative builds check exactly these) ---------------

def dot_problems(k: dict) -> list[str]:
    out = []
    if k["dot2_f16"] == 0:
        out.append(f"{k['dtype']} D{k['head_dim']}: no v_dot2(c)_f32_f16")
    hot = k["hot_loop"]
    if hot is None or hot["dot2_f16"] == 0:
        out.append(f"{k['dtype']} D{k['head_dim']}: no v_dot2(c)_f32_f16 in the hot loop")
    return out


def spill_problems(k: dict) -> list[str]:
    out, md, name = [], k["metadata"], f"{k['dtype']} D{k['head_dim']}"
    if md["private_segment_fixed_size"] != 0:
        out.append(f"{name}: private_segment_fixed_size {md['private_segment_fixed_size']}")
    if md["vgpr_spill_count"] or md["sgpr_spill_count"]:
        out.append(f"{name}: spill counts {md['vgpr_spill_count']} VGPR / {md['sgpr_spill_count']} SGPR")
    if k["hot_loop"] is None:
        out.append(f"{name}: no hot loop found")
    elif k["hot_loop"]["scratch"]:
        out.append(f"{name}: {k['hot_loop']['scratch']} scratch instructions in the hot loop")
    if k["scratch"]:
        out.append(f"{name}: {k['scratch']} scratch instructions")
    return out


def by_key(report: dict) -> dict[tuple[str, int], dict]:
    return {(k["dtype"], k["head_dim"]): k for k in report["kernels"]}


# ---- builds --------------------------------------------------------------------------------------

def _tools():
    import shutil

    if shutil.which("hipcc") is None:
        pytest.skip("hipcc not on PATH (apt install hipcc libamdhip64-dev rocm-device-libs)")
    objdump = rc.find_llvm_tool("llvm-objdump")
    if objdump is None:
        pytest.skip("llvm-objdump not found (apt install llvm-15)")
    return objdump


@pytest.fixture(scope="session")
def gfx1030_report(fixture_root):
    """The project's own gfx1030 build (shares test_build's output folder: built once a pytest session)."""
    objdump = _tools()
    from audit.kernel_build.builder import BUILT, ensure_built

    tb = ensure_built(["gfx1030"], fixture_root / "fk_build").get("gfx1030")
    assert tb is not None and tb.status == BUILT, f"gfx1030 build: {tb and tb.status}: {tb and tb.reason}"
    return rc.analyse(tb.library, objdump)


@pytest.fixture(scope="session")
def spill_report(fixture_root):
    """The same translation unit built with the target's own flags plus LLVM's 128-VGPR limit."""
    objdump = _tools()
    from audit.kernel_build import targets as tg

    spec = tg.amd_spec("gfx1030")
    out = fixture_root / "rdna2_spill" / "libflash_kernel.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = spec.command(str(out))
    argv[1:1] = list(SPILL_FLAGS)
    cp = subprocess.run(argv, cwd=REPO, env={**os.environ, **spec.env}, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return rc.analyse(out, objdump)


# ---- the real object -----------------------------------------------------------------------------

@pytest.mark.slow
def test_every_instantiation_is_reported(gfx1030_report):
    got = set(by_key(gfx1030_report))
    want = {(t, d) for t in ("fp16", "bf16", "fp32") for d in (32, 64, 96, 128, 192, 256)}  # the head-dim buckets
    assert got == want
    assert [o["target"] for o in gfx1030_report["code_objects"]] == ["gfx1030"]


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
def test_fp16_kernels_use_the_dot2_instruction_in_the_hot_loop(gfx1030_report, d):
    k = by_key(gfx1030_report)[("fp16", d)]
    assert dot_problems(k) == []
    assert k["hot_loop"]["dot2_f16"] == k["dot2_f16"]  # every dot2 sits in the K/V tile loop
    # each unrolled step of the Q.K loop is one dot2 per (row, key column) a thread owns: RM x CN
    bm, bn = 64, (64 if d <= 64 else 32)
    assert k["dot2_f16"] % ((bm // 8) * (bn // 16)) == 0


@pytest.mark.slow
def test_bf16_kernels_have_no_dot_instruction_and_gfx1030_has_none_for_bf16(gfx1030_report):
    """The honest note: bf16 products are two FMAs each; LLVM 15's assembler knows
    v_dot2_f32_bf16 (gfx11) and refuses it for gfx1030."""
    for d in (64, 128):
        k = by_key(gfx1030_report)[("bf16", d)]
        assert k["dot2_f16"] == 0 and k["dot_other"] == 0 and k["hot_loop"]["fma"] > 0
        assert dot_problems(k)  # the dot check rejects a kernel without the instruction
    mc = rc.find_llvm_tool("llvm-mc")
    if mc is None:
        pytest.skip("llvm-mc not found (llvm-15)")
    asm = "v_dot2_f32_bf16 v0, v1, v2, v3\n"
    args = [mc, "-triple=amdgcn-amd-amdhsa", "-show-encoding"]
    on_1030 = subprocess.run([*args, "-mcpu=gfx1030"], input=asm, capture_output=True, text=True)
    on_1100 = subprocess.run([*args, "-mcpu=gfx1100"], input=asm, capture_output=True, text=True)
    assert on_1030.returncode != 0 and "not supported on this GPU" in on_1030.stderr
    assert on_1100.returncode == 0 and "v_dot2_f32_bf16" in on_1100.stdout


@pytest.mark.slow
def test_no_flash_kernel_uses_scratch(gfx1030_report):
    problems = [p for k in gfx1030_report["kernels"] for p in spill_problems(k)]
    assert problems == []
    for k in gfx1030_report["kernels"]:
        assert k["descriptor"]["private_segment_fixed_size"] == 0
        assert k["scratch_in_loops"] == 0 and k["flat"] == 0


@pytest.mark.slow
def test_metadata_is_plausible_and_lds_is_the_generic_tile(gfx1030_report):
    for k in gfx1030_report["kernels"]:
        md, kd, name = k["metadata"], k["descriptor"], f"{k['dtype']} D{k['head_dim']}"
        assert 0 < md["vgpr_count"] <= 256, name
        assert 0 < md["sgpr_count"] <= 106, name
        assert md["wavefront_size"] == 32 and kd["wave32"], name
        assert md["max_flat_workgroup_size"] == 128, name  # __launch_bounds__(128)
        assert md["group_segment_fixed_size"] == tile_smem_bytes(k["head_dim"], ELEMENT_BYTES[k["dtype"]]), name
        # the descriptor is a second, independent encoding of the same numbers
        assert kd["group_segment_fixed_size"] == md["group_segment_fixed_size"], name
        assert md["vgpr_count"] <= kd["vgprs_encoded"] < md["vgpr_count"] + 8, name
        assert not kd["private_segment_enabled"], name
        assert kd["wgp_mode"], name  # gfx10 default: WGP mode (the occupancy column assumes it)


@pytest.mark.slow
def test_metadata_decoding_matches_llvm_readelf(gfx1030_report, fixture_root):
    """Our msgpack decoder against llvm-readelf's own rendering of the same note."""
    readelf = rc.find_llvm_tool("llvm-readelf")
    if readelf is None:
        pytest.skip("llvm-readelf not found (llvm-15)")
    from audit.kernel_build.builder import ensure_built

    lib = ensure_built(["gfx1030"], fixture_root / "fk_build").get("gfx1030").library
    co = rc.code_objects(lib)[0]
    path = fixture_root / "rdna2_co.o"
    path.write_bytes(co.data)
    text = subprocess.run([readelf, "--notes", str(path)], capture_output=True, text=True, check=True).stdout
    theirs = {}
    for item in re.split(r"\n  - (?=\.)", text)[1:]:  # one YAML list item per kernel (keys sorted)
        fields = dict(re.findall(r"^\s*\.(name|vgpr_count|sgpr_count|group_segment_fixed_size|"
                                 r"private_segment_fixed_size|wavefront_size):\s+(\S+)", item, re.M))
        name = fields.pop("name", None)
        if name is not None:
            theirs[name] = {k: int(v) for k, v in fields.items()}
    ours = {k["name"]: k["metadata"] for k in gfx1030_report["kernels"]}
    assert set(ours) <= set(theirs)
    for name, md in ours.items():
        for field in ("vgpr_count", "sgpr_count", "group_segment_fixed_size", "private_segment_fixed_size",
                      "wavefront_size"):
            assert md[field] == theirs[name][field], (name, field)


@pytest.mark.slow
def test_the_checks_fail_on_a_build_that_spills(spill_report):
    ks = by_key(spill_report)
    for key in DIT:
        problems = spill_problems(ks[key])
        assert any("private_segment_fixed_size" in p for p in problems), (key, problems)
        assert any("in the hot loop" in p for p in problems), (key, problems)
    assert dot_problems(ks[("fp16", 128)]) == []  # spilling does not remove the dot instruction


@pytest.mark.slow
def test_cli_prints_the_table(gfx1030_report):
    lib = gfx1030_report["library"]
    cp = subprocess.run([sys.executable, str(REPO / "bench" / "rdna2_codegen.py"), lib],
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert "| fp16 D128 | 64 |" in cp.stdout and cp.stdout.rstrip().splitlines()[-1].startswith("| fp32 D256 |")


def test_cli_missing_library_is_one_clear_line(tmp_path):
    cp = subprocess.run([sys.executable, str(REPO / "bench" / "rdna2_codegen.py"), str(tmp_path / "nope.so")],
                        capture_output=True, text=True)
    assert cp.returncode == 2 and cp.stdout == ""
    assert len(cp.stderr.strip().splitlines()) == 1 and "no such file" in cp.stderr


# ---- compressed bundles: the same code objects come out --------------------------------------------

def test_code_objects_of_ccob_bundles_equal_the_plain_ones(hip_libs, compressed_hip_libs):  # noqa: F811
    plain = sorted(co.data for co in rc.code_objects(hip_libs["both"]))
    assert len(plain) == 2
    for key, lib in compressed_hip_libs.items():
        got = sorted(co.data for co in rc.code_objects(lib))
        assert got == sorted(plain * 2), key


# ---- the loop finder on synthetic disassembly --------------------------------------------------------

def _asm(lines: list[tuple[str, str]], base: int = 0x1000, name: str = "k") -> str:
    """objdump-style text: one 4-byte instruction per (mnemonic, operands)."""
    out = [f"{base:016x} <{name}>:"]
    for n, (mnem, ops) in enumerate(lines):
        out.append(f"\t{mnem} {ops}".rstrip().ljust(60) + f"// {base + 4 * n:012X}: BF800000")
    return "\n".join(out) + "\n"


def _branch(at: int, to: int) -> str:
    """The simm16 objdump prints for a branch at instruction index `at` to index `to`."""
    return str((to - at - 1) & 0xFFFF)


def synthetic():
    # 0 entry: s_cbranch_scc0 -> 12 (out-of-line block after s_endpgm)
    # 1 body start (reached from 0 and from 13)
    # 2-6 outer loop header 2: inner loop 3..5 with a dot2; 6 latch back to 2
    # 7..10 after the loop: scratch store (outside any loop), s_endpgm at 10
    # 11 padding, 12-13 out-of-line block that branches back to 1: not a loop
    L = [("s_cbranch_scc0", _branch(0, 12)),
         ("s_mov_b32", "s0, 0"),
         ("s_add_u32", "s1, s1, 1"),
         ("v_dot2c_f32_f16_e32", "v0, v1, v2"),
         ("v_fmac_f32_e32", "v3, v4, v5"),
         ("s_cbranch_scc1", _branch(5, 3)),
         ("s_cbranch_vccnz", _branch(6, 2)),
         ("buffer_store_dword", "v1, off, s[0:3], 0 offset:4"),
         ("scratch_load_dword", "v2, off, s4"),
         ("buffer_gl0_inv", ""),
         ("s_endpgm", ""),
         ("s_nop", "0"),
         ("s_load_dwordx2", "s[0:1], s[4:5], 0x0"),
         ("s_branch", _branch(13, 1))]
    return L


def test_loops_are_natural_loops_not_address_intervals():
    funcs = rc.parse_disassembly(_asm(synthetic()))
    info = rc.analyse_function(funcs["k"])
    hot = info["hot_loop"]
    assert hot["header"] == 0x1000 + 4 * 2 and hot["depth"] == 1
    assert hot["span"] == [0x1000 + 4 * 2, 0x1000 + 4 * 6]
    assert hot["dot2_f16"] == 1 and hot["fma"] == 1 and hot["scratch"] == 0
    assert sorted((x["header"], x["depth"]) for x in info["loops"]) == [(0x1008, 1), (0x100C, 2)]
    # the backward s_branch at 13 -> 1 is no loop: 1 does not dominate 13
    assert all(x["header"] != 0x1004 for x in info["loops"])
    assert info["scratch"] == 2 and info["scratch_in_loops"] == 0  # buffer_gl0_inv is not scratch


def test_scratch_inside_the_loop_is_found():
    L = synthetic()
    L[4] = ("scratch_load_dword", "v3, off, s4 offset:8")
    info = rc.analyse_function(rc.parse_disassembly(_asm(L))["k"])
    assert info["hot_loop"]["scratch"] == 1 and info["scratch_in_loops"] == 1
    L[4] = ("buffer_load_dword", "v3, off, s[52:55], 0 offset:8")  # MUBUF spill through a copied descriptor
    info = rc.analyse_function(rc.parse_disassembly(_asm(L))["k"])
    assert info["hot_loop"]["scratch"] == 1


def test_branch_offset_and_objdump_comment_must_agree():
    text = _asm([("s_branch", "1"), ("s_nop", "0"), ("s_endpgm", "")])
    line = text.splitlines()[1] + " <k+0x4>"  # offset 1 means +0x8, the comment says +0x4
    bad = "\n".join([text.splitlines()[0], line, *text.splitlines()[2:]]) + "\n"
    with pytest.raises(rc.CodegenError, match="objdump says"):
        rc.parse_disassembly(bad)
    good = "\n".join([text.splitlines()[0], text.splitlines()[1] + " <k+0x8>", *text.splitlines()[2:]]) + "\n"
    assert rc.parse_disassembly(good)["k"][0].target == 0x1008


def test_mnemonic_classes():
    assert rc.is_dot2_f16("v_dot2c_f32_f16_e32") and rc.is_dot2_f16("v_dot2_f32_f16")
    assert not rc.is_dot2_f16("v_dot2_f32_bf16") and rc.is_dot("v_dot2_f32_bf16")
    for m in ("v_fma_f32", "v_fmac_f32_e32", "v_fma_mix_f32", "v_pk_fma_f16", "v_fma_mixlo_f16", "v_mac_f32_e32"):
        assert rc.is_fma(m), m
    for m in ("v_mad_u64_u32", "v_fma_f64", "v_mul_f32_e32"):
        assert not rc.is_fma(m), m
    for m in ("scratch_store_dword", "buffer_load_dword", "buffer_store_dwordx4", "buffer_atomic_add"):
        assert rc.is_scratch(m), m
    for m in ("buffer_gl0_inv", "buffer_gl1_inv", "global_load_dwordx4", "ds_read_b128"):
        assert not rc.is_scratch(m), m


# ---- occupancy and metadata decoding, by hand ------------------------------------------------------

def test_occupancy_by_hand():
    # fp16 D128 as built: 176 VGPRs -> 176 allocated -> 1024 // 176 = 5 waves per SIMD; LDS 33408 ->
    # 33792 (1 KiB granules) -> 3 workgroups per 128 KiB WGP -> 3 x 4 waves over 4 SIMDs = 3.
    o = rc.occupancy(176, 33408, 128, "wgp")
    assert (o["waves_per_simd"], o["limiter"], o["lds_alloc"], o["vgpr_alloc"]) == (3, "lds", 33792, 176)
    c = rc.occupancy(176, 33408, 128, "cu")  # 64 KiB: 1 workgroup, 4 waves over 2 SIMDs
    assert (c["waves_per_simd"], c["limiter"]) == (2, "lds")
    v = rc.occupancy(250, 0, 128, "wgp")  # 256 allocated -> 4 waves per SIMD
    assert (v["waves_per_simd"], v["limiter"]) == (4, "vgpr")
    w = rc.occupancy(8, 1024, 128, "wgp")
    assert (w["waves_per_simd"], w["limiter"]) == (16, "waves")
    assert rc.occupancy(161, 27264, 128, "cu")["limiter"] == "vgpr+lds"
    with pytest.raises(ValueError):
        rc.occupancy(100, 65537)
    with pytest.raises(ValueError):
        rc.occupancy(300, 0)


def test_msgpack_subset():
    blob = bytes([0x82, 0xA1, 0x61, 0x93, 0x01, 0xCD, 0x01, 0x00, 0xFF,
                  0xA1, 0x62, 0x81, 0xD9, 0x03]) + b"key" + bytes([0xC3])
    assert rc.msgpack_decode(blob) == {"a": [1, 256, -1], "b": {"key": True}}
    with pytest.raises(rc.CodegenError, match="truncated"):
        rc.msgpack_decode(blob[:-3])


def test_flash_kernel_names():
    assert rc.flash_kernel_key("_ZN2fk7generic20flash_generic_kernelINS_3F16ELi128EEEvNS_11FlashParamsE") == ("fp16", 128)
    assert rc.flash_kernel_key("_ZN2fk7generic20flash_generic_kernelINS_4BF16ELi64EEEvNS_11FlashParamsE") == ("bf16", 64)
    assert rc.flash_kernel_key("_ZN2fk5naive14softmax_kernelEPfl") is None

"""Forwarding stubs are not static copies: gcc/g++ (x86-64) and aarch64-linux-gnu-gcc build
defined vendor-API functions that only pass the call on (a jump to a PLT entry, through a GOT
slot, a call then ret, a lazy dlsym stub), and real copies next to them; `check` must report the
first as imports (or run-time loads) naming the target, and only the second as static symbols."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import run

from audit.elf.reader import read_elf
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

SRC = Path(__file__).parent / "fixtures" / "stubs"
# variant name -> extra compiler flags for thunks.c
THUNK_FLAGS = {
    "plt": [],
    "noplt": ["-fno-plt"],
    "call": ["-fno-optimize-sibling-calls"],
}


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def shared(cc: str, out: Path, src: str, *flags: str) -> Path:
    """cc -shared -fPIC -O2 of one source in tests/fixtures/stubs into `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    run(cc, "-shared", "-fPIC", "-O2", "-o", out, SRC / src, *flags)
    return out


def _build(cc: str, out: Path) -> dict[str, Path]:
    """One toolchain's fixtures in `out`: the renamed vendor library, thunks linked against it
    (one per THUNK_FLAGS variant), real copies, the lazy dlsym stub, the registered pointer and
    a function that logs its own name."""
    link = [f"-L{out}", "-lvendorapi", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"]
    p = {"vendor": shared(cc, out / "libvendorapi.so", "vendorapi.c")}
    for variant, extra in THUNK_FLAGS.items():
        p[f"thunks_{variant}"] = shared(cc, out / f"libthunks_{variant}.so", "thunks.c", *extra, *link)
    p["copies"] = shared(cc, out / "libcopies.so", "copies.c")
    p["lazy_c"] = shared(cc, out / "liblazy_c.so", "lazy_stub.c", "-ldl")
    p["lazy_split"] = shared(cc, out / "liblazy_split.so", "lazy_split.c", "-ldl")
    p["registered"] = shared(cc, out / "libregistered.so", "registered.c")
    p["logs_own_name"] = shared(cc, out / "liblogs_own_name.so", "logs_own_name.c", "-ldl")
    p["wrapper"] = shared(cc, out / "libwrapper.so", "wrapper.c", "-ldl")
    shared(cc, out / "libltapi.so", "ltapi.c")
    p["env_mode"] = shared(cc, out / "libenv_mode.so", "env_mode.c", f"-L{out}", "-lltapi",
                           "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    return p


@pytest.fixture(scope="session")
def x86_stubs(fixture_root) -> dict[str, Path]:
    require_tool("gcc")
    out = Path(fixture_root) / "stubs-x86_64"
    p = _build("gcc", out)
    # Intel CET: endbr64 first, and the PLT entries in .plt.sec
    p["thunks_cet"] = shared("gcc", out / "libthunks_cet.so", "thunks.c", "-fcf-protection=full", "-Wl,-z,ibtplt",
                             f"-L{out}", "-lvendorapi")
    if shutil.which("g++"):
        p["lazy_cc"] = shared("g++", out / "liblazy_cc.so", "lazy_stub.cc", "-ldl")
    return p


@pytest.fixture(scope="session")
def a64_stubs(fixture_root) -> dict[str, Path]:
    cc = require_tool("aarch64-linux-gnu-gcc")
    out = Path(fixture_root) / "stubs-aarch64"
    p = _build(cc, out)
    # branch protection: bti c first
    p["thunks_bti"] = shared(cc, out / "libthunks_bti.so", "thunks.c", "-mbranch-protection=standard",
                             f"-L{out}", "-lvendorapi")
    return p


def audit(path: Path):
    report = check_paths([str(path)], policy(), ResolveOptions())
    (res,) = report.files
    return res


def own(res, rule: str) -> list:
    """The audited file's own content findings of one rule (not its dependency tree's)."""
    return [f for f in res.findings if f.rule == rule and f.in_file is None
            and f.kind not in ("needed", "rpath", "transitive")]


def jump_slot(path: Path, symbol: str) -> int:
    """The GOT slot the dynamic relocations assign to `symbol`, read with pyelftools."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        dynsym = elf.get_section_by_name(".dynsym")
        for sec in elf.iter_sections():
            if sec.header["sh_type"] != "SHT_RELA" or sec.header["sh_link"] != elf.get_section_index(".dynsym"):
                continue
            for rel in sec.iter_relocations():
                if rel["r_info_sym"] and dynsym.get_symbol(rel["r_info_sym"]).name == symbol:
                    return rel["r_offset"]
    raise AssertionError(f"{path}: no relocation names {symbol}")


ARCHES = ["x86_stubs", "a64_stubs"]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("variant", list(THUNK_FLAGS))
def test_thunks_to_the_plt_or_got_are_imports_naming_the_target(request, arch, variant):
    libs = request.getfixturevalue(arch)
    path = libs[f"thunks_{variant}"]
    info = read_elf(path, policy().symbol_pattern)
    fw = {f.symbol: f for f in info.forwarders}
    assert set(fw) >= {"dgemm_", "sgemm_"}, info.forwarders
    assert fw["dgemm_"].target == "scipy_dgemm_" and fw["sgemm_"].target == "scipy_sgemm_"
    assert fw["dgemm_"].via == ("got" if variant == "noplt" else "plt")
    assert fw["dgemm_"].slot == jump_slot(path, "scipy_dgemm_")  # the slot a second ELF reader names

    mine = own(audit(path), "blas.reference")
    assert not [f for f in mine if f.kind == "static-symbol"], [f.message for f in mine]
    # one finding: the stubs (dgemm_, sgemm_) and the plain imports (scipy_dgemm_, scipy_sgemm_),
    # each place with its own detail
    (imports,) = mine
    assert imports.kind == "imported-symbol" and imports.count == 4
    by_names = {tuple(m.names): m for m in imports.matches}
    assert set(by_names) == {("dgemm_", "sgemm_"), ("scipy_dgemm_", "scipy_sgemm_")}
    stubs = by_names[("dgemm_", "sgemm_")]
    target = "scipy_dgemm_ (GOT)" if variant == "noplt" else "scipy_dgemm_@plt"
    assert "forwarding stub" in stubs.detail and f"dgemm_ -> {target}" in stubs.detail
    assert imports.detail == stubs.detail  # what the text report shows beside the finding
    assert by_names[("scipy_dgemm_", "scipy_sgemm_")].detail is None


def test_endbr64_and_plt_sec_are_followed(x86_stubs):
    fw = {f.symbol: f for f in read_elf(x86_stubs["thunks_cet"], policy().symbol_pattern).forwarders}
    assert fw["dgemm_"].target == "scipy_dgemm_" and fw["dgemm_"].via == "plt"
    assert fw["dgemm_"].slot == jump_slot(x86_stubs["thunks_cet"], "scipy_dgemm_")


def test_bti_before_the_branch_is_skipped(a64_stubs):
    fw = {f.symbol: f for f in read_elf(a64_stubs["thunks_bti"], policy().symbol_pattern).forwarders}
    assert fw["dgemm_"].target == "scipy_dgemm_" and fw["dgemm_"].via == "plt"


@pytest.mark.parametrize("arch", ARCHES)
def test_real_copies_stay_static_symbols(request, arch):
    libs = request.getfixturevalue(arch)
    info = read_elf(libs["copies"], policy().symbol_pattern)
    assert [f.symbol for f in info.forwarders] == ["dgemv_"] and info.forwarders[0].target == "free"
    (blas,) = own(audit(libs["copies"]), "blas.reference")
    assert blas.kind == "static-symbol" and {blas.subject, *blas.examples} == {"ddot_", "dgemv_"}


@pytest.mark.parametrize("arch, lib", [("x86_stubs", "lazy_c"), ("x86_stubs", "lazy_cc"), ("a64_stubs", "lazy_c")])
def test_a_lazy_dlsym_stub_is_a_run_time_load(request, arch, lib):
    libs = request.getfixturevalue(arch)
    if lib not in libs:
        pytest.skip("g++ not on PATH")
    # the C++ file has two stubs
    stubs = ("cublasCreate_v2", "cublasDestroy_v2") if lib == "lazy_cc" else ("cublasCreate_v2",)
    fw = {f.symbol: f for f in read_elf(libs[lib], policy().symbol_pattern).forwarders}
    assert fw["cublasCreate_v2"].via == "dlsym" and fw["cublasCreate_v2"].target == "cublasCreate_v2"
    cublas = own(audit(libs[lib]), "nvidia.cublas")
    assert [f.kind for f in cublas] == ["dlopen-string"]  # no static-symbol
    by_names = {tuple(m.names): m for m in cublas[0].matches}
    assert set(by_names) == {stubs, ("libcublas.so.12",)}
    assert 'cublasCreate_v2 -> dlsym("cublasCreate_v2")' in by_names[stubs].detail
    assert "libcublas.so.12" in by_names[stubs].detail  # the library it loads by name


@pytest.mark.parametrize("arch", ARCHES)
def test_a_split_off_part_of_a_stub_is_no_static_copy(request, arch):
    libs = request.getfixturevalue(arch)
    info = read_elf(libs["lazy_split"], policy().symbol_pattern)
    assert {f.symbol: f.via for f in info.forwarders} == {"cublasCreate_v2": "dlsym"}
    assert "cublasCreate_v2.cold" in {s.name for s in info.symbols if s.defined}  # kept: it matches cublas*
    cublas = own(audit(libs["lazy_split"]), "nvidia.cublas")
    assert [f.kind for f in cublas] == ["dlopen-string"]
    assert not any("cublasCreate_v2.cold" in m.names for f in cublas for m in f.matches)


@pytest.mark.parametrize("arch", ARCHES)
def test_a_pointer_not_filled_by_name_is_no_evidence_of_loading(request, arch):
    libs = request.getfixturevalue(arch)
    assert read_elf(libs["registered"], policy().symbol_pattern).forwarders == []
    (cublas,) = own(audit(libs["registered"]), "nvidia.cublas")
    assert cublas.kind == "static-symbol" and cublas.subject == "cublasCreate_v2"


@pytest.mark.parametrize("arch", ARCHES)
def test_a_call_through_a_filled_pointer_that_goes_on_is_real_code(request, arch):
    libs = request.getfixturevalue(arch)
    assert read_elf(libs["logs_own_name"], policy().symbol_pattern).forwarders == []
    (cudnn,) = own(audit(libs["logs_own_name"]), "nvidia.cudnn")
    assert cudnn.kind == "static-symbol" and cudnn.subject == "cudnnConvolutionForward"


@pytest.mark.parametrize("arch", ARCHES)
def test_a_stub_is_reported_under_the_rule_of_the_code_it_reaches(request, arch):
    libs = request.getfixturevalue(arch)
    res = audit(libs["env_mode"])
    assert own(res, "nvidia.cublas") == []
    (lt,) = own(res, "nvidia.cublaslt")
    assert lt.kind == "imported-symbol"
    by_names = {tuple(m.names): m for m in lt.matches}
    assert set(by_names) == {("cublasGetEnvironmentMode",), ("cublasLtGetEnvironmentMode",)}
    assert "cublasGetEnvironmentMode -> cublasLtGetEnvironmentMode@plt" in by_names[("cublasGetEnvironmentMode",)].detail


def test_a_wrapper_that_hands_its_own_name_to_dlsym_is_a_run_time_load(x86_stubs):
    # x86-64 only: on AArch64 only the tail-jump stub is recognised
    fw = {f.symbol: f for f in read_elf(x86_stubs["wrapper"], policy().symbol_pattern).forwarders}
    assert fw["cudnnCreate"].via == "dlsym" and fw["cudnnCreate"].target == "cudnnCreate"
    (cudnn,) = own(audit(x86_stubs["wrapper"]), "nvidia.cudnn")
    assert cudnn.kind == "dlopen-string" and 'cudnnCreate -> dlsym("cudnnCreate")' in cudnn.detail


_FORKED = r"""
import json, os, sys
import audit.elf.reader as reader
from audit.elf import prescan
from audit.linkage.judging.policy import load_policy

pattern = load_policy(None).symbol_pattern
decoded_here = []
real = reader.read_forwarders
reader.read_forwarders = lambda *a: decoded_here.append(1) or real(*a)  # counts this process's calls only
out = {}
for path in sys.argv[1:]:
    plain = reader.read_elf(path, pattern).to_dict()
    prescan.MIN_ENTRIES = 1  # every table counts as large: the child selects it, then decodes the stubs
    before = len(decoded_here)
    waited = []
    seen = []
    forked_info = reader.read_elf(path, pattern, meanwhile=waited.append, on_symbols=seen.append)
    forked = forked_info.to_dict()
    # no room for names in the shared maps: the child reads the other tables' names itself and
    # sends its own through the pipe
    start = prescan.start
    prescan.start = lambda *a, **k: start(*a, **{**k, "text": 0, "names_room": 0})
    no_room = reader.read_elf(path, pattern).to_dict()
    prescan.start = start
    # a parent that never hands the other tables over: the child stops, the parent decodes
    give, prescan.Prescan.give = prescan.Prescan.give, lambda self, selections: None
    middle = len(decoded_here)
    unhanded = reader.read_elf(path, pattern).to_dict()
    prescan.Prescan.give = give
    prescan.MIN_ENTRIES = 10**9
    out[path] = {"same": forked == plain == unhanded == no_room, "stubs": len(plain["forwarders"]), "meanwhile": waited,
                 "on_symbols": len(seen) == 1 and seen[0] is forked_info.symbols,
                 "decoded_here": middle - before, "decoded_here_unhanded": len(decoded_here) - middle}
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", ARCHES)
def test_stubs_decoded_in_the_prescan_child_are_the_same(request, arch):
    """A file whose largest symbol table is selected in a forked child (audit.elf.prescan) has
    its forwarding stubs decoded there too, from the other tables' selections the parent hands
    over; they must equal the in-process reading, also when nothing is handed over (the parent
    then decodes them). Run in a fresh interpreter: the fork is taken only in a single-threaded
    process."""
    import json
    import os
    import subprocess
    import sys

    libs = request.getfixturevalue(arch)
    paths = [str(libs[k]) for k in ("thunks_plt", "thunks_noplt", "lazy_c", "env_mode", "copies")]
    repo = str(Path(__file__).resolve().parent.parent)
    cp = subprocess.run([sys.executable, "-c", _FORKED, *paths], capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": repo}, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    got = json.loads(cp.stdout)
    assert all(r["same"] for r in got.values()), got
    assert all(r["decoded_here"] == 0 for r in got.values()), got  # the child decoded them
    assert all(r["decoded_here_unhanded"] == 1 for r in got.values()), got
    assert all(r["meanwhile"] == [False] and r["on_symbols"] for r in got.values()), got  # run while the child reads
    assert sum(r["stubs"] for r in got.values()) >= 3  # the fixtures do hold stubs


def test_the_symbol_basis_made_ahead_is_the_one_judged(x86_stubs):
    """check has the reader hand it the kept symbols while its helper still reads (prejudge):
    the basis kept for them must be what judging them afresh gives, and the findings the same."""
    from audit.linkage.judging.scan import prejudge, scan_object, symbol_basis

    policy = load_policy(None)
    early, fresh = (read_elf(x86_stubs["env_mode"], policy.symbol_pattern) for _ in range(2))
    prejudge(policy, early.symbols)
    assert "basis" in early.symbols.memo and not fresh.symbols.memo
    assert scan_object(early, policy, ["x"], None) == scan_object(fresh, policy, ["x"], None)
    assert not early.symbols.memo and not fresh.symbols.memo  # taken by the scan, not kept
    prejudge(policy, early.symbols)
    assert symbol_basis(early.symbols, policy) == symbol_basis(list(fresh.symbols), policy)
    other = load_policy(None)  # another policy never takes a basis made for the first
    assert symbol_basis(early.symbols, other)[3] == [(other.rules[policy.rules.index(r)], n)
                                                     for r, n in symbol_basis(early.symbols, policy)[3]]

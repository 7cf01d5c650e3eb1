"""Findings name the right vendor code: CBLAS/LAPACKE and BLAS/LAPACK by their closed name lists
(a project's own cblas_matrixproduct is not CBLAS), source-file names (STT_FILE) never counted as
symbols, and device kernels attributed by their own markers first, then by the library that ships
them. Fixtures are built by gcc and nvcc in the test."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import DEVICE_SRC, run

from audit.errors import PolicyError
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy, to_toml
from audit.linkage.resolution.ldso import ResolveOptions


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def audit(path: Path, pol=None):
    (res,) = check_paths([str(path)], pol or policy(), ResolveOptions()).files
    return res


def build(tmp_path: Path, lib: str, sources: dict[str, str]) -> Path:
    """gcc -shared of C sources written under their own file names (which become STT_FILE)."""
    require_tool("gcc")
    files = []
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
        files.append(tmp_path / name)
    run("gcc", "-shared", "-fPIC", "-O1", "-o", tmp_path / lib, *files)
    return tmp_path / lib


def file_symbols(path: Path) -> set[str]:
    """STT_FILE names in .symtab, read with pyelftools (a second ELF reader)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as fh:
        tab = ELFFile(fh).get_section_by_name(".symtab")
        return {s.name for s in tab.iter_symbols() if s["st_info"]["type"] == "STT_FILE"}


def test_a_projects_own_cblas_prefixed_function_passes(tmp_path):
    # numpy's shape: its own cblas_matrixproduct, from a source file named like a CBLAS one
    lib = build(tmp_path, "libmultiarray.so", {
        "cblas_daxpy.c": "double cblas_matrixproduct(double a, double b) { return a * b; }\n",
        "lapacke_sbbcsd.c": "int fk_helper(int x) { return x + 1; }\n",
    })
    assert {"cblas_daxpy.c", "lapacke_sbbcsd.c"} <= file_symbols(lib)
    res = audit(lib)
    assert res.verdict == "pass", [f.message for f in res.findings]


def test_source_file_names_are_shown_but_never_counted(tmp_path):
    lib = build(tmp_path, "libcopied.so", {
        "cblas_dscal.c": "void cblas_dscal(int n, double a, double *x, int inc) { for (int i = 0; i < n; i++) x[i * inc] *= a; }\n",
        "lapacke_dgesv.c": "int LAPACKE_dgesv(void) { return 0; }\n",
    })
    (hit,) = [f for f in audit(lib).findings if f.rule == "blas.cblas"]
    assert hit.kind == "static-symbol" and hit.count == 2
    assert {hit.subject, *hit.examples} == {"cblas_dscal", "LAPACKE_dgesv"}
    assert "cblas_dscal.c" in hit.detail and "not counted" in hit.detail


@pytest.mark.parametrize("name, rule", [
    ("cblas_dgemm", "blas.cblas"), ("cblas_zdotc_sub", "blas.cblas"), ("cblas_saxpby", "blas.cblas"),
    ("LAPACKE_dgesv", "blas.cblas"), ("LAPACKE_dgesv_work", "blas.cblas"), ("scipy_cblas_dgemm64_", "blas.cblas"),
    ("dgemm_", "blas.reference"), ("dgetrf_", "blas.reference"), ("zheevr_", "blas.reference"),
    ("dgemm_64_", "blas.reference"), ("scipy_dsyevd_", "blas.reference"),
])
def test_listed_names_match_with_the_policys_affixes(name, rule):
    hit = policy().rule_for_symbol(name)
    assert hit is not None and hit.id == rule
    assert policy().classify_symbols([name, "unrelated"])[name].id == rule
    assert policy().symbol_pattern.search(name.encode())  # the reader's bulk filter keeps it


@pytest.mark.parametrize("name", ["cblas_matrixproduct", "cblas_daxpy.c", "lapacke_c_nancheck.c", "cblas_xerbla",
                                  "xerbla_", "second_", "dgemm", "cblas_dgemm_helper", "LAPACKE_mine"])
def test_names_outside_the_lists_match_no_rule(name):
    assert policy().rule_for_symbol(name) is None
    assert name not in policy().classify_symbols([name])


def test_a_policy_can_ship_its_own_list(tmp_path):
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists/acme.names").write_text("# the ACME BLAS\nacme_gemm\nacme_axpy  # comment\n\n")
    path = tmp_path / "p.toml"
    path.write_text('[[rules]]\nid = "acme.blas"\nreason = "vendor"\nsymbol-lists = ["lists/acme.names", "cblas"]\n')
    pol = load_policy(path)
    assert pol.rule_for_symbol("acme_axpy").id == "acme.blas" and pol.rule_for_symbol("cblas_dgemm").id == "acme.blas"
    assert pol.rule_for_symbol("acme_gemv") is None
    shown = tmp_path / "elsewhere" / "shown.toml"  # the effective policy loads back from anywhere
    shown.parent.mkdir()
    shown.write_text(to_toml(pol))
    again = load_policy(shown)
    assert again.rules[0].names == pol.rules[0].names and again.rules[0].symbol_lists == pol.rules[0].symbol_lists


@pytest.mark.parametrize("ref, text, words", [
    ("nosuch", None, ["no shipped symbol list named 'nosuch'", "cblas"]),
    ("x.names", "good_name\nbad name\n", ["x.names line 2", "not a symbol name"]),
    ("missing.names", None, ["cannot read"]),
])
def test_bad_symbol_lists_are_policy_errors(tmp_path, ref, text, words):
    if text is not None:
        (tmp_path / ref).write_text(text)
    path = tmp_path / "p.toml"
    path.write_text(f'[[rules]]\nid = "a.b"\nreason = "r"\nsymbol-lists = ["{ref}"]\n')
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    assert str(path) in exc.value.message and "symbol-lists[0]" in exc.value.message
    assert all(w in exc.value.message for w in words), exc.value.message


@pytest.fixture(scope="session")
def xmma_libs(fixture_root) -> dict[str, Path]:
    """One nvcc compile (sm_90), linked twice: under a plain name, and as a cuDNN library."""
    nvcc = require_tool("nvcc")
    d = Path(fixture_root) / "linkage-xmma"
    d.mkdir(exist_ok=True)
    obj = d / "xmma_named.o"
    run(nvcc, "-arch=sm_90", "-Xcompiler", "-fPIC", "-c", "-o", obj, DEVICE_SRC / "xmma_named.cu")
    plain, cudnn = d / "libxmma_named.so", d / "libcudnn_engines_fixture.so.9"
    run(nvcc, "-arch=sm_90", "-shared", "-o", plain, obj)
    run(nvcc, "-arch=sm_90", "-shared", "-o", cudnn, obj, "-Xlinker", "-soname=libcudnn_engines_fixture.so.9")
    return {"plain": plain, "cudnn": cudnn}


def kernels_by_rule(res) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in res.findings:
        if f.kind == "device-kernel":
            out.setdefault(f.rule, set()).update(n for m in f.matches for n in m.names)
    return out


def test_kernels_go_to_their_own_marker_first_then_to_the_library_that_ships_them(xmma_libs):
    marked = ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage3_warpsize2x2x1"
              "_g1_tensor16x8x16_execute_kernel__5x_cudnn")
    unmarked = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel"
    # in a file that is not a vendor library: the marker says cuDNN; the unmarked family is cuBLAS's
    dot = "_Z10dot_kernelI15cublasDotParamsEvT_"  # a cuBLAS type in its template arguments
    plain = kernels_by_rule(audit(xmma_libs["plain"]))
    assert marked in plain["nvidia.cudnn"] and {unmarked, dot} <= plain["nvidia.cublas"]
    assert any(k.startswith("_ZN7cutlass") for k in plain["nvidia.cutlass"])
    # inside a cuDNN library: both xmma kernels are cuDNN's; the cutlass namespace still names CUTLASS
    res = audit(xmma_libs["cudnn"])
    assert ("nvidia.cudnn", "soname") in {(f.rule, f.kind) for f in res.findings}
    shipped = kernels_by_rule(res)
    assert {marked, unmarked} <= shipped["nvidia.cudnn"] and shipped["nvidia.cublas"] == {dot}
    assert any(k.startswith("_ZN7cutlass") for k in shipped["nvidia.cutlass"])


def test_a_kernel_marked_for_two_libraries_goes_to_the_one_that_ships_it():
    # libcublas.so.12's reduce kernels carry cuBLAS and cuBLASLt types in their template arguments
    name = ("_Z20reduce_1Block_kernelI7double2Li64ELi6E30cublasGemvTensorStridedBatchedIS0_ES2_S2_EvPKT_S3_T2_iS5_S3_"
            "T3_T4_19cublasPointerMode_t18cublasLtEpilogue_t")
    pol = policy()
    assert pol.rule_for_kernel(name).id == "nvidia.cublaslt"  # first marker in policy order
    assert pol.rule_for_kernel(name, pol.rule("nvidia.cublas")).id == "nvidia.cublas"
    assert pol.rule_for_kernel(name, pol.rule("nvidia.cudnn")).id == "nvidia.cublaslt"  # not its marker

"""Parity and bench through `--lib` and `--target`: real shared objects built by gcc.

The fixture library is a plain C implementation of the flash_kernel C ABI (fp32 only, head dims
64 and 128), with variants: a wrong ABI version, and one that never writes the last query row of
each head (poisoned outputs must catch it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool

torch = pytest.importorskip("torch")

from audit.cli import main  # noqa: E402

FIXTURE_C = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "flash_kernel.h"
#ifndef FIXTURE_ABI
#define FIXTURE_ABI FK_ABI_VERSION
#endif
static __thread const char *last = "";
int32_t fk_abi_version(void) { return FIXTURE_ABI; }
const char *fk_target(void) { return "cpu"; }
const char *fk_flash_path(void) { return "cpu"; }
const char *fk_last_error(void) { return last; }
int32_t fk_supported_head_dims(int32_t *dims, int32_t cap) {
    static const int32_t d[2] = {64, 128};
    for (int i = 0; dims && i < 2 && i < cap; i++) dims[i] = d[i];
    return 2;
}
static int32_t run(const fk_attention_args *in) {
    if (!in || !in->q || !in->k || !in->v || !in->o) { last = "null"; return FK_ERR_NULL_POINTER; }
    fk_attention_args copy = *in;
    const fk_attention_args *a = &copy;
#ifdef IGNORE_STRIDES  /* a bug: assumes contiguous (B,H,N,D) whatever the strides say */
    copy.q_stride[2] = copy.o_stride[2] = copy.k_stride[2] = copy.v_stride[2] = in->head_dim;
    copy.q_stride[1] = copy.o_stride[1] = in->nq * in->head_dim;
    copy.k_stride[1] = copy.v_stride[1] = in->nk * in->head_dim;
    copy.q_stride[0] = copy.o_stride[0] = in->heads * in->nq * in->head_dim;
    copy.k_stride[0] = copy.v_stride[0] = in->heads * in->nk * in->head_dim;
#endif
    if (a->abi_version != FK_ABI_VERSION) { last = "abi"; return FK_ERR_ABI; }
    if (a->dtype != FK_DTYPE_F32) { last = "fixture is fp32 only"; return FK_ERR_DTYPE; }
    if (a->head_dim != 64 && a->head_dim != 128) { last = "head dim"; return FK_ERR_HEAD_DIM; }
    const float *q = a->q, *k = a->k, *v = a->v; float *o = a->o;
    int64_t D = a->head_dim;
    float sc = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D);
    double *s = malloc(sizeof(double) * a->nk);
    if (!s) { last = "no memory"; return FK_ERR_NO_MEMORY; }
    for (int64_t b = 0; b < a->batch; b++)
    for (int64_t h = 0; h < a->heads; h++)
    for (int64_t i = 0; i < a->nq; i++) {
#ifdef SKIP_LAST_ROW
        if (i == a->nq - 1) continue;
#endif
        const float *qi = q + b * a->q_stride[0] + h * a->q_stride[1] + i * a->q_stride[2];
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < a->nk; j++) {
            const float *kj = k + b * a->k_stride[0] + h * a->k_stride[1] + j * a->k_stride[2];
            double acc = 0;
            for (int64_t d = 0; d < D; d++) acc += (double)qi[d] * kj[d];
            s[j] = acc * sc;
            if (s[j] > m) m = s[j];
        }
        for (int64_t j = 0; j < a->nk; j++) { s[j] = exp(s[j] - m); l += s[j]; }
        float *oi = o + b * a->o_stride[0] + h * a->o_stride[1] + i * a->o_stride[2];
        for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int64_t j = 0; j < a->nk; j++)
                acc += s[j] * v[b * a->v_stride[0] + h * a->v_stride[1] + j * a->v_stride[2] + d];
            oi[d] = (float)(acc / l);
        }
    }
    free(s);
    return FK_OK;
}
int32_t fk_flash_forward(const fk_attention_args *a) { return run(a); }
int32_t fk_naive_forward(const fk_attention_args *a) { return run(a); }
"""

INCLUDE = Path(__file__).resolve().parent.parent / "flash_kernel" / "include"


def _build(root: Path, name: str, *defines: str) -> Path:
    gcc = require_tool("gcc")
    src = root / "fixture_abi.c"
    src.write_text(FIXTURE_C)
    out = root / name / "libflash_kernel.so"
    out.parent.mkdir(exist_ok=True)
    if not out.exists():
        subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-I", str(INCLUDE), *defines, str(src),
                        "-o", str(out), "-lm"], check=True)
    return out


@pytest.fixture(scope="module")
def libs(fixture_root):
    pytest.importorskip("flash_kernel")
    return {"good": _build(fixture_root, "abi-good"),
            "abi1": _build(fixture_root, "abi-one", "-DFIXTURE_ABI=1"),  # the ABI before the log-sum-exp
            "skip": _build(fixture_root, "abi-skip", "-DSKIP_LAST_ROW"),
            "nostride": _build(fixture_root, "abi-nostride", "-DIGNORE_STRIDES")}


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_lib_parity_passes_and_records_the_library(libs, tmp_path, capsys):
    js = tmp_path / "parity.json"
    code, out, err = run_cli(["parity", "--lib", str(libs["good"]), "--preset", "tiny-64",
                              "--preset", "tiny-cross", "--json", str(js)], capsys)
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["schema"] == "sovereign-audit.parity/1" and data["passed"]
    assert data["selection"]["library"]["abi_version"] == 3
    assert data["selection"]["library"]["head_dims"] == [64, 128]
    assert [s["shape"]["name"] for s in data["shapes"]] == ["tiny-64", "tiny-cross"]
    for s in data["shapes"]:
        assert s["poisoned"] and s["oracle_poisoned"]  # our NaN-filled outputs, fully written
        assert s["candidate_vs_reference"]["nan"] == 0
        assert s["candidate_vs_reference"]["rel_l2"] < 1e-6


def test_unwritten_elements_fail_the_nonfinite_gate(libs, capsys):
    code, out, err = run_cli(["parity", "--lib", str(libs["skip"]), "--preset", "tiny-64"], capsys)
    assert code == 1
    assert "tiny-64 (2,3,257,64)" in err and "nonfinite" in err
    # one unwritten row of 64 per (batch, head): 2 * 3 * 64 NaNs
    assert "= 384 NaN/Inf" in out


def test_wrong_abi_version_is_a_usage_error(libs, capsys):
    code, out, err = run_cli(["parity", "--lib", str(libs["abi1"]), "--preset", "tiny-64"], capsys)
    assert code == 2
    assert err.startswith("error:") and "ABI" in err and len(err.strip().splitlines()) == 1


def test_head_dim_the_library_lacks_is_a_usage_error(libs, capsys):
    code, out, err = run_cli(["parity", "--lib", str(libs["good"]), "--shape", "1,2,50,32"], capsys)
    assert code == 2 and "head dim 32" in err


def test_library_path_that_is_not_a_library(tmp_path, capsys):
    pytest.importorskip("flash_kernel")
    bogus = tmp_path / "libnot.so"
    bogus.write_text("not an ELF file")
    code, out, err = run_cli(["parity", "--lib", str(bogus), "--preset", "tiny-64"], capsys)
    assert code in (2, 3) and err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_lib_bench_times_flash_and_naive(libs, tmp_path, capsys):
    js = tmp_path / "bench.json"
    code, out, err = run_cli(["bench", "--lib", str(libs["good"]), "--preset", "tiny-cross",
                              "--repeats", "3", "--warmup", "1", "--backend", "primary",
                              "--backend", "naive", "--json", str(js)], capsys)
    assert code == 0, err
    shape = json.loads(js.read_text())["shapes"][0]
    names = {b["name"]: b for b in shape["backends"]}
    assert names["flash"]["status"] == "ok" and names["naive"]["status"] == "ok"
    assert len(names["flash"]["timing"]["samples"]) == 3
    assert [(s["subject"], s["baseline"]) for s in shape["speedups"]] == [("flash", "naive")]


def _cpu_target_or_skip():
    """Our real CPU library, built by the builder; skipped only where g++ is missing (with g++
    here, a build that fails is a test failure, not a skip)."""
    pytest.importorskip("flash_kernel")
    from audit.evidence.selection import ensure_target_library

    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH: the cpu target cannot be built (make test installs it)")
    return ensure_target_library("cpu")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_target_cpu_parity(dtype, tmp_path, capsys):
    _cpu_target_or_skip()
    js = tmp_path / "p.json"
    code, out, err = run_cli(["parity", "--target", "cpu", "--dtype", dtype, "--preset", "tiny-128",
                              "--preset", "tiny-64", "--preset", "tiny-cross", "--json", str(js)],
                             capsys)
    assert code == 0, out + err
    data = json.loads(js.read_text())
    assert data["selection"]["library"]["target"] == "cpu"
    assert len(data["shapes"]) == 3 and all(s["poisoned"] for s in data["shapes"])


def test_target_cpu_rejects_a_head_dim_it_lacks(capsys):
    _cpu_target_or_skip()
    from audit.evidence.selection import load_library, library_path

    dims = load_library(library_path("cpu")).head_dims
    missing = next(d for d in range(8, 512, 8) if d not in dims)
    code, out, err = run_cli(["parity", "--target", "cpu", "--shape", f"1,1,10,{missing}"], capsys)
    assert code == 2 and f"head dim {missing}" in err


def test_bnhd_layout_catches_a_library_that_ignores_strides(libs, tmp_path, capsys):
    args = ["parity", "--lib", str(libs["nostride"]), "--preset", "tiny-64"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err  # contiguous (B,H,N,D): the bug is invisible
    js = tmp_path / "p.json"
    code, out, err = run_cli([*args, "--layout", "bnhd", "--json", str(js)], capsys)
    assert code == 1 and "tiny-64" in err
    data = json.loads(js.read_text())
    assert data["layout"] == "bnhd"
    code, out, err = run_cli(["parity", "--lib", str(libs["good"]), "--preset", "tiny-64",
                              "--layout", "bnhd"], capsys)
    assert code == 0, err

"""CPU parity over small shapes, metric definitions, and wrong candidates that must fail their
gates (a gate that cannot fail proves nothing)."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from audit.cli import main  # noqa: E402
from audit.errors import UsageError  # noqa: E402
from audit.evidence import metrics as M  # noqa: E402
from audit.evidence.parity import (effective_gates, parse_gate_overrides, run_parity)  # noqa: E402
from audit.evidence.presets import Shape, resolve_shapes  # noqa: E402
from audit.evidence.selection import Backend, Selection  # noqa: E402

CANDIDATES = '''
import torch, torch.nn.functional as F
def good(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
def scaled(q, k, v, scale=None):
    return 1.01 * F.scaled_dot_product_attention(q, k, v, scale=scale)
def one_nan(q, k, v, scale=None):
    o = F.scaled_dot_product_attention(q, k, v, scale=scale)
    o.view(-1)[o.numel() // 2] = float("nan")
    return o
def ignores_scale(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q, k, v)
def wrong_shape(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)[:, :, :-1]
def raises(q, k, v, scale=None):
    raise RuntimeError("kernel exploded")
def fp32_out(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
'''


@pytest.fixture(scope="module")
def cands(tmp_path_factory):
    p = tmp_path_factory.mktemp("cands") / "cands.py"
    p.write_text(CANDIDATES)
    return p


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _torch_sel(fn, name="candidate") -> Selection:
    """A selection whose oracle is torch eager (no library needed): unit tests of parity itself."""
    eager = Backend("eager", lambda q, k, v, scale=None: M.eager_attention(q, k, v, scale),
                    sovereign=False)
    return Selection("candidate", name, "cpu", Backend("candidate", fn, False), eager, "eager")


# ---- metrics ----------------------------------------------------------------------------------

def test_metrics_of_a_uniform_scale_error():
    b = torch.randn(1000, dtype=torch.float64)
    m = M.compare(b * 1.01, b)
    assert m.rel_l2 == pytest.approx(0.01, rel=1e-9)
    assert m.cosine == pytest.approx(1.0, abs=1e-12)  # cosine is blind to it: why rel_l2 is gated
    assert m.max_abs == pytest.approx(0.01 * float(b.abs().max()), rel=1e-9)
    assert m.nan == m.inf == 0


def test_metrics_count_nonfinite_and_stay_finite():
    b = torch.ones(10)
    a = b.clone()
    a[2], a[5], a[7] = float("nan"), float("inf"), float("-inf")
    m = M.compare(a, b)
    assert (m.nan, m.inf) == (1, 2)
    assert m.rel_l2 == pytest.approx(math.sqrt(3 / 10))  # non-finite taken as 0: an error of 1 each
    assert math.isfinite(m.cosine)


def test_metrics_orthogonal_and_chunked():
    a = torch.tensor([1.0, 0.0, 2.0, 0.0])
    b = torch.tensor([0.0, 3.0, 0.0, 4.0])
    m = M.compare(a, b, chunk=1)
    assert m.cosine == pytest.approx(0.0) and m.rel_l2 == pytest.approx(math.sqrt(30) / 5)
    x, y = torch.randn(10_001), torch.randn(10_001)
    one, many = M.compare(x, y), M.compare(x, y, chunk=777)
    assert one.cosine == pytest.approx(many.cosine, rel=1e-12)
    assert one.rel_l2 == pytest.approx(many.rel_l2, rel=1e-12)
    assert one.max_abs == many.max_abs


def test_cosine_is_printed_with_its_digits():
    assert "0.99999500" in M.fmt_cosine(0.999995) and "5.0e-06" in M.fmt_cosine(0.999995)
    assert not M.fmt_cosine(0.999995).startswith("1.0")


def test_float64_reference_matches_torch_math_in_float64_and_chunks_exactly():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g, dtype=torch.float64) for n in (70, 130, 130))
    expect = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    got = M.reference_head(q[0, 1], k[0, 1], v[0, 1], 0.3, budget=130 * 16 * 7)  # 7-row chunks
    assert torch.allclose(got, expect[0, 1], rtol=1e-12, atol=1e-14)


def test_eager_attention_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, n, 32, generator=g) for n in (50, 90, 90))
    whole = M.eager_attention(q, k, v, budget=1 << 30)
    rows = M.eager_attention(q, k, v, budget=90 * 12 * 5)  # one head, 5 rows at a time
    assert torch.allclose(whole, rows, rtol=0, atol=1e-6)  # BLAS blocking may differ per chunk
    assert torch.allclose(whole, F.scaled_dot_product_attention(q, k, v), atol=1e-5)


# ---- gates ------------------------------------------------------------------------------------

def test_gate_precedence_defaults_config_cli():
    assert effective_gates("bf16").rel_l2 == 1e-2 and effective_gates("fp16").rel_l2 == 2e-3
    g = effective_gates("fp32").to_dict()
    assert g == {"rel_l2": 1e-4, "cosine": 0.99999, "nonfinite": 0}
    cfg = {"parity": {"gates": {"rel_l2": 5e-4, "bf16": {"rel_l2": 3e-2}}}}
    assert effective_gates("fp32", cfg).rel_l2 == 5e-4
    assert effective_gates("bf16", cfg).rel_l2 == 3e-2
    assert effective_gates("bf16", cfg, parse_gate_overrides(["rel_l2=0.5"])).rel_l2 == 0.5
    with pytest.raises(UsageError):
        effective_gates("fp32", {"parity": {"gates": {"nope": 1}}})


# ---- parity runs ------------------------------------------------------------------------------

def test_good_candidate_passes_all_small_shapes_and_records_seeds(cands, tmp_path, capsys):
    js = tmp_path / "p.json"
    code, out, err = run_cli(["parity", "--candidate", f"{cands}:good", "--device", "cpu",
                              "--seed", "7", "--json", str(js)], capsys)
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["schema"] == "sovereign-audit.parity/1" and data["passed"]
    assert [s["seed"] for s in data["shapes"]] == [7, 8, 9]
    assert [s["shape"]["name"] for s in data["shapes"]] == ["tiny-128", "tiny-64", "tiny-cross"]
    assert data["environment"]["schema"] == "sovereign-audit.environment/1"
    for s in data["shapes"]:
        assert s["candidate_vs_reference"]["rel_l2"] < 1e-5
        assert s["scale_probe"]["scale"] != pytest.approx(1 / math.sqrt(s["shape"]["head_dim"]))
        assert {g["name"] for g in s["gates"]} == {"rel_l2", "cosine", "nonfinite", "scale_rel_l2"}
    assert "1-cos" in out


def test_same_seed_same_inputs_different_seed_different():
    sel = _torch_sel(lambda q, k, v, scale=None: F.scaled_dot_product_attention(q, k, v, scale=scale))
    shapes = resolve_shapes([], ["tiny-64"])
    a = run_parity(sel, shapes, "fp32", seed=1, capture_environment=False).shapes[0]
    b = run_parity(sel, shapes, "fp32", seed=1, capture_environment=False).shapes[0]
    c = run_parity(sel, shapes, "fp32", seed=2, capture_environment=False).shapes[0]
    assert a.candidate_vs_reference.max_abs == b.candidate_vs_reference.max_abs
    assert a.candidate_vs_reference.max_abs != c.candidate_vs_reference.max_abs


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_low_precision_candidate_passes_its_dtype_gate(dtype, cands, capsys):
    code, out, err = run_cli(["parity", "--candidate", f"{cands}:good", "--device", "cpu",
                              "--dtype", dtype, "--preset", "tiny-64"], capsys)
    assert code == 0, out + err


@pytest.mark.parametrize("fn,gate", [
    ("scaled", "rel_l2"),          # a 1% uniform error: cosine alone would pass it
    ("one_nan", "nonfinite"),      # a single NaN fails and names the shape
    ("ignores_scale", "scale_rel_l2"),
    ("wrong_shape", "output"),
    ("raises", "output"),
    ("fp32_out", "output"),
])
def test_wrong_candidates_fail_their_gate(fn, gate, cands, tmp_path, capsys):
    js = tmp_path / "p.json"
    dtype = "bf16" if fn == "fp32_out" else "fp32"
    code, out, err = run_cli(["parity", "--candidate", f"{cands}:{fn}", "--device", "cpu",
                              "--dtype", dtype, "--preset", "tiny-64", "--json", str(js)], capsys)
    assert code == 1, out + err
    assert err.startswith("error: parity gate failed: shape tiny-64 (2,3,257,64):")
    assert f" {gate} " in err
    data = json.loads(js.read_text())
    assert not data["passed"]
    failed = [g["name"] for g in data["shapes"][0]["gates"] if not g["passed"]]
    assert gate in failed


def test_scaled_output_passes_cosine_but_fails_rel_l2(cands, tmp_path, capsys):
    js = tmp_path / "p.json"
    run_cli(["parity", "--candidate", f"{cands}:scaled", "--device", "cpu", "--preset", "tiny-128",
             "--json", str(js)], capsys)
    gates = {g["name"]: g for g in json.loads(js.read_text())["shapes"][0]["gates"]}
    assert gates["cosine"]["passed"] and not gates["rel_l2"]["passed"]
    assert gates["rel_l2"]["value"] == pytest.approx(0.01, rel=1e-3)


def test_loosened_gate_lets_the_scaled_candidate_pass(cands, capsys):
    code, out, err = run_cli(["parity", "--candidate", f"{cands}:scaled", "--device", "cpu",
                              "--preset", "tiny-64", "--gate", "rel_l2=0.02"], capsys)
    assert code == 0, err


def test_nan_only_in_a_later_shape_names_that_shape():
    calls = []

    def fn(q, k, v, scale=None):
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
        calls.append(q.shape)
        if q.shape[-1] == 64 and q.shape[0] == 2:
            o[1, 2, 3, 4] = float("nan")
        return o

    rep = run_parity(_torch_sel(fn), resolve_shapes([], ["tiny-128", "tiny-64"]), "fp32",
                     capture_environment=False)
    assert [s.status for s in rep.shapes] == ["passed", "failed"]
    assert rep.failure_lines()[0].startswith("shape tiny-64 (2,3,257,64): nonfinite = 1 NaN")


def test_cross_attention_shape_runs():
    sel = _torch_sel(lambda q, k, v, scale=None: F.scaled_dot_product_attention(q, k, v, scale=scale))
    rep = run_parity(sel, [Shape(1, 1, 5, 300, 64)], "fp32", capture_environment=False)
    assert rep.passed and rep.shapes[0].scale_probe["nq"] == 5


def test_oracle_that_fails_falls_back_to_eager_and_says_so():
    def boom(q, k, v, scale=None):
        raise MemoryError("no room for the score matrix")

    sel = Selection("candidate", "t", "cpu",
                    Backend("candidate", lambda q, k, v, scale=None:
                            F.scaled_dot_product_attention(q, k, v, scale=scale), False),
                    Backend("naive", boom, True), "test")
    rep = run_parity(sel, resolve_shapes([], ["tiny-64"]), "fp32", capture_environment=False)
    s = rep.shapes[0]
    assert rep.passed and "no room" in s.oracle_note and "fp32" in s.oracle
    assert s.candidate_vs_oracle is not None


def test_precise_eager_is_closer_to_float64_than_framework_eager_in_bf16():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    ref = {"fast": M.eager_attention(q, k, v), "precise": M.eager_attention(q, k, v, precise=True)}
    m = M.reference_compare(q, k, v, ref)
    assert m["precise"].rel_l2 < m["fast"].rel_l2
    assert ref["precise"].dtype == torch.bfloat16


def test_public_path_that_differs_from_the_raw_call_fails():
    def right_into(q, k, v, out, scale=None):
        out.copy_(F.scaled_dot_product_attention(q, k, v, scale=scale))

    def public(q, k, v, scale=None):  # what bench would time: a different computation
        return 1.5 * F.scaled_dot_product_attention(q, k, v, scale=scale)

    eager = Backend("eager", lambda q, k, v, scale=None: M.eager_attention(q, k, v, scale), False)
    sel = Selection("lib", "t", "cpu", Backend("flash", public, True, writer=right_into), eager, "")
    rep = run_parity(sel, resolve_shapes([], ["tiny-64"]), "fp32", capture_environment=False)
    s = rep.shapes[0]
    assert s.poisoned
    assert [g.name for g in s.failures] == ["public_path"]


def test_a_shape_whose_inputs_do_not_fit_fails_its_gate_and_the_next_shape_still_runs(cands, capsys):
    """~256 PB of inputs: torch's CPU allocator refuses at once. The shape fails closed (parity not
    shown) with the reason in one line, exit 1, and the shape after it is still checked."""
    code, out, err = run_cli(["parity", "--device", "cpu", "--candidate", f"{cands}:good",
                              "--shape", "99999,99999,99999,64", "--shape", "1,2,33,64"], capsys)
    assert code == 1, err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "(99999,99999,99999,64)" in line[0] and "inputs do not fit in memory" in line[0]
    assert "Traceback" not in out + err and "1/2 shapes" in out

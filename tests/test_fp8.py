"""The FP8 attention reference (flash_kernel.fp8) against float64 exact attention: fresh random
inputs every run (the seed is in each failure message) and DiT-shaped inputs (a constant offset
per K channel, query rows 10x the rest) held to the fp8 gates; the tiled softmax itself exact when
nothing is quantized; the quantization steps' properties (scales, e4m3 saturation at 448, INT8
range, the FP22 accumulator's truncation, no NaN from constant blocks); the public
precision="fp8" call (dtypes, layouts, lse) and its refusals. No input here is zero."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

import flash_kernel  # noqa: E402
from audit.evidence.precision import FP8_DIT_GATES, FP8_GATES  # noqa: E402
from flash_kernel import fp8  # noqa: E402

SEED = int.from_bytes(os.urandom(4), "little")  # fresh inputs each run


def gen(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + offset)


def exact(q, k, v, scale=None):
    q, k, v = (t.double() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def errors(out, ref):
    o, r = out.double().flatten(), ref.flatten()
    return (torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            ((o - r).norm() / r.norm()).item())


def normal(shape, g, dtype=torch.bfloat16):
    return torch.randn(shape, generator=g).to(dtype)


# ---- accuracy against float64 ------------------------------------------------------------------

@pytest.mark.parametrize("d,nk", [(64, 1000), (128, 2048), (256, 700)])
def test_random_inputs_pass_the_fp8_gates(d, nk):
    g = gen(d)
    q, k, v = normal((1, 2, 200, d), g), normal((1, 2, nk, d), g), normal((1, 2, nk, d), g)
    cos, rel = errors(fp8.reference(q, k, v), exact(q, k, v)[0])
    assert cos >= FP8_GATES.cosine and rel <= FP8_GATES.rel_l2, (SEED, cos, rel)
    assert rel > 1e-3, "FP8 rounding leaves a visible error: the quantization is not skipped"


@pytest.mark.parametrize("d", [64, 128])
def test_dit_shaped_inputs_pass_the_dit_gates_and_need_k_smoothing(d):
    q, k, v = fp8.dit_shaped_inputs(1, 2, 192, 1536, d, gen(7 + d))
    assert (k.float().mean(dim=-2).abs() > 1.0).float().mean() > 0.5  # the offset is there
    ref = exact(q, k, v)[0]
    cos, rel = errors(fp8.reference(q, k, v), ref)
    assert cos >= FP8_DIT_GATES.cosine and rel <= FP8_DIT_GATES.rel_l2, (SEED, cos, rel)
    # what the choice rests on: e4m3 Q K^T without smoothing fails the same gates on these inputs
    cos8, rel8 = errors(fp8.reference(q, k, v, scheme=fp8.SCHEMES["e4m3"]), ref)
    assert cos8 < FP8_DIT_GATES.cosine and rel8 > FP8_DIT_GATES.rel_l2, (SEED, cos8, rel8)


def test_an_explicit_scale_is_used():
    g = gen(3)
    q, k, v = normal((1, 1, 130, 64), g), normal((1, 1, 300, 64), g), normal((1, 1, 300, 64), g)
    sharp = 3.0 / 8.0
    cos, rel = errors(fp8.reference(q, k, v, scale=sharp), exact(q, k, v, sharp)[0])
    assert cos >= FP8_GATES.cosine and rel <= FP8_GATES.rel_l2, (SEED, cos, rel)
    assert errors(fp8.reference(q, k, v), exact(q, k, v, sharp)[0])[1] > 0.1


def test_unquantized_tiling_meets_the_exact_fp32_gate():
    # the same tiled online softmax with no rounding: what is left is float32 arithmetic
    from audit.evidence.parity import DEFAULT_REL_L2

    g = gen(11)
    q, k, v = (normal((1, 2, n, 96), g, torch.float32) for n in (150, 333, 333))
    out, lse = fp8.reference(q, k, v, scheme=fp8.SCHEMES["unquantized"], return_lse=True)
    ref, ref_lse = exact(q, k, v)
    assert errors(out, ref)[1] <= DEFAULT_REL_L2["fp32"], SEED
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5)


def test_the_lse_is_of_the_true_scores_not_the_smoothed_ones():
    # smoothing moves every score of a row by scale * q . mean(K): the output does not see it, the
    # lse (what ring attention merges partial outputs by) must add it back
    q, k, v = fp8.dit_shaped_inputs(1, 2, 128, 700, 128, gen(29))
    _, lse = fp8.reference(q, k, v, return_lse=True)
    ref = exact(q, k, v)[1]
    assert (lse.double() - ref).abs().max() < 1.0, SEED  # worst of 30 seeds 0.34; unshifted: ~5-50


def test_the_fp22_accumulator_model_changes_the_result_only_slightly():
    g = gen(13)
    q, k, v = (normal((1, 1, n, 128), g) for n in (64, 512, 512))
    s22 = fp8.SCHEMES["e4m3"]
    a = fp8.reference(q, k, v, scheme=s22)
    b = fp8.reference(q, k, v, scheme=replace(s22, accumulator="fp32"))
    diff = errors(a, b)[1]
    assert 0 < diff < 1e-2, (SEED, diff)


# ---- the quantization steps --------------------------------------------------------------------

def test_e4m3_saturates_at_448_and_never_makes_nan():
    x = torch.tensor([1e6, -1e6, 448.0, 449.0, 500.0, -460.0, 0.3, 1e-3])
    y = fp8.to_e4m3(x).float()
    assert y[:6].tolist() == [448.0, -448.0, 448.0, 448.0, 448.0, -448.0]
    assert not torch.isnan(y).any()
    assert y[6].item() == pytest.approx(0.3, rel=2 ** -4)


def test_block_scales_map_each_blocks_largest_value_to_the_format_maximum():
    g = gen(17)
    x = torch.randn(2, 3, 200, 64, generator=g) * torch.linspace(0.1, 50, 200).view(1, 1, 200, 1)
    for kind, top in (("e4m3", fp8.E4M3_MAX), ("int8", fp8.INT8_MAX)):
        vals, s = fp8.quantize_blocks(x, 64, kind)
        assert s.shape == (2, 3, 4) and (s > 0).all()
        vf = vals.float()
        for b in range(4):
            blk = vf[..., 64 * b:64 * (b + 1), :].abs().amax(dim=(-1, -2))
            assert torch.equal(blk, torch.full_like(blk, top)), (kind, b)
        back = vf * s.repeat_interleave(64, dim=-1)[..., :200].unsqueeze(-1)
        per_row = s.repeat_interleave(64, dim=-1)[..., :200].unsqueeze(-1)
        if kind == "int8":  # rounding to nearest: at most half a step off, plus the float32
            # roundings of x / s and of q * s (each within 2^-24 of the value, |q * s| <= 128 s)
            assert ((back - x).abs() <= per_row * 0.5 + x.abs() * 2 ** -22).all()
        else:  # 3 mantissa bits: relative error <= 2^-4 in the normal range
            normal_range = x.abs() >= per_row * 2 ** -6
            rel = ((back - x).abs() / x.abs())[normal_range]
            assert rel.max() <= 2 ** -4 + 1e-6


def test_int8_rounds_half_to_even_and_clamps_to_127():
    assert fp8.to_int8(torch.tensor([0.5, 1.5, 2.5, -0.5, 126.6, 300.0, -300.0])).tolist() == \
        [0, 2, 2, 0, 127, 127, -127]


def test_fp22_truncates_to_13_mantissa_bits():
    one = torch.tensor([1.0 + 2 ** -13, 1.0 + 2 ** -14 + 2 ** -20, -(1.0 + 2 ** -16)], dtype=torch.float32)
    assert fp8.fp22(one).tolist() == [1.0 + 2 ** -13, 1.0, -1.0]


def test_row_sums_in_the_tensor_core_weigh_v_by_weights_that_sum_to_one():
    """rowsum="mma" sums P as rounded to e4m3, in the same accumulator as P V: with every key's V
    the same, O / l is that V to float32 rounding. P summed unrounded (rowsum="fp32") is off by
    the e4m3 rounding of P."""
    g = gen(29)
    q, k = (normal((1, 2, n, 128), g) for n in (64, 700))
    v = torch.full((1, 2, 700, 128), 0.75)
    ideal = replace(fp8.CHOSEN, accumulator="fp32")
    mma = fp8.reference(q, k, v, scheme=replace(ideal, rowsum="mma"))
    summed = fp8.reference(q, k, v, scheme=replace(ideal, rowsum="fp32"))
    assert (mma - 0.75).abs().max() < 1e-6, SEED
    assert (summed - 0.75).abs().max() > 1e-4, SEED


def test_one_level_row_sums_in_the_accumulator_lose_as_o_does_and_cancel():
    """One level with V off zero mean: O's sums grow with Nk and the truncating accumulator model
    loses a share of them; l summed beside them (rowsum="mma") loses the same share, so O / l
    keeps close to two levels' error, where l summed in float32 does not."""
    g = gen(31)
    q, k = (normal((1, 1, n, 64), g) for n in (32, 16384))
    v = (torch.randn(1, 1, 16384, 64, generator=g) + 2.0 * torch.randn(1, 1, 1, 64, generator=g)).bfloat16()
    exact = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / 8.0, -1) @ v.double()
    one = replace(fp8.CHOSEN, two_level=False, one_level_above=None)
    err = {rs: errors(fp8.reference(q, k, v, scheme=replace(one, rowsum=rs)), exact)[1] for rs in ("fp32", "mma")}
    two = errors(fp8.reference(q, k, v, scheme=replace(fp8.CHOSEN, one_level_above=None)), exact)[1]
    assert err["mma"] < 2 * two < err["fp32"] / 2, (SEED, err, two)


def test_constant_blocks_get_a_unit_scale_and_no_nan():
    # every key the same (0.7 in every channel): smoothed K is all zero, its scale must not be 0
    q = torch.full((1, 1, 70, 64), 0.25).bfloat16()
    k = torch.full((1, 1, 300, 64), 0.7).bfloat16()
    v = (torch.arange(1, 301, dtype=torch.float32).view(1, 1, 300, 1) / 100 + torch.ones(1, 1, 1, 64)).bfloat16()
    _, s = fp8.quantize_blocks(k.float() - k.float().mean(dim=-2, keepdim=True), 128, "int8")
    assert torch.equal(s, torch.ones_like(s))
    for scheme in fp8.SCHEMES.values():
        out = fp8.reference(q, k, v, scheme=scheme)
        assert torch.isfinite(out).all(), scheme.name
        assert errors(out, exact(q, k, v)[0])[1] < 2e-2, scheme.name  # uniform weights: mean of V


def test_the_kv_tile_follows_the_hopper_kernel():
    assert [fp8.kv_tile(d) for d in (32, 64, 128, 136, 192, 200, 256)] == [128, 128, 128, 112, 112, 80, 80]


# ---- the public call ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_public_call_returns_the_input_dtype_and_the_reference_values(dtype):
    g = gen(19)
    q, k, v = (normal((2, 3, n, 64), g, dtype) for n in (90, 257, 257))
    out = flash_kernel.attention(q, k, v, precision="fp8")
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.equal(out, fp8.reference(q, k, v).to(dtype))


def test_bnhd_layout_and_lse_agree_with_bhnd():
    g = gen(23)
    q, k, v = (normal((1, n, 2, 64), g) for n in (100, 300, 300))  # (B, N, H, D)
    o1, lse1 = flash_kernel.attention(q, k, v, layout="bnhd", return_lse=True, precision="fp8")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    o2, lse2 = flash_kernel.attention(qt, kt, vt, return_lse=True, precision="fp8")
    assert o1.shape == q.shape and torch.equal(o1, o2.transpose(1, 2))
    assert lse1.shape == (1, 2, 100) and torch.equal(lse1, lse2)
    assert lse1.stride() == (200, 1, 2)  # dense in q's (B, N, H) order, as the exact path's
    assert (lse2.double() - exact(qt, kt, vt)[1]).abs().max() < 5e-2


def test_fp8_on_a_device_without_the_kernel_is_refused_never_run_exact():
    q = torch.ones(1, 1, 8, 64, device="meta")
    with pytest.raises(NotImplementedError) as exc:
        flash_kernel.attention(q, q, q, precision="fp8")
    assert isinstance(exc.value, fp8.Fp8Unavailable)
    assert "meta" in str(exc.value) and "sm_90" in str(exc.value) and "not in this build" in str(exc.value)


def test_fp8_on_cuda_needs_an_sm_90a_library_on_a_cc_9_0_device(monkeypatch):
    """CUDA tensors go to the library's FP8 kernel only where it has one: an sm_90a library on a
    cc 9.0 device; each other case is refused with its reason (torch.cuda stood in for)."""
    class StandIn:
        target = "sm_90"

    lib = StandIn()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(fp8.Fp8Unavailable, match=r"cuda:1: CUDA is not available"):
        fp8.check_device("cuda:1", lib)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cc = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc[0])
    with pytest.raises(fp8.Fp8Unavailable, match=r"sm_90a libraries only \(this one is sm_90\)"):
        fp8.check_device("cuda:0", lib)
    lib.target = "sm_90a"
    fp8.check_device("cuda:0", lib)  # the kernel's own case: no refusal
    cc[0] = (8, 0)
    with pytest.raises(fp8.Fp8Unavailable, match=r"needs a cc 9.0 device \(Hopper\), this one is cc 8.0"):
        fp8.check_device("cuda:0", lib)


def test_fp8_kernel_refusals_become_fp8_unavailable():
    """The library's refusals of a call it has no FP8 kernel for (a head dim past 128, a build
    without it) reach the caller as Fp8Unavailable, never as exact attention."""
    from flash_kernel import _binding

    class Refusing:
        target = "sm_90a"

        def fp8_attention(self, *args):
            raise _binding.KernelError("fk_flash_forward failed: FK_ERR_HEAD_DIM: head_dim 256 has no fp8 kernel",
                                       _binding.FK_ERR_HEAD_DIM)

    q = torch.ones(1, 1, 8, 256)
    with pytest.raises(fp8.Fp8Unavailable, match="head_dim 256 has no fp8 kernel"):
        fp8._kernel(q, q, q, None, "bhnd", False, Refusing())


def test_unknown_precision_and_bad_inputs_are_refused():
    q = torch.ones(1, 1, 8, 64)
    with pytest.raises(ValueError, match="precision must be one of 'exact', 'fp8'"):
        flash_kernel.attention(q, q, q, precision="fp4")
    with pytest.raises(TypeError, match="one dtype"):
        flash_kernel.attention(q, q.half(), q, precision="fp8")
    with pytest.raises(TypeError, match="one dtype"):
        flash_kernel.attention(q.double(), q.double(), q.double(), precision="fp8")
    with pytest.raises(ValueError, match="shapes do not match"):
        flash_kernel.attention(q, torch.ones(1, 1, 8, 32), q, precision="fp8")
    with pytest.raises(ValueError, match="layout"):
        flash_kernel.attention(q, q, q, layout="nhd", precision="fp8")
    for bad in (0, -0.5, float("nan"), True, "0.1"):  # the exact call refuses them too
        with pytest.raises(ValueError, match="scale must be positive and finite"):
            flash_kernel.attention(q, q, q, scale=bad, precision="fp8")

"""The attention swap of the DiT pipeline, checked before any of its timings is trusted:
with SDPA inside, the swapped self- and cross-attention processors are bit-identical
(torch.equal) to diffusers' stock WanAttnProcessor; what is not swapped is never touched; the
fp32 modules stay fp32."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402

from audit.evidence import dit_attention as da  # noqa: E402
from audit.evidence import pipeline as P  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return P.get_preset("tiny")


def _model(tiny, dtype=torch.float32, seed=0):
    model, casting = P.build_transformer(tiny, torch.device("cpu"), dtype, seed)
    return model, casting


def _forward(model, tiny, dtype, seed=0):
    inputs = P.make_inputs(tiny, torch.device("cpu"), dtype, seed)
    with torch.no_grad():
        return model(hidden_states=inputs.latents.to(dtype), timestep=torch.tensor([900]),
                     encoder_hidden_states=inputs.prompt, return_dict=False)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_swap_is_bit_exact_against_the_stock_processor(tiny, dtype):
    model, _ = _model(tiny, dtype)
    assert all(type(b.attn1.processor) is WanAttnProcessor for b in model.blocks)
    stock = _forward(model, tiny, dtype)
    procs = [da.SwappedSelfAttnProcessor(da.make_core("sdpa"), "sdpa") for _ in model.blocks]
    before = da.swap_self_attention(model, lambda i: procs[i])
    swapped = _forward(model, tiny, dtype)
    assert all(p.calls == 1 for p in procs)  # the swap really ran, once per block
    assert torch.equal(stock, swapped)
    da.restore_self_attention(model, before)
    assert [b.attn1.processor for b in model.blocks] == before
    assert torch.equal(_forward(model, tiny, dtype), stock)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_attention_swap_is_bit_exact_against_the_stock_processor(tiny, dtype):
    model, _ = _model(tiny, dtype)
    attn1 = [b.attn1.processor for b in model.blocks]
    stock = _forward(model, tiny, dtype)
    seen = []

    def core(q, k, v):
        seen.append((q.shape, k.shape))
        return da.make_core("sdpa")(q, k, v)

    before = da.swap_attention(model, "cross", lambda i: da.SwappedCrossAttnProcessor(core, "sdpa"))
    assert all(b.attn1.processor is p for b, p in zip(model.blocks, attn1))  # attn1 untouched
    swapped = _forward(model, tiny, dtype)
    assert len(seen) == len(model.blocks)
    assert all(qs[1] == 75 and ks[1] == 512 for qs, ks in seen)  # (B, N, H, D): Nq video, Nk text tokens
    assert torch.equal(stock, swapped)
    da.restore_attention(model, "cross", before)
    assert all(type(b.attn2.processor) is WanAttnProcessor for b in model.blocks)


def test_runtime_swap_check_covers_self_and_cross(tiny):
    model, _ = _model(tiny)
    inputs = P.make_inputs(tiny, torch.device("cpu"), torch.float32, 0)
    check = P.verify_swap(model, inputs, torch.float32, ("self", "cross"))
    assert check["bit_exact"] is True and check["swapped"] == ["self", "cross"]
    assert all(type(b.attn1.processor) is WanAttnProcessor and type(b.attn2.processor) is WanAttnProcessor
               for b in model.blocks)  # restored


def test_cross_processor_refuses_self_attention_and_image_context(tiny):
    model, _ = _model(tiny)
    proc = da.SwappedCrossAttnProcessor(da.make_core("sdpa"), "sdpa")
    attn1 = model.blocks[0].attn1
    with pytest.raises(RuntimeError, match="cross-attention"):
        proc(attn1, torch.randn(1, 5, attn1.inner_dim))


@pytest.mark.parametrize("spec, want", [("self", ("self",)), ("cross", ("cross",)), ("cross,self", ("self", "cross")),
                                        (" self , cross ", ("self", "cross")), (["cross"], ("cross",))])
def test_parse_swap(spec, want):
    assert da.parse_swap(spec) == want


@pytest.mark.parametrize("spec, needle", [("", "needs self, cross or both"), ("self,self", "an entry twice"),
                                          ("attn1", "unknown --swap entry 'attn1'")])
def test_parse_swap_refuses(spec, needle):
    from audit.errors import UsageError

    with pytest.raises(UsageError, match=needle):
        da.parse_swap(spec)


def test_core_timer_tags_each_call_with_its_kind(tiny):
    model, _ = _model(tiny)
    timer = da.CoreTimer()
    core = da.make_core("sdpa")
    da.swap_attention(model, "self", lambda i: da.SwappedSelfAttnProcessor(core, "sdpa", timer))
    da.swap_attention(model, "cross", lambda i: da.SwappedCrossAttnProcessor(core, "sdpa", timer))
    inputs = P.make_inputs(tiny, torch.device("cpu"), torch.float32, 0)
    with torch.no_grad():
        step = P.instrumented_step(model, timer, inputs, 2, 5.0, torch.float32, torch.device("cpu"))
    n = len(model.blocks) * 2  # cond + uncond pass
    assert step.attention_calls == 2 * n
    assert {k: len(v) for k, v in step.attention_ms_by_kind.items()} == {"self": n, "cross": n}


def test_a_different_core_is_not_bit_exact(tiny):
    # The bit-exact check can fail: a core 1e-3 off is caught.
    model, _ = _model(tiny)
    stock = _forward(model, tiny, torch.float32)
    da.swap_self_attention(model, lambda i: da.SwappedSelfAttnProcessor(
        lambda q, k, v: da.make_core("sdpa")(q, k, v) * (1 + 1e-3), "scaled"))
    assert not torch.equal(stock, _forward(model, tiny, torch.float32))


def test_runtime_swap_check_reports_bit_exact(tiny):
    model, _ = _model(tiny)
    inputs = P.make_inputs(tiny, torch.device("cpu"), torch.float32, 0)
    check = P.verify_swap(model, inputs, torch.float32)
    assert check["bit_exact"] is True and check["max_abs_diff"] == 0.0


def test_only_attn1_is_swapped(tiny):
    model, _ = _model(tiny)
    attn2 = [b.attn2.processor for b in model.blocks]
    da.swap_self_attention(model, lambda i: da.SwappedSelfAttnProcessor(da.make_core("sdpa"), "sdpa"))
    assert all(isinstance(b.attn1.processor, da.SwappedSelfAttnProcessor) for b in model.blocks)
    assert all(b.attn2.processor is p for b, p in zip(model.blocks, attn2))
    assert all(type(b.attn2.processor) is WanAttnProcessor for b in model.blocks)


def test_swapped_processor_refuses_cross_attention(tiny):
    model, _ = _model(tiny)
    proc = da.SwappedSelfAttnProcessor(da.make_core("sdpa"), "sdpa")
    attn2 = model.blocks[0].attn2
    x = torch.randn(1, 5, attn2.inner_dim)
    with pytest.raises(RuntimeError, match="self-attention"):
        proc(attn2, x, encoder_hidden_states=torch.randn(1, 7, attn2.inner_dim))


def test_fp32_modules_stay_fp32_and_the_rest_is_cast(tiny):
    model, casting = _model(tiny, torch.bfloat16)
    keep = type(model)._keep_in_fp32_modules
    assert set(casting["kept_fp32_modules"]) == set(keep)
    names = dict(model.named_parameters())
    assert names["condition_embedder.time_embedder.linear_1.weight"].dtype == torch.float32
    assert names["scale_shift_table"].dtype == torch.float32
    assert names["blocks.0.scale_shift_table"].dtype == torch.float32
    assert names["blocks.0.norm2.weight"].dtype == torch.float32
    assert names["blocks.0.attn1.to_q.weight"].dtype == torch.bfloat16
    assert names["blocks.0.ffn.net.2.weight"].dtype == torch.bfloat16
    assert names["proj_out.weight"].dtype == torch.bfloat16
    assert model.rope.freqs_cos.dtype != torch.bfloat16  # RoPE tables keep their precision
    # A blanket .to(bfloat16), what the helper avoids, does cast them:
    blanket, _ = _model(tiny)
    blanket.to(torch.bfloat16)
    assert blanket.condition_embedder.time_embedder.linear_1.weight.dtype == torch.bfloat16


def test_seeded_weights_are_reproducible(tiny):
    a, _ = _model(tiny, seed=3)
    b, _ = _model(tiny, seed=3)
    c, _ = _model(tiny, seed=4)
    wa, wb, wc = (m.blocks[0].attn1.to_q.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_perturbation_has_the_requested_relative_size():
    out = torch.randn(1, 75, 2, 128)
    pert = da.Perturbation(1e-3, seed=7)
    moved = pert.apply(out)
    rel = float(torch.linalg.vector_norm(moved - out) / torch.linalg.vector_norm(out))
    assert math.isclose(rel, 1e-3, rel_tol=1e-3)
    again = da.Perturbation(1e-3, seed=7).apply(out)
    assert torch.equal(moved, again)  # seeded


def test_core_timer_counts_every_call(tiny):
    model, _ = _model(tiny)
    timer = da.CoreTimer()
    da.swap_self_attention(model, lambda i: da.SwappedSelfAttnProcessor(da.make_core("sdpa"), "sdpa", timer))
    inputs = P.make_inputs(tiny, torch.device("cpu"), torch.float32, 0)
    with torch.no_grad():
        step = P.instrumented_step(model, timer, inputs, 2, 5.0, torch.float32, torch.device("cpu"))
    assert step.attention_calls == 2 * len(model.blocks)  # cond + uncond pass
    assert 0 < step.attention_ms_total < step.step_ms
    assert 0 < step.share < 1
    assert timer.enabled is False and timer.ms == []


def test_unknown_core_is_a_usage_error():
    from audit.errors import UsageError

    with pytest.raises(UsageError, match="unknown attention"):
        da.make_core("cudnn-magic")
    with pytest.raises(UsageError, match="needs our kernel library"):
        da.make_core("flash", None)


def test_amdahl():
    assert P.amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert P.amdahl(0.0, 10.0) == pytest.approx(1.0)
    assert P.amdahl(1.0, 10.0) == pytest.approx(10.0)
    assert P.amdahl(0.9, 1.0) == pytest.approx(1.0)
    assert math.isnan(P.amdahl(1.5, 2.0))

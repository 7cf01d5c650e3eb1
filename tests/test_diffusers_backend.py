"""Our kernel as a diffusers attention backend (flash_kernel.diffusers_backend): a Wan DiT built
from a small config runs every self- and cross-attention on the kernel through diffusers' own
dispatcher, against diffusers' native (SDPA) backend; calls the kernel cannot serve are passed on
to the previous backend unchanged and counted by reason. Context parallelism over several
processes: tests/test_diffusers_context_parallel.py."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from diffusers.models import attention_dispatch as ad  # noqa: E402
from diffusers.models.transformers.transformer_wan import WanTransformer3DModel  # noqa: E402

import flash_kernel  # noqa: E402
from audit.kernel_build.builder import ensure_built  # noqa: E402
from flash_kernel.diffusers_backend import flash_attention_backend  # noqa: E402

LAYERS = 2


@pytest.fixture(scope="module")
def lib(fixture_root):
    out = fixture_root / "fk_build"  # the folder tests/test_binding.py builds into: built once
    tb = ensure_built(["cpu"], out).get("cpu")
    assert tb.status == "built", tb.reason
    return flash_kernel.load(out / "cpu" / "libflash_kernel.so")


def _wan(seed: int):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                  in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                                  num_layers=LAYERS, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                  rope_max_seq_len=64)
    return model.eval()


def _forward(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 4, 3, 8, 10, generator=gen)  # 3 frames of 8x10: 60 tokens (ragged)
    text = torch.randn(1, 7, 32, generator=gen)
    dtype = next(model.parameters()).dtype  # float64 for the oracle model
    latents, text = latents.to(dtype), text.to(dtype)
    with torch.no_grad():
        return model(hidden_states=latents, timestep=torch.tensor([700]), encoder_hidden_states=text,
                     return_dict=False)[0]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_wan_runs_every_attention_on_the_kernel(lib):
    seed = int.from_bytes(os.urandom(4), "little")
    model = _wan(seed)
    stock = _forward(model, seed)
    with flash_attention_backend(lib) as counts:
        ours = _forward(model, seed)
    assert counts.served == 2 * LAYERS and not counts.passed_on, counts.summary()  # self + cross per block
    assert counts.paths == {"cpu": 2 * LAYERS}  # the path that ran each served call
    assert f"served {2 * LAYERS} (cpu: {2 * LAYERS})" in counts.summary()
    assert _rel(ours, stock) <= 1e-5, f"seed {seed}"
    assert ad._AttentionBackendRegistry.get_active_backend()[0] == ad.AttentionBackendName.NATIVE
    assert not [k for k in ad._AttentionBackendRegistry._backends if str(k).startswith("sovereign_flash")]


def _qkv(n=33, d=64, gen=None):
    return tuple(torch.randn(2, n, 3, d, generator=gen) for _ in range(3))  # (B, N, H, D) as diffusers passes


@pytest.mark.parametrize("case, reason", [
    ("mask", "attention mask"), ("causal", "causal"), ("dropout", "dropout"),
    ("grad", "needs gradients (forward-only kernel)"), ("head dim", "head dim 44"),
])
def test_calls_it_cannot_serve_go_to_sdpa_unchanged(lib, case, reason):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = _qkv(d=44 if case == "head dim" else 64, gen=gen)
    kw = {}
    if case == "mask":
        kw["attn_mask"] = torch.rand(2, 1, 33, 33, generator=gen) > 0.3
    elif case == "causal":
        kw["is_causal"] = True
    elif case == "grad":
        q.requires_grad_(True)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        native = ad.dispatch_attention_fn(q, k, v, dropout_p=0.5 if case == "dropout" else 0.0, **kw)
    with flash_attention_backend(lib) as counts, torch.random.fork_rng():
        torch.manual_seed(1)
        got = ad.dispatch_attention_fn(q, k, v, dropout_p=0.5 if case == "dropout" else 0.0, **kw)
    assert counts.served == 0 and counts.passed_on == {reason: 1}
    assert torch.equal(got, native)


def test_a_log_sum_exp_request_is_served(lib):
    """return_lse=True: (out, lse), lse float32 (B, S, H) in natural log, the model layout diffusers'
    backends return it in (its context-parallel code merges partial results by it)."""
    seed = int.from_bytes(os.urandom(4), "little")
    q, k, v = _qkv(gen=torch.Generator().manual_seed(seed))
    with flash_attention_backend(lib) as counts:
        out, lse = ad.dispatch_attention_fn(q, k, v, scale=0.1, attention_kwargs={"return_lse": True})
        alone = ad.dispatch_attention_fn(q, k, v, scale=0.1)
    assert counts.served == 2 and not counts.passed_on and torch.equal(out, alone)
    assert lse.shape == (2, 33, 3) and lse.dtype == torch.float32 and lse.is_contiguous()
    qd, kd = (t.transpose(1, 2).double() for t in (q, k))
    ref = torch.logsumexp(qd @ kd.transpose(-1, -2) * 0.1, dim=-1).transpose(1, 2)
    assert (lse.double() - ref).abs().max().item() < 1e-5, f"seed {seed}"


def test_context_parallel_calls_needing_gradients_are_passed_on(lib):
    """A call under context parallelism whose inputs need gradients goes to the previous backend
    with its parallel config, counted: the kernel is forward only."""
    q, k, v = _qkv(gen=torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little")))
    q.requires_grad_(True)
    seen = {}

    def previous(**kw):
        seen.update(kw)
        return kw["query"]

    marker = object()
    reg = ad._AttentionBackendRegistry
    name, _ = reg.get_active_backend()
    saved = reg._backends[name]
    reg._backends[name] = previous
    try:
        with flash_attention_backend(lib) as counts:
            got = ad.dispatch_attention_fn(q, k, v, parallel_config=marker)
    finally:
        reg._backends[name] = saved
    assert got is q and seen["_parallel_config"] is marker
    assert counts.served == 0 and counts.passed_on == {"needs gradients (forward-only kernel)": 1}


def test_blocks_nest_and_restore(lib):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = _qkv(gen=gen)
    with flash_attention_backend(lib) as outer:
        with flash_attention_backend(lib) as inner:
            ad.dispatch_attention_fn(q, k, v, attn_mask=torch.ones(2, 1, 33, 33, dtype=torch.bool))
        ad.dispatch_attention_fn(q, k, v)
    assert inner.to_dict() == {"served": 0, "precision": "exact", "paths": {}, "parallel": {}, "passed_on": {"attention mask": 1}}
    # inner passed it on to outer
    assert outer.to_dict() == {"served": 1, "precision": "exact", "paths": {"cpu": 1}, "parallel": {}, "passed_on": {"attention mask": 1}}
    assert ad._AttentionBackendRegistry.get_active_backend()[0] == ad.AttentionBackendName.NATIVE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_wan_on_the_gpu_in_bf16():
    """On the GPU the backend takes the library built for CUDA (flash_kernel.library_for): a bf16 Wan
    DiT's attention all served by the kernel, output close to diffusers' native (SDPA) backend."""
    seed = int.from_bytes(os.urandom(4), "little")
    model = _wan(seed).to("cuda", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    latents = torch.randn(1, 4, 3, 8, 10, generator=gen, device="cuda", dtype=torch.bfloat16)
    text = torch.randn(1, 7, 32, generator=gen, device="cuda", dtype=torch.bfloat16)

    def run():
        with torch.no_grad():
            return model(hidden_states=latents, timestep=torch.tensor([700], device="cuda"),
                         encoder_hidden_states=text, return_dict=False)[0]

    stock = run()
    with flash_attention_backend() as counts:
        ours = run()
    assert counts.served == 2 * LAYERS and not counts.passed_on, counts.summary()
    assert sum(counts.paths.values()) == counts.served and set(counts.paths) <= {"wgmma", "mma_sync"}, counts.summary()
    assert torch.isfinite(ours).all() and _rel(ours, stock) <= 2e-2, f"seed {seed}"


def test_fp8_serves_every_call_quantized_against_float64(lib):
    """precision="fp8": every attention of the Wan DiT served by the FP8 numerics (flash_kernel.fp8),
    each call the reference's output, and the DiT's output near float64 within the FP8 gate, not
    equal to the exact run's (the quantization is really applied)."""
    from audit.evidence.precision import FP8_GATES
    from flash_kernel import fp8

    seed = int.from_bytes(os.urandom(4), "little")
    model = _wan(seed)
    exact = _forward(model.double(), seed)  # the float64 model: the oracle
    model = model.float()
    with flash_attention_backend(lib) as ex:
        ours_exact = _forward(model, seed)
    with flash_attention_backend(lib, precision="fp8") as counts:
        ours_fp8 = _forward(model, seed)
    assert counts.served == 2 * LAYERS and not counts.passed_on, counts.summary()
    assert counts.paths == {"fp8 reference": 2 * LAYERS} and counts.precision == "fp8"
    assert "at fp8 (quantized, not exact)" in counts.summary() and ex.precision == "exact"
    rel = _rel(ours_fp8, exact)
    assert rel <= FP8_GATES.rel_l2, f"seed {seed}: rel-L2 {rel:.3g}"
    assert rel > 10 * _rel(ours_exact, exact), f"seed {seed}: the fp8 run is as close as the exact one"
    # one call, through the dispatcher, is the reference's output exactly
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen=gen)
    with flash_attention_backend(lib, precision="fp8"):
        out = ad.dispatch_attention_fn(q, k, v)
    assert torch.equal(out, fp8.attention(q, k, v, None, "bnhd"))


def test_fp8_min_keys_keeps_short_key_sequences_exact(lib):
    """fp8_min_keys=N: the Wan DiT's self-attention (60 keys) at fp8, its text cross-attention (7
    keys) exact; one dispatched call on each side of N is exactly the exact call's or the FP8
    reference's output; the counts say so."""
    from flash_kernel import fp8

    seed = int.from_bytes(os.urandom(4), "little")
    model = _wan(seed).float()
    with flash_attention_backend(lib, precision="fp8", fp8_min_keys=30) as counts:
        out = _forward(model, seed)
    assert counts.paths == {"fp8 reference": LAYERS, "cpu": LAYERS} and not counts.passed_on, counts.summary()
    assert "from 30 keys, exact below" in counts.summary() and counts.to_dict()["fp8_min_keys"] == 30
    assert torch.isfinite(out).all()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen=gen)
    nk = k.shape[1]
    with flash_attention_backend(lib, precision="fp8", fp8_min_keys=nk + 1):
        below = ad.dispatch_attention_fn(q, k, v)
    with flash_attention_backend(lib, precision="fp8", fp8_min_keys=nk):
        at = ad.dispatch_attention_fn(q, k, v)
    assert torch.equal(below, lib.attention(q, k, v, layout="bnhd"))
    assert torch.equal(at, fp8.attention(q, k, v, None, "bnhd"))
    # exact blocks ignore it: nothing there is fp8
    with flash_attention_backend(lib, fp8_min_keys=30) as ex:
        pass
    assert ex.fp8_min_keys == 0 and "keys" not in ex.summary()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "16k", None])
def test_a_bad_fp8_min_keys_is_refused_before_the_block(bad):
    with pytest.raises(ValueError, match="fp8_min_keys must be a whole number of keys"):
        with flash_attention_backend(precision="fp8", fp8_min_keys=bad):
            pass


def test_fp8_on_a_device_without_an_fp8_kernel_is_refused_not_served_exact(lib, monkeypatch):
    from flash_kernel import fp8

    q, k, v = (t.to("meta") for t in _qkv())
    # the CPU library is offered for every device, so the refusal can come from the precision alone
    with flash_attention_backend(lib, precision="fp8") as counts:
        with pytest.raises(fp8.Fp8Unavailable, match="not available on meta"):
            ad.dispatch_attention_fn(q, k, v)
    assert counts.served == 0 and not counts.passed_on
    # refused before any other test: not passed on to exact attention for want of a library either
    def no_library(device):
        raise OSError(f"no library built for {device}")

    monkeypatch.setattr(flash_kernel, "library_for", no_library)
    with flash_attention_backend(precision="fp8") as counts:
        with pytest.raises(fp8.Fp8Unavailable):
            ad.dispatch_attention_fn(q, k, v)
    assert counts.served == 0 and not counts.passed_on


def test_an_unknown_precision_is_refused_before_the_block():
    with pytest.raises(ValueError, match="precision must be one of 'exact', 'fp8', not 'int4'"):
        with flash_attention_backend(precision="int4"):
            pass

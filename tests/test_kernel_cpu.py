"""CPU path correctness: flash and naive forwards against a float64 reference.

Inputs are fresh random tensors every run (the seed is printed on failure); outputs are poisoned
with NaN before the call, so a row the kernel forgets to write fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import flash_kernel  # noqa: E402
from audit.kernel_build.builder import ensure_built  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = list(TOL)


@pytest.fixture(scope="session")
def cpu_lib(fixture_root):
    """Our CPU library, built by the real g++ through the builder (shared by the test modules)."""
    result = ensure_built(["cpu"], fixture_root / "fk_build")
    tb = result.get("cpu")
    assert tb.status == "built", tb.reason
    return flash_kernel.load(tb.library)


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def reference(q, k, v, scale=None, layout="bhnd"):
    """softmax(scale Q K^T) V in float64 from the very (rounded) inputs the kernel saw."""
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    s = scale if scale is not None else q.shape[-1] ** -0.5
    o = torch.softmax((q @ k.transpose(-1, -2)) * s, dim=-1) @ v
    return o.transpose(1, 2) if layout == "bnhd" else o


def rel_l2(out, ref) -> float:
    return ((out.to(torch.float64) - ref).norm() / ref.norm()).item()


def make(shape_q, shape_kv, dtype, gen, scale_inputs=1.0):
    q = (torch.randn(shape_q, generator=gen) * scale_inputs).to(dtype)
    k = (torch.randn(shape_kv, generator=gen) * scale_inputs).to(dtype)
    v = torch.randn(shape_kv, generator=gen).to(dtype)
    return q, k, v


def shapes(b, h, nq, nk, d, layout):
    if layout == "bhnd":
        return (b, h, nq, d), (b, h, nk, d)
    return (b, nq, h, d), (b, nk, h, d)


def run_poisoned(lib, q, k, v, scale, layout, naive):
    o = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    lib.run_into(q, k, v, o, scale, layout, naive=naive)
    return o


# (B, H, Nq, Nk, D, layout): N in {1, 77, 1000, 4097}, Nq != Nk, both layouts and head dims, B and H > 1
CASES = [
    (2, 3, 77, 77, 64, "bhnd"),
    (2, 3, 77, 1000, 128, "bnhd"),
    (2, 2, 1000, 77, 64, "bnhd"),
    (3, 2, 1, 1000, 128, "bhnd"),
    (2, 2, 77, 1, 64, "bhnd"),
    (1, 1, 4097, 4097, 128, "bhnd"),
    (1, 2, 4097, 1000, 64, "bnhd"),
]


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + "-" + c[5])
def test_matches_float64_reference(cpu_lib, case, dtype, naive):
    b, h, nq, nk, d, layout = case
    if naive and nq * nk > 2_000_000 and dtype != torch.float32:
        pytest.skip("the big naive case runs once, in fp32 (the flash path covers every dtype)")
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    sq, skv = shapes(b, h, nq, nk, d, layout)
    q, k, v = make(sq, skv, dtype, gen)
    out = run_poisoned(cpu_lib, q, k, v, 0.0, layout, naive)
    err = rel_l2(out, reference(q, k, v, layout=layout))
    assert not torch.isnan(out).any(), f"seed {seed}: NaN left in the output (rows not written)"
    assert err <= TOL[dtype], f"seed {seed}: relative L2 {err:.3e} > {TOL[dtype]:.0e}"


HEAD_DIMS = list(range(32, 257, 8))  # every head dim the library supports


def test_supported_head_dims_are_32_to_256_in_steps_of_8(cpu_lib):
    assert cpu_lib.head_dims == tuple(HEAD_DIMS)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_every_head_dim(cpu_lib, d):
    """Each head dim, each dtype, both layouts, Nq != Nk and ragged against the 32-row query
    and 64-key tiles: flash and naive against float64."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    for dtype in DTYPES:
        for layout, (b, h, nq, nk) in (("bhnd", (2, 2, 77, 130)), ("bnhd", (1, 3, 100, 33))):
            sq, skv = shapes(b, h, nq, nk, d, layout)
            q, k, v = make(sq, skv, dtype, gen)
            ref = reference(q, k, v, layout=layout)
            for naive in (False, True):
                out = run_poisoned(cpu_lib, q, k, v, 0.0, layout, naive)
                assert not torch.isnan(out).any(), f"seed {seed} {dtype} {layout} naive={naive}: NaN left"
                err = rel_l2(out, ref)
                assert err <= TOL[dtype], f"seed {seed} {dtype} {layout} naive={naive}: relative L2 {err:.3e}"
            assert cpu_lib.last_flash_path() == "cpu"


@pytest.mark.parametrize("d", [24, 44, 100, 264, 512])
def test_other_head_dims_are_refused_with_the_supported_list(cpu_lib, d):
    q = torch.zeros(1, 1, 4, d)
    o = torch.full_like(q, float("nan"))
    with pytest.raises(flash_kernel.KernelError) as exc:  # the binding checks first
        cpu_lib.run_into(q, q, q, o, 0.0, "bhnd", False)
    assert exc.value.status_name == "FK_ERR_HEAD_DIM" and "32, 40, 48" in exc.value.message
    # ... and the library itself, called past the binding, names the same set
    from flash_kernel import _binding

    args = _binding.fill_args(q, q, q, o, "bhnd", 0.0, None)
    for fn in (cpu_lib._dll.fk_flash_forward, cpu_lib._dll.fk_naive_forward):
        assert fn(args) == _binding.FK_ERR_HEAD_DIM
        msg = cpu_lib.last_error()
        assert f"head_dim {d} is not supported" in msg
        assert "(supported: " + ", ".join(map(str, HEAD_DIMS)) + ")" in msg
    assert torch.isnan(o).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_peaky_scores_and_explicit_scale(cpu_lib, dtype):
    """Large logits (scale 1, inputs x4): the online max must keep exp() in range."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make((1, 2, 300, 64), (1, 2, 333, 64), dtype, gen, scale_inputs=4.0)
    for naive in (False, True):
        out = run_poisoned(cpu_lib, q, k, v, 1.0, "bhnd", naive)
        err = rel_l2(out, reference(q, k, v, scale=1.0))
        assert torch.isfinite(out).all(), f"seed {seed}: non-finite output"
        assert err <= TOL[dtype], f"seed {seed} naive={naive}: relative L2 {err:.3e}"


def test_strided_views_are_read_through_strides(cpu_lib):
    """Non-contiguous inputs (slices of bigger tensors, D stride 1) give the same answer."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    big_q = torch.randn(2, 5, 90, 64 + 16, generator=gen)
    big_kv = torch.randn(3, 2, 5, 120, 64, generator=gen)
    q = big_q[:, 1:4, 5:82, 8:72]  # (2, 3, 77, 64), strides of the big tensor
    k, v = big_kv[0, :, 1:4], big_kv[2, :, 1:4]
    assert not q.is_contiguous() and q.stride(-1) == 1
    out = run_poisoned(cpu_lib, q, k, v, 0.0, "bhnd", False)
    assert rel_l2(out, reference(q, k, v)) <= 1e-4, f"seed {seed}"
    # the same tensors copied contiguous give the identical result (the kernel is deterministic)
    again = run_poisoned(cpu_lib, q.contiguous(), k.contiguous(), v.contiguous(), 0.0, "bhnd", False)
    assert torch.equal(out, again)


def test_flash_and_naive_agree_and_threads_do_not_change_results(cpu_lib, monkeypatch):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make((2, 3, 200, 64), (2, 3, 257, 64), torch.float32, gen)
    flash = run_poisoned(cpu_lib, q, k, v, 0.0, "bhnd", False)
    naive = run_poisoned(cpu_lib, q, k, v, 0.0, "bhnd", True)
    assert rel_l2(flash, naive.double()) <= 1e-5, f"seed {seed}"
    monkeypatch.setenv("FK_CPU_THREADS", "1")
    single = run_poisoned(cpu_lib, q, k, v, 0.0, "bhnd", False)
    assert torch.equal(flash, single), f"seed {seed}: the result depends on the thread count"


def test_half_storage_round_trips_exactly(cpu_lib):
    """One-hot attention makes each O row a V row: fp16/bf16 load and store lose nothing
    (subnormals and the largest half included)."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    for dtype in (torch.float16, torch.bfloat16):
        v = (torch.randn(1, 1, 64, 64, generator=gen) * 1e3).to(dtype)
        v[0, 0, 0, :8] = torch.tensor([6e-8, 1e-7, 3e-5, 65504, -0.0, 1.0, -2.5, 1e-3]).to(dtype)
        k = torch.eye(64).reshape(1, 1, 64, 64).to(dtype) * 100  # scores 10000 on the diagonal, 0 off it
        q = k.clone()
        out = run_poisoned(cpu_lib, q, k, v, 1.0, "bhnd", False)
        assert torch.equal(out, v), f"seed {seed} {dtype}: stored values differ from the inputs"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_stores_round_to_nearest(cpu_lib, dtype):
    """The fp32 result is rounded, not truncated: it matches the float64 reference rounded by
    torch for nearly every element, and is never more than one unit in the last place off
    (truncation would miss about half of them)."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make((1, 4, 128, 64), (1, 4, 256, 64), dtype, gen)
    out = run_poisoned(cpu_lib, q, k, v, 0.0, "bhnd", False).float()
    ref = reference(q, k, v).to(dtype).float()
    r = ref.to(dtype)
    up = (torch.nextafter(r, torch.tensor(float("inf"), dtype=dtype)).float() - ref).abs()
    down = (torch.nextafter(r, torch.tensor(float("-inf"), dtype=dtype)).float() - ref).abs()
    ulp = torch.maximum(up, down)  # the wider spacing at a binade edge
    # where |O| is tiny, fp32 cancellation error exceeds a half ulp: judge rounding where it is not
    big = ref.abs() >= 0.0625
    assert big.float().mean().item() > 0.3
    diff = (out - ref).abs()[big]
    worst = (diff / ulp[big]).max().item()
    assert worst <= 1.0001, f"seed {seed}: an element is {worst:.2f} ulp off"
    exact = (diff == 0).float().mean().item()
    assert exact >= 0.9, f"seed {seed}: only {exact:.1%} of elements round like torch (truncation?)"


# ---- the log-sum-exp (return_lse) ------------------------------------------------------------------


def reference_lse(q, k, scale=None, layout="bhnd"):
    """float64 logsumexp over keys of scale * Q K^T, (B, H, Nq), from the inputs the kernel saw."""
    if layout == "bnhd":
        q, k = (t.transpose(1, 2) for t in (q, k))
    q, k = (t.to(torch.float64) for t in (q, k))
    s = scale if scale is not None else q.shape[-1] ** -0.5
    return torch.logsumexp((q @ k.transpose(-1, -2)) * s, dim=-1)


LSE_ATOL = 2e-5  # fp32 scores and sums against float64; the inputs are the rounded ones either way


def run_poisoned_lse(lib, q, k, v, scale, layout, naive, guard=0):
    """o and lse poisoned with NaN; lse is a view of a buffer with `guard` NaN rows past Nq in
    every head (the padded rows of the last query tile must not land there). Returns o, lse, buf."""
    o = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    b, h, n = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhnd" else (q.shape[0], q.shape[2], q.shape[1])
    buf = torch.full((b, h, n + guard), float("nan"))
    lse = buf[..., :n]
    lib.run_into(q, k, v, o, scale, layout, naive=naive, lse=lse)
    return o, lse, buf


def assert_lse_close(lse, ref, what):
    assert lse.dtype == torch.float32 and torch.isfinite(lse).all(), f"{what}: a row's lse was not written"
    err = (lse.to(torch.float64) - ref).abs().max().item()
    assert err <= LSE_ATOL * (1 + ref.abs().max().item()), f"{what}: max |lse - float64| {err:.3g}"


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_lse_at_every_head_dim(cpu_lib, d):
    """Flash and naive at every head dim, both layouts, Nq and Nk off the tile sizes (32 query
    rows, 64 keys), several query and key tiles; o is the same with and without the lse."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    for (b, h, nq, nk), layout, dtype in (((2, 2, 77, 130), "bhnd", torch.float32),
                                          ((1, 3, 33, 65), "bnhd", torch.bfloat16),
                                          ((1, 1, 5, 1), "bhnd", torch.float16)):
        q, k, v = make(*shapes(b, h, nq, nk, d, layout), dtype, gen)
        ref = reference_lse(q, k, None, layout)
        for naive in (False, True):
            o, lse, buf = run_poisoned_lse(cpu_lib, q, k, v, 0.0, layout, naive=naive, guard=40)
            what = f"d {d} {layout} {dtype} naive={naive} (seed {seed})"
            assert_lse_close(lse, ref, what)
            assert torch.isnan(buf[..., nq:]).all(), f"{what}: written past Nq"
            assert torch.equal(o, run_poisoned(cpu_lib, q, k, v, 0.0, layout, naive=naive)), what


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + "-" + c[5])
def test_lse_matches_float64_logsumexp(cpu_lib, case, dtype, naive):
    b, h, nq, nk, d, layout = case
    seed = fresh_seed()
    q, k, v = make(*shapes(b, h, nq, nk, d, layout), dtype, torch.Generator().manual_seed(seed))
    o, lse, _ = run_poisoned_lse(cpu_lib, q, k, v, 0.0, layout, naive)
    assert_lse_close(lse, reference_lse(q, k, None, layout), f"{case} {dtype} (seed {seed})")
    assert rel_l2(o, reference(q, k, v, None, layout)) <= TOL[dtype]


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
def test_lse_of_peaky_scores_and_explicit_scale(cpu_lib, naive):
    """Scores in the hundreds: the lse holds the row maximum (no overflow of exp)."""
    seed = fresh_seed()
    q, k, v = make((1, 2, 100, 64), (1, 2, 300, 64), torch.float32, torch.Generator().manual_seed(seed), 3.0)
    _, lse, _ = run_poisoned_lse(cpu_lib, q, k, v, 2.0, "bhnd", naive)
    ref = reference_lse(q, k, 2.0)
    assert ref.abs().max() > 100
    assert_lse_close(lse, ref, f"seed {seed}")


def test_lse_through_strides(cpu_lib):
    """q, k, v strided views of one packed qkv; the lse written through its own strides into every
    other element of a buffer whose gaps stay NaN."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, 150, 3, 4, 64, generator=gen)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, N, H, D) views
    buf = torch.full((2, 4, 150, 2), float("nan"))
    lse = buf[..., 0]  # strides (1200, 300, 2)
    o = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    cpu_lib.run_into(q, k, v, o, 0.0, "bnhd", naive=False, lse=lse)
    assert_lse_close(lse, reference_lse(q, k, None, "bnhd"), f"seed {seed}")
    assert torch.isnan(buf[..., 1]).all()


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_public_call_returns_out_and_lse(cpu_lib, monkeypatch, layout):
    """flash_kernel.attention(..., return_lse=True): (out, lse), lse float32 (B, H, Nq) dense in q's
    layout; the first call (checked in full) and the repeated ones (straight to the C call) alike,
    and the call without it still returns the output alone."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(Path(cpu_lib.path).parent.parent))
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make(*shapes(2, 3, 45, 70, 64, layout), torch.bfloat16, gen)
    ref = reference_lse(q, k, 0.2, layout)
    for _ in range(3):
        out, lse = flash_kernel.attention(q, k, v, scale=0.2, layout=layout, return_lse=True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 3, 45) and lse.dtype == torch.float32
        assert (lse.transpose(1, 2) if layout == "bnhd" else lse).is_contiguous()
        assert_lse_close(lse, ref, f"{layout} (seed {seed})")
        assert torch.equal(flash_kernel.attention(q, k, v, scale=0.2, layout=layout), out)
    _, naive_lse = flash_kernel.naive_attention(q, k, v, scale=0.2, layout=layout, return_lse=True)
    assert_lse_close(naive_lse, ref, f"naive {layout} (seed {seed})")
    # inputs the kernel cannot address as they are (D stride 2) go the copying way: lse the same
    qs, ks, vs = (torch.stack([t, t], dim=-1)[..., 0] for t in (q, k, v))
    assert qs.stride(-1) == 2
    out2, lse2 = flash_kernel.attention(qs, ks, vs, scale=0.2, layout=layout, return_lse=True)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_lse_under_torch_compile(cpu_lib, monkeypatch):
    """Traced by torch.compile(fullgraph=True): the registered op with its fake (meta) result."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(Path(cpu_lib.path).parent.parent))
    q, k, v = make((1, 2, 40, 64), (1, 2, 50, 64), torch.float32, torch.Generator().manual_seed(fresh_seed()))

    def f(q, k, v):
        out, lse = flash_kernel.attention(q, k, v, return_lse=True)
        return out * 2, lse + 1

    torch._dynamo.reset()
    out, lse = torch.compile(f, backend="eager", fullgraph=True)(q, k, v)
    assert torch.equal(lse, flash_kernel.attention(q, k, v, return_lse=True)[1] + 1)  # (x + 1) - 1 may round
    assert_lse_close(lse - 1, reference_lse(q, k), "compiled")

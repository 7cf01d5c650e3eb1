"""GPU correctness of the flash_kernel CUDA builds: the mma.sync path (sm_90), the Hopper wgmma/TMA
path (sm_90a, only on a cc 9.0 device), the forced generic (RDNA2) path (sm_90-generic) and the
naive pre-flash path, against a float64 reference.

Marker `gpu`: skipped where torch sees no CUDA device (CI); run on the device machine. The libraries
come from the build folder (`flash_kernel.build_dir()`: $FLASH_KERNEL_BUILD or build/), else they
are compiled here with nvcc by the documented command. Inputs are fresh random draws every run;
outputs are poisoned with NaN before each call so an unwritten element fails.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)"),
]

import flash_kernel  # noqa: E402
from flash_kernel import _binding  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SM90 = ["-gencode", "arch=compute_90,code=sm_90"]
NVCC_ARCH = {  # the flags of audit/kernel_build/targets.py, written out
    "sm_90": SM90,
    "sm_90-generic": SM90 + ["-DFK_FORCE_GENERIC"],
    "sm_90a": ["-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_80,code=sm_80", "-DFK_WGMMA",
               '-DFK_TARGET="sm_90a"'],
}
FLASH_PATH = {"sm_90": "mma_sync", "sm_90-generic": "generic", "sm_90a": "wgmma"}  # on a cc 9.0 device
HEAD_DIMS = list(range(32, 257, 8))  # every head dim every build supports


def _expected_path(lib, dtype) -> str:
    """The path a call must run: the build's own for fp16/bf16 at every head dim; fp32 has no
    tensor-core kernel (generic)."""
    return lib.flash_path if dtype != torch.float32 else "generic"

# (B, H, Nq, Nk): N in {1, 77, 1000, 4097}, ragged everywhere, Nq != Nk, B and H > 1.
SHAPES = [
    (2, 3, 1, 1),
    (2, 3, 77, 77),
    (2, 2, 1000, 1000),
    (1, 2, 4097, 4097),
    (2, 2, 77, 1000),
    (1, 3, 1000, 77),
    (2, 1, 1, 4097),
    (1, 2, 4097, 1),
]


def _build(target: str, out: Path) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(f"no built {target} library and no nvcc to build one")
    so = out / target / "libflash_kernel.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, "-x", "cu", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
           *NVCC_ARCH[target], "-I", "flash_kernel/include",
           "-I", "flash_kernel/src", "flash_kernel/src/fk_gpu.hip", "-o", str(so)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=600)
    return so


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_built_from_this_tree(so: Path) -> None:
    """A prebuilt library (carried to the device machine) must come from the sources under test:
    its provenance.json names every source the compiler read, with digests, and the library's own."""
    prov_path = so.parent / "provenance.json"
    assert prov_path.is_file(), f"{so} has no provenance.json: nothing says it was built from this tree"
    prov = json.loads(prov_path.read_text())
    assert prov["outputs"][0]["sha256"] == _sha256(so), f"{so} is not the library its provenance.json describes"
    stale = [s["path"] for s in prov["sources"] if not (REPO / s["path"]).is_file()
             or _sha256(REPO / s["path"]) != s["sha256"]]
    assert not stale, f"{so} was built from other sources than this tree's ({', '.join(stale)}): rebuild it"


@pytest.fixture(scope="session", params=["sm_90", "sm_90-generic", "sm_90a"])
def lib(request, fixture_root):
    target = request.param
    if target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a (wgmma) path runs on a cc 9.0 device only (H100/H200)")
    so = flash_kernel.build_dir() / target / "libflash_kernel.so"
    if so.is_file():
        _assert_built_from_this_tree(so)  # else these tests would judge an older kernel
    else:
        so = _build(target, fixture_root)
    lib = flash_kernel.load(so)
    assert lib.flash_path == FLASH_PATH[target]
    assert lib.target == ("sm_90a" if target == "sm_90a" else "sm_90")
    return lib


def _make(b, h, nq, nk, d, dtype, layout, gen):
    def t(n):
        x = torch.randn(b, h, n, d, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
        return x if layout == "bhnd" else x.transpose(1, 2).contiguous()  # (B, N, H, D) in memory
    return t(nq), t(nk), t(nk)


def _reference(q, k, v, scale, layout):
    if layout == "bnhd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.double() for x in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    o = torch.matmul(torch.softmax(s, dim=-1), v)
    return o if layout == "bhnd" else o.transpose(1, 2)


def _run(lib, q, k, v, layout, naive, scale=None):
    """Call the library into a NaN-poisoned output (the binding's own call allocates a fresh one)."""
    o = torch.full_like(q, float("nan"))
    lib.run_into(q, k, v, o, _binding.resolve_scale(scale, q.shape[-1]), layout, naive)
    torch.cuda.synchronize()
    return o


def _rel_l2(out, ref):
    assert torch.isfinite(out).all(), "output has NaN/Inf (an element was not written?)"
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_flash_matches_float64(lib, shape, d, dtype, layout):
    gen = torch.Generator(device="cuda")
    gen.seed()  # fresh inputs every run
    q, k, v = _make(*shape, d, dtype, layout, gen)
    out = _run(lib, q, k, v, layout, naive=False)
    assert lib.last_flash_path() == _expected_path(lib, dtype)
    err = _rel_l2(out, _reference(q, k, v, 1.0 / math.sqrt(d), layout))
    assert err <= TOL[dtype], f"rel L2 {err:.3g} > {TOL[dtype]} (seed {gen.initial_seed()})"


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_every_head_dim(lib, d, dtype):
    """Every supported head dim, both layouts, ragged Nq != Nk (several K/V and query tiles, the
    ring of K/V stages wrapping), on the path the build promises (tensor cores for fp16/bf16)."""
    _check_on_its_path(lib, d, dtype, (("bhnd", (2, 3, 77, 1000)), ("bnhd", (1, 2, 1000, 77))))


@pytest.mark.parametrize("d", [136, 160, 192, 200, 248, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wide_head_dims_long_ragged(lib, d, dtype):
    """Head dims 136..256 (the tensor-core kernels' widest buckets, exact and padded) over many K/V
    tiles: a ragged 4097 keys wrap a two-stage ring some fifty times, in both layouts."""
    _check_on_its_path(lib, d, dtype, (("bhnd", (1, 2, 4097, 4097)), ("bnhd", (2, 1, 333, 4099))))


def _check_on_its_path(lib, d, dtype, cases):
    """Each (layout, (B, H, Nq, Nk)) case at head dim d on fresh inputs: the flash path the build
    promises ran, and the output matches float64."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    for layout, shape in cases:
        q, k, v = _make(*shape, d, dtype, layout, gen)
        out = _run(lib, q, k, v, layout, naive=False)
        assert lib.last_flash_path() == _expected_path(lib, dtype), f"d {d} {layout}"
        err = _rel_l2(out, _reference(q, k, v, 1.0 / math.sqrt(d), layout))
        assert err <= TOL[dtype], f"d {d} {layout}: rel L2 {err:.3g} > {TOL[dtype]} (seed {gen.initial_seed()})"


@pytest.mark.parametrize("shape", [(2, 3, 77, 1000), (1, 2, 1000, 77), (1, 1, 4097, 4097)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_naive_matches_float64(lib, shape, dtype):
    gen = torch.Generator(device="cuda")
    gen.seed()
    q, k, v = _make(*shape, 128, dtype, "bnhd", gen)
    out = _run(lib, q, k, v, "bnhd", naive=True)
    err = _rel_l2(out, _reference(q, k, v, 1.0 / math.sqrt(128), "bnhd"))
    assert err <= TOL[dtype], f"rel L2 {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("d", [32, 72, 160, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_other_head_dims(lib, d, dtype):
    gen = torch.Generator(device="cuda")
    gen.seed()
    q, k, v = _make(2, 2, 333, 517, d, dtype, "bhnd", gen)
    ref = _reference(q, k, v, 0.3, "bhnd")
    for naive in (False, True):
        err = _rel_l2(_run(lib, q, k, v, "bhnd", naive, scale=0.3), ref)
        assert err <= TOL[dtype], f"naive={naive}: rel L2 {err:.3g} > {TOL[dtype]}"


def test_explicit_scale_and_large_logits(lib):
    """A large scale makes the softmax peaky: the online max must rescale correctly."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    q, k, v = _make(1, 4, 500, 1500, 128, torch.bfloat16, "bhnd", gen)
    ref = _reference(q, k, v, 2.0, "bhnd")
    assert _rel_l2(_run(lib, q, k, v, "bhnd", False, scale=2.0), ref) <= 1e-2


def test_custom_op_path_and_strided_view(lib):
    """Through lib.attention (the torch custom op): a non-contiguous (B,N,H,D) view of a packed qkv."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    qkv = torch.randn(2, 300, 3, 4, 64, generator=gen, device="cuda").to(torch.float16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # strides (300*768, 768, 64, 1)
    out = lib.attention(q, k, v, layout="bnhd")
    assert out.shape == q.shape and out.dtype == q.dtype
    err = _rel_l2(out, _reference(q, k, v, 1 / 8.0, "bnhd"))
    assert err <= 2e-3


def test_one_pointer_in_turn_as_other_shapes_and_layouts(lib):
    """Calls in turn on views that share a data pointer but not a shape or strides (a caching
    allocator hands blocks back like this), among more tensors than the library keeps tensor maps
    for: every call must read its own q as it is now, on a kernel opted in once."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    buf = torch.randn(2 * 256 * 64, generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(1, 2, 300, 64, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    views = [
        (buf.view(1, 2, 256, 64), k, v, "bhnd"),
        (buf[: 2 * 200 * 64].view(1, 2, 200, 64), k, v, "bhnd"),         # same pointer, fewer rows
        (buf.view(1, 256, 2, 64), k.transpose(1, 2), v.transpose(1, 2), "bnhd"),  # same pointer, other strides
    ]
    others = [_make(1, 2, 100 + 10 * i, 90, 64, torch.bfloat16, "bhnd", gen) + ("bhnd",) for i in range(4)]
    for _ in range(3):
        for q, kk, vv, layout in views + others:
            out = _run(lib, q, kk, vv, layout, naive=False)
            err = _rel_l2(out, _reference(q, kk, vv, 1.0 / 8.0, layout))
            assert err <= TOL[torch.bfloat16], f"{tuple(q.shape)} {layout}: rel L2 {err:.3g} (seed {gen.initial_seed()})"


def test_misaligned_view_is_refused_by_the_c_abi_and_copied_by_the_binding(lib):
    """The flash paths load 16 bytes at a time: a 2-byte-offset view handed to the C ABI is an
    error (FK_ERR_ALIGNMENT, nothing written), not a fault; the binding copies it first, so its
    output is exactly its contiguous copy's."""
    base = torch.randn(1, 1, 65 * 64 + 1, device="cuda").to(torch.float16)
    q = base[0, 0, 1:].view(1, 1, 65, 64)  # storage offset 1 element
    o = torch.full((1, 1, 65, 64), float("nan"), device="cuda", dtype=torch.float16)
    with pytest.raises(_binding.KernelError) as exc:
        lib._invoke(_binding.fill_args(q, q, q, o, "bhnd", 0.0, None), q.device, False)
    assert exc.value.status == _binding.FK_ERR_ALIGNMENT
    assert "aligned" in exc.value.message
    torch.cuda.synchronize()
    assert torch.isnan(o).all()
    lib.run_into(q, q, q, o, 0.0, "bhnd", False)
    c = q.contiguous()
    want = torch.full_like(o, float("nan"))
    lib.run_into(c, c, c, want, 0.0, "bhnd", False)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.equal(o, want)
    # a kind first seen 16-byte aligned, then a view with its strides 2 bytes off: the remembered
    # kind's fast path must copy it too, not pass the C ABI's refusal on
    buf = torch.randn(1, 2, 65, 72, device="cuda").to(torch.float16)  # rows of 144 bytes
    aligned, shifted = buf[..., :64], buf[..., 1:65]
    for _ in range(2):
        lib.attention(aligned, aligned, aligned)
    got = lib.attention(shifted, shifted, shifted)
    c = shifted.contiguous()
    assert torch.equal(got, lib.attention(c, c, c))
    # an output of the caller's is written where it is: one 2 bytes off is refused, not copied
    bad_o = torch.empty(2 * 65 * 64 + 8, device="cuda", dtype=torch.float16)[1:2 * 65 * 64 + 1].view(1, 2, 65, 64)
    with pytest.raises(_binding.KernelError) as exc:
        lib.run_into(c, c, c, bad_o, 0.0, "bhnd", False)
    assert exc.value.status == _binding.FK_ERR_ALIGNMENT and "16-byte aligned" in exc.value.message


def test_unsupported_head_dim_is_refused(lib):
    q = torch.randn(1, 1, 8, 44, device="cuda", dtype=torch.float16)
    o = torch.full_like(q, float("nan"))
    with pytest.raises(_binding.KernelError) as exc:  # the binding refuses it (head dims from the library)
        lib.run_into(q, q, q, o, 0.0, "bhnd", False)
    assert exc.value.status == _binding.FK_ERR_HEAD_DIM
    # run_into checks head_dim in Python first: the library's own check is reached only by calling
    # its C entry points directly, with the Python validation bypassed
    args = _binding.fill_args(q, q, q, o, "bhnd", 0.0, None)
    for fn in (lib._dll.fk_flash_forward, lib._dll.fk_naive_forward):
        assert fn(args) == _binding.FK_ERR_HEAD_DIM
        assert "head_dim 44" in lib.last_error() and "(supported: 32, 40, 48," in lib.last_error()
    torch.cuda.synchronize()
    assert torch.isnan(o).all()  # refused before anything was written
    assert lib.head_dims == tuple(HEAD_DIMS)


def _persistent_shapes():
    """(B, H, Nq, Nk) that exercise the persistent wgmma grid (one block per SM looping over
    128-row query tiles of every (batch, head)), sized by this device's SM count: several items
    per block and more items than SMs by a non-multiple, ragged query and key tiles (a last query
    tile whose second 64-row half lies wholly past Nq), and K/V of a single tile, so that the
    K/V ring and the two halves of Q run on across items."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return [
        (1, sms + 7, 300, 1000),      # 3 query tiles x (sms + 7) heads: ~3.2 items a block, K/V ring wraps
        (2, sms + 3, 129, 100),       # Nk below one tile; the second query tile holds 1 row
        (1, 2 * sms + 1, 128, 128),   # exactly one query tile and one K/V tile per item
        (3, 5, 1000, 77),             # fewer items than SMs
        (1, sms + 1, 256, 512),       # text cross-attention's Nk: four K/V tiles an item, ~2 items a block
        (1, sms + 5, 200, 4100),      # long Nk (33 K/V tiles an item), two items a block
    ]


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("d", [64, 72, 96, 128, 160, 192, 200, 256])  # every wgmma bucket, exact, narrow and padded
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_many_work_items(lib, case, d, dtype):
    gen = torch.Generator(device="cuda")
    gen.seed()
    shape = _persistent_shapes()[case]
    layout = "bhnd" if (case + d) % 2 == 0 else "bnhd"
    q, k, v = _make(*shape, d, dtype, layout, gen)
    out = _run(lib, q, k, v, layout, naive=False)
    assert lib.last_flash_path() == _expected_path(lib, dtype)
    ref = _reference(q, k, v, 1.0 / math.sqrt(d), layout)
    err = _rel_l2(out, ref)
    assert err <= TOL[dtype], f"{shape} d {d} {layout}: rel L2 {err:.3g} > {TOL[dtype]} (seed {gen.initial_seed()})"
    # every (batch, head) alike: an item run on the wrong head or tile would show in its own head
    hdim = 1 if layout == "bhnd" else 2
    per_head = (torch.linalg.vector_norm((out.double() - ref).transpose(0, hdim).flatten(1), dim=1)
                / torch.linalg.vector_norm(ref.transpose(0, hdim).flatten(1), dim=1))
    assert per_head.max().item() <= 2 * TOL[dtype], f"{shape} d {d}: worst head rel L2 {per_head.max().item():.3g}"


@pytest.mark.parametrize("d", [64, 128])
def test_non_finite_input_stays_in_its_head(lib, d):
    """A NaN in one head's keys makes that head's output NaN and leaves every other head exact:
    the persistent grid's blocks run on from item to item, and nothing of an item (O, the row
    maxima and sums) may carry over into the next."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shape, bad = (1, 2 * sms + 3, 256, 512), 5
    q, k, v = _make(*shape, d, torch.bfloat16, "bhnd", gen)
    k[0, bad, 17, 3] = float("nan")
    out = _run(lib, q, k, v, "bhnd", naive=False)
    assert lib.last_flash_path() == _expected_path(lib, torch.bfloat16)
    assert torch.isnan(out[0, bad]).all()
    keep = [h for h in range(shape[1]) if h != bad]
    err = _rel_l2(out[:, keep], _reference(q[:, keep], k[:, keep], v[:, keep], 1.0 / math.sqrt(d), "bhnd"))
    assert err <= TOL[torch.bfloat16], f"rel L2 {err:.3g} (seed {gen.initial_seed()})"


# ---- the log-sum-exp (return_lse) ------------------------------------------------------------------

LSE_ATOL = 2e-5  # relative to 1 + max |lse|: fp32 scores and sums against float64 on the same inputs


def _run_lse(lib, q, k, v, layout, naive, scale=None, guard=0):
    """o and lse NaN-poisoned; lse a view of a buffer with `guard` NaN rows past Nq in every head
    (rows of a last, partial query tile must not be written there). Returns o, lse, buffer."""
    o = torch.full_like(q, float("nan"))
    b, n, h = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bhnd" else q.shape[:3]
    buf = torch.full((b, h, n + guard), float("nan"), device=q.device)
    lse = buf[..., :n]
    lib.run_into(q, k, v, o, _binding.resolve_scale(scale, q.shape[-1]), layout, naive, lse=lse)
    torch.cuda.synchronize()
    return o, lse, buf


def _reference_lse(q, k, scale, layout):
    if layout == "bnhd":
        q, k = (x.transpose(1, 2) for x in (q, k))
    return torch.logsumexp(torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale, dim=-1)


def _check_lse(lib, d, dtype, cases, naive=False, seed_gen=None):
    """Each (layout, (B, H, Nq, Nk)) case: the lse of every row against float64's logsumexp,
    nothing written past Nq, on the path the build promises, and O bit for bit the O of the call
    without the lse."""
    gen = seed_gen or torch.Generator(device="cuda")
    if seed_gen is None:
        gen.seed()
    for layout, shape in cases:
        q, k, v = _make(*shape, d, dtype, layout, gen)
        o, lse, buf = _run_lse(lib, q, k, v, layout, naive, guard=65)
        what = f"d {d} {dtype} {layout} {shape} naive={naive} (seed {gen.initial_seed()})"
        if not naive:
            assert lib.last_flash_path() == _expected_path(lib, dtype), what
        assert torch.isfinite(lse).all(), f"{what}: a row's lse was not written"
        ref = _reference_lse(q, k, 1.0 / math.sqrt(d), layout)
        err = (lse.double() - ref).abs().max().item()
        assert err <= LSE_ATOL * (1 + ref.abs().max().item()), f"{what}: max |lse - float64| {err:.3g}"
        assert torch.isnan(buf[..., shape[2]:]).all(), f"{what}: written past Nq"
        assert torch.equal(o, _run(lib, q, k, v, layout, naive)), f"{what}: O differs with the lse asked for"


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_lse_every_head_dim(lib, d, dtype):
    """Every head dim (every bucket, exact, padded and narrow), both layouts, Nq and Nk off every
    tile size; Nk 300 takes the chained wgmma kernels (exact 64 and 128), 1000 the unchained."""
    _check_lse(lib, d, dtype, (("bhnd", (2, 3, 77, 1000)), ("bnhd", (1, 2, 1000, 77)), ("bhnd", (1, 2, 333, 300))))


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("d", [32, 48, 64, 72, 96, 112, 128, 160, 192, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_lse_many_work_items(lib, case, d, dtype):
    """The persistent grid: blocks that run many items (the lse of each item's rows written with
    that item's maxima and sums, chained items included) and last query tiles partly past Nq."""
    layout = "bhnd" if (case + d) % 2 == 0 else "bnhd"
    _check_lse(lib, d, dtype, ((layout, _persistent_shapes()[case]),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lse_naive(lib, dtype):
    _check_lse(lib, 128, dtype, (("bnhd", (2, 3, 77, 1000)), ("bhnd", (1, 2, 1000, 77))), naive=True)


def test_lse_of_peaky_scores(lib):
    """A scale of 2 puts scores in the hundreds: the lse carries the row maximum."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    q, k, v = _make(1, 4, 500, 1500, 128, torch.bfloat16, "bhnd", gen)
    _, lse, _ = _run_lse(lib, q, k, v, "bhnd", False, scale=2.0)
    ref = _reference_lse(q, k, 2.0, "bhnd")
    assert ref.abs().max() > 100
    assert (lse.double() - ref).abs().max().item() <= LSE_ATOL * (1 + ref.abs().max().item())


def test_lse_through_strides_and_the_public_call(lib, monkeypatch):
    """q, k, v strided views of one packed qkv; lse written through its own strides (every other
    element of a buffer whose gaps stay NaN); flash_kernel.attention(..., return_lse=True) returns
    (out, lse) with lse float32 (B, H, Nq), on the first call and the repeated ones."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    qkv = torch.randn(2, 300, 3, 4, 64, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = _reference_lse(q, k, 0.125, "bnhd")
    buf = torch.full((2, 4, 300, 2), float("nan"), device="cuda")
    o = torch.full_like(q, float("nan"))
    lib.run_into(q, k, v, o, 0.0, "bnhd", False, lse=buf[..., 0])
    torch.cuda.synchronize()
    assert (buf[..., 0].double() - ref).abs().max().item() <= LSE_ATOL * (1 + ref.abs().max().item())
    assert torch.isnan(buf[..., 1]).all()
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(Path(lib.path).parent.parent))
    monkeypatch.setenv("FLASH_KERNEL_TARGET", Path(lib.path).parent.name)
    for _ in range(3):
        out, lse = flash_kernel.attention(q, k, v, layout="bnhd", return_lse=True)
        assert lse.shape == (2, 4, 300) and lse.dtype == torch.float32 and lse.device == q.device
        assert (lse.double() - ref).abs().max().item() <= LSE_ATOL * (1 + ref.abs().max().item())
        assert torch.equal(out, o)

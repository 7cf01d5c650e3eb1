"""The `flash_kernel` Python binding: loading, lookup, errors, Python-side checks mirroring the C
validation, the torch custom op and standing in for F.scaled_dot_product_attention."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flash_kernel  # noqa: E402
from audit.kernel_build.builder import ensure_built  # noqa: E402
from flash_kernel import _binding as B  # noqa: E402


@pytest.fixture(scope="session")
def build_root(fixture_root) -> Path:
    # the same build folder as tests/test_kernel_cpu.py: built once, reused while its provenance matches
    out = fixture_root / "fk_build"
    tb = ensure_built(["cpu"], out).get("cpu")
    assert tb.status == "built", tb.reason
    return out


@pytest.fixture(scope="session")
def lib(build_root):
    return flash_kernel.load(build_root / "cpu" / "libflash_kernel.so")


def seeded():
    seed = int.from_bytes(os.urandom(4), "little")
    return seed, torch.Generator().manual_seed(seed)


def qkv(shape_q, shape_kv, dtype=torch.float32, gen=None):
    return (torch.randn(shape_q, generator=gen).to(dtype), torch.randn(shape_kv, generator=gen).to(dtype),
            torch.randn(shape_kv, generator=gen).to(dtype))


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def gcc_so(tmp_path: Path, name: str, source: str) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not on PATH (apt install gcc)")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"lib{name}.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", str(src), "-o", str(out)], check=True, capture_output=True)
    return out


FAKE_ABI = r"""
#include <stdint.h>
int32_t fk_abi_version(void) { return %d; }
const char *fk_target(void) { return "fake"; }
const char *fk_flash_path(void) { return "none"; }
int32_t fk_supported_head_dims(int32_t *d, int32_t c) { if (d && c > 0) d[0] = 64; return 1; }
const char *fk_last_error(void) { return "fake library"; }
int32_t fk_flash_forward(const void *a) { return 8; }
int32_t fk_naive_forward(const void *a) { return 8; }
int32_t fk_workspace_bytes(const void *a, int64_t *n) { *n = 0; return 0; }
"""


# ---- loading ------------------------------------------------------------------------------------

def test_load_reports_the_getters(lib, build_root):
    assert lib.abi_version == 3 == flash_kernel.ABI_VERSION
    assert lib.target == "cpu" and lib.flash_path == "cpu"
    assert {64, 128} <= set(lib.head_dims)
    assert lib.path == str((build_root / "cpu" / "libflash_kernel.so").resolve())
    assert flash_kernel.load(build_root / "cpu") is lib  # a folder holding the library, same object


def test_missing_library_says_how_to_build(tmp_path):
    with pytest.raises(flash_kernel.LibraryNotFound) as ei:
        flash_kernel.load(tmp_path / "nope" / "libflash_kernel.so")
    assert "sovereign-audit build --target" in str(ei.value)
    assert isinstance(ei.value, flash_kernel.KernelError)


@pytest.mark.parametrize("version", [1, 2, 4])
def test_abi_mismatch_is_refused(tmp_path, version):
    """A library of ABI 1 or 2 (before the log-sum-exp, before the precision) reads a shorter
    argument struct, one of a later ABI perhaps a longer one: refused."""
    so = gcc_so(tmp_path, f"abi{version}", FAKE_ABI % version)
    with pytest.raises(flash_kernel.AbiMismatch) as ei:
        flash_kernel.load(so)
    assert f"ABI {version}" in str(ei.value) and ei.value.status == B.FK_ERR_ABI


def test_a_library_without_the_abi_is_refused(tmp_path):
    so = gcc_so(tmp_path, "other", "int something(void) { return 1; }\n")
    with pytest.raises(flash_kernel.KernelError) as ei:
        flash_kernel.load(so)
    assert "does not export the flash_kernel C ABI" in str(ei.value) and "fk_flash_forward" in str(ei.value)


def test_a_file_that_is_not_a_library_is_a_kernel_error(tmp_path):
    p = tmp_path / "libflash_kernel.so"
    p.write_bytes(b"\x7fELF not really\n")
    with pytest.raises(flash_kernel.KernelError) as ei:
        flash_kernel.load(p)
    assert "cannot load" in str(ei.value)


def test_any_library_exporting_the_abi_loads_and_its_errors_surface(tmp_path):
    fake = flash_kernel.load(gcc_so(tmp_path, "fake", FAKE_ABI % B.ABI_VERSION))
    assert (fake.target, fake.flash_path, fake.head_dims) == ("fake", "none", (64,))
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(flash_kernel.KernelError):  # "fake" is not cpu: it takes GPU tensors only
        fake.attention(q, q, q)


def test_last_flash_path_names_the_path_of_each_call_and_is_empty_after_a_refusal(lib):
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 17, 64), (1, 2, 29, 64), gen=gen)
    lib.attention(q, k, v)
    assert lib.last_flash_path() == "cpu"
    with pytest.raises(flash_kernel.KernelError):  # refused by the C side (the Python checks skipped)
        lib._invoke(B.fill_args(q, k, v, torch.empty_like(q), "bhnd", -1.0, None), q.device, naive=False)
    assert lib.last_flash_path() == ""
    lib.attention(q, k, v)
    assert lib.last_flash_path() == "cpu"


def test_last_flash_path_is_per_thread(lib):
    import threading

    q = torch.randn(1, 1, 9, 64)
    lib.attention(q, q, q)
    seen = []
    t = threading.Thread(target=lambda: seen.append(lib.last_flash_path()))
    t.start()
    t.join()
    assert seen == [""] and lib.last_flash_path() == "cpu"


def test_a_library_without_fk_workspace_bytes_has_no_fp8(tmp_path):
    """fk_workspace_bytes is optional within ABI 3: a library without it loads, and its fp8 call
    is refused (FK_ERR_PRECISION) before any argument reaches it."""
    source = FAKE_ABI.replace("int32_t fk_workspace_bytes(const void *a, int64_t *n) { *n = 0; return 0; }\n", "")
    assert "fk_workspace_bytes" not in source
    fake = flash_kernel.load(gcc_so(tmp_path, "nows", source % B.ABI_VERSION))
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(flash_kernel.KernelError) as exc:
        fake.fp8_attention(q, q, q)
    assert exc.value.status == B.FK_ERR_PRECISION and "no FP8 kernel" in str(exc.value)


def test_a_library_without_fk_last_flash_path_cannot_say_which_path_ran(tmp_path):
    fake = flash_kernel.load(gcc_so(tmp_path, "nopath", FAKE_ABI % B.ABI_VERSION))
    assert fake.last_flash_path() is None


# ---- lookup -------------------------------------------------------------------------------------

def test_default_build_dir_is_the_checkout_build(monkeypatch):
    monkeypatch.delenv("FLASH_KERNEL_BUILD", raising=False)
    assert flash_kernel.build_dir() == Path(flash_kernel.__file__).resolve().parent.parent / "build"


def test_library_for_uses_flash_kernel_build(monkeypatch, build_root, lib):
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    assert flash_kernel.library_for("cpu") is lib
    assert flash_kernel.library_for(torch.device("cpu")) is lib
    seed, gen = seeded()
    q, k, v = qkv((2, 2, 33, 64), (2, 2, 40, 64), gen=gen)
    assert torch.equal(flash_kernel.attention(q, k, v), lib.attention(q, k, v))
    assert torch.equal(flash_kernel.naive_attention(q, k, v), lib.naive_attention(q, k, v))


def test_library_for_cuda_names_the_target_to_build(monkeypatch, build_root, tmp_path):
    # a build folder holding the cpu library only (the shared one may also hold GPU builds by now)
    (tmp_path / "cpu").symlink_to(build_root / "cpu", target_is_directory=True)
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(tmp_path))
    monkeypatch.delenv("FLASH_KERNEL_TARGET", raising=False)
    with pytest.raises(flash_kernel.LibraryNotFound) as ei:
        flash_kernel.library_for("cuda:0")
    assert "sovereign-audit build --target sm_90" in str(ei.value) and "sm_80" in str(ei.value)
    monkeypatch.setenv("FLASH_KERNEL_TARGET", "sm_90-generic")
    with pytest.raises(flash_kernel.LibraryNotFound) as ei:
        flash_kernel.library_for("cuda")
    assert "--target sm_90-generic" in str(ei.value)


def test_library_for_an_empty_build_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(tmp_path))
    with pytest.raises(flash_kernel.LibraryNotFound) as ei:
        flash_kernel.library_for("cpu")
    assert "sovereign-audit build --target cpu" in str(ei.value)
    with pytest.raises(flash_kernel.KernelError):
        flash_kernel.library_for("mps")


# ---- Python checks mirror the C validation ------------------------------------------------------

def _bad_inputs():
    good = (1, 2, 8, 64)
    z = torch.zeros
    return [
        ("int64 dtype", lambda: (z(good, dtype=torch.int64),) * 3, {}, B.FK_ERR_DTYPE),
        ("float64 dtype", lambda: (z(good, dtype=torch.float64),) * 3, {}, B.FK_ERR_DTYPE),
        ("mixed dtypes", lambda: (z(good), z(good, dtype=torch.float16), z(good)), {}, B.FK_ERR_DTYPE),
        ("3-D q", lambda: (z(2, 8, 64), z(good), z(good)), {}, B.FK_ERR_SIZE),
        ("zero tokens", lambda: (z(1, 2, 0, 64), z(good), z(good)), {}, B.FK_ERR_SIZE),
        ("head dim 100", lambda: (z(1, 2, 8, 100),) * 3, {}, B.FK_ERR_HEAD_DIM),
        ("k and v differ", lambda: (z(good), z(1, 2, 9, 64), z(good)), {}, B.FK_ERR_SIZE),
        ("q and k heads differ", lambda: (z(good), z(1, 3, 8, 64), z(1, 3, 8, 64)), {}, B.FK_ERR_SIZE),
        ("unknown layout", lambda: (z(good),) * 3, {"layout": "bnd"}, B.FK_ERR_STRIDE),
        ("negative scale", lambda: (z(good),) * 3, {"scale": -1.0}, B.FK_ERR_SCALE),
        ("zero scale", lambda: (z(good),) * 3, {"scale": 0.0}, B.FK_ERR_SCALE),
        ("NaN scale", lambda: (z(good),) * 3, {"scale": float("nan")}, B.FK_ERR_SCALE),
        ("scale beyond fp32", lambda: (z(good),) * 3, {"scale": 1e300}, B.FK_ERR_SCALE),
        ("scale as text", lambda: (z(good),) * 3, {"scale": "0.5"}, B.FK_ERR_SCALE),
        ("scale as a bool", lambda: (z(good),) * 3, {"scale": True}, B.FK_ERR_SCALE),
        ("scale as a 2-element tensor", lambda: (z(good),) * 3, {"scale": torch.ones(2)}, B.FK_ERR_SCALE),
        ("not a tensor", lambda: ([[0.0]], z(good), z(good)), {}, B.FK_ERR_NULL_POINTER),
        ("meta tensors", lambda: (torch.empty(good, device="meta"),) * 3, {}, B.FK_ERR_NULL_POINTER),
        ("sparse q", lambda: (torch.ones(good).to_sparse(), z(good), z(good)), {}, B.FK_ERR_STRIDE),
        ("nested q", lambda: (torch.nested.nested_tensor([torch.ones(2, 8, 64), torch.ones(2, 5, 64)]), z(good),
                              z(good)), {}, B.FK_ERR_STRIDE),
    ]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
@pytest.mark.parametrize("label,make,kw,status", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_inputs_raise_kernel_error_with_the_c_status(lib, label, make, kw, status, naive):
    fn = lib.naive_attention if naive else lib.attention
    with pytest.raises(flash_kernel.KernelError) as ei:
        fn(*make(), **kw)
    assert ei.value.status == status, f"{label}: {ei.value.status_name} {ei.value}"
    assert "\n" not in str(ei.value) and str(ei.value)


def test_run_into_refuses_an_output_unlike_q(lib):
    q = torch.zeros(1, 2, 8, 64)
    for o in (torch.zeros(1, 2, 7, 64), torch.zeros(1, 2, 8, 64, dtype=torch.float16),
              torch.zeros(1, 2, 8, 128)[..., ::2]):
        with pytest.raises(flash_kernel.KernelError):
            lib.run_into(q, q, q, o, 0.0, "bhnd", naive=False)


def test_c_side_refuses_what_python_would(lib):
    """Both layers fail closed: the C validation answers even when Python checks are bypassed."""
    q = torch.zeros(1, 2, 8, 64)
    args = B.fill_args(q, q, q, q.clone(), "bhnd", 0.0, None)
    args.head_dim = 100
    assert lib._dll.fk_flash_forward(args) == B.FK_ERR_HEAD_DIM
    assert "head_dim 100" in lib.last_error()


# ---- layouts, strides, scale --------------------------------------------------------------------

def test_bnhd_layout_matches_transposed_bhnd(lib):
    seed, gen = seeded()
    q, k, v = qkv((2, 50, 3, 64), (2, 70, 3, 64), gen=gen)  # (B, N, H, D)
    out = lib.attention(q, k, v, layout="bnhd")
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert rel(out, ref) <= 1e-5, f"seed {seed}"


def test_d_stride_not_one_is_made_contiguous(lib):
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 64, 40), (1, 2, 64, 50), gen=gen)
    qt, kt, vt = (t.transpose(-1, -2) for t in (q, k, v))  # (1, 2, N, 64) with D stride != 1
    assert qt.stride(-1) != 1
    assert rel(lib.attention(qt, kt, vt), F.scaled_dot_product_attention(qt, kt, vt)) <= 1e-5, f"seed {seed}"


class _OnAGpu:
    """A CPU tensor's sizes, strides and pointer, presented as a GPU tensor's (is_cuda): what the
    binding's alignment rule reads, without a GPU."""

    is_cuda = True

    def __init__(self, t):
        self.t, self.shape = t, t.shape

    def stride(self):
        return self.t.stride()

    def element_size(self):
        return self.t.element_size()

    def data_ptr(self):
        return self.t.data_ptr()


def test_views_off_16_byte_loads_are_copied_for_a_gpu_library_only():
    """A GPU library loads 16 bytes at a time (fk::validate refuses anything else): a view one
    element into its rows, or with rows a multiple of neither, is not addressable there, so the
    binding copies it instead of passing on a refusal; the CPU library takes it as it is."""
    buf = torch.zeros(1, 2, 5, 72, dtype=torch.bfloat16)  # rows of 144 bytes
    assert buf.data_ptr() % 16 == 0
    aligned, shifted = buf[..., :64], buf[..., 1:65]
    odd_rows = torch.zeros(1, 2, 5, 67, dtype=torch.bfloat16)[..., :64]  # rows of 134 bytes
    assert B._addressable(_OnAGpu(aligned), "bhnd")
    assert not B._addressable(_OnAGpu(shifted), "bhnd")
    assert not B._addressable(_OnAGpu(odd_rows), "bhnd")
    assert B._addressable(_OnAGpu(shifted.contiguous()), "bhnd")
    for t in (aligned, shifted, odd_rows):
        assert B._addressable(t, "bhnd")  # the CPU library: no such loads


def test_broadcast_kv_with_zero_head_stride(lib):
    seed, gen = seeded()
    q = torch.randn(2, 4, 30, 64, generator=gen)
    k1, v1 = torch.randn(2, 1, 45, 64, generator=gen), torch.randn(2, 1, 45, 64, generator=gen)
    k, v = k1.expand(2, 4, 45, 64), v1.expand(2, 4, 45, 64)  # H stride 0: read in place
    assert k.stride(1) == 0
    assert rel(lib.attention(q, k, v), F.scaled_dot_product_attention(q, k.contiguous(), v.contiguous())) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_stands_in_for_sdpa_with_scale(lib, dtype):
    seed, gen = seeded()
    q, k, v = qkv((2, 3, 77, 128), (2, 3, 91, 128), dtype, gen)
    for scale in (None, 0.05):
        ours = lib.attention(q, k, v, scale=scale)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale)
        tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
        assert ours.dtype == dtype and rel(ours, ref) <= tol, f"seed {seed} scale {scale}"


def test_replaces_sdpa_inside_a_model(lib, monkeypatch, build_root):
    """A module written against F.scaled_dot_product_attention gives the same output when the
    function is swapped for flash_kernel.attention."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(128, 3 * 128)
            self.out = torch.nn.Linear(128, 128)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 64).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(o.transpose(1, 2).reshape(b, n, 128))

    seed, gen = seeded()
    torch.manual_seed(seed)
    model = Block().eval()
    x = torch.randn(2, 100, 128, generator=gen)
    calls = []

    def ours_sdpa(q, k, v, scale=None):
        calls.append(q.shape)
        return flash_kernel.attention(q, k, v, scale=scale)

    with torch.no_grad():
        ref = model(x)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", ours_sdpa)
        ours = model(x)
    assert calls == [(2, 2, 100, 64)]  # the swap really ran (else ours == ref would prove nothing)
    assert rel(ours, ref) <= 1e-5, f"seed {seed}"


# ---- the torch custom op ------------------------------------------------------------------------

def test_custom_ops_are_registered(lib):
    lib.attention(*(torch.zeros(1, 1, 2, 64),) * 3)  # registers the ops on first use
    assert hasattr(torch.ops.flash_kernel, "attention") and hasattr(torch.ops.flash_kernel, "naive_attention")
    schema = str(torch.ops.flash_kernel.attention.default._schema)
    assert schema.startswith("flash_kernel::attention(Tensor q, Tensor k, Tensor v, float scale, str layout")


def test_fake_implementation_gives_shape_without_running(lib):
    from torch._subclasses.fake_tensor import FakeTensorMode

    lib.attention(*(torch.zeros(1, 1, 2, 64),) * 3)
    with FakeTensorMode():
        q = torch.empty(2, 3, 4097, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 3, 100, 128, dtype=torch.bfloat16)
        out = torch.ops.flash_kernel.attention(q, k, k, 0.0, "bhnd", lib.path)
    assert out.shape == (2, 3, 4097, 128) and out.dtype == torch.bfloat16


def test_opcheck(lib):
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 17, 64), (1, 2, 23, 64), gen=gen)
    lib.attention(q, k, v)
    for op in (torch.ops.flash_kernel.attention, torch.ops.flash_kernel.naive_attention):
        torch.library.opcheck(op, (q, k, v, 0.0, "bhnd", lib.path),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_lse_ops_opcheck_and_fake_shapes(lib, layout):
    """The ops that return (out, lse): schema and fake implementation checked by opcheck, in both
    layouts (the lse is (B, H, Nq) either way, its memory dense in q's layout)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seed, gen = seeded()
    q, k, v = qkv((1, 2, 17, 64), (1, 2, 23, 64), gen=gen)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    lib.attention(q, k, v, layout=layout, return_lse=True)  # registers the ops
    for op in (torch.ops.flash_kernel.attention_lse, torch.ops.flash_kernel.naive_attention_lse):
        torch.library.opcheck(op, (q, k, v, 0.0, layout, lib.path), test_utils=("test_schema", "test_faketensor"))
        real_out, real_lse = op(q, k, v, 0.0, layout, lib.path)
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake_out, fake_lse = op(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), 0.0, layout,
                                    lib.path)
        assert (fake_out.shape, fake_lse.shape, fake_lse.stride()) == (real_out.shape, real_lse.shape, real_lse.stride())
        assert real_lse.shape == (1, 2, 17) and real_lse.dtype == torch.float32


def test_traced_by_torch_compile(lib):
    """Dynamo traces through the op (fake implementation) and the compiled call matches eager."""
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 33, 64), (1, 2, 40, 64), gen=gen)
    path = lib.path

    def f(q, k, v):
        return torch.ops.flash_kernel.attention(q * 2.0, k, v, 0.0, "bhnd", path) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(q, k, v), f(q, k, v), rtol=1e-6, atol=1e-6), f"seed {seed}"


def test_public_call_traced_by_torch_compile_fullgraph(build_root, monkeypatch):
    """flash_kernel.attention itself (not only the registered op) compiles with no graph break:
    the library lookup is not traced, and the compiled call matches eager bit for bit."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 33, 64), (1, 2, 40, 64), gen=gen)

    def f(q, k, v):
        return flash_kernel.attention(q * 2.0, k, v, scale=0.3) + flash_kernel.naive_attention(q, k, v)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v)), f"seed {seed}"


def test_public_call_traced_first_in_a_fresh_process(build_root):
    """The first call of a fresh process is the traced one (no eager call has loaded the op layer
    or looked the library up before): it still compiles with no graph break and matches eager."""
    code = (
        "import torch, flash_kernel\n"
        "g = torch.Generator().manual_seed(int.from_bytes(__import__('os').urandom(4), 'little'))\n"
        "q, k, v = (torch.randn(1, 2, 33, 64, generator=g) for _ in range(3))\n"
        "f = torch.compile(lambda q, k, v: flash_kernel.attention(q, k, v, scale=0.3), backend='aot_eager', fullgraph=True)\n"
        "out = f(q, k, v)\n"
        "assert torch.equal(out, flash_kernel.attention(q, k, v, scale=0.3))\n"
        "print('ok')\n")
    env = {**os.environ, "FLASH_KERNEL_BUILD": str(build_root), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_library_looked_up_once_per_device(build_root, monkeypatch):
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    monkeypatch.setattr(flash_kernel, "_by_device", {})
    monkeypatch.setattr(flash_kernel, "_kinds", {})  # and no input kind remembered from other tests
    monkeypatch.setattr(flash_kernel, "_last", ((), None))
    looked = []
    real = flash_kernel._find_library
    monkeypatch.setattr(flash_kernel, "_find_library", lambda kind: looked.append(kind) or real(kind))
    q, k, v = qkv((1, 1, 8, 64), (1, 1, 8, 64))
    first = flash_kernel.attention(q, k, v)
    second = flash_kernel.attention(q, k, v)
    assert looked == ["cpu"] and torch.equal(first, second)
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root) + os.sep)  # another setting: looked up again
    flash_kernel.attention(q, k, v)
    assert looked == ["cpu", "cpu"]


def test_public_call_names_a_sparse_input_after_a_dense_call_of_its_shape(build_root, monkeypatch):
    """The public call's remembered path reads strides, which a sparse tensor has none of: its
    error is the checks' one line, not torch's, whether or not a dense call of the shape came first."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    monkeypatch.setattr(flash_kernel, "_kinds", {})
    monkeypatch.setattr(flash_kernel, "_last", ((), None))
    q, k, v = qkv((1, 2, 8, 64), (1, 2, 8, 64))
    for dense_first in (False, True):
        if dense_first:
            flash_kernel.attention(q, k, v)
        for call in (flash_kernel.attention, flash_kernel.naive_attention):
            with pytest.raises(flash_kernel.KernelError) as ei:
                call(q.to_sparse(), k, v)
            assert str(ei.value) == "q is a sparse_coo tensor: pass a dense (strided) one, e.g. q.to_dense()"
            assert ei.value.status == B.FK_ERR_STRIDE


def test_an_input_that_requires_grad_is_refused_while_grad_mode_is_on(build_root, monkeypatch, lib):
    """Forward only: an output that silently carried no gradient back to q, k or v would train a
    model wrong, so the call is refused in grad mode, on the first call of a kind and on the
    remembered path alike, and runs under no_grad / inference_mode or on detached inputs."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    monkeypatch.setattr(flash_kernel, "_kinds", {})
    monkeypatch.setattr(flash_kernel, "_last", ((), None))
    q, k, v = qkv((1, 2, 8, 64), (1, 2, 8, 64))
    for fn in (flash_kernel.attention, flash_kernel.naive_attention, lib.attention, lib.naive_attention):
        expected = fn(q, k, v)  # a kind checked and remembered first
        for grad in ("q", "k", "v"):
            args = {"q": q, "k": k, "v": v}
            args[grad] = args[grad].clone().requires_grad_(True)
            with pytest.raises(flash_kernel.KernelError) as ei:
                fn(args["q"], args["k"], args["v"])
            assert "no backward pass and an input requires grad" in str(ei.value) and "\n" not in str(ei.value)
            with torch.no_grad():
                assert torch.equal(fn(args["q"], args["k"], args["v"]), expected)
            with torch.inference_mode():
                assert torch.equal(fn(args["q"], args["k"], args["v"]), expected)
            detached = {n: t.detach() for n, t in args.items()}
            assert torch.equal(fn(detached["q"], detached["k"], detached["v"]), expected)


def test_public_call_checks_each_new_kind_once(build_root, monkeypatch):
    """The public call checks inputs of a kind (shapes, strides, dtypes, devices, layout) in full
    once; later calls of the kind skip the checks but compute from their own tensors and scale;
    any other kind is checked, with the same errors as a first call."""
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(build_root))
    monkeypatch.setattr(flash_kernel, "_kinds", {})
    monkeypatch.setattr(flash_kernel, "_last", ((), None))
    monkeypatch.setattr(flash_kernel.library_for("cpu"), "_checked", {})  # nor by the library
    checked = []
    real = B.check_inputs
    monkeypatch.setattr(B, "check_inputs", lambda *a, **kw: checked.append(a[0].shape) or real(*a, **kw))
    seed, gen = seeded()

    def ref(q, k, v, scale=None):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale)

    for i in range(3):
        q, k, v = qkv((1, 2, 19, 64), (1, 2, 23, 64), gen=gen)
        for scale in (None, 0.3):
            assert rel(flash_kernel.attention(q, k, v, scale=scale), ref(q, k, v, scale)) <= 1e-5, f"seed {seed}"
    assert len(checked) == 1
    # the kind of the call before is remembered, and so is each other one
    q2, k2, v2 = qkv((1, 2, 7, 64), (1, 2, 9, 64), gen=gen)
    for q_, k_, v_ in ((q2, k2, v2), (q, k, v), (q2, k2, v2)):
        assert rel(flash_kernel.attention(q_, k_, v_), ref(q_, k_, v_)) <= 1e-5, f"seed {seed}"
    assert len(checked) == 2
    with pytest.raises(flash_kernel.KernelError) as ei:  # another head dim: checked, refused
        flash_kernel.attention(*qkv((1, 2, 19, 20), (1, 2, 23, 20)))
    assert ei.value.status == B.FK_ERR_HEAD_DIM and "head_dim 20" in str(ei.value)
    with pytest.raises(flash_kernel.KernelError) as ei:  # another dtype for v alone
        flash_kernel.attention(q, k, v.double())
    assert ei.value.status == B.FK_ERR_DTYPE
    with pytest.raises(flash_kernel.KernelError) as ei:  # the remembered kind, a bad scale
        flash_kernel.attention(q, k, v, scale=float("nan"))
    assert ei.value.status == B.FK_ERR_SCALE
    with pytest.raises(flash_kernel.KernelError) as ei:  # the remembered shapes in the other layout
        flash_kernel.attention(q, k, v, layout="bnhd")
    assert ei.value.status == B.FK_ERR_SIZE


def test_failed_lookup_is_not_remembered(tmp_path, build_root, monkeypatch):
    monkeypatch.setattr(flash_kernel, "_by_device", {})
    monkeypatch.setenv("FLASH_KERNEL_BUILD", str(tmp_path))
    with pytest.raises(flash_kernel.LibraryNotFound):
        flash_kernel.library_for("cpu")
    (tmp_path / "cpu").mkdir()
    shutil.copy(build_root / "cpu" / "libflash_kernel.so", tmp_path / "cpu" / "libflash_kernel.so")
    assert flash_kernel.library_for("cpu").target == "cpu"


def test_eager_call_and_registered_op_agree(lib):
    """The eager call goes straight to the C function; the op (the traced path) gives the same bits."""
    seed, gen = seeded()
    q, k, v = qkv((2, 3, 37, 64), (2, 3, 29, 64), gen=gen)
    for naive, op in ((False, torch.ops.flash_kernel.attention), (True, torch.ops.flash_kernel.naive_attention)):
        eager = lib.naive_attention(q, k, v, scale=0.2) if naive else lib.attention(q, k, v, scale=0.2)
        assert torch.equal(eager, op(q, k, v, 0.2, "bhnd", lib.path)), f"seed {seed}"


def test_repeated_calls_of_one_kind_use_each_calls_own_tensors(lib):
    """Calls of a shape seen before skip the checks and reuse the argument struct: every call must
    still read its own q, k, v and scale, including inputs the kernel cannot address (copied)."""
    seed, gen = seeded()

    def ref(q, k, v, scale):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale)

    for _ in range(3):
        q, k, v = qkv((1, 2, 19, 64), (1, 2, 23, 64), gen=gen)
        for scale in (None, 0.05):
            assert rel(lib.attention(q, k, v, scale=scale), ref(q, k, v, scale)) <= 1e-5, f"seed {seed}"
        # D stride 2: not addressable, so copied before each call (never remembered as a template)
        wide = torch.randn(1, 2, 23, 128, generator=gen)[..., ::2]
        assert rel(lib.attention(q, wide, v), ref(q, wide, v, None)) <= 1e-5, f"seed {seed}"
    with pytest.raises(B.KernelError):
        lib.attention(q, k, v, scale=-1.0)  # a bad scale is refused on the remembered path too


def test_output_is_dense_in_qs_logical_layout_on_repeated_calls(lib):
    """q a (B, N, H, D) view with other strides (a packed qkv; a transposed (B, H, N, D) tensor,
    dense but permuted): the output is a fresh dense tensor of q's shape and dtype, not q's strides,
    on the first call of the kind and on the remembered path."""
    seed, gen = seeded()
    packed = torch.randn(2, 40, 3, 2, 64, generator=gen)
    bhnd = [torch.randn(2, 2, 40, 64, generator=gen) for _ in range(3)]
    for q, k, v in ((packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]), tuple(t.transpose(1, 2) for t in bhnd)):
        assert not q.is_contiguous()
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2).double() for t in (q, k, v))).transpose(1, 2)
        outs = [lib.attention(q, k, v, layout="bnhd") for _ in range(3)]
        for out in outs:
            assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
            assert rel(out, ref) <= 1e-5, f"seed {seed}"
        assert len({o.data_ptr() for o in outs}) == 3  # each call its own output


@pytest.mark.parametrize("scale", [1e300, 1e-50, float("nan"), float("inf"), 0.0, -0.5, "x"], ids=repr)
def test_bad_scale_refused_on_the_remembered_path(lib, scale):
    q = torch.randn(1, 1, 5, 64)
    lib.attention(q, q, q)  # the kind is remembered: later calls skip the full checks
    with pytest.raises(B.KernelError) as ei:
        lib.attention(q, q, q, scale=scale)
    assert ei.value.status == B.FK_ERR_SCALE


def test_scales_at_fp32_bounds_on_the_remembered_path(lib):
    """Scales past the quick range check still take the full one: a subnormal fp32 is accepted,
    an int is a number like any other."""
    seed, gen = seeded()
    q, k, v = qkv((1, 2, 7, 64), (1, 2, 9, 64), gen=gen)
    lib.attention(q, k, v)
    for scale in (1e-40, 2):
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=float(scale))
        assert rel(lib.attention(q, k, v, scale=scale), ref) <= 1e-5, f"scale {scale} seed {seed}"


def test_fake_tensors_take_the_registered_op(lib):
    """A tensor subclass (here FakeTensor) is never handed to the C function: it goes through the op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 2, 4099, 64)
        out = lib.attention(q, q, q)
    assert out.shape == (1, 2, 4099, 64)


# ---- CUDA (run on the device machine) -----------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_cuda_current_stream_and_graph_capture():
    lib = flash_kernel.library_for("cuda")
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = (torch.randn(1, 4, 1000, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # launched on the current (side) stream
        out = lib.attention(q, k, v)
    side.synchronize()
    assert rel(out, ref) <= 1e-2
    static_q = q.clone()
    lib.attention(static_q, k, v)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = lib.attention(static_q, k, v)
    static_q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref2 = F.scaled_dot_product_attention(static_q.double(), k.double(), v.double())
    assert rel(static_out, ref2) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_cuda_public_call_compiled_fullgraph_on_a_side_stream():
    """The public call under torch.compile(fullgraph=True) on the GPU, launched on a non-default
    stream, against a float64 reference on fresh inputs (output poisoned first by the allocator's
    reuse: a NaN-filled tensor is freed right before)."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = (torch.randn(2, 3, 777, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: flash_kernel.attention(q, k, v), fullgraph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        poison = torch.full_like(q, float("nan"))
        del poison
        out = compiled(q, k, v)
    side.synchronize()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert torch.isfinite(out).all() and rel(out, ref) <= 1e-2

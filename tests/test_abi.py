"""The C ABI of the CPU library, called through raw ctypes: every bad argument is refused with
its documented fk_status and a message, before any memory is touched."""

from __future__ import annotations

import ctypes
import math
import threading

import pytest

torch = pytest.importorskip("torch")

from audit.kernel_build.builder import ensure_built  # noqa: E402
from flash_kernel import _binding as B  # noqa: E402


@pytest.fixture(scope="module")
def dll(fixture_root):
    # the same build folder as tests/test_kernel_cpu.py: built once, reused while its provenance matches
    tb = ensure_built(["cpu"], fixture_root / "fk_build").get("cpu")
    assert tb.status == "built", tb.reason
    d = ctypes.CDLL(tb.library)
    d.fk_flash_forward.argtypes = d.fk_naive_forward.argtypes = [ctypes.POINTER(B.AttentionArgs)]
    d.fk_flash_forward.restype = d.fk_naive_forward.restype = ctypes.c_int32
    d.fk_workspace_bytes.argtypes = [ctypes.POINTER(B.AttentionArgs), ctypes.POINTER(ctypes.c_int64)]
    d.fk_workspace_bytes.restype = ctypes.c_int32
    d.fk_last_error.restype = ctypes.c_char_p
    d.fk_target.restype = d.fk_flash_path.restype = ctypes.c_char_p
    d.fk_supported_head_dims.argtypes = [ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]
    return d


@pytest.fixture()
def good():
    """A valid (B,H,N,D) = (1,2,8,64) fp32 call, its tensors kept alive by the fixture."""
    q, k, v = (torch.randn(1, 2, 8, 64) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    args = B.fill_args(q, k, v, o, "bhnd", 0.0, None)
    return args, (q, k, v, o)


def call(dll, args, naive=False):
    fn = dll.fk_naive_forward if naive else dll.fk_flash_forward
    status = fn(ctypes.byref(args) if args is not None else None)
    return status, dll.fk_last_error().decode()


def test_getters(dll):
    assert dll.fk_abi_version() == 3 == B.ABI_VERSION
    assert dll.fk_target() == b"cpu"
    assert dll.fk_flash_path() == b"cpu"
    n = dll.fk_supported_head_dims(None, 0)
    dims = (ctypes.c_int32 * n)()
    assert dll.fk_supported_head_dims(dims, n) == n
    assert {64, 128} <= set(dims) and 100 not in set(dims)
    # a short buffer is filled only up to its capacity
    two = (ctypes.c_int32 * 3)(-1, -1, -1)
    assert dll.fk_supported_head_dims(two, 2) == n
    assert two[2] == -1


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
def test_valid_call_succeeds_and_clears_the_error(dll, good, naive):
    args, (_, _, _, o) = good
    bad = B.AttentionArgs()
    bad.abi_version = B.ABI_VERSION
    assert call(dll, bad, naive)[0] != 0 and dll.fk_last_error()  # leaves a message behind
    status, msg = call(dll, args, naive)
    assert status == B.FK_OK and msg == ""
    assert not torch.isnan(o).any()


def _mutations():
    def null(field):
        return lambda a: setattr(a, field, None)

    def setf(field, value):
        return lambda a: setattr(a, field, value)

    def stride(name, i, value):
        return lambda a: getattr(a, name).__setitem__(i, value)

    def lse(stride=(16, 8, 1), offset=0):  # a float buffer owned by the struct's `good` fixture
        def mutate(a):
            a.lse = a.o + offset  # inside o's (NaN) buffer: a refusal leaves it as it was
            a.lse_stride[:] = stride
        return mutate

    return [
        ("args NULL", None, B.FK_ERR_NULL_POINTER, "args"),
        ("q NULL", null("q"), B.FK_ERR_NULL_POINTER, "non-NULL"),
        ("k NULL", null("k"), B.FK_ERR_NULL_POINTER, "non-NULL"),
        ("v NULL", null("v"), B.FK_ERR_NULL_POINTER, "non-NULL"),
        ("o NULL", null("o"), B.FK_ERR_NULL_POINTER, "non-NULL"),
        ("dtype 7", setf("dtype", 7), B.FK_ERR_DTYPE, "dtype 7"),
        ("dtype -1", setf("dtype", -1), B.FK_ERR_DTYPE, "dtype -1"),
        ("head dim 100", setf("head_dim", 100), B.FK_ERR_HEAD_DIM, "head_dim 100"),
        ("batch 0", setf("batch", 0), B.FK_ERR_SIZE, ">= 1"),
        ("heads 0", setf("heads", 0), B.FK_ERR_SIZE, ">= 1"),
        ("nq 0", setf("nq", 0), B.FK_ERR_SIZE, ">= 1"),
        ("nk -5", setf("nk", -5), B.FK_ERR_SIZE, ">= 1"),
        ("head dim 0", setf("head_dim", 0), B.FK_ERR_SIZE, ">= 1"),
        ("overflowing q stride", stride("q_stride", 2, 2**62), B.FK_ERR_SIZE, "overflow"),
        ("overflowing heads", setf("heads", 2**62), B.FK_ERR_SIZE, "overflow"),
        ("overflowing o stride", stride("o_stride", 2, 2**61), B.FK_ERR_SIZE, "overflow"),
        ("negative k stride", stride("k_stride", 1, -64), B.FK_ERR_STRIDE, "negative"),
        ("overlapping v rows", stride("v_stride", 2, 32), B.FK_ERR_STRIDE, "smaller than head_dim"),
        ("negative scale", setf("scale", -0.125), B.FK_ERR_SCALE, "scale"),
        ("NaN scale", setf("scale", math.nan), B.FK_ERR_SCALE, "scale"),
        ("infinite scale", setf("scale", math.inf), B.FK_ERR_SCALE, "scale"),
        ("abi_version 1", setf("abi_version", 1), B.FK_ERR_ABI, "ABI"),  # a caller of the ABI before lse
        ("abi_version 2", setf("abi_version", 2), B.FK_ERR_ABI, "ABI"),  # a caller before precision
        ("abi_version 4", setf("abi_version", 4), B.FK_ERR_ABI, "ABI"),
        ("abi_version 0", setf("abi_version", 0), B.FK_ERR_ABI, "ABI"),
        ("negative lse stride", lse(stride=(16, -8, 1)), B.FK_ERR_STRIDE, "lse_stride[1] is negative"),
        ("overflowing lse stride", lse(stride=(16, 8, 2**62)), B.FK_ERR_SIZE, "lse: sizes and strides overflow"),
        ("lse rows on one element", lse(stride=(16, 8, 0)), B.FK_ERR_STRIDE, "lse_stride[2] is 0"),
        ("misaligned lse", lse(offset=2), B.FK_ERR_ALIGNMENT, "lse is not 4-byte aligned"),
        ("precision 2", setf("precision", 2), B.FK_ERR_PRECISION, "precision 2 is not exact (0) or fp8 (1)"),
        ("precision -1", setf("precision", -1), B.FK_ERR_PRECISION, "precision -1"),
    ]


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
@pytest.mark.parametrize("label,mutate,status,needle", _mutations(), ids=[m[0] for m in _mutations()])
def test_bad_arguments_are_refused(dll, good, label, mutate, status, needle, naive):
    args, (_, _, _, o) = good
    if mutate is not None:
        mutate(args)
    got, msg = call(dll, args if mutate is not None else None, naive)
    assert got == status, f"{label}: status {got} ({B.STATUS_NAMES.get(got)}), message {msg!r}"
    assert needle.lower() in msg.lower(), f"{label}: message {msg!r}"
    assert torch.isnan(o).all(), f"{label}: the output was written although the call was refused"


def test_last_error_is_per_thread(dll, good):
    args, _ = good
    bad = B.AttentionArgs()
    bad.abi_version = B.ABI_VERSION
    bad.dtype = 7
    seen = {}

    def other():
        seen["status"] = call(dll, args)[0]
        seen["msg"] = dll.fk_last_error().decode()

    assert call(dll, bad)[0] != 0  # this thread holds an error...
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {"status": 0, "msg": ""}  # ...the other thread's success does not clear it
    assert "non-NULL" in dll.fk_last_error().decode()


def test_naive_workspace_that_cannot_exist_is_no_memory(dll):
    """A score matrix of nq * nk floats beyond any address space: FK_ERR_NO_MEMORY before any
    allocation or read (the buffers behind these pointers are tiny on purpose)."""
    buf = torch.zeros(64)
    a = B.AttentionArgs()
    a.abi_version, a.dtype = B.ABI_VERSION, B.FK_DTYPE_F32
    a.q = a.k = a.v = a.o = buf.data_ptr()
    a.batch = a.heads = 1
    a.nq = a.nk = 2**31
    a.head_dim = 64
    for s in (a.q_stride, a.k_stride, a.v_stride, a.o_stride):
        s[:] = [0, 0, 64]  # extents fit in int64; the 2^62-float workspace does not fit anywhere
    status, msg = call(dll, a, naive=True)
    assert status == B.FK_ERR_NO_MEMORY, msg


def test_argument_struct_matches_the_header(tmp_path):
    """The binding's AttentionArgs has the header's layout: every field's offset and the size, as
    the C compiler lays fk_attention_args out (ABI 2 appends lse and lse_stride, ABI 3 the
    precision and its workspace)."""
    import shutil
    import subprocess
    from pathlib import Path

    gcc = shutil.which("gcc") or pytest.skip("no gcc")
    include = Path(__file__).resolve().parent.parent / "flash_kernel" / "include"
    fields = [name for name, _ in B.AttentionArgs._fields_]
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"flash_kernel.h\"\nint main(void) {\n"
                   + "".join(f'  printf("{f} %zu\\n", offsetof(fk_attention_args, {f}));\n' for f in fields)
                   + '  printf("sizeof %zu\\n", sizeof(fk_attention_args));\n  return 0;\n}\n')
    exe = tmp_path / "layout"
    subprocess.run([gcc, "-I", str(include), str(src), "-o", str(exe)], check=True, capture_output=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                       check=True).stdout.splitlines())
    assert {f: int(got[f]) for f in fields} == {f: getattr(B.AttentionArgs, f).offset for f in fields}
    assert int(got["sizeof"]) == ctypes.sizeof(B.AttentionArgs)
    assert fields[-5:] == ["lse", "lse_stride", "precision", "workspace", "workspace_bytes"]


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
def test_lse_is_written_only_where_asked(dll, good, naive):
    """lse NULL (the default): nothing but o is written; set: every row's log-sum-exp, and nothing
    past the rows its strides name."""
    args, (q, k, _, o) = good
    assert args.lse is None
    assert call(dll, args, naive) == (B.FK_OK, "")
    buf = torch.full((1, 2, 8, 3), float("nan"))
    args.lse = buf.data_ptr()
    args.lse_stride[:] = (48, 24, 3)  # element 0 of each (b, h, i) triple
    o.fill_(float("nan"))
    assert call(dll, args, naive) == (B.FK_OK, "")
    ref = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) / 8.0, dim=-1)
    assert (buf[..., 0].double() - ref).abs().max().item() < 1e-5
    assert torch.isnan(buf[..., 1:]).all() and not torch.isnan(o).any()


@pytest.mark.parametrize("naive", [False, True], ids=["flash", "naive"])
def test_fp8_is_refused_by_the_cpu_library_before_anything_is_written(dll, good, naive):
    """The CPU target has no FP8 kernel (flash_kernel.fp8 is its reference, in Python), and the
    naive path is the exact oracle: precision fp8 is FK_ERR_PRECISION, o untouched."""
    args, (_, _, _, o) = good
    o.fill_(float("nan"))
    args.precision = B.FK_PRECISION_FP8
    status, msg = call(dll, args, naive)
    assert status == B.FK_ERR_PRECISION
    assert ("oracle" in msg) if naive else ("cpu target" in msg and "sm_90a" in msg)
    assert torch.isnan(o).all()


def test_workspace_bytes(dll, good):
    """fk_workspace_bytes: 0 for exact; FK_ERR_PRECISION for fp8 on the CPU target; the argument
    checks of a call (a bad head dim, a NULL `bytes`) with *bytes set to 0."""
    args, _ = good
    n = ctypes.c_int64(-1)
    assert dll.fk_workspace_bytes(ctypes.byref(args), ctypes.byref(n)) == B.FK_OK and n.value == 0
    args.precision = B.FK_PRECISION_FP8
    n.value = -1
    assert dll.fk_workspace_bytes(ctypes.byref(args), ctypes.byref(n)) == B.FK_ERR_PRECISION and n.value == 0
    args.precision, args.head_dim = B.FK_PRECISION_EXACT, 100
    assert dll.fk_workspace_bytes(ctypes.byref(args), ctypes.byref(n)) == B.FK_ERR_HEAD_DIM
    assert dll.fk_workspace_bytes(ctypes.byref(args), None) == B.FK_ERR_NULL_POINTER

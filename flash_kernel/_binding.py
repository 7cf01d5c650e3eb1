"""ctypes view of flash_kernel.h: the argument struct, the errors and `Library`.

Every check the C side makes (fk::validate in src/fk_common.h) is made here first, with the same
status codes, so a bad call fails closed in Python with a clear message, and anything that slips
past Python is still refused by the library. torch is imported only when tensors are used, so
`load(path).target` works without it.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from pathlib import Path

ABI_VERSION = 3  # FK_ABI_VERSION of flash_kernel.h (2: the log-sum-exp output; 3: precision, workspace)

# fk_status (flash_kernel.h)
FK_OK = 0
FK_ERR_NULL_POINTER = 1
FK_ERR_DTYPE = 2
FK_ERR_HEAD_DIM = 3
FK_ERR_SIZE = 4
FK_ERR_STRIDE = 5
FK_ERR_ALIGNMENT = 6
FK_ERR_SCALE = 7
FK_ERR_LAUNCH = 8
FK_ERR_NO_MEMORY = 9
FK_ERR_ABI = 10
FK_ERR_PRECISION = 11
FK_ERR_WORKSPACE = 12
STATUS_NAMES = {
    FK_OK: "FK_OK",
    FK_ERR_NULL_POINTER: "FK_ERR_NULL_POINTER",
    FK_ERR_DTYPE: "FK_ERR_DTYPE",
    FK_ERR_HEAD_DIM: "FK_ERR_HEAD_DIM",
    FK_ERR_SIZE: "FK_ERR_SIZE",
    FK_ERR_STRIDE: "FK_ERR_STRIDE",
    FK_ERR_ALIGNMENT: "FK_ERR_ALIGNMENT",
    FK_ERR_SCALE: "FK_ERR_SCALE",
    FK_ERR_LAUNCH: "FK_ERR_LAUNCH",
    FK_ERR_NO_MEMORY: "FK_ERR_NO_MEMORY",
    FK_ERR_ABI: "FK_ERR_ABI",
    FK_ERR_PRECISION: "FK_ERR_PRECISION",
    FK_ERR_WORKSPACE: "FK_ERR_WORKSPACE",
}

# fk_precision
FK_PRECISION_EXACT = 0
FK_PRECISION_FP8 = 1

# fk_dtype
FK_DTYPE_F32 = 0
FK_DTYPE_F16 = 1
FK_DTYPE_BF16 = 2

LAYOUTS = ("bhnd", "bnhd")
REQUIRED_SYMBOLS = ("fk_abi_version", "fk_target", "fk_flash_path", "fk_supported_head_dims",
                    "fk_last_error", "fk_flash_forward", "fk_naive_forward")


class KernelError(Exception):
    """A refused or failed call: `status` is the fk_status code (None: not from a call)."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, None) if status is not None else None
        self.message = " ".join(str(message).split())  # one line: may quote untrusted text
        super().__init__(self.message)


class LibraryNotFound(KernelError):
    """No library where one was looked for; the message says how to build it."""


class AbiMismatch(KernelError):
    """The library's fk_abi_version() is not the ABI this binding speaks."""


class AttentionArgs(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("nq", ctypes.c_int64),
        ("nk", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("o_stride", ctypes.c_int64 * 3),
        ("scale", ctypes.c_float),
        ("stream", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),  # ABI 2: fp32 (B, H, nq) log-sum-exp, or NULL
        ("lse_stride", ctypes.c_int64 * 3),
        ("precision", ctypes.c_int32),  # ABI 3: fk_precision
        ("workspace", ctypes.c_void_p),  # ABI 3: device memory of fk_workspace_bytes, or NULL
        ("workspace_bytes", ctypes.c_int64),
    ]


def _dtype_code(dtype) -> int | None:
    import torch

    return {torch.float32: FK_DTYPE_F32, torch.float16: FK_DTYPE_F16, torch.bfloat16: FK_DTYPE_BF16}.get(dtype)


def _bhnd(t, layout: str) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """(B, H, N, D) sizes and element strides of a tensor in `layout`."""
    if layout == "bhnd":
        return tuple(t.shape), tuple(t.stride())
    b, n, h, d = t.shape
    sb, sn, sh, sd = t.stride()
    return (b, h, n, d), (sb, sh, sn, sd)


VECTOR_BYTES = 16  # fk::kVectorBytes: the GPU library's flash paths load 16 bytes at a time


def _addressable(t, layout: str) -> bool:
    """True when the kernels can address `t` through its strides as it is (mirrors fk::validate):
    D stride 1, rows apart, and on a GPU aligned for its 16-byte loads (_aligned)."""
    (_, _, n, d), (sb, sh, sn, sd) = _bhnd(t, layout)
    if sd != 1 or min(sb, sh, sn) < 0:
        return False
    return (n <= 1 or sn >= d) and _aligned(t, (sb, sh, sn))  # rows may not overlap


def _aligned(t, strides) -> bool:
    """On a GPU, the pointer and the B/H/N strides (elements) in whole 16-byte loads, as the flash
    paths load (a view one element into its rows is copied, not refused); on the CPU, always."""
    if not t.is_cuda:
        return True
    es = t.element_size()
    return t.data_ptr() % VECTOR_BYTES == 0 and all(s * es % VECTOR_BYTES == 0 for s in strides)


def resolve_scale(scale, head_dim: int) -> float:
    """The C ABI's scale: 0.0 means the library's default 1/sqrt(D)."""
    if scale is None:
        return 0.0
    if isinstance(scale, (str, bytes, bool)):  # float() would take "0.5" and True: SDPA's scale does not
        raise KernelError(f"scale must be a number, not {type(scale).__name__}", FK_ERR_SCALE)
    try:
        s = float(scale)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one element
        raise KernelError(f"scale must be a number, not {type(scale).__name__}", FK_ERR_SCALE) from None
    if not math.isfinite(s) or s <= 0.0:
        raise KernelError(f"scale must be positive and finite (got {s!r}); None means 1/sqrt(D)", FK_ERR_SCALE)
    if not math.isfinite(float(ctypes.c_float(s).value)) or ctypes.c_float(s).value <= 0.0:
        raise KernelError(f"scale {s!r} does not fit in a positive fp32", FK_ERR_SCALE)
    return s


# The kernel has no backward: an output computed from inputs that require grad would silently carry
# no gradient back to them, so such a call is refused while grad mode is on.
NO_BACKWARD = ("flash_kernel has no backward pass and an input requires grad: call it under torch.no_grad() "
               "or torch.inference_mode(), or pass detached tensors")


def check_inputs(q, k, v, layout: str, head_dims: tuple[int, ...] | None = None):
    """Validate q, k, v as the C side does; returns (q, k, v) made addressable (D stride 1)."""
    import torch

    if layout not in LAYOUTS:
        raise KernelError(f"layout must be 'bhnd' or 'bnhd', not {layout!r}", FK_ERR_STRIDE)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{name} must be a torch.Tensor, not {type(t).__name__}", FK_ERR_NULL_POINTER)
        # sparse, nested, mkldnn...: no strides the kernel could address
        if t.is_nested:
            raise KernelError(f"{name} is a nested tensor: pass a dense 4-D one (e.g. {name}.to_padded_tensor(0.0))",
                              FK_ERR_STRIDE)
        if t.layout != torch.strided:
            raise KernelError(f"{name} is a {str(t.layout).removeprefix('torch.')} tensor: pass a dense (strided) "
                              f"one, e.g. {name}.to_dense()", FK_ERR_STRIDE)
        if t.dim() != 4:
            raise KernelError(f"{name} must be 4-D ({layout.upper()}), got shape {tuple(t.shape)}", FK_ERR_SIZE)
        if t.numel() == 0:
            raise KernelError(f"{name} has a zero size: shape {tuple(t.shape)}", FK_ERR_SIZE)
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}", FK_ERR_DTYPE)
    if _dtype_code(q.dtype) is None:
        raise KernelError(f"dtype {q.dtype} is not float32, float16 or bfloat16", FK_ERR_DTYPE)
    if not (q.device == k.device == v.device):
        raise KernelError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}", FK_ERR_NULL_POINTER)
    (bq, hq, _, dq), _ = _bhnd(q, layout)
    (bk, hk, nk, dk), _ = _bhnd(k, layout)
    (bv, hv, nv, dv), _ = _bhnd(v, layout)
    if (bk, hk, nk, dk) != (bv, hv, nv, dv):
        raise KernelError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}", FK_ERR_SIZE)
    if (bq, hq, dq) != (bk, hk, dk):
        raise KernelError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch, heads or head_dim "
                          f"(layout {layout})", FK_ERR_SIZE)
    if head_dims is not None and dq not in head_dims:
        raise KernelError(f"head_dim {dq} is not supported by this library (supported: "
                          f"{', '.join(map(str, head_dims))})", FK_ERR_HEAD_DIM)
    return tuple(t if _addressable(t, layout) else t.contiguous() for t in (q, k, v))


def lse_like(q, layout: str):
    """The log-sum-exp output of a call on q: float32, shape (B, H, Nq), dense in q's layout (for
    "bnhd" its memory is (B, Nq, H), so lse.transpose(1, 2) is contiguous: the layout diffusers
    and FlashAttention's context-parallel code merge partial results in)."""
    import torch

    if layout == "bhnd":
        return torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    b, n, h, _ = q.shape
    return torch.empty((b, n, h), dtype=torch.float32, device=q.device).transpose(1, 2)


def fill_args(q, k, v, o, layout: str, scale: float, stream: int | None, lse=None) -> AttentionArgs:
    """The C argument struct of a call; `lse`, a float32 (B, H, Nq) tensor (or None), is given
    through its strides (its shape is taken to be right: the callers allocate it)."""
    a = AttentionArgs()
    a.abi_version = ABI_VERSION
    a.dtype = _dtype_code(q.dtype)
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    (a.batch, a.heads, a.nq, a.head_dim), sq = _bhnd(q, layout)
    (_, _, a.nk, _), sk = _bhnd(k, layout)
    _, sv = _bhnd(v, layout)
    _, so = _bhnd(o, layout)
    a.q_stride[:] = sq[:3]
    a.k_stride[:] = sk[:3]
    a.v_stride[:] = sv[:3]
    a.o_stride[:] = so[:3]
    a.scale = scale
    a.stream = stream
    if lse is not None:
        a.lse = lse.data_ptr()
        a.lse_stride[:] = lse.stride()
    return a


class Library:
    """One loaded flash_kernel shared object (ours for any target, or anything exporting the ABI)."""

    def __init__(self, path: str | os.PathLike):
        p = Path(path)
        if p.is_dir():
            p = p / "libflash_kernel.so"
        if not p.is_file():
            raise LibraryNotFound(f"no flash_kernel library at {str(p)!r}; build one with "
                                  f"`sovereign-audit build --target cpu` (or the target you need)")
        self.path = str(p.resolve())
        try:
            self._dll = ctypes.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise KernelError(f"cannot load {self.path!r}: {exc}") from None
        missing = [s for s in REQUIRED_SYMBOLS if not hasattr(self._dll, s)]
        if missing:
            raise KernelError(f"{self.path!r} does not export the flash_kernel C ABI (missing "
                              f"{', '.join(missing)})")
        d = self._dll
        d.fk_abi_version.restype = ctypes.c_int32
        d.fk_abi_version.argtypes = []
        for name in ("fk_target", "fk_flash_path", "fk_last_error"):
            getattr(d, name).restype = ctypes.c_char_p
            getattr(d, name).argtypes = []
        d.fk_supported_head_dims.restype = ctypes.c_int32
        d.fk_supported_head_dims.argtypes = [ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]
        for name in ("fk_flash_forward", "fk_naive_forward"):
            getattr(d, name).restype = ctypes.c_int32
            getattr(d, name).argtypes = [ctypes.POINTER(AttentionArgs)]
        # Optional within ABI 3: a library without it has no path that needs a workspace (no FP8).
        self._workspace_bytes = getattr(d, "fk_workspace_bytes", None)
        if self._workspace_bytes is not None:
            self._workspace_bytes.restype = ctypes.c_int32
            self._workspace_bytes.argtypes = [ctypes.POINTER(AttentionArgs), ctypes.POINTER(ctypes.c_int64)]
        self.abi_version = int(d.fk_abi_version())
        if self.abi_version != ABI_VERSION:
            raise AbiMismatch(f"{self.path!r} implements flash_kernel ABI {self.abi_version}; this binding "
                              f"speaks ABI {ABI_VERSION}: rebuild it with `sovereign-audit build`", FK_ERR_ABI)
        self.target = self._string(d.fk_target())
        self.flash_path = self._string(d.fk_flash_path())
        n = int(d.fk_supported_head_dims(None, 0))
        if not 0 <= n <= 64:
            raise KernelError(f"{self.path!r}: fk_supported_head_dims reports {n} head dims")
        buf = (ctypes.c_int32 * max(n, 1))()
        d.fk_supported_head_dims(buf, n)
        self.head_dims = tuple(int(x) for x in buf[:n])
        # Optional within ABI 1 (libraries built before it lack it): the path the last call ran.
        self._ran_path = getattr(d, "fk_last_flash_path", None)
        if self._ran_path is not None:
            self._ran_path.restype = ctypes.c_char_p
            self._ran_path.argtypes = []
        self._checked: dict[tuple, _Kind | bool] = {}  # input kinds already checked (see _call)
        self._forwards = (d.fk_flash_forward, d.fk_naive_forward)  # read on every call: no lookups
        self._host = self.target == "cpu"

    @staticmethod
    def _string(raw) -> str:
        return (raw or b"").decode("utf-8", "replace")

    @property
    def is_host(self) -> bool:
        """True for the CPU target: pointers are host pointers."""
        return self._host

    def last_error(self) -> str:
        return self._string(self._dll.fk_last_error())

    def last_flash_path(self) -> str | None:
        """The flash path ("wgmma", "mma_sync", "generic", "cpu") that the last flash call on this
        thread ran; "" when it was refused or failed; None when the library cannot say (built
        before fk_last_flash_path). Read it right after the call, on the calling thread."""
        if self._ran_path is None:
            return None
        return self._string(self._ran_path())

    def __repr__(self) -> str:
        return f"Library(target={self.target!r}, flash_path={self.flash_path!r}, path={self.path!r})"

    # -- calls ------------------------------------------------------------------------------------
    def check_device(self, device) -> None:
        if self.is_host and device.type != "cpu":
            raise KernelError(f"the {self.target} library takes CPU tensors, got {device}", FK_ERR_NULL_POINTER)
        if not self.is_host and device.type != "cuda":
            raise KernelError(f"the {self.target} library takes GPU (cuda) tensors, got {device}",
                              FK_ERR_NULL_POINTER)

    def run_into(self, q, k, v, o, scale: float, layout: str, naive: bool, lse=None) -> None:
        """Call the C forward writing into `o` (allocated by the caller, shaped like q) and, where
        given, the log-sum-exp into `lse` (float32, (B, H, Nq), any non-negative strides). `scale`
        0.0 or None means 1/sqrt(D). Allocates nothing itself (inputs whose D stride is not 1 are
        copied first), so it is the body of the custom op and safe inside a CUDA graph capture."""
        import torch

        q, k, v = check_inputs(q, k, v, layout, self.head_dims)
        self.check_device(q.device)
        # o is written through raw pointers: it must be exactly q's shape, dtype and device, with
        # rows the kernel can address, or the C side would write outside it.
        if not isinstance(o, torch.Tensor) or o.shape != q.shape or o.dtype != q.dtype or o.device != q.device:
            raise KernelError(f"o must be a tensor shaped like q {tuple(q.shape)} {q.dtype} on {q.device}",
                              FK_ERR_SIZE)
        if not _addressable(o, layout):
            strides = _bhnd(o, layout)[1]
            if strides[3] == 1 and not _aligned(o, strides[:3]):
                raise KernelError(f"o is not {VECTOR_BYTES}-byte aligned (pointer {o.data_ptr() % VECTOR_BYTES} bytes "
                                  f"off, strides {tuple(o.stride())}): the GPU library writes it "
                                  f"{VECTOR_BYTES} bytes at a time", FK_ERR_ALIGNMENT)
            raise KernelError(f"o's strides {tuple(o.stride())} are not addressable (D stride 1, rows apart)",
                              FK_ERR_STRIDE)
        if lse is not None:
            shape = _bhnd(q, layout)[0][:3]
            if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != shape or lse.dtype != torch.float32 \
                    or lse.device != q.device or lse.layout != torch.strided:
                raise KernelError(f"lse must be a float32 tensor of shape {shape} (B, H, Nq) on {q.device}", FK_ERR_SIZE)
            if min(lse.stride()) < 0 or (shape[2] > 1 and lse.stride(2) < 1):
                raise KernelError(f"lse's strides {tuple(lse.stride())} are not addressable (non-negative, "
                                  f"rows apart)", FK_ERR_STRIDE)
        s = 0.0 if scale is None or (isinstance(scale, (int, float)) and scale == 0) else resolve_scale(scale, 0)
        self._launch(q, k, v, o, s, layout, naive, lse)

    def _launch(self, q, k, v, o, scale: float, layout: str, naive: bool, lse=None) -> None:
        """The C call on checked arguments: on q's device and torch's current stream there."""
        self._invoke(fill_args(q, k, v, o, layout, scale, None, lse), q.device, naive)

    def _invoke(self, args: AttentionArgs, device, naive: bool) -> None:
        fn = self._dll.fk_naive_forward if naive else self._dll.fk_flash_forward
        if device.type == "cuda":
            api = _torch_api()
            index = device.index if device.index is not None else api.current_device()
            self._status(_call_on_device(api, fn, args, index), naive)
        else:
            self._status(fn(ctypes.byref(args)), naive)

    def _status(self, status: int, naive: bool) -> None:
        if status != FK_OK:
            name = STATUS_NAMES.get(status, f"status {status}")
            raise KernelError(f"{'fk_naive_forward' if naive else 'fk_flash_forward'} failed: {name}: "
                              f"{self.last_error()}", status)

    def fp8_attention(self, q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False,
                      workspace=None):
        """precision="fp8" through the library's FP8 kernel (flash_kernel.fp8's numerics): a new
        output shaped like q (and the lse, as `attention`). The workspace the library names is
        allocated on q's device for the call, or `workspace` (a contiguous uint8 tensor on q's
        device, 16-byte aligned, at least that large) is used, so a caller can reuse it or read
        the quantized operands the kernel left there. A library or device without the kernel
        refuses it (KernelError, status FK_ERR_PRECISION); nothing falls back to exact attention."""
        import torch

        if self._workspace_bytes is None:
            raise KernelError(f"{self.path!r} exports no fk_workspace_bytes: it has no FP8 kernel", FK_ERR_PRECISION)
        q, k, v = check_inputs(q, k, v, layout, self.head_dims)
        self.check_device(q.device)
        s = resolve_scale(scale, _bhnd(q, layout)[0][3])
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = lse_like(q, layout) if return_lse else None
        args = fill_args(q, k, v, o, layout, s, None, lse)
        args.precision = FK_PRECISION_FP8
        need = ctypes.c_int64(0)
        status = self._workspace_bytes(ctypes.byref(args), ctypes.byref(need))
        if status != FK_OK:
            raise KernelError(f"fk_workspace_bytes failed: {STATUS_NAMES.get(status, status)}: {self.last_error()}",
                              status)
        if workspace is None:
            workspace = torch.empty(max(int(need.value), 1), dtype=torch.uint8, device=q.device)
        elif not (isinstance(workspace, torch.Tensor) and workspace.dtype == torch.uint8
                  and workspace.device == q.device and workspace.is_contiguous()
                  and workspace.numel() >= need.value and workspace.data_ptr() % 16 == 0):
            raise KernelError(f"workspace must be a contiguous, 16-byte aligned uint8 tensor on {q.device} "
                              f"of at least {int(need.value)} bytes", FK_ERR_WORKSPACE)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), int(need.value)
        self._invoke(args, q.device, False)
        return (o, lse) if return_lse else o

    def attention(self, q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False):
        """Flash forward: softmax(scale * Q K^T) V as a new tensor shaped like q; with return_lse,
        (out, lse): lse the float32 (B, H, Nq) log-sum-exp of each row's scaled scores (natural
        log; dense in q's layout, see lse_like)."""
        return self._call(q, k, v, scale, layout, False, return_lse)

    def naive_attention(self, q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False):
        """The naive (pre-flash) forward that materialises the score matrix: the oracle."""
        return self._call(q, k, v, scale, layout, True, return_lse)

    def _call(self, q, k, v, scale, layout, naive, return_lse=False):
        api = _api or _torch_api()
        tensor = api.Tensor
        if type(q) is tensor and type(k) is tensor and type(v) is tensor and not api.is_compiling():
            if (q.requires_grad or k.requires_grad or v.requires_grad) and api.is_grad_enabled():
                raise KernelError(NO_BACKWARD)
            # Plain tensors outside tracing go straight to the C call: the custom op's dispatch
            # costs more host time than a short kernel runs. Inputs of a kind seen before skip the
            # checks (see _Kind).
            try:
                key = input_key(q, k, v, layout)
            except RuntimeError:  # no sizes or strides (nested, sparse): check_inputs names it
                check_inputs(q, k, v, layout, self.head_dims)
                raise
            kind = self._checked.get(key)
            if kind is None:
                kind = self._new_kind(key, q, k, v, layout)
            if kind is not False:
                return kind.run(api, q, k, v, scale, naive, return_lse)
        return self._checked_call(api, q, k, v, scale, layout, naive, return_lse)

    def _checked_call(self, api, q, k, v, scale, layout, naive, return_lse):
        """The call with every check, inputs copied where the kernel cannot address them as they are."""
        _op = op_layer()  # registers the torch ops on first use (a dict lookup after)

        q, k, v = check_inputs(q, k, v, layout, self.head_dims)
        self.check_device(q.device)
        s = resolve_scale(scale, _bhnd(q, layout)[0][3])
        if _plain_eager(api, q, k, v):  # inputs that needed a copy to be addressable
            o = api.empty_like(q, memory_format=api.contiguous_format)
            lse = lse_like(q, layout) if return_lse else None
            self._launch(q, k, v, o, s, layout, naive, lse)
            return (o, lse) if return_lse else o
        # traced, fake or subclassed tensors: through the registered op
        return _op.call(self, q, k, v, s, layout, naive, return_lse)

    def known_kind(self, key) -> _Kind | None:
        """The checked kind of inputs with this input_key, if they go straight to the C call."""
        kind = self._checked.get(key)
        return kind if kind else None

    def _new_kind(self, key, q, k, v, layout):
        """Check inputs of a new kind once and remember them (False: the kernel cannot address them
        as they are, so every call copies them and is checked in full)."""
        op_layer()  # registers the torch ops on the first call

        checked = check_inputs(q, k, v, layout, self.head_dims)
        self.check_device(q.device)
        kind = False
        if all(a is b for a, b in zip(checked, (q, k, v))):
            dense = _Dense(q.shape)
            kind = _Kind(self, fill_args(q, k, v, dense, layout, 0.0, None), tuple(q.stride()) == dense.stride(),
                         layout)
        if len(self._checked) >= 256:  # a workload of ever-new shapes: start over
            self._checked.clear()
        self._checked[key] = kind
        return kind


def input_key(q, k, v, layout: str) -> tuple:
    """What the checks of a call depend on: every input's shape, strides, dtype and device, and the
    layout (inputs with equal keys pass or fail the checks alike)."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, layout)


class _Kind:
    """Inputs of one kind (input_key) checked against one library: their argument struct filled
    but for the pointers and the scale, which are each call's own."""

    __slots__ = ("dense", "forwards", "host", "layout", "lib", "lse_shape", "lse_template", "lse_transposed",
                 "misaligned", "template")

    def __init__(self, lib: Library, template: AttentionArgs, dense: bool, layout: str):
        self.lib = lib
        self.template = template
        self.forwards = lib._forwards
        self.host = lib.is_host
        self.layout = layout
        # the low pointer bits a GPU library's 16-byte loads need clear (the strides are the kind's)
        self.misaligned = 0 if self.host else VECTOR_BYTES - 1
        self.dense = dense  # q's strides are already those of a dense tensor of its shape
        # the return_lse calls' template: the same, with the strides of lse_like's output
        b, h, n = template.batch, template.heads, template.nq
        self.lse_transposed = layout == "bnhd"
        self.lse_shape = (b, n, h) if self.lse_transposed else (b, h, n)
        self.lse_template = _copy_args(template)
        self.lse_template.lse_stride[:] = (n * h, 1, h) if self.lse_transposed else (h * n, n, 1)

    def run(self, api, q, k, v, scale, naive: bool, return_lse: bool = False):
        """One call: the output allocated, the struct copied and completed, the C function called.
        Only the scale and the pointers' alignment are checked (the scale quickly where it is a float
        well inside fp32's positive range)."""
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp) & self.misaligned:  # a view off 16 bytes, strides of its kind: copied
            return self.lib._checked_call(api, q, k, v, scale, self.layout, naive, return_lse)
        if scale is None:
            s = 0.0
        elif type(scale) is float and 1e-37 < scale < 1e38:
            s = scale
        else:
            s = resolve_scale(scale, 0)
        # dense in q's logical layout; empty_like keeps q's strides, so where they are already
        # dense the memory-format keyword (argument parsing on every call) is left out
        o = api.empty_like(q) if self.dense else api.empty_like(q, memory_format=api.contiguous_format)
        if return_lse:
            lse = api.empty(self.lse_shape, dtype=api.float32, device=q.device)
            args = _copy_args(self.lse_template)
            args.lse = lse.data_ptr()
        else:
            args = _copy_args(self.template)
        _pack_pointers(args, _POINTERS_AT, qp, kp, vp, o.data_ptr())
        args.scale = s
        fn = self.forwards[naive]
        # the struct itself is passed: ctypes passes it by reference (argtypes), cheaper than byref()
        status = fn(args) if self.host else _call_on_device(api, fn, args, q.get_device())
        if status != FK_OK:
            self.lib._status(status, naive)
        if return_lse:
            return o, (lse.transpose(1, 2) if self.lse_transposed else lse)
        return o


_copy_args = AttentionArgs.from_buffer_copy
# q, k, v and o are adjacent pointer fields: one pack_into writes all four (four ctypes field
# assignments cost more)
_pack_pointers = struct.Struct("@4P").pack_into
_POINTERS_AT = AttentionArgs.q.offset
assert [getattr(AttentionArgs, n).offset - _POINTERS_AT for n in "qkvo"] == [
    i * ctypes.sizeof(ctypes.c_void_p) for i in range(4)]


class _Dense:
    """The shape and strides of `torch.empty(shape)`, without allocating (for an argument template)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        strides, step = [], 1
        for n in reversed(self.shape):
            strides.append(step)
            step *= n
        self._strides = tuple(reversed(strides))

    def stride(self):
        return self._strides

    def data_ptr(self) -> int:
        return 0


def _plain_eager(torch, q, k, v) -> bool:
    return (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
            and not torch.compiler.is_compiling())


class _TorchApi:
    """The torch functions the eager call uses, looked up once (torch is imported on first use, so
    the ABI works without it; attribute chains like torch.cuda.current_device cost host time)."""

    def __init__(self):
        import torch

        self.Tensor = torch.Tensor
        self.compiler = torch.compiler
        self.is_compiling = torch.compiler.is_compiling
        self.is_grad_enabled = torch.is_grad_enabled
        self.empty_like = torch.empty_like
        self.empty = torch.empty
        self.float32 = torch.float32
        self.contiguous_format = torch.contiguous_format
        self.cuda = torch.cuda
        # torch.cuda.current_device() is a Python layer over this getter (which initialises CUDA itself)
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        self.current_device = get_device if get_device is not None else torch.cuda.current_device
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # one C call, no Stream object
        self.raw_stream = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)


_api: _TorchApi | None = None

# Set by the package when it loads (it imports this module, so this module never imports it):
# op_layer returns the torch custom-op layer (flash_kernel._op, imported on first need);
# library_lookup is the package's library_for, which that layer calls while torch.compile traces.
op_layer = None
library_lookup = None


def _torch_api() -> _TorchApi:
    global _api
    if _api is None:
        _api = _TorchApi()
    return _api


def _call_on_device(api, fn, args: AttentionArgs, index: int) -> int:
    """The C call for CUDA tensors on device `index`, on torch's current stream there (the C side
    launches on the current device)."""
    args.stream = api.raw_stream(index)  # 0: the legacy default stream
    if index == api.current_device():
        return fn(args)
    with api.cuda.device(index):
        return fn(args)


_cache: dict[str, Library] = {}
_lock = threading.Lock()


def load(path: str | os.PathLike) -> Library:
    """Load (once per resolved path) a shared object exporting the flash_kernel C ABI."""
    hit = _cache.get(path) if isinstance(path, str) else None
    if hit is not None:  # the custom op passes the resolved path it was given: no file-system call
        return hit
    p = Path(path)
    if p.is_dir():
        p = p / "libflash_kernel.so"
    key = str(p.resolve())
    with _lock:
        lib = _cache.get(key)
        if lib is None:
            lib = Library(p)
            _cache[key] = lib
        return lib

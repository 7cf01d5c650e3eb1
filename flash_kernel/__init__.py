"""flash_kernel: the Python binding of the sovereign flash-attention library (ctypes).

    import flash_kernel
    lib = flash_kernel.load("build/cpu/libflash_kernel.so")   # any .so exporting the C ABI
    o = lib.attention(q, k, v)                                 # flash forward, (B,H,N,D) tensors
    o = flash_kernel.attention(q, k, v, scale=None, layout="bhnd")   # library picked for q.device
    o, lse = flash_kernel.attention(q, k, v, return_lse=True)         # lse: float32 (B, H, Nq), natural log
    o = flash_kernel.attention(q, k, v, precision="fp8")              # opt-in FP8 numerics (flash_kernel.fp8)

Library lookup: `load(PATH)` explicitly; else the build folder named by FLASH_KERNEL_BUILD
(holding `<target>/libflash_kernel.so`); else the checkout's `build/` (the parent of this
package's folder). CUDA tensors use FLASH_KERNEL_TARGET if set, else the first of sm_90a, sm_90,
sm_80 that is built (sm_90a first: its library runs the wgmma path on cc 9.0 and mma.sync from its
sm_80 cubin on cc 8.x); CPU tensors use `cpu`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flash_kernel import _binding
from flash_kernel._binding import (
    ABI_VERSION,
    AbiMismatch,
    KernelError,
    Library,
    LibraryNotFound,
    load,
)

__all__ = ["ABI_VERSION", "AbiMismatch", "KernelError", "Library", "LibraryNotFound", "attention",
           "build_dir", "library_for", "library_path", "load", "naive_attention"]

LIBRARY_NAME = "libflash_kernel.so"
CUDA_TARGETS = ("sm_90a", "sm_90", "sm_80")  # preference order for CUDA tensors (fastest first)


def build_dir() -> Path:
    """Where built libraries are looked for: $FLASH_KERNEL_BUILD, else the checkout's build/."""
    env = os.environ.get("FLASH_KERNEL_BUILD")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "build"


def library_path(target: str) -> Path:
    return build_dir() / target / LIBRARY_NAME


def _device_type(device) -> str:
    if isinstance(device, str):
        return device.split(":", 1)[0]
    t = getattr(device, "type", None)
    if t is None:
        raise KernelError(f"not a device: {device!r}")
    return t


def library_for(device) -> Library:
    """The built library for a device ('cpu', 'cuda', 'cuda:1' or a torch.device), looked up on the
    file system once per device (and per FLASH_KERNEL_BUILD / FLASH_KERNEL_TARGET setting)."""
    kind = _device_type(device)
    key = (kind, _ENV.get(_BUILD_KEY), _ENV.get(_TARGET_KEY))
    lib = _by_device.get(key)
    if lib is None:
        lib = _find_library(kind)
        _by_device[key] = lib  # a failed lookup is not remembered: a later build is found
    return lib


_by_device: dict[tuple, Library] = {}

# FLASH_KERNEL_BUILD and FLASH_KERNEL_TARGET are read on every public call (a change is honoured),
# so from the mapping behind os.environ (raw values, ~0.03 us a name) rather than os.environ.get
# (~0.7 us: key encoding, value decoding); where os.environ is not CPython's own, through it.
_SETTINGS = ("FLASH_KERNEL_BUILD", "FLASH_KERNEL_TARGET")
if hasattr(os.environ, "_data") and hasattr(os.environ, "encodekey"):
    _ENV = os.environ._data
    _BUILD_KEY, _TARGET_KEY = (os.environ.encodekey(n) for n in _SETTINGS)
else:
    _ENV = os.environ
    _BUILD_KEY, _TARGET_KEY = _SETTINGS


def _settings() -> tuple:
    """FLASH_KERNEL_BUILD and FLASH_KERNEL_TARGET as they are now (raw: a cache key)."""
    return _ENV.get(_BUILD_KEY), _ENV.get(_TARGET_KEY)


def _find_library(kind: str) -> Library:
    where = build_dir()
    if kind == "cpu":
        targets = ("cpu",)
    elif kind == "cuda":
        env = os.environ.get("FLASH_KERNEL_TARGET")
        targets = (env,) if env else CUDA_TARGETS
    else:
        raise KernelError(f"no flash_kernel target runs on {kind!r} tensors (cpu or cuda only)")
    for target in targets:
        p = where / target / LIBRARY_NAME
        if p.is_file():
            return load(p)
    looked = ", ".join(str(where / t / LIBRARY_NAME) for t in targets)
    raise LibraryNotFound(f"no flash_kernel library for {kind} tensors (looked for {looked}); build it "
                          f"with `sovereign-audit build --target {targets[0]}`"
                          + (f" --out {where}" if os.environ.get("FLASH_KERNEL_BUILD") else ""))


def _op_layer():
    """flash_kernel._op, the torch custom ops (it imports torch: loaded on first need)."""
    from flash_kernel import _op

    return _op


# Handed over at import, never while torch.compile traces (a traced assignment would only take
# effect after the graph is built): the op layer finds libraries through this package's lookup.
_binding.op_layer = _op_layer
_binding.library_lookup = library_for


def attention(q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False,
              precision: str = "exact"):
    """softmax(scale * Q K^T) V through the flash path of the library for q.device. With
    return_lse: (out, lse), lse float32 (B, H, Nq) whatever the layout, the natural-log
    log-sum-exp of each query row's scaled scores (what ring attention merges partial outputs
    by); its memory is dense in q's layout ((B, Nq, H) for "bnhd").

    precision="fp8" opts into quantized attention (flash_kernel.fp8: INT8 Q K^T with K smoothed,
    FP8 P V, quantized inside the call), output in the input dtype. It runs on CPU tensors (the
    reference numerics) and on CUDA tensors through the FP8 kernel of an sm_90a library on a
    cc 9.0 device (head dims up to 128); anywhere else it raises fp8.Fp8Unavailable (a
    NotImplementedError), never falling back to exact attention."""
    if precision != "exact":
        return _fp8_call(q, k, v, scale, layout, return_lse, precision)
    # Inputs of a kind called before (same shapes, strides, dtypes, devices, layout and library
    # settings) go from here straight to the C call: this runs on every call, so it is inline.
    global _last
    api = _binding._api  # torch's functions, once a call has looked them up
    if api is not None and not api.is_compiling():
        tensor = api.Tensor
        if (type(q) is tensor and type(k) is tensor and type(v) is tensor
                and not (q.requires_grad or k.requires_grad or v.requires_grad)):  # else: refused, or no_grad
            try:
                key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                       q.device, k.device, v.device, layout, _ENV.get(_BUILD_KEY), _ENV.get(_TARGET_KEY))
            except RuntimeError:  # a tensor without strides (sparse): the full checks name it
                return _call(q, k, v, scale, layout, False, return_lse)
            last = _last  # the kind of the last call: a comparison, no hashing, when it repeats
            if key == last[0]:
                kind = last[1]
            else:
                kind = _kinds.get(key)
                if kind is not None:
                    _last = (key, kind)
            if kind is not None:
                return kind.run(api, q, k, v, scale, False, return_lse)
    return _call(q, k, v, scale, layout, False, return_lse)


def _fp8_call(q, k, v, scale, layout, return_lse, precision):
    from flash_kernel import fp8

    fp8.check_precision(precision)  # "exact" never comes here
    return fp8.attention(q, k, v, scale, layout, return_lse)


def naive_attention(q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False):
    """The naive (pre-flash) path of the library for q.device: materialises the score matrix."""
    return _call(q, k, v, scale, layout, True, return_lse)


_kinds: dict[tuple, _binding._Kind] = {}  # input kinds the public call has seen (see attention)
_last: tuple = ((), None)  # (key, kind) of the last call found in _kinds


def _call(q, k, v, scale, layout: str, naive: bool, return_lse: bool = False):
    """The public call the first time inputs of a kind are seen (checked in full), or when
    torch.compile traces it, or for inputs that cannot go straight to the C call."""
    global _last
    if _compiling():
        return _op_layer().traced_call(q, k, v, scale, layout, naive=naive, return_lse=return_lse)
    settings = _settings()
    lib = library_for(_tensor_device(q))
    out = lib._call(q, k, v, scale, layout, naive, return_lse)
    tensor = _binding._api.Tensor  # set by the call
    if type(q) is tensor and type(k) is tensor and type(v) is tensor:
        key = _binding.input_key(q, k, v, layout)
        kind = lib.known_kind(key)
        if kind is not None:  # checked by this call: the next one of its kind skips the lookups
            if len(_kinds) >= 256:  # a workload of ever-new shapes: start over
                _kinds.clear()
                _last = ((), None)
            _kinds[(*key, *settings)] = kind
    return out


def _compiling() -> bool:
    """Under torch.compile / torch.export tracing (torch imported lazily: the ABI works without it)."""
    api = _binding._api  # torch's functions, once a call has looked them up
    if api is not None:
        return api.is_compiling()
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _tensor_device(q):
    device = getattr(q, "device", None)
    if device is None:
        raise KernelError(f"q must be a torch.Tensor, not {type(q).__name__}")
    return device

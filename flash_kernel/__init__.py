"""flash_kernel: the Python binding of the sovereign flash-attention library (ctypes).

    import flash_kernel
    lib = flash_kernel.load("build/cpu/libflash_kernel.so")   # any .so exporting the C ABI
    o = lib.attention(q, k, v)                                 # flash forward, (B,H,N,D) tensors
    o = flash_kernel.attention(q, k, v, scale=None, layout="bhnd")   # library picked for q.device

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
    data = getattr(os.environ, "_data", None)  # _settings, inlined: this runs on every public call
    key = (kind, data.get(_RAW[0]), data.get(_RAW[1])) if data is not None and _RAW else (kind, *_settings())
    lib = _by_device.get(key)
    if lib is None:
        lib = _find_library(kind)
        _by_device[key] = lib  # a failed lookup is not remembered: a later build is found
    return lib


_by_device: dict[tuple, Library] = {}
_SETTINGS = ("FLASH_KERNEL_BUILD", "FLASH_KERNEL_TARGET")
_RAW = tuple(os.environ.encodekey(n) for n in _SETTINGS) if hasattr(os.environ, "encodekey") else ()


def _settings() -> tuple:
    """FLASH_KERNEL_BUILD and FLASH_KERNEL_TARGET as they are now (the cache key of library_for: a
    change is honoured). Read on every public call, so from the mapping behind os.environ (raw
    values, ~0.03 us a name) rather than os.environ.get (~0.7 us: key encoding, value decoding)."""
    env = os.environ
    data = getattr(env, "_data", None)
    if data is None or not _RAW:  # os.environ is not CPython's own mapping
        return env.get(_SETTINGS[0]), env.get(_SETTINGS[1])
    return data.get(_RAW[0]), data.get(_RAW[1])


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


def attention(q, k, v, scale=None, layout: str = "bhnd"):
    """softmax(scale * Q K^T) V through the flash path of the library for q.device."""
    if _compiling():
        return _op_layer().traced_call(q, k, v, scale, layout, naive=False)
    return library_for(_tensor_device(q))._call(q, k, v, scale, layout, False)


def naive_attention(q, k, v, scale=None, layout: str = "bhnd"):
    """The naive (pre-flash) path of the library for q.device: materialises the score matrix."""
    if _compiling():
        return _op_layer().traced_call(q, k, v, scale, layout, naive=True)
    return library_for(_tensor_device(q))._call(q, k, v, scale, layout, True)


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

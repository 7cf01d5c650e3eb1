"""What parity and bench measure: our library for a target, any library with our C ABI, or a
user's Python function. Shared by `parity`, `bench` and `run`.

Every failure to select is a one-line UsageError (exit 2); nothing here prints.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from audit.errors import AuditError, InputError, UsageError

DTYPE_NAMES = ("fp32", "fp16", "bf16")
LAYOUTS = ("bhnd", "bnhd")


def torch_dtype(name: str):
    import torch

    try:
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; use one of {', '.join(DTYPE_NAMES)}") from None


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(device: str, wanted_by_library: str | None = None) -> str:
    """'auto' | 'cpu' | 'cuda' -> 'cpu' or 'cuda'; a library's own device wins over 'auto'."""
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}; use auto, cpu or cuda")
    if device == "auto" and wanted_by_library == "cuda" and not cuda_available():
        raise UsageError("the selected library runs on a CUDA GPU and torch sees none")
    if device == "auto":
        device = wanted_by_library or ("cuda" if cuda_available() else "cpu")
    if wanted_by_library and device != wanted_by_library:
        raise UsageError(f"the selected library runs on {wanted_by_library}, not on --device {device}")
    if device == "cuda" and not cuda_available():
        raise UsageError("--device cuda requested but torch sees no CUDA GPU")
    return device


def _one_line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Our library: where it lives, building it, loading it through the binding.

def _binding():
    try:
        import flash_kernel
    except Exception as exc:  # the binding itself is missing or broken
        raise UsageError(f"the flash_kernel binding cannot be imported: {_one_line(exc)}") from None
    return flash_kernel


def build_dir() -> Path:
    """FLASH_KERNEL_BUILD, else the checkout's build/ (beside the flash_kernel package)."""
    env = os.environ.get("FLASH_KERNEL_BUILD")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("flash_kernel")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent.parent / "build"
    return Path("build")


def library_path(target: str) -> Path:
    return build_dir() / target / "libflash_kernel.so"


def _default_cuda_target() -> str:
    """The fastest CUDA target already built, else sm_90a (wgmma on Hopper, mma.sync on cc 8.x)."""
    from flash_kernel import CUDA_TARGETS

    return next((t for t in CUDA_TARGETS if library_path(t).is_file()), CUDA_TARGETS[0])


def ensure_target_library(target: str) -> Path:
    """Path of our library for `target`, building it with the builder if it is missing."""
    if not target or "/" in target or target.startswith("."):
        raise UsageError(f"malformed target {target!r}")
    path = library_path(target)
    if path.is_file():
        return path
    try:
        from audit.kernel_build.builder import build_targets
    except Exception as exc:
        raise UsageError(f"no library for target {target!r} at {path} and the builder is "
                         f"unavailable: {_one_line(exc)}") from None
    try:
        result = build_targets([target], path.parent.parent)
    except AuditError:
        raise
    except Exception as exc:
        raise UsageError(f"building target {target!r} failed: {_one_line(exc)}") from None
    if not path.is_file():
        raise UsageError(f"building target {target!r} produced no {path}: {_build_reason(result, target)}")
    return path


def _build_reason(result, target: str) -> str:
    """The builder's one-line reason for `target`, found without depending on its exact layout."""
    try:
        data = result.to_dict()
    except Exception:
        return "no reason given"
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("target") == target and node.get("reason"):
                return _one_line(f"{node.get('status', '')} {node['reason']}")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return "no reason given"


def load_library(path: Path | str):
    """flash_kernel.load with the binding's errors turned into one-line exits."""
    fk = _binding()
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"library {str(p)!r} does not exist")
    try:
        return fk.load(str(p))
    except getattr(fk, "AbiMismatch", ()) as exc:
        raise UsageError(f"library {str(p)!r} has the wrong ABI version: {_one_line(exc)}") from None
    except getattr(fk, "KernelError", ()) as exc:
        raise UsageError(f"library {str(p)!r} cannot be used: {_one_line(exc)}") from None
    except OSError as exc:
        raise InputError(f"library {str(p)!r} cannot be loaded: {_one_line(exc)}") from None


def library_device(lib) -> str:
    target = str(lib.target)
    if target == "cpu":
        return "cpu"
    if target.startswith(("gfx", "amdgcn")):  # an AMD code object (HIP) library
        import torch

        if getattr(torch.version, "hip", None) is None:
            raise UsageError(f"library built for AMD target {target!r} cannot run under this "
                             "torch (no ROCm/HIP build)")
    return "cuda"


# ---------------------------------------------------------------------------------------------
# Calling the C ABI directly, into an output we allocate (and poison) ourselves.

class RawAbi:
    """fk_flash_forward / fk_naive_forward through ctypes with a caller-owned output.

    The binding allocates its own output, so an unwritten element could hold stale memory that
    looks valid; parity instead passes a NaN-filled tensor and counts what stays NaN.
    """

    def __init__(self, path: str):
        # the binding's declaration of the header's struct, and its filler
        from flash_kernel._binding import AttentionArgs, fill_args

        self._fill = fill_args
        self._dll = ctypes.CDLL(path)
        for name in ("fk_flash_forward", "fk_naive_forward"):
            fn = getattr(self._dll, name)
            fn.argtypes = [ctypes.POINTER(AttentionArgs)]
            fn.restype = ctypes.c_int32
        self._dll.fk_last_error.restype = ctypes.c_char_p
        self._dll.fk_last_error.argtypes = []

    def __call__(self, which: str, q, k, v, out, scale: float | None, layout: str = "bhnd") -> None:
        import torch

        if any(t.stride(3) != 1 for t in (q, k, v, out)):
            raise UsageError("the D dimension must be contiguous")
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None
        a = self._fill(q, k, v, out, layout, 0.0 if scale is None else float(scale), stream)
        fn = self._dll.fk_flash_forward if which == "flash" else self._dll.fk_naive_forward
        status = fn(ctypes.byref(a))
        if status != 0:
            msg = (self._dll.fk_last_error() or b"").decode("utf-8", "replace")
            raise KernelCallError(f"{which} forward returned status {status}: {_one_line(msg)}",
                                  status)


class KernelCallError(RuntimeError):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# User candidates.

def load_candidate(spec: str) -> Callable:
    """`MODULE:FUNC` (MODULE importable, or a path to a .py file) -> the callable."""
    if spec.count(":") < 1:
        raise UsageError(f"malformed --candidate {spec!r}: expected MODULE:FUNC")
    module_name, func_name = spec.rsplit(":", 1)
    if not module_name or not func_name:
        raise UsageError(f"malformed --candidate {spec!r}: expected MODULE:FUNC")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"candidate file {module_name!r} does not exist")
            mod_spec = importlib.util.spec_from_file_location(f"_candidate_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except BaseException as exc:  # user code: SyntaxError, SystemExit, anything
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UsageError(f"cannot import candidate module {module_name!r}: "
                         f"{type(exc).__name__}: {_one_line(exc)}") from None
    fn = getattr(module, func_name, None)
    if fn is None:
        raise UsageError(f"candidate module {module_name!r} has no attribute {func_name!r}")
    if not callable(fn):
        raise UsageError(f"candidate {spec!r} is not callable")
    return fn


# ---------------------------------------------------------------------------------------------
# The selection.

@dataclass
class Backend:
    """One attention implementation: `fn(q, k, v, scale)` on (B,H,N,D) tensors returns O."""

    name: str
    fn: Callable
    sovereign: bool
    vendor: bool = False
    about: str = ""
    # Writes into a caller-owned output (poisoned first by parity): (which, q, k, v, out, scale).
    writer: Callable | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "sovereign": self.sovereign, "vendor": self.vendor,
                "about": self.about}


@dataclass
class Selection:
    """What is measured (`primary`) and what it is held against (`oracle`, the pre-flash path)."""

    kind: str  # "target" | "lib" | "candidate"
    spec: str  # the target name, library path or MODULE:FUNC
    device: str
    primary: Backend
    oracle: Backend | None
    oracle_note: str = ""
    library: dict = field(default_factory=dict)  # abi_version, target, flash_path, head_dims, path
    head_dims: tuple[int, ...] | None = None  # None: any
    precision: str = "exact"  # exact | fp8 (audit.evidence.precision)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "spec": self.spec, "device": self.device,
                "precision": self.precision,
                "primary": self.primary.to_dict(),
                "oracle": self.oracle.to_dict() if self.oracle else None,
                "oracle_note": self.oracle_note, "library": self.library,
                "head_dims": list(self.head_dims) if self.head_dims is not None else None}

    def check_shapes(self, shapes) -> None:
        if self.head_dims is None:
            return
        for s in shapes:
            if s.head_dim not in self.head_dims:
                dims = ", ".join(str(d) for d in self.head_dims)
                raise UsageError(f"shape {s.label}: head dim {s.head_dim} is not supported by "
                                 f"{self.library.get('path', self.spec)} (supports {dims})")


def _library_info(lib) -> dict:
    return {"abi_version": int(lib.abi_version), "target": str(lib.target),
            "flash_path": str(lib.flash_path), "head_dims": [int(d) for d in lib.head_dims],
            "path": str(lib.path)}


def _library_backends(lib) -> tuple[Backend, Backend]:
    info = _library_info(lib)
    if hasattr(lib, "run_into"):  # the binding's own call into a caller-owned output
        def raw(which, q, k, v, out, scale, layout="bhnd"):
            lib.run_into(q, k, v, out, 0.0 if scale is None else float(scale), layout,
                         naive=which == "naive")
    else:
        raw = RawAbi(str(lib.path))
    tag = f"{info['target']}/{info['flash_path']}"
    flash = Backend("flash", lambda q, k, v, scale=None: lib.attention(q, k, v, scale=scale),
                    sovereign=True, about=f"flash forward of {tag}",
                    writer=lambda q, k, v, out, scale=None: raw("flash", q, k, v, out, scale))
    naive = Backend("naive", lambda q, k, v, scale=None: lib.naive_attention(q, k, v, scale=scale),
                    sovereign=True, about=f"naive pre-flash forward of {tag}",
                    writer=lambda q, k, v, out, scale=None: raw("naive", q, k, v, out, scale))
    return flash, naive


def _from_library(kind: str, spec: str, path: Path, device: str) -> Selection:
    lib = load_library(path)
    dev = resolve_device(device, library_device(lib))
    flash, naive = _library_backends(lib)
    info = _library_info(lib)
    return Selection(kind, spec, dev, flash, naive, "the library's own naive forward", info,
                     tuple(info["head_dims"]))


def _oracle_for(device: str) -> tuple[Backend | None, str, dict]:
    """Our library's naive path for `device` (building the CPU one if needed), else None + why."""
    try:
        if device == "cpu":
            lib = load_library(ensure_target_library("cpu"))
        else:
            fk = _binding()
            lib = fk.library_for(device)
    except Exception as exc:
        msg = exc.message if isinstance(exc, AuditError) else _one_line(exc)
        return None, f"our library is unavailable for {device}: {msg}", {}
    _, naive = _library_backends(lib)
    return naive, "our library's naive forward", _library_info(lib)


def select(target: str | None = None, lib: str | None = None, candidate: str | None = None,
           device: str = "auto") -> Selection:
    """Exactly one of target / lib / candidate (default: target for the device)."""
    chosen = [x for x in (target, lib, candidate) if x]
    if len(chosen) > 1:
        raise UsageError("give only one of --target, --lib and --candidate")
    if lib:
        return _from_library("lib", lib, Path(lib), device)
    if candidate:
        fn = load_candidate(candidate)
        dev = resolve_device(device)
        primary = Backend("candidate", lambda q, k, v, scale=None: fn(q, k, v, scale=scale),
                          sovereign=False, about=f"user function {candidate}")
        oracle, note, info = _oracle_for(dev)
        if oracle is not None and info.get("head_dims"):
            oracle = _HeadDimGuard(oracle, tuple(info["head_dims"]))
        return Selection("candidate", candidate, dev, primary, oracle, note, info, None)
    if not target:
        dev = resolve_device(device)
        target = "cpu" if dev == "cpu" else os.environ.get("FLASH_KERNEL_TARGET") or _default_cuda_target()
    return _from_library("target", target, ensure_target_library(target), device)


class _HeadDimGuard(Backend):
    """Our naive path as a candidate's oracle, for the head dims it supports only."""

    def __init__(self, inner: Backend, dims: tuple[int, ...]):
        super().__init__(inner.name, inner.fn, inner.sovereign, inner.vendor, inner.about,
                         inner.writer)
        self.dims = dims

    def supports(self, head_dim: int) -> bool:
        return head_dim in self.dims


def oracle_supports(sel: Selection, head_dim: int) -> bool:
    o = sel.oracle
    return o is not None and (not isinstance(o, _HeadDimGuard) or o.supports(head_dim))

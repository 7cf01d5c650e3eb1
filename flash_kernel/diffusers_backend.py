"""Our kernel as a diffusers attention backend: one context manager, every model that calls
diffusers' attention dispatcher (Wan, Flux, LTX-Video, HunyuanVideo, CogVideoX, ...) runs its
self- and cross-attention on the flash kernel.

    from flash_kernel.diffusers_backend import flash_attention_backend
    with flash_attention_backend() as counts:
        video = pipe(prompt, ...).frames
    print(counts.summary())      # served 1800, passed on 0 (...)

The backend is registered in diffusers' own registry (`attention_dispatch._AttentionBackendRegistry`)
and made the active one for the duration of the block, as diffusers' `attention_backend(...)`
context manager does for its built-in backends. A call the kernel cannot serve (an attention mask,
causal attention, dropout, grouped-query heads, a log-sum-exp request, context parallelism, a
dtype or head dim this library lacks, tensors on another device, or a graph that needs gradients:
the kernel is forward only) is passed on unchanged to the backend that was active before (by
default diffusers' native one, i.e. torch SDPA), and counted by reason.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field

BACKEND_NAME = "sovereign_flash"  # the prefix of its key in diffusers' registry while the block runs

_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")


@dataclass
class DispatchCounts:
    """What the backend did while its block ran: calls served by the kernel, and calls passed on
    to the previous backend, by reason."""

    served: int = 0
    passed_on: Counter = field(default_factory=Counter)
    paths: Counter = field(default_factory=Counter)  # served calls by the kernel path that ran them
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, reason: str | None, path: str | None = None) -> None:
        with self._lock:
            if reason is None:
                self.served += 1
                if path:
                    self.paths[path] += 1
            else:
                self.passed_on[reason] += 1

    def summary(self) -> str:
        passed = sum(self.passed_on.values())
        ran = ", ".join(f"{p}: {n}" for p, n in sorted(self.paths.items()))
        why = ", ".join(f"{r}: {n}" for r, n in sorted(self.passed_on.items()))
        return (f"served {self.served}" + (f" ({ran})" if ran else "") + f", passed on {passed}"
                + (f" ({why})" if why else ""))

    def to_dict(self) -> dict:
        return {"served": self.served, "paths": dict(sorted(self.paths.items())),
                "passed_on": dict(sorted(self.passed_on.items()))}


def _refusal(lib_for, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, return_lse,
             parallel) -> str | None:
    """Why the kernel cannot serve this call (None: it can). Cheap checks first."""
    import torch

    if attn_mask is not None:
        return "attention mask"
    if is_causal:
        return "causal"
    if dropout_p:
        return "dropout"
    if return_lse:
        return "log-sum-exp requested"
    if parallel is not None:
        return "context parallel"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return "needs gradients (forward-only kernel)"
    if query.dim() != 4 or key.shape != value.shape or query.shape[0] != key.shape[0] \
            or query.shape[3] != key.shape[3]:
        return "shape"
    if query.shape[2] != key.shape[2]:
        return "grouped-query heads" if enable_gqa else "shape"
    if not (query.dtype == key.dtype == value.dtype) or str(query.dtype) not in _DTYPES:
        return f"dtype {query.dtype}"
    if not (query.device == key.device == value.device):
        return "tensors on different devices"
    try:
        lib = lib_for(query.device)
    except Exception:  # no library built for this device: SDPA serves it
        return f"no library for {query.device.type}"
    if query.shape[3] not in lib.head_dims:
        return f"head dim {query.shape[3]}"
    return None


@contextlib.contextmanager
def flash_attention_backend(library=None):
    """Make our flash kernel diffusers' active attention backend inside the block; yields the
    DispatchCounts. `library`: a loaded flash_kernel.Library (default: the one built for each
    tensor's device, as flash_kernel.attention picks it)."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry
    except ImportError as exc:
        raise ImportError(f"flash_attention_backend needs diffusers with its attention dispatcher "
                          f"(diffusers.models.attention_dispatch): {exc}") from None
    import flash_kernel

    lib_for = (lambda device: library) if library is not None else flash_kernel.library_for
    counts = DispatchCounts()
    previous_name, previous = registry.get_active_backend()
    previous_args = registry._supported_arg_names[previous_name]

    def backend(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                _parallel_config=None):
        why = _refusal(lib_for, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, return_lse,
                       _parallel_config)
        if why is None:  # diffusers hands backends (B, N, H, D): our "bnhd" layout
            import torch

            lib = lib_for(query.device)
            out = lib.attention(query, key, value, scale=scale, layout="bnhd")
            # which kernel ran (a C call: not made while torch.compile traces, where it would break the graph)
            counts.count(None, None if torch.compiler.is_compiling() else lib.last_flash_path())
            return out
        counts.count(why)
        kwargs = dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                      _parallel_config=_parallel_config)
        return previous(**{k: v for k, v in kwargs.items() if k in previous_args})

    name = f"{BACKEND_NAME}_{id(counts):x}"  # one key per block: blocks nest
    registry._backends[name] = backend
    registry._constraints[name] = []
    registry._supported_arg_names[name] = {"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                           "enable_gqa", "return_lse", "_parallel_config"}
    registry.set_active_backend(name)
    try:
        yield counts
    finally:
        registry.set_active_backend(previous_name)
        for table in (registry._backends, registry._constraints, registry._supported_arg_names):
            table.pop(name, None)

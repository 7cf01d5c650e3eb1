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
causal attention, dropout, grouped-query heads, a dtype or head dim this library lacks, tensors on
another device, or a graph that needs gradients: the kernel is forward only) is passed on unchanged
to the backend that was active before (by default diffusers' native one, i.e. torch SDPA), and
counted by reason.

Context parallelism (`model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=...,
ring_degree=...))`, launched with torchrun): calls that carry diffusers' `_parallel_config` are
served the way diffusers' own flash backend serves them, through its templated context-parallel
attention (`_templated_context_parallel_attention`: Ulysses all-to-all, ring K/V passing, or both)
with our kernel as the forward op; the op returns the log-sum-exp that ring attention merges the
partial outputs by. The communication is diffusers' over torch.distributed (NCCL on GPUs, gloo on
CPU); the counts say how many calls ran under which split. With `return_lse=True` a call returns
(out, lse), lse float32 (B, S, H) in natural log: the model layout diffusers' backends return.

`flash_attention_backend(precision="fp8")` serves every call at the opt-in FP8 precision
(flash_kernel.fp8: quantized, not exact): on a device without an FP8 kernel each call raises
fp8.Fp8Unavailable rather than running exact attention in its place, and the counts say "fp8".
`fp8_min_keys=N` keeps calls with fewer than N keys (as the kernel sees them: per rank, per ring
step under context parallelism) exact: FP8 pays only on long key sequences (on an H100 it ran at
0.4x exact attention at 512 keys, level from about 16k, 1.2-1.3x at 75k-119k: docs/perf.md), so a
video DiT's text cross-attention is better left exact. The counts name each call's path.
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
    # served calls under context parallelism, by split ("ulysses 2", "ring 2", "ulysses 2 x ring 2")
    parallel: Counter = field(default_factory=Counter)
    precision: str = "exact"  # what served calls computed at: exact | fp8 (quantized, not exact)
    fp8_min_keys: int = 0  # fp8 blocks: calls with fewer keys ran exact
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, reason: str | None, path: str | None = None, split: str | None = None) -> None:
        with self._lock:
            if reason is None:
                self.served += 1
                if path:
                    self.paths[path] += 1
                if split:
                    self.parallel[split] += 1
            else:
                self.passed_on[reason] += 1

    def summary(self) -> str:
        passed = sum(self.passed_on.values())
        ran = ", ".join(f"{p}: {n}" for p, n in sorted(self.paths.items()))
        split = ", ".join(f"{p}: {n}" for p, n in sorted(self.parallel.items()))
        why = ", ".join(f"{r}: {n}" for r, n in sorted(self.passed_on.items()))
        how = " at fp8 (quantized, not exact)" if self.precision == "fp8" else ""
        if how and self.fp8_min_keys:
            how += f" from {self.fp8_min_keys} keys, exact below"
        return (f"served {self.served}{how}" + (f" ({ran})" if ran else "")
                + (f", context parallel {sum(self.parallel.values())} ({split})" if split else "")
                + f", passed on {passed}" + (f" ({why})" if why else ""))

    def to_dict(self) -> dict:
        out = {"served": self.served, "precision": self.precision, "paths": dict(sorted(self.paths.items())),
               "parallel": dict(sorted(self.parallel.items())), "passed_on": dict(sorted(self.passed_on.items()))}
        if self.precision == "fp8":  # the keys from which calls ran fp8 (0: all)
            out["fp8_min_keys"] = self.fp8_min_keys
        return out


def _refusal(lib_for, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why the kernel cannot serve this call (None: it can). Cheap checks first."""
    import torch

    if attn_mask is not None:
        return "attention mask"
    if is_causal:
        return "causal"
    if dropout_p:
        return "dropout"
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


def _split(parallel) -> str:
    """How a context-parallel call is split: "ulysses 2", "ring 2" or "ulysses 2 x ring 2"."""
    cp = parallel.context_parallel_config
    parts = [f"{name} {n}" for name, n in (("ulysses", cp.ulysses_degree), ("ring", cp.ring_degree)) if n and n > 1]
    return " x ".join(parts) or "none"


def _no_backward(ctx, grad_out, *args, **kwargs):
    # never reached: a call that needs gradients is passed on before the templated attention runs
    raise RuntimeError("flash_kernel has no backward pass")


class _BackendName(str):
    """The backend's registry key: a str, with the `.value` diffusers reads off its own enum
    names (so enable_parallelism inside the block finds it among the context-parallel backends)."""

    @property
    def value(self) -> str:
        return str(self)


@contextlib.contextmanager
def flash_attention_backend(library=None, precision: str = "exact", fp8_min_keys: int = 0):
    """Make our flash kernel diffusers' active attention backend inside the block; yields the
    DispatchCounts. `library`: a loaded flash_kernel.Library (default: the one built for each
    tensor's device, as flash_kernel.attention picks it). `precision`: "exact" or "fp8" (opt-in
    quantized attention, flash_kernel.fp8; refused per call where the device has no FP8 kernel).
    `fp8_min_keys`: with fp8, calls with fewer keys than this run exact (0: none)."""
    from flash_kernel import fp8

    fp8.check_precision(precision)
    if isinstance(fp8_min_keys, bool) or not isinstance(fp8_min_keys, int) or fp8_min_keys < 0:
        raise ValueError(f"fp8_min_keys must be a whole number of keys, 0 or more, not {fp8_min_keys!r}")
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry
    except ImportError as exc:
        raise ImportError(f"flash_attention_backend needs diffusers with its attention dispatcher "
                          f"(diffusers.models.attention_dispatch): {exc}") from None
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention as _templated

    import flash_kernel

    lib_for = (lambda device: library) if library is not None else flash_kernel.library_for
    counts = DispatchCounts(precision=precision, fp8_min_keys=fp8_min_keys if precision == "fp8" else 0)

    def attend(lib, query, key, value, scale, return_lse):
        """One attention in diffusers' (B, S, H, D) layout at the block's precision; the path it ran."""
        import torch

        if precision == "fp8" and key.shape[1] >= fp8_min_keys:  # the CPU reference, or the FP8 kernel on CUDA
            out = fp8.attention(query, key, value, scale, "bnhd", return_lse, library=lib)
            return out, "fp8" if query.device.type == "cuda" else "fp8 reference"
        result = lib.attention(query, key, value, scale=scale, layout="bnhd", return_lse=return_lse)
        # which kernel ran (a C call: not made while torch.compile traces, where it would break the graph)
        return result, None if torch.compiler.is_compiling() else lib.last_flash_path()
    previous_name, previous = registry.get_active_backend()
    previous_args = registry._supported_arg_names[previous_name]

    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        """One attention on this rank's tensors: diffusers' forward-op contract (its templated
        context-parallel attention calls it once per Ulysses call, once per ring step), (B, S, H, D)
        in and out, lse (B, S, H). Nothing is saved for a backward (there is none)."""
        # the lse only where it is asked for (ring attention merges by it; Ulysses does not)
        result, ran.path = attend(lib_for(query.device), query, key, value, scale, return_lse)
        if not return_lse:
            return result
        out, lse = result
        return out, lse.transpose(1, 2)  # (B, S, H): contiguous, as the kernel wrote it for "bnhd"

    ran = threading.local()  # the path the forward op last ran on this thread

    def backend(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                _parallel_config=None):
        if precision == "fp8":  # no FP8 kernel on this device: refused, never served exact instead
            fp8.check_device(query.device, library)
        why = _refusal(lib_for, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if why is None and _parallel_config is None:  # diffusers hands backends (B, N, H, D): our "bnhd" layout
            out = forward_op(None, query, key, value, scale=scale, return_lse=return_lse)  # sets ran.path
            counts.count(None, ran.path)
            return out
        if why is None:  # context parallel: diffusers' communication, our kernel as the forward op
            ran.path = None
            out = _templated(query, key, value, None, dropout_p, is_causal, scale, False, return_lse,
                             forward_op=forward_op, backward_op=_no_backward, _parallel_config=_parallel_config)
            counts.count(None, ran.path, _split(_parallel_config))
            return out
        counts.count(why)
        kwargs = dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                      _parallel_config=_parallel_config)
        return previous(**{k: v for k, v in kwargs.items() if k in previous_args})

    name = _BackendName(f"{BACKEND_NAME}_{id(counts):x}")  # one key per block: blocks nest
    registry._backends[name] = backend
    registry._constraints[name] = []
    registry._supported_arg_names[name] = {"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                           "enable_gqa", "return_lse", "_parallel_config"}
    registry._supports_context_parallel.add(str(name))
    registry.set_active_backend(name)
    try:
        yield counts
    finally:
        registry.set_active_backend(previous_name)
        for table in (registry._backends, registry._constraints, registry._supported_arg_names):
            table.pop(name, None)
        registry._supports_context_parallel.discard(str(name))

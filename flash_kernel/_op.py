"""The torch custom ops `flash_kernel::attention` and `flash_kernel::naive_attention`.

Registered with torch.library.custom_op (plus a fake implementation for meta tensors and
torch.compile), so a model can call them in place of F.scaled_dot_product_attention. The output
is allocated by torch (inside a CUDA graph capture that means the graph's memory pool) and the
kernel is launched on torch.cuda.current_stream(); the C flash path itself never allocates or
synchronises, so the op is safe to capture. Forward only: there is no backward.
`flash_kernel::attention_lse` and `flash_kernel::naive_attention_lse` return (out, lse) as well:
lse float32 (B, H, Nq), the natural-log log-sum-exp of each row (flash_kernel._binding.lse_like).
"""

from __future__ import annotations

import torch

from flash_kernel import _binding


def _out_like(q: torch.Tensor) -> torch.Tensor:
    # q's shape, dtype and device, dense in q's logical layout (bhnd or bnhd)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@torch.library.custom_op("flash_kernel::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, layout: str,
                 library: str) -> torch.Tensor:
    lib = _binding.load(library)
    q, k, v = _binding.check_inputs(q, k, v, layout, lib.head_dims)
    o = _out_like(q)
    lib.run_into(q, k, v, o, scale, layout, naive=False)
    return o


@torch.library.custom_op("flash_kernel::naive_attention", mutates_args=())
def naive_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, layout: str,
                       library: str) -> torch.Tensor:
    lib = _binding.load(library)
    q, k, v = _binding.check_inputs(q, k, v, layout, lib.head_dims)
    o = _out_like(q)
    lib.run_into(q, k, v, o, scale, layout, naive=True)
    return o


def _with_lse(q, k, v, scale, layout, library, naive: bool):
    lib = _binding.load(library)
    q, k, v = _binding.check_inputs(q, k, v, layout, lib.head_dims)
    o = _out_like(q)
    lse = _binding.lse_like(q, layout)
    lib.run_into(q, k, v, o, scale, layout, naive=naive, lse=lse)
    return o, lse


@torch.library.custom_op("flash_kernel::attention_lse", mutates_args=())
def attention_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, layout: str,
                     library: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _with_lse(q, k, v, scale, layout, library, naive=False)


@torch.library.custom_op("flash_kernel::naive_attention_lse", mutates_args=())
def naive_attention_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, layout: str,
                           library: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _with_lse(q, k, v, scale, layout, library, naive=True)


@attention_op.register_fake
def _attention_fake(q, k, v, scale, layout, library):
    return _out_like(q)


@naive_attention_op.register_fake
def _naive_attention_fake(q, k, v, scale, layout, library):
    return _out_like(q)


@attention_lse_op.register_fake
def _attention_lse_fake(q, k, v, scale, layout, library):
    return _out_like(q), _binding.lse_like(q, layout)


@naive_attention_lse_op.register_fake
def _naive_attention_lse_fake(q, k, v, scale, layout, library):
    return _out_like(q), _binding.lse_like(q, layout)


_OPS = {(False, False): attention_op, (True, False): naive_attention_op,
        (False, True): attention_lse_op, (True, True): naive_attention_lse_op}


def call(lib, q, k, v, scale: float, layout: str, naive: bool, return_lse: bool = False):
    return _OPS[naive, bool(return_lse)](q, k, v, float(scale), layout, lib.path)


@torch.compiler.assume_constant_result
def _library_path(kind: str) -> str:
    # Run once while tracing, its result baked into the graph as a constant: the file-system
    # lookup is not traced (Dynamo cannot trace os.stat), and the compiled graph holds no lookup.
    # The lookup is the package's (flash_kernel.library_for), handed over when the package loaded.
    return _binding.library_lookup(kind).path


def traced_call(q, k, v, scale, layout: str, naive: bool, return_lse: bool = False):
    """The public functions' body under torch.compile: the registered op on the library for q's
    device. The scale is checked where the op runs (a traced float has no fp32 range check)."""
    op = _OPS[naive, bool(return_lse)]
    return op(q, k, v, 0.0 if scale is None else float(scale), layout, _library_path(q.device.type))

"""Context parallelism for the pipeline (`--ulysses N`, `--ring N`, launched with torchrun).

The transformer is split the way diffusers splits it (`model.enable_parallelism` with a
`ContextParallelConfig`: its hooks shard the video tokens and RoPE over the ranks and gather the
output), and every swapped self-attention core runs inside diffusers' templated context-parallel
attention (`_templated_context_parallel_attention`: Ulysses all-to-all of heads, ring passing of
K/V merged by the log-sum-exp, or both), with a forward op per core that returns that
log-sum-exp: ours through `return_lse`, SDPA's cuDNN and FlashAttention-2 backends through the
aten ops diffusers' own backends call. Text cross-attention is not split (Wan keeps the text on
every rank) and runs as in one process. The communication is torch.distributed's: NCCL on CUDA,
gloo on the CPU. No layer of our own sits between the ranks.

A core's timed call is the whole templated attention (its all-to-all or K/V passing included).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

from audit.errors import UsageError

# Cores whose forward op returns the log-sum-exp that ring attention merges by; the others
# (SDPA's math, efficient and auto-selected backends) run under Ulysses alone.
LSE_CORES = ("flash", "naive", "sdpa-cudnn", "sdpa-flash")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ParallelSetup:
    """A context-parallel run: the split and this process's place in it."""

    ulysses: int
    ring: int
    world_size: int
    rank: int
    local_rank: int

    @property
    def split(self) -> str:
        return " x ".join(f"{n} {k}" for n, k in (("ulysses", self.ulysses), ("ring", self.ring)) if k > 1)

    def to_dict(self) -> dict:
        return {"ulysses_degree": self.ulysses, "ring_degree": self.ring, "world_size": self.world_size,
                "split": self.split, "communication": "torch.distributed through diffusers' context-parallel "
                                                      "attention (NCCL on CUDA, gloo on the CPU)"}


def from_environment(ulysses: int, ring: int, env=None) -> ParallelSetup | None:
    """The setup for --ulysses/--ring (None when both are 1), read off torchrun's environment;
    a one-line UsageError when the process was not started by torchrun or the world size is not
    ulysses * ring."""
    env = os.environ if env is None else env
    for name, n in (("--ulysses", ulysses), ("--ring", ring)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UsageError(f"{name} must be a positive integer, got {n!r}")
    if ulysses == 1 and ring == 1:
        return None
    missing = [v for v in TORCHRUN_VARS if not env.get(v)]
    if missing:
        raise UsageError(f"--ulysses/--ring need one process per rank, started by torchrun (e.g. torchrun "
                         f"--nproc-per-node {ulysses * ring} -m audit.cli pipeline ...); {', '.join(missing)} "
                         f"not set")
    try:
        world, rank, local = (int(env[v]) for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    except ValueError:
        raise UsageError("WORLD_SIZE, RANK and LOCAL_RANK must be integers (torchrun sets them)") from None
    if world != ulysses * ring:
        raise UsageError(f"--ulysses {ulysses} x --ring {ring} needs {ulysses * ring} processes; torchrun "
                         f"started {world} (--nproc-per-node)")
    if not 0 <= rank < world:
        raise UsageError(f"RANK {rank} is outside the world of {world}")
    return ParallelSetup(ulysses, ring, world, rank, local)


def check_run(setup: ParallelSetup, names: list[str], heads: int, tokens: int) -> None:
    """What the split needs of the run: heads a multiple of the Ulysses degree, tokens of the
    world size, and cores that return the log-sum-exp where ring attention merges by it."""
    if heads % setup.ulysses:
        raise UsageError(f"--ulysses {setup.ulysses} splits the heads: the preset has {heads}")
    if tokens % setup.world_size:
        raise UsageError(f"the preset's {tokens} video tokens do not split into {setup.world_size} equal parts")
    if setup.ring > 1:
        bad = [n for n in names if n not in LSE_CORES]
        if bad:
            raise UsageError(f"--ring merges partial results by the log-sum-exp, which {', '.join(bad)} does not "
                             f"return; use {', '.join(LSE_CORES)}")


def init(setup: ParallelSetup, device: str) -> None:
    """The process group (NCCL on CUDA, gloo on the CPU), this rank's GPU its LOCAL_RANK."""
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(setup.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")


def finish() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def _one_cpu_device(device: str):
    # diffusers 0.42 names a rank's device by rank % torch.accelerator.device_count(), which is 0
    # on a CPU-only torch; for a CPU run one "device" keeps that division defined while the
    # parallel config is made (the model stays where it is)
    import torch

    if device != "cpu":
        yield
        return
    saved = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = saved


def enable(transformer, setup: ParallelSetup, device: str):
    """diffusers' context parallelism on the transformer; returns its ParallelConfig."""
    from diffusers import ContextParallelConfig

    # Wan's plan without its "" entry, which splits a per-token (B, S) timestep (Wan 2.2): with
    # Wan 2.1's (B,) timestep diffusers 0.42.1 calls a logger.warning_once its logger lacks
    plan = {k: v for k, v in transformer._cp_plan.items() if k != ""}
    with _one_cpu_device(device):
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=setup.ulysses,
                                                                    ring_degree=setup.ring), cp_plan=plan)
    return transformer._parallel_config


def _forward_op(name: str, library) -> Callable:
    """diffusers' forward-op contract for core `name`: (B, S, H, D) in and out, lse (B, S, H)."""
    from diffusers.models import attention_dispatch as ad

    if name in ("flash", "naive"):
        fn = library.naive_attention if name == "naive" else library.attention

        def ours(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
            if not return_lse:  # Ulysses alone merges nothing: no lse
                return fn(query, key, value, scale=scale, layout="bnhd")
            out, lse = fn(query, key, value, scale=scale, layout="bnhd", return_lse=True)
            return out, lse.transpose(1, 2)

        return ours
    if name == "sdpa-cudnn":
        return ad._cudnn_attention_forward_op
    if name == "sdpa-flash":
        return ad._native_flash_attention_forward_op
    from audit.evidence.dit_attention import _sdpa_backend

    backend = None if name == "sdpa" else _sdpa_backend(name)

    def native(*args, **kwargs):  # no log-sum-exp: Ulysses only (check_run)
        from torch.nn.attention import sdpa_kernel

        if backend is None:
            return ad._native_attention_forward_op(*args, **kwargs)
        with sdpa_kernel(backend):
            return ad._native_attention_forward_op(*args, **kwargs)

    return native


def _no_backward(*args, **kwargs):
    raise RuntimeError("the pipeline runs forward only")


def cores_by_kind(name: str, library, parallel_config=None, make: Callable | None = None) -> dict:
    """Core `name` for self- and cross-attention: the same one, except under context parallelism
    (`parallel_config`, diffusers' ParallelConfig), where self-attention runs it inside diffusers'
    templated context-parallel attention (the text cross-attention is not split). `make`: the
    maker of plain cores (dit_attention.make_core by default)."""
    if make is None:
        from audit.evidence.dit_attention import make_core as make
    core = make(name, library)
    if parallel_config is None:
        return {"self": core, "cross": core}
    return {"self": wrap_core(name, core, library, parallel_config), "cross": core}


def wrap_core(name: str, core: Callable, library, config) -> Callable:
    """Core `name` as a self-attention core under context parallelism: diffusers' templated
    attention on this rank's (B, S/world, H, D) tensors, our forward op for the core inside."""
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention

    op = _forward_op(name, library)

    def parallel_core(q, k, v):
        return _templated_context_parallel_attention(q, k, v, None, 0.0, False, None, False, False, forward_op=op,
                                                     backward_op=_no_backward, _parallel_config=config)

    parallel_core.__wrapped__ = core
    return parallel_core

"""Our kernel under diffusers' context parallelism, on the CPU: torch.distributed's gloo backend,
2 and 4 processes (torch.multiprocessing, forkserver), a small WanTransformer3DModel split by Ulysses
(ulysses_degree=2), ring (ring_degree=2) and both (2 x 2). Every rank's output must equal the
single-process output within the kernel's own tolerance, and every attention call of every rank
must have been served by the kernel (the same on GPUs with NCCL where the host has them) (the self-attentions through diffusers' templated
context-parallel attention with our forward op, the text cross-attentions, which Wan does not
split, directly): the counts are checked rank by rank."""

from __future__ import annotations

import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from audit.kernel_build.builder import ensure_built  # noqa: E402

LAYERS = 2
HEADS = 4  # divisible by the Ulysses degree
TOL = 1e-4  # the CPU kernel's fp32 tolerance (tests/test_kernel_cpu.py)
# (ulysses, ring) splits: those of one world size share a process group
SPLITS = {2: [(2, 1), (1, 2)], 4: [(2, 2)]}


def _wan(seed: int):
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=64,
                                  in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                                  num_layers=LAYERS, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                  rope_max_seq_len=64)
    return model.eval()


def _inputs(seed: int, device: str = "cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed + 1)
    latents = torch.randn(1, 4, 2, 8, 8, generator=gen)  # 2 frames of 8 x 8: 32 tokens, 8 a rank at 4
    text = torch.randn(1, 7, 32, generator=gen)
    return latents.to(device, dtype), text.to(device, dtype)


def _forward(model, latents, text):
    with torch.no_grad():
        return model(hidden_states=latents, timestep=torch.tensor([700], device=latents.device),
                     encoder_hidden_states=text, return_dict=False)[0]


def _cp_plan(model):
    # Wan's plan without its "" entry, which splits a per-token (B, S) timestep (Wan 2.2): a Wan 2.1
    # timestep of shape (B,) makes diffusers 0.42.1 call logger.warning_once, which its logger lacks
    return {k: v for k, v in model._cp_plan.items() if k != ""}


def _worker(rank: int, world: int, port: int, library: str | None, seed: int, out: str, device: str = "cpu") -> None:
    """One rank: each split of this world size on a model of its own, under our backend (on the
    CPU with gloo and `library`; on CUDA with NCCL, a GPU a rank, bf16, the library built for CUDA)."""
    if device == "cpu":
        torch.set_num_threads(1)  # 2 cores for up to 4 processes
        # diffusers 0.42 names the rank's device by rank % torch.accelerator.device_count(), 0 on a
        # CPU-only torch; one "device" keeps that division defined (the model stays on the CPU)
        torch.accelerator.device_count = lambda: 1
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from diffusers import ContextParallelConfig

        import flash_kernel
        from flash_kernel.diffusers_backend import flash_attention_backend

        lib = flash_kernel.load(library) if library else None
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        latents, text = _inputs(seed, device, dtype)
        results = {}
        for i, (u, r) in enumerate(SPLITS[world]):
            model = _wan(seed).to(device, dtype)
            config = ContextParallelConfig(ulysses_degree=u, ring_degree=r)
            start = time.perf_counter()
            if i == 0:  # enabled before the block: diffusers' native backend is the active one then
                model.enable_parallelism(config=config, cp_plan=_cp_plan(model))
            with flash_attention_backend(lib) as counts:
                if i > 0:  # enabled inside it: our backend must pass diffusers' context-parallel check
                    model.enable_parallelism(config=config, cp_plan=_cp_plan(model))
                o = _forward(model, latents, text)
            results[(u, r)] = {"out": o.cpu(), "counts": counts.to_dict(), "seconds": time.perf_counter() - start}
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def library(fixture_root) -> str:
    out = fixture_root / "fk_build"  # the folder the other kernel tests build into: built once
    tb = ensure_built(["cpu"], out).get("cpu")
    assert tb.status == "built", tb.reason
    return str(out / "cpu" / "libflash_kernel.so")


@pytest.fixture(scope="module")
def single(library):
    """The single-process output of the model, on the kernel, and diffusers' native (SDPA) one."""
    import flash_kernel
    from flash_kernel.diffusers_backend import flash_attention_backend

    seed = int.from_bytes(os.urandom(4), "little") % 2**31
    latents, text = _inputs(seed)
    model = _wan(seed)
    with flash_attention_backend(flash_kernel.load(library)) as counts:
        ours = _forward(model, latents, text)
    assert counts.served == 2 * LAYERS and not counts.passed_on
    return seed, ours, _forward(model, latents, text)


def _spawn(world: int, library: str | None, seed: int, out: str, device: str) -> float:
    """The ranks, forked from a forkserver that imported torch and diffusers once (and never ran a
    thread pool or touched CUDA), so a rank starts in a fraction of a fresh interpreter's import
    time; returns the seconds they took."""
    start = time.perf_counter()
    mp.set_forkserver_preload(["torch", "torch.distributed", "diffusers", "diffusers.models.transformers.transformer_wan",
                               "flash_kernel.diffusers_backend"])
    mp.start_processes(_worker, args=(world, _free_port(), library, seed, out, device), nprocs=world, join=True,
                       start_method="forkserver")
    return time.perf_counter() - start


def _check_ranks(out: str, world: int, ours, native, tol: float, paths: set[str], seed: int) -> None:
    for rank in range(world):
        results = torch.load(f"{out}.{rank}")
        for (u, r), res in results.items():
            split = " x ".join(f"{n} {k}" for n, k in (("ulysses", u), ("ring", r)) if k > 1)
            what = f"{split}, rank {rank}/{world} (seed {seed})"
            counts = res["counts"]
            # per block: the self-attention under the split, the text cross-attention (not split) directly
            assert (counts["served"], counts["parallel"], counts["passed_on"]) == (2 * LAYERS, {split: LAYERS}, {}), \
                f"{what}: {counts}"
            assert sum(counts["paths"].values()) == 2 * LAYERS and set(counts["paths"]) <= paths, f"{what}: {counts}"
            err = ((res["out"].double() - ours.double()).norm() / ours.double().norm()).item()
            assert err <= tol, f"{what}: rel L2 {err:.3g} against one process"
            assert ((res["out"].double() - native.double()).norm() / native.double().norm()).item() <= tol, what


@pytest.mark.parametrize("world", sorted(SPLITS))
def test_context_parallel_wan_equals_one_process(library, single, tmp_path, world):
    seed, ours, native = single
    out = str(tmp_path / "result")
    spawned = _spawn(world, library, seed, out, "cpu")
    _check_ranks(out, world, ours, native, TOL, {"cpu"}, seed)
    print(f"{world} processes: {spawned:.1f} s spawned and run")


@pytest.mark.gpu
@pytest.mark.parametrize("world", sorted(SPLITS))
def test_context_parallel_wan_on_gpus_with_nccl(tmp_path, world):
    """The same on GPUs (NCCL, a GPU a rank, bf16, the library built for CUDA): every call served
    by a tensor-core path, each rank's output against one GPU's within bf16's tolerance."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs (run on the device machine)")
    from flash_kernel.diffusers_backend import flash_attention_backend

    seed = int.from_bytes(os.urandom(4), "little") % 2**31
    latents, text = _inputs(seed, "cuda", torch.bfloat16)
    model = _wan(seed).to("cuda", torch.bfloat16)
    with flash_attention_backend() as counts:
        ours = _forward(model, latents, text).cpu()
    assert counts.served == 2 * LAYERS and not counts.passed_on
    native = _forward(model, latents, text).cpu()
    del model
    out = str(tmp_path / "result")
    _spawn(world, None, seed, out, "cuda")
    _check_ranks(out, world, ours, native, 2e-2, {"wgmma", "mma_sync"}, seed)

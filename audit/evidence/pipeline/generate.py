"""The work that gets timed: a CFG step, the denoise loop, the VAE decode, the swap's own check."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from audit.evidence.dit_attention import PROCESSORS, CoreTimer, restore_attention, swap_attention
from audit.evidence.pipeline.model import make_scheduler
from audit.evidence.pipeline.options import TEXT_SHAPE, PipelinePreset
from audit.evidence.pipeline.results import InstrumentedStep


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Inputs:
    latents: object  # fp32, the loop's state
    prompt: object  # transformer dtype
    negative: object


def make_inputs(preset: PipelinePreset, device, dtype, seed: int) -> _Inputs:
    import torch

    def randn(shape, s):
        g = torch.Generator(device="cpu").manual_seed(s)
        return torch.randn(shape, generator=g, dtype=torch.float32)

    return _Inputs(latents=randn(preset.latent_shape(), seed + 3).to(device),
                   prompt=randn(TEXT_SHAPE, seed + 1).to(device, dtype),
                   negative=randn(TEXT_SHAPE, seed + 2).to(device, dtype))


def cfg_step(transformer, scheduler, latents, t, inputs: _Inputs, guidance: float, dtype):
    """One WanPipeline step: cond and uncond passes, CFG combine, UniPC step."""
    x = latents.to(dtype)
    ts = t.expand(latents.shape[0])
    cond = transformer(hidden_states=x, timestep=ts, encoder_hidden_states=inputs.prompt,
                       return_dict=False)[0]
    uncond = transformer(hidden_states=x, timestep=ts, encoder_hidden_states=inputs.negative,
                         return_dict=False)[0]
    noise = uncond + guidance * (cond - uncond)
    return scheduler.step(noise, t, latents, return_dict=False)[0]


def denoise(transformer, inputs: _Inputs, steps: int, guidance: float, dtype, device,
            on_step: Callable[[int, float], None] | None = None):
    """The timed loop. Returns (final fp32 latents, per-step seconds)."""
    sched = make_scheduler()
    sched.set_timesteps(steps, device=device)
    sched.set_begin_index(0)
    latents = inputs.latents.clone()
    times = []
    for i, t in enumerate(sched.timesteps):
        sync(device)
        t0 = time.perf_counter()
        latents = cfg_step(transformer, sched, latents, t, inputs, guidance, dtype)
        sync(device)
        times.append(time.perf_counter() - t0)
        if on_step:
            on_step(i, times[-1])
    return latents, times


def instrumented_step(transformer, timer: CoreTimer, inputs: _Inputs, steps: int, guidance: float,
                      dtype, device) -> InstrumentedStep:
    """The first step again, on a fresh scheduler, with every attention core call timed."""
    import statistics

    sched = make_scheduler()
    sched.set_timesteps(steps, device=device)
    sched.set_begin_index(0)
    t = sched.timesteps[0]
    timer.reset()
    timer.enabled = True
    try:
        sync(device)
        t0 = time.perf_counter()
        cfg_step(transformer, sched, inputs.latents.clone(), t, inputs, guidance, dtype)
        sync(device)
        step_ms = (time.perf_counter() - t0) * 1e3
        ms = list(timer.collect())
        kinds = timer.by_kind()
    finally:
        timer.enabled = False
        timer.reset()
    if not ms:
        raise RuntimeError("the instrumented step recorded no attention call: the swap is not active")
    return InstrumentedStep(step_ms, len(ms), sum(ms), statistics.median(ms), statistics.fmean(ms), ms,
                            kinds)


def verify_swap(transformer, inputs: _Inputs, dtype, swap: tuple[str, ...] = ("self",),
                parallel_config=None, library=None) -> dict:
    """One DiT pass with the stock processors and one with ours wrapping SDPA (in every module
    of `swap`): they must be bit-identical (torch.equal) before any timing of a swapped core is
    trusted. A mismatch is re-checked stock-vs-stock to tell a nondeterministic backend from a
    wrong processor. Under ring attention (`parallel_config` with a ring degree > 1), whose merge
    needs a log-sum-exp that diffusers' native SDPA backend does not return, both passes run our
    kernel (`library`): the stock processors through our diffusers backend, ours with the flash core."""
    import contextlib

    import torch

    def forward():
        t = torch.tensor([900.0], device=inputs.latents.device)
        return transformer(hidden_states=inputs.latents.to(dtype), timestep=t,
                           encoder_hidden_states=inputs.prompt, return_dict=False)[0]

    from audit.evidence.pipeline.parallel import cores_by_kind

    ring = parallel_config is not None and parallel_config.context_parallel_config.ring_degree > 1
    name = "flash" if ring else "sdpa"
    cores = cores_by_kind(name, library if ring else None, parallel_config)
    if ring:
        from flash_kernel.diffusers_backend import flash_attention_backend

        stock_backend = lambda: flash_attention_backend(library)  # noqa: E731
    else:
        stock_backend = contextlib.nullcontext

    def stock_forward():
        with stock_backend():
            return forward()

    stock = stock_forward()
    before = {}
    try:
        for kind in swap:
            before[kind] = swap_attention(transformer, kind,
                                          lambda i, kind=kind: PROCESSORS[kind](cores[kind], name))
        ours = forward()
    finally:
        for kind, procs in before.items():
            restore_attention(transformer, kind, procs)
    exact = bool(torch.equal(stock, ours))
    out = {"bit_exact": exact, "max_abs_diff": float((stock.float() - ours.float()).abs().max()),
           "swapped": list(swap),
           "what": ("one DiT pass, stock WanAttnProcessor vs the swapped processors with SDPA inside" if not ring
                    else "one DiT pass under ring attention, stock WanAttnProcessor on our diffusers backend vs the "
                         "swapped processors with our flash core inside")}
    if not exact:
        out["stock_deterministic"] = bool(torch.equal(stock, stock_forward()))
    return out


def decode(vae, latents, device):
    """WanPipeline's decode: de-normalise with the VAE's latent statistics, decode; timed."""
    import torch

    z = latents.to(device, vae.dtype)
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    z = z / inv_std + mean
    sync(device)
    t0 = time.perf_counter()
    frames = vae.decode(z, return_dict=False)[0]
    sync(device)
    return frames, time.perf_counter() - t0


def nonfinite(x) -> int:
    import torch

    return int((~torch.isfinite(x)).sum())

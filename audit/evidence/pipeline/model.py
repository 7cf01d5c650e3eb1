"""The diffusers pieces built from configs with seeded weights: transformer, VAE, scheduler."""

from __future__ import annotations

import platform

from audit.errors import UsageError
from audit.evidence.pipeline.options import WAN_SCHEDULER, PipelinePreset


def import_diffusers():
    try:
        import diffusers
        from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    except Exception as exc:
        raise UsageError("the pipeline needs diffusers==0.42.1 (pip install 'sovereign-audit[pipeline]'): "
                         f"{type(exc).__name__}: {exc}") from None
    return diffusers, WanTransformer3DModel, AutoencoderKLWan, UniPCMultistepScheduler


def keep_fp32_names(model) -> list[str]:
    return list(getattr(type(model), "_keep_in_fp32_modules", None) or [])


def cast_like_from_pretrained(model, dtype) -> dict:
    """Casts floating parameters/buffers to `dtype`, except those under a module named in the
    model's `_keep_in_fp32_modules` (matched on dotted-name components, as diffusers' loader
    does). A blanket `.to(dtype)` would also cast RoPE, the time embedder and the norms.
    Returns {"kept_fp32": [...names...], "cast": count}."""
    import torch

    keep = keep_fp32_names(model)
    kept, cast = [], 0

    def wants_fp32(name: str) -> bool:
        return any(k in name.split(".") for k in keep)

    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if not p.is_floating_point():
            continue
        if wants_fp32(name):
            kept.append(name)
            continue
        if p.dtype != dtype:
            p.data = p.data.to(dtype)
            cast += 1
    del torch
    return {"kept_fp32_modules": keep, "kept_fp32": kept, "cast": cast}


def build_transformer(preset: PipelinePreset, device, dtype, seed: int):
    import torch

    _, WanTransformer3DModel, _, _ = import_diffusers()
    cfg = dict(preset.transformer)
    cfg["patch_size"] = tuple(cfg["patch_size"])
    torch.manual_seed(seed)
    with torch.device(device):  # init on the device: 1.3B params initialise in seconds on a GPU
        model = WanTransformer3DModel(**cfg)
    model.eval().requires_grad_(False)
    casting = cast_like_from_pretrained(model, dtype)
    return model, casting


def build_vae(preset: PipelinePreset, device, dtype, seed: int, tiling: bool):
    import torch

    _, _, AutoencoderKLWan, _ = import_diffusers()
    torch.manual_seed(seed + 100)
    with torch.device(device):
        vae = AutoencoderKLWan(**preset.vae)
    vae.eval().requires_grad_(False)
    cast_like_from_pretrained(vae, dtype)  # AutoencoderKLWan keeps nothing in fp32
    tiled = False
    if tiling and hasattr(vae, "enable_tiling"):
        vae.enable_tiling()
        tiled = True
    if hasattr(vae, "enable_slicing"):
        vae.enable_slicing()
    return vae, tiled


def make_scheduler(overrides: dict | None = None):
    _, _, _, UniPCMultistepScheduler = import_diffusers()
    return UniPCMultistepScheduler(**dict(WAN_SCHEDULER, **(overrides or {})))


def versions() -> dict:
    import torch

    diffusers, *_ = import_diffusers()
    return {"torch": torch.__version__, "diffusers": diffusers.__version__,
            "cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None),
            "python": platform.python_version()}

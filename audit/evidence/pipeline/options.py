"""What a run is asked for: the Wan2.1 presets, the default cores and swaps, the library and device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from audit.errors import UsageError
from audit.evidence.dit_attention import CORES, OUR_CORES

VAE_ROUNDS = 2  # timed decodes per core, in turns (after one untimed decode each)
CALIBRATION_REL = 1e-3

# Wan2.1-T2V-1.3B, as its diffusers transformer config (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json).
WAN_1_3B = {
    "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128,
    "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960,
    "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
}
# Wan2.1-T2V-14B's (Wan-AI/Wan2.1-T2V-14B-Diffusers, transformer/config.json): heads, FFN width, depth
WAN_14B = dict(WAN_1_3B, num_attention_heads=40, ffn_dim=13824, num_layers=40)
# Wan's scheduler: UniPC in flow-prediction mode, flow shift 3.0 for 480p (diffusers' Wan docs).
WAN_SCHEDULER = {"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                 "num_train_timesteps": 1000, "flow_shift": 3.0, "solver_order": 2}
TEXT_SHAPE = (1, 512, 4096)  # umT5-XXL's output for one prompt
# The cores run when --attention is not given: on CUDA stock PyTorch's choice first (the
# reference), on the CPU our pre-flash path (PyTorch's CPU SDPA has no cuDNN to stand for).
DEFAULT_ATTENTION = {"cuda": ("sdpa-cudnn", "flash", "sdpa-flash"), "cpu": ("naive", "flash")}
DEFAULT_SWAP = ("self", "cross")


@dataclass(frozen=True)
class PipelinePreset:
    name: str
    about: str
    transformer: dict
    vae: dict  # AutoencoderKLWan kwargs ({} = its defaults, the real Wan VAE)
    height: int
    width: int
    frames: int
    steps: int  # default --steps
    guidance_scale: float = 5.0

    def latent_shape(self) -> tuple[int, int, int, int, int]:
        # Wan's VAE: 4x temporal (causal: first frame alone), 8x spatial compression.
        c = self.transformer["in_channels"]
        return (1, c, (self.frames - 1) // 4 + 1, self.height // 8, self.width // 8)

    def tokens(self) -> int:
        _, _, f, h, w = self.latent_shape()
        pt, ph, pw = self.transformer["patch_size"]
        return (f // pt) * (h // ph) * (w // pw)

    def to_dict(self) -> dict:
        return {"name": self.name, "about": self.about, "transformer": dict(self.transformer),
                "vae": dict(self.vae), "height": self.height, "width": self.width,
                "frames": self.frames, "default_steps": self.steps,
                "guidance_scale": self.guidance_scale, "latent_shape": list(self.latent_shape()),
                "tokens": self.tokens()}


PRESETS: dict[str, PipelinePreset] = {
    # CPU/CI: the real block structure (head dim 128, RoPE, q/k RMS norm, cross-attn to umT5-shaped
    # text), 2 layers of 2 heads, 17 frames at 48x80 (75 tokens: ragged tiles), a small VAE
    # (base_dim 16; the default Wan VAE alone takes ~10 s per decode on a CPU).
    "tiny": PipelinePreset(
        "tiny", "CPU smoke test: 2 layers, 2x128 heads, 17 frames 48x80, small VAE",
        dict(WAN_1_3B, num_attention_heads=2, ffn_dim=512, num_layers=2),
        {"base_dim": 16}, 48, 80, 17, 4),
    # Context parallelism on the CPU (--ulysses/--ring under torchrun with gloo): tiny at 48x64,
    # 60 tokens, which split 2, 3 or 4 ways (tiny's 75 do not).
    "tiny-cp": PipelinePreset(
        "tiny-cp", "CPU smoke test of context parallelism: tiny at 17 frames 48x64 (60 tokens)",
        dict(WAN_1_3B, num_attention_heads=2, ffn_dim=512, num_layers=2),
        {"base_dim": 16}, 48, 64, 17, 4),
    "wan-480p": PipelinePreset(
        "wan-480p", "Wan2.1-T2V-1.3B, 480x832, 81 frames (32760 tokens), Wan VAE",
        dict(WAN_1_3B), {}, 480, 832, 81, 50),
}


def get_preset(name: str) -> PipelinePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown pipeline preset {name!r}; known: {', '.join(PRESETS)}") from None


def parse_attention(spec: str | Sequence[str]) -> list[str]:
    """'naive,flash,sdpa-flash' -> ['naive', 'flash', 'sdpa-flash']; the first is the reference."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [s.strip() for s in items if s.strip()]
    if not names:
        raise UsageError("--attention needs at least one of " + ", ".join(CORES))
    for n in names:
        if n not in CORES:
            raise UsageError(f"unknown attention {n!r}; use one of {', '.join(CORES)}")
    if len(set(names)) != len(names):
        raise UsageError(f"--attention lists a core twice: {','.join(names)}")
    return names


def resolve_library(names: list[str], device_opt: str, lib_path: str | None, target: str | None):
    """Our library (for naive/flash) and the device to run on, or (None, device) when only SDPA
    cores were asked for. Every failure is a one-line UsageError."""
    from audit.evidence import selection as sel

    if not any(n in OUR_CORES for n in names):
        if lib_path or target:
            raise UsageError("--lib/--target given but --attention uses no core of our library")
        return None, sel.resolve_device(device_opt)
    if lib_path and target:
        raise UsageError("give --lib or --target, not both")
    if lib_path:
        lib = sel.load_library(lib_path)
        return lib, sel.resolve_device(device_opt, sel.library_device(lib))
    if target:
        lib = sel.load_library(sel.ensure_target_library(target))
        return lib, sel.resolve_device(device_opt, sel.library_device(lib))
    device = sel.resolve_device(device_opt)
    if device == "cpu":
        return sel.load_library(sel.ensure_target_library("cpu")), device
    fk = sel._binding()
    try:
        lib = fk.library_for("cuda")
    except Exception as exc:
        raise UsageError(f"no kernel library for cuda: {' '.join(str(exc).split())} "
                         "(build one: sovereign-audit build --target sm_90a)") from None
    return lib, sel.resolve_device(device, sel.library_device(lib))


def library_info(lib) -> dict | None:
    if lib is None:
        return None
    info = {}
    for key in ("path", "target", "flash_path", "abi_version", "head_dims"):
        try:
            v = getattr(lib, key)
            info[key] = list(v) if key == "head_dims" else (str(v) if key == "path" else v)
        except Exception:
            info[key] = None
    return info

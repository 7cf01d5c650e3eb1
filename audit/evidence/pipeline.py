"""The end-to-end video DiT measurement: Wan2.1-T2V built from its diffusers config with seeded
random weights, a UniPC flow-matching loop with classifier-free guidance, then the VAE decode,
run once per attention core swapped into every self-attention and (by default) every text
cross-attention (see dit_attention.py).

The reference core is the first of --attention. On CUDA the default is what a user would run
without us: stock PyTorch's SDPA with its cuDNN backend (sdpa-cudnn), then our flash kernel, then
SDPA's FlashAttention-2 backend (sdpa-flash); so the table says what swapping our kernel in gains
over stock PyTorch. On the CPU (no cuDNN) it is our naive pre-flash path, then flash. Both self-
and cross-attention are swapped by default, as our diffusers backend (flash_kernel.diffusers_backend)
swaps every call diffusers' attention dispatcher makes; --swap self measures self-attention alone.

Nothing is downloaded: every module is built from a config in this file. Random weights are
enough for timing (the FLOPs and memory traffic do not depend on the values) and for parity
against the pre-flash run, but random-weight latents damp attention errors, so every parity
figure comes with a calibration: the same metric for a known 1e-3 relative perturbation of the
attention output.

How time is measured (also written into the report's "method"), so that the order of the cores
cannot bias it:
- Every core is warm before anything is timed: one untimed step each (weights, allocator, the
  core's first call), and an untimed tiny decode initialises the VAE's backends.
- Attention share: a separate instrumented step per core (the first step, on a fresh scheduler)
  where every swapped attention core call is bracketed by CUDA events (perf_counter on CPU) and the
  whole step by a synchronised timer; share = sum(core) / step. Timing events add no
  synchronisation, so the instrumented step runs like an ordinary one.
- DiT loop: the cores take turns step by step (AB, BA, AB, ...), each with its own scheduler and
  latents; torch.cuda.synchronize() then perf_counter around every step (two DiT passes, the CFG
  combine and the scheduler step); the loop time is the sum of the steps.
- Op speedup s_op = median per-call core time of the reference / of the core, from those steps
  (with self- and cross-attention swapped: the step's summed core time of the reference / of the
  core, the two kinds of call resampled apart, since their times differ by an order of magnitude);
  Amdahl's prediction = 1 / ((1 - p) + p / s_op) with p the reference's share; consistency.py
  marks a measured speedup that its prediction refutes.
- VAE decode: the same work for every core, so it is timed in turns too: one untimed decode of
  every core's latents, then VAE_ROUNDS timed rounds; synchronised perf_counter around vae.decode.

torch and diffusers are imported inside functions so `--help` stays cheap.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import platform
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from audit.errors import AuditError, GateFailed, UsageError
from audit.evidence.consistency import TOLERANCE
from audit.evidence.dit_attention import (CORES, OUR_CORES, PROCESSORS, SWAPS, CoreTimer,
                                          Perturbation, make_core, parse_swap, restore_attention,
                                          swap_attention)

SCHEMA = "sovereign-audit.pipeline/1"
VAE_ROUNDS = 2  # timed decodes per core, in turns (after one untimed decode each)
CALIBRATION_REL = 1e-3

# Wan2.1-T2V-1.3B, as its diffusers transformer config (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json).
WAN_1_3B = {
    "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128,
    "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960,
    "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
}
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


# ---------------------------------------------------------------------------------------------
# Typed results.

def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


@dataclass
class InstrumentedStep:
    """One CFG step with every swapped attention core call timed."""

    step_ms: float
    attention_calls: int
    attention_ms_total: float
    attention_ms_per_call_median: float
    attention_ms_per_call_mean: float
    attention_ms_samples: list[float] = field(default_factory=list)
    attention_ms_by_kind: dict[str, list[float]] = field(default_factory=dict)  # "self", "cross"

    @property
    def share(self) -> float:
        return self.attention_ms_total / self.step_ms if self.step_ms > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"step_ms": _r(self.step_ms, 4), "attention_calls": self.attention_calls,
                "attention_ms_total": _r(self.attention_ms_total, 4),
                "attention_ms_per_call_median": _r(self.attention_ms_per_call_median, 5),
                "attention_ms_per_call_mean": _r(self.attention_ms_per_call_mean, 5),
                "attention_share": _r(self.share, 6),
                "attention_ms_samples": [_r(x, 5) for x in self.attention_ms_samples],
                "attention_ms_by_kind": {k: [_r(x, 5) for x in v] for k, v in self.attention_ms_by_kind.items()}}


@dataclass
class ModeRun:
    """One full generation with one attention core in every attn1."""

    attention: str
    sovereign: bool
    status: str = "ok"  # ok | skipped
    reason: str = ""
    step_s: list[float] = field(default_factory=list)
    dit_loop_s: float | None = None
    vae_decode_s: float | None = None  # median of the timed decodes
    vae_decode_samples_s: list[float] = field(default_factory=list)
    attention_calls: int = 0  # observed calls of the swapped processors during the loop
    instrumented: InstrumentedStep | None = None
    latents_nonfinite: int | None = None
    vae_reason: str = ""  # why the decode failed, when only it did

    @property
    def dit_plus_vae_s(self) -> float | None:
        if self.dit_loop_s is None or self.vae_decode_s is None:
            return None
        return self.dit_loop_s + self.vae_decode_s

    def to_dict(self) -> dict:
        step = None
        if self.step_s:
            from audit.evidence.stats import summarize

            step = summarize(self.step_s).to_dict()
        return {"attention": self.attention, "sovereign": self.sovereign, "status": self.status,
                "reason": self.reason, "dit_loop_s": _r(self.dit_loop_s, 4),
                "vae_decode_s": _r(self.vae_decode_s, 4), "vae_reason": self.vae_reason,
                "vae_decode_samples_s": [_r(x, 5) for x in self.vae_decode_samples_s],
                "dit_plus_vae_s": _r(self.dit_plus_vae_s, 4),
                "step_s": [_r(x, 5) for x in self.step_s], "step_summary_s": step,
                "attention_calls": self.attention_calls,
                "instrumented_step": self.instrumented.to_dict() if self.instrumented else None,
                "latents_nonfinite": self.latents_nonfinite}


@dataclass
class Comparison:
    """A core against the reference core (the first of --attention that ran)."""

    attention: str
    reference: str
    latents: dict | None = None  # metrics.ErrorMetrics.to_dict()
    frames: dict | None = None
    speedup_dit: float | None = None  # reference DiT loop / this one
    speedup_dit_ci: dict | None = None  # bootstrap CI of the ratio of loop times
    speedup_dit_vae: float | None = None
    speedup_dit_vae_ci: dict | None = None
    op_speedup: float | None = None  # s_op
    op_speedup_ci: dict | None = None  # bootstrap CI of the ratio of per-call medians
    reference_attention_share: float | None = None  # p
    amdahl_predicted: float | None = None
    amdahl_predicted_dit_vae: float | None = None  # the decode counted as unchanged time
    consistency: list[dict] = field(default_factory=list)  # consistency.Consistency.to_dict()

    def to_dict(self) -> dict:
        return {"attention": self.attention, "reference": self.reference,
                "latents": self.latents, "frames": self.frames,
                "speedup_dit_measured": _r(self.speedup_dit, 4), "speedup_dit_ci": self.speedup_dit_ci,
                "speedup_dit_vae_measured": _r(self.speedup_dit_vae, 4),
                "speedup_dit_vae_ci": self.speedup_dit_vae_ci,
                "op_speedup": _r(self.op_speedup, 4), "op_speedup_ci": self.op_speedup_ci,
                "reference_attention_share": _r(self.reference_attention_share, 6),
                "amdahl_predicted_dit": _r(self.amdahl_predicted, 4),
                "amdahl_predicted_dit_vae": _r(self.amdahl_predicted_dit_vae, 4),
                "consistency": list(self.consistency)}


@dataclass
class Calibration:
    """Latents of a run whose attention output carried seeded noise of `rel` * ||out||, against
    the same core's unperturbed latents."""

    attention: str
    rel: float
    seed: int
    status: str = "ok"
    reason: str = ""
    latents: dict | None = None

    def to_dict(self) -> dict:
        return {"attention": self.attention, "relative_perturbation": self.rel, "seed": self.seed,
                "status": self.status, "reason": self.reason, "latents": self.latents,
                "what": "Gaussian noise scaled to rel*||O|| (Frobenius, per call) added to every "
                        "swapped attention output; metrics of the perturbed final latents against "
                        "the unperturbed ones of the same core"}


METHOD = {
    "order": "every core warm before anything is timed (one untimed step each, then the "
             "instrumented steps); in the timed loop the cores take turns step by step, the first "
             "of each round rotating (AB, BA, ...), each with its own scheduler and latents",
    "dit_loop": "sum of per-step times; each step (two DiT passes for CFG, the CFG combine, the "
                "UniPC step) timed by perf_counter after torch.cuda.synchronize()",
    "vae_decode": "perf_counter after synchronize around vae.decode (latents de-normalised with "
                  "the VAE's latents_mean/std as WanPipeline does); one untimed decode of every "
                  f"core's latents first, then {VAE_ROUNDS} timed rounds in turns; the median counts",
    "attention_share": "a separate instrumented step (the first step, on a fresh scheduler): "
                       "each swapped attention core call (config.swap: self-attention, text "
                       "cross-attention) bracketed by CUDA events (perf_counter on CPU), the step "
                       "by a synchronised timer; share = sum(core) / step",
    "op_speedup": "median per-call core time of the reference / of the core, from the "
                  "instrumented steps (same shapes, same run), with a bootstrap 95% CI; with "
                  "self- and cross-attention swapped, the ratio of the step's summed core times "
                  "instead, each kind of call resampled on its own",
    "amdahl": "1 / ((1 - p) + p / s_op), p = the reference's attention share; for DiT+VAE the "
              "decode counts as unchanged time (p scaled by D / (D + V))",
    "consistency": "a measured speedup whose 95% CI lies apart from Amdahl's prediction (over the "
                   f"op speedup's CI) by more than {100 * TOLERANCE:.0f}% is inconsistent and not claimed "
                   "(audit.evidence.consistency)",
    "speedup_ci": "percentile bootstrap of the ratio of loop times (and of loop + decode times), "
                  "each core's samples resampled independently (audit.evidence.stats)",
    "parity": "final latents and decoded frames of each core against the reference core's, in "
              "float64 (audit.evidence.metrics.compare); frames PSNR with data range 2 (the "
              "decoder clamps to [-1, 1]); latents PSNR with the reference's max-min",
    "weights": "seeded default init of every module (nothing downloaded); fp32 init, then "
               "Linear/conv/attention weights cast to the run dtype except the modules in "
               "WanTransformer3DModel._keep_in_fp32_modules (kept fp32 as from_pretrained does)",
    "inputs": "text embeddings N(0,1) of umT5's shape (1,512,4096), a second set as the negative "
              "prompt; initial latents N(0,1), all from CPU generators (seed+1, seed+2, seed+3)",
}


@dataclass
class PipelineReport:
    preset: str
    config: dict
    versions: dict
    library: dict | None
    runs: list[ModeRun] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    calibration: Calibration | None = None
    environment: dict | None = None
    started: str = ""
    finished: str = ""
    complete: bool = False
    wall_s: float | None = None

    @property
    def reference(self) -> str | None:
        """The first core of --attention that ran; a later one stands in (and the report says
        so through reference != reference_requested) when the first failed."""
        return next((r.attention for r in self.runs if r.status == "ok"), None)

    @property
    def reference_requested(self) -> str:
        return self.config["attention"][0]

    def run(self, name: str) -> ModeRun | None:
        return next((r for r in self.runs if r.attention == name), None)

    def comparison(self, name: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.attention == name), None)

    def failed_sovereign(self) -> list[ModeRun]:
        return [r for r in self.runs if r.sovereign and r.status != "ok"]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "preset": self.preset, "complete": self.complete,
                "started": self.started, "finished": self.finished, "wall_s": _r(self.wall_s, 3),
                "reference": self.reference, "reference_requested": self.reference_requested,
                "config": self.config, "versions": self.versions,
                "library": self.library, "method": METHOD,
                "runs": [r.to_dict() for r in self.runs],
                "comparisons": [c.to_dict() for c in self.comparisons],
                "calibration": self.calibration.to_dict() if self.calibration else None,
                "environment": self.environment}


# ---------------------------------------------------------------------------------------------
# Building the model.

def _import_diffusers():
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

    _, WanTransformer3DModel, _, _ = _import_diffusers()
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

    _, _, AutoencoderKLWan, _ = _import_diffusers()
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
    _, _, _, UniPCMultistepScheduler = _import_diffusers()
    return UniPCMultistepScheduler(**dict(WAN_SCHEDULER, **(overrides or {})))


# ---------------------------------------------------------------------------------------------
# Running.

def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    s = " ".join(f"{type(exc).__name__}: {exc}".split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


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
        _sync(device)
        t0 = time.perf_counter()
        latents = cfg_step(transformer, sched, latents, t, inputs, guidance, dtype)
        _sync(device)
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
        _sync(device)
        t0 = time.perf_counter()
        cfg_step(transformer, sched, inputs.latents.clone(), t, inputs, guidance, dtype)
        _sync(device)
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


def verify_swap(transformer, inputs: _Inputs, dtype, swap: tuple[str, ...] = ("self",)) -> dict:
    """One DiT pass with the stock processors and one with ours wrapping SDPA (in every module
    of `swap`): they must be bit-identical (torch.equal) before any timing of a swapped core is
    trusted. A mismatch is re-checked stock-vs-stock to tell a nondeterministic backend from a
    wrong processor."""
    import torch

    def forward():
        t = torch.tensor([900.0], device=inputs.latents.device)
        return transformer(hidden_states=inputs.latents.to(dtype), timestep=t,
                           encoder_hidden_states=inputs.prompt, return_dict=False)[0]

    core = make_core("sdpa")
    stock = forward()
    before = {}
    try:
        for kind in swap:
            before[kind] = swap_attention(transformer, kind,
                                          lambda i, kind=kind: PROCESSORS[kind](core, "sdpa"))
        ours = forward()
    finally:
        for kind, procs in before.items():
            restore_attention(transformer, kind, procs)
    exact = bool(torch.equal(stock, ours))
    out = {"bit_exact": exact, "max_abs_diff": float((stock.float() - ours.float()).abs().max()),
           "swapped": list(swap),
           "what": "one DiT pass, stock WanAttnProcessor vs the swapped processors with SDPA inside"}
    if not exact:
        out["stock_deterministic"] = bool(torch.equal(stock, forward()))
    return out


def decode(vae, latents, device):
    """WanPipeline's decode: de-normalise with the VAE's latent statistics, decode; timed."""
    import torch

    z = latents.to(device, vae.dtype)
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    z = z / inv_std + mean
    _sync(device)
    t0 = time.perf_counter()
    frames = vae.decode(z, return_dict=False)[0]
    _sync(device)
    return frames, time.perf_counter() - t0


def _resolve_library(names: list[str], device_opt: str, lib_path: str | None, target: str | None):
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


def _library_info(lib) -> dict | None:
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


def _versions() -> dict:
    import torch

    diffusers, *_ = _import_diffusers()
    return {"torch": torch.__version__, "diffusers": diffusers.__version__,
            "cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None),
            "python": platform.python_version()}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _nonfinite(x) -> int:
    import torch

    return int((~torch.isfinite(x)).sum())


def run_pipeline(preset: str = "tiny", steps: int | None = None, device: str = "auto",
                 dtype: str | None = None, attention: str | Sequence[str] | None = None,
                 swap: str | Sequence[str] = DEFAULT_SWAP,
                 seed: int = 0, decode_video: bool = True, guidance_scale: float | None = None,
                 calibrate: bool = True, calibration_rel: float = CALIBRATION_REL,
                 vae_dtype: str | None = None, vae_tiling: bool = True, lib: str | None = None,
                 target: str | None = None, environment: bool = True,
                 progress: Callable[[str], None] | None = None,
                 checkpoint: Callable[[PipelineReport], None] | None = None) -> PipelineReport:
    """Runs the preset once per attention core (the first is the reference) and compares.

    attention None: DEFAULT_ATTENTION of the device (SDPA-cuDNN first on CUDA). swap: which
    attention of every block gets the core, "self", "cross" or both.

    A core that fails (out of memory, backend unavailable, kernel error) is recorded as skipped
    with its reason and the rest goes on; the caller decides what a failed core means
    (`pipeline_command` exits 1 when one of ours failed). `checkpoint(report)` is called after
    every stage so a partial report survives a time limit.
    """
    import torch

    from audit.evidence import metrics
    from audit.evidence.selection import torch_dtype

    say = progress or (lambda s: None)
    pre = get_preset(preset)
    if steps is None:
        steps = pre.steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise UsageError(f"--steps must be a positive integer, got {steps!r}")
    guidance = pre.guidance_scale if guidance_scale is None else float(guidance_scale)
    if not math.isfinite(guidance) or guidance < 0:
        raise UsageError(f"--guidance-scale must be finite and >= 0, got {guidance_scale!r}")
    if not (math.isfinite(calibration_rel) and calibration_rel > 0):
        raise UsageError(f"calibration perturbation must be > 0, got {calibration_rel!r}")
    swap = parse_swap(swap)
    if attention is None:  # the device's default cores, every one of which needs no more than ours
        library, dev_name = _resolve_library(["flash"], device, lib, target)
        names = list(DEFAULT_ATTENTION[dev_name])
    else:
        names = parse_attention(attention)
        library, dev_name = _resolve_library(names, device, lib, target)
    _import_diffusers()
    if dtype is None:
        dtype = "bf16" if dev_name == "cuda" else "fp32"
    tdtype = torch_dtype(dtype)
    vdtype = torch_dtype(vae_dtype or dtype)
    head_dim = pre.transformer["attention_head_dim"]
    if library is not None:
        dims = list(getattr(library, "head_dims", []) or [])
        if dims and head_dim not in dims:
            raise UsageError(f"the kernel library supports head dims {dims}, the {pre.name} preset "
                             f"needs {head_dim}")
    dev = torch.device(dev_name)

    t_start = time.perf_counter()
    started = _now()
    say(f"building {pre.name} ({pre.tokens()} tokens, {pre.transformer['num_layers']} layers) "
        f"on {dev_name} in {dtype}")
    transformer, casting = build_transformer(pre, dev, tdtype, seed)
    vae, tiled = build_vae(pre, dev, vdtype, seed, vae_tiling) if decode_video else (None, False)
    inputs = make_inputs(pre, dev, tdtype, seed)
    stock = {kind: [b.attn1.processor if kind == "self" else b.attn2.processor for b in transformer.blocks]
             for kind in SWAPS}
    layers = len(transformer.blocks)

    config = {
        "preset": pre.to_dict(), "steps": steps, "guidance_scale": guidance,
        "cfg": "two DiT passes per step (cond, uncond)", "device": dev_name, "dtype": dtype,
        "vae_dtype": (vae_dtype or dtype) if decode_video else None, "decode": decode_video,
        "vae_tiling": tiled, "seed": seed, "attention": names, "swap": list(swap),
        "attention_calls_per_step": 2 * layers * len(swap),
        "attention_shape_bnhd": [1, pre.tokens(), pre.transformer["num_attention_heads"], head_dim],
        "cross_attention_shape_b_nq_nk_h_d": ([1, pre.tokens(), TEXT_SHAPE[1],
                                               pre.transformer["num_attention_heads"], head_dim]
                                              if "cross" in swap else None),
        "scheduler": {"class": "UniPCMultistepScheduler", **WAN_SCHEDULER},
        "casting": {"kept_fp32_modules": casting["kept_fp32_modules"],
                    "kept_fp32_tensors": len(casting["kept_fp32"]), "cast_tensors": casting["cast"]},
        "vae_attention": "torch SDPA inside AutoencoderKLWan (not swapped; same for every core)",
        "text_embeddings_shape": list(TEXT_SHAPE), "calibration_rel": calibration_rel if calibrate else None,
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
    }
    report = PipelineReport(pre.name, config, _versions(), _library_info(library), started=started)
    if environment:
        try:
            from audit.evidence.environment import capture

            report.environment = capture()
        except Exception as exc:  # never lose the measurement over the environment
            report.environment = {"error": _one_line(exc)}

    def save():
        report.wall_s = time.perf_counter() - t_start
        if checkpoint:
            checkpoint(report)

    timer = CoreTimer()
    with torch.no_grad():
        if vae is not None:  # one-time backend initialisation, before anything is timed
            decode(vae, inputs.latents[:, :, :1, :8, :8], dev)
        say("checking the swap: stock processor vs ours with SDPA inside")
        config["swap_check"] = verify_swap(transformer, inputs, tdtype, swap)
        save()
        lanes = _lanes(report, names, library, timer, layers, swap)
        swapper = _Swapper(transformer, stock, swap)

        # 1. Every core warm before anything is timed: weights, the allocator, the core's first call.
        for lane in _live(lanes):
            with _guard(lane, dev, say):
                say(f"{lane.name}: warm-up step")
                sched = _scheduler_at(steps, dev)
                with swapper(lane):
                    cfg_step(transformer, sched, inputs.latents.clone(), sched.timesteps[0], inputs,
                             guidance, tdtype)
                _sync(dev)
        # 2. The attention share and per-call core time, every core in turn.
        for lane in _live(lanes):
            with _guard(lane, dev, say):
                with swapper(lane):
                    lane.run.instrumented = instrumented_step(transformer, timer, inputs, steps,
                                                              guidance, tdtype, dev)
                say(f"{lane.name}: attention share {lane.run.instrumented.share:.3f}, "
                    f"{lane.run.instrumented.attention_ms_per_call_median:.3f} ms per call")
        save()
        # 3. The timed loop: the cores take turns step by step, the first of each round rotating,
        #    so a disturbance or a drift in the machine lands on every core alike.
        for lane in _live(lanes):
            lane.sched, lane.latents = _scheduler_at(steps, dev), inputs.latents.clone()
            for p in lane.procs:
                p.calls = 0
        for i in range(steps):
            for lane in _turns(_live(lanes), i):
                with _guard(lane, dev, say):
                    t = lane.sched.timesteps[i]
                    with swapper(lane):
                        _sync(dev)
                        t0 = time.perf_counter()
                        lane.latents = cfg_step(transformer, lane.sched, lane.latents, t, inputs,
                                                guidance, tdtype)
                        _sync(dev)
                        lane.run.step_s.append(time.perf_counter() - t0)
                    say(f"{lane.name}: step {i + 1}/{steps} {lane.run.step_s[-1]:.3f} s")
            save()
        latents_of: dict[str, object] = {}
        for lane in _live(lanes):
            lane.run.dit_loop_s = sum(lane.run.step_s)
            lane.run.attention_calls = sum(p.calls for p in lane.procs)
            lane.run.latents_nonfinite = _nonfinite(lane.latents)
            latents_of[lane.name] = lane.latents
        # 4. The VAE decode: the same work for every core, so it is timed like the loop: one
        #    untimed decode of each core's latents first (its frames are the parity's), then
        #    VAE_ROUNDS timed rounds in turns.
        if vae is not None:
            _decode_all(report, [lane for lane in _live(lanes)], vae, latents_of, dev, say, metrics)
        for lane in _live(lanes):
            if lane.run.vae_decode_s is not None:
                say(f"{lane.name}: DiT {lane.run.dit_loop_s:.2f} s, VAE decode {lane.run.vae_decode_s:.2f} s")
            else:
                say(f"{lane.name}: DiT {lane.run.dit_loop_s:.2f} s")
        for lane in _live(lanes):
            if lane.name != report.reference:
                _fill_comparison(report, lane.name, latents_of, metrics)
        save()

        if calibrate:
            report.calibration = _calibrate(report, transformer, inputs, steps, guidance, tdtype, dev,
                                            library, latents_of, calibration_rel, seed, say, metrics, swap)
    report.finished = _now()
    report.complete = True
    save()
    return report



@dataclass
class _Lane:
    """One core's state through the interleaved run."""

    run: ModeRun
    procs_by_kind: dict  # "self"/"cross" -> one processor per block
    sched: object = None
    latents: object = None

    @property
    def name(self) -> str:
        return self.run.attention

    @property
    def procs(self) -> list:
        return [p for procs in self.procs_by_kind.values() for p in procs]


def _lanes(report: PipelineReport, names: list[str], library, timer: CoreTimer, layers: int,
           swap: tuple[str, ...]) -> list[_Lane]:
    lanes = []
    for name in names:
        run = ModeRun(name, name in OUR_CORES)
        report.runs.append(run)
        try:
            core = make_core(name, library)
        except (AuditError, KeyboardInterrupt):
            raise
        except Exception as exc:
            run.status, run.reason = "skipped", _one_line(exc)
            continue
        lanes.append(_Lane(run, {kind: [PROCESSORS[kind](core, name, timer) for _ in range(layers)]
                                 for kind in swap}))
    return lanes


def _live(lanes: list[_Lane]) -> list[_Lane]:
    return [lane for lane in lanes if lane.run.status == "ok"]


def _turns(items: list, i: int) -> list:
    """Round i's order: the list rotated by i (AB, BA, AB, ... for two)."""
    if not items:
        return []
    k = i % len(items)
    return items[k:] + items[:k]


def _scheduler_at(steps: int, device):
    sched = make_scheduler()
    sched.set_timesteps(steps, device=device)
    sched.set_begin_index(0)
    return sched


class _Swapper:
    """`with swapper(lane):` puts the lane's processors into every attention of the swapped kinds
    (attn1 for "self", attn2 for "cross") and restores the previous ones after; the kinds not
    swapped must stay diffusers' own."""

    def __init__(self, transformer, stock: dict, swap: tuple[str, ...]):
        self.transformer, self.stock, self.swap = transformer, stock, swap

    def __call__(self, lane: _Lane):
        import contextlib

        from audit.evidence.dit_attention import attention_modules

        @contextlib.contextmanager
        def swapped():
            before = {}
            try:
                for kind in self.swap:
                    before[kind] = swap_attention(self.transformer, kind,
                                                  lambda i, kind=kind: lane.procs_by_kind[kind][i])
                for kind in SWAPS:
                    if kind not in self.swap and any(
                            a.processor is not p for a, p in zip(attention_modules(self.transformer, kind),
                                                                 self.stock[kind])):
                        raise RuntimeError(f"{kind}-attention processors changed: the swap must touch "
                                           f"{', '.join(self.swap)} only")
                yield
            finally:
                for kind, procs in before.items():
                    restore_attention(self.transformer, kind, procs)

        return swapped()


class _guard:
    """A core that fails (out of memory, a backend SDPA lacks, a kernel error) is recorded as
    skipped with its reason and leaves the run; the other cores go on."""

    def __init__(self, lane: _Lane, device, say):
        self.lane, self.device, self.say = lane, device, say

    def __enter__(self):
        return self.lane

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (AuditError, KeyboardInterrupt)) or not isinstance(exc, Exception):
            return False
        run = self.lane.run
        run.status, run.reason = "skipped", _one_line(exc)
        self.say(f"{run.attention}: skipped: {run.reason}")
        self.lane.latents = self.lane.sched = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return True


def _decode_all(report: PipelineReport, lanes: list[_Lane], vae, latents_of: dict, dev, say, metrics) -> None:
    import statistics

    import torch

    def failed(lane, exc):  # keep the DiT measurement when only the decode fails
        lane.run.vae_reason = _one_line(exc)
        say(f"{lane.name}: VAE decode failed: {lane.run.vae_reason}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    frames_ref, decoding = None, []
    for lane in lanes:  # untimed, each core's own latents: the warm-up and the parity's frames
        try:
            frames, _ = decode(vae, latents_of[lane.name], dev)
        except Exception as exc:
            failed(lane, exc)
            continue
        decoding.append(lane)
        if lane.name == report.reference:
            frames_ref = frames
        elif frames_ref is not None:
            _comparison(report, lane.name).frames = metrics.compare(frames, frames_ref, data_range=2.0).to_dict()
        del frames
    samples: dict[str, list[float]] = {lane.name: [] for lane in decoding}
    for r in range(VAE_ROUNDS):
        for lane in _turns(decoding, r):
            if lane.run.vae_reason:
                continue
            try:
                frames, seconds = decode(vae, latents_of[lane.name], dev)
                del frames
                samples[lane.name].append(seconds)
            except Exception as exc:
                failed(lane, exc)
    for lane in decoding:
        if not lane.run.vae_reason and samples[lane.name]:
            lane.run.vae_decode_samples_s = samples[lane.name]
            lane.run.vae_decode_s = statistics.median(samples[lane.name])


def _comparison(report: PipelineReport, name: str) -> Comparison:
    c = report.comparison(name)
    if c is None:
        c = Comparison(name, report.reference)
        report.comparisons.append(c)
    return c


def _fill_comparison(report: PipelineReport, name: str, latents_of: dict, metrics) -> None:
    from audit.evidence import consistency as K
    from audit.evidence.stats import bootstrap_ratio_ci, bootstrap_total_ratio_ci

    ref, run = report.run(report.reference), report.run(name)
    c = _comparison(report, name)
    c.latents = metrics.compare(latents_of[name], latents_of[report.reference]).to_dict()
    dit = full = op = None
    if ref.step_s and run.step_s:
        ci = bootstrap_total_ratio_ci([(ref.step_s, "sum")], [(run.step_s, "sum")])
        c.speedup_dit, c.speedup_dit_ci = ci.ratio, ci.to_dict()
        dit = K.Interval(ci.ratio, ci.low, ci.high)
    if ref.dit_plus_vae_s and run.dit_plus_vae_s:
        ci = bootstrap_total_ratio_ci([(ref.step_s, "sum"), (ref.vae_decode_samples_s, "median")],
                                      [(run.step_s, "sum"), (run.vae_decode_samples_s, "median")], seed=1)
        c.speedup_dit_vae, c.speedup_dit_vae_ci = ci.ratio, ci.to_dict()
        full = K.Interval(ci.ratio, ci.low, ci.high)
    if ref.instrumented and run.instrumented and run.instrumented.attention_ms_per_call_median > 0:
        p = ref.instrumented.share
        ref_kinds, run_kinds = ref.instrumented.attention_ms_by_kind, run.instrumented.attention_ms_by_kind
        if len(ref_kinds) > 1 and set(ref_kinds) == set(run_kinds):
            # Self and cross calls differ ~10x in time: the ratio of the step's summed core times
            # (what Amdahl's p is a share of), each kind of call resampled on its own.
            ci = bootstrap_total_ratio_ci([(ref_kinds[k], "sum") for k in SWAPS if k in ref_kinds],
                                          [(run_kinds[k], "sum") for k in SWAPS if k in run_kinds], seed=2)
        else:
            ci = bootstrap_ratio_ci(ref.instrumented.attention_ms_samples,
                                    run.instrumented.attention_ms_samples, seed=2)
        c.op_speedup, c.op_speedup_ci, c.reference_attention_share = ci.ratio, ci.to_dict(), p
        c.amdahl_predicted = amdahl(p, ci.ratio)
        op = K.Interval(ci.ratio, ci.low, ci.high)
    if dit is not None and op is not None:
        c.consistency.append(K.check_dit(dit, c.reference_attention_share, op).to_dict())
    if full is not None and op is not None:
        k = K.check_dit_vae(full, c.reference_attention_share, op, ref.dit_loop_s, ref.vae_decode_s,
                            run.vae_decode_s)
        c.amdahl_predicted_dit_vae = k.predicted.value
        c.consistency.append(k.to_dict())


def amdahl(p: float, s_op: float) -> float:
    """Whole-program speedup when a share p of the time gets s_op times faster."""
    from audit.evidence.consistency import amdahl as _amdahl

    return _amdahl(p, s_op)


def _calibrate(report, transformer, inputs, steps, guidance, tdtype, dev, library, latents_of,
               rel, seed, say, metrics, swap: tuple[str, ...] = ("self",)) -> Calibration:
    """Re-runs one core with its attention output perturbed: the cheapest sovereign core that
    ran ("flash" if it did, else the reference)."""
    name = "flash" if "flash" in latents_of else report.reference
    cal = Calibration(name, rel, seed + 4)
    if name is None or name not in latents_of:
        cal.status, cal.reason = "skipped", "no core ran, so there is nothing to perturb"
        return cal
    perturb = Perturbation(rel, seed + 4)
    try:
        core = make_core(name, library)
        before = {}
        try:
            for kind in swap:
                before[kind] = swap_attention(
                    transformer, kind, lambda i, kind=kind: PROCESSORS[kind](core, name, None, perturb))
            say(f"calibration: {name} with {rel:g} relative noise on the attention output")
            latents, _ = denoise(transformer, inputs, steps, guidance, tdtype, dev)
        finally:
            for kind, procs in before.items():
                restore_attention(transformer, kind, procs)
        cal.latents = metrics.compare(latents, latents_of[name]).to_dict()
    except (AuditError, KeyboardInterrupt):
        raise
    except Exception as exc:
        cal.status, cal.reason = "skipped", _one_line(exc)
    return cal


def check_outcome(report: PipelineReport) -> None:
    """GateFailed (exit 1) when one of our cores did not run or produced non-finite latents."""
    check = report.config.get("swap_check") or {}
    if not check.get("bit_exact", False):
        raise GateFailed("pipeline: the swapped processor with SDPA inside is not bit-identical to "
                         f"diffusers' stock processor (max abs diff {check.get('max_abs_diff')}); "
                         "its timings cannot be trusted")
    bad = [f"{r.attention} ({r.reason})" for r in report.failed_sovereign()]
    bad += [f"{r.attention} ({r.latents_nonfinite} non-finite latents)" for r in report.runs
            if r.status == "ok" and r.sovereign and r.latents_nonfinite]
    if bad:
        raise GateFailed("pipeline: our kernel's runs failed: " + "; ".join(bad))

"""run_pipeline: options -> model pieces -> every core timed in turns -> the typed report, saved per stage."""

from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Callable, Sequence

from audit.errors import UsageError
from audit.evidence.dit_attention import SWAPS, CoreTimer, parse_swap
from audit.evidence.pipeline import generate
from audit.evidence.pipeline.compare import fill_comparison
from audit.evidence.pipeline.lanes import (Swapper, decode_all, guard, live, make_lanes, reason_of,
                                           run_calibration, scheduler_at, turns)
from audit.evidence.pipeline.model import build_transformer, build_vae, import_diffusers, versions
from audit.evidence.pipeline.options import (CALIBRATION_REL, DEFAULT_ATTENTION, DEFAULT_SWAP, TEXT_SHAPE,
                                             WAN_SCHEDULER, get_preset, library_info, parse_attention,
                                             resolve_library)
from audit.evidence.pipeline import parallel as parallel_mod
from audit.evidence.pipeline.parallel import ParallelSetup
from audit.evidence.pipeline.results import PipelineReport


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_pipeline(preset: str = "tiny", steps: int | None = None, device: str = "auto",
                 dtype: str | None = None, attention: str | Sequence[str] | None = None,
                 swap: str | Sequence[str] = DEFAULT_SWAP,
                 seed: int = 0, decode_video: bool = True, guidance_scale: float | None = None,
                 calibrate: bool = True, calibration_rel: float = CALIBRATION_REL,
                 vae_dtype: str | None = None, vae_tiling: bool = True, lib: str | None = None,
                 target: str | None = None, environment: bool = True,
                 progress: Callable[[str], None] | None = None,
                 checkpoint: Callable[[PipelineReport], None] | None = None,
                 parallel: ParallelSetup | None = None, precision: str = "exact") -> PipelineReport:
    """Runs the preset once per attention core (the first is the reference) and compares.

    attention None: DEFAULT_ATTENTION of the device (SDPA-cuDNN first on CUDA). swap: which
    attention of every block gets the core, "self", "cross" or both. precision "fp8": our flash
    core runs at precision="fp8" ("flash" becomes "flash-fp8"; refused on a device without it),
    and the calibration perturbs the exact reference, so the FP8 error on the latents is read
    next to a known perturbation's.

    A core that fails (out of memory, backend unavailable, kernel error) is recorded as skipped
    with its reason and the rest goes on; the caller decides what a failed core means
    (`pipeline_command` exits 1 when one of ours failed). `checkpoint(report)` is called after
    every stage so a partial report survives a time limit. `parallel`: this rank's place in a
    context-parallel run (parallel.from_environment); every rank runs this same function.
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
    from audit.evidence import precision as P
    from audit.evidence.dit_attention import FP8_CORE

    P.check(precision)
    if attention is None:  # the device's default cores, every one of which needs no more than ours
        library, dev_name = resolve_library(["flash"], device, lib, target)
        names = list(DEFAULT_ATTENTION[dev_name])
    else:
        names = parse_attention(attention)
        library, dev_name = resolve_library(names, device, lib, target)
    if precision == "fp8":
        names = list(dict.fromkeys(FP8_CORE if n == "flash" else n for n in names))
    if FP8_CORE in names:
        precision = "fp8"
        P.require(precision, dev_name)
    import_diffusers()
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
    if parallel is not None:
        parallel_mod.check_run(parallel, names, pre.transformer["num_attention_heads"], pre.tokens())
        if parallel.ring > 1 and library is None:
            raise UsageError("--ring checks the swap on our kernel: --attention must include flash or naive")
        parallel_mod.init(parallel, dev_name)
    dev = torch.device(dev_name)

    t_start = time.perf_counter()
    started = _now()
    say(f"building {pre.name} ({pre.tokens()} tokens, {pre.transformer['num_layers']} layers) "
        f"on {dev_name} in {dtype}")
    transformer, casting = build_transformer(pre, dev, tdtype, seed)
    parallel_config = parallel_mod.enable(transformer, parallel, dev_name) if parallel is not None else None
    vae, tiled = build_vae(pre, dev, vdtype, seed, vae_tiling) if decode_video else (None, False)
    inputs = generate.make_inputs(pre, dev, tdtype, seed)
    stock = {kind: [b.attn1.processor if kind == "self" else b.attn2.processor for b in transformer.blocks]
             for kind in SWAPS}
    layers = len(transformer.blocks)

    config = {
        "preset": pre.to_dict(), "steps": steps, "guidance_scale": guidance,
        "cfg": "two DiT passes per step (cond, uncond)", "device": dev_name, "dtype": dtype,
        "vae_dtype": (vae_dtype or dtype) if decode_video else None, "decode": decode_video,
        "vae_tiling": tiled, "seed": seed, "attention": names, "swap": list(swap),
        "precision": precision,
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
        "parallel": parallel.to_dict() if parallel is not None else None,
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
    }
    report = PipelineReport(pre.name, config, versions(), library_info(library), started=started)
    if environment:
        try:
            from audit.evidence.environment import capture

            report.environment = capture()
        except Exception as exc:  # never lose the measurement over the environment
            report.environment = {"error": reason_of(exc)}

    def save():
        report.wall_s = time.perf_counter() - t_start
        if checkpoint:
            checkpoint(report)

    timer = CoreTimer()
    with torch.no_grad():
        if vae is not None:  # one-time backend initialisation, before anything is timed
            generate.decode(vae, inputs.latents[:, :, :1, :8, :8], dev)
        say("checking the swap: stock processor vs ours with SDPA inside")
        config["swap_check"] = generate.verify_swap(transformer, inputs, tdtype, swap, parallel_config, library)
        save()
        lanes = make_lanes(report, names, library, timer, layers, swap, parallel_config)
        swapper = Swapper(transformer, stock, swap)

        # 1. Every core warm before anything is timed: weights, the allocator, the core's first call.
        for lane in live(lanes):
            with guard(lane, dev, say):
                say(f"{lane.name}: warm-up step")
                sched = scheduler_at(steps, dev)
                with swapper(lane):
                    generate.cfg_step(transformer, sched, inputs.latents.clone(), sched.timesteps[0], inputs,
                                      guidance, tdtype)
                generate.sync(dev)
        # 2. The attention share and per-call core time, every core in turn.
        for lane in live(lanes):
            with guard(lane, dev, say):
                with swapper(lane):
                    lane.run.instrumented = generate.instrumented_step(transformer, timer, inputs, steps,
                                                                       guidance, tdtype, dev)
                say(f"{lane.name}: attention share {lane.run.instrumented.share:.3f}, "
                    f"{lane.run.instrumented.attention_ms_per_call_median:.3f} ms per call")
        save()
        # 3. The timed loop: the cores take turns step by step, the first of each round rotating,
        #    so a disturbance or a drift in the machine lands on every core alike.
        for lane in live(lanes):
            lane.sched, lane.latents = scheduler_at(steps, dev), inputs.latents.clone()
            for p in lane.procs:
                p.calls = 0
        for i in range(steps):
            for lane in turns(live(lanes), i):
                with guard(lane, dev, say):
                    t = lane.sched.timesteps[i]
                    with swapper(lane):
                        generate.sync(dev)
                        t0 = time.perf_counter()
                        lane.latents = generate.cfg_step(transformer, lane.sched, lane.latents, t, inputs,
                                                         guidance, tdtype)
                        generate.sync(dev)
                        lane.run.step_s.append(time.perf_counter() - t0)
                    say(f"{lane.name}: step {i + 1}/{steps} {lane.run.step_s[-1]:.3f} s")
            save()
        latents_of: dict[str, object] = {}
        for lane in live(lanes):
            lane.run.dit_loop_s = sum(lane.run.step_s)
            lane.run.attention_calls = sum(p.calls for p in lane.procs)
            lane.run.latents_nonfinite = generate.nonfinite(lane.latents)
            latents_of[lane.name] = lane.latents
        # 4. The VAE decode: the same work for every core, so it is timed like the loop: one
        #    untimed decode of each core's latents first (its frames are the parity's), then
        #    VAE_ROUNDS timed rounds in turns.
        if vae is not None:
            decode_all(report, [lane for lane in live(lanes)], vae, latents_of, dev, say, metrics)
        for lane in live(lanes):
            if lane.run.vae_decode_s is not None:
                say(f"{lane.name}: DiT {lane.run.dit_loop_s:.2f} s, VAE decode {lane.run.vae_decode_s:.2f} s")
            else:
                say(f"{lane.name}: DiT {lane.run.dit_loop_s:.2f} s")
        for lane in live(lanes):
            if lane.name != report.reference:
                fill_comparison(report, lane.name, latents_of, metrics)
        save()

        if calibrate:
            report.calibration = run_calibration(report, transformer, inputs, steps, guidance, tdtype, dev,
                                                 library, latents_of, calibration_rel, seed, say, metrics, swap,
                                                 parallel_config)
    report.finished = _now()
    report.complete = True
    save()
    return report

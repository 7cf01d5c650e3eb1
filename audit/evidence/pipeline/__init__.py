"""The end-to-end video DiT measurement (`sovereign-audit pipeline`), one module per stage of its data flow.

options -> model pieces -> the timed run -> the typed report -> the outcome:

    options.py   what a run is asked for: presets, default cores and swaps, library and device
    model.py     the diffusers pieces: transformer, VAE, scheduler, built with seeded weights
    generate.py  the work that gets timed: a CFG step, the denoise loop, the decode, the swap check
    lanes.py     the timed run's machinery: one lane per core, turns, the swap, the skip guard
    runner.py    run_pipeline, which drives the above and saves the report after every stage
    compare.py   each core against the reference: parity, speedups, Amdahl, consistency
    results.py   the typed report (PipelineReport and its parts, METHOD)
    outcome.py   what a finished report means for the exit status
    parallel.py  --ulysses/--ring under torchrun: diffusers' context parallelism, each core inside
                 its templated context-parallel attention

The public names are re-exported here. runner.py and lanes.py call generate.cfg_step and
generate.decode through the module, so whoever stands in for one sets it on `generate`; the
cores of the timed run and of the calibration come from `lanes.make_core`.

What it measures: Wan2.1-T2V built from its diffusers config with seeded
random weights, a UniPC flow-matching loop with classifier-free guidance, then the VAE decode,
run once per attention core swapped into every self-attention and (by default) every text
cross-attention (see dit_attention.py).

The reference core is the first of --attention. On CUDA the default is what a user would run
without us: stock PyTorch's SDPA with its cuDNN backend (sdpa-cudnn), then our flash kernel, then
SDPA's FlashAttention-2 backend (sdpa-flash); so the table says what swapping our kernel in gains
over stock PyTorch. On the CPU (no cuDNN) it is our naive pre-flash path, then flash. Both self-
and cross-attention are swapped by default, as our diffusers backend (flash_kernel.diffusers_backend)
swaps every call diffusers' attention dispatcher makes; --swap self measures self-attention alone.

Nothing is downloaded: every module is built from a config in options.py. Random weights are
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

from audit.evidence.pipeline.compare import amdahl
from audit.evidence.pipeline.generate import cfg_step, decode, denoise, instrumented_step, make_inputs, verify_swap
from audit.evidence.pipeline.model import (build_transformer, build_vae, cast_like_from_pretrained, keep_fp32_names,
                                           make_scheduler)
from audit.evidence.pipeline.options import (CALIBRATION_REL, DEFAULT_ATTENTION, DEFAULT_SWAP, PRESETS, TEXT_SHAPE,
                                             VAE_ROUNDS, WAN_1_3B, WAN_SCHEDULER, PipelinePreset, get_preset,
                                             parse_attention)
from audit.evidence.pipeline.outcome import check_outcome
from audit.evidence.pipeline.results import (METHOD, SCHEMA, Calibration, Comparison, InstrumentedStep, ModeRun,
                                             PipelineReport)
from audit.evidence.pipeline.runner import run_pipeline

__all__ = [
    "CALIBRATION_REL", "DEFAULT_ATTENTION", "DEFAULT_SWAP", "METHOD", "PRESETS", "SCHEMA", "TEXT_SHAPE",
    "VAE_ROUNDS", "WAN_1_3B", "WAN_SCHEDULER", "Calibration", "Comparison", "InstrumentedStep", "ModeRun",
    "PipelinePreset", "PipelineReport", "amdahl", "build_transformer", "build_vae", "cast_like_from_pretrained",
    "cfg_step", "check_outcome", "decode", "denoise", "get_preset", "instrumented_step", "keep_fp32_names",
    "make_inputs", "make_scheduler", "parse_attention", "run_pipeline", "verify_swap",
]

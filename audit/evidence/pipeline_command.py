"""`sovereign-audit pipeline`: the end-to-end video DiT measurement (logic in the pipeline package)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from audit.errors import UsageError
from flash_kernel.fp8 import PRECISIONS

PRESET_NAMES = ("tiny", "tiny-cp", "wan-480p")  # pipeline.PRESETS, listed here so --help imports no torch


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"--json {str(path)!r} is a directory")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--json {str(path)!r}: folder {str(parent)!r} does not exist or is not writable")


def write_json(path: Path, data: dict) -> None:
    """Atomically (a reader never sees half a file, a time limit never leaves one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _f(x, spec=".3f", none="-"):
    return none if x is None else format(x, spec)


def _ratio(x, ci) -> str:
    """A speedup with its CI; "level" when the CI spans 1.0 (no difference shown)."""
    if x is None:
        return "-"
    if not ci:
        return f"{x:.2f}x"
    from audit.evidence.consistency import level

    tail = " level" if level(ci["ci_low"], ci["ci_high"]) else ""
    return f"{x:.2f}x [{ci['ci_low']:.2f}, {ci['ci_high']:.2f}]{tail}"


def render_table(report) -> str:
    """The short summary printed last; names come from our own list, never from input."""
    from audit.evidence.metrics import fmt_cosine

    d = report.to_dict()
    cfg = d["config"]
    swapped = " and ".join({"self": "self-attention", "cross": "cross-attention"}[k]
                           for k in cfg.get("swap") or ["self"])
    lines = [f"pipeline {d['preset']}: {cfg['preset']['tokens']} tokens, {cfg['steps']} steps x 2 CFG "
             f"passes, {cfg['device']} {cfg['dtype']}, reference {d['reference']}, each core in every "
             f"{swapped}"]
    if cfg.get("precision") == "fp8":
        lines.append("precision fp8: flash-fp8 is our opt-in FP8 attention (quantized, not exact); the "
                     "calibration shows a known perturbation's effect on the latents beside it")
    par = cfg.get("parallel")
    if par:
        lines.append(f"context parallel: {par['split']} over {par['world_size']} processes (every self-attention "
                     "core timed with its communication)")
    lines.append(f"{'attention':<15}{'status':<9}{'DiT s':>9}{'s/step':>9}{'VAE s':>8}{'attn share':>11}"
                 f"{'ms/call':>10}")
    for r in d["runs"]:
        ins = r["instrumented_step"] or {}
        med = r["step_summary_s"]["median"] if r["step_summary_s"] else None
        lines.append(f"{r['attention']:<15}{r['status']:<9}{_f(r['dit_loop_s'], '.2f'):>9}"
                     f"{_f(med, '.3f'):>9}{_f(r['vae_decode_s'], '.2f'):>8}"
                     f"{_f(ins.get('attention_share'), '.3f'):>11}"
                     f"{_f(ins.get('attention_ms_per_call_median'), '.3f'):>10}")
        if r["status"] != "ok":
            lines.append(f"  {r['reason']}")
        elif r.get("vae_reason"):
            lines.append(f"  VAE decode failed: {r['vae_reason']}")
    for c in d["comparisons"]:
        lines.append(f"{c['attention']} vs {c['reference']}: DiT {_ratio(c['speedup_dit_measured'], c['speedup_dit_ci'])}"
                     f", Amdahl-predicted {_f(c['amdahl_predicted_dit'], '.2f')}x "
                     f"(p={_f(c['reference_attention_share'], '.3f')}, "
                     f"s_op={_ratio(c['op_speedup'], c['op_speedup_ci'])}), "
                     f"DiT+VAE {_ratio(c['speedup_dit_vae_measured'], c['speedup_dit_vae_ci'])}")
        for k in c.get("consistency") or []:
            if k["verdict"] == "inconsistent":
                lines.append(f"  {k['what']}: inconsistent with the Amdahl bound (predicted "
                             f"{_f(k['predicted']['value'], '.2f')}x): {k['cause']}")
        for what in ("latents", "frames"):
            m = c[what]
            if m:
                lines.append(f"  {what}: cosine {fmt_cosine(m['cosine'])}, rel-L2 {_f(m['rel_l2'], '.2e')}, "
                             f"PSNR {_f(m['psnr_db'], '.1f', 'inf')} dB")
    cal = d["calibration"]
    if cal:
        if cal["status"] == "ok":
            m = cal["latents"]
            lines.append(f"calibration ({cal['attention']} + {cal['relative_perturbation']:g} relative "
                         f"noise on attention out): latents cosine {fmt_cosine(m['cosine'])}, rel-L2 "
                         f"{_f(m['rel_l2'], '.2e')}, PSNR {_f(m['psnr_db'], '.1f', 'inf')} dB")
        else:
            lines.append(f"calibration skipped: {cal['reason']}")
    return "\n".join(lines)


@click.command("pipeline")
@click.option("--preset", default="tiny", show_default=True, metavar="|".join(PRESET_NAMES),
              help="tiny (CPU, CI), tiny-cp (CPU, 60 tokens that split for --ulysses/--ring) or wan-480p "
                   "(Wan2.1-T2V-1.3B, 480x832, 81 frames).")
@click.option("--steps", type=int, default=None, help="Denoising steps [preset default: tiny 4, wan-480p 50].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="Run dtype of the transformer [bf16 on cuda, fp32 on cpu].")
@click.option("--vae-dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="VAE dtype [same as --dtype].")
@click.option("--attention", default=None,
              help="Comma-separated attention cores, the first is the reference: naive, flash, sdpa, "
                   "sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math (sdpa-* are the vendor A/B) "
                   "[default: sdpa-cudnn,flash,sdpa-flash on cuda (stock PyTorch first), naive,flash "
                   "on cpu].")
@click.option("--swap", default="self,cross", show_default=True,
              help="Which attention of every block gets the core: self, cross (text "
                   "cross-attention) or both, as the diffusers backend swaps both.")
@click.option("--lib", "lib_path", default=None, help="A library exporting our C ABI (for naive/flash).")
@click.option("--target", default=None, help="Our library built for this target (built if missing).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--guidance-scale", type=float, default=None, help="CFG scale [5.0].")
@click.option("--decode/--no-decode", default=True, show_default=True, help="Run the VAE decode.")
@click.option("--vae-tiling/--no-vae-tiling", default=True, show_default=True)
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Re-run one core with a 1e-3 relative perturbation of the attention output.")
@click.option("--calibration-rel", type=float, default=1e-3, show_default=True,
              help="Relative size of the calibration perturbation (noise norm / attention output norm).")
@click.option("--ulysses", type=int, default=1, show_default=True,
              help="Context parallelism: split the heads of every self-attention over N ranks (Ulysses "
                   "all-to-all). Launch with torchrun, one process a GPU: ulysses x ring processes.")
@click.option("--ring", type=int, default=1, show_default=True,
              help="Context parallelism: pass K/V around N ranks (ring attention, merged by the "
                   "log-sum-exp). Combines with --ulysses.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report (schema sovereign-audit.pipeline/1), updated after every stage "
                   "(under torchrun by rank 0).")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="exact", show_default=True,
              help="fp8: our flash core runs the opt-in FP8 attention (flash becomes flash-fp8) and "
              "the calibration perturbs the exact reference; refused (exit 2) on a device without it.")
def pipeline_cmd(preset, steps, device, dtype, vae_dtype, attention, swap, lib_path, target, seed,
                 guidance_scale, decode, vae_tiling, calibrate, calibration_rel, ulysses, ring, json_path, quiet,
                 precision):
    """End-to-end Wan2.1 video DiT: time and parity of the swapped attention.

    Builds the model from its config with seeded random weights (nothing is downloaded), runs the
    UniPC + CFG loop and the VAE decode once per attention core, and reports the DiT and DiT+VAE
    times, the measured attention share, the Amdahl-predicted next to the measured speedup, the
    parity of latents and frames against the first core, and a calibration of what a 1e-3
    attention error does to the latents. On CUDA the reference is stock PyTorch's SDPA-cuDNN, so
    the table says what our kernel gains over it. Exit 1 when one of our cores fails.

    With --ulysses N and/or --ring N (under torchrun: `torchrun --nproc-per-node 2 -m audit.cli
    pipeline --ulysses 2 ...`) every rank runs its share of the tokens through diffusers' context
    parallelism (NCCL on CUDA, gloo on the CPU); rank 0 prints and writes the report.
    """
    from audit.evidence.dit_attention import parse_swap
    from audit.evidence.pipeline import check_outcome, get_preset, parse_attention, run_pipeline
    from audit.evidence.pipeline import parallel as cp

    get_preset(preset)  # bad input fails before anything heavy is imported
    setup = cp.from_environment(ulysses, ring)
    if setup is not None and setup.rank != 0:  # one voice: rank 0 prints and writes
        quiet, json_path = True, None
    if steps is not None and steps <= 0:
        raise UsageError(f"--steps must be a positive integer, got {steps}")
    if attention is not None:
        parse_attention(attention)
    parse_swap(swap)
    if json_path is not None:
        _check_writable(json_path)

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(f"[pipeline] {msg}", err=True)
            sys.stderr.flush()

    def checkpoint(report) -> None:
        if json_path is not None:
            write_json(json_path, report.to_dict())

    try:
        report = run_pipeline(preset=preset, steps=steps, device=device, dtype=dtype,
                              attention=attention, swap=swap, seed=seed, decode_video=decode,
                              guidance_scale=guidance_scale, calibrate=calibrate,
                              calibration_rel=calibration_rel, vae_dtype=vae_dtype,
                              vae_tiling=vae_tiling, lib=lib_path, target=target,
                              progress=progress, checkpoint=checkpoint, parallel=setup,
                              precision=precision)
    finally:
        if setup is not None:
            cp.finish()
    if setup is None or setup.rank == 0:
        click.echo(render_table(report))
        if json_path is not None:
            click.echo(f"wrote {json_path}")
    check_outcome(report)

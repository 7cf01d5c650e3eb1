"""`sovereign-audit parity` and `sovereign-audit bench`: thin Click wrappers over run_parity and
run_bench. torch is imported only when a command runs, never for --help.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from audit.errors import GateFailed, InputError, UsageError, printable
from audit.evidence.backend_names import BACKEND_NAMES
from audit.files import write_json_atomic
from flash_kernel.fp8 import PRECISIONS

GPU_DEFAULT_PRESETS = ["wan2.1-1.3b-480p", "cogvideox-5b"]


def _safe(text: object) -> str:
    """Untrusted text (paths, torch messages, user names) made printable on one line."""
    return printable(" ".join(str(text).split()))


def _selection_options(f):
    opts = [
        click.option("--target", help="Our library built for TARGET (cpu, sm_90, sm_90-generic, ...); "
                     "built if missing."),
        click.option("--lib", "lib", type=click.Path(dir_okay=False),
                     help="Any shared library exporting the flash_kernel C ABI."),
        click.option("--candidate", metavar="MODULE:FUNC",
                     help="A Python function fn(q, k, v, scale=None) on (B,H,N,D) tensors "
                     "(MODULE importable or a path to a .py file)."),
        click.option("--shape", "shapes", multiple=True, metavar="B,H,N,D|B,H,Nq,Nk,D",
                     help="An attention shape (repeatable)."),
        click.option("--preset", "presets", multiple=True, metavar="NAME",
                     help="A named shape or group of shapes (repeatable): see `--list-presets`."),
        click.option("--list-presets", is_flag=True, help="List the presets and exit."),
        click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
                     help="Input dtype [default: bf16 on cuda, fp32 on cpu]."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                     show_default=True),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Base seed of the random inputs (recorded)."),
        click.option("--json", "json_out", type=click.Path(dir_okay=False),
                     help="Write the full report as JSON to this file."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False),
                     help="TOML file with [parity.gates] and/or [bench] settings."),
        click.option("--layout", type=click.Choice(["bhnd", "bnhd"]), default="bhnd",
                     show_default=True,
                     help="How inputs are stored: bnhd = (B,N,H,D) as video DiTs pass them, "
                     "handed over as strided (B,H,N,D) views."),
        click.option("--precision", type=click.Choice(PRECISIONS), default="exact",
                     show_default=True,
                     help="fp8: our kernel's opt-in FP8 attention (INT8 Q K^T, FP8 P V), held to "
                     "the fp8 gates; refused (exit 2) on a device without it."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _load_config(path: str | None) -> dict:
    if not path:
        return {}
    import tomllib

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read config {path!r}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"config {path!r} is not valid TOML: {exc}") from None


def _list_presets() -> None:
    from audit.evidence.presets import PRESET_GROUPS, PRESETS

    for name, (shape, about) in PRESETS.items():
        click.echo(f"{name:20s} {shape.batch},{shape.heads},{shape.nq},"
                   f"{'' if shape.nq == shape.nk else str(shape.nk) + ','}{shape.head_dim}  {about}")
    click.echo("groups (--preset GROUP runs each of its presets):")
    for name, members in PRESET_GROUPS.items():
        click.echo(f"{name:20s} {', '.join(members)}")


def _prepare(target, lib, candidate, shapes, presets, dtype, device, check_head_dims=True,
             precision="exact"):
    from audit.evidence import precision as P
    from audit.evidence.presets import CPU_PRESETS, resolve_shapes
    from audit.evidence.selection import select

    # Parse the shapes before anything slow (a build, a CUDA init) so typos fail at once.
    parsed = resolve_shapes(shapes, presets) if (shapes or presets) else None
    sel = P.apply(select(target=target, lib=lib, candidate=candidate, device=device), precision)
    if parsed is None:
        parsed = resolve_shapes([], [], CPU_PRESETS if sel.device == "cpu" else GPU_DEFAULT_PRESETS)
    if check_head_dims:  # bench reports a head dim our library lacks as a refused row instead
        sel.check_shapes(parsed)
    dtype = dtype or ("bf16" if sel.device == "cuda" else "fp32")
    return sel, parsed, dtype


def _checkpoint(path: str | None):
    """Partial reports after each shape ("complete": false) so a killed run keeps its shapes."""
    if not path:
        return None
    return lambda report: _write_json(path, {**report.to_dict(), "complete": False})


def _finite(node):
    """JSON has no NaN/Infinity: a non-finite float becomes null (its meaning is in the counts)."""
    if isinstance(node, float):
        return node if math.isfinite(node) else None
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_finite(v) for v in node]
    return node


def _write_json(path: str | None, data: dict) -> None:
    if not path:
        return
    data = _finite(data)
    try:
        p = Path(path)
        if p.parent.exists() and not p.parent.is_dir():
            raise UsageError(f"cannot write {path!r}: {str(p.parent)!r} is not a folder")
        if p.exists() and not p.is_file():  # /dev/stdout, a FIFO: written through, as asked
            p.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        else:  # a file: replaced whole, so a run killed mid-write leaves the last complete report
            write_json_atomic(p, data)
    except OSError as exc:
        raise UsageError(f"cannot write {path!r}: {exc.strerror or exc}") from None


@click.command("parity")
@_selection_options
@click.option("--gate", "gate_items", multiple=True, metavar="NAME=VALUE",
              help="Override a gate: rel_l2 (vs float64, max), cosine (vs oracle, min), "
              "nonfinite (NaN+Inf count, max).")
@click.option("--scale", type=float, default=None,
              help="Softmax scale passed to every kernel [default: None, i.e. 1/sqrt(D)].")
def parity_cmd(target, lib, candidate, shapes, presets, list_presets, dtype, device, seed,
               json_out, config_path, layout, precision, gate_items, scale):
    """Check a kernel against the oracle (naive pre-flash path) and a float64 reference.

    \b
    Gates (defaults): rel-L2 vs float64 <= 1e-4 fp32, 2e-3 fp16, 1e-2 bf16;
    cosine vs oracle >= 0.99999; no NaN/Inf. Each shape also runs a scale probe.
    --precision fp8: rel-L2 <= 5e-2, cosine >= 0.999 ([parity.gates.fp8] overrides).
    Exit 0 all gates pass, 1 a gate failed (named with its shape), 2 bad input.
    """
    if list_presets:
        _list_presets()
        return 0
    from audit.evidence.parity import effective_gates, parse_gate_overrides, run_parity

    overrides = parse_gate_overrides(gate_items)
    config = _load_config(config_path)
    if scale is not None and (not math.isfinite(scale) or scale <= 0):
        raise UsageError(f"--scale {scale!r} must be a finite number > 0")
    sel, parsed, dtype = _prepare(target, lib, candidate, shapes, presets, dtype, device,
                                  precision=precision)
    gates = effective_gates(dtype, config, overrides, precision)
    report = run_parity(sel, parsed, dtype, gates=gates, seed=seed, scale=scale,
                        progress=_parity_progress(), checkpoint=_checkpoint(json_out),
                        layout=layout)
    _write_json(json_out, {**report.to_dict(), "complete": True})
    _print_parity(report)
    failures = report.failure_lines()
    if failures:
        more = f" (and {len(failures) - 1} more shapes)" if len(failures) > 1 else ""
        raise GateFailed(f"parity gate failed: {_safe(failures[0])}{more}")
    return 0


def _parity_progress():
    if not sys.stderr.isatty():
        return None
    return lambda i, shape: click.echo(f"parity: {shape.label} ...", err=True)


def _print_parity(report) -> None:
    from audit.evidence.metrics import fmt_cosine, fmt_num

    sel = report.selection
    click.echo(f"parity: {_safe(sel['kind'])} {_safe(sel['spec'])} on {report.device} "
               f"({_safe(report.device_name)}), {report.dtype}, precision {report.precision}, "
               f"oracle: {_safe(report.oracle)}")
    g = report.gates
    click.echo(f"gates: rel_l2 <= {g.rel_l2:g} vs float64, cosine >= {g.cosine:g} vs oracle, "
               f"NaN/Inf <= {g.nonfinite}")
    if report.precision == "fp8":
        from audit.evidence.precision import FP8_DIT_GATES as dg

        click.echo(f"       DiT-shaped inputs: rel_l2 <= {dg.rel_l2:g}, cosine >= {dg.cosine:g} vs float64")
    for s in report.shapes:
        cr, co, orr = s.candidate_vs_reference, s.candidate_vs_oracle, s.oracle_vs_reference
        click.echo(f"  {s.status.upper():6s} {s.shape.label}  seed {s.seed}")
        if cr is not None:
            click.echo(f"    vs float64: rel_l2 {fmt_num(cr.rel_l2)}  cos {fmt_cosine(cr.cosine)}  "
                       f"max_abs {fmt_num(cr.max_abs)}  max_rel {fmt_num(cr.max_rel)}  "
                       f"NaN {cr.nan} Inf {cr.inf}")
        if co is not None:
            click.echo(f"    vs oracle:  rel_l2 {fmt_num(co.rel_l2)}  cos {fmt_cosine(co.cosine)}  "
                       f"max_abs {fmt_num(co.max_abs)}")
        if orr is not None:
            click.echo(f"    oracle vs float64: rel_l2 {fmt_num(orr.rel_l2)}  "
                       f"cos {fmt_cosine(orr.cosine)}")
        dm = (s.dit_probe or {}).get("metrics")
        if dm:
            click.echo(f"    DiT-shaped: rel_l2 {fmt_num(dm.get('rel_l2'))}  "
                       f"cos {fmt_cosine(dm.get('cosine'))}")
        if s.public_vs_raw is not None:
            click.echo(f"    binding (timed) vs raw ABI call: max_abs "
                       f"{fmt_num(s.public_vs_raw.max_abs)}")
        for gr in s.failures:
            click.echo(f"    FAILED {gr.name} {_safe(gr.detail)}")
    click.echo(f"parity: {'PASSED' if report.passed else 'FAILED'} "
               f"({sum(s.status == 'passed' for s in report.shapes)}/{len(report.shapes)} shapes)")


@click.command("bench")
@_selection_options
@click.option("--repeats", type=int, default=None, help="Timed calls per backend [default: 10].")
@click.option("--warmup", type=int, default=None, help="Untimed calls first [default: 2].")
@click.option("--sets", type=int, default=None,
              help="Input sets rotated through [default: enough to exceed 256 MiB, 2..64].")
@click.option("--backend", "backend_names", multiple=True,
              type=click.Choice(list(BACKEND_NAMES)),
              help="Time only these (repeatable) [default: all but fa4]. fa4: FlashAttention-4 "
              "(pip install flash-attn-4; CUDA, fp16/bf16), an A/B skipped with its reason where "
              "it does not import.")
@click.option("--max-backend-seconds", type=float, default=None,
              help="Cap the timed seconds of one backend on one shape: fewer repeats (>= 3, "
              "recorded) for a slow baseline [default: no cap].")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: only on a terminal].")
def bench_cmd(target, lib, candidate, shapes, presets, list_presets, dtype, device, seed,
              json_out, config_path, layout, precision, repeats, warmup, sets, backend_names, max_backend_seconds,
              progress):
    """Time the kernel against our naive path, torch eager and PyTorch SDPA (vendor A/B).

    \b
    Median, IQR, min/max and raw samples per backend; speedups as ratios of medians with
    bootstrap 95% CIs; TFLOP/s at 4*B*H*Nq*Nk*D. Our library is called as users call it
    (flash_kernel.attention) when that resolves to it. A backend that runs out of memory or is
    unsupported is skipped with its reason; a shape our library refuses is a refused row.
    The closing table gives, per shape, the flash path that ran and ours against SDPA-cuDNN and
    SDPA-flash. --preset dit: the diffusion-transformer shapes (image, video, cross-attention,
    head dims). Exit 0, 1 if the measured kernel ran on no shape, 2 bad input.
    """
    if list_presets:
        _list_presets()
        return 0
    from audit.evidence.bench import run_bench

    conf = _load_config(config_path).get("bench", {})
    if not isinstance(conf, dict):
        raise UsageError("config: [bench] must be a table")
    unknown = set(conf) - {"repeats", "warmup", "sets", "backends"}
    if unknown:
        raise UsageError(f"config: unknown key(s) in [bench]: {', '.join(sorted(map(str, unknown)))}")
    repeats = repeats if repeats is not None else _int_conf(conf, "repeats", 10)
    warmup = warmup if warmup is not None else _int_conf(conf, "warmup", 2)
    sets = sets if sets is not None else conf.get("sets")
    if sets is not None and not isinstance(sets, int):
        raise UsageError("config: bench.sets must be an integer")
    names = tuple(backend_names) or tuple(conf.get("backends", ())) or None
    sel, parsed, dtype = _prepare(target, lib, candidate, shapes, presets, dtype, device,
                                  check_head_dims=False, precision=precision)
    report = run_bench(sel, parsed, dtype, repeats=repeats, warmup=warmup, seed=seed, sets=sets,
                       backends=names, progress=progress, max_backend_s=max_backend_seconds,
                       checkpoint=_checkpoint(json_out), layout=layout)
    _write_json(json_out, {**report.to_dict(), "complete": True})
    _print_bench(report)
    prim = [s.backend(report.primary) for s in report.shapes]
    if not any(b is not None and b.summary is not None for b in prim):
        reasons = "; ".join(_safe(b.reason) for b in prim if b is not None and b.reason)
        raise GateFailed(f"bench: {report.primary} ran on no shape: {reasons or 'no samples'}")
    return 0


def _int_conf(conf: dict, key: str, default: int) -> int:
    val = conf.get(key, default)
    if not isinstance(val, int) or isinstance(val, bool):
        raise UsageError(f"config: bench.{key} must be an integer")
    return val


def _tf(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _print_bench(report) -> None:
    sel = report.selection
    click.echo(f"bench: {_safe(sel['kind'])} {_safe(sel['spec'])} on {report.device} "
               f"{_safe(report.device_name)}, {report.dtype}, precision {report.precision}, "
               f"{report.repeats} repeats, "
               f"{report.warmup} warm-up, timer: {report.timer}")
    for s in report.shapes:
        click.echo(f"  {s.shape.label}  ({s.input_sets} input sets of {s.set_bytes / 2**20:.1f} MiB)")
        click.echo(f"    {'backend':16s} {'median ms':>10s} {'IQR ms':>9s} {'min':>9s} {'max':>9s} "
                   f"{'TFLOP/s':>8s}")
        for b in s.backends:
            tag = " (vendor A/B)" if b.vendor else ""
            if b.summary is None:
                click.echo(f"    {b.name:16s} {b.status}: {_safe(b.reason)[:160]}")
                continue
            t = b.summary
            click.echo(f"    {b.name:16s} {t.median:10.3f} {t.iqr:9.3f} {t.min:9.3f} {t.max:9.3f} "
                       f"{_tf(b.tflops):>8s}{tag}")
        for sp in s.speedups:
            c = sp.ci
            click.echo(f"    speedup {sp.subject} vs {sp.baseline}: {c.ratio:.2f}x "
                       f"[95% CI {c.low:.2f}, {c.high:.2f}]")
    click.echo(render_vendor_table(report))


def _ratio_cell(s, baseline: str) -> str:
    sp = next((x for x in s.speedups if x.baseline == baseline), None)
    if sp is None:
        return "-"
    c = sp.ci
    return f"{c.ratio:.2f} [{c.low:.2f}, {c.high:.2f}]"


def render_vendor_table(report) -> str:
    """Per shape: the path ours ran (or why it was refused), TFLOP/s of ours and of SDPA's flash
    and cuDNN backends, and ours against each (ratio of medians, 95% CI; > 1: ours is faster);
    FlashAttention-4's columns too where the run timed it."""
    from audit.evidence.presets import about

    prim = report.primary
    how = f", called through {report.primary_call}" if report.primary_call else ""
    with_fa4 = any(s.backend("fa4") is not None for s in report.shapes)
    lines = [f"ours = {_safe(prim)}{how}; ratios: median time of the baseline / ours, 95% bootstrap CI",
             f"{'shape (B,H,Nq,Nk,D)':<24} {'what':<40} {'path':<9} {'ours TF/s':>9} "
             f"{'SDPA-flash':>10} {'SDPA-cuDNN':>10}  {'ours/cuDNN':<19} {'ours/SDPA-flash':<19}"
             + (f" {'FA4 TF/s':>8}  {'ours/FA4':<19}" if with_fa4 else "")]
    for s in report.shapes:
        sh = s.shape
        dims = f"{sh.batch},{sh.heads},{sh.nq},{sh.nk},{sh.head_dim}"
        what = (about(sh) or sh.name or "")[:40]
        tf = {b.name: b for b in s.backends}

        def t(name):
            b = tf.get(name)
            return _tf(b.tflops) if b is not None and b.summary is not None else "-"

        ours = tf.get(prim)
        path = s.path or ("-" if ours is None or ours.summary is None else "?")
        lines.append(f"{dims:<24} {_safe(what):<40} {_safe(path):<9} {t(prim):>9} {t('sdpa-flash'):>10} "
                     f"{t('sdpa-cudnn'):>10}  {_ratio_cell(s, 'sdpa-cudnn'):<19} "
                     f"{_ratio_cell(s, 'sdpa-flash'):<19}"
                     + (f" {t('fa4'):>8}  {_ratio_cell(s, 'fa4'):<19}" if with_fa4 else ""))
        if ours is not None and ours.status != "ok":
            lines.append(f"{'':<24} {ours.status}: {_safe(ours.reason)[:150]}")
        fa = tf.get("fa4")
        if fa is not None and fa.status != "ok":
            lines.append(f"{'':<24} fa4 {fa.status}: {_safe(fa.reason)[:150]}")
    return "\n".join(lines)

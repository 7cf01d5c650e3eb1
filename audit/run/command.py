"""`sovereign-audit run`: a thin Click wrapper over audit.run.runner."""

from __future__ import annotations

from pathlib import Path

import click

from audit.errors import InputError, UsageError
from audit.report.commands import signing_key
from audit.run.record import RunConfig
from flash_kernel.fp8 import PRECISIONS
from audit.run.runner import run


@click.command("run")
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("out/run"), show_default=True,
              help="Bundle folder (empty, or an earlier bundle: its generated files are replaced).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--target", "targets", multiple=True, metavar="T",
              help="Build and audit this target (repeatable); default: the builder's set.")
@click.option("--artifact", "artifacts", multiple=True, type=click.Path(path_type=Path), metavar="PATH",
              help="Also audit this shared object (and check/time it when it exports our C ABI).")
@click.option("--no-build", is_flag=True, help="Do not build our kernel: audit only --artifact objects.")
@click.option("--key", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Ed25519 PKCS#8 PEM signing key (else $SOVEREIGN_AUDIT_SIGNING_KEY, else ephemeral).")
@click.option("--build-dir", type=click.Path(path_type=Path), default=Path("build"), show_default=True,
              help="Where our kernel is built (build/<target>/libflash_kernel.so).")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timing repeats per backend.")
@click.option("--pipeline-preset", default=None, help="DiT pipeline preset (default: tiny on CPU, wan-480p on CUDA).")
@click.option("--pipeline-steps", type=click.IntRange(min=1), default=None)
@click.option("--precision", type=click.Choice(PRECISIONS), default="exact", show_default=True,
              help="fp8: parity, bench and the pipeline run our kernel's opt-in FP8 attention, held to "
              "the fp8 gates and labelled FP8 in the report; refused (exit 2) on a device without it.")
@click.option("--skip", "skip", multiple=True, type=click.Choice(["parity", "bench", "pipeline"]),
              help="Do not run this evidence stage (recorded as skipped; repeatable).")
@click.pass_context
def run_cmd(ctx, out, device, targets, artifacts, no_build, key, build_dir, repeats, pipeline_preset,
            pipeline_steps, precision, skip):
    """Build, audit, gather evidence and write the signed research-object report.

    \b
    Exit: 0 every stage ran and every gate and the policy hold; 1 a gate or the policy
    failed, or a stage could not produce its evidence (it is shown in the report);
    2 usage; 3 an unreadable --artifact.
    """
    if no_build and not artifacts:
        raise UsageError("--no-build needs at least one --artifact (there is nothing else to audit)")
    if key is not None and not key.is_file():
        raise InputError(f"--key {key}: no such file")
    config = RunConfig(out=out, device=device, targets=tuple(targets), artifacts=tuple(artifacts),
                       no_build=no_build, key=signing_key(key), build_dir=build_dir, repeats=repeats,
                       pipeline_preset=pipeline_preset, pipeline_steps=pipeline_steps, skip=tuple(skip),
                       precision=precision,
                       argv=["sovereign-audit", "run", *_reconstruct(ctx)])
    result = run(config, echo=lambda s: click.echo(s, err=True))
    failed = [s for s in result.record.stages if s.status == "failed" or s.verdict == "fail"]
    for s in failed:
        click.echo(f"{s.name}: {s.status if s.status == 'failed' else 'gate failed'}: {s.reason or ''}", err=True)
    if result.report is not None:
        click.echo(f"report: {result.report}")
    ctx.exit(result.exit_code)


_FLAGS = {"targets": "--target", "artifacts": "--artifact"}  # multiple options: singular flags
_PLACEHOLDERS = {"key": "KEY_FILE"}  # where the private key lives is never recorded


def _reconstruct(ctx) -> list[str]:
    # The exact command in canonical form, rebuilt from the parsed options (sys.argv is not ours
    # when called through python -m, a test runner or another program).
    args = []
    for name, value in ctx.params.items():
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        if value in (None, False, ()):
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, tuple):
            for v in value:
                args += [flag, str(v)]
        else:
            args += [flag, _PLACEHOLDERS.get(name, str(value))]
    return args

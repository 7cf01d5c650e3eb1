"""`sovereign-audit build`: compile flash_kernel/ per target, with provenance beside each library."""

from __future__ import annotations

import json
from pathlib import Path

import click

from audit.errors import printable
from audit.kernel_build.builder import BUILT, FAILED, build_targets


def _one_line(text: str) -> str:
    # compiler output and paths are untrusted: one line, control characters and `##[` made visible
    return printable(" ".join(str(text).split()))


@click.command("build")
@click.option("--target", "-t", "targets", multiple=True, metavar="T",
              help="gfx1030, other gfx targets of the installed device libraries (gfx90a, ...), sm_90a "
                   "(wgmma on cc 9.0 + an sm_80 mma.sync cubin), sm_90, sm_80, sm_90-generic, cpu; "
                   "repeatable. Default: gfx1030, sm_90a and sm_90 where their toolchains exist, and cpu.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("build"),
              show_default=True, help="Build folder: DIR/<target>/libflash_kernel.so + provenance.json.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel compiles (default: CPUs).")
@click.option("--define", "-D", "defines", multiple=True, metavar="FK_NAME=INT",
              help="A kernel switch for a variant build (flash_kernel's FK_* macros, integer values, e.g. "
                   "FK_FP8_FLUSH_TILES_D128=4); repeatable; recorded in each provenance.json's flags. "
                   "Build variants into their own --out folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the BuildResult as JSON.")
@click.pass_context
def build(ctx, targets, out, jobs, defines, as_json):
    """Build the flash kernel for each target, with provenance.json beside each library.

    \b
    Exit codes: 0 every requested target built; 1 one failed (or a requested
    target's toolchain is missing); 2 unknown target or a bad --define.
    """
    result = build_targets(list(targets) or None, out, jobs=jobs, defines=tuple(defines))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for t in result.targets:
            if t.status == BUILT:
                click.echo(f"built    {t.target:<14} {_one_line(t.library)} (sha256 {t.sha256[:16]}...)")
            else:
                click.echo(f"{t.status:<8} {t.target:<14} {_one_line(t.reason)}",
                           err=t.status == FAILED)
        click.echo(f"wrote {_one_line(str(Path(out) / 'build.json'))}")
    ctx.exit(result.exit_code)

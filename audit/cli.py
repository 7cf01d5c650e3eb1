"""The `sovereign-audit` command line.

Commands load lazily (Click's documented LazyGroup pattern) so `--help` and
`check` never import torch. Each command lives in the module of its stage.
"""

from __future__ import annotations

import gc
import importlib
import signal
import sys

import click

from audit import __version__
from audit.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, AuditError, Interrupted, one_line, printable

# name -> "module:attribute"; the order is the data flow.
COMMANDS = {
    "build": "audit.kernel_build.command:build",
    "inspect": "audit.linkage.inspect_command:inspect_cmd",
    "check": "audit.linkage.commands:check_cmd",
    "policy": "audit.linkage.commands:policy_group",
    "parity": "audit.evidence.commands:parity_cmd",
    "bench": "audit.evidence.commands:bench_cmd",
    "pipeline": "audit.evidence.pipeline_command:pipeline_cmd",
    "run": "audit.run.command:run_cmd",
    "report": "audit.report.commands:report_cmd",
    "verify": "audit.report.sign_commands:verify_cmd",
    "keygen": "audit.report.sign_commands:keygen_cmd",
    "verify-attestation": "audit.report.sign_commands:verify_attestation_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # raised here, Click would print a blank line before its own message
            raise Interrupted("interrupted") from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sovereign-audit")
def cli():
    """Prove that a GPU kernel build is sovereign and that its performance claim holds.

    \b
    Exit codes: 0 ok, 1 violation or failed gate, 2 usage/policy/config error,
    3 unreadable input, 4 internal error, 130 interrupted (Ctrl-C, SIGTERM).
    A Python package that a command needs and cannot find: exit 2, naming it.
    """


def _terminated(signum, frame):
    raise KeyboardInterrupt  # as Ctrl-C: temporary folders are removed and worker processes stopped


def main(argv=None):
    """Entry point: turns every AuditError into one line and its exit code. SIGTERM (a
    cancelled CI job) is handled as Ctrl-C while it runs."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread: signals are not ours to set
        previous = None
    try:
        _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if argv is None:  # the process's own command: it exits next, and the collection at exit
            gc.freeze()  # would walk every object left (tens of ms after a large file) only to free it


def _main(argv):
    try:
        rv = cli.main(args=argv, prog_name="sovereign-audit", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # a bare group name: its help, exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C while Click itself was parsing
        click.echo("error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:  # a usage error: one line, exit 2 (--help has the usage)
        click.echo(f"error: {_click_message(exc)}", err=True)
        sys.exit(exc.exit_code)
    except AuditError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except ModuleNotFoundError as exc:
        hint = missing_package_hint(exc)
        if hint is None:  # one of our own modules: a bug
            _internal_error(exc)
        click.echo(f"error: {hint}", err=True)  # an environment to fix, not a bug to report
        sys.exit(EXIT_USAGE)
    except Exception as exc:  # a bug: say so in one line, never a traceback
        _internal_error(exc)
    sys.exit(rv if isinstance(rv, int) else 0)


def _internal_error(exc: BaseException):
    # The message may quote an input (a name from a binary): one escaped line, like every other error.
    click.echo(f"error: internal error: {one_line(exc)}", err=True)
    sys.exit(EXIT_INTERNAL)


# Import name -> what to install, where the two differ or an extra brings it.
_INSTALL = {
    "elftools": "pyelftools",
    "yaml": "pyyaml",
    "torch": "sovereign-audit[evidence]",
    "diffusers": "sovereign-audit[pipeline]",
}


def missing_package_hint(exc: ModuleNotFoundError) -> str | None:
    """One line naming the missing third-party package and what to install; None where the
    missing module is one of this project's own (that is a broken install or a bug)."""
    top = (exc.name or "").split(".")[0]
    if not top or top in ("audit", "flash_kernel"):
        return None
    return (f"the Python package '{printable(top)}' is not installed and this command needs it: "
            f"pip install '{printable(_INSTALL.get(top, top))}'")


def _click_message(exc: click.ClickException) -> str:
    """`sovereign-audit check: No such option '--bogus'. (see --help)`: Click's message on one line,
    escaped (it may quote what was typed), with the command it is about."""
    text = printable(" ".join(exc.format_message().split()))
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return text
    return f"{printable(ctx.command_path)}: {text} (see {printable(ctx.command_path)} --help)"


if __name__ == "__main__":
    main()

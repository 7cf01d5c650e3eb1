"""Exit codes and the exceptions that carry them.

Every command maps a failure to one documented exit code and a one-line message;
nothing below the CLI prints or exits on its own.
"""

from __future__ import annotations

import re

# Documented in README.md ("Exit codes"); tests assert on these numbers.
EXIT_OK = 0
EXIT_VIOLATION = 1  # a policy violation, a failed gate, a failed signature
EXIT_USAGE = 2  # bad command line, bad policy or config, malformed bundle
EXIT_INPUT = 3  # an input that could not be read or parsed (fail closed)
EXIT_INTERNAL = 4  # a bug in sovereign-audit itself (reported, never a traceback)
# Ctrl-C or SIGTERM (a cancelled CI job): stopped at once, temporary files removed and worker
# processes stopped; what was already written stays (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


class AuditError(Exception):
    """An error with a one-line message and an exit code."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        # One line, always: messages may quote untrusted text (paths, binary strings).
        return printable(" ".join(str(self).split()))


class UsageError(AuditError):
    exit_code = EXIT_USAGE


class PolicyError(AuditError):
    exit_code = EXIT_USAGE


class InputError(AuditError):
    exit_code = EXIT_INPUT


class GateFailed(AuditError):
    exit_code = EXIT_VIOLATION


class Interrupted(AuditError):
    exit_code = EXIT_INTERRUPTED


def one_line(exc: BaseException) -> str:
    """An exception as one line: AuditError's own message, else `Type: message`."""
    if isinstance(exc, AuditError):
        return exc.message
    text = printable(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}


def printable(text) -> str:
    """Printable, one line: control, format (bidi) and other non-printable characters as
    \\xNN / \\uNNNN, so a quoted path or symbol cannot move a terminal's cursor or fake a line.
    A byte that is not UTF-8 (a file name's, kept by surrogateescape) is shown as that byte, \\xNN,
    and `##[` as `##\\x5b`: a GitHub runner takes `##[command]` anywhere in a line for a command."""
    out = []
    for ch in str(text):
        o = ord(ch)
        if ch.isprintable() and o not in _BIDI:
            out.append(ch)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out).replace("##[", "##\\x5b")


# a line a CI runner reads as a workflow command: `::` after leading white space (GitHub trims
# it; lines end at CR or LF); `##[` (the runner's older form) is a command anywhere in a line
_LINE_COMMAND = re.compile(r"(\A|[\r\n])([^\S\r\n]*):(?=:)")


def no_commands(text: str, colon: str = "\\x3a", bracket: str = "\\x5b") -> str:
    """A whole rendering with no line a CI runner would obey: the first colon of a line that
    starts with `::` is written as `colon`, the `[` of `##[` as `bracket` (each in the
    destination's own escape: a character reference in XML, \\u003a in JSON, \\x3a in text)."""
    text = text.replace("##[", "##" + bracket)
    return _LINE_COMMAND.sub(lambda m: m.group(1) + m.group(2) + colon, text)

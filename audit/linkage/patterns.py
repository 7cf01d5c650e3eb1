"""Policy patterns: shell-style globs, always anchored to the whole name.

Why globs and not regular expressions: a pattern must match a *whole* symbol, string or
kernel name, never a substring (`cublas` inside `my_cublas_free_helper` is not cuBLAS), and
the union of all symbol patterns is handed to the ELF reader as ONE bytes regex that it may run
over a whole NUL-separated string table at once. Translating globs ourselves guarantees that no
pattern can match across a NUL (`*` becomes `[^\\x00]*`) and that every match is bounded by
NULs or the ends of the name, in either use.

Syntax: `*` any run of characters, `?` one character, `[abc]` / `[a-z]` / `[!abc]` a class.
Patterns are printable ASCII (ELF symbol names are).
"""

from __future__ import annotations

import re

_BOUNDARY_START = r"(?<![^\x00])"  # at the start of the name, or just after a NUL
_BOUNDARY_END = r"(?![^\x00])"  # at the end of the name, or just before a NUL
NEVER = re.compile(rb"(?!)")


class PatternError(ValueError):
    """A glob that cannot be translated (the message says why)."""


def glob_to_regex(pattern: str) -> str:
    """The regex body (unanchored) that matches exactly what `pattern` matches."""
    if not pattern:
        raise PatternError("empty pattern")
    if not all(" " < ch < "\x7f" for ch in pattern):
        raise PatternError("pattern must be printable ASCII without spaces")
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append(r"[^\x00]*")
        elif ch == "?":
            out.append(r"[^\x00]")
        elif ch == "[":
            j = i
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                raise PatternError("unterminated '[' class")
            body = pattern[i:j]
            i = j + 1
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            if not body:
                raise PatternError("empty '[]' class")
            body = "".join("\\" + c if c in "\\^[]" else c for c in body)
            out.append(f"[^{body}\\x00]" if negate else f"[{body}]")
        else:
            out.append(re.escape(ch))
    regex = "".join(out)
    try:
        re.compile(regex)
    except re.error as exc:
        raise PatternError(str(exc)) from None
    return regex


def compile_globs(patterns: list[str] | tuple[str, ...]) -> re.Pattern[str] | None:
    """One str regex matching a whole name against any of `patterns` (None if there are none)."""
    if not patterns:
        return None
    return re.compile("(?:" + "|".join(glob_to_regex(p) for p in patterns) + r")\Z")


def combined_bytes_regex(patterns: list[str]) -> re.Pattern[bytes]:
    """The union of `patterns` as ONE bytes regex, bounded by NULs or the ends of the input.

    Works with .match/.fullmatch/.search on a single name and with .finditer over a whole
    NUL-separated string table. Alternatives are grouped by their first literal character so
    the engine tries one or two branches per name instead of all of them.
    """
    groups: dict[str, list[str]] = {}
    other: list[str] = []
    for pat in dict.fromkeys(patterns):  # dedupe, keep order
        body = glob_to_regex(pat)
        if pat[0] not in "*?[":
            groups.setdefault(pat[0], []).append(glob_to_regex(pat[1:]) if len(pat) > 1 else "")
        else:
            other.append(body)
    if not groups and not other:
        return NEVER
    branches = [re.escape(first) + "(?:" + "|".join(rests) + ")" for first, rests in groups.items()]
    branches += other
    regex = _BOUNDARY_START + "(?:" + "|".join(branches) + ")" + _BOUNDARY_END
    return re.compile(regex.encode("ascii"))


_SONAME_STEM = re.compile(r"^(.+?)\.so(?:\.[0-9A-Za-z_+-]+)*$")


def soname_stem(name: str) -> str:
    """`libcublas.so.12.3` -> `libcublas`; `dir/libfoo.so` -> `libfoo`; other names unchanged."""
    base = name.rsplit("/", 1)[-1]
    m = _SONAME_STEM.match(base)
    return m.group(1) if m else base


def soname_matches(regex: re.Pattern[str] | None, name: str) -> bool:
    """Soname globs match the stem (any version suffix) or the whole file name."""
    if regex is None:
        return False
    base = name.rsplit("/", 1)[-1]
    return bool(regex.match(soname_stem(base)) or regex.match(base))

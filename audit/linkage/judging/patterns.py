"""Policy patterns: shell-style globs, always anchored to the whole name.

Why globs and not regular expressions: a pattern must match a *whole* symbol, string or
kernel name, never a substring (`cublas` inside `my_cublas_free_helper` is not cuBLAS), and
the union of all symbol patterns is handed to the ELF reader as ONE bytes regex that it runs
over a whole string table at once (audit.elf.textscan: NULs become newlines, `^`/`$` anchor at
each name, then each candidate is re-checked on its own with `pattern.search`). Translating
globs ourselves guarantees that no pattern can run past the end of a name (`*` becomes
`[^\x00\n]*`) and that every match is the whole name, in either use. The union is built as a
prefix trie (`_Z` -> `N` -> `7cutlass` ...) so the engine rejects a name after a byte or two.

Syntax: `*` any run of characters, `?` one character, `[abc]` / `[a-z]` / `[!abc]` a class.
Patterns are printable ASCII without spaces (ELF symbol names are).
"""

from __future__ import annotations

import functools
import re

from audit.elf.regex_tree import compile_scannable

_ANY = r"[^\x00\n]"  # a name's character: never the separator of a joined string table
NEVER = re.compile(rb"(?!)")
MAX_GLOB_LENGTH = 1024  # characters in one pattern (the longest symbol-list name is as long)


class PatternError(ValueError):
    """A glob that cannot be translated (the message says why)."""


def glob_to_regex(pattern: str, any_char: str = _ANY) -> str:
    """The regex body (unanchored) that matches exactly what `pattern` matches.

    Linear in the name, whatever the pattern: between two stars each fixed-length piece is
    found at its first place in an atomic group (the first place is always a right one, so
    nothing is tried again), never by backtracking over every split (`*a*a*a*...b` against a
    long name would take its length to the power of the stars)."""
    if not pattern:
        raise PatternError("empty pattern")
    if len(pattern) > MAX_GLOB_LENGTH:
        raise PatternError(f"longer than {MAX_GLOB_LENGTH} characters")
    if not all(" " < ch < "\x7f" for ch in pattern):
        raise PatternError("pattern must be printable ASCII without spaces")
    pieces: list[list[str]] = [[]]  # the fixed-length pieces between stars
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            if pieces[-1] or len(pieces) == 1:  # `**` is `*`
                pieces.append([])
        elif ch == "?":
            pieces[-1].append(any_char)
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
            pieces[-1].append(f"[^{body}\\x00\\n]" if negate else f"[{body}]")
        else:
            pieces[-1].append(re.escape(ch))
    pieces = [p for k, p in enumerate(pieces) if p or k in (0, len(pieces) - 1)]
    texts = ["".join(p) for p in pieces]
    if len(texts) == 1:
        regex = texts[0]
    else:
        middle = "".join(f"(?>{any_char}*?{t})" for t in texts[1:-1])
        regex = texts[0] + middle + any_char + "*" + texts[-1]
    if "[" in pattern:  # only a class can make an invalid regex; compiling costs (thousands of globs)
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
    """The union of `patterns` as ONE bytes regex `^(?:trie)$` (whole names only).

    Matches a single name with .search/.match/.fullmatch, and each name of a NUL- or
    newline-separated table under re.MULTILINE (what the ELF reader's bulk scan does).
    """
    trie: dict = {}
    for pat in dict.fromkeys(patterns):
        glob_to_regex(pat)  # validate the whole pattern first
        for literal, rest in literal_prefixes(pat):
            node = trie
            for ch in literal:
                node = node.setdefault(ch, {})
            node.setdefault(None, []).append(glob_to_regex(rest) if rest else "")
    if not trie:
        return NEVER
    return compile_scannable(("^" + _emit(trie) + "$").encode("ascii"))


def covering_globs(names) -> list[str]:
    """A few globs that together match every one of `names` (and more): first three characters,
    `*`, last character. Exact name lists join the reader's one regex this way (thousands of
    names would make it slow to compile); the exact check follows on what the filter kept."""
    return sorted({n if len(n) <= 5 else n[:3] + "*" + n[-1] for n in names})


def literal_prefixes(pattern: str) -> list[tuple[str, str]]:
    """Split into (literal prefix, glob rest); small classes expand: [sd]gemm_ -> s.., d..;
    _Z[0-9][0-9]flash* -> _Z00flash, ... (at most 128 prefixes per pattern)."""
    todo, out = [("", pattern)], []
    while todo:
        literal, rest = todo.pop()
        while rest and rest[0] not in "*?[":
            literal, rest = literal + rest[0], rest[1:]
        if rest.startswith("["):
            end = rest.find("]", 2)
            chars = _class_chars(rest[1:end]) if end > 0 else None
            if chars and (len(todo) + len(out) + 1) * len(chars) <= 128:
                todo += [(literal + ch, rest[end + 1:]) for ch in reversed(chars)]
                continue
        out.append((literal, rest))
    return out


def _class_chars(body: str) -> str | None:
    """The characters of a small, positive class body (`sdcz`, `0-9`), else None."""
    if not body or body[0] in "!^" or "\\" in body:
        return None
    chars, i = [], 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            lo, hi = ord(body[i]), ord(body[i + 2])
            if hi < lo or hi - lo >= 10:
                return None
            chars += [chr(c) for c in range(lo, hi + 1)]
            i += 3
        else:
            chars.append(body[i])
            i += 1
    return "".join(dict.fromkeys(chars)) if len(chars) <= 10 else None


def _emit(node: dict) -> str:
    alts = [re.escape(ch) + _emit(sub) for ch, sub in node.items() if ch is not None]
    alts += node.get(None, [])
    alts = list(dict.fromkeys(alts))
    if len(alts) == 1 and (None not in node or not alts[0]):
        return alts[0]
    return "(?:" + "|".join(alts) + ")"


# What wheel repair tools append to a library they bundle, so that two packages' copies never
# clash in one process (the original name is what was linked):
#   auditwheel        libfoo.so.1 -> libfoo-<8 hex>.so.1   (libscipy_openblas64_-32a4b2a6.so)
#   delvewheel        foo.dll     -> foo-<32 hex>.dll
#   build-time tags   libopenblas64_p-r0-<hex>.3.15.so   (a release tag and hash before the version)
# delocate keeps the file name and moves it under .dylibs/ (@loader_path/.dylibs/libfoo.1.dylib):
# the path and the Mach-O suffix are dropped like any other.
# Names come from the audited file (a DT_NEEDED can be 100 KB long), so the suffixes are taken
# apart from the right with str methods, in one pass: a regex with a lazy stem before a repeated
# group tries every split, quadratic in the name's length.
_VERSION_PART = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_+-")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdef")


@functools.lru_cache(maxsize=4096)  # each rule asks about the same few names
def soname_stem(name: str) -> str:
    """The library's own name: `libcublas.so.12.3` -> `libcublas`; `dir/libfoo.so` -> `libfoo`;
    a repair tool's renaming undone (`libscipy_openblas64_-32a4b2a6.so` -> `libscipy_openblas64_`,
    `libopenblaso-r0-d77a1985.3.15.so` -> `libopenblaso`, `@loader_path/.dylibs/libfoo.1.dylib` ->
    `libfoo`); other names unchanged."""
    stem = _plain_stem(name)
    return _unrenamed(stem) or stem


def _dotted_tail(text: str, chars: frozenset) -> int:
    """Where the longest tail of `text` made of `.PART` pieces begins (PART: one or more of
    `chars`, no dot); len(text) if there is none. Every dot from there on starts such a tail."""
    at = len(text)
    while True:
        dot = text.rfind(".", 0, at)
        if dot < 0 or dot + 1 == at or not chars.issuperset(text[dot + 1:at]):
            return at
        at = dot


@functools.lru_cache(maxsize=4096)
def _plain_stem(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    text = base[:-1] if base.endswith("\n") else base  # a regex's `$` allowed one trailing newline
    stem = _so_stem(text)
    if stem is None:
        stem = _dylib_stem(text)
    return stem if stem is not None and "\n" not in stem else base


def _so_stem(text: str) -> str | None:
    """`STEM.so` + any `.VERSION` pieces, STEM as short as it can be (at least one character)."""
    end = _dotted_tail(text, _VERSION_PART)  # ".so" must end here, at a later dot, or at the end
    while True:
        if end >= 4 and text[end - 3:end] == ".so":
            return text[:end - 3]
        if end >= len(text):
            return None
        nxt = text.find(".", end + 1)
        end = len(text) if nxt < 0 else nxt


def _dylib_stem(text: str) -> str | None:
    """`STEM` + any `.DIGITS` pieces + `.dylib` or `.dll`, STEM as short as it can be."""
    for suffix in (".dylib", ".dll"):
        if text.endswith(suffix) and len(text) > len(suffix):
            rest = text[:-len(suffix)]
            at = _dotted_tail(rest, _DIGITS)
            if at == 0:  # the stem keeps at least one character: the tail starts at its next dot
                at = rest.find(".", 1)
                at = len(rest) if at < 0 else at
            return rest[:at]
    return None


def _unrenamed(stem: str) -> str:
    """`stem` without a repair tool's suffix: `-r<digits>-<6+ hex>` + any `.DIGITS` pieces, or
    one or more `-<8 to 40 hex>` pieces; the leftmost such ending wins."""
    text, newline = (stem[:-1], "\n") if stem.endswith("\n") else (stem, "")
    cut = len(text)
    at = len(text)  # -HEX pieces, from the right
    while True:
        dash = text.rfind("-", 0, at)
        piece = text[dash + 1:at]
        if dash < 0 or not 8 <= len(piece) <= 40 or not _HEX.issuperset(piece):
            break
        cut = at = dash
    hex_end = _dotted_tail(text, _DIGITS)  # -r<digits>-<hex>: the hex ends where the versions begin
    dash = text.rfind("-", 0, hex_end)
    if dash >= 0 and hex_end - dash - 1 >= 6 and _HEX.issuperset(text[dash + 1:hex_end]):
        r = text.rfind("r", 0, dash)
        if r >= 1 and text[r - 1] == "-" and r + 1 < dash and _DIGITS.issuperset(text[r + 1:dash]):
            cut = min(cut, r - 1)
    return text[:cut] + newline


def soname_matches(regex: re.Pattern[str] | None, name: str) -> bool:
    """Soname globs match the library's own name (version suffix and repair-tool renaming
    removed), its stem as written, or the whole file name; a Windows DLL's name in any case
    (the Windows loader ignores it); a path into a macOS framework also by the framework's
    name (`.../Accelerate.framework/Versions/A/Accelerate` is `Accelerate.framework`)."""
    if regex is None:
        return False
    base = name.rsplit("/", 1)[-1]
    if base[-4:].lower() == ".dll":
        regex, base = _folded(regex), base[:-4] + ".dll"
    elif ".framework/" in name:
        framework = framework_name(name)
        if framework and regex.match(framework):
            return True
    return bool(regex.match(soname_stem(base)) or regex.match(_plain_stem(base)) or regex.match(base))


@functools.lru_cache(maxsize=1024)
def _folded(regex: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(regex.pattern, regex.flags | re.IGNORECASE)


def framework_name(path: str) -> str | None:
    """`NAME.framework` of the innermost framework folder in `path` (`.../Accelerate.framework/
    Versions/A/Frameworks/vecLib.framework/Versions/A/vecLib` -> `vecLib.framework`), else None."""
    parts = path.split("/")
    for part in reversed(parts[:-1]):
        if part.endswith(".framework") and len(part) > len(".framework"):
            return part
    return None


# Accelerate's new BLAS/LAPACK entry points (macOS 13.3+, its cblas_new.h and lapack headers):
# the same routines under their interface's name with a suffix, `$NEWLAPACK` (LP64) or
# `$NEWLAPACK$ILP64`, the Fortran routines without their trailing underscore (`dgetrf$NEWLAPACK`
# is `dgetrf_`, `cblas_dgemm$NEWLAPACK$ILP64` is `cblas_dgemm`). Longest first.
NEWLAPACK_SUFFIXES = ("$NEWLAPACK$ILP64", "$NEWLAPACK")


def newlapack_bases(name: str) -> tuple[str, ...]:
    """The names a symbol with an Accelerate new-LAPACK suffix stands for, in the order they are
    tried: the base without the suffix, then (where it has none) with the Fortran trailing
    underscore. () for a name without such a suffix or with nothing before it."""
    if "$" not in name:
        return ()
    for suf in NEWLAPACK_SUFFIXES:
        if name.endswith(suf):
            base = name[:-len(suf)]
            if not base or "$" in base:
                return ()
            return (base,) if base.endswith("_") else (base, base + "_")
    return ()

"""read_python: one Python source file -> BinaryInfo (audit/binary/model.py), format "python".

A package can load a vendor library without any binary of its own naming it:
`ctypes.CDLL("libcublas.so.12")` in a module is a dlopen with the name in the source. So the
Python files (and the `import` lines of .pth files, which site runs at every start-up) that
call a library loader are read too, wherever they are (a folder, a wheel, a tarball, a conda
package, an image), and each library name the source hands to a loader becomes a library string
of the file, asked for by that call: judging treats it as it treats a binary's dlopen string
with a loader import (`dlopen-string`, denied).

What counts as a load: a call whose callee ends in one of LOADER_CALLS (ctypes.CDLL and its kin,
cdll.LoadLibrary, cffi's ffi.dlopen, numpy's, torch's and TensorFlow's load_library,
ctypes.util.find_library, ...), under its own name or another (`import as`, an assignment,
`getattr`), ctypes' attribute loaders (`ctypes.windll.cublas64_12`, `cdll["libcudnn.so.9"]`),
and the same in code given to exec/eval/compile as a string. The name is what the source spells,
evaluated without running anything: string literals, f-strings and `%`/`.format` templates with
their fields left empty, `+`, os.path.join / Path's last part, conditional expressions, and names
bound to such values anywhere in the module (an assignment, or a `for` over a literal list). A
name computed at run time (read from a file, a glob) is not judged: torch's CPU wheel keeps its
CUDA names in a table handed to glob, which loads nothing there.

Bounded and inert: the file is parsed with `ast` (never compiled or run) up to MAX_PARSED_BYTES;
a larger one, or one that does not parse as Python 3 (Python 2 code, a template), is read by
pattern instead (a warning says so), so a load in it is still seen; past MAX_SOURCE_BYTES it is
an error.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import os
import re
from dataclasses import dataclass
from itertools import islice

from audit.binary.model import BinaryInfo
from audit.elf.model import StringHit
from audit.errors import InputError

SUFFIXES = (".py", ".pyw", ".pth")  # .pth: site runs its lines that start with "import" at every start-up
MAX_SOURCE_BYTES = 64 << 20  # a larger file that calls a loader is an error, never a pass
MAX_PARSED_BYTES = 1 << 20  # larger files are read by pattern: an AST costs ~100x the source in memory, ~1 s a MiB
MAX_VALUES = 64  # spellings one expression may evaluate to (`a + b` multiplies them)
MAX_DEPTH = 12  # nesting of one evaluated expression
MAX_HITS = 10_000  # per file; more makes the file an error
CONTEXT_CUT = 120  # characters of the call's source kept with a hit

# The callee's last name: every loader that takes a library name or path as its first argument.
LOADER_CALLS = frozenset((
    "CDLL", "PyDLL", "WinDLL", "OleDLL",  # ctypes
    "LoadLibrary", "LoadLibraryEx", "LoadLibraryA", "LoadLibraryW", "LoadLibraryExA", "LoadLibraryExW",
    "dlopen",  # cffi's ffi.dlopen, _ctypes.dlopen
    "load_library",  # numpy.ctypeslib.load_library, torch.ops.load_library, tf.load_library
    "load_op_library",  # tf.load_op_library: a custom op library (it may link a vendor library)
    "load_library_permanently",  # llvmlite.binding
    "find_library",  # ctypes.util.find_library: its result is what gets loaded
))
# ctypes' LibraryLoader objects: an attribute or item of one loads the library of that name
LOADER_OBJECTS = frozenset(("cdll", "windll", "oledll", "pydll"))
_NAME_KEYWORDS = ("name", "libname", "lib_name", "path", "filename", "library")
# The bytes a file must hold for any of the above to be in it: the containers read only those
# files (a wheel's thousands of others are counted, not parsed).
TOKENS = tuple(sorted({n.encode() for n in LOADER_CALLS} | {n.encode() for n in LOADER_OBJECTS}))

_TEMPLATE_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdifrxa]|\{[^{}]*\}")
# the fallback for a file that is not Python 3: a loader call with a literal first argument, or
# an attribute of a LibraryLoader
_PATTERN_CALL = re.compile(
    r"\b(" + "|".join(sorted(LOADER_CALLS)) + r")\s*\(\s*[rRuUbB]{0,2}(['\"])([^'\"\\\r\n]{1,255})\2")
_PATTERN_ATTR = re.compile(r"\b(" + "|".join(sorted(LOADER_OBJECTS)) + r")(?:\.([A-Za-z_][A-Za-z0-9_]{0,254})\b"
                           r"|\[\s*[rRuU]?(['\"])([^'\"\\\r\n]{1,255})\3\s*\])")
_LOADER_METHODS = frozenset(("LoadLibrary",))  # cdll.LoadLibrary(...): a call, judged as one


def is_python_source(name: str) -> bool:
    return name.lower().endswith(SUFFIXES)


def may_load(data: bytes) -> bool:
    """Whether a Python file's bytes hold any loader's name: only those files are read."""
    return any(t in data for t in TOKENS)


@dataclass(frozen=True)
class SourceString(StringHit):
    """A library name a Python source hands to a loader: `section` is "line N", `offset` the
    byte offset of the call's line, `call` the loader as spelled ("ctypes.CDLL"), `context` the
    call's source (cut to CONTEXT_CUT characters)."""

    call: str = ""
    context: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        return f"{self.section}, {self.call}"


def read_python(path: str | os.PathLike, sha256: bool = True) -> BinaryInfo:
    """Read one Python source file. Raises InputError when it cannot be read or is over
    MAX_SOURCE_BYTES."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_SOURCE_BYTES:
                raise InputError(f"{path}: Python source of {size} bytes, over the {MAX_SOURCE_BYTES}-byte limit "
                                 "of what is read: its library loads are not judged")
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return read_python_buffer(path, data, sha256)


def read_python_buffer(path: str, data: bytes, sha256: bool = True) -> BinaryInfo:
    """read_python over bytes already in memory (`path` names the file in messages)."""
    if len(data) > MAX_SOURCE_BYTES:
        raise InputError(f"{path}: Python source of {len(data)} bytes, over the {MAX_SOURCE_BYTES}-byte limit "
                         "of what is read: its library loads are not judged")
    info = BinaryInfo(path=path, sha256=hashlib.sha256(data).hexdigest() if sha256 else "", size=len(data),
                      format="python", machine="python", bits=0, endian="", file_type="Python source", soname=None)
    hits, warning = loads_in(_pth_code(data) if path.lower().endswith(".pth") else data)
    if len(hits) > MAX_HITS:
        raise InputError(f"{path}: more than {MAX_HITS} library loads in one Python source")
    info.library_strings = hits
    info.code_loading_imports = sorted({h.call for h in hits})
    if warning:
        info.warnings.append(warning)
    return info


def _pth_code(data: bytes) -> bytes:
    """A .pth file's code: the lines site.py executes (those starting "import" and a space or
    tab); every other line (a path to add) blanked, so line numbers stay the file's."""
    return b"".join(line if line.startswith((b"import ", b"import\t")) else line[len(line.rstrip(b"\r\n")):]
                    for line in data.splitlines(keepends=True))


def loads_in(data: bytes) -> tuple[list[SourceString], str | None]:
    """The library names `data` (a Python source) hands to loaders, and a warning where the
    source had to be read by pattern."""
    if not may_load(data):
        return [], None
    if len(data) > MAX_PARSED_BYTES:
        return _by_pattern(data), f"over {MAX_PARSED_BYTES} bytes: its loader calls were read by pattern, not parsed"
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        why = type(exc).__name__ + (f" at line {exc.lineno}" if getattr(exc, "lineno", None) else "")
        return _by_pattern(data), f"not Python 3 source ({why}): its loader calls were read by pattern"
    return _Loads(data, tree).hits, None


_NEWLINE = re.compile(rb"\r\n|\r|\n")  # Python's line ends: its line numbers count these and no others


def _line_starts(data: bytes) -> list[int]:
    """The byte offset where each line starts, lines numbered as Python numbers them."""
    return [0] + [m.end() for m in _NEWLINE.finditer(data)]


def _line_text(data: bytes, starts: list[int], line: int) -> str:
    """Line `line` (1-based), stripped, at most CONTEXT_CUT characters."""
    if not 0 < line <= len(starts):
        return ""
    end = starts[line] if line < len(starts) else len(data)
    return data[starts[line - 1]:end].decode("utf-8", errors="replace").strip()[:CONTEXT_CUT]


def _library_name(text: str, call: str) -> str | None:
    """The file name a loader is given: the last part of a path; find_library's bare name as the
    file the loader finds ("cublas" -> "libcublas.so")."""
    base = re.split(r"[/\\]", text)[-1].strip().rstrip("._-")  # "libcudnn.so.{major}": "libcudnn.so"
    if not base or len(base) > 255:
        return None
    if call.removesuffix("()").rsplit(".", 1)[-1] == "find_library" and "." not in base and not base.startswith("lib"):
        return f"lib{base}.so"
    return base


def _bound_values(nodes) -> dict[str, list[ast.AST]]:
    """Each name, and the expressions the module binds to it: an assignment's value, a `for`'s
    literal list (or a name of one)."""
    bound: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and \
                isinstance(node.iter, (ast.List, ast.Tuple, ast.Set, ast.Name)):
            pairs = [(node.target, node.iter)]
        else:
            continue
        for target, value in pairs:
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, []).append(value)
    return bound


def _names_in(exprs) -> set[str]:
    """The names (ast.Name) the expressions spell, anywhere inside them."""
    return {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif not parts:
        return None
    else:
        parts.append("...")
    return ".".join(reversed(parts))


MAX_EXEC_DEPTH = 2  # code in a string literal handed to exec/eval/compile, read this many levels deep
_EXECS = frozenset(("exec", "eval", "compile"))


class _Loads:
    def __init__(self, data: bytes, tree: ast.AST, depth: int = 0):
        self.data = data
        self.starts = _line_starts(data)
        self.depth = depth
        nodes = list(ast.walk(tree))  # iterative: no recursion however deep the source nests
        self.calls = set(LOADER_CALLS)
        self.objects = {n: n for n in LOADER_OBJECTS}  # a LibraryLoader's names -> ctypes' own name
        for _ in range(2):  # aliases of aliases
            self._aliases(nodes)
        loads = [load for node in nodes for load in self._loads(node)]
        execs = [node for node in nodes if depth < MAX_EXEC_DEPTH and isinstance(node, ast.Call) and node.args
                 and (_dotted(node.func) or "").rsplit(".", 1)[-1] in _EXECS]
        # only the names a load or an exec spells are evaluated (and the names their values spell):
        # a module's thousands of other assignments cost nothing
        bound = _bound_values(nodes)
        wanted, frontier = set(), _names_in([expr for _, expr, _ in loads] + [node.args[0] for node in execs])
        while frontier:  # and the names their values spell, and so on
            wanted |= frontier
            frontier = _names_in([v for n in frontier for v in bound.get(n, ())]) - wanted
        self.names: dict[str, list[str]] = {}
        for _ in range(2):  # names bound to names bound to literals
            self.names = self._bindings({n: bound[n] for n in wanted if n in bound})
        self.hits: list[SourceString] = []
        seen: set[tuple] = set()
        for call, expr, line in loads:
            for value in self._values(expr):
                name = _library_name(value, call)
                if name and (call, name, line) not in seen:
                    seen.add((call, name, line))
                    self.hits.append(self._hit(call, name, line))
                    if len(self.hits) > MAX_HITS:
                        return
        for node in execs:
            self._executed(node)
            if len(self.hits) > MAX_HITS:
                return

    def _aliases(self, nodes) -> None:
        """Other names for the loaders: `from ctypes import CDLL as L`, `L = ctypes.CDLL`,
        `L = getattr(ctypes, "CDLL")`."""
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.asname and a.name in self.calls:
                        self.calls.add(a.asname)
                    elif a.asname and a.name in self.objects:
                        self.objects[a.asname] = self.objects[a.name]
            elif isinstance(node, ast.Assign):
                last = self._callee(node.value)
                for t in node.targets:
                    if isinstance(t, ast.Name) and last in self.calls:
                        self.calls.add(t.id)
                    elif isinstance(t, ast.Name) and last in self.objects:
                        self.objects[t.id] = self.objects[last]

    @staticmethod
    def _callee(node) -> str:
        """The last name of what `node` refers to: ctypes.CDLL -> CDLL; getattr(x, "CDLL") -> CDLL."""
        if isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            return node.args[1].value
        return (_dotted(node) or "").rsplit(".", 1)[-1]

    def _executed(self, node: ast.Call) -> None:
        """Code given to exec/eval/compile as a string the source spells: its loads are this
        call's (at its line)."""
        for text in self._values(node.args[0])[:8]:
            code = text.encode("utf-8", "surrogatepass")
            if not may_load(code) or len(code) > MAX_PARSED_BYTES:
                continue
            try:
                inner = _Loads(code, ast.parse(code, mode="eval" if _dotted(node.func) == "eval" else "exec"),
                               self.depth + 1)
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError, UnicodeError):
                continue
            for h in inner.hits:
                self.hits.append(self._hit(f"{_dotted(node.func)}(...): {h.call}", h.text, node.lineno))

    def _bindings(self, bound: dict[str, list[ast.AST]]) -> dict[str, list[str]]:
        """The strings each name may hold, from the expressions bound to it."""
        names: dict[str, list[str]] = {}
        for name, exprs in bound.items():
            got = names.setdefault(name, [])
            for value in exprs:
                got += [v for v in self._values(value) if v not in got][:MAX_VALUES - len(got)]
        return names

    def _loads(self, node):
        """(loader, the expression naming the library, line) for each load `node` is."""
        if isinstance(node, ast.Call):
            last = self._callee(node.func)
            callee = _dotted(node.func) or f"getattr(..., {last!r})"
            if last in self.calls:
                expr = node.args[0] if node.args and not isinstance(node.args[0], ast.Starred) else next(
                    (k.value for k in node.keywords if k.arg in _NAME_KEYWORDS), None)
                if expr is not None:
                    yield f"{callee}()", expr, node.lineno
        elif isinstance(node, ast.Attribute) and node.attr not in _LOADER_METHODS and not node.attr.startswith("_"):
            owner = _dotted(node.value) or ""
            kind = self.objects.get(owner.rsplit(".", 1)[-1])
            if kind:  # windll.cublas64_12: cublas64_12.dll
                dll = "." not in node.attr and kind in ("windll", "oledll")
                yield f"{owner}.{node.attr}", ast.Constant(node.attr + ".dll" if dll else node.attr), node.lineno
        elif isinstance(node, ast.Subscript):
            owner = _dotted(node.value) or ""
            if owner.rsplit(".", 1)[-1] in self.objects:
                yield f"{owner}[...]", node.slice, node.lineno

    def _values(self, node, depth: int = 0) -> list[str]:
        """The strings `node` may evaluate to (fields of templates left empty), at most MAX_VALUES."""
        if depth > MAX_DEPTH:
            return []
        nxt = depth + 1
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return [node.value]
            if isinstance(node.value, bytes):
                return [node.value.decode("latin-1")]
            return []
        if isinstance(node, ast.JoinedStr):
            out = [""]
            for part in node.values:
                piece = self._values(part, nxt) if isinstance(part, ast.Constant) else [""]
                out = list(islice((a + b for a in out for b in piece or [""]), MAX_VALUES))
            return out
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Add):
                left, right = self._values(node.left, nxt), self._values(node.right, nxt)
                return list(islice((a + b for a in left for b in right), MAX_VALUES))
            if isinstance(node.op, ast.Mod):  # "libcudnn.so.%d" % major
                return [_TEMPLATE_FIELD.sub("", v) for v in self._values(node.left, nxt)]
            if isinstance(node.op, ast.Div):  # Path(...) / "libcublas.so.12"
                return self._values(node.right, nxt)
            return []
        if isinstance(node, ast.IfExp):
            return (self._values(node.body, nxt) + self._values(node.orelse, nxt))[:MAX_VALUES]
        if isinstance(node, ast.BoolOp):  # os.environ.get(...) or "libcublas.so.12"
            return [v for n in node.values for v in self._values(n, nxt)][:MAX_VALUES]
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [v for n in node.elts for v in self._values(n, nxt)][:MAX_VALUES]
        if isinstance(node, ast.Name):
            return list(self.names.get(node.id, ()))
        if isinstance(node, ast.Call):
            callee = (_dotted(node.func) or "").rsplit(".", 1)[-1]
            if callee == "format" and isinstance(node.func, ast.Attribute):  # "lib{}.so".format(x)
                return [_TEMPLATE_FIELD.sub("", v) for v in self._values(node.func.value, nxt)]
            if callee in ("join", "Path", "PurePath", "PosixPath", "WindowsPath", "str", "fspath",
                          "abspath", "realpath", "normpath") and node.args:
                return self._values(node.args[-1], nxt)
            return []
        return []

    def _hit(self, call: str, name: str, line: int) -> SourceString:
        offset = self.starts[line - 1] if 0 < line <= len(self.starts) else 0
        return SourceString(section=f"line {line}", offset=offset, text=name, call=call,
                            context=_line_text(self.data, self.starts, line), line=line)


def _by_pattern(data: bytes) -> list[SourceString]:
    """The loads of a source that does not parse: literal first arguments and attribute loaders."""
    text = data.decode("latin-1")  # one character a byte: positions are byte offsets
    starts = _line_starts(data)
    hits: dict[tuple, SourceString] = {}

    def add(call: str, value: str, at: int):
        name = _library_name(value, call)
        if not name:
            return
        line = bisect.bisect_right(starts, at)
        hits.setdefault((call, name, line), SourceString(
            section=f"line {line}", offset=starts[line - 1], text=name, call=call,
            context=_line_text(data, starts, line), line=line))

    for m in _PATTERN_CALL.finditer(text):
        add(m.group(1) + "()", m.group(3), m.start())
        if len(hits) > MAX_HITS:
            break
    for m in _PATTERN_ATTR.finditer(text):
        if m.group(2) and m.group(2) not in _LOADER_METHODS and not m.group(2).startswith("_"):
            attr = m.group(2)
            add(f"{m.group(1)}.{attr}", attr if "." in attr or m.group(1) in ("cdll", "pydll") else attr + ".dll",
                m.start())
        elif m.group(4):
            add(f"{m.group(1)}[...]", m.group(4), m.start())
        if len(hits) > MAX_HITS:
            break
    return list(hits.values())


def stream_may_load(fh, chunk: int = 1 << 20) -> bool:
    """may_load over a stream read in chunks (a token split across two is still seen): memory
    stays bounded however large the file."""
    keep = max(map(len, TOKENS)) - 1
    tail = b""
    while block := fh.read(chunk):
        window = tail + block
        if may_load(window):
            return True
        tail = window[-keep:]
    return False

"""What the ELF reader extracts from one file: the contract between `audit.elf` and `audit.linkage`.

The reader (audit.elf.reader.read_elf) fills these; the linkage stage (resolution, policy,
findings) consumes them and never opens an ELF itself except through the reader.
All strings here are untrusted (they come from binaries): render them escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Symbol:
    name: str
    defined: bool  # False: an import (st_shndx == SHN_UNDEF)
    table: str  # ".dynsym" or ".symtab"
    kind: str  # "FUNC", "OBJECT", ... (st_info.type)
    bind: str  # "GLOBAL", "WEAK", "LOCAL"
    version: str | None = None  # e.g. "GLIBC_2.2.5" from .gnu.version/.gnu.version_r
    version_file: str | None = None  # the file .gnu.version_r names for that version


_new, _set = object.__new__, object.__setattr__


def make_symbol(name, defined, table, kind, bind, version=None, version_file=None) -> Symbol:
    """Symbol(...) without the frozen dataclass's per-field object.__setattr__ calls: the same
    object (equal, hashable, still frozen), built in about 60% of the time."""
    sym = _new(Symbol)
    _set(sym, "__dict__", {"name": name, "defined": defined, "table": table, "kind": kind, "bind": bind,
                           "version": version, "version_file": version_file})
    return sym


class SymbolColumns(Sequence):
    """A list of Symbols kept as columns (one list per field), each Symbol made only when it is
    asked for: a large library keeps ~10^5 symbols, and judging them takes a few whole columns
    (audit.linkage.judging.scan), never the objects. Reads like a list of Symbol (len, index, iterate,
    compare with a list); the columns are the attributes named after Symbol's fields."""

    FIELDS = ("name", "defined", "table", "kind", "bind", "version", "version_file")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, [])
        self.memo: dict = {}  # the consumer's own cache of what it made from these symbols

    def extend(self, **columns) -> None:
        """Append rows: one equally long list per field (version and version_file may be left out)."""
        n = len(columns["name"])
        for f in self.FIELDS:
            col = columns.get(f)
            getattr(self, f).extend([None] * n if col is None else col)

    def __len__(self) -> int:
        return len(self.name)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return make_symbol(*(getattr(self, f)[i] for f in self.FIELDS))

    def __iter__(self):
        return map(make_symbol, *(getattr(self, f) for f in self.FIELDS))

    def __eq__(self, other) -> bool:
        if isinstance(other, (SymbolColumns, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable, like a list)

    def __repr__(self) -> str:
        return f"SymbolColumns({list(self)!r})"


@dataclass(frozen=True)
class VersionNeed:
    file: str  # e.g. "libopenblas.so.0": survives patchelf --remove-needed
    versions: tuple[str, ...]


@dataclass(frozen=True)
class DeviceCode:
    """One embedded device-code entry: an AMDGPU code object or an NVIDIA PTX/cubin."""

    container: str  # "hip_fatbin" (clang offload bundle) or "nv_fatbin"
    section: str  # section it was found in
    offset: int  # file offset of the entry's payload
    size: int
    kind: str  # "amdgcn-code-object" | "cubin" | "ptx" | "host" | "unknown"
    target: str  # "gfx1030", "gfx90a:xnack-", "sm_90", "sm_90a", "compute_90" (PTX) ...
    bundle_id: str | None = None  # e.g. "hipv4-amdgcn-amd-amdhsa--gfx1030"
    compressed: str | None = None  # None, "zlib", "zstd", "lz4"
    kernels: tuple[str, ...] = ()  # kernel names (mangled), where readable
    error: str | None = None  # why this entry could not be fully read (fail closed upstream)


@dataclass(frozen=True)
class Forward:
    """A defined function whose code only passes the call on (a thunk or trampoline), read from
    its first instructions: the code it runs is elsewhere, not a copy inside this file."""

    symbol: str  # the defined name, e.g. "dgemm_"
    target: str  # what it forwards to: an imported name ("scipy_dgemm_"), or the name given to dlsym
    via: str  # "plt" (a PLT entry), "got" (a GOT slot), "dlsym" (a slot the code fills by name at run time; "GetProcAddress" the same in a PE file)
    slot: int  # virtual address of the slot the jump goes through


@dataclass(frozen=True)
class StringHit:
    section: str
    offset: int
    text: str  # a library-name-looking string from read-only data, e.g. "libcublas.so.12"


@dataclass
class ElfInfo:
    path: str
    sha256: str
    size: int
    build_id: str | None
    elf_class: int  # 32 or 64
    machine: str  # "EM_X86_64", "EM_AARCH64", "EM_AMDGPU" ...
    endian: str  # "little" | "big"
    elf_type: str  # "ET_DYN", "ET_EXEC", "ET_REL"
    soname: str | None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)  # DT_RPATH split on ':'
    runpath: list[str] = field(default_factory=list)  # DT_RUNPATH split on ':'
    # libraries ld.so loads with the object that DT_NEEDED does not list, as (tag, name): filter
    # libraries (DT_FILTER, DT_AUXILIARY) and, in a program, audit libraries (DT_AUDIT, DT_DEPAUDIT)
    extra_loads: list[tuple[str, str]] = field(default_factory=list)
    interpreter: str | None = None
    version_needs: list[VersionNeed] = field(default_factory=list)
    # Only symbols worth reporting are kept as Symbol objects (the reader filters in bulk):
    # imports and definitions whose names the caller's patterns select. Counts are of all.
    symbols: Sequence[Symbol] = field(default_factory=list)  # a SymbolColumns from the reader
    symbol_counts: dict[str, int] = field(default_factory=dict)  # {".dynsym": n, ".symtab": m}
    code_loading_imports: list[str] = field(default_factory=list)  # dlopen, hipModuleLoad, nvrtc...
    # Kept symbols that are defined but only forward (audit/elf/forward.py), sorted by name.
    forwarders: list[Forward] = field(default_factory=list)
    library_strings: list[StringHit] = field(default_factory=list)
    # vendor API names as strings (what dlsym is given); read only for an object that imports
    # dlsym/dlvsym, when the caller names the API prefixes to look for
    api_strings: list[StringHit] = field(default_factory=list)
    # whole strings in the data that start with one of the caller's markers (text only a vendor's
    # own code holds: "libblis: %s (line %lu):\n"); read only when the caller names markers
    marker_strings: list[StringHit] = field(default_factory=list)
    device_code: list[DeviceCode] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Library names assembled in code from instruction immediates (audit.elf.immediates), read on
    # demand: the scan reads all code, so the caller asks only where other evidence points to it.
    # None where the file cannot be read again (a member read from memory).
    read_assembled_names: Callable[[], list[StringHit]] | None = field(default=None, repr=False, compare=False)
    # What the file says of itself in its FDO notes (audit.elf.notes): .note.package's object,
    # and the libraries .note.dlopen declares (DlopenDecl)
    package_note: dict | None = None
    dlopen_declared: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(replace(self, symbols=list(self.symbols)))
        d.pop("read_assembled_names")
        if not d["marker_strings"]:  # looked for only at a policy's request: no key where none are kept
            d.pop("marker_strings")
        return d

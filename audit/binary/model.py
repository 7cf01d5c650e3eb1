"""What the PE and Mach-O readers extract from one binary: one model for both formats.

`BinaryInfo` carries the fields the linkage stage judges an `ElfInfo` by, with the same names
and meaning (`needed`, `soname`, `rpath`, `symbols`, `code_loading_imports`, `forwarders`,
`library_strings`, `api_strings`, `device_code`, `warnings`), so `audit.linkage.judging.scan` can judge
it without asking which format it came from. What ELF has no word for is added beside them:
`format`, `imports` (each loaded library with how it is loaded) and `slice` (one architecture of
a Mach-O universal binary). The parts (Symbol, SymbolColumns, StringHit, DeviceCode, Forward)
are the ELF model's own types. All strings are untrusted (they come from binaries).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from audit.elf.model import DeviceCode, Forward, StringHit, Symbol, VersionNeed

# Import.kind: how the loader comes to load the library.
IMPORT = "import"  # PE import directory; Mach-O LC_LOAD_DYLIB
DELAY_LOAD = "delay-load"  # PE delay-load directory (/DELAYLOAD): loaded on first call
BOUND = "bound"  # PE bound-import directory (a module it was bound against, forwarder refs too)
EXPORT_FORWARD = "export-forward"  # PE export forwarded to another DLL ("cublas64_12.cublasSgemm")
WEAK = "weak"  # Mach-O LC_LOAD_WEAK_DYLIB: loaded if present
REEXPORT = "reexport"  # Mach-O LC_REEXPORT_DYLIB: loaded, and its symbols offered as this one's
LAZY = "lazy"  # Mach-O LC_LAZY_LOAD_DYLIB
UPWARD = "upward"  # Mach-O LC_LOAD_UPWARD_DYLIB
DEFAULTLIB = "defaultlib"  # a COFF object's .drectve /DEFAULTLIB:NAME: a library the linker links in
PINVOKE = "pinvoke"  # a managed assembly's P/Invoke (CLI ModuleRef): loaded by the runtime on first call
IMPORT_KINDS = (IMPORT, DELAY_LOAD, BOUND, EXPORT_FORWARD, WEAK, REEXPORT, LAZY, UPWARD, DEFAULTLIB, PINVOKE)


@dataclass(frozen=True)
class Import:
    name: str  # as the binary spells it: "cublas64_12.dll", "@rpath/libcublas.dylib"
    kind: str  # one of IMPORT_KINDS
    where: str  # the directory or load command it was read from: ".idata", "LC_LOAD_WEAK_DYLIB"
    symbols: int = 0  # how many names are imported from it (PE; Mach-O binds)


@dataclass
class BinaryInfo:
    path: str
    sha256: str
    size: int
    format: str  # "pe" | "macho"
    machine: str  # "IMAGE_FILE_MACHINE_AMD64", "CPU_TYPE_ARM64", ...
    bits: int  # 32 or 64
    endian: str  # "little" | "big"
    file_type: str  # "DLL", "EXE"; "MH_DYLIB", "MH_BUNDLE", "MH_EXECUTE", ...
    soname: str | None  # the PE export directory's DLL name; Mach-O LC_ID_DYLIB install name
    slice: str | None = None  # Mach-O universal binary: "arm64 @0x4000"; None for a thin file
    build_id: str | None = None  # Mach-O LC_UUID; PE CodeView GUID+age
    imports: list[Import] = field(default_factory=list)
    # Every library name the binary loads, any kind, first-seen order: what DT_NEEDED means for
    # judging (a delay-loaded or weak library is linked all the same).
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)  # Mach-O LC_RPATH, in order
    runpath: list[str] = field(default_factory=list)  # always empty: kept for ElfInfo's readers
    interpreter: str | None = None  # Mach-O LC_LOAD_DYLINKER
    version_needs: list[VersionNeed] = field(default_factory=list)  # always empty (ELF only)
    # Imports (Symbol.version_file: the library the name is imported from) always; defined names
    # (exports, COFF / nlist symbols) where the caller's pattern selects them. Counts are of all.
    symbols: Sequence[Symbol] = field(default_factory=list)
    symbol_counts: dict[str, int] = field(default_factory=dict)
    code_loading_imports: list[str] = field(default_factory=list)  # LoadLibraryA, GetProcAddress, dlopen...
    # PE forwarded exports (via "export") and exports that call through a pointer GetProcAddress
    # filled with their own name (via "GetProcAddress", audit/pe/stubs.py)
    forwarders: list[Forward] = field(default_factory=list)
    library_strings: list[StringHit] = field(default_factory=list)  # "cudnn64_9.dll", "libcublas.dylib"
    api_strings: list[StringHit] = field(default_factory=list)  # names for GetProcAddress/dlsym
    # whole strings in the data that start with one of the caller's markers (ElfInfo's, the same)
    marker_strings: list[StringHit] = field(default_factory=list)
    device_code: list[DeviceCode] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read_assembled_names: Callable[[], list[StringHit]] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(replace(self, symbols=list(self.symbols)))
        d.pop("read_assembled_names")
        if not d["marker_strings"]:  # looked for only at a policy's request: no key where none are kept
            d.pop("marker_strings")
        return d

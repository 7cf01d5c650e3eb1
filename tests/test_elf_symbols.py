"""The bulk symbol filter against a brute-force oracle: pyelftools lists every symbol and
`pattern.search(name)` decides, one name at a time. Any pattern shape must give the same set."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from elftools.elf.elffile import ELFFile

from audit.elf.reader import read_elf
from elf_fixtures import cuda_libs, host_libs  # noqa: F401 (pytest fixtures)

PATTERNS = [
    rb"cublas", rb"mkl_", rb"^mkl_", rb"tail$", rb"^fk_[a-z]+$", rb"(?i)CUBLAS", rb"\bfk\w*",
    rb"Gemm|helper|^_ZN", rb"(?<![^\x00])(?:mkl_[a-z][^\x00]*|cublas[A-Z][^\x00]*)(?![^\x00])",
    rb"^(?:mkl_(?:tail|local_helper)|cublasFake[A-Z][a-z]*)$", rb"a(?=i)", rb"(?<=x)mkl", rb"^$",
    rb"\Acuda\w*\Z", rb"(?m)^cuda", rb"[^\x00]*Gemm", rb"_ZN\d+cuda", rb"^_ZN(?:3std|9__gnu_cxx)",
]


def oracle(path, pattern: re.Pattern[bytes]) -> Counter:
    kept: Counter = Counter()
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        tables = [s for s in elf.iter_sections() if s["sh_type"] in ("SHT_DYNSYM", "SHT_SYMTAB")]
        has_dynsym = any(s["sh_type"] == "SHT_DYNSYM" for s in tables)
        for sec in tables:
            label = ".dynsym" if sec["sh_type"] == "SHT_DYNSYM" else ".symtab"
            imports = label == ".dynsym" or not has_dynsym
            for i, sym in enumerate(sec.iter_symbols()):
                undefined = sym["st_shndx"] == "SHN_UNDEF"
                if i and ((imports and undefined and sym.name) or pattern.search(sym.name.encode())):
                    kept[(label, sym.name, not undefined)] += 1
    return kept


def ours(path, pattern) -> Counter:
    return Counter((s.table, s.name, s.defined) for s in read_elf(path, pattern).symbols)


@pytest.mark.parametrize("source", [rb"%s" % p for p in PATTERNS], ids=[p.decode("latin-1") for p in PATTERNS])
def test_gcc_library_matches_oracle(host_libs, source):
    pattern = re.compile(source)
    for key in ("main", "object"):
        assert ours(host_libs[key], pattern) == oracle(host_libs[key], pattern)


def test_cuda_library_matches_oracle(cuda_libs):
    # nvcc's static cudart gives thousands of C++ names in .symtab
    for source in PATTERNS:
        pattern = re.compile(source)
        assert ours(cuda_libs["sm90"], pattern) == oracle(cuda_libs["sm90"], pattern), source


def test_default_policy_pattern_matches_oracle(host_libs, cuda_libs):
    from audit.linkage.judging.policy import load_policy

    pattern = load_policy(None).symbol_pattern
    for path in (host_libs["main"], cuda_libs["sm90"]):
        assert ours(path, pattern) == oracle(path, pattern)
    assert any(name == "cublasFakeGemm" for _t, name, _d in ours(host_libs["main"], pattern))


def test_fast_symbol_is_a_real_symbol():
    import dataclasses

    from audit.elf.model import Symbol, make_symbol

    args = ("dlopen", False, ".dynsym", "FUNC", "GLOBAL", "GLIBC_2.34", "libc.so.6")
    fast, slow = make_symbol(*args), Symbol(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    try:
        fast.name = "other"
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a Symbol must stay frozen")


def test_symbol_columns_read_as_a_list_of_symbols(host_libs):
    """The reader keeps symbols as columns (SymbolColumns); read as a list, they are the Symbols
    a plain list would hold: same order, fields, equality and JSON form."""
    import dataclasses

    from audit.elf.model import Symbol, SymbolColumns

    info = read_elf(host_libs["main"], re.compile(rb"cublas|fk_"))
    cols = info.symbols
    assert isinstance(cols, SymbolColumns) and len(cols) > 3
    plain = [Symbol(*(getattr(cols, f)[i] for f in SymbolColumns.FIELDS)) for i in range(len(cols))]
    assert list(cols) == plain and cols == plain and plain == list(cols)
    assert cols[1] == plain[1] and cols[-1] == plain[-1] and cols[1:3] == plain[1:3]
    assert cols != plain[:-1] and cols != plain[:-1] + [dataclasses.replace(plain[-1], name="other")]
    assert info.to_dict()["symbols"] == [dataclasses.asdict(s) for s in plain]
    assert {s.table for s in cols} == {".dynsym", ".symtab"} and any(s.version for s in cols)

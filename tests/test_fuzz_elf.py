"""Bounded fuzzing: mutations of real ELF files give an ElfInfo or an InputError, nothing else.

Mutations favour the places a parser trusts (the ELF header, the section and program header
tables, the dynamic section, symbol tables, device-code sections) as well as random bytes and
truncation. ~200 examples per base file, each with a deadline, so the suite stays fast.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from elftools.elf.elffile import ELFFile

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis drives the fuzz test (test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from audit.elf.model import ElfInfo  # noqa: E402
from audit.elf.reader import read_elf  # noqa: E402
from audit.errors import InputError  # noqa: E402
from elf_fixtures import cuda_libs, hip_libs, host_libs  # noqa: E402,F401

WIDTHS = {1: "B", 2: "H", 4: "I", 8: "Q"}
EXTREMES = [0, 1, 2, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]


def hot_regions(data: bytes, path) -> list[tuple[int, int]]:
    """(start, end) byte ranges a parser reads headers from, located with pyelftools."""
    regions = [(0, 64)]
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        h = elf.header
        regions.append((h.e_shoff, h.e_shoff + h.e_shnum * h.e_shentsize))
        regions.append((h.e_phoff, h.e_phoff + h.e_phnum * h.e_phentsize))
        for sec in elf.iter_sections():
            if sec.name in (".dynamic", ".dynsym", ".gnu.version_r", ".gnu.version_d", ".note.gnu.build-id",
                            ".hip_fatbin", ".nv_fatbin", ".dynstr"):
                regions.append((sec["sh_offset"], sec["sh_offset"] + min(sec["sh_size"], 4096)))
    return [(a, min(b, len(data))) for a, b in regions if a < min(b, len(data))]


@st.composite
def mutation(draw, data: bytes, regions):
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        start, end = draw(st.sampled_from(regions)) if draw(st.booleans()) else (0, len(data))
        width = draw(st.sampled_from([1, 2, 4, 8]))
        if end - start < width:
            continue
        at = draw(st.integers(start, end - width))
        if draw(st.booleans()):
            value = draw(st.sampled_from(EXTREMES)) & ((1 << (8 * width)) - 1)
        else:
            value = draw(st.integers(0, (1 << (8 * width)) - 1))
        out[at:at + width] = value.to_bytes(width, "little")
    if draw(st.integers(0, 9)) == 0:
        out = out[:draw(st.integers(0, len(out)))]
    return bytes(out)


def fuzz(base_path, tmp_path_factory, examples: int):
    data = base_path.read_bytes()
    regions = hot_regions(data, base_path)
    target = tmp_path_factory.mktemp("fuzz") / "mutant.so"
    started = time.monotonic()

    @settings(max_examples=examples, deadline=timedelta(seconds=5), derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(mutation(data, regions))
    def check(mutant):
        target.write_bytes(mutant)
        try:
            info = read_elf(target)
        except InputError as exc:
            assert "\n" not in exc.message and str(target) in exc.message
        else:
            assert isinstance(info, ElfInfo)
            info.to_dict()  # the result must also serialise

    check()
    assert time.monotonic() - started < 120


def test_fuzz_gcc_shared_object(host_libs, tmp_path_factory):
    fuzz(host_libs["main"], tmp_path_factory, 200)


def test_fuzz_gcc_relocatable_object(host_libs, tmp_path_factory):
    fuzz(host_libs["object"], tmp_path_factory, 100)


def test_fuzz_hip_offload_bundles(hip_libs, tmp_path_factory):
    fuzz(hip_libs["both"], tmp_path_factory, 150)


def test_fuzz_cuda_fatbin(cuda_libs, tmp_path_factory):
    fuzz(cuda_libs["sm90"], tmp_path_factory, 100)

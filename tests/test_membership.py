"""audit.elf.membership against numpy's own np.isin, on fresh random values each run."""

from __future__ import annotations

import numpy as np
import pytest

from audit.elf.membership import in_sorted, isin


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.int64])
def test_isin_agrees_with_numpy(dtype):
    rng = np.random.default_rng()
    values = rng.integers(0, 1000, size=5000).astype(dtype)
    for n in (1, 7, 300, 3000):  # wanted below, inside and past the values' range, with repeats
        wanted = rng.integers(0, 1200, size=n).astype(dtype)
        assert np.array_equal(isin(values, wanted), np.isin(values, wanted))
        assert np.array_equal(isin(values, wanted.tolist()), np.isin(values, wanted))
        assert np.array_equal(in_sorted(values, np.sort(wanted)), np.isin(values, wanted))


def test_nothing_wanted_finds_nothing():
    values = np.arange(10, dtype=np.uint32)
    assert not isin(values, []).any() and isin(values, []).shape == values.shape
    assert not in_sorted(values, np.zeros(0, dtype=np.uint32)).any()

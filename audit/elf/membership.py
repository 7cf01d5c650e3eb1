"""Membership of numpy values in a set of wanted ones, by binary search in the sorted set.

np.isin sorts a long wanted list through np.unique, which imports numpy.ma (~7-13 ms, paid in
every run that reads symbols); a sorted array and np.searchsorted answer the same question.
"""

from __future__ import annotations

import numpy as np


def in_sorted(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values[i] in wanted, for each i; `wanted` sorted ascending (duplicates allowed)."""
    if not len(wanted):
        return np.zeros(values.shape, dtype=bool)
    k = np.searchsorted(wanted, values)
    np.minimum(k, len(wanted) - 1, out=k)
    return wanted[k] == values


def isin(values: np.ndarray, wanted) -> np.ndarray:
    """np.isin(values, wanted), `wanted` in any order (a list or an array)."""
    return in_sorted(values, np.sort(np.asarray(wanted, dtype=values.dtype)))

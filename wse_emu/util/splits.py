"""Balanced integer splits, shared by the compiler (tiling) and the kernels (expansion)."""

from __future__ import annotations

import numpy as np


def even_split(total: int, parts: int) -> np.ndarray:
    """Sizes of ``parts`` contiguous pieces of ``total``; they differ by at most one."""
    bounds = (np.arange(parts + 1, dtype=np.int64) * total) // parts
    return np.diff(bounds)


def even_splits(totals, parts: int) -> np.ndarray:
    """``even_split`` of each of ``totals`` into ``parts``, as rows of one array."""
    totals = np.asarray(totals, dtype=np.int64)
    bounds = (np.arange(parts + 1, dtype=np.int64)[None, :] * totals[:, None]) // parts
    return np.diff(bounds, axis=1)

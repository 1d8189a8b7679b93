"""Per-PE bytes of a matrix tiled over a kernel's PE grid, and of a vector split over a line
(``compiler.tiling`` describes the tiling; the kernel patterns plan their SRAM with these)."""

from __future__ import annotations

import numpy as np

from wse_emu.util.splits import even_split


def block_bytes(k: int, n: int, cols: int, rows: int, layers: int,
                bytes_per_weight: float) -> np.ndarray:
    """Per-PE weight bytes, shape (rows, cols): whole bytes, as a packed format (MXFP4's
    4.25 bits) rounds a block up."""
    kc = even_split(k, cols)
    nr = even_split(n, rows)
    return np.ceil(np.outer(nr, kc) * (layers * bytes_per_weight)).astype(np.int64)


def vector_bytes(length: int, rows: int, layers: int, dtype_bytes: int) -> np.ndarray:
    """Per-PE bytes of a vector split over ``rows`` PEs of one column, shape (rows,)."""
    return even_split(length, rows) * (layers * dtype_bytes)

"""2-D tiling of weight matrices over a kernel's PE grid, and the per-PE bytes it implies.

A matrix kernel of K x N on a grid of C columns x R rows: column i owns inputs K_i, row j owns
outputs N_j (balanced splits, sizes differing by at most one), so PE (i, j) owns the block
K_i x N_j of every layer in its stage. Every element has exactly one owner by construction;
``ownership_check`` verifies it from the split arrays.
"""

from __future__ import annotations

import numpy as np

from compiler.geometry import even_split


def block_bytes(k: int, n: int, cols: int, rows: int, layers: int, dtype_bytes: int) -> np.ndarray:
    """Per-PE weight bytes, shape (rows, cols)."""
    kc = even_split(k, cols)
    nr = even_split(n, rows)
    return np.outer(nr, kc) * (layers * dtype_bytes)


def vector_bytes(length: int, rows: int, layers: int, dtype_bytes: int) -> np.ndarray:
    """Per-PE bytes of a vector split over ``rows`` PEs of one column, shape (rows,)."""
    return even_split(length, rows) * (layers * dtype_bytes)


def min_cross_extent(k: int, n: int, layers: int, dtype_bytes: int, fixed: int,
                     fixed_axis: str, budget: int) -> int | None:
    """The fewest columns (``fixed_axis='rows'``: R = fixed) or rows (``'cols'``: C = fixed)
    such that the largest block fits in ``budget`` bytes; None if no extent does."""
    if fixed_axis == "rows":
        per_element = -(-n // fixed) * layers * dtype_bytes  # one input element's column slice
        q = budget // per_element
        return None if q == 0 else -(-k // q)
    per_element = -(-k // fixed) * layers * dtype_bytes
    q = budget // per_element
    return None if q == 0 else -(-n // q)


def ownership_check(k: int, n: int, k_parts: int, n_parts: int) -> bool:
    """The grid's row and column ranges partition K x N: consecutive, non-empty where the
    matrix has elements to give, covering 0..K and 0..N, so each element has one owner."""
    kc = even_split(k, k_parts)
    nr = even_split(n, n_parts)
    for sizes, total, parts in ((kc, k, k_parts), (nr, n, n_parts)):
        if sizes.sum() != total or (sizes < 0).any():
            return False
        if (sizes == 0).sum() != max(0, parts - total):
            return False
    return True

"""2-D tiling of weight matrices over a kernel's PE grid, and the per-PE bytes it implies.

A matrix kernel of K x N on a grid of C columns x R rows: column i owns inputs K_i, row j owns
outputs N_j (balanced splits, sizes differing by at most one), so PE (i, j) owns the block
K_i x N_j of every layer in its stage. Every element has exactly one owner by construction;
``ownership_check`` verifies it from the split arrays.
"""

from __future__ import annotations

import numpy as np

from compiler.geometry import even_split


def max_block(k: int, n: int, cols: int, rows: int) -> int:
    """Elements of the largest block on a cols x rows grid."""
    return -(-k // cols) * -(-n // rows)


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


def ownership_check(k: int, n: int, cols: int, rows: int) -> bool:
    """Every element of K x N is owned by exactly one PE of the grid."""
    kc = even_split(k, cols)
    nr = even_split(n, rows)
    return bool((kc >= 0).all() and (nr >= 0).all() and kc.sum() == k and nr.sum() == n
                and int(np.outer(nr, kc).sum()) == k * n)

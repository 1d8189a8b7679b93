"""2-D tiling of weight matrices over a kernel's PE grid, and the per-PE bytes it implies.

A matrix kernel of K x N on a grid of C columns x R rows: column i owns inputs K_i, row j owns
outputs N_j (balanced splits, sizes differing by at most one), so PE (i, j) owns the block
K_i x N_j of every layer in its stage. Every element has exactly one owner by construction;
``ownership_check`` verifies it from the split arrays.
"""

from __future__ import annotations

import math

from wse_emu.compiler.geometry import even_split
from wse_emu.kernels.blocks import block_bytes, vector_bytes  # noqa: F401 (re-exported)


def min_cross_extent(k: int, n: int, layers: int, bytes_per_weight: float, fixed: int,
                     fixed_axis: str, budget: int) -> int | None:
    """The fewest columns (``fixed_axis='rows'``: R = fixed) or rows (``'cols'``: C = fixed)
    such that the largest block fits in ``budget`` bytes; None if no extent does."""
    if fixed_axis == "rows":
        slice_, other = -(-n // fixed), k  # one input element's column slice
    else:
        slice_, other = -(-k // fixed), n
    per_element = slice_ * layers * bytes_per_weight
    q = int(budget // per_element)
    # A packed format rounds each block up to whole bytes.
    while q and math.ceil(q * per_element) > budget:
        q -= 1
    return None if q == 0 else -(-other // q)


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

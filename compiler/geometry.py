"""Small integer-geometry helpers shared by the partitioner, the stage layout and the tiler."""

from __future__ import annotations

import numpy as np

from wse_emu.util.splits import even_split  # noqa: F401  (re-exported for the compiler)


def proportional_split(total: int, weights, minimum=None) -> np.ndarray:
    """Integer sizes summing to ``total``, proportional to ``weights`` (largest remainder),
    each at least ``minimum`` (an int or a per-piece array). Raises ValueError if the minimums
    do not fit."""
    weights = np.asarray(weights, dtype=float)
    n = len(weights)
    mins = np.broadcast_to(np.asarray(0 if minimum is None else minimum, dtype=np.int64), (n,))
    mins = mins.copy()
    if mins.sum() > total:
        raise ValueError("minimum sizes exceed the total")
    sizes = mins.copy()
    # Hand out what is left to pieces whose proportional share exceeds their minimum, so
    # pieces held at their minimum do not also take a proportional share.
    free = np.ones(n, dtype=bool)
    for _ in range(n + 1):
        share = weights * free
        if share.sum() <= 0:
            break
        budget = total - mins[~free].sum()
        ideal = budget * share / share.sum()
        newly_pinned = free & (ideal < mins)
        if not newly_pinned.any():
            base = np.maximum(np.floor(ideal).astype(np.int64), mins) * free + mins * ~free
            remainder = total - base.sum()
            if remainder > 0:
                frac = np.where(free, ideal - np.floor(ideal), -1.0)
                order = np.argsort(-frac, kind="stable")[:remainder]
                base[order] += 1
            sizes = base
            break
        free &= ~newly_pinned
    else:  # pragma: no cover - the loop pins at least one piece per round
        raise AssertionError("proportional_split did not converge")
    if sizes.sum() != total:
        # Every piece pinned at its minimum: give the rest to the largest weight.
        sizes[int(np.argmax(weights))] += total - sizes.sum()
    return sizes


def grid_shape(count: int, width: int, height: int) -> tuple[int, int]:
    """The (columns, rows) grid of at most ``count`` cells over width x height whose cells are
    closest to square, preferring more cells."""
    best = (1, 1)
    best_key = None
    for gx in range(1, min(count, width) + 1):
        gy = min(count // gx, height)
        if gy < 1:
            continue
        cell_aspect = (width / gx) / (height / gy)
        key = (gx * gy, -abs(np.log(cell_aspect)))
        if best_key is None or key > best_key:
            best, best_key = (gx, gy), key
    return best

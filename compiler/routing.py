"""Routes and colors.

Every route is a static color route with a footprint: the rectangle of PEs whose routers it
configures (for a transfer, the bounding box of its source and destination, which holds every
dimension-ordered path between them). Two routes whose footprints share a PE need different
colors there. Colors are given greedily (largest footprint first, smallest free color), within
the fabric's budget of routable colors minus those the runtime reserves.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import CompileError
from wse_emu.fabric import FabricSpec
from wse_emu.program import Rect, Route


def assign_colors(routes: list[Route], fabric: FabricSpec, describe) -> int:
    """Set ``route.color`` for every route; returns the number of colors used. ``describe``
    names a route's place for the error message when colors run out."""
    budget = fabric.colors_available
    if not routes:
        return 0
    fp = np.array([r.footprint.to_list() for r in routes], dtype=np.int64)
    sys_, x0, y0 = fp[:, 0], fp[:, 1], fp[:, 2]
    x1, y1 = x0 + fp[:, 3], y0 + fp[:, 4]
    order = np.lexsort((np.arange(len(routes)), -(fp[:, 3] * fp[:, 4])))
    colors = np.full(len(routes), -1, dtype=np.int64)
    used = 0
    for i in order:
        overlap = ((sys_ == sys_[i]) & (x0 < x1[i]) & (x0[i] < x1) & (y0 < y1[i]) & (y0[i] < y1)
                   & (colors >= 0))
        taken = np.zeros(budget + 1, dtype=bool)
        neighbour_colors = colors[overlap]
        taken[neighbour_colors[neighbour_colors <= budget]] = True
        free = np.flatnonzero(~taken)
        color = int(free[0])
        if color >= budget:
            raise CompileError(
                f"colors run out: {describe(routes[i])} needs a color beyond the "
                f"{budget} that {fabric.name} allows ({fabric.colors_total} total - "
                f"{fabric.colors_reserved} reserved); use fewer layers per stage or a "
                f"larger region")
        colors[i] = color
        used = max(used, color + 1)
    for route, color in zip(routes, colors):
        route.color = int(color)
    return used


def color_masks(routes: list[Route], shape: tuple[int, int, int]) -> np.ndarray:
    """Per-PE bit mask of the colors whose routes configure that PE's router."""
    masks = np.zeros(shape, dtype=np.uint32)
    for r in routes:
        masks[r.footprint.slices()] |= np.uint32(1 << r.color)
    return masks


def popcount(masks: np.ndarray) -> np.ndarray:
    counts = np.zeros(masks.shape, dtype=np.int32)
    m = masks.copy()
    while m.any():
        counts += (m & 1).astype(np.int32)
        m >>= 1
    return counts


def manhattan(a: Rect, b: Rect) -> int:
    (ax, ay), (bx, by) = a.center(), b.center()
    return int(round(abs(ax - bx) + abs(ay - by)))

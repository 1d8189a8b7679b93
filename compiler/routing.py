"""Routes and colors.

Every route is a static color route with a footprint: the rectangle of PEs whose routers it
configures (for a transfer, the bounding box of its source and destination, which holds every
dimension-ordered path between them). Two routes whose footprints share a PE need different
colors there. Colors are given greedily, within the fabric's budget of routable colors minus
those the runtime reserves.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import CompileError
from wse_emu.hardware.fabric import FabricSpec
from wse_emu.program.format import Rect, Route


class ColorsExhausted(CompileError):
    """More colors are needed than the fabric leaves (fewer, larger stages may fit)."""


def assign_colors(routes: list[Route], fabric: FabricSpec, describe, held_back: int = 0) -> int:
    """Set ``route.color`` for every route; returns the number of colors used.

    Greedy coloring is tried in a few orders (largest footprint first; sweeping along x; along
    y) and the one needing the fewest colors wins. ``held_back`` colors stay free for routes
    added later (the KV handoff); ``describe`` names a route for the error message."""
    budget = fabric.colors_available - held_back
    if not routes:
        return 0
    fp = np.array([r.footprint.to_list() for r in routes], dtype=np.int64)
    area = fp[:, 3] * fp[:, 4]
    idx = np.arange(len(routes))
    orders = [np.lexsort((idx, -area)), np.lexsort((idx, -area, fp[:, 1], fp[:, 0])),
              np.lexsort((idx, -area, fp[:, 2], fp[:, 0]))]
    best, neighbours = None, _neighbours(fp)
    for order in orders:
        colors = _greedy(neighbours, order)
        if best is None or colors.max() < best.max():
            best = colors
    if best.max() >= budget:
        worst = int(np.argmax(best))
        raise ColorsExhausted(
            f"colors run out: the routes around {describe(routes[worst])} need "
            f"{int(best.max()) + 1} colors where {fabric.name} leaves {budget} "
            f"({fabric.colors_total} total - "
            f"{fabric.colors_reserved} reserved by the runtime"
            + (f" - {held_back} for the KV handoff" if held_back else "")
            + "); use more layers per stage or a larger region")
    for route, color in zip(routes, best):
        route.color = int(color)
    return int(best.max()) + 1


def crowding(routes: list[Route], area: Rect) -> tuple[int, int, int]:
    """The most routes whose footprints hold one PE of ``area``, and that PE's column and row:
    routes sharing a PE each need a color of their own, so no coloring of the routes (and of
    any routes added to them) uses fewer colors than this. Counted from the corners of each
    footprint's part inside ``area``, summed along both axes."""
    fp = np.array([r.footprint.to_list() for r in routes if r.footprint.overlaps(area)],
                  dtype=np.int64).reshape(-1, 5)
    if not len(fp):
        return 0, area.x, area.y
    x0 = np.maximum(fp[:, 1], area.x) - area.x
    y0 = np.maximum(fp[:, 2], area.y) - area.y
    x1 = np.minimum(fp[:, 1] + fp[:, 3], area.x1) - area.x
    y1 = np.minimum(fp[:, 2] + fp[:, 4], area.y1) - area.y
    corners = np.zeros((area.h + 1, area.w + 1), dtype=np.int64)
    np.add.at(corners, (y0, x0), 1)
    np.add.at(corners, (y0, x1), -1)
    np.add.at(corners, (y1, x0), -1)
    np.add.at(corners, (y1, x1), 1)
    held = corners.cumsum(axis=0).cumsum(axis=1)
    y, x = np.unravel_index(int(np.argmax(held)), held.shape)
    return int(held[y, x]), area.x + int(x), area.y + int(y)


NEIGHBOUR_ROWS = 512  # routes compared with all the others at once (memory: rows x routes)


def _neighbours(fp: np.ndarray) -> list[list[int]]:
    """Per route, the routes whose footprints share a PE with its own."""
    s, x0, y0 = fp[:, 0], fp[:, 1], fp[:, 2]
    x1, y1 = x0 + fp[:, 3], y0 + fp[:, 4]
    out = []
    for lo in range(0, len(fp), NEIGHBOUR_ROWS):
        rows = slice(lo, lo + NEIGHBOUR_ROWS)
        overlap = ((s[rows, None] == s[None, :]) & (x0[rows, None] < x1[None, :])
                   & (x0[None, :] < x1[rows, None]) & (y0[rows, None] < y1[None, :])
                   & (y0[None, :] < y1[rows, None]))
        for i, row in enumerate(overlap, start=lo):
            row[i] = False
            out.append(np.flatnonzero(row).tolist())
    return out


def _greedy(neighbours: list[list[int]], order: np.ndarray) -> np.ndarray:
    """Smallest free color for each route in ``order``, given its neighbours'."""
    colors = [-1] * len(neighbours)
    for i in order.tolist():
        used = {colors[j] for j in neighbours[i]}
        color = 0
        while color in used:
            color += 1
        colors[i] = color
    return np.array(colors, dtype=np.int64)


def check_colors(routes: list[Route]) -> None:
    """Routes whose footprints share a PE never share a color (raises AssertionError)."""
    if not routes:
        return
    fp = np.array([r.footprint.to_list() for r in routes], dtype=np.int64)
    colors = np.array([r.color for r in routes], dtype=np.int64)
    x0, y0, x1, y1 = fp[:, 1], fp[:, 2], fp[:, 1] + fp[:, 3], fp[:, 2] + fp[:, 4]
    for i in range(len(routes)):
        clash = ((fp[:, 0] == fp[i, 0]) & (x0 < x1[i]) & (x0[i] < x1) & (y0 < y1[i])
                 & (y0[i] < y1) & (colors == colors[i]))
        clash[i] = False
        if clash.any() or colors[i] < 0:
            other = int(np.flatnonzero(clash)[0]) if clash.any() else i
            raise AssertionError(f"routes {routes[i].name} and {routes[other].name} share "
                                 f"color {colors[i]} on overlapping PEs")


def color_masks(routes: list[Route], shape: tuple[int, int, int]) -> np.ndarray:
    """Per-PE bit mask of the colors whose routes configure that PE's router."""
    masks = np.zeros(shape, dtype=np.uint32)
    for r in routes:
        masks[r.footprint.slices()] |= np.uint32(1 << r.color)
    return masks


# Set bits of every byte value.
_BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], dtype=np.int32)


def popcount(masks: np.ndarray) -> np.ndarray:
    """Set bits of each 32-bit mask: its four bytes' counts looked up and added (four passes
    over the masks, where shifting bit by bit took five per color)."""
    masks = np.ascontiguousarray(masks, dtype=np.uint32)
    b = masks.view(np.uint8).reshape(*masks.shape, 4)
    return (_BYTE_BITS[b[..., 0]] + _BYTE_BITS[b[..., 1]]) + \
        (_BYTE_BITS[b[..., 2]] + _BYTE_BITS[b[..., 3]])


def manhattan(a: Rect, b: Rect) -> int:
    (ax, ay), (bx, by) = a.center(), b.center()
    return int(round(abs(ax - bx) + abs(ay - by)))

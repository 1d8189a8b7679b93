"""Drawing per-PE arrays as figures, exactly: whole-number pixel scaling, no resampling.

Colour maps are chosen to read in grey and for colour-blind readers: ``cividis`` for quantities
(lightness rises with the value), the Okabe-Ito palette for categories and for numbered levels
such as pipeline stages (cycled, no two neighbours alike: a continuous scale makes stage 12 and
stage 13 nearly the same colour). PEs a map says nothing about are light grey.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
matplotlib.rcParams["svg.hashsalt"] = "wse-emu"  # SVG ids the same from run to run

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap, Normalize  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from wse_emu.util.atomic import replacing_path  # noqa: E402
from wse_emu.visualize.style import (  # noqa: E402
    LABEL_ROOM_PT,
    SMALL_PT,
    distinct_colours,
    number_formatter,
    styled,
)

DPI = 100
MIN_SIDE_PX = 480  # small meshes are scaled up so that a map is at least this big
# Pixels around the map: room for 10 pt tick labels, the colour bar and its labels.
MARGIN = {"left": 80, "right": 160, "top": 50, "bottom": 55}
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
             "#000000")
MISSING = "#d9d9d9"
# Levels (stages) take the categories' colours without black, which outlines and labels use.
LEVEL_PALETTE = OKABE_ITO[:-1]


def save_figure(fig, path: Path, formats=("png",)) -> list[Path]:
    """Write ``fig`` as ``path`` in every format (no timestamps, so the same run draws the same
    files) and close it."""
    written = []
    try:
        for fmt in formats:
            out = path.with_suffix(f".{fmt}")
            # (matplotlib opens the file itself: it is given a path of the same name)
            with replacing_path(out) as partial:
                fig.savefig(partial, format=fmt, dpi=DPI,
                            metadata={"Date": None} if fmt == "svg" else None)
            written.append(out)
    finally:
        plt.close(fig)  # a figure left open when the disk is full would pile up
    return written


def scale_for(height: int, width: int) -> int:
    """Whole pixels per PE: 1 for a wafer, more for a small mesh."""
    return max(1, MIN_SIDE_PX // max(height, width))


def quantity_cmap():
    return matplotlib.colormaps["cividis"].with_extremes(bad=MISSING)


def category_cmap(n: int):
    return ListedColormap(OKABE_ITO[:n]).with_extremes(bad=MISSING)


def pixels(array: np.ndarray, cmap, vmin: float, vmax: float) -> np.ndarray:
    """The RGBA image of ``array``, one pixel per PE: what the map shows, before any scaling."""
    norm = Normalize(vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1)
    return cmap(norm(np.ma.masked_invalid(array)), bytes=True)


@dataclass(frozen=True)
class MapLook:
    """How a map's values look: a colour map and its range (``cmap``, ``vmin``, ``vmax``; by
    default a quantity's scale over the finite values), or a legend of ``categories``, or
    ``levels`` distinct colours for the integers 0 .. levels - 1 (such as pipeline stages, no
    two touching levels alike); ``names`` ``(x, y, w, h, text)`` written inside their
    rectangles where they fit; ``ticks`` formatting a quantity's colour bar (``fmt.number``
    by default)."""

    cmap: object = None
    vmin: float | None = None
    vmax: float | None = None
    categories: tuple | None = None
    levels: int | None = None
    names: tuple = ()
    ticks: object = None


@styled
def map_figure(array: np.ndarray, title: str, label: str, path: Path, formats=("png",),
               outlines=(), look: MapLook = MapLook()) -> list[Path]:
    """Draw ``array`` (height x width) as ``look`` says, with a colour bar or a legend and
    region outlines ``(x, y, w, h, label)``. Writes ``path`` in every format and the exact
    one-pixel-per-PE image as ``<path>.pixels.png``. Returns the files written."""
    cmap, vmin, vmax, categories, levels, names, ticks = (
        look.cmap, look.vmin, look.vmax, look.categories, look.levels, look.names, look.ticks)
    height, width = array.shape
    finite = array[np.isfinite(array)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if categories is not None:
        cmap, vmin, vmax = category_cmap(len(categories)), -0.5, len(categories) - 0.5
    elif levels is not None:
        cmap, vmin, vmax = level_cmap(array, levels), -0.5, levels - 0.5
    cmap = cmap or quantity_cmap()
    image = pixels(array, cmap, vmin, vmax)
    k = scale_for(height, width)
    big = np.repeat(np.repeat(image, k, axis=0), k, axis=1)
    fig_w = (width * k + MARGIN["left"] + MARGIN["right"]) / DPI
    fig_h = (height * k + MARGIN["top"] + MARGIN["bottom"]) / DPI
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=DPI)
    ax = fig.add_axes([MARGIN["left"] / DPI / fig_w, MARGIN["bottom"] / DPI / fig_h,
                       width * k / DPI / fig_w, height * k / DPI / fig_h])
    # extent in PE units; the image has exactly as many pixels as the axes.
    ax.imshow(big, interpolation="nearest", extent=(0, width, height, 0), aspect="auto")
    ax.set_title(title)
    ax.set_xlabel("PE column")
    ax.set_ylabel("PE row")
    _name_rectangles(ax, names, k, image)
    for x, y, w, h, text in outlines:
        ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor="#cc0000", linewidth=1.2))
        ax.text(x + 1, y + 1, text, color="white", fontsize=SMALL_PT, va="top",
                bbox={"facecolor": "black", "alpha": 0.6, "pad": 1, "linewidth": 0})
    cax = fig.add_axes([(MARGIN["left"] + width * k + 15) / DPI / fig_w,
                        MARGIN["bottom"] / DPI / fig_h, 12 / DPI / fig_w,
                        height * k / DPI / fig_h])
    _colour_bar(fig, cax, cmap, vmin, vmax, label, categories, levels, ticks)
    written = save_figure(fig, path, formats)
    raw = path.with_suffix(".pixels.png")
    with replacing_path(raw) as partial:
        plt.imsave(partial, image, format="png")
    written.append(raw)
    return written


def level_cmap(array: np.ndarray, levels: int) -> ListedColormap:
    """One colour per level 0 .. levels - 1 of ``array``, from the categories' palette cycled,
    no two consecutive or touching levels alike (``style.distinct_colours``)."""
    colours = distinct_colours(array, LEVEL_PALETTE, levels)
    return ListedColormap(colours).with_extremes(bad=MISSING)


def _colour_bar(fig, cax, cmap, vmin, vmax, label, categories, levels, ticks) -> None:
    """A colour bar: one swatch per category or level, named (levels thinned to the labels the
    bar has room for), or a quantity's scale with its ticks written as ``ticks`` does."""
    bar = fig.colorbar(plt.cm.ScalarMappable(Normalize(vmin, vmax), cmap), cax=cax)
    if categories is not None:
        bar.set_ticks(range(len(categories)))
        bar.set_ticklabels(categories)
    elif levels is not None:
        room = max(2, int(cax.bbox.height * 72 / DPI // LABEL_ROOM_PT["y"]))
        marks = MaxNLocator(nbins=room, integer=True, min_n_ticks=1).tick_values(0, levels - 1)
        bar.set_ticks(marks[(marks >= 0) & (marks <= levels - 1)])
        bar.ax.yaxis.set_major_formatter(number_formatter())
    else:
        bar.ax.yaxis.set_major_formatter(ticks or number_formatter())
    bar.ax.minorticks_off()
    bar.set_label(label)


def _name_rectangles(ax, names, k: int, image: np.ndarray) -> None:
    """Write each ``(x, y, w, h, text)`` at its rectangle's centre if the text fits inside, in
    black or white, whichever reads on the colour there."""
    for x, y, w, h, text in names:
        if w * k < 9 * len(text) + 6 or h * k < 18:
            continue
        r, g, b = image[min(y + h // 2, image.shape[0] - 1),
                        min(x + w // 2, image.shape[1] - 1), :3] / 255
        light = 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=SMALL_PT,
                color="black" if light else "white")


@styled
def regions_figure(array: np.ndarray, title: str, label: str, path: Path, parts,
                   formats=("png",), cmap=None, vmin: float | None = None,
                   vmax: float | None = None, ticks=None) -> list[Path]:
    """``array`` cropped to each region part ``(x, y, w, h, label)``, side by side on one colour
    scale, every crop scaled by the same whole factor (no resampling)."""
    crops = [(array[y:y + h, x:x + w], text) for x, y, w, h, text in parts]
    finite = np.concatenate([c[np.isfinite(c)] for c, _ in crops]) if crops else np.zeros(0)
    vmin = vmin if vmin is not None else (float(finite.min()) if finite.size else 0.0)
    vmax = vmax if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    cmap = cmap or quantity_cmap()
    k = scale_for(max(c.shape[0] for c, _ in crops), sum(c.shape[1] for c, _ in crops))
    gap = 70
    width_px = sum(c.shape[1] * k for c, _ in crops) + gap * (len(crops) - 1)
    height_px = max(c.shape[0] * k for c, _ in crops)
    fig_w = (width_px + MARGIN["left"] + MARGIN["right"]) / DPI
    fig_h = (height_px + MARGIN["top"] + MARGIN["bottom"] + 20) / DPI
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=DPI)
    left = MARGIN["left"]
    for crop, text in crops:
        h, w = crop.shape
        ax = fig.add_axes([left / DPI / fig_w, MARGIN["bottom"] / DPI / fig_h,
                           w * k / DPI / fig_w, h * k / DPI / fig_h])
        image = np.repeat(np.repeat(pixels(crop, cmap, vmin, vmax), k, axis=0), k, axis=1)
        ax.imshow(image, interpolation="nearest", extent=(0, w, h, 0), aspect="auto")
        ax.set_title(text, fontsize=SMALL_PT + 1)
        ax.set_xlabel("PE column in region")
        left += w * k + gap
    fig.suptitle(title)
    cax = fig.add_axes([(left - gap + 15) / DPI / fig_w, MARGIN["bottom"] / DPI / fig_h,
                        12 / DPI / fig_w, height_px / DPI / fig_h])
    _colour_bar(fig, cax, cmap, vmin, vmax, label, None, None, ticks)
    return save_figure(fig, path, formats)

"""How every figure reads: text that stays legible at the size it is saved (ticks 10 pt, no
text under 9 pt), numbers on axes written as the command line writes them (``wse_emu.util.fmt``:
'8.48 k', '5 ms', never '8.48e+03' or '10^3'), log axes labelled only as densely as their labels
fit, and categories in colours that neighbours never share.

Sizes are applied with ``styled`` around each drawing function, never to matplotlib's global
settings, so a notebook's own figures keep theirs."""

from __future__ import annotations

import functools
import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from wse_emu.util.fmt import duration, number

TICK_PT = 10
SMALL_PT = 9  # legends, annotations, labels inside a map: the smallest text a figure has
RC = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "figure.titlesize": 11,
      "xtick.labelsize": TICK_PT, "ytick.labelsize": TICK_PT, "legend.fontsize": SMALL_PT,
      "legend.title_fontsize": SMALL_PT}
# Room a tick label needs along its axis, in points: x labels side by side ('1.23 k' at 10 pt
# and a gap), y labels one above the other (a line and a gap).
LABEL_ROOM_PT = {"x": 48, "y": 22}


def styled(draw):
    """Run a drawing function with the figures' text sizes (the figure is saved inside it,
    so its ticks, made when it is drawn, get them too)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return draw(*args, **kwargs)
    return wrapper


def number_formatter() -> FuncFormatter:
    """Ticks as ``fmt.number``: 0.005, 1.5, 8.48 k, 2 M."""
    return FuncFormatter(lambda v, _: number(v))


def seconds_formatter() -> FuncFormatter:
    """Ticks of an axis in seconds as ``fmt.duration``: 500 us, 5 ms, 2 s."""
    return FuncFormatter(lambda v, _: duration(v))


def percent_formatter() -> FuncFormatter:
    """Ticks of a share as percentages, as the command line writes attainment: 90%."""
    return FuncFormatter(lambda v, _: f"{v:.0%}")


def ratio_formatter() -> FuncFormatter:
    """Ticks of a ratio of two plans, as the command line writes one: 1.5x."""
    return FuncFormatter(lambda v, _: f"{number(v)}x")


def axis_numbers(axis, formatter=None) -> None:
    """Write a linear ``axis``'s numbers with ``formatter`` (``number_formatter`` by default;
    matplotlib's own would write an offset such as '1e6' apart from the ticks)."""
    axis.set_major_formatter(formatter or number_formatter())


def log_axis(ax, which: str, formatter=None) -> None:
    """Make ``ax``'s ``which`` axis ('x' or 'y') logarithmic, its major ticks labelled with
    ``formatter`` (``number_formatter`` by default) only as densely as the labels fit, the others
    marked unlabelled."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    log_ticks(ax.xaxis if which == "x" else ax.yaxis, formatter)


def log_ticks(axis, formatter=None) -> None:
    """The ticks of ``log_axis`` on an axis already logarithmic (such as a secondary axis that
    follows a log axis)."""
    axis.set_major_locator(ReadableLogLocator(axis.axis_name))
    axis.set_major_formatter(formatter or number_formatter())
    axis.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10)))
    axis.set_minor_formatter(NullFormatter())


class ReadableLogLocator(LogLocator):
    """Major ticks of a log axis, as many as their labels have room for: every power of ten
    (every other one, or fewer, over many decades); over a decade or two, 1-2-5 in each decade,
    then 1 to 9; over less than that, evenly spaced values. Matplotlib's own labels a short log
    axis's minor ticks too, and they collide."""

    def __init__(self, axis_name: str):
        super().__init__(base=10)
        self.axis_name = axis_name

    def tick_values(self, vmin, vmax):
        low, high = sorted((vmin, vmax))
        if not (low > 0 and math.isfinite(high)) or high <= low:
            return super().tick_values(vmin, vmax)
        room = self._room()
        for ticks in self._candidates(low, high):
            inside = ticks[(ticks >= low * (1 - 1e-9)) & (ticks <= high * (1 + 1e-9))]
            if 2 <= len(inside) <= room:
                return ticks
        linear = MaxNLocator(nbins=max(2, min(room, 4))).tick_values(low, high)
        return linear[linear > 0]

    def _room(self) -> int:
        """Labels the axis has room for, from its length on the figure."""
        if self.axis is None:
            return 8
        box = self.axis.axes.bbox
        length_px = box.width if self.axis_name == "x" else box.height
        points = length_px * 72 / self.axis.axes.figure.dpi
        return max(2, int(points // LABEL_ROOM_PT[self.axis_name]))

    @staticmethod
    def _candidates(low: float, high: float):
        """Tick sets to try in turn: every decade, then sparser ones (for many decades), then
        denser ones (for few)."""
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        decades = np.arange(first, last + 1)
        for step in (1, 2, 3, 5, 10):
            yield 10.0 ** decades[decades % step == 0]
        for subs in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
            yield np.array([s * 10.0 ** d for d in decades for s in subs])


def distinct_colours(levels: np.ndarray, palette, count: int) -> list:
    """A colour for each of the integers 0 .. count - 1 that ``levels`` (a map, NaN where
    empty) holds: the palette cycled, but never the colour of the level before it, nor of any
    level that touches it on the map, where the palette has one left. Stage 10 of a serpentine
    lies under stage 3, which a plain cycle of seven colours paints the same."""
    touching = _touching(levels, count)
    colours: list[int] = []
    for level in range(count):
        taken = {colours[-1]} if colours else set()
        taken |= {colours[other] for other in touching[level] if other < level}
        preferred = level % len(palette)
        free = [c for c in range(len(palette)) if c not in taken]
        colours.append(preferred if preferred not in taken or not free else
                       min(free, key=lambda c: (c - preferred) % len(palette)))
    return [palette[c] for c in colours]


def _touching(levels: np.ndarray, count: int) -> list[set]:
    """For each level, the levels of the PEs beside its own (left, right, above, below)."""
    out: list[set] = [set() for _ in range(count)]
    grid = np.where(np.isfinite(levels), levels, -1).astype(np.int64)
    for a, b in ((grid[:, :-1], grid[:, 1:]), (grid[:-1, :], grid[1:, :])):
        differ = (a != b) & (a >= 0) & (b >= 0) & (a < count) & (b < count)
        for x, y in set(zip(a[differ].tolist(), b[differ].tolist())):
            out[x].add(y)
            out[y].add(x)
    return out

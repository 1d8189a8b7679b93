"""A sweep drawn: its headline number against one axis (a line per value of the others), or,
over two axes, a heatmap. Failed points are left out of the lines and grey in a heatmap."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wse_emu.sweeps.sweep import SweepRow, SweepSpec
from wse_emu.util.fmt import number, si
from wse_emu.visualize.draw import DPI, plt, quantity_cmap, save_figure
from wse_emu.visualize.style import SMALL_PT, number_formatter, styled


@styled
def sweep_figure(sweep: SweepSpec, rows: list[SweepRow], path: Path,
                 formats=("png",)) -> list[tuple[Path, str]]:
    key, label = sweep.headline()
    axes = list(sweep.axes)
    values = {a: sweep.axes[a] for a in axes}
    result = {tuple(_value(r.config[a]) for a in axes): r.result[key]
              for r in rows if r.result is not None}
    failed = sum(r.failed for r in rows)
    note = f" ({failed} point{'s' if failed != 1 else ''} failed)" if failed else ""
    if len(axes) == 2:
        xs, ys = ([_value(v) for v in values[a]] for a in axes)
        grid = np.array([[result.get((x, y), np.nan) for x in xs] for y in ys], dtype=float)
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=DPI)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=quantity_cmap(), aspect="auto",
                          origin="lower")
        ax.set_xticks(range(len(xs)), [_tick(x) for x in xs])
        ax.set_yticks(range(len(ys)), [_tick(y) for y in ys])
        for j, row in enumerate(grid):
            for i, v in enumerate(row):
                if np.isfinite(v):
                    ax.text(i, j, number(v), ha="center", va="center", fontsize=SMALL_PT,
                            color="white" if v < np.nanmean(grid) else "black")
        ax.set_xlabel(axes[0])
        ax.set_ylabel(axes[1])
        bar = fig.colorbar(image, ax=ax, label=label)
        bar.ax.yaxis.set_major_formatter(number_formatter())
    else:
        fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=DPI)
        first, rest = axes[0], axes[1:]
        xs = [_value(v) for v in values[first]]
        combos = sorted({k[1:] for k in result}, key=str) or [()]
        for combo in combos:
            pts = [(x, result[(x, *combo)]) for x in xs if (x, *combo) in result]
            if pts:
                name = ", ".join(f"{a} {c}" for a, c in zip(rest, combo)) or label
                ax.plot([_position(x, xs) for x, _ in pts], [v for _, v in pts], marker="o",
                        label=name)
        ax.set_xticks(range(len(xs)) if not _numeric(xs) else xs, [_tick(x) for x in xs])
        ax.yaxis.set_major_formatter(number_formatter())
        ax.set_xlabel(first)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if rest:
            ax.legend()
    ax.set_title(f"sweep {sweep.name}{note}")
    fig.tight_layout()
    files = save_figure(fig, path, formats)
    return [(files[0], f"Sweep {sweep.name}: {label} against "
                       f"{' and '.join(axes[:2]) if len(axes) == 2 else axes[0]}{note}")]


def _value(v):
    """A config value as drawn: numbers as floats (a YAML '1.0e9' may arrive as text)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _tick(x) -> str:
    """An axis value as the command line writes numbers (1.1 G, 49152, 0.46, 8): exact below
    a million (a sweep's values are often whole sizes such as bytes of SRAM)."""
    if not isinstance(x, float):
        return str(x)
    if abs(x) >= 1e6:
        return si(x)
    return f"{x:g}" if x == 0 or abs(x) >= 1e-4 else number(x)


def _numeric(xs) -> bool:
    return all(isinstance(x, float) for x in xs)


def _position(x, xs):
    return x if _numeric(xs) else xs.index(x)

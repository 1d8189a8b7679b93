"""The roofline of the emulated PE (and, scaled, of the wafer) with a model's ops placed by
arithmetic intensity: prefill's matrix multiplies far right under the compute roof, decode's
vector work far left under the SRAM-bandwidth slope."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.opgraph import build_op_graph
from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import ModelSpec
from wse_emu.util.fmt import number, si
from wse_emu.visualize.draw import DPI, OKABE_ITO, save_figure
from wse_emu.visualize.style import log_axis, log_ticks, styled

PHASES = (("prefill", MicroBatch("prefill", tokens=4096), "o", OKABE_ITO[5]),
          ("decode", MicroBatch("decode", batch=1, context=4096), "s", OKABE_ITO[4]))


def phases(step: MicroBatch | None = None) -> tuple:
    """(phase, step, marker, colour) of the two phases drawn; ``step`` replaces its phase's."""
    return tuple((phase, step if step is not None and step.phase == phase else work, marker,
                  color) for phase, work, marker, color in PHASES)


def op_points(model: ModelSpec, fabric: FabricSpec,
              step: MicroBatch | None = None) -> dict[str, list[tuple[str, float]]]:
    """phase -> (op kind, FLOP per byte) of every op of layer 0 (all layers are alike)."""
    graph = build_op_graph(model)
    out = {}
    for phase, work, _, _ in phases(step):
        rows = analyze(graph, model, work, fabric)["ops"]
        out[phase] = [(r.kind, r.cost.intensity) for r in rows
                      if r.layer in (None, 0) and r.cost.flops > 0 and r.cost.bytes > 0]
    return out


@styled
def roofline_figure(model: ModelSpec, fabric: FabricSpec, path: Path, formats=("png",),
                    step: MicroBatch | None = None) -> list[Path]:
    """The roofline with the ops of a prefill of 4096 tokens and of a decode of batch 1 at
    context 4096, or ``step`` in place of its phase's (an ``inspect``ed step)."""
    peak = fabric.fp16_flops_per_cycle * fabric.clock_hz  # FLOP/s of one PE
    bandwidth = fabric.sram_read_bytes_per_cycle * fabric.clock_hz  # bytes/s read by one PE
    ridge = peak / bandwidth
    points = op_points(model, fabric, step)
    every = [i for pts in points.values() for _, i in pts]
    x = np.logspace(np.log10(min(every + [ridge]) / 4), np.log10(max(every + [ridge]) * 4), 200)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=DPI)
    ax.plot(x, np.minimum(peak, x * bandwidth), color="black", linewidth=2,
            label=f"one PE: {si(peak, 'FLOP/s')} FP16, {si(bandwidth, 'B/s')} SRAM")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.text(ridge, peak * 1.15, f"ridge {number(ridge, 2)} FLOP/B", ha="center")
    for phase, work, marker, color in phases(step):
        xs = np.array([i for _, i in points[phase]])
        ys = np.minimum(peak, xs * bandwidth)
        ax.scatter(xs, ys, marker=marker, s=36, facecolors="none" if phase == "decode" else color,
                   edgecolors=color, linewidths=1.4, zorder=3,
                   label=f"{phase} ops ({work.describe()})")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s per PE")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_ylim(top=peak * 2)
    # The wafer's axis is the PE's times the PEs: the same decades, relabelled.
    wafer = ax.secondary_yaxis("right", functions=(lambda y: y * fabric.pes,
                                                   lambda y: y / fabric.pes))
    log_ticks(wafer.yaxis)
    wafer.set_ylabel(f"whole wafer ({fabric.pes:,} PEs), FLOP/s")
    ax.set_title(f"{model.name} on {fabric.name}: where each op of a layer sits")
    ax.legend(loc="lower right", framealpha=0.9)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, formats)

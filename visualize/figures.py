"""Which figures a run directory gets, drawn into a folder: for a serving run its latency,
pipeline and KV figures; the wafer maps (placement, kernel kinds, SRAM by category, route
colors; with a simulated step, compute and link utilization) and the arrays behind every map
(``maps.npz``); the roofline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.models.layer import MicroBatch
from wse_emu.rundir.read import RunDir
from wse_emu.util.atomic import replacing
from wse_emu.util.fmt import number
from wse_emu.visualize import wafer
from wse_emu.visualize.curves import draw_experiment
from wse_emu.visualize.draw import MapLook, map_figure, regions_figure
from wse_emu.visualize.roofline import roofline_figure
from wse_emu.visualize.serving import draw_serving
from wse_emu.visualize.style import percent_formatter
from wse_emu.visualize.sweep import sweep_figure

KINDS = ("maps", "roofline", "serving", "experiment", "sweep")


def check_kinds(what) -> tuple[str, ...]:
    """The kinds of figures ``what`` names (a list, or a word or words split by commas), if
    each is one of ``KINDS``; a word that is not is refused by name, with the kinds there are
    (a misspelt kind would otherwise draw nothing and say nothing)."""
    words = what.split(",") if isinstance(what, str) else list(what)
    kinds = tuple(w.strip() if isinstance(w, str) else w for w in words)
    kinds = tuple(w for w in kinds if w != "")
    unknown = [w for w in kinds if w not in KINDS]
    if unknown or not kinds:
        got = ", ".join(map(repr, unknown)) if unknown else "none"
        raise UserError(f"`what` takes one or more of {', '.join(KINDS)}; got {got}")
    return kinds


def draw_all(run: RunDir, out: Path, what=KINDS, formats=("png",),
             system: int = 0) -> list[tuple[Path, str]]:
    """Draw into ``out``; returns (main image, caption) for the report, in reading order."""
    figures: list[tuple[Path, str]] = []
    if "experiment" in what and run.experiment is not None:
        figures += draw_experiment(run.experiment, out, formats)
    if "sweep" in what and run.sweep is not None:
        figures += sweep_figure(run.sweep, run.sweep_rows, out / "sweep", formats)
    if "serving" in what and run.metrics is not None:
        figures += draw_serving(run.path, run.metrics, out, formats)
    program = run.program
    if program is None:
        if "roofline" in what and run.inspect:
            figures += _roofline(*_inspected(run), out, formats,
                                 MicroBatch(**run.inspect["workload"]))
        return figures
    if not 0 <= system < program.systems:
        raise UserError(f"`system` must be between 0 and {program.systems - 1}, got {system}")
    if "maps" in what:
        maps = _maps(run, system)
        with replacing(out / "maps.npz") as fh:
            np.savez_compressed(fh, **{name: a for name, (a, *_) in maps.items()})
        outlines = wafer.region_outlines(program, system)
        where = f"{program.fabric.name} system {system}"
        for name, (array, title, label, extra) in maps.items():
            files = map_figure(array, f"{title} ({where})", label, out / f"map_{name}",
                               formats, outlines, MapLook(**extra))
            figures.append((files[0], f"{title}: {label}. One pixel (or block) per PE; grey "
                                      "where the map has no value."))
        parts = _one_part_per_role(program, system)
        if len(parts) > 1:  # prefill and decode side by side, one colour scale
            for name in ("sram_total", "compute", "links_max"):
                if name in maps:
                    array, title, label, extra = maps[name]
                    files = regions_figure(array, f"{title}, region by region", label,
                                           out / f"regions_{name}", parts, formats,
                                           vmin=extra.get("vmin"), vmax=extra.get("vmax"),
                                           ticks=extra.get("ticks"))
                    figures.append((files[0], f"{title} of each role's region, side by side "
                                              "on one colour scale."))
    if "roofline" in what:
        figures += _roofline(program.model, program.fabric, out, formats)
    return figures


def _roofline(model, fabric, out: Path, formats, step=None) -> list[tuple[Path, str]]:
    files = roofline_figure(model, fabric, out / "roofline", formats, step)
    return [(files[0], "Roofline of one PE (right axis: the whole wafer) with every op of a "
                       "layer at its arithmetic intensity.")]


def _inspected(run: RunDir):
    """The model and fabric an ``inspect -o`` run directory recorded."""
    from wse_emu.hardware.fabric import fabric_from_dict
    from wse_emu.models.spec import model_from_dict

    source = str(run.path / "inspect.json")
    return (model_from_dict({**run.inspect["model_spec"], "version": 1}, source),
            fabric_from_dict({**run.inspect["fabric_spec"], "version": 1}, source))


def _one_part_per_role(program, system: int) -> list[tuple]:
    """The first region part of each role on ``system``: what to compare side by side."""
    seen, parts = set(), []
    for r in program.regions:
        for p in r.parts:
            if p.system == system and r.role not in seen:
                seen.add(r.role)
                parts.append((p.x, p.y, p.w, p.h, f"{r.name} ({r.role})"))
    return parts


def _maps(run: RunDir, system: int) -> dict[str, tuple]:
    """name -> (array, title, colour-bar label, drawing options)."""
    p = run.program
    maps = {
        "placement": (wafer.placement(p, system), "Pipeline stages",
                      "stage position in its region's pipeline",
                      {"levels": max(len(r.stage_ids) for r in p.regions),
                       "names": wafer.stage_names(p, system)}),
        "kernels": (wafer.kernel_kinds(p, system), "Kernel kinds", "kernel kind",
                    {"categories": wafer.KERNEL_KINDS}),
        "colors": (wafer.colors(p, system), "Route colors", "colors configured per router", {}),
    }
    sram = wafer.sram(p, system)
    limit = float(p.fabric.sram_bytes_per_pe)
    for category, array in sram.items():
        if category == "total_share":
            maps["sram_total"] = (array, "SRAM occupancy", "share of the PE's SRAM",
                                  {"vmin": 0.0, "vmax": 1.0, "ticks": percent_formatter()})
        else:
            maps[f"sram_{category}"] = (array, f"SRAM: {category.replace('_', ' ')}",
                                        "bytes per PE", {"vmin": 0.0, "vmax": limit})
    if run.results and "pe_busy_cycles" in run.counters:
        busy = wafer.compute_utilization(p, run.counters, run.results, system)
        top = utilization_scale(busy)
        maps["compute"] = (busy, "Compute utilization",
                           f"busy cycles / stage cycles (scale 0 to {number(top)})",
                           {"vmin": 0.0, "vmax": top})
    if run.results and "link_wavelets_nesw" in run.counters and "stages" in run.results:
        links = wafer.link_utilization(p, run.counters, run.results, system)
        for d, array in links.items():
            title = "Link utilization, busiest direction" if d == "max" else \
                f"Link utilization, {d} links"
            top = utilization_scale(array)
            maps[f"links_{d}"] = (array, title, f"wavelets per cycle (scale 0 to {number(top)})",
                                  {"vmin": 0.0, "vmax": top})
    return maps


def utilization_scale(array) -> float:
    """The top of a utilization map's colour scale: the first of 1, 0.5, 0.2, 0.1, ... below
    which 99.9% of its PEs lie, so that a map busy 5% at most is not uniformly dark (the
    label states the scale)."""
    values = np.asarray(array, dtype=float)
    values = values[np.isfinite(values)]
    high = float(np.percentile(values, 99.9)) if values.size else 1.0
    top = 1.0
    for candidate in (0.5, 0.2, 0.1, 0.05, 0.02, 0.01):
        if high <= candidate:
            top = candidate
    return top

"""Wafer maps: one value per PE, drawn one pixel (or a whole block of pixels) per PE.

Each map is first an array (height x width, NaN where a map has nothing to say), computed from
the program and the run's counters, and only then an image: the arrays are saved beside the
figures, so anyone can check a picture against the numbers. Images are drawn with nearest-
neighbour scaling by a whole factor, never resampled, so one hot link or one full PE stays
visible on a 755 x 1170 wafer.
"""

from __future__ import annotations

import numpy as np

from wse_emu.program.format import WaferProgram

DIRECTIONS = ("N", "E", "S", "W")
KERNEL_KINDS = ("matrix", "attention", "norm", "elementwise", "gather")


def placement(program: WaferProgram, system: int = 0) -> np.ndarray:
    """Each PE's stage position in its region's pipeline (0 = first), NaN where no stage is."""
    out = _blank(program)
    for stage in program.stages:
        r = stage.rect
        if r.system == system:
            out[r.y:r.y1, r.x:r.x1] = stage.index
    return out


def stage_names(program: WaferProgram, system: int = 0) -> list[tuple]:
    """(x, y, w, h, stage position) of every stage on ``system``: the numbers written on the
    stage map, where a colour alone (the palette repeats) does not say which stage it is."""
    return [(s.rect.x, s.rect.y, s.rect.w, s.rect.h, str(s.index)) for s in program.stages
            if s.rect.system == system]


def kernel_kinds(program: WaferProgram, system: int = 0) -> np.ndarray:
    """Each PE's kernel kind, as an index into ``KERNEL_KINDS`` (NaN: no kernel)."""
    out = _blank(program)
    for k in program.kernels:
        r = k.rect
        # An expert activation or combine spans its strip but runs on its runs' root PEs
        # only: the strip stays a matrix kernel's.
        on_runs = k.kind in ("norm", "elementwise") and r.w > 1 and r.h > 1
        if r.system == system and k.kind in KERNEL_KINDS and not on_runs:
            out[r.y:r.y1, r.x:r.x1] = KERNEL_KINDS.index(k.kind)
    return out


def sram(program: WaferProgram, system: int = 0) -> dict[str, np.ndarray]:
    """Bytes per PE by category (weights, activations, KV cache, reserved), and the total as a
    share of the PE's SRAM."""
    out = {k[5:]: program.arrays[k][system].astype(np.float64)
           for k in sorted(program.arrays) if k.startswith("sram_")}
    total = sum(out.values())
    out["total_share"] = total / program.fabric.sram_bytes_per_pe
    return out


def colors(program: WaferProgram, system: int = 0) -> np.ndarray:
    """How many distinct route colors each PE's router is configured with."""
    mask = np.zeros((program.fabric.height, program.fabric.width), dtype=np.uint64)
    for route in program.routes:
        f = route.footprint
        if f.system == system and route.color >= 0:
            mask[f.y:f.y1, f.x:f.x1] |= np.uint64(1) << np.uint64(route.color)
    counts = np.zeros(mask.shape, dtype=np.float64)
    for bit in range(64):
        counts += (mask >> np.uint64(bit)) & np.uint64(1)
    return counts


def stage_cycles(program: WaferProgram, results: dict, system: int = 0) -> np.ndarray:
    """The simulated cycles of the stage each PE belongs to (NaN outside simulated stages):
    the denominator of every utilization map."""
    out = _blank(program)
    for s in results.get("stages", []):
        r = program.stages[s["stage"]].rect
        if r.system == system and s["cycles"] > 0:
            out[r.y:r.y1, r.x:r.x1] = s["cycles"]
    return out


def compute_utilization(program: WaferProgram, counters: dict, results: dict,
                        system: int = 0) -> np.ndarray:
    """Busy cycles of each PE's core over its stage's cycles."""
    return counters["pe_busy_cycles"][system] / stage_cycles(program, results, system)


def link_utilization(program: WaferProgram, counters: dict, results: dict,
                     system: int = 0) -> dict[str, np.ndarray]:
    """Wavelets each PE sent per cycle on its N, E, S and W links, and the largest of the four."""
    cycles = stage_cycles(program, results, system)
    links = counters["link_wavelets_nesw"][system]
    out = {d: links[:, :, i] / cycles for i, d in enumerate(DIRECTIONS)}
    out["max"] = np.max(np.stack([out[d] for d in DIRECTIONS]), axis=0)
    return out


def region_outlines(program: WaferProgram, system: int = 0) -> list[tuple]:
    """(x, y, w, h, label) of every region part on ``system``."""
    return [(p.x, p.y, p.w, p.h, f"{r.name} ({r.role})") for r in program.regions
            for p in r.parts if p.system == system]


def _blank(program: WaferProgram) -> np.ndarray:
    return np.full((program.fabric.height, program.fabric.width), np.nan)

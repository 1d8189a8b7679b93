"""A compiled program's regions as the serving runtime sees them: their stage-time tables,
timed once, shared by replicas of one shape and cached on disk."""

from __future__ import annotations

from pathlib import Path

from wse_emu.program import WaferProgram
from wse_emu.runner import signature
from wse_emu.runtime.serve import RegionModel
from wse_emu.runtime.tables import build_table, grid_axes


def region_models(program: WaferProgram, cache: Path, progress=None,
                  grid: str = "full") -> list[RegionModel]:
    """One pair of tables per distinct region (replicas of one shape and role share them),
    over the micro-batch shapes of ``grid`` ("full", or "quick" for a first look)."""
    shared: dict[tuple, dict] = {}
    out = []
    for r in program.regions:
        key = (r.role, tuple(signature(program, program.stages[i]) for i in r.stage_ids))
        if key not in shared:
            phases = {"mixed": ("prefill", "decode"), "prefill": ("prefill",),
                      "decode": ("decode",)}[r.role]
            shared[key] = {ph: build_table(program, r.name, ph, axes=grid_axes(grid, ph),
                                           cache_dir=cache, progress=progress)
                           for ph in phases}
        t = shared[key]
        out.append(RegionModel(r.name, r.role, r.kv_capacity_tokens, t.get("prefill"),
                               t.get("decode"), system=r.parts[0].system))
    return out

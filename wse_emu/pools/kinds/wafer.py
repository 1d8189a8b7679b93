"""Wafers as pools: a fabric (a preset such as ``wse3``, or a fabric YAML), the model compiled
onto it as colocated serving lays it out (``copies`` side by side in column bands, at a depth
of layers per stage), its stage tables simulated and cached; each region then serves the
side's role. A system is one wafer (a CS-3), drawing the preset's system power.

A compiled wafer region is a ``WaferRegion``; ``wafer_pools`` makes them from a program, with
their stage tables timed once, shared by replicas of one shape, and cached on disk."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import CompileError, UserError
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec, load_fabric
from wse_emu.pools.kinds.base import PoolKind, Side
from wse_emu.pools.speculative import hop_to_target, with_draft
from wse_emu.program.format import WaferProgram
from wse_emu.serving.pools import PHASES, StagePool
from wse_emu.serving.tables import ENDS, TableAsk, build_tables, ends_axes, grid_axes, verify_phase
from wse_emu.sim.runner import signature
from wse_emu.util.configfile import preset_names
from wse_emu.util.progress import status


class WaferKind(PoolKind):
    order = 0  # where its names are tried: first
    noun = "a fabric"
    file_mark = "its `width`"
    default_file = True  # fabric files came first: one with a field missing is told which

    def presets(self) -> list[str]:
        return preset_names("fabrics")

    def load(self, name: str) -> FabricSpec:
        return load_fabric(name)

    def load_file(self, path: Path) -> FabricSpec:
        return load_fabric(path)

    def owns(self, hardware) -> bool:
        return isinstance(hardware, FabricSpec)

    def power_w(self, hardware: FabricSpec) -> float:
        return hardware.system_power_w

    def clock_hz(self, hardware: FabricSpec) -> float:
        return hardware.clock_hz

    def variants(self, name, model, copies: tuple, depths: tuple) -> list[Side]:
        # As the wafer-only experiment tries them; a layout the model does not fit is
        # skipped when compiled.
        return [Side(name, copies=c, depth=d) for c in sorted(set(copies) | {1})
                for d in (None, *sorted(set(depths)))]

    def label(self, side: Side) -> str:
        count, hw = side.pool.count, side.pool.hardware
        name = hw.name if count == 1 else f"{count} x {hw.name}"
        how = ([f"{side.copies} copies per wafer"] if side.copies > 1 else []) \
            + ([f"{side.depth} layer{'s' if side.depth > 1 else ''} per stage"]
               if side.depth else [])
        return f"{name} ({', '.join(how)})" if how else name

    def pools(self, model, side: Side, role: str, first: int, clock_hz: float,
              cache: Path, grid: str, reach: int = 0) -> list:
        name, copies = side.pool, side.copies
        fabric = name.hardware
        bands = {"region": (fabric.width // copies, fabric.height)} if copies > 1 else {}
        status(f"compiling {model.name} onto {self.label(side)} ({role})")
        from wse_emu.compiler.cache import compile_kept
        from wse_emu.compiler.mapper import compile_model  # with the engines under it

        try:
            # Kept beside the tables, as an experiment's wafer layouts are.
            program = compile_kept(model, ClusterSpec(fabric, name.count), CompileOptions(
                plan="colocated", layers_per_stage=side.depth, **bands), compile_model, cache)
        except CompileError as exc:  # its advice in this command's terms: wse3x4
            advice = re.sub(r"`systems=(\d+)`", rf"{fabric.name}x\1", str(exc))
            raise UserError(f"{role} pool {name.text}: {advice}") from None
        # The regions keep their layout and serve the side's role: only its tables are timed.
        program = replace(program, regions=[replace(r, role=role) for r in program.regions])
        # A wafer's tables count its own cycles: rescaled to the serving clock.
        factor = clock_hz / fabric.clock_hz
        return [replace(pool, name=f"{fabric.name}-{role}{k}",
                        prefill=pool.prefill.scaled(factor) if pool.prefill else None,
                        decode=pool.decode.scaled(factor) if pool.decode else None,
                        system=pool.system + first,
                        fabric_bytes_per_cycle=pool.fabric_bytes_per_cycle / factor,
                        link_bytes_per_cycle=pool.link_bytes_per_cycle / factor)
                for k, pool in enumerate(wafer_pools(program, cache, grid, reach=reach))]

    def step_times_source(self, hardware: FabricSpec) -> str:
        return f"simulated on {hardware.name}"


WAFER = WaferKind()
KIND = WAFER  # found by ``kinds.kinds()``


@dataclass
class WaferRegion(StagePool):
    """A compiled wafer region as a pool. KV handoffs inside a wafer cross the fabric at the
    boundary between regions (a link per row); between wafers they go over the off-wafer
    links. ``for_fabric`` sets both."""

    def for_fabric(self, fabric) -> "WaferRegion":
        """This region with the handoff rates of ``fabric`` (a FabricSpec)."""
        self.fabric_bytes_per_cycle = float(fabric.height * fabric.link_bytes_per_cycle)
        self.link_bytes_per_cycle = fabric.offwafer_bytes_per_cycle()
        return self


def wafer_pools(program: WaferProgram, cache: Path, grid: str = "full", pool=None,
                draft_tokens: int = 0, reach: int = 0) -> list[WaferRegion]:
    """``wafer_pools_of`` one program."""
    return wafer_pools_of([program], cache, grid, pool, draft_tokens, reach)[0]


def wafer_pools_of(programs: list[WaferProgram], cache: Path, grid: str = "full",
                   pool=None, draft_tokens: int = 0,
                   reach: int = 0) -> list[list[WaferRegion]]:
    """Each program's regions as pools: one pair of tables per distinct region (replicas of
    one shape and role share them), over the micro-batch shapes of ``grid`` ("full", or
    "quick" for a first look), every program's timed together (``build_tables``) so that
    stages alike across them are timed once; with ``pool`` (a worker pool,
    ``workers.point_pool``) on its workers. With ``draft_tokens``, a program's regions that
    decode do so speculatively, its draft's stages first in them (``pools.speculative``): each
    program must have a draft. Contexts are timed as far as ``reach`` tokens
    (``tables.reaching``)."""
    asks, where = [], []  # per program, per region: the asks' indices by phase
    for program in programs:
        if draft_tokens and program.draft is None:
            raise UserError("speculative decoding needs a draft beside the target: compile "
                            "with `draft` (a model, or mtp)")
        shared: dict[tuple, dict] = {}
        per_region = []
        for r in program.regions:
            key = (r.role, tuple(signature(program, program.stages[i]) for i in r.stage_ids))
            if key not in shared:
                shared[key] = {}
                phases = PHASES[r.role]
                if draft_tokens and "decode" in phases:
                    phases = (*phases, verify_phase(draft_tokens))
                for ph in phases:
                    shared[key][ph] = len(asks)
                    asks.append(TableAsk(program, r.name, ph, grid_axes(grid, ph, reach)))
                if draft_tokens and "decode" in phases and program.draft.options.ends_shared:
                    # Its draft's passes through its embedding and LM head (an mtp head's).
                    shared[key][ENDS] = len(asks)
                    asks.append(TableAsk(program, r.name, ENDS, ends_axes(grid)))
            per_region.append(shared[key])
        drafts = {}
        if draft_tokens:  # the draft's own tables, on its strip
            side = program.draft
            for ph in ("prefill", "decode"):
                drafts[ph] = len(asks)
                asks.append(TableAsk(side, side.regions[0].name, ph,
                                     grid_axes(grid, ph, reach)))
        where.append((per_region, drafts))
    tables = build_tables(asks, cache_dir=cache, pool=pool)
    out = []
    for program, (per_region, drafts) in zip(programs, where):
        draft = {ph: tables[k] for ph, k in drafts.items()}
        out.append([_region_pool(program, r, {ph: tables[k] for ph, k in t.items()}, draft,
                                 draft_tokens)
                    for r, t in zip(program.regions, per_region)])
    return out


def _region_pool(program: WaferProgram, r, tables: dict, draft: dict,
                 draft_tokens: int) -> WaferRegion:
    """Region ``r`` as a pool from its tables by phase and, speculating, its draft's."""
    prefill, decode = tables.get("prefill"), tables.get("decode")
    verify, capacity = None, r.kv_capacity_tokens
    if draft_tokens:
        # The draft's strip holds KV for every token of the target's regions on its wafer
        # (``compiler.draft``), so the target's room is the pool's.
        decode, prefill, verify = with_draft(
            decode, prefill, tables.get(verify_phase(draft_tokens)), draft["decode"],
            draft["prefill"], draft_tokens, hop_to_target(program, r), tables.get(ENDS))
    speculates = verify is not None
    return WaferRegion(r.name, r.role, capacity, prefill, decode, system=r.parts[0].system,
                       verify=verify, draft_tokens=draft_tokens if speculates else 0,
                       draft_stages=len(draft["decode"].cycles) if speculates else 0,
                       draft_ends=tables.get(ENDS) if speculates else None,
                       ).for_fabric(program.fabric)

"""Pools: what serving needs of a place that runs the model.

A pool has a role (``mixed`` for colocated serving, ``prefill`` or ``decode`` for a split), a
pipeline of stages with their times by micro-batch shape (``StageTable``s: a prefill tile of
so many tokens after so many cached, a decode step of so many sequences at a mean context), a
KV capacity, and the links its KV handoffs use: a transfer to another pool of the same system
crosses that system's fabric, one to another system leaves over this system's own link and
arrives over the other's, one transfer at a time on each (their contention), and reaches it
after the network's latency (the larger of the two ends'). Serving reads nothing else, so a
pool of another kind (an accelerator described by measured step times) is one more class
with these attributes.

A compiled wafer region is a ``WaferRegion``; ``wafer_pools`` makes them from a program, with
their stage tables timed once, shared by replicas of one shape, and cached on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from wse_emu.program.format import WaferProgram
from wse_emu.serving.knobs import EngineKnobs
from wse_emu.serving.tables import StageTable, TableAsk, build_tables, grid_axes
from wse_emu.sim.runner import signature

ROLES = ("mixed", "prefill", "decode")
PHASES = {"mixed": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",)}


class Pool(Protocol):
    name: str
    role: str  # mixed, prefill or decode
    kv_capacity_tokens: int
    prefill: StageTable | None  # cycles per stage of a prefill tile (None: no prefill here)
    decode: StageTable | None  # ... of a decode micro-batch (None: no decode here)
    # A decode micro-batch's share of a step it shares with a prompt's chunk (chunked
    # serving), where one step runs both: the chunk's table is then read at the chunk's
    # tokens and the sequences' together, since its matrices multiply them in one pass.
    # None: the two are timed apart and added (a wafer's pipeline runs them as two passes
    # of its stages' kernels).
    riding: StageTable | None
    system: int  # which system it sits on: its handoffs' links are that system's
    fabric_bytes_per_cycle: float  # a handoff to a pool of the same system
    link_bytes_per_cycle: float  # ... to another system, each way, over this system's link
    link_latency_cycles: float  # ... and its network's one-way latency (the larger end's)

    @property
    def stages(self) -> int: ...


@dataclass
class StagePool:
    """A pool as serving reads it (``Pool``): what a wafer region, an accelerator's copy of the
    model or a GPU's is made into."""

    name: str
    role: str
    kv_capacity_tokens: int
    prefill: StageTable | None
    decode: StageTable | None
    system: int = 0
    # A handoff to a pool of the same system, and out of it to another, in bytes per cycle.
    fabric_bytes_per_cycle: float = float("inf")
    link_bytes_per_cycle: float = float("inf")
    riding: StageTable | None = None
    link_latency_cycles: float = 0.0
    # The knob values its kind's serving engines use: what an experiment tries on it by default
    # (serving itself never reads it).
    engine: EngineKnobs = field(default_factory=EngineKnobs)

    @property
    def stages(self) -> int:
        return len((self.prefill or self.decode).cycles)


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


def wafer_pools(program: WaferProgram, cache: Path, grid: str = "full",
                pool=None) -> list[WaferRegion]:
    """``wafer_pools_of`` one program."""
    return wafer_pools_of([program], cache, grid, pool)[0]


def wafer_pools_of(programs: list[WaferProgram], cache: Path, grid: str = "full",
                   pool=None) -> list[list[WaferRegion]]:
    """Each program's regions as pools: one pair of tables per distinct region (replicas of
    one shape and role share them), over the micro-batch shapes of ``grid`` ("full", or
    "quick" for a first look), every program's timed together (``build_tables``) so that
    stages alike across them are timed once; with ``pool`` (a worker pool,
    ``workers.point_pool``) on its workers."""
    asks, where = [], []  # per program, per region: the asks' indices by phase
    for program in programs:
        shared: dict[tuple, dict] = {}
        per_region = []
        for r in program.regions:
            key = (r.role, tuple(signature(program, program.stages[i]) for i in r.stage_ids))
            if key not in shared:
                shared[key] = {}
                for ph in PHASES[r.role]:
                    shared[key][ph] = len(asks)
                    asks.append(TableAsk(program, r.name, ph, grid_axes(grid, ph)))
            per_region.append(shared[key])
        where.append(per_region)
    tables = build_tables(asks, cache_dir=cache, pool=pool)
    out = []
    for program, per_region in zip(programs, where):
        out.append([WaferRegion(r.name, r.role, r.kv_capacity_tokens,
                                tables[t["prefill"]] if "prefill" in t else None,
                                tables[t["decode"]] if "decode" in t else None,
                                system=r.parts[0].system).for_fabric(program.fabric)
                    for r, t in zip(program.regions, per_region)])
    return out

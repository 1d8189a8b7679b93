"""Partition a cluster into regions, each holding one model replica with a role.

Colocated: every region is ``mixed``. Disaggregated: ``prefill`` and ``decode`` regions, either
side by side on every wafer (``prefill_share`` of the columns) or on separate systems
(``prefill_systems``). A model that fits in one wafer gets one or more replicas per wafer part;
a larger model gets regions of whole wafers, pipelined across systems.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.geometry import even_split, grid_shape
from compiler.options import CompileOptions
from wse_emu.errors import CompileError
from wse_emu.fabric import ClusterSpec, FabricSpec
from wse_emu.model import ModelSpec
from wse_emu.program import Rect

# Weights may fill at most this share of a PE's usable SRAM: the rest holds activation
# buffers and absorbs tiling remainders.
WEIGHT_FILL_MAX = 0.95
DEFAULT_PREFILL_SHARE = 0.5


@dataclass
class RegionPlan:
    name: str
    role: str
    replica: int
    parts: list[Rect]


def wafer_weight_capacity(fabric: FabricSpec) -> float:
    return fabric.pes * fabric.usable_bytes_per_pe * WEIGHT_FILL_MAX


def wafers_needed(model: ModelSpec, fabric: FabricSpec) -> int:
    """Whole wafers one replica needs by SRAM capacity alone (a lower bound)."""
    return max(1, math.ceil(model.weight_bytes() / wafer_weight_capacity(fabric)))


def _gb(n: float) -> str:
    """Bytes for a message: '141 GB', '2.5 GB', '213 kB'."""
    for factor, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= factor:
            value = n / factor
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def too_big_message(model: ModelSpec, cluster: ClusterSpec, need: int, what: str = "") -> str:
    return (f"{model.name} needs {_gb(model.weight_bytes())} of weights; "
            f"{cluster.systems} x {cluster.fabric.name} holds "
            f"{_gb(cluster.systems * cluster.fabric.sram_bytes_total)} of SRAM{what}: "
            f"use --systems {need} or more")


def _role_too_small(model: ModelSpec, cluster: ClusterSpec, role: str, have: int,
                    span: int) -> str:
    if cluster.systems < 2 * span:
        fix = f"use --systems {2 * span} or more with --prefill-systems {span}"
    elif role == "prefill":
        fix = f"use --prefill-systems {span} or more"
    else:
        fix = f"use --prefill-systems {cluster.systems - span} or fewer"
    return (f"{model.name} needs {span} systems per replica ({_gb(model.weight_bytes())} of "
            f"weights); the {role} role has {have}: {fix}")


def partition(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions,
              replicas_cap: int | None = None) -> list[RegionPlan]:
    fabric = cluster.fabric
    span = wafers_needed(model, fabric)
    whole = Rect(0, 0, 0, fabric.width, fabric.height)

    if options.plan == "colocated":
        pools = [("mixed", list(range(cluster.systems)), (0, fabric.width))]
    elif options.prefill_systems is not None:
        p = options.prefill_systems
        if p >= cluster.systems:
            raise CompileError(f"--prefill-systems {p} leaves no system for decode "
                               f"(the cluster has {cluster.systems})")
        pools = [("prefill", list(range(p)), (0, fabric.width)),
                 ("decode", list(range(p, cluster.systems)), (0, fabric.width))]
    else:
        if span > 1:
            raise CompileError(
                f"{model.name} spans {span} wafers, so a wafer cannot be split between "
                f"prefill and decode: use --prefill-systems P with --systems {2 * span} or more")
        share = options.prefill_share
        if share is None:
            share = DEFAULT_PREFILL_SHARE
        cut = round(fabric.width * share)
        if not 0 < cut < fabric.width:
            raise CompileError(f"--prefill-share {share} leaves an empty part of the wafer")
        systems = list(range(cluster.systems))
        pools = [("prefill", systems, (0, cut)), ("decode", systems, (cut, fabric.width - cut))]

    regions: list[RegionPlan] = []
    for role, systems, (x0, width) in pools:
        if span > 1:
            count = len(systems) // span
            if count < 1 and role == "mixed":
                raise CompileError(too_big_message(model, cluster, span))
            if count < 1:
                raise CompileError(_role_too_small(model, cluster, role, len(systems), span))
            for r in range(count):
                parts = [Rect(s, whole.x, whole.y, whole.w, whole.h)
                         for s in systems[r * span:(r + 1) * span]]
                regions.append(RegionPlan(f"{role}{r}", role, r, parts))
            continue
        part_pes = width * fabric.height
        capacity = part_pes * fabric.usable_bytes_per_pe
        if model.weight_bytes() > capacity * WEIGHT_FILL_MAX:
            if role == "mixed":
                raise CompileError(too_big_message(model, cluster, span + 1))
            raise CompileError(
                f"{model.name} needs {_gb(model.weight_bytes())} of weights; the {role} part "
                f"({width}x{fabric.height} PEs) holds {_gb(capacity)}: give {role} a larger "
                f"share or use --prefill-systems")
        rects = _replica_rects(model, fabric, x0, width, options, replicas_cap)
        index = 0
        for s in systems:
            for x, y, w, h in rects:
                regions.append(RegionPlan(f"{role}{index}", role, index, [Rect(s, x, y, w, h)]))
                index += 1
    return regions


def _replica_rects(model: ModelSpec, fabric: FabricSpec, x0: int, width: int,
                   options: CompileOptions, replicas_cap: int | None) -> list[tuple[int, ...]]:
    height = fabric.height
    if options.region is not None:
        rw, rh = options.region
        gx, gy = width // rw, height // rh
        if gx < 1 or gy < 1:
            raise CompileError(f"--region {rw}x{rh} does not fit in a {width}x{height} part")
        return [(x0 + i * rw, j * rh, rw, rh) for j in range(gy) for i in range(gx)]
    capacity = width * height * fabric.usable_bytes_per_pe
    count = int(capacity * options.weight_share_target // model.weight_bytes())
    count = max(1, min(count, options.max_replicas_per_part))
    if replicas_cap is not None:
        count = max(1, min(count, replicas_cap))
    gx, gy = grid_shape(count, width, height)
    xs = even_split(width, gx)
    ys = even_split(height, gy)
    rects = []
    y = 0
    for hh in ys:
        x = x0
        for ww in xs:
            rects.append((int(x), int(y), int(ww), int(hh)))
            x += ww
        y += hh
    return rects

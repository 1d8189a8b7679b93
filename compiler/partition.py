"""Partition a cluster into regions, each holding one model replica with a role.

Colocated: every region is ``mixed``. Disaggregated: ``prefill`` and ``decode`` regions, either
side by side on every wafer (``prefill_share`` of the columns) or on separate systems
(``prefill_systems``). A model that fits in one wafer gets one or more replicas per wafer part;
a larger model gets regions of whole wafers, pipelined across systems. ``reserved_columns``
(a draft's strip) are left free at the far side of the wafer that holds each replica's last
stage: of every wafer for replicas of one wafer or less, of a replica's last wafer otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wse_emu.compiler.geometry import even_split, grid_shape
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import CompileError
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec
from wse_emu.models.spec import WEIGHT_FORMATS, ModelSpec, formats_text, stored_as
from wse_emu.program.format import Rect

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


def laid_weight_bytes(model: ModelSpec, ends_shared: bool = False) -> int:
    """The weights a program of ``model`` lays out: all of them, or with ``ends_shared``
    (``CompileOptions.ends_shared``) its layers' alone, its embedding and LM head being
    another program's."""
    if not ends_shared:
        return model.weight_bytes()
    return int(round(model.num_layers * model.layer_weight_bytes()))


def wafers_needed(model: ModelSpec, fabric: FabricSpec, reserved_columns: int = 0,
                  ends_shared: bool = False) -> int:
    """Whole wafers one replica needs by SRAM capacity alone (a lower bound), with
    ``reserved_columns`` of its last wafer left free."""
    reserved = _part_weight_capacity(fabric, reserved_columns)
    weights = laid_weight_bytes(model, ends_shared)
    return max(1, math.ceil((weights + reserved) / wafer_weight_capacity(fabric)))


def _gb(n: float, extra_digits: int = 0) -> str:
    """Bytes for a message: '141 GB', '2.5 GB', '213 kB' (``extra_digits`` more decimals)."""
    for factor, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= factor:
            value = n / factor
            digits = (0 if value >= 10 else 1) + extra_digits
            return f"{value:.{digits}f} {unit}"
    return f"{n:.0f} B"


def _two_sizes(a: float, b: float) -> tuple[str, str]:
    """``_gb`` of two sizes, with enough decimals that different sizes do not print the same."""
    for extra in range(4):
        sa, sb = _gb(a, extra), _gb(b, extra)
        if sa != sb or a == b:
            break
    return sa, sb


def narrower_formats(model: ModelSpec) -> list[ModelSpec]:
    """The model in the stored formats worth offering when it does not fit, least rounding
    first: every matrix in fp8, then (a mixture of experts) its experts in MXFP4 beside fp8,
    then every matrix in MXFP4; a format never widens what is already narrower, and only
    those that store the model smaller than it is are offered."""
    def narrowed(current: str, expert: bool, fmt: str) -> str:
        now = model.storage.matrix_bytes_per_weight(expert=expert)
        return fmt if WEIGHT_FORMATS[fmt] < now else current

    options: list[ModelSpec] = []
    for matrices, experts in (("fp8", "fp8"), ("fp8", "mxfp4"), ("mxfp4", "mxfp4")):
        option = stored_as(model, narrowed(model.storage.weight_format, False, matrices),
                           narrowed(model.storage.expert_weight_format, True, experts)
                           if model.is_moe else None)
        if option.weight_bytes() < model.weight_bytes() and option not in options:
            options.append(option)
    return options


def _narrower_note(model: ModelSpec, fabric: FabricSpec, need: int) -> str:
    """', or store them narrower: with matrices in fp8 (`weight_format=fp8`) they need 2',
    for the first narrower format that needs fewer systems, or ''."""
    for option in narrower_formats(model):
        fewer = wafers_needed(option, fabric)
        if fewer < need:
            flags = " ".join(f"`{name}={getattr(option.storage, name)}`"
                             for name in ("weight_format", "expert_weight_format")
                             if getattr(option.storage, name) != getattr(model.storage, name))
            return (f", or store them narrower: with {formats_text(option)} ({flags}) "
                    f"they need {fewer}")
    return ""


def too_big_message(model: ModelSpec, cluster: ClusterSpec, need: int, what: str = "") -> str:
    weights_text, capacity_text = _two_sizes(
        model.weight_bytes(), cluster.systems * wafer_weight_capacity(cluster.fabric))
    return (f"{model.name} needs {weights_text} of weights; "
            f"{cluster.systems} x {cluster.fabric.name} holds "
            f"{_gb(cluster.systems * cluster.fabric.sram_bytes_total)} of SRAM, of which "
            f"{capacity_text} can hold weights (less code, runtime and buffers){what}: "
            f"use `systems={need}` or more{_narrower_note(model, cluster.fabric, need)}")


def _part_weight_capacity(fabric: FabricSpec, width: int) -> float:
    """Weight bytes a part of ``width`` full-height columns of one wafer can hold."""
    return width * fabric.height * fabric.usable_bytes_per_pe * WEIGHT_FILL_MAX


def _min_part_width(model: ModelSpec, fabric: FabricSpec) -> int:
    """The fewest full-height columns of one wafer that hold the model's weights."""
    weights = model.weight_bytes()
    width = max(1, math.ceil(weights / _part_weight_capacity(fabric, 1)))
    while width > 1 and weights <= _part_weight_capacity(fabric, width - 1):
        width -= 1
    while weights > _part_weight_capacity(fabric, width):
        width += 1
    return width


def _share_fits(share: float, width: int, min_width: int) -> bool:
    """Whether ``--prefill-share share`` leaves both parts of a ``width``-column wafer at least
    ``min_width`` columns (the cut computed as in ``partition``)."""
    cut = round(width * share)
    return min_width <= cut <= width - min_width


def _share_range(width: int, min_width: int) -> tuple[float, float] | None:
    """Round bounds lo <= hi such that every share from lo to hi fits both parts, or None."""
    if 2 * min_width > width:
        return None
    for digits in (2, 3, 4):
        scale = 10 ** digits
        lo = math.ceil(min_width / width * scale) / scale
        hi = math.floor((width - min_width) / width * scale) / scale
        while lo <= hi and not _share_fits(lo, width, min_width):
            lo = round(lo + 1 / scale, digits)
        while hi >= lo and not _share_fits(hi, width, min_width):
            hi = round(hi - 1 / scale, digits)
        if 0 < lo <= hi < 1:
            return lo, hi
    return None


def _part_too_small(model: ModelSpec, cluster: ClusterSpec, role: str, width: int) -> str:
    """A prefill or decode part of a split wafer cannot hold the model: say which shares
    would work, or that none does and systems must be split instead."""
    fabric = cluster.fabric
    weights_text, capacity_text = _two_sizes(model.weight_bytes(),
                                             _part_weight_capacity(fabric, width))
    head = (f"{model.name} needs {weights_text} of weights; the {role} part "
            f"({width}x{fabric.height} PEs) can hold {capacity_text} of weights")
    min_width = _min_part_width(model, fabric)
    shares = _share_range(fabric.width, min_width)
    if shares is not None:
        lo, hi = shares
        which = f"`prefill_share={lo:g}`" if lo == hi else (f"`prefill_share` between {lo:g} "
                                                             f"and {hi:g}")
        return (f"{head}: use {which} (the shares that leave both parts "
                "room for the weights)")
    if cluster.systems < 2:
        fix = "use `prefill_systems=1` and `systems=2` (or more systems)"
    elif cluster.systems == 2:
        fix = "use `prefill_systems=1`"
    else:
        fix = f"use `prefill_systems` between 1 and {cluster.systems - 1}"
    return (f"{head}, and no `prefill_share` fits both parts (each needs at least {min_width} "
            f"of the {fabric.width} columns): {fix}")


def _role_too_small(model: ModelSpec, cluster: ClusterSpec, role: str, have: int,
                    span: int) -> str:
    if cluster.systems < 2 * span:
        fix = f"use `systems={2 * span}` or more with `prefill_systems={span}`"
    elif role == "prefill":
        fix = f"use `prefill_systems={span}` or more"
    else:
        fix = f"use `prefill_systems={cluster.systems - span}` or fewer"
    narrower = _narrower_note(model, cluster.fabric, span)
    return (f"{model.name} needs {span} systems per replica ({_gb(model.weight_bytes())} of "
            f"weights); the {role} role has {have}: {fix}{narrower}")


def partition(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions,
              replicas_cap: int | None = None, span: int | None = None) -> list[RegionPlan]:
    """``span``: wafers per replica when more than SRAM alone needs (a layout that does not
    fit the fewest)."""
    fabric = cluster.fabric
    reserved = options.reserved_columns
    if reserved >= fabric.width:
        raise CompileError(f"`reserved_columns={reserved}` leaves none of {fabric.name}'s "
                           f"{fabric.width} columns")
    span = span or wafers_needed(model, fabric, reserved, options.ends_shared)
    usable = fabric.width - (reserved if span == 1 else 0)  # a wafer's columns for regions
    if options.region is not None and span > 1:
        rw, rh = options.region
        raise CompileError(
            f"`region={rw}x{rh}` applies only to models that fit one wafer; {model.name} "
            f"spans {span} wafers of {fabric.name}: drop `region`")

    if options.plan == "colocated":
        pools = [("mixed", list(range(cluster.systems)), (0, usable))]
    elif options.prefill_systems is not None:
        p = options.prefill_systems
        if p >= cluster.systems:
            raise CompileError(f"`prefill_systems={p}` leaves no system for decode "
                               f"(the cluster has {cluster.systems})")
        pools = [("prefill", list(range(p)), (0, usable)),
                 ("decode", list(range(p, cluster.systems)), (0, usable))]
    else:
        if span > 1:
            raise CompileError(
                f"{model.name} spans {span} wafers, so a wafer cannot be split between "
                f"prefill and decode: use `prefill_systems=P` with `systems={2 * span}` or more")
        share = options.prefill_share
        if share is None:
            share = DEFAULT_PREFILL_SHARE
        cut = round(usable * share)
        if not 0 < cut < usable:
            raise CompileError(f"`prefill_share={share}` leaves an empty part of the wafer")
        systems = list(range(cluster.systems))
        pools = [("prefill", systems, (0, cut)), ("decode", systems, (cut, usable - cut))]

    regions: list[RegionPlan] = []
    for role, systems, (x0, width) in pools:
        if span > 1:
            count = len(systems) // span
            if count < 1 and role == "mixed":
                raise CompileError(too_big_message(model, cluster, span))
            if count < 1:
                raise CompileError(_role_too_small(model, cluster, role, len(systems), span))
            for r in range(count):
                mine = systems[r * span:(r + 1) * span]
                parts = [Rect(s, 0, 0, fabric.width - (reserved if s == mine[-1] else 0),
                              fabric.height) for s in mine]
                regions.append(RegionPlan(f"{role}{r}", role, r, parts))
            continue
        # A mixed or whole-system part is a whole wafer, which holds the model when span is 1
        # (the same product as wafer_weight_capacity): only a split wafer's part can fail here.
        laid = laid_weight_bytes(model, options.ends_shared)
        if laid > _part_weight_capacity(fabric, width):
            raise CompileError(_part_too_small(model, cluster, role, width))
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
            raise CompileError(f"`region={rw}x{rh}` does not fit in a {width}x{height} part")
        return [(x0 + i * rw, j * rh, rw, rh) for j in range(gy) for i in range(gx)]
    capacity = width * height * fabric.usable_bytes_per_pe
    count = int(capacity * options.weight_share_target
                // laid_weight_bytes(model, options.ends_shared))
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


SPLIT_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75)  # prefill shares a split search tries first


def disaggregated_splits(model: ModelSpec, cluster: ClusterSpec) -> list[dict]:
    """The prefill/decode splits worth comparing, as CompileOptions fields. Shares of every
    wafer's columns: those of ``SPLIT_SHARES`` that leave both parts room for the weights, or,
    when fewer than three do, three points inside the feasible range. With enough systems, also
    whole systems per role (multiples of the systems one replica spans)."""
    fabric = cluster.fabric
    span = wafers_needed(model, fabric)
    splits: list[dict] = []
    if span == 1:
        min_width = _min_part_width(model, fabric)
        feasible = _share_range(fabric.width, min_width)
        if feasible is not None:
            shares = [s for s in SPLIT_SHARES if _share_fits(s, fabric.width, min_width)]
            if len(shares) < 3:
                # A narrow range: its ends hold the weights only just (tiling may still fail
                # there), so take points a fifth of the way in from each end, and the middle.
                lo, hi = feasible
                shares = sorted({round(lo + (hi - lo) * q, 2) for q in (0.2, 0.5, 0.8)})
            splits += [{"prefill_share": s} for s in shares
                       if _share_fits(s, fabric.width, min_width)]
    splits += [{"prefill_systems": p} for p in range(span, cluster.systems - span + 1, span)]
    return splits

"""The layout search: how a region's layers become pipeline stages and where each stage lies.

Whole layers go to each wafer of the region (``stages.split_layers``), a mixture of experts
cutting one layer between two wafers only when whole layers leave room for part of one. On
each wafer the layers are grouped into stages (as few layers per stage as lay out, or as many
as asked), each stage gets an area for its strips' weights (``stages.allocate_areas``) and a
rectangle (``stages.layout_stages``), and each strip an extent along the stage's long side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wse_emu.compiler.stages import (
    StageSpec,
    allocate_areas,
    layout_stages,
    split_layers,
    split_layers_in_parts,
    stage_spec,
    strip_extents,
    strip_min_extent,
)
from wse_emu.errors import CompileError
from wse_emu.program.format import Rect

if TYPE_CHECKING:
    from wse_emu.compiler.placement import StageScorer


class NoLayout(Exception):
    """The region shape is too small for any stage layout (the caller may use fewer replicas)."""


@dataclass
class StageLayout:
    spec: StageSpec
    rect: Rect
    axis: str  # "x" or "y": the long side, along which strips are laid
    areas: list[float]
    extents: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    roots: dict[str, bool] = field(default_factory=dict)
    baseline: tuple[list[str], dict[str, bool]] | None = None
    scorer: StageScorer | None = None

    @property
    def long(self) -> int:
        return self.rect.w if self.axis == "x" else self.rect.h

    @property
    def short(self) -> int:
        return self.rect.h if self.axis == "x" else self.rect.w

    def transposed(self, name: str) -> bool:
        """Whether strip ``name`` splits its inputs across the stage (``StripSpec.transposed``)."""
        return next(s for s in self.spec.strips if s.name == name).transposed(self.short)


def layout_region(model, part_shapes, options, budget, fewest) -> list[list[StageLayout]]:
    """Whole layers per wafer; a mixture of experts whose whole layers do not lay out over its
    wafers has a layer cut between two wafers wherever whole layers leave room for part of one
    (``split_layers_in_parts``)."""
    parts = len(part_shapes)
    ends = not options.ends_shared  # else another program's stages hold them
    extra_first = model.embedding_weight_bytes() if ends and not model.tie_embeddings else 0
    extra_last = model.head_weight_bytes() if ends else 0
    budgets = [w * h * budget for w, h in part_shapes]
    ranges = split_layers(model.layer_weight_bytes(), model.num_layers, budgets, extra_first,
                          extra_last)

    def lay_out(plan: list[list]) -> list[list[StageLayout]]:
        return [_layout_part(model, w, h, items, ends and p == 0, ends and p == parts - 1, p,
                             budget, options, fewest)
                for p, ((w, h), items) in enumerate(zip(part_shapes, plan))]

    try:
        return lay_out([[(i, None) for i in range(l0, l1)] for l0, l1 in ranges])
    except NoLayout:
        if parts == 1 or not model.is_moe or model.norm.sandwich:
            raise
    return lay_out(split_layers_in_parts(model, budgets, extra_first, extra_last))


def _stage_groups(items: list, per_stage: int) -> list[list]:
    """Consecutive whole layers in stages of ``per_stage``; a split layer's part is a stage of
    its own."""
    groups: list[list] = []
    run: list = []
    for item in items:
        if item[1] is not None:
            groups += [run[i:i + per_stage] for i in range(0, len(run), per_stage)]
            groups.append([item])
            run = []
        else:
            run.append(item)
    groups += [run[i:i + per_stage] for i in range(0, len(run), per_stage)]
    return groups


def _layout_part(model, width, height, items, first, last, part, budget,
                 options, fewest) -> list[StageLayout]:
    d = model.storage.dtype_bytes
    count = sum(1 for _, experts in items if experts is None)
    l0, l1 = items[0][0], items[-1][0] + 1
    split = any(experts is not None for _, experts in items)
    choices = ([options.layers_per_stage] if options.layers_per_stage
               else range(min(fewest, max(count, 1)), max(count, 1) + 1))
    for per_stage in choices:
        groups = _stage_groups(items, per_stage)
        specs = [stage_spec(model, g[0][0], g[-1][0] + 1, first and i == 0,
                            last and i == len(groups) - 1, g[0][1])
                 for i, g in enumerate(groups)]
        mins = [[s.weight_bytes / budget for s in spec.strips] for spec in specs]
        if sum(map(sum, mins)) > width * height:
            if first and last:
                raise NoLayout(f"the weights do not fit in a {width}x{height} region")
            if split:
                raise NoLayout(f"layers {l0}-{l1 - 1} (the ends cut between wafers) do not fit "
                               f"in a {width}x{height} wafer")
            # A replica over wafers gives each wafer whole layers.
            whole = int(width * height * budget // model.layer_weight_bytes())
            raise NoLayout(f"layers {l0}-{l1 - 1} do not fit in a {width}x{height} wafer, "
                           f"which holds {whole} whole layers; a layer is not split across "
                           "wafers")
        # A stage given no more than its weights' area can still miss by the rounding of its
        # blocks to whole PEs; such a stage's minimum grows by what it missed, and the area
        # is shared again (a few rounds: whole layers rarely need one, a split wafer's full
        # stages may).
        for _ in range(MIN_AREA_ROUNDS):
            layouts = _try_layout(specs, mins, width, height, part, budget, d)
            if not isinstance(layouts, dict):
                break
            for i, grow in layouts.items():
                mins[i] = [m * grow for m in mins[i]]
            if sum(map(sum, mins)) > width * height:
                break
        if isinstance(layouts, list):
            return layouts
    raise NoLayout(f"no stage layout for layers {l0}-{l1 - 1} in {width}x{height}")


MIN_AREA_ROUNDS = 4


def _try_layout(specs, mins, width, height, part, budget, d) -> list[StageLayout] | dict | None:
    """The stages laid out, or per stage whose strips' blocks do not fit its rectangle the
    factor its minimum area must grow by, or None if no rectangles fit the areas."""
    areas = allocate_areas(specs, width * height, mins)
    try:
        rects = layout_stages(width, height, [sum(a) for a in areas],
                              [len(s.strips) for s in specs])
    except CompileError:
        return None
    layouts, short_of = [], {}
    for i, (spec, area, r) in enumerate(zip(specs, areas, rects)):
        axis = "x" if r.w >= r.h else "y"
        lay = StageLayout(spec, Rect(part, r.x, r.y, r.w, r.h), axis, area)
        ext = strip_extents(spec, area, lay.long, lay.short, budget, d)
        if ext is None:
            need = [strip_min_extent(s, lay.short, budget, d) for s in spec.strips]
            if any(n is None for n in need):
                return None
            short_of[i] = max(1.0, sum(need) / lay.long) * 1.01
            continue
        lay.extents = {s.name: int(e) for s, e in zip(spec.strips, ext)}
        layouts.append(lay)
    return short_of or layouts

"""The layout of one region shape, computed once and stamped out for every replica.

Replicas of a region have identical shapes, so their stages, kernels, routes, colors, per-PE
SRAM plans and bounds are identical up to a translation. ``build_template`` maps a region of
the given part shapes (one part per wafer it spans) in part-relative coordinates, where a rect's
``system`` is the part index: the layout search (``layout``), the placement of each stage's
strips (``placement.arrange``), then its kernels, routes and SRAM plan (``build``), with the KV
plan (``kvplan``) and the bounds (``region_report``).
"""

from __future__ import annotations

import numpy as np

from wse_emu.compiler.build import RegionTemplate, assemble
from wse_emu.compiler.layout import NoLayout, layout_region
from wse_emu.compiler.options import CompileOptions
from wse_emu.compiler.placement import arrange
from wse_emu.compiler.routing import ColorsExhausted
from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models.spec import ModelSpec
from wse_emu.program.trees import MAX_LEVELS

INITIAL_BUFFER_RESERVE = 1024  # bytes per PE held back for activation buffers while sizing


def build_template(model: ModelSpec, fabric: FabricSpec, part_shapes: list[tuple[int, int]],
                   options: CompileOptions) -> RegionTemplate:
    """A layout whose routes need more colors than the fabric has is retried first with
    reduction trees of one level fewer at a time down to two (one color per level), then, with
    automatic layers per stage, with more layers per stage (fewer stages, so fewer routes
    crossing)."""
    fewest, max_levels = 1, MAX_LEVELS
    laid: dict = {}  # the layouts and arrangements tried, which no tree depth changes
    while True:
        try:
            return _build_template(model, fabric, part_shapes, options, fewest, max_levels,
                                   laid)
        except ColorsExhausted as exc:
            if max_levels > 2:
                max_levels -= 1
                continue
            if options.layers_per_stage or exc.layers_per_stage >= model.num_layers:
                raise
            fewest = exc.layers_per_stage + 1


def _build_template(model, fabric, part_shapes, options, fewest, max_levels,
                    laid: dict) -> RegionTemplate:
    reserve = INITIAL_BUFFER_RESERVE
    for _ in range(4):
        budget = fabric.usable_bytes_per_pe - reserve
        if (budget, fewest) not in laid:
            layouts = layout_region(model, part_shapes, options, budget, fewest)
            arrange(layouts, model, options)
            laid[(budget, fewest)] = layouts
        layouts = laid[(budget, fewest)]
        # A tree depth whose routes take too many colors is retried one level shallower
        # (``build_template``): it may stop at the first stage that proves it.
        template = assemble(model, fabric, part_shapes, layouts, options, max_levels,
                            give_up_early=max_levels > 2)
        over = max(int((a["weights"].astype(np.int64) + a["activations"]).max())
                   for a in template.arrays) - fabric.usable_bytes_per_pe
        if over <= 0:
            return template
        reserve += over
    # Too tight a region, as a layout that does not fit is: the mapper tries fewer replicas,
    # or a replica over one wafer more.
    raise NoLayout(f"activation buffers do not fit beside the weights in "
                   f"{' + '.join(f'{w}x{h}' for w, h in part_shapes)}")

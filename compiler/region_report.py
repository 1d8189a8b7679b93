"""A region's report: the placement's bytes x hops before and after optimizing, and the
analytic bounds of every kernel, stage and the region's pipeline (``bounds``)."""

from __future__ import annotations

import numpy as np

from wse_emu.compiler.bounds import kernel_bound, stage_bound
from wse_emu.compiler.routing import manhattan
from wse_emu.models import layer as ly
from wse_emu.program.format import Kernel, Rect


def placement_report(flat, homes, model) -> dict:
    """Bytes x hops and the busiest link (bytes per decode token) for the baseline and the
    optimized placement, inside stages plus between consecutive stages."""
    report = {}
    between = sum(model.hidden_size * model.storage.dtype_bytes * manhattan(homes[i - 1], homes[i])
                  for i in range(1, len(homes)) if homes[i - 1].system == homes[i].system)
    for label in ("baseline", "optimized"):
        bytes_hops, worst = float(between), 0.0
        for lay in flat:
            arrangement = lay.baseline if label == "baseline" else (lay.order, lay.roots)
            bh, load = lay.scorer.score(*arrangement)
            bytes_hops += bh
            worst = max(worst, load)
        report[label] = {"bytes_hops_per_token": bytes_hops, "max_link_bytes_per_token": worst}
    return report


def _gap(a: Rect, b: Rect) -> int:
    """Fewest hops from any PE of ``a`` to any PE of ``b``."""
    gx = max(0, a.x - b.x1 + 1, b.x - a.x1 + 1)
    gy = max(0, a.y - b.y1 + 1, b.y - a.y1 + 1)
    return gx + gy


def _strip_loads(ks: dict[str, Kernel], layers: int, phase: str,
                 once: set[str]) -> list[dict[str, float]]:
    """Per strip of PEs: the compute, SRAM and link cycles of every kernel that runs on it in
    one step (its own kernel, the kernels on its output edge, its share of attention)."""
    strips = [k for k in ks.values() if k.kind in ("matrix", "gather") and k.weight_ref is None]
    loads = []
    for strip in strips:
        load = {"compute": 0.0, "sram": 0.0, "link": 0.0}
        for name, k in ks.items():
            if not (k is strip or strip.rect.contains(k.rect) or k.kind == "attention"
                    or (k.weight_ref is not None and k.rect == strip.rect)):
                continue
            times = 1 if name in once else layers
            for r in load:
                load[r] += times * k.bounds[phase][r]
        loads.append(load)
    return loads


def region_bounds(template, named, homes, model, fabric, options) -> dict:
    works = {
        "prefill": ly.MicroBatch("prefill", tokens=options.bound_prefill_tokens),
        "decode": ly.MicroBatch("decode", batch=options.bound_decode_batch,
                                context=options.bound_decode_context),
    }
    for kernel in template.kernels:
        stage = template.stages[kernel.stage]
        kernel.bounds = {ph: kernel_bound(kernel, stage.rect, model, fabric, w,
                                          range(*stage.layers), stage.part)
                         for ph, w in works.items()}
    dependencies = ly.kernel_dependencies(model)
    once = {op.kernel for op in ly.input_ops(model) + ly.output_ops(model)}
    region = {}
    for phase in works:
        per_stage = []
        for i, (stage, ks) in enumerate(zip(template.stages, named)):
            layer_kernels = {n: k.bounds[phase] for n, k in ks.items() if n in dependencies}
            extras = [k.bounds[phase] for n, k in ks.items() if n in once]
            hops = {(src, dst): _gap(ks[src].rect, ks[dst].rect)
                    for dst, deps in dependencies.items() if dst in ks
                    for src in deps if src in ks}
            entry = 0 if i == 0 else (_gap(homes[i - 1], homes[i])
                                      if homes[i - 1].system == homes[i].system else 0)
            sb = stage_bound(layer_kernels, dependencies, extras,
                             _strip_loads(ks, stage.num_layers, phase, once),
                             hops, stage.num_layers, entry, fabric)
            stage.bounds[phase] = sb
            per_stage.append(sb["cycles"])
        # Crossing a wafer boundary costs at least the activation's bytes over the off-wafer
        # link of one system.
        tokens = works[phase].new_tokens
        crossing = sum(ly.carried_values(model, template.stages[i - 1].part)
                       for i in range(1, len(homes)) if homes[i - 1].system != homes[i].system)
        offwafer = crossing * tokens * model.storage.dtype_bytes / fabric.offwafer_bytes_per_cycle()
        bottleneck = int(np.argmax(per_stage))
        # Tokens may stream from stage to stage, so the step is bounded by the slowest stage's
        # whole work plus one token's trip through every other stage (a flow shop), not by
        # the sum of the stages.
        trips = [s.bounds[phase]["latency_cycles"] for s in template.stages]
        latency = float(max(c + sum(trips) - trip for c, trip in zip(per_stage, trips))
                        + offwafer)
        region[phase] = {
            "workload": works[phase].describe(),
            "bottleneck_stage": bottleneck,
            "bottleneck_cycles": per_stage[bottleneck],
            "pipeline_latency_cycles": latency,
            "pipeline_latency_s": latency / fabric.clock_hz,
            "offwafer_cycles": offwafer,
            "max_tokens_per_s": tokens * fabric.clock_hz / per_stage[bottleneck],
        }
    return region

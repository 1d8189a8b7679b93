"""compile_model: the whole mapping compiler, from a model and a cluster to a WaferProgram."""

from __future__ import annotations

import copy
import logging

import numpy as np

from wse_emu.compiler.build import RegionTemplate
from wse_emu.compiler.draft import compile_with_draft
from wse_emu.compiler.layout import NoLayout
from wse_emu.compiler.options import CompileOptions
from wse_emu.compiler.partition import RegionPlan, laid_weight_bytes, partition, wafers_needed
from wse_emu.compiler.routing import color_masks, popcount
from wse_emu.compiler.template import build_template
from wse_emu.compiler.tiling import ownership_check
from wse_emu.errors import CompileError
from wse_emu.hardware.fabric import ClusterSpec
from wse_emu.kernels import patterns
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec, formats_text, native
from wse_emu.program.format import SRAM_CATEGORIES, Rect, Region, Route, WaferProgram

log = logging.getLogger(__name__)


def compile_model(model: ModelSpec, cluster: ClusterSpec,
                  options: CompileOptions | None = None) -> WaferProgram:
    options = options or CompileOptions()
    patterns.check(options)
    if options.draft is not None:  # the target beside its draft, each compiled alone
        return compile_with_draft(model, cluster, options, compile_model)
    plans, templates = _plan_and_template(model, cluster, options)
    program = _instantiate(model, cluster, options, plans, templates)
    verify(program)
    return program


def _shape(plan: RegionPlan) -> tuple[tuple[int, int], ...]:
    return tuple((p.w, p.h) for p in plan.parts)


def _plan_and_template(model, cluster, options):
    """Partition, then map each distinct region shape; with automatic replicas, halve the
    replica count while a region is too small to lay out; a replica spanning wafers whose
    tiles do not lay out on the fewest that hold its weights takes one wafer more."""
    cap, span, layout_error = None, None, None
    while True:
        try:
            plans = partition(model, cluster, options, replicas_cap=cap, span=span)
        except CompileError as exc:
            if span is None:
                raise
            fewest = wafers_needed(model, cluster.fabric, options.reserved_columns,
                                   options.ends_shared)
            raise CompileError(
                f"{model.name} needs {span} x {cluster.fabric.name} per replica: {fewest} hold "
                f"its weights by SRAM, but their tiles do not lay out on {span - 1} "
                f"({layout_error}); use `systems={span}` or more") from exc
        templates: dict[tuple, RegionTemplate] = {}
        try:
            for plan in plans:
                shape = _shape(plan)
                if shape not in templates:
                    templates[shape] = build_template(model, cluster.fabric, list(shape), options)
            return plans, templates
        except NoLayout as exc:
            per_part = _replicas_per_part(plans)
            parts = len(plans[0].parts)
            if parts > 1 and not options.layers_per_stage:
                span, layout_error = parts + 1, exc
                continue
            if options.region is not None or per_part <= 1:
                raise CompileError(f"{model.name} cannot be laid out on {cluster.describe()}: "
                                   f"{exc}; try `layers_per_stage` or a larger region") from None
            cap = per_part // 2


def _replicas_per_part(plans: list[RegionPlan]) -> int:
    counts: dict[tuple[str, int], int] = {}
    for p in plans:
        key = (p.role, p.parts[0].system)
        counts[key] = counts.get(key, 0) + 1
    return max(counts.values())


def _instantiate(model, cluster, options, plans, templates) -> WaferProgram:
    fabric = cluster.fabric
    shape3 = (cluster.systems, fabric.height, fabric.width)
    arrays = {f"sram_{c}": np.zeros(shape3, np.uint16) for c in SRAM_CATEGORIES}
    arrays["stage_id"] = np.full(shape3, -1, np.int32)
    regions, stages, kernels, routes = [], [], [], []
    for plan in plans:
        t = templates[_shape(plan)]
        k0, s0, r0 = len(kernels), len(stages), len(routes)

        def move(rect: Rect) -> Rect:
            part = plan.parts[rect.system]
            return Rect(part.system, part.x + rect.x, part.y + rect.y, rect.w, rect.h)

        region = Region(plan.name, plan.role, plan.replica, plan.parts,
                        kv_capacity_tokens=t.kv_capacity_tokens, weight_bytes=t.weight_bytes)
        for st in t.stages:
            s = copy.deepcopy(st)
            s.id, s.region, s.rect = st.id + s0, plan.name, move(st.rect)
            s.kernel_ids = [k + k0 for k in st.kernel_ids]
            stages.append(s)
            region.stage_ids.append(s.id)
        for kt in t.kernels:
            k = copy.copy(kt)
            k.id, k.stage, k.rect = kt.id + k0, kt.stage + s0, move(kt.rect)
            if kt.weight_ref is not None:
                k.weight_ref = kt.weight_ref + k0
            kernels.append(k)
        for rt in t.routes:
            r = copy.copy(rt)
            r.id, r.footprint = rt.id + r0, move(rt.footprint)
            r.src = None if rt.src is None else rt.src + k0
            r.dst = [d + k0 for d in rt.dst]
            r.stage = None if rt.stage is None else rt.stage + s0
            routes.append(r)
        for part, a in zip(plan.parts, t.arrays):
            sl = (part.system, slice(part.y, part.y1), slice(part.x, part.x1))
            arrays["sram_weights"][sl] = a["weights"]
            arrays["sram_activations"][sl] = a["activations"]
            arrays["sram_kv_cache"][sl] = a["kv_cache"]
            arrays["sram_reserved"][sl] = fabric.reserved_bytes_per_pe
            arrays["stage_id"][sl] = np.where(a["stage"] >= 0, a["stage"] + s0, -1)
        regions.append(region)

    masks = color_masks(routes, shape3)
    if options.plan == "disaggregated":
        routes.extend(_kv_handoff_routes(regions, routes, masks, fabric))
    arrays["color_mask"] = masks
    program = WaferProgram(fabric=fabric, systems=cluster.systems, model=model,
                           options=options.to_dict(), regions=regions, stages=stages,
                           kernels=kernels, routes=routes, arrays=arrays)
    program.summary = summarize(program, templates, plans)
    return program


def _kv_handoff_routes(regions, routes, masks, fabric) -> list[Route]:
    """KV moves from prefill to decode regions over one dedicated color per system, whose route
    the runtime switches between layer pairs (control wavelets), so that a handoff does not hold
    a color per layer across the wafer. Between systems it leaves through the I/O edges."""
    out = []
    systems = sorted({p.system for r in regions for p in r.parts})
    for system in systems:
        parts = [p for r in regions for p in r.parts if p.system == system]
        x0, y0 = min(p.x for p in parts), min(p.y for p in parts)
        foot = Rect(system, x0, y0, max(p.x1 for p in parts) - x0, max(p.y1 for p in parts) - y0)
        # Region templates held the last color back for this route.
        color = fabric.colors_available - 1
        if int(np.bitwise_or.reduce(masks[foot.slices()].ravel())) >> color & 1:
            raise AssertionError("the KV handoff color is already taken")
        roles = {r.role for r in regions if any(p.system == system for p in r.parts)}
        route = Route(id=len(routes) + len(out), kind="kv_handoff", name=f"kv_handoff.s{system}",
                      footprint=foot, color=color, offwafer=roles != {"prefill", "decode"})
        masks[foot.slices()] |= np.uint32(1 << color)
        out.append(route)
    return out


def verify(program: WaferProgram) -> None:
    """The compiler's guarantees, checked on the finished program; a failure is a bug."""
    fabric, model = program.fabric, program.model
    total = program.sram_total()
    if int(total.max()) > fabric.sram_bytes_per_pe:
        raise AssertionError(f"a PE holds {int(total.max())} bytes > {fabric.sram_bytes_per_pe}")
    weights = int(program.arrays["sram_weights"].astype(np.int64).sum())
    shared = program.options.ends_shared  # the embedding and LM head are another program's
    expected = laid_weight_bytes(model, shared) * len(program.regions)
    # A packed format (MXFP4's 4.25 bits) rounds each PE's block up to whole bytes, and the
    # model's total to the nearest byte.
    blocks = sum(k.grid[0] * k.grid[1] for k in program.kernels if k.kind == "matrix") \
        if model.storage.quantized else 0
    if not -min(blocks, 1) <= weights - expected <= blocks:
        raise AssertionError(f"per-PE weights sum to {weights}, expected {expected}")
    if sum(k.weight_bytes for k in program.kernels) != weights:
        raise AssertionError("kernel weight bytes do not add up to the PEs'")
    expected_owners = {("embedding", None)} if not model.tie_embeddings else set()
    expected_owners = set() if shared else expected_owners | {("lm_head", None)}
    matrices = {op.name for op in ly.layer_ops(model) if op.kind in ly.MATRIX_KINDS}
    # An expert matrix is owned expert by expert (a split layer's experts lie in two stages).
    experts = {op.name: range(op.experts) for op in ly.layer_ops(model) if op.experts}
    expected_owners |= {(name, layer, e) for layer in range(model.num_layers)
                        for name in matrices for e in experts.get(name, [None])}
    for region in program.regions:
        owned = []
        for s in region.stage_ids:
            stage = program.stages[s]
            for k in program.stage_kernels(stage):
                if k.kind in ("matrix", "gather") and k.weight_ref is None:
                    if not ownership_check(*k.matrix, *k.grid):
                        raise AssertionError(f"kernel {k.name} does not partition its matrix")
                    if k.name not in matrices:
                        owned.append((k.name, None))
                        continue
                    held = [None] if k.name not in experts else \
                        range(*stage.experts) if stage.experts else experts[k.name]
                    owned += [(k.name, layer, e) for layer in range(*stage.layers) for e in held]
        if len(owned) != len(set(owned)) or set(owned) != expected_owners:
            raise AssertionError(f"region {region.name} does not own every matrix exactly once")
    for stage in program.stages:
        owners = [k for k in program.stage_kernels(stage) if k.kind == "matrix"
                  or (k.kind == "gather" and k.weight_ref is None)]
        for i, a in enumerate(owners):
            if not stage.rect.contains(a.rect):
                raise AssertionError(f"kernel {a.name} leaves stage {stage.id}")
            for b in owners[i + 1:]:
                if a.rect.overlaps(b.rect):
                    raise AssertionError(f"kernels {a.name} and {b.name} overlap")
    if int(popcount(program.arrays["color_mask"]).max()) > fabric.colors_available:
        raise AssertionError("a PE uses more colors than the fabric allows")


def summarize(program: WaferProgram, templates, plans) -> dict:
    fabric, model = program.fabric, program.model
    total = program.sram_total()
    used = program.arrays["stage_id"] >= 0
    colors = popcount(program.arrays["color_mask"])
    by_shape = {_shape(p): templates[_shape(p)] for p in plans}
    first = next(iter(by_shape.values()))
    region_rows = []
    for plan, region in zip(plans, program.regions):
        t = templates[_shape(plan)]
        region_rows.append({
            "name": region.name, "role": region.role, "replica": region.replica,
            "parts": [str(p) for p in region.parts], "pes": region.pes,
            "stages": len(region.stage_ids), "weight_bytes": region.weight_bytes,
            "kv_capacity_tokens": region.kv_capacity_tokens,
            "bounds": t.bounds,
        })
    stage_rows = [{
        "id": s.id, "region": s.region, "rect": str(s.rect), "layers": s.layers,
        "experts": s.experts, "holds": s.describe_layers(),
        "embedding": s.has_embedding, "head": s.has_head,
        "kv_capacity_tokens": s.kv_capacity_tokens,
        "prefill_bound_cycles": s.bounds["prefill"]["cycles"],
        "prefill_bound_by": s.bounds["prefill"]["dominant"],
        "decode_bound_cycles": s.bounds["decode"]["cycles"],
        "decode_bound_by": s.bounds["decode"]["dominant"],
    } for s in program.stages]
    wafers = wafers_needed(model, fabric, program.options.reserved_columns,
                           program.options.ends_shared)
    return {
        "model": model.name,
        "cluster": f"{program.systems} x {fabric.name}",
        "plan": program.options["plan"],
        "params": model.params(),
        "regions": region_rows,
        "stages": stage_rows,
        "stages_per_region": len(first.stages),
        "pes_total": int(program.systems * fabric.pes),
        "pes_used": int(used.sum()),
        "weight_bytes_total": int(program.arrays["sram_weights"].astype(np.int64).sum()),
        "weight_bytes_model": laid_weight_bytes(model, program.options.ends_shared),
        "sram_bytes_per_pe": fabric.sram_bytes_per_pe,
        "sram_bytes_max_per_pe": int(total.max()),
        "sram_static_bytes_max_per_pe": int((total - program.arrays["sram_kv_cache"]).max()),
        "sram_bytes_by_category": {c: int(program.arrays[f"sram_{c}"].astype(np.int64).sum())
                                   for c in SRAM_CATEGORIES},
        "kv_capacity_tokens": {r.name: r.kv_capacity_tokens for r in program.regions},
        "kv_bytes_per_token": model.kv_bytes_per_token(),
        "colors_available": fabric.colors_available,
        "colors_max_per_pe": int(colors.max()),
        "wafers_per_replica": wafers,
        "stored_formats": formats_text(model),
        "weight_bytes_in_dtype": native(model).weight_bytes(),
        "wafers_per_replica_in_dtype": wafers_needed(native(model), fabric),
        "placement": {shape_key(s): t.placement for s, t in by_shape.items()},
        "bounds": {r["name"]: r["bounds"] for r in region_rows},
    }


def shape_key(shape) -> str:
    return "+".join(f"{w}x{h}" for w, h in shape)


"""Building a region's kernels, routes and per-PE SRAM plan from its stage layouts.

Each stage's strips become matrix (and gather) kernels in the order and with the roots the
placement chose; vector kernels (norms, elementwise ops, the router) sit on the edge lines
their ops name; attention spans the stage. Routes carry each kernel's collectives and the
transfers between kernels, between stages, between wafers and to the host; colors are assigned
to them (``routing``); the KV cache takes what the rest leaves (``kvplan``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.compiler import placement as pl
from wse_emu.compiler.kvplan import kv_plan
from wse_emu.compiler.layout import StageLayout
from wse_emu.compiler.region_report import placement_report, region_bounds
from wse_emu.compiler.routing import (
    ColorsExhausted,
    assign_colors,
    check_colors,
    crowding,
    manhattan,
)
from wse_emu.compiler.stages import home_strip
from wse_emu.errors import CompileError
from wse_emu.kernels import patterns
from wse_emu.kernels.patterns.vector import Site
from wse_emu.kernels.primitives import CostModel
from wse_emu.models import layer as ly
from wse_emu.program.format import Kernel, Rect, Route, Stage
from wse_emu.program.trees import MAX_LEVELS, choose_levels


@dataclass
class RegionTemplate:
    part_shapes: list[tuple[int, int]]
    stages: list[Stage]
    kernels: list[Kernel]
    routes: list[Route]
    arrays: list[dict[str, np.ndarray]]  # per part: weights, activations, kv_cache, stage
    placement: dict
    kv_capacity_tokens: int
    weight_bytes: int
    colors_used: int
    bounds: dict




def _strip_rects(lay: StageLayout) -> dict[str, tuple[Rect, Rect]]:
    """Per strip: (its rect, its root edge line)."""
    out, u = {}, 0
    r = lay.rect
    for name in lay.order:
        e = lay.extents[name]
        high = lay.roots[name]
        if lay.axis == "x":
            body = Rect(r.system, r.x + u, r.y, e, r.h)
            edge = Rect(r.system, r.x + u + (e - 1 if high else 0), r.y, 1, r.h)
            if lay.transposed(name):  # the sums meet at one end across the stage
                edge = Rect(r.system, r.x + u, r.y + (r.h - 1 if high else 0), e, 1)
        else:
            body = Rect(r.system, r.x, r.y + u, r.w, e)
            edge = Rect(r.system, r.x, r.y + u + (e - 1 if high else 0), r.w, 1)
            if lay.transposed(name):
                edge = Rect(r.system, r.x + (r.w - 1 if high else 0), r.y + u, 1, e)
        out[name] = (body, edge)
        u += e
    return out


class _Builder:
    def __init__(self, model, fabric, part_shapes, options, max_levels: int = MAX_LEVELS):
        self.model, self.fabric, self.options = model, fabric, options
        self.d = model.storage.dtype_bytes
        self.stages: list[Stage] = []
        self.kernels: list[Kernel] = []
        self.routes: list[Route] = []
        self.arrays = [{"weights": np.zeros((h, w), np.int64),
                        "activations": np.zeros((h, w), np.int64),
                        "stage": np.full((h, w), -1, np.int32)} for w, h in part_shapes]
        self.part_shapes = part_shapes
        self.cost = CostModel(fabric, self.d)
        self.max_levels = max_levels

    # kernels -----------------------------------------------------------------------------
    def kernel(self, stage: Stage, name: str, kind: str, rect: Rect, **kw) -> Kernel:
        k = Kernel(id=len(self.kernels), stage=stage.id, name=name, kind=kind, rect=rect,
                   layers=kw.pop("layers", stage.num_layers), **kw)
        self.kernels.append(k)
        stage.kernel_ids.append(k.id)
        return k

    def add(self, category: str, rect: Rect, values) -> None:
        self.arrays[rect.system][category][rect.y:rect.y1, rect.x:rect.x1] += values

    def route(self, kind: str, name: str, footprint: Rect, **kw) -> Route:
        r = Route(id=len(self.routes), kind=kind, name=name, footprint=footprint, **kw)
        self.routes.append(r)
        return r

    def line_reduce(self, kernel: Kernel, stage: Stage) -> None:
        """An all-reduce along a kernel's line of PEs. Kernels on the same line never run at
        once (a norm per layer, the final norm after the last), so they share one route."""
        for r in self.routes:
            if r.kind == "line_reduce" and r.footprint == kernel.rect:
                r.dst.append(kernel.id)
                r.name += f"+{kernel.name}"
                return
        self.route("line_reduce", f"{kernel.name}.allreduce", kernel.rect, src=kernel.id,
                   dst=[kernel.id], stage=stage.id)

    def edge_route(self, kind: str, name: str, rect: Rect, **kw) -> Route:
        """A route between ``rect`` and the nearer of its region's east and west edges. The
        wafer's I/O channels are on its east and west edges; between them and a region's edge,
        data rides the runtime's memcpy network, on the colors it reserves."""
        width = self.part_shapes[rect.system][0]
        if rect.center()[0] < width / 2:
            foot = Rect(rect.system, 0, rect.y, rect.x1, rect.h)
        else:
            foot = Rect(rect.system, rect.x, rect.y, width - rect.x, rect.h)
        return self.route(kind, name, foot, hops=foot.w - 1, offwafer=True, **kw)

    def connect(self, name: str, src: Rect, dst: Rect, nbytes: int, **kw) -> None:
        if src.system == dst.system:
            self.route("transfer", name, src.bbox(dst), hops=manhattan(src, dst),
                       bytes_per_token=nbytes, **kw)
        else:
            self.edge_route("offwafer_out", name + ":out", src, bytes_per_token=nbytes, **kw)
            self.edge_route("offwafer_in", name + ":in", dst, bytes_per_token=nbytes, **kw)

    def tree_levels(self, length: int, values: int, value_bytes: int | None = None) -> int:
        """Levels of a reduce of ``values`` numbers along ``length`` PEs."""
        nbytes = value_bytes or self.d
        message = -(-values * nbytes // 4)  # wavelets
        add = float(self.cost.add(np.array([values]), nbytes)[0])
        return choose_levels(length, message, add, self.fabric.hop_latency_cycles,
                             self.max_levels)

    def line(self, edge: Rect, values: np.ndarray) -> np.ndarray:
        return values[:, None] if edge.w == 1 else values[None, :]

    # patterns ----------------------------------------------------------------------------
    def pattern_name(self, role: str, phase: str) -> str:
        """The pattern a kernel of ``role`` (a kernel kind; ``experts`` for an expert strip)
        runs in ``phase``, as the compile options choose it (``CompileOptions.patterns``)."""
        return self.options.pattern_names()[role][phase]

    def strip_entry(self, strip) -> tuple[patterns.Pattern, dict]:
        """The registry entry that plans a strip's kernel, and its pattern per phase."""
        role = "gather" if strip.name == "embedding" else "experts" if strip.experts \
            else "matrix"
        return self.entry(patterns.kind_of(role),
                          {ph: self.pattern_name(role, ph) for ph in ly.PHASES})

    def entry(self, kind: str, names: dict) -> tuple[patterns.Pattern, dict]:
        """The entry that plans a kernel running pattern ``names[phase]`` in each phase: its
        SRAM is planned once, so its phases' patterns must plan it alike."""
        chosen = {ph: patterns.get(kind, name) for ph, name in names.items()}
        plans = {type(p).plan for p in chosen.values()}
        if len(plans) > 1:
            raise CompileError(f"{kind} patterns {' and '.join(names.values())} plan a "
                               "kernel's SRAM differently; one kernel cannot run both")
        return chosen["decode"], names

def assemble(model, fabric, part_shapes, layouts, options, max_levels,
             give_up_early: bool = False) -> RegionTemplate:
    """The region's stages, kernels, routes and SRAM plan for these layouts, with reduction
    trees of at most ``max_levels`` levels; ColorsExhausted if the routes need more colors
    than the fabric leaves. With ``give_up_early`` (for a caller that only retries on that
    error, whatever it says), it is raised as soon as some PE of a stage laid out so far lies
    under more routes than there are colors, before the stages after it are planned: routes
    sharing a PE each need a color of their own, so the coloring could only fail."""
    b = _Builder(model, fabric, part_shapes, options, max_levels)
    d = model.storage.dtype_bytes
    h = model.hidden_size
    flat = [lay for part in layouts for lay in part]
    # What a ColorsExhausted carries: the retry takes more layers per stage than this.
    layers_per_stage = max(lay.spec.num_layers for lay in flat)
    held_back = 1 if options.plan == "disaggregated" else 0
    budget = fabric.colors_available - held_back
    homes: list[Rect] = []
    named: list[dict[str, Kernel]] = []
    for index, lay in enumerate(flat):
        spec = lay.spec
        first_route = len(b.routes)
        stage = Stage(id=index, region="", index=index, rect=lay.rect, layers=list(spec.layers),
                      has_embedding=spec.has_embedding, has_head=spec.has_head,
                      strip_axis=lay.axis,
                      experts=list(spec.experts) if spec.experts is not None else None)
        b.stages.append(stage)
        b.arrays[lay.rect.system]["stage"][lay.rect.y:lay.rect.y1, lay.rect.x:lay.rect.x1] = index
        rects = _strip_rects(lay)
        strips = {s.name: s for s in spec.strips}
        ks: dict[str, Kernel] = {}
        for name in lay.order:
            body, edge = rects[name]
            entry, names = b.strip_entry(strips[name])
            ks[name] = entry.plan(b, stage, lay, strips[name], body, edge, lay.roots[name],
                                  names)
        home = home_strip(spec).name
        home_edge = rects[home][1]
        homes.append(home_edge)

        def edge_of(site: str) -> Rect:
            return home_edge if site == ly.HOME else rects[site][1]

        def vector_kernels(ops: list[ly.Op], layers: int) -> None:
            for op in ops:
                kind = op.kernel_kind
                if kind not in ("norm", "elementwise", "route"):
                    continue
                site = Site(edge_of(op.site), *((rects[op.site][0], strips[op.site])
                                                if op.site in strips else ()))
                entry, _ = b.entry(kind, {ph: b.pattern_name(kind, ph) for ph in ly.PHASES})
                ks[op.kernel] = entry.plan(b, stage, op, layers, site)

        n = spec.num_layers
        if spec.has_embedding:
            vector_kernels(ly.input_ops(model), 1)
        if n:
            for op in ly.part_ops(model, spec.experts):
                if op.kernel_kind == "attention":
                    if "attention" not in ks:
                        entry, _ = b.entry("attention", {ph: b.pattern_name("attention", ph)
                                                         for ph in ly.PHASES})
                        ks["attention"] = entry.plan(b, stage, lay)
                    continue
                vector_kernels([op], n)
        if spec.has_head:
            vector_kernels(ly.output_ops(model), 1)
        named.append(ks)
        # Transfers between this stage's kernels, as the placement model scored them; one
        # multicast route per source and datum.
        groups: dict[tuple[str, str], list] = {}
        for t in pl.stage_transfers(spec, model):
            if t.src != pl.ENTRY and t.dst != pl.EXIT:
                groups.setdefault((t.src, t.data), []).append(t)
        for (src_name, data), ts in groups.items():
            src = lay.rect if src_name == pl.STAGE else rects[src_name][1]
            dsts = [lay.rect if t.dst == pl.STAGE else rects[t.dst][1 if t.to_edge else 0]
                    for t in ts]
            foot = src
            for dst in dsts:
                foot = foot.bbox(dst)
            name = f"{data}:{src_name}->{'+'.join(t.dst for t in ts)}".replace("@", "")
            b.route("transfer", name, foot, hops=max(manhattan(src, dst) for dst in dsts),
                    bytes_per_token=ts[0].nbytes, stage=stage.id,
                    src=ks[src_name].id if src_name in ks else ks["attention"].id,
                    dst=[ks[t.dst].id if t.dst in ks else ks["attention"].id for t in ts])
        if give_up_early:
            # This stage's own routes: a part of them all, enough to prove the colors short.
            crowded, x, y = crowding(b.routes[first_route:], lay.rect)
            if crowded > budget:
                exc = ColorsExhausted(f"colors run out: {crowded} routes cross PE ({x}, {y}) "
                                      f"of stage {index}, where {fabric.name} leaves {budget}")
                exc.layers_per_stage = layers_per_stage
                raise exc

    # Between stages, between wafers, and the token I/O.
    for i in range(1, len(flat)):
        b.connect(f"stage{i - 1}->stage{i}", homes[i - 1], homes[i],
                  ly.carried_values(model, flat[i - 1].spec.experts) * d, stage=i)
    first, last = named[0], named[-1]
    if options.ends_shared:
        # The embedding and LM head are another program's (an mtp draft's target's): the
        # hidden state and the next token's embedding come in at the first stage's home,
        # and the hidden state leaves from the last's for that program's LM head.
        home_in, home_out = first[ly.home_site(model)], last[ly.home_site(model)]
        b.edge_route("io_in", "target->stage0", rects_edge(home_in), bytes_per_token=2 * h * d,
                     dst=[home_in.id])
        b.edge_route("io_out", "stage->target", rects_edge(home_out), bytes_per_token=h * d,
                     src=home_out.id)
    else:
        head = last["lm_head"]
        if model.tie_embeddings:
            gather = b.kernel(b.stages[-1], "embedding", "gather", head.rect, layers=1,
                              ops=["embedding"], matrix=list(head.matrix),
                              grid=list(head.grid), k_axis=head.k_axis, weight_ref=head.id,
                              root=head.root,
                              pattern={ph: b.pattern_name("gather", ph) for ph in ly.PHASES})
            first["embedding"] = gather
            b.connect("embedding->stage0", gather.rect, homes[0], h * d, stage=0)
        b.edge_route("io_in", "tokens->embedding", first["embedding"].rect, bytes_per_token=4,
                     dst=[first["embedding"].id])
        b.edge_route("io_out", "lm_head->host", rects_edge(head), bytes_per_token=4,
                     src=head.id)

    try:
        colors = assign_colors(b.routes, fabric, lambda r: _describe_route(r, b.stages),
                               held_back)
    except ColorsExhausted as exc:
        exc.layers_per_stage = layers_per_stage
        raise
    check_colors(b.routes)
    arrays = kv_plan(b, model, fabric)
    template = RegionTemplate(
        part_shapes=part_shapes, stages=b.stages, kernels=b.kernels, routes=b.routes,
        arrays=arrays, placement=placement_report(flat, homes, model),
        kv_capacity_tokens=min((s.kv_capacity_tokens for s in b.stages if s.has_attention),
                               default=0),
        weight_bytes=sum(k.weight_bytes for k in b.kernels), colors_used=colors, bounds={})
    template.bounds = region_bounds(template, named, homes, model, fabric, options)
    return template


def rects_edge(k: Kernel) -> Rect:
    r = k.rect
    if k.root == "east":
        return Rect(r.system, r.x1 - 1, r.y, 1, r.h)
    if k.root == "west":
        return Rect(r.system, r.x, r.y, 1, r.h)
    if k.root == "south":
        return Rect(r.system, r.x, r.y1 - 1, r.w, 1)
    return Rect(r.system, r.x, r.y, r.w, 1)


def _describe_route(route: Route, stages: list[Stage]) -> str:
    where = f"stage {route.stage}" if route.stage is not None else "the region"
    return f"route {route.name} in {where} ({route.footprint})"

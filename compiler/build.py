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

from wse_emu import layer as ly
from wse_emu.compiler import placement as pl
from wse_emu.compiler.geometry import even_split
from wse_emu.compiler.kvplan import kv_plan
from wse_emu.compiler.layout import StageLayout
from wse_emu.compiler.region_report import placement_report, region_bounds
from wse_emu.compiler.routing import ColorsExhausted, assign_colors, check_colors, manhattan
from wse_emu.compiler.stages import home_strip
from wse_emu.compiler.tiling import block_bytes, vector_bytes
from wse_emu.kernels import kvlayout
from wse_emu.kernels.primitives import CostModel
from wse_emu.kernels.trees import MAX_LEVELS, choose_levels
from wse_emu.model import ModelSpec
from wse_emu.program import Kernel, Rect, Route, Stage

INPUT_FIFO_BYTES = 64  # wavelets queued at a matrix kernel's input before its tasks take them


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


MATRIX_PATTERNS = {"decode": "gemv_tree", "prefill": "gemm_stream"}
EXPERT_PATTERNS = {"decode": "expert_runs", "prefill": "expert_runs"}
GATHER_PATTERNS = {"decode": "row_gather", "prefill": "row_gather"}
EDGE = {("x", True): "east", ("x", False): "west", ("y", True): "south", ("y", False): "north"}


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
        self.d = model.dtype_bytes
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

    def matrix_kernel(self, stage, lay, strip, body, edge, high) -> Kernel:
        d = self.d
        e, short = lay.extents[strip.name], lay.short
        kind = "gather" if strip.name == "embedding" else "matrix"
        vec_bytes = sum(length * strip.vector_layers[n] * d for n, length in strip.vectors.items()
                        if n.endswith("_bias"))
        matrix = strip.shape(short)
        # K splits along the strip (``a``) and N across it (``b``); a transposed strip splits
        # K across the stage and N along the strip, its sums meeting at one side.
        flip = lay.transposed(strip.name)
        k_parts, n_parts = (short, e) if flip else (e, short)
        k_axis = ("y" if lay.axis == "x" else "x") if flip else lay.axis
        w = block_bytes(*matrix, k_parts, n_parts, strip.layers,
                        strip.bytes_per_weight)  # (n_parts, k_parts)
        k = self.kernel(stage, strip.name, kind, body, layers=strip.layers,
                        ops=[strip.name], matrix=list(matrix), grid=[k_parts, n_parts],
                        k_axis=k_axis,
                        # a packed format's blocks round up to whole bytes
                        weight_bytes=int(w.sum()) + vec_bytes,
                        root=EDGE[(k_axis, high)],
                        pattern=GATHER_PATTERNS if kind == "gather"
                        else EXPERT_PATTERNS if strip.experts else MATRIX_PATTERNS)
        # Inputs stream through a small FIFO (each arriving element triggers an update of the
        # PE's partial sums), so the buffer holds the partial sums of buffer_tokens tokens; a
        # gather holds its output row slices and the token ids.
        out_seg = even_split(matrix[1], n_parts)[:, None] * np.ones((1, k_parts), np.int64)
        per_token = out_seg * d + (ly.TOKEN_ID_BYTES if kind == "gather" else 0)
        # An expert strip's PE keeps one token's partial sums: it works for a token only
        # when the token routes to its experts, one such token after another.
        tokens = 1 if strip.spread_vectors else self.options.buffer_tokens
        act = per_token * tokens + INPUT_FIFO_BYTES
        if k_axis == "y":  # arrays are (y, x): K parts along y
            w, act = w.T, act.T
        self.add("weights", body, w)
        self.add("activations", body, act)
        for name, length in strip.vectors.items():
            if not name.endswith("_bias"):
                continue
            per_pe = vector_bytes(length, n_parts, strip.vector_layers[name], d)
            if strip.spread_vectors:
                # Each row's values split along the strip; the root takes them in with the
                # partial sums.
                rows = even_split(length, short)
                grid = np.stack([even_split(int(r), e) for r in rows]) \
                    * (strip.vector_layers[name] * d)  # (short, e)
                self.add("weights", body, grid.T if lay.axis == "y" else grid)
            else:
                self.add("weights", edge, self.line(edge, per_pe))
        # The kernel's internal collectives: inputs broadcast across the strip, partial sums
        # reduced along it by a tree of as many levels as the cost model finds fastest for a
        # decode token (one color per level).
        self.route("broadcast", f"{strip.name}.bcast", body, src=k.id, dst=[k.id], stage=stage.id)
        if kind == "matrix":
            # Gate's and up's experts reduce on their own runs of columns.
            per_run = strip.k // matrix[0]  # gate's and up's experts sharing a run
            length = k_parts if not strip.experts or strip.experts_summed else \
                min(e, -(-e // (strip.experts // per_run)) + 1)
            k.trees["reduce"] = self.tree_levels(length, -(-matrix[1] // n_parts))
        levels = 0 if k_parts == 1 else k.trees.get("reduce", 0)
        for level in range(levels):
            self.route("reduce", f"{strip.name}.reduce{level + 1}", body, src=k.id, dst=[k.id],
                       stage=stage.id)
        return k

    def tree_levels(self, length: int, values: int, value_bytes: int | None = None) -> int:
        """Levels of a reduce of ``values`` numbers along ``length`` PEs."""
        nbytes = value_bytes or self.d
        message = -(-values * nbytes // 4)  # wavelets
        add = float(self.cost.add(np.array([values]), nbytes)[0])
        return choose_levels(length, message, add, self.fabric.hop_latency_cycles,
                             self.max_levels)

    def line(self, edge: Rect, values: np.ndarray) -> np.ndarray:
        return values[:, None] if edge.w == 1 else values[None, :]

    def vector_kernel(self, stage, name, kind, edge: Rect, length: int, layers: int,
                      weights: bool, ops: list[str], buffers: int = 1) -> Kernel:
        """A kernel on a line; ``buffers``: vectors of ``length`` it keeps per buffered
        token (0: it works in place)."""
        d = self.d
        pes = edge.area
        k = self.kernel(stage, name, kind, edge, layers=layers, ops=ops, length=length,
                        weight_bytes=length * layers * d if weights else 0,
                        pattern={"decode": kind, "prefill": kind})
        if weights:
            self.add("weights", edge, self.line(edge, vector_bytes(length, pes, layers, d)))
        if buffers:
            seg = even_split(length, pes) * (self.options.buffer_tokens * d * buffers)
            self.add("activations", edge, self.line(edge, seg))
        if kind == "norm":
            k.trees["reduce"] = self.tree_levels(pes, 1, ly.SUM_BYTES)
            self.line_reduce(k, stage)
        if kind == "route":
            # Each PE's best k candidates (weight and expert id) meet along the line.
            top_k = self.model.experts_per_token
            k.trees["reduce"] = self.tree_levels(pes, top_k, self.d + ly.TOKEN_ID_BYTES)
            self.line_reduce(k, stage)
        return k


def assemble(model, fabric, part_shapes, layouts, options, max_levels) -> RegionTemplate:
    b = _Builder(model, fabric, part_shapes, options, max_levels)
    d = model.dtype_bytes
    h = model.hidden_size
    flat = [lay for part in layouts for lay in part]
    homes: list[Rect] = []
    named: list[dict[str, Kernel]] = []
    for index, lay in enumerate(flat):
        spec = lay.spec
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
            ks[name] = b.matrix_kernel(stage, lay, strips[name], body, edge, lay.roots[name])
        home = home_strip(spec).name
        home_edge = rects[home][1]
        homes.append(home_edge)

        def edge_of(site: str) -> Rect:
            return home_edge if site == ly.HOME else rects[site][1]

        def vector_kernels(ops: list[ly.Op], layers: int) -> None:
            for op in ops:
                if op.kernel_kind not in ("norm", "elementwise", "route"):
                    continue
                edge = edge_of(op.site)
                if op.kernel_kind == "route":  # on the router's edge, over its E logits
                    ks[op.kernel] = b.vector_kernel(stage, op.kernel, op.kernel_kind, edge,
                                                    strips[op.site].n, layers, False,
                                                    [op.name])
                    continue
                if op.site in strips and strips[op.site].experts:
                    # Where an expert strip's experts leave their outputs, each on the root
                    # end of its run of columns: the kernel spans the strip. It works in
                    # place on the strip's sums (its buffers hold them); what arrives from
                    # another strip (the gate's values beside up's) streams through a FIFO.
                    body = rects[op.site][0]
                    spec_strip = strips[op.site]
                    ks[op.kernel] = b.vector_kernel(
                        stage, op.kernel, op.kernel_kind, body, spec_strip.n *
                        spec_strip.experts, layers, False, [op.name], buffers=0)
                    b.add("activations", body, INPUT_FIFO_BYTES)
                    continue
                if op.kind == ly.HEAD_RMSNORM:
                    # One head's scale, owned once along the line; each PE keeps a copy of
                    # the entries its segment of the heads uses, as a buffer.
                    ks[op.kernel] = b.vector_kernel(stage, op.kernel, op.kernel_kind, edge,
                                                    op.length, layers, False, [op.name])
                    ks[op.kernel].weight_bytes = op.weight_params * layers * d
                    b.add("weights", edge, b.line(edge, vector_bytes(
                        op.weight_params, edge.area, layers, d)))
                    b.add("activations", edge, b.line(edge, even_split(
                        op.length, edge.area) * layers * d))
                    continue
                ks[op.kernel] = b.vector_kernel(stage, op.kernel, op.kernel_kind, edge,
                                                op.length, layers, op.weight_params > 0,
                                                [op.name])

        n = spec.num_layers
        if spec.has_embedding:
            vector_kernels(ly.input_ops(model), 1)
        if n:
            for op in ly.part_ops(model, spec.experts):
                if op.kernel_kind == "attention":
                    if "attention" not in ks:
                        ks["attention"] = _attention_kernel(b, stage, lay, model, d)
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

    # Between stages, between wafers, and the token I/O.
    for i in range(1, len(flat)):
        b.connect(f"stage{i - 1}->stage{i}", homes[i - 1], homes[i],
                  ly.carried_values(model, flat[i - 1].spec.experts) * d, stage=i)
    first, last = named[0], named[-1]
    head = last["lm_head"]
    if model.tie_embeddings:
        gather = b.kernel(b.stages[-1], "embedding", "gather", head.rect, layers=1,
                          ops=["embedding"], matrix=list(head.matrix), grid=list(head.grid),
                          k_axis=head.k_axis, weight_ref=head.id, root=head.root,
                          pattern=GATHER_PATTERNS)
        first["embedding"] = gather
        b.connect("embedding->stage0", gather.rect, homes[0], h * d, stage=0)
    b.edge_route("io_in", "tokens->embedding", first["embedding"].rect, bytes_per_token=4,
                 dst=[first["embedding"].id])
    b.edge_route("io_out", "lm_head->host", rects_edge(head), bytes_per_token=4, src=head.id)

    held_back = 1 if options.plan == "disaggregated" else 0
    try:
        colors = assign_colors(b.routes, fabric, lambda r: _describe_route(r, b.stages),
                               held_back)
    except ColorsExhausted as exc:
        exc.layers_per_stage = max(lay.spec.num_layers for lay in flat)
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


def _attention_kernel(b: "_Builder", stage: Stage, lay: StageLayout, model: ModelSpec,
                      d: int) -> Kernel:
    ops = [op for op in ly.layer_ops(model) if op.kernel == "attention"]
    att = b.kernel(stage, "attention", "attention", lay.rect, ops=[op.name for op in ops],
                   pattern={"decode": "attention_kv_spread", "prefill": "attention_kv_spread"})
    sinks = sum(op.weight_params for op in ops)  # gpt-oss: a logit per query head
    if sinks:
        # Owned once, a head's sink on the first PE of the stage's line that takes its
        # softmax.
        att.weight_bytes = sinks * stage.num_layers * d
        b.add("weights", Rect(lay.rect.system, lay.rect.x, lay.rect.y, lay.rect.w, 1)
              if lay.axis == "x" else Rect(lay.rect.system, lay.rect.x, lay.rect.y, 1,
                                           lay.rect.h),
              _sink_split(sinks, lay.long, stage.num_layers * d, lay.axis))
    # Attention works one query head at a time on each PE: its query, its output
    # accumulator, and the softmax running max and sum in FP32.
    b.add("activations", lay.rect, (2 * model.head_dim) * d + 2 * ly.SUM_BYTES)
    # Its trees, sized for a decode token at the bound's context: partial scores of a head
    # over the head's rows, partial outputs (a row's features of the group's query heads,
    # with their max and sum) along the long side.
    features = int(kvlayout.row_features(model.kv_size, lay.short).max())
    heads_per_row = max(1, -(-model.num_kv_heads // lay.short))
    rows_per_head = max(1, lay.short // model.num_kv_heads)
    scores = model.group_size * heads_per_row * -(-b.options.bound_decode_context // lay.long)
    att.trees["across"] = b.tree_levels(rows_per_head, scores)
    att.trees["along"] = b.tree_levels(
        lay.long, model.group_size * (features + 2 * heads_per_row))
    # One color per level; the two trees run one after the other on crossing axes, so they
    # share their colors, the routes switched between the axes at run time (as WaferLLM's
    # WSE-3 code reconfigures one set of colors per axis).
    levels = max(att.trees["along"] if lay.long > 1 else 0,
                 att.trees["across"] if rows_per_head > 1 else 0)
    for level in range(levels):
        b.route("reduce", f"attention.reduce{level + 1}", lay.rect, src=att.id, dst=[att.id],
                stage=stage.id)
    return att


def _sink_split(sinks: int, long: int, bytes_each: int, axis: str) -> np.ndarray:
    """The sinks spread evenly over the stage's first line along its long side."""
    per_pe = even_split(sinks, long) * bytes_each
    return per_pe[None, :] if axis == "x" else per_pe[:, None]


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

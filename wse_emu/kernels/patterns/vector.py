"""Kernels on a line of PEs: norms (``norm``) and elementwise ops (``elementwise``).

A vector op runs where its operands already are: on the root edge line of a strip (the
residual stream on the home line, q and k on theirs), each PE working on its segment of the
vector for every token, or on an expert strip's runs for the routed tokens only. A norm sums
the squares of its segment, all-reduces the sums along the line (per head's PEs for a
per-head norm, Qwen3's and Gemma-3's q/k norms) by the kernel's tree and a broadcast back,
then scales its segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.functional.ops import SWIGLU_ALPHA, gelu_tanh, rotary, silu
from wse_emu.functional.tiles import VectorTiles
from wse_emu.functional.trees import tree_reduce
from wse_emu.kernels.blocks import vector_bytes
from wse_emu.kernels.bounds import ceil_div, port_cycles, result
from wse_emu.kernels.patterns.base import Pattern, Tile, register
from wse_emu.kernels.patterns.matrix import INPUT_FIFO_BYTES
from wse_emu.kernels.primitives import line_broadcast, line_reduce, wavelets
from wse_emu.models import layer as ly
from wse_emu.util.splits import even_split


@dataclass(frozen=True)
class Site:
    """Where the compiler puts a line kernel: the edge line it runs on and, when that is a
    strip's, the strip's body and its description (``compiler.stages.StripSpec``)."""

    edge: object  # Rect
    body: object = None  # Rect, or None
    strip: object = None  # StripSpec, or None


def plan_line(b, stage, op: ly.Op, rect, length: int, layers: int, weights: bool,
              buffers: int = 1):
    """A line kernel on ``rect`` running ``op``, over vectors of ``length`` per token: its
    weights (a vector of ``length`` per layer, owned once along the line) if ``weights``,
    and ``buffers`` vectors per buffered token (0: it works in place). ``b`` is the
    compiler's region builder."""
    d, pes = b.d, rect.area
    kind = op.kernel_kind
    k = b.kernel(stage, op.kernel, kind, rect, layers=layers, ops=[op.name], length=length,
                 weight_bytes=length * layers * d if weights else 0,
                 pattern={phase: b.pattern_name(kind, phase) for phase in ly.PHASES})
    if weights:
        b.add("weights", rect, b.line(rect, vector_bytes(length, pes, layers, d)))
    if buffers:
        seg = even_split(length, pes) * (b.options.buffer_tokens * d * buffers)
        b.add("activations", rect, b.line(rect, seg))
    return k


def line_pes(sg, kernel) -> np.ndarray:
    """The PEs of a line kernel's rectangle, in stage coordinates."""
    r, st = kernel.rect, sg.stage.rect
    xs, ys = np.meshgrid(np.arange(r.x, r.x1) - st.x, np.arange(r.y, r.y1) - st.y)
    return sg.g.pe(xs.ravel(), ys.ravel())


def vector_tasks(sg, tile: Tile, name: str, pes: np.ndarray, inputs: list[np.ndarray],
                 sizes: np.ndarray, cost: ly.PerElement | None = None, counted: bool = True,
                 axis=None) -> np.ndarray:
    """An elementwise op on a line: reads its operands, writes one result per element (on an
    expert axis, ``axis``, per routed token's element)."""
    t = sg.step_tokens(name, tile)
    cost = cost or ly.ELEMENTWISE[sg.ops[name].kind]
    elements = sizes * t if axis is None else axis.split(sizes)
    tasks = sg.work(pes, ly.elementwise_work(cost, elements, sg.d), name, counted)
    for ready in inputs:
        sg.g.then(ready, tasks)
    return tasks


def swiglu_clamped(model, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's SwiGLU: the gate clamped above, the up value on both sides, at the model's
    limit; (up + 1) * gate * sigmoid(1.702 gate). An expert no token routed to has a zero
    gate, and stays zero."""
    limit = np.float32(model.experts.swiglu_limit)
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    glu = gate * (np.float32(0.5) * (np.float32(1) + np.tanh(np.float32(0.5) * SWIGLU_ALPHA
                                                              * gate)))
    return (up + 1) * glu


def combine(fs, act: np.ndarray, route) -> np.ndarray:
    """Each routed activation times its token's router weight for that expert."""
    chosen, weights = route
    e, m = fs.model.experts.count, fs.model.experts.intermediate_size
    per_expert = np.zeros((len(chosen), e), np.float32)
    np.put_along_axis(per_expert, chosen, weights, axis=-1)
    return act * np.repeat(per_expert[:, slice(*fs.held)], m, axis=1)


# What each elementwise op computes, from its inputs' values (its layer: ``index`` of the
# stage, for the rotary embedding's frequencies).
ELEMENTWISE_COMPUTE = {
    ly.ADD: lambda fs, op, index, a, b: a + b,
    ly.SILU_MUL: lambda fs, op, index, gate, up: silu(gate) * up,
    ly.GELU_MUL: lambda fs, op, index, gate, up: gelu_tanh(gate) * up,
    ly.SWIGLU_CLAMPED: lambda fs, op, index, gate, up: swiglu_clamped(fs.model, gate, up),
    ly.COMBINE: lambda fs, op, index, act, route: combine(fs, act, route),
    ly.ROPE: lambda fs, op, index, x: rotary(x, fs.positions, fs.model,
                                             fs.stage.layers[0] + index),
}


class Elementwise(Pattern):
    kind = "elementwise"
    name = "elementwise"

    def compute(self, fs, op, index, *inputs):
        return ELEMENTWISE_COMPUTE[op.kind](fs, op, index, *inputs)

    def plan(self, b, stage, op: ly.Op, layers: int, site: Site):
        if site.strip is not None and site.strip.experts:
            # Where an expert strip's experts leave their outputs, each on the root end of its
            # run of columns: the kernel spans the strip. It works in place on the strip's
            # sums (its buffers hold them); what arrives from another strip (the gate's values
            # beside up's) streams through a FIFO.
            k = plan_line(b, stage, op, site.body, site.strip.n * site.strip.experts, layers,
                          False, buffers=0)
            b.add("activations", site.body, INPUT_FIFO_BYTES)
            return k
        return plan_line(b, stage, op, site.edge, op.length, layers, op.weight_params > 0)

    def expand(self, sg, tile: Tile, name: str, pes: np.ndarray, inputs: list[np.ndarray],
               sizes: np.ndarray, axis=None) -> np.ndarray:
        return vector_tasks(sg, tile, name, pes, inputs, sizes, axis=axis)

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        first = ops[0]
        t, d = ly.op_tokens(first, mb), model.storage.dtype_bytes
        fpc = fabric.flops_per_cycle(d)
        site = ly.kernel_ops(model, part).get(first.site)  # the strip the op runs on
        if site and site[0].kind == ly.EXPERT_GEMM:
            # Where an expert strip's runs leave their outputs: only the routed tokens'
            # values are worked on, which the strip's PEs share at best evenly (a split
            # layer's part: only the pairs no routing can send to the other part's experts).
            held = site[0]
            pairs = max(0, held.top_k - (held.total_experts - held.experts)) / held.top_k
            compute, sram = port_cycles(ly.elementwise_work(
                ly.ELEMENTWISE[first.kind], t * first.length * pairs / kernel.rect.area, d),
                fabric, fpc)
            return result(fabric, compute, sram, 0, 0)
        # Elementwise ops work where their operands already are.
        seg = ceil_div(kernel.length, kernel.rect.area)
        compute, sram = port_cycles(ly.elementwise_work(ly.ELEMENTWISE[first.kind], t * seg,
                                                        d), fabric, fpc)
        return result(fabric, compute, sram, 0, 0)

    def alone(self, sg, kernel, tile: Tile) -> None:
        pes = line_pes(sg, kernel)
        kind = sg.kind[kernel.name]
        inputs = [sg.g.tasks(pes, 0, kind) for _ in sg.ops[kernel.name].inputs]
        self.expand(sg, tile, kernel.name, pes, inputs, even_split(kernel.length, len(pes)))


class LineNorm(Pattern):
    kind = "norm"
    name = "norm"

    def load(self, fs, kernel, op, weights, layers) -> None:
        fs.vectors[kernel.name] = VectorTiles.build(fs.norm_weights_of(op, weights, layers),
                                                    kernel.rect.area, fs.numerics)

    def compute(self, fs, op, index, x):
        if op.kind == ly.HEAD_RMSNORM:
            return head_norm(fs, op, index, x)
        return norm(fs, op.name, index, x)

    def plan(self, b, stage, op: ly.Op, layers: int, site: Site):
        edge, d = site.edge, b.d
        if op.kind == ly.HEAD_RMSNORM:
            # One head's scale, owned once along the line; each PE keeps a copy of the
            # entries its segment of the heads uses, as a buffer.
            k = plan_line(b, stage, op, edge, op.length, layers, False)
            k.weight_bytes = op.weight_params * layers * d
            b.add("weights", edge, b.line(edge, vector_bytes(op.weight_params, edge.area,
                                                             layers, d)))
            b.add("activations", edge, b.line(edge, even_split(op.length, edge.area)
                                              * layers * d))
        else:
            k = plan_line(b, stage, op, edge, op.length, layers, op.weight_params > 0)
        # The sums of squares meet along the line by a tree, and return.
        k.trees["reduce"] = b.tree_levels(edge.area, 1, ly.SUM_BYTES)
        b.line_reduce(k, stage)
        return k

    def expand(self, sg, tile: Tile, name: str, pes: np.ndarray, inputs: list[np.ndarray],
               sizes: np.ndarray, axis=None) -> np.ndarray:
        """RMSNorm on a line: local sums of squares, an all-reduce along the line (per head's
        PEs for a per-head norm), scaling. (A norm of routed values is not modelled: its
        ``axis`` must be None.)"""
        (ready,) = inputs
        kind, d = sg.kind[name], sg.d
        t = sg.step_tokens(name, tile)
        seg = sizes * t
        squares = sg.work(pes, ly.elementwise_work(ly.NORM_SQUARES, seg, d), name)
        sg.g.then(ready, squares)
        groups = self.groups(sg, name, len(pes))
        got = squares.copy()
        for size in sorted({len(gr) for gr in groups} - {1}):
            lines = pes[np.stack([gr for gr in groups if len(gr) == size])]
            ready_lines = squares[np.stack([gr for gr in groups if len(gr) == size])]
            n_lines = len(lines)
            one = np.full(n_lines, t)
            total = line_reduce(sg.g, lines, np.zeros(n_lines, np.int64), ready_lines,
                                wavelets(one, ly.SUM_BYTES), sg.cost.add(one, ly.SUM_BYTES),
                                kind, levels=sg.kernels[name].trees.get("reduce", 2))
            back = line_broadcast(sg.g, lines, np.zeros(n_lines, np.int64), total,
                                  wavelets(one, ly.SUM_BYTES), kind)
            for gr, tasks in zip([gr for gr in groups if len(gr) == size], back):
                got[gr] = tasks
        scale = sg.work(pes, ly.elementwise_work(ly.NORM_SCALE, seg, d), name)
        sg.g.then(got, scale)
        sg.g.then(squares, scale)
        return scale

    @staticmethod
    def groups(sg, name: str, n: int) -> list[np.ndarray]:
        """PEs of a norm's line whose sums of squares meet: the whole line, or for a norm
        over each head's features, the PEs holding one head (one each when a PE holds whole
        heads)."""
        op = sg.ops[name]
        if op.kind != ly.HEAD_RMSNORM:
            return [np.arange(n)]
        heads = op.length // sg.model.attention.head_dim
        if n <= heads:
            return [np.array([p]) for p in range(n)]
        owner = (np.arange(n) * heads) // n
        return [np.flatnonzero(owner == h) for h in range(heads)]

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        first = ops[0]
        t, d = ly.op_tokens(first, mb), model.storage.dtype_bytes
        pes = kernel.rect.area
        seg = ceil_div(kernel.length, pes)
        work = ly.elementwise_work(ly.NORM_SQUARES, t * seg, d) + ly.elementwise_work(
            ly.NORM_SCALE, t * seg, d)
        compute, sram = port_cycles(work, fabric, fabric.flops_per_cycle(d))
        # The sum of squares meets somewhere on the line and returns: at least the line's
        # radius each way. A norm over the whole vector needs all of it first; a per-head
        # norm only its head.
        radius = ceil_div(pes - 1, 2)
        path = 2 * fabric.hop_latency_cycles * radius \
            + (2 * fabric.ramp_latency_cycles if pes > 1 else 0)
        return result(fabric, compute, sram,
                      t * ly.SUM_BYTES / fabric.link_bytes_per_cycle if pes > 1 else 0, path,
                      whole_input=first.kind != ly.HEAD_RMSNORM)

    def alone(self, sg, kernel, tile: Tile) -> None:
        pes = line_pes(sg, kernel)
        self.expand(sg, tile, kernel.name, pes, [sg.g.tasks(pes, 0, sg.kind[kernel.name])],
                    even_split(kernel.length, len(pes)))


def norm(fs, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    """RMSNorm: each PE of the line sums the squares of its segment, the sums meet at the
    line's first PE by the tree and return, and each PE scales its own segment."""
    tiles = fs.vectors[name]
    bounds = np.concatenate([[0], np.cumsum(tiles.sizes)])
    squares = np.stack([np.sum(x[:, a:b] * x[:, a:b], axis=1)
                        for a, b in zip(bounds[:-1], bounds[1:])])  # (pes, t)
    total = tree_reduce(squares, 0, np.add, levels=fs.kernels[name].trees.get("reduce", 2))
    inv_rms = 1.0 / np.sqrt(total / x.shape[1] + np.float32(fs.model.norm.eps))
    return fs.numerics.round(x * inv_rms.astype(np.float32)[:, None] * _scale(
        fs.model, tiles.vector(layer)))


def _scale(model, weight: np.ndarray) -> np.ndarray:
    """A norm's weights as applied: Gemma scales by (offset + w)."""
    offset = model.norm.weight_offset
    return weight + np.float32(offset) if offset else weight


def head_norm(fs, op: ly.Op, layer: int, x: np.ndarray) -> np.ndarray:
    """RMSNorm of each head's features: each PE sums the squares of its segment per head it
    holds, the sums of a head meet by the tree over the PEs that hold it, and each PE scales
    its own segment."""
    tiles = fs.vectors[op.name]
    hd = fs.model.attention.head_dim
    t, width = x.shape
    heads = width // hd
    bounds = np.concatenate([[0], np.cumsum(tiles.sizes)])
    head_of = np.arange(width) // hd
    squares = np.zeros((len(tiles.sizes), t, heads), np.float32)
    for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        for h in np.unique(head_of[a:b]):
            cols = np.arange(a, b)[head_of[a:b] == h]
            squares[p, :, h] = np.sum(x[:, cols] * x[:, cols], axis=1)
    total = tree_reduce(squares, 0, np.add)  # (t, heads)
    inv_rms = 1.0 / np.sqrt(total / hd + np.float32(fs.model.norm.eps))
    per_element = np.repeat(inv_rms.astype(np.float32), hd, axis=1)
    return x * per_element * _scale(fs.model, tiles.vector(layer))


register(Elementwise())
register(LineNorm())

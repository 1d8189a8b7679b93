"""A mixture of experts' router (``route``): each token's top-k experts and their weights,
picked on the router strip's edge line, where its logits are."""

from __future__ import annotations

import numpy as np

from wse_emu.functional.ops import softmax
from wse_emu.kernels.bounds import ceil_div, result
from wse_emu.kernels.patterns.base import Pattern, Tile, register
from wse_emu.kernels.patterns.vector import Site, line_pes, plan_line
from wse_emu.kernels.primitives import line_reduce, wavelets
from wse_emu.models import layer as ly
from wse_emu.util.splits import even_split


class TopK(Pattern):
    kind = "route"
    name = "route"

    def plan(self, b, stage, op: ly.Op, layers: int, site: Site):
        """On the router's edge line, over its E logits; each PE's best k candidates (weight
        and expert id) meet along the line by a tree."""
        k = plan_line(b, stage, op, site.edge, site.strip.n, layers, False)
        k.trees["reduce"] = b.tree_levels(site.edge.area, op.length,
                                          b.d + ly.TOKEN_ID_BYTES)
        b.line_reduce(k, stage)
        return k

    def expand(self, sg, tile: Tile, op: ly.Op, pes: np.ndarray, ready: np.ndarray,
               sizes: np.ndarray) -> tuple[int, int]:
        """Each PE scores its share of the experts (the softmax's terms and k passes of
        comparisons), the PEs' best k candidates meet at the line's first PE by the tree,
        which writes each token's k weights and expert ids. Returns (that PE, its final
        task)."""
        d, t, k = sg.d, sg.step_tokens(op.name, tile), op.length
        kind = sg.kind[op.kernel]
        scored = sg.work(pes, ly.Work(t * sizes * (ly.SOFTMAX_FLOPS + k), t * sizes * d, 0),
                         op.kernel)
        sg.g.then(ready, scored)
        message = np.array([t * k])
        met = line_reduce(sg.g, pes[None, :], np.array([0]), scored[None, :],
                          wavelets(message, d + ly.TOKEN_ID_BYTES),
                          sg.cost.add(message, d + ly.TOKEN_ID_BYTES), kind,
                          levels=sg.kernels[op.kernel].trees.get("reduce", 2))
        chosen = sg.work(pes[:1], ly.Work(0, 0, t * k * (d + ly.TOKEN_ID_BYTES)), op.kernel)
        sg.g.then(met, chosen)
        return pes[0], chosen[0]

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        # Each PE scores its share of the experts' logits; the candidates meet on the line.
        pes = kernel.rect.area
        cost = ly.op_cost(ops[0], model, mb)
        compute = cost.flops / (pes * fabric.flops_per_cycle(model.storage.dtype_bytes))
        radius = ceil_div(pes - 1, 2)
        path = 2 * fabric.hop_latency_cycles * radius \
            + (2 * fabric.ramp_latency_cycles if pes > 1 else 0)
        sram = cost.act_in_bytes / (pes * fabric.sram_read_bytes_per_cycle)
        return result(fabric, compute, sram, 0, path, whole_input=True)

    def compute(self, fs, op, index, logits):
        """Each token's k experts and their weights, from the router's logits on its line:
        the PEs' best candidates meet by the tree, ties going to the lower expert, as a
        stable sort orders them. Mixtral and Qwen3 take the softmax over every expert first
        (its max and sum all-reduced along the line) and renormalize the k chosen weights
        where the model does; gpt-oss takes the softmax of the k chosen logits. The choices
        stay on ``fs`` for the experts' strips."""
        model = fs.model
        k = model.experts.top_k
        if model.family_record.softmax_after_topk:
            chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
            fs.routed = chosen, softmax(np.take_along_axis(logits, chosen, axis=-1))
            return fs.routed
        probs = softmax(logits)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        if model.experts.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        fs.routed = chosen, fs.numerics.round(weights)  # down's biases are weighted too
        return fs.routed

    def alone(self, sg, kernel, tile: Tile) -> None:
        pes = line_pes(sg, kernel)
        op = sg.ops[kernel.name]
        self.expand(sg, tile, op, pes, sg.g.tasks(pes, 0, sg.kind[kernel.name]),
                    even_split(kernel.length, len(pes)))


register(TopK())

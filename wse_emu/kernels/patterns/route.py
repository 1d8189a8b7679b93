"""A mixture of experts' router (``route``): each token's top-k experts and their weights,
picked on the router strip's edge line, where its logits are."""

from __future__ import annotations

import numpy as np

from wse_emu import layer as ly
from wse_emu.kernels.bounds import ceil_div, result
from wse_emu.kernels.patterns import Pattern, Tile, register
from wse_emu.kernels.patterns.vector import Site, plan_line
from wse_emu.kernels.primitives import line_reduce, wavelets


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
        compute = cost.flops / (pes * fabric.flops_per_cycle(model.dtype_bytes))
        radius = ceil_div(pes - 1, 2)
        path = 2 * fabric.hop_latency_cycles * radius \
            + (2 * fabric.ramp_latency_cycles if pes > 1 else 0)
        sram = cost.act_in_bytes / (pes * fabric.sram_read_bytes_per_cycle)
        return result(fabric, compute, sram, 0, path, whole_input=True)

    def alone(self, sg, kernel, tile: Tile) -> None:
        raise ValueError(f"no pattern for kernel kind {kernel.kind!r}")


register(TopK())

"""The routed MLP's kernel patterns: the router's top-k, the expert strips and the values on
their edges, for the tokens a step routes to each expert.

An expert strip holds the E experts of a projection side by side (``ly.Op.strip_matrix``):
gate and up along their outputs (each row across the strip a range of the E x m columns), down
along its inputs (each column along the strip a range of the E x m rows). A step's tokens pick
their experts as the program's routing draws them (``wse_emu.routing``, one draw per layer and
token tile: ``layer_loads``), so a PE works for exactly the tokens routed to the experts its
block holds, and a popular expert's PEs are the busiest.
"""

from __future__ import annotations

import numpy as np

from wse_emu import layer as ly
from wse_emu.kernels.primitives import VC_TRANSFER, line_broadcast, line_reduce, wavelets
from wse_emu.routing import routing_of


class RoutedAxis:
    """The E x m axis of an expert strip, with the step's token count per element: expert
    e's columns carry as many tokens as were routed to e."""

    def __init__(self, loads: np.ndarray, width: int):
        self.loads = np.asarray(loads, dtype=np.int64)
        self.width = width  # m: one expert's span on the axis
        per_element = np.repeat(self.loads, width)
        self.cum = np.concatenate([[0], np.cumsum(per_element)])
        self.cum_loads = np.concatenate([[0], np.cumsum(self.loads)])

    def values(self, lo, hi) -> np.ndarray:
        """Token-values in elements [lo, hi): each element once per token routed there."""
        return self.cum[np.asarray(hi)] - self.cum[np.asarray(lo)]

    def pairs(self, lo, hi) -> np.ndarray:
        """Token-expert pairs whose expert has an element in [lo, hi) (0 for an empty range)."""
        lo, hi = np.asarray(lo), np.asarray(hi)
        first = lo // self.width
        last = np.maximum(hi - 1, lo) // self.width + 1
        return np.where(hi > lo, self.cum_loads[last] - self.cum_loads[first], 0)

    def split(self, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per piece of the axis split into ``sizes``: (token-values, token-expert pairs)."""
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return self.values(bounds[:-1], bounds[1:]), self.pairs(bounds[:-1], bounds[1:])


def layer_loads(program, model, layer: int, tokens: int, offset: int) -> np.ndarray:
    """Tokens routed to each expert of a stage's ``layer``-th layer in this step's tile. The
    draw is keyed by the layer's place in its stage, so that stages of one shape draw alike
    and one simulation times them all, as for dense stages."""
    return routing_of(program.options).loads(model.num_experts, model.experts_per_token,
                                             tokens, layer, offset)


def route(sg, op: ly.Op, pes: np.ndarray, ready: np.ndarray, sizes: np.ndarray):
    """The router's top-k on its edge line, where the logits are: each PE scores its share
    of the experts (the softmax's terms and k passes of comparisons), the PEs' best k
    candidates meet at the line's first PE by the tree, which writes each token's k weights
    and expert ids. Returns (that PE, its final task)."""
    d, t, k = sg.d, sg.step_tokens(op.name), op.length
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


def deliver_route(sg, src_pe: int, src_ready: int, lines: np.ndarray, targets: np.ndarray,
                  kernel: str) -> None:
    """Each token's k weights and expert ids, from the router's PE to every PE of ``lines``
    (n lines of L PEs, side by side), into ``targets`` (tasks shaped like ``lines``): one
    message to the PE nearest the source, multicast from there across the lines (along the
    n positions at that PE's place in the line) and then along every line."""
    t, k = sg.step.new_tokens, sg.model.experts_per_token
    kind = sg.kind[kernel]
    w = sg.g.width
    size = int(wavelets(np.array([t * k]), sg.d + ly.TOKEN_ID_BYTES)[0])
    dist = np.abs(lines % w - src_pe % w) + np.abs(lines // w - src_pe // w)
    line0, at = np.unravel_index(int(np.argmin(dist)), lines.shape)
    land = lines[line0, at]
    arrived = sg.g.tasks(np.array([land]), 0, kind)
    if land == src_pe:
        sg.g.then(np.array([src_ready]), arrived)
    else:
        sg.g.send(np.array([src_ready]), np.array([src_pe]), np.array([land]),
                  np.array([size]), arrived, 0, VC_TRANSFER)
    n = len(lines)
    # Across the lines, at the landing place: one task per line where its multicast starts.
    starts = line_broadcast(sg.g, lines[:, at][None, :], np.array([line0]), arrived,
                            np.array([size]), kind)[0] if n > 1 else arrived
    if lines.shape[1] > 1:
        line_broadcast(sg.g, lines, np.full(n, at), starts, np.full(n, size), kind,
                       targets=targets)
    else:
        sg.g.then(starts, targets[:, 0])


def expert_matrix(sg, st, op: ly.Op, axis: RoutedAxis, pieces: tuple, routed_input: bool,
                  route_at: tuple[int, int]) -> np.ndarray:
    """An expert strip for the step's routed tokens. Its input, spread over a producer's
    line, is multicast into every line across the strip (gate and up: every token's hidden
    vector, since every column holds a slice of every expert; down: the routed activations,
    each line its experts' range); each PE multiplies for the token-expert pairs its block
    serves; partial sums meet at the root edge by the kernel's tree. Returns the root edge's
    tasks."""
    k, kind = st.kernel, sg.kind[st.kernel.name]
    d = sg.d
    e, s = st.pe.shape
    t = sg.step_tokens(op.name)
    if op.experts_along == "n":
        values, pairs = axis.split(st.n_sizes)  # per row across the strip
        macs = st.k_sizes[:, None] * values[None, :]
        inputs = st.k_sizes[:, None] * pairs[None, :]
        outputs = np.broadcast_to(values[None, :], (e, s))
        reduced = values  # a row's routed token-columns travel to the root
    else:
        values, pairs = axis.split(st.k_sizes)  # per line along the strip
        macs = values[:, None] * st.n_sizes[None, :]
        inputs = np.broadcast_to(values[:, None], (e, s))
        outputs = pairs[:, None] * st.n_sizes[None, :]
        reduced = st.n_sizes * t  # every token's weighted sum over its experts
    # A prefill's multiply runs as a chain of slices of the tokens, as a dense strip's does.
    slices = -(-t // 512) if sg.step.phase == "prefill" else 1
    first = compute = None
    for i in range(slices):
        part = sg.work(st.pe, ly.routed_matrix_work(macs / slices, inputs / slices,
                                                    outputs / slices, d, sg.stored(k.name)),
                       k.name)
        if compute is None:
            first = part
        else:
            sg.g.then(compute, part)
        compute = part
    first, done = first.reshape(e, s), compute.reshape(e, s)
    src_pes, src_sizes, src_ready = pieces
    sg.spread(st, src_pes, src_sizes, src_ready, first,
              axis if routed_input else None)
    deliver_route(sg, *route_at, st.pe, first, k.name)
    rows = np.ascontiguousarray(st.pe.T)
    total = line_reduce(sg.g, rows, np.full(s, st.root), done.T, wavelets(reduced, d),
                        sg.cost.add(reduced, d), kind, levels=k.trees.get("reduce", 2))
    if not op.bias:
        return total
    # Each pair's expert bias (down's weighted by the router) where the sums collect.
    biased_values = values if op.experts_along == "n" else st.n_sizes * t * op.top_k
    biased = sg.work(st.edge, ly.bias_work(1, biased_values, d), k.name)
    sg.g.then(total, biased)
    return biased

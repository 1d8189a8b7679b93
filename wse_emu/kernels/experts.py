"""The routed MLP's geometry and traffic: which tokens a step routes to each expert, where an
expert strip keeps its experts, and how each token's choices reach the PEs that need them (the
router's and the expert strips' patterns are ``kernels.patterns.route`` and ``.experts``).

An expert strip holds the E experts of a projection one after another along the strip
(``ly.Op.strip_matrix``): gate and up in runs of columns, each run a few experts (one, or as many
as keep the rows' shares of their outputs even: ``ly.Op.experts_per_run``) reading the whole
hidden vector, their partial sums meeting on the run; down with its inputs in ``down_order``,
its reduction summing over the experts. A step's tokens pick their experts as the program's
routing draws them (``wse_emu.models.routing``, one draw per token tile and layer: ``layer_loads``),
so a PE works for exactly the tokens routed to the experts its block holds, and a popular
expert's PEs are the busiest.
"""

from __future__ import annotations

import numpy as np

from wse_emu.kernels.primitives import (
    VC_TRANSFER,
    line_broadcast,
    wavelets,
)
from wse_emu.models import layer as ly
from wse_emu.models.routing import routing_of
from wse_emu.util.splits import even_split


class RoutedAxis:
    """An axis of expert values (E experts' m each, in some order), with the step's token
    count per element: an element of expert x carries as many tokens as were routed to x."""

    def __init__(self, loads: np.ndarray, width: int, order: np.ndarray | None = None):
        self.loads = np.asarray(loads, dtype=np.int64)
        # ``width``: one expert's span on the axis; order[i]: the expert-major index of the
        # axis' i-th element (None: expert-major).
        expert = np.arange(len(self.loads) * width) // width
        self.expert = expert if order is None else expert[order]
        self.cum = np.concatenate([[0], np.cumsum(self.loads[self.expert])])

    def values(self, lo, hi) -> np.ndarray:
        """Token-values in elements [lo, hi): each element once per token routed there."""
        return self.cum[np.asarray(hi)] - self.cum[np.asarray(lo)]

    def split(self, sizes: np.ndarray) -> np.ndarray:
        """Token-values per piece of the axis split into ``sizes``."""
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return self.values(bounds[:-1], bounds[1:])

    def tokens_touching(self, sizes: np.ndarray, tokens: int) -> np.ndarray:
        """Per piece: tokens with an expert among its elements (at most every token)."""
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        out = np.array([self.loads[np.unique(self.expert[a:b])].sum() if b > a else 0
                        for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.int64)
        return np.minimum(out, tokens)


def down_order(runs: int, span: int, rows: int) -> np.ndarray:
    """The order of down's inputs along its strip: up leaves each run's ``span`` outputs
    (its experts' side by side) split over the strip's ``rows`` rows; down takes, row by
    row, that row's slice of every run (as expert-major indices, in strip order). A line
    along down then gathers its inputs from a few rows of every run instead of every row of
    one, and every line works for every routed token."""
    sizes = even_split(span, rows)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    # One segment per (row, run), rows outermost: where it starts, and how long it is.
    first = (starts[:-1, None] + np.arange(runs)[None, :] * span).ravel()
    length = np.repeat(sizes, runs)
    into = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    return np.repeat(first, length) + into


def layer_loads(program, model, layer: int, tokens: int, offset: int) -> np.ndarray:
    """Tokens routed to each expert of a stage's ``layer``-th layer in this step's tile. The
    draw is keyed by the layer's place in its stage, so that stages of one shape draw alike
    and one simulation times them all, as for dense stages."""
    return routing_of(program.options).loads(model.experts.count, model.experts.top_k,
                                             tokens, layer, offset)


def deliver_route(sg, tile, src_pe: int, src_ready: int, lines: np.ndarray,
                  targets: np.ndarray, kernel: str) -> None:
    """Each token's k weights and expert ids, from the router's PE to every PE of ``lines``
    (n lines of L PEs, side by side), into ``targets`` (tasks shaped like ``lines``): one
    message to the PE nearest the source, multicast from there across the lines (along the
    n positions at that PE's place in the line) and then along every line."""
    t, k = tile.step.new_tokens, sg.model.experts.top_k
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

"""Expert strips (``expert_runs``): a mixture of experts' projections, each expert on a run of
columns of its strip, multiplying for the tokens the step routes to it.

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

from wse_emu.functional.tiles import MatrixTiles
from wse_emu.kernels.bounds import port_cycles, result
from wse_emu.kernels.experts import RoutedAxis, deliver_route, down_order
from wse_emu.kernels.patterns.base import Pattern, Tile, get, register
from wse_emu.kernels.patterns.matrix import StripSite, plan_reduce, plan_strip
from wse_emu.kernels.primitives import (
    SLICE_TOKENS,
    VC_TRANSFER,
    line_broadcast,
    line_reduce,
    nearest_on_lines,
    overlaps,
    wavelets,
)
from wse_emu.models import layer as ly
from wse_emu.program.expert_runs import input_share, run_columns, run_root


class ExpertRuns(Pattern):
    kind = "matrix"
    name = "expert_runs"

    def plan(self, b, stage, lay, strip, body, edge, high: bool, names: dict):
        """The strip (``matrix.plan_strip``); a PE keeps one token's partial sums, since it
        works for a token only when the token routes to its experts, one such token after
        another; gate's and up's sums meet on their own runs of columns (each run and the
        column it may share with the next), down's along the whole strip."""
        k = plan_strip(b, stage, lay, strip, StripSite(body, edge, high), self.kind, names, 1)
        e = lay.extents[strip.name]
        per_run = strip.k // k.matrix[0]  # gate's and up's experts sharing a run
        length = k.grid[0] if strip.experts_summed else \
            min(e, -(-e // (strip.experts // per_run)) + 1)
        plan_reduce(b, stage, k, strip, length)
        return k

    def expand(self, sg, tile: Tile, st, op: ly.Op, axis: RoutedAxis, pieces: tuple,
               route_at: tuple[int, int]):
        """(the PEs holding the strip's outputs, their sizes, their final tasks)."""
        return expert_matrix(sg, tile, st, op, axis, pieces, route_at)

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        """Whatever the routing: the step's token-expert pairs share the strip's PEs at best
        evenly (a split layer's part: the pairs no routing can send elsewhere, a token's
        choices beyond the experts held in the other part); where each expert's sums stay
        its own (gate, up), they still cross the expert's run of columns."""
        op = ops[0]
        t, d = ly.op_tokens(op, mb), model.storage.dtype_bytes
        k, n = op.matrix
        kp, np_ = kernel.grid
        pairs = t * max(0, op.top_k - (op.total_experts - op.experts))
        work = ly.routed_matrix_work(pairs * k * n / (kp * np_), 0, 0, d)
        compute, sram = port_cycles(work, fabric, fabric.flops_per_cycle(d))
        hops = 0 if op.experts_summed else max(0, kp // op.experts - 1)
        path = fabric.hop_latency_cycles * hops + (2 * fabric.ramp_latency_cycles if hops
                                                   else 0)
        return result(fabric, compute, sram, 0, path)

    def load(self, fs, kernel, op, weights, layers) -> None:
        """Each layer's experts as the strip holds them (``weights.expert_strips``): down's
        inputs in their strip order; gate's and up's biases on their experts' roots."""
        strips = fs.expert_strips(weights, layers)
        if op.experts_summed:  # down's inputs in their strip order
            runs = op.experts // fs.per_run
            fs.down_order = down_order(runs, fs.per_run * op.matrix[0], kernel.grid[1])
            fs.down_bias = [st.get("experts_down.bias") for st in strips]
        order = fs.down_order if op.experts_summed else slice(None)
        fs.matrices[kernel.name] = MatrixTiles.build(
            kernel, [st[kernel.name][order] for st in strips], fs.numerics)
        if op.bias and not op.experts_summed:  # (E x m,) on the experts' roots
            fs.expert_bias[kernel.name] = [fs.numerics.round(st[kernel.name + ".bias"])
                                           for st in strips]

    def compute(self, fs, op, index, x, route=None):
        """Gate and up: each expert's run of columns multiplies the hidden vector and its
        partial sums meet on the run; only a token's own experts' outputs are kept (the PEs
        of the others skip the token, as the timed pattern has them). Down: the routed
        activations, already weighted by the router and taken in the strip's order, sum over
        the experts in the strip's reduction; each token's experts' biases join, weighted the
        same way, where the sums collect."""
        tiles = fs.matrices[op.name]
        if not op.experts_summed:
            out = tiles.multiply_per_run(index, x, op.experts // fs.per_run, fs.numerics)
            if op.name in fs.expert_bias:
                out = fs.numerics.round(out + fs.expert_bias[op.name][index])
            return np.where(routed_columns(fs, route[0]), out, np.float32(0))
        out = tiles.multiply(index, x[:, fs.down_order], fs.numerics)
        bias = fs.down_bias[index] if fs.down_bias else None
        if bias is not None:
            chosen, weights = fs.routed
            mine = (chosen >= fs.held[0]) & (chosen < fs.held[1])  # this part's experts
            out = fs.numerics.round(out + np.einsum("tk,tkh->th", np.where(mine, weights, 0),
                                                    bias[chosen]))
        return out

    def alone(self, sg, kernel, tile: Tile) -> None:
        """Alone, without a router to say which tokens go where, the strip is timed as a
        dense strip of the same blocks would be: every token at every expert, more than any
        routing gives it."""
        dense = "gemv_tree" if tile.step.phase == "decode" else "gemm_stream"
        get("matrix", dense).alone(sg, kernel, tile)


register(ExpertRuns())


def routed_columns(fs, chosen: np.ndarray) -> np.ndarray:
    """(tokens, E x m): whether each column of the expert axis (the stage's experts') belongs
    to a token's expert."""
    e, m = fs.model.experts.count, fs.model.experts.intermediate_size
    hit = np.zeros((len(chosen), e), bool)
    np.put_along_axis(hit, chosen, True, axis=-1)
    return np.repeat(hit[:, slice(*fs.held)], m, axis=1)


def gather_into_lines(sg, st, src_pes: np.ndarray, src_sizes: np.ndarray,
                      src_ready: np.ndarray, targets: np.ndarray, axis: RoutedAxis) -> None:
    """An expert strip's input: each line across the strip collects the routed values of its
    input segment at its entry PE, from however many source pieces hold them, and multicasts
    the segment along the line into ``targets`` ((e, s) tasks). A piece first crosses to the
    line's PE nearest its source (straight across the lines, so the pieces bound for many
    lines spread over parallel lanes instead of crowding the source's own line), then runs
    along the line to the entry. A line no routed token needs gets nothing (the routing,
    which every PE receives, tells it not to wait)."""
    kind = sg.kind[st.kernel.name]
    e, s = st.pe.shape
    si, line, lo, hi = overlaps(src_sizes, st.k_sizes)
    values = axis.values(lo, hi)
    keep = values > 0
    si, line, values = si[keep], line[keep], values[keep]
    at = sg.entries(st)
    land = st.pe[np.arange(e), at]
    got = sg.g.tasks(land, 0, kind)
    w = sg.g.width
    # Per source piece's task and line: the line's PE nearest the source relays what the
    # line needs of it (a source PE's pieces of several runs travel together).
    src, ready = src_pes[si], src_ready[si]
    relay_pe = nearest_on_lines(st.pe, line, src, w)
    key = ready * (w * sg.g.height) + relay_pe
    pair, first, which = np.unique(key, return_index=True, return_inverse=True)
    sent = np.bincount(which, weights=values, minlength=len(pair)).astype(np.int64)
    p_src, p_ready, p_relay, p_line = src[first], ready[first], relay_pe[first], line[first]
    relay = sg.g.tasks(p_relay, 0, kind)
    here = p_src == p_relay
    sg.g.then(p_ready[here], relay[here])
    sg.g.send(p_ready[~here], p_src[~here], p_relay[~here], wavelets(sent[~here], sg.d),
              relay[~here], 0, VC_TRANSFER)
    local = p_relay == land[p_line]
    sg.g.then(relay[local], got[p_line[local]])
    sg.g.send(relay[~local], p_relay[~local], land[p_line[~local]],
              wavelets(sent[~local], sg.d), got[p_line[~local]], 0, VC_TRANSFER)
    fed = np.flatnonzero(np.bincount(line, minlength=e))
    per_line = np.bincount(line, weights=values, minlength=e).astype(np.int64)
    if s > 1:
        line_broadcast(sg.g, st.pe[fed], at[fed], got[fed], wavelets(per_line[fed], sg.d), kind,
                       targets=targets[fed])
    else:
        sg.g.then(got[fed], targets[fed, 0])


def expert_matrix(sg, tile: Tile, st, op: ly.Op, axis: RoutedAxis, pieces: tuple,
                  route_at: tuple[int, int]):
    """An expert strip for the tile's routed tokens; returns (the PEs holding its outputs,
    their sizes, their final tasks).

    Its experts lie one after another along the strip, each on a run of columns. Gate and
    up: every token's hidden vector goes to its experts' runs (each line across the strip
    takes the piece its columns hold); each PE multiplies for the tokens routed to the
    experts its block holds; an expert's partial sums meet on its run, at the end nearer
    the strip's root, where its m outputs lie across the strip's rows. Down: the routed
    activations arrive on the lines holding their experts; the partial sums, summing over
    the experts too, meet at the strip's root edge."""
    k, kind = st.kernel, sg.kind[st.kernel.name]
    d = sg.d
    e, s = st.pe.shape
    t = sg.step_tokens(op.name, tile)
    loads = axis.loads
    if op.experts_summed:
        # Down's inputs in their strip order (``down_order``): each line a few rows' slices
        # of every run of up's experts.
        m = op.matrix[0]
        per_run = sg.kernels["experts_up"].matrix[1] // m
        runs = op.experts // per_run
        down_axis = RoutedAxis(loads, m, down_order(runs, per_run * m, s))
        per_line = down_axis.split(st.k_sizes).astype(np.float64)
        inputs = per_line[:, None] * np.ones((1, s))
        macs = inputs * st.n_sizes[None, :]
        # Partial sums: one per output for each token the line works for.
        outputs = down_axis.tokens_touching(st.k_sizes, t)[:, None] * st.n_sizes[None, :]
    else:
        # Runs of ``per_run`` experts, their outputs side by side across the strip's rows.
        h = op.matrix[0]
        runs = k.matrix[0] // h
        per_run = op.experts // runs
        share = input_share(st.k_sizes, runs, h)  # (e, runs): inputs of a run per line
        run_loads = loads.reshape(runs, per_run).sum(axis=1)
        # Per run and row across: the routed token-outputs the row's PEs compute.
        row_values = np.stack([RoutedAxis(loads[r * per_run:(r + 1) * per_run],
                                          op.matrix[1]).split(st.n_sizes)
                               for r in range(runs)])  # (runs, s)
        macs = (share @ row_values).astype(np.float64)
        inputs = (share @ run_loads).astype(np.float64)[:, None] * np.ones((1, s))
        outputs = ((share > 0) @ row_values).astype(np.float64)
    # A prefill's multiply runs as a chain of slices of the tokens, as a dense strip's does.
    slices = -(-t // SLICE_TOKENS) if tile.step.phase == "prefill" else 1
    slice_work = ly.routed_matrix_work(macs / slices, inputs / slices, outputs / slices, d,
                                       sg.stored(k.name))
    first, done = sg.chain(st.pe, [slice_work] * slices, k.name)
    first, done = first.reshape(e, s), done.reshape(e, s)
    src_pes, src_sizes, src_ready = pieces
    if op.experts_summed:
        # The routed activations, run by run of up's experts, taken in down's order.
        take = (np.arange(runs)[None, :] * s + np.arange(s)[:, None]).ravel()
        gather_into_lines(sg, st, src_pes[take], src_sizes[take], src_ready[take], first,
                          down_axis)
    else:
        # Every run reads the whole hidden vector: the source, once per run along K, each
        # piece for the tokens routed to the run's experts.
        gather_into_lines(sg, st, np.tile(src_pes, runs), np.tile(src_sizes, runs),
                          np.tile(src_ready, runs), first, RoutedAxis(run_loads, h))
    deliver_route(sg, tile, *route_at, st.pe, first, k.name)
    if op.experts_summed:
        rows = np.ascontiguousarray(st.pe.T)
        reduced = st.n_sizes * t  # every token's weighted sum over its experts
        total = line_reduce(sg.g, rows, np.full(s, st.root), done.T, wavelets(reduced, d),
                            sg.cost.add(reduced, d), kind, levels=k.trees.get("reduce", 2))
        out_pes, out_sizes = st.edge, st.n_sizes
        if op.bias:  # each pair's expert bias, weighted by the router, where the sums collect
            biased = sg.work(st.edge, ly.bias_work(1, st.n_sizes * t * op.top_k, d), k.name)
            sg.g.then(total, biased)
            total = biased
        return out_pes, out_sizes, total
    out_pes, ready = _reduce_per_run(sg, st, done, row_values, kind)
    out_sizes = np.tile(st.n_sizes, runs)  # the experts' outputs, in expert order
    if op.bias:  # each expert's bias on its routed tokens' outputs
        biased = sg.work(out_pes, ly.bias_work(1, row_values.ravel(), d), k.name)
        sg.g.then(ready, biased)
        ready = biased
    return out_pes, out_sizes, ready


def _reduce_per_run(sg, st, done: np.ndarray, row_values: np.ndarray, kind: int):
    """Each run's partial sums, on each row across the strip, along the run's columns to
    its root end; a row without routed outputs skips it. Returns (per run and row, the PE
    holding the sums and its final task)."""
    e, s = st.pe.shape
    runs = run_columns(st.k_sizes, len(row_values), st.kernel.matrix[0] // len(row_values))
    out_pes = np.empty(len(runs) * s, dtype=np.int64)
    ready = np.empty(len(runs) * s, dtype=np.int64)
    # Per length of run: the (run, row) pairs reduced, run by run, rows in order within one.
    by_length: dict[int, list[tuple[int, np.ndarray]]] = {}
    for r, run in enumerate(runs):
        root = run[run_root(run, st.root)]
        out_pes[r * s:(r + 1) * s] = st.pe[root]
        ready[r * s:(r + 1) * s] = done[root]
        routed_rows = np.flatnonzero(row_values[r])
        if len(run) > 1 and len(routed_rows):
            by_length.setdefault(len(run), []).append((r, routed_rows))
    levels = st.kernel.trees.get("reduce", 2)
    for length, chosen in by_length.items():
        run_of = np.concatenate([np.full(len(rows), r) for r, rows in chosen])
        row = np.concatenate([rows for _, rows in chosen])
        # Each pair's columns along the strip: its run's, from a table of this length's runs.
        columns = np.zeros((len(runs), length), dtype=np.int64)
        taken = [r for r, _ in chosen]  # each run once, in order
        columns[taken] = np.stack([runs[r] for r in taken])
        along = columns[run_of]  # (lines, length)
        lines = st.pe[along, row[:, None]]
        ready_lines = done[along, row[:, None]]
        values = row_values[run_of, row]
        roots = np.full(len(lines), run_root(np.arange(length), st.root))
        total = line_reduce(sg.g, lines, roots, ready_lines, wavelets(values, sg.d),
                            sg.cost.add(values, sg.d), kind, levels=levels)
        ready[run_of * s + row] = total
    return out_pes, ready

"""Dense matrix strips: a decode's GEMV reduced by trees (``gemv_tree``) and a prefill's GEMM
streaming its token tiles (``gemm_stream``).

The weights stay where the compiler put them: K split along the strip, N across it, so each
line across the strip owns an input segment and each PE a block. The input reaches every PE
of its line (each piece a producer PE holds goes to the line's nearest PE and is multicast
along the line from there), every PE multiplies its block for every token, and the partial
sums meet at the root edge by the kernel's tree along the strip. A GEMV cuts each PE's output
columns into pieces, so that the tree reduces one piece while the next is multiplied
(MeshGEMV's overlap); a GEMM keeps whole blocks, since its token tiles already overlap one
tile's reduction with the next tile's multiply.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from wse_emu.functional.tiles import MatrixTiles
from wse_emu.kernels.blocks import block_bytes, vector_bytes
from wse_emu.kernels.bounds import ceil_div, port_cycles, result
from wse_emu.kernels.patterns.base import Pattern, Tile, register
from wse_emu.kernels.primitives import (
    SLICE_TOKENS,
    VC_TRANSFER,
    line_broadcast,
    line_reduce,
    overlaps,
    wavelets,
)
from wse_emu.models import layer as ly
from wse_emu.util.splits import even_split, even_splits

INPUT_FIFO_BYTES = 64  # wavelets queued at a matrix kernel's input before its tasks take them
# The edge where a strip's sums collect, by the axis K splits along and whether it is the high
# end of it.
EDGE = {("x", True): "east", ("x", False): "west", ("y", True): "south", ("y", False): "north"}

# A decode multiply is cut by output columns into up to MAX_CHUNKS pieces of at least
# MIN_CHUNK_CYCLES each: enough to hide most of the reduction without swamping the PE with
# tasks.
MAX_CHUNKS, MIN_CHUNK_CYCLES = 4, 128


class StripSite(NamedTuple):
    """Where a strip's kernel lies: its PEs (``body``) and the edge its sums collect on, the
    high end of its axis if ``high``."""

    body: object
    edge: object
    high: bool


def plan_strip(b, stage, lay, strip, site: StripSite, kind: str, names: dict,
               buffer_tokens: int, token_bytes: int = 0):
    """A strip's kernel on its ``site`` with its weights, buffers and bias vectors per PE and
    the route of its input broadcast: what every strip pattern plans alike. ``names``: its
    pattern per phase; ``buffer_tokens``: tokens of partial sums each PE keeps;
    ``token_bytes``: bytes more per buffered token (a gather's token ids). ``b`` is the
    compiler's region builder."""
    body, edge, high = site
    d = b.d
    e, short = lay.extents[strip.name], lay.short
    vec_bytes = sum(length * strip.vector_layers[n] * d for n, length in strip.vectors.items()
                    if n.endswith("_bias"))
    matrix = strip.shape(short)
    # K splits along the strip (``a``) and N across it (``b``); a transposed strip splits K
    # across the stage and N along the strip, its sums meeting at one side.
    flip = lay.transposed(strip.name)
    k_parts, n_parts = (short, e) if flip else (e, short)
    k_axis = ("y" if lay.axis == "x" else "x") if flip else lay.axis
    w = block_bytes(*matrix, k_parts, n_parts, strip.layers,
                    strip.bytes_per_weight)  # (n_parts, k_parts)
    k = b.kernel(stage, strip.name, kind, body, layers=strip.layers, ops=[strip.name],
                 matrix=list(matrix), grid=[k_parts, n_parts], k_axis=k_axis,
                 # a packed format's blocks round up to whole bytes
                 weight_bytes=int(w.sum()) + vec_bytes, root=EDGE[(k_axis, high)],
                 pattern=dict(names))
    # Inputs stream through a small FIFO (each arriving element triggers an update of the
    # PE's partial sums), so the buffer holds the partial sums of ``buffer_tokens`` tokens.
    out_seg = even_split(matrix[1], n_parts)[:, None] * np.ones((1, k_parts), np.int64)
    act = (out_seg * d + token_bytes) * buffer_tokens + INPUT_FIFO_BYTES
    if k_axis == "y":  # arrays are (y, x): K parts along y
        w, act = w.T, act.T
    b.add("weights", body, w)
    b.add("activations", body, act)
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
            b.add("weights", body, grid.T if lay.axis == "y" else grid)
        else:
            b.add("weights", edge, b.line(edge, per_pe))
    # The kernel's internal collectives: inputs broadcast across the strip.
    b.route("broadcast", f"{strip.name}.bcast", body, src=k.id, dst=[k.id], stage=stage.id)
    return k


def plan_reduce(b, stage, k, strip, length: int) -> None:
    """Partial sums reduced along ``length`` PEs of the strip by a tree of as many levels as
    the cost model finds fastest for a decode token, one color (route) per level."""
    k_parts, n_parts = k.grid
    k.trees["reduce"] = b.tree_levels(length, -(-k.matrix[1] // n_parts))
    levels = 0 if k_parts == 1 else k.trees["reduce"]
    for level in range(levels):
        b.route("reduce", f"{strip.name}.reduce{level + 1}", k.rect, src=k.id, dst=[k.id],
                stage=stage.id)


class DenseStrip(Pattern):
    """A weight-stationary matrix product on a strip of PEs, its sums reduced along it."""

    kind = "matrix"
    chunked = False  # whether a PE's output columns are cut into pieces (a GEMV's overlap)

    def plan(self, b, stage, lay, strip, body, edge, high: bool, names: dict):
        """The kernel, its SRAM and its routes (``plan_strip``), its sums reduced along the
        whole strip."""
        k = plan_strip(b, stage, lay, strip, StripSite(body, edge, high), self.kind, names,
                       b.options.buffer_tokens)
        plan_reduce(b, stage, k, strip, k.grid[0])
        return k

    def chunks(self, sg, st, tokens: int) -> int:
        """Pieces of each PE's output columns the multiply is cut into: as many as keep a
        piece's multiply above ``MIN_CHUNK_CYCLES``, at most ``MAX_CHUNKS`` (one without
        the GEMV's overlap, or on a strip one PE long)."""
        if not self.chunked or st.pe.shape[0] == 1:
            return 1
        w = ly.matrix_work(int(st.k_sizes.max()), int(st.n_sizes.max()), tokens, sg.d)
        whole = int(sg.cost.cycles(w.flops, w.reads, w.writes))
        return max(1, min(MAX_CHUNKS, int(st.n_sizes.min()), whole // MIN_CHUNK_CYCLES))

    def expand(self, sg, tile: Tile, st, entry_ready: np.ndarray | None = None,
               pieces: tuple | None = None) -> np.ndarray:
        """The product for ``tile``; returns the task per b at which the root edge holds the
        outputs. The input comes either whole to each line's entry PE (``entry_ready``) or
        as ``pieces`` (PEs, sizes, ready tasks) of a vector spread over a producer's line,
        each piece sent to the nearest PE of every line that needs it and multicast along
        that line from there (no PE collects a whole segment before passing it on)."""
        k, kind = st.kernel, sg.kind[st.kernel.name]
        t, d = sg.step_tokens(k.name, tile), sg.d
        e, s = st.pe.shape
        ka = st.k_sizes[:, None]
        chunks = self.chunks(sg, st, t)
        n_parts = even_splits(st.n_sizes, chunks)  # (s, chunks)
        # The multiply runs as a chain of tasks of at most SLICE_TOKENS tokens each, so that
        # a PE can take up other kernels' short tasks between slices (as its microthreads
        # do); a GEMV's chain goes piece of output columns by piece.
        slices = -(-t // SLICE_TOKENS)
        per = np.diff((np.arange(slices + 1) * t) // slices)
        first = compute = None
        piece_done = []
        for c in range(chunks):
            head, compute = sg.chain(st.pe, [ly.matrix_work(
                ka, n_parts[None, :, c], n_tok, d, sg.stored(k.name)) for n_tok in per],
                k.name, after=compute)
            first = head if first is None else first
            piece_done.append(compute.reshape(e, s))
        first = first.reshape(e, s)
        if pieces is not None:
            self.spread(sg, tile, st, *pieces, first)
        elif s > 1:
            line_broadcast(sg.g, st.pe, sg.entries(st), entry_ready,
                           wavelets(st.k_sizes * t, d), kind, targets=first)
        else:
            sg.g.then(entry_ready, first[:, 0])
        rows = np.ascontiguousarray(st.pe.T)  # (s, e): along the strip for each b
        totals = [line_reduce(sg.g, rows, np.full(s, st.root), done.T,
                              wavelets(n_parts[:, c] * t, d),
                              sg.cost.add(n_parts[:, c] * t, d), kind,
                              levels=k.trees.get("reduce", 2))
                  for c, done in enumerate(piece_done)]
        if chunks == 1:
            total = totals[0]
        else:
            total = sg.g.tasks(st.edge, 0, kind)  # every piece summed at the root
            for piece in totals:
                sg.g.then(piece, total)
        op = sg.ops.get(k.name)
        if op is None or not op.bias:
            return total
        # The bias is added where the sums collect.
        biased = sg.work(st.edge, ly.bias_work(st.n_sizes, t, d), k.name)
        sg.g.then(total, biased)
        return biased

    @staticmethod
    def spread(sg, tile: Tile, st, src_pes: np.ndarray, src_sizes: np.ndarray,
               src_ready: np.ndarray, targets: np.ndarray) -> None:
        """Each overlap of a source piece with a line's input segment goes to the line's PE
        nearest the source, which multicasts it along the line into ``targets`` ((e, s)
        tasks that wait for the whole segment)."""
        kind, t = sg.kind[st.kernel.name], sg.step_tokens(st.kernel.name, tile)
        si, line, lo, hi = overlaps(src_sizes, st.k_sizes)
        values = (hi - lo) * t
        w = sg.g.width
        sx, sy = src_pes[si] % w, src_pes[si] // w
        cand = st.pe[line]  # (overlaps, s)
        dist = np.abs(cand % w - sx[:, None]) + np.abs(cand // w - sy[:, None])
        land = np.argmin(dist, axis=1)
        land_pe = cand[np.arange(len(line)), land]
        local = land_pe == src_pes[si]
        arrived = np.empty(len(line), dtype=np.int64)
        arrived[local] = src_ready[si[local]]
        remote = np.flatnonzero(~local)
        if len(remote):
            arrived[remote] = sg.g.tasks(land_pe[remote], 0, kind)
            sg.g.send(src_ready[si[remote]], src_pes[si[remote]], land_pe[remote],
                      wavelets(values[remote], sg.d), arrived[remote], 0, VC_TRANSFER)
        if st.pe.shape[1] > 1:
            line_broadcast(sg.g, cand, land, arrived, wavelets(values, sg.d), kind,
                           targets=targets[line])
        else:
            sg.g.then(arrived, targets[line, 0])

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        first = ops[0]
        d = model.storage.dtype_bytes
        fpc = fabric.flops_per_cycle(d)
        hop, ramp = fabric.hop_latency_cycles, fabric.ramp_latency_cycles
        t = ly.op_tokens(first, mb)
        k, n = kernel.matrix
        kp, np_ = kernel.grid
        kc, nr = ceil_div(k, kp), ceil_div(n, np_)
        work = ly.matrix_work(kc, nr, t, d)
        if first.bias:
            work = work + ly.bias_work(nr, t, d)  # on the root edge, after the reduction
        compute, sram = port_cycles(work, fabric, fpc)
        # Inputs enter a line across the strip at one PE and must reach its farthest PE (at
        # least half the line away); partial sums travel the strip to its root edge. Some PE
        # takes a whole input segment, or a whole partial sum, in through its ramp.
        hops = ceil_div(np_ - 1, 2) + (kp - 1)
        path = hop * hops + (2 * ramp if hops else 0)
        # Every tree ends with the root adding a partial sum it has just received: at least
        # one wavelet's worth of values (a schedule may cut the outputs finely).
        last = min(t * nr, max(1, 4 // d))
        add_last = port_cycles(ly.Work(last, 2 * last * d, last * d), fabric, fpc)[1] \
            if kp > 1 else 0.0
        path += add_last
        # The root multiplies its whole block for a token (after that token's first input
        # value arrives) before that token's last output can exist.
        drain = max(port_cycles(ly.matrix_work(kc, nr, 1, d), fabric, fpc)) + add_last
        ramp_in = t * max(kc if np_ > 1 else 0, nr if kp > 1 else 0) * d / \
            fabric.link_bytes_per_cycle
        return result(fabric, compute, sram, ramp_in, path, drain)

    def load(self, fs, kernel, op, weights, layers) -> None:
        fs.matrices[kernel.name] = MatrixTiles.build(
            kernel, fs.matrices_of(op, weights, layers), fs.numerics,
            fs.bias_of(op, kernel, weights, layers))

    def compute(self, fs, op, index, x):
        """Every PE multiplies its block; the partial sums meet along the kernel's trees."""
        return fs.matrices[op.name].multiply(index, x, fs.numerics)

    def alone(self, sg, kernel, tile: Tile) -> None:
        st = sg.strip(kernel)
        self.expand(sg, tile, st, sg.g.tasks(sg.entry_pes(st), 0, sg.kind[kernel.name]))


class GemvTree(DenseStrip):
    name = "gemv_tree"
    chunked = True


class GemmStream(DenseStrip):
    name = "gemm_stream"


register(GemvTree())
register(GemmStream())

"""One stage of a compiled program, for one micro-batch, as a task graph.

Per layer, op by op as the layer description (``wse_emu.layer``) lists them, in the stage's own
coordinates:
- matrix kernels (q, k, v, o, gate, up, down, LM head): each line across the strip owns an
  input segment; each piece of it that a producer PE holds goes to the line's nearest PE and is
  multicast along the line; every PE multiplies its block for every token (a decode in pieces
  of output columns); partial sums meet at the root edge by the kernel's tree
  (``kernels.trees``) along the strip, piece by piece;
- vector kernels on an edge line (norms, rotary, residual adds, gated activations, scaling,
  soft caps): a task per PE on its segment; norms all-reduce the sum of squares along the line
  (per head's PEs for a per-head norm);
- attention over the KV cache spread over the stage (``kernels.kvlayout``): each column along
  the long side holds a share of the cached tokens, each row a slice of their K and V features;
  a decode scores each PE's tokens over its features and reduces partial scores across a
  head's rows and partial outputs along the long side (``decode_attention``); a prefill
  splits the queries along the long side instead;
- between kernels, vectors are re-split from producer to consumer by point-to-point messages.
The stage starts with its input on the home line (a task per PE at cycle 0) and ends when the
last layer's residual add (in the last stage: the LM head's argmax) is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu import layer as ly
from wse_emu.kernels.experts import RoutedAxis, deliver_route, expert_matrix, layer_loads, route
from wse_emu.kernels.graph import GraphBuilder
from wse_emu.kernels.primitives import (
    SLICE_TOKENS,
    VC_TRANSFER,
    CostModel,
    line_broadcast,
    line_reduce,
    overlaps,
    transfer,
    wavelets,
)
from wse_emu.layer import MicroBatch
from wse_emu.program import Kernel, Stage, WaferProgram
from wse_emu.splits import even_split

# A decode multiply is cut by output columns into up to MAX_CHUNKS pieces of at least
# MIN_CHUNK_CYCLES each: enough to hide most of the reduction without swamping the PE with
# tasks.
MAX_CHUNKS, MIN_CHUNK_CYCLES = 4, 128
# Picking the greedy next token: compare each logit with the running best.
ARGMAX = ly.PerElement(1, 1)


@dataclass
class Strip:
    """A matrix kernel's PE grid in stage coordinates: ``pe[a, b]`` with a along the strip
    (splitting K) and b across it (splitting N)."""

    kernel: Kernel
    pe: np.ndarray  # (e, s)
    k_sizes: np.ndarray
    n_sizes: np.ndarray
    root: int  # a of the root edge

    @property
    def edge(self) -> np.ndarray:
        return self.pe[self.root]


class StageGraph:
    def __init__(self, program: WaferProgram, stage: Stage, step: MicroBatch):
        self.program, self.stage, self.step = program, stage, step
        self.model = program.model
        self.d = self.model.dtype_bytes
        r = stage.rect
        self.g = GraphBuilder(r.w, r.h)
        self.cost = CostModel(program.fabric, self.d)
        self.kernels = {k.name: k for k in program.stage_kernels(stage)}
        self.kind = {name: i for i, name in enumerate(self.kernels)}
        self.kind_names = list(self.kernels)
        self.whole_end = step.prefix + step.tokens
        self.ops = ly.ops_by_name(self.model)
        self.layer_table = ly.part_ops(self.model, stage.part)
        self.layer_index = 0
        # Per kernel, the work of its ops as the tasks do it (collectives excluded), so that
        # a test can hold the tasks to the layer description's costs.
        self.ledger: dict[str, ly.Work] = {}
        self.prev_kv: dict | None = None  # per layer, the previous tile's attention tasks
        self.kv_now: dict = {}

    # --- geometry -------------------------------------------------------------------------
    def strip(self, k: Kernel) -> Strip:
        r, st = k.rect, self.stage.rect
        e, s = k.grid
        a = np.arange(e)[:, None]
        b = np.arange(s)[None, :]
        if k.k_axis == "x":
            x, y = r.x - st.x + a, r.y - st.y + b
        else:
            x, y = r.x - st.x + b, r.y - st.y + a
        root = e - 1 if k.root in ("east", "south") else 0
        return Strip(k, self.g.pe(x, y), even_split(k.matrix[0], e), even_split(k.matrix[1], s),
                     root)

    def stage_grid(self) -> np.ndarray:
        """All stage PEs as (a along the long side, b across), in the strips' orientation."""
        r = self.stage.rect
        if self.stage.strip_axis == "x":
            a, b = np.arange(r.w)[:, None], np.arange(r.h)[None, :]
            return self.g.pe(a + 0 * b, b + 0 * a)
        a, b = np.arange(r.h)[:, None], np.arange(r.w)[None, :]
        return self.g.pe(b + 0 * a, a + 0 * b)

    # --- kernels ----------------------------------------------------------------------------
    def feed(self, src_pe, src_sizes, src_ready, dst_pe, dst_sizes, name,
             axis: RoutedAxis | None = None) -> np.ndarray:
        """Re-split a vector from its producer's line onto a consumer's: every token's
        values, or on an expert axis only the routed tokens' (``axis``)."""
        per_value = self.step_tokens(name) * self.d / 4
        if axis is None:
            return transfer(self.g, src_pe, src_sizes, src_ready, dst_pe, dst_sizes,
                            per_value, self.kind[name])
        # Only the routed tokens' values travel; a piece without any is not sent (the
        # routing tells its receiver not to wait).
        si, di, lo, hi = overlaps(src_sizes, dst_sizes)
        values = axis.values(lo, hi)
        recv = self.g.tasks(dst_pe, 0, self.kind[name])
        local = src_pe[si] == dst_pe[di]
        send = (values > 0) & ~local
        self.g.then(src_ready[si[(values > 0) & local]], recv[di[(values > 0) & local]])
        self.g.send(src_ready[si[send]], src_pe[si[send]], dst_pe[di[send]],
                    wavelets(values[send], self.d), recv[di[send]], 0, VC_TRANSFER)
        return recv

    def stored(self, name: str) -> ly.StoredWeights | None:
        """How a matrix kernel's weights are read: in their stored format."""
        op = self.ops.get(name)
        return ly.stored_weights(op, self.model) if op is not None else None

    def step_tokens(self, name: str) -> int:
        op = self.ops.get(name)
        return ly.op_tokens(op, self.step) if op is not None else self.step.new_tokens

    def work(self, pes, work: ly.Work, kernel: str, counted: bool = True) -> np.ndarray:
        """Tasks on ``pes`` doing ``work`` (per PE) for ``kernel``, counted in the ledger
        unless the work is outside the layer description's ops (picking the next token)."""
        shape = np.shape(pes)
        parts = [np.broadcast_to(np.asarray(v, dtype=np.float64), shape)
                 for v in (work.flops, work.reads, work.writes)]
        if counted:
            self.ledger[kernel] = self.ledger.get(kernel, ly.Work()) + ly.Work(
                *(float(v.sum()) for v in parts))
        return self.g.tasks(pes, self.cost.cycles(*parts), self.kind[kernel])

    def chain(self, pes, works: list[ly.Work], kernel: str,
              after: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Tasks on ``pes`` doing ``works`` one after another (after ``after``'s tasks);
        returns the first and the last."""
        first = last = after
        for i, work in enumerate(works):
            part = self.work(pes, work, kernel)
            if last is not None:
                self.g.then(last, part)
            first = part if i == 0 else first
            last = part
        return first, last

    @staticmethod
    def entries(st: Strip) -> np.ndarray:
        """Where each line across the strip takes its input segment in: at the position
        across the strip proportional to the segment's place in the vector, so that a vector
        spread over a parallel line arrives on parallel lanes instead of funnelling into one
        corner."""
        e, s = st.pe.shape
        bounds = np.concatenate([[0], np.cumsum(st.k_sizes)])
        middle = (bounds[:-1] + bounds[1:]) / 2
        return np.minimum((middle * s / max(bounds[-1], 1)).astype(np.int64), s - 1)

    def entry_pes(self, st: Strip) -> np.ndarray:
        return st.pe[np.arange(st.pe.shape[0]), self.entries(st)]

    def out_chunks(self, st: Strip, tokens: int) -> int:
        """Pieces of each PE's output columns a decode multiply is cut into, so that the
        tree reduces one piece while the next is multiplied (MeshGEMV's overlap): as many as
        keep a piece's multiply above ``MIN_CHUNK_CYCLES``, at most ``MAX_CHUNKS``. A prefill
        keeps whole blocks, since its token tiles already overlap one tile's reduction with
        the next tile's multiply."""
        if self.step.phase != "decode" or st.pe.shape[0] == 1:
            return 1
        w = ly.matrix_work(int(st.k_sizes.max()), int(st.n_sizes.max()), tokens, self.d)
        whole = int(self.cost.cycles(w.flops, w.reads, w.writes))
        return max(1, min(MAX_CHUNKS, int(st.n_sizes.min()), whole // MIN_CHUNK_CYCLES))

    def matrix(self, st: Strip, entry_ready: np.ndarray | None = None,
               pieces: tuple | None = None) -> np.ndarray:
        """GEMV / weight-stationary GEMM; returns the task per b at which the root edge holds
        the outputs. The input comes either whole to each line's entry PE (``entry_ready``)
        or as ``pieces`` (PEs, sizes, ready tasks) of a vector spread over a producer's line,
        each piece sent to the nearest PE of every line that needs it and multicast along
        that line from there (no PE collects a whole segment before passing it on)."""
        k, kind = st.kernel, self.kind[st.kernel.name]
        t, d = self.step_tokens(k.name), self.d
        e, s = st.pe.shape
        ka = st.k_sizes[:, None]
        chunks = self.out_chunks(st, t)
        n_parts = np.stack([even_split(int(n), chunks) for n in st.n_sizes])  # (s, chunks)
        # The multiply runs as a chain of tasks of at most SLICE_TOKENS tokens each, so that
        # a PE can take up other kernels' short tasks between slices (as its microthreads do);
        # a decode's chain goes piece of output columns by piece.
        slices = -(-t // SLICE_TOKENS)
        per = np.diff((np.arange(slices + 1) * t) // slices)
        first = compute = None
        piece_done = []
        for c in range(chunks):
            head, compute = self.chain(st.pe, [ly.matrix_work(
                ka, n_parts[None, :, c], n_tok, d, self.stored(k.name)) for n_tok in per],
                k.name, after=compute)
            first = head if first is None else first
            piece_done.append(compute.reshape(e, s))
        first = first.reshape(e, s)
        if pieces is not None:
            self.spread(st, *pieces, first)
        elif s > 1:
            line_broadcast(self.g, st.pe, self.entries(st), entry_ready,
                           wavelets(st.k_sizes * t, d), kind, targets=first)
        else:
            self.g.then(entry_ready, first[:, 0])
        rows = np.ascontiguousarray(st.pe.T)  # (s, e): along the strip for each b
        totals = [line_reduce(self.g, rows, np.full(s, st.root), done.T,
                              wavelets(n_parts[:, c] * t, d),
                              self.cost.add(n_parts[:, c] * t, d), kind,
                              levels=k.trees.get("reduce", 2))
                  for c, done in enumerate(piece_done)]
        if chunks == 1:
            total = totals[0]
        else:
            total = self.g.tasks(st.edge, 0, kind)  # every piece summed at the root
            for piece in totals:
                self.g.then(piece, total)
        op = self.ops.get(k.name)
        if op is None or not op.bias:
            return total
        # The bias is added where the sums collect.
        biased = self.work(st.edge, ly.bias_work(st.n_sizes, t, d), k.name)
        self.g.then(total, biased)
        return biased

    def spread(self, st: Strip, src_pes: np.ndarray, src_sizes: np.ndarray,
               src_ready: np.ndarray, targets: np.ndarray) -> None:
        """Each overlap of a source piece with a line's input segment goes to the line's PE
        nearest the source, which multicasts it along the line into ``targets`` ((e, s)
        tasks that wait for the whole segment)."""
        kind, t = self.kind[st.kernel.name], self.step_tokens(st.kernel.name)
        si, line, lo, hi = overlaps(src_sizes, st.k_sizes)
        values = (hi - lo) * t
        w = self.g.width
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
            arrived[remote] = self.g.tasks(land_pe[remote], 0, kind)
            self.g.send(src_ready[si[remote]], src_pes[si[remote]], land_pe[remote],
                        wavelets(values[remote], self.d), arrived[remote], 0,
                        VC_TRANSFER)
        if st.pe.shape[1] > 1:
            line_broadcast(self.g, cand, land, arrived, wavelets(values, self.d), kind,
                           targets=targets[line])
        else:
            self.g.then(arrived, targets[line, 0])

    def gather(self, st: Strip, tied: bool) -> np.ndarray:
        """Embedding lookup: the columns that hold the tokens' rows send their slices to the
        root edge. Untied tables split the vocabulary along the strip; a tied table (the LM
        head's) splits it across, so the row's slices travel along one line instead."""
        kind = self.kind["embedding"]
        t, d = self.step.new_tokens, self.d
        e, s = st.pe.shape
        if not tied:
            # Tokens spread evenly over the columns of the vocabulary.
            per_col = even_split(t, min(t, e))
            cols = (np.arange(len(per_col)) * e) // len(per_col)
            rows_bytes = np.repeat(per_col, s) * np.tile(st.n_sizes, len(cols)) * d
            lookups = self.work(st.pe[cols].ravel(), ly.Work(0, rows_bytes, rows_bytes),
                                "embedding")
            lookups = lookups.reshape(len(cols), s)
            roots = self.g.tasks(st.edge, 0, kind)
            for i, a in enumerate(cols):
                if a == st.root:
                    self.g.then(lookups[i], roots)
                else:
                    self.g.send(lookups[i], st.pe[a], st.edge,
                                wavelets(per_col[i] * st.n_sizes, d), roots, 0, 1)
            return roots
        # Tied: K (hidden) runs along the strip: the token's row is one line across a.
        line = self.entry_pes(st)
        lookup = self.work(line, ly.Work(0, t * st.k_sizes * d, t * st.k_sizes * d), "embedding")
        return lookup  # hidden split along the strip (k_sizes), on line b = 0

    def vector(self, name: str, pes: np.ndarray, inputs: list[np.ndarray], sizes: np.ndarray,
               cost: ly.PerElement | None = None, counted: bool = True,
               axis: RoutedAxis | None = None) -> np.ndarray:
        """An elementwise op on a line: reads its operands, writes one result per element
        (on an expert axis, per routed token's element)."""
        t = self.step_tokens(name)
        cost = cost or ly.ELEMENTWISE[self.ops[name].kind]
        elements = sizes * t if axis is None else axis.split(sizes)
        tasks = self.work(pes, ly.elementwise_work(cost, elements, self.d), name, counted)
        for ready in inputs:
            self.g.then(ready, tasks)
        return tasks

    def norm(self, name: str, pes: np.ndarray, ready: np.ndarray, sizes: np.ndarray):
        """RMSNorm on a line: local sums of squares, an all-reduce along the line (per head's
        PEs for a per-head norm), scaling."""
        kind, d = self.kind[name], self.d
        t = self.step_tokens(name)
        seg = sizes * t
        squares = self.work(pes, ly.elementwise_work(ly.NORM_SQUARES, seg, d), name)
        self.g.then(ready, squares)
        groups = self.norm_groups(name, len(pes))
        got = squares.copy()
        for size in sorted({len(gr) for gr in groups} - {1}):
            lines = pes[np.stack([gr for gr in groups if len(gr) == size])]
            ready_lines = squares[np.stack([gr for gr in groups if len(gr) == size])]
            n_lines = len(lines)
            one = np.full(n_lines, t)
            total = line_reduce(self.g, lines, np.zeros(n_lines, np.int64), ready_lines,
                                wavelets(one, ly.SUM_BYTES), self.cost.add(one, ly.SUM_BYTES),
                                kind, levels=self.kernels[name].trees.get("reduce", 2))
            back = line_broadcast(self.g, lines, np.zeros(n_lines, np.int64), total,
                                  wavelets(one, ly.SUM_BYTES), kind)
            for gr, tasks in zip([gr for gr in groups if len(gr) == size], back):
                got[gr] = tasks
        scale = self.work(pes, ly.elementwise_work(ly.NORM_SCALE, seg, d), name)
        self.g.then(got, scale)
        self.g.then(squares, scale)
        return scale

    def norm_groups(self, name: str, n: int) -> list[np.ndarray]:
        """PEs of a norm's line whose sums of squares meet: the whole line, or for a norm over
        each head's features, the PEs holding one head (one each when a PE holds whole
        heads)."""
        op = self.ops[name]
        if op.kind != ly.HEAD_RMSNORM:
            return [np.arange(n)]
        heads = op.length // self.model.head_dim
        if n <= heads:
            return [np.array([p]) for p in range(n)]
        owner = (np.arange(n) * heads) // n
        return [np.flatnonzero(owner == h) for h in range(heads)]

    def head_groups(self, s: int) -> list[np.ndarray]:
        """Rows across the stage that share a KV head (one row each when rows are fewer than
        KV heads: such a row holds several heads)."""
        n_kv = self.model.num_kv_heads
        if s <= n_kv:
            return [np.array([b]) for b in range(s)]
        owner = (np.arange(s) * n_kv) // s
        return [np.flatnonzero(owner == h) for h in range(n_kv)]

    def across_groups(self, grid_cols: np.ndarray, groups, ready: np.ndarray,
                      values: np.ndarray, kind: int, back: bool,
                      targets: np.ndarray | None = None, levels: int = 2) -> np.ndarray:
        """Sum ``values`` over the rows of each head group, in every given column at once
        (``grid_cols``, ``ready`` and ``values``: (columns, rows)); with ``back`` the sum
        returns to every row of the group, feeding ``targets`` (tasks, (columns, rows)) if
        given. Returns a task per (column, row) (``targets`` itself when given)."""
        grid_cols, ready, values = (np.atleast_2d(a) for a in (grid_cols, ready, values))
        if targets is not None:
            targets = np.atleast_2d(targets)
        out = ready.copy()
        d = self.d
        cols = grid_cols.shape[0]
        for size in sorted({len(gr) for gr in groups}):
            if size == 1:
                if targets is not None:
                    single = np.array([gr[0] for gr in groups if len(gr) == 1])
                    self.g.then(ready[:, single].ravel(), targets[:, single].ravel())
                    out[:, single] = targets[:, single]
                continue
            rows = np.stack([gr for gr in groups if len(gr) == size])  # (groups, size)
            lines = grid_cols[:, rows].reshape(-1, size)  # (columns * groups, size)
            val = values[:, rows[:, 0]].ravel()
            root = np.zeros(len(lines), dtype=np.int64)
            total = line_reduce(self.g, lines, root, ready[:, rows].reshape(-1, size),
                                wavelets(val, d), self.cost.add(val, d), kind, levels=levels)
            if back:
                fed = None if targets is None else targets[:, rows].reshape(-1, size)
                got = line_broadcast(self.g, lines, root, total, wavelets(val, d), kind,
                                     targets=fed)
                out[:, rows] = got.reshape(cols, len(rows), size)
            else:
                out[:, rows[:, 0]] = total.reshape(cols, len(rows))
        return out

    def attention(self, q_ready, q_edge, k_ready, k_edge, o_strip: Strip) -> tuple:
        """Attention over the KV cache spread across the stage; returns where its output is
        left for o_proj: (PEs of the line across the stage at o_proj's column, sizes, ready
        tasks).

        Queries and keys arrive split by feature across rows, like every vector of the stage.
        A decode runs ``decode_attention``. A prefill splits the queries along the rows: keys
        and values go along the rows, partial scores over each row's features are all-reduced
        over the head's rows (rows across the stage are divided among the KV heads), and each
        PE's outputs for its queries are gathered along the row toward o_proj."""
        model, step, d = self.model, self.step, self.d
        kind = self.kind["attention"]
        grid = self.stage_grid()  # (L, s)
        length, s = grid.shape
        t = step.new_tokens
        hd = model.head_dim
        groups = self.head_groups(s)
        q_sizes = even_split(model.q_size, s)
        kv_sizes = even_split(model.kv_size, s)
        # Query heads whose features a row holds, and per group (all its rows).
        kv_heads_row = np.maximum(1, -(-model.num_kv_heads // s)) if s < model.num_kv_heads \
            else 1
        q_heads_group = kv_heads_row * model.group_size
        a_q = int(np.flatnonzero((grid == q_edge[0]).any(axis=1))[0])
        a_k = int(np.flatnonzero((grid == k_edge[0]).any(axis=1))[0])
        a_o = int(np.flatnonzero((grid == o_strip.pe[0, o_strip.pe.shape[1] // 2]).any(axis=1))[0])
        rows = np.ascontiguousarray(grid.T)  # (s, L)
        window = model.window(self.stage.layers[0] + self.layer_index)
        # Keys each query attends to, on average (causal, capped by a sliding window).
        keys = ly.attended_pairs(window, step) / t
        cap = ly.SOFTCAP_FLOPS if model.attn_logit_softcap else 0
        if step.phase == "decode":
            return self.decode_attention(q_ready, a_q, k_ready, a_k, a_o, o_strip, keys)
        # Prefill: queries split along the rows, keys and values sent along them. A tile's
        # queries see the tokens before the tile and, causally, their own.
        causal_keys = keys  # per query of the tile
        t_a = even_split(t, length)[:, None]  # queries per column
        heads_b = np.maximum(1, (q_heads_group * q_sizes) // max(1, q_sizes[groups[0]].sum()))
        score_values = t_a * causal_keys * heads_b[None, :]
        scores = self.work(grid, ly.Work(
            2 * t_a * causal_keys * q_sizes[None, :],
            t_a * causal_keys * kv_sizes[None, :] * d + t_a * q_sizes[None, :] * d,
            score_values * d), "attention").reshape(length, s)
        line_broadcast(self.g, rows, np.full(s, a_q), q_ready, wavelets(q_sizes * t, d), kind,
                       targets=scores.T.copy())
        line_broadcast(self.g, rows, np.full(s, a_k), k_ready,
                       wavelets(2 * kv_sizes * t, d), kind, targets=scores.T.copy())
        if self.prev_kv is not None:
            # A tile's queries also attend to the keys of the tiles before it.
            self.g.then(np.broadcast_to(self.prev_kv[self.layer_index], scores.shape).ravel(),
                        scores.ravel())
        self.kv_now[self.layer_index] = scores  # stands for this tile's keys being in place
        # Softmax over each query's scores of the row's heads, then the weighted values of the
        # row's output features.
        head_share = q_sizes[None, :] / hd
        weighted = self.work(grid, ly.Work(
            (2 * q_sizes[None, :] + (ly.SOFTMAX_FLOPS + cap) * head_share) * t_a * causal_keys,
            t_a * causal_keys * (kv_sizes[None, :] + heads_b[None, :]) * d,
            t_a * q_sizes[None, :] * d), "attention").reshape(length, s)
        self.across_groups(grid, groups, scores, np.ceil(score_values).astype(np.int64), kind,
                           back=True, targets=weighted)
        piece = (t_a[:, 0].max() * q_sizes)
        gathered = line_reduce(self.g, rows, np.full(s, a_o), weighted.T,
                               wavelets(piece, d), np.zeros(s, dtype=np.int64), kind,
                               gather=True)
        return grid[a_o], q_sizes, self.sinks(grid[a_o], gathered, t)

    def regroup(self, col: np.ndarray, ready: np.ndarray, src_sizes: np.ndarray,
                dst_sizes: np.ndarray, order: np.ndarray, name: str) -> np.ndarray:
        """Re-arrange a vector over the rows of one column: element ``order[i]`` of the
        source layout (split by ``src_sizes``) becomes element i of the destination layout
        (split by ``dst_sizes``). One message per (source row, destination row) pair that
        shares elements; returns a receive task per destination row."""
        t, d = self.step.new_tokens, self.d
        src_row = np.searchsorted(np.cumsum(src_sizes), order, side="right")
        dst_row = np.searchsorted(np.cumsum(dst_sizes), np.arange(len(order)), side="right")
        pairs, counts = np.unique(np.stack([src_row, dst_row]), axis=1, return_counts=True)
        recv = self.g.tasks(col, 0, self.kind[name])
        local = pairs[0] == pairs[1]
        self.g.then(ready[pairs[0][local]], recv[pairs[1][local]])
        far = ~local
        self.g.send(ready[pairs[0][far]], col[pairs[0][far]], col[pairs[1][far]],
                    wavelets(counts[far] * t, d), recv[pairs[1][far]], 0, 3)
        empty = np.setdiff1d(np.arange(len(col)), pairs[1])
        if len(empty):
            self.g.then(np.full(len(empty), ready[0]), recv[empty])
        return recv

    def decode_attention(self, q_ready, a_q: int, k_ready, a_k: int, a_o: int, o_strip: Strip,
                         keys: float) -> np.ndarray:
        """Decode attention over a KV cache spread over the whole stage (WaferLLM's layout):
        each column along the long side holds an equal share of every sequence's cached
        tokens (new tokens enter at the edge column and the oldest shift one column on, so the
        shares stay within one token), and each row holds its slice of the K and V features,
        as the k edge hands them over. Per PE: partial scores of its tokens over its features;
        the partial scores of a head meet at the head's first row, which takes the softmax of
        its column's share and returns the probabilities with the column's max and sum; each
        PE weights its values; the partial outputs (a few features per row) with their max and
        sum meet along the row at o_proj's column by the kernel's tree."""
        model, step, d = self.model, self.step, self.d
        kernel = self.kernels["attention"]
        kind = self.kind["attention"]
        grid = self.stage_grid()  # (L, s)
        length, s = grid.shape
        t, hd, group = step.new_tokens, model.head_dim, model.group_size
        groups = self.head_groups(s)
        q_sizes = even_split(model.q_size, s)
        kv_sizes = even_split(model.kv_size, s)
        kv_bounds = np.concatenate([[0], np.cumsum(kv_sizes)])
        # KV heads whose features a row holds (a slice of one, or several whole ones).
        heads = np.where(kv_sizes > 0, (kv_bounds[1:] - 1) // hd - kv_bounds[:-1] // hd + 1, 0)
        tokens = even_split(int(round(keys)), length)[:, None]  # (L, 1): cached, per column
        rows = np.ascontiguousarray(grid.T)  # (s, L)
        # Queries: row b needs, for every query head of its KV heads, the features at its K
        # positions; they arrive in the q_proj layout and are regrouped within the column.
        kv_feature = np.arange(model.kv_size)
        order = ((kv_feature // hd * group)[:, None] + np.arange(group)[None, :]) * hd \
            + (kv_feature % hd)[:, None]  # (kv feature, query head of its group)
        q_here = self.regroup(grid[a_q], q_ready, q_sizes, group * kv_sizes, order.ravel(),
                              "attention")
        scores = self.work(grid, ly.Work(
            2 * t * group * tokens * kv_sizes[None, :],
            (tokens * kv_sizes[None, :] + t * group * kv_sizes[None, :]) * d,
            t * group * heads[None, :] * tokens * d), "attention").reshape(length, s)
        line_broadcast(self.g, rows, np.full(s, a_q), q_here,
                       wavelets(t * group * kv_sizes, d), kind, targets=scores.T.copy())
        # The new token's K and V enter at the edge column nearer k_proj's edge; every column
        # then passes its oldest token one column on, off the critical path.
        a_new = 0 if a_k < length / 2 else length - 1
        kv_new = self.g.tasks(grid[a_new], self.cost.cycles(0, 0, 2 * t * kv_sizes * d), kind)
        if a_new == a_k:
            self.g.then(k_ready, kv_new)
        else:
            self.g.send(k_ready, grid[a_k], grid[a_new], wavelets(2 * kv_sizes * t, d), kv_new,
                        0, 3)
        self.g.then(kv_new, scores[a_new])
        step_dir = 1 if a_new == 0 else -1
        senders = np.arange(length - 1) if step_dir == 1 else np.arange(1, length)
        if len(senders):
            shifted = self.g.tasks(grid[senders + step_dir], self.cost.cycles(
                0, 0, 2 * t * kv_sizes[None, :] * d * np.ones((len(senders), 1))), kind)
            self.g.send(scores[senders].ravel(), grid[senders].ravel(),
                        grid[senders + step_dir].ravel(),
                        np.tile(wavelets(2 * kv_sizes * t, d), len(senders)), shifted, 0, 3)
        # Partial scores of each head meet at the head's first row; the softmax of the
        # column's share runs there; probabilities, max and sum return to the head's rows.
        cap = ly.SOFTCAP_FLOPS if model.attn_logit_softcap else 0
        first = np.array([gr[0] for gr in groups])
        per_row = t * group * heads[None, :] * tokens  # (L, s): scores a row holds
        met = self.across_groups(grid, groups, scores, per_row, kind, back=False,
                                 levels=kernel.trees.get("across", 2))
        group_scores = per_row[:, first]
        soft = self.work(grid[:, first], ly.Work(
            (ly.SOFTMAX_FLOPS + cap) * group_scores, group_scores * d,
            group_scores * d), "attention").reshape(length, len(first))
        self.g.then(met[:, first].ravel(), soft.ravel())
        weighted = self.work(grid, ly.Work(
            2 * t * group * tokens * kv_sizes[None, :],
            (tokens * kv_sizes[None, :] + per_row) * d,
            t * group * (kv_sizes[None, :] + 2 * heads[None, :]) * d),
            "attention").reshape(length, s)
        stats = t * group * heads * 2
        self.group_broadcast(grid, groups, soft, per_row + stats[None, :], kind,
                             targets=weighted)
        out_values = t * group * (kv_sizes + 2 * heads)
        combine = self.cost.cycles(3 * out_values, 3 * out_values * d, out_values * d)
        along = line_reduce(self.g, rows, np.full(s, a_o), weighted.T, wavelets(out_values, d),
                            combine, kind, levels=kernel.trees.get("along", 2))
        final = self.g.tasks(grid[a_o], self.cost.cycles(
            t * group * kv_sizes, t * group * kv_sizes * d, t * group * kv_sizes * d), kind)
        self.g.then(along, final)
        final = self.sinks(grid[a_o], final, t)
        # Back to the q_proj layout o_proj reads, then into o_proj's entries.
        inverse = np.empty(model.q_size, dtype=np.int64)
        inverse[order.ravel()] = np.arange(model.q_size)
        o_here = self.regroup(grid[a_o], final, group * kv_sizes, q_sizes, inverse,
                              "attention")
        return grid[a_o], q_sizes, o_here

    def sinks(self, pes: np.ndarray, ready: np.ndarray, tokens: int) -> np.ndarray:
        """gpt-oss's sinks: each query head's learned logit joins its softmax's sum where the
        head's output is finished (the row holding its features, on o_proj's line)."""
        if not self.model.attention_sinks:
            return ready
        heads = even_split(self.model.num_heads, len(pes))
        done = self.work(pes, ly.Work(ly.SOFTMAX_FLOPS * tokens * heads,
                                      heads * (tokens + 1) * self.d, 0), "attention")
        self.g.then(ready, done)
        return done

    def group_broadcast(self, grid_cols, groups, ready_first, values, kind, targets):
        """From each head's first row, ``values`` (per column and row) to every row of the
        head, feeding ``targets`` (tasks, (columns, rows)); ``ready_first``: (columns,
        heads)."""
        first_index = {int(gr[0]): i for i, gr in enumerate(groups)}
        for size in sorted({len(gr) for gr in groups}):
            chosen = [gr for gr in groups if len(gr) == size]
            rows = np.stack(chosen)  # (heads of this size, size)
            ready = ready_first[:, [first_index[int(gr[0])] for gr in chosen]]
            if size == 1:
                self.g.then(ready.ravel(), targets[:, rows[:, 0]].ravel())
                continue
            lines = grid_cols[:, rows].reshape(-1, size)
            line_broadcast(self.g, lines, np.zeros(len(lines), dtype=np.int64), ready.ravel(),
                           wavelets(values[:, rows[:, 0]].ravel(), self.d), kind,
                           targets=targets[:, rows].reshape(-1, size))

    # --- a stage --------------------------------------------------------------------------
    def build(self):
        """The whole stage for the step: a prefill's token tiles one after another (their
        tasks interleave on the PEs, so tiles stream through the kernels). Returns the graph
        and, per tile, the tasks that finish it."""
        finals = []
        whole = self.step
        for i, tile in enumerate(whole.tiles()):
            self.step = tile
            self.g.priority = i  # an earlier tile's work goes first on every PE
            self.kv_now = {}
            finals.append(self.build_tile())
            self.prev_kv = self.kv_now
        self.step = whole
        return self.g.build(), finals

    def build_tile(self) -> np.ndarray:
        ks, model = self.kernels, self.model
        h = model.hidden_size
        strips = {n: self.strip(k) for n, k in ks.items()
                  if k.kind == "matrix" or (k.kind == "gather" and k.weight_ref is None)}
        home_name = ly.home_site(self.model) if self.stage.num_layers else "lm_head"
        home = strips[home_name]
        hsz = even_split(h, len(home.edge))
        if "embedding" in strips:
            x = self.gather(strips["embedding"], tied=False)
            x = self.feed(strips["embedding"].edge, hsz, x, home.edge, hsz, "embedding")
        else:
            x = self.g.tasks(home.edge, 0, self.kind.get("input_norm", self.kind[home_name]))
        if "embed_scale" in ks:
            x = self.vector("embed_scale", home.edge, [x], hsz)
        for i in range(self.stage.num_layers):
            self.layer_index = i
            x = self.layer(strips, home, x, hsz)
        if "lm_head" in strips and (self.step.phase == "decode" or self.is_last_tile()):
            head = strips["lm_head"]
            normed = self.norm("final_norm", home.edge, x, hsz)
            logits = self.matrix(head, pieces=(home.edge, hsz, normed))
            if "logit_softcap" in ks:
                logits = self.vector("logit_softcap", head.edge, [logits], head.n_sizes)
            t = self.step_tokens("lm_head")
            best = self.vector("lm_head", head.edge, [logits], head.n_sizes, cost=ARGMAX,
                               counted=False)
            x = line_reduce(self.g, head.edge[None, :], np.array([0]), best[None, :],
                            wavelets(np.array([2 * t]), 4), self.cost.add(np.array([t]), 4),
                            self.kind["lm_head"])
        return x

    def is_last_tile(self) -> bool:
        return self.step.prefix + self.step.tokens >= self.whole_end

    def layer(self, strips, home: Strip, x: np.ndarray, hsz: np.ndarray) -> np.ndarray:
        """One layer, op by op as the layer description lists them: each op takes its inputs
        from where they were left (re-split onto its own site when that is elsewhere) and
        leaves its output on its site.

        With attention tiles (batch tiling on attention), the ops up to the attention's
        residual add run tile after tile, an earlier tile first on every PE, and the rest of
        the layer (the MLP or the experts) takes the tiles' outputs together, as one batch."""
        ready = {ly.LAYER_INPUT: x}
        at = {ly.LAYER_INPUT: (home.edge, hsz)}  # op -> (PEs, sizes) holding its output
        if self.stage.part is not None and self.stage.part[0] > 0:
            # A split layer's second part: the first part's experts' input and each token's
            # choices arrived with the stream, on the home line.
            ready["post_attn_norm"], at["post_attn_norm"] = x, (home.edge, hsz)
            ready["route"] = (home.edge[0], x[0])
            at["route"] = (home.edge[:1], np.array([self.model.experts_per_token]))
        tiles = self.step.attention_tiles(ly.attention_tile_of(self.program.options))
        if len(tiles) == 1 or not self.stage.has_attention:
            ready, at = self.layer_ops(strips, home, self.layer_table, ready, at)
            return self.hand_on(home, hsz, ready, at)
        split = 1 + next(i for i, op in enumerate(self.layer_table)
                         if op.name == ly.ATTENTION_BLOCK_END)
        whole, first = self.step, self.g.priority
        done = []
        for i, tile in enumerate(tiles):
            # (a graph's priorities stop at 255: tiles past that go by readiness alone)
            self.step, self.g.priority = tile, min(first + i, 255)
            done.append(self.layer_ops(strips, home, self.layer_table[:split], dict(ready),
                                       dict(at)))
        self.step, self.g.priority = whole, first
        tile_ready, tile_at = done[0]
        at.update(tile_at)  # every tile leaves its outputs in the same places
        for name in {src for op in self.layer_table[split:] for src in op.inputs}:
            if name == ly.LAYER_INPUT or name not in tile_ready:
                continue
            # The tiles' outputs concatenated: a PE holds the batch once its every tile is in.
            joined = self.g.tasks(at[name][0], 0, self.kind[self.ops[name].kernel])
            for out, _ in done:
                self.g.then(out[name], joined)
            ready[name] = joined
        return self.hand_on(home, hsz, *self.layer_ops(strips, home, self.layer_table[split:],
                                                       ready, at))

    def hand_on(self, home: Strip, hsz: np.ndarray, ready: dict, at: dict) -> np.ndarray:
        """The tasks after which the layer's output can leave the stage: the residual stream
        on the home line, and after a split layer's first part also what its second part
        needs (``layer.SPLIT_CARRIED``), brought to the home line."""
        out = ready[ly.LAYER_OUTPUT]
        if self.stage.part is None or self.stage.part[0] > 0:
            return out
        norm_pes, norm_sizes = at["post_attn_norm"]
        normed = self.feed(norm_pes, norm_sizes, ready["post_attn_norm"], home.edge, hsz,
                           "post_attn_norm")
        route_pe, route_task = ready["route"]
        k = self.model.experts_per_token
        choices = self.g.tasks(home.edge[:1], 0, self.kind["route"])
        t = self.step_tokens("route")
        if route_pe == home.edge[0]:
            self.g.then(np.array([route_task]), choices)
        else:
            self.g.send(np.array([route_task]), np.array([route_pe]), home.edge[:1],
                        wavelets(np.array([t * k]), self.d + ly.TOKEN_ID_BYTES), choices, 0,
                        VC_TRANSFER)
        return np.concatenate([out, normed, choices])

    def layer_ops(self, strips, home: Strip, ops: list[ly.Op], ready: dict, at: dict):
        """``ops`` of one layer for the current step, from the tasks in ``ready`` (op -> the
        tasks that finish its output on its PEs) and the places in ``at`` (op -> the PEs and
        sizes holding its output); returns both with every op of ``ops`` added."""
        axis = None  # a mixture of experts: this layer's tokens per expert, on the E x m axis
        if self.model.num_experts and any(op.kind == ly.EXPERT_GEMM for op in ops):
            loads = layer_loads(self.program, self.model, self.layer_index,
                                self.step.new_tokens, self.step.prefix)
            held = next(op for op in ops if op.kind == ly.EXPERT_GEMM)
            loads = loads[held.first_expert:held.first_expert + held.experts]
            axis = RoutedAxis(loads, self.model.moe_intermediate_size)
        on_axis: set[str] = set()  # ops whose output lies on the expert axis

        def site(name: str) -> tuple[np.ndarray, np.ndarray]:
            """The edge line of a strip, with the sizes its PEs hold."""
            if name == ly.HOME:
                return at[ly.LAYER_INPUT]
            if name in on_axis:  # an expert strip's outputs, each expert's on its run
                return at[name]
            return strips[name].edge, strips[name].n_sizes

        def gathered(op: ly.Op, pes: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
            out = []
            for src in op.inputs:
                src_pes, src_sizes = at[src]
                if src == "route":  # every PE of the op's site needs each token's choices
                    if op.site in on_axis:  # experts' runs: multicast over their strip
                        grid = strips[op.site].pe
                        got = self.g.tasks(grid.ravel(), 0, self.kind[op.kernel])
                        deliver_route(self, *ready[src], grid, got.reshape(grid.shape),
                                      op.kernel)
                        where = np.full(self.g.width * self.g.height, -1, np.int64)
                        where[grid.ravel()] = np.arange(grid.size)
                        out.append(got[where[pes]])
                    else:
                        got = self.g.tasks(pes, 0, self.kind[op.kernel])
                        deliver_route(self, *ready[src], pes[None, :], got[None, :],
                                      op.kernel)
                        out.append(got)
                elif np.array_equal(src_pes, pes):
                    out.append(ready[src])
                else:
                    out.append(self.feed(src_pes, src_sizes, ready[src], pes, sizes, op.kernel,
                                         axis if src in on_axis else None))
            return out

        for op in ops:
            if op.kind == ly.EXPERT_GEMM:
                src = op.inputs[0]
                pes, sizes, ready[op.name] = expert_matrix(
                    self, strips[op.name], op, axis, (*at[src], ready[src]), ready["route"])
                at[op.name] = (pes, sizes)
                if not op.experts_summed:  # each expert's m outputs, on its own run
                    on_axis.add(op.name)
            elif op.kind == ly.ROUTE:
                pes, sizes = site(op.site)
                (dep,) = gathered(op, pes, sizes)
                ready[op.name] = route(self, op, pes, dep, sizes)
                at[op.name] = (pes[:1], np.array([op.length]))
            elif op.kind == ly.GEMM:
                st = strips[op.name]
                (src,) = op.inputs
                ready[op.name] = self.matrix(st, pieces=(*at[src], ready[src]))
                at[op.name] = (st.edge, st.n_sizes)
            elif op.kind == ly.KV_APPEND:
                pes, sizes = site(op.site)
                kv = self.g.tasks(pes, 0, self.kind[op.kernel])
                for dep in gathered(op, pes, sizes):
                    self.g.then(dep, kv)
                ready[op.name], at[op.name] = kv, (pes, sizes)
            elif op.kind == ly.ATTN_SCORES:
                q_src, kv_src = op.inputs
                consumer = next(o for o in self.layer_table
                                if o.inputs == (ly.ATTENTION_OUTPUT,))
                pes, sizes, out = self.attention(ready[q_src], at[q_src][0], ready[kv_src],
                                                 at[kv_src][0], strips[consumer.name])
                ready[ly.ATTENTION_OUTPUT], at[ly.ATTENTION_OUTPUT] = out, (pes, sizes)
            elif op.kernel_kind == "attention":
                continue  # the rest of the attention pattern, built with its scores
            else:
                pes, sizes = site(op.site)
                inputs = gathered(op, pes, sizes)
                if op.kernel_kind == "norm":
                    (dep,) = inputs
                    ready[op.name] = self.norm(op.name, pes, dep, sizes)
                else:
                    routed = any(src in on_axis for src in op.inputs)
                    ready[op.name] = self.vector(op.name, pes, inputs, sizes,
                                                 axis=axis if routed else None)
                    if routed:
                        on_axis.add(op.name)
                at[op.name] = (pes, sizes)
        return ready, at


def stage_graph(program: WaferProgram, stage: Stage, step: MicroBatch):
    """(task graph, final tasks per token tile, kernel names by task kind) for one stage."""
    sg = StageGraph(program, stage, step)
    graph, finals = sg.build()
    return graph, finals, sg.kind_names



def kernel_graph(program: WaferProgram, stage: Stage, name: str, step: MicroBatch):
    """One kernel of a stage alone, its inputs present at cycle 0 (to time it against its
    analytic bound and to compare the engines pattern by pattern)."""
    sg = StageGraph(program, stage, step)
    k = sg.kernels[name]
    kind = sg.kind[name]
    if k.kind == "matrix":
        st = sg.strip(k)
        sg.matrix(st, sg.g.tasks(sg.entry_pes(st), 0, kind))
    elif k.kind == "gather":
        sg.gather(sg.strip(k) if k.weight_ref is None else sg.strip(program.kernels[k.weight_ref]),
                  tied=k.weight_ref is not None)
    elif k.kind in ("norm", "elementwise"):
        r, st = k.rect, stage.rect
        xs, ys = np.meshgrid(np.arange(r.x, r.x1) - st.x, np.arange(r.y, r.y1) - st.y)
        pes = sg.g.pe(xs.ravel(), ys.ravel())
        sizes = even_split(k.length, len(pes))
        if k.kind == "norm":
            sg.norm(name, pes, sg.g.tasks(pes, 0, kind), sizes)
        else:
            op = sg.ops[name]
            inputs = [sg.g.tasks(pes, 0, kind) for _ in op.inputs]
            sg.vector(name, pes, inputs, sizes)
    elif k.kind == "attention":
        q, kk, o = (sg.strip(sg.kernels[n]) for n in ("q_proj", "k_proj", "o_proj"))
        pes, sizes, out = sg.attention(sg.g.tasks(q.edge, 0, kind), q.edge,
                                       sg.g.tasks(kk.edge, 0, kind), kk.edge, o)
        # Alone, the kernel ends with its output collected at o_proj's line entries.
        sg.feed(pes, sizes, out, sg.entry_pes(o), o.k_sizes, "attention")
    else:
        raise ValueError(f"no pattern for kernel kind {k.kind!r}")
    return sg.g.build()

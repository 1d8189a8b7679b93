"""Attention over a KV cache spread across the whole stage (``attention_kv_spread``).

Each column along the stage's long side holds a share of the cached tokens and each row a slice
of their K and V features (``program.kvlayout``; WaferLLM's layout). Queries and keys arrive
split by feature across rows, like every vector of the stage. A decode scores each PE's tokens
over its features, reduces the partial scores across a head's rows and the partial outputs
along the long side (``decode_attention``); a prefill splits the queries along the long side
instead, each tile's queries attending to the keys of the tiles before it too.
"""

from __future__ import annotations

import numpy as np

from wse_emu.functional.kvstore import StageKV
from wse_emu.kernels.bounds import ceil_div, result
from wse_emu.kernels.patterns.base import Pattern, Tile, register
from wse_emu.kernels.primitives import line_broadcast, line_reduce, wavelets
from wse_emu.models import layer as ly
from wse_emu.program import kvlayout
from wse_emu.program.format import Rect
from wse_emu.util.splits import even_split


class KVSpread(Pattern):
    kind = "attention"
    name = "attention_kv_spread"

    def plan(self, b, stage, lay):
        """The kernel over the whole stage (``lay``: its layout), with gpt-oss's sinks, its
        working buffers and its trees; the KV cache takes what the stage's PEs have left
        once every kernel is planned (``compiler.kvplan``)."""
        model, d = b.model, b.d
        ops = [op for op in ly.layer_ops(model) if op.kernel == "attention"]
        att = b.kernel(stage, "attention", "attention", lay.rect, ops=[op.name for op in ops],
                       pattern={phase: b.pattern_name("attention", phase)
                                for phase in ly.PHASES})
        sinks = sum(op.weight_params for op in ops)  # gpt-oss: a logit per query head
        if sinks:
            # Owned once, a head's sink on the first PE of the stage's line that takes its
            # softmax: spread evenly over the stage's first line along its long side.
            r = lay.rect
            first_line = Rect(r.system, r.x, r.y, r.w, 1) if lay.axis == "x" \
                else Rect(r.system, r.x, r.y, 1, r.h)
            per_pe = even_split(sinks, lay.long) * (stage.num_layers * d)
            att.weight_bytes = sinks * stage.num_layers * d
            b.add("weights", first_line, per_pe[None, :] if lay.axis == "x"
                  else per_pe[:, None])
        # Attention works one query head at a time on each PE: its query, its output
        # accumulator, and the softmax running max and sum in FP32.
        b.add("activations", lay.rect, (2 * model.attention.head_dim) * d + 2 * ly.SUM_BYTES)
        # Its trees, sized for a decode token at the bound's context: partial scores of a
        # head over the head's rows, partial outputs (a row's features of the group's query
        # heads, with their max and sum) along the long side.
        features = int(kvlayout.row_features(model.attention.kv_size, lay.short).max())
        heads_per_row = max(1, -(-model.attention.num_kv_heads // lay.short))
        rows_per_head = max(1, lay.short // model.attention.num_kv_heads)
        scores = model.attention.group_size * heads_per_row * \
            -(-b.options.bound_decode_context // lay.long)
        att.trees["across"] = b.tree_levels(rows_per_head, scores)
        att.trees["along"] = b.tree_levels(
            lay.long, model.attention.group_size * (features + 2 * heads_per_row))
        # One color per level; the two trees run one after the other on crossing axes, so
        # they share their colors, the routes switched between the axes at run time (as
        # WaferLLM's WSE-3 code reconfigures one set of colors per axis).
        levels = max(att.trees["along"] if lay.long > 1 else 0,
                     att.trees["across"] if rows_per_head > 1 else 0)
        for level in range(levels):
            b.route("reduce", f"attention.reduce{level + 1}", lay.rect, src=att.id,
                    dst=[att.id], stage=stage.id)
        return att

    def expand(self, sg, tile: Tile, q_ready, q_edge, k_ready, k_edge, o_strip) -> tuple:
        """(PEs of the line across the stage at o_proj's column, sizes, ready tasks): where
        the attention leaves its output for o_proj."""
        return attention(sg, tile, q_ready, q_edge, k_ready, k_edge, o_strip)

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        d = model.storage.dtype_bytes
        t = ly.op_tokens(ops[0], mb)
        pes = kernel.rect.area
        candidates = []
        for layer in (layers if layers is not None and len(layers) else [None]):
            total = ly.ZERO
            for op in ops:
                total = total + ly.op_cost(op, model, mb, layer)
            candidates.append(total)
        cost = min(candidates, key=lambda c: c.flops)
        # The KV cache is spread evenly over the stage; queries reach every PE and partial
        # results (softmax max and sum, weighted values) are reduced across it.
        radius = ceil_div(kernel.rect.w - 1, 2) + ceil_div(kernel.rect.h - 1, 2)
        path = 2 * fabric.hop_latency_cycles * radius + 2 * fabric.ramp_latency_cycles
        q_in = t * model.attention.q_size * d / pes
        return result(fabric, cost.flops / (pes * fabric.flops_per_cycle(d)),
                      max(cost.read_bytes / (pes * fabric.sram_read_bytes_per_cycle),
                          cost.write_bytes / (pes * fabric.sram_write_bytes_per_cycle)),
                      q_in / fabric.link_bytes_per_cycle, path)

    def load(self, fs, kernel, op, weights, layers) -> None:
        """The stage's KV slots, and gpt-oss's sinks (a logit per query head) per layer."""
        fs.kv = StageKV(fs.program, fs.stage, fs.numerics)
        sink_ops = [o for o in fs.layer_table if o.kind == ly.SOFTMAX and o.weight_params]
        fs.sinks = [weights[fs.tensor_of(sink_ops[0], i)] for i in layers] if sink_ops \
            else None

    def compute(self, fs, op, index, *inputs):
        """K and V appended to the PEs' slots; attention of the queries over them, with the
        softmax and the weighted sum flash-style where the keys are."""
        hd = fs.model.attention.head_dim
        if op.kind == ly.KV_APPEND:
            k, v = inputs
            t = len(k)
            fs.kv.append(index, k.reshape(t, -1, hd), v.reshape(t, -1, hd), fs.positions)
            return None
        q = inputs[0]
        sinks = None if fs.sinks is None else fs.sinks[index]
        return fs.kv.attend(index, q.reshape(len(q), -1, hd), fs.positions, sinks)

    def alone(self, sg, kernel, tile: Tile) -> None:
        kind = sg.kind[kernel.name]
        q, kk, o = (sg.strip(sg.kernels[n]) for n in ("q_proj", "k_proj", "o_proj"))
        pes, sizes, out = self.expand(sg, tile, sg.g.tasks(q.edge, 0, kind), q.edge,
                                      sg.g.tasks(kk.edge, 0, kind), kk.edge, o)
        # Alone, the kernel ends with its output collected at o_proj's line entries.
        sg.feed(pes, sizes, out, sg.entry_pes(o), o.k_sizes, "attention", tile)


register(KVSpread())


def head_groups(sg, s: int) -> list[np.ndarray]:
    """Rows across the stage that share a KV head (one row each when rows are fewer than
    KV heads: such a row holds several heads)."""
    n_kv = sg.model.attention.num_kv_heads
    if s <= n_kv:
        return [np.array([b]) for b in range(s)]
    owner = (np.arange(s) * n_kv) // s
    return [np.flatnonzero(owner == h) for h in range(n_kv)]

def across_groups(sg, grid_cols: np.ndarray, groups, ready: np.ndarray,
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
    d = sg.d
    cols = grid_cols.shape[0]
    for size in sorted({len(gr) for gr in groups}):
        if size == 1:
            if targets is not None:
                single = np.array([gr[0] for gr in groups if len(gr) == 1])
                sg.g.then(ready[:, single].ravel(), targets[:, single].ravel())
                out[:, single] = targets[:, single]
            continue
        rows = np.stack([gr for gr in groups if len(gr) == size])  # (groups, size)
        lines = grid_cols[:, rows].reshape(-1, size)  # (columns * groups, size)
        val = values[:, rows[:, 0]].ravel()
        root = np.zeros(len(lines), dtype=np.int64)
        total = line_reduce(sg.g, lines, root, ready[:, rows].reshape(-1, size),
                            wavelets(val, d), sg.cost.add(val, d), kind, levels=levels)
        if back:
            fed = None if targets is None else targets[:, rows].reshape(-1, size)
            got = line_broadcast(sg.g, lines, root, total, wavelets(val, d), kind,
                                 targets=fed)
            out[:, rows] = got.reshape(cols, len(rows), size)
        else:
            out[:, rows[:, 0]] = total.reshape(cols, len(rows))
    return out

def attention(sg, tile: Tile, q_ready, q_edge, k_ready, k_edge, o_strip) -> tuple:
    """Attention over the KV cache spread across the stage; returns where its output is
    left for o_proj: (PEs of the line across the stage at o_proj's column, sizes, ready
    tasks).

    Queries and keys arrive split by feature across rows, like every vector of the stage.
    A decode runs ``decode_attention``. A prefill splits the queries along the rows: keys
    and values go along the rows, partial scores over each row's features are all-reduced
    over the head's rows (rows across the stage are divided among the KV heads), and each
    PE's outputs for its queries are gathered along the row toward o_proj."""
    model, step, d = sg.model, tile.step, sg.d
    kind = sg.kind["attention"]
    grid = sg.stage_grid()  # (L, s)
    length, s = grid.shape
    t = step.new_tokens
    hd = model.attention.head_dim
    groups = head_groups(sg, s)
    q_sizes = even_split(model.attention.q_size, s)
    kv_sizes = even_split(model.attention.kv_size, s)
    # Query heads whose features a row holds, and per group (all its rows).
    kv_heads = model.attention.num_kv_heads
    kv_heads_row = np.maximum(1, -(-kv_heads // s)) if s < kv_heads else 1
    q_heads_group = kv_heads_row * model.attention.group_size
    a_q = int(np.flatnonzero((grid == q_edge[0]).any(axis=1))[0])
    a_k = int(np.flatnonzero((grid == k_edge[0]).any(axis=1))[0])
    a_o = int(np.flatnonzero((grid == o_strip.pe[0, o_strip.pe.shape[1] // 2]).any(axis=1))[0])
    rows = np.ascontiguousarray(grid.T)  # (s, L)
    window = model.attention.window(sg.stage.layers[0] + tile.layer)
    # Keys each query attends to, on average (causal, capped by a sliding window).
    keys = ly.attended_pairs(window, step) / t
    cap = ly.SOFTCAP_FLOPS if model.attention.logit_softcap else 0
    if step.phase == "decode":
        return decode_attention(sg, tile, q_ready, a_q, k_ready, a_k, a_o, o_strip, keys)
    # Prefill: queries split along the rows, keys and values sent along them. A tile's
    # queries see the tokens before the tile and, causally, their own.
    causal_keys = keys  # per query of the tile
    t_a = even_split(t, length)[:, None]  # queries per column
    heads_b = np.maximum(1, (q_heads_group * q_sizes) // max(1, q_sizes[groups[0]].sum()))
    score_values = t_a * causal_keys * heads_b[None, :]
    scores = sg.work(grid, ly.Work(
        2 * t_a * causal_keys * q_sizes[None, :],
        t_a * causal_keys * kv_sizes[None, :] * d + t_a * q_sizes[None, :] * d,
        score_values * d), "attention").reshape(length, s)
    line_broadcast(sg.g, rows, np.full(s, a_q), q_ready, wavelets(q_sizes * t, d), kind,
                   targets=scores.T.copy())
    line_broadcast(sg.g, rows, np.full(s, a_k), k_ready,
                   wavelets(2 * kv_sizes * t, d), kind, targets=scores.T.copy())
    if tile.keys_before is not None:
        # A tile's queries also attend to the keys of the tiles before it.
        sg.g.then(np.broadcast_to(tile.keys_before[tile.layer], scores.shape).ravel(),
                  scores.ravel())
    tile.keys_placed[tile.layer] = scores  # stands for this tile's keys being in place
    # Softmax over each query's scores of the row's heads, then the weighted values of the
    # row's output features.
    head_share = q_sizes[None, :] / hd
    weighted = sg.work(grid, ly.Work(
        (2 * q_sizes[None, :] + (ly.SOFTMAX_FLOPS + cap) * head_share) * t_a * causal_keys,
        t_a * causal_keys * (kv_sizes[None, :] + heads_b[None, :]) * d,
        t_a * q_sizes[None, :] * d), "attention").reshape(length, s)
    across_groups(sg, grid, groups, scores, np.ceil(score_values).astype(np.int64), kind,
                       back=True, targets=weighted)
    piece = (t_a[:, 0].max() * q_sizes)
    gathered = line_reduce(sg.g, rows, np.full(s, a_o), weighted.T,
                           wavelets(piece, d), np.zeros(s, dtype=np.int64), kind,
                           gather=True)
    return grid[a_o], q_sizes, sinks(sg, grid[a_o], gathered, t)

def regroup(sg, tile: Tile, col: np.ndarray, ready: np.ndarray, src_sizes: np.ndarray,
            dst_sizes: np.ndarray, order: np.ndarray, name: str) -> np.ndarray:
    """Re-arrange a vector over the rows of one column: element ``order[i]`` of the
    source layout (split by ``src_sizes``) becomes element i of the destination layout
    (split by ``dst_sizes``). One message per (source row, destination row) pair that
    shares elements; returns a receive task per destination row."""
    t, d = tile.step.new_tokens, sg.d
    src_row = np.searchsorted(np.cumsum(src_sizes), order, side="right")
    dst_row = np.searchsorted(np.cumsum(dst_sizes), np.arange(len(order)), side="right")
    pairs, counts = np.unique(np.stack([src_row, dst_row]), axis=1, return_counts=True)
    recv = sg.g.tasks(col, 0, sg.kind[name])
    local = pairs[0] == pairs[1]
    sg.g.then(ready[pairs[0][local]], recv[pairs[1][local]])
    far = ~local
    sg.g.send(ready[pairs[0][far]], col[pairs[0][far]], col[pairs[1][far]],
                wavelets(counts[far] * t, d), recv[pairs[1][far]], 0, 3)
    empty = np.setdiff1d(np.arange(len(col)), pairs[1])
    if len(empty):
        sg.g.then(np.full(len(empty), ready[0]), recv[empty])
    return recv

def decode_attention(sg, tile: Tile, q_ready, a_q: int, k_ready, a_k: int, a_o: int,
                     o_strip, keys: float) -> np.ndarray:
    """Decode attention over a KV cache spread over the whole stage (WaferLLM's layout):
    each column along the long side holds an equal share of every sequence's cached
    tokens (new tokens enter at the edge column and the oldest shift one column on, so the
    shares stay within one token), and each row holds its slice of the K and V features,
    as the k edge hands them over. Per PE: partial scores of its tokens over its features;
    the partial scores of a head meet at the head's first row, which takes the softmax of
    its column's share and returns the probabilities with the column's max and sum; each
    PE weights its values; the partial outputs (a few features per row) with their max and
    sum meet along the row at o_proj's column by the kernel's tree."""
    model, step, d = sg.model, tile.step, sg.d
    kernel = sg.kernels["attention"]
    kind = sg.kind["attention"]
    grid = sg.stage_grid()  # (L, s)
    length, s = grid.shape
    t, hd, group = step.new_tokens, model.attention.head_dim, model.attention.group_size
    groups = head_groups(sg, s)
    q_sizes = even_split(model.attention.q_size, s)
    kv_sizes = even_split(model.attention.kv_size, s)
    kv_bounds = np.concatenate([[0], np.cumsum(kv_sizes)])
    # KV heads whose features a row holds (a slice of one, or several whole ones).
    heads = np.where(kv_sizes > 0, (kv_bounds[1:] - 1) // hd - kv_bounds[:-1] // hd + 1, 0)
    tokens = even_split(int(round(keys)), length)[:, None]  # (L, 1): cached, per column
    rows = np.ascontiguousarray(grid.T)  # (s, L)
    # Queries: row b needs, for every query head of its KV heads, the features at its K
    # positions; they arrive in the q_proj layout and are regrouped within the column.
    kv_feature = np.arange(model.attention.kv_size)
    order = ((kv_feature // hd * group)[:, None] + np.arange(group)[None, :]) * hd \
        + (kv_feature % hd)[:, None]  # (kv feature, query head of its group)
    q_here = regroup(sg, tile, grid[a_q], q_ready, q_sizes, group * kv_sizes, order.ravel(),
                          "attention")
    scores = sg.work(grid, ly.Work(
        2 * t * group * tokens * kv_sizes[None, :],
        (tokens * kv_sizes[None, :] + t * group * kv_sizes[None, :]) * d,
        t * group * heads[None, :] * tokens * d), "attention").reshape(length, s)
    line_broadcast(sg.g, rows, np.full(s, a_q), q_here,
                   wavelets(t * group * kv_sizes, d), kind, targets=scores.T.copy())
    # The new token's K and V enter at the edge column nearer k_proj's edge; every column
    # then passes its oldest token one column on, off the critical path.
    a_new = 0 if a_k < length / 2 else length - 1
    kv_new = sg.g.tasks(grid[a_new], sg.cost.cycles(0, 0, 2 * t * kv_sizes * d), kind)
    if a_new == a_k:
        sg.g.then(k_ready, kv_new)
    else:
        sg.g.send(k_ready, grid[a_k], grid[a_new], wavelets(2 * kv_sizes * t, d), kv_new,
                    0, 3)
    sg.g.then(kv_new, scores[a_new])
    if tile.keys_before is not None:
        # A verify step's next tile (each sequence's next drafted token) attends to this
        # tile's entries too: its scores at the edge column wait until they are in.
        sg.g.then(tile.keys_before[tile.layer], scores[a_new])
    tile.keys_placed[tile.layer] = kv_new
    step_dir = 1 if a_new == 0 else -1
    senders = np.arange(length - 1) if step_dir == 1 else np.arange(1, length)
    if len(senders):
        shifted = sg.g.tasks(grid[senders + step_dir], sg.cost.cycles(
            0, 0, 2 * t * kv_sizes[None, :] * d * np.ones((len(senders), 1))), kind)
        sg.g.send(scores[senders].ravel(), grid[senders].ravel(),
                    grid[senders + step_dir].ravel(),
                    np.tile(wavelets(2 * kv_sizes * t, d), len(senders)), shifted, 0, 3)
    # Partial scores of each head meet at the head's first row; the softmax of the
    # column's share runs there; probabilities, max and sum return to the head's rows.
    cap = ly.SOFTCAP_FLOPS if model.attention.logit_softcap else 0
    first = np.array([gr[0] for gr in groups])
    per_row = t * group * heads[None, :] * tokens  # (L, s): scores a row holds
    met = across_groups(sg, grid, groups, scores, per_row, kind, back=False,
                             levels=kernel.trees.get("across", 2))
    group_scores = per_row[:, first]
    soft = sg.work(grid[:, first], ly.Work(
        (ly.SOFTMAX_FLOPS + cap) * group_scores, group_scores * d,
        group_scores * d), "attention").reshape(length, len(first))
    sg.g.then(met[:, first].ravel(), soft.ravel())
    weighted = sg.work(grid, ly.Work(
        2 * t * group * tokens * kv_sizes[None, :],
        (tokens * kv_sizes[None, :] + per_row) * d,
        t * group * (kv_sizes[None, :] + 2 * heads[None, :]) * d),
        "attention").reshape(length, s)
    stats = t * group * heads * 2
    group_broadcast(sg, grid, groups, soft, per_row + stats[None, :], kind,
                         targets=weighted)
    out_values = t * group * (kv_sizes + 2 * heads)
    combine = sg.cost.cycles(3 * out_values, 3 * out_values * d, out_values * d)
    along = line_reduce(sg.g, rows, np.full(s, a_o), weighted.T, wavelets(out_values, d),
                        combine, kind, levels=kernel.trees.get("along", 2))
    final = sg.g.tasks(grid[a_o], sg.cost.cycles(
        t * group * kv_sizes, t * group * kv_sizes * d, t * group * kv_sizes * d), kind)
    sg.g.then(along, final)
    final = sinks(sg, grid[a_o], final, t)
    # Back to the q_proj layout o_proj reads, then into o_proj's entries.
    inverse = np.empty(model.attention.q_size, dtype=np.int64)
    inverse[order.ravel()] = np.arange(model.attention.q_size)
    o_here = regroup(sg, tile, grid[a_o], final, group * kv_sizes, q_sizes, inverse,
                          "attention")
    return grid[a_o], q_sizes, o_here

def sinks(sg, pes: np.ndarray, ready: np.ndarray, tokens: int) -> np.ndarray:
    """gpt-oss's sinks: each query head's learned logit joins its softmax's sum where the
    head's output is finished (the row holding its features, on o_proj's line)."""
    if not sg.model.attention.sinks:
        return ready
    heads = even_split(sg.model.attention.num_heads, len(pes))
    done = sg.work(pes, ly.Work(ly.SOFTMAX_FLOPS * tokens * heads,
                                  heads * (tokens + 1) * sg.d, 0), "attention")
    sg.g.then(ready, done)
    return done

def group_broadcast(sg, grid_cols, groups, ready_first, values, kind, targets):
    """From each head's first row, ``values`` (per column and row) to every row of the
    head, feeding ``targets`` (tasks, (columns, rows)); ``ready_first``: (columns,
    heads)."""
    first_index = {int(gr[0]): i for i, gr in enumerate(groups)}
    for size in sorted({len(gr) for gr in groups}):
        chosen = [gr for gr in groups if len(gr) == size]
        rows = np.stack(chosen)  # (heads of this size, size)
        ready = ready_first[:, [first_index[int(gr[0])] for gr in chosen]]
        if size == 1:
            sg.g.then(ready.ravel(), targets[:, rows[:, 0]].ravel())
            continue
        lines = grid_cols[:, rows].reshape(-1, size)
        line_broadcast(sg.g, lines, np.zeros(len(lines), dtype=np.int64), ready.ravel(),
                       wavelets(values[:, rows[:, 0]].ravel(), sg.d), kind,
                       targets=targets[:, rows].reshape(-1, size))

# --- a stage --------------------------------------------------------------------------

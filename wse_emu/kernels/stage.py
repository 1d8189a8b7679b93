"""One stage of a compiled program, for one micro-batch, as a task graph.

Per layer, op by op as the layer description (``wse_emu.models.layer``) lists them, in the stage's
own coordinates:
- matrix kernels (q, k, v, o, gate, up, down, LM head): each line across the strip owns an
  input segment; each piece of it that a producer PE holds goes to the line's nearest PE and is
  multicast along the line; every PE multiplies its block for every token (a decode in pieces
  of output columns); partial sums meet at the root edge by the kernel's tree
  (``program.trees``) along the strip, piece by piece;
- vector kernels on an edge line (norms, rotary, residual adds, gated activations, scaling,
  soft caps): a task per PE on its segment; norms all-reduce the sum of squares along the line
  (per head's PEs for a per-head norm);
- attention over the KV cache spread over the stage (``program.kvlayout``): each column along
  the long side holds a share of the cached tokens, each row a slice of their K and V features;
  a decode scores each PE's tokens over its features and reduces partial scores across a
  head's rows and partial outputs along the long side (``decode_attention``); a prefill
  splits the queries along the long side instead;
- between kernels, vectors are re-split from producer to consumer by point-to-point messages.
The stage starts with its input on the home line (a task per PE at cycle 0) and ends when the
last layer's residual add (in the last stage: the LM head's argmax) is done.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from wse_emu.kernels import patterns
from wse_emu.kernels.experts import RoutedAxis, deliver_route, layer_loads
from wse_emu.kernels.graph import GraphBuilder, GraphForm
from wse_emu.kernels.patterns import Tile
from wse_emu.kernels.patterns.vector import vector_tasks
from wse_emu.kernels.primitives import (
    VC_TRANSFER,
    CostModel,
    line_reduce,
    overlaps,
    transfer,
    wavelets,
)
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.program.format import Kernel, Stage, WaferProgram
from wse_emu.util.splits import even_split

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
    """The task graph of one stage for one step: the layer's ops walked in order, each op's
    kernel expanded by its pattern (``kernels.patterns``) for the tile at hand (``Tile``),
    its inputs taken from where earlier ops left them."""

    def __init__(self, program: WaferProgram, stage: Stage, step: MicroBatch):
        self.program, self.stage, self.step = program, stage, step  # the whole step
        self.model = program.model
        self.d = self.model.storage.dtype_bytes
        r = stage.rect
        self.g = GraphBuilder(r.w, r.h)
        self.cost = CostModel(program.fabric, self.d)
        self.kernels = {k.name: k for k in program.stage_kernels(stage)}
        self.kind = {name: i for i, name in enumerate(self.kernels)}
        self.kind_names = list(self.kernels)
        self.ops = ly.ops_by_name(self.model)
        self.layer_table = ly.part_ops(self.model, stage.part)
        # Per kernel, the work of its ops as the tasks do it (collectives excluded), so that
        # a test can hold the tasks to the layer description's costs.
        self.ledger: dict[str, ly.Work] = {}

    def pattern(self, kernel: str, tile: Tile) -> patterns.Pattern:
        """The pattern kernel ``kernel`` runs for ``tile``'s phase."""
        return patterns.of(self.kernels[kernel], tile.step.phase)

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
    def feed(self, src_pe, src_sizes, src_ready, dst_pe, dst_sizes, name, tile: Tile,
             axis: RoutedAxis | None = None) -> np.ndarray:
        """Re-split a vector from its producer's line onto a consumer's: every token's
        values, or on an expert axis only the routed tokens' (``axis``)."""
        per_value = self.step_tokens(name, tile) * self.d / 4
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

    def across(self, where: tuple, ready: np.ndarray, name: str, tile: Tile) -> tuple:
        """A vector (its PEs and sizes, ``where``) on a line across the stage, as attention
        splits it: as it is when it lies across already, else re-split onto the line across
        through its first PE (a projection with fewer outputs than the stage has rows lays
        them along its strip: ``StripSpec.transposed``). Returns (PEs, ready tasks)."""
        pes, sizes = where
        grid = self.stage_grid()
        line = grid[int(np.flatnonzero((grid == pes[0]).any(axis=1))[0])]
        if len(pes) == len(line) and np.isin(line, pes).all():
            return pes, ready
        return line, self.feed(pes, sizes, ready, line,
                               even_split(int(sizes.sum()), len(line)), name, tile)

    def stored(self, name: str) -> ly.StoredWeights | None:
        """How a matrix kernel's weights are read: in their stored format."""
        op = self.ops.get(name)
        return ly.stored_weights(op, self.model) if op is not None else None

    def step_tokens(self, name: str, tile: Tile) -> int:
        """Tokens op ``name`` works on in ``tile`` (a prefill's head: the last only)."""
        op = self.ops.get(name)
        return ly.op_tokens(op, tile.step) if op is not None else tile.step.new_tokens

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

    def build(self, like: GraphForm | None = None):
        """The whole stage for the step: a prefill's token tiles one after another (their
        tasks interleave on the PEs, so tiles stream through the kernels). Returns the graph
        (on ``like``'s arrays where it is of that form, ``GraphBuilder.build``) and, per tile,
        the tasks that finish it."""
        finals = []
        keys = None  # per layer, the tasks that placed the earlier tiles' keys
        for i, step in enumerate(self.step.tiles()):
            tile = Tile(step, keys_before=keys)
            with self.g.prioritized(i):  # an earlier tile's work goes first on every PE
                finals.append(self.build_tile(tile))
            keys = tile.keys_placed
        return self.g.build(like), finals

    def build_tile(self, tile: Tile) -> np.ndarray:
        ks, model = self.kernels, self.model
        h = model.hidden_size
        strips = {n: self.strip(k) for n, k in ks.items()
                  if k.kind == "matrix" or (k.kind == "gather" and k.weight_ref is None)}
        home_name = ly.home_site(self.model) if self.stage.num_layers else "lm_head"
        home = strips[home_name]
        hsz = even_split(h, len(home.edge))
        if "embedding" in strips:
            x = self.pattern("embedding", tile).expand(self, tile, strips["embedding"],
                                                       tied=False)
            x = self.feed(strips["embedding"].edge, hsz, x, home.edge, hsz, "embedding", tile)
        else:
            x = self.g.tasks(home.edge, 0, self.kind.get("input_norm", self.kind[home_name]))
        if "embed_scale" in ks:
            x = self.pattern("embed_scale", tile).expand(self, tile, "embed_scale", home.edge,
                                                         [x], hsz)
        for i in range(self.stage.num_layers):
            x = self.layer(strips, home, x, hsz, tile.at_layer(i))
        if "lm_head" in strips and (tile.step.phase == "decode" or self.is_last_tile(tile)):
            head = strips["lm_head"]
            normed = self.pattern("final_norm", tile).expand(self, tile, "final_norm",
                                                             home.edge, [x], hsz)
            logits = self.pattern("lm_head", tile).expand(self, tile, head,
                                                          pieces=(home.edge, hsz, normed))
            if "logit_softcap" in ks:
                logits = self.pattern("logit_softcap", tile).expand(
                    self, tile, "logit_softcap", head.edge, [logits], head.n_sizes)
            t = self.step_tokens("lm_head", tile)
            best = vector_tasks(self, tile, "lm_head", head.edge, [logits], head.n_sizes,
                                cost=ARGMAX, counted=False)
            x = line_reduce(self.g, head.edge[None, :], np.array([0]), best[None, :],
                            wavelets(np.array([2 * t]), 4), self.cost.add(np.array([t]), 4),
                            self.kind["lm_head"])
        return x

    def is_last_tile(self, tile: Tile) -> bool:
        return tile.step.prefix + tile.step.tokens >= self.step.prefix + self.step.tokens

    def layer(self, strips, home: Strip, x: np.ndarray, hsz: np.ndarray,
              tile: Tile) -> np.ndarray:
        """One layer (``tile.layer`` of the stage), op by op as the layer description lists
        them: each op takes its inputs from where they were left (re-split onto its own site
        when that is elsewhere) and leaves its output on its site.

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
            at["route"] = (home.edge[:1], np.array([self.model.experts.top_k]))
        tiles = tile.step.attention_tiles(ly.attention_tile_of(self.program.options))
        if len(tiles) == 1 or not self.stage.has_attention:
            ready, at = self.layer_ops(strips, home, self.layer_table, ready, at, tile)
            return self.hand_on(home, hsz, ready, at, tile)
        split = 1 + next(i for i, op in enumerate(self.layer_table)
                         if op.name == ly.ATTENTION_BLOCK_END)
        first = self.g.priority
        done = []
        for i, step in enumerate(tiles):
            # (a graph's priorities stop at 255: tiles past that go by readiness alone)
            with self.g.prioritized(min(first + i, 255)):
                done.append(self.layer_ops(strips, home, self.layer_table[:split],
                                           dict(ready), dict(at), tile.with_step(step)))
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
                                                       ready, at, tile), tile)

    def hand_on(self, home: Strip, hsz: np.ndarray, ready: dict, at: dict,
                tile: Tile) -> np.ndarray:
        """The tasks after which the layer's output can leave the stage: the residual stream
        on the home line, and after a split layer's first part also what its second part
        needs (``layer.SPLIT_CARRIED``), brought to the home line."""
        out = ready[ly.LAYER_OUTPUT]
        if self.stage.part is None or self.stage.part[0] > 0:
            return out
        norm_pes, norm_sizes = at["post_attn_norm"]
        normed = self.feed(norm_pes, norm_sizes, ready["post_attn_norm"], home.edge, hsz,
                           "post_attn_norm", tile)
        route_pe, route_task = ready["route"]
        k = self.model.experts.top_k
        choices = self.g.tasks(home.edge[:1], 0, self.kind["route"])
        t = self.step_tokens("route", tile)
        if route_pe == home.edge[0]:
            self.g.then(np.array([route_task]), choices)
        else:
            self.g.send(np.array([route_task]), np.array([route_pe]), home.edge[:1],
                        wavelets(np.array([t * k]), self.d + ly.TOKEN_ID_BYTES), choices, 0,
                        VC_TRANSFER)
        return np.concatenate([out, normed, choices])

    def layer_ops(self, strips, home: Strip, ops: list[ly.Op], ready: dict, at: dict,
                  tile: Tile):
        """``ops`` of one layer for ``tile``, from the tasks in ``ready`` (op -> the tasks
        that finish its output on its PEs) and the places in ``at`` (op -> the PEs and sizes
        holding its output); returns both with every op of ``ops`` added. Each op's kernel
        is expanded by its pattern; what differs between ops is only where their inputs
        are."""
        axis = None  # a mixture of experts: this layer's tokens per expert, on the E x m axis
        if self.model.is_moe and any(op.kind == ly.EXPERT_GEMM for op in ops):
            loads = layer_loads(self.program, self.model, tile.layer, tile.step.new_tokens,
                                tile.step.prefix)
            held = next(op for op in ops if op.kind == ly.EXPERT_GEMM)
            loads = loads[held.first_expert:held.first_expert + held.experts]
            axis = RoutedAxis(loads, self.model.experts.intermediate_size)
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
                        deliver_route(self, tile, *ready[src], grid,
                                      got.reshape(grid.shape), op.kernel)
                        where = np.full(self.g.width * self.g.height, -1, np.int64)
                        where[grid.ravel()] = np.arange(grid.size)
                        out.append(got[where[pes]])
                    else:
                        got = self.g.tasks(pes, 0, self.kind[op.kernel])
                        deliver_route(self, tile, *ready[src], pes[None, :],
                                      got[None, :], op.kernel)
                        out.append(got)
                elif np.array_equal(src_pes, pes):
                    out.append(ready[src])
                else:
                    out.append(self.feed(src_pes, src_sizes, ready[src], pes, sizes, op.kernel,
                                         tile, axis if src in on_axis else None))
            return out

        for op in ops:
            pattern = self.pattern(op.kernel, tile)
            if op.kind == ly.EXPERT_GEMM:
                src = op.inputs[0]
                pes, sizes, ready[op.name] = pattern.expand(
                    self, tile, strips[op.name], op, axis, (*at[src], ready[src]),
                    ready["route"])
                at[op.name] = (pes, sizes)
                if not op.experts_summed:  # each expert's m outputs, on its own run
                    on_axis.add(op.name)
            elif op.kind == ly.ROUTE:
                pes, sizes = site(op.site)
                (dep,) = gathered(op, pes, sizes)
                ready[op.name] = pattern.expand(self, tile, op, pes, dep, sizes)
                at[op.name] = (pes[:1], np.array([op.length]))
            elif op.kind == ly.GEMM:
                st = strips[op.name]
                (src,) = op.inputs
                ready[op.name] = pattern.expand(self, tile, st, pieces=(*at[src], ready[src]))
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
                q_pes, q_ready = self.across(at[q_src], ready[q_src], op.kernel, tile)
                kv_pes, kv_ready = self.across(at[kv_src], ready[kv_src], op.kernel, tile)
                pes, sizes, out = pattern.expand(self, tile, q_ready, q_pes, kv_ready, kv_pes,
                                                 strips[consumer.name])
                ready[ly.ATTENTION_OUTPUT], at[ly.ATTENTION_OUTPUT] = out, (pes, sizes)
            elif op.kernel_kind == "attention":
                continue  # the rest of the attention pattern, built with its scores
            else:
                pes, sizes = site(op.site)
                inputs = gathered(op, pes, sizes)
                routed = any(src in on_axis for src in op.inputs)
                ready[op.name] = pattern.expand(self, tile, op.name, pes, inputs, sizes,
                                                axis=axis if routed else None)
                if routed:
                    on_axis.add(op.name)
                at[op.name] = (pes, sizes)
        return ready, at


# The forms of the stage graphs built last (``GraphForm``), by program, stage and phase, for
# ``stage_graph(on_forms=True)``: a stage table times one stage at shape after shape, and a
# decode's graph differs from one shape to the next only in its costs. A form is a hint,
# checked whole before it is taken; each is as large as its graph (a whole-wafer stage's,
# about a hundred megabytes). Tables are timed stage by stage, a stage's shapes in turn (on
# worker processes or threads alike), so the form asked for is the last one made: a second
# kept cost a worker about 130 MiB of its peak and bought no time (the quick-grid frontier's
# tables, timed both ways).
FORMS_KEPT = 1
_forms: dict = {}
_forms_lock = threading.Lock()


def stage_graph(program: WaferProgram, stage: Stage, step: MicroBatch, on_forms: bool = False):
    """(task graph, final tasks per token tile, kernel names by task kind) for one stage;
    with ``on_forms``, on the arrays of the last graph of the stage and phase where it is
    of the same form (and kept as the next one's), for a caller that builds shape after
    shape."""
    sg = StageGraph(program, stage, step)
    if not on_forms:
        graph, finals = sg.build()
        return graph, finals, sg.kind_names
    key = (id(program), stage.id, step.phase, step.drafted)
    with _forms_lock:
        like = _forms.get(key)
    graph, finals = sg.build(like)
    if sg.g.form is not like:
        with _forms_lock:
            _forms.pop(key, None)
            _forms[key] = sg.g.form
            while len(_forms) > FORMS_KEPT:
                del _forms[next(iter(_forms))]
    return graph, finals, sg.kind_names


def kernel_graph(program: WaferProgram, stage: Stage, name: str, step: MicroBatch):
    """One kernel of a stage alone, its inputs present at cycle 0 (to time it against its
    analytic bound and to compare the engines pattern by pattern)."""
    sg = StageGraph(program, stage, step)
    kernel = sg.kernels[name]
    patterns.of(kernel, step.phase).alone(sg, kernel, Tile(step))
    return sg.g.build()

"""The embedding lookup (``row_gather``): the PEs holding the tokens' rows send their slices to
where the residual stream starts.

An untied table splits the vocabulary along its strip and the hidden size across it, so a
token's row lies on one line across the strip: its column's PEs read their slices and send
them to the root edge. A tied table is the LM head's, which splits the vocabulary across
instead: a token's row then runs along the strip, and its slices stay on one line.
"""

from __future__ import annotations

import numpy as np

from wse_emu.functional.tiles import MatrixTiles
from wse_emu.kernels.bounds import ceil_div, result
from wse_emu.kernels.patterns.base import Pattern, Tile, register
from wse_emu.kernels.patterns.matrix import StripSite, plan_strip
from wse_emu.kernels.primitives import wavelets
from wse_emu.models import layer as ly
from wse_emu.util.splits import even_split


class RowGather(Pattern):
    kind = "gather"
    name = "row_gather"

    def plan(self, b, stage, lay, strip, body, edge, high: bool, names: dict):
        """The table's strip (``matrix.plan_strip``); each PE buffers its output row slices
        with the token ids, and nothing is reduced."""
        return plan_strip(b, stage, lay, strip, StripSite(body, edge, high), self.kind, names,
                          b.options.buffer_tokens, ly.TOKEN_ID_BYTES)

    def expand(self, sg, tile: Tile, st, tied: bool) -> np.ndarray:
        """The lookup for ``tile``'s tokens; returns the tasks holding the rows: on the root
        edge (untied), or on the line the row runs along (tied, hidden split along it)."""
        kind = sg.kind["embedding"]
        t, d = tile.step.new_tokens, sg.d
        e, s = st.pe.shape
        if not tied:
            # Tokens spread evenly over the columns of the vocabulary.
            per_col = even_split(t, min(t, e))
            cols = (np.arange(len(per_col)) * e) // len(per_col)
            rows_bytes = np.repeat(per_col, s) * np.tile(st.n_sizes, len(cols)) * d
            lookups = sg.work(st.pe[cols].ravel(), ly.Work(0, rows_bytes, rows_bytes),
                              "embedding")
            lookups = lookups.reshape(len(cols), s)
            roots = sg.g.tasks(st.edge, 0, kind)
            for i, a in enumerate(cols):
                if a == st.root:
                    sg.g.then(lookups[i], roots)
                else:
                    sg.g.send(lookups[i], st.pe[a], st.edge,
                              wavelets(per_col[i] * st.n_sizes, d), roots, 0, 1)
            return roots
        # Tied: K (hidden) runs along the strip: the token's row is one line across a.
        line = sg.entry_pes(st)
        return sg.work(line, ly.Work(0, t * st.k_sizes * d, t * st.k_sizes * d), "embedding")

    def bound(self, kernel, ops, model, fabric, mb, layers=None, part=None) -> dict:
        # A token's row may sit in the root's own column: only writing the gathered slices
        # is certain.
        t, d = ly.op_tokens(ops[0], mb), model.storage.dtype_bytes
        k, n = kernel.matrix
        kp, np_ = kernel.grid
        seg = ceil_div(n, np_) if kernel.weight_ref is None else ceil_div(k, kp)
        return result(fabric, 0, t * seg * d / fabric.sram_write_bytes_per_cycle, 0, 0)

    def load(self, fs, kernel, op, weights, layers) -> None:
        """An untied table as its strip's PEs hold it (a tied one is the LM head's)."""
        if kernel.weight_ref is None:
            fs.matrices[kernel.name] = MatrixTiles.build(
                kernel, fs.matrices_of(op, weights, layers), fs.numerics)

    def alone(self, sg, kernel, tile: Tile) -> None:
        tied = kernel.weight_ref is not None
        table = sg.program.kernels[kernel.weight_ref] if tied else kernel
        self.expand(sg, tile, sg.strip(table), tied)


register(RowGather())

"""A stage's KV cache, held as ``program.kvlayout`` lays it out, and attention computed where
the timed decode pattern computes it.

Each row across the stage holds a slice of the K and V features (the KV heads' features split
evenly over the rows, as the k and v edges hand them over); each column along the long side
holds a share of the sequence's tokens, all rows of a column the same tokens, newest nearest
the entry column (the long side's end nearer k_proj's edge), the shares within one token of
each other while every column has room. A column holds as many tokens as the KV bytes the
compiler planned for its tightest PE allow.

Attention, per KV head: every PE of the head's rows scores the queries against its tokens over
its feature slice; the partial scores meet over the head's rows by the kernel's tree; each
column takes the softmax of its share (its max and sum); every PE weights its values; the
partial outputs, a few features per row, meet along each row at o_proj's column by the
kernel's tree, rescaled by the columns' maxima (flash-decoding). Prefill tiles run the same
way, their own keys appended first, with a causal mask, so prefill and decode read one cache.
The timed prefill pattern splits queries along the rows instead; both compute the same values
from the same cache, in a different order of additions.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import UserError
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.trees import tree_reduce
from wse_emu.models.spec import ModelSpec
from wse_emu.program import kvlayout
from wse_emu.program.format import Kernel, Stage, WaferProgram


def _column_along(kernel: Kernel, stage: Stage, edge: bool) -> int:
    """The column (along the stage's long side) of a strip's first PE, or of its root edge."""
    r, st = kernel.rect, stage.rect
    start, extent = (r.x - st.x, r.w) if stage.strip_axis == "x" else (r.y - st.y, r.h)
    if edge and kernel.root in ("east", "south"):
        return start + extent - 1
    return start


class StageKV:
    def __init__(self, program: WaferProgram, stage: Stage, numerics: Numerics):
        model: ModelSpec = program.model
        self.model, self.stage, self.numerics = model, stage, numerics
        r = stage.rect
        long_x = stage.strip_axis == "x"
        self.length, rows = (r.w, r.h) if long_x else (r.h, r.w)
        kv_bytes = program.arrays["sram_kv_cache"][r.system, r.y:r.y1, r.x:r.x1].astype(np.int64)
        grid = kv_bytes.T if long_x else kv_bytes  # (long side, rows)
        self.column_capacity = kvlayout.column_capacity(grid, model.attention.kv_size,
                                                        stage.num_layers,
                                                        model.storage.dtype_bytes)
        features = kvlayout.row_features(model.attention.kv_size, rows)
        bounds = np.concatenate([[0], np.cumsum(features)])
        hd = model.attention.head_dim
        # Per KV head: (row, first feature within the head, end) of every row holding a slice.
        self.head_rows = []
        for h in range(model.attention.num_kv_heads):
            lo, hi = h * hd, (h + 1) * hd
            self.head_rows.append([(b, max(bounds[b], lo) - lo, min(bounds[b + 1], hi) - lo)
                                   for b in range(rows)
                                   if bounds[b] < hi and bounds[b + 1] > lo])
        kernels = {k.name: k for k in program.stage_kernels(stage)}
        attention = kernels["attention"]
        self.levels_across = attention.trees.get("across", 2)
        self.levels_along = attention.trees.get("along", 2)
        self.out_column = _column_along(kernels["o_proj"], stage, edge=False)
        self.entry_far = _column_along(kernels["k_proj"], stage, edge=True) >= self.length / 2
        self.clear()

    @property
    def tokens_capacity(self) -> int:
        """The longest sequence the stage can cache."""
        return int(self.column_capacity.sum())

    def clear(self) -> None:
        self.count = 0
        shape = (0, self.model.attention.num_kv_heads, self.model.attention.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(self.stage.num_layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(self.stage.num_layers)]

    def columns(self, tokens: int) -> np.ndarray:
        """The column holding each of positions 0 .. tokens-1."""
        cols = kvlayout.column_of_positions(tokens, self.column_capacity)
        return self.length - 1 - cols if self.entry_far else cols

    def append(self, layer: int, keys: np.ndarray, values: np.ndarray,
               positions: np.ndarray) -> None:
        """Store K and V (tokens, kv heads, head_dim) of tokens at ``positions``."""
        end = int(positions.max()) + 1
        if end > self.tokens_capacity:
            raise UserError(
                f"the KV cache of stage {self.stage.id} holds {self.tokens_capacity:,} "
                f"tokens of one sequence; position {end - 1:,} does not fit")
        for store, new in ((self.keys, keys), (self.values, values)):
            if len(store[layer]) < end:
                grown = np.zeros((end,) + store[layer].shape[1:], np.float32)
                grown[:len(store[layer])] = store[layer]
                store[layer] = grown
            store[layer][positions] = self.numerics.round(new)
        if layer == self.stage.num_layers - 1:
            self.count = max(self.count, end)

    def attend(self, layer: int, queries: np.ndarray, positions: np.ndarray,
               sinks: np.ndarray | None = None) -> np.ndarray:
        """queries (tokens, heads, head_dim), rotated; returns (tokens, heads * head_dim).
        ``sinks`` (heads,): a logit per query head that joins its softmax and adds no value
        (gpt-oss), taken in where the head's output is finished."""
        model, rnd = self.model, self.numerics.round
        group = model.attention.group_size
        scale = np.float32(model.attention.scale)
        window = model.attention.window(self.stage.layers[0] + layer)
        cap = model.attention.logit_softcap
        cached = int(positions.max()) + 1
        column = self.columns(cached)  # (P,)
        stored = np.arange(cached)
        seen = stored[None, :] <= positions[:, None]  # (t, P): causal
        if window:
            seen &= stored[None, :] > positions[:, None] - window
        out = np.zeros(queries.shape, np.float32)
        for h, rows in enumerate(self.head_rows):
            keys, values = self.keys[layer][:cached, h], self.values[layer][:cached, h]
            q = rnd(queries[:, h * group:(h + 1) * group])  # (t, g, hd), as regrouped
            # Partial scores of each row's feature slice, summed over the head's rows.
            partial = [np.einsum("tgf,pf->tgp", q[..., lo:hi], keys[:, lo:hi])
                       for _, lo, hi in rows]
            scores = tree_reduce(partial, 0, np.add, rnd, self.levels_across) * scale
            if cap:
                scores = np.float32(cap) * np.tanh(scores / np.float32(cap))
            scores = np.where(seen[:, None, :], scores, -np.inf)  # (t, g, P)
            # Each column's softmax share: its max, its weights, their sum; each row's
            # weighted values of its slice (padded to the widest slice).
            widest = max(hi - lo for _, lo, hi in rows)
            items = []
            for a in range(self.length):
                mine = column == a
                part = scores[..., mine]
                peak = part.max(axis=-1) if part.shape[-1] else np.full(part.shape[:-1], -np.inf)
                offset = np.where(np.isfinite(peak), peak, 0)[..., None]
                weights = rnd(np.exp(part - offset))  # exp(-inf) = 0 where masked
                summed = np.zeros((len(rows),) + weights.shape[:-1] + (widest,), np.float32)
                for i, (_, lo, hi) in enumerate(rows):
                    summed[i, ..., :hi - lo] = weights @ values[mine, lo:hi]
                items.append((peak, weights.sum(axis=-1), summed))
            m, s, o = tree_reduce(items, self.out_column, _combine,
                                  lambda p: (rnd(p[0]), rnd(p[1]), rnd(p[2])),
                                  self.levels_along)
            if sinks is not None:
                sink = np.broadcast_to(sinks[h * group:(h + 1) * group].astype(np.float32),
                                       m.shape)
                m, s, o = _combine((m, s, o), (sink, np.ones_like(sink), np.zeros_like(o)))
            for (_, lo, hi), part in zip(rows, o):
                out[:, h * group:(h + 1) * group, lo:hi] = rnd(part[..., :hi - lo]
                                                              / s[..., None])
        return out.reshape(len(queries), -1)

    def export(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0 .. count-1, (tokens, kv heads, head_dim), read from the
        PEs' slots (what a handoff sends)."""
        return self.keys[layer][:self.count].copy(), self.values[layer][:self.count].copy()


def _combine(acc, arriving):
    """Two columns' softmax partials: rescale each to the larger max and add."""
    m1, s1, o1 = acc
    m2, s2, o2 = arriving
    m = np.maximum(m1, m2)
    safe = np.where(np.isfinite(m), m, 0)
    c1 = np.where(np.isfinite(m1), np.exp(m1 - safe), 0)
    c2 = np.where(np.isfinite(m2), np.exp(m2 - safe), 0)
    return m, s1 * c1 + s2 * c2, o1 * c1[None, ..., None] + o2 * c2[None, ..., None]

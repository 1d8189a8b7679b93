"""A stage's KV cache, held in the slots the compiler left on each of its PEs.

The stage's rows across its long side are shared among the KV heads as the attention kernel
shares them (``StageGraph.head_groups``): with more rows than heads each head owns a group of
rows, otherwise each row holds one or more heads. A head's tokens are dealt round robin over
the PEs of its rows that still have a free slot: while every PE has room, each holds an equal
share, as the timed kernel assumes, and PEs that the weights left less room stop taking tokens
first, so a head uses every slot of its rows. A PE's capacity is the KV bytes the compiler
planned for it, divided by one token's K and V of a head, by the stage's layers and by the heads
on its row. When the rows do not divide evenly among the heads, the head with the fewest slots
bounds the sequence, below the compiler's count (which assumes even sharing).

Two simplifications against the timed kernels: a token's K and V go to the PE the deal gives
(the timed decode sends them to the column of the newest slots), and prefill attention runs
key-split like decode (the timed prefill splits the queries along the rows instead). Both
compute the same values from the same cache; only the order of additions differs.

Attention runs where the keys are (flash-decoding): every PE scores the queries of its head
against its own tokens and keeps a running max, sum and weighted sum of values; the partial
results meet along each row at the column where o_proj begins, then across the head's rows, by
the program's trees. Prefill tiles run the same way, with their own keys appended first and
a causal mask, so prefill and decode read one and the same cache.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import UserError
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.trees import tree_reduce
from wse_emu.model import ModelSpec
from wse_emu.program import Stage, WaferProgram


def head_rows(rows: int, kv_heads: int) -> list[np.ndarray]:
    """Per KV head, the rows across the stage that hold it (see the module docstring)."""
    if rows <= kv_heads:
        return [np.array([(h * rows) // kv_heads]) for h in range(kv_heads)]
    owner = (np.arange(rows) * kv_heads) // rows
    return [np.flatnonzero(owner == h) for h in range(kv_heads)]


class StageKV:
    def __init__(self, program: WaferProgram, stage: Stage, numerics: Numerics):
        model: ModelSpec = program.model
        self.model, self.stage, self.numerics = model, stage, numerics
        r = stage.rect
        long_x = stage.strip_axis == "x"
        self.length, rows = (r.w, r.h) if long_x else (r.h, r.w)
        self.rows_of_head = head_rows(rows, model.num_kv_heads)
        heads_on_row = np.zeros(rows, np.int64)
        for rows_h in self.rows_of_head:
            heads_on_row[rows_h] += 1
        # Per PE (a along the long side, b across) the tokens of one head and layer it holds.
        kv_bytes = program.arrays["sram_kv_cache"][r.system, r.y:r.y1, r.x:r.x1].astype(np.int64)
        grid_bytes = kv_bytes.T if long_x else kv_bytes  # (long, rows)
        slot = 2 * model.head_dim * model.dtype_bytes
        per_pe = grid_bytes // slot // max(1, stage.num_layers)
        per_pe = per_pe // np.maximum(heads_on_row, 1)[None, :]
        # PE p of a head is (a = p % length, its row = rows_h[p // length]). Slot c of every
        # PE fills before slot c + 1 of any: ``order`` lists PEs by capacity (largest first)
        # and ``level_start[c]`` counts the tokens stored before slot c.
        self.order, self.level_start, self.capacity = [], [], []
        for rows_h in self.rows_of_head:
            caps = per_pe[:, rows_h].T.ravel()  # p = row * length + a
            self.order.append(np.argsort(-caps, kind="stable"))
            counts = np.bincount(caps, minlength=int(caps.max()) + 1)[::-1].cumsum()[::-1]
            self.level_start.append(np.concatenate([[0], np.cumsum(counts[1:])]))
            self.capacity.append(int(caps.sum()))
        o_proj = next(k for k in program.stage_kernels(stage) if k.name == "o_proj")
        self.out_column = (o_proj.rect.x - r.x) if long_x else (o_proj.rect.y - r.y)
        self.clear()

    @property
    def tokens_capacity(self) -> int:
        """The longest sequence the stage can cache (the head with the fewest slots decides)."""
        return min(self.capacity)

    def clear(self) -> None:
        hd = self.model.head_dim
        self.count = 0
        # keys[layer][head]: (PEs of the head, slots, head_dim); positions -1 where empty.
        self.keys = [[np.zeros((self.length * len(rh), 0, hd), np.float32)
                      for rh in self.rows_of_head] for _ in range(self.stage.num_layers)]
        self.values = [[k.copy() for k in layer] for layer in self.keys]
        self.positions = [[np.zeros((self.length * len(rh), 0), np.int64)
                           for rh in self.rows_of_head] for _ in range(self.stage.num_layers)]

    def _grow(self, layer: int, head: int, slots: int) -> None:
        k = self.keys[layer][head]
        if k.shape[1] >= slots:
            return
        extra = slots - k.shape[1]
        pad = ((0, 0), (0, extra), (0, 0))
        self.keys[layer][head] = np.pad(k, pad)
        self.values[layer][head] = np.pad(self.values[layer][head], pad)
        self.positions[layer][head] = np.pad(self.positions[layer][head], ((0, 0), (0, extra)),
                                             constant_values=-1)

    def place(self, head: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The PE (index within the head's PEs) and slot of each position."""
        slot = np.searchsorted(self.level_start[head], positions, side="right") - 1
        return self.order[head][positions - self.level_start[head][slot]], slot

    def append(self, layer: int, keys: np.ndarray, values: np.ndarray,
               positions: np.ndarray) -> None:
        """Store K and V (tokens, kv heads, head_dim) of tokens at ``positions``."""
        end = int(positions.max()) + 1
        for h in range(len(self.rows_of_head)):
            if end > self.capacity[h]:
                raise UserError(
                    f"the KV cache of stage {self.stage.id} holds {self.tokens_capacity:,} "
                    f"tokens of one sequence; position {end - 1:,} does not fit")
            pe, slot = self.place(h, positions)
            self._grow(layer, h, int(slot.max()) + 1)
            self.keys[layer][h][pe, slot] = self.numerics.round(keys[:, h])
            self.values[layer][h][pe, slot] = self.numerics.round(values[:, h])
            self.positions[layer][h][pe, slot] = positions
        if layer == self.stage.num_layers - 1:
            self.count = max(self.count, end)

    def attend(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """queries (tokens, heads, head_dim), rotated; returns (tokens, heads * head_dim)."""
        model, rnd = self.model, self.numerics.round
        group = model.group_size
        scale = np.float32(model.attention_scale)
        window = model.window(self.stage.layers[0] + layer)
        cap = model.attn_logit_softcap
        out = np.empty(queries.shape, np.float32)
        for h, rows_h in enumerate(self.rows_of_head):
            keys, values = self.keys[layer][h], self.values[layer][h]
            stored = self.positions[layer][h]  # (P, c)
            q = rnd(queries[:, h * group:(h + 1) * group])  # (t, g, hd), as multicast
            scores = np.einsum("pcd,tgd->ptgc", keys, q) * scale
            if cap:
                scores = np.float32(cap) * np.tanh(scores / np.float32(cap))
            seen = (stored[:, None, :] >= 0) & (stored[:, None, :] <= positions[None, :, None])
            if window:
                seen &= stored[:, None, :] > positions[None, :, None] - window
            seen = seen[:, :, None, :]  # (P, t, 1, c)
            peak = np.max(np.where(seen, scores, -np.inf), axis=-1)  # (P, t, g)
            offset = np.where(np.isfinite(peak), peak, 0)[..., None]
            weights = np.exp(np.where(seen, scores - offset, -np.inf))
            total = weights.sum(axis=-1)
            summed = np.einsum("ptgc,pcd->ptgd", weights, values)
            partial = _FlashPartial(peak, total, summed, self.length, len(rows_h))
            m, s, o = partial.reduce(self.out_column, rnd)
            out[:, h * group:(h + 1) * group] = rnd(o / s[..., None])
        return out.reshape(len(queries), -1)

    def export(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0 .. count-1, (tokens, kv heads, head_dim), read from the
        PEs' slots (what a handoff sends)."""
        n, hd = self.count, self.model.head_dim
        k = np.zeros((n, self.model.num_kv_heads, hd), np.float32)
        v = np.zeros_like(k)
        for h in range(len(self.rows_of_head)):
            pe, slot = self.place(h, np.arange(n))
            k[:, h] = self.keys[layer][h][pe, slot]
            v[:, h] = self.values[layer][h][pe, slot]
        return k, v


class _FlashPartial:
    """Per-PE softmax partials of one head, arranged (rows of the head, long side)."""

    def __init__(self, peak, total, summed, length, rows):
        # PE index p = a + length * row.
        self.peak = peak.reshape(rows, length, *peak.shape[1:])
        self.total = total.reshape(rows, length, *total.shape[1:])
        self.summed = summed.reshape(rows, length, *summed.shape[1:])

    @staticmethod
    def combine(acc, arriving):
        m1, s1, o1 = acc
        m2, s2, o2 = arriving
        m = np.maximum(m1, m2)
        safe = np.where(np.isfinite(m), m, 0)
        c1 = np.where(np.isfinite(m1), np.exp(m1 - safe), 0)
        c2 = np.where(np.isfinite(m2), np.exp(m2 - safe), 0)
        return m, s1 * c1 + s2 * c2, o1 * c1[..., None] + o2 * c2[..., None]

    def reduce(self, out_column: int, rnd):
        def send(part):  # the program sizes all three in the dtype (max, sum, values)
            return rnd(part[0]), rnd(part[1]), rnd(part[2])

        # Along the long side every row of the head at once, then across the head's rows.
        items = [(self.peak[:, a], self.total[:, a], self.summed[:, a])
                 for a in range(self.peak.shape[1])]
        m, s, o = tree_reduce(items, out_column, self.combine, send)
        return tree_reduce([(m[r], s[r], o[r]) for r in range(len(m))], 0, self.combine, send)

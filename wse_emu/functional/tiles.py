"""Weights as the compiler placed them: one block per PE of every matrix kernel.

A matrix kernel of K x N on a grid of e PEs along its strip (splitting K) and s across it
(splitting N) gives PE (a, b) the block K_a x N_b of every layer of its stage, with the program's
balanced splits. ``MatrixTiles`` keeps those blocks, zero-padded to the largest, in one array
(layers, e, s, kmax, nmax) so that all PEs multiply at once; every product a PE makes uses its
own block and nothing else, and the partial sums meet at the root edge by the program's tree.
Vectors (norm scales, projection biases) are kept as the segments their line of PEs holds.

Blocks are float32 arrays holding values rounded to the run's dtype; ``tile_at`` hands out
views of one PE's blocks, so a test can damage a single tile and watch the logits move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.functional.numerics import Numerics
from wse_emu.functional.trees import tree_reduce
from wse_emu.program.expert_runs import run_columns, run_root
from wse_emu.program.format import Kernel
from wse_emu.util.splits import even_split


def _bounds(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _pad_index(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per piece, the element indices it holds, padded with 0; and the mask of real ones."""
    starts = _bounds(sizes)[:-1]
    width = max(1, int(sizes.max()))
    offsets = np.arange(width)[None, :]
    mask = offsets < sizes[:, None]
    return np.where(mask, starts[:, None] + offsets, 0), mask


def strip_coordinates(kernel: Kernel) -> np.ndarray:
    """Absolute (x, y) of PE (a, b) of a matrix kernel's grid, shape (e, s, 2)."""
    e, s = kernel.grid
    r = kernel.rect
    a, b = np.meshgrid(np.arange(e), np.arange(s), indexing="ij")
    if kernel.k_axis == "x":
        return np.stack([r.x + a, r.y + b], axis=-1)
    return np.stack([r.x + b, r.y + a], axis=-1)


@dataclass
class MatrixTiles:
    kernel: Kernel
    blocks: np.ndarray  # (layers, e, s, kmax, nmax)
    k_sizes: np.ndarray
    n_sizes: np.ndarray
    root: int  # position along the strip where the partial sums collect
    bias: "VectorTiles | None" = None

    @classmethod
    def build(cls, kernel: Kernel, matrices: list[np.ndarray], numerics: Numerics,
              bias: "VectorTiles | None" = None) -> "MatrixTiles":
        """``matrices``: one (K, N) array per layer of the kernel."""
        k, n = kernel.matrix
        e, s = kernel.grid
        k_sizes, n_sizes = even_split(k, e), even_split(n, s)
        kb, nb = _bounds(k_sizes), _bounds(n_sizes)
        blocks = np.zeros((len(matrices), e, s, max(1, k_sizes.max()), max(1, n_sizes.max())),
                          np.float32)
        for layer, w in enumerate(matrices):
            w = numerics.round(w)
            for a in range(e):
                for b in range(s):
                    blocks[layer, a, b, :k_sizes[a], :n_sizes[b]] = \
                        w[kb[a]:kb[a + 1], nb[b]:nb[b + 1]]
        root = e - 1 if kernel.root in ("east", "south") else 0
        return cls(kernel, blocks, k_sizes, n_sizes, root, bias)

    def __post_init__(self):
        self._k_index, self._k_mask = _pad_index(self.k_sizes)
        _, n_mask = _pad_index(self.n_sizes)
        # Output element j sits at (b, offset) of the root's partial sums.
        b, off = np.nonzero(n_mask)
        self._out_b, self._out_off = b, off

    def multiply(self, layer: int, x: np.ndarray, numerics: Numerics) -> np.ndarray:
        """x (tokens, K) -> (tokens, N): each PE multiplies its input segment by its block,
        partial sums are reduced along the strip onto the root edge, which adds the bias."""
        segments = x[:, self._k_index] * self._k_mask[None]  # (t, e, kmax)
        segments = np.ascontiguousarray(segments.transpose(1, 0, 2))[:, None]  # (e, 1, t, kmax)
        partial = np.matmul(segments, self.blocks[layer])  # (e, s, t, nmax), float32
        total = tree_reduce(partial, self.root, np.add, numerics.round,
                            self.kernel.trees.get("reduce", 2))  # (s, t, nmax)
        out = numerics.round(total)[self._out_b, :, self._out_off].T  # (t, N)
        if self.bias is not None:
            out = numerics.round(out + self.bias.vector(layer))
        return out

    def multiply_per_run(self, layer: int, x: np.ndarray, runs: int,
                         numerics: Numerics) -> np.ndarray:
        """A strip of ``runs`` runs of experts one after another along K, each run reading
        the same input: x (tokens, K / runs) -> (tokens, runs x N), its experts' outputs in
        expert order. Each run's partial sums, from the columns holding its inputs (a
        column's share of them only), meet on the run at the end nearer the strip's root,
        by the program's tree."""
        k_each = x.shape[1]
        kb = _bounds(self.k_sizes)
        n = int(self.n_sizes.sum())
        out = np.zeros((len(x), runs, n), np.float32)
        levels = self.kernel.trees.get("reduce", 2)
        for r, run in enumerate(run_columns(self.k_sizes, runs, k_each)):
            lo = r * k_each
            partials = []
            for a in run:
                a_lo, a_hi = max(kb[a], lo), min(kb[a + 1], lo + k_each)
                block = self.blocks[layer, a, :, a_lo - kb[a]:a_hi - kb[a], :]  # (s, kk, nmax)
                partials.append(np.matmul(x[None, :, a_lo - lo:a_hi - lo], block))
            total = tree_reduce(partials, run_root(run, self.root), np.add, numerics.round,
                                levels)  # (s, t, nmax)
            out[:, r, :] = numerics.round(total)[self._out_b, :, self._out_off].T
        return out.reshape(len(x), runs * n)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """An untied embedding (K = vocabulary along the strip): each token's row, gathered
        from the column that holds it, slice by slice across the strip."""
        kb = _bounds(self.k_sizes)
        a = np.searchsorted(kb, ids, side="right") - 1
        rows = self.blocks[0, a, :, ids - kb[a], :]  # (t, s, nmax)
        return rows[:, self._out_b, self._out_off]

    def columns_of(self, ids: np.ndarray) -> np.ndarray:
        """A tied embedding read from the LM head (K = hidden along the strip, vocabulary
        across): each token's column, from the line across that holds it."""
        nb = _bounds(self.n_sizes)
        b = np.searchsorted(nb, ids, side="right") - 1
        cols = self.blocks[0, :, b, :, ids - nb[b]]  # (t, e, kmax)
        a, off = np.nonzero(self._k_mask)
        return cols[:, a, off]

    def pe_blocks(self, x: int, y: int) -> dict[int, np.ndarray]:
        """Views of the blocks (one per layer) that PE (x, y) holds, by layer index."""
        coords = strip_coordinates(self.kernel)
        hit = np.argwhere((coords[..., 0] == x) & (coords[..., 1] == y))
        if not len(hit):
            return {}
        a, b = hit[0]
        ka, nb = self.k_sizes[a], self.n_sizes[b]
        return {layer: self.blocks[layer, a, b, :ka, :nb] for layer in range(len(self.blocks))}


@dataclass
class VectorTiles:
    """A per-layer vector split into even segments over a line of PEs."""

    segments: np.ndarray  # (layers, pes, segmax)
    sizes: np.ndarray

    @classmethod
    def build(cls, vectors: list[np.ndarray], pes: int, numerics: Numerics) -> "VectorTiles":
        length = len(vectors[0])
        sizes = even_split(length, pes)
        index, mask = _pad_index(sizes)
        segments = np.stack([numerics.round(v)[index] * mask for v in vectors])
        return cls(segments.astype(np.float32), sizes)

    def vector(self, layer: int) -> np.ndarray:
        """The whole vector, read segment by segment from the PEs that hold it."""
        return np.concatenate([self.segments[layer, p, :n] for p, n in enumerate(self.sizes)])

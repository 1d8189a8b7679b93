"""One region of a compiled program, computing: its stages' tiles, KV cache and kernels.

``FunctionalRegion.forward`` runs a tile of tokens through the region's pipeline stage by stage,
each stage's kernels in the order of ``compiler.opgraph.LAYER_OPS``: matrix kernels multiply
per PE and reduce along the program's trees (``MatrixTiles``), norms sum squares per PE and
all-reduce them along their line, attention reads the stage's own KV slots (``StageKV``), and
elementwise kernels (rotary, SiLU-multiply, residual adds) apply to the vectors their line holds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wse_emu.errors import UserError
from wse_emu.functional.kvstore import StageKV
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.tiles import MatrixTiles, VectorTiles
from wse_emu.functional.trees import tree_reduce
from wse_emu.model import ModelSpec
from wse_emu.program import Stage, WaferProgram

# Kernel name -> the Hugging Face module inside a decoder layer.
MODULES = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
NORMS = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm"}


def silu(x: np.ndarray) -> np.ndarray:
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


ROPE_SCALINGS = (None, "linear", "llama3")


def inverse_frequencies(model: ModelSpec) -> np.ndarray:
    """Rotary frequencies per pair of features, with the model's rope scaling: ``linear``
    divides them all by the factor; ``llama3`` divides the low ones (wavelengths above
    original positions / low_freq_factor) by it, keeps the high ones (wavelengths below
    original positions / high_freq_factor), and blends linearly in wavelength between."""
    if model.rope_scaling not in ROPE_SCALINGS:
        raise UserError(f"{model.name}: rope_scaling {model.rope_scaling!r} is not modelled by "
                        "the functional engine (linear and llama3 are)")
    d = model.head_dim
    inv_freq = 1.0 / model.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    factor = model.rope_scaling_factor
    if model.rope_scaling == "linear":
        return inv_freq / factor
    if model.rope_scaling == "llama3":
        context = model.rope_original_max_positions
        low, high = model.rope_low_freq_factor, model.rope_high_freq_factor
        wavelength = 2 * np.pi / inv_freq
        blend = np.clip((context / wavelength - low) / (high - low), 0.0, 1.0)
        return inv_freq * (blend + (1.0 - blend) / factor)
    return inv_freq


def rotary(x: np.ndarray, positions: np.ndarray, model: ModelSpec) -> np.ndarray:
    """Rotate (tokens, heads * head_dim) by position, pairing i with i + head_dim / 2 as
    Hugging Face does; angles in float64, applied in float32."""
    t, head_dim = len(x), model.head_dim
    x = x.reshape(t, -1, head_dim)
    angles = np.outer(positions.astype(np.float64), inverse_frequencies(model))
    angles = np.concatenate([angles, angles], axis=-1)
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).reshape(t, -1)


def check_token_ids(ids, vocab: int) -> None:
    """Before any conversion, so that an id too large for int64 gets the same one line."""
    bad = next((int(i) for i in ids if not 0 <= int(i) < vocab), None)
    if bad is not None:
        raise UserError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")


class FunctionalStage:
    def __init__(self, program: WaferProgram, stage: Stage, weights: Mapping[str, np.ndarray],
                 numerics: Numerics):
        self.stage, self.model, self.numerics = stage, program.model, numerics
        l0, l1 = stage.layers
        layers = range(l0, l1)
        self.kernels = {k.name: k for k in program.stage_kernels(stage)}
        self.matrices: dict[str, MatrixTiles] = {}
        self.vectors: dict[str, VectorTiles] = {}
        for name, k in self.kernels.items():
            if k.kind == "norm":
                if name == "final_norm":
                    sources = [weights["model.norm.weight"]]
                else:
                    sources = [weights[f"model.layers.{i}.{NORMS[name]}.weight"] for i in layers]
                self.vectors[name] = VectorTiles.build(sources, k.rect.area, numerics)
            elif k.kind == "matrix" or (k.kind == "gather" and k.weight_ref is None):
                self.matrices[name] = MatrixTiles.build(k, self._matrices(name, weights, layers),
                                                        numerics, self._bias(k, weights, layers))
        self.kv = StageKV(program, stage, numerics) if stage.num_layers else None

    def _matrices(self, name, weights, layers) -> list[np.ndarray]:
        """Each layer's (K, N) matrix: Hugging Face stores linear weights as (N, K)."""
        if name == "embedding":
            return [weights["model.embed_tokens.weight"]]
        if name == "lm_head":
            table = "model.embed_tokens.weight" if self.model.tie_embeddings else "lm_head.weight"
            return [weights[table].T]
        return [weights[f"model.layers.{i}.{MODULES[name]}.weight"].T for i in layers]

    def _bias(self, kernel, weights, layers) -> VectorTiles | None:
        if not (self.model.attention_bias and kernel.name in ("q_proj", "k_proj", "v_proj")):
            return None
        sources = [weights[f"model.layers.{i}.{MODULES[kernel.name]}.bias"] for i in layers]
        return VectorTiles.build(sources, kernel.grid[1], self.numerics)

    # --- kernels ----------------------------------------------------------------------------
    def norm(self, name: str, layer: int, x: np.ndarray) -> np.ndarray:
        """RMSNorm: each PE of the line sums the squares of its segment, the sums meet at the
        line's first PE by the tree and return, and each PE scales its own segment."""
        tiles = self.vectors[name]
        bounds = np.concatenate([[0], np.cumsum(tiles.sizes)])
        squares = np.stack([np.sum(x[:, a:b] * x[:, a:b], axis=1)
                            for a, b in zip(bounds[:-1], bounds[1:])])  # (pes, t)
        total = tree_reduce(squares, 0, np.add)
        inv_rms = 1.0 / np.sqrt(total / x.shape[1] + np.float32(self.model.rms_norm_eps))
        return self.numerics.round(x * inv_rms.astype(np.float32)[:, None] * tiles.vector(layer))

    def layer(self, index: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        model, rnd, m = self.model, self.numerics.round, self.matrices
        hd = model.head_dim
        xn = self.norm("input_norm", index, x)
        q = m["q_proj"].multiply(index, xn, self.numerics)
        k = m["k_proj"].multiply(index, xn, self.numerics)
        v = m["v_proj"].multiply(index, xn, self.numerics)
        q = rnd(rotary(q, positions, model))
        k = rnd(rotary(k, positions, model))
        t = len(x)
        self.kv.append(index, k.reshape(t, -1, hd), v.reshape(t, -1, hd), positions)
        attended = self.kv.attend(index, q.reshape(t, -1, hd), positions)
        h = rnd(x + m["o_proj"].multiply(index, attended, self.numerics))
        hn = self.norm("post_attn_norm", index, h)
        gate = m["gate_proj"].multiply(index, hn, self.numerics)
        up = m["up_proj"].multiply(index, hn, self.numerics)
        mixed = rnd(silu(gate) * up)
        return rnd(h + m["down_proj"].multiply(index, mixed, self.numerics))

    def forward(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        for index in range(self.stage.num_layers):
            x = self.layer(index, x, positions)
        return x

    def head(self, x: np.ndarray) -> np.ndarray:
        return self.matrices["lm_head"].multiply(0, self.norm("final_norm", 0, x), self.numerics)


class FunctionalRegion:
    """A region's stages, loaded with weights, holding one sequence's KV cache."""

    def __init__(self, program: WaferProgram, region: str, weights: Mapping[str, np.ndarray],
                 numerics: Numerics):
        self.program, self.numerics = program, numerics
        self.region = program.region(region)
        inverse_frequencies(program.model)  # an unmodelled rope scaling fails before loading
        self.stages = [FunctionalStage(program, program.stages[i], weights, numerics)
                       for i in self.region.stage_ids]
        self.model = program.model

    @property
    def name(self) -> str:
        return self.region.name

    @property
    def length(self) -> int:
        """Tokens of the sequence in the cache."""
        return next((s.kv.count for s in self.stages if s.kv is not None), 0)

    @property
    def capacity(self) -> int:
        return min(s.kv.tokens_capacity for s in self.stages if s.kv is not None)

    def reset(self) -> None:
        for s in self.stages:
            if s.kv is not None:
                s.kv.clear()

    def embed(self, ids: np.ndarray) -> np.ndarray:
        if self.model.tie_embeddings:
            return self.stages[-1].matrices["lm_head"].columns_of(ids)
        return self.stages[0].matrices["embedding"].rows_of(ids)

    def forward(self, ids, all_logits: bool = False) -> np.ndarray:
        """Append ``ids`` to the sequence; returns the logits of its last token (the program's
        LM head runs on the last token of a prefill tile), or of every token."""
        check_token_ids(ids, self.model.vocab_size)
        ids = np.asarray(ids, dtype=np.int64)
        start = self.length
        positions = np.arange(start, start + len(ids))
        if positions[-1] >= self.capacity:
            raise UserError(f"region {self.name} caches {self.capacity:,} tokens of one "
                            f"sequence; {positions[-1] + 1:,} do not fit")
        x = self.embed(ids)
        for stage in self.stages:
            x = stage.forward(x, positions)
        return self.stages[-1].head(x if all_logits else x[-1:])

    # --- moving the cache -------------------------------------------------------------------
    def export_kv(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per model layer, K and V of the whole sequence as the PEs hold them."""
        out = {}
        for s in self.stages:
            for index in range(s.stage.num_layers):
                out[s.stage.layers[0] + index] = s.kv.export(index)
        return out

    def import_kv(self, kv: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Write a handed-off cache into this region's slots, layer by layer."""
        self.reset()
        for s in self.stages:
            for index in range(s.stage.num_layers):
                keys, values = kv[s.stage.layers[0] + index]
                s.kv.append(index, keys, values, np.arange(len(keys)))

    # --- inspection -------------------------------------------------------------------------
    def tile_at(self, system: int, x: int, y: int) -> dict[tuple[str, int], np.ndarray]:
        """Views of the weight blocks PE (x, y) of ``system`` holds, keyed by (kernel, model
        layer); writing into a view changes what that PE computes with."""
        out = {}
        for s in self.stages:
            for name, tiles in s.matrices.items():
                if tiles.kernel.rect.system != system:
                    continue
                for index, block in tiles.pe_blocks(x, y).items():
                    layer = s.stage.layers[0] + index if name not in ("embedding", "lm_head") \
                        else -1
                    out[(name, layer)] = block
        return out

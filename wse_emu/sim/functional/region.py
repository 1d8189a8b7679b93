"""One region of a compiled program, computing: its stages' tiles, KV cache and kernels.

``FunctionalRegion.forward`` runs a tile of tokens through the region's pipeline stage by stage,
each layer op by op as the layer description (``wse_emu.models.layer``) lists them, each op computed
by its kernel's pattern (``kernels.patterns``): matrix kernels
multiply per PE and reduce along the program's trees (``MatrixTiles``), norms sum squares per PE
and all-reduce them along their line (per head's PEs for Qwen3's and Gemma-3's q/k norms),
attention reads the stage's own KV slots (``StageKV``, with gpt-oss's sinks), and elementwise
kernels (rotary, gated activations, residual adds, scaling, soft caps) apply to the vectors their
line holds. A mixture of experts routes on the router's line, multiplies each token's experts in
the expert strips' PE blocks (``weights.expert_strips``), scales their activations by the router
weights and sums them in down's reduction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from wse_emu.errors import UserError
from wse_emu.functional.kvstore import StageKV
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.ops import inverse_frequencies, softcap
from wse_emu.functional.tiles import MatrixTiles, VectorTiles
from wse_emu.kernels import patterns
from wse_emu.models import layer as ly
from wse_emu.models.weights import as_stored, expert_strips, unfused
from wse_emu.program.format import Stage, WaferProgram


def check_token_ids(ids, vocab: int) -> None:
    """Before any conversion, so that an id too large for int64 gets the same one line."""
    bad = next((int(i) for i in ids if not 0 <= int(i) < vocab), None)
    if bad is not None:
        raise UserError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")


class FunctionalStage:
    """One stage of a region, computing: each kernel's weights as its PEs hold them and what
    it computes, both from its pattern's entry (``kernels.patterns``: ``load`` and
    ``compute``); the layer description says which ops run in which order."""

    def __init__(self, program: WaferProgram, stage: Stage, weights: Mapping[str, np.ndarray],
                 numerics: Numerics):
        self.program, self.stage, self.model, self.numerics = program, stage, program.model, \
            numerics
        l0, l1 = stage.layers
        layers = range(l0, l1)
        self.layer_table = ly.part_ops(self.model, stage.part)
        self.ops = {op.name: op for op in ly.input_ops(self.model) + self.layer_table
                    + ly.output_ops(self.model)}
        # A split layer's part: the experts it holds, [e0, e1) of the layer's E.
        self.held = stage.part or (0, self.model.experts.count if self.model.is_moe else 0)
        self.kernels = {k.name: k for k in program.stage_kernels(stage)}
        # What the kernels' patterns load and keep: weight tiles, the KV slots, the sinks, and
        # a mixture of experts' strips, biases, down's input order and the tokens' choices.
        self.matrices: dict[str, MatrixTiles] = {}
        self.vectors: dict[str, VectorTiles] = {}
        self.kv: StageKV | None = None
        self.sinks: list[np.ndarray] | None = None
        self.expert_bias: dict[str, list[np.ndarray]] = {}
        self.down_bias: list = []
        self.down_order: np.ndarray | None = None
        self.routed = None
        self._expert_strips: list | None = None
        self.per_run = 1
        if self.model.is_moe and stage.num_layers:  # gate's and up's experts per run
            up = self.kernels["experts_up"]
            self.per_run = up.matrix[1] // self.ops["experts_up"].matrix[1]
        # A kernel's SRAM is planned once for both phases' patterns (``compiler.build``), so
        # its weights load as its decode pattern holds them.
        for name, k in self.kernels.items():
            patterns.of(k, "decode").load(self, k, self.ops.get(name), weights, layers)

    # --- reading weights (for the patterns' ``load``) ---------------------------------------
    @staticmethod
    def tensor_of(op: ly.Op, layer: int | None) -> str:
        return op.tensor if layer is None else f"model.layers.{layer}.{op.tensor}"

    def norm_weights_of(self, op: ly.Op, weights, layers) -> list[np.ndarray]:
        """Each layer's norm scale as its line holds it: a per-head norm's scale repeats for
        every head on the line."""
        where = [None] if op.name == "final_norm" else list(layers)
        out = []
        for i in where:
            w = weights[self.tensor_of(op, i) + ".weight"]
            out.append(np.tile(w, op.length // len(w)))
        return out

    def matrices_of(self, op: ly.Op, weights, layers) -> list[np.ndarray]:
        """Each layer's (K, N) matrix: Hugging Face stores linear weights as (N, K)."""
        if op.name == "embedding":
            return [weights["model.embed_tokens.weight"]]
        if op.name == "lm_head":
            return [weights[op.tensor + ".weight"].T]
        return [weights[self.tensor_of(op, i) + ".weight"].T for i in layers]

    def bias_of(self, op, kernel, weights, layers) -> VectorTiles | None:
        if op is None or not op.bias:
            return None
        sources = [weights[self.tensor_of(op, i) + ".bias"] for i in layers]
        return VectorTiles.build(sources, kernel.grid[1], self.numerics)

    def expert_strips(self, weights, layers) -> list:
        """Per layer, the experts' matrices as the strips hold them (read once for the
        stage's three expert strips)."""
        if self._expert_strips is None:
            self._expert_strips = [expert_strips(self.model, weights, i, self.per_run,
                                                 self.stage.part) for i in layers]
        return self._expert_strips

    # --- computing --------------------------------------------------------------------------
    def compute(self, op: ly.Op, index: int, phase: str, *inputs):
        """``op`` on its kernel, as the kernel's pattern for ``phase`` computes it."""
        return patterns.of(self.kernels[op.kernel], phase).compute(self, op, index, *inputs)

    def layer(self, index: int, x: np.ndarray, positions: np.ndarray,
              carried: dict | None = None, phase: str = "decode") -> tuple[np.ndarray, dict]:
        """One layer (or a split layer's part), op by op as the layer description lists them;
        every result is rounded to the run's dtype where the PEs store it. Returns the
        residual stream and what a split layer's first part hands its second
        (``layer.SPLIT_CARRIED``), which ``carried`` brings in."""
        self.positions = positions
        values = {ly.LAYER_INPUT: x, **(carried or {})}
        if "route" in values:  # a split layer's second part: the choices the first made
            self.routed = values["route"]
        for op in self.layer_table:
            if op.kind in (ly.SOFTMAX, ly.ATTN_WEIGHTED_SUM):
                continue  # computed with the scores, flash-style, where the keys are
            result = self.compute(op, index, phase, *(values[s] for s in op.inputs))
            if op.kind == ly.ATTN_SCORES:
                values[ly.ATTENTION_OUTPUT] = result
            elif op.kind == ly.ROUTE:
                values[op.name] = result  # expert ids and weights
            else:
                values[op.name] = None if result is None else self.numerics.round(result)
        part = self.stage.part
        handed = {name: values[name] for name in ly.SPLIT_CARRIED} \
            if part is not None and part[0] == 0 else {}
        return values[ly.LAYER_OUTPUT], handed

    def forward(self, x: np.ndarray, positions: np.ndarray, carried: dict | None = None,
                phase: str = "decode") -> tuple[np.ndarray, dict]:
        for index in range(self.stage.num_layers):
            x, carried = self.layer(index, x, positions, carried, phase)
        return x, carried

    def head(self, x: np.ndarray, phase: str = "decode") -> np.ndarray:
        normed = self.compute(self.ops["final_norm"], 0, phase, x)
        logits = self.compute(self.ops["lm_head"], 0, phase, normed)
        cap = self.model.final_logit_softcap
        return self.numerics.round(softcap(logits, cap)) if cap else logits


class FunctionalRegion:
    """A region's stages, loaded with weights, holding one sequence's KV cache."""

    def __init__(self, program: WaferProgram, region: str, weights: Mapping[str, np.ndarray],
                 numerics: Numerics):
        self.program, self.numerics = program, numerics
        self.region = program.region(region)
        inverse_frequencies(program.model)  # an unmodelled rope scaling fails before loading
        # Each matrix as the wafer stores it, in its format (after a fused tensor is split,
        # so that each matrix has its own scales).
        weights = as_stored(program.model, unfused(program.model, weights))
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
        if self.model.scale_embeddings:
            # Gemma's normalizer, in the dtype the activations are stored in.
            x = self.numerics.round(x * self.numerics.round(
                np.float32(math.sqrt(self.model.hidden_size))))
        # A token after the first, alone, is a decode step; anything else a prefill tile.
        phase = "decode" if start > 0 and len(ids) == 1 else "prefill"
        carried: dict = {}
        for stage in self.stages:
            x, carried = stage.forward(x, positions, carried, phase)
        return self.stages[-1].head(x if all_logits else x[-1:], phase)

    # --- moving the cache -------------------------------------------------------------------
    def export_kv(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per model layer, K and V of the whole sequence as the PEs hold them."""
        out = {}
        for s in self.stages:
            for index in range(s.stage.num_layers if s.kv is not None else 0):
                out[s.stage.layers[0] + index] = s.kv.export(index)
        return out

    def import_kv(self, kv: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Write a handed-off cache into this region's slots, layer by layer."""
        self.reset()
        for s in self.stages:
            for index in range(s.stage.num_layers if s.kv is not None else 0):
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

"""One region of a compiled program, computing: its stages' tiles, KV cache and kernels.

``FunctionalRegion.forward`` runs a tile of tokens through the region's pipeline stage by stage,
each layer op by op as the layer description (``wse_emu.layer``) lists them: matrix kernels
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

from wse_emu import layer as ly
from wse_emu.errors import UserError
from wse_emu.functional.kvstore import StageKV
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.tiles import MatrixTiles, VectorTiles
from wse_emu.functional.trees import tree_reduce
from wse_emu.kernels.experts import down_order
from wse_emu.model import ModelSpec
from wse_emu.program import Stage, WaferProgram
from wse_emu.weights import as_stored, expert_strips, unfused


def silu(x: np.ndarray) -> np.ndarray:
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU with the tanh approximation (Gemma's gelu_pytorch_tanh)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return np.float32(cap) * np.tanh(x / np.float32(cap))


ROPE_SCALINGS = (None, "linear", "llama3", "longrope", "yarn")
SWIGLU_ALPHA = np.float32(1.702)  # gpt-oss's sigmoid slope in its SwiGLU (a constant of its code)


def inverse_frequencies(model: ModelSpec, layer: int = 0, length: int = 1) -> np.ndarray:
    """Rotary frequencies per pair of features of ``layer``, with the model's rope scaling:
    ``linear`` divides them all by the factor; ``llama3`` divides the low ones (wavelengths
    above original positions / low_freq_factor) by it, keeps the high ones (wavelengths below
    original positions / high_freq_factor), and blends linearly in wavelength between;
    ``longrope`` divides each pair by its short factor while the sequence (``length``
    positions) stays within the original context, by its long factor beyond it."""
    if model.rope_scaling not in ROPE_SCALINGS:
        raise UserError(f"{model.name}: rope_scaling {model.rope_scaling!r} is not modelled by "
                        "the functional engine (linear, llama3, longrope and yarn are)")
    d = model.head_dim
    theta = model.rope_theta_of(layer)
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if not model.rope_scaled(layer):
        return inv_freq
    factor = model.rope_scaling_factor
    if model.rope_scaling == "linear":
        return inv_freq / factor
    if model.rope_scaling == "llama3":
        context = model.rope_original_max_positions
        low, high = model.rope_low_freq_factor, model.rope_high_freq_factor
        wavelength = 2 * np.pi / inv_freq
        blend = np.clip((context / wavelength - low) / (high - low), 0.0, 1.0)
        return inv_freq * (blend + (1.0 - blend) / factor)
    if model.rope_scaling == "longrope":
        long = length > model.rope_original_max_positions
        factors = model.rope_long_factor if long else model.rope_short_factor
        return inv_freq / np.asarray(factors, dtype=np.float64)
    if model.rope_scaling == "yarn":
        keep = yarn_keep(model)
        return inv_freq * keep + inv_freq / factor * (1 - keep)
    return inv_freq


def yarn_keep(model: ModelSpec) -> np.ndarray:
    """YaRN's share of each pair's original frequency: 1 for pairs turning more than
    beta_fast times over the original context, 0 (divided by the factor) for those turning
    fewer than beta_slow times, linear in the pair index between (the bounds rounded outward
    when the model truncates them)."""
    d, base = model.head_dim, model.rope_theta
    context = model.rope_original_max_positions

    def pair(turns: float) -> float:  # the (fractional) pair index that turns so many times
        return d * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = pair(model.rope_beta_fast), pair(model.rope_beta_slow)
    if model.rope_truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if hi == lo else hi
    return 1 - np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)


def rope_magnitude(model: ModelSpec) -> float:
    """What cos and sin are multiplied by: longrope's attention factor (given, or from how far
    the context was extended), YaRN's (given, or 0.1 ln(factor) + 1), else 1."""
    if model.rope_scaling == "yarn":
        if model.rope_attention_factor is not None:
            return model.rope_attention_factor
        factor = model.rope_scaling_factor
        return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    if model.rope_scaling != "longrope":
        return 1.0
    if model.rope_attention_factor is not None:
        return model.rope_attention_factor
    scale = model.max_position_embeddings / model.rope_original_max_positions
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(model.rope_original_max_positions))


def rotary(x: np.ndarray, positions: np.ndarray, model: ModelSpec, layer: int = 0,
           length: int | None = None) -> np.ndarray:
    """Rotate (tokens, heads * head_dim) by position, pairing i with i + head_dim / 2 as
    Hugging Face does; angles in float64, applied in float32. ``length`` is the sequence's
    length after this call (longrope picks its factors by it)."""
    t, head_dim = len(x), model.head_dim
    x = x.reshape(t, -1, head_dim)
    length = int(positions.max()) + 1 if length is None else length
    angles = np.outer(positions.astype(np.float64),
                      inverse_frequencies(model, layer, length))
    angles = np.concatenate([angles, angles], axis=-1)
    magnitude = rope_magnitude(model)
    cos = (np.cos(angles) * magnitude).astype(np.float32)[:, None, :]
    sin = (np.sin(angles) * magnitude).astype(np.float32)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).reshape(t, -1)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


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
        self.layer_table = ly.part_ops(self.model, stage.part)
        self.ops = {op.name: op for op in ly.input_ops(self.model) + self.layer_table
                    + ly.output_ops(self.model)}
        # A split layer's part: the experts it holds, [e0, e1) of the layer's E.
        self.held = stage.part or (0, self.model.num_experts)
        self.kernels = {k.name: k for k in program.stage_kernels(stage)}
        self.matrices: dict[str, MatrixTiles] = {}
        self.vectors: dict[str, VectorTiles] = {}
        self.per_run = 1
        if self.model.num_experts and stage.num_layers:  # gate's and up's experts per run
            up = self.kernels["experts_up"]
            self.per_run = up.matrix[1] // self.ops["experts_up"].matrix[1]
        strips = ([expert_strips(self.model, weights, i, self.per_run, stage.part)
                   for i in layers]
                  if self.model.num_experts and stage.num_layers else [])
        # Per layer: down's expert biases (E, hidden), weighted by the router where the sums
        # collect; the sinks, a logit per query head.
        self.down_bias = [st.get("experts_down.bias") for st in strips]
        self.expert_bias: dict[str, list[np.ndarray]] = {}
        sink_ops = [op for op in self.layer_table if op.kind == ly.SOFTMAX and op.weight_params]
        self.sinks = [weights[self._tensor(sink_ops[0], i)] for i in layers] if sink_ops else None
        for name, k in self.kernels.items():
            op = self.ops.get(name)
            if op is not None and op.kind == ly.EXPERT_GEMM:
                if op.experts_summed:  # down's inputs in their strip order
                    runs = op.experts // self.per_run
                    self.down_order = down_order(runs, self.per_run * op.matrix[0], k.grid[1])
                order = self.down_order if op.experts_summed else slice(None)
                self.matrices[name] = MatrixTiles.build(k, [st[name][order] for st in strips],
                                                        numerics)
                if op.bias and not op.experts_summed:  # (E x m,) on the experts' roots
                    self.expert_bias[name] = [numerics.round(st[name + ".bias"])
                                              for st in strips]
            elif k.kind == "norm":
                self.vectors[name] = VectorTiles.build(self._norm_weights(op, weights, layers),
                                                       k.rect.area, numerics)
            elif k.kind == "matrix" or (k.kind == "gather" and k.weight_ref is None):
                self.matrices[name] = MatrixTiles.build(k, self._matrices(op, weights, layers),
                                                        numerics, self._bias(op, k, weights,
                                                                             layers))
        self.kv = StageKV(program, stage, numerics) if stage.has_attention else None
        self.compute = {
            ly.GEMM: self._gemm, ly.RMSNORM: self._norm, ly.HEAD_RMSNORM: self._head_norm,
            ly.ROPE: self._rope, ly.KV_APPEND: self._kv_append, ly.ATTN_SCORES: self._attend,
            ly.ADD: lambda op, i, a, b: a + b,
            ly.SILU_MUL: lambda op, i, gate, up: silu(gate) * up,
            ly.GELU_MUL: lambda op, i, gate, up: gelu_tanh(gate) * up,
            ly.ROUTE: self._route, ly.EXPERT_GEMM: self._experts,
            ly.SWIGLU_CLAMPED: self._swiglu_clamped, ly.COMBINE: self._combine,
        }

    @staticmethod
    def _tensor(op: ly.Op, layer: int | None) -> str:
        return op.tensor if layer is None else f"model.layers.{layer}.{op.tensor}"

    def _norm_weights(self, op: ly.Op, weights, layers) -> list[np.ndarray]:
        """Each layer's norm scale as its line holds it: a per-head norm's scale repeats for
        every head on the line."""
        where = [None] if op.name == "final_norm" else list(layers)
        out = []
        for i in where:
            w = weights[self._tensor(op, i) + ".weight"]
            out.append(np.tile(w, op.length // len(w)))
        return out

    def _matrices(self, op: ly.Op, weights, layers) -> list[np.ndarray]:
        """Each layer's (K, N) matrix: Hugging Face stores linear weights as (N, K)."""
        if op.name == "embedding":
            return [weights["model.embed_tokens.weight"]]
        if op.name == "lm_head":
            return [weights[op.tensor + ".weight"].T]
        return [weights[self._tensor(op, i) + ".weight"].T for i in layers]

    def _bias(self, op, kernel, weights, layers) -> VectorTiles | None:
        if op is None or not op.bias:
            return None
        sources = [weights[self._tensor(op, i) + ".bias"] for i in layers]
        return VectorTiles.build(sources, kernel.grid[1], self.numerics)

    # --- kernels ----------------------------------------------------------------------------
    def norm(self, name: str, layer: int, x: np.ndarray) -> np.ndarray:
        """RMSNorm: each PE of the line sums the squares of its segment, the sums meet at the
        line's first PE by the tree and return, and each PE scales its own segment."""
        tiles = self.vectors[name]
        bounds = np.concatenate([[0], np.cumsum(tiles.sizes)])
        squares = np.stack([np.sum(x[:, a:b] * x[:, a:b], axis=1)
                            for a, b in zip(bounds[:-1], bounds[1:])])  # (pes, t)
        total = tree_reduce(squares, 0, np.add, levels=self.kernels[name].trees.get("reduce", 2))
        inv_rms = 1.0 / np.sqrt(total / x.shape[1] + np.float32(self.model.rms_norm_eps))
        return self.numerics.round(x * inv_rms.astype(np.float32)[:, None] * self._scale(
            tiles.vector(layer)))

    def _scale(self, weight: np.ndarray) -> np.ndarray:
        offset = self.model.norm_weight_offset
        return weight + np.float32(offset) if offset else weight

    def _head_norm(self, op: ly.Op, layer: int, x: np.ndarray) -> np.ndarray:
        """RMSNorm of each head's features: each PE sums the squares of its segment per head
        it holds, the sums of a head meet by the tree over the PEs that hold it, and each PE
        scales its own segment."""
        tiles = self.vectors[op.name]
        hd = self.model.head_dim
        t, width = x.shape
        heads = width // hd
        bounds = np.concatenate([[0], np.cumsum(tiles.sizes)])
        head_of = np.arange(width) // hd
        squares = np.zeros((len(tiles.sizes), t, heads), np.float32)
        for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            for h in np.unique(head_of[a:b]):
                cols = np.arange(a, b)[head_of[a:b] == h]
                squares[p, :, h] = np.sum(x[:, cols] * x[:, cols], axis=1)
        total = tree_reduce(squares, 0, np.add)  # (t, heads)
        inv_rms = 1.0 / np.sqrt(total / hd + np.float32(self.model.rms_norm_eps))
        per_element = np.repeat(inv_rms.astype(np.float32), hd, axis=1)
        return x * per_element * self._scale(tiles.vector(layer))

    def _gemm(self, op, index, x):
        return self.matrices[op.name].multiply(index, x, self.numerics)

    def _norm(self, op, index, x):
        return self.norm(op.name, index, x)

    def _rope(self, op, index, x):
        return rotary(x, self.positions, self.model, self.stage.layers[0] + index)

    def _kv_append(self, op, index, k, v):
        hd, t = self.model.head_dim, len(k)
        self.kv.append(index, k.reshape(t, -1, hd), v.reshape(t, -1, hd), self.positions)
        return None

    def _attend(self, op, index, q, _kv):
        t, hd = len(q), self.model.head_dim
        sinks = None if self.sinks is None else self.sinks[index]
        return self.kv.attend(index, q.reshape(t, -1, hd), self.positions, sinks)

    # --- the routed MLP ---------------------------------------------------------------------
    def _route(self, op, index, logits):
        """Each token's k experts and their weights, from the router's logits on its line:
        the PEs' best candidates meet by the tree, ties going to the lower expert, as a
        stable sort orders them. Mixtral and Qwen3 take the softmax over every expert first
        (its max and sum all-reduced along the line) and renormalize the k chosen weights
        where the model does; gpt-oss takes the softmax of the k chosen logits."""
        k = self.model.experts_per_token
        if self.model.family == "gpt_oss":
            chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
            self._routed = chosen, _softmax(np.take_along_axis(logits, chosen, axis=-1))
            return self._routed
        probs = _softmax(logits)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        if self.model.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        self._routed = chosen, self.numerics.round(weights)  # down's biases are weighted too
        return self._routed

    def _routed_columns(self, chosen: np.ndarray) -> np.ndarray:
        """(tokens, E x m): whether each column of the expert axis (the stage's experts')
        belongs to a token's expert."""
        e, m = self.model.num_experts, self.model.moe_intermediate_size
        hit = np.zeros((len(chosen), e), bool)
        np.put_along_axis(hit, chosen, True, axis=-1)
        return np.repeat(hit[:, slice(*self.held)], m, axis=1)

    def _experts(self, op, index, x, route=None):
        """An expert strip. Gate and up: each expert's run of columns multiplies the hidden
        vector and its partial sums meet on the run; only a token's own experts' outputs are
        kept (the PEs of the others skip the token, as the timed pattern has them). Down: the
        routed activations, already weighted by the router and taken in the strip's order,
        sum over the experts in the strip's reduction; each token's experts' biases join,
        weighted the same way, where the sums collect."""
        tiles = self.matrices[op.name]
        if not op.experts_summed:
            out = tiles.multiply_per_run(index, x, op.experts // self.per_run,
                                         self.numerics)
            if op.name in self.expert_bias:
                out = self.numerics.round(out + self.expert_bias[op.name][index])
            return np.where(self._routed_columns(route[0]), out, np.float32(0))
        out = tiles.multiply(index, x[:, self.down_order], self.numerics)
        bias = self.down_bias[index] if self.down_bias else None
        if bias is not None:
            chosen, weights = self._routed
            mine = (chosen >= self.held[0]) & (chosen < self.held[1])  # this part's experts
            out = self.numerics.round(out + np.einsum("tk,tkh->th", np.where(mine, weights, 0),
                                                      bias[chosen]))
        return out

    def _swiglu_clamped(self, op, index, gate, up):
        """gpt-oss's SwiGLU: the gate clamped above, the up value on both sides, at the
        model's limit; (up + 1) * gate * sigmoid(1.702 gate). An expert no token routed to
        has a zero gate, and stays zero."""
        limit = np.float32(self.model.swiglu_limit)
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
        glu = gate * (np.float32(0.5) * (np.float32(1) + np.tanh(np.float32(0.5)
                                                                  * SWIGLU_ALPHA * gate)))
        return (up + 1) * glu

    def _combine(self, op, index, act, route):
        """Each routed activation times its token's router weight for that expert."""
        chosen, weights = route
        e, m = self.model.num_experts, self.model.moe_intermediate_size
        per_expert = np.zeros((len(chosen), e), np.float32)
        np.put_along_axis(per_expert, chosen, weights, axis=-1)
        return act * np.repeat(per_expert[:, slice(*self.held)], m, axis=1)

    def layer(self, index: int, x: np.ndarray, positions: np.ndarray,
              carried: dict | None = None) -> tuple[np.ndarray, dict]:
        """One layer (or a split layer's part), op by op as the layer description lists them;
        every result is rounded to the run's dtype where the PEs store it. Returns the
        residual stream and what a split layer's first part hands its second
        (``layer.SPLIT_CARRIED``), which ``carried`` brings in."""
        self.positions = positions
        values = {ly.LAYER_INPUT: x, **(carried or {})}
        if "route" in values:  # a split layer's second part: the choices the first made
            self._routed = values["route"]
        for op in self.layer_table:
            if op.kind in (ly.SOFTMAX, ly.ATTN_WEIGHTED_SUM):
                continue  # computed with the scores, flash-style, where the keys are
            result = self.compute[op.kind](op, index, *(values[s] for s in op.inputs))
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

    def forward(self, x: np.ndarray, positions: np.ndarray,
                carried: dict | None = None) -> tuple[np.ndarray, dict]:
        for index in range(self.stage.num_layers):
            x, carried = self.layer(index, x, positions, carried)
        return x, carried

    def head(self, x: np.ndarray) -> np.ndarray:
        logits = self.matrices["lm_head"].multiply(0, self.norm("final_norm", 0, x),
                                                   self.numerics)
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
        carried: dict = {}
        for stage in self.stages:
            x, carried = stage.forward(x, positions, carried)
        return self.stages[-1].head(x if all_logits else x[-1:])

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

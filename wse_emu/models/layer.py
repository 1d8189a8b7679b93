"""One description of a decoder layer: its ops, their shapes, where they run and what they cost.

Every consumer reads this table instead of restating the dataflow: the op graph and its
intensity (``compiler.opgraph``, ``compiler.intensity``), the bounds, the stage layout and
placement (``compiler.stages``, ``compiler.placement``, ``compiler.template``), the timed kernel
patterns (``wse_emu.kernels.stage``) and the functional engine (``wse_emu.functional``). An
architecture adds or changes rows here (Qwen3's q/k norms, Gemma's extra norms and GeGLU), not
branches in each of them.

An op row says:
- ``kind``: what it computes, which picks its cost formula and its kernel pattern;
- ``inputs``: ops of the same layer it reads (``"x"`` is the layer's input, the residual stream);
- ``site``: where it runs and leaves its output. A matrix op is a strip of its own (site = its
  name); a vector op runs on the root edge line of a strip (the strip's name); attention runs
  over the whole stage (``STAGE``). ``HOME`` is the strip whose edge holds the residual stream;
- ``kernel``: the compiled kernel that executes it (several attention ops share one);
- ``tensor``: the Hugging Face module under ``model.layers.{i}.`` holding its weights.

Costs, one formula per kind, count what a PE does: FLOPs, bytes read from and written to its
SRAM, for a share of the op's elements. The same formulas time the kernels, bound them and give
the op graph its FLOPs, so the three cannot drift apart (a test holds them together).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from wse_emu.errors import UserError
from wse_emu.util.splits import even_split

if TYPE_CHECKING:  # ModelSpec counts its parameters from this table: no import back at run time
    from wse_emu.models.spec import ModelSpec

PHASES = ("prefill", "decode")


# --- the micro-batch ------------------------------------------------------------------------

def attention_tile_of(options) -> int:
    """Sequences per attention tile of a program's decode steps, from its compile options
    (``CompileOptions``): 0 for none."""
    size = int(options.attention_tile or 0)
    if size < 0:
        raise UserError(f"`attention_tile` must be 0 (off) or more, got {size}")
    return size


@dataclass(frozen=True)
class MicroBatch:
    """What one step pushes through the layers: a prefill of ``tokens`` of one sequence
    (streamed in ``chunks`` tiles, each attending to the tiles before it, after ``prefix``
    tokens already cached) or a decode of one new token for each of ``batch`` sequences with
    ``context`` cached tokens each (the new token's own entry included).

    A speculative decode's verify step (``drafted`` > 0) takes, for each sequence, its next
    token and the ``drafted`` tokens a draft proposed after it: ``drafted + 1`` tokens per
    sequence, the first at ``context`` (its own entry included, as a decode's) and each next
    one attending to one entry more, causally."""

    phase: str
    tokens: int = 1
    batch: int = 1
    context: int = 1
    chunks: int = 1
    prefix: int = 0
    drafted: int = 0

    def __post_init__(self):
        if self.phase not in PHASES:
            raise UserError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        for name in ("tokens", "batch", "context", "chunks"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.prefix < 0:
            raise UserError(f"prefix must be at least 0, got {self.prefix}")
        if self.drafted < 0:
            raise UserError(f"drafted must be at least 0, got {self.drafted}")
        if self.drafted and self.phase != "decode":
            raise UserError("drafted tokens are verified in a decode step, not a prefill")

    @property
    def per_sequence(self) -> int:
        """New tokens of each sequence in this step: 1 for a decode, ``drafted + 1`` for a
        verify step (a prefill's one sequence: all its tokens)."""
        return self.tokens if self.phase == "prefill" else self.drafted + 1

    @property
    def new_tokens(self) -> int:
        """Tokens flowing through every layer in this step."""
        return self.tokens if self.phase == "prefill" else self.batch * self.per_sequence

    def tiles(self) -> list["MicroBatch"]:
        """A prefill's token tiles, in order; a decode is one tile, and a verify step one per
        token of each sequence (the next, then each drafted one, every sequence's in one
        tile at its own position): the drafted tokens are known at once, so they stream
        through the stages one after another as a prompt's tiles do."""
        if self.phase == "decode" and self.drafted:
            return [MicroBatch("decode", batch=self.batch, context=self.context + j)
                    for j in range(self.drafted + 1)]
        if self.phase != "prefill" or self.chunks <= 1:
            return [self]
        sizes = even_split(self.tokens, min(self.chunks, self.tokens))
        starts = self.prefix + np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return [MicroBatch("prefill", int(n), prefix=int(a)) for n, a in zip(sizes, starts)]

    def attention_tiles(self, size: int) -> list["MicroBatch"]:
        """A decode's sequences in the tiles of at most ``size`` its attention block takes one
        after another (batch tiling on attention); a prefill, or ``size`` 0, is one tile."""
        if self.phase != "decode" or size <= 0 or size >= self.batch:
            return [self]
        return [MicroBatch("decode", batch=int(n), context=self.context, drafted=self.drafted)
                for n in even_split(self.batch, -(-self.batch // size))]

    def describe(self) -> str:
        if self.phase == "prefill":
            return f"prefill of {self.tokens} tokens"
        if self.drafted:
            return (f"verify of {self.drafted} drafted tokens for batch {self.batch} at context "
                    f"{self.context}")
        return f"decode of batch {self.batch} at context {self.context}"


# --- op kinds and their costs ---------------------------------------------------------------

EMBEDDING = "embedding"
GEMM = "gemm"
RMSNORM = "rmsnorm"
HEAD_RMSNORM = "head_rmsnorm"  # RMSNorm over each head's features (Qwen3's q and k norms)
ROPE = "rope"
KV_APPEND = "kv_append"
ATTN_SCORES = "attn_scores"
SOFTMAX = "softmax"
ATTN_WEIGHTED_SUM = "attn_weighted_sum"
ADD = "add"
SILU_MUL = "silu_mul"
GELU_MUL = "gelu_mul"  # GeGLU with the tanh approximation of GELU
SCALE = "scale"  # multiply by a constant (Gemma's embedding normalizer)
SOFTCAP = "softcap"  # cap * tanh(x / cap)
ROUTE = "route"  # a router's top-k experts per token and their weights
EXPERT_GEMM = "expert_gemm"  # a matrix product per expert, each on the tokens routed to it
SWIGLU_CLAMPED = "swiglu_clamped"  # gpt-oss's SwiGLU with clamped inputs
COMBINE = "combine"  # each routed activation scaled by its router weight (down sums them)

ATTENTION_KINDS = (KV_APPEND, ATTN_SCORES, SOFTMAX, ATTN_WEIGHTED_SUM)
NORM_KINDS = (RMSNORM, HEAD_RMSNORM)
MATRIX_KINDS = (GEMM, EXPERT_GEMM)  # ops that are strips of their own

# The compiled kernel kind that runs each op kind.
KERNEL_KINDS = {
    EMBEDDING: "gather", GEMM: "matrix", RMSNORM: "norm", HEAD_RMSNORM: "norm",
    **{k: "attention" for k in ATTENTION_KINDS},
    **{k: "elementwise" for k in (ROPE, ADD, SILU_MUL, GELU_MUL, SCALE, SOFTCAP,
                                  SWIGLU_CLAMPED)},
    ROUTE: "route", EXPERT_GEMM: "matrix", COMBINE: "elementwise",
}


@dataclass(frozen=True)
class PerElement:
    """A vector op's cost per output element: FLOPs, operands read and results written."""

    flops: int
    reads: int
    writes: int = 1


# Elementwise kinds. A rotation is 4 multiplies and 2 adds per pair of features; SiLU is
# negate, exp, add 1, divide; the tanh GELU is cube, scale, add, scale, tanh, add 1, multiply by
# x, halve (9), each gated by one more multiply; a soft cap divides, takes tanh and multiplies;
# gpt-oss's SwiGLU clamps the gate (1) and the up value (2), scales the gate, takes its sigmoid
# (negate, exp, add 1, divide), multiplies, adds 1 to the up value and multiplies (11); the
# combine scales an expert's activation by the token's router weight (read beside it).
ELEMENTWISE = {
    ROPE: PerElement(3, 1), ADD: PerElement(1, 2), SILU_MUL: PerElement(5, 2),
    GELU_MUL: PerElement(10, 2), SCALE: PerElement(1, 1), SOFTCAP: PerElement(3, 1),
    SWIGLU_CLAMPED: PerElement(11, 2), COMBINE: PerElement(1, 2),
}
# RMSNorm in two passes around the all-reduce of the sum of squares: square and accumulate,
# then scale each element by 1/rms and by its weight (read beside it).
NORM_SQUARES = PerElement(2, 1, 0)
NORM_SCALE = PerElement(2, 2, 1)
NORM_FLOPS = NORM_SQUARES.flops + NORM_SCALE.flops
SOFTMAX_FLOPS = 5  # per score: max, subtract, exp, accumulate, divide
SOFTCAP_FLOPS = ELEMENTWISE[SOFTCAP].flops
TOKEN_ID_BYTES = 4
SUM_BYTES = 4  # sums of squares and softmax statistics travel in FP32


@dataclass(frozen=True)
class Work:
    """What a PE (or a set of PEs) does: FLOPs and SRAM bytes read and written."""

    flops: float = 0.0
    reads: float = 0.0
    writes: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.reads + other.reads,
                    self.writes + other.writes)


def elementwise_work(cost: PerElement, elements, dtype_bytes: int) -> Work:
    return Work(cost.flops * elements, cost.reads * elements * dtype_bytes,
                cost.writes * elements * dtype_bytes)


def matrix_work(k, n, tokens, dtype_bytes: int, stored: "StoredWeights | None" = None) -> Work:
    """A PE's block of k x n weights applied to ``tokens`` tokens: every multiply-accumulate
    reads its weight from SRAM (there is no cache), and each token's input segment once."""
    return routed_matrix_work(tokens * k * n, tokens * k, tokens * n, dtype_bytes, stored)


@dataclass(frozen=True)
class StoredWeights:
    """How a matrix's weights are read: bytes per weight, and the operations that turn one
    into the PE's dtype before its multiply (``dequant_ops``)."""

    bytes_per_weight: float
    dequant_ops: int = 0


# Operations per weight to bring a stored format to the dtype: an 8-bit float widens (1); an
# 8-bit integer widens and takes its scale (2); MXFP4 looks its 4-bit code up and applies its
# block's power-of-two scale (2); a 16-bit format converts when the dtype is not 16-bit (1).
DEQUANT_OPS = {"fp8": 1, "int8": 2, "mxfp4": 2}


def stored_weights(op: Op, model: ModelSpec) -> StoredWeights:
    """The storage an op's matrix is read from (the model's dtype for a native format)."""
    storage = model.storage
    fmt = storage.expert_weight_format if op.kind == EXPERT_GEMM else storage.weight_format
    per_weight = model.storage.matrix_bytes_per_weight(expert=op.kind == EXPERT_GEMM)
    ops = DEQUANT_OPS.get(fmt, 0 if per_weight == model.storage.dtype_bytes else 1)
    return StoredWeights(per_weight, 0 if fmt == "native" else ops)


def routed_matrix_work(macs, inputs, outputs, dtype_bytes: int,
                       stored: StoredWeights | None = None) -> Work:
    """A PE's multiply-accumulates, each reading its weight (in its stored format, widened
    to the dtype first), with the input values it reads and the partial sums it writes. An
    expert strip's PE does this for the tokens routed to the experts its block holds
    (``matrix_work`` is the case of every token). The widening counts as PE operations
    beside the two FLOPs of each multiply-accumulate."""
    per_weight = dtype_bytes if stored is None else stored.bytes_per_weight
    dequant = 0 if stored is None else stored.dequant_ops
    return Work((2 + dequant) * macs, macs * per_weight + inputs * dtype_bytes,
                outputs * dtype_bytes)


def bias_work(n, tokens, dtype_bytes: int) -> Work:
    """Adding a bias to ``n`` outputs of ``tokens`` tokens, where the sums collect."""
    return Work(tokens * n, 2 * tokens * n * dtype_bytes, tokens * n * dtype_bytes)


def score_flops(model: ModelSpec) -> int:
    """FLOPs per (query head, key) pair of attention: the q.k product, the softmax (and the
    soft cap where the model has one) and the weighted sum of values."""
    cap = SOFTCAP_FLOPS if model.attention.logit_softcap else 0
    return 4 * model.attention.head_dim + SOFTMAX_FLOPS + cap


# --- the op table ---------------------------------------------------------------------------

STAGE = "@stage"
HOME = "@home"  # the strip whose root edge holds a stage's residual stream (``home_site``)
LAYER_INPUT = "x"
LAYER_OUTPUT = "residual_mlp"
ATTENTION_OUTPUT = "attn_weighted_sum"  # the attention pattern's result, where o_proj takes it
# The last op of a layer's attention block: batch tiling on attention runs the ops up to it
# tile by tile, and the MLP (or the experts) on the tiles together.
ATTENTION_BLOCK_END = "residual_attn"


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    inputs: tuple[str, ...]
    site: str
    kernel: str
    matrix: tuple[int, int] | None = None  # (K, N)
    length: int = 0  # output elements per token
    tensor: str | None = None  # Hugging Face module holding the weights
    bias: bool = False
    weight_params: int = 0
    experts: int = 0  # an expert op: how many experts hold its weights (each K x N)
    top_k: int = 0  # and how many of them each token uses
    # An expert op whose strip's reduction also sums over its experts (down, after the
    # combine); otherwise (gate, up) each expert's outputs stay its own.
    experts_summed: bool = False
    # One part of a layer split across two stages (``part_ops``): the first of the layer's
    # experts its strip holds, and how many the layer has (0: ``experts``, all of them here).
    first_expert: int = 0
    layer_experts: int = 0

    @property
    def total_experts(self) -> int:
        """The experts a token's router chooses among (``experts`` are those held here)."""
        return self.layer_experts or self.experts

    @property
    def kernel_kind(self) -> str:
        return KERNEL_KINDS[self.kind]

    @property
    def strip_matrix(self) -> tuple[int, int]:
        """(K, N) of the strip holding the op's weights: an expert op's E experts one after
        another along its inputs (gate's and up's one to a run: see ``experts_per_run``)."""
        k, n = self.matrix
        return (k * max(self.experts, 1), n)

    def experts_per_run(self, rows: int) -> int:
        """Gate's and up's experts sharing one run of columns on a strip ``rows`` rows
        across, their outputs side by side: the fewest (a power of two dividing E) whose
        outputs split over the rows within 5% of evenly, so that rounding a row's share up
        wastes little SRAM (Qwen3-235B's 1,536 outputs over 362 rows take 5 a row where 4.2
        would do: two experts take 9 where 8.5 would); the least wasteful if none does."""
        if not self.experts or self.experts_summed:
            return 1
        m = self.matrix[1]
        options = [q for q in (1, 2, 4, 8, 16, 32) if self.experts % q == 0]
        waste = {q: -(-q * m // rows) * rows / (q * m) for q in options}
        return next((q for q in options if waste[q] <= 1.05), min(options, key=waste.get))

    def run_matrix(self, rows: int) -> tuple[int, int]:
        """(K, N) of the strip on ``rows`` rows: gate's and up's runs each hold
        ``experts_per_run`` experts, their outputs side by side."""
        k, n = self.strip_matrix
        q = self.experts_per_run(rows)
        return k // q, n * q

    @property
    def active_params(self) -> int:
        """The weights one token uses: its top-k experts' share of an expert op."""
        return self.weight_params * self.top_k // self.total_experts if self.experts else \
            self.weight_params


def home_site(model: ModelSpec) -> str:
    """The strip ``HOME`` names in a layer: the one the MLP's output leaves on."""
    return "experts_down" if model.is_moe else "down_proj"


def _matrix(name: str, k: int, n: int, inputs: tuple[str, ...], tensor: str,
            bias: bool = False) -> Op:
    return Op(name, GEMM, inputs, name, name, matrix=(k, n), length=n, tensor=tensor, bias=bias,
              weight_params=k * n + (n if bias else 0))


def _vector(name: str, kind: str, inputs: tuple[str, ...], site: str, length: int,
            tensor: str | None = None, params: int = 0, kernel: str | None = None) -> Op:
    return Op(name, kind, inputs, site, kernel or name, length=length, tensor=tensor,
              weight_params=params)


def layer_ops(model: ModelSpec) -> list[Op]:
    """One decoder layer's ops in execution order: the attention block, then the MLP (or the
    experts), each from its part of the model, then the residual add."""
    mlp, mlp_out = _expert_ops(model) if model.is_moe else _mlp_ops(model)
    if model.norm.sandwich:
        mlp.append(_vector("mlp_out_norm", RMSNORM, (mlp_out,), HOME, model.hidden_size,
                           "post_feedforward_layernorm", model.hidden_size))
        mlp_out = "mlp_out_norm"
    return (_attention_ops(model) + mlp
            + [_vector(LAYER_OUTPUT, ADD, ("residual_attn", mlp_out), HOME, model.hidden_size)])


def _attention_ops(model: ModelSpec) -> list[Op]:
    """The input norm, the attention (``model.attention``: its projections, norms, sinks and
    biases), its residual add and the norm before the MLP."""
    attention, h = model.attention, model.hidden_size
    q, kv, bias = attention.q_size, attention.kv_size, attention.bias
    ops = [_vector("input_norm", RMSNORM, (LAYER_INPUT,), HOME, h, "input_layernorm", h)]
    ops += [_matrix(name, h, n, ("input_norm",), f"self_attn.{name}", bias)
            for name, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv))]
    q_src, k_src = "q_proj", "k_proj"
    if attention.qk_norm:
        hd = attention.head_dim
        ops += [_vector("q_norm", HEAD_RMSNORM, ("q_proj",), "q_proj", q, "self_attn.q_norm", hd),
                _vector("k_norm", HEAD_RMSNORM, ("k_proj",), "k_proj", kv, "self_attn.k_norm", hd)]
        q_src, k_src = "q_norm", "k_norm"
    # Sinks: one learned logit per query head, in every softmax.
    sinks = ("self_attn.sinks", attention.num_heads) if attention.sinks else (None, 0)
    ops += [
        _vector("rope_q", ROPE, (q_src,), "q_proj", q),
        _vector("rope_k", ROPE, (k_src,), "k_proj", kv),
        # K and V meet on k_proj's edge, so one route carries both into the cache.
        _vector("kv_append", KV_APPEND, ("rope_k", "v_proj"), "k_proj", 2 * kv,
                kernel="attention"),
        _vector("attn_scores", ATTN_SCORES, ("rope_q", "kv_append"), STAGE, 0,
                kernel="attention"),
        _vector("attn_softmax", SOFTMAX, ("attn_scores",), STAGE, 0, *sinks, kernel="attention"),
        _vector(ATTENTION_OUTPUT, ATTN_WEIGHTED_SUM, ("attn_softmax", "kv_append"), STAGE, q,
                kernel="attention"),
        _matrix("o_proj", q, h, (ATTENTION_OUTPUT,), "self_attn.o_proj", attention.o_proj_bias),
    ]
    attn_out = "o_proj"
    if model.norm.sandwich:
        ops.append(_vector("attn_out_norm", RMSNORM, ("o_proj",), "o_proj", h,
                           "post_attention_layernorm", h))
        attn_out = "attn_out_norm"
    return ops + [
        _vector("residual_attn", ADD, (LAYER_INPUT, attn_out), "o_proj", h),
        # Before the MLP: Llama calls it post_attention_layernorm, Gemma pre_feedforward.
        _vector("post_attn_norm", RMSNORM, ("residual_attn",), "o_proj", h,
                "pre_feedforward_layernorm" if model.norm.sandwich
                else "post_attention_layernorm", h),
    ]


# The gated MLP's activation op by ``MlpSpec.activation``.
ACTIVATION_OPS = {"silu": ("silu_mul", SILU_MUL), "gelu_tanh": ("gelu_mul", GELU_MUL)}


def _mlp_ops(model: ModelSpec) -> tuple[list[Op], str]:
    """The dense gated MLP (``model.mlp``), and the op its output leaves."""
    h, inter = model.hidden_size, model.mlp.intermediate_size
    name, kind = ACTIVATION_OPS[model.mlp.activation]
    return [
        _matrix("gate_proj", h, inter, ("post_attn_norm",), "mlp.gate_proj"),
        _matrix("up_proj", h, inter, ("post_attn_norm",), "mlp.up_proj"),
        _vector(name, kind, ("gate_proj", "up_proj"), "up_proj", inter),
        _matrix("down_proj", inter, h, (name,), "mlp.down_proj"),
    ], "down_proj"


# --- a layer split across two stages --------------------------------------------------------
#
# A mixture-of-experts layer can be cut between two consecutive stages (on two wafers, when
# whole layers do not fill the wafers a model needs): the first part holds the attention, the
# router and experts [0, e), the second experts [e, E). Down is linear, so each part adds its
# experts' weighted outputs to the residual stream where it is; the first part hands on, beside
# that stream, what the second needs of the layer: the experts' input and each token's choices.
SPLIT_CARRIED = ("post_attn_norm", "route")


def part_ops(model: ModelSpec, experts: tuple[int, int] | None) -> list[Op]:
    """The ops of one part of a split layer (``experts``: the range of experts it holds), or of
    a whole layer (None). The second part starts at gate and ends with the residual add onto its
    input, the stream the first part left."""
    ops = layer_ops(model)
    if experts is None:
        return ops
    e0, e1 = experts
    count = model.experts.count if model.is_moe else 0
    if not 0 <= e0 < e1 <= count or (e0, e1) == (0, count):
        raise ValueError(f"no part of a {count}-expert layer holds experts "
                         f"{e0}-{e1 - 1}")
    if model.norm.sandwich:  # a norm of the whole MLP output cannot be taken in two parts
        raise ValueError("a layer with a norm after its MLP cannot be split")
    held = e1 - e0
    ops = [replace(op, experts=held, first_expert=e0, layer_experts=op.experts,
                   weight_params=op.weight_params // op.experts * held)
           if op.kind == EXPERT_GEMM else op for op in ops]
    if e0 == 0:
        return ops
    first = next(i for i, op in enumerate(ops) if op.kind == EXPERT_GEMM)
    return [replace(op, inputs=(LAYER_INPUT, op.inputs[1])) if op.name == LAYER_OUTPUT else op
            for op in ops[first:]]


def carried_values(model: ModelSpec, experts: tuple[int, int] | None) -> int:
    """Values per token one stage hands the next after a layer (part) ``experts``: the
    residual stream, and after the first part of a split layer also the experts' input and each
    token's choices (an id and a weight each, counted in the dtype's values)."""
    h = model.hidden_size
    if experts is None or experts[1] == model.experts.count:
        return h
    k = model.experts.top_k
    return 2 * h + -(-k * (model.storage.dtype_bytes + TOKEN_ID_BYTES) // model.storage.dtype_bytes)


def entering_values(model: ModelSpec, experts: tuple[int, int] | None) -> int:
    """Values per token a stage whose first layer (part) is ``experts`` takes in: the stream,
    and into a split layer's second part also what its first part hands on."""
    cut = experts is not None and experts[0] > 0
    return carried_values(model, (0, experts[0]) if cut else None)




def _expert_ops(model: ModelSpec) -> tuple[list[Op], str]:
    """The routed MLP: the router's logits, each token's top-k experts and their weights, the
    experts' gated MLP on the tokens routed to them, and each token's weighted sum of its
    experts' outputs.

    Each expert projection is one strip holding its E experts one after another along the
    strip, each on a run of columns: gate and up as K = E x hidden by N = m (every expert
    reads the same hidden vector), down as K = E x m by N = hidden. A PE multiplies only for
    the tokens routed to the experts its block holds. Gate's and up's partial sums meet per
    expert, on the expert's own run of columns, so an expert's reduction is as short as its
    run and as narrow as its m outputs over the strip's rows. The combine scales each routed
    activation by its token's router weight before down, so that down's reduction along its
    whole strip, which sums over K, is the weighted sum over the token's experts (down is
    linear; its bias is weighted the same way where the sums collect). Returns the ops and the
    one the experts' output leaves (the family's row names their tensors)."""
    experts = model.experts
    h, m, e, k = model.hidden_size, experts.intermediate_size, experts.count, experts.top_k
    router, gate, up, down = model.family_record.expert_tensors
    b = experts.bias

    def expert(name: str, kk: int, n: int, inputs: tuple[str, ...], tensor: str) -> Op:
        # Output per token: k experts' values (gate, up), or their weighted sum (down).
        length = n if name == "experts_down" else k * n
        return Op(name, EXPERT_GEMM, inputs, name, name, matrix=(kk, n), length=length,
                  tensor=tensor, bias=b, weight_params=e * (kk * n + (n if b else 0)),
                  experts=e, top_k=k, experts_summed=name == "experts_down")

    act = SWIGLU_CLAMPED if experts.swiglu_limit else SILU_MUL
    return [
        _matrix("router", h, e, ("post_attn_norm",), router, experts.router_bias),
        _vector("route", ROUTE, ("router",), "router", k),
        expert("experts_gate", h, m, ("post_attn_norm", "route"), gate),
        expert("experts_up", h, m, ("post_attn_norm", "route"), up),
        _vector("experts_act", act, ("experts_gate", "experts_up"), "experts_up", k * m),
        _vector("combine", COMBINE, ("experts_act", "route"), "experts_up", k * m),
        expert("experts_down", m, h, ("combine",), down),
    ], "experts_down"


def weight_bytes(op: Op, model: ModelSpec) -> float:
    """The op's weights as stored: a matrix in its format (the experts' or the others'), its
    bias and any vector weights in the model's dtype."""
    if op.kind not in (GEMM, EXPERT_GEMM, EMBEDDING) or not op.weight_params:
        return float(op.weight_params * model.storage.dtype_bytes)
    k, n = op.matrix
    matrix = k * n * max(op.experts, 1)
    per_weight = model.storage.matrix_bytes_per_weight(expert=op.kind == EXPERT_GEMM)
    stored = matrix * per_weight + (op.weight_params - matrix) * model.storage.dtype_bytes
    return int(stored) if stored == int(stored) else stored


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Experts that at least one of ``tokens`` tokens routes to, on average, when each token
    picks ``top_k`` distinct experts uniformly: each expert is missed by a token with
    probability 1 - top_k / experts."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def input_ops(model: ModelSpec) -> list[Op]:
    """Before the first layer: the embedding lookup (and Gemma's scaling of it)."""
    h = model.hidden_size
    ops = [Op("embedding", EMBEDDING, (), "embedding", "embedding",
              matrix=(model.vocab_size, h), length=h, tensor="model.embed_tokens",
              weight_params=0 if model.tie_embeddings else model.vocab_size * h)]
    if model.scale_embeddings:
        ops.append(_vector("embed_scale", SCALE, ("embedding",), HOME, h))
    return ops


def output_ops(model: ModelSpec) -> list[Op]:
    """After the last layer: the final norm, the LM head (and Gemma-2's soft cap of the
    logits). A tied LM head owns the table the embedding reads."""
    h, v = model.hidden_size, model.vocab_size
    ops = [_vector("final_norm", RMSNORM, (LAYER_INPUT,), HOME, h, "model.norm", h),
           Op("lm_head", GEMM, ("final_norm",), "lm_head", "lm_head", matrix=(h, v), length=v,
              tensor="model.embed_tokens" if model.tie_embeddings else "lm_head",
              weight_params=h * v)]
    if model.final_logit_softcap:
        ops.append(_vector("logit_softcap", SOFTCAP, ("lm_head",), "lm_head", v))
    return ops


@lru_cache(maxsize=64)
def ops_by_name(model: ModelSpec) -> dict[str, Op]:
    """Every op by name (cached per model: read-only)."""
    return {op.name: op for op in input_ops(model) + layer_ops(model) + output_ops(model)}


def last_position_only(op: Op, phase: str) -> bool:
    """A prefill's final norm and LM head (and what follows it) run on the last position only:
    its logits pick the first output token."""
    return phase == "prefill" and op.name in ("final_norm", "lm_head", "logit_softcap")


def op_tokens(op: Op, mb: MicroBatch) -> int:
    return 1 if last_position_only(op, mb.phase) else mb.new_tokens


# --- attention's extent ---------------------------------------------------------------------

def attended_pairs(window: int | None, mb: MicroBatch) -> float:
    """Sum over the step's query tokens of the KV entries each one attends to (causal, after
    ``prefix`` cached tokens; a sliding window caps each)."""
    if mb.phase == "decode":
        # Query j of a sequence (0 its next token, then the drafted ones) sees context + j.
        visible = mb.context + np.arange(mb.per_sequence, dtype=np.int64)
        if window:
            visible = np.minimum(visible, window)
        return mb.batch * (int(visible[0]) if mb.per_sequence == 1 else float(visible.sum()))
    s, p = mb.tokens, mb.prefix
    visible = np.arange(p + 1, p + s + 1, dtype=np.int64)  # keys seen by each query
    if window:
        visible = np.minimum(visible, window)
    return float(visible.sum())


def kv_entries_read(window: int | None, mb: MicroBatch) -> int:
    """Distinct cached tokens whose K (or V) must be read, per KV head."""
    if mb.phase == "decode":
        last = mb.context + mb.drafted  # the newest entry a verify step's last query sees
        return mb.batch * (min(last, window) if window else last)
    return mb.prefix + mb.tokens if not window else min(mb.prefix + mb.tokens, window
                                                         + mb.tokens - 1)


# --- whole-op costs (the op graph's rows) ---------------------------------------------------

@dataclass(frozen=True)
class OpCost:
    """An op's FLOPs and its unique bytes moved (weights or gathered rows once, activations in
    and out, the KV cache read and appended): the roofline's view. ``work`` is the SRAM-level
    view the kernels pay, where every multiply-accumulate reads its weight."""

    flops: float
    weight_bytes: float
    act_in_bytes: float
    act_out_bytes: float
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0

    @property
    def act_bytes(self) -> float:
        return self.act_in_bytes + self.act_out_bytes

    @property
    def kv_bytes(self) -> float:
        return self.kv_read_bytes + self.kv_write_bytes

    @property
    def read_bytes(self) -> float:
        return self.weight_bytes + self.act_in_bytes + self.kv_read_bytes

    @property
    def write_bytes(self) -> float:
        return self.act_out_bytes + self.kv_write_bytes

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(self.flops + other.flops, self.weight_bytes + other.weight_bytes,
                      self.act_in_bytes + other.act_in_bytes,
                      self.act_out_bytes + other.act_out_bytes,
                      self.kv_read_bytes + other.kv_read_bytes,
                      self.kv_write_bytes + other.kv_write_bytes)


ZERO = OpCost(0, 0, 0, 0)


def op_cost(op: Op, model: ModelSpec, mb: MicroBatch, layer: int | None = None,
            active_experts: float | None = None) -> OpCost:
    """The op's FLOPs and unique bytes for one step (``layer`` picks its attention window).
    An expert op reads the weights of ``active_experts`` experts (by default the average number
    uniform routing reaches)."""
    d = model.storage.dtype_bytes
    t = op_tokens(op, mb)
    kind = op.kind
    if kind == EMBEDDING:
        h = op.matrix[1]
        return OpCost(0, t * h * model.storage.matrix_bytes_per_weight(), t * TOKEN_ID_BYTES,
                      t * h * d)
    if kind == GEMM:
        k, n = op.matrix
        flops = matrix_work(k, n, t, d).flops + (bias_work(n, t, d).flops if op.bias else 0)
        return OpCost(flops, weight_bytes(op, model), t * k * d, t * n * d)
    if kind in NORM_KINDS:
        e = t * op.length
        return OpCost(NORM_FLOPS * e, op.weight_params * d, e * d, e * d)
    if kind in ELEMENTWISE:
        cost, e = ELEMENTWISE[kind], t * op.length
        # A rotation also reads each position's cos and sin, shared by all heads.
        tables = 2 * t * (model.attention.head_dim // 2) * d if kind == ROPE else 0
        return OpCost(cost.flops * e, 0, cost.reads * e * d + tables, cost.writes * e * d)
    if kind == KV_APPEND:
        new_kv = t * op.length * d
        return OpCost(0, 0, new_kv, 0, kv_write_bytes=new_kv)
    if kind == ROUTE:
        # A softmax over every expert's logit (Mixtral and Qwen3 take it before the top-k,
        # gpt-oss after: the same order of work), then k passes of comparisons to pick the
        # top k; out go k weights and k expert ids.
        e = model.experts.count
        return OpCost(t * (SOFTMAX_FLOPS * e + op.length * e), 0, t * e * d,
                      t * op.length * (d + TOKEN_ID_BYTES))
    if kind == EXPERT_GEMM:
        # Each token runs through its top-k experts (a split layer's part: those of them it
        # holds, on average); the weights read are those of the experts any token routed to.
        k, n = op.matrix
        pairs = t * op.top_k * op.experts / op.total_experts
        flops = matrix_work(k, n, pairs, d).flops + (bias_work(n, pairs, d).flops
                                                     if op.bias else 0)
        if active_experts is None:
            active_experts = expected_experts(op.total_experts, op.top_k, t)
        touched = active_experts / op.total_experts
        return OpCost(flops, weight_bytes(op, model) * touched, pairs * k * d,
                      t * op.length * d)
    window = model.attention.window(layer) if layer is not None else model.attention.sliding_window
    scores = model.attention.num_heads * attended_pairs(window, mb)
    kv_read = kv_entries_read(window, mb) * model.attention.kv_size * d
    if kind == ATTN_SCORES:
        return OpCost(2 * model.attention.head_dim * scores, 0, t * model.attention.q_size * d,
                      scores * d, kv_read_bytes=kv_read)
    if kind == SOFTMAX:
        cap = SOFTCAP_FLOPS if model.attention.logit_softcap else 0
        sinks = model.attention.num_heads * t if model.attention.sinks else 0  # one more logit each
        return OpCost((SOFTMAX_FLOPS + cap) * scores + SOFTMAX_FLOPS * sinks,
                      op.weight_params * d, scores * d, scores * d)
    if kind == ATTN_WEIGHTED_SUM:
        return OpCost(2 * model.attention.head_dim * scores, 0, scores * d,
                      t * model.attention.q_size * d, kv_read_bytes=kv_read)
    raise ValueError(f"no cost model for op kind {kind!r}")


@lru_cache(maxsize=64)
def kernel_dependencies(model: ModelSpec) -> dict[str, list[str]]:
    """One layer's kernels in execution order, each with the kernels whose output it reads."""
    ops = layer_ops(model)
    kernel_of = {op.name: op.kernel for op in ops}
    deps: dict[str, list[str]] = {}
    for op in ops:
        own = deps.setdefault(op.kernel, [])
        for src in op.inputs:
            k = kernel_of.get(src)
            if k is not None and k != op.kernel and k not in own:
                own.append(k)
    return deps


@lru_cache(maxsize=256)
def kernel_ops(model: ModelSpec, part: tuple[int, int] | None = None) -> dict[str, list[Op]]:
    """Per compiled kernel, the ops it runs (in execution order), in a stage of whole layers or
    of one part of a split layer (``part``: its experts)."""
    out: dict[str, list[Op]] = {}
    for op in input_ops(model) + part_ops(model, part) + output_ops(model):
        out.setdefault(op.kernel, []).append(op)
    return out

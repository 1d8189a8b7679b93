"""FLOPs, bytes moved and arithmetic intensity of every op, for a prefill or a decode step.

Conventions (stated once, used everywhere):
- A prefill processes S new tokens of one sequence from an empty cache (causal attention); the
  final norm and the LM head run on the last position only, the one whose logits pick the
  first output token.
- A decode step processes one new token for each of B sequences, each attending over L cached
  tokens (L counts the new token's own entry; a sliding window caps it).
- A GEMM of T tokens by a K x N weight is 2*T*K*N FLOPs. Bytes moved are the unique bytes an op
  must read or write: its weights (or the embedding rows it gathers), its input and output
  activations, and the KV cache it reads or appends. Attention ops are counted unfused (scores
  are written and read back), as the op graph lists them.
- A PE reads SRAM and writes it through separate ports, so an op's memory time is the larger of
  its reads over the read bandwidth and its writes over the write bandwidth. An op is
  compute-bound when its FLOPs take at least that long at the PE's FP16 peak. The ridge point
  shown is FP16 FLOP per cycle over SRAM bytes read per cycle (weights, KV and inputs are reads).
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass

import networkx as nx

from compiler import opgraph as og
from wse_emu.errors import UserError
from wse_emu.fabric import FabricSpec
from wse_emu.model import ModelSpec

PHASES = ("prefill", "decode")

# FLOPs per element of the small ops.
RMSNORM_FLOPS = 4  # square, accumulate, scale by 1/rms, multiply by the norm weight
ROPE_FLOPS = 3  # per element: a rotation is 4 multiplies and 2 adds per pair
SOFTMAX_FLOPS = 5  # max, subtract, exp, accumulate, divide
SILU_MUL_FLOPS = 5  # negate, exp, add 1, divide (SiLU), multiply by the up projection
TOKEN_ID_BYTES = 4


@dataclass(frozen=True)
class Workload:
    """The shape of one step: a prefill of ``tokens`` or a decode of ``batch`` at ``context``."""

    phase: str
    tokens: int = 4096
    batch: int = 1
    context: int = 4096

    def __post_init__(self):
        if self.phase not in PHASES:
            raise UserError(f"--phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        for name in ("tokens", "batch", "context"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be at least 1, got {getattr(self, name)}")

    @property
    def new_tokens(self) -> int:
        """Tokens flowing through every layer in this step."""
        return self.tokens if self.phase == "prefill" else self.batch

    def describe(self) -> str:
        if self.phase == "prefill":
            return f"prefill of {self.tokens} tokens"
        return f"decode of batch {self.batch} at context {self.context}"


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes moved; activations and KV split into what is read and what is written."""

    flops: int
    weight_bytes: int
    act_in_bytes: int
    act_out_bytes: int
    kv_read_bytes: int = 0
    kv_write_bytes: int = 0

    @property
    def act_bytes(self) -> int:
        return self.act_in_bytes + self.act_out_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv_read_bytes + self.kv_write_bytes

    @property
    def read_bytes(self) -> int:
        return self.weight_bytes + self.act_in_bytes + self.kv_read_bytes

    @property
    def write_bytes(self) -> int:
        return self.act_out_bytes + self.kv_write_bytes

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(*(a + b for a, b in zip(astuple(self), astuple(other))))


ZERO = OpCost(0, 0, 0, 0)


def attended_pairs(model: ModelSpec, work: Workload) -> int:
    """Sum over the step's query tokens of the KV entries each one attends to."""
    window = model.sliding_window
    if work.phase == "decode":
        per_seq = min(work.context, window) if window else work.context
        return work.batch * per_seq
    s = work.tokens
    if not window or window >= s:
        return s * (s + 1) // 2
    w = window
    return w * (w + 1) // 2 + (s - w) * w


def kv_entries_read(model: ModelSpec, work: Workload) -> int:
    """Distinct cached tokens whose K (or V) must be read, per KV head group."""
    if work.phase == "decode":
        window = model.sliding_window
        return work.batch * (min(work.context, window) if window else work.context)
    return work.tokens


def op_cost(attrs: dict, model: ModelSpec, work: Workload) -> OpCost:
    d = model.dtype_bytes
    t = work.new_tokens
    kind = attrs["kind"]
    h = model.hidden_size
    if kind == og.EMBEDDING:
        return OpCost(0, t * h * d, t * TOKEN_ID_BYTES, t * h * d)
    if kind == og.GEMM:
        k, n = attrs["shape"]
        rows = 1 if (attrs["op"] == "lm_head" and work.phase == "prefill") else t
        bias = n if attrs.get("bias") else 0
        return OpCost(2 * rows * k * n + rows * bias, (k * n + bias) * d, rows * k * d,
                      rows * n * d)
    if kind == og.RMSNORM:
        if attrs["op"] == "final_norm" and work.phase == "prefill":
            t = 1  # only the last position goes on to the LM head
        return OpCost(RMSNORM_FLOPS * t * h, h * d, t * h * d, t * h * d)
    if kind == og.ROPE:
        n = model.q_size if attrs["op"] == "rope_q" else model.kv_size
        tables = 2 * t * (model.head_dim // 2) * d  # cos and sin per position
        return OpCost(ROPE_FLOPS * t * n, 0, t * n * d + tables, t * n * d)
    if kind == og.KV_APPEND:
        new_kv = 2 * t * model.kv_size * d
        return OpCost(0, 0, new_kv, 0, kv_write_bytes=new_kv)
    pairs = attended_pairs(model, work)
    scores = model.num_heads * pairs
    kv_read = kv_entries_read(model, work) * model.kv_size * d
    if kind == og.ATTN_SCORES:
        return OpCost(2 * model.head_dim * scores, 0, t * model.q_size * d, scores * d,
                      kv_read_bytes=kv_read)
    if kind == og.SOFTMAX:
        return OpCost(SOFTMAX_FLOPS * scores, 0, scores * d, scores * d)
    if kind == og.ATTN_WEIGHTED_SUM:
        return OpCost(2 * model.head_dim * scores, 0, scores * d, t * model.q_size * d,
                      kv_read_bytes=kv_read)
    if kind == og.ADD:
        return OpCost(t * h, 0, 2 * t * h * d, t * h * d)
    if kind == og.SILU_MUL:
        i = model.intermediate_size
        return OpCost(SILU_MUL_FLOPS * t * i, 0, 2 * t * i * d, t * i * d)
    raise ValueError(f"no cost model for op kind {kind!r}")


@dataclass(frozen=True)
class OpRow:
    node: str
    op: str
    kind: str
    layer: int | None
    cost: OpCost
    bound: str  # "compute" or "memory"

    def to_dict(self) -> dict:
        c = self.cost
        return {"node": self.node, "op": self.op, "kind": self.kind, "layer": self.layer,
                "flops": c.flops, "weight_bytes": c.weight_bytes, "act_bytes": c.act_bytes,
                "kv_bytes": c.kv_bytes, "read_bytes": c.read_bytes,
                "write_bytes": c.write_bytes, "bytes": c.bytes, "intensity": c.intensity,
                "bound": self.bound}


def classify(cost: OpCost, fabric: FabricSpec, dtype_bytes: int = 2) -> str:
    """'compute' when the FLOPs take at least as long as the busier SRAM port, else 'memory'."""
    compute = cost.flops / fabric.flops_per_cycle(dtype_bytes)
    memory = max(cost.read_bytes / fabric.sram_read_bytes_per_cycle,
                 cost.write_bytes / fabric.sram_write_bytes_per_cycle)
    return "compute" if compute >= memory and cost.flops else "memory"


def analyze(g: nx.DiGraph, model: ModelSpec, work: Workload, fabric: FabricSpec) -> dict:
    """Per-op rows, per-layer totals and the model total for one step."""
    ridge = fabric.ridge_flop_per_byte()
    rows = []
    for node in nx.topological_sort(g):
        attrs = g.nodes[node]
        cost = op_cost(attrs, model, work)
        rows.append(OpRow(node, attrs["op"], attrs["kind"], attrs["layer"], cost,
                          classify(cost, fabric, model.dtype_bytes)))
    per_layer: dict[int, OpCost] = {}
    total = ZERO
    for row in rows:
        total = total + row.cost
        if row.layer is not None:
            per_layer[row.layer] = per_layer.get(row.layer, ZERO) + row.cost
    return {
        "workload": asdict(work),
        "ridge_flop_per_byte": ridge,
        "ops": rows,
        "layers": per_layer,
        "total": total,
    }
